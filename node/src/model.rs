//! The GPT-style decoder, forward and backward by hand.
//!
//! Every matrix product — Q/K/V, attention scores, attention × V, output projection, MLP up
//! and down, the LM head, and every product of the backward pass — is one `Gemm::gemm_nt`
//! call (`A · Bᵀ`). Element-wise math is `mathf` and plain f32 in a fixed order; reductions run
//! sequentially in index order.
//!
//! Work is split across the `Gemm`'s lanes (threads): attention by sequence, element-wise
//! maps by element, LayerNorm and the loss by row. Every output element is still computed by
//! exactly one thread with exactly the operations of the sequential code, so the thread count
//! never changes a bit.
//!
//! Pre-LayerNorm blocks: `x += attn(ln1(x))`, `x += mlp(ln2(x))`; final LayerNorm; an untied
//! LM head with bias. Attention is causal multi-head with scale `1/√(head_dim)`. The MLP is
//! `4c` wide with the tanh-approximated GELU.

use std::ops::Range;

use crate::config::VOCAB;
use crate::gemm::{ComputeError, Gemm};
use crate::mathf;
use crate::params::Layout;

const LN_EPS: f32 = f32::from_bits(0x3727_c5ac); // 1e-5

/// Below this many elements a map runs on the calling thread: spawning costs more.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 15;

/// How many threads element-wise work may use.
#[derive(Clone, Copy)]
struct Par {
    threads: usize,
}

impl Par {
    fn parts(&self, items: usize, weight: usize) -> usize {
        if items * weight < PARALLEL_MIN_ELEMENTS {
            1
        } else {
            self.threads.clamp(1, items.max(1))
        }
    }

    /// Runs `f(items, a)` over contiguous ranges of `items`, `a` holding `a_per` elements per
    /// item.
    fn run1<A: Send>(&self, items: usize, a: &mut [A], a_per: usize, f: impl Fn(Range<usize>, &mut [A]) + Sync) {
        let parts = self.parts(items, a_per);
        if parts == 1 {
            return f(0..items, a);
        }
        let per = items.div_ceil(parts);
        rayon::scope(|scope| {
            for (i, chunk) in a.chunks_mut(per * a_per).enumerate() {
                let f = &f;
                scope.spawn(move |_| f(i * per..((i + 1) * per).min(items), chunk));
            }
        });
    }

    /// As [`Par::run1`] with two outputs.
    fn run2<A: Send, B: Send>(
        &self,
        items: usize,
        a: &mut [A],
        a_per: usize,
        b: &mut [B],
        b_per: usize,
        f: impl Fn(Range<usize>, &mut [A], &mut [B]) + Sync,
    ) {
        let parts = self.parts(items, a_per);
        if parts == 1 {
            return f(0..items, a, b);
        }
        let per = items.div_ceil(parts);
        rayon::scope(|scope| {
            for (i, (ca, cb)) in a.chunks_mut(per * a_per).zip(b.chunks_mut(per * b_per)).enumerate() {
                let f = &f;
                scope.spawn(move |_| f(i * per..((i + 1) * per).min(items), ca, cb));
            }
        });
    }

    /// As [`Par::run1`] with three outputs.
    #[allow(clippy::too_many_arguments)]
    fn run3<A: Send, B: Send, C: Send>(
        &self,
        items: usize,
        a: &mut [A],
        a_per: usize,
        b: &mut [B],
        b_per: usize,
        c: &mut [C],
        c_per: usize,
        f: impl Fn(Range<usize>, &mut [A], &mut [B], &mut [C]) + Sync,
    ) {
        let parts = self.parts(items, a_per);
        if parts == 1 {
            return f(0..items, a, b, c);
        }
        let per = items.div_ceil(parts);
        rayon::scope(|scope| {
            let chunks = a.chunks_mut(per * a_per).zip(b.chunks_mut(per * b_per)).zip(c.chunks_mut(per * c_per));
            for (i, ((ca, cb), cc)) in chunks.enumerate() {
                let f = &f;
                scope.spawn(move |_| f(i * per..((i + 1) * per).min(items), ca, cb, cc));
            }
        });
    }
}

