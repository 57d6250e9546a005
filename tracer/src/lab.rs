//! A self-contained test network: two network namespaces joined by a
//! multi-queue veth pair, and a bounded kernel-TCP upload between them.
//!
//! Everything is named `tracer-lab-<pid>-<n>-...`, so a later run can tell
//! leftovers of a crashed one (dead pid) from a concurrent one, and removes
//! them. Dropping a [`Topology`] deletes its namespaces (and with them the
//! veth pair); dropping an [`Upload`] stops and joins its threads.

use std::{
    io::{ErrorKind, Read, Write},
    net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{kernel::netns::NetnsGuard, source::Flow, SetupError};

pub const NS_PREFIX: &str = "tracer-lab-";
/// Interface names inside the namespaces.
pub const CLIENT_IF: &str = "veth-c";
pub const SERVER_IF: &str = "veth-s";
pub const CLIENT_V4: &str = "10.77.0.1";
pub const SERVER_V4: &str = "10.77.0.2";
pub const CLIENT_V6: &str = "fd77::1";
pub const SERVER_V6: &str = "fd77::2";

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// Runs `ip ARGS`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        SetupError::Environment(format!(
            "cannot run `ip` ({e}): the lab needs iproute2 (`cargo xtask setup` installs it)"
        ))
    })?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Our namespaces currently present.
pub fn lab_namespaces() -> Vec<String> {
    std::fs::read_dir(crate::kernel::netns::NETNS_RUN_DIR)
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(NS_PREFIX))
                .collect()
        })
        .unwrap_or_default()
}

/// Deletes namespaces left by lab runs whose process is gone. Returns them.
pub fn cleanup_leftovers() -> Vec<String> {
    let mut removed = Vec::new();
    for name in lab_namespaces() {
        let pid = name[NS_PREFIX.len()..]
            .split('-')
            .next()
            .and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if !alive && ip(&["netns", "delete", &name]).is_ok() {
            removed.push(name);
        }
    }
    removed
}

#[derive(Clone, Debug)]
pub struct TopologyOptions {
    /// TX and RX queues on each side of the veth pair.
    pub queues: u32,
}

impl Default for TopologyOptions {
    fn default() -> Self {
        Self { queues: 4 }
    }
}

/// Client and server namespaces joined by `veth-c` <-> `veth-s`.
pub struct Topology {
    pub client_ns: String,
    pub server_ns: String,
    pub queues: u32,
}

impl Topology {
    pub fn create(opts: &TopologyOptions) -> Result<Self> {
        crate::require_root()?;
        let removed = cleanup_leftovers();
        if !removed.is_empty() {
            eprintln!(
                "lab: removed leftovers of an earlier run: {}",
                removed.join(", ")
            );
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let base = format!("{NS_PREFIX}{}-{id}", std::process::id());
        let topo = Topology {
            client_ns: format!("{base}-client"),
            server_ns: format!("{base}-server"),
            queues: opts.queues,
        };
        // From here on, Drop removes whatever was created.
        ip(&["netns", "add", &topo.client_ns])?;
        ip(&["netns", "add", &topo.server_ns])?;
        let q = opts.queues.to_string();
        ip(&[
            "link",
            "add",
            CLIENT_IF,
            "netns",
            &topo.client_ns,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            SERVER_IF,
            "netns",
            &topo.server_ns,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
        ])?;
        for (ns, dev, v4, v6) in [
            (&topo.client_ns, CLIENT_IF, CLIENT_V4, CLIENT_V6),
            (&topo.server_ns, SERVER_IF, SERVER_V4, SERVER_V6),
        ] {
            ip(&["-n", ns, "addr", "add", &format!("{v4}/24"), "dev", dev])?;
            ip(&[
                "-n",
                ns,
                "-6",
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                dev,
                "nodad",
            ])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(topo)
    }

    pub fn server_addr(&self, ipv6: bool) -> IpAddr {
        (if ipv6 { SERVER_V6 } else { SERVER_V4 }).parse().unwrap()
    }

    /// The RX queue count of `dev` in `ns`, as iproute2 reports it.
    pub fn rx_queues(ns: &str, dev: &str) -> Result<u32> {
        let out = ip(&["-n", ns, "-d", "link", "show", dev])?;
        out.split_whitespace()
            .skip_while(|w| *w != "numrxqueues")
            .nth(1)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no numrxqueues in `ip -d link show {dev}`"))
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in [&self.client_ns, &self.server_ns] {
            if let Err(e) = ip(&["netns", "delete", ns]) {
                eprintln!("lab: could not delete namespace {ns}: {e}");
            }
        }
    }
}

/// Runs `f` with the calling thread inside namespace `ns`.
pub fn in_netns<T>(ns: &str, f: impl FnOnce() -> T) -> Result<T, SetupError> {
    let _guard = NetnsGuard::enter(ns)?;
    Ok(f())
}

#[derive(Clone, Debug)]
pub struct UploadSpec {
    pub flows: usize,
    pub bytes_per_flow: u64,
    pub port: u16,
    pub ipv6: bool,
    /// Hard bound on the whole upload.
    pub timeout: Duration,
}

/// What one flow of an upload did, from the sockets' own point of view.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FlowResult {
    /// Client -> server.
    pub flow: Flow,
    pub sent: u64,
    pub received: u64,
    /// The sender's `tcpi_total_retrans` (segments) and `tcpi_bytes_retrans`.
    pub retransmits: u32,
    pub bytes_retrans: u64,
}

struct Sent {
    local: SocketAddr,
    sent: u64,
    info: Option<libc::tcp_info>,
}

/// A running upload: client threads write, server threads read and count.
pub struct Upload {
    stop: Arc<AtomicBool>,
    remaining: Arc<AtomicUsize>,
    senders: Vec<JoinHandle<Result<Sent>>>,
    server: Option<JoinHandle<Vec<(SocketAddr, u64)>>>,
    server_addr: SocketAddr,
}

const CHUNK: usize = 256 * 1024;
const POLL: Duration = Duration::from_millis(100);

impl Upload {
    pub fn start(topo: &Topology, spec: &UploadSpec) -> Result<Self> {
        let server_addr = SocketAddr::new(topo.server_addr(spec.ipv6), spec.port);
        let deadline = Instant::now() + spec.timeout;
        let stop = Arc::new(AtomicBool::new(false));
        let remaining = Arc::new(AtomicUsize::new(spec.flows));

        let listener = in_netns(&topo.server_ns, || TcpListener::bind(server_addr))?
            .with_context(|| format!("binding the lab server to {server_addr}"))?;
        listener.set_nonblocking(true)?;
        let server = {
            let (stop, flows) = (stop.clone(), spec.flows);
            std::thread::spawn(move || serve(listener, flows, deadline, &stop))
        };

        let mut senders = Vec::new();
        for _ in 0..spec.flows {
            let (stop, remaining) = (stop.clone(), remaining.clone());
            let (ns, bytes) = (topo.client_ns.clone(), spec.bytes_per_flow);
            senders.push(std::thread::spawn(move || {
                let r = send(&ns, server_addr, bytes, deadline, &stop);
                remaining.fetch_sub(1, Ordering::SeqCst);
                r
            }));
        }
        Ok(Self {
            stop,
            remaining,
            senders,
            server: Some(server),
            server_addr,
        })
    }

