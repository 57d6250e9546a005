//! The collection loop: drain the ring buffer into sinks until the duration
//! ends, a signal arrives or the caller's condition completes, printing a
//! progress line every second.

use std::{
    future::Future,
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
    time::{interval, sleep, MissedTickBehavior},
};

use crate::{
    kernel::{Counters, Tracer},
    report::TrafficStats,
    source::{self, Observation},
};

/// Something that consumes the observation stream.
pub trait Sink {
    fn observe(&mut self, obs: &Observation);
    /// Called about once a second and at the end: push buffered output out.
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Collects every observation (tests, small captures).
#[derive(Default)]
pub struct Collect(pub Vec<Observation>);

impl Sink for Collect {
    fn observe(&mut self, obs: &Observation) {
        self.0.push(obs.clone());
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Duration,
    Signal(&'static str),
    /// The caller's `until` future completed (e.g. the lab's transfer ended).
    Finished,
}

pub struct RecordOptions {
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Print a progress line to stderr every second.
    pub progress: bool,
}

pub struct Outcome {
    pub stop: StopReason,
    pub elapsed: Duration,
    /// Kernel counters accumulated during this run.
    pub counters: Counters,
    /// Records read from the ring buffer.
    pub received: u64,
    /// Records that did not decode (never expected; counted, not hidden).
    pub decode_errors: u64,
}

impl Outcome {
    /// Records the kernel wrote that userspace did not see (must be zero).
    pub fn missing(&self) -> u64 {
        self.counters.emitted().saturating_sub(self.received)
    }
}

/// Drains `tracer` until the duration, a SIGINT/SIGTERM or `until`.
pub async fn run(
    tracer: &mut Tracer,
    stats: &mut TrafficStats,
    sinks: &mut [&mut dyn Sink],
    until: impl Future<Output = ()>,
    opts: &RecordOptions,
) -> Result<Outcome> {
    let start = Instant::now();
    let base = tracer.counters()?;
    // SAFETY: the ring's fd stays open while `tracer` is borrowed, which
    // outlives `ring_fd` (dropped when this function returns).
    let ring_fd =
        unsafe { AsyncFd::register_with_interest(tracer.ring().as_raw_fd(), Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("polling the ring buffer")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut tick = interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick.tick().await;
    let deadline = sleep(opts.duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
    tokio::pin!(deadline, until);

    let mut received = 0u64;
    let mut decode_errors = 0u64;
    let mut last_tick = start;
    let stop = loop {
        tokio::select! {
            ready = ring_fd.readable() => {
                let mut guard = ready.context("waiting for the ring buffer")?;
                drain(tracer, stats, sinks, &mut received, &mut decode_errors);
                guard.clear_ready();
            }
            _ = tick.tick() => {
                drain(tracer, stats, sinks, &mut received, &mut decode_errors);
                for sink in sinks.iter_mut() {
                    sink.flush()?;
                }
                if opts.progress {
                    let now = Instant::now();
                    let counters = tracer.counters()?.since(&base);
                    eprintln!("{}", stats.progress_line(now - start, now - last_tick, &counters));
                    last_tick = now;
                }
            }
            _ = sigint.recv() => break StopReason::Signal("SIGINT"),
            _ = sigterm.recv() => break StopReason::Signal("SIGTERM"),
            _ = &mut deadline => break StopReason::Duration,
            _ = &mut until => break StopReason::Finished,
        }
    };
    // What the kernel wrote before we stopped is still ours to record.
    drain(tracer, stats, sinks, &mut received, &mut decode_errors);
    for sink in sinks.iter_mut() {
        sink.flush()?;
    }
    Ok(Outcome {
        stop,
        elapsed: start.elapsed(),
        counters: tracer.counters()?.since(&base),
        received,
        decode_errors,
    })
}

fn drain(
    tracer: &mut Tracer,
    stats: &mut TrafficStats,
    sinks: &mut [&mut dyn Sink],
    received: &mut u64,
    decode_errors: &mut u64,
) {
    let ring = tracer.ring();
    while let Some(record) = ring.next() {
        *received += 1;
        match source::decode(&record) {
            Ok(obs) => {
                stats.observe(&obs);
                for sink in sinks.iter_mut() {
                    sink.observe(&obs);
                }
            }
            Err(e) => {
                if *decode_errors == 0 {
                    log::warn!("undecodable ring buffer record: {e:?} (counted in the summary)");
                }
                *decode_errors += 1;
            }
        }
    }
}
