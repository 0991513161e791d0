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
//! - the session loop: feeds the session inputs (channel open/closed, messages, ticks every
//!   50 ms, compute results, commands) and executes its outputs through a [`Replica`].
//!
//! - link messages (`lockstep_node::wire` -9 … -11): each node tells its peers which backend
//!   computes on it (and the gate's verdict), pings every open channel once a second, and
//!   reports round-trip time and bytes in/out per peer;
//! - room administration relayed from the console: join requests in, approve/deny out;
//! - checkpoint saves (the replica's snapshot, written to a file off the event loop).
//!
//! **Architecture Invariant:** all training-protocol decisions are the session's; this crate
//! only moves bytes, runs compute, measures links and reports events. Link messages never
//! reach the session and never change a weight.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use lockstep_node::session::{Event, Input, Output, Session, SessionConfig};
use lockstep_node::wire::{self, Gradient, Message, PeerId, Reassembler, RunSettings};
use lockstep_signaling::protocol::{ClientMessage, GroupName, ServerMessage, SignalKind};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use webrtc::data_channel::{DataChannel, DataChannelEvent, RTCDataChannelInit};
use webrtc::peer_connection::{
    PeerConnection, PeerConnectionBuilder, PeerConnectionEventHandler, RTCConfigurationBuilder, RTCIceGatheringState,
    RTCIceServer, RTCPeerConnectionState, RTCSessionDescription, SettingEngineBuilder,
};

pub mod bench;
pub mod sockets;

/// Bytes a channel may buffer before `send` waits (flow control).
pub const SEND_BUFFER_BYTES: usize = 4 * 1024 * 1024;
/// The SCTP receive buffer each end advertises (the crate's default is about 1 MiB, which
/// caps a loopback channel's throughput).
pub const SCTP_RECEIVE_BUFFER_BYTES: u32 = 8 * 1024 * 1024;

/// SCTP packet budget on loopback: below DTLS's 16 KiB record limit.
pub const LOOPBACK_SCTP_MTU: u32 = 16_000;
/// Receive buffer per datagram on loopback.
pub const LOOPBACK_RECEIVE_MTU: usize = 17_000;

/// The mesh's connection settings: mDNS off, loopback candidates and 16 KB SCTP packets when
/// binding loopback, a bounded send buffer (`send` waits: flow control), a larger SCTP receive window, and a
/// dedicated reactor thread for the connections' drivers.
pub fn channel_settings<A: std::net::ToSocketAddrs>(
    builder: PeerConnectionBuilder<A>,
    loopback: bool,
) -> PeerConnectionBuilder<A> {
    let mut settings = SettingEngineBuilder::new()
        .with_multicast_dns_mode(rtc::ice::mdns::MulticastDnsMode::Disabled)
        .with_include_loopback_candidate(loopback)
        .with_sctp_max_receive_buffer_size(SCTP_RECEIVE_BUFFER_BYTES);
    if loopback {
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
/// The mesh's WebRTC runtime: tokio, with large UDP socket buffers ([`sockets`]).
pub fn mesh_runtime() -> anyhow::Result<Arc<dyn webrtc::runtime::Runtime>> {
    let runtime = webrtc::runtime::default_runtime().context("no async runtime for WebRTC")?;
    Ok(Arc::new(sockets::BufferedRuntime::new(runtime)))
}

/// How often the session gets a tick.
pub const TICK: Duration = Duration::from_millis(50);

/// The replica's state and compute, owned by the adapter; the session only decides.
pub trait Replica: Send + 'static {
    /// A fresh model and optimizer for `settings`; returns the parameter count.
    fn configure(&mut self, settings: &RunSettings) -> Result<usize, String>;
    /// Our gradient for `step` at the current weights (weight hash before, probe hash of the
    /// live kernel, loss). May take long: runs on a blocking thread.
    fn compute(&mut self, step: u32) -> Result<Gradient, String>;
    /// One optimizer update. The new weights' hash is the next `compute`'s `whash` (or
    /// `weight_hash` when no step follows), so each update is hashed once and a replica may
    /// hash while the next step computes.
    fn apply(&mut self, gradient: &[f32]);
    /// A checkpoint of everything that determines the next update (empty before a run).
    fn snapshot(&self) -> Vec<u8>;
    /// Steps the current weights are the result of (the snapshot's step).
    fn steps_done(&self) -> u32;
    /// Restore a checkpoint; returns (steps done, parameter count).
    fn restore(&mut self, bytes: &[u8]) -> Result<(u32, usize), String>;
    /// The current weights' hash (waiting for it if it is being computed).
    fn weight_hash(&mut self) -> u32;
    /// Seconds spent hashing (weight hash, probe) since the last call, for the step-time
    /// breakdown.
    fn take_hash_seconds(&mut self) -> f64 {
        0.0
    }
    /// Fault injection for tests: flip the lowest bit of one weight.
    fn flip_weight_bit(&mut self);
    /// This node's id in the group, known once the signaling server has welcomed it.
    fn set_identity(&mut self, _peer: PeerId) {}
    /// A backend swap that took effect since the last call (at a step boundary, before the
    /// step's compute), if any.
    fn take_backend_change(&mut self) -> Option<BackendChange> {
        None
    }
}

/// A hot-swap that took effect.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendChange {
    pub backend: String,
    pub verdict: String,
    /// The first step computed by the new backend.
    pub step: u32,
}

