//! A self-contained lab that reproduces the seed's failure on one machine:
//! a real kernel-TCP upload from a client to a server through an "edge"
//! that behaves like a flow-steering NIC, with ground truth to check the
//! tracer against.
//!
//! ```text
//!  client ns            edge ns                          server ns
//!  veth-c  ────────  veth-ec  [edge_steer XDP]            veth-s  [tracer]
//!  10.77.1.1         10.77.1.2   │ forward                 10.77.2.2
//!  (1 queue)                     └─ veth-es [edge_egress] ── (N queues)
//!                                   10.77.2.1
//! ```
//!
//! [`Edge`] emulates the NIC in one of three [`Mode`]s; the tracer observes
//! the server's `veth-s`, where each segment arrives on the RX queue and
//! CPU the edge gave it. [`Upload`] drives bounded kernel TCP. [`truth`]
//! holds what the edge did and what the kernels counted.
//!
//! Everything is named `tracer-lab-<pid>-<n>-...`, so a later run can tell
//! leftovers of a crashed one (dead pid) from a concurrent one, and removes
//! them. Dropping a [`Topology`] deletes its namespaces (and with them the
//! links, the programs attached to them and the iptables rules inside).

mod edge;
pub mod guest;
pub mod http;
mod janitor;
mod nfqueue;
mod pattern;
pub mod report;
mod sender_acks;
mod socket;
pub mod truth;
mod upload;
pub mod wan;

use std::{
    net::IpAddr,
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicU32, Ordering},
        Arc,
    },
};

use anyhow::{bail, Context, Result};

pub use edge::{Edge, EdgeReport, Mode, Until};
pub use pattern::{HeldSegment, Pattern, PatternTruth};
pub use sender_acks::{SenderAcks, SenderProbe};
pub use socket::{tcp_info, UploadSpec};
pub use upload::{FlowResult, Upload};
pub use wan::{Wan, WanReport, WanSpec};

use crate::{kernel::netns::NetnsGuard, SetupError};

pub const NS_PREFIX: &str = "tracer-lab-";
/// Interface names inside the namespaces.
pub const CLIENT_IF: &str = "veth-c";
pub const EDGE_CLIENT_IF: &str = "veth-ec";
pub const EDGE_SERVER_IF: &str = "veth-es";
pub const SERVER_IF: &str = "veth-s";
pub const CLIENT_V4: &str = "10.77.1.1";
pub const EDGE_CLIENT_V4: &str = "10.77.1.2";
pub const EDGE_SERVER_V4: &str = "10.77.2.1";
pub const SERVER_V4: &str = "10.77.2.2";
pub const CLIENT_V6: &str = "fd77:1::1";
pub const EDGE_CLIENT_V6: &str = "fd77:1::2";
pub const EDGE_SERVER_V6: &str = "fd77:2::1";
pub const SERVER_V6: &str = "fd77:2::2";
/// The edge's programs, as the kernel names them.
pub const EDGE_PROGRAM_NAMES: [&str; 2] = ["edge_steer", "edge_egress"];
/// The port the lab's server listens on.
pub const SERVER_PORT: u16 = 5201;

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
        if let (false, Some(pid)) = (alive, pid) {
            guest::kill_leftovers(&format!("{NS_PREFIX}{pid}-"));
        }
        if !alive && ip(&["netns", "delete", &name]).is_ok() {
            removed.push(name);
        }
    }
    removed
}

#[derive(Clone, Debug)]
pub struct TopologyOptions {
    /// TX and RX queues of the edge -> server link (the server's RX queues).
    pub queues: u32,
    /// The client and the server on one veth pair (`queues` queues), the
    /// edge left out: a container's interface, its offloads as the
    /// kernel sets them. (No [`Lab`] runs on it: its edge has no link.)
    pub direct: bool,
}

impl Default for TopologyOptions {
    fn default() -> Self {
        Self {
            queues: 4,
            direct: false,
        }
    }
}

