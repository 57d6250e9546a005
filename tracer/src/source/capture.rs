//! Capture files: pcap and pcapng from any source (ours, tcpdump's,
//! Wireshark's), read block by block into the same [`Segment`]s the XDP
//! program produces, through the same header parser.
//!
//! Link types: Ethernet (VLAN-tagged too), raw IP, Linux cooked (SLL and
//! SLL2). The RX queue comes from pcapng's `epb_queue` option where the
//! capture has it; nothing in a pcap says the CPU. Our own traces
//! ([`crate::pcapng`]) also give the CPU, the kernel's TCP-layer events and
//! its counters, and their times on the kernel's clock, so that they read
//! back into the stream they were recorded from. A damaged file reads up
//! to its last whole record and then says where and what is wrong.

use std::io::{ErrorKind, Read};

use tracer_common::SegmentEvent;
use tracer_ebpf::parse::{self, ParseError};

use super::{Flow, Observation, Segment};
use crate::kernel::{AttachedMode, Counters, KernelReport};

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
    /// The CPU (our traces' custom option).
    pub cpu: Option<u32>,
    /// Summary mode: the segments of its flow counted, not emitted, before
    /// it (our traces' custom option; else 0).
    pub summarized_before: u32,
    /// And one past the last byte they carried (traces since it was
    /// recorded).
    pub summarized_end: Option<u32>,
    /// The interface's kernel index (our traces; else 0).
    pub ifindex: u32,
    pub data: Vec<u8>,
    /// Where its record starts in the file.
    pub offset: u64,
}

use super::format::{
    block, custom, exported_pdu, linktype, opt, BYTE_ORDER, PCAPNG_SHB, PCAP_NS, PCAP_US,
};

/// Longest record accepted: more is a damaged length, not a packet.
const MAX_RECORD: u32 = 1 << 20;
/// Longest pcapng block accepted.
const MAX_BLOCK: u32 = 16 << 20;

/// What our trace's meta block said.
#[derive(Clone, Copy)]
struct Meta {
    clock_offset: i64,
    ifindex: u32,
}

struct Interface {
    linktype: u32,
    snaplen: u32,
    /// Our trace's: the clock offset and ifindex of the traced interface;
    /// whether the packets are kernel records.
    meta: Option<Meta>,
    records: bool,
    /// Nanoseconds per timestamp unit, as a ratio (units per second).
    units_per_s: u64,
}

enum Kind {
    Pcap { nanos: bool, linktype: u32 },
    Pcapng { interfaces: Vec<Interface> },
}

/// What a capture holds, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Packet(Packet),
    /// A kernel record from our trace's records interface (TCP-layer
    /// events; segments whose frame bytes were not captured). Boxed, as is
    /// the next: packets, by far the most items, move small.
    Record(Box<Observation>),
    /// The kernel's counters at that point (our statistics blocks).
    Counters(Box<Counters>),
    /// One of our records that did not decode (another version's, or a
    /// section in a foreign byte order).
    Undecodable,
}

