//! The training step's op set, defined once (ABI 2).
//!
//! A training step is a sequence of [`Op`]s on buffers of 32-bit words that a backend owns and
//! names by [`Handle`]: the units product on strided, batched views (every form the model needs —
//! `A·Bᵀ`, `A·B`, `Aᵀ·B`, the attention heads — is a choice of strides), and the model's
//! element-wise ops. This module is the one definition: [`run_reference`] executes an op on
//! host memory, obviously and slowly; every backend must give the same bits (the gate checks
//! it op by op, `docs/VERIFICATION.md` §9).
//!
//! Two layers:
//! - **slice kernels** (`layer_norm_rows`, `gelu_into`, …): the arithmetic, on plain slices, for
//!   whatever rows (or columns, for the column reductions) a caller hands them. A row's (or a
//!   column's) result never depends on which other rows share the call, so a backend may split
//!   the work across threads in any way and call these very functions: the element-wise
//!   arithmetic is shared code, not a copy.
//! - **ops**: what reads and writes which words of which buffer, checked against the buffers'
//!   lengths by [`Op::check`] before anything runs.
//!
//! Reductions run in index order: LayerNorm's sums along a row, softmax sums along a row, the
//! bias and gain gradients down a column (rows in order), the embedding scatter-add (rows in
//! order), the loss (rows in order), the hash (bytes in order). Every float operation is one
//! IEEE-754 binary32 `+ − × ÷ √`, never contracted, in the order written.

use crate::mathf;
use crate::units::{gemm_nt, UnitError};

/// A backend's name for one of its buffers.
pub type Handle = u64;

/// LayerNorm's ε, 1e-5 by its bits.
pub const LN_EPS: f32 = f32::from_bits(0x3727_c5ac);
/// Adam's constants (`node`'s optimizer state carries the running powers).
pub const ADAM_BETA1: f32 = 0.9;
pub const ADAM_BETA2: f32 = 0.95;
pub const ADAM_EPS: f32 = 1e-8;

/// Words `offset ..` of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub buffer: Handle,
    pub offset: u32,
}

impl Span {
    pub const fn new(buffer: Handle, offset: u32) -> Self {
        Self { buffer, offset }
    }
}

/// A strided view of a batch of matrices: element `(row, col)` of batch `(p, q)` is word
/// `offset + p·batch_stride[0] + q·batch_stride[1] + row·row_stride + col·col_stride`.
/// A transposed operand is a view with its strides swapped; nothing is copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatView {
    pub buffer: Handle,
    pub offset: u32,
    pub row_stride: u32,
    pub col_stride: u32,
    pub batch_stride: [u32; 2],
}

impl MatView {
    /// A row-major `? × cols` matrix at `offset`, one batch.
    pub const fn rows(buffer: Handle, offset: u32, cols: u32) -> Self {
        Self { buffer, offset, row_stride: cols, col_stride: 1, batch_stride: [0, 0] }
    }

    /// The transpose of a row-major `? × cols` matrix at `offset`.
    pub const fn transposed(buffer: Handle, offset: u32, cols: u32) -> Self {
        Self { buffer, offset, row_stride: 1, col_stride: cols, batch_stride: [0, 0] }
    }

    pub const fn batched(self, batch_stride: [u32; 2]) -> Self {
        Self { batch_stride, ..self }
    }

    /// The word index of element `(row, col)` of batch `(p, q)`.
    #[inline(always)]
    pub fn index(&self, p: usize, q: usize, row: usize, col: usize) -> usize {
        self.offset as usize
            + p * self.batch_stride[0] as usize
            + q * self.batch_stride[1] as usize
            + row * self.row_stride as usize
            + col * self.col_stride as usize
    }

    /// One past the largest word index a `batch × rows × cols` access touches (0 if empty).
    fn end(&self, batch: [u32; 2], rows: u32, cols: u32) -> u64 {
        if batch[0] == 0 || batch[1] == 0 || rows == 0 || cols == 0 {
            return 0;
        }
        let last = |n: u32, stride: u32| u64::from(n - 1) * u64::from(stride);
        u64::from(self.offset)
            + last(batch[0], self.batch_stride[0])
            + last(batch[1], self.batch_stride[1])
            + last(rows, self.row_stride)
            + last(cols, self.col_stride)
            + 1
    }
}

