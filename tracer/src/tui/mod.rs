//! The live view (`tracer live`, `tracer lab --live`): a full-screen
//! terminal UI over samples of the engine.
//!
//! The collection loop owns the engine. Four times a second it asks the
//! [`Link`] what the screen wants ([`Requests`]: start over, keep the
//! selected flow), carries that out, and hands the link a [`Snapshot`] and
//! a way to replay one flow by its key; the link adds the rates and the
//! flows' replays as last taken (at most one flow replayed per sample, the
//! selected one first, each at most once a second) and passes the sample
//! to the screen's thread through a channel that never blocks it: a
//! sample the screen has not taken yet is dropped.
//! The screen's thread owns the terminal (restored on exit, on error and on
//! panic), draws with [`render`] (a pure function of the sample and the
//! [`ViewState`]) and sends back what keys ask: quit, reset, the selected
//! flow.

mod render;
mod view;

use std::{
    io::{stdout, Stdout},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{sync_channel, Receiver, SyncSender, TryRecvError},
        Arc, Mutex, Once,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context, Result};
use crossterm::{
    cursor,
    event::{self, Event, KeyEventKind},
    execute,
    terminal::{self, EnterAlternateScreen, LeaveAlternateScreen},
};
use ratatui::{backend::CrosstermBackend, Terminal};

pub use render::{render, MIN_HEIGHT, MIN_WIDTH};
pub use view::{Action, Sort, ViewState};

use crate::{
    kernel::Counters,
    replay::Replay,
    snapshot::{Connection, Live, Snapshot},
};

/// A sender's address and what to call its flows.
pub type SenderName = (std::net::IpAddr, String);

/// How often the collector samples and the screen redraws.
pub const FRAME: Duration = Duration::from_millis(250);
/// Flows a sample carries (the most reordered; the screen shows fewer).
pub const SHOWN_FLOWS: usize = 200;
/// How often the selected flow is replayed (the costly part).
const REPLAY_EVERY: Duration = Duration::from_secs(1);

/// What the screen shows, as the collector last saw it.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Without replays.
    pub snapshot: Snapshot,
    /// The interface and XDP mode, as the header names them.
    pub source: String,
    pub elapsed: Duration,
    pub segments_per_s: f64,
    pub mbit_per_s: f64,
    pub dropped: u64,
}

enum Message {
    Sample(Box<Sample>),
    /// The collection ended (why): the view stays until `q`.
    Finished(String),
    /// Something failed: close now.
    Close,
}

#[derive(Default)]
struct Control {
    quit: AtomicBool,
    reset: AtomicBool,
    selected: Mutex<Option<Connection>>,
}

/// The collector's end: samples out, the screen's requests in.
pub struct Link {
    tx: SyncSender<Message>,
    control: Arc<Control>,
    source: String,
    /// When the last rates were taken, and the segments and payload bytes
    /// then.
    rates_from: Option<(Instant, (u64, u64))>,
    /// Connections' replays and when each was taken.
    replays: std::collections::HashMap<Connection, (Replay, Instant)>,
    senders: Vec<SenderName>,
    next_sample: Instant,
    /// When the collection loop last asked for [`Requests`]: a sample's
    /// cost is measured from then.
    asked: Instant,
}

/// What the screen asks of the collection loop before a sample.
#[derive(Debug, Default, PartialEq)]
pub struct Requests {
    /// Start the counters over (the engine's, then the rates).
    pub reset: bool,
    /// The selected connection: the sample keeps it whatever its rank.
    pub keep: Option<Connection>,
}

impl Link {
    /// The screen asked to quit (`q`, Ctrl-C).
    pub fn quit_requested(&self) -> bool {
        self.control.quit.load(Ordering::SeqCst)
    }

