//! The kernel matrix: the root integration tests inside guests of the
//! kernels users run, as `cargo xtask test --kernel 6.1|6.12|all`.
//!
//! For each kernel: Debian's newest package of the series (`apt-get
//! download`, kept under `target/kernel-matrix/`), its modules indexed with
//! `depmod`; an initramfs holding this build's test binaries at their own
//! paths, the tools they call (with their libraries) and the kernel's
//! modules (loaded on demand by the kernel through `modprobe`, as on a
//! host); booted under `qemu-system-x86_64` (KVM where a guest boots, else
//! TCG), with this xtask binary as its `/init` ([`crate::guest`]). Results
//! come back over the serial console, one `MATRIX` line each.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufRead, BufReader, BufWriter, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{
    guest, root_dir,
    runner::{self, Build, Case},
    sh,
};

/// A kernel series of the matrix.
pub struct Series {
    pub name: &'static str,
    /// Debian's package names of the series; the newest is tested.
    package: &'static str,
}

pub const SERIES: [Series; 2] = [
    Series {
        name: "6.1",
        package: r"^linux-image-6\.1\.0-[0-9]+-cloud-amd64$",
    },
    Series {
        name: "6.12",
        package: r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64$",
    },
];

/// The integration tests run in every guest (test target, test names):
/// what differs between kernels is loading, attaching and what the kernel
/// counts. Left on the host: tests of our own files and screens against
/// tools the guest does not carry (tshark, tcpdump, promtool, tmux), and
/// of userspace alone.
pub const GUEST_TESTS: &[(&str, &[&str])] = &[
    (
        "tracer",
        &[
            "kernel::features::tests::vmlinux_layout_matches_bpftool",
            "kernel::features::tests::features_agree_with_tracefs_and_the_release",
        ],
    ),
    ("programs", &[]),
    (
        "capture",
        &[
            "ipv4_upload_is_traced_exactly",
            "ipv6_upload_is_traced_exactly",
            "generic_xdp_upload_is_traced_exactly",
            "filter_keeps_other_flows_out_of_the_ring",
            "tcp_probe_under_load_is_accounted_exactly",
            "local_retransmissions_match_the_senders_own_count",
        ],
    ),
    ("summary_table", &[]),
    (
        "lab",
        &[
            "off_mode_reports_no_reordering",
            "atr_reordering_is_found_segment_by_segment_at_three_intensities",
            "summary_mode_keeps_the_reorder_counts_and_verdicts",
        ],
    ),
    (
        "cli",
        &["sigint_ends_with_a_summary_and_sigkill_leaves_nothing_attached"],
    ),
    (
        "faults",
        &["sigkill_during_lab_leaves_no_namespace_or_program"],
    ),
];

/// Tools the tests and the tracer run, copied from this host with their
/// libraries (`ip` for the namespaces, `iptables` for drops and the lab's
/// pattern mode, `mount` for the full-disk test, `bpftool` as the
/// independent BTF reader, `modprobe` for the kernel's module requests).
const TOOLS: &[&str] = &[
    "/usr/sbin/ip",
    "/usr/sbin/iptables",
    "/usr/sbin/ip6tables",
    "/usr/sbin/bpftool",
    "/usr/bin/mount",
    "/usr/bin/umount",
    "/usr/bin/kmod",
    "/usr/bin/sh",
];

/// Plugins `iptables` opens at run time.
const XTABLES: &str = "/usr/lib/x86_64-linux-gnu/xtables";

/// Longest a guest may run its plan once before it is stopped (one takes
/// about 4 minutes; each test has its own bound, [`runner::TCG_BOUND`]).
const GUEST_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// How long a KVM guest gets to say it booted before TCG is used instead.
const KVM_BOOT_TIMEOUT: Duration = Duration::from_secs(15);

/// One kernel's outcome.
pub struct KernelResult {
    pub series: &'static str,
    pub release: String,
    pub accel: &'static str,
    pub passed: Vec<String>,
    pub failed: Vec<String>,
    /// Each time the guest's kernel died (the test it died in, and what
    /// its console said), after which a new guest went on from that test.
    pub deaths: Vec<String>,
    pub elapsed: Duration,
    pub log: PathBuf,
}

