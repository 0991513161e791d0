//! The exact gate: a fixed, seeded battery every plugin must pass bit for bit before use.
//!
//! Each case runs through the plugin and through `lockstep_luts` (the reference), and every
//! output bit must match. A rejection names the case, the first wrong index (row and column),
//! and the expected and actual bits. The battery is listed in `docs/VERIFICATION.md`.

use lockstep_luts::probe::{probe_hash, probe_operands, PROBE_K, PROBE_M, PROBE_N};
use lockstep_luts::rng::SplitMix64;
use lockstep_luts::{gemm_i8_nt, gemm_nt};
use lockstep_node::verdict::Verdict;
use lockstep_worker_api::status;

use crate::backend::{Backend, BackendError};

/// The battery's seed: changing it changes the battery, so it is part of the spec.
pub const GATE_SEED: u64 = 0x6761_7465_0000_0001;

/// What a case feeds the plugin.
#[derive(Clone, Debug)]
pub enum Input {
    /// The full unit, f32 in and out; compared with `gemm_nt` bit for bit.
    F32 { m: usize, n: usize, k: usize, a: Vec<f32>, b: Vec<f32> },
    /// The raw integer unit; compared with `gemm_i8_nt`.
    I8 { m: usize, n: usize, k: usize, a: Vec<i8>, b: Vec<i8> },
    /// A non-finite input the plugin must refuse with `NON_FINITE_INPUT`.
    Refuse { m: usize, n: usize, k: usize, a: Vec<f32>, b: Vec<f32> },
    /// The same call `times` times: every result must be the reference's (no state may leak
    /// from one call into the next).
    Repeat { m: usize, n: usize, k: usize, a: Vec<f32>, b: Vec<f32>, times: usize },
    /// Two calls through the same operand buffers, rewritten in place between them with
    /// `a2`/`b2` (same addresses, new contents): a plugin that caches by address fails.
    Reuse { m: usize, n: usize, k: usize, a: Vec<f32>, b: Vec<f32>, a2: Vec<f32>, b2: Vec<f32> },
}

/// One named case of the battery.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub input: Input,
}

impl Case {
    /// Multiply-adds the case asks for.
    pub fn macs(&self) -> u64 {
        let (m, n, k) = match &self.input {
            Input::F32 { m, n, k, .. }
            | Input::I8 { m, n, k, .. }
            | Input::Refuse { m, n, k, .. }
            | Input::Reuse { m, n, k, .. } => (*m, *n, *k),
            Input::Repeat { m, n, k, times, .. } => (*m, *n, *k * *times),
        };
        (m * n * k) as u64
    }
}

/// Why a case failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Output bits differ: the first wrong element and how many differ in all.
    Mismatch { index: usize, row: usize, col: usize, expected_bits: u32, actual_bits: u32, wrong: usize, total: usize },
    /// The plugin returned an error where an output was expected.
    CallFailed(BackendError),
    /// The plugin accepted (or refused differently) an input it must refuse.
    NotRefused { got: String },
    /// A case could not be set up (buffers the plugin would not create, an op the reference
    /// itself refuses): the plugin is not admitted on an unchecked case.
    Setup(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Mismatch { index, row, col, expected_bits, actual_bits, wrong, total } => write!(
                f,
                "output[{index}] (row {row}, col {col}): expected bits {expected_bits:#010x} ({}), got {actual_bits:#010x} ({}); {wrong} of {total} outputs differ",
                f32::from_bits(*expected_bits),
                f32::from_bits(*actual_bits),
            ),
            Failure::CallFailed(error) => write!(f, "{error}"),
            Failure::NotRefused { got } => {
                write!(f, "a non-finite input must be refused with status `non-finite input`, got {got}")
            }
            Failure::Setup(why) => write!(f, "the case could not be set up: {why}"),
        }
    }
}

/// The outcome of one case.
#[derive(Clone, Debug)]
pub struct CaseResult {
    pub name: String,
    pub macs: u64,
    pub failure: Option<Failure>,
}

/// Progress while the gate runs.
#[derive(Clone, Copy, Debug)]
pub struct GateProgress<'a> {
    pub done: usize,
    pub total: usize,
    pub case: &'a str,
}

/// The gate's verdict and its evidence.
#[derive(Clone, Debug)]
pub struct GateReport {
    pub backend: String,
    pub device: String,
    pub cases: Vec<CaseResult>,
    /// The probe hash through the plugin, when the probe case ran without error.
    pub probe_hash: Option<u32>,
    /// The probe hash of the reference units.
    pub reference_probe_hash: u32,
    /// Set when the gate stopped early (a poisoned instance).
    pub aborted: Option<String>,
    /// ABI 2: ops checked one by one against `lockstep_luts::ops::run_reference` (0 for a
    /// product-only backend).
    pub ops_checked: usize,
}

impl GateReport {
    /// Admitted only if every case ran and every bit matched.
    pub fn admitted(&self) -> bool {
        self.aborted.is_none() && self.cases.iter().all(|case| case.failure.is_none())
    }

    pub fn failures(&self) -> impl Iterator<Item = &CaseResult> {
        self.cases.iter().filter(|case| case.failure.is_some())
    }

    /// The verdict as a type: admitted with the number of cases, or the first failing case.
    pub fn verdict(&self) -> Verdict {
        if self.admitted() {
            Verdict::Admitted { cases: self.cases.len() as u32 }
        } else if let Some(case) = self.failures().next() {
            let detail = case.failure.as_ref().map_or_else(String::new, |f| f.to_string());
            Verdict::Rejected { case: case.name.clone(), detail }
        } else {
            Verdict::Rejected {
                case: "(aborted)".into(),
                detail: self.aborted.clone().unwrap_or_else(|| "gate aborted".into()),
            }
        }
    }