/// Client, edge and server namespaces, routed through the edge. On its
/// own (no [`Edge`]) the edge's `veth-ec` delivers through per-CPU backlogs
/// and reorders whenever the sending thread moves between CPUs: use a
/// [`Lab`] for a controlled path.
pub struct Topology {
    /// `tracer-lab-<pid>-<n>`: what everything of this lab is named after.
    pub base: String,
    pub client_ns: String,
    pub edge_ns: String,
    pub server_ns: String,
    pub queues: u32,
    /// Deletes the namespaces if this process dies first (dropped after
    /// `Drop` has deleted them).
    _janitor: janitor::Janitor,
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
        let names = [
            format!("{base}-client"),
            format!("{base}-edge"),
            format!("{base}-server"),
        ];
        let janitor = janitor::Janitor::spawn(&base, &names.each_ref().map(String::as_str))?;
        let [client_ns, edge_ns, server_ns] = names;
        let topo = Topology {
            base,
            client_ns,
            edge_ns,
            server_ns,
            queues: opts.queues,
            _janitor: janitor,
        };
        // From here on, Drop removes whatever was created.
        for ns in [&topo.client_ns, &topo.edge_ns, &topo.server_ns] {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        if opts.direct {
            topo.link(
                (&topo.client_ns, CLIENT_IF, CLIENT_V4, CLIENT_V6),
                (&topo.server_ns, SERVER_IF, SERVER_V4, SERVER_V6),
                opts.queues,
            )?;
            for (ns, dev) in [(&topo.client_ns, CLIENT_IF), (&topo.server_ns, SERVER_IF)] {
                ip(&["-n", ns, "route", "add", "default", "dev", dev])?;
                ip(&["-n", ns, "-6", "route", "add", "default", "dev", dev])?;
            }
            return Ok(topo);
        }
        topo.link(
            (&topo.client_ns, CLIENT_IF, CLIENT_V4, CLIENT_V6),
            (
                &topo.edge_ns,
                EDGE_CLIENT_IF,
                EDGE_CLIENT_V4,
                EDGE_CLIENT_V6,
            ),
            1,
        )?;
        topo.link_server()?;
        ip(&[
            "-n",
            &topo.client_ns,
            "route",
            "add",
            "default",
            "via",
            EDGE_CLIENT_V4,
        ])?;
        ip(&[
            "-n",
            &topo.client_ns,
            "-6",
            "route",
            "add",
            "default",
            "via",
            EDGE_CLIENT_V6,
        ])?;
        in_netns(&topo.edge_ns, || -> Result<()> {
            for knob in [
                "/proc/sys/net/ipv4/ip_forward",
                "/proc/sys/net/ipv6/conf/all/forwarding",
            ] {
                std::fs::write(knob, "1").with_context(|| format!("writing {knob}"))?;
            }
            Ok(())
        })??;
        // The edge may rebuild the client's packets from XDP frames (CPU
        // redirect), which keeps no checksum-offload state: the client
        // computes full checksums.
        in_netns(&topo.client_ns, || tx_checksum_offload(CLIENT_IF, false))??;
        Ok(topo)
    }

