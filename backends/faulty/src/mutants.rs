//! The mutant catalogue: small, plausible departures from the reference, each a whole plugin
//! (`examples/mutant.rs`, the mutation named by `LOCKSTEP_MUTANT` when the plugin is created;
//! `examples/flaw_op_softmax.rs`, one of them fixed) that the exact gate must reject.
//! `tests/e2e/cli.rs` (`the_gate_rejects_every_mutant_of_the_reference`) gates every one and
//! checks the case that kills it against `docs/VERIFICATION.md` §11, which lists them.
//!
//! Two families: the units ([`Flaw`]: rounding points, flushes, sign and NaN rules, the block
//! scale, the block and tail shapes, accumulation width and order), computed by
//! [`crate::flaws::flawed_gemm`] for products and for the step's products alike; and the step's ops
//! ([`OpMutation`]: each op's sums, constants, orders and formulas), where the plugin runs the
//! reference for every op and then redoes the mutated op's outputs its own way.

use lockstep_luts::ops;
use lockstep_luts::ops::{self as kernels, run_reference, Memory, Op, Span};
use lockstep_luts::{hash, mathf};
use lockstep_worker_api::plugin::WorkerError;
use lockstep_worker_api::status;

use crate::flaws::Flaw;

/// One departure of an op from its definition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpMutation {
    LayerNormEps6,
    LayerNormBessel,
    LayerNormIndexOrder,
    LayerNormMeanByReciprocal,
    LayerNormBackwardOverwrites,
    LayerNormParamGradsIndexOrder,
    BiasGradIndexOrder,
    BiasGradLanesReversed,
    GeluLibmTanh,
    GeluSigmoid,
    GeluBackwardHalfTerm,
    SoftmaxLibmExp,
    SoftmaxNoMax,
    SoftmaxIndexOrderSum,
    SoftmaxBackwardIndexOrderDot,
    SoftmaxBackwardScaleFirst,
    CrossEntropyDividesTwice,
    CrossEntropyMeanDivides,
    AdamEpsInsideSqrt,
    AdamNoCorrection2,
    AdamFusedMoments,
    HashUnchunked,
    EmbedBackwardIndexOrder,
    EmbedBackwardPositionsModTable,
    MatmulAccumulateBeforeBias,
}

/// What a mutant changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    Units(Flaw),
    Op(OpMutation),
}

/// A named mutant.
#[derive(Clone, Copy, Debug)]
pub struct Mutant {
    pub name: &'static str,
    pub mutation: Mutation,
    pub what: &'static str,
}

macro_rules! catalogue {
    ($($name:literal $mutation:expr => $what:literal,)*) => {
        /// Every mutant, units first, in the order `docs/VERIFICATION.md` §11 lists them.
        pub const MUTANTS: &[Mutant] = &[$(Mutant { name: $name, mutation: $mutation, what: $what },)*];
    };
}

use Mutation::{Op as O, Units as U};
use OpMutation as M;

