//! Types shared by the eBPF programs (`tracer-ebpf`) and userspace (`tracer`).
//!
//! Everything here is `#[repr(C)]` plain data: the kernel writes these bytes
//! into the ring buffer and maps, and userspace reads them back. A change of
//! layout must be made on both sides at once, which is why they live here.
#![no_std]

/// Ring-buffer record kinds. Every record starts with a `u8` kind.
pub mod kind {
    /// A TCP segment seen by XDP ([`crate::SegmentEvent`]).
    pub const XDP_SEGMENT: u8 = 1;
    /// A segment processed by TCP's receive path ([`crate::ProbeEvent`]).
    pub const TCP_PROBE: u8 = 2;
    /// A local retransmission ([`crate::RetransmitEvent`]).
    pub const RETRANSMIT: u8 = 3;
    /// A TCP segment seen by XDP, with the frame's first bytes
    /// ([`crate::CapturedSegment`]; written while recording a pcapng trace).
    pub const XDP_CAPTURED: u8 = 4;
}

/// Where every record keeps its `bpf_ktime_get_ns()` timestamp (a `u64`
/// at this byte offset): the collector merges the CPUs' rings by it.
pub const RECORD_TS_AT: usize = 8;
const _: () = {
    assert!(core::mem::offset_of!(SegmentEvent, ts_ns) == RECORD_TS_AT);
    assert!(core::mem::offset_of!(CapturedSegment, event) == 0);
    assert!(core::mem::offset_of!(ProbeEvent, ts_ns) == RECORD_TS_AT);
    assert!(core::mem::offset_of!(RetransmitEvent, ts_ns) == RECORD_TS_AT);
};

/// TCP flag bits, as in the TCP header's flags byte.
pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
    pub const ECE: u8 = 0x40;
    pub const CWR: u8 = 0x80;
}

/// Address family values used in [`FlowAddrs::family`].
pub const FAMILY_IPV4: u8 = 4;
pub const FAMILY_IPV6: u8 = 6;

/// The addresses and ports of a segment, in the direction it travelled.
///
/// IPv4 addresses sit in the first four bytes of `saddr`/`daddr`, the rest is
/// zero. Ports are in host byte order. 4-aligned (every event has it at a
/// multiple of 8), so that the kernel writes addresses a word at a time.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowAddrs {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub family: u8,
    pub _pad: [u8; 3],
}

/// One SACK block (left edge, right edge), host byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SackBlock {
    pub left: u32,
    pub right: u32,
}

/// Most SACK blocks a TCP header can carry (40 option bytes).
pub const MAX_SACK_BLOCKS: usize = 4;

/// [`SegmentEvent::options`] bit: the TCP timestamp option was present.
pub const OPT_TIMESTAMP: u8 = 0x01;
/// [`SegmentEvent::options`] bit: the frame carried at least one VLAN tag.
pub const OPT_VLAN: u8 = 0x02;
/// [`SegmentEvent::options`] bit: the IPv4 More-Fragments flag was set (first
/// fragment; later fragments carry no TCP header and are only counted).
pub const OPT_FIRST_FRAGMENT: u8 = 0x04;
/// [`SegmentEvent::options`] bit (summary mode): emitted because its data
/// starts below the flow's highest sequence seen (late, or resent).
pub const OPT_BELOW_HIGH: u8 = 0x08;
/// ... because it starts above it (it opened a hole).
pub const OPT_JUMP: u8 = 0x10;
/// ... because it arrived on another RX queue or CPU than the flow's last.
pub const OPT_MOVED: u8 = 0x20;
/// ... as one of the sample of the rest (or a SYN, FIN or RST).
pub const OPT_SAMPLED: u8 = 0x40;

/// Flows summary mode follows at once in the kernel (in sets of two; a new
/// flow replaces the set's least recently used).
pub const SUMMARY_FLOWS: u32 = 65_536;

