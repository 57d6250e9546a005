//! What native XDP on a veth takes from its peer. While a program is
//! attached natively, the veth driver turns the peer's TSO (every kind
//! of GSO) off, and the peer's stack then segments each TCP packet in
//! software: an upload over a veth pair kept 0.11 of its speed in
//! `cargo xtask bench`. Generic XDP takes nothing, but sees what the peer
//! sends: a TSO packet is several segments at once. A NIC has no peer.

use std::process::Command;

use super::ethtool::Ethtool;
use crate::kernel::{netns::NetnsGuard, XdpModeChoice};

/// The traced interface's peer, as far as it can be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Not a veth (or not one the driver names so).
    NotVeth,
    /// A veth whose peer sends TSO packets (or has TSO on).
    Tso,
    /// A veth whose peer already segments: native XDP takes nothing.
    NoTso,
    /// A veth whose peer cannot be read (in a namespace without a name).
    Unknown,
}

/// `iface`'s peer, seen from `netns` (`None`: this thread's).
pub fn peer(iface: &str, netns: Option<&str>) -> Peer {
    let Ok(_in) = NetnsGuard::enter_opt(netns) else {
        return Peer::Unknown;
    };
    let Ok(ethtool) = Ethtool::open() else {
        return Peer::Unknown;
    };
    if ethtool.driver(iface).map(|d| d.driver).ok().as_deref() != Some("veth") {
        return Peer::NotVeth;
    }
    peer_tso(&ethtool, iface).map_or(
        Peer::Unknown,
        |tso| if tso { Peer::Tso } else { Peer::NoTso },
    )
}

/// The veth `iface`'s peer's TSO: its index from the driver's statistics,
/// its namespace from the link's (by the name iproute2 gave it).
fn peer_tso(ethtool: &Ethtool, iface: &str) -> Option<bool> {
    let stats = ethtool.statistics(iface).ok()?;
    let index = stats.iter().find(|(n, _)| n == "peer_ifindex")?.1;
    let link = ip_json(&["-d", "link", "show", "dev", iface])?;
    let peer_ns = match link[0]["link_netnsid"].as_i64() {
        None => None,
        Some(id) => {
            let ids = ip_json(&["netns", "list-id"])?;
            let named = ids
                .as_array()?
                .iter()
                .find(|n| n["nsid"].as_i64() == Some(id))?;
            Some(named["name"].as_str()?.to_string())
        }
    };
    let _in = NetnsGuard::enter_opt(peer_ns.as_deref()).ok()?;
    let name = name_of(u32::try_from(index).ok()?)?;
    Ethtool::open().ok()?.tso(&name).ok()
}

/// `ip -j ARGS` in this thread's namespace.
fn ip_json(args: &[&str]) -> Option<serde_json::Value> {
    let out = Command::new("ip").arg("-j").args(args).output().ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// The interface of `index` in this thread's namespace.
fn name_of(index: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` holds IF_NAMESIZE bytes, as if_indextoname asks.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// The XDP attachment to ask for on `iface` when the user asked for
/// `choice`, and the line to say at start: `auto` on a veth whose peer
/// has TSO (or cannot be read) asks for generic, which keeps the peer's
/// speed; `native` asked on one is told what it costs.
pub fn xdp_mode(
    iface: &str,
    netns: Option<&str>,
    choice: XdpModeChoice,
) -> (XdpModeChoice, Option<String>) {
    if choice == XdpModeChoice::Generic {
        return (choice, None);
    }
    let peer = peer(iface, netns);
    let costly = matches!(peer, Peer::Tso | Peer::Unknown);
    let whose = if peer == Peer::Tso {
        "its peer sends TSO packets"
    } else {
        "its peer cannot be read (in a namespace without a name)"
    };
    match choice {
        XdpModeChoice::Auto if costly => (
            XdpModeChoice::Generic,
            Some(format!(
                "tracer: {iface} is a veth and {whose}: generic XDP, which takes nothing from the peer (native would turn its TSO off: an upload over a veth pair kept 0.11 of its speed so); XDP sees the peer's TSO packets, several segments at once, rather than wire segments (--xdp-mode native for those)"
            )),
        ),
        XdpModeChoice::Native if costly => (
            choice,
            Some(format!(
                "tracer: native XDP on the veth {iface} turns its peer's TSO off: the peer's stack segments every TCP packet in software (an upload over a veth pair kept 0.11 of its speed so); --xdp-mode generic keeps it, XDP then seeing the peer's TSO packets rather than wire segments"
            )),
        ),
        _ => (choice, None),
    }
}