    /// A veth pair between `a` and `b` (namespace, device, IPv4 and IPv6
    /// address), up, with `queues` queues each way; every neighbour known
    /// before the first packet: a packet waiting for ARP or neighbour
    /// discovery waits with what follows it (over IPv6 each connection's
    /// first SYN waited a second, then reached the server with its
    /// retransmission, and the edge could swap them: a PAWS discard in the
    /// handshake, which the kernel counts as PAWSEstab and no tracepoint
    /// of an established socket sees).
    fn link(&self, a: LinkEnd, b: LinkEnd, queues: u32) -> Result<()> {
        veth_pair((a.0, a.1), (b.0, b.1), queues)?;
        for (ns, dev, v4, v6) in [a, b] {
            ip(&["-n", ns, "addr", "add", &format!("{v4}/24"), "dev", dev])?;
            let v6 = format!("{v6}/64");
            ip(&["-n", ns, "-6", "addr", "add", &v6, "dev", dev, "nodad"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        for (end, peer) in [(a, b), (b, a)] {
            neighbours(end, peer)?;
        }
        Ok(())
    }

    /// The edge -> server link, with the server's routes through it. The
    /// edge sends wire segments, as a NIC delivers them: its TSO off
    /// (native XDP on the server's side, which the tracer then takes,
    /// would turn it off anyway).
    fn link_server(&self) -> Result<()> {
        self.link(
            (
                &self.edge_ns,
                EDGE_SERVER_IF,
                EDGE_SERVER_V4,
                EDGE_SERVER_V6,
            ),
            (&self.server_ns, SERVER_IF, SERVER_V4, SERVER_V6),
            self.queues,
        )?;
        in_netns(&self.edge_ns, || {
            tcp_segmentation_offload(EDGE_SERVER_IF, false)
        })??;
        self.server_routes()
    }

    /// The server's default routes, through the edge.
    fn server_routes(&self) -> Result<()> {
        let ns = &self.server_ns;
        ip(&[
            "-n",
            ns,
            "route",
            "replace",
            "default",
            "via",
            EDGE_SERVER_V4,
        ])?;
        ip(&[
            "-n",
            ns,
            "-6",
            "route",
            "replace",
            "default",
            "via",
            EDGE_SERVER_V6,
        ])?;
        Ok(())
    }

    /// Takes the server's interface down for `down` and up again (a flap:
    /// an admin, a link renegotiating): [`Topology::server_down`], then
    /// [`Topology::server_up`].
    pub fn bounce_server(&self, down: std::time::Duration) -> Result<()> {
        self.server_down()?;
        std::thread::sleep(down);
        self.server_up()
    }

    /// Takes the server's interface down (it stays there).
    pub fn server_down(&self) -> Result<()> {
        ip(&["-n", &self.server_ns, "link", "set", SERVER_IF, "down"])?;
        Ok(())
    }

    /// Brings the server's interface up again after
    /// [`Topology::server_down`], and puts back what going down removed:
    /// its IPv6 address, its neighbours, the routes through it.
    pub fn server_up(&self) -> Result<()> {
        let ns = &self.server_ns;
        ip(&["-n", ns, "link", "set", SERVER_IF, "up"])?;
        let v6 = format!("{SERVER_V6}/64");
        ip(&[
            "-n", ns, "-6", "addr", "replace", &v6, "dev", SERVER_IF, "nodad",
        ])?;
        neighbours(
            (ns, SERVER_IF, SERVER_V4, SERVER_V6),
            (
                &self.edge_ns,
                EDGE_SERVER_IF,
                EDGE_SERVER_V4,
                EDGE_SERVER_V6,
            ),
        )?;
        self.server_routes()
    }

    /// Makes the edge -> server link again after it was deleted (the
    /// server's interface going away and coming back, as a NIC's driver
    /// reload does). The lab's edge programs on it are not put back (the
    /// edge then forwards plainly): [`Lab::relink_server`] does that too.
    pub fn relink_server(&self) -> Result<()> {
        self.link_server()
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
        for ns in [&self.client_ns, &self.edge_ns, &self.server_ns] {
            if let Err(e) = ip(&["netns", "delete", ns]) {
                eprintln!("lab: could not delete namespace {ns}: {e}");
            }
        }
    }
}

/// `end`'s permanent neighbour entries for `peer`'s addresses.
fn neighbours(end: LinkEnd, peer: LinkEnd) -> Result<()> {
    let (ns, dev, ..) = end;
    let (peer_ns, peer_dev, v4, v6) = peer;
    let mac = mac_address(peer_ns, peer_dev)?;
    for addr in [v4, v6] {
        ip(&[
            "-n",
            ns,
            "neigh",
            "replace",
            addr,
            "lladdr",
            &mac,
            "dev",
            dev,
            "nud",
            "permanent",
        ])?;
    }
    Ok(())
}

/// Packets `dev` in `ns` dropped in direction `dir` (`rx`, `tx`), from
/// `ip -s link`'s JSON.
fn link_dropped(ns: &str, dev: &str, dir: &str) -> Result<u64> {
    let out = ip(&["-n", ns, "-j", "-s", "link", "show", "dev", dev])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("`ip -j -s link` output")?;
    v[0]["stats64"][dir]["dropped"]
        .as_u64()
        .with_context(|| format!("no {dir} drop count for {dev} in `ip -j -s link`"))
}

fn veth_pair(a: (&str, &str), b: (&str, &str), queues: u32) -> Result<()> {
    let q = queues.to_string();
    ip(&[
        "link",
        "add",
        a.1,
        "netns",
        a.0,
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
        "type",
        "veth",
        "peer",
        "name",
        b.1,
        "netns",
        b.0,
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
    ])?;
    Ok(())
}

/// One end of a link: namespace, device, IPv4 and IPv6 address.
type LinkEnd<'a> = (&'a str, &'a str, &'a str, &'a str);

/// The MAC address of `dev` in `ns`, as iproute2 prints it.
fn mac_address(ns: &str, dev: &str) -> Result<String> {
    let out = ip(&["-n", ns, "-br", "link", "show", "dev", dev])?;
    // `NAME@PEER  STATE  MAC  <FLAGS>`
    out.split_whitespace()
        .nth(2)
        .filter(|m| m.len() == 17 && m.matches(':').count() == 5)
        .map(str::to_owned)
        .with_context(|| format!("no MAC address in `ip -br link show {dev}`: {out}"))
}

/// `ethtool -K DEV tx on|off` for the calling thread's namespace.
fn tx_checksum_offload(dev: &str, on: bool) -> Result<()> {
    const ETHTOOL_STXCSUM: u32 = 0x17;
    ethtool_set(dev, ETHTOOL_STXCSUM, "tx", on)
}

/// `ethtool -K DEV tso on|off` for the calling thread's namespace.
fn tcp_segmentation_offload(dev: &str, on: bool) -> Result<()> {
    const ETHTOOL_STSO: u32 = 0x1f;
    ethtool_set(dev, ETHTOOL_STSO, "tso", on)
}

/// One `ethtool -K DEV FEATURE on|off` (its set command `cmd`).
fn ethtool_set(dev: &str, cmd: u32, feature: &str, on: bool) -> Result<()> {
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let mut value = EthtoolValue {
        cmd,
        data: u32::from(on),
    };
    // SAFETY: a plain socket and a SIOCETHTOOL request whose ifreq points
    // at `value`, which outlives the call.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        if fd < 0 {
            bail!("socket: {}", std::io::Error::last_os_error());
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(dev.bytes()) {
            *d = s as libc::c_char;
        }
        ifr.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
        let ret = libc::ioctl(fd, libc::SIOCETHTOOL, &mut ifr);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if ret != 0 {
            bail!(
                "ethtool -K {dev} {feature} {}: {err}",
                if on { "on" } else { "off" }
            );
        }
    }
    Ok(())
}

/// Runs `f` with the calling thread inside namespace `ns`.
pub fn in_netns<T>(ns: &str, f: impl FnOnce() -> T) -> Result<T, SetupError> {
    let _guard = NetnsGuard::enter(ns)?;
    Ok(f())
}

/// A lab sender: whose TCP, with which loss detection. `Host` and
/// `Newreno` are this kernel's TCP in the client's namespace; the others
/// are Linux 6.1 guests (see [`guest`]), whose TCP still has RFC 6675 SACK
/// recovery. All run CUBIC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Sender {
    /// This kernel's defaults: RACK-TLP (tcp_recovery=1), adaptive
    /// reordering threshold.
    #[default]
    Host,
    /// This kernel without SACK (Linux 6.17 removed RFC 6675 recovery):
    /// RFC 6582 NewReno, three duplicate ACKs (`tcp_sack=0`), a threshold
    /// that never adapts (`tcp_reordering=3`, `tcp_max_reordering=3`), no
    /// tail loss probes (`tcp_early_retrans=0`). Without SACK there is no
    /// DSACK: its spurious retransmissions are the duplicates the receiver
    /// counts (`DelayedACKLost`).
    Newreno,
    /// A pre-RACK sender (as Windows before RACK; it sends no timestamps):
    /// RFC 6675 SACK recovery at three duplicate ACKs (`tcp_recovery=0`,
    /// `tcp_reordering=3`, `tcp_max_reordering=3`), no timestamps (so no
    /// Eifel undo), no F-RTO (`tcp_frto=0`), no tail loss probes. Linux has
    /// no switch for DSACK-based undo: it stays, but cannot raise the
    /// threshold past 3.
    Classic,
    /// Linux's RFC 6675 recovery with its adaptive threshold
    /// (`tcp_recovery=0`, `tcp_max_reordering=300`), timestamps on.
    LinuxAdaptive,
    /// RFC 8985 RACK-TLP (`tcp_recovery=1`), timestamps on.
    RackTlp,
}

impl Sender {
    /// Whether it runs in a guest of its own.
    pub fn in_guest(self) -> bool {
        !matches!(self, Sender::Host | Sender::Newreno)
    }

