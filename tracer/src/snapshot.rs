//! The read-only view of the engine that every sink renders (report, JSON,
//! TUI, exporters): plain, serialisable numbers, no engine internals.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    engine::{
        order::MAX_N,
        verdict::{self, Verdict},
        EngineConfig, FlowState, FlowTotals, Hist, HistData, Metrics, Path, TcpLayer,
    },
    kernel::{Counters, KernelReport},
    replay::Replay,
    source::Flow,
};

#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub totals: Totals,
    pub flows: Vec<FlowReport>,
    pub tracked_flows: u64,
    pub evicted_flows: u64,
    pub config: EngineConfig,
    /// The kernel's counters, when the snapshot comes from a live trace.
    pub kernel: Option<BTreeMap<&'static str, u64>>,
    /// The kernel traced on: its release and what it lacks.
    pub linux: Option<KernelReport>,
    /// The collector's peak resident memory (a live trace).
    pub peak_resident_bytes: Option<u64>,
    /// What the engine's flows hold, its budget, and what it gave up.
    pub memory: Memory,
}

/// The engine's memory: its budget, what its flows hold, what it gave up
/// to stay within the budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Memory {
    pub budget_bytes: u64,
    pub held_bytes: u64,
    /// The most held once an observation was taken in (and anything given
    /// up for it).
    pub peak_held_bytes: u64,
    /// Flows whose ACK-level replay log was given up (replayed from the
    /// wire instead).
    pub ack_logs_shed: u64,
    /// Flows evicted to stay within the budget (their counts stay in the
    /// totals; they are also among the evicted flows).
    pub evicted_for_memory: u64,
}

impl Snapshot {
    /// Adds what the kernel counted (dropped events above all).
    pub fn with_kernel(mut self, counters: &Counters) -> Self {
        self.totals.dropped_events = counters.dropped();
        self.kernel = Some(counters.named().collect());
        self
    }

    /// Adds the collector's peak resident memory.
    pub fn with_resident(mut self, peak_bytes: u64) -> Self {
        self.peak_resident_bytes = Some(peak_bytes);
        self
    }

    /// Adds which kernel the trace was taken on.
    pub fn with_linux(mut self, linux: Option<KernelReport>) -> Self {
        self.linux = linux;
        self
    }
}

/// A distribution: summary statistics and log2 buckets (upper bound,
/// count) for plotting.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Distribution {
    pub count: u64,
    pub min: u64,
    pub mean: f64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
    pub buckets: Vec<(u64, u64)>,
}

impl Distribution {
    pub fn of(h: &Hist) -> Self {
        h.get().map(Self::from_histogram).unwrap_or_default()
    }

    fn from_histogram(d: &HistData) -> Self {
        let h = &d.histogram;
        if d.count == 0 {
            return Self::default();
        }
        // Each recorded value once, in the power of two at or above it (as
        // precise as the histogram: within 10%). (Counting between powers
        // of two counted the histogram's sub-buckets that straddle one
        // twice: the buckets summed to more than the count.)
        let mut buckets: Vec<(u64, u64)> = Vec::new();
        for v in h.iter_recorded() {
            let value = h
                .lowest_equivalent(v.value_iterated_to())
                .clamp(d.min, d.max);
            let upper = value.max(1).next_power_of_two();
            match buckets.last_mut() {
                Some((u, n)) if *u == upper => *n += u64::from(v.count_at_value()),
                _ => buckets.push((upper, u64::from(v.count_at_value()))),
            }
        }
        // Percentiles are within the histogram's precision; never outside
        // what was recorded.
        let q = |p: f64| h.value_at_quantile(p).clamp(d.min, d.max);
        Self {
            count: d.count,
            min: d.min,
            mean: d.sum as f64 / d.count as f64,
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            max: d.max,
            buckets,
        }
    }
}

/// RFC 4737 §5: how many segments were n-reordered, and the degree
/// (share of received segments).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NReordering {
    pub n: usize,
    pub count: u64,
    pub degree: f64,
}