    /// Whether a sample is due: every [`FRAME`], or less often when taking
    /// one costs more than a tenth of the collector's time (many flows).
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_sample
    }

    /// What the screen asks before the next sample (a reset is asked
    /// once).
    pub fn requests(&mut self) -> Requests {
        self.asked = Instant::now();
        let reset = self.control.reset.swap(false, Ordering::SeqCst);
        if reset {
            self.rates_from = None;
            self.replays.clear();
        }
        Requests {
            reset,
            keep: *self.control.selected.lock().expect("not poisoned"),
        }
    }

    /// Hands the screen a sample: `snapshot` (without replays, the flows
    /// [`Requests`] asked to keep) and `live` from the engine, and
    /// `replay_of`, which the link calls for at most one flow.
    pub fn sample(
        &mut self,
        mut snapshot: Snapshot,
        live: Live,
        replay_of: impl FnOnce(&Connection) -> Option<Replay>,
        counters: &Counters,
        elapsed: Duration,
    ) {
        let now = Instant::now();
        // With what summary mode counted in the kernel only.
        let (kept, kept_bytes) = counters.summarized();
        let totals = (live.segments + kept, live.payload_bytes + kept_bytes);
        let (segments_per_s, mbit_per_s) = match self.rates_from {
            Some((t, (segments, bytes))) => {
                let secs = (now - t).as_secs_f64().max(1e-3);
                (
                    totals.0.saturating_sub(segments) as f64 / secs,
                    totals.1.saturating_sub(bytes) as f64 * 8.0 / secs / 1e6,
                )
            }
            None => (0.0, 0.0),
        };
        self.rates_from = Some((now, totals));
        let selected = *self.control.selected.lock().expect("not poisoned");
        snapshot = snapshot.with_kernel(counters).name_senders(&self.senders);
        self.replay_one(replay_of, &snapshot, selected, now);
        for f in &mut snapshot.flows {
            f.replay = self.replays.get(&f.key).map(|(r, _)| r.clone());
        }
        let sample = Sample {
            snapshot,
            source: self.source.clone(),
            elapsed,
            segments_per_s,
            mbit_per_s,
            dropped: counters.dropped(),
        };
        // The screen has not taken the last one: this one waits no more.
        let _ = self.tx.try_send(Message::Sample(Box::new(sample)));
        let cost = self.asked.elapsed();
        self.next_sample = Instant::now() + FRAME.max(cost * 9);
    }

    /// Replays one flow of `shown` (the selected flow first) whose replay
    /// is missing or older than [`REPLAY_EVERY`]: the stalest. Forgets the
    /// replays of flows no longer shown.
    fn replay_one(
        &mut self,
        replay_of: impl FnOnce(&Connection) -> Option<Replay>,
        shown: &Snapshot,
        selected: Option<Connection>,
        now: Instant,
    ) {
        let keys: Vec<Connection> = shown.flows.iter().map(|f| f.key).collect();
        self.replays.retain(|k, _| keys.contains(k));
        let age = |k: &Connection| {
            self.replays
                .get(k)
                .map_or(Duration::MAX, |(_, at)| now.saturating_duration_since(*at))
        };
        let due = selected
            .filter(|k| keys.contains(k) && age(k) >= REPLAY_EVERY)
            .or_else(|| {
                keys.iter()
                    .filter(|k| age(k) >= REPLAY_EVERY)
                    .max_by_key(|k| age(k))
                    .copied()
            });
        let Some(flow) = due else { return };
        match replay_of(&flow) {
            Some(r) => {
                self.replays.insert(flow, (r, now));
            }
            // No data yet: asked again next time, after the others.
            None => {
                self.replays.remove(&flow);
            }
        }
    }

    /// The collection ended; the view stays until `q`.
    pub fn finished(self, why: String) {
        let _ = self.tx.send(Message::Finished(why));
    }

    /// Something failed: the screen closes at once.
    pub fn close(self) {
        let _ = self.tx.send(Message::Close);
    }
}

/// The screen's thread.
pub struct Screen {
    thread: JoinHandle<Result<()>>,
}

impl Screen {
    /// Until the screen is closed (the terminal is restored by then).
    pub fn wait(self) -> Result<()> {
        self.thread
            .join()
            .map_err(|_| anyhow!("the live view panicked"))?
    }
}

/// Opens the view on this terminal. `source`: what the header names;
/// `senders`: names for the flows of known senders (the lab's).
pub fn start(source: String, senders: Vec<SenderName>) -> Result<(Link, Screen)> {
    let (tx, rx) = sync_channel(1);
    let control = Arc::new(Control::default());
    let screen_control = control.clone();
    let thread = std::thread::Builder::new()
        .name("live-view".into())
        .spawn(move || screen(rx, &screen_control))
        .context("starting the live view")?;
    let link = Link {
        tx,
        control,
        source,
        rates_from: Some((Instant::now(), (0, 0))),
        replays: Default::default(),
        senders,
        next_sample: Instant::now() + FRAME,
        asked: Instant::now(),
    };
    Ok((link, Screen { thread }))
}