/// The units product on views: for every batch `(p, q)` of `batch[0] × batch[1]`,
/// `r = gemm_nt(A, B)` with `A` the `m × k` matrix `a` shows and `B` the `n × k` matrix `b` shows
/// (so `r = A · Bᵀ`); then per element `v = r[i][j]`, `v = v + bias[j]` when there is a bias, and
/// `C[i][j] = C[i][j] + v` when `accumulate`, else `C[i][j] = v`.
///
/// The operands of one batch are read before its outputs are written; batches must not write
/// words another batch reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matmul {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub batch: [u32; 2],
    pub a: MatView,
    pub b: MatView,
    pub c: MatView,
    pub bias: Option<Span>,
    pub accumulate: bool,
}

/// One op of a training step. Lengths are in words; every buffer holds 32-bit words (f32, or
/// `u32` for tokens, targets and the hash).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Matmul(Matmul),
    /// `out[r][j] = tok[tokens[r]][j] + pos[r mod seq][j]` for `rows` rows of `width`; `tok`
    /// holds `vocab` rows.
    Embed {
        rows: u32,
        seq: u32,
        width: u32,
        vocab: u32,
        tokens: Span,
        tok: Span,
        pos: Span,
        out: Span,
    },
    /// The embeddings' gradients: `dtok` (`vocab × width`) and `dpos` (`positions × width`) are
    /// set to +0, then for each row in order `dtok[tokens[r]] += dy[r]` and
    /// `dpos[r mod seq] += dy[r]`.
    EmbedBackward {
        rows: u32,
        seq: u32,
        width: u32,
        vocab: u32,
        positions: u32,
        tokens: Span,
        dy: Span,
        dtok: Span,
        dpos: Span,
    },
    /// LayerNorm of `rows` rows of `width` (see [`layer_norm_rows`]); writes `y`, `xhat` and
    /// one `rstd` per row.
    LayerNorm {
        rows: u32,
        width: u32,
        x: Span,
        gain: Span,
        bias: Span,
        y: Span,
        xhat: Span,
        rstd: Span,
    },
    /// LayerNorm's backward (see [`layer_norm_backward_rows`], [`layer_norm_param_grads`]):
    /// `dx` is set (or, with `accumulate`, added to), `dgain` and `dbias` are set.
    LayerNormBackward {
        rows: u32,
        width: u32,
        dy: Span,
        xhat: Span,
        rstd: Span,
        gain: Span,
        dx: Span,
        dgain: Span,
        dbias: Span,
        accumulate: bool,
    },
    /// `y[i] = gelu(x[i])`.
    Gelu {
        len: u32,
        x: Span,
        y: Span,
    },
    /// `dx[i] = dy[i] · gelu'(x[i])`.
    GeluBackward {
        len: u32,
        dy: Span,
        x: Span,
        dx: Span,
    },
    /// In place on `blocks` row-major `t × t` blocks (see [`causal_softmax_rows`]).
    CausalSoftmax {
        blocks: u32,
        t: u32,
        scale: f32,
        scores: Span,
    },
    /// `ds = p ⊙ (dp − rowsum(p ⊙ dp)) · scale` on `blocks` causal `t × t` blocks (see
    /// [`causal_softmax_backward_rows`]).
    CausalSoftmaxBackward {
        blocks: u32,
        t: u32,
        scale: f32,
        probs: Span,
        dprobs: Span,
        dscores: Span,
    },
    /// `db[j] = Σ_r dy[r][j]`, rows in order, from +0.
    BiasGrad {
        rows: u32,
        width: u32,
        dy: Span,
        db: Span,
    },
    /// Mean cross-entropy of `rows` rows of `vocab` logits against `targets` (see
    /// [`cross_entropy_rows`]): `dlogits` and one word, `loss`.
    CrossEntropy {
        rows: u32,
        vocab: u32,
        logits: Span,
        targets: Span,
        dlogits: Span,
        loss: Span,
    },
    /// One Adam update of `len` weights (see [`adam_into`]).
    Adam {
        len: u32,
        weights: Span,
        grad: Span,
        m: Span,
        v: Span,
        lr: f32,
        correction1: f32,
        correction2: f32,
    },
    /// The chunked FNV-1a hash of `len` words ([`crate::hash::chunked_words`]: FNV-1a over the
    /// hashes of 4096-word chunks) into one word `out`: the weight hash.
    Hash {
        len: u32,
        data: Span,
        out: Span,
    },
}

