//! Real servers and clients on the lab's path, Debian's own: nginx in the
//! server's namespace receiving uploads from wrk and curl in the client's.
//! An edge host's traffic, which nobody here wrote: many short connections,
//! keep-alive or `Connection: close`, and (with [`reuse_ports`]) 4-tuples
//! reused within seconds.
//!
//! nginx reads each request's body whole (it proxies the request to a
//! second server on its own loopback: a location that only answered would
//! discard the body unread) and logs, per request, the client's address and
//! port, its connection's serial number and the bytes it read
//! (`$request_length`: request line, headers and body): what the tracer
//! must find, byte for byte, in the connections it reports.
//!
//! Each runs as a child process in its namespace, its files in a
//! directory named after the lab (`/tmp/tracer-lab-PID-N-http`), so that
//! the janitor of a lab whose process died kills them and removes it.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};

use super::{in_netns, write_sysctl, Topology, SERVER_V4};
use crate::SetupError;

/// The port nginx listens on in the server's namespace.
pub const HTTP_PORT: u16 = 8080;

/// One request as nginx logged it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub client: SocketAddr,
    /// nginx's serial number of the connection that carried it.
    pub connection: u64,
    /// Bytes nginx read for it: request line, headers and body.
    pub bytes: u64,
    pub status: u16,
}

/// nginx in `topo`'s server namespace, on [`HTTP_PORT`]; stopped, and its
/// directory removed, on drop.
pub struct Nginx {
    child: Child,
    dir: PathBuf,
    /// Where the lab's server listens: `10.77.2.2:8080`.
    pub addr: SocketAddr,
}

impl Nginx {
    pub fn start(topo: &Topology) -> Result<Self> {
        let dir = lab_dir(topo)?;
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config(&dir)).context("writing nginx.conf")?;
        let child = Command::new("ip")
            .args(["netns", "exec", &topo.server_ns, "nginx", "-e"])
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| missing("nginx", e))?;
        let mut nginx = Nginx {
            child,
            dir,
            addr: SocketAddr::new(SERVER_V4.parse().expect("an address"), HTTP_PORT),
        };
        // Listening once it answers.
        for _ in 0..100 {
            if let Some(status) = nginx.child.try_wait()? {
                let log = std::fs::read_to_string(nginx.dir.join("error.log")).unwrap_or_default();
                bail!("nginx exited ({status}): {}", log.trim());
            }
            let up = in_netns(&topo.server_ns, || {
                std::net::TcpStream::connect_timeout(&nginx.addr, Duration::from_millis(100))
            })?;
            if up.is_ok() {
                return Ok(nginx);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("nginx did not listen on {} within 5 s", nginx.addr)
    }

    /// `http://10.77.2.2:8080/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Every request logged so far, in the order nginx finished them.
    pub fn requests(&self) -> Result<Vec<Request>> {
        let log = std::fs::read_to_string(self.dir.join("access.log"))
            .context("reading nginx's access log")?;
        log.lines()
            .map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let bad = || format!("nginx's access log line {line:?}");
                let field = |i: usize| {
                    f.get(i)
                        .and_then(|v| v.parse::<u64>().ok())
                        .with_context(bad)
                };
                let ip: std::net::IpAddr =
                    f.first().and_then(|a| a.parse().ok()).with_context(bad)?;
                Ok(Request {
                    client: SocketAddr::new(ip, field(1)? as u16),
                    connection: field(2)?,
                    bytes: field(3)?,
                    status: field(4)? as u16,
                })
            })
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// nginx on its own: one process, the lab's files only. `/upload` reads
/// the body whole (proxied to the loopback server, which answers 204).
fn config(dir: &std::path::Path) -> String {
    let d = dir.display();
    format!(
        "daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    log_format requests '$remote_addr $remote_port $connection $request_length $status';
    access_log {d}/access.log requests;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    client_max_body_size 64m;
    client_body_buffer_size 1m;
    keepalive_requests 100000;
    server {{
        listen {SERVER_V4}:{HTTP_PORT} backlog=4096;
        location / {{ proxy_pass http://127.0.0.1:{HTTP_PORT}; }}
    }}
    server {{
        listen 127.0.0.1:{HTTP_PORT};
        access_log off;
        location / {{ return 204; }}
    }}
}}
"
    )
}

/// The lab's directory for these programs' files, made anew.
fn lab_dir(topo: &Topology) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("{}-http", topo.base));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
    Ok(dir)
}

fn missing(what: &str, e: std::io::Error) -> anyhow::Error {
    SetupError::Environment(format!(
        "cannot run {what} ({e}): `cargo xtask setup` installs nginx, wrk and curl"
    ))
    .into()
}

