//! The console's state, the actions that change it, and `update`: the only mutator.
//!
//! Everything here is pure: reports and keys come in as [`Action`]s stamped with the time,
//! requests for the outside world go out as [`Effect`]s. The loop in `console/mod.rs` does the
//! I/O; `console/view.rs` only reads.

use std::collections::BTreeSet;
use std::path::PathBuf;

use lockstep_mesh::{CheckpointTarget, Command, Report, SwapProgress};
use lockstep_node::config::RunConfig;
use lockstep_node::session::{Event, Problem, Stop};
use lockstep_node::verdict::Verdict;
use lockstep_node::wire::PeerId;

pub use super::key::Key;
pub use super::node::RunState;
use super::node::{Link, Node, Role};
pub use super::panes::CheckpointRow;
use super::panes::{
    move_selection, Backends, Checkpoints, Health, Log, PaneId, PaneRequest, Panes, Room, Roster, PANES,
};

#[derive(Clone, Debug)]
pub enum Action {
    Key(Key),
    /// A node report, stamped with seconds since the console started.
    Report(Report, f64),
    /// The clock, for rates (once a second or so).
    Tick(f64),
    /// Checkpoint files found on disk (at start-up).
    CheckpointsFound(Vec<CheckpointRow>),
    /// A plugin's verdict from the start-up survey, and the device it would compute on.
    BackendVerdict {
        name: String,
        verdict: Verdict,
        device: String,
    },
    /// The demo's own nodes are approved without asking.
    TrustJoiner(PeerId),
    /// Something the loop wants in the log (a failed file read, …).
    Log(String),
    /// A checkpoint file the user named, read and checked by the loop (or why not).
    CheckpointLoaded(Result<CheckpointRow, String>),
}

/// What the loop should do for `update`.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    Mesh(Command),
    /// Gate this backend (name or path) and stage it.
    Swap(String),
    /// Read this checkpoint and push it to the group.
    Broadcast(PathBuf),
    /// Read and check this checkpoint file, then answer with `Action::CheckpointLoaded`.
    Inspect(PathBuf),
    Quit,
}

/// Why the console turns a joiner away.
pub const DENY_REASON: &str = "the host declined";

#[derive(Clone, Debug, PartialEq)]
pub enum Modal {
    Help,
    /// The oldest pending join request.
    Approve {
        peer: PeerId,
        address: String,
    },
    /// Pick a backend (`selected` indexes the backend list) or type a path.
    Swap {
        selected: usize,
        typing: Option<String>,
    },
    ConfirmBroadcast(CheckpointRow),
    /// Typing the path of a checkpoint to load (and then broadcast).
    LoadPath(String),
    /// Typing the id of a member to remove from the run (leader only).
    KickPeer(String),
    /// Remove this member? (`y` removes it.)
    ConfirmKick(PeerId),
    ConfirmStart,
    ConfirmQuit,
}

/// The console's state: what it knows of the node ([`Node`]), each pane's own ([`Panes`]),
/// and what the keys are doing (focus, an open dialog).
#[derive(Clone, Debug)]
pub struct State {
    pub node: Node,
    pub panes: Panes,
    pub focus: PaneId,
    pub modal: Option<Modal>,
    pub trusted: BTreeSet<PeerId>,
    /// Demo: start the run once this many members (us included) have open channels.
    pub autostart: Option<usize>,
}

impl State {
    /// `backend` computes here, admitted with `verdict` on `device`.
    pub fn new(backend: &str, verdict: &Verdict, device: &str, start_settings: RunConfig, ckpt_dir: PathBuf) -> Self {
        State {
            node: Node::new(backend, verdict, start_settings),
            panes: Panes {
                roster: Roster,
                health: Health::default(),
                room: Room::default(),
                checkpoints: Checkpoints::new(ckpt_dir),
                backends: Backends::new(backend, verdict, device),
                log: Log::default(),
            },
            focus: PaneId::Roster,
            modal: None,
            trusted: BTreeSet::new(),
            autostart: None,
        }
    }

    fn log(&mut self, line: impl Into<String>) {
        self.panes.log.push(self.node.now, line.into());
    }

    /// Opens the next approval, if one waits and nothing else is open.
    fn next_approval(&mut self) {
        if self.modal.is_none() {
            if let Some((peer, address)) = self.panes.room.pending.first().cloned() {
                self.modal = Some(Modal::Approve { peer, address });
            }
        }
    }
}

