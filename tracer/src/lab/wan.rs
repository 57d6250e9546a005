//! The lab's WAN (`--rtt`, `--rate`): a round trip and a bottleneck
//! between the senders and the edge, as the seed's uploads crossed one.
//!
//! * The round trip is a delay line on the way back: every packet from the
//!   server to the senders is held in the edge (iptables NFQUEUE, this
//!   module's thread) until `rtt` after the kernel received it. ACKs are
//!   fewer and smaller than data, and holding them leaves the senders'
//!   own queues (TCP small queues) alone, so one thread keeps up.
//! * The bottleneck is a token bucket (TBF) on the client's link to the
//!   edge at `rate` (Ethernet frames), with a queue of one
//!   bandwidth-delay product; what overflows it is dropped and counted.
//!
//! This host has no netem (nor fq or etf to hold packets by time), so the
//! delay is made in userspace; the thread runs at real-time priority
//! and releases in one batch every packet that is due.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::{
    in_netns, ip,
    nfqueue::{self, NfQueue, Packet},
    Topology, CLIENT_IF, EDGE_SERVER_IF,
};

/// The NFQUEUE queue the delay line uses (the pattern mode's is 0).
const QUEUE: u16 = 1;
/// Held packets at most: 200 ms of ACKs for 2 Gbit/s of data.
const MAX_HELD: u32 = 1 << 16;
/// Ethernet frame bytes the queue holds at least, whatever the product.
const MIN_QUEUE: u64 = 16 * 1514;
/// Socket buffer maxima every host on a WAN path gets (sender, receiver
/// and guests): room for a window of the largest product (10 Gbit/s is
/// not asked; 800 Mbit/s x 200 ms is 20 MB).
pub const BUFFERS: [(&str, &str); 2] = [
    ("net.ipv4.tcp_wmem", "4096 16384 67108864"),
    ("net.ipv4.tcp_rmem", "4096 131072 67108864"),
];

/// The path between the senders and the edge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct WanSpec {
    /// Round trip added on the way back, milliseconds.
    pub rtt_ms: Option<f64>,
    /// Bottleneck rate, Mbit/s of Ethernet frames.
    pub rate_mbit: Option<u32>,
}

impl WanSpec {
    pub fn is_direct(&self) -> bool {
        self.rtt_ms.is_none() && self.rate_mbit.is_none()
    }

    /// The bottleneck's queue: one bandwidth-delay product (the round trip
    /// taken as at least 1 ms), at least 16 frames.
    pub fn queue_bytes(&self) -> Option<u64> {
        let rate = self.rate_mbit?;
        let rtt = self.rtt_ms.unwrap_or(0.0).max(1.0);
        Some(((f64::from(rate) * 1e6 / 8.0 * rtt / 1e3) as u64).max(MIN_QUEUE))
    }
}

impl std::fmt::Display for WanSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.rtt_ms, self.rate_mbit) {
            (None, None) => write!(f, "a direct link"),
            (Some(rtt), None) => write!(f, "{rtt} ms round trip, no bottleneck"),
            (rtt, Some(rate)) => write!(
                f,
                "{} ms round trip, {rate} Mbit/s bottleneck with a {} kB queue",
                rtt.unwrap_or(0.0),
                self.queue_bytes().unwrap_or(0) / 1000
            ),
        }
    }
}

/// What the path did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WanReport {
    #[serde(flatten)]
    pub spec: WanSpec,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_bytes: Option<u64>,
    /// Packets the delay line held.
    pub delayed: u64,
    /// Of those, how many the kernel had not stamped (held from when the
    /// thread got them instead).
    pub unstamped: u64,
    /// How long after its due time each packet went on (its verdict
    /// returned), microseconds: the delay's error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_us: Option<Lateness>,
    /// Packets the delay line lost: its queue full, or not handed to it.
    pub delay_dropped: u64,
    /// The bottleneck's counts (`tc -s qdisc`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bottleneck: Option<Bottleneck>,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Lateness {
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Bottleneck {
    pub sent_bytes: u64,
    pub sent_packets: u64,
    pub dropped: u64,
}

/// The running path; dropping it lets every held packet go.
pub struct Wan {
    spec: WanSpec,
    client_ns: String,
    edge_ns: String,
    stop: Arc<AtomicBool>,
    delay: Option<JoinHandle<Result<DelayLine>>>,
}

