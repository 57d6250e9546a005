//! What tracing costs a real upload (`cargo xtask bench`; root): the lab's
//! kernel-TCP upload (4 flows, plain forwarding) with the tracer attached
//! to the receiver and collecting, against the same upload without it,
//! alternating runs in one process: full mode, summary mode
//! (`--summary 64`) and summary mode without the TCP layer (`--summary 64
//! --no-tcp-layer`). Another set attaches only the counter-only XDP
//! program (`count_pass`) to the same interface: what having any XDP
//! program there costs (on veth it turns off TSO on the peer), so the
//! tracer's own share reads apart from it; and one attaches full mode's
//! floor (`emit_floor`: a clock read and a ring record per frame, the
//! records taken off the ring and nothing more), what full mode cannot go
//! below without the TCP layer; and one summary mode's (the tracer with a
//! filter that keeps nothing: its programs run and decide, and emit
//! nothing). Each ratio is the median over
//! the rounds of the runs' ratio in their round (the VM's speed drifts
//! between rounds by more than the differences measured). Also, per mode,
//! the collector's CPU time per million segments (its thread's rusage) and
//! the event rate it kept up with (dropped events counted).

use std::time::{Duration, Instant};

use tracer::{
    engine::{Engine, EngineConfig},
    filter::Filter,
    kernel::{Tracer, TracerOptions},
    lab::{self, Lab, LabSpec, Upload, UploadSpec},
    record::{self, RecordOptions},
};
use tracer_common::counter;

#[path = "common/cpu.rs"]
mod cpu;
#[path = "common/target.rs"]
mod target;
use cpu::thread_cpu;
use target::Target;

const ROUNDS: usize = 11;
const FLOWS: usize = 4;
const BYTES: u64 = 256 << 20;
/// Summary mode's sample.
const SUMMARY: u32 = 64;

struct Run {
    mbit: f64,
    traced: Option<Traced>,
}

/// What the tracer saw and spent in one run.
#[derive(Clone, Copy, Default)]
struct Traced {
    /// TCP segments the XDP program parsed (emitted or not).
    segments: u64,
    /// Ring records received (segments, `tcp_probe`, retransmissions).
    events: u64,
    dropped: u64,
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
                dropped: a.dropped + t.dropped,
                collector_cpu: a.collector_cpu + t.collector_cpu,
                secs: a.secs + t.secs,
            })
    }
}

/// What is attached to the receiver's interface during an upload.
#[derive(Clone, Copy)]
enum Attached {
    Nothing,
    /// The counter-only XDP program alone.
    CountPass,
    /// The tracer: summary mode's sample (0: full mode), and whether the
    /// TCP layer (`tcp_probe`) is traced.
    Tracer {
        summary: u32,
        tcp_layer: bool,
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

/// Attaches `count_pass` to the lab's receiving interface; detached when
/// the returned object is dropped.
fn attach_count_pass(lab: &Lab) -> aya::Ebpf {
    let mut ebpf = aya::Ebpf::load(tracer::EBPF_OBJECT).expect("loading the eBPF object");
    let p: &mut aya::programs::Xdp = ebpf.program_mut("count_pass").unwrap().try_into().unwrap();
    p.load().expect("loading count_pass");
    let _ns = tracer::kernel::netns::NetnsGuard::enter(&lab.topo.server_ns).expect("netns");
    p.attach(lab::SERVER_IF, aya::programs::XdpMode::Driver)
        .expect("attaching count_pass");
    ebpf
}

fn upload(attached: Attached) -> Run {
    let lab = Lab::create(&LabSpec::new(lab::Mode::Off, 4)).expect("lab");
    let _count_pass = matches!(attached, Attached::CountPass).then(|| attach_count_pass(&lab));
    let traced = match attached {
        Attached::Tracer { summary, tcp_layer } => Some((summary, tcp_layer)),
        Attached::Floor => Some((0, false)),
        Attached::KeepsNothing => Some((SUMMARY, true)),
        _ => None,
    };
    let mut tracer = traced.map(|(summary, tcp_layer)| {
        let mut opts = TracerOptions::new(lab::SERVER_IF);
        opts.netns = Some(lab.topo.server_ns.clone());
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
        timeout: Duration::from_secs(10),
        pacing: None,
        sysctls: Vec::new(),
    };
    let start = Instant::now();
    let up = Upload::start(&lab.topo, &spec).expect("upload");
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
                duration: Some(Duration::from_secs(15)),
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
            dropped: o.counters.dropped(),
            collector_cpu: thread_cpu() - cpu,
            secs: o.elapsed.as_secs_f64(),
        }
    });
    let results = up.join().expect("upload");
    let secs = start.elapsed().as_secs_f64();
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
        dropped: counters.dropped(),
        collector_cpu: thread_cpu() - cpu,
        secs: start.elapsed().as_secs_f64(),
    }
}

