//! `analyze --plot OUT.svg`: per flow, a time-sequence graph as tcptrace
//! and Wireshark draw them (sequence offset against time), each data
//! segment a mark coloured by its RX queue (or CPU), late originals and
//! retransmissions marked, the flow's queue migrations (the report's) as
//! vertical lines: the whole flow, and beside it every segment around its
//! first reordering (after a start of [`ZOOM_AFTER`] segments: the
//! [`ZOOM_BEFORE`] segments before it and the [`ZOOM_NS`] after), where the
//! overtakers and the stragglers can be seen one by one. Under them, histograms of extent and late time over all flows.
//!
//! Memory is bounded: every segment that is not in order is kept (up to
//! [`MAX_MARKED`] per flow), in-order ones are thinned to at most
//! [`MAX_IN_ORDER`] per flow by keeping every k-th (k doubling as needed;
//! the caption says k); the zoom keeps at most [`MAX_ZOOM`].

use std::{collections::HashMap, path::Path};

use anyhow::{Context, Result};
use plotters::{coord::Shift, prelude::*};

use crate::{
    snapshot::{Class, Distribution, Snapshot},
    source::{Flow, Segment},
};

/// What the marks' colours say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorBy {
    #[default]
    Queue,
    Cpu,
}

/// Flows drawn: the most reordered ones (the report's order).
pub const MAX_FLOWS: usize = 6;
pub const MAX_IN_ORDER: usize = 20_000;
pub const MAX_MARKED: usize = 100_000;
pub const ZOOM_NS: u64 = 10_000_000;
pub const ZOOM_AFTER: u64 = 1000;
pub const MAX_ZOOM: usize = 20_000;
/// Segments before the zoom's first late one it starts with (the
/// overtakers, and the migration before them).
const ZOOM_BEFORE: usize = 256;

#[derive(Clone, Copy, Debug)]
struct Mark {
    t_ns: u64,
    /// Bytes from the flow's first sequence number (unwrapped).
    offset: u64,
    queue: u32,
    cpu: u32,
    class: Class,
}

#[derive(Default)]
struct Series {
    first_ns: u64,
    base: u32,
    /// The highest offset so far: unwraps sequence numbers past 4 GiB.
    high: u64,
    in_order: Vec<Mark>,
    /// Keep every `stride`-th in-order segment.
    stride: u64,
    in_order_seen: u64,
    marked: Vec<Mark>,
    marked_dropped: u64,
    /// When the flow moved to another RX queue.
    migrations: Vec<u64>,
    data_segments: u64,
    /// The latest segments, until the zoom starts; then the zoom.
    recent: std::collections::VecDeque<Mark>,
    zoom: Vec<Mark>,
    zoom_until: Option<u64>,
}

/// Collects the marks while a capture is analysed.
#[derive(Default)]
pub struct Plot {
    flows: HashMap<Flow, Series>,
}

