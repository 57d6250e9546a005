//! The reordering tracer: kernel programs that tag every received TCP
//! segment with its RX queue and CPU, and the userspace that collects,
//! analyses and reports.
//!
//! Data flows one way: [`kernel`] (load, attach, counters) -> [`source`]
//! (typed observations) -> [`record`] (the collection loop) -> sinks
//! ([`report`], [`pcapng`], [`jsonl`], [`tui`], [`metrics`],
//! [`intervals`]). [`lab`] builds self-contained test networks.

pub mod cli;
pub mod config;
pub mod engine;
pub mod error;
pub mod filter;
pub mod intervals;
pub mod jsonl;
pub mod kernel;
pub mod lab;
pub mod metrics;
pub mod nic;
pub mod output;
pub mod pcapng;
pub mod plot;
pub mod record;
pub mod replay;
pub mod report;
pub mod sink;
pub mod snapshot;
pub mod source;
pub mod tui;

pub use error::{require_root, SetupError};

/// The compiled eBPF object, built by build.rs.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer"));
/// The lab's edge programs (an emulated flow-steering NIC), built with it.
pub static LAB_EDGE_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lab-edge"));
