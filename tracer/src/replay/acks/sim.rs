//! What the replayed sender does on each ACK, and what the replayed
//! receiver does with each copy of the data.
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
//!   not send): a partial ACK whose echoed timestamp is older than the
//!   first retransmission's stops retransmitting while any retransmission
//!   is out and, once none is, undoes the episode, unmarking what was
//!   marked (Linux takes those off RACK's time-ordered list: they are not
//!   marked again); so does the end of an episode whose every
//!   retransmission proved spurious;
//! * data out longer than the retransmission timeout (at least 200 ms) is
//!   marked lost.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap},
};

use super::{
    clock::{SendClock, TS_TICK_NS},
    timing::{nearest_lag, transmit_lags},
    AckReplay, Detection,
};
use crate::replay::{AckLog, Assumptions, TcpArrival, RTO_MIN_NS};

/// Linux: the reordering timer waits at least this long beyond its due.
const TIMER_MIN_NS: u64 = 2_000_000;
/// Most segments one hole is tracked for.
const MAX_HOLE_SEGMENTS: u64 = 1 << 14;
const RECOVERY_THRESH: u32 = 16;

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
struct TracedCopy {
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

pub(super) struct Sim<'a> {
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
    by_start: BTreeMap<u64, Vec<TracedCopy>>,
    /// Index of the arrival being replayed.
    index: usize,
    /// The receiver's TS.Recent in the replayed world (RFC 7323 PAWS): the
    /// replayed sender's retransmissions move it, and the late originals
    /// it then makes too old are discarded, as the real receiver does.
    ts_recent: Option<u32>,
}

impl<'a> Sim<'a> {
    /// The replay's start: nothing sent, nothing heard (none without
    /// arrivals).
    pub(super) fn new(
        log: &'a AckLog,
        clock: SendClock<'a>,
        a: &Assumptions,
        detection: Detection,
    ) -> Option<Self> {
        let (dupthresh, mult) = match detection {
            Detection::Rack {
                dupthresh,
                reo_wnd_mult,
                ..
            } => (dupthresh, reo_wnd_mult),
            Detection::DupThresh { dupthresh, .. } => (dupthresh, 1),
        };
        let arrivals = &log.tcp[..];
        let first = arrivals.first()?;
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
            s.by_start.entry(arr.start).or_default().push(TracedCopy {
                index: i,
                end: arr.end,
                tsval: arr.tsval,
                retransmission: arr.retransmitted_until >= arr.end,
            });
        }
        Some(s)
    }

    /// Every arrival heard at `heard` (its time on the replay's clock), in
    /// order; what the sender did.
    pub(super) fn replay(mut self, heard: &[u64]) -> AckReplay {
        let arrivals = self.arrivals;
        for (i, arr) in arrivals.iter().enumerate() {
            self.index = i;
            let now = heard[i];
            self.ack_delay = now - arr.t_ns;
            self.wake_until(now);
            self.ack(arr, now);
        }
        self.wake_until(u64::MAX);
        self.close_episode();
        let mut out = std::mem::take(&mut self.out);
        out.episodes = self.history.len() as u64;
        for e in &self.history {
            let spurious = e.rtx > 0 && e.spurious >= e.rtx;
            out.spurious_episodes += u64::from(spurious || e.undone);
            out.undone += u64::from(e.undone);
            if !e.undone {
                out.starts.push(e.start_s);
            }
        }
        out
    }
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

    /// A DSACK reaches the sender: RACK widens its reordering window (once
    /// a round trip), if the receiver sends them.
    fn dsack(&mut self, now: u64) {
        if matches!(self.detection, Detection::Rack { dsack: false, .. }) {
            return;
        }
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
