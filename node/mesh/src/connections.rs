//! WebRTC plumbing for one peer: the peer connection with the mesh's settings, its event
//! handler, and the reader and writer tasks of its data channel.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::BytesMut;
use lockstep_node::wire::PeerId;
use tokio::sync::mpsc;
use webrtc::data_channel::{DataChannel, DataChannelEvent};
use webrtc::peer_connection::{
    PeerConnection, PeerConnectionBuilder, PeerConnectionEventHandler, RTCConfigurationBuilder, RTCIceGatheringState,
    RTCIceServer, RTCPeerConnectionState,
};

use crate::config::{channel_settings, mesh_runtime, MeshConfig};
use crate::inbound::{Inbound, InboundTx};

/// The data channel's label (the offerer creates it; the answerer takes it as offered).
pub const CHANNEL_LABEL: &str = "lockstep";

struct Handler {
    peer: PeerId,
    attempt: u64,
    gathered: mpsc::UnboundedSender<()>,
    inbound: InboundTx,
}

#[async_trait::async_trait]
impl PeerConnectionEventHandler for Handler {
    async fn on_ice_gathering_state_change(&self, state: RTCIceGatheringState) {
        if state == RTCIceGatheringState::Complete {
            let _ = self.gathered.send(());
        }
    }

    async fn on_connection_state_change(&self, state: RTCPeerConnectionState) {
        if matches!(state, RTCPeerConnectionState::Failed | RTCPeerConnectionState::Closed) {
            let _ = self.inbound.send(Inbound::ChannelClosed(self.peer, Some(self.attempt)));
        }
    }

    async fn on_data_channel(&self, channel: Arc<dyn DataChannel>) {
        // Answerer side: the offerer created the channel.
        spawn_reader(self.peer, self.attempt, channel, self.inbound.clone());
    }
}

/// Reads a channel's events until it closes; `attempt` names the connection (a link to the
/// same peer may be replaced by a later one).
pub fn spawn_reader(peer: PeerId, attempt: u64, channel: Arc<dyn DataChannel>, inbound: InboundTx) {
    tokio::spawn(async move {
        let mut announced = false;
        while let Some(event) = channel.poll().await {
            match event {
                DataChannelEvent::OnOpen if !announced => {
                    announced = true;
                    let _ = inbound.send(Inbound::ChannelOpen(peer, attempt, channel.clone()));
                }
                DataChannelEvent::OnMessage(message) => {
                    let _ = inbound.send(Inbound::Frame(peer, attempt, message.data));
                }
                DataChannelEvent::OnClose => break,
                _ => {}
            }
        }
        let _ = inbound.send(Inbound::ChannelClosed(peer, Some(attempt)));
    });
}

/// Which of a channel's queues a frame waits in ([`Writer`]): each is drained only when those
/// above it are empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Whole small messages that must not wait (the agreement's, the link's, a dispute's):
    /// they go out between the fragments of a large contribution, which the far side
    /// reassembles regardless (fragments carry their message's id).
    Urgent,
    /// The step's own traffic: contributions, repairs, checkpoints.
    Bulk,
    /// What a routine audit asked for (a served state): it takes the link's time the group's
    /// own traffic leaves, as a routine recomputation takes the cycles the member's step leaves
    /// (`docs/TRUST.md`, "the audits' cost").
    Spare,
}

/// A channel's writer: three queues of frames ([`Lane`]), each drained only while those above
/// it are empty. Within each queue the order is kept.
#[derive(Clone, Debug)]
pub struct Writer {
    urgent: mpsc::UnboundedSender<Vec<u8>>,
    bulk: mpsc::UnboundedSender<Vec<u8>>,
    spare: mpsc::UnboundedSender<Vec<u8>>,
}