/// Reads packets from a capture, one record at a time.
pub struct CaptureReader<R> {
    input: R,
    offset: u64,
    big_endian: bool,
    kind: Kind,
    done: bool,
    /// Our trace's: the kernel it was recorded on (its last section's).
    linux: Option<KernelReport>,
    /// Whether the receiver sent DSACKs (our traces, since they say).
    receiver_dsack: Option<bool>,
    /// The XDP attachment our trace was taken with (since they say).
    xdp: Option<AttachedMode>,
    /// The last pcapng block's body, its room reused for the next.
    block: Vec<u8>,
    /// Room for the next packet's bytes: a packet's own, handed back by
    /// [`CaptureReader::recycle`] (an allocation a packet cost 10% of
    /// `analyze`'s time).
    spare: Vec<u8>,
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
            linux: None,
            receiver_dsack: None,
            xdp: None,
            block: Vec::new(),
            spare: Vec::new(),
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
        let mut buf = Vec::new();
        self.read_into(&mut buf, n, what)?;
        Ok(buf)
    }

    /// Reads `n` bytes into `buf` (its room reused); short means cut.
    fn read_into(&mut self, buf: &mut Vec<u8>, n: usize, what: &str) -> Result<(), CaptureError> {
        buf.clear();
        buf.resize(n, 0);
        self.input
            .read_exact(buf)
            .map_err(|_| truncated(self.offset, what))?;
        self.offset += n as u64;
        Ok(())
    }

    /// A packet's bytes, once read: their room holds the next packet's.
    pub fn recycle(&mut self, data: Vec<u8>) {
        self.spare = data;
    }

    /// `data`, in the recycled room.
    fn packet_bytes(&mut self, data: &[u8]) -> Vec<u8> {
        let mut v = std::mem::take(&mut self.spare);
        v.clear();
        v.extend_from_slice(data);
        v
    }

    fn u32_at(&self, b: &[u8], at: usize) -> u32 {
        let w = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if self.big_endian {
            u32::from_be_bytes(w)
        } else {
            u32::from_le_bytes(w)
        }
    }

    fn u64_at(&self, b: &[u8], at: usize) -> u64 {
        let (first, second) = (
            u64::from(self.u32_at(b, at)),
            u64::from(self.u32_at(b, at + 4)),
        );
        if self.big_endian {
            (first << 32) | second
        } else {
            (second << 32) | first
        }
    }

    /// The data of one of our custom blocks or options (after the PEN and
    /// the tag), if `b` is one with `tag`.
    fn ours<'b>(&self, b: &'b [u8], tag: [u8; 4]) -> Option<&'b [u8]> {
        (b.len() >= 8 && self.u32_at(b, 0) == custom::PEN && b[4..8] == tag).then(|| &b[8..])
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
        let body = self.bytes(total as usize - 12, "a section header")?;
        // Version (4 bytes) and section length (8), options, the trailer.
        let options_at = body
            .get(12..body.len().saturating_sub(4))
            .unwrap_or_default();
        self.linux = options(self.big_endian, options_at)
            .filter(|&(code, _)| code == opt::CUSTOM_BINARY)
            .find_map(|(_, v)| self.ours(v, custom::LINUX).map(custom::parse_linux));
        self.receiver_dsack = options(self.big_endian, options_at)
            .filter(|&(code, _)| code == opt::CUSTOM_BINARY)
            .find_map(|(_, v)| self.ours(v, custom::DSACK))
            .and_then(|d| d.first().map(|&b| b != 0));
        self.xdp = options(self.big_endian, options_at)
            .filter(|&(code, _)| code == opt::CUSTOM_BINARY)
            .find_map(|(_, v)| self.ours(v, custom::XDP))
            .and_then(|m| AttachedMode::named(std::str::from_utf8(m).ok()?));
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

    /// Whether the traced receiver sent DSACKs, as our trace's section
    /// says (read with it).
    pub fn receiver_dsack(&self) -> Option<bool> {
        self.receiver_dsack
    }

    /// The XDP attachment our trace was taken with, as its section says.
    pub fn xdp(&self) -> Option<AttachedMode> {
        self.xdp
    }

    /// Bytes read so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next packet, or `None` at the end of the file (what else the
    /// file holds is skipped: see [`CaptureReader::next_item`]).
    pub fn next_packet(&mut self) -> Option<Result<Packet, CaptureError>> {
        loop {
            match self.next_item()? {
                Ok(Item::Packet(p)) => return Some(Ok(p)),
                Ok(_) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// The next item, or `None` at the end of the file.
    pub fn next_item(&mut self) -> Option<Result<Item, CaptureError>> {
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

    fn pcap_record(&mut self) -> Option<Result<Item, CaptureError>> {
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
        let mut data = std::mem::take(&mut self.spare);
        if let Err(e) = self.read_into(&mut data, len as usize, "a packet") {
            return Some(Err(e));
        }
        Some(Ok(Item::Packet(Packet {
            ts_ns: secs * 1_000_000_000 + if nanos { frac } else { frac * 1000 },
            linktype,
            interface: 0,
            queue: None,
            cpu: None,
            summarized_before: 0,
            summarized_end: None,
            ifindex: 0,
            data,
            offset: at,
        })))
    }

    fn pcapng_packet(&mut self) -> Option<Result<Item, CaptureError>> {
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
            let mut body = std::mem::take(&mut self.block);
            if let Err(e) = self.block_body(&mut body, at) {
                return Some(Err(e));
            }
            let item = self.pcapng_block(kind, &body, at);
            self.block = body;
            match item {
                Ok(Some(p)) => return Some(Ok(p)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// A block's body (its type was read) into `body`, trailing length
    /// checked.
    fn block_body(&mut self, body: &mut Vec<u8>, at: u64) -> Result<(), CaptureError> {
        let mut len = [0u8; 4];
        self.input
            .read_exact(&mut len)
            .map_err(|_| truncated(self.offset, "a block header"))?;
        self.offset += 4;
        let total = self.u32_at(&len, 0);
        self.check_block(at, total)?;
        self.read_into(body, total as usize - 8, "a block")?;
        let trailer = body.len() - 4;
        if self.u32_at(body, trailer) != total {
            return Err(CaptureError {
                offset: at + u64::from(total) - 4,
                what: "pcapng block's trailing length differs from its leading one".into(),
            });
        }
        body.truncate(trailer);
        Ok(())
    }

    fn pcapng_block(
        &mut self,
        kind: u32,
        body: &[u8],
        at: u64,
    ) -> Result<Option<Item>, CaptureError> {
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
                let (mut meta, mut records) = (None, false);
                for (code, value) in options(self.big_endian, &body[8..]) {
                    if code == opt::CUSTOM_BINARY {
                        if let Some(m) = self.ours(value, custom::META).filter(|m| m.len() >= 12) {
                            meta = Some(Meta {
                                clock_offset: self.u64_at(m, 0) as i64,
                                ifindex: self.u32_at(m, 8),
                            });
                        }
                        records |= self.ours(value, custom::RECORD).is_some();
                    }
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
                    meta,
                    records,
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
                let iface = self.interface(id, at)?;
                let data = &body[20..20 + caplen];
                if iface.records {
                    return Ok(Some(self.kernel_record(data)));
                }
                let (linktype, units_per_s, meta) = (iface.linktype, iface.units_per_s, iface.meta);
                let (mut queue, mut cpu) = (None, None);
                let (mut summarized_before, mut summarized_end) = (0, None);
                for (code, v) in options(self.big_endian, &body[20 + padded..]) {
                    match code {
                        opt::EPB_QUEUE if v.len() >= 4 => queue = Some(self.u32_at(v, 0)),
                        opt::CUSTOM_BINARY => {
                            if let Some(c) = self.ours(v, custom::CPU).filter(|c| c.len() >= 4) {
                                cpu = Some(self.u32_at(c, 0));
                            }
                            if let Some(n) =
                                self.ours(v, custom::SUMMARIZED).filter(|n| n.len() >= 4)
                            {
                                summarized_before = self.u32_at(n, 0);
                                if n.len() >= 8 {
                                    summarized_end = Some(self.u32_at(n, 4));
                                }
                            }
                        }
                        _ => {}
                    }
                }
                let mut ts_ns = scale(ts, units_per_s);
                if let Some(m) = meta {
                    // Back onto the kernel's clock, as recorded.
                    ts_ns = (ts_ns as i64).wrapping_sub(m.clock_offset) as u64;
                }
                Ok(Some(Item::Packet(Packet {
                    ts_ns,
                    linktype,
                    interface: id,
                    queue,
                    cpu,
                    summarized_before,
                    summarized_end,
                    ifindex: meta.map_or(0, |m| m.ifindex),
                    data: self.packet_bytes(data),
                    offset: at,
                })))
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
                let linktype = self.interface(0, at)?.linktype;
                Ok(Some(Item::Packet(Packet {
                    ts_ns: 0,
                    linktype,
                    interface: 0,
                    queue: None,
                    cpu: None,
                    summarized_before: 0,
                    summarized_end: None,
                    ifindex: 0,
                    data: self.packet_bytes(&body[4..4 + caplen]),
                    offset: at,
                })))
            }
            block::ISB => {
                if body.len() < 12 {
                    return Err(short("interface statistics"));
                }
                for (code, v) in options(self.big_endian, &body[12..]) {
                    let Some(words) = (code == opt::CUSTOM_BINARY)
                        .then(|| self.ours(v, custom::COUNTERS))
                        .flatten()
                    else {
                        continue;
                    };
                    let words: Vec<u64> = (0..words.len() / 8)
                        .map(|i| self.u64_at(words, i * 8))
                        .collect();
                    return Ok(Some(
                        Counters::from_words(&words)
                            .map_or(Item::Undecodable, |c| Item::Counters(Box::new(c))),
                    ));
                }
                Ok(None)
            }
            // Name resolution, decryption secrets and unknown blocks.
            _ => Ok(None),
        }
    }

    /// A packet of our records' interface: the kernel's bytes, in the byte
    /// order of the host that recorded them (the section's).
    fn kernel_record(&self, pdu: &[u8]) -> Item {
        if self.big_endian != cfg!(target_endian = "big") {
            return Item::Undecodable;
        }
        exported_pdu::payload(pdu)
            .and_then(|r| super::decode(r).ok())
            .map_or(Item::Undecodable, |r| Item::Record(Box::new(r)))
    }

    fn interface(&self, id: u32, at: u64) -> Result<&Interface, CaptureError> {
        let Kind::Pcapng { interfaces } = &self.kind else {
            unreachable!("pcapng state");
        };
        interfaces.get(id as usize).ok_or_else(|| CaptureError {
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
/// (queue, CPU and interface index where the capture says them, else 0).
pub fn segment(p: &Packet) -> Result<Segment, Skip> {
    let frame = ethernet_frame(p)?;
    let mut e = SegmentEvent::default();
    parse::parse_segment(&frame[..], &mut e).map_err(|err| match err {
        ParseError::Truncated => Skip::Truncated,
        _ => Skip::NotTcp,
    })?;
    e.ts_ns = p.ts_ns;
    e.rx_queue = p.queue.unwrap_or(0);
    e.cpu = p.cpu.unwrap_or(0);
    e.ifindex = p.ifindex;
    e.summarized = p.summarized_before;
    let mut s: Segment = e.into();
    s.summarized_end = p.summarized_end.filter(|_| p.summarized_before > 0);
    Ok(s)
}

/// The packet as an Ethernet frame (what the parser reads): itself, or
/// its IP packet behind a made-up Ethernet header.
fn ethernet_frame(p: &Packet) -> Result<std::borrow::Cow<'_, [u8]>, Skip> {
    let with_ethertype = |ethertype: u16, payload: &[u8]| {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f.into()
    };
    let d = &p.data;
    match p.linktype {
        linktype::ETHERNET => Ok(d[..].into()),
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

/// What a capture held, as [`Observations`] read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureSummary {
    pub packets: u64,
    /// TCP segments (and our traces' kernel records) passed on.
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
    /// Our traces' kernel records that did not decode.
    pub undecodable: u64,
    /// The kernel's final counters, from our trace's last statistics block.
    pub kernel: Option<Counters>,
    /// The kernel our trace was recorded on.
    pub linux: Option<KernelReport>,
    /// Where the file stopped making sense (what came before was passed
    /// on).
    pub error: Option<CaptureError>,
}

/// A capture's observations in file order: every TCP segment (and our
/// traces' kernel records) whose flow `keep` passes; what the file held is
/// counted on the way ([`Observations::summary`]).
pub struct Observations<R: Read, K: Fn(&Flow) -> bool> {
    reader: CaptureReader<R>,
    keep: K,
    summary: CaptureSummary,
}

impl<R: Read, K: Fn(&Flow) -> bool> Observations<R, K> {
    pub fn new(reader: CaptureReader<R>, keep: K) -> Self {
        Self {
            reader,
            keep,
            summary: CaptureSummary::default(),
        }
    }

    /// Bytes of the file read so far.
    pub fn offset(&self) -> u64 {
        self.reader.offset()
    }

    /// What the file held (all of it once the iterator has ended).
    pub fn summary(mut self) -> CaptureSummary {
        self.summary.linux = self.reader.linux.take();
        self.summary
    }
}

impl<R: Read, K: Fn(&Flow) -> bool> Iterator for Observations<R, K> {
    type Item = Observation;

    fn next(&mut self) -> Option<Observation> {
        let s = &mut self.summary;
        if s.error.is_some() {
            return None;
        }
        while let Some(item) = self.reader.next_item() {
            let p = match item {
                Ok(Item::Packet(p)) => p,
                Ok(Item::Record(obs)) => {
                    let segment = u64::from(matches!(*obs, Observation::Segment(_)));
                    if (self.keep)(&obs.flow()) {
                        s.tcp += segment;
                        return Some(*obs);
                    }
                    s.filtered += segment;
                    continue;
                }
                Ok(Item::Counters(c)) => {
                    s.kernel = Some(*c);
                    continue;
                }
                Ok(Item::Undecodable) => {
                    s.undecodable += 1;
                    continue;
                }
                Err(e) => {
                    s.error = Some(e);
                    return None;
                }
            };
            s.packets += 1;
            s.queues |= p.queue.is_some();
            if s.packets == 1 {
                s.first_ns = p.ts_ns;
            }
            s.last_ns = s.last_ns.max(p.ts_ns);
            let seg = segment(&p);
            self.reader.recycle(p.data);
            match seg {
                Ok(seg) if !(self.keep)(&seg.flow) => s.filtered += 1,
                Ok(seg) => {
                    s.tcp += 1;
                    return Some(Observation::Segment(seg));
                }
                Err(Skip::NotTcp) => s.non_tcp += 1,
                Err(Skip::Truncated) => s.truncated += 1,
                Err(Skip::LinkType(_)) => s.unsupported_link += 1,
            }
        }
        None
    }
}

impl<R: Read + Send, K: Fn(&Flow) -> bool + Send> Observations<R, K> {
    /// Every observation, in file order, to `consume` (with the bytes of
    /// the file read so far), while the file is read and parsed on another
    /// thread a batch ahead: the reader's half of the work (a third of
    /// `analyze`'s) runs beside the engine's instead of before it. The
    /// order is the file's, so the engine's answers are the same.
    pub fn read_ahead(self, mut consume: impl FnMut(Observation, u64)) -> CaptureSummary {
        /// Observations a batch: a hand-over costs about a microsecond.
        const BATCH: usize = 4096;
        /// Batches in flight: the reader stays ahead without filling memory.
        const AHEAD: usize = 4;
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<(Vec<Observation>, u64)>(AHEAD);
        let (empty_tx, empty_rx) = std::sync::mpsc::channel::<Vec<Observation>>();
        std::thread::scope(|scope| {
            let reader = scope.spawn(move || {
                let mut this = self;
                loop {
                    let mut batch = empty_rx
                        .try_recv()
                        .unwrap_or_else(|_| Vec::with_capacity(BATCH));
                    batch.extend(this.by_ref().take(BATCH));
                    let last = batch.len() < BATCH;
                    // A consumer that stopped reading ends the reader too.
                    if full_tx.send((batch, this.offset())).is_err() || last {
                        return this.summary();
                    }
                }
            });
            for (mut batch, offset) in full_rx {
                for obs in batch.drain(..) {
                    consume(obs, offset);
                }
                let _ = empty_tx.send(batch);
            }
            reader.join().expect("the capture reader thread panicked")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet + IPv4 + TCP frame: `seq`, 100 payload bytes (headers
    /// only captured), TSval `tsval`.
    pub(super) fn frame(seq: u32, tsval: u32) -> Vec<u8> {
        use tracer_ebpf::test_frames::{eth, ipv4, set_ipv4_id, tcp, timestamps, Tcp};
        let t = Tcp {
            seq,
            flags: tracer_common::tcp_flags::ACK,
            window: 512,
            options: timestamps(tsval, 0),
            ..Tcp::default()
        };
        let mut f = eth(0x0800, &[], &ipv4(6, 0x4000, &[], &tcp(&t)));
        set_ipv4_id(&mut f, 7);
        f.truncate(14 + 20 + 32);
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
    fn reading_ahead_gives_what_reading_in_turn_gives() {
        // Batches and more: segments of 3 flows, a non-TCP frame every
        // 7th, a port filter, and the file cut inside its last record.
        let packets: Vec<(u64, Option<u32>, Vec<u8>)> = (0..10_000u32)
            .map(|i| {
                let mut f = frame(1000 + i * 100, i);
                f[34..36].copy_from_slice(&(40_000 + (i % 3) as u16).to_be_bytes());
                if i % 7 == 0 {
                    f[12] = 0x88; // not IP
                }
                (u64::from(i) * 1000, Some(i % 4), f)
            })
            .collect();
        let mut bytes = pcapng(&packets);
        bytes.truncate(bytes.len() - 10);
        let keep = |f: &Flow| f.src.port() != 40_001;
        let observations = || Observations::new(CaptureReader::new(&bytes[..]).unwrap(), keep);
        let mut in_turn = observations();
        let expected: Vec<Observation> = in_turn.by_ref().collect();
        let expected_summary = in_turn.summary();
        let mut got = Vec::new();
        let mut offsets = Vec::new();
        let summary = observations().read_ahead(|obs, offset| {
            got.push(obs);
            offsets.push(offset);
        });
        assert!(expected.len() > 5_000, "{}", expected.len());
        assert_eq!(got, expected);
        assert_eq!(summary, expected_summary);
        assert!(summary.error.is_some() && summary.non_tcp > 1000 && summary.filtered > 1000);
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
        assert!(*offsets.last().unwrap() <= bytes.len() as u64);
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

/// Our own traces: what [`crate::pcapng::PcapngWriter`] writes reads back
/// as the stream it was given.
#[cfg(test)]
mod round_trip {
    use super::*;
    use crate::{
        pcapng::{Interface, PcapngWriter},
        sink::Sink,
        source::{Frame, Raw},
    };
    use tracer_common::{counter, kind, ProbeEvent};

    fn bytes_of<T>(v: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a repr(C) plain-data value.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    /// A captured segment: the test frame parsed as XDP would, with the
    /// kernel's fields set.
    fn captured(seq: u32, ts_ns: u64, queue: u32, cpu: u32) -> (Observation, Vec<u8>) {
        let mut f = tests_frame(seq);
        f.truncate(14 + 20 + 32); // headers only
        let mut e = SegmentEvent::default();
        parse::parse_segment(&f[..], &mut e).unwrap();
        (e.kind, e.ts_ns, e.rx_queue, e.cpu, e.ifindex) =
            (kind::XDP_CAPTURED, ts_ns, queue, cpu, 7);
        (Observation::Segment(e.into()), f)
    }

    fn tests_frame(seq: u32) -> Vec<u8> {
        super::tests::frame(seq, 99)
    }

    /// A segment and its captured `frame` to `w`.
    fn write_segment(w: &mut PcapngWriter, obs: &Observation, frame: &[u8], wire_len: u32) {
        let raw = Raw {
            record: &[],
            frame: Some(Frame {
                data: frame,
                wire_len,
            }),
        };
        w.observe(obs, &raw);
    }

    fn write_trace(path: &std::path::Path) -> (Vec<Observation>, Counters) {
        let file = crate::output::OutputFile::open(path)
            .unwrap()
            .start()
            .unwrap();
        let iface = Interface {
            name: "veth0".into(),
            description: "veth0, XDP native, headers only".into(),
            ifindex: 7,
            kernel: KernelReport {
                release: "6.1.0-57-cloud-amd64".into(),
                missing: vec!["no err".into(), "no more".into()],
            },
            receiver_dsack: Some(false),
            xdp: AttachedMode::Generic,
        };
        let mut w = PcapngWriter::create(path, file, iface).unwrap();
        let mut sent = Vec::new();
        let mut counters = Counters::default();
        for i in 0..50u32 {
            let (obs, frame) = captured(
                1000 + i * 100,
                5_000_000 + u64::from(i) * 1000,
                i % 4,
                i % 2,
            );
            write_segment(&mut w, &obs, &frame, frame.len() as u32 + 100);
            sent.push(obs);
            if i % 10 == 3 {
                // A TCP-layer record, as the ring gives it.
                let p = ProbeEvent {
                    kind: kind::TCP_PROBE,
                    ts_ns: 5_000_500 + u64::from(i) * 1000,
                    seq: 1000 + i * 100,
                    end_seq: 1100 + i * 100,
                    payload_len: 100,
                    srtt_us: 800,
                    ..Default::default()
                };
                let raw = bytes_of(&p);
                let obs = crate::source::decode(&raw).unwrap();
                w.observe(
                    &obs,
                    &Raw {
                        record: &raw,
                        frame: None,
                    },
                );
                sent.push(obs);
            }
            if i % 20 == 0 {
                counters.map[counter::XDP_FRAMES as usize] = u64::from(i) + 1;
                counters.map[counter::XDP_DROPPED as usize] = u64::from(i / 20);
                counters.probe_first_copy_misses = 3;
                w.flush(&counters).unwrap();
            }
        }
        w.flush(&counters).unwrap();
        assert_eq!(w.written(), (50, 5));
        (sent, counters)
    }

    fn items(bytes: &[u8]) -> (Vec<Item>, Option<CaptureError>) {
        let mut r = CaptureReader::new(bytes).unwrap();
        let mut out = Vec::new();
        while let Some(item) = r.next_item() {
            match item {
                Ok(i) => out.push(i),
                Err(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }

    #[test]
    fn our_trace_reads_back_as_the_recorded_stream() {
        let path = std::env::temp_dir().join(format!("tracer-rt-{}.pcapng", std::process::id()));
        // An existing file with looser permissions is made private too.
        std::fs::write(&path, b"old").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (sent, counters) = write_trace(&path);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(mode, 0o600);

        let (got, err) = items(&bytes);
        assert_eq!(err, None);
        let mut stream = Vec::new();
        let mut last_counters = None;
        for item in got {
            match item {
                Item::Packet(p) => {
                    assert_eq!(p.data.len(), 66, "headers only");
                    stream.push(Observation::Segment(segment(&p).unwrap()));
                }
                Item::Record(obs) => stream.push(*obs),
                Item::Counters(c) => last_counters = Some(*c),
                Item::Undecodable => panic!("undecodable record"),
            }
        }
        // Every field: times back on the kernel's clock, queue, CPU, ifindex.
        assert_eq!(stream, sent);
        assert_eq!(last_counters, Some(counters));
        // The section says which kernel, and what it lacked.
        let mut r = CaptureReader::new(&bytes[..]).unwrap();
        while r.next_item().is_some() {}
        assert_eq!(r.receiver_dsack(), Some(false));
        assert_eq!(r.xdp(), Some(AttachedMode::Generic));
        let linux = r.linux.expect("the kernel recorded on");
        assert_eq!(linux.release, "6.1.0-57-cloud-amd64");
        assert_eq!(linux.missing, ["no err", "no more"]);
    }

    /// `watch --pcapng`: a ring of 16 KiB files, three kept, one left by
    /// an earlier run among them. Each file kept is a whole trace within
    /// its size, ending with its statistics; read in order they are the
    /// stream's last segments, none missing, up to the last written.
    #[test]
    fn a_ring_keeps_the_latest_files_each_whole_and_within_its_size() {
        let dir = std::env::temp_dir().join(format!("tracer-ring-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let earlier = dir.join("trace-20200101T000000Z-000001.pcapng");
        std::fs::write(&earlier, b"").unwrap();
        let kept =
            crate::output::KeptFiles::open(&dir, 3, crate::pcapng::RING_PREFIX, ".pcapng").unwrap();
        let iface = Interface {
            name: "veth0".into(),
            description: "veth0".into(),
            ifindex: 7,
            kernel: KernelReport::default(),
            receiver_dsack: None,
            xdp: AttachedMode::Native,
        };
        const FILE_BYTES: u64 = 16 << 10;
        let mut w = PcapngWriter::ring(kept, FILE_BYTES, iface).unwrap();
        let mut sent = Vec::new();
        let counters = Counters::default();
        for i in 0..1000u32 {
            let (obs, frame) = captured(1000 + i * 100, 5_000_000 + u64::from(i) * 1000, 0, 0);
            write_segment(&mut w, &obs, &frame, frame.len() as u32);
            sent.push(obs);
            if i % 50 == 0 {
                w.flush(&counters).unwrap();
            }
        }
        w.flush(&counters).unwrap();
        assert_eq!(w.written(), (1000, 0));
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(!earlier.exists(), "the earlier run's file went first");
        assert_eq!(files.len(), 3, "{files:?}");
        let mut stream = Vec::new();
        for (i, f) in files.iter().enumerate() {
            let bytes = std::fs::read(f).unwrap();
            let n = bytes.len() as u64;
            assert!(n <= FILE_BYTES, "{}: {n}", f.display());
            // Ended only when the next packet (~130 bytes) would have left
            // less than the 4 KiB its statistics keep free.
            if i < 2 {
                assert!(n > FILE_BYTES - 4096 - 256, "{}: {n}", f.display());
            }
            let (got, err) = items(&bytes);
            assert_eq!(err, None, "{}", f.display());
            assert!(
                matches!(got.last(), Some(Item::Counters(_))),
                "{}",
                f.display()
            );
            for item in got {
                if let Item::Packet(p) = item {
                    stream.push(Observation::Segment(segment(&p).unwrap()));
                }
            }
        }
        assert_eq!(stream, sent[sent.len() - stream.len()..]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_trace_cut_anywhere_reads_to_its_last_whole_block() {
        let path = std::env::temp_dir().join(format!("tracer-cut-{}.pcapng", std::process::id()));
        write_trace(&path);
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let (whole, _) = items(&bytes);
        let section_header = u32::from_ne_bytes(bytes[4..8].try_into().unwrap()) as usize;
        let mut last = 0;
        for cut in (0..bytes.len()).step_by(7) {
            let Ok(mut r) = CaptureReader::new(&bytes[..cut]) else {
                assert!(cut < section_header, "the section header is whole at {cut}");
                continue;
            };
            let mut n = 0;
            let mut end = None;
            while let Some(item) = r.next_item() {
                match item {
                    Ok(_) => n += 1,
                    Err(e) => {
                        end = Some(e);
                        break;
                    }
                }
            }
            assert!(n >= last && n <= whole.len(), "cut {cut}: {n} items");
            last = n;
            if let Some(e) = end {
                assert!(e.what.contains("ends inside"), "cut {cut}: {e}");
                assert!(e.offset <= cut as u64);
            }
        }
        assert!(last >= whole.len() - 1);
    }
}
