//! Events per second and memory against flows x their length, in the
//! default memory budget (`cargo xtask bench`). Each cell feeds the engine
//! synthetic uploads as a receiver with the TCP layer traced sees them
//! (every segment at XDP, then at `tcp_probe`; half the flows swap two
//! neighbours every 50 segments), flows taking turns; a trivial pass over
//! the same stream is the baseline. Memory: the engine's own estimate and
//! the allocator's count of what it holds (the peak, sampled every 4,096
//! events), per flow, and what the budget made it give up.

use std::{hint::black_box, time::Instant};

use tracer::{
    config::DEFAULT_MEMORY_BUDGET,
    engine::{Engine, EngineConfig},
    source::Observation,
};

#[path = "../tests/common/heap.rs"]
mod heap;
#[path = "../tests/common/uploads.rs"]
mod uploads;
use uploads::Uploads;

const FLOWS: [u32; 4] = [64, 1024, 16_384, 65_536];
const LENGTHS: [u32; 3] = [64, 1024, 16_384];
/// Cells over this many segments are left out (time).
const MAX_SEGMENTS: u64 = 20_000_000;

fn main() {
    let budget = DEFAULT_MEMORY_BUDGET;
    println!(
        "memory benchmark: events/s and memory against flows x segments, budget {} MB, one core",
        budget >> 20
    );
    println!(
        "  {:>6} x {:>6}  {:>10}  {:>9}  {:>9}  {:>9}  {:>10}  {:>9}  given up",
        "flows", "length", "events/s", "vs trivial", "held MB", "heap MB", "per flow", "engine ns"
    );
    for flows in FLOWS {
        for len in LENGTHS {
            let segments = u64::from(flows) * u64::from(len);
            if segments > MAX_SEGMENTS {
                continue;
            }
            let stream = || Uploads::new(flows, len, |i| i % 2 == 0);
            // Baseline: touch every event.
            let t = Instant::now();
            let mut sum = 0u64;
            for obs in stream() {
                if let Observation::Segment(s) = &obs {
                    sum = sum.wrapping_add(u64::from(s.seq));
                }
            }
            black_box(sum);
            let base = t.elapsed().as_secs_f64();

            let before = heap::heap();
            let mut e = Engine::new(EngineConfig {
                memory_budget: budget,
                ..EngineConfig::default()
            });
            let mut peak = 0;
            let t = Instant::now();
            for (k, obs) in stream().enumerate() {
                black_box(e.observe(&obs));
                if k % 4096 == 0 {
                    peak = peak.max(heap::heap() - before);
                }
            }
            let took = t.elapsed().as_secs_f64();
            peak = peak.max(heap::heap() - before);
            let events = 2 * segments;
            let m = e.memory();
            let tracked = e.live().flows.max(1);
            println!(
                "  {flows:>6} x {len:>6}  {:>9.2}M  {:>9.1}x  {:>9.1}  {:>9.1}  {:>8.0} B  {:>9.0}  {} replay logs, {} flows",
                events as f64 / took / 1e6,
                took / base,
                m.peak_held_bytes as f64 / (1 << 20) as f64,
                peak as f64 / (1 << 20) as f64,
                m.held_bytes as f64 / tracked as f64,
                (took - base).max(0.0) * 1e9 / events as f64,
                m.ack_logs_shed,
                m.evicted_for_memory,
            );
            drop(e);
        }
    }
}
