//! The lab's report: its own view (the edge's ground truth, the sockets'
//! and kernels' counters, each sender's goodput) beside what the tracer
//! and the replay found from the receiver alone.

use std::fmt::Write as _;

use super::{FlowResult, LabOutcome};
use crate::{report::TextOptions, snapshot::Snapshot};

/// The lab's own view next to the tracer's, flow by flow: what the sockets
/// and kernels counted and what the edge did (ground truth).
pub fn text(s: &Snapshot, lab: &LabOutcome, opts: TextOptions) -> String {
    let mut out = String::new();
    let e = &lab.edge;
    let cpus: Vec<_> = e
        .queue_cpus
        .iter()
        .enumerate()
        .map(|(q, c)| format!("{q}->{c}"))
        .collect();
    let _ = writeln!(out, "lab: edge in mode {}", e.mode);
    let _ = writeln!(
        out,
        "  edge       queue->CPU {}; {} table changes; {} data segments left it ({} ground-truth events lost, {} without their ingress record)",
        cpus.join(" "),
        e.truth.table_changes.len(),
        e.counters.get("egress_data").copied().unwrap_or(0),
        e.counters.get("truth_dropped").copied().unwrap_or(0),
        e.counters.get("egress_unmatched").copied().unwrap_or(0),
    );
    if let Some(w) = &lab.wan {
        let late = w.late_us.map_or(String::new(), |l| {
            format!(
                "; each went on {} us late (p50), {} (p99), {} at most",
                l.p50, l.p99, l.max
            )
        });
        let neck = w.bottleneck.map_or(String::new(), |b| {
            format!(
                "; the bottleneck passed {} packets ({:.1} MB), dropped {}",
                b.sent_packets,
                b.sent_bytes as f64 / 1e6,
                b.dropped
            )
        });
        let _ = writeln!(
            out,
            "  wan        {}: {} packets held on the way back ({} lost){late}{neck}",
            w.spec, w.delayed, w.delay_dropped
        );
    }
    if !lab.receiver_dsack {
        let _ = writeln!(
            out,
            "  receiver   sent no DSACKs (--no-dsack): no sender could undo a recovery from them"
        );
    }
    if lab.dropped_on_the_way > 0 {
        let _ = writeln!(
            out,
            "  way        {} packets dropped between the edge and the server (its receive ring full): sent, never seen",
            lab.dropped_on_the_way
        );
    }
    if let Some(u) = &lab.until_late {
        let _ = if u.reached {
            writeln!(
                out,
                "  sized      stopped once every flow had {} late segments (fewest {})",
                u.asked, u.fewest
            )
        } else {
            writeln!(
                out,
                "  SHORT      asked for {} late segments in every flow, the bytes or the time ran out at {}: give a higher --rate, --bytes or --duration",
                u.asked, u.fewest
            )
        };
    }
    for r in &lab.flows {
        let (port, sender) = (r.flow.src.port(), r.sender);
        let _ = writeln!(out, "  {} ({sender} sender)", r.flow);
        let _ = writeln!(
            out,
            "    sockets  sent {:.1} MB, received {:.1} MB; sender {} retransmissions, {} reordering events seen, {} DSACKed; receiver {} segments queued out of order",
            r.sent as f64 / 1e6,
            r.received as f64 / 1e6,
            r.retransmits,
            r.reord_seen,
            r.dsack_dups,
            r.rcv_ooopack
        );
        if let Some(t) = e.truth.flow(port) {
            let _ = writeln!(
                out,
                "    truth    {} of {} original segments left the edge late, {} behind a segment on another queue or CPU (and {} late retransmissions, {} late behind their own retransmission); {} queue changes; {} segments left off the flow's RSS queue",
                t.late, t.segments, t.late_on_another_path, t.late_retransmissions, t.late_already_delivered, t.queue_changes, t.off_rss
            );
        }
        let src = r.flow.src.to_string();
        if let Some(f) = s.flows.iter().find(|f| f.src == src) {
            let a = &f.attribution;
            let _ = writeln!(
                out,
                "    tracer   {} reordered, {} overtaken on another queue or CPU, verdict {}; {} queue migrations{}; {} arrived above a hole, {} queued out of order and {} discarded by PAWS at the TCP layer",
                f.reordered,
                a.different_queue + a.different_cpu + a.different_queue_and_cpu,
                f.verdict,
                f.queue_migrations,
                f.rss.map_or(String::new(), |c| format!("; {} segments arrived off the RSS queue", c.off_queue)),
                f.above_hole,
                f.tcp_layer.ofo_segments,
                f.tcp_layer.paws_discarded
            );
            if let Some(r) = f.replay.as_ref().filter(|_| opts.replay) {
                let predicted: Vec<_> = r
                    .policies
                    .iter()
                    .map(|p| format!("{} {}", p.name, p.spurious_retransmissions))
                    .collect();
                let _ = writeln!(
                    out,
                    "    replay   predicted spurious retransmissions: {}; the {} sender's DSACKed: {}",
                    predicted.join(", "),
                    sender,
                    r_dsack(&lab.flows, &src)
                );
            }
        }
    }
    if let Some(p) = &e.pattern {
        let late: Vec<_> = p.late().collect();
        let extent_max = late.iter().map(|h| h.passed_segments).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "  pattern    {} of {} data segments held, {} of them overtaken (extent up to {extent_max})",
            p.held.len(),
            p.data_segments,
            late.len()
        );
    }
    let counters = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, v)| format!("{} {v}", k.trim_start_matches("TcpExt")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "  kernel     receiver {}; this host's senders {}",
        counters(&lab.receiver_counters),
        counters(&lab.sender_counters)
    );
    for s in &lab.senders {
        if let Some(g) = &s.guest {
            let knobs: Vec<_> = g.sysctls.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(
                out,
                "  guest      {} sender: Linux {} ({}); {}",
                s.kind,
                g.release,
                knobs.join(" "),
                counters(&g.counters)
            );
            for e in &g.errors {
                let _ = writeln!(out, "  guest      {} sender: a flow failed: {e}", s.kind);
            }
        }
    }
    let a = &lab.sender_acks;
    let _ = writeln!(
        out,
        "  ACK probe  {} ACKs timed as the senders' sockets took them ({} lost in the kernel, {} over the per-flow cap): the replay's ACK path",
        a.seen, a.lost, a.over_cap
    );
    out + &senders_goodput(s)
}

