//! [`Frame`]s over the kernel's packet contexts (bpf target only).

use aya_ebpf::{
    helpers::{bpf_skb_load_bytes, bpf_xdp_load_bytes},
    programs::{TcContext, XdpContext},
};

use crate::parse::{Frame, Head, OptionBytes, MAX_TCP_OPTION_BYTES};

/// `a OP b` (`"<"`, `"<="`) as one conditional jump whose left operand is
/// `a` (see [`Frame::below`]).
macro_rules! compare {
    ($a:expr, $op:literal, $b:expr) => {{
        let r: u64;
        // SAFETY: register moves and a jump over the next instruction.
        unsafe {
            core::arch::asm!(
                "{r} = 1",
                concat!("if {a} ", $op, " {b} goto +1"),
                "{r} = 0",
                r = out(reg) r,
                a = in(reg) $a,
                b = in(reg) $b,
            )
        };
        r != 0
    }};
}

/// The XDP packet as a [`Frame`]: every read is checked against
/// `data_end`, which is also what the verifier needs.
pub struct XdpFrame {
    ctx: *mut aya_ebpf::bindings::xdp_md,
    start: usize,
    end: usize,
}

impl XdpFrame {
    #[inline(always)]
    pub fn new(ctx: &XdpContext) -> Self {
        Self {
            ctx: ctx.ctx,
            start: ctx.data(),
            end: ctx.data_end(),
        }
    }
}

/// Offsets beyond this are never header bytes; the cap keeps the
/// verifier's range tracking of computed offsets small.
const MAX_HEADER_OFFSET: usize = 0x3fff;

/// Sets `at` to `start + offset` and says whether `size` bytes from there
/// are in the packet.
#[inline(always)]
fn check(start: usize, offset: usize, size: usize, end: usize) -> (usize, bool) {
    let mut at = start + offset;
    let in_bounds: u64;
    // The check is written in assembly because LLVM otherwise turns
    // `at + 1 > end` into `at >= end`, from which the verifier
    // learns no readable range. The pointer read below is the
    // register this check validated (hence `inout`).
    // SAFETY: register moves, an add and a compare; no memory access.
    unsafe {
        core::arch::asm!(
            "{last} = {at}",
            "{last} += {size}",
            "{ok} = 0",
            "if {last} > {end} goto +1",
            "{ok} = 1",
            at = inout(reg) at,
            last = out(reg) _,
            ok = out(reg) in_bounds,
            end = in(reg) end,
            size = in(reg) size,
        );
    }
    (at, in_bounds != 0)
}

/// The first `N` bytes of an XDP packet: a pointer the verifier has seen
/// checked against `data_end` for `N` bytes.
#[derive(Clone, Copy)]
pub struct XdpHead<const N: usize>(usize);

/// One load instruction of `$width` at constant offset `O` from the head.
macro_rules! head_load {
    ($head:expr, $width:literal) => {{
        let v: u64;
        // SAFETY: `O + size <= N` (checked at compile time), and the
        // pointer was checked for N bytes.
        unsafe {
            core::arch::asm!(
                concat!("{v} = *(", $width, " *)({p} + {o})"),
                v = lateout(reg) v,
                p = in(reg) $head.0,
                o = const O,
            )
        };
        v
    }};
}

impl<const N: usize> Head<N> for XdpHead<N> {
    #[inline(always)]
    fn u8_at<const O: usize>(&self) -> u8 {
        const { assert!(O < N) };
        head_load!(self, "u8") as u8
    }

    #[inline(always)]
    fn be16_at<const O: usize>(&self) -> u16 {
        const { assert!(O + 2 <= N) };
        u16::from_be(head_load!(self, "u16") as u16)
    }

    #[inline(always)]
    fn be32_at<const O: usize>(&self) -> u32 {
        const { assert!(O + 4 <= N) };
        u32::from_be(head_load!(self, "u32") as u32)
    }

    #[inline(always)]
    fn le32_at<const O: usize>(&self) -> u32 {
        const { assert!(O + 4 <= N) };
        head_load!(self, "u32") as u32
    }

