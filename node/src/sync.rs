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
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Int8 => "int8",
            Compression::Int4 => "int4",
        })
    }
}

impl std::str::FromStr for Compression {
    type Err = SyncError;

    fn from_str(s: &str) -> Result<Self, SyncError> {
        match s {
            "none" => Ok(Compression::None),
            "int8" => Ok(Compression::Int8),
            "int4" => Ok(Compression::Int4),
            _ => Err(SyncError::CompressionText(s.to_string())),
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
}

impl SyncConfig {
    /// Whether a member's optimizer state may stay on a backend's device between syncs:
    /// `every-step` touches only gradients; `outer:H` reads the weights on the host at every
    /// sync.
    pub fn state_may_stay_on_device(&self) -> bool {
        self.mode == SyncMode::EveryStep
    }

    /// The seed's exchange: every step, f32.
    pub const SEED: SyncConfig = SyncConfig {
        mode: SyncMode::EveryStep,
        compression: Compression::None,
        outer: OuterOptimizer::DEFAULT,
        overlap: 0,
        elastic: false,
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

impl SyncConfig {
    /// Bytes of [`SyncConfig::encode`].
    pub const ENCODED_LEN: usize = 14;

    /// The settings as the run config (`-3`) and checkpoints carry them, little-endian:
    /// `[u8 mode (0 every-step; for outer, 1 + overlap, plus 128 for elastic windows)][u32 H (1
    /// for every-step)][u8 compression (0 none, 1 int8, 2 int4)][f32 outer lr][f32 outer
    /// momentum]`. An overlap past [`SyncConfig::MAX_OVERLAP`], or an overlap or elastic windows
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
            other => return Err(SyncError::CompressionByte(other)),
        };
        let outer = OuterOptimizer { lr: f32::from_le_bytes(word(6)), momentum: f32::from_le_bytes(word(10)) };
        Ok(SyncConfig { mode, compression, outer, overlap, elastic })
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
            SyncError::CompressionText(s) => write!(f, "`{s}` is not a compression: none, int8 or int4"),
            SyncError::CompressionByte(b) => write!(f, "compression {b}"),
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

/// Exponent byte of a block with no normal value (it contributes zeros on any grid).
pub const EMPTY_BLOCK: u8 = 0;
/// Exponent byte `b` of a non-empty block stands for `e = b - EXPONENT_BIAS`; the units'
/// block exponents lie in `[-132, 122]`, so every one has a byte in `[1, 255]`.
pub const EXPONENT_BIAS: i32 = 133;

/// A contribution in int8 blocks: `q[k] · 2^e(block of k)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packed {
    /// One byte per block of [`BLOCK`] values (the last block may be short): [`EMPTY_BLOCK`]
    /// or `e + EXPONENT_BIAS`.
    pub exponents: Vec<u8>,
    pub q: Vec<i8>,
}

impl Packed {
    pub fn len(&self) -> usize {
        self.q.len()
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Checks the shape and ranges a decoder cannot (a block byte per block, quants within
    /// `±limit`, an empty block all zeros).
    pub fn validate(&self, limit: i8) -> Result<(), SyncError> {
        if self.exponents.len() != self.q.len().div_ceil(BLOCK) {
            return Err(SyncError::BlockBytes { bytes: self.exponents.len(), values: self.q.len() });
        }
        if let Some(index) = self.q.iter().position(|&q| q == i8::MIN || q.abs() > limit) {
            return Err(SyncError::QuantRange { index, quant: self.q[index] });
        }
        for (block, &e) in self.exponents.iter().enumerate() {
            let quants = &self.q[block * BLOCK..((block + 1) * BLOCK).min(self.q.len())];
            if e == EMPTY_BLOCK && quants.iter().any(|&q| q != 0) {
                return Err(SyncError::EmptyBlockNotEmpty { block });
            }
        }
        Ok(())
    }
}

/// A value that cannot be packed: the contribution is not finite (a diverged member).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NonFinite {
    pub index: usize,
}

impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the contribution is not finite at index {}", self.index)
    }
}

impl std::error::Error for NonFinite {}

/// Quantizes `x` with the units' block quantizer (`docs/VERIFICATION.md`, step 2).
pub fn pack(x: &[f32]) -> Result<Packed, NonFinite> {
    if let Some(index) = x.iter().position(|v| !v.is_finite()) {
        return Err(NonFinite { index });
    }
    let mut exponents = Vec::with_capacity(x.len().div_ceil(BLOCK));
    let mut q = Vec::with_capacity(x.len());
    for block in x.chunks(BLOCK) {
        let amax = block.iter().map(|v| v.to_bits() & 0x7fff_ffff).max().unwrap_or(0);
        if amax < 0x0080_0000 {
            // No normal value: zeros on every grid.
            exponents.push(EMPTY_BLOCK);
            q.extend(std::iter::repeat_n(0i8, block.len()));
            continue;
        }
        let e = block_exponent(amax);
        exponents.push((e + EXPONENT_BIAS) as u8);
        q.extend(block.iter().map(|v| quantize_value(v.to_bits(), e)));
    }
    Ok(Packed { exponents, q })
}

/// The largest int4 quant.
pub const INT4_LIMIT: i8 = 7;

/// [`pack`] with 4-bit quants: each block's int8 quants rounded to a grid 16 times coarser
/// (exponent `e + 4`, at most the largest block exponent 122), half to even, and clamped to
/// `[-7, 7]` (an int8 quant of 120 or more rounds to 8). What rounding and clamping leave is
/// carried by the member's residual like any other part of its value the group did not take.
pub fn pack4(x: &[f32]) -> Result<Packed, NonFinite> {
    let mut packed = pack(x)?;
    for (block, e) in packed.exponents.iter_mut().enumerate() {
        if *e == EMPTY_BLOCK {
            continue;
        }
        let coarse = (*e).saturating_add(4);
        let shift = u32::from(coarse - *e);
        *e = coarse;
        let end = ((block + 1) * BLOCK).min(packed.q.len());
        for q in &mut packed.q[block * BLOCK..end] {
            *q = shift_round_half_even(*q, shift).clamp(-i32::from(INT4_LIMIT), i32::from(INT4_LIMIT)) as i8;
        }
    }
    Ok(packed)
}

/// The group's grid: per block, the largest exponent byte among the non-empty blocks
/// ([`EMPTY_BLOCK`] where all are empty). `max` is associative, so it too is order-free.
pub fn group_grid<'a>(contributions: impl IntoIterator<Item = &'a Packed>) -> Vec<u8> {
    let mut grid: Vec<u8> = Vec::new();
    for p in contributions {
        if grid.is_empty() {
            grid = p.exponents.clone();
        } else {
            for (g, &e) in grid.iter_mut().zip(&p.exponents) {
                *g = (*g).max(e);
            }
        }
    }
    grid
}

/// `q · 2^-shift` rounded to the nearest integer, ties to even.
fn shift_round_half_even(q: i8, shift: u32) -> i32 {
    let q = i32::from(q);
    if shift == 0 {
        return q;
    }
    if shift >= 9 {
        return 0; // |q| ≤ 127 < 2^8: below one half
    }
    let magnitude = q.unsigned_abs();
    let truncated = magnitude >> shift;
    let remainder = magnitude & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let rounded = if remainder > half || (remainder == half && truncated & 1 == 1) { truncated + 1 } else { truncated };
    if q < 0 {
        -(rounded as i32)
    } else {
        rounded as i32
    }
}

/// Adds `p`'s values `range` (block-aligned start) to `sum`, each put on `grid` on its own:
/// `round_half_even(q · 2^(e − E))` for a block of exponent `e` on a grid of exponent `E`.
pub fn on_grid(p: &Packed, grid: &[u8], range: std::ops::Range<usize>, sum: &mut [i32]) {
    debug_assert!(range.start.is_multiple_of(BLOCK) && sum.len() == range.len());
    for (offset, chunk) in p.q[range.clone()].chunks(BLOCK).enumerate() {
        let block = range.start / BLOCK + offset;
        let e = p.exponents[block];
        if e == EMPTY_BLOCK {
            continue;
        }
        let shift = u32::from(grid[block] - e);
        let out = &mut sum[offset * BLOCK..offset * BLOCK + chunk.len()];
        for (s, &q) in out.iter_mut().zip(chunk) {
            *s += shift_round_half_even(q, shift);
        }
    }
}

/// `2^e` as an f64, built on the bits (`e` in the normal range).
fn pow2(e: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&e));
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// The mean of `n` contributions whose sum on `grid` is `sum`: for each value,
/// `f32(f64(S) · 2^E / f64(n))` — the product is exact in f64, the division and the final
/// conversion round to nearest, ties to even. Values of empty blocks are +0.
pub fn mean(sum: &[i32], grid: &[u8], n: usize) -> Vec<f32> {
    scaled_mean(sum, grid, n as f64, f64::from)
}

