//! Loading the eBPF programs, attaching them (always as bpf_links, so even a
//! killed tracer leaves nothing attached), configuring the filter and reading
//! the kernel-side counters.

pub mod btf;
mod counters;
pub mod features;
pub mod netns;
pub mod privilege;
pub mod rings;

use std::{
    ffi::CString,
    fmt,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    os::unix::fs::MetadataExt,
};

use anyhow::{Context, Result};
use aya::{
    maps::{lpm_trie::Key, lpm_trie::LpmTrie, MapData, PerCpuArray},
    programs::{BtfTracePoint, ProgramError, Xdp, XdpMode},
    Ebpf, EbpfLoader,
};
use tracer_common::{counter, CounterBlock, FilterConfig, PortSet, FILTER_ADDRS, FILTER_PORTS};

use crate::{
    filter::{trie_key, Filter},
    SetupError,
};
pub use counters::{Counters, COUNTER_NAMES};
pub use features::{KernelFeatures, KernelReport};
use netns::NetnsGuard;
pub use rings::{RingLayout, Rings};

/// Which XDP attachment to ask for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpModeChoice {
    /// Driver (native) mode, falling back to generic if the driver refuses.
    #[default]
    Auto,
    Native,
    Generic,
}

/// The XDP attachment actually in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachedMode {
    Native,
    Generic,
    /// No XDP program: the TCP tracepoints only.
    Off,
}

impl AttachedMode {
    /// The mode its [`fmt::Display`] names.
    pub fn named(name: &str) -> Option<Self> {
        [Self::Native, Self::Generic, Self::Off]
            .into_iter()
            .find(|m| m.to_string() == name)
    }
}

impl fmt::Display for AttachedMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Native => "native",
            Self::Generic => "generic",
            Self::Off => "off",
        })
    }
}

/// Default ring buffer: 16 MiB, about 110,000 segment events.
pub const DEFAULT_RING_BYTES: u32 = 16 << 20;

/// Full mode's sample while the ring is overloaded: as `--summary 64`,
/// which kept every count of 64 concurrent uploads that full mode lost a
/// third of.
pub const DEFAULT_OVERLOAD_SAMPLE: u32 = 64;

#[derive(Clone, Debug)]
pub struct TracerOptions {
    pub iface: String,
    pub netns: Option<String>,
    pub xdp_mode: XdpModeChoice,
    pub filter: Filter,
    /// Ring buffer bytes, shared among the CPUs' rings: a power of two, at
    /// least one page.
    pub ring_bytes: u32,
    /// A ring per CPU (merged by time), or one for all.
    pub rings: RingLayout,
    /// Attach `tag_rx` (XDP) too; without it only the TCP tracepoints
    /// report, and the interface's receive path stays as it was.
    pub xdp: bool,
    /// Attach `emit_floor` in `tag_rx`'s place: per frame only what full
    /// mode cannot skip (a clock read, a ring record holding nothing
    /// else). The lab bench's floor of full mode; no report reads it.
    pub floor: bool,
    /// Attach the `tcp_probe` programs (the TCP-layer view: the order TCP
    /// processed segments in, PAWS, the replay's ACK path). They run for
    /// every TCP segment the host receives: in the lab bench, the larger
    /// part of the tracer's cost to an upload.
    pub tcp_layer: bool,
    /// Summary mode: 0 off; N: XDP emits only segments that start below or
    /// above their flow's highest byte, changed queue or CPU, and one in N
    /// of the rest (all counted: `xdp_summarized`).
    pub summary_sample: u32,
    /// Full mode under overload: while the ring is more than half full,
    /// the programs act as summary mode with this sample, until it is
    /// below an eighth ([`DEFAULT_OVERLOAD_SAMPLE`]; every switch counted).
    /// 0: never, events are dropped (counted) when the ring is full.
    pub overload_sample: u32,
    /// Frame bytes XDP copies with each segment (for a pcapng trace): 0
    /// none; else the headers, or this many bytes if more (at most
    /// [`tracer_common::CAPTURE_MAX`]).
    pub snaplen: u32,
}

