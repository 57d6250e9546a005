//! The highest event rate the tracer keeps up with, without dropping one
//! (`cargo xtask bench`; root). Frames are sent at stepped rates from the
//! lab's edge namespace, with an AF_PACKET socket, straight into the traced
//! interface (`veth-s`, its peer): TCP segments of 64 flows, in order, 100
//! bytes of payload each, addressed to no host's MAC (the server's stack
//! drops them after XDP). A fresh tracer (full mode; the default 16 MiB
//! ring, then 64) and the real collector (ring -> decode -> engine) take
//! each step for 1.5 s; the kernel counts what it emitted and what the full
//! ring refused. Senders, XDP and collector share this VM's two cores, as
//! they would share a busy host's: one sender leaves the collector a core,
//! two or three take both.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use tracer::{
    engine::{Engine, EngineConfig},
    kernel::{Tracer, TracerOptions},
    lab::{self, in_netns, Topology, TopologyOptions},
    record::{self, RecordOptions},
};
use tracer_common::counter;
use tracer_ebpf::test_frames::segment;

#[path = "common/cpu.rs"]
mod cpu;
#[path = "common/target.rs"]
mod target;
use target::Target;

/// The event rate the collector must keep up with, dropping nothing.
const TARGET_PER_S: f64 = 1.5e6;
use cpu::thread_cpu;

const FLOWS: usize = 64;
const PAYLOAD: u16 = 100;
const STEP: Duration = Duration::from_millis(1500);
/// Frames a sendmmsg call.
const BATCH: usize = 64;
/// Target rates, frames (so events) a second (0: as fast as the senders
/// can), sending threads, and the ring's MiB.
const STEPS: [(u64, usize, u32); 7] = [
    (250_000, 1, 16),
    (500_000, 1, 16),
    (0, 1, 16),
    (0, 2, 16),
    (0, 3, 16),
    (0, 2, 64),
    (0, 3, 64),
];

/// Where the TCP sequence number and the timestamp value sit in a frame of
/// `test_frames::segment` (Ethernet, IPv4 without options, TCP with NOP NOP
/// timestamps).
const SEQ_AT: usize = 14 + 20 + 4;
const TSVAL_AT: usize = 14 + 20 + 24;

/// An AF_PACKET socket bound to `dev` in the calling thread's namespace.
fn packet_socket(dev: &str) -> OwnedFd {
    let dev = std::ffi::CString::new(dev).unwrap();
    // SAFETY: plain socket calls with a zeroed, filled sockaddr_ll.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        assert!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        let fd = OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = libc::if_nametoindex(dev.as_ptr()) as i32;
        assert!(addr.sll_ifindex > 0, "no interface {dev:?}");
        let ret = libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as u32,
        );
        assert_eq!(ret, 0, "bind: {}", std::io::Error::last_os_error());
        fd
    }
}

