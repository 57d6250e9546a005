//! Arrival order of one flow direction, in byte-sequence space: RFC 4737
//! (Packet Reordering Metrics) with NextExp over bytes, plus what tells a
//! late original from a retransmission.
//!
//! Terms, as in RFC 4737 §3–5: a segment is *in order* if its first new
//! byte is at or beyond NextExp (one beyond, and it opens a *sequence
//! discontinuity*: a hole); it is *late* otherwise. A late segment is
//! associated with its *reordering discontinuity*: the earliest arrival
//! with a higher sequence number, which is the segment that opened the
//! hole it fills. Extent, byte offset, late time and n-reordering are
//! measured against it.

use std::collections::{BTreeMap, VecDeque};

use super::memory::give_back;
use crate::snapshot::Class;

/// 32-bit TCP sequence numbers become 64-bit values that never wrap: each is
/// placed within 2^31 of a reference (serial-number arithmetic, RFC 1982).
#[derive(Clone, Copy, Debug)]
pub struct Unwrap {
    reference: u64,
}

/// Extended sequence numbers start here, so data from before the first one
/// seen (retransmissions of older data) does not go below zero.
const EXT_BASE: u64 = 1 << 40;

impl Unwrap {
    pub fn new(first: u32) -> Self {
        Self {
            reference: EXT_BASE + u64::from(first),
        }
    }

    /// The extended value of `seq` nearest the reference.
    pub fn ext(&self, seq: u32) -> u64 {
        let delta = seq.wrapping_sub(self.reference as u32) as i32;
        self.reference.wrapping_add_signed(i64::from(delta))
    }

    /// Moves the reference forward (never back) to `to`.
    pub fn advance(&mut self, to: u64) {
        self.reference = self.reference.max(to);
    }
}

/// One data segment as the order detector needs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Arrival {
    /// Extended sequence range [start, end) of the payload.
    pub start: u64,
    pub end: u64,
    pub ts_ns: u64,
    pub rx_queue: u32,
    pub cpu: u32,
    pub tsval: Option<u32>,
    /// The TCP timestamp echo reply (TSecr) sent with it.
    pub tsecr: Option<u32>,
    pub ip_id: Option<u16>,
}

/// Why a late segment got its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Evidence {
    /// A `tcp_retransmit_skb` event of this host covered it.
    LocalRetransmit,
    /// TCP timestamp older or newer than the discontinuity's.
    Timestamp,
    /// IPv4 identification behind or ahead of the discontinuity's.
    IpId,
    /// Same TSval, but the echoed peer timestamp (TSecr) older or newer:
    /// the sender had heard from the receiver less or more recently.
    EchoedTimestamp,
    /// Arrived sooner after the discontinuity than a retransmission could
    /// (under half the round-trip time).
    Timing,
    None,
}

/// The segment that opened a hole (RFC 4737 reordering discontinuity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Discontinuity {
    /// Arrival index (unique data segments of this flow, from 0).
    pub index: u64,
    pub ts_ns: u64,
    pub rx_queue: u32,
    pub cpu: u32,
    pub tsval: Option<u32>,
    pub tsecr: Option<u32>,
    pub ip_id: Option<u16>,
    /// The discontinuity's first new byte: the hole it opened ends here.
    pub hole_end: u64,
}

/// What the detector concluded about one late segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Late {
    pub discontinuity: Discontinuity,
    /// RFC 4737 §4.2 extent, in arrivals.
    pub extent: u64,
    /// RFC 4737 §4.4 byte offset.
    pub byte_offset: u64,
    /// RFC 4737 §4.3 late time.
    pub late_ns: u64,
    /// RFC 4737 §5: the largest n (up to `MAX_N`) it is n-reordered for.
    pub n: u8,
    pub evidence: Evidence,
    /// The first late segment of this discontinuity: the distance from the
    /// previous reordering discontinuity (RFC 4737 §4.5), if there was one.
    pub gap: Option<(u64, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub class: Class,
    /// Some bytes were received before, some are new.
    pub partial_duplicate: bool,
    /// Set for every late segment with a known discontinuity.
    pub late: Option<Late>,
    /// This in-order segment opened a hole (RFC 4737 §3.4).
    pub opened_hole: bool,
    /// Its first new byte lay above a hole: a receiving TCP queues it out
    /// of order (what Linux counts in `tcpi_rcv_ooopack`).
    pub above_hole: bool,
    /// Arrival index of this segment (unique data segments), if it has new
    /// bytes.
    pub index: Option<u64>,
    /// A duplicate that is the late original of a segment whose
    /// retransmission filled the hole first (it was sent before that
    /// retransmission): its lateness, as if it had filled the hole.
    pub behind_retransmission: Option<Late>,
}

