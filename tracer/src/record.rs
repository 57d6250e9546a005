//! The collection loop: drain the ring buffer into sinks until the duration
//! ends, a signal arrives or the caller's condition holds, printing a
//! progress line every second.
//!
//! A plain poll(2) loop: the ring can refill as fast as it drains, and the
//! loop must still notice Ctrl-C and the clock between batches (an async
//! runtime whose fd stays ready never got back to its timers and signals).

use std::{
    sync::atomic::{AtomicBool, AtomicI32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::{
    engine::Engine,
    intervals::Intervals,
    kernel::{Counters, Tracer},
    metrics::Metrics,
    nic::{NicEvidence, NicWatch},
    report,
    sink::Sink,
    snapshot::{FlowReport, InterfaceEvents, Snapshot},
    source::{self, Raw},
    tui,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Duration,
    Signal(&'static str),
    /// The caller's `until()` said so (e.g. the lab's transfer ended).
    Finished,
    /// The traced interface, or its namespace, went away.
    InterfaceGone,
}

pub struct RecordOptions<'a> {
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Print a progress line to stderr every second.
    pub progress: bool,
    /// The live view: sampled every [`tui::FRAME`] (less often when a
    /// sample costs more than a tenth of the time); its `q` stops the run.
    pub live: Option<&'a mut tui::Link>,
    /// Served metrics, updated every second and at the end.
    pub metrics: Option<&'a Metrics>,
    /// The NIC, read every second for the live view and the metrics.
    pub nic: Option<&'a mut NicWatch>,
    /// Interval reports, each written when due (the caller writes the
    /// last); reopened on SIGHUP once [`catch_hangups`] ran.
    pub intervals: Option<&'a mut Intervals>,
    /// What the interface did before this collection (earlier ones of
    /// the same run): the metrics and reports count on from it.
    pub interface: InterfaceEvents,
}

pub struct Outcome {
    pub stop: StopReason,
    pub elapsed: Duration,
    /// Kernel counters since the programs were loaded.
    pub counters: Counters,
    /// Records read from the ring buffer.
    pub received: u64,
    /// Records that did not decode (never expected; counted, not hidden).
    pub decode_errors: u64,
    /// The collector's peak resident memory over the run (VmHWM).
    pub peak_resident_bytes: u64,
    /// Times the interface was seen going down (and its programs stayed).
    pub went_down: u32,
}

impl Outcome {
    /// Records the kernel wrote that userspace did not see (must be zero).
    pub fn missing(&self) -> u64 {
        self.counters.emitted().saturating_sub(self.received)
    }

    /// This collection followed by `later`, the same run attached again:
    /// how `later` stopped, its counters (which count on from these), the
    /// records of both.
    pub fn then(self, later: Outcome) -> Outcome {
        Outcome {
            stop: later.stop,
            elapsed: self.elapsed + later.elapsed,
            counters: later.counters,
            received: self.received + later.received,
            decode_errors: self.decode_errors + later.decode_errors,
            peak_resident_bytes: self.peak_resident_bytes.max(later.peak_resident_bytes),
            went_down: self.went_down + later.went_down,
        }
    }
}

/// Waits until `ready()` (asked every `every`) or SIGINT/SIGTERM: the
/// signal's name if one came first.
pub fn wait_until(
    mut ready: impl FnMut() -> bool,
    every: Duration,
) -> Result<Option<&'static str>> {
    let signals = StopSignals::install()?;
    loop {
        if let Some(name) = signals.received() {
            return Ok(Some(name));
        }
        if ready() {
            return Ok(None);
        }
        std::thread::sleep(every);
    }
}

/// Drains `tracer` until the duration, a SIGINT/SIGTERM or `until()`, then
/// detaches it and drains what is left.
pub fn run(
    tracer: &mut Tracer,
    engine: &mut Engine,
    sinks: &mut [&mut dyn Sink],
    mut until: impl FnMut() -> bool,
    mut opts: RecordOptions,
) -> Result<Outcome> {
    let signals = StopSignals::install()?;
    let _urgent = Urgent::raise();
    if let Some(m) = opts.metrics {
        m.serve()?;
    }
    let start = Instant::now();
    let deadline = opts.duration.map(|d| start + d);
    let mut last_tick = start;
    let mut last_given_up = 0;
    let mut last_live = engine.live();
    let mut last_counters = Counters::default();
    let mut received = 0u64;
    let mut decode_errors = 0u64;
    let (mut went_down, mut down_since) = (0u32, None::<Instant>);
    let events = |went_down: u32| InterfaceEvents {
        went_down: opts.interface.went_down + u64::from(went_down),
        ..opts.interface
    };
    let stop = loop {
        if let Some(name) = signals.received() {
            break StopReason::Signal(name);
        }
        if until() {
            break StopReason::Finished;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break StopReason::Duration;
        }
        if let Some(link) = opts.live.as_deref_mut() {
            if link.quit_requested() {
                break StopReason::Signal("q");
            }
            if link.due(now) {
                let asked = link.requests();
                if asked.reset {
                    engine.reset();
                }
                let snapshot = engine
                    .live_snapshot(tui::SHOWN_FLOWS, asked.keep.as_ref())
                    .with_nic(nic_now(&opts.nic));
                link.sample(
                    snapshot,
                    engine.live(),
                    |flow| engine.replay_of(flow),
                    &tracer.counters()?,
                    now - start,
                );
            }
        }
        if now >= last_tick + TICK {
            if !tracer.interface_present() {
                break StopReason::InterfaceGone;
            }
            match (tracer.interface_up(), down_since) {
                (false, None) => {
                    down_since = Some(now);
                    went_down += 1;
                    eprintln!(
                        "tracer: {} went down: its programs stay attached, and tracing goes on when it is up",
                        tracer.iface
                    );
                }
                (true, Some(since)) => {
                    down_since = None;
                    eprintln!(
                        "tracer: {} is up again after {:.1} s",
                        tracer.iface,
                        (now - since).as_secs_f64()
                    );
                }
                _ => {}
            }
            let counters = tracer.counters()?;
            for sink in sinks.iter_mut() {
                sink.flush(&counters)?;
            }
            let nic_read = opts.metrics.is_some() || opts.live.is_some();
            if let Some(nic) = opts.nic.as_deref_mut().filter(|_| nic_read) {
                nic.read();
            }
            if let Some(m) = opts.metrics {
                let s = engine
                    .live_snapshot(0, None)
                    .with_nic(nic_now(&opts.nic))
                    .with_interface(events(went_down));
                m.update(&s, &counters, resident().0);
            }
            if HANGUP.swap(false, Ordering::SeqCst) {
                reopen(sinks, opts.intervals.as_deref_mut());
            }
            if let Some(iv) = opts.intervals.as_deref_mut() {
                if iv.due(now) {
                    let s = engine
                        .live_snapshot(0, None)
                        .with_kernel(&counters)
                        .with_nic(nic_now(&opts.nic))
                        .with_interface(events(went_down));
                    write_interval(iv, &s, engine.flow_reports(), false);
                    // (What the report took goes back, not kept beside the
                    // flows' memory.)
                    give_back_freed();
                }
            }
            if opts.progress {
                let live = engine.live();
                eprintln!(
                    "{}",
                    report::progress_line(
                        &live,
                        &last_live,
                        now - start,
                        now - last_tick,
                        &counters,
                        &last_counters,
                        resident().0,
                    )
                );
                last_live = live;
                last_counters = counters;
            }
            last_tick = now;
        }
        if drain(tracer, engine, sinks, &mut received, &mut decode_errors) {
            tracer.wait_readable(POLL_TIMEOUT)?;
        }
        let memory = engine.memory();
        let given_up = memory.ack_logs_shed + memory.evicted_for_memory;
        if given_up != last_given_up {
            give_back_freed();
            last_given_up = given_up;
        }
    };
    // Detach first: then nothing more arrives, the drain below gets all the
    // kernel wrote, and the counters read after it are final.
    tracer.detach();
    while !drain(tracer, engine, sinks, &mut received, &mut decode_errors) {}
    let late = tracer.rings().late();
    if late > 0 {
        log::warn!(
            "{late} records reached the collector after later ones from another CPU had gone on (held up in the kernel over {} ms): they were taken out of time order",
            crate::kernel::rings::WINDOW.as_millis()
        );
    }
    // The NIC's last reading: what the report and the metrics both say.
    if let Some(nic) = opts.nic.as_deref_mut() {
        nic.read();
    }
    let counters = tracer.counters()?;
    for sink in sinks.iter_mut() {
        sink.flush(&counters)?;
    }
    if let Some(m) = opts.metrics {
        let s = engine
            .live_snapshot(0, None)
            .with_nic(nic_now(&opts.nic))
            .with_interface(events(went_down));
        m.update(&s, &counters, resident().0);
    }
    Ok(Outcome {
        stop,
        elapsed: start.elapsed(),
        counters,
        received,
        decode_errors,
        peak_resident_bytes: resident().1,
        went_down,
    })
}

/// SIGHUP: the interval reports' directory and the sinks' files begin
/// again; what fails is said, and tracing goes on.
fn reopen(sinks: &mut [&mut dyn Sink], intervals: Option<&mut Intervals>) {
    if let Some(iv) = intervals {
        match iv.reopen() {
            Ok(()) => eprintln!("tracer: SIGHUP: {} reopened", iv.dir().display()),
            Err(e) => eprintln!(
                "tracer: SIGHUP: reopening {} failed: {e:#}; tracing goes on",
                iv.dir().display()
            ),
        }
    }
    for sink in sinks.iter_mut() {
        if let Err(e) = sink.reopen() {
            eprintln!("tracer: SIGHUP: {e:#}; tracing goes on");
        }
    }
}

/// Ends `iv`'s interval now with `s` (the engine's snapshot, with the
/// kernel's counters, the NIC and the interface) and `flows` (each tracked
/// connection's report) and writes it (`last`: the run's last), saying so
/// on stderr; a file that could not be written is said, and tracing goes
/// on.
pub fn write_interval(
    iv: &mut Intervals,
    s: &Snapshot,
    flows: impl IntoIterator<Item = FlowReport>,
    last: bool,
) {
    match iv.write(s, flows, Instant::now(), last) {
        Ok(w) => eprintln!("tracer: {}; {}", w.line, w.path.display()),
        Err(e) if last => eprintln!("tracer: {e:#}: the last interval's report is lost"),
        Err(e) => eprintln!(
            "tracer: {e:#} ({} failed so far): the next report covers this interval too; tracing goes on",
            iv.failed
        ),
    }
}

/// SIGHUP seen since the collection loop last looked.
static HANGUP: AtomicBool = AtomicBool::new(false);

extern "C" fn note_hangup(_: libc::c_int) {
    HANGUP.store(true, Ordering::SeqCst);
}

/// From now on, for the life of the process, SIGHUP asks the collection
/// loop to reopen its interval reports instead of ending the process.
pub fn catch_hangups() -> Result<()> {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = note_hangup as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGHUP, &action, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error()).context("installing the SIGHUP handler");
        }
    }
    Ok(())
}

