//! Synthetic frames for running the XDP program with `BPF_PROG_TEST_RUN`
//! (the XDP benchmark and the summary-table test include this file).

/// Ethernet + IPv4 (10.0.0.1 -> `daddr`) + TCP (`sport` -> 5201, ACK,
/// NOP NOP timestamps) + `payload` bytes.
pub fn tcp_frame(daddr: [u8; 4], sport: u16, seq: u32, payload: u16) -> Vec<u8> {
    let mut f = vec![0u8; 14];
    f[12] = 0x08;
    let total: u16 = 20 + 32 + payload;
    let mut ip = vec![0x45, 0, 0, 0, 0, 7, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1];
    ip.extend(daddr);
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    f.extend(ip);
    let mut tcp = vec![0u8; 32];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&5201u16.to_be_bytes());
    tcp[4..8].copy_from_slice(&seq.to_be_bytes());
    tcp[12] = 8 << 4;
    tcp[13] = 0x10;
    tcp[20..24].copy_from_slice(&[1, 1, 8, 10]);
    f.extend(tcp);
    f.resize(f.len() + usize::from(payload), 0xab);
    f
}
