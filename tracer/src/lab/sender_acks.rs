//! When each ACK reached the sending socket, its SND.NXT then, and when it
//! retransmitted: the TCP tracepoints (no XDP: the ACK path stays as it
//! was) in the client's namespace, drained on a thread while the upload
//! runs. With them the replay hears of each arrival when the real sender
//! did, knows when each segment left (what an ACK released left right
//! after it), and its retransmissions leave as late after their ACK as the
//! real ones did, instead of assuming any of it.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{anyhow, Context, Result};

use super::{Topology, CLIENT_IF, SERVER_PORT};
use crate::{
    kernel::{Tracer, TracerOptions},
    replay::SenderAck,
    source::{self, Flow, Observation},
};

/// Most ACKs (and retransmissions) kept per flow; more are counted in
/// [`SenderAcks::over_cap`].
pub const MAX_ACKS_PER_FLOW: usize = 1 << 20;

/// The senders' ACKs, by the flow of the data they acknowledge.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SenderAcks {
    /// In processing order.
    #[serde(skip)]
    pub acks: HashMap<Flow, Vec<SenderAck>>,
    /// When each sender socket retransmitted (CLOCK_MONOTONIC ns), by flow.
    #[serde(skip)]
    pub retransmits: HashMap<Flow, Vec<u64>>,
    /// ACKs kept, over all flows.
    pub seen: u64,
    /// ACKs and retransmissions over [`MAX_ACKS_PER_FLOW`], not kept.
    pub over_cap: u64,
    /// Events the kernel side dropped or skipped (ring full, tracepoint
    /// programs not run).
    pub lost: u64,
}

/// The probe while it runs; dropped unfinished, it stops and detaches.
pub struct SenderProbe {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<SenderAcks>>>,
}

impl SenderProbe {
    /// Attaches in the client's namespace (before the upload starts).
    pub fn attach(topo: &Topology) -> Result<Self> {
        let mut opts = TracerOptions::new(CLIENT_IF);
        opts.netns = Some(topo.client_ns.clone());
        opts.xdp = false;
        opts.ring_bytes = 4 << 20;
        let tracer = Tracer::attach(&opts).context("attaching the sender-side ACK probe")?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("sender-acks".into())
            .spawn(move || collect(tracer, &flag))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Detaches and returns what it saw.
    pub fn finish(mut self) -> Result<SenderAcks> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .context("the sender-side ACK probe was already finished")?
            .join()
            .map_err(|_| anyhow!("the sender-side ACK probe's thread panicked"))?
    }
}

impl Drop for SenderProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn collect(mut tracer: Tracer, stop: &AtomicBool) -> Result<SenderAcks> {
    let mut out = SenderAcks::default();
    while !stop.load(Ordering::SeqCst) {
        drain(&mut tracer, &mut out);
        tracer.wait_readable(POLL)?;
    }
    // Detached, nothing more arrives: this drain gets the rest, and the
    // counters are final.
    tracer.detach();
    drain(&mut tracer, &mut out);
    out.lost = tracer.counters()?.dropped();
    Ok(out)
}

const POLL: Duration = Duration::from_millis(20);

fn drain(tracer: &mut Tracer, out: &mut SenderAcks) {
    let rings = tracer.rings();
    while let Some(record) = rings.next_record() {
        // Pure ACKs from the server's port, as the sender's TCP took them,
        // and the sender's retransmissions.
        let p = match source::decode(record) {
            Ok(Observation::TcpProbe(p)) => p,
            Ok(Observation::Retransmit(r)) if r.flow.dst.port() == SERVER_PORT => {
                let times = out.retransmits.entry(r.flow).or_default();
                if times.len() < MAX_ACKS_PER_FLOW {
                    times.push(r.ts_ns);
                } else {
                    out.over_cap += 1;
                }
                continue;
            }
            _ => continue,
        };
        if p.flow.src.port() != SERVER_PORT || p.payload_len != 0 {
            continue;
        }
        let acks = out.acks.entry(p.flow.reversed()).or_default();
        if acks.len() < MAX_ACKS_PER_FLOW {
            acks.push(SenderAck {
                ack: p.ack,
                snd_nxt: p.snd_nxt,
                ts_ns: p.ts_ns,
            });
            out.seen += 1;
        } else {
            out.over_cap += 1;
        }
    }
}
