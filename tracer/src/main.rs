//! `tracer`: the command-line front end. All logic lives in the library.
//!
//! Exit codes: 0 success; 1 runtime failure; 2 bad input or missing
//! prerequisite (nothing was attached); 3 finished, but the kernel lost
//! events (ring buffer full, or tracepoint runs it skipped), so the results
//! are incomplete.

use std::{io::IsTerminal, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{anyhow, Result};
use clap::{Args, Parser, Subcommand};
use tracer::{
    engine::{Engine, EngineConfig},
    filter::Filter,
    jsonl::JsonLines,
    kernel::{Tracer, TracerOptions, XdpModeChoice, DEFAULT_RING_BYTES},
    lab,
    metrics::{self, Metrics},
    output::OutputFile,
    pcapng::{self, PcapngWriter},
    plot::{ColorBy, Plot},
    record::{self, Outcome, RecordOptions, Sink, StopReason},
    report,
    snapshot::Snapshot,
    tui, SetupError,
};
use tracer_common::CAPTURE_MAX;

#[derive(Parser)]
#[command(
    name = "tracer",
    version,
    about = "Tag every received TCP segment with its RX queue and CPU, in the kernel"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Trace TCP segments received on an interface.
    Record(RecordArgs),
    /// The same, watched live: a full-screen view of reordering, late
    /// times, queues and CPUs, flow by flow (a progress line per second
    /// when stdout is not a terminal); the full report on exit.
    Live(RecordArgs),
    /// Analyse a capture file (pcap or pcapng: ours, tcpdump's,
    /// Wireshark's) with the same engine and report as `record`.
    Analyze(AnalyzeArgs),
    /// The sender-policy replay of a capture file alone, with the path
    /// each flow was replayed on (options as `analyze`).
    Replay(AnalyzeArgs),
    /// Reproduce flow-steering reordering on this machine: a kernel-TCP
    /// upload through an emulated flow-director NIC, traced, checked against
    /// the lab's ground truth; everything removed at the end.
    Lab(LabArgs),
    /// Inside a lab's sender guest: set its sysctls, upload, and print what
    /// it did for the lab to read.
    #[command(hide = true)]
    LabSend(LabSendArgs),
}

#[derive(Args)]
struct LabSendArgs {
    #[arg(long)]
    to: std::net::SocketAddr,
    #[arg(long)]
    flows: usize,
    #[arg(long)]
    bytes: u64,
    #[arg(long)]
    seconds: f64,
    /// Stop sending once this file exists.
    #[arg(long)]
    stop_file: PathBuf,
    /// KNOB=VALUE (dotted name), set before sending.
    #[arg(long)]
    sysctl: Vec<String>,
}

#[derive(Args)]
struct TraceArgs {
    /// XDP attachment: native (driver) with generic fallback, or forced.
    #[arg(long, value_enum, default_value_t = XdpModeChoice::Auto)]
    xdp_mode: XdpModeChoice,
    /// Ring buffer size in MiB (a power of two).
    #[arg(long, default_value_t = DEFAULT_RING_BYTES >> 20)]
    ring_mib: u32,
    /// Summary mode, for 10-100 GbE hosts: XDP keeps per-flow state and
    /// emits only segments that arrive below or above the flow's highest
    /// byte, change RX queue or CPU, and one in N of the rest; the TCP
    /// layer only skbs TCP does not take in order, and one in N of the
    /// rest; everything is counted. Reorder counts and ratios, verdicts and
    /// TCP's out-of-order and PAWS counts hold; extents and densities see
    /// the emitted segments only.
    #[arg(long, value_name = "N")]
    summary: Option<u32>,
    /// Full mode even when the collector falls behind: events that find
    /// the ring full are dropped (counted). By default the programs then
    /// act as `--summary 64` until the ring drains, keeping every count.
    #[arg(long, conflicts_with = "summary")]
    never_summarize: bool,
    /// Leave out the TCP-layer view (the tcp_probe tracepoint, which runs
    /// for every TCP segment the host receives): cheaper; no TCP-layer
    /// counts, PAWS or ACK-level replay.
    #[arg(long)]
    no_tcp_layer: bool,
    /// Write the trace to FILE (mode 0600): FILE.pcapng for Wireshark,
    /// tshark and `tracer analyze` (every segment's headers, its RX queue
    /// and CPU, the TCP-layer events, the kernel's counters); FILE.jsonl
    /// for scripts (every observation as a JSON line).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// pcapng: bytes of each frame to keep, when more than its headers
    /// (default: the headers only; no payload leaves the kernel).
    #[arg(long, value_name = "BYTES")]
    snaplen: Option<u32>,
    /// Serve Prometheus/OpenMetrics text at http://ADDR/metrics while
    /// tracing: a port (loopback only) or ADDRESS:PORT. Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<String>,
    /// No progress line every second.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    report: ReportArgs,
}

