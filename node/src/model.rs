//! The GPT-style decoder, forward and backward by hand.
//!
//! Every matrix product — Q/K/V, attention scores, attention × V, output projection, MLP up
//! and down, the LM head, and every product of the backward pass — is one `Gemm::gemm_nt`
//! call (`A · Bᵀ`). Element-wise math is `mathf` and plain f32 in a fixed order; reductions run
//! sequentially in index order. Nothing here depends on thread count.
//!
//! Pre-LayerNorm blocks: `x += attn(ln1(x))`, `x += mlp(ln2(x))`; final LayerNorm; an untied
//! LM head with bias. Attention is causal multi-head with scale `1/√(head_dim)`. The MLP is
//! `4c` wide with the tanh-approximated GELU.

use crate::config::VOCAB;
use crate::gemm::{ComputeError, Gemm};
use crate::mathf;
use crate::params::Layout;

const LN_EPS: f32 = 1e-5;

/// `src` (`rows × cols`) transposed, through 8 × 8 register tiles.
pub(crate) fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const T: usize = 8;
    assert_eq!(src.len(), rows * cols);
    let mut out = vec![0.0; rows * cols];
    let (full_rows, full_cols) = (rows - rows % T, cols - cols % T);
    for r0 in (0..full_rows).step_by(T) {
        for c0 in (0..full_cols).step_by(T) {
            let mut tile = [[0.0f32; T]; T];
            for (i, line) in tile.iter_mut().enumerate() {
                line.copy_from_slice(&src[(r0 + i) * cols + c0..][..T]);
            }
            for j in 0..T {
                let dst = &mut out[(c0 + j) * rows + r0..][..T];
                for i in 0..T {
                    dst[i] = tile[i][j];
                }
            }
        }
    }
    // Ragged edges: the last columns of every row, then the last rows.
    for r in 0..rows {
        for c in full_cols..cols {
            out[c * rows + r] = src[r * cols + c];
        }
    }
    for r in full_rows..rows {
        for c in 0..full_cols {
            out[c * rows + r] = src[r * cols + c];
        }
    }
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

/// Backward of [`linear`]: returns `dx` and accumulates `dW`, `db`.
#[allow(clippy::too_many_arguments)]
fn linear_backward(
    gemm: &mut dyn Gemm,
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
    let wt = transpose(w, out, inp);
    let mut dx = vec![0.0; n * inp];
    gemm.gemm_nt(n, inp, out, dy, &wt, &mut dx)?;
    // dW = dyᵀ · x  =  (dyᵀ) · (xᵀ)ᵀ
    let dyt = transpose(dy, n, out);
    let xt = transpose(x, n, inp);
    let mut grad = vec![0.0; out * inp];
    gemm.gemm_nt(out, inp, n, &dyt, &xt, &mut grad)?;
    for (acc, g) in dw.iter_mut().zip(&grad) {
        *acc += g;
    }
    for row in dy.chunks_exact(out) {
        for (acc, g) in db.iter_mut().zip(row) {
            *acc += g;
        }
    }
    Ok(dx)
}

/// LayerNorm over rows of `c`: returns `(y, xhat, rstd)`.
fn layer_norm(x: &[f32], c: usize, g: &[f32], b: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / c;
    let mut y = vec![0.0; x.len()];
    let mut xhat = vec![0.0; x.len()];
    let mut rstds = Vec::with_capacity(rows);
    for r in 0..rows {
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
        for j in 0..c {
            let h = (row[j] - mean) * rstd;
            xhat[r * c + j] = h;
            y[r * c + j] = h * g[j] + b[j];
        }
        rstds.push(rstd);
    }
    (y, xhat, rstds)
}

