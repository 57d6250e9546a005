//! Capture files: pcap and pcapng from any source (ours, tcpdump's,
//! Wireshark's), read block by block into the same [`Segment`]s the XDP
//! program produces, through the same header parser.
//!
//! Link types: Ethernet (VLAN-tagged too), raw IP, Linux cooked (SLL and
//! SLL2). The RX queue comes from pcapng's `epb_queue` option where the
//! capture has it; nothing in a pcap says the CPU. A damaged file reads up
//! to its last whole record and then says where and what is wrong.

use std::io::{ErrorKind, Read};

use tracer_common::SegmentEvent;
use tracer_ebpf::parse::{self, ParseError};

use super::Segment;

/// What is wrong with a capture, and where (bytes from the file's start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureError {
    pub offset: u64,
    pub what: String,
}

impl std::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at byte {}: {}", self.offset, self.what)
    }
}

impl std::error::Error for CaptureError {}

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Nanoseconds since the epoch (the capture's clock).
    pub ts_ns: u64,
    pub linktype: u32,
    /// The interface's index in the file (pcapng; 0 for pcap).
    pub interface: u32,
    /// The RX queue (pcapng `epb_queue`).
    pub queue: Option<u32>,
    pub data: Vec<u8>,
    /// Where its record starts in the file.
    pub offset: u64,
}

/// Link-layer header types read.
pub mod linktype {
    pub const ETHERNET: u32 = 1;
    pub const RAW: u32 = 101;
    /// `DLT_RAW` as some systems number it.
    pub const RAW_ALT: u32 = 12;
    pub const LINUX_SLL: u32 = 113;
    pub const IPV4: u32 = 228;
    pub const IPV6: u32 = 229;
    pub const LINUX_SLL2: u32 = 276;
}

/// Longest record accepted: more is a damaged length, not a packet.
const MAX_RECORD: u32 = 1 << 20;
/// Longest pcapng block accepted.
const MAX_BLOCK: u32 = 16 << 20;

const PCAP_US: u32 = 0xa1b2_c3d4;
const PCAP_NS: u32 = 0xa1b2_3c4d;
const PCAPNG_SHB: u32 = 0x0a0d_0d0a;
const BYTE_ORDER: u32 = 0x1a2b_3c4d;

mod block {
    pub const IDB: u32 = 1;
    pub const SPB: u32 = 3;
    pub const EPB: u32 = 6;
}

/// pcapng option codes.
mod opt {
    pub const END: u16 = 0;
    pub const IF_TSRESOL: u16 = 9;
    pub const EPB_QUEUE: u16 = 6;
}

struct Interface {
    linktype: u32,
    snaplen: u32,
    /// Nanoseconds per timestamp unit, as a ratio (units per second).
    units_per_s: u64,
}

enum Kind {
    Pcap { nanos: bool, linktype: u32 },
    Pcapng { interfaces: Vec<Interface> },
}

/// Reads packets from a capture, one record at a time.
pub struct CaptureReader<R> {
    input: R,
    offset: u64,
    big_endian: bool,
    kind: Kind,
    done: bool,
}

