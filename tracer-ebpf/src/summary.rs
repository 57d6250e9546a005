//! Summary mode's per-flow state and decision (`--summary N`), written once
//! for two worlds like the parser: the XDP program runs it over its flow
//! table, the host's unit tests over a plain `FlowSet`.
//!
//! Per flow the kernel keeps the highest byte seen, the last RX queue and
//! CPU, and a sample countdown. A segment is emitted when its data starts
//! below the highest byte (late, or resent), above it (it opened a hole:
//! the overtaker), on another queue or CPU, as its flow's first, as a SYN,
//! FIN or RST, or as one in N of the rest; every other segment is only
//! counted. So the collector sees every late segment together with what
//! overtook it.

use tracer_common::{
    tcp_flags, FlowAddrs, SegmentEvent, FAMILY_IPV4, OPT_BELOW_HIGH, OPT_JUMP, OPT_MOVED,
    OPT_SAMPLED, SUMMARY_FLOWS,
};

/// Sets in the kernel's flow table (two flows each).
pub const SETS: u32 = SUMMARY_FLOWS / 2;
const _: () = assert!(SETS.is_power_of_two());

/// What the decision needs of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHead {
    /// The flow's hash ([`flow_tag`]): never 0.
    pub tag: u64,
    pub seq: u32,
    pub payload_len: u32,
    pub tcp_flags: u8,
}

impl SegmentHead {
    /// The head of a fully parsed segment.
    #[inline(always)]
    pub fn of(ev: &SegmentEvent) -> Self {
        Self {
            tag: flow_tag(&ev.addrs),
            seq: ev.seq,
            payload_len: ev.payload_len,
            tcp_flags: ev.tcp_flags,
        }
    }
}

/// One flow's state (a way of a [`FlowSet`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowState {
    /// The flow's hash; 0: an empty way.
    pub tag: u64,
    /// The last segment's RX queue (low half) and CPU (high half).
    pub path: u64,
    /// One past the highest data byte seen.
    pub high_end: u32,
    /// Segments until the next one sampled.
    pub to_sample: u32,
    /// Data segments counted, not emitted, since the last one emitted.
    pub summarized: u32,
    pub _pad: u32,
}

/// What [`decide`] made of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Why it must be emitted: `OPT_*` bits; 0: only counted.
    pub why: u8,
    /// When emitted, the flow's data segments counted without being
    /// emitted before it (`SegmentEvent::summarized`).
    pub summarized: u32,
    /// One past their last byte (`SegmentEvent::summarized_end`).
    pub summarized_end: u32,
}

/// Two flows whose hashes pick the same set (a value of the kernel's
/// table, one cache line), the one seen last first: a new flow replaces
/// the other.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowSet {
    pub ways: [FlowState; 2],
}

impl FlowSet {
    /// Copies the first way over the second; with `swap`, the second over
    /// the first too. A word at a time: a copy of the 32-byte struct made
    /// this LLVM's BPF backend crash (post-RA pseudo instruction expansion).
    #[inline(always)]
    fn move_first_back(&mut self, swap: bool) {
        const WORDS: usize = size_of::<FlowState>() / 8;
        const { assert!(size_of::<FlowState>() == 8 * WORDS) };
        let [first, second] = &mut self.ways;
        let (a, b) = (
            (first as *mut FlowState).cast::<u64>(),
            (second as *mut FlowState).cast::<u64>(),
        );
        for i in 0..WORDS {
            // SAFETY: word `i` of two distinct, 8-aligned FlowStates.
            unsafe {
                let (x, y) = (a.add(i).read(), b.add(i).read());
                b.add(i).write_volatile(x);
                if swap {
                    a.add(i).write_volatile(y);
                }
            }
        }
    }

    pub const EMPTY: FlowSet = FlowSet {
        ways: [FlowState {
            tag: 0,
            path: 0,
            high_end: 0,
            to_sample: 0,
            summarized: 0,
            _pad: 0,
        }; 2],
    };
}

/// The set of the table a flow's hash picks: its top bits, which mix every
/// bit of the flow's addresses and ports (see [`ipv4_flow_tag`]).
#[inline(always)]
pub fn set_index(tag: u64) -> u32 {
    (tag >> (64 - SETS.trailing_zeros())) as u32
}

