//! The records' ring buffers, one per CPU, merged back into one stream in
//! the kernel's time order.
//!
//! With one ring shared by every CPU, each record waits on the ring's
//! producer lock; with a ring per CPU, none does, but the collector gets one
//! stream per CPU. Cross-CPU arrival order is what the tracer measures, so
//! the merge must never swap two records the kernel timestamped in order:
//! records wait in a heap until the clock has passed their time by
//! [`WINDOW`] (a record is committed within microseconds of its timestamp,
//! and the window is thousands of those), then leave in timestamp order. A
//! record that comes after a later one has left (its program was held up
//! longer than the window) leaves at once and is counted
//! ([`Rings::late`]); a test holds the count to 0.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    os::fd::{AsRawFd, RawFd},
    time::Duration,
};

use anyhow::{Context, Result};
use aya::maps::{ArrayOfMaps, Map, MapData, RingBuf};
use tracer_common::RECORD_TS_AT;

/// How long a record waits for an earlier one from another CPU's ring.
pub const WINDOW: Duration = Duration::from_millis(20);
/// The smallest ring a CPU gets, whatever the total.
const MIN_RING_BYTES: u32 = 256 << 10;

/// How the records reach userspace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RingLayout {
    /// A ring per CPU, merged by time in userspace.
    #[default]
    PerCpu,
    /// One ring for every CPU, read in its order (the layout before
    /// per-CPU rings; for comparison).
    Single,
}

/// The rings of one tracer and the merge of their records.
pub struct Rings {
    rings: Vec<RingBuf<MapData>>,
    layout: RingLayout,
    merge: Merge,
    /// Records up to this time may leave: nothing still in a ring can be
    /// older (see [`Rings::read`]).
    until: u64,
    /// The record last handed out (its room reused).
    current: Vec<u8>,
    /// Nothing more comes (the programs are detached): release everything.
    finished: bool,
}

impl Rings {
    /// Creates the rings (`total_bytes` shared among the CPUs' rings, each
    /// a power of two of at least [`MIN_RING_BYTES`]) and puts one in every
    /// slot of the programs' `EVENTS` map: before anything is attached, so
    /// that no program finds its slot empty.
    pub fn create(ebpf: &mut aya::Ebpf, total_bytes: u32, layout: RingLayout) -> Result<Self> {
        let cpus = super::cpus()?;
        let mut slots: ArrayOfMaps<&mut MapData, RingBuf<MapData>> = ArrayOfMaps::try_from(
            ebpf.map_mut("EVENTS")
                .context("the eBPF object has no EVENTS map")?,
        )?;
        let count = match layout {
            RingLayout::PerCpu => cpus,
            RingLayout::Single => 1,
        };
        let bytes = ring_bytes(total_bytes, layout, cpus);
        let mut rings = Vec::new();
        for i in 0..count {
            let obj = aya_obj::Map::new_from_params(
                aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_RINGBUF as u32,
                0,
                0,
                bytes,
                0,
            );
            let data = MapData::create(obj, &format!("events{i}"), None)
                .with_context(|| format!("creating a ring buffer of {bytes} bytes"))?;
            rings.push(RingBuf::try_from(Map::RingBuf(data))?);
        }
        for cpu in 0..cpus {
            let ring = &rings[(cpu % count) as usize];
            slots
                .set(cpu, ring, 0)
                .with_context(|| format!("placing CPU {cpu}'s ring buffer"))?;
        }
        Ok(Self {
            rings,
            layout,
            merge: Merge::default(),
            until: 0,
            current: Vec::new(),
            finished: false,
        })
    }

    /// The rings' descriptors, readable when data waits.
    pub fn fds(&self) -> impl Iterator<Item = RawFd> + '_ {
        self.rings.iter().map(|r| r.as_raw_fd())
    }

    /// Nothing more will be written: the merge releases what it holds.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// Records that came after a later one had left the merge.
    pub fn late(&self) -> u64 {
        self.merge.late
    }

    /// The next record in time order, or `None` until more data comes (or
    /// the clock passes what waits).
    pub fn next_record(&mut self) -> Option<&[u8]> {
        if self.layout == RingLayout::Single {
            let record = self.rings[0].next()?;
            self.current.clear();
            self.current.extend_from_slice(&record);
            return Some(&self.current);
        }
        // Twice: what was read may be too recent, and more may be there.
        for _ in 0..2 {
            if self.merge.ready(self.until) {
                break;
            }
            self.read();
        }
        let record = self.merge.pop(self.until)?;
        self.merge
            .recycle(std::mem::replace(&mut self.current, record));
        Some(&self.current)
    }

    /// Moves what the rings hold into the merge and sets how far it may
    /// release: to the clock read before, less the window (a record
    /// committed after the read was timestamped at most the window before
    /// it), or everything once finished; and never past the last record
    /// read from a ring that still holds more.
    fn read(&mut self) {
        let now = monotonic_ns();
        let mut until = if self.finished {
            u64::MAX
        } else {
            now.saturating_sub(WINDOW.as_nanos() as u64)
        };
        for ring in &mut self.rings {
            let mut last = None;
            for _ in 0..READ_BATCH {
                let Some(record) = ring.next() else {
                    last = None;
                    break;
                };
                last = Some(self.merge.push(&record));
            }
            if let Some(ts) = last {
                until = until.min(ts);
            }
        }
        self.until = until;
    }
}

