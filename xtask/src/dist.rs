//! `cargo xtask dist`: the tracer as a host without Rust installs it. A
//! release build (its eBPF object inside), a man page per command, shell
//! completions, the systemd unit for `tracer watch`, the Prometheus alert
//! rules and the Grafana dashboard, laid out as the filesystem wants them;
//! then a Debian package (`dpkg-deb`) and a tarball of the same tree. The
//! unit's hardening and the rules are checked before anything is packed.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{cargo, root_dir, sh};

/// Where the packages go.
pub const OUT: &str = "target/dist";
/// Tells the package's test which package the suite built
/// (`tracer/tests/package.rs`; without it the test builds one).
pub const PACKAGE_ENV: &str = "TRACER_PACKAGE";
/// The unit's overall exposure (`systemd-analyze security`, 0-100) must
/// stay at or below this: "OK" and better.
const EXPOSURE_AT_MOST: u32 = 20;

/// Builds both; the Debian package's path.
pub fn dist() -> Result<PathBuf> {
    sh(cargo().args(["build", "--release", "--package", "tracer"]))?;
    let root = root_dir();
    let bin = root.join("target/release/tracer");
    let version = version(&bin)?;
    let out = root.join(OUT);
    let _ = fs::remove_dir_all(&out);
    let stage = out.join(format!("tracer_{version}_amd64"));
    let generated = out.join("generated");
    fs::create_dir_all(&generated)?;

    let usr = stage.join("usr");
    copy(&bin, &usr.join("bin/tracer"), 0o755)?;
    sh(Command::new("strip")
        .arg("--strip-unneeded")
        .arg(usr.join("bin/tracer")))?;
    sh(Command::new(&bin).arg("package-files").arg(&generated))?;
    for page in fs::read_dir(generated.join("man"))? {
        let page = page?.path();
        let name = page.file_name().unwrap().to_string_lossy().to_string();
        let to = usr.join("share/man/man1").join(format!("{name}.gz"));
        gzip(&page, &to)?;
    }
    let completions = generated.join("completions");
    for (from, to) in [
        ("tracer.bash", "share/bash-completion/completions/tracer"),
        ("_tracer", "share/zsh/vendor-completions/_tracer"),
        ("tracer.fish", "share/fish/vendor_completions.d/tracer.fish"),
    ] {
        copy(&completions.join(from), &usr.join(to), 0o644)?;
    }
    let unit = root.join("deploy/systemd/tracer-watch@.service");
    copy(
        &unit,
        &stage.join("lib/systemd/system/tracer-watch@.service"),
        0o644,
    )?;
    copy(
        &root.join("deploy/systemd/tracer.default"),
        &stage.join("etc/default/tracer"),
        0o644,
    )?;
    let alerts = root.join("deploy/prometheus/alerts.yml");
    copy(
        &alerts,
        &usr.join("share/tracer/prometheus/alerts.yml"),
        0o644,
    )?;
    copy(
        &root.join("deploy/grafana/tracer.json"),
        &usr.join("share/tracer/grafana/tracer.json"),
        0o644,
    )?;
    gzip(
        &root.join("README.md"),
        &usr.join("share/doc/tracer/README.md.gz"),
    )?;
    write(&usr.join("share/doc/tracer/copyright"), COPYRIGHT, 0o644)?;

    check_unit(&unit, &out)?;
    sh(Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&alerts))?;

    let debian = stage.join("DEBIAN");
    write(&debian.join("control"), &control(&version, &stage)?, 0o644)?;
    write(&debian.join("conffiles"), "/etc/default/tracer\n", 0o644)?;
    write(&debian.join("postinst"), POSTINST, 0o755)?;
    write(&debian.join("prerm"), PRERM, 0o755)?;
    write(&debian.join("postrm"), POSTRM, 0o755)?;
    let deb = out.join(format!("tracer_{version}_amd64.deb"));
    sh(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&stage)
        .arg(&deb))?;
    let tarball = out.join(format!("tracer-{version}-x86_64-linux.tar.gz"));
    sh(Command::new("tar")
        .args(["--owner=0", "--group=0", "--sort=name", "-czf"])
        .arg(&tarball)
        .arg("-C")
        .arg(&stage)
        .args(["usr", "lib", "etc"]))?;
    for made in [&deb, &tarball] {
        println!(
            "dist: {} ({:.1} MiB)",
            made.display(),
            fs::metadata(made)?.len() as f64 / (1 << 20) as f64
        );
    }
    Ok(deb)
}

