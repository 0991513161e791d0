//! The console and the node runtime: the commands a person trains with (`demo`, `node`,
//! `train`, `gate`, `signal`, `generate`, `kit`), the ratatui console, and how a backend's
//! name becomes an admitted backend (every plugin gated in a child process first).
//!
//! The binary (`cli/`) parses the command line and calls in here; what measures or tries the
//! product from outside (benches, `chaos`, `bisect`) is `lockstep-harness`, built on the
//! pieces this crate makes public.

#[cfg(test)]
mod architecture_tests;
pub mod backend;
mod console;
pub mod demo;
pub mod gate;
pub mod gate_child;
mod headless;
pub mod infer;
pub mod node;
pub mod node_runtime;
mod route;
pub mod run_args;
pub mod signal;
pub mod train;
