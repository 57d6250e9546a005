//! What the lab knows independently of the tracer: the order in which its
//! edge let segments go (recorded in the kernel at the steering point), the
//! table changes it made, and the kernels' own TCP counters.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;
use tracer_common::edge::{EdgeEvent, UNMATCHED};

/// One re-pointing of the flow-director table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TableChange {
    /// CLOCK_MONOTONIC, as the kernel's timestamps.
    pub ts_ns: u64,
    pub client_port: u16,
    pub from_queue: u32,
    pub to_queue: u32,
}

/// One flow direction (client -> server) at the edge.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FlowTruth {
    pub client_port: u16,
    /// Data segments that left the edge.
    pub segments: u64,
    /// Original (first-sent) segments that left after a segment that
    /// entered the edge after them, carrying bytes no earlier segment had
    /// carried out: the reordering the edge caused, as the receiver meets
    /// it.
    pub late: u64,
    /// ... of which the segment that overtook them (the latest-entered one
    /// gone before) took another queue or CPU.
    pub late_on_another_path: u64,
    /// Late, but a retransmission had already carried their bytes out:
    /// the receiver gets them as duplicates.
    pub late_already_delivered: u64,
    /// Late retransmissions (the original was lost on the way or is still
    /// behind): the receiver's loss recovery, not reordered originals.
    pub late_retransmissions: u64,
    /// Segments whose ingress decision was not found (see `UNMATCHED`).
    pub unmatched: u64,
    /// Times the flow's queue changed between consecutive segments in
    /// order (what a receiver sees as queue migrations).
    pub queue_changes: u64,
    /// Segments per (queue, CPU) they were steered to (in JSON keyed
    /// `queue Q cpu C`).
    #[serde(serialize_with = "path_names")]
    pub paths: BTreeMap<(u32, u32), u64>,
    /// TCP segments, data or not, that left on another queue than the one
    /// RSS picks for the flow (counted by the edge's egress program).
    pub off_rss: u64,
    /// The latest-entered segment gone so far: (index, queue, CPU).
    #[serde(skip)]
    newest: Option<(u64, u32, u32)>,
    /// Sequence numbers already carried out.
    #[serde(skip)]
    delivered: HashSet<u32>,
}

fn path_names<S: serde::Serializer>(
    paths: &BTreeMap<(u32, u32), u64>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(
        paths
            .iter()
            .map(|((queue, cpu), n)| (format!("queue {queue} cpu {cpu}"), n)),
    )
}

/// The ground truth of one lab run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Truth {
    pub flows: Vec<FlowTruth>,
    pub table_changes: Vec<TableChange>,
    /// Why the ground-truth file stopped being written, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_error: Option<String>,
}

impl Truth {
    /// Takes the edge's events in the order they left it.
    pub fn observe(&mut self, ev: &EdgeEvent) {
        let port = (ev.flow >> 16) as u16;
        let at = match self.flows.iter().position(|f| f.client_port == port) {
            Some(at) => at,
            None => {
                self.flows.push(FlowTruth {
                    client_port: port,
                    ..Default::default()
                });
                self.flows.len() - 1
            }
        };
        let f = &mut self.flows[at];
        f.segments += 1;
        let first_copy = f.delivered.insert(ev.seq);
        if ev.index == UNMATCHED {
            f.unmatched += 1;
            return;
        }
        // The CPU that carried it out of the edge is the one the server's
        // receive path runs on for it.
        let cpu = ev.egress_cpu;
        *f.paths.entry((ev.queue, cpu)).or_default() += 1;
        match f.newest {
            Some((index, queue, newest_cpu)) if ev.index < index => {
                if !first_copy {
                    f.late_already_delivered += 1;
                    return;
                }
                if ev.retransmission != 0 {
                    f.late_retransmissions += 1;
                    return;
                }
                f.late += 1;
                if (queue, newest_cpu) != (ev.queue, cpu) {
                    f.late_on_another_path += 1;
                }
            }
            previous => {
                if previous.is_some_and(|(_, queue, _)| queue != ev.queue) {
                    f.queue_changes += 1;
                }
                f.newest = Some((ev.index, ev.queue, cpu));
            }
        }
    }

