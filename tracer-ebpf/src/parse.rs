//! Header parsing for the XDP program, written once for two worlds.
//!
//! The same code runs in the kernel (over the XDP packet pointers) and on the
//! host (over a byte slice, in unit tests with crafted frames). It only ever
//! reads through [`Frame::read`], which is bounds-checked, so a short or
//! malformed frame gives an error instead of an out-of-bounds read; in the
//! kernel the same check is what the verifier needs to see.

use tracer_common::{
    SackBlock, SegmentEvent, FAMILY_IPV4, FAMILY_IPV6, MAX_SACK_BLOCKS, OPT_FIRST_FRAGMENT,
    OPT_TIMESTAMP, OPT_VLAN,
};

/// Read access to the bytes of one frame.
pub trait Frame {
    /// The `T` stored (unaligned) at `offset` bytes from the start of the
    /// frame, or `None` if the frame ends before `offset + size_of::<T>()`.
    fn read<T: Copy>(&self, offset: usize) -> Option<T>;

    #[inline(always)]
    fn u8_at(&self, offset: usize) -> Result<u8, ParseError> {
        self.read::<u8>(offset).ok_or(ParseError::Truncated)
    }

    #[inline(always)]
    fn be16_at(&self, offset: usize) -> Result<u16, ParseError> {
        self.read::<u16>(offset)
            .map(u16::from_be)
            .ok_or(ParseError::Truncated)
    }

    #[inline(always)]
    fn be32_at(&self, offset: usize) -> Result<u32, ParseError> {
        self.read::<u32>(offset)
            .map(u32::from_be)
            .ok_or(ParseError::Truncated)
    }

    /// The frame's first `N` bytes, checked once, for reads at constant
    /// offsets (the common frame's fixed headers); None if it is shorter.
    type Head<const N: usize>: Head<N>;
    fn head<const N: usize>(&self) -> Option<Self::Head<N>>;

    /// Copies `len` (1 to [`MAX_TCP_OPTION_BYTES`]) bytes at `offset` into
    /// the start of `buf`, or fails if the frame is shorter.
    fn copy_options(&self, offset: usize, len: usize, buf: &mut OptionBytes) -> Option<()>;

    /// `i`, passed through a value LLVM cannot see into (in the kernel
    /// implementation), so that a mask applied to the result is kept: LLVM
    /// would drop it as redundant, and the verifier, which knows less than
    /// LLVM, would then reject the variable-offset stack read.
    #[inline(always)]
    fn opaque(&self, i: usize) -> usize {
        i
    }

    /// `a < b`; in the kernel one jump with `a` on the left. A 6.1
    /// verifier decides a comparison from its right operand only: with the
    /// constant on the left (LLVM's choice) it also walks the way that
    /// cannot be taken, where bounds contradict each other, and rejects
    /// the program there.
    #[inline(always)]
    fn below(&self, a: usize, b: usize) -> bool {
        a < b
    }

    /// `a <= b`, as [`Frame::below`].
    #[inline(always)]
    fn at_most(&self, a: usize, b: usize) -> bool {
        a <= b
    }
}

/// A frame's first `N` bytes, known to be there: reads at constant offsets
/// need no further check (in the kernel, one bounds check and one load
/// instruction each, instead of a check and byte loads per field).
pub trait Head<const N: usize> {
    fn u8_at<const O: usize>(&self) -> u8;
    fn be16_at<const O: usize>(&self) -> u16;
    fn be32_at<const O: usize>(&self) -> u32;
    /// Four bytes read as a little-endian word.
    fn le32_at<const O: usize>(&self) -> u32;
    /// Eight bytes read as a little-endian word.
    fn le64_at<const O: usize>(&self) -> u64;
}

impl<const N: usize> Head<N> for [u8; N] {
    fn u8_at<const O: usize>(&self) -> u8 {
        self[O]
    }

    fn be16_at<const O: usize>(&self) -> u16 {
        u16::from_be_bytes([self[O], self[O + 1]])
    }

    fn be32_at<const O: usize>(&self) -> u32 {
        u32::from_be_bytes([self[O], self[O + 1], self[O + 2], self[O + 3]])
    }

    fn le32_at<const O: usize>(&self) -> u32 {
        u32::from_le_bytes([self[O], self[O + 1], self[O + 2], self[O + 3]])
    }

    fn le64_at<const O: usize>(&self) -> u64 {
        let mut b = [0; 8];
        b.copy_from_slice(&self[O..O + 8]);
        u64::from_le_bytes(b)
    }
}

/// TCP option bytes copied out of the frame. Twice the largest option area,
/// so an index masked with `OPTION_INDEX_MASK` is always in bounds: the
/// option walk then never needs a bounds check that can fail (and the
/// verifier sees plain stack reads, which keeps its state count small).
pub type OptionBytes = [u8; 64];
const OPTION_INDEX_MASK: usize = 63;

