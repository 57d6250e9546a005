//! `--mode pattern`: exact, deterministic reordering at the edge, by
//! holding chosen data segments in userspace (iptables NFQUEUE) while
//! later ones pass. One thread, pinned to one CPU, decides every packet of
//! the upload in order, so the server sees them on one queue and one CPU:
//! reordering with no queue or core change, the "upstream" signature.
//!
//! The thread records, for each held segment, exactly which data segments
//! overtook it: that is the ground truth the RFC 4737 metrics of the
//! tracer must equal (extent = segments that reached the server between
//! the first one above it and it, byte offset = their bytes above it).
//! It keeps what it let through byte by byte, so that a segment counts
//! as the server counts it: only when it brings bytes the server has not
//! had (a copy of bytes already let through brings none), whatever its
//! place (a retransmission of a segment lost before the edge, let
//! through while one is held, is an arrival in between).

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    str::FromStr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde::Serialize;

use super::{
    in_netns, ip,
    nfqueue::{NfQueue, Packet},
    SERVER_PORT,
};

/// Which segments are held, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// Every `every`-th data segment waits for the next one: neighbours
    /// swap (extent 1).
    Swap { every: u32 },
    /// Every `every`-th data segment waits `hold_us` microseconds while
    /// the following ones pass.
    Hold { every: u32, hold_us: u32 },
}

impl FromStr for Pattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let num = |v: &str, what: &str| -> Result<u32, String> {
            v.parse::<u32>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| format!("{what} in `{s}` is not a whole number >= 1"))
        };
        match parts.as_slice() {
            ["swap", n] => Ok(Pattern::Swap {
                every: num(n, "N")?,
            }),
            ["hold", n, us] => Ok(Pattern::Hold {
                every: num(n, "N")?,
                hold_us: num(us, "US")?,
            }),
            _ => Err(format!(
                "`{s}` is not a pattern: give swap:N (every Nth data segment swaps with the next) or hold:N:US (every Nth is held US microseconds)"
            )),
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pattern::Swap { every } => write!(f, "swap:{every}"),
            Pattern::Hold { every, hold_us } => write!(f, "hold:{every}:{hold_us}"),
        }
    }
}

/// One held data segment and what overtook it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HeldSegment {
    pub client_port: u16,
    pub seq: u32,
    pub payload_len: u32,
    /// It started below bytes its flow had sent before: a retransmission.
    pub retransmission: bool,
    /// Some of its bytes were let through while it was held (a
    /// retransmission passed it): it reaches the server as a duplicate.
    pub superseded: bool,
    /// Data segments of its flow that brought the server new bytes while
    /// it was held, from the first one above it on (its RFC 4737
    /// extent), and their new bytes above it (its byte offset).
    pub passed_segments: u32,
    pub passed_bytes: u64,
    /// How many arrivals just before it were all above it, up to 8: it is
    /// n-reordered (RFC 4737 §5) for n up to this.
    pub higher_before: u8,
    pub held_us: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PatternTruth {
    pub pattern: Option<Pattern>,
    /// Data segments the thread decided.
    pub data_segments: u64,
    pub held: Vec<HeldSegment>,
}

impl PatternTruth {
    /// Held originals that later segments overtook: the reordered
    /// segments the server must see, with their extent (`passed_segments`)
    /// and byte offset (`passed_bytes`).
    pub fn late(&self) -> impl Iterator<Item = &HeldSegment> {
        self.held
            .iter()
            .filter(|h| h.passed_segments > 0 && !h.retransmission && !h.superseded)
    }
}

/// The NFQUEUE queue number the lab uses.
const QUEUE: u16 = 0;
/// The CPU the thread is pinned to.
const CPU: usize = 0;

pub struct Reorderer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<PatternTruth>>>,
}