/// What one boot of a guest did.
struct Boot {
    passed: Vec<String>,
    failed: Vec<String>,
    /// The guest said `MATRIX done`.
    done: bool,
    /// It ran past its limit and was stopped.
    timed_out: bool,
    /// The test it was running when its console ended, if any.
    running: Option<String>,
    /// The plan step to start a new guest at: that test's, or the next.
    resume_at: usize,
    /// The kernel's own words on why it died: the first oops line and the
    /// faulting instruction.
    oops: Option<String>,
    elapsed: Duration,
}

/// Runs the guest tests `repeat` times on every series in `series`;
/// `filters` narrow the tests by substring of `target::name`.
pub fn run(
    build: &Build,
    series: &[&Series],
    filters: &[String],
    repeat: u32,
) -> Result<Vec<KernelResult>> {
    let cache = root_dir().join("target/kernel-matrix");
    std::fs::create_dir_all(&cache).context("creating target/kernel-matrix")?;
    let plan = plan(build, filters, repeat)?;
    let mut kvm = kvm_usable();
    let mut results = Vec::new();
    for s in series {
        let kernel = fetch(s, &cache)?;
        let image = cache.join(format!("{}.cpio", kernel.release));
        build_image(&kernel, build, &plan, &cache, &image)?;
        let log = cache.join(format!("{}.log", kernel.release));
        println!(
            "matrix: Linux {} ({}), {} tests{}",
            kernel.release,
            kernel.package,
            plan.cases.len(),
            if repeat > 1 {
                format!(", {repeat} times")
            } else {
                String::new()
            }
        );
        let limit = GUEST_TIMEOUT * repeat;
        let on_kvm = if kvm {
            boot(&kernel, &image, &log, "kvm", limit, None)?
        } else {
            None
        };
        if kvm && on_kvm.is_none() {
            println!("matrix: a KVM guest did not boot within {KVM_BOOT_TIMEOUT:?}; using TCG");
            kvm = false;
        }
        let accel = if kvm { "kvm" } else { "tcg" };
        let mut boot_result = match on_kvm {
            Some(b) => b,
            None => boot(&kernel, &image, &log, accel, limit, None)?
                .context("the TCG guest did not boot (see the log)")?,
        };
        let mut result = KernelResult {
            series: s.name,
            release: kernel.release.clone(),
            accel,
            passed: Vec::new(),
            failed: Vec::new(),
            deaths: Vec::new(),
            elapsed: Duration::ZERO,
            log: log.clone(),
        };
        let mut died_in: Option<usize> = None;
        loop {
            let b = boot_result;
            result.passed.extend(b.passed);
            result.failed.extend(b.failed);
            result.elapsed += b.elapsed;
            if b.done || b.timed_out {
                break;
            }
            // The guest's kernel died: a test's failure is a verdict, this
            // is not one. The test it died in runs again in a fresh guest
            // (and the plan goes on from there); dying twice in the same
            // step is that test's failure.
            let test = b.running.unwrap_or_else(|| "between tests".into());
            let why = b.oops.unwrap_or_else(|| "no oops on the console".into());
            let step = b.resume_at;
            if died_in == Some(step) {
                result.failed.push(format!(
                    "{test} (the guest's kernel died in it twice: {why})"
                ));
                break;
            }
            println!("matrix: the guest's kernel died in {test} ({why}); booting a new guest from that test");
            result.deaths.push(format!("{test}: {why}"));
            died_in = Some(step);
            boot_result = match boot(&kernel, &image, &log, accel, limit, Some(step))? {
                Some(b) => b,
                None => {
                    result
                        .failed
                        .push(format!("{test} (the guest did not boot again)"));
                    break;
                }
            };
        }
        results.push(result);
    }
    Ok(results)
}

/// A fetched kernel package.
struct Kernel {
    package: String,
    release: String,
    /// The package's files.
    root: PathBuf,
}

impl Kernel {
    fn vmlinuz(&self) -> PathBuf {
        self.root.join(format!("boot/vmlinuz-{}", self.release))
    }

    fn modules(&self) -> PathBuf {
        self.root.join("lib/modules").join(&self.release)
    }
}

