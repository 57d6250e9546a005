//! A sender's loss detection replayed ACK by ACK — RACK-TLP as a Linux
//! sender runs it, or RFC 6675's DupThresh (the classic policy) — over the
//! order in which the receiving TCP processed the data (its `tcp_probe`
//! view: that order, not the wire's, is what its ACKs reported).
//!
//! It needs the receiver's TCP layer and TCP timestamps; without them the
//! replay works from the wire's late originals ([`super::policy`]).
//!
//! **Transmit times.** When the sender's socket is this host's, from it:
//! its SND.NXT as it took each ACK, since what an ACK releases leaves right
//! after it. Else from its timestamp clock, which ticks every millisecond
//! (Linux): the first segment carrying a new TSval left just after a tick,
//! and between two such segments transmit times are interpolated by
//! sequence number (segments leave in sequence order), put on the
//! receiver's clock by the smallest observed forward delay. Queueing on the
//! paths is then what it was: a segment stuck behind a busy queue has a
//! long round trip, one on an idle queue a short one, and RACK sees both.
//! But a burst sent at once looks spread over its tick, and RACK, which
//! compares transmit times, then finds late segments sent long before
//! those that overtook them: against the lab's unpaced senders the
//! timestamp clock over-predicts RACK-TLP's spurious retransmissions by
//! 1.2-1.9x where their own clock is within ±30% (README).
//!
//! **Clock.** The receiver's, shifted so that transmit and ACK times
//! compare: the sender hears of an arrival when its ACK reached the
//! sender's TCP (measured ACK by ACK when the sender's socket is this
//! host's, else an assumed delay); a retransmission queues with the data
//! sent at the same moment and reaches the receiver when that data did.
//!
//! **The receiver**, replayed too: the real sender's retransmissions (the
//! wire view's classes, or a TSval newer than the data's own tick) are not
//! the replayed sender's, so they only fill what it has not retransmitted
//! and no original of will come (real losses). PAWS is replayed: the
//! replayed retransmissions move TS.Recent, and late originals that it
//! makes two ticks old are discarded (a duplicate then, if already
//! delivered; else still missing).
//!
//! **What the sender does on each ACK**, as Linux 6.x does:
//! * RACK.rtt and RACK.xmit_ts from the newly delivered data, SACKed data
//!   first and then the cumulatively acknowledged (Linux's order in
//!   `tcp_ack`): an ACK that advances the cumulative point over data from
//!   a slow queue leaves RACK.rtt at that data's long round trip;
//! * RACK: a segment is lost when something sent after it was delivered
//!   and it has been out for RACK.rtt + reo_wnd; otherwise the reordering
//!   timer fires then, at least 2 ms later (`TCP_TIMEOUT_MIN_US`);
//!   DupThresh: a segment is lost once more than (DupThresh - 1)
//!   segments' bytes above it are SACKed, and there is no timer;
//! * reo_wnd: 0 before any reordering is seen, in recovery or with
//!   DupThresh segments SACKed; else min(steps · min_RTT/4, SRTT); a DSACK
//!   adds a step at most once a round trip, kept for 16 recoveries;
//! * retransmissions are ACK-clocked (PRR, slow-start reduction bound):
//!   as many as the ACK delivered, at least one, one more if it advanced
//!   the cumulative point;
//! * undo (RACK always, DupThresh if asked; RACK's also by RFC 3522
//!   detection with millisecond timestamps, which the classic sender does
//!   not send): a partial ACK
//!   whose echoed timestamp is older than the first retransmission's stops
//!   retransmitting while any retransmission is out and, once none is,
//!   undoes the episode, unmarking what was marked (Linux takes those off
//!   RACK's time-ordered list: they are not marked again); so does the end
//!   of an episode whose every retransmission proved spurious;
//! * data out longer than the retransmission timeout (at least 200 ms) is
//!   marked lost.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap, HashMap},
};

use super::{AckLog, Assumptions, Source, TcpArrival, TickMark, RTO_MIN_NS};

/// What the ACK-level replay found for one flow.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AckReplay {
    pub spurious: u64,
    pub episodes: u64,
    pub spurious_episodes: u64,
    pub undone: u64,
    /// Start of each episode not undone, seconds from the flow's start.
    pub starts: Vec<f64>,
}

/// Linux: the reordering timer waits at least this long beyond its due.
const TIMER_MIN_NS: u64 = 2_000_000;
/// Linux's TCP timestamp clock.
const TS_TICK_NS: f64 = 1e6;
/// Most segments one hole is tracked for.
const MAX_HOLE_SEGMENTS: u64 = 1 << 14;
const RECOVERY_THRESH: u32 = 16;

/// Transmit times from the sender's timestamp ticks, or from its socket
/// when this host owns it.
pub struct SendClock<'a> {
    marks: &'a [TickMark],
    /// Receiver clock minus sender timestamp clock (ns): the smallest
    /// forward delay seen.
    offset: f64,
    /// The sender's SND.NXT as it took each ACK (`AckLog::sender_sent`):
    /// what each ACK released left right after it.
    sender: &'a [(u64, u64)],
}

impl<'a> SendClock<'a> {
    /// None without at least two ticks. `sender`: the sender socket's
    /// SND.NXT samples, or none.
    pub fn new(marks: &'a [TickMark], sender: &'a [(u64, u64)]) -> Option<Self> {
        if marks.len() < 2 {
            return None;
        }
        let t0 = marks[0].tsval;
        let offset = marks
            .iter()
            .map(|m| m.arrived_ns as f64 - f64::from(m.tsval.wrapping_sub(t0)) * TS_TICK_NS)
            .fold(f64::INFINITY, f64::min);
        Some(Self {
            marks,
            offset,
            sender,
        })
    }

    /// The highest byte sent by `t` (the sender's SND.NXT).
    pub fn sent_by(&self, t: u64) -> u64 {
        let j = self.sender.partition_point(|&(at, _)| at <= t);
        match (j.checked_sub(1), self.sender.get(j)) {
            // What the latest ACK released.
            (Some(_), Some(&(_, nxt))) => nxt,
            (Some(i), None) => self.ticks_sent_by(t).max(self.sender[i].1),
            (None, _) => self.ticks_sent_by(t),
        }
    }

