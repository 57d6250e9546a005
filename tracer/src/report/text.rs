//! The final text report: totals, what counted the segments, the worst
//! flows.

use std::{fmt::Write as _, time::Duration};

use super::replay::replay_lines;
use crate::{
    kernel::{AttachedMode, Counters},
    nic::NicEvidence,
    snapshot::{Distribution, FlowReport, Snapshot, Verdict},
    source::capture::CaptureSummary,
};
use tracer_common::counter;

/// Flows shown in the text report.
const WORST_FLOWS: usize = 10;

/// What the text report includes beyond the essentials.
#[derive(Clone, Copy, Debug, Default)]
pub struct TextOptions {
    /// The sender-policy replay (experimental: see the README).
    pub replay: bool,
}

/// The final text report: totals, what counted the segments (the kernel's
/// counters, when the trace was this tracer's, and a capture file's own
/// counts, when read from one), the worst flows.
pub fn text(
    s: &Snapshot,
    kernel: Option<&Counters>,
    capture: Option<&CaptureSummary>,
    elapsed: Duration,
    header: &str,
    opts: TextOptions,
) -> String {
    let none = Counters::default();
    let counters = kernel.unwrap_or(&none);
    let mut out = String::new();
    let t = &s.totals;
    let r = &t.reordering;
    let secs = elapsed.as_secs_f64().max(1e-9);
    let _ = writeln!(out, "{header}");
    let (summarized, summarized_bytes) = counters.summarized();
    let bytes = r.payload_bytes + summarized_bytes;
    let _ = writeln!(
        out,
        "  segments   {} seen by {}{}, {} with data ({:.1} MB, {:.1} Mbit/s)",
        t.segments + summarized,
        if kernel.is_some() {
            "XDP"
        } else {
            "the capture"
        },
        if summarized > 0 {
            format!(" ({summarized} of them counted in the kernel only: summary mode)")
        } else {
            String::new()
        },
        r.data_segments,
        bytes as f64 / 1e6,
        bytes as f64 * 8.0 / secs / 1e6
    );
    let _ = writeln!(
        out,
        "  order      {} reordered ({}), {} retransmissions, {} duplicates ({} partial), {} ambiguous",
        r.reordered,
        pct(r.reordered_ratio),
        r.retransmissions,
        r.duplicates,
        r.partial_duplicates,
        r.ambiguous
    );
    if r.reordered > 0 {
        let _ = writeln!(out, "  late       {}", lateness(r));
        let _ = writeln!(out, "  n-reorder  {}", n_reordering(r));
        let a = &r.attribution;
        let _ = writeln!(
            out,
            "  attributed {} overtaken on another RX queue or CPU (queue {}, CPU {}, both {}, same {}); {} queue and {} CPU migrations",
            pct(a.steered_share),
            a.different_queue,
            a.different_cpu,
            a.different_queue_and_cpu,
            a.same_queue_same_cpu,
            r.queue_migrations,
            r.cpu_migrations
        );
    }
    let verdicts: Vec<_> = [
        Verdict::NicSteering,
        Verdict::Upstream,
        Verdict::Mixed,
        Verdict::None,
    ]
    .iter()
    .map(|v| format!("{v} {}", t.verdicts.get(v).copied().unwrap_or(0)))
    .collect();
    let _ = writeln!(
        out,
        "  flows      {} connections on {} 4-tuples, {} tracked{}; verdicts: {}",
        s.connections(),
        s.connections() - s.reused_tuples,
        s.tracked_flows,
        if s.evicted_flows > 0 {
            let idle = match (s.memory.expired_idle, s.config.idle_expiry_ns) {
                (0, _) | (_, None) => String::new(),
                (n, Some(ns)) => format!(", {n} of them idle over {} s", ns / 1_000_000_000),
            };
            format!(
                " ({} evicted{idle}, counted in the totals)",
                s.evicted_flows
            )
        } else {
            String::new()
        },
        verdicts.join(", ")
    );
    if t.stale_segments > 0 {
        let _ = writeln!(
            out,
            "  stale      {} segments of ended connections arrived after the next one on their 4-tuple began (counted nowhere else)",
            t.stale_segments
        );
    }
    if let Some(r) = &t.rss {
        let _ = writeln!(
            out,
            "  rss        {}",
            if r.off_queue == 0 {
                format!(
                    "every segment of {} flows arrived on its RSS queue",
                    r.flows
                )
            } else {
                format!(
                    "{} of {} segments arrived off their flow's RSS queue, in {} of {} flows: something other than RSS steered them (Flow Director/ATR, aRFS or an ntuple rule)",
                    r.off_queue, r.segments, r.flows_off, r.flows
                )
            }
        );
    }
    let _ = writeln!(
        out,
        "  tcp layer  {} tcp_probe events ({} late, {} duplicates, {} segments out-of-order queued, {} discarded by PAWS), {} local retransmissions",
        t.tcp_layer.events,
        t.tcp_layer.late,
        t.tcp_layer.duplicates,
        t.tcp_layer.ofo_segments,
        t.tcp_layer.paws_discarded,
        t.local_retransmit_events
    );
    if opts.replay && s.replay_skipped {
        let _ = writeln!(
            out,
            "  replay     not done: stopped by a second signal, for the report at once"
        );
    }
    if opts.replay && !s.totals.replay.policies.is_empty() {
        let _ = writeln!(
            out,
            "  replay     all flows (each replayed on its own path):"
        );
        let _ = writeln!(
            out,
            "  (replay is experimental: against the lab's Linux senders, RACK-TLP within 30% in 45 of 47 runs with the sender's own transmit times, 1.2-1.9x high from its timestamps as for a remote sender; classic has no Linux sender to check against; see the README)"
        );
        replay_lines(&mut out, &s.totals.replay, "  ");
    }
    if let Some(counters) = kernel {
        kernel_lines(&mut out, counters);
    }
    if let Some(c) = capture {
        let _ = writeln!(
            out,
            "  capture    packets {}, TCP {}, non-TCP {}, truncated {}, unsupported link types {}, filtered out {}",
            c.packets, c.tcp, c.non_tcp, c.truncated, c.unsupported_link, c.filtered
        );
    }
    if let Some(nic) = &s.nic {
        nic_lines(&mut out, nic);
    }
    if let Some(fix) = &s.fix {
        let _ = writeln!(
            out,
            "  FIX        suggested, not run by the tracer: {}",
            fix.suggestion
        );
        let _ = writeln!(out, "             because: {}", fix.evidence);
    }
    if let Some(xdp) = s.xdp {
        let seen = match xdp {
            AttachedMode::Native => "the frames as the driver received them (on a NIC, wire segments)",
            AttachedMode::Generic => "the packets the stack took (after GRO, and a veth peer's TSO packets: several segments at once), not wire segments",
            AttachedMode::Off => "none: the TCP layer alone",
        };
        let _ = writeln!(out, "  xdp        {xdp}: {seen}");
    }
    if let Some(linux) = &s.linux {
        let _ = writeln!(out, "  linux      {}", linux.release);
        for m in &linux.missing {
            let _ = writeln!(out, "  missing    {m}");
        }
    }
    let m = &s.memory;
    let _ = writeln!(
        out,
        "  memory     {}the flows held {} MB at most, of the {} MB the budget left them (--memory-mib)",
        s.peak_resident_bytes
            .map_or(String::new(), |peak| format!("{} MB peak resident; ", peak >> 20)),
        m.peak_held_bytes >> 20,
        m.budget_bytes >> 20
    );
    if m.ack_logs_shed + m.evicted_for_memory > 0 {
        let _ = writeln!(
            out,
            "  MEMORY     to stay within the budget: {} flows' ACK-level replay logs given up (those flows were replayed from the wire), {} flows evicted (their counts are in the totals, their replays are not)",
            m.ack_logs_shed, m.evicted_for_memory
        );
    }
    let shown: Vec<_> = s
        .flows
        .iter()
        .filter(|f| f.data_segments > 0)
        .take(WORST_FLOWS)
        .collect();
    if !shown.is_empty() {
        let _ = writeln!(out, "  flows, most reordered first:");
    }
    // In summary mode the views see what was emitted: not comparable.
    let summarized =
        counters.get(counter::XDP_SUMMARIZED) + counters.get(counter::PROBE_SUMMARIZED) > 0;
    for f in &shown {
        flow_lines(&mut out, f, opts, summarized);
    }
    let rest = s.flows.iter().filter(|f| f.data_segments > 0).count() - shown.len();
    if rest > 0 {
        let _ = writeln!(out, "    ... and {rest} more (--json has them all)");
    }
    out
}

