//! The signaling server: introduces peers, never sees weights or gradients.
//!
//! `hub` is the state machine (groups, hosts, approvals, relays) without I/O; `server` is the
//! tokio adapter (HTTP, WebSocket upgrade, static files, rate limits); `data` serves `/data`
//! from FineWeb-Edu parquet shards over HTTP range requests.

pub mod data;
pub mod hub;
pub mod protocol;
pub mod server;

pub use hub::{Hub, Limits, Placement};
pub use server::{random_secret, serve, ServerConfig, ServerHandle};

/// Locks a mutex, carrying on with the state as it is if a thread panicked while holding it
/// (a panic there is a bug, but the server keeps serving everyone else).
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
