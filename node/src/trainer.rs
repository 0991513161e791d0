//! One node's training loop: gradient through the active `Gemm`, one Adam update.
//!
//! A step is split in two so the mesh can average gradients in between: [`Trainer::gradient`]
//! samples the node's batch and returns loss and gradient; [`Trainer::apply`] applies one Adam
//! update from a (possibly averaged) gradient. [`Trainer::step`] does both for a lone node.
//!
//! **Where the state lives.** On a backend with its own executor (ABI 2) and `every-step`
//! syncs, the weights and Adam's moments stay on the backend's device from the first step on:
//! a step takes the loss and the gradient out, the update sends the mean gradient in and takes
//! the weight hash out, nothing else crosses. The trainer's own copies are then brought up to
//! date only when asked for ([`Trainer::weights`], [`Trainer::state`], evaluation, a hot-swap,
//! which moves the state to the new backend by download and upload). Everywhere else (the float
//! reference, ABI 1 plugins, `outer:H`) the host holds the state and runs Adam itself; the bits
//! are the same either way.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::adam::{schedule, Adam};
use crate::audit::{Audit, Auditing};
use crate::compute_error::ComputeError;
use crate::config::{ConfigError, ModelConfig, RunConfig};
use crate::data::{Batch, DataSource, Origin};
use crate::gemm::Gemm;
use crate::model::{AdamStep, Model, Weights};
use crate::params::{init, weight_hash, Layout};
use crate::sync::{Member, StepRule, Strategy, SyncState};

pub use crate::sync::{ContributeError, Contribution};

/// Everything that determines the next update: what a checkpoint or a mid-run resume carries.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainState {
    pub run: RunConfig,
    /// Steps completed.
    pub step: u32,
    pub weights: Vec<f32>,
    pub adam: Adam,
    /// The data source's sampler state.
    pub data_state: u64,
    /// What the sync settings keep between syncs (outer momentum, int8 residual).
    pub sync: SyncState,
}

/// What the trainer's host copies are worth while the backend's device holds the training state.
#[derive(Clone, Copy, Debug)]
struct OnDevice {
    /// The host's weights equal the device's.
    weights_on_host: bool,
    /// The host's moments equal the device's.
    moments_on_host: bool,
    /// The hash the device computed after its last update (`None`: no update since the upload,
    /// so the host's weights are current).
    hash: Option<u32>,
}

/// What one step (or, `outer:H`, one outer step) did.
#[derive(Clone, Debug)]
pub struct StepReport {
    /// Optimizer steps completed after this one.
    pub step: u32,
    pub loss: f32,
    /// Weight hash after the update.
    pub weight_hash: u32,
    /// Tokens this node trained on in it.
    pub tokens: usize,
    pub origin: Origin,
    /// The op a live audit recomputed this step and found equal: `(position, name)`.
    pub audited: Option<(usize, &'static str)>,
}

pub struct Trainer {
    run: RunConfig,
    model: Model,
    weights: Vec<f32>,
    adam: Adam,
    step: u32,
    gemm: Box<dyn Gemm + Send>,
    data: Box<dyn DataSource>,
    /// Live audit period in steps (0: off).
    audit_every: u32,
    /// Every op of every step recomputed by the reference (`lockstep bisect`, the admission at
    /// a run's shapes).
    audit_all: bool,
    /// What recomputes an audit's products, where not the scalar reference's units.
    referee: Option<Box<dyn Gemm + Send>>,
    last_audited: Option<(usize, &'static str)>,
    /// This node's side of every sync (the mode's own state with it).
    sync: Strategy,
    /// Where the last batch came from.
    last_origin: Origin,
    /// `Some` while the backend's device holds the weights and the moments.
    on_device: Option<OnDevice>,
    /// The data state at the last sync, while the steps run ahead of it are not in the
    /// group's state (an overlapped window).
    data_at_sync: Option<u64>,
    /// Elastic windows: the window ends once this many of its inner steps are done
    /// ([`Trainer::hurry`]); `u32::MAX` lets it run its `H`.
    hurry: Arc<AtomicU32>,
}

/// A trainer's state at a point it may have to come back to ([`Trainer::undo_point`]), or
/// whose next update the definition runs again ([`Trainer::update_by_definition`]).
#[derive(Clone, Debug)]
pub struct Undo {
    weights: Vec<f32>,
    adam: Adam,
    step: u32,
    data_state: u64,
    data_at_sync: Option<u64>,
    sync: Strategy,
}

impl Undo {
    /// The group's weights the sync under way at this point started from
    /// ([`Strategy::sync_start`]).
    pub fn sync_start(&self) -> &[f32] {
        self.sync.sync_start(&self.weights)
    }
}

impl Trainer {
    /// A fresh run: seeded initial weights, zero optimizer state.
    pub fn new(run: RunConfig, gemm: Box<dyn Gemm + Send>, data: Box<dyn DataSource>) -> Result<Trainer, ConfigError> {
        run.validate()?;
        let weights = init(&Layout::new(run.model), run.seed);
        Trainer::with_weights(run, gemm, data, weights)
    }

