//! `--metrics-addr ADDR`: the fleet's view, served as OpenMetrics text
//! (prometheus-client) over HTTP at `/metrics` while the tracer runs.
//!
//! The collector updates the values once a second from the engine's totals
//! (the live snapshot, without replays) and the kernel's counters; a
//! thread of its own answers the scrapes. Off unless asked for; a bare
//! port listens on loopback only.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, Result};
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder},
    metrics::{counter::Counter, family::Family, gauge::Gauge, MetricType},
    registry::Registry,
};

use tracer_common::counter;

use crate::{
    kernel::Counters,
    snapshot::{Distribution, Snapshot},
    SetupError,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttributionLabel {
    attribution: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabel {
    verdict: &'static str,
}

/// A NIC statistic that says something about steering: its driver's name
/// and what it means (bounded: the driver's steering counters and one per
/// RX queue).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NicStatLabel {
    statistic: String,
    meaning: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlagLabel {
    flag: String,
}

/// A histogram whose buckets come whole from the engine's distributions
/// (shared by the registry and the updates).
#[derive(Clone, Debug, Default)]
struct Buckets(Arc<Mutex<HistogramValue>>);

#[derive(Debug, Default)]
struct HistogramValue {
    sum: f64,
    count: u64,
    /// (upper bound, count in the bucket), ascending, +Inf last.
    buckets: Vec<(f64, u64)>,
}

impl Buckets {
    /// From a distribution with buckets' upper bounds in `unit`s (e.g. µs
    /// as seconds: 1e-6).
    fn set(&self, d: &Distribution, unit: f64) {
        let mut b: Vec<(f64, u64)> = d
            .buckets
            .iter()
            .map(|&(upper, n)| (upper as f64 * unit, n))
            .collect();
        b.push((f64::INFINITY, 0));
        *self.0.lock().expect("metrics lock") = HistogramValue {
            sum: d.mean * d.count as f64 * unit,
            count: d.count,
            buckets: b,
        };
    }
}

impl EncodeMetric for Buckets {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = &*self.0.lock().expect("metrics lock");
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            h.sum, h.count, &h.buckets, None,
        )
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The values served, updated by [`Metrics::update`].
#[derive(Default)]
struct Values {
    segments: Counter,
    data_segments: Counter,
    reordered: Family<AttributionLabel, Counter>,
    retransmissions: Counter,
    n3_reordering: Gauge<f64, AtomicU64>,
    dropped_events: Counter,
    queue_migrations: Counter,
    cpu_migrations: Counter,
    flows: Family<VerdictLabel, Gauge>,
    tracked_flows: Gauge,
    evicted_flows: Counter,
    connections: Counter,
    reused_tuples: Counter,
    stale_segments: Counter,
    overload_switches: Counter,
    resident_bytes: Gauge,
    held_bytes: Gauge,
    memory_budget_bytes: Gauge,
    ack_logs_shed: Counter,
    evicted_for_memory: Counter,
    expired_idle: Counter,
    late_time: Buckets,
    extent: Buckets,
    rss_segments: Counter,
    rss_off_queue: Counter,
    nic_statistics: Family<NicStatLabel, Counter>,
    nic_private_flags: Family<FlagLabel, Gauge>,
    fix_suggested: Gauge,
    interface_down: Counter,
    interface_attached_again: Counter,
}

/// Raises a counter to `to` (totals only grow; after the live view's
/// reset they start over, and the counter holds until they pass it).
fn raise(c: &Counter, to: u64) {
    c.inc_by(to.saturating_sub(c.get()));
}

/// The registry, its values and the thread serving them.
pub struct Metrics {
    values: Arc<Values>,
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Bound, not yet served ([`Metrics::serve`]).
    pending: Mutex<Option<(TcpListener, Registry)>>,
    server: Mutex<Option<JoinHandle<()>>>,
}

impl Metrics {
    /// Binds `addr` (before anything is attached: a taken port fails
    /// first); connections wait until [`Metrics::serve`]. Every series
    /// carries `interface="IFACE"`; the host is the scrape's `instance`.
    pub fn bind(addr: SocketAddr, interface: &str) -> Result<Self> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            SetupError::BadArgument(format!("cannot listen on {addr} for metrics: {e}"))
        })?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let values = Arc::new(Values::default());
        let mut registry = Registry::with_prefix_and_labels(
            "tracer",
            [("interface".into(), interface.to_string().into())].into_iter(),
        );
        register(&mut registry, &values);
        Ok(Self {
            values,
            addr,
            stop: Arc::new(AtomicBool::new(false)),
            pending: Mutex::new(Some((listener, registry))),
            server: Mutex::new(None),
        })
    }

    /// Starts the serving thread (once; later calls do nothing): when the
    /// collection starts, after privileges were dropped, which is done
    /// with the process's one thread.
    pub fn serve(&self) -> Result<()> {
        let Some((listener, registry)) = self.pending.lock().expect("not poisoned").take() else {
            return Ok(());
        };
        let stop = Arc::clone(&self.stop);
        let server = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || serve(listener, registry, &stop))
            .context("starting the metrics thread")?;
        *self.server.lock().expect("not poisoned") = Some(server);
        Ok(())
    }

    /// New values: the engine's totals, the kernel's counters and the
    /// collector's resident memory.
    pub fn update(&self, s: &Snapshot, counters: &Counters, resident_bytes: u64) {
        let v = &self.values;
        let t = &s.totals;
        let r = &t.reordering;
        // (Summary mode: with the segments the kernel only counted.)
        raise(&v.segments, t.segments + counters.summarized().0);
        raise(&v.data_segments, r.data_segments);
        let a = &r.attribution;
        for (label, n) in [
            ("different_queue", a.different_queue),
            ("different_cpu", a.different_cpu),
            ("different_queue_and_cpu", a.different_queue_and_cpu),
            ("same_queue_same_cpu", a.same_queue_same_cpu),
        ] {
            raise(
                &v.reordered
                    .get_or_create(&AttributionLabel { attribution: label }),
                n,
            );
        }
        raise(&v.retransmissions, r.retransmissions);
        let n3 = r
            .n_reordering
            .iter()
            .find(|n| n.n == 3)
            .map_or(0.0, |n| n.degree);
        v.n3_reordering.set(n3);
        raise(&v.dropped_events, counters.dropped());
        raise(&v.queue_migrations, r.queue_migrations);
        raise(&v.cpu_migrations, r.cpu_migrations);
        for verdict in crate::snapshot::Verdict::ALL {
            let n = t.verdicts.get(&verdict).copied().unwrap_or(0);
            v.flows
                .get_or_create(&VerdictLabel {
                    verdict: verdict.as_str(),
                })
                .set(n as i64);
        }
        v.tracked_flows.set(s.tracked_flows as i64);
        raise(&v.evicted_flows, s.evicted_flows);
        raise(&v.connections, s.connections());
        raise(&v.reused_tuples, s.reused_tuples);
        raise(&v.stale_segments, t.stale_segments);
        raise(
            &v.overload_switches,
            counters.get(counter::OVERLOAD_ENTERED),
        );
        v.resident_bytes.set(resident_bytes as i64);
        v.held_bytes.set(s.memory.held_bytes as i64);
        v.memory_budget_bytes.set(s.memory.budget_bytes as i64);
        raise(&v.ack_logs_shed, s.memory.ack_logs_shed);
        raise(&v.evicted_for_memory, s.memory.evicted_for_memory);
        raise(&v.expired_idle, s.memory.expired_idle);
        v.late_time.set(&r.late_time_us, 1e-6);
        v.extent.set(&r.extent, 1.0);
        if let Some(rss) = &t.rss {
            raise(&v.rss_segments, rss.segments);
            raise(&v.rss_off_queue, rss.off_queue);
        }
        if let Some(nic) = &s.nic {
            for (name, d) in &nic.deltas {
                let label = NicStatLabel {
                    statistic: name.clone(),
                    meaning: d.meaning.label(),
                };
                raise(&v.nic_statistics.get_or_create(&label), d.delta);
            }
            for (flag, on) in &nic.end.private_flags {
                v.nic_private_flags
                    .get_or_create(&FlagLabel { flag: flag.clone() })
                    .set(i64::from(*on));
            }
        }
        v.fix_suggested.set(i64::from(s.fix.is_some()));
        if let Some(i) = &s.interface {
            raise(&v.interface_down, i.went_down);
            raise(&v.interface_attached_again, i.attached_again);
        }
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.server.get_mut().expect("not poisoned").take() {
            let _ = t.join();
        }
    }
}