/// How a hot-swap is going (the gate runs in the composition root; these are its reports).
#[derive(Clone, Debug, PartialEq)]
pub enum SwapProgress {
    /// The gate is running on the candidate.
    Gating { backend: String, done: usize, total: usize },
    /// Admitted; it takes over at the next step boundary.
    Staged { backend: String, verdict: String },
    /// Refused (or failed to load): the old backend stays.
    Refused { backend: String, why: String },
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
    /// What computes here, told to every peer: the backend's name and its gate verdict.
    pub backend: String,
    pub verdict: String,
}

/// Where a checkpoint is written.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckpointTarget {
    File(PathBuf),
    /// `node<ID>-step<STEP>.ckpt` in this directory, named after the step actually saved.
    InDir(PathBuf),
}

/// What a user (console, stdin) asks of the node.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Start(RunSettings),
    PushCheckpoint(Vec<u8>),
    /// For fault-injection tests: stop sending anything to this peer (the channel stays open).
    CutLinkTo(PeerId),
    /// For fault-injection tests: flip one bit of this replica's weights.
    FlipWeightBit,
    /// Room host: admit a waiting joiner.
    Approve(PeerId),
    /// Room host: turn a waiting joiner away.
    Deny {
        peer: PeerId,
        reason: String,
    },
    /// Write the replica's checkpoint (everything that determines the next update) to a file.
    SaveCheckpoint(CheckpointTarget),
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
        verdict: String,
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
}