/// Runs `f(lane, batch range)` for contiguous ranges of the batch, one lane (thread) each,
/// and returns the first error.
fn per_lane<F>(gemm: &mut dyn Gemm, batch: usize, f: F) -> Result<(), ComputeError>
where
    F: Fn(&mut dyn Gemm, Range<usize>) -> Result<(), ComputeError> + Sync,
{
    let mut lanes = gemm.lanes();
    let parts = lanes.len().clamp(1, batch.max(1));
    if parts == 1 {
        return f(lanes.swap_remove(0), 0..batch);
    }
    let per = batch.div_ceil(parts);
    let first_error = std::sync::Mutex::new(None);
    rayon::scope(|scope| {
        for (i, lane) in lanes.into_iter().take(parts).enumerate() {
            let (f, first_error) = (&f, &first_error);
            scope.spawn(move |_| {
                if let Err(error) = f(lane, i * per..((i + 1) * per).min(batch)) {
                    first_error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(error);
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// A raw pointer that may cross into the scoped threads of [`per_lane`]; each thread writes a
/// disjoint part (its own sequences) of the buffer it points into.
#[derive(Clone, Copy)]
struct SharedMut<T>(*mut T, usize);

// SAFETY: used only inside `per_lane`, whose threads write disjoint index ranges and end
// before the buffer is touched again.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    fn new(slice: &mut [T]) -> Self {
        Self(slice.as_mut_ptr(), slice.len())
    }

    /// The sub-slice `range`.
    ///
    /// # Safety
    /// No two live sub-slices may overlap, and the buffer must outlive them.
    #[allow(clippy::mut_from_ref)]
    unsafe fn part(&self, range: Range<usize>) -> &mut [T] {
        assert!(range.start <= range.end && range.end <= self.1);
        // SAFETY: in bounds (asserted); disjointness and lifetime are the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(range.start), range.len()) }
    }
}

/// `src` (`rows × cols`) transposed into `out`, split across threads by output row.
fn transpose_into(par: Par, src: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    assert!(src.len() == rows * cols && out.len() == rows * cols);
    par.run1(cols, out, rows, |range, out| transpose_part(src, rows, cols, range, out));
}

/// Output rows `range` (columns of `src`) of the transpose, through 8 × 8 tiles: in AVX
/// registers where the CPU has AVX (pure data movement, no arithmetic), else scalar.
fn transpose_part(src: &[f32], rows: usize, cols: usize, range: Range<usize>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is present.
        return unsafe { transpose_part_avx(src, rows, cols, range, out) };
    }
    transpose_part_scalar(src, rows, cols, range, out)
}

fn transpose_part_scalar(src: &[f32], rows: usize, cols: usize, range: Range<usize>, out: &mut [f32]) {
    let first = range.start;
    for c in range {
        for r in 0..rows {
            out[(c - first) * rows + r] = src[r * cols + c];
        }
    }
}

/// # Safety
/// The CPU must support AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_part_avx(src: &[f32], rows: usize, cols: usize, range: Range<usize>, out: &mut [f32]) {
    use std::arch::x86_64::*;
    const T: usize = 8;
    assert!(src.len() >= rows * cols && out.len() >= range.len() * rows && range.end <= cols);
    let first = range.start;
    let mut c0 = range.start;
    while c0 + T <= range.end {
        let mut r0 = 0;
        while r0 + T <= rows {
            // SAFETY: rows r0..r0+8 and columns c0..c0+8 are inside `src`; output rows
            // c0..c0+8 (relative to `first`) and columns r0..r0+8 are inside `out` (asserted
            // above). Loads and stores are unaligned.
            unsafe {
                let load = |i: usize| _mm256_loadu_ps(src.as_ptr().add((r0 + i) * cols + c0));
                let (a0, a1, a2, a3, a4, a5, a6, a7) =
                    (load(0), load(1), load(2), load(3), load(4), load(5), load(6), load(7));
                let t0 = _mm256_unpacklo_ps(a0, a1);
                let t1 = _mm256_unpackhi_ps(a0, a1);
                let t2 = _mm256_unpacklo_ps(a2, a3);
                let t3 = _mm256_unpackhi_ps(a2, a3);
                let t4 = _mm256_unpacklo_ps(a4, a5);
                let t5 = _mm256_unpackhi_ps(a4, a5);
                let t6 = _mm256_unpacklo_ps(a6, a7);
                let t7 = _mm256_unpackhi_ps(a6, a7);
                let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let u1 = _mm256_shuffle_ps::<0xee>(t0, t2);
                let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let u3 = _mm256_shuffle_ps::<0xee>(t1, t3);
                let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let u5 = _mm256_shuffle_ps::<0xee>(t4, t6);
                let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let u7 = _mm256_shuffle_ps::<0xee>(t5, t7);
                let rows_out = [
                    _mm256_permute2f128_ps::<0x20>(u0, u4),
                    _mm256_permute2f128_ps::<0x20>(u1, u5),
                    _mm256_permute2f128_ps::<0x20>(u2, u6),
                    _mm256_permute2f128_ps::<0x20>(u3, u7),
                    _mm256_permute2f128_ps::<0x31>(u0, u4),
                    _mm256_permute2f128_ps::<0x31>(u1, u5),
                    _mm256_permute2f128_ps::<0x31>(u2, u6),
                    _mm256_permute2f128_ps::<0x31>(u3, u7),
                ];
                for (j, v) in rows_out.into_iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add((c0 + j - first) * rows + r0), v);
                }
            }
            r0 += T;
        }
        for r in r0..rows {
            for j in 0..T {
                out[(c0 + j - first) * rows + r] = src[r * cols + c0 + j];
            }
        }
        c0 += T;
    }
    transpose_part_scalar(src, rows, cols, c0..range.end, &mut out[(c0 - first) * rows..]);
}

/// `src` (`rows × cols`) transposed.
#[cfg(test)]
pub(crate) fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; rows * cols];
    transpose_into(Par { threads: 1 }, src, rows, cols, &mut out);
    out
}

