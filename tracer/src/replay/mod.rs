//! What a reorder-tolerant sender would have achieved: the observed
//! arrivals of a flow replayed through sender loss-detection policies.
//!
//! The engine logs, per flow direction, what a sender's loss detection
//! reacts to ([`FlowLog`]): each late original (when it arrived, when the
//! segment that overtook it arrived, how far behind in sending order it
//! was, how much was received above it), each hole that only a
//! retransmission filled (a real loss), and the gaps between arrivals.
//! [`replay`] runs that through each [`Policy`] (pure, deterministic) and
//! [`throughput`] turns each policy's recovery episodes into goodput.
//!
//! Two models, the one that ran stated in every report ([`Assumptions`]):
//! * ACK by ACK ([`acks`], classic and RACK-TLP), when the receiver's TCP
//!   layer is traced and whole and the sender's timestamps give transmit
//!   times: the receiver's own processing order replayed as the ACKs it
//!   sent, each heard after the ACK path's delay (measured ACK by ACK
//!   when the sender is this host's);
//! * from the wire's late originals ([`policy`], and always for
//!   linux-adaptive): the sender sent new data in sequence order, one
//!   segment every duration/segments, so a late segment was sent
//!   `distance` segment-times before the one that overtook it; a segment
//!   marked lost is retransmitted when PRR lets it (by the receiver's
//!   TCP-layer arrivals when traced, else the mean send interval), and the
//!   retransmission is spurious if the original arrives after that moment;
//!   a late original the receiving TCP discarded (PAWS) was lost.
//!
//! In both, a recovery episode reduces the congestion window once unless
//! the policy undoes it (Linux's timestamp and DSACK undo).

pub mod acks;
pub mod policy;
pub mod queueing;
pub mod share;
pub mod throughput;

use std::mem::size_of;

pub use policy::{Policy, PolicyOutcome};

/// A late original segment, as the sender's loss detection meets it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LateOriginal {
    /// Nanoseconds from the flow's first data segment.
    pub arrived_ns: u64,
    /// When the segment that opened its hole (overtook it) arrived.
    pub overtaken_ns: u64,
    /// How many segments before that one it was sent.
    pub distance_segments: u32,
    /// Bytes received above it when it arrived (what SACK reported).
    pub bytes_above: u64,
    /// Highest byte received minus its first byte (Linux's reordering
    /// metric, `fack - seq`).
    pub fack_distance: u64,
    /// Its first sequence byte (extended).
    pub start: u64,
    /// It arrived after a retransmission of it had filled its hole (that
    /// retransmission was spurious).
    pub after_retransmission: bool,
    /// The receiving TCP discarded it (PAWS: its timestamp was more than a
    /// tick older than the latest in-order one's) before any retransmission
    /// filled its hole: to the sender it was lost, however it arrived on
    /// the wire.
    pub discarded: bool,
}

/// Data as the receiving TCP processed it (one skb, GRO-merged or not):
/// what its ACK told the sender.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpArrival {
    /// Nanoseconds from the flow's first data segment.
    pub t_ns: u64,
    /// Sequence range (extended, as the wire view numbers it).
    pub start: u64,
    pub end: u64,
    pub tsval: Option<u32>,
    /// Discarded by PAWS: a duplicate ACK only.
    pub paws: bool,
    /// Up to here (from `start`) the wire view classed the data's copies
    /// retransmissions (IP ID, timestamps): the real sender's, not
    /// originals. GRO may have merged originals after them.
    pub retransmitted_until: u64,
    /// The receiver's `rcv_nxt` as it took this (32 bits, as TCP has it):
    /// what its ACK for the previous arrival said.
    pub rcv_nxt: u32,
}

/// One ACK as the sender's socket took it (a socket this host owns: the
/// `tcp_probe` tracepoint before the ACK is processed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderAck {
    /// Its cumulative ACK.
    pub ack: u32,
    /// The sender's SND.NXT before taking it: what it releases is sent
    /// right after.
    pub snd_nxt: u32,
    /// CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
}

/// The first segment with a new TSval: its sender's timestamp clock had
/// just ticked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickMark {
    pub seq: u64,
    pub tsval: u32,
    /// When it arrived (nanoseconds from the flow's first data segment).
    pub arrived_ns: u64,
}

/// The ACK-level replay's record of one flow.
#[derive(Clone, Debug, Default)]
pub struct AckLog {
    /// The receiver's TCP-layer arrivals, in its processing order.
    pub tcp: Vec<TcpArrival>,
    /// The sender's timestamp ticks, seen in new data.
    pub ticks: Vec<TickMark>,
    /// The latest late copies the wire saw (XDP runs a whole NAPI batch
    /// before TCP takes the first of it), in wire order: which TCP-layer
    /// arrival is which copy.
    pub late_copies: std::collections::VecDeque<WireCopy>,
    /// Late copies pushed out (over [`MAX_LATE_COPIES`]) before a
    /// TCP-layer arrival took them, or not kept once the kernel summarized
    /// the flow: which arrivals were retransmissions is then not known for
    /// all, and the replay is not done ACK by ACK.
    pub late_copies_lost: u64,
    /// When the sender's socket took each ACK, when that socket is this
    /// host's (the lab's senders): (cumulative ACK, ns from the flow's
    /// first data segment), in its order.
    pub sender_acks: Vec<(u32, u64)>,
    /// The sender's SND.NXT as it took each ACK: (ns from the flow's
    /// first data segment, extended sequence number), both rising.
    pub sender_sent: Vec<(u64, u64)>,
    /// When that socket retransmitted (ns from the flow's first data
    /// segment).
    pub sender_retransmits: Vec<u64>,
}

/// A copy of data below the wire's highest sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireCopy {
    pub start: u64,
    pub end: u64,
    /// Sent after an earlier copy of the same bytes (a retransmission or a
    /// second one), not an original.
    pub resent: bool,
}

