//! Turns raw ring-buffer records into typed [`Observation`]s: the one stream
//! every later stage (statistics, engine, exporters) consumes.

pub mod capture;
pub mod format;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::{Deserialize, Serialize};
use tracer_common::{
    kind, FlowAddrs, ProbeEvent, RetransmitEvent, SegmentEvent, CAPTURED_HEADER, FAMILY_IPV4,
    OPT_FIRST_FRAGMENT, OPT_TIMESTAMP, OPT_VLAN,
};

/// One direction of a TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Flow {
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

impl Flow {
    pub fn reversed(&self) -> Flow {
        Flow {
            src: self.dst,
            dst: self.src,
        }
    }
}

impl std::fmt::Display for Flow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}", self.src, self.dst)
    }
}

/// `src -> dst`, as a flow displays (and the snapshot names it).
impl std::str::FromStr for Flow {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (src, dst) = s
            .split_once(" -> ")
            .ok_or_else(|| format!("{s:?} is not `SRC -> DST`"))?;
        let addr = |a: &str| a.parse().map_err(|e| format!("{a:?}: {e}"));
        Ok(Flow {
            src: addr(src)?,
            dst: addr(dst)?,
        })
    }
}

/// A TCP segment seen by XDP on the traced interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    pub ifindex: u32,
    pub rx_queue: u32,
    pub cpu: u32,
    pub flow: Flow,
    pub seq: u32,
    pub ack: u32,
    pub payload_len: u32,
    pub flags: u8,
    pub window: u16,
    /// IPv4 identification; `None` for IPv6.
    pub ip_id: Option<u16>,
    /// (TSval, TSecr) when the timestamp option is present.
    pub timestamp: Option<(u32, u32)>,
    /// SACK blocks (left, right), at most four.
    pub sack: Vec<(u32, u32)>,
    pub vlan: Option<u16>,
    pub first_fragment: bool,
    /// Summary mode: the flow's data segments the kernel counted, in order,
    /// without emitting them, since its previous emitted one.
    #[serde(default)]
    pub summarized_before: u32,
    /// One past the last byte they carried: the sequence space up to it
    /// was filled, in order.
    #[serde(default)]
    pub summarized_end: Option<u32>,
}

/// A segment, or a GRO-coalesced run of segments, as TCP processed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpProbe {
    pub ts_ns: u64,
    pub cpu: u32,
    pub ifindex: u32,
    pub flow: Flow,
    pub seq: u32,
    pub end_seq: u32,
    pub ack: u32,
    pub payload_len: u32,
    pub flags: u8,
    pub srtt_us: u32,
    pub snd_cwnd: u32,
    pub snd_una: u32,
    pub snd_nxt: u32,
    pub rcv_nxt: u32,
    /// Wire segments GRO merged into this one (0: never merged).
    #[serde(default)]
    pub gso_segs: u16,
    /// The segment's TSval (aligned option layout only) and the socket's
    /// `ts_recent`: what PAWS compares.
    #[serde(default)]
    pub tsval: Option<u32>,
    #[serde(default)]
    pub ts_recent: u32,
}

impl TcpProbe {
    /// Whether TCP discards this segment by PAWS after the tracepoint, by
    /// Linux's rule (`tcp_paws_check`): its TSval is more than one tick
    /// older than `ts_recent`, and `ts_recent` is set. (The 24-day
    /// `ts_recent` expiry and the exemption for pure ACKs do not arise for
    /// data on a live flow.)
    pub fn paws_rejects(&self) -> bool {
        self.tsval
            .is_some_and(|v| self.ts_recent != 0 && (self.ts_recent.wrapping_sub(v) as i32) > 1)
    }
}

/// A segment this host retransmitted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retransmit {
    pub ts_ns: u64,
    pub cpu: u32,
    pub flow: Flow,
    pub seq: u32,
    pub end_seq: u32,
    pub flags: u8,
    pub err: i32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Observation {
    Segment(Segment),
    TcpProbe(TcpProbe),
    Retransmit(Retransmit),
}

impl Observation {
    /// The flow, in the direction its segment travelled.
    pub fn flow(&self) -> Flow {
        match self {
            Self::Segment(s) => s.flow,
            Self::TcpProbe(p) => p.flow,
            Self::Retransmit(r) => r.flow,
        }
    }

    pub fn ts_ns(&self) -> u64 {
        match self {
            Self::Segment(s) => s.ts_ns,
            Self::TcpProbe(p) => p.ts_ns,
            Self::Retransmit(r) => r.ts_ns,
        }
    }
}

