//! The `tracer` binary as a user runs it: bad input gets one clear line and
//! exit code 2 with nothing attached; a real recording ends cleanly on its
//! duration and on SIGINT; a SIGKILLed tracer leaves nothing attached.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use tracer::{
    kernel,
    lab::{self, Lab, LabSpec, Topology, Upload, UploadSpec},
};

mod common;
use common::{root_or_skip, BIN};

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run tracer")
}

/// Waits until none of our programs is loaded (tracing links release their
/// program after an RCU grace period).
fn nothing_loaded() -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if kernel::loaded_tracer_programs().is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn bad_input_gets_one_line_and_exit_2() {
    if !root_or_skip("bad_input_gets_one_line_and_exit_2") {
        return;
    }
    let cases: &[(&[&str], &str)] = &[
        (
            &["record", "--iface", "nosuch0"],
            "no interface named 'nosuch0'",
        ),
        (
            &["record", "--iface", "lo", "--netns", "nosuch-ns"],
            "cannot enter network namespace 'nosuch-ns'",
        ),
        (
            &["record", "--iface", "lo", "--filter", "port x"],
            "bad --filter: 'x' is not a port",
        ),
        (
            &["record", "--iface", "lo", "--filter", "net 10.0.0.0/40"],
            "prefix length",
        ),
        (
            &[
                "record",
                "--iface",
                "lo",
                "--out",
                "/nonexistent/dir/t.jsonl",
            ],
            "cannot write output file '/nonexistent/dir/t.jsonl'",
        ),
        (
            &["record", "--iface", "lo", "--duration=-1"],
            "--duration -1",
        ),
        (
            &["record", "--iface", "lo", "--duration", "1e9"],
            "between 0 and 86400",
        ),
        (
            &["record", "--iface", "lo", "--ring-mib", "3"],
            "power of two",
        ),
        (&["lab", "--flows", "0"], "--flows 0"),
        (
            &["lab", "--rtt", "500"],
            "--rtt 500: give a round trip of 1 to 200",
        ),
        (
            &["lab", "--rate", "0"],
            "--rate 0: give a bottleneck of 1 to 10000",
        ),
        (&["lab", "--repoints", "0"], "--repoints 0"),
        (
            &["lab", "--sender", "classic", "--pace", "100"],
            "--pace 100: guest senders are never paced",
        ),
        (
            &["lab", "--queue-bdp", "500"],
            "--queue-bdp 500: give 0 to 100",
        ),
        (
            &["record", "--iface", "lo", "--memory-mib", "8"],
            "--memory-mib 8: give 64 to 1048576",
        ),
        (
            // The ring alone is mapped twice: 128 MB of a 64 MB budget.
            &[
                "record",
                "--iface",
                "lo",
                "--memory-mib",
                "64",
                "--ring-mib",
                "64",
            ],
            "which leaves the flows too little: give at least",
        ),
        (
            &["record", "--iface", "lo", "--xdp-mode", "native"],
            "lo has no native XDP support",
        ),
        (&["lab", "--bytes", "lots"], "not a size"),
        (
            &["record", "--iface", "lo", "--out", "/tmp/t.pcap"],
            "name the file FILE.pcapng",
        ),
        (
            &["record", "--iface", "lo", "--summary", "0"],
            "--summary 0: give the sample, 1",
        ),
        (
            &["record", "--iface", "lo", "--metrics-addr", "localhost"],
            "--metrics-addr localhost: give a port (loopback) or ADDRESS:PORT",
        ),
        (
            &["record", "--iface", "lo", "--snaplen", "100"],
            "--snaplen applies to a pcapng trace",
        ),
        (
            &[
                "record",
                "--iface",
                "lo",
                "--out",
                "/tmp/t.pcapng",
                "--snaplen",
                "0",
            ],
            "--snaplen 0: give 1 to 4096",
        ),
        (
            &["record", "--iface", "lo", "--out", "/nonexistent/t.pcapng"],
            "cannot write output file '/nonexistent/t.pcapng'",
        ),
        (
            &[
                "analyze",
                "../fuzz/seeds/lab-tracer.pcapng",
                "--plot",
                "/nonexistent/p.svg",
            ],
            "cannot write output file '/nonexistent/p.svg'",
        ),
        (
            &["watch", "--iface", "lo", "--interval", "0"],
            "--interval 0: give 1 to 86400 seconds",
        ),
        (
            &["watch", "--iface", "lo", "--keep", "0"],
            "--keep 0: give 1 to 1000000 files",
        ),
        (
            &["watch", "--iface", "lo", "--out", "/tmp/t.pcapng"],
            "watch keeps no single trace file",
        ),
        (
            &[
                "watch",
                "--iface",
                "lo",
                "--reports",
                "/proc/tracer-reports",
            ],
            "cannot write output file '/proc/tracer-reports'",
        ),
        (
            &["watch", "--iface", "lo", "--snaplen", "100"],
            "--snaplen applies to the trace: add --pcapng DIR",
        ),
        (
            &["watch", "--iface", "lo", "--pcapng", "/tmp/r", "-C", "0"],
            "--pcapng-mib 0: give 1 to 1048576 MiB",
        ),
        (
            &["watch", "--iface", "lo", "--pcapng", "/tmp/r", "-W", "0"],
            "--pcapng-files 0: give 1 to 1000000 files",
        ),
        (
            &[
                "watch",
                "--iface",
                "lo",
                "--pcapng",
                "/tmp/r",
                "--snaplen",
                "0",
            ],
            "--snaplen 0: give 1 to 4096",
        ),
        (
            &["watch", "--iface", "lo", "--pcapng", "/proc/tracer-ring"],
            "cannot write output file '/proc/tracer-ring'",
        ),
    ];
    for (args, needle) in cases {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        if !needle.contains("size") {
            // clap's own usage errors print a usage block; ours are one line.
            assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        }
        assert!(nothing_loaded(), "{args:?} left programs loaded");
    }
}

