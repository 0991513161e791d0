//! The model as an op sequence: one training step (forward, loss, backward) written as
//! `lockstep_luts::ops` on a device's buffers.
//!
//! [`Program::new`] allocates every tensor of a step once on a [`Device`] — weights, gradient,
//! tokens and targets, each layer's activations, the backward pass's scratch — and writes the
//! sequence. Per step only the weights (when they changed), the tokens and the targets go in,
//! and the loss and the gradient come out. Transposes are views (strides), attention is one
//! batched product per form over (sequence × head), biases and residual additions ride on the
//! products.
//!
//! The sequence computes exactly what the model's definition says (`docs/MODEL.md`); the op
//! definitions say how every word is rounded.

use lockstep_luts::ops::{self, Handle, MatView, Matmul, Op, Span};

use crate::compute_error::ComputeError;
use crate::config::VOCAB;
use crate::device::Device;
use crate::params::Layout;

/// One layer's activation buffers.
struct LayerBuffers {
    h1: Handle,
    ln1_xhat: Handle,
    ln1_rstd: Handle,
    qkv: Handle,
    /// `[batch][head][t][t]`.
    probs: Handle,
    att: Handle,
    h2: Handle,
    ln2_xhat: Handle,
    ln2_rstd: Handle,
    /// The MLP's pre-activation.
    u: Handle,
    /// Its GELU, kept for the backward pass in host memory; on an accelerator it is computed
    /// again there instead (see `wide` in [`Program::build`]).
    gelu: Option<Handle>,
}

/// A step's buffers on one device and the op sequences over them.
pub struct Program {
    pub batch: usize,
    pub seq: usize,
    pub weights: Handle,
    pub grads: Handle,
    pub tokens: Handle,
    pub targets: Handle,
    pub loss: Handle,
    pub logits: Handle,
    /// The forward pass and the loss, then (a training program) the backward pass into
    /// `grads`.
    ops: Vec<Op>,
    /// How many of `ops` are the forward pass and the loss.
    forward_len: usize,
    buffers: Vec<Handle>,
}

/// A device that only counts the words a program's buffers take (each padded the way a GPU
/// arena aligns it), for [`Device::reserve`].
#[derive(Default)]
struct Counter {
    words: usize,
    next: Handle,
}

impl Device for Counter {
    fn create_buffer(&mut self, words: usize) -> Result<Handle, ComputeError> {
        // 64-word alignment, as `lockstep-gpu`'s arena keeps it.
        self.words += words.max(1).next_multiple_of(64);
        self.next += 1;
        Ok(self.next)
    }

    fn free_buffer(&mut self, _buffer: Handle) {}

    fn write(&mut self, _buffer: Handle, _offset: usize, _words: &[u32]) -> Result<(), ComputeError> {
        Ok(())
    }

    fn read(&mut self, _buffer: Handle, _offset: usize, _out: &mut [u32]) -> Result<(), ComputeError> {
        Ok(())
    }

    fn run(&mut self, _ops: &[Op]) -> Result<(), ComputeError> {
        Ok(())
    }

    fn computes(&self, _op: &Op) -> bool {
        false
    }

    fn label(&self) -> String {
        "word counter".into()
    }

    fn instance(&self) -> u64 {
        0
    }
}

fn u(v: usize) -> u32 {
    u32::try_from(v).expect("model shapes fit in 32 bits (checked by the run config)")
}

impl Program {
    /// Allocates a training step of `batch` sequences of `seq` tokens on `device` and writes
    /// its ops.
    pub fn new(device: &mut dyn Device, layout: &Layout, batch: usize, seq: usize) -> Result<Program, ComputeError> {
        Self::with_room(device, layout, batch, seq, 0)
    }

    /// [`Program::new`], reserving room for `extra` more words the caller creates right after
    /// (the optimizer's moments), so the device grows once for all of them.
    pub fn with_room(
        device: &mut dyn Device,
        layout: &Layout,
        batch: usize,
        seq: usize,
        extra: usize,
    ) -> Result<Program, ComputeError> {
        let recompute = device.accelerator();
        let mut counter = Counter::default();
        Self::build(&mut counter, layout, batch, seq, true, recompute)?;
        device.reserve(counter.words + extra)?;
        Self::build(device, layout, batch, seq, true, recompute)
    }

    /// The forward pass and the loss only (evaluation, generation): no gradient and no backward
    /// buffers are allocated.
    pub fn forward_only(
        device: &mut dyn Device,
        layout: &Layout,
        batch: usize,
        seq: usize,
    ) -> Result<Program, ComputeError> {
        let recompute = device.accelerator();
        let mut counter = Counter::default();
        Self::build(&mut counter, layout, batch, seq, false, recompute)?;
        device.reserve(counter.words)?;
        Self::build(device, layout, batch, seq, false, recompute)
    }