/// What the engine keeps and the report says (live or from a file).
#[derive(Args)]
struct ReportArgs {
    /// Print the final report as JSON (stdout) instead of text.
    #[arg(long)]
    json: bool,
    /// Flow directions tracked at once (least recently seen evicted).
    #[arg(long, default_value_t = 65_536)]
    max_flows: usize,
    /// The collector's memory budget, MiB. What it keeps of the flows
    /// stays within what the process's baseline (and the ring buffer)
    /// leaves: past it, first the ACK-level replay logs of the flows with
    /// least to replay are given up (replayed from the wire), then the
    /// least recently seen flows (counts kept in the totals); both counted.
    #[arg(long, value_name = "MIB", default_value_t = 512)]
    memory_mib: u64,
    /// RFC 5236 displacement threshold DT (reorder density RD), segments.
    #[arg(long, default_value_t = 64)]
    dt: u32,
    /// RFC 5236 buffer threshold BT (buffer-occupancy density RBD), segments.
    #[arg(long, default_value_t = 64)]
    bt: u32,
    /// Add the sender-policy replay to the text report (experimental; the
    /// JSON report always has it under `replay`).
    #[arg(long)]
    replay: bool,
    /// Replay: the senders' round-trip time in µs (default: the sender's
    /// socket in the lab, else the handshake seen in the trace).
    #[arg(long, value_name = "US")]
    replay_rtt: Option<f64>,
    /// Replay: RACK's min_RTT in µs (default: as --replay-rtt).
    #[arg(long, value_name = "US")]
    min_rtt: Option<f64>,
    /// Replay: how long an ACK takes to reach the sender's TCP, in µs
    /// (default: measured ACK by ACK in the lab, else min_RTT).
    #[arg(long, value_name = "US")]
    ack_delay: Option<f64>,
    /// Replay: the bottleneck in Mbit/s, shared by the flows crossing it
    /// together (default: the traced link's peak over 100 ms).
    #[arg(long, value_name = "MBIT")]
    bandwidth: Option<f64>,
    /// Replay: the bottleneck's queue in bandwidth-delay products (default
    /// 1: a window cut by a loss at a full queue still fills the link).
    #[arg(long, value_name = "BDPS")]
    queue_bdp: Option<f64>,
    /// Replay: the duplicate-ACK threshold of the classic and RACK-TLP
    /// senders, and the adaptive one's start.
    #[arg(long, value_name = "N")]
    dupthresh: Option<u32>,
    /// Replay: RACK-TLP's initial reordering-window multiplier (RFC 8985: 1).
    #[arg(long, value_name = "N")]
    reo_wnd_mult: Option<u32>,
    /// Replay: the classic sender undoes spurious recoveries (timestamps,
    /// DSACK) as Linux does; default: never, as Windows before RACK-TLP.
    #[arg(long)]
    classic_undo: bool,
    /// Replay: transmit times from the sender's TCP timestamps (1 ms
    /// ticks) even where its socket is this host's, as for a remote sender.
    #[arg(long)]
    timestamp_clock: bool,
}

impl ReportArgs {
    /// The engine's share of `--memory-mib`: what this process holds
    /// already (once attached: with the ring buffer, mapped resident) comes
    /// first, and an eighth stays free for the allocator and the outputs.
    fn fit_memory(&self, engine: &mut Engine) -> Result<(), SetupError> {
        let budget = self.memory_mib << 20;
        // (What start-up freed is not the process's to keep.)
        record::give_back_freed();
        let taken = record::resident().0;
        let share = (budget - budget / 8).saturating_sub(taken);
        if share < budget / 4 {
            let need = (taken * 2).div_ceil(1 << 20);
            return Err(SetupError::BadArgument(format!(
                "--memory-mib {}: the process holds {} MiB already (the ring buffer's mapping among it), which leaves the flows too little: give at least {need}",
                self.memory_mib,
                taken >> 20
            )));
        }
        engine.set_memory_budget(share);
        Ok(())
    }