/// The only mutator: applies `action`, returns what the loop should do.
pub fn update(state: &mut State, action: Action) -> Vec<Effect> {
    let mut effects = Vec::new();
    match action {
        Action::Key(key) => on_key(state, key, &mut effects),
        Action::Report(report, at) => {
            state.node.now = state.node.now.max(at);
            on_report(state, report, &mut effects);
        }
        Action::Tick(now) => {
            state.node.now = state.node.now.max(now);
            state.panes.health.tick(now);
        }
        Action::CheckpointsFound(rows) => state.panes.checkpoints.found(rows),
        Action::BackendVerdict { name, verdict, device } => state.panes.backends.verdict(name, verdict, device),
        Action::TrustJoiner(peer) => {
            state.trusted.insert(peer);
            if state.panes.room.pending.iter().any(|(p, _)| *p == peer) {
                approve(state, peer, &mut effects);
            }
        }
        Action::Log(line) => state.log(line),
        Action::CheckpointLoaded(Ok(row)) => {
            state.log(format!("loaded {} (step {}, whash {:#010x})", row.path.display(), row.step, row.whash));
            state.panes.checkpoints.add(row);
            state.focus = PaneId::Checkpoints;
            open_broadcast(state);
        }
        Action::CheckpointLoaded(Err(why)) => state.log(format!("cannot load: {why}")),
    }
    effects
}

fn approve(state: &mut State, peer: PeerId, effects: &mut Vec<Effect>) {
    state.log(format!("approved peer {peer}"));
    effects.push(Effect::Mesh(Command::Approve(peer)));
    settle_request(state, peer);
}

/// `peer`'s request is settled (approved, denied or withdrawn): off the list, and if its
/// dialog was open, closed and followed by the next request's (a deferred one stays deferred).
fn settle_request(state: &mut State, peer: PeerId) {
    state.panes.room.pending.retain(|(p, _)| *p != peer);
    if matches!(state.modal, Some(Modal::Approve { peer: p, .. }) if p == peer) {
        state.modal = None;
        state.next_approval();
    }
}

fn on_key(state: &mut State, key: Key, effects: &mut Vec<Effect>) {
    match state.modal.take() {
        Some(modal) => on_dialog_key(state, modal, key, effects),
        None => on_console_key(state, key, effects),
    }
}

/// What a key does to a line being typed: `Some(true)` it was taken (a character `accepts`, or
/// Backspace), `Some(false)` Enter, `None` anything else.
fn edit(text: &mut String, key: Key, accepts: impl Fn(char) -> bool) -> Option<bool> {
    match key {
        Key::Char(c) if accepts(c) => text.push(c),
        Key::Backspace => {
            text.pop();
        }
        Key::Enter => return Some(false),
        _ => return None,
    }
    Some(true)
}

