//! The fleet's view (root; in CI): a real Prometheus server scrapes a
//! `tracer watch` over the lab's ATR edge. The shipped steering alert
//! (its windows shortened, nothing else) fires while the edge steers and
//! resolves once it stops, the upload going on; every panel of the
//! shipped Grafana dashboard answers through Prometheus's HTTP API.

use std::time::Duration;

use serde_json::Value;
use tracer::lab::{self, Lab, LabSpec};

mod common;
use common::{
    prometheus::{deploy, rules_in_seconds, until, Prometheus},
    root_or_skip, signal,
    watched::Watched,
};

const ALERT: &str = "NicSteeringReordering";

/// ATR on: the alert fires for the server's interface, its annotation
/// naming it and the share; every dashboard panel has data; ATR off (the
/// upload going on): the alert resolves while data still arrives.
#[test]
fn the_steering_alert_fires_and_resolves_and_every_panel_answers() {
    if !root_or_skip("the_steering_alert_fires_and_resolves_and_every_panel_answers") {
        return;
    }
    let mut spec = LabSpec::new(
        lab::Mode::Atr {
            rate: 200.0,
            qsize: 256,
        },
        4,
    );
    spec.flows = 2;
    // Bounded: 2 x 128 GiB or five minutes, more than the two 90-second
    // waits below can use even at 10 Gbit/s: the upload is still going
    // when the alert resolves.
    spec.bytes_per_flow = 128 << 30;
    spec.timeout = Duration::from_secs(300);
    let mut lab = Lab::create(&spec).expect("lab");
    let mut watch = Watched::on_server(&lab, "fleet", "5", &[]);
    let target = watch.metrics_target();
    let prometheus = Prometheus::start(&target, &rules_in_seconds());
    lab.start_upload().unwrap();

    let fired = until("the steering alert firing", Duration::from_secs(90), || {
        !prometheus.alerts(ALERT, "firing").is_empty()
    });
    let alert = &prometheus.alerts(ALERT, "firing")[0];
    assert_eq!(alert["labels"]["interface"], lab::SERVER_IF, "{alert}");
    let summary = alert["annotations"]["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!("received on {}", lab::SERVER_IF)),
        "{summary}"
    );
    eprintln!("fired after {fired:?}: {summary}");

    // Every panel, its variables as "All" and a 10-second rate window.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(deploy("grafana/tracer.json")).unwrap())
            .unwrap();
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$instance", ".+")
                .replace("$interface", ".+")
                .replace("$__rate_interval", "10s");
            let result = prometheus.query(&expr);
            assert!(!result.is_empty(), "{}: no data for {expr}", panel["title"]);
        }
        panels += 1;
    }
    assert_eq!(panels, 9);
    let interfaces = prometheus.api("/api/v1/label/interface/values?match[]=tracer_segments_total");
    assert_eq!(interfaces, serde_json::json!([lab::SERVER_IF]));

    lab.set_steering(false);
    let resolved = until(
        "the steering alert resolving",
        Duration::from_secs(90),
        || {
            prometheus.alerts(ALERT, "firing").is_empty()
                && prometheus.alerts(ALERT, "pending").is_empty()
        },
    );
    let rate = |q: &str| -> f64 {
        prometheus.query(q)[0]["value"][1]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let steered = rate(
        "sum(rate(tracer_reordered_segments_total{attribution!=\"same_queue_same_cpu\"}[5s]))",
    );
    let data = rate("sum(rate(tracer_data_segments_total[5s]))");
    eprintln!("resolved {resolved:?} after ATR off: steered {steered}/s, data {data}/s");
    assert!(data > 0.0, "the upload went on");
    assert!(!lab.finished(), "the upload went on");

    signal(&watch.child, libc::SIGTERM);
    assert_eq!(watch.end().0.code(), Some(0));
    drop(prometheus);
    drop(lab);
}
