//! The edge's ground truth, segment by segment: what became of each
//! segment the lab's edge made late, by the tracer's own classes (its
//! observations replayed through the engine), for the lab's uploads and
//! for real clients' connections alike.

use std::{
    collections::HashSet,
    io::{BufRead, BufReader},
    path::Path,
};

use serde_json::Value;
use tracer::{
    engine::{Engine, EngineConfig},
    snapshot::Class,
    source::Observation,
};
use tracer_common::tcp_flags::SYN;

use super::u;

/// What became of the segments the edge made late, at the server, and of
/// the segments the tracer called reordered.
#[derive(Debug, Default)]
pub struct Account {
    /// Original segments the edge let go after a later-entered one.
    pub late: u64,
    /// Their first arrival at the server, by the tracer's class.
    classes: std::collections::BTreeMap<String, u64>,
    /// ... of which called in order, yet behind a later byte of the flow:
    /// misclassified (must be none).
    in_order_behind_later: u64,
    /// Late, ambiguous, and the segment that opened their hole had the
    /// same TSval and TSecr: nothing in the packet tells original from
    /// retransmission (IPv6, which has no IP ID).
    ambiguous_same_timestamps: u64,
    /// Arrivals the tracer called reordered that no later byte of their
    /// flow had arrived before (must be none).
    reordered_not_behind: u64,
    /// Late segments not among the observations: the kernel counted them
    /// without emitting them (the collector fell behind and the overload
    /// guard summarized: only segments that arrive in order are kept
    /// back).
    not_seen: u64,
}

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} late at the edge; at the server: {:?}; called in order behind a later byte {}; ambiguous with their hole's timestamps {}; reordered with no later byte before {}; not emitted {}",
            self.late,
            self.classes,
            self.in_order_behind_later,
            self.ambiguous_same_timestamps,
            self.reordered_not_behind,
            self.not_seen
        )
    }
}

impl Account {
    fn count(&self, class: &str) -> u64 {
        self.classes.get(class).copied().unwrap_or(0)
    }

    /// Every late segment reached the server and each is accounted for by
    /// what the arrival order itself shows; `on_the_way`: packets the
    /// kernel dropped between the edge and the server; `summarized`:
    /// segments the kernel counted without emitting them.
    pub fn check(&self, what: &str, ipv6: bool, on_the_way: u64, summarized: u64) {
        assert!(self.not_seen <= summarized, "{what}: {self}");
        assert_eq!(
            self.classes.values().sum::<u64>() + self.not_seen,
            self.late,
            "{what}: every late segment arrived: {self}"
        );
        // Reordered; or in order after all, the server's two CPUs having
        // put it back on the way (and then no later byte had arrived); or
        // behind its own retransmission, which overtook it after the edge.
        // With IPv6 the tracer may not know original from retransmission
        // when the timestamps say nothing (counted). Only its
        // retransmission arrives of one dropped on the way (counted).
        let ambiguous = if ipv6 {
            self.ambiguous_same_timestamps
        } else {
            0
        };
        let lost = self.count("Retransmission");
        assert!(lost <= on_the_way, "{what}: {self}");
        // (Kept back by the overload guard: in order on arrival.)
        assert_eq!(
            self.count("Reordered")
                + self.count("InOrder")
                + self.not_seen
                + self.count("RetransmissionFirst")
                + lost
                + ambiguous,
            self.late,
            "{what}: {self}"
        );
        assert_eq!(self.in_order_behind_later, 0, "{what}: {self}");
        assert_eq!(self.reordered_not_behind, 0, "{what}: {self}");
    }
}

