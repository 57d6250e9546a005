//! Just enough of a BTF reader to find struct member offsets in the running
//! kernel (`/sys/kernel/btf/vmlinux`), so no kernel layout is hard-coded.
//!
//! Format: <https://docs.kernel.org/bpf/btf.html>. Only the parts needed to
//! walk structs, unions, typedefs and qualifiers are interpreted; every other
//! kind is skipped by its documented size.

use std::{collections::HashMap, fmt, path::Path};

use tracer_common::KernelOffsets;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug)]
pub enum BtfError {
    Io(String, std::io::Error),
    Malformed(&'static str, usize),
    NoStruct(String),
    NoMember(String, String),
}

impl fmt::Display for BtfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(path, e) => write!(f, "cannot read kernel BTF {path}: {e}"),
            Self::Malformed(what, at) => write!(f, "malformed BTF: {what} at byte {at}"),
            Self::NoStruct(s) => write!(f, "kernel BTF has no struct {s}"),
            Self::NoMember(s, m) => write!(f, "kernel BTF: struct {s} has no member {m}"),
        }
    }
}

impl std::error::Error for BtfError {}

// BTF kinds (include/uapi/linux/btf.h).
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Clone, Debug)]
struct Member {
    name: u32,
    ty: u32,
    /// Bit offset within the enclosing struct.
    bit_offset: u32,
}

#[derive(Clone, Debug)]
struct Type {
    name: u32,
    kind: u32,
    /// `size` for sized kinds, the referenced type for the others.
    size_or_type: u32,
    members: Vec<Member>,
}

/// A parsed BTF blob: types by id (id 0 is void) and the string table.
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
    structs_by_name: HashMap<String, u32>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    data.get(at..at + 4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .ok_or(BtfError::Malformed("data ends inside a field", at))
}

