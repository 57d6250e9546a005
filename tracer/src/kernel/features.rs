//! What differs between the kernel releases the tracer runs on (Linux 6.1,
//! 6.12, 6.18), found from the running kernel's BTF at load time, in this
//! one place:
//!
//! * struct offsets and field widths (`KernelLayout`, handed to the
//!   tracepoint programs as constants);
//! * `tcp_retransmit_skb` passes the transmit's result (`err`) from Linux
//!   6.17 on; before, it fires only for retransmissions that left, and a
//!   program reading a third argument is rejected;
//! * tc programs attach as tcx links from Linux 6.6 on; before, through a
//!   clsact qdisc and a netlink filter (the lab's edge).
//!
//! What a kernel lacks is said, with what it costs, in [`KernelFeatures::missing`].

use std::{path::Path, sync::OnceLock};

use serde::Serialize;
use tracer_common::KernelLayout;

use super::btf::{Btf, BtfError, VMLINUX_BTF};
use crate::SetupError;

/// The running kernel, as the tracer needs to know it.
#[derive(Clone, Debug)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    pub layout: KernelLayout,
    /// `tcp_retransmit_skb` has its `err` argument.
    pub retransmit_err: bool,
    /// tc programs attach as tcx links.
    pub tcx: bool,
}

impl KernelFeatures {
    /// The running kernel's, read once per process.
    pub fn running() -> Result<&'static Self, SetupError> {
        static FEATURES: OnceLock<Result<KernelFeatures, String>> = OnceLock::new();
        FEATURES
            .get_or_init(|| {
                let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .map(|r| r.trim().to_string())
                    .unwrap_or_else(|_| "(unknown release)".to_string());
                let path = Path::new(VMLINUX_BTF);
                if !path.exists() {
                    return Err(format!(
                        "Linux {release} exposes no BTF at {VMLINUX_BTF} (the tracer needs a kernel built with CONFIG_DEBUG_INFO_BTF=y)"
                    ));
                }
                Btf::from_file(path)
                    .and_then(|btf| Self::from_btf(&btf, release.clone()))
                    .map_err(|e| format!("Linux {release}: {e}"))
            })
            .as_ref()
            .map_err(|e| SetupError::Environment(e.clone()))
    }

    pub fn from_btf(btf: &Btf, release: String) -> Result<Self, BtfError> {
        Ok(Self {
            release,
            layout: layout(btf)?,
            retransmit_err: retransmit_err(btf),
            tcx: btf.has_enumerator("bpf_attach_type", "BPF_TCX_EGRESS"),
        })
    }

    /// What a report says of this kernel.
    pub fn report(&self) -> KernelReport {
        KernelReport {
            release: self.release.clone(),
            missing: self.missing(),
        }
    }

    /// What this kernel lacks that the tracer would use, and what that
    /// costs: one line each, for the start of a run and its report.
    pub fn missing(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.retransmit_err {
            lines.push(
                "tcp_retransmit_skb passes no err before Linux 6.17: only local retransmissions that left are seen (exports read err 0)"
                    .to_string(),
            );
        }
        lines
    }
}

/// The kernel a run traced on, as its report (and its pcapng trace) says:
/// the release and what it lacks ([`KernelFeatures::missing`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelReport {
    pub release: String,
    pub missing: Vec<String>,
}

/// Whether `tcp_retransmit_skb` passes `err` (a third argument).
fn retransmit_err(btf: &Btf) -> bool {
    btf.tracepoint_args("tcp_retransmit_skb") == Some(3)
}

