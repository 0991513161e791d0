//! The probe GEMM: a fixed, seeded unit call whose output hash every correct backend shares.
//!
//! Each training step re-runs it through the live kernel; a device whose arithmetic has gone
//! wrong is caught even while its weights still agree. The shape has a short last block and
//! sizes that are not multiples of any tile, so the edges of a kernel are exercised too.

use crate::hash::fnv1a32_f32;
use crate::rng::SplitMix64;
use crate::units::{gemm_nt, UnitError};

pub const PROBE_SEED: u64 = 0x6c6f_636b_7374_6570; // "lockstep"
pub const PROBE_M: usize = 37;
pub const PROBE_N: usize = 53;
pub const PROBE_K: usize = 200;

/// The probe operands `(A: M × K, B: N × K)`: uniform values in `[-1, 1)` with per-row
/// magnitudes spread over `2^-8 … 2^7`, so block exponents vary.
pub fn probe_operands() -> (Vec<f32>, Vec<f32>) {
    let mut rng = SplitMix64::new(PROBE_SEED);
    let mut draw = |rows: usize| {
        let mut values = Vec::with_capacity(rows * PROBE_K);
        for _ in 0..rows {
            let scale = pow2(rng.below(16) as i32 - 8);
            for _ in 0..PROBE_K {
                values.push(rng.next_signed_unit() * scale);
            }
        }
        values
    };
    let a = draw(PROBE_M);
    let b = draw(PROBE_N);
    (a, b)
}

/// `2^p` built on the bits, for `p` in the normal range.
pub fn pow2(p: i32) -> f32 {
    assert!((-126..=127).contains(&p), "2^{p} is not a normal f32");
    f32::from_bits(((127 + p) as u32) << 23)
}

/// The probe hash of an output: FNV-1a over its little-endian f32 bytes.
pub fn probe_hash(output: &[f32]) -> u32 {
    fnv1a32_f32(output)
}

/// The probe hash computed by the reference units.
pub fn reference_probe_hash() -> Result<u32, UnitError> {
    let (a, b) = probe_operands();
    Ok(probe_hash(&gemm_nt(PROBE_M, PROBE_N, PROBE_K, &a, &b)?))
}
