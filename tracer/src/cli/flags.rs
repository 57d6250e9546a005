//! The command line: clap's argument structs and their validation into
//! the library's options (raw flags -> validated options). Errors here name
//! the flag; the library's name what was wrong.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::{
    engine::{Engine, EngineConfig},
    filter::Filter,
    kernel::{RingLayout, TracerOptions, XdpModeChoice, DEFAULT_RING_BYTES},
    lab,
    nic::rss::Rss,
    plot::ColorBy,
    record,
    replay::ClassicUndo,
    SetupError,
};
use tracer_common::CAPTURE_MAX;

#[derive(Parser)]
#[command(
    name = "tracer",
    version,
    about = "Tag every received TCP segment with its RX queue and CPU, in the kernel"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Trace TCP segments received on an interface.
    Record(RecordArgs),
    /// Trace an interface as a service, without end: summary mode, metrics
    /// on loopback, a JSON report of every interval to a directory (the
    /// latest kept), flows expired when idle, the interface followed when
    /// it goes and comes back. SIGHUP reopens the outputs; SIGTERM writes
    /// the last interval and detaches.
    Watch(WatchArgs),
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
    /// Whether a lab's guest sender (user-mode-linux) can run on this
    /// host: exit 0, or 2 with why not in one line (`cargo xtask
    /// build-and-run` asks before its demo).
    #[command(hide = true)]
    GuestCheck,
    /// Write the man pages and shell completions a package ships into
    /// DIR (`cargo xtask dist`).
    #[command(hide = true)]
    PackageFiles { dir: PathBuf },
}

#[derive(Args)]
pub struct LabSendArgs {
    #[arg(long)]
    pub(crate) to: std::net::SocketAddr,
    #[arg(long)]
    pub(crate) flows: usize,
    #[arg(long)]
    pub(crate) bytes: u64,
    #[arg(long)]
    pub(crate) seconds: f64,
    /// Stop sending once this file exists.
    #[arg(long)]
    pub(crate) stop_file: PathBuf,
    /// KNOB=VALUE (dotted name), set before sending.
    #[arg(long)]
    pub(crate) sysctl: Vec<String>,
}

#[derive(Args)]
pub struct TraceArgs {
    /// XDP attachment: native (driver) with generic fallback, generic on a
    /// veth whose peer has TSO (native would take it), or forced.
    #[arg(long, value_enum, default_value_t = XdpModeChoice::Auto)]
    pub(crate) xdp_mode: XdpModeChoice,
    /// Ring buffer size in MiB (a power of two), shared among the CPUs'
    /// rings.
    #[arg(long, default_value_t = DEFAULT_RING_BYTES >> 20)]
    pub(crate) ring_mib: u32,
    /// A ring buffer per CPU, merged back into time order (no CPU waits on
    /// another's), or one for every CPU, read in its own order.
    #[arg(long, value_enum, default_value_t = RingLayout::default())]
    pub(crate) rings: RingLayout,
    /// Summary mode, for 10-100 GbE hosts: XDP keeps per-flow state and
    /// emits only segments that arrive below or above the flow's highest
    /// byte, change RX queue or CPU, and one in N of the rest; the TCP
    /// layer only skbs TCP does not take in order, and one in N of the
    /// rest; everything is counted. Reorder counts and ratios, verdicts and
    /// TCP's out-of-order and PAWS counts hold; extents and densities see
    /// the emitted segments only.
    #[arg(long, value_name = "N")]
    pub(crate) summary: Option<u32>,
    /// Full mode even when the collector falls behind: events that find
    /// the ring full are dropped (counted). By default the programs then
    /// act as `--summary 64` until the ring drains, keeping every count.
    #[arg(long, conflicts_with = "summary")]
    pub(crate) never_summarize: bool,
    /// Leave out the TCP-layer view (the tcp_probe tracepoint, which runs
    /// for every TCP segment the host receives): cheaper; no TCP-layer
    /// counts, PAWS or ACK-level replay.
    #[arg(long)]
    pub(crate) no_tcp_layer: bool,
    /// Write the trace to FILE (mode 0600): FILE.pcapng for Wireshark,
    /// tshark and `tracer analyze` (every segment's headers, its RX queue
    /// and CPU, the TCP-layer events, the kernel's counters); FILE.jsonl
    /// for scripts (every observation as a JSON line).
    #[arg(long, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
    /// pcapng: bytes of each frame to keep, when more than its headers
    /// (default: the headers only; no payload leaves the kernel).
    #[arg(long, value_name = "BYTES")]
    pub(crate) snaplen: Option<u32>,
    /// Serve Prometheus/OpenMetrics text at http://ADDR/metrics while
    /// tracing: a port (loopback only) or ADDRESS:PORT. Off by default.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_addr: Option<String>,
    /// No progress line every second.
    #[arg(long)]
    pub(crate) quiet: bool,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}

