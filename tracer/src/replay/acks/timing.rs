//! The replay's clock is the receiver's, shifted so that transmit and ACK
//! times compare: the sender hears of an arrival when its ACK reached the
//! sender's TCP (measured ACK by ACK when the sender's socket is this
//! host's, else an assumed delay), and a retransmission leaves as late
//! after its ACK as the real sender's did.

use std::collections::HashMap;

use super::super::{AckLog, Assumptions, Source};

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
pub(super) fn transmit_lags(log: &AckLog) -> Vec<(u64, u64)> {
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
pub(super) fn nearest_lag(lags: &[(u64, u64)], now: u64) -> u64 {
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
pub(super) fn heard_times(log: &AckLog, a: &Assumptions) -> Vec<u64> {
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
