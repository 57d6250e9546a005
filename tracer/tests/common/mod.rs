//! Shared by the binary's integration tests.
#![allow(dead_code)] // (not every test target needs all of it)

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer::{
    kernel::netns::NetnsGuard,
    lab::{self, Lab},
};

pub mod edge_truth;
mod host;
pub mod prometheus;
pub mod watched;
#[allow(unused_imports)] // (not every test target uses both)
pub use host::{guests_or_skip, root_or_skip, under_tcg};

pub const BIN: &str = env!("CARGO_BIN_EXE_tracer");

/// A child's output, line by line as it comes.
pub fn lines(from: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// A JSON count.
pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// `tracer ARGS`; its stderr lines as they come.
pub fn spawn_tracer(args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tracer");
    let rx = lines(child.stderr.take().unwrap());
    (child, rx)
}

/// `tracer CMD --iface veth-s --netns SERVER ARGS` on the lab's server
/// (`record`, or `live` without a terminal: progress lines).
pub fn tracer_on_server(lab: &Lab, cmd: &str, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut all = vec![
        cmd,
        "--iface",
        lab::SERVER_IF,
        "--netns",
        &lab.topo.server_ns,
    ];
    all.extend(args);
    spawn_tracer(&all)
}

/// Waits (20 s at most) for the line containing `what`; returns it.
pub fn said(rx: &mpsc::Receiver<String>, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("never said {what}"));
        if line.contains(what) {
            return line;
        }
    }
}

pub fn signal(child: &Child, sig: i32) {
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// `bytes` from the lab's client to a listener on the server's `port`,
/// the client closing after; what the server read.
pub fn send(lab: &Lab, port: u16, bytes: usize) -> usize {
    let to: SocketAddr = format!("{}:{port}", lab::SERVER_V4).parse().unwrap();
    let listener = {
        let _ns = NetnsGuard::enter(&lab.topo.server_ns).unwrap();
        TcpListener::bind(to).unwrap()
    };
    let server = read_one_connection(listener);
    {
        let mut c = {
            let _ns = NetnsGuard::enter(&lab.topo.client_ns).unwrap();
            TcpStream::connect_timeout(&to, Duration::from_secs(5)).unwrap()
        };
        c.write_all(&vec![0x5a; bytes]).unwrap();
    }
    server.join().unwrap()
}

/// On a thread: accepts one connection on `listener` and reads it to its
/// end; what it read.
pub fn read_one_connection(listener: TcpListener) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let (mut buf, mut read) = (vec![0u8; 1 << 16], 0);
        loop {
            match s.read(&mut buf).unwrap() {
                0 => return read,
                n => read += n,
            }
        }
    })
}

/// tshark's `fields` of every frame of `file` that `filter` keeps (all,
/// when empty), and everything it said on stderr but its warning about
/// running as root.
pub fn tshark(
    file: &std::path::Path,
    filter: &str,
    fields: &[&str],
) -> (Vec<Vec<String>>, Vec<String>) {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(file)
        .args(["-n", "-T", "fields", "-E", "separator=,"]);
    if !filter.is_empty() {
        cmd.args(["-Y", filter]);
    }
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .expect("tshark (apt package tshark: cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| !l.contains("Running as user \"root\""))
        .map(str::to_string)
        .collect();
    let rows = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    (rows, said)
}

/// tshark's count of the frames in `file` (both of its interfaces).
pub fn tshark_frames(file: &std::path::Path) -> u64 {
    tshark(file, "", &["frame.number"]).0.len() as u64
}
