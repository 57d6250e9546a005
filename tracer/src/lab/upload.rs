//! A bounded kernel-TCP upload from the lab's client to its server: one
//! sending thread per host flow, the guest senders, one reading thread per
//! accepted connection ([`super::socket`]), and each flow's result.

use std::{
    net::{SocketAddr, TcpListener},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{
    guest::{Guest, GuestReport},
    in_netns,
    socket::{expired, send, serve, Received, Sent, ServerProgress, UploadSpec},
    Sender, Topology,
};
use crate::source::Flow;

/// What one flow of an upload did, from the sockets' own point of view.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FlowResult {
    /// Client -> server.
    pub flow: Flow,
    /// Whose TCP sent it.
    pub sender: Sender,
    pub sent: u64,
    pub received: u64,
    /// The sender's `tcpi_total_retrans` (segments) and `tcpi_bytes_retrans`.
    pub retransmits: u32,
    pub bytes_retrans: u64,
    /// The sender's `tcpi_reord_seen` (reordering events its loss detection
    /// noticed) and `tcpi_dsack_dups` (retransmissions the receiver reported
    /// as duplicates: spurious).
    pub reord_seen: u32,
    pub dsack_dups: u32,
    /// The receiver's `tcpi_rcv_ooopack`: segments it received above a
    /// hole (queued out of order).
    pub rcv_ooopack: u32,
    /// The sender's smoothed and minimum RTT (`tcpi_rtt`, `tcpi_min_rtt`,
    /// µs) and its reordering threshold at the end (`tcpi_reordering`).
    pub srtt_us: u32,
    pub min_rtt_us: u32,
    pub reordering: u32,
    /// The sender's `tcpi_rtt` averaged over the transfer (sampled after
    /// every write): the round trip its loss detection worked with, which
    /// queueing can make far longer than the one at the end.
    pub mean_srtt_us: u32,
}

/// What each guest sender reported.
pub type GuestReports = Vec<(Sender, GuestReport)>;

/// A running upload: client threads write, server threads read and count.
pub struct Upload {
    stop: Arc<AtomicBool>,
    remaining: Arc<AtomicUsize>,
    senders: Vec<JoinHandle<Result<Sent>>>,
    /// The host's senders' kind (this kernel's TCP).
    host: Sender,
    /// Senders in guests, each its own kernel.
    guests: Vec<Guest>,
    server: Option<JoinHandle<Vec<Received>>>,
    server_addr: SocketAddr,
    progress: Arc<ServerProgress>,
    /// The server's empty accept queues when every sender was first seen
    /// done (`u64::MAX`: not yet).
    senders_done_at: AtomicU64,
}

impl Upload {
    pub fn start(topo: &Topology, spec: &UploadSpec) -> Result<Self> {
        Self::start_until(topo, spec, Arc::default(), &[Sender::Host])
    }

    /// The same from each of `senders` (`spec.flows` flows each), but the
    /// senders also stop once `enough` is set: each finishes its write,
    /// closes, and waits for the server to have read everything it sent
    /// (so received still equals sent).
    pub fn start_until(
        topo: &Topology,
        spec: &UploadSpec,
        enough: Arc<AtomicBool>,
        senders: &[Sender],
    ) -> Result<Self> {
        let server_addr = SocketAddr::new(topo.server_addr(spec.ipv6), spec.port);
        let deadline = Instant::now() + spec.timeout;
        let stop = Arc::new(AtomicBool::new(false));
        let host = senders.iter().copied().find(|s| !s.in_guest());
        let host_flows = if host.is_some() { spec.flows } else { 0 };
        let remaining = Arc::new(AtomicUsize::new(host_flows));

        let listener = in_netns(&topo.server_ns, || TcpListener::bind(server_addr))?
            .with_context(|| format!("binding the lab server to {server_addr}"))?;
        listener.set_nonblocking(true)?;
        let progress = Arc::new(ServerProgress::default());
        let server = {
            let (stop, flows, progress) =
                (stop.clone(), spec.flows * senders.len(), progress.clone());
            std::thread::spawn(move || serve(listener, flows, deadline, &stop, &progress))
        };

        let mut upload = Self {
            stop: stop.clone(),
            remaining: remaining.clone(),
            senders: Vec::new(),
            host: host.unwrap_or_default(),
            guests: Vec::new(),
            server: Some(server),
            server_addr,
            progress,
            senders_done_at: AtomicU64::new(u64::MAX),
        };
        for (index, &kind) in senders.iter().filter(|s| s.in_guest()).enumerate() {
            upload
                .guests
                .push(Guest::start(topo, kind, index, spec, server_addr)?);
        }
        for _ in 0..host_flows {
            let (stop, remaining, enough) = (stop.clone(), remaining.clone(), enough.clone());
            let (ns, bytes, pacing) = (topo.client_ns.clone(), spec.bytes_per_flow, spec.pacing);
            upload.senders.push(std::thread::spawn(move || {
                let r = send(
                    Some(&ns),
                    server_addr,
                    bytes,
                    pacing,
                    deadline,
                    &stop,
                    &enough,
                );
                remaining.fetch_sub(1, Ordering::SeqCst);
                r
            }));
        }
        // The guests hear of `enough` through their stop files.
        if !upload.guests.is_empty() {
            let stops: Vec<_> = upload.guests.iter().map(Guest::stop_file).collect();
            std::thread::spawn(move || {
                while !expired(deadline, &stop) && !enough.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                for f in stops {
                    let _ = std::fs::write(f, b"");
                }
            });
        }
        Ok(upload)
    }