/// Updates `set` with a segment that arrived on `queue` and `cpu` and says
/// why it must be emitted (and what was counted of its flow before it).
/// `sample`: one in `sample` of the rest is emitted (at least 1).
///
/// Two CPUs updating one set at once can only blur which segment of a race
/// is emitted (a state that lost an update emits more segments, not fewer),
/// and how many were counted before it.
#[inline(always)]
pub fn decide(set: &mut FlowSet, seg: &SegmentHead, queue: u32, cpu: u32, sample: u32) -> Decision {
    let end = seg.seq.wrapping_add(seg.payload_len);
    let path = u64::from(queue) | u64::from(cpu) << 32;
    if set.ways[0].tag != seg.tag {
        // The flow seen last moves to the second way; this one takes the
        // first, with its state if it had the second, else anew: its first
        // segment (or its first since it lost its way) goes out.
        let found = set.ways[1].tag == seg.tag;
        set.move_first_back(found);
        if !found {
            set.ways[0] = FlowState {
                tag: seg.tag,
                path,
                high_end: end,
                to_sample: sample - 1,
                summarized: 0,
                _pad: 0,
            };
            return Decision {
                why: OPT_SAMPLED,
                summarized: 0,
                summarized_end: 0,
            };
        }
    }
    let state = &mut set.ways[0];
    let summarized_end = state.high_end;
    let mut why = 0;
    if seg.payload_len > 0 {
        let from_high = seg.seq.wrapping_sub(state.high_end) as i32;
        if from_high < 0 {
            why |= OPT_BELOW_HIGH;
        } else if from_high > 0 {
            why |= OPT_JUMP;
        }
        if (end.wrapping_sub(state.high_end) as i32) > 0 {
            state.high_end = end;
        }
    }
    if path != state.path {
        why |= OPT_MOVED;
        state.path = path;
    }
    // A countdown, not `segments % sample`: a division costs the program
    // more than the rest of this function.
    if state.to_sample == 0 {
        state.to_sample = sample - 1;
        why |= OPT_SAMPLED;
    } else {
        state.to_sample -= 1;
        if seg.tcp_flags & (tcp_flags::SYN | tcp_flags::FIN | tcp_flags::RST) != 0 {
            why |= OPT_SAMPLED;
        }
    }
    let summarized = state.summarized;
    if why != 0 {
        state.summarized = 0;
    } else if seg.payload_len > 0 {
        state.summarized += 1;
    }
    Decision {
        why,
        summarized,
        summarized_end,
    }
}

/// A flow's 64-bit hash, never 0 (an empty way).
#[inline(always)]
pub fn flow_tag(a: &FlowAddrs) -> u64 {
    let ports = u32::from(a.sport) << 16 | u32::from(a.dport);
    let addrs = |at| u64::from(le32(&a.saddr, at)) | u64::from(le32(&a.daddr, at)) << 32;
    if a.family == FAMILY_IPV4 {
        return ipv4_flow_tag(addrs(0), ports);
    }
    // IPv6 (the general path only, where a few more instructions do not
    // show): a product for each part of the addresses, each part's top
    // bits (where alone a product's top bits change) put elsewhere, then
    // the whole mixed again, high bits into low.
    let mut h = mix(addrs(0), K[0])
        ^ mix(addrs(4), K[1]).rotate_left(16)
        ^ mix(addrs(8), K[2]).rotate_left(32)
        ^ mix(addrs(12), K[3]).rotate_left(48)
        ^ (u64::from(ports) | u64::from(a.family) << 32).wrapping_mul(K[4]);
    h ^= h >> 31;
    h = h.wrapping_mul(K[0]);
    h ^= h >> 29;
    h | 1
}

/// [`flow_tag`] of a plain IPv4 segment from its raw header words: `addrs`
/// the eight bytes of source and destination address as they sit in the
/// IP header (read little-endian), `ports` the TCP header's first four
/// bytes (read big-endian: the source port in the high half). Two
/// independent multiplications (a chain of five had cost the XDP program
/// 10 ns), whose top bits depend on every bit of their word.
#[inline(always)]
pub fn ipv4_flow_tag(addrs: u64, ports: u32) -> u64 {
    let h = mix(addrs, K[0]) ^ (u64::from(ports) | u64::from(FAMILY_IPV4) << 32).wrapping_mul(K[4]);
    h | 1
}

const K: [u64; 5] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0x85eb_ca77_c2b2_ae63,
    0x27d4_eb2f_1656_67c5,
];