impl Plot {
    /// One data segment, its class, and whether it moved its flow to
    /// another RX queue (a queue migration).
    pub fn segment(&mut self, s: &Segment, class: Class, queue_migration: bool) {
        if s.payload_len == 0 {
            return;
        }
        let f = self.flows.entry(s.flow).or_insert_with(|| Series {
            first_ns: s.ts_ns,
            base: s.seq,
            stride: 1,
            ..Series::default()
        });
        let near = f.high & !0xffff_ffff | u64::from(s.seq.wrapping_sub(f.base));
        // The unwrapped offset nearest the highest one seen.
        let offset = [near.wrapping_sub(1 << 32), near, near + (1 << 32)]
            .into_iter()
            .filter(|o| *o < 1 << 63)
            .min_by_key(|o| o.abs_diff(f.high))
            .unwrap_or(near);
        f.high = f.high.max(offset);
        if queue_migration {
            f.migrations.push(s.ts_ns);
        }
        let mark = Mark {
            t_ns: s.ts_ns,
            offset,
            queue: s.rx_queue,
            cpu: s.cpu,
            class,
        };
        f.data_segments += 1;
        match f.zoom_until {
            None if f.data_segments > ZOOM_AFTER && class == Class::Reordered => {
                f.zoom_until = Some(s.ts_ns + ZOOM_NS);
                f.zoom.extend(f.recent.drain(..));
                f.zoom.push(mark);
            }
            None => {
                if f.recent.len() == ZOOM_BEFORE {
                    f.recent.pop_front();
                }
                f.recent.push_back(mark);
            }
            Some(until) if s.ts_ns <= until && f.zoom.len() < MAX_ZOOM => f.zoom.push(mark),
            Some(_) => {}
        }
        if class != Class::InOrder {
            if f.marked.len() < MAX_MARKED {
                f.marked.push(mark);
            } else {
                f.marked_dropped += 1;
            }
            return;
        }
        f.in_order_seen += 1;
        if !f.in_order_seen.is_multiple_of(f.stride) {
            return;
        }
        if f.in_order.len() == MAX_IN_ORDER {
            // Twice as sparse: keep every other one kept so far.
            f.stride *= 2;
            let mut i = 0;
            f.in_order.retain(|_| {
                i += 1;
                i % 2 == 0
            });
        }
        f.in_order.push(mark);
    }

    /// Writes the SVG: the snapshot's most reordered flows, then the
    /// totals' histograms.
    pub fn write(&self, snapshot: &Snapshot, color: ColorBy, path: &Path) -> Result<()> {
        let flows: Vec<(&Flow, &Series, &crate::snapshot::FlowReport)> = snapshot
            .flows
            .iter()
            .filter_map(|r| {
                self.flows
                    .iter()
                    .find(|(f, _)| f.src.to_string() == r.src && f.dst.to_string() == r.dst)
                    .map(|(f, s)| (f, s, r))
            })
            .take(MAX_FLOWS)
            .collect();
        const WIDTH: u32 = 1400;
        const FLOW_HEIGHT: u32 = 520;
        const HIST_HEIGHT: u32 = 360;
        let height = FLOW_HEIGHT * flows.len().max(1) as u32 + HIST_HEIGHT;
        let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
        let draw = || -> Result<()> {
            root.fill(&WHITE)?;
            let (top, bottom) = root.split_vertically(height - HIST_HEIGHT);
            if flows.is_empty() {
                top.titled("no data segments to plot", ("sans-serif", 22))?;
            }
            for (area, (flow, series, report)) in
                top.split_evenly((flows.len().max(1), 1)).iter().zip(&flows)
            {
                flow_chart(area, flow, series, report, color)?;
            }
            let (left, right) = bottom.split_horizontally(WIDTH / 2);
            let r = &snapshot.totals.reordering;
            histogram(&left, "extent (segments), all flows", &r.extent)?;
            histogram(&right, "late time (µs), all flows", &r.late_time_us)?;
            root.present()?;
            Ok(())
        };
        draw().with_context(|| format!("drawing {}", path.display()))
    }
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
];

