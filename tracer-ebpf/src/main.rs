//! The tracer's kernel programs: parse, tag, emit, count. No policy.
//!
//! * `tag_rx` (XDP): every received TCP segment, with its RX queue and CPU.
//! * `tcp_probe0..2` (tp_btf on `tcp_probe`): the order and CPU at which TCP
//!   itself processes received segments, with the socket's srtt, cwnd,
//!   snd_una and snd_nxt.
//! * `tcp_rtx0..2` (tp_btf on `tcp_retransmit_skb`): segments this host
//!   retransmits.
//! * `count_pass` (XDP): the overhead benchmark's counter-only baseline;
//!   `emit_floor` (XDP): its floor of full mode (a clock read and an event).
//!
//! Three copies of each tracepoint program cover the runs the kernel skips
//! when a program is already running on a CPU (see `LAST_COPY`).
//!
//! Struct offsets for the tracepoint programs come from userspace, which
//! resolves them from the running kernel's BTF (`KERNEL_LAYOUT`).
#![cfg_attr(target_arch = "bpf", no_std, no_main, feature(asm_experimental_arch))]

#[cfg(not(target_arch = "bpf"))]
fn main() {
    panic!("tracer-ebpf is built for the bpf target by tracer/build.rs");
}

#[cfg(target_arch = "bpf")]
mod programs {
    use core::cell::UnsafeCell;

    use aya_ebpf::{
        bindings::{xdp_action, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
        btf_maps::{ArrayOfMaps, RingBuf as BtfRingBuf},
        helpers::{
            bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_ringbuf_query,
            bpf_skc_to_tcp_sock, bpf_xdp_get_buff_len, bpf_xdp_load_bytes,
        },
        macros::{btf_map, btf_tracepoint, map, xdp},
        maps::{lpm_trie::Key, ring_buf::RingBufEntry, LpmTrie, PerCpuArray},
        programs::{BtfTracePointContext, XdpContext},
        Global,
    };
    use tracer_common::{
        counter, kind, tcp_flags, AddrKey, CapturedSegment, CounterBlock, FilterConfig, FlowAddrs,
        KernelLayout, PortSet, ProbeEvent, RetransmitEvent, SegmentEvent, CAPTURED_HEADER,
        CAPTURE_MAX, FAMILY_IPV4, FAMILY_IPV6, FILTER_ADDRS, FILTER_PORTS, OPT_SAMPLED,
    };

    use tracer_ebpf::{
        frames::XdpFrame,
        parse::{self, ParseError},
        summary::{self, Decision, FlowSet, SegmentHead},
    };

    const BPF_F_NO_PREALLOC: u32 = 1;
    const AF_INET: u16 = 2;
    const AF_INET6: u16 = 10;

    /// The records' ring buffers, one per CPU, indexed by CPU: a CPU's
    /// programs never wait on another's producer lock, and the collector
    /// merges the rings back into time order. Userspace creates the rings
    /// and fills every slot before it attaches anything (one ring in every
    /// slot: the single ring of `--rings single`); the template's size is
    /// not theirs. Slots: sized to the possible CPUs at load time.
    #[btf_map]
    static EVENTS: ArrayOfMaps<EventRing, 4096> = ArrayOfMaps::new();
    type EventRing = BtfRingBuf<u8, { 1 << 16 }>;

    /// This CPU's ring.
    #[inline(always)]
    fn events(cpu: u32) -> Option<&'static EventRing> {
        EVENTS.get(cpu)
    }

    /// The bytes waiting in `ring` (committed or not).
    #[inline(always)]
    fn pending(ring: &EventRing) -> u64 {
        // SAFETY: a ring map's address, as the lookup gave it.
        unsafe {
            bpf_ringbuf_query(
                (ring as *const EventRing).cast_mut().cast(),
                BPF_RB_AVAIL_DATA as u64,
            )
        }
    }
    /// Every counter (`tracer_common::counter`), one block per CPU: a
    /// program looks its CPU's block up once, however much it counts.
    #[map]
    static COUNTERS: PerCpuArray<CounterBlock> = PerCpuArray::with_max_entries(1, 0);
    /// Per-CPU room for the segment being parsed (and its frame's bytes
    /// when capturing): the 512-byte BPF stack cannot hold it next to the
    /// parser's own state.
    #[map]
    static SCRATCH: PerCpuArray<CapturedSegment> = PerCpuArray::with_max_entries(1, 0);
    /// Summary mode's per-flow state (`summary`): sets of two flows, picked
    /// by the flow's hash. A global array (the object's .bss, a map the
    /// program addresses directly), not a map lookup: an LRU hash map cost
    /// 36 ns a lookup here (hashing a 40-byte key, its LRU lists), and even
    /// an array map's lookup is a call to LLVM, which then keeps what the
    /// program holds in memory around it.
    struct FlowTable(UnsafeCell<[FlowSet; summary::SETS as usize]>);

    // SAFETY: see `summary::decide` on concurrent updates.
    unsafe impl Sync for FlowTable {}

    #[unsafe(no_mangle)]
    static FLOW_TABLE: FlowTable =
        FlowTable(UnsafeCell::new([FlowSet::EMPTY; summary::SETS as usize]));
    /// The port filter, indexed by port (1: wanted), set at load time: a
    /// plain load, where a map lookup (a call to LLVM) makes it keep what
    /// the program holds in memory around it, and a hash map cost 20 ns.
    #[unsafe(no_mangle)]
    static PORTS: Global<PortSet> = Global::new([0; 65_536]);
    #[map]
    static ADDRS: LpmTrie<AddrKey, u8> = LpmTrie::with_max_entries(64, BPF_F_NO_PREALLOC);

