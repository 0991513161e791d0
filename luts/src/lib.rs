//! The verified INT8 units, defined once.
//!
//! This crate is the oracle: the exact int8 product table (`mul_lut.bin`), the scalar
//! reference units (block-scaled quantize → table product → int32 accumulate → fixed-order f32
//! epilogue), the probe GEMM and its hash, and the seeded generator every battery draws from.
//! Everything here is pure — no I/O, no clocks, no threads — and written to be obviously
//! correct rather than fast. `docs/VERIFICATION.md` is the same specification in prose.

pub mod hash;
pub mod mathf;
pub mod ops;
pub mod probe;
pub mod rng;
pub mod table;
pub mod units;
pub mod words;

pub use hash::fnv1a32;
pub use units::{gemm_i8_nt, gemm_nt, UnitError, BLOCK};
