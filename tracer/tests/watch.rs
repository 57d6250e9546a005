//! `tracer watch` as a service lives (root; in CI): a report every
//! interval, the latest kept, the interface going and coming back without
//! a flag, SIGHUP reopening its directory, SIGTERM writing the last
//! interval and detaching; every connection's bytes in the intervals; the
//! capabilities it keeps, read from /proc.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tracer::{
    kernel,
    lab::{self, Lab, LabSpec},
};

mod common;
use common::{
    read_one_connection, root_or_skip, send, signal, tshark_frames, u,
    watched::{bytes_to, Watched},
};

/// The tracer's programs still loaded 5 s after its end (the kernel lets
/// go of them asynchronously).
fn programs_left() -> Vec<(u32, String)> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = kernel::loaded_tracer_programs();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// A lab of the plain path, its uploads not started.
fn plain_lab() -> Lab {
    let mut spec = LabSpec::new(lab::Mode::Off, 4);
    spec.timeout = Duration::from_secs(60);
    Lab::create(&spec).expect("lab")
}

/// With `watch`'s defaults, as user nobody, and one-second intervals kept
/// three at a time:
/// one connection; the server's interface down (said, the programs kept)
/// and up (said), another connection; the server's link deleted and made
/// again (followed without a flag); the reports' directory replaced by a
/// file (a report fails) while a third connection sends, then removed,
/// and SIGHUP; SIGTERM. Every report is read as it is written: numbered one by one,
/// none lost an event, and each connection's bytes summed over them are
/// the bytes the server read; the directory holds the last three, the last
/// marked so; exit 0 and nothing left attached.
#[test]
fn watch_reports_every_interval_through_a_flap_a_sighup_and_sigterm() {
    if !root_or_skip("watch_reports_every_interval_through_a_flap_a_sighup_and_sigterm") {
        return;
    }
    const BYTES: usize = 4 << 20;
    let lab = plain_lab();
    let mut w = Watched::on_server(&lab, "flap", "1", &["--keep", "3", "--user", "nobody"]);
    w.said("watching TCP received on");
    assert_eq!(send(&lab, 5501, BYTES), BYTES);
    w.said("tracer: interval ");
    lab.topo.server_down().unwrap();
    w.said("went down: its programs stay attached");
    lab.topo.server_up().unwrap();
    w.said("is up again after");
    assert_eq!(send(&lab, 5503, BYTES), BYTES);
    lab::ip(&["-n", &lab.topo.server_ns, "link", "delete", lab::SERVER_IF]).unwrap();
    w.said("waiting for it to come back");
    lab.topo.relink_server().unwrap();
    w.said("attached again");
    // The directory taken away (a file in its place): a report that
    // cannot be written is said, and the next one covers its interval.
    std::fs::remove_dir_all(&w.dir).unwrap();
    std::fs::write(&w.dir, b"").unwrap();
    assert_eq!(send(&lab, 5502, BYTES), BYTES);
    w.said("the next report covers this interval too");
    std::fs::remove_file(&w.dir).unwrap();
    signal(&w.child, libc::SIGHUP);
    w.said("reopened");
    // Three more, all made after the directory was: the last three.
    for _ in 0..3 {
        w.said("tracer: interval ");
    }
    signal(&w.child, libc::SIGTERM);
    let (status, read) = w.end();
    drop(lab);
    let files = files_in(&w.dir);
    assert_eq!(status.code(), Some(0));
    // (The deletion may be seen as a down first, in the instant before
    // the link is gone.)
    let closing: Vec<String> = w.rx.try_iter().collect();
    let downs: u64 = closing
        .iter()
        .find_map(|l| l.strip_prefix("down       "))
        .and_then(|l| l.split(' ').next())
        .unwrap_or_else(|| panic!("the down not counted: {closing:?}"))
        .parse()
        .unwrap();
    let summed = |what: &str| -> u64 { read.iter().map(|(_, r)| u(&r["interface"][what])).sum() };
    assert!(downs >= 1);
    assert_eq!(summed("went_down"), downs, "the reports count the downs");
    assert_eq!(summed("attached_again"), 1, "and the one deletion");
    assert!(read.len() >= 3, "{} intervals", read.len());
    for (i, (path, r)) in read.iter().enumerate() {
        let at = path.display();
        assert_eq!(u(&r["interval"]["number"]), i as u64 + 1, "{at}");
        assert_eq!(r["interval"]["last"], i + 1 == read.len(), "{at}");
        assert_eq!(u(&r["dropped_events"]), 0, "{at}");
    }
    for port in [5501, 5502, 5503] {
        let to = format!("{}:{port}", lab::SERVER_V4);
        assert_eq!(bytes_to(&read, &to), BYTES as u64, "to {to}");
    }
    let last_three: Vec<PathBuf> = read[read.len() - 3..].iter().map(|r| r.0.clone()).collect();
    assert_eq!(
        files, last_three,
        "the directory keeps the latest three alone"
    );
    let left = programs_left();
    assert!(left.is_empty(), "programs left: {left:?}");
}

