//! The bounded flow table: key (a connection) -> state, least recently
//! used evicted first.
//!
//! Built for the per-segment path, where a flow's first segment of a train
//! misses the caches: one lookup should cost as few dependent misses as
//! possible. The index holds only slot numbers (4 bytes an entry, so it
//! stays in cache beside thousands of flows); a slot holds the flow, its
//! last-use stamp and its state together, aligned to cache lines, and all
//! its lines are asked for at once when it is found. An access stamps the
//! slot and, unless the flow was also the previous one accessed, appends
//! (stamp, slot) to a recency queue. Eviction pops the queue until an entry
//! still carries its slot's current stamp: that slot's last use is the
//! oldest of all, which is exact LRU. Stale entries are compacted away when
//! the queue reaches twice the flows held, so it stays bounded and costs
//! O(1) amortised per access. (A linked-list LRU instead touches two
//! neighbour nodes per access: random cache misses on a stream interleaving
//! many flows.) Segments come in trains of one flow (a TSO burst, a NAPI
//! poll of one queue), so the previous access's slot is checked before the
//! index.

use std::{
    collections::VecDeque,
    hash::{BuildHasher, Hash},
};

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

/// The recency queue is compacted at twice the flows held, or this.
const MIN_QUEUE: usize = 64;

pub struct FlowTable<K, V> {
    cap: usize,
    /// Slot numbers, by their key's hash.
    index: HashTable<u32>,
    slots: Vec<Slot<K, V>>,
    /// (stamp, slot) in stamp order; an entry is live while the slot still
    /// carries that stamp.
    queue: VecDeque<(u64, u32)>,
    clock: u64,
    /// The key accessed last and its slot.
    last: Option<(K, u32)>,
    /// [`held_bytes`](Self::held_bytes), weighed as the table grows.
    held: u64,
}

/// A key, its last-use stamp and its state: the lookup's key comparison,
/// the stamp and the state's first fields share the first cache line.
#[repr(C, align(64))]
struct Slot<K, V> {
    stamp: u64,
    key: K,
    value: V,
}

fn hash<K: Hash>(key: &K) -> u64 {
    FxBuildHasher.hash_one(key)
}

impl<K: Copy + Eq + Hash, V> FlowTable<K, V> {
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            index: HashTable::new(),
            slots: Vec::new(),
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

