//! The trainer as the mesh sees it: a [`Replica`] owns the model, the optimizer and what
//! computes the products; the session only decides.
//!
//! [`TrainerReplica`] is the real one. Two things it needs come from outside this crate and
//! are injected through a [`Provider`]: opening and gating a backend (the plugin host is not a
//! dependency of `node`), and opening a data stream (the `/data` client does I/O). Hot-swaps
//! are staged: an admitted backend waits for the next step boundary, then computes from that
//! step on, and the change is reported once. The weight hash of an update runs on a thread of
//! its own while the next step computes (FNV-1a is byte-serial, ~0.8 GB/s).

use std::collections::VecDeque;
use std::error::Error;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use crate::admission::{check_at_run_shapes, ShapesAdmitted, ShapesRefused};
use crate::audit::{Traced, Tracing, Urgency};
use crate::checkpoint::{self, CheckpointError};
use crate::compute_error::ComputeError;
use crate::config::{ConfigError, RunConfig};
use crate::data::{node_data_seed, DataSource};
use crate::gemm::Gemm;
use crate::session::{PrivateInputs, Recomputed};
use crate::sync::Tamper;
use crate::trainer::{ContributeError, RestoreError, TrainState, Trainer, Undo};
use crate::verdict::Verdict;
use crate::wire::{Gradient, PeerId, Values};

/// Steps whose starting weights a replica keeps for audits (a commit and its audit come a few
/// steps behind the compute; a dispute's traces a few more): at least this many…
const AUDIT_WEIGHTS_KEPT: usize = 4;
/// …and as many more as fit this many bytes, up to [`AUDIT_WEIGHTS_MOST`] (small models step
/// hundreds of times a second: a dispute's round trips span tens of their steps).
const AUDIT_WEIGHTS_BYTES: usize = 64 << 20;
const AUDIT_WEIGHTS_MOST: usize = 64;

/// How many steps' weights of `len` values a replica keeps for audits.
fn audit_weights_kept(len: usize) -> usize {
    (AUDIT_WEIGHTS_BYTES / (len.max(1) * 4)).clamp(AUDIT_WEIGHTS_KEPT, AUDIT_WEIGHTS_MOST)
}

/// How many contributions' private states of `len` values a member keeps to serve auditors:
/// the promise ([`crate::session::STATE_PROMISED_STEPS`] behind the asker's applied step) with
/// room for this member's compute one step ahead and an asker a few steps behind the group
/// (four kept once named an honest member "withheld" when its next compute was under way), and
/// as many as the audit weights' budget holds.
fn states_kept(len: usize) -> usize {
    const COMPUTE_AHEAD_AND_ASKER_LAG: usize = 5;
    audit_weights_kept(len).max(crate::session::STATE_PROMISED_STEPS as usize + COMPUTE_AHEAD_AND_ASKER_LAG)
}

/// The private states (int8 and int4 residuals) a member's last few contributions were packed
/// with, by step, shared with the adapter so it serves an auditor's `-22` without waiting for
/// the replica (which a compute may hold).
#[derive(Clone, Debug, Default)]
pub struct KeptStates(Arc<std::sync::Mutex<VecDeque<KeptState>>>);

/// A step, the residual its contribution named, and its chunks' digests.
type KeptState = (u32, Arc<Vec<f32>>, Arc<Vec<u64>>);

impl KeptStates {
    /// The state step `step`'s contribution named, and the digest it is named by (a recompute
    /// of the step replaces it, and drops those of later steps: another history's).
    pub fn keep(&self, step: u32, state: Arc<Vec<f32>>) -> u64 {
        let digests = crate::wire::state_chunk_digests(&state);
        let digest = crate::wire::state_digest_of(state.len(), &digests);
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|(s, _, _)| *s < step);
        let most = states_kept(state.len());
        kept.push_back((step, state, Arc::new(digests)));
        while kept.len() > most {
            kept.pop_front();
        }
        digest
    }

    /// The state of `step`'s contribution, if still kept.
    pub fn get(&self, step: u32) -> Option<Arc<Vec<f32>>> {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter().rev().find(|(s, _, _)| *s == step).map(|(_, state, _)| state.clone())
    }

    /// What an auditor asking for `part` of the state of `step`'s contribution is served
    /// (nothing when it is no longer kept).
    pub fn served(&self, step: u32, part: &crate::wire::StatePart) -> crate::wire::ServedState {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match kept.iter().rev().find(|(s, _, _)| *s == step) {
            Some((_, state, digests)) => crate::wire::ServedState::of(state, digests, part),
            None => crate::wire::ServedState::default(),
        }
    }

    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

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
            ReplicaError::AuditWeightsGone { step } => {
                write!(f, "the weights step {step} was computed from are no longer kept: it cannot be audited")
            }
        }
    }
}

impl Error for ReplicaError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ReplicaError::Backend(e) | ReplicaError::Data(e) | ReplicaError::Referee(e) => Some(e.as_ref()),
            ReplicaError::Shapes(e) => Some(e),
            ReplicaError::Compute(e) => Some(e),
            ReplicaError::NonFinite(e) => Some(e),
            ReplicaError::Checkpoint(e) => Some(e),
            ReplicaError::Restore(e) => Some(e),
            ReplicaError::Config(e) => Some(e),
            ReplicaError::NoRun
            | ReplicaError::WrongStep { .. }
            | ReplicaError::AuditWeightsGone { .. }
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

