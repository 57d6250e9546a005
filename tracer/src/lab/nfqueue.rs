//! A minimal NFQUEUE client (netfilter's `nfnetlink_queue`): packets an
//! iptables `NFQUEUE` rule hands to userspace, and the verdicts that let
//! them go. Its own netlink, because the lab needs what the `nfq` crate
//! lacks: a descriptor to wait on with a deadline, the kernel's receive
//! stamp of each packet, and batch verdicts (one syscall lets a whole run
//! of held packets go, in order).

use std::{
    collections::VecDeque,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQNL_MSG_VERDICT_BATCH: u16 = 3;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_TIMESTAMP: u16 = 4;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_META: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;
const NF_ACCEPT: u32 = 1;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
/// Attribute type bits that are flags, not the type.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// One queued packet.
#[derive(Clone, Debug)]
pub struct Packet {
    pub id: u32,
    /// When the kernel received it (`CLOCK_REALTIME`, microseconds), if
    /// the kernel stamped it (see [`NfQueue::stamp_packets`]).
    pub received_us: Option<i64>,
    /// Its first bytes from the IP header on (as many as the queue copies).
    pub payload: Vec<u8>,
}

/// A bound queue in the namespace the opening thread was in.
pub struct NfQueue {
    fd: OwnedFd,
    num: u16,
    buf: Vec<u8>,
    /// Keeps the kernel stamping received packets, while it is open.
    _stamping: Option<OwnedFd>,
}

impl NfQueue {
    /// Binds queue `num`, copying the first `copy` bytes of each packet
    /// (0: none), holding at most `max_len` packets (more are dropped and
    /// counted by the kernel).
    pub fn open(num: u16, copy: u16, max_len: u32) -> io::Result<Self> {
        // SAFETY: plain socket calls on a descriptor this function owns.
        let fd = unsafe {
            let fd = libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_NETFILTER,
            );
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: `addr` is a valid sockaddr_nl of the given size.
        if unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_nl>() as u32,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        // Room for bursts; an overflow drops packets, which the kernel
        // counts (`user_dropped`) rather than failing our receive.
        set_int(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 64 << 20)?;
        set_int(&fd, libc::SOL_NETLINK, libc::NETLINK_NO_ENOBUFS, 1)?;
        let mut queue = Self {
            fd,
            num,
            buf: vec![0; 65536 + 4096],
            _stamping: None,
        };
        queue.config(&attr(NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0]))?;
        let mut params = u32::from(copy).to_be_bytes().to_vec();
        params.push(if copy == 0 {
            NFQNL_COPY_META
        } else {
            NFQNL_COPY_PACKET
        });
        queue.config(&attr(NFQA_CFG_PARAMS, &params))?;
        queue.config(&attr(NFQA_CFG_QUEUE_MAXLEN, &max_len.to_be_bytes()))?;
        Ok(queue)
    }

    /// Makes the kernel stamp every packet it receives (any socket asking
    /// for receive timestamps turns that on system-wide), so that
    /// [`Packet::received_us`] is when the packet arrived, not when this
    /// process got to it.
    pub fn stamp_packets(&mut self) -> io::Result<()> {
        // SAFETY: a fresh UDP socket owned here.
        let fd = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        set_int(&fd, libc::SOL_SOCKET, libc::SO_TIMESTAMP, 1)?;
        self._stamping = Some(fd);
        Ok(())
    }

    /// Waits until a packet may be ready or `timeout` has passed.
    pub fn wait(&self, timeout: Duration) -> io::Result<()> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd, a valid timespec, no signal mask.
        if unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Every packet queued so far, without waiting, appended to `out`.
    pub fn drain(&mut self, out: &mut VecDeque<Packet>) -> io::Result<()> {
        while let Some(n) = self.recv(libc::MSG_DONTWAIT)? {
            for (kind, body) in messages(&self.buf[..n]) {
                if kind == (NFNL_SUBSYS_QUEUE << 8 | NFQNL_MSG_PACKET) {
                    if let Some(p) = packet(body) {
                        out.push_back(p);
                    }
                }
            }
        }
        Ok(())
    }

    /// One datagram into `buf`: its length, or `None` when none is
    /// waiting (with `MSG_DONTWAIT`).
    fn recv(&mut self, flags: i32) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: receives into our own buffer of the given length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    flags,
                )
            };
            if n >= 0 {
                return Ok(Some(n as usize));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(None),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
    }

    /// Lets packet `id` go on.
    pub fn accept(&self, id: u32) -> io::Result<()> {
        self.verdict(NFQNL_MSG_VERDICT, id)
    }

    /// Lets every held packet up to and including `id` go on, in the
    /// order they came.
    pub fn accept_through(&self, id: u32) -> io::Result<()> {
        self.verdict(NFQNL_MSG_VERDICT_BATCH, id)
    }

    fn verdict(&self, msg: u16, id: u32) -> io::Result<()> {
        let mut hdr = NF_ACCEPT.to_be_bytes().to_vec();
        hdr.extend_from_slice(&id.to_be_bytes());
        self.send(msg, NLM_F_REQUEST, &attr(NFQA_VERDICT_HDR, &hdr))
    }

    /// Sends a configuration message and waits for the kernel's answer.
    fn config(&mut self, attrs: &[u8]) -> io::Result<()> {
        self.send(NFQNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, attrs)?;
        loop {
            let Some(n) = self.recv(0)? else { continue };
            for (kind, body) in messages(&self.buf[..n]) {
                if kind == NLMSG_ERROR {
                    let code = i32::from_ne_bytes(
                        body.get(..4)
                            .and_then(|b| b.try_into().ok())
                            .unwrap_or([0; 4]),
                    );
                    return if code == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(-code))
                    };
                }
            }
        }
    }

    fn send(&self, msg: u16, flags: u16, attrs: &[u8]) -> io::Result<()> {
        let len = 16 + 4 + attrs.len();
        let mut m = Vec::with_capacity(len);
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&(NFNL_SUBSYS_QUEUE << 8 | msg).to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&[0; 8]); // sequence number, port id
                                      // nfgenmsg: AF_UNSPEC, version 0, the queue number (big-endian).
        m.extend_from_slice(&[0, 0]);
        m.extend_from_slice(&self.num.to_be_bytes());
        m.extend_from_slice(attrs);
        // SAFETY: sends our own buffer to the kernel (the zeroed address).
        let n = unsafe { libc::send(self.fd.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn set_int(fd: &OwnedFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: an int option of the right size.
    if unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            size_of::<i32>() as u32,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A netlink attribute, padded to 4 bytes.
fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut a = Vec::with_capacity(len.next_multiple_of(4));
    a.extend_from_slice(&(len as u16).to_ne_bytes());
    a.extend_from_slice(&kind.to_ne_bytes());
    a.extend_from_slice(payload);
    a.resize(len.next_multiple_of(4), 0);
    a
}

/// The netlink messages in a datagram: (type, what follows the header).
fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u32::from_ne_bytes(buf.get(..4)?.try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(buf.get(4..6)?.try_into().ok()?);
        let body = buf.get(16..len)?;
        buf = buf.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((kind, body))
    })
}

