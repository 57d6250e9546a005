//! The files a package ships beside the binary, made from the command
//! line's own definition: a man page per command and shell completions
//! (`cargo xtask dist` asks for them with `tracer package-files DIR`).

use std::{fs, path::Path, process::ExitCode};

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

use super::flags::Cli;

/// Writes `DIR/man/tracer.1`, `DIR/man/tracer-CMD.1` for each command
/// a user runs, and `DIR/completions/` for bash, zsh and fish.
pub fn package_files(dir: &Path) -> Result<ExitCode> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    for d in [&man, &completions] {
        fs::create_dir_all(d).with_context(|| format!("making {}", d.display()))?;
    }
    let cli = Cli::command();
    let mut pages = vec![("tracer".to_string(), cli.clone())];
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("tracer-{}", sub.get_name());
        pages.push((
            name.clone(),
            sub.clone()
                .display_name(name)
                .bin_name(format!("tracer {}", sub.get_name())),
        ));
    }
    for (name, cmd) in pages {
        let path = man.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut out)?;
        fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    }
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut Cli::command(), "tracer", &completions)
            .with_context(|| format!("writing the {shell} completions"))?;
        println!("{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
