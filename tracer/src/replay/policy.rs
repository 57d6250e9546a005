//! Sender loss-detection policies, replayed over a flow's [`FlowLog`].
//!
//! Everything runs on the receiver's clock: a sender reacts to an arrival
//! half a round trip after it (the ACK's way back), and what it then sends
//! arrives half a round trip later; shifting the sender's clock by the
//! return half makes "the sender hears of arrival t" happen at t and "its
//! retransmission arrives" at t + RTT.

use std::{cmp::Reverse, collections::BinaryHeap, collections::HashSet};

use serde::Serialize;

use super::{
    acks,
    throughput::{self, Congestion, Path, Reductions, Start, Timeouts, Undone},
    Assumptions, FlowLog, LateOriginal, Refill, TcpArrival, RTO_MIN_NS,
};

/// A sender's loss detection, with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "name", rename_all = "kebab-case")]
pub enum Policy {
    /// RFC 5681 fast retransmit with RFC 6675 SACK loss marking: a segment
    /// is lost once more than (DupThresh - 1) segments' bytes above it are
    /// SACKed. No reordering adaptation (Windows before RACK-TLP), and no
    /// TCP timestamps. `undo` (off by default) undoes a recovery once the
    /// receiver's DSACKs prove all its retransmissions spurious (RFC 3708,
    /// as Linux does without timestamps: the lab's classic guest); a late
    /// original tells this sender nothing sooner, so the recovery goes on
    /// retransmitting for its round trip.
    Classic { dupthresh: u32, undo: bool },
    /// The same, with the threshold raised to the reordering degree each
    /// time reordering is seen (Linux before RACK: tcp_reordering up to
    /// tcp_max_reordering).
    ///
    /// `undo` (all policies; always for RACK-TLP ACK by ACK): timestamp-based spurious recovery
    /// detection as Linux does it (RFC 3522 Eifel detection; RFC 3708 with
    /// DSACK). Once an ACK for an original sent before the episode's first
    /// retransmission arrives, no further segment is retransmitted in that
    /// episode; an episode whose retransmissions all prove spurious is
    /// undone: no congestion window reduction.
    LinuxAdaptive { initial: u32, max: u32, undo: bool },
    /// RFC 8985 RACK-TLP: time-based marking with reo_wnd =
    /// reo_wnd_mult · min_RTT/4 (at most SRTT), DSACK-driven growth that
    /// persists 16 recoveries, a zero window while SACKed >= DupThresh
    /// before any reordering is seen, and tail loss probes after 2·SRTT.
    RackTlp {
        dupthresh: u32,
        reo_wnd_mult: u32,
        undo: bool,
    },
}

impl Policy {
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Classic { .. } => "classic",
            Policy::LinuxAdaptive { .. } => "linux-adaptive",
            Policy::RackTlp { .. } => "rack-tlp",
        }
    }
}

/// One policy's replay of one flow (or, added, of several).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyOutcome {
    pub name: &'static str,
    pub policy: Policy,
    /// Late originals it would have retransmitted before they arrived.
    pub spurious_retransmissions: u64,
    /// Loss recoveries, spurious or not.
    pub recovery_episodes: u64,
    pub spurious_recovery_episodes: u64,
    /// Spurious recoveries undone (their window reduction reverted).
    pub undone_recovery_episodes: u64,
    /// Tail loss probes sent (RACK-TLP only: arrival gaps over 2·SRTT).
    pub loss_probes: u64,
    /// Window reductions (recoveries not undone) per data segment.
    pub loss_event_rate: f64,
    /// The round trip its slow start crossed ([`Assumptions::slow_start_rtt_us`]).
    pub slow_start_rtt_us: f64,
    /// Retransmission timeouts: RFC 6675 finds a lost retransmission by
    /// its timer alone ([`retransmission_timeouts`]); RACK-TLP by a later
    /// delivery, within round trips (none).
    pub retransmission_timeouts: u64,
    /// CUBIC (β 0.7, C 0.4) over the flow's own transfer: slow start
    /// from 10 segments, a reduction at each recovery not undone where the
    /// trace put it, capped by the bottleneck and its queue.
    pub estimated_goodput_bps: f64,
    /// The least and most `estimated_goodput_bps` over what the receiver's
    /// view cannot tell ([`PolicyOutcome::with_range`]): how sure the
    /// estimate is.
    pub estimated_goodput_range_bps: (f64, f64),
    pub reno_goodput_bps: f64,
    /// Closed forms at `loss_event_rate`, as a cross-check.
    pub mathis_bps: f64,
    pub padhye_bps: f64,
    pub cubic_response_bps: f64,
}

impl PolicyOutcome {
    /// `policy`'s outcome on `log` under `a`, with the range of its
    /// estimate over what the receiver's view cannot tell: whether the
    /// real sender undoes spurious recoveries (all it could, or none), the
    /// bottleneck's queue (half and twice the assumed; the others', or the
    /// flow's own), and where its
    /// first slow start ended (HyStart's exit at the link, or the queue's
    /// overflow), which a flow without a recovery or a timeout has none
    /// of; and, for a flow that had less than its fair share of the link,
    /// whether it would have kept to that part.
    /// (The path changes the transfer, not the detection, which runs
    /// once for it; the undo only matters with spurious recoveries: a
    /// report's cost stays within about twice the estimate's.)
    pub fn with_range(policy: &Policy, log: &FlowLog, a: &Assumptions) -> Self {
        let (r, probes) = policy.recover(log, a);
        let mut o = policy.outcome(&r, probes, log, a);
        let (mut lo, mut hi) = (o.estimated_goodput_bps, o.estimated_goodput_bps);
        let mut widen = |e: f64| (lo, hi) = (lo.min(e), hi.max(e));
        if o.recovery_episodes + o.retransmission_timeouts > 0 {
            let queue = |by| Assumptions {
                queue_bdp: a.queue_bdp * by,
                ..*a
            };
            let hystart = Assumptions {
                hystart: !a.hystart,
                ..*a
            };
            for path in [queue(0.5), queue(2.0), hystart] {
                widen(policy.outcome(&r, probes, log, &path).estimated_goodput_bps);
            }
            if a.min_rtt_us > 0.0 && a.rtt_us > a.min_rtt_us {
                // The queueing the flow met may have been its own (a
                // sender's own egress, a path it alone filled) rather than
                // the others' at a shared queue: its window then fills the
                // link from the least round trip's product, and a
                // reduction drains the queue before it costs the link.
                // (The window the path holds is the same.)
                let own = Assumptions {
                    rtt_us: a.min_rtt_us,
                    queue_bdp: a.rtt_us / a.min_rtt_us * (1.0 + a.queue_bdp) - 1.0,
                    ..*a
                };
                widen(policy.outcome(&r, probes, log, &own).estimated_goodput_bps);
            }
        }
        // A flow that had less than its fair share of the link may have
        // kept to that part (the others' senders as they were) rather
        // than claimed the share the estimate gives it.
        let kept = a.sharing.map(|s| a.link_bps * s.part);
        if let Some(kept) = kept.filter(|&k| k < a.bottleneck_bps) {
            let path = Assumptions {
                bottleneck_bps: kept,
                ..*a
            };
            widen(policy.outcome(&r, probes, log, &path).estimated_goodput_bps);
        }
        if o.spurious_recovery_episodes > 0 {
            for on in [true, false] {
                if (a.receiver_dsack, a.timestamps) != (on, on) {
                    let undo = Assumptions {
                        receiver_dsack: on,
                        timestamps: on,
                        ..*a
                    };
                    widen(policy.run(log, &undo).estimated_goodput_bps);
                }
            }
        }
        o.estimated_goodput_range_bps = (lo, hi);
        o
    }

