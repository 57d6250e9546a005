//! A bench's figure beside its target, in one form for every bench
//! (`target >= 8 M/s: met`): the headroom table of issue 19, which
//! `cargo xtask bench` prints row by row.

// (Each bench uses one or both.)
#[allow(dead_code)]
pub enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    pub fn met(&self, v: f64) -> bool {
        match *self {
            Target::AtLeast(t) => v >= t,
            Target::AtMost(t) => v <= t,
        }
    }

    /// `target >= 8 M/s: met` for `v`, the bound written as `bound`.
    pub fn say(&self, v: f64, bound: &str) -> String {
        let op = match self {
            Target::AtLeast(_) => ">=",
            Target::AtMost(_) => "<=",
        };
        let verdict = if self.met(v) { "met" } else { "NOT met" };
        format!("target {op} {bound}: {verdict}")
    }
}
