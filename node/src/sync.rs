//! How a group turns its members' contributions into one update, without I/O: the sync modes,
//! int8 compression with error feedback, the exact order-free group sum, and the outer
//! optimizer. `docs/VERIFICATION.md` ("The group sum") specifies the arithmetic bit for bit.
//!
//! A **contribution** is what a member sends at a sync: its gradient (`every-step`) or its
//! pseudo-gradient, the global weights minus its weights after `H` local steps (`outer:H`).
//!
//! - **Uncompressed** (`none`): contributions are f32 and reach every member (the seed's full
//!   mesh); the mean is summed in roster order, each addition an f32 rounding, then divided by
//!   `n` (`crate::step`). Every member holds every contribution, so the order is fixed.
//! - **`int8`**: a member adds its residual to its contribution and [`pack`]s the result in
//!   blocks of 32 with the units' quantizer (a power-of-two scale `2^e` per block, quants in
//!   `[-127, 127]`). The group sum puts every contribution on one grid per block — the largest
//!   `e` among the members' non-empty blocks — rounding each quant to that grid on its own
//!   ([`on_grid`]), and adds the results as integers. Integer addition is associative, so any
//!   schedule (everyone sums everything, owners of chunks sum their chunk, a ring passes
//!   partial sums on the agreed grid) gives the same integers; the mean is one defined
//!   operation on them ([`mean`]). Each member keeps as its residual what the group did not
//!   take of its value ([`residual`]) and adds it next time.

use lockstep_luts::units::{block_exponent, quantize_value, BLOCK};

use crate::compute_error::ComputeError;

/// When the group syncs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// Every optimizer step: the mean gradient feeds every member's (identical) Adam.
    EveryStep,
    /// Every `inner_steps` local Adam steps: the mean pseudo-gradient feeds the outer
    /// optimizer ([`OuterOptimizer`]) on the global weights.
    Outer { inner_steps: u32 },
}

impl SyncMode {
    /// What one sync of this mode is called where a person reads it ("step 3/600").
    pub fn sync_name(self) -> &'static str {
        match self {
            SyncMode::EveryStep => "step",
            SyncMode::Outer { .. } => "outer step",
        }
    }

    /// Optimizer steps per sync.
    pub fn steps_per_sync(self) -> u32 {
        match self {
            SyncMode::EveryStep => 1,
            SyncMode::Outer { inner_steps } => inner_steps,
        }
    }
}

impl std::fmt::Display for SyncMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncMode::EveryStep => f.write_str("every-step"),
            SyncMode::Outer { inner_steps } => write!(f, "outer:{inner_steps}"),
        }
    }
}

impl std::str::FromStr for SyncMode {
    type Err = SyncError;

    fn from_str(s: &str) -> Result<Self, SyncError> {
        if s == "every-step" {
            return Ok(SyncMode::EveryStep);
        }
        match s.strip_prefix("outer:").map(str::parse::<u32>) {
            Some(Ok(h)) if (1..=100_000).contains(&h) => Ok(SyncMode::Outer { inner_steps: h }),
            _ => Err(SyncError::ModeText(s.to_string())),
        }
    }
}

/// What a contribution is sent as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// f32, summed in roster order.
    None,
    /// int8 blocks with power-of-two scales and error feedback, summed exactly.
    Int8,
    /// The same with quants in `[-7, 7]` (two to a byte on the wire): half the bytes.
    Int4,
    /// `topk:K`: in each chunk of [`TOPK_CHUNK`] values, the `K` of largest magnitude (ties to
    /// the lower index), as int8 blocks; the rest stays in the member's error-feedback residual
    /// ([`pack_topk`], `docs/PERFORMANCE.md`, "Every-step sparse sync"). `K` is a power of two
    /// from 1 to [`TOPK_CHUNK`]. Summed exactly, as int8 is; sent as int8 blocks (`-14`: the
    /// sparse frame is not built yet, so its bytes are int8's).
    TopK(u16),
}

/// Values a chunk of `topk:K` picks its `K` from.
pub const TOPK_CHUNK: usize = 4096;