    fn engine(&self) -> Result<Engine, SetupError> {
        if !(64..=1 << 20).contains(&self.memory_mib) {
            return Err(SetupError::BadArgument(format!(
                "--memory-mib {}: give 64 to 1048576",
                self.memory_mib
            )));
        }
        if !(1..=10_000_000).contains(&self.max_flows) {
            return Err(SetupError::BadArgument(format!(
                "--max-flows {}: give 1 to 10000000",
                self.max_flows
            )));
        }
        for (flag, v) in [("--dt", self.dt), ("--bt", self.bt)] {
            if !(1..=4096).contains(&v) {
                return Err(SetupError::BadArgument(format!(
                    "{flag} {v}: give 1 to 4096"
                )));
            }
        }
        let positive = |flag: &str, v: Option<f64>, max: f64| match v {
            Some(x) if !(x > 0.0 && x <= max) => Err(SetupError::BadArgument(format!(
                "{flag} {x}: give a number above 0, at most {max}"
            ))),
            _ => Ok(v),
        };
        let whole = |flag: &str, v: Option<u32>| match v {
            Some(0) | Some(256..) => Err(SetupError::BadArgument(format!(
                "{flag} {}: give 1 to 255",
                v.unwrap()
            ))),
            _ => Ok(v),
        };
        let replay = tracer::replay::ReplayConfig {
            rtt_us: positive("--replay-rtt", self.replay_rtt, 60e6)?,
            min_rtt_us: positive("--min-rtt", self.min_rtt, 60e6)?,
            ack_delay_us: positive("--ack-delay", self.ack_delay, 60e6)?,
            bandwidth_bps: positive("--bandwidth", self.bandwidth, 1e7)?.map(|m| m * 1e6),
            queue_bdp: match self.queue_bdp {
                Some(q) if !(0.0..=100.0).contains(&q) => {
                    return Err(SetupError::BadArgument(format!(
                        "--queue-bdp {q}: give 0 to 100 bandwidth-delay products"
                    )))
                }
                q => q,
            },
            dupthresh: whole("--dupthresh", self.dupthresh)?,
            reo_wnd_mult: whole("--reo-wnd-mult", self.reo_wnd_mult)?,
            classic_undo: self.classic_undo,
            timestamp_clock: self.timestamp_clock,
        };
        Ok(Engine::new(EngineConfig {
            max_flows: self.max_flows,
            dt: self.dt,
            bt: self.bt,
            replay,
            ..EngineConfig::default()
        }))
    }
}

#[derive(Args)]
struct RecordArgs {
    /// Interface to trace (received segments).
    #[arg(long)]
    iface: String,
    /// Network namespace (under /run/netns) the interface lives in.
    #[arg(long)]
    netns: Option<String>,
    /// Flows to trace, e.g. "port 5201", "net 10.0.0.0/24 and port 443".
    #[arg(long, value_name = "EXPR")]
    filter: Option<String>,
    /// Stop after SECS seconds (default: until Ctrl-C).
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    #[command(flatten)]
    trace: TraceArgs,
}

