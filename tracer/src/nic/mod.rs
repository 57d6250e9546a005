//! What the NIC itself says, a source of evidence beside the packets: its
//! driver, private flags (`flow-director-atr`), ntuple filters, channels,
//! RSS (which queue each flow should arrive on), the kernel's RPS/XPS and
//! IRQ affinity, and the driver's statistics, Flow Director's among them.
//! Read through the kernel ([`ethtool`], sysfs, procfs), never by parsing
//! `ethtool`'s text; a call the driver does not answer is noted, not an
//! error.

pub mod ethtool;
pub mod fix;
pub mod rss;
pub mod veth;

use std::{collections::BTreeMap, fs, path::Path};

use serde::Serialize;

use self::{ethtool::Channels, rss::Rss};
use crate::kernel::netns::NetnsGuard;

/// The NIC at one moment.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NicReport {
    pub iface: String,
    pub driver: Option<String>,
    pub version: Option<String>,
    pub firmware: Option<String>,
    pub bus: Option<String>,
    /// `ethtool --show-priv-flags`.
    pub private_flags: BTreeMap<String, bool>,
    /// ntuple filters (Flow Director's sideband rules, aRFS) on.
    pub ntuple: Option<bool>,
    /// Receive hashing (RSS) on.
    pub rxhash: Option<bool>,
    pub channels: Option<Channels>,
    /// `toeplitz`, `xor`, `crc32`.
    pub rss_function: Option<String>,
    pub rss: Option<Rss>,
    /// Per RX queue: RPS's CPU mask (hex, as sysfs has it) and flow count.
    pub rps: BTreeMap<u32, Rps>,
    /// `net.core.rps_sock_flow_entries` (RFS on when above 0).
    pub rps_sock_flow_entries: Option<u64>,
    /// Per TX queue: XPS's CPU mask.
    pub xps_cpus: BTreeMap<u32, String>,
    /// The device's interrupts: number, name, CPUs it may run on.
    pub irqs: Vec<Irq>,
    /// `ethtool -S`, every statistic by the driver's name.
    pub statistics: BTreeMap<String, u64>,
    /// What the driver or the system did not answer, once each.
    pub unanswered: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Rps {
    pub cpus: String,
    pub flow_cnt: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Irq {
    pub irq: u32,
    pub name: String,
    pub cpus: String,
}

/// A NIC read when the run begins and again whenever asked (every second
/// while live): what it said, and its statistics' change since.
pub struct NicWatch {
    iface: String,
    /// An ethtool socket made in the interface's namespace at the start:
    /// later reads switch no namespace (nor need the privilege to).
    ethtool: Result<ethtool::Ethtool, String>,
    start: NicReport,
    latest: Option<NicEvidence>,
}

impl NicWatch {
    pub fn start(iface: &str, netns: Option<&str>) -> NicWatch {
        let ethtool = match NetnsGuard::enter_opt(netns) {
            Ok(_inside) => ethtool::Ethtool::open().map_err(|e| format!("ethtool: {e}")),
            Err(e) => Err(format!("the NIC: {e}")),
        };
        NicWatch {
            iface: iface.to_string(),
            start: read_with(ethtool.as_ref(), iface),
            ethtool,
            latest: None,
        }
    }

    /// What the NIC said when the run began.
    pub fn first(&self) -> &NicReport {
        &self.start
    }

    /// Reads the NIC now.
    pub fn read(&mut self) -> &NicEvidence {
        let now = read_with(self.ethtool.as_ref(), &self.iface);
        self.latest
            .insert(NicEvidence::new(self.start.clone(), now))
    }

    /// The latest reading, against the first.
    pub fn evidence(&self) -> Option<&NicEvidence> {
        self.latest.as_ref()
    }
}

/// Reads everything the NIC and the kernel say about `iface`, from the
/// network namespace the calling thread is in (sysfs: as this process's
/// mount shows it).
pub fn read(iface: &str) -> NicReport {
    let et = ethtool::Ethtool::open().map_err(|e| format!("ethtool: {e}"));
    read_with(et.as_ref(), iface)
}

/// [`read`] through `et`, an ethtool socket of `iface`'s namespace (or
/// why there is none).
fn read_with(et: Result<&ethtool::Ethtool, &String>, iface: &str) -> NicReport {
    let mut r = NicReport {
        iface: iface.to_string(),
        ..NicReport::default()
    };
    let mut missing = Vec::new();
    match et {
        Err(e) => missing.push(e.clone()),
        Ok(et) => {
            match et.driver(iface) {
                Ok(d) => {
                    r.driver = Some(d.driver);
                    r.version = Some(d.version);
                    r.firmware = Some(d.firmware).filter(|f| !f.is_empty());
                    r.bus = Some(d.bus).filter(|b| !b.is_empty());
                }
                Err(e) => unanswered(&mut missing, "driver (ETHTOOL_GDRVINFO)", e),
            }
            match et.private_flags(iface) {
                Ok(flags) => r.private_flags = flags.into_iter().collect(),
                Err(e) => unanswered(&mut missing, "private flags (ETHTOOL_GPFLAGS)", e),
            }
            match et.ntuple_and_rxhash(iface) {
                Ok((ntuple, rxhash)) => (r.ntuple, r.rxhash) = (Some(ntuple), Some(rxhash)),
                Err(e) => unanswered(&mut missing, "features (ETHTOOL_GFLAGS)", e),
            }
            match et.channels(iface) {
                Ok(c) => r.channels = Some(c),
                Err(e) => unanswered(&mut missing, "channels (ETHTOOL_GCHANNELS)", e),
            }
            match et.rx_flow_hash(iface) {
                Ok(h) => {
                    r.rss = Rss::new(h.key, h.indir).ok();
                    r.rss_function = Some(h.function);
                }
                Err(e) => unanswered(&mut missing, "RSS key and table (ETHTOOL_GRSSH)", e),
            }
            match et.statistics(iface) {
                Ok(s) => r.statistics = s.into_iter().collect(),
                Err(e) => unanswered(&mut missing, "statistics (ETHTOOL_GSTATS)", e),
            }
        }
    }
    let dev = Path::new("/sys/class/net").join(iface);
    if dev.exists() {
        read_queues(&dev, &mut r);
        r.irqs = irqs(&dev, iface);
    } else {
        missing.push(format!(
            "RPS, XPS and IRQs: /sys/class/net/{iface} is not in this process's sysfs (another network namespace)"
        ));
    }
    r.rps_sock_flow_entries = fs::read_to_string("/proc/sys/net/core/rps_sock_flow_entries")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    r.unanswered = missing;
    r
}

fn unanswered(list: &mut Vec<String>, what: &str, e: std::io::Error) {
    let why = match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => "the driver does not support it".to_string(),
        Some(libc::ENODEV) => "no such interface".to_string(),
        _ => e.to_string(),
    };
    list.push(format!("{what}: {why}"));
}

