//! A sender's loss detection replayed ACK by ACK — RACK-TLP as a Linux
//! sender runs it, or RFC 6675's DupThresh (the classic policy) — over the
//! order in which the receiving TCP processed the data (its `tcp_probe`
//! view: that order, not the wire's, is what its ACKs reported).
//!
//! It needs the receiver's TCP layer and TCP timestamps; without them the
//! replay works from the wire's late originals ([`super::policy`]).
//! [`clock`]: when each segment was sent; [`timing`]: when the sender
//! heard of each arrival; [`sim`]: what the sender does on each ACK.

mod clock;
mod sim;
mod timing;

pub use clock::SendClock;
pub use timing::median_ack_delay_ns;

use super::{AckLog, Assumptions};

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

/// How the replayed sender decides a segment is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detection {
    /// RFC 8985 RACK-TLP as Linux runs it, with its undo (timestamps and
    /// DSACK); `dsack`: the receiver sends DSACKs, which widen its
    /// reordering window.
    Rack {
        dupthresh: u32,
        reo_wnd_mult: u32,
        dsack: bool,
    },
    /// RFC 6675 IsLost: more than (DupThresh - 1) segments' bytes SACKed
    /// above; no reordering timer; undo as Linux's or none.
    DupThresh { dupthresh: u32, undo: bool },
}

/// Replays the receiver's TCP-layer arrivals through the sender's loss
/// detection (RACK-TLP or DupThresh).
pub fn run<'a>(
    log: &'a AckLog,
    clock: SendClock<'a>,
    a: &Assumptions,
    detection: Detection,
) -> AckReplay {
    match sim::Sim::new(log, clock, a, detection) {
        Some(s) => s.replay(&timing::heard_times(log, a)),
        None => AckReplay::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::{
        timing::{heard_times, nearest_lag, transmit_lags},
        *,
    };
    use std::collections::BTreeMap;

    use crate::replay::{Source, TcpArrival, TickMark};

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
            hystart: false,
            receiver_dsack: true,
            receiver_dsack_from: Source::Given,
            timestamps: true,
            classic_undo: crate::replay::ClassicUndo::Dsack,
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
        dsack: true,
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
