//! `cargo xtask validate --cells`: the replay held to real senders of each
//! policy over a matrix of paths (issue 16): ATR re-point rates
//! {0 (edge off), 10, 50, 200}/s x round trips {1, 20, 80} ms x
//! bottlenecks {200, 800} Mbit/s. In each cell each policy runs alone (one
//! Linux 6.1 guest of that policy, one flow, alternating runs: no sender
//! competes with another), and the replay's estimate for that policy,
//! made from what the receiver saw alone, is set beside what the real
//! sender did: its goodput (the receiver's bytes over the flow's time)
//! and its spurious retransmissions (the DSACKs its socket was sent).
//! Linux has no switch for DSACK-based undo, so the classic guest undoes
//! what DSACKs show spurious: its replay runs with `--classic-undo`.
//!
//! `--seed-table`: the seed's table instead. ATR off and on at 80 ms and
//! 200 Mbit/s, the receiver sending no DSACKs (`tracer lab --no-dsack`),
//! so the classic guest, which has no timestamps, undoes nothing, as the
//! seed's senders; its replay is the classic policy that never undoes.
//! Without DSACKs a spurious retransmission is one the receiver counted
//! as a duplicate (`DelayedACKLost`, `TCPOFOMerge`: one flow per run).

use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::validate::{flows, n, policy, prepare, Keep};

const REPOINTS: [u32; 4] = [0, 10, 50, 200];
const RTTS_MS: [u32; 3] = [1, 20, 80];
const RATES_MBIT: [u32; 2] = [200, 800];
pub(crate) const POLICIES: [&str; 3] = ["classic", "linux-adaptive", "rack-tlp"];
/// Each run's upload, seconds (its bytes are bounded by time alone).
const SECONDS: &str = "8";
/// The seed's table: re-point rates (0: edge off) at one WAN path, runs
/// long enough for CUBIC to regrow at 80 ms.
const SEED_REPOINTS: [u32; 3] = [0, 10, 50];
const SEED_RTT_MS: u32 = 80;
const SEED_RATE_MBIT: u32 = 200;
const SEED_SECONDS: &str = "20";
/// Goodput within 25%, spurious retransmissions within 30% (issue 16).
const GOODPUT_BAND: (f64, f64) = (0.75, 1.25);
const SPURIOUS_BAND: (f64, f64) = (0.7, 1.3);
/// Fewer spurious retransmissions than this, real and predicted, say
/// nothing about a ratio: shown, not held.
const FEW: f64 = 10.0;

/// Which table `run` prints.
#[derive(Clone, Copy, PartialEq)]
pub enum Table {
    /// Every path of the matrix, DSACKs on.
    Cells,
    /// The seed's: ATR off and on at 80 ms, no DSACKs.
    Seed,
}

struct Cell {
    repoints: u32,
    rtt_ms: u32,
    rate_mbit: u32,
    table: Table,
}

impl Cell {
    fn name(&self) -> String {
        let edge = match self.repoints {
            0 => "edge off".to_string(),
            r => format!("atr {r}/s"),
        };
        format!("{edge}, {} ms, {} Mbit/s", self.rtt_ms, self.rate_mbit)
    }

    fn args(&self, sender: &str) -> Vec<String> {
        let mut a: Vec<String> = match self.repoints {
            0 => vec!["--mode".into(), "off".into()],
            r => vec![
                "--mode".into(),
                "atr".into(),
                "--repoints".into(),
                r.to_string(),
            ],
        };
        a.extend(
            [
                "--rtt",
                &self.rtt_ms.to_string(),
                "--rate",
                &self.rate_mbit.to_string(),
                "--sender",
                sender,
                "--flows",
                "1",
                "--duration",
                match self.table {
                    Table::Cells => SECONDS,
                    Table::Seed => SEED_SECONDS,
                },
                "--bytes",
                "8G",
                "--ring-mib",
                "64",
            ]
            .map(String::from),
        );
        match self.table {
            // Linux has no switch for DSACK-based undo: the classic guest
            // undoes, so its replay does too.
            Table::Cells if sender == "classic" => a.push("--classic-undo".into()),
            Table::Cells => {}
            Table::Seed => a.push("--no-dsack".into()),
        }
        a
    }
}