impl Frame for [u8] {
    type Head<const N: usize> = [u8; N];

    fn head<const N: usize>(&self) -> Option<[u8; N]> {
        self.get(..N)?.try_into().ok()
    }

    fn read<T: Copy>(&self, offset: usize) -> Option<T> {
        let end = offset.checked_add(core::mem::size_of::<T>())?;
        let bytes = self.get(offset..end)?;
        // SAFETY: `bytes` holds exactly size_of::<T>() bytes; the read is
        // unaligned and T is plain data (Copy integers and arrays).
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
    }

    fn copy_options(&self, offset: usize, len: usize, buf: &mut OptionBytes) -> Option<()> {
        let bytes = self.get(offset..offset.checked_add(len)?)?;
        buf.get_mut(..len)?.copy_from_slice(bytes);
        Some(())
    }
}

/// Why a frame produced no segment. Each maps to one kernel counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Not a TCP segment (another ethertype or IP protocol).
    NonTcp,
    /// A header is cut short or its length fields are impossible.
    Truncated,
    /// A header chain the parser does not follow (see [`MAX_IPV6_EXT`], ESP,
    /// more than two VLAN tags).
    Unsupported,
    /// A non-first IP fragment: it has no TCP header.
    Fragment,
}

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;
const IPPROTO_TCP: u8 = 6;
/// Most VLAN tags followed (802.1ad outer + 802.1Q inner).
pub const MAX_VLAN_TAGS: usize = 2;
/// Most IPv6 extension headers followed before giving up.
pub const MAX_IPV6_EXT: usize = 4;
/// Most TCP option bytes (data offset 15 words minus the fixed header).
pub const MAX_TCP_OPTION_BYTES: usize = 40;
/// Most options (NOPs included) walked per segment. Real stacks send at most
/// eight (`NOP NOP TS NOP NOP SACK` on data; macOS SYNs carry eight); later
/// ones are not read. The verifier's work grows with the cube of this bound.
pub const MAX_TCP_OPTIONS: usize = 10;

/// Sets `v` to zeros in word stores. On the bpf target LLVM turns a plain
/// zeroing of more than a few words (`*v = Default::default()`, `[0; 64]`)
/// into a call to a byte-by-byte memset subprogram, which cost the XDP
/// program more than its parsing (found with `cargo xtask bench`).
/// `T` must be a multiple of 8 bytes, 8-aligned, and valid as all zeros.
#[inline(always)]
pub fn zero_words<T: Copy>(v: &mut T) {
    const { assert!(size_of::<T>().is_multiple_of(8) && align_of::<T>() >= 8) };
    let p = (v as *mut T).cast::<u64>();
    for i in 0..size_of::<T>() / 8 {
        // SAFETY: within `v`, aligned (checked above); volatile, so that
        // LLVM does not fold the loop back into a memset.
        unsafe { p.add(i).write_volatile(0) };
    }
}

/// Parses an Ethernet frame into the header fields of `out`.
///
/// Fills `tcp_flags`, `sack_count`, `options`, `addrs`, `seq`, `ack`,
/// `payload_len`, `window`, `ip_id`, `tsval`, `tsecr`, `vlan` and `sack`;
/// leaves the fields only the kernel knows (kind, time, queue, CPU,
/// interface) alone.
#[inline(always)]
pub fn parse_segment<F: Frame + ?Sized>(f: &F, out: &mut SegmentEvent) -> Result<(), ParseError> {
    if let Some(parsed) = parse_plain_ipv4(f, out) {
        return parsed;
    }
    parse_any(f, out)
}

/// Ethernet, IPv4 without options and not a fragment, TCP: the frames a
/// tracer sees nearly always, checked once and read at fixed offsets, one
/// load instruction a field. Summary mode decides on these fields alone;
/// [`parse_plain_ipv4`] reads the rest.
pub struct PlainIpv4<H> {
    h: H,
    total_len: usize,
    doff: usize,
}

/// Bytes of the frame [`PlainIpv4`] checks: the headers without options.
const PLAIN_HEAD: usize = ETH_HLEN + 20 + 20;
const L4: usize = ETH_HLEN + 20;

