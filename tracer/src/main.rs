//! `tracer`: the command-line front end. All logic lives in the library;
//! this parses the command line and dispatches ([`tracer::cli`]).
//!
//! Exit codes: 0 success; 1 runtime failure; 2 bad input or missing
//! prerequisite (nothing was attached); 3 finished, but the kernel lost
//! events (ring buffer full, or tracepoint runs it skipped), so the results
//! are incomplete.

use std::process::ExitCode;

use clap::Parser;
use tracer::{
    cli::{self, Cli, Command},
    SetupError,
};

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let result = match Cli::parse().command {
        Command::Record(args) => cli::record(args, false),
        Command::Live(args) => cli::record(args, true),
        Command::Watch(args) => cli::watch(args),
        Command::Lab(args) => cli::lab(args),
        Command::LabSend(args) => cli::lab_send(args),
        Command::GuestCheck => tracer::lab::guest::boots()
            .map(|()| ExitCode::SUCCESS)
            .map_err(|why| {
                SetupError::BadArgument(format!("user-mode-linux cannot run on this host: {why}"))
                    .into()
            }),
        Command::PackageFiles { dir } => cli::package_files(&dir),
        Command::Analyze(args) => cli::analyze(args, false),
        Command::Replay(args) => cli::analyze(args, true),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let setup = e.chain().any(|c| c.downcast_ref::<SetupError>().is_some());
            // One line: the outermost context and its causes.
            eprintln!("tracer: {}", format!("{e:#}").replace('\n', " "));
            if setup {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