/// The weighted mean of contributions whose weighted sum on `grid` is `sum` and whose weights
/// (in lowest terms) add up to `total`: `f32(f64(S) · 2^E / f64(total))`, as [`mean`] (`S` and
/// `total` are far below 2^53, so both convert exactly).
fn weighted_mean(sum: &[i64], grid: &[u8], total: u64) -> Vec<f32> {
    scaled_mean(sum, grid, total as f64, |s| s as f64)
}

fn scaled_mean<T: Copy + Default + PartialEq>(sum: &[T], grid: &[u8], divisor: f64, to_f64: fn(T) -> f64) -> Vec<f32> {
    sum.chunks(BLOCK)
        .zip(grid)
        .flat_map(|(chunk, &g)| {
            let scale = if g == EMPTY_BLOCK { 0.0 } else { pow2(i32::from(g) - EXPONENT_BIAS) };
            chunk.iter().map(move |&s| if s == T::default() { 0.0 } else { ((to_f64(s) * scale) / divisor) as f32 })
        })
        .collect()
}

/// Weights over their greatest common divisor: equal weights become all 1, so a weighted mean
/// of equal weights is the plain mean, bit for bit.
fn lowest_terms(weights: &[u32]) -> Vec<u32> {
    fn gcd(a: u32, b: u32) -> u32 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let divisor = weights.iter().copied().fold(0, gcd).max(1);
    weights.iter().map(|w| w / divisor).collect()
}

/// The weighted sum on the group's grid: `Σ wᵢ · round(qᵢ · 2^(eᵢ − E))` per value, in 64-bit
/// integers — each term put on the grid on its own, so any order of addition gives these
/// integers.
fn sum_weighted(contributions: &[&Packed], weights: &[u32]) -> (Vec<u8>, Vec<i64>) {
    assert_eq!(contributions.len(), weights.len(), "one weight per contribution");
    let grid = group_grid(contributions.iter().copied());
    let len = contributions.first().map_or(0, |p| p.len());
    let mut sum = vec![0i64; len];
    let mut terms = vec![0i32; len];
    for (p, &w) in contributions.iter().zip(weights) {
        terms.fill(0);
        on_grid(p, &grid, 0..len, &mut terms);
        for (s, &t) in sum.iter_mut().zip(&terms) {
            *s += i64::from(w) * i64::from(t);
        }
    }
    (grid, sum)
}

/// The group sum as one member computes it when it holds every contribution (the mesh's
/// schedule today): the grid, then each contribution on it, added in any order.
pub fn sum_direct(contributions: &[&Packed]) -> (Vec<u8>, Vec<i32>) {
    let grid = group_grid(contributions.iter().copied());
    let len = contributions.first().map_or(0, |p| p.len());
    let mut sum = vec![0i32; len];
    for p in contributions {
        on_grid(p, &grid, 0..len, &mut sum);
    }
    (grid, sum)
}

/// What a member keeps of `x` (its contribution plus residual, packed as `own`) that the group
/// did not take: `x − round(q · 2^(e − E)) · 2^E`, one f32 subtraction per value (the term is
/// exact in f32).
pub fn residual(x: &[f32], own: &Packed, grid: &[u8]) -> Vec<f32> {
    let mut taken = vec![0i32; x.len()];
    on_grid(own, grid, 0..x.len(), &mut taken);
    x.chunks(BLOCK)
        .zip(taken.chunks(BLOCK))
        .zip(grid)
        .flat_map(|((xs, ts), &g)| {
            let e = i32::from(g) - EXPONENT_BIAS;
            xs.iter().zip(ts).map(move |(&x, &t)| if t == 0 { x } else { x - (f64::from(t) * pow2(e)) as f32 })
        })
        .collect()
}