impl TracerOptions {
    pub fn new(iface: &str) -> Self {
        Self {
            iface: iface.to_string(),
            netns: None,
            xdp_mode: XdpModeChoice::Auto,
            filter: Filter::default(),
            ring_bytes: DEFAULT_RING_BYTES,
            rings: RingLayout::default(),
            xdp: true,
            floor: false,
            tcp_layer: true,
            summary_sample: 0,
            overload_sample: DEFAULT_OVERLOAD_SAMPLE,
            snaplen: 0,
        }
    }
}

/// The possible CPUs: the `EVENTS` map's slots.
fn cpus() -> Result<u32> {
    Ok(aya::util::nr_cpus().map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))? as u32)
}

/// The loaded and attached programs. Dropping it detaches everything.
pub struct Tracer {
    /// The running kernel, as the programs were fitted to it.
    pub kernel: &'static KernelFeatures,
    pub iface: String,
    pub netns: Option<String>,
    pub ifindex: u32,
    pub mode: AttachedMode,
    /// What looks for the interface without entering its namespace.
    in_netns: InNetns,
    rings: Rings,
    counters: PerCpuArray<MapData, CounterBlock>,
    /// The first copies of the tracepoint programs, for their kernel-kept
    /// miss counts (these fds keep them loaded, not attached).
    tcp_probe_fd: OwnedFd,
    retransmit_fd: OwnedFd,
    /// The programs and their links; `None` once detached.
    ebpf: Option<Ebpf>,
    /// What earlier attachments of the same run counted (attached again
    /// after the interface came back): added to this one's counters.
    counted_before: Counters,
}

