//! Faults a production host can throw at the tracer (root; in CI): a
//! collector that stalls (the ring overflows), signals and SIGKILL in the
//! middle of a run, a second tracer on the same interface, the interface
//! going away (and, with `--reattach`, coming back).

use std::{
    io::{BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer::{
    kernel,
    lab::{self, Lab, LabSpec},
    source::capture::{CaptureReader, Item},
};
use tracer_common::counter;

mod common;
use common::{root_or_skip, said, send, signal, spawn_tracer, tracer_on_server, u, BIN};

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tracer-faults-{}-{name}", std::process::id()))
}

const ATR: lab::Mode = lab::Mode::Atr {
    rate: 50.0,
    qsize: 256,
};

/// A lab of `flows` uploads of `bytes` each (not started), bounded by a
/// minute (which they never need: the tests stop them or wait for them).
fn a_lab(mode: lab::Mode, flows: usize, bytes: u64) -> Lab {
    let mut spec = LabSpec::new(mode, 4);
    spec.flows = flows;
    spec.bytes_per_flow = bytes;
    spec.timeout = Duration::from_secs(60);
    Lab::create(&spec).expect("lab")
}

/// `tracer record ARGS` on the lab's server interface; its stderr lines.
fn record(lab: &Lab, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    tracer_on_server(lab, "record", args)
}

/// `tracer analyze --json` on our trace, which must read whole (exit 0);
/// its segments. The file is removed.
fn analyzed_segments(file: &Path) -> u64 {
    let out = Command::new(BIN)
        .args(["analyze", "--json"])
        .arg(file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(file);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}: the trace reads whole: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    u(&r["totals"]["segments"])
}

fn scrape(addr: &str, metric: &str) -> f64 {
    try_scrape(addr, metric).unwrap_or_else(|e| panic!("scraping {addr}: {e}"))
}

fn try_scrape(addr: &str, metric: &str) -> std::io::Result<f64> {
    let mut s = TcpStream::connect(addr)?;
    write!(s, "GET /metrics HTTP/1.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body
        .lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(metric))
        .find_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse().ok()))
        .unwrap_or_else(|| panic!("no {metric}")))
}

/// Segment packets in our trace, and the kernel's counters in its last
/// statistics block.
fn trace_contents(file: &Path) -> (u64, Option<kernel::Counters>) {
    let mut r = CaptureReader::new(BufReader::new(std::fs::File::open(file).unwrap())).unwrap();
    let (mut packets, mut counters) = (0, None);
    while let Some(item) = r.next_item() {
        match item.unwrap() {
            Item::Packet(_) => packets += 1,
            Item::Counters(c) => counters = Some(*c),
            _ => {}
        }
    }
    (packets, counters)
}

/// Segments of the upload the stalled-collector tests send: far more
/// events than either ring holds (a 16 MiB ring takes about 120,000, half
/// of it 60,000; 1 MiB about 7,500).
const STALLED_UPLOAD: u64 = 2 * (192 << 20);