/// The longest `--idle-expiry`: 30 days.
const MAX_IDLE_EXPIRY_S: u64 = 30 * 24 * 3600;

/// What the engine keeps and the report says (live or from a file).
#[derive(Args)]
pub struct ReportArgs {
    /// Print the final report as JSON (stdout) instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Flow directions tracked at once (least recently seen evicted).
    #[arg(long, default_value_t = 65_536)]
    pub(crate) max_flows: usize,
    /// Retire flows unseen for this many seconds (their counts stay in the
    /// totals), so that what is tracked follows the live flows: for long
    /// runs over many connections. Default: flows stay until the memory
    /// budget or --max-flows needs their room.
    #[arg(long, value_name = "SECS")]
    pub(crate) idle_expiry: Option<u64>,
    /// The collector's memory budget, MiB. What it keeps of the flows
    /// stays within what the process's baseline (and the ring buffer)
    /// leaves: past it, first the ACK-level replay logs of the flows with
    /// least to replay are given up (replayed from the wire), then the
    /// least recently seen flows (counts kept in the totals); both counted.
    #[arg(long, value_name = "MIB", default_value_t = 512)]
    pub(crate) memory_mib: u64,
    /// RFC 5236 displacement threshold DT (reorder density RD), segments.
    #[arg(long, default_value_t = 64)]
    pub(crate) dt: u32,
    /// RFC 5236 buffer threshold BT (buffer-occupancy density RBD), segments.
    #[arg(long, default_value_t = 64)]
    pub(crate) bt: u32,
    /// Add the sender-policy replay to the text report (experimental; the
    /// JSON report always has it under `replay`).
    #[arg(long)]
    pub(crate) replay: bool,
    /// Replay: the senders' round-trip time in µs (default: the sender's
    /// socket in the lab, else the handshake seen in the trace).
    #[arg(long, value_name = "US")]
    pub(crate) replay_rtt: Option<f64>,
    /// Replay: RACK's min_RTT in µs (default: as --replay-rtt).
    #[arg(long, value_name = "US")]
    pub(crate) min_rtt: Option<f64>,
    /// Replay: how long an ACK takes to reach the sender's TCP, in µs
    /// (default: measured ACK by ACK in the lab, else min_RTT).
    #[arg(long, value_name = "US")]
    pub(crate) ack_delay: Option<f64>,
    /// Replay: the bottleneck in Mbit/s, shared by the flows crossing it
    /// together (default: the traced link's peak over 100 ms).
    #[arg(long, value_name = "MBIT")]
    pub(crate) bandwidth: Option<f64>,
    /// Replay: the bottleneck's queue in bandwidth-delay products (default
    /// 1: a window cut by a loss at a full queue still fills the link).
    #[arg(long, value_name = "BDPS")]
    pub(crate) queue_bdp: Option<f64>,
    /// Replay: the duplicate-ACK threshold of the classic and RACK-TLP
    /// senders, and the adaptive one's start.
    #[arg(long, value_name = "N")]
    pub(crate) dupthresh: Option<u32>,
    /// Replay: RACK-TLP's initial reordering-window multiplier (RFC 8985: 1).
    #[arg(long, value_name = "N")]
    pub(crate) reo_wnd_mult: Option<u32>,
    /// Replay: when the classic sender undoes a recovery: `dsack`, once
    /// the receiver's DSACKs prove it spurious, as Linux's RFC 6675
    /// recovery does (the lab's classic guest); `never`, as a sender
    /// without DSACK undo (Windows before RACK-TLP).
    #[arg(
        long,
        value_enum,
        value_name = "WHEN",
        default_value_t = ClassicUndo::Dsack,
        num_args = 0..=1,
        default_missing_value = "dsack"
    )]
    pub(crate) classic_undo: ClassicUndo,
    /// Replay: whether the receiver sent DSACKs, by which senders undo
    /// spurious recoveries (default: what this host's net.ipv4.tcp_dsack
    /// says, for a live trace; else on, Linux's default).
    #[arg(long, value_name = "on|off", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) receiver_dsack: Option<bool>,
    /// Replay: transmit times from the sender's TCP timestamps (1 ms
    /// ticks) even where its socket is this host's, as for a remote sender.
    #[arg(long)]
    pub(crate) timestamp_clock: bool,
    /// The NIC's RSS hash key, for a NIC that does not report it: hex
    /// bytes separated by colons, as `ethtool -x IF` prints it. With
    /// --rss-indir, each flow's segments are checked against the queue RSS
    /// picks: those elsewhere were steered by something else.
    #[arg(long, value_name = "HEX", requires = "rss_indir")]
    pub(crate) rss_key: Option<String>,
    /// The NIC's RSS indirection table: its queues in order, separated by
    /// commas (`ethtool -x IF` lists them).
    #[arg(long, value_name = "QUEUES", requires = "rss_key")]
    pub(crate) rss_indir: Option<String>,
}

