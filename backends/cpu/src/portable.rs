//! The portable path: native integer multiply, the reference epilogue, any CPU.

use lockstep_luts::units::{block_term, canonicalize, flush_partial, BLOCK};

/// One output element from a quantized row of A and one of B (`blocks × BLOCK` quants and
/// `blocks` exponents each).
pub fn element(a_q: &[i8], a_exp: &[i32], b_q: &[i8], b_exp: &[i32]) -> f32 {
    let mut sum = 0.0f32;
    for ((a_block, b_block), (ea, eb)) in
        a_q.chunks_exact(BLOCK).zip(b_q.chunks_exact(BLOCK)).zip(a_exp.iter().zip(b_exp))
    {
        let acc: i32 = a_block.iter().zip(b_block).map(|(&x, &y)| i32::from(x) * i32::from(y)).sum();
        sum = flush_partial(sum + block_term(acc, ea + eb));
    }
    canonicalize(sum)
}

/// `c = a · bᵀ` over the full i8 range, i32 accumulation (wrapping, like the reference).
pub fn gemm_i8(m: usize, n: usize, k: usize, a: &[i8], b: &[i8], c: &mut [i32]) {
    for row in 0..m {
        let a_row = &a[row * k..row * k + k];
        for col in 0..n {
            let b_row = &b[col * k..col * k + k];
            c[row * n + col] =
                a_row.iter().zip(b_row).fold(0i32, |acc, (&x, &y)| acc.wrapping_add(i32::from(x) * i32::from(y)));
        }
    }
}
