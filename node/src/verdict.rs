//! The exact gate's verdict on a backend, as a node keeps it, tells its peers (wire `-9`) and
//! reports it. The gate itself lives with the plugin host; this is only its outcome, typed, so
//! nothing downstream parses a sentence to learn whether a backend was admitted.

/// What the gate decided about one backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every case of the battery matched the reference, every bit.
    Admitted { cases: u32 },
    /// A case differed (or a call failed where an output was expected): the first such case
    /// and what happened in it.
    Rejected { case: String, detail: String },
    /// The plugin could not be loaded or instantiated (missing file, wrong ABI, no device).
    NotLoadable { why: String },
}

impl Verdict {
    pub fn is_admitted(&self) -> bool {
        matches!(self, Verdict::Admitted { .. })
    }

    /// The verdict in one word, for tables.
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Admitted { .. } => "admitted",
            Verdict::Rejected { .. } => "REJECTED",
            Verdict::NotLoadable { .. } => "n/a",
        }
    }

    /// The verdict in a few words: `admitted 40/40`, `REJECTED: case`, `n/a: why`.
    pub fn short(&self) -> String {
        match self {
            Verdict::Admitted { cases } => format!("admitted {cases}/{cases}"),
            Verdict::Rejected { case, .. } => format!("REJECTED at `{case}`"),
            Verdict::NotLoadable { why } => format!("n/a: {why}"),
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Admitted { cases } => {
                write!(f, "ADMITTED: matched the reference on all {cases} cases, every bit")
            }
            Verdict::Rejected { case, detail } => write!(f, "REJECTED: failed case `{case}`: {detail}"),
            Verdict::NotLoadable { why } => write!(f, "unavailable: {why}"),
        }
    }
}