/// The replica's state and compute, owned by the mesh adapter; the session only decides.
pub trait Replica: Send + 'static {
    /// A fresh model and optimizer for `settings`; returns the parameter count.
    fn configure(&mut self, run: &RunConfig) -> Result<usize, ReplicaError>;
    /// Our contribution to sync `step` from the current (global) weights: the gradient
    /// (`every-step`) or pseudo-gradient (`outer:H`), weight hash before, probe hash of the
    /// live kernel, loss. May take long: runs on a blocking thread.
    fn compute(&mut self, step: u32) -> Result<Gradient, ReplicaError>;
    /// Ends the sync with the group's mean (`grid`: what it was summed on, `int8` only). The
    /// new weights' hash is the next `compute`'s `whash` (or `weight_hash` when no step
    /// follows), so each update is hashed once and a replica may hash while the next step
    /// computes.
    fn apply(&mut self, mean: &[f32], grid: &[u8], ours: bool);
    /// Like `apply`, for a step whose record is not committed yet: the state before it is kept
    /// until [`Replica::confirm`] or [`Replica::rollback`].
    fn apply_tentatively(&mut self, mean: &[f32], grid: &[u8], ours: bool);
    /// The tentative step stands: what would undo it is let go (the next `apply` lets it go
    /// too).
    fn confirm(&mut self);
    /// The tentative step is undone, and so is anything computed on top of it: the state is
    /// again, bit for bit, the one before it.
    fn rollback(&mut self);
    /// A checkpoint of everything that determines the next update (empty before a run, or
    /// when the backend holding the state cannot give it back).
    fn snapshot(&mut self) -> Vec<u8>;
    /// Syncs the current weights are the result of (the session's step count).
    fn steps_done(&self) -> u32;
    /// Restore a checkpoint; returns (syncs done, parameter count).
    fn restore(&mut self, bytes: &[u8]) -> Result<(u32, usize), ReplicaError>;
    /// The current weights' hash (waiting for it if it is being computed).
    fn weight_hash(&mut self) -> u32;
    /// Seconds spent hashing (weight hash, probe) since the last call, for the step-time
    /// breakdown.
    fn take_hash_seconds(&mut self) -> f64 {
        0.0
    }
    /// Fault injection for tests: flip the lowest bit of one weight.
    fn flip_weight_bit(&mut self);
    /// Fault injection for tests: every value of this replica's contributions becomes `value`
    /// from the next one on (the hashes stay honest, so only the receivers' checks can see it).
    fn poison_contributions(&mut self, _value: f32) {}
    /// Fault injection for tests and `bench audit`: from the next contribution on, this replica
    /// is a rogue of kind `rogue` (finite values in bounds, honest hashes: only an audit by
    /// recomputation can see it).
    fn play_rogue(&mut self, _rogue: Rogue) {}
    /// This node's id in the group, known once the signaling server has welcomed it.
    fn set_identity(&mut self, _peer: PeerId) {}
    /// The digest of the text this node trains on ([`RunConfig::corpus`] of a run it starts).
    fn corpus_digest(&mut self) -> u64 {
        0
    }
    /// Fault injection: the step of the first contribution a rogue ([`Replica::play_rogue`])
    /// made wrong, once.
    fn take_rogue_began(&mut self) -> Option<u32> {
        None
    }
    /// A backend swap that took effect since the last call (at a step boundary, before the
    /// step's compute), if any.
    fn take_backend_change(&mut self) -> Option<BackendChange> {
        None
    }
    /// The last admission at a run's shapes since the last call (`configure` makes one): what
    /// it checked, in seconds.
    fn take_admission_at_shapes(&mut self) -> Option<(ShapesAdmitted, f64)> {
        None
    }
    /// Audits by recomputation: from now on keep the weights each of the last few steps was
    /// computed from ([`Replica::audit_kit`] recomputes another member's contribution from them).
    fn keep_audit_weights(&mut self, _on: bool) {}
    /// What recomputing `target`'s contribution to `step` needs, taken out so the audit runs
    /// without the replica: the weights `step` was computed from, `target`'s batch of it and
    /// `referee` (the last audit's of this urgency; `None`: a new one is opened, on threads of
    /// a routine audit's low priority or of the member's own for a check).
    fn audit_kit(
        &mut self,
        _step: u32,
        _target: PeerId,
        _referee: Option<Box<dyn Gemm + Send>>,
        _urgency: Urgency,
    ) -> Result<AuditKit, ReplicaError> {
        Err(ReplicaError::NoRun)
    }
    /// Disputes: this member's own step `step` computed again on its backend, from the weights
    /// it started from (kept for audits) and its own batch, traced as `tracing` asks — what an
    /// auditor narrows a disputed contribution to one op with (`docs/TRUST.md`).
    fn trace(&mut self, _step: u32, _tracing: &Tracing) -> Result<Traced, ReplicaError> {
        Err(ReplicaError::NoRun)
    }
    /// The private states this member's packed contributions were made with (one handle for
    /// the replica's life: the adapter serves auditors from it).
    fn kept_states(&self) -> KeptStates {
        KeptStates::default()
    }
    /// Elastic windows: where the adapter tells the window under way to end
    /// ([`crate::trainer::Trainer::hurry`]: the steps after which it ends), for the run just
    /// configured (the adapter asks once, after `configure`); `None` before a run.
    fn hurry(&self) -> Option<Arc<AtomicU32>> {
        None
    }
}

/// A wrong member's kinds, for fault injection ([`Replica::play_rogue`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rogue {
    /// Every value of its contribution times this factor (`1.001`: a contribution one part in
    /// a thousand off).
    Scale(f32),
    /// The values of one tensor (the token embedding's) sign-flipped.
    FlipTensor,
    /// The contribution computed on another member's batch.
    OthersBatch(PeerId),
    /// The values of its previous contribution sent again (a copy of an honest contribution).
    Stale,
    /// `int8`, `int4`: its residual doubled before each contribution — the contribution is
    /// what that state gives, and names it, but its own past did not leave it.
    ForgeState,
}

impl std::str::FromStr for Rogue {
    type Err = String;

    /// `scale:F`, `flip`, `batch:PEER`, `stale`, `state`.
    fn from_str(text: &str) -> Result<Rogue, String> {
        let bad = || format!("`{text}` is not a rogue (scale:F, flip, batch:PEER, stale, state)");
        Ok(match text.split_once(':') {
            None if text == "flip" => Rogue::FlipTensor,
            None if text == "stale" => Rogue::Stale,
            None if text == "state" => Rogue::ForgeState,
            Some(("scale", f)) => Rogue::Scale(f.parse().map_err(|_| bad())?),
            Some(("batch", p)) => Rogue::OthersBatch(p.parse().map_err(|_| bad())?),
            _ => return Err(bad()),
        })
    }
}

/// A hot-swap that took effect.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendChange {
    pub backend: String,
    pub verdict: Verdict,
    /// The first step computed by the new backend.
    pub step: u32,
}

/// What a [`TrainerReplica`] gets from outside this crate.
pub trait Provider: Send {
    /// Opens and gates backend `name` (a run with no backend at hand opens its own).
    fn open_backend(&mut self, name: &str) -> Result<Box<dyn Gemm + Send>, ForeignError>;
    /// This node's data stream, seeded `seed`.
    fn data_source(&mut self, seed: u64) -> Result<Box<dyn DataSource>, ForeignError>;
    /// The digest of the text this node trains on (`Corpus::digest`); 0: not known (`/data`).
    fn corpus_digest(&self) -> u64 {
        0
    }
    /// What recomputes the products when a backend is admitted at a run's shapes: the CPU
    /// mirror, gated, on every core.
    fn referee(&mut self) -> Result<Box<dyn Gemm + Send>, ForeignError>;
}

/// What recomputing one member's contribution needs ([`Replica::audit_kit`]).
pub struct AuditKit {
    pub run: RunConfig,
    pub step: u32,
    /// The weights the step was computed from.
    pub weights: Arc<Vec<f32>>,
    /// The audited member's data stream, at its batch of the step.
    pub data: Box<dyn DataSource>,
    pub referee: Box<dyn Gemm + Send>,
    /// `int8`, `int4`: the residual the member's contribution named (served by it, its digest
    /// checked) and the grid the group summed the step on.
    pub private: Option<PrivateInputs>,
    /// Record the definition's trace of the step as it is recomputed (`every-step`).
    pub trace: bool,
}

impl AuditKit {
    /// The audited member's contribution as the definition gives it, and the referee back.
    /// `every-step`: its loss and gradient on its batch at the weights, the products and ops on
    /// the referee; packed, the gradient plus the residual it named, packed
    /// ([`crate::sync::repack`]), and the digest of the residual that leaves on the group's
    /// grid (what its next contribution must name). `outer:H` (packed, no overlap): its window
    /// run again by a trainer on the referee from the group's weights, the inner optimizer state
    /// it named, its batches and the steps it claims — the member's own code path — and the
    /// digest of the state the window leaves.
    pub fn recompute(self) -> (Result<Recomputed, ComputeError>, Box<dyn Gemm + Send>) {
        match self.run.sync.mode {
            crate::sync::SyncMode::EveryStep => self.recompute_step(),
            crate::sync::SyncMode::Outer { .. } => self.recompute_window(),
        }
    }

    /// A disputed contribution's step run again on the referee (the definition), compared op
    /// by op with `theirs`, the target's trace of it: where the two first part (this side's
    /// words of the first differing chunk), or that they agree. `every-step` only.
    pub fn settle(mut self, theirs: Arc<crate::audit::Trace>) -> (Result<Traced, ComputeError>, Box<dyn Gemm + Send>) {
        let run = self.run;
        let model = crate::model::Model::new(crate::params::Layout::new(run.model));
        let (batch, _) = self.data.next_batch(run.batch, run.model.context);
        let (b, t) = (run.batch, run.model.context);
        let tracing = Tracing::Against(theirs);
        let traced = model.trace(self.referee.as_mut(), &self.weights, &batch.tokens, &batch.targets, b, t, &tracing);
        model.release(self.referee.as_mut());
        (traced, self.referee)
    }

