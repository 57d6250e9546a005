//! The NIC's receive-side scaling, replayed: its Toeplitz key and
//! indirection table give the RX queue RSS picks for a flow, so segments
//! that arrived on another queue were steered by something else (Flow
//! Director/ATR, aRFS, an ntuple rule).

use std::fmt;

use serde::Serialize;
use tracer_common::rss::{ipv4_input, ipv6_input, toeplitz};

use crate::source::Flow;

/// A NIC's RSS configuration, as `ethtool -x` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rss {
    /// The Toeplitz key.
    #[serde(serialize_with = "hex")]
    pub key: Vec<u8>,
    /// Indirection table: the hash's low bits pick an entry, the entry is
    /// the RX queue.
    pub indir: Vec<u32>,
}

/// What was wrong with an RSS key or table given by hand.
#[derive(Debug, PartialEq, Eq)]
pub struct BadRss(pub String);

impl fmt::Display for BadRss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadRss {}

impl Rss {
    /// `key`: bytes in hex, colon-separated (`6d:5a:56:...`, as `ethtool -x`
    /// prints it); `indir`: the table's queues in order, comma-separated.
    /// A key must cover a TCP/IPv6 flow's 36 bytes of input plus 4.
    pub fn parse(key: &str, indir: &str) -> Result<Rss, BadRss> {
        let key = key
            .trim()
            .split(':')
            .map(|b| u8::from_str_radix(b.trim(), 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| {
                BadRss(format!(
                    "RSS key {key:?} is not hex bytes separated by colons"
                ))
            })?;
        let indir = indir
            .split(',')
            .map(|q| q.trim().parse::<u32>())
            .collect::<Result<Vec<u32>, _>>()
            .map_err(|_| {
                BadRss(format!(
                    "RSS table {indir:?} is not queue numbers separated by commas"
                ))
            })?;
        Rss::new(key, indir)
    }

    pub fn new(key: Vec<u8>, indir: Vec<u32>) -> Result<Rss, BadRss> {
        if key.len() < 40 {
            return Err(BadRss(format!(
                "an RSS key of {} bytes is too short: Toeplitz keys are 40 bytes or more",
                key.len()
            )));
        }
        if indir.is_empty() {
            return Err(BadRss("the RSS indirection table is empty".into()));
        }
        Ok(Rss { key, indir })
    }

    /// The Toeplitz hash of a received segment of `flow` (TCP: addresses
    /// and ports, as NICs hash TCP by default).
    pub fn hash(&self, flow: &Flow) -> u32 {
        use std::net::SocketAddr::V4;
        match (flow.src, flow.dst) {
            (V4(s), V4(d)) => toeplitz(
                &self.key,
                &ipv4_input(s.ip().octets(), d.ip().octets(), s.port(), d.port()),
            ),
            (s, d) => {
                let v6 = |a: std::net::SocketAddr| match a.ip() {
                    std::net::IpAddr::V6(ip) => ip.octets(),
                    std::net::IpAddr::V4(ip) => ip.to_ipv6_mapped().octets(),
                };
                toeplitz(&self.key, &ipv6_input(v6(s), v6(d), s.port(), d.port()))
            }
        }
    }

    /// The RX queue RSS picks for `flow`'s segments.
    pub fn queue_of(&self, flow: &Flow) -> u32 {
        self.indir[self.hash(flow) as usize % self.indir.len()]
    }
}

fn hex<S: serde::Serializer>(key: &[u8], s: S) -> Result<S::Ok, S::Error> {
    let text: Vec<String> = key.iter().map(|b| format!("{b:02x}")).collect();
    s.serialize_str(&text.join(":"))
}

#[cfg(test)]
mod tests {
    use tracer_common::rss::VERIFICATION_KEY;

    use super::*;

    fn flow(s: &str) -> Flow {
        s.parse().unwrap()
    }

    #[test]
    fn a_flow_hashes_as_the_published_verification_table_says() {
        let rss = Rss::new(VERIFICATION_KEY.to_vec(), vec![0]).unwrap();
        // Microsoft's table, first row: 66.9.149.187:2794 to 161.142.100.80:1766.
        assert_eq!(
            rss.hash(&flow("66.9.149.187:2794 -> 161.142.100.80:1766")),
            0x51cc_c178
        );
        assert_eq!(
            rss.hash(&flow(
                "[3ffe:2501:200:1fff::7]:2794 -> [3ffe:2501:200:3::1]:1766"
            )),
            0x4020_7d3d
        );
    }

    #[test]
    fn the_hash_low_bits_pick_the_table_entry() {
        // 0x51ccc178 % 128 = 0x78 = 120.
        let indir: Vec<u32> = (0..128).collect();
        let rss = Rss::new(VERIFICATION_KEY.to_vec(), indir).unwrap();
        assert_eq!(
            rss.queue_of(&flow("66.9.149.187:2794 -> 161.142.100.80:1766")),
            120
        );
    }

    #[test]
    fn parses_what_ethtool_prints_and_says_what_is_wrong() {
        let key: Vec<String> = VERIFICATION_KEY
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let rss = Rss::parse(&key.join(":"), "0, 1,2,3").unwrap();
        assert_eq!(rss.key, VERIFICATION_KEY);
        assert_eq!(rss.indir, [0, 1, 2, 3]);
        assert!(Rss::parse("6d:zz", "0")
            .unwrap_err()
            .0
            .contains("not hex bytes"));
        assert!(Rss::parse("6d:5a", "0")
            .unwrap_err()
            .0
            .contains("too short"));
        assert!(Rss::parse(&key.join(":"), "0,x")
            .unwrap_err()
            .0
            .contains("queue numbers"));
    }
}