/// Late wire copies kept for the TCP layer to match: it lags XDP by the
/// skbs waiting in the socket's backlog, which a loaded host lets grow to
/// its limit (the receive and send buffers: some 10 MB by default, about
/// 4,500 skbs). A flow with 2,510 retransmissions outran 256 once: 96 real
/// retransmissions then looked like originals to the replay.
const MAX_LATE_COPIES: usize = 8192;

/// Linux's minimum retransmission timeout (`TCP_RTO_MIN`).
pub const RTO_MIN_NS: u64 = 200_000_000;

/// A hole that a retransmission filled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refill {
    pub opened_ns: u64,
    pub filled_ns: u64,
    pub start: u64,
}

/// How many of the latest late originals a TCP-layer discard, or a
/// retransmission after its original, is matched against (a discard
/// follows within microseconds, a retransmission a round trip later).
const LATE_SEARCH: usize = 256;

/// Most TCP-layer arrivals and timestamp ticks kept per flow for the
/// ACK-level replay (about 6 MB; some 190 MB of a flow's data when GRO
/// merges nothing, more when it does); more are counted in
/// `FlowLog::dropped` and not replayed.
pub const MAX_ACK_EVENTS: usize = 1 << 17;

/// Most events kept per flow; more are counted in `FlowLog::dropped`.
pub const MAX_EVENTS: usize = 1 << 18;

/// What the replay needs of one flow direction.
#[derive(Clone, Debug)]
pub struct FlowLog {
    pub late: Vec<LateOriginal>,
    pub refills: Vec<Refill>,
    /// What the ACK-level RACK replay runs on, once the receiver's TCP
    /// layer is traced for this flow (none: nothing is kept, nothing
    /// costs).
    pub acks: Option<Box<AckLog>>,
    /// The ACK-level log was given up to stay within the memory budget:
    /// this flow is replayed from the wire, and keeps no new one.
    pub acks_shed: bool,
    /// Events not kept (over [`MAX_EVENTS`]): the replay undercounts.
    pub dropped: u64,
    /// Heap bytes held, by capacity: kept as the vectors grow, so that
    /// weighing a flow reads one number ([`FlowLog::held_bytes`]).
    held: u64,
    /// Gaps between consecutive data arrivals, counted in buckets a factor
    /// 2 apart from [`MIN_GAP_NS`] (bucket k: [MIN_GAP_NS·2^k,
    /// MIN_GAP_NS·2^(k+1))); the last one is open-ended.
    pub gaps: [u16; GAP_BUCKETS],
    pub data_segments: u64,
    pub payload_bytes: u64,
    pub max_payload: u32,
    pub first_ns: Option<u64>,
    pub last_ns: u64,
    /// Most payload bytes in one [`RATE_BIN_NS`] bin: the bottleneck
    /// when the link's bins say less (a flow shorter than a bin).
    pub peak_bin_bytes: u64,
    /// Its side of the link the flows share ([`share`]).
    pub share: share::Share,
    /// The queue its data met ([`queueing`]).
    pub queueing: queueing::Queueing,
    /// Its segments carried TCP timestamps.
    pub timestamps: bool,
    /// The kernel summarized it: no late copy is kept
    /// ([`FlowLog::summarized`]).
    summarized: bool,
    /// The current bin: when it ends, bytes so far.
    bin: (u64, u64),
}

impl Default for FlowLog {
    fn default() -> Self {
        Self {
            late: Vec::new(),
            refills: Vec::new(),
            acks: None,
            acks_shed: false,
            dropped: 0,
            held: 0,
            gaps: [0; GAP_BUCKETS],
            data_segments: 0,
            payload_bytes: 0,
            max_payload: 0,
            first_ns: None,
            last_ns: 0,
            peak_bin_bytes: 0,
            share: share::Share::default(),
            queueing: queueing::Queueing::default(),
            timestamps: false,
            summarized: false,
            bin: (0, 0),
        }
    }
}

/// Gaps shorter than this are not counted (no probe timeout is shorter).
pub const MIN_GAP_NS: u64 = 16_384;
pub const GAP_BUCKETS: usize = 24;
/// The bin over which the peak arrival rate is measured: long enough
/// that a burst released by the receiving host (a NIC queue's backlog, a
/// flow's turn among others) does not count as the path's rate.
pub const RATE_BIN_NS: u64 = 100_000_000;

impl FlowLog {
    /// A data segment with new bytes arrived at `ts_ns`.
    pub fn arrival(&mut self, ts_ns: u64, payload: u32) {
        let first = *self.first_ns.get_or_insert(ts_ns);
        if self.data_segments > 0 {
            let gap = ts_ns.saturating_sub(self.last_ns);
            if gap >= MIN_GAP_NS {
                let n = &mut self.gaps[gap_bucket(gap)];
                *n = n.saturating_add(1);
            }
        }
        self.data_segments += 1;
        self.payload_bytes += u64::from(payload);
        self.max_payload = self.max_payload.max(payload);
        self.last_ns = self.last_ns.max(ts_ns);
        // (bin end, bytes in the bin)
        if ts_ns >= self.bin.0 {
            let from_first = ts_ns - first;
            self.bin = (ts_ns + RATE_BIN_NS - from_first % RATE_BIN_NS, 0);
        }
        self.bin.1 += u64::from(payload);
        self.peak_bin_bytes = self.peak_bin_bytes.max(self.bin.1);
    }

    /// `arrived_ns` and `overtaken_ns` are absolute here; stored relative.
    pub fn late_original(&mut self, mut late: LateOriginal) {
        let first = self.first_ns.unwrap_or(late.overtaken_ns);
        late.arrived_ns = late.arrived_ns.saturating_sub(first);
        late.overtaken_ns = late.overtaken_ns.saturating_sub(first);
        if self.late.len() < MAX_EVENTS {
            push_weighed(&mut self.late, late, &mut self.held);
        } else {
            self.dropped += 1;
        }
    }