/// The newest package of `series` in apt's lists, downloaded and unpacked
/// into `cache` once. Stale lists (no such package, or one the archive no
/// longer has) are updated and the newest looked up again.
fn fetch(series: &Series, cache: &Path) -> Result<Kernel> {
    fetch_newest(series, cache).or_else(|e| {
        println!("matrix: {e:#}; updating apt's lists");
        sh(Command::new("apt-get").args(["update", "-q"]))?;
        fetch_newest(series, cache)
    })
}

fn fetch_newest(series: &Series, cache: &Path) -> Result<Kernel> {
    let package = packages(series.package)?.pop().with_context(|| {
        format!(
            "no Debian package for Linux {} (apt-cache search '{}') in apt's lists",
            series.name, series.package
        )
    })?;
    let dir = cache.join(&package);
    let root = dir.join("root");
    if !root.join("boot").exists() {
        std::fs::create_dir_all(&dir)?;
        println!("matrix: fetching {package}");
        let status = Command::new("apt-get")
            .args(["download", "-q", &package])
            .current_dir(&dir)
            .status()
            .context("running apt-get")?;
        if !status.success() {
            bail!("apt-get download {package} failed ({status})");
        }
        let deb = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .context("apt-get download left no .deb")?;
        let unpacking = dir.join("root.partial");
        let _ = std::fs::remove_dir_all(&unpacking);
        sh(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacking))?;
        std::fs::rename(&unpacking, &root)?;
        std::fs::remove_file(&deb)?;
    }
    let release = std::fs::read_dir(root.join("lib/modules"))
        .context("the kernel package has no lib/modules")?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .next()
        .context("the kernel package has no modules directory")?;
    let kernel = Kernel {
        package,
        release,
        root,
    };
    if !kernel.modules().join("modules.dep").exists() {
        sh(Command::new("depmod")
            .arg("-b")
            .arg(&kernel.root)
            .arg(&kernel.release))?;
    }
    Ok(kernel)
}

/// Package names matching `pattern`, oldest first.
fn packages(pattern: &str) -> Result<Vec<String>> {
    let out = Command::new("apt-cache")
        .args(["search", "--names-only", pattern])
        .output()
        .context("running apt-cache (the matrix fetches Debian's kernels)")?;
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    names.sort_by_key(|n| numbers(n));
    Ok(names)
}

/// The numbers in a name, in order: what versions sort by.
fn numbers(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The guest's plan: [`GUEST_TESTS`] narrowed by `filters` (substrings of
/// `target::test`).
fn plan(build: &Build, filters: &[String], repeat: u32) -> Result<guest::Plan> {
    let mut cases = Vec::new();
    for &(target, names) in GUEST_TESTS {
        let binary = build
            .binaries
            .iter()
            .find(|b| b.target == target)
            .with_context(|| format!("cargo built no test target {target}"))?;
        let names = if names.is_empty() {
            runner::list(&binary.exe)?
        } else {
            names.iter().map(|n| n.to_string()).collect()
        };
        for name in names {
            let case = Case {
                binary: binary.clone(),
                name,
            };
            if case.chosen(filters) {
                cases.push(case);
            }
        }
    }
    if cases.is_empty() {
        bail!("no guest test matches {filters:?}");
    }
    Ok(guest::Plan { repeat, cases })
}

/// Whether a KVM guest could run here at all (the device opens).
fn kvm_usable() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// Writes the guest's initramfs (an uncompressed cpio archive: TCG
/// decompresses slowly).
fn build_image(
    kernel: &Kernel,
    build: &Build,
    plan: &guest::Plan,
    cache: &Path,
    image: &Path,
) -> Result<()> {
    let mut tree = Tree::default();
    // Debian's merged /usr.
    for (link, to) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        tree.insert(Path::new("/").join(link), Entry::Symlink(to.into()));
    }
    for dir in [
        "/proc", "/sys", "/dev", "/tmp", "/run", "/root", "/etc", "/matrix",
    ] {
        tree.dir(Path::new(dir));
    }
    for file in [
        "/etc/passwd",
        "/etc/group",
        "/etc/ld.so.cache",
        "/etc/protocols",
    ] {
        if Path::new(file).exists() {
            tree.host_file(Path::new(file));
        }
    }
    // The init: this very binary.
    let me = std::env::current_exe().context("finding the xtask binary")?;
    tree.executable(Path::new(guest::INIT), &me)?;
    for tool in TOOLS {
        tree.executable(Path::new(tool), Path::new(tool))?;
    }
    tree.symlink(Path::new("/usr/sbin/modprobe"), "../bin/kmod");
    tree.symlink(Path::new("/usr/sbin/depmod"), "../bin/kmod");
    for entry in std::fs::read_dir(XTABLES)
        .with_context(|| format!("reading {XTABLES} (apt package iptables)"))?
    {
        let path = entry?.path();
        tree.executable(&path, &path)?;
    }
    // Test binaries where cargo put them (their paths are compiled in),
    // without debug information (a tenth of the size).
    let stripped = cache.join("bin");
    std::fs::create_dir_all(&stripped)?;
    let mut exes: Vec<&PathBuf> = plan.cases.iter().map(|c| &c.binary.exe).collect();
    exes.push(&build.tracer);
    exes.dedup();
    for exe in exes {
        let copy = stripped.join(exe.file_name().unwrap());
        sh(Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(&copy)
            .arg(exe))?;
        tree.insert(exe.clone(), Entry::File(copy, 0o755));
        tree.libraries(exe)?;
    }
    for case in &plan.cases {
        tree.dir(&case.binary.dir);
    }
    tree.copy_dir(
        &kernel.modules(),
        &Path::new("/usr/lib/modules").join(&kernel.release),
    )?;
    tree.insert(
        Path::new(guest::PLAN).to_path_buf(),
        Entry::Data(serde_json::to_vec(plan)?, 0o644),
    );
    tree.write(image)
}

