//! Renders a [`Snapshot`]: the one-line progress summary printed every
//! second, the final text report and the JSON report.

use std::{fmt::Write as _, time::Duration};

use crate::{
    kernel::Counters,
    replay::{Replay, Source},
    snapshot::{Distribution, FlowReport, Live, Snapshot, Verdict},
    source::capture::CaptureSummary,
};
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

/// The JSON report (the snapshot, with the kernel counters).
pub fn json(snapshot: &Snapshot) -> String {
    serde_json::to_string_pretty(snapshot).expect("snapshot serialises")
}

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
        "  flows      {} tracked{}; verdicts: {}",
        s.tracked_flows,
        if s.evicted_flows > 0 {
            format!(" ({} evicted, counted in the totals)", s.evicted_flows)
        } else {
            String::new()
        },
        verdicts.join(", ")
    );
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
        "    {}  {}: {} of {} segments reordered ({}), {} retransmitted, {:.1} MB{}, rx queues {}, cpus {}",
        f.flow(),
        f.verdict,
        f.reordered,
        f.data_segments,
        pct(f.reordered_ratio),
        f.retransmissions,
        f.seq_advance_bytes as f64 / 1e6,
        if summarized {
            String::new()
        } else {
            tcp_layer_hole(f)
        },
        spread(&f.rx_queues),
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

/// The replay alone (`tracer replay FILE`): all flows, then each flow with
/// the path it was replayed on.
pub fn replay_text(s: &Snapshot, header: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{header}");
    let _ = writeln!(
        out,
        "  replay     all flows (each replayed on its own path; experimental, see the README):"
    );
    replay_lines(&mut out, &s.totals.replay, "  ");
    for f in s.flows.iter().filter(|f| f.data_segments > 0) {
        let _ = writeln!(
            out,
            "    {}  {} of {} segments reordered",
            f.flow(),
            f.reordered,
            f.data_segments
        );
        if let Some(r) = &f.replay {
            replay_lines(&mut out, r, "      ");
        }
    }
    out
}

