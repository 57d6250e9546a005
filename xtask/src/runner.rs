//! The test runner behind `cargo xtask test`, on the host and inside the
//! kernel matrix's guests: every test in a process of its own (its own
//! process group, so a hung one is stopped with everything it started),
//! one at a time (the integration tests load programs, create namespaces
//! and share the machine's two cores), each within a time bound: a test
//! that hangs fails by name after its bound, and the run goes on.

use std::{
    fs::File,
    io::Read,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, AtomicI32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::{cargo, root_dir};

/// How long one test may take on this host before it is stopped. The
/// longest take under a minute here (`lab::replay_...`).
pub const HOST_BOUND: Duration = Duration::from_secs(5 * 60);
/// The same inside an emulated (TCG) guest, several times slower; its
/// longest tests take about five minutes there.
pub const TCG_BOUND: Duration = Duration::from_secs(12 * 60);

/// One test binary: its cargo target name, executable and the directory
/// cargo runs it in (its package's).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Binary {
    pub target: String,
    pub exe: PathBuf,
    pub dir: PathBuf,
}

/// A test: its binary and its name there.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Case {
    pub binary: Binary,
    pub name: String,
}

impl Case {
    /// `target::name`, what the results and filters say.
    pub fn path(&self) -> String {
        format!("{}::{}", self.binary.target, self.name)
    }

    /// Whether its path contains one of `filters` (any, without filters).
    pub fn chosen(&self, filters: &[String]) -> bool {
        let path = self.path();
        filters.is_empty() || filters.iter().any(|f| path.contains(f.as_str()))
    }
}

/// How one test ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    Failed,
    /// Stopped at its bound.
    TimedOut,
    /// The binary did not start, or ran no test of that name.
    NotRun(String),
}

pub struct Outcome {
    pub verdict: Verdict,
    pub elapsed: Duration,
    /// Everything the test wrote (stdout and stderr, interleaved).
    pub output: String,
}

/// The test binaries cargo builds for this workspace (unit tests of every
/// library, the integration tests) plus the eBPF crate's host-compiled
/// unit tests; and the `tracer` binary the end-to-end tests run.
pub struct Build {
    pub binaries: Vec<Binary>,
    pub tracer: PathBuf,
}

pub fn build() -> Result<Build> {
    // (target, is a binary's own unit tests, ...)
    let mut built: Vec<(Binary, bool)> = Vec::new();
    let mut tracer = None;
    for packages in [&[][..], &["--package", "tracer-ebpf", "--lib"][..]] {
        let out = cargo()
            .args([
                "test",
                "--no-run",
                "--message-format=json-render-diagnostics",
            ])
            .args(packages)
            .current_dir(root_dir())
            .stderr(Stdio::inherit())
            .output()
            .context("building the tests")?;
        if !out.status.success() {
            bail!("building the tests failed");
        }
        for line in out.stdout.split(|&b| b == b'\n') {
            let Ok(msg) = serde_json::from_slice::<serde_json::Value>(line) else {
                continue;
            };
            let Some(exe) = msg["executable"].as_str() else {
                continue;
            };
            let name = msg["target"]["name"].as_str().unwrap_or_default();
            let bin_target = msg["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"));
            if msg["profile"]["test"].as_bool() == Some(true) {
                let dir = Path::new(msg["manifest_path"].as_str().unwrap_or("/"))
                    .parent()
                    .unwrap_or(Path::new("/"))
                    .to_path_buf();
                let binary = Binary {
                    target: name.to_string(),
                    exe: PathBuf::from(exe),
                    dir,
                };
                built.push((binary, bin_target));
            } else if name == "tracer" && bin_target {
                tracer = Some(PathBuf::from(exe));
            }
        }
    }
    // A binary's own unit tests go by its name, or `NAME-bin` beside a
    // library of that name (`tracer`).
    let libraries: Vec<String> = built
        .iter()
        .filter(|(_, bin)| !bin)
        .map(|(b, _)| b.target.clone())
        .collect();
    let mut binaries: Vec<Binary> = built
        .into_iter()
        .map(|(mut b, bin)| {
            if bin && libraries.contains(&b.target) {
                b.target.push_str("-bin");
            }
            b
        })
        .collect();
    binaries.sort_by(|a, b| a.target.cmp(&b.target));
    binaries.dedup_by(|a, b| a.exe == b.exe);
    Ok(Build {
        binaries,
        tracer: tracer.context("cargo built no tracer binary")?,
    })
}

