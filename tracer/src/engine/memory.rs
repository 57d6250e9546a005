//! The memory budget: one bound on what the engine holds for all its flows
//! together.
//!
//! After every observation the flow it touched is weighed again (O(1): its
//! structures' sizes and capacities, see [`FlowState::held_bytes`]) and the
//! engine keeps the sum. Above the budget it gives things up until it is
//! back under seven eighths of it: first the ACK-level replay logs (most of
//! what a long flow holds) of the flows whose replay has least to work on
//! (fewest late originals and refilled holes), which are then replayed from
//! the wire; then whole flows, least recently seen first, their counts kept
//! in the totals. Each is counted ([`Memory`]).

use std::mem::size_of;

use super::{Engine, FlowState, Hist, HistData, LateStats, TableKey};
use crate::snapshot::Memory;

/// Frees an emptied map's last node (std's B-tree keeps its root when
/// emptied: some 200 to 600 bytes a map, four maps a flow that reordered
/// once).
pub(super) fn give_back<K, V>(map: &mut std::collections::BTreeMap<K, V>) {
    if map.is_empty() {
        *map = std::collections::BTreeMap::new();
    }
}

/// A B-tree map of `len` entries: nodes of up to 11, about half full, and
/// their links.
pub(super) fn btree_bytes<K, V>(len: usize) -> u64 {
    (len * (2 * size_of::<(K, V)>() + 16)) as u64
}

impl LateStats {
    /// Heap bytes of a flow's late-segment statistics (boxed: with the
    /// box).
    pub(super) fn held_bytes(&self) -> u64 {
        let hist = |h: &Hist| {
            h.get().map_or(0, |d| {
                size_of::<HistData>() + d.histogram.distinct_values() * size_of::<u32>()
            }) as u64
        };
        size_of::<LateStats>() as u64
            + [
                &self.extent,
                &self.late_time_us,
                &self.byte_offset,
                &self.gap,
                &self.gap_time_us,
                &self.old_queue_late_us,
            ]
            .into_iter()
            .map(hist)
            .sum::<u64>()
            + btree_bytes::<(u32, u32), u64>(self.queue_pairs.len() + self.cpu_pairs.len())
    }
}

impl FlowState {
    /// Heap bytes this flow holds beyond its slot in the table: what grows
    /// with reordering (order ranges and holes, density buffers, late
    /// statistics), the TCP-layer detector, and the replay's logs by
    /// capacity. From fields in the flow's own slot only (the parts behind
    /// pointers are weighed as they change): no cache miss of its own.
    pub(super) fn held_bytes(&self) -> u64 {
        let wire = self.wire.as_ref().map_or(0, |w| {
            w.order.held_bytes()
                + w.rd.held_bytes()
                + w.rbd.held_bytes()
                + w.log.held_bytes()
                + w.late_held
        });
        wire + self.tcp_held
    }
}

impl Engine {
    /// What the engine holds now: the flow table and every flow's own.
    pub fn held_bytes(&self) -> u64 {
        self.flows.held_bytes() + self.retired.flows_held
    }

    pub fn memory(&self) -> Memory {
        Memory {
            held_bytes: self.held_bytes(),
            ..self.memory
        }
    }

    /// Retires the flows unseen for the idle expiry before `now`; looks
    /// again a tenth of the expiry later (each look is O(table)).
    #[cold]
    #[inline(never)]
    pub(super) fn expire_idle(&mut self, now: u64) {
        let Some(idle) = self.cfg.idle_expiry_ns else {
            return;
        };
        self.next_expiry_ns = now + (idle / 10).max(1);
        let cutoff = now.saturating_sub(idle);
        let expired = self.flows.evict_oldest_while(|f| f.last_ns < cutoff);
        self.memory.expired_idle += self.retire_all(expired);
        self.table_weighed = self.flows.held_bytes();
    }

    /// Sets what the engine may hold (the front end gives it what the
    /// process's budget leaves after its own baseline).
    pub fn set_memory_budget(&mut self, bytes: u64) {
        self.cfg.memory_budget = bytes;
        self.memory.budget_bytes = bytes;
    }

    /// Weighs the flow just observed again if `reshaped` (what it saw may
    /// have added to its ranges, holes or statistics), its logs grew, or
    /// it is new; then, if what the engine holds changed and passed the
    /// budget, gives things up.
    #[inline]
    pub(super) fn settle(&mut self, reshaped: bool) {
        let mut changed = self.flows.held_bytes() != self.table_weighed;
        if let Some(f) = self.flows.last_mut() {
            let logs = f.wire.as_ref().map_or(0, |w| w.log.held_bytes());
            if reshaped || logs != f.logs_weighed || f.held == 0 {
                let now = f.held_bytes();
                self.retired.flows_held = self.retired.flows_held + now - f.held;
                f.held = now;
                f.logs_weighed = logs;
                changed = true;
            }
        }
        if !changed {
            return;
        }
        self.table_weighed = self.flows.held_bytes();
        let mut held = self.held_bytes();
        if held > self.cfg.memory_budget {
            self.shed(held);
            held = self.held_bytes();
            self.table_weighed = self.flows.held_bytes();
        }
        self.memory.peak_held_bytes = self.memory.peak_held_bytes.max(held);
    }

    /// Back under seven eighths of the budget: ACK-level logs first (the
    /// flows whose replay has least to work on), then the least recently
    /// seen flows.
    #[cold]
    #[inline(never)]
    fn shed(&mut self, mut held: u64) {
        let target = self.cfg.memory_budget - self.cfg.memory_budget / 8;
        let mut logs: Vec<(usize, u64, &mut FlowState)> = self
            .flows
            .values_mut()
            .filter_map(|f| {
                let log = &f.wire.as_ref()?.log;
                let (work, bytes) = (log.late.len() + log.refills.len(), log.ack_log_bytes());
                (bytes > 0).then_some((work, bytes, f))
            })
            .collect();
        // Least to replay first; of equals, the biggest log first.
        logs.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        for (_, bytes, f) in logs {
            if held <= target {
                break;
            }
            f.wire.as_mut().expect("has a log").log.shed_ack_log();
            f.held -= bytes;
            f.logs_weighed -= bytes;
            self.retired.flows_held -= bytes;
            held -= bytes;
            self.memory.ack_logs_shed += 1;
        }
        if held > target {
            let mut over = held - target;
            let evicted = self.flows.evict_oldest_while(|f| {
                let go = over > 0;
                over = over.saturating_sub(FLOW_SLOT_BYTES + f.held);
                go
            });
            self.memory.evicted_for_memory += self.retire_all(evicted);
        }
    }

    /// Retires flows the table gave up (their counts and replays into the
    /// totals); how many.
    fn retire_all(&mut self, gone: Vec<(TableKey, FlowState)>) -> u64 {
        let ctx = super::FlowContext {
            replay: &self.cfg.replay,
            replay_retired: self.cfg.replay_retired,
            link: &self.link,
            rss: self.rss.as_ref(),
        };
        for (key, f) in &gone {
            self.retired.retire(&key.flow, f, &ctx);
        }
        gone.len() as u64
    }
}

/// What evicting a flow gives back of the table (its slot, stamp, queue
/// entries and index entry, once the table is compacted to its size).
const FLOW_SLOT_BYTES: u64 =
    (size_of::<(TableKey, FlowState)>() + 8 + 2 * 16 + 2 * (size_of::<(TableKey, u32)>() + 1))
        as u64;
