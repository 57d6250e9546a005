//! One tracing run, as `record`, `live` and `lab` share it: the outputs
//! opened before anything is attached, attach, the trace file begun, the
//! live screen, the collection loop, detach, the report and the closing
//! lines with the exit code.

use std::{
    io::IsTerminal,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context, Result};

use super::flags::{metrics_addr, ReportArgs, TraceArgs};
use crate::{
    engine::Engine,
    intervals::Intervals,
    jsonl::JsonLines,
    kernel::{netns, AttachedMode, KernelReport, Tracer, TracerOptions},
    metrics::Metrics,
    nic::{self, NicEvidence, NicWatch},
    output::{KeptFiles, OutputFile},
    pcapng::{self, PcapngWriter},
    record::{self, Outcome, RecordOptions, StopReason},
    replay::Replay,
    report,
    sink::Sink,
    snapshot::{Connection, InterfaceEvents, Snapshot},
    tui, SetupError,
};
use tracer_common::CAPTURE_MAX;

/// A run attached and collecting: the tracer, the engine it feeds, the
/// outputs and the live screen.
pub(super) struct Run {
    tracer: Option<Tracer>,
    pub engine: Engine,
    out: Outputs,
    screen: LiveScreen,
    opts: TracerOptions,
    linux: Option<KernelReport>,
    /// The XDP attachment that ran (once stopped).
    xdp: Option<AttachedMode>,
    /// On a veth: the mode taken and what it costs or means.
    veth_note: Option<String>,
    /// What the NIC says, read when the run began, every second while
    /// live and when it stopped.
    nic: NicWatch,
    /// When the interface goes away: wait for it and attach again.
    reattach: bool,
    /// How often that happened.
    reattached: u32,
}

/// A run that has ended: what it collected, ready to report.
pub(super) struct Ended {
    pub engine: Engine,
    pub outcome: Outcome,
    out: Outputs,
    linux: Option<KernelReport>,
    xdp: Option<AttachedMode>,
    nic: Option<NicEvidence>,
    /// The report's first line.
    pub header: String,
    /// Times the run attached again after its interface came back.
    pub reattached: u32,
}

impl Run {
    /// Attaches with `opts` (the trace file's snaplen added), gives the
    /// engine its share of the memory budget and begins the trace file.
    pub fn start(
        opts: TracerOptions,
        mut out: Outputs,
        mut engine: Engine,
        trace: &TraceArgs,
    ) -> Result<Self> {
        // On a veth, what keeps the peer's speed unless native was asked.
        let (xdp_mode, veth_note) = if opts.xdp {
            nic::veth::xdp_mode(&opts.iface, opts.netns.as_deref(), opts.xdp_mode)
        } else {
            (opts.xdp_mode, None)
        };
        let opts = TracerOptions {
            snaplen: out.file.snaplen(trace),
            xdp_mode,
            ..opts
        };
        let tracer = Tracer::attach(&opts)?;
        let nic = NicWatch::start(&opts.iface, opts.netns.as_deref());
        if engine.rss().is_none() {
            // The NIC's own RSS, when it hashes as the check does.
            let first = nic.first();
            if let Some(rss) = first
                .rss
                .clone()
                .filter(|_| first.rss_function.as_deref() == Some("toeplitz"))
            {
                engine.set_rss(rss);
            }
        }
        // What the receiving TCP sends its senders: DSACKs, or not.
        if let Some(v) = netns::sysctl(opts.netns.as_deref(), "net.ipv4.tcp_dsack") {
            engine.set_receiver_dsack(v != "0");
        }
        trace.report.fit_memory(&mut engine)?;
        out.file.begin(&tracer, trace, engine.receiver_dsack())?;
        Ok(Self {
            tracer: Some(tracer),
            engine,
            out,
            screen: LiveScreen(None),
            opts,
            linux: None,
            xdp: None,
            veth_note,
            nic,
            reattach: false,
            reattached: 0,
        })
    }

    /// When the interface goes away (deleted, or its namespace), wait for
    /// one of its name and attach to it again, instead of ending.
    pub fn reattach_when_back(&mut self) {
        self.reattach = true;
    }

