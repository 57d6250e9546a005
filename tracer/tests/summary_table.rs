//! Summary mode's flow table in the kernel (`FLOW_TABLE`: 65,536 slots in
//! two-way sets), driven with `BPF_PROG_TEST_RUN` over crafted frames: with
//! three times more flows than slots, so that flows keep losing their
//! slots, no late segment is ever kept back, and every frame is either
//! emitted or counted as summarized. With few flows the table keeps them
//! all and in-order segments stay in the kernel.

mod common;

use aya::{
    maps::PerCpuArray,
    programs::{TestRun, TestRunOptions, Xdp},
    Ebpf, EbpfLoader,
};
use tracer_common::{
    counter, CounterBlock, KernelLayout, SegmentEvent, OPT_BELOW_HIGH, OPT_SAMPLED, SUMMARY_FLOWS,
};

use common::root_or_skip;
use tracer::kernel::{RingLayout, Rings};

const SAMPLE: u32 = 64;
const MSS: u16 = 1448;

struct Program {
    ebpf: Ebpf,
    rings: Rings,
}

impl Program {
    fn load() -> Self {
        let mut ebpf = EbpfLoader::new()
            .override_global("KERNEL_LAYOUT", &KernelLayout::default(), true)
            .override_global("SUMMARY_SAMPLE", &SAMPLE, true)
            .load(tracer::EBPF_OBJECT)
            .expect("loading the eBPF object");
        let p: &mut Xdp = ebpf.program_mut("tag_rx").unwrap().try_into().unwrap();
        p.load().expect("loading tag_rx");
        let rings = Rings::create(&mut ebpf, 16 << 20, RingLayout::Single).expect("rings");
        Self { ebpf, rings }
    }

    /// Runs `tag_rx` once over `frame`.
    fn run(&mut self, frame: &[u8]) {
        let p: &mut Xdp = self.ebpf.program_mut("tag_rx").unwrap().try_into().unwrap();
        let r = p
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat: 1,
                ..Default::default()
            })
            .expect("BPF_PROG_TEST_RUN");
        assert_eq!(r.return_value, 2, "XDP_PASS");
    }

    /// The events in the ring.
    fn drain(&mut self) -> Vec<SegmentEvent> {
        let mut out = Vec::new();
        while let Some(r) = self.rings.next_record() {
            assert!(r.len() >= size_of::<SegmentEvent>(), "a short record");
            // SAFETY: a SegmentEvent written by tag_rx; read unaligned.
            out.push(unsafe { std::ptr::read_unaligned(r.as_ptr().cast::<SegmentEvent>()) });
        }
        out
    }

    fn counter(&self, index: u32) -> u64 {
        let c: PerCpuArray<_, CounterBlock> =
            PerCpuArray::try_from(self.ebpf.map("COUNTERS").unwrap()).unwrap();
        c.get(&0, 0)
            .unwrap()
            .iter()
            .map(|b| b[index as usize])
            .sum()
    }
}

/// Flow `i`'s segment number `n` (0-based, `MSS` bytes each). Flows go to
/// scattered addresses of 10/8 (a permutation of the 24 bits): as many
/// flows in order of address would spread over the table's sets exactly
/// evenly (6 a set, all pushing each other out), as real ones do not.
fn segment(i: u32, n: u32) -> Vec<u8> {
    let mut x = i & 0xff_ffff;
    x ^= x >> 12;
    x = x.wrapping_mul(0x9e_3779) & 0xff_ffff;
    x ^= x >> 11;
    let daddr = [10, (x >> 16) as u8, (x >> 8) as u8, x as u8];
    tracer_ebpf::test_frames::segment(daddr, 40000, 1_000_000 + n * u32::from(MSS), MSS.into())
}

/// Sends every flow's segment `n`, draining the ring as it goes; returns
/// the events, and the flows they came from in order.
fn round(p: &mut Program, flows: u32, n: u32) -> Vec<SegmentEvent> {
    let mut events = Vec::new();
    for i in 0..flows {
        p.run(&segment(i, n));
        if i % 8192 == 8191 {
            events.extend(p.drain());
        }
    }
    events.extend(p.drain());
    events
}

/// Per flow: segment 1 first (it overtakes), then segment 0 (late), then
/// segment 2 (in order after both). Returns the events of each round.
fn late_after_overtaker(flows: u32) -> (Program, [Vec<SegmentEvent>; 3]) {
    let mut p = Program::load();
    let overtakers = round(&mut p, flows, 1);
    let late = round(&mut p, flows, 0);
    let in_order = round(&mut p, flows, 2);
    (p, [overtakers, late, in_order])
}

#[test]
fn no_late_segment_is_kept_back_when_flows_outnumber_the_table() {
    if !root_or_skip("no_late_segment_is_kept_back_when_flows_outnumber_the_table") {
        return;
    }
    let flows = 3 * SUMMARY_FLOWS;
    let (p, [overtakers, late, in_order]) = late_after_overtaker(flows);
    // Every flow's first segment goes out.
    assert_eq!(overtakers.len() as u32, flows);
    // Every late one too: below the highest byte of a flow that kept its
    // slot, or the first of one that lost it.
    assert_eq!(late.len() as u32, flows, "late segments kept in the kernel");
    let mut kept = 0;
    for ev in &late {
        assert!(
            ev.options & (OPT_BELOW_HIGH | OPT_SAMPLED) != 0,
            "a late segment emitted without its reason: {:#x}",
            ev.options
        );
        kept += u32::from(ev.options & OPT_BELOW_HIGH != 0);
    }
    // Some flows kept their slots through a round of 196,608 others.
    assert!(kept > 0, "no flow kept its state");
    let summarized = p.counter(counter::XDP_SUMMARIZED);
    let emitted = p.counter(counter::XDP_EMITTED);
    assert_eq!(p.counter(counter::XDP_DROPPED), 0);
    assert_eq!(
        emitted + summarized,
        u64::from(3 * flows),
        "every frame emitted or counted"
    );
    assert_eq!(
        emitted,
        (overtakers.len() + late.len() + in_order.len()) as u64
    );
    eprintln!(
        "{flows} flows: {kept} late segments found below their flow's high mark, the rest as new flows; in order after them: {} emitted, {summarized} summarized",
        in_order.len()
    );
}

#[test]
fn few_flows_keep_their_state_and_in_order_segments_stay_in_the_kernel() {
    if !root_or_skip("few_flows_keep_their_state_and_in_order_segments_stay_in_the_kernel") {
        return;
    }
    let flows = 1_000;
    let (p, [overtakers, late, in_order]) = late_after_overtaker(flows);
    assert_eq!(overtakers.len() as u32, flows);
    assert_eq!(late.len() as u32, flows);
    // 1,000 flows in 32,768 sets: a set with three of them is rare (0.15
    // expected); each costs a few re-inserted flows.
    let below = late
        .iter()
        .filter(|e| e.options & OPT_BELOW_HIGH != 0)
        .count() as u32;
    assert!(
        below >= flows - 6,
        "{below} of {flows} late segments found late"
    );
    assert!(
        in_order.len() <= 6,
        "{} in-order segments emitted (each flow's third, not sampled)",
        in_order.len()
    );
    assert_eq!(
        p.counter(counter::XDP_SUMMARIZED),
        u64::from(flows) - in_order.len() as u64
    );
}