/// The tests in a test binary (`--list` runs none), but those marked
/// `#[ignore]` (`cargo xtask validate` runs those).
pub fn list(exe: &Path) -> Result<Vec<String>> {
    let names = |ignored: bool| -> Result<Vec<String>> {
        let out = Command::new(exe)
            .args(["--list", "--format", "terse"])
            .args(ignored.then_some("--ignored"))
            .output()
            .with_context(|| format!("listing the tests of {}", exe.display()))?;
        if !out.status.success() {
            bail!("{} --list failed ({})", exe.display(), out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .map(String::from)
            .collect())
    };
    let ignored = names(true)?;
    Ok(names(false)?
        .into_iter()
        .filter(|n| !ignored.contains(n))
        .collect())
}

/// Every test of `binaries` whose `target::name` contains one of
/// `filters` (all of them without filters).
pub fn cases(binaries: &[Binary], filters: &[String]) -> Result<Vec<Case>> {
    let mut cases = Vec::new();
    for b in binaries {
        for name in list(&b.exe)? {
            let case = Case {
                binary: b.clone(),
                name,
            };
            if case.chosen(filters) {
                cases.push(case);
            }
        }
    }
    Ok(cases)
}

/// The process group of the test running now (0: none), for the SIGINT
/// handler.
static RUNNING: AtomicI32 = AtomicI32::new(0);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn forward(signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    let group = RUNNING.load(Ordering::SeqCst);
    if group > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { libc::kill(-group, signal) };
    }
}

/// Ctrl-C (and SIGTERM, SIGHUP) reaches the running test, in its own
/// process group away from the terminal's, so it cleans up as it would
/// under `cargo test`; the run then stops.
pub fn forward_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs a handler that only stores atomics and calls
        // kill.
        unsafe { libc::signal(signal, forward as *const () as libc::sighandler_t) };
    }
}

/// Whether Ctrl-C asked the run to stop.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Runs one test in a process group of its own, with `env` added, stopping
/// it (and all it started) at `bound`.
pub fn run(case: &Case, bound: Duration, env: &[(&str, &str)]) -> Outcome {
    let start = Instant::now();
    let (mut reader, writer) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(e) => return not_run(start, format!("a pipe: {e}")),
    };
    let mut cmd = Command::new(&case.binary.exe);
    cmd.args(["--exact", &case.name, "--test-threads=1", "--nocapture"])
        .current_dir(&case.binary.dir)
        .env("RUST_BACKTRACE", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .process_group(0);
    match writer.try_clone() {
        Ok(w) => cmd.stdout(w).stderr(writer),
        Err(e) => return not_run(start, format!("a pipe: {e}")),
    };
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let exe = case.binary.exe.display();
            return not_run(start, format!("running {exe}: {e}"));
        }
    };
    // The pipe's write ends are the child's now (dropped with `cmd`).
    drop(cmd);
    let group = child.id() as i32;
    RUNNING.store(group, Ordering::SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = reader.read_to_end(&mut bytes);
        let _ = tx.send(String::from_utf8_lossy(&bytes).into_owned());
    });
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(_) => break None,
        }
        if start.elapsed() >= bound {
            timed_out = true;
        }
        if timed_out {
            // SAFETY: kill(2) on the test's own process group.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            break child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Whatever the test left running in its group goes with it (the pipe
    // closes when the last of them has).
    // SAFETY: kill(2) on the test's own process group.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    RUNNING.store(0, Ordering::SeqCst);
    // (A process that left the group and kept the pipe open, such as a
    // daemon, must not hang the run.)
    let output = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| {
            "(the test's output was still held open by a process outside its group)".into()
        });
    let verdict = if timed_out {
        Verdict::TimedOut
    } else if !output.contains("test result: ok. 1 passed") {
        if status.is_some_and(|s| s.success()) {
            Verdict::NotRun("the binary ran no test of that name".into())
        } else {
            Verdict::Failed
        }
    } else {
        Verdict::Passed
    };
    Outcome {
        verdict,
        elapsed: start.elapsed(),
        output,
    }
}