/// `y = x · Wᵀ + b` for `x` `[n, inp]`, `W` `[out, inp]`.
fn linear(
    gemm: &mut dyn Gemm,
    x: &[f32],
    n: usize,
    inp: usize,
    w: &[f32],
    b: &[f32],
    out: usize,
) -> Result<Vec<f32>, ComputeError> {
    let mut y = vec![0.0; n * out];
    gemm.gemm_nt(n, out, inp, x, w, &mut y)?;
    for row in y.chunks_exact_mut(out) {
        for (v, bias) in row.iter_mut().zip(b) {
            *v += bias;
        }
    }
    Ok(y)
}

/// Backward of [`linear`]: returns `dx`, writes `dW` (which must be zero) and accumulates
/// `db`.
#[allow(clippy::too_many_arguments)]
fn linear_backward(
    gemm: &mut dyn Gemm,
    par: Par,
    x: &[f32],
    n: usize,
    inp: usize,
    w: &[f32],
    out: usize,
    dy: &[f32],
    dw: &mut [f32],
    db: &mut [f32],
) -> Result<Vec<f32>, ComputeError> {
    // dx = dy · W  =  dy · (Wᵀ)ᵀ
    let mut wt = vec![0.0; out * inp];
    transpose_into(par, w, out, inp, &mut wt);
    let mut dx = vec![0.0; n * inp];
    gemm.gemm_nt(n, inp, out, dy, &wt, &mut dx)?;
    // dW = dyᵀ · x  =  (dyᵀ) · (xᵀ)ᵀ, straight into the gradient (each weight has one term).
    let mut dyt = vec![0.0; n * out];
    transpose_into(par, dy, n, out, &mut dyt);
    let mut xt = vec![0.0; n * inp];
    transpose_into(par, x, n, inp, &mut xt);
    gemm.gemm_nt(out, inp, n, &dyt, &xt, dw)?;
    for row in dy.chunks_exact(out) {
        for (acc, g) in db.iter_mut().zip(row) {
            *acc += g;
        }
    }
    Ok(dx)
}

/// LayerNorm over rows of `c`: returns `(y, xhat, rstd)`.
fn layer_norm(par: Par, x: &[f32], c: usize, g: &[f32], b: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / c;
    let mut y = vec![0.0; x.len()];
    let mut xhat = vec![0.0; x.len()];
    let mut rstds = vec![0.0; rows];
    par.run3(rows, &mut y, c, &mut xhat, c, &mut rstds, 1, |range, y, xhat, rstds| {
        let first = range.start;
        for r in range {
            let row = &x[r * c..(r + 1) * c];
            let mut sum = 0.0f32;
            for v in row {
                sum += v;
            }
            let mean = sum / c as f32;
            let mut var = 0.0f32;
            for v in row {
                let d = v - mean;
                var += d * d;
            }
            let rstd = 1.0 / (var / c as f32 + LN_EPS).sqrt();
            let local = r - first;
            for j in 0..c {
                let h = (row[j] - mean) * rstd;
                xhat[local * c + j] = h;
                y[local * c + j] = h * g[j] + b[j];
            }
            rstds[local] = rstd;
        }
    });
    (y, xhat, rstds)
}

/// Backward of [`layer_norm`]: returns `dx`, accumulates `dg`, `db` (sequentially over rows).
#[allow(clippy::too_many_arguments)]
fn layer_norm_backward(
    par: Par,
    dy: &[f32],
    xhat: &[f32],
    rstd: &[f32],
    c: usize,
    g: &[f32],
    dg: &mut [f32],
    db: &mut [f32],
) -> Vec<f32> {
    let rows = rstd.len();
    let mut dx = vec![0.0; dy.len()];
    par.run1(rows, &mut dx, c, |range, dx| {
        let first = range.start;
        let mut dxhat = vec![0.0f32; c];
        for r in range {
            let dy_row = &dy[r * c..(r + 1) * c];
            let xh = &xhat[r * c..(r + 1) * c];
            let mut mean1 = 0.0f32;
            let mut mean2 = 0.0f32;
            for j in 0..c {
                dxhat[j] = dy_row[j] * g[j];
                mean1 += dxhat[j];
                mean2 += dxhat[j] * xh[j];
            }
            mean1 /= c as f32;
            mean2 /= c as f32;
            for j in 0..c {
                dx[(r - first) * c + j] = (dxhat[j] - mean1 - xh[j] * mean2) * rstd[r];
            }
        }
    });
    for r in 0..rows {
        let dy_row = &dy[r * c..(r + 1) * c];
        let xh = &xhat[r * c..(r + 1) * c];
        for j in 0..c {
            dg[j] += dy_row[j] * xh[j];
            db[j] += dy_row[j];
        }
    }
    dx
}