/// Address bytes (read little-endian) times `k`, as numbers in network
/// byte order: the hosts of a subnet differ in their last bits, which a
/// multiplication spreads over the whole product (read as they lie in
/// memory, they sit in the top bits, and 100,000 clients of one server
/// crowded some sets with three times their share).
#[inline(always)]
fn mix(addr_bytes: u64, k: u64) -> u64 {
    addr_bytes.swap_bytes().wrapping_mul(k)
}

#[inline(always)]
fn le32(addr: &[u8; 16], at: usize) -> u32 {
    u32::from_le_bytes([addr[at], addr[at + 1], addr[at + 2], addr[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        parse::{parse_segment, plain_ipv4},
        test_frames::*,
    };
    use tracer_common::tcp_flags::{ACK, FIN, RST, SYN};

    const SAMPLE: u32 = 8;
    const MSS: u32 = 1448;

    fn frame(saddr: [u8; 4], daddr: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let t = Tcp {
            sport,
            dport,
            ..Tcp::default()
        };
        eth(
            0x0800,
            &[],
            &ipv4_between(saddr, daddr, 6, 0, &[], &tcp(&t)),
        )
    }

    /// The quick path (fixed offsets, raw header words) and the general
    /// path (the parsed event's addresses) give a flow the same tag, so a
    /// flow keeps its state whichever path its segments take.
    #[test]
    fn both_paths_give_a_flow_one_tag() {
        let mut tags = std::collections::HashSet::new();
        for (saddr, daddr, sport, dport) in [
            ([10, 0, 0, 1], [10, 0, 0, 2], 40000, 5201),
            ([10, 0, 0, 2], [10, 0, 0, 1], 5201, 40000),
            ([192, 168, 1, 77], [10, 77, 2, 2], 1, 65535),
            ([255, 255, 255, 255], [0, 0, 0, 0], 0, 0),
            ([10, 0, 0, 1], [10, 0, 0, 2], 40001, 5201),
            ([10, 0, 0, 1], [10, 0, 0, 3], 40000, 5201),
        ] {
            let f = frame(saddr, daddr, sport, dport);
            let head = plain_ipv4(&f[..]).unwrap();
            let mut ev = SegmentEvent::default();
            parse_segment(&f[..], &mut ev).unwrap();
            let tag = ipv4_flow_tag(head.addrs(), head.ports());
            assert_eq!(
                tag,
                flow_tag(&ev.addrs),
                "{saddr:?}:{sport} > {daddr:?}:{dport}"
            );
            assert_ne!(tag, 0, "0 is an empty way");
            tags.insert(tag);
        }
        assert_eq!(tags.len(), 6, "distinct flows, distinct tags");
    }

    /// IPv6 flows (the general path alone): a flow differing from another
    /// in any one byte of its addresses, or in a port, has its own tag.
    #[test]
    fn ipv6_flows_differing_anywhere_have_their_own_tags() {
        let base = FlowAddrs {
            saddr: SRC6,
            daddr: DST6,
            sport: 40000,
            dport: 443,
            family: tracer_common::FAMILY_IPV6,
            _pad: [0; 3],
        };
        let mut tags = std::collections::HashSet::from([flow_tag(&base)]);
        for i in 0..16 {
            for bit in [0x01, 0x80] {
                let mut a = base;
                a.saddr[i] ^= bit;
                tags.insert(flow_tag(&a));
                let mut a = base;
                a.daddr[i] ^= bit;
                tags.insert(flow_tag(&a));
            }
        }
        let mut a = base;
        a.sport += 1;
        tags.insert(flow_tag(&a));
        let mut a = base;
        (a.sport, a.dport) = (base.dport, base.sport);
        tags.insert(flow_tag(&a));
        assert_eq!(tags.len(), 1 + 64 + 2);
    }

    /// Real traffic's flows differ in little: many client ports to one
    /// server, or many clients of one port (IPv4 and IPv6). Their sets must
    /// still spread over the table as a random choice would, or flows
    /// would keep pushing each other out.
    #[test]
    fn similar_flows_spread_over_the_sets() {
        let mut per_set = vec![0u32; SETS as usize];
        let mut flows = 0;
        for client in 0..4u8 {
            for port in 10_000..35_000u16 {
                let addrs = u64::from(u32::from_le_bytes([10, 0, 0, client]))
                    | u64::from(u32::from_le_bytes([10, 0, 0, 200])) << 32;
                per_set[set_index(ipv4_flow_tag(addrs, u32::from(port) << 16 | 443)) as usize] += 1;
                flows += 1;
            }
        }
        for host in 0..100_000u32 {
            let client = (0x0a00_0000 + host).to_be_bytes();
            let addrs = u64::from(u32::from_le_bytes(client))
                | u64::from(u32::from_le_bytes([10, 255, 0, 1])) << 32;
            per_set[set_index(ipv4_flow_tag(addrs, 50_000 << 16 | 443)) as usize] += 1;
            flows += 1;
        }
        for host in 0..100_000u32 {
            let mut a = FlowAddrs {
                saddr: SRC6,
                daddr: DST6,
                sport: 50_000,
                dport: 443,
                family: tracer_common::FAMILY_IPV6,
                _pad: [0; 3],
            };
            a.saddr[12..].copy_from_slice(&host.to_be_bytes());
            per_set[set_index(flow_tag(&a)) as usize] += 1;
            flows += 1;
        }
        // 300,000 flows in 32,768 sets: 9.2 a set. A random choice leaves
        // 0.01% of the sets empty, and none above 26 (chi-square over the
        // degrees of freedom about 1).
        let most = *per_set.iter().max().unwrap();
        let empty = per_set.iter().filter(|&&n| n == 0).count();
        let mean = f64::from(flows) / f64::from(SETS);
        let chi2 = per_set
            .iter()
            .map(|&n| (f64::from(n) - mean).powi(2) / mean)
            .sum::<f64>()
            / f64::from(SETS - 1);
        assert!(most <= 26, "a set with {most} of {flows} flows");
        assert!(empty < SETS as usize / 1000, "{empty} empty sets");
        assert!(chi2 < 1.3, "chi-square per degree of freedom {chi2:.2}");
    }

    /// Why `decide` emits the segment (0: only counted).
    fn why(set: &mut FlowSet, seg: &SegmentHead, queue: u32, cpu: u32, sample: u32) -> u8 {
        decide(set, seg, queue, cpu, sample).why
    }

    fn head(tag: u64, seq: u32, payload_len: u32, tcp_flags: u8) -> SegmentHead {
        SegmentHead {
            tag,
            seq,
            payload_len,
            tcp_flags,
        }
    }

    /// Segment `n` of a flow, in order (`MSS` bytes each).
    fn nth(tag: u64, n: u32) -> SegmentHead {
        head(tag, 1000 + n * MSS, MSS, ACK)
    }

    #[test]
    fn a_flow_in_order_on_one_queue_is_sampled_one_in_n() {
        let mut set = FlowSet::EMPTY;
        let tag = 0x1234_5679;
        assert_eq!(
            why(&mut set, &nth(tag, 0), 3, 1, SAMPLE),
            OPT_SAMPLED,
            "first"
        );
        let emitted: Vec<u32> = (1..=4 * SAMPLE)
            .filter(|&n| why(&mut set, &nth(tag, n), 3, 1, SAMPLE) != 0)
            .collect();
        assert_eq!(emitted, [8, 16, 24, 32], "one in {SAMPLE} after the first");
    }

    /// An emitted segment carries how many of its flow's data segments were
    /// only counted since the last one emitted, and where they ended: pure
    /// ACKs are not among them, and a new flow starts from none.
    #[test]
    fn emitted_segments_carry_the_count_of_those_kept_back() {
        let mut set = FlowSet::EMPTY;
        let tag = 0x5151;
        assert_eq!(decide(&mut set, &nth(tag, 0), 0, 0, SAMPLE).summarized, 0);
        let kept: Vec<(u32, u32)> = (1..=2 * SAMPLE)
            .map(|n| decide(&mut set, &nth(tag, n), 0, 0, SAMPLE))
            .filter(|d| d.why != 0)
            .map(|d| (d.summarized, d.summarized_end))
            .collect();
        // (Sampled in order: they ended where the sampled one begins.)
        assert_eq!(
            kept,
            [SAMPLE, 2 * SAMPLE].map(|n| (SAMPLE - 1, nth(tag, n).seq))
        );
        // Three counted, an ACK counted but not as data, then a late one.
        for n in 2 * SAMPLE + 1..2 * SAMPLE + 4 {
            assert_eq!(why(&mut set, &nth(tag, n), 0, 0, SAMPLE), 0);
        }
        assert_eq!(why(&mut set, &head(tag, 1, 0, ACK), 0, 0, SAMPLE), 0);
        let late = decide(&mut set, &nth(tag, 3), 0, 0, SAMPLE);
        let high = nth(tag, 2 * SAMPLE + 4).seq;
        assert_eq!(
            (late.why, late.summarized, late.summarized_end),
            (OPT_BELOW_HIGH, 3, high)
        );
        // A jump: those counted before it ended below where it begins.
        for n in 2 * SAMPLE + 4..2 * SAMPLE + 6 {
            assert_eq!(why(&mut set, &nth(tag, n), 0, 0, SAMPLE), 0);
        }
        let jump = decide(&mut set, &nth(tag, 2 * SAMPLE + 9), 0, 0, SAMPLE);
        assert_ne!(jump.why & OPT_JUMP, 0);
        assert_eq!(
            (jump.summarized, jump.summarized_end),
            (2, nth(tag, 2 * SAMPLE + 6).seq)
        );
    }

    #[test]
    fn late_overtaking_moved_and_control_segments_are_emitted() {
        // (No sampled segment among these.)
        const SAMPLE: u32 = 1000;
        let mut set = FlowSet::EMPTY;
        let tag = 0xabcd_0001;
        why(&mut set, &nth(tag, 0), 0, 0, SAMPLE);
        // Segment 2 overtakes segment 1: it opens a hole, 1 arrives late.
        assert_eq!(why(&mut set, &nth(tag, 2), 0, 0, SAMPLE), OPT_JUMP);
        assert_eq!(why(&mut set, &nth(tag, 1), 0, 0, SAMPLE), OPT_BELOW_HIGH);
        // In order again: only counted.
        assert_eq!(why(&mut set, &nth(tag, 3), 0, 0, SAMPLE), 0);
        // Another queue, then another CPU on it: each a move.
        assert_eq!(why(&mut set, &nth(tag, 4), 1, 0, SAMPLE), OPT_MOVED);
        assert_eq!(why(&mut set, &nth(tag, 5), 1, 1, SAMPLE), OPT_MOVED);
        assert_eq!(why(&mut set, &nth(tag, 6), 1, 1, SAMPLE), 0);
        // Late and on the old queue: both reasons.
        assert_eq!(
            why(&mut set, &nth(tag, 2), 0, 0, SAMPLE),
            OPT_BELOW_HIGH | OPT_MOVED
        );
        // A pure ACK carries no data: never late, never a jump.
        assert_eq!(why(&mut set, &head(tag, 1, 0, ACK), 0, 0, SAMPLE), 0);
        for flag in [SYN, FIN, RST] {
            let end = 1000 + 7 * MSS;
            assert_eq!(
                why(&mut set, &head(tag, end, 0, ACK | flag), 0, 0, SAMPLE),
                OPT_SAMPLED,
                "flag {flag:#x}"
            );
        }
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut set = FlowSet::EMPTY;
        let tag = 0x77;
        let start = u32::MAX - MSS;
        why(&mut set, &head(tag, start, MSS, ACK), 0, 0, SAMPLE);
        let past = start.wrapping_add(MSS);
        assert_eq!(why(&mut set, &head(tag, past, MSS, ACK), 0, 0, SAMPLE), 0);
        let next = past.wrapping_add(MSS);
        assert_eq!(why(&mut set, &head(tag, next, MSS, ACK), 0, 0, SAMPLE), 0);
        assert_eq!(
            why(&mut set, &head(tag, start, MSS, ACK), 0, 0, SAMPLE),
            OPT_BELOW_HIGH
        );
    }

    /// Two ways a set: a third flow replaces the one seen less recently, and
    /// the flow it keeps still has its state (its late segment is found).
    #[test]
    fn a_new_flow_replaces_the_one_seen_less_recently() {
        let mut set = FlowSet::EMPTY;
        let (a, b, c) = (0x11, 0x23, 0x35);
        why(&mut set, &nth(a, 0), 0, 0, SAMPLE);
        why(&mut set, &nth(b, 0), 0, 0, SAMPLE);
        why(&mut set, &nth(a, 2), 0, 0, SAMPLE); // a used last
        assert_eq!(why(&mut set, &nth(c, 0), 0, 0, SAMPLE), OPT_SAMPLED);
        assert_eq!(why(&mut set, &nth(a, 1), 0, 0, SAMPLE), OPT_BELOW_HIGH);
        // b lost its way: its next segment is a first again.
        assert_eq!(why(&mut set, &nth(b, 1), 0, 0, SAMPLE), OPT_SAMPLED);
        // ... and c, used less recently than a, lost it to b.
        assert_eq!(why(&mut set, &nth(c, 1), 0, 0, SAMPLE), OPT_SAMPLED);
    }
}
