//! Traffic statistics over the observation stream, the one-line progress
//! summary printed every second, and the final summary.

use std::{collections::HashMap, fmt::Write as _, time::Duration};

use crate::{
    kernel::Counters,
    record::Sink,
    source::{Flow, Observation},
};
use tracer_common::counter;

/// Flows tracked individually; beyond this they are counted, not itemised.
pub const MAX_TRACKED_FLOWS: usize = 65_536;

#[derive(Clone, Debug, Default)]
pub struct FlowStats {
    /// XDP segments (any flags) and the payload bytes they carried.
    pub segments: u64,
    pub data_segments: u64,
    pub payload_bytes: u64,
    /// `tcp_probe` events and their payload bytes (GRO may merge segments).
    pub probes: u64,
    pub probe_bytes: u64,
    pub retransmits: u64,
    /// (RX queue, segments) and (CPU, segments), in first-seen order.
    pub rx_queues: Vec<(u32, u64)>,
    pub cpus: Vec<(u32, u64)>,
    pub first_ns: u64,
    pub last_ns: u64,
}

fn bump(list: &mut Vec<(u32, u64)>, key: u32) {
    match list.iter_mut().find(|(k, _)| *k == key) {
        Some((_, n)) => *n += 1,
        None => list.push((key, 1)),
    }
}

/// Totals and per-flow statistics of everything observed.
#[derive(Clone, Debug, Default)]
pub struct TrafficStats {
    pub segments: u64,
    pub payload_bytes: u64,
    pub probes: u64,
    pub retransmits: u64,
    pub flows: HashMap<Flow, FlowStats>,
    /// Observations of flows beyond [`MAX_TRACKED_FLOWS`].
    pub untracked: u64,
    /// Values at the previous progress line, for rates.
    last_segments: u64,
    last_bytes: u64,
    last_probes: u64,
}

impl TrafficStats {
    fn flow(&mut self, flow: Flow, ts_ns: u64) -> Option<&mut FlowStats> {
        if !self.flows.contains_key(&flow) && self.flows.len() >= MAX_TRACKED_FLOWS {
            self.untracked += 1;
            return None;
        }
        let f = self.flows.entry(flow).or_insert_with(|| FlowStats {
            first_ns: ts_ns,
            ..Default::default()
        });
        f.last_ns = ts_ns;
        Some(f)
    }

    /// Flows that carried data, busiest first.
    pub fn data_flows(&self) -> Vec<(&Flow, &FlowStats)> {
        let mut v: Vec<_> = self
            .flows
            .iter()
            .filter(|(_, f)| f.payload_bytes > 0 || f.probe_bytes > 0)
            .collect();
        v.sort_by(|a, b| b.1.payload_bytes.cmp(&a.1.payload_bytes).then(a.0.cmp(b.0)));
        v
    }

    /// One line: rates since the previous call, flows, dropped events.
    pub fn progress_line(
        &mut self,
        elapsed: Duration,
        interval: Duration,
        counters: &Counters,
    ) -> String {
        let secs = interval.as_secs_f64().max(1e-9);
        let seg_rate = (self.segments - self.last_segments) as f64 / secs;
        let mbit = (self.payload_bytes - self.last_bytes) as f64 * 8.0 / secs / 1e6;
        let probe_rate = (self.probes - self.last_probes) as f64 / secs;
        self.last_segments = self.segments;
        self.last_bytes = self.payload_bytes;
        self.last_probes = self.probes;
        let dropped = counters.dropped();
        format!(
            "[{:>5.1}s] {:>9} seg/s {:>9.1} Mbit/s  tcp_probe {:>9}/s  flows {:>5}  dropped {}{}",
            elapsed.as_secs_f64(),
            si(seg_rate),
            mbit,
            si(probe_rate),
            self.flows.len(),
            dropped,
            if dropped > 0 { "  <-- EVENTS LOST" } else { "" }
        )
    }

