//! The reference units: scalar, table-driven, and obviously correct.
//!
//! A unit call is `C = A · Bᵀ` with `A` an `m × k` and `B` an `n × k` row-major f32 matrix, so
//! both operands are quantized along `k`. The steps, specified bit for bit in
//! `docs/VERIFICATION.md`:
//!
//! 1. **Check**: any NaN or ±Inf input is an error (`UnitError::NonFinite`), before quantizing.
//! 2. **Quantize** each row in blocks of [`BLOCK`] along `k` (the last block may be short): the
//!    block's scale is a power of two `2^e`, the smallest with `max|x| ≤ 127 · 2^e`; each value
//!    becomes `q = round_half_even(x / 2^e)` in `[-127, 127]`. Zeros and subnormals quantize
//!    to 0; a block with no normal value has `e = 0` and all-zero quants.
//! 3. **Product and accumulate**: per output and block, `acc = Σ q_a · q_b` in `i32`, products
//!    from the exact table. `|acc| ≤ 32 · 127² < 2^24`, so it converts to f32 exactly.
//! 4. **Epilogue**: each block's term is `acc · 2^(e_a + e_b)`, built on the bits (exact; below
//!    the normal range it is +0, above it ±Inf). Terms are summed in block order, each partial
//!    sum rounded to nearest-even f32, and any partial sum of magnitude below `2^-126` becomes
//!    +0. A NaN result (only `Inf - Inf` makes one) is the canonical `0x7fc00000`.
//!
//! Power-of-two scales make every term exact, so only the ordered additions round: FMA
//! contraction cannot change a bit, and there is nothing to reassociate.

use crate::table::lut_mul;

/// Block length along `k`.
pub const BLOCK: usize = 32;
/// Largest quantized magnitude; -128 is never produced.
pub const QMAX: i32 = 127;
/// Scale exponent of a block with no normal value.
pub const ZERO_BLOCK_EXP: i32 = 0;
/// Bits of the canonical NaN an epilogue returns.
pub const CANONICAL_NAN_BITS: u32 = 0x7fc0_0000;

const EXP_MASK: u32 = 0x7f80_0000;
const MANTISSA_MASK: u32 = 0x007f_ffff;
const IMPLICIT_ONE: u32 = 0x0080_0000;

/// Which operand of `A · Bᵀ` an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    A,
    B,
}

/// Why a unit call refused its input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnitError {
    /// A NaN or ±Inf input at flat `index` of `operand`.
    NonFinite { operand: Operand, index: usize, bits: u32 },
    /// A buffer length does not match the shape.
    Shape { operand: Operand, expected: usize, actual: usize },
}

impl std::fmt::Display for UnitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnitError::NonFinite { operand, index, bits } => write!(
                f,
                "non-finite input in {operand:?} at index {index} (bits {bits:#010x}); the units accept finite values only"
            ),
            UnitError::Shape { operand, expected, actual } => write!(
                f,
                "operand {operand:?} has {actual} elements, the shape needs {expected}"
            ),
        }
    }
}

impl std::error::Error for UnitError {}

/// Number of blocks a row of length `k` is split into.
pub fn blocks_for(k: usize) -> usize {
    k.div_ceil(BLOCK)
}

/// True for a finite f32 bit pattern.
pub fn is_finite_bits(bits: u32) -> bool {
    bits & EXP_MASK != EXP_MASK
}

/// The index of the first non-finite value, if any.
pub fn first_non_finite(values: &[f32]) -> Option<usize> {
    values.iter().position(|v| !is_finite_bits(v.to_bits()))
}

/// The block exponent `e` for a block whose largest magnitude has bits `amax_bits` (sign
/// cleared): the smallest `e` with `amax ≤ 127 · 2^e`. Blocks without a normal value get
/// [`ZERO_BLOCK_EXP`].
pub fn block_exponent(amax_bits: u32) -> i32 {
    let biased = (amax_bits >> 23) as i32;
    if biased == 0 {
        return ZERO_BLOCK_EXP; // zero or subnormal: the block quantizes to zeros
    }
    // amax = m · 2^(biased - 150) with m in [2^23, 2^24); with e = biased - 133,
    // amax / 2^e = m / 2^17 lies in [64, 128).
    let mantissa = (amax_bits & MANTISSA_MASK) | IMPLICIT_ONE;
    let e = biased - 133;
    if mantissa > (QMAX as u32) << 17 {
        e + 1
    } else {
        e
    }
}