    /// The receiving TCP discarded `[start, end)`: the late originals in it
    /// count as lost. (They were logged microseconds before: only the most
    /// recent entries are searched.)
    pub fn discarded(&mut self, start: u64, end: u64) {
        for l in self.late.iter_mut().rev().take(LATE_SEARCH) {
            if !l.after_retransmission && (start..end).contains(&l.start) {
                l.discarded = true;
            }
        }
    }

    /// A retransmission of `start` arrived at `ts_ns` after its original
    /// (late, as logged): a round trip after the original's hole opened,
    /// if the sender retransmitted at the third duplicate ACK.
    pub fn resent_after_original(&mut self, start: u64, ts_ns: u64) {
        let since_first = ts_ns.saturating_sub(self.first_ns.unwrap_or(ts_ns));
        let opened = self
            .late
            .iter()
            .rev()
            .take(LATE_SEARCH)
            .find(|l| l.start == start && !l.after_retransmission)
            .map(|l| l.overtaken_ns);
        if let Some(opened) = opened {
            self.held += self
                .queueing
                .retransmission(since_first.saturating_sub(opened));
        }
    }

    /// The wire saw a late copy of [start, end): `resent` (the real
    /// sender's retransmission, or a second copy), or an original.
    pub fn wire_copy(&mut self, start: u64, end: u64, resent: bool) {
        if let Some(a) = &mut self.acks {
            if self.summarized {
                a.late_copies_lost += 1;
                return;
            }
            if a.late_copies.len() == MAX_LATE_COPIES {
                a.late_copies.pop_front();
                a.late_copies_lost += 1;
            }
            let before = a.late_copies.capacity();
            a.late_copies.push_back(WireCopy { start, end, resent });
            self.held += ((a.late_copies.capacity() - before) * size_of::<WireCopy>()) as u64;
        }
    }

    /// The kernel summarized the flow (summary mode): the skbs TCP takes
    /// in order stay there, so the late copies they carry would wait for a
    /// TCP-layer arrival that never comes, each arrival scanning them all
    /// (a long upload's 8,192 held the collector up until its ring
    /// overflowed). They go, counted as lost (the replay is then not ACK
    /// by ACK), and none is kept from then on.
    pub fn summarized(&mut self) {
        if self.summarized {
            return;
        }
        self.summarized = true;
        if let Some(a) = &mut self.acks {
            a.late_copies_lost += a.late_copies.len() as u64;
            self.held -= (a.late_copies.capacity() * size_of::<WireCopy>()) as u64;
            a.late_copies = Default::default();
        }
    }

    /// What the sender's socket did on this flow, when that socket is this
    /// host's: each ACK it took, in its order, and when it retransmitted
    /// (CLOCK_MONOTONIC ns). Kept if the flow's TCP layer is traced.
    pub fn sender_socket(&mut self, acks: &[SenderAck], retransmits: &[u64]) {
        let (Some(first), Some(a)) = (self.first_ns, &mut self.acks) else {
            return;
        };
        let since_first = |t: u64| t.checked_sub(first);
        self.held -= vec_bytes(&a.sender_acks)
            + vec_bytes(&a.sender_sent)
            + vec_bytes(&a.sender_retransmits);
        a.sender_acks = acks
            .iter()
            .filter_map(|s| Some((s.ack, since_first(s.ts_ns)?)))
            .collect();
        // SND.NXT in the wire's numbering, unwrapped step by step from the
        // flow's first data (it only rises).
        let mut at = a.tcp.first().map_or(0, |t| t.start);
        a.sender_sent = acks
            .iter()
            .filter_map(|s| {
                let step = i64::from(s.snd_nxt.wrapping_sub(at as u32) as i32);
                at = at.saturating_add_signed(step).max(at);
                Some((since_first(s.ts_ns)?, at))
            })
            .collect();
        a.sender_retransmits = retransmits.iter().filter_map(|&t| since_first(t)).collect();
        self.held += vec_bytes(&a.sender_acks)
            + vec_bytes(&a.sender_sent)
            + vec_bytes(&a.sender_retransmits);
    }

    /// The receiving TCP processed `arrival` (`t_ns` absolute here).
    pub fn tcp_arrival(&mut self, mut arrival: TcpArrival) {
        let Some(first) = self.first_ns else {
            return;
        };
        if self.acks_shed {
            return;
        }
        let a = self.acks.get_or_insert_with(|| {
            self.held += size_of::<AckLog>() as u64;
            Box::default()
        });
        // Each late wire copy is taken once, oldest first, by the
        // TCP-layer arrival that carries it; the resent ones at its start
        // are its retransmitted prefix.
        let mut until = arrival.start;
        let mut at = arrival.start;
        let mut prefix = true;
        while at < arrival.end && !a.late_copies.is_empty() {
            // The oldest copy carrying `at`, else the first one further in.
            let copies = &a.late_copies;
            let here = copies.iter().position(|c| c.start <= at && c.end > at);
            let further = || {
                (0..copies.len())
                    .filter(|&i| copies[i].start > at && copies[i].start < arrival.end)
                    .min_by_key(|&i| copies[i].start)
            };
            let Some(i) = here.or_else(further) else {
                break;
            };
            let c = a.late_copies.remove(i).expect("found");
            prefix &= c.resent && c.start <= at;
            if prefix {
                until = c.end.min(arrival.end);
            }
            at = c.end;
        }
        arrival.retransmitted_until = until;
        arrival.t_ns = arrival.t_ns.saturating_sub(first);
        if a.tcp.len() < MAX_ACK_EVENTS {
            push_weighed(&mut a.tcp, arrival, &mut self.held);
        } else {
            self.dropped += 1;
        }
    }

    /// New data at `seq` carried `tsval`, arriving at `ts_ns` (absolute).
    pub fn tick(&mut self, seq: u64, tsval: u32, ts_ns: u64) {
        self.timestamps = true;
        let (Some(first), Some(a)) = (self.first_ns, &mut self.acks) else {
            return;
        };
        let newer = a
            .ticks
            .last()
            .is_none_or(|m| (tsval.wrapping_sub(m.tsval) as i32) > 0);
        if newer && a.ticks.len() < MAX_ACK_EVENTS {
            let tick = TickMark {
                seq,
                tsval,
                arrived_ns: ts_ns.saturating_sub(first),
            };
            push_weighed(&mut a.ticks, tick, &mut self.held);
        }
    }