/// Each of the process's threads: (CapEff, CapPrm, the Uid and Gid lines)
/// from /proc/PID/task/*/status.
fn privileges(pid: u32) -> Vec<(u64, u64, String, String)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in {status}"))
                .trim()
                .to_string()
        };
        let hex = |name: &str| u64::from_str_radix(&field(name), 16).unwrap();
        threads.push((hex("CapEff:"), hex("CapPrm:"), field("Uid:"), field("Gid:")));
    }
    threads
}

/// `bytes` to a listener on 127.0.0.1:`port`, the client closing after;
/// what the listener read.
fn send_on_loopback(port: u16, bytes: usize) -> usize {
    use std::io::Write;
    let server = read_one_connection(std::net::TcpListener::bind(("127.0.0.1", port)).unwrap());
    std::net::TcpStream::connect(("127.0.0.1", port))
        .unwrap()
        .write_all(&vec![0x5a; bytes])
        .unwrap();
    server.join().unwrap()
}

/// The user nobody's uid and gid, from /etc/passwd.
fn nobody() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let line = passwd.lines().find(|l| l.starts_with("nobody:")).unwrap();
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().unwrap(), f[3].parse().unwrap())
}

/// Once attached, `watch` keeps exactly the capabilities attaching again
/// needs (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN: the host's namespace needs
/// no CAP_SYS_ADMIN), and none with `--no-reattach`, here as user nobody
/// too: every thread's CapEff and CapPrm, Uid and Gid, read from /proc.
/// Either way it traces on: a connection's bytes in its reports, and its
/// first line says what it kept.
#[test]
fn watch_keeps_only_the_capabilities_attaching_again_needs() {
    if !root_or_skip("watch_keeps_only_the_capabilities_attaching_again_needs") {
        return;
    }
    const BYTES: usize = 1 << 20;
    let attach_again: u64 = (1 << 39) | (1 << 38) | (1 << 12);
    let (uid, gid) = nobody();
    for (extra, caps, ids, port, kept) in [
        (
            &[][..],
            attach_again,
            (0, 0),
            5601,
            "as root, keeping CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN (to attach again when lo comes back)",
        ),
        (
            &["--no-reattach", "--user", "nobody"][..],
            0,
            (uid, gid),
            5602,
            "as user nobody, keeping no capability (it will not attach again (--no-reattach))",
        ),
    ] {
        let filter = format!("port {port}");
        let mut w = Watched::start(
            &["--iface", "lo", "--filter", &filter],
            &port.to_string(),
            "1",
            extra,
        );
        let first = w.rx.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(first.contains(kept), "{extra:?}: the first line: {first}");
        assert_eq!(send_on_loopback(port, BYTES), BYTES);
        w.said("tracer: interval ");
        let threads = privileges(w.child.id());
        assert!(threads.len() >= 2, "{extra:?}: the metrics thread too: {threads:?}");
        let all = |id: u32| format!("{id}\t{id}\t{id}\t{id}");
        for t in &threads {
            assert_eq!((t.0, t.1), (caps, caps), "{extra:?}: {threads:?}");
            assert_eq!((&t.2, &t.3), (&all(ids.0), &all(ids.1)), "{extra:?}: Uid, Gid");
        }
        signal(&w.child, libc::SIGTERM);
        let (status, read) = w.end();
        assert_eq!(status.code(), Some(0), "{extra:?}");
        assert_eq!(bytes_to(&read, &format!("127.0.0.1:{port}")), BYTES as u64, "{extra:?}");
    }
}

/// With `--no-reattach` as user nobody, the server's interface in the
/// lab's namespace: no capability kept, yet its deletion is seen (the
/// tracer looks through a socket it made in the namespace, entering none):
/// the last interval is written, with the connection's bytes in the
/// reports, and the run ends with exit 1.
#[test]
fn without_capabilities_watch_still_sees_its_interface_go() {
    if !root_or_skip("without_capabilities_watch_still_sees_its_interface_go") {
        return;
    }
    const BYTES: usize = 1 << 20;
    let lab = plain_lab();
    let mut w = Watched::on_server(&lab, "gone", "1", &["--no-reattach", "--user", "nobody"]);
    w.said("keeping no capability");
    assert_eq!(send(&lab, 5701, BYTES), BYTES);
    w.said("tracer: interval ");
    assert_eq!(privileges(w.child.id())[0].0, 0);
    lab::ip(&["-n", &lab.topo.server_ns, "link", "delete", lab::SERVER_IF]).unwrap();
    let (status, read) = w.end();
    drop(lab);
    assert_eq!(status.code(), Some(1));
    assert_eq!(read.last().expect("reports").1["interval"]["last"], true);
    let to = format!("{}:5701", lab::SERVER_V4);
    assert_eq!(bytes_to(&read, &to), BYTES as u64);
}

