//! The queue a flow's round trips met, seen from the receiver alone.
//!
//! A handshake crosses an empty path; the data after it queues at the
//! bottleneck behind the flow's own window and the other flows'. The
//! window simulation ([`super::throughput`]) builds the flow's own queue
//! itself (a window past the path's bandwidth-delay product only queues),
//! so the replay's round trip is the handshake's plus the part of the
//! queue the others made: the queueing delay times the share of the
//! link's bytes that were not the flow's (a FIFO holds each flow's bytes
//! in proportion to its rate).
//!
//! With TCP timestamps, a data segment echoes (TSecr) the TSval of the
//! latest ACK its sender had from this host, on this host's TCP clock
//! (1 ms ticks of CLOCK_MONOTONIC, plus a per-connection offset): arrival
//! minus echo is a round trip plus a constant, and its excess over its
//! minimum is the queueing (Linux's receiver measures its RTT so,
//! `tcp_rcv_rtt_measure_ts`). Without timestamps (a classic sender), each
//! fast retransmission tells a round trip: the first segment above a hole
//! had the receiver send a duplicate ACK, and the retransmission the third
//! one triggered arrived a round trip (and two segments) later; the
//! median, less the flow's least round trip, is the queueing (one later
//! than Linux's minimum RTO, 200 ms, past it may have waited for its
//! timer: not counted). Biased (a loss at a drop-tail queue comes when it
//! is full; a recovery's retransmissions leave at PRR's pace, the later
//! ones later), they count when there are ten or more. The flow may also
//! have met the queue the flows with timestamps measured in the link's
//! bins it had data in (the same FIFO, if they shared it:
//! [`super::share`]; but in the lab each guest queues at its own egress,
//! 34 ms against another's 120, as an edge host's clients each behind its
//! own uplink). Both err high: the lower is taken; failing both, the few
//! retransmissions there were.

use super::RTO_MIN_NS;

/// Echoes must span this long (arrival time) before they count, and their
/// ticks must advance at 1 ms per ms over it (a clock of another unit, such
/// as a connection's microsecond timestamps, is not read).
const MIN_ECHO_SPAN_NS: u64 = 100_000_000;
const TICK_NS: i64 = 1_000_000;
/// Fast retransmissions' round trips kept (the first ones).
const MAX_RETRANSMIT_RTTS: usize = 1024;

/// What a flow's echoed timestamps and retransmissions say of the queue
/// its data met.
#[derive(Clone, Debug, Default)]
pub struct Queueing {
    echoes: Option<Echoes>,
    /// Round trips of retransmissions, µs.
    retransmit_rtts: Vec<u32>,
}

/// Arrival minus echoed TSval, ns, relative to the first echo's.
#[derive(Clone, Copy, Debug)]
struct Echoes {
    first_ns: u64,
    first_tsecr: u32,
    min: i64,
    sum: f64,
    count: u64,
    /// The latest arrival (ns after the first) and its echo's ticks after
    /// the first's.
    span_ns: u64,
    span_ticks: i64,
}

impl Echoes {
    /// Whether the echoes span long enough, on a 1 ms clock.
    fn readable(&self) -> bool {
        let rate = (self.span_ticks * TICK_NS) as f64 / self.span_ns as f64;
        self.span_ns >= MIN_ECHO_SPAN_NS && (0.9..1.1).contains(&rate)
    }
}

/// An echo reads its ACK's time a fraction of a tick early, the minimum's
/// by almost nothing (of many, one was sent at a tick's start): on
/// average, half a tick.
const TICK_BIAS_NS: f64 = TICK_NS as f64 / 2.0;

impl Queueing {
    /// A data segment arrived at `ts_ns` echoing `tsecr` (none: no
    /// timestamps; 0: nothing echoed yet). Returns the queueing it met,
    /// ns, as far as the echoes so far tell (the minimum may still fall;
    /// with the tick's rounding, one may read below zero), once they can
    /// be read.
    pub fn echo(&mut self, ts_ns: u64, tsecr: Option<u32>) -> Option<f64> {
        let tsecr = tsecr.filter(|&e| e != 0)?;
        let e = self.echoes.get_or_insert(Echoes {
            first_ns: ts_ns,
            first_tsecr: tsecr,
            min: 0,
            sum: 0.0,
            count: 0,
            span_ns: 0,
            span_ticks: 0,
        });
        let since = ts_ns as i64 - e.first_ns as i64;
        let ticks = i64::from(tsecr.wrapping_sub(e.first_tsecr) as i32);
        let d = since - ticks * TICK_NS;
        e.min = e.min.min(d);
        e.sum += d as f64;
        e.count += 1;
        if since > e.span_ns as i64 {
            e.span_ns = since as u64;
            e.span_ticks = ticks;
        }
        e.readable().then(|| (d - e.min) as f64 - TICK_BIAS_NS)
    }

