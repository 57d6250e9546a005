//! `--metrics-addr`: scraped over real HTTP while `tracer record` traces a
//! lab upload (root; in CI). The values follow the traffic as it comes, and
//! once it is over they are the report's; `promtool check metrics` (apt package
//! prometheus) passes on what is served; the alert rules in
//! `deploy/prometheus` pass `promtool check rules` and their unit tests.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer::lab::{self, Lab, LabSpec, Upload, UploadSpec};

mod common;
use common::{root_or_skip, BIN};

/// GET /metrics; the body.
fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connecting to the metrics address");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

/// Sample name with labels -> value, the `interface` label every sample
/// carries (that of the lab's server) taken out.
fn samples(body: &str) -> BTreeMap<String, f64> {
    let labelled = format!("interface=\"{}\"", lab::SERVER_IF);
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            assert!(k.contains(&labelled), "{l}: no {labelled}");
            let k = k
                .replace(&format!("{{{labelled}}}"), "")
                .replace(&format!("{labelled},"), "");
            (k, v.parse().unwrap())
        })
        .collect()
}

fn promtool(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt package prometheus: cargo xtask setup installs it)");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn the_alert_rules_check_and_pass_their_tests() {
    for args in [
        &["check", "rules", "alerts.yml"][..],
        &["test", "rules", "alerts-test.yml"][..],
    ] {
        let (ok, said) = promtool(args, None);
        assert!(ok, "promtool {args:?}: {said}");
    }
}

/// Scrapes until two scrapes a second apart are the same (a minute at
/// most): with no traffic left, the collector has published everything.
fn settled(addr: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut before = scrape(addr);
    loop {
        std::thread::sleep(Duration::from_millis(1100));
        let now = scrape(addr);
        if samples(&now) == samples(&before) {
            return now;
        }
        assert!(Instant::now() < deadline, "the metrics never settled");
        before = now;
    }
}

