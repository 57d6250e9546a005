//! The screen as a pure function of a [`Sample`] and the [`ViewState`].

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Cell, Clear, Paragraph, Row, Table, TableState, Wrap},
    Frame,
};

use super::{view::ViewState, Sample};
use crate::{
    nic::Steering,
    snapshot::{Distribution, FlowReport, PathReport, Reordering, Snapshot},
};

/// The smallest terminal the view is laid out for.
pub const MIN_WIDTH: u16 = 80;
pub const MIN_HEIGHT: u16 = 24;

pub fn render(frame: &mut Frame, sample: Option<&Sample>, view: &ViewState) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let text = format!(
            "The terminal is {}x{}: the live view needs {MIN_WIDTH}x{MIN_HEIGHT}. q quits.",
            area.width, area.height
        );
        frame.render_widget(Paragraph::new(text), area);
        return;
    }
    let [header, hists, flows, bottom, keys] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(6),
        Constraint::Min(7),
        Constraint::Length(7),
        Constraint::Length(1),
    ])
    .areas(area);
    let Some(sample) = sample else {
        frame.render_widget(Paragraph::new("waiting for the first sample..."), header);
        frame.render_widget(key_line(view), keys);
        return;
    };
    let selected = view.selected_flow(&sample.snapshot);
    // The selected flow's numbers replace the totals.
    let (scope, r, verdicts): (String, &Reordering, String) = match selected {
        Some(f) => (f.flow(), &f.reordering, f.verdict.to_string()),
        None => {
            let t = &sample.snapshot.totals;
            let counts: Vec<String> = t.verdicts.iter().map(|(v, n)| format!("{v} {n}")).collect();
            (
                "all flows".to_string(),
                &t.reordering,
                format!("verdicts: {}", counts.join(", ")),
            )
        }
    };
    frame.render_widget(header_lines(sample, view, &scope, r, verdicts), header);
    let [extent, late] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(hists);
    frame.render_widget(histogram("extent (segments)", &r.extent), extent);
    frame.render_widget(histogram("late time (µs)", &r.late_time_us), late);
    flows_table(frame, flows, sample, view);
    let [matrix, replay] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(bottom);
    let paths = match selected {
        Some(f) => &f.paths,
        None => &sample.snapshot.totals.paths,
    };
    frame.render_widget(path_matrix(paths, matrix.height.saturating_sub(3)), matrix);
    frame.render_widget(replay_panel(selected), replay);
    frame.render_widget(key_line(view), keys);
    if view.help {
        help(frame, area);
    }
}

/// 1234567 -> "1.2M".
fn si(v: f64) -> String {
    match v {
        v if v >= 1e9 => format!("{:.1}G", v / 1e9),
        v if v >= 1e6 => format!("{:.1}M", v / 1e6),
        v if v >= 1e4 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

fn header_lines<'a>(
    sample: &'a Sample,
    view: &ViewState,
    scope: &str,
    r: &Reordering,
    verdicts: String,
) -> Paragraph<'a> {
    let s = &sample.snapshot;
    let bold = Style::default().add_modifier(Modifier::BOLD);
    // Most important first: a narrow terminal cuts the end.
    let dropped = format!("dropped {}", sample.dropped);
    let first = vec![
        if sample.dropped > 0 {
            Span::styled(
                dropped,
                Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
            )
        } else {
            Span::raw(dropped)
        },
        Span::raw(format!(
            "  {} seg/s  {:.1} Mbit/s  conns {}  evicted {}  {:.1} s  ",
            si(sample.segments_per_s),
            sample.mbit_per_s,
            s.connections(),
            s.evicted_flows,
            sample.elapsed.as_secs_f64(),
        )),
        Span::styled(sample.source.clone(), bold),
    ];
    let mut second = Vec::new();
    if let Some(why) = &view.finished {
        second.push(Span::styled(
            format!("FINISHED ({why}): q for the report  "),
            bold,
        ));
    }
    if view.paused {
        second.push(Span::styled("PAUSED  ", bold));
    }
    second.push(Span::raw(format!(
        "{scope}: reordered {}/{} ({:.2}%), rtx {}; {verdicts}",
        r.reordered,
        r.data_segments,
        r.reordered_ratio * 100.0,
        r.retransmissions,
    )));
    Paragraph::new(vec![Line::from(first), Line::from(second), nic_line(s)])
}