impl Tracer {
    /// Checks the prerequisites, loads the programs, sets the filter and
    /// attaches to `opts.iface` (inside `opts.netns` if given).
    pub fn attach(opts: &TracerOptions) -> Result<Self> {
        privilege::may_attach()?;
        if !opts.ring_bytes.is_power_of_two() || opts.ring_bytes < 4096 {
            return Err(SetupError::BadArgument(format!(
                "ring buffer size {} is not a power of two of at least 4096 bytes",
                opts.ring_bytes
            ))
            .into());
        }
        let kernel = KernelFeatures::running()?;
        let aya_btf = aya::Btf::from_sys_fs().context("parsing kernel BTF for tp_btf")?;

        // Everything that names the interface happens inside its namespace.
        let guard = NetnsGuard::enter_opt(opts.netns.as_deref())?;
        let ifindex = if_index(&opts.iface).ok_or_else(|| SetupError::UnknownInterface {
            name: opts.iface.clone(),
            netns: opts.netns.clone(),
        })?;
        let netns_inum = netns::current_inum().context("reading the network namespace id")?;
        let in_netns = InNetns::make(netns_inum)?;

        let ports = port_set(&opts.filter);
        let cpus = cpus()?;
        // Each ring's: the marks are fractions of the ring a CPU writes.
        let ring_bytes = rings::ring_bytes(opts.ring_bytes, opts.rings, cpus);
        let mut ebpf = EbpfLoader::new()
            .override_global("KERNEL_LAYOUT", &kernel.layout, true)
            .override_global("CAPTURE_SNAPLEN", &opts.snaplen, true)
            .override_global("SUMMARY_SAMPLE", &opts.summary_sample, true)
            .override_global("WAKEUP_BYTES", &(ring_bytes / 8), true)
            .override_global("OVERLOAD_SAMPLE", &opts.overload_sample, true)
            .override_global(
                "OVERLOAD_MARKS",
                &[u64::from(ring_bytes / 2), u64::from(ring_bytes / 8)],
                true,
            )
            .override_global(
                "FILTER",
                &filter_config(&opts.filter, ifindex, netns_inum),
                true,
            )
            .override_global("PORTS", &*ports, true)
            .map_max_entries("EVENTS", cpus)
            .load(crate::EBPF_OBJECT)
            .with_context(|| {
                format!("loading the eBPF object's maps on Linux {}", kernel.release)
            })?;
        fill_prefixes(&mut ebpf, &opts.filter)?;
        let rings = Rings::create(&mut ebpf, opts.ring_bytes, opts.rings)?;

        // Attached in order (the kernel runs a tracepoint's programs in
        // attach order): a later copy takes what the kernel skipped for an
        // earlier one (see tracer-ebpf). The first copy's misses count all.
        let mut first_copies = Vec::new();
        for (tracepoint, base) in [
            ("tcp_probe", "tcp_probe"),
            ("tcp_retransmit_skb", "tcp_rtx"),
        ] {
            for copy in 0..TRACEPOINT_COPIES {
                let name = format!("{base}{copy}");
                let prog: &mut BtfTracePoint = program(&mut ebpf, &name)?
                    .try_into()
                    .with_context(|| format!("program {name} is not tp_btf"))?;
                prog.load(tracepoint, &aya_btf)
                    .map_err(|e| rejected(&name, &format!("tp_btf/{tracepoint}"), e))?;
                // (Without the TCP layer, tcp_probe is loaded, not attached:
                // its counters stay zero.)
                if opts.tcp_layer || tracepoint != "tcp_probe" {
                    prog.attach()
                        .with_context(|| format!("attaching tp_btf/{tracepoint} ({name})"))?;
                }
                if copy == 0 {
                    first_copies.push(prog.fd()?.as_fd().try_clone_to_owned()?);
                }
            }
        }
        let [tcp_probe_fd, retransmit_fd]: [OwnedFd; 2] =
            first_copies.try_into().expect("two tracepoints");

        let mode = if opts.xdp {
            let name = if opts.floor { "emit_floor" } else { "tag_rx" };
            let xdp: &mut Xdp = program(&mut ebpf, name)?
                .try_into()
                .with_context(|| format!("program {name} is not XDP"))?;
            xdp.load().map_err(|e| rejected(name, "XDP", e))?;
            attach_xdp(xdp, ifindex, opts)?
        } else {
            AttachedMode::Off
        };
        drop(guard);

        let counters =
            PerCpuArray::try_from(ebpf.take_map("COUNTERS").context("no COUNTERS map")?)?;
        Ok(Self {
            kernel,
            iface: opts.iface.clone(),
            netns: opts.netns.clone(),
            ifindex,
            mode,
            in_netns,
            rings,
            counters,
            tcp_probe_fd,
            retransmit_fd,
            ebpf: Some(ebpf),
            counted_before: Counters::default(),
        })
    }

    /// Continues the counts of an earlier attachment of the same run:
    /// [`counters`](Self::counters) adds `earlier` from here on.
    pub fn count_on_from(&mut self, earlier: Counters) {
        self.counted_before = earlier;
    }

    /// Whether `iface` exists (inside `netns`, if given): a run waiting
    /// to attach again looks before it loads anything.
    pub fn interface_exists(iface: &str, netns: Option<&str>) -> bool {
        let Ok(_guard) = NetnsGuard::enter_opt(netns) else {
            return false;
        };
        if_index(iface).is_some()
    }

    /// Whether the traced interface is still there: the same name with
    /// the same index, in its namespace, which is still the one of its
    /// name. False once it, or its namespace, is gone (its XDP link then
    /// is detached: nothing more comes). Enters no namespace: a run that
    /// dropped its privileges looks the same way.
    pub fn interface_present(&self) -> bool {
        if let Some(name) = &self.netns {
            let same = std::fs::metadata(netns::path_of(name))
                .is_ok_and(|m| m.ino() as u32 == self.in_netns.inum);
            if !same {
                return false;
            }
        }
        self.in_netns.if_index(&self.iface) == Some(self.ifindex)
    }

