//! The lab's WAN path (`--rtt`, `--rate`) against what tcpdump saw in the
//! edge and what the server's kernel counted (root; in CI).
//!
//! tcpdump captures every packet of the upload in the edge namespace as it
//! enters from the server (stamped by the kernel when it arrived: the
//! stamp the delay line holds it by) and as it leaves towards the client
//! (after the verdict that let it go). So each packet's captured delay is
//! at least the round trip, exactly; how much more is the delay line's
//! error, this machine's scheduling: printed, and held to issue 16's
//! target (p99 under 0.5 ms) over repeated runs by `cargo xtask validate`.
//! (The lateness the line reports ends when its verdict returns; a packet
//! may leave a few microseconds later, so that bounds nothing.)

use std::{
    collections::{HashMap, VecDeque},
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tracer::lab::{self, truth, Lab, LabSpec, WanSpec};

mod common;
use common::{guests_or_skip, root_or_skip};

const RTT_MS: f64 = 20.0;
const RATE_MBIT: u32 = 200;

/// One captured packet of the upload.
struct Captured {
    time_us: i64,
    /// Arrived on the edge (from the server, or from the bottleneck).
    incoming: bool,
    from_server: bool,
    /// What tells one packet from another in the same direction.
    key: String,
    tcp_len: u64,
}

fn read_capture(path: &std::path::Path) -> Vec<Captured> {
    let out = Command::new("tshark")
        .args([
            "-r",
            path.to_str().unwrap(),
            "-T",
            "fields",
            "-E",
            "separator=|",
        ])
        .args([
            "-e",
            "frame.time_epoch",
            "-e",
            "sll.pkttype",
            "-e",
            "tcp.srcport",
        ])
        .args([
            "-e",
            "tcp.dstport",
            "-e",
            "tcp.seq_raw",
            "-e",
            "tcp.ack_raw",
        ])
        .args([
            "-e",
            "tcp.window_size_value",
            "-e",
            "tcp.options",
            "-e",
            "tcp.len",
        ])
        .output()
        .expect("tshark (cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let secs: f64 = f[0].parse().unwrap();
            Captured {
                time_us: (secs * 1e6).round() as i64,
                // Linux cooked capture: 0 is to this host, 4 is outgoing.
                incoming: f[1] != "4",
                from_server: f[2] == lab::SERVER_PORT.to_string(),
                key: f[2..8].join("|"),
                tcp_len: f[8].parse().unwrap_or(0),
            }
        })
        .collect()
}

