//! What tracing costs a real upload (`cargo xtask bench`; root), against
//! what a user would run instead: a kernel-TCP upload (4 flows) over a
//! veth pair of 4 queues between two namespaces, untraced, beside the
//! same upload with
//! `tcpdump -s 128 -w FILE` on the receiver's interface, with the
//! tracer attached and collecting in each mode (full, the default;
//! `--summary 64`; `--summary 64 --no-tcp-layer`), and with their floors:
//! the counter-only XDP program (`count_pass`: what having any XDP
//! program there costs), full mode's (`emit_floor`: a clock read and a
//! ring record per frame, the records taken off the ring and nothing
//! more) and summary mode's (a filter that keeps nothing: its programs
//! run and decide, and emit nothing). Two tables: segments of MTU size
//! (the client's TSO and GSO off, the receiver's GRO off: as a NIC
//! delivers them), and the veth's own offloads (a container's interface,
//! whose peer native XDP turns TSO off). The tracer and `count_pass` are
//! attached as `record` attaches by default (native XDP; generic on a
//! veth whose peer has TSO, which native would take from it), and the
//! tracer once more natively. The sets alternate within each round;
//! each ratio is the median over the rounds of the runs' ratio in their
//! round (the VM's speed drifts between rounds by more than the
//! differences measured). Also, per mode, the collector's CPU time per
//! million segments (its thread's rusage) and what was lost (the ring's
//! dropped events, tcpdump's kernel drops).

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tracer::{
    engine::{Engine, EngineConfig},
    filter::Filter,
    kernel::{Tracer, TracerOptions, XdpModeChoice},
    lab::{self, Topology, TopologyOptions, Upload, UploadSpec},
    nic,
    record::{self, RecordOptions},
};
use tracer_common::counter;

#[path = "common/cpu.rs"]
mod cpu;
#[path = "common/target.rs"]
mod target;
use cpu::thread_cpu;
use target::Target;

const ROUNDS: usize = 7;
const FLOWS: usize = 4;
const BYTES: u64 = 1 << 30;
/// Summary mode's sample.
const SUMMARY: u32 = 64;
/// tcpdump's snap length: headers, as a user tracing TCP keeps.
const SNAPLEN: &str = "128";

struct Run {
    mbit: f64,
    traced: Option<Traced>,
}

/// What the tracer (or tcpdump) saw and spent in one run.
#[derive(Clone, Copy, Default)]
struct Traced {
    /// TCP segments the XDP program parsed (emitted or not); tcpdump's
    /// packets captured.
    segments: u64,
    /// Ring records received (segments, `tcp_probe`, retransmissions).
    events: u64,
    /// Events the ring dropped; tcpdump's packets dropped by the kernel.
    lost: u64,
    collector_cpu: Duration,
    secs: f64,
}

impl Traced {
    fn sum(runs: &[Run]) -> Self {
        runs.iter()
            .filter_map(|r| r.traced)
            .fold(Self::default(), |a, t| Self {
                segments: a.segments + t.segments,
                events: a.events + t.events,
                lost: a.lost + t.lost,
                collector_cpu: a.collector_cpu + t.collector_cpu,
                secs: a.secs + t.secs,
            })
    }
}

/// How the upload's segments reach the receiver.
#[derive(Clone, Copy, PartialEq)]
enum Segments {
    /// One segment of MTU size per packet: the client's TSO and GSO off
    /// (`ethtool -K`), the receiver's GRO off, as a NIC delivers
    /// them.
    Mtu,
    /// The veth's own offloads (a container's interface): native XDP on
    /// the receiver turns its peer's TSO off.
    Gso,
}

/// What is attached to the receiver's interface during an upload.
#[derive(Clone, Copy)]
enum Attached {
    Nothing,
    /// The counter-only XDP program alone.
    CountPass,
    /// `tcpdump -s 128 -w FILE`.
    Tcpdump,
    /// The tracer: summary mode's sample (0: full mode), whether the TCP
    /// layer (`tcp_probe`) is traced, and the XDP mode asked for (`auto`
    /// as `record` resolves it: generic on a veth whose peer has TSO).
    Tracer {
        summary: u32,
        tcp_layer: bool,
        xdp: XdpModeChoice,
    },
    /// Full mode's floor: `emit_floor` in `tag_rx`'s place (a clock read
    /// and a ring record per frame), no TCP layer, and a collector that
    /// only takes the records off the ring.
    Floor,
    /// Summary mode's floor: the tracer with the TCP layer and a filter
    /// that keeps nothing (port 9): every program runs on every frame
    /// and skb, reads what deciding needs, and emits nothing.
    KeepsNothing,
}

