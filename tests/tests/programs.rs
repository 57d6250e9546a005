//! Every program of the tracer and of the lab's edge, in every mode it
//! has, loads into this kernel, attaches, and does its job on a short
//! upload; and leaves nothing behind. The kernel matrix (`cargo xtask test
//! --kernel all`) runs this on each release: what differs between kernels
//! (a tracepoint's arguments, the verifier, how tc programs attach) fails
//! here, by the name of the mode.

use std::time::{Duration, Instant};

use tests::{record_until_over, record_upload_into, root_or_skip};
use tracer::{
    filter::Filter,
    kernel::{self, AttachedMode, RingLayout, Tracer, TracerOptions, XdpModeChoice},
    lab::{self, Lab, LabSpec, Mode, Pattern, Upload, UploadSpec},
    sink::Sink,
    source::{Observation, Raw},
};
use tracer_common::counter::*;

const BYTES: u64 = 2 << 20;

/// One way to run the tracer.
struct Case {
    name: &'static str,
    xdp: XdpModeChoice,
    filter: &'static str,
    summary: u32,
    /// 1: copy the headers of every segment (a pcapng trace's snaplen).
    snaplen: u32,
    tcp_layer: bool,
}

const FULL: Case = Case {
    name: "full mode, native XDP",
    xdp: XdpModeChoice::Native,
    filter: "",
    summary: 0,
    snaplen: 0,
    tcp_layer: true,
};

const CASES: [Case; 9] = [
    FULL,
    Case {
        name: "full mode, generic XDP",
        xdp: XdpModeChoice::Generic,
        ..FULL
    },
    Case {
        name: "summary mode, native XDP",
        summary: 64,
        ..FULL
    },
    Case {
        name: "summary mode, generic XDP",
        xdp: XdpModeChoice::Generic,
        summary: 64,
        ..FULL
    },
    Case {
        name: "summary mode without the TCP layer",
        summary: 64,
        tcp_layer: false,
        ..FULL
    },
    Case {
        name: "port filter",
        filter: "port 5201",
        ..FULL
    },
    Case {
        name: "port filter in summary mode",
        filter: "port 5201",
        summary: 64,
        ..FULL
    },
    Case {
        name: "address filter, generic XDP",
        xdp: XdpModeChoice::Generic,
        filter: "net 10.77.1.0/24",
        ..FULL
    },
    Case {
        name: "capturing headers",
        snaplen: 1,
        ..FULL
    },
];

/// Counts the segments that came with frame bytes, and the payload of the
/// upload's direction.
#[derive(Default)]
struct Seen {
    segments: u64,
    with_headers: u64,
    payload: u64,
    probes: u64,
}

impl Sink for Seen {
    fn observe(&mut self, obs: &Observation, raw: &Raw) {
        match obs {
            Observation::Segment(s) => {
                self.segments += 1;
                self.payload += u64::from(s.payload_len);
                if raw.frame.is_some_and(|f| f.data.len() >= 54) {
                    self.with_headers += 1;
                }
            }
            Observation::TcpProbe(_) => self.probes += 1,
            Observation::Retransmit(_) => {}
        }
    }
}

