//! A bounded kernel-TCP upload from the lab's client to its server: one
//! sending thread per flow, one reading thread per accepted connection,
//! and what each socket says it did (`tcp_info`).

use std::{
    io::{ErrorKind, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{
    guest::{Guest, GuestReport},
    in_netns, Sender, Topology,
};
use crate::source::Flow;

#[derive(Clone, Debug)]
pub struct UploadSpec {
    pub flows: usize,
    pub bytes_per_flow: u64,
    pub port: u16,
    pub ipv6: bool,
    /// Hard bound on the whole upload.
    pub timeout: Duration,
    /// Per-flow pacing of the host's senders, bytes per second (None: as
    /// fast as TCP goes). Guests are never paced (see [`super::guest`]).
    pub pacing: Option<u64>,
    /// Sysctls every guest sender sets as well as its policy's (the
    /// lab sets the host's namespaces itself).
    pub sysctls: Vec<(&'static str, &'static str)>,
}

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

/// One accepted connection: peer, bytes read, the socket's tcp_info.
type Received = (SocketAddr, u64, Option<libc::tcp_info>);

/// What a sending socket says it did (its `tcp_info` at the end): made in
/// this process, or in a sender guest, which prints it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Sent {
    pub local: SocketAddr,
    pub sent: u64,
    pub retransmits: u32,
    pub bytes_retrans: u64,
    pub reord_seen: u32,
    pub dsack_dups: u32,
    pub srtt_us: u32,
    pub min_rtt_us: u32,
    pub reordering: u32,
    pub mean_srtt_us: u32,
}

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
}

const CHUNK: usize = 256 * 1024;
const POLL: Duration = Duration::from_millis(100);

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
        let server = {
            let (stop, flows) = (stop.clone(), spec.flows * senders.len());
            std::thread::spawn(move || serve(listener, flows, deadline, &stop))
        };

        let mut upload = Self {
            stop: stop.clone(),
            remaining: remaining.clone(),
            senders: Vec::new(),
            host: host.unwrap_or_default(),
            guests: Vec::new(),
            server: Some(server),
            server_addr,
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

    /// All senders are done (finished, failed or stopped).
    pub fn finished(&self) -> bool {
        self.remaining.load(Ordering::SeqCst) == 0 && self.guests.iter().all(Guest::exited)
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

fn expired(deadline: Instant, stop: &AtomicBool) -> bool {
    stop.load(Ordering::SeqCst) || Instant::now() >= deadline
}

/// Accepts `flows` connections and reads each to EOF.
fn serve(
    listener: TcpListener,
    flows: usize,
    deadline: Instant,
    stop: &Arc<AtomicBool>,
) -> Vec<Received> {
    let mut readers = Vec::new();
    while readers.len() < flows && !expired(deadline, stop) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let stop = stop.clone();
                readers.push(std::thread::spawn(move || {
                    let bytes = drain_stream(&stream, deadline, &stop);
                    (peer, bytes, tcp_info(&stream).ok())
                }));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(_) => break,
        }
    }
    readers.into_iter().filter_map(|h| h.join().ok()).collect()
}

/// A socket timeout or signal: check the deadline and try again.
fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

fn drain_stream(mut stream: &TcpStream, deadline: Instant, stop: &AtomicBool) -> u64 {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(POLL));
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    while !expired(deadline, stop) {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if transient(&e) => {}
            Err(_) => break,
        }
    }
    total
}

/// `setsockopt(level, option)` with `value`'s bytes.
fn set_option(stream: &TcpStream, level: i32, option: i32, value: &[u8]) -> std::io::Result<()> {
    // SAFETY: a valid socket, and a pointer and length from one slice.
    let ret = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            option,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `SO_MAX_PACING_RATE`: TCP spreads the socket's segments out to at most
/// `bytes_per_sec` (instead of bursting a window at a time).
fn set_max_pacing_rate(stream: &TcpStream, bytes_per_sec: u64) -> Result<()> {
    let rate = bytes_per_sec.min(u64::from(u32::MAX - 1)) as u32;
    set_option(
        stream,
        libc::SOL_SOCKET,
        libc::SO_MAX_PACING_RATE,
        &rate.to_ne_bytes(),
    )
    .context("setting SO_MAX_PACING_RATE")
}

/// The congestion control the lab's senders run: CUBIC, what the replay
/// models (a host's default may differ: this machine's is BBR). Set per
/// socket before it connects, which root may do for any built-in
/// algorithm.
pub const CONGESTION_CONTROL: &str = "cubic";

/// A client socket that runs [`CONGESTION_CONTROL`] from its first
/// segment. (One switched after connecting keeps what the default asked
/// for at the start: BBR's, TCP's internal pacing, which then sends a third
/// of the retransmissions from its timer, hundreds of µs after the ACK
/// that called for them.)
fn connect(to: SocketAddr) -> Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))
        .context("lab client socket")?;
    socket
        .set_tcp_congestion(CONGESTION_CONTROL.as_bytes())
        .with_context(|| format!("setting TCP_CONGESTION to {CONGESTION_CONTROL}"))?;
    socket
        .connect_timeout(&to.into(), Duration::from_secs(5))
        .with_context(|| format!("lab client connecting to {to}"))?;
    Ok(socket.into())
}