catalogue! {
    "units-f32-accumulation" U(Flaw::F32Accumulation) => "dequantized products summed in f32, no exact block sums",
    "units-saturating-pairs" U(Flaw::SaturatingPairs) => "quants in [-128, 127], product pairs summed in saturating i16",
    "units-round-half-away" U(Flaw::RoundHalfAway) => "quantizer rounds halves away from zero",
    "units-reversed-blocks" U(Flaw::ReversedBlocks) => "block terms added last block first",
    "units-boundary-exponent" U(Flaw::BoundaryExponent) => "block exponent carried at exactly 127·2^e (≥ for >)",
    "units-integer-sums-in-f32" U(Flaw::IntegerSumsInF32) => "integer products accumulated in f32",
    "units-cache-by-address" U(Flaw::CacheByAddress) => "results reused for the same operand addresses",
    "units-flush-at-end" U(Flaw::FlushAtEnd) => "only the final sum flushed",
    "units-no-flush" U(Flaw::NoFlush) => "no flush at all",
    "units-flush-keeps-sign" U(Flaw::FlushKeepsSign) => "a flushed partial sum keeps its sign (−0)",
    "units-nan-not-canonical" U(Flaw::NanNotCanonical) => "NaN results left as the hardware makes them",
    "units-round-toward-zero" U(Flaw::RoundTowardZero) => "quantizer truncates",
    "units-round-half-up" U(Flaw::RoundHalfUp) => "quantizer rounds halves toward +∞",
    "units-exponent-plus-one" U(Flaw::ExponentPlusOne) => "block exponent one too large",
    "units-exponent-of-first" U(Flaw::ExponentOfFirst) => "block exponent from the block's first value",
    "units-no-exponent-carry" U(Flaw::NoExponentCarry) => "block exponent never carried, quants saturate",
    "units-row-exponent" U(Flaw::RowExponent) => "one exponent per row instead of per block",
    "units-blocks-of-16" U(Flaw::Blocks16) => "blocks of 16 values",
    "units-tail-dropped" U(Flaw::TailDropped) => "a short last block ignored",
    "units-wrapping-i16-sums" U(Flaw::WrapI16Sums) => "block sums in wrapping i16",
    "units-term-by-multiply" U(Flaw::TermByMultiply) => "block term by a float multiply, not on the bits",
    "units-term-saturates" U(Flaw::TermSaturates) => "an overflowing block term becomes ±f32::MAX",
    "units-pairwise-blocks" U(Flaw::PairwiseBlocks) => "block terms added as a tree",
    "units-terms-in-f64" U(Flaw::TermsInF64) => "block terms added in f64, rounded once",
    "units-merge-equal-exponents" U(Flaw::MergeEqualExponents) => "neighbouring blocks of one exponent: their block sums added, rounded once",
    "units-merge-one-exponent-row" U(Flaw::MergeOneExponentRow) => "an output whose blocks share one exponent: one integer dot product, rounded once",
    "layer-norm-eps-1e-6" O(M::LayerNormEps6) => "ε = 1e-6",
    "layer-norm-bessel" O(M::LayerNormBessel) => "variance divided by c − 1",
    "layer-norm-index-order" O(M::LayerNormIndexOrder) => "row sums in index order, not lane sums",
    "layer-norm-mean-by-reciprocal" O(M::LayerNormMeanByReciprocal) => "mean as sum · (1/c)",
    "layer-norm-backward-overwrites" O(M::LayerNormBackwardOverwrites) => "dx set where it should be added to",
    "layer-norm-param-grads-index-order" O(M::LayerNormParamGradsIndexOrder) => "gain and bias gradients summed in row order",
    "bias-grad-index-order" O(M::BiasGradIndexOrder) => "column sums in row order",
    "bias-grad-lanes-reversed" O(M::BiasGradLanesReversed) => "lane totals added last lane first",
    "gelu-libm-tanh" O(M::GeluLibmTanh) => "the platform's tanh",
    "gelu-sigmoid" O(M::GeluSigmoid) => "x · σ(1.702 x) instead of the tanh form",
    "gelu-backward-half-term" O(M::GeluBackwardHalfTerm) => "derivative without its second term",
    "softmax-libm-exp" O(M::SoftmaxLibmExp) => "the platform's exp",
    "softmax-no-max" O(M::SoftmaxNoMax) => "no maximum subtracted",
    "softmax-index-order-sum" O(M::SoftmaxIndexOrderSum) => "row sum in index order",
    "softmax-backward-index-order-dot" O(M::SoftmaxBackwardIndexOrderDot) => "p · dp summed in index order",
    "softmax-backward-scale-first" O(M::SoftmaxBackwardScaleFirst) => "p · ((dp − dot) · scale)",
    "cross-entropy-divides-twice" O(M::CrossEntropyDividesTwice) => "dlogits as e / sum / rows",
    "cross-entropy-mean-divides" O(M::CrossEntropyMeanDivides) => "mean loss as sum / rows",
    "adam-eps-inside-sqrt" O(M::AdamEpsInsideSqrt) => "√(v̂ + ε)",
    "adam-no-second-correction" O(M::AdamNoCorrection2) => "v not bias-corrected",
    "adam-fused-moments" O(M::AdamFusedMoments) => "moments by fused multiply-add",
    "hash-unchunked" O(M::HashUnchunked) => "FNV-1a over all words, not chunk hashes",
    "embed-backward-index-order" O(M::EmbedBackwardIndexOrder) => "table rows summed in row order",
    "embed-backward-positions-mod-table" O(M::EmbedBackwardPositionsModTable) => "position r mod positions, not r mod seq",
    "matmul-accumulate-before-bias" O(M::MatmulAccumulateBeforeBias) => "(c + product) + bias",
}

