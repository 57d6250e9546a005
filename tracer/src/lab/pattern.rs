//! `--mode pattern`: exact, deterministic reordering at the edge, by
//! holding chosen data segments in userspace (iptables NFQUEUE) while
//! later ones pass. One thread, pinned to one CPU, decides every packet of
//! the upload in order, so the server sees them on one queue and one CPU:
//! reordering with no queue or core change, the "upstream" signature.
//!
//! The thread records, for each held segment, exactly which data segments
//! overtook it: that is the ground truth the RFC 4737 metrics of the
//! tracer must equal (extent = segments that passed it, byte offset =
//! their bytes).

use std::{
    collections::VecDeque,
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
    /// A copy of it (a retransmission) passed it: it reaches the server
    /// as a duplicate.
    pub superseded: bool,
    /// Data segments of its flow with higher sequence numbers let through
    /// while it was held, and their payload bytes.
    pub passed_segments: u32,
    pub passed_bytes: u64,
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
    since: Instant,
    until: Option<Instant>,
}

fn run(mut queue: NfQueue, pattern: Pattern, stop: &AtomicBool) -> Result<PatternTruth> {
    let mut truth = PatternTruth {
        pattern: Some(pattern),
        ..Default::default()
    };
    let mut held: VecDeque<Holding> = VecDeque::new();
    // Per client port: one past the highest sequence number sent.
    let mut sent_end: std::collections::HashMap<u16, u32> = Default::default();
    let release = |queue: &NfQueue, h: Holding, truth: &mut PatternTruth| -> Result<()> {
        truth.held.push(HeldSegment {
            held_us: h.since.elapsed().as_micros() as u64,
            ..h.seg
        });
        queue.accept(h.id).context("NFQUEUE verdict")
    };
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
            release(&queue, h, &mut truth)?;
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
                release(&queue, h, &mut truth)?;
            }
            queue.accept(msg.id)?;
            continue;
        };
        truth.data_segments += 1;
        let end = seq.wrapping_add(len);
        let retransmission = match sent_end.get(&port) {
            // Serial-number comparison (RFC 1982).
            Some(&e) => {
                if (end.wrapping_sub(e) as i32) > 0 {
                    sent_end.insert(port, end);
                }
                (seq.wrapping_sub(e) as i32) < 0
            }
            None => {
                sent_end.insert(port, end);
                false
            }
        };
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
                since: Instant::now(),
                until: hold.map(|d| Instant::now() + d),
            });
            continue;
        }
        queue.accept(msg.id)?;
        for h in held.iter_mut().filter(|h| h.seg.client_port == port) {
            if seq == h.seg.seq {
                h.seg.superseded = true;
            } else if (seq.wrapping_sub(h.seg.seq) as i32) > 0 {
                h.seg.passed_segments += 1;
                h.seg.passed_bytes += u64::from(len);
            }
        }
        if hold.is_none() {
            // Swap: the held one follows the segment that passed it.
            while let Some(h) = held.pop_front() {
                release(&queue, h, &mut truth)?;
            }
        }
    }
    while let Some(h) = held.pop_front() {
        release(&queue, h, &mut truth)?;
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
