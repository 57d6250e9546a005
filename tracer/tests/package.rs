//! The Debian package as a host without Rust gets it (root; in CI):
//! `cargo xtask dist` builds it, `dpkg -i` installs it, the installed
//! binary traces the lab, and `tracer watch` runs under its unit's user and
//! capabilities by hand (no systemd runs here); `dpkg --purge` leaves
//! nothing of it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use serde_json::Value;
use tracer::lab::{self, Lab, LabSpec};

mod common;
use common::{lines, read_one_connection, root_or_skip, said, send, signal, u};

const INSTALLED: &str = "/usr/bin/tracer";

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn installed() -> bool {
    Command::new("dpkg")
        .args(["-s", "tracer"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn exists(what: &str, name: &str) -> bool {
    Command::new("getent")
        .args([what, name])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The package to install: the one `cargo xtask test` built before the
/// suite (outside this test's time bound), else built now.
fn package() -> PathBuf {
    if let Some(deb) = std::env::var_os("TRACER_PACKAGE") {
        return deb.into();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    run(Command::new(env!("CARGO"))
        .args(["xtask", "dist"])
        .current_dir(root));
    std::fs::read_dir(root.join("target/dist"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("a .deb in target/dist")
}

/// Purges the package on drop, whatever happened.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "tracer"]).output();
    }
}

/// The package built, installed, used and purged: every file it lists is
/// where it says, the service's user made; the installed binary's report
/// of a lab connection has its bytes exactly; `watch` as user `tracer`
/// with the unit's three capabilities (ambient, the bounding set cut, no
/// new privileges) traces a loopback connection and keeps those three
/// alone; the unit passes `systemd-analyze verify`, each man page opens;
/// after the purge no file, user, group or state directory is left.
#[test]
fn the_package_installs_runs_and_purges_leaving_nothing() {
    if !root_or_skip("the_package_installs_runs_and_purges_leaving_nothing") {
        return;
    }
    if installed() {
        eprintln!(
            "the_package_installs_runs_and_purges_leaving_nothing: skipped: a tracer package is installed on this host (the test installs and purges its own)"
        );
        return;
    }
    let deb = package();
    let _purge = Installed;
    run(Command::new("dpkg").arg("-i").arg(&deb));
    let listed =
        String::from_utf8(run(Command::new("dpkg").args(["-L", "tracer"])).stdout).unwrap();
    let files: Vec<&str> = listed.lines().filter(|l| Path::new(l).is_file()).collect();
    for want in [
        INSTALLED,
        "/lib/systemd/system/tracer-watch@.service",
        "/etc/default/tracer",
        "/usr/share/man/man1/tracer-watch.1.gz",
        "/usr/share/bash-completion/completions/tracer",
        "/usr/share/tracer/prometheus/alerts.yml",
        "/usr/share/tracer/grafana/tracer.json",
    ] {
        assert!(files.contains(&want), "{want} not in the package: {listed}");
    }
    assert!(exists("passwd", "tracer"), "the service's user");
    for page in ["tracer", "tracer-record", "tracer-watch", "tracer-analyze"] {
        run(Command::new("man").args(["-w", page]));
    }
    run(Command::new("systemd-analyze").args(["verify", "tracer-watch@lo.service"]));

    // The installed binary on the lab: a connection's bytes exactly.
    const BYTES: usize = 2 << 20;
    let mut spec = LabSpec::new(lab::Mode::Off, 4);
    spec.timeout = Duration::from_secs(60);
    let lab = Lab::create(&spec).expect("lab");
    let mut record = Command::new(INSTALLED)
        .args([
            "record",
            "--iface",
            lab::SERVER_IF,
            "--netns",
            &lab.topo.server_ns,
        ])
        .args(["--json", "--quiet"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines(record.stderr.take().unwrap());
    said(&rx, "tracing TCP received on");
    assert_eq!(send(&lab, 5801, BYTES), BYTES);
    std::thread::sleep(Duration::from_secs(1));
    signal(&record, libc::SIGINT);
    let out = record.wait_with_output().unwrap();
    drop(lab);
    assert_eq!(out.status.code(), Some(0));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let to = format!("{}:5801", lab::SERVER_V4);
    let flow = r["flows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["dst"] == to.as_str())
        .expect("the connection's flow");
    assert_eq!(u(&flow["seq_advance_bytes"]), BYTES as u64);

    // `watch` as the unit runs it: its user, its three capabilities.
    let state = Path::new("/var/lib/tracer/lo");
    std::fs::create_dir_all(state).unwrap();
    run(Command::new("chown").args(["-R", "tracer:tracer", "/var/lib/tracer"]));
    let caps = "+bpf,+perfmon,+net_admin";
    let mut watch = Command::new("setpriv")
        .args([
            "--reuid=tracer",
            "--regid=tracer",
            "--clear-groups",
            "--no-new-privs",
        ])
        .arg(format!("--inh-caps=-all,{caps}"))
        .arg(format!("--ambient-caps=-all,{caps}"))
        .arg(format!("--bounding-set=-all,{caps}"))
        .args([INSTALLED, "watch", "--iface", "lo", "--filter", "port 5802"])
        .args([
            "--interval",
            "1",
            "--metrics-addr",
            "127.0.0.1:0",
            "--reports",
        ])
        .arg(state)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines(watch.stderr.take().unwrap());
    let first = said(&rx, "watching TCP received on lo");
    assert!(
        first.contains("as user tracer, keeping CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN"),
        "{first}"
    );
    let server = read_one_connection(std::net::TcpListener::bind("127.0.0.1:5802").unwrap());
    {
        use std::io::Write;
        let mut c = std::net::TcpStream::connect("127.0.0.1:5802").unwrap();
        c.write_all(&vec![0x5a; BYTES]).unwrap();
    }
    assert_eq!(server.join().unwrap(), BYTES);
    said(&rx, "tracer: interval ");
    let status = std::fs::read_to_string(format!("/proc/{}/status", watch.id())).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(field("CapEff:"), "000000c000001000", "{status}");
    assert_eq!(field("CapPrm:"), "000000c000001000", "{status}");
    signal(&watch, libc::SIGTERM);
    assert_eq!(watch.wait().unwrap().code(), Some(0));
    let reports = std::fs::read_dir(state).unwrap().count();
    assert!(reports >= 2, "{reports} reports in {}", state.display());
    let seen: u64 = std::fs::read_dir(state)
        .unwrap()
        .map(|e| {
            let r: Value =
                serde_json::from_str(&std::fs::read_to_string(e.unwrap().path()).unwrap()).unwrap();
            r["flows"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["dst"] == "127.0.0.1:5802")
                .map(|f| u(&f["in_interval"]["seq_advance_bytes"]))
                .sum::<u64>()
        })
        .sum();
    assert_eq!(seen, BYTES as u64);

    run(Command::new("dpkg").args(["--purge", "tracer"]));
    let left: Vec<&&str> = files.iter().filter(|f| Path::new(f).exists()).collect();
    assert!(left.is_empty(), "left after the purge: {left:?}");
    assert!(!installed());
    assert!(!exists("passwd", "tracer") && !exists("group", "tracer"));
    assert!(!Path::new("/var/lib/tracer").exists());
}
