//! `watch`: `record` as a service. No end but a signal (or, with
//! `--no-reattach`, the interface going away); a report per interval
//! instead of one at the end.

use std::{process::ExitCode, time::Duration};

use anyhow::Result;

use super::{
    flags::WatchArgs,
    run::{traced_on, Outputs, PcapngRing, Run},
};
use crate::{
    intervals::Intervals,
    kernel::privilege::{self, User},
    record, SetupError,
};

pub fn watch(args: WatchArgs) -> Result<ExitCode> {
    let mut args = args.with_defaults()?;
    // The ring's, not a single trace's.
    let snaplen = args.trace.snaplen.take();
    let opts = args.target.tracer_options(&args.trace)?;
    let mut engine = args.trace.report.engine()?;
    // Its reports carry no replay: a retired flow is not replayed (a long
    // one's replay held the collector up for seconds, and the ring filled).
    engine.skip_replay_of_retired();
    // Root, or a service's user given the capabilities.
    privilege::may_attach()?;
    let watching = serde_json::json!({
        "host": hostname(),
        "interface": opts.iface,
        "netns": opts.netns,
        "mode": match opts.summary_sample {
            0 => "full".to_string(),
            n => format!("summary, one in {n} of the uneventful segments"),
        },
        "version": env!("CARGO_PKG_VERSION"),
    });
    let user = args.user.as_deref().map(User::named).transpose()?;
    let every = Duration::from_secs(args.interval);
    let mut out = Outputs::open(&args.trace, &args.target.iface)?;
    if let Some(dir) = &args.pcapng {
        out = out.with_pcapng_ring(PcapngRing {
            dir: dir.clone(),
            file_bytes: args.pcapng_mib << 20,
            files: args.pcapng_files,
            snaplen,
        })?;
        if let Some(u) = &user {
            give_to(dir, u)?;
        }
    }
    let intervals = Intervals::open(&args.reports, args.keep, every, watching)?;
    if let Some(u) = &user {
        give_to(&args.reports, u)?;
    }
    let out = out.with_intervals(intervals);
    // From here on SIGHUP reopens the outputs instead of ending the process.
    record::catch_hangups()?;
    let mut run = Run::start(opts, out, engine, &args.trace)?;
    let keep = if args.no_reattach {
        Vec::new()
    } else {
        run.reattach_when_back();
        privilege::to_attach_again(args.target.netns.is_some())
    };
    // The collector's priority first: raising it needs a capability too.
    record::stay_urgent();
    privilege::keep_only(&keep, user.as_ref())?;
    let tracer = run.tracer();
    let on = traced_on(&tracer.iface, tracer.netns.as_deref());
    let why = match (keep.is_empty(), args.target.netns.is_some()) {
        (true, _) => "it will not attach again (--no-reattach)".to_string(),
        (false, false) => format!("to attach again when {on} comes back"),
        (false, true) => format!(
            "to attach again when {on} comes back (CAP_SYS_ADMIN to enter the namespace: --no-reattach runs without it)"
        ),
    };
    eprintln!(
        "tracer: watching TCP received on {on} (XDP {}) as {}, keeping {} ({why}); nothing else of root",
        tracer.mode,
        User::current(),
        privilege::named(&keep),
    );
    if let Some(note) = run.veth_note() {
        eprintln!("{note}");
    }
    eprintln!(
        "tracer: metrics at {}; a report every {} s to {}, the latest {} kept; SIGHUP reopens them, SIGTERM ends",
        run.metrics_url().unwrap_or_default(),
        args.interval,
        args.reports.display(),
        args.keep,
    );
    if let Some(dir) = &args.pcapng {
        eprintln!(
            "tracer: the trace to {} in files of {} MiB, the latest {} kept",
            dir.display(),
            args.pcapng_mib,
            args.pcapng_files
        );
    }
    run.watch(false, Vec::new())?;
    let outcome = run.collect(|| false, None, true);
    let ended = run.end(outcome)?;
    eprintln!("{}", ended.header);
    // (Its closing lines to stderr, the log, as the rest.)
    ended.finish(true)
}

/// Makes `user` the owner of the reports' directory, which it will write
/// to once it is who the process is.
fn give_to(dir: &std::path::Path, user: &User) -> Result<()> {
    std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid)).map_err(|e| {
        SetupError::BadOutput {
            path: dir.display().to_string(),
            reason: format!("giving it to user {}: {e}", user.name),
        }
        .into()
    })
}

/// This host's name, as the interval reports name it.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}
