//! Just enough of a BTF reader to find struct member offsets, tracepoint
//! prototypes and enumerators in the running kernel
//! (`/sys/kernel/btf/vmlinux`), so no kernel layout is hard-coded (what the
//! tracer makes of them: [`super::features`]).
//!
//! Format: <https://docs.kernel.org/bpf/btf.html>. Only the parts needed to
//! walk structs, unions, typedefs and qualifiers are interpreted; every other
//! kind is skipped by its documented size.

use std::{collections::HashMap, fmt, path::Path};

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
    /// Named structs, typedefs and enums: (kind, name) -> the first id.
    by_name: HashMap<(u32, String), u32>,
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
                // Enumerators (name, value) and parameters (name, type),
                // kept as members with no offset.
                KIND_ENUM | KIND_FUNC_PROTO => {
                    for i in 0..vlen {
                        let m = at + i * 8;
                        members.push(Member {
                            name: u32_at(data, m)?,
                            ty: u32_at(data, m + 4)?,
                            bit_offset: 0,
                        });
                    }
                    vlen * 8
                }
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
            by_name: HashMap::new(),
        };
        for (id, t) in btf.types.iter().enumerate() {
            if matches!(t.kind, KIND_STRUCT | KIND_TYPEDEF | KIND_ENUM) && t.name != 0 {
                let name = btf.string(t.name).to_string();
                btf.by_name.entry((t.kind, name)).or_insert(id as u32);
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
        let mut id = self
            .named(KIND_STRUCT, strukt)
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

    fn named(&self, kind: u32, name: &str) -> Option<u32> {
        self.by_name.get(&(kind, name.to_string())).copied()
    }

    /// Whether this kernel has a struct of this name.
    pub fn has_struct(&self, name: &str) -> bool {
        self.named(KIND_STRUCT, name).is_some()
    }

    /// Whether enum `enumeration` has the enumerator `value` (e.g.
    /// `bpf_attach_type`'s `BPF_TCX_EGRESS`).
    pub fn has_enumerator(&self, enumeration: &str, value: &str) -> bool {
        self.named(KIND_ENUM, enumeration).is_some_and(|id| {
            self.types[id as usize]
                .members
                .iter()
                .any(|m| self.string(m.name) == value)
        })
    }

    /// How many arguments tracepoint `name` passes to a `tp_btf` program:
    /// the parameters of its `btf_trace_<name>` prototype, less the leading
    /// `void *` every one has. `None` if this kernel has no such tracepoint.
    pub fn tracepoint_args(&self, name: &str) -> Option<u32> {
        let typedef = self.named(KIND_TYPEDEF, &format!("btf_trace_{name}"))?;
        let ptr = self.types.get(self.resolve(typedef) as usize)?;
        if ptr.kind != KIND_PTR {
            return None;
        }
        let proto = self.types.get(self.resolve(ptr.size_or_type) as usize)?;
        if proto.kind != KIND_FUNC_PROTO {
            return None;
        }
        (proto.members.len() as u32).checked_sub(1)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built BTF blob: `struct outer { int a; union { int b; struct
    /// inner named; }; }` where `struct inner { int pad; int c; }`.
    fn blob() -> Vec<u8> {
        let strings =
            b"\0int\0outer\0a\0b\0inner\0pad\0c\0named\0btf_trace_two\0btf_trace_three\0bpf_attach_type\0BPF_X\0BPF_TCX_EGRESS\0";
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
                                                                       // Tracepoint prototypes as vmlinux has them: a typedef of a
                                                                       // pointer to (void *, the arguments...), parameters unnamed.
        ty(0, KIND_FUNC_PROTO, 3, 0, &[0, 0, 0, 1, 0, 1]); // 5: (void *, int, int)
        ty(0, KIND_PTR, 0, 5, &[]); // 6
        ty(s("btf_trace_two"), KIND_TYPEDEF, 0, 6, &[]); // 7
        ty(0, KIND_FUNC_PROTO, 4, 0, &[0, 0, 0, 1, 0, 1, 0, 1]); // 8
        ty(0, KIND_PTR, 0, 8, &[]); // 9
        ty(s("btf_trace_three"), KIND_TYPEDEF, 0, 9, &[]); // 10
        ty(
            s("bpf_attach_type"),
            KIND_ENUM,
            2,
            4,
            &[s("BPF_X"), 0, s("BPF_TCX_EGRESS"), 47],
        ); // 11
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
    fn counts_tracepoint_arguments_and_finds_enumerators() {
        let btf = Btf::parse(&blob()).unwrap();
        assert_eq!(btf.tracepoint_args("two"), Some(2));
        assert_eq!(btf.tracepoint_args("three"), Some(3));
        assert_eq!(btf.tracepoint_args("none"), None);
        assert!(btf.has_enumerator("bpf_attach_type", "BPF_TCX_EGRESS"));
        assert!(!btf.has_enumerator("bpf_attach_type", "BPF_TCX_INGRESS"));
        assert!(!btf.has_enumerator("nope", "BPF_X"));
        assert!(btf.has_struct("inner") && !btf.has_struct("outer_not"));
    }

    #[test]
    fn rejects_garbage() {
        assert!(Btf::parse(b"not btf at all, definitely not").is_err());
        let mut b = blob();
        b.truncate(40);
        assert!(Btf::parse(&b).is_err());
    }
}
