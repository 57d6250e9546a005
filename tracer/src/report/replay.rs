//! What the replay estimated, as text: `tracer replay`'s report and the
//! replay lines of the text report.

use std::fmt::Write as _;

use crate::{
    replay::{ClassicUndo, Replay, Source},
    snapshot::Snapshot,
};

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
pub(super) fn replay_lines(out: &mut String, r: &Replay, indent: &str) {
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
        let _ = writeln!(
            out,
            "{indent}undo       the receiver {} DSACKs ({}), the flow {} timestamps: {}",
            if a.receiver_dsack { "sent" } else { "sent no" },
            match a.receiver_dsack_from {
                Source::Trace => "its host's net.ipv4.tcp_dsack",
                Source::Default => "assumed: Linux's default",
                s => from(s),
            },
            if a.timestamps { "carried" } else { "carried no" },
            match (a.classic_undo, a.receiver_dsack) {
                (ClassicUndo::Dsack, true) => "classic undoes what DSACKs prove spurious, as Linux's RFC 6675 recovery does (a sender that does not, as Windows before RACK-TLP is taken to be, carries less: --classic-undo never)",
                (ClassicUndo::Dsack, false) => "classic undoes nothing, having no DSACKs",
                (ClassicUndo::Never, _) => "classic never undoes (--classic-undo never)",
            }
        );
    }
    for p in &r.policies {
        let _ = writeln!(
            out,
            "{indent}  {:<15} {:>7} spurious retransmissions, {:>5} recoveries ({} spurious, {} undone), {} loss probes -> {:.0} Mbit/s ({:.0}-{:.0}; Reno {:.0}, response functions: Mathis {:.0}, CUBIC {:.0})",
            p.name,
            p.spurious_retransmissions,
            p.recovery_episodes,
            p.spurious_recovery_episodes,
            p.undone_recovery_episodes,
            p.loss_probes,
            p.estimated_goodput_bps / 1e6,
            p.estimated_goodput_range_bps.0 / 1e6,
            p.estimated_goodput_range_bps.1 / 1e6,
            p.reno_goodput_bps / 1e6,
            p.mathis_bps / 1e6,
            p.cubic_response_bps / 1e6,
        );
    }
    if let Some(x) = r.rack_vs_classic {
        let _ = writeln!(out, "{indent}  RACK-TLP vs classic: {x:.2}x the goodput");
    }
}
