//! The bottleneck the traced flows cross together.
//!
//! Every flow the tracer sees arrives over the one traced link, so flows
//! active at once share at least that link, and often the path's
//! bottleneck. A flow's own peak rate is then not what a sender could have
//! had: the replay gives each flow what the other flows left of the link's
//! peak, or its fair share of it if that is more (flows that took more
//! than their share would have yielded to a sender that asked for more).
//! With one flow, that is the flow's own peak, as before.
//!
//! The link's bins also keep the queueing the flows with timestamps
//! measured ([`super::queueing`]): a flow without timestamps met the same
//! queue in the bins it shared with them. A flow's first bins keep theirs
//! apart: its slow start crossed the path as it was then (flows that start
//! together fill an empty queue; one that joins meets a standing one).

use super::RATE_BIN_NS;

/// Bins the link remembers: a flow that paused longer than this
/// (6.4 s) finds its last bin forgotten, and that bin does not count.
const RING: usize = 64;

/// A flow's first bins (1 s), whose queueing each is kept: its slow
/// start's.
pub const EARLY_BINS: usize = 10;

/// One [`RATE_BIN_NS`] bin of the link: every flow's payload bytes, and
/// the queueing its segments with timestamps met (ns: sum, count).
#[derive(Clone, Copy, Debug, Default)]
struct Bin {
    index: u64,
    bytes: u64,
    flows: u32,
    queued_ns: f64,
    queued: u32,
}

/// The traced link's recent bins (every data segment's payload, of every
/// flow: retransmissions take the link too) and its busiest bin.
#[derive(Clone, Debug)]
pub struct Link {
    bins: [Bin; RING],
    peak_bytes: u64,
}

impl Default for Link {
    fn default() -> Self {
        Self {
            bins: [Bin::default(); RING],
            peak_bytes: 0,
        }
    }
}

impl Link {
    /// Adds `bytes` to the bin `index` (started when first met; nothing
    /// once forgotten), counting one more flow in it if `new_flow`, and
    /// the queueing the segment met if its timestamps told it.
    fn add(&mut self, index: u64, bytes: u64, new_flow: bool, queued_ns: Option<f64>) {
        let b = &mut self.bins[index as usize % RING];
        if b.index < index {
            *b = Bin {
                index,
                ..Bin::default()
            };
        }
        if b.index == index {
            b.flows += u32::from(new_flow);
            b.bytes += bytes;
            if let Some(q) = queued_ns {
                b.queued_ns += q;
                b.queued += 1;
            }
            self.peak_bytes = self.peak_bytes.max(b.bytes);
        }
    }

    fn closed(&self, index: u64) -> Option<&Bin> {
        let b = &self.bins[index as usize % RING];
        (b.index == index && b.flows > 0).then_some(b)
    }

    /// The link's peak over [`RATE_BIN_NS`] bins, bit/s.
    pub fn peak_bps(&self) -> f64 {
        bin_bps(self.peak_bytes as f64)
    }

    /// What `flow` shared the link with over the bins it had data in.
    pub fn sharing(&self, flow: &Share) -> Sharing {
        let mut s = *flow;
        if let Some(b) = self.closed(s.bin).filter(|_| s.own > 0) {
            s.close(b);
        }
        let all = (s.own_bytes + s.others_bytes) as f64;
        let (part, fair) = if all > 0.0 {
            (s.own_bytes as f64 / all, s.fair_bytes / all)
        } else {
            (1.0, 1.0)
        };
        Sharing {
            link_peak_bps: self.peak_bps(),
            part,
            flows: 1.0 / fair,
            queueing_ns: (s.queued_bytes > 0)
                .then(|| (s.queued_ns / s.queued_bytes as f64).max(0.0)),
            early_queueing_ns: s.early,
        }
    }
}

/// Bytes in one bin as bit/s.
fn bin_bps(bytes: f64) -> f64 {
    bytes * 8e9 / RATE_BIN_NS as f64
}