    fn ticks_sent_by(&self, t: u64) -> u64 {
        let t0 = self.marks[0].tsval;
        let at = |m: &TickMark| f64::from(m.tsval.wrapping_sub(t0)) * TS_TICK_NS + self.offset;
        let i = self.marks.partition_point(|m| at(m) <= t as f64);
        match (i.checked_sub(1).map(|j| &self.marks[j]), self.marks.get(i)) {
            (Some(a), Some(b)) => {
                let frac = (t as f64 - at(a)) / (at(b) - at(a)).max(1.0);
                a.seq + (frac.clamp(0.0, 1.0) * b.seq.saturating_sub(a.seq) as f64) as u64
            }
            (Some(a), None) => a.seq,
            (None, _) => self.marks[0].seq,
        }
    }

    /// The sender's timestamp clock at `t` (receiver clock, shifted).
    pub fn tsval_at(&self, t: u64) -> u32 {
        let ticks = ((t as f64 - self.offset) / TS_TICK_NS).max(0.0) as u32;
        self.marks[0].tsval.wrapping_add(ticks)
    }

    /// The latest TSval the original of byte `seq` can have carried: that
    /// of the first tick at or after it (later data left later).
    pub fn tsval_by(&self, seq: u64) -> Option<u32> {
        let i = self.marks.partition_point(|m| m.seq < seq);
        self.marks.get(i).map(|m| m.tsval)
    }

    /// Whether a copy of `seq` carrying `tsval` can be its original (not a
    /// retransmission sent ticks later).
    pub fn original(&self, seq: u64, tsval: Option<u32>) -> bool {
        match (tsval, self.tsval_by(seq)) {
            (Some(v), Some(by)) => (v.wrapping_sub(by) as i32) <= 0,
            _ => true,
        }
    }

    /// When the byte `seq` was sent, on the receiver's clock.
    pub fn sent(&self, seq: u64) -> u64 {
        let i = self.sender.partition_point(|&(_, nxt)| nxt <= seq);
        match i.checked_sub(1) {
            // Released by the latest ACK that found SND.NXT at or below it.
            Some(j) if i < self.sender.len() => self.sender[j].0,
            Some(j) => self.ticks_sent(seq).max(self.sender[j].0),
            None if self.sender.is_empty() => self.ticks_sent(seq),
            None => self.ticks_sent(seq).min(self.sender[0].0),
        }
    }

    fn ticks_sent(&self, seq: u64) -> u64 {
        let t0 = self.marks[0].tsval;
        let i = self.marks.partition_point(|m| m.seq <= seq).max(1) - 1;
        let m = &self.marks[i];
        let ticks = f64::from(m.tsval.wrapping_sub(t0));
        let frac = match self.marks.get(i + 1) {
            Some(n) if n.seq > m.seq => {
                let per_tick = f64::from(n.tsval.wrapping_sub(m.tsval)).max(1.0);
                // (Before the first tick: extrapolated back.)
                (seq as f64 - m.seq as f64) / (n.seq - m.seq) as f64 * per_tick
            }
            _ => 0.0,
        };
        ((ticks + frac.min(1.0e6)) * TS_TICK_NS + self.offset).max(0.0) as u64
    }
}

/// A segment not yet delivered, below the highest one delivered.
#[derive(Clone, Copy, Debug)]
struct Piece {
    end: u64,
    sent: u64,
    lost: bool,
    /// When the replayed sender retransmitted it (sender's ACK clock), in
    /// which episode.
    rtx_at: Option<u64>,
    episode: usize,
    /// Marked lost, then unmarked by an undo before it was retransmitted:
    /// Linux has taken it off RACK's time-ordered list, so RACK never
    /// marks it again (its original or an RTO settles it).
    off_rack: bool,
}

/// One recovery episode.
#[derive(Clone, Copy, Debug)]
struct Episode {
    start_s: f64,
    rtx: u64,
    spurious: u64,
    undone: bool,
}

/// One copy of some data in the trace, indexed by where it starts.
#[derive(Clone, Copy, Debug)]
struct Copy {
    index: usize,
    end: u64,
    tsval: Option<u32>,
    /// The wire classed it the real sender's retransmission.
    retransmission: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Wake {
    /// A replayed retransmission of the piece at this seq arrives.
    Retransmission(u64),
    Dsack,
}

struct Sim<'a> {
    detection: Detection,
    clock: SendClock<'a>,
    arrivals: &'a [TcpArrival],
    /// How long the ACK being replayed took to reach the sender.
    ack_delay: u64,
    /// The real sender's retransmissions: (when, how long after the ACK
    /// before it), in time order.
    transmit_lags: Vec<(u64, u64)>,
    dupthresh: u64,
    mss: u64,
    srtt: u64,
    srtt_samples: u64,
    fresh_rtt: u64,
    min_rtt: u64,
    rcv_nxt: u64,
    highest: u64,
    /// Delivered ranges above `rcv_nxt` (start -> end), and their
    /// segments (each range's bytes over the MSS, rounded up), kept as
    /// they change: loss detection asks on every arrival.
    sacked: BTreeMap<u64, u64>,
    sacked_segments: u64,
    pieces: BTreeMap<u64, Piece>,
    /// Pieces a replayed retransmission delivered (seq -> end, episode):
    /// their originals, when they come, are duplicates (DSACKed).
    by_rtx: BTreeMap<u64, (u64, usize)>,
    /// Every recovery episode so far.
    history: Vec<Episode>,
    // RACK
    xmit: u64,
    rack_rtt: u64,
    reord_seen: bool,
    steps: u64,
    persist: u32,
    dsack_round_until: u64,
    timer: Option<u64>,
    // Recovery
    in_recovery: bool,
    high_seq: u64,
    first_rtx: Option<u64>,
    retrans_out: u64,
    episode_rtx: u64,
    /// RFC 6937 PRR: the window when recovery began, ssthresh, and the
    /// segments delivered since.
    prior_cwnd: u64,
    ssthresh: u64,
    prr_delivered: u64,
    wakes: BinaryHeap<Reverse<(u64, Wake)>>,
    out: AckReplay,
    /// Every arrival by its start: (index, end, TSval, PAWS), to tell
    /// whether an original of some data is still to come.
    by_start: BTreeMap<u64, Vec<Copy>>,
    /// Index of the arrival being replayed.
    index: usize,
    /// The receiver's TS.Recent in the replayed world (RFC 7323 PAWS): the
    /// replayed sender's retransmissions move it, and the late originals
    /// it then makes too old are discarded, as the real receiver does.
    ts_recent: Option<u32>,
}

