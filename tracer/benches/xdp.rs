//! The XDP program's cost per segment against a counter-only `XDP_PASS`
//! program (`count_pass`, the XDP paper's baseline at about 13 ns a
//! packet), both run by the kernel (`BPF_PROG_TEST_RUN`) over the same
//! synthetic TCP frame in one run (`cargo xtask bench`; root). Also
//! `tag_rx` while recording a pcapng trace (its headers copied into the
//! ring), with a port filter that keeps nothing (parsing and two port
//! lookups, no event), and in summary mode (per-flow state, one in 64
//! emitted) against full mode on the same in-order ACK; and full mode's
//! floor (`emit_floor`: the clock read and an event, nothing parsed).
//!
//! Each program runs ROUNDS batches of BATCH runs, interleaved with the
//! others; the ring is drained between batches, so no event is dropped
//! (checked), as in a tracer that keeps up. Times are the kernel's: the
//! mean of a batch's runs in whole nanoseconds (rounded down, so a ratio
//! above 1 reads about 1% high). The clock around the system call cannot
//! stand in: the call swaps the XDP dispatcher, 16 ms whatever the batch.

#[path = "common/target.rs"]
mod target;
use target::Target;

use aya::{
    programs::{TestRun, TestRunOptions, Xdp},
    EbpfLoader,
};
use tracer::kernel::{RingLayout, Rings};
use tracer_common::{counter, CounterBlock, FilterConfig, KernelLayout, FILTER_PORTS};

const BATCH: u32 = 20_000;
const ROUNDS: usize = 120;

/// The benchmark's segment: one flow, `payload` bytes at sequence 1000.
fn frame(payload: u16) -> Vec<u8> {
    tracer_ebpf::test_frames::segment([10, 0, 0, 2], 40000, 1000, payload.into())
}

/// One loaded copy of the object, with `program` ready to run over `data`.
struct Loaded {
    name: &'static str,
    ebpf: aya::Ebpf,
    rings: Rings,
    program: &'static str,
    data: Vec<u8>,
    /// The kernel's mean nanoseconds a run, each round's batch.
    ns: Vec<f64>,
}

/// How a copy is loaded: frame bytes captured, summary mode's sample, the
/// filter.
#[derive(Default)]
struct Setup {
    snaplen: u32,
    summary: u32,
    filter: FilterConfig,
}

impl Loaded {
    fn new(name: &'static str, program: &'static str, setup: Setup, data: Vec<u8>) -> Self {
        // As the tracer lays them out: a ring per CPU, sharing the default
        // total.
        let cpus = aya::util::nr_cpus().expect("possible CPUs") as u32;
        let total = tracer::kernel::DEFAULT_RING_BYTES;
        let ring = tracer::kernel::rings::ring_bytes(total, RingLayout::PerCpu, cpus);
        let mut ebpf = EbpfLoader::new()
            .override_global("KERNEL_LAYOUT", &KernelLayout::default(), true)
            .override_global("CAPTURE_SNAPLEN", &setup.snaplen, true)
            .override_global("SUMMARY_SAMPLE", &setup.summary, true)
            .override_global("FILTER", &setup.filter, true)
            // As the tracer sets it: an eighth of a ring.
            .override_global("WAKEUP_BYTES", &(ring / 8), true)
            .map_max_entries("EVENTS", cpus)
            .load(tracer::EBPF_OBJECT)
            .expect("loading the eBPF object");
        let rings = Rings::create(&mut ebpf, total, RingLayout::PerCpu).expect("rings");
        let p: &mut Xdp = ebpf.program_mut(program).unwrap().try_into().unwrap();
        p.load().expect("loading the XDP program");
        Self {
            name,
            ebpf,
            rings,
            program,
            data,
            ns: Vec::new(),
        }
    }

    fn batch(&mut self) {
        let p: &mut Xdp = self
            .ebpf
            .program_mut(self.program)
            .unwrap()
            .try_into()
            .unwrap();
        let r = p
            .test_run(TestRunOptions {
                data_in: Some(&self.data),
                repeat: BATCH,
                ..Default::default()
            })
            .expect("BPF_PROG_TEST_RUN");
        assert_eq!(r.return_value, 2, "XDP_PASS");
        self.ns.push(r.duration.as_nanos() as f64);
        while self.rings.next_record().is_some() {}
    }