/// The frame as a [`PlainIpv4`]; None: another kind of frame (or a
/// malformed one), for the general parser to say which.
#[inline(always)]
pub fn plain_ipv4<F: Frame + ?Sized>(f: &F) -> Option<PlainIpv4<F::Head<PLAIN_HEAD>>> {
    {
        let h = f.head::<PLAIN_HEAD>()?;
        // Two words: ethertype, IP version and header length (not the TOS
        // byte); flags and fragment offset (More Fragments or an offset:
        // the general path says which), protocol (not the TTL).
        if h.le32_at::<12>() & 0x00ff_ffff != u32::from_le_bytes([0x08, 0x00, 0x45, 0])
            || h.le32_at::<{ ETH_HLEN + 6 }>() & 0xff00_ff3f
                != u32::from_le_bytes([0, 0, 0, IPPROTO_TCP])
        {
            return None;
        }
        let total_len = usize::from(h.be16_at::<{ ETH_HLEN + 2 }>());
        let doff = usize::from(h.u8_at::<{ L4 + 12 }>() >> 4) * 4;
        if doff < 20 || total_len < 20 + doff {
            return None;
        }
        Some(PlainIpv4 { h, total_len, doff })
    }
}

impl<H: Head<PLAIN_HEAD>> PlainIpv4<H> {
    /// Source and destination address, the header's eight bytes read as
    /// one little-endian word (the source in the low half).
    #[inline(always)]
    pub fn addrs(&self) -> u64 {
        self.h.le64_at::<{ ETH_HLEN + 12 }>()
    }

    /// Source port (high half) and destination port.
    #[inline(always)]
    pub fn ports(&self) -> u32 {
        self.h.be32_at::<L4>()
    }

    #[inline(always)]
    pub fn sport(&self) -> u16 {
        (self.ports() >> 16) as u16
    }

    #[inline(always)]
    pub fn dport(&self) -> u16 {
        self.ports() as u16
    }

    #[inline(always)]
    pub fn seq(&self) -> u32 {
        self.h.be32_at::<{ L4 + 4 }>()
    }

    #[inline(always)]
    pub fn tcp_flags(&self) -> u8 {
        self.h.u8_at::<{ L4 + 13 }>()
    }

    #[inline(always)]
    pub fn payload_len(&self) -> u32 {
        (self.total_len - 20 - self.doff) as u32
    }
}

/// The fields of a plain IPv4 frame ([`PlainIpv4`]) into `out`, its TCP
/// options too. None: another kind of frame, for [`parse_any`], and
/// nothing written to `out`. Gives what `parse_any` gives (tested).
#[inline(always)]
fn parse_plain_ipv4<F: Frame + ?Sized>(
    f: &F,
    out: &mut SegmentEvent,
) -> Option<Result<(), ParseError>> {
    let p = plain_ipv4(f)?;
    let h = &p.h;
    out.ip_id = h.be16_at::<{ ETH_HLEN + 4 }>();
    out.addrs.family = FAMILY_IPV4;
    out.addrs.saddr[..4].copy_from_slice(&h.be32_at::<{ ETH_HLEN + 12 }>().to_be_bytes());
    out.addrs.daddr[..4].copy_from_slice(&h.be32_at::<{ ETH_HLEN + 16 }>().to_be_bytes());
    out.addrs.sport = p.sport();
    out.addrs.dport = p.dport();
    out.seq = p.seq();
    out.ack = h.be32_at::<{ L4 + 8 }>();
    out.tcp_flags = p.tcp_flags();
    out.window = h.be16_at::<{ L4 + 14 }>();
    out.payload_len = p.payload_len();
    out.header_len = (L4 + p.doff) as u16;
    // Timestamps alone (NOP, NOP, TS): read from a second fixed head.
    if p.doff == 32 {
        if let Some(h) = f.head::<{ L4 + 32 }>() {
            if h.be32_at::<{ L4 + 20 }>() == 0x0101_080a {
                out.tsval = h.be32_at::<{ L4 + 24 }>();
                out.tsecr = h.be32_at::<{ L4 + 28 }>();
                out.options |= OPT_TIMESTAMP;
                return Some(Ok(()));
            }
        }
    }
    Some(parse_tcp_options(f, L4 + 20, p.doff - 20, out))
}

/// Any frame the tracer follows: VLAN tags, IPv4 with options, IPv6 with
/// extension headers, every error.
#[inline(always)]
fn parse_any<F: Frame + ?Sized>(f: &F, out: &mut SegmentEvent) -> Result<(), ParseError> {
    let mut ethertype = f.be16_at(12)?;
    let mut l3 = ETH_HLEN;
    let mut tags = 0;
    while ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD {
        if tags == MAX_VLAN_TAGS {
            return Err(ParseError::Unsupported);
        }
        if tags == 0 {
            out.vlan = f.be16_at(l3)? & 0x0fff;
            out.options |= OPT_VLAN;
        }
        ethertype = f.be16_at(l3 + 2)?;
        l3 += 4;
        tags += 1;
    }

    // `l4`: offset of the TCP header; `ip_payload`: bytes after the fixed IP
    // header as the IP length fields say (extension headers included).
    let (l4, ip_payload) = match ethertype {
        ETH_P_IP => parse_ipv4(f, l3, out)?,
        ETH_P_IPV6 => parse_ipv6(f, l3, out)?,
        _ => return Err(ParseError::NonTcp),
    };
    parse_tcp(f, l4, ip_payload, out)
}