    pub fn add(&mut self, o: &PolicyOutcome) {
        self.spurious_retransmissions += o.spurious_retransmissions;
        self.recovery_episodes += o.recovery_episodes;
        self.spurious_recovery_episodes += o.spurious_recovery_episodes;
        self.undone_recovery_episodes += o.undone_recovery_episodes;
        self.loss_probes += o.loss_probes;
        self.retransmission_timeouts += o.retransmission_timeouts;
        self.estimated_goodput_bps += o.estimated_goodput_bps;
        self.estimated_goodput_range_bps.0 += o.estimated_goodput_range_bps.0;
        self.estimated_goodput_range_bps.1 += o.estimated_goodput_range_bps.1;
        self.reno_goodput_bps += o.reno_goodput_bps;
        self.mathis_bps += o.mathis_bps;
        self.padhye_bps += o.padhye_bps;
        self.cubic_response_bps += o.cubic_response_bps;
        // A rate or a round trip does not add; the sum's is not
        // meaningful per flow.
        self.loss_event_rate = 0.0;
        self.slow_start_rtt_us = 0.0;
    }
}

/// The loss detector's running state.
#[derive(Default)]
struct Recovery<'a> {
    /// Until when the current episode lasts (receiver clock, ns).
    until: u64,
    active: bool,
    episodes: u64,
    spurious_episodes: u64,
    spurious: u64,
    /// Episode start times, seconds.
    starts: Vec<f64>,
    /// Episodes the DSACKs undid (without timestamps' undo): from their
    /// start until the last of their retransmissions' DSACKs, seconds.
    undone_spans: Vec<(f64, f64)>,
    /// When the next retransmission can go out: in recovery a sender sends
    /// about β (0.7) segments per segment delivered (RFC 6937 PRR), so
    /// segments marked lost together leave one by one.
    rtx_clock: u64,
    /// Spacing of those retransmissions, ns, when the receiver's TCP layer
    /// is not in the trace.
    rtx_interval: u64,
    /// The receiver's TCP-layer arrivals, when traced: each is an ACK, and
    /// PRR clocks retransmissions out by them (β per delivery).
    deliveries: &'a [TcpArrival],
    /// Deliveries owed to PRR before the next retransmission (fraction).
    prr_credit: f64,
    rtt: u64,
    /// Linux's undo (see [`Policy::LinuxAdaptive`]); `eifel`: by
    /// timestamps too, not only by DSACK (see [`Policy::Classic`]).
    undo: bool,
    eifel: bool,
    /// The current episode: its first retransmission; when an original
    /// sent before it was delivered (no retransmission after that); whether
    /// it retransmitted a real loss.
    first_rtx: Option<u64>,
    last_rtx: u64,
    stop_at: u64,
    real: bool,
    undone: u64,
    /// The current episode's retransmissions, and when its late originals
    /// delivered so far arrived (they clock out retransmissions too).
    episode_rtx: u64,
    episode_arrivals: Vec<u64>,
    /// The holes marked together (by the opening of the first) and how
    /// many of them PRR has retransmitted.
    marking: (u64, u64),
    mss: u64,
}

/// What became of a segment marked lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marked {
    /// Its original arrived before its turn to be retransmitted came.
    NotSent,
    /// Retransmitted at this time, though the original was on its way.
    Spurious { sent: u64 },
    /// Retransmitted: the original was lost.
    Real,
}

/// What clocks a retransmission out.
#[derive(Clone, Copy)]
enum Clock {
    /// PRR counted by what was delivered ([`Recovery::released`]): the
    /// hole opened at `opened` (holes marked together share it);
    /// `overtakers` segments above it had arrived since its marking when
    /// its original did.
    Prr { opened: u64, overtakers: u64 },
    /// Spaced by the receiver's TCP-layer arrivals when traced, else by
    /// the mean send interval, over β.
    Spacing,
}

/// PRR's sending rate in recovery, relative to the delivery rate (CUBIC's
/// β).
const PRR_RATIO: f64 = 0.7;

impl<'a> Recovery<'a> {
    fn new(a: &Assumptions, undo: bool, eifel: bool, deliveries: &'a [TcpArrival]) -> Self {
        Self {
            rtx_interval: (a.send_interval_us * 1000.0 / PRR_RATIO) as u64,
            deliveries,
            rtt: (a.rtt_us * 1000.0) as u64,
            undo,
            eifel: undo && eifel,
            mss: u64::from(a.mss_bytes.max(1)),
            stop_at: u64::MAX,
            ..Self::default()
        }
    }

    /// Closes the current episode: undone if undo applies and it
    /// retransmitted no real loss. Without timestamps the DSACKs undo it a
    /// round trip after its last retransmission, and only if no episode
    /// began (`next`, ns) before: a new recovery starts its undo afresh
    /// from the window it found (Linux's `tcp_init_undo`).
    fn close_episode(&mut self, next: Option<u64>) {
        let dsacked = self.first_rtx.map(|_| self.last_rtx + self.rtt);
        let in_time = self.eifel || dsacked.is_none_or(|d| next.is_none_or(|n| d <= n));
        if self.active && self.undo && !self.real && in_time {
            self.undone += 1;
            let start = self.starts.pop();
            if let (false, Some(start), Some(dsacked)) = (self.eifel, start, dsacked) {
                self.undone_spans.push((start, dsacked as f64 / 1e9));
            }
        }
        self.active = false;
    }