/// The NIC's latest reading, for a snapshot.
fn nic_now(nic: &Option<&mut NicWatch>) -> Option<NicEvidence> {
    nic.as_deref().and_then(NicWatch::evidence).cloned()
}

const TICK: Duration = Duration::from_secs(1);
/// Longest sleep on an empty ring: the latency of noticing `until()`.
const POLL_TIMEOUT: Duration = Duration::from_millis(50);

/// The collecting thread's nice value while it collects. A busy host's
/// threads (the very uploads it watches, or a build) otherwise keep it
/// from the ring until the kernel must summarize, or drop: with two CPU
/// hogs beside a 64-flow upload the ring lost 353,587 events even while
/// summarized, none at nice -10. It does the same work either way; it gets
/// the CPU sooner.
const COLLECTOR_NICE: i32 = -10;

/// Raises this thread's priority to [`COLLECTOR_NICE`]; the previous one
/// comes back on drop. (Needs CAP_SYS_NICE, as tracing needs root; without
/// it the thread keeps its priority.)
struct Urgent {
    previous: Option<i32>,
}

impl Urgent {
    fn raise() -> Self {
        // SAFETY: plain syscalls on this thread (Linux's nice is per
        // thread: `who` is the thread id).
        unsafe {
            let tid = libc::gettid() as libc::id_t;
            *libc::__errno_location() = 0;
            let previous = libc::getpriority(libc::PRIO_PROCESS, tid);
            if *libc::__errno_location() != 0
                || previous <= COLLECTOR_NICE
                || libc::setpriority(libc::PRIO_PROCESS, tid, COLLECTOR_NICE) != 0
            {
                return Self { previous: None };
            }
            Self {
                previous: Some(previous),
            }
        }
    }
}

