//! The read-only view of the engine that every sink renders (report, JSON,
//! TUI, exporters), and its vocabulary (a segment's [`Class`], a flow's
//! [`Verdict`]): plain, serialisable values. The engine builds it
//! (`engine::view`); nothing here knows the engine.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    config::EngineConfig,
    kernel::{AttachedMode, Counters, KernelReport},
    nic::{
        fix::{self, Fix},
        NicEvidence,
    },
    replay::Replay,
    source::Flow,
};

#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub totals: Totals,
    pub flows: Vec<FlowReport>,
    /// Connections tracked now, and given up before (evicted for room,
    /// the budget or idleness): together, every connection seen.
    pub tracked_flows: u64,
    pub evicted_flows: u64,
    /// Connections that began on a 4-tuple an earlier connection of the
    /// trace had used (a new SYN, or data outside the old one's sequence
    /// space after its FIN or RST): the 4-tuples are the connections less
    /// these (as far as the engine still knew the earlier one).
    pub reused_tuples: u64,
    pub config: EngineConfig,
    /// The kernel's counters, when the snapshot comes from a live trace.
    pub kernel: Option<BTreeMap<&'static str, u64>>,
    /// The kernel traced on: its release and what it lacks.
    pub linux: Option<KernelReport>,
    /// The XDP attachment a live trace ran with: native sees the frames
    /// as the driver received them (wire segments on a NIC); generic the
    /// skbs the stack takes (after GRO, and a veth peer's TSO packets:
    /// several segments at once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xdp: Option<AttachedMode>,
    /// The collector's peak resident memory (a live trace).
    pub peak_resident_bytes: Option<u64>,
    /// What the engine's flows hold, its budget, and what it gave up.
    pub memory: Memory,
    /// What the NIC said at the start and end of a live trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nic: Option<NicEvidence>,
    /// With flows reordered by steering: what to change on the NIC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<Fix>,
    /// What the traced interface did during a live trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<InterfaceEvents>,
    /// The user asked for the report without waiting for the replay (a
    /// second SIGINT): no flow carries one, nor do the totals.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub replay_skipped: bool,
}

/// What the traced interface did while it was traced: went down (its
/// programs stayed attached) or went away and came back (attached again).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct InterfaceEvents {
    pub went_down: u64,
    pub attached_again: u64,
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
    /// Flows retired after the idle expiry (`--idle-expiry`; their counts
    /// stay in the totals; they are also among the evicted flows).
    pub expired_idle: u64,
}

impl Snapshot {
    /// Every connection the trace saw.
    pub fn connections(&self) -> u64 {
        self.tracked_flows + self.evicted_flows
    }

    /// The report without the replay, as asked: no flow keeps one, nor do
    /// the totals (a report with some flows replayed would mislead).
    pub fn skip_replay(&mut self) {
        for f in &mut self.flows {
            f.replay = None;
        }
        self.totals.replay = Replay::total([]);
        self.replay_skipped = true;
    }

    /// Adds what the kernel counted (dropped events above all).
    pub fn with_kernel(mut self, counters: &Counters) -> Self {
        self.totals.dropped_events = counters.dropped();
        self.kernel = Some(counters.named().collect());
        self
    }

    /// Adds what the traced interface did.
    pub fn with_interface(mut self, events: InterfaceEvents) -> Self {
        self.interface = Some(events);
        self
    }

    /// Adds the collector's peak resident memory.
    pub fn with_resident(mut self, peak_bytes: u64) -> Self {
        self.peak_resident_bytes = Some(peak_bytes);
        self
    }

    /// Adds what the NIC said at the start and end,
    /// and the fix it suggests for what the flows showed.
    pub fn with_nic(mut self, nic: Option<NicEvidence>) -> Self {
        let t = &self.totals;
        let seen = fix::Seen {
            nic_steering_flows: t.verdicts.get(&Verdict::NicSteering).copied().unwrap_or(0),
            off_rss: t.rss.map(|r| (r.off_queue, r.segments)),
            queue_migrations: t.reordering.queue_migrations,
            cpu_migrations: t.reordering.cpu_migrations,
        };
        self.fix = nic.as_ref().and_then(|n| fix::suggest(n, seen));
        self.nic = nic;
        self
    }

    /// Adds which kernel the trace was taken on.
    pub fn with_linux(mut self, linux: Option<KernelReport>) -> Self {
        self.linux = linux;
        self
    }

    pub fn with_xdp(mut self, xdp: Option<AttachedMode>) -> Self {
        self.xdp = xdp;
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

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    /// All XDP segments, data or not.
    pub segments: u64,
    /// Of them, segments of an ended connection that arrived after the
    /// next one on its 4-tuple began: counted here only, never as the new
    /// one's reordering, retransmissions or ambiguity.
    pub stale_segments: u64,
    /// How far every connection's sequence numbers advanced: the data
    /// they moved, each byte once (evicted connections' too).
    pub seq_advance_bytes: u64,
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
    /// RSS against the observed queues, over every flow (with the NIC's
    /// RSS key and table known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss: Option<RssTotals>,
}

/// One flow's segments against the queue RSS picks for it: those that
/// arrived on another queue were steered by something other than RSS
/// (Flow Director/ATR, aRFS, an ntuple rule).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RssCheck {
    /// The RX queue RSS picks for the flow.
    pub queue: u32,
    /// Segments seen (in summary mode, with those the kernel counted).
    pub segments: u64,
    /// Segments that arrived on another queue.
    pub off_queue: u64,
}