/// The ATR lab's upload (until the edge has made 500 late segments in each
/// of its two flows), then a plain 16 MiB one: the metrics the tracer
/// serves while it runs take in the second (at least its 11,586 segments
/// of 1,448 bytes), and once everything is over they are the report's.
#[test]
fn metrics_follow_the_traffic_and_agree_with_the_report() {
    if !root_or_skip("metrics_follow_the_traffic_and_agree_with_the_report") {
        return;
    }
    let mut spec = LabSpec::new(
        lab::Mode::Atr {
            rate: 50.0,
            qsize: 256,
        },
        4,
    );
    spec.flows = 2;
    spec.bytes_per_flow = 2 << 30;
    spec.until_late = Some(500);
    spec.timeout = Duration::from_secs(60);
    let mut lab = Lab::create(&spec).unwrap();
    // The edge's RSS key and table, as a user gives a NIC's by hand.
    let rss = lab.rss();
    let key: Vec<String> = rss.key.iter().map(|b| format!("{b:02x}")).collect();
    let indir: Vec<String> = rss.indir.iter().map(u32::to_string).collect();
    let mut record = Command::new(BIN)
        .args(["record", "--json", "--quiet", "--iface", lab::SERVER_IF])
        .args(["--rss-key", &key.join(":"), "--rss-indir", &indir.join(",")])
        .args([
            "--netns",
            &lab.topo.server_ns,
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = record.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let said = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let addr = said
        .strip_prefix("metrics at http://")
        .and_then(|s| s.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("{said}"))
        .to_string();
    assert!(addr.starts_with("127.0.0.1:"), "loopback: {addr}");
    let attached = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(attached.contains("tracing TCP received on"), "{attached}");

    lab.start_upload().unwrap();
    while !lab.finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let outcome = lab.finish().unwrap();
    assert!(outcome.until_late.is_some_and(|u| u.reached));
    let first = samples(&settled(&addr))["tracer_data_segments_total"];
    // The second upload, through the edge's namespace forwarding plainly.
    let plain = Upload::start(
        &lab.topo,
        &UploadSpec {
            flows: 1,
            bytes_per_flow: 16 << 20,
            port: lab::SERVER_PORT,
            ipv6: false,
            timeout: Duration::from_secs(60),
            pacing: None,
            sysctls: Vec::new(),
        },
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut moved = first;
    while moved < first + 11_586.0 {
        assert!(Instant::now() < deadline, "data segments stayed at {moved}");
        std::thread::sleep(Duration::from_millis(50));
        moved = samples(&scrape(&addr))["tracer_data_segments_total"];
    }
    assert_eq!(plain.join().unwrap()[0].received, 16 << 20);
    let body = settled(&addr);
    let last = samples(&body);
    let (ok, said) = promtool(&["check", "metrics"], Some(&body));
    assert!(ok, "promtool check metrics: {said}\n{body}");

    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(record.id() as i32, libc::SIGINT) };
    let out = record.wait_with_output().unwrap();
    drop(lab);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &report["totals"];
    // 3: the kernel lost events (counted; compared below).
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "{:?}: {}",
        out.status,
        report["kernel"]
    );
    eprintln!("kernel: {}", report["kernel"]);

    let m = |k: &str| *last.get(k).unwrap_or_else(|| panic!("no {k} in {body}"));
    eprintln!(
        "data segments: {first} after the ATR upload, {moved} during the plain one, {} at the end",
        m("tracer_data_segments_total")
    );
    let u = |v: &Value| v.as_u64().unwrap() as f64;
    assert_eq!(m("tracer_segments_total"), u(&t["segments"]));
    assert_eq!(m("tracer_data_segments_total"), u(&t["data_segments"]));
    assert_eq!(m("tracer_retransmissions_total"), u(&t["retransmissions"]));
    assert_eq!(
        m("tracer_queue_migrations_total"),
        u(&t["queue_migrations"])
    );
    assert_eq!(m("tracer_cpu_migrations_total"), u(&t["cpu_migrations"]));
    assert_eq!(m("tracer_dropped_events_total"), u(&t["dropped_events"]));
    assert_eq!(m("tracer_tracked_flows"), u(&report["tracked_flows"]));
    assert_eq!(
        m("tracer_connections_total"),
        u(&report["tracked_flows"]) + u(&report["evicted_flows"])
    );
    assert_eq!(m("tracer_reused_tuples_total"), u(&report["reused_tuples"]));
    assert_eq!(m("tracer_stale_segments_total"), u(&t["stale_segments"]));
    let memory = &report["memory"];
    assert_eq!(m("tracer_flows_budget_bytes"), u(&memory["budget_bytes"]));
    assert!(m("tracer_flows_held_bytes") > 0.0);
    assert!(m("tracer_flows_held_bytes") <= u(&memory["peak_held_bytes"]));
    assert_eq!(m("tracer_ack_logs_shed_total"), u(&memory["ack_logs_shed"]));
    assert_eq!(
        m("tracer_flows_evicted_for_memory_total"),
        u(&memory["evicted_for_memory"])
    );
    assert_eq!(
        m("tracer_flows_expired_idle_total"),
        u(&memory["expired_idle"])
    );
    let interface = &report["interface"];
    assert_eq!(m("tracer_interface_down_total"), u(&interface["went_down"]));
    assert_eq!(
        m("tracer_interface_attached_again_total"),
        u(&interface["attached_again"])
    );
    for class in [
        "different_queue",
        "different_cpu",
        "different_queue_and_cpu",
        "same_queue_same_cpu",
    ] {
        let key = format!("tracer_reordered_segments_total{{attribution=\"{class}\"}}");
        assert_eq!(m(&key), u(&t["attribution"][class]), "{class}");
    }
    for verdict in ["nic-steering", "upstream", "mixed", "none"] {
        let key = format!("tracer_flows{{verdict=\"{verdict}\"}}");
        let want = t["verdicts"][verdict].as_u64().unwrap_or(0) as f64;
        assert_eq!(m(&key), want, "{verdict}");
    }
    let n3 = t["n_reordering"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["n"] == 3)
        .unwrap()["degree"]
        .as_f64()
        .unwrap();
    assert!((m("tracer_n3_reordering_ratio") - n3).abs() < 1e-12);
    assert_eq!(
        m("tracer_late_time_seconds_count"),
        u(&t["late_time_us"]["count"])
    );
    assert_eq!(
        m("tracer_late_time_seconds_bucket{le=\"+Inf\"}"),
        u(&t["late_time_us"]["count"])
    );
    // The RSS check, and what the NIC said: its per-queue packets only
    // grow (the report's reading comes after the last scrape).
    let rss = &t["rss"];
    // (Not a trivial 0 = 0: each of the ATR upload's late segments was
    // overtaken by one on another queue, and of two queues at most one is
    // the flow's RSS queue; the tracer saw them all unless some were lost
    // on the way.)
    assert!(
        u(&rss["off_queue"]) > 0.0 || outcome.dropped_on_the_way > 0,
        "{rss}"
    );
    assert_eq!(m("tracer_rss_segments_total"), u(&rss["segments"]));
    assert_eq!(
        m("tracer_rss_off_queue_segments_total"),
        u(&rss["off_queue"])
    );
    let deltas = report["nic"]["deltas"].as_object().unwrap();
    assert!(!deltas.is_empty(), "{}", report["nic"]);
    for (name, d) in deltas {
        let key = format!(
            "tracer_nic_statistic_increase_total{{statistic=\"{name}\",meaning=\"{}\"}}",
            d["meaning"].as_str().map_or("rx_packets", |m| m)
        );
        assert!(m(&key) <= u(&d["delta"]), "{key}: {}", d["delta"]);
    }
    // Flows reordered by steering: a fix is suggested.
    assert!(report["fix"]["suggestion"].is_string(), "{}", report["fix"]);
    assert_eq!(m("tracer_fix_suggested"), 1.0);
    assert!(lab::lab_namespaces().is_empty());
}