/// One `tracer: pcapng` line: a ring's file ended.
struct Ended {
    path: PathBuf,
    /// Packets and TCP-layer records in it, and its length.
    blocks: u64,
    bytes: u64,
    next: PathBuf,
    removed: Vec<PathBuf>,
}

/// "tracer: pcapng PATH: N packets, R TCP-layer records, B bytes; next
/// PATH[; removed PATH]...".
fn ended(line: &str) -> Option<Ended> {
    let rest = line.strip_prefix("tracer: pcapng /")?;
    let mut parts = rest.split("; ");
    let (path, counts) = parts.next()?.split_once(": ")?;
    let n: Vec<u64> = counts
        .split(", ")
        .map(|c| c.split(' ').next().unwrap().parse().unwrap())
        .collect();
    let next = PathBuf::from(parts.next()?.strip_prefix("next ")?);
    let removed = parts
        .map(|p| PathBuf::from(p.strip_prefix("removed ").unwrap()))
        .collect();
    Some(Ended {
        path: PathBuf::from(format!("/{path}")),
        blocks: n[0] + n[1],
        bytes: n[2],
        next,
        removed,
    })
}

/// `watch --full --pcapng DIR -C 1 -W 3`: connections until the ring has
/// removed a file, then SIGHUP (a new file), then SIGTERM. The directory
/// keeps exactly the last three files begun, each within 1 MiB; every file
/// beyond them was said removed; tshark reads in each kept file exactly
/// the frames its line said (the last: what the total said, less the
/// rest); and the ring wrote exactly what the kernel emitted (the reports'
/// counters), none lost.
#[test]
fn watch_keeps_a_pcapng_ring_of_the_latest_files() {
    if !root_or_skip("watch_keeps_a_pcapng_ring_of_the_latest_files") {
        return;
    }
    const PORT: u16 = 5801;
    let ring = Watched::ring("ring");
    let filter = format!("port {PORT}");
    let mut w = Watched::start(
        &["--iface", "lo", "--filter", &filter],
        "ring",
        "1",
        &[
            "--full",
            "--pcapng",
            ring.to_str().unwrap(),
            "-C",
            "1",
            "-W",
            "3",
        ],
    );
    w.said("watching TCP received on");
    let mut lines = Vec::new();
    // Until the ring has removed a file (a few connections): at most 50.
    for sent in 0.. {
        assert!(
            sent < 50,
            "no file removed after {sent} connections: {lines:?}"
        );
        assert_eq!(send_on_loopback(PORT, 64 << 20), 64 << 20);
        lines.extend(w.rx.try_iter());
        if lines.iter().any(|l| l.contains("; removed ")) {
            break;
        }
    }
    signal(&w.child, libc::SIGHUP);
    let hup = w.said("tracer: pcapng /");
    signal(&w.child, libc::SIGTERM);
    let (status, read) = w.end();
    lines.push(hup);
    lines.extend(w.rx.try_iter());
    assert_eq!(status.code(), Some(0), "{lines:?}");

    let files = files_in(&ring);
    let ends: Vec<Ended> = lines.iter().filter_map(|l| ended(l)).collect();
    let mut begun = vec![ends[0].path.clone()];
    begun.extend(ends.iter().map(|e| e.next.clone()));
    assert_eq!(files, begun[begun.len() - 3..], "the last three begun");
    let removed: Vec<PathBuf> = ends.iter().flat_map(|e| e.removed.clone()).collect();
    assert_eq!(removed, begun[..begun.len() - 3], "the rest said removed");
    let total: u64 = {
        let wrote = lines
            .iter()
            .find_map(|l| l.strip_prefix("wrote "))
            .map(str::trim_start)
            .unwrap_or_else(|| panic!("no total: {lines:?}"));
        let n: Vec<u64> = wrote
            .split(", ")
            .take(2)
            .map(|c| c.split(' ').next().unwrap().parse().unwrap())
            .collect();
        n[0] + n[1]
    };
    for f in &files {
        let size = std::fs::metadata(f).unwrap().len();
        assert!(size <= 1 << 20, "{}: {size} bytes", f.display());
        let said = match ends.iter().find(|e| &e.path == f) {
            Some(e) => {
                assert_eq!(size, e.bytes, "{}", f.display());
                e.blocks
            }
            None => total - ends.iter().map(|e| e.blocks).sum::<u64>(),
        };
        assert_eq!(tshark_frames(f), said, "{}", f.display());
    }
    let emitted: u64 = read
        .iter()
        .map(|(_, r)| {
            let k = &r["kernel"];
            u(&k["xdp_events"]) + u(&k["probe_events"]) + u(&k["retransmit_events"])
        })
        .sum();
    assert_eq!(total, emitted, "every event the kernel emitted, written");
    assert!(read.iter().all(|(_, r)| u(&r["dropped_events"]) == 0));
}
