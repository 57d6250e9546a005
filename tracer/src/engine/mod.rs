//! The reordering engine: observations in, per-flow and total metrics out.
//!
//! Pure: no I/O, no clock, no kernel; the same observation stream always
//! gives the same [`Snapshot`]. State is kept per connection and direction
//! (a [`Flow`] is src -> dst; a 4-tuple carries connections in turn: a new
//! SYN, or data outside the old one's sequence space after its FIN or
//! RST, begins the next, and the old one's late segments are counted
//! stale), bounded by an LRU of `max_flows` entries; an evicted
//! connection's counts stay in the totals. What all connections hold
//! together is bounded by a memory budget ([`memory`]).
//!
//! Per flow direction, two views:
//! * wire: the XDP segments, in the order and on the RX queue and CPU they
//!   arrived. Everything below is computed here: RFC 4737 classes and
//!   metrics ([`order`]), RFC 5236 densities ([`density`]), queue/CPU
//!   attribution of each reordered segment, migrations and the verdict.
//! * TCP layer: the `tcp_probe` events, in the order TCP processed them
//!   (after GRO, on the CPU that ran TCP): in order, late or duplicate.

pub mod density;
pub mod flows;
pub mod memory;
pub mod order;
pub mod verdict;
mod view;

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

pub use crate::config::{EngineConfig, VerdictRules};
use crate::{
    nic::rss::Rss,
    snapshot::{Class, Connection, FlowReport, Live, Memory, RssTotals, Snapshot, TcpLayer},
    source::{Flow, Observation, Retransmit, Segment, TcpProbe},
};
use density::{BufferDensity, ReorderDensity};
use flows::FlowTable;

use crate::replay::{
    self, share::Link, FlowLog, LateOriginal, Refill, Replay, ReplayConfig, SenderAck, TcpArrival,
};
use order::{Arrival, Late, OrderDetector, Outcome, Unwrap, MAX_N};
use tracer_common::tcp_flags::{ACK, FIN, RST, SYN};

/// How a reordered segment relates to the segment that overtook it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Attribution {
    SameQueueSameCpu,
    /// Another RX queue, the same CPU.
    DifferentQueue,
    /// The same RX queue, another CPU.
    DifferentCpu,
    /// Another RX queue and another CPU.
    DifferentQueueAndCpu,
}

