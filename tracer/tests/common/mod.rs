//! Shared by the binary's integration tests.

pub const BIN: &str = env!("CARGO_BIN_EXE_tracer");

/// True when running as root; otherwise says the test is skipped.
pub fn root_or_skip(test: &str) -> bool {
    let root = tracer::require_root().is_ok();
    if !root {
        eprintln!("{test}: skipped: needs root");
    }
    root
}

/// True inside a TCG guest of the kernel matrix (`cargo xtask test
/// --kernel`): emulated CPUs, several times slower, so uploads get more time
/// and shares that depend on speed are held more loosely.
#[allow(dead_code)] // (not every test target needs it)
pub fn under_tcg() -> bool {
    std::env::var_os("TRACER_TEST_TCG").is_some()
}
