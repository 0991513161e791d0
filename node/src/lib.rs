//! The training node: the model trained through the verified units.
//!
//! `model` (forward and backward by hand) runs every matrix product through a `gemm::Gemm`:
//! the units via a backend plugin, or plain f32 for the float reference. `trainer` is one
//! node's loop (gradient, then one Adam update), `checkpoint` its persistence, `generate` and
//! `kit` its inference.

pub mod adam;
pub mod admission;
pub mod audit;
pub mod checkpoint;
pub mod compute_error;
pub mod config;
pub mod data;
pub mod device;
pub mod gemm;
pub mod generate;
pub mod host_device;
pub mod kit;
pub use lockstep_luts::mathf;
pub mod model;
pub mod params;
pub mod program;
pub mod replica;
pub mod session;
pub mod settings;
pub mod sync;
pub mod trainer;
pub mod verdict;
pub mod wire;