    /// The sysctls that make the policy.
    pub fn knobs(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Sender::Host => &[],
            Sender::Newreno => &[
                ("net.ipv4.tcp_sack", "0"),
                ("net.ipv4.tcp_reordering", "3"),
                ("net.ipv4.tcp_max_reordering", "3"),
                ("net.ipv4.tcp_early_retrans", "0"),
            ],
            Sender::Classic => &[
                ("net.ipv4.tcp_recovery", "0"),
                ("net.ipv4.tcp_reordering", "3"),
                ("net.ipv4.tcp_max_reordering", "3"),
                ("net.ipv4.tcp_timestamps", "0"),
                ("net.ipv4.tcp_frto", "0"),
                ("net.ipv4.tcp_early_retrans", "0"),
            ],
            Sender::LinuxAdaptive => &[
                ("net.ipv4.tcp_recovery", "0"),
                ("net.ipv4.tcp_max_reordering", "300"),
            ],
            Sender::RackTlp => &[("net.ipv4.tcp_recovery", "1")],
        }
    }

    /// Configures the calling thread's namespace (a host sender).
    fn apply(self) -> Result<()> {
        for (knob, value) in self.knobs() {
            write_sysctl(knob, value)?;
        }
        Ok(())
    }
}

impl std::fmt::Display for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = clap::ValueEnum::to_possible_value(self).expect("no skipped kinds");
        f.write_str(v.get_name())
    }
}

