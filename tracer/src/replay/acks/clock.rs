//! Transmit times. When the sender's socket is this host's, from it: its
//! SND.NXT as it took each ACK, since what an ACK releases leaves right
//! after it. Else from its timestamp clock, which ticks every millisecond
//! (Linux): the first segment carrying a new TSval left just after a tick,
//! and between two such segments transmit times are interpolated by
//! sequence number (segments leave in sequence order), put on the
//! receiver's clock by the smallest observed forward delay. Queueing on the
//! paths is then what it was; but a burst sent at once looks spread over
//! its tick, so RACK, which compares transmit times, finds late segments
//! sent long before those that overtook them (README: the timestamp
//! clock over-predicts RACK-TLP's spurious retransmissions).

use super::super::TickMark;

/// Linux's TCP timestamp clock.
pub(super) const TS_TICK_NS: f64 = 1e6;

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