impl Attribution {
    fn of(late: (u32, u32), overtaker: (u32, u32)) -> Self {
        match (late.0 == overtaker.0, late.1 == overtaker.1) {
            (true, true) => Self::SameQueueSameCpu,
            (false, true) => Self::DifferentQueue,
            (true, false) => Self::DifferentCpu,
            (false, false) => Self::DifferentQueueAndCpu,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One wire segment's result, for callers that want it per segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classified {
    pub class: Class,
    pub late: Option<Late>,
    pub attribution: Option<Attribution>,
    /// This in-order segment moved the flow to another RX queue (the
    /// report's queue migrations).
    pub queue_migration: bool,
}

/// A lazily created distribution (flows without reordering allocate none):
/// exact count, sum, min and max, and for the percentiles an hdrhistogram
/// with one significant figure (within 10%; about 1 KB for values up to
/// 10^6, where two figures would take 14 KB per distribution).
#[derive(Clone, Debug, Default)]
pub struct Hist(Option<Box<HistData>>);

#[derive(Clone, Debug)]
pub struct HistData {
    pub histogram: Histogram<u32>,
    pub count: u64,
    pub sum: u128,
    pub min: u64,
    pub max: u64,
}

impl HistData {
    fn new() -> Box<Self> {
        Box::new(Self {
            histogram: Histogram::new(1).expect("1 significant figure"),
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        })
    }
}

impl Hist {
    pub fn record(&mut self, v: u64) {
        let d = self.0.get_or_insert_with(HistData::new);
        d.count += 1;
        d.sum += u128::from(v);
        d.min = d.min.min(v);
        d.max = d.max.max(v);
        // Grows to fit (`saturating_record` would clamp to the initial
        // range instead); it can only fail past 2^63.
        if d.histogram.record(v).is_err() {
            d.histogram.saturating_record(v);
        }
    }

    pub fn add(&mut self, other: &Hist) {
        if let Some(o) = &other.0 {
            let d = self.0.get_or_insert_with(HistData::new);
            d.count += o.count;
            d.sum += o.sum;
            d.min = d.min.min(o.min);
            d.max = d.max.max(o.max);
            // Auto-resizing histograms accept any other's range.
            let _ = d.histogram.add(&o.histogram);
        }
    }

    pub fn get(&self) -> Option<&HistData> {
        self.0.as_deref()
    }
}

/// Counts and distributions of one flow direction's wire view (or of all).
/// The counters every segment updates are inline; what only late segments
/// touch is allocated on the first one.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub data_segments: u64,
    pub payload_bytes: u64,
    pub in_order: u64,
    pub reordered: u64,
    pub retransmissions: u64,
    pub duplicates: u64,
    pub partial_duplicates: u64,
    pub ambiguous: u64,
    pub holes_opened: u64,
    /// Segments whose first new byte arrived above a hole.
    pub above_hole: u64,
    /// Duplicates that were late originals: their retransmission had
    /// filled the hole first (a spurious retransmission that won).
    pub originals_behind_retransmission: u64,
    pub queue_migrations: u64,
    pub cpu_migrations: u64,
    pub late: Lazy<LateStats>,
    /// RFC 5236 frequencies (summed over flows for the totals).
    pub rd: Vec<u64>,
    pub rd_beyond: u64,
    pub rbd: Vec<u64>,
}

/// What reordered segments add to [`Metrics`].
#[derive(Clone, Debug, Default)]
pub struct LateStats {
    /// Segments n-reordered for n = 1..=8 (index n-1).
    pub n_reordered: [u64; MAX_N],
    pub attribution: [u64; 4],
    /// Reordered segments within the migration window after a migration.
    pub reordered_after_migration: u64,
    /// RFC 4737 §4.6 reordering-free runs: the sum of the squared lengths
    /// of the runs closed by reordered segments (q; x is `reordered`, a is
    /// `in_order`).
    pub run_squares: u64,
    pub extent: Hist,
    pub late_time_us: Hist,
    pub byte_offset: Hist,
    pub gap: Hist,
    pub gap_time_us: Hist,
    /// Late time of reordered segments that arrived on the flow's previous
    /// RX queue after it moved: how long segments sat on the old queue.
    pub old_queue_late_us: Hist,
    pub queue_pairs: BTreeMap<(u32, u32), u64>,
    pub cpu_pairs: BTreeMap<(u32, u32), u64>,
}

/// What a flow without late segments reads.
static NO_LATE: LateStats = LateStats {
    n_reordered: [0; MAX_N],
    attribution: [0; 4],
    reordered_after_migration: 0,
    run_squares: 0,
    extent: Hist(None),
    late_time_us: Hist(None),
    byte_offset: Hist(None),
    gap: Hist(None),
    gap_time_us: Hist(None),
    old_queue_late_us: Hist(None),
    queue_pairs: BTreeMap::new(),
    cpu_pairs: BTreeMap::new(),
};

impl LateStats {
    fn add(&mut self, o: &LateStats) {
        for (a, b) in self.n_reordered.iter_mut().zip(o.n_reordered) {
            *a += b;
        }
        for (a, b) in self.attribution.iter_mut().zip(o.attribution) {
            *a += b;
        }
        self.reordered_after_migration += o.reordered_after_migration;
        self.run_squares += o.run_squares;
        for (h, oh) in [
            (&mut self.extent, &o.extent),
            (&mut self.late_time_us, &o.late_time_us),
            (&mut self.byte_offset, &o.byte_offset),
            (&mut self.gap, &o.gap),
            (&mut self.gap_time_us, &o.gap_time_us),
            (&mut self.old_queue_late_us, &o.old_queue_late_us),
        ] {
            h.add(oh);
        }
        for (k, v) in &o.queue_pairs {
            *self.queue_pairs.entry(*k).or_default() += v;
        }
        for (k, v) in &o.cpu_pairs {
            *self.cpu_pairs.entry(*k).or_default() += v;
        }
    }
}

/// [`LateStats`] allocated on first write; reads as empty until then.
#[derive(Clone, Debug, Default)]
pub struct Lazy<T>(Option<Box<T>>);

impl std::ops::Deref for Lazy<LateStats> {
    type Target = LateStats;
    fn deref(&self) -> &LateStats {
        self.0.as_deref().unwrap_or(&NO_LATE)
    }
}

impl std::ops::DerefMut for Lazy<LateStats> {
    fn deref_mut(&mut self) -> &mut LateStats {
        self.0.get_or_insert_with(Box::default)
    }
}

impl Metrics {
    fn add(&mut self, o: &Metrics) {
        self.data_segments += o.data_segments;
        self.payload_bytes += o.payload_bytes;
        self.in_order += o.in_order;
        self.reordered += o.reordered;
        self.retransmissions += o.retransmissions;
        self.duplicates += o.duplicates;
        self.partial_duplicates += o.partial_duplicates;
        self.ambiguous += o.ambiguous;
        self.holes_opened += o.holes_opened;
        self.above_hole += o.above_hole;
        self.originals_behind_retransmission += o.originals_behind_retransmission;
        self.queue_migrations += o.queue_migrations;
        self.cpu_migrations += o.cpu_migrations;
        if o.late.0.is_some() {
            self.late.add(&o.late);
        }
        add_vec(&mut self.rd, &o.rd);
        add_vec(&mut self.rbd, &o.rbd);
        self.rd_beyond += o.rd_beyond;
    }
}

fn add_vec(into: &mut Vec<u64>, from: &[u64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from) {
        *a += b;
    }
}

/// The wire (XDP) view of one flow direction. In declaration order
/// (`repr(C)`): what every in-order segment reads or writes first, then
/// what only late segments, migrations and reports touch, so that a
/// segment touches as few cache lines as it can.
#[derive(Clone, Debug)]
#[repr(C)]
struct WireView {
    unwrap: Unwrap,
    queue: u32,
    cpu: u32,
    /// Current reordering-free run (RFC 4737 §4.6 r).
    run: u64,
    order: OrderDetector,
    rd: ReorderDensity,
    rbd: BufferDensity,
    /// What a sender's loss detection would have reacted to.
    log: FlowLog,
    m: Metrics,
    /// The first byte seen (unwrapped).
    start: u64,
    /// The flow's queue before its last queue migration.
    previous_queue: Option<u32>,
    last_migration_ns: Option<u64>,
    /// Where the flow's data ended, as its FIN said: past the last data
    /// segment emitted when summary mode kept the last ones in the kernel.
    counted_end: u64,
    /// The heap bytes of `m.late`, weighed when a late segment updates it.
    late_held: u64,
}

impl WireView {
    fn new(first_seq: u32, cfg: &EngineConfig, first: &Segment) -> Self {
        let unwrap = Unwrap::new(first_seq);
        let start = unwrap.ext(first_seq);
        let mut order = OrderDetector::default();
        order.start(start);
        Self {
            unwrap,
            start,
            order,
            rd: ReorderDensity::new(cfg.dt, start),
            rbd: BufferDensity::new(cfg.bt, start),
            m: Metrics::default(),
            run: 0,
            queue: first.rx_queue,
            cpu: first.cpu,
            previous_queue: None,
            last_migration_ns: None,
            log: FlowLog::default(),
            counted_end: start,
            late_held: 0,
        }
    }