/// Pins the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Writes sysctl `knob` (dotted) in the calling thread's namespace.
pub fn write_sysctl(knob: &str, value: &str) -> Result<()> {
    let path = format!("/proc/sys/{}", knob.replace('.', "/"));
    std::fs::write(&path, value).with_context(|| format!("writing {path}"))
}

/// One lab run: what to build and what to send.
#[derive(Clone, Debug)]
pub struct LabSpec {
    pub mode: Mode,
    /// Each sends `flows` flows.
    pub senders: Vec<Sender>,
    pub queues: u32,
    pub flows: usize,
    pub bytes_per_flow: u64,
    pub ipv6: bool,
    /// Hard bound on the upload.
    pub timeout: std::time::Duration,
    /// Per-flow pacing of the host's senders, bytes per second (None:
    /// unpaced). Guests are never paced (see [`guest`]).
    pub pacing: Option<u64>,
    /// Whether the client's TCP may send multi-segment (GSO) skbs. Linux
    /// stamps all segments of one skb with one transmit time, so RACK
    /// cannot tell them apart, and its reordering timer waits at least two
    /// jiffies: within a burst it tolerates far more reordering than
    /// RFC 8985's per-segment times. Off (`gso_max_segs 1`): one segment
    /// per skb, as the replay models.
    pub sender_gso: bool,
    /// Write every segment leaving the edge (and every table change) here,
    /// as JSON lines.
    pub truth_out: Option<std::path::PathBuf>,
    /// Stop the upload once the edge has made this many late segments in
    /// every flow (`bytes_per_flow` and `timeout` still bound it): an
    /// experiment sized by what happened, not by bytes and a hope.
    pub until_late: Option<u64>,
    /// The path between the senders and the edge.
    pub wan: WanSpec,
    /// Whether the receiver sends DSACKs (RFC 2883). Without them no
    /// sender can undo a recovery from them, and the classic guest, which
    /// has no timestamps either, undoes none: the seed's senders.
    pub receiver_dsack: bool,
}