/// A TCP segment as XDP saw it on the receiving interface.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentEvent {
    pub kind: u8,
    pub tcp_flags: u8,
    /// Number of valid entries in `sack`.
    pub sack_count: u8,
    /// `OPT_*` bits.
    pub options: u8,
    pub rx_queue: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    pub ifindex: u32,
    pub cpu: u32,
    pub addrs: FlowAddrs,
    pub seq: u32,
    pub ack: u32,
    /// TCP payload bytes (IP length minus IP and TCP headers).
    pub payload_len: u32,
    /// Raw window field (unscaled).
    pub window: u16,
    /// IPv4 identification field; 0 for IPv6.
    pub ip_id: u16,
    pub tsval: u32,
    pub tsecr: u32,
    /// Outermost VLAN ID (12 bits) when `OPT_VLAN` is set.
    pub vlan: u16,
    /// Bytes from the frame's start to the end of the TCP header.
    pub header_len: u16,
    /// Summary mode: this flow's data segments the kernel counted, in
    /// order, without emitting them, since its previous emitted segment.
    pub summarized: u32,
    /// Summary mode, with `summarized` > 0: one past the last byte those
    /// segments carried (the flow's highest before this one): they filled
    /// the sequence space up to it, in order.
    pub summarized_end: u32,
    pub sack: [SackBlock; MAX_SACK_BLOCKS],
}

/// Most frame bytes a [`CapturedSegment`] carries (`--snaplen`'s bound).
pub const CAPTURE_MAX: usize = 4096;

/// A segment event with the first bytes of its frame: the headers, or up
/// to the snapshot length asked for (never fewer than the headers). The
/// record in the ring ends after `caplen` bytes of `data`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CapturedSegment {
    /// `kind` is [`kind::XDP_CAPTURED`].
    pub event: SegmentEvent,
    /// Bytes of `data` that follow; 0 if they could not be copied
    /// (`counter::XDP_CAPTURE_FAILED`).
    pub caplen: u32,
    /// The frame's length (all its fragments).
    pub wire_len: u32,
    pub data: [u8; CAPTURE_MAX],
}

/// Bytes of a [`CapturedSegment`] before its `data`.
pub const CAPTURED_HEADER: usize = core::mem::size_of::<SegmentEvent>() + 8;

/// A segment (possibly a GRO-coalesced run of them) as TCP's receive path
/// processed it (`tcp_probe` tracepoint), with the socket's state.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeEvent {
    pub kind: u8,
    pub tcp_flags: u8,
    /// `skb_shinfo(skb)->gso_segs`: how many wire segments GRO merged into
    /// this skb (0 for one that was never merged).
    pub gso_segs: u16,
    pub cpu: u32,
    pub ts_ns: u64,
    /// `skb->skb_iif`: the interface the segment arrived on.
    pub ifindex: u32,
    /// TCP payload bytes (`end_seq - seq`, without SYN/FIN).
    pub payload_len: u32,
    /// Remote end as source, local end as destination.
    pub addrs: FlowAddrs,
    pub seq: u32,
    pub end_seq: u32,
    pub ack_seq: u32,
    pub srtt_us: u32,
    pub snd_cwnd: u32,
    pub snd_una: u32,
    pub snd_nxt: u32,
    pub rcv_nxt: u32,
    /// The segment's TSval, when it carries the timestamp option in the
    /// aligned layout (NOP, NOP, TS) that Linux's fast path parses
    /// (`has_tsval`); and the socket's `rx_opt.ts_recent`. Together they
    /// decide PAWS, which discards the segment after this tracepoint.
    pub tsval: u32,
    pub ts_recent: u32,
    pub has_tsval: u8,
    pub _pad: [u8; 7],
}

/// A segment this host retransmitted (`tcp_retransmit_skb` tracepoint).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetransmitEvent {
    pub kind: u8,
    pub tcp_flags: u8,
    pub _pad: [u8; 2],
    pub cpu: u32,
    pub ts_ns: u64,
    /// Local end as source, remote end as destination.
    pub addrs: FlowAddrs,
    pub seq: u32,
    pub end_seq: u32,
    /// The tracepoint's `err` argument (0: sent).
    pub err: i32,
    pub _pad2: u32,
}