/// Replays the tracer's observations (`--out obs.jsonl`, arrival order at
/// the server's XDP) through the engine and follows each segment the edge
/// made late (`--truth`), for every connection.
pub fn segment_by_segment(obs: &Path, truth: &Path) -> Account {
    let late = edge_late_segments(truth);
    let mut account = Account {
        late: late.len() as u64,
        ..Default::default()
    };
    let mut seen = HashSet::new();
    // Late segments whose retransmission reached the server first (it
    // overtook them after the edge): their first arrival is rightly a
    // retransmission if the original then arrives behind it, as its IP ID
    // or timestamps (the sender numbers packets in sending order) show.
    let mut retransmission_first = std::collections::HashMap::new();
    let mut original_behind = 0;
    // Per flow, the retransmissions that arrived: (start, end, IP ID,
    // timestamps). The sender may resend two segments as one, so a late
    // original can arrive as a duplicate of one that started lower.
    let mut retransmissions = std::collections::HashMap::<_, Vec<_>>::new();
    // Per flow, the highest sequence end that had arrived.
    let mut highest_end = std::collections::HashMap::<_, u32>::new();
    let mut engine = Engine::new(EngineConfig::default());
    for line in BufReader::new(std::fs::File::open(obs).unwrap()).lines() {
        let o: Observation = serde_json::from_str(&line.unwrap()).unwrap();
        let classified = engine.observe(&o);
        let Observation::Segment(s) = &o else {
            continue;
        };
        // A SYN begins the 4-tuple's next connection: its own sequence
        // space.
        if s.flags & SYN != 0 {
            highest_end.remove(&s.flow);
            retransmissions.remove(&s.flow);
        }
        let highest = highest_end.get(&s.flow).copied();
        let behind_later = highest.is_some_and(|h| (s.seq.wrapping_sub(h) as i32) < 0);
        let end = s.seq.wrapping_add(s.payload_len);
        if s.payload_len > 0 && highest.is_none_or(|h| (end.wrapping_sub(h) as i32) > 0) {
            highest_end.insert(s.flow, end);
        }
        let Some(c) = classified else {
            continue;
        };
        if c.class == Class::Reordered && !behind_later {
            account.reordered_not_behind += 1;
        }
        if c.class == Class::Retransmission {
            let copy = (s.seq, end, s.ip_id, s.timestamp);
            retransmissions.entry(s.flow).or_default().push(copy);
        }
        let key = (s.flow.src.port(), s.seq);
        if !late.contains(&key) {
            continue;
        }
        // Sent before a copy with this IP ID and these timestamps: an older
        // IP ID, or an older TSval.
        let sent_before =
            |id: Option<u16>, ts: Option<(u32, u32)>| match (id, s.ip_id, ts, s.timestamp) {
                (Some(first), Some(own), _, _) => (first.wrapping_sub(own) as i16) > 0,
                (_, _, Some((first, _)), Some((own, _))) => (first.wrapping_sub(own) as i32) > 0,
                _ => false,
            };
        // The first arrival of each late segment.
        if seen.insert(key) {
            if c.class == Class::InOrder && behind_later {
                account.in_order_behind_later += 1;
            }
            if c.class == Class::Ambiguous {
                let hole = c
                    .late
                    .map(|l| (l.discontinuity.tsval, l.discontinuity.tsecr));
                let own = s.timestamp.map(|(v, e)| (Some(v), Some(e)));
                if hole.is_some() && hole == own {
                    account.ambiguous_same_timestamps += 1;
                }
            }
            // A duplicate of a retransmission, sent after it, that covered
            // its bytes: behind its own retransmission too.
            let covered =
                |&&(start, end, id, ts): &&(u32, u32, Option<u16>, Option<(u32, u32)>)| {
                    (s.seq.wrapping_sub(start) as i32) >= 0
                        && (end.wrapping_sub(s.seq.wrapping_add(s.payload_len)) as i32) >= 0
                        && sent_before(id, ts)
                };
            let behind_resent = c.class == Class::Duplicate
                && retransmissions
                    .get(&s.flow)
                    .is_some_and(|r| r.iter().any(|copy| covered(&copy)));
            if c.class == Class::Retransmission {
                retransmission_first.insert(key, (s.ip_id, s.timestamp));
            } else if behind_resent {
                original_behind += 1;
            } else {
                *account.classes.entry(format!("{:?}", c.class)).or_default() += 1;
            }
        } else if let Some(&(first_id, first_ts)) = retransmission_first.get(&key) {
            if c.class == Class::Duplicate && sent_before(first_id, first_ts) {
                retransmission_first.remove(&key);
                original_behind += 1;
            }
        }
    }
    account.not_seen = late.len() as u64 - seen.len() as u64;
    *account
        .classes
        .entry("RetransmissionFirst".into())
        .or_default() += original_behind;
    *account.classes.entry("Retransmission".into()).or_default() +=
        retransmission_first.len() as u64;
    account.classes.retain(|_, n| *n > 0);
    account
}

/// (Client port, sequence number) of the original segments the edge let
/// go after a later-entered one of their flow, first copy out: an
/// independent reading of the `--truth` file.
fn edge_late_segments(path: &Path) -> HashSet<(u16, u32)> {
    let mut newest = std::collections::HashMap::new();
    let mut out_already = HashSet::new();
    let mut late = HashSet::new();
    for line in BufReader::new(std::fs::File::open(path).unwrap()).lines() {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if v["kind"] != "segment" {
            continue;
        }
        let key = (u(&v["client_port"]) as u16, u(&v["seq"]) as u32);
        let first = out_already.insert(key);
        let Some(index) = v["index"].as_u64() else {
            continue;
        };
        match newest.get(&key.0) {
            Some(&n) if index < n => {
                if first && v["retransmission"] == false {
                    late.insert(key);
                }
            }
            _ => {
                newest.insert(key.0, index);
            }
        }
    }
    late
}