/// What a contribution carries.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    F32(Vec<f32>),
    Int8(Packed),
    /// Quants in `[-7, 7]`.
    Int4(Packed),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::Int8(p) | Values::Int4(p) => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn compression(&self) -> Compression {
        match self {
            Values::F32(_) => Compression::None,
            Values::Int8(_) => Compression::Int8,
            Values::Int4(_) => Compression::Int4,
        }
    }

    /// The blocks of an int8 or int4 contribution.
    pub fn packed(&self) -> Option<&Packed> {
        match self {
            Values::F32(_) => None,
            Values::Int8(p) | Values::Int4(p) => Some(p),
        }
    }

    /// Checks a contribution before it may join a sum: every value finite and of magnitude at
    /// most [`CONTRIBUTION_BOUND`]. Nothing an honest member computes comes near the bound (a
    /// gradient or a weight delta that large means its training diverged); a value past it, or
    /// a NaN, would poison every replica's next update.
    pub fn check_bounds(&self) -> Result<(), OutOfBounds> {
        match self {
            Values::F32(v) => match v.iter().position(|x| x.is_nan() || x.abs() > CONTRIBUTION_BOUND) {
                Some(index) => Err(OutOfBounds { index, value: v[index] }),
                None => Ok(()),
            },
            Values::Int8(p) | Values::Int4(p) => {
                // A value is q · 2^(b − 133); only blocks with b − 133 > 25 can pass 2^32
                // (127 · 2^25 < 2^32), and there the largest quant decides.
                for (block, &b) in p.exponents.iter().enumerate() {
                    let e = i32::from(b) - EXPONENT_BIAS;
                    if b == EMPTY_BLOCK || e <= 25 {
                        continue;
                    }
                    let quants = &p.q[(block * BLOCK).min(p.q.len())..((block + 1) * BLOCK).min(p.q.len())];
                    // The first of the largest (`max_by_key` keeps the last, so walk backwards).
                    if let Some((i, &q)) = quants.iter().enumerate().rev().max_by_key(|(_, q)| q.unsigned_abs()) {
                        let value = f64::from(q) * 2f64.powi(e);
                        if value.abs() > f64::from(CONTRIBUTION_BOUND) {
                            return Err(OutOfBounds { index: block * BLOCK + i, value: value as f32 });
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// The largest magnitude a contribution's value may have (2^32).
pub const CONTRIBUTION_BOUND: f32 = 4_294_967_296.0;

/// A contribution value that is not finite or past [`CONTRIBUTION_BOUND`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutOfBounds {
    pub index: usize,
    pub value: f32,
}

impl std::fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value.is_finite() {
            write!(f, "value {} at index {} is past the bound of 2^32", self.value, self.index)
        } else {
            write!(f, "value {} at index {} is not finite", self.value, self.index)
        }
    }
}

impl std::error::Error for OutOfBounds {}

/// The group's mean and, for `int8`, the grid it was summed on (what each member's residual
/// is measured against).
#[derive(Clone, Debug, PartialEq)]
pub struct Reduced {
    pub mean: Vec<f32>,
    pub grid: Vec<u8>,
}

/// The group's mean of `contributions`, given in roster order, all of one encoding and length
/// (the caller checks), each with its weight (`weights`, the inner steps it stands for in
/// elastic windows, else 1), taken in lowest terms. f32 ones: summed in roster order, each
/// addition an f32 rounding, then divided by `n` — never weighed (a run refuses elastic windows
/// without a packed compression; unequal weights here are a caller's bug). int8 and int4 ones:
/// summed exactly ([`sum_direct`], or weighted in 64-bit integers when the weights differ) and
/// averaged by [`mean`] or by the weights' total. Equal weights give the unweighted mean's bits.
pub fn reduce(contributions: &[&Values], weights: &[u32]) -> Reduced {
    assert_eq!(contributions.len(), weights.len(), "one weight per contribution");
    let weights = lowest_terms(weights);
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    let plain = weights.iter().all(|&w| w == 1);
    match contributions.first() {
        None => Reduced { mean: Vec::new(), grid: Vec::new() },
        Some(Values::F32(first)) => {
            assert!(plain, "f32 contributions are never weighed (elastic windows need int8 or int4)");
            let mut sum = first.clone();
            for values in &contributions[1..] {
                let Values::F32(v) = values else { panic!("mixed encodings in one sync") };
                for (s, g) in sum.iter_mut().zip(v) {
                    *s += g;
                }
            }
            Reduced { mean: mean_f32(sum, contributions.len()), grid: Vec::new() }
        }
        Some(first) => {
            let packed: Vec<&Packed> = contributions
                .iter()
                .map(|v| match v.packed() {
                    Some(p) if v.compression() == first.compression() => p,
                    _ => panic!("mixed encodings in one sync"),
                })
                .collect();
            if plain {
                let (grid, sum) = sum_direct(&packed);
                Reduced { mean: mean(&sum, &grid, packed.len()), grid }
            } else {
                let (grid, sum) = sum_weighted(&packed, &weights);
                Reduced { mean: weighted_mean(&sum, &grid, total), grid }
            }
        }
    }
}

/// The f32 mean: the roster-order sum divided by the member count, element by element.
fn mean_f32(mut sum: Vec<f32>, n: usize) -> Vec<f32> {
    let n = n as f32;
    for s in &mut sum {
        *s /= n;
    }
    sum
}

/// [`reduce`] of a group of one, taking the contribution by value: the same operations, without
/// a copy of an f32 contribution (a lone node's step).
pub fn reduce_one(values: Values) -> Reduced {
    match values {
        Values::F32(x) => Reduced { mean: mean_f32(x, 1), grid: Vec::new() },
        packed => reduce(&[&packed], &[1]),
    }
}

// ---- one member's side of a sync ----

/// What a member keeps between syncs besides its weights and Adam's state: tensors the sync
/// settings use (empty where a setting uses none), carried by checkpoints and resumes in the
/// order [`SyncState::tensors`] gives.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyncState {
    /// `outer:H`: the outer optimizer's momentum (identical on every member).
    pub outer_momentum: Vec<f32>,
    /// `int8`: what this member's past contributions left untaken (its own).
    pub residual: Vec<f32>,
}

impl SyncState {
    /// Zeros for every tensor `config` uses, for a model of `len` weights.
    pub fn new(config: &SyncConfig, len: usize) -> SyncState {
        SyncState::from_tensors(config, Vec::new(), len).expect("no tensors carried: nothing to refuse")
    }

    /// The tensors, in the order checkpoints store them.
    pub fn tensors(&self) -> [&[f32]; 2] {
        [&self.outer_momentum, &self.residual]
    }

    /// The state a checkpoint carried (`tensors` in [`SyncState::tensors`]' order, fewer when
    /// it is older), made to fit `config`: a tensor the settings use is kept, or zeros when the
    /// checkpoint had none (a run of another setting); one they do not use is dropped. A tensor
    /// of another length than the model's, or more tensors than this version knows, is refused.
    pub fn from_tensors(config: &SyncConfig, tensors: Vec<Vec<f32>>, len: usize) -> Result<SyncState, SyncError> {
        if tensors.len() > 2 {
            return Err(SyncError::TensorCount(tensors.len()));
        }
        if let Some(t) = tensors.iter().find(|t| !t.is_empty() && t.len() != len) {
            return Err(SyncError::TensorLength { values: t.len(), model: len });
        }
        let mut carried = tensors.into_iter();
        let mut take = |used: bool| match (used, carried.next().filter(|t| !t.is_empty())) {
            (true, Some(t)) => t,
            (true, None) => vec![0.0; len],
            (false, _) => Vec::new(),
        };
        let outer_momentum = take(matches!(config.mode, SyncMode::Outer { .. }));
        let residual = take(config.compression != Compression::None);
        Ok(SyncState { outer_momentum, residual })
    }
}

/// A member's training, as a sync drives it: its gradient on the next batch, one local
/// optimizer step, and its weights on the host.
pub trait Member {
    /// Loss and gradient of the next batch at the current weights.
    fn gradient(&mut self) -> Result<(f32, Vec<f32>), ComputeError>;
    /// One optimizer step (Adam) from `grad`.
    fn apply(&mut self, grad: &[f32]) -> Result<(), ComputeError>;
    /// One local step: the gradient of the next batch, applied at once ([`Member::gradient`],
    /// then [`Member::apply`] — a member whose device holds its state may do both there,
    /// without moving the gradient). The loss.
    fn step_alone(&mut self) -> Result<f32, ComputeError> {
        let (loss, grad) = self.gradient()?;
        self.apply(&grad)?;
        Ok(loss)
    }
    /// The weights, on the host.
    fn weights(&mut self) -> &mut Vec<f32>;
    /// Takes back the step count of `steps` local steps (a sync abandoned half way).
    fn rewind(&mut self, steps: u32);
    /// Optimizer steps the run has left.
    fn steps_left(&self) -> u32;
    /// Elastic windows: whether the window should end after `done` of its inner steps (another
    /// member finished its `H`). Asked after each inner step but the window's last.
    fn hurried(&self, _done: u32) -> bool {
        false
    }
    /// Elastic windows: passes over `steps` optimizer steps of a window ended early, as if they
    /// were taken — the step count (the learning-rate schedule's position) and the data stream
    /// move on to the next window's start, the weights and the optimizer's moments stay.
    fn skip(&mut self, steps: u32);
}

/// One member's contribution to a sync.
#[derive(Clone, Debug, PartialEq)]
pub struct Contribution {
    /// The loss of the step (`every-step`) or the mean of the inner steps' losses, in order.
    pub loss: f32,
    pub values: Values,
    /// Its weight in the group's mean ([`SyncConfig::weights_allowed`]): in elastic windows the
    /// inner steps it stands for, else 1.
    pub weight: u32,
}

/// Why a contribution could not be made.
#[derive(Clone, Debug)]
pub enum ContributeError {
    Compute(ComputeError),
    /// The values to send are not finite: this member's training diverged.
    NonFinite(NonFinite),
}

impl std::fmt::Display for ContributeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ContributeError::Compute(e) => write!(f, "{e}"),
            ContributeError::NonFinite(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ContributeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ContributeError::Compute(e) => Some(e),
            ContributeError::NonFinite(e) => Some(e),
        }
    }
}