/// Attaches `count_pass` to the receiving interface the way `record`
/// attaches by default; detached when the returned object is dropped.
fn attach_count_pass(topo: &Topology) -> aya::Ebpf {
    let mode = match record_xdp(topo, XdpModeChoice::Auto) {
        XdpModeChoice::Generic => aya::programs::XdpMode::Skb,
        _ => aya::programs::XdpMode::Driver,
    };
    let mut ebpf = aya::Ebpf::load(tracer::EBPF_OBJECT).expect("loading the eBPF object");
    let p: &mut aya::programs::Xdp = ebpf.program_mut("count_pass").unwrap().try_into().unwrap();
    p.load().expect("loading count_pass");
    let _ns = tracer::kernel::netns::NetnsGuard::enter(&topo.server_ns).expect("netns");
    p.attach(lab::SERVER_IF, mode)
        .expect("attaching count_pass");
    ebpf
}

/// `tcpdump -s 128 -w FILE` on the receiving interface, capturing
/// once it says it listens.
struct Tcpdump {
    child: Child,
    file: std::path::PathBuf,
    stderr: BufReader<std::process::ChildStderr>,
    start: Instant,
}

impl Tcpdump {
    fn start(topo: &Topology) -> Self {
        let file = std::env::temp_dir().join(format!("tracer-bench-{}.pcap", std::process::id()));
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &topo.server_ns,
                "tcpdump",
                "-i",
                lab::SERVER_IF,
            ])
            .args(["-s", SNAPLEN, "-Z", "root", "-w"])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump (cargo xtask setup installs it)");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("listening on") {
            line.clear();
            let n = stderr.read_line(&mut line).expect("tcpdump's stderr");
            assert!(n > 0, "tcpdump ended before it listened");
        }
        Self {
            child,
            file,
            stderr,
            start: Instant::now(),
        }
    }

    /// Stops it (SIGINT, as at a terminal): what it captured and what
    /// the kernel dropped, from its own last words.
    fn stop(mut self) -> Traced {
        // SAFETY: a plain signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let mut words = String::new();
        std::io::Read::read_to_string(&mut self.stderr, &mut words).expect("tcpdump's stderr");
        self.child.wait().expect("tcpdump");
        std::fs::remove_file(&self.file).ok();
        let count = |what: &str| {
            words
                .lines()
                .find(|l| l.ends_with(what))
                .and_then(|l| l.split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("no \"{what}\" in tcpdump's last words: {words}"))
        };
        Traced {
            segments: count("packets captured"),
            events: count("packets captured"),
            lost: count("packets dropped by kernel"),
            collector_cpu: Duration::ZERO,
            secs: self.start.elapsed().as_secs_f64(),
        }
    }
}

/// `ethtool -K DEV ARGS` in namespace `ns`.
fn ethtool(ns: &str, dev: &str, args: &[&str]) {
    let ok = Command::new("ip")
        .args(["netns", "exec", ns, "ethtool", "-K", dev])
        .args(args)
        .status()
        .expect("ethtool (cargo xtask setup installs it)");
    assert!(ok.success(), "ethtool -K {dev} {}", args.join(" "));
}

/// The XDP mode `record` takes on the receiving interface when asked
/// for `asked`.
fn record_xdp(topo: &Topology, asked: XdpModeChoice) -> XdpModeChoice {
    nic::veth::xdp_mode(lab::SERVER_IF, Some(&topo.server_ns), asked).0
}