/// Quantizes one finite value (bits) at block exponent `e`: `round_half_even(x / 2^e)`, with
/// zeros and subnormals giving 0. Integer arithmetic on the bits only.
pub fn quantize_value(bits: u32, e: i32) -> i8 {
    let biased = ((bits >> 23) & 0xff) as i32;
    if biased == 0 {
        return 0;
    }
    let mantissa = (bits & MANTISSA_MASK) | IMPLICIT_ONE;
    // |x| / 2^e = mantissa · 2^(biased - 150 - e) = mantissa >> shift.
    let shift = 150 + e - biased;
    debug_assert!(shift >= 17, "value above its block's maximum");
    let magnitude = if shift > 24 {
        0 // mantissa < 2^24 ≤ 2^(shift-1): below one half
    } else {
        let truncated = mantissa >> shift;
        let remainder = mantissa & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        if remainder > half || (remainder == half && truncated & 1 == 1) {
            truncated + 1
        } else {
            truncated
        }
    } as i32;
    debug_assert!(magnitude <= QMAX);
    let signed = if bits >> 31 == 1 { -magnitude } else { magnitude };
    signed as i8
}

/// One matrix quantized by rows: `rows × blocks` blocks of [`BLOCK`] quants (the tail of a
/// short last block is zero) and one exponent per block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizedRows {
    pub rows: usize,
    pub k: usize,
    pub blocks: usize,
    /// `rows × blocks × BLOCK` quants.
    pub q: Vec<i8>,
    /// `rows × blocks` block exponents.
    pub exp: Vec<i32>,
}

impl QuantizedRows {
    pub fn block(&self, row: usize, block: usize) -> &[i8] {
        let start = (row * self.blocks + block) * BLOCK;
        &self.q[start..start + BLOCK]
    }

    pub fn exponent(&self, row: usize, block: usize) -> i32 {
        self.exp[row * self.blocks + block]
    }
}

/// Quantizes a `rows × k` row-major matrix (which must be finite) along `k`.
pub fn quantize_rows(values: &[f32], rows: usize, k: usize, operand: Operand) -> Result<QuantizedRows, UnitError> {
    check_operand(values, rows * k, operand)?;
    let blocks = blocks_for(k);
    let mut q = vec![0i8; rows * blocks * BLOCK];
    let mut exp = vec![ZERO_BLOCK_EXP; rows * blocks];
    for row in 0..rows {
        for block in 0..blocks {
            let start = row * k + block * BLOCK;
            let end = (start + BLOCK).min(row * k + k);
            let chunk = &values[start..end];
            let amax_bits = chunk.iter().map(|v| v.to_bits() & !0x8000_0000).max().unwrap_or(0);
            let e = block_exponent(amax_bits);
            exp[row * blocks + block] = e;
            let out = &mut q[(row * blocks + block) * BLOCK..];
            for (slot, value) in out.iter_mut().zip(chunk) {
                *slot = quantize_value(value.to_bits(), e);
            }
        }
    }
    Ok(QuantizedRows { rows, k, blocks, q, exp })
}

fn check_operand(values: &[f32], expected: usize, operand: Operand) -> Result<(), UnitError> {
    if values.len() != expected {
        return Err(UnitError::Shape { operand, expected, actual: values.len() });
    }
    if let Some(index) = first_non_finite(values) {
        return Err(UnitError::NonFinite { operand, index, bits: values[index].to_bits() });
    }
    Ok(())
}

/// The exact block dot product through the table.
pub fn dot_block(a: &[i8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| lut_mul(x, y)).sum()
}

/// A block's term `acc · 2^scale_exp`, built on the bits: exact, +0 below the normal range,
/// ±Inf above it. `acc` must satisfy `|acc| < 2^24` (always true for one block).
pub fn block_term(acc: i32, scale_exp: i32) -> f32 {
    if acc == 0 {
        return 0.0;
    }
    debug_assert!(acc.unsigned_abs() < 1 << 24);
    let bits = (acc as f32).to_bits(); // exact: |acc| < 2^24
    let biased = ((bits >> 23) & 0xff) as i32 + scale_exp;
    if biased <= 0 {
        0.0
    } else if biased >= 255 {
        if acc < 0 {
            f32::NEG_INFINITY
        } else {
            f32::INFINITY
        }
    } else {
        f32::from_bits((bits & !EXP_MASK) | ((biased as u32) << 23))
    }
}

/// Partial-sum rule: a magnitude below `2^-126` (zero or subnormal, either sign) becomes +0.
pub fn flush_partial(x: f32) -> f32 {
    if x.to_bits() & 0x7fff_ffff < IMPLICIT_ONE {
        0.0
    } else {
        x
    }
}

/// Final rule: every NaN becomes the canonical quiet NaN.
pub fn canonicalize(x: f32) -> f32 {
    if x.to_bits() & 0x7fff_ffff > EXP_MASK {
        f32::from_bits(CANONICAL_NAN_BITS)
    } else {
        x
    }
}