impl Report {
    /// One JSON object, as `lockstep node --headless` prints it.
    pub fn to_json(&self) -> Value {
        let hex = |v: u32| format!("{v:#010x}");
        match self {
            Report::Connected { id, members, group, host } => {
                json!({"event": "connected", "id": id, "members": members, "group": group, "host": host})
            }
            Report::Waiting { id, room } => json!({"event": "waiting", "id": id, "room": room}),
            Report::JoinRequest { peer, address } => {
                json!({"event": "join-request", "peer": peer, "address": address})
            }
            Report::HostChanged(host) => json!({"event": "host-changed", "host": host}),
            Report::Denied(reason) => json!({"event": "denied", "reason": reason}),
            Report::SignalPeerLeft(peer) => json!({"event": "signal-peer-left", "peer": peer}),
            Report::PeerInfo { peer, backend, verdict } => {
                json!({"event": "peer-info", "peer": peer, "backend": backend, "verdict": verdict})
            }
            Report::Link { peer, rtt_ms, bytes_in, bytes_out } => {
                json!({"event": "link", "peer": peer, "rtt_ms": rtt_ms, "bytes_in": bytes_in, "bytes_out": bytes_out})
            }
            Report::Swap(SwapProgress::Gating { backend, done, total }) => {
                json!({"event": "swap-gating", "backend": backend, "done": done, "total": total})
            }
            Report::Swap(SwapProgress::Staged { backend, verdict }) => {
                json!({"event": "swap-staged", "backend": backend, "verdict": verdict})
            }
            Report::Swap(SwapProgress::Refused { backend, why }) => {
                json!({"event": "swap-refused", "backend": backend, "why": why})
            }
            Report::BackendSwapped(change) => json!({"event": "swapped", "backend": change.backend,
                "verdict": change.verdict, "step": change.step}),
            Report::CheckpointSaved { path, step, whash } => json!({"event": "checkpoint-saved",
                "path": path.display().to_string(), "step": step, "whash": hex(*whash)}),
            Report::ChannelOpen(peer) => json!({"event": "channel-open", "peer": peer}),
            Report::Applied { step, whash, timing } => json!({"event": "weights", "step": step, "whash": hex(*whash),
                "compute_ms": timing.compute * 1e3, "hash_guard_ms": timing.hash_guard * 1e3,
                "exchange_ms": timing.exchange * 1e3}),
            Report::Restored { step, whash } => json!({"event": "restored", "step": step, "whash": hex(*whash)}),
            Report::Warning(message) => json!({"event": "warning", "message": message}),
            Report::Session(event) => match event {
                Event::PeerJoined(p) => json!({"event": "peer-joined", "peer": p}),
                Event::PeerLeft(p) => json!({"event": "peer-left", "peer": p}),
                Event::Leader(p) => json!({"event": "leader", "peer": p}),
                Event::RunStarted { leader, settings } => json!({"event": "run-started", "leader": leader,
                    "width": settings.width, "context": settings.context, "batch": settings.batch,
                    "layers": settings.layers, "heads": settings.heads, "steps": settings.steps,
                    "lr": settings.lr, "seed": settings.seed}),
                Event::Roster { step, peers } => json!({"event": "roster", "step": step, "peers": peers}),
                Event::StepApplied { step, loss, peers, whash } => {
                    json!({"event": "step", "step": step, "loss": loss, "peers": peers, "whash_before": hex(*whash)})
                }
                Event::RepairRequested { step, peer } => {
                    json!({"event": "repair-requested", "step": step, "peer": peer})
                }
                Event::Repaired { step, peer } => json!({"event": "repaired", "step": step, "peer": peer}),
                Event::RepairServed { step, peer, to } => {
                    json!({"event": "repair-served", "step": step, "peer": peer, "to": to})
                }
                Event::Resumed { step } => json!({"event": "resumed", "step": step}),
                Event::CheckpointRestored { from, step } => {
                    json!({"event": "checkpoint-restored", "from": from, "step": step})
                }
                Event::GuardStopped(f) => json!({"event": "guard-stopped", "step": f.step,
                    "weight_mismatch": f.weight_mismatch, "probe_mismatch": f.probe_mismatch,
                    "message": f.to_string()}),
                Event::RunFinished { step } => json!({"event": "run-finished", "step": step}),
                Event::Ignored { from, why } => json!({"event": "ignored", "from": from, "why": why}),
                Event::Error(message) => json!({"event": "error", "message": message}),
            },
        }
    }
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
}

/// What the adapter's tasks tell the session loop.
enum Inbound {
    /// A message from the signaling server, or why its frame was not one.
    Signal(Result<ServerMessage, String>),
    SignalClosed(String),
    ChannelOpen(PeerId, Arc<dyn DataChannel>),
    Frame(PeerId, BytesMut),
    ChannelClosed(PeerId),
    /// A compute task's answer: its gradient, seconds computing and hashing, a backend swap
    /// that took effect at its start, and the state (see `state`) it was asked in.
    Computed {
        result: Result<Gradient, String>,
        seconds: f64,
        hash: f64,
        change: Option<BackendChange>,
        state: u64,
    },
    Saved(Result<(PathBuf, u32, u32), String>),
}

/// What goes out on the data channels: per-peer counters, the fault-injection cuts, and the
/// message ids for fragmentation.
#[derive(Default)]
struct Links {
    stats: BTreeMap<PeerId, LinkStats>,
    /// Peers nothing is sent to (fault injection; the channel stays open).
    cut: Vec<PeerId>,
    next_message_id: u32,
}

impl Links {
    /// Encodes, fragments and queues `message` for `to` (if its channel is open and not cut).
    fn send(&mut self, peers: &BTreeMap<PeerId, Peer>, to: PeerId, message: &Message) {
        let Some(writer) = peers.get(&to).and_then(|p| p.writer.as_ref()) else { return };
        if self.cut.contains(&to) {
            return;
        }
        self.next_message_id = self.next_message_id.wrapping_add(1);
        let link = self.stats.entry(to).or_default();
        for frame in wire::frames(wire::encode(message), self.next_message_id) {
            link.bytes_out += frame.len() as u64;
            let _ = writer.send(frame);
        }
    }

    /// `message` to every peer whose channel is open.
    fn broadcast(&mut self, peers: &BTreeMap<PeerId, Peer>, message: &Message) {
        for peer in open_peers(peers) {
            self.send(peers, peer, message);
        }
    }
}

