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
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use crate::admission::{check_at_run_shapes, ShapesAdmitted, ShapesRefused};
use crate::audit::{Traced, Tracing};
use crate::checkpoint::{self, CheckpointError};
use crate::compute_error::ComputeError;
use crate::config::{ConfigError, RunConfig};
use crate::data::{node_data_seed, DataSource};
use crate::gemm::Gemm;
use crate::session::{PrivateInputs, Recomputed, WeightsChecked};
use crate::sync::Tamper;
use crate::trainer::{ContributeError, RestoreError, TrainState, Trainer, Undo};
use crate::verdict::Verdict;
use crate::wire::{Gradient, PeerId, Values};

mod audit;
mod error;
mod hash;
mod rogue;
mod updates;

use audit::audit_weights_kept;
pub use audit::{AuditKit, KeptStates};
pub use error::{ForeignError, ReplicaError};
use hash::WeightHash;
pub use rogue::Rogue;

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
    /// without the replica: the weights `step` was computed from and `target`'s batch of it.
    /// Its referee is the caller's to lend (the last audit's of its urgency); where none is,
    /// the recomputation opens one where it runs — a routine audit's on its low-priority
    /// thread, a check's at the member's own.
    fn audit_kit(&mut self, _step: u32, _target: PeerId) -> Result<AuditKit, ReplicaError> {
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
    /// The guard's disputes (leader): the weights our contribution to `step` was computed
    /// from, checked against the definition's update of `step - 1`, run again on the host from
    /// the state before it and the group's mean.
    fn check_weights(&mut self, step: u32) -> Result<WeightsChecked, ReplicaError> {
        Err(ReplicaError::UpdateGone { step })
    }
    /// The guard's disputes (a disputed member): the first chunk of the weights our
    /// contribution to `step` was computed from whose digest is not `digests`' (the leader's),
    /// with its words; `None` when they are no longer kept or none parts.
    fn weights_apart(&mut self, _step: u32, _digests: &[u64]) -> Option<(u32, Vec<u32>)> {
        None
    }
    fn kept_states(&self) -> KeptStates {
        KeptStates::default()
    }
    /// What opens a referee for audits ([`Provider::audit_referee_opener`]); `None`: this replica
    /// recomputes nobody's work.
    fn referee_opener(&self) -> Option<RefereeOpener> {
        None
    }
    /// Elastic windows: where the adapter tells the window under way to end
    /// ([`crate::trainer::Trainer::hurry`]: the steps after which it ends), for the run just
    /// configured (the adapter asks once, after `configure`); `None` before a run.
    fn hurry(&self) -> Option<Arc<AtomicU32>> {
        None
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
    /// What opens the referee that recomputes the products when a backend is admitted at a
    /// run's shapes: the CPU mirror, gated, on every core. An opener rather than
    /// a referee: opening one (the gate) takes hundreds of milliseconds on a busy machine, so an
    /// audit opens it on its own thread, at its priority, never on the adapter's loop.
    fn referee_opener(&self) -> RefereeOpener;
    /// What opens the referees audits recompute on (each audit that may run at once keeps its
    /// own): [`Provider::referee_opener`]'s unless the node limits its audits' threads.
    fn audit_referee_opener(&self) -> RefereeOpener {
        self.referee_opener()
    }
}

/// Opens a referee ([`Provider::referee_opener`]) on whatever thread calls it.
pub type RefereeOpener = Arc<dyn Fn() -> Result<Box<dyn Gemm + Send>, ForeignError> + Send + Sync>;

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
    undo: Option<(Arc<Undo>, u32)>,
    /// The guard's disputes: the last updates applied, with the state each started from.
    updates: updates::KeptUpdates,
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
    /// The trainer's run (an audit's kit needs no more of it: no wait for the steps ahead).
    run: RunConfig,
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
            updates: updates::KeptUpdates::default(),
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
            None => (self.provider.referee_opener())().map_err(ReplicaError::Referee),
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
        let (syncs, run) = (syncs_done(&trainer), *trainer.run_config());
        let spawned = std::thread::Builder::new().name("run-ahead".into()).spawn(move || {
            let result = trainer.run_ahead();
            (trainer, result)
        });
        match spawned {
            Ok(thread) => self.ahead = Some(RunningAhead { thread, syncs_done: syncs, run }),
            // No thread: the trainer went with the closure; the next compute says so.
            Err(e) => {
                self.failed =
                    Some(ComputeError::backend(std::io::Error::other(format!("no thread to run ahead on: {e}"))))
            }
        }
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
        self.begin_updates();
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
        let rogue = self.rogue.as_ref().map(|(kind, _)| *kind);
        let wrong = rogue::arm(rogue, trainer, self.provider.as_mut())?;
        let window_start = trainer.window_start();
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
        let state = match (contribution.state.take(), window_start) {
            // `outer:H`: the window's inner optimizer state at its start (and the steps run
            // ahead, where the run overlaps), then the residual (none in f32).
            (residual, Some(mut window)) => {
                window.residual = residual.map(Arc::unwrap_or_clone).unwrap_or_default();
                self.kept_states.keep(step, Arc::new(crate::sync::window_state(&window)))
            }
            (Some(residual), None) => self.kept_states.keep(step, residual),
            (None, None) => 0,
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
        self.settle();
        let before = self.before_update();
        self.finish(mean, grid, ours);
        self.keep_update(before, mean, grid, ours);
    }

    fn apply_tentatively(&mut self, mean: &[f32], grid: &[u8], ours: bool) {
        self.settle();
        let whash = self.resolve_hash();
        let undo = match self.trainer.as_mut().map(Trainer::undo_point) {
            Some(Ok(undo)) => Some((Arc::new(undo), whash)),
            Some(Err(e)) => {
                // Without the state before it, the step cannot be taken tentatively: the next
                // compute reports why.
                self.failed = Some(e);
                return;
            }
            None => None,
        };
        self.finish(mean, grid, ours);
        let before = undo.as_ref().filter(|_| self.keeps_updates()).map(|(u, _)| u.clone());
        self.keep_update(before, mean, grid, ours);
        self.undo = undo;
    }

    fn confirm(&mut self) {
        self.undo = None;
    }

    fn rollback(&mut self) {
        self.settle();
        let (Some((undo, whash)), Some(trainer)) = (self.undo.take(), self.trainer.as_mut()) else { return };
        self.updates.undone(syncs_done(trainer));
        trainer.undo(Arc::unwrap_or_clone(undo));
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
        self.begin_updates();
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
        if let Some(trainer) = self.trainer.as_mut() {
            if let Err(e) = trainer.flip_weight_bit() {
                self.failed = Some(e);
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

    fn audit_kit(&mut self, step: u32, target: PeerId) -> Result<AuditKit, ReplicaError> {
        // The run's settings, without waiting for a window's steps run ahead (on the loop).
        let running = self.trainer.as_ref().map(|t| *t.run_config());
        let run = running.or(self.ahead.as_ref().map(|a| a.run)).ok_or(ReplicaError::NoRun)?;
        let weights = self.started_from(step)?;
        let mut data = self.provider.data_source(node_data_seed(run.seed, target)).map_err(ReplicaError::Data)?;
        if !data.positional() {
            return Err(ReplicaError::NotAuditable(data.describe()));
        }
        // A member's batch of a step is the one its stream draws at that position.
        data.seek(u64::from(step - 1) * u64::from(run.steps_per_sync()));
        // Where none was kept, the audit opens its referee on its own thread (at its priority).
        let open_referee = self.provider.audit_referee_opener();
        Ok(AuditKit { run, step, weights, data, referee: None, open_referee, private: None, trace: false })
    }

    fn referee_opener(&self) -> Option<RefereeOpener> {
        Some(self.provider.audit_referee_opener())
    }

    fn kept_states(&self) -> KeptStates {
        self.kept_states.clone()
    }

    fn check_weights(&mut self, step: u32) -> Result<WeightsChecked, ReplicaError> {
        self.check_weights_of(step)
    }

    fn weights_apart(&mut self, step: u32, digests: &[u64]) -> Option<(u32, Vec<u32>)> {
        self.weights_apart_of(step, digests)
    }

    fn trace(&mut self, step: u32, tracing: &Tracing) -> Result<Traced, ReplicaError> {
        self.settle();
        let weights = self.started_from(step)?;
        let trainer = self.trainer.as_mut().ok_or(ReplicaError::NoRun)?;
        let run = *trainer.run_config();
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
mod tests;
