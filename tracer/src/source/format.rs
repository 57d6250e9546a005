//! The capture file formats' numbers, shared by the reader
//! ([`super::capture`]) and our trace's writer ([`crate::pcapng`]): pcap's
//! and pcapng's magic, block types and option codes, the link types read,
//! Wireshark's exported PDU, and our own custom blocks and options.

/// Link-layer header types read.
pub mod linktype {
    pub const ETHERNET: u32 = 1;
    pub const RAW: u32 = 101;
    /// `DLT_RAW` as some systems number it.
    pub const RAW_ALT: u32 = 12;
    pub const LINUX_SLL: u32 = 113;
    pub const IPV4: u32 = 228;
    pub const IPV6: u32 = 229;
    pub const LINUX_SLL2: u32 = 276;
    /// Wireshark's exported PDUs (our traces' kernel records).
    pub const UPPER_PDU: u32 = 252;
}

/// Wireshark's "exported PDU" header (`LINKTYPE_WIRESHARK_UPPER_PDU`):
/// big-endian (type, length, value) tags up to an end tag. Ours name the
/// dissector ("data") and the protocol column (the event's name).
pub(crate) mod exported_pdu {
    const PROTO_NAME: u16 = 12;
    const COL_PROT_TEXT: u16 = 33;
    const END: u16 = 0;

    fn padded(n: usize) -> usize {
        n.next_multiple_of(4)
    }

    /// Bytes of [`header`] for a protocol column `name`.
    pub fn header_len(name: &[u8]) -> usize {
        4 + padded(4) + 4 + padded(name.len()) + 4
    }

    pub fn header(out: &mut Vec<u8>, name: &[u8]) {
        for (tag, value) in [(PROTO_NAME, &b"data"[..]), (COL_PROT_TEXT, name)] {
            out.extend(tag.to_be_bytes());
            out.extend((padded(value.len()) as u16).to_be_bytes());
            out.extend_from_slice(value);
            out.resize(out.len() + padded(value.len()) - value.len(), 0);
        }
        out.extend(END.to_be_bytes());
        out.extend(0u16.to_be_bytes());
    }

    /// What follows the tags of `pdu`, if they end.
    pub fn payload(pdu: &[u8]) -> Option<&[u8]> {
        let mut at = 0;
        loop {
            let tag = u16::from_be_bytes(pdu.get(at..at + 2)?.try_into().ok()?);
            let len = usize::from(u16::from_be_bytes(
                pdu.get(at + 2..at + 4)?.try_into().ok()?,
            ));
            at += 4 + len;
            if tag == END {
                return pdu.get(at..);
            }
        }
    }
}

pub(crate) const PCAP_US: u32 = 0xa1b2_c3d4;
pub(crate) const PCAP_NS: u32 = 0xa1b2_3c4d;
pub(crate) const PCAPNG_SHB: u32 = 0x0a0d_0d0a;
pub(crate) const BYTE_ORDER: u32 = 0x1a2b_3c4d;

/// pcapng block types.
pub(crate) mod block {
    pub const IDB: u32 = 1;
    pub const SPB: u32 = 3;
    pub const ISB: u32 = 5;
    pub const EPB: u32 = 6;
}

/// pcapng option codes.
pub(crate) mod opt {
    pub const END: u16 = 0;
    pub const COMMENT: u16 = 1;
    pub const SHB_OS: u16 = 3;
    pub const SHB_USERAPPL: u16 = 4;
    pub const IF_NAME: u16 = 2;
    pub const IF_DESCRIPTION: u16 = 3;
    pub const IF_TSRESOL: u16 = 9;
    pub const EPB_FLAGS: u16 = 2;
    pub const EPB_QUEUE: u16 = 6;
    pub const ISB_STARTTIME: u16 = 2;
    pub const ISB_ENDTIME: u16 = 3;
    pub const ISB_IFRECV: u16 = 4;
    pub const ISB_FILTERACCEPT: u16 = 6;
    pub const ISB_OSDROP: u16 = 7;
    pub const ISB_USRDELIV: u16 = 8;
    /// Custom option, binary, copiable.
    pub const CUSTOM_BINARY: u16 = 2989;
}

/// Our custom blocks and options: the Private Enterprise Number, then a
/// tag saying what follows.
pub(crate) mod custom {
    /// RFC 5612's example enterprise number (none is registered for us).
    pub const PEN: u32 = 32473;
    /// Interface option, on the traced interface: clock offset (i64 ns,
    /// wall minus monotonic), ifindex (u32).
    pub const META: [u8; 4] = *b"rmet";
    /// Interface option: its packets are kernel records (each an exported
    /// PDU holding one ring-buffer record, as it came).
    pub const RECORD: [u8; 4] = *b"rrec";
    /// EPB option: the CPU (u32).
    pub const CPU: [u8; 4] = *b"rcpu";
    /// EPB option, summary mode: the flow's data segments the kernel
    /// counted without emitting them before this one (u32; absent: 0),
    /// then one past their last byte (u32; absent in older traces).
    pub const SUMMARIZED: [u8; 4] = *b"rsum";
    /// ISB option: every kernel counter (u64s, `Counters::words`).
    pub const COUNTERS: [u8; 4] = *b"rcnt";
    /// SHB option: the kernel traced on, as [`linux_lines`] writes it.
    pub const LINUX: [u8; 4] = *b"rlnx";
    /// SHB option: whether the traced receiver sends DSACKs (its
    /// `net.ipv4.tcp_dsack`, one byte: 0 or 1), which the replay's undo
    /// depends on.
    pub const DSACK: [u8; 4] = *b"rdsk";
    /// SHB option: the XDP attachment the trace was taken with
    /// (`native`, `generic`, `off`): what one of its packets is, a frame
    /// as the driver received it or what the stack took.
    pub const XDP: [u8; 4] = *b"rxdp";

    use crate::kernel::KernelReport;

    /// The release, then each thing it lacks, one per line.
    pub fn linux_lines(k: &KernelReport) -> String {
        std::iter::once(k.release.as_str())
            .chain(k.missing.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// What [`linux_lines`] wrote.
    pub fn parse_linux(b: &[u8]) -> KernelReport {
        let text = String::from_utf8_lossy(b);
        let mut lines = text.split('\n').map(String::from);
        KernelReport {
            release: lines.next().unwrap_or_default(),
            missing: lines.collect(),
        }
    }
}
