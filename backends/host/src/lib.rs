//! The host side of compute-backend plugins.
//!
//! - [`loader`]: opens a plugin file, checks its entry symbol, ABI major version, table size,
//!   required functions and capabilities, and never unloads it; a hot-swap loads a fresh copy
//!   under a unique name.
//! - [`Backend`]: one live plugin instance with safe, typed calls.
//! - [`gate`]: the exact gate — the fixed battery a plugin must pass, bit for bit, before use.
//! - [`units_gemm`]: the glue that makes admitted instances the model's `Gemm` (the compute
//!   trait `lockstep_node` defines; `node` itself never loads a plugin).
//!
//! **API boundary**: only `lockstep_worker_api` types cross into a plugin. The host never
//! knows which implementation it holds except through the gate's verdict.

pub mod backend;
pub mod gate;
pub mod loader;
pub mod units_gemm;

pub use backend::{Backend, BackendError, InstanceOptions};
pub use gate::{run_gate, GateReport};
pub use loader::{resolve_plugin, LoadError, Plugin, BUILTIN_BACKENDS};
pub use units_gemm::UnitsGemm;
