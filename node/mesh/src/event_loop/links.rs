//! The adapter's links: each peer's connection and counters, what goes out to them (encoded,
//! fragmented, urgent messages first), and the referees kept between recomputations.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use lockstep_node::audit::Urgency;
use lockstep_node::wire::{self, Message, PeerId};
use webrtc::peer_connection::PeerConnection;

use crate::connections::{Lane, Writer};

/// One peer's WebRTC connection and, once its channel is open, its writer.
pub(super) struct Peer {
    pub(super) connection: Arc<dyn PeerConnection>,
    /// Set once the channel is open (the session then knows the peer).
    pub(super) writer: Option<Writer>,
    /// Which attempt this connection is: events of an attempt that was replaced are dropped.
    pub(super) attempt: u64,
    /// (Offerer) the tag our offer carried: an answer to an older offer is dropped.
    pub(super) offered: Option<u64>,
    /// When the attempt began (one whose channel never opens is given up).
    pub(super) since: Instant,
}

/// Counters of one peer's link.
#[derive(Default)]
pub(super) struct LinkStats {
    pub(super) bytes_in: u64,
    pub(super) bytes_out: u64,
    pub(super) rtt_ms: Option<f64>,
    /// The outstanding ping: its nonce and when it left.
    pub(super) ping: Option<(u64, Instant)>,
    /// When the last frame came (or the channel opened).
    pub(super) heard: Option<Instant>,
    /// Whether the current silence was reported.
    pub(super) silence_reported: bool,
}

impl LinkStats {
    /// The answer to our outstanding ping: the round trip is measured.
    pub(super) fn pong(&mut self, nonce: u64) {
        if let Some((sent, at)) = self.ping {
            if sent == nonce {
                self.rtt_ms = Some(at.elapsed().as_secs_f64() * 1e3);
                self.ping = None;
            }
        }
    }
}

/// The referees kept between recomputations of others' work: a routine audit's computes on
/// low-priority threads (it was opened on one), a check's on threads of the member's own
/// priority, so each is kept for its kind — one for each audit that may run at once.
#[derive(Default)]
pub(super) struct Referees {
    pub(super) routine: Vec<Box<dyn lockstep_node::gemm::Gemm + Send>>,
    pub(super) check: Vec<Box<dyn lockstep_node::gemm::Gemm + Send>>,
}

impl Referees {
    pub(super) fn pool(&mut self, urgency: Urgency) -> &mut Vec<Box<dyn lockstep_node::gemm::Gemm + Send>> {
        match urgency {
            Urgency::Routine => &mut self.routine,
            Urgency::Check => &mut self.check,
        }
    }

    pub(super) fn take(&mut self, urgency: Urgency) -> Option<Box<dyn lockstep_node::gemm::Gemm + Send>> {
        self.pool(urgency).pop()
    }

    /// A referee back from a recomputation of `urgency`, if it brought one.
    pub(super) fn give_back(&mut self, urgency: Urgency, referee: Option<Box<dyn lockstep_node::gemm::Gemm + Send>>) {
        self.pool(urgency).extend(referee);
    }
}

/// The peers and what goes out to them: per-peer counters, the fault-injection cuts, and the
/// message ids for fragmentation.
#[derive(Default)]
pub(super) struct Links {
    pub(super) peers: BTreeMap<PeerId, Peer>,
    pub(super) stats: BTreeMap<PeerId, LinkStats>,
    /// Peers nothing is sent to (fault injection; the channel stays open).
    pub(super) cut: Vec<PeerId>,
    pub(super) next_message_id: u32,
    /// Bytes of the answers served to auditors (states, traces), also counted per link.
    pub(super) audit_bytes_out: u64,
}

impl Links {
    /// Encodes, fragments and queues `message` for `to` (if its channel is open and not cut):
    /// urgent where it jumps the queue ([`wire::jumps_the_queue`]), else with the step's traffic.
    pub(super) fn send(&mut self, to: PeerId, message: &Message) {
        self.send_on(to, message, Lane::Bulk);
    }

    /// [`Links::send`], a message that does not jump the queue waiting in `lane`.
    pub(super) fn send_on(&mut self, to: PeerId, message: &Message, lane: Lane) {
        if !self.sendable(to) {
            return;
        }
        let served = matches!(message, Message::State { .. } | Message::Trace { .. });
        self.send_encoded(to, wire::encode(message), lane, served);
    }

    /// Whether `to`'s channel is open and not cut.
    fn sendable(&self, to: PeerId) -> bool {
        self.peers.get(&to).is_some_and(|p| p.writer.is_some()) && !self.cut.contains(&to)
    }

    /// [`Links::send_on`], a message encoded already (`served`: an answer to an auditor).
    pub(super) fn send_encoded(&mut self, to: PeerId, bytes: Vec<u8>, lane: Lane, served: bool) {
        if !self.sendable(to) {
            return;
        }
        let writer = self.peers.get(&to).and_then(|p| p.writer.as_ref()).expect("sendable: open");
        self.next_message_id = self.next_message_id.wrapping_add(1);
        let link = self.stats.entry(to).or_default();
        let lane = if wire::jumps_the_queue(&bytes) { Lane::Urgent } else { lane };
        for frame in wire::frames(bytes, self.next_message_id) {
            link.bytes_out += frame.len() as u64;
            if served {
                self.audit_bytes_out += frame.len() as u64;
            }
            writer.send(frame, lane);
        }
    }

    /// `message` to every peer whose channel is open.
    pub(super) fn broadcast(&mut self, message: &Message) {
        for peer in self.open() {
            self.send(peer, message);
        }
    }

    /// Bytes sent to every peer so far.
    pub(super) fn sent(&self) -> u64 {
        self.stats.values().map(|s| s.bytes_out).sum()
    }

    /// Of [`Links::sent`], the answers served to auditors.
    pub(super) fn sent_for_audits(&self) -> u64 {
        self.audit_bytes_out
    }

    /// Peers whose data channel is open.
    pub(super) fn open(&self) -> Vec<PeerId> {
        self.peers.iter().filter(|(_, p)| p.writer.is_some()).map(|(&id, _)| id).collect()
    }
}
