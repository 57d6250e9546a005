//! The pcapng trace (`--out FILE.pcapng`): what Wireshark and tshark open,
//! and what `tracer analyze` reads back into the same report.
//!
//! * One section in this host's byte order, two interfaces: the traced one
//!   (its name, nanosecond timestamps) and one for the kernel's TCP-layer
//!   records.
//! * Each segment an enhanced packet block: the frame's first bytes as XDP
//!   copied them (the headers, or `--snaplen`), inbound, the RX queue in
//!   `epb_queue` (tshark's `frame.interface_queue`), the CPU in a custom
//!   option. Timestamps are the kernel's (CLOCK_MONOTONIC) moved onto the
//!   wall clock; a custom option on the interface says by how much.
//! * Each TCP-layer event (`tcp_probe`, local retransmissions) a packet on
//!   the second interface: Wireshark's "exported PDU" link type, naming the
//!   event in the protocol column, then the kernel's record as it came from
//!   the ring buffer. (As packets, they have times: custom blocks, which
//!   Wireshark lists as timeless frames, would break its time columns.)
//! * An interface statistics block every second and at the end: frames
//!   seen (`isb_ifrecv`), segments passed (`isb_filteraccept`), events the
//!   kernel lost (`isb_osdrop`), packets written (`isb_usrdeliv`), and every
//!   kernel counter in a custom option, so the file says what is missing.
//!
//! Custom options carry the Private Enterprise Number 32473 (RFC 5612's
//! example number: this tool has none registered) and a four-byte tag
//! naming what follows. Blocks are written whole and the file
//! is flushed every second: after a crash it reads up to its last complete
//! block, and the reader says where it ends.
//!
//! `watch --pcapng DIR` writes a ring instead ([`PcapngWriter::ring`], as
//! `tcpdump -C -W`): files of at most M MiB, the latest N kept, each a
//! whole trace of its own (section, interfaces, statistics at its end).

