//! A sender with its own kernel: Debian's `user-mode-linux` (Linux 6.1 as
//! a process), whose TCP still has RFC 6675 SACK recovery, set up as one
//! of the replay's policies ([`Sender::knobs`]).
//!
//! ```text
//!  guest k (linux.uml)      client ns                edge ns ...
//!  vec0 10.77.(16+k).2 ──── tap tu<k> 10.77.(16+k).1  veth-c ── veth-ec
//! ```
//!
//! The guest boots with this host's filesystem as its root, configures its
//! interface (one segment per skb: no TSO, GSO or scatter-gather), and runs
//! `tracer lab-send`, which sets the policy's sysctls, uploads, and prints
//! what it did as `tracer-lab-send:` JSON lines on the console (a log file
//! in the run's directory). Each guest has its own source port range, so
//! the edge (which names a flow by its ports) keeps flows apart. The
//! guest's processes carry the lab's name on their command line: the
//! janitor and a later run's cleanup kill them by it.
//!
//! A guest is never paced (`--pace` is the host senders'): with
//! `SO_MAX_PACING_RATE` its kernel's pacing timer is what sends the next
//! segment after an ACK, and in the user-mode kernel that timer was lost:
//! twice in ~370 paced runs a flow sat with data queued, nothing in flight
//! and no timer left to send it until the lab's deadline (no RTO, no
//! probe: nothing was outstanding). Unpaced, an ACK sends the next
//! segments itself. A guest's link carries about 1.2 Gbit/s unpaced.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    net::SocketAddr,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{
    in_netns, ip,
    socket::{send_here, Sent, UploadSpec},
    Sender, Topology, CLIENT_V4,
};
use crate::SetupError;

/// The user-mode kernel (Debian's `user-mode-linux` package).
pub const UML: &str = "/usr/bin/linux.uml";
/// What `tracer lab-send` prefixes its lines with.
pub const LINE_PREFIX: &str = "tracer-lab-send: ";
/// A guest's own source ports: 2,000 from 41,000 + 2,000 k (the host's
/// senders keep below 41,000).
pub const PORTS_FROM: u16 = 41_000;
pub const PORTS_EACH: u16 = 2_000;
/// Time a guest gets past its upload's deadline to report and power off.
const GRACE: Duration = Duration::from_secs(15);

/// What a guest printed: its sysctls as it read them back, its sockets, its
/// kernel's TCP counters.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct GuestReport {
    pub release: String,
    pub sysctls: BTreeMap<String, String>,
    pub flows: Vec<Sent>,
    pub counters: BTreeMap<String, u64>,
    /// Flows that failed, and why.
    pub errors: Vec<String>,
}

/// One line of `tracer lab-send`'s output.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuestLine {
    Release(String),
    Sysctls(BTreeMap<String, String>),
    Flow(Sent),
    Error(String),
    Counters(BTreeMap<String, u64>),
}

/// A running guest sender.
pub struct Guest {
    pub kind: Sender,
    child: Option<Child>,
    dir: PathBuf,
    /// The upload's deadline.
    deadline: Instant,
}

/// Guest `index`'s tap device, in the client's namespace.
pub fn tap(index: usize) -> String {
    format!("tu{index}")
}

/// The guest's side of the link: its address and its gateway's.
fn subnet(index: usize) -> (String, String) {
    let net = 16 + index;
    (format!("10.77.{net}.2"), format!("10.77.{net}.1"))
}

/// Guest `index`'s address: its flows' source.
pub fn address(index: usize) -> std::net::IpAddr {
    subnet(index).0.parse().expect("a literal address")
}