/// The offsets and tracepoint shapes the programs read, from this kernel's
/// BTF.
fn layout(btf: &Btf) -> Result<KernelLayout, BtfError> {
    // Fields whose width the programs assume.
    for (s, m, size) in [
        ("tcp_skb_cb", "seq", 4),
        ("tcp_skb_cb", "end_seq", 4),
        ("tcp_skb_cb", "ack_seq", 4),
        ("sock_common", "skc_family", 2),
        ("sock_common", "skc_dport", 2),
        ("sock_common", "skc_num", 2),
        ("sock_common", "skc_net", 8),
        ("sk_buff", "skb_iif", 4),
        ("sk_buff", "head", 8),
        ("sk_buff", "data", 8),
        // An offset from head on 64-bit kernels (NET_SKBUFF_DATA_USES_OFFSET).
        ("sk_buff", "end", 4),
        ("skb_shared_info", "gso_segs", 2),
        ("tcp_sock", "srtt_us", 4),
        ("tcp_sock", "snd_cwnd", 4),
        ("tcp_sock", "rx_opt.ts_recent", 4),
        ("sock", "sk_lock.owned", 4),
    ] {
        let got = btf.size_of_member(s, m)?;
        if got != size {
            return Err(BtfError::NoMember(
                s.to_string(),
                format!("{m} of {size} bytes (this kernel has {got})"),
            ));
        }
    }
    // The programs get a `struct sock *`: socket fields are made relative
    // to it (it embeds `sock_common`, and is embedded in `tcp_sock`).
    let common = btf.offset_of("sock", "__sk_common")?;
    let sock_in_tcp = btf.offset_of("tcp_sock", "inet_conn.icsk_inet.sk")?;
    let sock = |m: &str| Ok::<_, BtfError>(common + btf.offset_of("sock_common", m)?);
    let tcp = |m: &str| Ok::<_, BtfError>(btf.offset_of("tcp_sock", m)? - sock_in_tcp);
    let tcb = |m: &str| btf.offset_of("tcp_skb_cb", m);
    Ok(KernelLayout {
        skb_cb: btf.offset_of("sk_buff", "cb")?,
        skb_iif: btf.offset_of("sk_buff", "skb_iif")?,
        skb_head: btf.offset_of("sk_buff", "head")?,
        skb_data: btf.offset_of("sk_buff", "data")?,
        skb_end: btf.offset_of("sk_buff", "end")?,
        shinfo_gso_segs: btf.offset_of("skb_shared_info", "gso_segs")?,
        tcb_seq: tcb("seq")?,
        tcb_end_seq: tcb("end_seq")?,
        tcb_ack_seq: tcb("ack_seq")?,
        tcb_tcp_flags: tcb("tcp_flags")?,
        sk_family: sock("skc_family")?,
        sk_daddr: sock("skc_daddr")?,
        sk_rcv_saddr: sock("skc_rcv_saddr")?,
        sk_v6_daddr: sock("skc_v6_daddr")?,
        sk_v6_rcv_saddr: sock("skc_v6_rcv_saddr")?,
        sk_dport: sock("skc_dport")?,
        sk_num: sock("skc_num")?,
        sk_net: sock("skc_net")?,
        net_inum: btf.offset_of("net", "ns.inum")?,
        tp_srtt_us: tcp("srtt_us")?,
        tp_snd_cwnd: tcp("snd_cwnd")?,
        tp_snd_una: tcp("snd_una")?,
        tp_snd_nxt: tcp("snd_nxt")?,
        tp_rcv_nxt: tcp("rcv_nxt")?,
        tp_ts_recent: tcp("rx_opt.ts_recent")?,
        sk_owned: btf.offset_of("sock", "sk_lock.owned")?,
        rtx_err: u32::from(retransmit_err(btf)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What BTF says against what the kernel says otherwise: the
    /// tracepoint's own format in tracefs (an `err` field exactly when the
    /// tracepoint passes it) and the release number (tcx came in 6.6).
    #[test]
    fn features_agree_with_tracefs_and_the_release() {
        let format = "/sys/kernel/tracing/events/tcp/tcp_retransmit_skb/format";
        let Ok(format) = std::fs::read_to_string(format) else {
            eprintln!("skipped: no tracefs at /sys/kernel/tracing (needs root)");
            return;
        };
        let k = KernelFeatures::running().unwrap();
        assert_eq!(k.retransmit_err, format.contains("int err;"), "{format}");
        assert_eq!(k.missing().is_empty(), k.retransmit_err);
        let mut numbers = k.release.split(|c: char| !c.is_ascii_digit());
        let major: u32 = numbers.next().unwrap().parse().unwrap();
        let minor: u32 = numbers.next().unwrap().parse().unwrap();
        assert_eq!(k.tcx, (major, minor) >= (6, 6), "{}", k.release);
    }

    /// The running kernel's layout, checked against what bpftool (an
    /// independent BTF reader) prints, when both are available.
    #[test]
    fn vmlinux_layout_matches_bpftool() {
        let path = Path::new(VMLINUX_BTF);
        let Ok(out) = std::process::Command::new("bpftool")
            .args(["btf", "dump", "file", VMLINUX_BTF, "format", "raw"])
            .output()
        else {
            eprintln!("skipped: bpftool not installed");
            return;
        };
        if !path.exists() || !out.status.success() {
            eprintln!("skipped: no {VMLINUX_BTF} or bpftool failed");
            return;
        }
        let dump = String::from_utf8_lossy(&out.stdout);
        // Direct members of a named struct, as bpftool lists them.
        let direct = |strukt: &str, member: &str| -> u32 {
            let header = format!("STRUCT '{strukt}' ");
            let mut lines = dump.lines().skip_while(|l| !l.contains(&header));
            lines.next().expect("struct in bpftool output");
            let needle = format!("'{member}' ");
            let line = lines
                .take_while(|l| l.starts_with('\t'))
                .find(|l| l.trim_start().starts_with(&needle))
                .expect("member in bpftool output");
            let bits: u32 = line
                .split("bits_offset=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
            bits / 8
        };
        let off = layout(&Btf::from_file(path).unwrap()).unwrap();
        assert_eq!(off.skb_cb, direct("sk_buff", "cb"));
        assert_eq!(off.tcb_seq, direct("tcp_skb_cb", "seq"));
        assert_eq!(off.tcb_end_seq, direct("tcp_skb_cb", "end_seq"));
        assert_eq!(off.tcb_ack_seq, direct("tcp_skb_cb", "ack_seq"));
        assert_eq!(off.tp_srtt_us, direct("tcp_sock", "srtt_us"));
        assert_eq!(off.tp_snd_nxt, direct("tcp_sock", "snd_nxt"));
        assert_eq!(off.sk_v6_daddr, direct("sock_common", "skc_v6_daddr"));
        assert_eq!(off.sk_net, direct("sock_common", "skc_net"));
        assert_eq!(off.skb_end, direct("sk_buff", "end"));
        assert_eq!(off.shinfo_gso_segs, direct("skb_shared_info", "gso_segs"));
    }
}