/// Why a record could not be decoded (counted, never silently skipped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Empty,
    UnknownKind(u8),
    Short { kind: u8, len: usize },
}

/// The first bytes of a segment's frame, as XDP copied them while
/// recording a pcapng trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub data: &'a [u8],
    /// The frame's whole length.
    pub wire_len: u32,
}

/// A ring-buffer record as it came, with the frame bytes a captured
/// segment carries: what an exporter keeps beside the [`Observation`].
#[derive(Clone, Copy, Debug)]
pub struct Raw<'a> {
    pub record: &'a [u8],
    pub frame: Option<Frame<'a>>,
}

/// Decodes one ring-buffer record.
pub fn decode(record: &[u8]) -> Result<Observation, DecodeError> {
    decode_with_frame(record).map(|(obs, _)| obs)
}

/// Decodes one ring-buffer record, and the frame bytes a captured
/// segment's carries.
pub fn decode_with_frame(record: &[u8]) -> Result<(Observation, Option<Frame<'_>>), DecodeError> {
    let &k = record.first().ok_or(DecodeError::Empty)?;
    let obs = match k {
        kind::XDP_SEGMENT => read::<SegmentEvent>(record).map(|e| Observation::Segment(e.into())),
        kind::XDP_CAPTURED => {
            let e = read::<SegmentEvent>(record)?;
            let short = DecodeError::Short {
                kind: k,
                len: record.len(),
            };
            let word = |at: usize| {
                record
                    .get(at..at + 4)
                    .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
            };
            let at = size_of::<SegmentEvent>();
            let (caplen, wire_len) = word(at).zip(word(at + 4)).ok_or(short)?;
            let data = record
                .get(CAPTURED_HEADER..CAPTURED_HEADER + caplen as usize)
                .ok_or(short)?;
            let frame = (caplen > 0).then_some(Frame { data, wire_len });
            return Ok((Observation::Segment(e.into()), frame));
        }
        kind::TCP_PROBE => read::<ProbeEvent>(record).map(|e| Observation::TcpProbe(e.into())),
        kind::RETRANSMIT => {
            read::<RetransmitEvent>(record).map(|e| Observation::Retransmit(e.into()))
        }
        other => Err(DecodeError::UnknownKind(other)),
    }?;
    Ok((obs, None))
}

/// Plain-data structs from tracer-common that any byte pattern is valid for.
trait Record: Copy {}
impl Record for SegmentEvent {}
impl Record for ProbeEvent {}
impl Record for RetransmitEvent {}

fn read<T: Record>(record: &[u8]) -> Result<T, DecodeError> {
    if record.len() < size_of::<T>() {
        return Err(DecodeError::Short {
            kind: record[0],
            len: record.len(),
        });
    }
    // SAFETY: length checked; T is a repr(C) struct of integers and arrays,
    // for which every bit pattern is valid.
    Ok(unsafe { std::ptr::read_unaligned(record.as_ptr().cast::<T>()) })
}

/// The flow of a kernel address record. IPv4-mapped IPv6 addresses (a
/// dual-stack socket talking IPv4) become IPv4, as XDP sees them on the wire.
pub fn flow_of(a: &FlowAddrs) -> Flow {
    let ip = |bytes: &[u8; 16]| -> IpAddr {
        if a.family == FAMILY_IPV4 {
            IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
        } else {
            let v6 = Ipv6Addr::from(*bytes);
            match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            }
        }
    };
    Flow {
        src: SocketAddr::new(ip(&a.saddr), a.sport),
        dst: SocketAddr::new(ip(&a.daddr), a.dport),
    }
}

impl From<SegmentEvent> for Segment {
    fn from(e: SegmentEvent) -> Self {
        let sack_count = usize::from(e.sack_count).min(e.sack.len());
        Segment {
            ts_ns: e.ts_ns,
            ifindex: e.ifindex,
            rx_queue: e.rx_queue,
            cpu: e.cpu,
            flow: flow_of(&e.addrs),
            seq: e.seq,
            ack: e.ack,
            payload_len: e.payload_len,
            flags: e.tcp_flags,
            window: e.window,
            ip_id: (e.addrs.family == FAMILY_IPV4).then_some(e.ip_id),
            timestamp: (e.options & OPT_TIMESTAMP != 0).then_some((e.tsval, e.tsecr)),
            sack: e.sack[..sack_count]
                .iter()
                .map(|b| (b.left, b.right))
                .collect(),
            vlan: (e.options & OPT_VLAN != 0).then_some(e.vlan),
            first_fragment: e.options & OPT_FIRST_FRAGMENT != 0,
            summarized_before: e.summarized,
            summarized_end: (e.summarized > 0).then_some(e.summarized_end),
        }
    }
}

