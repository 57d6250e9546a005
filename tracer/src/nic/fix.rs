//! The fix, said plainly: when flows are reordered by steering, what to
//! change on this NIC, fitted to its driver and what it reported, with the
//! counts that point there. A suggestion only; the tracer never runs it.

use serde::Serialize;

use super::{NicEvidence, Steering};

/// What the packets showed, for fitting the fix.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    /// Flows whose verdict is `nic-steering`.
    pub nic_steering_flows: u64,
    /// (segments off their flow's RSS queue, segments checked), when the
    /// RSS table was known.
    pub off_rss: Option<(u64, u64)>,
    pub queue_migrations: u64,
    pub cpu_migrations: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Fix {
    /// What to run or change.
    pub suggestion: String,
    /// Why: the counts behind it.
    pub evidence: String,
}

/// The fix for what was seen on the NIC `nic` said about, if the flows
/// were reordered by steering.
pub fn suggest(nic: &NicEvidence, seen: Seen) -> Option<Fix> {
    if seen.nic_steering_flows == 0 {
        return None;
    }
    let n = &nic.end;
    let iface = &n.iface;
    let mut evidence = vec![format!(
        "{} flows reordered by steering",
        seen.nic_steering_flows
    )];
    if let Some((off, of)) = seen.off_rss {
        evidence.push(format!("{off} of {of} segments off their RSS queue"));
    }
    let count =
        |what: Steering, name: &str| nic.delta(what).map(|d| format!("{name} +{d} over the run"));
    evidence.extend(count(Steering::AtrMatch, "ATR matches"));
    evidence.extend(count(Steering::FdirMatch, "Flow Director matches"));
    evidence.extend(count(Steering::FdirFlush, "Flow Director table flushes"));
    let rfs = n.rps_sock_flow_entries.unwrap_or(0) > 0;
    let rps_queues: Vec<u32> = n
        .rps
        .iter()
        .filter(|(_, r)| r.cpus.chars().any(|c| c != '0' && c != ','))
        .map(|(&q, _)| q)
        .collect();
    let driver = n.driver.as_deref().unwrap_or("");
    let suggestion = if n.private_flags.get("flow-director-atr") == Some(&true) {
        // i40e (and its relatives): ATR re-points a flow to the queue of the
        // CPU that last sent on it.
        format!(
            "ethtool --set-priv-flags {iface} flow-director-atr off (the {driver} driver's Flow Director ATR re-points flows to the queue of the CPU that last transmitted on them)"
        )
    } else if driver == "ixgbe" && n.ntuple == Some(false) {
        format!(
            "ethtool -K {iface} ntuple on (ixgbe runs Flow Director ATR while ntuple filters are off; with them on it keeps only the rules you add)"
        )
    } else if n.ntuple == Some(true) && rfs {
        format!(
            "ethtool -K {iface} ntuple off, or sysctl -w net.core.rps_sock_flow_entries=0 (accelerated RFS steers each flow to the queue of the CPU its reader runs on, and moves it when the reader moves)"
        )
    } else if seen.queue_migrations == 0 && seen.cpu_migrations > 0 {
        if !rps_queues.is_empty() || rfs {
            format!(
                "echo 0 > /sys/class/net/{iface}/queues/rx-N/rps_cpus for RX queues {rps_queues:?}, and sysctl -w net.core.rps_sock_flow_entries=0 (the CPU changed while the queue did not: RPS/RFS moved the flows)"
            )
        } else {
            "pin the receiving threads and the queues' IRQs (the CPU changed while the RX queue did not: the receiver's thread or the IRQ's affinity moved, not the NIC)".to_string()
        }
    } else {
        format!(
            "look for what steers flows on {iface}: `ethtool --show-priv-flags {iface}`, `ethtool -n {iface}` (ntuple rules), `ethtool -k {iface} | grep ntuple`, and the driver's Flow Director statistics (`ethtool -S {iface}`)"
        )
    };
    Some(Fix {
        suggestion,
        evidence: evidence.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::{NicReport, Rps};

    fn nic(
        driver: &str,
        flags: &[(&str, bool)],
        ntuple: bool,
        stats: &[(&str, u64, u64)],
    ) -> NicEvidence {
        let at = |pick: fn(&(&str, u64, u64)) -> u64| NicReport {
            iface: "eth0".into(),
            driver: Some(driver.into()),
            private_flags: flags.iter().map(|(f, on)| (f.to_string(), *on)).collect(),
            ntuple: Some(ntuple),
            statistics: stats.iter().map(|s| (s.0.to_string(), pick(s))).collect(),
            ..NicReport::default()
        };
        NicEvidence::new(at(|s| s.1), at(|s| s.2))
    }

    const STEERED: Seen = Seen {
        nic_steering_flows: 3,
        off_rss: Some((500, 1000)),
        queue_migrations: 12,
        cpu_migrations: 12,
    };

    #[test]
    fn i40e_with_atr_on_gets_the_seeds_command_with_its_counts() {
        let e = nic(
            "i40e",
            &[("MFP", false), ("flow-director-atr", true)],
            false,
            &[
                ("port.fdir_atr_match", 100, 2100),
                ("port.fdir_flush_cnt", 4, 9),
            ],
        );
        let fix = suggest(&e, STEERED).unwrap();
        assert!(
            fix.suggestion
                .starts_with("ethtool --set-priv-flags eth0 flow-director-atr off"),
            "{}",
            fix.suggestion
        );
        assert_eq!(
            fix.evidence,
            "3 flows reordered by steering, 500 of 1000 segments off their RSS queue, ATR matches +2000 over the run, Flow Director table flushes +5 over the run"
        );
    }

    #[test]
    fn ixgbe_without_ntuple_runs_atr() {
        let e = nic(
            "ixgbe",
            &[],
            false,
            &[("fdir_match", 0, 70), ("fdir_miss", 0, 3)],
        );
        let fix = suggest(&e, STEERED).unwrap();
        assert!(
            fix.suggestion.starts_with("ethtool -K eth0 ntuple on"),
            "{}",
            fix.suggestion
        );
        assert!(fix.evidence.contains("Flow Director matches +70"));
    }

    #[test]
    fn ntuple_with_rfs_is_arfs_and_cpu_only_moves_are_rps() {
        let mut e = nic("mlx5_core", &[], true, &[]);
        e.end.rps_sock_flow_entries = Some(32768);
        assert!(suggest(&e, STEERED)
            .unwrap()
            .suggestion
            .contains("accelerated RFS"));
        let mut e = nic("mlx5_core", &[], false, &[]);
        e.end.rps.insert(
            2,
            Rps {
                cpus: "0f".into(),
                flow_cnt: 0,
            },
        );
        let cpu_only = Seen {
            queue_migrations: 0,
            ..STEERED
        };
        let fix = suggest(&e, cpu_only).unwrap();
        assert!(
            fix.suggestion.contains("rps_cpus for RX queues [2]"),
            "{}",
            fix.suggestion
        );
    }

    #[test]
    fn nothing_to_fix_without_steering() {
        let e = nic("i40e", &[("flow-director-atr", true)], false, &[]);
        let none = Seen {
            nic_steering_flows: 0,
            ..STEERED
        };
        assert_eq!(suggest(&e, none), None);
    }
}
