//! The units' flaws: each a plausible bug in a plugin's products (the flawed plugins of
//! `examples/flaw_*.rs` and the unit mutants of [`crate::mutants`]).

use lockstep_luts::units::{block_exponent, block_term, canonicalize, flush_partial, quantize_value, BLOCK};

/// The bug a flawed plugin carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// Accumulates dequantized products in f32, element by element, instead of exact i32
    /// block sums with a power-of-two epilogue.
    F32Accumulation,
    /// Quantizes asymmetrically to `[-128, 127]` (scales by 128, so -128 appears) and sums
    /// product pairs in saturating i16, as a careless `vpmaddubsw` kernel would.
    SaturatingPairs,
    /// Rounds halves away from zero instead of to even.
    RoundHalfAway,
    /// Sums the block terms last block first.
    ReversedBlocks,
    /// Picks the block exponent with `≥` where the definition has `>`: a block whose largest
    /// magnitude is exactly `127 · 2^e` gets `e + 1` (right everywhere but on the boundary).
    BoundaryExponent,
    /// Accumulates the raw integer product in f32 (exact until the sums pass 2^24).
    IntegerSumsInF32,
    /// Returns the previous result when called again with the same operand addresses and shape
    /// (a "cache" that assumes buffers are never rewritten in place).
    CacheByAddress,
    /// Flushes only the final sum, not each partial sum: a subnormal partial sum survives into
    /// the next addition.
    FlushAtEnd,
    /// Never flushes: subnormal partial sums and results survive.
    NoFlush,
    /// Flushes a subnormal partial sum to a zero of its own sign (−0 stays −0).
    FlushKeepsSign,
    /// Leaves NaN results as the hardware made them (x86: `0xffc00000`), not canonical.
    NanNotCanonical,
    /// Quantizes by truncation toward zero instead of rounding half to even.
    RoundTowardZero,
    /// Rounds halves up (toward +∞) instead of to even.
    RoundHalfUp,
    /// Takes one more than the definition's block exponent: a coarser scale, every block.
    ExponentPlusOne,
    /// Takes the block exponent from the block's first value instead of its largest magnitude
    /// (quants past ±127 saturate).
    ExponentOfFirst,
    /// Never carries the block exponent up when the largest magnitude rounds past 127 · 2^e
    /// (such quants saturate at ±127).
    NoExponentCarry,
    /// One exponent per row (the row's largest magnitude), every block scaled by it.
    RowExponent,
    /// Blocks of 16 values instead of 32.
    Blocks16,
    /// Drops a last block shorter than 32 values.
    TailDropped,
    /// Accumulates a block's products in wrapping i16.
    WrapI16Sums,
    /// Builds a block term by a float multiply `acc · 2^e` (its own rounding of subnormal and
    /// overflowing terms) instead of on the bits.
    TermByMultiply,
    /// A block term past the largest finite value becomes ±f32::MAX instead of ±∞.
    TermSaturates,
    /// Adds the block terms pairwise (a tree) instead of in block order.
    PairwiseBlocks,
    /// Adds the block terms in f64 and rounds once (more accurate, other bits).
    TermsInF64,
    /// Where neighbouring blocks of an output share their scale exponent (`ea + eb`), adds
    /// their int32 block sums and makes one term of them: one rounding where the definition
    /// has one per block (an outsider's "optimisation" the battery once admitted).
    MergeEqualExponents,
    /// Where every block of an output shares one scale exponent, takes the output as one
    /// integer dot product: the block sums added exactly and rounded once, where the definition
    /// rounds after each block (equal while the running sum stays below 2^24 units of the scale).
    MergeOneExponentRow,
}

impl Flaw {
    /// Every unit flaw, in the order `docs/VERIFICATION.md` lists them.
    pub const ALL: &'static [Flaw] = &[
        Flaw::F32Accumulation,
        Flaw::SaturatingPairs,
        Flaw::RoundHalfAway,
        Flaw::ReversedBlocks,
        Flaw::BoundaryExponent,
        Flaw::IntegerSumsInF32,
        Flaw::CacheByAddress,
        Flaw::FlushAtEnd,
        Flaw::NoFlush,
        Flaw::FlushKeepsSign,
        Flaw::NanNotCanonical,
        Flaw::RoundTowardZero,
        Flaw::RoundHalfUp,
        Flaw::ExponentPlusOne,
        Flaw::ExponentOfFirst,
        Flaw::NoExponentCarry,
        Flaw::RowExponent,
        Flaw::Blocks16,
        Flaw::TailDropped,
        Flaw::WrapI16Sums,
        Flaw::TermByMultiply,
        Flaw::TermSaturates,
        Flaw::PairwiseBlocks,
        Flaw::TermsInF64,
        Flaw::MergeEqualExponents,
        Flaw::MergeOneExponentRow,
    ];
}