impl ReportArgs {
    /// The engine's share of `--memory-mib`: what this process holds
    /// already (once attached: with the ring buffer, mapped resident) comes
    /// first, and an eighth stays free for the allocator and the outputs.
    pub(crate) fn fit_memory(&self, engine: &mut Engine) -> Result<(), SetupError> {
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

    pub(crate) fn engine(&self) -> Result<Engine, SetupError> {
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
        let replay = crate::replay::ReplayConfig {
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
            receiver_dsack: self
                .receiver_dsack
                .map(|d| (d, crate::replay::Source::Given)),
            timestamp_clock: self.timestamp_clock,
        };
        if self
            .idle_expiry
            .is_some_and(|s| !(1..=MAX_IDLE_EXPIRY_S).contains(&s))
        {
            return Err(SetupError::BadArgument(format!(
                "--idle-expiry {}: give 1 to {MAX_IDLE_EXPIRY_S} seconds",
                self.idle_expiry.unwrap()
            )));
        }
        let mut engine = Engine::new(EngineConfig {
            max_flows: self.max_flows,
            idle_expiry_ns: self.idle_expiry.map(|s| s * 1_000_000_000),
            dt: self.dt,
            bt: self.bt,
            replay,
            ..EngineConfig::default()
        });
        if let Some(rss) = self.rss()? {
            engine.set_rss(rss);
        }
        Ok(engine)
    }

    /// `--rss-key` with `--rss-indir`.
    pub(crate) fn rss(&self) -> Result<Option<Rss>, SetupError> {
        let (Some(key), Some(indir)) = (&self.rss_key, &self.rss_indir) else {
            return Ok(None);
        };
        Rss::parse(key, indir)
            .map(Some)
            .map_err(|e| SetupError::BadArgument(format!("bad --rss-key/--rss-indir: {e}")))
    }
}

/// What `record`, `live` and `watch` trace.
#[derive(Args)]
pub struct TargetArgs {
    /// Interface to trace (received segments).
    #[arg(long)]
    pub(crate) iface: String,
    /// Network namespace (under /run/netns) the interface lives in.
    #[arg(long)]
    pub(crate) netns: Option<String>,
    /// Flows to trace, e.g. "port 5201", "net 10.0.0.0/24 and port 443".
    #[arg(long, value_name = "EXPR")]
    pub(crate) filter: Option<String>,
}

impl TargetArgs {
    /// What to attach, with `trace`'s flags.
    pub(crate) fn tracer_options(&self, trace: &TraceArgs) -> Result<TracerOptions, SetupError> {
        let filter = filter("--filter", self.filter.as_deref())?;
        trace.tracer_options(self.iface.clone(), self.netns.clone(), filter)
    }
}

#[derive(Args)]
pub struct RecordArgs {
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    /// Stop after SECS seconds (default: until Ctrl-C).
    #[arg(long, value_name = "SECS")]
    pub(crate) duration: Option<f64>,
    /// When the interface goes away (deleted, or its namespace), wait for
    /// one of its name to come back and attach to it again (logged, and
    /// counted in the report), instead of ending there.
    #[arg(long)]
    pub(crate) reattach: bool,
    #[command(flatten)]
    pub(crate) trace: TraceArgs,
}

/// `watch`'s default metrics address (loopback only).
pub const WATCH_METRICS_ADDR: &str = "127.0.0.1:9479";
/// `watch`'s default idle expiry, seconds.
pub const WATCH_IDLE_EXPIRY_S: u64 = 300;
/// `watch`'s default summary sampling (one in N of the uneventful segments).
pub const WATCH_SUMMARY: u32 = 64;

#[derive(Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    /// Seconds each interval report covers.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub(crate) interval: u64,
    /// Where the interval reports go (made if missing, mode 0750).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/tracer/intervals")]
    pub(crate) reports: PathBuf,
    /// Interval reports kept in --reports (the oldest removed first): a
    /// day of 60-second intervals by default.
    #[arg(long, value_name = "N", default_value_t = 1440)]
    pub(crate) keep: usize,
    /// Full mode (every segment to the collector) instead of summary mode.
    #[arg(long, conflicts_with = "summary")]
    pub(crate) full: bool,
    /// End when the interface goes away, instead of waiting for it to
    /// come back and attaching again; then no capability is kept once
    /// attached.
    #[arg(long)]
    pub(crate) no_reattach: bool,
    /// Once attached, run as this user (and its group; --reports and
    /// --pcapng are given to it), keeping only the capabilities
    /// re-attaching needs.
    #[arg(long, value_name = "NAME")]
    pub(crate) user: Option<String>,
    /// Keep the trace as a pcapng ring in DIR (made if missing, mode
    /// 0750), as `tcpdump -C -W` does: files of at most --pcapng-mib
    /// each, the latest --pcapng-files kept, each one whole for Wireshark
    /// and `tracer analyze`. A new file begins on SIGHUP and when the
    /// interface comes back.
    #[arg(long, value_name = "DIR")]
    pub(crate) pcapng: Option<PathBuf>,
    /// The most each --pcapng file holds, in MiB.
    #[arg(
        short = 'C',
        long,
        value_name = "MIB",
        default_value_t = 100,
        requires = "pcapng"
    )]
    pub(crate) pcapng_mib: u64,
    /// --pcapng files kept (the oldest removed first).
    #[arg(
        short = 'W',
        long,
        value_name = "N",
        default_value_t = 10,
        requires = "pcapng"
    )]
    pub(crate) pcapng_files: usize,
    #[command(flatten)]
    pub(crate) trace: TraceArgs,
}