impl Writer {
    pub fn send(&self, frame: Vec<u8>, lane: Lane) {
        let queue = match lane {
            Lane::Urgent => &self.urgent,
            Lane::Bulk => &self.bulk,
            Lane::Spare => &self.spare,
        };
        let _ = queue.send(frame);
    }
}

/// A spare frame goes out only while the channel holds at most this many bytes not yet
/// acknowledged: two fragments. A frame handed to the channel is in SCTP's hands, and the
/// group's next contribution would wait behind all of them.
const SPARE_WHEN_OUTSTANDING_AT_MOST: usize = 2 * lockstep_node::wire::FRAGMENT_BYTES;

/// How often a held frame looks again at what its channel holds.
const HELD_POLL: Duration = Duration::from_millis(1);

/// The node's budget of bytes in flight (sent, not yet acknowledged) for the step's traffic,
/// shared by its channels: each gets an equal share while it is open, and a bulk frame waits
/// while its channel holds its share (one frame always may go). Where the node's uplink
/// queues less than all its channels would send at once, the excess is dropped, and SCTP
/// recovers from a burst of drops slowly (`config::IN_FLIGHT_BYTES`).
#[derive(Debug)]
pub struct InFlight {
    budget: usize,
    channels: AtomicUsize,
}

impl InFlight {
    pub fn new(budget: usize) -> Arc<InFlight> {
        Arc::new(InFlight { budget, channels: AtomicUsize::new(0) })
    }

    /// What one channel may hold: its share of the budget, two fragments at least.
    fn share(&self) -> usize {
        let channels = self.channels.load(Ordering::Relaxed).max(1);
        (self.budget / channels).max(2 * lockstep_node::wire::FRAGMENT_BYTES)
    }

    /// Whether a bulk frame of `len` bytes may go out on a channel holding `outstanding`.
    fn admits(&self, outstanding: usize, len: usize) -> bool {
        outstanding == 0 || outstanding + len <= self.share()
    }
}

/// A channel counted in its node's [`InFlight`] while its writer runs.
struct Counted(Arc<InFlight>);

