//! Model and run configuration.

use crate::sync::{Compression, Exchange, StepRule, SyncConfig, SyncError, SyncMode};

/// The step rule byte's bit that says chunk owners ([`RunConfig::encode`]).
const OWNERS_BIT: u8 = 128;

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
    /// The digest of the text the run trains on (`Corpus::digest`), which the node that starts
    /// a run sets from its own: a member on other text is refused with both digests (its
    /// contributions could not be audited). 0: not known (a `/data` run, an older checkpoint).
    pub corpus: u64,
}

impl RunConfig {
    /// The default run: see `docs/MODEL.md` for how long it is and what loss it reaches.
    pub const DEFAULT: RunConfig = RunConfig {
        model: ModelConfig::DEFAULT,
        batch: 16,
        steps: 600,
        lr: 3e-3,
        seed: 1,
        sync: SyncConfig::SEED,
        corpus: 0,
    };

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

    /// Bytes of [`RunConfig::encode`].
    pub const ENCODED_LEN: usize = Self::ENCODED_LEN_V4 + 5;
    /// Bytes of the encoding before the step rule (mesh protocols 11–17, checkpoint version
    /// 4): [`RunConfig::decode_v4`] reads it.
    pub const ENCODED_LEN_V4: usize = Self::ENCODED_LEN_V3 + 8;
    /// Bytes of the encoding before the corpus's digest (mesh protocols 4–10, checkpoint
    /// version 3): [`RunConfig::decode_v3`] reads it.
    pub const ENCODED_LEN_V3: usize = 6 * 4 + 4 + 8 + SyncConfig::ENCODED_LEN;

    /// The one encoding of a run's settings, in the run config message (`-3`, after the
    /// protocol version) and in checkpoints (from version 3), little-endian: `[u32 width][u32
    /// context][u32 batch][u32 layers][u32 heads][u32 steps][f32 lr][u64 seed]` and the sync
    /// settings ([`SyncConfig::encode`]), then `[u64 corpus]` (mesh protocol 11, checkpoint
    /// version 4), then the step rule `[u8 0 adam, 1 sign, 2 frozen][4 bytes: the sign rule's
    /// momentum (f32), the frozen rule's warm-up (u32), 0 for adam]`
    /// (mesh protocol 18, checkpoint version 5), the rule byte plus 128 for chunk owners
    /// ([`Exchange::Owners`], mesh protocol 20: an older node reads it as an unknown rule). Sizes past `u32` cannot be valid runs
    /// ([`RunConfig::validate`] bounds them far below).
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        let m = &self.model;
        let words = [m.width, m.context, self.batch, m.layers, m.heads].map(|v| u32::try_from(v).unwrap_or(u32::MAX));
        for (i, v) in words.into_iter().chain([self.steps]).enumerate() {
            out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        out[24..28].copy_from_slice(&self.lr.to_le_bytes());
        out[28..36].copy_from_slice(&self.seed.to_le_bytes());
        out[36..Self::ENCODED_LEN_V3].copy_from_slice(&self.sync.encode());
        out[Self::ENCODED_LEN_V3..Self::ENCODED_LEN_V4].copy_from_slice(&self.corpus.to_le_bytes());
        let (rule, word) = match self.sync.rule {
            StepRule::Adam => (0u8, [0; 4]),
            StepRule::Sign { momentum } => (1, momentum.to_le_bytes()),
            StepRule::Frozen { warmup } => (2, warmup.to_le_bytes()),
        };
        let owners = if self.sync.exchange == Exchange::Owners { OWNERS_BIT } else { 0 };
        out[Self::ENCODED_LEN_V4] = rule | owners;
        out[Self::ENCODED_LEN_V4 + 1..].copy_from_slice(&word);
        out
    }