    pub fn flow(&self, client_port: u16) -> Option<&FlowTruth> {
        self.flows.iter().find(|f| f.client_port == client_port)
    }

    pub fn late(&self) -> u64 {
        self.flows.iter().map(|f| f.late).sum()
    }

    /// The fewest late segments of any of the first `flows` flows to
    /// leave the edge (0 while fewer have).
    pub fn fewest_late(&self, flows: usize) -> u64 {
        if self.flows.len() < flows.max(1) {
            return 0;
        }
        self.flows.iter().map(|f| f.late).min().unwrap_or(0)
    }

    pub fn late_on_another_path(&self) -> u64 {
        self.flows.iter().map(|f| f.late_on_another_path).sum()
    }
}

/// One line of the ground-truth file (`tracer lab --truth FILE`).
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TruthRecord<'a> {
    /// A data segment leaving the edge towards the server, in that order.
    Segment {
        client_port: u16,
        /// Its place in the flow's arrival order at the edge (null: not
        /// known).
        index: Option<u64>,
        seq: u32,
        payload_len: u32,
        queue: u32,
        /// The CPU it was steered to or arrived on, and the one it left on.
        cpu: u32,
        egress_cpu: u32,
        ingress_ns: u64,
        egress_ns: u64,
        retransmission: bool,
    },
    TableChange(&'a TableChange),
}

impl<'a> TruthRecord<'a> {
    pub fn segment(ev: &EdgeEvent) -> Self {
        TruthRecord::Segment {
            client_port: (ev.flow >> 16) as u16,
            index: (ev.index != UNMATCHED).then_some(ev.index),
            seq: ev.seq,
            payload_len: ev.payload_len,
            queue: ev.queue,
            cpu: ev.cpu,
            egress_cpu: ev.egress_cpu,
            ingress_ns: ev.ingress_ns,
            egress_ns: ev.egress_ns,
            retransmission: ev.retransmission != 0,
        }
    }
}