/// A step's product with the units' `flaw`: the operands gathered through their views as the
/// reference does, then the bias and the accumulation as it does.
pub fn run_matmul(flaw: Flaw, mm: &ops::Matmul, mem: &mut Memory) -> Result<(), String> {
    let (m, n, k) = (mm.m as usize, mm.n as usize, mm.k as usize);
    let bias = mm.bias.map(|b| floats(mem, b, n));
    for p in 0..mm.batch[0] as usize {
        for q in 0..mm.batch[1] as usize {
            let gather = |v: &ops::MatView, rows: usize| -> Vec<f32> {
                let words = &mem[&v.buffer];
                (0..rows).flat_map(|i| (0..k).map(move |l| f32::from_bits(words[v.index(p, q, i, l)]))).collect()
            };
            let (a, b) = (gather(&mm.a, m), gather(&mm.b, n));
            let mut c = vec![0.0f32; m * n];
            crate::flaws::flawed_gemm(flaw, m, n, k, &a, &b, &mut c)?;
            let out = mem.get_mut(&mm.c.buffer).expect("a checked buffer");
            for i in 0..m {
                for j in 0..n {
                    let mut v = c[i * n + j];
                    if let Some(bias) = &bias {
                        v += bias[j];
                    }
                    let at = mm.c.index(p, q, i, j);
                    out[at] = if mm.accumulate { (f32::from_bits(out[at]) + v).to_bits() } else { v.to_bits() };
                }
            }
        }
    }
    Ok(())
}

/// The mutant named `name`.
pub fn find(name: &str) -> Option<Mutant> {
    MUTANTS.iter().copied().find(|m| m.name == name)
}

fn floats(mem: &Memory, span: Span, len: usize) -> Vec<f32> {
    let start = span.offset as usize;
    mem[&span.buffer][start..start + len].iter().map(|&w| f32::from_bits(w)).collect()
}

fn words(mem: &Memory, span: Span, len: usize) -> Vec<u32> {
    let start = span.offset as usize;
    mem[&span.buffer][start..start + len].to_vec()
}

fn put(mem: &mut Memory, span: Span, values: &[f32]) {
    let start = span.offset as usize;
    let out = &mut mem.get_mut(&span.buffer).expect("a checked buffer")[start..start + values.len()];
    for (o, v) in out.iter_mut().zip(values) {
        *o = v.to_bits();
    }
}

/// A sum in index order from +0.
fn in_order(values: impl IntoIterator<Item = f32>) -> f32 {
    values.into_iter().fold(0.0, |s, v| s + v)
}

/// The definition's lane sum, its lane totals added last lane first.
fn lanes_reversed(values: &[f32]) -> f32 {
    let mut lanes = [0.0f32; kernels::LANES];
    for (i, &v) in values.iter().enumerate() {
        lanes[i % kernels::LANES] += v;
    }
    lanes.iter().rev().fold(0.0, |s, &v| s + v)
}

