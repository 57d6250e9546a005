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
}

/// TCP option bytes copied out of the frame. Twice the largest option area,
/// so an index masked with `OPTION_INDEX_MASK` is always in bounds: the
/// option walk then never needs a bounds check that can fail (and the
/// verifier sees plain stack reads, which keeps its state count small).
pub type OptionBytes = [u8; 64];
const OPTION_INDEX_MASK: usize = 63;

impl Frame for [u8] {
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

/// Parses an Ethernet frame into the header fields of `out`.
///
/// Fills `tcp_flags`, `sack_count`, `options`, `addrs`, `seq`, `ack`,
/// `payload_len`, `window`, `ip_id`, `tsval`, `tsecr`, `vlan` and `sack`;
/// leaves the fields only the kernel knows (kind, time, queue, CPU,
/// interface) alone.
#[inline(always)]
pub fn parse_segment<F: Frame + ?Sized>(f: &F, out: &mut SegmentEvent) -> Result<(), ParseError> {
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
    out.addrs.saddr = f.read(l3 + 8).ok_or(ParseError::Truncated)?;
    out.addrs.daddr = f.read(l3 + 24).ok_or(ParseError::Truncated)?;

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
    let mut opts: OptionBytes = [0; 64];
    f.copy_options(start, len, &mut opts)
        .ok_or(ParseError::Truncated)?;
    let at = |i: usize| opts[f.opaque(i) & OPTION_INDEX_MASK];
    let be32 = |i: usize| u32::from_be_bytes([at(i), at(i + 1), at(i + 2), at(i + 3)]);

    let mut off = 0;
    for _ in 0..MAX_TCP_OPTIONS {
        if off >= len {
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
        if kind != 1 && (opt_len < 2 || off + opt_len > len) {
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