    /// All senders are done (finished, failed or stopped).
    pub fn finished(&self) -> bool {
        self.remaining.load(Ordering::SeqCst) == 0
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Waits for every thread; the per-flow results, by client address.
    pub fn join(mut self) -> Result<Vec<FlowResult>> {
        let senders = std::mem::take(&mut self.senders);
        let mut sent = Vec::new();
        for h in senders {
            sent.push(
                h.join()
                    .map_err(|_| anyhow::anyhow!("lab sender panicked"))??,
            );
        }
        // Senders are done; the server only waits for stragglers now.
        let received = self
            .server
            .take()
            .expect("joined once")
            .join()
            .map_err(|_| anyhow::anyhow!("lab server panicked"))?;
        Ok(sent
            .into_iter()
            .map(|s| FlowResult {
                flow: Flow {
                    src: s.local,
                    dst: self.server_addr,
                },
                sent: s.sent,
                received: received
                    .iter()
                    .find(|(peer, _)| *peer == s.local)
                    .map_or(0, |(_, n)| *n),
                retransmits: s.info.map_or(0, |i| i.tcpi_total_retrans),
                bytes_retrans: s.info.map_or(0, |i| i.tcpi_bytes_retrans),
            })
            .collect())
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

/// Accepts `flows` connections and reads each to EOF; (peer, bytes) each.
fn serve(
    listener: TcpListener,
    flows: usize,
    deadline: Instant,
    stop: &Arc<AtomicBool>,
) -> Vec<(SocketAddr, u64)> {
    let mut readers = Vec::new();
    while readers.len() < flows && !expired(deadline, stop) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let stop = stop.clone();
                readers.push(std::thread::spawn(move || {
                    (peer, drain_stream(stream, deadline, &stop))
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

fn drain_stream(mut stream: TcpStream, deadline: Instant, stop: &AtomicBool) -> u64 {
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

fn send(
    ns: &str,
    to: SocketAddr,
    bytes: u64,
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<Sent> {
    let mut stream = in_netns(ns, || {
        TcpStream::connect_timeout(&to, Duration::from_secs(5))
    })?
    .with_context(|| format!("lab client connecting to {to}"))?;
    stream.set_write_timeout(Some(POLL))?;
    stream.set_read_timeout(Some(POLL))?;
    let local = stream.local_addr()?;
    let chunk = vec![0x5au8; CHUNK];
    let mut sent = 0u64;
    while sent < bytes && !expired(deadline, stop) {
        let n = (bytes - sent).min(CHUNK as u64) as usize;
        match stream.write(&chunk[..n]) {
            Ok(w) => sent += w as u64,
            Err(e) if transient(&e) => {}
            Err(e) => return Err(e).context("lab client writing"),
        }
    }
    stream.shutdown(Shutdown::Write)?;
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
    Ok(Sent {
        local,
        sent,
        info: tcp_info(&stream).ok(),
    })
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