    fn recompute_step(mut self) -> (Result<Recomputed, ComputeError>, Box<dyn Gemm + Send>) {
        let run = self.run;
        let model = crate::model::Model::new(crate::params::Layout::new(run.model));
        let (batch, _) = self.data.next_batch(run.batch, run.model.context);
        let weights = crate::model::Weights::Host(&self.weights);
        let (t, b) = (run.model.context, run.batch);
        let (tokens, targets) = (&batch.tokens, &batch.targets);
        let stepped = if self.trace {
            let traced = model.step_traced(self.referee.as_mut(), &self.weights, tokens, targets, b, t);
            traced.map(|(loss, grad, trace)| (loss, grad, Some(Arc::new(trace))))
        } else {
            let stepped = model.step(self.referee.as_mut(), weights, tokens, targets, b, t, None, self.step);
            stepped.map(|(loss, grad, _)| (loss, grad, None))
        };
        // The model's buffers on the referee go with it.
        model.release(self.referee.as_mut());
        let outcome = stepped.map(|(loss, grad, trace)| {
            let Some(PrivateInputs { residual: state, grid, checked, .. }) = &self.private else {
                return Recomputed { loss, values: Values::F32(grad), next_state: None, trace };
            };
            // The session checked the residual's length and digests against what the member
            // named; of a part, only the chunks checked are the member's.
            let part: Option<Vec<_>> =
                checked.as_ref().map(|c| c.iter().map(|&c| crate::wire::chunk_range(c, state.len())).collect());
            match crate::sync::repack(grad, state, run.sync.compression, grid, part.as_deref()) {
                Ok(repacked) => {
                    let next_state = repacked.next_state.as_deref().map(crate::wire::state_chunk_digests);
                    Recomputed { loss, values: repacked.values, next_state, trace }
                }
                Err(_) => Recomputed::no_contribution(loss),
            }
        });
        (outcome, self.referee)
    }

    fn recompute_window(self) -> (Result<Recomputed, ComputeError>, Box<dyn Gemm + Send>) {
        let AuditKit { run, step, weights, data, referee, private, .. } = self;
        let Some(PrivateInputs { residual: state, grid, weight, .. }) = private else {
            let refused = std::io::Error::other("an outer:H contribution is audited with the state it named");
            return (Err(ComputeError::backend(refused)), referee);
        };
        let n = weights.len();
        let Some((adam, residual)) = crate::sync::split_window_state(&state, n) else {
            let refused = std::io::Error::other("the named state is not an outer:H window's");
            return (Err(ComputeError::backend(refused)), referee);
        };
        let data_state = data.state();
        let mut trainer = match Trainer::new(run, referee, data) {
            Ok(trainer) => trainer,
            Err(e) => unreachable!("the run was validated when it was configured: {e}"),
        };
        let sync = crate::sync::SyncState { outer_momentum: vec![0.0; n], residual };
        let at = TrainState {
            run,
            step: (step - 1) * run.steps_per_sync(),
            weights: weights.to_vec(),
            adam,
            data_state,
            sync,
        };
        let outcome = trainer.restore(at).map_err(|e| ComputeError::backend(std::io::Error::other(e.to_string())));
        let outcome = outcome.and_then(|()| {
            if run.sync.elastic {
                trainer.hurry().store(weight, std::sync::atomic::Ordering::Relaxed);
            }
            let contribution = match trainer.contribute() {
                Ok(contribution) => contribution,
                Err(ContributeError::Compute(e)) => return Err(e),
                Err(ContributeError::NonFinite(_)) => return Ok(Recomputed::no_contribution(f32::NAN)),
            };
            // The residual the window leaves is computed before the outer step, whatever mean;
            // values that do not fit the group's grid are not what it summed (no state left).
            let fits = contribution.values.packed().is_some_and(|p| crate::sync::fits(p, &grid));
            let next_state = if fits {
                trainer.finish_sync(&vec![0.0; n], &grid, true)?;
                let after = trainer.state()?;
                Some(crate::wire::state_chunk_digests(&crate::sync::window_state(&after.adam, &after.sync.residual)))
            } else {
                None
            };
            Ok(Recomputed { loss: contribution.loss, values: contribution.values, next_state, trace: None })
        });
        (outcome, trainer.into_gemm())
    }
}

/// What checking a backend at the current run's shapes needs ([`TrainerReplica::shapes_kit`]),
/// taken out of the replica so the check holds no lock while it runs.
pub struct ShapesKit {
    pub run: RunConfig,
    pub referee: Box<dyn Gemm + Send>,
    pub data: Box<dyn DataSource>,
}

/// A backend admitted by the gate and waiting for the next step boundary.
struct Staged {
    name: String,
    verdict: Verdict,
    gemm: Box<dyn Gemm + Send>,
}

/// The trainer as the mesh sees it.
pub struct TrainerReplica {
    /// What a run with no backend at hand (none admitted, none from a previous run) opens.
    backend: String,
    provider: Box<dyn Provider>,
    /// This node's id: its data stream is `node_data_seed(run seed, id)`.
    me: u64,
    /// A backend already gated, used by the next run instead of gating again (a later run
    /// takes the previous run's backend).
    admitted: Option<Box<dyn Gemm + Send>>,
    staged: Option<Staged>,
    change: Option<BackendChange>,
    trainer: Option<Trainer>,
    /// The current weights' hash: computed once per update (or restore) and reported as the
    /// next step's `whash`.
    whash: WeightHash,
    hash_seconds: f64,
    /// An update the backend failed (`apply` has no way to say so): the next `compute` reports it.
    failed: Option<ComputeError>,
    /// Fault injection: the value every contribution carries instead of the honest ones.
    poison: Option<f32>,
    /// Fault injection: a rogue's kind, and its last contribution's values (for `Stale`).
    rogue: Option<(Rogue, Option<Values>)>,
    /// Fault injection: the step whose contribution a rogue first made wrong (once, for
    /// [`Replica::take_rogue_began`]), and whether it was told.
    rogue_began: Option<u32>,
    rogue_told: bool,
    /// `outer:H` with an overlap: the trainer, on a thread of its own, running the next
    /// window's first steps while the group sums the contribution just made; joined by
    /// whatever needs the trainer next (the mean's `apply`, usually).
    ahead: Option<RunningAhead>,
    /// The state before a step taken tentatively, until the step stands or is undone (and the
    /// weight hash it had).
    undo: Option<(Undo, u32)>,
    /// The referee of the admissions at a run's shapes, opened at the first.
    referee: Option<Box<dyn Gemm + Send>>,
    /// The last admission at a run's shapes: what it checked and how long it took (seconds).
    admitted_at_shapes: Option<(ShapesAdmitted, f64)>,
    /// Audits: the weights each of the last few computed steps started from (`None`: not kept).
    audit_weights: Option<VecDeque<(u32, Arc<Vec<f32>>)>>,
    /// The residuals the last few packed contributions were made with (always kept: any
    /// member may be audited).
    kept_states: KeptStates,
}

/// The trainer away on the thread running ahead.
struct RunningAhead {
    thread: std::thread::JoinHandle<(Trainer, Result<(), ComputeError>)>,
    /// Syncs its weights were the result of when it left (running ahead adds none).
    syncs_done: u32,
}

