//! What a sender's congestion window makes of a sequence of recovery
//! episodes: a CUBIC (RFC 8312: β = 0.7, C = 0.4; fast convergence and
//! RFC 9438's K, as Linux) and a Reno window
//! simulated round trip by round trip while it changes, and the
//! closed-form response functions (Mathis, Padhye, RFC 8312's CUBIC
//! average window) as a cross-check. Windows are in segments, rates in
//! bits per second.
//!
//! The cost follows the events, not the time: a window that holds all the
//! path holds stays there until the next recovery or timeout, and those
//! round trips are taken at once. What remains per event is a slow start
//! (doubling: a few round trips) and a regrowth, which CUBIC's
//! TCP-friendly floor bounds at about 0.6 round trips per segment of the
//! path's window.

/// RFC 8312 constants.
pub const CUBIC_BETA: f64 = 0.7;
pub const CUBIC_C: f64 = 0.4;

/// The link a window simulation runs over.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Path {
    pub rtt_s: f64,
    /// The round trip while the window grows from its initial one (the
    /// queue then is not yet the run's).
    pub slow_start_rtt_s: f64,
    pub mss_bytes: f64,
    /// Bottleneck rate: the window never delivers more.
    pub bottleneck_bps: f64,
    /// The bottleneck's queue, in bandwidth-delay products: a window may
    /// grow this far past the one that fills the link (it then only
    /// queues) before the queue overflows.
    pub queue_bdp: f64,
}

impl Path {
    /// The window that fills the bottleneck.
    pub fn bdp_segments(&self) -> f64 {
        self.bottleneck_bps * self.rtt_s / (8.0 * self.mss_bytes)
    }

    /// The largest window the path holds: the link's and the queue's.
    fn max_window(&self) -> f64 {
        (self.bdp_segments() * (1.0 + self.queue_bdp)).max(1.0)
    }

    fn rate(&self, window: f64, rtt_s: f64) -> f64 {
        (window * self.mss_bytes * 8.0 / rtt_s).min(self.bottleneck_bps)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Congestion {
    Cubic,
    Reno,
}

impl Congestion {
    /// Multiplicative decrease: the window a recovery reduces to.
    fn beta(self) -> f64 {
        match self {
            Congestion::Cubic => CUBIC_BETA,
            Congestion::Reno => 0.5,
        }
    }
}

/// How the window starts.
#[derive(Clone, Copy, Debug)]
pub enum Start {
    /// At this many segments (at most what the path holds).
    Window(f64),
    /// In slow start from this initial window (RFC 6928: 10), doubling
    /// each round trip until the first reduction or the path is full.
    SlowStart(f64),
    /// The same, but slow start ends once the window fills the link, where
    /// the queue begins to build and CUBIC's HyStart (on in Linux) sees the
    /// round trip grow; CUBIC's epoch starts there.
    HyStart(f64),
}

/// When the window is reduced.
#[derive(Clone, Copy, Debug)]
pub enum Reductions<'a> {
    /// At these times (seconds from the start, ascending): recovery
    /// episodes replayed from a trace.
    At(&'a [f64]),
    /// Once every this many segments delivered (the deterministic loss
    /// model of the response functions).
    EverySegments(f64),
}

/// Retransmission timeouts: at each of `at` (seconds from the start,
/// ascending) the sender sends nothing for `rto_s`, then slow-starts from
/// one segment to the window it had (the recovery's ssthresh: Linux keeps
/// it when the timer fires in recovery).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts<'a> {
    pub at: &'a [f64],
    pub rto_s: f64,
}

impl Timeouts<'_> {
    pub const NONE: Timeouts<'static> = Timeouts {
        at: &[],
        rto_s: 0.0,
    };
}

/// Recoveries undone by the receiver's DSACKs alone: from the start of
/// each span to its end (seconds, ascending) the window sent at β of
/// itself (PRR's reduction while the recovery lasted, then the reduced
/// window until the DSACKs undid it), and had itself back after.
#[derive(Clone, Copy, Debug)]
pub struct Undone<'a>(pub &'a [(f64, f64)]);