    /// A trainer about to be restored ([`Trainer::restore`]): its weights zeros, not the run's
    /// initial ones — drawing those was a third of an `outer:H` window's audit, which restores
    /// the window's start at once (a profile, 2026-12-07).
    pub fn to_restore(
        run: RunConfig,
        gemm: Box<dyn Gemm + Send>,
        data: Box<dyn DataSource>,
    ) -> Result<Trainer, ConfigError> {
        run.validate()?;
        let weights = vec![0.0; Layout::new(run.model).len];
        Trainer::with_weights(run, gemm, data, weights)
    }

    fn with_weights(
        run: RunConfig,
        gemm: Box<dyn Gemm + Send>,
        data: Box<dyn DataSource>,
        weights: Vec<f32>,
    ) -> Result<Trainer, ConfigError> {
        let layout = Layout::new(run.model);
        let adam = Adam::new(layout.len);
        let sync = Strategy::new(run.sync, SyncState::new(&run.sync, layout.len));
        Ok(Trainer {
            sync,
            last_origin: Origin::Corpus,
            run,
            model: Model::new(layout),
            weights,
            adam,
            step: 0,
            gemm,
            data,
            audit_every: 0,
            audit_all: false,
            referee: None,
            last_audited: None,
            on_device: None,
            data_at_sync: None,
            hurry: Arc::new(AtomicU32::new(u32::MAX)),
        })
    }

    /// Elastic windows ([`crate::sync::SyncConfig::elastic`]): the window under way ends once
    /// this many of its inner steps are done (at least one, never past `H`). The mesh stores,
    /// before each window, `u32::MAX` or (for a member much slower than the group) the steps
    /// that fit the last window, and 0 from its own thread once another member's whole window
    /// arrives; a replay stores the count a member's window had.
    pub fn hurry(&self) -> Arc<AtomicU32> {
        Arc::clone(&self.hurry)
    }

    pub fn run_config(&self) -> &RunConfig {
        &self.run
    }

    /// The data source's sampler state.
    /// Trains on `data` from now on (fault injection: a rogue that takes another member's batches).
    pub fn replace_data(&mut self, data: Box<dyn DataSource>) {
        self.data = data;
    }

    pub fn data_state(&self) -> u64 {
        self.data.state()
    }