/// The current weights' hash, or the thread computing it.
enum WeightHash {
    Unknown,
    Known(u32),
    /// After an update it runs on a thread of its own, over a copy of the weights, while the
    /// next step computes; the step joins it at the end.
    Pending(std::thread::JoinHandle<u32>),
}

impl TrainerReplica {
    /// `admitted`: a gated instance of `backend` to use for the first run, if there is one.
    pub fn new(backend: &str, provider: Box<dyn Provider>, admitted: Option<Box<dyn Gemm + Send>>) -> Self {
        TrainerReplica {
            backend: backend.to_string(),
            provider,
            me: 0,
            admitted,
            staged: None,
            change: None,
            trainer: None,
            whash: WeightHash::Unknown,
            hash_seconds: 0.0,
            failed: None,
            poison: None,
            rogue: None,
            rogue_began: None,
            rogue_told: false,
            ahead: None,
            undo: None,
            referee: None,
            admitted_at_shapes: None,
            audit_weights: None,
            kept_states: KeptStates::default(),
        }
    }

    /// What an admission at the current run's shapes needs (the referee lent out until
    /// [`TrainerReplica::return_referee`]); `None` between runs, where the next `configure`
    /// checks the backend it takes.
    pub fn shapes_kit(&mut self) -> Result<Option<ShapesKit>, ReplicaError> {
        self.settle();
        let Some(run) = self.trainer.as_ref().map(|t| *t.run_config()) else { return Ok(None) };
        let referee = self.take_referee()?;
        let data = self.provider.data_source(node_data_seed(run.seed, self.me)).map_err(ReplicaError::Data)?;
        Ok(Some(ShapesKit { run, referee, data }))
    }

    /// The referee [`TrainerReplica::shapes_kit`] lent out, back for the next admission.
    pub fn return_referee(&mut self, referee: Box<dyn Gemm + Send>) {
        self.referee = Some(referee);
    }

    fn take_referee(&mut self) -> Result<Box<dyn Gemm + Send>, ReplicaError> {
        match self.referee.take() {
            Some(referee) => Ok(referee),
            None => self.provider.referee().map_err(ReplicaError::Referee),
        }
    }

    /// `gemm` admitted at `run`'s own shapes, or refused (it is kept for a later run, whose
    /// shapes may differ).
    fn admit_at_shapes(
        &mut self,
        run: &RunConfig,
        gemm: Box<dyn Gemm + Send>,
    ) -> Result<Box<dyn Gemm + Send>, ReplicaError> {
        if !gemm.units() {
            // The float reference is not the units: nothing to hold it to.
            return Ok(gemm);
        }
        let referee = match self.take_referee() {
            Ok(referee) => referee,
            Err(e) => {
                self.admitted = Some(gemm);
                return Err(e);
            }
        };
        let data = match self.provider.data_source(node_data_seed(run.seed, self.me)) {
            Ok(data) => data,
            Err(e) => {
                self.admitted = Some(gemm);
                self.referee = Some(referee);
                return Err(ReplicaError::Data(e));
            }
        };
        let began = std::time::Instant::now();
        let checked = check_at_run_shapes(run, gemm, referee, data);
        self.referee = Some(checked.referee);
        match checked.verdict {
            Ok(admitted) => {
                self.admitted_at_shapes = Some((admitted, began.elapsed().as_secs_f64()));
                Ok(checked.gemm)
            }
            Err(refused) => {
                self.admitted = Some(checked.gemm);
                Err(ReplicaError::Shapes(refused))
            }
        }
    }

    /// Makes an admitted backend compute from the next step on (or the next run, between
    /// runs).
    pub fn stage(&mut self, name: String, verdict: Verdict, gemm: Box<dyn Gemm + Send>) {
        let staged = Staged { name, verdict, gemm };
        self.settle();
        if self.trainer.is_none() {
            // No run to wait for: it is in use from now (the first run takes it).
            self.admitted = Some(self.take_up(staged, 1));
        } else {
            self.staged = Some(staged);
        }
    }

    /// `staged` computes from `step` on: recorded as this node's backend and as a change to
    /// announce; its products are returned to be put in place.
    fn take_up(&mut self, staged: Staged, step: u32) -> Box<dyn Gemm + Send> {
        self.change = Some(BackendChange { backend: staged.name.clone(), verdict: staged.verdict, step });
        self.backend = staged.name;
        staged.gemm
    }

    fn trainer(&mut self) -> Result<&mut Trainer, ReplicaError> {
        self.settle();
        self.trainer.as_mut().ok_or(ReplicaError::NoRun)
    }

    /// Takes the trainer back from the thread running ahead, if one is (waiting for it); a
    /// step that failed there is reported by the next `compute`.
    fn settle(&mut self) {
        if let Some(RunningAhead { thread, .. }) = self.ahead.take() {
            match thread.join() {
                Ok((trainer, result)) => {
                    self.trainer = Some(trainer);
                    if let Err(e) = result {
                        self.failed = Some(e);
                    }
                }
                // The trainer is lost with the thread: the run must be configured again.
                Err(_) => {
                    self.failed =
                        Some(ComputeError::backend(std::io::Error::other("the thread running ahead panicked")))
                }
            }
        }
    }

    /// Starts the next window's first steps on a thread of its own when the run overlaps
    /// (`docs/VERIFICATION.md`, overlapped outer steps).
    fn start_ahead(&mut self) {
        let overlapped = self.trainer.as_ref().is_some_and(|t| t.run_config().sync.overlap > 0);
        if !overlapped {
            return;
        }
        let Some(mut trainer) = self.trainer.take() else { return };
        let syncs = syncs_done(&trainer);
        let spawned = std::thread::Builder::new().name("run-ahead".into()).spawn(move || {
            let result = trainer.run_ahead();
            (trainer, result)
        });
        match spawned {
            Ok(thread) => self.ahead = Some(RunningAhead { thread, syncs_done: syncs }),
            // No thread: the trainer went with the closure; the next compute says so.
            Err(e) => {
                self.failed =
                    Some(ComputeError::backend(std::io::Error::other(format!("no thread to run ahead on: {e}"))))
            }
        }
    }

    /// Hashes the current weights once and keeps the hash.
    fn rehash(&mut self) -> u32 {
        let began = std::time::Instant::now();
        let whash = self.trainer.as_ref().map_or(0, |t| t.weight_hash());
        self.hash_seconds += began.elapsed().as_secs_f64();
        self.whash = WeightHash::Known(whash);
        whash
    }

    /// The current weights' hash: known, joined from its thread, or computed now.
    fn resolve_hash(&mut self) -> u32 {
        let whash = match std::mem::replace(&mut self.whash, WeightHash::Unknown) {
            WeightHash::Known(whash) => whash,
            WeightHash::Pending(thread) => {
                let began = std::time::Instant::now();
                let Ok(whash) = thread.join() else { return self.rehash() };
                // Only the wait is on the step's path.
                self.hash_seconds += began.elapsed().as_secs_f64();
                whash
            }
            WeightHash::Unknown => return self.rehash(),
        };
        self.whash = WeightHash::Known(whash);
        whash
    }
    /// Ends the sync with the group's mean, and starts hashing the new weights.
    fn finish(&mut self, mean: &[f32], grid: &[u8], ours: bool) {
        self.settle();
        let Some(trainer) = self.trainer.as_mut() else { return };
        if let Err(e) = trainer.finish_sync(mean, grid, ours) {
            self.failed = Some(e);
            self.whash = WeightHash::Unknown;
            return;
        }
        if let Some(whash) = trainer.device_weight_hash() {
            // The device hashed its own update.
            self.whash = WeightHash::Known(whash);
            return;
        }
        let began = std::time::Instant::now();
        let weights = match trainer.weights() {
            Ok(w) => w.to_vec(),
            Err(e) => {
                self.failed = Some(e);
                self.whash = WeightHash::Unknown;
                return;
            }
        };
        self.hash_seconds += began.elapsed().as_secs_f64();
        self.whash = match std::thread::Builder::new()
            .name("weight-hash".into())
            .spawn(move || crate::params::weight_hash(&weights))
        {
            Ok(thread) => WeightHash::Pending(thread),
            Err(_) => WeightHash::Unknown,
        };
    }
}