    /// A retransmission arrived `rtt_ns` after the first segment above
    /// its hole. Returns the heap bytes this took.
    pub fn retransmission(&mut self, rtt_ns: u64) -> u64 {
        let v = &mut self.retransmit_rtts;
        if v.len() == MAX_RETRANSMIT_RTTS {
            return 0;
        }
        let before = v.capacity();
        v.push(u32::try_from(rtt_ns / 1000).unwrap_or(u32::MAX));
        ((v.capacity() - before) * size_of::<u32>()) as u64
    }

    pub fn held_bytes(&self) -> u64 {
        (self.retransmit_rtts.capacity() * size_of::<u32>()) as u64
    }

    /// The mean queueing delay, ns, if the echoes tell it.
    pub fn echoed_ns(&self) -> Option<f64> {
        let e = self.echoes.filter(Echoes::readable)?;
        Some((e.sum / e.count as f64 - e.min as f64 - TICK_BIAS_NS).max(0.0))
    }

    /// The least round trip the flow's data told, ns. With timestamps,
    /// read against the SYN's arrival (`syn_ns`): the first data to arrive
    /// echoes the SYN-ACK's TSval, sent as the SYN arrived, so its arrival
    /// less the SYN's is its round trip, and each later echo's difference
    /// from it is known to a tick. Without, from the fast
    /// retransmissions' round trips, once there are ten: their tenth
    /// percentile (not the least: a retransmission may answer an earlier
    /// hole's ACKs), or less, their median less `link_queueing_ns`, the
    /// queueing the flows with timestamps measured on the link it shared
    /// (each round trip met the queue as it was), but not less than the
    /// least of them.
    pub fn least_round_trip_ns(
        &self,
        syn_ns: Option<u64>,
        link_queueing_ns: Option<f64>,
    ) -> Option<f64> {
        let echoed = self.echoes.filter(Echoes::readable).zip(syn_ns);
        if let Some((e, syn)) = echoed.filter(|(e, syn)| e.first_ns > *syn) {
            let first = (e.first_ns - syn) as f64;
            return Some((first + e.min as f64 + TICK_BIAS_NS).max(0.0));
        }
        if !self.many_retransmissions() {
            return None;
        }
        let mut rtts = self.retransmit_rtts.clone();
        rtts.sort_unstable();
        let ns = |i: usize| f64::from(rtts[i]) * 1000.0;
        let (least, low, median) = (ns(0), ns(rtts.len() / 10), ns(rtts.len() / 2));
        // (Never below the least of them: the link's queueing may have
        // been another host's own, not on this flow's path.)
        let unqueued = link_queueing_ns.map_or(low, |q| (median - q).max(least));
        Some(low.min(unqueued))
    }

    /// Enough fast retransmissions (ten) for their round trips to say more
    /// than the link's other flows do.
    pub fn many_retransmissions(&self) -> bool {
        self.retransmit_rtts.len() >= 10
    }