/// One range an op touches.
#[derive(Clone, Copy, Debug)]
struct Access {
    buffer: Handle,
    start: u64,
    /// One past the last word (0 when the op touches none).
    end: u64,
    write: bool,
}

/// Why an op cannot run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpError {
    /// The op names a buffer the backend does not have.
    UnknownBuffer { op: &'static str, buffer: Handle },
    /// An access ends past the buffer's length (words).
    OutOfBounds { op: &'static str, buffer: Handle, end: u64, len: u64 },
    /// A shape the op cannot take (zero width, a token id past the vocabulary, …).
    Shape { op: &'static str, what: String },
    /// The units refused an operand (a NaN or ±Inf).
    Unit(UnitError),
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::UnknownBuffer { op, buffer } => write!(f, "{op}: no buffer {buffer}"),
            OpError::OutOfBounds { op, buffer, end, len } => {
                write!(f, "{op}: access up to word {end} of buffer {buffer}, which holds {len}")
            }
            OpError::Shape { op, what } => write!(f, "{op}: {what}"),
            OpError::Unit(e) => write!(f, "matmul: {e}"),
        }
    }
}

impl std::error::Error for OpError {}

impl Op {
    /// The op's short name (the same as its ABI name, `docs/VERIFICATION.md` §9).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Matmul(_) => "matmul",
            Op::Embed { .. } => "embed",
            Op::EmbedBackward { .. } => "embed_backward",
            Op::LayerNorm { .. } => "layer_norm",
            Op::LayerNormBackward { .. } => "layer_norm_backward",
            Op::Gelu { .. } => "gelu",
            Op::GeluBackward { .. } => "gelu_backward",
            Op::CausalSoftmax { .. } => "causal_softmax",
            Op::CausalSoftmaxBackward { .. } => "causal_softmax_backward",
            Op::BiasGrad { .. } => "bias_grad",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::Adam { .. } => "adam",
            Op::Hash { .. } => "hash",
        }
    }

    /// Every buffer the op touches with one past the last word it may touch, one entry per
    /// buffer (0 when it touches none).
    pub fn extents(&self) -> Vec<(Handle, u64)> {
        let mut merged: Vec<(Handle, u64)> = Vec::new();
        for Access { buffer, end, .. } in self.accesses() {
            match merged.iter_mut().find(|(b, _)| *b == buffer) {
                Some((_, e)) => *e = (*e).max(end),
                None => merged.push((buffer, end)),
            }
        }
        merged
    }

    /// Whether a range the op writes may share a word with another range it reads or writes
    /// (ranges are taken as their hull `start .. end`, so a strided view counts whole). A
    /// backend that reads inputs while it writes outputs must take such an op another way;
    /// the training step never has one.
    pub fn writes_overlap(&self) -> bool {
        let all = self.accesses();
        all.iter().enumerate().any(|(i, w)| {
            w.write
                && all.iter().enumerate().any(|(j, o)| {
                    i != j
                        && o.buffer == w.buffer
                        && o.start < w.end
                        && w.start < o.end
                        && w.end > w.start
                        && o.end > o.start
                })
        })
    }

    fn accesses(&self) -> Vec<Access> {
        const R: bool = false;
        const W: bool = true;
        let span = |s: &Span, words: u64, write: bool| Access {
            buffer: s.buffer,
            start: u64::from(s.offset),
            end: if words == 0 { 0 } else { u64::from(s.offset) + words },
            write,
        };
        let w = u64::from;
        match *self {
            Op::Matmul(mm) => {
                let view = |v: &MatView, rows: u32, cols: u32, write: bool| Access {
                    buffer: v.buffer,
                    start: u64::from(v.offset),
                    end: v.end(mm.batch, rows, cols),
                    write,
                };
                let mut v = vec![view(&mm.a, mm.m, mm.k, R), view(&mm.b, mm.n, mm.k, R), view(&mm.c, mm.m, mm.n, W)];
                if let Some(bias) = mm.bias {
                    v.push(span(&bias, w(mm.n), R));
                }
                v
            }
            Op::Embed { rows, seq, width, vocab, tokens, tok, pos, out } => vec![
                span(&tokens, w(rows), R),
                span(&tok, w(vocab) * w(width), R),
                span(&pos, w(seq) * w(width), R),
                span(&out, w(rows) * w(width), W),
            ],
            Op::EmbedBackward { rows, width, vocab, positions, tokens, dy, dtok, dpos, .. } => vec![
                span(&tokens, w(rows), R),
                span(&dy, w(rows) * w(width), R),
                span(&dtok, w(vocab) * w(width), W),
                span(&dpos, w(positions) * w(width), W),
            ],
            Op::LayerNorm { rows, width, x, gain, bias, y, xhat, rstd } => {
                let n = w(rows) * w(width);
                vec![
                    span(&x, n, R),
                    span(&gain, w(width), R),
                    span(&bias, w(width), R),
                    span(&y, n, W),
                    span(&xhat, n, W),
                    span(&rstd, w(rows), W),
                ]
            }
            Op::LayerNormBackward { rows, width, dy, xhat, rstd, gain, dx, dgain, dbias, .. } => {
                let n = w(rows) * w(width);
                vec![
                    span(&dy, n, R),
                    span(&xhat, n, R),
                    span(&rstd, w(rows), R),
                    span(&gain, w(width), R),
                    span(&dx, n, W),
                    span(&dgain, w(width), W),
                    span(&dbias, w(width), W),
                ]
            }
            Op::Gelu { len, x, y } => vec![span(&x, w(len), R), span(&y, w(len), W)],
            Op::GeluBackward { len, dy, x, dx } => {
                vec![span(&dy, w(len), R), span(&x, w(len), R), span(&dx, w(len), W)]
            }
            Op::CausalSoftmax { blocks, t, scores, .. } => vec![span(&scores, w(blocks) * w(t) * w(t), W)],
            Op::CausalSoftmaxBackward { blocks, t, probs, dprobs, dscores, .. } => {
                let n = w(blocks) * w(t) * w(t);
                vec![span(&probs, n, R), span(&dprobs, n, R), span(&dscores, n, W)]
            }
            Op::BiasGrad { rows, width, dy, db } => vec![span(&dy, w(rows) * w(width), R), span(&db, w(width), W)],
            Op::CrossEntropy { rows, vocab, logits, targets, dlogits, loss } => vec![
                span(&logits, w(rows) * w(vocab), R),
                span(&targets, w(rows), R),
                span(&dlogits, w(rows) * w(vocab), W),
                span(&loss, 1, W),
            ],
            Op::Adam { len, weights, grad, m, v, .. } => {
                vec![span(&weights, w(len), W), span(&grad, w(len), R), span(&m, w(len), W), span(&v, w(len), W)]
            }
            Op::Hash { len, data, out } => vec![span(&data, w(len), R), span(&out, 1, W)],
        }
    }

    /// Checks every access against the buffers' lengths in words (`len_of` answers `None` for
    /// a buffer that does not exist) and the shapes the op needs. A backend runs an op only
    /// after this passed; it does not check token ids, which [`check_tokens`] does once their
    /// values are known.
    pub fn check(&self, len_of: impl Fn(Handle) -> Option<u64>) -> Result<(), OpError> {
        let op = self.name();
        let shape = |what: &str| Err(OpError::Shape { op, what: what.into() });
        match *self {
            Op::Embed { seq, width, .. } | Op::EmbedBackward { seq, width, .. } if seq == 0 || width == 0 => {
                return shape("sequence length and width must be positive")
            }
            Op::EmbedBackward { seq, positions, .. } if positions < seq => {
                return shape("fewer positions than the sequence length")
            }
            Op::LayerNorm { width: 0, .. } | Op::LayerNormBackward { width: 0, .. } => return shape("width 0"),
            Op::CrossEntropy { vocab: 0, .. } => return shape("vocabulary 0"),
            _ => {}
        }
        for Access { buffer, end, .. } in self.accesses() {
            let len = len_of(buffer).ok_or(OpError::UnknownBuffer { op, buffer })?;
            if end > len {
                return Err(OpError::OutOfBounds { op, buffer, end, len });
            }
        }
        Ok(())
    }
}