/// Indices into the per-CPU `COUNTERS` array. Every drop and skip is counted.
pub mod counter {
    /// Frames XDP looked at.
    pub const XDP_FRAMES: u32 = 0;
    /// TCP segments XDP parsed completely.
    pub const XDP_TCP: u32 = 1;
    /// Frames that are not TCP (ARP, UDP, ICMP, other ethertypes...).
    pub const XDP_NON_TCP: u32 = 2;
    /// Frames whose headers were cut short or malformed.
    pub const XDP_TRUNCATED: u32 = 3;
    /// IPv6 extension-header chains the parser does not follow (too long,
    /// ESP, unknown header).
    pub const XDP_UNSUPPORTED: u32 = 4;
    /// Non-first IP fragments (no TCP header to read).
    pub const XDP_FRAGMENTS: u32 = 5;
    /// TCP segments skipped by the user's filter.
    pub const XDP_FILTERED: u32 = 6;
    /// Segment events written to the ring buffer.
    pub const XDP_EMITTED: u32 = 7;
    /// Segment events lost because the ring buffer was full.
    pub const XDP_DROPPED: u32 = 8;
    /// `tcp_probe` events handled (by whichever copy of the program).
    pub const PROBE_SEEN: u32 = 9;
    /// `tcp_probe` hits outside the traced interface/namespace or filter.
    pub const PROBE_FILTERED: u32 = 10;
    pub const PROBE_EMITTED: u32 = 11;
    pub const PROBE_DROPPED: u32 = 12;
    /// Kernel memory reads that failed (the event is not emitted).
    pub const PROBE_READ_ERRORS: u32 = 13;
    pub const RTX_SEEN: u32 = 14;
    pub const RTX_FILTERED: u32 = 15;
    pub const RTX_EMITTED: u32 = 16;
    pub const RTX_DROPPED: u32 = 17;
    pub const RTX_READ_ERRORS: u32 = 18;
    /// Runs of the first copy of the tracepoint programs: with the runs the
    /// kernel skipped for that copy, every time the tracepoint fired.
    pub const PROBE_FIRST_COPY_RUNS: u32 = 19;
    pub const RTX_FIRST_COPY_RUNS: u32 = 20;
    /// Captured segments whose frame bytes could not be copied (emitted
    /// without them).
    pub const XDP_CAPTURE_FAILED: u32 = 21;
    /// Summary mode: segments counted per flow in the kernel and not
    /// emitted (in order, same queue and CPU, not sampled).
    pub const XDP_SUMMARIZED: u32 = 22;
    /// Summary mode: `tcp_probe` skbs TCP took in order, counted and not
    /// emitted (not sampled).
    pub const PROBE_SUMMARIZED: u32 = 23;
    /// Summary mode: the payload bytes of the `XDP_SUMMARIZED` segments.
    pub const XDP_SUMMARIZED_BYTES: u32 = 24;
    /// Overload: times the ring filled past its high-water mark in full
    /// mode and the programs switched to summary behaviour
    /// (`OVERLOAD_SAMPLE`).
    pub const OVERLOAD_ENTERED: u32 = 25;
    /// Overload: times the ring drained below its low-water mark and the
    /// programs went back to emitting every event.
    pub const OVERLOAD_LEFT: u32 = 26;
    /// Number of counters. (New ones go last: a trace stores them in this
    /// order, and one from before reads the newer ones as 0.)
    pub const COUNT: u32 = 27;
}

/// Every counter of one CPU (`COUNTERS`: one such block per CPU), indexed
/// by [`counter`].
pub type CounterBlock = [u64; counter::COUNT as usize];

/// The port filter: one byte per port, 1 for a wanted one (the programs'
/// `PORTS`, fixed at load time).
pub type PortSet = [u8; 65_536];

/// Filter switches, in [`FilterConfig::flags`].
pub const FILTER_PORTS: u32 = 0x01;
pub const FILTER_ADDRS: u32 = 0x02;

/// The filter set from userspace (the programs' `FILTER`, fixed at load
/// time).
///
/// A segment passes when (no port filter, or its source or destination port
/// is in `PORTS`) and (no address filter, or its source or destination
/// address matches a prefix in `ADDRS`). `ifindex` and `netns_inum`, when
/// non-zero, scope the tracepoint programs to the traced interface.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterConfig {
    pub flags: u32,
    pub ifindex: u32,
    pub netns_inum: u32,
    pub _pad: u32,
}

/// Key of the `ADDRS` LPM trie: an IPv6 address, or an IPv4 address mapped
/// into `::ffff:0:0/96`. The trie's prefix length counts from the top.
pub type AddrKey = [u8; 16];