/// Runs `op` as the mutant does: the reference, then the mutated op's outputs redone.
pub fn run_op(mutation: OpMutation, op: &Op, mem: &mut Memory) -> Result<(), ops::OpError> {
    use OpMutation as M;
    if let Some(done) = run_in_place(mutation, op, mem) {
        return done;
    }
    match (mutation, *op) {
        (M::LayerNormBackwardOverwrites, Op::LayerNormBackward(o)) => {
            return run_reference(&Op::LayerNormBackward(ops::LayerNormBackward { accumulate: false, ..o }), mem);
        }
        (M::EmbedBackwardPositionsModTable, Op::EmbedBackward(o)) => {
            run_reference(op, mem)?;
            let (rows, width) = (o.rows as usize, o.width as usize);
            let dy = floats(mem, o.dy, rows * width);
            let mut dpos = vec![0.0f32; o.positions as usize * width];
            for (r, row) in dy.chunks_exact(width).enumerate() {
                let p = r % o.positions as usize;
                for (acc, &d) in dpos[p * width..][..width].iter_mut().zip(row) {
                    *acc += d;
                }
            }
            put(mem, o.dpos, &dpos);
            return Ok(());
        }
        (M::MatmulAccumulateBeforeBias, Op::Matmul(mm)) if mm.accumulate && mm.bias.is_some() => {
            let bias = floats(mem, mm.bias.expect("checked"), mm.n as usize);
            let before = mem.clone();
            run_reference(&Op::Matmul(ops::Matmul { bias: None, accumulate: false, ..mm }), mem)?;
            for p in 0..mm.batch[0] as usize {
                for q in 0..mm.batch[1] as usize {
                    for i in 0..mm.m as usize {
                        for (j, &b) in bias.iter().enumerate() {
                            let at = mm.c.index(p, q, i, j);
                            let product = f32::from_bits(mem[&mm.c.buffer][at]);
                            let old = f32::from_bits(before[&mm.c.buffer][at]);
                            mem.get_mut(&mm.c.buffer).expect("checked")[at] = ((old + product) + b).to_bits();
                        }
                    }
                }
            }
            return Ok(());
        }
        _ => run_reference(op, mem)?,
    }
    match (mutation, *op) {
        (
            M::LayerNormEps6 | M::LayerNormBessel | M::LayerNormIndexOrder | M::LayerNormMeanByReciprocal,
            Op::LayerNorm(o),
        ) => {
            let (rows, width) = (o.rows as usize, o.width as usize);
            let (x, gain, bias) =
                (floats(mem, o.x, rows * width), floats(mem, o.gain, width), floats(mem, o.bias, width));
            let (mut y, mut xhat, mut rstd) = (vec![0.0; rows * width], vec![0.0; rows * width], vec![0.0; rows]);
            let c = width as f32;
            let sum = |v: &[f32]| {
                if mutation == M::LayerNormIndexOrder {
                    in_order(v.iter().copied())
                } else {
                    kernels::lane_sum(v)
                }
            };
            for (r, row) in x.chunks_exact(width).enumerate() {
                let mean = if mutation == M::LayerNormMeanByReciprocal { sum(row) * (1.0 / c) } else { sum(row) / c };
                let d2: Vec<f32> = row.iter().map(|&v| (v - mean) * (v - mean)).collect();
                let divisor = if mutation == M::LayerNormBessel { c - 1.0 } else { c };
                let eps = if mutation == M::LayerNormEps6 { 1e-6 } else { kernels::LN_EPS };
                let s = 1.0 / (sum(&d2) / divisor + eps).sqrt();
                for j in 0..width {
                    let h = (row[j] - mean) * s;
                    xhat[r * width + j] = h;
                    y[r * width + j] = h * gain[j] + bias[j];
                }
                rstd[r] = s;
            }
            put(mem, o.y, &y);
            put(mem, o.xhat, &xhat);
            put(mem, o.rstd, &rstd);
        }
        (M::LayerNormParamGradsIndexOrder, Op::LayerNormBackward(o)) => {
            let (rows, width) = (o.rows as usize, o.width as usize);
            let (dy, xhat) = (floats(mem, o.dy, rows * width), floats(mem, o.xhat, rows * width));
            let dgain: Vec<f32> =
                (0..width).map(|j| in_order((0..rows).map(|r| dy[r * width + j] * xhat[r * width + j]))).collect();
            let dbias: Vec<f32> = (0..width).map(|j| in_order((0..rows).map(|r| dy[r * width + j]))).collect();
            put(mem, o.dgain, &dgain);
            put(mem, o.dbias, &dbias);
        }
        (M::BiasGradIndexOrder | M::BiasGradLanesReversed, Op::BiasGrad(o)) => {
            let (rows, width) = (o.rows as usize, o.width as usize);
            let dy = floats(mem, o.dy, rows * width);
            let db: Vec<f32> = (0..width)
                .map(|j| {
                    let column: Vec<f32> = (0..rows).map(|r| dy[r * width + j]).collect();
                    if mutation == M::BiasGradIndexOrder {
                        in_order(column)
                    } else {
                        lanes_reversed(&column)
                    }
                })
                .collect();
            put(mem, o.db, &db);
        }
        (M::GeluLibmTanh | M::GeluSigmoid, Op::Gelu(o)) => {
            let x = floats(mem, o.x, o.len as usize);
            let (c, a) = (mathf::GELU_C, mathf::GELU_A);
            let y: Vec<f32> = x
                .iter()
                .map(|&v| match mutation {
                    M::GeluLibmTanh => 0.5 * v * (1.0 + (c * (v + a * (v * v * v))).tanh()),
                    _ => v / (1.0 + mathf::exp(-1.702 * v)),
                })
                .collect();
            put(mem, o.y, &y);
        }
        (M::GeluBackwardHalfTerm, Op::GeluBackward(o)) => {
            let (dy, x) = (floats(mem, o.dy, o.len as usize), floats(mem, o.x, o.len as usize));
            let (c, a) = (mathf::GELU_C, mathf::GELU_A);
            let dx: Vec<f32> =
                dy.iter().zip(&x).map(|(&d, &v)| d * (0.5 * (1.0 + mathf::tanh(c * (v + a * (v * v * v)))))).collect();
            put(mem, o.dx, &dx);
        }
        (M::SoftmaxBackwardIndexOrderDot | M::SoftmaxBackwardScaleFirst, Op::CausalSoftmaxBackward(o)) => {
            let (t, n) = (o.t as usize, (o.blocks * o.t * o.t) as usize);
            let (p, dp) = (floats(mem, o.probs, n), floats(mem, o.dprobs, n));
            let mut ds = vec![0.0f32; n];
            for r in 0..n / t {
                let i = r % t;
                let (pr, dpr) = (&p[r * t..][..t], &dp[r * t..][..t]);
                let dot = if mutation == M::SoftmaxBackwardIndexOrderDot {
                    in_order((0..=i).map(|j| pr[j] * dpr[j]))
                } else {
                    kernels::lane_sum_by(i + 1, |j| pr[j] * dpr[j])
                };
                for j in 0..=i {
                    ds[r * t + j] = if mutation == M::SoftmaxBackwardScaleFirst {
                        pr[j] * ((dpr[j] - dot) * o.scale)
                    } else {
                        pr[j] * (dpr[j] - dot) * o.scale
                    };
                }
            }
            put(mem, o.dscores, &ds);
        }
        (M::CrossEntropyDividesTwice, Op::CrossEntropy(o)) => {
            let (rows, vocab) = (o.rows as usize, o.vocab as usize);
            let (logits, targets) = (floats(mem, o.logits, rows * vocab), words(mem, o.targets, rows));
            let mut dlogits = vec![0.0f32; rows * vocab];
            for (r, row) in logits.chunks_exact(vocab).enumerate() {
                let max = kernels::lane_max_by(vocab, |j| row[j]);
                let e: Vec<f32> = row.iter().map(|&v| mathf::exp(v - max)).collect();
                let sum = kernels::lane_sum(&e);
                for j in 0..vocab {
                    dlogits[r * vocab + j] = e[j] / sum / rows as f32;
                }
                dlogits[r * vocab + targets[r] as usize] -= 1.0 / rows as f32;
            }
            put(mem, o.dlogits, &dlogits);
        }
        (M::CrossEntropyMeanDivides, Op::CrossEntropy(o)) => {
            let (rows, vocab) = (o.rows as usize, o.vocab as usize);
            let (logits, targets) = (floats(mem, o.logits, rows * vocab), words(mem, o.targets, rows));
            let (mut dlogits, mut losses) = (vec![0.0f32; rows * vocab], vec![0.0f32; rows]);
            kernels::cross_entropy_rows(vocab, &logits, &targets, 1.0 / rows as f32, &mut dlogits, &mut losses);
            put(mem, o.loss, &[kernels::lane_sum(&losses) / rows as f32]);
        }
        (M::HashUnchunked, Op::Hash(o)) => {
            let data = words(mem, o.data, o.len as usize);
            put(mem, o.out, &[f32::from_bits(hash::fnv1a32_u32(&data))]);
        }
        (M::EmbedBackwardIndexOrder, Op::EmbedBackward(o)) => {
            let (rows, width) = (o.rows as usize, o.width as usize);
            let (tokens, dy) = (words(mem, o.tokens, rows), floats(mem, o.dy, rows * width));
            let mut dtok = vec![0.0f32; o.vocab as usize * width];
            let mut dpos = vec![0.0f32; o.positions as usize * width];
            for (r, row) in dy.chunks_exact(width).enumerate() {
                for j in 0..width {
                    dtok[tokens[r] as usize * width + j] += row[j];
                    dpos[(r % o.seq as usize) * width + j] += row[j];
                }
            }
            put(mem, o.dtok, &dtok);
            put(mem, o.dpos, &dpos);
        }
        _ => {}
    }
    Ok(())
}

