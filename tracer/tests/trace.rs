//! `tracer record --out FILE.pcapng` during a lab upload (root; in CI),
//! checked by tools that are not ours:
//! * tshark reads the file without a word on stderr; its packets are the
//!   segments the kernel counted; its `frame.interface_queue`,
//!   `tcp.seq_raw` and `tcp.len` are, segment by segment, what the lab's
//!   edge recorded sending each data segment on (its ground truth); its
//!   `tcp.ack_raw` what the kernel's TCP layer took from the skbs.
//! * `tracer analyze` on the file gives record's JSON report, every field.
//! * A record killed by SIGKILL leaves nothing attached and a file that
//!   reads up to its last whole block.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer::{
    lab::{self, Lab, LabSpec, Topology, TopologyOptions},
    source::{
        capture::{CaptureReader, Item},
        Observation,
    },
};

mod common;
use common::{root_or_skip, said, spawn_tracer, tshark, u, BIN};

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tracer-trace-{}-{name}", std::process::id()))
}

/// A lab network in ATR mode (its own upload not started: `flows` of 192
/// MiB, or with `until_late` until the edge has made that many late
/// segments in each) with `tracer record` attached to the server's
/// interface; returns once it traces.
fn lab_with_record(
    truth: Option<&Path>,
    out: &Path,
    flows: usize,
    until_late: Option<u64>,
) -> (Lab, Child) {
    let mut spec = LabSpec::new(
        lab::Mode::Atr {
            rate: 50.0,
            qsize: 256,
        },
        4,
    );
    spec.flows = flows;
    spec.bytes_per_flow = if until_late.is_some() {
        2 << 30
    } else {
        192 << 20
    };
    spec.until_late = until_late;
    spec.timeout = Duration::from_secs(60);
    spec.truth_out = truth.map(Path::to_path_buf);
    let lab = Lab::create(&spec).expect("lab");
    let mut record = Command::new(BIN)
        .args(["record", "--json", "--quiet", "--iface", lab::SERVER_IF])
        .args(["--netns", &lab.topo.server_ns])
        .arg("--out")
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tracer record");
    // Its first line says it is attached; the rest is kept for failures.
    let stderr = record.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("tracer record said nothing");
    assert!(line.contains("tracing TCP received on"), "{line}");
    (lab, record)
}

/// Whether our trace (perhaps still being written) holds a statistics
/// block after at least `bytes` of it.
fn holds_statistics(file: &Path, bytes: u64) -> bool {
    if std::fs::metadata(file).map_or(0, |m| m.len()) < bytes {
        return false;
    }
    let Ok(f) = std::fs::File::open(file) else {
        return false;
    };
    let Ok(mut reader) = CaptureReader::new(BufReader::new(f)) else {
        return false;
    };
    let mut statistics = false;
    while let Some(Ok(item)) = reader.next_item() {
        statistics |= matches!(item, Item::Counters(_));
    }
    statistics
}

/// Late segments the edge makes in every flow of the traced upload.
const LATE_PER_FLOW: u64 = 300;

fn signal(child: &Child, sig: i32) {
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, sig) };
}

fn upload(lab: &mut Lab) -> lab::LabOutcome {
    lab.start_upload().unwrap();
    while !lab.finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    lab.finish().unwrap()
}