fn not_run(start: Instant, why: String) -> Outcome {
    Outcome {
        verdict: Verdict::NotRun(why),
        elapsed: start.elapsed(),
        output: String::new(),
    }
}

/// Writes a test's output to `dir/target/name.log` (for the figures a
/// passing test prints, and a failing one's story); its path.
pub fn keep_output(dir: &Path, case: &Case, output: &str) -> Result<PathBuf> {
    let path = dir
        .join(&case.binary.target)
        .join(format!("{}.log", case.name));
    std::fs::create_dir_all(path.parent().unwrap())?;
    let mut file = File::create(&path)?;
    std::io::Write::write_all(&mut file, output.as_bytes())?;
    Ok(path)
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set for [`sleeper`] and [`fails_when_asked`] when the runner's own
    /// tests run them.
    const SLEEP_ENV: &str = "XTASK_RUNNER_SLEEPER";
    const FAIL_ENV: &str = "XTASK_RUNNER_FAIL";

    /// A test that hangs when asked to: it starts `sleep 300` (a process
    /// of its own, as the integration tests start `tracer`), writes its
    /// pid and a line, and waits on it. Passes at once otherwise.
    #[test]
    fn sleeper() {
        let Some(pid_file) = std::env::var_os(SLEEP_ENV) else {
            return;
        };
        let mut child = Command::new("sleep").arg("300").spawn().unwrap();
        std::fs::write(pid_file, child.id().to_string()).unwrap();
        println!("sleeping");
        child.wait().unwrap();
    }

    fn this_binary() -> Binary {
        Binary {
            target: "xtask".into(),
            exe: std::env::current_exe().unwrap(),
            dir: std::env::current_dir().unwrap(),
        }
    }

    #[test]
    fn a_hung_test_is_stopped_at_its_bound_with_what_it_started() {
        let pid_file = std::env::temp_dir().join(format!("xtask-sleeper-{}", std::process::id()));
        let case = Case {
            binary: this_binary(),
            name: "runner::tests::sleeper".into(),
        };
        let env = [(SLEEP_ENV, pid_file.to_str().unwrap())];
        let outcome = run(&case, Duration::from_secs(2), &env);
        assert_eq!(outcome.verdict, Verdict::TimedOut, "{}", outcome.output);
        assert!(outcome.elapsed < Duration::from_secs(10));
        assert!(outcome.output.contains("sleeping"), "{}", outcome.output);
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let _ = std::fs::remove_file(&pid_file);
        // Gone (and reaped by init), not left running.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Path::new(&format!("/proc/{pid}")).exists() {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if state.split_whitespace().nth(2) == Some("Z") {
                break;
            }
            assert!(Instant::now() < deadline, "sleep {pid} still runs");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn passing_failing_and_missing_tests_are_told_apart() {
        let run_named = |name: &str| {
            let case = Case {
                binary: this_binary(),
                name: name.into(),
            };
            run(&case, Duration::from_secs(60), &[(FAIL_ENV, "1")])
        };
        assert_eq!(run_named("runner::tests::sleeper").verdict, Verdict::Passed);
        assert!(matches!(
            run_named("runner::tests::no_such_test").verdict,
            Verdict::NotRun(_)
        ));
        assert_eq!(
            run_named("runner::tests::fails_when_asked").verdict,
            Verdict::Failed
        );
    }

    /// Fails when the runner's own test asks it to; passes otherwise.
    #[test]
    fn fails_when_asked() {
        assert!(std::env::var_os(FAIL_ENV).is_none(), "asked to fail");
    }
}
