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
