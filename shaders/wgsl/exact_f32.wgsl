// Exact binary32 arithmetic for the training step's element-wise ops (docs/VERIFICATION.md §10).
//
// Every value is carried as its bits (`u32`); every operation rounds exactly like IEEE-754
// binary32 with round-to-nearest-even and subnormals, which is what `lockstep_luts::ops` gets
// from the CPU. Three things a GPU driver may do are ruled out by construction:
//
// - **Contraction** (`a*b+c` fused into one rounding): every hardware product leaves `x_mul`
//   as bits XORed with `opaque_zero`, a word the kernel loads from its uniform parameters (it is
//   always 0, but no compiler can know that), so no later addition can see the product.
// - **Flushed subnormals**: the hardware add and multiply are used only where IEEE says the
//   result is a normal number computed from normal inputs (correctly rounded everywhere, by the
//   Vulkan precision rules); any subnormal input, any result of magnitude below 2^-125 that is
//   not an exact zero, and any NaN result is recomputed by the integer routines below
//   (Berkeley SoftFloat 3's algorithms, transcribed).
// - **Approximate division and square root**: `x_div` and `x_sqrt` never use the hardware;
//   they are long division and digit-by-digit square root on the integer significands.
//
// NaNs follow x86 SSE, the CPU the reference runs on: an operation on a NaN returns its first
// NaN operand, quieted; an invalid operation returns the default NaN 0xffc00000.
//
// `lockstep_luts::mathf` (exp, tanh, ln, GELU) is transcribed line for line on top, with its
// constants by their bits.

const SIGN: u32 = 0x80000000u;
const EXPM: u32 = 0x7f800000u;
const MANT: u32 = 0x007fffffu;
const QUIET: u32 = 0x00400000u;
const DEFAULT_NAN: u32 = 0xffc00000u;
const POS_INF: u32 = 0x7f800000u;
const NEG_INF: u32 = 0xff800000u;

const F_HALF: u32 = 0x3f000000u;
const F_ONE: u32 = 0x3f800000u;
const F_TWO: u32 = 0x40000000u;
const F_THREE: u32 = 0x40400000u;

// Always 0 at run time; set by every entry point from its parameters (see above).
var<private> opaque_zero: u32;

// Tests set it to route every add and multiply through the integer routines (same bits).
override SOFT_FLOAT: bool = false;

fn is_nan(a: u32) -> bool {
    return (a & 0x7fffffffu) > EXPM;
}

// Magnitude bits 1 … 0x007fffff (one unsigned comparison: 0 wraps past the bound).
fn is_subnormal(a: u32) -> bool {
    return ((a & 0x7fffffffu) - 1u) < 0x007fffffu;
}

// |r| ≥ 2^-125 (exponent field 2 or more) and r not a NaN; an infinity counts (a correctly
// rounded overflow). One unsigned comparison: magnitudes below 2^-125 wrap past the bound.
fn big_enough(r: u32) -> bool {
    return ((r & 0x7fffffffu) - 0x01000000u) <= (POS_INF - 0x01000000u);
}

fn nan2(a: u32, b: u32) -> u32 {
    if is_nan(a) {
        return a | QUIET;
    }
    return b | QUIET;
}

// SoftFloat's shiftRightJam32: `a >> dist` with every bit shifted out ORed into bit 0.
fn jam(a: u32, dist: u32) -> u32 {
    if dist == 0u {
        return a;
    }
    if dist < 31u {
        return (a >> dist) | select(0u, 1u, (a << (32u - dist)) != 0u);
    }
    return select(0u, 1u, a != 0u);
}

// SoftFloat's roundPackToF32: `sig` has its leading one at bit 30 (or below for subnormal
// results), seven rounding bits below the 24 kept; the biased exponent is `exp + 1`.
fn round_pack(sign: u32, exp: i32, sig: u32) -> u32 {
    var e = exp;
    var s = sig;
    var round_bits = s & 0x7fu;
    if e < 0 || e >= 0xfd {
        if e < 0 {
            s = jam(s, u32(-e));
            e = 0;
            round_bits = s & 0x7fu;
        } else if e > 0xfd || s + 0x40u >= 0x80000000u {
            return (sign << 31u) | POS_INF;
        }
    }
    s = (s + 0x40u) >> 7u;
    if round_bits == 0x40u {
        s = s & ~1u;
    }
    if s == 0u {
        e = 0;
    }
    return (sign << 31u) + (u32(e) << 23u) + s;
}

