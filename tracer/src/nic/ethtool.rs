//! The kernel's ethtool ioctl (`SIOCETHTOOL`): the calls behind `ethtool
//! -i`, `--show-priv-flags`, `-k` (ntuple, TSO), `-l`, `-x` and `-S`. The
//! structures are the kernel's UAPI (`linux/ethtool.h`), stable since
//! Linux 4.x; ethtool's netlink interface has no driver statistics by name,
//! and no crate covers these calls together.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const GDRVINFO: u32 = 0x03;
const GSTRINGS: u32 = 0x1b;
const GSTATS: u32 = 0x1d;
const GTSO: u32 = 0x1e;
const GFLAGS: u32 = 0x25;
const GPFLAGS: u32 = 0x27;
const GSSET_INFO: u32 = 0x37;
const GCHANNELS: u32 = 0x3c;
const GRSSH: u32 = 0x46;
const SS_STATS: u32 = 1;
const SS_PRIV_FLAGS: u32 = 2;
const GSTRING_LEN: usize = 32;
/// `ETHTOOL_GFLAGS` bits.
const FLAG_NTUPLE: u32 = 1 << 27;
const FLAG_RXHASH: u32 = 1 << 28;

/// A socket to ask the kernel about interfaces of the network namespace
/// it was opened in.
pub struct Ethtool {
    sock: OwnedFd,
}

pub struct DriverInfo {
    pub driver: String,
    pub version: String,
    pub firmware: String,
    pub bus: String,
}

/// `ethtool -l`: (current, maximum) per kind of channel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Channels {
    pub rx: u32,
    pub tx: u32,
    pub other: u32,
    pub combined: u32,
    pub max_rx: u32,
    pub max_tx: u32,
    pub max_combined: u32,
}

/// `ethtool -x`.
pub struct RxFlowHash {
    /// `toeplitz`, `xor`, `crc32` or the driver's bits.
    pub function: String,
    pub key: Vec<u8>,
    pub indir: Vec<u32>,
}