/// The seed of a trainer's run.
fn run_seed(trainer: &Trainer) -> u64 {
    trainer.run_config().seed
}

/// Syncs a trainer's weights are the result of (checkpoints are taken at sync boundaries).
fn syncs_done(trainer: &Trainer) -> u32 {
    trainer.step_count() / trainer.run_config().steps_per_sync().max(1)
}

impl Replica for TrainerReplica {
    fn configure(&mut self, run: &RunConfig) -> Result<usize, ReplicaError> {
        let run = *run;
        run.validate().map_err(ReplicaError::Config)?;
        let ours = self.provider.corpus_digest();
        if run.corpus != 0 && run.corpus != ours {
            return Err(ReplicaError::OtherText { run: run.corpus, ours });
        }
        self.settle();
        self.undo = None;
        self.kept_states.clear();
        let data = self.provider.data_source(node_data_seed(run.seed, self.me)).map_err(ReplicaError::Data)?;
        // The backend: a swap staged during the last run, else the one admitted at start-up,
        // else the last run's (a path-loaded or swapped-in plugin stays), else open one.
        let previous = self.trainer.take();
        let gemm = if let Some(staged) = self.staged.take() {
            self.take_up(staged, 1)
        } else if let Some(gemm) = self.admitted.take() {
            gemm
        } else if let Some(previous) = previous {
            previous.into_gemm()
        } else {
            self.provider.open_backend(&self.backend).map_err(ReplicaError::Backend)?
        };
        // Admitted by the gate; now at the run's own shapes, before it computes any of it.
        let gemm = self.admit_at_shapes(&run, gemm)?;
        let trainer = Trainer::new(run, gemm, data).map_err(ReplicaError::Config)?;
        let weights = trainer.parameter_count();
        self.failed = None;
        self.trainer = Some(trainer);
        self.rehash();
        Ok(weights)
    }

    fn compute(&mut self, step: u32) -> Result<Gradient, ReplicaError> {
        self.settle();
        // A staged hot-swap takes over here, at the step boundary.
        if let Some(staged) = self.staged.take().filter(|_| self.trainer.is_some()) {
            let gemm = self.take_up(staged, step);
            self.trainer()?.replace_gemm(gemm).map_err(|(e, _refused)| ReplicaError::Compute(e))?;
        }
        if let Some(e) = self.failed.take() {
            return Err(ReplicaError::Compute(e));
        }
        let Self { trainer, audit_weights, .. } = self;
        let trainer = trainer.as_mut().ok_or(ReplicaError::NoRun)?;
        let done = syncs_done(trainer);
        if done + 1 != step {
            return Err(ReplicaError::WrongStep { asked: step, at: done });
        }
        if let Some(kept) = audit_weights {
            let weights = Arc::new(trainer.weights()?.to_vec());
            let most = audit_weights_kept(weights.len());
            kept.retain(|(s, _)| *s < step);
            kept.push_back((step, weights));
            while kept.len() > most {
                kept.pop_front();
            }
        }
        let probing = std::time::Instant::now();
        let phash = trainer.probe_hash()?;
        let probe_seconds = probing.elapsed().as_secs_f64();
        if let Some((Rogue::OthersBatch(peer), _)) = self.rogue {
            // Its batch of this step is another member's.
            let mut other =
                self.provider.data_source(node_data_seed(run_seed(trainer), peer)).map_err(ReplicaError::Data)?;
            other.seek(u64::from(trainer.step_count()));
            trainer.replace_data(other);
        }
        let tamper = match self.rogue {
            Some((Rogue::Scale(factor), _)) => Some(Tamper::Scale(factor)),
            Some((Rogue::FlipTensor, _)) => {
                Some(Tamper::Negate(crate::params::Layout::new(trainer.run_config().model).tok_emb))
            }
            Some((Rogue::ForgeState, _)) => Some(Tamper::ForgeResidual(2.0)),
            _ => None,
        };
        let wrong = tamper.is_some() || matches!(self.rogue, Some((Rogue::OthersBatch(_), _)));
        trainer.tamper(tamper);
        let window_start = matches!(trainer.run_config().sync.mode, crate::sync::SyncMode::Outer { .. })
            .then(|| trainer.adam().clone());
        let mut contribution = trainer.contribute()?;
        let mut stale = false;
        if let Some((Rogue::Stale, last)) = &mut self.rogue {
            let honest = contribution.values.clone();
            if let Some(previous) = last.take().filter(|p| p.len() == honest.len()) {
                contribution.values = previous;
                stale = true;
            }
            *last = Some(honest);
        }
        if (wrong || stale) && !self.rogue_told {
            (self.rogue_began, self.rogue_told) = (Some(step), true);
        }
        let state = match contribution.state.take() {
            Some(residual) => {
                // `outer:H`: the window's inner optimizer state at its start, then the residual.
                let state = match &window_start {
                    Some(adam) => Arc::new(crate::sync::window_state(adam, &residual)),
                    None => residual,
                };
                self.kept_states.keep(step, state)
            }
            None => 0,
        };
        if let Some(value) = self.poison {
            contribution.values = match contribution.values {
                Values::F32(v) => Values::F32(vec![value; v.len()]),
                // The int8 encoding cannot carry a NaN: the largest block exponent instead.
                Values::Int8(mut p) => {
                    p.exponents.iter_mut().for_each(|e| *e = u8::MAX);
                    p.q.iter_mut().for_each(|q| *q = 127);
                    Values::Int8(p)
                }
                Values::Int4(mut p) => {
                    p.exponents.iter_mut().for_each(|e| *e = u8::MAX);
                    p.q.iter_mut().for_each(|q| *q = crate::sync::INT4_LIMIT);
                    Values::Int4(p)
                }
            };
        }
        self.hash_seconds += probe_seconds;
        // The hash of the weights this sync started from (computed alongside, see `apply`).
        let whash = self.resolve_hash();
        self.start_ahead();
        Ok(Gradient {
            step,
            whash,
            phash,
            loss: contribution.loss,
            values: contribution.values,
            weight: contribution.weight,
            state,
        })
    }

    fn apply(&mut self, mean: &[f32], grid: &[u8], ours: bool) {
        self.undo = None;
        self.finish(mean, grid, ours);
    }

    fn apply_tentatively(&mut self, mean: &[f32], grid: &[u8], ours: bool) {
        self.settle();
        let whash = self.resolve_hash();
        let undo = match self.trainer.as_mut().map(Trainer::undo_point) {
            Some(Ok(undo)) => Some((undo, whash)),
            Some(Err(e)) => {
                // Without the state before it, the step cannot be taken tentatively: the next
                // compute reports why.
                self.failed = Some(e);
                return;
            }
            None => None,
        };
        self.finish(mean, grid, ours);
        self.undo = undo;
    }

    fn confirm(&mut self) {
        self.undo = None;
    }