/// What the NIC says (its driver, steering flags, the RSS check and its
/// steering statistics since the start) and, with flows reordered by
/// steering, the fix.
fn nic_line(s: &Snapshot) -> Line<'static> {
    let mut parts = Vec::new();
    if let Some(e) = &s.nic {
        let n = &e.end;
        parts.push(format!(
            "NIC {} {}",
            n.iface,
            n.driver.as_deref().unwrap_or("(driver unknown)")
        ));
        for (flag, on) in n
            .private_flags
            .iter()
            .filter(|(f, _)| f.contains("atr") || f.contains("flow-director"))
        {
            parts.push(format!("{flag} {}", if *on { "on" } else { "off" }));
        }
        if let Some(on) = n.ntuple {
            parts.push(format!("ntuple {}", if on { "on" } else { "off" }));
        }
    }
    if let Some(r) = &s.totals.rss {
        parts.push(format!("off RSS queue {}/{}", r.off_queue, r.segments));
    }
    if let Some(e) = &s.nic {
        let steering: Vec<String> = e
            .deltas
            .iter()
            .filter(|(_, d)| !matches!(d.meaning, Steering::RxPackets(_)) && d.delta > 0)
            .map(|(name, d)| format!("{name} +{}", d.delta))
            .collect();
        parts.extend(steering);
    }
    let mut spans = vec![Span::raw(parts.join("  "))];
    if let Some(fix) = &s.fix {
        spans.push(Span::styled(
            format!("  FIX: {}", fix.suggestion),
            Style::default()
                .fg(Color::Yellow)
                .add_modifier(Modifier::BOLD),
        ));
    }
    Line::from(spans)
}

/// Log2 buckets, merged in pairs until they fit `rows`.
fn fit(buckets: &[(u64, u64)], rows: usize) -> Vec<(u64, u64)> {
    let mut b = buckets.to_vec();
    while b.len() > rows.max(1) {
        b = b
            .chunks(2)
            .map(|c| (c[c.len() - 1].0, c.iter().map(|x| x.1).sum()))
            .collect();
    }
    b
}

fn histogram(title: &str, d: &Distribution) -> Paragraph<'static> {
    if d.count == 0 {
        return Paragraph::new("none yet").block(Block::bordered().title(title.to_string()));
    }
    let block = Block::bordered().title(format!("{title}, n {}", si(d.count as f64)));
    let mut lines = vec![Line::from(format!(
        "p50 {} p90 {} p99 {} max {}",
        d.p50, d.p90, d.p99, d.max
    ))];
    let buckets = fit(&d.buckets, 4);
    let top = buckets.iter().map(|b| b.1).max().unwrap_or(1).max(1);
    for (upper, count) in buckets {
        let bar = (count * 20).div_ceil(top) as usize;
        lines.push(Line::from(format!(
            "<={:>7} {:<20} {}",
            si(upper as f64),
            "#".repeat(bar),
            si(count as f64)
        )));
    }
    Paragraph::new(lines).block(block)
}

/// The replay's estimate for `policy`, Mbit/s ("-" before the first
/// replay).
fn estimate(f: &FlowReport, policy: &str) -> String {
    f.replay
        .as_ref()
        .and_then(|r| r.policies.iter().find(|p| p.name == policy))
        .map_or("-".to_string(), |p| {
            format!("{:.1}", p.estimated_goodput_bps / 1e6)
        })
}

/// A row per flow: its sender (when known), its goodput, what the replay
/// estimates classic and RACK-TLP senders would have carried, its
/// reordering.
fn flows_table(frame: &mut Frame, area: Rect, sample: &Sample, view: &ViewState) {
    let flows = view.sorted(&sample.snapshot);
    // As wide as the longest sender's name (none known: no column).
    let senders = flows
        .iter()
        .filter_map(|f| f.sender.as_deref().map(str::len))
        .max()
        .map(|w| w.max("sender".len()) as u16);
    let rows: Vec<Row> = flows
        .iter()
        .map(|f| {
            let n3 = f.n_reordering.get(2).map_or(0, |n| n.count);
            let mut cells = vec![Cell::from(format!("{} > {}", f.src, f.dst))];
            if senders.is_some() {
                cells.push(Cell::from(f.sender.clone().unwrap_or_default()));
            }
            cells.extend([
                Cell::from(format!("{:>8.1}", f.goodput_mbit())),
                Cell::from(format!("{:>8}", estimate(f, "classic"))),
                Cell::from(format!("{:>8}", estimate(f, "rack-tlp"))),
                Cell::from(format!("{:>6.2}", f.reordered_ratio * 100.0)),
                Cell::from(format!("{:>6}", si(n3 as f64))),
                Cell::from(format!("{:>5}", f.queue_migrations)),
                Cell::from(f.verdict.to_string()),
            ]);
            Row::new(cells)
        })
        .collect();
    let mut header = vec!["flow"];
    let mut widths = vec![Constraint::Min(28)];
    if let Some(width) = senders {
        header.push("sender");
        widths.push(Constraint::Length(width));
    }
    header.extend([
        "  Mbit/s", "~classic", "   ~rack", "reord%", "   n=3", " migr", "verdict",
    ]);
    widths.extend([
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(5),
        Constraint::Length(12),
    ]);
    let header = Row::new(header).style(Style::default().add_modifier(Modifier::BOLD));
    let table = Table::new(rows, widths)
        .header(header)
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        .highlight_symbol("> ")
        .block(Block::bordered().title(format!(
            "flows (sorted by {}; ~: the replay's estimate, Mbit/s)",
            view.sort.name()
        )));
    let at = view
        .selected
        .and_then(|k| flows.iter().position(|f| f.key == k));
    let mut state = TableState::default().with_selected(at);
    frame.render_stateful_widget(table, area, &mut state);
}

