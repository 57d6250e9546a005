//! The lab's edge: an emulated flow-director NIC (programs in
//! `tracer-ebpf/src/lab_edge.rs`), in one of three modes.
//!
//! * `atr`: every packet is redirected to the CPU serving its flow's queue
//!   (CPUMAP, as a NIC's queue interrupt lands on one core) and leaves on
//!   that queue; a thread re-points every flow to the next queue, served by
//!   another CPU, `rate` times a second. Segments still queued for the old
//!   CPU then race the new ones: the ATR signature.
//! * `pattern`: exact reordering by a userspace thread ([`super::pattern`]);
//!   queue and CPU never change.
//! * `off`: plain forwarding; each flow keeps its RSS queue.
//!
//! A new flow starts on the queue RSS picks, as on a NIC: the Toeplitz hash
//! of its addresses and ports under [`rss`]'s key, through its indirection
//! table; the lab hands the tracer the same key and table.
//!
//! In every mode the egress program reports each data segment leaving
//! towards the server, which is the ground truth ([`Truth`]).

use std::{
    fs::File,
    io::{BufWriter, Write},
    os::fd::AsRawFd,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use aya::{
    maps::{Array, CpuMap, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        tc::{self, NlOptions, TcAttachOptions, TcAttachType},
        LinkOrder, SchedClassifier, Xdp, XdpMode,
    },
    Ebpf,
};
use serde::Serialize;
use tracer_common::{
    edge::{self, counter, EdgeConfig, EdgeEvent},
    rss,
};

use super::{
    pattern::{Pattern, PatternTruth, Reorderer},
    truth::{TableChange, Truth, TruthRecord},
    Topology, EDGE_CLIENT_IF, EDGE_SERVER_IF,
};
use crate::{
    kernel::{self, netns::NetnsGuard, KernelFeatures},
    nic::rss::Rss,
    SetupError,
};

/// How the edge treats the upload.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Mode {
    /// Flow-director emulation: `rate` re-points per second per flow,
    /// `qsize` packets of room per CPU (how much can wait on the old path).
    Atr {
        rate: f64,
        qsize: u32,
    },
    Pattern {
        pattern: Pattern,
    },
    Off,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Atr { rate, qsize } => write!(
                f,
                "atr: each flow re-pointed to another queue and CPU {rate} times a second, {qsize} packets of CPU queue"
            ),
            Mode::Pattern { pattern } => write!(f, "pattern {pattern}: one queue, one CPU"),
            Mode::Off => write!(f, "off: plain forwarding, each flow on its RSS queue"),
        }
    }
}

/// What the edge did, for the report.
#[derive(Clone, Debug, Serialize)]
pub struct EdgeReport {
    pub mode: Mode,
    /// Queue -> CPU, as the edge served them.
    pub queue_cpus: Vec<u32>,
    #[serde(flatten)]
    pub truth: Truth,
    pub pattern: Option<PatternTruth>,
    /// The edge programs' counters (ground-truth events lost, unmatched).
    pub counters: std::collections::BTreeMap<&'static str, u64>,
}

/// The edge's RSS, as a NIC would report it: Microsoft's verification key
/// and a table of 128 entries spread over the queues in turn (Linux's
/// default, `ethtool_rxfh_indir_default`).
pub fn rss(queues: u32) -> Rss {
    Rss {
        key: rss::VERIFICATION_KEY.to_vec(),
        indir: (0..edge::INDIR_ENTRIES)
            .map(|i| i % queues.max(1))
            .collect(),
    }
}

/// A stopping point for the upload: the edge has made at least `late`
/// late segments in each of `flows` flows.
#[derive(Clone, Copy, Debug)]
pub struct Until {
    pub late: u64,
    pub flows: usize,
}

pub struct Edge {
    mode: Mode,
    queue_cpus: Vec<u32>,
    /// The programs and their links (dropping detaches).
    ebpf: Option<Ebpf>,
    counters: PerCpuArray<MapData, u64>,
    off_rss: HashMap<MapData, u32, u64>,
    stop: Arc<AtomicBool>,
    /// ATR mode: whether the table re-points flows (on until
    /// [`Edge::set_steering`] says otherwise).
    repointing: Arc<AtomicBool>,
    /// Late segments made so far ([`Truth::late`]), as the truth is read.
    late: Arc<AtomicU64>,
    thread: Option<JoinHandle<Truth>>,
    reorderer: Option<Reorderer>,
}