    /// After the caller's banner: what the kernel lacks, a line each, and
    /// with `live` and a terminal the live screen from here on (naming
    /// `senders`' flows); nothing may print to the terminal after.
    pub fn watch(&mut self, live: bool, senders: Vec<tui::SenderName>) -> Result<()> {
        let tracer = self.tracer();
        for m in tracer.kernel.missing() {
            eprintln!("tracer: Linux {}: {m}", tracer.kernel.release);
        }
        self.screen = LiveScreen::open(live, self.tracer(), senders)?;
        Ok(())
    }

    /// "http://ADDR/metrics", when served.
    pub fn metrics_url(&self) -> Option<String> {
        self.out.metrics_url()
    }

    pub fn tracer(&self) -> &Tracer {
        self.tracer.as_ref().expect("attached until stop")
    }

    /// On a veth, the XDP mode taken and what it costs or means, to be
    /// said once at start ([`nic::veth::xdp_mode`]).
    pub fn veth_note(&self) -> Option<&str> {
        self.veth_note.as_deref()
    }

    /// Collects until `until`, `duration` or a signal (progress lines
    /// unless `quiet` or the screen shows it), attaching again each time
    /// the interface comes back if asked to; detached after.
    pub fn collect(
        &mut self,
        mut until: impl FnMut() -> bool,
        duration: Option<Duration>,
        quiet: bool,
    ) -> Result<Outcome> {
        let start = Instant::now();
        let mut before: Option<Outcome> = None;
        loop {
            let left = duration.map(|d| d.saturating_sub(start.elapsed()));
            let earlier = InterfaceEvents {
                went_down: before.as_ref().map_or(0, |b| u64::from(b.went_down)),
                attached_again: u64::from(self.reattached),
            };
            let now = self.collect_attached(&mut until, left, quiet, earlier)?;
            let mut outcome = match before.take() {
                Some(b) => b.then(now),
                None => now,
            };
            outcome.elapsed = start.elapsed();
            if outcome.stop != StopReason::InterfaceGone || !self.reattach {
                self.last_interval(&outcome);
                return Ok(outcome);
            }
            let old = self.tracer.take().expect("attached until stop");
            let on = traced_on(&old.iface, old.netns.as_deref());
            self.linux = Some(old.kernel.report());
            // Its programs are gone; its maps and ring go too.
            drop(old);
            eprintln!(
                "tracer: {on} went away after {:.1} s: waiting for it to come back",
                outcome.elapsed.as_secs_f64()
            );
            let (iface, netns) = (self.opts.iface.clone(), self.opts.netns.clone());
            let mut tracer = loop {
                let back = || Tracer::interface_exists(&iface, netns.as_deref());
                let mut signal = record::wait_until(back, Duration::from_millis(200))?;
                if signal.is_none() {
                    match Tracer::attach(&self.opts) {
                        Ok(tracer) => break tracer,
                        // Gone again, or not ready: the report so far
                        // stays, and so does the wait (a second).
                        Err(e) => {
                            eprintln!(
                                "tracer: {on} is there, but attaching to it failed: {e:#}; waiting"
                            );
                            let t = Instant::now();
                            let second = || t.elapsed() >= Duration::from_secs(1);
                            signal = record::wait_until(second, Duration::from_millis(200))?;
                        }
                    }
                }
                if let Some(signal) = signal {
                    outcome.stop = StopReason::Signal(signal);
                    outcome.elapsed = start.elapsed();
                    self.last_interval(&outcome);
                    return Ok(outcome);
                }
            };
            tracer.count_on_from(outcome.counters);
            self.reattached += 1;
            eprintln!(
                "tracer: {on} is back: attached again after {:.1} s (XDP {}; {} time(s) in this run)",
                start.elapsed().as_secs_f64(),
                tracer.mode,
                self.reattached
            );
            if let Output::Pcapng(p) = &mut self.out.file {
                p.attached_again(tracer.ifindex);
            }
            self.tracer = Some(tracer);
            self.nic = NicWatch::start(&self.opts.iface, self.opts.netns.as_deref());
            before = Some(outcome);
        }
    }