/// How the replayed sender decides a segment is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detection {
    /// RFC 8985 RACK-TLP as Linux runs it, with its undo (timestamps and
    /// DSACK).
    Rack { dupthresh: u32, reo_wnd_mult: u32 },
    /// RFC 6675 IsLost: more than (DupThresh - 1) segments' bytes SACKed
    /// above; no reordering timer; undo as Linux's or none.
    DupThresh { dupthresh: u32, undo: bool },
}

/// Longest ACK delay taken as measured (longer: a wrapped or unrelated
/// match).
const MAX_ACK_DELAY_NS: u64 = 1_000_000_000;

/// For each arrival, how long its ACK took to reach the sender's TCP, where
/// the sender's side saw it: the first ACK the sender took that
/// acknowledges exactly up to where this arrival brought the receiver (the
/// next arrival's `rcv_nxt`). Duplicate ACKs, which say no more, are not
/// matched.
fn measured_ack_delays(log: &AckLog) -> Vec<Option<u64>> {
    let tcp = &log.tcp;
    if log.sender_acks.is_empty() {
        return vec![None; tcp.len()];
    }
    let mut first: HashMap<u32, u64> = HashMap::with_capacity(log.sender_acks.len());
    for &(ack, t) in &log.sender_acks {
        first.entry(ack).or_insert(t);
    }
    (0..tcp.len())
        .map(|i| {
            let after = tcp.get(i + 1)?.rcv_nxt;
            if after == tcp[i].rcv_nxt {
                return None;
            }
            let at_sender = *first.get(&after)?;
            at_sender
                .checked_sub(tcp[i].t_ns)
                .filter(|&d| d < MAX_ACK_DELAY_NS)
        })
        .collect()
}

/// Longest transmit lag taken as measured.
const MAX_TRANSMIT_LAG_NS: u64 = 10_000_000;

/// For each of the real sender's retransmissions, how long after the last
/// ACK its socket took it left (queued behind its own transmissions, TSQ).
fn transmit_lags(log: &AckLog) -> Vec<(u64, u64)> {
    let mut acked: Vec<u64> = log.sender_acks.iter().map(|&(_, t)| t).collect();
    acked.sort_unstable();
    let mut lags: Vec<(u64, u64)> = log
        .sender_retransmits
        .iter()
        .filter_map(|&r| {
            let i = acked.partition_point(|&t| t <= r);
            let lag = r - acked.get(i.checked_sub(1)?)?;
            (lag <= MAX_TRANSMIT_LAG_NS).then_some((r, lag))
        })
        .collect();
    lags.sort_unstable();
    lags
}

/// How long after deciding it a retransmission at `now` left: as long as
/// the real sender's retransmission nearest in time did (`lags` in time
/// order), else at once.
fn nearest_lag(lags: &[(u64, u64)], now: u64) -> u64 {
    let i = lags.partition_point(|&(t, _)| t < now);
    [i.checked_sub(1), Some(i)]
        .into_iter()
        .flatten()
        .filter_map(|j| lags.get(j))
        .min_by_key(|&&(t, _)| t.abs_diff(now))
        .map_or(0, |&(_, lag)| lag)
}

/// The median of the measured ACK delays, if any were.
pub fn median_ack_delay_ns(log: &AckLog) -> Option<u64> {
    let mut d: Vec<u64> = measured_ack_delays(log).into_iter().flatten().collect();
    if d.is_empty() {
        return None;
    }
    let mid = d.len() / 2;
    Some(*d.select_nth_unstable(mid).1)
}

/// When the sender hears of each arrival (on the replay's clock): after
/// its own measured ACK delay where there is one (else the latest one
/// measured), or the assumed delay; never before the ACK ahead of it (the
/// path keeps ACKs in order).
fn heard_times(log: &AckLog, a: &Assumptions) -> Vec<u64> {
    let assumed = (a.ack_delay_us * 1000.0) as u64;
    let measured = match a.ack_delay_from {
        Source::Sender => measured_ack_delays(log),
        _ => vec![None; log.tcp.len()],
    };
    let mut delay = assumed;
    let mut last = 0;
    log.tcp
        .iter()
        .zip(measured)
        .map(|(arr, m)| {
            delay = m.unwrap_or(delay);
            last = (arr.t_ns + delay).max(last);
            last
        })
        .collect()
}

/// Replays the receiver's TCP-layer arrivals through the sender's loss
/// detection (RACK-TLP or DupThresh).
pub fn run<'a>(
    log: &'a AckLog,
    clock: SendClock<'a>,
    a: &Assumptions,
    detection: Detection,
) -> AckReplay {
    let (dupthresh, mult) = match detection {
        Detection::Rack {
            dupthresh,
            reo_wnd_mult,
        } => (dupthresh, reo_wnd_mult),
        Detection::DupThresh { dupthresh, .. } => (dupthresh, 1),
    };
    let arrivals = &log.tcp[..];
    let Some(first) = arrivals.first() else {
        return AckReplay::default();
    };
    let mut s = Sim {
        detection,
        clock,
        arrivals,
        ack_delay: 0,
        transmit_lags: transmit_lags(log),
        dupthresh: u64::from(dupthresh.max(1)),
        mss: u64::from(a.mss_bytes.max(1)),
        srtt: (a.rtt_us * 1000.0) as u64,
        srtt_samples: 0,
        fresh_rtt: (a.rtt_us * 1000.0) as u64,
        min_rtt: (a.min_rtt_us * 1000.0) as u64,
        rcv_nxt: first.start,
        highest: first.start,
        sacked: BTreeMap::new(),
        sacked_segments: 0,
        pieces: BTreeMap::new(),
        by_rtx: BTreeMap::new(),
        history: Vec::new(),
        xmit: 0,
        rack_rtt: 0,
        reord_seen: false,
        steps: u64::from(mult.max(1)),
        persist: 0,
        dsack_round_until: 0,
        timer: None,
        in_recovery: false,
        high_seq: 0,
        first_rtx: None,
        retrans_out: 0,
        episode_rtx: 0,
        prior_cwnd: 0,
        ssthresh: 0,
        prr_delivered: 0,
        wakes: BinaryHeap::new(),
        out: AckReplay::default(),
        by_start: BTreeMap::new(),
        index: 0,
        ts_recent: None,
    };
    for (i, arr) in arrivals.iter().enumerate() {
        s.by_start.entry(arr.start).or_default().push(Copy {
            index: i,
            end: arr.end,
            tsval: arr.tsval,
            retransmission: arr.retransmitted_until >= arr.end,
        });
    }
    let heard = heard_times(log, a);
    for (i, arr) in arrivals.iter().enumerate() {
        s.index = i;
        let now = heard[i];
        s.ack_delay = now - arr.t_ns;
        s.wake_until(now);
        s.ack(arr, now);
    }
    s.wake_until(u64::MAX);
    s.close_episode();
    let mut out = s.out;
    out.episodes = s.history.len() as u64;
    for e in &s.history {
        let spurious = e.rtx > 0 && e.spurious >= e.rtx;
        out.spurious_episodes += u64::from(spurious || e.undone);
        out.undone += u64::from(e.undone);
        if !e.undone {
            out.starts.push(e.start_s);
        }
    }
    out
}