    /// The final summary: totals, kernel counters, the busiest flows.
    pub fn summary(&self, elapsed: Duration, counters: &Counters, header: &str) -> String {
        let mut out = String::new();
        let secs = elapsed.as_secs_f64().max(1e-9);
        let _ = writeln!(out, "{header}");
        let _ = writeln!(
            out,
            "  segments   {} seen by XDP ({} with data, {:.1} MB payload, {:.1} Mbit/s)",
            self.segments,
            self.flows.values().map(|f| f.data_segments).sum::<u64>(),
            self.payload_bytes as f64 / 1e6,
            self.payload_bytes as f64 * 8.0 / secs / 1e6
        );
        let _ = writeln!(
            out,
            "  tcp layer  {} tcp_probe events, {} local retransmissions",
            self.probes, self.retransmits
        );
        let _ = writeln!(
            out,
            "  flows      {} ({} with data){}",
            self.flows.len(),
            self.data_flows().len(),
            if self.untracked > 0 {
                format!(
                    ", {} observations of flows beyond the {MAX_TRACKED_FLOWS} tracked",
                    self.untracked
                )
            } else {
                String::new()
            }
        );
        let ring_full = counters.ring_full();
        if ring_full > 0 {
            let _ = writeln!(
                out,
                "  DROPPED    {ring_full} events lost: the ring buffer was full (XDP {}, tcp_probe {}, retransmit {}). Results are incomplete; try a larger --ring-mib or a --filter.",
                counters.get(counter::XDP_DROPPED),
                counters.get(counter::PROBE_DROPPED),
                counters.get(counter::RTX_DROPPED),
            );
        } else {
            let _ = writeln!(out, "  dropped    0 events");
        }
        let (probe_lost, rtx_lost) = (counters.probe_lost(), counters.rtx_lost());
        if probe_lost + rtx_lost > 0 {
            let hits = counters.get(counter::PROBE_SEEN) + probe_lost;
            let _ = writeln!(
                out,
                "  MISSED     {probe_lost} of {hits} tcp_probe and {rtx_lost} retransmit events: the kernel did not run the program, it was already running on that CPU",
            );
        }
        let _ = writeln!(
            out,
            "  kernel     frames {}, TCP {}, non-TCP {}, truncated {}, unsupported headers {}, IP fragments {}, filtered {}, read errors {}",
            counters.get(counter::XDP_FRAMES),
            counters.get(counter::XDP_TCP),
            counters.get(counter::XDP_NON_TCP),
            counters.get(counter::XDP_TRUNCATED),
            counters.get(counter::XDP_UNSUPPORTED),
            counters.get(counter::XDP_FRAGMENTS),
            counters.get(counter::XDP_FILTERED),
            counters.get(counter::PROBE_READ_ERRORS) + counters.get(counter::RTX_READ_ERRORS),
        );
        let flows = self.data_flows();
        if !flows.is_empty() {
            let _ = writeln!(out, "  busiest flows:");
        }
        for (flow, f) in flows.iter().take(10) {
            let _ = writeln!(
                out,
                "    {flow}  {} segments, {:.1} MB, {} tcp_probe{}, rx queues {}, cpus {}{}",
                f.data_segments,
                f.payload_bytes as f64 / 1e6,
                f.probes,
                tcp_layer_hole(f),
                spread(&f.rx_queues),
                spread(&f.cpus),
                if f.retransmits > 0 {
                    format!(", {} retransmitted", f.retransmits)
                } else {
                    String::new()
                }
            );
        }
        if flows.len() > 10 {
            let _ = writeln!(out, "    ... and {} more", flows.len() - 10);
        }
        out
    }
}

impl Sink for TrafficStats {
    fn observe(&mut self, obs: &Observation) {
        match obs {
            Observation::Segment(s) => {
                self.segments += 1;
                self.payload_bytes += u64::from(s.payload_len);
                if let Some(f) = self.flow(s.flow, s.ts_ns) {
                    f.segments += 1;
                    if s.payload_len > 0 {
                        f.data_segments += 1;
                        f.payload_bytes += u64::from(s.payload_len);
                    }
                    bump(&mut f.rx_queues, s.rx_queue);
                    bump(&mut f.cpus, s.cpu);
                }
            }
            Observation::TcpProbe(p) => {
                self.probes += 1;
                if let Some(f) = self.flow(p.flow, p.ts_ns) {
                    f.probes += 1;
                    f.probe_bytes += u64::from(p.payload_len);
                }
            }
            Observation::Retransmit(r) => {
                self.retransmits += 1;
                if let Some(f) = self.flow(r.flow, r.ts_ns) {
                    f.retransmits += 1;
                }
            }
        }
    }
}