/// Clients in namespace `ns` take their ports from `first..=last` only,
/// as soon as the last connection on the port closed: they keep no
/// TIME_WAIT (`tcp_max_tw_buckets` 0, as a NAT gives a port to the next
/// connection), so every 4-tuple carries connection after connection,
/// milliseconds apart.
pub fn reuse_ports(ns: &str, first: u16, last: u16) -> Result<()> {
    in_netns(ns, || -> Result<()> {
        write_sysctl("net.ipv4.ip_local_port_range", &format!("{first} {last}"))?;
        write_sysctl("net.ipv4.tcp_max_tw_buckets", "0")
    })?
}

/// How a client sends its requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connections {
    /// Many requests a connection (HTTP/1.1's default).
    KeepAlive,
    /// One request a connection (`Connection: close`): nginx closes each.
    Close,
}

/// What wrk said it did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WrkReport {
    pub requests: u64,
    /// Socket errors: connect, read, write, timeout.
    pub errors: u64,
}

/// What a wrk run sends: `connections` at once over `threads`, each
/// POSTing `body` bytes, for `duration`.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    pub threads: u32,
    pub connections: u32,
    pub duration: Duration,
    pub body: usize,
    pub how: Connections,
}

/// wrk in namespace `from` (the lab's client's, or its edge's: nearer the
/// server) sending `load` to `url`.
pub fn wrk(topo: &Topology, from: &str, url: &str, load: Load) -> Result<WrkReport> {
    let Load {
        threads,
        connections,
        duration,
        body,
        how,
    } = load;
    let dir = std::env::temp_dir().join(format!("{}-http", topo.base));
    let script = dir.join(format!("wrk-{body}-{how:?}.lua"));
    let close = match how {
        Connections::Close => "wrk.headers[\"Connection\"] = \"close\"\n",
        Connections::KeepAlive => "",
    };
    std::fs::write(
        &script,
        format!("wrk.method = \"POST\"\nwrk.body = string.rep(\"x\", {body})\n{close}"),
    )
    .context("writing wrk's script")?;
    let out = Command::new("ip")
        .args(["netns", "exec", from, "wrk"])
        .arg(format!("-t{threads}"))
        .arg(format!("-c{connections}"))
        .arg(format!("-d{}s", duration.as_secs().max(1)))
        .arg("-s")
        .arg(&script)
        .arg(url)
        .output()
        .map_err(|e| missing("wrk", e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "wrk failed ({}): {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_wrk(&text).with_context(|| format!("wrk's output: {text}"))
}

/// "12345 requests in 5.00s, ..." and "Socket errors: connect 0, read 1,
/// write 0, timeout 0".
fn parse_wrk(text: &str) -> Option<WrkReport> {
    let requests = text
        .lines()
        .find(|l| l.contains(" requests in "))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let errors = text
        .lines()
        .find(|l| l.trim_start().starts_with("Socket errors:"))
        .map_or(0, |l| {
            l.split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse::<u64>().ok())
                .sum()
        });
    Some(WrkReport { requests, errors })
}

/// curl in the client's namespace, `times` over: each run POSTs `body`
/// bytes `per_run` times, on one connection (keep-alive) or each on its
/// own (`Connection: close`). Each run must succeed.
pub fn curl(
    topo: &Topology,
    url: &str,
    times: u32,
    per_run: u32,
    body: usize,
    how: Connections,
) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("{}-http", topo.base));
    let file = dir.join(format!("body-{body}"));
    std::fs::write(&file, vec![b'x'; body]).context("writing curl's body")?;
    for run in 0..times {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &topo.client_ns, "curl", "-s", "-f"]);
        cmd.args(["--max-time", "30", "-o", "/dev/null", "--data-binary"]);
        cmd.arg(format!("@{}", file.display()));
        if how == Connections::Close {
            cmd.args(["-H", "Connection: close"]);
        }
        for _ in 0..per_run {
            cmd.arg(url);
        }
        let out = cmd.output().map_err(|e| missing("curl", e))?;
        if !out.status.success() {
            bail!(
                "curl run {run} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// Bytes nginx read, per client address and port.
pub fn bytes_by_client(requests: &[Request]) -> BTreeMap<SocketAddr, u64> {
    let mut by = BTreeMap::new();
    for r in requests {
        *by.entry(r.client).or_default() += r.bytes;
    }
    by
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_says_its_requests_and_errors() {
        let out = "Running 5s test @ http://10.77.2.2:8080/
  2 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.48ms    1.52ms   9.46ms   84.01%
  6874 requests in 2.01s, 704.85KB read
  Socket errors: connect 0, read 3, write 1, timeout 0
Requests/sec:   3418.35
";
        assert_eq!(
            parse_wrk(out),
            Some(WrkReport {
                requests: 6874,
                errors: 4
            })
        );
        assert_eq!(
            parse_wrk("  10 requests in 1.00s, 1KB read\n").map(|r| r.errors),
            Some(0)
        );
        assert_eq!(parse_wrk("nothing"), None);
    }
}