impl WatchArgs {
    /// The flags with `watch`'s defaults filled in where not given:
    /// summary mode, metrics on loopback, the idle expiry; and those it
    /// has no use for refused.
    pub(crate) fn with_defaults(mut self) -> Result<Self, SetupError> {
        if !(1..=86_400).contains(&self.interval) {
            return Err(SetupError::BadArgument(format!(
                "--interval {}: give 1 to 86400 seconds",
                self.interval
            )));
        }
        if !(1..=1_000_000).contains(&self.keep) {
            return Err(SetupError::BadArgument(format!(
                "--keep {}: give 1 to 1000000 files",
                self.keep
            )));
        }
        if self.trace.out.is_some() {
            return Err(SetupError::BadArgument(
                "--out: watch keeps no single trace file (it would grow without end): keep a ring of them with --pcapng DIR".into(),
            ));
        }
        match self.trace.snaplen {
            Some(_) if self.pcapng.is_none() => {
                return Err(SetupError::BadArgument(
                    "--snaplen applies to the trace: add --pcapng DIR".into(),
                ))
            }
            Some(n) if !(1..=CAPTURE_MAX as u32).contains(&n) => {
                return Err(SetupError::BadArgument(format!(
                    "--snaplen {n}: give 1 to {CAPTURE_MAX} bytes"
                )))
            }
            _ => {}
        }
        if !(1..=1 << 20).contains(&self.pcapng_mib) {
            return Err(SetupError::BadArgument(format!(
                "--pcapng-mib {}: give 1 to 1048576 MiB",
                self.pcapng_mib
            )));
        }
        if !(1..=1_000_000).contains(&self.pcapng_files) {
            return Err(SetupError::BadArgument(format!(
                "--pcapng-files {}: give 1 to 1000000 files",
                self.pcapng_files
            )));
        }
        if self.trace.report.json {
            return Err(SetupError::BadArgument(
                "--json: watch writes its reports as JSON to --reports, one per interval".into(),
            ));
        }
        let t = &mut self.trace;
        if t.summary.is_none() && !self.full && !t.never_summarize {
            t.summary = Some(WATCH_SUMMARY);
        }
        t.metrics_addr
            .get_or_insert_with(|| WATCH_METRICS_ADDR.into());
        t.report.idle_expiry.get_or_insert(WATCH_IDLE_EXPIRY_S);
        // An interval line instead of a line every second.
        t.quiet = true;
        Ok(self)
    }
}

