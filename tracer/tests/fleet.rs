//! The fleet's view (root; in CI): a real Prometheus server scrapes a
//! `tracer watch` over the lab's ATR edge. The shipped steering alert
//! (its windows shortened, nothing else) fires while the edge steers and
//! resolves once it stops, the upload going on; every panel of the
//! shipped Grafana dashboard answers through Prometheus's HTTP API.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer::lab::{self, Lab, LabSpec};

mod common;
use common::{root_or_skip, said, signal, tracer_on_server};

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("deploy")
        .join(file)
}

/// A Prometheus server scraping `target` every second and evaluating
/// `rules` every second, in a directory of its own (removed on drop).
struct Prometheus {
    child: Child,
    dir: PathBuf,
    addr: String,
}

impl Prometheus {
    fn start(target: &str, rules: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tracer-fleet-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rules.yml"), rules).unwrap();
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yml]\nscrape_configs:\n  - job_name: tracer\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        // A free port (the kernel's pick, let go for Prometheus).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (apt package prometheus: cargo xtask setup installs it)");
        let p = Self { child, dir, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while p.try_get("/-/ready").is_none() {
            assert!(Instant::now() < deadline, "Prometheus never became ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// The body of a 200 answer to GET `path`.
    fn try_get(&self, path: &str) -> Option<String> {
        let mut s = TcpStream::connect(&self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).ok()?;
        let mut response = String::new();
        s.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        // (HTTP/1.0 asked, HTTP/1.0 answered.)
        (head.split_whitespace().nth(1) == Some("200")).then(|| body.to_string())
    }

    /// An API call's `data`, its status checked.
    fn api(&self, path: &str) -> Value {
        let body = self
            .try_get(path)
            .unwrap_or_else(|| panic!("GET {path} failed"));
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{path}: {v}");
        v["data"].clone()
    }

    /// An instant query's result vector.
    fn query(&self, q: &str) -> Vec<Value> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(q)));
        data["result"].as_array().unwrap().clone()
    }

    /// The alerts named `name` in `state` (pending, firing).
    fn alerts(&self, name: &str, state: &str) -> Vec<Value> {
        self.api("/api/v1/alerts")["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["labels"]["alertname"] == name && a["state"] == state)
            .cloned()
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encoding for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Polls `done` every half second until it holds, `cap` at most.
fn until(what: &str, cap: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < cap, "{what}: not within {cap:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    start.elapsed()
}

/// The shipped rules with their windows shortened for a test that runs in
/// seconds: `[5m]` -> `[5s]`, `for: 10m` -> `for: 5s`.
fn rules_in_seconds() -> String {
    let shipped = std::fs::read_to_string(deploy("prometheus/alerts.yml")).unwrap();
    assert!(
        shipped.contains("[5m]") && shipped.contains("for: 10m"),
        "{shipped}"
    );
    shipped
        .replace("[5m]", "[5s]")
        .replace("for: 10m", "for: 5s")
}

const ALERT: &str = "NicSteeringReordering";

/// The watch, killed if the test fails before it ends (once the lab is
/// gone it would wait for its interface forever).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
    // Bounded: 2 x 16 GiB or two minutes; the test ends it well before.
    spec.flows = 2;
    spec.bytes_per_flow = 16 << 30;
    spec.timeout = Duration::from_secs(120);
    let mut lab = Lab::create(&spec).expect("lab");
    let dir = std::env::temp_dir().join(format!("tracer-fleet-reports-{}", std::process::id()));
    let (watch, rx) = tracer_on_server(
        &lab,
        "watch",
        &[
            "--interval",
            "5",
            "--reports",
            dir.to_str().unwrap(),
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    let mut watch = Killed(watch);
    let metrics = said(&rx, "metrics at http://");
    let target = metrics
        .split("metrics at http://")
        .nth(1)
        .and_then(|t| t.split('/').next())
        .unwrap()
        .to_string();
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
    assert_eq!(panels, 8);
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

    signal(&watch.0, libc::SIGTERM);
    assert_eq!(watch.0.wait().unwrap().code(), Some(0));
    drop(prometheus);
    drop(lab);
    let _ = std::fs::remove_dir_all(&dir);
}
