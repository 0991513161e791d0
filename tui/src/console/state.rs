//! The console's state, the actions that change it, and `update`: the only mutator.
//!
//! Everything here is pure: reports and keys come in as [`Action`]s stamped with the time,
//! requests for the outside world go out as [`Effect`]s. The loop in `console/mod.rs` does the
//! I/O; `console/view.rs` only reads.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;

use lockstep_mesh::{CheckpointTarget, Command, Report, SwapProgress};
use lockstep_node::config::RunConfig;
use lockstep_node::session::Event;
use lockstep_node::verdict::Verdict;
use lockstep_node::wire::PeerId;

/// Log lines kept.
const LOG_LINES: usize = 500;
/// A line equal to one of the last this many is not repeated: that line is counted and moves
/// to the end (a chatty peer's messages, repeated every few seconds, stay readable).
const COALESCE_WINDOW: usize = 6;
/// Loss points kept for the chart (older ones are thinned, never the latest).
const LOSS_POINTS: usize = 1200;
/// Window for steps/s.
const RATE_WINDOW_S: f64 = 10.0;

/// Keys, already decoded from the terminal (one keymap: `console/mod.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Enter,
    Esc,
    Tab,
    BackTab,
    Up,
    Down,
    Backspace,
}

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

/// The panes `Tab` cycles through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pane {
    Roster,
    Health,
    Room,
    Checkpoints,
    Backends,
    Log,
}

pub const PANES: [Pane; 6] = [Pane::Roster, Pane::Health, Pane::Room, Pane::Checkpoints, Pane::Backends, Pane::Log];

impl Pane {
    pub fn title(self) -> &'static str {
        match self {
            Pane::Roster => "Roster",
            Pane::Health => "Step health",
            Pane::Room => "Room",
            Pane::Checkpoints => "Checkpoints",
            Pane::Backends => "Backends",
            Pane::Log => "Log",
        }
    }
}

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

/// A peer's connection as the console sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Joining,
    Open,
    Left,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PeerRow {
    pub backend: Option<String>,
    pub verdict: Option<Verdict>,
    pub link: Link,
    /// Last step whose weight and probe hashes matched (the guard passed), or the mismatch.
    pub agreed_at: Option<u32>,
    pub weight_mismatch: bool,
    pub probe_mismatch: bool,
    pub in_roster: bool,
    pub rtt_ms: Option<f64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub repairs: u32,
}

