//! `tracer watch` run by a test: its reports read as they are written.

use std::{
    path::PathBuf,
    process::{Child, ExitStatus},
    sync::mpsc,
    thread::JoinHandle,
};

use serde_json::Value;
use tracer::lab::{self, Lab};

use super::{said, spawn_tracer, u};

/// A report and where it was.
pub type Report = (PathBuf, Value);

/// `tracer watch` with one-second intervals into a directory of its own,
/// each report read the moment its line names it (before the rotation
/// can take it). Killed if the test fails before it ends (a watch waiting
/// for its interface would wait forever); its directory removed.
pub struct Watched {
    pub child: Child,
    reader: Option<JoinHandle<Vec<Report>>>,
    /// Its other stderr lines.
    pub rx: mpsc::Receiver<String>,
    pub dir: PathBuf,
    /// Where `--pcapng` goes, when given: [`Watched::ring`].
    pub ring: PathBuf,
}

impl Watched {
    /// `watch TARGET --interval SECS --reports DIR --metrics-addr
    /// 127.0.0.1:0 EXTRA`, DIR named after `name`.
    pub fn start(target: &[&str], name: &str, interval: &str, extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("tracer-watch-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ring = Self::ring(name);
        let _ = std::fs::remove_dir_all(&ring);
        let mut args = vec!["watch"];
        args.extend(target);
        args.extend([
            "--interval",
            interval,
            "--reports",
            dir.to_str().unwrap(),
            "--metrics-addr",
            "127.0.0.1:0",
        ]);
        args.extend(extra);
        let (child, lines) = spawn_tracer(&args);
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut read = Vec::new();
            for line in lines {
                if let Some(path) = line
                    .strip_prefix("tracer: interval ")
                    .and_then(|l| l.rsplit_once("; "))
                    .map(|(_, p)| PathBuf::from(p))
                {
                    let text = std::fs::read_to_string(&path)
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    read.push((path, serde_json::from_str(&text).unwrap()));
                }
                let _ = tx.send(line);
            }
            read
        });
        Self {
            child,
            reader: Some(reader),
            rx,
            dir,
            ring,
        }
    }

    /// The directory for `--pcapng` of the watch named `name` (removed
    /// with it).
    pub fn ring(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("tracer-watch-{}-{name}-ring", std::process::id()))
    }

    /// On the lab's server interface.
    pub fn on_server(lab: &Lab, name: &str, interval: &str, extra: &[&str]) -> Self {
        Self::start(
            &["--iface", lab::SERVER_IF, "--netns", &lab.topo.server_ns],
            name,
            interval,
            extra,
        )
    }

    /// ADDR of its "metrics at http://ADDR/metrics" line.
    pub fn metrics_target(&self) -> String {
        let line = self.said("metrics at http://");
        let (_, url) = line.split_once("metrics at http://").unwrap();
        url.split('/').next().unwrap().to_string()
    }

    pub fn said(&self, what: &str) -> String {
        said(&self.rx, what)
    }

    /// Its end: how it exited, and every report it wrote, in order.
    pub fn end(&mut self) -> (ExitStatus, Vec<Report>) {
        let status = self.child.wait().unwrap();
        (status, self.reader.take().unwrap().join().unwrap())
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.ring);
    }
}

/// The bytes the flow to `to` moved, summed over the reports.
pub fn bytes_to(read: &[Report], to: &str) -> u64 {
    read.iter()
        .flat_map(|(_, r)| r["flows"].as_array().unwrap().clone())
        .filter(|f| f["dst"] == to)
        .map(|f| u(&f["in_interval"]["seq_advance_bytes"]))
        .sum()
}