/// One flow: connects (from namespace `ns`, or this one), writes `bytes`
/// and waits for the server to have read them.
fn send(
    ns: Option<&str>,
    to: SocketAddr,
    bytes: u64,
    pacing: Option<u64>,
    deadline: Instant,
    stop: &AtomicBool,
    enough: &AtomicBool,
) -> Result<Sent> {
    let mut stream = match ns {
        Some(ns) => in_netns(ns, || connect(to))??,
        None => connect(to)?,
    };
    stream.set_write_timeout(Some(POLL))?;
    stream.set_read_timeout(Some(POLL))?;
    if let Some(rate) = pacing {
        set_max_pacing_rate(&stream, rate)?;
    }
    let local = stream.local_addr()?;
    let chunk = vec![0x5au8; CHUNK];
    let mut sent = 0u64;
    let mut srtt = (0u64, 0u64);
    while sent < bytes && !expired(deadline, stop) && !enough.load(Ordering::SeqCst) {
        let n = (bytes - sent).min(CHUNK as u64) as usize;
        match stream.write(&chunk[..n]) {
            Ok(w) => {
                sent += w as u64;
                if let Ok(i) = tcp_info(&stream) {
                    srtt = (srtt.0 + u64::from(i.tcpi_rtt), srtt.1 + 1);
                }
            }
            Err(e) if transient(&e) => {}
            // The server stopped reading (its deadline came first): the
            // flow ends here with what it sent.
            Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
                break;
            }
            Err(e) => return Err(e).context("lab client writing"),
        }
    }
    // (Fails harmlessly when the server already closed.)
    let _ = stream.shutdown(Shutdown::Write);
    // Wait for the server's FIN: everything sent has then been received.
    let mut byte = [0u8; 1];
    while !expired(deadline, stop) {
        match stream.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if transient(&e) => {}
            Err(_) => break,
        }
    }
    let info = tcp_info(&stream).ok();
    Ok(Sent {
        local,
        sent,
        retransmits: info.map_or(0, |i| i.tcpi_total_retrans),
        bytes_retrans: info.map_or(0, |i| i.tcpi_bytes_retrans),
        reord_seen: info.map_or(0, |i| i.tcpi_reord_seen),
        dsack_dups: info.map_or(0, |i| i.tcpi_dsack_dups),
        srtt_us: info.map_or(0, |i| i.tcpi_rtt),
        min_rtt_us: info.map_or(0, |i| i.tcpi_min_rtt),
        reordering: info.map_or(0, |i| i.tcpi_reordering),
        mean_srtt_us: srtt.0.checked_div(srtt.1).unwrap_or(0) as u32,
    })
}

/// A guest sender's upload (`tracer lab-send`, inside the guest): `flows`
/// flows from this namespace to `to`, until `bytes` each, `deadline`, or
/// `enough`. What each socket did, or why it failed.
pub fn send_here(
    to: SocketAddr,
    flows: usize,
    bytes: u64,
    deadline: Instant,
    enough: Arc<AtomicBool>,
) -> Vec<Result<Sent>> {
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..flows)
        .map(|_| {
            let (stop, enough) = (stop.clone(), enough.clone());
            std::thread::spawn(move || send(None, to, bytes, None, deadline, &stop, &enough))
        })
        .collect();
    threads
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("sender panicked")))
        })
        .collect()
}

/// The kernel's `struct tcp_info` for a socket.
pub fn tcp_info(stream: &TcpStream) -> std::io::Result<libc::tcp_info> {
    // SAFETY: tcp_info is plain data; getsockopt fills at most `len` bytes.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
        if libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(info)
    }
}