/// Backward of [`layer_norm`]: returns `dx`, accumulates `dg`, `db`.
fn layer_norm_backward(
    dy: &[f32],
    xhat: &[f32],
    rstd: &[f32],
    c: usize,
    g: &[f32],
    dg: &mut [f32],
    db: &mut [f32],
) -> Vec<f32> {
    let mut dx = vec![0.0; dy.len()];
    let mut dxhat = vec![0.0; c];
    for (r, &rs) in rstd.iter().enumerate() {
        let dy_row = &dy[r * c..(r + 1) * c];
        let xh = &xhat[r * c..(r + 1) * c];
        let mut mean1 = 0.0f32;
        let mut mean2 = 0.0f32;
        for j in 0..c {
            dxhat[j] = dy_row[j] * g[j];
            mean1 += dxhat[j];
            mean2 += dxhat[j] * xh[j];
            dg[j] += dy_row[j] * xh[j];
            db[j] += dy_row[j];
        }
        mean1 /= c as f32;
        mean2 /= c as f32;
        for j in 0..c {
            dx[r * c + j] = (dxhat[j] - mean1 - xh[j] * mean2) * rs;
        }
    }
    dx
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
        let mut sum = 0.0f32;
        for v in row.iter_mut().take(i + 1) {
            *v = mathf::exp(*v - max);
            sum += *v;
        }
        for v in row.iter_mut().take(i + 1) {
            *v /= sum;
        }
        row[i + 1..].fill(0.0);
    }
}

/// What the backward pass needs from one block's forward pass.
struct LayerCache {
    x_in: Vec<f32>,
    ln1_xhat: Vec<f32>,
    ln1_rstd: Vec<f32>,
    h1: Vec<f32>,
    qkv: Vec<f32>,
    /// Attention probabilities, `[batch][head][t][t]`.
    probs: Vec<f32>,
    att: Vec<f32>,
    x_mid: Vec<f32>,
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
    x_final: Vec<f32>,
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
        let (c, hd, heads) = (cfg.width, cfg.head_dim(), cfg.heads);
        let n = batch * seq;
        let l = &self.layout;

        let mut x = vec![0.0f32; n * c];
        for (row, &tok) in tokens.iter().enumerate() {
            let pos = row % seq;
            let te = &w[l.tok_emb.start + tok as usize * c..][..c];
            let pe = &w[l.pos_emb.start + pos * c..][..c];
            for j in 0..c {
                x[row * c + j] = te[j] + pe[j];
            }
        }

        let scale = 1.0 / (hd as f32).sqrt();
        let mut layers = Vec::with_capacity(cfg.layers);
        for lo in &l.layers {
            let x_in = x.clone();
            let (h1, ln1_xhat, ln1_rstd) = layer_norm(&x, c, &w[lo.ln1_g.clone()], &w[lo.ln1_b.clone()]);
            let qkv = linear(gemm, &h1, n, c, &w[lo.qkv_w.clone()], &w[lo.qkv_b.clone()], 3 * c)?;
            let mut probs = vec![0.0f32; batch * heads * seq * seq];
            let mut att = vec![0.0f32; n * c];
            let mut q = vec![0.0f32; seq * hd];
            let mut k = vec![0.0f32; seq * hd];
            let mut vt = vec![0.0f32; hd * seq];
            let mut o = vec![0.0f32; seq * hd];
            for b in 0..batch {
                for h in 0..heads {
                    for i in 0..seq {
                        let row = &qkv[(b * seq + i) * 3 * c..][..3 * c];
                        q[i * hd..(i + 1) * hd].copy_from_slice(&row[h * hd..(h + 1) * hd]);
                        k[i * hd..(i + 1) * hd].copy_from_slice(&row[c + h * hd..c + (h + 1) * hd]);
                        for d in 0..hd {
                            vt[d * seq + i] = row[2 * c + h * hd + d];
                        }
                    }
                    let p = &mut probs[(b * heads + h) * seq * seq..][..seq * seq];
                    gemm.gemm_nt(seq, seq, hd, &q, &k, p)?;
                    causal_softmax(p, seq, scale);
                    gemm.gemm_nt(seq, hd, seq, p, &vt, &mut o)?;
                    for i in 0..seq {
                        att[(b * seq + i) * c + h * hd..][..hd].copy_from_slice(&o[i * hd..(i + 1) * hd]);
                    }
                }
            }
            let proj = linear(gemm, &att, n, c, &w[lo.proj_w.clone()], &w[lo.proj_b.clone()], c)?;
            for (xv, pv) in x.iter_mut().zip(&proj) {
                *xv += pv;
            }
            let x_mid = x.clone();
            let (h2, ln2_xhat, ln2_rstd) = layer_norm(&x, c, &w[lo.ln2_g.clone()], &w[lo.ln2_b.clone()]);
            let u = linear(gemm, &h2, n, c, &w[lo.fc_w.clone()], &w[lo.fc_b.clone()], 4 * c)?;
            let gelu: Vec<f32> = u.iter().map(|&v| mathf::gelu(v)).collect();
            let m = linear(gemm, &gelu, n, 4 * c, &w[lo.fc2_w.clone()], &w[lo.fc2_b.clone()], c)?;
            for (xv, mv) in x.iter_mut().zip(&m) {
                *xv += mv;
            }
            layers.push(LayerCache {
                x_in,
                ln1_xhat,
                ln1_rstd,
                h1,
                qkv,
                probs,
                att,
                x_mid,
                ln2_xhat,
                ln2_rstd,
                h2,
                u,
                gelu,
            });
        }
        let (hf, lnf_xhat, lnf_rstd) = layer_norm(&x, c, &w[l.lnf_g.clone()], &w[l.lnf_b.clone()]);
        let logits = linear(gemm, &hf, n, c, &w[l.head_w.clone()], &w[l.head_b.clone()], VOCAB)?;
        Ok(Forward { batch, seq, tokens: tokens.to_vec(), layers, x_final: x, lnf_xhat, lnf_rstd, hf, logits })
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
        let (loss, dlogits) = cross_entropy(&fwd.logits, targets);
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
        let (c, hd, heads) = (cfg.width, cfg.head_dim(), cfg.heads);
        let (batch, seq) = (fwd.batch, fwd.seq);
        let n = batch * seq;
        let l = &self.layout;
        let mut grads = vec![0.0f32; l.len];
        let scale = 1.0 / (hd as f32).sqrt();