    /// Summary mode: the flow's `n` data segments the kernel counted in
    /// order, on its path, before the segment at hand; up to `end`, where
    /// the kernel said (traces before it did: only counted).
    fn counted(&mut self, n: u32, end: Option<u32>, paths: &mut Paths) {
        let n = u64::from(n);
        self.log.summarized();
        if let Some(end) = end {
            self.order.counted_in_order(self.unwrap.ext(end), n);
            self.unwrap.advance(self.order.next_exp());
        }
        self.m.data_segments += n;
        self.m.in_order += n;
        self.run += n;
        path(paths, self.queue, self.cpu).segments += n;
    }
}

/// Everything kept about one flow direction: in declaration order
/// (`repr(C)`), what every segment touches first ([`WireView`] likewise).
#[derive(Clone, Debug, Default)]
#[repr(C)]
pub struct FlowState {
    /// All XDP segments (data or not) and their spread over (RX queue,
    /// CPU).
    pub segments: u64,
    pub last_ns: u64,
    pub paths: Paths,
    /// The ISN, when the SYN was seen in this direction.
    isn: Option<u32>,
    /// Arrival of the client's SYN (without ACK), when seen here: the
    /// handshake's round trip runs from it, and the timestamps the data
    /// echoes are read against it ([`replay::queueing`]).
    syn_ns: Option<u64>,
    /// The SYN's next segment has not come yet.
    in_handshake: bool,
    /// Round-trip time seen in the handshake (SYN to the next segment of
    /// this direction, at this observer), or from the socket.
    pub rtt_ns: Option<u64>,
    wire: Option<WireView>,
    /// TCP-layer order (tcp_probe): classes only.
    tcp: Option<Box<(Unwrap, OrderDetector)>>,
    /// The heap bytes of `tcp`, weighed as a probe updates it.
    tcp_held: u64,
    pub tcp_layer: TcpLayer,
    pub local_retransmits: u64,
    /// The sender's own smoothed and minimum RTT, when its socket is known
    /// (the lab's senders): what the replay's senders use.
    pub sender_rtt_ns: Option<(u64, u64)>,
    pub first_ns: u64,
    /// Its heap bytes when last weighed ([`memory`]), and of them its
    /// logs'.
    held: u64,
    logs_weighed: u64,
    /// The connection's serial number ([`Connection::serial`]).
    serial: u64,
    /// Connections seen on its 4-tuple before it.
    earlier_on_tuple: u32,
    /// One past the last sequence number it used, once a FIN or RST said
    /// where it ended: data outside its sequence space after that is the
    /// next connection's.
    closed_end: Option<u32>,
    /// The connection before it on its 4-tuple: its segments that come
    /// after this one began are stale.
    previous: Option<Previous>,
    pub stale_segments: u64,
    /// Segments with a FIN it received (stale ones aside).
    pub fins: u64,
}

/// What tells the connection before this one on its 4-tuple from this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Previous {
    /// The sequence numbers it used.
    span: SeqSpan,
    /// This one's SYN's TSval: a segment with an older one was sent before
    /// this connection began (Linux and most hosts keep one timestamp
    /// clock for a pair of addresses).
    since_tsval: Option<u32>,
}

/// Sequence numbers `lo..=hi` (32 bits, wrapping).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SeqSpan {
    lo: u32,
    hi: u32,
}

impl SeqSpan {
    /// Whether `seq` is within the span or at most `ahead` past it.
    fn holds(&self, seq: u32, ahead: u32) -> bool {
        seq.wrapping_sub(self.lo) <= self.hi.wrapping_sub(self.lo).saturating_add(ahead)
    }
}

/// How far past its highest sequence number a connection's next data may
/// come (a receive window larger than any host grants by default): data
/// within that of the current connection is never taken for the previous
/// one's.
const WINDOW_AHEAD: u32 = 64 << 20;

/// The table's key: a flow direction's current connection (`ended` 0), or
/// one that ended when the next began on its 4-tuple, by its serial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct TableKey {
    flow: Flow,
    ended: u64,
}

impl TableKey {
    fn current(flow: Flow) -> Self {
        Self { flow, ended: 0 }
    }
}

impl FlowState {
    /// How far the flow's sequence numbers advanced while traced, in bytes:
    /// the data it moved, each byte once (not its retransmissions), and the
    /// segments summary mode kept in the kernel too.
    pub fn seq_advance(&self) -> u64 {
        self.wire.as_ref().map_or(0, |w| {
            w.order
                .next_exp()
                .max(w.counted_end)
                .saturating_sub(w.start)
        })
    }

    /// The sequence numbers the connection used: from its SYN (else its
    /// first data) to the highest it reached (its FIN's, or the next it
    /// expects); none before it had either.
    fn seq_span(&self) -> Option<SeqSpan> {
        let w = self.wire.as_ref();
        let lo = self.isn.or(w.map(|w| w.start as u32))?;
        let mut hi = w.map_or(lo.wrapping_add(1), |w| {
            w.order.next_exp().max(w.counted_end) as u32
        });
        if let Some(end) = self.closed_end {
            if (end.wrapping_sub(hi) as i32) > 0 {
                hi = end;
            }
        }
        Some(SeqSpan { lo, hi })
    }

    /// Whether `s` begins the next connection on this one's 4-tuple: a SYN
    /// other than this connection's own, or data outside what it used
    /// once its FIN or RST said where it ended.
    fn ended_by(&self, s: &Segment) -> bool {
        if s.flags & SYN != 0 {
            return self.isn != Some(s.seq);
        }
        match (self.closed_end, self.seq_span()) {
            (Some(_), Some(span)) if s.payload_len > 0 && s.flags & RST == 0 => {
                let end = span.hi.wrapping_sub(span.lo);
                s.seq.wrapping_sub(span.lo) >= end
            }
            _ => false,
        }
    }

    /// Whether a segment at `seq` (with data or not, its TSval) is the
    /// previous connection's on this 4-tuple, not this one's: within the
    /// previous one's sequence numbers (a new connection's may overlap
    /// them: Linux's ISN clock gains 15.6 M a second), and either sent
    /// before this connection's SYN by its TSval, or beyond what this one
    /// used (data: by more than a window; a FIN, an RST or an ACK carries
    /// the sender's next sequence number, which is within it). (A TSval
    /// only ever says older: a host that starts each connection's
    /// timestamps anew may make an old one look newer.) Before this one
    /// had a SYN or data, it is this one's.
    fn stale(&self, seq: u32, data: bool, tsval: Option<u32>) -> bool {
        let Some(p) = self.previous.filter(|p| p.span.holds(seq, 0)) else {
            return false;
        };
        let sent_before = matches!((p.since_tsval, tsval),
            (Some(since), Some(ts)) if (ts.wrapping_sub(since) as i32) < 0);
        let ahead = if data { WINDOW_AHEAD } else { 0 };
        sent_before || self.seq_span().is_some_and(|s| !s.holds(seq, ahead))
    }

    /// Notes a FIN or RST: where the connection ended.
    fn close(&mut self, s: &Segment) {
        let end = if s.flags & FIN != 0 {
            s.seq.wrapping_add(s.payload_len).wrapping_add(1)
        } else {
            s.seq
        };
        if self
            .closed_end
            .is_none_or(|e| (end.wrapping_sub(e) as i32) > 0)
        {
            self.closed_end = Some(end);
        }
    }