impl From<ComputeError> for ContributeError {
    fn from(e: ComputeError) -> Self {
        ContributeError::Compute(e)
    }
}

/// A contribution under way: what [`Strategy::finish`] needs of it.
#[derive(Clone, Debug, Default)]
struct InFlight {
    /// `outer:H`: the global weights the inner steps started from.
    global: Option<Vec<f32>>,
    /// `int8`: the values and what they were packed as.
    packed: Option<(Vec<f32>, Packed)>,
}

/// `outer:H` with an overlap: the next window's first steps, run before the group's mean came.
#[derive(Clone, Debug)]
struct Ahead {
    /// The member's weights when they began (the end of the window it contributed).
    anchor: Vec<f32>,
    steps: u32,
    losses: f32,
}

/// `outer:H` with an overlap, after the mean: the window's steps so far sit on the new global
/// weights, which the window's contribution is measured from.
#[derive(Clone, Debug)]
struct Rebased {
    global: Vec<f32>,
    steps: u32,
    losses: f32,
}

/// One member's side of every sync, for every mode: what it contributes, and what it does with
/// the group's mean. A new sync mode is a new [`SyncMode`] and its arms here; the trainer has no
/// mode of its own.
///
/// With an overlap `D` (`outer:H`, [`SyncConfig::overlap`]) a window's steps are split: after
/// contributing window `k`, the member runs the first `D` steps of window `k + 1` from its own
/// weights `L` ([`Strategy::run_ahead`]) while the group sums window `k`; then the group's mean
/// gives the new global weights `G`, and the member's weights become `G − (L − W)`, where `W` is
/// where the `D` steps ended: its progress moved onto the group's weights, element by element,
/// each subtraction one f32 rounding. Window `k + 1` contributes `G` minus its weights after its
/// remaining `H − D` steps. Every member's global weights (what the guard hashes) stay
/// bit-identical; with `D = 0` the arithmetic is exactly the plain `outer:H`.
#[derive(Clone, Debug, Default)]
pub struct Strategy {
    config: SyncConfig,
    state: SyncState,
    in_flight: Option<InFlight>,
    ahead: Option<Ahead>,
    rebased: Option<Rebased>,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig::SEED
    }
}

impl Strategy {
    pub fn new(config: SyncConfig, state: SyncState) -> Strategy {
        Strategy { config, state, in_flight: None, ahead: None, rebased: None }
    }

    pub fn config(&self) -> &SyncConfig {
        &self.config
    }

    pub fn state(&self) -> &SyncState {
        &self.state
    }

    /// The group's weights while the member's own differ from them (an overlapped window after
    /// the mean came), with the steps of the window already taken; `None` when the member's
    /// weights are the group's.
    pub fn global(&self) -> Option<(&[f32], u32)> {
        self.rebased.as_ref().map(|r| (&r.global[..], r.steps))
    }

    /// The group's weights, given the member's own: [`Strategy::global`]'s, or `own`.
    pub fn group_weights<'a>(&'a self, own: &'a [f32]) -> &'a [f32] {
        self.global().map_or(own, |(global, _)| global)
    }

    /// The member's contribution to the next sync: `every-step`, the gradient of one batch;
    /// `outer:H`, the global weights minus the weights after `H` local steps (fewer when some
    /// ran ahead of the last mean). With `int8`, the residual is added and the sum packed.
    /// Until [`Strategy::finish`], the weights are local (`outer:H`). A failed inner step puts
    /// the weights and the step count back to the window's start.
    pub fn contribute(&mut self, member: &mut dyn Member) -> Result<Contribution, ContributeError> {
        let (loss, mut x, global, weight) = match self.config.mode {
            SyncMode::EveryStep => {
                let (loss, grad) = member.gradient()?;
                (loss, grad, None, 1)
            }
            SyncMode::Outer { inner_steps } => {
                let (global, taken, mut losses) = match self.rebased.take() {
                    Some(Rebased { global, steps, losses }) => (global, steps, losses),
                    None => (member.weights().clone(), 0, 0f32),
                };
                let mut done = taken;
                while done < inner_steps {
                    match member.step_alone() {
                        Ok(loss) => losses += loss,
                        Err(e) => {
                            member.rewind(done);
                            *member.weights() = global;
                            return Err(e.into());
                        }
                    }
                    done += 1;
                    if self.config.elastic && done < inner_steps && member.hurried(done) {
                        member.skip(inner_steps - done);
                        break;
                    }
                }
                let delta: Vec<f32> = global.iter().zip(member.weights().iter()).map(|(g, w)| g - w).collect();
                let weight = if self.config.elastic { done } else { 1 };
                (losses / done as f32, delta, Some(global), weight)
            }
        };
        let (values, packed) = match self.config.compression {
            Compression::None => (Values::F32(x), None),
            compression @ (Compression::Int8 | Compression::Int4) => {
                for (v, r) in x.iter_mut().zip(&self.state.residual) {
                    *v += r;
                }
                let packed = if compression == Compression::Int8 { pack(&x) } else { pack4(&x) };
                let packed = packed.map_err(ContributeError::NonFinite)?;
                let values = if compression == Compression::Int8 { Values::Int8 } else { Values::Int4 };
                (values(packed.clone()), Some((x, packed)))
            }
        };
        self.in_flight = Some(InFlight { global, packed });
        Ok(Contribution { loss, values, weight })
    }

    /// `outer:H` with an overlap, between [`Strategy::contribute`] and [`Strategy::finish`]:
    /// the next window's first [`SyncConfig::overlap`] steps, from the member's own weights (a
    /// member runs this while the group sums what it sent). Nothing to do in other modes, and
    /// after the run's last window. A failed step puts the weights and step count back.
    pub fn run_ahead(&mut self, member: &mut dyn Member) -> Result<(), ComputeError> {
        let steps = self.config.overlap.min(member.steps_left());
        if steps == 0 || !matches!(self.config.mode, SyncMode::Outer { .. }) || self.ahead.is_some() {
            return Ok(());
        }
        let anchor = member.weights().clone();
        let mut losses = 0f32;
        for done in 0..steps {
            match member.step_alone() {
                Ok(loss) => losses += loss,
                Err(e) => {
                    member.rewind(done);
                    *member.weights() = anchor;
                    return Err(e);
                }
            }
        }
        self.ahead = Some(Ahead { anchor, steps, losses });
        Ok(())
    }

