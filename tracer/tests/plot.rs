//! `analyze --plot`'s drawing beside the engine's report: a flow that
//! moves to another RX queue with ten segments left behind, classified by
//! the engine and drawn (no root; the lab's version is in `trace.rs`).

use tracer::{
    engine::{Engine, EngineConfig},
    plot::{ColorBy, Plot},
    source::{Flow, Segment},
};

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

/// 60,000 segments on queue 0; at 30,000 the flow moves to queue 1 and
/// segments 30,000..30,010 straggle in on queue 0 after 30,010..30,040.
#[test]
fn the_plot_draws_what_the_report_counts() {
    let mut stream: Vec<Segment> = (0..30_000).map(|n| seg(n, u64::from(n) * 10, 0)).collect();
    let t = 300_000;
    stream.extend((30_010..30_040).map(|n| seg(n, t + u64::from(n - 30_010), 1)));
    stream.extend((30_000..30_010).map(|n| seg(n, t + 40 + u64::from(n - 30_000), 0)));
    stream.extend((30_040..60_000).map(|n| seg(n, t + 100 + u64::from(n) * 10, 1)));

    let mut engine = Engine::new(EngineConfig::default());
    let mut plot = Plot::default();
    for s in &stream {
        if let Some(c) = engine.segment(s) {
            plot.segment(s, c.class, c.queue_migration);
        }
    }
    let snapshot = engine.snapshot();
    let report = &snapshot.flows[0];
    assert_eq!(report.reordering.reordered, 10);
    assert_eq!(report.reordering.queue_migrations, 1);

    let path = std::env::temp_dir().join(format!("tracer-plot-{}.svg", std::process::id()));
    plot.write(&snapshot, ColorBy::Queue, &path).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(svg.starts_with("<svg"));
    for text in [
        "10.0.0.1:40000 -&gt; 10.0.0.2:5201: nic-steering, 10 of 60000 data segments reordered",
        "1 queue migrations; every 4th in-order segment drawn",
        "late original (reordered) (10)",
        "queue 0",
        "queue 1",
        "extent (segments), all flows: n 10",
    ] {
        assert!(svg.contains(text), "{text}");
    }
}