/// The client port of a flow's "addr:port" source.
fn port(src: &Value) -> u16 {
    src.as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_recorded_trace_is_what_tshark_and_the_lab_saw_and_analyzes_to_the_same_report() {
    if !root_or_skip("a_recorded_trace_is_what_tshark_and_the_lab_saw") {
        return;
    }
    let (file, truth) = (temp("lab.pcapng"), temp("truth.jsonl"));
    let (mut lab, record) = lab_with_record(Some(&truth), &file, 2, Some(LATE_PER_FLOW));
    let outcome = upload(&mut lab);
    let on_the_way = outcome.dropped_on_the_way;
    // The edge reordered every flow (it ran until it had).
    let until = outcome.until_late.unwrap();
    assert!(until.reached, "{until:?}");
    signal(&record, libc::SIGINT);
    let out = record.wait_with_output().unwrap();
    drop(lab);
    assert_eq!(out.status.code(), Some(0), "tracer record failed");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "traces reveal addresses: owner only");

    // tshark: silent, and one frame per segment the kernel emitted.
    let fields = [
        "frame.interface_queue",
        "tcp.srcport",
        "tcp.seq_raw",
        "tcp.ack_raw",
        "tcp.len",
    ];
    let (rows, said) = tshark(&file, "frame.interface_id == 0", &fields);
    assert!(said.is_empty(), "tshark said: {said:?}");
    let kernel = &report["kernel"];
    assert_eq!(rows.len() as u64, u(&kernel["xdp_events"]));
    assert_eq!(rows.len() as u64, u(&report["totals"]["segments"]));
    assert_eq!(u(&kernel["xdp_capture_failed"]), 0);

    // Per flow and queue, tshark's count is the report's.
    let mut by_queue: BTreeMap<(u16, u32), u64> = BTreeMap::new();
    for r in &rows {
        *by_queue
            .entry((r[1].parse().unwrap(), r[0].parse().unwrap()))
            .or_default() += 1;
    }
    let mut reported: BTreeMap<(u16, u32), u64> = BTreeMap::new();
    for f in report["flows"].as_array().unwrap() {
        for p in f["paths"].as_array().unwrap() {
            *reported
                .entry((port(&f["src"]), u(&p["queue"]) as u32))
                .or_default() += u(&p["segments"]);
        }
    }
    // Segments the kernel counted without emitting them (the collector
    // fell behind and the overload guard summarized) are in the report's
    // paths, on the path their flow was on, and in no frame: per flow and
    // queue the report has tshark's count and at most those.
    let summarized = u(&kernel["xdp_summarized"]);
    assert_eq!(
        by_queue.keys().collect::<Vec<_>>(),
        reported.keys().collect::<Vec<_>>()
    );
    let mut counted_only = 0;
    for (key, &n) in &reported {
        let seen = by_queue[key];
        assert!(n >= seen, "{key:?}: reported {n}, tshark {seen}");
        counted_only += n - seen;
    }
    assert!(
        counted_only <= summarized,
        "{counted_only} segments reported beyond tshark's, the kernel summarized {summarized}: {reported:?} vs {by_queue:?}"
    );
    if summarized == 0 {
        assert_eq!(by_queue, reported);
    }

    // Segment by segment, against the edge's record of what it sent on
    // which queue: data segments as (client port, seq, length, queue).
    let mut wire: BTreeMap<(u16, u32, u32, u32), i64> = BTreeMap::new();
    for r in rows.iter().filter(|r| r[4] != "0") {
        let key = (
            r[1].parse().unwrap(),
            r[2].parse().unwrap(),
            r[4].parse().unwrap(),
            r[0].parse().unwrap(),
        );
        *wire.entry(key).or_default() += 1;
    }
    let mut sent: BTreeMap<(u16, u32, u32, u32), i64> = BTreeMap::new();
    for line in std::fs::read_to_string(&truth).unwrap().lines() {
        let t: Value = serde_json::from_str(line).unwrap();
        if t["kind"] == "segment" {
            let key = (
                u(&t["client_port"]) as u16,
                u(&t["seq"]) as u32,
                u(&t["payload_len"]) as u32,
                u(&t["queue"]) as u32,
            );
            *sent.entry(key).or_default() += 1;
        }
    }
    let data: i64 = wire.values().sum();
    let mut missing = 0i64;
    for (key, n) in &sent {
        let got = wire.get(key).copied().unwrap_or(0);
        assert!(got <= *n, "{key:?}: {got} on the wire, the edge sent {n}");
        missing += n - got;
    }
    let extra: i64 = wire
        .iter()
        .filter(|(k, _)| !sent.contains_key(k))
        .map(|(_, n)| n)
        .sum();
    eprintln!(
        "data segments: tshark {data}, edge {}, sent but not received {missing} (the kernel dropped {on_the_way} packets on the way), received but not sent {extra}; lab edge lost {} truth events",
        sent.values().sum::<i64>(),
        outcome.edge.counters.get("truth_dropped").copied().unwrap_or(0)
    );
    assert_eq!(extra, 0, "segments the edge never sent");
    assert_eq!(
        outcome.edge.counters.get("truth_dropped").copied(),
        Some(0),
        "the edge's record is whole"
    );
    // What left the edge and is not in the trace was dropped on the way in
    // (the veth ring full), or counted by the kernel without being emitted
    // (the collector fell behind: the overload guard), as the kernel
    // counted.
    assert!(
        missing as u64 <= on_the_way + summarized,
        "{missing} segments missing, {on_the_way} dropped on the way, {summarized} summarized"
    );

    // Acknowledgment numbers: what the kernel's TCP layer read from the
    // skbs (tcp_probe records, in the file's second interface).
    let mut acks_tcp: BTreeSet<(u16, u32)> = BTreeSet::new();
    let mut reader =
        CaptureReader::new(BufReader::new(std::fs::File::open(&file).unwrap())).unwrap();
    while let Some(item) = reader.next_item() {
        if let Item::Record(obs) = item.unwrap() {
            if let Observation::TcpProbe(p) = *obs {
                if p.payload_len > 0 {
                    acks_tcp.insert((p.flow.src.port(), p.ack));
                }
            }
        }
    }
    let acks_wire: BTreeSet<(u16, u32)> = rows
        .iter()
        .filter(|r| r[4] != "0")
        .map(|r| (r[1].parse().unwrap(), r[3].parse().unwrap()))
        .collect();
    assert!(!acks_tcp.is_empty());
    assert_eq!(acks_wire, acks_tcp);

    // The round trip: analyze's JSON is record's.
    let analyzed = Command::new(BIN)
        .args(["analyze", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(
        analyzed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&analyzed.stderr)
    );
    let again: Value = serde_json::from_slice(&analyzed.stdout).unwrap();
    // (All but the recording collector's memory and the budget left after
    // it, what the NIC said and the fix fitted to it, what the interface
    // did: the run's, not the trace's.) The lab's edge sends wire
    // segments, its TSO off: on its veth, `auto` takes native XDP, which
    // takes nothing from it, and the trace says so.
    let (mut recorded, mut again) = (report.clone(), again);
    recorded["peak_resident_bytes"] = Value::Null;
    assert!(recorded["nic"]["end"]["driver"] == "veth" && recorded["fix"].is_object());
    assert_eq!(recorded["interface"]["went_down"], 0);
    assert_eq!(recorded["xdp"], "native");
    for live_only in ["nic", "fix", "interface"] {
        recorded.as_object_mut().unwrap().remove(live_only);
    }
    for r in [&mut recorded, &mut again] {
        r["memory"]["budget_bytes"] = Value::Null;
    }
    assert_eq!(again, recorded, "analyze gives record's report");

    // The plot marks every late original and retransmission the report
    // counts, and its migrations.
    let svg = temp("lab.svg");
    let plotted = Command::new(BIN)
        .args(["analyze", "--plot"])
        .arg(&svg)
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(plotted.status.code(), Some(0));
    let drawn = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    for f in report["flows"].as_array().unwrap() {
        let (src, dst) = (f["src"].as_str().unwrap(), f["dst"].as_str().unwrap());
        let mut texts = vec![
            format!("{src} -&gt; {dst}: nic-steering"),
            format!("{} queue migrations", f["queue_migrations"]),
        ];
        // (A class with no segment has no legend entry.)
        for (key, label) in [
            ("reordered", "late original (reordered)"),
            ("retransmissions", "retransmission"),
        ] {
            if u(&f[key]) > 0 {
                texts.push(format!("{label} ({})", f[key]));
            }
        }
        for text in texts {
            assert!(drawn.contains(&text), "the plot lacks {text}");
        }
    }

    // Damaged copies: cut short, and a block length overwritten in the
    // middle. Everything before the damage is analysed, then one line
    // says where (exit 1).
    let bytes = std::fs::read(&file).unwrap();
    let block_len =
        |at: usize| u32::from_ne_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
    // The first block starting at or after `from`.
    let block_at = |from: usize| {
        let mut at = 0;
        while at < from {
            at += block_len(at);
        }
        at
    };
    let at = block_at(bytes.len() / 2);
    let mut corrupt = bytes.clone();
    corrupt[at + 4..at + 8].copy_from_slice(&0xffff_fff0u32.to_ne_bytes());
    // Cut inside a block's body, past its 8-byte header (a cut in the
    // header is the other message: "inside a block header").
    let mut cut_at = block_at(bytes.len() * 3 / 5);
    while block_len(cut_at) < 16 {
        cut_at += block_len(cut_at);
    }
    let cut = &bytes[..cut_at + 12];
    for (copy, says) in [
        (cut, "the file ends inside a block (cut short?)".to_string()),
        (
            &corrupt[..],
            format!("at byte {}: pcapng block length 4294967280", at + 4),
        ),
    ] {
        let damaged = temp("damaged.pcapng");
        std::fs::write(&damaged, copy).unwrap();
        let out = Command::new(BIN)
            .args(["analyze", "--json"])
            .arg(&damaged)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&damaged);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(&says), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        let before: Value = serde_json::from_slice(&out.stdout).unwrap();
        let n = u(&before["totals"]["data_segments"]);
        let all = u(&report["totals"]["data_segments"]);
        eprintln!(
            "damaged copy: {n} of {all} data segments analysed; {}",
            stderr.trim()
        );
        assert!(n > all / 3 && n < all, "{n} of {all}");
    }
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&truth);
    assert!(lab::lab_namespaces().is_empty());
}

