//! `tracer analyze` on captures: a tcpdump capture of a lab upload gives
//! the numbers the live trace gave (root; in CI), and bad files get one
//! clear line.

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use tracer::lab::{self, Lab, LabSpec};

mod common;
use common::{lines, root_or_skip, said, u, BIN};

fn analyze(file: &std::path::Path) -> std::process::Output {
    Command::new(BIN)
        .args(["analyze", "--json"])
        .arg(file)
        .output()
        .expect("run tracer analyze")
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

/// tcpdump on the server's interface and the tracer at its XDP hook see
/// the same packets in the same order when each flow keeps one RX queue:
/// the lab's pattern mode reorders on one queue and one CPU. tcpdump starts
/// before the upload and drops nothing (it says so), so `analyze` of its
/// capture must give the live trace's numbers exactly.
#[test]
fn a_tcpdump_capture_gives_what_the_live_trace_gave() {
    if !root_or_skip("a_tcpdump_capture_gives_what_the_live_trace_gave") {
        return;
    }
    let pcap = std::env::temp_dir().join(format!("tracer-analyze-{}.pcap", std::process::id()));
    let mut spec = LabSpec::new(
        lab::Mode::Pattern {
            pattern: "hold:40:300".parse().unwrap(),
        },
        4,
    );
    spec.flows = 2;
    spec.bytes_per_flow = 16 << 20;
    spec.timeout = Duration::from_secs(60);
    // (The userspace reorderer keeps exact order at moderate rates.)
    spec.pacing = Some(200_000_000 / 8);
    let mut lab = Lab::create(&spec).expect("lab");
    let ns = lab.topo.server_ns.clone();
    // tcpdump sees what GRO made of the segments; XDP, before it, each
    // segment. Off, both see the segments.
    let gro_off = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns,
            "ethtool",
            "-K",
            lab::SERVER_IF,
            "gro",
            "off",
        ])
        .status()
        .expect("ethtool");
    assert!(gro_off.success(), "ethtool -K {} gro off", lab::SERVER_IF);
    let mut tcpdump = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns,
            "tcpdump",
            "-i",
            lab::SERVER_IF,
            "-s",
            "128",
            // 64 MB of kernel buffer: nothing dropped at the lab's rate;
            // each packet handed over as it comes (else the last ring
            // block may still be unread when tcpdump is stopped).
            "-B",
            "65536",
            "--immediate-mode",
            "-U",
            "-w",
        ])
        .arg(&pcap)
        .args(["tcp", "dst", "port", "5201"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump (apt package tcpdump: cargo xtask setup installs it)");
    let tcpdump_said = lines(tcpdump.stderr.take().unwrap());
    said(&tcpdump_said, "listening on");
    // (A ring whose half holds every event of the 2 x 16 MiB: full mode
    // stays full mode however slowly the collector reads.)
    let mut record = Command::new(BIN)
        .args(["record", "--json", "--quiet", "--iface", lab::SERVER_IF])
        .args(["--netns", &ns, "--ring-mib", "64"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tracer record");
    let record_said = lines(record.stderr.take().unwrap());
    said(&record_said, "tracing TCP received on");
    lab.start_upload().unwrap();
    while !lab.finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    lab.finish().unwrap();
    for child in [&record, &tcpdump] {
        // SAFETY: plain kill(2) on our child; SIGINT makes tcpdump flush.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    }
    let live = record.wait_with_output().unwrap();
    assert_eq!(live.status.code(), Some(0), "tracer record");
    tcpdump.wait().unwrap();
    drop(lab);
    // Everything its filter took went into the file, and the kernel
    // dropped nothing.
    let count = |line: String| line.split_whitespace().next().unwrap().to_string();
    let captured = count(said(&tcpdump_said, "packets captured"));
    let filtered = count(said(&tcpdump_said, "packets received by filter"));
    let dropped = count(said(&tcpdump_said, "dropped by kernel"));
    assert_eq!(
        (captured.as_str(), dropped.as_str()),
        (filtered.as_str(), "0"),
        "tcpdump"
    );
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
    for key in [
        "data_segments",
        "reordered",
        "retransmissions",
        "duplicates",
    ] {
        eprintln!("{key}: capture {}, live {}", f[key], l[key]);
        assert_eq!(f[key], l[key], "{key}");
    }
    assert!(u(&l["reordered"]) > 0, "the lab reordered nothing");
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