    /// One line: the verdict and, on rejection, the first failing case.
    pub fn verdict_line(&self) -> String {
        if self.admitted() {
            format!(
                "ADMITTED: backend `{}` matched the reference on all {} cases, every bit",
                self.backend,
                self.cases.len()
            )
        } else if let Some(case) = self.failures().next() {
            format!(
                "REJECTED: backend `{}` failed case `{}`: {}",
                self.backend,
                case.name,
                case.failure.as_ref().expect("failures() yields failed cases")
            )
        } else {
            format!("REJECTED: backend `{}`: {}", self.backend, self.aborted.as_deref().unwrap_or("gate aborted"))
        }
    }
}

/// A matrix of uniform values whose rows have magnitudes `2^e`, `e` drawn from `exponents`.
fn scaled_rows(rng: &mut SplitMix64, rows: usize, k: usize, exponents: std::ops::Range<i32>) -> Vec<f32> {
    let mut values = Vec::with_capacity(rows * k);
    for _ in 0..rows {
        let span = (exponents.end - exponents.start) as u64;
        let e = exponents.start + rng.below(span) as i32;
        let scale = f32::from_bits(((127 + e) as u32) << 23);
        values.extend((0..k).map(|_| rng.next_signed_unit() * scale));
    }
    values
}

fn f32_case(name: impl Into<String>, m: usize, n: usize, k: usize, a: Vec<f32>, b: Vec<f32>) -> Case {
    Case { name: name.into(), input: Input::F32 { m, n, k, a, b } }
}

