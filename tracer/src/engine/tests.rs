//! The engine on synthetic streams with known queue/CPU histories.

use super::*;
use crate::snapshot::Verdict;
use crate::source::{Segment, TcpProbe};

const MSS: u32 = 1000;

fn flow(port: u16) -> Flow {
    Flow {
        src: format!("10.0.0.1:{port}").parse().unwrap(),
        dst: "10.0.0.2:5201".parse().unwrap(),
    }
}

/// Segment number `n` (from 0) of `flow`, sent at TSval `n` (so its send
/// order is in the timestamp), arriving at `ts_us` on (queue, cpu).
fn seg(flow: Flow, isn: u32, n: u32, ts_us: u64, queue: u32, cpu: u32) -> Segment {
    Segment {
        ts_ns: ts_us * 1000,
        ifindex: 1,
        rx_queue: queue,
        cpu,
        flow,
        seq: isn.wrapping_add(1).wrapping_add(n * MSS),
        ack: 1,
        payload_len: MSS,
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

fn syn(flow: Flow, isn: u32, queue: u32, cpu: u32) -> Segment {
    Segment {
        seq: isn,
        payload_len: 0,
        flags: SYN,
        timestamp: Some((999, 0)),
        ..seg(flow, isn, 0, 0, queue, cpu)
    }
}

/// Feeds (segment number, queue, cpu) in arrival order, 1 µs apart.
fn feed(e: &mut Engine, f: Flow, isn: u32, order: &[(u32, u32, u32)]) -> Vec<Classified> {
    e.segment(&syn(f, isn, order[0].1, order[0].2));
    order
        .iter()
        .enumerate()
        .filter_map(|(i, &(n, q, c))| e.segment(&seg(f, isn, n, 10 + i as u64, q, c)))
        .collect()
}

fn one_flow(e: &Engine) -> FlowReport {
    let s = e.snapshot();
    assert_eq!(s.flows.len(), 1);
    s.flows[0].clone()
}

use crate::snapshot::FlowReport;

#[test]
fn clean_stream_has_no_reordering() {
    let mut e = Engine::new(EngineConfig::default());
    let order: Vec<_> = (0..100).map(|n| (n, 0, 0)).collect();
    let out = feed(&mut e, flow(1), 5000, &order);
    assert!(out.iter().all(|c| c.class == Class::InOrder));
    let r = one_flow(&e);
    assert_eq!(
        (r.data_segments, r.reordered, r.reordered_ratio),
        (100, 0, 0.0)
    );
    assert_eq!(r.verdict, Verdict::None);
    assert_eq!(r.densities.rd, vec![(0, 1.0)]);
    assert_eq!(r.densities.rbd, vec![(0, 1.0)]);
    assert_eq!(r.runs.share_in_order, 1.0);
    assert_eq!(r.rtt_us, Some(10)); // SYN at 0 µs, first ACK at 10 µs
}

/// The ATR signature: the flow moves from queue 0 / CPU 0 to queue 1 /
/// CPU 1 while segments 6..9 still wait on the old queue; segments sent
/// later overtake them.
#[test]
fn steering_migration_is_attributed_to_queue_and_cpu() {
    let mut e = Engine::new(EngineConfig::default());
    let mut order: Vec<_> = (0..6).map(|n| (n, 0, 0)).collect();
    order.extend([(10, 1, 1), (11, 1, 1)]);
    order.extend((6..10).map(|n| (n, 0, 0)));
    order.extend((12..30).map(|n| (n, 1, 1)));
    let out = feed(&mut e, flow(1), 7, &order);
    let reordered: Vec<_> = out
        .iter()
        .filter(|c| c.class == Class::Reordered)
        .map(|c| c.attribution.unwrap())
        .collect();
    assert_eq!(reordered, vec![Attribution::DifferentQueueAndCpu; 4]);
    let r = one_flow(&e);
    assert_eq!(r.reordered, 4);
    assert_eq!((r.queue_migrations, r.cpu_migrations), (1, 1));
    assert_eq!(r.reordered_after_migration, 4);
    assert_eq!(r.attribution.steered_share, 1.0);
    assert_eq!(
        r.attribution.queue_pairs,
        vec![crate::snapshot::Pair {
            from: 1,
            to: 0,
            count: 4
        }]
    );
    assert_eq!(r.old_queue_late_us.count, 4);
    // Extents 2, 3, 4, 5: each overtaken by segment 10 and what followed.
    assert_eq!((r.extent.min, r.extent.max), (2, 5));
    // Late by 2..5 µs after segment 10 arrived.
    assert_eq!((r.late_time_us.min, r.late_time_us.max), (2, 5));
    // Segment 6 is 2-reordered (after 10, 11); 7..9 follow it, not reordered
    // against their immediate predecessors.
    assert_eq!(r.n_reordering[1].count, 1);
    assert_eq!(r.n_reordering[2].count, 0);
    assert_eq!(r.verdict, Verdict::NicSteering, "{}", r.evidence);
    assert_eq!(e.snapshot().totals.verdicts[&Verdict::NicSteering], 1);
}

#[test]
fn reordering_on_one_queue_and_cpu_is_upstream() {
    let mut e = Engine::new(EngineConfig::default());
    // Swap neighbours every 10 segments, all on queue 2, CPU 1.
    let mut order = Vec::new();
    for block in 0..10 {
        let b = block * 10;
        order.extend((b..b + 10).map(|n| (n, 2, 1)));
        order.swap(b as usize + 4, b as usize + 5);
    }
    let out = feed(&mut e, flow(1), 0, &order);
    assert_eq!(
        out.iter().filter(|c| c.class == Class::Reordered).count(),
        10
    );
    let r = one_flow(&e);
    assert_eq!(r.attribution.same_queue_same_cpu, 10);
    assert_eq!((r.queue_migrations, r.cpu_migrations), (0, 0));
    assert_eq!(r.verdict, Verdict::Upstream);
    // Each swapped segment is 1-reordered with extent 1.
    assert_eq!(r.n_reordering[0].count, 10);
    assert_eq!(r.extent.max, 1);
    // Runs: 10 closed, mean length a/x = 90/10.
    assert_eq!(r.runs.runs, 10);
    assert_eq!(r.runs.mean_length, 9.0);
    // Gaps between successive discontinuities: 10 segments apart.
    assert_eq!((r.gap.min, r.gap.max, r.gap.count), (10, 10, 9));
}

#[test]
fn retransmission_is_not_reordering() {
    let mut e = Engine::new(EngineConfig::default());
    let f = flow(1);
    e.segment(&syn(f, 0, 0, 0));
    for n in [0, 1, 3, 4, 5] {
        e.segment(&seg(f, 0, n, 10 + u64::from(n), 0, 0));
    }
    // Segment 2 again, sent after segment 5 (newer TSval): a retransmission.
    let mut rtx = seg(f, 0, 2, 100, 0, 0);
    rtx.timestamp = Some((1000 + 6, 7));
    assert_eq!(e.segment(&rtx).unwrap().class, Class::Retransmission);
    // And a copy of segment 3: a duplicate.
    assert_eq!(
        e.segment(&seg(f, 0, 3, 101, 0, 0)).unwrap().class,
        Class::Duplicate
    );
    let r = one_flow(&e);
    assert_eq!((r.reordered, r.retransmissions, r.duplicates), (0, 1, 1));
    assert_eq!(r.verdict, Verdict::None);
    // RD leaves the retransmission out.
    assert_eq!(r.densities.rd.iter().map(|(_, s)| s).sum::<f64>(), 1.0);
}

#[test]
fn ambiguous_is_its_own_class() {
    let mut e = Engine::new(EngineConfig::default());
    let f = flow(1);
    // No SYN seen, no timestamps, no IP ID: nothing can tell.
    let bare = |n: u32, ts: u64| Segment {
        timestamp: None,
        ..seg(f, 0, n, ts, 0, 0)
    };
    e.segment(&bare(0, 1));
    e.segment(&bare(2, 2));
    assert_eq!(e.segment(&bare(1, 3)).unwrap().class, Class::Ambiguous);
    // Data from before the first segment traced.
    assert_eq!(
        e.segment(&Segment {
            seq: 1u32.wrapping_sub(MSS),
            ..bare(0, 4)
        })
        .unwrap()
        .class,
        Class::Ambiguous
    );
    let r = one_flow(&e);
    assert_eq!((r.reordered, r.ambiguous), (0, 2));
}

#[test]
fn wraparound_inside_the_engine() {
    let mut e = Engine::new(EngineConfig::default());
    let isn = u32::MAX - 2500; // the stream crosses 2^32 at segment 2
    let order = [
        (0, 0, 0),
        (1, 0, 0),
        (3, 0, 0),
        (2, 0, 0),
        (4, 0, 0),
        (5, 0, 0),
    ];
    let out = feed(&mut e, flow(1), isn, &order);
    let classes: Vec<_> = out.iter().map(|c| c.class).collect();
    use Class::*;
    assert_eq!(
        classes,
        vec![InOrder, InOrder, InOrder, Reordered, InOrder, InOrder]
    );
    assert_eq!(out[3].late.unwrap().extent, 1);
}

#[test]
fn local_retransmissions_classify_late_segments() {
    let mut e = Engine::new(EngineConfig::default());
    let f = flow(1);
    e.segment(&syn(f, 0, 0, 0));
    for n in [0, 2] {
        e.segment(&seg(f, 0, n, 10 + u64::from(n), 0, 0));
    }
    // This host resent segment 1 (same TSval would otherwise say original).
    e.observe(&Observation::Retransmit(crate::source::Retransmit {
        ts_ns: 20_000,
        cpu: 0,
        flow: f,
        seq: 1 + MSS,
        end_seq: 1 + 2 * MSS,
        flags: 0x10,
        err: 0,
    }));
    assert_eq!(
        e.segment(&seg(f, 0, 1, 30, 0, 0)).unwrap().class,
        Class::Retransmission
    );
    assert_eq!(one_flow(&e).local_retransmits, 1);
}

#[test]
fn tcp_layer_view_counts_its_own_order() {
    let mut e = Engine::new(EngineConfig::default());
    let f = flow(1);
    let probe_flags = |seq: u32, len: u32, rcv_nxt: u32, gso_segs: u16, tsval: u32, flags: u8| {
        Observation::TcpProbe(TcpProbe {
            ts_ns: 1,
            cpu: 0,
            ifindex: 1,
            flow: f,
            seq,
            end_seq: seq + len,
            ack: 0,
            payload_len: len,
            flags,
            srtt_us: 40,
            snd_cwnd: 10,
            snd_una: 0,
            snd_nxt: 0,
            rcv_nxt,
            gso_segs,
            tsval: Some(tsval),
            ts_recent: 100,
        })
    };
    let probe =
        |seq, len, rcv_nxt, gso_segs, tsval| probe_flags(seq, len, rcv_nxt, gso_segs, tsval, ACK);
    // A GRO run of three segments, a later run of two, a run behind it
    // (still above the hole at 3001), and a lone copy of its start.
    for (seq, len, gso_segs) in [
        (1, 3000, 3),
        (7001, 2000, 2),
        (4001, 3000, 3),
        (4001, 1000, 0),
    ] {
        let rcv_nxt = if seq == 1 { 1 } else { 3001 };
        e.observe(&probe(seq, len, rcv_nxt, gso_segs, 100));
    }
    // Two ticks older than ts_recent: PAWS drops it, and it counts for
    // nothing else; one tick older is still accepted (new data, above the
    // hole).
    e.observe(&probe(9001, 1000, 3001, 0, 98));
    e.observe(&probe(9001, 1000, 3001, 0, 99));
    // Without data: a late FIN is discarded by PAWS as well (the kernel
    // counts it in PAWSEstab), and so is a late pure ACK out of sequence
    // (seen on Linux 6.1: such ACKs above rcv_nxt were the PAWSEstab the
    // tracer missed); a late duplicate ACK in sequence is let through
    // (tcp_disordered_ack), an RST is not counted.
    e.observe(&probe_flags(10001, 0, 3001, 0, 97, ACK | FIN));
    e.observe(&probe_flags(10001, 0, 3001, 0, 97, ACK));
    e.observe(&probe_flags(3001, 0, 3001, 0, 97, ACK));
    e.observe(&probe_flags(10001, 0, 3001, 0, 97, RST | FIN));
    // A FIN that overtook the last data is queued out of order (it takes
    // a sequence number) and counted in rcv_ooopack like a segment; one
    // in sequence is not.
    e.observe(&probe_flags(10001, 0, 3001, 0, 100, ACK | FIN));
    e.observe(&probe_flags(3001, 0, 3001, 0, 100, ACK | FIN));
    let r = one_flow(&e);
    assert_eq!(r.tcp_layer.events, 6);
    assert_eq!(r.tcp_layer.paws_discarded, 3);
    assert_eq!(
        (
            r.tcp_layer.in_order,
            r.tcp_layer.late,
            r.tcp_layer.duplicates
        ),
        (3, 1, 1)
    );
    // What the kernel adds to rcv_ooopack for these: 2 + 3 + 1 + 1, and
    // the FIN.
    assert_eq!(r.tcp_layer.ofo_segments, 8);
    assert_eq!(r.tcp_layer.fins, 4);
    assert_eq!(r.rtt_us, Some(40)); // from the socket's srtt
}

/// tcp_probe runs only for an established socket: a copy of the FIN that
/// arrives after TCP took the first (a tail loss probe's, the original
/// late behind it) reaches the wire's count, never the TCP layer's.
#[test]
fn a_fin_after_the_one_tcp_took_is_counted_on_the_wire_only() {
    let mut e = Engine::new(EngineConfig::default());
    let f = flow(1);
    e.segment(&syn(f, 0, 0, 0));
    e.segment(&seg(f, 0, 0, 10, 0, 0));
    let fin = Segment {
        payload_len: 0,
        flags: ACK | FIN,
        ..seg(f, 0, 1, 20, 0, 0)
    };
    e.segment(&fin);
    e.observe(&Observation::TcpProbe(TcpProbe {
        ts_ns: 21_000,
        cpu: 0,
        ifindex: 1,
        flow: f,
        seq: fin.seq,
        end_seq: fin.seq + 1,
        ack: 1,
        payload_len: 0,
        flags: ACK | FIN,
        srtt_us: 40,
        snd_cwnd: 10,
        snd_una: 1,
        snd_nxt: 1,
        rcv_nxt: fin.seq,
        gso_segs: 0,
        tsval: Some(1001),
        ts_recent: 1000,
    }));
    e.segment(&Segment {
        ts_ns: 30_000,
        timestamp: Some((1000, 7)),
        ..fin
    });
    let r = one_flow(&e);
    assert_eq!((r.fins, r.tcp_layer.fins), (2, 1));
}

/// RFC 5236 RD by hand: displacement = arrival position - rank. Flow 1
/// (0 2 1 3 5 4 6 7): -1 twice, +1 twice, 0 four times; flow 2
/// (0 3 1 2 4 5 6 7): -2 once, +1 twice, 0 five times. The totals count
/// both flows' 16 segments, and RBD's the same way.
#[test]
fn the_totals_densities_sum_the_flows() {
    let mut e = Engine::new(EngineConfig::default());
    for (port, order) in [(1, [0, 2, 1, 3, 5, 4, 6, 7]), (2, [0, 3, 1, 2, 4, 5, 6, 7])] {
        let order: Vec<_> = order.iter().map(|&n| (n, 0, 0)).collect();
        feed(&mut e, flow(port), 100, &order);
    }
    let s = e.snapshot();
    let rd = |port: u16| {
        let f = s.flows.iter().find(|f| f.key.flow == flow(port)).unwrap();
        f.densities.rd.clone()
    };
    assert_eq!(rd(1), vec![(-1, 0.25), (0, 0.5), (1, 0.25)]);
    assert_eq!(rd(2), vec![(-2, 0.125), (0, 0.625), (1, 0.25)]);
    let totals = &s.totals.reordering.densities;
    assert_eq!(
        totals.rd,
        vec![
            (-2, 1.0 / 16.0),
            (-1, 2.0 / 16.0),
            (0, 9.0 / 16.0),
            (1, 4.0 / 16.0)
        ]
    );
    // Each flow's 8 segments: the totals' RBD is the flows' mean.
    let mut rbd = BTreeMap::new();
    for f in &s.flows {
        for &(k, share) in &f.densities.rbd {
            *rbd.entry(k).or_insert(0.0) += share / 2.0;
        }
    }
    assert_eq!(totals.rbd, rbd.into_iter().collect::<Vec<_>>());
    assert!(totals.rbd.len() > 1, "both flows held segments in a buffer");
}

#[test]
fn flow_table_is_bounded_and_totals_survive_eviction() {
    let mut e = Engine::new(EngineConfig {
        max_flows: 3,
        ..Default::default()
    });
    for port in 1..=5 {
        let order: Vec<_> = (0..10).map(|n| (n, 0, 0)).collect();
        feed(&mut e, flow(port), 100, &order);
    }
    let s = e.snapshot();
    assert_eq!(s.tracked_flows, 3);
    assert_eq!(s.evicted_flows, 2);
    assert_eq!(s.totals.reordering.data_segments, 50);
    assert_eq!(s.totals.segments, 55);
    assert_eq!(s.totals.seq_advance_bytes, 50 * u64::from(MSS));
    // The least recently used were evicted.
    let ports: Vec<_> = s.flows.iter().map(|f| f.src.clone()).collect();
    assert!(!ports.contains(&"10.0.0.1:1".to_string()));
}

#[test]
fn idle_flows_expire_and_their_counts_stay_in_the_totals() {
    let mut e = Engine::new(EngineConfig {
        idle_expiry_ns: Some(1_500_000_000),
        ..Default::default()
    });
    // Segment n of `port`'s flow at `secs` seconds.
    let at = |port, n, secs: u64| {
        Observation::Segment(Segment {
            ts_ns: secs * 1_000_000_000 + u64::from(n),
            ..seg(flow(port), 100, n, 0, 0, 0)
        })
    };
    // Flow 1 at 0 s only; flow 2 once a second to 3 s.
    e.observe(&at(1, 0, 0));
    e.observe(&at(1, 1, 0));
    for n in 0..4 {
        e.observe(&at(2, n, u64::from(n)));
    }
    let s = e.snapshot();
    // Flow 1 went at 2 s (unseen for more than 1.5 s); flow 2, seen every
    // second, stays.
    assert_eq!(
        (s.tracked_flows, s.evicted_flows, s.memory.expired_idle),
        (1, 1, 1)
    );
    assert_eq!(s.flows[0].src, "10.0.0.1:2");
    assert_eq!(s.totals.segments, 6);
    assert_eq!(s.totals.reordering.data_segments, 6);
    // Without the expiry nothing goes.
    let mut e = Engine::new(EngineConfig::default());
    for (port, n, secs) in [(1, 0, 0), (2, 0, 0), (2, 1, 100)] {
        e.observe(&at(port, n, secs));
    }
    assert_eq!(e.snapshot().tracked_flows, 2);
}

#[test]
fn evicted_flows_replays_stay_in_the_totals() {
    let run = |max_flows, replay_retired| {
        let mut e = Engine::new(EngineConfig {
            max_flows,
            replay_retired,
            ..Default::default()
        });
        for port in 1..=5 {
            // Segment 1 arrives after four above it: a classic sender
            // retransmits it.
            let mut order = vec![(0, 0, 0)];
            order.extend((2..6).map(|n| (n, 1, 1)));
            order.extend((1..2).chain(6..12).map(|n| (n, 0, 0)));
            feed(&mut e, flow(port), 100, &order);
        }
        let mut s = e.snapshot();
        e.replay(&mut s);
        let classic = |r: &Replay| {
            let p = r.policies.iter().find(|p| p.name == "classic").unwrap();
            (p.recovery_episodes, p.spurious_retransmissions)
        };
        let flows: Vec<_> = s
            .flows
            .iter()
            .map(|f| classic(f.replay.as_ref().unwrap()))
            .collect();
        (s.evicted_flows, classic(&s.totals.replay), flows)
    };
    let (evicted, all, flows) = run(10, true);
    assert_eq!((evicted, flows.len()), (0, 5));
    assert!(all.0 >= 5 && all.1 >= 5, "{all:?}");
    // Two of the five evicted: the totals still hold their replays.
    let (evicted, bounded, flows) = run(3, true);
    assert_eq!((evicted, flows.len()), (2, 3));
    assert_eq!(bounded, all);
    // Unless retired flows go unreplayed (`watch`): the three tracked
    // flows' replays alone, each as it was.
    let (evicted, tracked, flows) = run(3, false);
    assert_eq!((evicted, flows.len()), (2, 3));
    let one = flows[0];
    assert_eq!(tracked, (one.0 * 3, one.1 * 3));
    // The live view replays nothing, evicted or not.
    let mut e = Engine::new(EngineConfig {
        max_flows: 1,
        ..Default::default()
    });
    feed(&mut e, flow(1), 100, &[(0, 0, 0), (1, 0, 0)]);
    feed(&mut e, flow(2), 100, &[(0, 0, 0), (1, 0, 0)]);
    assert!(e.live_snapshot(10, None).totals.replay.policies.is_empty());
}

#[test]
fn snapshots_are_deterministic_and_carry_the_documented_json() {
    let run = || {
        let mut e = Engine::new(EngineConfig::default());
        let mut order: Vec<_> = (0..6).map(|n| (n, 0, 0)).collect();
        order.extend([(8, 1, 1), (6, 0, 0), (7, 0, 0)]);
        order.extend((9..20).map(|n| (n, 1, 1)));
        feed(&mut e, flow(9), 42, &order);
        serde_json::to_value(e.snapshot()).unwrap()
    };
    let a = run();
    assert_eq!(a, run());
    for key in [
        "data_segments",
        "reordered",
        "retransmissions",
        "duplicates",
        "ambiguous",
        "dropped_events",
    ] {
        assert!(a["totals"].get(key).is_some(), "totals.{key}");
    }
    let f = &a["flows"][0];
    for key in [
        "src",
        "dst",
        "data_segments",
        "reordered",
        "reordered_ratio",
        "n_reordering",
        "extent",
        "late_time_us",
        "rx_queues",
        "cpus",
        "paths",
        "queue_migrations",
        "attribution",
        "verdict",
    ] {
        assert!(f.get(key).is_some(), "flows[].{key}");
    }
    assert_eq!(f["verdict"], "nic-steering");
    assert_eq!(f["reordered"], 2);
}

#[test]
fn distributions_keep_large_values() {
    let mut h = Hist::default();
    for v in [1, 1448, 130_320, 2_000_000] {
        h.record(v);
    }
    let d = super::view::distribution(&h);
    // Count, extremes and mean exact; percentiles within 10%.
    assert_eq!((d.count, d.min, d.max), (4, 1, 2_000_000));
    assert_eq!(d.mean, (1.0 + 1448.0 + 130_320.0 + 2_000_000.0) / 4.0);
    assert!(d.p50.abs_diff(1448) <= 145, "{d:?}");
}

#[test]
fn a_copy_of_what_the_receiving_tcp_missed_is_its_retransmission() {
    let mut e = Engine::new(EngineConfig::default());
    let f = flow(1);
    let isn = 0;
    let probe = |n: u32| {
        Observation::TcpProbe(TcpProbe {
            ts_ns: (20 + u64::from(n)) * 1000,
            cpu: 0,
            ifindex: 1,
            flow: f,
            seq: 1 + n * MSS,
            end_seq: 1 + (n + 1) * MSS,
            ack: 0,
            payload_len: MSS,
            flags: 0x10,
            srtt_us: 40,
            snd_cwnd: 10,
            snd_una: 0,
            snd_nxt: 0,
            rcv_nxt: 1 + n.min(2) * MSS,
            gso_segs: 1,
            tsval: Some(1000),
            ts_recent: 1000,
        })
    };
    e.segment(&syn(f, isn, 0, 0));
    // Segments 0-4 pass XDP in order, all in one timestamp tick; the
    // receiving TCP never takes segment 2 (dropped in between).
    for n in 0..5 {
        e.segment(&Segment {
            ip_id: Some(n as u16),
            timestamp: Some((1000, 7)),
            ..seg(f, isn, n, 10 + u64::from(n), 0, 0)
        });
        if n != 2 {
            e.observe(&probe(n));
        }
    }
    // The sender's retransmission of 2, in the same tick: a duplicate on
    // the wire, the first copy at the TCP layer.
    let again = Segment {
        ip_id: Some(9),
        timestamp: Some((1000, 7)),
        ..seg(f, isn, 2, 30, 0, 0)
    };
    assert_eq!(e.segment(&again).map(|c| c.class), Some(Class::Duplicate));
    e.observe(&probe(2));
    let w = e.flow(f, 0).wire.as_ref().unwrap();
    let last = *w.log.acks.as_deref().unwrap().tcp.last().unwrap();
    assert_eq!(last.end - last.start, u64::from(MSS));
    assert_eq!(
        last.retransmitted_until, last.end,
        "the whole copy is resent"
    );
}

#[test]
fn the_live_snapshot_keeps_the_most_reordered_flows_and_the_selected_one() {
    let mut e = Engine::new(EngineConfig::default());
    // Flow k has k segments late by one (each pair swapped), k = 0..5.
    for k in 0..5u16 {
        let mut order: Vec<(u32, u32, u32)> = Vec::new();
        for i in 0..20u32 {
            let (a, b) = (2 * i, 2 * i + 1);
            if i < u32::from(k) {
                order.extend([(b, 0, 0), (a, 0, 0)]);
            } else {
                order.extend([(a, 0, 0), (b, 0, 0)]);
            }
        }
        feed(&mut e, flow(100 + k), 1000, &order);
    }
    let quiet = e
        .snapshot()
        .flows
        .iter()
        .find(|f| f.reordered == 0)
        .unwrap()
        .key;
    let s = e.live_snapshot(2, Some(&quiet));
    let reordered: Vec<u64> = s.flows.iter().map(|f| f.reordered).collect();
    assert_eq!(reordered, [4, 3, 0]);
    assert_eq!(s.flows[2].key, quiet);
    // The totals and counts are over every flow, and nothing is replayed.
    assert_eq!(s.tracked_flows, 5);
    assert_eq!(s.totals.reordering.reordered, 4 + 3 + 2 + 1);
    assert!(s.flows.iter().all(|f| f.replay.is_none()));
    assert_eq!(e.live_snapshot(10, None).flows.len(), 5);
}

/// Summary mode: the kernel counts in-order segments without emitting
/// them, and the next emitted segment carries the count. The flow's last
/// ones are carried by its FIN, which has no data: they count, and the
/// flow's volume ends where the FIN begins.
#[test]
fn a_fin_carries_the_count_of_the_last_segments_kept_in_the_kernel() {
    let mut e = Engine::new(EngineConfig::default());
    let (f, isn) = (flow(1), 5000);
    e.segment(&syn(f, isn, 0, 0));
    // Segments 0 and 8 emitted (sampled); 1-7 and 9-11 only counted.
    e.segment(&seg(f, isn, 0, 10, 0, 0));
    e.segment(&Segment {
        summarized_before: 7,
        ..seg(f, isn, 8, 20, 0, 0)
    });
    let fin = Segment {
        payload_len: 0,
        flags: FIN | ACK,
        summarized_before: 3,
        ..seg(f, isn, 12, 30, 0, 0)
    };
    assert!(e.segment(&fin).is_none());
    let r = one_flow(&e);
    assert_eq!((r.data_segments, r.reordered), (12, 0));
    assert_eq!(r.seq_advance_bytes, 12 * u64::from(MSS));
}

/// Summary mode: the segments the kernel only counted filled the sequence
/// space up to where it says they ended, so the emitted ones after them
/// open no hole; an overtaker (the kernel's jump) opens the real one, and
/// the late segment that fills it is late by what arrived since the jump:
/// the same as every segment emitted.
#[test]
fn segments_counted_in_the_kernel_fill_the_space_they_carried() {
    let summarized = |n: u32, by: u32, ts_us: u64, count: u32| Segment {
        summarized_before: count,
        summarized_end: Some(seg(flow(1), 0, by, 0, 0, 0).seq),
        ..seg(flow(1), 0, n, ts_us, 0, 0)
    };
    let run = |stream: &[Segment]| {
        let mut e = Engine::new(EngineConfig::default());
        e.segment(&syn(flow(1), 0, 0, 0));
        for s in stream {
            e.segment(s);
        }
        one_flow(&e)
    };
    // 0..=20 in order but 11 (behind 12), as every segment arriving and as
    // summary mode emits them: 0 (the first), 8 (sampled), 12 (a jump),
    // 11 (late), 20 (sampled).
    let every: Vec<Segment> = (0..=20u32)
        .map(|n| match n {
            11 => 12,
            12 => 11,
            n => n,
        })
        .enumerate()
        .map(|(i, n)| seg(flow(1), 0, n, 10 + i as u64, 0, 0))
        .collect();
    let emitted = [
        seg(flow(1), 0, 0, 10, 0, 0),
        summarized(8, 8, 18, 7),
        summarized(12, 11, 21, 2),
        seg(flow(1), 0, 11, 22, 0, 0),
        summarized(20, 20, 30, 7),
    ];
    let (all, summary) = (run(&every), run(&emitted));
    assert_eq!((all.reordered, all.above_hole), (1, 1));
    assert_eq!(
        (summary.data_segments, summary.reordered, summary.above_hole),
        (21, 1, 1)
    );
    assert_eq!(summary.extent.max, all.extent.max);
    assert_eq!(summary.byte_offset.max, all.byte_offset.max);
    assert_eq!(summary.seq_advance_bytes, all.seq_advance_bytes);
}

/// When two CPUs raced on the flow's state in the kernel (or the flow lost
/// its slot), the FIN can come without the count of the last segments
/// kept there: the flow's volume still ends where the FIN begins.
#[test]
fn a_fin_without_the_count_still_ends_the_flow_where_it_begins() {
    let mut e = Engine::new(EngineConfig::default());
    let (f, isn) = (flow(1), 5000);
    e.segment(&syn(f, isn, 0, 0));
    e.segment(&seg(f, isn, 0, 10, 0, 0));
    // Segments 1-11 counted in the kernel; the count lost in a race.
    let fin = Segment {
        payload_len: 0,
        flags: FIN | ACK,
        summarized_before: 0,
        summarized_end: None,
        ..seg(f, isn, 12, 30, 0, 0)
    };
    assert!(e.segment(&fin).is_none());
    assert_eq!(one_flow(&e).seq_advance_bytes, 12 * u64::from(MSS));
}

/// A short in-order connection on `f`: its SYN at `t_us`, then `n`
/// segments 1 µs apart, then its FIN.
fn connection(e: &mut Engine, f: Flow, isn: u32, n: u32, t_us: u64) {
    e.segment(&Segment {
        ts_ns: t_us * 1000,
        ..syn(f, isn, 0, 0)
    });
    for k in 0..n {
        e.segment(&seg(f, isn, k, t_us + 10 + u64::from(k), 0, 0));
    }
    e.segment(&Segment {
        payload_len: 0,
        flags: FIN | ACK,
        ..seg(f, isn, n, t_us + 20 + u64::from(n), 0, 0)
    });
}

/// An edge host's clients reuse their ports within seconds: 2,000 in-order
/// connections over 500 client ports are 2,000 connections, each with its
/// own sequence space (random ISNs, as every OS picks them, or rising
/// ones, as RFC 6528 and Linux do for one 4-tuple), none of them reordered,
/// retransmitted, ambiguous or above a hole.
#[test]
fn connections_reusing_a_4_tuple_are_each_their_own() {
    for random in [true, false] {
        let mut e = Engine::new(EngineConfig::default());
        let mut rng = 0x2545_f491_u64;
        let mut isns = [0u32; 500];
        for c in 0..2000u32 {
            let port = (c % 500) as usize;
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            isns[port] = if random {
                rng as u32
            } else {
                isns[port].wrapping_add(1 << 20)
            };
            connection(&mut e, flow(port as u16), isns[port], 5, u64::from(c) * 100);
        }
        let s = e.snapshot();
        let r = &s.totals.reordering;
        assert_eq!(s.connections(), 2000, "random ISNs: {random}");
        assert_eq!(s.connections() - s.reused_tuples, 500);
        assert_eq!((r.data_segments, r.in_order), (10_000, 10_000));
        assert_eq!(
            (r.retransmissions, r.ambiguous, r.above_hole, r.duplicates),
            (0, 0, 0, 0)
        );
        assert_eq!(s.totals.stale_segments, 0);
        assert_eq!(s.totals.seq_advance_bytes, 10_000 * u64::from(MSS));
        assert_eq!(s.flows.len(), 2000);
        assert!(s
            .flows
            .iter()
            .all(|f| f.seq_advance_bytes == 5 * u64::from(MSS)));
        // Each 4-tuple's connections are numbered 1 to 4 in turn.
        let mut nth: Vec<u32> = s
            .flows
            .iter()
            .filter(|f| f.key.flow == flow(7))
            .map(|f| f.earlier_on_tuple)
            .collect();
        nth.sort();
        assert_eq!(nth, [0, 1, 2, 3]);
    }
}

/// A late segment of the old connection after the new one's SYN (a
/// retransmission the path held back) is stale: counted as such, never as
/// the new connection's reordering, retransmission or ambiguity; and it
/// does not end the new one.
#[test]
fn the_old_connections_late_segments_are_stale() {
    let mut e = Engine::new(EngineConfig::default());
    let f = flow(1);
    connection(&mut e, f, 1000, 5, 0);
    // The new connection, its sender's timestamp clock on since.
    let new = |k: u32, t: u64| Segment {
        timestamp: Some((2001 + k, 7)),
        ..seg(f, 3_000_000_000, k, t, 0, 0)
    };
    e.segment(&Segment {
        ts_ns: 100_000,
        timestamp: Some((2000, 0)),
        ..syn(f, 3_000_000_000, 0, 0)
    });
    e.segment(&new(0, 110));
    // The old connection's third segment, and its FIN, again.
    assert!(e.segment(&seg(f, 1000, 2, 111, 0, 0)).is_none());
    e.segment(&Segment {
        payload_len: 0,
        flags: FIN | ACK,
        ..seg(f, 1000, 5, 112, 0, 0)
    });
    for k in 1..4 {
        e.segment(&new(k, 112 + u64::from(k)));
    }
    let s = e.snapshot();
    assert_eq!(s.connections(), 2);
    assert_eq!(s.totals.stale_segments, 2);
    let new = s.flows.iter().find(|f| f.earlier_on_tuple == 1).unwrap();
    assert_eq!(new.stale_segments, 2);
    assert_eq!((new.data_segments, new.in_order), (4, 4));
    assert_eq!(
        (new.retransmissions, new.ambiguous, new.above_hole),
        (0, 0, 0)
    );
    let old = s.flows.iter().find(|f| f.earlier_on_tuple == 0).unwrap();
    assert_eq!((old.data_segments, old.in_order), (5, 5));
}

/// A SYN sent again (same ISN) is the same connection; data far past
/// where a connection's FIN ended it, with no SYN seen, is the next one.
#[test]
fn a_repeated_syn_continues_and_data_after_a_fin_begins_anew() {
    let mut e = Engine::new(EngineConfig::default());
    let f = flow(1);
    e.segment(&syn(f, 1000, 0, 0));
    e.segment(&Segment {
        ts_ns: 5_000,
        ..syn(f, 1000, 0, 0)
    });
    e.segment(&seg(f, 1000, 0, 10, 0, 0));
    e.segment(&seg(f, 1000, 1, 11, 0, 0));
    e.segment(&Segment {
        payload_len: 0,
        flags: FIN | ACK,
        ..seg(f, 1000, 2, 12, 0, 0)
    });
    // A copy of its data, then data the FIN cannot have sent.
    e.segment(&seg(f, 1000, 1, 13, 0, 0));
    for k in 0..3 {
        e.segment(&seg(f, 900_000_000, k, 20 + u64::from(k), 0, 0));
    }
    let s = e.snapshot();
    assert_eq!(s.connections(), 2);
    let first = s.flows.iter().find(|f| f.earlier_on_tuple == 0).unwrap();
    assert_eq!((first.data_segments, first.in_order), (3, 2));
    let next = s.flows.iter().find(|f| f.earlier_on_tuple == 1).unwrap();
    assert_eq!((next.data_segments, next.in_order), (3, 3));
    assert_eq!(next.flow(), format!("{} #2", first.flow()));
}

/// Summary mode: the data segments the kernel counted before a new SYN
/// on the 4-tuple were the old connection's.
#[test]
fn the_count_a_syn_carries_is_the_old_connections() {
    let mut e = Engine::new(EngineConfig::default());
    let f = flow(1);
    e.segment(&syn(f, 1000, 0, 0));
    e.segment(&seg(f, 1000, 0, 10, 0, 0));
    // Segments 1-4 counted in the kernel; the next connection's SYN carries
    // the count (the old FIN's was lost in a race).
    e.segment(&Segment {
        ts_ns: 100_000,
        summarized_before: 4,
        ..syn(f, 7_000_000, 0, 0)
    });
    e.segment(&seg(f, 7_000_000, 0, 110, 0, 0));
    let s = e.snapshot();
    let old = s.flows.iter().find(|f| f.earlier_on_tuple == 0).unwrap();
    let new = s.flows.iter().find(|f| f.earlier_on_tuple == 1).unwrap();
    assert_eq!((old.data_segments, new.data_segments), (5, 1));
}

/// An ended connection stays tracked under its own key: its replay, and
/// the live view's selection of it, reach it, not the 4-tuple's current
/// one.
#[test]
fn an_ended_connection_is_reached_by_its_own_key() {
    let mut e = Engine::new(EngineConfig::default());
    let f = flow(1);
    connection(&mut e, f, 1000, 40, 0);
    connection(&mut e, f, 9_000_000, 2, 1000);
    let s = e.snapshot();
    let old = s.flows.iter().find(|f| f.data_segments == 40).unwrap();
    let replay = e.replay_of(&old.key).expect("the old connection's replay");
    let a = replay.assumptions.unwrap();
    assert!((a.duration_s - 39e-6).abs() < 1e-9, "{}", a.duration_s);
    let kept = e.live_snapshot(0, Some(&old.key));
    assert_eq!(kept.flows.len(), 1);
    assert_eq!(kept.flows[0].data_segments, 40);
}

/// The replay a flow at a time (as the front end runs it on every core)
/// and summed is the whole replay; skipped, it leaves none at all (a report
/// with some flows replayed and the totals of a few would mislead), and
/// says so.
#[test]
fn a_replay_flow_by_flow_is_the_whole_and_a_skipped_one_leaves_none() {
    let mut e = Engine::new(EngineConfig::default());
    for port in 1..=4 {
        let mut order: Vec<(u32, u32, u32)> = (0..40).map(|n| (n, 0, 0)).collect();
        order.swap(10, 14);
        feed(&mut e, flow(port), 1000 * u32::from(port), &order);
    }
    let mut whole = e.snapshot();
    e.replay(&mut whole);
    let mut by_flow = e.snapshot();
    for f in by_flow.flows.iter_mut().rev() {
        f.replay = e.replay_of(&f.key);
    }
    e.total_replays(&mut by_flow);
    assert!(whole.flows.iter().all(|f| f.replay.is_some()));
    assert_eq!(
        serde_json::to_value(&by_flow).unwrap(),
        serde_json::to_value(&whole).unwrap()
    );
    assert!(!whole.replay_skipped);
    whole.skip_replay();
    assert!(whole.flows.iter().all(|f| f.replay.is_none()));
    assert!(whole.totals.replay.policies.is_empty());
    let json = serde_json::to_value(&whole).unwrap();
    assert_eq!(json["replay_skipped"], true);
}

/// A port reused a millisecond after a 64 KiB upload: the next ISN (Linux's
/// clock gains 15.6 M a second) lies inside the old connection's sequence
/// numbers. What the old connection sends after the new SYN (its RST, a
/// copy of its data with an older TSval) is stale; the new connection's
/// data, in the same numbers, is the new one's, in order.
#[test]
fn overlapping_sequence_numbers_are_told_apart() {
    let mut e = Engine::new(EngineConfig::default());
    let f = flow(1);
    // The old connection: 40 segments from ISN 1000, TSvals 1000..1039.
    connection(&mut e, f, 1000, 40, 0);
    // The new one starts 20 segments into the old one's numbers, its SYN
    // at TSval 2000.
    let isn = 1000 + 20 * MSS;
    let new = |n: u32, t: u64| Segment {
        timestamp: Some((2001 + n, 7)),
        ..seg(f, isn, n, t, 0, 0)
    };
    e.segment(&Segment {
        ts_ns: 200_000,
        timestamp: Some((2000, 0)),
        ..syn(f, isn, 0, 0)
    });
    // The old connection's RST (no timestamps), one past its FIN.
    e.segment(&Segment {
        seq: 1000 + 1 + 40 * MSS + 1,
        payload_len: 0,
        flags: RST,
        timestamp: None,
        ..seg(f, 1000, 0, 201, 0, 0)
    });
    for n in 0..10 {
        e.segment(&new(n, 210 + u64::from(n)));
    }
    // A copy of the old connection's 25th segment, inside the new one's
    // numbers, with its old TSval.
    assert!(e.segment(&seg(f, 1000, 25, 230, 0, 0)).is_none());
    for n in 10..30 {
        e.segment(&new(n, 230 + u64::from(n)));
    }
    let s = e.snapshot();
    assert_eq!(s.connections(), 2);
    let new = s.flows.iter().find(|f| f.earlier_on_tuple == 1).unwrap();
    assert_eq!(new.stale_segments, 2);
    assert_eq!((new.data_segments, new.in_order), (30, 30));
    assert_eq!(new.seq_advance_bytes, 30 * u64::from(MSS));
}
