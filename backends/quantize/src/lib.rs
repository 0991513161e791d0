//! Fast block quantization, bit-identical to `lockstep_luts::units::quantize_rows`.
//!
//! The reference works on the bits with integers. Here, when the block exponent `e` lies in
//! `[-100, 100]`, `x · 2^-e` is computed in f32 and rounded half-to-even. Both steps are exact
//! for those exponents: `2^-e` is a normal f32, the product is exact unless it underflows (then
//! its true value is below 2^-26 and rounds to 0 either way, as a subnormal input does), and a
//! value of magnitude at most 127 rounds to the nearest integer, ties to even, by adding and
//! subtracting `1.5·2^23` (portable code) or by `vroundps` with an explicit nearest-even mode
//! (AVX2). Outside that range a block goes through the reference's integer routine.
//!
//! Non-finite values are detected on the way for free: a block holds NaN or ±Inf exactly
//! when its largest magnitude's bits reach `0x7f800000`.

use lockstep_luts::units::{block_exponent, first_non_finite, quantize_value, Operand, UnitError, BLOCK};

const ROUNDING_MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
const NON_FINITE_BITS: u32 = 0x7f80_0000;

/// A non-finite value was seen; the caller finds which ([`first_non_finite_error`]).
#[derive(Debug, PartialEq, Eq)]
pub struct SawNonFinite;

/// The error for the first non-finite input of a unit call, A before B, as the reference
/// reports it. Called after the quantizer said [`SawNonFinite`] for one of them.
pub fn first_non_finite_error(a: &[f32], b: &[f32]) -> UnitError {
    for (values, operand) in [(a, Operand::A), (b, Operand::B)] {
        if let Some(index) = first_non_finite(values) {
            return UnitError::NonFinite { operand, index, bits: values[index].to_bits() };
        }
    }
    unreachable!("the quantizer saw a non-finite value that a scan cannot find")
}

/// Quantizes one block (`chunk.len() ≤ BLOCK`) into `out` (`BLOCK` long, tail zeroed);
/// returns the block exponent.
#[inline(always)]
fn quantize_block_scalar(chunk: &[f32], out: &mut [i8]) -> Result<i32, SawNonFinite> {
    let amax_bits = chunk.iter().fold(0u32, |m, v| m.max(v.to_bits() & 0x7fff_ffff));
    if amax_bits >= NON_FINITE_BITS {
        return Err(SawNonFinite);
    }
    let e = block_exponent(amax_bits);
    if (-100..=100).contains(&e) {
        let inverse = f32::from_bits(((127 - e) as u32) << 23);
        for (slot, value) in out.iter_mut().zip(chunk) {
            let rounded = (value * inverse + ROUNDING_MAGIC) - ROUNDING_MAGIC;
            *slot = rounded as i32 as i8;
        }
    } else {
        for (slot, value) in out.iter_mut().zip(chunk) {
            *slot = quantize_value(value.to_bits(), e);
        }
    }
    out[chunk.len()..].fill(0);
    Ok(e)
}

/// A full block with AVX2. Same contract as [`quantize_block_scalar`].
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn quantize_block_avx2(chunk: &[f32; BLOCK], out: &mut [i8]) -> Result<i32, SawNonFinite> {
    use std::arch::x86_64::*;
    assert!(out.len() >= BLOCK);
    // SAFETY: `chunk` holds 32 floats and `out` at least 32 bytes; loads and stores are
    // unaligned.
    unsafe {
        let p = chunk.as_ptr();
        let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
        let mask = _mm256_set1_epi32(0x7fff_ffff);
        let abs = v.map(|x| _mm256_and_si256(_mm256_castps_si256(x), mask));
        let m = _mm256_max_epu32(_mm256_max_epu32(abs[0], abs[1]), _mm256_max_epu32(abs[2], abs[3]));
        let m = _mm256_max_epu32(m, _mm256_permute2x128_si256(m, m, 1));
        let m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0b0100_1110));
        let m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0b1011_0001));
        let amax_bits = _mm256_cvtsi256_si32(m) as u32;
        if amax_bits >= NON_FINITE_BITS {
            return Err(SawNonFinite);
        }
        let e = block_exponent(amax_bits);
        if !(-100..=100).contains(&e) {
            return Ok(quantize_block_scalar(chunk, out).expect("finite block"));
        }
        let inverse = _mm256_set1_ps(f32::from_bits(((127 - e) as u32) << 23));
        let q = v.map(|x| {
            let rounded = _mm256_round_ps(_mm256_mul_ps(x, inverse), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm256_cvttps_epi32(rounded)
        });
        // |q| ≤ 127, so the saturating packs never saturate; the permute undoes their
        // per-128-bit-lane interleaving.
        let words = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        let ordered = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(out.as_mut_ptr().cast(), ordered);
        Ok(e)
    }
}