impl Compression {
    /// The form a contribution of this compression travels and is summed in: `topk:K`'s is
    /// int8's (its values are int8 blocks, most of them empty).
    pub fn values_as(self) -> Compression {
        match self {
            Compression::TopK(_) => Compression::Int8,
            other => other,
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Int8 => f.write_str("int8"),
            Compression::Int4 => f.write_str("int4"),
            Compression::TopK(k) => write!(f, "topk:{k}"),
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = SyncError;

    fn from_str(s: &str) -> Result<Self, SyncError> {
        match s {
            "none" => Ok(Compression::None),
            "int8" => Ok(Compression::Int8),
            "int4" => Ok(Compression::Int4),
            _ => match s.strip_prefix("topk:").map(str::parse::<u16>) {
                Some(Ok(k)) if k.is_power_of_two() && usize::from(k) <= TOPK_CHUNK => Ok(Compression::TopK(k)),
                _ => Err(SyncError::CompressionText(s.to_string())),
            },
        }
    }
}

/// The outer optimizer of `outer:H`: SGD with Nesterov momentum on the mean pseudo-gradient
/// `Δ`, element by element in index order, each operation one f32 rounding:
///
/// ```text
/// m ← μ·m + Δ
/// w ← w − η·(Δ + μ·m)
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OuterOptimizer {
    /// `η`.
    pub lr: f32,
    /// `μ`.
    pub momentum: f32,
}

impl OuterOptimizer {
    /// DiLoCo's published setting (η 0.7, μ 0.9); `docs/PERFORMANCE.md` has what it gives here.
    pub const DEFAULT: OuterOptimizer = OuterOptimizer { lr: 0.7, momentum: 0.9 };

    /// One outer step: `weights` are the global weights before the sync, `momentum` the
    /// outer momentum (identical on every member), `delta` the group's mean pseudo-gradient.
    pub fn step(&self, weights: &mut [f32], momentum: &mut [f32], delta: &[f32]) {
        assert!(weights.len() == delta.len() && delta.len() == momentum.len(), "outer step: length mismatch");
        let (lr, mu) = (self.lr, self.momentum);
        for ((w, m), &d) in weights.iter_mut().zip(momentum.iter_mut()).zip(delta) {
            *m = mu * *m + d;
            let nesterov = d + mu * *m;
            *w -= lr * nesterov;
        }
    }
}

/// What `every-step` does with the group's mean (`--step-rule`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StepRule {
    /// `adam`: one Adam step on the mean (`crate::adam`), the member's packed residual carried
    /// whole to its next contribution (error feedback).
    Adam,
    /// `sign:β`: DeMo's rule. A member's residual is a momentum: scaled by `β` before its next
    /// gradient is added (`x = g + β·r`), so what the group has not taken of old gradients
    /// fades; the group moves each weight by the step's learning rate against the sign of the
    /// mean, `w ← w − lr_t·sign(mean)` (one f32 subtraction; none where the mean is 0). No
    /// optimizer state: Adam's moments stay as they were. `β` lies in `(0, 1]`.
    Sign { momentum: f32 },
    /// `frozen:W`: 1-bit Adam's. For the run's first `W` steps contributions are packed dense
    /// (int8 blocks; int4's with `int4`) and the mean feeds Adam; from then on they are packed
    /// as the run's compression and the mean feeds Adam's first moment alone, the second
    /// moment and its bias correction frozen where the warm-up left them:
    /// `w ← w − lr_t·(m/(1−β1ᵗ))/(√(v/(1−β2ᵂ)) + ε)` ([`crate::adam::Adam::update_frozen`]).
    /// The step is then linear in what is summed, so a value error feedback sends late moves
    /// its weight by its size (with a live `v` it moves it by about the same amount whatever
    /// its size). The residual is carried whole.
    Frozen { warmup: u32 },
}

impl StepRule {
    /// What a member's residual is scaled by before its next gradient is added.
    pub fn residual_decay(self) -> f32 {
        match self {
            StepRule::Adam | StepRule::Frozen { .. } => 1.0,
            StepRule::Sign { momentum } => momentum,
        }
    }