fn flow_chart(
    area: &DrawingArea<SVGBackend, Shift>,
    flow: &Flow,
    s: &Series,
    r: &crate::snapshot::FlowReport,
    color: ColorBy,
) -> Result<()> {
    let mut thinned = if s.stride > 1 {
        format!("; every {}th in-order segment drawn", s.stride)
    } else {
        String::new()
    };
    if s.marked_dropped > 0 {
        thinned += &format!(
            "; {} late segments past the first {MAX_MARKED} not drawn",
            s.marked_dropped
        );
    }
    let caption = format!(
        "{flow}: {}, {} of {} data segments reordered, {} retransmitted, {} queue migrations{thinned}",
        r.verdict,
        r.reordering.reordered,
        r.reordering.data_segments,
        r.reordering.retransmissions,
        s.migrations.len()
    );
    let area = area.titled(&caption, ("sans-serif", 17))?;
    let (whole, zoom) = area.split_horizontally(area.dim_in_pixel().0 * 3 / 5);
    let marks: Vec<&Mark> = s.in_order.iter().chain(&s.marked).collect();
    let view = View {
        t0: s.first_ns,
        y0: 0,
        t_unit: 1e9,
        y_unit: 1e6,
        x_desc: "time since the flow's first segment (s)",
        y_desc: "sequence offset (MB)",
        dot: 1,
    };
    sequence_chart(&whole, &marks, &s.migrations, &view, color, true)?;
    let Some(first) = s.zoom.first() else {
        zoom.titled("no reordering to zoom into", ("sans-serif", 15))?;
        return Ok(());
    };
    let marks: Vec<&Mark> = s.zoom.iter().collect();
    let y0 = marks.iter().map(|m| m.offset).min().unwrap_or(0);
    let view = View {
        t0: first.t_ns,
        y0,
        t_unit: 1e6,
        y_unit: 1e3,
        x_desc: "ms (every segment)",
        y_desc: "sequence offset (kB)",
        dot: 2,
    };
    let last = s.zoom.last().map_or(first.t_ns, |m| m.t_ns);
    let migrations: Vec<u64> = s
        .migrations
        .iter()
        .copied()
        .filter(|&t| t >= first.t_ns && t <= last)
        .collect();
    sequence_chart(&zoom, &marks, &migrations, &view, color, false)
}

/// Axes of a sequence chart: origins and units.
struct View {
    t0: u64,
    y0: u64,
    t_unit: f64,
    y_unit: f64,
    x_desc: &'static str,
    y_desc: &'static str,
    /// Radius of an in-order segment's mark.
    dot: u32,
}