#[derive(Args)]
struct AnalyzeArgs {
    /// The capture (pcap or pcapng; Ethernet, raw IP or Linux cooked).
    file: PathBuf,
    /// Only these flows, e.g. "port 5201", "net 10.0.0.0/24 and port 443"
    /// (as `record --filter`).
    #[arg(long, value_name = "EXPR")]
    flow: Option<String>,
    /// Draw the most reordered flows' time-sequence graphs and the
    /// histograms of extent and late time into OUT.svg.
    #[arg(long, value_name = "OUT.svg")]
    plot: Option<PathBuf>,
    /// What the plot's colours say: the segments' RX queue or CPU.
    #[arg(long, value_enum, default_value_t = ColorBy::Queue)]
    plot_color: ColorBy,
    #[command(flatten)]
    report: ReportArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LabModeArg {
    /// Emulated flow director (ATR): flows re-pointed to other queues/CPUs.
    Atr,
    /// Exact, deterministic reordering with no queue/CPU change.
    Pattern,
    /// Plain forwarding: no reordering.
    Off,
}

#[derive(Args)]
struct LabArgs {
    /// What the edge between client and server does.
    #[arg(long, value_enum, default_value_t = LabModeArg::Atr)]
    mode: LabModeArg,
    /// ATR: table re-points per second per flow (each moves the flow to
    /// another queue and CPU).
    #[arg(long, value_name = "HZ", default_value_t = 50.0)]
    repoints: f64,
    /// A WAN between the senders and the edge: its round trip, 1 to 200
    /// milliseconds (the server's packets held that long on the way back).
    #[arg(long, value_name = "MS")]
    rtt: Option<f64>,
    /// A bottleneck between the senders and the edge: MBIT Mbit/s of
    /// Ethernet frames, 1 to 10000, with a queue of one bandwidth-delay
    /// product (drops counted).
    #[arg(long, value_name = "MBIT")]
    rate: Option<u32>,
    /// ATR: packets each CPU's queue holds (how much can wait on the old
    /// path when a flow moves).
    #[arg(long, value_name = "PACKETS", default_value_t = 256)]
    qsize: u32,
    /// Pattern: swap:N (every Nth data segment swaps with the next) or
    /// hold:N:US (every Nth is held US microseconds).
    #[arg(long, default_value = "swap:50", value_parser = |s: &str| s.parse::<lab::Pattern>())]
    pattern: lab::Pattern,
    /// The senders, each sending --flows flows, side by side: host (this
    /// kernel's TCP, RACK-TLP), newreno (this kernel without SACK), or a
    /// Linux 6.1 guest of its own (user-mode-linux) set up as the replay's
    /// policy: classic (RFC 6675, three duplicate ACKs, no timestamps),
    /// linux-adaptive (RFC 6675, adaptive threshold), rack-tlp.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "host")]
    sender: Vec<lab::Sender>,
    /// The client's TCP sends one segment per skb (gso_max_segs 1), so
    /// every segment has its own transmit time, as RFC 8985 (and the
    /// replay) assume. With GSO, Linux's RACK cannot tell apart segments of
    /// one burst, and tolerates more reordering within it.
    #[arg(long)]
    no_sender_gso: bool,
    /// Watch it in the live view (as `tracer live`), then the report.
    #[arg(long)]
    live: bool,
    /// Pace each host sender's flows to at most MBIT Mbit/s (0: unpaced).
    /// Default: 200 in pattern mode, whose userspace reorderer keeps exact
    /// order only at moderate rates; unpaced otherwise. Guest senders are
    /// never paced (their kernel's pacing timer can stall a flow).
    #[arg(long, value_name = "MBIT")]
    pace: Option<f64>,
    /// Write the ground truth (every segment leaving the edge: its queue,
    /// CPU and arrival order; every table change) as JSON lines to FILE.
    #[arg(long, value_name = "FILE")]
    truth: Option<PathBuf>,
    /// Parallel TCP connections of each sender.
    #[arg(long, default_value_t = 4)]
    flows: usize,
    /// Bytes per connection (suffixes k, M, G). Default 128M; with
    /// --until-late, 4G (a bound, rarely reached).
    #[arg(long, value_parser = parse_size)]
    bytes: Option<u64>,
    /// Upper bound on the transfer, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 8.0)]
    duration: f64,
    /// Go on until the edge has made N late segments in every flow (atr
    /// and pattern modes), then end the upload (every byte sent still
    /// received); --bytes and --duration bound it. The report says whether
    /// it got there.
    #[arg(long, value_name = "N")]
    until_late: Option<u64>,
    /// The receiver sends no DSACKs: no sender can undo a recovery from
    /// them, and the classic guest (no timestamps) undoes none, as the
    /// seed's senders did not.
    #[arg(long)]
    no_dsack: bool,
    /// Use IPv6 instead of IPv4.
    #[arg(long)]
    ipv6: bool,
    /// RX queues of the server's interface (TX queues of the edge's).
    #[arg(long, default_value_t = 4)]
    queues: u32,
    #[command(flatten)]
    trace: TraceArgs,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("'{s}' is not a size like 64M"))
}

