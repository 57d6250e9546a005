//! `tracer lab` against ground truth, as a user runs it (root; in CI).
//!
//! Oracles, and how exact each is:
//! * The edge's record (`lab.edge`, `--truth`): every segment's ingress
//!   order, queue and CPU, and the order segments left the edge, written in
//!   the kernel at the steering point. Exact about what the edge did. The
//!   server then receives from two CPUs, which can re-interleave segments
//!   that left within microseconds of each other: such a late segment
//!   reaches the server in order after all (and vice versa). So the tracer
//!   is checked against it within a tolerance, and, segment by segment,
//!   every late segment the tracer did not call reordered must have reached
//!   the server in order (re-interleaved), not been misclassified.
//! * Pattern mode's reorderer knows exactly which segments overtook each
//!   held one, on one queue and one CPU: extent, byte offset and
//!   n-reordering must equal it.
//! * The receiver's `tcpi_rcv_ooopack` counts segments TCP queued above a
//!   hole: the tracer's TCP-layer `ofo_segments` applies the kernel's rule
//!   (seq after `rcv_nxt`, `max(1, gso_segs)` each) and must agree within
//!   0.5%; so must its PAWS discards and the receiver's `PAWSEstab`;
//!   `above_hole` is the same definition at XDP, checked within a wider
//!   tolerance (TCP's processing order can differ from XDP's across CPUs).

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer::{kernel, lab};

mod common;
use common::{edge_truth::segment_by_segment, guests_or_skip, root_or_skip, u, under_tcg, BIN};

/// Runs `tracer lab --json --quiet ARGS`; the report.
fn lab_json(args: &[&str]) -> Value {
    lab_json_exits(args, &[0])
}

/// The same, accepting these exit codes (3: events lost, counted). Under
/// TCG the upload gets two minutes instead of the lab's eight seconds (the
/// emulated path carries about 60 Mbit/s: every test expects the upload
/// whole), and a ring that holds all its events (the emulated collector
/// falls behind a burst that a real core keeps up with; mapped twice, it
/// needs a memory budget to match).
fn lab_json_exits(args: &[&str], codes: &[i32]) -> Value {
    let mut cmd = Command::new(BIN);
    cmd.args(["lab", "--json", "--quiet"]).args(args);
    // A ring whose half holds every event of the fixed-size uploads here
    // (2 x 32 MiB: 46,000 segments, two records of under 256 bytes each),
    // so that full mode stays full mode however slowly the collector
    // reads; the runs sized by late segments account for what the kernel
    // summarized instead.
    let ring = if under_tcg() { "256" } else { "64" };
    if !args.contains(&"--ring-mib") {
        cmd.args(["--ring-mib", ring]);
    }
    if under_tcg() {
        for (flag, value) in [("--duration", "120"), ("--memory-mib", "1536")] {
            if !args.contains(&flag) {
                cmd.args([flag, value]);
            }
        }
    }
    let out = cmd.output().expect("run tracer lab");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    // (Exit 3 says what was lost in the report: the losses go with it.)
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let k = &report["kernel"];
    let lost = || {
        [
            "xdp_dropped",
            "probe_dropped",
            "retransmit_dropped",
            "probe_lost",
            "retransmit_lost",
        ]
        .map(|c| format!("{c} {}", k[c]))
        .join(", ")
    };
    assert!(
        code.is_some_and(|c| codes.contains(&c)),
        "tracer lab {args:?} exited {code:?}: {stderr}{}",
        if code == Some(3) {
            lost()
        } else {
            String::new()
        }
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("JSON ({e}): {stderr}"))
}

