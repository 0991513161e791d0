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
//! - the `/data` client (`data_client.rs`), which nodes and `lockstep train` sample from.
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

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use lockstep_node::config::RunConfig;
use lockstep_node::replica::{BackendChange, Replica};
use lockstep_node::session::{Event, StepDeadline};
use lockstep_node::verdict::Verdict;
use lockstep_node::wire::PeerId;
use lockstep_signaling::protocol::{ClientMessage, ServerMessage};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use webrtc::peer_connection::{PeerConnectionBuilder, SettingEngineBuilder};

pub mod bench;
mod checkpoint_file;
mod connections;
pub mod data_client;
mod event_loop;
pub mod sockets;

pub use checkpoint_file::{save_checkpoint, CheckpointTarget, SaveError, Saved};
pub use connections::CHANNEL_LABEL;
use event_loop::{Inbound, MeshLoop};
pub use sockets::LinkShim;

/// Bytes a channel may buffer before `send` waits (flow control).
pub const SEND_BUFFER_BYTES: usize = 4 * 1024 * 1024;
/// The SCTP receive buffer each end advertises (the crate's default is about 1 MiB, which
/// caps a loopback channel's throughput).
pub const SCTP_RECEIVE_BUFFER_BYTES: u32 = 8 * 1024 * 1024;

/// SCTP packet budget on loopback: below DTLS's 16 KiB record limit.
pub const LOOPBACK_SCTP_MTU: u32 = 16_000;
/// Receive buffer per datagram on loopback.
pub const LOOPBACK_RECEIVE_MTU: usize = 17_000;

/// What a Lockstep node tells the signaling server it is (`?agent=`), so its peers know they
/// may use large SCTP packets with it on loopback.
pub const AGENT: &str = "lockstep";

/// The mesh's connection settings: mDNS off, loopback candidates when binding loopback, 16 KB
/// SCTP packets there when the far side is a Lockstep node (`large_packets`), a bounded send
/// buffer (`send` waits: flow control), a larger SCTP receive window, and a dedicated reactor
/// thread for the connections' drivers.
pub fn channel_settings<A: std::net::ToSocketAddrs>(
    builder: PeerConnectionBuilder<A>,
    loopback: bool,
    large_packets: bool,
) -> PeerConnectionBuilder<A> {
    let mut settings = SettingEngineBuilder::new()
        .with_multicast_dns_mode(rtc::ice::mdns::MulticastDnsMode::Disabled)
        .with_include_loopback_candidate(loopback)
        .with_sctp_max_receive_buffer_size(SCTP_RECEIVE_BUFFER_BYTES);
    if loopback && large_packets {
        // Loopback carries 64 KiB datagrams: SCTP packets as large as a DTLS record allows
        // cut the per-packet work by an order of magnitude. Real networks keep the default
        // (1191 bytes, safe through TURN over IPv6).
        settings = settings.with_sctp_mtu(LOOPBACK_SCTP_MTU).with_receive_mtu(LOOPBACK_RECEIVE_MTU);
    }
    let settings = settings.build();
    builder
        .with_setting_engine(settings)
        .with_data_channel_send_buffer_limit(SEND_BUFFER_BYTES)
        .with_dedicated_reactor_pool_size(1)
}
/// The mesh's WebRTC runtime: tokio, with large UDP socket buffers and `shim` ([`sockets`]).
pub fn mesh_runtime(shim: LinkShim) -> anyhow::Result<Arc<dyn webrtc::runtime::Runtime>> {
    let runtime = webrtc::runtime::default_runtime().context("no async runtime for WebRTC")?;
    Ok(Arc::new(sockets::BufferedRuntime::shaped(runtime, shim)))
}

/// How often the session gets a tick.
pub const TICK: Duration = Duration::from_millis(50);

/// How a hot-swap is going (the gate runs in the composition root; these are its reports).
#[derive(Clone, Debug, PartialEq)]
pub enum SwapProgress {
    /// The gate is running on the candidate.
    Gating { backend: String, done: usize, total: usize },
    /// Admitted; it takes over at the next step boundary.
    Staged { backend: String, verdict: Verdict },
    /// Refused by the gate, or not loadable: the old backend stays.
    Refused { backend: String, verdict: Verdict },
}