/// An initramfs's contents, by path inside the guest.
#[derive(Default)]
struct Tree(BTreeMap<PathBuf, Entry>);

enum Entry {
    Dir,
    /// A host file's contents, with this mode.
    File(PathBuf, u32),
    Data(Vec<u8>, u32),
    Symlink(PathBuf),
}

impl Tree {
    fn insert(&mut self, at: PathBuf, entry: Entry) {
        for parent in at.ancestors().skip(1) {
            if parent != Path::new("/") && !self.0.contains_key(parent) {
                self.0.insert(parent.to_path_buf(), Entry::Dir);
            }
        }
        self.0.insert(at, entry);
    }

    fn dir(&mut self, at: &Path) {
        self.insert(at.to_path_buf(), Entry::Dir);
    }

    fn symlink(&mut self, at: &Path, to: &str) {
        self.insert(at.to_path_buf(), Entry::Symlink(to.into()));
    }

    fn host_file(&mut self, path: &Path) {
        self.insert(path.to_path_buf(), Entry::File(path.to_path_buf(), 0o644));
    }

    /// A host executable (or library) at `at`, with the libraries it loads.
    fn executable(&mut self, at: &Path, host: &Path) -> Result<()> {
        self.insert(at.to_path_buf(), Entry::File(host.to_path_buf(), 0o755));
        self.libraries(host)
    }