fn read_queues(dev: &Path, r: &mut NicReport) {
    let Ok(entries) = fs::read_dir(dev.join("queues")) else {
        return;
    };
    let read = |p: &Path| fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(q) = name.strip_prefix("rx-").and_then(|q| q.parse().ok()) {
            let cpus = read(&e.path().join("rps_cpus")).unwrap_or_default();
            let flow_cnt = read(&e.path().join("rps_flow_cnt"))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            r.rps.insert(q, Rps { cpus, flow_cnt });
        } else if let Some(q) = name.strip_prefix("tx-").and_then(|q| q.parse().ok()) {
            if let Some(cpus) = read(&e.path().join("xps_cpus")) {
                r.xps_cpus.insert(q, cpus);
            }
        }
    }
}

/// The device's MSI interrupts (its own or its PCI parent's, as virtio
/// has them) and any interrupt named after the interface.
fn irqs(dev: &Path, iface: &str) -> Vec<Irq> {
    let mut numbers: Vec<u32> = Vec::new();
    for d in [dev.join("device/msi_irqs"), dev.join("device/../msi_irqs")] {
        if let Ok(entries) = fs::read_dir(d) {
            numbers.extend(
                entries
                    .flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()),
            );
        }
    }
    let names: BTreeMap<u32, String> = fs::read_to_string("/proc/interrupts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (n, rest) = l.trim_start().split_once(':')?;
            let irq = n.parse().ok()?;
            Some((irq, rest.split_whitespace().last()?.to_string()))
        })
        .collect();
    numbers.extend(
        names
            .iter()
            .filter(|(_, name)| name.contains(iface))
            .map(|(&n, _)| n),
    );
    numbers.sort_unstable();
    numbers.dedup();
    numbers
        .into_iter()
        .map(|irq| Irq {
            irq,
            name: names.get(&irq).cloned().unwrap_or_default(),
            cpus: fs::read_to_string(format!("/proc/irq/{irq}/smp_affinity_list"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
        })
        .collect()
}

/// What a driver's statistic says about steering, by the name it has in
/// `ethtool -S` (documented per driver): Flow Director's ATR and sideband
/// (ntuple) matches, misses, flushes, and each RX queue's packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Steering {
    /// i40e `port.fdir_atr_match`: packets ATR steered.
    AtrMatch,
    /// ixgbe `fdir_match`: packets a Flow Director filter (ATR or an
    /// ntuple rule) steered.
    FdirMatch,
    /// i40e, ice `fdir_sb_match`: packets an ntuple (sideband) rule steered.
    SidebandMatch,
    /// ixgbe `fdir_miss`: packets no filter matched (RSS placed them).
    FdirMiss,
    /// i40e `port.fdir_flush_cnt`: times the Flow Director table was
    /// flushed (ATR's entries rebuilt).
    FdirFlush,
    /// ixgbe `fdir_overflow`: filters that did not fit.
    FdirOverflow,
    /// Packets received on one RX queue.
    RxPackets(u32),
}