    /// Puts the data stream where it would be had this trainer drawn every batch of the run so
    /// far ([`DataSource::seek`]): a member that joins a group mid-run trains on the batches
    /// its seed gives for these steps, whatever it joined.
    pub fn seek_data_to_step(&mut self) {
        self.data.seek(u64::from(self.step));
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The group's current weights (downloaded first when the backend's device holds newer
    /// ones): this member's own, except in an overlapped window after the mean came, where its
    /// own carry the steps it ran ahead ([`Strategy::run_ahead`]).
    pub fn weights(&mut self) -> Result<&[f32], ComputeError> {
        self.bring_home(false)?;
        Ok(self.sync.group_weights(&self.weights))
    }

    /// Parameters of the model.
    pub fn parameter_count(&self) -> usize {
        self.weights.len()
    }

    /// Makes the host's weights (and, with `moments`, Adam's moments) equal the device's.
    fn bring_home(&mut self, moments: bool) -> Result<(), ComputeError> {
        let Some(mut at) = self.on_device else { return Ok(()) };
        let need_moments = moments && !at.moments_on_host;
        if at.weights_on_host && !need_moments {
            return Ok(());
        }
        let pair = need_moments.then_some((&mut self.adam.m[..], &mut self.adam.v[..]));
        self.model.download_training_state(self.gemm.as_mut(), &mut self.weights, pair)?;
        at.weights_on_host = true;
        at.moments_on_host |= need_moments;
        self.on_device = Some(at);
        Ok(())
    }

    /// Steps completed.
    pub fn step_count(&self) -> u32 {
        self.step
    }

    /// The group's current weights' hash (the device's, when it holds them and updated them
    /// last).
    pub fn weight_hash(&self) -> u32 {
        match self.on_device {
            Some(OnDevice { hash: Some(hash), .. }) => hash,
            _ => weight_hash(self.sync.group_weights(&self.weights)),
        }
    }

    /// The current weights' hash when it is known without hashing on the host (the device
    /// computed it with its update).
    pub fn device_weight_hash(&self) -> Option<u32> {
        self.on_device.and_then(|d| d.hash)
    }

    pub fn gemm_label(&self) -> String {
        self.gemm.label()
    }

    pub fn data_description(&self) -> String {
        self.data.describe()
    }

    /// The probe hash through the live products (the guard compares it with the reference's).
    pub fn probe_hash(&mut self) -> Result<u32, ComputeError> {
        use lockstep_luts::probe::{probe_hash, probe_operands, PROBE_K, PROBE_M, PROBE_N};
        let (a, b) = probe_operands();
        let mut c = vec![0f32; PROBE_M * PROBE_N];
        self.gemm.gemm_nt(PROBE_M, PROBE_N, PROBE_K, &a, &b, &mut c)?;
        Ok(probe_hash(&c))
    }

    /// One step of this trainer's backend from `weights` on `tokens`, traced as `tracing` asks
    /// (a disputed contribution's ops, `docs/TRUST.md`): on a program of its own beside the
    /// trainer's, freed after, so nothing the trainer holds changes.
    pub fn trace_step(
        &mut self,
        weights: &[f32],
        tokens: &[u8],
        targets: &[u8],
        tracing: &crate::audit::Tracing,
    ) -> Result<crate::audit::Traced, ComputeError> {
        let model = Model::new(crate::params::Layout::new(self.run.model));
        let (b, t) = (self.run.batch, self.run.model.context);
        let traced = model.trace(self.gemm.as_mut(), weights, tokens, targets, b, t, tracing);
        model.release(self.gemm.as_mut());
        traced
    }

    /// What computes the products, for the next run.
    pub fn into_gemm(mut self) -> Box<dyn Gemm + Send> {
        // What this trainer's model holds on the backend's device goes with it: the next
        // trainer on this backend builds its own.
        self.model.release(self.gemm.as_mut());
        self.gemm
    }

    /// Replaces what computes the products (a hot-swap, at a step boundary). State the old
    /// backend's device holds comes home first (the new one gets it on its first step); if that
    /// fails, nothing is replaced.
    pub fn replace_gemm(
        &mut self,
        gemm: Box<dyn Gemm + Send>,
    ) -> Result<Box<dyn Gemm + Send>, (ComputeError, Box<dyn Gemm + Send>)> {
        if let Err(e) = self.bring_home(true) {
            return Err((e, gemm));
        }
        self.on_device = None;
        Ok(std::mem::replace(&mut self.gemm, gemm))
    }

    /// Turns the live audit on (every `every` steps) or off (0). On an audited step one
    /// product of the step, a different one each time, is recomputed by the reference units
    /// and compared bit for bit; a mismatch fails the step with a report.
    pub fn set_audit_every(&mut self, every: u32) {
        self.audit_every = every;
    }

    /// Recompute every op of every step by the reference, each before the next runs (slow: the
    /// reference's speed), so a step fails at the first op where the backend departs from the
    /// definition, naming it with the bits (`lockstep bisect`). An ABI 1 backend's element-wise
    /// ops run on the reference already: its products are checked.
    pub fn set_audit_all(&mut self, all: bool) {
        self.audit_all = all;
    }

    /// The audits' products recomputed by `referee` (an admitted CPU mirror on every core)
    /// instead of the scalar reference: the same bits, fast enough for a run's own sizes.
    /// Returns the referee there was.
    pub fn set_referee(&mut self, referee: Option<Box<dyn Gemm + Send>>) -> Option<Box<dyn Gemm + Send>> {
        std::mem::replace(&mut self.referee, referee)
    }

    /// The next batch and the op an audit recomputes in this step (if any), with the training
    /// state put on the backend's device first when it may live there.
    fn begin_step(&mut self) -> Result<(Batch, Option<Audit>), ComputeError> {
        let seq = self.run.model.context;
        // A stream by position draws the batch of the step this is (`docs/TRUST.md`, batches by
        // position), whatever steps were taken without computing them (a member that slept
        // through some and caught up on the group's records, a window's steps rewound).
        if self.data.positional() {
            self.data.seek(u64::from(self.step));
        }
        let (batch, origin) = self.data.next_batch(self.run.batch, seq);
        let computing = self.step + 1;
        // Rotate through the step's ops: the n-th audit checks op n (mod the ops the backend
        // computes itself).
        let target = if self.audit_all {
            Some(Audit::Every)
        } else {
            (self.audit_every != 0 && computing.is_multiple_of(self.audit_every))
                .then(|| Audit::One((computing / self.audit_every) as usize))
        };
        self.last_origin = origin;
        let keep_on_device = self.run.sync.state_may_stay_on_device() && self.gemm.device().is_some();
        if keep_on_device && self.on_device.is_none() {
            self.model.upload_training_state(
                self.gemm.as_mut(),
                &self.weights,
                &self.adam.m,
                &self.adam.v,
                self.run.batch,
                seq,
            )?;
            self.on_device = Some(OnDevice { weights_on_host: true, moments_on_host: true, hash: None });
        }
        Ok((batch, target))
    }

    /// Loss and gradient on this node's next batch, at the current weights.
    pub fn gradient(&mut self) -> Result<(f32, Vec<f32>, Origin), ComputeError> {
        let (batch, target) = self.begin_step()?;
        let weights = if self.on_device.is_some() { Weights::OnDevice } else { Weights::Host(&self.weights) };
        let (loss, grad, audited) = self.model.step(
            self.gemm.as_mut(),
            weights,
            &batch.tokens,
            &batch.targets,
            self.run.batch,
            self.run.model.context,
            auditing(target, &mut self.referee),
            self.step + 1,
        )?;
        self.last_audited = audited.map(|a| (a.index, a.name));
        Ok((loss, grad, self.last_origin.clone()))
    }

    /// One step on this node's next batch with its own gradient ([`Trainer::gradient`], then
    /// [`Trainer::apply`]): where the backend's device holds the state, in one call there, the
    /// gradient never leaving it. The loss.
    pub fn step_alone(&mut self) -> Result<f32, ComputeError> {
        let (batch, target) = self.begin_step()?;
        if self.on_device.is_none() {
            let (loss, grad, audited) = self.model.step(
                self.gemm.as_mut(),
                Weights::Host(&self.weights),
                &batch.tokens,
                &batch.targets,
                self.run.batch,
                self.run.model.context,
                auditing(target, &mut self.referee),
                self.step + 1,
            )?;
            self.last_audited = audited.map(|a| (a.index, a.name));
            self.apply(&grad)?;
            return Ok(loss);
        }
        let adam = self.next_adam_step();
        let (loss, hash, audited) = self.model.step_and_adam_on_device(
            self.gemm.as_mut(),
            &batch.tokens,
            &batch.targets,
            self.run.batch,
            self.run.model.context,
            auditing(target, &mut self.referee),
            self.step + 1,
            adam,
        )?;
        self.last_audited = audited.map(|a| (a.index, a.name));
        self.updated_on_device(hash);
        Ok(loss)
    }

    /// The next Adam update's scalars (nothing advances until it is done).
    fn next_adam_step(&self) -> AdamStep {
        let (correction1, correction2) = self.adam.next_corrections();
        AdamStep { lr: schedule(self.run.lr, self.step, self.run.steps), correction1, correction2 }
    }

    /// The device did an update: count it, and the host's copies are now stale.
    fn updated_on_device(&mut self, hash: u32) {
        self.adam.advance();
        self.on_device = Some(OnDevice { weights_on_host: false, moments_on_host: false, hash: Some(hash) });
        self.step += 1;
    }

    /// The op the last step's audit recomputed (its position in the step and its name), if
    /// that step was audited.
    pub fn last_audited(&self) -> Option<(usize, &'static str)> {
        self.last_audited
    }

    /// One Adam update from `grad`, ending the current step (on the device when it holds the
    /// state). A device that fails it leaves the step unfinished.
    pub fn apply(&mut self, grad: &[f32]) -> Result<(), ComputeError> {
        match self.on_device {
            Some(_) => {
                // Counted only once the device has done it: a failed update changes nothing.
                let adam = self.next_adam_step();
                let hash = self.model.adam_on_device(self.gemm.as_mut(), grad, adam)?;
                self.updated_on_device(hash);
            }
            None => {
                let lr = schedule(self.run.lr, self.step, self.run.steps);
                self.adam.update(&mut self.weights, grad, lr, self.gemm.threads());
                self.step += 1;
            }
        }
        Ok(())
    }

    /// The step `rule` takes from the group's `mean` where it is not Adam's whole, ending the
    /// current step at its learning rate: the sign rule's ([`crate::sync::sign_step`]) or
    /// Adam's with its second moment frozen ([`Adam::update_frozen`]). Those rules keep the
    /// state on the host (`SyncConfig::state_may_stay_on_device`).
    pub fn apply_by_rule(&mut self, rule: StepRule, mean: &[f32]) {
        debug_assert!(self.on_device.is_none(), "{rule}'s state stays on the host");
        let lr = schedule(self.run.lr, self.step, self.run.steps);
        match rule {
            StepRule::Sign { .. } => crate::sync::sign_step(&mut self.weights, mean, lr),
            StepRule::Frozen { .. } => self.adam.update_frozen(&mut self.weights, mean, lr),
            StepRule::Adam => unreachable!("Adam's whole step is `Trainer::apply`, which the strategy calls for it"),
        }
        self.step += 1;
    }

    /// This node's contribution to the next sync (what the run's sync mode makes of its
    /// training: [`Strategy::contribute`]).
    pub fn contribute(&mut self) -> Result<Contribution, ContributeError> {
        self.data_at_sync = None;
        self.with_strategy(|strategy, me| strategy.contribute(me))
    }

    /// The inner optimizer's state on the host (`outer:H` keeps it there; in other modes the
    /// device may hold newer moments).
    pub fn adam(&self) -> &Adam {
        &self.adam
    }

    /// Fault injection: the lowest bit of the first weight flipped in place — the weights, and
    /// an `outer:H` window's start once its contribution is made (the mean's outer step begins
    /// from it, so the flip outlives the window) — with nothing else of the state touched (a
    /// sync under way still ends as it would have).
    pub fn flip_weight_bit(&mut self) -> Result<(), ComputeError> {
        self.bring_home(true)?;
        self.weights[0] = f32::from_bits(self.weights[0].to_bits() ^ 1);
        self.sync.flip_held_group_weights();
        // The device is sent the state again at the next step.
        self.on_device = None;
        Ok(())
    }

    /// Fault injection: the optimizer's first moment times `factor` (a state the member's own
    /// past did not leave; `outer:H`, whose optimizer stays on the host).
    pub fn forge_moments(&mut self, factor: f32) {
        self.adam.m.iter_mut().for_each(|m| *m *= factor);
    }

    /// Fault injection: what the next contributions do wrong ([`Strategy::tamper`]).
    pub fn tamper(&mut self, tamper: Option<crate::sync::Tamper>) {
        self.sync.tamper(tamper);
    }

    /// `outer:H` with an overlap, after [`Trainer::contribute`]: the next window's first steps,
    /// run while the group sums this one ([`Strategy::run_ahead`]); nothing in other modes.
    pub fn run_ahead(&mut self) -> Result<(), ComputeError> {
        let at_sync = self.data_state();
        let step = self.step;
        self.with_strategy(|strategy, me| strategy.run_ahead(me))?;
        if self.step != step {
            self.data_at_sync = Some(at_sync);
        }
        Ok(())
    }

    /// What the next window's contribution names as its private state, but the residual
    /// (`outer:H`; `None` in `every-step`): the inner optimizer as the window began — as its
    /// steps run ahead began, with their count and the weights they began from, in overlapped
    /// runs ([`crate::sync::WindowState`]).
    pub fn window_start(&self) -> Option<crate::sync::WindowState> {
        if !matches!(self.run.sync.mode, crate::sync::SyncMode::Outer { .. }) {
            return None;
        }
        let (adam, ahead) = match self.sync.ahead_start() {
            _ if self.run.sync.overlap == 0 => (self.adam.clone(), None),
            Some((steps, anchor, Some(adam))) if steps > 0 => (adam.clone(), Some((steps, anchor.to_vec()))),
            _ => (self.adam.clone(), Some((0, Vec::new()))),
        };
        Some(crate::sync::WindowState { adam, ahead, residual: Vec::new() })
    }

    /// How many steps [`Trainer::run_ahead`] would run now: the overlap, or the steps the run
    /// has left where fewer.
    pub fn steps_to_run_ahead(&self) -> u32 {
        self.sync.steps_to_run_ahead(Member::steps_left(self))
    }

    /// An audit's overlapped window: the steps run ahead moved onto the group's weights at the
    /// window's start ([`Strategy::rebase_onto`]).
    pub fn rebase_onto(&mut self, global: Vec<f32>) {
        self.with_strategy(|strategy, me| strategy.rebase_onto(me, global));
    }

    /// Ends a sync with the group's mean ([`Strategy::finish`]; `ours`: whether it sums our
    /// contribution).
    pub fn finish_sync(&mut self, mean: &[f32], grid: &[u8], ours: bool) -> Result<(), ComputeError> {
        self.with_strategy(|strategy, me| strategy.finish(me, mean, grid, ours))
    }

    /// A lone node's sync (a group of one: its contribution is the mean): one step
    /// (`every-step`) or `H` steps (`outer:H`).
    pub fn step(&mut self) -> Result<StepReport, ContributeError> {
        let loss = self.with_strategy(|strategy, me| strategy.alone(me))?;
        Ok(StepReport {
            step: self.step,
            loss,
            weight_hash: self.weight_hash(),
            tokens: self.run.tokens_per_step() * self.run.steps_per_sync() as usize,
            origin: self.last_origin.clone(),
            audited: self.last_audited,
        })
    }

    /// Runs `f` with this trainer's sync strategy and the trainer as the member it drives.
    fn with_strategy<R>(&mut self, f: impl FnOnce(&mut Strategy, &mut Trainer) -> R) -> R {
        let mut strategy = std::mem::take(&mut self.sync);
        let result = f(&mut strategy, self);
        self.sync = strategy;
        result
    }

    /// Mean loss over `batches` fixed held-out batches of the run's batch size.
    pub fn heldout_loss(&mut self, batches: usize) -> Result<f32, ComputeError> {
        self.bring_home(false)?;
        let seq = self.run.model.context;
        let mut total = 0.0f32;
        let weights = self.sync.group_weights(&self.weights);
        for batch in self.data.heldout_batches(batches, self.run.batch, seq) {
            total +=
                self.model.loss(self.gemm.as_mut(), weights, &batch.tokens, &batch.targets, self.run.batch, seq)?;
        }
        Ok(total / batches as f32)
    }

    /// Everything needed to continue bit-identically (downloaded first when the backend's
    /// device holds newer state). In an overlapped window after the mean came, the group's
    /// state at the sync: its weights and step count, without the steps this member ran ahead
    /// (Adam's moments are this member's, as they are in every `outer:H` window).
    pub fn state(&mut self) -> Result<TrainState, ComputeError> {
        self.bring_home(true)?;
        let ahead = self.sync.global().map_or(0, |(_, steps)| steps);
        Ok(TrainState {
            run: self.run,
            step: self.step - ahead,
            weights: self.sync.group_weights(&self.weights).to_vec(),
            adam: self.adam.clone(),
            data_state: self.data_at_sync.filter(|_| ahead > 0).unwrap_or_else(|| self.data_state()),
            sync: self.sync.state().clone(),
        })
    }

    /// Everything a sync's apply and the compute after it change, kept to undo them
    /// ([`Trainer::undo`]): unlike [`Trainer::state`], a point inside a sync too (a contribution
    /// made, the group's mean not yet applied), so the mean that does commit finishes that sync.
    pub fn undo_point(&mut self) -> Result<Undo, ComputeError> {
        self.bring_home(true)?;
        Ok(Undo {
            weights: self.weights.clone(),
            adam: self.adam.clone(),
            step: self.step,
            data_state: self.data.state(),
            data_at_sync: self.data_at_sync,
            sync: self.sync.clone(),
        })
    }

    /// Back to `undo`, bit for bit (the device is sent the state again at the next step).
    pub fn undo(&mut self, undo: Undo) {
        self.weights = undo.weights;
        self.adam = undo.adam;
        self.step = undo.step;
        self.data.restore(undo.data_state);
        self.data_at_sync = undo.data_at_sync;
        self.sync = undo.sync;
        self.on_device = None;
    }

    /// The guard's disputes (`docs/TRUST.md`): the update that ended a sync, as the definition
    /// gives it — from `before` (the state the update started from) and the group's `mean`,
    /// on the host, whatever this trainer's backend runs its update on — and the group's
    /// weights it leaves. The trainer is back in its own state afterwards, bit for bit (a
    /// device holding it is sent it again at the next step).
    pub fn update_by_definition(
        &mut self,
        before: &Undo,
        mean: &[f32],
        grid: &[u8],
        ours: bool,
    ) -> Result<Vec<f32>, ComputeError> {
        let now = self.undo_point()?;
        self.undo(before.clone());
        let finished = self.finish_sync(mean, grid, ours);
        let after = self.sync.group_weights(&self.weights).to_vec();
        self.undo(now);
        finished.map(|()| after)
    }

    /// Whether a group running this trainer's run can continue from a checkpoint of `run`: the
    /// same model, batch and sync settings (the learning rate, its schedule's length and the
    /// seed may differ — that is what loading a checkpoint into a running group is for).
    pub fn check_continues(&self, run: &RunConfig) -> Result<(), RestoreError> {
        if run.model != self.run.model {
            return Err(RestoreError::ModelMismatch { checkpoint: run.model, running: self.run.model });
        }
        if run.batch != self.run.batch {
            return Err(RestoreError::RunMismatch(format!(
                "batch {} against the running {}",
                run.batch, self.run.batch
            )));
        }
        if run.sync != self.run.sync {
            return Err(RestoreError::RunMismatch(format!("sync {} against the running {}", run.sync, self.run.sync)));
        }
        Ok(())
    }

    /// Replaces the run's state with `state` (a loaded checkpoint, a resume): its settings too,
    /// which must be a usable run. The model shape must match; on error nothing changes.
    pub fn restore(&mut self, state: TrainState) -> Result<(), RestoreError> {
        if state.run.model != self.run.model {
            return Err(RestoreError::ModelMismatch { checkpoint: state.run.model, running: self.run.model });
        }
        state.run.validate().map_err(RestoreError::Settings)?;
        if state.step > state.run.steps {
            return Err(RestoreError::RunMismatch(format!(
                "step {} is past the checkpoint's own run length {}",
                state.step, state.run.steps
            )));
        }
        let n = state.weights.len();
        if n != self.weights.len() || state.adam.m.len() != n || state.adam.v.len() != n {
            return Err(RestoreError::TensorLengths);
        }
        // A checkpoint from a run of another sync setting: what it lacks starts at zero.
        let tensors = state.sync.tensors().map(<[f32]>::to_vec).to_vec();
        let sync = SyncState::from_tensors(&state.run.sync, tensors, n).map_err(|_| RestoreError::TensorLengths)?;
        self.run = state.run;
        self.step = state.step;
        self.weights = state.weights;
        self.adam = state.adam;
        self.sync = Strategy::new(state.run.sync, sync);
        self.data_at_sync = None;
        // The next step uploads the restored state to the device.
        self.on_device = None;
        self.data.restore(state.data_state);
        Ok(())
    }
}

/// Why a state was not restored (nothing changed).
#[derive(Clone, Debug, PartialEq)]
pub enum RestoreError {
    ModelMismatch {
        checkpoint: ModelConfig,
        running: ModelConfig,
    },
    TensorLengths,
    /// The checkpoint's run settings are not a usable run (a learning rate of 1e30, …).
    Settings(ConfigError),
    /// The checkpoint's run trains another way than the running one (batch, sync): the group
    /// could not continue from it as one run.
    RunMismatch(String),
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::ModelMismatch { checkpoint, running } => {
                write!(f, "checkpoint model {checkpoint:?} does not match the running model {running:?}")
            }
            RestoreError::TensorLengths => f.write_str("checkpoint tensors have the wrong length"),
            RestoreError::Settings(e) => write!(f, "the checkpoint's run settings are refused: {e}"),
            RestoreError::RunMismatch(what) => write!(f, "the checkpoint's run does not match the running one: {what}"),
        }
    }
}

impl std::error::Error for RestoreError {}

/// The trainer as its sync strategy drives it.
impl Member for Trainer {
    fn gradient(&mut self) -> Result<(f32, Vec<f32>), ComputeError> {
        Trainer::gradient(self).map(|(loss, grad, _origin)| (loss, grad))
    }