impl LabSpec {
    /// The network of `mode` with `queues` server RX queues, and a small
    /// default upload (callers that run their own uploads ignore it).
    pub fn new(mode: Mode, queues: u32) -> Self {
        Self {
            mode,
            senders: vec![Sender::Host],
            queues,
            flows: 1,
            bytes_per_flow: 1 << 20,
            ipv6: false,
            timeout: std::time::Duration::from_secs(30),
            pacing: None,
            sender_gso: true,
            truth_out: None,
            until_late: None,
            wan: WanSpec::default(),
            receiver_dsack: true,
        }
    }
}

impl LabSpec {
    /// Each sender's address (its flows' source) and kind: the names the
    /// snapshot gives flows ([`crate::snapshot::Snapshot::name_senders`]).
    pub fn sender_addresses(&self) -> Vec<(std::net::IpAddr, String)> {
        let host = if self.ipv6 { CLIENT_V6 } else { CLIENT_V4 };
        let mut guests = 0..;
        self.senders
            .iter()
            .map(|&kind| {
                let address = if kind.in_guest() {
                    guest::address(guests.next().expect("unbounded"))
                } else {
                    host.parse().expect("a literal address")
                };
                (address, kind.to_string())
            })
            .collect()
    }
}

/// The namespaces, the edge and (once started) the upload of one run.
/// Dropping it stops the upload and removes everything.
pub struct Lab {
    // Field order is drop order: the upload and the edge before the
    // namespaces they live in.
    upload: Option<Upload>,
    wan: Option<Wan>,
    edge: Option<Edge>,
    probe: Option<SenderProbe>,
    pub topo: Topology,
    spec: LabSpec,
    /// Set by the edge when `spec.until_late` is reached.
    enough: Arc<AtomicBool>,
}

/// What the lab itself saw: the sockets, the edge, the kernels' counters.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LabOutcome {
    pub senders: Vec<SenderReport>,
    pub flows: Vec<FlowResult>,
    pub edge: EdgeReport,
    /// The server's and the client's TcpExt counters (`nstat`).
    pub receiver_counters: std::collections::BTreeMap<String, u64>,
    pub sender_counters: std::collections::BTreeMap<String, u64>,
    /// When the senders' sockets took each ACK (for the replay).
    pub sender_acks: SenderAcks,
    /// Whether a run sized by `--until-late` got there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until_late: Option<UntilLate>,
    /// Packets the kernel dropped between the edge and the server's XDP
    /// (the edge's veth TX drops: the server's receive ring full; and the
    /// server's RX drops), as `ip -s link` counts them: what left the edge
    /// and never reached the tracer.
    pub dropped_on_the_way: u64,
    /// Packets dropped between the senders and the edge: the client's
    /// veth TX drops and the guests' taps' RX drops (`ip -s link`).
    pub dropped_before_the_edge: u64,
    /// Resets the server sent (`TcpOutRsts`): the answer to a segment that
    /// arrived after its connection was over (a stale copy still inside the
    /// edge when the upload finished), which the tracer may have stopped
    /// before.
    pub server_resets: u64,
    /// The WAN path's delay line and bottleneck, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wan: Option<WanReport>,
    /// Whether the receiver sent DSACKs (`--no-dsack`: not).
    pub receiver_dsack: bool,
}