/// Peers whose data channel is open.
fn open_peers(peers: &BTreeMap<PeerId, Peer>) -> Vec<PeerId> {
    peers.iter().filter(|(_, p)| p.writer.is_some()).map(|(&id, _)| id).collect()
}

/// Counters of one peer's link.
#[derive(Default)]
struct LinkStats {
    bytes_in: u64,
    bytes_out: u64,
    rtt_ms: Option<f64>,
    /// The outstanding ping: its nonce and when it left.
    ping: Option<(u64, Instant)>,
}

impl LinkStats {
    /// The answer to our outstanding ping: the round trip is measured.
    fn pong(&mut self, nonce: u64) {
        if let Some((sent, at)) = self.ping {
            if sent == nonce {
                self.rtt_ms = Some(at.elapsed().as_secs_f64() * 1e3);
                self.ping = None;
            }
        }
    }
}

struct Peer {
    connection: Arc<dyn PeerConnection>,
    /// Set once the channel is open (the session then knows the peer).
    writer: Option<mpsc::UnboundedSender<Vec<u8>>>,
}

/// Runs one node until `Quit` or the signaling connection ends.
pub async fn run(
    config: MeshConfig,
    replica: Arc<Mutex<dyn Replica>>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    report: impl Fn(Report) + Send + 'static,
) -> anyhow::Result<()> {
    let (ws, _) = tokio_tungstenite::connect_async(&config.signal_url)
        .await
        .with_context(|| format!("connecting to the signaling server at {}", config.signal_url))?;
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (inbound_tx, mut inbound) = mpsc::unbounded_channel::<Inbound>();
    let (ws_out_tx, mut ws_out) = mpsc::unbounded_channel::<ClientMessage>();
    {
        let inbound_tx = inbound_tx.clone();
        tokio::spawn(async move {
            while let Some(frame) = ws_rx.next().await {
                match frame {
                    Ok(WsMessage::Text(text)) => {
                        let message = serde_json::from_str::<ServerMessage>(text.as_str())
                            .map_err(|e| format!("an unreadable message from the signaling server ({e}): {text}"));
                        let _ = inbound_tx.send(Inbound::Signal(message));
                    }
                    Ok(WsMessage::Close(_)) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            let _ = inbound_tx.send(Inbound::SignalClosed("the signaling connection closed".into()));
        });
        tokio::spawn(async move {
            while let Some(message) = ws_out.recv().await {
                let Ok(text) = serde_json::to_string(&message) else { continue };
                if ws_tx.send(WsMessage::text(text)).await.is_err() {
                    break;
                }
            }
        });
    }

    let mut me: Option<PeerId> = None;
    let mut session: Option<Session> = None;
    let mut peers: BTreeMap<PeerId, Peer> = BTreeMap::new();
    let mut reassembler = Reassembler::default();
    let mut timing = StepTiming::default();
    let mut computed_at: Option<Instant> = None;
    // An applied step whose `weights` report waits for its hash: the next step's gradient
    // carries it, or `flush` asks the replica when no step is computing.
    let mut unreported: Option<(u32, StepTiming)> = None;
    // Compute tasks under way, and how many times the replica's state was replaced (a restore
    // or a new run): a gradient begun before that belongs to the old state and is dropped.
    let mut computing = 0usize;
    let mut state = 0u64;
    let flush = |unreported: &mut Option<(u32, StepTiming)>| {
        if let Some((step, timing)) = unreported.take() {
            let whash = replica.lock().unwrap_or_else(|p| p.into_inner()).weight_hash();
            report(Report::Applied { step, whash, timing });
        }
    };
    let mut links = Links::default();
    // What computes here, as every peer is told (when its channel opens, and after a swap).
    let mut hello = Message::PeerInfo { backend: config.backend.clone(), verdict: config.verdict.clone() };
    let mut ticks: u64 = 0;
    let started = Instant::now();
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        let mut inputs: Vec<Input> = Vec::new();
        tokio::select! {
            _ = ticker.tick() => {
                inputs.push(Input::Tick { now_ms: started.elapsed().as_millis() as u64 });
                ticks += 1;
                // A swap made between runs shows up here (never blocks on a computing replica).
                let change = replica.try_lock().ok().and_then(|mut r| r.take_backend_change());
                if let Some(change) = change {
                    announce(change, &mut hello, &peers, &mut links, &report);
                }
                if ticks.is_multiple_of(20) {
                    for peer in open_peers(&peers) {
                        let link = links.stats.entry(peer).or_default();
                        report(Report::Link { peer, rtt_ms: link.rtt_ms, bytes_in: link.bytes_in, bytes_out: link.bytes_out });
                        link.ping = Some((ticks, Instant::now()));
                        links.send(&peers, peer, &Message::Ping { nonce: ticks });
                    }
                }
            }
            command = commands.recv() => match command {
                None | Some(Command::Quit) => {
                    flush(&mut unreported);
                    break;
                }
                Some(Command::Start(settings)) => inputs.push(Input::Start(settings)),
                Some(Command::PushCheckpoint(bytes)) => inputs.push(Input::PushCheckpoint { bytes }),
                Some(Command::CutLinkTo(peer)) => links.cut.push(peer),
                Some(Command::Approve(peer)) => {
                    let _ = ws_out_tx.send(ClientMessage::Approve { peer });
                }
                Some(Command::Deny { peer, reason }) => {
                    let _ = ws_out_tx.send(ClientMessage::Deny { peer, reason: Some(reason) });
                }
                Some(Command::SaveCheckpoint(target)) => {
                    let me = me.unwrap_or(0);
                    let replica = replica.clone();
                    let tx = inbound_tx.clone();
                    tokio::task::spawn_blocking(move || {
                        let (bytes, step, whash) = {
                            let mut replica = replica.lock().unwrap_or_else(|p| p.into_inner());
                            (replica.snapshot(), replica.steps_done(), replica.weight_hash())
                        };
                        let _ = tx.send(Inbound::Saved(save_checkpoint(target, me, &bytes, step, whash)));
                    });
                }
                Some(Command::FlipWeightBit) => {
                    flush(&mut unreported);
                    replica.lock().unwrap_or_else(|p| p.into_inner()).flip_weight_bit();
                    let step = session.as_ref().map_or(0, |s| s.applied());
                    report(Report::Warning(format!("fault injection: flipped one weight bit after step {step}")));
                }
            },
            event = inbound.recv() => match event {
                None => break,
                Some(Inbound::Signal(Err(why))) => report(Report::Warning(why)),
                Some(Inbound::Signal(Ok(message))) => {
                    if let ServerMessage::Welcome { id, .. } = &message {
                        replica.lock().unwrap_or_else(|p| p.into_inner()).set_identity(*id);
                    }
                    let denied = matches!(message, ServerMessage::Denied { .. });
                    handle_signal(&config, message, &mut me, &mut session, &mut peers, &inbound_tx, &ws_out_tx, &report).await;
                    if denied {
                        break;
                    }
                }
                Some(Inbound::SignalClosed(why)) => {
                    report(Report::Warning(why));
                    break;
                }
                Some(Inbound::ChannelOpen(peer, channel)) => {
                    if let Some(entry) = peers.get_mut(&peer) {
                        if entry.writer.is_none() {
                            entry.writer = Some(spawn_writer(channel));
                            report(Report::ChannelOpen(peer));
                            links.send(&peers, peer, &hello);
                            inputs.push(Input::Connected(peer));
                        }
                    }
                }
                Some(Inbound::Frame(peer, bytes)) => {
                    links.stats.entry(peer).or_default().bytes_in += bytes.len() as u64;
                    match reassembler.push(peer, &bytes) {
                        Ok(Some(Message::Ping { nonce })) => links.send(&peers, peer, &Message::Pong { nonce }),
                        Ok(Some(Message::Pong { nonce })) => links.stats.entry(peer).or_default().pong(nonce),
                        Ok(Some(Message::PeerInfo { backend, verdict })) => {
                            report(Report::PeerInfo { peer, backend, verdict })
                        }
                        Ok(Some(message)) => inputs.push(Input::Received { from: peer, message }),
                        Ok(None) => {}
                        Err(e) => report(Report::Warning(format!("peer {peer} sent a malformed frame: {e}"))),
                    }
                }
                Some(Inbound::ChannelClosed(peer)) => {
                    if let Some(entry) = peers.remove(&peer) {
                        let _ = entry.connection.close().await;
                        reassembler.forget(peer);
                        links.stats.remove(&peer);
                        if entry.writer.is_some() {
                            inputs.push(Input::Disconnected(peer));
                        }
                    }
                }
                Some(Inbound::Saved(result)) => match result {
                    Ok((path, step, whash)) => report(Report::CheckpointSaved { path, step, whash }),
                    Err(why) => report(Report::Warning(format!("checkpoint not saved: {why}"))),
                },
                Some(Inbound::Computed { result, seconds, hash, change, state: asked_in }) => {
                    computing -= 1;
                    if let Some(change) = change {
                        announce(change, &mut hello, &peers, &mut links, &report);
                    }
                    match result {
                        // Begun before a restore (or new run): it answers a state that is gone.
                        _ if asked_in != state => report(Report::Warning(
                            "a gradient begun before the restore was dropped (it belongs to the replaced weights)".into(),
                        )),
                        Ok(gradient) => {
                            if let Some((step, timing)) = unreported.take() {
                                report(Report::Applied { step, whash: gradient.whash, timing });
                            }
                            timing = StepTiming { compute: seconds - hash, hash_guard: hash, exchange: 0.0 };
                            computed_at = Some(Instant::now());
                            inputs.push(Input::Computed(gradient));
                        }
                        Err(why) => {
                            report(Report::Warning(format!("compute failed, this node stops contributing: {why}")))
                        }
                    }
                }
            },
        }
        let Some(session) = session.as_mut() else { continue };
        let mut queue: std::collections::VecDeque<Input> = inputs.into();
        while let Some(input) = queue.pop_front() {
            let handling = Instant::now();
            let outputs = session.handle(input);
            // The input that completes a step carries the guard and the roster-order average.
            let handled = handling.elapsed().as_secs_f64();
            for output in outputs {
                match output {
                    Output::Send { to, message } => links.send(&peers, to, &message),
                    Output::Configure(settings) => {
                        state += 1;
                        let result = replica.lock().unwrap_or_else(|p| p.into_inner()).configure(&settings);
                        queue.push_front(match result {
                            Ok(weights) => Input::Configured { weights },
                            Err(why) => Input::Failed { why },
                        });
                    }
                    Output::Compute { step } => {
                        computing += 1;
                        let replica = replica.clone();
                        let tx = inbound_tx.clone();
                        let asked_in = state;
                        tokio::task::spawn_blocking(move || {
                            let began = Instant::now();
                            let mut replica = replica.lock().unwrap_or_else(|p| p.into_inner());
                            let result = replica.compute(step);
                            let hash = replica.take_hash_seconds();
                            let change = replica.take_backend_change();
                            let seconds = began.elapsed().as_secs_f64();
                            let _ = tx.send(Inbound::Computed { result, seconds, hash, change, state: asked_in });
                        });
                    }
                    Output::Apply { step, gradient, .. } => {
                        flush(&mut unreported);
                        let waited = computed_at.take().map_or(0.0, |t| t.elapsed().as_secs_f64());
                        let mut replica = replica.lock().unwrap_or_else(|p| p.into_inner());
                        replica.apply(&gradient);
                        let mut step_timing = timing;
                        step_timing.hash_guard += replica.take_hash_seconds() + handled;
                        step_timing.exchange = waited;
                        unreported = Some((step, step_timing));
                    }
                    Output::SendSnapshot { to } => {
                        let bytes = replica.lock().unwrap_or_else(|p| p.into_inner()).snapshot();
                        links.send(&peers, to, &Message::Resume(bytes));
                    }
                    Output::Restore { bytes } => {
                        flush(&mut unreported);
                        state += 1;
                        let mut replica = replica.lock().unwrap_or_else(|p| p.into_inner());
                        queue.push_front(match replica.restore(&bytes) {
                            Ok((step, weights)) => {
                                report(Report::Restored { step, whash: replica.weight_hash() });
                                Input::Restored { step, weights }
                            }
                            Err(why) => Input::Failed { why },
                        });
                    }
                    Output::Event(event) => {
                        // The last step's `weights` come before the run's end.
                        if matches!(event, Event::RunFinished { .. } | Event::GuardStopped(_) | Event::Error(_)) {
                            flush(&mut unreported);
                        }
                        report(Report::Session(event));
                    }
                }
            }
        }
        if computing == 0 {
            flush(&mut unreported);
        }
    }
    for (_, peer) in peers {
        let _ = peer.connection.close().await;
    }
    Ok(())
}

/// Our backend changed: tell every open peer and report it.
fn announce(
    change: BackendChange,
    hello: &mut Message,
    peers: &BTreeMap<PeerId, Peer>,
    links: &mut Links,
    report: &impl Fn(Report),
) {
    *hello = Message::PeerInfo { backend: change.backend.clone(), verdict: change.verdict.clone() };
    links.broadcast(peers, hello);
    report(Report::BackendSwapped(change));
}

/// Writes a snapshot of `step` to its file (through a temporary file, so a crash never leaves
/// half a checkpoint under the real name); returns (path, step, weight hash).
fn save_checkpoint(
    target: CheckpointTarget,
    me: PeerId,
    bytes: &[u8],
    step: u32,
    whash: u32,
) -> Result<(PathBuf, u32, u32), String> {
    if bytes.is_empty() {
        return Err("no run is configured yet".into());
    }
    let path = match target {
        CheckpointTarget::File(path) => path,
        CheckpointTarget::InDir(dir) => dir.join(format!("node{me}-step{step:06}.ckpt")),
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let partial = path.with_extension("partial");
    std::fs::write(&partial, bytes).map_err(|e| format!("writing {}: {e}", partial.display()))?;
    std::fs::rename(&partial, &path).map_err(|e| format!("renaming to {}: {e}", path.display()))?;
    Ok((path, step, whash))
}

/// One task per channel writes its frames in order; `send` waits while the channel's buffer
/// is full, so a slow peer only slows its own queue.
fn spawn_writer(channel: Arc<dyn DataChannel>) -> mpsc::UnboundedSender<Vec<u8>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if channel.send(BytesMut::from(&frame[..])).await.is_err() {
                break;
            }
        }
    });
    tx
}