/// Returns (TCP header offset, IP payload length after the IPv4 header).
#[inline(always)]
fn parse_ipv4<F: Frame + ?Sized>(
    f: &F,
    l3: usize,
    out: &mut SegmentEvent,
) -> Result<(usize, usize), ParseError> {
    let ver_ihl = f.u8_at(l3)?;
    let ihl = usize::from(ver_ihl & 0x0f) * 4;
    if ver_ihl >> 4 != 4 || ihl < 20 {
        return Err(ParseError::Truncated);
    }
    let total_len = usize::from(f.be16_at(l3 + 2)?);
    let frag = f.be16_at(l3 + 6)?;
    if f.u8_at(l3 + 9)? != IPPROTO_TCP {
        return Err(ParseError::NonTcp);
    }
    if frag & 0x1fff != 0 {
        return Err(ParseError::Fragment);
    }
    if frag & 0x2000 != 0 {
        out.options |= OPT_FIRST_FRAGMENT;
    }
    if total_len < ihl {
        return Err(ParseError::Truncated);
    }
    out.ip_id = f.be16_at(l3 + 4)?;
    out.addrs.family = FAMILY_IPV4;
    let saddr: [u8; 4] = f.read(l3 + 12).ok_or(ParseError::Truncated)?;
    let daddr: [u8; 4] = f.read(l3 + 16).ok_or(ParseError::Truncated)?;
    out.addrs.saddr[..4].copy_from_slice(&saddr);
    out.addrs.daddr[..4].copy_from_slice(&daddr);
    Ok((l3 + ihl, total_len - ihl))
}

/// Returns (TCP header offset, IPv6 payload length minus extension headers).
#[inline(always)]
fn parse_ipv6<F: Frame + ?Sized>(
    f: &F,
    l3: usize,
    out: &mut SegmentEvent,
) -> Result<(usize, usize), ParseError> {
    if f.u8_at(l3)? >> 4 != 6 {
        return Err(ParseError::Truncated);
    }
    let payload_len = usize::from(f.be16_at(l3 + 4)?);
    let mut next = f.u8_at(l3 + 6)?;
    out.addrs.family = FAMILY_IPV6;
    // In 32-bit words: a 16-byte array assignment compiles to a call to a
    // byte-by-byte memmove subprogram.
    for i in 0..4 {
        let s: [u8; 4] = f.read(l3 + 8 + 4 * i).ok_or(ParseError::Truncated)?;
        let d: [u8; 4] = f.read(l3 + 24 + 4 * i).ok_or(ParseError::Truncated)?;
        out.addrs.saddr[4 * i..4 * i + 4].copy_from_slice(&s);
        out.addrs.daddr[4 * i..4 * i + 4].copy_from_slice(&d);
    }

    let mut off = l3 + 40;
    let mut ext_len = 0usize;
    for _ in 0..MAX_IPV6_EXT {
        let len = match next {
            IPPROTO_TCP => break,
            // Hop-by-hop, routing, destination options: (len + 1) * 8.
            0 | 43 | 60 => (usize::from(f.u8_at(off + 1)?) + 1) * 8,
            // Fragment header: fixed 8 bytes; offset in the top 13 bits.
            44 => {
                if f.be16_at(off + 2)? & 0xfff8 != 0 {
                    return Err(ParseError::Fragment);
                }
                out.options |= OPT_FIRST_FRAGMENT;
                8
            }
            // Authentication header: (len + 2) * 4.
            51 => (usize::from(f.u8_at(off + 1)?) + 2) * 4,
            // ESP hides everything after it.
            50 => return Err(ParseError::Unsupported),
            // No next header, UDP, ICMPv6 and everything else.
            _ => return Err(ParseError::NonTcp),
        };
        next = f.u8_at(off)?;
        off += len;
        ext_len += len;
    }
    if next != IPPROTO_TCP {
        return Err(ParseError::Unsupported);
    }
    if payload_len < ext_len {
        return Err(ParseError::Truncated);
    }
    Ok((off, payload_len - ext_len))
}