    /// The interval under way, written as the run's last.
    fn last_interval(&mut self, outcome: &Outcome) {
        if let Some(iv) = self.out.intervals.as_mut() {
            let s = self
                .engine
                .live_snapshot(0, None)
                .with_kernel(&outcome.counters)
                .with_nic(self.nic.evidence().cloned())
                .with_interface(interface_events(outcome, self.reattached));
            record::write_interval(iv, &s, self.engine.flow_reports(), true);
        }
    }

    /// One collection, while attached.
    fn collect_attached(
        &mut self,
        until: impl FnMut() -> bool,
        duration: Option<Duration>,
        quiet: bool,
        earlier: InterfaceEvents,
    ) -> Result<Outcome> {
        let mut sinks: Vec<&mut dyn Sink> = self.out.file.sink().into_iter().collect();
        let live = self.screen.link();
        record::run(
            self.tracer.as_mut().expect("attached until stop"),
            &mut self.engine,
            &mut sinks,
            until,
            RecordOptions {
                duration,
                // The screen shows what the progress line would.
                progress: !quiet && live.is_none(),
                live,
                metrics: self.out.metrics.as_ref(),
                nic: Some(&mut self.nic),
                intervals: self.out.intervals.as_mut(),
                interface: earlier,
            },
        )
    }

    /// Lets go of the kernel (programs, maps): before a lab takes its
    /// network down.
    pub fn stop(&mut self) {
        if let Some(tracer) = self.tracer.take() {
            self.linux = Some(tracer.kernel.report());
            self.xdp = Some(tracer.mode);
        }
    }

    /// The end: the kernel let go, the screen told how the collection
    /// ended (a finished one stays until `q`) and closed.
    pub fn end(mut self, outcome: Result<Outcome>) -> Result<Ended> {
        self.stop();
        let outcome = self.screen.close(outcome)?;
        Ok(Ended {
            header: header(&self.opts, &outcome),
            engine: self.engine,
            outcome,
            out: self.out,
            linux: self.linux,
            xdp: self.xdp,
            nic: self.nic.evidence().cloned(),
            reattached: self.reattached,
        })
    }
}

