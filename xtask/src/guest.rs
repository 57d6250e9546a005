//! Inside a kernel-matrix guest ([`crate::matrix`]): this xtask binary is
//! the guest's `/init`. As PID 1 it mounts what a host has (proc, sysfs,
//! devtmpfs, a tmpfs on /run, bpffs, tracefs: the initramfs itself is
//! writable, and keeps what the image put in /tmp, such as a build there),
//! starts itself again as `guest-run` to run the plan, reaps orphans until
//! that ends, and powers off. Each
//! result is one `MATRIX` line on the console, read by the host.

use std::{
    ffi::CString,
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// Where the kernel starts the init (`rdinit=`).
pub const INIT: &str = "/init";
/// The plan, written into the image by the host.
pub const PLAN: &str = "/matrix/plan.json";
/// The kernel command line's word for the accelerator (`tcg`, `kvm`).
pub const ACCEL_ARG: &str = "matrix.accel";
/// Set for the tests in a TCG guest (emulated CPUs, many times slower):
/// assertions that depend on speed relax (`tests::under_tcg`).
pub const TCG_ENV: &str = "TRACER_TEST_TCG";

/// One test binary's part of the plan.
#[derive(Serialize, Deserialize)]
pub struct Step {
    pub target: String,
    pub exe: PathBuf,
    /// Where cargo would run it: its package's directory.
    pub dir: PathBuf,
    pub tests: Vec<String>,
}

/// What a `MATRIX` line says.
pub enum Report {
    Booted,
    Passed(String),
    Failed(String),
    Done,
}

pub fn parse(line: &str) -> Option<Report> {
    let rest = line.strip_prefix("MATRIX ")?;
    let (word, arg) = rest.split_once(' ').unwrap_or((rest, ""));
    Some(match word {
        "booted" => Report::Booted,
        "ok" => Report::Passed(arg.to_string()),
        "FAILED" => Report::Failed(arg.to_string()),
        "done" => Report::Done,
        _ => return None,
    })
}

/// PID 1: mounts, runs the plan in a child, reaps, powers off.
pub fn init() -> ! {
    for (fs, at) in [
        ("proc", "/proc"),
        ("sysfs", "/sys"),
        ("devtmpfs", "/dev"),
        ("tmpfs", "/run"),
        ("bpf", "/sys/fs/bpf"),
        ("tracefs", "/sys/kernel/tracing"),
        ("debugfs", "/sys/kernel/debug"),
    ] {
        if let Err(e) = mount(fs, at) {
            println!("MATRIX guest: mounting {fs} on {at}: {e}");
        }
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("MATRIX booted {}", release.trim());
    match Command::new(INIT).arg("guest-run").spawn() {
        Ok(worker) => loop {
            // Every orphan of the tests is ours to reap; the worker last.
            let mut status = 0;
            // SAFETY: wait(2) with a valid status pointer.
            let pid = unsafe { libc::wait(&mut status) };
            if pid < 0 || pid as u32 == worker.id() {
                break;
            }
        },
        Err(e) => println!("MATRIX FAILED (starting the tests: {e})"),
    }
    // SAFETY: sync and power off; nothing of the guest is kept.
    unsafe {
        libc::sync();
        libc::reboot(libc::LINUX_REBOOT_CMD_POWER_OFF);
    }
    std::process::exit(0)
}

fn mount(fs: &str, at: &str) -> Result<()> {
    std::fs::create_dir_all(at)?;
    let (src, target) = (CString::new(fs)?, CString::new(at)?);
    // SAFETY: NUL-terminated strings that outlive the call.
    let ret = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            src.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// `guest-run`: each step's tests, one at a time, as `cargo test` would
/// run them, each result a `MATRIX` line; then `MATRIX done`.
pub fn run() -> Result<()> {
    let plan: Vec<Step> =
        serde_json::from_slice(&std::fs::read(PLAN).context("reading the plan")?)?;
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let tcg = cmdline
        .split_whitespace()
        .any(|w| w == format!("{ACCEL_ARG}=tcg"));
    let path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin";
    let _ = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .env("PATH", path)
        .status();
    for step in &plan {
        let mut cmd = Command::new(&step.exe);
        cmd.args(["--test-threads=1", "--exact", "--show-output"])
            .args(&step.tests)
            .current_dir(&step.dir)
            .env("PATH", path)
            .env("HOME", "/root")
            .env("RUST_BACKTRACE", "1")
            .stdout(Stdio::piped());
        if tcg {
            cmd.env(TCG_ENV, "1");
        }
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                let exe = step.exe.display();
                for t in &step.tests {
                    println!("MATRIX FAILED {}::{t} (running {exe}: {e})", step.target);
                }
                continue;
            }
        };
        let mut seen = Vec::new();
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.unwrap_or_default();
            println!("{line}");
            if let Some(rest) = line.strip_prefix("test ") {
                if let Some((name, verdict @ ("ok" | "FAILED"))) = rest.rsplit_once(" ... ") {
                    println!("MATRIX {verdict} {}::{name}", step.target);
                    seen.push(name.to_string());
                }
            }
        }
        let status = child.wait()?;
        for t in step.tests.iter().filter(|t| !seen.contains(t)) {
            println!(
                "MATRIX FAILED {}::{t} (no result: the test binary ended {status})",
                step.target
            );
        }
    }
    println!("MATRIX done");
    Ok(())
}