/// `round_half_even(x / 2^e)` with `flaw`'s rounding rule, saturated to ±127 (the flaws whose
/// exponent can be too small need it; for the others it never acts).
fn quantize_with(flaw: Flaw, bits: u32, e: i32) -> i8 {
    if (bits >> 23) & 0xff == 0 {
        return 0;
    }
    let x = f64::from(f32::from_bits(bits)) * 2f64.powi(-e);
    let r = match flaw {
        Flaw::RoundTowardZero => x.trunc(),
        Flaw::RoundHalfUp => (x + 0.5).floor(),
        _ => x.round_ties_even(),
    };
    r.clamp(-127.0, 127.0) as i8
}

fn quantize(flaw: Flaw, values: &[f32]) -> (Vec<i8>, i32) {
    let amax_bits = values.iter().map(|v| v.to_bits() & 0x7fff_ffff).max().unwrap_or(0);
    let mut e = block_exponent(amax_bits);
    if let Some(row_exponent) = ROW_EXPONENT.with(|r| r.get()) {
        e = row_exponent;
        let q = values.iter().map(|v| quantize_with(flaw, v.to_bits(), e)).collect();
        return (q, e);
    }
    if flaw == Flaw::BoundaryExponent && amax_bits >> 23 != 0 && (amax_bits & 0x007f_ffff) | 0x0080_0000 == 127 << 17 {
        e += 1;
    }
    let q = match flaw {
        Flaw::SaturatingPairs => {
            // The wrong range: the smallest e with amax ≤ 128 · 2^e.
            if amax_bits >> 23 != 0 && f64::from(f32::from_bits(amax_bits)) <= 128.0 * 2f64.powi(e - 1) {
                e -= 1;
            }
            values
                .iter()
                .map(|v| {
                    let scaled = (f64::from(*v) * 2f64.powi(-e)).round_ties_even();
                    scaled.clamp(-128.0, 127.0) as i8
                })
                .collect()
        }
        Flaw::RoundHalfAway => values
            .iter()
            .map(|v| if v.abs() < f32::MIN_POSITIVE { 0 } else { (f64::from(*v) * 2f64.powi(-e)).round() as i8 })
            .collect(),
        Flaw::RoundTowardZero | Flaw::RoundHalfUp => {
            values.iter().map(|v| quantize_with(flaw, v.to_bits(), e)).collect()
        }
        Flaw::ExponentPlusOne | Flaw::NoExponentCarry | Flaw::ExponentOfFirst => {
            if amax_bits >> 23 != 0 {
                e = match flaw {
                    Flaw::ExponentPlusOne => e + 1,
                    Flaw::NoExponentCarry => (amax_bits >> 23) as i32 - 133,
                    _ => block_exponent(values.first().map_or(0, |v| v.to_bits() & 0x7fff_ffff)),
                };
            }
            values.iter().map(|v| quantize_with(flaw, v.to_bits(), e)).collect()
        }
        _ => values.iter().map(|v| quantize_value(v.to_bits(), e)).collect(),
    };
    (q, e)
}

thread_local! {
    /// [`Flaw::RowExponent`]: the exponent of the row being quantized, for every block of it.
    static ROW_EXPONENT: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
}

fn dot(flaw: Flaw, a: &[i8], b: &[i8]) -> i32 {
    match flaw {
        Flaw::WrapI16Sums => {
            a.iter().zip(b).fold(0i16, |s, (x, y)| s.wrapping_add(i16::from(*x).wrapping_mul(i16::from(*y)))).into()
        }
        Flaw::SaturatingPairs => a
            .chunks(2)
            .zip(b.chunks(2))
            .map(|(x, y)| {
                let pair: i32 = x.iter().zip(y).map(|(p, q)| i32::from(*p) * i32::from(*q)).sum();
                pair.clamp(i16::MIN.into(), i16::MAX.into())
            })
            .sum(),
        _ => a.iter().zip(b).map(|(x, y)| i32::from(*x) * i32::from(*y)).sum(),
    }
}