    /// The program's buffers and ops. `recompute_gelu` (on accelerators, where device memory
    /// is what limits the model): the layers' GELU outputs share one buffer and the backward
    /// pass computes each again where it needs it — one more GELU a layer, `4·c` words a row
    /// fewer per layer, the same bits.
    fn build(
        device: &mut dyn Device,
        layout: &Layout,
        batch: usize,
        seq: usize,
        training: bool,
        recompute_gelu: bool,
    ) -> Result<Program, ComputeError> {
        let cfg = layout.config;
        let (c, heads) = (cfg.width, cfg.heads);
        let hd = c / heads;
        let n = batch * seq;
        let t = seq;
        let mut buffers = Vec::new();
        let mut alloc = |words: usize| -> Result<Handle, ComputeError> {
            let h = device.create_buffer(words.max(1))?;
            buffers.push(h);
            Ok(h)
        };
        let weights = alloc(layout.len)?;
        let grads = if training { alloc(layout.len)? } else { 0 };
        let tokens = alloc(n)?;
        let targets = alloc(n)?;
        let loss = alloc(1)?;
        let x = alloc(n * c)?;
        let mut layers = Vec::new();
        for _ in &layout.layers {
            layers.push(LayerBuffers {
                h1: alloc(n * c)?,
                ln1_xhat: alloc(n * c)?,
                ln1_rstd: alloc(n)?,
                qkv: alloc(n * 3 * c)?,
                probs: alloc(batch * heads * t * t)?,
                att: alloc(n * c)?,
                h2: alloc(n * c)?,
                ln2_xhat: alloc(n * c)?,
                ln2_rstd: alloc(n)?,
                u: alloc(n * 4 * c)?,
                gelu: if recompute_gelu { None } else { Some(alloc(n * 4 * c)?) },
            });
        }
        // The MLP's wide buffer. With `recompute_gelu`, each layer's GELU output lives here until
        // the next layer overwrites it, and the backward pass computes it here again where it
        // needs it; either way the backward pass then keeps the GELU's input gradient here.
        let wide = alloc(n * 4 * c)?;
        let hf = alloc(n * c)?;
        let lnf_xhat = alloc(n * c)?;
        let lnf_rstd = alloc(n)?;
        let logits = alloc(n * VOCAB)?;
        let dlogits = alloc(n * VOCAB)?;

        let w = |r: &std::ops::Range<usize>| Span::new(weights, u(r.start));
        let g = |r: &std::ops::Range<usize>| Span::new(grads, u(r.start));
        let s0 = |h: Handle| Span::new(h, 0);
        let scale = 1.0 / (hd as f32).sqrt();
        let (nu, cu, tu, hdu) = (u(n), u(c), u(t), u(hd));
        let batch2 = [u(batch), u(heads)];

        // `y = x · Wᵀ + b` (`accumulate`: `y += …`), x `[n, inp]` in `xb`, W `[out, inp]`.
        let linear = |xb: Handle,
                      inp: usize,
                      wr: &std::ops::Range<usize>,
                      br: &std::ops::Range<usize>,
                      out: usize,
                      y: Handle,
                      accumulate: bool| {
            Op::Matmul(Matmul {
                m: nu,
                n: u(out),
                k: u(inp),
                batch: [1, 1],
                a: MatView::rows(xb, 0, u(inp)),
                b: MatView::rows(weights, u(wr.start), u(inp)),
                c: MatView::rows(y, 0, u(out)),
                bias: Some(w(br)),
                accumulate,
            })
        };
        // The backward of `linear`: `dx = dy · W` (set or accumulated), `dW = dyᵀ · x`, `db`.
        let linear_backward = |xb: Handle,
                               inp: usize,
                               wr: &std::ops::Range<usize>,
                               br: &std::ops::Range<usize>,
                               out: usize,
                               dy: Handle,
                               dxb: Handle,
                               ops: &mut Vec<Op>| {
            ops.push(Op::Matmul(Matmul {
                m: nu,
                n: u(inp),
                k: u(out),
                batch: [1, 1],
                a: MatView::rows(dy, 0, u(out)),
                b: MatView::transposed(weights, u(wr.start), u(inp)),
                c: MatView::rows(dxb, 0, u(inp)),
                bias: None,
                accumulate: false,
            }));
            ops.push(Op::Matmul(Matmul {
                m: u(out),
                n: u(inp),
                k: nu,
                batch: [1, 1],
                a: MatView::transposed(dy, 0, u(out)),
                b: MatView::transposed(xb, 0, u(inp)),
                c: MatView::rows(grads, u(wr.start), u(inp)),
                bias: None,
                accumulate: false,
            }));
            ops.push(Op::BiasGrad(ops::BiasGrad { rows: nu, width: u(out), dy: s0(dy), db: g(br) }));
        };
        // Per (sequence, head) views into `[n, width]` row-major activations, head `h` at
        // column `col + h·hd`: rows are positions.
        let heads_view =
            |buf: Handle, col: usize, width: usize| MatView::rows(buf, u(col), u(width)).batched([u(t * width), hdu]);
        let heads_view_t = |buf: Handle, col: usize, width: usize| {
            MatView::transposed(buf, u(col), u(width)).batched([u(t * width), hdu])
        };
        let blocks = |buf: Handle| MatView::rows(buf, 0, tu).batched([u(heads * t * t), u(t * t)]);
        let blocks_t = |buf: Handle| MatView::transposed(buf, 0, tu).batched([u(heads * t * t), u(t * t)]);
        let attn =
            |m, n, k, a, b, c| Op::Matmul(Matmul { m, n, k, batch: batch2, a, b, c, bias: None, accumulate: false });

        // LayerNorm of the residual stream `x`.
        let layer_norm = |gr: &std::ops::Range<usize>, br: &std::ops::Range<usize>, y, xhat, rstd| {
            Op::LayerNorm(ops::LayerNorm {
                rows: nu,
                width: cu,
                x: s0(x),
                gain: w(gr),
                bias: w(br),
                y: s0(y),
                xhat: s0(xhat),
                rstd: s0(rstd),
            })
        };
        let mut forward = vec![Op::Embed(ops::Embed {
            rows: nu,
            seq: tu,
            width: cu,
            vocab: u(VOCAB),
            tokens: s0(tokens),
            tok: w(&layout.tok_emb),
            pos: w(&layout.pos_emb),
            out: s0(x),
        })];
        for (lo, lb) in layout.layers.iter().zip(&layers) {
            forward.push(layer_norm(&lo.ln1_g, &lo.ln1_b, lb.h1, lb.ln1_xhat, lb.ln1_rstd));
            forward.push(linear(lb.h1, c, &lo.qkv_w, &lo.qkv_b, 3 * c, lb.qkv, false));
            // S = Q · Kᵀ per (sequence, head); softmax; O = P · V.
            forward.push(attn(
                tu,
                tu,
                hdu,
                heads_view(lb.qkv, 0, 3 * c),
                heads_view(lb.qkv, c, 3 * c),
                blocks(lb.probs),
            ));
            forward.push(Op::CausalSoftmax(ops::CausalSoftmax {
                blocks: u(batch * heads),
                t: tu,
                scale,
                scores: s0(lb.probs),
            }));
            forward.push(attn(
                tu,
                hdu,
                tu,
                blocks(lb.probs),
                heads_view_t(lb.qkv, 2 * c, 3 * c),
                heads_view(lb.att, 0, c),
            ));
            forward.push(linear(lb.att, c, &lo.proj_w, &lo.proj_b, c, x, true));
            forward.push(layer_norm(&lo.ln2_g, &lo.ln2_b, lb.h2, lb.ln2_xhat, lb.ln2_rstd));
            forward.push(linear(lb.h2, c, &lo.fc_w, &lo.fc_b, 4 * c, lb.u, false));
            let gelu = lb.gelu.unwrap_or(wide);
            forward.push(Op::Gelu(ops::Gelu { len: u(n * 4 * c), x: s0(lb.u), y: s0(gelu) }));
            forward.push(linear(gelu, 4 * c, &lo.fc2_w, &lo.fc2_b, c, x, true));
        }
        forward.push(layer_norm(&layout.lnf_g, &layout.lnf_b, hf, lnf_xhat, lnf_rstd));
        forward.push(linear(hf, c, &layout.head_w, &layout.head_b, VOCAB, logits, false));
        forward.push(Op::CrossEntropy(ops::CrossEntropy {
            rows: nu,
            vocab: u(VOCAB),
            logits: s0(logits),
            targets: s0(targets),
            dlogits: s0(dlogits),
            loss: s0(loss),
        }));

        let forward_len = forward.len();
        let mut ops = forward;
        if training {
            let dx = alloc(n * c)?;
            let dh = alloc(n * c)?;
            let dwide = alloc(n * 4 * c)?;
            let datt = alloc(n * c)?;
            let dqkv = alloc(n * 3 * c)?;
            let dp = alloc(batch * heads * t * t)?;
            let ds = alloc(batch * heads * t * t)?;
            let backward = &mut ops;
            linear_backward(hf, c, &layout.head_w, &layout.head_b, VOCAB, dlogits, dh, backward);
            let ln_backward = |dy, xhat, rstd, gr: &std::ops::Range<usize>, br: &std::ops::Range<usize>, accumulate| {
                Op::LayerNormBackward(ops::LayerNormBackward {
                    rows: nu,
                    width: cu,
                    dy: s0(dy),
                    xhat: s0(xhat),
                    rstd: s0(rstd),
                    gain: w(gr),
                    dx: s0(dx),
                    dgain: g(gr),
                    dbias: g(br),
                    accumulate,
                })
            };
            backward.push(ln_backward(dh, lnf_xhat, lnf_rstd, &layout.lnf_g, &layout.lnf_b, false));
            for (i, (lo, lb)) in layout.layers.iter().zip(&layers).enumerate().rev() {
                // x = x_mid + mlp(ln2(x_mid)). A shared `wide` still holds the last layer's GELU
                // from the forward pass; the others' are computed again.
                let gelu = lb.gelu.unwrap_or(wide);
                if lb.gelu.is_none() && i + 1 < layout.layers.len() {
                    backward.push(Op::Gelu(ops::Gelu { len: u(n * 4 * c), x: s0(lb.u), y: s0(wide) }));
                }
                linear_backward(gelu, 4 * c, &lo.fc2_w, &lo.fc2_b, c, dx, dwide, backward);
                // The GELU's input gradient (over the spent GELU, when it is shared).
                backward.push(Op::GeluBackward(ops::GeluBackward {
                    len: u(n * 4 * c),
                    dy: s0(dwide),
                    x: s0(lb.u),
                    dx: s0(wide),
                }));
                linear_backward(lb.h2, c, &lo.fc_w, &lo.fc_b, 4 * c, wide, dh, backward);
                backward.push(ln_backward(dh, lb.ln2_xhat, lb.ln2_rstd, &lo.ln2_g, &lo.ln2_b, true));
                // x_mid = x_in + proj(attn(ln1(x_in)))
                linear_backward(lb.att, c, &lo.proj_w, &lo.proj_b, c, dx, datt, backward);
                // dP = dO · Vᵀ; dV = Pᵀ · dO; dS; dQ = dS · K; dK = dSᵀ · Q.
                backward.push(attn(tu, tu, hdu, heads_view(datt, 0, c), heads_view(lb.qkv, 2 * c, 3 * c), blocks(dp)));
                backward.push(attn(
                    tu,
                    hdu,
                    tu,
                    blocks_t(lb.probs),
                    heads_view_t(datt, 0, c),
                    heads_view(dqkv, 2 * c, 3 * c),
                ));
                backward.push(Op::CausalSoftmaxBackward(ops::CausalSoftmaxBackward {
                    blocks: u(batch * heads),
                    t: tu,
                    scale,
                    probs: s0(lb.probs),
                    dprobs: s0(dp),
                    dscores: s0(ds),
                }));
                backward.push(attn(
                    tu,
                    hdu,
                    tu,
                    blocks(ds),
                    heads_view_t(lb.qkv, c, 3 * c),
                    heads_view(dqkv, 0, 3 * c),
                ));
                backward.push(attn(
                    tu,
                    hdu,
                    tu,
                    blocks_t(ds),
                    heads_view_t(lb.qkv, 0, 3 * c),
                    heads_view(dqkv, c, 3 * c),
                ));
                linear_backward(lb.h1, c, &lo.qkv_w, &lo.qkv_b, 3 * c, dqkv, dh, backward);
                backward.push(ln_backward(dh, lb.ln1_xhat, lb.ln1_rstd, &lo.ln1_g, &lo.ln1_b, true));
            }
            backward.push(Op::EmbedBackward(ops::EmbedBackward {
                rows: nu,
                seq: tu,
                width: cu,
                vocab: u(VOCAB),
                positions: u(cfg.context),
                tokens: s0(tokens),
                dy: s0(dx),
                dtok: g(&layout.tok_emb),
                dpos: g(&layout.pos_emb),
            }));
        }
        Ok(Program { batch, seq, weights, grads, tokens, targets, loss, logits, ops, forward_len, buffers })
    }

    /// The forward pass and the loss.
    pub fn forward(&self) -> &[Op] {
        &self.ops[..self.forward_len]
    }

    /// The whole step: the forward pass, the loss, and (a training program) the backward pass.
    pub fn step(&self) -> &[Op] {
        &self.ops
    }

    /// Every buffer the program allocated (to free them).
    pub fn buffers(&self) -> &[Handle] {
        &self.buffers
    }
}