/// The mutated ops that update in place (softmax, Adam), done wholly the mutant's way instead
/// of after the reference: `None` for every other op.
fn run_in_place(mutation: OpMutation, op: &Op, mem: &mut Memory) -> Option<Result<(), ops::OpError>> {
    use OpMutation as M;
    match (mutation, *op) {
        (M::SoftmaxLibmExp | M::SoftmaxNoMax | M::SoftmaxIndexOrderSum, Op::CausalSoftmax(o)) => {
            let (t, n) = (o.t as usize, (o.blocks * o.t * o.t) as usize);
            let mut scores = floats(mem, o.scores, n);
            for (r, row) in scores.chunks_exact_mut(t).enumerate() {
                let i = r % t;
                for v in row.iter_mut().take(i + 1) {
                    *v *= o.scale;
                }
                let max = if mutation == M::SoftmaxNoMax { 0.0 } else { kernels::lane_max_by(i + 1, |j| row[j]) };
                for v in row[..=i].iter_mut() {
                    *v = if mutation == M::SoftmaxLibmExp { (*v - max).exp() } else { mathf::exp(*v - max) };
                }
                let sum = if mutation == M::SoftmaxIndexOrderSum {
                    in_order(row[..=i].iter().copied())
                } else {
                    kernels::lane_sum(&row[..=i])
                };
                for v in row[..=i].iter_mut() {
                    *v /= sum;
                }
                row[i + 1..].fill(0.0);
            }
            put(mem, o.scores, &scores);
            Some(Ok(()))
        }
        (M::AdamEpsInsideSqrt | M::AdamNoCorrection2 | M::AdamFusedMoments, Op::Adam(o)) => {
            let len = o.len as usize;
            let (mut w, g) = (floats(mem, o.weights, len), floats(mem, o.grad, len));
            let (mut m, mut v) = (floats(mem, o.m, len), floats(mem, o.v, len));
            let (b1, b2) = (kernels::ADAM_BETA1, kernels::ADAM_BETA2);
            for i in 0..len {
                if mutation == M::AdamFusedMoments {
                    m[i] = b1.mul_add(m[i], (1.0 - b1) * g[i]);
                    v[i] = b2.mul_add(v[i], (1.0 - b2) * (g[i] * g[i]));
                } else {
                    m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                    v[i] = b2 * v[i] + (1.0 - b2) * (g[i] * g[i]);
                }
                let m_hat = m[i] / o.correction1;
                let v_hat = if mutation == M::AdamNoCorrection2 { v[i] } else { v[i] / o.correction2 };
                let denominator = if mutation == M::AdamEpsInsideSqrt {
                    (v_hat + kernels::ADAM_EPS).sqrt()
                } else {
                    v_hat.sqrt() + kernels::ADAM_EPS
                };
                w[i] -= o.lr * m_hat / denominator;
            }
            put(mem, o.weights, &w);
            put(mem, o.m, &m);
            put(mem, o.v, &v);
            Some(Ok(()))
        }
        _ => None,
    }
}

