//! The `--filter` expression: which flows the kernel emits events for.
//!
//! Grammar (words separated by spaces; `and` and commas are optional glue):
//!
//! ```text
//! port 5201            a port, at either end
//! port 80,443          any of these ports
//! host 10.0.0.2        an address, at either end (IPv4 or IPv6)
//! net 10.0.0.0/24      a prefix, at either end
//! port 5201 and net fd00::/64
//! ```
//!
//! Ports are OR-ed together, addresses and prefixes are OR-ed together, and
//! the two groups are AND-ed: `port 80 port 443 net 10.0.0.0/8` is "port 80
//! or 443, with an end in 10/8". No expression: every TCP segment.

use std::net::IpAddr;

use crate::SetupError;

/// Most ports and most prefixes (the kernel maps' sizes).
pub const MAX_ENTRIES: usize = 64;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub ports: Vec<u16>,
    /// (network address, prefix length).
    pub prefixes: Vec<(IpAddr, u8)>,
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && self.prefixes.is_empty()
    }

    pub fn parse(expr: &str) -> Result<Self, SetupError> {
        let mut filter = Filter::default();
        let normalized = expr.replace(',', " , ");
        let mut words = normalized
            .split_whitespace()
            .filter(|w| !w.eq_ignore_ascii_case("and"))
            .peekable();
        while let Some(word) = words.next() {
            match word {
                "," => continue,
                "port" => loop {
                    let Some(value) = words.next() else {
                        return Err(bad("'port' needs a number, e.g. 'port 5201'"));
                    };
                    filter.ports.push(parse_port(value)?);
                    if words.peek() != Some(&",") {
                        break;
                    }
                    words.next();
                },
                "host" => {
                    let value = words
                        .next()
                        .ok_or_else(|| bad("'host' needs an address, e.g. 'host 10.0.0.2'"))?;
                    let addr: IpAddr = value
                        .parse()
                        .map_err(|_| bad(&format!("'{value}' is not an IP address")))?;
                    filter.prefixes.push((addr, full_len(&addr)));
                }
                "net" => {
                    let value = words
                        .next()
                        .ok_or_else(|| bad("'net' needs a prefix, e.g. 'net 10.0.0.0/24'"))?;
                    filter.prefixes.push(parse_prefix(value)?);
                }
                other => {
                    return Err(bad(&format!(
                        "unknown word '{other}' (expected port N, host ADDR or net PREFIX)"
                    )));
                }
            }
        }
        if filter.ports.len() > MAX_ENTRIES || filter.prefixes.len() > MAX_ENTRIES {
            return Err(bad(&format!(
                "at most {MAX_ENTRIES} ports and {MAX_ENTRIES} addresses"
            )));
        }
        Ok(filter)
    }

    /// Whether a segment between these ends passes, as the kernel decides it
    /// (used to describe and test the semantics).
    pub fn matches(&self, a: (IpAddr, u16), b: (IpAddr, u16)) -> bool {
        let port_ok =
            self.ports.is_empty() || self.ports.contains(&a.1) || self.ports.contains(&b.1);
        let addr_ok = self.prefixes.is_empty()
            || self
                .prefixes
                .iter()
                .any(|&(net, len)| in_prefix(a.0, net, len) || in_prefix(b.0, net, len));
        port_ok && addr_ok
    }
}

fn bad(why: &str) -> SetupError {
    SetupError::BadFilter(why.to_string())
}

fn parse_port(value: &str) -> Result<u16, SetupError> {
    match value.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(bad(&format!("'{value}' is not a port number (1-65535)"))),
    }
}

fn full_len(addr: &IpAddr) -> u8 {
    if addr.is_ipv4() {
        32
    } else {
        128
    }
}

