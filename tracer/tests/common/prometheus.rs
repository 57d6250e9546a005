//! A real Prometheus server for the tests, and the shipped rules and
//! dashboard it checks.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

pub fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("deploy")
        .join(file)
}

/// A Prometheus server scraping `target` every second and evaluating
/// `rules` every second, in a directory of its own (removed on drop).
pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    addr: String,
}

impl Prometheus {
    pub fn start(target: &str, rules: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tracer-fleet-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rules.yml"), rules).unwrap();
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yml]\nscrape_configs:\n  - job_name: tracer\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        // A free port (the kernel's pick, let go for Prometheus).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (apt package prometheus: cargo xtask setup installs it)");
        let p = Self { child, dir, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while p.try_get("/-/ready").is_none() {
            assert!(Instant::now() < deadline, "Prometheus never became ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// The body of a 200 answer to GET `path`.
    pub fn try_get(&self, path: &str) -> Option<String> {
        let mut s = TcpStream::connect(&self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).ok()?;
        let mut response = String::new();
        s.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        // (HTTP/1.0 asked, HTTP/1.0 answered.)
        (head.split_whitespace().nth(1) == Some("200")).then(|| body.to_string())
    }

    /// An API call's `data`, its status checked.
    pub fn api(&self, path: &str) -> Value {
        let body = self
            .try_get(path)
            .unwrap_or_else(|| panic!("GET {path} failed"));
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{path}: {v}");
        v["data"].clone()
    }

    /// An instant query's result vector.
    pub fn query(&self, q: &str) -> Vec<Value> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(q)));
        data["result"].as_array().unwrap().clone()
    }

    /// The alerts named `name` in `state` (pending, firing).
    pub fn alerts(&self, name: &str, state: &str) -> Vec<Value> {
        self.api("/api/v1/alerts")["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["labels"]["alertname"] == name && a["state"] == state)
            .cloned()
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encoding for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Polls `done` every half second until it holds, `cap` at most.
pub fn until(what: &str, cap: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < cap, "{what}: not within {cap:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    start.elapsed()
}

/// The shipped rules with their windows shortened for a test that runs in
/// seconds: `[5m]` -> `[5s]`, `for: 10m` -> `for: 5s`.
pub fn rules_in_seconds() -> String {
    let shipped = std::fs::read_to_string(deploy("prometheus/alerts.yml")).unwrap();
    assert!(
        shipped.contains("[5m]") && shipped.contains("for: 10m"),
        "{shipped}"
    );
    shipped
        .replace("[5m]", "[5s]")
        .replace("for: 10m", "for: 5s")
}