    pub fn refill(&mut self, mut r: Refill) {
        self.held += self
            .queueing
            .retransmission(r.filled_ns.saturating_sub(r.opened_ns));
        let first = self.first_ns.unwrap_or(r.opened_ns);
        r.opened_ns = r.opened_ns.saturating_sub(first);
        r.filled_ns = r.filled_ns.saturating_sub(first);
        if self.refills.len() < MAX_EVENTS {
            push_weighed(&mut self.refills, r, &mut self.held);
        } else {
            self.dropped += 1;
        }
    }

    /// Bytes the log holds on the heap (by capacity: what it may touch).
    pub fn held_bytes(&self) -> u64 {
        debug_assert_eq!(
            self.held,
            vec_bytes(&self.late)
                + vec_bytes(&self.refills)
                + self.queueing.held_bytes()
                + self.ack_log_bytes()
        );
        self.held
    }

    /// The ACK-level log's part of that.
    pub fn ack_log_bytes(&self) -> u64 {
        self.acks.as_deref().map_or(0, |a| {
            size_of::<AckLog>() as u64
                + vec_bytes(&a.tcp)
                + vec_bytes(&a.ticks)
                + (a.late_copies.capacity() * size_of::<WireCopy>()) as u64
                + vec_bytes(&a.sender_acks)
                + vec_bytes(&a.sender_sent)
                + vec_bytes(&a.sender_retransmits)
        })
    }

    /// Gives up the ACK-level log (to stay within the memory budget): the
    /// flow is replayed from the wire's late originals instead.
    pub fn shed_ack_log(&mut self) {
        self.held -= self.ack_log_bytes();
        self.acks = None;
        self.acks_shed = true;
    }

    pub fn duration_ns(&self) -> u64 {
        self.first_ns.map_or(0, |f| self.last_ns - f)
    }

    /// Gaps at least `ns` long (counting whole buckets: up to a factor 2
    /// short of exact).
    pub fn gaps_over(&self, ns: u64) -> u64 {
        let from = if ns < MIN_GAP_NS {
            0
        } else {
            // The first bucket starting at or above `ns`.
            let b = gap_bucket(ns);
            b + usize::from(bucket_start(b) < ns)
        };
        self.gaps.iter().skip(from).map(|&n| u64::from(n)).sum()
    }
}

fn vec_bytes<T>(v: &Vec<T>) -> u64 {
    (v.capacity() * size_of::<T>()) as u64
}

/// Pushes `item` onto `v`, adding what its growth took to `held`.
fn push_weighed<T>(v: &mut Vec<T>, item: T, held: &mut u64) {
    let before = v.capacity();
    v.push(item);
    *held += ((v.capacity() - before) * size_of::<T>()) as u64;
}

/// Bucket of a gap of at least MIN_GAP_NS: floor(log2(gap / MIN_GAP_NS)).
fn gap_bucket(gap: u64) -> usize {
    let ratio = gap / MIN_GAP_NS;
    ((63 - ratio.max(1).leading_zeros()) as usize).min(GAP_BUCKETS - 1)
}

fn bucket_start(b: usize) -> u64 {
    MIN_GAP_NS << b
}

/// Where the replay's path figures come from.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Given on the command line.
    Given,
    /// The sender's own socket, when this host runs it (`tcp_info`; for
    /// ACK delays, the `tcp_probe` tracepoint as it takes each ACK).
    Sender,
    /// Measured from the trace (handshake, peak rate).
    Trace,
    /// Nothing known: a default.
    Default,
}

/// The round trip a flow's trace knows of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceRtt {
    /// The sender's socket: smoothed and minimum RTT, ns.
    Sender { srtt: u64, min_rtt: u64 },
    /// Seen at this observer (handshake or the local socket's srtt).
    Observed(Option<u64>),
}

/// What the user may set; `None`: from the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ReplayConfig {
    /// Round-trip time (SRTT) for the senders.
    pub rtt_us: Option<f64>,
    /// RACK's min_RTT (default: the RTT).
    pub min_rtt_us: Option<f64>,
    /// The bottleneck's rate, shared by the flows crossing it together
    /// (default: the traced link's peak over 100 ms bins, all flows').
    pub bandwidth_bps: Option<f64>,
    /// The bottleneck's queue in bandwidth-delay products (default
    /// [`DEFAULT_QUEUE_BDP`]).
    pub queue_bdp: Option<f64>,
    pub dupthresh: Option<u32>,
    /// RACK's initial reordering-window multiplier (RFC 8985: 1).
    pub reo_wnd_mult: Option<u32>,
    /// When the classic sender undoes a recovery.
    pub classic_undo: ClassicUndo,
    /// Whether the receiver sent DSACKs (RFC 2883), the one way a sender
    /// without timestamps learns a recovery was spurious, and who said so
    /// (None: not known, taken as on: Linux's default).
    pub receiver_dsack: Option<(bool, Source)>,
    /// How long after an arrival its ACK reaches the sender's TCP
    /// (default: measured per ACK where the sender is this host's, else
    /// min_RTT).
    pub ack_delay_us: Option<f64>,
    /// Transmit times from the sender's timestamps even where its socket
    /// is this host's (as a remote sender's must be).
    pub timestamp_clock: bool,
}

/// When the classic sender undoes a recovery, reverting its window cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ClassicUndo {
    /// Once the receiver's DSACKs prove all its retransmissions spurious
    /// (RFC 3708), as Linux's RFC 6675 recovery does without timestamps:
    /// the lab's classic guest. (A receiver that sends no DSACKs leaves
    /// it nothing to undo by.)
    #[default]
    Dsack,
    /// Never: a sender without DSACK undo (as Windows before RACK-TLP is
    /// taken to be).
    Never,
}

