//! The host-testable part of the eBPF programs: header parsing.
#![cfg_attr(not(test), no_std)]

pub mod parse;