/// One run of one policy in one cell.
#[derive(Clone, Default)]
pub(crate) struct Figures {
    pub real_mbit: f64,
    pub predicted_mbit: f64,
    pub real_spurious: f64,
    pub predicted_spurious: f64,
    /// The estimate's range (`estimated_goodput_range_bps`), Mbit/s.
    pub predicted_range_mbit: (f64, f64),
}

pub(crate) fn figures(r: &Value, kind: &str, table: Table) -> Option<Figures> {
    let mut f = Figures::default();
    let mut any = false;
    for (tracer, _, sockets) in flows(r).into_iter().filter(|(_, _, s)| s["sender"] == kind) {
        any = true;
        let secs = n(&tracer["duration_s"]);
        if secs > 0.0 {
            f.real_mbit += n(&tracer["seq_advance_bytes"]) * 8.0 / secs / 1e6;
        }
        let p = policy(tracer, kind);
        f.predicted_mbit += n(&p["estimated_goodput_bps"]) / 1e6;
        let range = &p["estimated_goodput_range_bps"];
        f.predicted_range_mbit.0 += n(&range[0]) / 1e6;
        f.predicted_range_mbit.1 += n(&range[1]) / 1e6;
        f.predicted_spurious += n(&p["spurious_retransmissions"]);
        if table == Table::Cells {
            f.real_spurious += n(&sockets["dsack_dups"]);
        }
    }
    if table == Table::Seed {
        let receiver = &r["lab"]["receiver_counters"];
        f.real_spurious = n(&receiver["TcpExtDelayedACKLost"]) + n(&receiver["TcpExtTCPOFOMerge"]);
    }
    any.then_some(f)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        l if l % 2 == 1 => v[l / 2],
        l => (v[l / 2 - 1] + v[l / 2]) / 2.0,
    }
}

