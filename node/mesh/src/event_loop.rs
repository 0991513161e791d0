//! The mesh's event loop: one object, [`MeshLoop`], owns everything the adapter keeps between
//! events, and one small method handles each kind of event — a tick, a user command, a
//! signaling message, a frame, a channel opening or closing, a compute result, a saved
//! checkpoint. Every one of them ends the same way: inputs for the session go to
//! [`MeshLoop::drive`], which carries out what the session asks (`Output`s), in order.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lockstep_node::audit::{Trace, Traced, Tracing, Urgency};
use lockstep_node::replica::{AuditKit, BackendChange, KeptStates, Replica, ReplicaError};
use lockstep_node::session::{
    Event, Failure, Input, Output, PrivateInputs, Problem, Session, SessionConfig, Stop, Task,
};
use lockstep_node::wire::{Message, PeerId, Reassembler, TraceAnswer};
use lockstep_signaling::protocol::{ClientMessage, GroupName, ServerMessage, SignalKind};
use tokio::sync::mpsc;
use webrtc::data_channel::{DataChannel, RTCDataChannelInit};
use webrtc::peer_connection::RTCSessionDescription;

use crate::checkpoint_file::{save_checkpoint, CheckpointTarget};
use crate::config::{MeshConfig, AGENT, LINK_TICK};
use crate::connections::{
    gathered_description, new_connection, spawn_reader, spawn_writer, InFlight, Lane, CHANNEL_LABEL,
};
use crate::control::{Command, Ended, Report, StepTiming};
use crate::inbound::{Computed, Inbound, InboundRx, InboundTx};
use crate::signal_client::{connect_signal, signal_url};

mod links;
mod session;

use links::{Links, Peer, Referees};

/// Between attempts to reach a signaling server that went away: the first wait, and the
/// longest (each failure doubles it).
const RECONNECT_FIRST_MS: u64 = 1000;
const RECONNECT_MAX_MS: u64 = 8000;
/// How long one reconnection to the signaling server may take (the connection and the
/// WebSocket handshake; milliseconds on a working link). Every wait has a bound: an attempt
/// made while the server restarted once hung for good — its node never rejoined the room, and
/// a newcomer found nobody (a chaos episode).
const RECONNECT_ATTEMPT_MS: u64 = 5000;
/// A link that delivered nothing (not even a pong to our once-a-second ping) for this long is
/// reported silent.
const SILENT_MS: u64 = 5000;
/// A connection attempt whose channel has not opened after this long is given up (the peer
/// may have been asleep when it came; it is offered again).
const ATTEMPT_MS: u64 = 10_000;
/// How long a quitting node waits to be out of its run's configuration (a leader hands the
/// lead on first) before it closes its links anyway.
const LEAVING_GRACE_MS: u64 = 3_000;

/// The field of a session description (as relayed) that names the offer it belongs to.
const ATTEMPT_TAG: &str = "lockstep_attempt";

/// Whether the loop goes on after an event.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Flow {
    Continue,
    Stop(Ended),
}

