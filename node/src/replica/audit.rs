//! The replica's side of audits (`docs/TRUST.md`): what it keeps for them — the weights each
//! step started from, the private states its contributions named — and what recomputing
//! another member's contribution takes ([`AuditKit`]), out of the replica so a recomputation
//! holds no lock while it runs.

use std::collections::VecDeque;
use std::sync::Arc;

use super::*;

/// Steps whose starting weights a replica keeps for audits (a commit and its audit come a few
/// steps behind the compute; a dispute's traces a few more): at least this many…
const AUDIT_WEIGHTS_KEPT: usize = 4;
/// …and as many more as fit this many bytes, up to [`AUDIT_WEIGHTS_MOST`] (small models step
/// hundreds of times a second: a dispute's round trips span tens of their steps).
const AUDIT_WEIGHTS_BYTES: usize = 64 << 20;
const AUDIT_WEIGHTS_MOST: usize = 64;

/// How many steps' weights of `len` values a replica keeps for audits.
pub(super) fn audit_weights_kept(len: usize) -> usize {
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

/// What recomputing one member's contribution needs ([`Replica::audit_kit`]).
pub struct AuditKit {
    pub run: RunConfig,
    pub step: u32,
    /// The weights the step was computed from.
    pub weights: Arc<Vec<f32>>,
    /// The audited member's data stream, at its batch of the step.
    pub data: Box<dyn DataSource>,
    /// The referee kept from the last recomputation, if any; else [`AuditKit::open_referee`]
    /// opens one where the recomputation runs.
    pub referee: Option<Box<dyn Gemm + Send>>,
    pub open_referee: RefereeOpener,
    /// `int8`, `int4`, `outer:H`: the private state the member's contribution named (served by
    /// it, its digest checked) and the grid the group summed the step on (empty in f32).
    pub private: Option<PrivateInputs>,
    /// Record the definition's trace of the step as it is recomputed (`every-step`).
    pub trace: bool,
}

impl AuditKit {
    /// The audited member's contribution as the definition gives it, and the referee back.
    /// `every-step`: its loss and gradient on its batch at the weights, the products and ops on
    /// the referee; packed, the gradient plus the residual it named, packed
    /// ([`crate::sync::repack`]), and the digest of the residual that leaves on the group's
    /// grid (what its next contribution must name). `outer:H` (no overlap): its window
    /// run again by a trainer on the referee from the group's weights, the inner optimizer state
    /// it named, its batches and the steps it claims — the member's own code path — and the
    /// digest of the state the window leaves.
    /// The referee comes back for the next (`None`: none could be opened).
    pub fn recompute(mut self) -> (Result<Recomputed, ComputeError>, Option<Box<dyn Gemm + Send>>) {
        let referee = match self.referee() {
            Ok(referee) => referee,
            Err(e) => return (Err(e), None),
        };
        let (outcome, referee) = match self.run.sync.mode {
            crate::sync::SyncMode::EveryStep => self.recompute_step(referee),
            crate::sync::SyncMode::Outer { .. } => self.recompute_window(referee),
        };
        (outcome, Some(referee))
    }

    /// The referee kept, or one opened here (the caller's thread: the audit's own).
    fn referee(&mut self) -> Result<Box<dyn Gemm + Send>, ComputeError> {
        match self.referee.take() {
            Some(referee) => Ok(referee),
            None => (self.open_referee)()
                .map_err(|e| ComputeError::backend(std::io::Error::other(format!("no referee to recompute on: {e}")))),
        }
    }

    /// A disputed contribution's step run again on the referee (the definition), compared op
    /// by op with `theirs`, the target's trace of it: where the two first part (this side's
    /// words of the first differing chunk), or that they agree. `every-step` only.
    pub fn settle(
        mut self,
        theirs: Arc<crate::audit::Trace>,
    ) -> (Result<Traced, ComputeError>, Option<Box<dyn Gemm + Send>>) {
        let mut referee = match self.referee() {
            Ok(referee) => referee,
            Err(e) => return (Err(e), None),
        };
        let run = self.run;
        let model = crate::model::Model::new(crate::params::Layout::new(run.model));
        let (batch, _) = self.data.next_batch(run.batch, run.model.context);
        let (b, t) = (run.batch, run.model.context);
        let tracing = Tracing::Against(theirs);
        let traced = model.trace(referee.as_mut(), &self.weights, &batch.tokens, &batch.targets, b, t, &tracing);
        model.release(referee.as_mut());
        (traced, Some(referee))
    }

    fn recompute_step(
        mut self,
        mut referee: Box<dyn Gemm + Send>,
    ) -> (Result<Recomputed, ComputeError>, Box<dyn Gemm + Send>) {
        let run = self.run;
        let model = crate::model::Model::new(crate::params::Layout::new(run.model));
        let (batch, _) = self.data.next_batch(run.batch, run.model.context);
        let weights = crate::model::Weights::Host(&self.weights);
        let (t, b) = (run.model.context, run.batch);
        let (tokens, targets) = (&batch.tokens, &batch.targets);
        let stepped = if self.trace {
            let traced = model.step_traced(referee.as_mut(), &self.weights, tokens, targets, b, t);
            traced.map(|(loss, grad, trace)| (loss, grad, Some(Arc::new(trace))))
        } else {
            let stepped = model.step(referee.as_mut(), weights, tokens, targets, b, t, None, self.step);
            stepped.map(|(loss, grad, _)| (loss, grad, None))
        };
        // The model's buffers on the referee go with it.
        model.release(referee.as_mut());
        let outcome = stepped.map(|(loss, grad, trace)| {
            let Some(PrivateInputs { residual: state, grid, checked, .. }) = &self.private else {
                return Recomputed { loss, values: Values::F32(grad), next_state: None, next_words: None, trace };
            };
            // The session checked the residual's length and digests against what the member
            // named; of a part, only the chunks checked are the member's.
            let part: Option<Vec<_>> =
                checked.as_ref().map(|c| c.iter().map(|&c| crate::wire::chunk_range(c, state.len())).collect());
            // The step's record number counts from 1: the member had taken one fewer.
            match crate::sync::repack(grad, state, &run.sync, self.step - 1, grid, part.as_deref()) {
                Ok(repacked) => {
                    let next_state = repacked.next_state.as_deref().map(crate::wire::state_chunk_digests);
                    // Of a part, the residual left is right in the chunks checked alone.
                    let next_words = repacked.next_state.filter(|_| part.is_none()).map(Arc::new);
                    Recomputed { loss, values: repacked.values, next_state, next_words, trace }
                }
                Err(_) => Recomputed::no_contribution(loss),
            }
        });
        (outcome, referee)
    }

    fn recompute_window(
        self,
        referee: Box<dyn Gemm + Send>,
    ) -> (Result<Recomputed, ComputeError>, Box<dyn Gemm + Send>) {
        let AuditKit { run, step, weights, data, private, .. } = self;
        let Some(PrivateInputs { residual: state, grid, weight, .. }) = private else {
            let refused = std::io::Error::other("an outer:H contribution is audited with the state it named");
            return (Err(ComputeError::backend(refused)), referee);
        };
        let n = weights.len();
        let Some(named) = crate::sync::split_window_state(&state, &run.sync, n) else {
            let refused = std::io::Error::other("the named state is not an outer:H window's");
            return (Err(ComputeError::backend(refused)), referee);
        };
        let data_state = data.state();
        let mut trainer = match Trainer::to_restore(run, referee, data) {
            Ok(trainer) => trainer,
            Err(e) => unreachable!("the run was validated when it was configured: {e}"),
        };
        let sync = crate::sync::SyncState { outer_momentum: vec![0.0; n], residual: named.residual };
        // Overlapped, the window's first steps ran from the member's own weights, named.
        let ahead = named.ahead.filter(|(steps, _)| *steps > 0);
        let at = TrainState {
            run,
            step: (step - 1) * run.steps_per_sync(),
            weights: ahead.as_ref().map_or_else(|| weights.to_vec(), |(_, from)| from.clone()),
            adam: named.adam,
            data_state,
            sync,
        };
        let outcome = trainer.restore(at).map_err(|e| ComputeError::backend(std::io::Error::other(e.to_string())));
        let outcome = outcome.and_then(|()| {
            if let Some((steps, _)) = ahead {
                trainer.run_ahead()?;
                if trainer.step_count() != (step - 1) * run.steps_per_sync() + steps {
                    // Not the steps the run gives a window here: no honest member names this.
                    return Ok(Recomputed::no_contribution(f32::NAN));
                }
                trainer.rebase_onto(weights.to_vec());
            }
            if run.sync.elastic {
                trainer.hurry().store(weight, std::sync::atomic::Ordering::Relaxed);
            }
            let contribution = match trainer.contribute() {
                Ok(contribution) => contribution,
                Err(ContributeError::Compute(e)) => return Err(e),
                Err(ContributeError::NonFinite(_)) => return Ok(Recomputed::no_contribution(f32::NAN)),
            };
            // What the next window names: its steps run ahead begin here (overlapped runs).
            let next_ahead = match run.sync.overlap {
                0 => None,
                _ => match trainer.steps_to_run_ahead() {
                    0 => Some((0, Vec::new())),
                    steps => Some((steps, trainer.weights()?.to_vec())),
                },
            };
            let next_adam = trainer.adam().clone();
            // The residual the window leaves is computed before the outer step, whatever mean;
            // packed values that do not fit the group's grid are not what it summed (no state
            // left). An f32 window has no grid.
            let fits = contribution.values.packed().is_none_or(|p| crate::sync::fits(p, &grid));
            let next_state = if fits {
                trainer.finish_sync(&vec![0.0; n], &grid, true)?;
                let residual = trainer.state()?.sync.residual;
                let next = crate::sync::WindowState { adam: next_adam, ahead: next_ahead, residual };
                Some(crate::sync::window_state(&next))
            } else {
                None
            };
            let next_state = next_state.map(Arc::new);
            let next_digests = next_state.as_deref().map(|s| crate::wire::state_chunk_digests(s));
            let (loss, values) = (contribution.loss, contribution.values);
            Ok(Recomputed { loss, values, next_state: next_digests, next_words: next_state, trace: None })
        });
        (outcome, trainer.into_gemm())
    }
}

impl TrainerReplica {
    /// The weights our contribution to `step` was computed from (kept for audits: what an audit,
    /// a trace or the guard's dispute of that step starts from).
    pub(super) fn started_from(&self, step: u32) -> Result<Arc<Vec<f32>>, ReplicaError> {
        let kept = self.audit_weights.as_ref().and_then(|k| k.iter().find(|(s, _)| *s == step));
        kept.map(|(_, w)| w.clone()).ok_or(ReplicaError::AuditWeightsGone { step })
    }
}
