//! `cargo xtask validate --draw N`: the replay held to real senders on
//! configurations drawn at random from the space users live in (issue 47),
//! so that no band can be fitted to a fixed table: DSACKs on in half of
//! them and off in the other half, 1 to 8 flows per sender, a round trip
//! of 1 to 200 ms and a bottleneck of 50 to 800 Mbit/s (both drawn
//! log-uniform), ATR re-pointing 20 to 200 times a second. Each
//! configuration runs every policy's real guest side by side, K times;
//! per policy, the median of estimated / real goodput is held to
//! 0.75-1.33, and with DSACKs on the median of predicted / DSACKed
//! spurious retransmissions to within 30% where the real ones are over
//! 50; and in each run, whether the real goodput fell inside the
//! estimate's range. The seed is printed; `--seed S` draws the same
//! configurations.

use std::process::ExitCode;

use anyhow::{bail, Result};

use crate::cells::{figures, lab_run, median, Figures, Table, POLICIES};
use crate::validate::{prepare, Keep};

/// Estimated / real goodput, per policy's median (issue 47).
const GOODPUT_BAND: (f64, f64) = (0.75, 1.33);
/// Predicted / DSACKed spurious retransmissions, where over [`MANY`].
const SPURIOUS_BAND: (f64, f64) = (0.7, 1.3);
const MANY: f64 = 50.0;
/// The share of configurations each policy must hold.
const SHARE: f64 = 0.9;
/// Each run's upload, seconds.
const SECONDS: &str = "20";

/// One configuration drawn.
#[derive(Clone, Copy, Debug)]
struct Drawn {
    dsack: bool,
    flows: u32,
    rtt_ms: u32,
    rate_mbit: u32,
    repoints: u32,
}

impl Drawn {
    fn name(&self) -> String {
        format!(
            "dsack {}, {} flows, {} ms, {} Mbit/s, atr {}/s",
            if self.dsack { "on" } else { "off" },
            self.flows,
            self.rtt_ms,
            self.rate_mbit,
            self.repoints
        )
    }

    fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = [
            "--mode",
            "atr",
            "--repoints",
            &self.repoints.to_string(),
            "--rtt",
            &self.rtt_ms.to_string(),
            "--rate",
            &self.rate_mbit.to_string(),
            "--sender",
            &POLICIES.join(","),
            "--flows",
            &self.flows.to_string(),
            "--duration",
            SECONDS,
            "--bytes",
            "8G",
            "--ring-mib",
            "64",
        ]
        .map(String::from)
        .into();
        if !self.dsack {
            a.push("--no-dsack".into());
        }
        a
    }
}

/// SplitMix64: a seeded stream whose every draw a seed reproduces.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform over `lo..=hi`.
    fn int(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.unit() * f64::from(hi - lo + 1)) as u32
    }

    /// Log-uniform over [lo, hi], rounded.
    fn log(&mut self, lo: f64, hi: f64) -> u32 {
        (lo * (hi / lo).powf(self.unit())).round() as u32
    }
}

/// `n` configurations from `seed`: DSACKs on for the even ones.
fn draw(seed: u64, n: u32) -> Vec<Drawn> {
    let mut d = Draws(seed);
    (0..n)
        .map(|i| Drawn {
            dsack: i % 2 == 0,
            flows: d.int(1, 8),
            rtt_ms: d.log(1.0, 200.0),
            rate_mbit: d.log(50.0, 800.0),
            repoints: d.int(20, 200),
        })
        .collect()
}