/// What the tracepoint programs need to know of the running kernel: its
/// structure offsets and the shape of its tracepoints, resolved from BTF by
/// userspace at load time and handed to the programs as a read-only global
/// (constants to the verifier, which drops the code a kernel cannot run).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLayout {
    /// `sk_buff.cb` (where `struct tcp_skb_cb` lives).
    pub skb_cb: u32,
    /// `sk_buff.skb_iif`.
    pub skb_iif: u32,
    /// `sk_buff.head` and `.end` (`skb_shinfo` is at `head + end`), and
    /// `skb_shared_info.gso_segs`.
    pub skb_head: u32,
    pub skb_end: u32,
    pub shinfo_gso_segs: u32,
    /// `sk_buff.data` (the TCP header, in the receive path).
    pub skb_data: u32,
    /// `tcp_skb_cb.seq`, `.end_seq`, `.ack_seq`, `.tcp_flags`.
    pub tcb_seq: u32,
    pub tcb_end_seq: u32,
    pub tcb_ack_seq: u32,
    pub tcb_tcp_flags: u32,
    /// `sock_common` (at the start of every `struct sock`).
    pub sk_family: u32,
    pub sk_daddr: u32,
    pub sk_rcv_saddr: u32,
    pub sk_v6_daddr: u32,
    pub sk_v6_rcv_saddr: u32,
    pub sk_dport: u32,
    pub sk_num: u32,
    pub sk_net: u32,
    /// `net.ns.inum`.
    pub net_inum: u32,
    /// `tcp_sock` fields.
    pub tp_srtt_us: u32,
    pub tp_snd_cwnd: u32,
    pub tp_snd_una: u32,
    pub tp_snd_nxt: u32,
    pub tp_rcv_nxt: u32,
    /// `tcp_sock.rx_opt.ts_recent`.
    pub tp_ts_recent: u32,
    /// `sock.sk_lock.owned`: whether a task holds the socket (TCP runs in
    /// process context then, in softirq otherwise).
    pub sk_owned: u32,
    /// 1 if `tcp_retransmit_skb` passes the transmit's result (`err`, its
    /// third argument; Linux 6.17 on): reading it on an older kernel is
    /// rejected by the verifier.
    pub rtx_err: u32,
}

/// The lab's edge stage: the emulated flow-steering NIC between the lab's
/// client and server (`lab-edge` programs). Lab-only: one client and one
/// server address, so a flow is named by its two ports.
/// Receive-side scaling: the Toeplitz hash a NIC computes over a received
/// packet's addresses and ports, which picks its RX queue through the
/// indirection table. The lab's emulated NIC (kernel) and the tracer's RSS
/// check (userspace) must agree bit for bit, so both call this one function.
pub mod rss {
    /// The key length most NICs use (Microsoft's RSS specification).
    pub const KEY_LEN: usize = 40;

