//! Frame builders for the tests and benchmarks (this crate's unit tests;
//! the tracer's, with the `test-frames` feature): each header field put
//! where the RFCs say, independently of the parser's own code.

use tracer_common::tcp_flags::{ACK, PSH};

pub const TS: [u8; 12] = [1, 1, 8, 10, 0, 0, 0x12, 0x34, 0, 0, 0x56, 0x78];

/// NOP NOP and the timestamps option (RFC 7323) carrying these values.
pub fn timestamps(tsval: u32, tsecr: u32) -> Vec<u8> {
    let mut v = vec![1, 1, 8, 10];
    v.extend(tsval.to_be_bytes());
    v.extend(tsecr.to_be_bytes());
    v
}

pub struct Tcp {
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    pub options: Vec<u8>,
    pub payload: usize,
}

impl Default for Tcp {
    fn default() -> Self {
        Tcp {
            sport: 40000,
            dport: 5201,
            seq: 0xdead_beef,
            ack: 0x0102_0304,
            flags: ACK | PSH,
            window: 501,
            options: TS.to_vec(),
            payload: 100,
        }
    }
}

pub fn tcp(t: &Tcp) -> Vec<u8> {
    assert_eq!(t.options.len() % 4, 0, "test options must be padded");
    let doff = (20 + t.options.len()) / 4;
    let mut v = Vec::new();
    v.extend(t.sport.to_be_bytes());
    v.extend(t.dport.to_be_bytes());
    v.extend(t.seq.to_be_bytes());
    v.extend(t.ack.to_be_bytes());
    v.push((doff as u8) << 4);
    v.push(t.flags);
    v.extend(t.window.to_be_bytes());
    v.extend([0, 0, 0, 0]); // checksum, urgent pointer
    v.extend(&t.options);
    v.extend(std::iter::repeat_n(0xab, t.payload));
    v
}

/// IPv4 from 10.0.0.1 to 10.0.0.2.
pub fn ipv4(proto: u8, frag: u16, options: &[u8], l4: &[u8]) -> Vec<u8> {
    ipv4_between([10, 0, 0, 1], [10, 0, 0, 2], proto, frag, options, l4)
}

pub fn ipv4_between(
    saddr: [u8; 4],
    daddr: [u8; 4],
    proto: u8,
    frag: u16,
    options: &[u8],
    l4: &[u8],
) -> Vec<u8> {
    let ihl = 5 + options.len() / 4;
    let total = (ihl * 4 + l4.len()) as u16;
    let mut v = vec![0x40 | ihl as u8, 0];
    v.extend(total.to_be_bytes());
    v.extend(0x4242u16.to_be_bytes()); // identification
    v.extend(frag.to_be_bytes());
    v.extend([64, proto, 0, 0]);
    v.extend(saddr);
    v.extend(daddr);
    v.extend(options);
    v.extend(l4);
    v
}

pub const SRC6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
pub const DST6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

/// `ext`: (header type, total length in bytes) in order; the last one's
/// next header is `upper`.
pub fn ipv6(ext: &[(u8, usize)], upper: u8, l4: &[u8]) -> Vec<u8> {
    let mut chain = Vec::new();
    for (i, &(kind, len)) in ext.iter().enumerate() {
        let next = ext.get(i + 1).map_or(upper, |e| e.0);
        let mut h = vec![0u8; len];
        h[0] = next;
        h[1] = match kind {
            51 => (len / 4 - 2) as u8,
            44 => 0,
            _ => (len / 8 - 1) as u8,
        };
        chain.extend(h);
    }
    let first = ext.first().map_or(upper, |e| e.0);
    let mut v = vec![0x60, 0, 0, 0];
    v.extend(((chain.len() + l4.len()) as u16).to_be_bytes());
    v.extend([first, 64]);
    v.extend(SRC6);
    v.extend(DST6);
    v.extend(chain);
    v.extend(l4);
    v
}

/// Sets the identification of an Ethernet frame's IPv4 header (no VLAN).
pub fn set_ipv4_id(frame: &mut [u8], id: u16) {
    frame[14 + 4..14 + 6].copy_from_slice(&id.to_be_bytes());
}

pub fn eth(ethertype: u16, vlans: &[(u16, u16)], l3: &[u8]) -> Vec<u8> {
    let mut v = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    for &(tpid, tci) in vlans {
        v.extend(tpid.to_be_bytes());
        v.extend(tci.to_be_bytes());
    }
    v.extend(ethertype.to_be_bytes());
    v.extend(l3);
    v
}

/// One data segment, Ethernet + IPv4 (10.0.0.1 -> `daddr`) + TCP (`sport`
/// -> 5201, ACK, timestamps) with `payload` bytes at `seq`.
pub fn segment(daddr: [u8; 4], sport: u16, seq: u32, payload: usize) -> Vec<u8> {
    let t = Tcp {
        sport,
        seq,
        flags: ACK,
        payload,
        ..Tcp::default()
    };
    eth(
        0x0800,
        &[],
        &ipv4_between([10, 0, 0, 1], daddr, 6, 0x4000, &[], &tcp(&t)),
    )
}