impl Reorderer {
    /// Queues the upload's client -> server TCP packets in `edge_ns` to a
    /// thread that applies `pattern`. The iptables rules live in the
    /// namespace and go with it.
    pub fn start(edge_ns: &str, pattern: Pattern) -> Result<Self> {
        let port = SERVER_PORT.to_string();
        for tool in ["iptables", "ip6tables"] {
            ip(&[
                "netns",
                "exec",
                edge_ns,
                tool,
                "-A",
                "FORWARD",
                "-p",
                "tcp",
                "--dport",
                &port,
                "-j",
                "NFQUEUE",
                "--queue-num",
                &QUEUE.to_string(),
                "--queue-bypass",
            ])
            .with_context(|| format!("{tool} NFQUEUE rule (the lab's pattern mode needs iptables: `cargo xtask setup`)"))?;
        }
        // The headers are enough to decide (IPv6 40 + TCP with options 60).
        let queue =
            in_netns(edge_ns, || NfQueue::open(QUEUE, 128, 8192))?.context("opening NFQUEUE 0")?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                super::pin_to_cpu(CPU);
                run(queue, pattern, &stop)
            })
        };
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Releases everything held and returns what was done.
    pub fn finish(mut self) -> Result<PatternTruth> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .expect("finished once")
            .join()
            .map_err(|_| anyhow::anyhow!("pattern thread panicked"))?
    }
}

impl Drop for Reorderer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// TCP client port, sequence number and payload length of an IP packet,
/// from its headers alone (the queue copies only the first bytes).
fn tcp_segment(packet: &[u8]) -> Option<(u16, u32, u32)> {
    let (l4, total) = match packet.first()? >> 4 {
        4 => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            (
                ihl,
                usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?])),
            )
        }
        6 if *packet.get(6)? == 6 => (
            40,
            40 + usize::from(u16::from_be_bytes([*packet.get(4)?, *packet.get(5)?])),
        ),
        _ => return None,
    };
    let tcp = packet.get(l4..)?;
    let port = u16::from_be_bytes([*tcp.first()?, *tcp.get(1)?]);
    let seq = u32::from_be_bytes(tcp.get(4..8)?.try_into().ok()?);
    let data_offset = usize::from(tcp.get(12)? >> 4) * 4;
    Some((port, seq, total.checked_sub(l4 + data_offset)? as u32))
}

struct Holding {
    id: u32,
    seg: HeldSegment,
    /// Its bytes, in its flow's unwrapped sequence space.
    start: u64,
    end: u64,
    since: Instant,
    until: Option<Instant>,
}

/// What one flow sent through the edge, in unwrapped sequence space.
#[derive(Default)]
struct Sent {
    /// The last sequence number seen, unwrapped: the reference for the
    /// next (serial-number arithmetic, RFC 1982).
    anchor: Option<u64>,
    /// One past the highest byte the flow sent.
    end: u64,
    /// Byte ranges let through to the server, merged: start -> end.
    passed: BTreeMap<u64, u64>,
    /// The first new byte of the last arrivals, newest last.
    recent: VecDeque<u64>,
}

/// The largest n the tracer reports n-reordering for.
const MAX_N: usize = 8;

impl Sent {
    fn unwrap(&mut self, seq: u32) -> u64 {
        // The first starts 2^32 up, so that a later one may lie below it.
        let anchor = self.anchor.unwrap_or((1 << 32) + u64::from(seq));
        let at = anchor.wrapping_add_signed(i64::from(seq.wrapping_sub(anchor as u32) as i32));
        self.anchor = Some(at);
        at
    }

    /// Consecutive arrivals just before now whose first new byte was
    /// above `start`.
    fn higher_before(&self, start: u64) -> u8 {
        self.recent.iter().rev().take_while(|&&s| s > start).count() as u8
    }

    /// Lets [start, end) through; returns the parts of it the server had
    /// not been sent before, in order (none: no arrival).
    fn pass(&mut self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut new = Vec::new();
        let mut at = start;
        if let Some((_, &e)) = self.passed.range(..=start).next_back() {
            at = at.max(e);
        }
        for (&s, &e) in self.passed.range(start..end) {
            if s > at {
                new.push((at, s));
            }
            at = at.max(e);
        }
        if at < end {
            new.push((at, end));
        }
        if let Some(&(first_new, _)) = new.first() {
            if self.recent.len() == MAX_N {
                self.recent.pop_front();
            }
            self.recent.push_back(first_new);
        }
        // Merge [start, end) with every range it touches.
        let (mut s, mut e) = (start, end);
        if let Some((&ps, &pe)) = self.passed.range(..=start).next_back() {
            if pe >= start {
                s = ps;
                e = e.max(pe);
            }
        }
        let touched: Vec<u64> = self.passed.range(s..=e).map(|(&k, _)| k).collect();
        for k in touched {
            e = e.max(self.passed.remove(&k).expect("listed"));
        }
        self.passed.insert(s, e);
        new
    }
}