    /// When the retransmission after one sent at `sent` can go: after
    /// 1/β more deliveries (ACKs) when they are known, else at the mean
    /// send interval over β.
    fn next_rtx(&mut self, sent: u64) -> u64 {
        if self.deliveries.is_empty() {
            return sent + self.rtx_interval;
        }
        self.prr_credit += 1.0 / PRR_RATIO;
        let step = self.prr_credit.floor() as usize;
        self.prr_credit -= step as f64;
        let i = self.deliveries.partition_point(|d| d.t_ns <= sent);
        self.deliveries
            .get(i + step.max(1) - 1)
            .map_or(sent + self.rtx_interval, |d| d.t_ns)
    }

    /// An original arrived at `t` (late, or delivered in the normal
    /// course): with timestamps' undo, once it postdates the episode's
    /// first retransmission, the episode retransmits nothing more.
    fn original_delivered(&mut self, t: u64) {
        // (An original the episode waited for ends it on arrival.)
        let in_episode = self.active && t <= self.until;
        if in_episode {
            self.episode_arrivals.push(t);
        }
        if self.eifel && in_episode && self.first_rtx.is_some_and(|s| s < t) {
            self.stop_at = self.stop_at.min(t);
        }
    }

    fn in_recovery(&self, t: u64) -> bool {
        self.active && t < self.until
    }

    /// When PRR (RFC 6937, proportional, as Linux runs it: ⌈β · delivered⌉
    /// segments out) released the `k`-th retransmission (from 0) of holes
    /// marked together at `marked`: the first at once, each further one
    /// once β more segments were delivered. Delivered: the receiver's
    /// TCP-layer arrivals when traced (each an ACK, for all its segments);
    /// else the `overtakers` (evenly over the time to `arrived`) and the
    /// episode's late originals, each its own ACK. None: not before
    /// `arrived`.
    fn released(&self, k: u64, marked: u64, arrived: u64, overtakers: u64) -> Option<u64> {
        if k == 0 {
            return Some(marked);
        }
        let needed = (k as f64 / PRR_RATIO).floor() as u64 + 1;
        if !self.deliveries.is_empty() {
            let mut delivered = 0;
            return self
                .deliveries
                .iter()
                .skip_while(|d| d.t_ns < marked)
                .take_while(|d| d.t_ns < arrived)
                .find(|d| {
                    delivered += (d.end - d.start).div_ceil(self.mss);
                    delivered >= needed
                })
                .map(|d| d.t_ns);
        }
        let spacing = arrived.saturating_sub(marked) / overtakers.max(1);
        let mut times: Vec<u64> = (0..overtakers).map(|i| marked + i * spacing).collect();
        let late = self.episode_arrivals.iter();
        times.extend(late.filter(|t| (marked..arrived).contains(*t)));
        times.sort_unstable();
        times.get(needed as usize - 1).copied()
    }

    /// A retransmission sent at `sent` whose original arrives at `arrived`.
    fn spurious_sent(&mut self, sent: u64, arrived: u64) -> Marked {
        self.episode_rtx += 1;
        self.until = self.until.max(arrived.min(sent + self.rtt));
        self.spurious += 1;
        self.first_rtx.get_or_insert(sent);
        self.last_rtx = self.last_rtx.max(sent);
        Marked::Spurious { sent }
    }

    /// A segment is marked lost at `marked`; its original arrives at
    /// `original.0` with `original.1` segments received above it then (None:
    /// it was lost).
    ///
    /// Retransmissions are ACK-clocked, so one goes out before its
    /// original arrives only if enough was delivered by then: by
    /// [`Clock::Prr`], or spaced and at most one per segment delivered in
    /// the episode.
    fn lost(&mut self, marked: u64, original: Option<(u64, u64)>, clock: Clock) -> Marked {
        if !self.in_recovery(marked) {
            self.close_episode(Some(marked));
            self.first_rtx = None;
            self.last_rtx = 0;
            self.stop_at = u64::MAX;
            self.real = false;
            self.episode_rtx = 0;
            self.episode_arrivals.clear();
            self.active = true;
            self.episodes += 1;
            self.spurious_episodes += u64::from(original.is_some());
            self.starts.push(marked as f64 / 1e9);
            // RFC 6675: recovery lasts until what was sent when it began is
            // acknowledged, a round trip; reordering within it costs
            // retransmissions but no further reduction. (With timestamps'
            // undo, a recovery its originals prove spurious ends when they
            // arrive.)
            self.until = if self.eifel {
                marked
            } else {
                marked + self.rtt
            };
            self.rtx_clock = marked;
        }
        let sent = self.rtx_clock.max(marked);
        let outcome = match (original, clock) {
            (Some((arrived, _)), Clock::Prr { opened, overtakers }) => {
                if self.marking.0 != opened {
                    self.marking = (opened, 0);
                }
                match self.released(self.marking.1, marked, arrived, overtakers) {
                    Some(sent) if sent < self.stop_at => {
                        self.marking.1 += 1;
                        self.spurious_sent(sent, arrived)
                    }
                    _ => {
                        self.until = self.until.max(arrived);
                        Marked::NotSent
                    }
                }
            }
            (Some((arrived, above)), _)
                if arrived <= sent
                    || sent >= self.stop_at
                    || self.episode_rtx >= above + self.episode_arrivals.len() as u64 =>
            {
                self.until = self.until.max(arrived);
                Marked::NotSent
            }
            (Some((arrived, _)), _) => {
                self.rtx_clock = self.next_rtx(sent);
                self.spurious_sent(sent, arrived)
            }
            (None, _) => {
                self.episode_rtx += 1;
                self.rtx_clock = self.next_rtx(sent);
                self.until = self.until.max(sent + self.rtt);
                self.first_rtx.get_or_insert(sent);
                self.real = true;
                Marked::Real
            }
        };
        if let Some((arrived, _)) = original {
            self.original_delivered(arrived);
        }
        outcome
    }
}

/// One thing the sender reacts to, in the order holes opened.
enum Event<'a> {
    Late(&'a LateOriginal),
    /// A real loss: only a retransmission filled the hole.
    Loss {
        opened: u64,
    },
}