    /// The mean time of a run.
    fn ns(&self) -> f64 {
        self.ns.iter().sum::<f64>() / self.ns.len() as f64
    }

    fn ratio(&self, base: &Loaded) -> f64 {
        self.ns() / base.ns()
    }

    /// The per-CPU counter, summed.
    fn counter(&mut self, index: u32) -> u64 {
        let c: aya::maps::PerCpuArray<_, CounterBlock> =
            aya::maps::PerCpuArray::try_from(self.ebpf.map("COUNTERS").unwrap()).unwrap();
        c.get(&0, 0)
            .unwrap()
            .iter()
            .map(|b| b[index as usize])
            .sum()
    }
}

fn main() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("xdp benchmark: skipped: needs root (BPF_PROG_TEST_RUN)");
        return;
    }
    let data = || frame(1448);
    // A port filter with no port: every segment parsed, its two ports
    // looked up and the segment filtered out (no event, no clock read).
    let port_filter = Setup {
        filter: FilterConfig {
            flags: FILTER_PORTS,
            ..Default::default()
        },
        ..Setup::default()
    };
    let filtered = Loaded::new("tag_rx, filtered out", "tag_rx", port_filter, data());
    let capture = Setup {
        snaplen: 1,
        ..Setup::default()
    };
    let summary = Setup {
        summary: 64,
        ..Setup::default()
    };
    let mut programs = [
        Loaded::new(
            "count_pass (baseline)",
            "count_pass",
            Setup::default(),
            data(),
        ),
        Loaded::new("tag_rx", "tag_rx", Setup::default(), data()),
        // Full mode's floor: the clock read and an event's reserve and
        // commit alone (no parse).
        Loaded::new(
            "emit_floor (clock + event)",
            "emit_floor",
            Setup::default(),
            data(),
        ),
        Loaded::new("tag_rx, recording pcapng", "tag_rx", capture, data()),
        filtered,
        // The baseline again, on the ACK the next two run over.
        Loaded::new(
            "count_pass on the ACK",
            "count_pass",
            Setup::default(),
            frame(0),
        ),
        // Summary mode's common case: a segment of a flow it follows, in
        // order, on the same queue and CPU: counted in the flow's state,
        // one in 64 emitted. (A pure ACK, the same each run: a data
        // segment repeated would start below the flow's highest byte.)
        Loaded::new("tag_rx, ACK", "tag_rx", Setup::default(), frame(0)),
        Loaded::new("tag_rx, ACK, summary 1/64", "tag_rx", summary, frame(0)),
    ];
    for _ in 0..ROUNDS {
        for p in programs.iter_mut() {
            p.batch();
        }
    }
    println!(
        "xdp benchmark: BPF_PROG_TEST_RUN, {} runs each over one TCP frame (1514 bytes; the ACKs 66), interleaved in batches of {BATCH}",
        ROUNDS as u32 * BATCH,
    );
    // Each program against the baseline on its frame.
    let base_of = |i: usize| if i < 5 { 0 } else { 5 };
    for i in 0..programs.len() {
        let dropped = programs[i].counter(counter::XDP_DROPPED);
        let emitted = programs[i].counter(counter::XDP_EMITTED);
        let p = &programs[i];
        assert_eq!(dropped, 0, "{}: events dropped", p.name);
        println!(
            "  {:<28} {:>7.1} ns/packet  {:>5.2}x the baseline  ({emitted} events, 0 dropped)",
            p.name,
            p.ns(),
            p.ratio(&programs[base_of(i)])
        );
    }
    for (name, i, bound) in [
        ("tag_rx", 1, 2.5),
        ("summary mode", 7, 1.15),
        ("filtered out", 4, 1.5),
    ] {
        let ratio = programs[i].ratio(&programs[base_of(i)]);
        println!(
            "  {name:<12} / count_pass   {ratio:.2}x ({})",
            Target::AtMost(bound).say(ratio, &format!("{bound}x"))
        );
    }
    // What full mode cannot go below while it times every segment and
    // hands it over, and what is left to the parser and the rest.
    let (full, floor, base) = (programs[1].ns(), programs[2].ns(), programs[0].ns());
    println!(
        "  full mode's floor (clock + event) {:.2}x count_pass; tag_rx is {:.1} ns above it",
        floor / base,
        full - floor
    );
}
