//! What the screen shows besides the numbers: the selected flow, the
//! sort, pause and help. Changed by keys only; the screen is drawn from it
//! and a sample.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use crate::snapshot::{Connection, FlowReport, Snapshot};

/// How the flows table is ordered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sort {
    /// Most reordered segments first.
    #[default]
    Reordered,
    /// Highest mean throughput first.
    Throughput,
    /// Most queue migrations first.
    Migrations,
    /// By source, then destination.
    Flow,
}

impl Sort {
    fn next(self) -> Self {
        match self {
            Sort::Reordered => Sort::Throughput,
            Sort::Throughput => Sort::Migrations,
            Sort::Migrations => Sort::Flow,
            Sort::Flow => Sort::Reordered,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Sort::Reordered => "reordered",
            Sort::Throughput => "throughput",
            Sort::Migrations => "migrations",
            Sort::Flow => "flow",
        }
    }
}

/// What a key asks of the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// Start the counters over.
    Reset,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ViewState {
    /// The selected connection; none: all of them.
    pub selected: Option<Connection>,
    pub sort: Sort,
    /// The display keeps its last sample.
    pub paused: bool,
    pub help: bool,
    /// The collection ended (why); the view stays until `q`.
    pub finished: Option<String>,
}

impl ViewState {
    /// The snapshot's flows in the table's order.
    pub fn sorted<'a>(&self, s: &'a Snapshot) -> Vec<&'a FlowReport> {
        let mut v: Vec<&FlowReport> = s.flows.iter().collect();
        match self.sort {
            Sort::Reordered => v.sort_by_key(|f| std::cmp::Reverse(f.reordered)),
            Sort::Throughput => v.sort_by(|a, b| b.goodput_mbit().total_cmp(&a.goodput_mbit())),
            Sort::Migrations => v.sort_by_key(|f| std::cmp::Reverse(f.queue_migrations)),
            Sort::Flow => v.sort_by(|a, b| (&a.src, &a.dst).cmp(&(&b.src, &b.dst))),
        }
        v
    }

    /// The selected flow, if it is in `s`.
    pub fn selected_flow<'a>(&self, s: &'a Snapshot) -> Option<&'a FlowReport> {
        let key = self.selected?;
        s.flows.iter().find(|f| f.key == key)
    }

    /// Applies `key`; `snapshot` is what the screen shows (for moving the
    /// selection through its flows).
    pub fn key(&mut self, key: KeyEvent, snapshot: Option<&Snapshot>) -> Action {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('c') if ctrl => return Action::Quit,
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('p') => self.paused = !self.paused,
            KeyCode::Char('r') => return Action::Reset,
            KeyCode::Char('?') => self.help = !self.help,
            KeyCode::Esc if self.help => self.help = false,
            KeyCode::Esc => self.selected = None,
            KeyCode::Up | KeyCode::Down => {
                if let Some(s) = snapshot {
                    self.step(s, key.code == KeyCode::Down);
                }
            }
            _ => {}
        }
        Action::None
    }

    /// Down from the totals selects the first flow; up from the first
    /// goes back to the totals.
    fn step(&mut self, s: &Snapshot, down: bool) {
        let flows = self.sorted(s);
        let at = self
            .selected
            .and_then(|k| flows.iter().position(|f| f.key == k));
        let next = match (at, down) {
            (None, true) => Some(0),
            (None, false) => None,
            (Some(i), true) => Some((i + 1).min(flows.len().saturating_sub(1))),
            (Some(0), false) => None,
            (Some(i), false) => Some(i - 1),
        };
        self.selected = next.and_then(|i| flows.get(i)).map(|f| f.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::tests::sample_snapshot;

    fn press(v: &mut ViewState, code: KeyCode, s: &Snapshot) -> Action {
        v.key(KeyEvent::new(code, KeyModifiers::NONE), Some(s))
    }

    #[test]
    fn keys_change_the_view_state() {
        let s = sample_snapshot();
        let mut v = ViewState::default();
        let order: Vec<Connection> = v.sorted(&s).iter().map(|f| f.key).collect();
        assert_eq!(order.len(), 2);
        // Down selects the most reordered flow, then the next; it stops at
        // the last; up goes back, and past the first to all flows.
        press(&mut v, KeyCode::Down, &s);
        assert_eq!(v.selected, Some(order[0]));
        press(&mut v, KeyCode::Down, &s);
        press(&mut v, KeyCode::Down, &s);
        assert_eq!(v.selected, Some(order[1]));
        assert_eq!(v.selected_flow(&s).map(|f| f.key), Some(order[1]));
        press(&mut v, KeyCode::Up, &s);
        press(&mut v, KeyCode::Up, &s);
        assert_eq!(v.selected, None);
        press(&mut v, KeyCode::Down, &s);
        press(&mut v, KeyCode::Esc, &s);
        assert_eq!(v.selected, None);
        // s cycles the sort through all four and back.
        for want in [
            Sort::Throughput,
            Sort::Migrations,
            Sort::Flow,
            Sort::Reordered,
        ] {
            press(&mut v, KeyCode::Char('s'), &s);
            assert_eq!(v.sort, want);
        }
        // By throughput, the faster flow comes first.
        v.sort = Sort::Throughput;
        let fast = v.sorted(&s);
        assert!(fast[0].goodput_mbit() >= fast[1].goodput_mbit());
        assert_eq!(press(&mut v, KeyCode::Char('p'), &s), Action::None);
        assert!(v.paused);
        press(&mut v, KeyCode::Char('?'), &s);
        assert!(v.help);
        press(&mut v, KeyCode::Esc, &s);
        assert!(!v.help);
        assert_eq!(press(&mut v, KeyCode::Char('r'), &s), Action::Reset);
        assert_eq!(press(&mut v, KeyCode::Char('q'), &s), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(v.key(ctrl_c, None), Action::Quit);
        // Without a snapshot, arrows do nothing.
        let mut w = ViewState::default();
        w.key(KeyEvent::new(KeyCode::Down, KeyModifiers::NONE), None);
        assert_eq!(w.selected, None);
    }
}