/// Raises the calling thread's priority for the rest of its life, while
/// it may (before privileges are dropped): later collections find it raised.
pub fn stay_urgent() {
    std::mem::forget(Urgent::raise());
}

impl Drop for Urgent {
    fn drop(&mut self) {
        if let Some(nice) = self.previous {
            // SAFETY: as in `raise`.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
        }
    }
}

/// The last SIGINT/SIGTERM seen while a [`StopSignals`] guard is installed.
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn note_signal(sig: libc::c_int) {
    LAST_SIGNAL.store(sig, Ordering::SeqCst);
}

/// SIGINT and SIGTERM stop the loop instead of the process while alive;
/// the previous dispositions come back on drop.
pub(crate) struct StopSignals {
    previous: [(libc::c_int, libc::sigaction); 2],
}

impl StopSignals {
    pub(crate) fn install() -> Result<Self> {
        LAST_SIGNAL.store(0, Ordering::SeqCst);
        let mut previous = [
            (libc::SIGINT, unsafe { std::mem::zeroed() }),
            (libc::SIGTERM, unsafe { std::mem::zeroed() }),
        ];
        for (sig, old) in previous.iter_mut() {
            // SAFETY: a handler that only stores to an atomic; `old` is
            // written by the kernel.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = note_signal as *const () as usize;
                libc::sigemptyset(&mut action.sa_mask);
                if libc::sigaction(*sig, &action, old) != 0 {
                    return Err(std::io::Error::last_os_error())
                        .context("installing signal handlers");
                }
            }
        }
        Ok(Self { previous })
    }

    pub(crate) fn received(&self) -> Option<&'static str> {
        match LAST_SIGNAL.load(Ordering::SeqCst) {
            libc::SIGINT => Some("SIGINT"),
            libc::SIGTERM => Some("SIGTERM"),
            _ => None,
        }
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restoring what sigaction gave us.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
    }
}