fn run_case(case: &Case) {
    let name = case.name;
    let lab = Lab::create(&LabSpec::new(Mode::Off, 2)).expect("lab");
    let topo = &lab.topo;
    let mut opts = TracerOptions::new(lab::SERVER_IF);
    opts.netns = Some(topo.server_ns.clone());
    opts.xdp_mode = case.xdp;
    opts.filter = Filter::parse(case.filter).unwrap();
    opts.summary_sample = case.summary;
    opts.snaplen = case.snaplen;
    opts.tcp_layer = case.tcp_layer;
    let mut tracer = Tracer::attach(&opts)
        .unwrap_or_else(|e| panic!("{name}: the tracer did not attach: {e:#}"));
    let (expected, word) = match case.xdp {
        XdpModeChoice::Generic => (AttachedMode::Generic, "xdpgeneric"),
        _ => (AttachedMode::Native, "xdp"),
    };
    assert_eq!(tracer.mode, expected, "{name}");
    let link = lab::ip(&["-n", &topo.server_ns, "link", "show", lab::SERVER_IF]).unwrap();
    assert!(
        link.split_whitespace().any(|w| w == word),
        "{name}: no {word} program on the interface: {link}"
    );

    let spec = UploadSpec {
        flows: 1,
        bytes_per_flow: BYTES,
        port: lab::SERVER_PORT,
        ipv6: false,
        timeout: Duration::from_secs(60),
        pacing: None,
        sysctls: Vec::new(),
    };
    let mut seen = Seen::default();
    let (outcome, results, _) =
        record_upload_into(topo, &mut tracer, &spec, &mut seen).expect("upload");
    assert_eq!(
        results[0].received, BYTES,
        "{name}: the upload did not finish"
    );

    let c = outcome.counters;
    assert_eq!(c.dropped(), 0, "{name}: events lost");
    assert_eq!(outcome.missing(), 0, "{name}: emitted events not read");
    assert_eq!(outcome.decode_errors, 0, "{name}");
    assert!(c.get(XDP_TCP) > 0, "{name}: XDP saw no TCP segment");
    assert_eq!(
        c.get(XDP_TCP),
        c.get(XDP_EMITTED) + c.get(XDP_SUMMARIZED) + c.get(XDP_FILTERED) + c.get(XDP_DROPPED),
        "{name}: every TCP segment emitted, summarized, filtered or dropped"
    );
    assert_eq!(
        c.get(XDP_FILTERED),
        0,
        "{name}: the filter keeps the upload"
    );
    // Every payload byte was seen, in an event or in summary mode's counts
    // (more only for bytes the sender retransmitted).
    let payload = seen.payload + c.get(XDP_SUMMARIZED_BYTES);
    let resent = u64::from(results[0].retransmits) * 1500;
    assert!(
        (BYTES..=BYTES + resent).contains(&payload),
        "{name}: {payload} payload bytes seen, {BYTES} sent"
    );
    if case.summary > 0 {
        assert!(c.get(XDP_SUMMARIZED) > 0, "{name}: nothing summarized");
    }
    if case.snaplen > 0 {
        assert_eq!(c.get(XDP_CAPTURE_FAILED), 0, "{name}");
        assert_eq!(
            seen.with_headers, seen.segments,
            "{name}: segments without their headers"
        );
    }
    if case.tcp_layer {
        assert!(
            c.get(PROBE_SEEN) > 0 && seen.probes > 0,
            "{name}: no tcp_probe event"
        );
    } else {
        assert_eq!(
            c.get(PROBE_SEEN),
            0,
            "{name}: tcp_probe ran without the TCP layer"
        );
    }

    let server_ns = topo.server_ns.clone();
    drop(tracer);
    let link = lab::ip(&["-n", &server_ns, "link", "show", lab::SERVER_IF]).unwrap();
    assert!(!link.contains("xdp"), "{name}: XDP still attached: {link}");
    assert_eq!(wait_for_unload(&kernel::PROGRAM_NAMES), vec![], "{name}");
}

/// Programs with these names still loaded after up to five seconds
/// (tracing links free their program after an RCU grace period).
fn wait_for_unload(names: &[&str]) -> Vec<(u32, String)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let left = kernel::loaded_programs(names);
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_tracer_loads_attaches_and_counts_in_every_mode() {
    if !root_or_skip("the_tracer_loads_attaches_and_counts_in_every_mode") {
        return;
    }
    for case in &CASES {
        run_case(case);
    }
}

