//! WebRTC plumbing for one peer: the peer connection with the mesh's settings, its event
//! handler, and the reader and writer tasks of its data channel.

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

/// A channel's writer: two queues of frames, the urgent one drained first. Urgent frames are
/// whole small messages (the agreement's, the link's): they go out between the fragments of a
/// large contribution, which the far side reassembles regardless (fragments carry their
/// message's id). Within each queue the order is kept.
#[derive(Clone, Debug)]
pub struct Writer {
    urgent: mpsc::UnboundedSender<Vec<u8>>,
    bulk: mpsc::UnboundedSender<Vec<u8>>,
}

impl Writer {
    pub fn send(&self, frame: Vec<u8>, urgent: bool) {
        let _ = if urgent { self.urgent.send(frame) } else { self.bulk.send(frame) };
    }
}

/// One task per channel writes its frames, urgent ones first; `send` waits while the channel's
/// buffer is full, so a slow peer only slows its own queues.
pub fn spawn_writer(channel: Arc<dyn DataChannel>) -> Writer {
    let (urgent, mut urgent_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let (bulk, mut bulk_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        loop {
            let frame = tokio::select! {
                biased;
                Some(frame) = urgent_rx.recv() => frame,
                Some(frame) = bulk_rx.recv() => frame,
                else => break,
            };
            if channel.send(BytesMut::from(&frame[..])).await.is_err() {
                break;
            }
        }
    });
    Writer { urgent, bulk }
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