#[test]
fn the_wan_path_holds_each_packet_one_round_trip_and_shapes_the_data() {
    if !root_or_skip("the_wan_path_holds_each_packet_one_round_trip_and_shapes_the_data") {
        return;
    }
    let mut spec = LabSpec::new(lab::Mode::Off, 2);
    spec.wan = WanSpec {
        rtt_ms: Some(RTT_MS),
        rate_mbit: Some(RATE_MBIT),
    };
    spec.bytes_per_flow = 24 << 20;
    spec.timeout = Duration::from_secs(60);
    let mut lab = Lab::create(&spec).unwrap();
    let dir = std::env::temp_dir().join(format!("tracer-wan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("edge.pcap");
    let mut dump = Command::new("ip")
        .args(["netns", "exec", &lab.topo.edge_ns, "tcpdump", "-i", "any"])
        // Immediate mode: every packet reaches the file before SIGINT (no
        // ring block left waiting for its timeout).
        .args(["--immediate-mode", "-s", "128", "-B", "32768"])
        .args(["-w", pcap.to_str().unwrap()])
        .args(["tcp", "port", &lab::SERVER_PORT.to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump (cargo xtask setup installs it)");
    let mut said = BufReader::new(dump.stderr.take().unwrap());
    let mut line = String::new();
    while said.read_line(&mut line).unwrap() > 0 && !line.contains("listening on") {
        line.clear();
    }
    assert!(
        line.contains("listening on"),
        "tcpdump did not start: {line}"
    );

    lab.start_upload().unwrap();
    let deadline = Instant::now() + spec.timeout + Duration::from_secs(5);
    while !lab.finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Three round trips for the last of the teardown to come through.
    std::thread::sleep(Duration::from_secs_f64(3.0 * RTT_MS / 1e3));
    let server_sent =
        lab::in_netns(&lab.topo.server_ns, || truth::nstat(&["TcpOutSegs"])).unwrap()["TcpOutSegs"];
    let outcome = lab.finish().unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(dump.id() as i32, libc::SIGINT) };
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut said, &mut rest);
    dump.wait().unwrap();
    drop(lab);

    let flow = &outcome.flows[0];
    assert_eq!(flow.received, flow.sent, "every byte sent arrives");
    let wan = outcome.wan.expect("the lab reports its WAN");
    println!("{}", serde_json::to_string(&wan).unwrap());
    println!("tcpdump: {}", rest.trim().replace('\n', "; "));
    // Every packet the server sent went through the delay line, none lost.
    assert_eq!(wan.delayed, server_sent, "held = the server's TcpOutSegs");
    assert_eq!(wan.delay_dropped, 0);
    let late = wan.late_us.expect("lateness measured");
    // The sender's own measure: no round trip shorter than the path's.
    assert!(
        f64::from(flow.min_rtt_us) >= RTT_MS * 1e3,
        "min_rtt {} us",
        flow.min_rtt_us
    );

    let packets = read_capture(&pcap);
    let capture_lost = !rest
        .lines()
        .any(|l| l.trim() == "0 packets dropped by kernel");
    // Each packet from the server, in the order it came, against the same
    // packet leaving (the delay line is first in, first out).
    let mut waiting: HashMap<&str, VecDeque<i64>> = HashMap::new();
    let (mut matched, mut errors) = (0u64, Vec::new());
    for p in packets.iter().filter(|p| p.from_server) {
        if p.incoming {
            waiting.entry(&p.key).or_default().push_back(p.time_us);
            continue;
        }
        let came = waiting
            .get_mut(p.key.as_str())
            .and_then(VecDeque::pop_front)
            .expect("every packet leaving came in first (the capture began before the upload)");
        let held = p.time_us - came;
        let error = held - (RTT_MS * 1e3) as i64;
        // (1 us: the capture's clock and the line's round apart.)
        assert!(
            error >= -1,
            "a packet held {held} us for a {RTT_MS} ms round trip: let go early"
        );
        errors.push(error);
        matched += 1;
    }
    if !capture_lost {
        assert_eq!(
            matched, wan.delayed,
            "each held packet captured coming and going"
        );
    }
    // How late the line lets packets go is this machine's scheduling, a
    // statistic: printed here, issue 16's target (p99 under 0.5 ms) held
    // over repeated runs in `cargo xtask validate`.
    errors.sort_unstable();
    println!(
        "delay error (capture): p50 {} us, p99 {} us, max {} us over {matched} packets; the lab's own: {late:?}",
        errors[errors.len() / 2],
        errors[errors.len() * 99 / 100],
        errors[errors.len() - 1]
    );

    // The data after the bottleneck, over the middle half of the upload
    // (the window past slow start): printed, the bound held in validate.
    let data: Vec<&Captured> = packets
        .iter()
        .filter(|p| !p.from_server && p.incoming && p.tcp_len > 0)
        .collect();
    let (a, b) = (data.len() / 4, data.len() * 3 / 4);
    let mss = 1448;
    let frames: u64 = data[a + 1..=b]
        .iter()
        .map(|p| p.tcp_len + p.tcp_len.div_ceil(mss) * (1514 - mss))
        .sum();
    let mbit = frames as f64 * 8.0 / (data[b].time_us - data[a].time_us) as f64;
    println!("bottleneck: {mbit:.1} Mbit/s of frames for {RATE_MBIT} asked");
    assert!(
        mbit <= f64::from(RATE_MBIT) * 1.02,
        "the bucket let {mbit:.1} Mbit/s through"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A guest sender (Linux 6.1 in user-mode-linux, forwarded by the
/// client) crosses the same path, as `tracer lab` runs it (the guest runs
/// the tracer's own binary): its socket buffers raised for the window
/// (read back inside it), no round trip of its shorter than the path's,
/// every byte received, nothing lost in the delay line.
#[test]
fn a_guest_sender_crosses_the_wan_path_with_its_buffers_raised() {
    if !guests_or_skip("a_guest_sender_crosses_the_wan_path_with_its_buffers_raised") {
        return;
    }
    let out = Command::new(common::BIN)
        .args(["lab", "--json", "--quiet", "--mode", "off", "--queues", "2"])
        .args(["--sender", "rack-tlp", "--flows", "1", "--bytes", "16M"])
        .args([
            "--rtt",
            &RTT_MS.to_string(),
            "--rate",
            &RATE_MBIT.to_string(),
        ])
        .args(["--duration", "60", "--ring-mib", "64"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lab = &r["lab"];
    let guest = &lab["senders"][0]["guest"];
    assert_eq!(guest["errors"].as_array().map(Vec::len), Some(0), "{guest}");
    for (knob, value) in lab::wan::BUFFERS {
        assert_eq!(guest["sysctls"][knob], value, "{knob}");
    }
    let flow = &lab["flows"][0];
    assert_eq!(flow["sender"], "rack-tlp");
    assert_eq!(flow["received"], flow["sent"], "every byte sent arrives");
    assert_eq!(common::u(&flow["sent"]), 16 << 20);
    assert!(
        common::u(&flow["min_rtt_us"]) as f64 >= RTT_MS * 1e3,
        "the guest's min_rtt {}",
        flow["min_rtt_us"]
    );
    let wan = &lab["wan"];
    println!("{wan}");
    assert!(common::u(&wan["delayed"]) > 0);
    assert_eq!(common::u(&wan["delay_dropped"]), 0);
}