    /// The wire view's metrics, with the RFC 5236 frequencies filled in.
    pub fn wire_metrics(&self) -> Option<Metrics> {
        self.wire.as_ref().map(WireView::metrics_with_densities)
    }

    /// The flow's arrivals replayed through the sender policies, on its
    /// part of the traced `link`.
    pub fn replay(&self, cfg: &ReplayConfig, link: &Link) -> Option<Replay> {
        let path = match self.sender_rtt_ns {
            Some((srtt, min_rtt)) => replay::TraceRtt::Sender { srtt, min_rtt },
            None => replay::TraceRtt::Observed(self.rtt_ns),
        };
        self.wire
            .as_ref()
            .filter(|w| w.log.data_segments > 0)
            .map(|w| {
                // A handshake met whatever the path held then (a sender
                // slow to answer, a queue): the data may have told a
                // shorter round trip.
                let sharing = link.sharing(&w.log.share);
                let least = w
                    .log
                    .queueing
                    .least_round_trip_ns(self.syn_ns, sharing.queueing_ns);
                let path = match (path, least) {
                    (replay::TraceRtt::Observed(Some(h)), Some(l)) => {
                        replay::TraceRtt::Observed(Some(h.min(l as u64).max(1)))
                    }
                    _ => path,
                };
                replay::replay(
                    &w.log,
                    path,
                    cfg,
                    self.tcp_layer.covers(w.m.payload_bytes),
                    Some(sharing),
                )
            })
    }
}

/// Segments that arrived on one RX queue and CPU, and how many of them
/// were reordered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Path {
    pub queue: u32,
    pub cpu: u32,
    pub segments: u64,
    pub reordered: u64,
}

/// A flow's paths in first-seen order; a flow seldom uses more than two.
pub type Paths = smallvec::SmallVec<[Path; 2]>;

fn path(paths: &mut Paths, queue: u32, cpu: u32) -> &mut Path {
    match paths.iter().position(|p| p.queue == queue && p.cpu == cpu) {
        Some(i) => &mut paths[i],
        None => {
            paths.push(Path {
                queue,
                cpu,
                ..Path::default()
            });
            paths.last_mut().expect("pushed")
        }
    }
}

pub struct Engine {
    cfg: EngineConfig,
    flows: FlowTable<TableKey, FlowState>,
    retired: Retired,
    /// The table's bytes when the engine last weighed its memory.
    table_weighed: u64,
    live: Live,
    retransmit_events: u64,
    memory: Memory,
    /// The traced link's bins, which the flows' replays share.
    link: Link,
    /// The NIC's RSS key and table, when known: each flow's segments are
    /// checked against the queue RSS picks.
    rss: Option<Rss>,
    /// When idle flows are next looked for (`cfg.idle_expiry_ns`).
    next_expiry_ns: u64,
}

/// The books on connections: what evicted ones contributed (so totals
/// stay whole, their replays too: each is replayed as it leaves), how many
/// began (their serial numbers) and how many of them on a 4-tuple an
/// earlier one had used, how many were evicted, and the heap bytes the
/// tracked ones hold ([`FlowState::held`], summed).
#[derive(Default)]
struct Retired {
    totals: Box<FlowTotals>,
    begun: u64,
    reused_tuples: u64,
    evictions: u64,
    flows_held: u64,
}

impl Retired {
    fn retire(&mut self, flow: &Flow, old: &FlowState, ctx: &FlowContext) {
        self.evictions += 1;
        self.flows_held -= old.held;
        self.totals.add_flow(flow, old, ctx.rss);
        let replayed = ctx.replay_retired.then(|| old.replay(ctx.replay, ctx.link));
        if let Some(r) = replayed.flatten() {
            let t = &mut self.totals.replay;
            *t = Some(Replay::total(t.iter().chain([&r])));
        }
    }
}

/// Sums over flows.
#[derive(Clone, Debug, Default)]
pub struct FlowTotals {
    pub m: Metrics,
    pub tcp_layer: TcpLayer,
    pub segments: u64,
    /// (RX queue, CPU) -> (segments, reordered).
    pub paths: BTreeMap<(u32, u32), (u64, u64)>,
    pub local_retransmits: u64,
    pub stale_segments: u64,
    /// [`FlowState::seq_advance`], summed.
    pub seq_advance_bytes: u64,
    /// Evicted flows' replays, summed (tracked ones are replayed at
    /// snapshot time).
    pub replay: Option<Replay>,
    /// Flows checked against RSS (with its table known).
    pub rss: Option<RssTotals>,
}

impl FlowTotals {
    fn add_flow(&mut self, flow: &Flow, f: &FlowState, rss: Option<&Rss>) {
        if let Some(rss) = rss {
            self.rss
                .get_or_insert_default()
                .add(&view::rss_check(flow, f, rss));
        }
        if let Some(w) = &f.wire {
            w.add_to(&mut self.m);
        }
        self.tcp_layer.add(&f.tcp_layer);
        self.segments += f.segments;
        for p in &f.paths {
            let t = self.paths.entry((p.queue, p.cpu)).or_default();
            t.0 += p.segments;
            t.1 += p.reordered;
        }
        self.local_retransmits += f.local_retransmits;
        self.stale_segments += f.stale_segments;
        self.seq_advance_bytes += f.seq_advance();
    }
}

impl WireView {
    /// The metrics with the density frequencies filled in.
    fn metrics_with_densities(&self) -> Metrics {
        let mut m = self.m.clone();
        m.rd = self.rd.frequencies();
        m.rd_beyond = self.rd.beyond;
        m.rbd = self.rbd.frequencies();
        m
    }

