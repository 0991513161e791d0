//! The training step's op set, defined once (ABI 2).
//!
//! A training step is a sequence of [`Op`]s on buffers of 32-bit words that a backend owns and
//! names by [`Handle`]: the units product on strided, batched views (every form the model needs —
//! `A·Bᵀ`, `A·B`, `Aᵀ·B`, the attention heads — is a choice of strides), and the model's
//! element-wise ops. [`run_reference`] executes an op on host memory, obviously and slowly; every
//! backend must give the same bits (the gate checks it op by op, `docs/VERIFICATION.md` §9).
//!
//! Where each part lives:
//! - `table.rs` — **the op table**: every op's code, name, fields (scalars, buffers with how
//!   they are accessed and how many words, flags), the shapes it refuses and the samples every
//!   backend is checked on. Its struct, its place in [`Op`], its ABI record ([`Op::record`],
//!   [`Op::from_record`]), its accesses and its bound form ([`io`]) are generated from the entry
//!   by `define.rs`; so are the C header's constants and the WGSL's parameter slots
//!   (`generate.rs`, checked against the committed files by tests).
//! - `reference.rs` — each op's reference kernel, on its bound words.
//! - `kernels.rs` — the slice kernels: the arithmetic on plain slices, which the reference and
//!   every CPU implementation call on whatever rows they own.
//!
//! Adding an op is: its entry in the table, its reference kernel, one kernel per backend. The
//! conformance suite and the gate then run its samples on every backend by themselves.
//!
//! Every float sum is a **lane sum** ([`lane_sum`]: 32 lanes, value `i` in lane `i mod 32`, each
//! lane in index order from +0, then the lanes in order): LayerNorm's and softmax's sums along a
//! row, the bias and gain gradients down a column, the embedding scatter-add, the loss. Its
//! shape is part of the definition, so a GPU spreads a sum over 32 invocations and a CPU over
//! its SIMD lanes, with the same bits. The hash runs over bytes in order within 4096-word
//! chunks. Every float operation is one IEEE-754 binary32 `+ − × ÷ √`, never contracted, in the
//! order written.

#[macro_use]
pub mod define;
pub mod generate;
mod kernels;
mod reference;
mod table;

pub use define::{DecodeError, FieldKind, FieldSpec, OpSpec, Record, View, ViewMut, FLAGS, FLAG_ACCUMULATE, FLAG_BIAS};
pub use kernels::*;
pub use table::*;

use crate::units::UnitError;

/// A backend's name for one of its buffers.
pub type Handle = u64;

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
    pub fn end(&self, batch: [u32; 2], rows: u32, cols: u32) -> u64 {
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

/// How an op touches a range of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write,
    /// Read, then written (in place).
    Update,
}

/// What values a range may hold for the op to be defined on it (what a test fills it with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    /// Any finite f32 (or any word, for the hash).
    Finite,
    /// Finite and not negative (Adam's second moments).
    NonNegative,
    /// Integers below the bound (token ids and targets).
    Below(u32),
}

/// One range an op touches: words `start .. end` of `buffer` (`end` 0 when it touches none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub buffer: Handle,
    pub start: u64,
    pub end: u64,
    pub kind: Kind,
    pub values: Values,
}

impl Access {
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    pub fn writes(&self) -> bool {
        self.kind != Kind::Read
    }

    pub(crate) fn range(&self) -> std::ops::Range<usize> {
        if self.is_empty() {
            0..0
        } else {
            self.start as usize..self.end as usize
        }
    }
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
            w.writes()
                && all.iter().enumerate().any(|(j, o)| {
                    i != j
                        && o.buffer == w.buffer
                        && o.start < w.end
                        && w.start < o.end
                        && !w.is_empty()
                        && !o.is_empty()
                })
        })
    }

    /// Checks every access against the buffers' lengths in words (`len_of` answers `None` for
    /// a buffer that does not exist) and the shapes the op needs. A backend runs an op only
    /// after this passed; it does not check token ids, which [`check_tokens`] does once their
    /// values are known.
    pub fn check(&self, len_of: impl Fn(Handle) -> Option<u64>) -> Result<(), OpError> {
        let op = self.name();
        if let Some(what) = self.refusal() {
            return Err(OpError::Shape { op, what: what.into() });
        }
        for Access { buffer, end, .. } in self.accesses() {
            let len = len_of(buffer).ok_or(OpError::UnknownBuffer { op, buffer })?;
            if end > len {
                return Err(OpError::OutOfBounds { op, buffer, end, len });
            }
        }
        Ok(())
    }

    /// The same op on other buffers: every handle `h` it names becomes `map(h)` (through its
    /// record, so no op needs code of its own for it).
    pub fn with_buffers(&self, map: impl Fn(Handle) -> Handle) -> Op {
        let mut record = self.record();
        let named = self.spec().buffer_count();
        for handle in record.buffers.iter_mut().take(named) {
            // An absent optional buffer stays absent (handle 0).
            if *handle != 0 {
                *handle = map(*handle);
            }
        }
        Op::from_record(&record).expect("a record this op wrote decodes")
    }
}

