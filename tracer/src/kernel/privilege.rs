//! Least privilege once attached: the process keeps only the capabilities
//! that attaching again needs (none when it will not attach again), and
//! can become another user. Reading its maps and ring, writing its reports
//! and serving metrics need none.
//!
//! Capabilities are per thread: [`keep_only`] must run while the calling
//! thread is the process's only one (the metrics thread starts after it).

use std::{ffi::CString, fmt};

use anyhow::{bail, Context, Result};

use crate::SetupError;

/// A capability the tracer may keep (numbers from linux/capability.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// Attaching XDP to an interface.
    NetAdmin = 12,
    /// Entering a named network namespace again (setns).
    SysAdmin = 21,
    /// Loading tracing programs (tp_btf).
    Perfmon = 38,
    /// Loading programs and making maps.
    Bpf = 39,
}

impl Cap {
    pub fn bit(self) -> u64 {
        1 << self as u32
    }
}

impl fmt::Display for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NetAdmin => "CAP_NET_ADMIN",
            Self::SysAdmin => "CAP_SYS_ADMIN",
            Self::Perfmon => "CAP_PERFMON",
            Self::Bpf => "CAP_BPF",
        })
    }
}

/// What attaching again needs: loading the programs and maps, attaching
/// XDP, and with a named namespace, entering it.
pub fn to_attach_again(netns: bool) -> Vec<Cap> {
    let mut caps = vec![Cap::Bpf, Cap::Perfmon, Cap::NetAdmin];
    if netns {
        caps.push(Cap::SysAdmin);
    }
    caps
}

/// A user to become (`--user`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl User {
    /// Who the process is now: "root", or "user NAME".
    pub fn current() -> String {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if uid == 0 {
            return "root".into();
        }
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is to a live buffer of the length given;
        // pw_name points into `buf` when found.
        unsafe {
            if libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) == 0
                && !found.is_null()
            {
                let name = std::ffi::CStr::from_ptr(pwd.pw_name).to_string_lossy();
                return format!("user {name}");
            }
        }
        format!("uid {uid}")
    }

    /// Looks `name` up in the user database.
    pub fn named(name: &str) -> Result<Self, SetupError> {
        let unknown = |why: String| SetupError::BadArgument(format!("--user {name}: {why}"));
        let c = CString::new(name).map_err(|_| unknown("not a user name".into()))?;
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is to a live buffer of the length given.
        let rc = unsafe {
            libc::getpwnam_r(
                c.as_ptr(),
                &mut pwd,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        if rc != 0 || found.is_null() {
            return Err(unknown(
                "no such user (make one, e.g. `useradd --system tracer`)".into(),
            ));
        }
        Ok(Self {
            name: name.to_string(),
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
        })
    }
}

/// Becomes `user` (if given; no supplementary groups) keeping `caps`
/// alone, effective and permitted, with the bounding set cut to them and
/// no new privileges from exec: from here on the process cannot regain
/// the rest of root.
pub fn keep_only(caps: &[Cap], user: Option<&User>) -> Result<()> {
    let threads = std::fs::read_dir("/proc/self/task")
        .context("reading /proc/self/task")?
        .count();
    if threads != 1 {
        bail!("dropping privileges with {threads} threads running (capabilities are per thread)");
    }
    let keep: u64 = caps.iter().map(|c| c.bit()).sum();
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .context("reading /proc/sys/kernel/cap_last_cap")?
        .trim()
        .parse()
        .context("parsing /proc/sys/kernel/cap_last_cap")?;
    // SAFETY: prctl, setgroups, setresgid/uid and capset with valid
    // arguments; each result is checked.
    unsafe {
        for cap in 0..=last {
            let bounded = libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) == 1;
            if keep & (1 << cap) == 0
                && bounded
                && libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
                // (Without CAP_SETPCAP, as a service's user: such a
                // process, no_new_privs set, cannot regain it anyway.)
                && libc::geteuid() == 0
            {
                return Err(last_error("dropping a capability from the bounding set"));
            }
        }
        if let Some(u) = user {
            if libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0 {
                return Err(last_error("keeping capabilities across the user change"));
            }
            if libc::setgroups(0, std::ptr::null()) != 0 {
                return Err(last_error("dropping supplementary groups"));
            }
            if libc::setresgid(u.gid, u.gid, u.gid) != 0 {
                return Err(last_error(&format!("becoming group {}", u.gid)));
            }
            if libc::setresuid(u.uid, u.uid, u.uid) != 0 {
                return Err(last_error(&format!("becoming user {}", u.name)));
            }
            libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0);
        }
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let half = |bits: u64| CapData {
            effective: bits as u32,
            permitted: bits as u32,
            inheritable: 0,
        };
        let data = [half(keep), half(keep >> 32)];
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) != 0 {
            return Err(last_error("setting the capabilities kept"));
        }
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ) != 0
        {
            return Err(last_error("clearing the ambient capabilities"));
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(last_error("setting no_new_privs"));
        }
    }
    Ok(())
}

/// "CAP_BPF, CAP_PERFMON" or "no capability".
pub fn named(caps: &[Cap]) -> String {
    if caps.is_empty() {
        "no capability".into()
    } else {
        caps.iter()
            .map(Cap::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn last_error(what: &str) -> anyhow::Error {
    anyhow::Error::new(std::io::Error::last_os_error()).context(what.to_string())
}

/// The calling thread's effective capabilities (capget), as bits.
pub fn effective() -> u64 {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: a valid header and room for the two halves version 3 writes.
    if unsafe { libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) } != 0 {
        return 0;
    }
    u64::from(data[0].effective) | u64::from(data[1].effective) << 32
}

/// Attaching needs root, or (once [`keep_only`] ran, as another user)
/// the capabilities [`to_attach_again`] names.
pub fn may_attach() -> Result<(), SetupError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    let need: u64 = to_attach_again(false).iter().map(|c| c.bit()).sum();
    if effective() & need == need {
        Ok(())
    } else {
        Err(SetupError::NotRoot)
    }
}