impl From<ProbeEvent> for TcpProbe {
    fn from(e: ProbeEvent) -> Self {
        TcpProbe {
            ts_ns: e.ts_ns,
            cpu: e.cpu,
            ifindex: e.ifindex,
            flow: flow_of(&e.addrs),
            seq: e.seq,
            end_seq: e.end_seq,
            ack: e.ack_seq,
            payload_len: e.payload_len,
            flags: e.tcp_flags,
            // tcp_sock keeps srtt_us scaled by 8.
            srtt_us: e.srtt_us >> 3,
            snd_cwnd: e.snd_cwnd,
            snd_una: e.snd_una,
            snd_nxt: e.snd_nxt,
            rcv_nxt: e.rcv_nxt,
            gso_segs: e.gso_segs,
            tsval: (e.has_tsval != 0).then_some(e.tsval),
            ts_recent: e.ts_recent,
        }
    }
}

impl From<RetransmitEvent> for Retransmit {
    fn from(e: RetransmitEvent) -> Self {
        Retransmit {
            ts_ns: e.ts_ns,
            cpu: e.cpu,
            flow: flow_of(&e.addrs),
            seq: e.seq,
            end_seq: e.end_seq,
            flags: e.tcp_flags,
            err: e.err,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{SackBlock, FAMILY_IPV6};

    fn bytes_of<T>(v: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a repr(C) plain-data value.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    #[test]
    fn decodes_a_segment_record() {
        let mut e = SegmentEvent {
            kind: kind::XDP_SEGMENT,
            tcp_flags: 0x10,
            sack_count: 2,
            options: OPT_TIMESTAMP,
            rx_queue: 3,
            ts_ns: 42,
            cpu: 1,
            seq: 1000,
            payload_len: 1448,
            ip_id: 7,
            tsval: 11,
            tsecr: 12,
            ..Default::default()
        };
        e.addrs.family = FAMILY_IPV4;
        e.addrs.saddr[..4].copy_from_slice(&[10, 0, 0, 1]);
        e.addrs.daddr[..4].copy_from_slice(&[10, 0, 0, 2]);
        e.addrs.sport = 40000;
        e.addrs.dport = 5201;
        e.sack[0] = SackBlock { left: 1, right: 2 };
        e.sack[1] = SackBlock { left: 3, right: 4 };
        let Observation::Segment(s) = decode(&bytes_of(&e)).unwrap() else {
            panic!("not a segment");
        };
        assert_eq!(s.flow.to_string(), "10.0.0.1:40000 -> 10.0.0.2:5201");
        assert_eq!(
            (s.rx_queue, s.cpu, s.seq, s.payload_len),
            (3, 1, 1000, 1448)
        );
        assert_eq!(s.timestamp, Some((11, 12)));
        assert_eq!(s.sack, vec![(1, 2), (3, 4)]);
        assert_eq!(s.ip_id, Some(7));
        assert_eq!(s.vlan, None);
    }

    #[test]
    fn maps_v4_mapped_socket_addresses_to_ipv4() {
        let mut a = FlowAddrs {
            family: FAMILY_IPV6,
            sport: 1,
            dport: 2,
            ..Default::default()
        };
        a.saddr = "::ffff:10.0.0.1".parse::<Ipv6Addr>().unwrap().octets();
        a.daddr = "fd00::2".parse::<Ipv6Addr>().unwrap().octets();
        let f = flow_of(&a);
        assert_eq!(f.src.to_string(), "10.0.0.1:1");
        assert_eq!(f.dst.to_string(), "[fd00::2]:2");
    }

    #[test]
    fn rejects_short_and_unknown_records() {
        assert_eq!(decode(&[]), Err(DecodeError::Empty));
        assert_eq!(decode(&[99, 0, 0]), Err(DecodeError::UnknownKind(99)));
        assert_eq!(
            decode(&[kind::TCP_PROBE, 0]),
            Err(DecodeError::Short {
                kind: kind::TCP_PROBE,
                len: 2
            })
        );
    }
}
