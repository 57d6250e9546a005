//! `analyze` and `replay`: a capture file through the engine, with the
//! report `record` gives (and `--plot`'s graphs).

use std::{io::IsTerminal, process::ExitCode, time::Duration};

use anyhow::{anyhow, Context, Result};

use super::flags::{filter, AnalyzeArgs};
use crate::{
    output::OutputFile,
    plot::Plot,
    report,
    source::{capture, Flow, Observation},
    SetupError,
};

/// `analyze`, or with `replay_only` the `replay` command.
pub fn analyze(args: AnalyzeArgs, replay_only: bool) -> Result<ExitCode> {
    let mut engine = args.report.engine()?;
    args.report.fit_memory(&mut engine)?;
    let filter = filter("--flow", args.flow.as_deref())?;
    let path = args.file.display().to_string();
    let file = std::fs::File::open(&args.file)
        .map_err(|e| SetupError::BadArgument(format!("opening {path}: {e}")))?;
    // A progress bar on a terminal, for files that take more than a moment
    // (~64 MB: a fifth of a second here).
    let size = file.metadata().map_or(0, |m| m.len());
    let bar = (std::io::stderr().is_terminal() && size > 64 << 20).then(|| {
        let bar = indicatif::ProgressBar::new(size);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {eta}")
                .expect("template"),
        );
        bar
    });
    let reader = capture::CaptureReader::new(std::io::BufReader::with_capacity(1 << 20, file))
        .map_err(|e| SetupError::BadArgument(format!("{path} {e}")))?;
    // What the receiver sent its senders, as recorded (unless given).
    if let Some(dsack) = reader.receiver_dsack() {
        engine.set_receiver_dsack(dsack);
    }
    let xdp = reader.xdp();
    // Writable before the work, not after.
    let plot_file = args.plot.as_deref().map(OutputFile::open).transpose()?;
    let mut plot = args.plot.as_ref().map(|_| Plot::default());
    let observations = capture::Observations::new(reader, |f: &Flow| {
        filter.matches((f.src.ip(), f.src.port()), (f.dst.ip(), f.dst.port()))
    });
    let mut n = 0u64;
    let summary = observations.read_ahead(|obs, offset| {
        if let (Some(b), true) = (&bar, n.is_multiple_of(65_536)) {
            b.set_position(offset);
        }
        n += 1;
        if let (Some(c), Some(p), Observation::Segment(s)) = (engine.observe(&obs), &mut plot, &obs)
        {
            p.segment(s, c.class, c.queue_migration);
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut snapshot = engine.snapshot();
    super::run::replay(&engine, &mut snapshot);
    // Our own traces carry the kernel's counters: the report is record's.
    if let Some(k) = &summary.kernel {
        snapshot = snapshot
            .with_kernel(k)
            .with_linux(summary.linux.clone())
            .with_xdp(xdp);
    }
    let elapsed = Duration::from_nanos(summary.last_ns.saturating_sub(summary.first_ns));
    let header = format!(
        "tracer: {path}, {} packets over {:.1} s",
        summary.packets,
        elapsed.as_secs_f64()
    );
    if replay_only && args.report.json {
        let flows: Vec<serde_json::Value> = snapshot
            .flows
            .iter()
            .map(|f| serde_json::json!({"src": f.src, "dst": f.dst, "replay": f.replay}))
            .collect();
        let v = serde_json::json!({"replay": snapshot.totals.replay, "flows": flows});
        println!("{}", serde_json::to_string_pretty(&v).expect("JSON"));
    } else if replay_only {
        print!("{}", report::replay_text(&snapshot, &header));
    } else if args.report.json {
        report::write_json(&snapshot, None, std::io::stdout().lock())
            .context("writing the JSON report to stdout")?;
    } else {
        let opts = report::TextOptions {
            replay: args.report.replay,
        };
        print!(
            "{}",
            report::text(
                &snapshot,
                summary.kernel.as_ref(),
                Some(&summary),
                elapsed,
                &header,
                opts
            )
        );
        if summary.undecodable > 0 {
            println!("  WARNING    {} of this trace's kernel records did not decode (another version's, or recorded on a host of the other byte order)", summary.undecodable);
        }
        if !summary.queues {
            println!("  note       no RX queue or CPU in this capture (tcpdump's have none): reordering and replay hold, but queue/CPU attribution and the verdicts need a tagged capture");
        }
    }
    if let (Some(p), Some(out)) = (&plot, plot_file) {
        let path = out.path().to_path_buf();
        // (plotters writes it by its path.)
        drop(out.start()?);
        p.write(&snapshot, args.plot_color, &path)?;
        eprintln!("plotted {}", path.display());
    }
    match summary.error {
        // What came before the damage is reported above.
        Some(e) => Err(anyhow!(
            "{path} {e}; analysed the {} packets before it",
            summary.packets
        )),
        None => Ok(ExitCode::SUCCESS),
    }
}
