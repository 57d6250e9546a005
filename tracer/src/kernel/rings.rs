//! The records' ring buffers, one per CPU, merged back into one stream in
//! the kernel's time order.
//!
//! With one ring shared by every CPU, each record waits on the ring's
//! producer lock; with a ring per CPU, none does, but the collector gets one
//! stream per CPU. Cross-CPU arrival order is what the tracer measures, so
//! the merge must never swap two records the kernel timestamped in order:
//! records wait until the clock has passed their time by [`WINDOW`] (a
//! record is committed within microseconds of its timestamp, and the window
//! is thousands of those), then leave in timestamp order. A ring's records
//! come in time order but for one nested in another's run (a softirq in a
//! process-context program), so each ring's wait in a queue of their bytes
//! end to end, read and written in sequence, and the merge compares only
//! the queues' heads; a nested record waits in a small heap of its own. A
//! record that comes after a later one has left (its program was held up
//! longer than the window) leaves at once and is counted
//! ([`Rings::late`]); a test holds the count to 0.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, VecDeque},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
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
    PerCpu,
    /// One ring for every CPU, read in its order: the default, for on
    /// this VM's 2 CPUs per-CPU rings cost the collector twice the CPU in
    /// full mode and the process about 10 MiB more resident under load,
    /// for no faster upload (README, "What it costs").
    #[default]
    Single,
}

