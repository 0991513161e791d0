//! The slice kernels: the ops' arithmetic on plain slices, for whatever rows (or columns, for
//! the column reductions) a caller hands them. A row's (or a column's) result never depends on
//! which other rows share the call, so a backend may split the work across threads in any way
//! and call these very functions: the element-wise arithmetic is shared code, not a copy.
//!
//! **Every sum is a lane sum** ([`lane_sum`], `docs/VERIFICATION.md` §9): 32 lanes, lane `l`
//! adding the values whose index is `l` modulo 32 in index order from +0, then the lanes added
//! in lane order. The shape is fixed by the definition, not by the hardware, so 32 GPU
//! invocations, a CPU's SIMD lanes and one thread all produce the same bits.

use crate::mathf;

/// Lanes of every sum of the step.
pub const LANES: usize = 32;

/// Adds 32 lane totals in lane order: `((lane₀ + lane₁) + lane₂) + … + lane₃₁`.
#[inline(always)]
pub fn combine_lanes(lanes: &[f32; LANES]) -> f32 {
    let mut sum = lanes[0];
    for &v in &lanes[1..] {
        sum += v;
    }
    sum
}

/// The lane sum of `value(0) … value(n − 1)`: lane `l` is `((+0 + value(l)) + value(l + 32)) +
/// …`, the result [`combine_lanes`]. (A sum that starts at +0 is never −0, so an empty lane, a
/// skipped value and an added +0 all leave a total unchanged.)
#[inline(always)]
pub fn lane_sum_by(n: usize, mut value: impl FnMut(usize) -> f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let full = n - n % LANES;
    let mut base = 0;
    while base < full {
        for (l, acc) in lanes.iter_mut().enumerate() {
            *acc += value(base + l);
        }
        base += LANES;
    }
    for (l, acc) in lanes.iter_mut().enumerate().take(n - full) {
        *acc += value(full + l);
    }
    combine_lanes(&lanes)
}

/// The larger of `a` and `b`, `a` when they compare equal (so `max(−0, +0)` is −0), the other
/// one when either is a NaN: `exact_f32.wgsl`'s `x_max`, spelled out so that no platform's
/// `maxnum` decides a tie.
#[inline(always)]
pub fn max_of(a: f32, b: f32) -> f32 {
    if a.is_nan() || b > a {
        b
    } else {
        a
    }
}

/// The maximum of `value(0) … value(n − 1)` in the lane shape of [`lane_sum_by`]: each lane folds
/// [`max_of`] from −∞ in index order, then the lanes fold in lane order. (Only which of −0 and
/// +0 wins a tie depends on the order.)
#[inline(always)]
pub fn lane_max_by(n: usize, mut value: impl FnMut(usize) -> f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    for i in 0..n {
        lanes[i % LANES] = max_of(lanes[i % LANES], value(i));
    }
    let mut max = lanes[0];
    for &v in &lanes[1..] {
        max = max_of(max, v);
    }
    max
}

/// The lane sum of a slice.
#[inline(always)]
pub fn lane_sum(values: &[f32]) -> f32 {
    lane_sum_by(values.len(), |i| values[i])
}

/// Adds `lane` (one lane's totals, formed from +0) into `sums`, the running result of the
/// lanes before it: lane by lane, in lane order, is [`combine_lanes`] for every column at once.
#[inline(always)]
pub fn add_lane(sums: &mut [f32], lane: &[f32]) {
    for (o, &v) in sums.iter_mut().zip(lane) {
        *o += v;
    }
}

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
/// mean)²) / width` (lane sums along the row), `rstd = 1 / √(var + ε)`, `xhat = (x − mean) ·
/// rstd`, `y = xhat · gain + bias`.
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
        let mean = lane_sum(row) / c;
        let var = lane_sum_by(width, |j| {
            let d = row[j] - mean;
            d * d
        });
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
/// `m2 = (Σ d · xhat) / width` (lane sums along the row), `v = (d − m1 − xhat · m2) · rstd`;
/// `dx = v`, or `dx = dx + v` with `accumulate`.
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
        for j in 0..width {
            d[j] = dyr[j] * gain[j];
        }
        let m1 = lane_sum(&d) / c;
        let m2 = lane_sum_by(width, |j| d[j] * hr[j]) / c;
        let out = &mut dx[r * width..][..width];
        for j in 0..width {
            let v = (d[j] - m1 - hr[j] * m2) * s;
            out[j] = if accumulate { out[j] + v } else { v };
        }
    }
}

