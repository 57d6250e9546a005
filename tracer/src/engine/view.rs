//! The engine's state as the snapshot reports it: histograms become
//! distributions, counters the RFC 4737 and 5236 metrics, each flow its
//! report and verdict. Building the view is the engine's; the snapshot is
//! plain data.

use std::collections::BTreeMap;

use super::{
    order::MAX_N,
    verdict::{self},
    FlowState, FlowTotals, Hist, HistData, Metrics, Path,
};
use crate::{
    config::EngineConfig,
    nic::rss::Rss,
    replay::Replay,
    snapshot::{
        AttributionReport, Connection, Densities, Distribution, FlowReport, Memory, NReordering,
        Pair, PathReport, Reordering, RssCheck, Runs, Snapshot, Spread, Totals, Verdict,
    },
    source::Flow,
};

/// A distribution's summary and log2 buckets.
pub fn distribution(h: &Hist) -> Distribution {
    h.get().map(from_histogram).unwrap_or_default()
}

fn from_histogram(d: &HistData) -> Distribution {
    let h = &d.histogram;
    if d.count == 0 {
        return Distribution::default();
    }
    // Each recorded value once, in the power of two at or above it (as
    // precise as the histogram: within 10%). (Counting between powers
    // of two counted the histogram's sub-buckets that straddle one
    // twice: the buckets summed to more than the count.)
    let mut buckets: Vec<(u64, u64)> = Vec::new();
    for v in h.iter_recorded() {
        let value = h
            .lowest_equivalent(v.value_iterated_to())
            .clamp(d.min, d.max);
        let upper = value.max(1).next_power_of_two();
        match buckets.last_mut() {
            Some((u, n)) if *u == upper => *n += u64::from(v.count_at_value()),
            _ => buckets.push((upper, u64::from(v.count_at_value()))),
        }
    }
    // Percentiles are within the histogram's precision; never outside
    // what was recorded.
    let q = |p: f64| h.value_at_quantile(p).clamp(d.min, d.max);
    Distribution {
        count: d.count,
        min: d.min,
        mean: d.sum as f64 / d.count as f64,
        p50: q(0.5),
        p90: q(0.9),
        p99: q(0.99),
        max: d.max,
        buckets,
    }
}

/// The RFC 4737 and 5236 metrics of `m` as the snapshot reports them.
fn reordering(m: &Metrics) -> Reordering {
    let received = m.data_segments.saturating_sub(m.duplicates).max(1);
    let a = m.in_order as f64;
    let x = m.reordered as f64;
    let p = (m.in_order + m.reordered) as f64;
    let pairs = |map: &BTreeMap<(u32, u32), u64>| {
        map.iter()
            .map(|(&(from, to), &count)| Pair { from, to, count })
            .collect()
    };
    let rd_n: u64 = m.rd.iter().sum();
    let dt = m.rd.len() as i64 / 2;
    let rbd_n: u64 = m.rbd.iter().sum();
    Reordering {
        data_segments: m.data_segments,
        payload_bytes: m.payload_bytes,
        in_order: m.in_order,
        reordered: m.reordered,
        retransmissions: m.retransmissions,
        duplicates: m.duplicates,
        partial_duplicates: m.partial_duplicates,
        ambiguous: m.ambiguous,
        above_hole: m.above_hole,
        originals_behind_retransmission: m.originals_behind_retransmission,
        reordered_ratio: m.reordered as f64 / received as f64,
        n_reordering: (0..MAX_N)
            .map(|i| NReordering {
                n: i + 1,
                count: m.late.n_reordered[i],
                degree: m.late.n_reordered[i] as f64 / received as f64,
            })
            .collect(),
        extent: distribution(&m.late.extent),
        late_time_us: distribution(&m.late.late_time_us),
        byte_offset: distribution(&m.late.byte_offset),
        gap: distribution(&m.late.gap),
        gap_time_us: distribution(&m.late.gap_time_us),
        runs: Runs {
            runs: m.reordered,
            share_in_order: if p > 0.0 { a / p } else { 1.0 },
            mean_length: if x > 0.0 { a / x } else { a },
            spread: if a > 0.0 && x > 0.0 {
                (m.late.run_squares as f64 / a) / (a / x)
            } else {
                0.0
            },
        },
        densities: Densities {
            rd: m
                .rd
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| (i as i64 - dt, c as f64 / rd_n as f64))
                .collect(),
            rd_beyond: m.rd_beyond,
            rbd: m
                .rbd
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(|(i, &c)| (i as u64, c as f64 / rbd_n as f64))
                .collect(),
        },
        attribution: AttributionReport {
            same_queue_same_cpu: m.late.attribution[0],
            different_queue: m.late.attribution[1],
            different_cpu: m.late.attribution[2],
            different_queue_and_cpu: m.late.attribution[3],
            steered_share: verdict::steered_share(m),
            queue_pairs: pairs(&m.late.queue_pairs),
            cpu_pairs: pairs(&m.late.cpu_pairs),
        },
        queue_migrations: m.queue_migrations,
        cpu_migrations: m.cpu_migrations,
        reordered_after_migration: m.late.reordered_after_migration,
        old_queue_late_us: distribution(&m.late.old_queue_late_us),
    }
}