    #[unsafe(no_mangle)]
    static KERNEL_LAYOUT: Global<KernelLayout> = Global::new(KernelLayout {
        skb_cb: 0,
        skb_iif: 0,
        skb_head: 0,
        skb_end: 0,
        shinfo_gso_segs: 0,
        skb_data: 0,
        tcb_seq: 0,
        tcb_end_seq: 0,
        tcb_ack_seq: 0,
        tcb_tcp_flags: 0,
        sk_family: 0,
        sk_daddr: 0,
        sk_rcv_saddr: 0,
        sk_v6_daddr: 0,
        sk_v6_rcv_saddr: 0,
        sk_dport: 0,
        sk_num: 0,
        sk_net: 0,
        net_inum: 0,
        tp_srtt_us: 0,
        tp_snd_cwnd: 0,
        tp_snd_una: 0,
        tp_snd_nxt: 0,
        tp_rcv_nxt: 0,
        tp_ts_recent: 0,
        sk_owned: 0,
        rtx_err: 0,
    });

    /// Ring bytes waiting before an event wakes the collector (set at load
    /// time: an eighth of the ring).
    #[unsafe(no_mangle)]
    static WAKEUP_BYTES: Global<u32> = Global::new(1 << 20);

    /// Summary mode (for 10-100 GbE hosts): 0 off (every segment emitted);
    /// N: only segments that start below or above the flow's highest byte,
    /// that changed queue or CPU, and one in N of the rest are emitted; at
    /// the TCP layer, only skbs TCP does not take in order, and one in N of
    /// the rest. All are counted.
    #[unsafe(no_mangle)]
    static SUMMARY_SAMPLE: Global<u32> = Global::new(0);

    /// Overload (full mode): while the ring holds more than
    /// `OVERLOAD_MARKS[0]` bytes the programs behave as summary mode with
    /// this sample, until it drains below `OVERLOAD_MARKS[1]`: a collector
    /// that falls behind loses segments' detail, never their counts. 0:
    /// never (full-mode events are dropped when the ring is full).
    #[unsafe(no_mangle)]
    static OVERLOAD_SAMPLE: Global<u32> = Global::new(0);
    /// (high-water, low-water) ring bytes, set at load time.
    #[unsafe(no_mangle)]
    static OVERLOAD_MARKS: Global<[u64; 2]> = Global::new([u64::MAX, 0]);

    /// 1 while this CPU's ring is overloaded: each CPU's, as each has its
    /// ring; switched by an atomic exchange (a softirq's run can interrupt
    /// a process-context one on the CPU) so that each switch is counted
    /// once.
    #[map]
    static OVERLOADED: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

    /// The summary sample to act on: the user's, or while this CPU's ring
    /// is overloaded `OVERLOAD_SAMPLE`, else 0 (every event emitted).
    /// Counts each switch with `count`.
    #[inline(always)]
    fn sample(cpu: u32, count: impl Fn(u32)) -> u32 {
        let user = SUMMARY_SAMPLE.load();
        let overload = OVERLOAD_SAMPLE.load();
        if user != 0 || overload == 0 {
            return user;
        }
        let (Some(ring), Some(state)) = (events(cpu), OVERLOADED.get_ptr_mut(0)) else {
            return 0;
        };
        let pending = pending(ring);
        // SAFETY: this CPU's value, a valid, aligned u64.
        let now = unsafe { core::ptr::read_volatile(state) };
        let marks = OVERLOAD_MARKS.load();
        let want = if now == 0 {
            u64::from(pending > marks[0])
        } else {
            u64::from(pending >= marks[1])
        };
        if want != now {
            // SAFETY: as above; BPF_XCHG: only the run that changes the
            // state counts the switch.
            let before = unsafe { exchange(state, want) };
            if before != want {
                count(if want == 1 {
                    counter::OVERLOAD_ENTERED
                } else {
                    counter::OVERLOAD_LEFT
                });
            }
        }
        if want == 1 {
            overload
        } else {
            0
        }
    }

    /// Atomically stores `v` at `at`; what was there.
    #[inline(always)]
    unsafe fn exchange(at: *mut u64, mut v: u64) -> u64 {
        // SAFETY: the caller's pointer is valid and aligned.
        unsafe { core::arch::asm!("{0} = xchg_64({1} + 0, {0})", inout(reg) v, in(reg) at) };
        v
    }

    /// Frame bytes to capture with each segment: 0 none (the plain segment
    /// event); else at least the headers, up to this many bytes of the frame
    /// (set at load time while recording a pcapng trace).
    #[unsafe(no_mangle)]
    static CAPTURE_SNAPLEN: Global<u32> = Global::new(0);

    /// The user's filter (set at load time: a constant to the verifier,
    /// which drops the code of the filters not asked for).
    #[unsafe(no_mangle)]
    static FILTER: Global<FilterConfig> = Global::new(FilterConfig {
        flags: 0,
        ifindex: 0,
        netns_inum: 0,
        _pad: 0,
    });