impl Undone<'_> {
    pub const NONE: Undone<'static> = Undone(&[]);
}

/// The undone spans merged where they overlap, read forward in time: how
/// much of each stretch they cover, past spans never read again.
struct Held {
    spans: Vec<(f64, f64)>,
    next: usize,
}

impl Held {
    fn new(undone: Undone<'_>) -> Self {
        let mut sorted: Vec<(f64, f64)> = undone.0.iter().copied().filter(|s| s.1 > s.0).collect();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut spans: Vec<(f64, f64)> = Vec::with_capacity(sorted.len());
        for (a, b) in sorted {
            match spans.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => spans.push((a, b)),
            }
        }
        Self { spans, next: 0 }
    }

    /// How much of `[from, to)` the spans cover; `from` never goes back.
    fn within(&mut self, from: f64, to: f64) -> f64 {
        while self.spans.get(self.next).is_some_and(|s| s.1 <= from) {
            self.next += 1;
        }
        self.spans[self.next..]
            .iter()
            .take_while(|s| s.0 < to)
            .map(|&(a, b)| b.min(to) - a.max(from))
            .sum()
    }
}

/// Average goodput over `duration_s` of a window that starts as `start`,
/// reduces at each of `reductions`, is held down during each of `undone`
/// and restarts after each of `timeouts`. Multiplicative decrease β
/// (CUBIC 0.7, Reno 0.5); growth per RFC 8312 §4.1 (with its TCP-friendly
/// region) or one segment per RTT; never past what the path holds (its
/// losses there are the trace's reductions, or the formulas').
pub fn simulate(
    c: Congestion,
    path: &Path,
    reductions: Reductions<'_>,
    undone: Undone<'_>,
    timeouts: Timeouts<'_>,
    start: Start,
    duration_s: f64,
) -> f64 {
    let steady_at_once = true;
    let run = (reductions, undone, timeouts, start, duration_s);
    simulate_rounds(c, path, run, steady_at_once).0
}

/// [`simulate`]'s inputs after the path.
type Run<'a> = (Reductions<'a>, Undone<'a>, Timeouts<'a>, Start, f64);

