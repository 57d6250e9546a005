//! An edge host's traffic, which nobody here wrote (root; in CI): Debian's
//! nginx receiving 64 KiB uploads from wrk and curl, keep-alive and
//! `Connection: close`, the client's ports narrowed to a few so that every
//! 4-tuple carries connection after connection within seconds. `tracer
//! record` with its default flags, stopped by SIGINT as a user stops it.
//!
//! Oracles, each exact: nginx's access log (each request's client port,
//! its connection's serial number, the bytes it read); the client
//! kernel's own retransmissions (`TcpRetransSegs` in its namespace); and,
//! through the ATR edge, the edge's record of every segment it made late.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    process::Child,
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracer::lab::{
    self,
    http::{self, Connections, Load, Nginx, Request},
    in_netns, truth, Lab, LabSpec, WanSpec,
};

mod common;
use common::{edge_truth::segment_by_segment, root_or_skip, said, signal, tracer_on_server, u};

/// The client's ports: eight, for up to four connections at once.
const PORTS: (u16, u16) = (40_000, 40_007);
const BODY: usize = 64 << 10;
/// Late segments the ATR edge must make.
const LATE: u64 = 50;

/// wrk's load: `connections` over two threads, 64 KiB POSTs, each on its
/// own connection.
fn load(connections: u32, duration: Duration) -> Load {
    Load {
        threads: 2,
        connections,
        duration,
        body: BODY,
        how: Connections::Close,
    }
}

/// `tracer record --json ARGS` on the lab's server, once it traces.
fn tracing(lab: &Lab, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut all = vec!["--json"];
    all.extend(args);
    let (child, rx) = tracer_on_server(lab, "record", &all);
    said(&rx, "tracing TCP received on");
    (child, rx)
}

/// SIGINT, a second after the traffic: the report, and how long it took to
/// come.
fn report(child: Child) -> (Value, Duration) {
    std::thread::sleep(Duration::from_secs(1));
    let t = Instant::now();
    signal(&child, libc::SIGINT);
    let done = child.wait_with_output().unwrap();
    let took = t.elapsed();
    assert_eq!(done.status.code(), Some(0), "the tracer's exit");
    let r = serde_json::from_slice(&done.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {}",
            String::from_utf8_lossy(&done.stdout)
        )
    });
    (r, took)
}

/// The client's retransmitted segments so far (its namespace's
/// `TcpRetransSegs`).
fn client_retransmissions(lab: &Lab) -> u64 {
    in_netns(&lab.topo.client_ns, || truth::nstat(&["TcpRetransSegs"]))
        .unwrap()
        .get("TcpRetransSegs")
        .copied()
        .unwrap_or(0)
}

