//! The lab's edge stage: an emulated flow-director NIC between the lab's
//! client and server. Not part of the tracer; `tracer lab` loads it into
//! the edge namespace only.
//!
//! * `edge_steer` (XDP, on the link from the client): looks each TCP
//!   packet's flow up in the flow-director table (learning new flows onto
//!   its RSS queue: Toeplitz over the indirection table, as a NIC), numbers data segments in arrival order and, in
//!   `MODE_STEER`, redirects the packet to the CPU that serves the flow's
//!   queue (CPUMAP). Userspace re-points table entries while the transfer
//!   runs: packets already queued for the old CPU then race the new ones,
//!   which is how ATR reorders.
//! * `edge_egress` (tc egress, on the link to the server): sets the
//!   packet's queue on the multi-queue veth (the server's RX queue) to the
//!   one decided at ingress and emits one ground-truth event per data
//!   segment, in the order segments leave the edge.
#![cfg_attr(target_arch = "bpf", no_std, no_main, feature(asm_experimental_arch))]

#[cfg(not(target_arch = "bpf"))]
fn main() {
    panic!("lab-edge is built for the bpf target by tracer/build.rs");
}

#[cfg(target_arch = "bpf")]
mod programs {
    use aya_ebpf::{
        bindings::{xdp_action, TC_ACT_OK},
        helpers::{bpf_get_smp_processor_id, bpf_ktime_get_ns},
        macros::{classifier, map, xdp},
        maps::{Array, CpuMap, HashMap, LruHashMap, PerCpuArray, RingBuf},
        programs::{TcContext, XdpContext},
    };
    use tracer_common::{
        edge::{
            counter, Arrivals, EdgeConfig, EdgeEvent, SegKey, Steered, INDIR_ENTRIES, MODE_STEER,
            UNMATCHED,
        },
        rss::{ipv4_input, ipv6_input, toeplitz},
        SegmentEvent, FAMILY_IPV4,
    };
    use tracer_ebpf::{
        frames::{SkbFrame, XdpFrame},
        parse::{self, Frame},
    };

    /// The most CPUs the CPU map covers.
    const MAX_CPUS: u32 = 64;