/// LayerNorm's parameter gradients for columns `cols` of every row: `dgain[j] = Σ_r dy·xhat`,
/// `dbias[j] = Σ_r dy`, lane sums down the column (row `r` in lane `r mod 32`). `dgain`/`dbias`
/// hold the columns `cols` only.
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
    let (mut lane_g, mut lane_b) = (vec![0.0f32; cols.len()], vec![0.0f32; cols.len()]);
    for l in 0..LANES.min(rows) {
        lane_g.fill(0.0);
        lane_b.fill(0.0);
        for r in (l..rows).step_by(LANES) {
            let (d, h) = (&dy[r * width..][cols.clone()], &xhat[r * width..][cols.clone()]);
            for ((g, b), (&d, &h)) in lane_g.iter_mut().zip(lane_b.iter_mut()).zip(d.iter().zip(h)) {
                *g += d * h;
                *b += d;
            }
        }
        add_lane(dgain, &lane_g);
        add_lane(dbias, &lane_b);
    }
}

/// `db[j] = Σ_r dy[r][j]` for columns `cols`, lane sums down the column (row `r` in lane
/// `r mod 32`).
#[inline(always)]
pub fn bias_grad_cols(width: usize, rows: usize, cols: std::ops::Range<usize>, dy: &[f32], db: &mut [f32]) {
    db.fill(0.0);
    let mut lane = vec![0.0f32; cols.len()];
    for l in 0..LANES.min(rows) {
        lane.fill(0.0);
        for r in (l..rows).step_by(LANES) {
            for (acc, &d) in lane.iter_mut().zip(&dy[r * width..][cols.clone()]) {
                *acc += d;
            }
        }
        add_lane(db, &lane);
    }
}

/// The embeddings' gradients for columns `cols`: `dtok[v][j]` is the lane sum over the rows
/// `r` whose token is `v` of `dy[r][j]`, `dpos[p][j]` over the rows with `r mod seq = p`, row
/// `r` in lane `r mod 32` (rows of other tokens or positions are skipped). `dtok` (`vocab`
/// rows) and `dpos` (`positions` rows) hold the columns `cols` only, `cols.len()` wide.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn embed_backward_cols(
    width: usize,
    seq: usize,
    cols: std::ops::Range<usize>,
    tokens: &[u32],
    dy: &[f32],
    dtok: &mut [f32],
    dpos: &mut [f32],
) {
    let n = cols.len();
    dtok.fill(0.0);
    dpos.fill(0.0);
    let (mut lane_t, mut lane_p) = (vec![0.0f32; dtok.len()], vec![0.0f32; dpos.len()]);
    let rows = tokens.len();
    for l in 0..LANES.min(rows) {
        for r in (l..rows).step_by(LANES) {
            let d = &dy[r * width..][cols.clone()];
            add_lane(&mut lane_t[tokens[r] as usize * n..][..n], d);
            add_lane(&mut lane_p[(r % seq) * n..][..n], d);
        }
        // Only the table rows this lane touched are added (the others are +0), and zeroed for
        // the next lane; one touched twice is added once, then adds zeros, which change nothing.
        for r in (l..rows).step_by(LANES) {
            for (table, lane, at) in [(&mut *dtok, &mut lane_t, tokens[r] as usize), (&mut *dpos, &mut lane_p, r % seq)]
            {
                let part = &mut lane[at * n..][..n];
                add_lane(&mut table[at * n..][..n], part);
                part.fill(0.0);
            }
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
/// the first: for row `i`, entries `j ≤ i` become `s = v · scale`, `e = exp(s − max s)` (a lane
/// maximum, [`lane_max_by`]), then
/// `e / Σ e` (a lane sum); entries `j > i` become +0.
#[inline(always)]
pub fn causal_softmax_rows(t: usize, first_row: usize, scale: f32, scores: &mut [f32]) {
    for (r, row) in scores.chunks_exact_mut(t).enumerate() {
        let i = (first_row + r) % t;
        for v in row.iter_mut().take(i + 1) {
            *v *= scale;
        }
        let max = lane_max_by(i + 1, |j| row[j]);
        let live = &mut row[..=i];
        for v in live.iter_mut() {
            *v = mathf::exp(*v - max);
        }
        let sum = lane_sum(live);
        for v in live.iter_mut() {
            *v /= sum;
        }
        row[i + 1..].fill(0.0);
    }
}

/// Causal softmax backward on rows of `t`: for row `i`, `dot = Σ_{j≤i} p·dp` (a lane sum), then
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
        let dot = lane_sum_by(i + 1, |j| p[j] * dp[j]);
        for j in 0..=i {
            ds[j] = p[j] * (dp[j] - dot) * scale;
        }
        ds[i + 1..].fill(0.0);
    }
}

/// Cross-entropy of the rows of `logits` (`vocab` each) against `targets`, `inv_rows` being
/// `1 / (all rows of the op)`: per row `max` (a lane maximum), `e = exp(v − max)`, `sum = Σ e`
/// (a lane sum),
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
        let max = lane_max_by(vocab, |j| row[j]);
        for (dv, &v) in d.iter_mut().zip(row) {
            *dv = mathf::exp(v - max);
        }
        let sum = lane_sum(d);
        *loss = (mathf::ln(sum) + max) - row[target as usize];
        for dv in d.iter_mut() {
            *dv = *dv / sum * inv_rows;
        }
        d[target as usize] -= inv_rows;
    }
}