    /// Reads [`RunConfig::encode`]'s bytes (not validated: [`RunConfig::validate`] says whether
    /// they are a usable run); an unknown sync mode, compression or step rule is named.
    pub fn decode(bytes: &[u8; Self::ENCODED_LEN]) -> Result<RunConfig, SyncError> {
        let (before, rule) = bytes.split_at(Self::ENCODED_LEN_V4);
        let run = RunConfig::decode_v4(before.try_into().expect("the bytes before the step rule"))?;
        let word: [u8; 4] = rule[1..].try_into().expect("4 bytes");
        let exchange = if rule[0] & OWNERS_BIT != 0 { Exchange::Owners } else { Exchange::Mesh };
        let rule = match rule[0] & !OWNERS_BIT {
            0 => StepRule::Adam,
            1 => StepRule::Sign { momentum: f32::from_le_bytes(word) },
            2 => StepRule::Frozen { warmup: u32::from_le_bytes(word) },
            _ => return Err(SyncError::RuleByte(rule[0])),
        };
        Ok(RunConfig { sync: SyncConfig { rule, exchange, ..run.sync }, ..run })
    }

    /// Reads the encoding of mesh protocols 11–17 and checkpoint version 4 (the step rule:
    /// Adam).
    pub fn decode_v4(bytes: &[u8; Self::ENCODED_LEN_V4]) -> Result<RunConfig, SyncError> {
        let (before, corpus) = bytes.split_at(Self::ENCODED_LEN_V3);
        let run = RunConfig::decode_v3(before.try_into().expect("the bytes before the corpus"))?;
        Ok(RunConfig { corpus: u64::from_le_bytes(corpus.try_into().expect("8 bytes")), ..run })
    }