/// Sends in-order segments of [`FLOWS`] flows of its own (sender number
/// `sender`) on `fd` for [`STEP`] at `rate` frames a second (0: unpaced);
/// returns the frames sent.
fn send(fd: &OwnedFd, sender: usize, rate: u64) -> u64 {
    let mut frames: Vec<Vec<u8>> = (0..FLOWS)
        .map(|i| {
            let sport = 40_000 + (sender * FLOWS + i) as u16;
            segment([10, 77, 2, 2], sport, 1, PAYLOAD.into())
        })
        .collect();
    let mut seq = vec![1u32; FLOWS];
    let start = Instant::now();
    let mut sent = 0u64;
    let mut next = 0;
    while start.elapsed() < STEP {
        if rate > 0 {
            // Spin until this batch is due (sleeping is coarser than a
            // batch at these rates).
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            while start.elapsed() < due {
                std::hint::spin_loop();
            }
        }
        let tsval = (start.elapsed().as_millis() as u32 + 1).to_be_bytes();
        let mut iov = Vec::with_capacity(BATCH);
        for _ in 0..BATCH {
            let f = &mut frames[next];
            f[SEQ_AT..SEQ_AT + 4].copy_from_slice(&seq[next].to_be_bytes());
            f[TSVAL_AT..TSVAL_AT + 4].copy_from_slice(&tsval);
            seq[next] = seq[next].wrapping_add(u32::from(PAYLOAD));
            next = (next + 1) % FLOWS;
            iov.push(libc::iovec {
                iov_base: f.as_ptr() as *mut _,
                iov_len: f.len(),
            });
        }
        // (One frame per flow in a batch of 64: no flow's segment is
        // rewritten before it is sent.)
        // SAFETY: zeroed headers, each pointing at its own iovec.
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| unsafe {
                let mut m: libc::mmsghdr = std::mem::zeroed();
                m.msg_hdr.msg_iov = v;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        // SAFETY: `msgs` and the frames they point at outlive the call.
        let n = unsafe { libc::sendmmsg(fd.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as u32, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            // The peer's queue is full (more senders than it drains): wait.
            assert_eq!(e.raw_os_error(), Some(libc::ENOBUFS), "sendmmsg: {e}");
            std::thread::yield_now();
            continue;
        }
        sent += n as u64;
    }
    sent
}

struct Step {
    target: u64,
    senders: usize,
    ring_mib: u32,
    sent_per_s: f64,
    emitted: u64,
    dropped: u64,
    received: u64,
    collector_cpu: Duration,
}

fn step(topo: &Topology, rate: u64, senders: usize, ring_mib: u32) -> Step {
    let mut opts = TracerOptions::new(lab::SERVER_IF);
    opts.netns = Some(topo.server_ns.clone());
    opts.ring_bytes = ring_mib << 20;
    let mut tracer = Tracer::attach(&opts).expect("attaching the tracer");
    let senders: Vec<_> = (0..senders)
        .map(|sender| {
            let fd = in_netns(&topo.edge_ns, || packet_socket(lab::EDGE_SERVER_IF)).expect("netns");
            std::thread::spawn(move || {
                let start = Instant::now();
                let sent = send(&fd, sender, rate);
                sent as f64 / start.elapsed().as_secs_f64()
            })
        })
        .collect();
    let mut engine = Engine::new(EngineConfig::default());
    let cpu = thread_cpu();
    let o = record::run(
        &mut tracer,
        &mut engine,
        &mut [],
        || senders.iter().all(|s| s.is_finished()),
        RecordOptions {
            duration: Some(STEP * 4),
            progress: false,
            live: None,
            metrics: None,
            nic: None,
            intervals: None,
            interface: Default::default(),
        },
    )
    .expect("collecting");
    let collector_cpu = thread_cpu() - cpu;
    Step {
        target: rate,
        senders: senders.len(),
        ring_mib,
        sent_per_s: senders.into_iter().map(|s| s.join().expect("sender")).sum(),
        emitted: o.counters.get(counter::XDP_EMITTED),
        dropped: o.counters.get(counter::XDP_DROPPED),
        received: o.received,
        collector_cpu,
    }
}

fn main() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("events benchmark: skipped: needs root (namespaces, the tracer)");
        return;
    }
    let topo = Topology::create(&TopologyOptions {
        queues: 1,
        ..Default::default()
    })
    .expect("namespaces");
    println!(
        "events benchmark: {FLOWS} flows a sender of {PAYLOAD}-byte segments sent into the traced interface, {:.1} s a step; full mode",
        STEP.as_secs_f64()
    );
    let mut kept_up = 0.0f64;
    // Steps that dropped events below the target rate.
    let mut short = 0;
    for (rate, senders, ring_mib) in STEPS {
        let s = step(&topo, rate, senders, ring_mib);
        let target = if s.target == 0 {
            format!("unpaced x{}", s.senders)
        } else {
            format!("{}k/s", s.target / 1000)
        };
        let share = s.dropped as f64 * 100.0 / (s.emitted + s.dropped).max(1) as f64;
        println!(
            "  target {target:>11}, {:>2} MiB ring: sent {:>5.0}k/s; {} events, {} dropped ({share:.1}%), {} received; collector {:.0} ns of CPU an event",
            s.ring_mib,
            s.sent_per_s / 1e3,
            s.emitted,
            s.dropped,
            s.received,
            s.collector_cpu.as_nanos() as f64 / s.received.max(1) as f64,
        );
        assert_eq!(s.received, s.emitted, "every emitted event was received");
        if s.dropped == 0 {
            kept_up = kept_up.max(s.sent_per_s);
        } else if s.sent_per_s < TARGET_PER_S {
            short += 1;
        }
    }
    println!(
        "  the highest rate with 0 events dropped: {:.0}k events a second ({})",
        kept_up / 1e3,
        Target::AtLeast(TARGET_PER_S).say(kept_up, "1500k/s")
    );
    println!(
        "  steps that dropped events below 1500k/s: {short} ({})",
        Target::AtMost(0.0).say(f64::from(short), "0")
    );
}