/// RFC 4737 §4.6 reordering-free runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Runs {
    /// x: runs closed by a reordered segment.
    pub runs: u64,
    /// a / p: the share of segments in order.
    pub share_in_order: f64,
    /// a / x.
    pub mean_length: f64,
    /// (q / a) / (a / x): 1 when all runs have the same length.
    pub spread: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Pair {
    /// The overtaking segment's queue or CPU.
    pub from: u32,
    /// The reordered segment's.
    pub to: u32,
    pub count: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AttributionReport {
    pub same_queue_same_cpu: u64,
    pub different_queue: u64,
    pub different_cpu: u64,
    pub different_queue_and_cpu: u64,
    /// Share of reordered segments overtaken on another queue or CPU.
    pub steered_share: f64,
    pub queue_pairs: Vec<Pair>,
    pub cpu_pairs: Vec<Pair>,
}

/// RFC 5236 densities: (displacement or occupancy, share).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Densities {
    pub rd: Vec<(i64, f64)>,
    /// Displacements beyond DT (not in `rd`).
    pub rd_beyond: u64,
    pub rbd: Vec<(u64, f64)>,
}

/// The RFC 4737 and 5236 metrics, attribution and migrations of a set of
/// segments (one flow direction, or all).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Reordering {
    pub data_segments: u64,
    pub payload_bytes: u64,
    pub in_order: u64,
    pub reordered: u64,
    pub retransmissions: u64,
    pub duplicates: u64,
    pub partial_duplicates: u64,
    pub ambiguous: u64,
    /// Duplicates that were late originals whose retransmission had filled
    /// the hole first: spurious retransmissions that won the race.
    pub originals_behind_retransmission: u64,
    /// Segments whose first new byte arrived above a hole (a receiving TCP
    /// queues them out of order: Linux's `tcpi_rcv_ooopack`).
    pub above_hole: u64,
    /// Reordered / (data segments - duplicates), RFC 4737 §4.1.
    pub reordered_ratio: f64,
    pub n_reordering: Vec<NReordering>,
    /// In segments (RFC 4737 §4.2).
    pub extent: Distribution,
    pub late_time_us: Distribution,
    pub byte_offset: Distribution,
    /// Between successive reordering discontinuities, in segments and µs.
    pub gap: Distribution,
    pub gap_time_us: Distribution,
    pub runs: Runs,
    pub densities: Densities,
    pub attribution: AttributionReport,
    pub queue_migrations: u64,
    pub cpu_migrations: u64,
    pub reordered_after_migration: u64,
    pub old_queue_late_us: Distribution,
}

