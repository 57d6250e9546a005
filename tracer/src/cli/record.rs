//! `record` and `live`: trace an interface until Ctrl-C or `--duration`.

use std::process::ExitCode;

use anyhow::Result;

use super::{
    flags::{seconds, RecordArgs},
    run::{traced_on, Outputs, Run},
};

pub fn record(args: RecordArgs, live: bool) -> Result<ExitCode> {
    let duration = args
        .duration
        .map(|d| seconds("--duration", d))
        .transpose()?;
    let opts = args.target.tracer_options(&args.trace)?;
    let engine = args.trace.report.engine()?;
    crate::require_root()?;
    let out = Outputs::open(&args.trace, &args.target.iface)?;
    out.say_metrics();
    let mut run = Run::start(opts, out, engine, &args.trace)?;
    if args.reattach {
        run.reattach_when_back();
    }
    let tracer = run.tracer();
    eprintln!(
        "tracing TCP received on {} (XDP {}); Ctrl-C to stop",
        traced_on(&tracer.iface, tracer.netns.as_deref()),
        tracer.mode
    );
    if let Some(note) = run.veth_note() {
        eprintln!("{note}");
    }
    run.watch(live, Vec::new())?;
    let outcome = run.collect(|| false, duration, args.trace.quiet);
    let ended = run.end(outcome)?;
    let reattached = args
        .reattach
        .then(|| ("reattached", serde_json::json!(ended.reattached)));
    ended.report(&ended.snapshot(), &args.trace.report, reattached)?;
    ended.finish(args.trace.report.json)
}
