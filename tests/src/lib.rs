//! Shared helpers for the kernel integration tests.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Result;
use tracer::{
    engine::{Engine, EngineConfig},
    kernel::{Tracer, TracerOptions, XdpModeChoice},
    lab::{self, FlowResult, Lab, LabSpec, Topology, Upload, UploadSpec},
    record::{self, Outcome, RecordOptions},
    sink::{Collect, Sink},
};

#[path = "../../tracer/tests/common/host.rs"]
mod host;
pub use host::{guests_or_skip, root_or_skip, under_tcg};

/// Where in the lab the tracer is attached.
#[derive(Clone, Copy)]
pub enum Side {
    Server,
    Client,
}

/// The lab's network with its edge forwarding plainly (`--mode off`), and
/// the tracer attached to one side.
pub fn traced_lab(
    queues: u32,
    side: Side,
    mode: XdpModeChoice,
    filter: &str,
) -> Result<(Lab, Tracer)> {
    let lab = Lab::create(&LabSpec::new(lab::Mode::Off, queues))?;
    let topo = &lab.topo;
    let (iface, ns) = match side {
        Side::Server => (lab::SERVER_IF, &topo.server_ns),
        Side::Client => (lab::CLIENT_IF, &topo.client_ns),
    };
    let mut opts = TracerOptions::new(iface);
    opts.netns = Some(ns.clone());
    opts.xdp_mode = mode;
    opts.filter = tracer::filter::Filter::parse(filter)?;
    opts.ring_bytes = RING_BYTES;
    let tracer = Tracer::attach(&opts)?;
    Ok((lab, tracer))
}

/// The ring of the tests' tracers: half of it (where the overload guard
/// starts summarizing) holds every event of the largest upload they trace,
/// 4 x 64 MiB (185,000 segments, an XDP and a tcp_probe event each, under
/// 256 bytes apiece), so however slowly the collector reads, full mode
/// stays full mode and nothing is dropped.
pub const RING_BYTES: u32 = 256 << 20;

/// What a traced upload gives: the tracer's outcome, every observation, the
/// sockets' own counts and the engine fed with the observations.
pub type Recorded = (Outcome, Collect, Vec<FlowResult>, Engine);

/// Runs an upload and records everything the tracer sees meanwhile, through
/// the engine as `tracer record` does.
pub fn record_upload(topo: &Topology, tracer: &mut Tracer, spec: &UploadSpec) -> Result<Recorded> {
    // Room up front: growing a vector of a million observations stalls the
    // consumer long enough to fill the ring under a multi-gigabit upload.
    let mut collect = Collect(Vec::with_capacity(4_000_000));
    let (outcome, results, engine) = record_upload_into(topo, tracer, spec, &mut collect)?;
    Ok((outcome, collect, results, engine))
}

/// The same, into `sink`.
pub fn record_upload_into(
    topo: &Topology,
    tracer: &mut Tracer,
    spec: &UploadSpec,
    sink: &mut dyn Sink,
) -> Result<(Outcome, Vec<FlowResult>, Engine)> {
    let upload = Upload::start(topo, spec)?;
    let (outcome, engine) = record_until_over(tracer, &upload, spec, sink)?;
    let results = upload.join()?;
    Ok((outcome, results, engine))
}

/// Records `upload` (started from `spec`) into `sink` until it is over.
pub fn record_until_over(
    tracer: &mut Tracer,
    upload: &Upload,
    spec: &UploadSpec,
    sink: &mut dyn Sink,
) -> Result<(Outcome, Engine)> {
    let mut engine = Engine::new(EngineConfig::default());
    let outcome = record::run(
        tracer,
        &mut engine,
        &mut [sink],
        || upload.finished(),
        RecordOptions {
            nic: None,
            intervals: None,
            interface: Default::default(),
            duration: Some(spec.timeout + Duration::from_secs(5)),
            progress: false,
            live: None,
            metrics: None,
        },
    )?;
    Ok((outcome, engine))
}

/// How a set of byte ranges covers [0, len): bytes covered more than once,
/// and the gaps (start, end) left uncovered.
#[derive(Debug, PartialEq, Eq)]
pub struct Coverage {
    pub covered_once_or_more: u64,
    pub duplicate_bytes: u64,
    pub gaps: Vec<(u64, u64)>,
    pub beyond_end: u64,
}

