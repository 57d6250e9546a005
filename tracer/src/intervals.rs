//! `watch`'s interval reports: at the end of every interval, what grew in
//! it (the totals, the kernel's counters) and the flows that were active in
//! it, the most reordered first, with their verdicts and evidence: one JSON
//! file per interval in a directory that keeps the latest `keep` (the oldest
//! removed first). A file appears whole (written aside, then renamed).
//!
//! Differences are taken between snapshots of the engine, so a flow that
//! the engine retired and saw again starts from zero; an interval's length
//! comes from the monotonic clock, its start and end from the wall clock
//! (which may step).

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use jiff::Timestamp;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::{
    nic::fix::Fix,
    output::KeptFiles,
    snapshot::{
        Connection, FlowReport, InterfaceEvents, Memory, Reordering, Snapshot, Spread, TcpLayer,
        Verdict,
    },
};

/// The flows one file lists at most: the most reordered in the interval,
/// then those that moved the most bytes.
pub const LISTED_FLOWS: usize = 100;

/// What an interval counts, of the totals and of each flow.
const COUNTS: [&str; 15] = [
    "segments",
    "stale_segments",
    "data_segments",
    "payload_bytes",
    "reordered",
    "retransmissions",
    "duplicates",
    "queue_migrations",
    "cpu_migrations",
    "reordered_after_migration",
    "reordered_same_queue_same_cpu",
    "reordered_on_another_queue",
    "reordered_on_another_cpu",
    "tcp_ofo_segments",
    "tcp_paws_discarded",
];

type Counts = [u64; COUNTS.len()];

fn counts(segments: u64, stale_segments: u64, r: &Reordering, t: &TcpLayer) -> Counts {
    let a = &r.attribution;
    [
        segments,
        stale_segments,
        r.data_segments,
        r.payload_bytes,
        r.reordered,
        r.retransmissions,
        r.duplicates,
        r.queue_migrations,
        r.cpu_migrations,
        r.reordered_after_migration,
        a.same_queue_same_cpu,
        a.different_queue + a.different_queue_and_cpu,
        a.different_cpu + a.different_queue_and_cpu,
        t.ofo_segments,
        t.paws_discarded,
    ]
}

/// `now - before`, each count (a count that went down, a flow retired and
/// seen again, counts from zero).
fn grown(now: &Counts, before: &Counts) -> Counts {
    std::array::from_fn(|i| {
        if now[i] >= before[i] {
            now[i] - before[i]
        } else {
            now[i]
        }
    })
}

fn named(c: &Counts) -> Map<String, Value> {
    COUNTS
        .iter()
        .zip(c)
        .map(|(name, v)| (name.to_string(), json!(v)))
        .collect()
}

/// A flow's counts and how far its sequence numbers had advanced.
#[derive(Clone, Copy, Default)]
struct FlowCounts {
    counts: Counts,
    seq_advance_bytes: u64,
}

impl FlowCounts {
    fn of(f: &FlowReport) -> Self {
        Self {
            counts: counts(f.segments, f.stale_segments, &f.reordering, &f.tcp_layer),
            seq_advance_bytes: f.seq_advance_bytes,
        }
    }
}

/// What the previous interval ended on.
#[derive(Default)]
struct Previous {
    totals: Counts,
    kernel: BTreeMap<&'static str, u64>,
    dropped_events: u64,
    connections: u64,
    evicted_flows: u64,
    expired_idle: u64,
    interface: InterfaceEvents,
    flows: HashMap<Connection, FlowCounts>,
}

/// One interval's file, in the order a reader wants it.
#[derive(Serialize)]
struct IntervalReport<'a> {
    interval: Span,
    /// The host, interface and mode.
    watching: Value,
    /// What the totals grew by.
    totals: Map<String, Value>,
    dropped_events: u64,
    /// What the kernel's counters grew by.
    kernel: Map<String, Value>,
    /// Flows with segments or bytes in the interval.
    active_flows: usize,
    /// The active flows per verdict (over each flow's life so far).
    verdicts: BTreeMap<Verdict, u64>,
    /// Connections begun in the interval.
    connections: u64,
    tracked_flows: u64,
    evicted_flows: u64,
    expired_idle: u64,
    /// Times the interface went down, and went away and came back.
    interface: InterfaceEvents,
    memory: Memory,
    /// The active flows, the most reordered in the interval first, at most
    /// [`LISTED_FLOWS`].
    flows: Vec<ListedFlow<'a>>,
    /// What to change on the NIC, when the interval saw steering.
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<Fix>,
}