/// How a node joins and talks.
#[derive(Clone, Debug)]
pub struct MeshConfig {
    /// `ws://HOST:PORT/ws`, with `?room=CODE` or not.
    pub signal_url: String,
    /// The address ICE binds and gathers host candidates on (127.0.0.1 in tests).
    pub bind_ip: IpAddr,
    /// `stun:` / `turn:` URLs; empty on a LAN or loopback.
    pub ice_servers: Vec<String>,
    pub turn_username: String,
    pub turn_credential: String,
    pub expected_phash: u32,
    pub repair_after_ms: u64,
    /// How long the leader waits for a roster member's gradient (`StepDeadline`).
    pub deadline: StepDeadline,
    /// What computes here, told to every peer: the backend's name and its gate verdict.
    pub backend: String,
    pub verdict: Verdict,
    /// Delay and loss added to every datagram this node sends (benchmarks and tests).
    pub link: LinkShim,
}

/// What a user (console, stdin) asks of the node.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Start(RunConfig),
    PushCheckpoint(Vec<u8>),
    /// For fault-injection tests: stop sending anything to this peer (the channel stays open).
    CutLinkTo(PeerId),
    /// For fault-injection tests: flip one bit of this replica's weights.
    FlipWeightBit,
    /// For fault-injection tests: from the next step on, send this value in place of every
    /// value of this node's contributions (with the honest hashes): a rogue member.
    PoisonContributions(f32),
    /// Room host: admit a waiting joiner.
    Approve(PeerId),
    /// Room host: turn a waiting joiner away.
    Deny {
        peer: PeerId,
        reason: String,
    },
    /// Write the replica's checkpoint (everything that determines the next update) to a file.
    SaveCheckpoint(CheckpointTarget),
    /// (Leader) take a member out of the run; it is told why and stays out.
    Kick {
        peer: PeerId,
        why: String,
    },
    Quit,
}

/// What the node reports: session events plus the adapter's own.
#[derive(Clone, Debug)]
pub enum Report {
    Connected {
        id: PeerId,
        members: Vec<PeerId>,
        /// `room CODE` or `address IP`.
        group: String,
        host: PeerId,
    },
    /// Our join request waits for the room host's approval.
    Waiting {
        id: PeerId,
        room: String,
    },
    /// (Room host) someone asks to join.
    JoinRequest {
        peer: PeerId,
        address: String,
    },
    HostChanged(PeerId),
    /// We were turned away (or the request timed out): the node stops.
    Denied(String),
    /// The signaling server says a member (or a waiting joiner) left.
    SignalPeerLeft(PeerId),
    /// What computes on a peer.
    PeerInfo {
        peer: PeerId,
        backend: String,
        verdict: Verdict,
    },
    /// One peer's link, once a second.
    Link {
        peer: PeerId,
        rtt_ms: Option<f64>,
        bytes_in: u64,
        bytes_out: u64,
    },
    Swap(SwapProgress),
    /// Our own backend changed at a step boundary.
    BackendSwapped(BackendChange),
    CheckpointSaved {
        path: PathBuf,
        step: u32,
        whash: u32,
    },
    ChannelOpen(PeerId),
    Session(Event),
    Applied {
        step: u32,
        whash: u32,
        timing: StepTiming,
    },
    /// A checkpoint (push or resume) replaced the state.
    Restored {
        step: u32,
        whash: u32,
    },
    Warning(String),
    /// The signaling server went away; training goes on over the data channels and the node
    /// tries to take its place back (every `retry_ms`).
    SignalLost {
        why: String,
        retry_ms: u64,
    },
    /// Back with the signaling server, in the same place: our group and its host.
    SignalRestored {
        group: String,
        host: PeerId,
    },
}

/// Where one step's time went on this node, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTiming {
    /// Forward and backward pass (our gradient), hashing excluded.
    pub compute: f64,
    /// Weight hash, probe hash, the guard, roster-order averaging and the update's hash.
    pub hash_guard: f64,
    /// From our gradient being ready to the step being applied: waiting for the others'
    /// gradients and the leader's commit.
    pub exchange: f64,
    /// Bytes this node sent over all its links since the step before was applied (its
    /// contribution to every member, rosters, repairs, pings: everything).
    pub sent_bytes: u64,
}