/// The path a flow's replay ran with, and where each figure came from.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Assumptions {
    /// The round trip the senders are replayed with: the sender's, given,
    /// or the handshake's plus the others' part of the queueing.
    pub rtt_us: f64,
    pub rtt_from: Source,
    pub min_rtt_us: f64,
    /// The mean queueing delay the flow's data met, when measured from
    /// the trace (its echoed timestamps, else the echoes of the flows that
    /// shared the link with it, else its fast retransmissions).
    pub queueing_us: Option<f64>,
    /// How long after an arrival its ACK reached the sender's TCP (when
    /// measured: the median; the replay then uses each ACK's own).
    pub ack_delay_us: f64,
    pub ack_delay_from: Source,
    /// Where the segments' transmit times come from: the sender's socket
    /// (its SND.NXT as it took each ACK), else its timestamps (1 ms ticks,
    /// interpolated by sequence: a burst sent within a tick looks spread
    /// over it).
    pub send_times_from: Source,
    /// The flow's part of the link: what the other flows left of it, or
    /// its fair share if that is more ([`share`]).
    pub bottleneck_bps: f64,
    pub bottleneck_from: Source,
    /// The link's rate the flows shared (given, or its peak).
    pub link_bps: f64,
    /// Flows at once over this flow's time (harmonic mean; 1: alone).
    pub flows_sharing: f64,
    /// The bottleneck's queue, in bandwidth-delay products.
    pub queue_bdp: f64,
    /// The first slow start ends where CUBIC's HyStart (on in Linux, and
    /// HyStart++ in Windows) sees the queue begin, the window filling the
    /// link; else when the queue overflows. A receiver cannot tell which:
    /// the estimate takes HyStart, its range both.
    pub hystart: bool,
    /// The receiver sent DSACKs: a sender can undo a recovery they prove
    /// spurious (classic, as `classic_undo` says; linux-adaptive and
    /// rack-tlp always).
    pub receiver_dsack: bool,
    pub receiver_dsack_from: Source,
    /// The flow carried TCP timestamps: linux-adaptive and rack-tlp undo
    /// a recovery by them too (RFC 3522), DSACKs or not; classic does not.
    pub timestamps: bool,
    pub classic_undo: ClassicUndo,
    pub mss_bytes: u32,
    /// Mean spacing of the sender's segments.
    pub send_interval_us: f64,
    pub duration_s: f64,
    /// The receiver's TCP layer is traced for this flow and covers what
    /// the wire saw (this kernel sometimes skips tcp_probe unannounced).
    pub tcp_layer_whole: bool,
    /// RACK-TLP and classic replayed ACK by ACK from that TCP layer (it is
    /// whole, each of its late arrivals was matched with the wire's copy,
    /// and the sender's timestamps give transmit times), else from the
    /// wire's late originals.
    pub ack_level: bool,
    /// Late wire copies the TCP layer had not taken when more came
    /// ([`AckLog::late_copies_lost`]).
    pub late_copies_lost: u64,
    /// The flow's ACK-level log was given up to stay within the memory
    /// budget (`--memory-mib`): replayed from the wire.
    pub ack_log_shed: bool,
    /// What the flow shared the link with (the trace's, when replayed
    /// from it).
    #[serde(skip)]
    pub sharing: Option<share::Sharing>,
}

impl Assumptions {
    /// How long one full segment takes at the bottleneck, ns (never more
    /// than the mean send interval): the spacing of back-to-back arrivals.
    pub fn segment_gap_ns(&self) -> u64 {
        let at_bottleneck = if self.bottleneck_bps > 0.0 {
            f64::from(self.mss_bytes) * 8.0 / self.bottleneck_bps * 1e9
        } else {
            f64::INFINITY
        };
        at_bottleneck.min(self.send_interval_us * 1000.0) as u64
    }

    /// The round trip of a slow start that ended `until_s` into the flow:
    /// from the trace, the handshake's plus the others' part of the
    /// queueing the link measured in the flow's bins until then (a slow
    /// start's few round trips met the queue as it was, not the run's
    /// mean); else the replay's round trip.
    pub fn slow_start_rtt_us(&self, until_s: f64) -> f64 {
        let early = self
            .sharing
            .filter(|_| self.rtt_from == Source::Trace)
            .and_then(|s| Some((s.part, s.early_queueing_ns(until_s)?)));
        early.map_or(self.rtt_us, |(part, q)| {
            self.min_rtt_us + (1.0 - part) * q / 1000.0
        })
    }
}

/// RTT when neither the trace nor the user gives one.
pub const DEFAULT_RTT_US: f64 = 1000.0;
/// The bottleneck's queue when the user gives none: one bandwidth-delay
/// product, the classic rule for a router's buffer (and the lab's
/// `--rate`). A receiver cannot see it; with it, a window halved by a
/// loss at a full queue still fills the link.
pub const DEFAULT_QUEUE_BDP: f64 = 1.0;