        let (head_w, rest) = split_grads(&mut grads, l.head_w.clone(), l.head_b.clone());
        let dhf = linear_backward(gemm, &fwd.hf, n, c, &w[l.head_w.clone()], VOCAB, dlogits, head_w, rest)?;
        let (dg, db) = split_grads(&mut grads, l.lnf_g.clone(), l.lnf_b.clone());
        let mut dx = layer_norm_backward(&dhf, &fwd.lnf_xhat, &fwd.lnf_rstd, c, &w[l.lnf_g.clone()], dg, db);
        debug_assert_eq!(fwd.x_final.len(), dx.len());

        for (lo, cache) in l.layers.iter().zip(&fwd.layers).rev() {
            // x = x_mid + mlp(ln2(x_mid))
            let (dw, db) = split_grads(&mut grads, lo.fc2_w.clone(), lo.fc2_b.clone());
            let dgelu = linear_backward(gemm, &cache.gelu, n, 4 * c, &w[lo.fc2_w.clone()], c, &dx, dw, db)?;
            let du: Vec<f32> = dgelu.iter().zip(&cache.u).map(|(&d, &u)| d * mathf::gelu_grad(u)).collect();
            let (dw, db) = split_grads(&mut grads, lo.fc_w.clone(), lo.fc_b.clone());
            let dh2 = linear_backward(gemm, &cache.h2, n, c, &w[lo.fc_w.clone()], 4 * c, &du, dw, db)?;
            let (dg, db) = split_grads(&mut grads, lo.ln2_g.clone(), lo.ln2_b.clone());
            let dmid = layer_norm_backward(&dh2, &cache.ln2_xhat, &cache.ln2_rstd, c, &w[lo.ln2_g.clone()], dg, db);
            for (d, m) in dx.iter_mut().zip(&dmid) {
                *d += m;
            }
            debug_assert_eq!(cache.x_mid.len(), dx.len());

            // x_mid = x_in + proj(attn(ln1(x_in)))
            let (dw, db) = split_grads(&mut grads, lo.proj_w.clone(), lo.proj_b.clone());
            let datt = linear_backward(gemm, &cache.att, n, c, &w[lo.proj_w.clone()], c, &dx, dw, db)?;
            let mut dqkv = vec![0.0f32; n * 3 * c];
            let mut q = vec![0.0f32; seq * hd];
            let mut qt = vec![0.0f32; hd * seq];
            let mut k = vec![0.0f32; seq * hd];
            let mut kt = vec![0.0f32; hd * seq];
            let mut v = vec![0.0f32; seq * hd];
            let mut d_o = vec![0.0f32; seq * hd];
            let mut d_ot = vec![0.0f32; hd * seq];
            let mut dp = vec![0.0f32; seq * seq];
            let mut dq = vec![0.0f32; seq * hd];
            let mut dk = vec![0.0f32; seq * hd];
            let mut dv = vec![0.0f32; seq * hd];
            for b in 0..batch {
                for h in 0..heads {
                    for i in 0..seq {
                        let row = &cache.qkv[(b * seq + i) * 3 * c..][..3 * c];
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
                    let p = &cache.probs[(b * heads + h) * seq * seq..][..seq * seq];
                    // dP = dO · Vᵀ
                    gemm.gemm_nt(seq, seq, hd, &d_o, &v, &mut dp)?;
                    // dV = Pᵀ · dO
                    let pt = transpose(p, seq, seq);
                    gemm.gemm_nt(seq, hd, seq, &pt, &d_ot, &mut dv)?;
                    // dS = P ⊙ (dP − rowsum(P ⊙ dP)), times the score scale.
                    let mut ds = vec![0.0f32; seq * seq];
                    for i in 0..seq {
                        let mut dot = 0.0f32;
                        for j in 0..=i {
                            dot += p[i * seq + j] * dp[i * seq + j];
                        }
                        for j in 0..=i {
                            ds[i * seq + j] = p[i * seq + j] * (dp[i * seq + j] - dot) * scale;
                        }
                    }
                    // dQ = dS · K,  dK = dSᵀ · Q
                    gemm.gemm_nt(seq, hd, seq, &ds, &kt, &mut dq)?;
                    let dst = transpose(&ds, seq, seq);
                    gemm.gemm_nt(seq, hd, seq, &dst, &qt, &mut dk)?;
                    for i in 0..seq {
                        let row = &mut dqkv[(b * seq + i) * 3 * c..][..3 * c];
                        row[h * hd..(h + 1) * hd].copy_from_slice(&dq[i * hd..(i + 1) * hd]);
                        row[c + h * hd..c + (h + 1) * hd].copy_from_slice(&dk[i * hd..(i + 1) * hd]);
                        row[2 * c + h * hd..2 * c + (h + 1) * hd].copy_from_slice(&dv[i * hd..(i + 1) * hd]);
                    }
                }
            }
            let (dw, db) = split_grads(&mut grads, lo.qkv_w.clone(), lo.qkv_b.clone());
            let dh1 = linear_backward(gemm, &cache.h1, n, c, &w[lo.qkv_w.clone()], 3 * c, &dqkv, dw, db)?;
            let (dg, db) = split_grads(&mut grads, lo.ln1_g.clone(), lo.ln1_b.clone());
            let din = layer_norm_backward(&dh1, &cache.ln1_xhat, &cache.ln1_rstd, c, &w[lo.ln1_g.clone()], dg, db);
            for (d, i) in dx.iter_mut().zip(&din) {
                *d += i;
            }
            debug_assert_eq!(cache.x_in.len(), dx.len());
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
fn split_grads(
    grads: &mut [f32],
    first: std::ops::Range<usize>,
    second: std::ops::Range<usize>,
) -> (&mut [f32], &mut [f32]) {
    assert!(first.end <= second.start, "tensors are laid out in order");
    let (head, tail) = grads.split_at_mut(second.start);
    (&mut head[first], &mut tail[..second.len()])
}

/// Mean cross-entropy over rows and its gradient with respect to the logits.
pub fn cross_entropy(logits: &[f32], targets: &[u8]) -> (f32, Vec<f32>) {
    let rows = targets.len();
    assert_eq!(logits.len(), rows * VOCAB);
    let mut dlogits = vec![0.0f32; logits.len()];
    let mut total = 0.0f32;
    let inv_rows = 1.0 / rows as f32;
    for (r, &target) in targets.iter().enumerate() {
        let row = &logits[r * VOCAB..(r + 1) * VOCAB];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let d = &mut dlogits[r * VOCAB..(r + 1) * VOCAB];
        let mut sum = 0.0f32;
        for (dv, &v) in d.iter_mut().zip(row) {
            *dv = mathf::exp(v - max);
            sum += *dv;
        }
        total += (mathf::ln(sum) + max) - row[target as usize];
        for dv in d.iter_mut() {
            *dv = *dv / sum * inv_rows;
        }
        d[target as usize] -= inv_rows;
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
        let mut gemm = FloatGemm;
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
        for (rows, cols) in [(1, 1), (3, 5), (8, 8), (9, 17), (16, 3), (33, 40)] {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let t = transpose(&src, rows, cols);
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
