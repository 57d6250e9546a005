//! `tracer analyze` against tshark's TCP analysis on the same capture, in
//! the same run (`cargo xtask bench`): packets per second and the ratio,
//! each tool's best of three interleaved runs.
//!
//! The capture: 1,000,000 TCP segments (Ethernet, IPv4, TCP with
//! timestamps; headers only, as `tcpdump -s 128` keeps them) over 100
//! flows in trains of 8, each flow swapping two neighbours every 50
//! segments. Both tools read it from the page cache (read once before).

#[path = "common/target.rs"]
mod target;
use target::Target;

use std::{
    io::Write,
    process::{Command, Stdio},
    time::Instant,
};

use tracer_common::tcp_flags::ACK;
use tracer_ebpf::test_frames::{eth, ipv4, set_ipv4_id, tcp, timestamps, Tcp};

const SEGMENTS: u32 = 1_000_000;
const FLOWS: u32 = 100;
const MSS: u32 = 1448;

/// Ethernet + IPv4 + TCP (timestamps) headers of one segment (its
/// payload left out of the capture, as `tcpdump -s 128` would).
fn frame(flow: u32, seq: u32, tsval: u32, ip_id: u16) -> Vec<u8> {
    let t = Tcp {
        sport: 20_000 + flow as u16,
        dport: 5201,
        seq,
        ack: 1,
        flags: ACK,
        window: 1024,
        options: timestamps(tsval, 0),
        payload: MSS as usize,
    };
    let mut f = eth(0x0800, &[], &ipv4(6, 0x4000, &[], &tcp(&t)));
    set_ipv4_id(&mut f, ip_id);
    f.truncate(14 + 20 + 32);
    f
}

/// A classic pcap, microseconds, Ethernet.
fn capture() -> Vec<u8> {
    let mut out = Vec::with_capacity(SEGMENTS as usize * 100 + 24);
    for v in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 128, 1] {
        out.extend(v.to_le_bytes());
    }
    let per_flow = SEGMENTS / FLOWS;
    let mut t_us = 1_700_000_000_000_000u64;
    for train in 0..per_flow / 8 {
        for flow in 0..FLOWS {
            for k in 0..8 {
                let mut n = train * 8 + k;
                // Every 50th segment swaps with the next.
                if n % 50 == 10 {
                    n += 1;
                } else if n % 50 == 11 {
                    n -= 1;
                }
                let f = frame(flow, 1 + n * MSS, 1000 + n / 100, n as u16);
                out.extend(((t_us / 1_000_000) as u32).to_le_bytes());
                out.extend(((t_us % 1_000_000) as u32).to_le_bytes());
                out.extend((f.len() as u32).to_le_bytes());
                out.extend((f.len() as u32 + MSS).to_le_bytes());
                out.extend(f);
                t_us += 1;
            }
        }
    }
    out
}

/// Seconds `cmd` took, and its stdout.
fn timed(cmd: &mut Command) -> Option<(f64, String)> {
    let t = Instant::now();
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    let secs = t.elapsed().as_secs_f64();
    out.status
        .success()
        .then(|| (secs, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// Runs of each tool.
const ROUNDS: usize = 3;

fn main() {
    let path = std::env::temp_dir().join(format!("tracer-bench-{}.pcap", std::process::id()));
    let bytes = capture();
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(&bytes))
        .expect("writing the capture");
    let n = f64::from(SEGMENTS);
    println!(
        "capture benchmark: {SEGMENTS} segments over {FLOWS} flows, {} MB, pcap",
        bytes.len() / 1_000_000
    );
    // This machine's speed wanders by a third from one second to the next:
    // each tool runs ROUNDS times, interleaved, and its best time counts.
    let mut tracer: Option<(f64, String)> = None;
    let mut tshark: Option<(f64, String)> = None;
    let (mut tracer_times, mut tshark_times) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = timed(
            Command::new(env!("CARGO_BIN_EXE_tracer"))
                .args(["analyze", "--json"])
                .arg(&path),
        )
        .expect("tracer analyze");
        tracer_times.push(format!("{:.2}", t.0));
        if tracer.as_ref().is_none_or(|b| t.0 < b.0) {
            tracer = Some(t);
        }
        let s = timed(Command::new("tshark").arg("-r").arg(&path).args([
            "-q",
            "-z",
            "io,stat,0,tcp.analysis.out_of_order",
        ]));
        let Some(s) = s else { break };
        tshark_times.push(format!("{:.2}", s.0));
        if tshark.as_ref().is_none_or(|b| s.0 < b.0) {
            tshark = Some(s);
        }
    }
    let tracer = tracer.expect("tracer ran");
    let report: serde_json::Value = serde_json::from_str(&tracer.1).expect("JSON report");
    let reordered = &report["totals"]["reordered"];
    println!(
        "  tracer analyze  {:>8.2} M packets/s (best of {} s; {reordered} reordered, the replay included)",
        n / tracer.0 / 1e6,
        tracer_times.join(", ")
    );
    match tshark {
        Some((secs, _)) => {
            println!(
                "  tshark          {:>8.2} M packets/s (best of {} s; io,stat tcp.analysis.out_of_order)",
                n / secs / 1e6,
                tshark_times.join(", ")
            );
            println!(
                "  tracer/tshark   {:>8.1}x faster ({})",
                secs / tracer.0,
                Target::AtLeast(50.0).say(secs / tracer.0, "50x")
            );
        }
        None => println!("  tshark          not installed (apt-get install tshark): no comparison"),
    }
    match timed(
        Command::new("tcptrace")
            .arg("-l")
            .arg(&path)
            .stdout(Stdio::null()),
    ) {
        Some((secs, _)) => println!(
            "  tcptrace -l     {:>8.2} M packets/s ({secs:.2} s); tracer {:.1}x faster",
            n / secs / 1e6,
            secs / tracer.0
        ),
        None => {
            println!("  tcptrace        not installed (apt-get install tcptrace): no comparison")
        }
    }
    let _ = std::fs::remove_file(&path);
}