    #[map]
    static CONFIG: Array<EdgeConfig> = Array::with_max_entries(1, 0);
    /// The flow-director table: flow -> RX queue at the server. The
    /// program learns new flows onto their RSS queue; userspace re-points.
    #[map]
    static FLOWS: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);
    /// The RSS indirection table: entry -> RX queue.
    #[map]
    static INDIR: Array<u32> = Array::with_max_entries(INDIR_ENTRIES, 0);
    /// Per flow: its RSS queue, learned with it.
    #[map]
    static RSS_QUEUE: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);
    /// Per flow: TCP segments that left on another queue than their RSS
    /// queue (the truth the tracer's RSS check is held to).
    #[map]
    static OFF_RSS: HashMap<u32, u64> = HashMap::with_max_entries(1024, 0);
    /// Per flow: what entered the edge so far.
    #[map]
    static ARRIVALS: HashMap<u32, Arrivals> = HashMap::with_max_entries(1024, 0);
    /// Queue -> the CPU serving it.
    #[map]
    static QUEUE_CPU: Array<u32> = Array::with_max_entries(64, 0);
    #[map]
    static CPUS: CpuMap = CpuMap::with_max_entries(MAX_CPUS, 0);
    /// Ingress decisions of segments in flight through the edge.
    #[map]
    static IN_FLIGHT: LruHashMap<SegKey, Steered> = LruHashMap::with_max_entries(65_536, 0);
    #[map]
    static TRUTH: RingBuf = RingBuf::with_byte_size(8 << 20, 0);
    #[map]
    static EDGE_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);
    #[map]
    static SCRATCH: PerCpuArray<SegmentEvent> = PerCpuArray::with_max_entries(1, 0);

    /// Counts on this CPU. Neither program nests on a CPU (XDP and tc run
    /// in softirq or with bottom halves off), so a plain add is exact.
    #[inline(always)]
    fn count(index: u32) {
        if let Some(slot) = EDGE_COUNTERS.get_ptr_mut(index) {
            // SAFETY: this CPU's slot.
            unsafe { *slot += 1 }
        }
    }

    /// Parses into this CPU's scratch slot: the segment or None (not TCP,
    /// or not parsable: passed untouched).
    #[inline(always)]
    fn parse_tcp<F: Frame>(frame: &F) -> Option<&'static mut SegmentEvent> {
        let ev = SCRATCH.get_ptr_mut(0)?;
        // SAFETY: this CPU's scratch slot; the programs do not nest.
        let ev = unsafe { &mut *ev };
        *ev = SegmentEvent::default();
        parse::parse_segment(frame, ev).ok()?;
        Some(ev)
    }

    #[inline(always)]
    fn flow_key(ev: &SegmentEvent) -> u32 {
        (u32::from(ev.addrs.sport) << 16) | u32::from(ev.addrs.dport)
    }

    #[inline(always)]
    fn seg_key(ev: &SegmentEvent, flow: u32) -> SegKey {
        SegKey {
            flow,
            seq: ev.seq,
            ident: if ev.addrs.family == FAMILY_IPV4 {
                u32::from(ev.ip_id)
            } else {
                ev.tsval
            },
        }
    }

    /// The RX queue RSS picks for the segment's flow.
    #[inline(always)]
    fn rss_queue(ev: &SegmentEvent, cfg: &EdgeConfig) -> u32 {
        let a = &ev.addrs;
        let hash = if a.family == FAMILY_IPV4 {
            let v4 = |x: &[u8; 16]| [x[0], x[1], x[2], x[3]];
            toeplitz(
                &cfg.rss_key,
                &ipv4_input(v4(&a.saddr), v4(&a.daddr), a.sport, a.dport),
            )
        } else {
            toeplitz(
                &cfg.rss_key,
                &ipv6_input(a.saddr, a.daddr, a.sport, a.dport),
            )
        };
        INDIR.get(hash % cfg.indir_len.max(1)).copied().unwrap_or(0)
    }

    #[xdp]
    pub fn edge_steer(ctx: XdpContext) -> u32 {
        count(counter::FRAMES);
        let Some(ev) = parse_tcp(&XdpFrame::new(&ctx)) else {
            return xdp_action::XDP_PASS;
        };
        count(counter::TCP);
        let cfg = CONFIG.get(0).copied().unwrap_or_default();
        let key = flow_key(ev);
        // SAFETY: a copy of a map value.
        let queue = match unsafe { FLOWS.get(&key) } {
            Some(&q) => q,
            None => {
                let q = rss_queue(ev, &cfg);
                let _ = RSS_QUEUE.insert(key, q, 0);
                // (Created here, so that egress only adds to it.)
                let _ = OFF_RSS.insert(key, 0, 0);
                if FLOWS.insert(key, q, 0).is_ok() {
                    count(counter::FLOWS_LEARNED);
                }
                q
            }
        };
        let cpu = if cfg.mode == MODE_STEER {
            QUEUE_CPU.get(queue).copied().unwrap_or(0)
        } else {
            unsafe { bpf_get_smp_processor_id() }
        };
        if ev.payload_len > 0 {
            if ARRIVALS.get_ptr_mut(key).is_none() {
                let _ = ARRIVALS.insert(key, Arrivals::default(), 0);
            }
            let Some(arrivals) = ARRIVALS.get_ptr_mut(key) else {
                return xdp_action::XDP_PASS;
            };
            // SAFETY: a map value; one XDP run at a time per flow (the link
            // from the client has one queue).
            let arrivals = unsafe { &mut *arrivals };
            let end = ev.seq.wrapping_add(ev.payload_len);
            // Serial-number comparison (RFC 1982).
            let below = arrivals.count > 0 && (ev.seq.wrapping_sub(arrivals.end) as i32) < 0;
            if arrivals.count == 0 || (end.wrapping_sub(arrivals.end) as i32) > 0 {
                arrivals.end = end;
            }
            let steered = Steered {
                index: arrivals.count,
                ingress_ns: unsafe { bpf_ktime_get_ns() },
                queue,
                cpu,
                retransmission: u32::from(below),
                _pad: 0,
            };
            arrivals.count += 1;
            // A transmission whose original never left (lost inside the
            // edge, e.g. its CPU queue was full) leaves a stale entry that
            // the LRU ages out; its retransmission has its own key.
            let _ = IN_FLIGHT.insert(seg_key(ev, key), steered, 0);
        }
        if cfg.mode != MODE_STEER {
            return xdp_action::XDP_PASS;
        }
        match CPUS.redirect(cpu, u64::from(xdp_action::XDP_PASS)) {
            Ok(action) => action,
            Err(action) => {
                count(counter::REDIRECT_FAILED);
                action
            }
        }
    }

    #[classifier]
    pub fn edge_egress(ctx: TcContext) -> i32 {
        let Some(ev) = parse_tcp(&SkbFrame(&ctx)) else {
            return TC_ACT_OK;
        };
        let key = flow_key(ev);
        // SAFETY: a copy of a map value.
        let table_queue = unsafe { FLOWS.get(&key) }.copied();
        if ev.payload_len == 0 {
            // Control segments follow the table.
            if let Some(q) = table_queue {
                set_queue(&ctx, q);
                off_rss(key, q);
            }
            return TC_ACT_OK;
        }
        count(counter::EGRESS_DATA);
        let seg = seg_key(ev, key);
        // SAFETY: copied out before the entry is removed.
        let steered = match unsafe { IN_FLIGHT.get(&seg) }.copied() {
            Some(s) => {
                let _ = IN_FLIGHT.remove(&seg);
                s
            }
            None => {
                count(counter::EGRESS_UNMATCHED);
                Steered {
                    index: UNMATCHED,
                    queue: table_queue.unwrap_or(0),
                    cpu: u32::MAX,
                    ..Steered::default()
                }
            }
        };
        set_queue(&ctx, steered.queue);
        off_rss(key, steered.queue);
        let truth = EdgeEvent {
            ingress_ns: steered.ingress_ns,
            egress_ns: unsafe { bpf_ktime_get_ns() },
            index: steered.index,
            flow: key,
            seq: ev.seq,
            payload_len: ev.payload_len,
            queue: steered.queue,
            cpu: steered.cpu,
            egress_cpu: unsafe { bpf_get_smp_processor_id() },
            retransmission: steered.retransmission,
        };
        match TRUTH.output::<EdgeEvent>(&truth, 0) {
            Ok(()) => count(counter::TRUTH_EMITTED),
            Err(_) => count(counter::TRUTH_DROPPED),
        }
        TC_ACT_OK
    }

    /// Counts a segment of `flow` leaving on `queue` when that is not the
    /// flow's RSS queue.
    #[inline(always)]
    fn off_rss(flow: u32, queue: u32) {
        // SAFETY: a copy of a map value.
        if unsafe { RSS_QUEUE.get(&flow) }.is_none_or(|&q| q == queue) {
            return;
        }
        if let Some(n) = OFF_RSS.get_ptr_mut(flow) {
            // SAFETY: a map value, aligned; atomic, as the flow's segments
            // leave on several CPUs at once in the `atr` mode.
            unsafe { core::arch::asm!("lock *(u64 *)({0} + 0) += {1}", in(reg) n, in(reg) 1u64) };
        }
    }

    /// Sends the packet out on `queue` of the multi-queue veth (the
    /// server's RX queue `queue`).
    #[inline(always)]
    fn set_queue(ctx: &TcContext, queue: u32) {
        // The core's transmit-queue pick reads a queue_mapping of v as
        // "received on queue v - 1" and keeps that queue.
        // SAFETY: tc programs may write the __sk_buff's queue_mapping.
        unsafe { (*ctx.skb.skb).queue_mapping = queue + 1 };
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 4] = *b"GPL\0";
}
