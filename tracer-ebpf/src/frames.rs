//! [`Frame`]s over the kernel's packet contexts (bpf target only).

use aya_ebpf::{
    helpers::{bpf_skb_load_bytes, bpf_xdp_load_bytes},
    programs::{TcContext, XdpContext},
};

use crate::parse::{Frame, OptionBytes, MAX_TCP_OPTION_BYTES};

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

impl Frame for XdpFrame {
    #[inline(always)]
    fn read<T: Copy>(&self, offset: usize) -> Option<T> {
        if offset > MAX_HEADER_OFFSET {
            return None;
        }
        let mut at = self.start + offset;
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
                end = in(reg) self.end,
                size = const core::mem::size_of::<T>(),
            );
        }
        if in_bounds == 0 {
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
}