fn upload(segments: Segments, attached: Attached) -> Run {
    let topo = Topology::create(&TopologyOptions {
        queues: 4,
        direct: true,
    })
    .expect("namespaces");
    if segments == Segments::Mtu {
        ethtool(
            &topo.client_ns,
            lab::CLIENT_IF,
            &["tso", "off", "gso", "off"],
        );
        ethtool(&topo.server_ns, lab::SERVER_IF, &["gro", "off"]);
    }
    let _count_pass = matches!(attached, Attached::CountPass).then(|| attach_count_pass(&topo));
    let tcpdump = matches!(attached, Attached::Tcpdump).then(|| Tcpdump::start(&topo));
    let auto = XdpModeChoice::Auto;
    let traced = match attached {
        Attached::Tracer {
            summary,
            tcp_layer,
            xdp,
        } => Some((summary, tcp_layer, xdp)),
        Attached::Floor => Some((0, false, auto)),
        Attached::KeepsNothing => Some((SUMMARY, true, auto)),
        _ => None,
    };
    let mut tracer = traced.map(|(summary, tcp_layer, xdp)| {
        let mut opts = TracerOptions::new(lab::SERVER_IF);
        opts.netns = Some(topo.server_ns.clone());
        opts.xdp_mode = record_xdp(&topo, xdp);
        opts.summary_sample = summary;
        opts.tcp_layer = tcp_layer;
        opts.floor = matches!(attached, Attached::Floor);
        if matches!(attached, Attached::KeepsNothing) {
            opts.filter = Filter {
                ports: vec![9],
                prefixes: Vec::new(),
            };
        }
        Tracer::attach(&opts).expect("attach")
    });
    let spec = UploadSpec {
        flows: FLOWS,
        bytes_per_flow: BYTES,
        port: lab::SERVER_PORT,
        ipv6: false,
        timeout: Duration::from_secs(20),
        pacing: None,
        sysctls: Vec::new(),
    };
    let start = Instant::now();
    let up = Upload::start(&topo, &spec).expect("upload");
    let traced = tracer.as_mut().map(|t| {
        if matches!(attached, Attached::Floor) {
            return drain(t, &up);
        }
        let mut engine = Engine::new(EngineConfig::default());
        let cpu = thread_cpu();
        let o = record::run(
            t,
            &mut engine,
            &mut [],
            || up.finished(),
            RecordOptions {
                duration: Some(Duration::from_secs(25)),
                progress: false,
                live: None,
                metrics: None,
                nic: None,
                intervals: None,
                interface: Default::default(),
            },
        )
        .expect("collect");
        Traced {
            segments: o.counters.get(counter::XDP_TCP),
            events: o.received,
            lost: o.counters.dropped(),
            collector_cpu: thread_cpu() - cpu,
            secs: o.elapsed.as_secs_f64(),
        }
    });
    let results = up.join().expect("upload");
    let secs = start.elapsed().as_secs_f64();
    let traced = traced.or_else(|| tcpdump.map(Tcpdump::stop));
    let bytes: u64 = results.iter().map(|r| r.received).sum();
    assert_eq!(bytes, FLOWS as u64 * BYTES, "the whole upload arrived");
    Run {
        mbit: bytes as f64 * 8.0 / secs / 1e6,
        traced,
    }
}

/// Takes the records off the ring until the upload is over, and nothing
/// else: the floor's collector.
fn drain(t: &mut Tracer, up: &Upload) -> Traced {
    let (cpu, start) = (thread_cpu(), Instant::now());
    let mut events = 0;
    loop {
        let over = up.finished();
        t.wait_readable(Duration::from_millis(20)).expect("wait");
        while t.rings().next_record().is_some() {
            events += 1;
        }
        if over {
            break;
        }
    }
    let counters = t.counters().expect("counters");
    Traced {
        segments: counters.get(counter::XDP_FRAMES),
        events,
        lost: counters.dropped(),
        collector_cpu: thread_cpu() - cpu,
        secs: start.elapsed().as_secs_f64(),
    }
}

