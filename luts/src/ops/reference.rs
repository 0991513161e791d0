//! Each op's reference kernel, on its bound words ([`io`]): the definition every backend is
//! compared with, written to be obviously correct. `run_reference` checks the op, binds its
//! accesses (copies when its writes overlap its reads) and calls the kernel here.

use super::table::io;
use super::{check_tokens, kernels::*, OpError};
use crate::units::gemm_nt;
use crate::words::{f32s, f32s_mut};

impl io::Matmul<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        let (m, n, k) = (self.m as usize, self.n as usize, self.k as usize);
        let bias = self.bias.map(f32s);
        for p in 0..self.batch[0] as usize {
            for q in 0..self.batch[1] as usize {
                let gather = |v: &super::View<'_>, rows: usize| -> Vec<f32> {
                    let mut out = Vec::with_capacity(rows * k);
                    for i in 0..rows {
                        for l in 0..k {
                            out.push(f32::from_bits(v.words[v.view.index(p, q, i, l)]));
                        }
                    }
                    out
                };
                let (a, b) = (gather(&self.a, m), gather(&self.b, n));
                let r = gemm_nt(m, n, k, &a, &b).map_err(OpError::Unit)?;
                for i in 0..m {
                    for j in 0..n {
                        let mut v = r[i * n + j];
                        if let Some(bias) = bias {
                            v += bias[j];
                        }
                        let at = self.c.view.index(p, q, i, j);
                        let out = if self.accumulate { f32::from_bits(self.c.words[at]) + v } else { v };
                        self.c.words[at] = out.to_bits();
                    }
                }
            }
        }
        Ok(())
    }
}

impl io::Embed<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        check_tokens("embed", self.tokens, self.vocab)?;
        embed_rows(
            self.width as usize,
            self.tokens,
            0,
            self.seq as usize,
            f32s(self.tok),
            f32s(self.pos),
            f32s_mut(self.out),
        );
        Ok(())
    }
}

impl io::EmbedBackward<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        check_tokens("embed_backward", self.tokens, self.vocab)?;
        let (seq, width) = (self.seq as usize, self.width as usize);
        let (dy, dt, dp) = (f32s(self.dy), f32s_mut(self.dtok), f32s_mut(self.dpos));
        embed_backward_cols(width, seq, 0..width, self.tokens, dy, dt, dp);
        Ok(())
    }
}

impl io::LayerNorm<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        layer_norm_rows(
            self.width as usize,
            f32s(self.x),
            f32s(self.gain),
            f32s(self.bias),
            f32s_mut(self.y),
            f32s_mut(self.xhat),
            f32s_mut(self.rstd),
        );
        Ok(())
    }
}

impl io::LayerNormBackward<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        let (rows, width) = (self.rows as usize, self.width as usize);
        let (dy, xhat) = (f32s(self.dy), f32s(self.xhat));
        layer_norm_backward_rows(width, dy, xhat, f32s(self.rstd), f32s(self.gain), f32s_mut(self.dx), self.accumulate);
        layer_norm_param_grads(width, rows, 0..width, dy, xhat, f32s_mut(self.dgain), f32s_mut(self.dbias));
        Ok(())
    }
}

impl io::Gelu<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        gelu_into(f32s(self.x), f32s_mut(self.y));
        Ok(())
    }
}

impl io::GeluBackward<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        gelu_backward_into(f32s(self.dy), f32s(self.x), f32s_mut(self.dx));
        Ok(())
    }
}

impl io::CausalSoftmax<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        causal_softmax_rows(self.t as usize, 0, self.scale, f32s_mut(self.scores));
        Ok(())
    }
}

impl io::CausalSoftmaxBackward<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        let (probs, dprobs) = (f32s(self.probs), f32s(self.dprobs));
        causal_softmax_backward_rows(self.t as usize, 0, self.scale, probs, dprobs, f32s_mut(self.dscores));
        Ok(())
    }
}

impl io::BiasGrad<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        let width = self.width as usize;
        bias_grad_cols(width, self.rows as usize, 0..width, f32s(self.dy), f32s_mut(self.db));
        Ok(())
    }
}

impl io::CrossEntropy<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        check_tokens("cross_entropy", self.targets, self.vocab)?;
        let rows = self.rows as usize;
        let mut losses = vec![0.0; rows];
        let (logits, dlogits) = (f32s(self.logits), f32s_mut(self.dlogits));
        cross_entropy_rows(self.vocab as usize, logits, self.targets, 1.0 / rows as f32, dlogits, &mut losses);
        f32s_mut(self.loss)[0] = mean_loss(&losses);
        Ok(())
    }
}

impl io::Adam<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        let (weights, grad) = (f32s_mut(self.weights), f32s(self.grad));
        let (m, v) = (f32s_mut(self.m), f32s_mut(self.v));
        adam_into(weights, grad, m, v, self.lr, self.correction1, self.correction2);
        Ok(())
    }
}

impl io::Hash<'_> {
    pub(super) fn reference(self) -> Result<(), OpError> {
        self.out[0] = crate::hash::chunked_words(self.data);
        Ok(())
    }
}