// SoftFloat's normRoundPackToF32.
fn norm_round_pack(sign: u32, exp: i32, sig: u32) -> u32 {
    let shift = i32(countLeadingZeros(sig)) - 1;
    let e = exp - shift;
    if shift >= 7 && e >= 0 && e < 0xfd {
        return (sign << 31u) + (u32(select(0, e, sig != 0u)) << 23u) + (sig << u32(shift - 7));
    }
    return round_pack(sign, e, sig << u32(shift));
}

fn add_mags(a: u32, b: u32) -> u32 {
    let exp_a = i32((a >> 23u) & 0xffu);
    let exp_b = i32((b >> 23u) & 0xffu);
    var sig_a = a & MANT;
    var sig_b = b & MANT;
    let sign = a >> 31u;
    let diff = exp_a - exp_b;
    var exp_z: i32;
    var sig_z: u32;
    if diff == 0 {
        if exp_a == 0 {
            return a + sig_b;
        }
        if exp_a == 0xff {
            if (sig_a | sig_b) != 0u {
                return nan2(a, b);
            }
            return a;
        }
        exp_z = exp_a;
        sig_z = 0x01000000u + sig_a + sig_b;
        if (sig_z & 1u) == 0u && exp_z < 0xfe {
            return (sign << 31u) + (u32(exp_z) << 23u) + (sig_z >> 1u);
        }
        sig_z = sig_z << 6u;
    } else {
        sig_a = sig_a << 6u;
        sig_b = sig_b << 6u;
        if diff < 0 {
            if exp_b == 0xff {
                if sig_b != 0u {
                    return nan2(a, b);
                }
                return (sign << 31u) | POS_INF;
            }
            exp_z = exp_b;
            sig_a = sig_a + select(sig_a, 0x20000000u, exp_a != 0);
            sig_a = jam(sig_a, u32(-diff));
        } else {
            if exp_a == 0xff {
                if sig_a != 0u {
                    return nan2(a, b);
                }
                return a;
            }
            exp_z = exp_a;
            sig_b = sig_b + select(sig_b, 0x20000000u, exp_b != 0);
            sig_b = jam(sig_b, u32(diff));
        }
        sig_z = 0x20000000u + sig_a + sig_b;
        if sig_z < 0x40000000u {
            exp_z = exp_z - 1;
            sig_z = sig_z << 1u;
        }
    }
    return round_pack(sign, exp_z, sig_z);
}

fn sub_mags(a: u32, b: u32) -> u32 {
    var exp_a = i32((a >> 23u) & 0xffu);
    let exp_b = i32((b >> 23u) & 0xffu);
    var sig_a = a & MANT;
    var sig_b = b & MANT;
    var sign = a >> 31u;
    var diff = exp_a - exp_b;
    if diff == 0 {
        if exp_a == 0xff {
            if (sig_a | sig_b) != 0u {
                return nan2(a, b);
            }
            return DEFAULT_NAN;
        }
        var sig_diff = i32(sig_a) - i32(sig_b);
        if sig_diff == 0 {
            return 0u;
        }
        if exp_a != 0 {
            exp_a = exp_a - 1;
        }
        if sig_diff < 0 {
            sign = sign ^ 1u;
            sig_diff = -sig_diff;
        }
        var shift = i32(countLeadingZeros(u32(sig_diff))) - 8;
        var exp_z = exp_a - shift;
        if exp_z < 0 {
            shift = exp_a;
            exp_z = 0;
        }
        return (sign << 31u) + (u32(exp_z) << 23u) + (u32(sig_diff) << u32(shift));
    }
    sig_a = sig_a << 7u;
    sig_b = sig_b << 7u;
    var exp_z: i32;
    var sig_x: u32;
    var sig_y: u32;
    if diff < 0 {
        sign = sign ^ 1u;
        if exp_b == 0xff {
            if sig_b != 0u {
                return nan2(a, b);
            }
            return (sign << 31u) | POS_INF;
        }
        exp_z = exp_b - 1;
        sig_x = sig_b | 0x40000000u;
        sig_y = sig_a + select(sig_a, 0x40000000u, exp_a != 0);
        diff = -diff;
    } else {
        if exp_a == 0xff {
            if sig_a != 0u {
                return nan2(a, b);
            }
            return a;
        }
        exp_z = exp_a - 1;
        sig_x = sig_a | 0x40000000u;
        sig_y = sig_b + select(sig_b, 0x40000000u, exp_b != 0);
    }
    return norm_round_pack(sign, exp_z, sig_x - jam(sig_y, u32(diff)));
}