impl ReplayConfig {
    /// The path for a flow: the user's figures, else the trace's;
    /// `sharing`: what the flow shared the traced link with (`None`: it
    /// had the link to itself).
    pub fn assumptions(
        &self,
        log: &FlowLog,
        trace: TraceRtt,
        sharing: Option<share::Sharing>,
    ) -> Assumptions {
        let (rtt_us, rtt_from, trace_min_rtt_us) = match (self.rtt_us, trace) {
            (Some(r), _) => (r, Source::Given, None),
            (None, TraceRtt::Sender { srtt, min_rtt }) if srtt > 0 => (
                srtt as f64 / 1000.0,
                Source::Sender,
                Some(min_rtt as f64 / 1000.0),
            ),
            (None, TraceRtt::Observed(Some(ns))) if ns > 0 => {
                (ns as f64 / 1000.0, Source::Trace, Some(ns as f64 / 1000.0))
            }
            _ => (DEFAULT_RTT_US, Source::Default, None),
        };
        // Seen from here, the handshake's round trip met an empty path;
        // the data's met the queue too, and of it the simulation builds
        // the flow's own ([`queueing`]).
        let queueing_us = (rtt_from == Source::Trace)
            .then(|| {
                let q = &log.queueing;
                let base = (rtt_us * 1000.0) as u64;
                // Without timestamps, both other readings err high: the
                // link's flows may have queued at their own hosts (an edge
                // host's clients, each behind its own uplink), and a
                // recovery's retransmissions leave at PRR's pace. The
                // lower of the two, the flow's own counting once it has
                // ten retransmissions.
                let own = q
                    .retransmitted_ns(base)
                    .filter(|_| q.many_retransmissions());
                let link = sharing.and_then(|s| s.queueing_ns);
                let lower = match (own, link) {
                    (Some(o), Some(l)) => Some(o.min(l)),
                    (o, l) => o.or(l),
                };
                q.echoed_ns().or(lower).or_else(|| q.retransmitted_ns(base))
            })
            .flatten()
            .map(|ns| ns / 1000.0);
        let others_part = 1.0 - sharing.map_or(1.0, |s| s.part);
        let rtt_us = rtt_us + others_part * queueing_us.unwrap_or(0.0);
        let duration_s = log.duration_ns() as f64 / 1e9;
        let (link_bps, bottleneck_from) = match self.bandwidth_bps {
            Some(b) => (b, Source::Given),
            // A flow shorter than a bin: its bytes over its time.
            None if log.peak_bin_bytes > 0 => (
                (log.peak_bin_bytes as f64 * 8.0 / duration_s.min(RATE_BIN_NS as f64 / 1e9))
                    .max(sharing.map_or(0.0, |s| s.link_peak_bps)),
                Source::Trace,
            ),
            None => (1e9, Source::Default),
        };
        let bottleneck_bps = sharing.map_or(link_bps, |s| s.bottleneck_bps(link_bps));
        let min_rtt_us = self
            .min_rtt_us
            .or(trace_min_rtt_us)
            .unwrap_or(rtt_us)
            .min(rtt_us);
        let measured = log.acks.as_deref().and_then(acks::median_ack_delay_ns);
        let (ack_delay_us, ack_delay_from) = match (self.ack_delay_us, measured) {
            (Some(d), _) => (d, Source::Given),
            (None, Some(ns)) => (ns as f64 / 1000.0, Source::Sender),
            // On the replay's clock, where the fastest segment took no time
            // forward: an ACK that does not queue takes the whole minimum.
            (None, None) => (min_rtt_us, Source::Default),
        };
        let sender_clock = log
            .acks
            .as_deref()
            .is_some_and(|l| l.sender_sent.len() >= 2);
        let send_times_from = if sender_clock && !self.timestamp_clock {
            Source::Sender
        } else {
            Source::Trace
        };
        Assumptions {
            rtt_us,
            rtt_from,
            min_rtt_us,
            queueing_us,
            ack_delay_us,
            ack_delay_from,
            send_times_from,
            bottleneck_bps,
            bottleneck_from,
            link_bps,
            flows_sharing: sharing.map_or(1.0, |s| s.flows),
            queue_bdp: self.queue_bdp.unwrap_or(DEFAULT_QUEUE_BDP),
            hystart: true,
            receiver_dsack: self.receiver_dsack.is_none_or(|d| d.0),
            receiver_dsack_from: self.receiver_dsack.map_or(Source::Default, |d| d.1),
            timestamps: log.timestamps,
            classic_undo: self.classic_undo,
            mss_bytes: log.max_payload.max(1),
            send_interval_us: if log.data_segments > 1 {
                duration_s * 1e6 / (log.data_segments - 1) as f64
            } else {
                0.0
            },
            duration_s,
            tcp_layer_whole: false,
            ack_level: false,
            late_copies_lost: log.acks.as_deref().map_or(0, |l| l.late_copies_lost),
            ack_log_shed: log.acks_shed,
            sharing,
        }
    }
}

/// Every policy's outcome for one flow (or summed), with the path.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Replay {
    pub assumptions: Option<Assumptions>,
    pub policies: Vec<PolicyOutcome>,
    /// Estimated goodput of RACK-TLP over classic (CUBIC).
    pub rack_vs_classic: Option<f64>,
    /// Events over the per-flow cap, not replayed.
    pub events_not_replayed: u64,
}

/// The policies every report compares.
pub fn default_policies(cfg: &ReplayConfig) -> Vec<Policy> {
    let dupthresh = cfg.dupthresh.unwrap_or(3);
    vec![
        Policy::Classic {
            dupthresh,
            undo: cfg.classic_undo == ClassicUndo::Dsack,
        },
        Policy::LinuxAdaptive {
            initial: dupthresh,
            max: 300,
            undo: true,
        },
        Policy::RackTlp {
            dupthresh,
            reo_wnd_mult: cfg.reo_wnd_mult.unwrap_or(1),
            undo: true,
        },
    ]
}

/// Replays one flow through every default policy. `tcp_layer_whole`: the
/// receiver's TCP-layer view covers what the wire saw (this kernel
/// sometimes skips its tracepoint programs unannounced); the ACK-level
/// replay needs it. `sharing`: what the flow shared the link with.
pub fn replay(
    log: &FlowLog,
    trace: TraceRtt,
    cfg: &ReplayConfig,
    tcp_layer_whole: bool,
    sharing: Option<share::Sharing>,
) -> Replay {
    let mut a = cfg.assumptions(log, trace, sharing);
    let acks = log.acks.as_deref().filter(|l| !l.tcp.is_empty());
    a.tcp_layer_whole = tcp_layer_whole && acks.is_some();
    a.ack_level =
        a.tcp_layer_whole && a.late_copies_lost == 0 && acks.is_some_and(|l| l.ticks.len() >= 2);
    let policies: Vec<PolicyOutcome> = default_policies(cfg)
        .iter()
        .map(|p| PolicyOutcome::with_range(p, log, &a))
        .collect();
    Replay {
        rack_vs_classic: ratio(&policies),
        assumptions: Some(a),
        policies,
        events_not_replayed: log.dropped,
    }
}

