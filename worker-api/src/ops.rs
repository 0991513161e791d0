//! ABI 2's ops as C data: [`OpCall`], one fixed-size record per op, and its codec to and from
//! `lockstep_luts::ops::Op` (whose docs define what each op computes).
//!
//! | code | op | buffers | params (u32; f32 by their bits) |
//! |---|---|---|---|
//! | 0 | matmul | a, b, c, bias | m, n, k, batch0, batch1, then for a, b, c: offset, row_stride, col_stride, batch_stride0, batch_stride1; bias offset |
//! | 1 | embed | tokens, tok, pos, out | rows, seq, width, vocab, then the four offsets |
//! | 2 | embed_backward | tokens, dy, dtok, dpos | rows, seq, width, vocab, positions, then the four offsets |
//! | 3 | layer_norm | x, gain, bias, y, xhat, rstd | rows, width, then the six offsets |
//! | 4 | layer_norm_backward | dy, xhat, rstd, gain, dx, dgain, dbias | rows, width, then the seven offsets |
//! | 5 | gelu | x, y | len, then the two offsets |
//! | 6 | gelu_backward | dy, x, dx | len, then the three offsets |
//! | 7 | causal_softmax | scores | blocks, t, scale, then the offset |
//! | 8 | causal_softmax_backward | probs, dprobs, dscores | blocks, t, scale, then the three offsets |
//! | 9 | bias_grad | dy, db | rows, width, then the two offsets |
//! | 10 | cross_entropy | logits, targets, dlogits, loss | rows, vocab, then the four offsets |
//! | 11 | adam | weights, grad, m, v | len, lr, correction1, correction2, then the four offsets |
//! | 12 | hash | data, out | len, then the two offsets |
//!
//! Flags: [`FLAG_ACCUMULATE`] (matmul, layer_norm_backward), [`FLAG_BIAS`] (matmul). Unused
//! buffers and params are zero; a decoder refuses unknown codes and flags.

use lockstep_luts::ops::{MatView, Matmul, Op, Span};

/// One op, as it crosses the ABI. 168 bytes, pinned by a layout test.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpCall {
    pub code: u32,
    pub flags: u32,
    pub buffers: [u64; 8],
    pub params: [u32; 24],
}

pub const MATMUL: u32 = 0;
pub const EMBED: u32 = 1;
pub const EMBED_BACKWARD: u32 = 2;
pub const LAYER_NORM: u32 = 3;
pub const LAYER_NORM_BACKWARD: u32 = 4;
pub const GELU: u32 = 5;
pub const GELU_BACKWARD: u32 = 6;
pub const CAUSAL_SOFTMAX: u32 = 7;
pub const CAUSAL_SOFTMAX_BACKWARD: u32 = 8;
pub const BIAS_GRAD: u32 = 9;
pub const CROSS_ENTROPY: u32 = 10;
pub const ADAM: u32 = 11;
pub const HASH: u32 = 12;
/// How many op codes this version defines.
pub const COUNT: u32 = 13;

pub const FLAG_ACCUMULATE: u32 = 1 << 0;
pub const FLAG_BIAS: u32 = 1 << 1;

/// The capability bit of op `code` in [`crate::WorkerVTable::ops`].
pub const fn bit(code: u32) -> u64 {
    1 << code
}

/// Every op this version defines.
pub const ALL: u64 = (1 << COUNT) - 1;

/// The code of an op.
pub fn code(op: &Op) -> u32 {
    match op {
        Op::Matmul(_) => MATMUL,
        Op::Embed { .. } => EMBED,
        Op::EmbedBackward { .. } => EMBED_BACKWARD,
        Op::LayerNorm { .. } => LAYER_NORM,
        Op::LayerNormBackward { .. } => LAYER_NORM_BACKWARD,
        Op::Gelu { .. } => GELU,
        Op::GeluBackward { .. } => GELU_BACKWARD,
        Op::CausalSoftmax { .. } => CAUSAL_SOFTMAX,
        Op::CausalSoftmaxBackward { .. } => CAUSAL_SOFTMAX_BACKWARD,
        Op::BiasGrad { .. } => BIAS_GRAD,
        Op::CrossEntropy { .. } => CROSS_ENTROPY,
        Op::Adam { .. } => ADAM,
        Op::Hash { .. } => HASH,
    }
}

/// A record under construction: spans fill buffers and offsets in order after the scalars.
struct Builder {
    call: OpCall,
    scalars: Vec<u32>,
    spans: Vec<Span>,
}