/// Lets held segment `h` through: an arrival for the segments still held.
fn release(
    queue: &NfQueue,
    h: Holding,
    held: &mut VecDeque<Holding>,
    sent: &mut HashMap<u16, Sent>,
    truth: &mut PatternTruth,
) -> Result<()> {
    let port = h.seg.client_port;
    let flow = sent.get_mut(&port).expect("held after seen");
    truth.held.push(HeldSegment {
        held_us: h.since.elapsed().as_micros() as u64,
        higher_before: flow.higher_before(h.start),
        ..h.seg
    });
    let new = flow.pass(h.start, h.end);
    overtake(held, port, &new);
    queue.accept(h.id).context("NFQUEUE verdict")
}

/// Counts the arrival at the server of `new` bytes of `port`'s flow (the
/// parts of a segment it had not had) against the segments still held.
fn overtake(held: &mut VecDeque<Holding>, port: u16, new: &[(u64, u64)]) {
    let Some(&(first_new, _)) = new.first() else {
        // A duplicate at the server: no arrival.
        return;
    };
    for h in held.iter_mut().filter(|h| h.seg.client_port == port) {
        if new.iter().any(|&(s, e)| s < h.end && e > h.start) {
            h.seg.superseded = true;
        }
        // The first arrival above it opens its hole; every arrival from
        // there on is counted.
        if h.seg.passed_segments > 0 || first_new > h.start {
            h.seg.passed_segments += 1;
            h.seg.passed_bytes += new
                .iter()
                .map(|&(s, e)| e.saturating_sub(s.max(h.end)))
                .sum::<u64>();
        }
    }
}

