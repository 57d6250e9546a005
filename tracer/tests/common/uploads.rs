//! Synthetic uploads as the engine sees them on a receiver: every data
//! segment on the wire (XDP), then as TCP took it (`tcp_probe`), flows
//! taking turns segment by segment. A flow can swap two neighbours every
//! 50 segments (a late original: the replay's logs grow with it). The
//! memory test and the memory bench include this file.

use tracer::source::{Flow, Observation, Segment, TcpProbe};

pub const MSS: u32 = 1448;

pub struct Uploads {
    flows: u32,
    segments_per_flow: u32,
    /// Which flows reorder.
    reorders: fn(u32) -> bool,
    /// Observations produced so far.
    at: u64,
}

impl Uploads {
    pub fn new(flows: u32, segments_per_flow: u32, reorders: fn(u32) -> bool) -> Self {
        Self {
            flows,
            segments_per_flow,
            reorders,
            at: 0,
        }
    }

    /// Observations it yields in all.
    pub fn len(&self) -> u64 {
        2 * u64::from(self.flows) * u64::from(self.segments_per_flow)
    }

    pub fn flow(i: u32) -> Flow {
        Flow {
            src: std::net::SocketAddr::new(
                [10, (i >> 16) as u8, (i >> 8) as u8, i as u8].into(),
                40_000,
            ),
            dst: "10.255.0.1:443".parse().unwrap(),
        }
    }
}

impl Iterator for Uploads {
    type Item = Observation;

    fn next(&mut self) -> Option<Observation> {
        if self.at >= self.len() {
            return None;
        }
        let (k, probe) = (self.at / 2, self.at % 2 == 1);
        self.at += 1;
        let i = (k % u64::from(self.flows)) as u32;
        let n = (k / u64::from(self.flows)) as u32;
        // The n-th to arrive is segment `sent`; 24 and 25 of every 50 swap.
        let sent = match (n % 50, (self.reorders)(i)) {
            (24, true) if n + 1 < self.segments_per_flow => n + 1,
            (25, true) => n - 1,
            _ => n,
        };
        let seq = 1u32.wrapping_add(sent.wrapping_mul(MSS));
        let ts_ns = 1_000_000 + k * 1_000;
        let flow = Self::flow(i);
        Some(if probe {
            // What TCP expected next: the hole while the swap is open.
            let rcv_nxt = 1u32.wrapping_add(sent.min(n).wrapping_mul(MSS));
            Observation::TcpProbe(TcpProbe {
                ts_ns: ts_ns + 500,
                cpu: 0,
                ifindex: 1,
                flow,
                seq,
                end_seq: seq.wrapping_add(MSS),
                ack: 1,
                payload_len: MSS,
                flags: 0x10,
                srtt_us: 100,
                snd_cwnd: 10,
                snd_una: 1,
                snd_nxt: 1,
                rcv_nxt,
                gso_segs: 1,
                tsval: Some(sent),
                ts_recent: 0,
            })
        } else {
            Observation::Segment(Segment {
                ts_ns,
                ifindex: 1,
                rx_queue: i % 4,
                cpu: i % 2,
                flow,
                seq,
                ack: 1,
                payload_len: MSS,
                flags: 0x10,
                window: 512,
                ip_id: Some(sent as u16),
                timestamp: Some((sent, 1)),
                sack: Vec::new(),
                vlan: None,
                first_fragment: false,
                summarized_before: 0,
                summarized_end: None,
            })
        })
    }
}
