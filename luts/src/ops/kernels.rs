//! The slice kernels: the ops' arithmetic on plain slices, for whatever rows (or columns, for
//! the column reductions) a caller hands them. A row's (or a column's) result never depends on
//! which other rows share the call, so a backend may split the work across threads in any way
//! and call these very functions: the element-wise arithmetic is shared code, not a copy.

use crate::mathf;

/// LayerNorm's ε, 1e-5 by its bits.
pub const LN_EPS: f32 = f32::from_bits(0x3727_c5ac);
/// Adam's constants (`node`'s optimizer state carries the running powers).
pub const ADAM_BETA1: f32 = 0.9;
pub const ADAM_BETA2: f32 = 0.95;
pub const ADAM_EPS: f32 = 1e-8;

/// `out[r][j] = tok[tokens[r]·width + j] + pos[((first_row + r) mod seq)·width + j]` for the rows
/// given (`first_row` is the index of the first of them in the op).
#[inline(always)]
pub fn embed_rows(
    width: usize,
    tokens: &[u32],
    first_row: usize,
    seq: usize,
    tok: &[f32],
    pos: &[f32],
    out: &mut [f32],
) {
    for (r, (&t, row)) in tokens.iter().zip(out.chunks_exact_mut(width)).enumerate() {
        let p = (first_row + r) % seq;
        let te = &tok[t as usize * width..][..width];
        let pe = &pos[p * width..][..width];
        for j in 0..width {
            row[j] = te[j] + pe[j];
        }
    }
}

/// LayerNorm of the rows of `x` (`width` each): `mean = (Σ x) / width`, `var = (Σ (x −
/// mean)²) / width` (sums in index order), `rstd = 1 / √(var + ε)`, `xhat = (x − mean) · rstd`,
/// `y = xhat · gain + bias`.
#[inline(always)]
pub fn layer_norm_rows(
    width: usize,
    x: &[f32],
    gain: &[f32],
    bias: &[f32],
    y: &mut [f32],
    xhat: &mut [f32],
    rstd: &mut [f32],
) {
    let c = width as f32;
    for (r, row) in x.chunks_exact(width).enumerate() {
        let mut sum = 0.0f32;
        for v in row {
            sum += v;
        }
        let mean = sum / c;
        let mut var = 0.0f32;
        for v in row {
            let d = v - mean;
            var += d * d;
        }
        let s = 1.0 / (var / c + LN_EPS).sqrt();
        let (yr, hr) = (&mut y[r * width..][..width], &mut xhat[r * width..][..width]);
        for j in 0..width {
            let h = (row[j] - mean) * s;
            hr[j] = h;
            yr[j] = h * gain[j] + bias[j];
        }
        rstd[r] = s;
    }
}

/// LayerNorm's input gradient for the rows given: `d = dy · gain`, `m1 = (Σ d) / width`,
/// `m2 = (Σ d · xhat) / width` (sums in index order, one pass), `v = (d − m1 − xhat · m2) ·
/// rstd`; `dx = v`, or `dx = dx + v` with `accumulate`.
#[inline(always)]
pub fn layer_norm_backward_rows(
    width: usize,
    dy: &[f32],
    xhat: &[f32],
    rstd: &[f32],
    gain: &[f32],
    dx: &mut [f32],
    accumulate: bool,
) {
    let c = width as f32;
    let mut d = vec![0.0f32; width];
    for (r, &s) in rstd.iter().enumerate() {
        let (dyr, hr) = (&dy[r * width..][..width], &xhat[r * width..][..width]);
        let mut m1 = 0.0f32;
        let mut m2 = 0.0f32;
        for j in 0..width {
            d[j] = dyr[j] * gain[j];
            m1 += d[j];
            m2 += d[j] * hr[j];
        }
        m1 /= c;
        m2 /= c;
        let out = &mut dx[r * width..][..width];
        for j in 0..width {
            let v = (d[j] - m1 - hr[j] * m2) * s;
            out[j] = if accumulate { out[j] + v } else { v };
        }
    }
}

/// LayerNorm's parameter gradients for columns `cols` of every row: `dgain[j] = Σ_r dy·xhat`,
/// `dbias[j] = Σ_r dy`, rows in order from +0. `dgain`/`dbias` hold the columns `cols` only.
#[inline(always)]
pub fn layer_norm_param_grads(
    width: usize,
    rows: usize,
    cols: std::ops::Range<usize>,
    dy: &[f32],
    xhat: &[f32],
    dgain: &mut [f32],
    dbias: &mut [f32],
) {
    dgain.fill(0.0);
    dbias.fill(0.0);
    for r in 0..rows {
        let (d, h) = (&dy[r * width..][cols.clone()], &xhat[r * width..][cols.clone()]);
        for ((g, b), (&d, &h)) in dgain.iter_mut().zip(dbias.iter_mut()).zip(d.iter().zip(h)) {
            *g += d * h;
            *b += d;
        }
    }
}

/// `db[j] = Σ_r dy[r][j]` for columns `cols`, rows in order from +0.
#[inline(always)]
pub fn bias_grad_cols(width: usize, rows: usize, cols: std::ops::Range<usize>, dy: &[f32], db: &mut [f32]) {
    db.fill(0.0);
    for r in 0..rows {
        for (acc, &d) in db.iter_mut().zip(&dy[r * width..][cols.clone()]) {
            *acc += d;
        }
    }
}

