//! Model and run configuration.

use crate::sync::{SyncConfig, SyncMode};

/// The byte-level tokenizer: every byte is a token. Checkpoints record its name and size.
pub const TOKENIZER_NAME: &str = "byte-level";
pub const VOCAB: usize = 256;

/// The model's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// Width `c` (embedding size).
    pub width: usize,
    /// Context length `t`.
    pub context: usize,
    pub layers: usize,
    pub heads: usize,
}

impl ModelConfig {
    /// About 0.87M parameters: the default, sized to train usefully on one CPU core.
    pub const DEFAULT: ModelConfig = ModelConfig { width: 128, context: 128, layers: 4, heads: 4 };

    pub fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    /// Checks the shape is usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.width == 0 || self.context == 0 || self.layers == 0 || self.heads == 0 {
            return Err(ConfigError::ZeroDimension(*self));
        }
        if !self.width.is_multiple_of(self.heads) {
            return Err(ConfigError::HeadsDoNotDivideWidth { width: self.width, heads: self.heads });
        }
        if self.width > 4096 || self.context > 4096 || self.layers > 64 || self.heads > 64 {
            return Err(ConfigError::TooLarge(*self));
        }
        Ok(())
    }
}

/// The largest learning rate a run may have: Adam moves each weight by about `lr` a step, so
/// anything near 1 already wrecks a model; larger values only come from mistakes or from a
/// hostile checkpoint.
pub const MAX_LR: f32 = 1.0;

/// A training run's settings (the seed's run config: `c, t, b, steps, lr`, plus the seed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunConfig {
    pub model: ModelConfig,
    /// Sequences per step `b`.
    pub batch: usize,
    pub steps: u32,
    pub lr: f32,
    pub seed: u64,
    /// How a group syncs (a lone node trains as a group of one).
    pub sync: SyncConfig,
}

impl RunConfig {
    /// The default run: see `docs/MODEL.md` for how long it is and what loss it reaches.
    pub const DEFAULT: RunConfig =
        RunConfig { model: ModelConfig::DEFAULT, batch: 16, steps: 600, lr: 3e-3, seed: 1, sync: SyncConfig::SEED };

    /// Tokens per step.
    pub fn tokens_per_step(&self) -> usize {
        self.batch * self.model.context
    }

    /// Optimizer steps between two syncs of a group.
    pub fn steps_per_sync(&self) -> u32 {
        self.sync.mode.steps_per_sync()
    }

    /// Syncs in the run (the mesh session counts these).
    pub fn syncs(&self) -> u32 {
        self.steps / self.steps_per_sync().max(1)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate()?;
        if self.batch == 0 || self.batch > 4096 {
            return Err(ConfigError::Batch(self.batch));
        }
        if !(self.lr.is_finite() && self.lr > 0.0 && self.lr <= MAX_LR) {
            return Err(ConfigError::LearningRate(self.lr));
        }
        let h = self.sync.mode.steps_per_sync();
        if h == 0 || !self.steps.is_multiple_of(h) {
            return Err(ConfigError::StepsPerSync { steps: self.steps, sync: self.sync.mode });
        }
        let outer = self.sync.outer;
        if !(outer.lr.is_finite()
            && outer.lr > 0.0
            && outer.momentum.is_finite()
            && (0.0..1.0).contains(&outer.momentum))
        {
            return Err(ConfigError::Outer { lr: outer.lr, momentum: outer.momentum });
        }
        Ok(())
    }
}

/// Why a model shape or run setting is refused.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigError {
    ZeroDimension(ModelConfig),
    HeadsDoNotDivideWidth {
        width: usize,
        heads: usize,
    },
    TooLarge(ModelConfig),
    Batch(usize),
    LearningRate(f32),
    /// `outer:H` needs a whole number of outer steps.
    StepsPerSync {
        steps: u32,
        sync: SyncMode,
    },
    Outer {
        lr: f32,
        momentum: f32,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::ZeroDimension(model) => write!(f, "every dimension must be positive: {model:?}"),
            ConfigError::HeadsDoNotDivideWidth { width, heads } => {
                write!(f, "width {width} is not a multiple of heads {heads}")
            }
            ConfigError::TooLarge(model) => write!(f, "dimensions are beyond what this trainer supports: {model:?}"),
            ConfigError::Batch(batch) => write!(f, "batch {batch} is out of range"),
            ConfigError::LearningRate(lr) => {
                write!(
                    f,
                    "learning rate {lr} must be positive and at most {MAX_LR} (Adam's steps are about lr in size)"
                )
            }
            ConfigError::StepsPerSync { steps, sync } => {
                write!(f, "{steps} steps are not a whole number of syncs of {sync}")
            }
            ConfigError::Outer { lr, momentum } => {
                write!(f, "outer learning rate {lr} must be positive and finite, outer momentum {momentum} in [0, 1)")
            }
        }
    }
}

impl std::error::Error for ConfigError {}