impl Counted {
    fn new(in_flight: Arc<InFlight>) -> Counted {
        in_flight.channels.fetch_add(1, Ordering::Relaxed);
        Counted(in_flight)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.channels.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The writer task's half of a [`Writer`]'s queues.
struct Lanes {
    urgent: mpsc::UnboundedReceiver<Vec<u8>>,
    bulk: mpsc::UnboundedReceiver<Vec<u8>>,
    spare: mpsc::UnboundedReceiver<Vec<u8>>,
}

impl Lanes {
    /// The next frame to write and its lane: from the highest lane that holds one; `None` once
    /// every sender is gone and the queues are drained. Cancel-safe.
    async fn next(&mut self) -> Option<(Vec<u8>, Lane)> {
        tokio::select! {
            biased;
            Some(frame) = self.urgent.recv() => Some((frame, Lane::Urgent)),
            Some(frame) = self.bulk.recv() => Some((frame, Lane::Bulk)),
            Some(frame) = self.spare.recv() => Some((frame, Lane::Spare)),
            else => None,
        }
    }

    /// A frame that may pass what is held, waiting at most `wait`: an urgent one, or a bulk
    /// one where no bulk frame is held (a lane keeps its order); `None` when none came.
    async fn next_passing(&mut self, bulk_held: bool, wait: Duration) -> Option<(Vec<u8>, Lane)> {
        tokio::select! {
            biased;
            Some(frame) = self.urgent.recv() => Some((frame, Lane::Urgent)),
            Some(frame) = self.bulk.recv(), if !bulk_held => Some((frame, Lane::Bulk)),
            () = tokio::time::sleep(wait) => None,
        }
    }
}

fn lanes() -> (Writer, Lanes) {
    let (urgent, urgent_rx) = mpsc::unbounded_channel();
    let (bulk, bulk_rx) = mpsc::unbounded_channel();
    let (spare, spare_rx) = mpsc::unbounded_channel();
    (Writer { urgent, bulk, spare }, Lanes { urgent: urgent_rx, bulk: bulk_rx, spare: spare_rx })
}

/// One task per channel writes its frames, the higher lanes' first. An urgent frame goes out
/// at once; a bulk frame waits while the channel holds its share of the node's [`InFlight`]
/// budget; a spare frame waits until the channel has sent what it holds
/// ([`SPARE_WHEN_OUTSTANDING_AT_MOST`]), the upper lanes' frames going out meanwhile: it takes
/// only the link's idle time. `send` itself waits while the channel's buffer is full, so a slow
/// peer only slows its own queues.
pub fn spawn_writer(channel: Arc<dyn DataChannel>, in_flight: Arc<InFlight>) -> Writer {
    let (writer, mut lanes) = lanes();
    tokio::spawn(async move {
        let _counted = Counted::new(in_flight.clone());
        let (mut bulk, mut spare): (Option<Vec<u8>>, Option<Vec<u8>>) = (None, None);
        loop {
            if bulk.is_none() && spare.is_none() {
                match lanes.next().await {
                    Some((frame, Lane::Urgent)) if !write(&channel, &frame).await => break,
                    Some((_, Lane::Urgent)) => continue,
                    Some((frame, Lane::Bulk)) => bulk = Some(frame),
                    Some((frame, Lane::Spare)) => spare = Some(frame),
                    None => break,
                }
            }
            let outstanding = channel.outstanding_bytes().await.unwrap_or(0);
            let ready = if bulk.as_ref().is_some_and(|frame| in_flight.admits(outstanding, frame.len())) {
                bulk.take()
            } else if bulk.is_none() && outstanding <= SPARE_WHEN_OUTSTANDING_AT_MOST {
                spare.take()
            } else {
                None
            };
            if let Some(frame) = ready {
                if !write(&channel, &frame).await {
                    break;
                }
                continue;
            }
            match lanes.next_passing(bulk.is_some(), HELD_POLL).await {
                Some((frame, Lane::Bulk)) => bulk = Some(frame),
                Some((frame, _)) if !write(&channel, &frame).await => break,
                Some(_) | None => {}
            }
        }
    });
    writer
}

/// Hands `frame` to the channel; false once the channel is gone.
async fn write(channel: &Arc<dyn DataChannel>, frame: &[u8]) -> bool {
    channel.send(BytesMut::from(frame)).await.is_ok()
}

/// A peer connection to `peer` with the mesh's settings (`large_packets`: loopback SCTP
/// packets, see `channel_settings`), and a receiver that fires once ICE gathering has
/// completed; its events carry `attempt`.
pub async fn new_connection(
    config: &MeshConfig,
    peer: PeerId,
    attempt: u64,
    large_packets: bool,
    inbound: &InboundTx,
) -> anyhow::Result<(Arc<dyn PeerConnection>, mpsc::UnboundedReceiver<()>)> {
    let (gathered_tx, gathered_rx) = mpsc::unbounded_channel();
    let ice_servers = if config.ice_servers.is_empty() {
        Vec::new()
    } else {
        vec![RTCIceServer {
            urls: config.ice_servers.clone(),
            username: config.turn_username.clone(),
            credential: config.turn_credential.clone(),
        }]
    };
    let runtime = mesh_runtime(config.link)?;
    let builder = PeerConnectionBuilder::new()
        .with_configuration(RTCConfigurationBuilder::new().with_ice_servers(ice_servers).build())
        .with_handler(Arc::new(Handler { peer, attempt, gathered: gathered_tx, inbound: inbound.clone() }))
        .with_runtime(runtime)
        .with_udp_addrs(vec![format!("{}:0", config.bind_ip)]);
    let connection = channel_settings(builder, config.bind_ip.is_loopback(), large_packets)
        .build()
        .await
        .context("creating a peer connection")?;
    Ok((Arc::new(connection), gathered_rx))
}

/// Waits for ICE gathering (no trickle): the local description then carries every candidate.
pub async fn gathered_description(
    connection: &Arc<dyn PeerConnection>,
    gathered: &mut mpsc::UnboundedReceiver<()>,
) -> anyhow::Result<serde_json::Value> {
    if tokio::time::timeout(Duration::from_secs(10), gathered.recv()).await.is_err() {
        bail!("ICE gathering did not complete within 10 s");
    }
    let description = connection.local_description().await.context("no local description")?;
    serde_json::to_value(description).context("encoding the session description")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames come out by lane — urgent, then bulk, then spare — whatever the order they were
    /// queued in, each lane in its own order; nothing once the writer is gone.
    #[tokio::test]
    async fn a_lane_is_drained_only_while_those_above_it_are_empty() {
        let (writer, mut lanes) = lanes();
        for (frame, lane) in [
            (b"s1", Lane::Spare),
            (b"b1", Lane::Bulk),
            (b"s2", Lane::Spare),
            (b"u1", Lane::Urgent),
            (b"b2", Lane::Bulk),
            (b"u2", Lane::Urgent),
        ] {
            writer.send(frame.to_vec(), lane);
        }
        let mut written = Vec::new();
        for _ in 0..4 {
            written.push(lanes.next().await.unwrap().0);
        }
        // A bulk frame queued now still goes out before the spare lane's.
        writer.send(b"b3".to_vec(), Lane::Bulk);
        drop(writer);
        while let Some((frame, _)) = lanes.next().await {
            written.push(frame);
        }
        let written: Vec<&[u8]> = written.iter().map(Vec::as_slice).collect();
        assert_eq!(written, [&b"u1"[..], b"u2", b"b1", b"b2", b"b3", b"s1", b"s2"]);
    }

    /// Each open channel gets an equal share of the node's budget, two fragments at least; a
    /// bulk frame goes out while it fits its channel's share, and always onto an empty channel.
    #[test]
    fn the_budget_in_flight_is_shared_by_the_open_channels() {
        let fragment = lockstep_node::wire::FRAGMENT_BYTES;
        let in_flight = InFlight::new(1536 * 1024);
        assert_eq!(in_flight.share(), 1536 * 1024, "no channel yet: one's share");
        let counted: Vec<Counted> = (0..3).map(|_| Counted::new(in_flight.clone())).collect();
        assert_eq!(in_flight.share(), 512 * 1024);
        assert!(in_flight.admits(512 * 1024 - fragment, fragment));
        assert!(!in_flight.admits(512 * 1024 - fragment + 1, fragment));
        assert!(in_flight.admits(0, 4 * 1024 * 1024), "a frame larger than the share onto an empty channel");
        let more: Vec<Counted> = (0..61).map(|_| Counted::new(in_flight.clone())).collect();
        assert_eq!(in_flight.share(), 2 * fragment, "64 channels: two fragments each, not 24 KiB");
        drop(more);
        drop(counted);
        assert_eq!(in_flight.share(), 1536 * 1024, "closed channels give their share back");
    }

    /// A held bulk frame lets urgent frames pass and keeps the bulk lane's order.
    #[tokio::test]
    async fn a_held_bulk_frame_lets_urgent_frames_pass_not_bulk_ones() {
        let (writer, mut lanes) = lanes();
        writer.send(b"b2".to_vec(), Lane::Bulk);
        writer.send(b"u1".to_vec(), Lane::Urgent);
        let wait = Duration::from_millis(5);
        assert_eq!(lanes.next_passing(true, wait).await.map(|(f, _)| f), Some(b"u1".to_vec()));
        assert_eq!(lanes.next_passing(true, wait).await, None, "b2 waits behind the held bulk frame");
        assert_eq!(lanes.next_passing(false, wait).await.map(|(f, _)| f), Some(b"b2".to_vec()));
    }
}