impl Ethtool {
    pub fn open() -> io::Result<Ethtool> {
        // SAFETY: plain socket(2); the descriptor is owned from here on.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        Ok(Ethtool {
            sock: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// One ethtool command; `buf` starts with its `cmd` word and is as
    /// long as the command's structure.
    fn call(&self, iface: &str, buf: &mut [u32]) -> io::Result<()> {
        if iface.len() >= libc::IFNAMSIZ {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        // SAFETY: ifreq is plain data; zeroed is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in ifr.ifr_name.iter_mut().zip(iface.bytes()) {
            *d = s as libc::c_char;
        }
        ifr.ifr_ifru.ifru_data = buf.as_mut_ptr().cast();
        // SAFETY: the kernel writes at most the command's structure, which
        // `buf` holds (the caller sized it from the kernel's own counts).
        if unsafe { libc::ioctl(self.sock.as_raw_fd(), SIOCETHTOOL, &mut ifr) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `ethtool -k`'s `tcp-segmentation-offload`: whether the interface
    /// takes TCP packets of several segments.
    pub fn tso(&self, iface: &str) -> io::Result<bool> {
        // struct ethtool_value.
        let mut buf = [GTSO, 0];
        self.call(iface, &mut buf)?;
        Ok(buf[1] != 0)
    }

    pub fn driver(&self, iface: &str) -> io::Result<DriverInfo> {
        // struct ethtool_drvinfo: 196 bytes.
        let mut buf = [0u32; 49];
        buf[0] = GDRVINFO;
        self.call(iface, &mut buf)?;
        let bytes = words_as_bytes(&buf);
        let text = |at: usize| c_string(&bytes[at..at + 32]);
        Ok(DriverInfo {
            driver: text(4),
            version: text(36),
            firmware: text(68),
            bus: text(100),
        })
    }

    /// How many strings the driver has in `set` (0 when it has none).
    fn set_len(&self, iface: &str, set: u32) -> io::Result<usize> {
        // struct ethtool_sset_info with one data word.
        let mut buf = [0u32; 5];
        buf[0] = GSSET_INFO;
        buf[2] = 1 << set;
        self.call(iface, &mut buf)?;
        Ok(if buf[2] & (1 << set) != 0 {
            buf[4] as usize
        } else {
            0
        })
    }

    fn strings(&self, iface: &str, set: u32, n: usize) -> io::Result<Vec<String>> {
        let mut buf = vec![0u32; 3 + n * GSTRING_LEN / 4];
        buf[0] = GSTRINGS;
        buf[1] = set;
        buf[2] = n as u32;
        self.call(iface, &mut buf)?;
        let n = n.min(buf[2] as usize);
        let bytes = &words_as_bytes(&buf)[12..];
        Ok((0..n)
            .map(|i| c_string(&bytes[i * GSTRING_LEN..(i + 1) * GSTRING_LEN]))
            .collect())
    }

    /// `ethtool --show-priv-flags`: each flag and whether it is on.
    pub fn private_flags(&self, iface: &str) -> io::Result<Vec<(String, bool)>> {
        let n = self.set_len(iface, SS_PRIV_FLAGS)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let names = self.strings(iface, SS_PRIV_FLAGS, n)?;
        let mut buf = [GPFLAGS, 0];
        self.call(iface, &mut buf)?;
        Ok(names
            .into_iter()
            .enumerate()
            .map(|(i, name)| (name, i < 32 && buf[1] & (1 << i) != 0))
            .collect())
    }

    /// (ntuple filters on, receive hashing on): `ethtool -k`'s
    /// `ntuple-filters` and `receive-hashing`.
    pub fn ntuple_and_rxhash(&self, iface: &str) -> io::Result<(bool, bool)> {
        let mut buf = [GFLAGS, 0];
        self.call(iface, &mut buf)?;
        Ok((buf[1] & FLAG_NTUPLE != 0, buf[1] & FLAG_RXHASH != 0))
    }

    pub fn channels(&self, iface: &str) -> io::Result<Channels> {
        let mut buf = [0u32; 9];
        buf[0] = GCHANNELS;
        self.call(iface, &mut buf)?;
        Ok(Channels {
            max_rx: buf[1],
            max_tx: buf[2],
            max_combined: buf[4],
            rx: buf[5],
            tx: buf[6],
            other: buf[7],
            combined: buf[8],
        })
    }

    /// `ethtool -x`: the RSS hash function, key and indirection table.
    pub fn rx_flow_hash(&self, iface: &str) -> io::Result<RxFlowHash> {
        // struct ethtool_rxfh: 24 bytes, then the table and the key.
        let mut head = [0u32; 6];
        head[0] = GRSSH;
        self.call(iface, &mut head)?;
        let (indir_size, key_size) = (head[2] as usize, head[3] as usize);
        let mut buf = vec![0u32; 6 + indir_size + key_size.div_ceil(4)];
        buf[0] = GRSSH;
        buf[2] = indir_size as u32;
        buf[3] = key_size as u32;
        self.call(iface, &mut buf)?;
        let hfunc = buf[4] & 0xff;
        let function = match hfunc {
            1 => "toeplitz".to_string(),
            2 => "xor".to_string(),
            4 => "crc32".to_string(),
            0 => "unknown".to_string(),
            bits => format!("{bits:#x}"),
        };
        let indir = buf[6..6 + indir_size].to_vec();
        let key = words_as_bytes(&buf[6 + indir_size..])[..key_size].to_vec();
        Ok(RxFlowHash {
            function,
            key,
            indir,
        })
    }

    /// `ethtool -S`: the driver's statistics by name.
    pub fn statistics(&self, iface: &str) -> io::Result<Vec<(String, u64)>> {
        let n = self.set_len(iface, SS_STATS)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let names = self.strings(iface, SS_STATS, n)?;
        // struct ethtool_stats: cmd, n_stats, then n u64s.
        let mut buf = vec![0u32; 2 + 2 * n];
        buf[0] = GSTATS;
        buf[1] = n as u32;
        self.call(iface, &mut buf)?;
        let n = n.min(buf[1] as usize);
        Ok(names
            .into_iter()
            .take(n)
            .enumerate()
            .map(|(i, name)| {
                let (lo, hi) = (buf[2 + 2 * i], buf[3 + 2 * i]);
                let v = if cfg!(target_endian = "little") {
                    u64::from(lo) | u64::from(hi) << 32
                } else {
                    u64::from(hi) | u64::from(lo) << 32
                };
                (name, v)
            })
            .collect())
    }
}

fn words_as_bytes(words: &[u32]) -> &[u8] {
    // SAFETY: u32s viewed as their bytes, in memory order.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), words.len() * 4) }
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}