    /// Reads the encoding of mesh protocols 4–10 and checkpoint version 3 (no corpus: 0).
    pub fn decode_v3(bytes: &[u8; Self::ENCODED_LEN_V3]) -> Result<RunConfig, SyncError> {
        let word = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        let sync = SyncConfig::decode(bytes[36..].try_into().expect("the sync settings' bytes"))?;
        Ok(RunConfig {
            model: ModelConfig {
                width: word(0) as usize,
                context: word(1) as usize,
                layers: word(3) as usize,
                heads: word(4) as usize,
            },
            batch: word(2) as usize,
            steps: word(5),
            lr: f32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes")),
            seed: u64::from_le_bytes(bytes[28..36].try_into().expect("8 bytes")),
            sync,
            corpus: 0,
        })
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
        let overlap = self.sync.overlap;
        let overlap_fits = match self.sync.mode {
            SyncMode::EveryStep => overlap == 0,
            SyncMode::Outer { inner_steps } => overlap < inner_steps && overlap <= SyncConfig::MAX_OVERLAP,
        };
        if !overlap_fits {
            return Err(ConfigError::Overlap { overlap, sync: self.sync.mode });
        }
        let (sync, compression) = (self.sync.mode, self.sync.compression);
        if self.sync.elastic && (sync == SyncMode::EveryStep || compression == Compression::None) {
            return Err(ConfigError::Elastic { sync, compression });
        }
        // The sign rule's momentum is the packed residual, the frozen rule's late values are error
        // feedback's; `outer:H`'s inner steps are Adam's.
        let packed_every_step = sync == SyncMode::EveryStep && compression != Compression::None;
        if self.sync.rule != StepRule::Adam && !(self.sync.rule.in_range() && packed_every_step) {
            return Err(ConfigError::Rule { rule: self.sync.rule, sync, compression });
        }
        if self.sync.exchange == Exchange::Owners && !packed_every_step {
            return Err(ConfigError::Owners { sync, compression });
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
    /// An overlap with `every-step`, or not below `H` (or past what the encoding carries).
    Overlap {
        overlap: u32,
        sync: SyncMode,
    },
    /// The sign or frozen rule without `every-step` and a packed compression, or with a
    /// momentum outside `(0, 1]` or a warm-up of 0.
    Rule {
        rule: StepRule,
        sync: SyncMode,
        compression: Compression,
    },
    /// Elastic windows without `outer:H`, or with f32 contributions (a weighted f32 mean would
    /// round differently from the plain one; the packed sums are exact).
    Elastic {
        sync: SyncMode,
        compression: Compression,
    },
    /// Chunk owners without `every-step` and a packed compression (an owner's f32 sum would be
    /// one more order of additions to agree on; `outer:H` windows are not built for them yet).
    Owners {
        sync: SyncMode,
        compression: Compression,
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
            ConfigError::Overlap { overlap, sync } => write!(
                f,
                "overlap {overlap} with sync {sync}: an overlap needs outer:H, below H and at most {}",
                SyncConfig::MAX_OVERLAP
            ),
            ConfigError::Outer { lr, momentum } => {
                write!(f, "outer learning rate {lr} must be positive and finite, outer momentum {momentum} in [0, 1)")
            }
            ConfigError::Elastic { sync, compression } => write!(
                f,
                "elastic windows with sync {sync} and compression {compression}: they need outer:H and int8 or int4"
            ),
            ConfigError::Owners { sync, compression } => write!(
                f,
                "chunk owners with sync {sync} and compression {compression}: they need every-step and a packed \
                 compression (int8, int4 or topk:K)"
            ),
            ConfigError::Rule { rule, sync, compression } => write!(
                f,
                "step rule {rule} with sync {sync} and compression {compression}: it needs every-step, a packed \
                 compression (int8, int4 or topk:K), and a momentum in (0, 1] or a warm-up of at least 1 step"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::sync::OuterOptimizer;

    /// A run unlike the default in every setting (for the codecs' tests).
    pub(crate) fn unlike_the_default() -> RunConfig {
        RunConfig {
            model: ModelConfig { width: 64, context: 32, layers: 2, heads: 8 },
            batch: 8,
            steps: 96,
            lr: 0.5,
            seed: 0x0102_0304_0506_0708,
            sync: SyncConfig {
                mode: SyncMode::Outer { inner_steps: 8 },
                compression: Compression::Int8,
                outer: OuterOptimizer { lr: 0.75, momentum: 0.5 },
                overlap: 3,
                elastic: true,
                rule: StepRule::Sign { momentum: 0.875 },
                exchange: Exchange::Owners,
            },
            corpus: 0x1122_3344_5566_7788,
        }
    }

    /// The golden bytes of a run's settings (the run config message's body after the protocol
    /// version, and checkpoints' from version 3), and the trip back.
    #[test]
    fn the_run_encoding_is_pinned() {
        let run = unlike_the_default();
        let bytes = run.encode();
        let golden: Vec<u8> = [
            &64u32.to_le_bytes()[..],
            &32u32.to_le_bytes(),
            &8u32.to_le_bytes(),
            &2u32.to_le_bytes(),
            &8u32.to_le_bytes(),
            &96u32.to_le_bytes(),
            &0.5f32.to_le_bytes(),
            &[8, 7, 6, 5, 4, 3, 2, 1],
            &[128 + 4, 8, 0, 0, 0, 1],
            &0.75f32.to_le_bytes(),
            &0.5f32.to_le_bytes(),
            &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11],
            &[128 + 1],
            &0.875f32.to_le_bytes(),
        ]
        .concat();
        assert_eq!(bytes.to_vec(), golden);
        assert_eq!(RunConfig::decode(&bytes), Ok(run));
        // Protocols 11-17 and checkpoint version 4: the same without the step rule (Adam's) and
        // the exchange (the mesh).
        let v4: [u8; RunConfig::ENCODED_LEN_V4] = bytes[..RunConfig::ENCODED_LEN_V4].try_into().unwrap();
        let adam = RunConfig { sync: SyncConfig { rule: StepRule::Adam, exchange: Exchange::Mesh, ..run.sync }, ..run };
        assert_eq!(RunConfig::decode_v4(&v4), Ok(adam));
        let mut rule = bytes;
        rule[RunConfig::ENCODED_LEN_V4] = 3;
        assert_eq!(RunConfig::decode(&rule), Err(SyncError::RuleByte(3)));
        rule[RunConfig::ENCODED_LEN_V4] = 128 + 3;
        assert_eq!(RunConfig::decode(&rule), Err(SyncError::RuleByte(128 + 3)));
        // The sign rule's momentum is the packed residual of every-step runs.
        assert_eq!(
            run.validate(),
            Err(ConfigError::Rule { rule: run.sync.rule, sync: run.sync.mode, compression: Compression::Int8 })
        );
        let sign =
            RunConfig { sync: SyncConfig { mode: SyncMode::EveryStep, overlap: 0, elastic: false, ..run.sync }, ..run };
        sign.validate().expect("every-step int8 with the sign rule, summed by chunk owners");
        // Chunk owners: the rule byte's high bit, every-step with a packed compression only.
        let mut mesh_bytes = sign.encode();
        mesh_bytes[RunConfig::ENCODED_LEN_V4] &= !OWNERS_BIT;
        let mesh = RunConfig::decode(&mesh_bytes).unwrap();
        assert_eq!(mesh, RunConfig { sync: SyncConfig { exchange: Exchange::Mesh, ..sign.sync }, ..sign });
        for (sync, compression) in [(run.sync.mode, Compression::Int4), (SyncMode::EveryStep, Compression::None)] {
            let owners =
                RunConfig { sync: SyncConfig { mode: sync, compression, rule: StepRule::Adam, ..run.sync }, ..run };
            let owners = if sync == SyncMode::EveryStep {
                RunConfig { sync: SyncConfig { overlap: 0, elastic: false, ..owners.sync }, ..owners }
            } else {
                owners
            };
            assert_eq!(owners.validate(), Err(ConfigError::Owners { sync, compression }));
            assert!(ConfigError::Owners { sync, compression }.to_string().contains("every-step and a packed"));
        }
        let unpacked = RunConfig { sync: SyncConfig { compression: Compression::None, ..sign.sync }, ..sign };
        assert!(matches!(unpacked.validate(), Err(ConfigError::Rule { .. })));
        // The frozen rule's warm-up is a u32 in the same four bytes.
        let frozen = RunConfig { sync: SyncConfig { rule: StepRule::Frozen { warmup: 30 }, ..sign.sync }, ..sign };
        let frozen_bytes = frozen.encode();
        assert_eq!(frozen_bytes[RunConfig::ENCODED_LEN_V4..], [128 + 2, 30, 0, 0, 0]);
        assert_eq!(RunConfig::decode(&frozen_bytes), Ok(frozen));
        frozen.validate().expect("every-step int8 with the frozen rule");
        let never = RunConfig { sync: SyncConfig { rule: StepRule::Frozen { warmup: 0 }, ..frozen.sync }, ..frozen };
        assert!(matches!(never.validate(), Err(ConfigError::Rule { .. })), "a warm-up of no steps leaves no v");
        // Protocols 4-10 and checkpoint version 3: the same without the corpus's digest.
        let v3: [u8; RunConfig::ENCODED_LEN_V3] = bytes[..RunConfig::ENCODED_LEN_V3].try_into().unwrap();
        assert_eq!(RunConfig::decode_v3(&v3), Ok(RunConfig { corpus: 0, ..adam }));
        // The mode byte is 1 + the overlap for outer:H, plus 128 for elastic windows: every
        // byte but 128 is some setting, and `RunConfig::validate` says which are runs.
        let mut other = adam.encode();
        other[36] = 1;
        let read = RunConfig::decode(&other).expect("outer:8 without overlap");
        assert_eq!((read.sync.overlap, read.sync.elastic), (0, false));
        read.validate().expect("a run");
        other[36] = 9;
        let read = RunConfig::decode(&other).expect("outer:8 with overlap 8");
        assert_eq!((read.sync.overlap, read.sync.elastic), (8, false));
        assert_eq!(read.validate(), Err(ConfigError::Overlap { overlap: 8, sync: SyncMode::Outer { inner_steps: 8 } }));
        other[36] = 129;
        let read = RunConfig::decode(&other).expect("outer:8, elastic");
        assert_eq!((read.sync.overlap, read.sync.elastic), (0, true));
        read.validate().expect("a run");
        other[36] = 128;
        assert_eq!(RunConfig::decode(&other), Err(SyncError::ModeByte(128)));
        // Elastic windows need outer:H and a packed compression.
        let f32_run = RunConfig { sync: SyncConfig { compression: Compression::None, ..adam.sync }, ..adam };
        assert_eq!(
            f32_run.validate(),
            Err(ConfigError::Elastic { sync: SyncMode::Outer { inner_steps: 8 }, compression: Compression::None })
        );
    }
}