/// A key while a dialog is open (the dialog was taken out of the state; putting it back keeps
/// it open).
fn on_dialog_key(state: &mut State, modal: Modal, key: Key, effects: &mut Vec<Effect>) {
    let keep = |state: &mut State, modal: Modal| state.modal = Some(modal);
    match modal {
        Modal::Help => {
            if matches!(key, Key::Esc | Key::Enter | Key::Char('?') | Key::Char('q')) {
                state.next_approval();
            } else {
                keep(state, Modal::Help);
            }
        }
        // Settled, the next request is asked about at once.
        Modal::Approve { peer, address } => match key {
            Key::Char('y') | Key::Char('a') => {
                approve(state, peer, effects);
                state.next_approval();
            }
            Key::Char('n') | Key::Char('d') => {
                state.log(format!("denied peer {peer}"));
                effects.push(Effect::Mesh(Command::Deny { peer, reason: DENY_REASON.into() }));
                settle_request(state, peer);
                state.next_approval();
            }
            // Decide later: the request stays in the Room pane (`a` reopens it).
            Key::Esc => {}
            _ => keep(state, Modal::Approve { peer, address }),
        },
        Modal::Swap { selected, typing: Some(mut path) } => match (edit(&mut path, key, |_| true), key) {
            (Some(true), _) => keep(state, Modal::Swap { selected, typing: Some(path) }),
            (Some(false), _) if !path.trim().is_empty() => start_swap(state, path.trim().to_string(), effects),
            (Some(false), _) => {}
            (None, Key::Esc) => keep(state, Modal::Swap { selected, typing: None }),
            (None, _) => keep(state, Modal::Swap { selected, typing: Some(path) }),
        },
        Modal::Swap { mut selected, typing: None } => match key {
            Key::Up | Key::Down => {
                move_selection(&mut selected, state.panes.backends.rows.len(), key == Key::Down);
                keep(state, Modal::Swap { selected, typing: None });
            }
            Key::Char('p') | Key::Char('/') => keep(state, Modal::Swap { selected, typing: Some(String::new()) }),
            Key::Enter => {
                if let Some(row) = state.panes.backends.rows.get(selected) {
                    let name = row.name.clone();
                    start_swap(state, name, effects);
                }
            }
            Key::Esc | Key::Char('q') => {}
            _ => keep(state, Modal::Swap { selected, typing: None }),
        },
        Modal::ConfirmBroadcast(row) => match key {
            Key::Char('y') | Key::Enter => {
                state.log(format!(
                    "broadcasting {} (step {}, whash {:#010x})",
                    row.path.display(),
                    row.step,
                    row.whash
                ));
                effects.push(Effect::Broadcast(row.path));
            }
            Key::Char('n') | Key::Esc => {}
            _ => keep(state, Modal::ConfirmBroadcast(row)),
        },
        Modal::LoadPath(mut path) => match edit(&mut path, key, |_| true) {
            Some(true) => keep(state, Modal::LoadPath(path)),
            Some(false) if !path.trim().is_empty() => effects.push(Effect::Inspect(PathBuf::from(path.trim()))),
            Some(false) => {}
            None if key == Key::Esc => {}
            None => keep(state, Modal::LoadPath(path)),
        },
        Modal::KickPeer(mut typed) => match edit(&mut typed, key, |c| c.is_ascii_digit()) {
            Some(false) => match typed.parse::<PeerId>() {
                Ok(peer) if state.node.peers.contains_key(&peer) && state.node.me != Some(peer) => {
                    keep(state, Modal::ConfirmKick(peer));
                }
                _ => state.log(format!("no other member is node {typed}")),
            },
            None if key == Key::Esc => {}
            _ => keep(state, Modal::KickPeer(typed)),
        },
        Modal::ConfirmKick(peer) => match key {
            Key::Char('y') => {
                state.log(format!("removing node {peer} from the run"));
                let why = "the console's operator removed it".to_string();
                effects.push(Effect::Mesh(Command::Kick { peer, why }));
            }
            Key::Char('n') | Key::Esc => {}
            _ => keep(state, Modal::ConfirmKick(peer)),
        },
        Modal::ConfirmStart => match key {
            Key::Char('y') | Key::Enter => start_run(state, effects),
            Key::Char('n') | Key::Esc => {}
            _ => keep(state, Modal::ConfirmStart),
        },
        Modal::ConfirmQuit => match key {
            Key::Char('y') | Key::Char('q') => {
                keep(state, Modal::ConfirmQuit);
                effects.push(Effect::Quit);
            }
            Key::Char('n') | Key::Esc => {}
            _ => keep(state, Modal::ConfirmQuit),
        },
    }
}

