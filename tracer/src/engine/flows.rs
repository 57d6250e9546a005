//! The bounded flow table: flow direction -> state, least recently used
//! evicted first.
//!
//! Built for the per-segment path. States live in one slab; an access only
//! stamps a dense array (one entry per slot) and, unless the flow was also
//! the previous one accessed, appends (stamp, slot) to a recency queue.
//! Eviction pops the queue until an entry still carries its slot's current
//! stamp: that slot's last use is the oldest of all, which is exact LRU.
//! Stale entries are compacted away when the queue reaches twice the
//! capacity, so it stays bounded and costs O(1) amortised per access.
//! (A linked-list LRU instead touches two neighbour nodes per access:
//! random cache misses on a stream interleaving many flows.) Segments come
//! in trains of one flow (a TSO burst, a NAPI poll of one queue), so the
//! previous access's slot is checked before the index.

use std::collections::{HashMap, VecDeque};

use rustc_hash::FxBuildHasher;

use crate::source::Flow;

pub struct FlowTable<V> {
    cap: usize,
    index: HashMap<Flow, u32, FxBuildHasher>,
    slots: Vec<(Flow, V)>,
    /// Last-use stamp of each slot.
    stamps: Vec<u64>,
    /// (stamp, slot) in stamp order; an entry is live while the slot still
    /// carries that stamp.
    queue: VecDeque<(u64, u32)>,
    clock: u64,
    /// The flow accessed last and its slot.
    last: Option<(Flow, u32)>,
}

impl<V> FlowTable<V> {
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            index: HashMap::default(),
            slots: Vec::new(),
            stamps: Vec::new(),
            queue: VecDeque::new(),
            clock: 0,
            last: None,
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The state of `flow`, created by `fresh` if absent; when that needs
    /// room, the least recently used flow and its state are handed back.
    pub fn get_or_insert(
        &mut self,
        flow: Flow,
        fresh: impl FnOnce() -> V,
    ) -> (&mut V, Option<(Flow, V)>) {
        let mut evicted = None;
        let known = match self.last {
            Some((last, slot)) if last == flow => Some(slot),
            _ => self.index.get(&flow).copied(),
        };
        let slot = match known {
            Some(slot) => slot,
            None if self.slots.len() < self.cap => {
                let slot = self.slots.len() as u32;
                self.slots.push((flow, fresh()));
                self.stamps.push(0);
                self.index.insert(flow, slot);
                slot
            }
            None => {
                let slot = self.pop_lru();
                let old = std::mem::replace(&mut self.slots[slot as usize], (flow, fresh()));
                self.index.remove(&old.0);
                self.index.insert(flow, slot);
                evicted = Some(old);
                slot
            }
        };
        self.last = Some((flow, slot));
        self.touch(slot);
        (&mut self.slots[slot as usize].1, evicted)
    }

    fn touch(&mut self, slot: u32) {
        let stamp = &mut self.stamps[slot as usize];
        if *stamp == self.clock && self.clock != 0 {
            // Already the most recently used.
            return;
        }
        self.clock += 1;
        *stamp = self.clock;
        self.queue.push_back((self.clock, slot));
        if self.queue.len() >= 2 * self.cap {
            let stamps = &self.stamps;
            self.queue.retain(|&(t, s)| stamps[s as usize] == t);
        }
    }

    fn pop_lru(&mut self) -> u32 {
        loop {
            let (t, s) = self
                .queue
                .pop_front()
                .expect("a full table has live entries");
            if self.stamps[s as usize] == t {
                return s;
            }
        }
    }

    pub fn peek(&self, flow: &Flow) -> Option<&V> {
        self.index.get(flow).map(|&s| &self.slots[s as usize].1)
    }

    /// Like [`peek`](Self::peek), mutable; does not count as a use.
    pub fn peek_mut(&mut self, flow: &Flow) -> Option<&mut V> {
        let slot = *self.index.get(flow)?;
        Some(&mut self.slots[slot as usize].1)
    }

    /// All flows, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&Flow, &V)> {
        self.slots.iter().map(|(f, v)| (f, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(port: u16) -> Flow {
        Flow {
            src: std::net::SocketAddr::from(([10, 0, 0, 1], port)),
            dst: std::net::SocketAddr::from(([10, 0, 0, 2], 80)),
        }
    }

    /// Reference: a Vec in recency order, oldest first.
    #[test]
    fn evicts_exactly_the_least_recently_used() {
        let cap = 5;
        let mut t = FlowTable::new(cap);
        let mut model: Vec<u16> = Vec::new();
        let mut rng = 0x2545_f491_u64;
        for i in 0..20_000u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let port = (rng % 9) as u16;
            let (v, ev) = t.get_or_insert(flow(port), || i);
            let _ = v;
            let expect = match model.iter().position(|&p| p == port) {
                Some(at) => {
                    model.remove(at);
                    None
                }
                None if model.len() == cap => Some(model.remove(0)),
                None => None,
            };
            model.push(port);
            assert_eq!(ev.map(|(f, _)| f.src.port()), expect, "access {i}");
            assert!(t.queue.len() < 2 * cap);
        }
        assert_eq!(t.len(), cap);
    }

    #[test]
    fn values_survive_until_evicted() {
        let mut t = FlowTable::new(2);
        *t.get_or_insert(flow(1), || 0).0 += 10;
        *t.get_or_insert(flow(2), || 0).0 += 20;
        *t.get_or_insert(flow(1), || 0).0 += 1;
        let (v, ev) = t.get_or_insert(flow(3), || 30);
        assert_eq!(*v, 30);
        assert_eq!(ev, Some((flow(2), 20)));
        assert_eq!(t.peek(&flow(1)), Some(&11));
        assert_eq!(t.peek(&flow(2)), None);
    }
}