#[allow(clippy::too_many_arguments)] // the loop's state, passed by reference
async fn handle_signal(
    config: &MeshConfig,
    message: ServerMessage,
    me: &mut Option<PeerId>,
    session: &mut Option<Session>,
    peers: &mut BTreeMap<PeerId, Peer>,
    inbound: &mpsc::UnboundedSender<Inbound>,
    ws_out: &mpsc::UnboundedSender<ClientMessage>,
    report: &impl Fn(Report),
) {
    match message {
        ServerMessage::Welcome { id, group, host, members, .. } => {
            *me = Some(id);
            *session = Some(Session::new(SessionConfig {
                me: id,
                expected_phash: config.expected_phash,
                repair_after_ms: config.repair_after_ms,
            }));
            let group = match group {
                GroupName::Room(name) => format!("room {name}"),
                GroupName::Ip(address) => format!("address {address}"),
            };
            report(Report::Connected { id, members: members.clone(), group, host });
            for peer in members.into_iter().filter(|p| *p != id) {
                if id < peer {
                    offer_to(config, peer, peers, inbound, ws_out, report).await;
                }
            }
        }
        ServerMessage::PeerJoined { peer } => {
            let Some(id) = *me else { return };
            if id < peer && !peers.contains_key(&peer) {
                offer_to(config, peer, peers, inbound, ws_out, report).await;
            }
        }
        ServerMessage::PeerLeft { peer } => {
            // The same path as a channel that closes on its own.
            report(Report::SignalPeerLeft(peer));
            let _ = inbound.send(Inbound::ChannelClosed(peer));
        }
        ServerMessage::Waiting { id, room } => report(Report::Waiting { id, room }),
        ServerMessage::JoinRequest { peer, address } => report(Report::JoinRequest { peer, address }),
        ServerMessage::HostChanged { host } => report(Report::HostChanged(host)),
        ServerMessage::Signal { from, kind, data } => {
            let Ok(description) = serde_json::from_value::<RTCSessionDescription>(data) else {
                report(Report::Warning(format!("peer {from} sent an unreadable session description")));
                return;
            };
            match kind {
                SignalKind::Offer => {
                    if let Err(e) = answer_to(config, from, description, peers, inbound, ws_out).await {
                        report(Report::Warning(format!("cannot answer peer {from}: {e:#}")));
                    }
                }
                SignalKind::Answer => {
                    if let Some(entry) = peers.get(&from) {
                        if let Err(e) = entry.connection.set_remote_description(description).await {
                            report(Report::Warning(format!("peer {from}'s answer was refused: {e}")));
                        }
                    }
                }
                // Candidates travel inside the descriptions (gathering completes first).
                SignalKind::Ice => {}
            }
        }
        ServerMessage::Error { message, .. } => report(Report::Warning(format!("signaling server: {message}"))),
        ServerMessage::Denied { reason } => report(Report::Denied(reason)),
        ServerMessage::Pong => {}
    }
}