/// Replays every flow of `s` (a snapshot of `engine`) on every core, a
/// flow at a time, with a progress bar on a terminal once it has taken a
/// second; a SIGINT or SIGTERM meanwhile gives up the replay (said), so
/// that the report comes at once.
pub(crate) fn replay(engine: &Engine, s: &mut Snapshot) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    let signals = record::StopSignals::install();
    let keys: Vec<Connection> = s.flows.iter().map(|f| f.key).collect();
    let of = keys.len();
    let (next, done, stop) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicBool::new(false),
    );
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let start = Instant::now();
    let bar = indicatif::ProgressBar::hidden();
    let shown = std::io::stderr().is_terminal();
    let mut cut = None;
    let replays: Vec<(usize, Option<Replay>)> = std::thread::scope(|scope| {
        let work = || {
            let mut mine = Vec::new();
            while !stop.load(Relaxed) {
                let i = next.fetch_add(1, Relaxed);
                let Some(key) = keys.get(i) else { break };
                mine.push((i, engine.replay_of(key)));
                done.fetch_add(1, Relaxed);
            }
            mine
        };
        let handles: Vec<_> = (0..workers.min(of)).map(|_| scope.spawn(work)).collect();
        while !handles.iter().all(|h| h.is_finished()) {
            if shown && bar.is_hidden() && start.elapsed() >= Duration::from_secs(1) {
                bar.set_length(of as u64);
                bar.set_style(
                    indicatif::ProgressStyle::with_template(
                        "replaying {pos}/{len} connections {bar:40} {eta} (Ctrl-C: the report without it)",
                    )
                    .expect("template"),
                );
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            }
            bar.set_position(done.load(Relaxed) as u64);
            if let Some(signal) = signals.as_ref().ok().and_then(|g| g.received()) {
                stop.store(true, Relaxed);
                cut = Some((signal, done.load(Relaxed)));
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a replay worker"))
            .collect()
    });
    bar.finish_and_clear();
    match cut {
        Some((signal, done)) => {
            eprintln!(
                "tracer: {signal} while replaying ({done} of {of} connections done): the report without the replay"
            );
            s.skip_replay();
        }
        None => {
            for (i, r) in replays {
                s.flows[i].replay = r;
            }
            engine.total_replays(s);
        }
    }
}

impl Ended {
    /// The engine's snapshot, every flow replayed (the costly part: see
    /// [`replay`]), with the kernel's counters, release and the
    /// collector's peak memory.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = self.engine.snapshot();
        replay(&self.engine, &mut s);
        s.with_kernel(&self.outcome.counters)
            .with_interface(interface_events(&self.outcome, self.reattached))
            .with_linux(self.linux.clone())
            .with_xdp(self.xdp)
            .with_resident(self.outcome.peak_resident_bytes)
            .with_nic(self.nic.clone())
    }

    /// The final report, text or JSON; `extra` is added to the JSON's top
    /// level.
    pub fn report(
        &self,
        snapshot: &Snapshot,
        flags: &ReportArgs,
        extra: Option<(&str, serde_json::Value)>,
    ) -> Result<()> {
        if flags.json {
            report::write_json(snapshot, extra, std::io::stdout().lock())
                .context("writing the JSON report to stdout")?;
        } else {
            print!(
                "{}",
                report::text(
                    snapshot,
                    Some(&self.outcome.counters),
                    None,
                    self.outcome.elapsed,
                    &self.header,
                    report::TextOptions {
                        replay: flags.replay,
                    },
                )
            );
        }
        Ok(())
    }

    /// Final lines shared by every command (stderr when stdout is JSON), and
    /// the exit code.
    pub fn finish(&self, json: bool) -> Result<ExitCode> {
        let (outcome, out) = (&self.outcome, &self.out.file);
        let say = |line: String| {
            if json {
                eprintln!("{}", line.trim_start());
            } else {
                println!("{line}");
            }
        };
        if outcome.went_down > 0 {
            say(format!(
                "  down       {} time(s), its programs attached throughout",
                outcome.went_down
            ));
        }
        if self.reattached > 0 {
            say(format!(
                "  attached   again {} time(s), each time the interface came back",
                self.reattached
            ));
        }
        if outcome.decode_errors > 0 || outcome.missing() > 0 {
            say(format!(
                "  WARNING    {} records did not decode, {} emitted records were not read",
                outcome.decode_errors,
                outcome.missing()
            ));
        }
        match out {
            Output::None | Output::Pending { .. } | Output::PendingRing(_) => {}
            Output::Jsonl(j) => say(format!(
                "  wrote      {} observations (JSON lines)",
                j.written()
            )),
            Output::Pcapng(p) => {
                let (packets, records) = p.written();
                say(match p.ring_files() {
                    None => format!(
                        "  wrote      {} ({packets} packets, {records} TCP-layer records; pcapng)",
                        p.path().display()
                    ),
                    Some((dir, files)) => format!(
                        "  wrote      {packets} packets, {records} TCP-layer records to {files} pcapng files in {}, the last {}",
                        dir.display(),
                        p.path().display()
                    ),
                });
                if let Some(failure) = p.failure() {
                    // The report above stands; the trace is incomplete.
                    return Err(anyhow!(failure));
                }
            }
        }
        if outcome.stop == StopReason::InterfaceGone {
            // The report above covers what came before.
            return Err(anyhow!(
                "the traced interface went away after {:.1} s (deleted, or its network namespace was): tracing stopped there; the report covers what came before",
                outcome.elapsed.as_secs_f64(),
            ));
        }
        Ok(if outcome.counters.dropped() > 0 {
            ExitCode::from(3)
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// `--out`: the trace file, by its extension, or `watch --pcapng`'s ring.
/// Opened before anything is attached; written from when the tracer is.
enum Output {
    None,
    Pending { file: OutputFile, pcapng: bool },
    PendingRing(PcapngRing),
    Jsonl(JsonLines),
    Pcapng(Box<PcapngWriter>),
}

/// `watch --pcapng DIR`: the trace as a ring of files.
pub(super) struct PcapngRing {
    pub dir: std::path::PathBuf,
    pub file_bytes: u64,
    pub files: usize,
    /// `--snaplen`.
    pub snaplen: Option<u32>,
}

impl Output {
    /// Opens it (not yet truncated), so that bad paths fail first.
    fn open(trace: &TraceArgs) -> Result<Self> {
        let Some(path) = trace.out.as_deref() else {
            if trace.snaplen.is_some() {
                return Err(SetupError::BadArgument(
                    "--snaplen applies to a pcapng trace: add --out FILE.pcapng".into(),
                )
                .into());
            }
            return Ok(Self::None);
        };
        let pcapng = match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
            "pcapng" => true,
            "jsonl" => false,
            _ => {
                return Err(SetupError::BadArgument(format!(
                    "--out {}: name the file FILE.pcapng (a trace for Wireshark and `tracer analyze`) or FILE.jsonl (JSON lines)",
                    path.display()
                ))
                .into())
            }
        };
        match trace.snaplen {
            Some(_) if !pcapng => {
                return Err(SetupError::BadArgument(
                    "--snaplen applies to a pcapng trace, not JSON lines".into(),
                )
                .into())
            }
            Some(n) if !(1..=CAPTURE_MAX as u32).contains(&n) => {
                return Err(SetupError::BadArgument(format!(
                    "--snaplen {n}: give 1 to {CAPTURE_MAX} bytes"
                ))
                .into())
            }
            _ => {}
        }
        Ok(Self::Pending {
            file: OutputFile::open(path)?,
            pcapng,
        })
    }

    /// What XDP copies of each frame ([`TracerOptions::snaplen`]).
    fn snaplen(&self, trace: &TraceArgs) -> u32 {
        match self {
            // At least the headers: 1 byte asks for exactly them.
            Self::Pending { pcapng: true, .. } => trace.snaplen.unwrap_or(1),
            Self::PendingRing(ring) => ring.snaplen.unwrap_or(1),
            _ => 0,
        }
    }

    /// Once attached: the file is emptied and the writer starts (pcapng:
    /// its headers, naming the traced interface).
    fn begin(
        &mut self,
        tracer: &Tracer,
        trace: &TraceArgs,
        receiver_dsack: Option<bool>,
    ) -> Result<()> {
        let interface = |snaplen: Option<u32>| {
            let keeps = match snaplen {
                Some(n) => format!("the first {n} bytes of each frame (at least its headers)"),
                None => "headers only".into(),
            };
            pcapng::Interface {
                name: tracer.iface.clone(),
                description: format!(
                    "{}, XDP {}, {keeps}",
                    traced_on(&tracer.iface, tracer.netns.as_deref()),
                    tracer.mode
                ),
                ifindex: tracer.ifindex,
                kernel: tracer.kernel.report(),
                receiver_dsack,
                xdp: tracer.mode,
            }
        };
        *self = match std::mem::replace(self, Self::None) {
            Self::Pending { file, pcapng } => {
                let path = file.path().to_path_buf();
                let started = file.start().map_err(|e| SetupError::BadOutput {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
                if pcapng {
                    let iface = interface(trace.snaplen);
                    Self::Pcapng(Box::new(PcapngWriter::create(&path, started, iface)?))
                } else {
                    Self::Jsonl(JsonLines::new(&path, started))
                }
            }
            Self::PendingRing(ring) => {
                let kept = KeptFiles::open(&ring.dir, ring.files, pcapng::RING_PREFIX, ".pcapng")?;
                let iface = interface(ring.snaplen);
                Self::Pcapng(Box::new(PcapngWriter::ring(kept, ring.file_bytes, iface)?))
            }
            other => other,
        };
        Ok(())
    }

    fn sink(&mut self) -> Option<&mut dyn Sink> {
        match self {
            Self::None | Self::Pending { .. } | Self::PendingRing(_) => None,
            Self::Jsonl(j) => Some(j),
            Self::Pcapng(p) => Some(p.as_mut()),
        }
    }
}

/// What a tracing run writes and serves: `--out` and `--metrics-addr`,
/// both ready before anything is attached (bad paths and taken ports fail
/// first).
pub(super) struct Outputs {
    file: Output,
    metrics: Option<Metrics>,
    /// `watch`'s interval reports.
    intervals: Option<Intervals>,
}

impl Outputs {
    /// `interface` labels the metrics.
    pub fn open(trace: &TraceArgs, interface: &str) -> Result<Self> {
        let file = Output::open(trace)?;
        let metrics = match trace.metrics_addr.as_deref() {
            None => None,
            Some(addr) => Some(Metrics::bind(metrics_addr(addr)?, interface)?),
        };
        Ok(Self {
            file,
            metrics,
            intervals: None,
        })
    }

    /// "metrics at http://ADDR/metrics", when served.
    pub fn say_metrics(&self) {
        if let Some(m) = &self.metrics {
            eprintln!("metrics at {}", metrics_url(m));
        }
    }

    pub fn metrics_url(&self) -> Option<String> {
        self.metrics.as_ref().map(metrics_url)
    }

    pub fn with_intervals(self, intervals: Intervals) -> Self {
        Self {
            intervals: Some(intervals),
            ..self
        }
    }

    /// The trace as a ring of pcapng files (instead of `--out`); its
    /// directory made and checked now.
    pub fn with_pcapng_ring(self, ring: PcapngRing) -> Result<Self> {
        KeptFiles::open(&ring.dir, ring.files, pcapng::RING_PREFIX, ".pcapng")?;
        Ok(Self {
            file: Output::PendingRing(ring),
            ..self
        })
    }
}

fn metrics_url(m: &Metrics) -> String {
    format!("http://{}/metrics", m.addr)
}

/// The live view while collecting, when asked for and stdout is a
/// terminal (else the progress lines stand in for it).
struct LiveScreen(Option<(tui::Link, tui::Screen)>);

impl LiveScreen {
    fn open(wanted: bool, tracer: &Tracer, senders: Vec<tui::SenderName>) -> Result<Self> {
        if !wanted || !std::io::stdout().is_terminal() {
            return Ok(Self(None));
        }
        let source = format!(
            "{} (XDP {})",
            traced_on(&tracer.iface, tracer.netns.as_deref()),
            tracer.mode
        );
        Ok(Self(Some(tui::start(source, senders)?)))
    }

    fn link(&mut self) -> Option<&mut tui::Link> {
        self.0.as_mut().map(|(link, _)| link)
    }

    /// After the collection: a finished one stays on screen until `q`; a
    /// stopped or failed one closes at once. The terminal is back after.
    fn close(self, outcome: Result<Outcome>) -> Result<Outcome> {
        let Some((link, screen)) = self.0 else {
            return outcome;
        };
        match &outcome {
            Ok(o) if matches!(o.stop, StopReason::Finished | StopReason::Duration) => link
                .finished(match o.stop {
                    StopReason::Duration => "duration reached".into(),
                    _ => "transfer finished".into(),
                }),
            _ => link.close(),
        }
        screen.wait()?;
        outcome
    }
}

fn header(opts: &TracerOptions, o: &Outcome) -> String {
    let stop = match o.stop {
        StopReason::Duration => "duration reached".to_string(),
        StopReason::Signal(s) => s.to_string(),
        StopReason::Finished => "transfer finished".to_string(),
        StopReason::InterfaceGone => "the interface went away".to_string(),
    };
    format!(
        "tracer: {:.1} s on {} ({stop})",
        o.elapsed.as_secs_f64(),
        traced_on(&opts.iface, opts.netns.as_deref()),
    )
}

/// What the interface did over a run's collections.
fn interface_events(outcome: &Outcome, reattached: u32) -> InterfaceEvents {
    InterfaceEvents {
        went_down: u64::from(outcome.went_down),
        attached_again: u64::from(reattached),
    }
}

/// "IF" or "IF in netns NAME".
pub(super) fn traced_on(iface: &str, netns: Option<&str>) -> String {
    match netns {
        Some(n) => format!("{iface} in netns {n}"),
        None => iface.to_string(),
    }
}