/// n-reordering is evaluated for n = 1..=MAX_N (n = 3 is the duplicate
/// ACK threshold).
pub const MAX_N: usize = 8;

/// Bounds on what a flow may hold while holes stay open (lost data never
/// retransmitted past this observer): beyond them the oldest hole is given
/// up and later bytes in it are ambiguous.
const MAX_RANGES: usize = 4096;
const MAX_OPEN_SPAN: u64 = 1 << 30;
const MAX_ABANDONED: usize = 64;

/// Per-flow-direction order state.
#[derive(Clone, Debug, Default)]
pub struct OrderDetector {
    /// No byte below this was ever tracked (data before tracing began).
    base: u64,
    next_exp: u64,
    /// Every byte below this has been received.
    frontier: u64,
    /// Received ranges above `frontier`, merged.
    above: BTreeMap<u64, u64>,
    /// Open holes by start: the discontinuity that opened each.
    holes: BTreeMap<u64, Discontinuity>,
    /// What only lossy or retransmitting flows need, allocated on first
    /// use.
    rare: Option<Box<Rare>>,
    arrivals: u64,
    /// Starts of the last `MAX_N` arrivals.
    recent: Recent,
    /// Index of the last discontinuity a late segment was tied to.
    last_discontinuity: Option<(u64, u64)>,

    started: bool,
}

/// The starts of the last `MAX_N` arrivals, in a fixed ring.
#[derive(Clone, Debug, Default)]
struct Recent {
    starts: [u64; MAX_N],
    /// Arrivals pushed so far (the ring holds the last `MAX_N`).
    pushed: usize,
}

impl Recent {
    fn push(&mut self, start: u64) {
        self.starts[self.pushed % MAX_N] = start;
        self.pushed += 1;
    }

    fn newest_first(&self) -> impl Iterator<Item = u64> + '_ {
        (1..=self.pushed.min(MAX_N)).map(move |back| self.starts[(self.pushed - back) % MAX_N])
    }
}

/// The new parts of one segment: almost always one range, rarely more.
type Parts = smallvec::SmallVec<[(u64, u64); 2]>;

#[derive(Clone, Debug, Default)]
struct Rare {
    /// Holes given up (start, end), newest last.
    abandoned: VecDeque<(u64, u64)>,
    /// Ranges this host retransmitted (newest last), for disambiguation.
    retransmitted: VecDeque<(u64, u64)>,
    /// Holes a retransmission filled (newest last): their original may
    /// still arrive.
    filled_by_retransmission: VecDeque<Filled>,
}

static NO_RARE: Rare = Rare {
    abandoned: VecDeque::new(),
    retransmitted: VecDeque::new(),
    filled_by_retransmission: VecDeque::new(),
};

/// A hole filled by a retransmission: the copy that filled it and what it
/// filled.
#[derive(Clone, Copy, Debug)]
struct Filled {
    start: u64,
    end: u64,
    copy: Arrival,
    late: Late,
}

/// How many local retransmissions (and retransmission-filled holes) are
/// remembered per flow.
const MAX_RETRANSMITTED: usize = 64;

impl OrderDetector {
    /// Heap bytes it holds (its ranges and holes, estimated from their
    /// counts): what the memory budget counts.
    pub fn held_bytes(&self) -> u64 {
        let rare = self.rare.as_deref().map_or(0, |r| {
            std::mem::size_of::<Rare>()
                + (r.abandoned.capacity() + r.retransmitted.capacity()) * 16
                + r.filled_by_retransmission.capacity() * std::mem::size_of::<Filled>()
        });
        super::memory::btree_bytes::<u64, u64>(self.above.len())
            + super::memory::btree_bytes::<u64, Discontinuity>(self.holes.len())
            + rare as u64
    }

    fn rare(&self) -> &Rare {
        self.rare.as_deref().unwrap_or(&NO_RARE)
    }