/// A run that fails to start leaves the files it was given as they were.
#[test]
fn a_failed_start_neither_clobbers_nor_leaves_output_files() {
    if !root_or_skip("a_failed_start_neither_clobbers_nor_leaves_output_files") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tracer-cli-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let old = dir.join("yesterday.pcapng");
    std::fs::write(&old, b"yesterday's trace").unwrap();
    let new = dir.join("new.jsonl");
    for out in [&old, &new] {
        let o = Command::new(BIN)
            .args(["record", "--iface", "nosuch0", "--out"])
            .arg(out)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
    }
    assert_eq!(std::fs::read(&old).unwrap(), b"yesterday's trace");
    assert!(!new.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Loopback has no driver XDP: the default falls back to generic.
#[test]
fn auto_mode_falls_back_to_generic_xdp() {
    if !root_or_skip("auto_mode_falls_back_to_generic_xdp") {
        return;
    }
    let out = run(&["record", "--iface", "lo", "--duration", "0.5", "--quiet"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("tracing TCP received on lo (XDP generic)"),
        "{stderr}"
    );
    assert!(nothing_loaded());
}

#[test]
fn not_root_is_told_how_to_rerun() {
    if !root_or_skip("not_root_is_told_how_to_rerun") {
        return;
    }
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--", BIN, "record", "--iface", "lo"])
        .output()
        .expect("runuser");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("needs root: rerun as root"), "{stderr}");
}

/// Starts `tracer record` on the lab's server side and waits until it says
/// it is tracing. Returns the child and the stderr lines after that one.
fn start_record(topo: &Topology, extra: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(BIN)
        .args([
            "record",
            "--iface",
            lab::SERVER_IF,
            "--netns",
            &topo.server_ns,
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tracer");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("tracer started");
    assert!(
        first.starts_with("tracing TCP received on veth-s"),
        "{first}"
    );
    (child, rx)
}

/// Bytes covered by (seq, length) segments, each byte once (sequence
/// numbers taken from the first segment's, modulo 2^32).
fn distinct_bytes(segments: &[(u32, u32)]) -> u64 {
    let Some(&(first, _)) = segments.first() else {
        return 0;
    };
    let mut ranges: Vec<(u64, u64)> = segments
        .iter()
        .filter(|(_, len)| *len > 0)
        .map(|&(seq, len)| {
            let start = u64::from(seq.wrapping_sub(first));
            (start, start + u64::from(len))
        })
        .collect();
    ranges.sort_unstable();
    let (mut covered, mut reach) = (0, 0);
    for (start, end) in ranges {
        covered += end.saturating_sub(start.max(reach));
        reach = reach.max(end);
    }
    covered
}

fn upload(topo: &Topology, bytes: u64) -> Upload {
    Upload::start(
        topo,
        &UploadSpec {
            flows: 1,
            bytes_per_flow: bytes,
            port: 5201,
            ipv6: false,
            timeout: Duration::from_secs(30),
            pacing: None,
            sysctls: Vec::new(),
        },
    )
    .expect("upload")
}

#[test]
fn record_writes_json_lines_and_ends_on_its_duration() {
    if !root_or_skip("record_writes_json_lines_and_ends_on_its_duration") {
        return;
    }
    let net = Lab::create(&LabSpec::new(lab::Mode::Off, 4)).unwrap();
    let topo = &net.topo;
    let dir = std::env::temp_dir().join(format!("tracer-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    let (child, _stderr) = start_record(
        topo,
        &[
            "--duration",
            "3",
            "--quiet",
            "--out",
            path.to_str().unwrap(),
        ],
    );
    let up = upload(topo, 8 << 20);
    let out = child.wait_with_output().unwrap();
    let result = up.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("(duration reached)"), "{stdout}");
    assert!(stdout.contains("dropped    0 events"), "{stdout}");

    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("valid JSON line"))
        .collect();
    let wrote = format!("wrote      {} observations", lines.len());
    assert!(stdout.contains(&wrote), "{wrote} not in {stdout}");
    // The file holds every byte of the upload the receiver counted, each
    // once however often it was sent.
    let src = result[0].flow.src.to_string();
    let segments: Vec<(u32, u32)> = lines
        .iter()
        .filter(|l| l["kind"] == "segment" && l["flow"]["src"] == src.as_str())
        .map(|l| {
            let n = |k: &str| l[k].as_u64().unwrap() as u32;
            (n("seq"), n("payload_len"))
        })
        .collect();
    assert_eq!(distinct_bytes(&segments), result[0].received);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(nothing_loaded());
}

#[test]
fn sigint_ends_with_a_summary_and_sigkill_leaves_nothing_attached() {
    if !root_or_skip("sigint_ends_with_a_summary_and_sigkill_leaves_nothing_attached") {
        return;
    }
    let net = Lab::create(&LabSpec::new(lab::Mode::Off, 4)).unwrap();
    let topo = &net.topo;
    let xdp_attached = || {
        lab::ip(&["-n", &topo.server_ns, "-d", "link", "show", lab::SERVER_IF])
            .unwrap()
            .contains("prog/xdp")
    };

    let (child, _stderr) = start_record(topo, &[]);
    assert!(xdp_attached());
    let up = upload(topo, 4 << 20);
    up.join().unwrap();
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("(SIGINT)"), "{stdout}");
    assert!(stdout.contains("flows, most reordered first"), "{stdout}");
    // The report names the kernel, and says what it lacks: before 6.17,
    // tracefs shows tcp_retransmit_skb without its `err`.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(
        stdout.contains(&format!("  linux      {}\n", release.trim())),
        "{stdout}"
    );
    let format = "/sys/kernel/tracing/events/tcp/tcp_retransmit_skb/format";
    if let Ok(format) = std::fs::read_to_string(format) {
        let lacks = stdout.contains("  missing    tcp_retransmit_skb passes no err");
        assert_eq!(lacks, !format.contains("int err;"), "{stdout}");
    }
    assert!(!xdp_attached());
    assert!(nothing_loaded());

    let (mut child, _stderr) = start_record(topo, &[]);
    assert!(xdp_attached());
    child.kill().unwrap(); // SIGKILL: no destructor runs
    child.wait().unwrap();
    assert!(
        !xdp_attached(),
        "a killed tracer must not leave XDP attached"
    );
    assert!(
        nothing_loaded(),
        "a killed tracer must not leave programs loaded"
    );
}
