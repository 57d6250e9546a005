//! JSON-lines export: one observation per line, as `source::Observation`
//! serialises it (`{"kind":"segment",...}`): for scripts (`jq`); the
//! trace for Wireshark and `tracer analyze` is [`crate::pcapng`].

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use crate::{
    kernel::Counters,
    sink::Sink,
    source::{Observation, Raw},
};

pub struct JsonLines {
    path: PathBuf,
    out: BufWriter<File>,
    written: u64,
    /// The first write error; later observations are not written.
    failed: Option<std::io::Error>,
}

impl JsonLines {
    /// Writes into `file` (an [`crate::output::OutputFile`] started).
    pub fn new(path: &Path, file: File) -> Self {
        Self {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
            written: 0,
            failed: None,
        }
    }

    pub fn written(&self) -> u64 {
        self.written
    }
}

impl Sink for JsonLines {
    fn observe(&mut self, obs: &Observation, _raw: &Raw) {
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

    fn flush(&mut self, _counters: &Counters) -> Result<()> {
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