    /// Whether the traced interface is up and running: false while it is
    /// down (taken down, or its carrier lost), when its programs stay
    /// attached and simply see nothing. (True when it cannot be asked:
    /// [`Tracer::interface_present`] says whether it went.)
    pub fn interface_up(&self) -> bool {
        self.in_netns.is_up(&self.iface).unwrap_or(true)
    }

    /// The records, in the kernel's time order.
    pub fn rings(&mut self) -> &mut Rings {
        &mut self.rings
    }

    /// Sleeps until the programs wake the collector, a signal arrives, or
    /// `timeout` ([`Rings::wait`]).
    pub fn wait_readable(&mut self, timeout: std::time::Duration) -> Result<()> {
        self.rings.wait(timeout)
    }

    /// Detaches and unloads the programs. The ring buffer and the counters
    /// stay readable: after this nothing more arrives, so a drain gets
    /// everything and the counters are final.
    pub fn detach(&mut self) {
        self.ebpf = None;
        self.rings.finish();
    }

    /// Sums of the per-CPU kernel counters, and the kernel's own count of
    /// tracepoint runs it skipped.
    pub fn counters(&self) -> Result<Counters> {
        // Read while the programs run, the counters are not one instant.
        // The order keeps derived figures from overshooting: misses, then
        // the first-copy runs (from a first read of the blocks), then the
        // events handled (from a second), so `probe_lost` can only lag.
        // After `detach` they are exact.
        let mut c = Counters {
            probe_first_copy_misses: recursion_misses(self.tcp_probe_fd.as_fd())?,
            rtx_first_copy_misses: recursion_misses(self.retransmit_fd.as_fd())?,
            ..Counters::default()
        };
        let first = self.summed_blocks()?;
        c.map = self.summed_blocks()?;
        for runs in [counter::PROBE_FIRST_COPY_RUNS, counter::RTX_FIRST_COPY_RUNS] {
            c.map[runs as usize] = first[runs as usize];
        }
        Ok(c.plus(&self.counted_before))
    }

    /// Every CPU's block of counters, summed.
    fn summed_blocks(&self) -> Result<CounterBlock> {
        let mut sum = CounterBlock::default();
        let blocks = self
            .counters
            .get(&0, 0)
            .context("reading kernel counters")?;
        for block in blocks.iter() {
            for (total, n) in sum.iter_mut().zip(block) {
                *total += n;
            }
        }
        Ok(sum)
    }
}

/// `bpf_prog_info.recursion_misses`: how often the kernel did not run a
/// tracing program because it was already running on that CPU (e.g. a
/// softirq's tcp_probe arriving while a process-context one is in the
/// program).
fn recursion_misses(prog: BorrowedFd<'_>) -> Result<u64> {
    use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_info};
    // SAFETY: both are plain C structs; the kernel writes at most
    // `info_len` bytes into `info`.
    unsafe {
        let mut info: bpf_prog_info = std::mem::zeroed();
        let mut attr: bpf_attr = std::mem::zeroed();
        attr.info.bpf_fd = prog.as_raw_fd() as u32;
        attr.info.info_len = size_of::<bpf_prog_info>() as u32;
        attr.info.info = (&mut info as *mut bpf_prog_info) as u64;
        let ret = libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            &mut attr as *mut bpf_attr,
            size_of::<bpf_attr>(),
        );
        if ret != 0 {
            return Err(std::io::Error::last_os_error()).context("reading BPF program info");
        }
        Ok(info.recursion_misses)
    }
}