#[test]
fn a_killed_record_leaves_nothing_attached_and_a_readable_trace() {
    if !root_or_skip("a_killed_record_leaves_nothing_attached_and_a_readable_trace") {
        return;
    }
    let file = temp("killed.pcapng");
    let (mut lab, mut record) = lab_with_record(None, &file, 1, None);
    lab.start_upload().unwrap();
    // Mid-upload, once the file holds a statistics block (written every
    // second) after megabytes of segments.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !holds_statistics(&file, 4 << 20) {
        assert!(Instant::now() < deadline, "the trace never grew");
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&record, libc::SIGKILL);
    record.wait().unwrap();
    let xdp = lab::ip(&[
        "-n",
        &lab.topo.server_ns,
        "link",
        "show",
        "dev",
        lab::SERVER_IF,
    ])
    .unwrap();
    let outcome = lab.finish();
    drop(lab);
    assert!(!xdp.contains("xdp"), "still attached: {xdp}");
    outcome.unwrap();
    let analyzed = Command::new(BIN)
        .args(["analyze", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&analyzed.stderr);
    // Whole blocks up to the last flush, and maybe part of one after.
    match analyzed.status.code() {
        Some(0) => {}
        Some(1) => assert!(stderr.contains("the file ends inside"), "{stderr}"),
        other => panic!("analyze exited {other:?}: {stderr}"),
    }
    let report: Value = serde_json::from_slice(&analyzed.stdout).unwrap();
    let segments = u(&report["totals"]["segments"]);
    // tshark reads the same segments from it, up to where it stops.
    let frames = Command::new("tshark")
        .arg("-r")
        .arg(&file)
        .args([
            "-Y",
            "frame.interface_id == 0",
            "-T",
            "fields",
            "-e",
            "frame.number",
        ])
        .output()
        .expect("tshark");
    let _ = std::fs::remove_file(&file);
    let frames = String::from_utf8_lossy(&frames.stdout).lines().count() as u64;
    eprintln!("killed mid-upload: {segments} segments readable, tshark {frames}");
    assert!(segments > 0);
    assert_eq!(
        segments, frames,
        "analyze and tshark read the same segments"
    );
    assert!(
        report["kernel"].is_object(),
        "the statistics written so far"
    );
}