// a + b by the integer routines.
fn soft_add(a: u32, b: u32) -> u32 {
    if is_nan(a) || is_nan(b) {
        return nan2(a, b);
    }
    if ((a ^ b) & SIGN) == 0u {
        return add_mags(a, b);
    }
    return sub_mags(a, b);
}

// The 64-bit product of two words: (low word, high word).
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u), p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

// A finite non-zero value's (exponent, significand), the significand with its leading one at
// bit 23: a normal's biased exponent and mantissa with the implicit one, a subnormal's
// normalized (SoftFloat's normSubnormalF32Sig).
fn unpack(a: u32) -> vec2<i32> {
    let exp = i32((a >> 23u) & 0xffu);
    let sig = a & MANT;
    if exp != 0 {
        return vec2<i32>(exp, i32(sig | 0x00800000u));
    }
    let shift = i32(countLeadingZeros(sig)) - 8;
    return vec2<i32>(1 - shift, i32(sig << u32(shift)));
}

fn is_zero(a: u32) -> bool {
    return (a & 0x7fffffffu) == 0u;
}

// a · b by the integer routines.
fn soft_mul(a: u32, b: u32) -> u32 {
    let sign = (a ^ b) >> 31u;
    if is_nan(a) || is_nan(b) {
        return nan2(a, b);
    }
    if (a & EXPM) == EXPM || (b & EXPM) == EXPM {
        // Infinity times zero is invalid; times anything else, infinity.
        if is_zero(a) || is_zero(b) {
            return DEFAULT_NAN;
        }
        return (sign << 31u) | POS_INF;
    }
    if is_zero(a) || is_zero(b) {
        return sign << 31u;
    }
    let ua = unpack(a);
    let ub = unpack(b);
    var exp_z = ua.x + ub.x - 0x7f;
    let wide = mul_wide(u32(ua.y) << 7u, u32(ub.y) << 8u);
    var sig_z = wide.y | select(0u, 1u, wide.x != 0u);
    if sig_z < 0x40000000u {
        exp_z = exp_z - 1;
        sig_z = sig_z << 1u;
    }
    return round_pack(sign, exp_z, sig_z);
}

// a + b, correctly rounded: the hardware add where it is exact by the rules above, else
// `soft_add`.
fn x_add(a: u32, b: u32) -> u32 {
    let r = bitcast<u32>(bitcast<f32>(a) + bitcast<f32>(b)) ^ opaque_zero;
    let normal_inputs = !is_subnormal(a) && !is_subnormal(b);
    if !SOFT_FLOAT && normal_inputs && big_enough(r) {
        return r;
    }
    // A sum of finite opposites or of zeros is an exact zero; anything else this small, any
    // NaN (∞ − ∞ too: the hardware's NaN is not x86's default NaN) or a subnormal input takes
    // the integer routine.
    let exact_zero = (a ^ b) == SIGN || ((a | b) & 0x7fffffffu) == 0u;
    if !SOFT_FLOAT && normal_inputs && exact_zero && !is_nan(r) {
        return r;
    }
    return soft_add(a, b);
}

fn x_sub(a: u32, b: u32) -> u32 {
    if is_nan(b) {
        // The NaN travels as it is, sign included (negating it first would change its bits).
        return nan2(a, b);
    }
    return x_add(a, b ^ SIGN);
}

// a · b, correctly rounded (see `x_add`).
fn x_mul(a: u32, b: u32) -> u32 {
    let r = bitcast<u32>(bitcast<f32>(a) * bitcast<f32>(b)) ^ opaque_zero;
    let normal_inputs = !is_subnormal(a) && !is_subnormal(b);
    if !SOFT_FLOAT && normal_inputs && big_enough(r) {
        return r;
    }
    // A product with a zero factor is an exact zero (with an infinity it is a NaN: soft).
    let zero_factor = (a & 0x7fffffffu) == 0u || (b & 0x7fffffffu) == 0u;
    if !SOFT_FLOAT && normal_inputs && zero_factor && !is_nan(r) {
        return r;
    }
    return soft_mul(a, b);
}