    /// The shared libraries `ldd` lists for `exe`, each at its path with
    /// the directory resolved (merged /usr) and the file name kept (the
    /// soname the loader looks for).
    fn libraries(&mut self, exe: &Path) -> Result<()> {
        let out = Command::new("ldd")
            .arg(exe)
            .output()
            .context("running ldd")?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(lib) = line.split_whitespace().find(|w| w.starts_with('/')) else {
                continue;
            };
            let lib = Path::new(lib);
            let dir = lib.parent().unwrap().canonicalize()?;
            let at = dir.join(lib.file_name().unwrap());
            if !self.0.contains_key(&at) {
                self.insert(at, Entry::File(lib.to_path_buf(), 0o755));
            }
        }
        Ok(())
    }

    /// Every file under host directory `from`, at `to`.
    fn copy_dir(&mut self, from: &Path, to: &Path) -> Result<()> {
        self.dir(to);
        for entry in
            std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))?
        {
            let entry = entry?;
            let (path, kind) = (entry.path(), entry.file_type()?);
            let at = to.join(entry.file_name());
            if kind.is_dir() {
                self.copy_dir(&path, &at)?;
            } else if kind.is_symlink() {
                self.insert(at, Entry::Symlink(std::fs::read_link(&path)?));
            } else {
                self.insert(at, Entry::File(path, 0o644));
            }
        }
        Ok(())
    }

    /// The tree as a "newc" cpio archive, parents before children.
    fn write(&self, image: &Path) -> Result<()> {
        let mut out = BufWriter::new(
            File::create(image).with_context(|| format!("creating {}", image.display()))?,
        );
        let mut ino = 1;
        for (path, entry) in &self.0 {
            let name = path.strip_prefix("/").unwrap_or(path);
            let (mode, data): (u32, Vec<u8>) = match entry {
                Entry::Dir => (0o040_755, Vec::new()),
                Entry::File(host, mode) => (
                    0o100_000 | mode,
                    std::fs::read(host).with_context(|| format!("reading {}", host.display()))?,
                ),
                Entry::Data(bytes, mode) => (0o100_000 | mode, bytes.clone()),
                Entry::Symlink(to) => (0o120_777, to.as_os_str().as_encoded_bytes().to_vec()),
            };
            cpio_entry(
                &mut out,
                ino,
                mode,
                name.as_os_str().as_encoded_bytes(),
                &data,
            )?;
            ino += 1;
        }
        cpio_entry(&mut out, ino, 0, b"TRAILER!!!", &[])?;
        out.flush()?;
        Ok(())
    }
}

/// One cpio "newc" record: a header of hexadecimal fields, the name, the
/// data, each padded to four bytes.
fn cpio_entry(out: &mut impl Write, ino: u32, mode: u32, name: &[u8], data: &[u8]) -> Result<()> {
    let nlink = if mode & 0o170_000 == 0o040_000 { 2 } else { 1 };
    let fields = [
        ino,
        mode,
        0,
        0,
        nlink,
        0,
        data.len() as u32,
        0,
        0,
        0,
        0,
        name.len() as u32 + 1,
        0,
    ];
    let mut header = String::from("070701");
    for f in fields {
        header.push_str(&format!("{f:08x}"));
    }
    out.write_all(header.as_bytes())?;
    out.write_all(name)?;
    out.write_all(&[0])?;
    let pad = |n: usize| (4 - n % 4) % 4;
    out.write_all(&[0; 3][..pad(110 + name.len() + 1)])?;
    out.write_all(data)?;
    out.write_all(&[0; 3][..pad(data.len())])?;
    Ok(())
}

/// Boots `image` on `kernel` to run its plan, from its start or from step
/// `resume_at` after a guest died, streaming the guest's console (prefixed
/// with its release) and keeping it in `log` (appended to when resuming);
/// stops it after `limit`. `None` if a KVM guest did not say it booted in
/// time.
fn boot(
    kernel: &Kernel,
    image: &Path,
    log: &Path,
    accel: &'static str,
    limit: Duration,
    resume_at: Option<usize>,
) -> Result<Option<Boot>> {
    let from = resume_at.unwrap_or(0);
    let start = Instant::now();
    // TCG in one thread. With a thread per vCPU the 6.12 guest died once
    // in an "Oops: int3" at tcp_rcv_established's tcp_probe jump while a
    // test's tracer detached: text_poke's breakpoint met after the patch
    // was done, which a real CPU's serialisation rules out (a translated
    // block still running the old bytes on the other vCPU's thread). One
    // thread runs the vCPUs in turn, between translated blocks, so none
    // runs code another has re-patched; the guest still has two CPUs.
    let accel_option = if accel == "tcg" {
        "tcg,thread=single"
    } else {
        accel
    };
    let mut child = Command::new("qemu-system-x86_64")
        .args(["-accel", accel_option, "-smp", "2", "-m", "4G"])
        .args([
            "-nographic",
            "-no-reboot",
            "-nic",
            "none",
            "-serial",
            "mon:stdio",
        ])
        .arg("-kernel")
        .arg(kernel.vmlinuz())
        .arg("-initrd")
        .arg(image)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 quiet loglevel=3 panic=-1 rdinit={} {}={accel} {}={from}{}",
            guest::INIT,
            guest::ACCEL_ARG,
            guest::FROM_ARG,
            crash_at(resume_at.is_none())
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting qemu-system-x86_64 (apt package qemu-system-x86)")?;
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let mut file = BufWriter::new(
        std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(resume_at.is_some())
            .truncate(resume_at.is_none())
            .open(log)?,
    );
    let mut booted = false;
    let (mut passed, mut failed) = (Vec::new(), Vec::new());
    let (mut done, mut timed_out) = (false, false);
    let (mut running, mut started) = (None, 0);
    let mut oops = Oops::default();
    loop {
        let bound = if booted || accel == "tcg" {
            limit
        } else {
            KVM_BOOT_TIMEOUT
        };
        let left = bound.saturating_sub(start.elapsed());
        let line = match rx.recv_timeout(left) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                if !booted {
                    return Ok(None);
                }
                failed.push(format!("(the guest ran past {limit:?} and was stopped)"));
                timed_out = true;
                break;
            }
        };
        let line = line.trim_end_matches('\r').to_string();
        writeln!(file, "{line}")?;
        match guest::parse(&line) {
            Some(guest::Report::Booted) => booted = true,
            Some(guest::Report::Running(t)) => {
                running = Some(t);
                started += 1;
            }
            Some(guest::Report::Passed(t)) => {
                running = None;
                passed.push(t)
            }
            Some(guest::Report::Failed(t)) => {
                running = None;
                failed.push(t)
            }
            Some(guest::Report::Done) => done = true,
            None => oops.read(&line),
        }
        println!("[{}] {line}", kernel.release);
    }
    let _ = child.wait();
    file.flush()?;
    let resume_at = from + started - usize::from(running.is_some());
    Ok(Some(Boot {
        passed,
        failed,
        done,
        timed_out,
        running,
        resume_at,
        oops: oops.words(),
        elapsed: start.elapsed(),
    }))
}