/// The report's connections to nginx.
fn to_nginx(r: &Value, nginx: SocketAddr) -> Vec<&Value> {
    let dst = nginx.to_string();
    r["flows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["dst"] == dst.as_str())
        .collect()
}

/// Every connection nginx had is one the tracer reported, and every byte
/// nginx read from each client port is in that port's connections, and in
/// the totals. (wrk
/// also opens a connection to try the server before it starts, and sends
/// nothing on it: nginx logs no request, the tracer a connection without
/// data.)
fn every_connection_and_byte(r: &Value, nginx: SocketAddr, requests: &[Request]) -> usize {
    let ours = to_nginx(r, nginx);
    let connections: BTreeSet<u64> = requests.iter().map(|q| q.connection).collect();
    // 499: wrk's run ended before nginx answered (the request was read).
    assert!(requests.iter().all(|q| q.status == 204 || q.status == 499));
    // Nothing evicted: the report lists every connection.
    assert_eq!(u(&r["evicted_flows"]), 0);
    let with_data = ours.iter().filter(|f| u(&f["data_segments"]) > 0).count();
    assert_eq!(
        with_data,
        connections.len(),
        "connections with data: the tracer's against nginx's"
    );
    let mut seen: BTreeMap<SocketAddr, u64> = BTreeMap::new();
    for f in &ours {
        let src = f["src"].as_str().unwrap().parse().unwrap();
        *seen.entry(src).or_default() += u(&f["seq_advance_bytes"]);
    }
    assert_eq!(
        seen,
        http::bytes_by_client(requests),
        "bytes per client port"
    );
    let read: u64 = requests.iter().map(|q| q.bytes).sum();
    assert_eq!(u(&r["totals"]["seq_advance_bytes"]), read);
    // Each 4-tuple carried its connections in turn: all but the first on
    // each were begun on a 4-tuple used before.
    let ports = seen.len() as u64;
    assert!(ports <= u64::from(PORTS.1 - PORTS.0 + 1));
    assert_eq!(u(&r["reused_tuples"]), ours.len() as u64 - ports);
    ours.len()
}

/// wrk and curl, keep-alive and `Connection: close`, on eight client
/// ports, through a plain path: every connection nginx had and every
/// byte it read is in the report, and nothing out of order but what the
/// client itself sent again.
#[test]
fn nginx_uploads_from_wrk_and_curl_on_reused_ports_are_each_connection_and_byte() {
    if !root_or_skip("nginx_uploads_from_wrk_and_curl_on_reused_ports_are_each_connection_and_byte")
    {
        return;
    }
    let mut lab = Lab::create(&LabSpec::new(lab::Mode::Off, 4)).expect("lab");
    http::reuse_ports(&lab.topo.client_ns, PORTS.0, PORTS.1).unwrap();
    let nginx = Nginx::start(&lab.topo).unwrap();
    let url = nginx.url();
    let (child, _rx) = tracing(&lab, &[]);
    let resent_before = client_retransmissions(&lab);
    let (topo, client) = (&lab.topo, &lab.topo.client_ns);
    let close = http::wrk(topo, client, &url, load(4, Duration::from_secs(4))).unwrap();
    let kept = http::wrk(
        topo,
        client,
        &url,
        Load {
            how: Connections::KeepAlive,
            ..load(2, Duration::from_secs(2))
        },
    )
    .unwrap();
    http::curl(topo, &url, 20, 2, BODY, Connections::Close).unwrap();
    http::curl(topo, &url, 20, 3, BODY, Connections::KeepAlive).unwrap();
    let resent = client_retransmissions(&lab) - resent_before;
    let (r, took) = report(child);
    let (requests, addr) = (nginx.requests().unwrap(), nginx.addr);
    drop(nginx);
    let edge = lab.finish().unwrap();
    drop(lab);
    assert!(lab::lab_namespaces().is_empty());
    let t = &r["totals"];
    eprintln!(
        "wrk: {close:?} closing, {kept:?} keep-alive; nginx: {} requests; tracer: {} connections, {} on a reused 4-tuple, {} stale segments; client retransmissions {resent}; report {:.2} s after SIGINT",
        requests.len(),
        u(&r["tracked_flows"]),
        u(&r["reused_tuples"]),
        u(&t["stale_segments"]),
        took.as_secs_f64()
    );
    // At least a thousand connections on the eight ports (wrk alone made
    // thousands here in 4 s).
    let connections = every_connection_and_byte(&r, addr, &requests);
    assert!(connections >= 1000, "{connections} connections");
    assert_eq!(edge.edge.truth.late(), 0, "a plain path");
    // Nothing out of order but the client's own retransmissions. (Its RST
    // for an old connection after the next one's SYN is a stale segment:
    // not checked here.)
    assert_eq!(u(&t["reordered"]), 0);
    for what in ["retransmissions", "duplicates", "ambiguous", "above_hole"] {
        assert!(
            u(&t[what]) <= resent,
            "{what} {} against {resent} sent again",
            t[what]
        );
    }
    assert_eq!(u(&t["dropped_events"]), 0);
    assert!(took < Duration::from_secs(10), "{took:?}");
}

/// wrk and curl through the ATR edge at a 20 ms round trip, on eight
/// client ports, wrk run by turns until the edge has made 50 late segments
/// (two minutes at most): every segment the edge made late is accounted
/// for by the tracer's classes, as for the lab's own uploads, and every
/// connection and byte nginx had is in the report.
#[test]
fn nginx_uploads_through_the_atr_edge_are_found_segment_by_segment() {
    if !root_or_skip("nginx_uploads_through_the_atr_edge_are_found_segment_by_segment") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tracer-http-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (obs, truth_file) = (dir.join("obs.jsonl"), dir.join("truth.jsonl"));
    let mut spec = LabSpec::new(
        lab::Mode::Atr {
            rate: 1000.0,
            qsize: 256,
        },
        4,
    );
    spec.wan = WanSpec {
        rtt_ms: Some(20.0),
        rate_mbit: None,
    };
    spec.truth_out = Some(truth_file.clone());
    let mut lab = Lab::create(&spec).expect("lab");
    http::reuse_ports(&lab.topo.client_ns, PORTS.0, PORTS.1).unwrap();
    let nginx = Nginx::start(&lab.topo).unwrap();
    let url = nginx.url();
    let (child, _rx) = tracing(&lab, &["--out", obs.to_str().unwrap()]);
    let began = Instant::now();
    let mut rounds = 0;
    while lab.late_so_far() < LATE && began.elapsed() < Duration::from_secs(120) {
        let two = load(4, Duration::from_secs(2));
        http::wrk(&lab.topo, &lab.topo.client_ns, &url, two).unwrap();
        rounds += 1;
    }
    let enough = lab.late_so_far() >= LATE;
    http::curl(&lab.topo, &url, 10, 3, BODY, Connections::KeepAlive).unwrap();
    let (r, took) = report(child);
    let (requests, addr) = (nginx.requests().unwrap(), nginx.addr);
    drop(nginx);
    let outcome = lab.finish().unwrap();
    drop(lab);
    assert!(lab::lab_namespaces().is_empty());
    let account = segment_by_segment(&obs, &truth_file);
    let on_the_way = outcome.dropped_on_the_way;
    let summarized = u(&r["kernel"]["xdp_summarized"]);
    eprintln!(
        "{rounds} wrk rounds; nginx: {} requests; tracer: {} connections, {} on a reused 4-tuple, {} stale segments, {} reordered; {account}; {on_the_way} dropped on the way; report {:.2} s after SIGINT",
        requests.len(),
        u(&r["tracked_flows"]),
        u(&r["reused_tuples"]),
        u(&r["totals"]["stale_segments"]),
        u(&r["totals"]["reordered"]),
        took.as_secs_f64()
    );
    assert!(enough, "the edge made too few late segments in 2 minutes");
    account.check("nginx through the ATR edge", false, on_the_way, summarized);
    assert!(account.late >= LATE, "{account}");
    every_connection_and_byte(&r, addr, &requests);
    assert_eq!(u(&r["totals"]["dropped_events"]), 0);
    assert!(took < Duration::from_secs(10), "{took:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
