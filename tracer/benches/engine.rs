//! Engine throughput and memory, against a trivial pass over the same
//! stream, measured side by side in one run (`cargo xtask bench`).
//!
//! The stream: 10 million data segments over 20,000 flows. Each flow swaps
//! two neighbours every 50 segments (reordering: holes, late segments,
//! histograms) and moves to another RX queue and CPU every 200
//! (migrations). Flows take turns at random in trains of 1 to 16 segments,
//! as a receiver sees them (a sender's TSO burst arrives back to back, and
//! NAPI polls one queue at a time); a second pass takes every segment
//! from a random flow, the worst case for caches (20,000 flow states do
//! not fit in them). Segments are generated in chunks ahead of the timed
//! passes, so the passes time processing only.
//!
//! Two floors beside them say where the time goes: the same stream over
//! 200 flows, whose states stay in cache (the engine's computing alone),
//! and the flow table alone over 20,000 flow-state-sized slots, each
//! segment finding its flow and writing one field (the memory's part).

use std::{hint::black_box, time::Instant};

use tracer::{
    engine::{flows::FlowTable, Engine, EngineConfig, FlowState},
    source::{Flow, Segment},
};

#[path = "common/target.rs"]
mod target;
use target::Target;

#[path = "../tests/common/heap.rs"]
mod heap;

const SEGMENTS: u64 = 10_000_000;
const FLOWS: u32 = 20_000;
/// Few enough that every flow's state stays in cache.
const FLOWS_IN_CACHE: u32 = 200;
const CHUNK: usize = 1_000_000;
const MSS: u32 = 1448;

struct Stream {
    flows: u32,
    /// Per flow: next segment number.
    next: Vec<u32>,
    rng: u64,
    produced: u64,
    /// Longest train of consecutive segments of one flow.
    train_max: u64,
    /// The current train: its flow and segments left.
    train: (u32, u64),
}

impl Stream {
    fn new(train_max: u64, flows: u32) -> Self {
        Self {
            flows,
            next: vec![0; flows as usize],
            rng: 0x9e37_79b9_7f4a_7c15,
            produced: 0,
            train_max,
            train: (0, 0),
        }
    }

    fn flow(i: u32) -> Flow {
        Flow {
            src: std::net::SocketAddr::new(
                [10, (i >> 16) as u8, (i >> 8) as u8, i as u8].into(),
                40_000,
            ),
            dst: "10.255.0.1:443".parse().unwrap(),
        }
    }

