//! Errors a user can act on: bad input and missing prerequisites. The binary
//! turns these into one line and exit code 2; everything else is exit 1.

use std::fmt;

#[derive(Debug)]
pub enum SetupError {
    NotRoot,
    /// The kernel or machine lacks something the tracer needs.
    Environment(String),
    UnknownInterface {
        name: String,
        netns: Option<String>,
    },
    UnknownNetns {
        name: String,
        reason: String,
    },
    BadFilter(String),
    BadOutput {
        path: String,
        reason: String,
    },
    BadArgument(String),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotRoot => write!(
                f,
                "loading eBPF programs needs root: rerun as root (e.g. `su -c '...'`)"
            ),
            Self::Environment(what) => write!(f, "{what}"),
            Self::UnknownInterface { name, netns: None } => write!(
                f,
                "no interface named '{name}' (list them with `ip link`; add --netns NAME if it lives in a namespace)"
            ),
            Self::UnknownInterface {
                name,
                netns: Some(ns),
            } => write!(
                f,
                "no interface named '{name}' in network namespace '{ns}' (list them with `ip -n {ns} link`)"
            ),
            Self::UnknownNetns { name, reason } => write!(
                f,
                "cannot enter network namespace '{name}': {reason} (list them with `ip netns list`)"
            ),
            Self::BadFilter(why) => write!(f, "bad flow filter: {why}"),
            Self::BadOutput { path, reason } => {
                write!(f, "cannot write output file '{path}': {reason}")
            }
            Self::BadArgument(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for SetupError {}

/// Fails with [`SetupError::NotRoot`] unless running as root.
pub fn require_root() -> Result<(), SetupError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(SetupError::NotRoot);
    }
    Ok(())
}