const COUNTER_NAMES: [(&str, u32); counter::COUNT as usize] = [
    ("frames", counter::FRAMES),
    ("tcp", counter::TCP),
    ("redirect_failed", counter::REDIRECT_FAILED),
    ("flows_learned", counter::FLOWS_LEARNED),
    ("egress_data", counter::EGRESS_DATA),
    ("egress_unmatched", counter::EGRESS_UNMATCHED),
    ("truth_emitted", counter::TRUTH_EMITTED),
    ("truth_dropped", counter::TRUTH_DROPPED),
];

impl Edge {
    /// Loads the edge programs into `topo`'s edge namespace and starts the
    /// mode's work; `truth_out` gets every segment leaving the edge. With
    /// `until`, `enough` is set once the edge has made that many late
    /// segments.
    pub fn start(
        topo: &Topology,
        mode: Mode,
        truth_out: Option<&Path>,
        until: Option<(Until, Arc<AtomicBool>)>,
    ) -> Result<Self> {
        let out = TruthFile::create(truth_out)?;
        let cpus = online_cpus()?;
        let queue_cpus: Vec<u32> = (0..topo.queues)
            .map(|q| cpus[q as usize % cpus.len()])
            .collect();
        let kernel = KernelFeatures::running()?;
        let mut ebpf = Ebpf::load(crate::LAB_EDGE_OBJECT)
            .with_context(|| format!("loading the lab's edge maps on Linux {}", kernel.release))?;
        let steer = matches!(mode, Mode::Atr { .. });
        Array::<_, EdgeConfig>::try_from(ebpf.map_mut("CONFIG").context("no CONFIG map")?)?.set(
            0,
            EdgeConfig {
                mode: if steer {
                    edge::MODE_STEER
                } else {
                    edge::MODE_PASS
                },
                queues: topo.queues,
                rss_key: rss::VERIFICATION_KEY,
                indir_len: edge::INDIR_ENTRIES,
            },
            0,
        )?;
        let mut indir = Array::<_, u32>::try_from(ebpf.map_mut("INDIR").context("no INDIR map")?)?;
        for (i, q) in rss(topo.queues).indir.iter().enumerate() {
            indir.set(i as u32, q, 0)?;
        }
        let mut queue_cpu =
            Array::<_, u32>::try_from(ebpf.map_mut("QUEUE_CPU").context("no QUEUE_CPU map")?)?;
        for (q, cpu) in queue_cpus.iter().enumerate() {
            queue_cpu.set(q as u32, cpu, 0)?;
        }
        if let Mode::Atr { qsize, .. } = mode {
            let mut cpumap = CpuMap::try_from(ebpf.map_mut("CPUS").context("no CPUS map")?)?;
            for &cpu in &cpus {
                cpumap
                    .set(cpu, qsize, None, 0)
                    .with_context(|| format!("CPU map entry for CPU {cpu}"))?;
            }
        }
        {
            let _in_edge = NetnsGuard::enter(&topo.edge_ns)?;
            let xdp: &mut Xdp = ebpf
                .program_mut("edge_steer")
                .context("no edge_steer program")?
                .try_into()?;
            xdp.load()
                .map_err(|e| kernel::rejected("edge_steer", "XDP", e))?;
            xdp.attach(EDGE_CLIENT_IF, XdpMode::Driver)
                .with_context(|| format!("attaching edge_steer to {EDGE_CLIENT_IF}"))?;
            let tc: &mut SchedClassifier = ebpf
                .program_mut("edge_egress")
                .context("no edge_egress program")?
                .try_into()?;
            tc.load()
                .map_err(|e| kernel::rejected("edge_egress", "tc", e))?;
        }
        attach_egress(&mut ebpf, topo)?;
        let ring = RingBuf::try_from(ebpf.take_map("TRUTH").context("no TRUTH map")?)?;
        let flows = HashMap::try_from(ebpf.take_map("FLOWS").context("no FLOWS map")?)?;
        let counters = PerCpuArray::try_from(
            ebpf.take_map("EDGE_COUNTERS")
                .context("no EDGE_COUNTERS map")?,
        )?;
        let off_rss = HashMap::try_from(ebpf.take_map("OFF_RSS").context("no OFF_RSS map")?)?;
        let reorderer = match mode {
            Mode::Pattern { pattern } => Some(Reorderer::start(&topo.edge_ns, pattern)?),
            _ => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let repointing = Arc::new(AtomicBool::new(true));
        let late = Arc::new(AtomicU64::new(0));
        let thread = {
            let stop = stop.clone();
            let lateness = Lateness {
                so_far: late.clone(),
                until,
            };
            let repoints = Repoints {
                period: match mode {
                    Mode::Atr { rate, .. } => Some(Duration::from_secs_f64(1.0 / rate)),
                    _ => None,
                },
                on: repointing.clone(),
            };
            let queues = topo.queues;
            std::thread::Builder::new()
                .name("lab-edge".into())
                .spawn(move || edge_loop(ring, flows, repoints, queues, out, lateness, &stop))?
        };
        Ok(Self {
            mode,
            queue_cpus,
            ebpf: Some(ebpf),
            counters,
            off_rss,
            stop,
            repointing,
            late,
            thread: Some(thread),
            reorderer,
        })
    }

    /// ATR mode: the table re-points flows (on) or leaves each where it
    /// is (off, as a NIC whose ATR was switched off), while the upload
    /// goes on: once what was queued has left, nothing more is reordered.
    pub fn set_steering(&self, on: bool) {
        self.repointing.store(on, Ordering::SeqCst);
    }

    /// The late segments the edge has made so far, in every flow.
    pub fn late_so_far(&self) -> u64 {
        self.late.load(Ordering::SeqCst)
    }

    /// After the edge's link to the server was made again
    /// ([`Topology::relink_server`]): its egress program on the new link,
    /// so that flows follow the table's queues again.
    pub fn reattach_egress(&mut self, topo: &Topology) -> Result<()> {
        attach_egress(self.ebpf.as_mut().context("the edge is finished")?, topo)
    }

    /// Stops the edge's work and detaches its programs; what it did.
    pub fn finish(mut self) -> Result<EdgeReport> {
        let pattern = self.reorderer.take().map(Reorderer::finish).transpose()?;
        // Nothing more leaves the edge once the programs are gone; the
        // thread's last drain then has every event.
        self.ebpf = None;
        self.stop.store(true, Ordering::SeqCst);
        let mut truth = self
            .thread
            .take()
            .expect("finished once")
            .join()
            .map_err(|_| anyhow::anyhow!("lab edge thread panicked"))?;
        let mut counters = std::collections::BTreeMap::new();
        for (name, index) in COUNTER_NAMES {
            let v: u64 = self.counters.get(&index, 0)?.iter().sum();
            counters.insert(name, v);
        }
        for entry in self.off_rss.iter() {
            let (key, off) = entry?;
            let port = (key >> 16) as u16;
            if let Some(f) = truth.flows.iter_mut().find(|f| f.client_port == port) {
                f.off_rss = off;
            }
        }
        Ok(EdgeReport {
            mode: self.mode,
            queue_cpus: self.queue_cpus.clone(),
            truth,
            pattern,
            counters,
        })
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Edge events read between two looks at the re-point schedule.
const TRUTH_BATCH: usize = 4096;

/// Drains the ground truth and, in ATR mode, re-points the table.
/// Attaches the loaded `edge_egress` to the edge's link to the server
/// (inside the edge's namespace). Before tcx (Linux 6.6), through a
/// clsact qdisc and a netlink filter, which go with the link.
fn attach_egress(ebpf: &mut Ebpf, topo: &Topology) -> Result<()> {
    let kernel = KernelFeatures::running()?;
    let _in_edge = NetnsGuard::enter(&topo.edge_ns)?;
    let tc: &mut SchedClassifier = ebpf
        .program_mut("edge_egress")
        .context("no edge_egress program")?
        .try_into()?;
    let how = if kernel.tcx {
        TcAttachOptions::TcxOrder(LinkOrder::default())
    } else {
        tc::qdisc_add_clsact(EDGE_SERVER_IF)
            .with_context(|| format!("adding a clsact qdisc to {EDGE_SERVER_IF}"))?;
        TcAttachOptions::Netlink(NlOptions::default())
    };
    tc.attach_with_options(EDGE_SERVER_IF, TcAttachType::Egress, how)
        .with_context(|| format!("attaching edge_egress to {EDGE_SERVER_IF} egress"))?;
    Ok(())
}

/// ATR mode's table: how often it re-points each flow, and whether it
/// does now.
struct Repoints {
    period: Option<Duration>,
    on: Arc<AtomicBool>,
}

/// What the edge's loop tells of the late segments it made: how many so
/// far, and (with an [`Until`]) when there are enough.
struct Lateness {
    so_far: Arc<AtomicU64>,
    until: Option<(Until, Arc<AtomicBool>)>,
}

fn edge_loop(
    mut ring: RingBuf<MapData>,
    mut flows: HashMap<MapData, u32, u32>,
    repoints: Repoints,
    queues: u32,
    mut out: TruthFile,
    lateness: Lateness,
    stop: &AtomicBool,
) -> Truth {
    let repoint = repoints.period;
    let mut truth = Truth::default();
    let mut next = repoint.map(|p| Instant::now() + p);
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        // At most a batch between looks at the clock: a fast upload fills
        // the ring as fast as this thread reads it, and draining it to the
        // end had held the re-points back for a whole run (two flows at
        // 1.8 Gbit/s, 20 re-points a second asked, 0 and 101 late
        // segments in 60 s).
        let mut drained = true;
        for _ in 0..TRUTH_BATCH {
            let Some(item) = ring.next() else {
                drained = true;
                break;
            };
            drained = false;
            if item.len() >= size_of::<EdgeEvent>() {
                // SAFETY: the record is an EdgeEvent written by edge_egress;
                // read unaligned.
                let ev = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<EdgeEvent>()) };
                truth.observe(&ev);
                out.write(&TruthRecord::segment(&ev));
            }
        }
        if stopping && !drained {
            continue;
        }
        lateness.so_far.store(truth.late(), Ordering::SeqCst);
        if let Some((until, enough)) = &lateness.until {
            if truth.fewest_late(until.flows) >= until.late {
                enough.store(true, Ordering::SeqCst);
            }
        }
        if stopping {
            truth.file_error = out.finish();
            return truth;
        }
        if let (Some(at), Some(period)) = (next, repoint) {
            if Instant::now() >= at {
                // (Switched off: the clock goes on, the table stays.)
                if repoints.on.load(Ordering::SeqCst) {
                    let ts_ns = crate::kernel::rings::monotonic_ns();
                    let entries: Vec<(u32, u32)> = flows.iter().filter_map(|e| e.ok()).collect();
                    for (key, queue) in entries {
                        let to = (queue + 1) % queues.max(1);
                        if flows.insert(key, to, 0).is_ok() {
                            let change = TableChange {
                                ts_ns,
                                client_port: (key >> 16) as u16,
                                from_queue: queue,
                                to_queue: to,
                            };
                            out.write(&TruthRecord::TableChange(&change));
                            truth.table_changes.push(change);
                        }
                    }
                }
                next = Some(at + period);
            }
        }
        if !drained {
            continue;
        }
        let wait = next.map_or(Duration::from_millis(20), |at| {
            at.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(20))
        });
        let mut pfd = libc::pollfd {
            fd: ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: wait.as_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd and timespec for the call.
        unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    }
}

