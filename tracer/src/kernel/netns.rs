//! Switching the calling thread into a named network namespace and back.
//!
//! `ip netns exec` remounts /sys and hides tracefs, so the tracer switches
//! in-process with setns(2). The switch is per thread: sockets and netlink
//! requests made while inside stay bound to that namespace afterwards.

use std::{
    fs::File,
    os::fd::AsRawFd,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::SetupError;

/// Where `ip netns add NAME` puts its namespace handles.
pub const NETNS_RUN_DIR: &str = "/run/netns";

pub fn path_of(name: &str) -> PathBuf {
    Path::new(NETNS_RUN_DIR).join(name)
}

/// While alive, the calling thread is in another network namespace; on drop
/// it returns to the one it came from.
#[must_use = "the thread leaves the namespace when the guard drops"]
pub struct NetnsGuard {
    original: File,
}

impl NetnsGuard {
    /// Moves the calling thread into the namespace `name` (under /run/netns).
    pub fn enter(name: &str) -> Result<Self, SetupError> {
        let target = File::open(path_of(name)).map_err(|e| SetupError::UnknownNetns {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        let original = File::open("/proc/thread-self/ns/net").map_err(|e| {
            SetupError::Environment(format!("cannot open /proc/thread-self/ns/net: {e}"))
        })?;
        setns(&target).map_err(|e| SetupError::UnknownNetns {
            name: name.to_string(),
            reason: format!("setns: {e}"),
        })?;
        Ok(Self { original })
    }

    /// Enters `name` if given, otherwise stays where the thread is.
    pub fn enter_opt(name: Option<&str>) -> Result<Option<Self>, SetupError> {
        name.map(Self::enter).transpose()
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Err(e) = setns(&self.original) {
            // Staying in the wrong namespace would misdirect everything
            // after; there is no safe way to continue.
            eprintln!("tracer: cannot return to the original network namespace: {e}");
            std::process::abort();
        }
    }
}

fn setns(ns: &File) -> std::io::Result<()> {
    // SAFETY: plain syscall on an open namespace fd.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A sysctl of network namespace `netns` (None: the calling thread's), as
/// `/proc/sys` shows it to a thread inside it (`net.ipv4.tcp_dsack`);
/// None if it cannot be read.
pub fn sysctl(netns: Option<&str>, knob: &str) -> Option<String> {
    let _inside = NetnsGuard::enter_opt(netns).ok()?;
    let path = format!("/proc/sys/{}", knob.replace('.', "/"));
    std::fs::read_to_string(path)
        .ok()
        .map(|v| v.trim().to_string())
}

/// The inode number of the calling thread's network namespace: the value
/// the kernel keeps in `net->ns.inum`.
pub fn current_inum() -> std::io::Result<u32> {
    Ok(std::fs::metadata("/proc/thread-self/ns/net")?.ino() as u32)
}