/// The sets of runs, each a column of every round.
const SETS: [(&str, Attached); 7] = [
    ("without the tracer", Attached::Nothing),
    ("count_pass only", Attached::CountPass),
    ("full mode's floor", Attached::Floor),
    ("summary's floor", Attached::KeepsNothing),
    (
        "full mode",
        Attached::Tracer {
            summary: 0,
            tcp_layer: true,
        },
    ),
    (
        "summary 1/64",
        Attached::Tracer {
            summary: SUMMARY,
            tcp_layer: true,
        },
    ),
    (
        "summary, no TCP layer",
        Attached::Tracer {
            summary: SUMMARY,
            tcp_layer: false,
        },
    ),
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("lab benchmark: skipped: needs root (namespaces, the tracer)");
        return;
    }
    let mut runs: Vec<Vec<Run>> = SETS.iter().map(|_| Vec::new()).collect();
    for _ in 0..ROUNDS {
        for (set, (_, attached)) in SETS.iter().enumerate() {
            runs[set].push(upload(*attached));
        }
    }
    println!(
        "lab benchmark: {FLOWS} x {} MiB kernel-TCP upload through the lab, {ROUNDS} rounds, the sets alternating",
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
    let ratio = |set: usize, base: usize| ratios(set, base).0;
    for (set, (name, _)) in SETS.iter().enumerate() {
        let list = runs[set]
            .iter()
            .map(|r| format!("{:.0}", r.mbit))
            .collect::<Vec<_>>()
            .join(", ");
        let mbit = median(runs[set].iter().map(|r| r.mbit).collect());
        if set == 0 {
            println!("  {name:<22} {mbit:>5.0} Mbit/s ({list})");
        } else {
            let (r, lo, hi) = ratios(set, 0);
            let own = ratio(set, 1);
            // Full mode, summary, summary without the TCP layer (against
            // count_pass alone, less 0.01).
            let count_pass = ratio(1, 0);
            let floor = |set: usize| ratio(set, 0);
            let target = match set {
                4 => format!(
                    "{}; its floors: XDP's {:.3}, the TCP layer's {:.3}",
                    Target::AtLeast(0.95).say(r, "0.95"),
                    floor(2),
                    floor(3)
                ),
                5 => format!(
                    "{}; its floor {:.3}",
                    Target::AtLeast(0.97).say(r, "0.97"),
                    floor(3)
                ),
                6 => Target::AtLeast(count_pass - 0.01)
                    .say(r, &format!("count_pass's {count_pass:.3} - 0.01")),
                _ => String::new(),
            };
            let target = if target.is_empty() {
                target
            } else {
                format!(" ({target})")
            };
            println!(
                "  {name:<22} {mbit:>5.0} Mbit/s ({list}): {r:.3} of untraced (middle half of the rounds {lo:.2}-{hi:.2}){target}; {own:.3} of count_pass only"
            );
        }
    }
    for (set, (name, _)) in SETS.iter().enumerate().skip(2) {
        let t = Traced::sum(&runs[set]);
        let cpu = t.collector_cpu.as_secs_f64();
        println!(
            "  {name:<22} {:.0} events/s ({:.0}% of the segments' count), {} dropped; collector {:.0} ms CPU per million segments, {:.1}% of one core",
            t.events as f64 / t.secs,
            t.events as f64 * 100.0 / t.segments as f64,
            t.dropped,
            cpu * 1e3 / (t.segments as f64 / 1e6),
            cpu / t.secs * 100.0
        );
    }
}