fn register(r: &mut Registry, v: &Values) {
    r.register(
        "segments",
        "TCP segments XDP saw on the traced interface",
        v.segments.clone(),
    );
    r.register(
        "data_segments",
        "TCP segments with payload (summary mode: of those emitted)",
        v.data_segments.clone(),
    );
    r.register(
        "reordered_segments",
        "Late originals (RFC 4737 reordered, not retransmissions), by what overtook them: another RX queue, CPU, both, or the same path",
        v.reordered.clone(),
    );
    r.register(
        "retransmissions",
        "Segments the receiver got again after a hole (retransmitted)",
        v.retransmissions.clone(),
    );
    r.register(
        "n3_reordering_ratio",
        "RFC 5236 n-reordering for n=3 (the duplicate-ACK threshold): the share of segments that would trigger a classic sender's fast retransmit",
        v.n3_reordering.clone(),
    );
    r.register(
        "dropped_events",
        "Events the kernel lost (ring buffer full, tracepoint runs missed): the results miss them",
        v.dropped_events.clone(),
    );
    r.register(
        "queue_migrations",
        "Times a flow moved to another RX queue",
        v.queue_migrations.clone(),
    );
    r.register(
        "cpu_migrations",
        "Times a flow moved to another CPU",
        v.cpu_migrations.clone(),
    );
    r.register(
        "flows",
        "Tracked flows by verdict (nic-steering: the Flow Director ATR signature)",
        v.flows.clone(),
    );
    r.register(
        "tracked_flows",
        "Connections (one direction each) tracked now",
        v.tracked_flows.clone(),
    );
    r.register(
        "evicted_flows",
        "Connections evicted from the bounded table (counted in the totals)",
        v.evicted_flows.clone(),
    );
    r.register(
        "connections",
        "Connections seen (one direction each): a 4-tuple carries many in turn",
        v.connections.clone(),
    );
    r.register(
        "reused_tuples",
        "Connections begun on a 4-tuple an earlier connection had used",
        v.reused_tuples.clone(),
    );
    r.register(
        "stale_segments",
        "Segments of an ended connection that arrived after the next one on its 4-tuple began (counted nowhere else)",
        v.stale_segments.clone(),
    );
    r.register(
        "overload_switches",
        "Times the ring passed half full and the kernel summarized until it drained (counts stay whole)",
        v.overload_switches.clone(),
    );
    r.register_with_unit(
        "resident",
        "The collector's resident memory",
        prometheus_client::registry::Unit::Bytes,
        v.resident_bytes.clone(),
    );
    r.register_with_unit(
        "flows_held",
        "What the engine holds for the flows (estimated from their structures), kept within the memory budget",
        prometheus_client::registry::Unit::Bytes,
        v.held_bytes.clone(),
    );
    r.register_with_unit(
        "flows_budget",
        "What the memory budget leaves the flows (--memory-mib less the process's baseline and ring)",
        prometheus_client::registry::Unit::Bytes,
        v.memory_budget_bytes.clone(),
    );
    r.register(
        "ack_logs_shed",
        "Flows whose ACK-level replay log was given up to stay within the memory budget (replayed from the wire)",
        v.ack_logs_shed.clone(),
    );
    r.register(
        "flows_evicted_for_memory",
        "Flows evicted to stay within the memory budget (counted in the totals; also in evicted_flows)",
        v.evicted_for_memory.clone(),
    );
    r.register(
        "flows_expired_idle",
        "Flows retired after --idle-expiry without a segment (counted in the totals; also in evicted_flows)",
        v.expired_idle.clone(),
    );
    r.register_with_unit(
        "late_time",
        "How late reordered segments arrived after the segment that overtook them",
        prometheus_client::registry::Unit::Seconds,
        v.late_time.clone(),
    );
    r.register(
        "extent",
        "RFC 4737 reordering extent of late segments, in segments",
        v.extent.clone(),
    );
    r.register(
        "rss_segments",
        "Segments checked against the queue the NIC's RSS picks for their flow (its key and table known)",
        v.rss_segments.clone(),
    );
    r.register(
        "rss_off_queue_segments",
        "Segments that arrived on another queue than RSS picks: steered by something else (Flow Director/ATR, aRFS, an ntuple rule)",
        v.rss_off_queue.clone(),
    );
    r.register(
        "nic_statistic_increase",
        "How much a NIC statistic about steering grew since the tracer started (Flow Director matches, flushes, misses; each RX queue's packets), by the driver's name",
        v.nic_statistics.clone(),
    );
    r.register(
        "nic_private_flag",
        "The NIC driver's private flags (1 on, 0 off), e.g. i40e's flow-director-atr",
        v.nic_private_flags.clone(),
    );
    r.register(
        "fix_suggested",
        "1 when flows are reordered by steering and the report suggests a fix for the NIC",
        v.fix_suggested.clone(),
    );
    r.register(
        "interface_down",
        "Times the traced interface went down (taken down, or its carrier lost; the programs stayed attached)",
        v.interface_down.clone(),
    );
    r.register(
        "interface_attached_again",
        "Times the traced interface went away (deleted, its namespace gone) and came back, and the tracer attached to it again",
        v.interface_attached_again.clone(),
    );
}