    /// Whether its parameter is one the rule takes: a momentum in `(0, 1]`, a warm-up of at
    /// least one step (the text refuses others; `RunConfig::validate` decoded ones).
    pub fn in_range(self) -> bool {
        match self {
            StepRule::Adam => true,
            StepRule::Sign { momentum } => momentum > 0.0 && momentum <= 1.0,
            StepRule::Frozen { warmup } => warmup >= 1,
        }
    }

    /// Whether the step a member takes after `done` steps is Adam's whole (not the sign
    /// rule's, nor one with the second moment frozen).
    pub fn adam_at(self, done: u32) -> bool {
        match self {
            StepRule::Adam => true,
            StepRule::Sign { .. } => false,
            StepRule::Frozen { warmup } => done < warmup,
        }
    }
}

impl std::fmt::Display for StepRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepRule::Adam => f.write_str("adam"),
            StepRule::Sign { momentum } => write!(f, "sign:{momentum}"),
            StepRule::Frozen { warmup } => write!(f, "frozen:{warmup}"),
        }
    }
}

impl std::str::FromStr for StepRule {
    type Err = SyncError;

    fn from_str(s: &str) -> Result<Self, SyncError> {
        let rule = match (s.strip_prefix("sign:"), s.strip_prefix("frozen:")) {
            _ if s == "adam" => Some(StepRule::Adam),
            (Some(momentum), _) => momentum.parse().ok().map(|momentum| StepRule::Sign { momentum }),
            (_, Some(warmup)) => warmup.parse().ok().map(|warmup| StepRule::Frozen { warmup }),
            _ => None,
        };
        rule.filter(|r| r.in_range()).ok_or_else(|| SyncError::RuleText(s.to_string()))
    }
}

/// Who sums a step's contributions (`--exchange`, `docs/OWNERS.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Exchange {
    /// `mesh`: every member sends its whole contribution to every other and each sums them all.
    #[default]
    Mesh,
    /// `owners`: chunk owners. A member sends every other a header (its contribution's fields
    /// and its pieces' digests) and each owner only its chunk; the owner sums that chunk of the
    /// record's contributions and sends the sum to everyone (reduce-scatter, then all-gather).
    /// `every-step` with a packed compression only: an owner's sum is a sum of integers, so it
    /// has one answer whoever forms it.
    Owners,
}

impl std::fmt::Display for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Exchange::Mesh => "mesh",
            Exchange::Owners => "owners",
        })
    }
}

impl std::str::FromStr for Exchange {
    type Err = SyncError;

    fn from_str(s: &str) -> Result<Self, SyncError> {
        match s {
            "mesh" => Ok(Exchange::Mesh),
            "owners" => Ok(Exchange::Owners),
            _ => Err(SyncError::ExchangeText(s.to_string())),
        }
    }
}

/// The sign rule's step ([`StepRule::Sign`]): each weight moves by `lr` against the sign of
/// its `mean` (one f32 subtraction or addition; none where the mean is 0), element by element.
pub fn sign_step(weights: &mut [f32], mean: &[f32], lr: f32) {
    assert_eq!(weights.len(), mean.len(), "sign step: length mismatch");
    for (w, &m) in weights.iter_mut().zip(mean) {
        if m > 0.0 {
            *w -= lr;
        } else if m < 0.0 {
            *w += lr;
        }
    }
}

/// How a run syncs: part of the run config (wire `-3`) and of every checkpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyncConfig {
    pub mode: SyncMode,
    pub compression: Compression,
    /// Used by `outer:H` only.
    pub outer: OuterOptimizer,
    /// `outer:H` only: inner steps of the next window a member runs from its own weights while
    /// the group sums the last one, before it applies the group's mean ([`Strategy::run_ahead`]);
    /// 0 waits for the mean (no overlap).
    pub overlap: u32,
    /// `outer:H` with `int8` or `int4` only: *elastic windows*. A window ends for everyone when
    /// the first member has finished its `H` inner steps; each member contributes the steps it
    /// finished by then (at least one), and the group's mean weighs each contribution by them
    /// ([`reduce`]). Members of different speeds each do their share; without it a window waits
    /// for the slowest member's `H` steps.
    pub elastic: bool,
    /// `every-step` with a packed compression only: what the group's mean does ([`StepRule`]).
    pub rule: StepRule,
    /// `every-step` with a packed compression only: who sums the contributions ([`Exchange`]).
    pub exchange: Exchange,
}