/// When TCP's receive path was seen carrying visibly less payload than XDP
/// saw arrive (the kernel did not run the tcp_probe program for some
/// segments; XDP is the complete view), how much it saw.
fn tcp_layer_hole(f: &FlowStats) -> String {
    if f.probes == 0 || f.probe_bytes * 1000 >= f.payload_bytes * 999 {
        return String::new();
    }
    format!(
        " (covering only {:.1}% of the payload)",
        f.probe_bytes as f64 * 100.0 / f.payload_bytes.max(1) as f64
    )
}

/// `0:61% 1:39%`: how segments spread over queues or CPUs.
fn spread(list: &[(u32, u64)]) -> String {
    let total: u64 = list.iter().map(|(_, n)| n).sum();
    let mut sorted = list.to_vec();
    sorted.sort();
    sorted
        .iter()
        .map(|(k, n)| format!("{k}:{:.0}%", *n as f64 * 100.0 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(" ")
}

/// 1234567 -> "1.23M".
fn si(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Segment;

    fn seg(port: u16, len: u32, queue: u32) -> Observation {
        Observation::Segment(Segment {
            ts_ns: 1,
            ifindex: 1,
            rx_queue: queue,
            cpu: 0,
            flow: Flow {
                src: format!("10.0.0.1:{port}").parse().unwrap(),
                dst: "10.0.0.2:80".parse().unwrap(),
            },
            seq: 0,
            ack: 0,
            payload_len: len,
            flags: 0x10,
            window: 0,
            ip_id: None,
            timestamp: None,
            sack: vec![],
            vlan: None,
            first_fragment: false,
        })
    }

    #[test]
    fn counts_flows_queues_and_rates() {
        let mut s = TrafficStats::default();
        for q in [0, 1, 1, 1] {
            s.observe(&seg(1000, 100, q));
        }
        s.observe(&seg(1001, 0, 0));
        assert_eq!(s.segments, 5);
        assert_eq!(s.payload_bytes, 400);
        assert_eq!(s.data_flows().len(), 1);
        let f = &s.data_flows()[0].1;
        assert_eq!(spread(&f.rx_queues), "0:25% 1:75%");
        let line = s.progress_line(
            Duration::from_secs(1),
            Duration::from_secs(1),
            &Counters::default(),
        );
        assert!(line.contains("5 seg/s"), "{line}");
        assert!(line.contains("0.0 Mbit/s"), "{line}"); // 3.2 kbit
        assert!(line.contains("flows     2"), "{line}");
    }

    #[test]
    fn tcp_layer_holes_are_shown() {
        let mut f = FlowStats {
            probes: 10,
            payload_bytes: 1000,
            probe_bytes: 999,
            ..Default::default()
        };
        assert_eq!(tcp_layer_hole(&f), "");
        f.probe_bytes = 900;
        assert_eq!(tcp_layer_hole(&f), " (covering only 90.0% of the payload)");
        f.probes = 0;
        assert_eq!(tcp_layer_hole(&f), "");
    }

    #[test]
    fn dropped_events_are_shouted() {
        let mut c = Counters::default();
        c.map[counter::XDP_DROPPED as usize] = 7;
        // 10 hits: 6 ran the first copy, 4 skipped it; 8 were handled.
        c.map[counter::PROBE_FIRST_COPY_RUNS as usize] = 6;
        c.probe_first_copy_misses = 4;
        c.map[counter::PROBE_SEEN as usize] = 8;
        let mut s = TrafficStats::default();
        assert!(s
            .progress_line(Duration::ZERO, Duration::from_secs(1), &c)
            .contains("EVENTS LOST"));
        let text = s.summary(Duration::from_secs(1), &c, "x");
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
    fn flow_table_is_bounded() {
        let mut s = TrafficStats::default();
        for i in 0..(MAX_TRACKED_FLOWS + 3) {
            let flow = Flow {
                src: std::net::SocketAddr::new(
                    [10, 0, (i >> 8) as u8, i as u8].into(),
                    (i >> 16) as u16 + 1,
                ),
                dst: "10.0.0.2:80".parse().unwrap(),
            };
            s.observe(&Observation::Retransmit(crate::source::Retransmit {
                ts_ns: 0,
                cpu: 0,
                flow,
                seq: 0,
                end_seq: 0,
                flags: 0,
                err: 0,
            }));
        }
        assert_eq!(s.flows.len(), MAX_TRACKED_FLOWS);
        assert_eq!(s.untracked, 3);
    }
}
