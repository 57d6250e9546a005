//! What the report costs once the trace ends (`cargo xtask bench`): the
//! engine's snapshot and every connection's replay, against the number of
//! connections, the time they are spread over and their round trip, beside
//! what the engine took to read the same stream.
//!
//! The stream, an edge host's: short connections (a SYN, its handshake's
//! ACK one round trip later, eight data segments of which the second
//! arrives after the next three, so a classic sender would recover once,
//! and a FIN), four in turn on each client port a quarter of the span
//! apart, spread evenly over the span; beside them 16 long connections over the whole span, 2,000
//! segments each with a segment three places late every hundred. The
//! events are the same at every span and round trip: the report's cost
//! should be too.

use std::time::Instant;

use tracer::{
    engine::{Engine, EngineConfig},
    source::{Flow, Segment},
};

#[path = "common/target.rs"]
mod target;
use target::Target;

const MSS: u32 = 1448;
const LONG: u32 = 16;
const LONG_SEGMENTS: u32 = 2000;

fn flow(client: u32, port: u16) -> Flow {
    Flow {
        src: std::net::SocketAddr::new([10, 1, (client >> 8) as u8, client as u8].into(), port),
        dst: "10.255.0.1:443".parse().unwrap(),
    }
}

fn segment(flow: Flow, ts_ns: u64, seq: u32, payload_len: u32, flags: u8, tsval: u32) -> Segment {
    Segment {
        ts_ns,
        ifindex: 1,
        rx_queue: 0,
        cpu: 0,
        flow,
        seq,
        ack: 1,
        payload_len,
        flags,
        window: 512,
        ip_id: None,
        timestamp: Some((tsval, 1)),
        sack: Vec::new(),
        vlan: None,
        first_fragment: false,
        summarized_before: 0,
        summarized_end: None,
    }
}

/// The stream's segments, in arrival order.
fn stream(connections: u32, span_s: f64, rtt_ns: u64) -> Vec<Segment> {
    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    const FIN: u8 = 0x01;
    let span_ns = (span_s * 1e9) as u64;
    let mut out = Vec::with_capacity(connections as usize * 11 + (LONG * LONG_SEGMENTS) as usize);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for c in 0..connections {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let isn = rng as u32;
        // Connection c + connections/4 takes c's 4-tuple, a quarter of
        // the span later.
        let tuple = c % (connections / 4);
        let f = flow(tuple % 4096, 20_000 + (tuple / 4096) as u16);
        let t0 = span_ns * u64::from(c) / u64::from(connections);
        out.push(segment(f, t0, isn, 0, SYN, 1));
        let t1 = t0 + rtt_ns;
        out.push(segment(f, t1, isn.wrapping_add(1), 0, ACK, 1));
        for (i, k) in [0u32, 2, 3, 4, 1, 5, 6, 7].into_iter().enumerate() {
            let seq = isn.wrapping_add(1 + k * MSS);
            out.push(segment(f, t1 + 1000 * (i as u64 + 1), seq, MSS, ACK, 2 + k));
        }
        let end = isn.wrapping_add(1 + 8 * MSS);
        out.push(segment(f, t1 + 10_000, end, 0, FIN | ACK, 10));
    }
    for l in 0..LONG {
        let f = flow(5000 + l, 443);
        let gap = span_ns / u64::from(LONG_SEGMENTS);
        out.push(segment(f, 0, 0, 0, SYN, 1));
        for i in 0..LONG_SEGMENTS {
            let k = match i % 100 {
                50 => i + 3,
                51..=53 => i - 1,
                _ => i,
            };
            let t = rtt_ns + gap * u64::from(i);
            out.push(segment(f, t, 1 + k * MSS, MSS, ACK, 2 + k));
        }
    }
    out.sort_by_key(|s| s.ts_ns);
    out
}

/// Seconds the engine took to read the stream, and to report it.
fn run(connections: u32, span_s: f64, rtt_ns: u64) -> (f64, f64) {
    let segments = stream(connections, span_s, rtt_ns);
    let mut engine = Engine::new(EngineConfig {
        max_flows: 1 << 20,
        ..Default::default()
    });
    let t = Instant::now();
    for s in &segments {
        engine.segment(s);
    }
    let read = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut s = engine.snapshot();
    engine.replay(&mut s);
    let report = t.elapsed().as_secs_f64();
    assert_eq!(s.connections(), u64::from(connections + LONG));
    (read, report)
}

fn main() {
    println!(
        "report benchmark: the snapshot and every connection's replay, after the engine read the stream (one core)"
    );
    println!(
        "  {:>12} {:>8} {:>8}   {:>10} {:>10} {:>12}",
        "connections", "span", "rtt", "engine", "report", "per conn."
    );
    let mut reports = Vec::new();
    for connections in [10_000u32, 100_000] {
        for span_s in [10.0, 3600.0] {
            for rtt_ns in [50_000u64, 100_000_000] {
                let (read, report) = run(connections, span_s, rtt_ns);
                println!(
                    "  {:>12} {:>7.0}s {:>6.2}ms   {:>8.0}ms {:>8.0}ms {:>10.1}µs",
                    connections,
                    span_s,
                    rtt_ns as f64 / 1e6,
                    read * 1e3,
                    report * 1e3,
                    report * 1e6 / f64::from(connections + LONG)
                );
                reports.push((connections, report));
            }
        }
    }
    // Flat in span and round trip: the spread of the four reports of each
    // number of connections.
    for connections in [10_000u32, 100_000] {
        let of: Vec<f64> = reports
            .iter()
            .filter(|r| r.0 == connections)
            .map(|r| r.1)
            .collect();
        let (lo, hi) = of
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        println!(
            "  {connections} connections: the slowest report over spans of 10 s to an hour and round trips of 50 µs to 100 ms is {:.2}x the fastest ({})",
            hi / lo,
            Target::AtMost(2.0).say(hi / lo, "2x")
        );
    }
    let worst = reports.iter().map(|r| r.1).fold(0.0, f64::max);
    println!(
        "  100000 connections over an hour: the report in {:.2} s ({})",
        worst,
        Target::AtMost(10.0).say(worst, "10 s")
    );
}