/// What `LOCKSTEP_MUTANT` names: a mutant of [`MUTANTS`], or `none` (no mutation: the
/// harness's control). Anything else, or nothing, is refused.
pub fn from_env() -> Result<Option<Mutation>, WorkerError> {
    let name = std::env::var("LOCKSTEP_MUTANT").unwrap_or_default();
    match name.as_str() {
        "none" => Ok(None),
        other => find(other)
            .map(|m| Some(m.mutation))
            .ok_or_else(|| invalid(format!("LOCKSTEP_MUTANT={other:?} names no mutant (or `none`)"))),
    }
}

fn invalid(message: String) -> WorkerError {
    WorkerError::new(status::INVALID_ARGUMENT, message)
}

/// An ABI 2 plugin's state: buffers in host memory and the reference's units and ops with at
/// most one mutation. [`crate::mutant_plugin!`] exports it.
pub struct MutantState {
    pub mutation: Option<Mutation>,
    buffers: Memory,
    next: u64,
}

impl MutantState {
    pub fn new(mutation: Option<Mutation>) -> Self {
        Self { mutation, buffers: Memory::new(), next: 0 }
    }

    pub fn gemm_f32(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), WorkerError> {
        match self.mutation {
            Some(Mutation::Units(flaw)) => crate::flaws::flawed_gemm(flaw, m, n, k, a, b, c)
                .map_err(|e| WorkerError::new(status::NON_FINITE_INPUT, e)),
            _ => {
                let out = lockstep_luts::gemm_nt(m, n, k, a, b)
                    .map_err(|e| WorkerError::new(status::NON_FINITE_INPUT, e.to_string()))?;
                c.copy_from_slice(&out);
                Ok(())
            }
        }
    }