    /// All senders are done (finished, failed or stopped), and every
    /// segment they sent has arrived: the server has since accepted every
    /// connection, read each to its end and seen its close acknowledged
    /// (a tracer that stops now has seen the whole upload).
    pub fn finished(&self) -> bool {
        let at = self.senders_done_at.load(Ordering::SeqCst);
        if at == u64::MAX {
            if self.remaining.load(Ordering::SeqCst) == 0 && self.guests.iter().all(Guest::exited) {
                self.senders_done_at
                    .store(self.progress.empty_polls(), Ordering::SeqCst);
            }
            return false;
        }
        self.progress.done_since(at) || self.server.as_ref().is_none_or(JoinHandle::is_finished)
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        for g in &self.guests {
            g.stop();
        }
    }

    /// Waits for every thread and guest; the per-flow results.
    pub fn join(self) -> Result<Vec<FlowResult>> {
        Ok(self.join_all()?.0)
    }

    /// The same, and what each guest sender reported.
    pub fn join_all(mut self) -> Result<(Vec<FlowResult>, GuestReports)> {
        let senders = std::mem::take(&mut self.senders);
        let mut sent = Vec::new();
        for h in senders {
            sent.push((
                self.host,
                h.join()
                    .map_err(|_| anyhow::anyhow!("lab sender panicked"))??,
            ));
        }
        let mut guests = Vec::new();
        for g in std::mem::take(&mut self.guests) {
            let kind = g.kind;
            let report = g.join()?;
            sent.extend(report.flows.iter().map(|s| (kind, s.clone())));
            guests.push((kind, report));
        }
        // Senders are done; the server only waits for stragglers now.
        let received = self
            .server
            .take()
            .expect("joined once")
            .join()
            .map_err(|_| anyhow::anyhow!("lab server panicked"))?;
        let flows = sent
            .into_iter()
            .map(|(sender, s)| {
                let (bytes, rx_info) = received
                    .iter()
                    .find(|(peer, _, _)| *peer == s.local)
                    .map_or((0, None), |(_, n, i)| (*n, *i));
                FlowResult {
                    flow: Flow {
                        src: s.local,
                        dst: self.server_addr,
                    },
                    sender,
                    sent: s.sent,
                    received: bytes,
                    retransmits: s.retransmits,
                    bytes_retrans: s.bytes_retrans,
                    reord_seen: s.reord_seen,
                    dsack_dups: s.dsack_dups,
                    rcv_ooopack: rx_info.map_or(0, |i| i.tcpi_rcv_ooopack),
                    srtt_us: s.srtt_us,
                    min_rtt_us: s.min_rtt_us,
                    reordering: s.reordering,
                    mean_srtt_us: s.mean_srtt_us,
                }
            })
            .collect();
        Ok((flows, guests))
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        self.stop();
        for h in self.senders.drain(..) {
            let _ = h.join();
        }
        if let Some(h) = self.server.take() {
            let _ = h.join();
        }
    }
}