/// The epilogue over one output's block terms, in block order.
pub fn sum_terms(terms: impl IntoIterator<Item = f32>) -> f32 {
    let mut sum = 0.0f32;
    for term in terms {
        sum = flush_partial(sum + term);
    }
    canonicalize(sum)
}

/// One output element from quantized rows: the whole unit after quantization.
pub fn output_element(a: &QuantizedRows, row: usize, b: &QuantizedRows, col: usize) -> f32 {
    sum_terms((0..a.blocks).map(|block| {
        let acc = dot_block(a.block(row, block), b.block(col, block));
        block_term(acc, a.exponent(row, block) + b.exponent(col, block))
    }))
}

/// The reference unit: `C (m × n) = A (m × k) · Bᵀ (B is n × k)`, all row-major.
pub fn gemm_nt(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Result<Vec<f32>, UnitError> {
    let qa = quantize_rows(a, m, k, Operand::A)?;
    let qb = quantize_rows(b, n, k, Operand::B)?;
    let mut c = Vec::with_capacity(m * n);
    for row in 0..m {
        for col in 0..n {
            c.push(output_element(&qa, row, &qb, col));
        }
    }
    Ok(c)
}

/// The raw integer unit over the full i8 range: `C[i][j] = Σ_k A[i][k] · B[j][k]` in i32
/// (wrapping, which no `k` below 2^17 can reach), products from the table.
pub fn gemm_i8_nt(m: usize, n: usize, k: usize, a: &[i8], b: &[i8]) -> Vec<i32> {
    assert_eq!(a.len(), m * k, "A must be m × k");
    assert_eq!(b.len(), n * k, "B must be n × k");
    let mut c = Vec::with_capacity(m * n);
    for row in 0..m {
        for col in 0..n {
            let a_row = &a[row * k..row * k + k];
            let b_row = &b[col * k..col * k + k];
            c.push(a_row.iter().zip(b_row).fold(0i32, |acc, (&x, &y)| acc.wrapping_add(lut_mul(x, y))));
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// Exact rational arithmetic for checking: `x / 2^e` compared with an f64 computation.
    fn quantize_via_f64(x: f32, e: i32) -> i8 {
        if x.abs() < f32::MIN_POSITIVE {
            return 0;
        }
        let scaled = f64::from(x) * 2f64.powi(-e); // exact in f64 for every f32 and e here
        scaled.round_ties_even() as i8
    }

    #[test]
    fn block_exponent_is_the_smallest_that_fits() {
        let mut rng = SplitMix64::new(11);
        for _ in 0..20_000 {
            let bits = rng.next_u32() & 0x7fff_ffff;
            if !is_finite_bits(bits) || bits < IMPLICIT_ONE {
                continue;
            }
            let amax = f64::from(f32::from_bits(bits));
            let e = block_exponent(bits);
            assert!(amax <= 127.0 * 2f64.powi(e), "{amax} does not fit 2^{e}");
            assert!(amax > 127.0 * 2f64.powi(e - 1), "{amax} would fit 2^{}", e - 1);
        }
        assert_eq!(block_exponent(127f32.to_bits()), 0);
        assert_eq!(block_exponent(127.5f32.to_bits()), 1);
        assert_eq!(block_exponent(64f32.to_bits()), 0); // 64 > 63.5 = 127 · 2^-1
        assert_eq!(block_exponent(0), ZERO_BLOCK_EXP);
        assert_eq!(block_exponent(1), ZERO_BLOCK_EXP); // smallest subnormal
    }

    #[test]
    fn quantize_matches_exact_rounding() {
        let mut rng = SplitMix64::new(12);
        for _ in 0..50_000 {
            let biased = 1 + rng.below(254) as u32;
            let amax_bits = (biased << 23) | (rng.next_u32() & MANTISSA_MASK);
            let e = block_exponent(amax_bits);
            let amax = f32::from_bits(amax_bits);
            let x = amax * rng.next_signed_unit();
            assert_eq!(quantize_value(x.to_bits(), e), quantize_via_f64(x, e), "x={x:e} e={e}");
        }
        // Ties go to even, in both directions.
        assert_eq!(quantize_value(2.5f32.to_bits(), 0), 2);
        assert_eq!(quantize_value(3.5f32.to_bits(), 0), 4);
        assert_eq!(quantize_value((-2.5f32).to_bits(), 0), -2);
        assert_eq!(quantize_value(0.5f32.to_bits(), 0), 0);
        assert_eq!(quantize_value(127f32.to_bits(), 0), 127);
        assert_eq!(quantize_value((-127f32).to_bits(), 0), -127);
    }

    #[test]
    fn quantize_never_produces_minus_128() {
        let values: Vec<f32> = (0..64).map(|i| -128.0 + i as f32 * 0.25).collect();
        let q = quantize_rows(&values, 2, 32, Operand::A).unwrap();
        assert!(q.q.iter().all(|&v| v >= -127));
        assert_eq!(q.exponent(0, 0), 1); // 128 > 127: the scale doubles
    }

    #[test]
    fn specials_have_defined_behaviour() {
        let err = gemm_nt(1, 1, 3, &[1.0, f32::NAN, 0.0], &[1.0, 1.0, 1.0]).unwrap_err();
        assert!(matches!(err, UnitError::NonFinite { operand: Operand::A, index: 1, .. }));
        let err = gemm_nt(1, 1, 2, &[1.0, 1.0], &[f32::NEG_INFINITY, 1.0]).unwrap_err();
        assert!(matches!(err, UnitError::NonFinite { operand: Operand::B, index: 0, .. }));
        let err = gemm_nt(2, 1, 2, &[1.0; 3], &[1.0; 2]).unwrap_err();
        assert!(matches!(err, UnitError::Shape { expected: 4, actual: 3, .. }));
        // Subnormals quantize to zero, so a product of them is +0.
        let tiny = f32::from_bits(1);
        assert_eq!(gemm_nt(1, 1, 1, &[tiny], &[tiny]).unwrap()[0].to_bits(), 0);
        // -0 in, +0 out.
        assert_eq!(gemm_nt(1, 1, 1, &[-0.0], &[5.0]).unwrap()[0].to_bits(), 0);
        // Overflowing terms give ±Inf; Inf - Inf gives the canonical NaN.
        let big = f32::MAX;
        let k = 2 * BLOCK;
        let mut a = vec![big; k];
        let b_pos = vec![big; k];
        assert_eq!(gemm_nt(1, 1, k, &a, &b_pos).unwrap()[0], f32::INFINITY);
        a[BLOCK..].iter_mut().for_each(|v| *v = -big);
        assert_eq!(gemm_nt(1, 1, k, &a, &b_pos).unwrap()[0].to_bits(), CANONICAL_NAN_BITS);
    }

    #[test]
    fn block_terms_are_exact_products() {
        let mut rng = SplitMix64::new(13);
        for _ in 0..20_000 {
            let acc = (rng.below(1 << 20) as i32) - (1 << 19);
            let s = rng.below(200) as i32 - 100;
            let expected = f64::from(acc) * 2f64.powi(s);
            assert_eq!(f64::from(block_term(acc, s)), expected);
        }
        assert_eq!(block_term(1, -127).to_bits(), 0); // 2^-127 is below the normal range
        assert_eq!(block_term(1, -126), f32::MIN_POSITIVE);
        assert_eq!(block_term(-3, 200), f32::NEG_INFINITY);
    }

    #[test]
    fn partial_sums_flush_to_plus_zero() {
        assert_eq!(flush_partial(-0.0).to_bits(), 0);
        assert_eq!(flush_partial(f32::from_bits(0x8000_0001)).to_bits(), 0);
        assert_eq!(flush_partial(f32::MIN_POSITIVE), f32::MIN_POSITIVE);
        // 1.5·2^-126 - 2^-126 = 2^-127 (subnormal) flushes to +0.
        let a = block_term(3, -127);
        let b = block_term(-1, -126);
        assert_eq!(sum_terms([a, b]).to_bits(), 0);
    }

    #[test]
    fn small_product_by_hand() {
        // One block: [1, 2, 3] · [4, 5, 6] = 32 exactly (scales 2^-5 and 2^-5 keep integers).
        let c = gemm_nt(1, 1, 3, &[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]).unwrap();
        assert_eq!(c, vec![32.0]);
        // Two blocks summed in order.
        let a: Vec<f32> = (0..40).map(|i| (i % 7) as f32).collect();
        let b: Vec<f32> = (0..40).map(|i| (i % 5) as f32 - 2.0).collect();
        let exact: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert_eq!(gemm_nt(1, 1, 40, &a, &b).unwrap(), vec![exact]);
    }

    #[test]
    fn integer_unit_over_the_full_range() {
        let a: Vec<i8> = (i8::MIN..=i8::MAX).collect();
        let b = a.clone();
        let c = gemm_i8_nt(256, 256, 1, &a, &b);
        for (i, &x) in a.iter().enumerate() {
            for (j, &y) in b.iter().enumerate() {
                assert_eq!(c[i * 256 + j], i32::from(x) * i32::from(y));
            }
        }
    }
}