/// Records read from each ring before the merge looks at its heap again.
const READ_BATCH: usize = 4096;

/// Records in timestamp order (ties: the order they were pushed, which is
/// unique, so the bytes themselves are never compared).
#[derive(Default)]
struct Merge {
    heap: BinaryHeap<Reverse<(u64, u64, Vec<u8>)>>,
    /// Rooms of records handed out, for the next ones.
    spare: Vec<Vec<u8>>,
    pushed: u64,
    /// The timestamp of the last record released.
    released_ns: u64,
    late: u64,
}

impl Merge {
    /// Takes a copy of `record`; its timestamp.
    fn push(&mut self, record: &[u8]) -> u64 {
        let ts = record
            .get(RECORD_TS_AT..RECORD_TS_AT + 8)
            .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")));
        let mut bytes = self.spare.pop().unwrap_or_default();
        bytes.clear();
        bytes.extend_from_slice(record);
        self.heap.push(Reverse((ts, self.pushed, bytes)));
        self.pushed += 1;
        ts
    }

    /// Whether a record may leave at `until`.
    fn ready(&self, until: u64) -> bool {
        self.heap
            .peek()
            .is_some_and(|Reverse((ts, ..))| *ts <= until)
    }

    /// The earliest record, if its time is at most `until`.
    fn pop(&mut self, until: u64) -> Option<Vec<u8>> {
        if !self.ready(until) {
            return None;
        }
        let Reverse((ts, _, bytes)) = self.heap.pop()?;
        if ts < self.released_ns {
            self.late += 1;
        }
        self.released_ns = self.released_ns.max(ts);
        Some(bytes)
    }

    fn recycle(&mut self, bytes: Vec<u8>) {
        self.spare.push(bytes);
    }
}

/// Each ring's bytes: the total shared among the CPUs' rings (a power of
/// two, at least [`MIN_RING_BYTES`]), or all of it for the single ring.
/// The wake-up and overload marks are fractions of it.
pub fn ring_bytes(total_bytes: u32, layout: RingLayout, cpus: u32) -> u32 {
    match layout {
        RingLayout::PerCpu => prev_power_of_two(total_bytes / cpus.max(1)).max(MIN_RING_BYTES),
        RingLayout::Single => total_bytes,
    }
}

fn prev_power_of_two(n: u32) -> u32 {
    if n == 0 {
        0
    } else {
        1 << (31 - n.leading_zeros())
    }
}

/// CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ts: u64, tag: u8) -> Vec<u8> {
        let mut r = vec![tag; 32];
        r[RECORD_TS_AT..RECORD_TS_AT + 8].copy_from_slice(&ts.to_ne_bytes());
        r
    }

    fn drain(m: &mut Merge, until: u64) -> Vec<u8> {
        std::iter::from_fn(|| m.pop(until).map(|r| r[0])).collect()
    }

    #[test]
    fn records_leave_in_time_order_once_the_window_has_passed() {
        let mut m = Merge::default();
        // Two CPUs' rings read one after the other; within a ring a record
        // nested in another's (a softirq in a process-context run) is
        // behind a later one.
        for (ts, tag) in [(10, 1), (40, 4), (30, 3), (70, 7)] {
            m.push(&record(ts, tag));
        }
        for (ts, tag) in [(20, 2), (50, 5), (60, 6)] {
            m.push(&record(ts, tag));
        }
        assert_eq!(drain(&mut m, 45), [1, 2, 3, 4]);
        // An earlier record still to come is within the window: it waits.
        m.push(&record(55, 8));
        assert_eq!(drain(&mut m, 100), [5, 8, 6, 7]);
        assert_eq!(m.late, 0);
        // Equal times leave in the order they were read.
        m.push(&record(200, 1));
        m.push(&record(200, 2));
        assert_eq!(drain(&mut m, 200), [1, 2]);
    }

    #[test]
    fn a_record_later_than_its_window_leaves_at_once_and_is_counted() {
        let mut m = Merge::default();
        m.push(&record(100, 1));
        assert_eq!(drain(&mut m, 100), [1]);
        m.push(&record(90, 2));
        assert_eq!(drain(&mut m, 100), [2]);
        assert_eq!(m.late, 1);
    }

    #[test]
    fn ring_sizes_share_the_total() {
        assert_eq!(ring_bytes(16 << 20, RingLayout::PerCpu, 2), 8 << 20);
        assert_eq!(
            ring_bytes(16 << 20, RingLayout::PerCpu, 256),
            MIN_RING_BYTES
        );
        assert_eq!(ring_bytes(16 << 20, RingLayout::Single, 256), 16 << 20);
        assert_eq!(prev_power_of_two(16 << 20), 16 << 20);
        assert_eq!(prev_power_of_two((16 << 20) / 3), 4 << 20);
        assert_eq!(prev_power_of_two(1), 1);
    }
}
