//! RFC 5236 Reorder Density (RD) and Reorder Buffer-occupancy Density
//! (RBD), over segments of one flow direction.
//!
//! Segments are the RFC's packets: each arrival with new bytes is one
//! packet, its place in sequence order is its rank among the segments that
//! were not lost. RD's displacement is arrival position minus rank (the
//! RFC's RI - S); a missing segment is declared lost once more than DT
//! later segments wait for it (the RFC's stay-back method). RBD follows
//! the RFC's §7.2 algorithm with buffer threshold BT.

use std::collections::BTreeMap;

use super::memory::give_back;

/// A distribution over small integers, counted, with the zero bin kept
/// apart so flows without reordering allocate nothing.
#[derive(Clone, Debug, Default)]
struct Bins {
    zero: u64,
    /// Index `k + offset` for k != 0; allocated on first use.
    others: Option<Box<[u64]>>,
}

impl Bins {
    fn add(&mut self, index: usize, zero_index: usize, len: usize) {
        if index == zero_index {
            self.zero += 1;
        } else {
            self.others
                .get_or_insert_with(|| vec![0; len].into_boxed_slice())[index] += 1;
        }
    }

    fn held_bytes(&self) -> u64 {
        self.others.as_ref().map_or(0, |o| 8 * o.len() as u64)
    }

    /// Adds the counts to `into`, grown to `len`: summing flows without
    /// a copy of each.
    fn add_counts(&self, into: &mut Vec<u64>, zero_index: usize, len: usize) {
        if into.len() < len {
            into.resize(len, 0);
        }
        if let Some(o) = &self.others {
            for (a, b) in into.iter_mut().zip(o.iter()) {
                *a += b;
            }
        }
        into[zero_index] += self.zero;
    }
}

#[derive(Clone, Debug)]
pub struct ReorderDensity {
    dt: u32,
    /// Next byte expected in sequence (rank order).
    next: u64,
    /// Arrived ahead of `next`: start -> (end, arrival position, counted).
    early: BTreeMap<u64, (u64, u64, bool)>,
    arrivals: u64,
    ranks: u64,
    fd: Bins,
    /// Displacements beyond DT (discarded by the RFC's algorithm).
    pub beyond: u64,
    /// Segments declared lost (never arrived within DT).
    pub lost: u64,
}

impl ReorderDensity {
    pub fn new(dt: u32, first: u64) -> Self {
        Self {
            dt,
            next: first,
            early: BTreeMap::new(),
            arrivals: 0,
            ranks: 0,
            fd: Bins::default(),
            beyond: 0,
            lost: 0,
        }
    }

    /// A segment with new bytes arrived. `counted`: record its displacement
    /// (false for retransmissions: their lateness is loss recovery, not
    /// reordering).
    pub fn arrive(&mut self, start: u64, end: u64, counted: bool) {
        if end <= self.next {
            // Declared lost earlier and arrived after all: the RFC discards it.
            return;
        }
        let start = start.max(self.next);
        let arrival = self.arrivals;
        self.arrivals += 1;
        if start == self.next {
            self.deliver(arrival, end, counted);
            self.release();
        } else {
            self.early.insert(start, (end, arrival, counted));
        }
        while self.early.len() > self.dt as usize {
            // The segment at `next` would now be later than DT: lost.
            let (&first, _) = self.early.first_key_value().expect("not empty");
            self.lost += 1;
            self.next = first;
            self.release();
        }
    }

    fn deliver(&mut self, arrival: u64, end: u64, counted: bool) {
        let rank = self.ranks;
        self.ranks += 1;
        self.next = self.next.max(end);
        if counted {
            let d = arrival as i64 - rank as i64;
            if d.unsigned_abs() <= u64::from(self.dt) {
                let dt = self.dt as usize;
                self.fd.add((d + self.dt as i64) as usize, dt, 2 * dt + 1);
            } else {
                self.beyond += 1;
            }
        }
    }