fn sequence_chart(
    area: &DrawingArea<SVGBackend, Shift>,
    marks: &[&Mark],
    migrations: &[u64],
    v: &View,
    color: ColorBy,
    legend: bool,
) -> Result<()> {
    let x = |t: u64| t.saturating_sub(v.t0) as f64 / v.t_unit;
    let y = |o: u64| o.saturating_sub(v.y0) as f64 / v.y_unit;
    let t_max = marks.iter().map(|m| x(m.t_ns)).fold(1e-3, f64::max) * 1.02;
    let y_max = marks.iter().map(|m| y(m.offset)).fold(1e-3, f64::max) * 1.02;
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc(v.x_desc)
        .y_desc(v.y_desc)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let line = RGBColor(160, 160, 160).mix(0.5);
    for &t in migrations {
        chart.draw_series(LineSeries::new([(x(t), 0.0), (x(t), y_max)], line))?;
    }
    let key = |m: &Mark| match color {
        ColorBy::Queue => m.queue,
        ColorBy::Cpu => m.cpu,
    };
    let mut keys: Vec<u32> = marks.iter().map(|m| key(m)).collect();
    keys.sort_unstable();
    keys.dedup();
    let name = match color {
        ColorBy::Queue => "queue",
        ColorBy::Cpu => "cpu",
    };
    for &k in &keys {
        let c = PALETTE[k as usize % PALETTE.len()];
        chart
            .draw_series(
                marks
                    .iter()
                    .filter(|m| m.class == Class::InOrder && key(m) == k)
                    .map(|m| Circle::new((x(m.t_ns), y(m.offset)), v.dot, c.filled())),
            )?
            .label(format!("{name} {k}"))
            .legend(move |(x, y)| Circle::new((x, y), 4, c.filled()));
    }
    let classes = [
        (Class::Reordered, "late original (reordered)", BLACK),
        (Class::Retransmission, "retransmission", RED),
        (Class::Duplicate, "duplicate", RGBColor(120, 120, 120)),
        (Class::Ambiguous, "ambiguous", RGBColor(200, 160, 0)),
    ];
    for (class, label, c) in classes {
        let of_class: Vec<&&Mark> = marks.iter().filter(|m| m.class == class).collect();
        if of_class.is_empty() {
            continue;
        }
        let series = chart.draw_series(of_class.iter().map(|m| {
            let fill = PALETTE[key(m) as usize % PALETTE.len()];
            EmptyElement::at((x(m.t_ns), y(m.offset)))
                + Circle::new((0, 0), 3, fill.filled())
                + Cross::new((0, 0), 4, c.stroke_width(1))
        }))?;
        series
            .label(format!("{label} ({})", of_class.len()))
            .legend(move |(x, y)| Cross::new((x, y), 4, c.stroke_width(1)));
    }
    if legend {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

fn histogram(area: &DrawingArea<SVGBackend, Shift>, title: &str, d: &Distribution) -> Result<()> {
    if d.buckets.is_empty() {
        area.titled(&format!("{title}: none"), ("sans-serif", 17))?;
        return Ok(());
    }
    let n = d.buckets.len();
    let top = d.buckets.iter().map(|b| b.1).max().unwrap_or(1);
    let caption = format!(
        "{title}: n {}, p50 {}, p90 {}, p99 {}, max {}",
        d.count, d.p50, d.p90, d.p99, d.max
    );
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d((0..n).into_segmented(), 0u64..top + top / 10 + 1)?;
    let labels: Vec<String> = d.buckets.iter().map(|b| format!("<={}", b.0)).collect();
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("count")
        .draw()?;
    chart.draw_series(
        Histogram::vertical(&chart)
            .style(PALETTE[0].filled())
            .margin(2)
            .data(d.buckets.iter().enumerate().map(|(i, b)| (i, b.1))),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(n: u32, ts_us: u64, queue: u32) -> Segment {
        Segment {
            ts_ns: ts_us * 1000,
            ifindex: 1,
            rx_queue: queue,
            cpu: queue % 2,
            flow: Flow {
                src: "10.0.0.1:40000".parse().unwrap(),
                dst: "10.0.0.2:5201".parse().unwrap(),
            },
            // Near the top of the sequence space: the offsets unwrap.
            seq: 0xffff_0000u32.wrapping_add(n * 1000),
            ack: 1,
            payload_len: 1000,
            flags: 0x10,
            window: 100,
            ip_id: None,
            timestamp: Some((1000 + n, 7)),
            sack: vec![],
            vlan: None,
            first_fragment: false,
            summarized_before: 0,
            summarized_end: None,
        }
    }

    /// 60,000 segments on queue 0; at 30,000 the flow moves to queue 1
    /// and segments 30,000..30,010 straggle in after 30,010..30,040: each
    /// with its class and whether it moved the flow, by construction.
    fn stream() -> Vec<(Segment, Class, bool)> {
        let in_order = |s| (s, Class::InOrder, false);
        let mut v: Vec<_> = (0..30_000)
            .map(|n| in_order(seg(n, u64::from(n) * 10, 0)))
            .collect();
        let t = 300_000;
        v.extend((30_010..30_040).map(|n| {
            (
                seg(n, t + u64::from(n - 30_010), 1),
                Class::InOrder,
                n == 30_010,
            )
        }));
        v.extend((30_000..30_010).map(|n| {
            (
                seg(n, t + 40 + u64::from(n - 30_000), 0),
                Class::Reordered,
                false,
            )
        }));
        v.extend((30_040..60_000).map(|n| in_order(seg(n, t + 100 + u64::from(n) * 10, 1))));
        v
    }

    /// What the plot keeps of a flow; drawing it, beside the engine's
    /// report, is `tests/plot.rs`'s.
    #[test]
    fn marks_every_late_segment_and_the_migration_and_thins_the_rest() {
        let mut plot = Plot::default();
        for (s, class, moved) in stream() {
            plot.segment(&s, class, moved);
        }
        let series = plot.flows.values().next().unwrap();
        assert_eq!(series.marked.len(), 10);
        assert_eq!(series.migrations.len(), 1);
        // 59,990 in order, thinned to at most MAX_IN_ORDER by a power of two.
        assert_eq!(series.stride, 4);
        assert!(series.in_order.len() <= MAX_IN_ORDER);
        assert_eq!(series.high, 59_999 * 1000);
        // The zoom: from ZOOM_BEFORE segments before the first late one.
        assert_eq!(series.zoom[ZOOM_BEFORE].class, Class::Reordered);
    }
}