    #[inline(always)]
    fn le64_at<const O: usize>(&self) -> u64 {
        const { assert!(O + 8 <= N) };
        head_load!(self, "u64")
    }
}

impl Frame for XdpFrame {
    type Head<const N: usize> = XdpHead<N>;

    #[inline(always)]
    fn head<const N: usize>(&self) -> Option<XdpHead<N>> {
        let (at, ok) = check(self.start, 0, N, self.end);
        ok.then_some(XdpHead(at))
    }

    #[inline(always)]
    fn read<T: Copy>(&self, offset: usize) -> Option<T> {
        if offset > MAX_HEADER_OFFSET {
            return None;
        }
        let (at, ok) = check(self.start, offset, core::mem::size_of::<T>(), self.end);
        if !ok {
            return None;
        }
        // SAFETY: [at, at + size) was checked against data_end above.
        Some(unsafe { core::ptr::read_unaligned(at as *const T) })
    }

    #[inline(always)]
    fn copy_options(&self, offset: usize, len: usize, buf: &mut OptionBytes) -> Option<()> {
        let len = option_len(offset, len)?;
        // SAFETY: `buf` has room for 64 bytes; the helper checks the
        // packet side itself (and also reads fragments).
        let ret = unsafe {
            bpf_xdp_load_bytes(self.ctx, offset as u32, buf.as_mut_ptr().cast(), len as u32)
        };
        (ret == 0).then_some(())
    }

    #[inline(always)]
    fn opaque(&self, i: usize) -> usize {
        opaque(i)
    }

    #[inline(always)]
    fn below(&self, a: usize, b: usize) -> bool {
        compare!(a, "<", b)
    }

    #[inline(always)]
    fn at_most(&self, a: usize, b: usize) -> bool {
        compare!(a, "<=", b)
    }
}

/// The option length to copy, for the valid 1..=40 the same value, in a
/// form that bounds it to 1..=64 (the buffer) for the verifier too (see
/// [`Frame::opaque`]); None when the request cannot be header bytes.
#[inline(always)]
fn option_len(offset: usize, len: usize) -> Option<usize> {
    if offset > MAX_HEADER_OFFSET || len == 0 || len > MAX_TCP_OPTION_BYTES {
        return None;
    }
    Some((opaque(len - 1) & 63) + 1)
}

#[inline(always)]
fn opaque(mut i: usize) -> usize {
    // SAFETY: a register move onto itself.
    unsafe { core::arch::asm!("{0} = {0}", inout(reg) i) };
    i
}

/// A socket buffer (tc programs) as a [`Frame`]: every read goes through
/// `bpf_skb_load_bytes`, which checks bounds and reads non-linear data.
pub struct SkbFrame<'a>(pub &'a TcContext);

impl Frame for SkbFrame<'_> {
    /// A copy: the helper reads the bytes out of the socket buffer.
    type Head<const N: usize> = [u8; N];

    #[inline(always)]
    fn head<const N: usize>(&self) -> Option<[u8; N]> {
        self.0.load::<[u8; N]>(0).ok()
    }

    #[inline(always)]
    fn read<T: Copy>(&self, offset: usize) -> Option<T> {
        if offset > MAX_HEADER_OFFSET {
            return None;
        }
        self.0.load::<T>(offset).ok()
    }

    #[inline(always)]
    fn copy_options(&self, offset: usize, len: usize, buf: &mut OptionBytes) -> Option<()> {
        let len = option_len(offset, len)?;
        // SAFETY: `buf` has room for 64 bytes; the helper checks the
        // packet side.
        let ret = unsafe {
            bpf_skb_load_bytes(
                self.0.skb.skb as *const _,
                offset as u32,
                buf.as_mut_ptr().cast(),
                len as u32,
            )
        };
        (ret == 0).then_some(())
    }

    #[inline(always)]
    fn opaque(&self, i: usize) -> usize {
        opaque(i)
    }

    #[inline(always)]
    fn below(&self, a: usize, b: usize) -> bool {
        compare!(a, "<", b)
    }

    #[inline(always)]
    fn at_most(&self, a: usize, b: usize) -> bool {
        compare!(a, "<=", b)
    }
}
