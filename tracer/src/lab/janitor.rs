//! Removes a lab's namespaces, and kills its sender guests, when its
//! process dies without doing so itself (SIGKILL, a crash). A child forked when the lab is made waits on
//! a pipe whose other end only the lab's process holds; when the pipe
//! closes (the lab dropped, or its process gone), the child deletes the
//! namespaces, which takes their links, programs and iptables rules with
//! them. In its own process group, Ctrl-C at the terminal does not reach
//! it.

use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use anyhow::{Context, Result};

pub struct Janitor {
    pid: libc::pid_t,
    /// Closed on drop (or by the kernel when the process dies): the signal.
    pipe: Option<OwnedFd>,
}

impl Janitor {
    /// For the lab named `base` (its guests' names start with it).
    pub fn spawn(base: &str, namespaces: &[&str]) -> Result<Self> {
        // Everything the child needs is made before fork: after it, in a
        // multithreaded process, the child may only make async-signal-safe
        // calls (no allocation).
        let guests = super::guest::leftovers_script(base);
        let script: String = std::iter::once(guests)
            .chain(
                namespaces
                    .iter()
                    .map(|n| format!("ip netns delete {n} 2>/dev/null; ")),
            )
            .collect();
        let c = |s: &str| CString::new(s).expect("no NUL");
        let (sh, dash_c, script, devnull) = (c("/bin/sh"), c("-c"), c(&script), c("/dev/null"));
        let argv = [
            sh.as_ptr(),
            dash_c.as_ptr(),
            script.as_ptr(),
            std::ptr::null(),
        ];
        let mut fds = [0; 2];
        // SAFETY: a valid array of two fds to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error()).context("the lab's janitor: pipe");
        }
        // SAFETY: fresh fds from pipe2, owned here from now on.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: the child runs only async-signal-safe calls, then execs.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).context("the lab's janitor: fork");
        }
        if pid == 0 {
            // SAFETY: the child: dup2, open, close_range, setpgid, read,
            // execv and _exit only.
            unsafe {
                // The write end first: kept open here, it would hold off
                // the end of file this child waits for.
                libc::close(write.as_raw_fd());
                libc::dup2(read.as_raw_fd(), 0);
                let null = libc::open(devnull.as_ptr(), libc::O_RDWR);
                libc::dup2(null, 1);
                libc::dup2(null, 2);
                // Nothing of the parent's kept open (its files, sockets,
                // the pipe's write end).
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                libc::setpgid(0, 0);
                let mut b = 0u8;
                loop {
                    let n = libc::read(0, (&mut b as *mut u8).cast(), 1);
                    if n == 0 || (n < 0 && *libc::__errno_location() != libc::EINTR) {
                        break;
                    }
                }
                libc::execv(sh.as_ptr(), argv.as_ptr());
                libc::_exit(127);
            }
        }
        drop(read);
        Ok(Self {
            pid,
            pipe: Some(write),
        })
    }
}

impl Drop for Janitor {
    /// The lab has removed its namespaces: the child, woken by the pipe
    /// closing, finds nothing left to delete; it is reaped here.
    fn drop(&mut self) {
        drop(self.pipe.take());
        let mut status = 0;
        // SAFETY: our child.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
    }
}