impl PeerRow {
    fn new(link: Link) -> Self {
        PeerRow {
            backend: None,
            verdict: None,
            link,
            agreed_at: None,
            weight_mismatch: false,
            probe_mismatch: false,
            in_roster: false,
            rtt_ms: None,
            bytes_in: 0,
            bytes_out: 0,
            repairs: 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointRow {
    pub path: PathBuf,
    pub step: u32,
    pub whash: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BackendRow {
    pub name: String,
    /// `None` while the survey is still gating it.
    pub verdict: Option<Verdict>,
    /// The plugin's own description of its device (empty when unknown).
    pub device: String,
}

/// One log line: when it last happened, what, and how many times in a row (see
/// [`COALESCE_WINDOW`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    /// Seconds since the console started.
    pub at: f64,
    pub text: String,
    pub count: u32,
}

impl std::fmt::Display for LogLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stamp = self.at as u64;
        write!(f, "{:02}:{:02} {}", stamp / 60, stamp % 60, self.text)?;
        if self.count > 1 {
            write!(f, " (×{})", self.count)?;
        }
        Ok(())
    }
}

/// The run's health.
#[derive(Clone, Debug, PartialEq)]
pub enum RunState {
    /// No run yet.
    Idle,
    /// A start was asked for; waiting for the group.
    Starting,
    Running,
    Finished,
    Stopped(String),
}

#[derive(Clone, Debug)]
pub struct State {
    pub me: Option<PeerId>,
    pub group: String,
    pub host: Option<PeerId>,
    pub leader: Option<PeerId>,
    /// Everyone we know of, us included.
    pub peers: BTreeMap<PeerId, PeerRow>,
    pub pending: Vec<(PeerId, String)>,
    pub waiting_for_host: bool,
    /// The signaling server is gone (the mesh trains on; joins wait for it).
    pub signal_lost: bool,
    /// What `s` starts.
    pub start_settings: RunConfig,
    pub run: Option<RunConfig>,
    pub run_state: RunState,
    pub step: u32,
    pub whash: Option<u32>,
    pub losses: Vec<(f64, f64)>,
    /// (time, step) samples for the rate.
    pub step_times: VecDeque<(f64, u32)>,
    pub compute_ms: f64,
    pub hash_guard_ms: f64,
    pub exchange_ms: f64,
    /// Bytes this node sent in the last step (sync), and the share of its time computing.
    pub sent_bytes: u64,
    pub utilization: f64,
    pub backend: String,
    pub verdict: Verdict,
    /// The hot-swap in progress, as one line.
    pub swap: Option<String>,
    pub ckpt_dir: PathBuf,
    pub checkpoints: Vec<CheckpointRow>,
    pub ckpt_selected: usize,
    pub backends: Vec<BackendRow>,
    pub backend_selected: usize,
    pub log: VecDeque<LogLine>,
    pub focus: Pane,
    pub modal: Option<Modal>,
    pub trusted: BTreeSet<PeerId>,
    /// Demo: start the run once this many members (us included) have open channels.
    pub autostart: Option<usize>,
    pub now: f64,
}

impl State {
    /// `backend` computes here, admitted with `verdict` on `device`.
    pub fn new(backend: &str, verdict: &Verdict, device: &str, start_settings: RunConfig, ckpt_dir: PathBuf) -> Self {
        State {
            me: None,
            group: "connecting…".into(),
            host: None,
            leader: None,
            peers: BTreeMap::new(),
            pending: Vec::new(),
            waiting_for_host: false,
            signal_lost: false,
            start_settings,
            run: None,
            run_state: RunState::Idle,
            step: 0,
            whash: None,
            losses: Vec::new(),
            step_times: VecDeque::new(),
            compute_ms: 0.0,
            hash_guard_ms: 0.0,
            exchange_ms: 0.0,
            sent_bytes: 0,
            utilization: 0.0,
            backend: backend.to_string(),
            verdict: verdict.clone(),
            swap: None,
            ckpt_dir,
            checkpoints: Vec::new(),
            ckpt_selected: 0,
            backends: ["cpu", "lut", "dp4a"]
                .iter()
                .map(|&name| BackendRow {
                    name: name.to_string(),
                    verdict: (name == backend).then(|| verdict.clone()),
                    device: if name == backend { device.to_string() } else { String::new() },
                })
                .collect(),
            backend_selected: 0,
            log: VecDeque::new(),
            focus: Pane::Roster,
            modal: None,
            trusted: BTreeSet::new(),
            autostart: None,
            now: 0.0,
        }
    }

    /// Steps per second over the last few seconds.
    pub fn steps_per_second(&self) -> Option<f64> {
        let (&(t0, s0), &(t1, s1)) = (self.step_times.front()?, self.step_times.back()?);
        (t1 > t0 && s1 > s0).then(|| f64::from(s1 - s0) / (t1 - t0))
    }

    /// Tokens per second through the whole group (every roster member's batch).
    pub fn tokens_per_second(&self) -> Option<f64> {
        let run = self.run.as_ref()?;
        // A session step is a sync: `H` optimizer steps in `outer:H`.
        let per_step = run.tokens_per_step() as f64
            * f64::from(run.steps_per_sync())
            * self.peers.values().filter(|p| p.in_roster).count().max(1) as f64;
        Some(self.steps_per_second()? * per_step)
    }

    pub fn is_leader(&self) -> bool {
        self.me.is_some() && self.me == self.leader
    }

    pub fn is_host(&self) -> bool {
        self.me.is_some() && self.me == self.host
    }

    fn running(&self) -> bool {
        matches!(self.run_state, RunState::Running | RunState::Starting)
    }