    /// Adds the metrics, with the density frequencies, to `into`, without
    /// first copying a reordered flow's histograms (the snapshot sums
    /// every flow this way each second for the metrics).
    fn add_to(&self, into: &mut Metrics) {
        into.add(&self.m);
        self.rd.add_frequencies(&mut into.rd);
        into.rd_beyond += self.rd.beyond;
        self.rbd.add_frequencies(&mut into.rbd);
    }
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        Self {
            flows: FlowTable::new(cfg.max_flows),
            retired: Retired::default(),
            table_weighed: 0,
            live: Live::default(),
            retransmit_events: 0,
            memory: Memory {
                budget_bytes: cfg.memory_budget,
                ..Memory::default()
            },
            link: Link::default(),
            rss: None,
            next_expiry_ns: 0,
            cfg,
        }
    }

    /// Checks every flow's segments against the queue this RSS key and
    /// table pick for it.
    pub fn set_rss(&mut self, rss: Rss) {
        self.rss = Some(rss);
    }

    pub fn rss(&self) -> Option<&Rss> {
        self.rss.as_ref()
    }

    /// Whether the receiver sends DSACKs, as read from its host (unless
    /// the user said).
    pub fn set_receiver_dsack(&mut self, dsack: bool) {
        let told = &mut self.cfg.replay.receiver_dsack;
        if told.is_none() {
            *told = Some((dsack, crate::replay::Source::Trace));
        }
    }

    /// Whether the receiver sends DSACKs, where read from its host (not
    /// where the user said).
    pub fn receiver_dsack(&self) -> Option<bool> {
        match self.cfg.replay.receiver_dsack {
            Some((dsack, crate::replay::Source::Trace)) => Some(dsack),
            _ => None,
        }
    }

    /// Flows given up from here on are not replayed as they go
    /// ([`EngineConfig::replay_retired`]).
    pub fn skip_replay_of_retired(&mut self) {
        self.cfg.replay_retired = false;
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn live(&self) -> Live {
        Live {
            flows: self.flows.len() as u64,
            memory: self.memory(),
            ..self.live
        }
    }

    /// `flow`'s current connection.
    fn flow(&mut self, flow: Flow, ts_ns: u64) -> &mut FlowState {
        let ctx = FlowContext {
            replay: &self.cfg.replay,
            replay_retired: self.cfg.replay_retired,
            link: &self.link,
            rss: self.rss.as_ref(),
        };
        tracked(&mut self.flows, &mut self.retired, &ctx, flow, ts_ns)
    }

    /// The state of connection `c`, while tracked.
    fn connection(&self, c: &Connection) -> Option<&FlowState> {
        self.flows
            .peek(&TableKey::current(c.flow))
            .filter(|f| f.serial == c.serial)
            .or_else(|| {
                self.flows.peek(&TableKey {
                    flow: c.flow,
                    ended: c.serial,
                })
            })
    }

    /// Processes one observation; wire segments with data get their class.
    pub fn observe(&mut self, obs: &Observation) -> Option<Classified> {
        if self.cfg.idle_expiry_ns.is_some() && obs.ts_ns() >= self.next_expiry_ns {
            self.expire_idle(obs.ts_ns());
        }
        match obs {
            Observation::Segment(s) => self.segment(s),
            Observation::TcpProbe(p) => {
                let reshaped = self.probe(p);
                self.settle(reshaped);
                None
            }
            Observation::Retransmit(r) => {
                self.retransmit(r);
                self.settle(true);
                None
            }
        }
    }

    pub fn segment(&mut self, s: &Segment) -> Option<Classified> {
        let c = self.wire_segment(s);
        // In-order data only adds to the logs (weighed as they grow) and
        // closes holes.
        self.settle(c.is_none_or(|c| c.class != Class::InOrder));
        c
    }

    fn wire_segment(&mut self, s: &Segment) -> Option<Classified> {
        self.live.segments += 1;
        self.live.payload_bytes += u64::from(s.payload_len);
        // Borrowed field by field: a copy of the configuration per segment
        // cost the path a 160-byte memcpy.
        let Self {
            cfg,
            flows,
            retired,
            link,
            rss,
            live,
            ..
        } = self;
        let ctx = FlowContext {
            replay: &cfg.replay,
            replay_retired: cfg.replay_retired,
            link,
            rss: rss.as_ref(),
        };
        let mut f = tracked(flows, retired, &ctx, s.flow, s.ts_ns);
        if f.segments > 0 && (s.flags & SYN != 0 || f.closed_end.is_some()) && f.ended_by(s) {
            f = next_connection(flows, retired, &ctx, s);
        }
        f.segments += 1;
        path(&mut f.paths, s.rx_queue, s.cpu).segments += 1;
        if f.previous.is_some() && f.stale(s.seq, s.payload_len > 0, s.timestamp.map(|t| t.0)) {
            f.stale_segments += 1;
            return None;
        }
        if s.flags & FIN != 0 {
            f.fins += 1;
        }
        if s.flags & (FIN | RST) != 0 {
            f.close(s);
        }
        if s.flags & SYN != 0 {
            f.isn = Some(s.seq);
            // Only a client's SYN: its handshake ACK follows one RTT later.
            f.syn_ns = (s.flags & ACK == 0).then_some(s.ts_ns);
            f.in_handshake = f.syn_ns.is_some();
        } else if let Some(syn_ns) = f.syn_ns.filter(|_| f.in_handshake) {
            f.rtt_ns.get_or_insert(s.ts_ns.saturating_sub(syn_ns));
            f.in_handshake = false;
        }
        if s.payload_len == 0 || s.flags & RST != 0 {
            // Summary mode: the flow's last data segments may have stayed in
            // the kernel, their count carried by this segment or, when two
            // CPUs raced on the flow's state, by none; wherever the count
            // went, they ended where the FIN's sequence number begins.
            if let Some(w) = f.wire.as_mut() {
                if s.summarized_before > 0 {
                    w.counted(s.summarized_before, s.summarized_end, &mut f.paths);
                }
                if s.flags & FIN != 0 {
                    w.counted_end = w.counted_end.max(w.unwrap.ext(s.seq));
                }
            }
            return None;
        }
        // Data after a SYN seen here starts at ISN + 1; otherwise tracing
        // began mid-flow at this segment.
        let rtt = f.rtt_ns;
        let isn = f.isn;
        let w = f.wire.get_or_insert_with(|| {
            let first = match isn {
                Some(isn) => isn.wrapping_add(1),
                None if s.flags & SYN != 0 => s.seq.wrapping_add(1),
                None => s.seq,
            };
            WireView::new(first, cfg, s)
        });
        let seq = if s.flags & SYN != 0 {
            s.seq.wrapping_add(1)
        } else {
            s.seq
        };
        // Summary mode: the flow's segments the kernel counted before this
        // one were in order, on the flow's path.
        if s.summarized_before > 0 {
            w.counted(s.summarized_before, s.summarized_end, &mut f.paths);
        }
        let start = w.unwrap.ext(seq);
        let a = Arrival {
            start,
            end: start + u64::from(s.payload_len),
            ts_ns: s.ts_ns,
            rx_queue: s.rx_queue,
            cpu: s.cpu,
            tsval: s.timestamp.map(|(v, _)| v),
            tsecr: s.timestamp.map(|(_, e)| e),
            ip_id: s.ip_id,
        };
        let out = w.order.observe(&a, rtt);
        w.unwrap.advance(w.order.next_exp());
        let queued = w.log.queueing.echo(s.ts_ns, a.tsecr);
        w.log.share.arrival(link, s.ts_ns, s.payload_len, queued);
        let c = wire_update(w, s, &a, &out, cfg);
        if c.class == Class::Reordered {
            path(&mut f.paths, s.rx_queue, s.cpu).reordered += 1;
            live.reordered += 1;
        }
        Some(c)
    }

    /// Whether the TCP-layer detector's size changed.
    fn probe(&mut self, p: &TcpProbe) -> bool {
        self.live.probes += 1;
        let f = self.flow(p.flow, p.ts_ns);
        if f.rtt_ns.is_none() && p.srtt_us > 0 {
            f.rtt_ns = Some(u64::from(p.srtt_us) * 1000);
        }
        let paws = p.paws_rejects();
        let stale = f.previous.is_some() && f.stale(p.seq, p.payload_len > 0, p.tsval);
        if p.flags & FIN != 0 && !stale {
            f.tcp_layer.fins += 1;
        }
        if p.payload_len == 0 {
            // Without data, PAWS discards (and PAWSEstab counts) a FIN, and a
            // pure ACK unless the kernel lets it through as a "disordered
            // ACK" (`tcp_disordered_ack`: in sequence, a duplicate ACK, and
            // no window update, which the probe cannot see: such ACKs are
            // taken as let through). An RST it never counts.
            let duplicate_in_sequence = p.seq == p.rcv_nxt && p.ack == p.snd_una;
            let discarded = p.flags & FIN != 0 || !duplicate_in_sequence;
            if paws && discarded && p.flags & (RST | SYN) == 0 {
                f.tcp_layer.paws_discarded += 1;
            }
            // A FIN takes a sequence number: one that overtook the last
            // data goes into the out-of-order queue and rcv_ooopack.
            let ahead = (p.seq.wrapping_sub(p.rcv_nxt) as i32) > 0;
            if !paws && ahead && p.flags & FIN != 0 && p.flags & (RST | SYN) == 0 {
                f.tcp_layer.ofo_segments += 1;
            }
            return false;
        }
        if stale {
            f.tcp_layer.stale += 1;
            return false;
        }
        let t = &mut f.tcp_layer;
        t.events += 1;
        t.payload_bytes += u64::from(p.payload_len);
        if let Some(w) = &mut f.wire {
            let start = w.unwrap.ext(p.seq);
            let end = start + u64::from(p.payload_len);
            if paws {
                w.log.discarded(start, end);
            }
            w.log.tcp_arrival(TcpArrival {
                t_ns: p.ts_ns,
                start,
                end,
                tsval: p.tsval,
                paws,
                retransmitted_until: start,
                rcv_nxt: p.rcv_nxt,
            });
        }
        if paws {
            t.paws_discarded += 1;
            return false;
        }
        let seq = if p.flags & SYN != 0 {
            p.seq.wrapping_add(1)
        } else {
            p.seq
        };
        if (seq.wrapping_sub(p.rcv_nxt) as i32) > 0 {
            t.ofo_segments += u64::from(p.gso_segs.max(1));
        }
        let (unwrap, order) = &mut **f.tcp.get_or_insert_with(|| {
            let u = Unwrap::new(seq);
            let mut o = OrderDetector::default();
            o.start(u.ext(seq));
            Box::new((u, o))
        });
        order.taken_up_to(unwrap.ext(p.rcv_nxt));
        let start = unwrap.ext(seq);
        let a = Arrival {
            start,
            end: start + u64::from(p.payload_len),
            ts_ns: p.ts_ns,
            cpu: p.cpu,
            ..Default::default()
        };
        let out = order.observe(&a, None);
        unwrap.advance(order.next_exp());
        let held = (std::mem::size_of::<(Unwrap, OrderDetector)>() as u64) + order.held_bytes();
        let t = &mut f.tcp_layer;
        match out.class {
            Class::InOrder => t.in_order += 1,
            Class::Duplicate => t.duplicates += 1,
            _ => t.late += 1,
        }
        std::mem::replace(&mut f.tcp_held, held) != held
    }

    fn retransmit(&mut self, r: &Retransmit) {
        self.retransmit_events += 1;
        let f = self.flow(r.flow, r.ts_ns);
        f.local_retransmits += 1;
        if f.previous.is_some() && f.stale(r.seq, true, None) {
            return;
        }
        if let Some(w) = &mut f.wire {
            let start = w.unwrap.ext(r.seq);
            let len = u64::from(r.end_seq.wrapping_sub(r.seq));
            if len > 0 {
                w.order.local_retransmit(start, start + len);
            }
        }
    }

    /// The read-only view every sink renders, every tracked flow in it,
    /// none replayed yet ([`Engine::replay`]).
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_with(usize::MAX, None)
    }

    /// Replays each flow of `s` (a snapshot of this engine) through the
    /// sender policies, the costly part, and sums them into the totals
    /// with the evicted flows' replays (each replayed as it left). (The
    /// front end replays on every core, [`Engine::replay_of`] a flow at a
    /// time, then [`Engine::total_replays`].)
    pub fn replay(&self, s: &mut Snapshot) {
        for f in &mut s.flows {
            f.replay = self.replay_of(&f.key);
        }
        self.total_replays(s);
    }

    /// Sums the replays of `s`'s flows with the evicted flows' into its
    /// totals.
    pub fn total_replays(&self, s: &mut Snapshot) {
        s.totals.replay = Replay::total(
            self.retired
                .totals
                .replay
                .iter()
                .chain(s.flows.iter().filter_map(|f| f.replay.as_ref())),
        );
    }

    /// For the live view: the totals, and of the flows only the `max_flows`
    /// most reordered (then the busiest) and `keep`, without replays. The
    /// whole report of 20,000 flows takes ~190 ms to build.
    pub fn live_snapshot(&self, max_flows: usize, keep: Option<&Connection>) -> Snapshot {
        self.snapshot_with(max_flows, keep)
    }

    /// One tracked connection's replay (none before it carried data).
    pub fn replay_of(&self, c: &Connection) -> Option<Replay> {
        self.connection(c)
            .and_then(|f| f.replay(&self.cfg.replay, &self.link))
    }

    /// Forgets everything seen so far (the same configuration).
    pub fn reset(&mut self) {
        let rss = self.rss.take();
        *self = Engine::new(self.cfg);
        self.rss = rss;
    }

    // (Out of line: inlined next to the per-segment path, it cost that
    // path a fifth of its speed in the benchmark.)
    #[inline(never)]
    fn snapshot_with(&self, max_flows: usize, keep: Option<&Connection>) -> Snapshot {
        let mut totals = (*self.retired.totals).clone();
        let mut shown: Vec<(&Flow, &FlowState)> = Vec::with_capacity(self.flows.len());
        // Over every tracked flow, not only those shown.
        let mut verdicts = BTreeMap::new();
        for (TableKey { flow, .. }, f) in self.flows.iter() {
            totals.add_flow(flow, f, self.rss.as_ref());
            let v = f.wire.as_ref().map_or(crate::snapshot::Verdict::None, |w| {
                verdict::of(&w.m, &self.cfg.verdict)
            });
            *verdicts.entry(v).or_default() += 1;
            shown.push((flow, f));
        }
        if shown.len() > max_flows {
            let rank = |f: &FlowState| {
                f.wire
                    .as_ref()
                    .map_or((0, 0), |w| (w.m.reordered, w.m.payload_bytes))
            };
            shown.select_nth_unstable_by(max_flows.saturating_sub(1), |a, b| {
                rank(b.1).cmp(&rank(a.1))
            });
            let kept = keep.and_then(|k| {
                shown[max_flows..]
                    .iter()
                    .copied()
                    .find(|(flow, f)| **flow == k.flow && f.serial == k.serial)
            });
            shown.truncate(max_flows);
            shown.extend(kept);
        }
        let mut flows: Vec<_> = shown
            .into_iter()
            .map(|(flow, f)| view::flow_report(flow, f, &self.cfg, self.rss.as_ref()))
            .collect();
        flows.sort_by(|a, b| {
            b.reordered
                .cmp(&a.reordered)
                .then(b.payload_bytes.cmp(&a.payload_bytes))
                .then(a.src.cmp(&b.src))
                .then(a.dst.cmp(&b.dst))
        });
        Snapshot {
            memory: self.memory(),
            ..view::build(
                &totals,
                flows,
                verdicts,
                view::Tally {
                    tracked: self.flows.len() as u64,
                    evicted: self.retired.evictions,
                    reused_tuples: self.retired.reused_tuples,
                    retransmit_events: self.retransmit_events,
                },
                &self.cfg,
            )
        }
    }

    /// Every tracked connection's report, made one at a time (none
    /// replayed), in the table's order.
    pub fn flow_reports(&self) -> impl Iterator<Item = FlowReport> + '_ {
        self.flows.iter().map(|(TableKey { flow, .. }, f)| {
            view::flow_report(flow, f, &self.cfg, self.rss.as_ref())
        })
    }

    /// `flow`'s current connection's state.
    pub fn flow_state(&self, flow: &Flow) -> Option<&FlowState> {
        self.flows.peek(&TableKey::current(*flow))
    }

    /// Tells the replay what the sender's socket did on `flow` (a socket
    /// this host owns): when it took each ACK ((cumulative ACK,
    /// CLOCK_MONOTONIC ns), in its order) and when it retransmitted.
    pub fn set_sender_socket(&mut self, flow: &Flow, acks: &[SenderAck], retransmits: &[u64]) {
        if let Some(w) = self
            .flows
            .peek_mut(&TableKey::current(*flow))
            .and_then(|f| f.wire.as_mut())
        {
            w.log.sender_socket(acks, retransmits);
        }
    }

    /// Tells the replay the sender's own RTTs for `flow` (a socket this
    /// host owns), in place of what the trace shows.
    pub fn set_sender_rtt(&mut self, flow: &Flow, srtt_ns: u64, min_rtt_ns: u64) {
        if let Some(f) = self.flows.peek_mut(&TableKey::current(*flow)) {
            f.sender_rtt_ns = Some((srtt_ns, min_rtt_ns));
        }
    }
}

