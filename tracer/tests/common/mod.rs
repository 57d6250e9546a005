//! Shared by the binary's integration tests.
#![allow(dead_code)] // (not every test target needs all of it)

use std::{
    io::{BufRead, BufReader, Read},
    sync::mpsc,
    time::{Duration, Instant},
};

pub const BIN: &str = env!("CARGO_BIN_EXE_tracer");

/// True when running as root; otherwise says the test is skipped.
pub fn root_or_skip(test: &str) -> bool {
    let root = tracer::require_root().is_ok();
    if !root {
        eprintln!("{test}: skipped: needs root");
    }
    root
}

/// True inside a TCG guest of the kernel matrix (`cargo xtask test
/// --kernel`): emulated CPUs, several times slower, so uploads get more time
/// and shares that depend on speed are held more loosely.
pub fn under_tcg() -> bool {
    std::env::var_os("TRACER_TEST_TCG").is_some()
}

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
