//! The group sum: int8 and int4 packing, the grid every contribution is put on, the exact
//! integer sum and its mean, error feedback's residual, and `reduce` over any compression.

use super::*;

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

    /// Value `i` as the contribution stands for it, `q · 2^e` (exact in f32: `|q| < 2^7`, `e`
    /// within f32's range); 0 in an empty block.
    pub fn value(&self, i: usize) -> f32 {
        match self.exponents[i / BLOCK] {
            EMPTY_BLOCK => 0.0,
            e => (f64::from(self.q[i]) * pow2(i32::from(e) - EXPONENT_BIAS)) as f32,
        }
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

/// `topk:K`'s packing ([`Compression::TopK`]): in each chunk of [`TOPK_CHUNK`] values of `x`
/// (the last may be shorter), the `k` of largest magnitude — ties to the lower index, so every
/// member and every auditor picks the same from the same values — packed as [`pack`] packs
/// them, every other value 0 (a block none of whose values was picked is empty). What was not
/// picked, and what packing rounded off, stays with the member (its residual, [`residual`]).
pub fn pack_topk(x: &[f32], k: usize) -> Result<Packed, NonFinite> {
    if let Some(index) = x.iter().position(|v| !v.is_finite()) {
        return Err(NonFinite { index });
    }
    let mut picked = vec![0f32; x.len()];
    let mut order: Vec<usize> = Vec::with_capacity(TOPK_CHUNK);
    for (c, chunk) in x.chunks(TOPK_CHUNK).enumerate() {
        let at = c * TOPK_CHUNK;
        if chunk.len() <= k {
            picked[at..at + chunk.len()].copy_from_slice(chunk);
            continue;
        }
        order.clear();
        order.extend(0..chunk.len());
        // A total order: larger magnitudes first (a finite f32's bits without its sign order
        // as its magnitude does), then the lower index.
        order.select_nth_unstable_by_key(k - 1, |&i| (std::cmp::Reverse(chunk[i].to_bits() & 0x7fff_ffff), i));
        for &i in &order[..k] {
            picked[at + i] = chunk[i];
        }
    }
    pack(&picked)
}

/// `x` packed as `compression` packs a contribution: `int4` in 4-bit quants, `topk:K` its
/// picks ([`pack_topk`]), `int8` (and `none`, whose contributions are never packed) in int8
/// blocks. [`Values::packed_as`] names the blocks as the contribution carries them.
pub fn pack_as(x: &[f32], compression: Compression) -> Result<Packed, NonFinite> {
    match compression {
        Compression::Int4 => pack4(x),
        Compression::TopK(k) => pack_topk(x, usize::from(k)),
        Compression::None | Compression::Int8 => pack(x),
    }
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

/// Whether `p` can be put on `grid`: a byte per block, and no block's exponent above the grid's
/// (true of every contribution on the grid of a sum it is part of; an audit's recomputation of
/// a wrong contribution may not be).
pub fn fits(p: &Packed, grid: &[u8]) -> bool {
    p.exponents.len() == grid.len() && p.exponents.iter().zip(grid).all(|(&e, &g)| e == EMPTY_BLOCK || e <= g)
}

/// Adds `p`'s values `range` (block-aligned start) to `sum`, each put on `grid` — the grid of
/// the range's blocks, its first byte the block `range` starts in — on its own:
/// `round_half_even(q · 2^(e − E))` for a block of exponent `e` on a grid of exponent `E`.
pub fn on_grid(p: &Packed, grid: &[u8], range: std::ops::Range<usize>, sum: &mut [i32]) {
    debug_assert!(range.start.is_multiple_of(BLOCK) && sum.len() == range.len());
    for (offset, chunk) in p.q[range.clone()].chunks(BLOCK).enumerate() {
        let e = p.exponents[range.start / BLOCK + offset];
        if e == EMPTY_BLOCK {
            continue;
        }
        let shift = u32::from(grid[offset] - e);
        let out = &mut sum[offset * BLOCK..offset * BLOCK + chunk.len()];
        for (s, &q) in out.iter_mut().zip(chunk) {
            *s += shift_round_half_even(q, shift);
        }
    }
}

/// `2^e` as an f64, built on the bits (`e` in the normal range).
pub(super) fn pow2(e: i32) -> f64 {
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
pub(super) fn lowest_terms(weights: &[u32]) -> Vec<u32> {
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

    /// A packed contribution of `compression`'s blocks ([`pack_as`]): int4's as int4, every
    /// other's as int8 (`topk:K` travels as int8 blocks).
    pub fn packed_as(compression: Compression, packed: Packed) -> Values {
        match compression.values_as() {
            Compression::Int4 => Values::Int4(packed),
            _ => Values::Int8(packed),
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
                for (block, &b) in p.exponents.iter().enumerate() {
                    let quants = &p.q[(block * BLOCK).min(p.q.len())..((block + 1) * BLOCK).min(p.q.len())];
                    if let Some((i, value)) = block_past_bound(b, quants) {
                        return Err(OutOfBounds { index: block * BLOCK + i, value });
                    }
                }
                Ok(())
            }
        }
    }
}

/// The first value of a packed block (exponent byte `b`, its `quants`) past
/// [`CONTRIBUTION_BOUND`], where one is: its place in the block and its value.
pub fn block_past_bound(b: u8, quants: &[i8]) -> Option<(usize, f32)> {
    // A value is q · 2^(b − 133); only blocks with b − 133 > 25 can pass 2^32
    // (127 · 2^25 < 2^32), and there the largest quant decides.
    let e = i32::from(b) - EXPONENT_BIAS;
    if b == EMPTY_BLOCK || e <= 25 {
        return None;
    }
    // The first of the largest (`max_by_key` keeps the last, so walk backwards).
    let (i, &q) = quants.iter().enumerate().rev().max_by_key(|(_, q)| q.unsigned_abs())?;
    let value = f64::from(q) * 2f64.powi(e);
    (value.abs() > f64::from(CONTRIBUTION_BOUND)).then_some((i, value as f32))
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