impl Builder {
    fn new(code: u32) -> Self {
        Self {
            call: OpCall { code, flags: 0, buffers: [0; 8], params: [0; 24] },
            scalars: Vec::new(),
            spans: Vec::new(),
        }
    }

    fn finish(mut self) -> OpCall {
        let n = self.scalars.len();
        self.call.params[..n].copy_from_slice(&self.scalars);
        for (i, s) in self.spans.iter().enumerate() {
            self.call.buffers[i] = s.buffer;
            self.call.params[n + i] = s.offset;
        }
        self.call
    }
}

/// Encodes an op.
pub fn encode(op: &Op) -> OpCall {
    let mut b = Builder::new(code(op));
    match *op {
        Op::Matmul(mm) => {
            let mut p = vec![mm.m, mm.n, mm.k, mm.batch[0], mm.batch[1]];
            for v in [mm.a, mm.b, mm.c] {
                p.extend([v.offset, v.row_stride, v.col_stride, v.batch_stride[0], v.batch_stride[1]]);
            }
            let bias = mm.bias.unwrap_or(Span::new(0, 0));
            p.push(bias.offset);
            b.call.params[..p.len()].copy_from_slice(&p);
            b.call.buffers[..4].copy_from_slice(&[mm.a.buffer, mm.b.buffer, mm.c.buffer, bias.buffer]);
            b.call.flags =
                if mm.accumulate { FLAG_ACCUMULATE } else { 0 } | if mm.bias.is_some() { FLAG_BIAS } else { 0 };
            return b.call;
        }
        Op::Embed { rows, seq, width, vocab, tokens, tok, pos, out } => {
            b.scalars = vec![rows, seq, width, vocab];
            b.spans = vec![tokens, tok, pos, out];
        }
        Op::EmbedBackward { rows, seq, width, vocab, positions, tokens, dy, dtok, dpos } => {
            b.scalars = vec![rows, seq, width, vocab, positions];
            b.spans = vec![tokens, dy, dtok, dpos];
        }
        Op::LayerNorm { rows, width, x, gain, bias, y, xhat, rstd } => {
            b.scalars = vec![rows, width];
            b.spans = vec![x, gain, bias, y, xhat, rstd];
        }
        Op::LayerNormBackward { rows, width, dy, xhat, rstd, gain, dx, dgain, dbias, accumulate } => {
            b.scalars = vec![rows, width];
            b.spans = vec![dy, xhat, rstd, gain, dx, dgain, dbias];
            b.call.flags = if accumulate { FLAG_ACCUMULATE } else { 0 };
        }
        Op::Gelu { len, x, y } => {
            b.scalars = vec![len];
            b.spans = vec![x, y];
        }
        Op::GeluBackward { len, dy, x, dx } => {
            b.scalars = vec![len];
            b.spans = vec![dy, x, dx];
        }
        Op::CausalSoftmax { blocks, t, scale, scores } => {
            b.scalars = vec![blocks, t, scale.to_bits()];
            b.spans = vec![scores];
        }
        Op::CausalSoftmaxBackward { blocks, t, scale, probs, dprobs, dscores } => {
            b.scalars = vec![blocks, t, scale.to_bits()];
            b.spans = vec![probs, dprobs, dscores];
        }
        Op::BiasGrad { rows, width, dy, db } => {
            b.scalars = vec![rows, width];
            b.spans = vec![dy, db];
        }
        Op::CrossEntropy { rows, vocab, logits, targets, dlogits, loss } => {
            b.scalars = vec![rows, vocab];
            b.spans = vec![logits, targets, dlogits, loss];
        }
        Op::Adam { len, weights, grad, m, v, lr, correction1, correction2 } => {
            b.scalars = vec![len, lr.to_bits(), correction1.to_bits(), correction2.to_bits()];
            b.spans = vec![weights, grad, m, v];
        }
        Op::Hash { len, data, out } => {
            b.scalars = vec![len];
            b.spans = vec![data, out];
        }
    }
    b.finish()
}