/// Answers scrapes until `stop`: `GET /metrics` gets the registry as
/// OpenMetrics text, anything else 404.
fn serve(listener: TcpListener, registry: Registry, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = answer(stream, &registry) {
                    log::debug!("metrics scrape: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => log::warn!("metrics: accepting a scrape: {e}"),
        }
    }
}

fn answer(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&request);
    let (status, kind, body) =
        if line.starts_with("GET /metrics ") || line.starts_with("GET /metrics?") {
            let mut body = String::new();
            prometheus_client::encoding::text::encode(&mut body, registry)
                .map_err(|_| std::io::Error::other("encoding the metrics"))?;
            // Prometheus asks for OpenMetrics; curl and promtool (before 2.x's
            // late versions) read the classic text format.
            if line
                .to_ascii_lowercase()
                .contains("application/openmetrics-text")
            {
                (
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    body,
                )
            } else {
                (
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    classic(&body),
                )
            }
        } else {
            (
                "404 Not Found",
                "text/plain",
                "metrics are at /metrics\n".to_string(),
            )
        };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// OpenMetrics text as the classic Prometheus text format (0.0.4): a
/// counter's HELP and TYPE name its `_total` samples, `+Inf` is spelled so,
/// and there is no UNIT or EOF line.
fn classic(open: &str) -> String {
    let counters: Vec<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let name = rest.split(' ').next().unwrap_or("");
                if counters.contains(&name) {
                    out.push_str(&format!("{p}{name}_total{}", &rest[name.len()..]));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(&line.replace("le=\"inf\"", "le=\"+Inf\"")),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_text_names_counters_by_their_samples() {
        let open = "# HELP x_segments Segments.\n# TYPE x_segments counter\nx_segments_total 5\n\
# HELP x_late Late.\n# TYPE x_late histogram\n# UNIT x_late seconds\nx_late_bucket{le=\"inf\"} 2\n# EOF\n";
        assert_eq!(
            classic(open),
            "# HELP x_segments_total Segments.\n# TYPE x_segments_total counter\nx_segments_total 5\n\
# HELP x_late Late.\n# TYPE x_late histogram\nx_late_bucket{le=\"+Inf\"} 2\n"
        );
    }
}