/// Segments by RX queue or CPU.
fn spread(paths: &[Path], id: impl Fn(&Path) -> u32) -> Vec<Spread> {
    let mut by: BTreeMap<u32, u64> = BTreeMap::new();
    for p in paths {
        *by.entry(id(p)).or_default() += p.segments;
    }
    by.into_iter()
        .map(|(id, segments)| Spread { id, segments })
        .collect()
}

fn path_reports(paths: impl Iterator<Item = Path>) -> Vec<PathReport> {
    let mut v: Vec<PathReport> = paths
        .map(|p| PathReport {
            queue: p.queue,
            cpu: p.cpu,
            segments: p.segments,
            reordered: p.reordered,
        })
        .collect();
    v.sort_by_key(|p| (p.queue, p.cpu));
    v
}

/// `flow`'s segments against the queue `rss` picks for it.
pub(crate) fn rss_check(flow: &Flow, f: &FlowState, rss: &Rss) -> RssCheck {
    let queue = rss.queue_of(flow);
    let on = |p: &&Path| p.queue == queue;
    RssCheck {
        queue,
        segments: f.paths.iter().map(|p| p.segments).sum(),
        off_queue: f.paths.iter().filter(|p| !on(p)).map(|p| p.segments).sum(),
    }
}

/// One flow's report, not yet replayed.
pub(crate) fn flow_report(
    flow: &Flow,
    f: &FlowState,
    cfg: &EngineConfig,
    rss: Option<&Rss>,
) -> FlowReport {
    let m = f.wire_metrics().unwrap_or_default();
    let (verdict, mut evidence) = verdict::judge(&m, &cfg.verdict);
    let rss = rss.map(|rss| rss_check(flow, f, rss));
    if let Some(c) = &rss {
        evidence.push_str(&if c.off_queue == 0 {
            format!("; every segment on its RSS queue {}", c.queue)
        } else {
            format!(
                "; {} of {} segments off its RSS queue {}: steered by something other than RSS (Flow Director/ATR, aRFS or an ntuple rule)",
                c.off_queue, c.segments, c.queue
            )
        });
    }
    FlowReport {
        key: Connection {
            flow: *flow,
            serial: f.serial,
        },
        src: flow.src.to_string(),
        dst: flow.dst.to_string(),
        connection: f.serial,
        earlier_on_tuple: f.earlier_on_tuple,
        segments: f.segments,
        stale_segments: f.stale_segments,
        fins: f.fins,
        reordering: reordering(&m),
        rx_queues: spread(&f.paths, |p| p.queue),
        cpus: spread(&f.paths, |p| p.cpu),
        paths: path_reports(f.paths.iter().copied()),
        verdict,
        evidence,
        tcp_layer: f.tcp_layer,
        local_retransmits: f.local_retransmits,
        rtt_us: f.rtt_ns.map(|n| n / 1000),
        duration_s: f.last_ns.saturating_sub(f.first_ns) as f64 / 1e9,
        seq_advance_bytes: f.seq_advance(),
        replay: None,
        rss,
        sender: None,
    }
}

/// What the engine counted of its connections and events, beside the
/// flows' totals.
pub(crate) struct Tally {
    pub tracked: u64,
    pub evicted: u64,
    pub reused_tuples: u64,
    pub retransmit_events: u64,
}

/// `verdicts`: flows per verdict over all tracked flows (`flows` may be
/// only the most reordered).
pub(crate) fn build(
    totals: &FlowTotals,
    flows: Vec<FlowReport>,
    verdicts: BTreeMap<Verdict, u64>,
    tally: Tally,
    cfg: &EngineConfig,
) -> Snapshot {
    Snapshot {
        totals: Totals {
            segments: totals.segments,
            stale_segments: totals.stale_segments,
            seq_advance_bytes: totals.seq_advance_bytes,
            reordering: reordering(&totals.m),
            tcp_layer: totals.tcp_layer,
            paths: path_reports(totals.paths.iter().map(
                |(&(queue, cpu), &(segments, reordered))| Path {
                    queue,
                    cpu,
                    segments,
                    reordered,
                },
            )),
            local_retransmit_events: tally.retransmit_events,
            verdicts,
            dropped_events: 0,
            // (None replayed yet: `Engine::replay`.)
            replay: Replay::total([]),
            rss: totals.rss,
        },
        flows,
        tracked_flows: tally.tracked,
        evicted_flows: tally.evicted,
        reused_tuples: tally.reused_tuples,
        config: *cfg,
        kernel: None,
        linux: None,
        xdp: None,
        peak_resident_bytes: None,
        interface: None,
        memory: Memory::default(),
        nic: None,
        fix: None,
        replay_skipped: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distribution_buckets_count_every_value_once() {
        let mut h = Hist::default();
        // 1..=5000 and a run of 1024s: values on and across the powers of
        // two, where the histogram's sub-buckets straddle them.
        for v in (1..=5000).chain(std::iter::repeat_n(1024, 100)) {
            h.record(v);
        }
        let d = distribution(&h);
        assert_eq!(d.count, 5100);
        assert_eq!(d.buckets.iter().map(|b| b.1).sum::<u64>(), 5100);
        assert!(d.buckets.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(d.buckets.iter().all(|b| b.0.is_power_of_two()));
        // Within the histogram's precision (one significant figure).
        let at_most_1024: u64 = d.buckets.iter().filter(|b| b.0 <= 1024).map(|b| b.1).sum();
        assert!((1124..=1124 + 64).contains(&at_most_1024), "{at_most_1024}");
        assert_eq!(d.buckets.last().unwrap().0, 8192);
    }
}