// A hardware product whose bits only ever feed an estimate (its rounding cannot change a
// result), masked like x_mul's so that no compiler fuses it either.
fn est_mul(a: f32, b: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(a * b) ^ opaque_zero);
}

// A value's magnitude truncated to an integer, read off its bits (a conversion instruction would
// bring a float clamp into the SPIR-V); magnitudes past 2^30, infinities and NaNs give 2^30.
fn trunc_magnitude(x: f32) -> u32 {
    let bits = bitcast<u32>(x) & 0x7fffffffu;
    let e = i32(bits >> 23u) - 127;
    if e < 0 {
        return 0u;
    }
    if e >= 30 {
        return 1u << 30u;
    }
    let m = (bits & MANT) | 0x00800000u;
    if e >= 23 {
        return m << u32(e - 23);
    }
    return m >> u32(23 - e);
}

// floor(n · 2^s / d) for 24-bit significands n, d (leading one at bit 23) and s ∈ {25, 26},
// with the quotient's leading one at bit 25, ORed with 1 << 31 when the division is not exact:
// an estimate from hardware products (1/d by three Newton steps from a crude seed), then the
// exact remainder r = n·2^s − q·d in 64-bit integers, one correction from r, and at most four
// single steps until 0 ≤ r < d. The estimate's accuracy never changes the result, only whether
// this finds it: an estimate too far off (it cannot be, with IEEE products) gives 0, and the
// caller takes long division.
fn quotient_fast(n: u32, d: u32, s: u32) -> u32 {
    let df = f32(d);
    var y = bitcast<f32>(0x7ef311c7u - bitcast<u32>(df));
    for (var i = 0; i < 3; i++) {
        y = est_mul(y, 2.0 - est_mul(df, y));
    }
    let est = est_mul(est_mul(f32(n), y), bitcast<f32>((127u + s) << 23u));
    var q = min(max(trunc_magnitude(est), 1u << 25u), 1u << 26u);
    // r = n·2^s − q·d, 64-bit two's complement.
    let p = mul_wide(q, d);
    let a_lo = n << s;
    let a_hi = n >> (32u - s);
    let lo = a_lo - p.x;
    let hi = a_hi - p.y - select(0u, 1u, a_lo < p.x);
    // |r| < 2^29 (an estimate within 32 of q; the Newton steps leave it within about 12), so
    // the correction c ≈ r / d is at most 64 and c · d cannot wrap.
    if !((hi == 0u && lo < 0x20000000u) || (hi == 0xffffffffu && lo > 0xe0000000u)) {
        return 0u;
    }
    var r = bitcast<i32>(lo);
    let correction = est_mul(f32(r), y);
    let magnitude = trunc_magnitude(correction);
    if magnitude > 64u {
        return 0u;
    }
    let c = select(1, -1, correction < 0.0) * i32(magnitude);
    q = u32(i32(q) + c);
    r = r - c * i32(d);
    for (var i = 0; i < 4 && r < 0; i++) {
        q = q - 1u;
        r = r + i32(d);
    }
    for (var i = 0; i < 4 && r >= i32(d); i++) {
        q = q + 1u;
        r = r - i32(d);
    }
    if r < 0 || r >= i32(d) {
        return 0u;
    }
    return q | select(0u, 0x80000000u, r != 0);
}