/// The console's own keys (no dialog open); the focused pane takes Up, Down and Enter.
fn on_console_key(state: &mut State, key: Key, effects: &mut Vec<Effect>) {
    match key {
        Key::Char('q') => {
            if state.node.running() {
                state.modal = Some(Modal::ConfirmQuit);
            } else {
                effects.push(Effect::Quit);
            }
        }
        Key::Char('?') => state.modal = Some(Modal::Help),
        Key::Tab | Key::BackTab => {
            let at = PANES.iter().position(|p| *p == state.focus).unwrap_or(0);
            let next = if key == Key::Tab { at + 1 } else { at + PANES.len() - 1 };
            state.focus = PANES[next % PANES.len()];
        }
        // The focused pane's own keys.
        Key::Up | Key::Down | Key::Enter => match state.panes.get_mut(state.focus).on_key(key) {
            Some(PaneRequest::Broadcast) => open_broadcast(state),
            Some(PaneRequest::Swap { selected }) => state.modal = Some(Modal::Swap { selected, typing: None }),
            Some(PaneRequest::ReviewRequests) => state.next_approval(),
            None => {}
        },
        Key::Char('a') => {
            if state.panes.room.pending.is_empty() {
                state.log("no join request is waiting");
            }
            state.next_approval();
        }
        Key::Char('s') => {
            if state.node.running() {
                state.log("a run is already going");
            } else if state.node.me.is_none() {
                state.log("not connected to the group yet");
            } else {
                state.modal = Some(Modal::ConfirmStart);
            }
        }
        Key::Char('w') => {
            if state.node.swap.is_some() {
                state.log("a swap is already in progress");
            } else {
                let selected = state.panes.backends.rows.iter().position(|b| b.name == state.node.backend).unwrap_or(0);
                state.modal = Some(Modal::Swap { selected, typing: None });
            }
        }
        Key::Char('c') => {
            if state.node.run.is_none() {
                state.log("nothing to save: no run yet");
            } else {
                state.log(format!("saving a checkpoint in {}", state.panes.checkpoints.dir.display()));
                effects.push(Effect::Mesh(Command::SaveCheckpoint(CheckpointTarget::InDir(
                    state.panes.checkpoints.dir.clone(),
                ))));
            }
        }
        Key::Char('b') => {
            state.focus = PaneId::Checkpoints;
            open_broadcast(state);
        }
        Key::Char('l') => state.modal = Some(Modal::LoadPath(String::new())),
        Key::Char('k') => {
            if state.node.is_leader() {
                state.modal = Some(Modal::KickPeer(String::new()));
            } else {
                state.log("only the run's leader removes members (k on the leader's console)");
            }
        }
        _ => {}
    }
}

fn open_broadcast(state: &mut State) {
    if state.node.run.is_none() {
        state.log("broadcast needs a run: every node restores into its running model");
    } else if let Some(row) = state.panes.checkpoints.selected().cloned() {
        state.modal = Some(Modal::ConfirmBroadcast(row));
    } else {
        state.log("no checkpoint to broadcast: save one with `c`");
    }
}

fn start_swap(state: &mut State, name: String, effects: &mut Vec<Effect>) {
    state.node.swap = Some(format!("{name}: loading"));
    state.log(format!("swap to `{name}`: gating"));
    effects.push(Effect::Swap(name));
}

fn start_run(state: &mut State, effects: &mut Vec<Effect>) {
    state.node.run_state = RunState::Starting;
    let s = &state.node.start_settings;
    state.log(format!(
        "starting a run: c={} t={} layers={} heads={} batch={} steps={} lr={} seed={} sync {}",
        s.model.width, s.model.context, s.model.layers, s.model.heads, s.batch, s.steps, s.lr, s.seed, s.sync
    ));
    effects.push(Effect::Mesh(Command::Start(state.node.start_settings)));
}