/// [`RssCheck`] summed over flows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RssTotals {
    pub flows: u64,
    /// Flows with a segment off their RSS queue.
    pub flows_off: u64,
    pub segments: u64,
    pub off_queue: u64,
}

impl RssTotals {
    pub fn add(&mut self, check: &RssCheck) {
        self.flows += 1;
        self.flows_off += u64::from(check.off_queue > 0);
        self.segments += check.segments;
        self.off_queue += check.off_queue;
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub id: u32,
    pub segments: u64,
}

/// One connection: its flow direction (one way of its 4-tuple) and the
/// serial number the trace gave it (1 for the first connection seen): a
/// 4-tuple carries many connections in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Connection {
    pub flow: Flow,
    pub serial: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FlowReport {
    /// The connection it reports, as the engine knows it.
    #[serde(skip)]
    pub key: Connection,
    pub src: String,
    pub dst: String,
    /// Its serial number ([`Connection::serial`]).
    pub connection: u64,
    /// Connections the trace saw on its 4-tuple before it (0: the first).
    pub earlier_on_tuple: u32,
    pub segments: u64,
    /// Segments of the connection before it on its 4-tuple that arrived
    /// after it began (among `segments`; in no other count).
    pub stale_segments: u64,
    /// Segments with a FIN (stale ones aside): as many as
    /// `tcp_layer.fins` unless one came after TCP had taken the first.
    pub fins: u64,
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
    /// The flow's arrivals replayed through the sender policies, once
    /// asked for (`Engine::replay`; none for a flow without data).
    pub replay: Option<Replay>,
    /// Its segments against the queue RSS picks (with the NIC's RSS key
    /// and table known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss: Option<RssCheck>,
    /// What kind of sender it is, when the caller knows its address
    /// ([`Snapshot::name_senders`]: the lab's senders).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
}

impl FlowReport {
    /// `src -> dst`, and `#N` for the Nth connection the trace saw on its
    /// 4-tuple (N > 1).
    pub fn flow(&self) -> String {
        match self.earlier_on_tuple {
            0 => format!("{} -> {}", self.src, self.dst),
            n => format!("{} -> {} #{}", self.src, self.dst, n + 1),
        }
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

/// Segments and reorder events on one (RX queue, CPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PathReport {
    pub queue: u32,
    pub cpu: u32,
    pub segments: u64,
    /// Reordered segments that arrived there.
    pub reordered: u64,
}

/// A flow's verdict: what its reordering points at (`engine::verdict`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Verdict {
    #[serde(rename = "none")]
    None,
    #[serde(rename = "nic-steering")]
    NicSteering,
    #[serde(rename = "upstream")]
    Upstream,
    #[serde(rename = "mixed")]
    Mixed,
}

impl Verdict {
    pub const ALL: [Verdict; 4] = [Self::NicSteering, Self::Upstream, Self::Mixed, Self::None];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::NicSteering => "nic-steering",
            Self::Upstream => "upstream",
            Self::Mixed => "mixed",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The class of one data segment. Each segment gets exactly one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    InOrder,
    /// A late original (RFC 4737 reordered, and not a retransmission).
    Reordered,
    Retransmission,
    /// Every byte was received before (a spurious retransmission or a
    /// network duplicate).
    Duplicate,
    /// Late, but the evidence does not say original or retransmission; or
    /// data from before tracing started.
    Ambiguous,
}

/// The TCP-layer view's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TcpLayer {
    pub events: u64,
    pub payload_bytes: u64,
    pub in_order: u64,
    pub late: u64,
    pub duplicates: u64,
    /// Wire segments TCP put in its out-of-order queue, counted by the
    /// kernel's own rule for `rcv_ooopack`: data starting after the
    /// socket's `rcv_nxt`, `max(1, gso_segs)` per skb.
    pub ofo_segments: u64,
    /// Data skbs TCP then discarded by PAWS (RFC 7323 §5: a TSval older
    /// than the socket's `ts_recent`), as `PAWSEstab` counts them. Such a
    /// segment is lost to the receiver: reordering a segment by more than
    /// a timestamp tick costs a retransmission.
    pub paws_discarded: u64,
    /// Data of the connection before it on its 4-tuple, processed after
    /// it began (in no other count).
    pub stale: u64,
    /// Skbs with a FIN tcp_probe saw. tcp_probe runs only while the
    /// socket is established: a FIN (or data) that arrives after TCP took
    /// the connection's FIN is handled unseen, and PAWS discards counted
    /// then are not in `paws_discarded`.
    pub fins: u64,
}

impl TcpLayer {
    /// Whether this view covers (99.9% of) the `wire_bytes` XDP saw: this
    /// kernel sometimes runs no tcp_probe program for a while without
    /// counting a miss.
    pub fn covers(&self, wire_bytes: u64) -> bool {
        self.payload_bytes * 1000 >= wire_bytes * 999
    }

    pub(crate) fn add(&mut self, o: &TcpLayer) {
        self.events += o.events;
        self.payload_bytes += o.payload_bytes;
        self.in_order += o.in_order;
        self.late += o.late;
        self.duplicates += o.duplicates;
        self.ofo_segments += o.ofo_segments;
        self.paws_discarded += o.paws_discarded;
        self.stale += o.stale;
        self.fins += o.fins;
    }
}

/// Counters cheap enough to read every second.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    pub segments: u64,
    pub payload_bytes: u64,
    pub probes: u64,
    pub reordered: u64,
    pub flows: u64,
    pub memory: Memory,
}