// a / b: the quotient of the significands (`quotient_fast`, or SoftFloat's f32_div long
// division, one quotient bit at a time, when that declines), rounded by round_pack.
fn x_div(a: u32, b: u32) -> u32 {
    let sign = (a ^ b) >> 31u;
    if is_nan(a) || is_nan(b) {
        return nan2(a, b);
    }
    if (a & EXPM) == EXPM {
        if (b & EXPM) == EXPM {
            return DEFAULT_NAN;
        }
        return (sign << 31u) | POS_INF;
    }
    if (b & EXPM) == EXPM {
        return sign << 31u;
    }
    if is_zero(b) {
        if is_zero(a) {
            return DEFAULT_NAN;
        }
        return (sign << 31u) | POS_INF;
    }
    if is_zero(a) {
        return sign << 31u;
    }
    let ua = unpack(a);
    let ub = unpack(b);
    let sig_a = u32(ua.y);
    let sig_b = u32(ub.y);
    var exp_z = ua.x - ub.x + 0x7e;
    // q = floor(sig_a · 2^steps / sig_b), with the quotient's leading one at bit 30.
    var steps = 30u;
    if sig_a < sig_b {
        exp_z = exp_z - 1;
        steps = 31u;
    }
    // The same quotient five bits shorter: the bits it drops only decide the sticky bit
    // below round_pack's rounding bit, as does a non-zero remainder.
    let fast = quotient_fast(sig_a, sig_b, steps - 5u);
    if fast != 0u && !SOFT_FLOAT {
        return round_pack(sign, exp_z, ((fast & 0x7fffffffu) << 5u) | (fast >> 31u));
    }
    var q = 0u;
    var rem = sig_a;
    if rem >= sig_b {
        rem = rem - sig_b;
        q = 1u;
    }
    for (var i = 0u; i < steps; i++) {
        rem = rem << 1u;
        q = q << 1u;
        if rem >= sig_b {
            rem = rem - sig_b;
            q = q | 1u;
        }
    }
    q = q | select(0u, 1u, rem != 0u);
    return round_pack(sign, exp_z, q);
}

// √a by the digit-by-digit integer square root of the significand (a square root is never a
// tie, so 25 bits and a sticky bit round it correctly).
fn x_sqrt(a: u32) -> u32 {
    if is_nan(a) {
        return a | QUIET;
    }
    if (a & 0x7fffffffu) == 0u {
        return a;
    }
    if (a & SIGN) != 0u {
        return DEFAULT_NAN;
    }
    if a == POS_INF {
        return a;
    }
    let ua = unpack(a);
    let sig_a = u32(ua.y);
    // a = sig_a · 2^(e − 23) with e = exp_a − 127; the radicand N = sig_a · 2^s has 49 or 50
    // bits and e − 23 − s is even, so √a = √N · 2^((e − 23 − s) / 2).
    let e = ua.x - 127;
    let s = select(25u, 26u, (e & 1) != 0);
    // Feed N two bits at a time from the top: its 50-bit window is sig_a << (s − 24 + 24)...
    // i.e. the pairs of (sig_a << (s − 24)) over 26 bits, then zeros.
    let top = sig_a << (s - 24u); // 25 or 26 bits: N's top 26 bits (the rest are zero)
    var rem = 0u;
    var root = 0u;
    for (var i = 0u; i < 25u; i++) {
        var pair = 0u;
        if i < 13u {
            pair = (top >> (24u - 2u * i)) & 3u;
        }
        rem = (rem << 2u) | pair;
        let trial = (root << 2u) | 1u;
        if rem >= trial {
            rem = rem - trial;
            root = (root << 1u) | 1u;
        } else {
            root = root << 1u;
        }
    }
    // root ∈ [2^24, 2^25): 24 kept bits and the rounding bit, then the sticky bit.
    let sig = (root << 6u) | select(0u, 1u, rem != 0u);
    let exp_z = 150 + (e - 23 - i32(s)) / 2;
    return round_pack(0u, exp_z, sig);
}

// a < b as IEEE compares (false with a NaN; −0 equals +0).
fn x_lt(a: u32, b: u32) -> bool {
    if is_nan(a) || is_nan(b) || ((a | b) & 0x7fffffffu) == 0u {
        return false;
    }
    let neg_a = (a & SIGN) != 0u;
    let neg_b = (b & SIGN) != 0u;
    if neg_a != neg_b {
        return neg_a;
    }
    if neg_a {
        return a > b;
    }
    return a < b;
}

// Rust's f32::max: the other operand when one is a NaN.
fn x_max(a: u32, b: u32) -> u32 {
    if is_nan(a) {
        return b;
    }
    if is_nan(b) {
        return a;
    }
    return select(a, b, x_lt(a, b));
}

// Rust's f32::clamp (a NaN stays a NaN).
fn x_clamp(x: u32, lo: u32, hi: u32) -> u32 {
    var v = x;
    if x_lt(v, lo) {
        v = lo;
    }
    if x_lt(hi, v) {
        v = hi;
    }
    return v;
}

// A small non-negative integer as f32 bits (exact below 2^24).
fn x_from_u32(n: u32) -> u32 {
    return bitcast<u32>(f32(n));
}

// ---- lockstep_luts::mathf ----