    pub fn gemm_i8(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[i8],
        b: &[i8],
        c: &mut [i32],
    ) -> Result<(), WorkerError> {
        match self.mutation {
            Some(Mutation::Units(flaw)) => {
                crate::flaws::flawed_gemm_i8(flaw, m, n, k, a, b, c);
                Ok(())
            }
            _ => {
                c.copy_from_slice(&lockstep_luts::gemm_i8_nt(m, n, k, a, b));
                Ok(())
            }
        }
    }

    pub fn buffer_create(&mut self, words: usize) -> Result<u64, WorkerError> {
        self.next += 1;
        self.buffers.insert(self.next, vec![0; words]);
        Ok(self.next)
    }

    pub fn buffer_free(&mut self, handle: u64) {
        self.buffers.remove(&handle);
    }

    pub fn buffer_write(&mut self, handle: u64, offset: usize, data: &[u32]) -> Result<(), WorkerError> {
        let b = self.buffers.get_mut(&handle).and_then(|b| b.get_mut(offset..offset + data.len()));
        b.ok_or_else(|| invalid(format!("buffer {handle}: out of bounds")))?.copy_from_slice(data);
        Ok(())
    }

    pub fn buffer_read(&mut self, handle: u64, offset: usize, out: &mut [u32]) -> Result<(), WorkerError> {
        let b = self.buffers.get(&handle).and_then(|b| b.get(offset..offset + out.len()));
        out.copy_from_slice(b.ok_or_else(|| invalid(format!("buffer {handle}: out of bounds")))?);
        Ok(())
    }