/// [`simulate`], and the round trips it stepped through one by one;
/// `steady_at_once`: the round trips of a window at the path's cap taken
/// together (without: the reference, every round trip stepped).
fn simulate_rounds(c: Congestion, path: &Path, run: Run<'_>, steady_at_once: bool) -> (f64, u64) {
    let (reductions, undone, timeouts, start, duration_s) = run;
    if duration_s <= 0.0 || path.rtt_s <= 0.0 {
        return (0.0, 0);
    }
    let cap = path.max_window();
    let rtt = path.rtt_s;
    let (start_window, mut slow_start, exit) = match start {
        Start::Window(w) => (w, false, cap),
        Start::SlowStart(w) => (w, true, cap),
        // (A path that holds less than two segments: its hold.)
        Start::HyStart(w) => (w, true, path.bdp_segments().max(2.0).min(cap)),
    };
    let mut w = start_window.clamp(1.0, cap);
    // Where slow start ends: the path's hold (or HyStart's), or after a
    // timeout the window the timer found (`restarting`).
    let (mut ssthresh, mut restarting) = (exit, false);
    let mut timeouts_due = timeouts.at.iter().copied().peekable();
    // CUBIC epoch state: the last maximum, when the epoch began, the
    // window then, and the TCP-friendly estimate.
    let (mut w_max, mut epoch_start, mut w_epoch, mut w_est) = (w, 0.0f64, w, w);
    let episodes: &[f64] = match reductions {
        Reductions::At(e) => e,
        Reductions::EverySegments(_) => &[],
    };
    let mut next = episodes.iter().copied().peekable();
    let mut held_spans = Held::new(undone);
    let every_segments = matches!(reductions, Reductions::EverySegments(_));
    let (mut t, mut delivered_bits, mut since_loss) = (0.0f64, 0.0f64, 0.0f64);
    let mut stepped = 0;
    while t < duration_s {
        stepped += 1;
        // (Exactly the cap: a reduction's floor of two segments may leave
        // the window above a path that holds less, for one round trip.)
        if steady_at_once && !slow_start && w == cap && !every_segments {
            // All the path holds, until the next recovery or timeout: each
            // round trip before it is the same (growth stays at the cap),
            // taken at once. (The one it falls in runs below.)
            let until = [next.peek(), timeouts_due.peek()]
                .into_iter()
                .flatten()
                .fold(duration_s, |a, &b| a.min(b));
            let mut rounds = ((until - t) / rtt).floor();
            if rounds >= 1.0 && t + rounds * rtt >= until && until < duration_s {
                rounds -= 1.0;
            }
            if rounds >= 1.0 {
                let span = rounds * rtt;
                let held = held_spans.within(t, t + span);
                delivered_bits +=
                    path.rate(w, rtt) * (span - held) + path.rate(w * c.beta(), rtt) * held;
                w_est += rounds * 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA);
                t += span;
                continue;
            }
        }
        if timeouts_due.peek().is_some_and(|&at| at <= t) {
            while timeouts_due.peek().is_some_and(|&at| at <= t) {
                timeouts_due.next();
            }
            t += timeouts.rto_s;
            // Recoveries that began while it waited are the timeout's.
            while next.peek().is_some_and(|&e| e <= t) {
                next.next();
            }
            (ssthresh, w, slow_start, restarting) = (w.max(2.0), 1.0, true, true);
            continue;
        }
        // The first slow start crosses an emptier path than the rest.
        let round = if slow_start && !restarting {
            path.slow_start_rtt_s
        } else {
            rtt
        };
        let step = round.min(duration_s - t);
        let held = held_spans.within(t, t + step);
        let bits = path.rate(w, round) * (step - held) + path.rate(w * c.beta(), round) * held;
        delivered_bits += bits;
        since_loss += bits / (8.0 * path.mss_bytes);
        t += step;
        // Each episode in this round trip reduces once (one recovery).
        let mut due = false;
        while next.peek().is_some_and(|&e| e <= t) {
            next.next();
            due = true;
        }
        if let Reductions::EverySegments(n) = reductions {
            if since_loss >= n {
                since_loss -= n;
                due = true;
            }
        }
        if due {
            (slow_start, restarting) = (false, false);
            match c {
                Congestion::Reno => w = (w * c.beta()).max(2.0),
                Congestion::Cubic => {
                    // Fast convergence (RFC 8312 §4.6, on in Linux): a
                    // window that fell short of the last maximum gives up
                    // some of it.
                    w_max = if w < w_max {
                        w * (1.0 + CUBIC_BETA) / 2.0
                    } else {
                        w
                    };
                    w = (w * c.beta()).max(2.0);
                    (epoch_start, w_epoch, w_est) = (t, w, w);
                }
            }
            continue;
        }
        if slow_start {
            w = (w * 2.0).min(ssthresh);
            slow_start = w < ssthresh;
            if !restarting {
                (w_max, w_est) = (w, w);
                if !slow_start {
                    // (CUBIC's first epoch grows from where it ended.)
                    (epoch_start, w_epoch) = (t, w);
                }
            } else if !slow_start {
                // Back at the window the timer found: CUBIC's epoch
                // starts again there, its maximum kept.
                (epoch_start, w_epoch, w_est) = (t, w, w);
                restarting = false;
            }
            continue;
        }
        match c {
            Congestion::Reno => w += 1.0,
            Congestion::Cubic => {
                // RFC 9438 §4.2 (as Linux): the time to regain W_max from
                // the window the epoch began with.
                let k = ((w_max - w_epoch).max(0.0) / CUBIC_C).cbrt();
                let elapsed = t - epoch_start + rtt;
                let cubic = CUBIC_C * (elapsed - k).powi(3) + w_max;
                // TCP-friendly estimate (RFC 8312 §4.2), per round trip.
                w_est += 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA);
                w = cubic.max(w_est);
            }
        }
        // Beyond the queue: what a real sender's losses there enforce.
        w = w.min(cap);
    }
    (delivered_bits / duration_s, stepped)
}