/// A program this kernel would not load, as one line: the program, the
/// kernel release and the verifier's reason. The verifier's whole log goes
/// to a file the line names.
pub fn rejected(program: &str, hook: &str, e: ProgramError) -> anyhow::Error {
    let release = KernelFeatures::running().map_or("(unknown release)", |k| k.release.as_str());
    let ProgramError::LoadError {
        io_error,
        verifier_log,
    } = e
    else {
        return anyhow::Error::new(e).context(format!(
            "loading program {program} ({hook}) on Linux {release}"
        ));
    };
    let log = verifier_log.to_string();
    let cause = verifier_cause(&log).unwrap_or_else(|| io_error.to_string());
    let saved = save_verifier_log(program, &log).map_or_else(
        |e| format!(" (its log could not be saved: {e})"),
        |path| format!("; the verifier's log is in {}", path.display()),
    );
    SetupError::Environment(format!(
        "Linux {release} rejected program {program} ({hook}): {cause}{saved}"
    ))
    .into()
}

/// The verifier's reason in its log: the lines after the last instruction
/// it walked, before its statistics, and that instruction's number.
pub fn verifier_cause(log: &str) -> Option<String> {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let statistics = |l: &str| {
        [
            "verification time",
            "stack depth",
            "processed ",
            "max_states_per_insn",
        ]
        .iter()
        .any(|p| l.starts_with(p))
    };
    // "2316: (71) r7 = *(u8 *)(r4 +0)", and its register state lines.
    let instruction = |l: &str| {
        l.split_once(':')
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let end = lines.iter().rposition(|l| !statistics(l))? + 1;
    let last = lines[..end].iter().rposition(|l| instruction(l));
    let start = last.map_or(end - 1, |i| i + 1).min(end - 1);
    let cause = lines[start..end]
        .iter()
        .filter(|l| !l.starts_with(';'))
        .copied()
        .collect::<Vec<_>>()
        .join("; ");
    Some(match last.and_then(|i| lines[i].split_once(':')) {
        Some((n, _)) => format!("{cause} (instruction {n})"),
        None => cause,
    })
}

/// Writes a verifier log to a new file of its own in the temporary
/// directory.
fn save_verifier_log(program: &str, log: &str) -> std::io::Result<std::path::PathBuf> {
    use std::io::Write;
    let path = std::env::temp_dir().join(format!(
        "tracer-verifier-{program}-{}.log",
        std::process::id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    f.write_all(log.as_bytes())?;
    Ok(path)
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .with_context(|| format!("the eBPF object has no program {name}"))
}

pub(crate) fn if_index(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (index != 0).then_some(index)
}

/// A socket made in the traced interface's namespace: interface names
/// asked through it are that namespace's, from any thread, without
/// setns(2) (it keeps the namespace alive while the tracer is).
struct InNetns {
    socket: OwnedFd,
    /// The namespace's inode number (`net->ns.inum`).
    inum: u32,
}

impl InNetns {
    /// In the calling thread's namespace, whose number is `inum`.
    fn make(inum: u32) -> Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned from here on.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .context("making a socket in the namespace");
        }
        Ok(Self {
            // SAFETY: a fresh descriptor nothing else owns.
            socket: unsafe { OwnedFd::from_raw_fd(fd) },
            inum,
        })
    }

    /// `name`'s index in the namespace (SIOCGIFINDEX).
    fn if_index(&self, name: &str) -> Option<u32> {
        let ifr = self.ask(name, libc::SIOCGIFINDEX)?;
        // SAFETY: SIOCGIFINDEX filled the index member.
        let index = unsafe { ifr.ifr_ifru.ifru_ifindex };
        u32::try_from(index).ok().filter(|i| *i > 0)
    }

    /// Whether `name` is up and running (administratively up, with its
    /// carrier: SIOCGIFFLAGS); `None` when it is not there.
    fn is_up(&self, name: &str) -> Option<bool> {
        let ifr = self.ask(name, libc::SIOCGIFFLAGS)?;
        // SAFETY: SIOCGIFFLAGS filled the flags member.
        let flags = i32::from(unsafe { ifr.ifr_ifru.ifru_flags });
        let up = libc::IFF_UP | libc::IFF_RUNNING;
        Some(flags & up == up)
    }

    /// The ioctl `request` about interface `name`, answered.
    fn ask(&self, name: &str, request: libc::Ioctl) -> Option<libc::ifreq> {
        let bytes = name.as_bytes();
        // SAFETY: ifreq is plain data; zeroed is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        if bytes.len() >= ifr.ifr_name.len() {
            return None;
        }
        for (d, b) in ifr.ifr_name.iter_mut().zip(bytes) {
            *d = *b as libc::c_char;
        }
        // SAFETY: a valid ifreq on our own socket.
        (unsafe { libc::ioctl(self.socket.as_raw_fd(), request, &mut ifr) } >= 0).then_some(ifr)
    }
}

