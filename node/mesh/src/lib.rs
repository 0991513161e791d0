//! The mesh adapter: everything around `lockstep_node::session` that touches the world.
//!
//! - a signaling client (tokio-tungstenite) that joins a group and relays WebRTC handshakes;
//! - one `webrtc` 0.21 peer connection per other member (full mesh), each with one reliable,
//!   ordered data channel; the member with the smaller id offers; ICE gathering completes
//!   before the description is sent (no trickle); mDNS is off; host candidates on the bind
//!   address; STUN/TURN servers are configurable for real deployments;
//! - flow control: each channel's send buffer is bounded (`send` waits when it is full), and
//!   each peer has its own writer task, so a slow peer never stalls the others;
//! - framing: messages are encoded by `lockstep_node::wire`, split into 48 KB frames, and
//!   reassembled per sender;
//! - the event loop (`event_loop.rs`, one `MeshLoop` object with a method per kind of event):
//!   feeds the session inputs (channel open/closed, messages, ticks every 50 ms, compute
//!   results, commands) and executes its outputs through a [`Replica`];
//! - the `/data` client (`data_client.rs`), and the packaged corpus's reader (`corpus.rs`: a
//!   directory or an HTTP URL read by ranges), which nodes and `lockstep train` sample from.
//!
//! - link messages (`lockstep_node::wire` -9 … -11): each node tells its peers which backend
//!   computes on it (and the gate's verdict), pings every open channel once a second, and
//!   reports round-trip time and bytes in/out per peer;
//! - room administration relayed from the console: join requests in, approve/deny out;
//! - checkpoint saves (the replica's snapshot, written to a file off the event loop;
//!   `checkpoint_file.rs`).
//!
//! **Architecture Invariant:** all training-protocol decisions are the session's; this crate
//! only moves bytes, runs compute, measures links and reports events. Link messages never
//! reach the session and never change a weight.

use std::sync::{Arc, Mutex};

use lockstep_node::replica::Replica;
use tokio::sync::mpsc;

pub mod bench;
mod checkpoint_file;
mod config;
mod connections;
mod control;
pub mod corpus;
pub mod data_client;
mod event_loop;
mod inbound;
mod signal_client;
pub mod sockets;

pub use checkpoint_file::{save_checkpoint, CheckpointTarget, SaveError, Saved};
pub use config::{
    channel_settings, mesh_runtime, new_member_id, MeshConfig, AGENT, IN_FLIGHT_BYTES, LINK_TICK, LOOPBACK_RECEIVE_MTU,
    LOOPBACK_SCTP_MTU, SCTP_RECEIVE_BUFFER_BYTES, SEND_BUFFER_BYTES,
};
pub use connections::CHANNEL_LABEL;
pub use control::{Command, Ended, Report, StepTiming, SwapProgress};
use event_loop::MeshLoop;
use signal_client::{connect_signal, signal_url};
pub use sockets::LinkShim;

/// Runs one node until `Quit`, a refusal, or a denial. Once welcomed, a node outlives its
/// signaling server: it trains on over its data channels and takes its place back when the
/// server answers again (see `MeshLoop::on_signal_closed`).
pub async fn run(
    config: MeshConfig,
    replica: Arc<Mutex<dyn Replica>>,
    commands: mpsc::UnboundedReceiver<Command>,
    report: impl Fn(Report) + Send + 'static,
) -> anyhow::Result<Ended> {
    let (inbound_tx, inbound) = inbound::inbound_channel();
    let signal_tx = connect_signal(&signal_url(&config, None), inbound_tx.clone()).await?.start_reading();
    Ok(MeshLoop::new(config, replica, report, inbound_tx, signal_tx).run(commands, inbound).await)
}