    fn find(&self, key: &K) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(hash(key), |&s| slots[s as usize].key == *key)
            .copied()
    }

    fn index_insert(&mut self, key: &K, slot: u32) {
        let slots = &self.slots;
        self.index
            .insert_unique(hash(key), slot, |&s| hash(&slots[s as usize].key));
    }

    /// The state of `key`, created by `fresh` if absent; when that needs
    /// room, the least recently used key and its state go to `evicted`.
    /// (Handed to a closure, not returned: an `Option` of a large state
    /// is copied whole on every return, evicted or not, which had cost
    /// the per-segment path a 1.3 KB copy.)
    pub fn get_or_insert(
        &mut self,
        key: K,
        fresh: impl FnOnce() -> V,
        evicted: impl FnOnce(K, V),
    ) -> &mut V {
        if let Some((last, slot)) = self.last {
            if last == key {
                // Already the most recently used, and in cache.
                return &mut self.slots[slot as usize].value;
            }
        }
        let slot = match self.find(&key) {
            Some(slot) => {
                prefetch(&self.slots[slot as usize]);
                slot
            }
            None if self.slots.len() < self.cap => {
                let slot = self.slots.len() as u32;
                self.slots.push(Slot {
                    stamp: 0,
                    key,
                    value: fresh(),
                });
                self.index_insert(&key, slot);
                self.held = self.weigh();
                slot
            }
            None => {
                let slot = self.pop_lru();
                let old = std::mem::replace(
                    &mut self.slots[slot as usize],
                    Slot {
                        stamp: 0,
                        key,
                        value: fresh(),
                    },
                );
                let gone = hash(&old.key);
                self.index
                    .find_entry(gone, |&s| s == slot)
                    .expect("an indexed slot")
                    .remove();
                self.index_insert(&key, slot);
                evicted(old.key, old.value);
                slot
            }
        };
        self.last = Some((key, slot));
        self.touch(slot);
        &mut self.slots[slot as usize].value
    }

    fn touch(&mut self, slot: u32) {
        let stamp = &mut self.slots[slot as usize].stamp;
        self.clock += 1;
        *stamp = self.clock;
        let grows = self.queue.len() == self.queue.capacity();
        self.queue.push_back((self.clock, slot));
        if grows {
            self.held = self.weigh();
        }
        if self.queue.len() >= 2 * self.slots.len().max(MIN_QUEUE) {
            let slots = &self.slots;
            self.queue.retain(|&(t, s)| slots[s as usize].stamp == t);
        }
    }

    fn pop_lru(&mut self) -> u32 {
        loop {
            let (t, s) = self
                .queue
                .pop_front()
                .expect("a full table has live entries");
            if self.slots[s as usize].stamp == t {
                return s;
            }
        }
    }

    pub fn peek(&self, key: &K) -> Option<&V> {
        self.find(key).map(|s| &self.slots[s as usize].value)
    }

    /// Like [`peek`](Self::peek), mutable; does not count as a use.
    pub fn peek_mut(&mut self, key: &K) -> Option<&mut V> {
        let slot = self.find(key)?;
        Some(&mut self.slots[slot as usize].value)
    }

    /// Files `from`'s state under `to` (a key not in the table), its
    /// recency unchanged. Not a use.
    pub fn rekey(&mut self, from: &K, to: K) {
        debug_assert!(self.find(&to).is_none(), "rekeyed onto a key in use");
        let Some(slot) = self.find(from) else { return };
        self.index
            .find_entry(hash(from), |&s| s == slot)
            .expect("an indexed slot")
            .remove();
        self.slots[slot as usize].key = to;
        self.index_insert(&to, slot);
        if self.last.is_some_and(|(_, s)| s == slot) {
            self.last = Some((to, slot));
        }
    }

    /// The state of the flow accessed last (by [`get_or_insert`](Self::get_or_insert)).
    pub fn last_mut(&mut self) -> Option<&mut V> {
        let (_, slot) = self.last?;
        Some(&mut self.slots[slot as usize].value)
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
        (self.slots.capacity() * size_of::<Slot<K, V>>()
            + self.queue.capacity() * size_of::<(u64, u32)>()
            + buckets * (size_of::<u32>() + 1)) as u64
    }

    /// All keys and states, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.slots.iter().map(|s| (&s.key, &s.value))
    }

    /// All flows' states, mutable, in no particular order; not uses.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.slots.iter_mut().map(|s| &mut s.value)
    }

    /// Evicts flows, least recently used first, while `more` (shown each
    /// one's state before it goes) says so; hands them back. Compacts the
    /// slab: O(table) a call, for evicting many at once.
    pub fn evict_oldest_while(&mut self, mut more: impl FnMut(&V) -> bool) -> Vec<(K, V)> {
        let mut evict = vec![false; self.slots.len()];
        while let Some(&(t, s)) = self.queue.front() {
            let live = self.slots[s as usize].stamp == t;
            if live && !more(&self.slots[s as usize].value) {
                break;
            }
            self.queue.pop_front();
            evict[s as usize] |= live;
        }
        if !evict.contains(&true) {
            return Vec::new();
        }
        // Survivors move down into structures their size, so that what
        // the evicted took is given back; `moved[old slot]` is the new one.
        let survivors = evict.iter().filter(|&&e| !e).count();
        let mut moved = vec![u32::MAX; evict.len()];
        let slots = std::mem::replace(&mut self.slots, Vec::with_capacity(survivors));
        self.index = HashTable::with_capacity(survivors);
        let mut evicted = Vec::new();
        for (i, slot) in slots.into_iter().enumerate() {
            if evict[i] {
                evicted.push((slot.key, slot.value));
            } else {
                moved[i] = self.slots.len() as u32;
                let key = slot.key;
                self.slots.push(slot);
                self.index_insert(&key, moved[i]);
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

/// Asks the CPU for every cache line of `v` at once, so that the state's
/// fields the segment reads next come in together, not one miss after
/// another.
fn prefetch<T>(v: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = (v as *const T).cast::<i8>();
        for offset in (0..std::mem::size_of::<T>()).step_by(64) {
            // SAFETY: a prefetch is a hint that never faults, whatever the
            // address; this one is within `v`.
            unsafe { _mm_prefetch(p.wrapping_add(offset), _MM_HINT_T0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Flow;

    fn flow(port: u16) -> Flow {
        Flow {
            src: std::net::SocketAddr::from(([10, 0, 0, 1], port)),
            dst: std::net::SocketAddr::from(([10, 0, 0, 2], 80)),
        }
    }

    /// `get_or_insert`: the value, and the flow evicted for it.
    fn access<V: Copy>(t: &mut FlowTable<Flow, V>, f: Flow, fresh: V) -> (V, Option<(Flow, V)>) {
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

    /// A rekeyed state is found under its new key only, and keeps its
    /// place in the eviction order.
    #[test]
    fn rekeying_keeps_the_state_and_its_recency() {
        let mut t = FlowTable::new(3);
        for port in 1..=3 {
            access(&mut t, flow(port), u64::from(port));
        }
        t.rekey(&flow(1), flow(11));
        assert_eq!(t.peek(&flow(1)), None);
        assert_eq!(t.peek(&flow(11)), Some(&1));
        assert_eq!(
            access(&mut t, flow(4), 4).1.map(|(f, v)| (f.src.port(), v)),
            Some((11, 1))
        );
        t.rekey(&flow(4), flow(14));
        *t.last_mut().unwrap() += 10;
        assert_eq!(t.peek(&flow(14)), Some(&14));
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