    fn rare_mut(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Starts the flow at `first` (the byte after the SYN, or the first
    /// data byte seen when tracing began mid-flow).
    pub fn start(&mut self, first: u64) {
        self.base = first;
        self.next_exp = first;
        self.frontier = first;
        self.started = true;
    }

    pub fn started(&self) -> bool {
        self.started
    }

    pub fn next_exp(&self) -> u64 {
        self.next_exp
    }

    /// Summary mode: `arrivals` segments the kernel counted without
    /// emitting them carried the bytes from `next_exp` up to `end`, in
    /// order. (Unmarked, each segment emitted after them opened a hole
    /// that nothing would fill.)
    pub fn counted_in_order(&mut self, end: u64, arrivals: u64) {
        if !self.started || end <= self.next_exp {
            return;
        }
        let start = self.next_exp;
        self.arrivals += arrivals;
        self.next_exp = end;
        self.insert(start, end);
    }

    /// The receiving TCP took everything below `end` (an skb's `rcv_nxt`):
    /// what it took unseen (summary mode emits no skb it takes in order;
    /// a `tcp_probe` run the kernel skipped) fills the holes below.
    pub fn taken_up_to(&mut self, end: u64) {
        if !self.started || end <= self.frontier {
            return;
        }
        self.next_exp = self.next_exp.max(end);
        self.insert(self.frontier, end);
    }

    /// Bytes received in [from, next_exp): what arrived ahead of a segment
    /// ending at `from`.
    fn received_above(&self, from: u64) -> u64 {
        // Everything below the frontier, then the ranges held above it.
        let mut total = self.frontier.saturating_sub(from);
        let from = from.max(self.frontier);
        // The range that may straddle `from`, then all above it.
        if let Some((_, &e)) = self.above.range(..from).next_back() {
            if e > from {
                total += e - from;
            }
        }
        for (&s, &e) in self.above.range(from..) {
            total += e - s;
        }
        total
    }

    /// Parts of [start, end) not received yet.
    fn new_parts(&self, start: u64, end: u64) -> Parts {
        let mut parts = Parts::new();
        let mut at = start.max(self.frontier);
        if at >= end {
            return parts;
        }
        if self.above.is_empty() {
            // The common case: nothing held above the frontier.
            parts.push((at, end));
            return parts;
        }
        if let Some((_, &e)) = self.above.range(..=at).next_back() {
            at = at.max(e);
        }
        for (&s, &e) in self.above.range(at..) {
            if s >= end {
                break;
            }
            if s > at {
                parts.push((at, s));
            }
            at = at.max(e);
        }
        if at < end {
            parts.push((at, end));
        }
        parts
    }

    fn insert(&mut self, start: u64, end: u64) {
        if self.above.is_empty() && start <= self.frontier {
            // In order, nothing held above: no map to touch.
            self.frontier = self.frontier.max(end);
            self.close_holes();
            return;
        }
        let (mut s, mut e) = (start, end);
        if let Some((&ps, &pe)) = self.above.range(..=s).next_back() {
            if pe >= s {
                s = ps;
                e = e.max(pe);
                self.above.remove(&ps);
            }
        }
        while let Some((&ns, &ne)) = self.above.range(s..).next() {
            if ns > e {
                break;
            }
            e = e.max(ne);
            self.above.remove(&ns);
        }
        if s <= self.frontier {
            self.frontier = self.frontier.max(e);
        } else {
            self.above.insert(s, e);
        }
        self.close_holes();
        self.bound();
        give_back(&mut self.above);
    }

    /// Holes entirely below the frontier are closed.
    fn close_holes(&mut self) {
        if self.holes.is_empty() {
            return;
        }
        while let Some((_, d)) = self.holes.first_key_value() {
            if d.hole_end > self.frontier {
                break;
            }
            self.holes.pop_first();
        }
        give_back(&mut self.holes);
    }

    /// Gives up the oldest hole when too much is held open.
    fn bound(&mut self) {
        while self.above.len() > MAX_RANGES
            || (!self.above.is_empty() && self.next_exp - self.frontier > MAX_OPEN_SPAN)
        {
            let (s, e) = self.above.pop_first().expect("not empty");
            let frontier = self.frontier;
            let abandoned = &mut self.rare_mut().abandoned;
            if abandoned.len() == MAX_ABANDONED {
                abandoned.pop_front();
            }
            abandoned.push_back((frontier, s));
            self.frontier = e;
            while let Some((&hs, &he)) = self.above.first_key_value() {
                if hs > self.frontier {
                    break;
                }
                self.frontier = self.frontier.max(he);
                self.above.remove(&hs);
            }
            self.close_holes();
        }
    }

    /// Notes that this host retransmitted [start, end).
    pub fn local_retransmit(&mut self, start: u64, end: u64) {
        let retransmitted = &mut self.rare_mut().retransmitted;
        if retransmitted.len() == MAX_RETRANSMITTED {
            retransmitted.pop_front();
        }
        retransmitted.push_back((start, end));
    }

    /// Classifies one data segment and updates the state. `rtt_ns` (if
    /// known) enables the timing evidence.
    pub fn observe(&mut self, a: &Arrival, rtt_ns: Option<u64>) -> Outcome {
        debug_assert!(self.started && a.end > a.start);
        if a.end <= self.base {
            return Outcome {
                class: Class::Ambiguous,
                partial_duplicate: false,
                late: None,
                opened_hole: false,
                above_hole: false,
                index: None,
                behind_retransmission: None,
            };
        }
        let parts = self.new_parts(a.start.max(self.base), a.end);
        let Some(&(first_new, _)) = parts.first() else {
            let abandoned = self
                .rare()
                .abandoned
                .iter()
                .any(|&(s, e)| a.start < e && a.end > s);
            let behind_retransmission = if abandoned {
                None
            } else {
                self.behind_retransmission(a)
            };
            return Outcome {
                class: if abandoned {
                    Class::Ambiguous
                } else {
                    Class::Duplicate
                },
                partial_duplicate: false,
                late: None,
                opened_hole: false,
                above_hole: false,
                index: None,
                behind_retransmission,
            };
        };
        let new_bytes: u64 = parts.iter().map(|(s, e)| e - s).sum();
        let partial_duplicate = new_bytes < a.end - a.start.max(self.base);
        let index = self.arrivals;
        self.arrivals += 1;

        let mut outcome = Outcome {
            class: Class::InOrder,
            partial_duplicate,
            late: None,
            opened_hole: false,
            above_hole: first_new > self.frontier,
            index: Some(index),
            behind_retransmission: None,
        };
        if first_new >= self.next_exp {
            if first_new > self.next_exp {
                outcome.opened_hole = true;
                self.holes.insert(
                    self.next_exp,
                    Discontinuity {
                        index,
                        ts_ns: a.ts_ns,
                        rx_queue: a.rx_queue,
                        cpu: a.cpu,
                        tsval: a.tsval,
                        tsecr: a.tsecr,
                        ip_id: a.ip_id,
                        hole_end: first_new,
                    },
                );
            }
        } else {
            outcome.late = self.late(a, first_new, index, rtt_ns);
            outcome.class = match outcome.late {
                Some(l) => self.judge(a, &l),
                None => Class::Ambiguous,
            };
            if let (Class::Retransmission, Some(late)) = (outcome.class, outcome.late) {
                let filled = &mut self.rare_mut().filled_by_retransmission;
                if filled.len() == MAX_RETRANSMITTED {
                    filled.pop_front();
                }
                filled.push_back(Filled {
                    start: a.start,
                    end: a.end,
                    copy: *a,
                    late,
                });
            }
        }
        self.next_exp = self.next_exp.max(a.end);
        for (s, e) in parts {
            self.insert(s, e);
        }
        self.recent.push(first_new);
        outcome
    }

    /// If duplicate `a` is the original of a retransmission that filled a
    /// hole: it was sent before that retransmission (IP ID behind, or TSval
    /// or TSecr older). Its lateness is measured against the hole's
    /// discontinuity.
    fn behind_retransmission(&mut self, a: &Arrival) -> Option<Late> {
        let at = self
            .rare()
            .filled_by_retransmission
            .iter()
            .position(|f| a.start < f.end && a.end > f.start)?;
        let f = self.rare().filled_by_retransmission[at];
        let older = |x: Option<u32>, y: Option<u32>| match (x, y) {
            (Some(x), Some(y)) if x != y => Some((x.wrapping_sub(y) as i32) < 0),
            _ => None,
        };
        let sent_before = match (a.ip_id, f.copy.ip_id) {
            (Some(x), Some(y)) if x != y => Some((x.wrapping_sub(y) as i16) < 0),
            _ => older(a.tsval, f.copy.tsval).or(older(a.tsecr, f.copy.tsecr)),
        };
        if sent_before != Some(true) {
            return None;
        }
        self.rare_mut().filled_by_retransmission.remove(at);
        let d = f.late.discontinuity;
        Some(Late {
            late_ns: a.ts_ns.saturating_sub(d.ts_ns),
            byte_offset: self.received_above(a.end),
            extent: self.arrivals - d.index,
            n: 0,
            gap: None,
            ..f.late
        })
    }

    fn late(
        &mut self,
        a: &Arrival,
        first_new: u64,
        index: u64,
        rtt_ns: Option<u64>,
    ) -> Option<Late> {
        let (_, d) = self.holes.range(..=first_new).next_back()?;
        if first_new >= d.hole_end {
            return None;
        }
        let d = *d;
        let n = self
            .recent
            .newest_first()
            .take_while(|&s| s > first_new)
            .count() as u8;
        // Gaps run forward: a late segment of an older, still open hole
        // after one of a newer hole starts no new gap.
        let gap = match self.last_discontinuity {
            Some((i, _)) if d.index <= i => None,
            prev => {
                self.last_discontinuity = Some((d.index, d.ts_ns));
                Some(prev.map_or((0, 0), |(i, t)| (d.index - i, d.ts_ns.saturating_sub(t))))
            }
        };
        let late_ns = a.ts_ns.saturating_sub(d.ts_ns);
        let mut late = Late {
            discontinuity: d,
            extent: index - d.index,
            byte_offset: self.received_above(a.end),
            late_ns,
            n,
            evidence: Evidence::None,
            gap,
        };
        late.evidence = self.evidence(a, &late, rtt_ns);
        Some(late)
    }

    /// Which evidence decides the late segment's class (strongest first).
    fn evidence(&self, a: &Arrival, late: &Late, rtt_ns: Option<u64>) -> Evidence {
        let d = &late.discontinuity;
        if self
            .rare()
            .retransmitted
            .iter()
            .any(|&(s, e)| a.start < e && a.end > s)
        {
            return Evidence::LocalRetransmit;
        }
        if let (Some(t), Some(dt)) = (a.tsval, d.tsval) {
            if t != dt {
                return Evidence::Timestamp;
            }
        }
        if let (Some(id), Some(did)) = (a.ip_id, d.ip_id) {
            if id != did && !(id == 0 && did == 0) {
                return Evidence::IpId;
            }
        }
        if let (Some(e), Some(de)) = (a.tsecr, d.tsecr) {
            if e != de {
                return Evidence::EchoedTimestamp;
            }
        }
        if rtt_ns.is_some_and(|rtt| late.late_ns < rtt / 2) {
            return Evidence::Timing;
        }
        Evidence::None
    }

    fn judge(&self, a: &Arrival, late: &Late) -> Class {
        let d = &late.discontinuity;
        let original = match late.evidence {
            Evidence::LocalRetransmit => false,
            // Sent before the segment that overtook it: an original.
            Evidence::Timestamp => (a.tsval.unwrap().wrapping_sub(d.tsval.unwrap()) as i32) < 0,
            Evidence::IpId => (a.ip_id.unwrap().wrapping_sub(d.ip_id.unwrap()) as i16) < 0,
            Evidence::EchoedTimestamp => {
                (a.tsecr.unwrap().wrapping_sub(d.tsecr.unwrap()) as i32) < 0
            }
            Evidence::Timing => true,
            Evidence::None => return Class::Ambiguous,
        };
        if original {
            Class::Reordered
        } else {
            Class::Retransmission
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4737's examples number packets; here packet p carries bytes
    /// [(p-1)*100, p*100), as in its §7 ("PayloadSize=100").
    fn arrival(p: u64, ts_ms: u64) -> Arrival {
        Arrival {
            start: EXT_BASE + (p - 1) * 100,
            end: EXT_BASE + p * 100,
            ts_ns: ts_ms * 1_000_000,
            ..Default::default()
        }
    }

    fn run(packets: &[(u64, u64)]) -> Vec<Outcome> {
        let mut d = OrderDetector::default();
        d.start(EXT_BASE);
        packets
            .iter()
            .map(|&(p, t)| d.observe(&arrival(p, t), None))
            .collect()
    }

    /// Late segments with their extent, byte offset and late time.
    fn late_of(out: &[Outcome], packets: &[(u64, u64)]) -> Vec<(u64, u64, u64, u64, u8)> {
        out.iter()
            .zip(packets)
            .filter_map(|(o, &(p, _))| {
                o.late
                    .map(|l| (p, l.extent, l.byte_offset, l.late_ns / 1_000_000, l.n))
            })
            .collect()
    }

    #[test]
    fn rfc4737_7_1_single_packet_reordered() {
        // Table 1: arrival order with DstTime in ms.
        let p = [
            (1, 68),
            (2, 88),
            (3, 108),
            (5, 148),
            (6, 168),
            (7, 188),
            (8, 208),
            (4, 210),
            (9, 228),
            (10, 248),
        ];
        let out = run(&p);
        // Packet 4: extent 4, byte offset 400, late time 62 ms, 4-reordered.
        assert_eq!(late_of(&out, &p), vec![(4, 4, 400, 62, 4)]);
        assert!(out[3].opened_hole); // packet 5 is the discontinuity
        assert_eq!(out[7].late.unwrap().discontinuity.index, 3);
        assert_eq!(out.iter().filter(|o| o.late.is_none()).count(), 9);
    }

    #[test]
    fn rfc4737_7_2_two_packets_reordered() {
        let p = [
            (1, 68),
            (2, 88),
            (3, 108),
            (4, 128),
            (7, 188),
            (5, 189),
            (6, 190),
            (8, 208),
            (9, 228),
            (10, 248),
        ];
        let out = run(&p);
        // Packet 5: e=1, 100 bytes, 1 ms, 1-reordered; packet 6: e=2, 100
        // bytes, 2 ms, not n-reordered. Both tied to packet 7 (index 4).
        assert_eq!(
            late_of(&out, &p),
            vec![(5, 1, 100, 1, 1), (6, 2, 100, 2, 0)]
        );
        assert_eq!(out[5].late.unwrap().discontinuity.index, 4);
        assert_eq!(out[6].late.unwrap().discontinuity.index, 4);
    }

    #[test]
    fn rfc4737_7_3_three_packets_reordered() {
        let p = [
            (1, 68),
            (2, 88),
            (3, 108),
            (7, 188),
            (8, 208),
            (9, 228),
            (10, 248),
            (4, 250),
            (5, 252),
            (6, 256),
            (11, 268),
        ];
        let out = run(&p);
        // Extents 4, 5, 6; byte offsets 400 each; late times 62, 64, 68 ms;
        // packet 4 is 4-reordered, 5 and 6 are not n-reordered.
        assert_eq!(
            late_of(&out, &p),
            vec![(4, 4, 400, 62, 4), (5, 5, 400, 64, 0), (6, 6, 400, 68, 0)]
        );
        for i in [7, 8, 9] {
            assert_eq!(out[i].late.unwrap().discontinuity.index, 3);
        }
    }

    #[test]
    fn rfc4737_7_4_multiple_discontinuities_and_gap() {
        let seq = [1, 2, 3, 6, 7, 4, 5, 8, 9, 10, 12, 13, 11, 14, 15, 16];
        let p: Vec<_> = seq
            .iter()
            .enumerate()
            .map(|(i, &s)| (s, i as u64))
            .collect();
        let out = run(&p);
        let late: Vec<_> = late_of(&out, &p).iter().map(|l| (l.0, l.1)).collect();
        // Packet 4 e=2, packet 5 e=3, packet 11 e=2.
        assert_eq!(late, vec![(4, 2), (5, 3), (11, 2)]);
        // Discontinuities at packet 6 (index 3) and packet 12 (index 10);
        // Gap(packet 12) = 11 - 4 = 7 in the RFC's 1-based positions.
        assert_eq!(out[5].late.unwrap().gap, Some((0, 0)));
        assert_eq!(out[6].late.unwrap().gap, None);
        assert_eq!(out[12].late.unwrap().gap.unwrap().0, 7);
    }

    #[test]
    fn an_older_hole_filled_after_a_newer_one_starts_no_gap() {
        let p: Vec<_> = [1, 3, 5, 4, 2].iter().map(|&s| (s, 0)).collect();
        let out = run(&p);
        assert_eq!(out[3].late.unwrap().gap, Some((0, 0))); // 4, tied to 5
        assert_eq!(out[4].late.unwrap().gap, None); // 2, tied to 3 (older)
        assert_eq!(out[4].late.unwrap().extent, 3);
    }

    /// What a receiving Linux TCP queues out of order: a segment whose
    /// start is beyond rcv_nxt (every byte below received).
    #[test]
    fn above_hole_is_what_tcp_queues_out_of_order() {
        let above = |packets: &[u64]| -> Vec<bool> {
            let p: Vec<_> = packets.iter().map(|&s| (s, 0)).collect();
            run(&p).iter().map(|o| o.above_hole).collect()
        };
        // 4 and 3 wait for 2; 2 fills the hole at rcv_nxt.
        assert_eq!(above(&[1, 4, 3, 2]), [false, true, true, false]);
        // 5 waits for 4 even once 3 is in; 4 then lands at rcv_nxt.
        assert_eq!(
            above(&[1, 3, 5, 2, 4, 6]),
            [false, true, true, false, false, false]
        );
    }

    #[test]
    fn the_issue_example_in_bytes() {
        // 1,2,3,5,6,7,8,4,9,10 with 100-byte payloads: packet 4 has extent
        // 4, byte offset 400, and is 4-reordered.
        let p: Vec<_> = [1, 2, 3, 5, 6, 7, 8, 4, 9, 10]
            .iter()
            .map(|&s| (s, 0))
            .collect();
        let out = run(&p);
        let l = out[7].late.unwrap();
        assert_eq!((l.extent, l.byte_offset, l.n), (4, 400, 4));
    }

    #[test]
    fn wraparound_is_serial_arithmetic() {
        let first = u32::MAX - 150; // the stream crosses 2^32 at byte 150
        let mut u = Unwrap::new(first);
        let mut d = OrderDetector::default();
        d.start(u.ext(first));
        let mut seg = |seq: u32, ts: u64| {
            let start = u.ext(seq);
            let a = Arrival {
                start,
                end: start + 100,
                ts_ns: ts,
                ..Default::default()
            };
            let o = d.observe(&a, None);
            u.advance(d.next_exp());
            o
        };
        assert!(seg(first, 0).late.is_none());
        assert!(seg(first.wrapping_add(200), 1).opened_hole); // past the wrap
        let late = seg(first.wrapping_add(100), 2); // straddles 2^32
        assert_eq!(late.late.unwrap().extent, 1);
        assert!(seg(first.wrapping_add(300), 3).late.is_none());
        assert_eq!(seg(first, 4).class, Class::Duplicate);
    }

    #[test]
    fn duplicates_exact_and_partial() {
        let mut d = OrderDetector::default();
        d.start(0);
        let a = |s: u64, e: u64| Arrival {
            start: s,
            end: e,
            ..Default::default()
        };
        assert_eq!(d.observe(&a(0, 100), None).class, Class::InOrder);
        assert_eq!(d.observe(&a(0, 100), None).class, Class::Duplicate);
        // Overlaps the first 50 bytes received, 50 new in order.
        let o = d.observe(&a(50, 150), None);
        assert_eq!((o.class, o.partial_duplicate), (Class::InOrder, true));
        // A hole [150, 300), then a segment covering received and new bytes.
        assert!(d.observe(&a(300, 400), None).opened_hole);
        let o = d.observe(&a(100, 350), None);
        assert!(o.partial_duplicate);
        assert!(o.late.is_some());
        assert_eq!(d.observe(&a(120, 390), None).class, Class::Duplicate);
        // Data from before tracing started.
        let mut d2 = OrderDetector::default();
        d2.start(1000);
        assert_eq!(d2.observe(&a(900, 1000), None).class, Class::Ambiguous);
    }

    fn ts_arrival(p: u64, tsval: Option<u32>, ip_id: Option<u16>, ts_us: u64) -> Arrival {
        Arrival {
            tsval,
            ip_id,
            ts_ns: ts_us * 1000,
            ..arrival(p, 0)
        }
    }

    fn classify(late: Arrival, jumper: Arrival, rtt_ns: Option<u64>) -> (Class, Evidence) {
        let mut d = OrderDetector::default();
        d.start(EXT_BASE);
        d.observe(&ts_arrival(1, Some(10), Some(1), 0), None);
        d.observe(&jumper, None);
        let o = d.observe(&late, rtt_ns);
        (o.class, o.late.unwrap().evidence)
    }

    #[test]
    fn timestamps_tell_originals_from_retransmissions() {
        let jumper = ts_arrival(3, Some(20), None, 100);
        // Sent before the packet that overtook it.
        let older = ts_arrival(2, Some(19), None, 110);
        assert_eq!(
            classify(older, jumper, None),
            (Class::Reordered, Evidence::Timestamp)
        );
        // Sent after it: a retransmission.
        let newer = ts_arrival(2, Some(25), None, 110);
        assert_eq!(
            classify(newer, jumper, None),
            (Class::Retransmission, Evidence::Timestamp)
        );
        // Across the 32-bit wrap of TSval.
        let j = ts_arrival(3, Some(3), None, 100);
        let before_wrap = ts_arrival(2, Some(u32::MAX - 2), None, 110);
        assert_eq!(classify(before_wrap, j, None).0, Class::Reordered);
    }

    #[test]
    fn ip_id_then_timing_then_ambiguous() {
        // Same TSval (same millisecond): the IPv4 ID decides.
        let jumper = ts_arrival(3, Some(20), Some(500), 100);
        let behind = ts_arrival(2, Some(20), Some(499), 110);
        assert_eq!(
            classify(behind, jumper, None),
            (Class::Reordered, Evidence::IpId)
        );
        let ahead = ts_arrival(2, Some(20), Some(501), 110);
        assert_eq!(
            classify(ahead, jumper, None),
            (Class::Retransmission, Evidence::IpId)
        );
        // IPv6, same TSval: only timing is left. 10 us after the jumper
        // with a 100 us RTT cannot be a retransmission.
        let j6 = ts_arrival(3, Some(20), None, 100);
        let soon = ts_arrival(2, Some(20), None, 110);
        assert_eq!(
            classify(soon, j6, Some(100_000)),
            (Class::Reordered, Evidence::Timing)
        );
        let later = ts_arrival(2, Some(20), None, 400);
        assert_eq!(
            classify(later, j6, Some(100_000)),
            (Class::Ambiguous, Evidence::None)
        );
        assert_eq!(classify(soon, j6, None), (Class::Ambiguous, Evidence::None));
    }

    #[test]
    fn the_echoed_timestamp_decides_within_one_tsval_tick() {
        // IPv6, same TSval: the sender had heard from the receiver more
        // recently when it sent the late one (a retransmission), or less
        // recently (an original sent before the jumper).
        let echo = |p, tsecr, us| Arrival {
            tsecr: Some(tsecr),
            ..ts_arrival(p, Some(20), None, us)
        };
        let jumper = echo(3, 70, 100);
        assert_eq!(
            classify(echo(2, 69, 900), jumper, Some(100_000)),
            (Class::Reordered, Evidence::EchoedTimestamp)
        );
        assert_eq!(
            classify(echo(2, 71, 900), jumper, Some(100_000)),
            (Class::Retransmission, Evidence::EchoedTimestamp)
        );
        assert_eq!(
            classify(echo(2, 70, 900), jumper, Some(100_000)).0,
            Class::Ambiguous
        );
    }

    #[test]
    fn an_original_behind_its_own_retransmission_is_told_apart() {
        let mut d = OrderDetector::default();
        d.start(EXT_BASE);
        d.observe(&ts_arrival(1, Some(10), Some(1), 0), None);
        d.observe(&ts_arrival(3, Some(10), Some(3), 100), None);
        // 2 is late; its retransmission (newer IP ID) fills the hole first.
        let rtx = d.observe(&ts_arrival(2, Some(11), Some(9), 900), None);
        assert_eq!(rtx.class, Class::Retransmission);
        // A second retransmission is just a duplicate.
        let again = d.observe(&ts_arrival(2, Some(12), Some(10), 950), None);
        assert_eq!(
            (again.class, again.behind_retransmission),
            (Class::Duplicate, None)
        );
        // The original (older IP ID) arrives last: late by 900 us against 3.
        let orig = d.observe(&ts_arrival(2, Some(10), Some(2), 1000), None);
        assert_eq!(orig.class, Class::Duplicate);
        let late = orig.behind_retransmission.expect("the late original");
        assert_eq!(late.late_ns, 900_000);
        assert_eq!(late.byte_offset, 100); // packet 3 is above it
                                           // Only once.
        let dup = d.observe(&ts_arrival(2, Some(10), Some(2), 1100), None);
        assert_eq!(dup.behind_retransmission, None);
    }

    #[test]
    fn local_retransmissions_win() {
        let mut d = OrderDetector::default();
        d.start(EXT_BASE);
        d.observe(&ts_arrival(1, Some(10), None, 0), None);
        d.observe(&ts_arrival(3, Some(20), None, 100), None);
        d.local_retransmit(EXT_BASE + 100, EXT_BASE + 200);
        // Its timestamp says original, but this host says it resent it.
        let o = d.observe(&ts_arrival(2, Some(19), None, 110), None);
        assert_eq!(o.class, Class::Retransmission);
        assert_eq!(o.late.unwrap().evidence, Evidence::LocalRetransmit);
    }

    #[test]
    fn state_stays_bounded_when_holes_never_fill() {
        let mut d = OrderDetector::default();
        d.start(0);
        // Every other 100-byte segment lost for good.
        for i in 0..20_000u64 {
            let a = Arrival {
                start: i * 200,
                end: i * 200 + 100,
                ..Default::default()
            };
            d.observe(&a, None);
        }
        assert!(d.above.len() <= MAX_RANGES);
        assert!(d.holes.len() <= MAX_RANGES + 1);
        // A late byte in a recently given-up hole is ambiguous, not a
        // duplicate.
        let (start, end) = *d.rare().abandoned.back().unwrap();
        let old = Arrival {
            start,
            end,
            ..Default::default()
        };
        assert_eq!(d.observe(&old, None).class, Class::Ambiguous);
    }
}