/// The lab's edge in each of its modes: `edge_steer` (XDP, with the CPU
/// map in ATR mode), `edge_egress` (tc), the pattern mode's NFQUEUE rule
/// and the senders' ACK probe (the tracer's TCP tracepoint programs in the
/// client's namespace); each forwards the upload and records its truth.
#[test]
fn the_lab_edge_runs_in_every_mode() {
    if !root_or_skip("the_lab_edge_runs_in_every_mode") {
        return;
    }
    for mode in [
        Mode::Atr {
            rate: 50.0,
            qsize: 256,
        },
        Mode::Pattern {
            pattern: "swap:40".parse::<Pattern>().unwrap(),
        },
        Mode::Off,
    ] {
        let mut spec = LabSpec::new(mode, 2);
        spec.bytes_per_flow = BYTES;
        let mut lab = Lab::create(&spec).unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        lab.start_upload()
            .unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        let deadline = std::time::Instant::now() + spec.timeout;
        while !lab.finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let outcome = lab.finish().unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        assert_eq!(
            outcome.flows[0].received, BYTES,
            "{mode}: the upload did not finish"
        );
        let c = &outcome.edge.counters;
        assert!(c["tcp"] > 0 && c["egress_data"] > 0, "{mode}: {c:?}");
        assert_eq!(c["redirect_failed"], 0, "{mode}: {c:?}");
        assert_eq!(c["truth_dropped"], 0, "{mode}: {c:?}");
        let truth: u64 = outcome.edge.truth.flows.iter().map(|f| f.segments).sum();
        assert_eq!(truth, c["truth_emitted"], "{mode}: every truth event read");
        assert!(
            outcome.sender_acks.seen > 0,
            "{mode}: the senders' ACK probe saw nothing"
        );
        match mode {
            Mode::Atr { .. } => assert!(
                !outcome.edge.truth.table_changes.is_empty(),
                "{mode}: no re-point"
            ),
            Mode::Pattern { .. } => {
                let p = outcome.edge.pattern.as_ref().expect("pattern truth");
                assert!(
                    p.data_segments > 0 && !p.held.is_empty(),
                    "{mode}: nothing held"
                );
            }
            Mode::Off => {}
        }
        drop(lab);
        let mut names = lab::EDGE_PROGRAM_NAMES.to_vec();
        names.extend(kernel::PROGRAM_NAMES);
        assert_eq!(wait_for_unload(&names), vec![], "{mode}");
    }
}

/// A program this kernel refuses is one line: the program, the release,
/// the verifier's reason (its own words, from its log), and where the
/// whole log went. Forced here on every kernel: `tcp_probe` told that
/// `tcp_sock.srtt_us` lies a megabyte into the socket.
#[test]
fn a_rejected_program_is_one_line_naming_kernel_and_cause() {
    if !root_or_skip("a_rejected_program_is_one_line_naming_kernel_and_cause") {
        return;
    }
    let kernel = kernel::KernelFeatures::running().unwrap();
    let mut layout = kernel.layout;
    layout.tp_srtt_us = 1 << 20;
    let mut ebpf = aya::EbpfLoader::new()
        .override_global("KERNEL_LAYOUT", &layout, true)
        .load(tracer::EBPF_OBJECT)
        .expect("loading the eBPF object");
    let btf = aya::Btf::from_sys_fs().unwrap();
    let prog: &mut aya::programs::BtfTracePoint =
        ebpf.program_mut("tcp_probe0").unwrap().try_into().unwrap();
    let err = prog
        .load("tcp_probe", &btf)
        .expect_err("the verifier accepted it");
    let line = format!(
        "{:#}",
        kernel::rejected("tcp_probe0", "tp_btf/tcp_probe", err)
    );
    eprintln!("{line}");
    assert!(!line.contains('\n'), "{line}");
    let head = format!(
        "Linux {} rejected program tcp_probe0 (tp_btf/tcp_probe): ",
        kernel.release
    );
    let rest = line.strip_prefix(&head).unwrap_or_else(|| panic!("{line}"));
    let (cause, file) = rest
        .split_once("; the verifier's log is in ")
        .unwrap_or_else(|| panic!("{line}"));
    let log = std::fs::read_to_string(file).expect("the saved log");
    let _ = std::fs::remove_file(file);
    // The reason is the log's own words, and the log is more than that.
    let words = cause.rsplit_once(" (instruction").map_or(cause, |(w, _)| w);
    assert!(
        words.split("; ").all(|w| log.contains(w)),
        "{cause} not in the log"
    );
    assert!(log.lines().count() > 3 && !words.is_empty(), "{log}");
}