/// The optional ground-truth JSON-lines file. A write error stops the
/// writing (the run goes on) and is reported at the end.
struct TruthFile {
    out: Option<BufWriter<File>>,
    error: Option<String>,
}

impl TruthFile {
    fn create(path: Option<&Path>) -> Result<Self, SetupError> {
        let out = path
            .map(|p| {
                let file = crate::output::OutputFile::open(p)?;
                file.start()
                    .map(BufWriter::new)
                    .map_err(|e| SetupError::BadOutput {
                        path: p.display().to_string(),
                        reason: e.to_string(),
                    })
            })
            .transpose()?;
        Ok(Self { out, error: None })
    }

    fn write(&mut self, record: &TruthRecord<'_>) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        let res = serde_json::to_writer(&mut *out, record)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
        if let Err(e) = res {
            self.error = Some(e.to_string());
            self.out = None;
        }
    }

    fn finish(mut self) -> Option<String> {
        if let Some(mut out) = self.out.take() {
            if let Err(e) = out.flush() {
                self.error = Some(e.to_string());
            }
        }
        self.error
    }
}

/// The online CPUs, from /sys/devices/system/cpu/online ("0-3,6").
pub fn online_cpus() -> Result<Vec<u32>, SetupError> {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .map_err(|e| SetupError::Environment(format!("reading the online CPUs: {e}")))?;
    let mut cpus = Vec::new();
    for part in list.trim().split(',') {
        let range = match part.split_once('-') {
            Some((a, b)) => a.parse::<u32>().ok().zip(b.parse::<u32>().ok()),
            None => part.parse::<u32>().ok().map(|a| (a, a)),
        };
        let (a, b) = range.ok_or_else(|| {
            SetupError::Environment(format!("cannot read the online CPU list `{}`", list.trim()))
        })?;
        cpus.extend(a..=b);
    }
    Ok(cpus)
}
