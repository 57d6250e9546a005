//! Where a test runs: as root or not, on this host or in a TCG guest of
//! the kernel matrix. Shared by the binary's tests (`common`) and the
//! kernel integration tests (the `tests` crate includes this file).

/// True when running as root; otherwise says the test is skipped.
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("{test}: skipped: needs root");
    }
    root
}

/// Root, and a user-mode guest boots here (once per test process): else
/// says why the test is skipped.
pub fn guests_or_skip(test: &str) -> bool {
    static BOOTS: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    if !root_or_skip(test) {
        return false;
    }
    match BOOTS.get_or_init(tracer::lab::guest::boots) {
        Ok(()) => true,
        Err(why) => {
            eprintln!("{test}: skipped: user-mode-linux cannot run on this host: {why}");
            false
        }
    }
}

/// True inside a TCG guest of the kernel matrix (`cargo xtask test
/// --kernel`): emulated CPUs, several times slower, so uploads get more time
/// and shares that depend on speed are held more loosely.
pub fn under_tcg() -> bool {
    std::env::var_os("TRACER_TEST_TCG").is_some()
}