/// `c = a · bᵀ` with `flaw`. Non-finite inputs are refused like the real units, so the gate
/// can only catch the arithmetic.
pub fn flawed_gemm(
    flaw: Flaw,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
) -> Result<(), String> {
    if let Some(i) = a.iter().chain(b).position(|v| !v.is_finite()) {
        return Err(format!("non-finite input at {i}"));
    }
    type Cached = Option<((usize, usize, usize, usize, usize), Vec<f32>)>;
    static LAST: std::sync::Mutex<Cached> = std::sync::Mutex::new(None);
    let key = (a.as_ptr() as usize, b.as_ptr() as usize, m, n, k);
    if flaw == Flaw::CacheByAddress {
        if let Some((seen, out)) = LAST.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            if *seen == key {
                c.copy_from_slice(out);
                return Ok(());
            }
        }
    }
    let width = if flaw == Flaw::Blocks16 { BLOCK / 2 } else { BLOCK };
    let blocks = if flaw == Flaw::TailDropped { k / width } else { k.div_ceil(width) };
    let rows = |values: &[f32], count: usize| -> Vec<Vec<(Vec<i8>, i32)>> {
        (0..count)
            .map(|r| {
                let row = &values[r * k..r * k + k];
                if flaw == Flaw::RowExponent {
                    let amax = row.iter().map(|v| v.to_bits() & 0x7fff_ffff).max().unwrap_or(0);
                    ROW_EXPONENT.with(|e| e.set(Some(block_exponent(amax))));
                }
                let out = (0..blocks).map(|blk| quantize(flaw, &row[blk * width..k.min((blk + 1) * width)])).collect();
                ROW_EXPONENT.with(|e| e.set(None));
                out
            })
            .collect()
    };
    let qa = rows(a, m);
    let qb = rows(b, n);
    for i in 0..m {
        for j in 0..n {
            let mut terms: Vec<f32> = Vec::with_capacity(blocks);
            let mut f32_sum = 0.0f32;
            // Flaw::MergeEqualExponents: the run of blocks with one exponent, its summed sums.
            let mut run: Option<(i64, i32)> = None;
            let one_exponent = (0..blocks).all(|blk| qa[i][blk].1 + qb[j][blk].1 == qa[i][0].1 + qb[j][0].1);
            if flaw == Flaw::MergeOneExponentRow && blocks > 0 && one_exponent {
                let sum = (0..blocks).map(|blk| i64::from(dot(flaw, &qa[i][blk].0, &qb[j][blk].0))).sum();
                let e = qa[i][0].1 + qb[j][0].1;
                if merged_term(sum, e).is_normal() {
                    c[i * n + j] = canonicalize(merged_term(sum, e));
                    continue;
                }
            }
            for blk in 0..blocks {
                let ((xa, ea), (xb, eb)) = (&qa[i][blk], &qb[j][blk]);
                if flaw == Flaw::MergeEqualExponents {
                    // A fast path for ordinary values: terms that are finite and normal alone.
                    let acc = i64::from(dot(flaw, xa, xb));
                    let ordinary = |sum: i64, e: i32| merged_term(sum, e).is_normal() || sum == 0;
                    run = match run {
                        Some((sum, e)) if e == ea + eb && ordinary(sum, e) && ordinary(acc, e) => Some((sum + acc, e)),
                        Some((sum, e)) => {
                            terms.push(merged_term(sum, e));
                            Some((acc, ea + eb))
                        }
                        None => Some((acc, ea + eb)),
                    };
                } else if flaw == Flaw::F32Accumulation {
                    let (sa, sb) = (2f32.powi(*ea), 2f32.powi(*eb));
                    for (p, q) in xa.iter().zip(xb) {
                        f32_sum += (f32::from(*p) * sa) * (f32::from(*q) * sb);
                    }
                } else {
                    terms.push(term(flaw, dot(flaw, xa, xb), ea + eb));
                }
            }
            if let Some((sum, e)) = run {
                terms.push(merged_term(sum, e));
            }
            if flaw == Flaw::ReversedBlocks {
                terms.reverse();
            }
            c[i * n + j] = match flaw {
                Flaw::F32Accumulation => canonicalize(f32_sum),
                Flaw::FlushAtEnd => canonicalize(flush_partial(terms.into_iter().fold(0.0, |s, t| s + t))),
                Flaw::NoFlush => canonicalize(terms.into_iter().fold(0.0, |s, t| s + t)),
                Flaw::FlushKeepsSign => canonicalize(terms.into_iter().fold(0.0, |s, t| {
                    let x: f32 = s + t;
                    if x.to_bits() & 0x7fff_ffff < 0x0080_0000 {
                        0.0f32.copysign(x)
                    } else {
                        x
                    }
                })),
                Flaw::NanNotCanonical => terms.into_iter().fold(0.0, |s, t| flush_partial(s + t)),
                Flaw::PairwiseBlocks => canonicalize(pairwise(&terms)),
                Flaw::TermsInF64 => {
                    canonicalize(flush_partial(terms.iter().map(|&t| f64::from(t)).sum::<f64>() as f32))
                }
                _ => canonicalize(terms.into_iter().fold(0.0, |s, t| flush_partial(s + t))),
            };
        }
    }
    if flaw == Flaw::CacheByAddress {
        *LAST.lock().unwrap_or_else(|p| p.into_inner()) = Some((key, c.to_vec()));
    }
    Ok(())
}