fn flow_lines(out: &mut String, f: &FlowReport, opts: TextOptions, summarized: bool) {
    let _ = writeln!(
        out,
        "    {}  {}: {} of {} segments reordered ({}), {} retransmitted{}, {:.1} MB{}, rx queues {}{}, cpus {}",
        f.flow(),
        f.verdict,
        f.reordered,
        f.data_segments,
        pct(f.reordered_ratio),
        f.retransmissions,
        match f.stale_segments {
            0 => String::new(),
            n => format!(", {n} stale (the connection before it on its 4-tuple)"),
        },
        f.seq_advance_bytes as f64 / 1e6,
        if summarized {
            String::new()
        } else {
            tcp_layer_hole(f)
        },
        spread(&f.rx_queues),
        f.rss.map_or(String::new(), |c| format!(
            " (RSS picks {}: {} segments off it)",
            c.queue, c.off_queue
        )),
        spread(&f.cpus),
    );
    if f.reordered > 0 {
        let _ = writeln!(out, "      {}", lateness(f));
        let _ = writeln!(out, "      {}", f.evidence);
    }
    if let Some(r) = f.replay.as_ref().filter(|_| opts.replay) {
        replay_lines(out, r, "      ");
    }
}

/// When TCP's receive path was seen carrying visibly less payload than XDP
/// saw arrive (the kernel did not run the tcp_probe program for some
/// segments; XDP is the complete view), how much it saw.
fn tcp_layer_hole(f: &FlowReport) -> String {
    let (tcp, wire) = (f.tcp_layer.payload_bytes, f.payload_bytes);
    if f.tcp_layer.events == 0 || f.tcp_layer.covers(wire) {
        return String::new();
    }
    format!(
        " (tcp_probe saw only {:.1}% of it)",
        tcp as f64 * 100.0 / wire.max(1) as f64
    )
}