/// A flow active in the interval: what grew in it, and what the flow's
/// life so far says (verdict, evidence, ratio, queues and CPUs).
#[derive(Serialize)]
struct ListedFlow<'a> {
    src: &'a str,
    dst: &'a str,
    /// Its serial number, and how many connections the trace saw on its
    /// 4-tuple before it.
    connection: u64,
    earlier_on_tuple: u32,
    verdict: Verdict,
    evidence: &'a str,
    in_interval: Map<String, Value>,
    reordered_ratio: f64,
    rx_queues: &'a [Spread],
    cpus: &'a [Spread],
    rtt_us: Option<u64>,
    duration_s: f64,
}

#[derive(Serialize)]
struct Span {
    number: u64,
    start: String,
    end: String,
    /// By the monotonic clock.
    seconds: f64,
    /// The run ended with it.
    last: bool,
}

/// The directory and what this run wrote to it.
pub struct Intervals {
    files: KeptFiles,
    every: Duration,
    /// What names the source in every file (host, interface, mode).
    watching: Value,
    number: u64,
    began: Instant,
    began_at: Timestamp,
    previous: Previous,
    /// Files that could not be written (said each time).
    pub failed: u64,
}

/// One interval written: a line for the log.
pub struct Written {
    pub path: PathBuf,
    pub line: String,
}

impl Intervals {
    /// Makes `dir` (mode 0750) if missing and checks that files can be
    /// made in it; interval files already there beyond `keep` go. The
    /// first interval begins now.
    pub fn open(dir: &Path, keep: usize, every: Duration, watching: Value) -> Result<Self> {
        Ok(Self {
            files: KeptFiles::open(dir, keep, "interval-", ".json")?,
            every,
            watching,
            number: 0,
            began: Instant::now(),
            began_at: Timestamp::now(),
            previous: Previous::default(),
            failed: 0,
        })
    }

    pub fn dir(&self) -> &Path {
        self.files.dir()
    }

    /// Makes the directory again if it went, and takes its interval files
    /// as they are now (some may have been moved away): on SIGHUP.
    pub fn reopen(&mut self) -> Result<()> {
        self.files.reopen()
    }