/// One sender: its kind and, for a guest, its kernel, its sysctls as it
/// read them back and its own TCP counters (the host's are
/// `sender_counters`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct SenderReport {
    pub kind: Sender,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest: Option<guest::GuestReport>,
}

/// How a run asked to go on until enough late segments ended.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct UntilLate {
    /// Late segments asked for in every flow.
    pub asked: u64,
    /// The fewest the edge made in any flow.
    pub fewest: u64,
    /// Every flow got there before the bytes or the time ran out.
    pub reached: bool,
}

impl Lab {
    /// Builds the topology and starts the edge in `spec.mode`.
    pub fn create(spec: &LabSpec) -> Result<Self> {
        let topo = Topology::create(&TopologyOptions {
            queues: spec.queues,
            direct: false,
        })?;
        let host = spec.senders.iter().filter(|s| !s.in_guest()).count();
        if host > 1 {
            return Err(SetupError::BadArgument(
                "--sender: host and newreno are both this kernel's TCP in one namespace: give one of them".into(),
            )
            .into());
        }
        if spec.ipv6 && spec.senders.iter().any(|s| s.in_guest()) {
            return Err(SetupError::BadArgument(
                "--sender: the guest senders (classic, linux-adaptive, rack-tlp) are IPv4 only: drop --ipv6".into(),
            )
            .into());
        }
        in_netns(&topo.client_ns, || -> Result<()> {
            for s in spec.senders.iter().filter(|s| !s.in_guest()) {
                s.apply()?;
            }
            // The guests' subnets: forwarded, their ports kept apart.
            write_sysctl("net.ipv4.ip_forward", "1")?;
            write_sysctl("net.ipv4.ip_local_port_range", &guest::host_port_range())
        })??;
        if !spec.receiver_dsack {
            in_netns(&topo.server_ns, || write_sysctl("net.ipv4.tcp_dsack", "0"))??;
        }
        if spec.senders.iter().any(|s| s.in_guest()) {
            guest::route_guests(&topo)?;
        }
        if !spec.sender_gso {
            ip(&[
                "-n",
                &topo.client_ns,
                "link",
                "set",
                "dev",
                CLIENT_IF,
                "gso_max_segs",
                "1",
            ])?;
        }
        let enough = Arc::new(AtomicBool::new(false));
        let until = spec.until_late.map(|late| {
            let until = Until {
                late,
                flows: spec.flows * spec.senders.len(),
            };
            (until, enough.clone())
        });
        let edge = Edge::start(&topo, spec.mode, spec.truth_out.as_deref(), until)?;
        let wan = Wan::start(&topo, spec.wan)?;
        Ok(Self {
            upload: None,
            wan: Some(wan),
            edge: Some(edge),
            probe: None,
            topo,
            spec: spec.clone(),
            enough,
        })
    }

    /// Starts the upload (attach the tracer first), with the sender-side
    /// ACK probe.
    /// The edge's RSS key and table, as its NIC would report them.
    pub fn rss(&self) -> crate::nic::rss::Rss {
        edge::rss(self.topo.queues)
    }

    pub fn start_upload(&mut self) -> Result<()> {
        self.probe = Some(SenderProbe::attach(&self.topo)?);
        self.upload = Some(Upload::start_until(
            &self.topo,
            &UploadSpec {
                flows: self.spec.flows,
                bytes_per_flow: self.spec.bytes_per_flow,
                port: SERVER_PORT,
                ipv6: self.spec.ipv6,
                timeout: self.spec.timeout,
                pacing: self.spec.pacing,
                sysctls: if self.spec.wan.is_direct() {
                    Vec::new()
                } else {
                    wan::BUFFERS.to_vec()
                },
            },
            self.enough.clone(),
            &self.spec.senders,
        )?);
        Ok(())
    }