/// The TcpExt counters (`nstat`'s source) of the calling thread's network
/// namespace, for the given names.
pub fn tcp_ext(names: &[&str]) -> BTreeMap<String, u64> {
    let full: Vec<String> = names.iter().map(|n| format!("TcpExt{n}")).collect();
    nstat(&full.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Counters of the calling thread's network namespace by their `nstat`
/// names (group and key: `TcpRetransSegs`, `TcpExtPAWSEstab`), from
/// `/proc/net/snmp` and `/proc/net/netstat`.
pub fn nstat(names: &[&str]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for file in ["snmp", "netstat"] {
        let text =
            std::fs::read_to_string(format!("/proc/thread-self/net/{file}")).unwrap_or_default();
        let mut lines = text.lines();
        while let (Some(keys), Some(values)) = (lines.next(), lines.next()) {
            let (Some((group, keys)), Some((_, values))) =
                (keys.split_once(": "), values.split_once(": "))
            else {
                continue;
            };
            for (k, v) in keys.split_whitespace().zip(values.split_whitespace()) {
                let name = format!("{group}{k}");
                if names.contains(&name.as_str()) {
                    out.insert(name, v.parse().unwrap_or(0));
                }
            }
        }
    }
    out
}

/// Receiver counters worth showing next to the tracer's.
pub const RECEIVER_COUNTERS: &[&str] = &[
    "TCPOFOQueue",
    "TCPOFODrop",
    "TCPOFOMerge",
    "PAWSEstab",
    // Segments received entirely below rcv_nxt: duplicates (a spurious
    // retransmission or its late original), DSACKed when SACK is on.
    "DelayedACKLost",
    // DSACKs sent for them, and for segments already queued out of order
    // (none with `--no-dsack`).
    "TCPDSACKOldSent",
    "TCPDSACKOfoSent",
    // Segments the socket's full backlog dropped: past XDP, never at TCP.
    "TCPBacklogDrop",
    // Segments TCP dropped for want of receive memory or window, and
    // queues it pruned: seen at XDP, gone at TCP, so that later segments
    // are queued out of order there and not at XDP.
    "TCPRcvQDrop",
    "TCPZeroWindowDrop",
    "PruneCalled",
    "RcvPruned",
    "OfoPruned",
];
/// Sender counters: reordering its loss detection noticed, and spurious
/// retransmissions the receiver reported.
pub const SENDER_COUNTERS: &[&str] = &[
    "TCPSACKReorder",
    "TCPTSReorder",
    "TCPRenoReorder",
    "TCPDSACKRecv",
    "TCPFastRetrans",
    "TCPLostRetransmit",
    // Recoveries entered, and undone (timestamps: full or partial; DSACK).
    "TCPSackRecovery",
    "TCPFullUndo",
    "TCPPartialUndo",
    "TCPDSACKUndo",
    // Tail loss probes sent, and those a DSACK showed unnecessary.
    "TCPLossProbes",
    "TCPLossProbeRecovery",
    // Recoveries without SACK (NewReno); retransmission timeouts, and
    // those F-RTO found spurious.
    "TCPRenoRecovery",
    "TCPTimeouts",
    "TCPSpuriousRTOs",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Segment `index` (entered the edge `index`-th, bytes at 1000 * index).
    fn ev(index: u64, queue: u32, cpu: u32) -> EdgeEvent {
        EdgeEvent {
            index,
            flow: 40_000 << 16 | 5201,
            seq: 1000 * index as u32,
            queue,
            cpu,
            egress_cpu: cpu,
            ..Default::default()
        }
    }

    #[test]
    fn late_is_leaving_after_a_later_entrant() {
        let mut t = Truth::default();
        // 0 1 on queue 0; the flow moves to queue 1: 4 5 overtake 2 3.
        for e in [
            ev(0, 0, 0),
            ev(1, 0, 0),
            ev(4, 1, 1),
            ev(2, 0, 0),
            ev(5, 1, 1),
        ]
        .iter()
        .chain(&[ev(3, 0, 0), ev(6, 1, 1)])
        {
            t.observe(e);
        }
        let f = t.flow(40_000).unwrap();
        assert_eq!((f.segments, f.late, f.late_on_another_path), (7, 2, 2));
        assert_eq!(f.paths[&(0, 0)], 4);
        let json = serde_json::to_value(f).expect("serializable");
        assert_eq!(json["paths"]["queue 0 cpu 0"], 4);
        assert_eq!(f.queue_changes, 1);
    }

    #[test]
    fn a_late_original_behind_its_own_retransmission_delivers_nothing() {
        let mut t = Truth::default();
        // 1 is stuck; 2 and 1's retransmission (entered 3rd) leave first.
        let rtx = EdgeEvent {
            index: 3,
            ..ev(1, 1, 1)
        };
        let unmatched = EdgeEvent {
            index: UNMATCHED,
            ..ev(4, 1, 1)
        };
        for e in [ev(0, 0, 0), ev(2, 1, 1), rtx, ev(1, 0, 0), unmatched] {
            t.observe(&e);
        }
        let f = t.flow(40_000).unwrap();
        assert_eq!(f.late, 0);
        assert_eq!(f.late_already_delivered, 1);
        assert_eq!(f.unmatched, 1);
    }

    #[test]
    fn same_path_lateness_is_told_apart() {
        let mut t = Truth::default();
        for e in [ev(0, 0, 0), ev(2, 0, 0), ev(1, 0, 0)] {
            t.observe(&e);
        }
        assert_eq!(t.late(), 1);
        assert_eq!(t.late_on_another_path(), 0);
    }

    #[test]
    fn a_late_retransmission_is_not_a_reordered_original() {
        let mut t = Truth::default();
        // 1 was lost inside the edge; its retransmission entered 3rd and
        // was overtaken by 4.
        let rtx = EdgeEvent {
            index: 3,
            retransmission: 1,
            ..ev(1, 1, 1)
        };
        for e in [ev(0, 0, 0), ev(2, 0, 0), ev(4, 1, 1), rtx] {
            t.observe(&e);
        }
        let f = t.flow(40_000).unwrap();
        assert_eq!((f.late, f.late_retransmissions), (0, 1));
    }

    #[test]
    fn reads_this_namespaces_tcp_ext() {
        let c = tcp_ext(&["TCPOFOQueue", "NoSuchCounter"]);
        assert!(c.contains_key("TcpExtTCPOFOQueue"), "{c:?}");
        assert_eq!(c.len(), 1);
    }
}