impl Reordering {
    fn of(m: &Metrics) -> Self {
        let received = m.data_segments.saturating_sub(m.duplicates).max(1);
        let a = m.in_order as f64;
        let x = m.reordered as f64;
        let p = (m.in_order + m.reordered) as f64;
        let pairs = |map: &BTreeMap<(u32, u32), u64>| {
            map.iter()
                .map(|(&(from, to), &count)| Pair { from, to, count })
                .collect()
        };
        let rd_n: u64 = m.rd.iter().sum();
        let dt = m.rd.len() as i64 / 2;
        let rbd_n: u64 = m.rbd.iter().sum();
        Self {
            data_segments: m.data_segments,
            payload_bytes: m.payload_bytes,
            in_order: m.in_order,
            reordered: m.reordered,
            retransmissions: m.retransmissions,
            duplicates: m.duplicates,
            partial_duplicates: m.partial_duplicates,
            ambiguous: m.ambiguous,
            above_hole: m.above_hole,
            originals_behind_retransmission: m.originals_behind_retransmission,
            reordered_ratio: m.reordered as f64 / received as f64,
            n_reordering: (0..MAX_N)
                .map(|i| NReordering {
                    n: i + 1,
                    count: m.late.n_reordered[i],
                    degree: m.late.n_reordered[i] as f64 / received as f64,
                })
                .collect(),
            extent: Distribution::of(&m.late.extent),
            late_time_us: Distribution::of(&m.late.late_time_us),
            byte_offset: Distribution::of(&m.late.byte_offset),
            gap: Distribution::of(&m.late.gap),
            gap_time_us: Distribution::of(&m.late.gap_time_us),
            runs: Runs {
                runs: m.reordered,
                share_in_order: if p > 0.0 { a / p } else { 1.0 },
                mean_length: if x > 0.0 { a / x } else { a },
                spread: if a > 0.0 && x > 0.0 {
                    (m.late.run_squares as f64 / a) / (a / x)
                } else {
                    0.0
                },
            },
            densities: Densities {
                rd: m
                    .rd
                    .iter()
                    .enumerate()
                    .filter(|(_, &c)| c > 0)
                    .map(|(i, &c)| (i as i64 - dt, c as f64 / rd_n as f64))
                    .collect(),
                rd_beyond: m.rd_beyond,
                rbd: m
                    .rbd
                    .iter()
                    .enumerate()
                    .filter(|(_, &c)| c > 0)
                    .map(|(i, &c)| (i as u64, c as f64 / rbd_n as f64))
                    .collect(),
            },
            attribution: AttributionReport {
                same_queue_same_cpu: m.late.attribution[0],
                different_queue: m.late.attribution[1],
                different_cpu: m.late.attribution[2],
                different_queue_and_cpu: m.late.attribution[3],
                steered_share: verdict::steered_share(m),
                queue_pairs: pairs(&m.late.queue_pairs),
                cpu_pairs: pairs(&m.late.cpu_pairs),
            },
            queue_migrations: m.queue_migrations,
            cpu_migrations: m.cpu_migrations,
            reordered_after_migration: m.late.reordered_after_migration,
            old_queue_late_us: Distribution::of(&m.late.old_queue_late_us),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    /// All XDP segments, data or not.
    pub segments: u64,
    #[serde(flatten)]
    pub reordering: Reordering,
    pub tcp_layer: TcpLayer,
    /// The (RX queue, CPU) matrix over all flows.
    pub paths: Vec<PathReport>,
    pub local_retransmit_events: u64,
    /// Flows per verdict.
    pub verdicts: BTreeMap<Verdict, u64>,
    /// Events the kernel lost (ring full or program not run).
    pub dropped_events: u64,
    /// Every flow's replay, summed (goodputs add).
    pub replay: Replay,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub id: u32,
    pub segments: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FlowReport {
    pub src: String,
    pub dst: String,
    pub segments: u64,
    #[serde(flatten)]
    pub reordering: Reordering,
    pub rx_queues: Vec<Spread>,
    pub cpus: Vec<Spread>,
    /// The (RX queue, CPU) matrix: segments and reorder events.
    pub paths: Vec<PathReport>,
    pub verdict: Verdict,
    pub evidence: String,
    pub tcp_layer: TcpLayer,
    pub local_retransmits: u64,
    pub rtt_us: Option<u64>,
    pub duration_s: f64,
    /// How far the flow's sequence numbers advanced while traced: the data
    /// it moved, each byte once; in summary mode, with the segments kept in
    /// the kernel (which `payload_bytes` does not see).
    pub seq_advance_bytes: u64,
    /// The flow's arrivals replayed through the sender policies (none for
    /// a flow without data).
    pub replay: Option<Replay>,
    /// What kind of sender it is, when the caller knows its address
    /// ([`Snapshot::name_senders`]: the lab's senders).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
}

impl FlowReport {
    pub fn flow(&self) -> String {
        format!("{} -> {}", self.src, self.dst)
    }

    /// Its mean goodput over its lifetime, Mbit/s: how far its sequence
    /// numbers advanced (what summary mode kept in the kernel included).
    pub fn goodput_mbit(&self) -> f64 {
        if self.duration_s > 0.0 {
            self.seq_advance_bytes as f64 * 8.0 / self.duration_s / 1e6
        } else {
            0.0
        }
    }
}

impl Snapshot {
    /// Names each flow's sender by its source address (`senders`: address,
    /// name).
    pub fn name_senders(mut self, senders: &[(std::net::IpAddr, String)]) -> Self {
        for f in &mut self.flows {
            let ip = f.src.parse::<std::net::SocketAddr>().ok().map(|a| a.ip());
            f.sender = senders
                .iter()
                .find(|(a, _)| Some(*a) == ip)
                .map(|(_, name)| name.clone());
        }
        self
    }
}

impl std::ops::Deref for FlowReport {
    type Target = Reordering;
    fn deref(&self) -> &Reordering {
        &self.reordering
    }
}

/// Segments by RX queue or CPU.
fn spread(paths: &[Path], id: impl Fn(&Path) -> u32) -> Vec<Spread> {
    let mut by: BTreeMap<u32, u64> = BTreeMap::new();
    for p in paths {
        *by.entry(id(p)).or_default() += p.segments;
    }
    by.into_iter()
        .map(|(id, segments)| Spread { id, segments })
        .collect()
}

/// Segments and reorder events on one (RX queue, CPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PathReport {
    pub queue: u32,
    pub cpu: u32,
    pub segments: u64,
    /// Reordered segments that arrived there.
    pub reordered: u64,
}

fn path_reports(paths: impl Iterator<Item = Path>) -> Vec<PathReport> {
    let mut v: Vec<PathReport> = paths
        .map(|p| PathReport {
            queue: p.queue,
            cpu: p.cpu,
            segments: p.segments,
            reordered: p.reordered,
        })
        .collect();
    v.sort_by_key(|p| (p.queue, p.cpu));
    v
}

/// `replay`: the flow's replay, if run (the costly part).
pub(crate) fn flow_report(
    flow: &Flow,
    f: &FlowState,
    cfg: &EngineConfig,
    replay: Option<Replay>,
) -> FlowReport {
    let m = f.wire_metrics().unwrap_or_default();
    let (verdict, evidence) = verdict::judge(&m, &cfg.verdict);
    FlowReport {
        src: flow.src.to_string(),
        dst: flow.dst.to_string(),
        segments: f.segments,
        reordering: Reordering::of(&m),
        rx_queues: spread(&f.paths, |p| p.queue),
        cpus: spread(&f.paths, |p| p.cpu),
        paths: path_reports(f.paths.iter().copied()),
        verdict,
        evidence,
        tcp_layer: f.tcp_layer,
        local_retransmits: f.local_retransmits,
        rtt_us: f.rtt_ns.map(|n| n / 1000),
        duration_s: f.last_ns.saturating_sub(f.first_ns) as f64 / 1e9,
        seq_advance_bytes: f.seq_advance(),
        replay,
        sender: None,
    }
}

/// `verdicts`: flows per verdict over all tracked flows (`flows` may be
/// only the most reordered).
pub(crate) fn build(
    totals: &FlowTotals,
    flows: Vec<FlowReport>,
    verdicts: BTreeMap<Verdict, u64>,
    tracked: u64,
    evicted: u64,
    retransmit_events: u64,
    cfg: &EngineConfig,
) -> Snapshot {
    let replay = Replay::total(
        totals
            .replay
            .iter()
            .chain(flows.iter().filter_map(|f| f.replay.as_ref())),
    );
    Snapshot {
        totals: Totals {
            segments: totals.segments,
            reordering: Reordering::of(&totals.m),
            tcp_layer: totals.tcp_layer,
            paths: path_reports(totals.paths.iter().map(
                |(&(queue, cpu), &(segments, reordered))| Path {
                    queue,
                    cpu,
                    segments,
                    reordered,
                },
            )),
            local_retransmit_events: retransmit_events,
            verdicts,
            dropped_events: 0,
            replay,
        },
        flows,
        tracked_flows: tracked,
        evicted_flows: evicted,
        config: *cfg,
        kernel: None,
        linux: None,
        peak_resident_bytes: None,
        memory: Memory::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Hist;

    #[test]
    fn distribution_buckets_count_every_value_once() {
        let mut h = Hist::default();
        // 1..=5000 and a run of 1024s: values on and across the powers of
        // two, where the histogram's sub-buckets straddle them.
        for v in (1..=5000).chain(std::iter::repeat_n(1024, 100)) {
            h.record(v);
        }
        let d = Distribution::of(&h);
        assert_eq!(d.count, 5100);
        assert_eq!(d.buckets.iter().map(|b| b.1).sum::<u64>(), 5100);
        assert!(d.buckets.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(d.buckets.iter().all(|b| b.0.is_power_of_two()));
        // Within the histogram's precision (one significant figure).
        let at_most_1024: u64 = d.buckets.iter().filter(|b| b.0 <= 1024).map(|b| b.1).sum();
        assert!((1124..=1124 + 64).contains(&at_most_1024), "{at_most_1024}");
        assert_eq!(d.buckets.last().unwrap().0, 8192);
    }
}
