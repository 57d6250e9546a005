//! `lab`: build the lab's network, trace its upload on the server, report
//! beside the lab's ground truth, and take everything down.

use std::{process::ExitCode, time::Duration};

use anyhow::Result;

use super::{
    flags::{LabArgs, LabPlan, LabSendArgs},
    run::{Outputs, Run},
};
use crate::{filter::Filter, lab, report};

pub fn lab(args: LabArgs) -> Result<ExitCode> {
    let LabPlan { spec, pace } = args.plan()?;
    let mut engine = args.trace.report.engine()?;
    crate::require_root()?;
    let out = Outputs::open(&args.trace, lab::SERVER_IF)?;
    out.say_metrics();
    let mut lab = lab::Lab::create(&spec)?;
    if args.trace.report.rss_key.is_none() {
        // What the edge's NIC would report.
        engine.set_rss(lab.rss());
    }
    let opts = args.trace.tracer_options(
        lab::SERVER_IF.to_string(),
        Some(lab.topo.server_ns.clone()),
        Filter::default(),
    )?;
    let mut run = Run::start(opts, out, engine, &args.trace)?;
    let host_senders = spec.senders.iter().any(|s| !s.in_guest());
    eprintln!(
        "lab: {} x {}{:.0} MB upload from each of {} over {}{} through {} and an edge in mode {}; {} queues; traced on the server with XDP {}",
        spec.flows,
        match spec.until_late {
            Some(n) => format!("(until {n} late segments each) at most "),
            None => String::new(),
        },
        spec.bytes_per_flow as f64 / 1e6,
        spec.senders
            .iter()
            .map(|s| format!("{s}{}", if s.in_guest() { " (Linux 6.1 guest)" } else { " (this kernel)" }))
            .collect::<Vec<_>>()
            .join(", "),
        if spec.ipv6 { "IPv6" } else { "IPv4" },
        if pace > 0.0 && host_senders {
            format!(", host flows paced to {pace} Mbit/s each")
        } else {
            String::new()
        },
        spec.wan,
        spec.mode,
        lab.topo.queues,
        run.tracer().mode
    );
    run.watch(args.live, spec.sender_addresses())?;
    lab.start_upload()?;
    let outcome = run.collect(
        || lab.finished(),
        Some(spec.timeout + Duration::from_secs(1)),
        args.trace.quiet,
    );
    let lab_outcome = lab.finish();
    run.stop();
    drop(lab);
    // (Everything the lab made is gone while the view waits for `q`.)
    let mut ended = run.end(outcome)?;
    if let Ok(l) = &lab_outcome {
        // This host's senders' sockets: the replay uses their RTTs (the
        // smoothed one as it was during the transfer). A guest's flows are
        // replayed from what the receiver sees alone.
        for r in l.flows.iter().filter(|r| !r.sender.in_guest()) {
            let srtt = if r.mean_srtt_us > 0 {
                r.mean_srtt_us
            } else {
                r.srtt_us
            };
            ended.engine.set_sender_rtt(
                &r.flow,
                u64::from(srtt) * 1000,
                u64::from(r.min_rtt_us) * 1000,
            );
            let probe = &l.sender_acks;
            ended.engine.set_sender_socket(
                &r.flow,
                probe.acks.get(&r.flow).map_or(&[], Vec::as_slice),
                probe.retransmits.get(&r.flow).map_or(&[], Vec::as_slice),
            );
        }
    }
    // What was traced is reported even when the lab's own bookkeeping
    // failed; the failure then follows it (exit 1).
    let value = lab_outcome.as_ref().ok().map(|l| {
        (
            "lab",
            serde_json::to_value(l).expect("lab outcome serialises"),
        )
    });
    // One snapshot for both reports: it runs every flow's replay.
    let snapshot = ended.snapshot().name_senders(&spec.sender_addresses());
    ended.report(&snapshot, &args.trace.report, value)?;
    let lab_outcome = lab_outcome?;
    if !args.trace.report.json {
        let opts = report::TextOptions {
            replay: args.trace.report.replay,
        };
        print!("{}", lab::report::text(&snapshot, &lab_outcome, opts));
    }
    ended.finish(args.trace.report.json)
}

/// `lab-send`, inside a lab's sender guest: its sysctls set, its upload
/// sent, what it did printed for the lab to read.
pub fn lab_send(a: LabSendArgs) -> Result<ExitCode> {
    lab::guest::send(&lab::guest::SendOrder {
        to: a.to,
        flows: a.flows,
        bytes: a.bytes,
        timeout: Duration::from_secs_f64(a.seconds),
        stop_file: a.stop_file,
        sysctls: a.sysctl,
    })?;
    Ok(ExitCode::SUCCESS)
}