#[derive(Args)]
pub struct AnalyzeArgs {
    /// The capture (pcap or pcapng; Ethernet, raw IP or Linux cooked).
    pub(crate) file: PathBuf,
    /// Only these flows, e.g. "port 5201", "net 10.0.0.0/24 and port 443"
    /// (as `record --filter`).
    #[arg(long, value_name = "EXPR")]
    pub(crate) flow: Option<String>,
    /// Draw the most reordered flows' time-sequence graphs and the
    /// histograms of extent and late time into OUT.svg.
    #[arg(long, value_name = "OUT.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// What the plot's colours say: the segments' RX queue or CPU.
    #[arg(long, value_enum, default_value_t = ColorBy::Queue)]
    pub(crate) plot_color: ColorBy,
    #[command(flatten)]
    pub(crate) report: ReportArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LabModeArg {
    /// Emulated flow director (ATR): flows re-pointed to other queues/CPUs.
    Atr,
    /// Exact, deterministic reordering with no queue/CPU change.
    Pattern,
    /// Plain forwarding: no reordering.
    Off,
}

#[derive(Args)]
pub struct LabArgs {
    /// What the edge between client and server does.
    #[arg(long, value_enum, default_value_t = LabModeArg::Atr)]
    pub(crate) mode: LabModeArg,
    /// ATR: table re-points per second per flow (each moves the flow to
    /// another queue and CPU).
    #[arg(long, value_name = "HZ", default_value_t = 50.0)]
    pub(crate) repoints: f64,
    /// A WAN between the senders and the edge: its round trip, 1 to 200
    /// milliseconds (the server's packets held that long on the way back).
    #[arg(long, value_name = "MS")]
    pub(crate) rtt: Option<f64>,
    /// A bottleneck between the senders and the edge: MBIT Mbit/s of
    /// Ethernet frames, 1 to 10000, with a queue of one bandwidth-delay
    /// product (drops counted).
    #[arg(long, value_name = "MBIT")]
    pub(crate) rate: Option<u32>,
    /// ATR: packets each CPU's queue holds (how much can wait on the old
    /// path when a flow moves).
    #[arg(long, value_name = "PACKETS", default_value_t = 256)]
    pub(crate) qsize: u32,
    /// Pattern: swap:N (every Nth data segment swaps with the next) or
    /// hold:N:US (every Nth is held US microseconds).
    #[arg(long, default_value = "swap:50", value_parser = |s: &str| s.parse::<lab::Pattern>())]
    pub(crate) pattern: lab::Pattern,
    /// The senders, each sending --flows flows, side by side: host (this
    /// kernel's TCP, RACK-TLP), newreno (this kernel without SACK), or a
    /// Linux 6.1 guest of its own (user-mode-linux) set up as the replay's
    /// policy: classic (RFC 6675, three duplicate ACKs, no timestamps),
    /// linux-adaptive (RFC 6675, adaptive threshold), rack-tlp.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "host")]
    pub(crate) sender: Vec<lab::Sender>,
    /// The client's TCP sends one segment per skb (gso_max_segs 1), so
    /// every segment has its own transmit time, as RFC 8985 (and the
    /// replay) assume. With GSO, Linux's RACK cannot tell apart segments of
    /// one burst, and tolerates more reordering within it.
    #[arg(long)]
    pub(crate) no_sender_gso: bool,
    /// Watch it in the live view (as `tracer live`), then the report.
    #[arg(long)]
    pub(crate) live: bool,
    /// Pace each host sender's flows to at most MBIT Mbit/s (0: unpaced).
    /// Default: 200 in pattern mode, whose userspace reorderer keeps exact
    /// order only at moderate rates; unpaced otherwise. Guest senders are
    /// never paced (their kernel's pacing timer can stall a flow).
    #[arg(long, value_name = "MBIT")]
    pub(crate) pace: Option<f64>,
    /// Write the ground truth (every segment leaving the edge: its queue,
    /// CPU and arrival order; every table change) as JSON lines to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) truth: Option<PathBuf>,
    /// Parallel TCP connections of each sender.
    #[arg(long, default_value_t = 4)]
    pub(crate) flows: usize,
    /// Bytes per connection (suffixes k, M, G). Default 128M; with
    /// --until-late, 4G (a bound, rarely reached).
    #[arg(long, value_parser = parse_size)]
    pub(crate) bytes: Option<u64>,
    /// Upper bound on the transfer, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 8.0)]
    pub(crate) duration: f64,
    /// Go on until the edge has made N late segments in every flow (atr
    /// and pattern modes), then end the upload (every byte sent still
    /// received); --bytes and --duration bound it. The report says whether
    /// it got there.
    #[arg(long, value_name = "N")]
    pub(crate) until_late: Option<u64>,
    /// The receiver sends no DSACKs: no sender can undo a recovery from
    /// them, and the classic guest (no timestamps) undoes none, as the
    /// seed's senders did not.
    #[arg(long)]
    pub(crate) no_dsack: bool,
    /// Use IPv6 instead of IPv4.
    #[arg(long)]
    ipv6: bool,
    /// RX queues of the server's interface (TX queues of the edge's).
    #[arg(long, default_value_t = 4)]
    pub(crate) queues: u32,
    #[command(flatten)]
    pub(crate) trace: TraceArgs,
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

pub(crate) fn seconds(flag: &str, secs: f64) -> Result<Duration, SetupError> {
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
        crate::kernel::DEFAULT_OVERLOAD_SAMPLE
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

/// A filter expression given as `flag` (`--filter`, `--flow`).
pub(crate) fn filter(flag: &str, expr: Option<&str>) -> Result<Filter, SetupError> {
    Filter::parse(expr.unwrap_or("")).map_err(|e| match e {
        SetupError::BadFilter(why) => SetupError::BadArgument(format!("bad {flag}: {why}")),
        other => other,
    })
}

/// `--metrics-addr`: `PORT` (loopback), `ADDR:PORT` or `[V6]:PORT`.
pub(crate) fn metrics_addr(s: &str) -> Result<SocketAddr, SetupError> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| {
        SetupError::BadArgument(format!(
            "--metrics-addr {s}: give a port (loopback) or ADDRESS:PORT, e.g. 9464 or 0.0.0.0:9464"
        ))
    })
}

impl TraceArgs {
    /// What to attach to `iface` (in `netns`) with these flags; the
    /// snaplen is the output's to set.
    pub(crate) fn tracer_options(
        &self,
        iface: String,
        netns: Option<String>,
        filter: Filter,
    ) -> Result<TracerOptions, SetupError> {
        Ok(TracerOptions {
            iface,
            netns,
            xdp_mode: self.xdp_mode,
            filter,
            ring_bytes: ring_bytes(self.ring_mib)?,
            rings: self.rings,
            xdp: true,
            floor: false,
            tcp_layer: !self.no_tcp_layer,
            summary_sample: summary(self)?,
            overload_sample: overload_sample(self),
            snaplen: 0,
        })
    }
}

/// A lab run as the flags ask for it.
pub(crate) struct LabPlan {
    pub spec: lab::LabSpec,
    /// Mbit/s each host flow is paced to (0: unpaced).
    pub pace: f64,
}

impl LabArgs {
    /// The lab's spec, every flag checked.
    pub(crate) fn plan(&self) -> Result<LabPlan, SetupError> {
        let timeout = seconds("--duration", self.duration)?;
        if self.flows == 0 || self.flows > 256 {
            return Err(SetupError::BadArgument(format!(
                "--flows {}: give 1 to 256 connections",
                self.flows
            )));
        }
        if !(1..=64).contains(&self.queues) {
            return Err(SetupError::BadArgument(format!(
                "--queues {}: give 1 to 64",
                self.queues
            )));
        }
        let mode = match self.mode {
            LabModeArg::Atr => {
                if !(self.repoints > 0.0 && self.repoints <= 10_000.0) {
                    return Err(SetupError::BadArgument(format!(
                        "--repoints {}: give 0 to 10000 re-points per second",
                        self.repoints
                    )));
                }
                if !(8..=16_384).contains(&self.qsize) {
                    return Err(SetupError::BadArgument(format!(
                        "--qsize {}: give 8 to 16384 packets",
                        self.qsize
                    )));
                }
                lab::Mode::Atr {
                    rate: self.repoints,
                    qsize: self.qsize,
                }
            }
            LabModeArg::Pattern => lab::Mode::Pattern {
                pattern: self.pattern,
            },
            LabModeArg::Off => lab::Mode::Off,
        };
        if let Some(n) = self.until_late {
            if mode == lab::Mode::Off || n == 0 {
                return Err(SetupError::BadArgument(format!(
                    "--until-late {n}: give N >= 1 with --mode atr or pattern (off makes nothing late)"
                )));
            }
        }
        if let Some(rtt) = self.rtt.filter(|r| !(1.0..=200.0).contains(r)) {
            return Err(SetupError::BadArgument(format!(
                "--rtt {rtt}: give a round trip of 1 to 200 milliseconds"
            )));
        }
        if let Some(rate) = self.rate.filter(|r| !(1..=10_000).contains(r)) {
            return Err(SetupError::BadArgument(format!(
                "--rate {rate}: give a bottleneck of 1 to 10000 Mbit/s"
            )));
        }
        let wan = lab::WanSpec {
            rtt_ms: self.rtt,
            rate_mbit: self.rate,
        };
        let bytes = self.bytes.unwrap_or(if self.until_late.is_some() {
            4 << 30
        } else {
            128 << 20
        });
        let pace = self.pace.unwrap_or(match mode {
            lab::Mode::Pattern { .. } => 200.0,
            _ => 0.0,
        });
        if !(0.0..=1_000_000.0).contains(&pace) {
            return Err(SetupError::BadArgument(format!(
                "--pace {pace}: give 0 (unpaced) to 1000000 Mbit/s"
            )));
        }
        let host_senders = self.sender.iter().any(|s| !s.in_guest());
        if self.pace.is_some_and(|p| p > 0.0) && !host_senders {
            return Err(SetupError::BadArgument(format!(
                "--pace {pace}: guest senders are never paced (their kernel's pacing timer can stall a flow); add a host sender (--sender host) or leave --pace out"
            )));
        }
        let spec = lab::LabSpec {
            mode,
            senders: self.sender.iter().fold(Vec::new(), |mut v, &s| {
                if !v.contains(&s) {
                    v.push(s);
                }
                v
            }),
            queues: self.queues,
            flows: self.flows,
            bytes_per_flow: bytes,
            ipv6: self.ipv6,
            timeout,
            pacing: (pace > 0.0).then(|| (pace * 1e6 / 8.0) as u64),
            sender_gso: !self.no_sender_gso,
            truth_out: self.truth.clone(),
            until_late: self.until_late,
            receiver_dsack: !self.no_dsack,
            wan,
        };
        Ok(LabPlan { spec, pace })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand's flags are unique (clap checks it only when a
    /// debug build parses that subcommand).
    #[test]
    fn the_command_line_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn a_bare_port_listens_on_loopback() {
        assert_eq!(metrics_addr("9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(
            metrics_addr("0.0.0.0:9464").unwrap().to_string(),
            "0.0.0.0:9464"
        );
        assert_eq!(
            metrics_addr("[::1]:9464").unwrap().to_string(),
            "[::1]:9464"
        );
        assert!(metrics_addr("localhost").is_err());
    }
}