/// Native XDP on a veth takes TSO from its peer (the veth driver's rule,
/// read back from the peer with ethtool). `record` on a veth whose peer
/// has TSO takes generic XDP unless told native, says which in one line
/// at start and in its report; told native, it says what that costs.
/// Detached, the peer has its TSO back.
#[test]
fn on_a_veth_record_keeps_the_peers_tso_unless_told_native() {
    if !root_or_skip("on_a_veth_record_keeps_the_peers_tso_unless_told_native") {
        return;
    }
    let topo = Topology::create(&TopologyOptions {
        queues: 1,
        direct: true,
    })
    .expect("namespaces");
    let peer_tso = || {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &topo.client_ns,
                "ethtool",
                "-k",
                lab::CLIENT_IF,
            ])
            .output()
            .expect("ethtool");
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("tcp-segmentation-offload: "))
            .unwrap_or_else(|| panic!("no TSO line in ethtool -k: {out}"));
        line.split_whitespace().next().unwrap().to_string()
    };
    assert_eq!(peer_tso(), "on");
    // (--xdp-mode, the mode that ran, the peer's TSO meanwhile, the line.)
    let cases = [
        (
            "auto",
            "generic",
            "on",
            Some("generic XDP, which takes nothing from the peer"),
        ),
        ("native", "native", "off", Some("turns its peer's TSO off")),
        ("generic", "generic", "on", None),
    ];
    for (asked, ran, tso, line) in cases {
        let (child, rx) = spawn_tracer(&[
            "record",
            "--quiet",
            "--json",
            "--iface",
            lab::SERVER_IF,
            "--netns",
            &topo.server_ns,
            "--xdp-mode",
            asked,
            "--duration",
            "60",
        ]);
        let first = said(&rx, "tracing TCP received on");
        let tso_then = peer_tso();
        signal(&child, libc::SIGINT);
        let out = child.wait_with_output().expect("record");
        assert!(out.status.success(), "{asked}: {first}");
        let report: Value = serde_json::from_slice(&out.stdout).expect("the JSON report");
        let lines: Vec<String> = rx.iter().collect();
        let noted = lines
            .iter()
            .find(|l| l.contains("veth"))
            .map(String::as_str);
        assert_eq!(
            (report["xdp"].as_str(), tso_then.as_str(), noted.is_some()),
            (Some(ran), tso, line.is_some()),
            "--xdp-mode {asked}: {first}; then {lines:?}"
        );
        if let (Some(noted), Some(line)) = (noted, line) {
            assert!(noted.contains(line), "--xdp-mode {asked}: {noted}");
        }
        assert!(first.contains(&format!("(XDP {ran})")), "{first}");
        assert_eq!(peer_tso(), "on", "--xdp-mode {asked}: detached");
    }
}