/// Standard TCP's average window at loss-event rate `p` (RFC 3649): 1.2/√p.
pub fn reno_window(p: f64) -> f64 {
    1.2 / p.sqrt()
}

/// Mathis et al.: rate = MSS/RTT · √(3/2) / √p.
pub fn mathis_bps(path: &Path, p: f64) -> f64 {
    if p <= 0.0 {
        return path.bottleneck_bps;
    }
    path.rate((1.5f64).sqrt() / p.sqrt(), path.rtt_s)
}

/// Padhye et al. (PFTK), with delayed ACKs (b = 2) and a 200 ms RTO.
pub fn padhye_bps(path: &Path, p: f64) -> f64 {
    if p <= 0.0 {
        return path.bottleneck_bps;
    }
    let (b, rto, rtt) = (2.0, 0.2, path.rtt_s);
    let denom = rtt * (2.0 * b * p / 3.0).sqrt()
        + rto * (3.0 * (3.0 * b * p / 8.0).sqrt()).min(1.0) * p * (1.0 + 32.0 * p * p);
    let segments_per_s = 1.0 / denom;
    (segments_per_s * path.mss_bytes * 8.0).min(path.bottleneck_bps)
}

/// RFC 8312 Eq. 5 with its TCP-friendly floor, as in its Table 1.
pub fn cubic_window(p: f64, rtt_s: f64) -> f64 {
    let k = (CUBIC_C * (3.0 + CUBIC_BETA) / (4.0 * (1.0 - CUBIC_BETA))).powf(0.25);
    (k * rtt_s.powf(0.75) / p.powf(0.75)).max(reno_window(p))
}

pub fn cubic_response_bps(path: &Path, p: f64) -> f64 {
    if p <= 0.0 {
        return path.bottleneck_bps;
    }
    path.rate(cubic_window(p, path.rtt_s), path.rtt_s)
}