/// Each sender's goodput beside what the replay, from the receiver alone,
/// estimates classic and RACK-TLP senders would have carried on its flows;
/// with both a classic and a reorder-tolerant sender, the seed's
/// conclusion in these numbers.
fn senders_goodput(s: &Snapshot) -> String {
    /// A sender's flows: how many, their goodput, the replay's estimates.
    #[derive(Default)]
    struct Kind {
        flows: usize,
        mbit: f64,
        /// Estimates and their ranges, Mbit/s.
        classic: (f64, f64, f64),
        rack: (f64, f64, f64),
    }
    let mut kinds: std::collections::BTreeMap<&str, Kind> = Default::default();
    for f in &s.flows {
        let Some(name) = f.sender.as_deref() else {
            continue;
        };
        let estimate = |policy: &str| {
            f.replay
                .as_ref()
                .and_then(|r| r.policies.iter().find(|p| p.name == policy))
                .map_or((0.0, 0.0, 0.0), |p| {
                    let (lo, hi) = p.estimated_goodput_range_bps;
                    (p.estimated_goodput_bps / 1e6, lo / 1e6, hi / 1e6)
                })
        };
        let add = |sum: &mut (f64, f64, f64), e: (f64, f64, f64)| {
            *sum = (sum.0 + e.0, sum.1 + e.1, sum.2 + e.2);
        };
        let k = kinds.entry(name).or_default();
        k.flows += 1;
        k.mbit += f.goodput_mbit();
        add(&mut k.classic, estimate("classic"));
        add(&mut k.rack, estimate("rack-tlp"));
    }
    let shown = |(e, lo, hi): (f64, f64, f64)| format!("{e:.1} ({lo:.0}-{hi:.0})");
    let mut out = String::new();
    for (name, k) in &kinds {
        let _ = writeln!(
            out,
            "  goodput    {} sender: {:.1} Mbit/s over {} flow{}; the replay, from what the receiver saw: a classic sender {}, RACK-TLP {}",
            name,
            k.mbit,
            k.flows,
            if k.flows == 1 { "" } else { "s" },
            shown(k.classic),
            shown(k.rack)
        );
    }
    let classic = kinds.get("classic");
    let tolerant = ["rack-tlp", "host"]
        .into_iter()
        .find_map(|name| kinds.get(name).map(|k| (name, k)));
    if let (Some(c), Some((t_name, t))) = (classic, tolerant) {
        if c.mbit > 0.0 && c.classic.0 > 0.0 {
            let _ = writeln!(
                out,
                "  conclusion through the same reordering and path, the {} sender (RACK-TLP) carried {:.1}x what the classic sender did ({:.1} against {:.1} Mbit/s); from the classic sender's flows alone, the replay estimated that RACK-TLP would have carried {} Mbit/s on them, {:.1}x what they did (and {:.1}x its estimate for classic)",
                t_name,
                t.mbit / c.mbit,
                t.mbit,
                c.mbit,
                shown(c.rack),
                c.rack.0 / c.mbit,
                c.rack.0 / c.classic.0
            );
        }
    }
    out
}

fn r_dsack(flows: &[FlowResult], src: &str) -> u32 {
    flows
        .iter()
        .find(|r| r.flow.src.to_string() == src)
        .map_or(0, |r| r.dsack_dups)
}
