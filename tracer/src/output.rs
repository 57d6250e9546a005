//! Output files (traces, plots, the lab's truth): readable by their owner
//! only (mode 0600, also when the file existed: traces reveal addresses and
//! ports), opened before anything is attached so that a bad path fails
//! first, and truncated only once the run has started: a run that fails to
//! start neither clobbers an existing file nor leaves a new empty one.
//! And the directories a service writes files into without end, keeping
//! the latest ([`KeptFiles`]).

use std::{
    collections::VecDeque,
    fs::{self, File, OpenOptions},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use crate::SetupError;

pub struct OutputFile {
    path: PathBuf,
    file: Option<File>,
    /// This run created it (removed again if the run never starts).
    created: bool,
}

impl OutputFile {
    /// Opens `path` for writing, creating it if missing; its content stays
    /// until [`OutputFile::start`].
    pub fn open(path: &Path) -> Result<Self, SetupError> {
        let bad = |e: std::io::Error| SetupError::BadOutput {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let created = !path.exists();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(bad)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(bad)?;
        Ok(Self {
            path: path.to_path_buf(),
            file: Some(file),
            created,
        })
    }

    /// The run has started: the file, emptied.
    pub fn start(mut self) -> std::io::Result<File> {
        let file = self.file.take().expect("started once");
        file.set_len(0)?;
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for OutputFile {
    /// Never started: a file this run created goes again.
    fn drop(&mut self) {
        if self.file.is_some() && self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A directory of files of one kind (named `PREFIX...SUFFIX`) that keeps
/// the latest `keep`, the oldest removed first: `watch`'s interval reports
/// and its pcapng ring. Oldest means those found when (re)opened, by name
/// (names begin with their time), then this run's in the order made: a
/// clock stepped back cannot make a new file look old.
pub struct KeptFiles {
    dir: PathBuf,
    keep: usize,
    prefix: &'static str,
    suffix: &'static str,
    files: VecDeque<PathBuf>,
}

impl KeptFiles {
    /// Makes `dir` (mode 0750) if missing and checks that files can be
    /// made in it; its files of this kind beyond `keep` go.
    pub fn open(
        dir: &Path,
        keep: usize,
        prefix: &'static str,
        suffix: &'static str,
    ) -> Result<Self, SetupError> {
        let mut me = Self {
            dir: dir.to_path_buf(),
            keep,
            prefix,
            suffix,
            files: VecDeque::new(),
        };
        me.reopen().map_err(|e| SetupError::BadOutput {
            path: dir.display().to_string(),
            reason: format!("{e:#}"),
        })?;
        Ok(me)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `PREFIX{middle}SUFFIX` in the directory.
    pub fn path(&self, middle: &str) -> PathBuf {
        self.dir
            .join(format!("{}{middle}{}", self.prefix, self.suffix))
    }

    /// Makes the directory again if it went, and takes its files as they
    /// are now (some may have been moved away): on SIGHUP.
    pub fn reopen(&mut self) -> Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&self.dir)
            .context("making the directory")?;
        let probe = self.dir.join(".tracer-probe");
        fs::write(&probe, b"").context("making a file in it")?;
        let _ = fs::remove_file(&probe);
        let mut found: Vec<PathBuf> = fs::read_dir(&self.dir)
            .context("reading it")?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| self.is_one(p))
            .collect();
        found.sort();
        let ours: Vec<PathBuf> = self.files.drain(..).filter(|p| p.exists()).collect();
        found.retain(|p| !ours.contains(p));
        self.files = found.into_iter().chain(ours).collect();
        self.prune();
        Ok(())
    }

    /// `path` was made (the newest); the oldest go while there are more
    /// than `keep`: those removed.
    pub fn made(&mut self, path: PathBuf) -> Vec<PathBuf> {
        self.files.push_back(path);
        self.prune()
    }

    /// The files kept, oldest first.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(PathBuf::as_path)
    }

    fn prune(&mut self) -> Vec<PathBuf> {
        let mut removed = Vec::new();
        while self.files.len() > self.keep {
            let old = self.files.pop_front().expect("more than keep");
            match fs::remove_file(&old) {
                Ok(()) => removed.push(old),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => log::warn!("could not remove the old file {}: {e}", old.display()),
            }
        }
        removed
    }

    fn is_one(&self, p: &Path) -> bool {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(self.prefix) && n.ends_with(self.suffix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files of its kind found at the start beyond `keep` go, the oldest by
    /// name first; other files stay; the newest made push out the oldest;
    /// a directory removed is made again on reopening, its files taken as
    /// they are.
    #[test]
    fn a_directory_keeps_the_latest_files_of_its_kind_alone() {
        let dir = std::env::temp_dir().join(format!("tracer-kept-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let names = [
            "interval-20261201T000000Z-000001.json",
            "interval-20261203T000000Z-000001.json",
            "interval-20261202T000000Z-000009.json",
            "notes.json",
        ];
        for n in names {
            fs::write(dir.join(n), "{}").unwrap();
        }
        let mut kept = KeptFiles::open(&dir, 2, "interval-", ".json").unwrap();
        let listed = || {
            let mut left: Vec<String> = fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            left.sort();
            left
        };
        assert_eq!(listed(), [names[2], names[1], names[3]]);
        // Named as if older (a clock stepped back): still the newest.
        let new = kept.path("20261101T000000Z-000001");
        fs::write(&new, "{}").unwrap();
        assert_eq!(kept.made(new.clone()), [dir.join(names[2])]);
        assert_eq!(kept.files().collect::<Vec<_>>(), [dir.join(names[1]), new]);
        fs::remove_dir_all(&dir).unwrap();
        kept.reopen().unwrap();
        assert!(dir.is_dir() && kept.files().next().is_none());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn is_private_and_keeps_what_was_there_until_started() {
        let dir = std::env::temp_dir().join(format!("tracer-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let old = dir.join("old.pcapng");
        std::fs::write(&old, b"yesterday").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        // A run that fails to start: the old file is intact, a new one gone.
        drop(OutputFile::open(&old).unwrap());
        assert_eq!(std::fs::read(&old).unwrap(), b"yesterday");
        let new = dir.join("new.pcapng");
        drop(OutputFile::open(&new).unwrap());
        assert!(!new.exists());
        // One that starts: emptied, owner-only.
        let f = OutputFile::open(&old).unwrap().start().unwrap();
        assert_eq!(f.metadata().unwrap().len(), 0);
        let mode = std::fs::metadata(&old).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(
            OutputFile::open(&dir.join("no/such/dir/x")),
            Err(SetupError::BadOutput { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
