//! The host-testable part of the eBPF programs (header parsing, summary
//! mode's per-flow decision), and the packet-context adapters the programs
//! parse through.
#![cfg_attr(not(any(test, feature = "test-frames")), no_std)]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(target_arch = "bpf")]
pub mod frames;
pub mod parse;
pub mod summary;
#[cfg(any(test, feature = "test-frames"))]
pub mod test_frames;