impl Guest {
    /// Boots guest `index` of kind `kind` in the client's namespace and
    /// starts its upload to `to`.
    pub fn start(
        topo: &Topology,
        kind: Sender,
        index: usize,
        spec: &UploadSpec,
        to: SocketAddr,
    ) -> Result<Self> {
        if !Path::new(UML).exists() {
            return Err(SetupError::BadArgument(format!(
                "--sender {kind}: needs {UML} (Debian's user-mode-linux package): run `cargo xtask setup` or `apt-get install user-mode-linux`"
            ))
            .into());
        }
        let name = format!("{}-{kind}", topo.base);
        let dir = std::env::temp_dir().join(&name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut guest = Self {
            kind,
            child: None,
            dir,
            deadline: Instant::now() + spec.timeout,
        };
        let tap = tap(index);
        let (addr, gateway) = subnet(index);
        ip(&[
            "-n",
            &topo.client_ns,
            "tuntap",
            "add",
            "dev",
            &tap,
            "mode",
            "tap",
        ])?;
        ip(&[
            "-n",
            &topo.client_ns,
            "addr",
            "add",
            &format!("{gateway}/24"),
            "dev",
            &tap,
        ])?;
        ip(&["-n", &topo.client_ns, "link", "set", &tap, "up"])?;
        let ports_from = PORTS_FROM + PORTS_EACH * index as u16;
        let me = std::env::current_exe().context("the tracer's own path")?;
        let mut send = vec![
            me.display().to_string(),
            "lab-send".into(),
            "--to".into(),
            to.to_string(),
            "--flows".into(),
            spec.flows.to_string(),
            "--bytes".into(),
            spec.bytes_per_flow.to_string(),
            "--seconds".into(),
            format!("{:.3}", spec.timeout.as_secs_f64()),
            "--stop-file".into(),
            guest.stop_file().display().to_string(),
            "--sysctl".into(),
            format!(
                "net.ipv4.ip_local_port_range={ports_from} {}",
                ports_from + PORTS_EACH - 1
            ),
        ];
        for (knob, value) in kind.knobs().iter().chain(&spec.sysctls) {
            send.extend(["--sysctl".into(), format!("{knob}={value}")]);
        }
        let quoted: Vec<String> = send.iter().map(|a| format!("'{a}'")).collect();
        let init = guest.dir.join("init");
        std::fs::write(
            &init,
            format!(
                "#!/bin/sh\n\
                 mount -t proc proc /proc\n\
                 mount -t sysfs sys /sys\n\
                 ip link set lo up\n\
                 ip addr add {addr}/24 dev vec0\n\
                 ip link set vec0 up\n\
                 ip route add default via {gateway}\n\
                 ethtool -K vec0 tso off gso off sg off >/dev/null 2>&1\n\
                 {}\n\
                 poweroff -f\n",
                quoted.join(" ")
            ),
        )?;
        std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let console = std::fs::File::create(guest.console())?;
        let mut cmd = Command::new(UML);
        cmd.args([
            "mem=192M",
            "quiet",
            "rootfstype=hostfs",
            "rootflags=/",
            &format!("init={}", init.display()),
            &format!("vec0:transport=tap,ifname={tap},vnet_hdr=0"),
            &format!("umid={name}"),
            &format!("uml_dir={}", guest.dir.display()),
            "con=null",
            "con0=null,fd:1",
        ])
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        // Its own process group, so Ctrl-C at the terminal does not cut
        // its report short: the lab stops it.
        .process_group(0);
        let child = in_netns(&topo.client_ns, || cmd.spawn())?
            .with_context(|| format!("starting {UML}"))?;
        guest.child = Some(child);
        Ok(guest)
    }

    /// Where the guest looks for the word to stop (it sees this host's
    /// files).
    pub fn stop_file(&self) -> PathBuf {
        self.dir.join("stop")
    }

    fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    pub fn stop(&self) {
        let _ = std::fs::write(self.stop_file(), b"");
    }

    /// The guest has powered off (left to reap: `Drop` waits for it).
    pub fn exited(&self) -> bool {
        let Some(child) = &self.child else {
            return true;
        };
        // SAFETY: a zeroed siginfo for waitid to fill; WNOWAIT leaves the
        // child to be reaped.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                child.id(),
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            r != 0 || info.si_pid() != 0
        }
    }

    /// Waits for the guest to power off (killing it past its grace) and
    /// reads its report from the console.
    pub fn join(self) -> Result<GuestReport> {
        let until = self.deadline + GRACE;
        while !self.exited() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let console = self.console();
        let read = || -> Result<GuestReport> {
            let mut r = GuestReport::default();
            let file = std::fs::File::open(&console)?;
            for line in BufReader::new(file).lines() {
                let line = line?;
                let Some(json) = line.split_once(LINE_PREFIX).map(|(_, j)| j) else {
                    continue;
                };
                match serde_json::from_str(json.trim_end())
                    .with_context(|| format!("a guest's line: {json}"))?
                {
                    GuestLine::Release(v) => r.release = v,
                    GuestLine::Sysctls(v) => r.sysctls = v,
                    GuestLine::Flow(s) => r.flows.push(s),
                    GuestLine::Error(e) => r.errors.push(e),
                    GuestLine::Counters(c) => r.counters = c,
                }
            }
            Ok(r)
        };
        let report = read().with_context(|| format!("reading {}", console.display()))?;
        if !self.exited() {
            bail!(
                "the {} sender's guest did not power off in time (its console: {})",
                self.kind,
                console.display()
            );
        }
        if report.counters.is_empty() {
            let text = std::fs::read_to_string(&console).unwrap_or_default();
            if let Some(why) = why_it_died(&text) {
                bail!("the {} sender's guest could not run: {why}", self.kind);
            }
            bail!(
                "the {} sender's guest ended without its report (its console: {})",
                self.kind,
                console.display()
            );
        }
        Ok(report)
    }
}