pub fn run(runs: u32, only: &[String], table: Table, keep: &Keep) -> Result<ExitCode> {
    let bin = prepare(runs)?;
    let all: Vec<Cell> = match table {
        Table::Cells => RATES_MBIT
            .iter()
            .flat_map(|&rate_mbit| {
                RTTS_MS.iter().flat_map(move |&rtt_ms| {
                    REPOINTS.iter().map(move |&repoints| Cell {
                        repoints,
                        rtt_ms,
                        rate_mbit,
                        table,
                    })
                })
            })
            .collect(),
        Table::Seed => SEED_REPOINTS
            .iter()
            .map(|&repoints| Cell {
                repoints,
                rtt_ms: SEED_RTT_MS,
                rate_mbit: SEED_RATE_MBIT,
                table,
            })
            .collect(),
    };
    let cells: Vec<Cell> = all
        .into_iter()
        .filter(|c| only.is_empty() || only.iter().any(|o| c.name().contains(o.as_str())))
        .collect();
    if cells.is_empty() {
        bail!("no cell matches {only:?} (cells are named like `atr 50/s, 80 ms, 200 Mbit/s`)");
    }
    let started = std::time::Instant::now();
    println!(
        "{:<32} {:<15} {:>8} {:>13} {:>8} {:>6} {:>6} {:>6} {:>6}  verdict",
        "cell",
        "policy",
        "real",
        "(runs)",
        "replay",
        "ratio",
        match table {
            Table::Cells => "dsack",
            Table::Seed => "dups",
        },
        "pred",
        "ratio"
    );
    // (cell, policy, real Mbit/s, replay's Mbit/s): the seed's conclusion.
    let mut goodputs: Vec<(u32, &str, f64, f64)> = Vec::new();
    let (mut held, mut passed) = (0, 0);
    for cell in &cells {
        for kind in POLICIES {
            let mut runs_of: Vec<Figures> = Vec::new();
            for k in 1..=runs {
                let report = lab_run(&bin, &cell.args(kind))?;
                keep.save(&format!("{} {kind}", cell.name()), k, &report)?;
                runs_of.extend(figures(&report, kind, table));
            }
            let m = |f: fn(&Figures) -> f64| median(runs_of.iter().map(f).collect());
            let (real, predicted) = (m(|f| f.real_mbit), m(|f| f.predicted_mbit));
            let reals = runs_of.iter().map(|f| f.real_mbit);
            let range = format!(
                "({:.0}-{:.0})",
                reals.clone().fold(f64::INFINITY, f64::min),
                reals.fold(0.0, f64::max)
            );
            let (dsack, spurious) = (m(|f| f.real_spurious), m(|f| f.predicted_spurious));
            goodputs.push((cell.repoints, kind, real, predicted));
            let goodput_ratio = predicted / real;
            let spurious_ratio = spurious / dsack;
            let goodput_ok = (GOODPUT_BAND.0..=GOODPUT_BAND.1).contains(&goodput_ratio);
            let few = dsack < FEW && spurious < FEW;
            let spurious_ok = few || (SPURIOUS_BAND.0..=SPURIOUS_BAND.1).contains(&spurious_ratio);
            held += 1;
            passed += usize::from(goodput_ok && spurious_ok);
            let verdict = match (goodput_ok, spurious_ok) {
                (true, true) if few => "pass (few spurious)",
                (true, true) => "pass",
                (false, true) => "FAIL goodput",
                (true, false) => "FAIL spurious",
                (false, false) => "FAIL both",
            };
            let carried = real / f64::from(cell.rate_mbit);
            println!(
                "{:<32} {kind:<15} {real:>8.1} {range:>13} {predicted:>8.1} {:>6} {dsack:>6.0} {spurious:>6.0} {:>6}  {verdict}{}",
                cell.name(),
                format!("{goodput_ratio:.2}"),
                if few { "-".into() } else { format!("{spurious_ratio:.2}") },
                if cell.repoints == 0 {
                    format!(" (the real sender: {:.0}% of the rate)", carried * 100.0)
                } else {
                    String::new()
                }
            );
        }
    }
    if table == Table::Seed {
        print!("{}", seed_conclusion(&goodputs));
    }
    println!(
        "\ncells: {passed} of {held} policy-cells within the targets (goodput {:.2}-{:.2}, spurious {:.2}-{:.2}), K = {runs}, {:.0} s",
        GOODPUT_BAND.0,
        GOODPUT_BAND.1,
        SPURIOUS_BAND.0,
        SPURIOUS_BAND.1,
        started.elapsed().as_secs_f64()
    );
    Ok(if passed == held {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Each policy's goodput with ATR on as a share of its goodput with the
/// edge off, real and as the replay estimated it.
fn seed_conclusion(goodputs: &[(u32, &str, f64, f64)]) -> String {
    let mut out =
        String::from("\nATR's cost at 80 ms (goodput with ATR on / edge off, real; replay):\n");
    for kind in POLICIES {
        let off = goodputs.iter().find(|g| g.0 == 0 && g.1 == kind);
        let line: Vec<String> = goodputs
            .iter()
            .filter(|g| g.0 != 0 && g.1 == kind)
            .filter_map(|g| {
                let off = off?;
                Some(format!(
                    "{}/s {:.0}% ({:.0}%)",
                    g.0,
                    100.0 * g.2 / off.2,
                    100.0 * g.3 / off.3
                ))
            })
            .collect();
        if !line.is_empty() {
            out += &format!("  {kind:<15} {}\n", line.join(", "));
        }
    }
    out
}

/// `tracer lab --json --quiet ARGS`: the report (exit 3, events lost,
/// still has one).
pub(crate) fn lab_run(bin: &std::path::Path, args: &[String]) -> Result<Value> {
    let out = Command::new(bin)
        .args(["lab", "--json", "--quiet"])
        .args(args)
        .output()
        .context("running tracer lab")?;
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "tracer lab {args:?} gave no report ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