    fn apply(&mut self, grad: &[f32]) -> Result<(), ComputeError> {
        Trainer::apply(self, grad)
    }

    fn apply_by_rule(&mut self, rule: StepRule, mean: &[f32]) {
        Trainer::apply_by_rule(self, rule, mean)
    }

    fn step_alone(&mut self) -> Result<f32, ComputeError> {
        Trainer::step_alone(self)
    }

    fn optimizer(&self) -> Option<Adam> {
        Some(self.adam.clone())
    }

    fn weights(&mut self) -> &mut Vec<f32> {
        // `outer:H` keeps the state on the host (`SyncConfig::state_may_stay_on_device`), the
        // only mode that asks for the weights here.
        debug_assert!(self.on_device.is_none(), "the weights are asked for while the device holds them");
        &mut self.weights
    }

    fn steps_left(&self) -> u32 {
        self.run.steps.saturating_sub(self.step)
    }

    fn steps_done(&self) -> u32 {
        self.step
    }

    fn rewind(&mut self, steps: u32) {
        self.step -= steps;
    }

    fn hurried(&self, done: u32) -> bool {
        done >= self.hurry.load(Ordering::Relaxed)
    }

    fn skip(&mut self, steps: u32) {
        self.step += steps;
        self.data.seek(u64::from(self.step));
    }
}
/// The audit `target` picks, its products recomputed by `referee` when there is one.
fn auditing(target: Option<Audit>, referee: &mut Option<Box<dyn Gemm + Send>>) -> Option<Auditing<'_>> {
    target.map(|which| Auditing { which, referee: referee.as_deref_mut().map(|g| g as &mut dyn Gemm) })
}