    /// A u32 field of a load-time global struct, at `at` (its `offset_of!`):
    /// one load, where `load()` reads every field (and LLVM then keeps
    /// them all, in memory).
    #[inline(always)]
    fn global_u32<T>(global: &Global<T>, at: usize) -> u32 {
        // SAFETY: `Global` is a transparent wrapper of its value, which has
        // a u32 at `at`.
        unsafe {
            core::ptr::read_volatile(
                (global as *const Global<T>)
                    .cast::<u8>()
                    .add(at)
                    .cast::<u32>(),
            )
        }
    }

    /// A field's offset from `KERNEL_LAYOUT`.
    macro_rules! offset {
        ($field:ident) => {
            global_u32(&KERNEL_LAYOUT, core::mem::offset_of!(KernelLayout, $field))
        };
    }

    /// A field of `FILTER`.
    macro_rules! filter {
        ($field:ident) => {
            global_u32(&FILTER, core::mem::offset_of!(FilterConfig, $field))
        };
    }

    #[inline(always)]
    fn filter_flags() -> u32 {
        filter!(flags)
    }

    /// This CPU's block of `COUNTERS`.
    #[derive(Clone, Copy)]
    struct Counts(*mut CounterBlock);

    impl Counts {
        #[inline(always)]
        fn this_cpu() -> Option<Self> {
            COUNTERS.get_ptr_mut(0).map(Counts)
        }

        /// Counts one event from XDP. XDP runs never nest on a CPU, so a
        /// plain increment of this CPU's count is exact.
        #[inline(always)]
        fn add(self, index: u32) {
            // SAFETY: this CPU's block, and no other XDP run on this CPU.
            if let Some(n) = unsafe { (*self.0).get_mut(index as usize) } {
                *n += 1;
            }
        }

        /// Adds `n` to a count from XDP.
        #[inline(always)]
        fn add_n(self, index: u32, n: u32) {
            // SAFETY: this CPU's block, and no other XDP run on this CPU.
            if let Some(total) = unsafe { (*self.0).get_mut(index as usize) } {
                *total += u64::from(n);
            }
        }

        /// Counts one event from a tracepoint program, which a softirq can
        /// interrupt on the same CPU between a load and a store: atomic add.
        #[inline(always)]
        fn add_nestable(self, index: u32) {
            // SAFETY: this CPU's block.
            if let Some(n) = unsafe { (*self.0).get_mut(index as usize) } {
                // SAFETY: a valid, aligned u64 in the map value. (The bpf
                // target has no core atomics; this is the BPF_ATOMIC add
                // instruction.)
                unsafe {
                    core::arch::asm!("lock *(u64 *)({0} + 0) += {1}", in(reg) n, in(reg) 1u64)
                };
            }
        }
    }

    /// Writes one event into the ring (bpf_ringbuf_output: reserve, copy,
    /// submit) and counts it as emitted, or as dropped if the ring is full.
    ///
    /// The collector is woken once, by the event that brings the waiting
    /// bytes to WAKEUP_BYTES (else it wakes on its own every 50 ms; while
    /// data waits, its poll returns at once anyway). Woken for every event
    /// (an interrupt and a context switch each), it spent 705 ms of CPU per
    /// million segments in the lab bench; this way, about 300. (Forcing a
    /// wake-up for every event past the mark cost 4 us an event.)
    #[inline(always)]
    fn emit<T: ?Sized>(ev: &T, cpu: u32, count: impl Fn(u32), emitted: u32, dropped: u32) {
        let Some(ring) = events(cpu) else {
            count(dropped);
            return;
        };
        let pending = pending(ring);
        match ring.output_untyped::<T>(ev, wakeup_flags(pending, core::mem::size_of_val(ev) as u64))
        {
            Ok(()) => count(emitted),
            Err(_) => count(dropped),
        }
    }

    /// Whether an event of `size` bytes, added to the `pending` bytes
    /// waiting before it, wakes the collector (see `emit`).
    #[inline(always)]
    fn wakeup_flags(pending: u64, size: u64) -> u64 {
        let mark = u64::from(WAKEUP_BYTES.load());
        u64::from(if pending < mark && pending + size >= mark {
            BPF_RB_FORCE_WAKEUP
        } else {
            BPF_RB_NO_WAKEUP
        })
    }

    /// The counter of frames the parser turned away for `err`.
    #[inline(always)]
    fn parse_error_counter(err: ParseError) -> u32 {
        match err {
            ParseError::NonTcp => counter::XDP_NON_TCP,
            ParseError::Truncated => counter::XDP_TRUNCATED,
            ParseError::Unsupported => counter::XDP_UNSUPPORTED,
            ParseError::Fragment => counter::XDP_FRAGMENTS,
        }
    }

    /// The user's port and address filter (see `FilterConfig`).
    #[inline(always)]
    fn wanted(filter: u32, addrs: &FlowAddrs) -> bool {
        if filter & FILTER_PORTS != 0 && !port_wanted(addrs.sport) && !port_wanted(addrs.dport) {
            return false;
        }
        if filter & FILTER_ADDRS != 0
            && ADDRS
                .get(&Key::new(128, addr_key(addrs.family, &addrs.saddr)))
                .is_none()
            && ADDRS
                .get(&Key::new(128, addr_key(addrs.family, &addrs.daddr)))
                .is_none()
        {
            return false;
        }
        true
    }

    #[inline(always)]
    fn port_wanted(port: u16) -> bool {
        // Masked where LLVM cannot drop it: a 6.1 verifier keeps no bounds
        // through a byte swap (a socket's port), and refuses an unbounded
        // index.
        let i = opaque(u32::from(port)) & 0xffff;
        // SAFETY: Global is a transparent wrapper of the array; any u16
        // indexes it.
        unsafe {
            core::ptr::read_volatile(&raw const (*(&raw const PORTS).cast::<PortSet>())[i as usize])
                != 0
        }
    }

