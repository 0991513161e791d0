//! Model and run configuration.

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
    pub fn validate(&self) -> Result<(), String> {
        if self.width == 0 || self.context == 0 || self.layers == 0 || self.heads == 0 {
            return Err(format!("every dimension must be positive: {self:?}"));
        }
        if !self.width.is_multiple_of(self.heads) {
            return Err(format!("width {} is not a multiple of heads {}", self.width, self.heads));
        }
        if self.width > 4096 || self.context > 4096 || self.layers > 64 || self.heads > 64 {
            return Err(format!("dimensions are beyond what this trainer supports: {self:?}"));
        }
        Ok(())
    }
}

/// A training run's settings (the seed's run config: `c, t, b, steps, lr`, plus the seed).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunConfig {
    pub model: ModelConfig,
    /// Sequences per step `b`.
    pub batch: usize,
    pub steps: u32,
    pub lr: f32,
    pub seed: u64,
}

impl RunConfig {
    /// The default run: see `docs/MODEL.md` for how long it is and what loss it reaches.
    pub const DEFAULT: RunConfig = RunConfig { model: ModelConfig::DEFAULT, batch: 16, steps: 600, lr: 3e-3, seed: 1 };

    /// Tokens per step.
    pub fn tokens_per_step(&self) -> usize {
        self.batch * self.model.context
    }

    pub fn validate(&self) -> Result<(), String> {
        self.model.validate()?;
        if self.batch == 0 || self.batch > 4096 {
            return Err(format!("batch {} is out of range", self.batch));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(format!("learning rate {} must be positive and finite", self.lr));
        }
        Ok(())
    }
}