/// The sets of runs, each a column of every round; the indices the
/// targets name.
const NOTHING: usize = 0;
const COUNT_PASS: usize = 1;
const TCPDUMP: usize = 2;
const FULL: usize = 5;
const NO_TCP_LAYER: usize = 7;
const SETS: [(&str, Attached); 9] = [
    ("without the tracer", Attached::Nothing),
    ("count_pass only", Attached::CountPass),
    ("tcpdump -s 128 -w", Attached::Tcpdump),
    ("full mode's floor", Attached::Floor),
    ("summary's floor", Attached::KeepsNothing),
    (
        "full mode (default)",
        Attached::Tracer {
            summary: 0,
            tcp_layer: true,
            xdp: XdpModeChoice::Auto,
        },
    ),
    (
        "summary 1/64",
        Attached::Tracer {
            summary: SUMMARY,
            tcp_layer: true,
            xdp: XdpModeChoice::Auto,
        },
    ),
    (
        "summary, no TCP layer",
        Attached::Tracer {
            summary: SUMMARY,
            tcp_layer: false,
            xdp: XdpModeChoice::Auto,
        },
    ),
    (
        "full, --xdp-mode native",
        Attached::Tracer {
            summary: 0,
            tcp_layer: true,
            xdp: XdpModeChoice::Native,
        },
    ),
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One table: every set, `ROUNDS` rounds, the sets alternating.
fn table(segments: Segments, title: &str) {
    let mut runs: Vec<Vec<Run>> = SETS.iter().map(|_| Vec::new()).collect();
    for _ in 0..ROUNDS {
        for (set, (_, attached)) in SETS.iter().enumerate() {
            runs[set].push(upload(segments, *attached));
        }
    }
    println!(
        "lab benchmark, {title}: {FLOWS} x {} MiB kernel-TCP upload over a veth pair of 4 queues, {ROUNDS} rounds, the sets alternating",
        BYTES >> 20
    );
    // Set `set`'s runs against set `base`'s in the same rounds: the
    // median, and the middle half of the rounds.
    let ratios = |set: usize, base: usize| {
        let mut v: Vec<f64> = runs[set]
            .iter()
            .zip(&runs[base])
            .map(|(r, b)| r.mbit / b.mbit)
            .collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[v.len() / 4], v[v.len() * 3 / 4])
    };
    let ratio = |set: usize| ratios(set, NOTHING).0;
    for (set, (name, _)) in SETS.iter().enumerate() {
        let list = runs[set]
            .iter()
            .map(|r| format!("{:.0}", r.mbit))
            .collect::<Vec<_>>()
            .join(", ");
        let mbit = median(runs[set].iter().map(|r| r.mbit).collect());
        if set == NOTHING {
            println!("  {name:<22} {mbit:>5.0} Mbit/s ({list})");
            continue;
        }
        let (r, lo, hi) = ratios(set, NOTHING);
        let target = match set {
            FULL => format!(
                " ({})",
                Target::AtLeast(ratio(TCPDUMP))
                    .say(r, &format!("tcpdump -s 128's {:.3}", ratio(TCPDUMP)))
            ),
            NO_TCP_LAYER => format!(
                " ({})",
                Target::AtLeast(ratio(COUNT_PASS) - 0.03)
                    .say(r, &format!("count_pass's {:.3} - 0.03", ratio(COUNT_PASS)))
            ),
            _ => String::new(),
        };
        println!(
            "  {name:<22} {mbit:>5.0} Mbit/s ({list}): {r:.3} of untraced (middle half of the rounds {lo:.2}-{hi:.2}){target}"
        );
    }
    for (set, (name, _)) in SETS.iter().enumerate().skip(TCPDUMP) {
        let t = Traced::sum(&runs[set]);
        let lost = Target::AtMost(0.0).say(t.lost as f64, "0");
        if set == TCPDUMP {
            println!(
                "  {name:<22} {:.0} packets/s captured, {} dropped by the kernel ({lost})",
                t.segments as f64 / t.secs,
                t.lost
            );
            continue;
        }
        let cpu = t.collector_cpu.as_secs_f64();
        println!(
            "  {name:<22} {:.0} events/s ({:.0}% of the segments' count), {} lost ({lost}); collector {:.0} ms CPU per million segments, {:.1}% of one core",
            t.events as f64 / t.secs,
            t.events as f64 * 100.0 / t.segments as f64,
            t.lost,
            cpu * 1e3 / (t.segments as f64 / 1e6),
            cpu / t.secs * 100.0
        );
    }
}

fn main() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("lab benchmark: skipped: needs root (namespaces, the tracer)");
        return;
    }
    table(
        Segments::Mtu,
        "segments of MTU size (the client's TSO and GSO off, the receiver's GRO off)",
    );
    table(
        Segments::Gso,
        "the veth's own offloads (native XDP turns the peer's TSO off)",
    );
}
