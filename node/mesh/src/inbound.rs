//! What the adapter's tasks (the signaling reader, the channels, compute) tell the event loop.

use std::sync::Arc;

use bytes::BytesMut;
use lockstep_node::replica::{BackendChange, ReplicaError};
use lockstep_node::wire::{Gradient, PeerId};
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
    ChannelOpen(PeerId, Arc<dyn DataChannel>),
    Frame(PeerId, BytesMut),
    ChannelClosed(PeerId),
    /// A compute task's answer: its gradient, seconds computing and hashing, a backend swap
    /// that took effect at its start, and the state generation it was asked in.
    Computed {
        step: u32,
        result: Result<Gradient, ReplicaError>,
        seconds: f64,
        hash: f64,
        change: Option<BackendChange>,
        generation: u64,
    },
    Saved(Result<Saved, SaveError>),
}