/// The fixed battery, in the order it runs.
pub fn battery() -> Vec<Case> {
    let mut rng = SplitMix64::new(GATE_SEED);
    let mut cases = Vec::new();

    // 1. All 65536 int8 products, including -128, through the raw integer unit.
    let all: Vec<i8> = (i8::MIN..=i8::MAX).collect();
    cases.push(Case {
        name: "all-int8-products".into(),
        input: Input::I8 { m: 256, n: 256, k: 1, a: all.clone(), b: all },
    });
    let (m, n, k) = (5, 7, 5000);
    let a: Vec<i8> = (0..m * k).map(|_| rng.next_i8()).collect();
    let b: Vec<i8> = (0..n * k).map(|_| rng.next_i8()).collect();
    cases.push(Case { name: "int8-long-accumulation".into(), input: Input::I8 { m, n, k, a, b } });

    // 2. Shapes: edges by hand, then seeded random ones.
    let fixed_shapes = [
        (1, 1, 1),
        (1, 1, 31),
        (1, 1, 32),
        (1, 1, 33),
        (1, 9, 64),
        (7, 1, 65),
        (3, 5, 4096),
        (2, 3, 4097),
        (17, 19, 95),
        (33, 47, 129),
        (64, 64, 64),
        (65, 63, 257),
        (1, 64, 2048),
        (128, 96, 160),
        (7, 130, 40),
    ];
    for (m, n, k) in fixed_shapes {
        let a = scaled_rows(&mut rng, m, k, -30..30);
        let b = scaled_rows(&mut rng, n, k, -30..30);
        cases.push(f32_case(format!("shape-{m}x{n}x{k}"), m, n, k, a, b));
    }
    for i in 0..10 {
        let m = 1 + rng.below(80) as usize;
        let n = 1 + rng.below(80) as usize;
        let k = 1 + rng.below(700) as usize;
        let a = scaled_rows(&mut rng, m, k, -40..40);
        let b = scaled_rows(&mut rng, n, k, -40..40);
        cases.push(f32_case(format!("random-{i}-{m}x{n}x{k}"), m, n, k, a, b));
    }

    // 3. Adversarial values.
    let (m, n, k) = (5, 6, 4096);
    cases.push(f32_case("all-plus-127-times-minus-127", m, n, k, vec![127.0; m * k], vec![-127.0; n * k]));
    let signs = |rng: &mut SplitMix64, len: usize| -> Vec<f32> {
        (0..len).map(|_| if rng.below(2) == 0 { 127.0 } else { -127.0 }).collect()
    };
    let a = signs(&mut rng, m * k);
    let b = signs(&mut rng, n * k);
    cases.push(f32_case("all-plus-minus-127", m, n, k, a, b));

    // Signs alternate inside every block (products partly cancel in the i32 sums) and block
    // magnitudes swing over 2^±11, so the f32 epilogue rounds at every step and any other
    // summation order gives other bits.
    let (m, n, k) = (6, 7, 4096);
    let pow2 = |e: i32| f32::from_bits(((127 + e) as u32) << 23);
    let a: Vec<f32> = (0..m * k)
        .map(|i| {
            let (r, c) = (i / k, i % k);
            let sign = if c % 2 == 0 { 1.0 } else { -1.0 };
            sign * (127 - (c * 7 + r) % 11) as f32 * pow2(((c / 32 * 5 + r) % 23) as i32 - 11)
        })
        .collect();
    let b: Vec<f32> = (0..n * k)
        .map(|i| {
            let (j, c) = (i / k, i % k);
            let sign = if c / 2 % 2 == 0 { 1.0 } else { -1.0 };
            sign * (100 + (c * 3 + j) % 27) as f32 * pow2(((c / 32 * 3 + j) % 17) as i32 - 8)
        })
        .collect();
    cases.push(f32_case("alternating-signs", m, n, k, a, b));

    let (m, n, k) = (9, 11, 320);
    let zero_blocks = |rows: usize, rng: &mut SplitMix64| -> Vec<f32> {
        let mut values = scaled_rows(rng, rows, k, -8..8);
        for row in 0..rows {
            let whole_row = rng.below(5) == 0;
            for block in 0..k / 32 {
                if whole_row || rng.below(3) == 0 {
                    values[row * k + block * 32..row * k + block * 32 + 32].fill(0.0);
                }
            }
        }
        values
    };
    let a = zero_blocks(m, &mut rng);
    let b = zero_blocks(n, &mut rng);
    cases.push(f32_case("zero-blocks", m, n, k, a, b));

    let (m, n, k) = (6, 5, 96);
    let mut a = scaled_rows(&mut rng, m, k, -100..-99);
    for block_start in (0..m * k).step_by(32) {
        a[block_start + (block_start / 32 * 7) % 32] = 3.0e38;
    }
    let b = scaled_rows(&mut rng, n, k, -10..10);
    cases.push(f32_case("one-huge-among-tiny", m, n, k, a, b));

    let (m, n, k) = (5, 6, 128);
    let subnormal = |rng: &mut SplitMix64| f32::from_bits((rng.next_u32() & 0x807f_ffff) | 1);
    let mut a: Vec<f32> = (0..m * k).map(|_| subnormal(&mut rng)).collect();
    // Half the blocks mix subnormals with the smallest normals: exponents near -132.
    for block_start in (0..m * k).step_by(64) {
        a[block_start] = f32::MIN_POSITIVE * (1.0 + rng.below(100) as f32);
    }
    let b = scaled_rows(&mut rng, n, k, -2..2);
    cases.push(f32_case("subnormals", m, n, k, a, b));

    let (m, n, k) = (4, 4, 64);
    let mut a: Vec<f32> = (0..m * k).map(|_| rng.next_signed_unit() * 3.0e38).collect();
    let b: Vec<f32> = (0..n * k).map(|_| rng.next_signed_unit() * 3.0e38).collect();
    a[..32].fill(3.0e38); // an infinite first term ...
    a[32..64].fill(-3.0e38); // ... and an opposite one: Inf - Inf, the canonical NaN
    cases.push(f32_case("overflow-to-inf-and-nan", m, n, k, a, b));

    let (m, n, k) = (4, 5, 96);
    let a = scaled_rows(&mut rng, m, k, -64..-62);
    let b = scaled_rows(&mut rng, n, k, -66..-64);
    cases.push(f32_case("terms-below-normal-range", m, n, k, a, b));

    let (m, n, k) = (3, 4, 64);
    let ties = |rows: usize, rng: &mut SplitMix64| -> Vec<f32> {
        (0..rows * k).map(|i| if i % 32 == 0 { 127.0 } else { rng.below(254) as f32 - 126.5 }).collect()
    };
    let a = ties(m, &mut rng);
    let b = ties(n, &mut rng);
    cases.push(f32_case("rounding-ties", m, n, k, a, b));

    // Block scales at their exact boundaries: each block's largest magnitude is 127·2^e, or
    // one ulp above it (which needs the next exponent) or below it, for exponents across the
    // range; the other values make every rounding direction appear.
    let (m, n, k) = (6, 5, 192);
    let boundary = |rows: usize, rng: &mut SplitMix64| -> Vec<f32> {
        let mut values = Vec::with_capacity(rows * k);
        for r in 0..rows {
            for block in 0..k / 32 {
                let e = (rng.below(200) as i32 - 100) + (r as i32);
                let top = 127.0 * f32::from_bits(((127 + e) as u32) << 23);
                let amax = match (r + block) % 3 {
                    0 => top,
                    1 => f32::from_bits(top.to_bits() + 1),
                    _ => f32::from_bits(top.to_bits() - 1),
                };
                let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
                values.push(sign * amax);
                values.extend((1..32).map(|_| rng.next_signed_unit() * amax));
            }
        }
        values
    };
    let a = boundary(m, &mut rng);
    let b = boundary(n, &mut rng);
    cases.push(f32_case("block-scale-boundaries", m, n, k, a, b));

    // Long rows whose blocks all share one exponent, while the partial sums are inexact: every
    // block term is large and of varying sign, so each addition rounds.
    let (m, n, k) = (3, 4, 8192);
    let a: Vec<f32> =
        (0..m * k).map(|i| (64 + (i * 37 % 63) as i32) as f32 * if i % 5 < 2 { -1.0 } else { 1.0 }).collect();
    let b: Vec<f32> = (0..n * k).map(|i| (64 + (i * 53 % 63) as i32) as f32 * 1.000_000_1).collect();
    cases.push(f32_case("long-rows-one-exponent", m, n, k, a, b));

    // Outputs that are negative subnormals before the flush, and subnormal partial sums followed
    // by much smaller terms. Each block holds one non-zero pair, so its term is exactly
    // `±127·q · 2^(ea+eb)`: block 0 gives ±16129·2^-139 (a normal just above 2^-126), block 1
    // takes back all but `127·(127 − q)·2^-139` (zero, or a subnormal of either sign, which the
    // flush turns into +0), block 2 is empty, and block 3 adds either a term below the normal
    // range (dropped: a plugin that kept the subnormal partial sum ends on it, or on -0) or a
    // normal one. Rows alternate the sign, columns the amount taken back.
    let (m, n, k) = (4, 4, 128);
    let pow2 = |e: i32| f32::from_bits(((127 + e) as u32) << 23);
    let mut a = vec![0.0f32; m * k];
    for r in 0..m {
        let sign = if r % 2 == 0 { 1.0 } else { -1.0 };
        a[r * k] = sign * 127.0 * pow2(-69);
        a[r * k + 32] = -sign * 127.0 * pow2(-69);
        a[r * k + 96] = 127.0 * pow2(if r < 2 { -60 } else { -69 });
    }
    let mut b = vec![0.0f32; n * k];
    for (j, q) in [127.0f32, 126.0, 125.0, 120.0].into_iter().enumerate() {
        b[j * k] = 127.0 * pow2(-70);
        b[j * k + 32] = q * pow2(-70);
        b[j * k + 96] = pow2(-70); // quantizes to 64·2^-76: with a row's -69, a dropped term
    }
    cases.push(f32_case("subnormal-partial-sums", m, n, k, a, b));

    // The last addition's rules, each block one pair of quants 96 × q (terms exact, `±96·q ·
    // 2^(ea+eb)`). Output 0: −9216·2^-139 (a normal) then 9120·2^-139, so the final sum is the
    // negative subnormal −96·2^-139, which the flush makes +0 (not −0: no later term can hide
    // the sign). Output 1: 9216·2^-139, then a term of 9216·2^-145, below the normal range, which
    // the definition drops; kept (a term made by a float multiply), it would change the sum.
    let (m, n, k) = (1, 2, 64);
    let mut a = vec![0.0f32; m * k];
    a[0] = 96.0 * pow2(-70);
    a[32] = 96.0 * pow2(-70);
    let mut b = vec![0.0f32; n * k];
    b[0] = -96.0 * pow2(-69);
    b[32] = 95.0 * pow2(-69);
    b[k] = 96.0 * pow2(-69);
    b[k + 32] = 96.0 * pow2(-75);
    cases.push(f32_case("last-addition-flush-and-dropped-terms", m, n, k, a, b));

    // Neighbouring blocks that share an exponent, after a larger term: the definition rounds
    // after each block, so two terms of half an ulp of the partial sum each vanish (ties to
    // even, the sum's last bit even), where their block sums added first and rounded once
    // make a whole ulp. Block 0's term is ±16129·2^20 (ulp 2^10); blocks 1 and 2 are one pair
    // each, 32 · 16: the quants 64 (32 = 64·2^-1) and 64 (16 = 64·2^-2), a term of 4096·2^-3 =
    // 512, half an ulp; column 1 takes the second half back (both ways give ±16129·2^20).
    let (m, n, k) = (2, 2, 96);
    let mut a = vec![0.0f32; m * k];
    for (r, sign) in [1.0f32, -1.0].into_iter().enumerate() {
        a[r * k] = sign * 127.0 * pow2(20);
        a[r * k + 32] = 32.0;
        a[r * k + 64] = 32.0;
    }
    let mut b = vec![0.0f32; n * k];
    for (j, last) in [16.0f32, -16.0].into_iter().enumerate() {
        b[j * k] = 127.0;
        b[j * k + 32] = 16.0;
        b[j * k + 64] = last;
    }
    cases.push(f32_case("neighbouring-blocks-one-exponent", m, n, k, a, b));

    // Every block of an output with one exponent, the running sum past 2^24 units of it: the
    // definition rounds after each block, so once the sum passes 2^24 (ulp 2) each odd block sum
    // is a tie to even; the output as one integer dot product rounded once lands elsewhere.
    // Forty blocks of 127 · 127 pairs, each block's last b one smaller (126: block sums 516,001;
    // 124: 515,747), rows ±127: per block 20,640,032 and 20,629,888; rounded once 20,640,040
    // and 20,629,880 (one rounding up, one down).
    let (m, n, k) = (2, 2, 40 * 32);
    let a: Vec<f32> = (0..m * k).map(|i| if i < k { 127.0 } else { -127.0 }).collect();
    let b: Vec<f32> = (0..n * k)
        .map(|i| match (i / k, i % 32) {
            (0, 31) => 126.0,
            (1, 31) => 124.0,
            _ => 127.0,
        })
        .collect();
    cases.push(f32_case("one-exponent-row-past-2^24", m, n, k, a, b));

    // The integer product past 2^24: equal large values over a long k (an f32 accumulator would
    // round), and the full range at k = 70000 (sums wrap nowhere, but pass 2^24 and 2^31/2).
    let (m, n, k) = (2, 3, 70_000);
    let a = vec![127i8; m * k];
    let mut b = vec![127i8; n * k];
    b[k..2 * k].fill(-128);
    cases.push(Case { name: "int8-sums-past-2^24".into(), input: Input::I8 { m, n, k, a, b } });

    // The same call many times, and operand buffers rewritten in place between two calls.
    let (m, n, k) = (9, 7, 100);
    let a = scaled_rows(&mut rng, m, k, -5..5);
    let b = scaled_rows(&mut rng, n, k, -5..5);
    cases.push(Case { name: "repeated-call".into(), input: Input::Repeat { m, n, k, a, b, times: 25 } });
    let (a, b) = (scaled_rows(&mut rng, m, k, -5..5), scaled_rows(&mut rng, n, k, -5..5));
    let (a2, b2) = (scaled_rows(&mut rng, m, k, 10..20), scaled_rows(&mut rng, n, k, -20..-10));
    cases.push(Case { name: "buffers-reused-in-place".into(), input: Input::Reuse { m, n, k, a, b, a2, b2 } });

    // 4. Non-finite inputs must be refused, not computed.
    let (m, n, k) = (2, 3, 40);
    for (name, value, in_a) in
        [("nan-in-a", f32::NAN, true), ("inf-in-b", f32::INFINITY, false), ("neg-inf-in-a", f32::NEG_INFINITY, true)]
    {
        let mut a = scaled_rows(&mut rng, m, k, 0..1);
        let mut b = scaled_rows(&mut rng, n, k, 0..1);
        if in_a {
            a[k + 3] = value;
        } else {
            b[2 * k + 39] = value;
        }
        cases.push(Case { name: name.into(), input: Input::Refuse { m, n, k, a, b } });
    }

    // 5. The probe GEMM.
    let (a, b) = probe_operands();
    cases.push(f32_case("probe", PROBE_M, PROBE_N, PROBE_K, a, b));
    cases
}