    /// Delivers early segments that are now in sequence.
    fn release(&mut self) {
        if self.early.is_empty() {
            return;
        }
        while let Some((&s, &(end, arrival, counted))) = self.early.first_key_value() {
            if s > self.next {
                break;
            }
            self.early.pop_first();
            if end > self.next {
                self.deliver(arrival, end, counted);
            }
        }
        give_back(&mut self.early);
    }

    /// Heap bytes it holds: what the memory budget counts.
    pub fn held_bytes(&self) -> u64 {
        super::memory::btree_bytes::<u64, (u64, u64, bool)>(self.early.len()) + self.fd.held_bytes()
    }

    /// FD[k] for k = -DT..=DT.
    pub fn frequencies(&self) -> Vec<u64> {
        let mut v = Vec::new();
        self.add_frequencies(&mut v);
        v
    }

    /// Adds FD[k] to `into`'s (the totals' sum over flows).
    pub fn add_frequencies(&self, into: &mut Vec<u64>) {
        let dt = self.dt as usize;
        self.fd.add_counts(into, dt, 2 * dt + 1);
    }

    pub fn dt(&self) -> u32 {
        self.dt
    }
}

#[derive(Clone, Debug)]
pub struct BufferDensity {
    bt: u32,
    /// E: the next expected byte.
    e: u64,
    /// Early segments held: start -> end.
    buffer: BTreeMap<u64, u64>,
    fb: Bins,
    /// Expected segments declared lost because the buffer was full.
    pub lost: u64,
}

impl BufferDensity {
    pub fn new(bt: u32, first: u64) -> Self {
        Self {
            bt,
            e: first,
            buffer: BTreeMap::new(),
            fb: Bins::default(),
            lost: 0,
        }
    }

    /// Heap bytes it holds: what the memory budget counts.
    pub fn held_bytes(&self) -> u64 {
        super::memory::btree_bytes::<u64, u64>(self.buffer.len()) + self.fb.held_bytes()
    }

    pub fn arrive(&mut self, start: u64, end: u64) {
        // Case a: a duplicate, or excessively delayed (already given up).
        if end <= self.e || (!self.buffer.is_empty() && self.buffer.contains_key(&start)) {
            return;
        }
        let start = start.max(self.e);
        if start == self.e {
            // Case b: the expected segment.
            self.e = end;
            self.release();
        } else if (self.buffer.len() as u32) < self.bt {
            // Case c: early, and there is room.
            self.buffer.insert(start, end);
        } else {
            // Case c, buffer full: the expected segment is lost. Resume at
            // the first held segment (or this one) and release the run. (The
            // RFC's pseudo-code drops this segment when it does not join
            // that run; it is kept here.)
            self.lost += 1;
            self.buffer.insert(start, end);
            let (&first, _) = self.buffer.first_key_value().expect("not empty");
            self.e = first;
            self.release();
        }
        let bt = self.bt as usize;
        self.fb.add(self.buffer.len(), 0, bt + 1);
    }

    fn release(&mut self) {
        if self.buffer.is_empty() {
            return;
        }
        while let Some((&s, &end)) = self.buffer.first_key_value() {
            if s > self.e {
                break;
            }
            self.buffer.pop_first();
            self.e = self.e.max(end);
        }
        give_back(&mut self.buffer);
    }

    /// FB[k] for k = 0..=BT.
    pub fn frequencies(&self) -> Vec<u64> {
        let mut v = Vec::new();
        self.add_frequencies(&mut v);
        v
    }

    /// Adds the frequencies to `into`'s (the totals' sum over flows).
    pub fn add_frequencies(&self, into: &mut Vec<u64>) {
        let bt = self.bt as usize;
        self.fb.add_counts(into, 0, bt + 1);
    }