impl Steering {
    /// Its name as a metric label: `atr_match`, `rx_packets`, ...
    pub fn label(&self) -> String {
        match self {
            Steering::RxPackets(_) => "rx_packets".to_string(),
            other => serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
        }
    }

    /// The steering meaning of a statistic's name, if it has one.
    pub fn of(name: &str) -> Option<Steering> {
        let base = name.rsplit('.').next().unwrap_or(name);
        let exact = match base {
            "fdir_atr_match" => Some(Steering::AtrMatch),
            "fdir_match" => Some(Steering::FdirMatch),
            "fdir_sb_match" => Some(Steering::SidebandMatch),
            "fdir_miss" => Some(Steering::FdirMiss),
            "fdir_flush_cnt" => Some(Steering::FdirFlush),
            "fdir_overflow" => Some(Steering::FdirOverflow),
            _ => None,
        };
        exact.or_else(|| rx_queue_packets(name).map(Steering::RxPackets))
    }
}

/// The queue of a per-queue received-packets counter: i40e `rx-3.packets`,
/// ixgbe/ice/virtio `rx_queue_3_packets`, veth `rx_queue_3_xdp_packets`,
/// mlx5 `rx3_packets`.
fn rx_queue_packets(name: &str) -> Option<u32> {
    let number = |s: &str| s.parse::<u32>().ok();
    if let Some(q) = name
        .strip_prefix("rx-")
        .and_then(|r| r.strip_suffix(".packets"))
    {
        return number(q);
    }
    if let Some(rest) = name.strip_prefix("rx_queue_") {
        let q = rest
            .strip_suffix("_packets")
            .map(|q| q.strip_suffix("_xdp").unwrap_or(q))?;
        return number(q);
    }
    name.strip_prefix("rx")
        .and_then(|r| r.strip_suffix("_packets"))
        .and_then(number)
}