impl Wan {
    /// Sets up the bottleneck and the delay line of `spec` in `topo`, and
    /// the hosts' socket buffers for its window.
    pub fn start(topo: &Topology, spec: WanSpec) -> Result<Self> {
        let mut wan = Self {
            spec,
            client_ns: topo.client_ns.clone(),
            edge_ns: topo.edge_ns.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            delay: None,
        };
        if spec.is_direct() {
            return Ok(wan);
        }
        for ns in [&topo.client_ns, &topo.server_ns] {
            in_netns(ns, || -> Result<()> {
                for (knob, value) in BUFFERS {
                    super::write_sysctl(knob, value)?;
                }
                Ok(())
            })??;
        }
        if let (Some(rate), Some(queue)) = (spec.rate_mbit, spec.queue_bytes()) {
            // A bucket of 1 ms of the rate: enough to catch up a late timer,
            // too little to let a burst through unshaped.
            let burst = (u64::from(rate) * 1000 / 8).max(2 * 1514);
            tc(&[
                "-n",
                &topo.client_ns,
                "qdisc",
                "replace",
                "dev",
                CLIENT_IF,
                "root",
                "tbf",
                "rate",
                &format!("{rate}mbit"),
                "burst",
                &burst.to_string(),
                "limit",
                &queue.to_string(),
            ])?;
        }
        if let Some(rtt) = spec.rtt_ms {
            for tool in ["iptables", "ip6tables"] {
                ip(&[
                    "netns",
                    "exec",
                    &topo.edge_ns,
                    tool,
                    "-A",
                    "FORWARD",
                    "-i",
                    EDGE_SERVER_IF,
                    "-p",
                    "tcp",
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    &QUEUE.to_string(),
                ])
                .with_context(|| {
                    format!("{tool} NFQUEUE rule (--rtt needs iptables: `cargo xtask setup`)")
                })?;
            }
            let queue = in_netns(&topo.edge_ns, || -> Result<NfQueue> {
                let mut queue = NfQueue::open(QUEUE, 0, MAX_HELD).context("opening NFQUEUE 1")?;
                queue.stamp_packets().context("turning on receive stamps")?;
                Ok(queue)
            })??;
            // A verdict runs what the packet sets off (the client's TCP
            // taking the ACK, the data it sends, on to the server) in the
            // verdict's caller, unless the client's link hands its packets
            // to other CPUs (RPS): the delay line keeps one CPU, the
            // client's side the others.
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let own_cpu = cpus - 1;
            if cpus > 1 {
                let others = (1u64 << own_cpu) - 1;
                ip(&[
                    "netns",
                    "exec",
                    &topo.client_ns,
                    "sh",
                    "-c",
                    &format!("echo {others:x} > /sys/class/net/{CLIENT_IF}/queues/rx-0/rps_cpus"),
                ])
                .context("steering the client's received packets to other CPUs (RPS)")?;
            }
            let stop = wan.stop.clone();
            let delay_us = (rtt * 1e3).round() as i64;
            wan.delay = Some(std::thread::spawn(move || {
                if cpus > 1 {
                    super::pin_to_cpu(own_cpu);
                }
                DelayLine::new(delay_us).run(queue, &stop)
            }));
        }
        Ok(wan)
    }

    /// Lets every held packet go and says what the path did.
    pub fn finish(mut self) -> Result<WanReport> {
        self.stop.store(true, Ordering::SeqCst);
        let line = match self.delay.take() {
            Some(t) => Some(
                t.join()
                    .map_err(|_| anyhow::anyhow!("the delay line's thread panicked"))??,
            ),
            None => None,
        };
        let mut report = WanReport {
            spec: self.spec,
            queue_bytes: self.spec.queue_bytes(),
            ..Default::default()
        };
        if let Some(line) = line {
            let (full, unhanded) = in_netns(&self.edge_ns, || nfqueue::dropped(QUEUE))??;
            report.delayed = line.delayed;
            report.unstamped = line.unstamped;
            report.late_us = line.lateness();
            report.delay_dropped = full + unhanded;
        }
        if self.spec.rate_mbit.is_some() {
            report.bottleneck = Some(bottleneck(&self.client_ns)?);
        }
        Ok(report)
    }
}

impl Drop for Wan {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.delay.take() {
            let _ = t.join();
        }
    }
}