    pub fn bt(&self) -> u32 {
        self.bt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packet p is bytes [(p-1)*100, p*100).
    fn feed(seq: &[u64], dt: u32, bt: u32) -> (ReorderDensity, BufferDensity) {
        let mut rd = ReorderDensity::new(dt, 0);
        let mut rbd = BufferDensity::new(bt, 0);
        let mut seen = std::collections::HashSet::new();
        for &p in seq {
            // The order detector drops exact duplicates before this stage.
            if seen.insert(p) {
                rd.arrive((p - 1) * 100, p * 100, true);
            }
            rbd.arrive((p - 1) * 100, p * 100);
        }
        (rd, rbd)
    }

    fn normalized(f: &[u64]) -> Vec<f64> {
        let n: u64 = f.iter().sum();
        f.iter().map(|&c| c as f64 / n as f64).collect()
    }

    #[test]
    fn rfc5236_8a_no_loss() {
        let (rd, rbd) = feed(&[1, 4, 2, 5, 3, 6, 7, 8], 4, 4);
        // Table 2: D = -2..2 -> 0.125, 0.125, 0.5, 0.125, 0.125.
        let fd = rd.frequencies();
        assert_eq!(&fd[2..7], &[1, 1, 4, 1, 1]);
        assert_eq!(normalized(&fd)[2..7], [0.125, 0.125, 0.5, 0.125, 0.125]);
        // Table 4: B = 0, 1, 2 -> 0.625, 0.25, 0.125.
        let fb = rbd.frequencies();
        assert_eq!(&fb[..3], &[5, 2, 1]);
        assert_eq!(normalized(&fb)[..3], [0.625, 0.25, 0.125]);
    }

    #[test]
    fn rfc5236_8b_packet_loss() {
        let (rd, rbd) = feed(&[1, 2, 4, 5, 6, 7], 3, 3);
        // Table 5: every displacement 0, FD[0] = 6.
        assert_eq!(rd.frequencies(), vec![0, 0, 0, 6, 0, 0, 0]);
        assert_eq!(rd.lost, 1);
        // Table 6: FB = [3, 1, 1, 1]: RBD 0.5, 0.167, 0.167, 0.167.
        assert_eq!(rbd.frequencies(), vec![3, 1, 1, 1]);
        assert_eq!(rbd.lost, 1);
    }

    #[test]
    fn rfc5236_8c_duplicates() {
        let (rd, rbd) = feed(&[1, 3, 2, 3, 4, 5], 2, 2);
        // Table 7: D = -1, 0, 1 -> 1, 3, 1 (RD 0.2, 0.6, 0.2).
        assert_eq!(rd.frequencies(), vec![0, 1, 3, 1, 0]);
        // Table 8: FB[0] = 4, FB[1] = 1 (RBD 0.8, 0.2).
        assert_eq!(rbd.frequencies(), vec![4, 1, 0]);
    }

    #[test]
    fn rfc5236_3_3_example_with_loss_and_duplicate() {
        // Example 3: 1 4 3 5 3 8 7 6 (2 lost, 3 duplicated) gives
        // displacements 0 -1 1 0 - -2 0 2.
        let (rd, _) = feed(&[1, 4, 3, 5, 3, 8, 7, 6], 4, 4);
        // D = -2 -1 0 1 2 at indexes 2..7 of -4..=4.
        assert_eq!(&rd.frequencies()[2..7], &[1, 1, 3, 1, 1]);
        assert_eq!(rd.lost, 1);
    }

    #[test]
    fn retransmissions_and_beyond_dt_are_not_binned() {
        let mut rd = ReorderDensity::new(2, 0);
        rd.arrive(100, 200, true);
        rd.arrive(0, 100, false); // a retransmission filling the hole
        assert_eq!(rd.frequencies().iter().sum::<u64>(), 1);
        let mut rd = ReorderDensity::new(1, 0);
        for p in [2u64, 1] {
            rd.arrive((p - 1) * 10, p * 10, true);
        }
        assert_eq!(rd.frequencies(), vec![1, 0, 1]);
        // Late by 2 with DT = 1: the missing one is declared lost first.
        let mut rd = ReorderDensity::new(1, 0);
        for p in [2u64, 3, 1] {
            rd.arrive((p - 1) * 10, p * 10, true);
        }
        assert_eq!(rd.lost, 1);
    }
}
