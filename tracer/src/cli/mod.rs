//! The command-line front end: [`flags`] turns the command line into
//! checked options, and each command runs on the library ([`run`] is the
//! tracing run `record`, `live` and `lab` share).

mod analyze;
pub mod flags;
mod lab;
mod package;
mod record;
mod run;
mod watch;

pub use analyze::analyze;
pub use flags::{Cli, Command};
pub use lab::{lab, lab_send};
pub use package::package_files;
pub use record::record;
pub use watch::watch;