/// The loss-event rate at which CUBIC's average window fills `path`.
pub fn cubic_loss_rate_for(path: &Path) -> f64 {
    // Bisection on log p: the window falls as p grows.
    let target = path.bdp_segments();
    let (mut lo, mut hi) = (-20.0f64, 0.0f64);
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if cubic_window(10f64.powf(mid), path.rtt_s) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    10f64.powf((lo + hi) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Taking a full window's round trips at once changes nothing: against
    /// stepping every round trip, over random recoveries, undone spans and
    /// timeouts, on paths from 50 µs to 200 ms.
    #[test]
    fn the_steady_window_taken_at_once_is_every_round_trip_stepped() {
        let mut rng = 0x2545_f491_9e37_79b9_u64;
        let mut uniform = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        for case in 0..200 {
            let rtt_s = 50e-6 * (4000.0f64).powf(uniform());
            let path = Path {
                rtt_s,
                slow_start_rtt_s: rtt_s * (0.5 + uniform()),
                mss_bytes: 1448.0,
                bottleneck_bps: 1e7 * 1000f64.powf(uniform()),
                queue_bdp: 2.0 * uniform(),
            };
            let duration_s = 0.2 + 3.0 * uniform();
            let times = |n: usize, u: &mut dyn FnMut() -> f64| {
                let mut v: Vec<f64> = (0..n).map(|_| duration_s * u()).collect();
                v.sort_by(f64::total_cmp);
                v
            };
            let episodes = times((uniform() * 12.0) as usize, &mut uniform);
            let undone: Vec<(f64, f64)> = times((uniform() * 4.0) as usize, &mut uniform)
                .into_iter()
                .map(|a| (a, a + 0.1 * uniform()))
                .collect();
            let timeouts = times((uniform() * 3.0) as usize, &mut uniform);
            for c in [Congestion::Cubic, Congestion::Reno] {
                let run = (
                    Reductions::At(&episodes),
                    Undone(&undone),
                    Timeouts {
                        at: &timeouts,
                        rto_s: 0.2 + rtt_s,
                    },
                    Start::SlowStart(10.0),
                    duration_s,
                );
                let (fast, _) = simulate_rounds(c, &path, run, true);
                let (reference, _) = simulate_rounds(c, &path, run, false);
                assert!(
                    (fast / reference - 1.0).abs() < 1e-9,
                    "case {case} {c:?}: {fast} vs {reference} ({path:?}, {duration_s} s)"
                );
            }
        }
    }

    /// An edge host's 4-tuple: an hour at a 50 µs round trip (72 million
    /// round trips) with a recovery every ten minutes costs a few hundred
    /// steps, not the round trips.
    #[test]
    fn an_hour_at_a_short_round_trip_costs_its_events_not_its_round_trips() {
        let path = Path {
            rtt_s: 50e-6,
            slow_start_rtt_s: 50e-6,
            mss_bytes: 1448.0,
            bottleneck_bps: 10e9,
            queue_bdp: 1.0,
        };
        let episodes: Vec<f64> = (1..6).map(|k| k as f64 * 600.0).collect();
        let timeouts = Timeouts {
            at: &[1800.5],
            rto_s: 0.2,
        };
        let run = (
            Reductions::At(&episodes),
            Undone(&[(100.0, 100.1)]),
            timeouts,
            Start::SlowStart(10.0),
            3600.0,
        );
        let (bps, stepped) = simulate_rounds(Congestion::Cubic, &path, run, true);
        assert!(stepped < 1000, "{stepped} steps");
        assert!((bps / 10e9 - 1.0).abs() < 1e-3, "{bps}");
    }

    #[test]
    fn rfc8312_table_1_cubic_c_0_4() {
        // Loss rate -> average window (segments) at RTT 0.1 s.
        for (p, want) in [
            (1e-2, 12.0),
            (1e-3, 38.0),
            (1e-4, 187.0),
            (1e-5, 1054.0),
            (1e-6, 5926.0),
            (1e-7, 33325.0),
            (1e-8, 187400.0),
        ] {
            let got = cubic_window(p, 0.1);
            assert!(
                (got - want).abs() <= want * 0.005 + 0.5,
                "p {p}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn an_undone_recovery_costs_what_its_held_window_leaves_of_the_link() {
        // 100 ms of a second held at β: a window that just fills the link
        // then leaves 30% of it unused; one the queue doubles, none.
        let path = |queue_bdp| Path {
            rtt_s: 0.001,
            slow_start_rtt_s: 0.001,
            mss_bytes: 1250.0,
            bottleneck_bps: 100e6,
            queue_bdp,
        };
        let run = |path: &Path, undone| {
            let full = path.max_window();
            let r = Reductions::At(&[]);
            simulate(
                Congestion::Cubic,
                path,
                r,
                undone,
                Timeouts::NONE,
                Start::Window(full),
                1.0,
            )
        };
        let spans = Undone(&[(0.5, 0.6)]);
        let (no_queue, queue) = (path(0.0), path(1.0));
        assert!((run(&no_queue, spans) / 100e6 - 0.97).abs() < 1e-9);
        assert!((run(&queue, spans) / 100e6 - 1.0).abs() < 1e-9);
        assert!((run(&no_queue, Undone::NONE) / 100e6 - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_timeout_idles_its_rto_then_slow_starts_back_to_its_window() {
        // A full 1 ms path: 200 ms of nothing in a second, then 1, 2, 4,
        // ... back to the window the timer found, within a few round trips.
        let path = Path {
            rtt_s: 0.001,
            slow_start_rtt_s: 0.001,
            mss_bytes: 1250.0,
            bottleneck_bps: 100e6,
            queue_bdp: 1.0,
        };
        let full = path.max_window();
        let run = |timeouts| {
            simulate(
                Congestion::Cubic,
                &path,
                Reductions::At(&[]),
                Undone::NONE,
                timeouts,
                Start::Window(full),
                1.0,
            )
        };
        let timeouts = Timeouts {
            at: &[0.5],
            rto_s: 0.2,
        };
        let (with, without) = (run(timeouts), run(Timeouts::NONE));
        assert!((without / 100e6 - 1.0).abs() < 1e-9, "{without}");
        let lost = 1.0 - with / without;
        // The 200 ms, and under 5 ms of regrowth (20 segments: 5 doublings).
        assert!((0.2..0.205).contains(&lost), "{lost}");
    }

    #[test]
    fn ten_gigabit_over_100_ms_needs_a_loss_rate_near_3e_8() {
        // The seed: "reaching 10 Gbps over a 100 ms RTT requires a packet
        // loss rate below 0.000003%".
        let path = Path {
            rtt_s: 0.1,
            slow_start_rtt_s: 0.1,
            mss_bytes: 1448.0,
            bottleneck_bps: 10e9,
            queue_bdp: 0.0,
        };
        let p = cubic_loss_rate_for(&path);
        assert!((2.5e-8..3.5e-8).contains(&p), "{p}");
    }

    #[test]
    fn closed_forms_agree_with_the_simulation_at_a_steady_loss_rate() {
        let path = Path {
            rtt_s: 0.1,
            slow_start_rtt_s: 0.1,
            mss_bytes: 1448.0,
            bottleneck_bps: 100e9,
            queue_bdp: 0.0,
        };
        // One loss event every 1/p segments (the formulas' loss model),
        // long enough to forget the start.
        for p in [1e-4, 1e-5, 1e-6] {
            let every = Reductions::EverySegments(1.0 / p);
            let start = cubic_window(p, 0.1);
            let sim = simulate(
                Congestion::Cubic,
                &path,
                every,
                Undone::NONE,
                Timeouts::NONE,
                Start::Window(start),
                3000.0,
            );
            let formula = cubic_response_bps(&path, p);
            assert!(
                (sim / formula - 1.0).abs() < 0.15,
                "p {p}: sim {sim} vs {formula}"
            );
            let reno = simulate(
                Congestion::Reno,
                &path,
                every,
                Undone::NONE,
                Timeouts::NONE,
                Start::Window(reno_window(p)),
                3000.0,
            );
            let mathis = mathis_bps(&path, p);
            assert!(
                (reno / mathis - 1.0).abs() < 0.15,
                "p {p}: reno {reno} vs {mathis}"
            );
            // Padhye without timeouts is Mathis with delayed ACKs.
            assert!(padhye_bps(&path, p) < mathis);
        }
    }

    /// A path of 80 segments' BDP over 100 ms.
    fn eighty(queue_bdp: f64) -> Path {
        Path {
            rtt_s: 0.1,
            slow_start_rtt_s: 0.1,
            mss_bytes: 1448.0,
            bottleneck_bps: 80.0 * 1448.0 * 8.0 / 0.1,
            queue_bdp,
        }
    }

    #[test]
    fn slow_start_doubles_from_ten_segments_until_the_path_is_full() {
        // 10, 20, 40 segments, then 80 for the seven round trips left.
        let r = simulate(
            Congestion::Cubic,
            &eighty(0.0),
            Reductions::At(&[]),
            Undone::NONE,
            Timeouts::NONE,
            Start::SlowStart(10.0),
            1.0,
        );
        let want = (10.0 + 20.0 + 40.0 + 7.0 * 80.0) * 1448.0 * 8.0;
        assert!((r - want).abs() < 1.0, "{r} vs {want}");
    }

    #[test]
    fn a_slow_start_over_an_empty_path_doubles_at_its_round_trip() {
        // Half the round trip while the window grows: 10, 20, 40 in
        // 150 ms, then 80 at 100 ms for the 850 ms left.
        let path = Path {
            slow_start_rtt_s: 0.05,
            ..eighty(0.0)
        };
        let r = simulate(
            Congestion::Cubic,
            &path,
            Reductions::At(&[]),
            Undone::NONE,
            Timeouts::NONE,
            Start::SlowStart(10.0),
            1.0,
        );
        let want = (10.0 + 20.0 + 40.0 + 8.5 * 80.0) * 1448.0 * 8.0;
        assert!((r - want).abs() < 1.0, "{r} vs {want}");
    }

    #[test]
    fn hystart_fills_the_link_but_leaves_no_queue_to_reduce_into() {
        let run = |path: &Path, start, at: &[f64]| {
            simulate(
                Congestion::Cubic,
                path,
                Reductions::At(at),
                Undone::NONE,
                Timeouts::NONE,
                start,
                3.0,
            )
        };
        let both = [Start::SlowStart(10.0), Start::HyStart(10.0)];
        // With no reduction, slow start to the link (HyStart) or to the
        // queue's end gives the same: 10, 20, 40, then the link's 80.
        let want = (10.0 + 20.0 + 40.0 + 27.0 * 80.0) * 1448.0 * 8.0 / 3.0;
        for start in both {
            let r = run(&eighty(1.0), start, &[]);
            assert!((r - want).abs() < 1.0, "{start:?}: {r} vs {want}");
        }
        // A reduction at 1 s: from 160 segments (a full queue) 0.7 still
        // fills the link; from HyStart's (80, grown to at most 84 by CUBIC's
        // TCP-friendly half segment a round trip) 0.7 is at most 59, and
        // the first round trip after it alone delivers 21 segments fewer.
        let r = run(&eighty(1.0), Start::SlowStart(10.0), &[1.0]);
        assert!((r - want).abs() < 1.0);
        let short = 21.0 * 1448.0 * 8.0 / 3.0;
        let r = run(&eighty(1.0), Start::HyStart(10.0), &[1.0]);
        assert!(r < want - short, "{r} vs {}", want - short);
        // A path that holds less than two segments: HyStart's exit is its
        // hold, and the window fills it.
        let tiny = Path {
            bottleneck_bps: 0.5 * 1448.0 * 8.0 / 0.1,
            ..eighty(0.0)
        };
        for start in both {
            let r = run(&tiny, start, &[]);
            assert!((r - tiny.bottleneck_bps).abs() < 1.0, "{start:?}: {r}");
        }
    }

    #[test]
    fn a_queue_of_one_bdp_keeps_the_link_full_through_a_reduction() {
        // From a full queue (2 BDP), 0.7 of it is still more than the link
        // holds; without a queue the window falls below it and regrows.
        let full = |q| {
            simulate(
                Congestion::Cubic,
                &eighty(q),
                Reductions::At(&[1.0]),
                Undone::NONE,
                Timeouts::NONE,
                Start::Window(f64::INFINITY),
                5.0,
            )
        };
        let link = eighty(0.0).bottleneck_bps;
        assert!((full(1.0) - link).abs() < 1.0, "{}", full(1.0));
        assert!(full(0.0) < 0.99 * link, "{}", full(0.0));
    }

    #[test]
    fn no_episodes_fill_the_bottleneck() {
        let path = Path {
            rtt_s: 0.01,
            slow_start_rtt_s: 0.01,
            mss_bytes: 1448.0,
            bottleneck_bps: 1e9,
            queue_bdp: 0.0,
        };
        for c in [Congestion::Cubic, Congestion::Reno] {
            let r = simulate(
                c,
                &path,
                Reductions::At(&[]),
                Undone::NONE,
                Timeouts::NONE,
                Start::Window(f64::INFINITY),
                5.0,
            );
            assert!((r - 1e9).abs() < 1.0, "{r}");
        }
        assert_eq!(mathis_bps(&path, 0.0), 1e9);
    }
}
