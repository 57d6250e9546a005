//! Output files (traces, plots, the lab's truth): readable by their owner
//! only (mode 0600, also when the file existed: traces reveal addresses and
//! ports), opened before anything is attached so that a bad path fails
//! first, and truncated only once the run has started: a run that fails to
//! start neither clobbers an existing file nor leaves a new empty one.

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

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

#[cfg(test)]
mod tests {
    use super::*;

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