fn screen(rx: Receiver<Message>, control: &Control) -> Result<()> {
    let mut term = TerminalGuard::enter()?;
    let mut view = ViewState::default();
    let mut shown: Option<Sample> = None;
    loop {
        loop {
            match rx.try_recv() {
                Ok(Message::Sample(s)) if !view.paused || shown.is_none() => shown = Some(*s),
                Ok(Message::Sample(_)) => {}
                Ok(Message::Finished(why)) => view.finished = Some(why),
                Ok(Message::Close) => return Ok(()),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    view.finished.get_or_insert_with(|| "stopped".into());
                    break;
                }
            }
        }
        term.terminal
            .draw(|f| render(f, shown.as_ref(), &view))
            .context("drawing the live view")?;
        if !event::poll(FRAME).context("reading the terminal")? {
            continue;
        }
        let Event::Key(key) = event::read().context("reading the terminal")? else {
            continue;
        };
        if key.kind != KeyEventKind::Press {
            continue;
        }
        match view.key(key, shown.as_ref().map(|s| &s.snapshot)) {
            Action::Quit => {
                control.quit.store(true, Ordering::SeqCst);
                return Ok(());
            }
            Action::Reset => control.reset.store(true, Ordering::SeqCst),
            Action::None => {}
        }
        *control.selected.lock().expect("not poisoned") = view.selected;
    }
}

/// Raw mode and the alternate screen while alive; the terminal as it was
/// after, on drop and on panic.
struct TerminalGuard {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

fn restore_terminal() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(stdout(), LeaveAlternateScreen, cursor::Show);
}