/// One flow's side of the link: its current bin, and what it and the
/// others sent in the bins it closed. Sums of bytes, so that a bin the
/// trace or the flow covers only in part weighs only as much.
#[derive(Clone, Copy, Debug, Default)]
pub struct Share {
    bin: u64,
    /// The flow's bytes in `bin` (0: no bin yet).
    own: u64,
    own_bytes: u64,
    others_bytes: u64,
    /// Σ (all flows' bytes / flows) over those bins: its fair share.
    fair_bytes: f64,
    /// Σ own bytes × the bin's mean queueing, over the bins whose
    /// queueing was measured, and those own bytes.
    queued_ns: f64,
    queued_bytes: u64,
    /// The flow's first bin, and the mean queueing measured in each of its
    /// first [`EARLY_BINS`].
    first_bin: Option<u64>,
    early: [Option<f32>; EARLY_BINS],
}

impl Share {
    /// A data segment of this flow took the link at `ts_ns` (having met
    /// `queued_ns` of queueing, if its timestamps told).
    pub fn arrival(&mut self, link: &mut Link, ts_ns: u64, payload: u32, queued_ns: Option<f64>) {
        let index = ts_ns / RATE_BIN_NS;
        self.first_bin.get_or_insert(index);
        let new_bin = self.own == 0 || index > self.bin;
        if new_bin {
            if let Some(b) = link.closed(self.bin).filter(|_| self.own > 0) {
                let b = *b;
                self.close(&b);
            }
            self.bin = index;
            self.own = 0;
        }
        // A segment a little out of time order (another CPU's) counts in
        // its own bin, the flow staying in its latest.
        link.add(index, u64::from(payload), new_bin, queued_ns);
        if index == self.bin {
            self.own += u64::from(payload);
        }
    }

    fn close(&mut self, b: &Bin) {
        let own = self.own.min(b.bytes);
        self.own_bytes += own;
        self.others_bytes += b.bytes - own;
        self.fair_bytes += b.bytes as f64 / f64::from(b.flows.max(1));
        if b.queued > 0 {
            let mean = b.queued_ns / f64::from(b.queued);
            self.queued_ns += own as f64 * mean;
            self.queued_bytes += own;
            let early = b.index.checked_sub(self.first_bin.unwrap_or(b.index));
            if let Some(e) = early.and_then(|i| self.early.get_mut(i as usize)) {
                *e = Some(mean as f32);
            }
        }
    }
}

/// What a flow shared the link with (see the module's doc).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Sharing {
    /// All flows' bytes in the link's busiest bin, bit/s.
    pub link_peak_bps: f64,
    /// The flow's part of the link's bytes while it had data.
    pub part: f64,
    /// Flows at once over its time (weighted by the link's bytes).
    pub flows: f64,
    /// The queueing the link's segments with timestamps met in the bins
    /// the flow had data in, weighted by its bytes there (none measured:
    /// `None`).
    pub queueing_ns: Option<f64>,
    /// The link's mean queueing in each of the flow's first
    /// [`EARLY_BINS`] bins, where measured.
    #[serde(skip)]
    pub early_queueing_ns: [Option<f32>; EARLY_BINS],
}

impl Sharing {
    /// The mean queueing measured in the flow's bins up to `until_s` from
    /// its first (at least its first bin; at most its first
    /// [`EARLY_BINS`]).
    pub fn early_queueing_ns(&self, until_s: f64) -> Option<f64> {
        let bins = ((until_s * 1e9) as u64 / RATE_BIN_NS + 1).min(EARLY_BINS as u64);
        let (sum, n) = self.early_queueing_ns[..bins as usize]
            .iter()
            .flatten()
            .fold((0.0, 0u32), |(sum, n), &q| (sum + f64::from(q), n + 1));
        (n > 0).then(|| sum / f64::from(n))
    }

