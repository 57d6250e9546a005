//! JSON-lines export: one observation per line, as `source::Observation`
//! serialises it (`{"kind":"segment",...}`). The raw export until pcapng.

use std::{
    fs::{File, OpenOptions},
    io::{BufWriter, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use crate::{record::Sink, source::Observation, SetupError};

pub struct JsonLines {
    path: PathBuf,
    out: BufWriter<File>,
    written: u64,
    /// The first write error; later observations are not written.
    failed: Option<std::io::Error>,
}

impl JsonLines {
    /// Creates (truncates) `path` with mode 0600: traces reveal addresses.
    pub fn create(path: &Path) -> Result<Self, SetupError> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| SetupError::BadOutput {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
            written: 0,
            failed: None,
        })
    }

    pub fn written(&self) -> u64 {
        self.written
    }
}

impl Sink for JsonLines {
    fn observe(&mut self, obs: &Observation) {
        if self.failed.is_some() {
            return;
        }
        let res = serde_json::to_writer(&mut self.out, obs)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        match res {
            Ok(()) => self.written += 1,
            Err(e) => self.failed = Some(e),
        }
    }

    fn flush(&mut self) -> Result<()> {
        if self.failed.is_none() {
            if let Err(e) = self.out.flush() {
                self.failed = Some(e);
            }
        }
        match &self.failed {
            None => Ok(()),
            Some(e) => Err(anyhow::anyhow!("{e}")).with_context(|| {
                format!(
                    "writing {} (the first {} observations are in the file)",
                    self.path.display(),
                    self.written
                )
            }),
        }
    }
}