/// The adapter's state between events.
pub(crate) struct MeshLoop<R> {
    config: MeshConfig,
    /// The step's traffic in flight over all channels (`connections::InFlight`).
    in_flight: Arc<InFlight>,
    replica: Arc<Mutex<dyn Replica>>,
    report: R,
    /// Where the tasks this loop spawns send their events.
    inbound: InboundTx,
    /// Messages for the signaling server.
    signal_out: mpsc::UnboundedSender<ClientMessage>,
    me: Option<PeerId>,
    /// Exists once the signaling server has welcomed us.
    session: Option<Session>,
    /// The token that takes our place back after the signaling server restarts.
    resume_token: Option<String>,
    /// The last fatal word of the signaling server (why it is about to close on us).
    refusal: Option<String>,
    /// Whether a reconnection task is running.
    reconnecting: bool,
    /// How long the next reconnection task waits first: doubles while the server keeps
    /// closing on us before a welcome (a refused resume), back to the first wait on a welcome.
    reconnect_wait_ms: u64,
    /// What each peer said it is to the signaling server (`lockstep` for a Lockstep node).
    agents: BTreeMap<PeerId, String>,
    /// The members the signaling server lists in our group: a closed link to one of them is
    /// offered again (by the smaller id) until it opens or the server says the member left.
    listed: BTreeSet<PeerId>,
    /// (Smaller id) when to offer a closed link again, and the wait after that one.
    reoffer: BTreeMap<PeerId, (Instant, u64)>,
    /// The id of the next connection attempt.
    next_attempt: u64,
    links: Links,
    reassembler: Reassembler,
    /// What computes here, as every peer is told (when its channel opens, and after a swap).
    hello: Message,
    /// The step being computed or exchanged: where its time went so far.
    timing: StepTiming,
    computed_at: Option<Instant>,
    /// An applied step whose `weights` report waits for its hash: the next step's gradient
    /// carries it, or `flush` asks the replica when no step is computing.
    unreported: Option<(u32, StepTiming)>,
    /// A step taken tentatively, and its timing: reported once it stands (`Confirm`).
    tentative: Option<(u32, StepTiming)>,
    /// The step and weight hash of the last gradient computed (the hash of the weights the
    /// step before it left).
    last_computed: Option<(u32, u32)>,
    /// Saves asked for while a step was taken ahead of its commit, done once it stands or is
    /// undone.
    deferred_saves: Vec<CheckpointTarget>,
    /// `Links::sent` when the last step was applied.
    sent_at_apply: u64,
    /// [`Links::sent_for_audits`] when the last step was applied.
    audit_sent_at_apply: u64,
    /// Compute tasks under way.
    computing: usize,
    /// Fault injection: asked to compute, this node never does.
    lazy: bool,
    /// Audits: those waiting for the replica (busy computing) to hand out their kits, the
    /// referees they recompute on (kept here between them), and the seconds they took since the
    /// last step was reported.
    audit_waiting: Vec<(u32, PeerId, Option<PrivateInputs>, bool, Urgency)>,
    referees: Referees,
    /// Disputes: a trace of this node's step is being made for the leader (one at a time: each
    /// costs a step).
    tracing: bool,
    audit_seconds: f64,
    /// Elastic windows: where the compute under way is told to end its window
    /// (`Replica::hurry`, taken at each configure: it belongs to the run's trainer).
    hurry: Option<Arc<AtomicU32>>,
    /// The residuals our packed contributions were made with, served to auditors (`-22`)
    /// without the replica's lock (`Replica::kept_states`, taken once).
    kept_states: KeptStates,
    /// How many times the replica's state was replaced (a restore or a new run): a gradient
    /// begun before that belongs to the old state and is dropped.
    generation: u64,
    ticks: u64,
    started: Instant,
    /// Set when the run had to stop here (its state saved first): the loop ends with it.
    stopping: Option<Ended>,
}