/// Checks that every token id (or target) is below `vocab`.
pub fn check_tokens(op: &'static str, tokens: &[u32], vocab: u32) -> Result<(), OpError> {
    match tokens.iter().find(|&&t| t >= vocab) {
        Some(t) => Err(OpError::Shape { op, what: format!("token id {t} outside a vocabulary of {vocab}") }),
        None => Ok(()),
    }
}

// ---- slice kernels: the arithmetic, shared by every CPU implementation ----

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

// ---- the reference executor ----

/// Host memory for the reference: buffers of words by handle.
pub type Memory = std::collections::BTreeMap<Handle, Vec<u32>>;

fn read_f32(mem: &Memory, s: Span, len: usize) -> Vec<f32> {
    let words = mem.get(&s.buffer).expect("checked");
    words[s.offset as usize..][..len].iter().map(|&w| f32::from_bits(w)).collect()
}

fn read_u32(mem: &Memory, s: Span, len: usize) -> Vec<u32> {
    mem.get(&s.buffer).expect("checked")[s.offset as usize..][..len].to_vec()
}

fn write_f32(mem: &mut Memory, s: Span, values: &[f32]) {
    let words = mem.get_mut(&s.buffer).expect("checked");
    for (w, v) in words[s.offset as usize..][..values.len()].iter_mut().zip(values) {
        *w = v.to_bits();
    }
}

