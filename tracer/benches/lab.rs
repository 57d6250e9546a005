//! What tracing costs a real upload (`cargo xtask bench`; root): the lab's
//! kernel-TCP upload (4 flows, plain forwarding) with the tracer attached
//! to the receiver and collecting, against the same upload without it,
//! alternating runs in one process, and with the tracer in summary mode
//! without the TCP layer (`--summary 64 --no-tcp-layer`). A fourth set
//! attaches only the counter-only XDP program (`count_pass`) to the same
//! interface: what having any XDP program there costs (on veth it turns
//! off TSO on the peer), so the tracer's own share reads apart from it.
//! Also, per mode, the collector's CPU time per million segments (its
//! thread's rusage) and the event rate it kept up with (dropped events
//! counted).

use std::time::{Duration, Instant};

use tracer::{
    engine::{Engine, EngineConfig},
    kernel::{Tracer, TracerOptions},
    lab::{self, Lab, LabSpec, Upload, UploadSpec},
    record::{self, RecordOptions},
};
use tracer_common::counter;

const ROUNDS: usize = 5;
const FLOWS: usize = 4;
const BYTES: u64 = 256 << 20;
/// Summary mode's sample in the third set of runs.
const SUMMARY: u32 = 64;

fn thread_cpu() -> Duration {
    // SAFETY: a valid rusage to fill.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(u.ru_utime) + t(u.ru_stime)
}

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
    /// The tracer, with this summary-mode sample (0: full mode).
    Tracer(u32),
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
        Attached::Tracer(summary) => Some(summary),
        _ => None,
    };
    let mut tracer = traced.map(|summary| {
        let mut opts = TracerOptions::new(lab::SERVER_IF);
        opts.netns = Some(lab.topo.server_ns.clone());
        opts.summary_sample = summary;
        // Summary mode as a busy host would run it: no TCP layer.
        opts.tcp_layer = summary == 0;
        Tracer::attach(&opts).expect("attach")
    });
    let spec = UploadSpec {
        flows: FLOWS,
        bytes_per_flow: BYTES,
        port: lab::SERVER_PORT,
        ipv6: false,
        timeout: Duration::from_secs(10),
        pacing: None,
    };
    let start = Instant::now();
    let up = Upload::start(&lab.topo, &spec).expect("upload");
    let traced = tracer.as_mut().map(|t| {
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

fn main() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("lab benchmark: skipped: needs root (namespaces, the tracer)");
        return;
    }
    let (mut plain, mut xdp, mut traced, mut summary) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        plain.push(upload(Attached::Nothing));
        xdp.push(upload(Attached::CountPass));
        traced.push(upload(Attached::Tracer(0)));
        summary.push(upload(Attached::Tracer(SUMMARY)));
    }
    // Medians: on this VM one run in five may land a third off the rest.
    let median = |v: &[Run]| {
        let mut m: Vec<f64> = v.iter().map(|r| r.mbit).collect();
        m.sort_by(f64::total_cmp);
        m[m.len() / 2]
    };
    let list = |v: &[Run]| {
        v.iter()
            .map(|r| format!("{:.0}", r.mbit))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (p, x, t, sm) = (
        median(&plain),
        median(&xdp),
        median(&traced),
        median(&summary),
    );
    println!(
        "lab benchmark: {FLOWS} x {} MiB kernel-TCP upload through the lab, {ROUNDS} runs each, alternating (medians)",
        BYTES >> 20
    );
    println!("  without the tracer  {p:>7.0} Mbit/s ({})", list(&plain));
    println!("  count_pass only     {x:>7.0} Mbit/s ({})", list(&xdp));
    println!("  with the tracer     {t:>7.0} Mbit/s ({})", list(&traced));
    println!(
        "  summary, no TCP layer {sm:>4.0} Mbit/s ({})",
        list(&summary)
    );
    for (name, v) in [("traced/untraced", t), ("summary/untraced", sm)] {
        let ratio = v / p;
        println!(
            "  {name:<19} {ratio:>7.3} (target >= 0.97: {})",
            if ratio >= 0.97 { "met" } else { "NOT met" }
        );
    }
    println!(
        "  count_pass/untraced {:>7.3} (any XDP program on this interface)",
        x / p
    );
    for (name, v) in [("traced/count_pass", t), ("summary/count_pass", sm)] {
        println!("  {name:<19} {:>7.3} (the tracer's own share)", v / x);
    }
    for (name, runs) in [("full mode", &traced), ("summary", &summary)] {
        let t = Traced::sum(runs);
        let cpu = t.collector_cpu.as_secs_f64();
        println!(
            "  {name:<19} {:.0} events/s ({:.0}% of the segments' count), {} dropped; collector {:.0} ms CPU per million segments, {:.0}% of one core",
            t.events as f64 / t.secs,
            t.events as f64 * 100.0 / t.segments as f64,
            t.dropped,
            cpu * 1e3 / (t.segments as f64 / 1e6),
            cpu / t.secs * 100.0
        );
    }
}