    /// Microsoft's RSS verification key ("Verifying the RSS Hash
    /// Calculation"), the default key of several drivers.
    pub const VERIFICATION_KEY: [u8; KEY_LEN] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f,
        0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
        0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
    ];

    /// The Toeplitz hash of `input` under `key`: for every set input bit,
    /// from the first byte's most significant bit on, the 32 key bits
    /// starting at that bit's position are XORed in. Key bits past the
    /// key's end read as 0 (a key covers `input.len() + 4` bytes).
    #[inline(always)]
    pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
        let byte = |i: usize| u32::from(key.get(i).copied().unwrap_or(0));
        let mut window = byte(0) << 24 | byte(1) << 16 | byte(2) << 8 | byte(3);
        let mut hash = 0;
        for (i, &b) in input.iter().enumerate() {
            let next = byte(i + 4);
            for bit in (0..8).rev() {
                if (b >> bit) & 1 == 1 {
                    hash ^= window;
                }
                window = (window << 1) | ((next >> bit) & 1);
            }
        }
        hash
    }

    /// The hash input of a TCP/IPv4 packet: source address, destination
    /// address, source port, destination port, in network byte order.
    #[inline(always)]
    pub fn ipv4_input(saddr: [u8; 4], daddr: [u8; 4], sport: u16, dport: u16) -> [u8; 12] {
        let mut input = [0u8; 12];
        input[..4].copy_from_slice(&saddr);
        input[4..8].copy_from_slice(&daddr);
        input[8..10].copy_from_slice(&sport.to_be_bytes());
        input[10..].copy_from_slice(&dport.to_be_bytes());
        input
    }

    /// The same for TCP/IPv6.
    pub fn ipv6_input(saddr: [u8; 16], daddr: [u8; 16], sport: u16, dport: u16) -> [u8; 36] {
        let mut input = [0u8; 36];
        input[..16].copy_from_slice(&saddr);
        input[16..32].copy_from_slice(&daddr);
        input[32..34].copy_from_slice(&sport.to_be_bytes());
        input[34..].copy_from_slice(&dport.to_be_bytes());
        input
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn v4(a: &str) -> [u8; 4] {
            let mut out = [0u8; 4];
            for (o, p) in out.iter_mut().zip(a.split('.')) {
                *o = p.parse().unwrap();
            }
            out
        }

        /// Microsoft's "Verifying the RSS Hash Calculation", IPv4:
        /// (destination, source, hash of the addresses, hash with ports).
        #[test]
        fn ipv4_matches_the_published_verification_table() {
            let table = [
                (
                    "161.142.100.80",
                    1766,
                    "66.9.149.187",
                    2794,
                    0x323e_8fc2,
                    0x51cc_c178,
                ),
                (
                    "65.69.140.83",
                    4739,
                    "199.92.111.2",
                    14230,
                    0xd718_262a,
                    0xc626_b0ea,
                ),
                (
                    "12.22.207.184",
                    38024,
                    "24.19.198.95",
                    12898,
                    0xd2d0_a5de,
                    0x5c2b_394a,
                ),
                (
                    "209.142.163.6",
                    2217,
                    "38.27.205.30",
                    48228,
                    0x8298_9176,
                    0xafc7_327f,
                ),
                (
                    "202.188.127.2",
                    1303,
                    "153.39.163.191",
                    44251,
                    0x5d18_09c5,
                    0x10e8_28a2,
                ),
            ];
            for (dst, dport, src, sport, addrs_only, with_ports) in table {
                let input = ipv4_input(v4(src), v4(dst), sport, dport);
                assert_eq!(
                    toeplitz(&VERIFICATION_KEY, &input[..8]),
                    addrs_only,
                    "{src} -> {dst}"
                );
                assert_eq!(
                    toeplitz(&VERIFICATION_KEY, &input),
                    with_ports,
                    "{src} -> {dst}"
                );
            }
        }

        /// The same table's IPv6 rows.
        #[test]
        fn ipv6_matches_the_published_verification_table() {
            // (destination, its port, source, its port, hashes as above)
            type Row = ([u8; 16], u16, [u8; 16], u16, u32, u32);
            let table: [Row; 3] = [
                (
                    // 3ffe:2501:200:3::1 <- 3ffe:2501:200:1fff::7
                    [
                        0x3f, 0xfe, 0x25, 0x01, 0x02, 0x00, 0x00, 0x03, 0, 0, 0, 0, 0, 0, 0, 0x01,
                    ],
                    1766,
                    [
                        0x3f, 0xfe, 0x25, 0x01, 0x02, 0x00, 0x1f, 0xff, 0, 0, 0, 0, 0, 0, 0, 0x07,
                    ],
                    2794,
                    0x2cc1_8cd5,
                    0x4020_7d3d,
                ),
                (
                    // ff02::1 <- 3ffe:501:8::260:97ff:fe40:efab
                    [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01],
                    4739,
                    [
                        0x3f, 0xfe, 0x05, 0x01, 0x00, 0x08, 0, 0, 0x02, 0x60, 0x97, 0xff, 0xfe,
                        0x40, 0xef, 0xab,
                    ],
                    14230,
                    0x0f0c_461c,
                    0xdde5_1bbf,
                ),
                (
                    // fe80::200:f8ff:fe21:67cf <- 3ffe:1900:4545:3:200:f8ff:fe21:67cf
                    [
                        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x00, 0xf8, 0xff, 0xfe, 0x21, 0x67,
                        0xcf,
                    ],
                    38024,
                    [
                        0x3f, 0xfe, 0x19, 0x00, 0x45, 0x45, 0x00, 0x03, 0x02, 0x00, 0xf8, 0xff,
                        0xfe, 0x21, 0x67, 0xcf,
                    ],
                    44251,
                    0x4b61_e985,
                    0x02d1_feef,
                ),
            ];
            for (dst, dport, src, sport, addrs_only, with_ports) in table {
                let input = ipv6_input(src, dst, sport, dport);
                assert_eq!(toeplitz(&VERIFICATION_KEY, &input[..32]), addrs_only);
                assert_eq!(toeplitz(&VERIFICATION_KEY, &input), with_ports);
            }
        }
    }
}

