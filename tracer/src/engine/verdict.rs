//! Per-flow verdict: is the reordering the host's own queue/core steering
//! (the Flow Director ATR signature) or did it arrive that way?
//!
//! The evidence is each reordered segment's attribution: whether the
//! segment that overtook it came in on another RX queue or CPU. Steering
//! reorders a flow when it moves it between queues/cores, so its reorders
//! are overtaken across queues or CPUs and the flow migrates; reordering
//! upstream (the network, a load balancer) is overtaken on the same queue
//! and CPU, because this host's steering did not change.
//!
//! Rules ([`VerdictRules`], defaults in parentheses):
//! * `none`: fewer than `min_reordered` (1) reordered segments;
//! * `nic-steering`: the share of reordered segments overtaken on another
//!   queue or CPU is at least `steering_share` (0.75), and the flow
//!   migrated at least once;
//! * `upstream`: that share is at most `upstream_share` (0.25);
//! * `mixed`: anything between.

use super::Metrics;
use crate::{config::VerdictRules, snapshot::Verdict};

/// The share of reordered segments overtaken on another queue or CPU.
pub fn steered_share(m: &Metrics) -> f64 {
    let steered: u64 = m.late.attribution[1..].iter().sum();
    steered as f64 / m.reordered.max(1) as f64
}

/// The verdict alone (what [`judge`] says, without the sentence).
pub fn of(m: &Metrics, rules: &VerdictRules) -> Verdict {
    if m.reordered < rules.min_reordered.max(1) {
        return Verdict::None;
    }
    let share = steered_share(m);
    if share >= rules.steering_share && m.queue_migrations + m.cpu_migrations > 0 {
        Verdict::NicSteering
    } else if share <= rules.upstream_share {
        Verdict::Upstream
    } else {
        Verdict::Mixed
    }
}

/// The verdict and a sentence saying why.
pub fn judge(m: &Metrics, rules: &VerdictRules) -> (Verdict, String) {
    let verdict = of(m, rules);
    if verdict == Verdict::None {
        return (verdict, format!("{} reordered segments", m.reordered));
    }
    let steered: u64 = m.late.attribution[1..].iter().sum();
    let evidence = format!(
        "{steered} of {} reordered segments overtaken on another RX queue or CPU ({:.0}%); {} queue and {} CPU migrations, {} reorders within the window after one",
        m.reordered,
        steered_share(m) * 100.0,
        m.queue_migrations,
        m.cpu_migrations,
        m.late.reordered_after_migration
    );
    (verdict, evidence)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(same: u64, steered: u64, migrations: u64) -> Metrics {
        let mut m = Metrics {
            reordered: same + steered,
            queue_migrations: migrations,
            ..Default::default()
        };
        m.late.attribution = [same, steered, 0, 0];
        m
    }

    #[test]
    fn thresholds() {
        let r = VerdictRules::default();
        assert_eq!(judge(&metrics(0, 0, 5), &r).0, Verdict::None);
        assert_eq!(judge(&metrics(0, 3, 1), &r).0, Verdict::NicSteering);
        assert_eq!(judge(&metrics(1, 3, 1), &r).0, Verdict::NicSteering); // 75%
        assert_eq!(judge(&metrics(2, 3, 1), &r).0, Verdict::Mixed); // 60%
        assert_eq!(judge(&metrics(3, 1, 1), &r).0, Verdict::Upstream); // 25%
        assert_eq!(judge(&metrics(10, 0, 0), &r).0, Verdict::Upstream);
        // All steered but the flow never moved: not steering by this host.
        assert_eq!(judge(&metrics(0, 4, 0), &r).0, Verdict::Mixed);
        let strict = VerdictRules {
            min_reordered: 5,
            ..r
        };
        assert_eq!(judge(&metrics(0, 4, 1), &strict).0, Verdict::None);
        let (_, why) = judge(&metrics(1, 3, 2), &r);
        assert!(why.starts_with("3 of 4 reordered segments"), "{why}");
    }
}
