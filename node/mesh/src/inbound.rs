//! What the adapter's tasks (the signaling reader, the channels, compute) tell the event loop.

use std::sync::Arc;

use bytes::BytesMut;
use lockstep_node::audit::{Traced, Urgency};
use lockstep_node::gemm::Gemm;
use lockstep_node::replica::{BackendChange, ForeignError, ReplicaError};
use lockstep_node::session::{Recomputed, WeightsChecked};
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
    /// The guard's disputes (leader): the weights our contribution to `step` was computed
    /// from, checked against the definition's update, or why they could not be.
    WeightsChecked {
        step: u32,
        outcome: Result<WeightsChecked, ReplicaError>,
    },
    /// The guard's disputes (a disputed member): where our weights of `step` part from the
    /// leader `to`'s, found on a blocking thread, to send.
    WeightsServed {
        to: PeerId,
        step: u32,
        words: Option<(u32, Vec<u32>)>,
    },
    /// Audits (target): the state an auditor `to` asked for, encoded as a `State` message on a
    /// blocking thread — a window's whole state is 12 bytes a weight, and copying and encoding it
    /// on the loop delayed the group's step behind it; `routine`: a routine audit's (it waits
    /// for the link's idle time), else a check's.
    StateServed {
        to: PeerId,
        bytes: Vec<u8>,
        routine: bool,
    },
    Saved(Result<Saved, SaveError>),
    /// The referee audits of `urgency` recompute on, opened on a thread of its own as the node
    /// started, or why it could not be.
    RefereeOpened {
        urgency: Urgency,
        referee: Result<Box<dyn Gemm + Send>, ForeignError>,
    },
}

impl Inbound {
    /// Whether the loop takes it before the events queued ahead of it: an audit's frame
    /// ([`lockstep_node::wire::audit_message`]), and a dispute's work done (the leader's check
    /// and run of the definition, the target's trace to send). A disputed member — which the
    /// group no longer waits for, and which falls behind its frames — would otherwise answer its
    /// dispute only after its backlog (1.5 s behind a group of 250 syncs/s on the device machine).
    fn jumps_the_queue(&self) -> bool {
        match self {
            Inbound::Frame(_, _, bytes) => lockstep_node::wire::audit_message(bytes),
            Inbound::Settled { .. }
            | Inbound::TraceServed { .. }
            | Inbound::WeightsChecked { .. }
            | Inbound::WeightsServed { .. } => true,
            Inbound::Audited { urgency, .. } => *urgency == Urgency::Check,
            Inbound::StateServed { routine, .. } => !routine,
            _ => false,
        }
    }
}

/// The sending half of the loop's events: two queues, the urgent one read first
/// ([`Inbound::jumps_the_queue`]). Within each queue the order is kept; a link's frames that
/// do not jump stay in the order they came.
#[derive(Clone)]
pub(crate) struct InboundTx {
    urgent: mpsc::UnboundedSender<Inbound>,
    bulk: mpsc::UnboundedSender<Inbound>,
}

impl InboundTx {
    /// Queues `event`; false when the loop is gone (the event is dropped with it).
    pub(crate) fn send(&self, event: Inbound) -> bool {
        let queue = if event.jumps_the_queue() { &self.urgent } else { &self.bulk };
        queue.send(event).is_ok()
    }

    /// Whether the loop is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.bulk.is_closed()
    }
}

/// The loop's half.
pub(crate) struct InboundRx {
    urgent: mpsc::UnboundedReceiver<Inbound>,
    bulk: mpsc::UnboundedReceiver<Inbound>,
}

impl InboundRx {
    /// The next event, an urgent one first; `None` once every sender is gone. Cancel-safe.
    pub(crate) async fn recv(&mut self) -> Option<Inbound> {
        tokio::select! {
            biased;
            Some(event) = self.urgent.recv() => Some(event),
            event = self.bulk.recv() => event,
        }
    }
}

/// The loop's two queues.
pub(crate) fn inbound_channel() -> (InboundTx, InboundRx) {
    let (urgent, urgent_rx) = mpsc::unbounded_channel();
    let (bulk, bulk_rx) = mpsc::unbounded_channel();
    (InboundTx { urgent, bulk }, InboundRx { urgent: urgent_rx, bulk: bulk_rx })
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

#[cfg(test)]
mod tests {
    use lockstep_node::wire::{decode, encode, Message, Trace};

    use super::*;

    /// A dispute's trace request read before two repair requests queued ahead of it; those two
    /// in their order; nothing once the senders are gone.
    #[tokio::test]
    async fn a_frame_that_jumps_the_queue_is_read_before_those_queued_ahead_of_it() {
        let (tx, mut rx) = inbound_channel();
        let frame = |m: &Message| Inbound::Frame(1, 0, BytesMut::from(&encode(m)[..]));
        let (first, second) =
            (Message::RepairRequest { step: 1, peer: 2 }, Message::RepairRequest { step: 2, peer: 2 });
        let trace = Message::TraceRequest { step: 3, definition: Trace { ops: vec![vec![7, 8]] } };
        for m in [&first, &second, &trace] {
            assert!(tx.send(frame(m)));
        }
        drop(tx);
        let mut read = Vec::new();
        while let Some(event) = rx.recv().await {
            let Inbound::Frame(_, _, bytes) = event else { panic!("a frame") };
            read.push(decode(&bytes).unwrap());
        }
        assert_eq!(read, [trace, first, second]);
    }
}