pub fn coverage(ranges: &[(u64, u64)], len: u64) -> Coverage {
    // Sweep over range boundaries: +1 at a start, -1 at an end.
    let mut edges: BTreeMap<u64, i64> = BTreeMap::new();
    for &(start, end) in ranges {
        *edges.entry(start).or_default() += 1;
        *edges.entry(end).or_default() -= 1;
    }
    let (mut depth, mut at) = (0i64, 0u64);
    let mut c = Coverage {
        covered_once_or_more: 0,
        duplicate_bytes: 0,
        gaps: Vec::new(),
        beyond_end: 0,
    };
    let account = |from: u64, to: u64, depth: i64, c: &mut Coverage| {
        if from >= to {
            return;
        }
        let inside = to.min(len).saturating_sub(from.min(len));
        c.beyond_end += (to - from) - inside;
        if depth == 0 {
            if inside > 0 {
                c.gaps.push((from.min(len), to.min(len)));
            }
        } else {
            c.covered_once_or_more += inside;
            c.duplicate_bytes += inside * (depth as u64 - 1);
        }
    };
    for (&pos, &delta) in &edges {
        account(at, pos, depth, &mut c);
        depth += delta;
        at = pos;
    }
    account(at, len.max(at), depth, &mut c);
    c
}

/// The online CPU count, from the kernel's own list (e.g. "0-1").
pub fn online_cpus() -> u32 {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    list.trim()
        .split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => b.parse::<u32>().unwrap_or(0) - a.parse::<u32>().unwrap_or(0) + 1,
            None => 1,
        })
        .sum()
}

/// Drops every `nth` TCP segment of 1000 bytes or more to port 5201 at
/// INPUT in namespace `ns` (after XDP, before TCP). The rule goes with the
/// namespace.
pub fn drop_every_nth_data_segment(ns: &str, nth: u32) {
    let nth = nth.to_string();
    lab::ip(&[
        "netns",
        "exec",
        ns,
        "iptables",
        "-A",
        "INPUT",
        "-p",
        "tcp",
        "--dport",
        "5201",
        "-m",
        "length",
        "--length",
        "1000:65535",
        "-m",
        "statistic",
        "--mode",
        "nth",
        "--every",
        &nth,
        "--packet",
        "0",
        "-j",
        "DROP",
    ])
    .expect("iptables rule");
}

/// Packets the rule of [`drop_every_nth_data_segment`] dropped so far
/// (iptables' own counter).
pub fn dropped_by_rule(ns: &str) -> u64 {
    let out = lab::ip(&["netns", "exec", ns, "iptables", "-nvxL", "INPUT"]).expect("iptables -L");
    out.lines()
        .find(|l| l.contains("DROP") && l.contains("dpt:5201"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no drop rule in:\n{out}"))
}

/// Packets the veth pair dropped itself (e.g. its XDP ring was full): the
/// sum of both ends' rx and tx `dropped` counters.
pub fn veth_drops(topo: &Topology) -> u64 {
    [
        (&topo.client_ns, lab::CLIENT_IF),
        (&topo.server_ns, lab::SERVER_IF),
    ]
    .iter()
    .map(|(ns, dev)| {
        let out = lab::ip(&["-n", ns, "-s", "-j", "link", "show", dev]).expect("ip -s link");
        let v: serde_json::Value = serde_json::from_str(&out).expect("ip -j output");
        let s = &v[0]["stats64"];
        s["rx"]["dropped"].as_u64().unwrap_or(0) + s["tx"]["dropped"].as_u64().unwrap_or(0)
    })
    .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`RING_BYTES`]' claim: its half holds an XDP and a tcp_probe
    /// record (8-byte header each) for every segment of 4 x 64 MiB.
    #[test]
    fn half_the_ring_holds_the_largest_upload() {
        use tracer_common::{ProbeEvent, SegmentEvent};
        let records = [size_of::<SegmentEvent>(), size_of::<ProbeEvent>()].map(|n| n + 8);
        assert!(records.iter().all(|&n| n <= 256), "{records:?}");
        let segments = 4 * ((64 << 20) / 1448 + 1);
        assert!(segments * 2 * 256 <= RING_BYTES as usize / 2);
    }

    #[test]
    fn coverage_finds_gaps_and_duplicates() {
        let c = coverage(&[(0, 10), (5, 15), (20, 30)], 30);
        assert_eq!(c.covered_once_or_more, 25);
        assert_eq!(c.duplicate_bytes, 5);
        assert_eq!(c.gaps, vec![(15, 20)]);
        let c = coverage(&[(0, 10)], 12);
        assert_eq!(c.gaps, vec![(10, 12)]);
        assert_eq!(coverage(&[(0, 12)], 10).beyond_end, 2);
    }
}