pub mod edge {
    /// `client port << 16 | server port`.
    pub type FlowKey = u32;

    /// `EdgeConfig::mode`: XDP passes packets up the edge's own stack.
    pub const MODE_PASS: u32 = 0;
    /// `EdgeConfig::mode`: XDP redirects each packet to the CPU of its
    /// flow's queue (CPUMAP), as a flow-director NIC steers it.
    pub const MODE_STEER: u32 = 1;

    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct EdgeConfig {
        pub mode: u32,
        /// Queues of the link towards the server (its RX queues).
        pub queues: u32,
        /// RSS, as a NIC does it: a new flow's queue is entry
        /// `toeplitz(rss_key, its addresses and ports) % indir_len` of the
        /// `INDIR` map.
        pub rss_key: [u8; super::rss::KEY_LEN],
        pub indir_len: u32,
    }

    impl Default for EdgeConfig {
        fn default() -> Self {
            EdgeConfig {
                mode: MODE_PASS,
                queues: 1,
                rss_key: super::rss::VERIFICATION_KEY,
                indir_len: 1,
            }
        }
    }

    /// Entries of the edge's indirection table (as many NICs have).
    pub const INDIR_ENTRIES: u32 = 128;

    /// One transmission of a data segment in flight through the edge. A
    /// retransmission differs from its original in `ident`: the IPv4 ID
    /// (Linux gives every segment sent a new one), or for IPv6 the TCP
    /// timestamp value (equal only within the same millisecond).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct SegKey {
        pub flow: FlowKey,
        pub seq: u32,
        pub ident: u32,
    }

    /// Per flow, what entered the edge so far.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Arrivals {
        /// Data segments.
        pub count: u64,
        /// One past the highest sequence number (valid once `count` > 0).
        pub end: u32,
        pub _pad: u32,
    }

    /// What the ingress program decided for a segment.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Steered {
        /// Its place in the flow's arrival order at the edge (from 0).
        pub index: u64,
        pub ingress_ns: u64,
        pub queue: u32,
        /// The CPU it was steered to (MODE_STEER) or arrived on.
        pub cpu: u32,
        /// It started below bytes that entered before it: the sender sent
        /// it again (a sender sends new data in sequence order).
        pub retransmission: u32,
        pub _pad: u32,
    }

    /// `Steered::index` of a segment whose ingress decision was not found
    /// (evicted from the in-flight table, or an IPv6 retransmission sent
    /// in the same millisecond as its original while that was in flight).
    pub const UNMATCHED: u64 = u64::MAX;

    /// Ground truth: one data segment leaving the edge towards the server.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct EdgeEvent {
        pub ingress_ns: u64,
        pub egress_ns: u64,
        pub index: u64,
        pub flow: FlowKey,
        pub seq: u32,
        pub payload_len: u32,
        pub queue: u32,
        pub cpu: u32,
        pub egress_cpu: u32,
        /// `Steered::retransmission`.
        pub retransmission: u32,
    }

    /// Per-CPU counters of the edge programs.
    pub mod counter {
        /// Frames the ingress program saw.
        pub const FRAMES: u32 = 0;
        /// TCP segments among them (steered by the table).
        pub const TCP: u32 = 1;
        /// Redirects to the CPU map that failed (the packet was passed).
        pub const REDIRECT_FAILED: u32 = 2;
        /// New flows entered into the table.
        pub const FLOWS_LEARNED: u32 = 3;
        /// Data segments seen leaving towards the server.
        pub const EGRESS_DATA: u32 = 4;
        /// ... of which the ingress decision was not found (`UNMATCHED`).
        pub const EGRESS_UNMATCHED: u32 = 5;
        pub const TRUTH_EMITTED: u32 = 6;
        /// Ground-truth events lost: the ring was full.
        pub const TRUTH_DROPPED: u32 = 7;
        pub const COUNT: u32 = 8;
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for FilterConfig {}
    unsafe impl aya::Pod for KernelLayout {}
    unsafe impl aya::Pod for FlowAddrs {}
    unsafe impl aya::Pod for edge::EdgeConfig {}
}