struct Handler {
    peer: PeerId,
    gathered: mpsc::UnboundedSender<()>,
    inbound: mpsc::UnboundedSender<Inbound>,
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
            let _ = self.inbound.send(Inbound::ChannelClosed(self.peer));
        }
    }

    async fn on_data_channel(&self, channel: Arc<dyn DataChannel>) {
        // Answerer side: the offerer created the channel.
        spawn_reader(self.peer, channel, self.inbound.clone());
    }
}

/// Reads a channel's events until it closes.
fn spawn_reader(peer: PeerId, channel: Arc<dyn DataChannel>, inbound: mpsc::UnboundedSender<Inbound>) {
    tokio::spawn(async move {
        let mut announced = false;
        while let Some(event) = channel.poll().await {
            match event {
                DataChannelEvent::OnOpen if !announced => {
                    announced = true;
                    let _ = inbound.send(Inbound::ChannelOpen(peer, channel.clone()));
                }
                DataChannelEvent::OnMessage(message) => {
                    let _ = inbound.send(Inbound::Frame(peer, message.data));
                }
                DataChannelEvent::OnClose => break,
                _ => {}
            }
        }
        let _ = inbound.send(Inbound::ChannelClosed(peer));
    });
}

async fn new_connection(
    config: &MeshConfig,
    peer: PeerId,
    inbound: &mpsc::UnboundedSender<Inbound>,
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
    let runtime = mesh_runtime()?;
    let builder = PeerConnectionBuilder::new()
        .with_configuration(RTCConfigurationBuilder::new().with_ice_servers(ice_servers).build())
        .with_handler(Arc::new(Handler { peer, gathered: gathered_tx, inbound: inbound.clone() }))
        .with_runtime(runtime)
        .with_udp_addrs(vec![format!("{}:0", config.bind_ip)]);
    let connection =
        channel_settings(builder, config.bind_ip.is_loopback()).build().await.context("creating a peer connection")?;
    Ok((Arc::new(connection), gathered_rx))
}