/// Records the lab's upload (plain forwarding: no reordering, so summary
/// mode emits little more than its sample) with a `ring_mib` ring and
/// `extra` flags, the collector stopped (SIGSTOP) from before the first
/// segment until the last was received: the ring gets every event of the
/// upload and nothing reads it. The run's output, the `metric` it served
/// once going again, and its trace file.
fn stalled_through_an_upload(
    name: &str,
    ring_mib: &str,
    extra: &[&str],
    metric: &str,
) -> (Output, f64, PathBuf) {
    let file = temp(name);
    let mut lab = a_lab(lab::Mode::Off, 2, STALLED_UPLOAD / 2);
    let out = file.to_str().unwrap();
    let mut args = vec![
        "--json",
        "--quiet",
        "--ring-mib",
        ring_mib,
        "--out",
        out,
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    args.extend(extra);
    let (child, rx) = record(&lab, &args);
    let addr = metrics_addr(&rx);
    said(&rx, "tracing TCP received on");
    let start = Instant::now();
    signal(&child, libc::SIGSTOP);
    lab.start_upload().unwrap();
    while !lab.finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent: u64 = lab.finish().unwrap().flows.iter().map(|f| f.received).sum();
    assert_eq!(sent, STALLED_UPLOAD, "the whole upload went through");
    let uploaded = start.elapsed();
    signal(&child, libc::SIGCONT);
    // Nothing moves the kernel's counters any more: the first value the
    // collector serves once going again is the final one.
    let served = scraped_once_counted(&addr, metric);
    let scraped = start.elapsed();
    signal(&child, libc::SIGINT);
    let done = child.wait_with_output().unwrap();
    eprintln!(
        "uploaded in {uploaded:?}, {metric} served after {scraped:?}, the report after {:?}",
        start.elapsed()
    );
    drop(lab);
    (done, served, file)
}

/// The address of the metrics endpoint the tracer says it serves.
fn metrics_addr(rx: &mpsc::Receiver<String>) -> String {
    said(rx, "metrics at http://")
        .trim_start_matches("metrics at http://")
        .trim_end_matches("/metrics")
        .to_string()
}

/// Scrapes `metric` until it is above 0 (a minute at most).
fn scraped_once_counted(addr: &str, metric: &str) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = scrape(addr, metric);
        if v > 0.0 {
            return v;
        }
        assert!(Instant::now() < deadline, "{metric} stayed 0");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the tracer serving metrics at `addr` has traced at least
/// `n` segments (a minute at most): a run stopped then has that much to
/// report, however fast this host is. A scrape that fails says what the
/// tracer said (`rx`: its stderr).
fn traced_at_least(addr: &str, n: f64, rx: &mpsc::Receiver<String>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match try_scrape(addr, "tracer_segments_total") {
            Ok(v) if v >= n => return,
            Ok(_) => {}
            Err(e) => {
                std::thread::sleep(Duration::from_millis(500));
                let said: Vec<String> = rx.try_iter().collect();
                panic!("scraping {addr}: {e}; the tracer said: {said:?}");
            }
        }
        assert!(Instant::now() < deadline, "never traced {n} segments");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `tracer analyze FILE`'s text report; the file is removed.
fn analyzed_and_removed(file: &Path) -> String {
    let out = Command::new(BIN).arg("analyze").arg(file).output().unwrap();
    let _ = std::fs::remove_file(file);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// By default (and the default 16 MiB ring) a collector stalled for a
/// whole upload loses nothing: the programs summarize while the ring is
/// over half full, every segment XDP parsed is emitted or counted, and the
/// switch is said in the report, the JSON, the metrics and the trace's
/// statistics; exit 0. (The upload's events are several times what half
/// the ring holds, so it must switch; what summary mode then emits, 1 in
/// 64 of plain forwarding, fits in the other half many times over.)
#[test]
fn a_stalled_collector_by_default_loses_nothing_and_says_it_summarized() {
    if !root_or_skip("a_stalled_collector_by_default_loses_nothing_and_says_it_summarized") {
        return;
    }
    let (done, served, file) = stalled_through_an_upload(
        "overload.pcapng",
        "16",
        &[],
        "tracer_overload_switches_total",
    );
    let r: Value = serde_json::from_slice(&done.stdout).unwrap();
    let k = &r["kernel"];
    let entered = u(&k["overload_entered"]);
    eprintln!(
        "stalled through the upload: {} segments parsed, {} emitted, {} summarized, {} dropped; overloaded {entered} times",
        u(&k["xdp_tcp_segments"]),
        u(&k["xdp_events"]),
        u(&k["xdp_summarized"]),
        u(&k["xdp_dropped"]),
    );
    assert_eq!(done.status.code(), Some(0), "nothing lost: exit 0");
    assert_eq!(u(&r["totals"]["dropped_events"]), 0);
    assert!(entered >= 1, "the ring never passed half full");
    assert_eq!(
        u(&k["xdp_events"]) + u(&k["xdp_summarized"]),
        u(&k["xdp_tcp_segments"]) - u(&k["xdp_filtered"])
    );
    assert_eq!(served, entered as f64);
    let (_, stats) = trace_contents(&file);
    assert_eq!(
        stats.map(|c| c.get(counter::OVERLOAD_ENTERED)),
        Some(entered)
    );
    let text = analyzed_and_removed(&file);
    assert!(
        text.contains(&format!(
            "OVERLOAD   the collector fell behind: {entered} times"
        )),
        "{text}"
    );
    assert!(text.contains("dropped    0 events"), "{text}");
    assert!(lab::lab_namespaces().is_empty());
}

/// With `--never-summarize` a collector stopped for a whole upload loses
/// events (a 1 MiB ring holds a few thousand of its hundreds of
/// thousands), and every count adds up exactly: each segment XDP parsed is
/// either in the trace or counted as dropped; the report, the trace's
/// statistics and the metrics all say the same number; exit 3.
#[test]
fn a_stalled_collector_loses_events_and_every_output_counts_them_exactly() {
    if !root_or_skip("a_stalled_collector_loses_events_and_every_output_counts_them_exactly") {
        return;
    }
    let (done, served, file) = stalled_through_an_upload(
        "stalled.pcapng",
        "1",
        &["--never-summarize"],
        "tracer_dropped_events_total",
    );
    assert_eq!(done.status.code(), Some(3), "events lost: exit 3");
    let r: Value = serde_json::from_slice(&done.stdout).unwrap();
    let k = &r["kernel"];
    let dropped = u(&k["xdp_dropped"]);
    eprintln!(
        "stalled through the upload: {} segments parsed, {} emitted, {dropped} dropped; tcp_probe {} emitted, {} dropped",
        u(&k["xdp_tcp_segments"]),
        u(&k["xdp_events"]),
        u(&k["probe_events"]),
        u(&k["probe_dropped"])
    );
    // (The 1 MiB ring holds under 8,000 events; the upload sent about
    // 280,000 segments.)
    assert!(
        dropped > u(&k["xdp_tcp_segments"]) / 2,
        "the ring did not overflow: {dropped}"
    );
    // Exact, in the kernel's own terms.
    assert_eq!(
        u(&k["xdp_events"]) + dropped,
        u(&k["xdp_tcp_segments"]) - u(&k["xdp_filtered"])
    );
    assert_eq!(
        u(&k["probe_events"])
            + u(&k["probe_dropped"])
            + u(&k["probe_filtered"])
            + u(&k["probe_read_errors"])
            + u(&k["probe_summarized"]),
        u(&k["probe_seen"])
    );
    let lost = dropped
        + u(&k["probe_dropped"])
        + u(&k["retransmit_dropped"])
        + u(&k["probe_lost"])
        + u(&k["retransmit_lost"]);
    assert_eq!(u(&r["totals"]["dropped_events"]), lost);
    // The trace holds exactly the emitted segments, and says what it lacks.
    let (packets, stats) = trace_contents(&file);
    assert_eq!(packets, u(&k["xdp_events"]));
    assert_eq!(packets, u(&r["totals"]["segments"]));
    assert_eq!(stats.map(|c| c.dropped()), Some(lost));
    // The metrics, and the text report of the trace.
    assert_eq!(served, lost as f64);
    let text = analyzed_and_removed(&file);
    assert!(
        text.contains(&format!(
            "DROPPED    {} events lost: the ring buffer was full",
            lost - u(&k["probe_lost"]) - u(&k["retransmit_lost"])
        )),
        "{text}"
    );
    assert!(lab::lab_namespaces().is_empty());
}

/// A second tracer on an interface already traced says so and exits 2;
/// the first goes on tracing, undisturbed.
#[test]
fn a_second_tracer_on_the_same_interface_says_so_and_leaves_the_first_alone() {
    if !root_or_skip("a_second_tracer_on_the_same_interface_says_so_and_leaves_the_first_alone") {
        return;
    }
    let mut lab = a_lab(lab::Mode::Off, 1, 64 << 20);
    // (A ring whose half holds every event of the 64 MiB: every segment is
    // emitted however slowly the collector reads.)
    let (first, rx) = record(&lab, &["--json", "--quiet", "--ring-mib", "64"]);
    said(&rx, "tracing TCP received on");
    let (second, rx2) = record(&lab, &["--json", "--quiet"]);
    let out = second.wait_with_output().unwrap();
    let line = said(&rx2, "tracer:");
    assert_eq!(out.status.code(), Some(2), "{line}");
    assert!(
        line.contains("another tracer (XDP program tag_rx, id "),
        "{line}"
    );
    assert!(line.contains("the tracer does not replace it"), "{line}");
    // The first still traces: an upload after the second gave up.
    lab.start_upload().unwrap();
    while !lab.finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent: u64 = lab.finish().unwrap().flows.iter().map(|f| f.sent).sum();
    signal(&first, libc::SIGINT);
    let done = first.wait_with_output().unwrap();
    drop(lab);
    assert_eq!(done.status.code(), Some(0));
    let r: Value = serde_json::from_slice(&done.stdout).unwrap();
    // Each byte once (a CI run's sender re-sent a 56-byte tail once, with
    // plain forwarding: payload seen 67,108,920 of 67,108,864 sent).
    let advanced: u64 = r["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| u(&f["seq_advance_bytes"]))
        .sum();
    assert_eq!(advanced, sent, "every byte sent was traced");
    assert!(u(&r["totals"]["payload_bytes"]) >= sent);
}

/// Waits until none of the lab's or the tracer's programs is loaded and no
/// namespace of process `pid` exists; what is left after 5 s.
fn leftovers(pid: u32) -> (Vec<String>, Vec<(u32, String)>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ns: Vec<String> = lab::lab_namespaces()
            .into_iter()
            .filter(|n| n.starts_with(&format!("tracer-lab-{pid}-")))
            .collect();
        let mut progs = kernel::loaded_tracer_programs();
        progs.extend(kernel::loaded_programs(&lab::EDGE_PROGRAM_NAMES));
        if (ns.is_empty() && progs.is_empty()) || Instant::now() > deadline {
            return (ns, progs);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `tracer lab` until it has traced 10,000 segments of its upload (a
/// bound on 4 GiB and a minute: it is stopped long before).
fn lab_running(extra: &[&str]) -> Child {
    let mut args = vec![
        "lab",
        "--json",
        "--quiet",
        "--bytes",
        "1G",
        "--duration",
        "60",
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    args.extend(extra);
    let (child, rx) = spawn_tracer(&args);
    traced_at_least(&metrics_addr(&rx), 10_000.0, &rx);
    child
}

/// SIGKILL gives `tracer lab` no chance to clean up: its janitor (a child
/// waiting on a pipe only the lab held) deletes the namespaces, and with
/// them their links, programs and rules; the kernel drops the tracer's
/// links with its file descriptors.
#[test]
fn sigkill_during_lab_leaves_no_namespace_or_program() {
    if !root_or_skip("sigkill_during_lab_leaves_no_namespace_or_program") {
        return;
    }
    for mode in ["atr", "pattern"] {
        let mut child = lab_running(&["--mode", mode]);
        let pid = child.id();
        signal(&child, libc::SIGKILL);
        child.wait().unwrap();
        let (ns, progs) = leftovers(pid);
        assert!(ns.is_empty(), "{mode}: namespaces left: {ns:?}");
        assert!(progs.is_empty(), "{mode}: programs left: {progs:?}");
    }
}

/// SIGINT and SIGTERM in the middle of `lab`, `record` and `live` stop the
/// run: the report comes, exit 0 (or 3 if the kernel lost events), and
/// nothing of ours is left; a trace written so far reads whole.
#[test]
fn sigint_and_sigterm_mid_run_stop_cleanly() {
    if !root_or_skip("sigint_and_sigterm_mid_run_stop_cleanly") {
        return;
    }
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let child = lab_running(&[]);
        let pid = child.id();
        signal(&child, sig);
        let out = child.wait_with_output().unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "lab, signal {sig}: {:?}",
            out.status
        );
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        // (It was stopped once its metrics said so.)
        assert!(u(&r["totals"]["segments"]) >= 10_000);
        let (ns, progs) = leftovers(pid);
        assert!(
            ns.is_empty() && progs.is_empty(),
            "lab, signal {sig}: {ns:?} {progs:?}"
        );
    }
    for (cmd, sig) in [("record", libc::SIGTERM), ("live", libc::SIGINT)] {
        let file = temp(&format!("{cmd}.pcapng"));
        let mut lab = a_lab(ATR, 1, 1 << 30);
        let (child, _rx) = traced_upload_into(&mut lab, cmd, &file);
        signal(&child, sig);
        let out = child.wait_with_output().unwrap();
        let pid = std::process::id();
        drop(lab);
        assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "{cmd}, signal {sig}"
        );
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            analyzed_segments(&file),
            u(&r["totals"]["segments"]),
            "{cmd}"
        );
        let (ns, progs) = leftovers(pid);
        assert!(ns.is_empty() && progs.is_empty(), "{cmd}: {ns:?} {progs:?}");
    }
}

/// `tracer CMD --out FILE` on the lab's server, once it has traced 10,000
/// segments of the lab's upload (started here); its stderr lines.
fn traced_upload_into(lab: &mut Lab, cmd: &str, file: &Path) -> (Child, mpsc::Receiver<String>) {
    let out = file.to_str().unwrap();
    let args = [
        "--json",
        "--quiet",
        "--out",
        out,
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    let (child, rx) = tracer_on_server(lab, cmd, &args);
    let addr = metrics_addr(&rx);
    said(&rx, "tracing TCP received on");
    lab.start_upload().unwrap();
    traced_at_least(&addr, 10_000.0, &rx);
    (child, rx)
}

/// The traced interface deleted mid-run, or its whole namespace: the
/// tracer notices by itself (how soon is printed, not held: a loaded host
/// stretches it), prints the report of what came before, says what
/// happened in one line and exits 1; the trace reads whole.
#[test]
fn the_interface_or_its_namespace_going_away_ends_the_run_with_its_report() {
    if !root_or_skip("the_interface_or_its_namespace_going_away_ends_the_run_with_its_report") {
        return;
    }
    for how in ["link", "netns"] {
        let file = temp(&format!("gone-{how}.pcapng"));
        let mut lab = a_lab(ATR, 1, 1 << 30);
        let (child, rx) = traced_upload_into(&mut lab, "record", &file);
        let ns = lab.topo.server_ns.clone();
        match how {
            "link" => lab::ip(&["-n", &ns, "link", "delete", lab::SERVER_IF]).map(drop),
            _ => lab::ip(&["netns", "delete", &ns]).map(drop),
        }
        .unwrap();
        let gone = Instant::now();
        let out = child.wait_with_output().unwrap();
        let noticed = gone.elapsed();
        drop(lab);
        let stderr = said(&rx, "tracer: ");
        assert_eq!(out.status.code(), Some(1), "{how}: {stderr}");
        assert!(
            stderr.contains("the traced interface went away after"),
            "{how}: {stderr}"
        );
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        let segments = u(&r["totals"]["segments"]);
        assert!(segments >= 10_000, "{how}: {segments}");
        assert_eq!(analyzed_segments(&file), segments, "{how}");
        eprintln!("{how} deleted: noticed in {noticed:?}, {segments} segments reported and kept");
    }
}

/// With `--reattach`, the traced interface deleted and made again: the
/// run says it waits, attaches again (said, and counted in the report)
/// and traces what comes after: each connection's bytes, the one before
/// and the one after, in the report.
#[test]
fn with_reattach_the_interface_coming_back_is_traced_again() {
    if !root_or_skip("with_reattach_the_interface_coming_back_is_traced_again") {
        return;
    }
    const BYTES: usize = 4 << 20;
    let lab = a_lab(lab::Mode::Off, 1, 1 << 20);
    let (child, rx) = record(&lab, &["--json", "--quiet", "--reattach"]);
    said(&rx, "tracing TCP received on");
    assert_eq!(send(&lab, 5401, BYTES), BYTES);
    lab::ip(&["-n", &lab.topo.server_ns, "link", "delete", lab::SERVER_IF]).unwrap();
    let waiting = said(&rx, "waiting for it to come back");
    lab.topo.relink_server().unwrap();
    let back = said(&rx, "attached again");
    eprintln!("{waiting}\n{back}");
    assert_eq!(send(&lab, 5402, BYTES), BYTES);
    // A second for the collector to take the last records in.
    std::thread::sleep(Duration::from_secs(1));
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    drop(lab);
    assert_eq!(out.status.code(), Some(0));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(u(&r["reattached"]), 1);
    for port in [5401, 5402] {
        let to = format!("{}:{port}", lab::SERVER_V4);
        let flow = r["flows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["dst"] == to.as_str())
            .unwrap_or_else(|| panic!("no flow to {to}: {}", r["flows"]));
        assert_eq!(u(&flow["seq_advance_bytes"]), BYTES as u64, "to {to}");
    }
    assert_eq!(u(&r["totals"]["dropped_events"]), 0);
}

/// A tmpfs of `bytes`, unmounted (and its directory removed) on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn new(bytes: u64) -> Self {
        let dir = temp("small-disk");
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={bytes}"),
                "tracer-test",
                dir.to_str().unwrap(),
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a tmpfs");
        Self(dir)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The disk fills while a trace is written: tracing goes on to the end,
/// the report is whole, one line says where the file stops and why
/// (exit 1), and the file reads up to there.
#[test]
fn a_full_disk_stops_the_trace_not_the_tracing() {
    if !root_or_skip("a_full_disk_stops_the_trace_not_the_tracing") {
        return;
    }
    let disk = SmallDisk::new(4 << 20);
    let file = disk.0.join("trace.pcapng");
    let mut lab = a_lab(ATR, 1, 256 << 20);
    let (child, rx) = record(
        &lab,
        &["--json", "--quiet", "--out", file.to_str().unwrap()],
    );
    said(&rx, "tracing TCP received on");
    lab.start_upload().unwrap();
    while !lab.finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    lab.finish().unwrap();
    signal(&child, libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    drop(lab);
    let stderr = said(&rx, "tracer: ");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(stderr.contains("failed after "), "{stderr}");
    assert!(
        stderr.contains("the file keeps what was written"),
        "{stderr}"
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let segments = u(&r["totals"]["segments"]);
    let analyzed = Command::new(BIN)
        .args(["analyze", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    let said_analyze = String::from_utf8_lossy(&analyzed.stderr).to_string();
    assert!(
        matches!(analyzed.status.code(), Some(0 | 1)),
        "{said_analyze}"
    );
    let kept: Value = serde_json::from_slice(&analyzed.stdout).unwrap();
    let kept = u(&kept["totals"]["segments"]);
    eprintln!(
        "4 MiB disk: {kept} of {segments} segments kept; {}",
        stderr.trim()
    );
    // By the sizes: a segment takes about 136 bytes of the file and a
    // TCP-layer record about 180, so the 4 MiB hold over 10,000 segments
    // and far fewer than the upload's 185,000.
    assert!(kept > 5_000 && kept < segments, "{kept} of {segments}");
}
