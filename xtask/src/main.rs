//! `cargo xtask setup | build-and-run | lab | test | validate | bench |
//! fuzz`: the project's own tasks.

mod cells;
mod dist;
mod draw;
mod guest;
mod matrix;
mod runner;
mod validate;

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Check and install what building and testing need (idempotent).
    Setup,
    /// Set up if needed, build in release mode, and run `tracer ARGS` as root
    /// (no ARGS: the seed's story in the live view: a classic and a
    /// RACK-TLP sender through the ATR edge at 80 ms).
    BuildAndRun {
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// `build-and-run` of `tracer lab ARGS`: the flow-steering lab (default:
    /// ATR emulation); e.g. `cargo xtask lab -- --mode pattern`.
    Lab {
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Unit tests plus the root-only kernel integration tests, each test
    /// in its own process, one at a time and within a time bound, on this
    /// host's kernel and/or inside guests of other releases.
    Test {
        /// Which kernels: `host` (this machine's), a guest series (`6.1`,
        /// `6.12`: Debian's kernel under qemu), or `all` of them.
        #[arg(long, value_enum, default_value_t = KernelChoice::Host)]
        kernel: KernelChoice,
        /// Run the whole suite N times (and each guest's, with --kernel)
        /// and say per test how many of the N passed.
        #[arg(long, value_name = "N", default_value_t = 1)]
        repeat: u32,
        /// Filters: only tests whose `target::name` contains one of them.
        #[arg(last = true)]
        filters: Vec<String>,
    },
    /// The statistical checks: lab experiments whose results are
    /// distributions (the share of late segments found, the replay against
    /// the real senders, summary mode's shares), each run K times, their
    /// medians held to bands (root; not part of the test suite).
    Validate {
        /// Runs per experiment.
        #[arg(long, value_name = "K", default_value_t = 5)]
        runs: u32,
        /// Instead: the replay against a real sender of each policy over
        /// the matrix of paths (re-point rate x RTT x bottleneck), each
        /// policy alone in each cell; ONLY then names cells
        /// (`"80 ms"`, `"atr 50/s, 20 ms"`).
        #[arg(long)]
        cells: bool,
        /// Instead: the seed's table, ATR off and on at 80 ms and
        /// 200 Mbit/s with no DSACKs, so the classic sender undoes nothing;
        /// each policy's real goodput beside the replay's.
        #[arg(long, conflicts_with = "cells")]
        seed_table: bool,
        /// Instead: N configurations drawn at random (DSACKs on in half,
        /// 1-8 flows per sender, 1-200 ms, 50-800 Mbit/s, ATR 20-200/s),
        /// every policy's real guest side by side in each, the replay's
        /// estimate held to each; the seed is printed.
        #[arg(long, value_name = "N", conflicts_with_all = ["cells", "seed_table"])]
        draw: Option<u32>,
        /// The draw's seed: the same configurations again.
        #[arg(long, value_name = "S", requires = "draw")]
        seed: Option<u64>,
        /// Instead: `tracer watch` as a service for MINUTES over the ATR
        /// lab with a real Prometheus: steering on and off (the alert
        /// firing and resolving), interface flaps, churn; then an edge
        /// host's traffic (nginx, wrk, reused 4-tuples) under `record`
        /// and under `watch`, MINUTES each: every interval's report, no
        /// event lost, memory flat within the budget, the report soon
        /// after SIGINT.
        #[arg(long, value_name = "MINUTES", conflicts_with_all = ["cells", "seed_table", "draw"])]
        soak: Option<f64>,
        /// Also write each lab run's JSON report into DIR (one file per
        /// run, named by experiment and run), to look at a run that strayed.
        #[arg(long, value_name = "DIR")]
        keep: Option<std::path::PathBuf>,
        /// Only experiments whose name contains one of these.
        #[arg(last = true)]
        only: Vec<String>,
    },
    /// Build the packages a host without Rust installs: a Debian package
    /// and a tarball (the release binary with its eBPF object, man pages,
    /// completions, the systemd unit for `tracer watch`, the alert rules)
    /// into target/dist, the unit's hardening and the rules checked.
    Dist,
    /// Benchmarks, each printing its figures beside a baseline measured in
    /// the same run (ratios, not absolute times, are what to compare).
    Bench,
    /// Fuzz the capture reader for SECS seconds (libFuzzer through
    /// cargo-fuzz, installed if missing), from the seeds in fuzz/seeds
    /// (slices of real lab captures).
    Fuzz {
        #[arg(default_value_t = 60)]
        secs: u64,
    },
    /// Inside a kernel-matrix guest: runs its plan (started by the guest's
    /// init).
    #[command(hide = true)]
    GuestRun,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum KernelChoice {
    Host,
    #[value(name = "6.1")]
    V6_1,
    #[value(name = "6.12")]
    V6_12,
    All,
}

/// The bpf-linker release that builds against the preinstalled nightly's
/// own LLVM (newer ones want a newer LLVM than the nightly ships).
const BPF_LINKER: &str = "bpf-linker@0.10.3";
/// Debian packages the tracer and its tests call: `ip`/`ss`/`nstat`,
/// `bpftool` (an independent BTF reader in a unit test), `runuser` (the
/// not-root test), `iptables` (drops that force retransmissions; the lab's
/// NFQUEUE rule in pattern mode), `ethtool`, `tmux` (a terminal for the
/// live view's end-to-end test), `tcpdump` (captures for `analyze`'s),
/// `tshark` (the independent reader of our pcapng traces), `prometheus`
/// (its `promtool` checks the metrics and the alert rules), and for the
/// kernel matrix `qemu-system-x86` (the guests), `kmod` (`depmod` and the
/// guests' `modprobe`) and `binutils` (`strip`); for `dist` and the
/// package's test, `systemd` (`systemd-analyze`) and `man-db` (`dpkg-deb`
/// comes with dpkg, always there).
const APT_PACKAGES: &[&str] = &[
    "iproute2",
    // The lab's sender guests (Linux 6.1 as a process).
    "user-mode-linux",
    "bpftool",
    "util-linux",
    "iptables",
    "ethtool",
    "tmux",
    "tcpdump",
    "tshark",
    "prometheus",
    "qemu-system-x86",
    "kmod",
    "binutils",
    "systemd",
    "man-db",
    // Real servers and clients for the lab's edge-host traffic.
    "nginx",
    "wrk",
    "curl",
];

fn main() -> ExitCode {
    if std::process::id() == 1 {
        guest::init();
    }
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Task::Setup => setup().map(|()| ExitCode::SUCCESS),
        Task::BuildAndRun { args } => build_and_run(args),
        Task::Dist => {
            setup()?;
            dist::dist().map(|_| ExitCode::SUCCESS)
        }
        Task::Lab { args } => {
            build_and_run(std::iter::once("lab".to_string()).chain(args).collect())
        }
        Task::Test {
            kernel,
            repeat,
            filters,
        } => test(kernel, repeat, &filters),
        Task::Validate {
            runs,
            cells,
            seed_table,
            draw,
            seed,
            soak,
            keep,
            only,
        } => {
            setup()?;
            let keep = validate::Keep::new(keep)?;
            if let Some(minutes) = soak {
                validate::soak(minutes)
            } else if let Some(n) = draw {
                draw::run(n, seed, runs, &keep)
            } else if cells {
                cells::run(runs, &only, cells::Table::Cells, &keep)
            } else if seed_table {
                cells::run(runs, &only, cells::Table::Seed, &keep)
            } else {
                validate::run(runs, &only, &keep)
            }
        }
        Task::Bench => bench(),
        Task::Fuzz { secs } => fuzz(secs),
        Task::GuestRun => guest::run().map(|()| ExitCode::SUCCESS),
    }
}

fn root_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs a command, failing with its name if it does not succeed.
fn sh(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}").replace('"', "");
    let status = cmd
        .current_dir(root_dir())
        .status()
        .with_context(|| format!("cannot run {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

/// The cargo running us (`cargo xtask` sets CARGO), else the one on PATH.
fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().is_ok_and(|o| o.status.success())
}

fn setup() -> Result<()> {
    // rust-src for the nightly toolchain: aya-build builds `core` for bpf.
    let components = Command::new("rustup")
        .args(["component", "list", "--toolchain", "nightly", "--installed"])
        .output()
        .context("cannot run rustup (install it from https://rustup.rs)")?;
    if !components.status.success() {
        bail!("no nightly toolchain: install it with `rustup toolchain install nightly` and rerun");
    }
    if String::from_utf8_lossy(&components.stdout)
        .lines()
        .any(|l| l.starts_with("rust-src"))
    {
        println!("setup: rust-src (nightly): present");
    } else {
        sh(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
        println!("setup: rust-src (nightly): installed");
    }

    // bpf-linker links the eBPF object.
    if succeeds(Command::new("bpf-linker").arg("--version")) {
        println!("setup: bpf-linker: present");
    } else {
        sh(cargo().args(["install", BPF_LINKER, "--locked"]))?;
        if !succeeds(Command::new("bpf-linker").arg("--version")) {
            bail!("installed {BPF_LINKER}, but it is not on PATH: add ~/.cargo/bin to PATH");
        }
        println!("setup: bpf-linker: installed ({BPF_LINKER})");
    }

    // Debian packages.
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        println!("setup: apt packages ({}): present", APT_PACKAGES.join(", "));
    } else if !is_root() {
        bail!(
            "missing packages {}: as root run `apt-get update && apt-get install -y {}`, then rerun",
            missing.join(", "),
            missing.join(" ")
        );
    } else {
        sh(Command::new("apt-get").arg("update").arg("-q"))?;
        sh(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
        println!("setup: apt packages: installed {}", missing.join(", "));
    }
    Ok(())
}

/// `build-and-run` with no arguments: the seed's story on this machine,
/// watched live. A classic sender (three duplicate ACKs; no timestamps and
/// a receiver that sends no DSACKs, so it undoes nothing) and a RACK-TLP
/// sender, a Linux 6.1 guest each with one flow, side by side through an
/// 80 ms, 200 Mbit/s path and the ATR edge re-pointing each flow 200 times
/// a second (at 50 the classic sender is hit less surely within 30 s). The replay is told the path's
/// rate in TCP payload (200 Mbit/s of 1514-byte frames carry 191 of
/// 1448-byte segments), as a user who knows the link would.
const DEMO: [&str; 18] = [
    "lab",
    "--live",
    "--sender",
    "classic,rack-tlp",
    "--repoints",
    "200",
    "--flows",
    "1",
    "--rtt",
    "80",
    "--rate",
    "200",
    "--no-dsack",
    "--bandwidth",
    "191",
    "--duration",
    "30",
    "--bytes=8G",
];

/// The demo's arguments: [`DEMO`], or where no guest sender can run (the
/// built tracer says why) the same with this kernel's own sender.
fn demo(bin: &Path) -> Vec<String> {
    let mut args: Vec<String> = DEMO.map(String::from).to_vec();
    let guests = || Command::new(bin).arg("guest-check").status();
    if is_root() && !guests().is_ok_and(|s| s.success()) {
        println!("xtask: the demo's senders are this kernel's own (--sender host): its guest senders cannot run here (above)");
        args[3] = "host".into();
    }
    args
}

fn build_and_run(args: Vec<String>) -> Result<ExitCode> {
    setup()?;
    sh(cargo().args(["build", "--release", "--package", "tracer"]))?;
    let bin = root_dir().join("target/release/tracer");
    let args = if args.is_empty() { demo(&bin) } else { args };
    if !is_root() {
        let line = format!("{} {}", bin.display(), args.join(" "));
        eprintln!("xtask: built. Loading eBPF programs needs root; rerun as root:");
        eprintln!("    su -c '{line}'");
        return Ok(ExitCode::from(2));
    }
    println!("xtask: running {} {}", bin.display(), args.join(" "));
    let status = Command::new(&bin)
        .args(&args)
        .status()
        .context("running tracer")?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(c as u8),
        None => ExitCode::FAILURE,
    })
}

fn test(kernel: KernelChoice, repeat: u32, filters: &[String]) -> Result<ExitCode> {
    if repeat == 0 {
        bail!("--repeat 0: give N >= 1");
    }
    let series: Vec<&matrix::Series> = match kernel {
        KernelChoice::Host => Vec::new(),
        KernelChoice::V6_1 => vec![&matrix::SERIES[0]],
        KernelChoice::V6_12 => vec![&matrix::SERIES[1]],
        KernelChoice::All => matrix::SERIES.iter().collect(),
    };
    let started = std::time::Instant::now();
    let build = runner::build()?;
    let mut tally = Tally::default();
    if matches!(kernel, KernelChoice::Host | KernelChoice::All) {
        if !is_root() {
            println!(
                "xtask: not root: the kernel integration tests will say `skipped: needs root`"
            );
        }
        let cases = runner::cases(&build.binaries, filters)?;
        if cases.is_empty() {
            bail!("no test matches {filters:?}");
        }
        // The package its test installs, built here: outside any test's
        // time bound (a release build from nothing takes minutes).
        let package = if cases.iter().any(|c| c.path().starts_with("package::")) {
            Some(dist::dist()?)
        } else {
            None
        };
        runner::forward_signals();
        for round in 1..=repeat {
            host_round(&cases, package.as_deref(), round, repeat, &mut tally)?;
            if runner::interrupted() {
                bail!("interrupted");
            }
        }
    }
    if !series.is_empty() {
        let results = matrix::run(&build, &series, filters, repeat)?;
        println!("\nkernel matrix:");
        for r in &results {
            println!(
                "  Linux {:<32} {:>3} passed, {} failed  ({}, {:.0} s; console log {})",
                r.release,
                r.passed.len(),
                r.failed.len(),
                r.accel,
                r.elapsed.as_secs_f64(),
                r.log.display()
            );
            for d in &r.deaths {
                println!("    the guest's kernel died in {d}; a new guest ran that test again");
            }
            for t in &r.passed {
                tally.add(&format!("[{}] {t}", r.series), true);
            }
            for t in &r.failed {
                tally.add(&format!("[{}] {t}", r.series), false);
            }
            if r.passed.is_empty() && r.failed.is_empty() {
                tally.add(&format!("[{}] (no test ran)", r.series), false);
            }
        }
    }
    let ok = tally.print(repeat);
    println!(
        "xtask test: {:.0} s in all",
        started.elapsed().as_secs_f64()
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One run of the host's suite: a line per test, a failure's last lines.
fn host_round(
    cases: &[runner::Case],
    package: Option<&std::path::Path>,
    round: u32,
    of: u32,
    tally: &mut Tally,
) -> Result<()> {
    let host = root_dir().join("target/test-logs/host");
    // (Round 1 clears an earlier run's rounds: no stale log to mislead.)
    let _ = std::fs::remove_dir_all(if round == 1 {
        host.clone()
    } else {
        host.join(format!("round-{round}"))
    });
    let logs = host.join(format!("round-{round}"));
    if of > 1 {
        println!("\nround {round} of {of}");
    }
    for case in cases {
        let env: Vec<(&str, &str)> = package
            .and_then(|p| p.to_str())
            .map(|p| (dist::PACKAGE_ENV, p))
            .into_iter()
            .collect();
        let outcome = runner::run(case, runner::HOST_BOUND, &env);
        let log = runner::keep_output(&logs, case, &outcome.output)?;
        let secs = outcome.elapsed.as_secs_f64();
        let word = match &outcome.verdict {
            runner::Verdict::Passed => "ok",
            runner::Verdict::Failed => "FAILED",
            runner::Verdict::TimedOut => "TIMEOUT",
            runner::Verdict::NotRun(_) => "NOT RUN",
        };
        println!("{word:<8}{secs:>6.1} s  {}", case.path());
        match &outcome.verdict {
            runner::Verdict::Passed => {}
            runner::Verdict::TimedOut => println!(
                "{}\n        stopped at its bound of {} s; the whole output: {}",
                runner::tail(&outcome.output, 30),
                runner::HOST_BOUND.as_secs(),
                log.display()
            ),
            runner::Verdict::Failed => println!(
                "{}\n        the whole output: {}",
                runner::tail(&outcome.output, 40),
                log.display()
            ),
            runner::Verdict::NotRun(why) => println!("        {why}"),
        }
        tally.add(&case.path(), outcome.verdict == runner::Verdict::Passed);
        if runner::interrupted() {
            break;
        }
    }
    Ok(())
}

/// Per test: runs and passes, in the order first seen.
#[derive(Default)]
struct Tally(Vec<(String, u32, u32)>);

impl Tally {
    fn add(&mut self, test: &str, passed: bool) {
        let at = match self.0.iter().position(|(t, _, _)| t == test) {
            Some(at) => at,
            None => {
                self.0.push((test.to_string(), 0, 0));
                self.0.len() - 1
            }
        };
        self.0[at].1 += 1;
        self.0[at].2 += u32::from(passed);
    }

    /// Prints the tally (every test when repeated, else the failures);
    /// whether everything passed.
    fn print(&self, repeat: u32) -> bool {
        let failing: Vec<_> = self.0.iter().filter(|(_, runs, ok)| ok < runs).collect();
        println!();
        if repeat > 1 {
            println!("passed of {repeat} runs, per test:");
            for (test, runs, ok) in &self.0 {
                println!("  {ok:>3}/{runs:<3} {test}");
            }
        }
        for (test, runs, ok) in &failing {
            println!("FAILED {}/{runs} runs: {test}", runs - ok);
        }
        let runs: u32 = self.0.iter().map(|(_, r, _)| r).sum();
        println!(
            "{} tests, {runs} runs: {}",
            self.0.len(),
            if failing.is_empty() {
                "all passed".to_string()
            } else {
                format!("{} tests failed at least once", failing.len())
            }
        );
        failing.is_empty()
    }
}

fn bench() -> Result<ExitCode> {
    // Userspace only: the eBPF object is still built (tracer's build.rs).
    setup()?;
    sh(cargo().args([
        "bench",
        "--package",
        "tracer",
        "--bench",
        "engine",
        "--bench",
        "analyze",
        "--bench",
        "xdp",
        "--bench",
        "memory",
        "--bench",
        "events",
        "--bench",
        "lab",
        "--bench",
        "report",
    ]))?;
    Ok(ExitCode::SUCCESS)
}

fn fuzz(secs: u64) -> Result<ExitCode> {
    setup()?;
    if !succeeds(Command::new("cargo").args(["fuzz", "--version"])) {
        println!("fuzz: installing cargo-fuzz");
        sh(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    // A working corpus under target/ (libFuzzer adds to it), from the
    // committed seeds.
    let root = root_dir();
    let corpus = root.join("target/fuzz-corpus/capture");
    std::fs::create_dir_all(&corpus).context("creating the fuzz corpus")?;
    sh(Command::new("cargo")
        .current_dir(&root)
        .args(["+nightly", "fuzz", "run", "capture"])
        .arg(&corpus)
        .arg(root.join("fuzz/seeds"))
        .arg("--")
        .arg(format!("-max_total_time={secs}")))?;
    Ok(ExitCode::SUCCESS)
}

/// Whether Debian package `p` is installed (not merely known: a removed
/// package keeps its configuration, and `dpkg -s` still succeeds).
fn installed(p: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", p])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.ends_with(b" installed"))
}
