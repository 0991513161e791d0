//! Why a replica could not do what it was asked ([`ReplicaError`]), and errors from outside
//! this crate kept whole ([`ForeignError`]).

use std::error::Error;
use std::sync::Arc;

use super::*;

/// An error from outside this crate (a plugin host's, a data client's), kept whole.
pub type ForeignError = Arc<dyn Error + Send + Sync>;

/// Why a replica could not do what it was asked.
#[derive(Clone, Debug)]
pub enum ReplicaError {
    /// Nothing to compute with: no run is configured.
    NoRun,
    /// The run settings are not a usable run.
    Config(ConfigError),
    /// No backend could be opened for the run.
    Backend(ForeignError),
    /// The data stream could not be opened.
    Data(ForeignError),
    Compute(ComputeError),
    /// This node's contribution is not finite (its training diverged).
    NonFinite(crate::sync::NonFinite),
    Checkpoint(CheckpointError),
    Restore(RestoreError),
    /// Asked for a step that does not follow the last one applied.
    WrongStep {
        asked: u32,
        at: u32,
    },
    /// The backend passed the gate but departs from the definition at the run's own shapes
    /// (`admission.rs`): it may not take part in this run.
    Shapes(ShapesRefused),
    /// No referee for the admission at the run's shapes (the CPU mirror could not be opened).
    Referee(ForeignError),
    /// An audit of `step` asked for weights no longer kept.
    AuditWeightsGone {
        step: u32,
    },
    /// The guard's disputes: the update before `step` is no longer kept (or was never: audits
    /// off, an overlapped window), so the weights `step` was computed from cannot be checked.
    UpdateGone {
        step: u32,
    },
    /// Batches from this source are not a function of (seed, member, step): no contribution
    /// trained on it can be recomputed.
    NotAuditable(String),
    /// The run trains on text of digest `run`, this node on text of digest `ours` (0: not
    /// known): it may not take part (its contributions could not be audited).
    OtherText {
        run: u64,
        ours: u64,
    },
}

impl ReplicaError {
    /// The verdict a node that cannot take part in the run tells its peers (it watches as an
    /// observer), where the error means that: its backend refused at the run's shapes, or other
    /// text than the run's.
    pub fn cannot_take_part(&self) -> Option<Verdict> {
        match self {
            ReplicaError::Shapes(refused) => Some(refused.verdict()),
            ReplicaError::OtherText { .. } => {
                Some(Verdict::Rejected { case: "the run's text".into(), detail: self.to_string() })
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for ReplicaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplicaError::NoRun => f.write_str("no run is configured"),
            ReplicaError::Config(e) => write!(f, "invalid run settings: {e}"),
            ReplicaError::Backend(e) => write!(f, "no backend: {e}"),
            ReplicaError::Data(e) => write!(f, "no data source: {e}"),
            ReplicaError::Compute(e) => write!(f, "{e}"),
            ReplicaError::NonFinite(e) => write!(f, "{e}"),
            ReplicaError::Checkpoint(e) => write!(f, "{e}"),
            ReplicaError::Restore(e) => write!(f, "{e}"),
            ReplicaError::WrongStep { asked, at } => write!(f, "asked for step {asked} at step {at}"),
            ReplicaError::Shapes(e) => write!(f, "{e}"),
            ReplicaError::Referee(e) => write!(f, "no referee to admit the backend at the run's shapes: {e}"),
            ReplicaError::OtherText { run, ours } => write!(
                f,
                "the run trains on the corpus of digest {run:#018x}, this node on {}",
                if *ours == 0 {
                    "text not known by its digest (`--data`)".to_string()
                } else {
                    format!("{ours:#018x}")
                }
            ),
            ReplicaError::NotAuditable(source) => {
                write!(f, "{source} gives batches that are not a function of the seed and the step: no audit")
            }
            ReplicaError::UpdateGone { step } => write!(
                f,
                "the update before step {step} is not kept: the weights that step was computed from cannot be checked"
            ),
            ReplicaError::AuditWeightsGone { step } => {
                write!(f, "the weights step {step} was computed from are no longer kept: it cannot be audited")
            }
        }
    }
}

impl Error for ReplicaError {
    /// Each error that wraps another says what it says (above), so the chain goes on with that
    /// error's own source: returning the wrapped error too would say it twice in a binary's
    /// `{:#}`.
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ReplicaError::Backend(e) | ReplicaError::Data(e) | ReplicaError::Referee(e) => e.source(),
            ReplicaError::Shapes(e) => e.source(),
            ReplicaError::Compute(e) => e.source(),
            ReplicaError::NonFinite(e) => e.source(),
            ReplicaError::Checkpoint(e) => e.source(),
            ReplicaError::Restore(e) => e.source(),
            ReplicaError::Config(e) => e.source(),
            ReplicaError::NoRun
            | ReplicaError::WrongStep { .. }
            | ReplicaError::AuditWeightsGone { .. }
            | ReplicaError::UpdateGone { .. }
            | ReplicaError::NotAuditable(_)
            | ReplicaError::OtherText { .. } => None,
        }
    }
}

impl From<ComputeError> for ReplicaError {
    fn from(e: ComputeError) -> Self {
        ReplicaError::Compute(e)
    }
}

impl From<ContributeError> for ReplicaError {
    fn from(e: ContributeError) -> Self {
        match e {
            ContributeError::Compute(e) => ReplicaError::Compute(e),
            ContributeError::NonFinite(e) => ReplicaError::NonFinite(e),
        }
    }
}