impl Event<'_> {
    fn opened(&self) -> u64 {
        match self {
            Event::Late(l) => l.overtaken_ns,
            Event::Loss { opened, .. } => *opened,
        }
    }
}

/// The holes only a retransmission filled: a refill whose original
/// arrived later was a spurious retransmission that won the race, not a
/// loss.
fn losses(log: &FlowLog) -> impl Iterator<Item = &Refill> {
    let originals: HashSet<u64> = log.late.iter().map(|l| l.start).collect();
    log.refills
        .iter()
        .filter(move |r| !originals.contains(&r.start))
}

fn events(log: &FlowLog) -> Vec<Event<'_>> {
    let mut ev: Vec<Event<'_>> = log
        .late
        .iter()
        .map(|l| {
            if l.discarded {
                Event::Loss {
                    opened: l.overtaken_ns,
                }
            } else {
                Event::Late(l)
            }
        })
        .collect();
    ev.extend(losses(log).map(|r| Event::Loss {
        opened: r.opened_ns,
    }));
    // Stable: late segments of one hole keep their arrival order.
    ev.sort_by_key(Event::opened);
    ev
}

/// When (seconds from the flow's start) a sender that finds a lost
/// retransmission by its timer alone would have timed out: one round trip
/// after each hole the trace shows refilled a timeout's worth after it
/// opened (the minimum RTO past a round trip: its sender's first
/// retransmission was lost too, whatever found it again). Holes refilled
/// within one timeout of another share it.
fn retransmission_timeouts(log: &FlowLog, rtt_ns: u64, rto_s: f64) -> Vec<f64> {
    let mut lost: Vec<f64> = losses(log)
        .filter(|r| r.filled_ns.saturating_sub(r.opened_ns) >= RTO_MIN_NS + rtt_ns)
        .map(|r| (r.opened_ns + rtt_ns) as f64 / 1e9)
        .collect();
    lost.sort_by(f64::total_cmp);
    let mut at: Vec<f64> = Vec::new();
    for t in lost {
        if at.last().is_none_or(|&last| t >= last + rto_s) {
            at.push(t);
        }
    }
    at
}

/// A sender's initial window, segments (RFC 6928; Linux and Windows).
const INITIAL_WINDOW: f64 = 10.0;

/// Added to 2·SRTT for the loss probe timeout, as Linux does (two
/// jiffies): without it, scheduling hiccups on sub-millisecond paths
/// would each count as a probe.
const PTO_FLOOR_NS: u64 = 2_000_000;

/// A RACK state change, applied when the replay's clock reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Change {
    /// A never-retransmitted segment was delivered below RACK.fack.
    ReorderingSeen,
    /// A DSACK reached the sender.
    Dsack,
}

impl Policy {
    pub fn run(&self, log: &FlowLog, a: &Assumptions) -> PolicyOutcome {
        let (r, probes) = self.recover(log, a);
        self.outcome(&r, probes, log, a)
    }

    /// The policy's loss detection over the flow: its recoveries, and its
    /// loss probes.
    fn recover<'a>(&self, log: &'a FlowLog, a: &Assumptions) -> (Recovery<'a>, u64) {
        let mss = u64::from(a.mss_bytes.max(1));
        // A real loss's hole is overtaken by segments back to back at the
        // bottleneck's pace, not the flow's mean send interval (a slow flow
        // sends in bursts). (A late segment's own lateness says when its
        // overtakers came: `classic_step`.)
        let gap = a.segment_gap_ns();
        let rtt = (a.rtt_us * 1000.0) as u64;
        // What the sender can undo by: the receiver's DSACKs (classic as
        // told), and (linux-adaptive, rack-tlp) the flow's timestamps.
        let (undo, eifel) = match *self {
            Policy::Classic { undo, .. } => (undo && a.receiver_dsack, false),
            Policy::LinuxAdaptive { undo, .. } | Policy::RackTlp { undo, .. } => {
                (undo && (a.receiver_dsack || a.timestamps), a.timestamps)
            }
        };
        let deliveries = match (log.acks.as_deref(), a.tcp_layer_whole) {
            (Some(l), true) => &l.tcp[..],
            _ => &[],
        };
        let mut r = Recovery::new(a, undo, eifel, deliveries);
        let mut probes = 0;
        // Classic and RACK-TLP ACK by ACK when the receiver's TCP layer and
        // the sender's timestamps are in the trace; else (and always for
        // linux-adaptive) from the late originals.
        let ack_level = log.acks.as_deref().filter(|_| a.ack_level).and_then(|l| {
            let sender = match a.send_times_from {
                super::Source::Sender => &l.sender_sent[..],
                _ => &[],
            };
            acks::SendClock::new(&l.ticks, sender)
                .filter(|_| !l.tcp.is_empty())
                .map(|c| (l, c))
        });
        let detection = match *self {
            Policy::Classic { dupthresh, .. } => {
                Some(acks::Detection::DupThresh { dupthresh, undo })
            }
            Policy::RackTlp {
                dupthresh,
                reo_wnd_mult,
                ..
            } => Some(acks::Detection::Rack {
                dupthresh,
                reo_wnd_mult,
                dsack: a.receiver_dsack,
            }),
            Policy::LinuxAdaptive { .. } => None,
        };
        match (ack_level, detection) {
            (Some((l, clock)), Some(d)) => {
                let o = acks::run(l, clock, a, d);
                r.spurious = o.spurious;
                r.episodes = o.episodes;
                r.spurious_episodes = o.spurious_episodes;
                r.undone = o.undone;
                r.starts = o.starts;
            }
            _ => match *self {
                Policy::Classic { dupthresh, .. } => {
                    for e in events(log) {
                        classic_step(&mut r, &e, dupthresh, mss, gap);
                    }
                }
                Policy::LinuxAdaptive { initial, max, .. } => {
                    // (time, threshold from then on)
                    let mut history: Vec<(u64, u32)> = vec![(0, initial)];
                    for e in events(log) {
                        let at = e.opened();
                        let i = history.partition_point(|&(t, _)| t <= at);
                        let thr = history[i.saturating_sub(1)].1;
                        classic_step(&mut r, &e, thr, mss, gap);
                        if let Event::Late(l) = e {
                            // Reordering seen when its SACK arrives: raise
                            // the threshold to its degree.
                            let degree = l.fack_distance.div_ceil(mss) as u32;
                            let now = history.last().expect("initial").1;
                            if degree > now {
                                history.push((l.arrived_ns.max(at), degree.min(max)));
                            }
                        }
                    }
                }
                Policy::RackTlp {
                    dupthresh,
                    reo_wnd_mult,
                    ..
                } => rack(&mut r, log, a, dupthresh, reo_wnd_mult),
            },
        }
        if let Policy::RackTlp { .. } = self {
            probes = log.gaps_over(2 * rtt + PTO_FLOOR_NS);
        }
        r.close_episode(None);
        (r, probes)
    }

    fn outcome(&self, r: &Recovery, probes: u64, log: &FlowLog, a: &Assumptions) -> PolicyOutcome {
        // Slow start ends at the first recovery.
        let slow_start_rtt_us =
            a.slow_start_rtt_us(r.starts.first().copied().unwrap_or(a.duration_s));
        let path = Path {
            rtt_s: a.rtt_us / 1e6,
            slow_start_rtt_s: slow_start_rtt_us / 1e6,
            mss_bytes: f64::from(a.mss_bytes.max(1)),
            bottleneck_bps: a.bottleneck_bps,
            queue_bdp: a.queue_bdp,
        };
        let p = (r.episodes - r.undone) as f64 / log.data_segments.max(1) as f64;
        let rto_s = RTO_MIN_NS as f64 / 1e9 + path.rtt_s;
        let timeout_at = match self {
            Policy::RackTlp { .. } => Vec::new(),
            _ => retransmission_timeouts(log, (a.rtt_us * 1000.0) as u64, rto_s),
        };
        let timeouts = Timeouts {
            at: &timeout_at,
            rto_s,
        };
        // The transfer itself: slow start, then the trace's recoveries
        // where the policy had them, over the flow's own time (what its
        // real sender achieved is measured over the same).
        let sim = |c| {
            throughput::simulate(
                c,
                &path,
                Reductions::At(&r.starts),
                Undone(&r.undone_spans),
                timeouts,
                if a.hystart {
                    Start::HyStart(INITIAL_WINDOW)
                } else {
                    Start::SlowStart(INITIAL_WINDOW)
                },
                a.duration_s,
            )
        };
        let estimated = sim(Congestion::Cubic);
        PolicyOutcome {
            name: self.name(),
            policy: *self,
            spurious_retransmissions: r.spurious,
            recovery_episodes: r.episodes,
            spurious_recovery_episodes: r.spurious_episodes,
            undone_recovery_episodes: r.undone,
            loss_probes: probes,
            loss_event_rate: p,
            slow_start_rtt_us,
            retransmission_timeouts: timeout_at.len() as u64,
            estimated_goodput_bps: estimated,
            estimated_goodput_range_bps: (estimated, estimated),
            reno_goodput_bps: sim(Congestion::Reno),
            mathis_bps: throughput::mathis_bps(&path, p),
            padhye_bps: throughput::padhye_bps(&path, p),
            cubic_response_bps: throughput::cubic_response_bps(&path, p),
        }
    }
}