/// The NIC at the start and end of a run, and what its steering
/// statistics counted in between.
#[derive(Clone, Debug, Serialize)]
pub struct NicEvidence {
    pub start: NicReport,
    pub end: NicReport,
    /// Each steering statistic's change over the run, by its driver name.
    pub deltas: BTreeMap<String, StatDelta>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StatDelta {
    pub meaning: Steering,
    pub delta: u64,
}

impl NicEvidence {
    pub fn new(start: NicReport, end: NicReport) -> NicEvidence {
        let deltas = end
            .statistics
            .iter()
            .filter_map(|(name, &v)| {
                let meaning = Steering::of(name)?;
                let before = start.statistics.get(name).copied().unwrap_or(0);
                Some((
                    name.clone(),
                    StatDelta {
                        meaning,
                        delta: v.saturating_sub(before),
                    },
                ))
            })
            .collect();
        NicEvidence { start, end, deltas }
    }

    /// The summed change of the statistics that mean `what`.
    pub fn delta(&self, what: Steering) -> Option<u64> {
        let mut found = self
            .deltas
            .values()
            .filter(|d| d.meaning == what)
            .peekable();
        found.peek()?;
        Some(found.map(|d| d.delta).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statistic names as the drivers' documentation and `ethtool -S`
    /// output show them.
    #[test]
    fn drivers_statistics_decode_into_steering_meanings() {
        let cases = [
            // i40e (Intel 700 series).
            ("port.fdir_atr_match", Some(Steering::AtrMatch)),
            ("port.fdir_sb_match", Some(Steering::SidebandMatch)),
            ("port.fdir_flush_cnt", Some(Steering::FdirFlush)),
            ("port.fdir_atr_tunnel_match", None),
            ("rx-5.packets", Some(Steering::RxPackets(5))),
            ("rx-5.bytes", None),
            // ixgbe (82599, X540, X550).
            ("fdir_match", Some(Steering::FdirMatch)),
            ("fdir_miss", Some(Steering::FdirMiss)),
            ("fdir_overflow", Some(Steering::FdirOverflow)),
            ("rx_queue_12_packets", Some(Steering::RxPackets(12))),
            ("rx_queue_12_bytes", None),
            // ice (Intel 800 series).
            ("fdir_sb_match", Some(Steering::SidebandMatch)),
            ("rx_queue_0_packets", Some(Steering::RxPackets(0))),
            // mlx5 (ConnectX-4 on).
            ("rx3_packets", Some(Steering::RxPackets(3))),
            ("rx_packets", None),
            ("rx3_xdp_drop", None),
            // veth, virtio_net.
            ("rx_queue_1_xdp_packets", Some(Steering::RxPackets(1))),
            ("rx_queue_1_xdp_drops", None),
            ("peer_ifindex", None),
        ];
        for (name, meaning) in cases {
            assert_eq!(Steering::of(name), meaning, "{name}");
        }
    }

    #[test]
    fn deltas_cover_the_steering_statistics_over_the_run() {
        let stats = |atr: u64, q0: u64, q1: u64| NicReport {
            statistics: [
                ("port.fdir_atr_match".to_string(), atr),
                ("rx-0.packets".to_string(), q0),
                ("rx-1.packets".to_string(), q1),
                ("port.rx_bytes".to_string(), 1),
            ]
            .into(),
            ..NicReport::default()
        };
        let e = NicEvidence::new(stats(100, 10, 20), stats(350, 15, 20));
        assert_eq!(e.delta(Steering::AtrMatch), Some(250));
        assert_eq!(e.delta(Steering::RxPackets(0)), Some(5));
        assert_eq!(e.delta(Steering::RxPackets(1)), Some(0));
        assert_eq!(e.delta(Steering::FdirMiss), None);
        assert!(!e.deltas.contains_key("port.rx_bytes"));
    }
}