fn seconds(flag: &str, secs: f64) -> Result<Duration, SetupError> {
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(SetupError::BadArgument(format!(
            "{flag} {secs}: give a number of seconds between 0 and 86400"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn summary(trace: &TraceArgs) -> Result<u32, SetupError> {
    match trace.summary {
        None => Ok(0),
        Some(n @ 1..=1_000_000) => Ok(n),
        Some(n) => Err(SetupError::BadArgument(format!(
            "--summary {n}: give the sample, 1 (every segment the flow state keeps) to 1000000"
        ))),
    }
}

fn overload_sample(trace: &TraceArgs) -> u32 {
    if trace.never_summarize {
        0
    } else {
        tracer::kernel::DEFAULT_OVERLOAD_SAMPLE
    }
}

fn ring_bytes(mib: u32) -> Result<u32, SetupError> {
    match mib.checked_mul(1 << 20) {
        Some(b) if mib.is_power_of_two() => Ok(b),
        _ => Err(SetupError::BadArgument(format!(
            "--ring-mib {mib}: give a power of two from 1 to 2048"
        ))),
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let result = match Cli::parse().command {
        Command::Record(args) => record_cmd(args, false),
        Command::Live(args) => record_cmd(args, true),
        Command::Lab(args) => lab_cmd(args),
        Command::LabSend(a) => lab::guest::send(&lab::guest::SendOrder {
            to: a.to,
            flows: a.flows,
            bytes: a.bytes,
            timeout: Duration::from_secs_f64(a.seconds),
            stop_file: a.stop_file,
            sysctls: a.sysctl,
        })
        .map(|()| ExitCode::SUCCESS),
        Command::Analyze(args) => analyze_cmd(args, false),
        Command::Replay(args) => analyze_cmd(args, true),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let setup = e.chain().any(|c| c.downcast_ref::<SetupError>().is_some());
            // One line: the outermost context and its causes.
            eprintln!("tracer: {}", format!("{e:#}").replace('\n', " "));
            if setup {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// `--out`: the trace file, by its extension. Opened before anything is
/// attached; written from when the tracer is.
enum Output {
    None,
    Pending { file: OutputFile, pcapng: bool },
    Jsonl(JsonLines),
    Pcapng(PcapngWriter),
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
            _ => 0,
        }
    }

    /// Once attached: the file is emptied and the writer starts (pcapng:
    /// its headers, naming the traced interface).
    fn begin(&mut self, tracer: &Tracer, trace: &TraceArgs) -> Result<()> {
        let (file, pcapng) = match std::mem::replace(self, Self::None) {
            Self::Pending { file, pcapng } => (file, pcapng),
            other => {
                *self = other;
                return Ok(());
            }
        };
        let path = file.path().to_path_buf();
        let started = file.start().map_err(|e| SetupError::BadOutput {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        if !pcapng {
            *self = Self::Jsonl(JsonLines::new(&path, started));
            return Ok(());
        }
        let keeps = match trace.snaplen {
            Some(n) => format!("the first {n} bytes of each frame (at least its headers)"),
            None => "headers only".into(),
        };
        let iface = pcapng::Interface {
            name: &tracer.iface,
            description: &format!(
                "{}, XDP {}, {keeps}",
                traced_on(&tracer.iface, tracer.netns.as_deref()),
                tracer.mode
            ),
            ifindex: tracer.ifindex,
            kernel: &tracer.kernel.report(),
        };
        *self = Self::Pcapng(PcapngWriter::create(&path, started, &iface)?);
        Ok(())
    }

    fn sink(&mut self) -> Option<&mut dyn Sink> {
        match self {
            Self::None | Self::Pending { .. } => None,
            Self::Jsonl(j) => Some(j),
            Self::Pcapng(p) => Some(p),
        }
    }
}

/// What a tracing run writes and serves: `--out` and `--metrics-addr`,
/// both ready before anything is attached (bad paths and taken ports fail
/// first).
struct Outputs {
    file: Output,
    metrics: Option<Metrics>,
}

impl Outputs {
    fn open(trace: &TraceArgs) -> Result<Self> {
        let file = Output::open(trace)?;
        let metrics = match trace.metrics_addr.as_deref() {
            None => None,
            Some(addr) => {
                let m = Metrics::serve(metrics::parse_addr(addr)?)?;
                eprintln!("metrics at http://{}/metrics", m.addr);
                Some(m)
            }
        };
        Ok(Self { file, metrics })
    }
}

fn record_cmd(args: RecordArgs, live: bool) -> Result<ExitCode> {
    let filter = Filter::parse(args.filter.as_deref().unwrap_or(""))?;
    let duration = args
        .duration
        .map(|d| seconds("--duration", d))
        .transpose()?;
    let opts = TracerOptions {
        iface: args.iface,
        netns: args.netns,
        xdp_mode: args.trace.xdp_mode,
        filter,
        ring_bytes: ring_bytes(args.trace.ring_mib)?,
        xdp: true,
        tcp_layer: !args.trace.no_tcp_layer,
        summary_sample: summary(&args.trace)?,
        overload_sample: overload_sample(&args.trace),
        snaplen: 0,
    };
    let mut engine = args.trace.report.engine()?;
    tracer::require_root()?;
    let mut out = Outputs::open(&args.trace)?;
    let opts = TracerOptions {
        snaplen: out.file.snaplen(&args.trace),
        ..opts
    };
    let mut tracer = Tracer::attach(&opts)?;
    args.trace.report.fit_memory(&mut engine)?;
    out.file.begin(&tracer, &args.trace)?;
    eprintln!(
        "tracing TCP received on {} (XDP {}); Ctrl-C to stop",
        traced_on(&tracer.iface, tracer.netns.as_deref()),
        tracer.mode
    );
    say_missing(&tracer);
    let mut screen = LiveScreen::open(live, &tracer, Vec::new())?;
    let outcome = collect(
        &mut tracer,
        &mut engine,
        &mut out,
        || false,
        duration,
        !args.trace.quiet,
        screen.link(),
    );
    let linux = tracer.kernel.report();
    drop(tracer);
    let outcome = screen.close(outcome)?;
    print_report(
        &engine
            .snapshot()
            .with_kernel(&outcome.counters)
            .with_linux(Some(linux))
            .with_resident(outcome.peak_resident_bytes),
        &outcome,
        &header(&opts, &outcome),
        &args.trace.report,
        None,
    );
    finish(&outcome, &out.file, args.trace.report.json)
}

fn collect(
    tracer: &mut Tracer,
    engine: &mut Engine,
    out: &mut Outputs,
    until: impl FnMut() -> bool,
    duration: Option<Duration>,
    progress: bool,
    live: Option<&mut tui::Link>,
) -> Result<Outcome> {
    let mut sinks: Vec<&mut dyn Sink> = out.file.sink().into_iter().collect();
    record::run(
        tracer,
        engine,
        &mut sinks,
        until,
        RecordOptions {
            duration,
            // The screen shows what the progress line would.
            progress: progress && live.is_none(),
            live,
            metrics: out.metrics.as_ref(),
        },
    )
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

/// The final report, text or JSON; `extra` is added to the JSON's top level.
fn print_report(
    snapshot: &Snapshot,
    outcome: &Outcome,
    header: &str,
    trace: &ReportArgs,
    extra: Option<(&str, serde_json::Value)>,
) {
    let (json, show_replay) = (trace.json, trace.replay);
    if json {
        let mut v = serde_json::to_value(snapshot).expect("snapshot serialises");
        if let Some((key, value)) = extra {
            v[key] = value;
        }
        println!("{}", serde_json::to_string_pretty(&v).expect("JSON"));
    } else {
        print!(
            "{}",
            report::text(
                snapshot,
                Some(&outcome.counters),
                None,
                outcome.elapsed,
                header,
                report::TextOptions {
                    replay: show_replay,
                },
            )
        );
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

/// What the running kernel lacks, one line each, as the run starts.
fn say_missing(tracer: &Tracer) {
    for m in tracer.kernel.missing() {
        eprintln!("tracer: Linux {}: {m}", tracer.kernel.release);
    }
}

/// "IF" or "IF in netns NAME".
fn traced_on(iface: &str, netns: Option<&str>) -> String {
    match netns {
        Some(n) => format!("{iface} in netns {n}"),
        None => iface.to_string(),
    }
}

/// Final lines shared by every command (stderr when stdout is JSON), and
/// the exit code.
fn finish(outcome: &Outcome, out: &Output, json: bool) -> Result<ExitCode> {
    let say = |line: String| {
        if json {
            eprintln!("{}", line.trim_start());
        } else {
            println!("{line}");
        }
    };
    if outcome.decode_errors > 0 || outcome.missing() > 0 {
        say(format!(
            "  WARNING    {} records did not decode, {} emitted records were not read",
            outcome.decode_errors,
            outcome.missing()
        ));
    }
    match out {
        Output::None | Output::Pending { .. } => {}
        Output::Jsonl(j) => say(format!(
            "  wrote      {} observations (JSON lines)",
            j.written()
        )),
        Output::Pcapng(p) => {
            let (packets, records) = p.written();
            say(format!(
                "  wrote      {} ({packets} packets, {records} TCP-layer records; pcapng)",
                p.path().display()
            ));
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

/// `analyze`, or with `replay_only` the `replay` command.
fn analyze_cmd(args: AnalyzeArgs, replay_only: bool) -> Result<ExitCode> {
    use tracer::source::{capture, Flow, Observation};
    let mut engine = args.report.engine()?;
    args.report.fit_memory(&mut engine)?;
    let filter = Filter::parse(args.flow.as_deref().unwrap_or(""))
        .map_err(|e| SetupError::BadArgument(e.to_string().replacen("--filter", "--flow", 1)))?;
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
    // Writable before the work, not after.
    let plot_file = args.plot.as_deref().map(OutputFile::open).transpose()?;
    let mut plot = args.plot.as_ref().map(|_| Plot::default());
    let mut observations = capture::Observations::new(reader, |f: &Flow| {
        filter.matches((f.src.ip(), f.src.port()), (f.dst.ip(), f.dst.port()))
    });
    let mut n = 0u64;
    while let Some(obs) = observations.next() {
        if let (Some(b), true) = (&bar, n.is_multiple_of(65_536)) {
            b.set_position(observations.offset());
        }
        n += 1;
        if let (Some(c), Some(p), Observation::Segment(s)) = (engine.observe(&obs), &mut plot, &obs)
        {
            p.segment(s, c.class, c.queue_migration);
        }
    }
    let summary = observations.summary();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    // Our own traces carry the kernel's counters: the report is record's.
    let snapshot = match &summary.kernel {
        Some(k) => engine
            .snapshot()
            .with_kernel(k)
            .with_linux(summary.linux.clone()),
        None => engine.snapshot(),
    };
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
        println!("{}", report::json(&snapshot));
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

fn lab_cmd(args: LabArgs) -> Result<ExitCode> {
    let timeout = seconds("--duration", args.duration)?;
    if args.flows == 0 || args.flows > 256 {
        return Err(SetupError::BadArgument(format!(
            "--flows {}: give 1 to 256 connections",
            args.flows
        ))
        .into());
    }
    if !(1..=64).contains(&args.queues) {
        return Err(
            SetupError::BadArgument(format!("--queues {}: give 1 to 64", args.queues)).into(),
        );
    }
    let mode = match args.mode {
        LabModeArg::Atr => {
            if !(args.repoints > 0.0 && args.repoints <= 10_000.0) {
                return Err(SetupError::BadArgument(format!(
                    "--repoints {}: give 0 to 10000 re-points per second",
                    args.repoints
                ))
                .into());
            }
            if !(8..=16_384).contains(&args.qsize) {
                return Err(SetupError::BadArgument(format!(
                    "--qsize {}: give 8 to 16384 packets",
                    args.qsize
                ))
                .into());
            }
            lab::Mode::Atr {
                rate: args.repoints,
                qsize: args.qsize,
            }
        }
        LabModeArg::Pattern => lab::Mode::Pattern {
            pattern: args.pattern,
        },
        LabModeArg::Off => lab::Mode::Off,
    };
    if let Some(n) = args.until_late {
        if mode == lab::Mode::Off || n == 0 {
            return Err(SetupError::BadArgument(format!(
                "--until-late {n}: give N >= 1 with --mode atr or pattern (off makes nothing late)"
            ))
            .into());
        }
    }
    if let Some(rtt) = args.rtt.filter(|r| !(1.0..=200.0).contains(r)) {
        return Err(SetupError::BadArgument(format!(
            "--rtt {rtt}: give a round trip of 1 to 200 milliseconds"
        ))
        .into());
    }
    if let Some(rate) = args.rate.filter(|r| !(1..=10_000).contains(r)) {
        return Err(SetupError::BadArgument(format!(
            "--rate {rate}: give a bottleneck of 1 to 10000 Mbit/s"
        ))
        .into());
    }
    let wan = lab::WanSpec {
        rtt_ms: args.rtt,
        rate_mbit: args.rate,
    };
    let bytes = args.bytes.unwrap_or(if args.until_late.is_some() {
        4 << 30
    } else {
        128 << 20
    });
    let pace = args.pace.unwrap_or(match mode {
        lab::Mode::Pattern { .. } => 200.0,
        _ => 0.0,
    });
    if !(0.0..=1_000_000.0).contains(&pace) {
        return Err(SetupError::BadArgument(format!(
            "--pace {pace}: give 0 (unpaced) to 1000000 Mbit/s"
        ))
        .into());
    }
    let host_senders = args.sender.iter().any(|s| !s.in_guest());
    if args.pace.is_some_and(|p| p > 0.0) && !host_senders {
        return Err(SetupError::BadArgument(format!(
            "--pace {pace}: guest senders are never paced (their kernel's pacing timer can stall a flow); add a host sender (--sender host) or leave --pace out"
        ))
        .into());
    }
    let mut engine = args.trace.report.engine()?;
    tracer::require_root()?;
    let mut out = Outputs::open(&args.trace)?;
    let spec = lab::LabSpec {
        mode,
        senders: args.sender.iter().fold(Vec::new(), |mut v, &s| {
            if !v.contains(&s) {
                v.push(s);
            }
            v
        }),
        queues: args.queues,
        flows: args.flows,
        bytes_per_flow: bytes,
        ipv6: args.ipv6,
        timeout,
        pacing: (pace > 0.0).then(|| (pace * 1e6 / 8.0) as u64),
        sender_gso: !args.no_sender_gso,
        truth_out: args.truth.clone(),
        until_late: args.until_late,
        receiver_dsack: !args.no_dsack,
        wan,
    };
    let mut lab = lab::Lab::create(&spec)?;
    let opts = TracerOptions {
        iface: lab::SERVER_IF.to_string(),
        netns: Some(lab.topo.server_ns.clone()),
        xdp_mode: args.trace.xdp_mode,
        filter: Filter::default(),
        ring_bytes: ring_bytes(args.trace.ring_mib)?,
        xdp: true,
        tcp_layer: !args.trace.no_tcp_layer,
        summary_sample: summary(&args.trace)?,
        overload_sample: overload_sample(&args.trace),
        snaplen: out.file.snaplen(&args.trace),
    };
    let mut tracer = Tracer::attach(&opts)?;
    args.trace.report.fit_memory(&mut engine)?;
    out.file.begin(&tracer, &args.trace)?;
    eprintln!(
        "lab: {} x {}{:.0} MB upload from each of {} over {}{} through {wan} and an edge in mode {mode}; {} queues; traced on the server with XDP {}",
        args.flows,
        match args.until_late {
            Some(n) => format!("(until {n} late segments each) at most "),
            None => String::new(),
        },
        bytes as f64 / 1e6,
        spec.senders
            .iter()
            .map(|s| format!("{s}{}", if s.in_guest() { " (Linux 6.1 guest)" } else { " (this kernel)" }))
            .collect::<Vec<_>>()
            .join(", "),
        if args.ipv6 { "IPv6" } else { "IPv4" },
        if pace > 0.0 && host_senders {
            format!(", host flows paced to {pace} Mbit/s each")
        } else {
            String::new()
        },
        lab.topo.queues,
        tracer.mode
    );
    say_missing(&tracer);
    let mut screen = LiveScreen::open(args.live, &tracer, spec.sender_addresses())?;
    lab.start_upload()?;
    let outcome = collect(
        &mut tracer,
        &mut engine,
        &mut out,
        || lab.finished(),
        Some(timeout + Duration::from_secs(1)),
        !args.trace.quiet,
        screen.link(),
    );
    let lab_outcome = lab.finish();
    let linux = tracer.kernel.report();
    drop(tracer);
    drop(lab);
    // (Everything the lab made is gone while the view waits for `q`.)
    let outcome = screen.close(outcome)?;
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
            engine.set_sender_rtt(
                &r.flow,
                u64::from(srtt) * 1000,
                u64::from(r.min_rtt_us) * 1000,
            );
            let probe = &l.sender_acks;
            engine.set_sender_socket(
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
    let snapshot = engine
        .snapshot()
        .with_kernel(&outcome.counters)
        .with_linux(Some(linux))
        .with_resident(outcome.peak_resident_bytes)
        .name_senders(&spec.sender_addresses());
    print_report(
        &snapshot,
        &outcome,
        &header(&opts, &outcome),
        &args.trace.report,
        value,
    );
    let lab_outcome = lab_outcome?;
    if !args.trace.report.json {
        let opts = report::TextOptions {
            replay: args.trace.report.replay,
        };
        print!("{}", lab::report::text(&snapshot, &lab_outcome, opts));
    }
    finish(&outcome, &out.file, args.trace.report.json)
}

#[cfg(test)]
mod tests {
    /// Every subcommand's flags are unique (clap checks it only when a
    /// debug build parses that subcommand).
    #[test]
    fn the_command_line_is_consistent() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
