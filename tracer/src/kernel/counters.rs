//! The programs' counters, summed over CPUs, and their names in the
//! report (one list, in `tracer_common::counter`'s index order).

use tracer_common::counter;

/// Kernel-side counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// The per-CPU `COUNTERS` map summed, indexed by [`tracer_common::counter`].
    pub map: [u64; counter::COUNT as usize],
    /// Runs the kernel skipped for the first copy of the tracepoint programs
    /// ([`super::recursion_misses`]); later copies take them.
    pub probe_first_copy_misses: u64,
    pub rtx_first_copy_misses: u64,
}

impl Counters {
    pub fn get(&self, index: u32) -> u64 {
        self.map[index as usize]
    }

    /// These and `other`, counter by counter.
    pub fn plus(&self, other: &Counters) -> Counters {
        let mut sum = *self;
        for (a, b) in sum.map.iter_mut().zip(other.map) {
            *a += b;
        }
        sum.probe_first_copy_misses += other.probe_first_copy_misses;
        sum.rtx_first_copy_misses += other.rtx_first_copy_misses;
        sum
    }

    /// Events the kernel could not write because the ring buffer was full.
    pub fn ring_full(&self) -> u64 {
        self.get(counter::XDP_DROPPED)
            + self.get(counter::PROBE_DROPPED)
            + self.get(counter::RTX_DROPPED)
    }

    /// `tcp_probe` hits no copy of the program handled: every hit either
    /// ran the first copy or was skipped for it; the handled ones are seen.
    pub fn probe_lost(&self) -> u64 {
        (self.get(counter::PROBE_FIRST_COPY_RUNS) + self.probe_first_copy_misses)
            .saturating_sub(self.get(counter::PROBE_SEEN))
    }

    /// The same for `tcp_retransmit_skb`.
    pub fn rtx_lost(&self) -> u64 {
        (self.get(counter::RTX_FIRST_COPY_RUNS) + self.rtx_first_copy_misses)
            .saturating_sub(self.get(counter::RTX_SEEN))
    }

    /// Every event lost in the kernel: ring full, or no program run.
    pub fn dropped(&self) -> u64 {
        self.ring_full() + self.probe_lost() + self.rtx_lost()
    }

    /// Segments and their payload bytes XDP counted and did not emit
    /// (summary mode): with what the engine saw, all the traffic.
    pub fn summarized(&self) -> (u64, u64) {
        (
            self.get(counter::XDP_SUMMARIZED),
            self.get(counter::XDP_SUMMARIZED_BYTES),
        )
    }

    /// Events the kernel wrote into the ring buffer.
    pub fn emitted(&self) -> u64 {
        self.get(counter::XDP_EMITTED)
            + self.get(counter::PROBE_EMITTED)
            + self.get(counter::RTX_EMITTED)
    }

    /// Every count as one list (the map's, then the two miss counts): what
    /// a pcapng trace stores; [`Counters::from_words`] reads it back.
    pub fn words(&self) -> Vec<u64> {
        let mut w = self.map.to_vec();
        w.extend([self.probe_first_copy_misses, self.rtx_first_copy_misses]);
        w
    }

    /// The counters of [`Counters::words`]; `None` if the list is not one
    /// (another version's: a different number of counters).
    pub fn from_words(w: &[u64]) -> Option<Self> {
        // Counters are only ever added last: a trace from before has fewer,
        // and the newer ones read as 0.
        let n = w.len().checked_sub(2)?;
        if n > counter::COUNT as usize || n < counter::XDP_SUMMARIZED as usize {
            return None;
        }
        let mut c = Self::default();
        c.map[..n].copy_from_slice(&w[..n]);
        (c.probe_first_copy_misses, c.rtx_first_copy_misses) = (w[n], w[n + 1]);
        Some(c)
    }

    /// (name, value) of every counter, for reports.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        COUNTER_NAMES
            .iter()
            .zip(self.map)
            .map(|(&name, v)| (name, v))
            .chain([
                ("probe_first_copy_misses", self.probe_first_copy_misses),
                ("retransmit_first_copy_misses", self.rtx_first_copy_misses),
                ("probe_lost", self.probe_lost()),
                ("retransmit_lost", self.rtx_lost()),
            ])
    }
}

/// Report names, in [`tracer_common::counter`] index order.
pub const COUNTER_NAMES: [&str; counter::COUNT as usize] = [
    "xdp_frames",
    "xdp_tcp_segments",
    "xdp_non_tcp",
    "xdp_truncated",
    "xdp_unsupported_headers",
    "xdp_ip_fragments",
    "xdp_filtered",
    "xdp_events",
    "xdp_dropped",
    "probe_seen",
    "probe_filtered",
    "probe_events",
    "probe_dropped",
    "probe_read_errors",
    "retransmit_seen",
    "retransmit_filtered",
    "retransmit_events",
    "retransmit_dropped",
    "retransmit_read_errors",
    "probe_first_copy_runs",
    "retransmit_first_copy_runs",
    "xdp_capture_failed",
    "xdp_summarized",
    "probe_summarized",
    "xdp_summarized_bytes",
    "overload_entered",
    "overload_left",
];