/// Checks that every token id (or target) is below `vocab`.
pub fn check_tokens(op: &'static str, tokens: &[u32], vocab: u32) -> Result<(), OpError> {
    match tokens.iter().find(|&&t| t >= vocab) {
        Some(t) => Err(OpError::Shape { op, what: format!("token id {t} outside a vocabulary of {vocab}") }),
        None => Ok(()),
    }
}

/// Host memory for the reference: buffers of words by handle.
pub type Memory = std::collections::BTreeMap<Handle, Vec<u32>>;

/// Runs one op on host memory: the definition every backend is compared with. Inputs are read
/// whole before outputs are written (so in-place ops mean what they say); an op whose writes
/// overlap nothing runs on the buffers' own words, without copies.
pub fn run_reference(op: &Op, mem: &mut Memory) -> Result<(), OpError> {
    op.check(|b| mem.get(&b).map(|w| w.len() as u64))?;
    define::with_pieces(&op.accesses(), mem, op.writes_overlap(), |pieces| op.reference_on(pieces))
}

/// Words for every buffer that `ops` touch, each as long as the furthest access, filled by
/// `values` and then made to obey every access's [`Values`] rule (ids below their bound,
/// moments not negative): what the conformance suite and the gate run the samples on.
pub fn sample_memory(ops: &[Op], mut values: impl FnMut(usize) -> Vec<u32>) -> Memory {
    let mut memory = Memory::new();
    for op in ops {
        for (buffer, end) in op.extents() {
            let words = memory.entry(buffer).or_default();
            if (words.len() as u64) < end {
                words.resize(end as usize, 0);
            }
        }
    }
    for words in memory.values_mut() {
        *words = values(words.len());
    }
    for op in ops {
        for a in op.accesses() {
            let words = &mut memory.get_mut(&a.buffer).expect("sized above")[a.range()];
            match a.values {
                Values::Finite => {}
                Values::NonNegative => words.iter_mut().for_each(|w| *w &= 0x7fff_ffff),
                Values::Below(bound) => words.iter_mut().for_each(|w| *w %= bound.max(1)),
            }
        }
    }
    memory
}