    /// Whether the interval under way has lasted its length.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.began + self.every
    }

    /// Ends the interval under way at `now` with `s` (the engine's
    /// snapshot, with the kernel's counters: its totals; its flows are not
    /// read) and `flows` (every tracked connection's report, taken one at
    /// a time: a snapshot holding them all at once took tens of MiB beside
    /// the flows' budget) and writes it; `last` when the run ends with it.
    /// The next interval begins. A file that cannot be written loses
    /// nothing: the interval goes on, and the next file covers it too.
    pub fn write(
        &mut self,
        s: &Snapshot,
        flows: impl IntoIterator<Item = FlowReport>,
        now: Instant,
        last: bool,
    ) -> Result<Written> {
        let ended_at = Timestamp::now();
        let (report, next) = self.report(s, flows, now, ended_at, last);
        let line = self.line(&report);
        let path = self.files.path(&format!(
            "{}-{:06}",
            ended_at.strftime("%Y%m%dT%H%M%SZ"),
            self.number + 1
        ));
        if let Err(e) = write_whole(&path, &report) {
            self.failed += 1;
            return Err(e).with_context(|| format!("writing {}", path.display()));
        }
        self.number += 1;
        self.began = now;
        self.began_at = ended_at;
        self.previous = next;
        self.files.made(path.clone());
        Ok(Written { path, line })
    }

    /// The report of the interval ending at `now` with `s`, and what the
    /// next one starts from.
    fn report(
        &self,
        s: &Snapshot,
        reports: impl IntoIterator<Item = FlowReport>,
        now: Instant,
        ended_at: Timestamp,
        last: bool,
    ) -> (Value, Previous) {
        let prev = &self.previous;
        let t = &s.totals;
        let totals = counts(t.segments, t.stale_segments, &t.reordering, &t.tcp_layer);
        let kernel = s.kernel.clone().unwrap_or_default();
        let interface = s.interface.unwrap_or_default();
        let kernel_grown: Map<String, Value> = kernel
            .iter()
            .map(|(k, v)| {
                let before = prev.kernel.get(k).copied().unwrap_or(0);
                (k.to_string(), json!(v.saturating_sub(before)))
            })
            .collect();
        let mut flows = HashMap::with_capacity(prev.flows.len());
        let mut active = Vec::new();
        let mut active_flows = 0;
        let mut verdicts: BTreeMap<Verdict, u64> = BTreeMap::new();
        // Most reordered in the interval, then most bytes.
        let listed_first = |a: &(FlowReport, FlowCounts), b: &(FlowReport, FlowCounts)| {
            (b.1.counts[3], b.1.seq_advance_bytes).cmp(&(a.1.counts[3], a.1.seq_advance_bytes))
        };
        for f in reports {
            let c = FlowCounts::of(&f);
            flows.insert(f.key, c);
            let before = prev.flows.get(&f.key).copied().unwrap_or_default();
            let d = FlowCounts {
                counts: grown(&c.counts, &before.counts),
                seq_advance_bytes: if c.seq_advance_bytes >= before.seq_advance_bytes {
                    c.seq_advance_bytes - before.seq_advance_bytes
                } else {
                    c.seq_advance_bytes
                },
            };
            if d.counts[0] > 0 || d.seq_advance_bytes > 0 {
                *verdicts.entry(f.verdict).or_default() += 1;
                active_flows += 1;
                active.push((f, d));
                if active.len() >= 2 * LISTED_FLOWS {
                    active.sort_by(listed_first);
                    active.truncate(LISTED_FLOWS);
                }
            }
        }
        active.sort_by(listed_first);
        active.truncate(LISTED_FLOWS);
        let listed = active
            .iter()
            .map(|(f, d)| {
                let mut in_interval = named(&d.counts);
                in_interval.insert("seq_advance_bytes".into(), json!(d.seq_advance_bytes));
                ListedFlow {
                    src: &f.src,
                    dst: &f.dst,
                    connection: f.connection,
                    earlier_on_tuple: f.earlier_on_tuple,
                    verdict: f.verdict,
                    evidence: &f.evidence,
                    in_interval,
                    reordered_ratio: f.reordering.reordered_ratio,
                    rx_queues: &f.rx_queues,
                    cpus: &f.cpus,
                    rtt_us: f.rtt_us,
                    duration_s: f.duration_s,
                }
            })
            .collect();
        // The NIC's fix, when this interval saw steering.
        let steered = verdicts.contains_key(&Verdict::NicSteering);
        let report = IntervalReport {
            interval: Span {
                number: self.number + 1,
                start: self.began_at.to_string(),
                end: ended_at.to_string(),
                seconds: (now - self.began).as_secs_f64(),
                last,
            },
            watching: self.watching.clone(),
            totals: named(&grown(&totals, &prev.totals)),
            dropped_events: s.totals.dropped_events.saturating_sub(prev.dropped_events),
            kernel: kernel_grown,
            active_flows,
            verdicts,
            connections: s.connections().saturating_sub(prev.connections),
            tracked_flows: s.tracked_flows,
            evicted_flows: s.evicted_flows.saturating_sub(prev.evicted_flows),
            expired_idle: s.memory.expired_idle.saturating_sub(prev.expired_idle),
            interface: InterfaceEvents {
                went_down: interface.went_down.saturating_sub(prev.interface.went_down),
                attached_again: interface
                    .attached_again
                    .saturating_sub(prev.interface.attached_again),
            },
            memory: s.memory,
            flows: listed,
            fix: s.fix.clone().filter(|_| steered),
        };
        let report = serde_json::to_value(report).expect("an interval report serialises");
        let next = Previous {
            totals,
            dropped_events: s.totals.dropped_events,
            kernel,
            connections: s.connections(),
            evicted_flows: s.evicted_flows,
            expired_idle: s.memory.expired_idle,
            interface,
            flows,
        };
        (report, next)
    }

    /// "interval 3 (60.0 s): 81234 data segments, 120 reordered; 2 active
    /// flows, 1 nic-steering".
    fn line(&self, r: &Value) -> String {
        let t = &r["totals"];
        let mut verdicts: Vec<String> = Verdict::ALL
            .iter()
            .filter(|v| **v != Verdict::None)
            .filter_map(|v| {
                let n = r["verdicts"][v.as_str()].as_u64()?;
                Some(format!("{n} {}", v.as_str()))
            })
            .collect();
        if verdicts.is_empty() {
            verdicts.push("none reordered".into());
        }
        format!(
            "interval {} ({:.1} s): {} data segments, {} reordered, {} dropped events; {} active flow(s): {}",
            r["interval"]["number"],
            r["interval"]["seconds"].as_f64().unwrap_or(0.0),
            t["data_segments"],
            t["reordered"],
            r["dropped_events"],
            r["active_flows"],
            verdicts.join(", "),
        )
    }
}

/// Writes `v` to a hidden file beside `path` (mode 0640), then renames it.
fn write_whole(path: &Path, v: &Value) -> Result<()> {
    let aside = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("interval")
    ));
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o640)
            .open(&aside)?;
        serde_json::to_writer_pretty(&mut f, v)?;
        f.write_all(b"\n")?;
        fs::rename(&aside, path)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&aside);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count that went down (the flow retired and seen again) counts
    /// from zero; the rest grow by the difference.
    #[test]
    fn counts_grow_by_their_difference_or_from_zero() {
        let mut before = [0; COUNTS.len()];
        let mut now = [0; COUNTS.len()];
        (before[0], now[0]) = (10, 25);
        (before[3], now[3]) = (7, 2);
        let g = grown(&now, &before);
        assert_eq!((g[0], g[3]), (15, 2));
    }
}