/// The rings of one tracer and the merge of their records.
pub struct Rings {
    rings: Vec<RingBuf<MapData>>,
    /// Every ring, edge-triggered: a wait ends on the programs' wake-ups
    /// (an eighth of a ring filled, a mark) or its timeout, not whenever a
    /// ring holds something, which it nearly always does at high rates.
    epoll: OwnedFd,
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
        // SAFETY: no pointers; the result is checked.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(std::io::Error::last_os_error()).context("creating an epoll instance");
        }
        // SAFETY: a new descriptor that nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        for ring in &rings {
            let mut event = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                u64: 0,
            };
            // SAFETY: valid descriptors and a valid event.
            let r = unsafe {
                libc::epoll_ctl(
                    epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    ring.as_raw_fd(),
                    &mut event,
                )
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error()).context("watching a ring buffer");
            }
        }
        Ok(Self {
            merge: Merge::new(rings.len()),
            epoll,
            rings,
            layout,
            until: 0,
            current: Vec::new(),
            finished: false,
        })
    }

    /// Sleeps until the programs wake the collector, a signal comes or
    /// `timeout` passes; while the merge holds records, at most until the
    /// earliest may leave, but at least a quarter of the window, so that
    /// records leave in batches (a wake-up every record or two had cost
    /// the collector more than the records).
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let timeout = self
            .held_for()
            .map_or(timeout, |held| held.max(WINDOW / 4).min(timeout));
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 8];
        // Rounded up: a wait of 0 ms would return at once.
        let ms = timeout.as_micros().div_ceil(1000) as i32;
        // SAFETY: a valid epoll descriptor and room for as many events as said.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                ms,
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err).context("waiting for the ring buffers");
            }
        }
        Ok(())
    }

    /// Nothing more will be written: the merge releases what it holds.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// Records that came after a later one had left the merge.
    pub fn late(&self) -> u64 {
        self.merge.late
    }

    /// When the merge holds records: how long until the earliest may
    /// leave. `None`: nothing is held.
    fn held_for(&self) -> Option<Duration> {
        if self.finished {
            return None;
        }
        let ((ts, _), _) = self.merge.earliest()?;
        let leaves = ts.saturating_add(WINDOW.as_nanos() as u64);
        Some(Duration::from_nanos(leaves.saturating_sub(monotonic_ns())))
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
        // Up to two reads: what was read may be too recent, and more may
        // be there.
        for _ in 0..2 {
            if self.merge.pop_into(self.until, &mut self.current).is_some() {
                return Some(&self.current);
            }
            self.read();
        }
        self.merge.pop_into(self.until, &mut self.current)?;
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
        for (i, ring) in self.rings.iter_mut().enumerate() {
            let mut last = None;
            for _ in 0..READ_BATCH {
                let Some(record) = ring.next() else {
                    last = None;
                    break;
                };
                last = Some(self.merge.push(i, &record));
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

/// Records in timestamp order; equal times leave in the order they were
/// pushed.
#[derive(Default)]
struct Merge {
    /// Each ring's records in the order read, while in time order.
    queues: Vec<Queue>,
    /// Records older than one read before them from the same ring (nested),
    /// by (time, order pushed): the order pushed is unique, so the bytes
    /// themselves are never compared.
    nested: BinaryHeap<Reverse<(u64, u64, Vec<u8>)>>,
    pushed: u64,
    /// The timestamp of the last record released.
    released_ns: u64,
    late: u64,
}

/// One ring's records: their bytes end to end from `start` (copied in and
/// out whole, not byte by byte as a `VecDeque<u8>` would), and per record
/// its time, order pushed and length.
#[derive(Default)]
struct Queue {
    bytes: Vec<u8>,
    start: usize,
    records: VecDeque<(u64, u64, usize)>,
}

impl Queue {
    fn head(&self) -> Option<(u64, u64)> {
        self.records.front().map(|&(ts, order, _)| (ts, order))
    }

    fn push(&mut self, ts: u64, order: u64, record: &[u8]) {
        self.bytes.extend_from_slice(record);
        self.records.push_back((ts, order, record.len()));
    }

    fn pop_into(&mut self, out: &mut Vec<u8>) {
        let (_, _, len) = self.records.pop_front().expect("a head");
        out.extend_from_slice(&self.bytes[self.start..self.start + len]);
        self.start += len;
        if self.records.is_empty() {
            self.bytes.clear();
            self.start = 0;
        } else if self.start > self.bytes.len() / 2 {
            // What was read goes once it is the larger part: each byte
            // moves at most once on average.
            self.bytes.drain(..self.start);
            self.start = 0;
        }
    }
}

impl Merge {
    fn new(rings: usize) -> Self {
        Self {
            queues: (0..rings).map(|_| Queue::default()).collect(),
            ..Self::default()
        }
    }

    /// Takes a copy of `record`, read from ring `ring`; its timestamp.
    fn push(&mut self, ring: usize, record: &[u8]) -> u64 {
        let ts = record
            .get(RECORD_TS_AT..RECORD_TS_AT + 8)
            .map_or(0, |b| u64::from_ne_bytes(b.try_into().expect("8 bytes")));
        let order = self.pushed;
        self.pushed += 1;
        let q = &mut self.queues[ring];
        if q.records.back().is_some_and(|&(last, ..)| ts < last) {
            self.nested.push(Reverse((ts, order, record.to_vec())));
        } else {
            q.push(ts, order, record);
        }
        ts
    }

    /// The earliest record's (time, order pushed), and where it waits: a
    /// queue's index, or `None` for the nested heap.
    fn earliest(&self) -> Option<((u64, u64), Option<usize>)> {
        let queues = self
            .queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| Some((q.head()?, Some(i))));
        let nested = self
            .nested
            .peek()
            .map(|Reverse((ts, order, _))| ((*ts, *order), None));
        queues.chain(nested).min_by_key(|&(key, _)| key)
    }

    /// The earliest record into `out`, if its time is at most `until`.
    fn pop_into(&mut self, until: u64, out: &mut Vec<u8>) -> Option<()> {
        let ((ts, _), from) = self.earliest().filter(|((ts, _), _)| *ts <= until)?;
        out.clear();
        match from {
            Some(i) => self.queues[i].pop_into(out),
            None => {
                let Reverse((.., bytes)) = self.nested.pop().expect("a top");
                out.extend_from_slice(&bytes);
            }
        }
        if ts < self.released_ns {
            self.late += 1;
        }
        self.released_ns = self.released_ns.max(ts);
        Some(())
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
        let mut out = Vec::new();
        std::iter::from_fn(|| m.pop_into(until, &mut out).map(|()| out[0])).collect()
    }

    #[test]
    fn records_leave_in_time_order_once_the_window_has_passed() {
        let mut m = Merge::new(2);
        // Two CPUs' rings read one after the other; within a ring a record
        // nested in another's (a softirq in a process-context run) is
        // behind a later one.
        for (ts, tag) in [(10, 1), (40, 4), (30, 3), (70, 7)] {
            m.push(0, &record(ts, tag));
        }
        for (ts, tag) in [(20, 2), (50, 5), (60, 6)] {
            m.push(1, &record(ts, tag));
        }
        assert_eq!(drain(&mut m, 45), [1, 2, 3, 4]);
        // An earlier record still to come is within the window: it waits.
        m.push(1, &record(55, 8));
        assert_eq!(drain(&mut m, 100), [5, 8, 6, 7]);
        assert_eq!(m.late, 0);
        // Equal times leave in the order they were read, across rings and
        // the nested ones.
        m.push(0, &record(300, 9));
        m.push(0, &record(200, 1));
        m.push(1, &record(200, 2));
        m.push(0, &record(200, 3));
        assert_eq!(drain(&mut m, 300), [1, 2, 3, 9]);
        assert_eq!(m.late, 0);
    }

    #[test]
    fn a_record_later_than_its_window_leaves_at_once_and_is_counted() {
        let mut m = Merge::new(2);
        m.push(0, &record(100, 1));
        assert_eq!(drain(&mut m, 100), [1]);
        m.push(1, &record(90, 2));
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
