//! The stable C ABI between the host and compute-backend plugins.
//!
//! A plugin is a shared library exporting one symbol, [`ENTRY_SYMBOL`], an `extern "C"`
//! function returning a pointer to a static [`WorkerVTable`]. The table starts with the ABI
//! version and its own size, then capability flags, then nullable `extern "C"` function
//! pointers. Everything that crosses is `#[repr(C)]`: integers, raw pointers, and host-owned
//! buffers. Errors are integer [`status`] codes plus a UTF-8 message the plugin writes into a
//! host-owned [`ErrorBuf`].
//!
//! **Evolution.** The table is append-only. A minor version may add fields at the end; the
//! host reads a field only when `struct_size` covers it and its capability bit is set. A major
//! version the host does not know means it must refuse the plugin.
//!
//! **Plugin side.** Implement [`plugin::Worker`] and invoke [`export_worker!`]; the macro
//! generates the entry symbol and wraps every exported function in `catch_unwind`, so a panic
//! becomes [`status::PANIC`] instead of unwinding into the host (which would abort it).

mod abi;
pub mod ops;
pub mod plugin;

pub use abi::*;

/// The environment variable that tells the `cpu` plugin which of its paths to run
/// (`avx512-vnni`, `avx-vnni`, `avx2`, `portable`) instead of the fastest this CPU has: members of
/// two CPU kinds on one machine (every path gives the same bits). A host sets it per process.
pub const CPU_PATH_ENV: &str = "LOCKSTEP_CPU_PATH";