    fn log(&mut self, line: impl Into<String>) {
        let text = line.into();
        let recent = self.log.len().saturating_sub(COALESCE_WINDOW);
        let repeated = self.log.iter().skip(recent).position(|l| l.text == text).map(|i| recent + i);
        let count = match repeated.and_then(|i| self.log.remove(i)) {
            Some(earlier) => earlier.count + 1,
            None => 1,
        };
        self.log.push_back(LogLine { at: self.now, text, count });
        while self.log.len() > LOG_LINES {
            self.log.pop_front();
        }
    }

    fn peer(&mut self, id: PeerId) -> &mut PeerRow {
        self.peers.entry(id).or_insert_with(|| PeerRow::new(Link::Joining))
    }

    /// Opens the next approval, if one waits and nothing else is open.
    fn next_approval(&mut self) {
        if self.modal.is_none() {
            if let Some((peer, address)) = self.pending.first().cloned() {
                self.modal = Some(Modal::Approve { peer, address });
            }
        }
    }

    fn open_channels(&self) -> usize {
        self.peers.values().filter(|p| p.link == Link::Open).count()
    }
}

/// The only mutator: applies `action`, returns what the loop should do.
pub fn update(state: &mut State, action: Action) -> Vec<Effect> {
    let mut effects = Vec::new();
    match action {
        Action::Key(key) => on_key(state, key, &mut effects),
        Action::Report(report, at) => {
            state.now = state.now.max(at);
            on_report(state, report, &mut effects);
        }
        Action::Tick(now) => {
            state.now = state.now.max(now);
            while state.step_times.len() > 2 && state.step_times.front().is_some_and(|&(t, _)| now - t > RATE_WINDOW_S)
            {
                state.step_times.pop_front();
            }
        }
        Action::CheckpointsFound(rows) => {
            for row in rows {
                if !state.checkpoints.iter().any(|c| c.path == row.path) {
                    state.checkpoints.push(row);
                }
            }
        }
        Action::BackendVerdict { name, verdict, device } => match state.backends.iter_mut().find(|b| b.name == name) {
            Some(row) => {
                row.verdict = Some(verdict);
                row.device = device;
            }
            None => state.backends.push(BackendRow { name, verdict: Some(verdict), device }),
        },
        Action::TrustJoiner(peer) => {
            state.trusted.insert(peer);
            if state.pending.iter().any(|(p, _)| *p == peer) {
                approve(state, peer, &mut effects);
            }
        }
        Action::Log(line) => state.log(line),
        Action::CheckpointLoaded(Ok(row)) => {
            state.log(format!("loaded {} (step {}, whash {:#010x})", row.path.display(), row.step, row.whash));
            state.checkpoints.retain(|c| c.path != row.path);
            state.checkpoints.push(row);
            state.ckpt_selected = state.checkpoints.len() - 1;
            state.focus = Pane::Checkpoints;
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
    state.pending.retain(|(p, _)| *p != peer);
    if matches!(state.modal, Some(Modal::Approve { peer: p, .. }) if p == peer) {
        state.modal = None;
        state.next_approval();
    }
}

fn move_selection(selected: &mut usize, len: usize, down: bool) {
    if len == 0 {
        *selected = 0;
    } else if down {
        *selected = (*selected + 1).min(len - 1);
    } else {
        *selected = selected.saturating_sub(1);
    }
}

fn on_key(state: &mut State, key: Key, effects: &mut Vec<Effect>) {
    if let Some(modal) = state.modal.clone() {
        match modal {
            Modal::Help => {
                if matches!(key, Key::Esc | Key::Enter | Key::Char('?') | Key::Char('q')) {
                    state.modal = None;
                    state.next_approval();
                }
            }
            Modal::Approve { peer, .. } => match key {
                Key::Char('y') | Key::Char('a') => approve(state, peer, effects),
                Key::Char('n') | Key::Char('d') => {
                    state.log(format!("denied peer {peer}"));
                    effects.push(Effect::Mesh(Command::Deny { peer, reason: DENY_REASON.into() }));
                    settle_request(state, peer);
                }
                // Decide later: the request stays in the Room pane (`a` reopens it).
                Key::Esc => state.modal = None,
                _ => {}
            },
            Modal::Swap { mut selected, typing } => match (typing, key) {
                (Some(mut path), Key::Char(c)) => {
                    path.push(c);
                    state.modal = Some(Modal::Swap { selected, typing: Some(path) });
                }
                (Some(mut path), Key::Backspace) => {
                    path.pop();
                    state.modal = Some(Modal::Swap { selected, typing: Some(path) });
                }
                (Some(path), Key::Enter) => {
                    state.modal = None;
                    if !path.trim().is_empty() {
                        start_swap(state, path.trim().to_string(), effects);
                    }
                }
                (Some(_), Key::Esc) => state.modal = Some(Modal::Swap { selected, typing: None }),
                (Some(_), _) => {}
                (None, Key::Up | Key::Down) => {
                    move_selection(&mut selected, state.backends.len(), key == Key::Down);
                    state.modal = Some(Modal::Swap { selected, typing: None });
                }
                (None, Key::Char('p') | Key::Char('/')) => {
                    state.modal = Some(Modal::Swap { selected, typing: Some(String::new()) })
                }
                (None, Key::Enter) => {
                    state.modal = None;
                    if let Some(row) = state.backends.get(selected) {
                        let name = row.name.clone();
                        start_swap(state, name, effects);
                    }
                }
                (None, Key::Esc | Key::Char('q')) => state.modal = None,
                (None, _) => {}
            },
            Modal::ConfirmBroadcast(row) => match key {
                Key::Char('y') | Key::Enter => {
                    state.modal = None;
                    state.log(format!(
                        "broadcasting {} (step {}, whash {:#010x})",
                        row.path.display(),
                        row.step,
                        row.whash
                    ));
                    effects.push(Effect::Broadcast(row.path));
                }
                Key::Char('n') | Key::Esc => state.modal = None,
                _ => {}
            },
            Modal::LoadPath(mut path) => match key {
                Key::Char(c) => {
                    path.push(c);
                    state.modal = Some(Modal::LoadPath(path));
                }
                Key::Backspace => {
                    path.pop();
                    state.modal = Some(Modal::LoadPath(path));
                }
                Key::Enter => {
                    state.modal = None;
                    if !path.trim().is_empty() {
                        effects.push(Effect::Inspect(PathBuf::from(path.trim())));
                    }
                }
                Key::Esc => state.modal = None,
                _ => {}
            },
            Modal::KickPeer(mut typed) => match key {
                Key::Char(c) if c.is_ascii_digit() => {
                    typed.push(c);
                    state.modal = Some(Modal::KickPeer(typed));
                }
                Key::Backspace => {
                    typed.pop();
                    state.modal = Some(Modal::KickPeer(typed));
                }
                Key::Enter => match typed.parse::<PeerId>() {
                    Ok(peer) if state.peers.contains_key(&peer) && state.me != Some(peer) => {
                        state.modal = Some(Modal::ConfirmKick(peer));
                    }
                    _ => {
                        state.modal = None;
                        state.log(format!("no other member is node {typed}"));
                    }
                },
                Key::Esc => state.modal = None,
                _ => state.modal = Some(Modal::KickPeer(typed)),
            },
            Modal::ConfirmKick(peer) => match key {
                Key::Char('y') => {
                    state.modal = None;
                    state.log(format!("removing node {peer} from the run"));
                    let why = "the console's operator removed it".to_string();
                    effects.push(Effect::Mesh(Command::Kick { peer, why }));
                }
                Key::Char('n') | Key::Esc => state.modal = None,
                _ => state.modal = Some(Modal::ConfirmKick(peer)),
            },
            Modal::ConfirmStart => match key {
                Key::Char('y') | Key::Enter => {
                    state.modal = None;
                    start_run(state, effects);
                }
                Key::Char('n') | Key::Esc => state.modal = None,
                _ => {}
            },
            Modal::ConfirmQuit => match key {
                Key::Char('y') | Key::Char('q') => {
                    effects.push(Effect::Quit);
                }
                Key::Char('n') | Key::Esc => state.modal = None,
                _ => {}
            },
        }
        return;
    }
    match key {
        Key::Char('q') => {
            if state.running() {
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
        Key::Up | Key::Down => match state.focus {
            Pane::Checkpoints => move_selection(&mut state.ckpt_selected, state.checkpoints.len(), key == Key::Down),
            Pane::Backends => move_selection(&mut state.backend_selected, state.backends.len(), key == Key::Down),
            _ => {}
        },
        Key::Enter => match state.focus {
            Pane::Checkpoints => open_broadcast(state),
            Pane::Backends => state.modal = Some(Modal::Swap { selected: state.backend_selected, typing: None }),
            Pane::Room => state.next_approval(),
            _ => {}
        },
        Key::Char('a') => {
            if state.pending.is_empty() {
                state.log("no join request is waiting");
            }
            state.next_approval();
        }
        Key::Char('s') => {
            if state.running() {
                state.log("a run is already going");
            } else if state.me.is_none() {
                state.log("not connected to the group yet");
            } else {
                state.modal = Some(Modal::ConfirmStart);
            }
        }
        Key::Char('w') => {
            if state.swap.is_some() {
                state.log("a swap is already in progress");
            } else {
                let selected = state.backends.iter().position(|b| b.name == state.backend).unwrap_or(0);
                state.modal = Some(Modal::Swap { selected, typing: None });
            }
        }
        Key::Char('c') => {
            if state.run.is_none() {
                state.log("nothing to save: no run yet");
            } else {
                state.log(format!("saving a checkpoint in {}", state.ckpt_dir.display()));
                effects.push(Effect::Mesh(Command::SaveCheckpoint(CheckpointTarget::InDir(state.ckpt_dir.clone()))));
            }
        }
        Key::Char('b') => {
            state.focus = Pane::Checkpoints;
            open_broadcast(state);
        }
        Key::Char('l') => state.modal = Some(Modal::LoadPath(String::new())),
        Key::Char('k') => {
            if state.is_leader() {
                state.modal = Some(Modal::KickPeer(String::new()));
            } else {
                state.log("only the run's leader removes members (k on the leader's console)");
            }
        }
        _ => {}
    }
}

fn open_broadcast(state: &mut State) {
    if state.run.is_none() {
        state.log("broadcast needs a run: every node restores into its running model");
    } else if let Some(row) = state.checkpoints.get(state.ckpt_selected).cloned() {
        state.modal = Some(Modal::ConfirmBroadcast(row));
    } else {
        state.log("no checkpoint to broadcast: save one with `c`");
    }
}

fn start_swap(state: &mut State, name: String, effects: &mut Vec<Effect>) {
    state.swap = Some(format!("{name}: loading"));
    state.log(format!("swap to `{name}`: gating"));
    effects.push(Effect::Swap(name));
}

fn start_run(state: &mut State, effects: &mut Vec<Effect>) {
    state.run_state = RunState::Starting;
    let s = &state.start_settings;
    state.log(format!(
        "starting a run: c={} t={} layers={} heads={} batch={} steps={} lr={} seed={} sync {}",
        s.model.width, s.model.context, s.model.layers, s.model.heads, s.batch, s.steps, s.lr, s.seed, s.sync
    ));
    effects.push(Effect::Mesh(Command::Start(state.start_settings)));
}

fn on_report(state: &mut State, report: Report, effects: &mut Vec<Effect>) {
    match report {
        Report::Connected { id, members, group, host } => {
            state.me = Some(id);
            state.group = group.clone();
            state.host = Some(host);
            state.waiting_for_host = false;
            for member in members {
                let link = if member == id { Link::Open } else { Link::Joining };
                state.peer(member).link = link;
            }
            let verdict = state.verdict.clone();
            let backend = state.backend.clone();
            let row = state.peer(id);
            row.backend = Some(backend);
            row.verdict = Some(verdict);
            state.log(format!("joined {group} as node {id}"));
        }
        Report::Waiting { id, room } => {
            state.waiting_for_host = true;
            state.me = Some(id);
            state.group = format!("room {room}");
            state.log(format!("waiting for the host of room {room} to approve us (node {id})"));
        }
        Report::JoinRequest { peer, address } => {
            if state.trusted.contains(&peer) {
                approve(state, peer, effects);
            } else {
                state.log(format!("join request from node {peer} at {address}"));
                state.pending.push((peer, address));
                state.next_approval();
            }
        }
        Report::HostChanged(host) => {
            state.host = Some(host);
            state.log(format!("node {host} is the room's host now"));
        }
        Report::Denied(reason) => {
            state.waiting_for_host = false;
            state.log(format!("denied: {reason}"));
        }
        Report::SignalPeerLeft(peer) => {
            if state.pending.iter().any(|(p, _)| *p == peer) {
                state.log(format!("node {peer} gave up waiting"));
                settle_request(state, peer);
            }
            if let Some(row) = state.peers.get_mut(&peer) {
                row.link = Link::Left;
                row.in_roster = false;
            }
        }
        Report::ChannelOpen(peer) => {
            state.peer(peer).link = Link::Open;
            state.log(format!("channel to node {peer} open"));
            if let Some(wanted) = state.autostart {
                if state.run.is_none() && state.run_state == RunState::Idle && state.open_channels() >= wanted {
                    state.autostart = None;
                    start_run(state, effects);
                }
            }
        }
        Report::PeerInfo { peer, backend, verdict } => {
            let row = state.peer(peer);
            let changed = row.backend.as_deref().is_some_and(|b| b != backend);
            row.backend = Some(backend.clone());
            row.verdict = Some(verdict);
            if changed {
                state.log(format!("node {peer} now computes with `{backend}`"));
            }
        }
        Report::Link { peer, rtt_ms, bytes_in, bytes_out } => {
            let row = state.peer(peer);
            row.rtt_ms = rtt_ms;
            row.bytes_in = bytes_in;
            row.bytes_out = bytes_out;
        }
        Report::Swap(progress) => match progress {
            SwapProgress::Gating { backend, done, total } => {
                state.swap = Some(if total == 0 {
                    format!("{backend}: loading")
                } else {
                    format!("{backend}: gate {done}/{total}")
                });
            }
            SwapProgress::Staged { backend, verdict } => {
                state.swap = Some(format!("{backend}: admitted, takes over at the next step"));
                state.log(format!("swap: {verdict}"));
            }
            SwapProgress::Refused { backend, verdict } => {
                state.swap = None;
                state.log(format!("swap to `{backend}` refused, keeping `{}`: {verdict}", state.backend));
            }
        },
        Report::BackendSwapped(change) => {
            state.swap = None;
            state.backend = change.backend.clone();
            state.verdict = change.verdict.clone();
            if let Some(me) = state.me {
                let row = state.peer(me);
                row.backend = Some(change.backend.clone());
                row.verdict = Some(change.verdict);
            }
            state.log(format!("now computing with `{}` from step {}", change.backend, change.step));
        }
        Report::CheckpointSaved { path, step, whash } => {
            state.log(format!("saved {} (step {step}, whash {whash:#010x})", path.display()));
            state.checkpoints.retain(|c| c.path != path);
            state.checkpoints.push(CheckpointRow { path, step, whash });
            state.ckpt_selected = state.checkpoints.len() - 1;
        }
        Report::Applied { step, whash, timing } => {
            state.whash = Some(whash);
            state.step = step;
            state.compute_ms = timing.compute * 1e3;
            state.hash_guard_ms = timing.hash_guard * 1e3;
            state.exchange_ms = timing.exchange * 1e3;
            state.sent_bytes = timing.sent_bytes;
            state.utilization = timing.utilization();
            state.step_times.push_back((state.now, step));
        }
        Report::Restored { step, whash } => {
            state.whash = Some(whash);
            state.step = step;
            state.step_times.clear();
            state.log(format!("restored: step {step}, whash {whash:#010x}"));
        }
        Report::Warning(message) => state.log(format!("warning: {message}")),
        Report::SignalLost { why, .. } => {
            state.signal_lost = true;
            state.log(format!("signaling server gone ({why}); training goes on over the data channels, reconnecting"));
        }
        Report::SignalRestored { group, host } => {
            state.signal_lost = false;
            state.host = Some(host);
            state.log(format!("signaling server back: our place in {group} is restored, host node {host}"));
        }
        Report::Session(event) => on_event(state, event),
    }
}

fn on_event(state: &mut State, event: Event) {
    match event {
        Event::PeerJoined(peer) => {
            state.peer(peer);
            state.log(format!("node {peer} joined the session"));
        }
        Event::PeerLeft(peer) => {
            let row = state.peer(peer);
            row.link = Link::Left;
            row.in_roster = false;
            state.log(format!("node {peer} left"));
        }
        Event::Leader(peer) => {
            state.leader = Some(peer);
            state.log(format!("node {peer} leads now"));
        }
        Event::RunStarted { leader, settings } => {
            state.leader = Some(leader);
            state.log(format!(
                "run started by node {leader}: c={} t={} layers={} batch={} steps={} sync {}",
                settings.model.width,
                settings.model.context,
                settings.model.layers,
                settings.batch,
                settings.steps,
                settings.sync
            ));
            state.run = Some(settings);
            state.run_state = RunState::Running;
            state.losses.clear();
            state.step_times.clear();
            state.step = 0;
            for row in state.peers.values_mut() {
                row.weight_mismatch = false;
                row.probe_mismatch = false;
                row.agreed_at = None;
            }
        }
        Event::Roster { peers, .. } => {
            for row in state.peers.values_mut() {
                row.in_roster = false;
            }
            for peer in peers {
                state.peer(peer).in_roster = true;
            }
        }
        Event::StepApplied { step, loss, .. } => {
            state.step = step;
            state.losses.push((f64::from(step), f64::from(loss)));
            if state.losses.len() > LOSS_POINTS {
                // Thin the older half, keep the recent half whole.
                let half = state.losses.len() / 2;
                let mut kept: Vec<(f64, f64)> = state.losses[..half].iter().step_by(2).copied().collect();
                kept.extend_from_slice(&state.losses[half..]);
                state.losses = kept;
            }
            for row in state.peers.values_mut().filter(|r| r.in_roster) {
                row.agreed_at = Some(step);
            }
        }
        Event::RepairRequested { step, peer } => {
            state.log(format!("step {step}: asked the leader for node {peer}'s gradient"))
        }
        Event::Repaired { step, peer } => {
            state.peer(peer).repairs += 1;
            state.log(format!("step {step}: node {peer}'s gradient repaired by the leader"));
        }
        Event::RepairServed { step, peer, to } => {
            state.peer(to).repairs += 1;
            state.log(format!("step {step}: re-sent node {peer}'s gradient to node {to}"));
        }
        Event::Resumed { step } => state.log(format!("resumed at step {step}")),
        Event::CheckpointRestored { from, step } => {
            state.log(format!("checkpoint from node {from} restored the group at step {step}"))
        }
        Event::GuardStopped(failure) => {
            for peer in &failure.weight_mismatch {
                state.peer(*peer).weight_mismatch = true;
            }
            for peer in &failure.probe_mismatch {
                state.peer(*peer).probe_mismatch = true;
            }
            state.log(failure.to_string());
            state.run_state = RunState::Stopped(failure.to_string());
        }
        Event::RunFinished { step } => {
            state.run_state = RunState::Finished;
            state.log(format!("run finished at step {step}"));
        }
        Event::Ignored { from, why } => state.log(format!("ignored from node {from}: {why}")),
        Event::Dropped { peer, step, why } => {
            state.peer(peer).in_roster = false;
            state.log(format!("dropped node {peer} at step {step}: {why}"));
        }
        Event::Readmitted(peer) => state.log(format!("node {peer} answers again: resumed at the next step")),
        Event::PushRefused { from } => {
            state.log(format!("refused node {from}'s checkpoint push: only the run's leader may push"))
        }
        Event::ContributionRefused { peer, step, why } => {
            state.log(format!("refused node {peer}'s contribution to step {step}: {why}"))
        }
        Event::Removed { step, why } => {
            state.log(format!("the leader took this node out of the run at step {step}: {why}"))
        }
        Event::Problem(problem) => state.log(format!("error: {problem}")),
    }
}