/// The mean loss: `(Σ losses) · (1 / rows)`, a lane sum over the rows.
pub fn mean_loss(losses: &[f32]) -> f32 {
    lane_sum(losses) * (1.0 / losses.len() as f32)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane shape, on values whose sums were worked out by hand: 2^24 in lane 0 is cancelled
    /// by −2^24 in lane 0 before lane 1's 1 is added, so the lane sum keeps the 1 that adding in
    /// index order rounds away (2^24 + 1 ties to 2^24).
    #[test]
    fn lane_sums_add_each_lane_in_order_then_the_lanes() {
        let mut x = vec![0.0f32; 33];
        x[0] = 16_777_216.0;
        x[1] = 1.0;
        x[32] = -16_777_216.0;
        assert_eq!(lane_sum(&x), 1.0);
        let in_order = x.iter().fold(0.0f32, |s, &v| s + v);
        assert_eq!(in_order, 0.0, "index order rounds the 1 away");
        // A lane's own order: 2^24, then 1 (rounds away), then −2^24.
        let mut y = vec![0.0f32; 65];
        y[0] = 16_777_216.0;
        y[32] = 1.0;
        y[64] = -16_777_216.0;
        assert_eq!(lane_sum(&y), 0.0);
        // Sums start at +0: all −0 gives +0; an empty sum is +0.
        assert_eq!(lane_sum(&[-0.0; 40]).to_bits(), 0);
        assert_eq!(lane_sum(&[]).to_bits(), 0);
        // The lanes are added in lane order: lane 31's 2^-24 meets 1 + 2^-24 of lanes 0 and 1.
        let mut z = vec![0.0f32; 32];
        z[0] = 1.0;
        z[1] = 5.960_464_5e-8; // 2^-24: 1 + 2^-24 ties back to 1
        z[31] = 5.960_464_5e-8;
        assert_eq!(lane_sum(&z), 1.0);
    }

    /// Column sums: row r in lane r mod 32, so 33 rows put rows 0 and 32 in one lane.
    #[test]
    fn column_lane_sums_take_rows_by_lane() {
        let (rows, width) = (33, 2);
        let mut dy = vec![0.0f32; rows * width];
        dy[0] = 16_777_216.0; // row 0, column 0
        dy[width] = 1.0; // row 1, column 0
        dy[32 * width] = -16_777_216.0; // row 32, column 0
        dy[32 * width + 1] = -2.5; // row 32, column 1
        let mut db = [9.0f32; 2];
        bias_grad_cols(width, rows, 0..width, &dy, &mut db);
        assert_eq!(db, [1.0, -2.5]);
        let (mut dg, mut dbias) = ([9.0f32; 1], [9.0f32; 1]);
        let xhat = vec![2.0f32; rows * width];
        layer_norm_param_grads(width, rows, 1..2, &dy, &xhat, &mut dg, &mut dbias);
        assert_eq!((dg, dbias), ([-5.0], [-2.5]));
    }

    /// The embedding gradient: rows of one token in lane order, other rows skipped.
    #[test]
    fn embedding_gradients_are_lane_sums_of_their_rows() {
        let (width, seq) = (1, 33);
        let rows = 66;
        let mut tokens = vec![1u32; rows];
        let mut dy = vec![0.0f32; rows];
        for r in [0, 1, 32] {
            tokens[r] = 0;
        }
        dy[0] = 16_777_216.0;
        dy[1] = 1.0;
        dy[32] = -16_777_216.0;
        dy[33] = 6.0; // token 1, position 0, lane 1
        let (mut dtok, mut dpos) = (vec![9.0f32; 2], vec![9.0f32; seq]);
        embed_backward_cols(width, seq, 0..1, &tokens, &dy, &mut dtok, &mut dpos);
        assert_eq!(dtok, [1.0, 6.0]);
        // Position 0 holds rows 0 and 33 (lanes 0 and 1); position 32 row 32 (and 65, +0).
        assert_eq!((dpos[0], dpos[1], dpos[32]), (16_777_222.0, 1.0, -16_777_216.0));
    }

    /// Ties go to the first operand; a NaN loses to anything.
    #[test]
    fn lane_maxima_are_spelled_out() {
        assert_eq!(max_of(-0.0, 0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(max_of(0.0, -0.0).to_bits(), 0);
        assert_eq!(max_of(f32::NAN, 1.0), 1.0);
        assert_eq!(max_of(1.0, f32::NAN), 1.0);
        // −0 in lane 0 meets +0 of lane 1 first.
        assert_eq!(lane_max_by(2, |i| [-0.0, 0.0][i]).to_bits(), (-0.0f32).to_bits());
        assert_eq!(lane_max_by(3, |i| [-1.0, 0.0, 3.0][i]), 3.0);
    }
}