/// `y[i] = gelu(x[i])` ([`mathf::gelu`]).
#[inline(always)]
pub fn gelu_into(x: &[f32], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = mathf::gelu(v);
    }
}

/// `dx[i] = dy[i] · gelu'(x[i])` ([`mathf::gelu_grad`]).
#[inline(always)]
pub fn gelu_backward_into(dy: &[f32], x: &[f32], dx: &mut [f32]) {
    for ((o, &d), &v) in dx.iter_mut().zip(dy).zip(x) {
        *o = d * mathf::gelu_grad(v);
    }
}

/// Causal softmax in place on rows of `t` scores, `first_row` being the row index (mod `t`) of
/// the first: for row `i`, entries `j ≤ i` become `s = v · scale`, `e = exp(s − max s)`, then
/// `e / Σ e` (sum in index order); entries `j > i` become +0.
#[inline(always)]
pub fn causal_softmax_rows(t: usize, first_row: usize, scale: f32, scores: &mut [f32]) {
    for (r, row) in scores.chunks_exact_mut(t).enumerate() {
        let i = (first_row + r) % t;
        let mut max = f32::NEG_INFINITY;
        for v in row.iter_mut().take(i + 1) {
            *v *= scale;
            max = max.max(*v);
        }
        let live = &mut row[..=i];
        for v in live.iter_mut() {
            *v = mathf::exp(*v - max);
        }
        let mut sum = 0.0f32;
        for v in live.iter() {
            sum += *v;
        }
        for v in live.iter_mut() {
            *v /= sum;
        }
        row[i + 1..].fill(0.0);
    }
}

/// Causal softmax backward on rows of `t`: for row `i`, `dot = Σ_{j≤i} p·dp` (index order), then
/// `ds = p · (dp − dot) · scale` for `j ≤ i` and +0 beyond.
#[inline(always)]
pub fn causal_softmax_backward_rows(
    t: usize,
    first_row: usize,
    scale: f32,
    probs: &[f32],
    dprobs: &[f32],
    dscores: &mut [f32],
) {
    for (r, ds) in dscores.chunks_exact_mut(t).enumerate() {
        let i = (first_row + r) % t;
        let (p, dp) = (&probs[r * t..][..t], &dprobs[r * t..][..t]);
        let mut dot = 0.0f32;
        for j in 0..=i {
            dot += p[j] * dp[j];
        }
        for j in 0..=i {
            ds[j] = p[j] * (dp[j] - dot) * scale;
        }
        ds[i + 1..].fill(0.0);
    }
}

/// Cross-entropy of the rows of `logits` (`vocab` each) against `targets`, `inv_rows` being
/// `1 / (all rows of the op)`: per row `max`, `e = exp(v − max)`, `sum = Σ e` (index order),
/// `loss = (ln sum + max) − v[target]`, `d = e / sum · inv_rows`, then `d[target] −= inv_rows`.
/// Writes `dlogits` and each row's loss.
#[inline(always)]
pub fn cross_entropy_rows(
    vocab: usize,
    logits: &[f32],
    targets: &[u32],
    inv_rows: f32,
    dlogits: &mut [f32],
    losses: &mut [f32],
) {
    for (r, (&target, loss)) in targets.iter().zip(losses.iter_mut()).enumerate() {
        let row = &logits[r * vocab..][..vocab];
        let d = &mut dlogits[r * vocab..][..vocab];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0.0f32;
        for (dv, &v) in d.iter_mut().zip(row) {
            *dv = mathf::exp(v - max);
            sum += *dv;
        }
        *loss = (mathf::ln(sum) + max) - row[target as usize];
        for dv in d.iter_mut() {
            *dv = *dv / sum * inv_rows;
        }
        d[target as usize] -= inv_rows;
    }
}

/// The mean loss: `(Σ losses) · (1 / rows)`, rows in order.
pub fn mean_loss(losses: &[f32]) -> f32 {
    let mut total = 0.0f32;
    for l in losses {
        total += l;
    }
    total * (1.0 / losses.len() as f32)
}

/// One Adam update, element by element: `m = β1·m + (1−β1)·g`, `v = β2·v + (1−β2)·(g·g)`,
/// `w = w − lr · (m / correction1) / (√(v / correction2) + ε)`.
#[inline(always)]
pub fn adam_into(
    weights: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    lr: f32,
    correction1: f32,
    correction2: f32,
) {
    let one_minus_b1 = 1.0 - ADAM_BETA1;
    let one_minus_b2 = 1.0 - ADAM_BETA2;
    for (((w, &g), m), v) in weights.iter_mut().zip(grad).zip(m.iter_mut()).zip(v.iter_mut()) {
        *m = ADAM_BETA1 * *m + one_minus_b1 * g;
        *v = ADAM_BETA2 * *v + one_minus_b2 * (g * g);
        let m_hat = *m / correction1;
        let v_hat = *v / correction2;
        *w -= lr * m_hat / (v_hat.sqrt() + ADAM_EPS);
    }
}