use std::{
    fs::{File, OpenOptions},
    io::{BufWriter, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use anyhow::Result;
use jiff::Timestamp;

use crate::{
    kernel::{AttachedMode, Counters, KernelReport},
    output::KeptFiles,
    sink::Sink,
    source::{
        format::{block, custom, exported_pdu, linktype, opt, BYTE_ORDER, PCAPNG_SHB},
        Frame, Observation, Raw,
    },
    SetupError,
};
use tracer_common::{counter, CAPTURE_MAX};

/// The traced interface, as the file describes it.
pub struct Interface {
    pub name: String,
    /// Said in the interface's description (e.g. "veth-s in netns lab").
    pub description: String,
    pub ifindex: u32,
    /// The kernel traced on: the section says its release (`shb_os`) and,
    /// in a custom option, what it lacks.
    pub kernel: KernelReport,
    /// Whether the receiver sends DSACKs, when read from its host.
    pub receiver_dsack: Option<bool>,
    /// The XDP attachment the trace is taken with.
    pub xdp: AttachedMode,
}

pub struct PcapngWriter {
    path: PathBuf,
    out: BufWriter<File>,
    iface: Interface,
    /// Bytes handed to `out` (whole blocks), this file.
    written: u64,
    /// Packets and TCP-layer records, all files.
    packets: u64,
    records: u64,
    /// Those of earlier files.
    packets_before: u64,
    records_before: u64,
    /// The kernel's counters when last flushed: a ring file's closing
    /// statistics.
    counters: Counters,
    /// This file's section and interface headers.
    header_bytes: u64,
    ring: Option<Ring>,
    /// Wall clock minus CLOCK_MONOTONIC, ns: added to the kernel's times.
    clock_offset: i64,
    started_ns: u64,
    block: Vec<u8>,
    /// The first write error and the file's length then; nothing more is
    /// written after it (tracing goes on).
    failed: Option<(u64, std::io::Error)>,
}

impl PcapngWriter {
    /// Starts the trace in `file` (an [`crate::output::OutputFile`]
    /// started once the tracer is attached): the section and interface
    /// headers, naming the traced interface, and the clock's offset.
    pub fn create(path: &Path, file: File, iface: Interface) -> Result<Self> {
        let (wall, mono) = (
            clock_ns(libc::CLOCK_REALTIME),
            clock_ns(libc::CLOCK_MONOTONIC),
        );
        let mut w = Self {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
            iface,
            written: 0,
            packets: 0,
            records: 0,
            packets_before: 0,
            records_before: 0,
            counters: Counters::default(),
            header_bytes: 0,
            ring: None,
            clock_offset: wall as i64 - mono as i64,
            started_ns: wall,
            block: Vec::with_capacity(CAPTURE_MAX + 256),
            failed: None,
        };
        w.begin()?;
        Ok(w)
    }

    /// The trace as a ring in `kept`'s directory: files
    /// `trace-TIME-NUMBER.pcapng` of at most `file_bytes` each (mode 0600),
    /// the latest kept (those of an earlier run found there count among
    /// them, the oldest removed first).
    pub fn ring(kept: KeptFiles, file_bytes: u64, iface: Interface) -> Result<Self> {
        let dir = kept.dir().to_path_buf();
        let mut ring = Ring {
            kept,
            file_bytes,
            number: 0,
        };
        let (path, file) = ring.next().map_err(|e| SetupError::BadOutput {
            path: dir.display().to_string(),
            reason: e.to_string(),
        })?;
        let mut w = Self::create(&path, file, iface)?;
        ring.made(&path);
        w.ring = Some(ring);
        Ok(w)
    }

    /// The traced interface came back (a new one, of the same name): a
    /// ring begins its next file, naming it.
    pub fn attached_again(&mut self, ifindex: u32) {
        self.iface.ifindex = ifindex;
        if self.ring.is_some() {
            self.next_file();
        }
    }

    /// Ends the ring's file under way (its statistics; a line on stderr)
    /// and begins the next; the oldest beyond the ring's count go. A file
    /// that cannot be made is said once, and each second tries again.
    fn next_file(&mut self) {
        let ended = self.failed.is_none().then(|| {
            let counters = self.counters;
            let isb = self.statistics(&counters);
            self.put(isb);
            self.flush_out();
            format!(
                "{}: {} packets, {} TCP-layer records, {} bytes",
                self.path.display(),
                self.packets - self.packets_before,
                self.records - self.records_before,
                self.written
            )
        });
        let ring = self.ring.as_mut().expect("a ring");
        let (path, file) = match ring.next() {
            Ok(next) => next,
            Err(e) => {
                if self.failed.is_none() {
                    self.fail(e);
                }
                return;
            }
        };
        let removed = ring.made(&path);
        let resumed = self.failed.take().is_some();
        self.path = path;
        self.out = BufWriter::with_capacity(1 << 20, file);
        self.written = 0;
        (self.packets_before, self.records_before) = (self.packets, self.records);
        // (The run's one clock offset: every file on the same timeline,
        // whatever the wall clock did since.)
        self.started_ns = clock_ns(libc::CLOCK_REALTIME);
        // A failure here is kept, said, and retried as any other.
        let _ = self.begin();
        let removed: String = removed
            .iter()
            .map(|p| format!("; removed {}", p.display()))
            .collect();
        match ended {
            Some(ended) => eprintln!(
                "tracer: pcapng {ended}; next {}{removed}",
                self.path.display()
            ),
            None if resumed => eprintln!(
                "tracer: pcapng: writing again, to {}{removed}",
                self.path.display()
            ),
            None => {}
        }
    }

    /// A ring's file ends before a block of `len` bytes would leave no
    /// room for its closing statistics: none is over the ring's size.
    fn make_room(&mut self, len: usize) {
        let full = self.ring.as_ref().is_some_and(|r| {
            self.written > self.header_bytes
                && self.written + len as u64 + CLOSING_ROOM > r.file_bytes
        });
        if full {
            self.next_file();
        }
    }

    /// The section and interface headers, naming the traced interface.
    fn begin(&mut self) -> Result<()> {
        let kernel = &self.iface.kernel;
        let mut b = Blocks::new(PCAPNG_SHB);
        b.u32(BYTE_ORDER);
        b.u16(1);
        b.u16(0);
        b.u64(u64::MAX); // section length: not given
        b.option_str(opt::COMMENT, COMMENT);
        b.option_str(opt::SHB_OS, &format!("Linux {}", kernel.release));
        b.option_str(
            opt::SHB_USERAPPL,
            concat!("tracer ", env!("CARGO_PKG_VERSION")),
        );
        let mut linux = custom::PEN.to_ne_bytes().to_vec();
        linux.extend(custom::LINUX);
        linux.extend(custom::linux_lines(kernel).as_bytes());
        b.option(opt::CUSTOM_BINARY, &linux);
        if let Some(dsack) = self.iface.receiver_dsack {
            let mut d = custom::PEN.to_ne_bytes().to_vec();
            d.extend(custom::DSACK);
            d.push(u8::from(dsack));
            b.option(opt::CUSTOM_BINARY, &d);
        }
        let mut xdp = custom::PEN.to_ne_bytes().to_vec();
        xdp.extend(custom::XDP);
        xdp.extend(self.iface.xdp.to_string().as_bytes());
        b.option(opt::CUSTOM_BINARY, &xdp);
        b.end_options();
        self.put(b);

        let mut meta = custom::PEN.to_ne_bytes().to_vec();
        meta.extend(custom::META);
        meta.extend(self.clock_offset.to_ne_bytes());
        meta.extend(self.iface.ifindex.to_ne_bytes());
        let traced = Self::interface(
            linktype::ETHERNET,
            &self.iface.name,
            &self.iface.description,
            &meta,
        );
        self.put(traced);
        let mut records = custom::PEN.to_ne_bytes().to_vec();
        records.extend(custom::RECORD);
        let records = Self::interface(
            linktype::UPPER_PDU,
            "tcp-layer",
            "the kernel's TCP-layer events (tcp_probe, tcp_retransmit_skb) as tracer records, for `tracer analyze`",
            &records,
        );
        self.put(records);
        self.header_bytes = self.written;
        self.flush_out();
        self.check()
    }

    fn interface(linktype: u32, name: &str, description: &str, ours: &[u8]) -> Blocks {
        let mut b = Blocks::new(block::IDB);
        b.u16(linktype as u16);
        b.u16(0);
        b.u32(CAPTURE_MAX as u32);
        b.option_str(opt::IF_NAME, name);
        b.option_str(opt::IF_DESCRIPTION, description);
        b.option(opt::IF_TSRESOL, &[9]);
        b.option(opt::CUSTOM_BINARY, ours);
        b.end_options();
        b
    }

    /// Packets written, and TCP-layer records.
    pub fn written(&self) -> (u64, u64) {
        (self.packets, self.records)
    }

    /// The file under way.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A ring's directory and the files this run began in it.
    pub fn ring_files(&self) -> Option<(&Path, u64)> {
        self.ring.as_ref().map(|r| (r.kept.dir(), r.number))
    }

    /// What went wrong writing, if anything: one line for the summary.
    pub fn failure(&self) -> Option<String> {
        self.failed.as_ref().map(|(at, e)| {
            format!(
                "writing {} failed after {at} bytes: {e}; the file keeps what was written (`tracer analyze` reads it to its last whole block)",
                self.path.display(),
            )
        })
    }

    fn packet(&mut self, s: &crate::source::Segment, frame: &Frame) {
        let mut b = Blocks::reuse(block::EPB, std::mem::take(&mut self.block));
        let ts = self.wall_ns(s.ts_ns);
        b.u32(0);
        b.u32((ts >> 32) as u32);
        b.u32(ts as u32);
        b.u32(frame.data.len() as u32);
        b.u32(frame.wire_len);
        b.bytes(frame.data);
        b.pad();
        b.option(opt::EPB_FLAGS, &EPB_INBOUND.to_ne_bytes());
        b.option(opt::EPB_QUEUE, &s.rx_queue.to_ne_bytes());
        let mut cpu = [0u8; 12];
        cpu[..4].copy_from_slice(&custom::PEN.to_ne_bytes());
        cpu[4..8].copy_from_slice(&custom::CPU);
        cpu[8..].copy_from_slice(&s.cpu.to_ne_bytes());
        b.option(opt::CUSTOM_BINARY, &cpu);
        if s.summarized_before > 0 {
            let mut n = [0u8; 16];
            n[..4].copy_from_slice(&custom::PEN.to_ne_bytes());
            n[4..8].copy_from_slice(&custom::SUMMARIZED);
            n[8..12].copy_from_slice(&s.summarized_before.to_ne_bytes());
            let len = match s.summarized_end {
                Some(end) => {
                    n[12..].copy_from_slice(&end.to_ne_bytes());
                    16
                }
                None => 12,
            };
            b.option(opt::CUSTOM_BINARY, &n[..len]);
        }
        b.end_options();
        self.make_room(b.len());
        self.block = self.put(b);
        self.packets += 1;
    }

    /// A kernel record (a TCP-layer event, or a segment whose frame bytes
    /// were not captured) as a packet on the records' interface.
    fn record(&mut self, obs: &Observation, raw: &[u8]) {
        let mut b = Blocks::reuse(block::EPB, std::mem::take(&mut self.block));
        let ts = self.wall_ns(obs.ts_ns());
        let name: &[u8] = match obs {
            Observation::Segment(_) => b"xdp_segment",
            Observation::TcpProbe(_) => b"tcp_probe",
            Observation::Retransmit(_) => b"tcp_retransmit",
        };
        let pdu_len = exported_pdu::header_len(name) + raw.len();
        b.u32(RECORDS_INTERFACE);
        b.u32((ts >> 32) as u32);
        b.u32(ts as u32);
        b.u32(pdu_len as u32);
        b.u32(pdu_len as u32);
        exported_pdu::header(&mut b.0, name);
        b.bytes(raw);
        b.pad();
        b.end_options();
        self.make_room(b.len());
        self.block = self.put(b);
        self.records += 1;
    }

    /// An interface statistics block: the kernel's counters `c`, the
    /// packets written so far (all files).
    fn statistics(&self, c: &Counters) -> Blocks {
        let mut b = Blocks::new(block::ISB);
        let now = clock_ns(libc::CLOCK_REALTIME);
        b.u32(0);
        b.u32((now >> 32) as u32);
        b.u32(now as u32);
        let time = |t: u64| [((t >> 32) as u32).to_ne_bytes(), (t as u32).to_ne_bytes()].concat();
        b.option(opt::ISB_STARTTIME, &time(self.started_ns));
        b.option(opt::ISB_ENDTIME, &time(now));
        b.option(opt::ISB_IFRECV, &c.get(counter::XDP_FRAMES).to_ne_bytes());
        let accepted =
            c.get(counter::XDP_TCP) - c.get(counter::XDP_FILTERED).min(c.get(counter::XDP_TCP));
        b.option(opt::ISB_FILTERACCEPT, &accepted.to_ne_bytes());
        b.option(opt::ISB_OSDROP, &c.dropped().to_ne_bytes());
        b.option(opt::ISB_USRDELIV, &self.packets.to_ne_bytes());
        b.option_str(
            opt::COMMENT,
            &format!(
                "events the kernel lost: {} (ring buffer full {}, tracepoint runs missed {})",
                c.dropped(),
                c.ring_full(),
                c.probe_lost() + c.rtx_lost()
            ),
        );
        let mut words = custom::PEN.to_ne_bytes().to_vec();
        words.extend(custom::COUNTERS);
        for w in c.words() {
            words.extend(w.to_ne_bytes());
        }
        b.option(opt::CUSTOM_BINARY, &words);
        b.end_options();
        b
    }

    fn wall_ns(&self, mono_ns: u64) -> u64 {
        (mono_ns as i64).saturating_add(self.clock_offset) as u64
    }

    /// Appends a finished block; gives its buffer back for reuse.
    fn put(&mut self, b: Blocks) -> Vec<u8> {
        let bytes = b.finish();
        if self.failed.is_none() {
            match self.out.write_all(&bytes) {
                Ok(()) => self.written += bytes.len() as u64,
                Err(e) => self.fail(e),
            }
        }
        bytes
    }

    fn flush_out(&mut self) {
        if self.failed.is_none() {
            if let Err(e) = self.out.flush() {
                self.fail(e);
            }
        }
    }

    fn fail(&mut self, e: std::io::Error) {
        // What reached the file (the buffer may have written part of itself).
        let at = self
            .out
            .get_ref()
            .metadata()
            .map_or(self.written, |m| m.len());
        log::warn!(
            "writing {} failed after {at} bytes: {e}; tracing goes on, the file keeps what was written",
            self.path.display(),
        );
        self.failed = Some((at, e));
    }

    fn check(&self) -> Result<()> {
        match self.failure() {
            Some(f) => Err(SetupError::BadOutput {
                path: self.path.display().to_string(),
                reason: f,
            }
            .into()),
            None => Ok(()),
        }
    }
}

impl Sink for PcapngWriter {
    fn observe(&mut self, obs: &Observation, raw: &Raw) {
        if self.failed.is_some() {
            return;
        }
        match (obs, &raw.frame) {
            (Observation::Segment(s), Some(f)) => self.packet(s, f),
            _ => self.record(obs, raw.record),
        }
    }

    /// Statistics, then everything out to the file. A write error is kept
    /// for the summary ([`PcapngWriter::failure`]), not raised: the run and
    /// its report go on.
    fn flush(&mut self, counters: &Counters) -> Result<()> {
        self.counters = *counters;
        if self.failed.is_none() {
            let isb = self.statistics(counters);
            self.make_room(isb.len());
            if self.failed.is_none() {
                self.put(isb);
                self.flush_out();
            }
        } else if self.ring.is_some() {
            self.next_file();
        }
        Ok(())
    }

    /// A ring makes its directory again if it went, takes its files as
    /// they are and begins its next file; a single trace goes on.
    fn reopen(&mut self) -> Result<()> {
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        ring.kept.reopen()?;
        self.next_file();
        match self.failure() {
            Some(f) => Err(anyhow::anyhow!(f)),
            None => Ok(()),
        }
    }
}

const COMMENT: &str = "recorded by tracer: TCP segments received, tagged in the kernel by XDP \
(interface 0): RX queue in epb_queue (frame.interface_queue), CPU in a custom option (PEN 32473); \
the kernel's TCP-layer events on interface 1 (tcp_probe, retransmissions); kernel counters in \
the statistics blocks";

/// `watch --pcapng`'s files: where they go, how big each may grow.
struct Ring {
    kept: KeptFiles,
    file_bytes: u64,
    /// Files begun by this run.
    number: u64,
}

impl Ring {
    /// The next file, made (mode 0600) and named by its start and number.
    fn next(&mut self) -> std::io::Result<(PathBuf, File)> {
        let path = self.kept.path(&format!(
            "{}-{:06}",
            Timestamp::now().strftime("%Y%m%dT%H%M%SZ"),
            self.number + 1
        ));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        self.number += 1;
        Ok((path, file))
    }

    /// `path` begun: the files beyond the ring's count removed.
    fn made(&mut self, path: &Path) -> Vec<PathBuf> {
        self.kept.made(path.to_path_buf())
    }
}

/// The ring's files are named `trace-TIME-NUMBER.pcapng`.
pub const RING_PREFIX: &str = "trace-";

/// What a ring's file keeps free for its closing statistics block (about
/// 500 bytes: its counters and a comment).
const CLOSING_ROOM: u64 = 4096;

/// The interface the kernel records are written on.
const RECORDS_INTERFACE: u32 = 1;

/// `epb_flags`: direction inbound.
const EPB_INBOUND: u32 = 0b01;

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One block being built: type, a length to fill in, body, options.
struct Blocks(Vec<u8>);

impl Blocks {
    fn new(kind: u32) -> Self {
        Self::reuse(kind, Vec::with_capacity(256))
    }

    /// Its length once finished.
    fn len(&self) -> usize {
        self.0.len() + 4
    }

    fn reuse(kind: u32, mut buf: Vec<u8>) -> Self {
        buf.clear();
        buf.extend(kind.to_ne_bytes());
        buf.extend(0u32.to_ne_bytes());
        Self(buf)
    }

    fn u16(&mut self, v: u16) {
        self.0.extend(v.to_ne_bytes());
    }

    fn u32(&mut self, v: u32) {
        self.0.extend(v.to_ne_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.0.extend(v.to_ne_bytes());
    }

    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }

    fn pad(&mut self) {
        let n = self.0.len().next_multiple_of(4);
        self.0.resize(n, 0);
    }

    fn option(&mut self, code: u16, value: &[u8]) {
        self.u16(code);
        self.u16(value.len() as u16);
        self.bytes(value);
        self.pad();
    }

    fn option_str(&mut self, code: u16, value: &str) {
        self.option(code, value.as_bytes());
    }

    fn end_options(&mut self) {
        self.option(opt::END, &[]);
    }

    /// The block with both its lengths.
    fn finish(mut self) -> Vec<u8> {
        let total = (self.0.len() + 4) as u32;
        self.u32(total);
        self.0[4..8].copy_from_slice(&total.to_ne_bytes());
        self.0
    }
}