impl StepTiming {
    /// The share of the step's wall time spent computing (0–1).
    pub fn utilization(&self) -> f64 {
        let total = self.compute + self.hash_guard + self.exchange;
        if total > 0.0 {
            self.compute / total
        } else {
            0.0
        }
    }
}

/// Why a node's loop ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Ended {
    /// `Quit` (or the command channel closed): the user left.
    Quit,
    /// The room's host turned us away, or the request timed out.
    Denied(String),
    /// The signaling server refused or dropped us before we were welcomed (a full server or
    /// room, a bad room code, a wrong protocol version): there is no group to train with.
    Refused(String),
}

/// A new signaling connection: the sender for messages to the server (a writer task runs
/// already), and the reader, not yet started — it turns the server's frames into
/// `Inbound::Signal` and ends with `SignalClosed`. The caller starts it once the loop knows the
/// connection, so the connection's end can never reach the loop before the connection does.
pub(crate) struct SignalConnection {
    pub(crate) sender: mpsc::UnboundedSender<ClientMessage>,
    reader: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl SignalConnection {
    pub(crate) fn start_reading(self) -> mpsc::UnboundedSender<ClientMessage> {
        tokio::spawn(self.reader);
        self.sender
    }
}

/// The URL this node connects to the signaling server with: the configured one, saying what we
/// are (`agent`), and with the place to take back (`resume`, its token) when we have one.
pub(crate) fn signal_url(config: &MeshConfig, resume: Option<(PeerId, &str)>) -> String {
    let separator = if config.signal_url.contains('?') { '&' } else { '?' };
    let mut url = format!("{}{separator}agent={AGENT}", config.signal_url);
    if let Some((id, token)) = resume {
        url.push_str(&format!("&resume={id}&token={token}"));
    }
    url
}

/// Connects to the signaling server at `url`; see [`SignalConnection`].
pub(crate) async fn connect_signal(
    url: &str,
    inbound: mpsc::UnboundedSender<Inbound>,
) -> anyhow::Result<SignalConnection> {
    let (ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .with_context(|| format!("connecting to the signaling server at {url}"))?;
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (signal_tx, mut signal_out) = mpsc::unbounded_channel::<ClientMessage>();
    let reader = Box::pin(async move {
        while let Some(frame) = ws_rx.next().await {
            match frame {
                Ok(WsMessage::Text(text)) => {
                    let message = serde_json::from_str::<ServerMessage>(text.as_str())
                        .map_err(|e| format!("an unreadable message from the signaling server ({e}): {text}"));
                    let _ = inbound.send(Inbound::Signal(message));
                }
                Ok(WsMessage::Close(_)) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = inbound.send(Inbound::SignalClosed("the signaling connection closed".into()));
    });
    tokio::spawn(async move {
        while let Some(message) = signal_out.recv().await {
            let Ok(text) = serde_json::to_string(&message) else { continue };
            if ws_tx.send(WsMessage::text(text)).await.is_err() {
                break;
            }
        }
    });
    Ok(SignalConnection { sender: signal_tx, reader })
}

/// Runs one node until `Quit`, a refusal, or a denial. Once welcomed, a node outlives its
/// signaling server: it trains on over its data channels and takes its place back when the
/// server answers again (see `MeshLoop::on_signal_closed`).
pub async fn run(
    config: MeshConfig,
    replica: Arc<Mutex<dyn Replica>>,
    commands: mpsc::UnboundedReceiver<Command>,
    report: impl Fn(Report) + Send + 'static,
) -> anyhow::Result<Ended> {
    let (inbound_tx, inbound) = mpsc::unbounded_channel::<Inbound>();
    let signal_tx = connect_signal(&signal_url(&config, None), inbound_tx.clone()).await?.start_reading();
    Ok(MeshLoop::new(config, replica, report, inbound_tx, signal_tx).run(commands, inbound).await)
}