impl Btf {
    pub fn from_file(path: &Path) -> Result<Self, BtfError> {
        let data = std::fs::read(path).map_err(|e| BtfError::Io(path.display().to_string(), e))?;
        Self::parse(&data)
    }

    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        if data.len() < 24 || data[0..2] != [0x9f, 0xeb] {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)", 0));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let types_start = hdr_len + type_off;
        let types_end = types_start + type_len;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Malformed(
                "string section out of range",
                hdr_len + str_off,
            ))?
            .to_vec();
        if types_end > data.len() {
            return Err(BtfError::Malformed(
                "type section out of range",
                types_start,
            ));
        }

        let mut types = vec![Type {
            name: 0,
            kind: 0,
            size_or_type: 0,
            members: Vec::new(),
        }];
        let mut at = types_start;
        while at < types_end {
            let name = u32_at(data, at)?;
            let info = u32_at(data, at + 4)?;
            let size_or_type = u32_at(data, at + 8)?;
            at += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let mut members = Vec::new();
            at += match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = at + i * 12;
                        let offset = u32_at(data, m + 8)?;
                        members.push(Member {
                            name: u32_at(data, m)?,
                            ty: u32_at(data, m + 4)?,
                            bit_offset: if kind_flag {
                                offset & 0xff_ffff
                            } else {
                                offset
                            },
                        });
                    }
                    vlen * 12
                }
                KIND_ENUM | KIND_FUNC_PROTO => vlen * 8,
                KIND_DATASEC | KIND_ENUM64 => vlen * 12,
                _ => 0,
            };
            types.push(Type {
                name,
                kind,
                size_or_type,
                members,
            });
        }

        let mut btf = Btf {
            types,
            strings,
            structs_by_name: HashMap::new(),
        };
        for (id, t) in btf.types.iter().enumerate() {
            if t.kind == KIND_STRUCT && t.name != 0 {
                let name = btf.string(t.name).to_string();
                btf.structs_by_name.entry(name).or_insert(id as u32);
            }
        }
        Ok(btf)
    }

    fn string(&self, offset: u32) -> &str {
        let rest = self.strings.get(offset as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    /// Follows typedefs and qualifiers to the underlying type id.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize).map(|t| t.kind) {
                Some(KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG) => {
                    id = self.types[id as usize].size_or_type
                }
                _ => break,
            }
        }
        id
    }

    /// Byte offset of `name` within type `id`, looking through anonymous
    /// struct and union members; also returns the member's type id.
    fn member_in(&self, id: u32, name: &str) -> Option<(u32, u32)> {
        let t = self.types.get(self.resolve(id) as usize)?;
        if t.kind != KIND_STRUCT && t.kind != KIND_UNION {
            return None;
        }
        for m in &t.members {
            if m.name == 0 {
                if let Some((off, ty)) = self.member_in(m.ty, name) {
                    return Some((m.bit_offset / 8 + off, ty));
                }
            } else if self.string(m.name) == name {
                return Some((m.bit_offset / 8, m.ty));
            }
        }
        None
    }

    /// Byte offset and type of a dotted member path (`"ns.inum"`) in
    /// struct `strukt`.
    fn member_path(&self, strukt: &str, path: &str) -> Result<(u32, u32), BtfError> {
        let mut id = *self
            .structs_by_name
            .get(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.to_string()))?;
        let mut offset = 0;
        for part in path.split('.') {
            let (off, ty) = self
                .member_in(id, part)
                .ok_or_else(|| BtfError::NoMember(strukt.to_string(), path.to_string()))?;
            offset += off;
            id = ty;
        }
        Ok((offset, id))
    }

    /// Byte offset of a dotted member path in struct `strukt`.
    pub fn offset_of(&self, strukt: &str, path: &str) -> Result<u32, BtfError> {
        Ok(self.member_path(strukt, path)?.0)
    }

    /// Byte size of the member at `path` in `strukt` (pointers: 8).
    pub fn size_of_member(&self, strukt: &str, path: &str) -> Result<u32, BtfError> {
        Ok(self.type_size(self.member_path(strukt, path)?.1))
    }

    fn type_size(&self, id: u32) -> u32 {
        let id = self.resolve(id);
        let Some(t) = self.types.get(id as usize) else {
            return 0;
        };
        match t.kind {
            KIND_PTR => 8,
            KIND_ARRAY => 0, // not needed by the tracer
            _ => t.size_or_type,
        }
    }

    /// The offsets the tracepoint programs read, from this kernel's BTF.
    pub fn kernel_offsets(&self) -> Result<KernelOffsets, BtfError> {
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
        ] {
            let got = self.size_of_member(s, m)?;
            if got != size {
                return Err(BtfError::NoMember(
                    s.to_string(),
                    format!("{m} of {size} bytes (this kernel has {got})"),
                ));
            }
        }
        // The programs get a `struct sock *`: socket fields are made relative
        // to it (it embeds `sock_common`, and is embedded in `tcp_sock`).
        let common = self.offset_of("sock", "__sk_common")?;
        let sock_in_tcp = self.offset_of("tcp_sock", "inet_conn.icsk_inet.sk")?;
        let sock = |m: &str| Ok::<_, BtfError>(common + self.offset_of("sock_common", m)?);
        let tcp = |m: &str| Ok::<_, BtfError>(self.offset_of("tcp_sock", m)? - sock_in_tcp);
        let tcb = |m: &str| self.offset_of("tcp_skb_cb", m);
        Ok(KernelOffsets {
            skb_cb: self.offset_of("sk_buff", "cb")?,
            skb_iif: self.offset_of("sk_buff", "skb_iif")?,
            skb_head: self.offset_of("sk_buff", "head")?,
            skb_data: self.offset_of("sk_buff", "data")?,
            skb_end: self.offset_of("sk_buff", "end")?,
            shinfo_gso_segs: self.offset_of("skb_shared_info", "gso_segs")?,
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
            net_inum: self.offset_of("net", "ns.inum")?,
            tp_srtt_us: tcp("srtt_us")?,
            tp_snd_cwnd: tcp("snd_cwnd")?,
            tp_snd_una: tcp("snd_una")?,
            tp_snd_nxt: tcp("snd_nxt")?,
            tp_rcv_nxt: tcp("rcv_nxt")?,
            tp_ts_recent: tcp("rx_opt.ts_recent")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built BTF blob: `struct outer { int a; union { int b; struct
    /// inner named; }; }` where `struct inner { int pad; int c; }`.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0outer\0a\0b\0inner\0pad\0c\0named\0";
        let s = |name: &str| {
            let pos = strings
                .windows(name.len() + 2)
                .position(|w| {
                    w[0] == 0 && &w[1..=name.len()] == name.as_bytes() && w[name.len() + 1] == 0
                })
                .unwrap();
            pos as u32 + 1
        };
        let mut types = Vec::new();
        let mut ty = |name: u32, kind: u32, vlen: u32, size: u32, extra: &[u32]| {
            types.extend_from_slice(&name.to_le_bytes());
            types.extend_from_slice(&((kind << 24) | vlen).to_le_bytes());
            types.extend_from_slice(&size.to_le_bytes());
            for e in extra {
                types.extend_from_slice(&e.to_le_bytes());
            }
        };
        ty(s("int"), KIND_INT, 0, 4, &[32]); // 1
        ty(
            s("inner"),
            KIND_STRUCT,
            2,
            8,
            &[s("pad"), 1, 0, s("c"), 1, 32],
        ); // 2
        ty(0, KIND_UNION, 2, 8, &[s("b"), 1, 0, s("named"), 2, 0]); // 3
        ty(s("outer"), KIND_STRUCT, 2, 12, &[s("a"), 1, 0, 0, 3, 32]); // 4
        let mut out = vec![0x9f, 0xeb, 1, 0];
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&types);
        out.extend_from_slice(strings);
        out
    }

    #[test]
    fn finds_members_through_anonymous_unions_and_paths() {
        let btf = Btf::parse(&blob()).unwrap();
        assert_eq!(btf.offset_of("outer", "a").unwrap(), 0);
        assert_eq!(btf.offset_of("outer", "b").unwrap(), 4);
        assert_eq!(btf.offset_of("outer", "named.c").unwrap(), 8);
        assert_eq!(btf.size_of_member("outer", "named.c").unwrap(), 4);
        assert!(matches!(
            btf.offset_of("outer", "zz"),
            Err(BtfError::NoMember(..))
        ));
        assert!(matches!(
            btf.offset_of("nope", "a"),
            Err(BtfError::NoStruct(_))
        ));
    }

    #[test]
    fn rejects_garbage() {
        assert!(Btf::parse(b"not btf at all, definitely not").is_err());
        let mut b = blob();
        b.truncate(40);
        assert!(Btf::parse(&b).is_err());
    }

    /// The running kernel's layout, checked against what bpftool (an
    /// independent BTF reader) prints, when both are available.
    #[test]
    fn vmlinux_offsets_match_bpftool() {
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
        let btf = Btf::from_file(path).unwrap();
        let off = btf.kernel_offsets().unwrap();
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