/// `out[i] = f(a[i], b[i])`, compiled for AVX2 when the CPU has it so the loop runs eight
/// lanes wide. The same IEEE operations in the same order either way (Rust never contracts
/// into FMAs), so the bits do not depend on the instruction set.
#[inline(always)]
fn zip_map(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn wide(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = f(x, y);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present.
        return unsafe { wide(a, b, out, f) };
    }
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

/// `v[i] = f(v[i])`, AVX2-wide where available (see [`zip_map`]).
#[inline(always)]
fn map_in_place(v: &mut [f32], f: impl Fn(f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn wide(v: &mut [f32], f: impl Fn(f32) -> f32) {
        for x in v.iter_mut() {
            *x = f(*x);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present.
        return unsafe { wide(v, f) };
    }
    for x in v.iter_mut() {
        *x = f(*x);
    }
}

/// Element-wise `out[i] = f(src[i])`, split across threads.
fn map(par: Par, src: &[f32], f: impl Fn(f32) -> f32 + Sync + Copy) -> Vec<f32> {
    let mut out = vec![0.0; src.len()];
    par.run1(src.len(), &mut out, 1, |range, out| zip_map(&src[range.clone()], &src[range], out, |x, _| f(x)));
    out
}

/// Row-wise causal softmax of scaled scores, in place: entries right of the diagonal are 0.
fn causal_softmax(scores: &mut [f32], t: usize, scale: f32) {
    for i in 0..t {
        let row = &mut scores[i * t..(i + 1) * t];
        let mut max = f32::NEG_INFINITY;
        for v in row.iter_mut().take(i + 1) {
            *v *= scale;
            max = max.max(*v);
        }
        let live = &mut row[..=i];
        map_in_place(live, |v| mathf::exp(v - max));
        let mut sum = 0.0f32;
        for v in live.iter() {
            sum += *v;
        }
        for v in row.iter_mut().take(i + 1) {
            *v /= sum;
        }
        row[i + 1..].fill(0.0);
    }
}

/// The attention of sequences `range`: reads their rows of `qkv`, writes their probabilities
/// and their rows of `att`.
#[allow(clippy::too_many_arguments)]
fn attention_forward(
    gemm: &mut dyn Gemm,
    range: Range<usize>,
    qkv: &[f32],
    seq: usize,
    c: usize,
    heads: usize,
    probs: SharedMut<f32>,
    att: SharedMut<f32>,
) -> Result<(), ComputeError> {
    let hd = c / heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut q = vec![0.0f32; seq * hd];
    let mut k = vec![0.0f32; seq * hd];
    let mut vt = vec![0.0f32; hd * seq];
    let mut o = vec![0.0f32; seq * hd];
    for b in range {
        // SAFETY: sequence `b` belongs to this call alone (per_lane splits sequences).
        let att = unsafe { att.part(b * seq * c..(b + 1) * seq * c) };
        for h in 0..heads {
            for i in 0..seq {
                let row = &qkv[(b * seq + i) * 3 * c..][..3 * c];
                q[i * hd..(i + 1) * hd].copy_from_slice(&row[h * hd..(h + 1) * hd]);
                k[i * hd..(i + 1) * hd].copy_from_slice(&row[c + h * hd..c + (h + 1) * hd]);
                for d in 0..hd {
                    vt[d * seq + i] = row[2 * c + h * hd + d];
                }
            }
            let start = (b * heads + h) * seq * seq;
            // SAFETY: as above; each (sequence, head) block is written by one call.
            let p = unsafe { probs.part(start..start + seq * seq) };
            gemm.gemm_nt(seq, seq, hd, &q, &k, p)?;
            causal_softmax(p, seq, scale);
            gemm.gemm_nt(seq, hd, seq, p, &vt, &mut o)?;
            for i in 0..seq {
                att[i * c + h * hd..][..hd].copy_from_slice(&o[i * hd..(i + 1) * hd]);
            }
        }
    }
    Ok(())
}

/// Backward of [`attention_forward`] for sequences `range`: writes their rows of `dqkv`.
#[allow(clippy::too_many_arguments)]
fn attention_backward(
    gemm: &mut dyn Gemm,
    range: Range<usize>,
    qkv: &[f32],
    probs: &[f32],
    datt: &[f32],
    seq: usize,
    c: usize,
    heads: usize,
    dqkv: SharedMut<f32>,
) -> Result<(), ComputeError> {
    let hd = c / heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut q = vec![0.0f32; seq * hd];
    let mut qt = vec![0.0f32; hd * seq];
    let mut k = vec![0.0f32; seq * hd];
    let mut kt = vec![0.0f32; hd * seq];
    let mut v = vec![0.0f32; seq * hd];
    let mut d_o = vec![0.0f32; seq * hd];
    let mut d_ot = vec![0.0f32; hd * seq];
    let mut dp = vec![0.0f32; seq * seq];
    let mut pt = vec![0.0f32; seq * seq];
    let mut ds = vec![0.0f32; seq * seq];
    let mut dst = vec![0.0f32; seq * seq];
    let mut dq = vec![0.0f32; seq * hd];
    let mut dk = vec![0.0f32; seq * hd];
    let mut dv = vec![0.0f32; seq * hd];
    let single = Par { threads: 1 };
    for b in range {
        // SAFETY: sequence `b` belongs to this call alone (per_lane splits sequences).
        let dqkv = unsafe { dqkv.part(b * seq * 3 * c..(b + 1) * seq * 3 * c) };
        for h in 0..heads {
            for i in 0..seq {
                let row = &qkv[(b * seq + i) * 3 * c..][..3 * c];
                for d in 0..hd {
                    let (qv, kv, vv) = (row[h * hd + d], row[c + h * hd + d], row[2 * c + h * hd + d]);
                    q[i * hd + d] = qv;
                    qt[d * seq + i] = qv;
                    k[i * hd + d] = kv;
                    kt[d * seq + i] = kv;
                    v[i * hd + d] = vv;
                    let g = datt[(b * seq + i) * c + h * hd + d];
                    d_o[i * hd + d] = g;
                    d_ot[d * seq + i] = g;
                }
            }
            let p = &probs[(b * heads + h) * seq * seq..][..seq * seq];
            // dP = dO · Vᵀ
            gemm.gemm_nt(seq, seq, hd, &d_o, &v, &mut dp)?;
            // dV = Pᵀ · dO
            transpose_into(single, p, seq, seq, &mut pt);
            gemm.gemm_nt(seq, hd, seq, &pt, &d_ot, &mut dv)?;
            // dS = P ⊙ (dP − rowsum(P ⊙ dP)), times the score scale.
            for i in 0..seq {
                let mut dot = 0.0f32;
                for j in 0..=i {
                    dot += p[i * seq + j] * dp[i * seq + j];
                }
                for j in 0..=i {
                    ds[i * seq + j] = p[i * seq + j] * (dp[i * seq + j] - dot) * scale;
                }
                ds[i * seq + i + 1..(i + 1) * seq].fill(0.0);
            }
            // dQ = dS · K,  dK = dSᵀ · Q
            gemm.gemm_nt(seq, hd, seq, &ds, &kt, &mut dq)?;
            transpose_into(single, &ds, seq, seq, &mut dst);
            gemm.gemm_nt(seq, hd, seq, &dst, &qt, &mut dk)?;
            for i in 0..seq {
                let row = &mut dqkv[i * 3 * c..(i + 1) * 3 * c];
                row[h * hd..(h + 1) * hd].copy_from_slice(&dq[i * hd..(i + 1) * hd]);
                row[c + h * hd..c + (h + 1) * hd].copy_from_slice(&dk[i * hd..(i + 1) * hd]);
                row[2 * c + h * hd..2 * c + (h + 1) * hd].copy_from_slice(&dv[i * hd..(i + 1) * hd]);
            }
        }
    }
    Ok(())
}

/// What the backward pass needs from one block's forward pass.
struct LayerCache {
    ln1_xhat: Vec<f32>,
    ln1_rstd: Vec<f32>,
    h1: Vec<f32>,
    qkv: Vec<f32>,
    /// Attention probabilities, `[batch][head][t][t]`.
    probs: Vec<f32>,
    att: Vec<f32>,
    ln2_xhat: Vec<f32>,
    ln2_rstd: Vec<f32>,
    h2: Vec<f32>,
    u: Vec<f32>,
    gelu: Vec<f32>,
}

/// The forward pass's results.
pub struct Forward {
    batch: usize,
    seq: usize,
    tokens: Vec<u8>,
    layers: Vec<LayerCache>,
    lnf_xhat: Vec<f32>,
    lnf_rstd: Vec<f32>,
    hf: Vec<f32>,
    /// `[batch · seq, 256]`.
    pub logits: Vec<f32>,
}

/// The model: a layout plus the code that runs it.
pub struct Model {
    pub layout: Layout,
}

impl Model {
    pub fn new(layout: Layout) -> Self {
        Self { layout }
    }

    /// Runs `batch` sequences of `seq ≤ context` tokens.
    pub fn forward(
        &self,
        gemm: &mut dyn Gemm,
        w: &[f32],
        tokens: &[u8],
        batch: usize,
        seq: usize,
    ) -> Result<Forward, ComputeError> {
        let cfg = self.layout.config;
        assert!(seq >= 1 && seq <= cfg.context, "sequence length {seq} outside 1..={}", cfg.context);
        assert_eq!(tokens.len(), batch * seq);
        assert_eq!(w.len(), self.layout.len);
        let (c, heads) = (cfg.width, cfg.heads);
        let n = batch * seq;
        let l = &self.layout;
        let par = Par { threads: gemm.lanes().len() };

        let mut x = vec![0.0f32; n * c];
        for (row, &tok) in tokens.iter().enumerate() {
            let pos = row % seq;
            let te = &w[l.tok_emb.start + tok as usize * c..][..c];
            let pe = &w[l.pos_emb.start + pos * c..][..c];
            for j in 0..c {
                x[row * c + j] = te[j] + pe[j];
            }
        }

        let mut layers = Vec::with_capacity(cfg.layers);
        for lo in &l.layers {
            let (h1, ln1_xhat, ln1_rstd) = layer_norm(par, &x, c, &w[lo.ln1_g.clone()], &w[lo.ln1_b.clone()]);
            let qkv = linear(gemm, &h1, n, c, &w[lo.qkv_w.clone()], &w[lo.qkv_b.clone()], 3 * c)?;
            let mut probs = vec![0.0f32; batch * heads * seq * seq];
            let mut att = vec![0.0f32; n * c];
            let (probs_out, att_out) = (SharedMut::new(&mut probs), SharedMut::new(&mut att));
            per_lane(gemm, batch, |lane, range| {
                attention_forward(lane, range, &qkv, seq, c, heads, probs_out, att_out)
            })?;
            let proj = linear(gemm, &att, n, c, &w[lo.proj_w.clone()], &w[lo.proj_b.clone()], c)?;
            for (xv, pv) in x.iter_mut().zip(&proj) {
                *xv += pv;
            }
            let (h2, ln2_xhat, ln2_rstd) = layer_norm(par, &x, c, &w[lo.ln2_g.clone()], &w[lo.ln2_b.clone()]);
            let u = linear(gemm, &h2, n, c, &w[lo.fc_w.clone()], &w[lo.fc_b.clone()], 4 * c)?;
            let gelu = map(par, &u, mathf::gelu);
            let m = linear(gemm, &gelu, n, 4 * c, &w[lo.fc2_w.clone()], &w[lo.fc2_b.clone()], c)?;
            for (xv, mv) in x.iter_mut().zip(&m) {
                *xv += mv;
            }
            layers.push(LayerCache { ln1_xhat, ln1_rstd, h1, qkv, probs, att, ln2_xhat, ln2_rstd, h2, u, gelu });
        }
        let (hf, lnf_xhat, lnf_rstd) = layer_norm(par, &x, c, &w[l.lnf_g.clone()], &w[l.lnf_b.clone()]);
        let logits = linear(gemm, &hf, n, c, &w[l.head_w.clone()], &w[l.head_b.clone()], VOCAB)?;
        Ok(Forward { batch, seq, tokens: tokens.to_vec(), layers, lnf_xhat, lnf_rstd, hf, logits })
    }

    /// Mean cross-entropy of next-token prediction and the gradient of every weight.
    pub fn loss_and_grad(
        &self,
        gemm: &mut dyn Gemm,
        w: &[f32],
        tokens: &[u8],
        targets: &[u8],
        batch: usize,
        seq: usize,
    ) -> Result<(f32, Vec<f32>), ComputeError> {
        let fwd = self.forward(gemm, w, tokens, batch, seq)?;
        let par = Par { threads: gemm.lanes().len() };
        let (loss, dlogits) = cross_entropy_par(par, &fwd.logits, targets);
        let grads = self.backward(gemm, w, &fwd, &dlogits)?;
        Ok((loss, grads))
    }

    /// Mean cross-entropy without gradients (evaluation).
    pub fn loss(
        &self,
        gemm: &mut dyn Gemm,
        w: &[f32],
        tokens: &[u8],
        targets: &[u8],
        batch: usize,
        seq: usize,
    ) -> Result<f32, ComputeError> {
        let fwd = self.forward(gemm, w, tokens, batch, seq)?;
        Ok(cross_entropy(&fwd.logits, targets).0)
    }

    fn backward(
        &self,
        gemm: &mut dyn Gemm,
        w: &[f32],
        fwd: &Forward,
        dlogits: &[f32],
    ) -> Result<Vec<f32>, ComputeError> {
        let cfg = self.layout.config;
        let (c, heads) = (cfg.width, cfg.heads);
        let (batch, seq) = (fwd.batch, fwd.seq);
        let n = batch * seq;
        let l = &self.layout;
        let par = Par { threads: gemm.lanes().len() };
        let mut grads = vec![0.0f32; l.len];

        let (dw, db) = split_grads(&mut grads, l.head_w.clone(), l.head_b.clone());
        let dhf = linear_backward(gemm, par, &fwd.hf, n, c, &w[l.head_w.clone()], VOCAB, dlogits, dw, db)?;
        let (dg, db) = split_grads(&mut grads, l.lnf_g.clone(), l.lnf_b.clone());
        let mut dx = layer_norm_backward(par, &dhf, &fwd.lnf_xhat, &fwd.lnf_rstd, c, &w[l.lnf_g.clone()], dg, db);

        for (lo, cache) in l.layers.iter().zip(&fwd.layers).rev() {
            // x = x_mid + mlp(ln2(x_mid))
            let (dw, db) = split_grads(&mut grads, lo.fc2_w.clone(), lo.fc2_b.clone());
            let dgelu = linear_backward(gemm, par, &cache.gelu, n, 4 * c, &w[lo.fc2_w.clone()], c, &dx, dw, db)?;
            let mut du = vec![0.0f32; dgelu.len()];
            par.run1(du.len(), &mut du, 1, |range, out| {
                zip_map(&dgelu[range.clone()], &cache.u[range], out, |d, u| d * mathf::gelu_grad(u));
            });
            let (dw, db) = split_grads(&mut grads, lo.fc_w.clone(), lo.fc_b.clone());
            let dh2 = linear_backward(gemm, par, &cache.h2, n, c, &w[lo.fc_w.clone()], 4 * c, &du, dw, db)?;
            let (dg, db) = split_grads(&mut grads, lo.ln2_g.clone(), lo.ln2_b.clone());
            let dmid =
                layer_norm_backward(par, &dh2, &cache.ln2_xhat, &cache.ln2_rstd, c, &w[lo.ln2_g.clone()], dg, db);
            for (d, m) in dx.iter_mut().zip(&dmid) {
                *d += m;
            }

            // x_mid = x_in + proj(attn(ln1(x_in)))
            let (dw, db) = split_grads(&mut grads, lo.proj_w.clone(), lo.proj_b.clone());
            let datt = linear_backward(gemm, par, &cache.att, n, c, &w[lo.proj_w.clone()], c, &dx, dw, db)?;
            let mut dqkv = vec![0.0f32; n * 3 * c];
            let dqkv_out = SharedMut::new(&mut dqkv);
            per_lane(gemm, batch, |lane, range| {
                attention_backward(lane, range, &cache.qkv, &cache.probs, &datt, seq, c, heads, dqkv_out)
            })?;
            let (dw, db) = split_grads(&mut grads, lo.qkv_w.clone(), lo.qkv_b.clone());
            let dh1 = linear_backward(gemm, par, &cache.h1, n, c, &w[lo.qkv_w.clone()], 3 * c, &dqkv, dw, db)?;
            let (dg, db) = split_grads(&mut grads, lo.ln1_g.clone(), lo.ln1_b.clone());
            let din = layer_norm_backward(par, &dh1, &cache.ln1_xhat, &cache.ln1_rstd, c, &w[lo.ln1_g.clone()], dg, db);
            for (d, i) in dx.iter_mut().zip(&din) {
                *d += i;
            }
        }

        // Embeddings: scatter-add in row order.
        for (row, &tok) in fwd.tokens.iter().enumerate() {
            let pos = row % seq;
            let d = &dx[row * c..(row + 1) * c];
            for j in 0..c {
                grads[l.tok_emb.start + tok as usize * c + j] += d[j];
            }
            for j in 0..c {
                grads[l.pos_emb.start + pos * c + j] += d[j];
            }
        }
        Ok(grads)
    }
}

/// Two disjoint gradient slices (a weight and its bias, or a gain and its bias).
fn split_grads(grads: &mut [f32], first: Range<usize>, second: Range<usize>) -> (&mut [f32], &mut [f32]) {
    assert!(first.end <= second.start, "tensors are laid out in order");
    let (head, tail) = grads.split_at_mut(second.start);
    (&mut head[first], &mut tail[..second.len()])
}

/// One row of the cross-entropy: writes `softmax − onehot` scaled by `inv_rows` into `d` and
/// returns the row's loss.
fn cross_entropy_row(row: &[f32], target: u8, inv_rows: f32, d: &mut [f32]) -> f32 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0.0f32;
    for (dv, &v) in d.iter_mut().zip(row) {
        *dv = mathf::exp(v - max);
        sum += *dv;
    }
    let loss = (mathf::ln(sum) + max) - row[target as usize];
    for dv in d.iter_mut() {
        *dv = *dv / sum * inv_rows;
    }
    d[target as usize] -= inv_rows;
    loss
}

/// Mean cross-entropy over rows and its gradient with respect to the logits.
pub fn cross_entropy(logits: &[f32], targets: &[u8]) -> (f32, Vec<f32>) {
    cross_entropy_par(Par { threads: 1 }, logits, targets)
}

/// [`cross_entropy`] with rows split across threads; the loss is summed in row order.
fn cross_entropy_par(par: Par, logits: &[f32], targets: &[u8]) -> (f32, Vec<f32>) {
    let rows = targets.len();
    assert_eq!(logits.len(), rows * VOCAB);
    let mut dlogits = vec![0.0f32; logits.len()];
    let mut losses = vec![0.0f32; rows];
    let inv_rows = 1.0 / rows as f32;
    par.run2(rows, &mut dlogits, VOCAB, &mut losses, 1, |range, d, losses| {
        let first = range.start;
        for r in range {
            let local = r - first;
            losses[local] = cross_entropy_row(
                &logits[r * VOCAB..(r + 1) * VOCAB],
                targets[r],
                inv_rows,
                &mut d[local * VOCAB..(local + 1) * VOCAB],
            );
        }
    });
    let mut total = 0.0f32;
    for loss in &losses {
        total += loss;
    }
    (total * inv_rows, dlogits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::gemm::FloatGemm;
    use crate::params::init;

    /// Central differences on the float path: the hand-written backward pass agrees with the
    /// loss it differentiates, for weights of every kind.
    #[test]
    fn backward_matches_finite_differences() {
        let cfg = ModelConfig { width: 16, context: 8, layers: 2, heads: 2 };
        let model = Model::new(Layout::new(cfg));
        let mut w = init(&model.layout, 3);
        // Perturb gains and biases away from 1 and 0 so their gradients are generic.
        let mut rng = lockstep_luts::rng::SplitMix64::new(9);
        for v in &mut w {
            *v += rng.next_signed_unit() * 0.05;
        }
        let (batch, seq) = (2, 8);
        let tokens: Vec<u8> = (0..batch * seq).map(|i| (i * 37 % 251) as u8).collect();
        let targets: Vec<u8> = (0..batch * seq).map(|i| (i * 91 % 253) as u8).collect();
        let mut gemm = FloatGemm::default();
        let (_, grads) = model.loss_and_grad(&mut gemm, &w, &tokens, &targets, batch, seq).unwrap();

        let l = &model.layout;
        let lo = &l.layers[1];
        let probes = [
            l.tok_emb.start + tokens[3] as usize * 16 + 5,
            l.pos_emb.start + 2 * 16 + 7,
            l.layers[0].ln1_g.start + 3,
            l.layers[0].qkv_w.start + 5,           // a query weight
            l.layers[0].qkv_w.start + 16 * 16 + 9, // a key weight
            l.layers[0].qkv_w.start + 40 * 16 + 1, // a value weight
            l.layers[0].qkv_b.start + 20,
            lo.proj_w.start + 33,
            lo.ln2_b.start + 4,
            lo.fc_w.start + 100,
            lo.fc_b.start + 7,
            lo.fc2_w.start + 77,
            l.lnf_g.start + 11,
            l.head_w.start + targets[0] as usize * 16 + 2,
            l.head_b.start + targets[1] as usize,
        ];
        for &index in &probes {
            let h = 1e-2f32;
            let mut plus = w.clone();
            plus[index] += h;
            let mut minus = w.clone();
            minus[index] -= h;
            let lp = model.loss(&mut gemm, &plus, &tokens, &targets, batch, seq).unwrap();
            let lm = model.loss(&mut gemm, &minus, &tokens, &targets, batch, seq).unwrap();
            let numeric = (f64::from(lp) - f64::from(lm)) / (2.0 * f64::from(h));
            let analytic = f64::from(grads[index]);
            let tolerance = 2e-3 + 0.05 * analytic.abs().max(numeric.abs());
            assert!(
                (numeric - analytic).abs() <= tolerance,
                "weight {index}: analytic {analytic:e} vs numeric {numeric:e}"
            );
        }
    }

    #[test]
    fn transpose_handles_every_edge() {
        for (rows, cols) in [(1, 1), (3, 5), (8, 8), (9, 17), (16, 3), (33, 40), (64, 130), (200, 72)] {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let mut t = vec![0.0; rows * cols];
            transpose_into(Par { threads: 3 }, &src, rows, cols, &mut t);
            assert_eq!(t, transpose(&src, rows, cols));
            let mut scalar = vec![0.0; rows * cols];
            transpose_part_scalar(&src, rows, cols, 0..cols, &mut scalar);
            assert_eq!(t, scalar);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(t[c * rows + r], src[r * cols + c], "{rows}x{cols} at {r},{c}");
                }
            }
        }
    }

    #[test]
    fn cross_entropy_of_uniform_logits_is_ln_256() {
        let logits = vec![0.5f32; 3 * VOCAB];
        let (loss, d) = cross_entropy(&logits, &[1, 2, 3]);
        assert!((loss - 256f32.ln()).abs() < 1e-5, "{loss}");
        let row_sum: f32 = d[..VOCAB].iter().sum();
        assert!(row_sum.abs() < 1e-6);
    }
}