/// Runs `tc ARGS`, failing with its stderr.
fn tc(args: &[&str]) -> Result<String> {
    let out = std::process::Command::new("tc")
        .args(args)
        .output()
        .context("cannot run `tc`: the lab needs iproute2 (`cargo xtask setup` installs it)")?;
    if !out.status.success() {
        bail!(
            "`tc {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The bottleneck's counters, as `tc -s -j qdisc` shows them.
fn bottleneck(client_ns: &str) -> Result<Bottleneck> {
    let out = tc(&[
        "-n", client_ns, "-s", "-j", "qdisc", "show", "dev", CLIENT_IF,
    ])?;
    let qdiscs: Vec<serde_json::Value> =
        serde_json::from_str(&out).context("reading `tc -s -j qdisc`")?;
    let tbf = qdiscs
        .iter()
        .find(|q| q["kind"] == "tbf")
        .context("the bottleneck (tbf) is gone from the client's link")?;
    let num = |k: &str| tbf[k].as_u64().unwrap_or(0);
    Ok(Bottleneck {
        sent_bytes: num("bytes"),
        sent_packets: num("packets"),
        dropped: num("drops"),
    })
}

/// The thread's state: what it holds and how late it let things go.
struct DelayLine {
    delay_us: i64,
    held: VecDeque<Packet>,
    delayed: u64,
    unstamped: u64,
    /// Lateness counts per microsecond, the last slot "this or more".
    late: Vec<u64>,
}

impl DelayLine {
    fn new(delay_us: i64) -> Self {
        Self {
            delay_us,
            held: VecDeque::new(),
            delayed: 0,
            unstamped: 0,
            late: vec![0; 100_001],
        }
    }

    fn run(mut self, mut queue: NfQueue, stop: &AtomicBool) -> Result<Self> {
        realtime_priority();
        while !stop.load(Ordering::SeqCst) {
            let now = nfqueue::now_us();
            self.release_due(&queue, now)?;
            let wait = self
                .held
                .front()
                .map_or(100_000, |p| self.due(p) - now)
                .clamp(0, 100_000);
            queue.wait(Duration::from_micros(wait as u64))?;
            let got = nfqueue::now_us();
            let before = self.held.len();
            queue.drain(&mut self.held)?;
            for p in self.held.range_mut(before..) {
                self.delayed += 1;
                if p.received_us.is_none() {
                    self.unstamped += 1;
                    p.received_us = Some(got);
                }
            }
        }
        // What came since goes on at once, counted.
        let before = self.held.len();
        queue.drain(&mut self.held)?;
        self.delayed += (self.held.len() - before) as u64;
        if let Some(last) = self.held.back() {
            queue.accept_through(last.id)?;
        }
        Ok(self)
    }

    fn due(&self, p: &Packet) -> i64 {
        p.received_us.unwrap_or(0) + self.delay_us
    }

    /// Lets every packet that is due go in one verdict.
    fn release_due(&mut self, queue: &NfQueue, now: i64) -> Result<()> {
        let n = self.held.iter().take_while(|p| self.due(p) <= now).count();
        if n == 0 {
            return Ok(());
        }
        queue
            .accept_through(self.held[n - 1].id)
            .context("NFQUEUE verdict")?;
        let sent = nfqueue::now_us();
        for p in self.held.drain(..n) {
            let late = (sent - (p.received_us.unwrap_or(0) + self.delay_us)).max(0) as usize;
            let last = self.late.len() - 1;
            self.late[late.min(last)] += 1;
        }
        Ok(())
    }

    fn lateness(&self) -> Option<Lateness> {
        let total: u64 = self.late.iter().sum();
        if total == 0 {
            return None;
        }
        let at = |q: f64| {
            let want = (q * total as f64).ceil() as u64;
            let mut seen = 0;
            self.late
                .iter()
                .position(|&c| {
                    seen += c;
                    seen >= want
                })
                .unwrap_or(0) as u64
        };
        Some(Lateness {
            p50: at(0.5),
            p99: at(0.99),
            max: self.late.iter().rposition(|&c| c > 0).unwrap_or(0) as u64,
        })
    }
}

/// Real-time priority for the calling thread, so the delay line's
/// wake-ups do not wait behind the senders (root has it; without it the
/// thread keeps its priority and its lateness shows in the report).
fn realtime_priority() {
    let param = libc::sched_param { sched_priority: 20 };
    // SAFETY: this thread's own policy, and its timer slack.
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO, &param);
        libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_one_bandwidth_delay_product() {
        let wan = |rtt, rate| WanSpec {
            rtt_ms: rtt,
            rate_mbit: rate,
        };
        // 800 Mbit/s x 80 ms = 8 MB.
        assert_eq!(wan(Some(80.0), Some(800)).queue_bytes(), Some(8_000_000));
        // No round trip asked: 1 ms of the rate, 16 frames at least.
        assert_eq!(wan(None, Some(800)).queue_bytes(), Some(100_000));
        assert_eq!(wan(None, Some(10)).queue_bytes(), Some(16 * 1514));
        assert_eq!(wan(Some(20.0), None).queue_bytes(), None);
    }

    #[test]
    fn lateness_quantiles_come_from_the_counts() {
        let mut line = DelayLine::new(1000);
        assert!(line.lateness().is_none());
        line.late[3] = 98;
        line.late[40] = 1;
        line.late[900] = 1;
        let l = line.lateness().unwrap();
        assert_eq!((l.p50, l.p99, l.max), (3, 40, 900));
    }
}
