//! **The op table**: every op of the training step, declared once. Each entry gives the op's
//! code, its ABI name, its fields in record order (scalars; buffers with how they are accessed
//! and how many words; flags), the shapes it refuses, and the samples every backend is checked
//! on. `define.rs` says what an entry's parts mean and generates the rest from it: the struct,
//! its place in [`Op`], the ABI record, the accesses, the bound form in [`io`]. Its reference
//! kernel is in `reference.rs`; `generate.rs` writes the C header's and the WGSL's constants.

use super::define::{w, FLAG_ACCUMULATE, FLAG_BIAS};
use super::{MatView, Span};

op_table! {
    /// The units product on views: for every batch `(p, q)` of `batch[0] × batch[1]`,
    /// `r = gemm_nt(A, B)` with `A` the `m × k` matrix `a` shows and `B` the `n × k` matrix `b`
    /// shows (so `r = A · Bᵀ`); then per element `v = r[i][j]`, `v = v + bias[j]` when there is a
    /// bias, and `C[i][j] = C[i][j] + v` when `accumulate`, else `C[i][j] = v`.
    ///
    /// The operands of one batch are read before its outputs are written; batches must not write
    /// words another batch reads.
    0 matmul Matmul {
        m: u32,
        n: u32,
        k: u32,
        batch: [u32; 2],
        a: MatView => read((batch, m, k)),
        b: MatView => read((batch, n, k)),
        c: MatView => update((batch, m, n)),
        bias: Option<Span> => optional(FLAG_BIAS, w(n)),
        accumulate: bool => flag(FLAG_ACCUMULATE),
    }
    samples [
        Matmul {
            m: 5, n: 7, k: 40, batch: [1, 1],
            a: MatView::rows(1, 3, 40), b: MatView::rows(2, 0, 40), c: MatView::rows(3, 2, 7),
            bias: Some(Span::new(4, 1)), accumulate: true,
        },
        Matmul {
            m: 4, n: 6, k: 70, batch: [2, 3],
            a: MatView::rows(1, 0, 70).batched([3 * 4 * 70, 4 * 70]),
            b: MatView::transposed(2, 5, 6).batched([3 * 70 * 6, 70 * 6]),
            c: MatView::rows(3, 0, 6).batched([3 * 4 * 6, 4 * 6]),
            bias: None, accumulate: false,
        },
        Matmul {
            m: 6, n: 5, k: 33, batch: [1, 1],
            a: MatView::transposed(1, 0, 6), b: MatView::transposed(2, 0, 5), c: MatView::rows(3, 0, 5),
            bias: None, accumulate: false,
        },
        // A weight gradient's shape: few outputs, a long k (ten blocks, the last short).
        Matmul {
            m: 20, n: 40, k: 300, batch: [1, 1],
            a: MatView::transposed(1, 0, 20), b: MatView::rows(2, 3, 300), c: MatView::rows(3, 1, 40),
            bias: Some(Span::new(4, 2)), accumulate: true,
        },
    ]

    /// `out[r][j] = tok[tokens[r]][j] + pos[r mod seq][j]` for `rows` rows of `width`; `tok`
    /// holds `vocab` rows.
    1 embed Embed {
        rows: u32,
        seq: u32,
        width: u32,
        vocab: u32,
        tokens: Span => read(w(rows), tokens(vocab)),
        tok: Span => read(w(vocab) * w(width)),
        pos: Span => read(w(seq) * w(width)),
        out: Span => write(w(rows) * w(width)),
    }
    refuse { seq == 0 || width == 0 => "sequence length and width must be positive" }
    samples [
        Embed {
            rows: 12, seq: 5, width: 8, vocab: 20,
            tokens: Span::new(1, 3), tok: Span::new(2, 0), pos: Span::new(3, 1), out: Span::new(4, 2),
        },
    ]

    /// The embeddings' gradients: `dtok[v]` (`vocab × width`) is the lane sum of the rows `dy[r]`
    /// with `tokens[r] = v`, `dpos[p]` (`positions × width`) of those with `r mod seq = p`, row
    /// `r` in lane `r mod 32` (see [`super::embed_backward_cols`]); rows no token or position
    /// reaches are +0.
    2 embed_backward EmbedBackward {
        rows: u32,
        seq: u32,
        width: u32,
        vocab: u32,
        positions: u32,
        tokens: Span => read(w(rows), tokens(vocab)),
        dy: Span => read(w(rows) * w(width)),
        dtok: Span => write(w(vocab) * w(width)),
        dpos: Span => write(w(positions) * w(width)),
    }
    refuse {
        seq == 0 || width == 0 => "sequence length and width must be positive",
        positions < seq => "fewer positions than the sequence length",
    }
    samples [
        EmbedBackward {
            rows: 12, seq: 5, width: 8, vocab: 20, positions: 6,
            tokens: Span::new(1, 100), dy: Span::new(2, 0), dtok: Span::new(3, 0), dpos: Span::new(3, 200),
        },
    ]

    /// LayerNorm of `rows` rows of `width` (see [`super::layer_norm_rows`]); writes `y`, `xhat`
    /// and one `rstd` per row.
    3 layer_norm LayerNorm {
        rows: u32,
        width: u32,
        x: Span => read(w(rows) * w(width)),
        gain: Span => read(w(width)),
        bias: Span => read(w(width)),
        y: Span => write(w(rows) * w(width)),
        xhat: Span => write(w(rows) * w(width)),
        rstd: Span => write(w(rows)),
    }
    refuse { width == 0 => "width 0" }
    samples [
        LayerNorm {
            rows: 12, width: 37,
            x: Span::new(1, 0), gain: Span::new(2, 0), bias: Span::new(2, 37),
            y: Span::new(3, 0), xhat: Span::new(4, 0), rstd: Span::new(5, 7),
        },
    ]

    /// LayerNorm's backward (see [`super::layer_norm_backward_rows`],
    /// [`super::layer_norm_param_grads`]): `dx` is set (or, with `accumulate`, added to),
    /// `dgain` and `dbias` are set.
    4 layer_norm_backward LayerNormBackward {
        rows: u32,
        width: u32,
        dy: Span => read(w(rows) * w(width)),
        xhat: Span => read(w(rows) * w(width)),
        rstd: Span => read(w(rows)),
        gain: Span => read(w(width)),
        dx: Span => update(w(rows) * w(width)),
        dgain: Span => write(w(width)),
        dbias: Span => write(w(width)),
        accumulate: bool => flag(FLAG_ACCUMULATE),
    }
    refuse { width == 0 => "width 0" }
    samples [
        LayerNormBackward {
            rows: 300, width: 10,
            dy: Span::new(1, 0), xhat: Span::new(2, 0), rstd: Span::new(3, 0), gain: Span::new(4, 0),
            dx: Span::new(5, 0), dgain: Span::new(6, 0), dbias: Span::new(6, 10), accumulate: false,
        },
        LayerNormBackward {
            rows: 12, width: 37,
            dy: Span::new(1, 0), xhat: Span::new(2, 0), rstd: Span::new(3, 0), gain: Span::new(4, 0),
            dx: Span::new(5, 0), dgain: Span::new(6, 0), dbias: Span::new(6, 37), accumulate: true,
        },
        LayerNormBackward {
            rows: 3, width: 300,
            dy: Span::new(1, 0), xhat: Span::new(2, 0), rstd: Span::new(3, 0), gain: Span::new(4, 0),
            dx: Span::new(5, 0), dgain: Span::new(6, 0), dbias: Span::new(6, 300), accumulate: false,
        },
    ]

    /// `y[i] = gelu(x[i])`.
    5 gelu Gelu {
        len: u32,
        x: Span => read(w(len)),
        y: Span => write(w(len)),
    }
    samples [Gelu { len: 444, x: Span::new(1, 0), y: Span::new(2, 5) }]

    /// `dx[i] = dy[i] · gelu'(x[i])`.
    6 gelu_backward GeluBackward {
        len: u32,
        dy: Span => read(w(len)),
        x: Span => read(w(len)),
        dx: Span => write(w(len)),
    }
    samples [GeluBackward { len: 444, dy: Span::new(1, 0), x: Span::new(2, 0), dx: Span::new(3, 0) }]

    /// In place on `blocks` row-major `t × t` blocks (see [`super::causal_softmax_rows`]).
    7 causal_softmax CausalSoftmax {
        blocks: u32,
        t: u32,
        scale: f32,
        scores: Span => update(w(blocks) * w(t) * w(t)),
    }
    samples [CausalSoftmax { blocks: 5, t: 9, scale: 0.35, scores: Span::new(1, 0) }]

    /// `ds = p ⊙ (dp − rowsum(p ⊙ dp)) · scale` on `blocks` causal `t × t` blocks (see
    /// [`super::causal_softmax_backward_rows`]).
    8 causal_softmax_backward CausalSoftmaxBackward {
        blocks: u32,
        t: u32,
        scale: f32,
        probs: Span => read(w(blocks) * w(t) * w(t)),
        dprobs: Span => read(w(blocks) * w(t) * w(t)),
        dscores: Span => write(w(blocks) * w(t) * w(t)),
    }
    samples [
        CausalSoftmaxBackward {
            blocks: 5, t: 9, scale: 0.35, probs: Span::new(1, 0), dprobs: Span::new(2, 0), dscores: Span::new(3, 0),
        },
    ]

    /// `db[j] = Σ_r dy[r][j]`, a lane sum down the column (see [`super::bias_grad_cols`]).
    9 bias_grad BiasGrad {
        rows: u32,
        width: u32,
        dy: Span => read(w(rows) * w(width)),
        db: Span => write(w(width)),
    }
    samples [
        BiasGrad { rows: 13, width: 37, dy: Span::new(1, 0), db: Span::new(2, 7) },
        // Past 8 values a lane (GPU kernels load a lane's values ahead of its adds); a width of
        // 10 keeps the test values' extremes (every fifth word) in columns 0 and 5, so that the
        // other columns' sums depend on their order.
        BiasGrad { rows: 300, width: 10, dy: Span::new(1, 0), db: Span::new(2, 0) },
    ]

    /// Mean cross-entropy of `rows` rows of `vocab` logits against `targets` (see
    /// [`super::cross_entropy_rows`]): `dlogits` and one word, `loss`.
    10 cross_entropy CrossEntropy {
        rows: u32,
        vocab: u32,
        logits: Span => read(w(rows) * w(vocab)),
        targets: Span => read(w(rows), tokens(vocab)),
        dlogits: Span => write(w(rows) * w(vocab)),
        loss: Span => write(1),
    }
    refuse { vocab == 0 => "vocabulary 0" }
    samples [
        CrossEntropy {
            rows: 12, vocab: 37,
            logits: Span::new(1, 0), targets: Span::new(2, 0), dlogits: Span::new(3, 0), loss: Span::new(4, 3),
        },
    ]

    /// One Adam update of `len` weights (see [`super::adam_into`]).
    11 adam Adam {
        len: u32,
        lr: f32,
        correction1: f32,
        correction2: f32,
        weights: Span => update(w(len)),
        grad: Span => read(w(len)),
        m: Span => update(w(len)),
        v: Span => update(w(len), nonneg),
    }
    samples [
        Adam {
            len: 4099, lr: 3e-3, correction1: 0.0975, correction2: 0.271,
            weights: Span::new(1, 0), grad: Span::new(2, 0), m: Span::new(3, 0), v: Span::new(4, 0),
        },
    ]

    /// The chunked FNV-1a hash of `len` words ([`crate::hash::chunked_words`]: FNV-1a over the
    /// hashes of 4096-word chunks) into one word `out`: the weight hash.
    12 hash Hash {
        len: u32,
        data: Span => read(w(len)),
        out: Span => write(1),
    }
    samples [Hash { len: 9000, data: Span::new(1, 0), out: Span::new(2, 1) }]
}