fn truncated(offset: u64, what: &str) -> CaptureError {
    CaptureError {
        offset,
        what: format!("the file ends inside {what} (cut short?)"),
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads the file header.
    pub fn new(mut input: R) -> Result<Self, CaptureError> {
        let mut magic = [0u8; 4];
        input.read_exact(&mut magic).map_err(|_| CaptureError {
            offset: 0,
            what: "not a capture: shorter than a file header".into(),
        })?;
        let le = u32::from_le_bytes(magic);
        let be = u32::from_be_bytes(magic);
        let mut r = Self {
            input,
            offset: 4,
            big_endian: false,
            kind: Kind::Pcapng {
                interfaces: Vec::new(),
            },
            done: false,
        };
        match (le, be) {
            (PCAP_US | PCAP_NS, _) | (_, PCAP_US | PCAP_NS) => {
                r.big_endian = be == PCAP_US || be == PCAP_NS;
                let nanos = if r.big_endian { be } else { le } == PCAP_NS;
                let header = r.bytes(20, "the pcap file header")?;
                let linktype = r.u32_at(&header, 16) & 0x0fff_ffff;
                r.kind = Kind::Pcap { nanos, linktype };
            }
            (PCAPNG_SHB, _) => r.section_header(0)?,
            _ => {
                return Err(CaptureError {
                    offset: 0,
                    what: format!(
                        "not a pcap or pcapng file (magic {:02x}{:02x}{:02x}{:02x})",
                        magic[0], magic[1], magic[2], magic[3]
                    ),
                })
            }
        }
        Ok(r)
    }

    fn bytes(&mut self, n: usize, what: &str) -> Result<Vec<u8>, CaptureError> {
        let mut buf = vec![0u8; n];
        self.input
            .read_exact(&mut buf)
            .map_err(|_| truncated(self.offset, what))?;
        self.offset += n as u64;
        Ok(buf)
    }

    fn u32_at(&self, b: &[u8], at: usize) -> u32 {
        let w = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if self.big_endian {
            u32::from_be_bytes(w)
        } else {
            u32::from_le_bytes(w)
        }
    }

    fn u16_at(&self, b: &[u8], at: usize) -> u16 {
        let w = [b[at], b[at + 1]];
        if self.big_endian {
            u16::from_be_bytes(w)
        } else {
            u16::from_le_bytes(w)
        }
    }

    /// A pcapng section header whose type field (4 bytes) was read; sets
    /// the byte order and forgets the previous section's interfaces.
    fn section_header(&mut self, start: u64) -> Result<(), CaptureError> {
        let head = self.bytes(8, "a section header")?;
        let order = [head[4], head[5], head[6], head[7]];
        self.big_endian = match (u32::from_le_bytes(order), u32::from_be_bytes(order)) {
            (BYTE_ORDER, _) => false,
            (_, BYTE_ORDER) => true,
            _ => {
                return Err(CaptureError {
                    offset: start + 8,
                    what: "pcapng section header without its byte-order magic".into(),
                })
            }
        };
        let total = self.u32_at(&head, 0);
        self.check_block(start, total)?;
        self.bytes(total as usize - 12, "a section header")?;
        self.kind = Kind::Pcapng {
            interfaces: Vec::new(),
        };
        Ok(())
    }

    fn check_block(&self, start: u64, total: u32) -> Result<(), CaptureError> {
        if total < 12 || !total.is_multiple_of(4) || total > MAX_BLOCK {
            return Err(CaptureError {
                offset: start + 4,
                what: format!("pcapng block length {total} is not a block's (12 to {MAX_BLOCK}, a multiple of 4)"),
            });
        }
        Ok(())
    }

    /// Bytes read so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next packet, or `None` at the end of the file.
    pub fn next_packet(&mut self) -> Option<Result<Packet, CaptureError>> {
        if self.done {
            return None;
        }
        let r = match self.kind {
            Kind::Pcap { .. } => self.pcap_record(),
            Kind::Pcapng { .. } => self.pcapng_packet(),
        };
        if !matches!(r, Some(Ok(_))) {
            self.done = true;
        }
        r
    }

    /// At the end of the file exactly, or `what` begins and is cut short.
    fn start(&mut self, buf: &mut [u8], what: &str) -> Option<Result<(), CaptureError>> {
        let mut got = 0;
        while got < buf.len() {
            match self.input.read(&mut buf[got..]) {
                Ok(0) if got == 0 => return None,
                Ok(0) => return Some(Err(truncated(self.offset, what))),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    return Some(Err(CaptureError {
                        offset: self.offset,
                        what: format!("reading: {e}"),
                    }))
                }
            }
        }
        self.offset += buf.len() as u64;
        Some(Ok(()))
    }

    fn pcap_record(&mut self) -> Option<Result<Packet, CaptureError>> {
        let Kind::Pcap { nanos, linktype } = self.kind else {
            unreachable!("pcap state");
        };
        let at = self.offset;
        let mut head = [0u8; 16];
        if let Err(e) = self.start(&mut head, "a packet record header")? {
            return Some(Err(e));
        }
        let secs = u64::from(self.u32_at(&head, 0));
        let frac = u64::from(self.u32_at(&head, 4));
        let len = self.u32_at(&head, 8);
        if len > MAX_RECORD {
            return Some(Err(CaptureError {
                offset: at + 8,
                what: format!("record length {len} is more than any packet (damaged?)"),
            }));
        }
        let data = match self.bytes(len as usize, "a packet") {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        };
        Some(Ok(Packet {
            ts_ns: secs * 1_000_000_000 + if nanos { frac } else { frac * 1000 },
            linktype,
            interface: 0,
            queue: None,
            data,
            offset: at,
        }))
    }

    fn pcapng_packet(&mut self) -> Option<Result<Packet, CaptureError>> {
        loop {
            let at = self.offset;
            let mut kind = [0u8; 4];
            if let Err(e) = self.start(&mut kind, "a block header")? {
                return Some(Err(e));
            }
            if u32::from_le_bytes(kind) == PCAPNG_SHB {
                if let Err(e) = self.section_header(at) {
                    return Some(Err(e));
                }
                continue;
            }
            let kind = self.u32_at(&kind, 0);
            let body = match self.block_body(at) {
                Ok(b) => b,
                Err(e) => return Some(Err(e)),
            };
            match self.pcapng_block(kind, &body, at) {
                Ok(Some(p)) => return Some(Ok(p)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// A block's body (its type was read), trailing length checked.
    fn block_body(&mut self, at: u64) -> Result<Vec<u8>, CaptureError> {
        let len = self.bytes(4, "a block header")?;
        let total = self.u32_at(&len, 0);
        self.check_block(at, total)?;
        let rest = self.bytes(total as usize - 8, "a block")?;
        let (body, trailer) = rest.split_at(rest.len() - 4);
        if self.u32_at(trailer, 0) != total {
            return Err(CaptureError {
                offset: at + u64::from(total) - 4,
                what: "pcapng block's trailing length differs from its leading one".into(),
            });
        }
        Ok(body.to_vec())
    }

    fn pcapng_block(
        &mut self,
        kind: u32,
        body: &[u8],
        at: u64,
    ) -> Result<Option<Packet>, CaptureError> {
        let short = |what: &str| CaptureError {
            offset: at,
            what: format!("pcapng {what} shorter than its fixed fields"),
        };
        match kind {
            block::IDB => {
                if body.len() < 8 {
                    return Err(short("interface description"));
                }
                let mut units_per_s = 1_000_000;
                for (code, value) in options(self.big_endian, &body[8..]) {
                    if code == opt::IF_TSRESOL && !value.is_empty() {
                        let v = u32::from(value[0] & 0x7f);
                        units_per_s = if value[0] & 0x80 == 0 {
                            10u64.checked_pow(v).unwrap_or(0)
                        } else {
                            1u64.checked_shl(v).unwrap_or(0)
                        };
                    }
                }
                if units_per_s == 0 {
                    return Err(CaptureError {
                        offset: at,
                        what: "pcapng interface with an impossible timestamp resolution".into(),
                    });
                }
                let interface = Interface {
                    linktype: u32::from(self.u16_at(body, 0)),
                    snaplen: self.u32_at(body, 4),
                    units_per_s,
                };
                if let Kind::Pcapng { interfaces } = &mut self.kind {
                    interfaces.push(interface);
                }
                Ok(None)
            }
            block::EPB => {
                if body.len() < 20 {
                    return Err(short("enhanced packet"));
                }
                let id = self.u32_at(body, 0);
                let ts = (u64::from(self.u32_at(body, 4)) << 32) | u64::from(self.u32_at(body, 8));
                let caplen = self.u32_at(body, 12) as usize;
                let padded = caplen.div_ceil(4) * 4;
                if 20 + padded > body.len() {
                    return Err(CaptureError {
                        offset: at + 20,
                        what: format!(
                            "pcapng packet of {caplen} bytes in a block of {}",
                            body.len() + 12
                        ),
                    });
                }
                let (linktype, units_per_s) = self.interface(id, at)?;
                let queue = options(self.big_endian, &body[20 + padded..])
                    .find(|(code, v)| *code == opt::EPB_QUEUE && v.len() >= 4)
                    .map(|(_, v)| self.u32_at(v, 0));
                Ok(Some(Packet {
                    ts_ns: scale(ts, units_per_s),
                    linktype,
                    interface: id,
                    queue,
                    data: body[20..20 + caplen].to_vec(),
                    offset: at,
                }))
            }
            block::SPB => {
                if body.len() < 4 {
                    return Err(short("simple packet"));
                }
                let len = self.u32_at(body, 0) as usize;
                let Kind::Pcapng { interfaces } = &self.kind else {
                    unreachable!("pcapng state");
                };
                let snap = interfaces.first().map_or(0, |i| i.snaplen as usize);
                let caplen = if snap == 0 { len } else { len.min(snap) }.min(body.len() - 4);
                let (linktype, _) = self.interface(0, at)?;
                Ok(Some(Packet {
                    ts_ns: 0,
                    linktype,
                    interface: 0,
                    queue: None,
                    data: body[4..4 + caplen].to_vec(),
                    offset: at,
                }))
            }
            // Statistics, name resolution, custom and unknown blocks.
            _ => Ok(None),
        }
    }

    fn interface(&self, id: u32, at: u64) -> Result<(u32, u64), CaptureError> {
        let Kind::Pcapng { interfaces } = &self.kind else {
            unreachable!("pcapng state");
        };
        interfaces
            .get(id as usize)
            .map(|i| (i.linktype, i.units_per_s))
            .ok_or_else(|| CaptureError {
                offset: at,
                what: format!("pcapng packet on interface {id}, which the file never described"),
            })
    }
}

/// `units` of 1/`per_s` seconds, in nanoseconds.
fn scale(units: u64, per_s: u64) -> u64 {
    (u128::from(units) * 1_000_000_000 / u128::from(per_s)) as u64
}

/// pcapng options: (code, value) until `opt_endofopt` or the end.
fn options(big_endian: bool, mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let u16_at = move |b: &[u8], at: usize| {
        let w = [b[at], b[at + 1]];
        if big_endian {
            u16::from_be_bytes(w)
        } else {
            u16::from_le_bytes(w)
        }
    };
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let code = u16_at(b, 0);
        let len = usize::from(u16_at(b, 2));
        if code == opt::END || 4 + len > b.len() {
            return None;
        }
        let value = &b[4..4 + len];
        b = &b[(4 + len.div_ceil(4) * 4).min(b.len())..];
        Some((code, value))
    })
}

/// Why a packet gave no segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Not TCP over IPv4/IPv6 (or headers beyond what is parsed).
    NotTcp,
    /// Its headers are cut short (by the snapshot length or damage).
    Truncated,
    /// A link type other than those read.
    LinkType(u32),
}

/// The TCP segment in a packet, as the XDP program would have tagged it
/// (queue from the capture; CPU and interface index unknown: 0).
pub fn segment(p: &Packet) -> Result<Segment, Skip> {
    let frame = ethernet_frame(p)?;
    let mut e = SegmentEvent::default();
    parse::parse_segment(&frame[..], &mut e).map_err(|err| match err {
        ParseError::Truncated => Skip::Truncated,
        _ => Skip::NotTcp,
    })?;
    e.ts_ns = p.ts_ns;
    e.rx_queue = p.queue.unwrap_or(0);
    Ok(e.into())
}

/// The packet as an Ethernet frame (what the parser reads).
fn ethernet_frame(p: &Packet) -> Result<Vec<u8>, Skip> {
    let with_ethertype = |ethertype: u16, payload: &[u8]| {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    };
    let d = &p.data;
    match p.linktype {
        linktype::ETHERNET => Ok(d.clone()),
        linktype::RAW | linktype::RAW_ALT | linktype::IPV4 | linktype::IPV6 => {
            let ethertype = match d.first().map(|b| b >> 4) {
                Some(4) => 0x0800,
                Some(6) => 0x86dd,
                Some(_) => return Err(Skip::NotTcp),
                None => return Err(Skip::Truncated),
            };
            Ok(with_ethertype(ethertype, d))
        }
        linktype::LINUX_SLL if d.len() >= 16 => {
            Ok(with_ethertype(u16::from_be_bytes([d[14], d[15]]), &d[16..]))
        }
        linktype::LINUX_SLL2 if d.len() >= 20 => {
            Ok(with_ethertype(u16::from_be_bytes([d[0], d[1]]), &d[20..]))
        }
        linktype::LINUX_SLL | linktype::LINUX_SLL2 => Err(Skip::Truncated),
        other => Err(Skip::LinkType(other)),
    }
}

/// What a capture held, as [`feed`] read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureSummary {
    pub packets: u64,
    /// Fed to the engine.
    pub tcp: u64,
    pub non_tcp: u64,
    pub truncated: u64,
    pub unsupported_link: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    /// TCP segments `keep` left out.
    pub filtered: u64,
    /// Some packet carried its RX queue (pcapng `epb_queue`).
    pub queues: bool,
    /// Where the file stopped making sense (what came before was fed).
    pub error: Option<CaptureError>,
}