const ROUND_MAGIC: u32 = 0x4b400000u;
const LOG2_E: u32 = 0x3fb8aa3bu;
const LN2_HI: u32 = 0x3f317200u;
const LN2_LO: u32 = 0x35bfbe8eu;
const EXP_LO: u32 = 0xc2aea8f6u; // -87.33
const EXP_HI: u32 = 0x42b170a4u; // 88.72
const TANH_LIMIT: u32 = 0x41100000u; // 9
const SQRT_2: u32 = 0x3fb504f3u;
const TWO_POW_24: u32 = 0x4b800000u;
const GELU_C: u32 = 0x3f4c422au;
const GELU_A: u32 = 0x3d372713u;

fn pow2(n: i32) -> u32 {
    return u32(127 + n) << 23u;
}

fn x_exp(x_in: u32) -> u32 {
    let x = x_clamp(x_in, EXP_LO, EXP_HI);
    let shifted = x_add(x_mul(x, LOG2_E), ROUND_MAGIC);
    let n = x_sub(shifted, ROUND_MAGIC);
    let r = x_sub(x_sub(x, x_mul(n, LN2_HI)), x_mul(n, LN2_LO));
    var p = 0x39500d01u;
    p = x_add(x_mul(p, r), 0x3ab60b61u);
    p = x_add(x_mul(p, r), 0x3c088889u);
    p = x_add(x_mul(p, r), 0x3d2aaaabu);
    p = x_add(x_mul(p, r), 0x3e2aaaabu);
    p = x_add(x_mul(p, r), F_HALF);
    p = x_add(x_mul(p, r), F_ONE);
    p = x_add(x_mul(p, r), F_ONE);
    let ni = bitcast<i32>(shifted) - 0x4b400000;
    let half = ni >> 1u;
    return x_mul(x_mul(p, pow2(half)), pow2(ni - half));
}

fn x_tanh(x_in: u32) -> u32 {
    let x = x_clamp(x_in, TANH_LIMIT | SIGN, TANH_LIMIT);
    let e = x_exp(x_mul(F_TWO, x));
    return x_div(x_sub(e, F_ONE), x_add(e, F_ONE));
}

fn x_ln(x_in: u32) -> u32 {
    var x = x_in;
    if is_nan(x) || x_lt(x, 0u) {
        return 0x7fc00000u; // f32::NAN
    }
    if (x & 0x7fffffffu) == 0u {
        return NEG_INF;
    }
    if x == POS_INF {
        return x;
    }
    var extra = 0;
    if (x & EXPM) == 0u {
        x = x_mul(x, TWO_POW_24);
        extra = 24;
    }
    var k = i32((x >> 23u) & 0xffu) - 127 - extra;
    var m = (x & MANT) | F_ONE;
    if x_lt(SQRT_2, m) {
        m = x_mul(m, F_HALF);
        k = k + 1;
    }
    let s = x_div(x_sub(m, F_ONE), x_add(m, F_ONE));
    let s2 = x_mul(s, s);
    var p = 0x3de38e39u;
    p = x_add(x_mul(p, s2), 0x3e124925u);
    p = x_add(x_mul(p, s2), 0x3e4ccccdu);
    p = x_add(x_mul(p, s2), 0x3eaaaaabu);
    p = x_add(x_mul(p, s2), F_ONE);
    let kf = bitcast<u32>(f32(k)); // |k| < 160: exact
    return x_add(x_mul(kf, LN2_HI), x_add(x_mul(x_mul(F_TWO, s), p), x_mul(kf, LN2_LO)));
}

fn x_gelu(x: u32) -> u32 {
    let inner = x_mul(GELU_C, x_add(x, x_mul(GELU_A, x_mul(x_mul(x, x), x))));
    return x_mul(x_mul(F_HALF, x), x_add(F_ONE, x_tanh(inner)));
}

fn x_gelu_grad(x: u32) -> u32 {
    let x2 = x_mul(x, x);
    let inner = x_mul(GELU_C, x_add(x, x_mul(GELU_A, x_mul(x2, x))));
    let t = x_tanh(inner);
    let d_inner = x_mul(GELU_C, x_add(F_ONE, x_mul(x_mul(F_THREE, GELU_A), x2)));
    let left = x_mul(F_HALF, x_add(F_ONE, t));
    let right = x_mul(x_mul(F_HALF, x), x_mul(x_sub(F_ONE, x_mul(t, t)), d_inner));
    return x_add(left, right);
}