    fn rollback(&mut self) {
        self.settle();
        let (Some((undo, whash)), Some(trainer)) = (self.undo.take(), self.trainer.as_mut()) else { return };
        trainer.undo(undo);
        self.whash = WeightHash::Known(whash);
    }

    fn snapshot(&mut self) -> Vec<u8> {
        self.settle();
        match self.trainer.as_mut().map(Trainer::state) {
            Some(Ok(state)) => checkpoint::encode(&state),
            Some(Err(e)) => {
                self.failed = Some(e);
                Vec::new()
            }
            None => Vec::new(),
        }
    }
    fn steps_done(&self) -> u32 {
        match &self.ahead {
            Some(away) => away.syncs_done,
            None => self.trainer.as_ref().map_or(0, syncs_done),
        }
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(u32, usize), ReplicaError> {
        self.undo = None;
        // The steps those weights started from are another history's.
        if let Some(kept) = &mut self.audit_weights {
            kept.clear();
        }
        self.kept_states.clear();
        let trainer = self.trainer()?;
        let mut state =
            checkpoint::decode(bytes, Some(trainer.run_config().model)).map_err(ReplicaError::Checkpoint)?;
        // Weights, step and optimizer come from the checkpoint; this node keeps its own data
        // stream (its batches are its own in a data-parallel group), moved to the checkpoint's
        // step, so its batch at each step is what its seed gives there whatever it joined
        // (`DataSource::seek`), and its residual starts at zero (a residual is what one node's
        // own contributions left untaken: never another's, and nothing of this node's past
        // survives a restore).
        state.data_state = trainer.data_state();
        state.sync.residual = Vec::new();
        // A group goes on as one run: a checkpoint that trains another way is refused here,
        // on every node, with the reason.
        trainer.check_continues(&state.run).map_err(ReplicaError::Restore)?;
        trainer.restore(state).map_err(ReplicaError::Restore)?;
        trainer.seek_data_to_step();
        let step = syncs_done(trainer);
        let weights = trainer.parameter_count();
        self.failed = None;
        self.rehash();
        Ok((step, weights))
    }

    fn weight_hash(&mut self) -> u32 {
        self.settle();
        self.resolve_hash()
    }

    fn take_hash_seconds(&mut self) -> f64 {
        std::mem::take(&mut self.hash_seconds)
    }

    fn poison_contributions(&mut self, value: f32) {
        self.poison = Some(value);
    }

    fn play_rogue(&mut self, rogue: Rogue) {
        self.rogue = Some((rogue, None));
        self.rogue_told = false;
    }

    fn take_rogue_began(&mut self) -> Option<u32> {
        self.rogue_began.take()
    }

    fn set_identity(&mut self, peer: u64) {
        self.me = peer;
    }

    fn corpus_digest(&mut self) -> u64 {
        self.provider.corpus_digest()
    }

    fn flip_weight_bit(&mut self) {
        self.settle();
        if let Some(Ok(mut state)) = self.trainer.as_mut().map(Trainer::state) {
            state.weights[0] = f32::from_bits(state.weights[0].to_bits() ^ 1);
            if let Some(trainer) = self.trainer.as_mut() {
                let _ = trainer.restore(state);
            }
        }
        self.whash = WeightHash::Unknown;
    }

    fn take_backend_change(&mut self) -> Option<BackendChange> {
        self.change.take()
    }

    fn take_admission_at_shapes(&mut self) -> Option<(ShapesAdmitted, f64)> {
        self.admitted_at_shapes.take()
    }

    fn keep_audit_weights(&mut self, on: bool) {
        if on != self.audit_weights.is_some() {
            self.audit_weights = on.then(VecDeque::new);
        }
    }

    fn audit_kit(
        &mut self,
        step: u32,
        target: PeerId,
        referee: Option<Box<dyn Gemm + Send>>,
        urgency: Urgency,
    ) -> Result<AuditKit, ReplicaError> {
        self.settle();
        let run = *self.trainer.as_ref().ok_or(ReplicaError::NoRun)?.run_config();
        let kept = self.audit_weights.as_ref().and_then(|k| k.iter().find(|(s, _)| *s == step));
        let weights = kept.map(|(_, w)| w.clone()).ok_or(ReplicaError::AuditWeightsGone { step })?;
        let mut data = self.provider.data_source(node_data_seed(run.seed, target)).map_err(ReplicaError::Data)?;
        if !data.positional() {
            return Err(ReplicaError::NotAuditable(data.describe()));
        }
        // A member's batch of a step is the one its stream draws at that position.
        data.seek(u64::from(step - 1) * u64::from(run.steps_per_sync()));
        let referee = match referee {
            Some(referee) => referee,
            // A routine audit's is opened on a low-priority thread: the threads it computes on
            // inherit it.
            None => std::thread::scope(|scope| {
                let provider = &mut self.provider;
                let opening = scope.spawn(move || {
                    if urgency == Urgency::Routine {
                        crate::audit::yield_to_training();
                    }
                    provider.referee()
                });
                opening
                    .join()
                    .unwrap_or_else(|_| Err(Arc::new(std::io::Error::other("the referee's opening panicked"))))
            })
            .map_err(ReplicaError::Referee)?,
        };
        Ok(AuditKit { run, step, weights, data, referee, private: None, trace: false })
    }

    fn kept_states(&self) -> KeptStates {
        self.kept_states.clone()
    }

    fn trace(&mut self, step: u32, tracing: &Tracing) -> Result<Traced, ReplicaError> {
        self.settle();
        let trainer = self.trainer.as_mut().ok_or(ReplicaError::NoRun)?;
        let run = *trainer.run_config();
        let kept = self.audit_weights.as_ref().and_then(|k| k.iter().find(|(s, _)| *s == step));
        let weights = kept.map(|(_, w)| w.clone()).ok_or(ReplicaError::AuditWeightsGone { step })?;
        let mut data = self.provider.data_source(node_data_seed(run.seed, self.me)).map_err(ReplicaError::Data)?;
        data.seek(u64::from(step - 1) * u64::from(run.steps_per_sync()));
        let (batch, _) = data.next_batch(run.batch, run.model.context);
        trainer.trace_step(&weights, &batch.tokens, &batch.targets, tracing).map_err(ReplicaError::Compute)
    }

    fn hurry(&self) -> Option<Arc<AtomicU32>> {
        // Asked right after a configure, when the trainer is here (not away running ahead).
        self.trainer.as_ref().map(Trainer::hurry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::CorpusSource;
    use crate::gemm::FloatGemm;

    /// An auditor whose applied step is the promise ahead of a contribution's may ask for its
    /// state while this member computes the next step and lags by one more: still served, at a
    /// GPT-2-sized residual (the fewest kept) as at a tiny one.
    #[test]
    fn states_are_served_past_the_promise_while_the_next_step_computes() {
        for len in [10_000, 85_800_000] {
            let kept = KeptStates::default();
            let state = Arc::new(vec![0.5f32; len]);
            let promised = crate::session::STATE_PROMISED_STEPS;
            // The asker applied step 1 + promised + 1 (it lags the group by one); this member
            // applied the group's step 1 + promised + 2 and computes the next.
            for step in 1..=1 + promised + 3 {
                kept.keep(step, state.clone());
            }
            assert!(
                kept.get(1).is_some(),
                "len {len}: kept {:?}",
                kept.0.lock().unwrap().iter().map(|(s, _, _)| *s).collect::<Vec<_>>()
            );
        }
    }

    /// Float products and the built-in corpus; a backend opened by name is refused, so a test
    /// that needed one fails.
    struct FloatOnly;

    impl Provider for FloatOnly {
        fn open_backend(&mut self, name: &str) -> Result<Box<dyn Gemm + Send>, ForeignError> {
            Err(Arc::new(std::io::Error::other(format!("no backend `{name}` in this test"))))
        }

        fn data_source(&mut self, seed: u64) -> Result<Box<dyn DataSource>, ForeignError> {
            Ok(Box::new(CorpusSource::builtin(seed)))
        }

        fn referee(&mut self) -> Result<Box<dyn Gemm + Send>, ForeignError> {
            Err(Arc::new(std::io::Error::other("no referee in this test (float products are not checked)")))
        }
    }

    fn as_f32(gradient: &Gradient) -> &[f32] {
        match &gradient.values {
            crate::sync::Values::F32(v) => v,
            crate::sync::Values::Int8(_) | crate::sync::Values::Int4(_) => panic!("an uncompressed run sends f32"),
        }
    }

    fn tiny() -> RunConfig {
        RunConfig {
            model: crate::config::ModelConfig { width: 32, context: 32, layers: 1, heads: 2 },
            batch: 2,
            ..RunConfig::DEFAULT
        }
    }

    #[test]
    fn a_new_run_keeps_the_backend_the_last_run_ended_with() {
        // A name nothing resolves to: a second run that opened `backend` again would fail.
        let float = Box::new(FloatGemm::new(1));
        let mut replica = TrainerReplica::new("no-such-backend", Box::new(FloatOnly), Some(float));
        replica.configure(&tiny()).expect("the first run takes the admitted backend");
        let gradient = replica.compute(1).expect("a step");
        replica.apply(as_f32(&gradient), &[], true);
        assert_eq!(replica.weight_hash(), replica.compute(2).expect("a second step").whash);
        replica.configure(&tiny()).expect("the second run takes the first run's backend");
        assert_eq!(replica.compute(1).expect("a step of the new run"), gradient);
    }

    /// The group applied step 2 before this member's compute of it began (the adapter took the
    /// replica first, or the member caught up on records): the compute is refused as stale, in
    /// every mode — never run on the new weights as if they were the old ones. (In `outer:H` the
    /// step count once stayed behind, the stale compute ran, and its weights forked.)
    #[test]
    fn a_compute_begun_after_its_step_was_applied_is_refused_as_stale() {
        for (sync, overlap) in [("every-step", "0"), ("outer:2", "0"), ("outer:2", "1")] {
            let run = crate::settings::with(tiny(), [("sync", sync), ("overlap", overlap)]).expect("a sync mode");
            let sync = format!("{sync} overlap {overlap}");
            let member = || {
                let mut r = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
                r.configure(&run).expect("a run");
                r
            };
            let (mut a, mut b) = (member(), member());
            let first = a.compute(1).expect("step 1");
            b.compute(1).expect("step 1");
            a.apply(as_f32(&first), &[], true);
            b.apply(as_f32(&first), &[], true);
            // Step 2's mean, from a's contribution alone: b never began its own.
            let second = a.compute(2).expect("step 2");
            a.apply(as_f32(&second), &[], true);
            b.apply(as_f32(&second), &[], false);
            assert_eq!(b.steps_done(), 2, "{sync}: a sync applied without computing counts");
            assert!(
                matches!(b.compute(2), Err(ReplicaError::WrongStep { asked: 2, at: 2 })),
                "{sync}: the stale compute is refused"
            );
            assert_eq!(b.weight_hash(), a.weight_hash(), "{sync}: one group, one set of weights");
            assert_eq!(b.compute(3).expect("step 3").whash, a.compute(3).expect("step 3").whash, "{sync}");
        }
    }

    /// A step taken tentatively and undone leaves the replica as it was, bit for bit: the
    /// weights, and the next contribution (the same batch, the same optimizer state).
    #[test]
    fn an_undone_step_leaves_the_replica_as_it_was() {
        for sync in ["every-step", "outer:2"] {
            let run = crate::settings::with(tiny(), [("sync", sync)]).expect("a sync mode");
            let mut replica = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
            replica.configure(&run).expect("a run");
            let first = replica.compute(1).expect("step 1");
            let (before, done) = (replica.weight_hash(), replica.steps_done());
            let other: Vec<f32> = as_f32(&first).iter().map(|v| v * 0.5).collect();
            replica.apply_tentatively(&other, &[], true);
            assert_ne!(replica.weight_hash(), before, "{sync}: the tentative step moved the weights");
            let on_top = replica.compute(2).expect("step 2 behind the commit");
            replica.rollback();
            assert_eq!(replica.weight_hash(), before, "{sync}: undone");
            assert_eq!(replica.steps_done(), done, "{sync}");
            // The step that did commit, then the next, as a replica that never guessed has them.
            let mut plain = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
            plain.configure(&run).expect("a run");
            assert_eq!(plain.compute(1).expect("step 1"), first);
            plain.apply(as_f32(&first), &[], true);
            replica.apply(as_f32(&first), &[], true);
            let (ours, theirs) = (replica.compute(2).expect("step 2"), plain.compute(2).expect("step 2"));
            assert_eq!(ours, theirs, "{sync}: the same contribution after the undo");
            assert_ne!(ours.whash, on_top.whash, "{sync}");
            // A step that stands: confirmed, it is the plain apply's.
            replica.apply_tentatively(as_f32(&ours), &[], true);
            replica.confirm();
            plain.apply(as_f32(&theirs), &[], true);
            assert_eq!(replica.weight_hash(), plain.weight_hash(), "{sync}: confirmed");
        }
    }

    #[test]
    fn a_staged_swap_takes_over_at_the_next_step_and_is_reported_once() {
        let mut replica = TrainerReplica::new("first", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
        replica.configure(&tiny()).expect("a run");
        let first = replica.compute(1).expect("step 1");
        replica.apply(as_f32(&first), &[], true);
        replica.stage("second".into(), Verdict::Admitted { cases: 40 }, Box::new(FloatGemm::new(2)));
        assert_eq!(replica.take_backend_change(), None, "staged, not yet in use");
        replica.compute(2).expect("step 2");
        assert_eq!(
            replica.take_backend_change(),
            Some(BackendChange { backend: "second".into(), verdict: Verdict::Admitted { cases: 40 }, step: 2 })
        );
        assert_eq!(replica.take_backend_change(), None);
    }

    /// An audit recomputes a packed contribution from the state it named, in every audited
    /// mode — `every-step` (the residual) and `outer:H` (the window's inner optimizer state and
    /// the residual; the window run again by a trainer on the referee): the values and loss
    /// bit for bit, and the digest of the state the contribution leaves is the one the
    /// member's next contribution names. A state the member did not start from gives other
    /// values. An audit of a part (`every-step`: two chunks of the residual, zeros elsewhere)
    /// gives the same values and the same next residual in those chunks.
    #[test]
    fn an_audit_recomputes_a_packed_contribution_and_the_state_it_leaves() {
        for (sync, compress) in [("every-step", "int8"), ("outer:2", "int8"), ("outer:3", "int4")] {
            let run = crate::settings::with(tiny(), [("sync", sync), ("compress", compress)]).expect("a sync mode");
            let mut member = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
            member.set_identity(5);
            member.keep_audit_weights(true);
            member.configure(&run).expect("a run");
            let kept = member.kept_states();
            let mut left: Option<u64> = None;
            for step in 1..=3 {
                let sent = member.compute(step).expect("a contribution");
                let state = kept.get(step).expect("the state it named is kept");
                assert_eq!(crate::wire::state_digest(&state), sent.state, "{sync} {compress} step {step}");
                let n = crate::params::Layout::new(run.model).len;
                assert_eq!(state.len(), crate::sync::private_state_len(&run.sync, n));
                if let Some(left) = left {
                    assert_eq!(sent.state, left, "{sync} {compress} step {step}: the link holds");
                }
                let reduced = crate::sync::reduce_one(sent.values.clone());
                let grid = Arc::new(reduced.grid.clone());
                let audit_part = |state: Arc<Vec<f32>>, checked: Option<Vec<u32>>, member: &mut TrainerReplica| {
                    let mut kit =
                        member.audit_kit(step, 5, Some(Box::new(FloatGemm::new(1))), Urgency::Routine).expect("a kit");
                    let (grid, weight, checked) = (grid.clone(), sent.weight, checked.map(Arc::new));
                    kit.private = Some(PrivateInputs { residual: state, checked, grid, weight });
                    kit.recompute().0.expect("recomputed")
                };
                let audit = |state: Arc<Vec<f32>>, member: &mut TrainerReplica| audit_part(state, None, member);
                let again = audit(state.clone(), &mut member);
                assert_eq!(again.values, sent.values, "{sync} {compress} step {step}");
                assert_eq!(again.loss.to_bits(), sent.loss.to_bits(), "{sync} {compress} step {step}");
                let next = again.next_state.clone().expect("the values fit the grid");
                left = Some(crate::wire::state_digest_of(state.len(), &next));
                if sync == "every-step" {
                    assert!(crate::wire::chunks_of(state.len()) > 3, "a residual of more than three chunks");
                    let mut part = vec![0.0; state.len()];
                    for c in [1, 3] {
                        let range = crate::wire::chunk_range(c, state.len());
                        part[range.clone()].copy_from_slice(&state[range]);
                    }
                    let of_part = audit_part(Arc::new(part), Some(vec![1, 3]), &mut member);
                    let (Values::Int8(whole), Values::Int8(got)) = (&sent.values, &of_part.values) else {
                        panic!("int8 values")
                    };
                    for c in [1, 3] {
                        let range = crate::wire::chunk_range(c, state.len());
                        let values =
                            |p: &crate::sync::Packed| range.clone().map(|i| p.value(i).to_bits()).collect::<Vec<_>>();
                        assert_eq!(values(got), values(whole), "chunk {c} at step {step}");
                        assert_eq!(
                            of_part.next_state.as_ref().expect("fits")[c as usize],
                            next[c as usize],
                            "chunk {c}"
                        );
                    }
                    assert_eq!(of_part.loss.to_bits(), sent.loss.to_bits());
                }
                if step > 1 {
                    // The residual doubled, as the `state` rogue does (it is the state's tail).
                    let mut forged = state.to_vec();
                    forged[state.len() - n..].iter_mut().for_each(|r| *r *= 2.0);
                    let forged = Arc::new(forged);
                    assert_ne!(audit(forged, &mut member).values, sent.values, "{sync} {compress} step {step}");
                }
                member.apply(&reduced.mean, &reduced.grid, true);
            }
        }
    }

    /// A member resumed from a checkpoint at step 3 computes, at step 4, the gradient a member
    /// that trained from the start computes there: its batch depends on its seed and the step,
    /// not on when it joined (`docs/TRUST.md`, batches by position).
    #[test]
    fn a_member_resumed_mid_run_draws_the_batch_of_the_step() {
        let replica = || TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
        let mut from_start = replica();
        from_start.configure(&tiny()).expect("a run");
        for step in 1..=3 {
            let gradient = from_start.compute(step).expect("a step");
            from_start.apply(as_f32(&gradient), &[], true);
        }
        let checkpoint = from_start.snapshot();
        let mut joiner = replica();
        joiner.configure(&tiny()).expect("a run");
        // The joiner has drawn a batch of its own before it is resumed.
        let early = joiner.compute(1).expect("a step");
        joiner.apply(as_f32(&early), &[], true);
        assert_eq!(joiner.restore(&checkpoint).expect("a resume").0, 3);
        assert_eq!(joiner.compute(4).expect("a step"), from_start.compute(4).expect("a step"));
    }

    /// `outer:4` with an overlap of 2: the replica runs the next window's first steps on a
    /// thread of its own after each contribution and gives the bits of a trainer driven by
    /// hand (contribute, run ahead, finish); its hash and checkpoint are the group's state at
    /// the sync, and a member resumed from that checkpoint contributes from the same weights.
    #[test]
    fn an_overlapped_replica_runs_ahead_and_checkpoints_the_groups_state() {
        let mut run = tiny();
        run.steps = 12;
        run.sync = crate::sync::SyncConfig {
            mode: crate::sync::SyncMode::Outer { inner_steps: 4 },
            overlap: 2,
            ..crate::sync::SyncConfig::SEED
        };
        let replica = || TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
        let mut member = replica();
        member.configure(&run).expect("a run");
        let mut by_hand = Trainer::new(
            run,
            Box::new(FloatGemm::new(1)),
            Box::new(CorpusSource::builtin(node_data_seed(run.seed, 0))),
        )
        .expect("a run");
        let halved = |g: &Gradient| as_f32(g).iter().map(|v| v * 0.5).collect::<Vec<f32>>();
        for step in 1..=2 {
            let gradient = member.compute(step).expect("a sync");
            assert_eq!(member.steps_done(), step, "running ahead adds no sync");
            let contribution = by_hand.contribute().expect("a sync");
            assert_eq!(Values::F32(as_f32(&gradient).to_vec()), contribution.values);
            by_hand.run_ahead().expect("steps ahead");
            // Any mean will do: half the contribution.
            member.apply(&halved(&gradient), &[], true);
            by_hand.finish_sync(&halved(&gradient), &[], true).expect("the mean");
            assert_eq!(member.weight_hash(), by_hand.weight_hash());
            assert_eq!(by_hand.step_count(), 4 * step + 2, "two steps ahead");
        }
        let checkpoint = member.snapshot();
        let state = checkpoint::decode(&checkpoint, Some(run.model)).expect("a checkpoint");
        assert_eq!(state.step, 8, "the sync's step, not the steps run ahead");
        assert_eq!(crate::params::weight_hash(&state.weights), by_hand.weight_hash());
        let mut joiner = replica();
        joiner.configure(&run).expect("a run");
        assert_eq!(joiner.restore(&checkpoint).expect("a resume").0, 2);
        let from_start = member.compute(3).expect("the last sync");
        let joined = joiner.compute(3).expect("the last sync");
        assert_eq!(joined.whash, from_start.whash, "both contribute from the group's weights");
        assert_ne!(joined.values, from_start.values, "the joiner has no steps ahead");
    }

    #[test]
    fn errors_stay_typed() {
        let mut replica = TrainerReplica::new("none", Box::new(FloatOnly), None);
        assert!(matches!(replica.compute(1), Err(ReplicaError::NoRun)));
        assert!(matches!(replica.configure(&tiny()), Err(ReplicaError::Backend(_))));
        let mut bad = tiny();
        bad.model.heads = 3;
        assert!(matches!(
            replica.configure(&bad),
            Err(ReplicaError::Config(ConfigError::HeadsDoNotDivideWidth { width: 32, heads: 3 }))
        ));
        let mut replica = TrainerReplica::new("f", Box::new(FloatOnly), Some(Box::new(FloatGemm::new(1))));
        replica.configure(&tiny()).expect("a run");
        assert!(matches!(replica.compute(2), Err(ReplicaError::WrongStep { asked: 2, at: 0 })));
        assert!(matches!(replica.restore(b"not a checkpoint"), Err(ReplicaError::Checkpoint(_))));
    }
}