fn on_report(state: &mut State, report: Report, effects: &mut Vec<Effect>) {
    match report {
        Report::Connected { id, members, group, host } => {
            state.node.me = Some(id);
            state.node.group = group.clone();
            state.node.host = Some(host);
            state.panes.room.waiting_for_host = false;
            for member in members {
                let link = if member == id { Link::Open } else { Link::Joining };
                state.node.peer(member).link = link;
            }
            let verdict = state.node.verdict.clone();
            let backend = state.node.backend.clone();
            let row = state.node.peer(id);
            row.backend = Some(backend);
            row.verdict = Some(verdict);
            state.log(format!("joined {group} as node {id}"));
        }
        Report::Waiting { id, room } => {
            state.panes.room.waiting_for_host = true;
            state.node.me = Some(id);
            state.node.group = format!("room {room}");
            state.log(format!("waiting for the host of room {room} to approve us (node {id})"));
        }
        Report::JoinRequest { peer, address } => {
            if state.trusted.contains(&peer) {
                approve(state, peer, effects);
            } else {
                state.log(format!("join request from node {peer} at {address}"));
                state.panes.room.pending.push((peer, address));
                state.next_approval();
            }
        }
        Report::HostChanged(host) => {
            state.node.host = Some(host);
            state.log(format!("node {host} is the room's host now"));
        }
        Report::Denied(reason) => {
            state.panes.room.waiting_for_host = false;
            state.log(format!("denied: {reason}"));
        }
        Report::SignalPeerLeft(peer) => {
            if state.panes.room.pending.iter().any(|(p, _)| *p == peer) {
                state.log(format!("node {peer} gave up waiting"));
                settle_request(state, peer);
            }
            if let Some(row) = state.node.peers.get_mut(&peer) {
                row.link = Link::Left;
                row.in_roster = false;
            }
        }
        Report::ChannelOpen(peer) => {
            state.node.peer(peer).link = Link::Open;
            state.log(format!("channel to node {peer} open"));
            if let Some(wanted) = state.autostart {
                if state.node.run.is_none()
                    && state.node.run_state == RunState::Idle
                    && state.node.open_channels() >= wanted
                {
                    state.autostart = None;
                    start_run(state, effects);
                }
            }
        }
        Report::PeerInfo { peer, backend, verdict } => {
            let row = state.node.peer(peer);
            let changed = row.backend.as_deref().is_some_and(|b| b != backend);
            row.backend = Some(backend.clone());
            row.verdict = Some(verdict);
            if changed {
                state.log(format!("node {peer} now computes with `{backend}`"));
            }
        }
        Report::Link { peer, rtt_ms, bytes_in, bytes_out } => {
            let row = state.node.peer(peer);
            row.rtt_ms = rtt_ms;
            row.bytes_in = bytes_in;
            row.bytes_out = bytes_out;
        }
        Report::LinkSilent { peer, silent_ms } => {
            state.log(format!("link to node {peer} silent for {:.1} s: pings unanswered", silent_ms as f64 / 1e3))
        }
        Report::LinkRetry { peer, retry_ms } => {
            state.log(format!("link to node {peer} closed; offered again in {:.0} s", retry_ms as f64 / 1e3))
        }
        Report::Swap(progress) => match progress {
            SwapProgress::Gating { backend, done, total } => {
                state.node.swap = Some(if total == 0 {
                    format!("{backend}: loading")
                } else {
                    format!("{backend}: gate {done}/{total}")
                });
            }
            SwapProgress::Staged { backend, verdict } => {
                state.node.swap = Some(format!("{backend}: admitted, takes over at the next step"));
                state.log(format!("swap: {verdict}"));
            }
            SwapProgress::Refused { backend, verdict } => {
                state.node.swap = None;
                state.log(format!("swap to `{backend}` refused, keeping `{}`: {verdict}", state.node.backend));
            }
        },
        Report::AtRunShapes { backend, verdict: Ok((admitted, seconds)) } => state.log(format!(
            "`{backend}` admitted at the run's own shapes: one step, its {} ops each checked against the definition, in {seconds:.1} s",
            admitted.ops
        )),
        Report::AtRunShapes { backend, verdict: Err(refused) } => {
            let verdict = refused.verdict();
            state.node.verdict = verdict.clone();
            if let Some(me) = state.node.me {
                state.node.peer(me).verdict = Some(verdict);
            }
            state.log(format!("`{backend}` {refused}; this node watches the run"));
        }
        Report::BackendSwapped(change) => {
            state.node.swap = None;
            state.node.backend = change.backend.clone();
            state.node.verdict = change.verdict.clone();
            if let Some(me) = state.node.me {
                let row = state.node.peer(me);
                row.backend = Some(change.backend.clone());
                row.verdict = Some(change.verdict);
            }
            state.log(format!("now computing with `{}` from step {}", change.backend, change.step));
        }
        Report::CheckpointSaved { path, step, whash } => {
            state.log(format!("saved {} (step {step}, whash {whash:#010x})", path.display()));
            state.panes.checkpoints.add(CheckpointRow { path, step, whash });
        }
        Report::Applied { step, whash, timing } => {
            state.node.step = step;
            state.panes.health.applied(state.node.now, step, whash, &timing);
        }
        Report::Restored { step, whash } => {
            state.node.step = step;
            state.panes.health.restored(whash);
            state.log(format!("restored: step {step}, whash {whash:#010x}"));
        }
        Report::Warning(message) => state.log(format!("warning: {message}")),
        Report::RogueBegan { step } => {
            state.log(format!("fault injection: this node's contribution to step {step} is the first it made wrong"))
        }
        Report::SignalLost { why, .. } => {
            state.node.signal_lost = true;
            state.log(format!("signaling server gone ({why}); training goes on over the data channels, reconnecting"));
        }
        Report::SignalRestored { group, host } => {
            state.node.signal_lost = false;
            state.node.host = Some(host);
            state.log(format!("signaling server back: our place in {group} is restored, host node {host}"));
        }
        Report::Session(event) => on_event(state, event),
    }
}