    fn random(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn fill(&mut self, out: &mut Vec<Segment>) {
        out.clear();
        while out.len() < CHUNK && self.produced < SEGMENTS {
            if self.train.1 == 0 {
                let i = (self.random() % u64::from(self.flows)) as u32;
                self.train = (i, 1 + self.random() % self.train_max);
            }
            self.train.1 -= 1;
            let i = self.train.0;
            let n = self.next[i as usize];
            self.next[i as usize] += 1;
            // Swap 24 and 25 of every 50; move queue/CPU every 200.
            let k = match n % 50 {
                24 => n + 1,
                25 => n - 1,
                _ => n,
            };
            let q = (i + n / 200) % 4;
            out.push(Segment {
                ts_ns: self.produced * 100,
                ifindex: 1,
                rx_queue: q,
                cpu: q % 2,
                flow: Self::flow(i),
                seq: 1u32.wrapping_add(k * MSS),
                ack: 1,
                payload_len: MSS,
                flags: 0x10,
                window: 512,
                ip_id: Some(k as u16),
                timestamp: Some((k, 1)),
                sack: Vec::new(),
                vlan: None,
                first_fragment: false,
                summarized_before: 0,
                summarized_end: None,
            });
            self.produced += 1;
        }
    }
}

/// Runs `pass` over the whole stream, timing only the passes.
fn timed(train_max: u64, flows: u32, mut pass: impl FnMut(&Segment)) -> f64 {
    let mut stream = Stream::new(train_max, flows);
    let mut chunk = Vec::with_capacity(CHUNK);
    let mut busy = 0.0;
    loop {
        stream.fill(&mut chunk);
        if chunk.is_empty() {
            break;
        }
        let t = Instant::now();
        for s in &chunk {
            pass(s);
        }
        busy += t.elapsed().as_secs_f64();
    }
    busy
}

fn main() {
    // Baseline: touch every segment, keep one running sum.
    let mut sum = 0u64;
    let base = timed(16, FLOWS, |s| {
        sum = sum.wrapping_add(u64::from(s.payload_len) ^ u64::from(s.seq))
    });
    black_box(sum);

    let run = |train_max, flows| {
        let mut engine = Engine::new(EngineConfig::default());
        let busy = timed(train_max, flows, |s| {
            black_box(engine.segment(s));
        });
        // What the live view takes from the collector every 250 ms.
        let t = Instant::now();
        black_box(engine.live_snapshot(200, None));
        let live = t.elapsed().as_secs_f64();
        (busy, engine.snapshot(), live)
    };
    let (eng, snap, live) = run(16, FLOWS);
    let (worst, worst_snap, _) = run(1, FLOWS);
    let (in_cache, _, _) = run(16, FLOWS_IN_CACHE);
    let (worst_in_cache, _, _) = run(1, FLOWS_IN_CACHE);
    let lookup = lookup_floor(16);
    let worst_lookup = lookup_floor(1);
    let t = &snap.totals.reordering;
    assert_eq!(t.data_segments, SEGMENTS);
    assert_eq!(worst_snap.totals.reordering.data_segments, SEGMENTS);

    // Memory per tracked flow: 100,000 flows, in order, queue/CPU fixed.
    let template = {
        let mut s = Stream::new(1, FLOWS);
        let mut chunk = Vec::new();
        s.fill(&mut chunk);
        chunk.swap_remove(0)
    };
    let before = heap::heap();
    let mut mem = Engine::new(EngineConfig {
        max_flows: 100_000,
        ..Default::default()
    });
    for i in 0..100_000u32 {
        for n in 0..4u32 {
            let mut seg = template.clone();
            seg.flow = Stream::flow(i);
            seg.seq = 1 + n * MSS;
            seg.timestamp = Some((n, 1));
            mem.segment(&seg);
        }
    }
    let per_flow = (heap::heap() - before) as f64 / 100_000.0;
    black_box(&mem);

    let rate = |busy: f64| SEGMENTS as f64 / busy;
    let ns = |busy: f64| busy * 1e9 / SEGMENTS as f64;
    println!("engine benchmark: {SEGMENTS} segments, {FLOWS} flows, one core");
    println!(
        "  stream: {} reordered ({:.2}%), {} queue migrations",
        t.reordered,
        t.reordered_ratio * 100.0,
        t.queue_migrations
    );
    println!("  baseline pass   {:>8.2} M segments/s", rate(base) / 1e6);
    println!(
        "  live snapshot   {:>8.1} ms over {FLOWS} flows: one every {:.0} ms (at most a tenth of the collector's time; 250 ms when cheaper)",
        live * 1e3,
        (live * 10.0 * 1e3).max(250.0)
    );
    println!(
        "  engine          {:>8.2} M segments/s  ({:.0} ns/segment; {})",
        rate(eng) / 1e6,
        ns(eng),
        Target::AtLeast(8e6).say(rate(eng), "8 M/s")
    );
    println!(
        "  engine/baseline {:>8.1}x the time of the trivial pass",
        eng / base
    );
    println!(
        "  worst case      {:>8.2} M segments/s  ({:.0} ns/segment; each segment from a random flow; {})",
        rate(worst) / 1e6,
        ns(worst),
        Target::AtLeast(3e6).say(rate(worst), "3 M/s")
    );
    println!(
        "  floors, per segment: the engine with {FLOWS_IN_CACHE} flows (states in cache: computing alone) {:.0} ns, worst case {:.0} ns;",
        ns(in_cache),
        ns(worst_in_cache)
    );
    println!(
        "    the flow table alone ({FLOWS} flow-state-sized slots, one field written) {:.0} ns, worst case {:.0} ns",
        ns(lookup),
        ns(worst_lookup)
    );
    println!("  memory          {per_flow:>8.0} bytes per tracked flow (100,000 flows)");
}

/// The flow table alone over the stream: each segment finds its flow's
/// slot, the size of a flow's state, and writes one field of it.
fn lookup_floor(train_max: u64) -> f64 {
    const WORDS: usize = std::mem::size_of::<FlowState>() / 8;
    let mut table: FlowTable<Flow, [u64; WORDS]> = FlowTable::new(FLOWS as usize);
    timed(train_max, FLOWS, |s| {
        table.get_or_insert(s.flow, || [0; WORDS], |_, _| {})[WORDS / 2] +=
            u64::from(s.payload_len);
    })
}
