//! The lab's kernel-TCP sockets, as the host's senders and the guests'
//! (`tracer lab-send`) both run them: a client flow that writes until its
//! bytes, deadline or stop and then reports what its socket did
//! (`tcp_info`), and the server that accepts and drains.

use std::{
    io::{ErrorKind, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::in_netns;

/// What every sender of an upload is asked to do.
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

/// One accepted connection: peer, bytes read, the socket's tcp_info.
pub type Received = (SocketAddr, u64, Option<libc::tcp_info>);

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

const CHUNK: usize = 256 * 1024;
const POLL: Duration = Duration::from_millis(100);

pub fn expired(deadline: Instant, stop: &AtomicBool) -> bool {
    stop.load(Ordering::SeqCst) || Instant::now() >= deadline
}

/// How far the server is, for telling when the last segment a client
/// sent has arrived ([`ServerProgress::done_since`]).
#[derive(Debug, Default)]
pub struct ServerProgress {
    accepted: AtomicUsize,
    /// Connections read to EOF whose close has finished (our FIN
    /// acknowledged: nothing more comes from that client), or given up.
    closed: AtomicUsize,
    /// Times the accept queue was found empty.
    empty_polls: AtomicU64,
}

impl ServerProgress {
    /// The count of empty accept queues seen so far.
    pub fn empty_polls(&self) -> u64 {
        self.empty_polls.load(Ordering::SeqCst)
    }

    /// Every connection made before the server found its accept queue
    /// empty for the `after`-th time and later has been read and closed:
    /// with `after` taken once every client had finished, no segment of
    /// theirs is still on its way.
    pub fn done_since(&self, after: u64) -> bool {
        self.empty_polls() > after
            && self.closed.load(Ordering::SeqCst) == self.accepted.load(Ordering::SeqCst)
    }
}

/// Accepts `flows` connections and reads each to EOF, then closes it and
/// waits for the client's acknowledgment of that close (its last segment).
pub fn serve(
    listener: TcpListener,
    flows: usize,
    deadline: Instant,
    stop: &Arc<AtomicBool>,
    progress: &Arc<ServerProgress>,
) -> Vec<Received> {
    let mut readers = Vec::new();
    loop {
        if expired(deadline, stop) {
            break;
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                progress.accepted.fetch_add(1, Ordering::SeqCst);
                let (stop, progress) = (stop.clone(), progress.clone());
                readers.push(std::thread::spawn(move || {
                    let bytes = drain_stream(&stream, deadline, &stop);
                    let info = tcp_info(&stream).ok();
                    close_after_last_ack(&stream, deadline, &stop);
                    progress.closed.fetch_add(1, Ordering::SeqCst);
                    (peer, bytes, info)
                }));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                progress.empty_polls.fetch_add(1, Ordering::SeqCst);
                if readers.len() >= flows {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(_) => break,
        }
    }
    readers.into_iter().filter_map(|h| h.join().ok()).collect()
}

/// `tcpi_state` of a socket whose connection is over (`TCP_CLOSE` in
/// `linux/tcp_states.h`).
const TCP_CLOSE: u8 = 7;

/// Closes our side (FIN) and waits until the client acknowledged it, the
/// socket then CLOSED: every segment the client sent has arrived.
fn close_after_last_ack(stream: &TcpStream, deadline: Instant, stop: &AtomicBool) {
    if stream.shutdown(Shutdown::Write).is_err() {
        return;
    }
    while !expired(deadline, stop) {
        match tcp_info(stream) {
            Ok(i) if i.tcpi_state != TCP_CLOSE => std::thread::sleep(Duration::from_millis(1)),
            _ => return,
        }
    }
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
pub fn send(
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