/// Threshold marking: lost once more than (thr - 1) segments' bytes above
/// are SACKed, i.e. when the thr-th segment above arrives.
fn classic_step(r: &mut Recovery, e: &Event<'_>, thr: u32, mss: u64, gap: u64) {
    let thr = u64::from(thr.max(1));
    match *e {
        Event::Late(l) => {
            if l.bytes_above > (thr - 1) * mss {
                // The segments above it arrived between its hole's opening
                // and itself (an edge's queue releases them in a burst far
                // faster than the path's pace): the thr-th of them, taken
                // as evenly spaced over that time, is when it was marked.
                let above = (l.bytes_above / mss).max(thr);
                let span = l.arrived_ns.saturating_sub(l.overtaken_ns);
                let marked = l.overtaken_ns + span * (thr - 1) / above;
                let original = Some((l.arrived_ns, l.bytes_above / mss));
                let clock = Clock::Prr {
                    opened: l.overtaken_ns,
                    overtakers: above - thr + 1,
                };
                r.lost(marked, original, clock);
            } else {
                r.original_delivered(l.arrived_ns);
            }
        }
        Event::Loss { opened, .. } => {
            r.lost(opened + (thr - 1) * gap, None, Clock::Spacing);
        }
    }
}

/// RFC 8985 §6.2 replayed: each late original is marked lost at the
/// moment RACK would, given the window then in force. Reordering counts
/// as seen when a never-retransmitted segment is delivered late, and (as
/// Linux does, by timestamps) when a retransmitted one's original fills
/// the hole before its retransmission.
fn rack(r: &mut Recovery, log: &FlowLog, a: &Assumptions, dupthresh: u32, mult0: u32) {
    let mss = u64::from(a.mss_bytes.max(1));
    let tau = (a.send_interval_us * 1000.0) as u64;
    let rtt = r.rtt;
    let min_rtt = (a.min_rtt_us * 1000.0) as u64;
    let mut reordering_seen = false;
    let mut mult = u64::from(mult0.max(1));
    let mut persist = 0i32;
    let mut dsack_round_until: Option<u64> = None;
    // Episodes whose end has been counted towards reo_wnd_persist.
    let mut exits = 0;
    let mut pending: BinaryHeap<Reverse<(u64, Change)>> = BinaryHeap::new();
    for e in events(log) {
        let now = e.opened();
        while let Some(&Reverse((t, change))) = pending.peek() {
            if t > now {
                break;
            }
            pending.pop();
            match change {
                Change::ReorderingSeen => reordering_seen = true,
                Change::Dsack => {
                    if dsack_round_until.is_none_or(|until| t >= until) {
                        dsack_round_until = Some(t + rtt);
                        mult = (mult + 1).min(255);
                        persist = 16;
                    }
                }
            }
        }
        // Leaving a recovery: the persisted window counts down.
        if r.episodes > exits && !r.in_recovery(now) {
            exits = r.episodes;
            persist -= 1;
            if persist <= 0 {
                mult = 1;
            }
        }
        let window = (mult * min_rtt / 4).min(rtt);
        match e {
            Event::Late(l) => {
                let sent_gap = u64::from(l.distance_segments) * tau;
                // Where it would have arrived, in order.
                let natural = l.overtaken_ns.saturating_sub(sent_gap);
                let three_sacked = l.bytes_above >= u64::from(dupthresh) * mss;
                let third_at = l.overtaken_ns + u64::from(dupthresh.saturating_sub(1)) * tau;
                let by_window = l.overtaken_ns.max(natural + window);
                let marked = if !reordering_seen && r.in_recovery(now) {
                    l.overtaken_ns.max(natural)
                } else if !reordering_seen && three_sacked {
                    by_window.min(third_at)
                } else {
                    by_window
                };
                let outcome = if l.arrived_ns > marked {
                    r.lost(
                        marked,
                        Some((l.arrived_ns, l.bytes_above / mss)),
                        Clock::Spacing,
                    )
                } else {
                    r.original_delivered(l.arrived_ns);
                    Marked::NotSent
                };
                match outcome {
                    Marked::Spurious { sent } => {
                        if a.receiver_dsack {
                            pending.push(Reverse((l.arrived_ns.max(sent + rtt), Change::Dsack)));
                        }
                        if l.arrived_ns < sent + rtt {
                            // The original filled the hole before the
                            // retransmission could: its ACK echoes the
                            // original's timestamp, which Linux takes as
                            // reordering (and undoes); RFC 8985's rule
                            // alone would not.
                            pending.push(Reverse((l.arrived_ns, Change::ReorderingSeen)));
                        }
                    }
                    // Delivered below RACK.fack, never retransmitted.
                    Marked::NotSent | Marked::Real => {
                        pending.push(Reverse((l.arrived_ns, Change::ReorderingSeen)));
                    }
                }
            }
            Event::Loss { opened, .. } => {
                let marked = if reordering_seen {
                    opened + window
                } else {
                    opened
                };
                r.lost(marked, None, Clock::Spacing);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::{replay, AckLog, ClassicUndo, ReplayConfig, TraceRtt};

    const MSS: u32 = 1000;

    /// A flow of `n` in-order segments, 10 us apart, RTT 1 ms.
    fn clean(n: u64) -> FlowLog {
        let mut log = FlowLog::default();
        for i in 0..n {
            log.arrival(1_000_000 + i * 10_000, MSS);
        }
        log
    }

    fn cfg() -> ReplayConfig {
        ReplayConfig {
            rtt_us: Some(1000.0),
            bandwidth_bps: Some(1e9),
            ..Default::default()
        }
    }

    /// One late original: overtaken at 2 ms, `above` segments above it
    /// when it arrived `late_us` after.
    fn late(log: &mut FlowLog, at_us: u64, late_us: u64, above: u64) {
        let first = log.first_ns.unwrap();
        log.late_original(LateOriginal {
            arrived_ns: first + (at_us + late_us) * 1000,
            overtaken_ns: first + at_us * 1000,
            distance_segments: 1,
            bytes_above: above * u64::from(MSS),
            fack_distance: (above + 1) * u64::from(MSS),
            start: at_us,
            ..Default::default()
        });
    }

    fn spurious(log: &FlowLog, name: &str) -> u64 {
        replay(log, TraceRtt::Observed(None), &cfg(), false, None)
            .policies
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .spurious_retransmissions
    }

    #[test]
    fn a_clean_trace_has_no_spurious_event_under_any_policy() {
        let r = replay(
            &clean(10_000),
            TraceRtt::Observed(None),
            &cfg(),
            false,
            None,
        );
        for p in &r.policies {
            assert_eq!(
                (
                    p.spurious_retransmissions,
                    p.recovery_episodes,
                    p.loss_probes
                ),
                (0, 0, 0),
                "{}",
                p.name
            );
            // Slow start from 10 segments fills the 1 ms path in under
            // five round trips of the trace's 100 ms; then the link.
            let g = p.estimated_goodput_bps;
            assert!((1e9 * (1.0 - 5.0 / 100.0)..=1e9).contains(&g), "{p:?}");
            assert_eq!(g, r.policies[0].estimated_goodput_bps);
        }
        assert_eq!(r.rack_vs_classic, Some(1.0));
    }

    #[test]
    fn a_hole_refilled_past_a_timeout_costs_the_threshold_policies_one() {
        // 1 s of data; holes at 300 and 310 ms refilled 250 ms later (the
        // first retransmissions lost: one timer finds both), one at 700 ms
        // refilled after 3 ms (its first retransmission arrived).
        let mut log = clean(100_000);
        let first = log.first_ns.unwrap();
        for (opened_ms, after_ms) in [(300, 250), (310, 250), (700, 3)] {
            log.refill(Refill {
                opened_ns: first + opened_ms * 1_000_000,
                filled_ns: first + (opened_ms + after_ms) * 1_000_000,
                start: opened_ms,
            });
        }
        let r = replay(&log, TraceRtt::Observed(None), &cfg(), false, None);
        let of = |name: &str| r.policies.iter().find(|p| p.name == name).unwrap();
        for name in ["classic", "linux-adaptive"] {
            assert_eq!(of(name).retransmission_timeouts, 1, "{name}");
        }
        assert_eq!(of("rack-tlp").retransmission_timeouts, 0);
        // Its 201 ms idle: a fifth of the second.
        let (classic, rack) = (
            of("classic").estimated_goodput_bps,
            of("rack-tlp").estimated_goodput_bps,
        );
        assert!(
            (0.75..0.81).contains(&(classic / rack)),
            "{classic} vs {rack}"
        );
    }

    #[test]
    fn three_reordered_fools_classic_but_not_rack_within_its_window() {
        // RACK has seen reordering once already (a 1-reordered segment
        // it did not retransmit), so its window is min_RTT/4 = 250 us.
        let mut log = clean(10_000);
        late(&mut log, 1000, 5, 1);
        // 3-reordered, 100 us late: under the window.
        late(&mut log, 20_000, 100, 3);
        assert_eq!(spurious(&log, "classic"), 1);
        assert_eq!(spurious(&log, "rack-tlp"), 0);
        // 400 us late: over the window, RACK retransmits too.
        late(&mut log, 40_000, 400, 3);
        assert_eq!(spurious(&log, "rack-tlp"), 1);
        assert_eq!(spurious(&log, "classic"), 2);
        // Its DSACK widens the window to 2 x 250 us: the same event again
        // passes.
        late(&mut log, 60_000, 400, 3);
        assert_eq!(spurious(&log, "rack-tlp"), 1);
    }

    /// An edge's queue releases a block late behind a burst: the classic
    /// sender hears three duplicate ACKs within the burst and retransmits
    /// one segment per ACK after, each before its original's ACK comes,
    /// however slowly the flow sends on average (here a segment per ms).
    #[test]
    fn a_burst_clocks_classic_retransmissions_however_slow_the_flow() {
        let mut log = FlowLog::default();
        for i in 0..1_000 {
            log.arrival(1_000_000 + i * 1_000_000, MSS);
        }
        // Ten segments overtake five in 100 us; the five come 10 us apart
        // after them.
        for k in 0..5 {
            late(&mut log, 20_000, 100 + 10 * k, 10);
        }
        assert_eq!(spurious(&log, "classic"), 5);
    }

    /// RFC 6675: a recovery lasts until what was outstanding when it began
    /// is acknowledged, a round trip; a second reordering within it costs
    /// retransmissions but no second reduction.
    #[test]
    fn a_classic_recovery_lasts_a_round_trip() {
        let mut log = clean(10_000);
        late(&mut log, 20_000, 100, 5);
        late(&mut log, 20_500, 100, 5);
        late(&mut log, 40_000, 100, 5);
        let r = replay(&log, TraceRtt::Observed(None), &cfg(), false, None);
        let classic = r.policies.iter().find(|p| p.name == "classic").unwrap();
        assert_eq!(
            (classic.recovery_episodes, classic.spurious_retransmissions),
            (2, 3)
        );
    }

    #[test]
    fn a_late_original_tcp_discarded_is_a_loss_for_every_policy() {
        let mut log = clean(10_000);
        late(&mut log, 20_000, 5_000, 40);
        let before = replay(&log, TraceRtt::Observed(None), &cfg(), false, None);
        // PAWS at the receiver, seen at its tcp_probe: [start, start + 1).
        log.discarded(20_000, 20_001);
        let after = replay(&log, TraceRtt::Observed(None), &cfg(), false, None);
        for (b, a) in before.policies.iter().zip(&after.policies) {
            assert_eq!(b.spurious_retransmissions, 1, "{}", b.name);
            assert_eq!(
                (
                    a.spurious_retransmissions,
                    a.recovery_episodes,
                    a.spurious_recovery_episodes
                ),
                (0, 1, 0),
                "{}",
                a.name
            );
        }
    }

    #[test]
    fn classic_retransmits_as_fast_as_acks_come_back() {
        // Ten originals of one hole, 200 µs late with 40 segments above:
        // all marked lost together, 10 µs after its opening.
        let mut log = clean(10_000);
        for _ in 0..10 {
            late(&mut log, 20_000, 200, 40);
        }
        let classic = |log: &FlowLog, tcp_layer: bool| {
            replay(log, TraceRtt::Observed(None), &cfg(), tcp_layer, None)
                .policies
                .iter()
                .find(|p| p.name == "classic")
                .unwrap()
                .spurious_retransmissions
        };
        // Without the receiver's TCP layer: the 38 overtakers after the
        // marking, evenly over the 190 µs, release the ten (PRR: 13
        // deliveries for the tenth) before their originals.
        assert_eq!(classic(&log, false), 10);
        // With it, PRR counts the segments its ACKs delivered: one
        // retransmission at once, each further one per 1/β segments.
        let with_deliveries = |every_us: u64| {
            let mut l = log.clone();
            l.acks = Some(Box::new(AckLog {
                tcp: (0..3_000)
                    .map(|j| TcpArrival {
                        t_ns: (19_000 + j * every_us) * 1000,
                        start: j * u64::from(MSS),
                        end: (j + 1) * u64::from(MSS),
                        ..TcpArrival::default()
                    })
                    .collect(),
                // No timestamps: the wire model, with the TCP layer.
                ticks: Vec::new(),
                ..AckLog::default()
            }));
            l
        };
        // An ACK every 50 µs (from 19 ms), a segment each: at the marking,
        // at 20.05 (two delivered) and 20.10 ms (three) before the
        // originals at 20.2 ms; the fourth needs five.
        assert_eq!(classic(&with_deliveries(50), true), 3);
        // An ACK every microsecond: all ten go before their originals.
        assert_eq!(classic(&with_deliveries(1), true), 10);
    }

    /// Without timestamps a late original tells the classic sender
    /// nothing: its recovery goes on retransmitting what it marked until
    /// the DSACKs come (then undoes it). Linux's timestamps stop it at the
    /// first late original after its first retransmission.
    #[test]
    fn only_timestamps_stop_a_recovery_at_its_first_late_original() {
        let mut log = clean(10_000);
        log.timestamps = true;
        // One hole: eight originals 100 µs late with 6 segments above,
        // eight more 250 µs late with 12 above.
        for _ in 0..8 {
            late(&mut log, 20_000, 100, 6);
        }
        for _ in 0..8 {
            late(&mut log, 20_000, 250, 12);
        }
        let cfg = ReplayConfig {
            classic_undo: ClassicUndo::Dsack,
            ..cfg()
        };
        let r = replay(&log, TraceRtt::Observed(None), &cfg, false, None);
        let get = |name: &str| r.policies.iter().find(|p| p.name == name).unwrap();
        // PRR: 4 overtakers by the first eight's arrival release 3; 10
        // overtakers and those eight by the second's, all eight more.
        let classic = get("classic");
        assert_eq!(classic.spurious_retransmissions, 11);
        assert_eq!(
            (classic.recovery_episodes, classic.undone_recovery_episodes),
            (1, 1)
        );
        let adaptive = get("linux-adaptive");
        assert_eq!(adaptive.spurious_retransmissions, 3);
        assert_eq!(adaptive.undone_recovery_episodes, 1);
    }

    /// The DSACKs undo a classic recovery a round trip after its last
    /// retransmission, unless another recovery began before: Linux then
    /// keeps the first reduction and undoes from the window it left.
    #[test]
    fn a_recovery_begun_before_the_dsacks_keeps_the_last_one_s_reduction() {
        let cfg = ReplayConfig {
            classic_undo: ClassicUndo::Dsack,
            ..cfg()
        };
        let classic = |second_at_us: u64| {
            let mut log = clean(10_000);
            // Ten originals of one hole, 500 µs late with 40 above: PRR
            // releases the last retransmission at 20.175 ms, so its DSACK
            // comes at 21.175 ms (the episode itself ends at 21.025 ms).
            for _ in 0..10 {
                late(&mut log, 20_000, 500, 40);
            }
            late(&mut log, second_at_us, 100, 5);
            let r = replay(&log, TraceRtt::Observed(None), &cfg, false, None);
            let p = r
                .policies
                .into_iter()
                .find(|p| p.name == "classic")
                .unwrap();
            (p.recovery_episodes, p.undone_recovery_episodes)
        };
        // The second marks at 21.140 ms, before the first's DSACK.
        assert_eq!(classic(21_100), (2, 1));
        assert_eq!(classic(23_000), (2, 2));
    }

    #[test]
    fn before_any_reordering_rack_falls_back_to_dupthresh() {
        let mut log = clean(10_000);
        late(&mut log, 20_000, 100, 3);
        assert_eq!(spurious(&log, "rack-tlp"), 1);
        let mut log = clean(10_000);
        late(&mut log, 20_000, 100, 2);
        assert_eq!(spurious(&log, "rack-tlp"), 0);
    }

    #[test]
    fn linux_adaptive_raises_its_threshold_after_the_first_event() {
        let mut log = clean(10_000);
        late(&mut log, 20_000, 100, 5);
        late(&mut log, 40_000, 100, 5);
        late(&mut log, 60_000, 100, 9);
        assert_eq!(spurious(&log, "classic"), 3);
        // The first 5-reordered event raises it to 6: the second passes;
        // 9 is beyond it.
        assert_eq!(spurious(&log, "linux-adaptive"), 2);
    }

    #[test]
    fn spurious_recoveries_cost_goodput() {
        let mut log = clean(100_000);
        for i in 0..20 {
            late(&mut log, 50_000 + i * 40_000, 100, 4);
        }
        // A sender that never undoes (Windows before RACK-TLP).
        let never = ReplayConfig {
            classic_undo: ClassicUndo::Never,
            ..cfg()
        };
        let r = replay(&log, TraceRtt::Observed(None), &never, false, None);
        let classic = &r.policies[0];
        assert_eq!(classic.recovery_episodes, 20);
        assert!(classic.estimated_goodput_bps < 0.9e9, "{classic:?}");
        assert!(r.rack_vs_classic.unwrap() > 1.0);
    }

    /// The estimate's range spans what the receiver cannot tell: here the
    /// classic sender undoing its 20 spurious recoveries (the estimate,
    /// DSACKs on) or none of them (the range's low end, that of a sender
    /// that never undoes). A clean flow has none to vary.
    #[test]
    fn an_estimates_range_spans_the_undo_the_receiver_cannot_see() {
        let mut log = clean(100_000);
        let r = replay(&log, TraceRtt::Observed(None), &cfg(), false, None);
        for p in &r.policies {
            let e = p.estimated_goodput_bps;
            assert_eq!(p.estimated_goodput_range_bps, (e, e), "{}", p.name);
        }
        for i in 0..20 {
            late(&mut log, 50_000 + i * 40_000, 100, 4);
        }
        let run = |cfg: &ReplayConfig| {
            replay(&log, TraceRtt::Observed(None), cfg, false, None).policies[0].clone()
        };
        let undoes = run(&cfg());
        let never = run(&ReplayConfig {
            classic_undo: ClassicUndo::Never,
            ..cfg()
        });
        let (lo, hi) = undoes.estimated_goodput_range_bps;
        assert!(never.estimated_goodput_bps < undoes.estimated_goodput_bps);
        assert_eq!(lo, never.estimated_goodput_bps);
        assert!(lo < undoes.estimated_goodput_bps && undoes.estimated_goodput_bps <= hi);
    }

    /// A flow's queueing may have been its own rather than the others' at
    /// a shared queue. Here a round trip of 2 ms over a 1 ms path, no
    /// buffer beyond what the flow met, and one recovery never undone: at
    /// a shared queue its window falls below the link's and regrows
    /// (the estimate); had the millisecond been its own queue, the cut
    /// only drained it, and the link stayed full (the range's high end).
    #[test]
    fn an_estimates_range_spans_whose_queue_the_flow_met() {
        let mut log = clean(100_000);
        late(&mut log, 500_000, 100, 4);
        let r = replay(&log, TraceRtt::Observed(None), &cfg(), false, None);
        let a = Assumptions {
            rtt_us: 2000.0,
            min_rtt_us: 1000.0,
            queue_bdp: 0.0,
            bottleneck_bps: 1e9,
            ..r.assumptions.unwrap()
        };
        let classic = Policy::Classic {
            dupthresh: 3,
            undo: false,
        };
        let o = PolicyOutcome::with_range(&classic, &log, &a);
        assert_eq!(o.recovery_episodes, 1);
        let (_, hi) = o.estimated_goodput_range_bps;
        assert!(o.estimated_goodput_bps < 0.98e9, "{o:?}");
        // The link full but for the first slow start's few round trips.
        assert!(hi > 0.99e9, "{o:?}");
    }

    /// What a sender can undo by: the receiver's DSACKs (classic, as it
    /// is told to; the others always), and the flow's timestamps
    /// (linux-adaptive and rack-tlp only). The same spurious recoveries
    /// (classic enters 20; linux-adaptive one, its threshold raised
    /// after), undone or not by each.
    #[test]
    fn each_sender_undoes_by_what_it_has() {
        let mut log = clean(100_000);
        for i in 0..20 {
            late(&mut log, 50_000 + i * 40_000, 100, 4);
        }
        let mut undone = |dsack: bool, timestamps: bool, classic_undo| {
            log.timestamps = timestamps;
            let cfg = ReplayConfig {
                receiver_dsack: Some((dsack, super::super::Source::Given)),
                classic_undo,
                ..cfg()
            };
            let r = replay(&log, TraceRtt::Observed(None), &cfg, false, None);
            let a = r.assumptions.unwrap();
            assert_eq!((a.receiver_dsack, a.timestamps), (dsack, timestamps));
            let by = |name: &str, episodes| {
                let p = r.policies.iter().find(|p| p.name == name).unwrap();
                assert_eq!(p.recovery_episodes, episodes, "{name}");
                p.undone_recovery_episodes
            };
            (by("classic", 20), by("linux-adaptive", 1))
        };
        let dsack = ClassicUndo::Dsack;
        assert_eq!(undone(true, false, dsack), (20, 1));
        assert_eq!(undone(true, false, ClassicUndo::Never), (0, 1));
        assert_eq!(undone(false, true, dsack), (0, 1));
        assert_eq!(undone(false, false, dsack), (0, 0));
    }
}
