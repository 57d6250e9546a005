//! `watch`: `record` as a service. No end but a signal (or, with
//! `--no-reattach`, the interface going away); a report per interval
//! instead of one at the end.

use std::{process::ExitCode, time::Duration};

use anyhow::Result;

use super::{
    flags::{filter, WatchArgs},
    run::{traced_on, Outputs, Run},
};
use crate::{intervals::Intervals, record};

pub fn watch(args: WatchArgs) -> Result<ExitCode> {
    let args = args.with_defaults()?;
    let filter = filter("--filter", args.filter.as_deref())?;
    let opts = args
        .trace
        .tracer_options(args.iface.clone(), args.netns.clone(), filter)?;
    let engine = args.trace.report.engine()?;
    crate::require_root()?;
    let watching = serde_json::json!({
        "host": hostname(),
        "interface": args.iface,
        "netns": args.netns,
        "mode": match opts.summary_sample {
            0 => "full".to_string(),
            n => format!("summary, one in {n} of the uneventful segments"),
        },
        "version": env!("CARGO_PKG_VERSION"),
    });
    let every = Duration::from_secs(args.interval);
    let intervals = Intervals::open(&args.reports, args.keep, every, watching)?;
    let out = Outputs::open(&args.trace)?.with_intervals(intervals);
    // From here on SIGHUP reopens the outputs instead of ending the process.
    record::catch_hangups()?;
    let mut run = Run::start(opts, out, engine, &args.trace)?;
    if !args.no_reattach {
        run.reattach_when_back();
    }
    let tracer = run.tracer();
    eprintln!(
        "tracer: watching TCP received on {} (XDP {}); a report every {} s to {}, the latest {} kept; SIGHUP reopens them, SIGTERM ends",
        traced_on(&tracer.iface, tracer.netns.as_deref()),
        tracer.mode,
        args.interval,
        args.reports.display(),
        args.keep,
    );
    run.watch(false, Vec::new())?;
    let outcome = run.collect(|| false, None, true);
    let ended = run.end(outcome)?;
    eprintln!("{}", ended.header);
    // (Its closing lines to stderr, the log, as the rest.)
    ended.finish(true)
}

/// This host's name, as the interval reports name it.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}