async fn offer_to(
    config: &MeshConfig,
    peer: PeerId,
    peers: &mut BTreeMap<PeerId, Peer>,
    inbound: &mpsc::UnboundedSender<Inbound>,
    ws_out: &mpsc::UnboundedSender<ClientMessage>,
    report: &impl Fn(Report),
) {
    let result: anyhow::Result<()> = async {
        let (connection, mut gathered) = new_connection(config, peer, inbound).await?;
        let channel = connection
            .create_data_channel("lockstep", Some(RTCDataChannelInit { ordered: true, ..Default::default() }))
            .await
            .context("creating the data channel")?;
        spawn_reader(peer, channel, inbound.clone());
        let offer = connection.create_offer(None).await?;
        connection.set_local_description(offer).await?;
        send_description(connection, &mut gathered, peer, SignalKind::Offer, peers, ws_out).await
    }
    .await;
    if let Err(e) = result {
        report(Report::Warning(format!("cannot connect to peer {peer}: {e:#}")));
    }
}

async fn answer_to(
    config: &MeshConfig,
    peer: PeerId,
    offer: RTCSessionDescription,
    peers: &mut BTreeMap<PeerId, Peer>,
    inbound: &mpsc::UnboundedSender<Inbound>,
    ws_out: &mpsc::UnboundedSender<ClientMessage>,
) -> anyhow::Result<()> {
    let (connection, mut gathered) = new_connection(config, peer, inbound).await?;
    connection.set_remote_description(offer).await?;
    let answer = connection.create_answer(None).await?;
    connection.set_local_description(answer).await?;
    send_description(connection, &mut gathered, peer, SignalKind::Answer, peers, ws_out).await
}

/// Waits for ICE gathering (no trickle), relays the local description as `kind` through the
/// signaling server, and keeps the connection.
async fn send_description(
    connection: Arc<dyn PeerConnection>,
    gathered: &mut mpsc::UnboundedReceiver<()>,
    peer: PeerId,
    kind: SignalKind,
    peers: &mut BTreeMap<PeerId, Peer>,
    ws_out: &mpsc::UnboundedSender<ClientMessage>,
) -> anyhow::Result<()> {
    if tokio::time::timeout(Duration::from_secs(10), gathered.recv()).await.is_err() {
        bail!("ICE gathering did not complete within 10 s");
    }
    let description = connection.local_description().await.context("no local description")?;
    let data = serde_json::to_value(description).context("encoding the session description")?;
    ws_out.send(ClientMessage::Signal { to: peer, kind, data })?;
    peers.insert(peer, Peer { connection, writer: None });
    Ok(())
}