fn lateness(r: &crate::snapshot::Reordering) -> String {
    let d = |x: &Distribution| format!("p50 {} p99 {} max {}", x.p50, x.p99, x.max);
    format!(
        "extent {} segments; late time {} µs; byte offset {} bytes",
        d(&r.extent),
        d(&r.late_time_us),
        d(&r.byte_offset)
    )
}

fn n_reordering(r: &crate::snapshot::Reordering) -> String {
    r.n_reordering
        .iter()
        .map(|n| format!("{}:{}", n.n, pct(n.degree)))
        .collect::<Vec<_>>()
        .join(" ")
        + "  (n=3 is the duplicate-ACK threshold)"
}

fn kernel_lines(out: &mut String, counters: &Counters) {
    let ring_full = counters.ring_full();
    if ring_full > 0 {
        let _ = writeln!(
            out,
            "  DROPPED    {ring_full} events lost: the ring buffer was full (XDP {}, tcp_probe {}, retransmit {}). Results are incomplete; try a larger --ring-mib or a --filter.",
            counters.get(counter::XDP_DROPPED),
            counters.get(counter::PROBE_DROPPED),
            counters.get(counter::RTX_DROPPED),
        );
    } else {
        let _ = writeln!(out, "  dropped    0 events");
    }
    let overloaded = counters.get(counter::OVERLOAD_ENTERED);
    if overloaded > 0 {
        let _ = writeln!(
            out,
            "  OVERLOAD   the collector fell behind: {overloaded} times the ring passed half full and the kernel summarized (as --summary {}) until it drained to an eighth ({} times); counts are whole, the detail below is a summary's (--never-summarize drops events instead)",
            crate::kernel::DEFAULT_OVERLOAD_SAMPLE,
            counters.get(counter::OVERLOAD_LEFT),
        );
    }
    let summarized = counters.get(counter::XDP_SUMMARIZED);
    if summarized > 0 {
        let _ = writeln!(
            out,
            "  summary    {summarized} of {} segments counted in the kernel only (summary mode): reorder counts, ratios and verdicts hold; extents, late times' spread and densities see the emitted segments",
            counters.get(counter::XDP_TCP)
        );
    }
    let probe_summarized = counters.get(counter::PROBE_SUMMARIZED);
    if probe_summarized > 0 {
        let _ = writeln!(
            out,
            "  summary    {probe_summarized} tcp_probe skbs TCP took in order counted in the kernel only (of {} runs): its out-of-order and PAWS counts hold; its in-order count sees the emitted ones",
            counters.get(counter::PROBE_SEEN)
        );
    }
    let (probe_lost, rtx_lost) = (counters.probe_lost(), counters.rtx_lost());
    if probe_lost + rtx_lost > 0 {
        let hits = counters.get(counter::PROBE_SEEN) + probe_lost;
        let _ = writeln!(
            out,
            "  MISSED     {probe_lost} of {hits} tcp_probe and {rtx_lost} retransmit events: the kernel did not run the program, it was already running on that CPU",
        );
    }
    let _ = writeln!(
        out,
        "  kernel     frames {}, TCP {}, non-TCP {}, truncated {}, unsupported headers {}, IP fragments {}, filtered {}, read errors {}",
        counters.get(counter::XDP_FRAMES),
        counters.get(counter::XDP_TCP),
        counters.get(counter::XDP_NON_TCP),
        counters.get(counter::XDP_TRUNCATED),
        counters.get(counter::XDP_UNSUPPORTED),
        counters.get(counter::XDP_FRAGMENTS),
        counters.get(counter::XDP_FILTERED),
        counters.get(counter::PROBE_READ_ERRORS) + counters.get(counter::RTX_READ_ERRORS),
    );
}

