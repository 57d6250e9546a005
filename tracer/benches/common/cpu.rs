//! The calling thread's CPU time (the benches' collector runs on it).

use std::time::Duration;

/// User plus system time of the calling thread so far.
pub fn thread_cpu() -> Duration {
    // SAFETY: a valid rusage to fill.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let t = |v: libc::timeval| Duration::new(v.tv_sec as u64, v.tv_usec as u32 * 1000);
    t(u.ru_utime) + t(u.ru_stime)
}
