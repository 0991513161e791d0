//! Element-wise f32 math that is the same on every platform, in Rust and in the inference
//! kit's JavaScript.
//!
//! Built from IEEE-754 binary32 `+ - * /` and `sqrt` only (each correctly rounded everywhere;
//! Rust never contracts them into FMAs), evaluated in a fixed order. The kit mirrors every
//! line with `Math.fround` after each operation, which gives the same bits (binary64 has enough
//! precision that rounding its exact-enough result to binary32 is the correctly rounded f32
//! result for these operations). No platform `libm`.

/// `1.5 · 2^23`: adding and subtracting it rounds an f32 of magnitude below 2^22 to the nearest
/// integer, ties to even.
const ROUND_MAGIC: f32 = 12_582_912.0;
//
// Every constant is given by its bits: the inference kit uses the same bit patterns, so no
// decimal-to-binary conversion can differ between Rust and JavaScript.
const LOG2_E: f32 = f32::from_bits(0x3fb8_aa3b);
/// ln 2 split so that `n · LN2_HI` is exact for |n| < 2^9 (Cody–Waite).
const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
/// 1/7!, 1/6!, 1/5!, 1/4!, 1/3! rounded to f32.
const INV_FACT: [f32; 5] = [
    f32::from_bits(0x3950_0d01),
    f32::from_bits(0x3ab6_0b61),
    f32::from_bits(0x3c08_8889),
    f32::from_bits(0x3d2a_aaab),
    f32::from_bits(0x3e2a_aaab),
];
/// 1/9, 1/7, 1/5, 1/3 rounded to f32.
const INV_ODD: [f32; 4] = [
    f32::from_bits(0x3de3_8e39),
    f32::from_bits(0x3e12_4925),
    f32::from_bits(0x3e4c_cccd),
    f32::from_bits(0x3eaa_aaab),
];

/// `e^x` to within a few ulp for `x` in `[-87.33, 88.72]`; inputs outside are clamped to that
/// range first (so the result is never subnormal or infinite). Branch-free, so loops over it
/// vectorize.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.33, 88.72);
    let shifted = x * LOG2_E + ROUND_MAGIC;
    let n = shifted - ROUND_MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // Taylor polynomial of e^r on |r| ≤ ln2/2, Horner form.
    let mut p = INV_FACT[0];
    p = p * r + INV_FACT[1];
    p = p * r + INV_FACT[2];
    p = p * r + INV_FACT[3];
    p = p * r + INV_FACT[4];
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // n ∈ [-126, 128]: scale by 2^n in two halves so neither factor leaves the normal range.
    // n is an integer of magnitude below 2^22, so `shifted`'s low mantissa bits hold it: read
    // it from the bits (the same value as `n as i32`, without a per-lane saturating cast).
    let ni = shifted.to_bits() as i32 - 0x4b40_0000;
    let half = ni >> 1;
    p * pow2(half) * pow2(ni - half)
}

/// `2^n` for `n` in the normal exponent range.
#[inline(always)]
fn pow2(n: i32) -> f32 {
    f32::from_bits(((127 + n) as u32) << 23)
}

/// `tanh(x)` from [`exp`]: the input is clamped to `[-9, 9]`, where the f32 result is already
/// ±1.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let x = x.clamp(-9.0, 9.0);
    let e = exp(2.0 * x);
    (e - 1.0) / (e + 1.0)
}

/// Natural logarithm of a positive normal `x` (used for the loss only): `x = m · 2^k` with
/// `m ∈ [√½, √2)`, then `ln m = 2·atanh(s)` with `s = (m-1)/(m+1)`, as a series in `s²`.
pub fn ln(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x.is_infinite() {
        return x;
    }
    // Subnormals are scaled by 2^24 first, so the exponent field is meaningful.
    let (x, extra) = if x < f32::MIN_POSITIVE { (x * 16_777_216.0, 24) } else { (x, 0) };
    let bits = x.to_bits();
    let mut k = ((bits >> 23) & 0xff) as i32 - 127 - extra;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000); // [1, 2)
    if m > std::f32::consts::SQRT_2 {
        m *= 0.5;
        k += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut p = INV_ODD[0];
    p = p * s2 + INV_ODD[1];
    p = p * s2 + INV_ODD[2];
    p = p * s2 + INV_ODD[3];
    p = p * s2 + 1.0;
    let kf = k as f32;
    kf * LN2_HI + (2.0 * s * p + kf * LN2_LO)
}

/// `√(2/π)`, GELU's tanh-approximation constant.
pub const GELU_C: f32 = f32::from_bits(0x3f4c_422a);
/// 0.044715.
pub const GELU_A: f32 = f32::from_bits(0x3d37_2713);

/// GELU, tanh approximation: `0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    let inner = GELU_C * (x + GELU_A * (x * x * x));
    0.5 * x * (1.0 + tanh(inner))
}

/// d gelu / dx for the same approximation.
#[inline(always)]
pub fn gelu_grad(x: f32) -> f32 {
    let x2 = x * x;
    let inner = GELU_C * (x + GELU_A * (x2 * x));
    let t = tanh(inner);
    let d_inner = GELU_C * (1.0 + 3.0 * GELU_A * x2);
    0.5 * (1.0 + t) + 0.5 * x * ((1.0 - t * t) * d_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulp_distance(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_accurate_over_its_range() {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = f64::from(x).exp() as f32;
            worst = worst.max(ulp_distance(exp(x), want));
            x += 0.013;
        }
        assert!(worst <= 4, "exp is {worst} ulp off somewhere");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), exp(-87.33));
        assert!(exp(-100.0) >= f32::MIN_POSITIVE);
        assert_eq!(exp(100.0), exp(88.72));
        assert!(exp(100.0).is_finite());
        assert_eq!(tanh(9.0), 1.0);
        assert_eq!(tanh(-50.0), -1.0);
    }

    #[test]
    fn tanh_ln_and_gelu_are_accurate() {
        let mut x = -10.0f32;
        while x < 10.0 {
            let t = f64::from(x).tanh();
            assert!((f64::from(tanh(x)) - t).abs() <= 2e-7 * t.abs().max(1e-3) + 1e-7, "tanh({x})");
            let g = 0.5
                * f64::from(x)
                * (1.0 + (0.797_884_560_802_865_4 * (f64::from(x) + 0.044715 * f64::from(x).powi(3))).tanh());
            assert!((f64::from(gelu(x)) - g).abs() <= 1e-6 * g.abs().max(1.0), "gelu({x})");
            let h = 1e-3f64;
            let x64 = f64::from(x);
            let gx = |v: f64| 0.5 * v * (1.0 + (0.797_884_560_802_865_4 * (v + 0.044715 * v.powi(3))).tanh());
            let numeric = (gx(x64 + h) - gx(x64 - h)) / (2.0 * h);
            assert!((f64::from(gelu_grad(x)) - numeric).abs() < 1e-4, "gelu'({x})");
            x += 0.0173;
        }
        for x in [1e-30f32, 1e-10, 0.01, 0.5, 1.0, 2.0, 10.0, 1e10, 3e38, f32::from_bits(5)] {
            let want = f64::from(x).ln();
            assert!((f64::from(ln(x)) - want).abs() <= 3e-7 * want.abs().max(1.0), "ln({x}) = {} want {want}", ln(x));
        }
        assert_eq!(ln(1.0), 0.0);
    }
}