fn pct(share: f64) -> String {
    let p = share * 100.0;
    if p == 0.0 {
        "0%".to_string()
    } else if p < 0.01 {
        format!("{p:.4}%")
    } else if p < 10.0 {
        format!("{p:.2}%")
    } else {
        format!("{p:.0}%")
    }
}

/// `0:61% 1:39%`: how segments spread over queues or CPUs.
fn spread(list: &[crate::snapshot::Spread]) -> String {
    let total: u64 = list.iter().map(|s| s.segments).sum();
    list.iter()
        .map(|s| {
            let p = s.segments as f64 * 100.0 / total.max(1) as f64;
            if p < 0.5 {
                format!("{}:<1%", s.id)
            } else {
                format!("{}:{p:.0}%", s.id)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What the NIC said: at the end of the run, and its steering statistics'
/// change over it.
fn nic_lines(out: &mut String, e: &NicEvidence) {
    let n = &e.end;
    let mut about = vec![match (&n.driver, &n.version) {
        (Some(d), Some(v)) => format!("driver {d} {v}"),
        (Some(d), None) => format!("driver {d}"),
        _ => "driver unknown".to_string(),
    }];
    about.extend(n.firmware.as_ref().map(|f| format!("firmware {f}")));
    about.extend(n.bus.as_ref().map(|b| format!("bus {b}")));
    if let Some(c) = &n.channels {
        about.push(format!(
            "channels: {} combined, {} rx, {} tx",
            c.combined, c.rx, c.tx
        ));
    }
    if let Some(on) = n.ntuple {
        about.push(format!("ntuple {}", if on { "on" } else { "off" }));
    }
    let _ = writeln!(out, "  nic        {}: {}", n.iface, about.join(", "));
    if !n.private_flags.is_empty() {
        let flags: Vec<String> = n
            .private_flags
            .iter()
            .map(|(f, on)| format!("{f} {}", if *on { "on" } else { "off" }))
            .collect();
        let _ = writeln!(out, "  nic flags  {}", flags.join(", "));
    }
    if let Some(rss) = &n.rss {
        let mut queues: Vec<u32> = rss.indir.clone();
        queues.sort_unstable();
        queues.dedup();
        let _ = writeln!(
            out,
            "  nic rss    {}, a {}-byte key, a table of {} entries over queues {}",
            n.rss_function.as_deref().unwrap_or("unknown function"),
            rss.key.len(),
            rss.indir.len(),
            spread_ids(&queues)
        );
    }
    let rps: Vec<String> = n
        .rps
        .iter()
        .filter(|(_, r)| r.cpus.chars().any(|c| c != '0' && c != ','))
        .map(|(q, r)| format!("rx-{q} to CPUs {} ({} flows)", r.cpus, r.flow_cnt))
        .collect();
    if !n.rps.is_empty() || n.rps_sock_flow_entries.is_some_and(|e| e > 0) {
        let _ = writeln!(
            out,
            "  nic rps    {}; rps_sock_flow_entries {} (RFS {})",
            if rps.is_empty() {
                "off on every RX queue".to_string()
            } else {
                rps.join(", ")
            },
            n.rps_sock_flow_entries.unwrap_or(0),
            if n.rps_sock_flow_entries.unwrap_or(0) > 0 {
                "on"
            } else {
                "off"
            }
        );
    }
    if !n.irqs.is_empty() {
        let irqs: Vec<String> = n
            .irqs
            .iter()
            .map(|i| format!("{} (irq {}) on CPUs {}", i.name, i.irq, i.cpus))
            .collect();
        let _ = writeln!(out, "  nic irqs   {}", irqs.join(", "));
    }
    let changed: Vec<String> = e
        .deltas
        .iter()
        .filter(|(_, d)| d.delta > 0)
        .map(|(name, d)| format!("{name} +{}", d.delta))
        .collect();
    if !e.deltas.is_empty() {
        let _ = writeln!(
            out,
            "  nic stats  over the run: {}",
            if changed.is_empty() {
                "no steering statistic changed".to_string()
            } else {
                changed.join(", ")
            }
        );
    }
    for what in &n.unanswered {
        let _ = writeln!(out, "  nic        not answered: {what}");
    }
}

/// `0-3` for consecutive ids, else a list.
fn spread_ids(ids: &[u32]) -> String {
    match (ids.first(), ids.last()) {
        (Some(a), Some(b)) if (b - a) as usize + 1 == ids.len() && ids.len() > 2 => {
            format!("{a}-{b}")
        }
        _ => ids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}