    /// The median fast retransmission's round trip past `base_rtt_ns`
    /// (the flow's least round trip), ns.
    pub fn retransmitted_ns(&self, base_rtt_ns: u64) -> Option<f64> {
        let mut fast: Vec<u64> = self
            .retransmit_rtts
            .iter()
            .map(|&us| u64::from(us) * 1000)
            .filter(|&ns| ns < base_rtt_ns + RTO_MIN_NS)
            .collect();
        if fast.is_empty() {
            return None;
        }
        let mid = fast.len() / 2;
        let median = *fast.select_nth_unstable(mid).1;
        Some(median.saturating_sub(base_rtt_ns) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A flow whose ACKs leave this host every 0.7 ms (at every point of
    /// a tick) and whose data arrives `rtt(n)` after the n-th ACK it
    /// echoes; its TSval clock starts at `offset`.
    fn echoed(rtt_ms: impl Fn(u64) -> u64, offset: u32) -> Queueing {
        let mut q = Queueing::default();
        for n in 0..2000u64 {
            let ack_ns = 5 * MS + 300_000 + n * MS * 7 / 10;
            let tsval = offset.wrapping_add((ack_ns / MS) as u32);
            q.echo(ack_ns + rtt_ms(n) * MS, Some(tsval));
        }
        q
    }

    /// Within `by` ms of `ms`.
    fn near(ns: f64, ms: f64, by: f64) -> bool {
        (ns - ms * MS as f64).abs() < by * MS as f64
    }

    #[test]
    fn echoes_measure_the_queue_over_the_empty_round_trip() {
        // 80 ms empty, then 50 ms of queue for the second half: 25 ms mean
        // (the TSval clock wrapping on the way).
        let q = echoed(|n| if n < 1000 { 80 } else { 130 }, u32::MAX - 300);
        assert!(near(q.echoed_ns().unwrap(), 25.0, 0.1), "{q:?}");
        // An empty path: no queue (the tick's rounding is not one).
        let q = echoed(|_| 80, 7);
        assert!(near(q.echoed_ns().unwrap(), 0.0, 0.1), "{q:?}");
    }

    #[test]
    fn each_segment_reads_the_queue_it_met() {
        let mut q = echoed(|_| 80, 7);
        let last_ack = 5 * MS + 300_000 + 1999 * MS * 7 / 10;
        let met = q.echo(last_ack + 130 * MS, Some(7 + (last_ack / MS) as u32));
        // One segment's reading is right within half a tick.
        assert!(near(met.unwrap(), 50.0, 0.5), "{met:?}");
        // Without timestamps, or before anything was echoed: nothing.
        assert_eq!(q.echo(last_ack + 131 * MS, None), None);
        assert_eq!(q.echo(last_ack + 131 * MS, Some(0)), None);
    }

    #[test]
    fn the_least_round_trip_is_read_against_the_syn() {
        // The first half of the data took 130 ms (a queue, or a sender
        // slow to answer), the second 80; the first echo echoes the
        // SYN-ACK, sent as the SYN arrived: 130 ms before it.
        let q = echoed(|n| if n < 1000 { 130 } else { 80 }, 7);
        let syn = 5 * MS + 300_000;
        let least = q.least_round_trip_ns(Some(syn), None).unwrap();
        assert!(near(least, 80.0, 0.5), "{least}");
        // Without the SYN, or with fewer than ten fast retransmissions,
        // nothing; with ten or more, their tenth percentile.
        assert_eq!(q.least_round_trip_ns(None, None), None);
        let mut bare = Queueing::default();
        for ms in [90, 85, 60, 120, 130, 100, 95, 88, 86] {
            bare.retransmission(ms * MS);
        }
        assert_eq!(bare.least_round_trip_ns(Some(syn), None), None);
        bare.retransmission(300 * MS);
        assert_eq!(bare.least_round_trip_ns(None, None), Some(85e6));
        // The link's flows with timestamps measured 20 ms of queueing:
        // the median (95 ms) less it; 15 ms, more than the tenth
        // percentile: that.
        assert_eq!(bare.least_round_trip_ns(None, Some(20e6)), Some(75e6));
        assert_eq!(bare.least_round_trip_ns(None, Some(5e6)), Some(85e6));
        // 80 ms of the link's queueing was not all this flow's: its least.
        assert_eq!(bare.least_round_trip_ns(None, Some(80e6)), Some(60e6));
    }

    #[test]
    fn a_clock_of_another_unit_is_not_read() {
        let mut q = Queueing::default();
        for t in 0..1000u64 {
            // Microsecond ticks.
            q.echo(90 * MS + t * MS, Some(1 + (t * 1000) as u32));
        }
        assert_eq!(q.echoed_ns(), None);
        // Echoes over less than 100 ms are too few to tell.
        let mut q = Queueing::default();
        for t in 0..50u64 {
            assert_eq!(q.echo(90 * MS + t * MS, Some(1 + t as u32)), None);
        }
        assert_eq!(q.echoed_ns(), None);
    }

    #[test]
    fn without_echoes_the_median_fast_retransmission_tells() {
        let mut q = Queueing::default();
        assert_eq!(q.retransmitted_ns(80 * MS), None);
        // Fast retransmissions after 120-135 ms; two waited for the timer.
        for ms in [120, 130, 400, 125, 135, 290] {
            q.retransmission(ms * MS);
        }
        assert_eq!(q.retransmitted_ns(80 * MS), Some(50e6));
        assert_eq!(q.echoed_ns(), None);
        assert!(q.held_bytes() >= 6 * 4);
        // Only timeouts: nothing told.
        let mut q = Queueing::default();
        q.retransmission(300 * MS);
        assert_eq!(q.retransmitted_ns(80 * MS), None);
    }
}