/// `tracer --version`'s number.
fn version(bin: &Path) -> Result<String> {
    let out = Command::new(bin).arg("--version").output()?;
    let text = String::from_utf8(out.stdout)?;
    match text.split_whitespace().nth(1) {
        Some(v) if out.status.success() => Ok(v.to_string()),
        _ => bail!("{} --version said {text:?}", bin.display()),
    }
}

/// The unit's hardening, as `systemd-analyze security` rates an instance
/// of it (offline: no running systemd needed).
fn check_unit(unit: &Path, out: &Path) -> Result<()> {
    let instance = out.join("tracer-watch@eth0.service");
    fs::copy(unit, &instance)?;
    let rated = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(format!("--threshold={EXPOSURE_AT_MOST}"))
        .arg(&instance)
        .output()
        .context("running systemd-analyze security")?;
    let text = String::from_utf8_lossy(&rated.stdout);
    let overall = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or("no overall exposure level")
        .trim_start_matches('→')
        .trim();
    println!("dist: {overall}");
    let _ = fs::remove_file(&instance);
    if !rated.status.success() {
        bail!(
            "the unit's exposure is above {:.1}: {overall}",
            f64::from(EXPOSURE_AT_MOST) / 10.0
        );
    }
    Ok(())
}

fn control(version: &str, stage: &Path) -> Result<String> {
    let du = Command::new("du")
        .args(["-sk", "--exclude=DEBIAN"])
        .arg(stage)
        .output()?;
    let kib: u64 = String::from_utf8(du.stdout)?
        .split_whitespace()
        .next()
        .and_then(|k| k.parse().ok())
        .context("du said no size")?;
    Ok(format!(
        "Package: tracer
Version: {version}
Architecture: amd64
Maintainer: tracer developers <tracer@localhost>
Installed-Size: {kib}
Depends: libc6 (>= 2.34), libgcc-s1, passwd
Recommends: iproute2
Section: net
Priority: optional
Homepage: https://aya-rs.dev
Description: is packet reordering inside this host slowing your TCP transfer?
 An eBPF tracer (XDP and TCP tracepoints) that tags every received TCP
 segment with its RX queue and CPU, finds reordering and attributes it to
 NIC flow steering (Intel Flow Director ATR), and replays what a
 reorder-tolerant sender would have done. `tracer watch` runs it as a
 service (tracer-watch@IFACE.service) with Prometheus metrics and interval
 reports. Needs Linux 6.1 or newer with BTF.
"
    ))
}

fn copy(from: &Path, to: &Path, mode: u32) -> Result<()> {
    fs::create_dir_all(to.parent().unwrap())?;
    fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn write(to: &Path, text: &str, mode: u32) -> Result<()> {
    fs::create_dir_all(to.parent().unwrap())?;
    fs::write(to, text).with_context(|| format!("writing {}", to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// `gzip -9n` (no name or time inside: the same input, the same bytes).
fn gzip(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to.parent().unwrap())?;
    let out = Command::new("gzip")
        .args(["-9n", "-c"])
        .arg(from)
        .output()
        .context("running gzip")?;
    if !out.status.success() {
        bail!("gzip {} failed", from.display());
    }
    fs::write(to, out.stdout)?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o644))?;
    Ok(())
}

const COPYRIGHT: &str = "tracer: is packet reordering inside this host slowing your TCP transfer?
License: MIT OR Apache-2.0
 The eBPF programs inside the binary are GPL-2.0 (as the kernel requires
 of programs that call GPL-only helpers).
";

/// The service's user; systemd's view of the new unit.
const POSTINST: &str = "#!/bin/sh
set -e
if [ \"$1\" = configure ]; then
    if ! getent passwd tracer >/dev/null; then
        useradd --system --user-group --no-create-home \\
            --home-dir /var/lib/tracer --shell /usr/sbin/nologin tracer
    fi
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload || true
    fi
fi
";

/// Running instances stop before their binary goes.
const PRERM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then
    systemctl stop 'tracer-watch@*.service' || true
fi
";

/// On purge, the user and its reports go too.
const POSTRM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
if [ \"$1\" = purge ]; then
    rm -rf /var/lib/tracer
    if getent passwd tracer >/dev/null; then
        userdel tracer || true
    fi
    if getent group tracer >/dev/null; then
        groupdel tracer || true
    fi
fi
";