/// A collector that gets no CPU while the upload runs: the first
/// observation blocks it until every sender is done.
struct Starved<'a> {
    seen: Seen,
    upload: &'a Upload,
    waited: bool,
}

impl Sink for Starved<'_> {
    fn observe(&mut self, obs: &Observation, raw: &Raw) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.waited && !self.upload.finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.waited = true;
        self.seen.observe(obs, raw);
    }
}

/// 4 MiB of rings, shared among the CPUs' (about 30,000 events in all),
/// and a collector
/// starved for a whole 64 MiB upload (some 46,000 segments, each an XDP
/// event and most a tcp_probe one), in full mode: by default the programs
/// summarize once the ring is half full, and then emit what fits in the
/// other half (1 in 64 of the rest, and what loss recovery sends out of
/// order), so nothing is lost: every payload byte sent is counted; with
/// the guard off (`--never-summarize`) the same run drops events.
#[test]
fn a_starved_collector_loses_no_event_unless_told_to() {
    if !root_or_skip("a_starved_collector_loses_no_event_unless_told_to") {
        return;
    }
    const UPLOAD: u64 = 64 << 20;
    for guard in [true, false] {
        let lab = Lab::create(&LabSpec::new(Mode::Off, 2)).expect("lab");
        let topo = &lab.topo;
        let mut opts = TracerOptions::new(lab::SERVER_IF);
        opts.netns = Some(topo.server_ns.clone());
        opts.ring_bytes = 4 << 20;
        // A ring per CPU: the merge, starved, must put no record out of
        // order (its late count below).
        opts.rings = RingLayout::PerCpu;
        if !guard {
            opts.overload_sample = 0;
        }
        let mut tracer = Tracer::attach(&opts).expect("attach");
        let spec = UploadSpec {
            flows: 1,
            bytes_per_flow: UPLOAD,
            port: lab::SERVER_PORT,
            ipv6: false,
            timeout: Duration::from_secs(120),
            pacing: None,
            sysctls: Vec::new(),
        };
        let upload = Upload::start(topo, &spec).expect("upload");
        let mut sink = Starved {
            seen: Seen::default(),
            upload: &upload,
            waited: false,
        };
        let (outcome, _) =
            record_until_over(&mut tracer, &upload, &spec, &mut sink).expect("record");
        let seen = sink.seen.payload;
        let results = upload.join().expect("upload");
        // However far behind, the CPUs' rings merged in time order.
        assert_eq!(tracer.rings().late(), 0, "records merged out of order");
        drop(tracer);
        assert_eq!(results[0].received, UPLOAD, "the upload did not finish");
        let c = outcome.counters;
        let payload = seen + c.get(XDP_SUMMARIZED_BYTES);
        eprintln!(
            "guard {guard}: overloaded {} times (left {}), dropped {} (XDP {}, tcp_probe {}), {} of {UPLOAD} payload bytes counted, {} segments summarized",
            c.get(OVERLOAD_ENTERED),
            c.get(OVERLOAD_LEFT),
            c.dropped(),
            c.get(XDP_DROPPED),
            c.get(PROBE_DROPPED),
            payload,
            c.get(XDP_SUMMARIZED),
        );
        if guard {
            assert_eq!(c.dropped(), 0, "events lost with the guard on");
            assert!(
                c.get(OVERLOAD_ENTERED) > 0,
                "the collector never fell behind"
            );
            // Each CPU's ring is guarded on its own: at most each still
            // overloaded at the end.
            let cpus = aya::util::nr_cpus().expect("possible CPUs") as u64;
            assert!(c.get(OVERLOAD_ENTERED) - c.get(OVERLOAD_LEFT) <= cpus);
            let resent = u64::from(results[0].retransmits) * 1500;
            assert!(
                (UPLOAD..=UPLOAD + resent).contains(&payload),
                "{payload} payload bytes counted, {UPLOAD} sent"
            );
        } else {
            assert_eq!(c.get(OVERLOAD_ENTERED), 0);
            assert!(c.get(XDP_DROPPED) > 0, "the starved collector kept up");
        }
    }
}