/// Why a record does not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    UnknownCode(u32),
    UnknownFlags { code: u32, flags: u32 },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::UnknownCode(code) => write!(f, "unknown op code {code}"),
            DecodeError::UnknownFlags { code, flags } => write!(f, "op code {code}: unknown flags {flags:#x}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Decodes a record.
pub fn decode(call: &OpCall) -> Result<Op, DecodeError> {
    let allowed = match call.code {
        MATMUL => FLAG_ACCUMULATE | FLAG_BIAS,
        LAYER_NORM_BACKWARD => FLAG_ACCUMULATE,
        c if c < COUNT => 0,
        c => return Err(DecodeError::UnknownCode(c)),
    };
    if call.flags & !allowed != 0 {
        return Err(DecodeError::UnknownFlags { code: call.code, flags: call.flags });
    }
    let p = &call.params;
    let accumulate = call.flags & FLAG_ACCUMULATE != 0;
    // The i-th span after `scalars` scalars.
    let span = |scalars: usize, i: usize| Span::new(call.buffers[i], p[scalars + i]);
    let f = f32::from_bits;
    Ok(match call.code {
        MATMUL => {
            let view = |i: usize, buffer: u64| {
                let q = &p[5 + 5 * i..];
                MatView { buffer, offset: q[0], row_stride: q[1], col_stride: q[2], batch_stride: [q[3], q[4]] }
            };
            Op::Matmul(Matmul {
                m: p[0],
                n: p[1],
                k: p[2],
                batch: [p[3], p[4]],
                a: view(0, call.buffers[0]),
                b: view(1, call.buffers[1]),
                c: view(2, call.buffers[2]),
                bias: (call.flags & FLAG_BIAS != 0).then(|| Span::new(call.buffers[3], p[20])),
                accumulate,
            })
        }
        EMBED => Op::Embed {
            rows: p[0],
            seq: p[1],
            width: p[2],
            vocab: p[3],
            tokens: span(4, 0),
            tok: span(4, 1),
            pos: span(4, 2),
            out: span(4, 3),
        },
        EMBED_BACKWARD => Op::EmbedBackward {
            rows: p[0],
            seq: p[1],
            width: p[2],
            vocab: p[3],
            positions: p[4],
            tokens: span(5, 0),
            dy: span(5, 1),
            dtok: span(5, 2),
            dpos: span(5, 3),
        },
        LAYER_NORM => Op::LayerNorm {
            rows: p[0],
            width: p[1],
            x: span(2, 0),
            gain: span(2, 1),
            bias: span(2, 2),
            y: span(2, 3),
            xhat: span(2, 4),
            rstd: span(2, 5),
        },
        LAYER_NORM_BACKWARD => Op::LayerNormBackward {
            rows: p[0],
            width: p[1],
            dy: span(2, 0),
            xhat: span(2, 1),
            rstd: span(2, 2),
            gain: span(2, 3),
            dx: span(2, 4),
            dgain: span(2, 5),
            dbias: span(2, 6),
            accumulate,
        },
        GELU => Op::Gelu { len: p[0], x: span(1, 0), y: span(1, 1) },
        GELU_BACKWARD => Op::GeluBackward { len: p[0], dy: span(1, 0), x: span(1, 1), dx: span(1, 2) },
        CAUSAL_SOFTMAX => Op::CausalSoftmax { blocks: p[0], t: p[1], scale: f(p[2]), scores: span(3, 0) },
        CAUSAL_SOFTMAX_BACKWARD => Op::CausalSoftmaxBackward {
            blocks: p[0],
            t: p[1],
            scale: f(p[2]),
            probs: span(3, 0),
            dprobs: span(3, 1),
            dscores: span(3, 2),
        },
        BIAS_GRAD => Op::BiasGrad { rows: p[0], width: p[1], dy: span(2, 0), db: span(2, 1) },
        CROSS_ENTROPY => Op::CrossEntropy {
            rows: p[0],
            vocab: p[1],
            logits: span(2, 0),
            targets: span(2, 1),
            dlogits: span(2, 2),
            loss: span(2, 3),
        },
        ADAM => Op::Adam {
            len: p[0],
            lr: f(p[1]),
            correction1: f(p[2]),
            correction2: f(p[3]),
            weights: span(4, 0),
            grad: span(4, 1),
            m: span(4, 2),
            v: span(4, 3),
        },
        HASH => Op::Hash { len: p[0], data: span(1, 0), out: span(1, 1) },
        _ => unreachable!("codes below COUNT are matched above"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn op_call_layout_is_pinned() {
        assert_eq!(size_of::<OpCall>(), 168);
        assert_eq!(offset_of!(OpCall, code), 0);
        assert_eq!(offset_of!(OpCall, flags), 4);
        assert_eq!(offset_of!(OpCall, buffers), 8);
        assert_eq!(offset_of!(OpCall, params), 72);
        let codes = [
            MATMUL,
            EMBED,
            EMBED_BACKWARD,
            LAYER_NORM,
            LAYER_NORM_BACKWARD,
            GELU,
            GELU_BACKWARD,
            CAUSAL_SOFTMAX,
            CAUSAL_SOFTMAX_BACKWARD,
            BIAS_GRAD,
            CROSS_ENTROPY,
            ADAM,
            HASH,
        ];
        assert_eq!(codes.to_vec(), (0..13).collect::<Vec<u32>>());
        assert_eq!((FLAG_ACCUMULATE, FLAG_BIAS, ALL), (1, 2, 0x1fff));
    }

    /// Every op survives the trip, and the golden record of a matmul pins the param order.
    #[test]
    fn every_op_round_trips_and_the_matmul_record_is_pinned() {
        let s = |b: u64, o: u32| Span::new(b, o);
        let mm = Matmul {
            m: 2,
            n: 3,
            k: 4,
            batch: [5, 6],
            a: MatView { buffer: 7, offset: 8, row_stride: 9, col_stride: 10, batch_stride: [11, 12] },
            b: MatView { buffer: 13, offset: 14, row_stride: 15, col_stride: 16, batch_stride: [17, 18] },
            c: MatView { buffer: 19, offset: 20, row_stride: 21, col_stride: 22, batch_stride: [23, 24] },
            bias: Some(s(25, 26)),
            accumulate: true,
        };
        let call = encode(&Op::Matmul(mm));
        assert_eq!(call.flags, 3);
        assert_eq!(call.buffers, [7, 13, 19, 25, 0, 0, 0, 0]);
        assert_eq!(call.params[..21], [2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 14, 15, 16, 17, 18, 20, 21, 22, 23, 24, 26]);
        let ops = [
            Op::Matmul(mm),
            Op::Matmul(Matmul { bias: None, accumulate: false, ..mm }),
            Op::Embed {
                rows: 1,
                seq: 2,
                width: 3,
                vocab: 4,
                tokens: s(1, 2),
                tok: s(3, 4),
                pos: s(5, 6),
                out: s(7, 8),
            },
            Op::EmbedBackward {
                rows: 1,
                seq: 2,
                width: 3,
                vocab: 4,
                positions: 5,
                tokens: s(1, 2),
                dy: s(3, 4),
                dtok: s(5, 6),
                dpos: s(7, 8),
            },
            Op::LayerNorm {
                rows: 1,
                width: 2,
                x: s(1, 1),
                gain: s(2, 2),
                bias: s(3, 3),
                y: s(4, 4),
                xhat: s(5, 5),
                rstd: s(6, 6),
            },
            Op::LayerNormBackward {
                rows: 1,
                width: 2,
                dy: s(1, 1),
                xhat: s(2, 2),
                rstd: s(3, 3),
                gain: s(4, 4),
                dx: s(5, 5),
                dgain: s(6, 6),
                dbias: s(7, 7),
                accumulate: true,
            },
            Op::Gelu { len: 9, x: s(1, 2), y: s(3, 4) },
            Op::GeluBackward { len: 9, dy: s(1, 2), x: s(3, 4), dx: s(5, 6) },
            Op::CausalSoftmax { blocks: 2, t: 3, scale: 0.25, scores: s(1, 2) },
            Op::CausalSoftmaxBackward {
                blocks: 2,
                t: 3,
                scale: 0.5,
                probs: s(1, 1),
                dprobs: s(2, 2),
                dscores: s(3, 3),
            },
            Op::BiasGrad { rows: 4, width: 5, dy: s(1, 1), db: s(2, 2) },
            Op::CrossEntropy { rows: 1, vocab: 2, logits: s(1, 1), targets: s(2, 2), dlogits: s(3, 3), loss: s(4, 4) },
            Op::Adam {
                len: 3,
                weights: s(1, 1),
                grad: s(2, 2),
                m: s(3, 3),
                v: s(4, 4),
                lr: 0.1,
                correction1: 0.2,
                correction2: 0.3,
            },
            Op::Hash { len: 4, data: s(1, 1), out: s(2, 2) },
        ];
        for op in ops {
            assert_eq!(decode(&encode(&op)), Ok(op), "{op:?}");
        }
        assert_eq!(decode(&OpCall { code: 13, ..call }), Err(DecodeError::UnknownCode(13)));
        assert_eq!(
            decode(&OpCall { code: GELU, flags: 1, ..call }),
            Err(DecodeError::UnknownFlags { code: GELU, flags: 1 })
        );
    }
}
