//! `tracer analyze` on captures: a tcpdump capture of a lab upload gives
//! the numbers the live trace gave (root; in CI), and bad files get one
//! clear line.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer::lab;

mod common;
use common::{root_or_skip, BIN};

fn analyze(file: &std::path::Path) -> std::process::Output {
    Command::new(BIN)
        .args(["analyze", "--json"])
        .arg(file)
        .output()
        .expect("run tracer analyze")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn a_file_that_is_no_capture_gets_one_line_and_exit_2() {
    let dir = std::env::temp_dir().join(format!("tracer-analyze-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.pcap");
    std::fs::write(&garbage, b"GIF89a, not a capture").unwrap();
    let empty = dir.join("empty.pcap");
    std::fs::write(&empty, b"").unwrap();
    for (file, says) in [
        (
            garbage,
            "at byte 0: not a pcap or pcapng file (magic 47494638)",
        ),
        (
            empty,
            "at byte 0: not a capture: shorter than a file header",
        ),
        (dir.join("missing.pcap"), "No such file"),
    ] {
        let out = analyze(&file);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tcpdump_capture_gives_what_the_live_trace_gave() {
    if !root_or_skip("a_tcpdump_capture_gives_what_the_live_trace_gave") {
        return;
    }
    let pcap = std::env::temp_dir().join(format!("tracer-analyze-{}.pcap", std::process::id()));
    let lab_run = Command::new(BIN)
        .args(["lab", "--json", "--quiet", "--rate", "50", "--flows", "2"])
        .args(["--bytes", "1G", "--duration", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tracer lab");
    // tcpdump on the server's interface once its namespace exists (the
    // first segments may pass before it starts).
    let deadline = Instant::now() + Duration::from_secs(10);
    // (Up: tcpdump refuses an interface that is down.)
    let interface_up = |ns: &str| {
        Command::new("ip")
            .args(["-n", ns, "-o", "link", "show", lab::SERVER_IF])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(",UP"))
    };
    let ns = loop {
        let server = lab::lab_namespaces()
            .into_iter()
            .find(|n| n.ends_with("-server"));
        if let Some(ns) = server.filter(|ns| interface_up(ns)) {
            break ns;
        }
        assert!(Instant::now() < deadline, "no lab namespace");
        std::thread::sleep(Duration::from_millis(10));
    };
    let tcpdump = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns,
            "tcpdump",
            "-i",
            lab::SERVER_IF,
            "-s",
            "128",
            // 64 MB of kernel buffer: no drops at the lab's rate.
            "-B",
            "65536",
            "-U",
            "-w",
        ])
        .arg(&pcap)
        .args(["tcp", "dst", "port", "5201"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump (apt package tcpdump: cargo xtask setup installs it)");
    let live = lab_run.wait_with_output().unwrap();
    assert_eq!(
        live.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&live.stderr)
    );
    // SAFETY: plain kill(2) on our child; SIGINT makes tcpdump flush.
    unsafe { libc::kill(tcpdump.id() as i32, libc::SIGINT) };
    let said = tcpdump.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&said.stderr);
    assert!(pcap.exists(), "tcpdump wrote nothing: {said}");
    let live: Value = serde_json::from_slice(&live.stdout).unwrap();
    let out = analyze(&pcap);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (l, f) = (&live["totals"], &file["totals"]);
    // tcpdump starts after the lab's upload (0.1-0.4 s late): compare with
    // the share of the run it covered, from the flows' spans in each.
    let span = |r: &Value| {
        r["flows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["duration_s"].as_f64().unwrap())
            .fold(0.0, f64::max)
    };
    let covered = span(&file) / span(&live);
    assert!(covered > 0.7, "tcpdump covered {covered:.2} of the run");
    for key in ["data_segments", "reordered", "retransmissions"] {
        let (a, b) = (u(&f[key]), u(&l[key]));
        let expected = b as f64 * covered;
        eprintln!(
            "{key}: capture {a}, live {b} ({expected:.0} in the {covered:.3} tcpdump covered)"
        );
        // tcpdump's tap sees the packets after XDP, from two CPUs: the
        // order can differ by a few segments. Its late start misses at
        // most the start's share (fewer, in slow start).
        let (a, b) = (a as f64, b as f64);
        assert!(
            a <= b * 1.05 && a >= expected - 0.05 * b,
            "{key}: capture {a} vs live {b} x {covered:.3}"
        );
    }
    assert!(u(&l["reordered"]) > 1000, "the lab reordered little");
    // One flow of the two, by its port; and the replay alone, per flow.
    let port = file["flows"][0]["src"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let one = Command::new(BIN)
        .args(["analyze", "--json", "--flow", &format!("port {port}")])
        .arg(&pcap)
        .output()
        .unwrap();
    let one: Value = serde_json::from_slice(&one.stdout).unwrap();
    assert_eq!(one["flows"].as_array().unwrap().len(), 1);
    assert_eq!(
        u(&one["totals"]["data_segments"]),
        u(&file["flows"][0]["data_segments"])
    );
    let replay = Command::new(BIN)
        .args(["replay", "--json"])
        .arg(&pcap)
        .output()
        .unwrap();
    assert_eq!(replay.status.code(), Some(0));
    let replay: Value = serde_json::from_slice(&replay.stdout).unwrap();
    assert_eq!(replay["replay"], f["replay"]);
    assert_eq!(replay["flows"].as_array().unwrap().len(), 2);
    // Cut short in the middle: what came before is analysed, then one line
    // says where the file ends, and the exit status is 1.
    let bytes = std::fs::read(&pcap).unwrap();
    // Inside the record header after the middle (a cut at a record's
    // boundary would be a clean end): walk the records' lengths.
    let mut at = 24;
    while at < bytes.len() / 2 {
        at += 16 + u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
    }
    std::fs::write(&pcap, &bytes[..at + 7]).unwrap();
    let out = analyze(&pcap);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_file(&pcap);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the file ends inside"), "{stderr}");
    let half: Value = serde_json::from_slice(&out.stdout).unwrap();
    let n = u(&half["totals"]["data_segments"]);
    assert!(n > 0 && n < u(&f["data_segments"]), "{n}");
    assert!(lab::lab_namespaces().is_empty());
}