    /// Ends a sync with the group's mean (`grid`: the group's block grid, `int8` only):
    /// `every-step` takes one optimizer step with it; `outer:H` takes one outer step on the
    /// global weights, and the member's weights become them (plus the progress of the steps it
    /// ran ahead, if it did). A member that made no contribution this sync (a fresh joiner)
    /// only needs the mean, never the grid. `ours`: whether our contribution is among those the
    /// mean sums — a member the group went on without (late for the step's record) keeps all
    /// of its packed contribution as residual, for the next. In `outer:H`, a sync this member
    /// computed nothing for (it caught up on the group's records, or the mean came before its
    /// compute began) passes over its `H` steps as if taken ([`Member::skip`]): the step count
    /// says how many syncs the weights hold, so a compute for this sync begun after it is refused
    /// as stale — never run on the new weights as if they were the old. (With an overlap, the
    /// steps it ran ahead into that sync's window are dropped first: the group's weights are
    /// the base, as they are for every member.)
    pub fn finish(
        &mut self,
        member: &mut dyn Member,
        mean: &[f32],
        grid: &[u8],
        ours: bool,
    ) -> Result<(), ComputeError> {
        let in_flight = self.in_flight.take().unwrap_or_default();
        if let Some((x, packed)) = &in_flight.packed {
            self.state.residual = if ours { residual(x, packed, grid) } else { x.clone() };
        }
        match self.config.mode {
            SyncMode::EveryStep => member.apply(mean)?,
            SyncMode::Outer { .. } => match (in_flight.global, self.ahead.take()) {
                (Some(mut global), Some(Ahead { anchor, steps, losses })) => {
                    self.config.outer.step(&mut global, &mut self.state.outer_momentum, mean);
                    for ((w, &g), &a) in member.weights().iter_mut().zip(&global).zip(&anchor) {
                        *w = g - (a - *w);
                    }
                    self.rebased = Some(Rebased { global, steps, losses });
                }
                (global, _) => {
                    let computed = global.is_some();
                    if !computed {
                        // With an overlap, the steps this member ran into the window it never
                        // contributed go: the group's weights are where the sync starts.
                        if let Some(Rebased { global: group, steps, .. }) = self.rebased.take() {
                            *member.weights() = group;
                            member.rewind(steps);
                        }
                    }
                    let weights = member.weights();
                    if let Some(global) = global {
                        *weights = global;
                    }
                    self.config.outer.step(weights, &mut self.state.outer_momentum, mean);
                    if !computed {
                        member.skip(self.config.mode.steps_per_sync());
                    }
                }
            },
        }
        Ok(())
    }

    /// A lone member's sync (a group of one: its contribution is the mean, bit for bit). In
    /// `every-step` without compression the mean of one gradient is that gradient (`g / 1` is
    /// `g`), so it is one local step, and the gradient need not leave the member's device.
    pub fn alone(&mut self, member: &mut dyn Member) -> Result<f32, ContributeError> {
        if self.config.mode == SyncMode::EveryStep && self.config.compression == Compression::None {
            return Ok(member.step_alone()?);
        }
        let Contribution { loss, values, .. } = self.contribute(member)?;
        self.run_ahead(member)?;
        let reduced = reduce_one(values);
        self.finish(member, &reduced.mean, &reduced.grid, true)?;
        Ok(loss)
    }
}

/// Other schedules of the same sum, for members that do not hold every contribution. Each
/// gives [`sum_direct`]'s integers (and so its mean) bit for bit, because every term is put on
/// the group's grid on its own before any addition.
pub mod schedules {
    use super::*;

    /// Where chunk `c` of `n` begins: block-aligned, as even as blocks allow.
    pub fn chunk_start(len: usize, n: usize, c: usize) -> usize {
        let blocks = len.div_ceil(BLOCK);
        ((blocks * c / n) * BLOCK).min(len)
    }

    /// Reduce-scatter, then all-gather: member `c` owns chunk `c`, receives that chunk of every
    /// contribution (with its block bytes), computes the chunk's grid and sum, and sends both to
    /// everyone. Here the owners run one after another; the result is the concatenation.
    pub fn sum_by_owners(contributions: &[&Packed]) -> (Vec<u8>, Vec<i32>) {
        let n = contributions.len();
        let len = contributions.first().map_or(0, |p| p.len());
        let mut grid = Vec::new();
        let mut sum = Vec::new();
        for owner in 0..n {
            let (start, end) = (chunk_start(len, n, owner), chunk_start(len, n, owner + 1));
            let blocks = start / BLOCK..end.div_ceil(BLOCK);
            let mut chunk_grid = vec![EMPTY_BLOCK; blocks.len()];
            for p in contributions {
                for (g, &e) in chunk_grid.iter_mut().zip(&p.exponents[blocks.clone()]) {
                    *g = (*g).max(e);
                }
            }
            // `on_grid` indexes the grid by absolute block: lay the chunk's grid there.
            let mut full = vec![EMPTY_BLOCK; len.div_ceil(BLOCK)];
            full[blocks.clone()].copy_from_slice(&chunk_grid);
            let mut chunk_sum = vec![0i32; end - start];
            // Arrival order at an owner is anything: take them last to first.
            for p in contributions.iter().rev() {
                on_grid(p, &full, start..end, &mut chunk_sum);
            }
            grid.extend(chunk_grid);
            sum.extend(chunk_sum);
        }
        (grid, sum)
    }