/// Runs one op on host memory: the definition every backend is compared with. Inputs are read
/// whole before outputs are written (so in-place ops mean what they say).
pub fn run_reference(op: &Op, mem: &mut Memory) -> Result<(), OpError> {
    op.check(|b| mem.get(&b).map(|w| w.len() as u64))?;
    let name = op.name();
    match *op {
        Op::Matmul(mm) => {
            let (m, n, k) = (mm.m as usize, mm.n as usize, mm.k as usize);
            for p in 0..mm.batch[0] as usize {
                for q in 0..mm.batch[1] as usize {
                    let gather = |v: MatView, rows: usize| -> Vec<f32> {
                        let words = mem.get(&v.buffer).expect("checked");
                        let mut out = Vec::with_capacity(rows * k);
                        for i in 0..rows {
                            for l in 0..k {
                                out.push(f32::from_bits(words[v.index(p, q, i, l)]));
                            }
                        }
                        out
                    };
                    let (a, b) = (gather(mm.a, m), gather(mm.b, n));
                    let r = gemm_nt(m, n, k, &a, &b).map_err(OpError::Unit)?;
                    let bias = mm.bias.map(|s| read_f32(mem, s, n));
                    let c = mem.get_mut(&mm.c.buffer).expect("checked");
                    for i in 0..m {
                        for j in 0..n {
                            let mut v = r[i * n + j];
                            if let Some(bias) = &bias {
                                v += bias[j];
                            }
                            let at = mm.c.index(p, q, i, j);
                            let out = if mm.accumulate { f32::from_bits(c[at]) + v } else { v };
                            c[at] = out.to_bits();
                        }
                    }
                }
            }
        }
        Op::Embed { rows, seq, width, vocab, tokens, tok, pos, out } => {
            let (rows, seq, width) = (rows as usize, seq as usize, width as usize);
            let ids = read_u32(mem, tokens, rows);
            check_tokens(name, &ids, vocab)?;
            let table = read_f32(mem, tok, vocab as usize * width);
            let pos = read_f32(mem, pos, seq * width);
            let mut x = vec![0.0; rows * width];
            embed_rows(width, &ids, 0, seq, &table, &pos, &mut x);
            write_f32(mem, out, &x);
        }
        Op::EmbedBackward { rows, seq, width, vocab, positions, tokens, dy, dtok, dpos } => {
            let (rows, seq, width) = (rows as usize, seq as usize, width as usize);
            let ids = read_u32(mem, tokens, rows);
            check_tokens(name, &ids, vocab)?;
            let dy = read_f32(mem, dy, rows * width);
            let mut dt = vec![0.0f32; vocab as usize * width];
            let mut dp = vec![0.0f32; positions as usize * width];
            for (r, &t) in ids.iter().enumerate() {
                let d = &dy[r * width..][..width];
                for j in 0..width {
                    dt[t as usize * width + j] += d[j];
                }
                for j in 0..width {
                    dp[(r % seq) * width + j] += d[j];
                }
            }
            write_f32(mem, dtok, &dt);
            write_f32(mem, dpos, &dp);
        }
        Op::LayerNorm { rows, width, x, gain, bias, y, xhat, rstd } => {
            let (rows, width) = (rows as usize, width as usize);
            let xv = read_f32(mem, x, rows * width);
            let (g, b) = (read_f32(mem, gain, width), read_f32(mem, bias, width));
            let (mut yv, mut hv, mut sv) = (vec![0.0; rows * width], vec![0.0; rows * width], vec![0.0; rows]);
            layer_norm_rows(width, &xv, &g, &b, &mut yv, &mut hv, &mut sv);
            write_f32(mem, y, &yv);
            write_f32(mem, xhat, &hv);
            write_f32(mem, rstd, &sv);
        }
        Op::LayerNormBackward { rows, width, dy, xhat, rstd, gain, dx, dgain, dbias, accumulate } => {
            let (rows, width) = (rows as usize, width as usize);
            let dyv = read_f32(mem, dy, rows * width);
            let hv = read_f32(mem, xhat, rows * width);
            let sv = read_f32(mem, rstd, rows);
            let g = read_f32(mem, gain, width);
            let mut dxv = if accumulate { read_f32(mem, dx, rows * width) } else { vec![0.0; rows * width] };
            layer_norm_backward_rows(width, &dyv, &hv, &sv, &g, &mut dxv, accumulate);
            let (mut dg, mut db) = (vec![0.0; width], vec![0.0; width]);
            layer_norm_param_grads(width, rows, 0..width, &dyv, &hv, &mut dg, &mut db);
            write_f32(mem, dx, &dxv);
            write_f32(mem, dgain, &dg);
            write_f32(mem, dbias, &db);
        }
        Op::Gelu { len, x, y } => {
            let xv = read_f32(mem, x, len as usize);
            let mut yv = vec![0.0; len as usize];
            gelu_into(&xv, &mut yv);
            write_f32(mem, y, &yv);
        }
        Op::GeluBackward { len, dy, x, dx } => {
            let (dyv, xv) = (read_f32(mem, dy, len as usize), read_f32(mem, x, len as usize));
            let mut dxv = vec![0.0; len as usize];
            gelu_backward_into(&dyv, &xv, &mut dxv);
            write_f32(mem, dx, &dxv);
        }
        Op::CausalSoftmax { blocks, t, scale, scores } => {
            let n = blocks as usize * t as usize * t as usize;
            let mut s = read_f32(mem, scores, n);
            causal_softmax_rows(t as usize, 0, scale, &mut s);
            write_f32(mem, scores, &s);
        }
        Op::CausalSoftmaxBackward { blocks, t, scale, probs, dprobs, dscores } => {
            let n = blocks as usize * t as usize * t as usize;
            let (p, dp) = (read_f32(mem, probs, n), read_f32(mem, dprobs, n));
            let mut ds = vec![0.0; n];
            causal_softmax_backward_rows(t as usize, 0, scale, &p, &dp, &mut ds);
            write_f32(mem, dscores, &ds);
        }
        Op::BiasGrad { rows, width, dy, db } => {
            let (rows, width) = (rows as usize, width as usize);
            let dyv = read_f32(mem, dy, rows * width);
            let mut out = vec![0.0; width];
            bias_grad_cols(width, rows, 0..width, &dyv, &mut out);
            write_f32(mem, db, &out);
        }
        Op::CrossEntropy { rows, vocab, logits, targets, dlogits, loss } => {
            let (rows, vocab) = (rows as usize, vocab as usize);
            let ids = read_u32(mem, targets, rows);
            check_tokens(name, &ids, vocab as u32)?;
            let lv = read_f32(mem, logits, rows * vocab);
            let (mut d, mut losses) = (vec![0.0; rows * vocab], vec![0.0; rows]);
            cross_entropy_rows(vocab, &lv, &ids, 1.0 / rows as f32, &mut d, &mut losses);
            write_f32(mem, dlogits, &d);
            write_f32(mem, loss, &[mean_loss(&losses)]);
        }
        Op::Adam { len, weights, grad, m, v, lr, correction1, correction2 } => {
            let len = len as usize;
            let (mut wv, g) = (read_f32(mem, weights, len), read_f32(mem, grad, len));
            let (mut mv, mut vv) = (read_f32(mem, m, len), read_f32(mem, v, len));
            adam_into(&mut wv, &g, &mut mv, &mut vv, lr, correction1, correction2);
            write_f32(mem, weights, &wv);
            write_f32(mem, m, &mv);
            write_f32(mem, v, &vv);
        }
        Op::Hash { len, data, out } => {
            let h = crate::hash::chunked_words(&read_u32(mem, data, len as usize));
            mem.get_mut(&out.buffer).expect("checked")[out.offset as usize] = h;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn words(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    /// Each form of the product is the units on the transposed operands, element for element.
    #[test]
    fn matmul_forms_are_the_units_on_transposed_operands() {
        let mut rng = crate::rng::SplitMix64::new(5);
        let (m, n, k) = (5usize, 7usize, 40usize);
        let a: Vec<f32> = (0..m * k).map(|_| rng.next_signed_unit()).collect(); // m × k
        let b: Vec<f32> = (0..n * k).map(|_| rng.next_signed_unit()).collect(); // n × k
        let expected = gemm_nt(m, n, k, &a, &b).unwrap();
        // Aᵀ stored k × m, B stored k × n (the `Aᵀ·B` form's operands), read through views.
        let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let bt: Vec<f32> = (0..k * n).map(|i| b[(i % n) * k + i / n]).collect();
        let mut mem = BTreeMap::new();
        mem.insert(1, words(&at));
        mem.insert(2, words(&bt));
        mem.insert(3, vec![0; m * n]);
        let op = Op::Matmul(Matmul {
            m: m as u32,
            n: n as u32,
            k: k as u32,
            batch: [1, 1],
            a: MatView::transposed(1, 0, m as u32),
            b: MatView::transposed(2, 0, n as u32),
            c: MatView::rows(3, 0, n as u32),
            bias: None,
            accumulate: false,
        });
        run_reference(&op, &mut mem).unwrap();
        assert_eq!(mem[&3], words(&expected));
    }

    #[test]
    fn checks_refuse_out_of_bounds_and_unknown_buffers() {
        let mut mem: BTreeMap<Handle, Vec<u32>> = BTreeMap::new();
        mem.insert(1, vec![0; 10]);
        let op = Op::Gelu { len: 8, x: Span::new(1, 4), y: Span::new(1, 0) };
        assert_eq!(run_reference(&op, &mut mem), Err(OpError::OutOfBounds { op: "gelu", buffer: 1, end: 12, len: 10 }));
        let op = Op::Gelu { len: 2, x: Span::new(1, 0), y: Span::new(9, 0) };
        assert_eq!(run_reference(&op, &mut mem), Err(OpError::UnknownBuffer { op: "gelu", buffer: 9 }));
        mem.insert(2, vec![7, 1]);
        let op = Op::CrossEntropy {
            rows: 2,
            vocab: 5,
            logits: Span::new(1, 0),
            targets: Span::new(2, 0),
            dlogits: Span::new(1, 0),
            loss: Span::new(1, 0),
        };
        assert!(matches!(run_reference(&op, &mut mem), Err(OpError::Shape { op: "cross_entropy", .. })));
    }

    /// Two outputs in one buffer at disjoint offsets (the gain and bias gradients) do not
    /// overlap; an element-wise op in place, or outputs that share words, do.
    #[test]
    fn overlapping_writes_are_told_from_disjoint_ones() {
        let ln = |dbias_offset| Op::LayerNormBackward {
            rows: 4,
            width: 8,
            dy: Span::new(1, 0),
            xhat: Span::new(2, 0),
            rstd: Span::new(3, 0),
            gain: Span::new(4, 0),
            dx: Span::new(5, 0),
            dgain: Span::new(6, 100),
            dbias: Span::new(6, dbias_offset),
            accumulate: true,
        };
        assert!(!ln(108).writes_overlap());
        assert!(ln(104).writes_overlap());
        assert!(Op::Gelu { len: 8, x: Span::new(1, 0), y: Span::new(1, 4) }.writes_overlap());
        assert!(!Op::Gelu { len: 8, x: Span::new(1, 0), y: Span::new(1, 8) }.writes_overlap());
        assert!(!Op::CausalSoftmax { blocks: 2, t: 4, scale: 0.5, scores: Span::new(1, 0) }.writes_overlap());
    }
}