fn ratio(policies: &[PolicyOutcome]) -> Option<f64> {
    let get = |name: &str| {
        policies
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.estimated_goodput_bps)
    };
    match (get("rack-tlp"), get("classic")) {
        (Some(r), Some(c)) if c > 0.0 => Some(r / c),
        _ => None,
    }
}

impl Replay {
    /// Sums of flows: each flow's estimate holds the others as they were
    /// (its part of the link is what they left it, or its fair share).
    pub fn total<'a>(flows: impl IntoIterator<Item = &'a Replay>) -> Replay {
        let mut policies: Vec<PolicyOutcome> = Vec::new();
        let mut not_replayed = 0;
        for r in flows {
            not_replayed += r.events_not_replayed;
            for p in &r.policies {
                match policies.iter_mut().find(|q| q.name == p.name) {
                    Some(q) => q.add(p),
                    None => policies.push(p.clone()),
                }
            }
        }
        Replay {
            assumptions: None,
            rack_vs_classic: ratio(&policies),
            policies,
            events_not_replayed: not_replayed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_counted_by_length() {
        let mut log = FlowLog::default();
        let mut t = 1_000_000;
        for gap in [1_000, 20_000, 100_000, 3_000_000, 50_000_000] {
            log.arrival(t, 1000);
            t += gap;
        }
        log.arrival(t, 1000);
        assert_eq!(log.gaps_over(0), 4);
        assert_eq!(log.gaps_over(50_000), 3);
        assert_eq!(log.gaps_over(2_000_000), 2);
        assert_eq!(log.gaps_over(10_000_000), 1);
        assert_eq!(log.gaps_over(100_000_000), 0);
    }

    /// TCP-layer arrivals of [start, end) after the wire's `copies`
    /// (resent or not): where each one's retransmitted prefix ends.
    fn prefixes(copies: &[(u64, u64, bool)], arrivals: &[(u64, u64)]) -> Vec<u64> {
        let mut log = FlowLog::default();
        log.arrival(1_000, 1000);
        let tcp = |log: &mut FlowLog, start, end| {
            log.tcp_arrival(TcpArrival {
                t_ns: 2_000,
                start,
                end,
                retransmitted_until: start,
                ..Default::default()
            })
        };
        tcp(&mut log, 0, 1000);
        for &(start, end, resent) in copies {
            log.wire_copy(start, end, resent);
        }
        for &(start, end) in arrivals {
            tcp(&mut log, start, end);
        }
        let a = log.acks.as_deref().unwrap();
        a.tcp[1..].iter().map(|t| t.retransmitted_until).collect()
    }

    #[test]
    fn each_tcp_arrival_takes_its_own_wire_copy() {
        // A retransmission and a second copy of it, both through XDP before
        // TCP took the first: both resent.
        let rtx = (2000, 3000, true);
        let twice = [(2000, 3000), (2000, 3000)];
        assert_eq!(prefixes(&[rtx, rtx], &twice), [3000, 3000]);
        // A retransmission, then the late original behind it.
        assert_eq!(prefixes(&[rtx, (2000, 3000, false)], &twice), [3000, 2000]);
        // The original first, then its retransmission.
        assert_eq!(prefixes(&[(2000, 3000, false), rtx], &twice), [2000, 3000]);
        // GRO merged a retransmission with a late original after it, then
        // with new data: the prefix is the retransmission; nothing is left
        // for a later arrival to take.
        let merged = prefixes(&[rtx, (3000, 4000, false)], &[(2000, 4000), (3000, 4000)]);
        assert_eq!(merged, [3000, 3000]);
        assert_eq!(prefixes(&[rtx], &[(2000, 5000)]), [3000]);
        // A copy that starts inside the arrival is no prefix.
        assert_eq!(prefixes(&[(2500, 3000, true)], &[(2000, 3000)]), [2000]);
    }

    /// More retransmissions through XDP than the copies kept, before TCP
    /// takes the first (a loaded host's backlog): the oldest lose their
    /// mark, which is counted, and the replay is then not ACK by ACK.
    #[test]
    fn late_copies_pushed_out_unmatched_are_counted_and_end_the_ack_level() {
        let n = MAX_LATE_COPIES as u64 + 10;
        let copies: Vec<(u64, u64, bool)> = (0..n)
            .map(|i| (2000 + 1000 * i, 3000 + 1000 * i, true))
            .collect();
        let arrivals: Vec<(u64, u64)> = copies.iter().map(|&(s, e, _)| (s, e)).collect();
        let marked = prefixes(&copies, &arrivals);
        // The first ten lost their mark; the rest are retransmissions.
        assert!(marked[..10]
            .iter()
            .zip(&arrivals)
            .all(|(&m, &(s, _))| m == s));
        assert!(marked[10..]
            .iter()
            .zip(&arrivals[10..])
            .all(|(&m, &(_, e))| m == e));
        let mut log = FlowLog::default();
        log.arrival(1_000, 1000);
        log.tcp_arrival(TcpArrival {
            t_ns: 2_000,
            start: 0,
            end: 1000,
            retransmitted_until: 0,
            ..Default::default()
        });
        for &(start, end, resent) in &copies {
            log.wire_copy(start, end, resent);
        }
        for (seq, tsval) in [(0, 1), (1000, 2)] {
            log.tick(seq, tsval, 1_000 + seq);
        }
        assert_eq!(log.acks.as_deref().unwrap().late_copies_lost, 10);
        let r = replay(
            &log,
            TraceRtt::Observed(None),
            &ReplayConfig::default(),
            true,
            None,
        );
        let a = r.assumptions.unwrap();
        assert_eq!((a.late_copies_lost, a.ack_level), (10, false));
    }

    /// Once the kernel summarizes the flow, TCP's in-order skbs never
    /// reach the log: the late copies waiting for them go, counted, and
    /// none is kept after (the ACK-level replay is off for the flow).
    #[test]
    fn a_summarized_flow_keeps_no_late_copy() {
        let mut log = FlowLog::default();
        log.arrival(1_000, 1000);
        log.tcp_arrival(TcpArrival {
            t_ns: 2_000,
            start: 0,
            end: 1000,
            ..Default::default()
        });
        let before = log.held_bytes();
        for i in 0..3 {
            log.wire_copy(1000 * i, 1000 * (i + 1), false);
        }
        log.summarized();
        log.wire_copy(3000, 4000, true);
        let a = log.acks.as_deref().unwrap();
        assert_eq!((a.late_copies.len(), a.late_copies_lost), (0, 4));
        assert_eq!(log.held_bytes(), before);
    }

    #[test]
    fn the_senders_snd_nxt_is_unwrapped_in_the_wires_numbering() {
        let mut log = FlowLog::default();
        log.arrival(1_000, 1000);
        let start = (1u64 << 40) + 0xFFFF_F000;
        log.tcp_arrival(TcpArrival {
            t_ns: 1_000,
            start,
            end: start + 1000,
            retransmitted_until: start,
            ..Default::default()
        });
        let at = |ts_ns, snd_nxt| SenderAck {
            ack: 0,
            snd_nxt,
            ts_ns,
        };
        // Before the first data (dropped), then across the 2^32 wrap.
        let acks = [
            at(500, 0xFFFF_E000),
            at(1_500, 0xFFFF_F000),
            at(2_500, 0xFFFF_FF00),
            at(3_500, 0x100),
            at(4_500, 0x1000),
        ];
        log.sender_socket(&acks, &[]);
        let a = log.acks.as_deref().unwrap();
        assert_eq!(
            a.sender_sent,
            [
                (500, start),
                (1_500, start + 0xF00),
                (2_500, start + 0x1100),
                (3_500, start + 0x2000)
            ]
        );
        assert_eq!(a.sender_acks.len(), 4);
    }

    #[test]
    fn the_round_trip_adds_the_others_part_of_the_queue() {
        const MS: u64 = 1_000_000;
        // Data arriving 80 ms after the ACKs it echoes, then 130 ms: a
        // queue of 25 ms on average; ACKs every 0.7 ms.
        let mut log = FlowLog::default();
        for n in 0..2000u64 {
            let ack = 1_000 * MS + n * MS * 7 / 10;
            let rtt = if n < 1000 { 80 * MS } else { 130 * MS };
            log.queueing.echo(ack + rtt, Some(5 + (ack / MS) as u32));
            log.arrival(ack + rtt, 1448);
        }
        let sharing = |part| share::Sharing {
            link_peak_bps: 1e8,
            part,
            flows: 2.0,
            queueing_ns: None,
            early_queueing_ns: [None; share::EARLY_BINS],
        };
        let handshake = TraceRtt::Observed(Some(80 * MS));
        let cfg = ReplayConfig::default();
        // A tenth of the link's bytes its own: nine tenths of the queue
        // were the others'.
        let a = cfg.assumptions(&log, handshake, Some(sharing(0.1)));
        assert!((a.queueing_us.unwrap() - 25_000.0).abs() < 100.0, "{a:?}");
        assert!((a.rtt_us - 102_500.0).abs() < 100.0, "{a:?}");
        assert_eq!((a.min_rtt_us, a.rtt_from), (80_000.0, Source::Trace));
        // Without timestamps, the queue the link's other flows measured.
        let mut bare = FlowLog::default();
        bare.arrival(1_000 * MS, 1448);
        bare.arrival(2_000 * MS, 1448);
        let measured = share::Sharing {
            queueing_ns: Some(40e6),
            ..sharing(0.25)
        };
        let a = cfg.assumptions(&bare, handshake, Some(measured));
        assert_eq!((a.queueing_us, a.rtt_us), (Some(40_000.0), 110_000.0));
        let a = cfg.assumptions(&bare, handshake, Some(sharing(0.25)));
        assert_eq!((a.queueing_us, a.rtt_us), (None, 80_000.0));
        // Its fast retransmissions tell less than the link's measured
        // queue, and only when nothing measured it.
        bare.queueing.retransmission(100 * MS);
        let a = cfg.assumptions(&bare, handshake, Some(measured));
        assert_eq!(a.queueing_us, Some(40_000.0));
        let a = cfg.assumptions(&bare, handshake, Some(sharing(0.25)));
        assert_eq!((a.queueing_us, a.rtt_us), (Some(20_000.0), 95_000.0));
        // Its slow start met the queue the link measured in its first bins
        // (until its first recovery), the replay's round trip when none did.
        let mut early = measured;
        early.early_queueing_ns[..2].copy_from_slice(&[Some(10e6), Some(30e6)]);
        let a = cfg.assumptions(&bare, handshake, Some(early));
        assert_eq!(a.slow_start_rtt_us(0.05), 80_000.0 + 0.75 * 10_000.0);
        assert_eq!(a.slow_start_rtt_us(0.15), 80_000.0 + 0.75 * 20_000.0);
        let a = cfg.assumptions(&bare, handshake, Some(measured));
        assert_eq!(a.slow_start_rtt_us(0.15), a.rtt_us);
        // Alone on the link, the queue was its own: the simulation builds it.
        let a = cfg.assumptions(&log, handshake, None);
        assert_eq!(a.rtt_us, 80_000.0);
        // A sender's socket knows its round trips; a given one is kept.
        let sender = TraceRtt::Sender {
            srtt: 120 * MS,
            min_rtt: 80 * MS,
        };
        let a = cfg.assumptions(&log, sender, Some(sharing(0.1)));
        assert_eq!((a.rtt_us, a.queueing_us), (120_000.0, None));
        let given = ReplayConfig {
            rtt_us: Some(90_000.0),
            ..cfg
        };
        let a = given.assumptions(&log, handshake, Some(sharing(0.1)));
        assert_eq!(a.rtt_us, 90_000.0);
    }
}