/// Segments/reordered per (queue, CPU): a row per queue, a column per CPU.
fn path_matrix(paths: &[PathReport], rows: u16) -> Paragraph<'static> {
    let block = Block::bordered().title("queue x CPU: segments/reordered");
    if paths.is_empty() {
        return Paragraph::new("none yet").block(block);
    }
    let mut cpus: Vec<u32> = paths.iter().map(|p| p.cpu).collect();
    cpus.sort_unstable();
    cpus.dedup();
    let mut queues: Vec<u32> = paths.iter().map(|p| p.queue).collect();
    queues.sort_unstable();
    queues.dedup();
    let mut lines = vec![Line::from(
        std::iter::once("     ".to_string())
            .chain(cpus.iter().map(|c| format!("{:>12}", format!("cpu{c}"))))
            .collect::<String>(),
    )];
    let shown = queues.len().min(rows as usize);
    for q in &queues[..shown] {
        let mut line = format!("q{q:<4}");
        for c in &cpus {
            let cell = paths
                .iter()
                .find(|p| p.queue == *q && p.cpu == *c)
                .map_or("-".to_string(), |p| {
                    format!("{}/{}", si(p.segments as f64), si(p.reordered as f64))
                });
            line.push_str(&format!("{cell:>12}"));
        }
        lines.push(Line::from(line));
    }
    if shown < queues.len() {
        lines.push(Line::from(format!("+{} more queues", queues.len() - shown)));
    }
    Paragraph::new(lines).block(block)
}

fn replay_panel(selected: Option<&FlowReport>) -> Paragraph<'_> {
    let block = Block::bordered().title("replay: classic vs RACK-TLP");
    let Some(flow) = selected else {
        return Paragraph::new("select a flow (arrows) for what other senders would have done")
            .wrap(Wrap { trim: true })
            .block(block);
    };
    let Some(r) = flow.replay.as_ref() else {
        return Paragraph::new("replaying...").block(block);
    };
    let mut lines: Vec<Line> = r
        .policies
        .iter()
        .filter(|p| p.name != "linux-adaptive")
        .map(|p| {
            Line::from(format!(
                "{:<8} {:>6.0} Mbit/s ({} spurious)",
                p.name,
                p.estimated_goodput_bps / 1e6,
                si(p.spurious_retransmissions as f64),
            ))
        })
        .collect();
    if let Some(x) = r.rack_vs_classic {
        lines.push(Line::from(format!("RACK-TLP vs classic: {x:.2}x")));
    }
    Paragraph::new(lines).block(block)
}

fn key_line(view: &ViewState) -> Paragraph<'static> {
    Paragraph::new(format!(
        "q quit  arrows flow  esc all  s sort ({})  p {}  r reset  ? help",
        view.sort.name(),
        if view.paused { "resume" } else { "pause" }
    ))
    .style(Style::default().add_modifier(Modifier::REVERSED))
}

fn help(frame: &mut Frame, area: Rect) {
    let text = vec![
        Line::from("q, Ctrl-C   quit (the full report follows)"),
        Line::from("up, down    select a flow: its histograms, paths, replay"),
        Line::from("esc         back to all flows"),
        Line::from("s           sort the flows table"),
        Line::from("p           pause the display (collection goes on)"),
        Line::from("r           start the counters over (the report too)"),
        Line::from("?           this help"),
    ];
    let w = 64.min(area.width);
    let h = (text.len() as u16 + 2).min(area.height);
    let at = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    frame.render_widget(Clear, at);
    frame.render_widget(
        Paragraph::new(text).block(Block::bordered().title("keys")),
        at,
    );
}