fn run(mut queue: NfQueue, pattern: Pattern, stop: &AtomicBool) -> Result<PatternTruth> {
    let mut truth = PatternTruth {
        pattern: Some(pattern),
        ..Default::default()
    };
    let mut held: VecDeque<Holding> = VecDeque::new();
    // Per client port: what the flow sent and what was let through.
    let mut sent: HashMap<u16, Sent> = HashMap::new();
    let mut arrived: VecDeque<Packet> = VecDeque::new();
    let (every, hold) = match pattern {
        Pattern::Swap { every } => (every, None),
        Pattern::Hold { every, hold_us } => {
            (every, Some(Duration::from_micros(u64::from(hold_us))))
        }
    };
    while !stop.load(Ordering::SeqCst) {
        // Holds that are due go first.
        while held
            .front()
            .is_some_and(|h| h.until.is_some_and(|t| Instant::now() >= t))
        {
            let h = held.pop_front().expect("not empty");
            release(&queue, h, &mut held, &mut sent, &mut truth)?;
        }
        let Some(msg) = arrived.pop_front() else {
            queue.wait(Duration::from_micros(20))?;
            queue.drain(&mut arrived).context("NFQUEUE receive")?;
            continue;
        };
        let seg = tcp_segment(&msg.payload);
        let Some((port, seq, len)) = seg.filter(|s| s.2 > 0) else {
            // Control segments (handshake, FIN) never pass a held one.
            while let Some(h) = held.pop_front() {
                release(&queue, h, &mut held, &mut sent, &mut truth)?;
            }
            queue.accept(msg.id)?;
            continue;
        };
        truth.data_segments += 1;
        let flow = sent.entry(port).or_default();
        let start = flow.unwrap(seq);
        let end = start + u64::from(len);
        let retransmission = start < flow.end;
        flow.end = flow.end.max(end);
        if truth.data_segments.is_multiple_of(u64::from(every)) {
            held.push_back(Holding {
                id: msg.id,
                seg: HeldSegment {
                    client_port: port,
                    seq,
                    payload_len: len,
                    retransmission,
                    ..Default::default()
                },
                start,
                end,
                since: Instant::now(),
                until: hold.map(|d| Instant::now() + d),
            });
            continue;
        }
        queue.accept(msg.id)?;
        // An arrival at the server only if it brings bytes it has not had.
        let new = flow.pass(start, end);
        overtake(&mut held, port, &new);
        if hold.is_none() {
            // Swap: the held one follows the segment that passed it.
            while let Some(h) = held.pop_front() {
                release(&queue, h, &mut held, &mut sent, &mut truth)?;
            }
        }
    }
    while let Some(h) = held.pop_front() {
        release(&queue, h, &mut held, &mut sent, &mut truth)?;
    }
    for msg in arrived {
        queue.accept(msg.id)?;
    }
    Ok(truth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_and_print() {
        assert_eq!("swap:50".parse(), Ok(Pattern::Swap { every: 50 }));
        let p: Pattern = "hold:100:300".parse().unwrap();
        assert_eq!(
            p,
            Pattern::Hold {
                every: 100,
                hold_us: 300
            }
        );
        assert_eq!(p.to_string(), "hold:100:300");
        for bad in ["swap", "swap:0", "hold:5", "shuffle:3", "swap:x"] {
            assert!(bad.parse::<Pattern>().is_err(), "{bad}");
        }
    }

    #[test]
    fn what_was_let_through_is_kept_byte_by_byte() {
        let mut f = Sent::default();
        // Unwrapped across the 32-bit wrap, and backwards.
        let a = f.unwrap(u32::MAX - 9);
        assert_eq!(f.unwrap(10), a + 20);
        assert_eq!(f.unwrap(u32::MAX - 9), a);
        assert_eq!(f.pass(0, 100), vec![(0, 100)]);
        assert_eq!(f.pass(200, 300), vec![(200, 300)]);
        // A copy brings nothing; one across a gap brings the gap.
        assert_eq!(f.pass(0, 100), vec![]);
        assert_eq!(f.pass(50, 250), vec![(100, 200)]);
        assert_eq!(f.passed, BTreeMap::from([(0, 300)]));
        assert_eq!(f.pass(300, 400), vec![(300, 400)]);
        assert_eq!(f.pass(500, 600), vec![(500, 600)]);
        assert_eq!(f.pass(350, 700), vec![(400, 500), (600, 700)]);
        assert_eq!(f.passed, BTreeMap::from([(0, 700)]));
        // Arrivals' first new bytes: 0, 200, 100, 300, 500, 400.
        assert_eq!(f.higher_before(350), 2);
        assert_eq!(f.higher_before(450), 0);
        assert_eq!(f.higher_before(50), 5);
    }

    #[test]
    fn arrivals_count_as_the_server_counts_them() {
        let holding = |start: u64| Holding {
            id: 0,
            seg: HeldSegment {
                client_port: 1,
                ..Default::default()
            },
            start,
            end: start + 100,
            since: Instant::now(),
            until: None,
        };
        // [100, 200) and [500, 600) held.
        let mut held = VecDeque::from([holding(100), holding(500)]);
        // Above the first only: it opens the first's hole.
        overtake(&mut held, 1, &[(200, 300)]);
        // A duplicate is no arrival; another flow's is not its own.
        overtake(&mut held, 1, &[]);
        overtake(&mut held, 2, &[(700, 800)]);
        // Above both: counted for both, opening the second's hole.
        overtake(&mut held, 1, &[(600, 700)]);
        // Below the second (the first's release, or a retransmission of
        // bytes lost before the edge): an arrival inside its hole.
        overtake(&mut held, 1, &[(100, 200)]);
        let got: Vec<_> = held
            .iter()
            .map(|h| (h.seg.passed_segments, h.seg.passed_bytes, h.seg.superseded))
            .collect();
        assert_eq!(got, [(3, 200, true), (2, 100, false)]);
    }

    #[test]
    fn reads_ports_seq_and_payload() {
        // IPv4, IHL 5, total length 60; TCP data offset 5: 20 payload bytes.
        let mut p = vec![0u8; 60];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&60u16.to_be_bytes());
        p[9] = 6;
        p[20..22].copy_from_slice(&40_000u16.to_be_bytes());
        p[24..28].copy_from_slice(&7u32.to_be_bytes());
        p[32] = 5 << 4;
        assert_eq!(tcp_segment(&p), Some((40_000, 7, 20)));
        // The headers are enough: the queue copies no more.
        assert_eq!(tcp_segment(&p[..40]), Some((40_000, 7, 20)));
        assert_eq!(tcp_segment(&p[..30]), None);
    }
}