/// Records handled per wake-up before going back to the timers and signals:
/// a ring that refills as fast as it drains must not starve Ctrl-C.
const DRAIN_BATCH: usize = 65_536;

fn drain(
    tracer: &mut Tracer,
    engine: &mut Engine,
    sinks: &mut [&mut dyn Sink],
    received: &mut u64,
    decode_errors: &mut u64,
) -> bool {
    let rings = tracer.rings();
    for _ in 0..DRAIN_BATCH {
        let Some(record) = rings.next_record() else {
            return true;
        };
        *received += 1;
        match source::decode_with_frame(record) {
            Ok((obs, frame)) => {
                engine.observe(&obs);
                for sink in sinks.iter_mut() {
                    sink.observe(&obs, &Raw { record, frame });
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
    false
}

/// Returns the heap's free pages to the kernel (glibc keeps what large
/// freed blocks leave, so that resident memory would otherwise stay at
/// its high mark after the budget made the engine give memory up).
pub fn give_back_freed() {
    // SAFETY: glibc's malloc_trim; it only releases free memory.
    unsafe { libc::malloc_trim(0) };
}

/// This process's resident memory and its peak, in bytes
/// (`/proc/self/status`: VmRSS, VmHWM); zeros where unreadable.
pub fn resident() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |k| k << 10)
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}
