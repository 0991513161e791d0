// What the tiled unit kernels (gemm_units.wgsl, gemm_tc.wgsl) share beyond gemm_common.wgsl:
// the test of one block's exponents for an invocation's TM rows and TN columns.

// Whether every exponent sum `xa[i] + xb[j]` of the block lies in [-126, 108], where each term
// `f32(acc) * 2^s` is an exact normal f32 or +0 (gemm_units.wgsl says why that makes the fast
// epilogue exact).
fn fast_range(xa: array<i32, TM>, xb: array<i32, TN>) -> bool {
    var a_lo = xa[0];
    var a_hi = xa[0];
    for (var i = 1u; i < TM; i++) {
        a_lo = min(a_lo, xa[i]);
        a_hi = max(a_hi, xa[i]);
    }
    var b_lo = xb[0];
    var b_hi = xb[0];
    for (var j = 1u; j < TN; j++) {
        b_lo = min(b_lo, xb[j]);
        b_hi = max(b_hi, xb[j]);
    }
    return a_lo + b_lo >= -126 && a_hi + b_hi <= 108;
}