    /// A ring: the grid first (a max passed round the ring: associative), then a partial sum
    /// passed from member to member starting at `first`, each adding its own terms.
    pub fn sum_ring(contributions: &[&Packed], first: usize) -> (Vec<u8>, Vec<i32>) {
        // Passing a partial sum round the ring adds the same terms in the ring's order.
        let n = contributions.len();
        let order: Vec<&Packed> = (0..n).map(|i| contributions[(first + i) % n]).collect();
        sum_direct(&order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The int8 bound is the f32 one on the values the packing stands for: 64 · 2^26 = 2^32
    /// passes, 64 · 2^27 does not; an f32 contribution of exactly 2^32 passes.
    #[test]
    fn contributions_past_the_bound_are_found_in_either_encoding() {
        let mut p = pack(&[1.0; 40]).unwrap();
        assert_eq!(p.q[BLOCK], 64, "1.0 packs as 64 · 2^-6");
        p.exponents[1] = (26 + EXPONENT_BIAS) as u8;
        assert_eq!(Values::Int8(p.clone()).check_bounds(), Ok(()));
        p.exponents[1] = (27 + EXPONENT_BIAS) as u8;
        let e = Values::Int8(p).check_bounds().unwrap_err();
        assert_eq!(e.index, BLOCK);
        assert_eq!(e.value, 2.0 * CONTRIBUTION_BOUND, "{e}");
        assert_eq!(Values::F32(vec![CONTRIBUTION_BOUND, -CONTRIBUTION_BOUND]).check_bounds(), Ok(()));
        let e = Values::F32(vec![0.0, f32::NAN]).check_bounds().unwrap_err();
        assert_eq!(e.index, 1);
        assert!(e.to_string().contains("not finite"), "{e}");
    }
    use lockstep_luts::rng::SplitMix64;

    /// Values over a wide range of magnitudes, with zero and subnormal blocks, so grids differ
    /// between members block by block.
    fn contribution(seed: u64, len: usize) -> Vec<f32> {
        let mut rng = SplitMix64::new(seed);
        (0..len)
            .map(|i| {
                let block = i / BLOCK;
                match block % 7 {
                    5 => 0.0,
                    6 => f32::from_bits(1 + (rng.next_u64() % 1000) as u32), // subnormal
                    _ => {
                        let magnitude = 2f32.powi((block % 5) as i32 * 3 - 8 + (seed % 3) as i32);
                        ((rng.next_u64() % 2001) as f32 / 1000.0 - 1.0) * magnitude
                    }
                }
            })
            .collect()
    }

    #[test]
    fn modes_and_compressions_read_what_they_print() {
        for mode in [SyncMode::EveryStep, SyncMode::Outer { inner_steps: 32 }] {
            assert_eq!(mode.to_string().parse::<SyncMode>(), Ok(mode));
        }
        for c in [Compression::None, Compression::Int8, Compression::Int4] {
            assert_eq!(c.to_string().parse::<Compression>(), Ok(c));
        }
        assert!("outer:0".parse::<SyncMode>().is_err());
        assert!("outer".parse::<SyncMode>().is_err());
        assert!("fp16".parse::<Compression>().is_err());
    }

    #[test]
    fn pack_is_the_units_quantizer_with_empty_blocks_marked() {
        let x = [1.0f32, -0.5, 0.25, 127.0];
        let p = pack(&x).unwrap();
        // amax 127 → e = 0: the values are their own quants, rounded half to even.
        assert_eq!(p.exponents, vec![EXPONENT_BIAS as u8]);
        assert_eq!(p.q, vec![1, 0, 0, 127]);
        let zeros = pack(&[0.0, -0.0, f32::from_bits(5)]).unwrap();
        assert_eq!(zeros.exponents, vec![EMPTY_BLOCK]);
        assert_eq!(zeros.q, vec![0, 0, 0]);
        assert_eq!(pack(&[1.0, f32::NAN]), Err(NonFinite { index: 1 }));
        assert!(p.validate(127).is_ok());
        let bad = Packed { exponents: vec![EMPTY_BLOCK], q: vec![3] };
        assert_eq!(bad.validate(127), Err(SyncError::EmptyBlockNotEmpty { block: 0 }));
        assert!(Packed { exponents: vec![1], q: vec![i8::MIN] }.validate(127).is_err());
        assert_eq!(
            Packed { exponents: vec![1], q: vec![7, -8] }.validate(INT4_LIMIT),
            Err(SyncError::QuantRange { index: 1, quant: -8 })
        );
    }

    #[test]
    fn every_schedule_gives_the_same_bits() {
        let len = 7 * BLOCK * 5 + 13; // a short last block, chunks of unequal size
        let xs: Vec<Vec<f32>> = (0..5).map(|s| contribution(s, len)).collect();
        let packed: Vec<Packed> = xs.iter().map(|x| pack(x).unwrap()).collect();
        let refs: Vec<&Packed> = packed.iter().collect();
        let direct = sum_direct(&refs);
        assert_eq!(schedules::sum_by_owners(&refs), direct);
        for first in 0..5 {
            assert_eq!(schedules::sum_ring(&refs, first), direct);
        }
        let mut reversed = refs.clone();
        reversed.reverse();
        assert_eq!(sum_direct(&reversed), direct);
        let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(mean(&direct.1, &direct.0, 5)), bits(mean(&sum_direct(&reversed).1, &direct.0, 5)));
        // The grids really differ between members (otherwise the test would prove little).
        assert!(packed.iter().any(|p| p.exponents != direct.0));
        // Whereas f32 addition in another order is another result on these very values.
        let f32_sum = |order: &[usize]| -> Vec<u32> {
            (0..len).map(|k| order.iter().fold(0f32, |s, &i| s + xs[i][k]).to_bits()).collect()
        };
        assert_ne!(f32_sum(&[0, 1, 2, 3, 4]), f32_sum(&[4, 3, 2, 1, 0]));
    }

    #[test]
    fn terms_round_to_the_grid_half_to_even_and_the_mean_is_exact_where_it_can_be() {
        // Block A has e = 0 (amax 127); block B's quants sit 2 exponents below.
        let a = Packed { exponents: vec![EXPONENT_BIAS as u8], q: vec![127, 2, -6, 1] };
        let b = Packed { exponents: vec![(EXPONENT_BIAS - 2) as u8], q: vec![6, 10, 2, -2] };
        let (grid, sum) = sum_direct(&[&a, &b]);
        assert_eq!(grid, vec![EXPONENT_BIAS as u8]);
        // 6/4 = 1.5 → 2; 10/4 = 2.5 → 2; 2/4 = 0.5 → 0; -2/4 = -0.5 → -0.
        assert_eq!(sum, vec![129, 4, -6, 1]);
        assert_eq!(mean(&sum, &grid, 2), vec![64.5, 2.0, -3.0, 0.5]);
        // What the group did not take of b stays with b.
        let x = [1.5f32, 2.5, 0.5, -0.5];
        assert_eq!(residual(&x, &b, &grid), vec![-0.5, 0.5, 0.5, -0.5]);
    }

    #[test]
    fn error_feedback_carries_what_a_small_member_loses() {
        // A member whose values sit far below the others' grid contributes nothing at once, but
        // its residual grows until the group takes it: over many syncs the sum of what was taken
        // tracks the sum of what was offered.
        let taken_total = taken_from_a_small_member(pack);
        assert!((taken_total - 300.0).abs() <= 1.0, "{taken_total}");
    }

    /// Over 1000 syncs with a member of 100s, what the group took of a member offering 0.3 a
    /// sync (its first value), each packed by `pack` with error feedback.
    fn taken_from_a_small_member(pack: fn(&[f32]) -> Result<Packed, NonFinite>) -> f64 {
        let (big, small) = ([100.0f32; BLOCK], [0.3f32; BLOCK]);
        let q_big = pack(&big).unwrap();
        let mut r = vec![0f32; BLOCK];
        let mut taken_total = 0f64;
        for _ in 0..1000 {
            let x: Vec<f32> = small.iter().zip(&r).map(|(a, b)| a + b).collect();
            let p = pack(&x).unwrap();
            let grid = group_grid([&q_big, &p]);
            let mut mine = vec![0i32; BLOCK];
            on_grid(&p, &grid, 0..BLOCK, &mut mine);
            taken_total += f64::from(mine[0]) * pow2(i32::from(grid[0]) - EXPONENT_BIAS);
            r = residual(&x, &p, &grid);
        }
        taken_total
    }

    /// int4 is int8's quants on a grid 16 times coarser, rounded half to even and clamped to
    /// `[-7, 7]`; every schedule sums it to the same bits; error feedback carries what it drops
    /// (a value of 0.3 in a block of 100s is taken in full over many syncs).
    #[test]
    fn int4_is_int8_on_a_coarser_grid_and_error_feedback_keeps_what_it_drops() {
        let len = 7 * BLOCK * 3 + 5;
        let x = contribution(2, len);
        let (p8, p4) = (pack(&x).unwrap(), pack4(&x).unwrap());
        p4.validate(INT4_LIMIT).expect("int4 quants");
        for (block, (&e8, &e4)) in p8.exponents.iter().zip(&p4.exponents).enumerate() {
            let end = ((block + 1) * BLOCK).min(len);
            if e8 == EMPTY_BLOCK {
                assert_eq!(e4, EMPTY_BLOCK);
                continue;
            }
            assert_eq!(e4, e8 + 4);
            for (&q8, &q4) in p8.q[block * BLOCK..end].iter().zip(&p4.q[block * BLOCK..end]) {
                // Written out: nearest multiple of 16, ties to the even multiple, then clamped.
                let (low, rem) = (i32::from(q8).div_euclid(16), i32::from(q8).rem_euclid(16));
                let nearest = if rem > 8 || (rem == 8 && low % 2 != 0) { low + 1 } else { low };
                assert_eq!(i32::from(q4), nearest.clamp(-7, 7), "q8 {q8}");
            }
        }
        let xs: Vec<Vec<f32>> = (0..4).map(|s| contribution(s, len)).collect();
        let packed: Vec<Packed> = xs.iter().map(|x| pack4(x).unwrap()).collect();
        let refs: Vec<&Packed> = packed.iter().collect();
        let direct = sum_direct(&refs);
        assert_eq!(schedules::sum_by_owners(&refs), direct);
        assert_eq!(schedules::sum_ring(&refs, 2), direct);
        let taken_total = taken_from_a_small_member(pack4);
        assert!((taken_total - 300.0).abs() <= 8.0, "{taken_total}");
    }

    /// A group of one reduced by value is the group reduced by reference, bit for bit.
    #[test]
    fn reduce_one_is_reduce_of_one() {
        let x = contribution(3, 5 * BLOCK + 7);
        for values in [Values::F32(x.clone()), Values::Int8(pack(&x).unwrap())] {
            let by_ref = reduce(&[&values], &[1]);
            let by_value = reduce_one(values);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&by_value.mean), bits(&by_ref.mean));
            assert_eq!(by_value.grid, by_ref.grid);
        }
    }

    #[test]
    fn the_outer_step_is_nesterov_in_f32() {
        let opt = OuterOptimizer { lr: 0.5, momentum: 0.5 };
        let mut w = vec![1.0f32, 2.0];
        let mut m = vec![0.0f32, 1.0];
        opt.step(&mut w, &mut m, &[0.5, -1.0]);
        // m = 0.5·0 + 0.5 = 0.5, w = 1 − 0.5·(0.5 + 0.25) = 0.625;
        // m = 0.5·1 − 1 = −0.5, w = 2 − 0.5·(−1 − 0.25) = 2.625.
        assert_eq!(m, vec![0.5, -0.5]);
        assert_eq!(w, vec![0.625, 2.625]);
    }

    /// A member whose step is plain arithmetic on its weights: cheap, deterministic, and
    /// different at every step (step `k` of weight `i`: `w·0.9375 + (k + i)/64`). Step
    /// `fail_at` fails instead.
    struct Toy {
        weights: Vec<f32>,
        step: u32,
        steps: u32,
        fail_at: Option<u32>,
        /// Elastic windows: each window ends after this many of its steps.
        hurry_after: Option<u32>,
    }

    impl Toy {
        fn new(steps: u32) -> Toy {
            Toy {
                weights: (0..40).map(|i| 0.25 + i as f32 / 8.0).collect(),
                step: 0,
                steps,
                fail_at: None,
                hurry_after: None,
            }
        }
    }

    /// What one toy step does to `w` at step `k` (the statement the test compares with).
    fn toy_step(w: &mut [f32], k: u32) {
        for (i, w) in w.iter_mut().enumerate() {
            *w = *w * 0.9375 + (k as usize + i) as f32 / 64.0;
        }
    }

    impl Member for Toy {
        fn gradient(&mut self) -> Result<(f32, Vec<f32>), ComputeError> {
            unreachable!("outer:H asks for steps, not gradients")
        }
        fn apply(&mut self, _grad: &[f32]) -> Result<(), ComputeError> {
            unreachable!("outer:H asks for steps, not updates")
        }
        fn step_alone(&mut self) -> Result<f32, ComputeError> {
            if self.fail_at == Some(self.step + 1) {
                return Err(ComputeError::backend(std::io::Error::other("the toy's step fails")));
            }
            self.step += 1;
            toy_step(&mut self.weights, self.step);
            Ok(self.step as f32)
        }
        fn weights(&mut self) -> &mut Vec<f32> {
            &mut self.weights
        }
        fn rewind(&mut self, steps: u32) {
            self.step -= steps;
        }
        fn steps_left(&self) -> u32 {
            self.steps - self.step
        }
        fn hurried(&self, done: u32) -> bool {
            self.hurry_after.is_some_and(|h| done >= h)
        }
        fn skip(&mut self, steps: u32) {
            self.step += steps;
        }
    }

    fn outer(h: u32, overlap: u32) -> SyncConfig {
        let outer = OuterOptimizer { lr: 0.75, momentum: 0.5 };
        SyncConfig {
            mode: SyncMode::Outer { inner_steps: h },
            compression: Compression::None,
            outer,
            overlap,
            elastic: false,
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// `outer:4` with an overlap of 2, a group of one for three windows, against the
    /// arithmetic `Strategy`'s docs state, written out here: the first window is 4 steps from
    /// the start; each later one is 2 steps run ahead from where the last ended, then moved
    /// onto the new global weights (`G − (L − W)`), then 2 more; its contribution is `G` minus
    /// where it ends. The last window runs nothing ahead.
    #[test]
    fn an_overlapped_window_moves_its_early_steps_onto_the_groups_weights() {
        let config = outer(4, 2);
        let mut strategy = Strategy::new(config, SyncState::new(&config, 40));
        let mut toy = Toy::new(12);
        let mut global = toy.weights.clone();
        let mut momentum = vec![0f32; 40];
        let mut local = global.clone();
        let mut k = 0;
        for window in 0..3 {
            let begin = k;
            while k < begin + 4 - if window == 0 { 0 } else { 2 } {
                k += 1;
                toy_step(&mut local, k);
            }
            let delta: Vec<f32> = global.iter().zip(&local).map(|(g, l)| g - l).collect();
            let contribution = strategy.contribute(&mut toy).unwrap();
            assert_eq!(contribution.values, Values::F32(delta.clone()), "window {window}");
            // The mean of a group of one is its contribution (`x / 1` is `x`).
            strategy.run_ahead(&mut toy).unwrap();
            strategy.finish(&mut toy, &delta, &[], true).unwrap();
            for ((w, m), d) in global.iter_mut().zip(&mut momentum).zip(&delta) {
                *m = 0.5 * *m + d;
                *w -= 0.75 * (d + 0.5 * *m);
            }
            if window < 2 {
                let anchor = local.clone();
                for _ in 0..2 {
                    k += 1;
                    toy_step(&mut local, k);
                }
                for ((l, g), a) in local.iter_mut().zip(&global).zip(&anchor) {
                    *l = g - (a - *l);
                }
                let (held, ahead) = strategy.global().expect("the group's weights, kept apart");
                assert_eq!((bits(held), ahead), (bits(&global), 2));
            } else {
                local = global.clone();
                assert!(strategy.global().is_none(), "the run's last window runs nothing ahead");
            }
            assert_eq!(bits(&toy.weights), bits(&local), "window {window}");
            assert_eq!(toy.step, k);
        }
        assert_eq!(toy.step, 12);
    }

    /// Elastic windows (`outer:4`): a member hurried after 2 of its steps contributes `G` minus
    /// where those 2 steps ended, weighs 2, and passes over the window's other 2 steps (its step
    /// count is the window's end, its weights stay where the 2 steps left them); a member that
    /// is never hurried runs all 4 and weighs 4. The loss is the mean of the steps taken.
    #[test]
    fn an_elastic_window_ends_when_hurried_and_weighs_its_steps() {
        let config = SyncConfig { elastic: true, compression: Compression::Int8, ..outer(4, 0) };
        let mut toy = Toy { hurry_after: Some(2), ..Toy::new(8) };
        let mut strategy = Strategy::new(config, SyncState::new(&config, 40));
        let global = toy.weights.clone();
        let mut local = global.clone();
        toy_step(&mut local, 1);
        toy_step(&mut local, 2);
        let delta: Vec<f32> = global.iter().zip(&local).map(|(g, l)| g - l).collect();
        let contribution = strategy.contribute(&mut toy).unwrap();
        assert_eq!(contribution.weight, 2);
        assert_eq!(contribution.values, Values::Int8(pack(&delta).unwrap()), "the residual starts at 0");
        assert_eq!(contribution.loss, (1.0 + 2.0) / 2.0);
        assert_eq!((toy.step, bits(&toy.weights)), (4, bits(&local)));
        // Not hurried: the whole window.
        let mut whole = Toy::new(8);
        let mut strategy = Strategy::new(config, SyncState::new(&config, 40));
        let contribution = strategy.contribute(&mut whole).unwrap();
        assert_eq!((contribution.weight, whole.step), (4, 4));
        // Hurried from the start: one step is the least a window takes.
        let mut eager = Toy { hurry_after: Some(0), ..Toy::new(8) };
        let contribution = Strategy::new(config, SyncState::new(&config, 40)).contribute(&mut eager).unwrap();
        assert_eq!((contribution.weight, eager.step), (1, 4));
        // Without elastic windows a hurry is never asked about: every contribution weighs 1.
        let plain = SyncConfig { elastic: false, ..config };
        let mut toy = Toy { hurry_after: Some(2), ..Toy::new(8) };
        let contribution = Strategy::new(plain, SyncState::new(&plain, 40)).contribute(&mut toy).unwrap();
        assert_eq!((contribution.weight, toy.step), (1, 4));
    }

    /// The weighted mean, written out on values the int8 grid holds exactly: weights 1 and 3
    /// give `(1·a + 3·b) / 4`; weights 2 and 6 are the same weights (lowest terms); equal
    /// weights give the plain mean's bits, f32 ones too.
    #[test]
    fn contributions_are_weighed_by_their_steps() {
        let a = Values::Int8(pack(&[1.0, 2.0, 0.0, -4.0]).unwrap());
        let b = Values::Int8(pack(&[3.0, -1.0, 0.5, 4.0]).unwrap());
        let weighted = reduce(&[&a, &b], &[1, 3]);
        assert_eq!(weighted.mean, [2.5, -0.25, 0.375, 2.0]);
        assert_eq!(reduce(&[&a, &b], &[2, 6]), weighted);
        assert_eq!(lowest_terms(&[2, 6, 4]), [1, 3, 2]);
        assert_eq!(lowest_terms(&[5, 5]), [1, 1]);
        let plain = reduce(&[&a, &b], &[1, 1]);
        assert_eq!(reduce(&[&a, &b], &[7, 7]), plain);
        assert_eq!(plain.mean, [2.0, 0.5, 0.25, 0.0]);
        let (fa, fb) = (Values::F32(vec![1.0, 2.0]), Values::F32(vec![3.0, -1.0]));
        assert_eq!(reduce(&[&fa, &fb], &[4, 4]).mean, [2.0, 0.5]);
    }

    /// f32 contributions are never weighed: a run refuses elastic windows with them, and
    /// `reduce` refuses unequal weights on them rather than define a mean nothing uses.
    #[test]
    #[should_panic(expected = "f32 contributions are never weighed")]
    fn f32_contributions_of_unequal_weights_are_a_bug() {
        let (fa, fb) = (Values::F32(vec![1.0, 2.0]), Values::F32(vec![3.0, -1.0]));
        reduce(&[&fa, &fb], &[1, 3]);
    }

    /// One sync of a group of one, step by step: contribute, (run ahead,) finish with the
    /// contribution as the mean.
    fn sync_by_hand(strategy: &mut Strategy, toy: &mut Toy, run_ahead: bool) {
        let Contribution { values, .. } = strategy.contribute(toy).unwrap();
        if run_ahead {
            strategy.run_ahead(toy).unwrap();
        }
        let mean = reduce_one(values).mean;
        strategy.finish(toy, &mean, &[], true).unwrap();
    }

    /// With no overlap, running ahead does nothing: the windows are plain `outer:H`'s (never
    /// run ahead), bit for bit; `alone` with an overlap is `contribute`, `run_ahead`, `finish`.
    #[test]
    fn no_overlap_is_plain_outer_and_alone_runs_ahead_too() {
        let (plain, ahead) = (outer(4, 0), outer(4, 3));
        let strategy = |config: SyncConfig| (Strategy::new(config, SyncState::new(&config, 40)), Toy::new(12));
        let (mut never, mut toy_never) = strategy(plain);
        let (mut a, mut toy_a) = strategy(plain);
        let (mut b, mut toy_b) = strategy(ahead);
        let (mut c, mut toy_c) = strategy(ahead);
        for _ in 0..3 {
            sync_by_hand(&mut never, &mut toy_never, false);
            sync_by_hand(&mut a, &mut toy_a, true);
            b.alone(&mut toy_b).unwrap();
            sync_by_hand(&mut c, &mut toy_c, true);
        }
        assert_eq!(bits(&toy_a.weights), bits(&toy_never.weights));
        assert_eq!((toy_a.step, toy_never.step), (12, 12));
        assert_eq!(bits(&toy_b.weights), bits(&toy_c.weights));
        // Three windows of the same toy: the overlap changed the arithmetic.
        assert_ne!(bits(&toy_a.weights), bits(&toy_b.weights));
    }

    /// A step that fails while running ahead puts the member back where it contributed from;
    /// one that fails after the mean puts it back to the group's weights and the sync's step.
    #[test]
    fn a_failed_step_ahead_or_after_the_mean_rewinds_to_the_sync() {
        let config = outer(4, 2);
        let mut strategy = Strategy::new(config, SyncState::new(&config, 40));
        let mut toy = Toy::new(12);
        let Contribution { values, .. } = strategy.contribute(&mut toy).unwrap();
        let ended = toy.weights.clone();
        toy.fail_at = Some(6);
        assert!(strategy.run_ahead(&mut toy).is_err());
        assert_eq!((toy.step, bits(&toy.weights)), (4, bits(&ended)));
        toy.fail_at = None;
        strategy.run_ahead(&mut toy).unwrap();
        strategy.finish(&mut toy, &reduce_one(values).mean, &[], true).unwrap();
        let group = strategy.global().unwrap().0.to_vec();
        toy.fail_at = Some(7);
        assert!(strategy.contribute(&mut toy).is_err());
        assert_eq!((toy.step, bits(&toy.weights)), (4, bits(&group)));
    }
}