fn compare(expected: &[u32], actual: &[u32], n: usize) -> Option<Failure> {
    let wrong = expected.iter().zip(actual).filter(|(e, a)| e != a).count();
    let index = expected.iter().zip(actual).position(|(e, a)| e != a)?;
    Some(Failure::Mismatch {
        index,
        row: index / n.max(1),
        col: index % n.max(1),
        expected_bits: expected[index],
        actual_bits: actual[index],
        wrong,
        total: expected.len(),
    })
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Cases drawn from `seed`, chosen when the gate runs (so a plugin cannot recognise the
/// battery and answer it from a table): shapes, exponents and values of every kind above, each
/// case named with the seed so a failure can be replayed (`run_gate_with_phase`).
pub fn random_phase(seed: u64) -> Vec<Case> {
    let mut rng = SplitMix64::new(seed);
    let mut cases = Vec::new();
    for i in 0..6 {
        let m = 1 + rng.below(48) as usize;
        let n = 1 + rng.below(48) as usize;
        let k = 1 + rng.below(600) as usize;
        let lo = rng.below(120) as i32 - 70;
        let hi = lo + 1 + rng.below(40) as i32;
        let mut a = scaled_rows(&mut rng, m, k, lo..hi);
        let b = scaled_rows(&mut rng, n, k, -40..40);
        // Sprinkle the corners: zeros, subnormals, exact block-scale boundaries.
        for v in a.iter_mut() {
            match rng.below(16) {
                0 => *v = 0.0,
                1 => *v = f32::from_bits(rng.next_u32() & 0x807f_ffff),
                2 => *v = 127.0 * f32::from_bits(((127 + lo.clamp(-100, 100)) as u32) << 23),
                _ => {}
            }
        }
        cases.push(f32_case(format!("random-phase-{seed:#x}-{i}-{m}x{n}x{k}"), m, n, k, a, b));
    }
    let (m, n, k) = (1 + rng.below(20) as usize, 1 + rng.below(20) as usize, 1 + rng.below(3000) as usize);
    let a: Vec<i8> = (0..m * k).map(|_| rng.next_i8()).collect();
    let b: Vec<i8> = (0..n * k).map(|_| rng.next_i8()).collect();
    cases.push(Case { name: format!("random-phase-{seed:#x}-int8-{m}x{n}x{k}"), input: Input::I8 { m, n, k, a, b } });
    cases
}

/// A seed no plugin can know in advance: this process's random hasher keys and the clock.
pub fn fresh_phase_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    hasher.write_u128(now);
    hasher.finish()
}

/// Runs the battery through `backend`, reporting progress before each case: the fixed cases,
/// then a random phase from a seed chosen now (named in its cases).
pub fn run_gate(backend: &mut Backend, progress: &mut dyn FnMut(GateProgress<'_>)) -> GateReport {
    run_gate_with_phase(backend, fresh_phase_seed(), progress)
}

/// [`run_gate`] with the random phase drawn from `phase_seed` (to replay a failure). Every
/// output the plugin writes meanwhile sits between guard words (`Backend::set_output_guards`).
pub fn run_gate_with_phase(
    backend: &mut Backend,
    phase_seed: u64,
    progress: &mut dyn FnMut(GateProgress<'_>),
) -> GateReport {
    backend.set_output_guards(true);
    let report = gate_guarded(backend, phase_seed, progress);
    backend.set_output_guards(false);
    report
}

fn gate_guarded(backend: &mut Backend, phase_seed: u64, progress: &mut dyn FnMut(GateProgress<'_>)) -> GateReport {
    let mut cases = battery();
    // The probe stays last (its hash is the report's).
    let probe = cases.pop().expect("the battery ends with the probe");
    cases.extend(random_phase(phase_seed));
    cases.push(probe);
    let mut report = GateReport {
        backend: backend.name().to_string(),
        device: backend.describe(),
        cases: Vec::with_capacity(cases.len()),
        probe_hash: None,
        reference_probe_hash: 0, // set by the probe case (the battery's last) or below
        aborted: None,
        ops_checked: 0,
    };
    let total = cases.len();
    for (done, case) in cases.iter().enumerate() {
        progress(GateProgress { done, total, case: &case.name });
        let failure = match &case.input {
            Input::F32 { m, n, k, a, b } => {
                let expected = gemm_nt(*m, *n, *k, a, b).expect("battery inputs are finite and well-shaped");
                if case.name == "probe" {
                    report.reference_probe_hash = probe_hash(&expected);
                }
                match backend.gemm_f32(*m, *n, *k, a, b) {
                    Ok(actual) => {
                        if case.name == "probe" {
                            report.probe_hash = Some(probe_hash(&actual));
                        }
                        compare(&bits(&expected), &bits(&actual), *n)
                    }
                    Err(error) => Some(Failure::CallFailed(error)),
                }
            }
            Input::I8 { m, n, k, a, b } => {
                let expected = gemm_i8_nt(*m, *n, *k, a, b);
                match backend.gemm_i8(*m, *n, *k, a, b) {
                    Ok(actual) => {
                        let as_bits = |v: &[i32]| v.iter().map(|x| *x as u32).collect::<Vec<_>>();
                        compare(&as_bits(&expected), &as_bits(&actual), *n)
                    }
                    Err(error) => Some(Failure::CallFailed(error)),
                }
            }
            Input::Repeat { m, n, k, a, b, times } => {
                let expected = bits(&gemm_nt(*m, *n, *k, a, b).expect("battery inputs are finite"));
                (0..*times).find_map(|_| match backend.gemm_f32(*m, *n, *k, a, b) {
                    Ok(actual) => compare(&expected, &bits(&actual), *n),
                    Err(error) => Some(Failure::CallFailed(error)),
                })
            }
            Input::Reuse { m, n, k, a, b, a2, b2 } => {
                let (mut a_buf, mut b_buf) = (a.clone(), b.clone());
                let mut c = vec![0.0f32; m * n];
                let mut outcome = None;
                for (next_a, next_b) in [(a, b), (a2, b2)] {
                    // Same allocations, new contents.
                    a_buf.copy_from_slice(next_a);
                    b_buf.copy_from_slice(next_b);
                    let expected = bits(&gemm_nt(*m, *n, *k, &a_buf, &b_buf).expect("battery inputs are finite"));
                    outcome = match backend.gemm_f32_into(*m, *n, *k, &a_buf, &b_buf, &mut c) {
                        Ok(()) => compare(&expected, &bits(&c), *n),
                        Err(error) => Some(Failure::CallFailed(error)),
                    };
                    if outcome.is_some() {
                        break;
                    }
                }
                outcome
            }
            Input::Refuse { m, n, k, a, b } => match backend.gemm_f32(*m, *n, *k, a, b) {
                Err(error) if error.status == status::NON_FINITE_INPUT => None,
                Err(error) => {
                    Some(Failure::NotRefused { got: format!("`{}`: {}", status::name(error.status), error.message) })
                }
                Ok(_) => Some(Failure::NotRefused { got: "an output".into() }),
            },
        };
        let poisoned = matches!(&failure, Some(Failure::CallFailed(error)) if error.status == status::PANIC);
        report.cases.push(CaseResult { name: case.name.clone(), macs: case.macs(), failure });
        if poisoned {
            report.aborted = Some(format!("the plugin panicked in case `{}`; the instance is unusable", case.name));
            break;
        }
    }
    if report.cases.last().is_none_or(|c| c.name != "probe") {
        // The gate stopped before the probe case: the reference hash is still reported.
        report.reference_probe_hash =
            lockstep_luts::probe::reference_probe_hash().expect("the probe operands are finite");
    }
    if report.aborted.is_none() && backend.has_step_ops() {
        progress(GateProgress { done: report.cases.len(), total, case: "training-step ops" });
        step_ops(backend, phase_seed, &mut report);
    }
    progress(GateProgress { done: report.cases.len(), total, case: "done" });
    report
}

/// The tiny models whose training steps the gate runs op by op: a width that is one block and
/// one that crosses blocks and is no power of two (so `x / c` and `x · (1/c)` differ), heads
/// of 8 and of 12, and weights scaled up so exponentials clamp and products take the slow
/// tiles.
const STEP_CASES: [(usize, usize, usize, usize, usize, f32); 3] =
    [(16, 8, 2, 2, 2, 1.0), (48, 40, 1, 4, 3, 1.0), (32, 16, 1, 2, 2, 300.0)];

/// The fixed cross-entropy case of [`op_cases`]: rows and vocabulary.
const CE_FIXED_ROWS: usize = 7;
const CE_FIXED_VOCAB: usize = 5;

/// A named op sequence and the words every buffer it touches starts with.
type OpCase = (String, Vec<lockstep_luts::ops::Op>, std::collections::BTreeMap<u64, Vec<u32>>);

/// ABI 2: whole tiny training steps, each op run on the plugin and on the reference from the
/// same words and every word it touched compared; then Adam and the hash on adversarial values.
fn step_ops(backend: &mut Backend, phase_seed: u64, report: &mut GateReport) {
    let mut frees: Vec<u64> = Vec::new();
    match op_cases(backend, phase_seed, &mut frees) {
        Ok(cases) => check_op_cases(backend, report, cases),
        Err((name, failure)) => fail_case(report, name, failure),
    }
    for h in frees {
        backend.free_buffer(h);
    }
}

/// A failed case of the op checks.
fn fail_case(report: &mut GateReport, name: String, failure: Failure) {
    report.cases.push(CaseResult { name, macs: 0, failure: Some(failure) });
}

/// The op cases of [`step_ops`], their buffers created on the plugin (and listed in `frees`,
/// whatever happens).
fn op_cases(backend: &mut Backend, phase_seed: u64, frees: &mut Vec<u64>) -> Result<Vec<OpCase>, (String, Failure)> {
    use lockstep_luts::ops::{self, Op, Span};
    use lockstep_node::config::ModelConfig;
    use lockstep_node::params::Layout;
    use lockstep_node::program::Program;
    use std::collections::BTreeMap;

    // The buffers' contents come from the gate's random phase too: the ops meet values nobody
    // chose in advance (the case names carry the seed).
    let mut rng = lockstep_luts::rng::SplitMix64::new(0xa812 ^ phase_seed);
    let mut cases: Vec<OpCase> = Vec::new();
    for (i, &(width, context, layers, heads, batch, scale)) in STEP_CASES.iter().enumerate() {
        let layout = Layout::new(ModelConfig { width, context, layers, heads });
        let program = Program::new(backend, &layout, batch, context)
            .map_err(|e| (format!("step-{i} buffers"), Failure::Setup(e.to_string())))?;
        frees.extend_from_slice(program.buffers());
        let mut memory = BTreeMap::new();
        let ops = program.step().to_vec();
        // Every buffer starts with seeded words: finite values everywhere, tokens below 256.
        let mut lengths: BTreeMap<u64, u64> = BTreeMap::new();
        for op in &ops {
            for (b, end) in op.extents() {
                let e = lengths.entry(b).or_insert(0);
                *e = (*e).max(end);
            }
        }
        for (&buffer, &len) in &lengths {
            let words: Vec<u32> = (0..len)
                .map(|_| {
                    if buffer == program.tokens || buffer == program.targets {
                        rng.next_u32() % 256
                    } else {
                        (rng.next_signed_unit() * scale).to_bits()
                    }
                })
                .collect();
            memory.insert(buffer, words);
        }
        let name =
            format!("step-{i} (c={width} t={context} layers={layers} heads={heads} b={batch}, phase {phase_seed:#x})");
        cases.push((name, ops, memory));
    }
    // Adam and the hash, on values from subnormal to large, of a length no thread split divides.
    let len = 4099usize;
    let mut handles = Vec::new();
    for _ in 0..5 {
        match backend.create_buffer(len) {
            Ok(h) => {
                handles.push(h);
                frees.push(h);
            }
            Err(e) => return Err(("adam buffers".into(), Failure::CallFailed(e))),
        }
    }
    let mut memory = BTreeMap::new();
    for (j, &h) in handles.iter().enumerate() {
        let words: Vec<u32> = (0..len)
            .map(|i| {
                let v = rng.next_signed_unit();
                match (i + j) % 7 {
                    0 => f32::from_bits(rng.next_u32() & 0x807f_ffff).to_bits(), // subnormal or zero
                    1 => (v * 1e30).to_bits(),
                    _ if j == 3 => v.abs().to_bits(), // second moments are never negative
                    _ => v.to_bits(),
                }
            })
            .collect();
        memory.insert(h, words);
    }
    let s0 = |h: u64| Span::new(h, 0);
    let ops = vec![
        Op::Adam(ops::Adam {
            len: len as u32,
            weights: s0(handles[0]),
            grad: s0(handles[1]),
            m: s0(handles[2]),
            v: s0(handles[3]),
            lr: 3e-3,
            correction1: 0.271,
            correction2: 0.0975,
        }),
        Op::Hash(ops::Hash { len: len as u32, data: s0(handles[0]), out: Span::new(handles[4], 7) }),
    ];
    cases.push((format!("adam-and-hash (phase {phase_seed:#x})"), ops, memory));
    // The mean loss's last operation, on fixed words: 7 rows of 5 equal logits give 7 equal
    // losses whose lane sum times 1/7 and divided by 7 differ in the last bit (no random phase
    // reaches that reliably: a random sum tells the two apart a third to two thirds of the time).
    let (rows, vocab) = (CE_FIXED_ROWS, CE_FIXED_VOCAB);
    let mut handles = Vec::new();
    for len in [rows * vocab, rows, rows * vocab, 1] {
        let h =
            backend.create_buffer(len).map_err(|e| ("cross-entropy buffers".to_string(), Failure::CallFailed(e)))?;
        frees.push(h);
        handles.push(h);
    }
    let memory: BTreeMap<u64, Vec<u32>> = BTreeMap::from([
        (handles[0], vec![0; rows * vocab]),
        (handles[1], vec![0; rows]),
        (handles[2], vec![0; rows * vocab]),
        (handles[3], vec![0; 1]),
    ]);
    let ops = vec![Op::CrossEntropy(ops::CrossEntropy {
        rows: rows as u32,
        vocab: vocab as u32,
        logits: Span::new(handles[0], 0),
        targets: Span::new(handles[1], 0),
        dlogits: Span::new(handles[2], 0),
        loss: Span::new(handles[3], 0),
    })];
    cases.push(("cross-entropy-equal-logits".to_string(), ops, memory));
    // Every op table sample (`lockstep_luts::ops::samples`), on the hardest finite values: a new
    // op is gated by its entry alone.
    for (i, sample) in ops::samples().into_iter().enumerate() {
        let placeholders = ops::sample_memory(&[sample], |len| ops::hard_values(&mut rng, len));
        let mut handles = BTreeMap::new();
        let mut memory = BTreeMap::new();
        for (placeholder, words) in placeholders {
            let h = backend
                .create_buffer(words.len())
                .map_err(|e| (format!("sample {i} buffers"), Failure::CallFailed(e)))?;
            frees.push(h);
            handles.insert(placeholder, h);
            memory.insert(h, words);
        }
        let op = sample.with_buffers(|p| handles[&p]);
        cases.push((format!("sample {i} {} (phase {phase_seed:#x})", op.name()), vec![op], memory));
    }
    Ok(cases)
}

/// Runs each case's ops on the plugin and the reference, op by op, comparing every word each
/// op touched; the first difference fails the case.
fn check_op_cases(backend: &mut Backend, report: &mut GateReport, cases: Vec<OpCase>) {
    use lockstep_luts::ops::run_reference;
    for (name, ops, mut memory) in cases {
        for (&buffer, words) in &memory {
            if let Err(e) = backend.write_buffer(buffer, 0, words) {
                return fail_case(report, name, Failure::CallFailed(e));
            }
        }
        for (index, op) in ops.iter().enumerate() {
            let case = format!("{name} op #{index} {}", op.name());
            if let Err(e) = run_reference(op, &mut memory) {
                return fail_case(report, case, Failure::Setup(format!("the reference refused the op: {e}")));
            }
            if let Err(e) = backend.run_ops(std::slice::from_ref(op)) {
                return fail_case(report, case, Failure::CallFailed(e));
            }
            report.ops_checked += 1;
            for (buffer, end) in op.extents() {
                let mut actual = vec![0u32; end as usize];
                if let Err(e) = backend.read_buffer(buffer, 0, &mut actual) {
                    return fail_case(report, case, Failure::CallFailed(e));
                }
                if let Some(failure) = compare(&memory[&buffer][..end as usize], &actual, end as usize) {
                    return fail_case(report, format!("{case} (buffer {buffer})"), failure);
                }
            }
        }
        report.cases.push(CaseResult { name, macs: 0, failure: None });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn battery_covers_what_the_spec_promises() {
        let cases = battery();
        let names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
        for needed in [
            "all-int8-products",
            "all-plus-minus-127",
            "alternating-signs",
            "zero-blocks",
            "one-huge-among-tiny",
            "subnormals",
            "rounding-ties",
            "block-scale-boundaries",
            "long-rows-one-exponent",
            "subnormal-partial-sums",
            "last-addition-flush-and-dropped-terms",
            "neighbouring-blocks-one-exponent",
            "one-exponent-row-past-2^24",
            "int8-sums-past-2^24",
            "repeated-call",
            "buffers-reused-in-place",
            "nan-in-a",
            "probe",
        ] {
            assert!(names.contains(&needed), "battery lacks {needed}");
        }
        // The subnormal case really produces sums that leave the normal range before a flush,
        // negative ones among them.
        let Input::F32 { m, n, k, a, b } =
            &cases.iter().find(|c| c.name == "subnormal-partial-sums").expect("present").input
        else {
            panic!()
        };
        let qa = lockstep_luts::units::quantize_rows(a, *m, *k, lockstep_luts::units::Operand::A).unwrap();
        let qb = lockstep_luts::units::quantize_rows(b, *n, *k, lockstep_luts::units::Operand::B).unwrap();
        let (mut tiny_partials, mut negative_tiny) = (0, 0);
        for i in 0..*m {
            for j in 0..*n {
                let mut sum = 0.0f32;
                for blk in 0..qa.blocks {
                    let acc = lockstep_luts::units::dot_block(qa.block(i, blk), qb.block(j, blk));
                    let raw = sum + lockstep_luts::units::block_term(acc, qa.exponent(i, blk) + qb.exponent(j, blk));
                    if raw != 0.0 && raw.abs() < f32::MIN_POSITIVE {
                        tiny_partials += 1;
                        negative_tiny += usize::from(raw < 0.0);
                    }
                    sum = lockstep_luts::units::flush_partial(raw);
                }
            }
        }
        assert!(tiny_partials > 0 && negative_tiny > 0, "{tiny_partials} tiny partial sums, {negative_tiny} negative");
        // The last addition's case ends on +0 (a flushed −96·2^-139) and on 9216·2^-139 =
        // 1.125·2^-126 (the term of 9216·2^-145 dropped), as its comment works out.
        let Input::F32 { m, n, k, a, b } =
            &cases.iter().find(|c| c.name == "last-addition-flush-and-dropped-terms").expect("present").input
        else {
            panic!()
        };
        assert_eq!(bits(&gemm_nt(*m, *n, *k, a, b).unwrap()), [0x0000_0000, 0x0090_0000]);
        // The neighbouring blocks' case ends every output on ±16129·2^20 (the two half-ulp
        // terms vanish one after the other), where one rounding of their summed block sums
        // would end column 0 one ulp further out.
        let Input::F32 { m, n, k, a, b } =
            &cases.iter().find(|c| c.name == "neighbouring-blocks-one-exponent").expect("present").input
        else {
            panic!()
        };
        assert_eq!(bits(&gemm_nt(*m, *n, *k, a, b).unwrap()), [0x507c_0400, 0x507c_0400, 0xd07c_0400, 0xd07c_0400]);
        // The one-exponent rows end where rounding after every block ends (worked out in the
        // case's comment), not on the once-rounded 0x4b9d7894 / 0x4b9d64bc.
        let Input::F32 { m, n, k, a, b } =
            &cases.iter().find(|c| c.name == "one-exponent-row-past-2^24").expect("present").input
        else {
            panic!()
        };
        assert_eq!(bits(&gemm_nt(*m, *n, *k, a, b).unwrap()), [0x4b9d_7890, 0x4b9d_64c0, 0xcb9d_7890, 0xcb9d_64c0]);
        // The fixed cross-entropy case tells `sum · (1/rows)` from `sum / rows`.
        let (rows, vocab) = (CE_FIXED_ROWS, CE_FIXED_VOCAB);
        let (mut d, mut losses) = (vec![0.0f32; rows * vocab], vec![0.0f32; rows]);
        lockstep_luts::ops::cross_entropy_rows(
            vocab,
            &vec![0.0; rows * vocab],
            &vec![0; rows],
            1.0,
            &mut d,
            &mut losses,
        );
        let sum = lockstep_luts::ops::lane_sum(&losses);
        assert_ne!((sum * (1.0 / rows as f32)).to_bits(), (sum / rows as f32).to_bits());
        // The random phase: a seed decides it, and another seed gives other cases.
        let names_of = |seed| random_phase(seed).iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        assert_eq!(names_of(7), names_of(7));
        assert_ne!(names_of(7), names_of(8));
        assert!(names_of(7).iter().all(|n| n.starts_with("random-phase-0x7-")));
        let max_k = cases
            .iter()
            .filter_map(|c| match &c.input {
                Input::F32 { k, .. } => Some(*k),
                _ => None,
            })
            .max();
        assert!(max_k >= Some(4096));
        // Every f32 case is finite and well-formed, so only the plugin can fail it.
        for case in &cases {
            if let Input::F32 { m, n, k, a, b } = &case.input {
                gemm_nt(*m, *n, *k, a, b).unwrap_or_else(|e| panic!("{}: {e}", case.name));
            }
        }
        // The battery is fixed: building it twice gives the same inputs.
        let again = battery();
        for (x, y) in cases.iter().zip(&again) {
            match (&x.input, &y.input) {
                (Input::F32 { a, b, .. }, Input::F32 { a: a2, b: b2, .. }) => {
                    assert_eq!(bits(a), bits(a2));
                    assert_eq!(bits(b), bits(b2));
                }
                (Input::I8 { a, .. }, Input::I8 { a: a2, .. }) => assert_eq!(a, a2),
                (Input::Refuse { .. }, Input::Refuse { .. }) => {}
                (Input::Repeat { a, .. }, Input::Repeat { a: a2, .. }) => assert_eq!(bits(a), bits(a2)),
                (Input::Reuse { a2, .. }, Input::Reuse { a2: a3, .. }) => assert_eq!(bits(a2), bits(a3)),
                _ => panic!("battery order changed"),
            }
        }
    }

    #[test]
    fn adversarial_cases_reach_the_corners() {
        let find = |name: &str| battery().into_iter().find(|c| c.name == name).unwrap();
        let Input::F32 { m, n, k, a, b } = find("overflow-to-inf-and-nan").input else { panic!() };
        let out = gemm_nt(m, n, k, &a, &b).unwrap();
        assert!(out.iter().any(|v| v.to_bits() == lockstep_luts::units::CANONICAL_NAN_BITS), "no NaN reached");
        assert!(out.iter().any(|v| v.is_infinite()) || out.iter().all(|v| v.is_nan()), "{out:?}");
        let Input::F32 { m, n, k, a, b } = find("terms-below-normal-range").input else { panic!() };
        let out = gemm_nt(m, n, k, &a, &b).unwrap();
        assert!(out.iter().any(|v| v.to_bits() == 0), "no flushed output");
    }
}