    /// The flow's bottleneck on a link of `link_bps`: what the others
    /// left it, or its fair share if that is more.
    pub fn bottleneck_bps(&self, link_bps: f64) -> f64 {
        link_bps * self.part.max(1.0 / self.flows.max(1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-9 * b.abs(), "{a} against {b}");
    }

    /// Feeds `flows` (bytes per ms each) over `ms` milliseconds.
    fn feed(link: &mut Link, shares: &mut [Share], bytes_per_ms: &[u32], ms: u64) {
        for t in 0..ms {
            for (s, &b) in shares.iter_mut().zip(bytes_per_ms) {
                if b > 0 {
                    s.arrival(link, 1_000 * MS + t * MS, b, None);
                }
            }
        }
    }

    #[test]
    fn a_lone_flow_has_the_whole_link() {
        let (mut link, mut s) = (Link::default(), [Share::default()]);
        feed(&mut link, &mut s, &[12_500], 1_000); // 100 Mbit/s
        let sh = link.sharing(&s[0]);
        assert_eq!((sh.part, sh.flows), (1.0, 1.0));
        assert_eq!(link.peak_bps(), 100e6);
        assert_eq!(sh.bottleneck_bps(link.peak_bps()), 100e6);
    }

    #[test]
    fn equal_flows_each_have_their_share() {
        let (mut link, mut s) = (Link::default(), [Share::default(); 4]);
        feed(&mut link, &mut s, &[12_500; 4], 1_000);
        for f in &s {
            let sh = link.sharing(f);
            assert_eq!((sh.part, sh.flows), (0.25, 4.0));
            assert_eq!(sh.bottleneck_bps(link.peak_bps()), 100e6);
        }
    }

    #[test]
    fn a_crushed_flow_gets_its_fair_share_and_the_other_what_it_left() {
        let (mut link, mut s) = (Link::default(), [Share::default(); 2]);
        // 180 and 10 Mbit/s on a link that carried 190.
        feed(&mut link, &mut s, &[22_500, 1_250], 1_000);
        let peak = link.peak_bps();
        assert_eq!(peak, 190e6);
        close(link.sharing(&s[0]).bottleneck_bps(peak), 180e6);
        close(link.sharing(&s[1]).bottleneck_bps(peak), 95e6);
    }

    #[test]
    fn a_flow_alone_for_half_its_time_has_three_quarters() {
        let (mut link, mut s) = (Link::default(), [Share::default(); 2]);
        feed(&mut link, &mut s, &[12_500, 0], 500);
        for t in 500..1_000 {
            for f in s.iter_mut() {
                f.arrival(&mut link, 1_000 * MS + t * MS, 6_250, None);
            }
        }
        let sh = link.sharing(&s[0]);
        close(sh.flows, 4.0 / 3.0);
        close(sh.part, 0.75);
        close(sh.bottleneck_bps(link.peak_bps()), 75e6);
    }

    #[test]
    fn a_bin_the_trace_covers_in_part_weighs_as_much() {
        let (mut link, mut s) = (Link::default(), [Share::default(); 2]);
        // Both start 90 ms into a bin, 1 and 3 units a millisecond.
        for t in 90..1_000 {
            s[0].arrival(&mut link, 1_000 * MS + t * MS, 1_000, None);
            s[1].arrival(&mut link, 1_000 * MS + t * MS, 3_000, None);
        }
        close(link.sharing(&s[0]).part, 0.25);
        close(link.sharing(&s[1]).part, 0.75);
    }

    #[test]
    fn a_flow_without_timestamps_takes_the_queue_the_others_measured() {
        let (mut link, mut s) = (Link::default(), [Share::default(); 2]);
        // The first 500 ms: 10 ms of queueing, then 50 ms; the flow
        // without timestamps sends twice as much in the second half.
        for t in 0..1_000 {
            let queued = if t < 500 { 10.0 } else { 50.0 } * MS as f64;
            s[0].arrival(&mut link, 1_000 * MS + t * MS, 1_000, Some(queued));
            let b = if t < 500 { 1_000 } else { 2_000 };
            s[1].arrival(&mut link, 1_000 * MS + t * MS, b, None);
        }
        close(link.sharing(&s[0]).queueing_ns.unwrap(), 30.0 * MS as f64);
        close(
            link.sharing(&s[1]).queueing_ns.unwrap(),
            (10.0 + 2.0 * 50.0) / 3.0 * MS as f64,
        );
        // Its first bins keep theirs: a slow start over its first 300 ms
        // met 10 ms, one over the first second the mean of its bins.
        let early = link.sharing(&s[1]);
        close(early.early_queueing_ns(0.25).unwrap(), 10.0 * MS as f64);
        close(early.early_queueing_ns(5.0).unwrap(), 30.0 * MS as f64);
        // Nobody measured: nothing to take.
        let (mut link, mut s) = (Link::default(), [Share::default()]);
        feed(&mut link, &mut s, &[1_000], 500);
        assert_eq!(link.sharing(&s[0]).queueing_ns, None);
    }
}