impl<R: Fn(Report) + Send + 'static> MeshLoop<R> {
    pub(crate) fn new(
        config: MeshConfig,
        replica: Arc<Mutex<dyn Replica>>,
        report: R,
        inbound: InboundTx,
        signal_out: mpsc::UnboundedSender<ClientMessage>,
    ) -> Self {
        let hello = Message::PeerInfo { backend: config.backend.clone(), verdict: config.verdict.clone() };
        let kept_states = replica.lock().unwrap_or_else(|p| p.into_inner()).kept_states();
        MeshLoop {
            kept_states,
            in_flight: InFlight::new(config.in_flight_bytes),
            config,
            replica,
            report,
            inbound,
            signal_out,
            me: None,
            session: None,
            resume_token: None,
            refusal: None,
            reconnecting: false,
            reconnect_wait_ms: RECONNECT_FIRST_MS,
            agents: BTreeMap::new(),
            listed: BTreeSet::new(),
            reoffer: BTreeMap::new(),
            next_attempt: 1,
            links: Links::default(),
            reassembler: Reassembler::default(),
            hello,
            timing: StepTiming::default(),
            audit_waiting: Vec::new(),
            referees: Referees::default(),
            tracing: false,
            audit_seconds: 0.0,
            computed_at: None,
            unreported: None,
            tentative: None,
            last_computed: None,
            deferred_saves: Vec::new(),
            sent_at_apply: 0,
            audit_sent_at_apply: 0,
            computing: 0,
            lazy: false,
            hurry: None,
            generation: 0,
            ticks: 0,
            started: Instant::now(),
            stopping: None,
        }
    }

    fn replica(&self) -> MutexGuard<'_, dyn Replica + 'static> {
        self.replica.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs until `Quit`, a closed command channel, a refusal or the signaling server's end.
    pub(crate) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>, mut inbound: InboundRx) -> Ended {
        let mut links = tokio::time::interval(LINK_TICK);
        links.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.open_audit_referees();
        let ended = loop {
            let flow = tokio::select! {
                // The clock first: woken from a suspension, the session hears of the gap before
                // the frames and closed links that waited behind it.
                biased;
                _ = tokio::time::sleep_until(self.session_due()) => self.on_tick(),
                _ = links.tick() => self.on_link_tick().await,
                command = commands.recv() => self.on_command(command),
                event = inbound.recv() => match event {
                    Some(event) => self.on_inbound(event).await,
                    None => Flow::Stop(Ended::Quit),
                },
            };
            if self.computing == 0 {
                self.flush();
            }
            if let Flow::Stop(ended) = flow {
                break ended;
            }
            if let Some(ended) = self.stopping.take() {
                break ended;
            }
        };
        self.flush();
        if ended == Ended::Quit && self.session.as_ref().is_some_and(|s| s.run().is_some()) {
            self.leave(&mut inbound).await;
        }
        for (_, peer) in std::mem::take(&mut self.links.peers) {
            let _ = peer.connection.close().await;
        }
        ended
    }

    /// On purpose: every member hears we leave (a leader hands the lead on first), and we wait
    /// until the run's configuration no longer holds us — our vote is not left behind — or a
    /// grace period passes, answering what arrives meanwhile.
    async fn leave(&mut self, inbound: &mut InboundRx) {
        self.drive(vec![Input::Quit]);
        let grace = Instant::now() + Duration::from_millis(LEAVING_GRACE_MS);
        while Instant::now() < grace && !self.session.as_ref().is_none_or(Session::out_of_run) {
            tokio::select! {
                _ = tokio::time::sleep_until(self.session_due().min(grace.into())) => {
                    self.on_tick();
                }
                event = inbound.recv() => match event {
                    Some(event) => {
                        self.on_inbound(event).await;
                    }
                    None => return,
                },
            }
        }
    }

    /// When the session wants its next tick (a second from now before it exists).
    fn session_due(&self) -> tokio::time::Instant {
        match &self.session {
            Some(session) => (self.started + Duration::from_millis(session.next_tick_ms())).into(),
            None => (Instant::now() + LINK_TICK).into(),
        }
    }

    /// The session's clock, when it asked for it.
    fn on_tick(&mut self) -> Flow {
        self.ticks += 1;
        self.drive(vec![Input::Tick { now_ms: self.started.elapsed().as_millis() as u64 }]);
        Flow::Continue
    }

    /// Once a second: a backend swap made between runs, the link reports and pings, silent
    /// links named, and closed links offered again.
    async fn on_link_tick(&mut self) -> Flow {
        // A swap made between runs shows up here (never blocks on a computing replica).
        let change = self.replica.try_lock().ok().and_then(|mut r| r.take_backend_change());
        if let Some(change) = change {
            self.announce(change);
        }
        self.ping_links();
        self.name_silent_links();
        self.tend_links().await;
        Flow::Continue
    }

    fn ping_links(&mut self) {
        for peer in self.links.open() {
            let link = self.links.stats.entry(peer).or_default();
            (self.report)(Report::Link {
                peer,
                rtt_ms: link.rtt_ms,
                bytes_in: link.bytes_in,
                bytes_out: link.bytes_out,
            });
            let nonce = self.started.elapsed().as_micros() as u64;
            link.ping = Some((nonce, Instant::now()));
            self.links.send(peer, &Message::Ping { nonce });
        }
    }

    /// A link that sent nothing for [`SILENT_MS`] is named, once per silence.
    fn name_silent_links(&mut self) {
        for peer in self.links.open() {
            let link = self.links.stats.entry(peer).or_default();
            let silent_ms = link.heard.map_or(0, |t| t.elapsed().as_millis() as u64);
            if silent_ms >= SILENT_MS && !link.silence_reported {
                link.silence_reported = true;
                (self.report)(Report::LinkSilent { peer, silent_ms });
            }
        }
    }

    /// Gives up connection attempts that never opened, and offers a link again to each listed
    /// member we have none to (we have the smaller id), waiting longer after each failure.
    async fn tend_links(&mut self) {
        let stale: Vec<PeerId> = self
            .links
            .peers
            .iter()
            .filter(|(_, p)| p.writer.is_none() && p.since.elapsed().as_millis() as u64 >= ATTEMPT_MS)
            .map(|(id, _)| *id)
            .collect();
        for peer in stale {
            if let Some(entry) = self.links.peers.remove(&peer) {
                let _ = entry.connection.close().await;
            }
        }
        let Some(me) = self.me else { return };
        let missing: Vec<PeerId> = self
            .listed
            .iter()
            .copied()
            .filter(|p| self.offers_to(me, *p) && !self.links.peers.contains_key(p))
            .collect();
        for peer in missing {
            let (due, wait) = *self.reoffer.entry(peer).or_insert((Instant::now(), RECONNECT_FIRST_MS));
            if Instant::now() < due {
                continue;
            }
            let next = (wait * 2).min(RECONNECT_MAX_MS);
            self.reoffer.insert(peer, (Instant::now() + std::time::Duration::from_millis(wait), next));
            self.offer_to(peer).await;
        }
    }

    fn on_command(&mut self, command: Option<Command>) -> Flow {
        match command {
            None | Some(Command::Quit) => return Flow::Stop(Ended::Quit),
            Some(Command::Start(mut settings)) => {
                // The run trains on the text this node starts it on: its members must too.
                settings.corpus = self.replica().corpus_digest();
                self.drive(vec![Input::Start(settings)])
            }
            Some(Command::PushCheckpoint(bytes)) => self.drive(vec![Input::PushCheckpoint { bytes }]),
            Some(Command::CutLinkTo(peer)) => self.links.cut.push(peer),
            Some(Command::HealLinkTo(peer)) => self.links.cut.retain(|p| *p != peer),
            Some(Command::Forget(peer)) => self.drive(vec![Input::Forget { peer }]),
            Some(Command::Kick { peer, why }) => self.drive(vec![Input::Kick { peer, why }]),
            Some(Command::Approve(peer)) => self.send_to_server(ClientMessage::Approve { peer }),
            Some(Command::Deny { peer, reason }) => {
                self.send_to_server(ClientMessage::Deny { peer, reason: Some(reason) })
            }
            // A step taken ahead of its commit is not saved: the save waits until it stands or
            // is undone.
            Some(Command::SaveCheckpoint(target)) if self.tentative.is_some() => self.deferred_saves.push(target),
            Some(Command::SaveCheckpoint(target)) => self.save(target),
            Some(Command::PoisonContributions(value)) => {
                self.replica().poison_contributions(value);
                let step = self.session.as_ref().map_or(0, Session::applied);
                (self.report)(Report::Warning(format!(
                    "fault injection: contributions replaced by {value} after step {step}"
                )));
            }
            Some(Command::PlayRogue(rogue)) => {
                self.replica().play_rogue(rogue);
                let step = self.session.as_ref().map_or(0, Session::applied);
                (self.report)(Report::Warning(format!("fault injection: a rogue ({rogue:?}) after step {step}")));
            }
            Some(Command::PlayWrongOwner) => self.inject("a wrong owner's sums", Session::play_wrong_owner),
            Some(Command::PlayFalseFingerprints) => self.inject("false fingerprints", Session::play_false_fingerprints),
            Some(Command::PlayWithheldFingerprints) => {
                self.inject("withheld fingerprints", Session::play_withheld_fingerprints)
            }
            Some(Command::NeverCompute) => {
                self.lazy = true;
                (self.report)(Report::Warning("fault injection: this node never computes from now on".into()));
            }
            Some(Command::FlipWeightBit) => {
                self.flush();
                // The steps the weights hold (one more than the log committed, while a step is
                // taken ahead of its commit).
                let step = {
                    let mut replica = self.replica();
                    replica.flip_weight_bit();
                    replica.steps_done()
                };
                (self.report)(Report::Warning(format!("fault injection: flipped one weight bit after step {step}")));
            }
        }
        Flow::Continue
    }

    async fn on_inbound(&mut self, event: Inbound) -> Flow {
        match event {
            Inbound::Signal(Err(why)) => (self.report)(Report::Warning(why)),
            Inbound::Signal(Ok(message)) => return self.on_signal(message).await,
            Inbound::SignalClosed(why) => return self.on_signal_closed(why),
            Inbound::SignalReconnected(sender) => {
                self.signal_out = sender;
                self.reconnecting = false;
            }
            Inbound::ChannelOpen(peer, attempt, channel) => self.on_channel_open(peer, attempt, channel),
            Inbound::Frame(peer, attempt, bytes) => {
                if self.links.peers.get(&peer).is_some_and(|p| p.attempt == attempt) {
                    self.on_frame(peer, &bytes);
                }
            }
            Inbound::ChannelClosed(peer, attempt) => self.on_channel_closed(peer, attempt).await,
            Inbound::Saved(Ok(saved)) => {
                (self.report)(Report::CheckpointSaved { path: saved.path, step: saved.step, whash: saved.whash })
            }
            Inbound::Saved(Err(why)) => (self.report)(Report::Warning(format!("checkpoint not saved: {why}"))),
            Inbound::Computed(computed) => self.on_computed(computed),
            Inbound::Audited { step, target, outcome, referee, urgency, seconds } => {
                self.referees.give_back(urgency, referee);
                self.audit_seconds += seconds;
                let outcome = outcome.map_err(Failure::new);
                self.drive(vec![Input::Audited { step, target, outcome }]);
            }
            Inbound::RefereeOpened { urgency, referee } => self.on_referee_opened(urgency, referee),
            Inbound::Settled { step, target, outcome, referee } => {
                self.referees.give_back(Urgency::Check, referee);
                let outcome = outcome.map_err(Failure::new);
                self.drive(vec![Input::Settled { step, target, outcome }]);
            }
            Inbound::TraceServed { to, step, answer } => {
                self.tracing = false;
                self.links.send(to, &Message::Trace { step, answer });
            }
            Inbound::WeightsChecked { step, outcome } => {
                let outcome = outcome.map_err(Failure::new);
                self.drive(vec![Input::WeightsChecked { step, outcome }]);
            }
            Inbound::WeightsServed { to, step, words } => self.links.send(to, &Message::Weights { step, words }),
            Inbound::StateServed { to, bytes, routine } => {
                let lane = if routine { Lane::Spare } else { Lane::Bulk };
                self.links.send_encoded(to, bytes, lane, true);
            }
        }
        Flow::Continue
    }

    async fn on_signal(&mut self, message: ServerMessage) -> Flow {
        match message {
            ServerMessage::Welcome { id, group, host, members, resume, agents, .. } => {
                self.agents.extend(agents);
                self.listed.extend(members.iter().copied().filter(|p| *p != id));
                self.refusal = None;
                self.reconnect_wait_ms = RECONNECT_FIRST_MS;
                self.resume_token = resume;
                let group = match group {
                    GroupName::Room(name) => format!("room {name}"),
                    GroupName::Ip(address) => format!("address {address}"),
                };
                if self.session.is_some() {
                    // Our place back after the server went away: the session goes on.
                    (self.report)(Report::SignalRestored { group, host });
                } else {
                    self.me = Some(id);
                    self.replica().set_identity(id);
                    self.session = Some(Session::new(SessionConfig {
                        me: id,
                        expected_phash: self.config.expected_phash,
                        repair_after_ms: self.config.repair_after_ms,
                        deadline: self.config.deadline,
                        slow_windows: self.config.slow_windows,
                        computes: self.config.verdict.is_admitted(),
                        agreement: self.config.agreement,
                        compute_ahead: self.config.compute_ahead,
                        audit_rate: self.config.audit_rate,
                        audit_state_part: self.config.audit_state_part,
                        audit_workers: self.config.audit_workers,
                    }));
                    (self.report)(Report::Connected { id, members: members.clone(), group, host });
                }
                let ours: Vec<PeerId> = members.into_iter().filter(|&p| p != id && self.offers_to(id, p)).collect();
                for peer in ours {
                    if !self.links.peers.contains_key(&peer) {
                        self.offer_to(peer).await;
                    }
                }
            }
            ServerMessage::PeerJoined { peer, agent } => {
                if let Some(agent) = agent {
                    self.agents.insert(peer, agent);
                }
                self.listed.insert(peer);
                if self.me.is_some_and(|id| self.offers_to(id, peer)) && !self.links.peers.contains_key(&peer) {
                    self.offer_to(peer).await;
                }
            }
            ServerMessage::PeerLeft { peer } => {
                // The same path as a channel that closes on its own.
                (self.report)(Report::SignalPeerLeft(peer));
                self.listed.remove(&peer);
                self.reoffer.remove(&peer);
                let _ = self.inbound.send(Inbound::ChannelClosed(peer, None));
            }
            ServerMessage::Waiting { id, room } => (self.report)(Report::Waiting { id, room }),
            ServerMessage::JoinRequest { peer, address } => (self.report)(Report::JoinRequest { peer, address }),
            ServerMessage::HostChanged { host } => (self.report)(Report::HostChanged(host)),
            ServerMessage::Signal { from, kind, data } => self.on_handshake(from, kind, data).await,
            ServerMessage::Error { message, fatal, .. } => {
                if fatal {
                    self.refusal = Some(message.clone());
                }
                (self.report)(Report::Warning(format!("signaling server: {message}")))
            }
            ServerMessage::Denied { reason } => {
                (self.report)(Report::Denied(reason.clone()));
                return Flow::Stop(Ended::Denied(reason));
            }
            ServerMessage::Pong => {}
        }
        Flow::Continue
    }

    /// Fault injection on the session (chunk owners): `play` from now on, said as `what`.
    fn inject(&mut self, what: &str, play: fn(&mut Session)) {
        let step = self.session.as_ref().map_or(0, Session::applied);
        if let Some(session) = self.session.as_mut() {
            play(session);
        }
        (self.report)(Report::Warning(format!("fault injection: {what} after step {step}")));
    }

    /// The signaling connection ended. Before a welcome there is no group: the node stops,
    /// saying why. After it the mesh needs no server: training goes on over the data channels
    /// while a task tries to take our place back (`resume` and its token), every second at
    /// first, then up to every 8 s.
    fn on_signal_closed(&mut self, why: String) -> Flow {
        if self.session.is_none() {
            let why = self.refusal.take().unwrap_or(why);
            (self.report)(Report::Warning(format!("the signaling server closed before we joined: {why}")));
            return Flow::Stop(Ended::Refused(why));
        }
        if self.reconnecting {
            return Flow::Continue;
        }
        let why = match self.refusal.take() {
            Some(refusal) => format!("{why}: {refusal}"),
            None => why,
        };
        let first_wait = self.reconnect_wait_ms;
        self.reconnect_wait_ms = (first_wait * 2).min(RECONNECT_MAX_MS);
        (self.report)(Report::SignalLost { why, retry_ms: first_wait });
        self.reconnecting = true;
        let resume = self.me.zip(self.resume_token.as_deref());
        let url = signal_url(&self.config, resume);
        let inbound = self.inbound.clone();
        tokio::spawn(async move {
            let mut wait = first_wait;
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                let attempt = Duration::from_millis(RECONNECT_ATTEMPT_MS);
                if let Ok(Ok(connection)) = tokio::time::timeout(attempt, connect_signal(&url, inbound.clone())).await {
                    // The loop hears of the connection before anything it says (or its end).
                    let _ = inbound.send(Inbound::SignalReconnected(connection.sender.clone()));
                    connection.start_reading();
                    return;
                }
                if inbound.is_closed() {
                    return;
                }
                wait = (wait * 2).min(RECONNECT_MAX_MS);
            }
        });
        Flow::Continue
    }

    /// A message for the signaling server; while it is gone, the user hears so.
    fn send_to_server(&mut self, message: ClientMessage) {
        if self.reconnecting || self.signal_out.send(message).is_err() {
            (self.report)(Report::Warning("the signaling server is away; ask again once it is back".into()));
        }
    }

    /// A relayed WebRTC handshake message from `from`.
    async fn on_handshake(&mut self, from: PeerId, kind: SignalKind, data: serde_json::Value) {
        let (SignalKind::Offer | SignalKind::Answer) = kind else {
            // Candidates travel inside the descriptions (gathering completes first).
            return;
        };
        // Our offers carry a tag, echoed in the answer (a browser peer echoes none).
        let tag = data.get(ATTEMPT_TAG).and_then(serde_json::Value::as_u64);
        let Ok(description) = serde_json::from_value::<RTCSessionDescription>(data) else {
            (self.report)(Report::Warning(format!("peer {from} sent an unreadable session description")));
            return;
        };
        if kind == SignalKind::Offer {
            // A new offer means the peer lost its link to us: ours goes, the session first.
            if let Some(old) = self.links.peers.remove(&from) {
                let _ = old.connection.close().await;
                self.forget_link(from, old.writer.is_some());
            }
            if let Err(e) = self.answer_to(from, description, tag).await {
                (self.report)(Report::Warning(format!("cannot answer peer {from}: {e:#}")));
            }
        } else if let Some(entry) = self.links.peers.get(&from) {
            if tag.is_some() && tag != entry.offered {
                return; // an answer to an offer we gave up
            }
            if let Err(e) = entry.connection.set_remote_description(description).await {
                (self.report)(Report::Warning(format!("peer {from}'s answer was refused: {e}")));
            }
        }
    }

    /// Whether we offer the link to `peer` (else we answer its offer): of two Lockstep nodes the
    /// smaller id offers; to any other peer (a browser page, which only answers) we offer.
    fn offers_to(&self, me: PeerId, peer: PeerId) -> bool {
        me < peer || self.agents.get(&peer).is_none_or(|agent| agent != AGENT)
    }

    /// Large SCTP packets (16,000 bytes) only on loopback and only to a peer that said it is a
    /// Lockstep node: a browser's DTLS reads 2 KiB datagrams and would drop the connection.
    fn large_packets(&self, peer: PeerId) -> bool {
        self.config.bind_ip.is_loopback() && self.agents.get(&peer).is_some_and(|a| a == AGENT)
    }

    /// We have the smaller id: we create the channel and offer.
    async fn offer_to(&mut self, peer: PeerId) {
        let attempt = self.next_attempt;
        self.next_attempt += 1;
        let result: anyhow::Result<()> = async {
            let (connection, mut gathered) =
                new_connection(&self.config, peer, attempt, self.large_packets(peer), &self.inbound).await?;
            let init = RTCDataChannelInit { ordered: true, ..Default::default() };
            let channel = connection.create_data_channel(CHANNEL_LABEL, Some(init)).await?;
            spawn_reader(peer, attempt, channel, self.inbound.clone());
            let offer = connection.create_offer(None).await?;
            connection.set_local_description(offer).await?;
            let mut data = gathered_description(&connection, &mut gathered).await?;
            data[ATTEMPT_TAG] = attempt.into();
            self.signal_out.send(ClientMessage::Signal { to: peer, kind: SignalKind::Offer, data })?;
            let entry = Peer { connection, writer: None, attempt, offered: Some(attempt), since: Instant::now() };
            self.links.peers.insert(peer, entry);
            Ok(())
        }
        .await;
        if let Err(e) = result {
            (self.report)(Report::Warning(format!("cannot connect to peer {peer}: {e:#}")));
        }
    }

    /// `tag`: the offer's, echoed so the offerer can tell our answer from a stale one.
    async fn answer_to(&mut self, peer: PeerId, offer: RTCSessionDescription, tag: Option<u64>) -> anyhow::Result<()> {
        let attempt = self.next_attempt;
        self.next_attempt += 1;
        let (connection, mut gathered) =
            new_connection(&self.config, peer, attempt, self.large_packets(peer), &self.inbound).await?;
        connection.set_remote_description(offer).await?;
        let answer = connection.create_answer(None).await?;
        connection.set_local_description(answer).await?;
        let mut data = gathered_description(&connection, &mut gathered).await?;
        if let Some(tag) = tag {
            data[ATTEMPT_TAG] = tag.into();
        }
        self.signal_out.send(ClientMessage::Signal { to: peer, kind: SignalKind::Answer, data })?;
        self.links.peers.insert(peer, Peer { connection, writer: None, attempt, offered: None, since: Instant::now() });
        Ok(())
    }

    fn on_channel_open(&mut self, peer: PeerId, attempt: u64, channel: Arc<dyn DataChannel>) {
        let Some(entry) = self.links.peers.get_mut(&peer) else { return };
        if entry.writer.is_some() || entry.attempt != attempt {
            return;
        }
        entry.writer = Some(spawn_writer(channel, self.in_flight.clone()));
        self.reoffer.remove(&peer);
        let link = self.links.stats.entry(peer).or_default();
        link.heard = Some(Instant::now());
        link.silence_reported = false;
        (self.report)(Report::ChannelOpen(peer));
        let hello = self.hello.clone();
        self.links.send(peer, &hello);
        self.drive(vec![Input::Connected(peer)]);
    }

    async fn on_channel_closed(&mut self, peer: PeerId, attempt: Option<u64>) {
        let current = self.links.peers.get(&peer).map(|p| p.attempt);
        if current.is_none() || attempt.is_some_and(|a| Some(a) != current) {
            return; // an attempt already replaced
        }
        let entry = self.links.peers.remove(&peer).expect("checked above");
        let _ = entry.connection.close().await;
        self.forget_link(peer, entry.writer.is_some());
        if self.listed.contains(&peer) {
            // Still in the group as the signaling server sees it: the link is offered again.
            let retry_ms = self.reoffer.get(&peer).map_or(RECONNECT_FIRST_MS, |(_, wait)| *wait);
            (self.report)(Report::LinkRetry { peer, retry_ms });
        }
    }

    /// A link to `peer` is gone: what came over it half-way is dropped, and the session hears
    /// of it if it knew the peer (`open`: its channel had opened).
    fn forget_link(&mut self, peer: PeerId, open: bool) {
        self.reassembler.forget(peer);
        self.links.stats.remove(&peer);
        if open {
            self.drive(vec![Input::Disconnected(peer)]);
        }
    }

    /// A frame: link messages are answered here, everything else goes to the session.
    fn on_frame(&mut self, peer: PeerId, bytes: &[u8]) {
        let link = self.links.stats.entry(peer).or_default();
        link.bytes_in += bytes.len() as u64;
        link.heard = Some(Instant::now());
        link.silence_reported = false;
        match self.reassembler.push(peer, bytes) {
            Ok(Some(Message::Ping { nonce })) => self.links.send(peer, &Message::Pong { nonce }),
            Ok(Some(Message::Pong { nonce })) => self.links.stats.entry(peer).or_default().pong(nonce),
            Ok(Some(Message::PeerInfo { backend, verdict })) => {
                let computes = verdict.is_admitted();
                (self.report)(Report::PeerInfo { peer, backend, verdict });
                self.drive(vec![Input::PeerInfo { peer, computes }]);
            }
            Ok(Some(message)) => self.drive(vec![Input::Received { from: peer, message }]),
            Ok(None) => {}
            Err(e) => (self.report)(Report::Warning(format!("peer {peer} sent a malformed frame: {e}"))),
        }
    }
}