fn parse_prefix(value: &str) -> Result<(IpAddr, u8), SetupError> {
    let (addr, len) = value.split_once('/').unwrap_or((value, ""));
    let addr: IpAddr = addr.parse().map_err(|_| {
        bad(&format!(
            "'{value}' is not a prefix like 10.0.0.0/24 or fd00::/64"
        ))
    })?;
    let len = if len.is_empty() {
        full_len(&addr)
    } else {
        match len.parse::<u8>() {
            Ok(l) if l <= full_len(&addr) => l,
            _ => {
                return Err(bad(&format!(
                    "'{value}': prefix length must be 0-{}",
                    full_len(&addr)
                )));
            }
        }
    };
    Ok((addr, len))
}

/// The 16-byte key the kernel trie uses: IPv4 as `::ffff:a.b.c.d`, with the
/// prefix length counted over those 128 bits.
pub fn trie_key(addr: IpAddr, len: u8) -> ([u8; 16], u32) {
    match addr {
        IpAddr::V4(v4) => (v4.to_ipv6_mapped().octets(), u32::from(len) + 96),
        IpAddr::V6(v6) => (v6.octets(), u32::from(len)),
    }
}

fn in_prefix(addr: IpAddr, net: IpAddr, len: u8) -> bool {
    if addr.is_ipv4() != net.is_ipv4() {
        return false;
    }
    let (a, alen) = trie_key(addr, full_len(&addr));
    let (n, nlen) = trie_key(net, len);
    debug_assert!(nlen <= alen);
    let a = u128::from_be_bytes(a);
    let n = u128::from_be_bytes(n);
    let mask = if nlen == 0 {
        0
    } else {
        u128::MAX << (128 - nlen)
    };
    a & mask == n & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_the_documented_forms() {
        let f = Filter::parse("port 80,443 and net 10.0.0.0/8 host fd00::2").unwrap();
        assert_eq!(f.ports, vec![80, 443]);
        assert_eq!(f.prefixes, vec![(ip("10.0.0.0"), 8), (ip("fd00::2"), 128)]);
        assert!(Filter::parse("").unwrap().is_empty());
        assert_eq!(Filter::parse("port 1 port 2").unwrap().ports, vec![1, 2]);
    }

    #[test]
    fn rejects_bad_expressions_with_a_reason() {
        for (expr, needle) in [
            ("port", "needs a number"),
            ("port 0", "not a port"),
            ("port 70000", "not a port"),
            ("port x", "not a port"),
            ("net 10.0.0.0/33", "prefix length"),
            ("net 300.1.1.1/8", "not a prefix"),
            ("host nope", "not an IP"),
            ("tcp", "unknown word"),
        ] {
            let err = Filter::parse(expr).unwrap_err().to_string();
            assert!(err.contains(needle), "{expr}: {err}");
        }
        let many = (1..=65)
            .map(|p| format!("port {p}"))
            .collect::<Vec<_>>()
            .join(" ");
        assert!(Filter::parse(&many).is_err());
    }

    #[test]
    fn semantics_ports_or_addrs_or_and_between() {
        let f = Filter::parse("port 80 port 443 net 10.0.0.0/8").unwrap();
        let inside = (ip("10.1.2.3"), 40000);
        let outside = (ip("192.168.0.1"), 80);
        assert!(f.matches(inside, outside)); // port at b, address at a
        assert!(!f.matches(outside, (ip("192.168.0.2"), 443))); // no address
        assert!(!f.matches(inside, (ip("192.168.0.2"), 22))); // no port
        let v6 = Filter::parse("net fd00::/64").unwrap();
        assert!(v6.matches((ip("fd00::1"), 1), (ip("fd01::1"), 2)));
        assert!(!v6.matches((ip("10.0.0.1"), 1), (ip("fd01::1"), 2)));
    }

    #[test]
    fn trie_keys_map_ipv4() {
        let (k, len) = trie_key(ip("10.0.0.0"), 8);
        assert_eq!(len, 104);
        assert_eq!(&k[10..], &[0xff, 0xff, 10, 0, 0, 0]);
    }
}