/// `flow`'s state, tracked from `ts_ns` if new (the table's least recent
/// flow retired to make room), seen last at `ts_ns`.
/// What a flow leaving the table is replayed and checked with.
struct FlowContext<'a> {
    replay: &'a ReplayConfig,
    /// [`EngineConfig::replay_retired`].
    replay_retired: bool,
    link: &'a Link,
    rss: Option<&'a Rss>,
}

fn tracked<'a>(
    flows: &'a mut FlowTable<TableKey, FlowState>,
    retired: &mut Retired,
    ctx: &FlowContext,
    flow: Flow,
    ts_ns: u64,
) -> &'a mut FlowState {
    let serial = retired.begun + 1;
    let mut begun = false;
    let f = flows.get_or_insert(
        TableKey::current(flow),
        || {
            begun = true;
            FlowState {
                first_ns: ts_ns,
                serial,
                ..Default::default()
            }
        },
        |key, old| retired.retire(&key.flow, &old, ctx),
    );
    if begun {
        retired.begun = serial;
    }
    f.last_ns = ts_ns;
    f
}

/// Ends `s.flow`'s current connection, which `s` showed over (it stays
/// tracked under its serial until the table gives it up), and begins the
/// next: its state, seen last at `s`.
#[cold]
#[inline(never)]
fn next_connection<'a>(
    flows: &'a mut FlowTable<TableKey, FlowState>,
    retired: &mut Retired,
    ctx: &FlowContext,
    s: &Segment,
) -> &'a mut FlowState {
    let current = TableKey::current(s.flow);
    let old = flows.peek_mut(&current).expect("the current connection");
    // Summary mode: the data the kernel counted before a SYN was the old
    // connection's.
    if let (true, Some(w)) = (s.flags & SYN != 0, old.wire.as_mut()) {
        if s.summarized_before > 0 {
            w.counted(s.summarized_before, s.summarized_end, &mut old.paths);
        }
    }
    let previous = old.seq_span().map(|span| Previous {
        span,
        since_tsval: s.timestamp.map(|t| t.0).filter(|_| s.flags & SYN != 0),
    });
    let (earlier, serial) = (old.earlier_on_tuple, old.serial);
    flows.rekey(
        &current,
        TableKey {
            flow: s.flow,
            ended: serial,
        },
    );
    retired.reused_tuples += 1;
    let f = tracked(flows, retired, ctx, s.flow, s.ts_ns);
    f.previous = previous;
    f.earlier_on_tuple = earlier + 1;
    if s.flags & SYN != 0 {
        f.isn = Some(s.seq);
    }
    f
}