    /// Makes the server's link again after it was deleted, as a driver
    /// reload would, with the edge's programs on it (unlike
    /// [`Topology::relink_server`] alone).
    pub fn relink_server(&mut self) -> Result<()> {
        self.topo.relink_server()?;
        if let Some(edge) = self.edge.as_mut() {
            edge.reattach_egress(&self.topo)?;
        }
        Ok(())
    }

    /// ATR mode: the edge's re-pointing on or off while the upload goes
    /// on (a NIC whose ATR is switched off).
    pub fn set_steering(&self, on: bool) {
        if let Some(edge) = &self.edge {
            edge.set_steering(on);
        }
    }

    /// The late segments the edge has made so far, over every flow.
    pub fn late_so_far(&self) -> u64 {
        self.edge.as_ref().map_or(0, Edge::late_so_far)
    }

    /// The upload is over (finished, failed or stopped).
    pub fn finished(&self) -> bool {
        self.upload.as_ref().is_none_or(Upload::finished)
    }

    /// Stops the upload and the edge and collects what they saw; the
    /// namespaces go when `self` does.
    pub fn finish(&mut self) -> Result<LabOutcome> {
        let (flows, mut guests) = match self.upload.take() {
            Some(u) => {
                u.stop();
                u.join_all()?
            }
            None => Default::default(),
        };
        let senders = self
            .spec
            .senders
            .iter()
            .map(|&kind| SenderReport {
                kind,
                guest: guests
                    .iter()
                    .position(|(k, _)| *k == kind)
                    .map(|i| guests.swap_remove(i).1),
            })
            .collect();
        let wan = match self.wan.take() {
            Some(w) if !self.spec.wan.is_direct() => Some(w.finish()?),
            _ => None,
        };
        let edge = self
            .edge
            .take()
            .context("the lab's edge was already finished")?
            .finish()?;
        let sender_acks = match self.probe.take() {
            Some(p) => p.finish()?,
            None => SenderAcks::default(),
        };
        let receiver_counters = in_netns(&self.topo.server_ns, || {
            truth::tcp_ext(truth::RECEIVER_COUNTERS)
        })?;
        let sender_counters = in_netns(&self.topo.client_ns, || {
            truth::tcp_ext(truth::SENDER_COUNTERS)
        })?;
        let server_resets = in_netns(&self.topo.server_ns, || truth::nstat(&["TcpOutRsts"]))?
            .get("TcpOutRsts")
            .copied()
            .unwrap_or(0);
        let dropped_on_the_way = link_dropped(&self.topo.edge_ns, EDGE_SERVER_IF, "tx")?
            + link_dropped(&self.topo.server_ns, SERVER_IF, "rx")?;
        let mut dropped_before_the_edge = link_dropped(&self.topo.client_ns, CLIENT_IF, "tx")?;
        for index in 0..self.spec.senders.iter().filter(|s| s.in_guest()).count() {
            dropped_before_the_edge +=
                link_dropped(&self.topo.client_ns, &guest::tap(index), "rx")?;
        }
        let until_late = self.spec.until_late.map(|asked| {
            let fewest = edge
                .truth
                .fewest_late(self.spec.flows * self.spec.senders.len());
            UntilLate {
                asked,
                fewest,
                reached: fewest >= asked,
            }
        });
        Ok(LabOutcome {
            senders,
            flows,
            edge,
            receiver_counters,
            sender_counters,
            sender_acks,
            until_late,
            dropped_on_the_way,
            dropped_before_the_edge,
            server_resets,
            wan,
            receiver_dsack: self.spec.receiver_dsack,
        })
    }
}
