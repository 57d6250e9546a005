//! What the engine is set to: flows tracked, RFC 5236 thresholds, the
//! verdict's rules, the replay's settings, the memory budget. Plain
//! values: the engine runs by them, the snapshot reports them.

use crate::replay::ReplayConfig;

/// What the engine may hold by default: fits a small host.
pub const DEFAULT_MEMORY_BUDGET: u64 = 512 << 20;

/// When a reordered segment's verdict evidence counts it as steered.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct VerdictRules {
    /// At least this many reordered segments before a flow gets a verdict
    /// other than `none`.
    pub min_reordered: u64,
    /// `nic-steering`: at least this share of reordered segments was
    /// overtaken by a segment on another RX queue or CPU (and the flow
    /// migrated at least once).
    pub steering_share: f64,
    /// `upstream`: at most this share was (the rest: same queue and CPU).
    pub upstream_share: f64,
}

impl Default for VerdictRules {
    fn default() -> Self {
        Self {
            min_reordered: 1,
            steering_share: 0.75,
            upstream_share: 0.25,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct EngineConfig {
    /// Flow directions tracked at once (LRU).
    pub max_flows: usize,
    /// RFC 5236 displacement threshold (RD) and buffer threshold (RBD).
    pub dt: u32,
    pub bt: u32,
    /// A reorder "follows a migration" within this long after it.
    pub migration_window_ns: u64,
    pub verdict: VerdictRules,
    pub replay: ReplayConfig,
    /// Bytes all flows' state may hold together (`engine::memory`; reported
    /// there).
    #[serde(skip)]
    pub memory_budget: u64,
    /// Flows unseen this long are retired (their counts stay in the
    /// totals), so that what is tracked follows the live flows, not
    /// history. None: only the memory budget and `max_flows` retire them.
    pub idle_expiry_ns: Option<u64>,
    /// Whether a flow the table gives up is replayed as it goes, its
    /// replay summed into the totals (a long flow's replay takes the
    /// collector seconds); `watch`, whose reports carry no replay, skips it.
    pub replay_retired: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_flows: 65_536,
            dt: 64,
            bt: 64,
            migration_window_ns: 10_000_000,
            verdict: VerdictRules::default(),
            replay: ReplayConfig::default(),
            memory_budget: DEFAULT_MEMORY_BUDGET,
            idle_expiry_ns: None,
            replay_retired: true,
        }
    }
}