/// A packet message (after its netlink header): the nfgenmsg, then
/// attributes.
fn packet(body: &[u8]) -> Option<Packet> {
    let mut attrs = body.get(4..)?;
    let mut p = Packet {
        id: 0,
        received_us: None,
        payload: Vec::new(),
    };
    let mut has_id = false;
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes(attrs[..2].try_into().ok()?));
        let kind = u16::from_ne_bytes(attrs[2..4].try_into().ok()?) & NLA_TYPE_MASK;
        let value = attrs.get(4..len)?;
        match kind {
            NFQA_PACKET_HDR => {
                p.id = u32::from_be_bytes(value.get(..4)?.try_into().ok()?);
                has_id = true;
            }
            NFQA_TIMESTAMP => {
                let sec = i64::from_be_bytes(value.get(..8)?.try_into().ok()?);
                let usec = i64::from_be_bytes(value.get(8..16)?.try_into().ok()?);
                p.received_us = Some(sec * 1_000_000 + usec);
            }
            NFQA_PAYLOAD => p.payload = value.to_vec(),
            _ => {}
        }
        attrs = attrs.get(len.next_multiple_of(4)..).unwrap_or_default();
    }
    has_id.then_some(p)
}

/// What the kernel counted for queue `num` in the calling thread's
/// namespace: (packets dropped because the queue was full, packets it
/// could not hand to userspace).
pub fn dropped(num: u16) -> io::Result<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/thread-self/net/netfilter/nfnetlink_queue")?;
    // queue_num portid queue_total copy_mode copy_range queue_dropped
    // user_dropped id_sequence 1
    for line in text.lines() {
        let f: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        if f.len() >= 7 && f[0] == u64::from(num) {
            return Ok((f[5], f[6]));
        }
    }
    Ok((0, 0))
}

/// `CLOCK_REALTIME` in microseconds, the clock of the kernel's stamps.
pub fn now_us() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000 + ts.tv_nsec / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_packet_message() {
        // nfgenmsg, then the packet header (id 7), a stamp and 3 bytes.
        let mut body = vec![0, 0, 0, 1];
        body.extend(attr(NFQA_PACKET_HDR, &[0, 0, 0, 7, 8, 0, 2]));
        let mut ts = 5i64.to_be_bytes().to_vec();
        ts.extend(250i64.to_be_bytes());
        body.extend(attr(NFQA_TIMESTAMP, &ts));
        body.extend(attr(NFQA_PAYLOAD, &[0x45, 0, 0]));
        let p = packet(&body).unwrap();
        assert_eq!(p.id, 7);
        assert_eq!(p.received_us, Some(5_000_250));
        assert_eq!(p.payload, [0x45, 0, 0]);
        assert!(
            packet(&[0, 0, 0, 1]).is_none(),
            "no packet header, no packet"
        );
    }
}