/// The XDP program attached to `ifindex` in the current namespace (id,
/// name), as `ip -d link` reports it.
fn attached_xdp(ifindex: u32) -> Option<(u64, String)> {
    let out = std::process::Command::new("ip")
        .args(["-d", "-j", "link", "show"])
        .output()
        .ok()?;
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let link = links
        .as_array()?
        .iter()
        .find(|l| l["ifindex"].as_u64() == Some(u64::from(ifindex)))?;
    let prog = &link["xdp"]["prog"];
    Some((
        prog["id"].as_u64()?,
        prog["name"].as_str().unwrap_or("").to_string(),
    ))
}

fn attach_xdp(xdp: &mut Xdp, ifindex: u32, opts: &TracerOptions) -> Result<AttachedMode> {
    let try_mode = |xdp: &mut Xdp, mode: AttachedMode| -> Result<(), ProgramError> {
        let flags = match mode {
            AttachedMode::Native => XdpMode::Driver,
            AttachedMode::Generic => XdpMode::Skb,
            AttachedMode::Off => return Ok(()),
        };
        xdp.attach_to_if_index(ifindex, flags).map(drop)
    };
    let explain = |mode: AttachedMode, e: ProgramError| -> anyhow::Error {
        let errno = match &e {
            ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
            _ => None,
        };
        let iface = &opts.iface;
        match errno {
            Some(libc::EOPNOTSUPP) => SetupError::BadArgument(format!(
                "{iface} has no {mode} XDP support: use --xdp-mode auto or generic"
            ))
            .into(),
            Some(libc::EBUSY | libc::EEXIST) => SetupError::Environment(format!(
                "{} is attached to {iface} (see `ip -d link show {iface}`); the tracer does not replace it",
                attached_xdp(ifindex).map_or("another XDP program".to_string(), |(id, name)| {
                    if name == "tag_rx" {
                        format!("another tracer (XDP program {name}, id {id})")
                    } else {
                        format!("another XDP program ({name}, id {id})")
                    }
                })
            ))
            .into(),
            _ => anyhow::Error::new(e).context(format!("attaching XDP ({mode}) to {iface}")),
        }
    };
    match opts.xdp_mode {
        XdpModeChoice::Native => try_mode(xdp, AttachedMode::Native)
            .map(|()| AttachedMode::Native)
            .map_err(|e| explain(AttachedMode::Native, e)),
        XdpModeChoice::Generic => try_mode(xdp, AttachedMode::Generic)
            .map(|()| AttachedMode::Generic)
            .map_err(|e| explain(AttachedMode::Generic, e)),
        XdpModeChoice::Auto => match try_mode(xdp, AttachedMode::Native) {
            Ok(()) => Ok(AttachedMode::Native),
            Err(native) => {
                log::info!(
                    "native XDP refused on {} ({native}); using generic",
                    opts.iface
                );
                try_mode(xdp, AttachedMode::Generic)
                    .map(|()| AttachedMode::Generic)
                    .map_err(|e| explain(AttachedMode::Generic, e))
            }
        },
    }
}

/// The filter's switches and the tracepoint programs' scope.
fn filter_config(filter: &Filter, ifindex: u32, netns_inum: u32) -> FilterConfig {
    let mut flags = 0;
    if !filter.ports.is_empty() {
        flags |= FILTER_PORTS;
    }
    if !filter.prefixes.is_empty() {
        flags |= FILTER_ADDRS;
    }
    FilterConfig {
        flags,
        ifindex,
        netns_inum,
        _pad: 0,
    }
}