fn on_event(state: &mut State, event: Event) {
    match event {
        Event::PeerJoined(peer) => {
            state.node.peer(peer);
            state.log(format!("node {peer} joined the session"));
        }
        Event::PeerLeft(peer) => {
            let row = state.node.peer(peer);
            row.link = Link::Left;
            row.in_roster = false;
            state.log(format!("node {peer} left"));
        }
        Event::Leader { peer, term } => {
            state.node.leader = Some(peer);
            if matches!(state.node.run_state, RunState::NoMajority(_)) {
                state.node.run_state = RunState::Running;
            }
            state.log(format!("node {peer} leads now (term {term})"));
        }
        Event::Observer(peer) => {
            state.node.peer(peer).role = Role::Observer;
            state.log(format!("node {peer} cannot compute: it watches the run"));
        }
        Event::Members { voters, learners, .. } => {
            for (id, row) in state.node.peers.iter_mut() {
                if row.role != Role::Observer {
                    row.role = if voters.contains(id) {
                        Role::Voter
                    } else if learners.contains(id) {
                        Role::Learner
                    } else {
                        Role::None
                    };
                }
            }
            for peer in voters.iter().chain(&learners) {
                state.node.peer(*peer);
            }
        }
        Event::NoMajority { reach, voters, term } => {
            let why = format!("reaches {reach:?} of the voters {voters:?} (term {term})");
            state.log(format!("no majority: this node {why}; nothing commits here until it does"));
            state.node.run_state = RunState::NoMajority(why);
        }
        Event::CatchingUp { applied, committed } => state.log(format!(
            "this node's weights hold {applied} steps, the log {committed}: asked the leader for a resume"
        )),
        Event::RunStarted { leader, settings } => {
            state.node.leader = Some(leader);
            state.log(format!(
                "run started by node {leader}: c={} t={} layers={} batch={} steps={} sync {}",
                settings.model.width,
                settings.model.context,
                settings.model.layers,
                settings.batch,
                settings.steps,
                settings.sync
            ));
            state.node.run = Some(settings);
            state.node.run_state = RunState::Running;
            state.panes.health.restart();
            state.node.step = 0;
            for row in state.node.peers.values_mut() {
                row.weight_mismatch = false;
                row.probe_mismatch = false;
                row.agreed_at = None;
            }
        }
        Event::StepApplied { step, loss, peers, .. } => {
            for row in state.node.peers.values_mut() {
                row.in_roster = false;
            }
            for peer in peers {
                state.node.peer(peer).in_roster = true;
            }
            state.node.step = step;
            state.panes.health.loss(step, loss);
            for row in state.node.peers.values_mut().filter(|r| r.in_roster) {
                row.agreed_at = Some(step);
            }
        }
        Event::Undone { step } => state.log(format!(
            "step {step}: taken ahead of its commit, undone: another record committed in its place"
        )),
        Event::RepairRequested { step, peer } => {
            state.log(format!("step {step}: asked for node {peer}'s contribution again"))
        }
        Event::Repaired { step, peer } => {
            state.node.peer(peer).repairs += 1;
            state.log(format!("step {step}: node {peer}'s contribution repaired"));
        }
        Event::RepairServed { step, peer, to } => {
            state.node.peer(to).repairs += 1;
            state.log(format!("step {step}: re-sent node {peer}'s gradient to node {to}"));
        }
        Event::Resumed { step } => state.log(format!("resumed at step {step}")),
        Event::Slept { ms } => state.log(format!("this node was suspended or starved for {ms} ms")),
        // Without the step, so that a run of equal lines shows once, counted.
        Event::Behind { steps, of, .. } => state.log(format!(
            "elastic windows: this node's window ended after {steps} of {of} inner steps (a faster member finished first)"
        )),
        Event::PeerLeaving(peer) => state.log(format!("node {peer} says it is leaving")),
        Event::CheckpointRestored { from, step } => {
            state.log(format!("checkpoint from node {from} restored the group at step {step}"))
        }
        Event::GuardStopped(failure) => {
            for peer in &failure.weight_mismatch {
                state.node.peer(*peer).weight_mismatch = true;
            }
            for peer in &failure.probe_mismatch {
                state.node.peer(*peer).probe_mismatch = true;
            }
            state.log(failure.to_string());
            state.node.run_state = RunState::Stopped(Stop::Guard(failure));
        }
        Event::RunFinished { step } => {
            state.node.run_state = RunState::Finished;
            state.log(format!("run finished at step {step}"));
        }
        Event::Ignored { from, why } => state.log(format!("ignored from node {from}: {why}")),
        Event::Dropped { peer, step, why } => {
            state.node.peer(peer).in_roster = false;
            state.log(format!("dropped node {peer} at step {step}: {why}"));
        }
        Event::Readmitted { peer, steps } => {
            state.log(format!("node {peer} kept up for {steps} steps: waited for again, and votes"))
        }
        Event::PushRefused { from } => {
            state.log(format!("refused node {from}'s checkpoint push: only the run's leader may push"))
        }
        Event::ContributionRefused { peer, step, why } => {
            state.log(format!("refused node {peer}'s contribution to step {step}: {why}"))
        }
        Event::Removed { step, why } => {
            state.log(format!("the leader took this node out of the run at step {step}: {why}"))
        }
        Event::Audited { step, target } => state.log(format!(
            "audit: node {target}'s contribution to step {step} recomputed: the definition's, bit for bit"
        )),
        Event::Accused { step, target, by, evidence } if evidence.is_the_fingerprints() => state.log(format!(
            "fingerprints: node {by} finds node {target}'s part in step {step} wrong: {evidence}"
        )),
        Event::Accused { step, target, by, evidence } if evidence.is_the_guards() => {
            let whose = if target == by { "its own weights".to_string() } else { format!("node {target}'s weights") };
            state.log(format!("guard: node {by} finds {whose} at step {step} apart from the definition's: {evidence}"))
        }
        Event::Accused { step, target, by, evidence } => {
            state.log(format!("audit: node {by} finds node {target}'s contribution to step {step} wrong: {evidence}"))
        }
        Event::Verdict(verdict) => {
            state.log(format!("VERDICT: {verdict}; node {} is out of the run", verdict.target))
        }
        Event::LeaderShunned { leader, step } => state.log(format!(
            "audit: the leader, node {leader}, sent a wrong contribution to step {step}: this node follows it no more (the next leader proposes the verdict)"
        )),
        Event::ShunLapsed { leader, step, waited_ms } => state.log(format!(
            "audit: no other leader replaced node {leader} in {:.0} s (nobody confirmed that its contribution to step {step} was wrong): this node follows it again",
            waited_ms as f64 / 1000.0
        )),
        Event::Disputing { step, target, evidence } if evidence.is_the_fingerprints() => state.log(format!(
            "fingerprints: node {target}'s sum in step {step} disputed ({evidence}): its authors' pieces asked for, the sum recomputed"
        )),
        Event::Disputing { step, target, evidence } if evidence.is_the_guards() => state.log(format!(
            "guard: node {target}'s contribution to step {step} was computed from other weights ({evidence}): the leader's own checked against the definition's update, it is asked where its part; it is not summed meanwhile"
        )),
        Event::Disputing { step, target, evidence } => state.log(format!(
            "audit: node {target}'s contribution to step {step} departs ({evidence}): narrowing it to one op of its step before the verdict; it is not summed meanwhile"
        )),
        Event::AuditFailed { step, target, error } => {
            state.log(format!("audit of node {target}'s contribution to step {step} not done: {error}"))
        }
        Event::SumCheckFailed { step, chunk, owner } => state.log(format!(
            "fingerprints: chunk {chunk} of step {step} does not add up to its owner's sum (node {owner}): the leader recomputes it"
        )),
        Event::SumSettled { step, chunk, owner } => state.log(format!(
            "fingerprints: node {owner}'s sum of chunk {chunk} of step {step}, recomputed, and the fingerprints held of it are right: nobody convicted"
        )),
        Event::PrintsRecomputed { step, author } => state.log(format!(
            "fingerprints: node {author}'s of step {step} never came: computed from its chunks and the step checked with them"
        )),
        Event::SumUnsettled { step, chunk, owner } => state.log(format!(
            "fingerprints: the pieces of chunk {chunk} of step {step} (node {owner}'s) did not come in time: the dispute is given up"
        )),
        Event::Problem(problem) => {
            state.log(format!("error: {problem}"));
            if let Problem::Stopped(stop) = problem {
                state.node.run_state = RunState::Stopped(stop);
            }
        }
    }
}