/// Updates a wire view's metrics with one classified segment.
fn wire_update(
    w: &mut WireView,
    s: &Segment,
    a: &Arrival,
    out: &Outcome,
    cfg: &EngineConfig,
) -> Classified {
    let m = &mut w.m;
    m.data_segments += 1;
    m.payload_bytes += u64::from(s.payload_len);
    m.partial_duplicates += u64::from(out.partial_duplicate);
    m.holes_opened += u64::from(out.opened_hole);
    m.above_hole += u64::from(out.above_hole);

    // Migrations: the flow's queue and CPU are those of its latest
    // in-order segment; stragglers arriving late on the old queue do not
    // move it back.
    let queue_migration = out.class == Class::InOrder && s.rx_queue != w.queue;
    if out.class == Class::InOrder {
        if queue_migration {
            m.queue_migrations += 1;
            w.previous_queue = Some(w.queue);
            w.queue = s.rx_queue;
            w.last_migration_ns = Some(s.ts_ns);
        }
        if s.cpu != w.cpu {
            m.cpu_migrations += 1;
            w.cpu = s.cpu;
            w.last_migration_ns = Some(s.ts_ns);
        }
    }

    let mut attribution = None;
    match out.class {
        Class::InOrder => {
            m.in_order += 1;
            w.run += 1;
        }
        Class::Reordered => {
            m.reordered += 1;
            let l = out.late.expect("reordered segments are late");
            let d = l.discontinuity;
            let attr = Attribution::of((s.rx_queue, s.cpu), (d.rx_queue, d.cpu));
            let after_migration = w
                .last_migration_ns
                .is_some_and(|t| s.ts_ns.saturating_sub(t) <= cfg.migration_window_ns);
            let on_old_queue = w.previous_queue == Some(s.rx_queue) && s.rx_queue != w.queue;
            let ls = &mut *m.late;
            // RFC 4737 §4.6: a reordered packet closes the run.
            ls.run_squares += w.run * w.run;
            w.run = 0;
            for n in ls.n_reordered.iter_mut().take(l.n as usize) {
                *n += 1;
            }
            ls.extent.record(l.extent);
            ls.late_time_us.record(l.late_ns / 1000);
            ls.byte_offset.record(l.byte_offset);
            if let Some((gap, gap_ns)) = l.gap {
                if gap > 0 {
                    ls.gap.record(gap);
                    ls.gap_time_us.record(gap_ns / 1000);
                }
            }
            ls.attribution[attr.index()] += 1;
            *ls.queue_pairs.entry((d.rx_queue, s.rx_queue)).or_default() += 1;
            *ls.cpu_pairs.entry((d.cpu, s.cpu)).or_default() += 1;
            ls.reordered_after_migration += u64::from(after_migration);
            if on_old_queue {
                ls.old_queue_late_us.record(l.late_ns / 1000);
            }
            w.late_held = ls.held_bytes();
            attribution = Some(attr);
        }
        Class::Retransmission => m.retransmissions += 1,
        Class::Duplicate => m.duplicates += 1,
        Class::Ambiguous => m.ambiguous += 1,
    }
    // What a sender's loss detection reacts to.
    if out.index.is_some() {
        w.log.arrival(s.ts_ns, s.payload_len);
    }
    if let (Class::InOrder, Some(v)) = (out.class, a.tsval) {
        w.log.tick(a.start, v, s.ts_ns);
    }
    let late_original = match out.class {
        Class::Reordered => out.late,
        Class::Duplicate => out.behind_retransmission,
        _ => None,
    };
    if let Some(l) = late_original {
        m.originals_behind_retransmission += u64::from(out.class == Class::Duplicate);
        let len = (a.end - a.start).max(1);
        w.log.late_original(LateOriginal {
            arrived_ns: s.ts_ns,
            overtaken_ns: l.discontinuity.ts_ns,
            distance_segments: l
                .discontinuity
                .hole_end
                .saturating_sub(a.start)
                .div_ceil(len) as u32,
            bytes_above: l.byte_offset,
            fack_distance: w.order.next_exp().saturating_sub(a.start),
            start: a.start,
            after_retransmission: out.class == Class::Duplicate,
            discarded: false,
        });
    }
    match out.class {
        // New data (the per-segment common case) costs nothing here.
        Class::InOrder => {}
        Class::Retransmission => w.log.wire_copy(a.start, a.end, true),
        // A copy of bytes already seen, not sent before the retransmission
        // it followed.
        Class::Duplicate if out.behind_retransmission.is_none() => {
            w.log.resent_after_original(a.start, s.ts_ns);
            w.log.wire_copy(a.start, a.end, true)
        }
        _ => w.log.wire_copy(a.start, a.end, false),
    }
    if let (Class::Retransmission, Some(l)) = (out.class, out.late) {
        w.log.refill(Refill {
            opened_ns: l.discontinuity.ts_ns,
            filled_ns: s.ts_ns,
            start: a.start,
        });
    }
    if out.index.is_some() {
        // RFC 5236 sees each segment with new bytes once; a retransmission's
        // lateness is loss recovery, not reordering.
        w.rd.arrive(a.start, a.end, out.class != Class::Retransmission);
        w.rbd.arrive(a.start, a.end);
    }
    Classified {
        class: out.class,
        late: out.late,
        attribution,
        queue_migration,
    }
}

#[cfg(test)]
mod tests;
