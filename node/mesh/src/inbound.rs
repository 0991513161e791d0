//! What the adapter's tasks (the signaling reader, the channels, compute) tell the event loop.

use std::sync::Arc;

use bytes::BytesMut;
use lockstep_node::audit::{Traced, Urgency};
use lockstep_node::gemm::Gemm;
use lockstep_node::replica::{BackendChange, ReplicaError};
use lockstep_node::session::Recomputed;
use lockstep_node::wire::{Gradient, PeerId, TraceAnswer};
use lockstep_signaling::protocol::{ClientMessage, ServerMessage};
use tokio::sync::mpsc;
use webrtc::data_channel::DataChannel;

use crate::checkpoint_file::{SaveError, Saved};

/// What the adapter's tasks tell the loop.
pub(crate) enum Inbound {
    /// A message from the signaling server, or why its frame was not one.
    Signal(Result<ServerMessage, String>),
    SignalClosed(String),
    /// A reconnection to the signaling server succeeded: messages for it go here now.
    SignalReconnected(mpsc::UnboundedSender<ClientMessage>),
    /// A link's channel opened, a frame came, the link closed: each names the connection
    /// attempt it belongs to (`None`: whichever is current — the server said the peer left).
    ChannelOpen(PeerId, u64, Arc<dyn DataChannel>),
    Frame(PeerId, u64, BytesMut),
    ChannelClosed(PeerId, Option<u64>),
    Computed(Computed),
    /// An audit's answer: `target`'s contribution to `step` recomputed, or why it could not be.
    Audited {
        step: u32,
        target: PeerId,
        outcome: Result<Recomputed, ReplicaError>,
        /// The referee the audit ran on, kept for the next of its urgency.
        referee: Option<Box<dyn Gemm + Send>>,
        urgency: Urgency,
        seconds: f64,
    },
    /// Disputes (leader): the definition's run of `target`'s step against its trace, or why
    /// it could not be run, and the referee it ran on.
    Settled {
        step: u32,
        target: PeerId,
        outcome: Result<Traced, ReplicaError>,
        referee: Option<Box<dyn Gemm + Send>>,
    },
    /// Disputes (target): this node's trace of `step` for the leader `to`, made on a blocking
    /// thread, to send.
    TraceServed {
        to: PeerId,
        step: u32,
        answer: TraceAnswer,
    },
    Saved(Result<Saved, SaveError>),
}

/// A compute task's answer: its gradient for `step`, seconds computing and hashing, a backend
/// swap that took effect at its start, and the state generation it was asked in.
pub(crate) struct Computed {
    pub(crate) step: u32,
    pub(crate) result: Result<Gradient, ReplicaError>,
    pub(crate) seconds: f64,
    pub(crate) hash: f64,
    pub(crate) change: Option<BackendChange>,
    /// Fault injection: this is the first contribution a rogue made wrong.
    pub(crate) rogue_began: Option<u32>,
    pub(crate) generation: u64,
}