/// The port filter's ports, one byte each.
fn port_set(filter: &Filter) -> Box<PortSet> {
    let mut set = Box::new([0; 65_536]);
    for &port in &filter.ports {
        set[usize::from(port)] = 1;
    }
    set
}

/// The filter's prefixes into the trie the programs look them up in.
fn fill_prefixes(ebpf: &mut Ebpf, filter: &Filter) -> Result<()> {
    if !filter.prefixes.is_empty() {
        let mut addrs: LpmTrie<_, [u8; 16], u8> =
            LpmTrie::try_from(ebpf.map_mut("ADDRS").context("no ADDRS map")?)?;
        for &(addr, len) in &filter.prefixes {
            let (key, bits) = trie_key(addr, len);
            addrs
                .insert(&Key::new(bits, key), 1, 0)
                .context("setting the address filter")?;
        }
    }
    Ok(())
}

/// Program names of ours, as the kernel stores them (15 characters at most).
pub const PROGRAM_NAMES: [&str; 8] = [
    "tag_rx",
    "emit_floor",
    "tcp_probe0",
    "tcp_probe1",
    "tcp_probe2",
    "tcp_rtx0",
    "tcp_rtx1",
    "tcp_rtx2",
];

/// Copies of each tracepoint program (see tracer-ebpf's `LAST_COPY`).
const TRACEPOINT_COPIES: usize = 3;

/// IDs and names of programs with our names loaded in the kernel right now
/// (ours, or another tracer's).
pub fn loaded_tracer_programs() -> Vec<(u32, String)> {
    loaded_programs(&PROGRAM_NAMES)
}

/// Loaded programs (id, name) whose name is one of `names`.
pub fn loaded_programs(names: &[&str]) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    // An entry can fail when its program is freed between listing its id
    // and opening it (programs come and go); such a program is gone anyway.
    for info in aya::programs::loaded_programs().filter_map(Result::ok) {
        if let Some(name) = info.name_as_str() {
            if names.contains(&name) {
                found.push((info.id(), name.to_string()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::verifier_cause;

    /// Logs as Linux 6.1's verifier ended them (shortened before the end).
    #[test]
    fn the_verifier_s_reason_is_its_last_words_before_the_statistics() {
        let log = "0: R1=ctx(off=0,imm=0) R10=fp0
; pub fn tcp_rtx0(ctx: BtfTracePointContext) -> i32 {
0: (bf) r7 = r1                       ; R1=ctx(off=0,imm=0) R7_w=ctx(off=0,imm=0)
; btf_arg(self, n)
28: (79) r8 = *(u64 *)(r7 +16)
func 'tcp_retransmit_skb' doesn't have 3-th argument
invalid bpf_context access off=16 size=8
verification time 3603 usec
stack depth 72
processed 27 insns (limit 1000000) max_states_per_insn 0 total_states 1 peak_states 1 mark_read 1
";
        assert_eq!(
            verifier_cause(log).unwrap(),
            "func 'tcp_retransmit_skb' doesn't have 3-th argument; invalid bpf_context access off=16 size=8 (instruction 28)"
        );
        let log = "2315: (0f) r4 += r2                   ; R2_w=scalar(umin=16,umax=11,var_off=(0x10; 0x7)) R4_w=scalar()
2316: (71) r7 = *(u8 *)(r4 +0)
R4 invalid mem access 'scalar'
verification time 432780 usec
stack depth 224+0
processed 9941 insns (limit 1000000) max_states_per_insn 10 total_states 76 peak_states 67 mark_read 10
";
        assert_eq!(
            verifier_cause(log).unwrap(),
            "R4 invalid mem access 'scalar' (instruction 2316)"
        );
        assert_eq!(verifier_cause(""), None);
    }
}