impl SyncConfig {
    /// Whether a member's optimizer state may stay on a backend's device between syncs:
    /// `every-step` touches only gradients; `outer:H` reads the weights on the host at every
    /// sync.
    pub fn state_may_stay_on_device(&self) -> bool {
        // The sign rule's step and the frozen one are host code (no backend has them as ops yet).
        self.mode == SyncMode::EveryStep && self.rule == StepRule::Adam
    }

    /// How the contribution a member makes after `done` steps is packed: the run's compression,
    /// or in `frozen:W`'s warm-up its dense form ([`Compression::values_as`]).
    pub fn compression_at(&self, done: u32) -> Compression {
        match self.rule {
            StepRule::Frozen { warmup } if done < warmup => self.compression.values_as(),
            _ => self.compression,
        }
    }

    /// The seed's exchange: every step, f32.
    pub const SEED: SyncConfig = SyncConfig {
        mode: SyncMode::EveryStep,
        compression: Compression::None,
        outer: OuterOptimizer::DEFAULT,
        overlap: 0,
        elastic: false,
        rule: StepRule::Adam,
        exchange: Exchange::Mesh,
    };

    /// The largest overlap the encoding carries (the mode byte's low 7 bits are `1 + overlap`).
    pub const MAX_OVERLAP: u32 = 126;

    /// A contribution's weight in the group's mean, as its wire message carries it: in elastic
    /// windows the inner steps it stands for (`1..=H`); otherwise always 1.
    pub fn weights_allowed(&self) -> std::ops::RangeInclusive<u32> {
        if self.elastic {
            1..=self.mode.steps_per_sync()
        } else {
            1..=1
        }
    }
}

/// `topk:K`'s compression byte is this plus log₂ K…
const TOPK_BYTE: u8 = 16;
/// …up to `K` = [`TOPK_CHUNK`].
const TOPK_BYTE_LAST: u8 = TOPK_BYTE + TOPK_CHUNK.trailing_zeros() as u8;

impl SyncConfig {
    /// Bytes of [`SyncConfig::encode`].
    pub const ENCODED_LEN: usize = 14;

    /// The settings as the run config (`-3`) and checkpoints carry them, little-endian:
    /// `[u8 mode (0 every-step; for outer, 1 + overlap, plus 128 for elastic windows)][u32 H (1
    /// for every-step)][u8 compression (0 none, 1 int8, 2 int4, 16 + log₂ K topk:K)][f32 outer lr][f32 outer
    /// momentum]`; the step rule and the exchange are not among them (the run config carries them last,
    /// `RunConfig::encode`). An overlap past [`SyncConfig::MAX_OVERLAP`], or an overlap or elastic windows
    /// with `every-step`, is not a valid run (`RunConfig::validate`) and is not encoded.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let (mode, h) = match self.mode {
            SyncMode::EveryStep => (0u8, 1u32),
            SyncMode::Outer { inner_steps } => {
                (1 + self.overlap.min(Self::MAX_OVERLAP) as u8 + if self.elastic { 128 } else { 0 }, inner_steps)
            }
        };
        let compression = match self.compression {
            Compression::None => 0u8,
            Compression::Int8 => 1,
            Compression::Int4 => 2,
            Compression::TopK(k) => TOPK_BYTE + k.trailing_zeros() as u8,
        };
        let mut out = [0u8; Self::ENCODED_LEN];
        out[0] = mode;
        out[1..5].copy_from_slice(&h.to_le_bytes());
        out[5] = compression;
        out[6..10].copy_from_slice(&self.outer.lr.to_le_bytes());
        out[10..14].copy_from_slice(&self.outer.momentum.to_le_bytes());
        out
    }

    /// Reads [`SyncConfig::encode`]'s bytes; an unknown mode or compression is named.
    pub fn decode(bytes: &[u8; Self::ENCODED_LEN]) -> Result<SyncConfig, SyncError> {
        let word = |at: usize| [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]];
        let (mode, overlap, elastic) = match bytes[0] {
            0 => (SyncMode::EveryStep, 0, false),
            // 128 alone (elastic, overlap −1) is no setting.
            128 => return Err(SyncError::ModeByte(128)),
            b => (SyncMode::Outer { inner_steps: u32::from_le_bytes(word(1)) }, u32::from(b & 127) - 1, b >= 128),
        };
        let compression = match bytes[5] {
            0 => Compression::None,
            1 => Compression::Int8,
            2 => Compression::Int4,
            b @ TOPK_BYTE..=TOPK_BYTE_LAST => Compression::TopK(1 << (b - TOPK_BYTE)),
            other => return Err(SyncError::CompressionByte(other)),
        };
        let outer = OuterOptimizer { lr: f32::from_le_bytes(word(6)), momentum: f32::from_le_bytes(word(10)) };
        // The step rule came later and is carried at the run config's end (`RunConfig::encode`).
        Ok(SyncConfig { mode, compression, outer, overlap, elastic, rule: StepRule::Adam, exchange: Exchange::Mesh })
    }
}