/// A block's term `acc · 2^e` with `flaw`'s construction.
fn term(flaw: Flaw, acc: i32, e: i32) -> f32 {
    match flaw {
        Flaw::TermByMultiply => (f64::from(acc) * 2f64.powi(e)) as f32,
        Flaw::TermSaturates => {
            let t = block_term(acc, e);
            if t.is_infinite() {
                f32::MAX.copysign(t)
            } else {
                t
            }
        }
        _ => block_term(acc, e),
    }
}

/// [`Flaw::MergeEqualExponents`]'s term of several blocks' summed sums: the definition's term
/// while the sum fits its 24 bits, else the sum rounded once to f32 and scaled.
fn merged_term(sum: i64, e: i32) -> f32 {
    match i32::try_from(sum) {
        Ok(acc) if acc.unsigned_abs() < 1 << 24 => block_term(acc, e),
        _ => (sum as f64 * 2f64.powi(e)) as f32,
    }
}

/// Terms added as a balanced tree, partial sums flushed.
fn pairwise(terms: &[f32]) -> f32 {
    match terms.len() {
        0 => 0.0,
        1 => flush_partial(terms[0]),
        n => flush_partial(pairwise(&terms[..n / 2]) + pairwise(&terms[n / 2..])),
    }
}

/// The raw integer product with `flaw` (only [`Flaw::IntegerSumsInF32`] changes it).
pub fn flawed_gemm_i8(flaw: Flaw, m: usize, n: usize, k: usize, a: &[i8], b: &[i8], c: &mut [i32]) {
    if flaw != Flaw::IntegerSumsInF32 {
        c.copy_from_slice(&lockstep_luts::gemm_i8_nt(m, n, k, a, b));
        return;
    }
    for i in 0..m {
        for j in 0..n {
            let mut sum = 0.0f32;
            for l in 0..k {
                sum += f32::from(i16::from(a[i * k + l]) * i16::from(b[j * k + l]));
            }
            c[i * n + j] = sum as i32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each flaw really changes some output on inputs that are easy to reason about; the
    /// plugin tests then show the gate finds it on its own battery.
    #[test]
    fn every_flaw_is_observable() {
        let k = 64;
        let a: Vec<f32> = (0..k).map(|i| if i % 32 == 0 { 127.0 } else { (i % 9) as f32 - 4.5 }).collect();
        let b: Vec<f32> = (0..k).map(|i| (i % 7) as f32 * 0.37 - 1.1).collect();
        let reference = lockstep_luts::gemm_nt(1, 1, k, &a, &b).unwrap();
        let mut c = [0.0f32];
        flawed_gemm(Flaw::RoundHalfAway, 1, 1, k, &a, &b, &mut c).unwrap();
        assert_ne!(c[0].to_bits(), reference[0].to_bits());
        let neg = vec![-128.0f32; 32];
        let reference = lockstep_luts::gemm_nt(1, 1, 32, &neg, &neg).unwrap();
        flawed_gemm(Flaw::SaturatingPairs, 1, 1, 32, &neg, &neg, &mut c).unwrap();
        assert_ne!(c[0].to_bits(), reference[0].to_bits());
    }
}
