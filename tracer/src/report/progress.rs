//! The one line printed every second while tracing.

use std::time::Duration;

use crate::{kernel::Counters, snapshot::Live};
use tracer_common::counter;

/// One line: rates since the previous line (`prev`, `prev_counters`: then),
/// flows, reordering, drops. The rates count what summary mode kept in the
/// kernel too.
pub fn progress_line(
    now: &Live,
    prev: &Live,
    elapsed: Duration,
    interval: Duration,
    counters: &Counters,
    prev_counters: &Counters,
    resident_bytes: u64,
) -> String {
    let secs = interval.as_secs_f64().max(1e-9);
    let ((segs, bytes), (prev_segs, prev_bytes)) =
        (counters.summarized(), prev_counters.summarized());
    let seg_rate = (now.segments + segs).saturating_sub(prev.segments + prev_segs) as f64 / secs;
    let mbit = (now.payload_bytes + bytes).saturating_sub(prev.payload_bytes + prev_bytes) as f64
        * 8.0
        / secs
        / 1e6;
    let probe_rate = (now.probes - prev.probes) as f64 / secs;
    let dropped = counters.dropped();
    let overloaded = counters.get(counter::OVERLOAD_ENTERED) > counters.get(counter::OVERLOAD_LEFT);
    format!(
        "[{:>5.1}s] {:>9} seg/s {:>9.1} Mbit/s  tcp_probe {:>9}/s  flows {:>5}  reordered {:>8}  rss {:>4} MB (flows {}/{})  dropped {}{}{}{}",
        elapsed.as_secs_f64(),
        si(seg_rate),
        mbit,
        si(probe_rate),
        now.flows,
        now.reordered,
        resident_bytes >> 20,
        now.memory.held_bytes >> 20,
        now.memory.budget_bytes >> 20,
        dropped,
        if overloaded { "  OVERLOAD: summarizing" } else { "" },
        match (now.memory.ack_logs_shed, now.memory.evicted_for_memory) {
            (0, 0) => String::new(),
            (logs, flows) => format!("  MEMORY: {logs} replay logs, {flows} flows given up"),
        },
        if dropped > 0 { "  <-- EVENTS LOST" } else { "" }
    )
}

/// 1234567 -> "1.23M".
fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