#[inline(always)]
fn parse_tcp<F: Frame + ?Sized>(
    f: &F,
    l4: usize,
    ip_payload: usize,
    out: &mut SegmentEvent,
) -> Result<(), ParseError> {
    out.addrs.sport = f.be16_at(l4)?;
    out.addrs.dport = f.be16_at(l4 + 2)?;
    out.seq = f.be32_at(l4 + 4)?;
    out.ack = f.be32_at(l4 + 8)?;
    let doff = usize::from(f.u8_at(l4 + 12)? >> 4) * 4;
    out.tcp_flags = f.u8_at(l4 + 13)?;
    out.window = f.be16_at(l4 + 14)?;
    if doff < 20 || ip_payload < doff {
        return Err(ParseError::Truncated);
    }
    out.payload_len = (ip_payload - doff) as u32;
    out.header_len = (l4 + doff) as u16;
    parse_tcp_options(f, l4 + 20, doff - 20, out)
}

/// Reads the timestamp and SACK options; skips the others by their length.
#[inline(always)]
fn parse_tcp_options<F: Frame + ?Sized>(
    f: &F,
    start: usize,
    len: usize,
    out: &mut SegmentEvent,
) -> Result<(), ParseError> {
    if len == 0 {
        return Ok(());
    }
    if len > MAX_TCP_OPTION_BYTES {
        return Err(ParseError::Truncated);
    }
    // The common case first: a data segment with timestamps alone (NOP,
    // NOP, TS), read in place. It saves the copy and the walk: most of the
    // parser's cost per segment.
    if len == 12 {
        if let Some(o) = f.read::<[u8; 12]>(start) {
            if o[..4] == [1, 1, 8, 10] {
                out.tsval = u32::from_be_bytes([o[4], o[5], o[6], o[7]]);
                out.tsecr = u32::from_be_bytes([o[8], o[9], o[10], o[11]]);
                out.options |= OPT_TIMESTAMP;
                return Ok(());
            }
        }
    }
    let mut words = [1u64; 8];
    zero_words(&mut words);
    // SAFETY: 64 bytes of u64s viewed as 64 bytes.
    let opts = unsafe { &mut *words.as_mut_ptr().cast::<OptionBytes>() };
    f.copy_options(start, len, opts)
        .ok_or(ParseError::Truncated)?;
    let at = |i: usize| opts[f.opaque(i) & OPTION_INDEX_MASK];
    let be32 = |i: usize| u32::from_be_bytes([at(i), at(i + 1), at(i + 2), at(i + 3)]);

    let mut off = 0;
    for _ in 0..MAX_TCP_OPTIONS {
        if !f.below(off, len) {
            break;
        }
        let kind = at(off);
        if kind == 0 {
            break;
        }
        let opt_len = if kind == 1 {
            1
        } else {
            usize::from(at(off + 1))
        };
        if kind != 1 && (opt_len < 2 || !f.at_most(off + opt_len, len)) {
            return Err(ParseError::Truncated);
        }
        if kind == 8 && opt_len == 10 {
            out.tsval = be32(off + 2);
            out.tsecr = be32(off + 6);
            out.options |= OPT_TIMESTAMP;
        } else if kind == 5 {
            // All four slots are filled without branching on the block
            // count (fewer paths for the verifier); `sack_count` says how
            // many are real.
            for (i, block) in out.sack.iter_mut().enumerate() {
                *block = SackBlock {
                    left: be32(off + 2 + i * 8),
                    right: be32(off + 6 + i * 8),
                };
            }
            out.sack_count = ((opt_len - 2) / 8).min(MAX_SACK_BLOCKS) as u8;
        }
        off += opt_len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Crafted frames: each field the parser must report is put there by
    //! the builders (`test_frames`), independently of the parser's own code.

    use super::*;
    use crate::test_frames::*;
    use tracer_common::tcp_flags::{ACK, PSH, SYN};

    fn parse(frame: &[u8]) -> Result<SegmentEvent, ParseError> {
        let mut ev = SegmentEvent::default();
        parse_segment(frame, &mut ev).map(|()| ev)
    }

    #[test]
    fn ipv4_segment_with_timestamps() {
        let ev = parse(&eth(0x0800, &[], &ipv4(6, 0, &[], &tcp(&Tcp::default())))).unwrap();
        assert_eq!(ev.addrs.family, FAMILY_IPV4);
        assert_eq!(&ev.addrs.saddr[..4], &[10, 0, 0, 1]);
        assert_eq!(&ev.addrs.daddr[..4], &[10, 0, 0, 2]);
        assert_eq!((ev.addrs.sport, ev.addrs.dport), (40000, 5201));
        assert_eq!((ev.seq, ev.ack), (0xdead_beef, 0x0102_0304));
        assert_eq!(
            (ev.tcp_flags, ev.window, ev.ip_id),
            (ACK | PSH, 501, 0x4242)
        );
        assert_eq!(ev.payload_len, 100);
        assert_eq!((ev.tsval, ev.tsecr), (0x1234, 0x5678));
        assert_eq!(ev.options, OPT_TIMESTAMP);
        assert_eq!(ev.sack_count, 0);
    }

    #[test]
    fn payload_comes_from_ip_length_not_ethernet_padding() {
        let ack = Tcp {
            options: vec![],
            payload: 0,
            ..Tcp::default()
        };
        let mut frame = eth(0x0800, &[], &ipv4(6, 0, &[], &tcp(&ack)));
        frame.resize(60, 0); // minimum Ethernet frame
        assert_eq!(parse(&frame).unwrap().payload_len, 0);
        assert_eq!(parse(&frame).unwrap().options, 0);
    }

    #[test]
    fn ipv4_header_options_are_skipped_by_ihl() {
        let opts = [0x94, 0x04, 0, 0, 1, 1, 1, 0]; // router alert + NOPs + EOL
        let ev = parse(&eth(0x0800, &[], &ipv4(6, 0, &opts, &tcp(&Tcp::default())))).unwrap();
        assert_eq!(
            (ev.addrs.sport, ev.seq, ev.payload_len),
            (40000, 0xdead_beef, 100)
        );
    }

    #[test]
    fn ipv6_plain_and_with_extension_headers() {
        let seg = tcp(&Tcp::default());
        let ev = parse(&eth(0x86dd, &[], &ipv6(&[], 6, &seg))).unwrap();
        assert_eq!(ev.addrs.family, FAMILY_IPV6);
        assert_eq!((ev.addrs.saddr, ev.addrs.daddr), (SRC6, DST6));
        assert_eq!((ev.seq, ev.payload_len, ev.ip_id), (0xdead_beef, 100, 0));
        assert_eq!(ev.tsval, 0x1234);

        // Hop-by-hop (8), routing (24), destination options (16), AH (16).
        let chain = [(0, 8), (43, 24), (60, 16), (51, 16)];
        let ev = parse(&eth(0x86dd, &[], &ipv6(&chain, 6, &seg))).unwrap();
        assert_eq!(
            (ev.addrs.dport, ev.seq, ev.payload_len),
            (5201, 0xdead_beef, 100)
        );

        // One more than the parser follows.
        let long = [(0, 8), (60, 8), (60, 8), (60, 8), (60, 8)];
        assert_eq!(
            parse(&eth(0x86dd, &[], &ipv6(&long, 6, &seg))),
            Err(ParseError::Unsupported)
        );
        assert_eq!(
            parse(&eth(0x86dd, &[], &ipv6(&[(50, 8)], 6, &seg))),
            Err(ParseError::Unsupported)
        );
        assert_eq!(
            parse(&eth(0x86dd, &[], &ipv6(&[], 58, &seg))),
            Err(ParseError::NonTcp)
        );
        assert_eq!(
            parse(&eth(0x86dd, &[], &ipv6(&[(0, 8)], 17, &seg))),
            Err(ParseError::NonTcp)
        );
    }

    #[test]
    fn ipv6_fragments() {
        let seg = tcp(&Tcp::default());
        let mut first = ipv6(&[(44, 8)], 6, &seg);
        first[40 + 3] = 1; // M flag, offset 0
        let ev = parse(&eth(0x86dd, &[], &first)).unwrap();
        assert_eq!(ev.options & OPT_FIRST_FRAGMENT, OPT_FIRST_FRAGMENT);
        let mut later = ipv6(&[(44, 8)], 6, &seg);
        later[40 + 2] = 0x05; // offset 0x05 << 5 = 160 units of 8 bytes
        assert_eq!(parse(&eth(0x86dd, &[], &later)), Err(ParseError::Fragment));
    }

    #[test]
    fn ipv4_fragments() {
        let seg = tcp(&Tcp::default());
        let ev = parse(&eth(0x0800, &[], &ipv4(6, 0x2000, &[], &seg))).unwrap();
        assert_eq!(ev.options & OPT_FIRST_FRAGMENT, OPT_FIRST_FRAGMENT);
        assert_eq!(
            parse(&eth(0x0800, &[], &ipv4(6, 0x00b9, &[], &seg[..8]))),
            Err(ParseError::Fragment)
        );
        assert_eq!(
            parse(&eth(0x0800, &[], &ipv4(6, 0x20b9, &[], &seg[..8]))),
            Err(ParseError::Fragment)
        );
    }

    #[test]
    fn vlan_and_qinq() {
        let l3 = ipv4(6, 0, &[], &tcp(&Tcp::default()));
        let ev = parse(&eth(0x0800, &[(0x8100, 0x2064)], &l3)).unwrap();
        assert_eq!((ev.vlan, ev.options & OPT_VLAN), (100, OPT_VLAN));
        assert_eq!(ev.seq, 0xdead_beef);
        let ev = parse(&eth(0x0800, &[(0x88a8, 0x0fff), (0x8100, 0x0007)], &l3)).unwrap();
        assert_eq!((ev.vlan, ev.seq), (0xfff, 0xdead_beef));
        let triple = [(0x88a8, 1), (0x8100, 2), (0x8100, 3)];
        assert_eq!(
            parse(&eth(0x0800, &triple, &l3)),
            Err(ParseError::Unsupported)
        );
    }

    #[test]
    fn sack_blocks_with_and_without_timestamps() {
        let mut opts = TS.to_vec();
        opts.extend([1, 1, 5, 26]);
        for b in [(100u32, 200u32), (300, 400), (500, 600)] {
            opts.extend(b.0.to_be_bytes());
            opts.extend(b.1.to_be_bytes());
        }
        let t = Tcp {
            options: opts,
            payload: 0,
            ..Tcp::default()
        };
        let ev = parse(&eth(0x0800, &[], &ipv4(6, 0, &[], &tcp(&t)))).unwrap();
        assert_eq!(ev.sack_count, 3);
        assert_eq!((ev.sack[0].left, ev.sack[0].right), (100, 200));
        assert_eq!((ev.sack[2].left, ev.sack[2].right), (500, 600));
        assert_eq!(ev.tsval, 0x1234);

        let mut opts = vec![1, 1, 5, 34];
        for i in 0..4u32 {
            opts.extend((i * 1000).to_be_bytes());
            opts.extend((i * 1000 + 10).to_be_bytes());
        }
        let t = Tcp {
            options: opts,
            payload: 0,
            ..Tcp::default()
        };
        let ev = parse(&eth(0x86dd, &[], &ipv6(&[], 6, &tcp(&t)))).unwrap();
        assert_eq!(ev.sack_count, 4);
        assert_eq!((ev.sack[3].left, ev.sack[3].right), (3000, 3010));
        assert_eq!(ev.options & OPT_TIMESTAMP, 0);
    }

    #[test]
    fn syn_options_are_walked_to_the_timestamp() {
        // Linux SYN: MSS, SACK-permitted, TS, NOP, window scale.
        let opts = vec![
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 9, 0, 0, 0, 0, 1, 3, 3, 7,
        ];
        let t = Tcp {
            flags: SYN,
            options: opts,
            payload: 0,
            ..Tcp::default()
        };
        let ev = parse(&eth(0x0800, &[], &ipv4(6, 0, &[], &tcp(&t)))).unwrap();
        assert_eq!((ev.tcp_flags, ev.tsval, ev.tsecr), (SYN, 9, 0));
        // macOS-style: MSS NOP WS NOP NOP TS SACK-permitted EOL (8 options).
        let opts = vec![
            2, 4, 5, 0xb4, 1, 3, 3, 6, 1, 1, 8, 10, 0, 0, 0, 5, 0, 0, 0, 0, 4, 2, 0, 0,
        ];
        let t = Tcp {
            flags: SYN,
            options: opts,
            payload: 0,
            ..Tcp::default()
        };
        assert_eq!(
            parse(&eth(0x0800, &[], &ipv4(6, 0, &[], &tcp(&t))))
                .unwrap()
                .tsval,
            5
        );
        // EOL stops the walk: a timestamp after it is padding, not an option.
        let mut opts = vec![0, 0, 0, 0];
        opts.extend(TS);
        let t = Tcp {
            options: opts,
            ..Tcp::default()
        };
        let ev = parse(&eth(0x0800, &[], &ipv4(6, 0, &[], &tcp(&t)))).unwrap();
        assert_eq!(ev.options & OPT_TIMESTAMP, 0);
    }

    #[test]
    fn option_walk_stops_at_its_bound() {
        // Eleven NOPs, then a timestamp: beyond MAX_TCP_OPTIONS, not read.
        let mut opts = vec![1; 11];
        opts.extend([8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]);
        opts.truncate(24);
        let t = Tcp {
            options: opts,
            ..Tcp::default()
        };
        let ev = parse(&eth(0x0800, &[], &ipv4(6, 0, &[], &tcp(&t)))).unwrap();
        assert_eq!(ev.options & OPT_TIMESTAMP, 0);
        assert_eq!(ev.payload_len, 100);
    }

    #[test]
    fn truncated_and_malformed_headers() {
        let frame = eth(0x0800, &[], &ipv4(6, 0, &[], &tcp(&Tcp::default())));
        // Cut inside Ethernet, IPv4, the TCP header and the TCP options.
        for cut in [10, 20, 40, 50, 60] {
            assert_eq!(
                parse(&frame[..cut]),
                Err(ParseError::Truncated),
                "cut at {cut}"
            );
        }
        // Data offset below 5 words.
        let mut bad = frame.clone();
        bad[14 + 20 + 12] = 4 << 4;
        assert_eq!(parse(&bad), Err(ParseError::Truncated));
        // IHL below 5.
        let mut bad = frame.clone();
        bad[14] = 0x44;
        assert_eq!(parse(&bad), Err(ParseError::Truncated));
        // An option whose length runs past the header.
        let t = Tcp {
            options: vec![1, 1, 8, 30],
            ..Tcp::default()
        };
        assert_eq!(
            parse(&eth(0x0800, &[], &ipv4(6, 0, &[], &tcp(&t)))),
            Err(ParseError::Truncated)
        );
        // An option length of 1 (would never advance).
        let t = Tcp {
            options: vec![3, 1, 0, 0],
            ..Tcp::default()
        };
        assert_eq!(
            parse(&eth(0x0800, &[], &ipv4(6, 0, &[], &tcp(&t)))),
            Err(ParseError::Truncated)
        );
        // IP total length smaller than the headers it announces.
        let mut bad = frame.clone();
        bad[14 + 2..14 + 4].copy_from_slice(&30u16.to_be_bytes());
        assert_eq!(parse(&bad), Err(ParseError::Truncated));
    }

    #[test]
    fn non_tcp_traffic() {
        assert_eq!(parse(&eth(0x0806, &[], &[0; 28])), Err(ParseError::NonTcp)); // ARP
        let udp = ipv4(17, 0, &[], &[0; 16]);
        assert_eq!(parse(&eth(0x0800, &[], &udp)), Err(ParseError::NonTcp));
        assert_eq!(
            parse(&eth(0x0800, &[(0x8100, 5)], &udp)),
            Err(ParseError::NonTcp)
        );
    }

    /// The fixed-offset path is only a shortcut: on plain IPv4 frames with
    /// every TCP option layout the builders make, and on 40,000 copies with
    /// random header bytes changed (lengths, flags, fragment bits, version,
    /// options, frames cut short), it gives what the general parser gives,
    /// and so do the fields summary mode reads alone ([`PlainIpv4`]).
    #[test]
    fn plain_ipv4_path_matches_the_general_parser() {
        let layouts: [&[u8]; 6] = [
            &[],
            &TS,
            &[1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2],
            &[
                2, 4, 5, 0xb4, 1, 3, 3, 7, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0,
            ],
            &[
                1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 8, 1, 1, 5, 10, 0, 0, 0, 3, 0, 0, 0, 4,
            ],
            &[8, 10, 0, 0, 0, 9, 0, 0, 0, 8, 0, 0],
        ];
        let mut frames = Vec::new();
        for options in layouts {
            for payload in [0, 1, 1448] {
                let t = Tcp {
                    options: options.to_vec(),
                    payload,
                    ..Tcp::default()
                };
                for frag in [0, 0x4000, 0x2000, 0x0001] {
                    frames.push(eth(0x0800, &[], &ipv4(6, frag, &[], &tcp(&t))));
                }
            }
        }
        let mut checked = 0;
        let mut shortcut = 0;
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for base in &frames {
            for variant in 0..1_000 {
                let mut f = base.clone();
                if variant > 0 {
                    for _ in 0..1 + next() % 3 {
                        let at = 12 + next() as usize % 66.min(f.len() - 12);
                        f[at] = next() as u8;
                    }
                    if next() % 4 == 0 {
                        f.truncate(next() as usize % f.len());
                    }
                }
                let mut fast = SegmentEvent::default();
                let head = plain_ipv4(&f[..]);
                let Some(result) = parse_plain_ipv4(&f[..], &mut fast) else {
                    assert_eq!(fast, SegmentEvent::default(), "declined but wrote");
                    assert!(head.is_none(), "{f:02x?}");
                    continue;
                };
                let mut general = SegmentEvent::default();
                assert_eq!(result, parse_any(&f[..], &mut general), "{f:02x?}");
                if result.is_ok() {
                    assert_eq!(fast, general, "{f:02x?}");
                    // What summary mode decides on, read without the rest.
                    let head = head.expect("a plain IPv4 frame");
                    let addrs = head.addrs().to_le_bytes();
                    assert_eq!(addrs[..4], general.addrs.saddr[..4]);
                    assert_eq!(addrs[4..], general.addrs.daddr[..4]);
                    assert_eq!(
                        (head.sport(), head.dport(), head.seq()),
                        (general.addrs.sport, general.addrs.dport, general.seq)
                    );
                    assert_eq!(
                        (head.payload_len(), head.tcp_flags()),
                        (general.payload_len, general.tcp_flags)
                    );
                    shortcut += 1;
                }
                checked += 1;
            }
        }
        assert!(
            checked > 10_000 && shortcut > 5_000,
            "{checked} checked, {shortcut} parsed"
        );
    }
}