impl TerminalGuard {
    fn enter() -> Result<Self> {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore_terminal();
                previous(info);
            }));
        });
        terminal::enable_raw_mode().context("putting the terminal in raw mode")?;
        let guard = || -> Result<Self> {
            execute!(stdout(), EnterAlternateScreen, cursor::Hide)
                .context("opening the alternate screen")?;
            let terminal =
                Terminal::new(CrosstermBackend::new(stdout())).context("opening the terminal")?;
            Ok(Self { terminal })
        };
        guard().inspect_err(|_| restore_terminal())
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use ratatui::{backend::TestBackend, buffer::Buffer, style::Color};

    use super::*;
    use crate::{
        engine::{Engine, EngineConfig},
        source::{Flow, Segment},
    };

    /// Two flows: one moved between queues and CPUs with segments left
    /// behind on the old path (steering), one in order.
    pub(crate) fn sample_snapshot() -> Snapshot {
        sample_engine().live_snapshot(200, None)
    }

    fn sample_engine() -> Engine {
        let mut e = Engine::new(EngineConfig::default());
        let flow = |port: u16| Flow {
            src: format!("10.0.0.1:{port}").parse().unwrap(),
            dst: "10.0.0.2:5201".parse().unwrap(),
        };
        let seg = |f: Flow, n: u32, t: u64, queue: u32, cpu: u32| Segment {
            ts_ns: t * 1000,
            ifindex: 1,
            rx_queue: queue,
            cpu,
            flow: f,
            seq: 1 + n * 1000,
            ack: 1,
            payload_len: 1000,
            flags: 0x10,
            window: 100,
            ip_id: Some(n as u16),
            timestamp: Some((1000 + n, 7)),
            sack: vec![],
            vlan: None,
            first_fragment: false,
            summarized_before: 0,
            summarized_end: None,
        };
        let steered = flow(1);
        let mut t = 10;
        for round in 0..20u32 {
            // 0-9 on one path; 10-12 overtake 8-9 on the other.
            let base = round * 13;
            let (q, c) = (round % 2, round % 2);
            for n in 0..8 {
                e.segment(&seg(steered, base + n, t, q, c));
                t += 1;
            }
            for n in 10..13 {
                e.segment(&seg(steered, base + n, t, 1 - q, 1 - c));
                t += 1;
            }
            for n in 8..10 {
                e.segment(&seg(steered, base + n, t, q, c));
                t += 1;
            }
        }
        let calm = flow(2);
        for n in 0..200 {
            e.segment(&seg(calm, n, 10 + u64::from(n), 2, 0));
        }
        e
    }

    fn sample(dropped: u64) -> Sample {
        Sample {
            snapshot: sample_snapshot(),
            source: "eth0 (XDP native)".into(),
            elapsed: Duration::from_secs(3),
            segments_per_s: 215_000.0,
            mbit_per_s: 2480.5,
            dropped,
        }
    }

    fn draw(width: u16, height: u16, s: Option<&Sample>, view: &ViewState) -> Buffer {
        let mut t = Terminal::new(TestBackend::new(width, height)).unwrap();
        t.draw(|f| render(f, s, view)).unwrap();
        t.backend().buffer().clone()
    }

    fn text(b: &Buffer) -> String {
        (0..b.area.height)
            .map(|y| {
                (0..b.area.width)
                    .map(|x| b[(x, y)].symbol())
                    .collect::<String>()
                    + "\n"
            })
            .collect()
    }

    #[test]
    fn the_screen_shows_a_known_snapshot() {
        let s = sample(0);
        let b = draw(80, 24, Some(&s), &ViewState::default());
        let screen = text(&b);
        for want in [
            "eth0 (XDP",
            "215.0k seg/s",
            "2480.5 Mbit/s",
            "conns 2",
            "dropped 0",
            "extent (segments), n 40",
            "late time (µs)",
            "10.0.0.1:1 > 10.0.0.2:5201",
            "nic-steering",
            "queue x CPU",
            "cpu0",
            "q quit",
        ] {
            assert!(screen.contains(want), "{want:?} missing from\n{screen}");
        }
        // The steered flow's 40 stragglers: 2 per round, on its old path.
        let r = &s.snapshot.totals.reordering;
        assert_eq!(r.reordered, 40, "{screen}");
        assert!(
            screen.contains("all flows: reordered 40/460 (8.70%), rtx 0"),
            "{screen}"
        );
        assert!(
            screen.contains(&format!("p50 {}", r.extent.p50)),
            "{screen}"
        );
        // Each path's segments/reordered: queue 0 on CPU 0 got rounds
        // 0, 2, .. 18 of the steered flow's old path (10 segments each,
        // 2 of them late) and the others' fast path (3 each).
        let q0 = s
            .snapshot
            .totals
            .paths
            .iter()
            .find(|p| (p.queue, p.cpu) == (0, 0))
            .unwrap();
        assert_eq!((q0.segments, q0.reordered), (10 * 10 + 10 * 3, 20));
        assert!(screen.contains("130/20"), "{screen}");
        // Nothing dropped: nothing red.
        assert!(b.content.iter().all(|c| c.fg != Color::Red));
    }

    #[test]
    fn dropped_events_are_red() {
        let b = draw(100, 30, Some(&sample(17)), &ViewState::default());
        let screen = text(&b);
        let (y, line) = screen
            .lines()
            .enumerate()
            .find(|(_, l)| l.contains("dropped 17"))
            .expect("dropped shown");
        let x = line.find("dropped 17").unwrap();
        // (byte offset = column: the header line is ASCII up to there)
        assert_eq!(b[(x as u16, y as u16)].fg, Color::Red);
    }

    /// The NIC's line: its steering flag and statistics, and the fix for
    /// the flows the sample calls nic-steering.
    #[test]
    fn the_nic_line_shows_its_evidence_and_the_fix() {
        use crate::nic::{NicEvidence, NicReport};
        let nic = |atr: u64| NicReport {
            iface: "eth0".into(),
            driver: Some("i40e".into()),
            private_flags: [("flow-director-atr".to_string(), true)].into(),
            statistics: [("port.fdir_atr_match".to_string(), atr)].into(),
            ..NicReport::default()
        };
        let mut s = sample(0);
        s.snapshot = s
            .snapshot
            .with_nic(Some(NicEvidence::new(nic(10), nic(52))));
        let screen = text(&draw(160, 24, Some(&s), &ViewState::default()));
        for want in [
            "NIC eth0 i40e  flow-director-atr on",
            "port.fdir_atr_match +42",
            "FIX: ethtool --set-priv-flags eth0 flow-director-atr off",
        ] {
            assert!(screen.contains(want), "{want:?} missing from\n{screen}");
        }
    }

    #[test]
    fn a_selected_flow_replaces_the_totals() {
        let s = sample(0);
        let mut view = ViewState {
            selected: s
                .snapshot
                .flows
                .iter()
                .find(|f| f.flow() == "10.0.0.1:2 -> 10.0.0.2:5201")
                .map(|f| f.key),
            ..ViewState::default()
        };
        let screen = text(&draw(80, 24, Some(&s), &view));
        assert!(
            screen.contains("10.0.0.1:2 -> 10.0.0.2:5201: reordered 0/200"),
            "{screen}"
        );
        assert!(screen.contains("none yet"), "{screen}");
        assert!(screen.contains("replaying..."), "{screen}");
        view.paused = true;
        view.finished = Some("transfer finished".into());
        let screen = text(&draw(100, 30, Some(&s), &view));
        assert!(screen.contains("PAUSED"), "{screen}");
        assert!(screen.contains("FINISHED (transfer finished)"), "{screen}");
        view.help = true;
        let screen = text(&draw(80, 24, Some(&s), &view));
        assert!(screen.contains("start the counters over"), "{screen}");
    }

    /// The collector names the lab's senders and replays one flow per
    /// sample, each at most once a second: after the first sample one flow
    /// has its estimates, after the second both, and the table shows them.
    #[test]
    fn samples_name_senders_and_carry_each_flows_replay() {
        let mut engine = sample_engine();
        let (tx, rx) = sync_channel(1);
        let mut link = Link {
            tx,
            control: Arc::default(),
            source: "veth-s".into(),
            rates_from: None,
            replays: Default::default(),
            senders: vec![("10.0.0.1".parse().unwrap(), "classic".into())],
            next_sample: Instant::now(),
            asked: Instant::now(),
        };
        // What the collection loop does each sample.
        let mut take = |link: &mut Link| {
            let asked = link.requests();
            if asked.reset {
                engine.reset();
            }
            let snapshot = engine.live_snapshot(SHOWN_FLOWS, asked.keep.as_ref());
            link.sample(
                snapshot,
                engine.live(),
                |f| engine.replay_of(f),
                &Counters::default(),
                Duration::from_secs(1),
            );
            match rx.try_recv() {
                Ok(Message::Sample(s)) => *s,
                _ => panic!("no sample"),
            }
        };
        let first = take(&mut link);
        let replayed = |s: &Sample| {
            s.snapshot
                .flows
                .iter()
                .filter(|f| f.replay.is_some())
                .count()
        };
        assert_eq!(replayed(&first), 1);
        assert!(first
            .snapshot
            .flows
            .iter()
            .all(|f| f.sender.as_deref() == Some("classic")));
        let second = take(&mut link);
        assert_eq!(replayed(&second), 2);
        // Within the second nothing is replayed again: the same estimates.
        let third = take(&mut link);
        for (a, b) in second.snapshot.flows.iter().zip(&third.snapshot.flows) {
            assert_eq!(a.replay, b.replay);
        }
        let screen = text(&draw(120, 30, Some(&third), &ViewState::default()));
        for want in ["sender", "~classic", "~rack", "classic"] {
            assert!(screen.contains(want), "{want:?} missing from\n{screen}");
        }
        let f = &third.snapshot.flows[0];
        let rack = f
            .replay
            .as_ref()
            .unwrap()
            .policies
            .iter()
            .find(|p| p.name == "rack-tlp")
            .unwrap();
        let shown = format!("{:.1}", rack.estimated_goodput_bps / 1e6);
        assert!(screen.contains(&shown), "{shown} missing from\n{screen}");
    }

    #[test]
    fn a_small_terminal_is_told_so() {
        let screen = text(&draw(60, 20, Some(&sample(0)), &ViewState::default()));
        assert!(
            screen.contains("The terminal is 60x20: the live view needs 80x24"),
            "{screen}"
        );
        let screen = text(&draw(80, 24, None, &ViewState::default()));
        assert!(screen.contains("waiting for the first sample"), "{screen}");
    }
}
