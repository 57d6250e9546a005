//! The bounded flow table: flow direction -> state, least recently used
//! evicted first.
//!
//! Built for the per-segment path. States live in one slab; an access only
//! stamps a dense array (one entry per slot) and, unless the flow was also
//! the previous one accessed, appends (stamp, slot) to a recency queue.
//! Eviction pops the queue until an entry still carries its slot's current
//! stamp: that slot's last use is the oldest of all, which is exact LRU.
//! Stale entries are compacted away when the queue reaches twice the
//! flows held, so it stays bounded and costs O(1) amortised per access.
//! (A linked-list LRU instead touches two neighbour nodes per access:
//! random cache misses on a stream interleaving many flows.) Segments come
//! in trains of one flow (a TSO burst, a NAPI poll of one queue), so the
//! previous access's slot is checked before the index.

use std::collections::{HashMap, VecDeque};

use rustc_hash::FxBuildHasher;

use crate::source::Flow;

/// The recency queue is compacted at twice the flows held, or this.
const MIN_QUEUE: usize = 64;

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
    /// [`held_bytes`](Self::held_bytes), weighed as the table grows.
    held: u64,
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
            held: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The state of `flow`, created by `fresh` if absent; when that needs
    /// room, the least recently used flow and its state go to `evicted`.
    /// (Handed to a closure, not returned: an `Option` of a large state
    /// is copied whole on every return, evicted or not, which had cost
    /// the per-segment path a 1.3 KB copy.)
    pub fn get_or_insert(
        &mut self,
        flow: Flow,
        fresh: impl FnOnce() -> V,
        evicted: impl FnOnce(Flow, V),
    ) -> &mut V {
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
                self.held = self.weigh();
                slot
            }
            None => {
                let slot = self.pop_lru();
                let old = std::mem::replace(&mut self.slots[slot as usize], (flow, fresh()));
                self.index.remove(&old.0);
                self.index.insert(flow, slot);
                evicted(old.0, old.1);
                slot
            }
        };
        self.last = Some((flow, slot));
        self.touch(slot);
        &mut self.slots[slot as usize].1
    }

    fn touch(&mut self, slot: u32) {
        let stamp = &mut self.stamps[slot as usize];
        if *stamp == self.clock && self.clock != 0 {
            // Already the most recently used.
            return;
        }
        self.clock += 1;
        *stamp = self.clock;
        let grows = self.queue.len() == self.queue.capacity();
        self.queue.push_back((self.clock, slot));
        if grows {
            self.held = self.weigh();
        }
        if self.queue.len() >= 2 * self.slots.len().max(MIN_QUEUE) {
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

    /// The state of the flow accessed last (by [`get_or_insert`](Self::get_or_insert)).
    pub fn last_mut(&mut self) -> Option<&mut V> {
        let (_, slot) = self.last?;
        Some(&mut self.slots[slot as usize].1)
    }

    /// Bytes its own structures take (by capacity; the states' heap
    /// beyond their slots is theirs to say), weighed as they grow.
    pub fn held_bytes(&self) -> u64 {
        self.held
    }

    fn weigh(&self) -> u64 {
        use std::mem::size_of;
        // hashbrown: a power of two of buckets, at most 7/8 full, each an
        // entry and a control byte.
        let buckets = (self.index.capacity() * 8).div_ceil(7);
        (self.slots.capacity() * size_of::<(Flow, V)>()
            + self.stamps.capacity() * size_of::<u64>()
            + self.queue.capacity() * size_of::<(u64, u32)>()
            + buckets * (size_of::<(Flow, u32)>() + 1)) as u64
    }

    /// All flows, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&Flow, &V)> {
        self.slots.iter().map(|(f, v)| (f, v))
    }

    /// All flows' states, mutable, in no particular order; not uses.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.slots.iter_mut().map(|(_, v)| v)
    }

    /// Evicts flows, least recently used first, while `more` (shown each
    /// one's state before it goes) says so; hands them back. Compacts the
    /// slab: O(table) a call, for evicting many at once.
    pub fn evict_oldest_while(&mut self, mut more: impl FnMut(&V) -> bool) -> Vec<(Flow, V)> {
        let mut evict = vec![false; self.slots.len()];
        while let Some(&(t, s)) = self.queue.front() {
            if self.stamps[s as usize] == t && !more(&self.slots[s as usize].1) {
                break;
            }
            self.queue.pop_front();
            evict[s as usize] |= self.stamps[s as usize] == t;
        }
        if !evict.contains(&true) {
            return Vec::new();
        }
        // Survivors move down into structures their size, so that what
        // the evicted took is given back; `moved[old slot]` is the new one.
        let survivors = evict.iter().filter(|&&e| !e).count();
        let mut moved = vec![u32::MAX; evict.len()];
        let slots = std::mem::replace(&mut self.slots, Vec::with_capacity(survivors));
        let stamps = std::mem::replace(&mut self.stamps, Vec::with_capacity(survivors));
        self.index = HashMap::with_capacity_and_hasher(survivors, FxBuildHasher);
        let mut evicted = Vec::new();
        for (i, ((flow, v), stamp)) in slots.into_iter().zip(stamps).enumerate() {
            if evict[i] {
                evicted.push((flow, v));
            } else {
                moved[i] = self.slots.len() as u32;
                self.index.insert(flow, moved[i]);
                self.slots.push((flow, v));
                self.stamps.push(stamp);
            }
        }
        self.queue.retain_mut(|(_, s)| {
            *s = moved[*s as usize];
            *s != u32::MAX
        });
        self.queue.shrink_to_fit();
        self.last = None;
        self.held = self.weigh();
        evicted
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

    /// `get_or_insert`: the value, and the flow evicted for it.
    fn access<V: Copy>(t: &mut FlowTable<V>, f: Flow, fresh: V) -> (V, Option<(Flow, V)>) {
        let mut evicted = None;
        let v = *t.get_or_insert(f, || fresh, |k, old| evicted = Some((k, old)));
        (v, evicted)
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
            let (_, ev) = access(&mut t, flow(port), i);
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
            assert!(t.queue.len() < 2 * MIN_QUEUE.max(cap));
        }
        assert_eq!(t.len(), cap);
    }

    /// Evicting many at once takes the least recently used, and the table
    /// then goes on exactly as an LRU of what is left.
    #[test]
    fn evicting_the_oldest_keeps_the_rest_in_order() {
        let mut t = FlowTable::new(8);
        for port in 0..8 {
            access(&mut t, flow(port), u64::from(port));
        }
        // Recency now: 0 2 3 4 5 6 7 1 (oldest first).
        access(&mut t, flow(1), 0);
        let mut budget = 3;
        let mut gone: Vec<u16> = t
            .evict_oldest_while(|_| {
                budget -= 1;
                budget >= 0
            })
            .into_iter()
            .map(|(f, _)| f.src.port())
            .collect();
        gone.sort();
        assert_eq!(gone, [0, 2, 3]);
        assert_eq!(t.len(), 5);
        assert_eq!(t.peek(&flow(7)), Some(&7));
        assert!(t.last_mut().is_none());
        // Three new flows fill it; the next one evicts 4, then 5.
        for port in 10..13 {
            assert!(access(&mut t, flow(port), 0).1.is_none());
        }
        assert_eq!(
            access(&mut t, flow(13), 0)
                .1
                .map(|(f, v)| (f.src.port(), v)),
            Some((4, 4))
        );
        assert_eq!(
            access(&mut t, flow(14), 0).1.map(|(f, _)| f.src.port()),
            Some(5)
        );
        assert_eq!(*t.last_mut().unwrap(), 0);
    }

    #[test]
    fn values_survive_until_evicted() {
        let mut t = FlowTable::new(2);
        *t.get_or_insert(flow(1), || 0, |_, _| {}) += 10;
        *t.get_or_insert(flow(2), || 0, |_, _| {}) += 20;
        *t.get_or_insert(flow(1), || 0, |_, _| {}) += 1;
        let (v, ev) = access(&mut t, flow(3), 30);
        assert_eq!(v, 30);
        assert_eq!(ev, Some((flow(2), 20)));
        assert_eq!(t.peek(&flow(1)), Some(&11));
        assert_eq!(t.peek(&flow(2)), None);
    }
}