#[inline(always)]
fn quantize_rows_with(
    values: &[f32],
    k: usize,
    q: &mut [i8],
    exp: &mut [i32],
    full_block: impl Fn(&[f32; BLOCK], &mut [i8]) -> Result<i32, SawNonFinite>,
) -> Result<(), SawNonFinite> {
    let blocks = k.div_ceil(BLOCK);
    for (row, values) in values.chunks_exact(k).enumerate() {
        for block in 0..blocks {
            let chunk = &values[block * BLOCK..((block + 1) * BLOCK).min(k)];
            let start = (row * blocks + block) * BLOCK;
            let out = &mut q[start..start + BLOCK];
            exp[row * blocks + block] = match <&[f32; BLOCK]>::try_from(chunk) {
                Ok(full) => full_block(full, out)?,
                Err(_) => quantize_block_scalar(chunk, out)?,
            };
        }
    }
    Ok(())
}

/// Quantizes whole rows of length `k` (`values.len()` a multiple of `k`) into `q`
/// (`rows × blocks × BLOCK`) and `exp` (`rows × blocks`); stops at the first block holding a
/// NaN or ±Inf.
pub fn quantize_rows(values: &[f32], k: usize, q: &mut [i8], exp: &mut [i32]) -> Result<(), SawNonFinite> {
    if k == 0 {
        return Ok(());
    }
    debug_assert_eq!(values.len() % k, 0);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present.
        return unsafe { quantize_rows_avx2(values, k, q, exp) };
    }
    quantize_rows_with(values, k, q, exp, |chunk, out| quantize_block_scalar(chunk, out))
}

/// Every row with AVX2, so the per-block routine inlines into the loop.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_rows_avx2(values: &[f32], k: usize, q: &mut [i8], exp: &mut [i32]) -> Result<(), SawNonFinite> {
    // SAFETY: this function's own contract: AVX2 is present.
    quantize_rows_with(values, k, q, exp, |chunk, out| unsafe { quantize_block_avx2(chunk, out) })
}

/// The portable quantizer alone, for tests that compare it with the SIMD one.
#[cfg(test)]
fn quantize_rows_portable(values: &[f32], k: usize, q: &mut [i8], exp: &mut [i32]) -> Result<(), SawNonFinite> {
    quantize_rows_with(values, k, q, exp, |chunk, out| quantize_block_scalar(chunk, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_luts::rng::SplitMix64;
    use lockstep_luts::units::{quantize_rows as reference, Operand};

    fn check(values: &[f32], rows: usize, k: usize) {
        let expected = reference(values, rows, k, Operand::A).unwrap();
        for portable in [false, true] {
            let mut q = vec![0x55u8 as i8; expected.q.len()];
            let mut exp = vec![-999; expected.exp.len()];
            if portable {
                quantize_rows_portable(values, k, &mut q, &mut exp).unwrap();
            } else {
                quantize_rows(values, k, &mut q, &mut exp).unwrap();
            }
            assert_eq!(exp, expected.exp, "portable={portable}");
            assert_eq!(q, expected.q, "portable={portable}");
        }
    }

    #[test]
    fn matches_reference_across_exponents() {
        let mut rng = SplitMix64::new(21);
        for _ in 0..300 {
            let k = 1 + rng.below(100) as usize;
            let rows = 1 + rng.below(4) as usize;
            let values: Vec<f32> = (0..rows * k)
                .map(|_| {
                    // Exponents across the whole finite range, subnormals and zeros included.
                    let biased = rng.below(255) as u32;
                    let bits = (rng.next_u32() & 0x807f_ffff) | (biased << 23);
                    if rng.below(10) == 0 {
                        0.0
                    } else {
                        f32::from_bits(bits)
                    }
                })
                .collect();
            check(&values, rows, k);
        }
    }

    #[test]
    fn ordinary_magnitudes_take_the_fast_blocks() {
        let mut rng = SplitMix64::new(22);
        for scale in [1e-20f32, 1e-3, 1.0, 300.0, 1e20] {
            let values: Vec<f32> = (0..4 * 96).map(|_| rng.next_signed_unit() * scale).collect();
            check(&values, 4, 96);
        }
    }

    #[test]
    fn ties_and_edges() {
        let values = [0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 127.0, 0.0, -0.0, f32::from_bits(1)];
        check(&values, 1, values.len());
        let mut ties: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
        ties[0] = 127.0;
        check(&ties, 1, 32);
        let tiny: Vec<f32> = (0..40).map(|i| f32::MIN_POSITIVE * (1.0 + i as f32)).collect();
        check(&tiny, 1, 40);
        let huge: Vec<f32> = (0..64).map(|i| f32::MAX / (1.0 + i as f32)).collect();
        check(&huge, 2, 32);
    }

    #[test]
    fn non_finite_blocks_are_reported() {
        let mut values = vec![1.0f32; 64];
        let (mut q, mut exp) = (vec![0; 64], vec![0; 2]);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for position in [0, 31, 40] {
                values[position] = bad;
                assert_eq!(quantize_rows(&values, 64, &mut q, &mut exp), Err(SawNonFinite));
                assert_eq!(quantize_rows_portable(&values, 64, &mut q, &mut exp), Err(SawNonFinite));
                values[position] = 1.0;
            }
        }
    }
}