/// Nothing of a lab run is left: namespaces, programs.
fn assert_clean() {
    assert!(
        lab::lab_namespaces().is_empty(),
        "{:?}",
        lab::lab_namespaces()
    );
    assert!(guests_left().is_empty(), "guests left: {:?}", guests_left());
    let ours = || {
        let mut v = kernel::loaded_tracer_programs();
        v.extend(kernel::loaded_programs(&lab::EDGE_PROGRAM_NAMES));
        v
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ours().is_empty() {
        assert!(Instant::now() < deadline, "programs left: {:?}", ours());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Per flow of a report: (tracer's flow, edge's flow truth, sockets).
fn flows(r: &Value) -> Vec<(&Value, &Value, &Value)> {
    let lab = &r["lab"];
    lab["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|sockets| {
            let src = sockets["flow"]["src"].as_str().unwrap();
            let port: u64 = src.rsplit(':').next().unwrap().parse().unwrap();
            let tracer = r["flows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["src"] == src)
                .unwrap_or_else(|| panic!("{src} not traced"));
            let truth = lab["edge"]["flows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["client_port"] == port)
                .unwrap_or_else(|| panic!("{src} not in the edge's record"));
            (tracer, truth, sockets)
        })
        .collect()
}

/// Whether the replay takes the tracer's TCP-layer view of a flow as
/// whole (99.9% of what XDP saw): this kernel sometimes runs no program
/// for `tcp_probe` on a CPU for milliseconds without counting a miss
/// (issue 2).
fn tcp_layer_whole(f: &Value) -> bool {
    u(&f["tcp_layer"]["payload_bytes"]) * 1000 >= u(&f["payload_bytes"]) * 999
}

/// Payload bytes XDP saw of a flow (full mode) that the TCP layer did
/// not: skbs whose `tcp_probe` run the kernel skipped unannounced. With
/// none, the TCP layer's counts by the kernel's rules equal the kernel's;
/// else they can only fall short.
fn tcp_layer_missed(f: &Value) -> u64 {
    u(&f["payload_bytes"]).saturating_sub(u(&f["tcp_layer"]["payload_bytes"]))
}

/// The kernel's count `kernel` against the tracer's `tracer`, by the same
/// rule on the same skbs: equal, or (`missed` bytes short at the TCP
/// layer) not above it.
fn same_or_short(tracer: u64, kernel: u64, missed: u64) -> bool {
    tracer == kernel || (missed > 0 && tracer < kernel)
}

/// The tracer's TCP-layer out-of-order count against `rcv_ooopack` for a
/// flow: the same, short by what the TCP layer missed, or over by skbs TCP
/// then dropped instead of queueing them (`TCPOFODrop`: receive memory
/// full; counted for the receiver's namespace).
fn ofo_agrees(f: &Value, ooo: u64, receiver: &Value) -> bool {
    let tcp_ofo = u(&f["tcp_layer"]["ofo_segments"]);
    let ofo_drops = u(&receiver["TcpExtTCPOFODrop"]);
    same_or_short(tcp_ofo, ooo, tcp_layer_missed(f))
        || (tcp_ofo > ooo && tcp_ofo - ooo <= ofo_drops)
}

#[test]
fn off_mode_reports_no_reordering() {
    if !root_or_skip("off_mode_reports_no_reordering") {
        return;
    }
    for run in 0..3 {
        let r = lab_json(&["--mode", "off", "--flows", "2", "--bytes", "32M"]);
        assert_eq!(u(&r["totals"]["reordered"]), 0, "run {run}");
        assert_eq!(r["totals"]["verdicts"].get("nic-steering"), None);
        for (f, truth, sockets) in flows(&r) {
            assert_eq!(u(&truth["late"]), 0);
            assert_eq!(u(&truth["queue_changes"]), 0);
            assert_eq!(f["verdict"], "none");
            assert_eq!(u(&sockets["received"]), 32 << 20);
            // The edge is RSS only here: every segment on the queue the
            // edge's key and table pick, as the tracer computes it.
            assert_eq!(u(&truth["off_rss"]), 0);
            assert_eq!(u(&f["rss"]["off_queue"]), 0, "{}", f["evidence"]);
            assert_eq!(
                f["rx_queues"].as_array().unwrap().len(),
                1,
                "{}",
                f["rx_queues"]
            );
            assert_eq!(f["rx_queues"][0]["id"], f["rss"]["queue"]);
            // Segments above a hole (after a loss) match the receiver's
            // own out-of-order count.
            let (ah, ooo) = (u(&f["above_hole"]), u(&sockets["rcv_ooopack"]));
            let tcp_ofo = u(&f["tcp_layer"]["ofo_segments"]);
            eprintln!(
                "off, run {run}: above_hole {ah}, tcp-layer ofo {tcp_ofo}, rcv_ooopack {ooo}; retransmissions {}, TCPBacklogDrop {}",
                sockets["retransmits"], r["lab"]["receiver_counters"]["TcpExtTCPBacklogDrop"]
            );
            // The TCP layer by the kernel's rule (one queue per flow: the
            // same order as XDP's). (XDP's `above_hole` is not held to the
            // kernel's count here: TCP drops segments XDP saw, some without
            // a counter, when the receive window or memory runs short, and
            // then queues out of order what XDP took in order: 956 vs 981
            // once with `PruneCalled` rising and no drop counted.)
            let receiver = &r["lab"]["receiver_counters"];
            assert!(
                ofo_agrees(f, ooo, receiver),
                "tcp-layer ofo {tcp_ofo}, rcv_ooopack {ooo}, {} bytes missed; {receiver}",
                tcp_layer_missed(f)
            );
            // Replayed, a trace without reordering fools no sender.
            for p in f["replay"]["policies"].as_array().unwrap() {
                let why = || {
                    let copies = ["retransmissions", "duplicates", "ambiguous", "tcp_layer"]
                        .map(|k| format!("{k} {}", f[k]));
                    let receiver = &r["lab"]["receiver_counters"];
                    format!("{}: {copies:?}, receiver {receiver}", p["name"])
                };
                assert_eq!(u(&p["spurious_retransmissions"]), 0, "{}", why());
                assert_eq!(u(&p["spurious_recovery_episodes"]), 0, "{}", why());
            }
        }
        // What the NIC says, read from the kernel: veth answers its driver,
        // channels and per-queue statistics (no RSS, no flags: said, not
        // an error). Every segment the tracer saw on a queue passed veth's
        // XDP path between the two readings, so each queue's packet count
        // grew by at least as many.
        let nic = &r["nic"];
        assert_eq!(nic["end"]["driver"], "veth", "{nic}");
        let queues = r["lab"]["edge"]["queue_cpus"].as_array().unwrap().len() as u64;
        assert_eq!(u(&nic["end"]["channels"]["rx"]), queues, "{nic}");
        assert!(
            nic["end"]["unanswered"]
                .to_string()
                .contains("ETHTOOL_GRSSH"),
            "{nic}"
        );
        let mut seen = std::collections::BTreeMap::<u64, u64>::new();
        for f in r["flows"].as_array().unwrap() {
            for q in f["rx_queues"].as_array().unwrap() {
                *seen.entry(u(&q["id"])).or_default() += u(&q["segments"]);
            }
        }
        for (q, segments) in seen {
            let grew = &nic["deltas"][format!("rx_queue_{q}_xdp_packets")];
            assert!(
                u(&grew["delta"]) >= segments,
                "queue {q}: {segments} traced, {grew}"
            );
        }
        assert_eq!(r.get("fix"), None, "no steering, nothing to fix");
        assert_clean();
    }
}

/// Late segments asked of the edge in every flow of an ATR run: the run
/// goes on until it made them (`--until-late`), so every comparison below
/// has at least this many to stand on, whatever the host's timing.
const LATE_PER_FLOW: &str = "200";

/// `tracer lab --mode atr` for `n_flows` flows at `rate` re-points a second,
/// until the edge has made [`LATE_PER_FLOW`] late segments in each, with
/// `extra` flags; the report, checked to have got there and to have
/// delivered every byte sent.
fn atr_until_late(rate: &str, n_flows: &str, extra: &[&str]) -> Value {
    let args = [
        &[
            "--mode",
            "atr",
            "--repoints",
            rate,
            "--flows",
            n_flows,
            "--until-late",
            LATE_PER_FLOW,
            // Caps, not the experiment's length: the run ends at the late
            // segments asked. (2G a flow ended a 20/s run here at 153 of
            // 200 once the tracer cost less and the upload ran faster; the
            // time cap binds first at this host's speed.)
            "--bytes",
            "16G",
            "--duration",
            // (Under TCG the path carries about 60 Mbit/s.)
            if under_tcg() { "240" } else { "60" },
        ][..],
        extra,
    ]
    .concat();
    let r = lab_json(&args);
    let until = &r["lab"]["until_late"];
    // The cap was never meant to be reached: if it is, the experiment is
    // too weak for this host (re-point more often, or more flows), never a
    // reason to expect less.
    // What each flow did, for a run that stopped at the cap: the senders'
    // sockets and what left the edge (a flow may never have reached it).
    let seen = format!(
        "sockets {}; at the edge {}",
        r["lab"]["flows"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| format!("{} {}/{} bytes", s["flow"]["src"], s["received"], s["sent"]))
            .collect::<Vec<_>>()
            .join(", "),
        r["lab"]["edge"]["flows"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| format!(
                "port {} {} segments {} late",
                f["client_port"], f["segments"], f["late"]
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert_eq!(
        until["reached"], true,
        "the edge made only {} late segments in a flow within the cap: {until}; {seen}",
        until["fewest"]
    );
    for (_, truth, sockets) in flows(&r) {
        assert_eq!(sockets["received"], sockets["sent"], "{sockets}");
        assert!(u(&truth["late"]) >= LATE_PER_FLOW.parse().unwrap());
    }
    r
}

/// The ATR lab at three intensities (IPv4) and with IPv6, each run until
/// the edge made enough late segments: the tracer's account of every
/// segment the edge made late ([`segment_by_segment`]), its verdict, and
/// the receiver's own counts at the TCP layer (out-of-order queueing,
/// PAWS), exact.
#[test]
fn atr_reordering_is_found_segment_by_segment_at_three_intensities() {
    if !root_or_skip("atr_reordering_is_found_segment_by_segment_at_three_intensities") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tracer-lab-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (obs, truth_file) = (dir.join("obs.jsonl"), dir.join("truth.jsonl"));
    let files = [
        "--out",
        obs.to_str().unwrap(),
        "--truth",
        truth_file.to_str().unwrap(),
    ];
    for (rate, ipv6) in [("20", false), ("50", false), ("200", false), ("50", true)] {
        let extra = if ipv6 {
            [&files[..], &["--ipv6"]].concat()
        } else if rate == "20" {
            // A ring per CPU, merged by time: the same answer as one ring
            // for every CPU (the default), segment by segment.
            [&files[..], &["--rings", "per-cpu"]].concat()
        } else {
            files.to_vec()
        };
        let r = atr_until_late(rate, "2", &extra);
        let what = format!("rate {rate}{}", if ipv6 { " ipv6" } else { "" });
        assert_eq!(u(&r["totals"]["dropped_events"]), 0, "{what}");
        let account = segment_by_segment(&obs, &truth_file);
        let on_the_way = u(&r["lab"]["dropped_on_the_way"]);
        let summarized = u(&r["kernel"]["xdp_summarized"]);
        eprintln!(
            "{what}: {account}; {on_the_way} packets dropped on the way, {summarized} summarized"
        );
        account.check(&what, ipv6, on_the_way, summarized);
        for (f, truth, sockets) in flows(&r) {
            let (ooo, tcp_ofo) = (
                u(&sockets["rcv_ooopack"]),
                u(&f["tcp_layer"]["ofo_segments"]),
            );
            eprintln!(
                "{what}: tracer {} reordered + {} ambiguous, edge {} late; steered {:.3}; queue migrations {} vs table-driven changes {}; above_hole {}, tcp-layer ofo {tcp_ofo} vs rcv_ooopack {ooo}; sender retransmissions {}; payload {} at XDP, {} at the TCP layer ({} events)",
                f["reordered"],
                f["ambiguous"],
                truth["late"],
                f["attribution"]["steered_share"],
                f["queue_migrations"],
                truth["queue_changes"],
                f["above_hole"],
                sockets["retransmits"],
                f["payload_bytes"],
                f["tcp_layer"]["payload_bytes"],
                f["tcp_layer"]["events"],
            );
            // Hundreds of late segments, overtaken across queues and CPUs
            // (the edge's own count). Over IPv4 the IP ID tells a late
            // original from a retransmission, and every late original was
            // overtaken on another path: the verdict follows. Over IPv6 a
            // late retransmission taken for an original counts on its own
            // queue, so the steered share is a statistic of the run (62%
            // in one run here, under the verdict's 75%): `cargo xtask
            // validate` holds its median to a band.
            if !ipv6 {
                assert_eq!(f["verdict"], "nic-steering", "{what}: {}", f["evidence"]);
            }
            // RSS against the observed queues: each segment the edge sent
            // off the flow's RSS queue (after a re-point, which every late
            // segment needs) arrived off it, as the edge counted them. The
            // upload finishes once the server has seen each client's last
            // segment, so the tracer saw them all, except a packet lost on
            // the way or a stale copy that reached the server after its
            // connection was over (which it answers with a reset); a
            // segment the kernel summarized is counted on the flow's
            // latest queue.
            let resets = u(&r["lab"]["server_resets"]);
            let (seen_off, edge_off) = (u(&f["rss"]["off_queue"]), u(&truth["off_rss"]));
            eprintln!(
                "{what}: off the RSS queue: tracer {seen_off}, edge {edge_off}; {resets} resets"
            );
            // (Not a trivial 0 = 0: a segment late behind one on another
            // path left the edge on another queue than the one before it,
            // and of two queues at most one is the flow's RSS queue.)
            if u(&truth["late_on_another_path"]) > 0 {
                assert!(edge_off > 0, "{what}");
            }
            if on_the_way + summarized + resets == 0 {
                assert_eq!(seen_off, edge_off, "{what}");
            } else {
                assert!(
                    seen_off <= edge_off + summarized && edge_off <= seen_off + on_the_way + resets,
                    "{what}: tracer {seen_off}, edge {edge_off}"
                );
            }
            assert!(
                f["evidence"]
                    .as_str()
                    .unwrap()
                    .contains("off its RSS queue"),
                "{what}: {}",
                f["evidence"]
            );
            // The fix, with the counts behind it (veth names no steering
            // feature: where to look).
            let fix = &r["fix"];
            assert!(
                fix["evidence"]
                    .as_str()
                    .unwrap()
                    .contains("off their RSS queue"),
                "{what}: {fix}"
            );
            // The kernel's own count, by its own rule, at the TCP layer.
            let receiver = &r["lab"]["receiver_counters"];
            assert!(
                ofo_agrees(f, ooo, receiver),
                "{what}: tcp-layer ofo {tcp_ofo} vs rcv_ooopack {ooo}, {} bytes missed; {receiver}",
                tcp_layer_missed(f)
            );
        }
        // Late segments more than a timestamp tick old are discarded by
        // PAWS: the tracer applies the kernel's rule to each skb, the
        // receiver's namespace counts them.
        let paws: u64 = flows(&r)
            .iter()
            .map(|(f, _, _)| u(&f["tcp_layer"]["paws_discarded"]))
            .sum();
        let kernel_paws = u(&r["lab"]["receiver_counters"]["TcpExtPAWSEstab"]);
        // An skb tcp_probe did not see can hide one discarded skb, never
        // add one: a run the kernel skipped (counted: probe_lost, or the
        // bytes the TCP layer missed), or a FIN that came after TCP took
        // the connection's (a tail loss probe's copy first, the original
        // late behind it, discarded in CLOSE_WAIT where tcp_probe does not
        // run; seen on Linux 6.1).
        let probes_missed = u(&r["kernel"]["probe_lost"]);
        let fins_missed: u64 = flows(&r)
            .iter()
            .map(|(f, _, _)| u(&f["fins"]).saturating_sub(u(&f["tcp_layer"]["fins"])))
            .sum();
        let missed = probes_missed + fins_missed;
        let missed_bytes: u64 = flows(&r).iter().map(|(f, _, _)| tcp_layer_missed(f)).sum();
        eprintln!(
            "{what}: PAWS {paws} vs PAWSEstab {kernel_paws}; {probes_missed} tcp_probe runs missed, {fins_missed} FINs after TCP's"
        );
        let hidden = paws <= kernel_paws && kernel_paws - paws <= missed;
        assert!(
            same_or_short(paws, kernel_paws, missed_bytes) || hidden,
            "{what}: PAWS {paws} vs PAWSEstab {kernel_paws}, {probes_missed} tcp_probe runs missed, {fins_missed} FINs after TCP's, {missed_bytes} bytes"
        );
        assert_clean();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pattern_mode_metrics_equal_the_pattern() {
    if !root_or_skip("pattern_mode_metrics_equal_the_pattern") {
        return;
    }
    // Neighbours swapped; held while others pass; and held while others
    // are held too (10 segments often leave within 300 µs): a segment let
    // go is then an arrival inside the holes of those still held.
    for pattern in ["swap:40", "hold:40:300", "hold:10:300"] {
        let r = lab_json(&[
            "--mode",
            "pattern",
            "--pattern",
            pattern,
            "--flows",
            "1",
            "--bytes",
            "16M",
        ]);
        let p = &r["lab"]["edge"]["pattern"];
        let late: Vec<&Value> = p["held"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| {
                u(&h["passed_segments"]) > 0
                    && h["retransmission"] == false
                    && h["superseded"] == false
            })
            .collect();
        let extents: Vec<u64> = late.iter().map(|h| u(&h["passed_segments"])).collect();
        let bytes: Vec<u64> = late.iter().map(|h| u(&h["passed_bytes"])).collect();
        let t = &r["totals"];
        let n = late.len() as u64;
        eprintln!(
            "{pattern}: {n} held and overtaken; tracer {} reordered, extent mean {} vs {:.3}, byte offset mean {} vs {:.1}",
            t["reordered"],
            t["extent"]["mean"],
            extents.iter().sum::<u64>() as f64 / n.max(1) as f64,
            t["byte_offset"]["mean"],
            bytes.iter().sum::<u64>() as f64 / n.max(1) as f64,
        );
        // (By construction: every 40th or 10th of some 11,000 segments.)
        assert!(n > 100, "{pattern}: only {n} held segments were overtaken");
        // The reorderer knows each overtaking segment: the tracer's counts
        // are its own, unless the kernel dropped a segment between the
        // edge and the server (counted), which then changes what it sees.
        let on_the_way = u(&r["lab"]["dropped_on_the_way"]);
        let reordered = u(&t["reordered"]);
        assert!(
            reordered <= n && n - reordered <= on_the_way,
            "{pattern}: {reordered} of {n} held, {on_the_way} dropped on the way"
        );
        if on_the_way == 0 {
            assert_eq!(u(&t["extent"]["min"]), *extents.iter().min().unwrap());
            assert_eq!(u(&t["extent"]["max"]), *extents.iter().max().unwrap());
            let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len() as f64;
            let close =
                |got: &Value, want: f64| (got.as_f64().unwrap() - want).abs() <= 1e-9 * want;
            assert!(
                close(&t["extent"]["mean"], mean(&extents)),
                "{pattern} extent"
            );
            assert!(
                close(&t["byte_offset"]["mean"], mean(&bytes)),
                "{pattern} bytes"
            );
            // RFC 4737 §5: late after n higher segments, for n = 1..8.
            for (i, nr) in t["n_reordering"].as_array().unwrap().iter().enumerate() {
                let want = late
                    .iter()
                    .filter(|h| u(&h["higher_before"]) > i as u64)
                    .count() as u64;
                assert_eq!(u(&nr["count"]), want, "{pattern} n={}", i + 1);
            }
        }
        // One queue, and the reorderer pinned to one CPU: each late segment
        // was overtaken on its own queue and CPU, but for segments that
        // reached the server another way (counted: the flow's other paths;
        // CI once saw 288 of 289).
        let a = &t["attribution"];
        let elsewhere: u64 = flows(&r)
            .iter()
            .map(|(f, _, _)| {
                let paths = f["paths"].as_array().unwrap();
                let main = paths.iter().map(|p| u(&p["segments"])).max().unwrap_or(0);
                paths.iter().map(|p| u(&p["segments"])).sum::<u64>() - main
            })
            .sum();
        let same = u(&a["same_queue_same_cpu"]);
        assert!(
            same <= reordered && reordered - same <= elsewhere,
            "{pattern}: {a}, {elsewhere} segments off the flow's path"
        );
        assert_eq!(u(&t["queue_migrations"]), 0);
        for (f, _, _) in flows(&r) {
            assert_eq!(f["verdict"], "upstream", "{}", f["evidence"]);
        }
        assert_clean();
    }
}

/// Starts a lab run that would take many seconds and waits until it is
/// running (its first line on stderr). Keep the returned stderr open: the
/// run may still write to it.
fn start_long_lab(stdout: Stdio) -> (std::process::Child, impl BufRead) {
    let mut child = Command::new(BIN)
        .args([
            "lab",
            "--quiet",
            "--duration",
            "20",
            "--flows",
            "1",
            "--bytes",
            "1G",
        ])
        .stderr(Stdio::piped())
        .stdout(stdout)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(line.starts_with("lab:"), "{line}");
    (child, stderr)
}

#[test]
fn a_killed_lab_is_cleaned_by_the_next_run() {
    if !root_or_skip("a_killed_lab_is_cleaned_by_the_next_run") {
        return;
    }
    let (mut child, _stderr) = start_long_lab(Stdio::null());
    std::thread::sleep(Duration::from_millis(500));
    // Its janitor too (which would otherwise delete the namespaces), as a
    // crash of the whole machine would: the next run must clean up.
    let children = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .collect::<String>();
    for pid in children.split_whitespace() {
        let pid: i32 = pid.parse().unwrap();
        // SAFETY: plain kill(2) on the lab's child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    child.kill().unwrap(); // SIGKILL: no destructor runs
    child.wait().unwrap();
    assert_eq!(
        lab::lab_namespaces().len(),
        3,
        "the killed run's namespaces"
    );

    let out = Command::new(BIN)
        .args([
            "lab", "--quiet", "--mode", "off", "--flows", "1", "--bytes", "1M",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("removed leftovers of an earlier run"),
        "{stderr}"
    );
    assert_clean();
}

#[test]
fn sigint_mid_run_reports_and_removes_everything() {
    if !root_or_skip("sigint_mid_run_reports_and_removes_everything") {
        return;
    }
    let (child, _stderr) = start_long_lab(Stdio::piped());
    std::thread::sleep(Duration::from_millis(800));
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("(SIGINT)"), "{stdout}");
    assert!(stdout.contains("lab: edge in mode atr"), "{stdout}");
    assert_clean();
}

/// The replay's inputs from the lab's real senders, and their settings in
/// force: with this kernel's senders (RACK-TLP) the sender-side probe read
/// every ACK as the senders' sockets took it and every transmit time, and
/// the replay used them, ACK by ACK exactly when the TCP-layer view is
/// whole; the classic sender (NewReno, fixed threshold, no SACK) kept its
/// threshold of three and, without SACK, was told of no duplicate. How far
/// the predictions agree with what the senders did is a statistic of real
/// TCP: `cargo xtask validate`.
#[test]
fn the_replay_reads_the_real_senders_and_each_sender_keeps_its_settings() {
    if !root_or_skip("the_replay_reads_the_real_senders_and_each_sender_keeps_its_settings") {
        return;
    }
    let base = ["--no-sender-gso", "--ring-mib", "64"];
    let r = atr_until_late("50", "4", &base);
    // (What its ring lost, if the collector fell behind, is counted in
    // `lost`.)
    let acks = &r["lab"]["sender_acks"];
    eprintln!("linux senders: {acks}");
    assert!(u(&acks["seen"]) > 0, "{acks}");
    for (f, _, _) in flows(&r) {
        let assumptions = &f["replay"]["assumptions"];
        assert_eq!(assumptions["ack_delay_from"], "sender");
        assert_eq!(assumptions["send_times_from"], "sender");
        // The ACK-level replay needs the whole TCP-layer view (the kernel
        // sometimes skips tcp_probe programs unannounced, issue 2) with
        // each late arrival matched to the wire's copy; else the replay
        // falls back to the wire model.
        let matched = assumptions["late_copies_lost"] == 0;
        assert_eq!(
            assumptions["ack_level"],
            tcp_layer_whole(f) && matched,
            "the replay uses the TCP layer exactly when it is whole: {assumptions}"
        );
        let names: Vec<&Value> = f["replay"]["policies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| &p["name"])
            .collect();
        assert!(
            names.contains(&&Value::from("rack-tlp")) && names.contains(&&Value::from("classic")),
            "{names:?}"
        );
    }
    assert_clean();

    let r = atr_until_late(
        "200",
        "4",
        &[&base[..], &["--sender", "newreno", "--classic-undo"]].concat(),
    );
    assert_eq!(r["lab"]["senders"][0]["kind"], "newreno");
    for (_, _, s) in flows(&r) {
        assert!(
            u(&s["reordering"]) <= 3,
            "tcpi_reordering {}",
            s["reordering"]
        );
        assert_eq!(u(&s["dsack_dups"]), 0, "no SACK, no DSACK: {s}");
    }
    assert_clean();
}

/// Summary mode (`--summary N`): XDP keeps per-flow state and emits only
/// segments that start below or above the flow's highest byte, that moved
/// queue or CPU, and a sample. Every segment is emitted, summarized or
/// dropped, exactly; the pattern's held segments are all found, as in full
/// mode; and the ATR edge's late segments give the verdict, with and
/// without the TCP layer. (The share summarized and the share of late
/// segments found are statistics of the run: `cargo xtask validate`.)
#[test]
fn summary_mode_keeps_the_reorder_counts_and_verdicts() {
    if !root_or_skip("summary_mode_keeps_the_reorder_counts_and_verdicts") {
        return;
    }
    let accounted = |r: &Value| {
        let k = &r["kernel"];
        assert_eq!(
            u(&k["xdp_events"]) + u(&k["xdp_summarized"]) + u(&k["xdp_dropped"]),
            u(&k["xdp_tcp_segments"]) - u(&k["xdp_filtered"]),
            "every segment emitted, summarized or dropped"
        );
    };
    // Pattern: every 40th data segment swapped with the next, one queue.
    let r = lab_json(&[
        "--mode",
        "pattern",
        "--pattern",
        "swap:40",
        "--flows",
        "1",
        "--bytes",
        "16M",
        "--summary",
        "16",
    ]);
    accounted(&r);
    let held = r["lab"]["edge"]["pattern"]["held"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| {
            u(&h["passed_segments"]) > 0 && h["retransmission"] == false && h["superseded"] == false
        })
        .count() as u64;
    let k = &r["kernel"];
    let (segments, summarized) = (u(&k["xdp_tcp_segments"]), u(&k["xdp_summarized"]));
    eprintln!(
        "summary, pattern swap:40: {held} held and overtaken, tracer {} reordered; {summarized} of {segments} summarized",
        r["totals"]["reordered"],
    );
    assert!(held > 100);
    // As in full mode: the pattern's, but for segments dropped on the way.
    let (reordered, on_the_way) = (
        u(&r["totals"]["reordered"]),
        u(&r["lab"]["dropped_on_the_way"]),
    );
    assert!(
        reordered <= held && held - reordered <= on_the_way,
        "{reordered} of {held} held, {on_the_way} dropped on the way"
    );
    // What may leave the kernel: the sample (1 in 16 of the rest), the
    // held segments and the ones that overtook them, and copies the
    // sender sent again; the rest is summarized.
    let retransmits: u64 = flows(&r).iter().map(|(_, _, s)| u(&s["retransmits"])).sum();
    assert!(
        summarized >= segments - segments / 16 - 2 * held - 2 * retransmits - 16,
        "{summarized} of {segments} summarized"
    );
    // ATR: as the full-mode test; the second time without the TCP layer
    // (tcp_probe loaded, not attached).
    for no_tcp_layer in [false, true] {
        let mut extra = vec!["--summary", "16"];
        if no_tcp_layer {
            extra.push("--no-tcp-layer");
        }
        let r = atr_until_late("50", "2", &extra);
        accounted(&r);
        check_summary_atr(&r, no_tcp_layer);
    }
}

fn check_summary_atr(r: &Value, no_tcp_layer: bool) {
    let k = &r["kernel"];
    if no_tcp_layer {
        assert_eq!(u(&k["probe_first_copy_runs"]), 0);
        assert_eq!(u(&r["totals"]["tcp_layer"]["events"]), 0);
    } else {
        // The TCP layer summarized too: what TCP took in order is only
        // counted, and every run is accounted for.
        let (seen, summarized) = (u(&k["probe_seen"]), u(&k["probe_summarized"]));
        assert_eq!(
            u(&k["probe_events"])
                + u(&k["probe_dropped"])
                + u(&k["probe_filtered"])
                + u(&k["probe_read_errors"])
                + summarized,
            seen
        );
        // What TCP queued out of order and what PAWS discarded always go
        // out: the kernel's own counts still agree (when no tcp_probe run
        // was missed). Whether the kernel skipped a run unannounced, which
        // full mode finds in the bytes, summary mode cannot tell (it
        // counts summarized skbs, not their bytes): the tracer's counts
        // can then only fall short.
        let paws: u64 = flows(r)
            .iter()
            .map(|(f, _, _)| u(&f["tcp_layer"]["paws_discarded"]))
            .sum();
        let kernel_paws = u(&r["lab"]["receiver_counters"]["TcpExtPAWSEstab"]);
        eprintln!(
            "summary, atr: tcp_probe {summarized} of {seen} summarized; PAWS {paws} vs PAWSEstab {kernel_paws}; missed {}",
            u(&k["probe_lost"])
        );
        assert!(paws <= kernel_paws, "PAWS {paws} vs {kernel_paws}");
        let receiver = &r["lab"]["receiver_counters"];
        let ofo_drops = u(&receiver["TcpExtTCPOFODrop"]);
        for (f, _, sockets) in flows(r) {
            let (ofo, ooo) = (
                u(&f["tcp_layer"]["ofo_segments"]),
                u(&sockets["rcv_ooopack"]),
            );
            eprintln!("summary, atr: tcp-layer ofo {ofo} vs rcv_ooopack {ooo}");
            // (Over only by skbs TCP dropped instead of queueing, counted.)
            assert!(
                ofo <= ooo + ofo_drops,
                "tcp-layer ofo {ofo} vs rcv_ooopack {ooo}; {receiver}"
            );
        }
    }
    for (f, truth, sockets) in flows(r) {
        let (data, sent) = (u(&f["data_segments"]), u(&truth["segments"]));
        eprintln!(
            "summary, atr{}: tracer {} reordered, edge {} late; queue migrations {} vs {}; {data} data segments, the edge sent {sent}; sequence advanced {} bytes, received {}",
            if no_tcp_layer { ", no TCP layer" } else { "" },
            f["reordered"],
            truth["late"],
            f["queue_migrations"],
            truth["queue_changes"],
            f["seq_advance_bytes"],
            sockets["received"],
        );
        // The flow's volume, though most of its segments stayed in the
        // kernel: how far its sequence numbers advanced is what the
        // receiving socket read.
        assert_eq!(f["seq_advance_bytes"], sockets["received"]);
        assert_eq!(f["verdict"], "nic-steering", "{}", f["evidence"]);
    }
}

/// Processes of a lab's sender guests (each carries `umid=tracer-lab-...`),
/// and their directories.
fn guests_left() -> Vec<String> {
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if cmdline
            .split(|&b| b == 0)
            .any(|a| a.starts_with(b"umid=tracer-lab-"))
        {
            left.push(format!("process {}", e.file_name().to_string_lossy()));
        }
    }
    for e in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // (tracer-lab-<pid>-...: other tests' directories are named
        // tracer-lab-<word>-...)
        if name
            .strip_prefix("tracer-lab-")
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        {
            left.push(e.path().display().to_string());
        }
    }
    left
}

/// Real senders of the replay's policies: three Linux 6.1 guests side by
/// side through the ATR edge, until the edge has made 50 late segments in
/// each of their flows. Each flow is labelled with its sender; each guest
/// runs Linux 6.1 with its policy's sysctls (read back inside it); every
/// byte sent is received, and every flow got its late segments. (What
/// each guest retransmitted against what the tracer saw of it is printed:
/// it has matched to the segment for classic and been one short for
/// linux-adaptive with nothing dropped; not yet explained, so not held.)
#[test]
fn guest_senders_of_each_policy_run_their_policy_side_by_side() {
    if !guests_or_skip("guest_senders_of_each_policy_run_their_policy_side_by_side") {
        return;
    }
    let r = lab_json(&[
        "--mode",
        "atr",
        "--repoints",
        "200",
        "--sender",
        "classic,linux-adaptive,rack-tlp",
        "--flows",
        "2",
        "--until-late",
        "50",
        "--bytes",
        "64M",
        "--duration",
        "60",
    ]);
    let policies: [(&str, &[(&str, &str)]); 3] = [
        (
            "classic",
            &[
                ("net.ipv4.tcp_recovery", "0"),
                ("net.ipv4.tcp_reordering", "3"),
                ("net.ipv4.tcp_max_reordering", "3"),
                ("net.ipv4.tcp_timestamps", "0"),
            ],
        ),
        (
            "linux-adaptive",
            &[
                ("net.ipv4.tcp_recovery", "0"),
                ("net.ipv4.tcp_max_reordering", "300"),
            ],
        ),
        ("rack-tlp", &[("net.ipv4.tcp_recovery", "1")]),
    ];
    let lab = &r["lab"];
    let drops = u(&lab["dropped_on_the_way"]) + u(&lab["dropped_before_the_edge"]);
    for (kind, knobs) in policies {
        let sender = lab["senders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} sender in {}", lab["senders"]));
        let guest = &sender["guest"];
        assert!(
            guest["release"].as_str().unwrap().starts_with("6.1."),
            "{kind}: {}",
            guest["release"]
        );
        for (knob, value) in knobs {
            assert_eq!(guest["sysctls"][knob], *value, "{kind}: {knob}");
        }
        assert_eq!(guest["errors"].as_array().unwrap().len(), 0, "{guest}");
        let ours: Vec<_> = flows(&r)
            .into_iter()
            .filter(|(_, _, s)| s["sender"] == kind)
            .collect();
        assert_eq!(ours.len(), 2, "{kind}'s flows");
        let (mut seen, mut late_behind_own) = (0, 0);
        for (f, t, s) in &ours {
            assert_eq!(u(&s["received"]), u(&s["sent"]), "{kind}: {s}");
            seen += u(&f["retransmissions"]) + u(&f["duplicates"]) + u(&f["partial_duplicates"]);
            late_behind_own += u(&t["late_already_delivered"]);
        }
        let retransmitted = u(&guest["counters"]["TcpRetransSegs"]);
        eprintln!(
            "{kind}: retransmitted {retransmitted}, {late_behind_own} originals late behind their own; the tracer saw {seen} copies as retransmissions or duplicates ({drops} packets dropped on the way)"
        );
    }
    assert_eq!(lab["until_late"]["reached"], true, "{}", lab["until_late"]);
    assert_eq!(u(&lab["until_late"]["asked"]), 50);
    assert_clean();
}

/// `--no-dsack`: the receiver sends no DSACKs, so the classic guest, which
/// has no timestamps either, undoes none of its recoveries: the seed's
/// sender. Each 200th segment the edge holds 3 ms (about 50 of a 16 MB
/// upload), long after the classic sender retransmitted it at three
/// duplicate ACKs: the original reaches the receiver as a duplicate. It
/// must count duplicates, send no DSACK for them, and the sender undo
/// nothing. (The guest is unpaced, as every guest: paced, its kernel
/// once stalled the flow with data queued and nothing in flight.)
#[test]
fn without_dsacks_the_classic_guest_undoes_nothing() {
    if !guests_or_skip("without_dsacks_the_classic_guest_undoes_nothing") {
        return;
    }
    let r = lab_json(&[
        "--mode",
        "pattern",
        "--pattern",
        "hold:200:3000",
        "--sender",
        "classic",
        "--flows",
        "1",
        "--no-dsack",
        "--bytes",
        "16M",
        "--duration",
        "60",
    ]);
    let lab = &r["lab"];
    let receiver = &lab["receiver_counters"];
    let duplicates = u(&receiver["TcpExtDelayedACKLost"]) + u(&receiver["TcpExtTCPOFOMerge"]);
    assert!(
        duplicates >= 1,
        "no duplicate reached the receiver: {receiver}"
    );
    assert_eq!(u(&receiver["TcpExtTCPDSACKOldSent"]), 0, "{receiver}");
    assert_eq!(u(&receiver["TcpExtTCPDSACKOfoSent"]), 0, "{receiver}");
    let guest = &lab["senders"][0]["guest"];
    let counters = &guest["counters"];
    assert!(u(&counters["TcpExtTCPSackRecovery"]) >= 1, "{counters}");
    for undo in [
        "TcpExtTCPDSACKRecv",
        "TcpExtTCPDSACKUndo",
        "TcpExtTCPFullUndo",
        "TcpExtTCPPartialUndo",
        "TcpExtTCPLossUndo",
    ] {
        assert_eq!(u(&counters[undo]), 0, "{undo}: {counters}");
    }
    for (_, _, s) in flows(&r) {
        assert_eq!(
            u(&s["received"]),
            u(&s["sent"]),
            "{s}; the guest's counters: {counters}; the edge: {}",
            lab["edge"]["counters"]
        );
    }
    assert_clean();
}

/// A guest sender goes with its lab: stopped by SIGINT (the report then
/// has its flow), killed by the janitor on SIGKILL; no process or file of
/// it is left either way.
#[test]
fn a_guest_sender_is_gone_after_sigint_and_sigkill() {
    if !guests_or_skip("a_guest_sender_is_gone_after_sigint_and_sigkill") {
        return;
    }
    for sig in [libc::SIGINT, libc::SIGKILL] {
        let mut child = Command::new(BIN)
            .args([
                "lab",
                "--sender",
                "rack-tlp",
                "--flows",
                "1",
                "--bytes",
                "1G",
                "--duration",
                "30",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Once a progress line counts the guest's flow, it is sending.
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "the lab ended early"
            );
            let mut words = line.split_whitespace().skip_while(|w| *w != "flows");
            if words
                .nth(1)
                .is_some_and(|n| n.parse::<u32>().is_ok_and(|n| n > 0))
            {
                break;
            }
        }
        // (Drained, so the run never blocks on a full pipe.)
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(child.id() as i32, sig) };
        let stdout = child.stdout.take().unwrap();
        let status = child.wait().unwrap();
        let report = std::io::read_to_string(stdout).unwrap();
        if sig == libc::SIGINT {
            assert_eq!(status.code(), Some(0), "{report}");
            assert!(report.contains("(rack-tlp sender)"), "{report}");
        }
        let gone = Instant::now() + Duration::from_secs(5);
        while !(guests_left().is_empty() && lab::lab_namespaces().is_empty()) {
            assert!(
                Instant::now() < gone,
                "signal {sig}: left {:?} {:?}",
                guests_left(),
                lab::lab_namespaces()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