    pub fn run_ops(&mut self, ops: &[Op]) -> Result<(), WorkerError> {
        for op in ops {
            op.check(|h| self.buffers.get(&h).map(|b| b.len() as u64)).map_err(|e| invalid(e.to_string()))?;
            match (self.mutation, op) {
                (Some(Mutation::Units(flaw)), Op::Matmul(mm)) => run_matmul(flaw, mm, &mut self.buffers)
                    .map_err(|e| WorkerError::new(status::NON_FINITE_INPUT, e))?,
                (Some(Mutation::Op(mutation)), _) => {
                    run_op(mutation, op, &mut self.buffers).map_err(|e| invalid(e.to_string()))?
                }
                _ => run_reference(op, &mut self.buffers).map_err(|e| invalid(e.to_string()))?,
            }
        }
        Ok(())
    }
}

/// Defines and exports an ABI 2 plugin named `$name` computing the reference with the mutation
/// `$mutation` gives when an instance is created (a `Result<Option<Mutation>, WorkerError>`).
#[macro_export]
macro_rules! mutant_plugin {
    ($name:literal, $description:literal, $mutation:expr) => {
        use lockstep_luts::ops::Op;
        use lockstep_worker_api::plugin::{Worker, WorkerError};
        use lockstep_worker_api::{caps, CreateOptions};
        use $crate::mutants::MutantState;

        struct Plugin(MutantState);

        impl Worker for Plugin {
            const NAME: &'static std::ffi::CStr = $name;
            const DESCRIPTION: &'static std::ffi::CStr = $description;
            const CAPABILITIES: u64 = caps::REQUIRED;
            const OPS: u64 = lockstep_worker_api::ops::ALL;

            fn create(_: &CreateOptions) -> Result<Self, WorkerError> {
                Ok(Plugin(MutantState::new($mutation?)))
            }

            fn describe(&self) -> String {
                format!("mutation {:?} (test fixture)", self.0.mutation)
            }

            fn gemm_f32(
                &mut self,
                m: usize,
                n: usize,
                k: usize,
                a: &[f32],
                b: &[f32],
                c: &mut [f32],
            ) -> Result<(), WorkerError> {
                self.0.gemm_f32(m, n, k, a, b, c)
            }

            fn gemm_i8(
                &mut self,
                m: usize,
                n: usize,
                k: usize,
                a: &[i8],
                b: &[i8],
                c: &mut [i32],
            ) -> Result<(), WorkerError> {
                self.0.gemm_i8(m, n, k, a, b, c)
            }

            fn buffer_create(&mut self, words: usize) -> Result<u64, WorkerError> {
                self.0.buffer_create(words)
            }

            fn buffer_free(&mut self, handle: u64) {
                self.0.buffer_free(handle)
            }

            fn buffer_write(&mut self, handle: u64, offset: usize, data: &[u32]) -> Result<(), WorkerError> {
                self.0.buffer_write(handle, offset, data)
            }

            fn buffer_read(&mut self, handle: u64, offset: usize, out: &mut [u32]) -> Result<(), WorkerError> {
                self.0.buffer_read(handle, offset, out)
            }

            fn run_ops(&mut self, ops: &[Op]) -> Result<(), WorkerError> {
                self.0.run_ops(ops)
            }
        }

        lockstep_worker_api::export_worker!(Plugin);
    };
}
