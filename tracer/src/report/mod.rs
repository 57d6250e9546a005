//! Renders a [`Snapshot`]: the one-line progress summary printed every
//! second ([`progress`]), the final text report ([`text`]), the replay's
//! report ([`replay`]) and the JSON report.

mod progress;
mod replay;
mod text;

pub use progress::progress_line;
pub use replay::replay_text;
pub use text::{text, TextOptions};

use std::io::Write;

use crate::snapshot::Snapshot;

/// Writes the JSON report (the snapshot, with `extra`'s key and value at
/// its top level) to `out` as it serialises: a report of 65,536
/// connections is some 400 MB, which a copy as a `Value` and again as a
/// string had taken seconds to make.
pub fn write_json(
    snapshot: &Snapshot,
    extra: Option<(&str, serde_json::Value)>,
    out: impl Write,
) -> std::io::Result<()> {
    #[derive(serde::Serialize)]
    struct WithExtra<'a> {
        #[serde(flatten)]
        snapshot: &'a Snapshot,
        #[serde(flatten)]
        extra: Option<std::collections::BTreeMap<&'a str, serde_json::Value>>,
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 20, out);
    let report = WithExtra {
        snapshot,
        extra: extra.map(|(k, v)| [(k, v)].into()),
    };
    serde_json::to_writer_pretty(&mut out, &report).map_err(std::io::Error::from)?;
    writeln!(out)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        engine::{Engine, EngineConfig},
        kernel::Counters,
        snapshot::Live,
        source::{Flow, Observation, Segment},
    };
    use tracer_common::counter;

    fn engine_with(order: &[(u32, u32)]) -> Engine {
        let mut e = Engine::new(EngineConfig::default());
        let flow = Flow {
            src: "10.0.0.1:1000".parse().unwrap(),
            dst: "10.0.0.2:80".parse().unwrap(),
        };
        for (i, &(n, q)) in order.iter().enumerate() {
            e.observe(&Observation::Segment(Segment {
                ts_ns: i as u64 * 1000,
                ifindex: 1,
                rx_queue: q,
                cpu: q,
                flow,
                seq: 1 + n * 100,
                ack: 0,
                payload_len: 100,
                flags: 0x10,
                window: 0,
                ip_id: None,
                timestamp: Some((n, 0)),
                sack: vec![],
                vlan: None,
                first_fragment: false,
                summarized_before: 0,
                summarized_end: None,
            }));
        }
        e
    }

    #[test]
    fn text_report_names_the_verdict_and_its_evidence() {
        let e = engine_with(&[(0, 0), (1, 0), (3, 1), (4, 1), (2, 0), (5, 1)]);
        let text = text(
            &e.snapshot(),
            Some(&Counters::default()),
            None,
            Duration::from_secs(1),
            "hdr",
            TextOptions::default(),
        );
        assert!(
            text.contains("1 reordered (16.7%)") || text.contains("1 reordered (17%)"),
            "{text}"
        );
        assert!(
            text.contains("nic-steering: 1 of 6 segments reordered"),
            "{text}"
        );
        assert!(
            text.contains("1 of 1 reordered segments overtaken on another RX queue or CPU"),
            "{text}"
        );
        assert!(
            text.contains("verdicts: nic-steering 1, upstream 0, mixed 0, none 0"),
            "{text}"
        );
        assert!(text.contains("dropped    0 events"), "{text}");
        assert!(
            text.contains("memory     the flows held 0 MB at most, of the 512 MB"),
            "{text}"
        );
        assert!(!text.contains("MEMORY"), "{text}");
    }

    #[test]
    fn text_report_says_what_the_memory_budget_took() {
        let mut s = engine_with(&[(0, 0), (1, 0)]).snapshot();
        s.memory.ack_logs_shed = 7;
        s.memory.evicted_for_memory = 2;
        let text = text(
            &s.with_resident(300 << 20),
            Some(&Counters::default()),
            None,
            Duration::from_secs(1),
            "hdr",
            TextOptions::default(),
        );
        assert!(
            text.contains("memory     300 MB peak resident; the flows held"),
            "{text}"
        );
        assert!(
            text.contains("MEMORY     to stay within the budget: 7 flows' ACK-level replay logs given up (those flows were replayed from the wire), 2 flows evicted"),
            "{text}"
        );
    }

    #[test]
    fn progress_line_rates_and_drops() {
        let prev = Live::default();
        let now = Live {
            segments: 5,
            payload_bytes: 400,
            probes: 2,
            reordered: 1,
            flows: 2,
            memory: crate::snapshot::Memory {
                budget_bytes: 400 << 20,
                held_bytes: 3 << 20,
                ..Default::default()
            },
        };
        let mut c = Counters::default();
        let line = progress_line(
            &now,
            &prev,
            Duration::from_secs(1),
            Duration::from_secs(1),
            &c,
            &Counters::default(),
            48 << 20,
        );
        assert!(line.contains("5 seg/s"), "{line}");
        assert!(line.contains("flows     2"), "{line}");
        assert!(line.contains("rss   48 MB (flows 3/400)"), "{line}");
        assert!(
            !line.contains("LOST") && !line.contains("OVERLOAD") && !line.contains("MEMORY"),
            "{line}"
        );
        let shed = Live {
            memory: crate::snapshot::Memory {
                ack_logs_shed: 12,
                evicted_for_memory: 3,
                ..now.memory
            },
            ..now
        };
        assert!(progress_line(
            &shed,
            &prev,
            Duration::ZERO,
            Duration::from_secs(1),
            &c,
            &Counters::default(),
            0
        )
        .contains("MEMORY: 12 replay logs, 3 flows given up"));
        c.map[counter::OVERLOAD_ENTERED as usize] = 1;
        assert!(progress_line(
            &now,
            &prev,
            Duration::ZERO,
            Duration::from_secs(1),
            &c,
            &Counters::default(),
            0
        )
        .contains("OVERLOAD: summarizing"));
        c.map[counter::XDP_DROPPED as usize] = 7;
        assert!(progress_line(
            &now,
            &prev,
            Duration::ZERO,
            Duration::from_secs(1),
            &c,
            &Counters::default(),
            0
        )
        .contains("EVENTS LOST"));
    }

    #[test]
    fn dropped_and_missed_events_are_shouted() {
        let mut c = Counters::default();
        c.map[counter::XDP_DROPPED as usize] = 7;
        // 10 hits: 6 ran the first copy, 4 skipped it; 8 were handled.
        c.map[counter::PROBE_FIRST_COPY_RUNS as usize] = 6;
        c.probe_first_copy_misses = 4;
        c.map[counter::PROBE_SEEN as usize] = 8;
        let e = engine_with(&[(0, 0)]);
        let text = text(
            &e.snapshot(),
            Some(&c),
            None,
            Duration::from_secs(1),
            "x",
            TextOptions::default(),
        );
        assert!(
            text.contains("DROPPED    7 events lost: the ring buffer was full"),
            "{text}"
        );
        assert!(
            text.contains("MISSED     2 of 10 tcp_probe and 0 retransmit events"),
            "{text}"
        );
        assert_eq!(c.dropped(), 9);
    }

    #[test]
    fn json_report_carries_kernel_drops_and_its_extra() {
        let mut c = Counters::default();
        c.map[counter::XDP_DROPPED as usize] = 3;
        let e = engine_with(&[(0, 0), (1, 0)]);
        let mut out = Vec::new();
        let extra = ("reattached", serde_json::json!(2));
        write_json(&e.snapshot().with_kernel(&c), Some(extra), &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["totals"]["dropped_events"], 3);
        assert_eq!(v["totals"]["data_segments"], 2);
        assert_eq!(v["kernel"]["xdp_dropped"], 3);
        assert_eq!(v["reattached"], 2);
    }
}
