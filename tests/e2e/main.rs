//! End-to-end tests: the real `lockstep` binary and real processes — signaling servers, nodes
//! over real WebRTC, tmux, nginx, Chromium, network namespaces. One test binary (the files
//! below are its modules) so the suite links once; `common` holds what they share.
//!
//! Built as the `e2e` test of the `lockstep` package (`tui/Cargo.toml`), which is what gives
//! it the binary's path.

mod common;

mod browser_peer;
mod chaos;
mod cli;
mod console_tmux;
mod corpus;
mod data_nginx;
mod kit_browser;
mod mesh;