impl std::fmt::Display for SyncConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.mode, self.compression)?;
        if self.overlap > 0 {
            write!(f, " overlap {}", self.overlap)?;
        }
        if self.elastic {
            f.write_str(" elastic")?;
        }
        if self.exchange != Exchange::Mesh {
            write!(f, " {}", self.exchange)?;
        }
        Ok(())
    }
}

/// Why sync settings, a packed contribution or sync state were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncError {
    /// Text that is not a sync mode.
    ModeText(String),
    /// Text that is not a compression.
    CompressionText(String),
    /// A compression byte this version does not know.
    CompressionByte(u8),
    /// Text that is not a step rule.
    RuleText(String),
    /// A step rule byte this version does not know.
    RuleByte(u8),
    /// Text that is not an exchange.
    ExchangeText(String),
    /// A mode byte that is no setting (128: elastic windows without a mode).
    ModeByte(u8),
    /// A packed contribution without one block byte per block.
    BlockBytes { bytes: usize, values: usize },
    /// A quant outside `[-127, 127]` (`[-7, 7]` for int4): the quantizer never makes one.
    QuantRange { index: usize, quant: i8 },
    /// A block marked empty that holds values.
    EmptyBlockNotEmpty { block: usize },
    /// More sync tensors than this version knows.
    TensorCount(usize),
    /// A sync tensor of another length than the model.
    TensorLength { values: usize, model: usize },
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::ModeText(s) => {
                write!(f, "`{s}` is not a sync mode: every-step or outer:H with H from 1 to 100000")
            }
            SyncError::CompressionText(s) => write!(
                f,
                "`{s}` is not a compression: none, int8, int4 or topk:K (K a power of two from 1 to {TOPK_CHUNK})"
            ),
            SyncError::CompressionByte(b) => write!(f, "compression {b}"),
            SyncError::RuleText(s) => {
                write!(f, "`{s}` is not a step rule: adam, sign:β with β in (0, 1], or frozen:W with W at least 1")
            }
            SyncError::RuleByte(b) => write!(f, "step rule {b}"),
            SyncError::ExchangeText(s) => write!(f, "`{s}` is not an exchange: mesh or owners"),
            SyncError::ModeByte(b) => write!(f, "sync mode byte {b}"),
            SyncError::BlockBytes { bytes, values } => write!(f, "{bytes} exponent bytes for {values} values"),
            SyncError::QuantRange { index, quant } => {
                write!(f, "quant {quant} at {index} (int8 quants lie in [-127, 127], int4 ones in [-7, 7])")
            }
            SyncError::EmptyBlockNotEmpty { block } => {
                write!(f, "block {block} is marked empty but has non-zero quants")
            }
            SyncError::TensorCount(n) => write!(f, "{n} sync tensors (this version knows 2)"),
            SyncError::TensorLength { values, model } => {
                write!(f, "a sync tensor of {values} values, the model has {model}")
            }
        }
    }
}

impl std::error::Error for SyncError {}

pub mod owners;
pub mod schedules;
mod strategy;
mod sum;

pub use strategy::*;
pub use sum::*;

#[cfg(test)]
mod tests;
