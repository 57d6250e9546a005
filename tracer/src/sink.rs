//! Where the observation stream goes besides the engine: the trace files
//! (`pcapng`, `jsonl`) and the tests' collector. The collection loop
//! ([`crate::record`]) hands each one every observation.

use anyhow::Result;

use crate::{
    kernel::Counters,
    source::{Observation, Raw},
};

/// Something that consumes the observation stream.
pub trait Sink {
    /// One observation and the record it came from (with a segment's
    /// frame bytes when the tracer captures them:
    /// [`crate::kernel::TracerOptions::snaplen`]).
    fn observe(&mut self, obs: &Observation, raw: &Raw);
    /// Called about once a second and at the end (with the final
    /// counters): push buffered output out.
    fn flush(&mut self, _counters: &Counters) -> Result<()> {
        Ok(())
    }
    /// SIGHUP (`watch`): files kept in a directory begin again there.
    fn reopen(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Collects every observation (tests, small captures).
#[derive(Default)]
pub struct Collect(pub Vec<Observation>);

impl Sink for Collect {
    fn observe(&mut self, obs: &Observation, _raw: &Raw) {
        self.0.push(obs.clone());
    }
}
