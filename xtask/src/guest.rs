//! Inside a kernel-matrix guest ([`crate::matrix`]): this xtask binary is
//! the guest's `/init`. As PID 1 it mounts what a host has (proc, sysfs,
//! devtmpfs, a tmpfs on /run, bpffs, tracefs: the initramfs itself is
//! writable, and keeps what the image put in /tmp, such as a build there),
//! starts itself again as `guest-run` to run the plan, reaps orphans until
//! that ends, and powers off. Each
//! result is one `MATRIX` line on the console, read by the host.

use std::{ffi::CString, process::Command};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::runner::{self, Case, Verdict};

/// Where the kernel starts the init (`rdinit=`).
pub const INIT: &str = "/init";
/// The plan, written into the image by the host.
pub const PLAN: &str = "/matrix/plan.json";
/// The kernel command line's word for the accelerator (`tcg`, `kvm`).
pub const ACCEL_ARG: &str = "matrix.accel";
/// The kernel command line's word for the first step of the plan to run
/// (a step is one test in one round): 0, or after a guest's kernel died,
/// the step it died in.
pub const FROM_ARG: &str = "matrix.from";
/// The kernel command line's word for a step in which the guest
/// crashes its own kernel (sysrq `c`): how the harness's recovery from a
/// dead guest is tried (`XTASK_MATRIX_CRASH_AT`).
pub const CRASH_ARG: &str = "matrix.crash";
/// Set for the tests in a TCG guest (emulated CPUs, many times slower):
/// assertions that depend on speed relax (`tests::under_tcg`).
pub const TCG_ENV: &str = "TRACER_TEST_TCG";

/// What a guest runs: these tests, `repeat` times.
#[derive(Serialize, Deserialize)]
pub struct Plan {
    pub repeat: u32,
    pub cases: Vec<Case>,
}

/// What a `MATRIX` line says.
pub enum Report {
    Booted,
    Running(String),
    Passed(String),
    Failed(String),
    Done,
}

pub fn parse(line: &str) -> Option<Report> {
    let rest = line.strip_prefix("MATRIX ")?;
    let (word, arg) = rest.split_once(' ').unwrap_or((rest, ""));
    Some(match word {
        "booted" => Report::Booted,
        "running" => Report::Running(test_path(arg)),
        // (The test's path, without the note in brackets after it.)
        "ok" => Report::Passed(test_path(arg)),
        "FAILED" => Report::Failed(test_path(arg)),
        "done" => Report::Done,
        _ => return None,
    })
}

fn test_path(arg: &str) -> String {
    arg.split(" (").next().unwrap_or(arg).to_string()
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

/// `guest-run`: the plan's tests, one at a time and each within its bound
/// (the runner's), each output shown whole on the console (its measured
/// figures stay in the log) and each result a `MATRIX` line; then `MATRIX
/// done`.
pub fn run() -> Result<()> {
    let plan: Plan = serde_json::from_slice(&std::fs::read(PLAN).context("reading the plan")?)?;
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let tcg = cmdline
        .split_whitespace()
        .any(|w| w == format!("{ACCEL_ARG}=tcg"));
    let number = |word: &str| -> Option<usize> {
        cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{word}=")))
            .and_then(|n| n.parse().ok())
    };
    let from = number(FROM_ARG).unwrap_or(0);
    let crash_at = number(CRASH_ARG);
    let path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin";
    let _ = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .env("PATH", path)
        .status();
    let mut env = vec![("PATH", path), ("HOME", "/root")];
    let bound = if tcg {
        env.push((TCG_ENV, "1"));
        runner::TCG_BOUND
    } else {
        runner::HOST_BOUND
    };
    let steps = (1..=plan.repeat).flat_map(|round| plan.cases.iter().map(move |c| (round, c)));
    for (step, (round, case)) in steps.enumerate().skip(from) {
        println!("MATRIX running {} (round {round})", case.path());
        if crash_at == Some(step) {
            println!("MATRIX guest: crashing the kernel in step {step}, as asked");
            let _ = std::fs::write("/proc/sysrq-trigger", "c");
        }
        let outcome = runner::run(case, bound, &env);
        print!("{}", outcome.output);
        let secs = outcome.elapsed.as_secs();
        match outcome.verdict {
            Verdict::Passed => println!("MATRIX ok {} ({secs} s)", case.path()),
            Verdict::Failed => println!("MATRIX FAILED {} ({secs} s)", case.path()),
            Verdict::TimedOut => println!(
                "MATRIX FAILED {} (stopped at its bound of {} s)",
                case.path(),
                bound.as_secs()
            ),
            Verdict::NotRun(why) => println!("MATRIX FAILED {} ({why})", case.path()),
        }
    }
    println!("MATRIX done");
    Ok(())
}
