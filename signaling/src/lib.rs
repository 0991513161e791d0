//! The signaling server: introduces peers, never sees weights or gradients.
//!
//! `hub` is the state machine (groups, hosts, approvals, relays) without I/O; `server` is the
//! tokio adapter (HTTP, WebSocket upgrade, static files, rate limits); `data` serves `/data`
//! from FineWeb-Edu parquet shards over HTTP range requests.

pub mod data;
mod guard;
pub mod hub;
pub mod protocol;
pub mod server;

pub use hub::{Hub, Limits, Placement};
pub use server::{random_secret, serve, ServerConfig, ServerHandle};