/// Finite values where binary32 arithmetic is hardest to get right: signed zeros, the smallest
/// and largest subnormals and normals, values one ulp apart, huge and tiny magnitudes, and
/// plain values between them, mixed with seeded ones (what the samples run on).
pub fn hard_values(rng: &mut crate::rng::SplitMix64, len: usize) -> Vec<u32> {
    const FIXED: [u32; 18] = [
        0x0000_0000,
        0x8000_0000,
        0x0000_0001,
        0x8000_0001,
        0x007f_ffff,
        0x807f_ffff,
        0x0080_0000,
        0x8080_0000,
        0x0080_0001,
        0x3f80_0000,
        0x3f80_0001,
        0xbf7f_ffff,
        0x7f7f_ffff,
        0xff7f_ffff,
        0x1e3c_e508, // 1e-20
        0x6258_d727, // 1e21
        0x4120_0000, // 10
        0xc2c8_0000, // -100
    ];
    (0..len)
        .map(|i| match i % 5 {
            0 => FIXED[(i / 5) % FIXED.len()],
            1 => rng.next_u32() & 0x807f_ffff, // a subnormal or zero
            2 => (rng.next_signed_unit() * 2f32.powi(rng.below(60) as i32 - 30)).to_bits(),
            _ => (rng.next_signed_unit() * 4.0).to_bits(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::gemm_nt;
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
        let op = Op::Gelu(Gelu { len: 8, x: Span::new(1, 4), y: Span::new(1, 0) });
        assert_eq!(run_reference(&op, &mut mem), Err(OpError::OutOfBounds { op: "gelu", buffer: 1, end: 12, len: 10 }));
        let op = Op::Gelu(Gelu { len: 2, x: Span::new(1, 0), y: Span::new(9, 0) });
        assert_eq!(run_reference(&op, &mut mem), Err(OpError::UnknownBuffer { op: "gelu", buffer: 9 }));
        mem.insert(2, vec![7, 1]);
        let op = Op::CrossEntropy(CrossEntropy {
            rows: 2,
            vocab: 5,
            logits: Span::new(1, 0),
            targets: Span::new(2, 0),
            dlogits: Span::new(1, 0),
            loss: Span::new(1, 0),
        });
        assert!(matches!(run_reference(&op, &mut mem), Err(OpError::Shape { op: "cross_entropy", .. })));
        let op = Op::LayerNorm(LayerNorm {
            rows: 1,
            width: 0,
            x: Span::new(1, 0),
            gain: Span::new(1, 0),
            bias: Span::new(1, 0),
            y: Span::new(1, 0),
            xhat: Span::new(1, 0),
            rstd: Span::new(1, 0),
        });
        assert_eq!(run_reference(&op, &mut mem), Err(OpError::Shape { op: "layer_norm", what: "width 0".into() }));
    }

    /// Two outputs in one buffer at disjoint offsets (the gain and bias gradients) do not
    /// overlap; an element-wise op in place, or outputs that share words, do.
    #[test]
    fn overlapping_writes_are_told_from_disjoint_ones() {
        let ln = |dbias_offset| {
            Op::LayerNormBackward(LayerNormBackward {
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
            })
        };
        assert!(!ln(108).writes_overlap());
        assert!(ln(104).writes_overlap());
        let gelu = |x, y| Op::Gelu(Gelu { len: 8, x: Span::new(1, x), y: Span::new(1, y) });
        assert!(gelu(0, 4).writes_overlap());
        assert!(!gelu(0, 8).writes_overlap());
        let softmax = CausalSoftmax { blocks: 2, t: 4, scale: 0.5, scores: Span::new(1, 0) };
        assert!(!Op::from(softmax).writes_overlap());
    }

    /// Every sample survives the trip through its record, and the golden record of a matmul
    /// pins the layout the record rule gives (the C ABI's `OpCall`).
    #[test]
    fn records_round_trip_and_the_matmul_record_is_pinned() {
        let mm = Matmul {
            m: 2,
            n: 3,
            k: 4,
            batch: [5, 6],
            a: MatView { buffer: 7, offset: 8, row_stride: 9, col_stride: 10, batch_stride: [11, 12] },
            b: MatView { buffer: 13, offset: 14, row_stride: 15, col_stride: 16, batch_stride: [17, 18] },
            c: MatView { buffer: 19, offset: 20, row_stride: 21, col_stride: 22, batch_stride: [23, 24] },
            bias: Some(Span::new(25, 26)),
            accumulate: true,
        };
        let record = Op::from(mm).record();
        assert_eq!((record.code, record.flags), (0, 3));
        assert_eq!(record.buffers, [7, 13, 19, 25, 0, 0, 0, 0]);
        let golden = [2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 14, 15, 16, 17, 18, 20, 21, 22, 23, 24, 26, 0, 0, 0];
        assert_eq!(record.params, golden);
        let adam = Op::from(Adam {
            len: 3,
            lr: 0.5,
            correction1: 0.25,
            correction2: 2.0,
            weights: Span::new(1, 10),
            grad: Span::new(2, 20),
            m: Span::new(3, 30),
            v: Span::new(4, 40),
        })
        .record();
        assert_eq!(adam.params[..8], [3, 0x3f00_0000, 0x3e80_0000, 0x4000_0000, 10, 20, 30, 40]);
        let plain = Op::from(Matmul { bias: None, accumulate: false, ..mm });
        for op in samples().into_iter().chain([Op::from(mm), plain]) {
            assert_eq!(Op::from_record(&op.record()), Ok(op), "{op:?}");
        }
        assert_eq!(plain.record().buffers[3], 0);
        let gelu = Op::from(Gelu { len: 4, x: Span::new(1, 0), y: Span::new(2, 0) }).record();
        let past = OPS.len() as u32;
        assert_eq!(Op::from_record(&Record { code: past, ..gelu }), Err(DecodeError::UnknownCode(past)));
        assert_eq!(
            Op::from_record(&Record { flags: 1, ..gelu }),
            Err(DecodeError::UnknownFlags { code: Gelu::CODE, flags: 1 })
        );
        // The ABI's codes never change: the first thirteen keep their names, whatever is
        // appended after them.
        let names: Vec<&str> = OPS.iter().map(|o| o.name).collect();
        assert_eq!(
            names[..13],
            [
                "matmul",
                "embed",
                "embed_backward",
                "layer_norm",
                "layer_norm_backward",
                "gelu",
                "gelu_backward",
                "causal_softmax",
                "causal_softmax_backward",
                "bias_grad",
                "cross_entropy",
                "adam",
                "hash"
            ]
        );
        assert_eq!((Matmul::SPEC.flags, LayerNormBackward::SPEC.flags, Gelu::SPEC.flags), (3, 1, 0));
        assert_eq!(Matmul::SPEC.buffer_slots(), [("a", 5), ("b", 10), ("c", 15), ("bias", 20)]);
    }

    /// The reference on the buffers' own words and on copies gives the same bits for every
    /// sample (the copies are what an op whose writes overlap takes), and every sample runs.
    #[test]
    fn bound_words_and_copies_give_the_same_bits() {
        let mut rng = crate::rng::SplitMix64::new(0x5a3);
        for op in samples() {
            let mut direct =
                sample_memory(&[op], |len| (0..len).map(|_| (rng.next_signed_unit() * 3.0).to_bits()).collect());
            let mut copied = direct.clone();
            let before = direct.clone();
            assert!(!op.writes_overlap(), "{op:?}");
            op.check(|b| direct.get(&b).map(|w| w.len() as u64)).unwrap();
            define::with_pieces(&op.accesses(), &mut copied, true, |pieces| op.reference_on(pieces)).unwrap();
            run_reference(&op, &mut direct).unwrap();
            assert_eq!(direct, copied, "{}", op.name());
            assert_ne!(direct, before, "{}: wrote nothing", op.name());
        }
    }

    /// `sample_memory` gives every buffer the words its accesses reach and obeys each rule.
    #[test]
    fn sample_memory_obeys_the_value_rules() {
        let ops = samples();
        let memory = sample_memory(&ops, |len| vec![0xbf80_0123; len]);
        for op in &ops {
            for a in op.accesses() {
                let words = &memory[&a.buffer][a.range()];
                match a.values {
                    Values::Below(bound) => assert!(words.iter().all(|&w| w < bound), "{}", op.name()),
                    Values::NonNegative => assert!(words.iter().all(|&w| w >> 31 == 0), "{}", op.name()),
                    Values::Finite => {}
                }
            }
        }
        let remapped = ops[0].with_buffers(|h| h + 100);
        assert_eq!(remapped.accesses()[0].buffer, 101);
        let Op::Matmul(plain) = ops[1] else { panic!("the second sample is a product") };
        assert_eq!(Op::from(plain).with_buffers(|h| h * 10).accesses().len(), 3, "no bias appears");
    }

    #[test]
    fn the_generated_text_names_every_slot() {
        let c = generate::c_header();
        assert!(c.contains("#define LOCKSTEP_OP_CAUSAL_SOFTMAX_BACKWARD 8\n"));
        assert!(c.contains("#define LOCKSTEP_P_MATMUL_A_ROW_STRIDE 6\n"));
        assert!(c.contains("#define LOCKSTEP_P_ADAM_LR 1\n"));
        assert!(c.contains("#define LOCKSTEP_B_ADAM_WEIGHTS 0\n"));
        assert!(c.contains("#define LOCKSTEP_OP_FLAG_ACCUMULATE 1u /* matmul, layer_norm_backward */\n"));
        let wgsl = generate::wgsl_prelude();
        assert!(wgsl.contains("const MATMUL_BATCH1: u32 = 4u;\n"));
        assert!(wgsl.contains("const LAYER_NORM_RSTD: u32 = 7u;\n"));
        assert!(wgsl.contains("const LN_EPS: u32 = 0x3727c5acu;\n"));
        assert!(wgsl.contains("const ADAM_BETA1: u32 = 0x3f666666u;\n"));
    }
}