/// Feeds every TCP segment of `reader` that `keep` passes to `engine`, in
/// file order; `progress` hears the bytes read every 65,536 packets.
pub fn feed<R: Read>(
    mut reader: CaptureReader<R>,
    engine: &mut crate::engine::Engine,
    keep: impl Fn(&Segment) -> bool,
    mut progress: impl FnMut(u64),
) -> CaptureSummary {
    let mut s = CaptureSummary::default();
    while let Some(p) = reader.next_packet() {
        if s.packets % 65_536 == 0 {
            progress(reader.offset());
        }
        let p = match p {
            Ok(p) => p,
            Err(e) => {
                s.error = Some(e);
                break;
            }
        };
        s.packets += 1;
        s.queues |= p.queue.is_some();
        if s.packets == 1 {
            s.first_ns = p.ts_ns;
        }
        s.last_ns = s.last_ns.max(p.ts_ns);
        match segment(&p) {
            Ok(seg) if !keep(&seg) => s.filtered += 1,
            Ok(seg) => {
                s.tcp += 1;
                engine.segment(&seg);
            }
            Err(Skip::NotTcp) => s.non_tcp += 1,
            Err(Skip::Truncated) => s.truncated += 1,
            Err(Skip::LinkType(_)) => s.unsupported_link += 1,
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet + IPv4 + TCP frame: `seq`, 100 payload bytes (headers
    /// only captured), TSval `tsval`.
    fn frame(seq: u32, tsval: u32) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12] = 0x08;
        let mut ip = vec![
            0x45, 0, 0, 0, 0, 7, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let total: u16 = 20 + 32 + 100;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        f.extend(ip);
        let mut tcp = vec![0u8; 32];
        tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&5201u16.to_be_bytes());
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        tcp[12] = 8 << 4;
        tcp[13] = 0x10;
        tcp[14..16].copy_from_slice(&512u16.to_be_bytes());
        // NOP NOP TS
        tcp[20] = 1;
        tcp[21] = 1;
        tcp[22] = 8;
        tcp[23] = 10;
        tcp[24..28].copy_from_slice(&tsval.to_be_bytes());
        f.extend(tcp);
        f
    }

    fn pcap(nanos: bool, big: bool, linktype: u32, packets: &[(u64, Vec<u8>)]) -> Vec<u8> {
        let w32 = |v: u32| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let w16 = |v: u16| {
            if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let mut out = Vec::new();
        out.extend(w32(if nanos { PCAP_NS } else { PCAP_US }));
        out.extend(w16(2));
        out.extend(w16(4));
        out.extend(w32(0));
        out.extend(w32(0));
        out.extend(w32(65535));
        out.extend(w32(linktype));
        for (ts_ns, data) in packets {
            out.extend(w32((ts_ns / 1_000_000_000) as u32));
            let frac = ts_ns % 1_000_000_000;
            out.extend(w32(if nanos { frac } else { frac / 1000 } as u32));
            out.extend(w32(data.len() as u32));
            out.extend(w32(data.len() as u32 + 100));
            out.extend(data);
        }
        out
    }

    fn pcapng_block(kind: u32, body: &[u8]) -> Vec<u8> {
        let mut b = body.to_vec();
        b.resize(body.len().div_ceil(4) * 4, 0);
        let total = (b.len() + 12) as u32;
        let mut out = Vec::new();
        out.extend(kind.to_le_bytes());
        out.extend(total.to_le_bytes());
        out.extend(b);
        out.extend(total.to_le_bytes());
        out
    }

    fn option(code: u16, value: &[u8]) -> Vec<u8> {
        let mut o = code.to_le_bytes().to_vec();
        o.extend((value.len() as u16).to_le_bytes());
        o.extend(value);
        o.resize(4 + value.len().div_ceil(4) * 4, 0);
        o
    }

    /// A pcapng file: one Ethernet interface at ns resolution; packets
    /// (ts_ns, queue, frame).
    fn pcapng(packets: &[(u64, Option<u32>, Vec<u8>)]) -> Vec<u8> {
        let mut shb = BYTE_ORDER.to_le_bytes().to_vec();
        shb.extend(1u16.to_le_bytes());
        shb.extend(0u16.to_le_bytes());
        shb.extend((-1i64).to_le_bytes());
        let mut out = pcapng_block(PCAPNG_SHB, &shb);
        let mut idb = 1u16.to_le_bytes().to_vec();
        idb.extend(0u16.to_le_bytes());
        idb.extend(0u32.to_le_bytes());
        idb.extend(option(opt::IF_TSRESOL, &[9]));
        idb.extend(option(opt::END, &[]));
        out.extend(pcapng_block(block::IDB, &idb));
        // A block the reader skips (interface statistics).
        out.extend(pcapng_block(5, &[0; 12]));
        for (ts, queue, data) in packets {
            let mut epb = 0u32.to_le_bytes().to_vec();
            epb.extend(((ts >> 32) as u32).to_le_bytes());
            epb.extend((*ts as u32).to_le_bytes());
            epb.extend((data.len() as u32).to_le_bytes());
            epb.extend((data.len() as u32).to_le_bytes());
            epb.extend(data);
            epb.resize(20 + data.len().div_ceil(4) * 4, 0);
            if let Some(q) = queue {
                epb.extend(option(opt::EPB_QUEUE, &q.to_le_bytes()));
            }
            out.extend(pcapng_block(block::EPB, &epb));
        }
        out
    }

    fn read(bytes: &[u8]) -> (Vec<Packet>, Option<CaptureError>) {
        let mut r = match CaptureReader::new(bytes) {
            Ok(r) => r,
            Err(e) => return (vec![], Some(e)),
        };
        let mut got = Vec::new();
        while let Some(p) = r.next_packet() {
            match p {
                Ok(p) => got.push(p),
                Err(e) => return (got, Some(e)),
            }
        }
        (got, None)
    }

    #[test]
    fn pcap_in_both_byte_orders_and_resolutions_gives_the_segments() {
        let packets = vec![
            (1_500_000_123_000, frame(1000, 7)),
            (1_500_000_200_000, frame(2448, 8)),
        ];
        for (nanos, big) in [(false, false), (true, false), (false, true), (true, true)] {
            let (got, err) = read(&pcap(nanos, big, linktype::ETHERNET, &packets));
            assert_eq!(err, None);
            assert_eq!(got.len(), 2);
            assert_eq!(got[0].ts_ns, 1_500_000_123_000);
            let s = segment(&got[1]).unwrap();
            assert_eq!(
                (s.seq, s.payload_len, s.timestamp),
                (2448, 100, Some((8, 0)))
            );
            assert_eq!(s.flow.dst.port(), 5201);
            assert_eq!(s.ip_id, Some(7));
        }
    }

    #[test]
    fn other_link_types_are_unwrapped_to_the_ip_packet() {
        let ip = frame(1, 1)[14..].to_vec();
        let mut sll = vec![0u8; 16];
        sll[14..16].copy_from_slice(&0x0800u16.to_be_bytes());
        sll.extend(&ip);
        let mut sll2 = vec![0u8; 20];
        sll2[0..2].copy_from_slice(&0x0800u16.to_be_bytes());
        sll2.extend(&ip);
        for (lt, data) in [
            (linktype::RAW, ip.clone()),
            (linktype::IPV4, ip.clone()),
            (linktype::LINUX_SLL, sll),
            (linktype::LINUX_SLL2, sll2),
        ] {
            let (got, _) = read(&pcap(false, false, lt, &[(1, data)]));
            assert_eq!(segment(&got[0]).map(|s| s.seq), Ok(1), "link type {lt}");
        }
        let (got, _) = read(&pcap(false, false, 147, &[(1, ip)]));
        assert_eq!(segment(&got[0]).err(), Some(Skip::LinkType(147)));
    }

    #[test]
    fn pcapng_gives_timestamps_queues_and_skips_other_blocks() {
        let file = pcapng(&[
            (1_700_000_000_123_456_789, Some(3), frame(10, 1)),
            (1_700_000_000_223_456_789, None, frame(1010, 2)),
        ]);
        let (got, err) = read(&file);
        assert_eq!(err, None);
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].ts_ns, got[0].queue),
            (1_700_000_000_123_456_789, Some(3))
        );
        assert_eq!(got[1].queue, None);
        let s = segment(&got[0]).unwrap();
        assert_eq!((s.seq, s.rx_queue), (10, 3));
    }

    #[test]
    fn damage_is_reported_with_its_offset_after_what_came_before() {
        let file = pcapng(&[(1, None, frame(10, 1)), (2, None, frame(1010, 2))]);
        // Cut inside the second packet's block: the first still reads.
        let (got, err) = read(&file[..file.len() - 10]);
        assert_eq!(got.len(), 1);
        let err = err.unwrap();
        assert!(err.what.contains("cut short"), "{err}");
        assert!(err.offset > got[0].offset, "{err}");
        // An absurd block length, at the length field's offset.
        let mut bad = file.clone();
        let second = got[0].offset as usize;
        bad[second + 4..second + 8].copy_from_slice(&7u32.to_le_bytes());
        let (got, err) = read(&bad);
        assert_eq!(
            (got.len(), err.as_ref().map(|e| e.offset)),
            (0, Some(second as u64 + 4)),
            "{err:?}"
        );
        // Garbage, and an empty file.
        let (_, err) = read(b"GIF89a this is not a capture");
        assert_eq!(
            err.unwrap().to_string(),
            "at byte 0: not a pcap or pcapng file (magic 47494638)"
        );
        assert!(read(b"")
            .1
            .unwrap()
            .what
            .contains("shorter than a file header"));
        // A pcap record claiming a gigabyte.
        let mut p = pcap(false, false, linktype::ETHERNET, &[(1, frame(1, 1))]);
        p[24 + 8..24 + 12].copy_from_slice(&(1u32 << 30).to_le_bytes());
        let err = read(&p).1.unwrap();
        assert_eq!(err.offset, 24 + 8);
        assert!(err.what.contains("more than any packet"), "{err}");
        // Every cut of a small file ends in a clean error or a clean end,
        // never a panic, and never more packets than it holds.
        for cut in 0..file.len() {
            let (got, _) = read(&file[..cut]);
            assert!(got.len() <= 2);
        }
    }
}