impl Sim<'_> {
    fn wake_until(&mut self, now: u64) {
        loop {
            let timer = self.timer.filter(|&f| f <= now);
            let next = self
                .wakes
                .peek()
                .map(|Reverse(w)| *w)
                .filter(|w| w.0 <= now);
            match (timer, next) {
                (Some(f), Some((w, _))) if f <= w => self.timer_fires(f),
                (Some(f), None) => self.timer_fires(f),
                (_, Some((w, what))) => {
                    self.wakes.pop();
                    match what {
                        Wake::Retransmission(seq) => self.retransmission_arrives(w, seq),
                        Wake::Dsack => self.dsack(w),
                    }
                }
                (None, None) => return,
            }
        }
    }

    /// The ACK the receiver sent for `arr`, at the sender at `now`.
    fn ack(&mut self, arr: &TcpArrival, now: u64) {
        // A retransmitted prefix (the real sender's copies), then originals
        // GRO merged after it.
        if arr.retransmitted_until > arr.start {
            let rtx = TcpArrival {
                end: arr.retransmitted_until,
                ..*arr
            };
            if !arr.paws {
                self.real_retransmission(&rtx);
            }
            if arr.retransmitted_until >= arr.end {
                return;
            }
            let rest = TcpArrival {
                start: arr.retransmitted_until,
                retransmitted_until: arr.retransmitted_until,
                ..*arr
            };
            return self.ack(&rest, now);
        }
        if arr.start < self.highest && !self.clock.original(arr.start, arr.tsval) {
            // Sent ticks after the original: the real sender's copy.
            if !arr.paws {
                self.real_retransmission(arr);
            }
            return;
        }
        let paws = self.paws_discards(arr.tsval);
        let arr = &TcpArrival { paws, ..*arr };
        self.originals_of_retransmitted(arr, now);
        if arr.paws || arr.end <= self.rcv_nxt {
            return; // a duplicate ACK: nothing new
        }
        let late = arr.start < self.highest;
        if arr.start > self.highest {
            self.open_hole(arr.start);
        }
        let cum = arr.start <= self.rcv_nxt;
        self.left_edge(cum, arr.tsval);
        let mut newly = 0;
        for (k, p) in self.take_pieces(arr.start, arr.end, |_, _, _| true) {
            newly += 1;
            match p.rtx_at {
                Some(sent) => {
                    self.spurious(now, sent, p.episode);
                    // Its retransmission carries the rest of it.
                    self.deliver(k, p.end);
                }
                // Delivered below the highest, never retransmitted.
                None => self.reord_seen = true,
            }
        }
        if arr.end > self.highest {
            newly += (arr.end - self.highest.max(arr.start)).div_ceil(self.mss);
            self.highest = arr.end;
        }
        self.deliver(arr.start, arr.end);
        // The newest byte's transmit time stands for the skb's.
        let sent = self.clock.sent(arr.end.saturating_sub(1));
        self.rack_rtt = now.saturating_sub(sent);
        if sent >= self.xmit {
            // The newest data's round trip: what a segment sent now takes.
            self.fresh_rtt = self.rack_rtt;
        }
        self.xmit = self.xmit.max(sent);
        // SRTT as the sender keeps it (RFC 6298 gain 1/8), from the same
        // samples.
        self.srtt = if self.srtt_samples == 0 {
            self.rack_rtt
        } else {
            (7 * self.srtt + self.rack_rtt) / 8
        };
        self.srtt_samples += 1;
        self.after_ack(now, arr, newly, cum && late);
    }

    /// PAWS in the replayed world (Linux's rule: more than one tick older).
    fn paws_discards(&self, tsval: Option<u32>) -> bool {
        matches!((tsval, self.ts_recent), (Some(v), Some(r)) if (r.wrapping_sub(v) as i32) > 1)
    }

    /// Data accepted at the left edge with `tsval` moves TS.Recent (only
    /// forward, as Linux's `tcp_paws_check(.., 0)` allows).
    fn left_edge(&mut self, at_left_edge: bool, tsval: Option<u32>) {
        if let (true, Some(v)) = (at_left_edge, tsval) {
            if self
                .ts_recent
                .is_none_or(|r| (v.wrapping_sub(r) as i32) >= 0)
            {
                self.ts_recent = Some(v);
            }
        }
    }

    /// Originals of pieces a replayed retransmission already delivered:
    /// that retransmission was spurious.
    fn originals_of_retransmitted(&mut self, arr: &TcpArrival, now: u64) {
        let keys: Vec<(u64, usize)> = self
            .by_rtx
            .range(..arr.end)
            .rev()
            .take_while(|(_, (end, _))| *end > arr.start)
            .map(|(k, (_, e))| (*k, *e))
            .collect();
        for (k, episode) in keys {
            if !self.clock.original(k, arr.tsval) {
                continue;
            }
            self.by_rtx.remove(&k);
            self.count_spurious(episode);
            self.wakes.push(Reverse((now, Wake::Dsack)));
        }
    }

    /// Whether a later arrival carries an original (not newer than the
    /// hole's opener, not discarded) of the byte `seq`.
    fn original_to_come(&self, seq: u64) -> bool {
        self.by_start
            .range(seq.saturating_sub(1 << 17)..=seq)
            .flat_map(|(_, v)| v)
            .any(|c| {
                c.index > self.index
                    && c.end > seq
                    && !c.retransmission
                    && self.clock.original(seq, c.tsval)
            })
    }

    /// Takes the pieces `wanted` that [start, end) delivers. A piece never
    /// retransmitted keeps what lies outside the range (the real sender's
    /// segments need not start where the replay's pieces do); one a
    /// replayed retransmission carries goes whole.
    fn take_pieces(
        &mut self,
        start: u64,
        end: u64,
        wanted: impl Fn(&Self, u64, &Piece) -> bool,
    ) -> Vec<(u64, Piece)> {
        let keys: Vec<u64> = self
            .pieces
            .range(..end)
            .rev()
            .take_while(|(_, p)| p.end > start)
            .filter(|(k, p)| wanted(self, **k, p))
            .map(|(k, _)| *k)
            .collect();
        let mut taken = Vec::with_capacity(keys.len());
        for k in keys {
            let p = self.pieces.remove(&k).expect("key from the map");
            if p.rtx_at.is_some() {
                taken.push((k, p));
                continue;
            }
            if k < start {
                self.pieces.insert(k, Piece { end: start, ..p });
            }
            if p.end > end {
                let sent = self.clock.sent(end).max(p.sent);
                self.pieces.insert(end, Piece { sent, ..p });
            }
            taken.push((
                k.max(start),
                Piece {
                    end: p.end.min(end),
                    ..p
                },
            ));
        }
        taken
    }

    fn real_retransmission(&mut self, arr: &TcpArrival) {
        let filled = self.take_pieces(arr.start, arr.end, |s, k, p| {
            p.rtx_at.is_none() && !s.original_to_come(k.max(arr.start))
        });
        if filled.is_empty() {
            return;
        }
        self.left_edge(arr.start <= self.rcv_nxt, arr.tsval);
        self.deliver(arr.start, arr.end);
        if self.in_recovery && self.rcv_nxt >= self.high_seq {
            self.close_episode();
        }
    }

    /// A hole [highest, start): what it holds was sent before `start`.
    fn open_hole(&mut self, start: u64) {
        let from = self.highest;
        let n = (start - from).div_ceil(self.mss).min(MAX_HOLE_SEGMENTS);
        let step = (start - from).div_ceil(n.max(1));
        for i in 0..n {
            let seq = from + i * step;
            let piece = Piece {
                end: (seq + step).min(start),
                sent: self.clock.sent(seq),
                lost: false,
                rtx_at: None,
                episode: 0,
                off_rack: false,
            };
            self.pieces.insert(seq, piece);
        }
    }

    fn deliver(&mut self, start: u64, end: u64) {
        if start <= self.rcv_nxt {
            self.rcv_nxt = self.rcv_nxt.max(end);
        } else {
            let mss = self.mss;
            let e = self.sacked.entry(start).or_insert(start);
            let before = (*e - start).div_ceil(mss);
            *e = (*e).max(end);
            self.sacked_segments += (*e - start).div_ceil(mss) - before;
        }
        while let Some((&s, &e)) = self.sacked.first_key_value() {
            if s > self.rcv_nxt {
                break;
            }
            self.sacked.pop_first();
            self.sacked_segments -= (e - s).div_ceil(self.mss);
            self.rcv_nxt = self.rcv_nxt.max(e);
        }
    }

    /// A retransmission of `episode` proved spurious; once all of them
    /// have, the receiver's DSACKs undo it (RFC 3708, as Linux does).
    fn count_spurious(&mut self, episode: usize) {
        self.out.spurious += 1;
        let undoes = self.undoes();
        if let Some(e) = self.history.get_mut(episode) {
            e.spurious += 1;
            if undoes && e.spurious >= e.rtx {
                e.undone = true;
            }
        }
    }

    fn spurious(&mut self, now: u64, sent: u64, episode: usize) {
        self.count_spurious(episode);
        self.retrans_out = self.retrans_out.saturating_sub(1);
        self.wakes
            .push(Reverse((now.max(sent + self.srtt), Wake::Dsack)));
    }

    /// Whether the sender undoes spurious recoveries (timestamps, DSACK).
    fn undoes(&self) -> bool {
        match self.detection {
            Detection::Rack { .. } => true,
            Detection::DupThresh { undo, .. } => undo,
        }
    }

    fn dsack(&mut self, now: u64) {
        if now >= self.dsack_round_until {
            self.dsack_round_until = now + self.srtt;
            self.steps = (self.steps + 1).min(255);
            self.persist = RECOVERY_THRESH;
        }
    }

    /// Segments SACKed above the cumulative point.
    fn sacked_segments(&self) -> u64 {
        debug_assert_eq!(
            self.sacked_segments,
            self.sacked
                .iter()
                .map(|(s, e)| (e - s).div_ceil(self.mss))
                .sum::<u64>()
        );
        self.sacked_segments
    }

    /// RFC 6675 IsLost over the outstanding pieces, highest first: lost
    /// once more than (DupThresh - 1) segments' bytes above are SACKed.
    fn dupthresh_marks(&mut self) -> u64 {
        let limit = (self.dupthresh - 1) * self.mss;
        let mut above = 0;
        let mut sacked = self.sacked.iter().rev().peekable();
        let mut marked = 0;
        for (&seq, p) in self.pieces.iter_mut().rev() {
            while let Some((&s, &e)) = sacked.next_if(|(_, &e)| e > seq) {
                above += e - s.max(seq);
            }
            if above > limit && !p.lost && !p.off_rack && p.rtx_at.is_none() {
                p.lost = true;
                marked += 1;
            }
        }
        marked
    }

    fn reo_wnd(&self) -> u64 {
        let sacked = self.sacked_segments();
        if !self.reord_seen && (self.in_recovery || sacked >= self.dupthresh) {
            return 0;
        }
        (self.steps * self.min_rtt / 4).min(self.srtt)
    }

    /// RACK's loss detection at `now`; how many it marked. (Data out for
    /// longer than the retransmission timeout is marked too: the RTO.)
    fn detect_loss(&mut self, now: u64) -> u64 {
        let reo_wnd = self.reo_wnd();
        let rto = RTO_MIN_NS.max(2 * self.srtt);
        let mut marked = 0;
        for p in self.pieces.values_mut() {
            if !p.lost && now >= p.rtx_at.unwrap_or(p.sent) + rto {
                p.lost = true;
                p.off_rack = false;
                p.rtx_at = None;
                marked += 1;
            }
        }
        if let Detection::DupThresh { .. } = self.detection {
            return marked + self.dupthresh_marks();
        }
        let mut wait: Option<u64> = None;
        for p in self.pieces.values_mut() {
            let sent = p.rtx_at.unwrap_or(p.sent);
            if p.lost || p.off_rack || sent >= self.xmit {
                continue;
            }
            let due = sent + self.rack_rtt + reo_wnd;
            if now >= due {
                p.lost = true;
                marked += 1;
            } else {
                wait = Some(wait.map_or(due - now, |w: u64| w.max(due - now)));
            }
        }
        if let Some(w) = wait {
            let fire = now + w + TIMER_MIN_NS;
            self.timer = Some(self.timer.map_or(fire, |f| f.min(fire)));
        }
        marked
    }

    fn after_ack(&mut self, now: u64, arr: &TcpArrival, newly: u64, partial: bool) {
        if self.in_recovery {
            if self.rcv_nxt >= self.high_seq {
                self.close_episode();
            } else if matches!(self.detection, Detection::Rack { .. })
                && partial
                && self.delayed(arr)
            {
                if self.retrans_out > 0 {
                    return; // no retransmission on this ACK
                }
                self.undo();
                return;
            }
        }
        let marked = self.detect_loss(now);
        if marked > 0 && !self.in_recovery {
            self.enter_recovery(now);
        }
        if self.in_recovery {
            let budget = self.prr(now, newly, partial);
            self.retransmit(now, budget);
        }
    }

    /// RFC 6937 PRR as Linux computes it (`tcp_cwnd_reduction`): in
    /// proportion to what was delivered while the pipe is above ssthresh,
    /// up to what was delivered (plus one) below it; the first
    /// retransmission always goes. The window is CUBIC's: ssthresh is 0.7
    /// of the data in flight when recovery began.
    fn prr(&mut self, now: u64, newly: u64, una_advanced: bool) -> u64 {
        self.prr_delivered += newly;
        let outstanding = self
            .clock
            .sent_by(now)
            .max(self.highest)
            .saturating_sub(self.rcv_nxt)
            .div_ceil(self.mss);
        let sacked = self.sacked_segments();
        let lost = self
            .pieces
            .values()
            .filter(|p| p.lost && p.rtx_at.is_none())
            .count() as u64;
        let pipe = outstanding.saturating_sub(sacked + lost) + self.retrans_out;
        let prr_out = self.episode_rtx;
        let sndcnt = if pipe > self.ssthresh {
            (self.prr_delivered * self.ssthresh)
                .div_ceil(self.prior_cwnd.max(1))
                .saturating_sub(prr_out)
        } else {
            let room = self.ssthresh - pipe;
            (self.prr_delivered.saturating_sub(prr_out).max(newly) + u64::from(una_advanced))
                .min(room)
        };
        sndcnt.max(u64::from(prr_out == 0))
    }

    /// The ACK echoes a timestamp older than the first retransmission's:
    /// the data that advanced the cumulative point was an original.
    fn delayed(&self, arr: &TcpArrival) -> bool {
        let Some(first) = self.first_rtx else {
            return false;
        };
        arr.tsval.is_some_and(|_| {
            let original_tick = self.clock.sent(arr.start) as f64 / TS_TICK_NS;
            let rtx_tick = first as f64 / TS_TICK_NS;
            original_tick.floor() < rtx_tick.floor()
        })
    }

    fn enter_recovery(&mut self, now: u64) {
        // Linux's high_seq: SND.NXT when recovery starts.
        let snd_nxt = self.clock.sent_by(now).max(self.highest);
        self.in_recovery = true;
        self.high_seq = snd_nxt;
        self.prior_cwnd = snd_nxt.saturating_sub(self.rcv_nxt).div_ceil(self.mss);
        self.ssthresh = self.prior_cwnd * 7 / 10;
        self.prr_delivered = 0;
        self.first_rtx = None;
        self.episode_rtx = 0;
        self.history.push(Episode {
            start_s: now as f64 / 1e9,
            rtx: 0,
            spurious: 0,
            undone: false,
        });
    }

    fn close_episode(&mut self) {
        if !self.in_recovery {
            return;
        }
        self.in_recovery = false;
        self.persist = self.persist.saturating_sub(1);
        if self.persist == 0 {
            self.steps = 1;
        }
    }

    fn undo(&mut self) {
        for p in self.pieces.values_mut() {
            if p.lost && p.rtx_at.is_none() {
                p.off_rack = true;
            }
            p.lost = false;
        }
        self.in_recovery = false;
        if let Some(e) = self.history.last_mut() {
            e.undone = true;
        }
    }

    fn retransmit(&mut self, now: u64, budget: u64) {
        // It leaves after the sender's transmit lag (decided at `now`).
        let leaves = now + nearest_lag(&self.transmit_lags, now);
        // It queues with the data sent with it, and reaches the receiver
        // when that did (else: one round trip of the newest data).
        let acked = match self.queued_with(leaves) {
            Some(reached) => reached.max(leaves) + self.ack_delay,
            None => now + self.fresh_rtt.max(self.min_rtt),
        };
        let mut sent = Vec::new();
        for (&seq, p) in self.pieces.iter_mut() {
            if sent.len() as u64 == budget {
                break;
            }
            if p.lost && p.rtx_at.is_none() {
                p.rtx_at = Some(now);
                p.episode = self.history.len().saturating_sub(1);
                sent.push(seq);
            }
        }
        for seq in sent {
            self.first_rtx.get_or_insert(now);
            self.retrans_out += 1;
            self.episode_rtx += 1;
            if let Some(e) = self.history.last_mut() {
                e.rtx += 1;
            }
            self.wakes.push(Reverse((acked, Wake::Retransmission(seq))));
        }
    }

    /// When the data the sender sent at `now` reached the receiver (its
    /// first copy in the trace): a retransmission sent then queues with it.
    fn queued_with(&self, now: u64) -> Option<u64> {
        let seq = self.clock.sent_by(now);
        let (_, copies) = self.by_start.range(..=seq).next_back()?;
        let c = copies.iter().find(|c| c.end > seq)?;
        Some(self.arrivals[c.index].t_ns)
    }

    fn retransmission_arrives(&mut self, at_sender: u64, seq: u64) {
        let Some(p) = self.pieces.remove(&seq) else {
            return; // its original came first
        };
        self.by_rtx.insert(seq, (p.end, p.episode));
        self.retrans_out = self.retrans_out.saturating_sub(1);
        let tsval = self.clock.tsval_at(p.rtx_at.unwrap_or(at_sender));
        self.left_edge(seq <= self.rcv_nxt, Some(tsval));
        self.deliver(seq, p.end);
        let sent = p.rtx_at.unwrap_or(at_sender);
        self.rack_rtt = at_sender.saturating_sub(sent);
        self.xmit = self.xmit.max(sent);
        let marked = self.detect_loss(at_sender);
        if marked > 0 && !self.in_recovery {
            self.enter_recovery(at_sender);
        }
        if self.in_recovery {
            if self.rcv_nxt >= self.high_seq {
                self.close_episode();
            } else {
                self.retransmit(at_sender, 1);
            }
        }
    }

    fn timer_fires(&mut self, now: u64) {
        self.timer = None;
        let marked = self.detect_loss(now);
        if marked > 0 && !self.in_recovery {
            self.enter_recovery(now);
        }
        if self.in_recovery {
            self.retransmit(now, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::Source;

    const MSS: u64 = 1000;
    /// One segment every 10 µs, 50 µs on the way; TSval ticks every 1 ms.
    const GAP: u64 = 10_000;
    const DELAY: u64 = 50_000;

    fn sent(i: u64) -> u64 {
        i * GAP
    }

    fn tsval(i: u64) -> u32 {
        (1000 + sent(i) / 1_000_000) as u32
    }

    /// Segments 0..n arriving at their natural time, except `late`
    /// (index, extra delay) and `lost` (never arrive as originals; the real
    /// sender's retransmission arrives at the given time), with the
    /// receiver's `rcv_nxt` as each arrives.
    fn trace(n: u64, late: &[(u64, u64)], lost: &[(u64, u64)]) -> AckLog {
        let mut arrivals: Vec<TcpArrival> = (0..n)
            .filter(|i| !lost.iter().any(|(l, _)| l == i))
            .map(|i| {
                let extra = late.iter().find(|(l, _)| *l == i).map_or(0, |(_, d)| *d);
                TcpArrival {
                    t_ns: sent(i) + DELAY + extra,
                    start: i * MSS,
                    end: (i + 1) * MSS,
                    tsval: Some(tsval(i)),
                    retransmitted_until: i * MSS,
                    ..TcpArrival::default()
                }
            })
            .collect();
        for &(i, at) in lost {
            arrivals.push(TcpArrival {
                t_ns: at,
                start: i * MSS,
                end: (i + 1) * MSS,
                tsval: Some(tsval(i) + 5),
                retransmitted_until: (i + 1) * MSS,
                ..TcpArrival::default()
            });
        }
        arrivals.sort_by_key(|a| a.t_ns);
        let mut above = BTreeMap::new();
        let mut rcv_nxt = 0;
        for a in &mut arrivals {
            a.rcv_nxt = rcv_nxt as u32;
            above.insert(a.start, a.end);
            while let Some((&s, &e)) = above.first_key_value() {
                if s > rcv_nxt {
                    break;
                }
                above.pop_first();
                rcv_nxt = rcv_nxt.max(e);
            }
        }
        let ticks = (0..n)
            .filter(|i| *i == 0 || tsval(*i) != tsval(i - 1))
            .map(|i| TickMark {
                seq: i * MSS,
                tsval: tsval(i),
                arrived_ns: sent(i) + DELAY,
            })
            .collect();
        AckLog {
            tcp: arrivals,
            ticks,
            ..AckLog::default()
        }
    }

    fn assumptions() -> Assumptions {
        Assumptions {
            rtt_us: 100.0,
            rtt_from: Source::Given,
            min_rtt_us: 100.0,
            queueing_us: None,
            ack_delay_us: 50.0,
            ack_delay_from: Source::Given,
            send_times_from: Source::Trace,
            bottleneck_bps: 8e8,
            bottleneck_from: Source::Given,
            link_bps: 8e8,
            flows_sharing: 1.0,
            queue_bdp: 1.0,
            mss_bytes: MSS as u32,
            send_interval_us: 10.0,
            duration_s: 0.05,
            tcp_layer_whole: true,
            ack_level: true,
            late_copies_lost: 0,
            ack_log_shed: false,
            sharing: None,
        }
    }

    const RACK: Detection = Detection::Rack {
        dupthresh: 3,
        reo_wnd_mult: 1,
    };

    fn replay_with(log: &AckLog, detection: Detection) -> AckReplay {
        let clock = SendClock::new(&log.ticks, &log.sender_sent).unwrap();
        run(log, clock, &assumptions(), detection)
    }

    fn replay_log(log: &AckLog) -> AckReplay {
        replay_with(log, RACK)
    }

    fn replay(late: &[(u64, u64)], lost: &[(u64, u64)]) -> AckReplay {
        replay_log(&trace(5000, late, lost))
    }

    #[test]
    fn transmit_times_come_from_the_ticks() {
        let log = trace(5000, &[], &[]);
        let clock = SendClock::new(&log.ticks, &log.sender_sent).unwrap();
        // 1 ms per 100 segments, on the receiver's clock (+ the delay).
        for i in [0, 150, 2_345] {
            let got = clock.sent(i * MSS) as i64;
            assert!(
                (got - (sent(i) + DELAY) as i64).abs() <= 1_000,
                "{i}: {got}"
            );
        }
        assert!(clock.original(1500 * MSS, Some(tsval(1500))));
        assert!(!clock.original(1500 * MSS, Some(tsval(1500) + 3)));
    }

    #[test]
    fn the_senders_own_clock_keeps_a_burst_together() {
        // Segments 100-199 left in one burst at 1 ms (one ACK released
        // them) and reached the receiver 10 µs apart; 150 is 60 µs late.
        // Spread over their tick by sequence, 150 looks sent 10-60 µs
        // before the segments that overtook it, more than the 25 µs
        // window: retransmitted. Sent with them, it is not lost to RACK.
        let mut log = trace(300, &[(150, 60_000)], &[]);
        assert_eq!(replay_log(&log).spurious, 1);
        log.sender_sent = (0..300)
            .filter(|i| !(101..200).contains(i))
            .map(|i| (sent(i), i * MSS))
            .collect();
        let clock = SendClock::new(&log.ticks, &log.sender_sent).unwrap();
        assert_eq!(clock.sent(150 * MSS), sent(100));
        assert_eq!(clock.sent(200 * MSS), sent(200));
        // What the ACK at 1 ms released: up to 200.
        assert_eq!(clock.sent_by(sent(100) + 5_000), 200 * MSS);
        assert_eq!(replay_log(&log).spurious, 0);
    }

    #[test]
    fn in_order_arrivals_need_nothing() {
        let r = replay(&[], &[]);
        assert_eq!((r.spurious, r.episodes), (0, 0));
    }

    #[test]
    fn a_segment_late_past_the_window_is_retransmitted_spuriously_and_undone() {
        // 400 µs late: the window is min_RTT/4 = 25 µs.
        let r = replay(&[(2000, 400_000)], &[]);
        assert_eq!((r.spurious, r.episodes, r.undone), (1, 1, 1));
        assert!(r.starts.is_empty(), "an undone episode reduces nothing");
    }

    #[test]
    fn a_segment_late_within_the_window_is_left_alone() {
        // 15 µs late: only what was sent 10 µs after it overtook it.
        let r = replay(&[(2000, 15_000)], &[]);
        assert_eq!((r.spurious, r.episodes), (0, 0));
    }

    #[test]
    fn a_real_loss_is_retransmitted_and_not_spurious() {
        let r = replay(&[], &[(2000, sent(2040) + DELAY)]);
        assert_eq!(r.spurious, 0);
        assert_eq!(r.episodes, 1);
        assert_eq!(r.undone, 0);
        assert_eq!(r.starts.len(), 1);
    }

    #[test]
    fn each_ack_is_heard_after_its_own_measured_delay() {
        // Segment 10 is 35 µs late: arrivals 10..12 are duplicate ACKs.
        let mut log = trace(20, &[(10, 35_000)], &[]);
        // The sender took every ACK that moved rcv_nxt 80 µs after the
        // arrival, except the one for arrival 5: 150 µs.
        let next: Vec<u32> = log.tcp.iter().skip(1).map(|a| a.rcv_nxt).collect();
        for (i, a) in log.tcp.iter().enumerate().take(log.tcp.len() - 1) {
            if next[i] != a.rcv_nxt {
                let d = if i == 5 { 150_000 } else { 80_000 };
                log.sender_acks.push((next[i], a.t_ns + d));
            }
        }
        assert_eq!(median_ack_delay_ns(&log), Some(80_000));
        let a = Assumptions {
            ack_delay_us: 80.0,
            ack_delay_from: Source::Sender,
            ..assumptions()
        };
        let heard = heard_times(&log, &a);
        let t: Vec<u64> = log.tcp.iter().map(|a| a.t_ns).collect();
        assert_eq!(heard[4], t[4] + 80_000);
        assert_eq!(heard[5], t[5] + 150_000);
        // Behind the slow ACK, in order: not before it.
        assert_eq!(heard[6], heard[5]);
        // Duplicate ACKs keep the latest delay measured.
        let dup = log.tcp.iter().position(|a| a.start == 11 * MSS).unwrap();
        assert_eq!(heard[dup], (t[dup] + 80_000).max(heard[dup - 1]));
        // The last arrival has no next one to say what its ACK was.
        let last = t.len() - 1;
        assert_eq!(heard[last], t[last] + 80_000);
    }

    #[test]
    fn without_measurements_every_ack_takes_the_assumed_delay() {
        let log = trace(50, &[], &[]);
        let heard = heard_times(&log, &assumptions());
        assert!(log
            .tcp
            .iter()
            .zip(&heard)
            .all(|(a, h)| *h == a.t_ns + 50_000));
        assert_eq!(median_ack_delay_ns(&log), None);
    }

    #[test]
    fn a_real_retransmission_cut_differently_still_fills_its_hole() {
        // Segment 2000 is lost, and the real sender's retransmission (in
        // two pieces that do not start where the replay's piece does, as
        // after re-segmenting) arrives before the replayed sender would
        // retransmit. The hole must close, or no later recovery ever ends:
        // segment 3000 is late past the window (an episode, undone), 4000
        // and 4500 are lost (an episode each).
        let at = sent(2001) + DELAY + 500;
        let lost = [
            (2000, at),
            (4000, sent(4040) + DELAY),
            (4500, sent(4540) + DELAY),
        ];
        let mut log = trace(5000, &[(3000, 400_000)], &lost);
        let i = log.tcp.iter().position(|a| a.start == 2000 * MSS).unwrap();
        // Sent as soon as the hole showed: the timestamp of then.
        let whole = TcpArrival {
            tsval: Some(tsval(2001)),
            ..log.tcp[i]
        };
        let cut = 2000 * MSS + 944;
        log.tcp[i] = TcpArrival {
            end: cut,
            retransmitted_until: cut,
            ..whole
        };
        let tail = TcpArrival {
            start: cut,
            t_ns: at + 200,
            rcv_nxt: cut as u32,
            ..whole
        };
        log.tcp.insert(i + 1, tail);
        let r = replay_log(&log);
        assert_eq!((r.spurious, r.episodes, r.undone), (1, 3, 1));
    }

    #[test]
    fn dupthresh_retransmits_a_segment_three_reordered_not_two() {
        let classic = |late_us: u64, undo: bool| {
            let log = trace(5000, &[(2000, late_us * 1000)], &[]);
            replay_with(&log, Detection::DupThresh { dupthresh: 3, undo })
        };
        // 25 µs late: the two segments sent after it arrive first.
        let r = classic(25, false);
        assert_eq!((r.spurious, r.episodes), (0, 0));
        // 35 µs late: three did, and the third's ACK marks it lost 50 µs
        // (the ACK delay) before its own ACK comes.
        let r = classic(35, false);
        assert_eq!((r.spurious, r.episodes, r.undone), (1, 1, 0));
        assert_eq!(r.starts.len(), 1, "without undo the window is cut");
        // With Linux's undo, the DSACK for its only retransmission undoes
        // the episode.
        let r = classic(35, true);
        assert_eq!((r.spurious, r.episodes, r.undone), (1, 1, 1));
        assert!(r.starts.is_empty());
    }

    #[test]
    fn a_retransmission_leaves_as_late_as_the_real_ones_nearby_did() {
        let log = AckLog {
            // The sender took ACKs at 100, 200, 300 and 900 µs, and
            // retransmitted at 210 µs and 950 µs.
            sender_acks: [100, 200, 300, 900]
                .iter()
                .map(|&us| (0, us * 1000))
                .collect(),
            sender_retransmits: vec![210_000, 950_000],
            ..AckLog::default()
        };
        let lags = transmit_lags(&log);
        assert_eq!(lags, vec![(210_000, 10_000), (950_000, 50_000)]);
        // Nearest in time: the first lag up to 580 µs, the second after;
        // none measured, none taken.
        assert_eq!(nearest_lag(&lags, 0), 10_000);
        assert_eq!(nearest_lag(&lags, 570_000), 10_000);
        assert_eq!(nearest_lag(&lags, 600_000), 50_000);
        assert_eq!(nearest_lag(&lags, 5_000_000), 50_000);
        assert_eq!(nearest_lag(&[], 600_000), 0);
    }
}