/// "what a sender would have done": one line per policy, then the ratio.
fn replay_lines(out: &mut String, r: &Replay, indent: &str) {
    if let Some(a) = &r.assumptions {
        let from = |s: Source| match s {
            Source::Given => "given",
            Source::Sender => "the sender's socket",
            Source::Trace => "from the trace",
            Source::Default => "assumed",
        };
        let _ = writeln!(
            out,
            "{indent}replay     RTT {:.0} µs ({}), min_RTT {:.0} µs, ACKs {:.0} µs on their way ({}), bottleneck {:.0} Mbit/s ({}{}), MSS {}, {:.2} s; classic and RACK-TLP {}",
            a.rtt_us,
            match a.queueing_us {
                Some(q) => format!("the handshake's, and the others' part of the {q:.0} µs its data queued"),
                None => from(a.rtt_from).to_string(),
            },
            a.min_rtt_us,
            a.ack_delay_us,
            match a.ack_delay_from {
                Source::Sender => "each its own, at the sender's socket; median",
                s => from(s),
            },
            a.bottleneck_bps / 1e6,
            from(a.bottleneck_from),
            if a.bottleneck_bps < a.link_bps {
                format!(
                    "; its part of {:.0} Mbit/s, {:.1} flows at once",
                    a.link_bps / 1e6,
                    a.flows_sharing
                )
            } else {
                String::new()
            },
            a.mss_bytes,
            a.duration_s,
            match (a.ack_level, a.send_times_from, a.ack_log_shed) {
                (true, Source::Sender, _) => "ACK by ACK over the receiver's TCP layer, sent when the sender's socket says",
                (true, _, _) => "ACK by ACK over the receiver's TCP layer, sent when the timestamps say",
                (false, _, true) => "from the wire's late originals (the ACK-level log was given up to stay within --memory-mib)",
                (false, _, false) => "from the wire's late originals",
            }
        );
    }
    for p in &r.policies {
        let _ = writeln!(
            out,
            "{indent}  {:<15} {:>7} spurious retransmissions, {:>5} recoveries ({} spurious, {} undone), {} loss probes -> {:.0} Mbit/s (Reno {:.0}, response functions: Mathis {:.0}, CUBIC {:.0})",
            p.name,
            p.spurious_retransmissions,
            p.recovery_episodes,
            p.spurious_recovery_episodes,
            p.undone_recovery_episodes,
            p.loss_probes,
            p.estimated_goodput_bps / 1e6,
            p.reno_goodput_bps / 1e6,
            p.mathis_bps / 1e6,
            p.cubic_response_bps / 1e6,
        );
    }
    if let Some(x) = r.rack_vs_classic {
        let _ = writeln!(out, "{indent}  RACK-TLP vs classic: {x:.2}x the goodput");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        engine::{Engine, EngineConfig},
        source::{Flow, Observation, Segment},
    };

    fn engine_with(order: &[(u32, u32)]) -> Engine {
        let mut e = Engine::new(EngineConfig::default());
        let flow = Flow {
            src: "10.0.0.1:1000".parse().unwrap(),
            dst: "10.0.0.2:80".parse().unwrap(),
        };
        for (i, &(n, q)) in order.iter().enumerate() {
            e.observe(&Observation::Segment(Segment {
                ts_ns: i as u64 * 1000,
                ifindex: 1,
                rx_queue: q,
                cpu: q,
                flow,
                seq: 1 + n * 100,
                ack: 0,
                payload_len: 100,
                flags: 0x10,
                window: 0,
                ip_id: None,
                timestamp: Some((n, 0)),
                sack: vec![],
                vlan: None,
                first_fragment: false,
                summarized_before: 0,
            }));
        }
        e
    }

    #[test]
    fn text_report_names_the_verdict_and_its_evidence() {
        let e = engine_with(&[(0, 0), (1, 0), (3, 1), (4, 1), (2, 0), (5, 1)]);
        let text = text(
            &e.snapshot(),
            Some(&Counters::default()),
            None,
            Duration::from_secs(1),
            "hdr",
            TextOptions::default(),
        );
        assert!(
            text.contains("1 reordered (16.7%)") || text.contains("1 reordered (17%)"),
            "{text}"
        );
        assert!(
            text.contains("nic-steering: 1 of 6 segments reordered"),
            "{text}"
        );
        assert!(
            text.contains("1 of 1 reordered segments overtaken on another RX queue or CPU"),
            "{text}"
        );
        assert!(
            text.contains("verdicts: nic-steering 1, upstream 0, mixed 0, none 0"),
            "{text}"
        );
        assert!(text.contains("dropped    0 events"), "{text}");
        assert!(
            text.contains("memory     the flows held 0 MB at most, of the 512 MB"),
            "{text}"
        );
        assert!(!text.contains("MEMORY"), "{text}");
    }

    #[test]
    fn text_report_says_what_the_memory_budget_took() {
        let mut s = engine_with(&[(0, 0), (1, 0)]).snapshot();
        s.memory.ack_logs_shed = 7;
        s.memory.evicted_for_memory = 2;
        let text = text(
            &s.with_resident(300 << 20),
            Some(&Counters::default()),
            None,
            Duration::from_secs(1),
            "hdr",
            TextOptions::default(),
        );
        assert!(
            text.contains("memory     300 MB peak resident; the flows held"),
            "{text}"
        );
        assert!(
            text.contains("MEMORY     to stay within the budget: 7 flows' ACK-level replay logs given up (those flows were replayed from the wire), 2 flows evicted"),
            "{text}"
        );
    }

    #[test]
    fn progress_line_rates_and_drops() {
        let prev = Live::default();
        let now = Live {
            segments: 5,
            payload_bytes: 400,
            probes: 2,
            reordered: 1,
            flows: 2,
            memory: crate::snapshot::Memory {
                budget_bytes: 400 << 20,
                held_bytes: 3 << 20,
                ..Default::default()
            },
        };
        let mut c = Counters::default();
        let line = progress_line(
            &now,
            &prev,
            Duration::from_secs(1),
            Duration::from_secs(1),
            &c,
            &Counters::default(),
            48 << 20,
        );
        assert!(line.contains("5 seg/s"), "{line}");
        assert!(line.contains("flows     2"), "{line}");
        assert!(line.contains("rss   48 MB (flows 3/400)"), "{line}");
        assert!(
            !line.contains("LOST") && !line.contains("OVERLOAD") && !line.contains("MEMORY"),
            "{line}"
        );
        let shed = Live {
            memory: crate::snapshot::Memory {
                ack_logs_shed: 12,
                evicted_for_memory: 3,
                ..now.memory
            },
            ..now
        };
        assert!(progress_line(
            &shed,
            &prev,
            Duration::ZERO,
            Duration::from_secs(1),
            &c,
            &Counters::default(),
            0
        )
        .contains("MEMORY: 12 replay logs, 3 flows given up"));
        c.map[counter::OVERLOAD_ENTERED as usize] = 1;
        assert!(progress_line(
            &now,
            &prev,
            Duration::ZERO,
            Duration::from_secs(1),
            &c,
            &Counters::default(),
            0
        )
        .contains("OVERLOAD: summarizing"));
        c.map[counter::XDP_DROPPED as usize] = 7;
        assert!(progress_line(
            &now,
            &prev,
            Duration::ZERO,
            Duration::from_secs(1),
            &c,
            &Counters::default(),
            0
        )
        .contains("EVENTS LOST"));
    }

    #[test]
    fn dropped_and_missed_events_are_shouted() {
        let mut c = Counters::default();
        c.map[counter::XDP_DROPPED as usize] = 7;
        // 10 hits: 6 ran the first copy, 4 skipped it; 8 were handled.
        c.map[counter::PROBE_FIRST_COPY_RUNS as usize] = 6;
        c.probe_first_copy_misses = 4;
        c.map[counter::PROBE_SEEN as usize] = 8;
        let e = engine_with(&[(0, 0)]);
        let text = text(
            &e.snapshot(),
            Some(&c),
            None,
            Duration::from_secs(1),
            "x",
            TextOptions::default(),
        );
        assert!(
            text.contains("DROPPED    7 events lost: the ring buffer was full"),
            "{text}"
        );
        assert!(
            text.contains("MISSED     2 of 10 tcp_probe and 0 retransmit events"),
            "{text}"
        );
        assert_eq!(c.dropped(), 9);
    }

    #[test]
    fn json_report_carries_kernel_drops() {
        let mut c = Counters::default();
        c.map[counter::XDP_DROPPED as usize] = 3;
        let e = engine_with(&[(0, 0), (1, 0)]);
        let v: serde_json::Value =
            serde_json::from_str(&json(&e.snapshot().with_kernel(&c))).unwrap();
        assert_eq!(v["totals"]["dropped_events"], 3);
        assert_eq!(v["totals"]["data_segments"], 2);
        assert_eq!(v["kernel"]["xdp_dropped"], 3);
    }
}
