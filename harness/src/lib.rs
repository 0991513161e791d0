//! What measures and tries the product from outside: `lockstep bench …`, the fault campaign
//! (`lockstep chaos`), `lockstep bisect`, and [`client`], the one headless-node client that
//! they and the process-level tests (`tests/e2e/`) drive real processes with.
//!
//! Nothing here is on a training node's path: the node runtime and the console are
//! `lockstep-tui`; this crate uses their public pieces (admitting a backend, the run
//! settings as flags, a group's replay) and the binary's subcommands stay as they were.

pub mod bench;
mod bench_audit;
mod bench_exchange;
mod bench_train;
mod bench_wan;
pub mod bisect;
pub mod chaos;
pub mod client;
pub mod netns;
pub mod plot;