/// What a user-mode kernel's console says when it cannot run on this host,
/// in one line: Debian's user-mode-linux 6.1 kills its init setting the
/// process's FP registers through ptrace on CPUs whose register state has
/// grown past what it knows (AMX).
fn why_it_died(console: &str) -> Option<String> {
    console.contains("ptrace set fp regs failed").then(|| {
        let amx = std::fs::read_to_string("/proc/cpuinfo")
            .is_ok_and(|c| c.split_whitespace().any(|f| f == "amx_tile"));
        format!(
            "its Linux 6.1 kernel (user-mode-linux) panicked setting its init's FP registers through ptrace (`ptrace set fp regs failed`){}; the host's own senders (host, newreno) run here",
            if amx {
                ", as it does on CPUs with AMX register state, which this one has"
            } else {
                ""
            }
        )
    })
}

/// Whether a user-mode guest can run on this host at all: boots one with
/// an init that only says so and powers off (about 2 s). `Err`: why not,
/// in one line.
pub fn boots() -> Result<(), String> {
    if !Path::new(UML).exists() {
        return Err(format!("{UML} is not installed"));
    }
    let dir = std::env::temp_dir().join(format!("tracer-uml-probe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let result = probe(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn probe(dir: &Path) -> Result<(), String> {
    const SAID: &str = "tracer-uml-probe: up";
    let fail = |e: std::io::Error| e.to_string();
    std::fs::create_dir_all(dir).map_err(fail)?;
    let init = dir.join("init");
    std::fs::write(&init, format!("#!/bin/sh\necho '{SAID}'\npoweroff -f\n")).map_err(fail)?;
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(fail)?;
    let console = dir.join("console.log");
    let out = std::fs::File::create(&console).map_err(fail)?;
    let mut child = Command::new(UML)
        .args([
            "mem=64M",
            "quiet",
            "rootfstype=hostfs",
            "rootflags=/",
            &format!("init={}", init.display()),
            &format!("umid=tracer-uml-probe-{}", std::process::id()),
            &format!("uml_dir={}", dir.display()),
            "con=null",
            "con0=null,fd:1",
        ])
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(fail)?)
        .stderr(out)
        .process_group(0)
        .spawn()
        .map_err(fail)?;
    let until = Instant::now() + Duration::from_secs(30);
    while child.try_wait().map_err(fail)?.is_none() {
        if Instant::now() > until {
            // SAFETY: signals the guest's own process group.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            return Err("a user-mode guest did not boot within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its helper processes share its group: none outlives the probe.
    // SAFETY: signals the guest's own process group.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let text = std::fs::read_to_string(&console).unwrap_or_default();
    if text.contains(SAID) {
        return Ok(());
    }
    Err(why_it_died(&text).unwrap_or_else(|| {
        let last = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        format!("a user-mode guest did not boot (its console's last line: {last})")
    }))
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if !matches!(child.try_wait(), Ok(Some(_))) {
                // SAFETY: a plain signal to the guest's own process group.
                unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            }
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The host sender's addresses and ports stay clear of the guests'.
pub fn host_port_range() -> String {
    format!("32768 {}", PORTS_FROM - 1)
}

/// The routes the guests need outside the client: the edge sends their
/// subnets back through the client.
pub fn route_guests(topo: &Topology) -> Result<()> {
    ip(&[
        "-n",
        &topo.edge_ns,
        "route",
        "add",
        "10.77.16.0/20",
        "via",
        CLIENT_V4,
    ])?;
    Ok(())
}

/// The janitor's shell words for the processes of lab `base`: kill them
/// (every process of a guest carries `umid=NAME` on its command line, the
/// lab's nginx, wrk and curl a file of its directory) and remove their
/// directories.
pub fn leftovers_script(base: &str) -> String {
    let tmp = std::env::temp_dir();
    // ("[t]racer", in the pattern and the glob alike: nothing of this
    // shell's own command line may match the pattern, or pkill would end
    // the shell before it deletes the namespaces.)
    let rest = base.strip_prefix('t').unwrap_or(base);
    format!(
        "pkill -KILL -f '(umid=|{tmp}/)[t]{rest}-' 2>/dev/null; rm -rf {tmp}/[t]{rest}-* 2>/dev/null; ",
        tmp = tmp.display()
    )
}

/// Kills the processes of labs named from `prefix` (of a process that is
/// gone: guests, and the lab's nginx, wrk and curl) and removes their
/// directories.
pub fn kill_leftovers(prefix: &str) {
    let needle = format!("umid={prefix}");
    let file = format!("{}/{prefix}", std::env::temp_dir().display());
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let ours = |arg: &[u8]| {
            arg.starts_with(needle.as_bytes())
                || arg.windows(file.len()).any(|w| w == file.as_bytes())
        };
        if cmdline.split(|&b| b == 0).any(ours) {
            // SAFETY: a plain signal to a leftover lab process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    for entry in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.file_name().to_string_lossy().starts_with(prefix) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// What `tracer lab-send` is told to do.
pub struct SendOrder {
    pub to: SocketAddr,
    pub flows: usize,
    pub bytes: u64,
    pub timeout: Duration,
    pub stop_file: PathBuf,
    /// `knob=value`, dotted.
    pub sysctls: Vec<String>,
}

/// The guest's side (`tracer lab-send`): sets the sysctls and reads them
/// back, uploads until done, told to stop or out of time, and prints what
/// it did, a `tracer-lab-send:` line each.
pub fn send(order: &SendOrder) -> Result<()> {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    };
    let say = |line: &GuestLine| {
        println!(
            "{LINE_PREFIX}{}",
            serde_json::to_string(line).expect("plain data")
        );
    };
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    say(&GuestLine::Release(release.trim().to_string()));
    let mut read_back = BTreeMap::new();
    for kv in &order.sysctls {
        let (knob, value) = kv
            .split_once('=')
            .with_context(|| format!("--sysctl {kv}: give KNOB=VALUE"))?;
        super::write_sysctl(knob, value)?;
        let path = format!("/proc/sys/{}", knob.replace('.', "/"));
        let now = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        read_back.insert(
            knob.to_string(),
            now.split_whitespace().collect::<Vec<_>>().join(" "),
        );
    }
    say(&GuestLine::Sysctls(read_back));
    let deadline = Instant::now() + order.timeout;
    let enough = Arc::new(AtomicBool::new(false));
    {
        let (enough, stop_file) = (enough.clone(), order.stop_file.clone());
        std::thread::spawn(move || {
            while !stop_file.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            enough.store(true, Ordering::SeqCst);
        });
    }
    let results = send_here(order.to, order.flows, order.bytes, deadline, enough);
    for r in results {
        match r {
            Ok(sent) => say(&GuestLine::Flow(sent)),
            Err(e) => say(&GuestLine::Error(format!("{e:#}"))),
        }
    }
    say(&GuestLine::Counters(counters()));
    Ok(())
}

/// This kernel's TCP counters (`/proc/net/snmp`'s Tcp and
/// `/proc/net/netstat`'s TcpExt, as `nstat` names them) that say what a
/// sender's loss detection did.
fn counters() -> BTreeMap<String, u64> {
    const NAMES: &[&str] = &[
        "TcpOutSegs",
        "TcpRetransSegs",
        "TcpExtTCPFastRetrans",
        "TcpExtTCPSlowStartRetrans",
        "TcpExtTCPLostRetransmit",
        "TcpExtTCPSackRecovery",
        "TcpExtTCPRenoRecovery",
        "TcpExtTCPDSACKRecv",
        "TcpExtTCPDSACKOfoRecv",
        "TcpExtTCPFullUndo",
        "TcpExtTCPPartialUndo",
        "TcpExtTCPDSACKUndo",
        "TcpExtTCPLossUndo",
        "TcpExtTCPSpuriousRTOs",
        "TcpExtTCPTimeouts",
        "TcpExtTCPLossProbes",
        "TcpExtTCPSACKReorder",
        "TcpExtTCPTSReorder",
    ];
    super::truth::nstat(NAMES)
}