/// `XTASK_MATRIX_CRASH_AT=K`: a kernel's first guest crashes its kernel in
/// step K, to see the harness go on in a new guest. Nothing else sets it.
fn crash_at(first: bool) -> String {
    match std::env::var("XTASK_MATRIX_CRASH_AT") {
        Ok(k) if first => format!(" {}={k}", guest::CRASH_ARG),
        _ => String::new(),
    }
}

/// The lines of a kernel's console that say why it died.
#[derive(Default)]
struct Oops {
    first: Option<String>,
    rip: Option<String>,
}

impl Oops {
    fn read(&mut self, line: &str) {
        // (After the console's timestamp, `[  252.748636] `.)
        let text = line.split_once("] ").map_or(line, |(_, t)| t).trim();
        let says_oops = [
            "BUG:",
            "Oops",
            "general protection fault",
            "Kernel panic",
            "kernel BUG",
        ]
        .iter()
        .any(|w| text.starts_with(w));
        if says_oops && self.first.is_none() {
            self.first = Some(text.to_string());
        }
        if text.starts_with("RIP:") && self.rip.is_none() {
            self.rip = Some(text.to_string());
        }
    }

    fn words(self) -> Option<String> {
        match (self.first, self.rip) {
            (None, None) => None,
            (a, b) => Some(a.into_iter().chain(b).collect::<Vec<_>>().join("; ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Oops;

    /// The words kept from a console that ended in an oops: the 6.12
    /// guest's on CI, which died while a test loaded its programs.
    #[test]
    fn an_oops_is_kept_in_the_kernels_words() {
        let mut oops = Oops::default();
        for line in [
            "[  252.740000] BUG: unable to handle page fault for address: ffff8d41a4b61a00",
            "[  252.748559] ---[ end trace 0000000000000000 ]---",
            "[  252.748636] RIP: 0010:push_stack+0x8a/0x130",
            "MATRIX running faults::x (round 1)",
            "[  252.748791] Kernel panic - not syncing: Fatal exception in interrupt",
        ] {
            oops.read(line);
        }
        assert_eq!(
            oops.words().as_deref(),
            Some(
                "BUG: unable to handle page fault for address: ffff8d41a4b61a00; \
                 RIP: 0010:push_stack+0x8a/0x130"
            )
        );
        let mut quiet = Oops::default();
        quiet.read("test result: ok. 1 passed");
        assert_eq!(quiet.words(), None);
    }
}
