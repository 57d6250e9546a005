//! The live view in a real terminal (tmux), over the lab's ATR upload, as
//! `cargo xtask build-and-run` shows it (root; in CI).

use std::{
    process::Command,
    time::{Duration, Instant},
};

use tracer::{kernel, lab};

mod common;
use common::{root_or_skip, BIN};

/// A tmux server of our own (its own socket), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(width: u16, height: u16, command: &str) -> Self {
        let socket = format!("tracer-live-test-{}", std::process::id());
        let t = Self { socket };
        let ok = t
            .cmd(&[
                "new-session",
                "-d",
                "-s",
                "live",
                "-x",
                &width.to_string(),
                "-y",
            ])
            .arg(height.to_string())
            .arg(command)
            .status()
            .expect("tmux (apt package tmux: cargo xtask setup installs it)")
            .success();
        assert!(ok, "tmux new-session failed");
        t
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]).args(args);
        c
    }

    /// The visible screen.
    fn screen(&self) -> String {
        self.capture(&[])
    }

    /// The normal screen's history too.
    fn history(&self) -> String {
        self.capture(&["-S", "-1000"])
    }

    fn capture(&self, extra: &[&str]) -> String {
        let out = self
            .cmd(&["capture-pane", "-p", "-t", "live"])
            .args(extra)
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        self.cmd(&["send-keys", "-t", "live", keys])
            .status()
            .unwrap();
    }

    fn format(&self, f: &str) -> String {
        let out = self
            .cmd(&["display-message", "-p", "-t", "live", f])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]).status();
    }
}

/// The first number after `label` on the screen.
fn number_after(screen: &str, label: &str) -> Option<u64> {
    let rest = &screen[screen.find(label)? + label.len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

#[test]
fn the_demo_shows_steering_live_and_quits_cleanly() {
    if !root_or_skip("the_demo_shows_steering_live_and_quits_cleanly") {
        return;
    }
    let status = std::env::temp_dir().join(format!("tracer-live-{}.status", std::process::id()));
    let _ = std::fs::remove_file(&status);
    // The pane stays after the command (remain-on-exit) so its last screen
    // can be read.
    let command = format!(
        "{BIN} lab --live --repoints 50 --flows 2 --bytes 4G --duration 60; echo $? > {}",
        status.display()
    );
    let tmux = Tmux::start(100, 30, &command);
    tmux.cmd(&["set-option", "-t", "live", "remain-on-exit", "on"])
        .status()
        .unwrap();
    // The view comes up on the alternate screen, and shows reordering
    // attributed to steering (as soon as there is some: the upload goes on
    // for a minute, and the view stays after it). A capture can catch the
    // terminal half drawn: the screen is read until one capture holds the
    // whole view.
    let panels = [
        "late time (µs)",
        "queue x CPU",
        "flows (sorted by",
        "q quit",
    ];
    let deadline = Instant::now() + Duration::from_secs(70);
    let mut screen = String::new();
    while Instant::now() < deadline {
        screen = tmux.screen();
        let reordered = number_after(&screen, "all flows: reordered ").unwrap_or(0);
        if reordered > 0
            && screen.contains("nic-steering")
            && panels.iter().all(|p| screen.contains(p))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        number_after(&screen, "all flows: reordered ").unwrap_or(0) > 0
            && screen.contains("nic-steering"),
        "no live reordering on screen:\n{screen}"
    );
    for panel in panels {
        assert!(screen.contains(panel), "{panel:?} missing:\n{screen}");
    }
    assert_eq!(tmux.format("#{alternate_on}"), "1", "{screen}");
    eprintln!("live view during the upload:\n{screen}");
    tmux.keys("q");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !status.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let code = std::fs::read_to_string(&status).unwrap_or_default();
    let _ = std::fs::remove_file(&status);
    let after = tmux.history();
    assert_eq!(code.trim(), "0", "exit status; screen:\n{after}");
    // The terminal is back: off the alternate screen, and the report
    // printed on the normal one.
    assert_eq!(tmux.format("#{alternate_on}"), "0", "{after}");
    // (Stopped by q, or ended before it and then left by q.)
    assert!(
        after.contains("(q)") || after.contains("(transfer finished)"),
        "stopped by q:\n{after}"
    );
    assert!(after.contains("verdicts: nic-steering"), "{after}");
    assert!(
        lab::lab_namespaces().is_empty(),
        "{:?}",
        lab::lab_namespaces()
    );
    let mut ours = kernel::loaded_tracer_programs();
    ours.extend(kernel::loaded_programs(&lab::EDGE_PROGRAM_NAMES));
    assert!(ours.is_empty(), "{ours:?}");
}

#[test]
fn without_a_terminal_live_prints_progress_and_the_report() {
    if !root_or_skip("without_a_terminal_live_prints_progress_and_the_report") {
        return;
    }
    let out = Command::new(BIN)
        .args([
            "lab",
            "--live",
            "--flows",
            "1",
            // (Longer than a second, for a progress line: the duration
            // bounds it.)
            "--bytes",
            "2G",
            "--duration",
            "3",
        ])
        .output()
        .expect("run tracer lab --live");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // The progress line stands in for the screen (none was drawn: no
    // escape sequences), then the report.
    assert!(stderr.contains(" seg/s "), "{stderr}");
    assert!(!stdout.contains('\u{1b}'), "{stdout}");
    assert!(stdout.contains("lab: edge in mode atr"), "{stdout}");
    assert!(lab::lab_namespaces().is_empty());
}