pub fn run(n: u32, seed: Option<u64>, runs: u32, keep: &Keep) -> Result<ExitCode> {
    if n == 0 {
        bail!("--draw 0: draw at least one configuration");
    }
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let bin = prepare(runs)?;
    let drawn = draw(seed, n);
    println!("draw: {n} configurations, seed {seed} (--seed {seed} draws them again), K = {runs}");
    println!(
        "{:<52} {:<15} {:>8} {:>8} {:>17} {:>6} {:>6}  verdict",
        "configuration", "policy", "real", "replay", "ratio (runs)", "dsack", "pred"
    );
    let started = std::time::Instant::now();
    // Per policy: configurations held, and inside the bands; runs, and
    // those whose real goodput fell inside the estimate's range.
    let mut held = [0u32; POLICIES.len()];
    let mut inside = [0u32; POLICIES.len()];
    let mut runs_seen = [0u32; POLICIES.len()];
    let mut in_range = [0u32; POLICIES.len()];
    for (i, c) in drawn.iter().enumerate() {
        let mut per_policy: Vec<Vec<Figures>> = vec![Vec::new(); POLICIES.len()];
        for k in 1..=runs {
            let report = lab_run(&bin, &c.args())?;
            keep.save(&format!("draw {i} {}", c.name()), k, &report)?;
            for (p, kind) in POLICIES.iter().enumerate() {
                per_policy[p].extend(figures(&report, kind, Table::Cells));
            }
        }
        for (p, kind) in POLICIES.iter().enumerate() {
            let f = &per_policy[p];
            if f.is_empty() {
                println!(
                    "{:<52} {kind:<15} no flow of this sender in the report",
                    c.name()
                );
                continue;
            }
            runs_seen[p] += f.len() as u32;
            in_range[p] += f
                .iter()
                .filter(|f| {
                    (f.predicted_range_mbit.0..=f.predicted_range_mbit.1).contains(&f.real_mbit)
                })
                .count() as u32;
            let ratios: Vec<f64> = f.iter().map(|f| f.predicted_mbit / f.real_mbit).collect();
            let ratio = median(ratios.clone());
            let (lo, hi) = ratios
                .iter()
                .fold((f64::INFINITY, 0f64), |(l, h), &r| (l.min(r), h.max(r)));
            let m = |g: fn(&Figures) -> f64| median(f.iter().map(g).collect());
            let (dsack, predicted) = (m(|f| f.real_spurious), m(|f| f.predicted_spurious));
            let goodput_ok = (GOODPUT_BAND.0..=GOODPUT_BAND.1).contains(&ratio);
            let spurious_held = c.dsack && dsack > MANY;
            let spurious_ok = !spurious_held
                || (SPURIOUS_BAND.0..=SPURIOUS_BAND.1).contains(&(predicted / dsack));
            held[p] += 1;
            inside[p] += u32::from(goodput_ok && spurious_ok);
            let verdict = match (goodput_ok, spurious_ok) {
                (true, true) if !spurious_held => "pass (goodput)",
                (true, true) => "pass",
                (false, true) => "OUT goodput",
                (true, false) => "OUT spurious",
                (false, false) => "OUT both",
            };
            println!(
                "{:<52} {kind:<15} {:>8.1} {:>8.1} {:>17} {:>6} {:>6.0}  {verdict}",
                c.name(),
                m(|f| f.real_mbit),
                m(|f| f.predicted_mbit),
                format!("{ratio:.2} ({lo:.2}-{hi:.2})"),
                if c.dsack {
                    format!("{dsack:.0}")
                } else {
                    "-".into()
                },
                predicted,
            );
        }
    }
    println!(
        "\ndraw, seed {seed}, {n} configurations, K = {runs}, {:.0} s: inside the bands (goodput {:.2}-{:.2}; spurious {:.2}-{:.2} with DSACKs, where over {MANY:.0}):",
        started.elapsed().as_secs_f64(),
        GOODPUT_BAND.0,
        GOODPUT_BAND.1,
        SPURIOUS_BAND.0,
        SPURIOUS_BAND.1
    );
    let mut all = true;
    for (p, kind) in POLICIES.iter().enumerate() {
        let share = f64::from(inside[p]) / f64::from(held[p].max(1));
        all &= held[p] > 0 && share >= SHARE;
        let covered = f64::from(in_range[p]) / f64::from(runs_seen[p].max(1));
        all &= covered >= SHARE;
        println!(
            "  {kind:<15} {} of {} configurations ({:.0}%); the real goodput inside the estimate's range in {} of {} runs ({:.0}%)",
            inside[p],
            held[p],
            share * 100.0,
            in_range[p],
            runs_seen[p],
            covered * 100.0
        );
    }
    println!(
        "  (held: each policy inside in at least {:.0}% of the configurations and of the runs)",
        SHARE * 100.0
    );
    Ok(if all {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seed draws the same configurations every time, each inside the
    /// space, DSACKs on in half of them.
    #[test]
    fn a_seed_draws_the_same_configurations_within_the_space() {
        let (a, b) = (draw(42, 24), draw(42, 24));
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_ne!(format!("{a:?}"), format!("{:?}", draw(43, 24)));
        assert_eq!(a.iter().filter(|c| c.dsack).count(), 12);
        for c in draw(7, 1000) {
            assert!((1..=8).contains(&c.flows), "{c:?}");
            assert!((1..=200).contains(&c.rtt_ms), "{c:?}");
            assert!((50..=800).contains(&c.rate_mbit), "{c:?}");
            assert!((20..=200).contains(&c.repoints), "{c:?}");
        }
    }
}