    /// IPv4 addresses are looked up as `::ffff:a.b.c.d`.
    #[inline(always)]
    fn addr_key(family: u8, addr: &[u8; 16]) -> AddrKey {
        if family == FAMILY_IPV4 {
            let mut key = [0u8; 16];
            key[10] = 0xff;
            key[11] = 0xff;
            key[12..].copy_from_slice(&addr[..4]);
            key
        } else {
            *addr
        }
    }

    #[xdp(frags)]
    pub fn tag_rx(ctx: XdpContext) -> u32 {
        let Some(c) = Counts::this_cpu() else {
            return xdp_action::XDP_PASS;
        };
        c.add(counter::XDP_FRAMES);
        // First, while nothing else is held: to LLVM a call, around which it
        // would keep the quick path's values in memory.
        let cpu = unsafe { bpf_get_smp_processor_id() };
        let queue = ctx.rx_queue_index();
        let filter = filter_flags();
        let sample = sample(cpu, |i| c.add_nestable(i));
        // The common frame (plain IPv4) in summary mode, or under a port
        // filter, decided on its fixed fields alone: most segments are only
        // counted (or filtered out), never parsed further. `quick`: counted,
        // filtered and (summary mode) decided there, to emit for the reasons
        // in `quick_why` (with `quick_summarized` and `quick_end`), only
        // stored below, never branched on: the verifier then walks the
        // parser once, not once per reason. (The verifier drops this path when neither applies: both
        // are constants to it. With an address filter: the general path.)
        let mut quick = false;
        let mut quick_why = 0;
        let mut quick_summarized = 0;
        let mut quick_end = 0;
        if (sample != 0 || filter & FILTER_PORTS != 0) && filter & FILTER_ADDRS == 0 {
            if let Some(p) = parse::plain_ipv4(&XdpFrame::new(&ctx)) {
                let ports = p.ports();
                c.add(counter::XDP_TCP);
                if filter & FILTER_PORTS != 0
                    && !port_wanted((ports >> 16) as u16)
                    && !port_wanted(ports as u16)
                {
                    c.add(counter::XDP_FILTERED);
                    return xdp_action::XDP_PASS;
                }
                if sample != 0 {
                    let seg = SegmentHead {
                        tag: summary::ipv4_flow_tag(p.addrs(), ports),
                        seq: p.seq(),
                        payload_len: p.payload_len(),
                        tcp_flags: p.tcp_flags(),
                    };
                    let d = summarize(&seg, queue, cpu, sample);
                    if d.why == 0 {
                        c.add(counter::XDP_SUMMARIZED);
                        c.add_n(counter::XDP_SUMMARIZED_BYTES, seg.payload_len);
                        return xdp_action::XDP_PASS;
                    }
                    (quick_why, quick_summarized, quick_end) =
                        (d.why, d.summarized, d.summarized_end);
                }
                quick = true;
            }
        }
        let snaplen = CAPTURE_SNAPLEN.load();
        if sample == 0 && filter == 0 && snaplen == 0 && emit_in_place(&ctx, c, queue, cpu) {
            return xdp_action::XDP_PASS;
        }
        let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
            return xdp_action::XDP_PASS;
        };
        // SAFETY: this CPU's scratch slot; XDP does not nest on a CPU.
        let scratch = unsafe { &mut *scratch };
        let ev = &mut scratch.event;
        parse::zero_words(ev);
        if let Err(err) = parse::parse_segment(&XdpFrame::new(&ctx), ev) {
            c.add(parse_error_counter(err));
            return xdp_action::XDP_PASS;
        }
        ev.rx_queue = queue;
        ev.cpu = cpu;
        if !quick {
            c.add(counter::XDP_TCP);
            if !wanted(filter, &ev.addrs) {
                c.add(counter::XDP_FILTERED);
                return xdp_action::XDP_PASS;
            }
            if sample != 0 {
                let d = summarize(&SegmentHead::of(ev), queue, cpu, sample);
                if d.why == 0 {
                    c.add(counter::XDP_SUMMARIZED);
                    c.add_n(counter::XDP_SUMMARIZED_BYTES, ev.payload_len);
                    return xdp_action::XDP_PASS;
                }
                ev.options |= d.why;
                ev.summarized = d.summarized;
                ev.summarized_end = d.summarized_end;
            }
        }
        ev.options |= quick_why;
        ev.summarized |= quick_summarized;
        ev.summarized_end |= quick_end;
        // (The clock and the interface only for what is emitted.)
        ev.kind = kind::XDP_SEGMENT;
        ev.ifindex = ctx.ingress_ifindex() as u32;
        ev.ts_ns = unsafe { bpf_ktime_get_ns() };
        if snaplen == 0 {
            emit(
                ev,
                cpu,
                |i| c.add(i),
                counter::XDP_EMITTED,
                counter::XDP_DROPPED,
            );
        } else {
            emit_captured(&ctx, c, scratch, cpu, snaplen);
        }
        xdp_action::XDP_PASS
    }

    /// Full mode with nothing to filter or capture, the common case: the
    /// segment is parsed straight into its place in the ring (reserve,
    /// parse, commit), where a copy from the scratch slot cost 22 ns.
    /// What is not TCP is handed back (discarded) and counted. False if
    /// the ring is full: the general path then parses, counts and drops.
    #[inline(never)]
    fn emit_in_place(ctx: &XdpContext, c: Counts, queue: u32, cpu: u32) -> bool {
        let Some(ring) = events(cpu) else {
            return false;
        };
        let Some(mut slot) = ring.reserve_untyped::<SegmentEvent>(0) else {
            return false;
        };
        // SAFETY: the reserved record's bytes, ours until submitted or
        // discarded; zeroed before they are read.
        let ev = unsafe { &mut *slot.as_mut_ptr() };
        parse::zero_words(ev);
        if let Err(err) = parse::parse_segment(&XdpFrame::new(ctx), ev) {
            slot.discard(BPF_RB_NO_WAKEUP as u64);
            c.add(parse_error_counter(err));
            return true;
        }
        c.add(counter::XDP_TCP);
        ev.rx_queue = queue;
        ev.cpu = cpu;
        ev.kind = kind::XDP_SEGMENT;
        ev.ifindex = ctx.ingress_ifindex() as u32;
        submit(ring, slot, c);
        true
    }

    /// Timestamps a reserved segment record and commits it, waking the
    /// collector if it brings the ring to the mark (see `emit`).
    #[inline(always)]
    fn submit(ring: &EventRing, mut slot: RingBufEntry<SegmentEvent>, c: Counts) {
        // SAFETY: the reserved record's bytes, ours until submitted.
        unsafe { (*slot.as_mut_ptr()).ts_ns = bpf_ktime_get_ns() };
        // The ring's waiting bytes already hold this record.
        let size = core::mem::size_of::<SegmentEvent>() as u64;
        slot.submit(wakeup_flags(pending(ring) - size, size));
        c.add(counter::XDP_EMITTED);
    }

    /// Summary mode: updates the segment's flow in `FLOW_TABLE` and says
    /// whether (and why) it must be emitted.
    #[inline(always)]
    fn summarize(seg: &SegmentHead, queue: u32, cpu: u32, sample: u32) -> Decision {
        // SAFETY: see `summary::decide` on concurrent updates.
        let table = unsafe { &mut *FLOW_TABLE.0.get() };
        let Some(set) = table.get_mut(summary::set_index(seg.tag) as usize) else {
            return Decision {
                why: OPT_SAMPLED,
                summarized: 0,
                summarized_end: 0,
            };
        };
        summary::decide(set, seg, queue, cpu, sample)
    }

    /// The overhead benchmark's baseline (`cargo xtask bench`): count the
    /// frame and pass it, as the XDP paper's counter-only program does.
    /// Never attached by the tracer.
    #[xdp]
    pub fn count_pass(_ctx: XdpContext) -> u32 {
        if let Some(c) = Counts::this_cpu() {
            c.add(counter::XDP_FRAMES);
        }
        xdp_action::XDP_PASS
    }

    /// The benchmark's floor of full mode: what every emitted segment costs
    /// whatever the parser does, the clock read and an event's reserve and
    /// commit (with the wake-up check), on top of `count_pass`. The event
    /// holds only its kind and time. Never attached by the tracer.
    #[xdp]
    pub fn emit_floor(ctx: XdpContext) -> u32 {
        let Some(c) = Counts::this_cpu() else {
            return xdp_action::XDP_PASS;
        };
        c.add(counter::XDP_FRAMES);
        let cpu = unsafe { bpf_get_smp_processor_id() };
        let Some(ring) = events(cpu) else {
            return xdp_action::XDP_PASS;
        };
        let Some(mut slot) = ring.reserve_untyped::<SegmentEvent>(0) else {
            c.add(counter::XDP_DROPPED);
            return xdp_action::XDP_PASS;
        };
        // SAFETY: the reserved record's bytes, ours until submitted.
        let ev = unsafe { &mut *slot.as_mut_ptr() };
        ev.kind = kind::XDP_SEGMENT;
        ev.ifindex = ctx.ingress_ifindex() as u32;
        submit(ring, slot, c);
        xdp_action::XDP_PASS
    }

    /// Emits the segment with its frame's first bytes: the headers, or
    /// `snaplen` bytes if more, at most the frame and [`CAPTURE_MAX`].
    #[inline(always)]
    fn emit_captured(
        ctx: &XdpContext,
        counts: Counts,
        c: &mut CapturedSegment,
        cpu: u32,
        snaplen: u32,
    ) {
        c.event.kind = kind::XDP_CAPTURED;
        let wire_len = unsafe { bpf_xdp_get_buff_len(ctx.ctx) } as u32;
        let want = snaplen
            .max(u32::from(c.event.header_len))
            .min(wire_len)
            .min(CAPTURE_MAX as u32);
        c.wire_len = wire_len;
        c.caplen = 0;
        if want > 0 {
            // For the verifier: 1..=CAPTURE_MAX (a power of two), and for
            // every value `want` can take, the same value.
            let len = (opaque(want - 1) & (CAPTURE_MAX as u32 - 1)) + 1;
            // SAFETY: `data` has room for CAPTURE_MAX bytes; the helper
            // checks the packet side (fragments too).
            let ret = unsafe { bpf_xdp_load_bytes(ctx.ctx, 0, c.data.as_mut_ptr().cast(), len) };
            if ret == 0 {
                c.caplen = len;
            } else {
                counts.add(counter::XDP_CAPTURE_FAILED);
            }
        }
        let size = CAPTURED_HEADER + (opaque(c.caplen) & (CAPTURE_MAX as u32 * 2 - 1)) as usize;
        let size = size.min(core::mem::size_of::<CapturedSegment>());
        // SAFETY: `size` bytes from the start of `c`, within it.
        let bytes = unsafe {
            core::slice::from_raw_parts((c as *const CapturedSegment).cast::<u8>(), size)
        };
        emit::<[u8]>(
            bytes,
            cpu,
            |i| counts.add(i),
            counter::XDP_EMITTED,
            counter::XDP_DROPPED,
        );
    }

    /// The value, hidden from LLVM's range reasoning so that the mask after
    /// it stays in the code (the verifier's bound).
    #[inline(always)]
    fn opaque(mut v: u32) -> u32 {
        // SAFETY: a register move onto itself.
        unsafe { core::arch::asm!("{0} = {0}", inout(reg) v) };
        v
    }

    #[inline(always)]
    unsafe fn read<T: Copy>(base: *const u8, offset: u32) -> Result<T, i32> {
        unsafe { bpf_probe_read_kernel(base.add(offset as usize).cast::<T>()) }
    }

    /// A field of a kernel object whose type the verifier knows (a `tp_btf`
    /// argument, or a struct pointer read from one), at an offset from
    /// `KERNEL_LAYOUT` (read-only, so a constant to the verifier): one load
    /// instruction, checked against the type's BTF when the program loads
    /// and made fault-safe by the kernel. `read` costs a helper call.
    #[inline(always)]
    unsafe fn field<T: Copy>(base: *const u8, offset: u32) -> T {
        unsafe { core::ptr::read_volatile(base.add(offset as usize).cast::<T>()) }
    }

    /// Whether `sk` lives in the traced network namespace (`FILTER`'s; 0:
    /// any).
    #[inline(always)]
    unsafe fn in_netns(sk: *const u8) -> bool {
        let inum = filter!(netns_inum);
        if inum == 0 {
            return true;
        }
        let net: *const u8 = unsafe { field(sk, offset!(sk_net)) };
        unsafe { field::<u32>(net, offset!(net_inum)) == inum }
    }

    /// The socket's two ends; `remote_first` puts the peer in `saddr`.
    #[inline(always)]
    unsafe fn sock_addrs(sk: *const u8, remote_first: bool) -> Result<FlowAddrs, i32> {
        let mut a = FlowAddrs::default();
        let family: u16 = unsafe { field(sk, offset!(sk_family)) };
        let remote_port = u16::from_be(unsafe { field(sk, offset!(sk_dport)) });
        let local_port: u16 = unsafe { field(sk, offset!(sk_num)) };
        let (remote, local) = if remote_first {
            (a.sport, a.dport) = (remote_port, local_port);
            (&mut a.saddr, &mut a.daddr)
        } else {
            (a.sport, a.dport) = (local_port, remote_port);
            (&mut a.daddr, &mut a.saddr)
        };
        // In 32-bit words, as they sit in the socket (FlowAddrs is
        // 4-aligned: word stores, not byte by byte).
        let copy = |to: &mut [u8; 16], at: u32, words: usize| {
            for i in 0..words {
                let w: u32 = unsafe { field(sk, at + 4 * i as u32) };
                // SAFETY: within `to`, 4-aligned.
                unsafe { to.as_mut_ptr().cast::<u32>().add(i).write(w) };
            }
        };
        if family == AF_INET6 {
            copy(remote, offset!(sk_v6_daddr), 4);
            copy(local, offset!(sk_v6_rcv_saddr), 4);
            a.family = FAMILY_IPV6;
        } else if family == AF_INET {
            copy(remote, offset!(sk_daddr), 1);
            copy(local, offset!(sk_rcv_saddr), 1);
            a.family = FAMILY_IPV4;
        } else {
            return Err(-1);
        }
        Ok(a)
    }

    /// `seq`, `end_seq`, `ack_seq` and the flags byte of the skb's
    /// `struct tcp_skb_cb`.
    #[inline(always)]
    unsafe fn skb_tcp_cb(skb: *const u8) -> (u32, u32, u32, u8) {
        let cb = offset!(skb_cb);
        let seq = unsafe { field(skb, cb + offset!(tcb_seq)) };
        let end_seq = unsafe { field(skb, cb + offset!(tcb_end_seq)) };
        let ack_seq = unsafe { field(skb, cb + offset!(tcb_ack_seq)) };
        // tcp_flags is a u8 on older kernels and a u16 on newer ones; the
        // TCP header flag bits are the low byte either way (little endian).
        let flags: u8 = unsafe { field(skb, cb + offset!(tcb_tcp_flags)) };
        (seq, end_seq, ack_seq, flags)
    }

    // The kernel does not run a tracing program on a CPU where that program
    // is already running (from its wrapper's entry to its exit): it counts a
    // "recursion miss" and goes on with the tracepoint's next program. With
    // preemption off in tracepoints, TCP's hits nest at most one deep on a
    // CPU: its socket code runs either holding the socket (`sk_lock.owned`:
    // process context, e.g. backlog processing in release_sock), which only
    // a softirq interrupts, or without it (softirq, or bottom halves off),
    // which nothing interrupts. So each tracepoint has three copies, run in
    // attach order: holding the socket all three always run; without it at
    // most the one copy the interrupted run is inside is skipped. Per CPU,
    // tracepoint and context, the copy that ran last tells hits apart: a
    // hit's copies run in rising order, its first is copy 0 or 1 and its
    // last copy 1 or 2, so a copy numbered no higher than the last one to
    // run starts a new hit, and takes it. (A kernel that preempts
    // tracepoints, PREEMPT_RT, breaks this; it still shows in the counts:
    // the first copy's runs plus its kernel-counted misses are all the hits,
    // the `*_SEEN` counters the hits handled.)

    /// Per CPU, tracepoint and context (`Tracepoint::slot` * 2, + 1 without
    /// the socket held): the copy that ran last there, plus one (0: none).
    #[map]
    static LAST_COPY: PerCpuArray<u32> = PerCpuArray::with_max_entries(4, 0);

    /// Summary mode: per CPU, tcp_probe skbs taken in order until the next
    /// one sampled.
    #[map]
    static TCP_SAMPLE: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

    /// One traced tracepoint: its `LAST_COPY` slot and its counters.
    struct Tracepoint {
        slot: u32,
        first_copy_runs: u32,
        seen: u32,
        filtered: u32,
        emitted: u32,
        dropped: u32,
        read_errors: u32,
        /// (Only tcp_probe summarizes.)
        summarized: Option<u32>,
    }

    /// What a tracepoint program made of a hit.
    enum Outcome<T> {
        Emit(T),
        /// Outside the traced interface, namespace or filter.
        Filtered,
        /// Summary mode: counted, not emitted.
        Summarized,
    }

    const TCP_PROBE: Tracepoint = Tracepoint {
        slot: 0,
        first_copy_runs: counter::PROBE_FIRST_COPY_RUNS,
        seen: counter::PROBE_SEEN,
        filtered: counter::PROBE_FILTERED,
        emitted: counter::PROBE_EMITTED,
        dropped: counter::PROBE_DROPPED,
        read_errors: counter::PROBE_READ_ERRORS,
        summarized: Some(counter::PROBE_SUMMARIZED),
    };

    const TCP_RETRANSMIT: Tracepoint = Tracepoint {
        slot: 1,
        first_copy_runs: counter::RTX_FIRST_COPY_RUNS,
        seen: counter::RTX_SEEN,
        filtered: counter::RTX_FILTERED,
        emitted: counter::RTX_EMITTED,
        dropped: counter::RTX_DROPPED,
        read_errors: counter::RTX_READ_ERRORS,
        summarized: None,
    };

    /// Copy `copy` of a tracepoint program on socket `sk`: builds and emits
    /// the event with `build` if this copy is the one to take the hit,
    /// counting the outcome.
    #[inline(always)]
    fn run_copy<T>(
        tp: &Tracepoint,
        copy: u32,
        sk: *const u8,
        build: impl FnOnce() -> Result<Outcome<T>, i32>,
    ) {
        // SAFETY: a tp_btf `struct sock *` argument.
        let held: i32 = unsafe { field(sk, offset!(sk_owned)) };
        let context = tp.slot * 2 + u32::from(held == 0);
        let (Some(last), Some(c)) = (LAST_COPY.get_ptr_mut(context), Counts::this_cpu()) else {
            return;
        };
        if copy == 0 {
            c.add_nestable(tp.first_copy_runs);
        }
        // SAFETY: this CPU's slot for this context, which no run nested in
        // this one touches (see above).
        let before = unsafe { core::mem::replace(&mut *last, copy + 1) };
        if before != 0 && copy >= before {
            return;
        }
        c.add_nestable(tp.seen);
        match build() {
            Ok(Outcome::Emit(ev)) => {
                let cpu = unsafe { bpf_get_smp_processor_id() };
                emit(&ev, cpu, |i| c.add_nestable(i), tp.emitted, tp.dropped)
            }
            Ok(Outcome::Filtered) => c.add_nestable(tp.filtered),
            Ok(Outcome::Summarized) => {
                if let Some(summarized) = tp.summarized {
                    c.add_nestable(summarized)
                }
            }
            Err(_) => c.add_nestable(tp.read_errors),
        }
    }

    /// One tp_btf program per copy.
    macro_rules! copies {
        ($tracepoint:literal, $tp:expr, $build:ident, $($name:ident = $copy:literal),+) => {$(
            #[btf_tracepoint(function = $tracepoint)]
            pub fn $name(ctx: BtfTracePointContext) -> i32 {
                run_copy(&$tp, $copy, ctx.arg(0), || unsafe { $build(&ctx) });
                0
            }
        )+};
    }

    copies!(
        "tcp_probe",
        TCP_PROBE,
        try_tcp_probe,
        tcp_probe0 = 0,
        tcp_probe1 = 1,
        tcp_probe2 = 2
    );
    copies!(
        "tcp_retransmit_skb",
        TCP_RETRANSMIT,
        try_tcp_retransmit,
        tcp_rtx0 = 0,
        tcp_rtx1 = 1,
        tcp_rtx2 = 2
    );

    /// The TSval of the TCP header at `th`, if its options start with the
    /// aligned timestamp (NOP, NOP, kind 8, length 10), as Linux's
    /// `tcp_parse_aligned_timestamp` reads it. One read of the header's
    /// first 28 bytes (past a bare 20-byte header it reads bytes of the
    /// skb's buffer that are not looked at): each read is a helper call.
    #[inline(always)]
    unsafe fn aligned_tsval(th: *const u8) -> Result<(u8, u32), i32> {
        let h: [u8; 28] = unsafe { read(th, 0)? };
        let kind = u32::from_ne_bytes([h[20], h[21], h[22], h[23]]);
        if h[12] >> 4 < 8 || kind != u32::from_ne_bytes([1, 1, 8, 10]) {
            return Ok((0, 0));
        }
        Ok((1, u32::from_be_bytes([h[24], h[25], h[26], h[27]])))
    }

    // Not inlined: its own stack frame keeps each copy's within the BPF limit.
    #[inline(never)]
    unsafe fn try_tcp_probe(ctx: &BtfTracePointContext) -> Result<Outcome<ProbeEvent>, i32> {
        let sk: *const u8 = ctx.arg(0);
        let skb: *const u8 = ctx.arg(1);
        let iif: u32 = unsafe { field(skb, offset!(skb_iif)) };
        let ifindex = filter!(ifindex);
        if ifindex != 0 && iif != ifindex {
            return Ok(Outcome::Filtered);
        }
        if !unsafe { in_netns(sk) } {
            return Ok(Outcome::Filtered);
        }
        let addrs = unsafe { sock_addrs(sk, true)? };
        if !wanted(filter_flags(), &addrs) {
            return Ok(Outcome::Filtered);
        }
        let (seq, end_seq, ack_seq, flags) = unsafe { skb_tcp_cb(skb) };
        let tp = unsafe { bpf_skc_to_tcp_sock(sk as *mut _) } as *const u8;
        if tp.is_null() {
            return Err(-1);
        }
        let rcv_nxt: u32 = unsafe { field(tp, offset!(tp_rcv_nxt)) };
        let ts_recent: u32 = unsafe { field(tp, offset!(tp_ts_recent)) };
        let (has_tsval, tsval) = unsafe { aligned_tsval(field(skb, offset!(skb_data)))? };
        let sample = match Counts::this_cpu() {
            Some(c) => sample(unsafe { bpf_get_smp_processor_id() }, |i| c.add_nestable(i)),
            None => SUMMARY_SAMPLE.load(),
        };
        if sample != 0 {
            let paws =
                has_tsval != 0 && ts_recent != 0 && (ts_recent.wrapping_sub(tsval) as i32) > 1;
            let control = flags & (tcp_flags::SYN | tcp_flags::FIN | tcp_flags::RST) != 0;
            if seq == rcv_nxt && !paws && !control && !tcp_sampled(sample) {
                return Ok(Outcome::Summarized);
            }
        }
        let head: *const u8 = unsafe { field(skb, offset!(skb_head)) };
        let end: u32 = unsafe { field(skb, offset!(skb_end)) };
        // Behind a byte pointer: no type for the verifier, so probe reads.
        let gso_segs = unsafe { read(head, end.wrapping_add(offset!(shinfo_gso_segs)))? };
        let control =
            u32::from(flags & tcp_flags::SYN != 0) + u32::from(flags & tcp_flags::FIN != 0);
        Ok(Outcome::Emit(ProbeEvent {
            kind: kind::TCP_PROBE,
            tcp_flags: flags,
            gso_segs,
            cpu: unsafe { bpf_get_smp_processor_id() },
            ts_ns: unsafe { bpf_ktime_get_ns() },
            ifindex: iif,
            payload_len: end_seq.wrapping_sub(seq).wrapping_sub(control),
            addrs,
            seq,
            end_seq,
            ack_seq,
            srtt_us: unsafe { field(tp, offset!(tp_srtt_us)) },
            snd_cwnd: unsafe { field(tp, offset!(tp_snd_cwnd)) },
            snd_una: unsafe { field(tp, offset!(tp_snd_una)) },
            snd_nxt: unsafe { field(tp, offset!(tp_snd_nxt)) },
            rcv_nxt,
            tsval,
            ts_recent,
            has_tsval,
            ..ProbeEvent::default()
        }))
    }

    /// Summary mode at the TCP layer: one in `sample` of the skbs TCP takes
    /// in order is emitted (this CPU's countdown; a run nested in another
    /// can only blur which one).
    #[inline(always)]
    fn tcp_sampled(sample: u32) -> bool {
        let Some(left) = TCP_SAMPLE.get_ptr_mut(0) else {
            return true;
        };
        // SAFETY: this CPU's slot.
        unsafe {
            if *left == 0 {
                *left = sample - 1;
                true
            } else {
                *left -= 1;
                false
            }
        }
    }

    #[inline(always)]
    unsafe fn try_tcp_retransmit(
        ctx: &BtfTracePointContext,
    ) -> Result<Outcome<RetransmitEvent>, i32> {
        let sk: *const u8 = ctx.arg(0);
        let skb: *const u8 = ctx.arg(1);
        // Before Linux 6.17 the tracepoint has no `err` and fires only for
        // retransmissions that were sent.
        let err: i32 = if offset!(rtx_err) != 0 { ctx.arg(2) } else { 0 };
        if !unsafe { in_netns(sk) } {
            return Ok(Outcome::Filtered);
        }
        let addrs = unsafe { sock_addrs(sk, false)? };
        if !wanted(filter_flags(), &addrs) {
            return Ok(Outcome::Filtered);
        }
        let (seq, end_seq, _, flags) = unsafe { skb_tcp_cb(skb) };
        Ok(Outcome::Emit(RetransmitEvent {
            kind: kind::RETRANSMIT,
            tcp_flags: flags,
            cpu: unsafe { bpf_get_smp_processor_id() },
            ts_ns: unsafe { bpf_ktime_get_ns() },
            addrs,
            seq,
            end_seq,
            err,
            ..RetransmitEvent::default()
        }))
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 4] = *b"GPL\0";
}
