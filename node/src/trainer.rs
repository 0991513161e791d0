//! One node's training loop: gradient through the active `Gemm`, one Adam update.
//!
//! A step is split in two so the mesh can average gradients in between: [`Trainer::gradient`]
//! samples the node's batch and returns loss and gradient; [`Trainer::apply`] applies one Adam
//! update from a (possibly averaged) gradient. [`Trainer::step`] does both for a lone node.

use crate::adam::{schedule, Adam};
use crate::config::{ConfigError, ModelConfig, RunConfig};
use crate::data::{heldout_batches, DataSource, Origin};
use crate::gemm::{AuditOne, ComputeError, Gemm};
use crate::model::Model;
use crate::params::{init, weight_hash, Layout};

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
}

/// What one step did.
#[derive(Clone, Debug)]
pub struct StepReport {
    /// Steps completed after this one.
    pub step: u32,
    pub loss: f32,
    /// Weight hash after the update.
    pub weight_hash: u32,
    pub tokens: usize,
    pub origin: Origin,
    /// The product a live audit recomputed this step and found equal: `(call, m, n, k)`.
    pub audited: Option<(usize, usize, usize, usize)>,
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
    /// Products per step through `Gemm::gemm_nt`, learned from the last audited step.
    calls_per_step: usize,
    last_audited: Option<(usize, usize, usize, usize)>,
}

impl Trainer {
    /// A fresh run: seeded initial weights, zero optimizer state.
    pub fn new(run: RunConfig, gemm: Box<dyn Gemm + Send>, data: Box<dyn DataSource>) -> Result<Trainer, ConfigError> {
        run.validate()?;
        let layout = Layout::new(run.model);
        let weights = init(&layout, run.seed);
        let adam = Adam::new(layout.len);
        Ok(Trainer {
            run,
            model: Model::new(layout),
            weights,
            adam,
            step: 0,
            gemm,
            data,
            audit_every: 0,
            calls_per_step: 0,
            last_audited: None,
        })
    }

    pub fn run_config(&self) -> &RunConfig {
        &self.run
    }

    /// The data source's sampler state.
    pub fn data_state(&self) -> u64 {
        self.data.state()
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn weights(&self) -> &[f32] {
        &self.weights
    }

    /// Steps completed.
    pub fn step_count(&self) -> u32 {
        self.step
    }

    pub fn weight_hash(&self) -> u32 {
        weight_hash(&self.weights)
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

    /// What computes the products, for the next run.
    pub fn into_gemm(self) -> Box<dyn Gemm + Send> {
        self.gemm
    }

    /// Replaces what computes the products (a hot-swap, at a step boundary).
    pub fn replace_gemm(&mut self, gemm: Box<dyn Gemm + Send>) -> Box<dyn Gemm + Send> {
        std::mem::replace(&mut self.gemm, gemm)
    }

    /// Turns the live audit on (every `every` steps) or off (0). On an audited step one
    /// product of the step, a different one each time, is recomputed by the reference units
    /// and compared bit for bit; a mismatch fails the step with a report.
    pub fn set_audit_every(&mut self, every: u32) {
        self.audit_every = every;
    }

    /// Loss and gradient on this node's next batch, at the current weights.
    pub fn gradient(&mut self) -> Result<(f32, Vec<f32>, Origin), ComputeError> {
        let seq = self.run.model.context;
        let (batch, origin) = self.data.next_batch(self.run.batch, seq);
        let computing = self.step + 1;
        // Rotate through the step's products: the n-th audit checks call n mod calls-per-step.
        let target = (self.audit_every != 0 && computing.is_multiple_of(self.audit_every)).then(|| {
            let round = (computing / self.audit_every) as usize;
            if self.calls_per_step == 0 {
                0
            } else {
                round % self.calls_per_step
            }
        });
        let mut audit = AuditOne::new(self.gemm.as_mut(), computing, target);
        let (loss, grad) =
            self.model.loss_and_grad(&mut audit, &self.weights, &batch.tokens, &batch.targets, self.run.batch, seq)?;
        self.calls_per_step = audit.calls();
        self.last_audited = audit.audited.zip(target).map(|((m, n, k), call)| (call, m, n, k));
        Ok((loss, grad, origin))
    }

    /// The product the last step's audit recomputed, if that step was audited.
    pub fn last_audited(&self) -> Option<(usize, usize, usize, usize)> {
        self.last_audited
    }

    /// One Adam update from `grad`, ending the current step.
    pub fn apply(&mut self, grad: &[f32]) {
        let lr = schedule(self.run.lr, self.step, self.run.steps);
        self.adam.update(&mut self.weights, grad, lr);
        self.step += 1;
    }

    /// A lone node's step.
    pub fn step(&mut self) -> Result<StepReport, ComputeError> {
        let (loss, grad, origin) = self.gradient()?;
        self.apply(&grad);
        Ok(StepReport {
            step: self.step,
            loss,
            weight_hash: self.weight_hash(),
            tokens: self.run.tokens_per_step(),
            origin,
            audited: self.last_audited,
        })
    }

    /// Mean loss over `batches` fixed held-out batches of the run's batch size.
    pub fn heldout_loss(&mut self, batches: usize) -> Result<f32, ComputeError> {
        let seq = self.run.model.context;
        let mut total = 0.0f32;
        for batch in heldout_batches(batches, self.run.batch, seq) {
            total += self.model.loss(
                self.gemm.as_mut(),
                &self.weights,
                &batch.tokens,
                &batch.targets,
                self.run.batch,
                seq,
            )?;
        }
        Ok(total / batches as f32)
    }

    /// Everything needed to continue bit-identically.
    pub fn state(&self) -> TrainState {
        TrainState {
            run: self.run,
            step: self.step,
            weights: self.weights.clone(),
            adam: self.adam.clone(),
            data_state: self.data_state(),
        }
    }

    /// Replaces the run's state with `state` (a loaded checkpoint, a resume). The model shape
    /// must match; on error nothing changes.
    pub fn restore(&mut self, state: TrainState) -> Result<(), RestoreError> {
        if state.run.model != self.run.model {
            return Err(RestoreError::ModelMismatch { checkpoint: state.run.model, running: self.run.model });
        }
        if state.weights.len() != self.weights.len()
            || state.adam.m.len() != state.weights.len()
            || state.adam.v.len() != state.weights.len()
        {
            return Err(RestoreError::TensorLengths);
        }
        self.run = state.run;
        self.step = state.step;
        self.weights = state.weights;
        self.adam = state.adam;
        self.data.restore(state.data_state);
        Ok(())
    }
}

/// Why a state was not restored (nothing changed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreError {
    ModelMismatch { checkpoint: ModelConfig, running: ModelConfig },
    TensorLengths,
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::ModelMismatch { checkpoint, running } => {
                write!(f, "checkpoint model {checkpoint:?} does not match the running model {running:?}")
            }
            RestoreError::TensorLengths => f.write_str("checkpoint tensors have the wrong length"),
        }
    }
}

impl std::error::Error for RestoreError {}
