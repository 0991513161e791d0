//! The mesh session core: a state machine without I/O (`docs/ARCHITECTURE.md`, invariant 2)
//! that turns connections, messages, compute results and ticks into messages to send, compute to
//! launch, steps to apply and events. It never reads a clock, touches a socket or runs the model.
//!
//! The adapter feeds [`Input`]s to [`Session::handle`] and executes the returned [`Output`]s **in
//! order**. Three outputs are requests the adapter must answer before it feeds anything else:
//! `Configure` with `Configured` (or `Failed`), `Restore` with `Restored` (or `Failed`), and
//! `Compute` — whose answer, `Computed`, may come later, interleaved with other inputs. A
//! computation still under way when the adapter executes a `Restore` or `Configure` belongs to
//! the state before it: the adapter drops its result. [`Session::next_tick_ms`] says when the
//! session next needs a tick.
//!
//! # The protocol as this core runs it
//!
//! - **Agreement is a Raft log** (`agreement.rs`, raft-rs): one run, one log, whose leader is
//!   the run's leader. Every decision the members share is an entry (`log.rs`): the run's
//!   settings, each step's commit record, each checkpoint push, each change of who votes and who
//!   learns. **Nobody applies a step before its record is committed** — replicated on a majority
//!   of the voters — the leader included. A member that cannot reach a majority commits
//!   nothing and says so ([`Event::NoMajority`]); it goes on when the partition heals, from what
//!   the log committed meanwhile.
//! - **A step**: every member in the configuration whose weights hold everything the log
//!   committed computes the next step at once and sends its contribution
//!   `[step][whash][phash][loss][values]` to every other member. The leader waits for the
//!   members it waits for (`roster.rs`) — until the step deadline at most — then proposes the
//!   step's record: the contributions it holds, by digest, in ascending id order, and the
//!   weight hash they were computed from. Once the record commits, every member sums exactly
//!   those contributions in that order and applies the mean; one it lacks is repaired (`-7`/`-8`)
//!   from the leader or its author — any copy will do, the digest says which is right.
//! - **Guard**: every contribution a record sums was computed from the record's weights with a
//!   healthy probe, and so was ours; otherwise the run stops here, naming the peers.
//! - **Membership** is the log's configuration (`roster.rs`): members join as learners, vote
//!   once they keep up, stop voting when they miss deadlines (where three voters remain), and
//!   leave when they quit, are forgotten or kicked. Members that cannot compute are observers.
//! - **Behind**: a member whose weights are behind the log, with the contributions to catch up
//!   gone (a snapshot, a long sleep, a join), asks the leader for a resume (`-20`); the leader
//!   sends one (`-6`, a checkpoint of everything that determines the next update) at its next
//!   step boundary, each member waiting longer between two.
//! - **Checkpoint push** (`-2`): only the run's leader may push: it sends the bytes to every
//!   member and proposes the push's entry (its digest); once committed, every member restores
//!   the bytes it holds (or asks for a resume). **Epochs** (`epoch.rs`) keep contributions from
//!   before a push out of the steps after it.
//! - **Time** arrives in ticks: the Raft clock, the step deadline, repairs. A gap between two
//!   ticks longer than half an election timeout means this node slept: its clocks skip the gap.
//! - Duplicate, late, early and outsider messages are ignored and counted.

mod agreement;
mod epoch;
mod events;
pub mod log;
mod roster;
mod step;
mod timing;
mod window;

use std::collections::{BTreeSet, VecDeque};

pub use agreement::{AgreementError, AgreementTiming, Change, Committed, KEPT_ENTRIES};
pub use events::{DropReason, Event, Failure, LeaderAction, Problem, Stop, Task};
pub use roster::{Standing, GONE_MS, MIN_VOTERS};
pub use step::{GuardFailure, Offer, RETAINED_STEPS};
pub use timing::StepDeadline;

use agreement::Agreement;
use epoch::{Admitted, Epochs};
use log::{LogEntry, Named, StepRecord};
use roster::Roster;
use step::Contributions;
use timing::Timing;
use window::Window;

use crate::config::RunConfig;
use crate::wire::{Epoch, Gradient, Message, PeerId, Removal, MESH_PROTOCOL_VERSION};

/// Committed entries a member holds for its weights to take (beyond them it needs a resume).
const MAX_QUEUED: usize = 1024;
/// Repair requests for one step before a member asks for a resume instead.
const REPAIRS_BEFORE_RESUME: u32 = 4;
/// How often a member behind the log asks again for its resume.
const CATCH_UP_AGAIN_MS: u64 = 3_000;
/// A learner that has sent no contribution for this many steps (past as many since it joined
/// the configuration) is sent none: it follows by resumes, and a member that never computes
/// costs its group no bandwidth.
const QUIET_STEPS: u32 = 8;

/// What the adapter feeds the session.
#[derive(Clone, Debug)]
pub enum Input {
    /// A data channel to `peer` is open.
    Connected(PeerId),
    /// The channel to `peer` is gone.
    Disconnected(PeerId),
    /// What `peer` said computes on it (`-9`): whether it can compute.
    PeerInfo { peer: PeerId, computes: bool },
    /// A decoded, reassembled message from `from`.
    Received { from: PeerId, message: Message },
    /// Our contribution to a step we were asked to compute (`whash`: our weights before it).
    Computed(Gradient),
    /// Answer to `Output::Configure`: a fresh model with `weights` parameters.
    Configured { weights: usize },
    /// Answer to `Output::Restore`: the state now is the checkpoint's, `step` steps done.
    Restored { step: u32, weights: usize },
    /// A task failed: a `Configure` or `Restore` (the session reports it and stays as it was),
    /// or a `Compute` (this node stops contributing and says so).
    Failed { task: Task, error: Failure },
    /// Time passes (milliseconds on any monotonic clock).
    Tick { now_ms: u64 },
    /// The user starts a run; this node leads it.
    Start(RunConfig),
    /// The user pushes a checkpoint to the whole group (leader only).
    PushCheckpoint { bytes: Vec<u8> },
    /// The user removes `peer` from the run (leader only): it is told why and stays out.
    Kick { peer: PeerId, why: String },
    /// The user vouches that `peer` is gone for good (leader only): it leaves the configuration.
    Forget { peer: PeerId },
    /// This node quits on purpose: it tells every member, and a leader hands the lead on first.
    Quit,
}

/// What the session asks the adapter to do, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    Send {
        to: PeerId,
        message: Message,
    },
    /// Build a fresh model and optimizer from the settings; answer `Configured`.
    Configure(RunConfig),
    /// Compute our contribution to `step` at the current weights; answer `Computed`. `cap`:
    /// elastic windows, the inner steps after which the window ends by itself (`u32::MAX`:
    /// all `H`, unless hurried).
    Compute {
        step: u32,
        cap: u32,
    },
    /// End sync `step` with the group's mean (`grid`: the grid it was summed on, packed
    /// contributions only): one optimizer update (`every-step`) or one outer step (`outer:H`).
    /// `ours`: whether the mean sums our contribution (a member the step went on without keeps
    /// its own for the next, `sync::Strategy::finish`).
    Apply {
        step: u32,
        mean: Vec<f32>,
        grid: Vec<u8>,
        loss: f32,
        ours: bool,
    },
    /// Send `to` a resume message (-6) with a checkpoint of the current state (a step boundary).
    SendSnapshot {
        to: PeerId,
    },
    /// Replace the state with a checkpoint; answer `Restored`.
    Restore {
        bytes: Vec<u8>,
    },
    /// Elastic windows: another member finished its whole window of `step` first, so ours ends
    /// after the inner step under way (`Compute { step }` is still answered, with the steps
    /// done). Nothing to answer.
    Hurry {
        step: u32,
    },
    Event(Event),
}

/// Settings of one node's session.
#[derive(Clone, Copy, Debug)]
pub struct SessionConfig {
    pub me: PeerId,
    /// The probe hash every healthy backend reports.
    pub expected_phash: u32,
    /// How long a member waits for a contribution a committed record names before it asks for
    /// a repair.
    pub repair_after_ms: u64,
    /// How long the leader waits for a member's contribution before the step goes on without it.
    pub deadline: StepDeadline,
    /// Elastic windows, the leader's rule for slow members: a member whose contributions stood
    /// for a quarter of the window or less in each of its last `slow_windows` syncs is taken out
    /// of the run for good (told why); 0 keeps every member, however slow.
    pub slow_windows: u32,
    /// Whether this node can compute (its backend was admitted). One that cannot is an
    /// observer: it watches a run, never enters its configuration.
    pub computes: bool,
    /// The Raft clock.
    pub agreement: AgreementTiming,
}

/// Why the adapter is owed an answer.
#[derive(Clone, Debug, PartialEq)]
enum Pending {
    Configure,
    /// A resume from the leader, whose epoch it is.
    Resume(Epoch),
    /// A committed push from `from`.
    Push {
        from: PeerId,
        epoch: Epoch,
    },
}

/// A committed entry the weights have yet to take.
#[derive(Clone, Debug)]
enum Queued {
    Step { record: StepRecord, index: u64, term: u64 },
    Push { epoch: Epoch, digest: u64 },
}

/// The step this node computes, and its timing.
#[derive(Clone, Copy, Debug)]
struct Asked {
    step: u32,
    at_ms: u64,
    /// When our contribution was ready, and how long it took.
    ready: Option<(u64, u64)>,
}

/// The repairs of the step waiting for them.
#[derive(Clone, Copy, Debug, Default)]
struct Repairs {
    step: u32,
    last_ms: Option<u64>,
    attempts: u32,
}

/// The session state machine. See the module docs.
pub struct Session {
    config: SessionConfig,
    timing: Timing,
    /// Peers whose data channel is open.
    members: BTreeSet<PeerId>,
    roster: Roster,
    epochs: Epochs,
    window: Window,
    /// The run's log (none before a run reached this node).
    agreement: Option<Agreement>,
    run: Option<RunConfig>,
    /// The model is built for the run.
    configured: bool,
    weights: usize,
    /// Steps applied: the weights are the result of `applied` updates.
    applied: u32,
    contributions: Contributions,
    queue: VecDeque<Queued>,
    asked: Option<Asked>,
    /// (Leader) the step proposed in a term.
    proposed: Option<(u64, u32)>,
    /// (Leader) each recent step's deadline: when its members' contributions are due.
    due: VecDeque<(u32, u64)>,
    /// (Leader) when it last asked late members again for their contribution to a step.
    late_asked: Option<(u32, u64)>,
    /// The last step each member contributed to, and the step each joined the configuration
    /// at (who is sent contributions: [`QUIET_STEPS`]).
    contributed: std::collections::BTreeMap<PeerId, u32>,
    joined_at: std::collections::BTreeMap<PeerId, u32>,
    /// (Leader) a push proposed and not yet restored (its digest): nothing else is proposed.
    pushing: Option<u64>,
    /// A push's bytes, held until its entry commits (their digest, and who sent them).
    push_bytes: Option<(u64, Vec<u8>, PeerId)>,
    repairs: Repairs,
    /// Since when this node waits for a resume, and when it last asked.
    catching_up: Option<(u64, u64)>,
    /// Whether this node said it quits.
    quitting: bool,
    /// What this node last said of the leader, and since when it has none.
    told_leader: Option<(PeerId, u64)>,
    leaderless_since: Option<u64>,
    told_no_majority: bool,
    /// Run ids this node started (a counter makes each new).
    runs_started: u64,
    pending: Option<Pending>,
    stopped: Option<Stop>,
    finished: bool,
    ignored: u64,
    out: Vec<Output>,
}

impl Session {
    pub fn new(config: SessionConfig) -> Self {
        Session {
            config,
            timing: Timing::default(),
            members: BTreeSet::new(),
            roster: Roster::default(),
            epochs: Epochs::default(),
            window: Window::default(),
            agreement: None,
            run: None,
            configured: false,
            weights: 0,
            applied: 0,
            contributions: Contributions::new(0, &crate::sync::SyncConfig::SEED),
            queue: VecDeque::new(),
            asked: None,
            proposed: None,
            due: VecDeque::new(),
            late_asked: None,
            contributed: std::collections::BTreeMap::new(),
            joined_at: std::collections::BTreeMap::new(),
            pushing: None,
            push_bytes: None,
            repairs: Repairs::default(),
            catching_up: None,
            quitting: false,
            told_leader: None,
            leaderless_since: None,
            told_no_majority: false,
            runs_started: 0,
            pending: None,
            stopped: None,
            finished: false,
            ignored: 0,
            out: Vec::new(),
        }
    }

    pub fn me(&self) -> PeerId {
        self.config.me
    }

    /// The run's leader as this node knows it.
    pub fn leader(&self) -> Option<PeerId> {
        self.agreement.as_ref().and_then(Agreement::leader)
    }

    pub fn is_leader(&self) -> bool {
        self.agreement.as_ref().is_some_and(Agreement::is_leader)
    }

    /// The Raft term and commit index of the run's log (0 before a run).
    pub fn term(&self) -> u64 {
        self.agreement.as_ref().map_or(0, Agreement::term)
    }

    pub fn commit_index(&self) -> u64 {
        self.agreement.as_ref().map_or(0, Agreement::commit_index)
    }

    /// The run's voters and learners as this node's log has them.
    pub fn configuration(&self) -> (Vec<PeerId>, Vec<PeerId>) {
        self.agreement.as_ref().map(Agreement::members).unwrap_or_default()
    }

    /// Steps applied so far.
    pub fn applied(&self) -> u32 {
        self.applied
    }

    pub fn members(&self) -> &BTreeSet<PeerId> {
        &self.members
    }

    pub fn run(&self) -> Option<&RunConfig> {
        self.run.as_ref()
    }

    /// Why the run stopped, if something stopped it.
    pub fn stopped(&self) -> Option<&Stop> {
        self.stopped.as_ref()
    }

    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The checkpoint push this node's state descends from.
    pub fn epoch(&self) -> Epoch {
        self.epochs.mine()
    }

    /// Messages ignored so far (duplicates, late, out of range, outsiders), over the run.
    pub fn ignored(&self) -> u64 {
        self.ignored
    }

    /// When the session next needs a tick (ms on the clock its ticks carry).
    pub fn next_tick_ms(&self) -> u64 {
        self.timing.next_tick_ms()
    }

    /// Whether this node holds no place in a run's configuration (it may quit without leaving
    /// a vote behind).
    pub fn out_of_run(&self) -> bool {
        let me = self.config.me;
        self.agreement.as_ref().is_none_or(|a| !a.is_member(me)) || self.stopped.is_some()
    }

    /// Feeds one input; returns what to do, in order.
    pub fn handle(&mut self, input: Input) -> Vec<Output> {
        match input {
            Input::Connected(peer) => self.on_connected(peer),
            Input::Disconnected(peer) => self.on_disconnected(peer),
            Input::PeerInfo { peer, computes } => {
                self.roster.peer_info(peer, computes);
                if !computes {
                    self.event(Event::Observer(peer));
                }
            }
            Input::Received { from, message } => {
                if self.members.contains(&from) {
                    self.on_message(from, message);
                } else {
                    self.ignore(from, "a message from a peer that is not connected");
                }
            }
            Input::Computed(gradient) => self.on_computed(gradient),
            Input::Configured { weights } => self.on_configured(weights),
            Input::Restored { step, weights } => self.on_restored(step, weights),
            Input::Failed { task: Task::Compute { step }, error } => self.stop(Stop::Compute { step, error }),
            Input::Failed { task, error } => {
                if self.pending == Some(Pending::Configure) && self.agreement.is_none() {
                    self.run = None; // the run we were starting did not begin
                }
                self.pending = None;
                self.event(Event::Problem(Problem::Failed { task, error }));
            }
            Input::Tick { now_ms } => self.on_tick(now_ms),
            Input::Start(settings) => self.on_start(settings),
            Input::Kick { peer, why } => self.on_kick(peer, why),
            Input::Forget { peer } => {
                if self.is_leader() {
                    self.roster.forget(peer);
                } else {
                    let leader = self.leader();
                    self.event(Event::Problem(Problem::NotLeader { action: LeaderAction::Forget, leader }));
                }
            }
            Input::PushCheckpoint { bytes } => self.on_push(bytes),
            Input::Quit => self.on_quit(),
        }
        self.advance();
        std::mem::take(&mut self.out)
    }

    fn event(&mut self, event: Event) {
        self.out.push(Output::Event(event));
    }

    fn ignore(&mut self, from: PeerId, why: &str) {
        self.ignored += 1;
        self.event(Event::Ignored { from, why: why.to_string() });
    }

    fn send(&mut self, to: PeerId, message: Message) {
        self.out.push(Output::Send { to, message });
    }

    fn broadcast(&mut self, message: &Message) {
        let members: Vec<PeerId> = self.members.iter().copied().collect();
        for to in members {
            self.send(to, message.clone());
        }
    }

    /// A run is going here that this node is part of (not stopped, not finished).
    fn in_run(&self) -> bool {
        self.run.is_some() && self.stopped.is_none() && !self.finished
    }

    fn stop(&mut self, stop: Stop) {
        if self.stopped.is_none() {
            self.stopped = Some(stop.clone());
            self.event(Event::Problem(Problem::Stopped(stop)));
        }
    }

    fn stop_with(&mut self, failure: GuardFailure) {
        if self.stopped.is_some() {
            return;
        }
        self.stopped = Some(Stop::Guard(failure.clone()));
        self.event(Event::GuardStopped(failure));
    }

    // ---- links and peers ----

    fn on_connected(&mut self, peer: PeerId) {
        if peer == self.config.me || !self.members.insert(peer) {
            return;
        }
        self.roster.connected(peer);
        self.event(Event::PeerJoined(peer));
        // Before anything else on this channel: which push our messages follow.
        self.send(peer, Message::Epoch(self.epochs.mine()));
    }

    fn on_disconnected(&mut self, peer: PeerId) {
        if !self.members.remove(&peer) {
            return;
        }
        self.event(Event::PeerLeft(peer));
        self.epochs.forget(peer);
        self.roster.disconnected(peer, self.timing.now_ms());
        if let Some(agreement) = &mut self.agreement {
            agreement.unreachable(peer);
        }
        if self.is_leader() && self.roster.expected(peer) && self.in_run() {
            // Nothing more will come from it: the step goes on without waiting out a deadline.
            let backoff = self.roster.missed(peer);
            let step = self.applied + 1;
            self.event(Event::Dropped { peer, step, why: DropReason::Disconnected { backoff } });
        }
    }

    fn on_quit(&mut self) {
        if self.agreement.is_none() || self.quitting {
            return;
        }
        self.quitting = true;
        self.broadcast(&Message::Leaving);
        // The next leader takes us out of the configuration.
        self.hand_over_lead();
    }

    /// (Leader) hands the lead to the most caught-up voter it reaches, if any.
    fn hand_over_lead(&mut self) {
        let me = self.config.me;
        let members = self.members.clone();
        let Some(agreement) = self.agreement.as_mut().filter(|a| a.is_leader()) else { return };
        let (voters, _) = agreement.members();
        let next = voters
            .iter()
            .copied()
            .filter(|p| *p != me && members.contains(p))
            .max_by_key(|p| (agreement.has_replicated(*p, agreement.last_index()), std::cmp::Reverse(*p)));
        if let Some(next) = next {
            if let Err(e) = agreement.transfer_lead(next) {
                self.stop(Stop::Agreement(e));
            }
        }
    }

    // ---- starting, configuring, restoring ----

    fn on_start(&mut self, settings: RunConfig) {
        if self.in_run() {
            self.event(Event::Problem(Problem::RunGoing));
            return;
        }
        self.new_run(None);
        self.run = Some(settings);
        self.pending = Some(Pending::Configure);
        self.event(Event::RunStarted { leader: self.config.me, settings });
        self.out.push(Output::Configure(settings));
    }

    /// Everything of the last run goes (its log too, unless `agreement` is the new run's).
    fn new_run(&mut self, agreement: Option<Agreement>) {
        self.agreement = agreement;
        self.run = None;
        self.configured = false;
        self.applied = 0;
        self.queue.clear();
        self.asked = None;
        self.proposed = None;
        self.due.clear();
        self.contributed.clear();
        self.joined_at.clear();
        self.pushing = None;
        self.push_bytes = None;
        self.repairs = Repairs::default();
        self.catching_up = None;
        self.told_leader = None;
        self.leaderless_since = None;
        self.told_no_majority = false;
        self.stopped = None;
        self.finished = false;
        self.pending = None;
        self.roster.new_run();
        self.window = Window::default();
        self.epochs.clear_held();
        self.timing.reset_waits();
    }

    /// A fresh id for a run this node starts (never 0).
    fn new_run_id(&mut self) -> u64 {
        self.runs_started += 1;
        let seed = self.config.me ^ self.timing.now_ms().rotate_left(32) ^ self.runs_started.rotate_left(48);
        lockstep_luts::rng::SplitMix64::new(seed).next_u64() | 1
    }

    fn on_configured(&mut self, weights: usize) {
        if self.pending != Some(Pending::Configure) {
            self.event(Event::Problem(Problem::Unasked(Task::Configure)));
            return;
        }
        self.pending = None;
        let Some(run) = self.run else { return };
        self.weights = weights;
        self.applied = 0;
        self.configured = true;
        self.contributions = Contributions::new(weights, &run.sync);
        if self.agreement.is_none() {
            // We started the run: its log begins here, with its settings.
            let id = self.new_run_id();
            match Agreement::bootstrap(self.config.me, id, self.config.agreement, run) {
                Ok(agreement) => self.agreement = Some(agreement),
                Err(e) => self.stop(Stop::Agreement(e)),
            }
        }
    }

    fn on_restored(&mut self, step: u32, weights: usize) {
        let Some(pending) = self.pending.take() else {
            self.event(Event::Problem(Problem::Unasked(Task::Restore)));
            return;
        };
        self.weights = weights;
        self.applied = step;
        self.contributions.clear();
        self.asked = None;
        // Step numbers come round again after a restore: what was proposed or due was for others.
        self.proposed = None;
        self.due.clear();
        self.catching_up = None;
        self.repairs = Repairs::default();
        let epoch = match pending {
            Pending::Resume(epoch) => {
                self.event(Event::Resumed { step });
                epoch
            }
            Pending::Push { from, epoch } => {
                self.push_bytes = None;
                self.pushing = None;
                self.event(Event::CheckpointRestored { from, step });
                epoch
            }
            Pending::Configure => return,
        };
        // What the weights now hold, the queue no longer needs.
        self.queue.retain(|q| match q {
            Queued::Step { record, .. } => record.step > step,
            Queued::Push { epoch: e, .. } => *e > epoch,
        });
        if self.epochs.enter(epoch) {
            self.broadcast(&Message::Epoch(epoch));
        }
        if self.run.is_some_and(|r| step >= r.syncs()) && !self.finished {
            // Resumed at the run's end: nothing is left to train.
            self.finished = true;
            self.event(Event::RunFinished { step });
        }
        let released = self.epochs.release();
        for (from, epoch) in released.stale {
            self.ignore(from, &format!("a step message from {epoch}, since replaced"));
        }
        for (from, message) in released.now {
            self.dispatch(from, message);
        }
    }

    // ---- the log ----

    /// What raft-rs has ready: messages go out, committed entries are taken in order.
    fn pump(&mut self) {
        let Some(agreement) = &mut self.agreement else { return };
        let run = agreement.run();
        match agreement.poll() {
            Ok(polled) => {
                for (to, bytes) in polled.messages {
                    self.send(to, Message::Raft { run, bytes });
                }
                for error in polled.errors {
                    self.ignore(self.leader().unwrap_or(0), &error.to_string());
                }
                for committed in polled.committed {
                    self.on_committed(committed);
                }
            }
            Err(e) => self.stop(Stop::Agreement(e)),
        }
    }

    fn on_committed(&mut self, committed: Committed) {
        match committed {
            Committed::Run(run) => self.follow_run(run),
            Committed::State { state, .. } => {
                // Everything below the snapshot is in its state: the weights catch up by a resume
                // unless they are there already.
                self.queue.clear();
                self.follow_run(state.run);
            }
            Committed::Step { record, index, term } => {
                if record.step > self.applied || self.pending.is_some() {
                    self.queue.push_back(Queued::Step { record, index, term });
                }
            }
            Committed::Push { epoch, digest } => self.queue.push_back(Queued::Push { epoch, digest }),
            Committed::Members { voters, learners, index } => {
                let now = self.applied;
                for peer in voters.iter().chain(&learners) {
                    self.joined_at.entry(*peer).or_insert(now);
                }
                self.joined_at.retain(|p, _| voters.contains(p) || learners.contains(p));
                self.event(Event::Members { voters, learners, index });
            }
        }
        while self.queue.len() > MAX_QUEUED {
            self.queue.pop_front();
        }
    }

    /// The log's run reached us: build its model (once).
    fn follow_run(&mut self, run: RunConfig) {
        if self.configured || self.pending == Some(Pending::Configure) {
            return;
        }
        self.run = Some(run);
        self.event(Event::RunStarted { leader: self.leader().unwrap_or(0), settings: run });
        if self.config.computes {
            self.pending = Some(Pending::Configure);
            self.out.push(Output::Configure(run));
        }
    }

    /// Whether the weights hold everything the log committed.
    fn current(&self) -> bool {
        let Some(state) = self.agreement.as_ref().and_then(Agreement::state) else { return false };
        let at_the_start = state.epoch == Epoch::default() && state.step == 0;
        self.configured
            && self.pending.is_none()
            && self.queue.is_empty()
            && self.epochs.mine() == state.epoch
            && (if at_the_start { self.applied == 0 } else { state.step == 0 || self.applied == state.step })
    }

    /// The weights take the committed entries they can, in order.
    fn take_committed(&mut self) {
        while self.configured && self.pending.is_none() && self.stopped.is_none() {
            let Some(front) = self.queue.front().cloned() else { return };
            match front {
                Queued::Step { record, .. } if record.step <= self.applied => {
                    self.queue.pop_front();
                }
                Queued::Step { record, .. } if record.step > self.applied + 1 => {
                    self.catch_up();
                    return;
                }
                Queued::Step { record, index, term } => {
                    if !self.apply(&record, index, term) {
                        return;
                    }
                    self.queue.pop_front();
                    // A step boundary: the leader serves what waits for one before it computes on.
                    self.serve_at_boundary();
                }
                Queued::Push { epoch, digest } => {
                    if epoch <= self.epochs.mine() {
                        self.queue.pop_front();
                        continue;
                    }
                    match self.push_bytes.take() {
                        Some((held, bytes, from)) if held == digest => {
                            self.queue.pop_front();
                            self.pending = Some(Pending::Push { from, epoch });
                            self.out.push(Output::Restore { bytes });
                        }
                        other => {
                            self.push_bytes = other;
                            self.catch_up();
                        }
                    }
                    return;
                }
            }
        }
    }

    /// Applies a committed record once its contributions are here; false while they are not
    /// (repairs asked for) or when the guard stopped the run.
    fn apply(&mut self, record: &StepRecord, index: u64, term: u64) -> bool {
        let missing = self.contributions.missing(record);
        if !missing.is_empty() {
            self.repair(record.step, &missing);
            return false;
        }
        let me = self.config.me;
        let own = self.contributions.get(record.step, me).map(|h| h.gradient.whash);
        if let Err(failure) = self.contributions.guard(record, me, own, self.config.expected_phash) {
            self.stop_with(failure);
            return false;
        }
        let Some((reduced, loss)) = self.contributions.reduce(record) else { return false };
        let run = self.run.expect("a configured run");
        let step = record.step;
        let weights: Vec<(PeerId, u32)> = if run.sync.elastic {
            record.contributions.iter().map(|c| (c.peer, c.weight)).collect()
        } else {
            Vec::new()
        };
        self.applied = step;
        self.contributions.applied(step);
        self.repairs = Repairs::default();
        let ours = record.contributions.iter().any(|c| c.peer == me);
        self.out.push(Output::Apply { step, mean: reduced.mean, grid: reduced.grid, loss, ours });
        let peers = record.roster();
        self.event(Event::StepApplied {
            step,
            loss,
            peers,
            whash: record.whash,
            weights: weights.clone(),
            term,
            index,
        });
        if let Some(steps) = self.window.applied(&run, me, &weights) {
            self.event(Event::Behind { step, steps, of: run.sync.mode.steps_per_sync() });
        }
        if step >= run.syncs() {
            self.finished = true;
            self.event(Event::RunFinished { step });
        }
        true
    }

    /// Asks for the contributions a committed record names that are not here: from the leader,
    /// or their authors; after a few rounds, from everyone; past that, a resume.
    fn repair(&mut self, step: u32, missing: &[PeerId]) {
        if self.repairs.step != step {
            self.repairs = Repairs { step, last_ms: None, attempts: 0 };
        }
        let now = self.timing.now_ms();
        let wait = self.config.repair_after_ms << self.repairs.attempts.min(4);
        if self.repairs.last_ms.is_some_and(|t| now.saturating_sub(t) < wait) {
            return;
        }
        if self.repairs.attempts >= REPAIRS_BEFORE_RESUME || self.applied + RETAINED_STEPS < self.committed_step() {
            self.catch_up();
            return;
        }
        self.repairs.last_ms = Some(now);
        self.repairs.attempts += 1;
        let me = self.config.me;
        let leader = self.leader().filter(|l| *l != me && self.members.contains(l));
        for &peer in missing {
            let mut ask: Vec<PeerId> = match leader {
                Some(leader) if self.repairs.attempts <= 2 => vec![leader],
                _ => self.members.iter().copied().collect(),
            };
            if self.repairs.attempts <= 2 && self.members.contains(&peer) && !ask.contains(&peer) {
                ask.push(peer);
            }
            for to in ask {
                self.send(to, Message::RepairRequest { step, peer });
            }
            self.event(Event::RepairRequested { step, peer });
        }
    }

    /// The last step the log committed (since the last push).
    fn committed_step(&self) -> u32 {
        self.agreement.as_ref().and_then(Agreement::state).map_or(0, |s| s.step)
    }

    /// The weights cannot catch up with the log from what is here: ask the leader for a resume
    /// (again every few seconds while it does not come).
    fn catch_up(&mut self) {
        if !self.config.computes || self.pending.is_some() || self.stopped.is_some() {
            return;
        }
        let now = self.timing.now_ms();
        if self.is_leader() {
            // A leader whose weights are behind its log (it won an election with the log, not the
            // weights) cannot resume itself: it hands the lead to a voter it reaches, which then
            // resumes it.
            self.hand_over_lead();
            return;
        }
        let Some(leader) = self.leader().filter(|l| *l != self.config.me && self.members.contains(l)) else {
            return;
        };
        match self.catching_up {
            Some((_, asked)) if now.saturating_sub(asked) < CATCH_UP_AGAIN_MS => return,
            Some((since, _)) => self.catching_up = Some((since, now)),
            None => {
                self.catching_up = Some((now, now));
                let committed = self.committed_step();
                self.event(Event::CatchingUp { applied: self.applied, committed });
            }
        }
        self.send(leader, Message::CatchUp { applied: self.applied });
    }

    /// Computes the next step when the weights hold everything committed.
    fn maybe_compute(&mut self) {
        let me = self.config.me;
        let Some(run) = self.run else { return };
        if !self.config.computes
            || !self.in_run()
            || self.quitting
            || !self.agreement.as_ref().is_some_and(|a| a.is_member(me))
            || !self.current()
        {
            return;
        }
        let step = self.applied + 1;
        if step > run.syncs() || self.asked.is_some_and(|a| a.step == step) {
            return;
        }
        let now = self.timing.now_ms();
        self.asked = Some(Asked { step, at_ms: now, ready: None });
        let cap = self.window.compute(&run, step, now);
        self.out.push(Output::Compute { step, cap });
        self.hurry_if_beaten(step);
    }

    fn on_computed(&mut self, gradient: Gradient) {
        let me = self.config.me;
        let now = self.timing.now_ms();
        let Some(asked) = self.asked.as_mut().filter(|a| a.step == gradient.step && a.ready.is_none()) else {
            return; // a stale result: the weights moved on
        };
        if self.stopped.is_some() || self.pending.is_some() || gradient.step != self.applied + 1 {
            return;
        }
        let compute_ms = now.saturating_sub(asked.at_ms);
        asked.ready = Some((now, compute_ms));
        if self.is_leader() {
            let deadline = self.timing.deadline_ms(self.config.deadline, compute_ms);
            self.due.push_back((gradient.step, now + deadline));
            if self.due.len() > 8 {
                self.due.pop_front();
            }
        }
        if let Some(run) = self.run {
            self.window.computed(&run, gradient.weight, now);
        }
        let step = gradient.step;
        let targets: Vec<PeerId> = self.members.iter().copied().filter(|p| self.takes_part(*p, step)).collect();
        for to in targets {
            self.send(to, Message::Gradient(gradient.clone()));
        }
        self.offer(me, gradient);
    }

    /// Whether `peer` takes part in `step`: in the configuration, and a voter, or it contributed
    /// or joined within [`QUIET_STEPS`]. Only those are sent contributions and repairs: a
    /// member that computes nothing follows by resumes, at the leader's back-off, and costs the
    /// group no bandwidth.
    fn takes_part(&self, peer: PeerId, step: u32) -> bool {
        let Some(agreement) = self.agreement.as_ref().filter(|a| a.is_member(peer)) else { return false };
        let lately = |at: Option<&u32>| at.is_some_and(|&at| at + QUIET_STEPS >= step);
        !self.roster.is_observer(peer)
            && (agreement.is_voter(peer) || lately(self.contributed.get(&peer)) || lately(self.joined_at.get(&peer)))
    }

    /// Holds a contribution from `from` (ours, a member's, or a repair of `from`'s).
    fn offer(&mut self, from: PeerId, gradient: Gradient) -> bool {
        let step = gradient.step;
        if !self.configured || step <= self.applied || step > self.applied + 2 {
            self.ignore(from, &format!("a contribution to step {step}, which this node does not collect"));
            return false;
        }
        let why = match self.contributions.offer(from, gradient) {
            Offer::Accepted => {
                let last = self.contributed.entry(from).or_insert(step);
                *last = (*last).max(step);
                if from != self.config.me {
                    self.hurry_if_beaten(step);
                    self.arrived(from, step);
                }
                self.guard_held(step);
                return true;
            }
            Offer::Duplicate => return false,
            Offer::WrongWeight { weight, allowed } => {
                format!("a contribution of weight {weight}, the run allows {}..={}", allowed.start(), allowed.end())
            }
            Offer::WrongEncoding { expected, actual } => {
                format!("a contribution sent as {actual}, the run's compression is {expected}")
            }
            Offer::WrongLength { expected, actual } => {
                format!("a contribution of {actual} values, the model has {expected}")
            }
            Offer::OutOfBounds(e) => {
                // Refused before it can reach a sum; the leader stops waiting for the sender.
                self.event(Event::ContributionRefused { peer: from, step, why: e });
                if self.is_leader() && from != self.config.me && self.roster.expected(from) {
                    let backoff = self.roster.missed(from);
                    self.event(Event::Dropped { peer: from, step, why: DropReason::Refused { why: e, backoff } });
                }
                return false;
            }
        };
        self.ignore(from, &why);
        false
    }

    /// The guard, as early as it can run: contributions to one step (of one epoch) are computed
    /// from the same committed weights, so once our own is here, one from other weights — or
    /// with an unhealthy probe — is a fork or a broken kernel, and the run stops here, naming
    /// the senders, before any record could sum it.
    fn guard_held(&mut self, step: u32) {
        let me = self.config.me;
        let Some(own) = self.contributions.get(step, me).map(|h| h.gradient.whash) else { return };
        let mut failure = GuardFailure { step, weight_mismatch: Vec::new(), probe_mismatch: Vec::new() };
        for (peer, held) in self.contributions.at(step) {
            if held.gradient.whash != own {
                failure.weight_mismatch.push(peer);
            }
            if held.gradient.phash != self.config.expected_phash {
                failure.probe_mismatch.push(peer);
            }
        }
        if !failure.weight_mismatch.is_empty() || !failure.probe_mismatch.is_empty() {
            self.stop_with(failure);
        }
    }

    /// (Leader) a member's contribution arrived: in time for its step's deadline, it counts
    /// toward the member being waited for again.
    fn arrived(&mut self, from: PeerId, step: u32) {
        if !self.is_leader() {
            return;
        }
        let now = self.timing.now_ms();
        let in_time = self.due.iter().find(|(s, _)| *s == step).is_none_or(|(_, due)| now <= *due);
        if let Some(steps) = self.roster.arrived(from, step, in_time) {
            self.event(Event::Readmitted { peer: from, steps });
        }
    }

    /// Elastic windows: another member's whole window for the step we compute is here: ours
    /// ends after its inner step under way.
    fn hurry_if_beaten(&mut self, step: u32) {
        let Some(run) = self.run.filter(|r| r.sync.elastic) else { return };
        let h = run.sync.mode.steps_per_sync();
        let me = self.config.me;
        let whole = self.contributions.at(step).any(|(p, held)| p != me && held.gradient.weight == h);
        if self.window.hurry(&run, step, whole, self.timing.now_ms()) {
            self.out.push(Output::Hurry { step });
        }
    }

    // ---- the leader ----

    /// The leader's work: the configuration, resumes at boundaries, the next record.
    fn lead(&mut self) {
        let me = self.config.me;
        let now = self.timing.now_ms();
        let Some(agreement) = self.agreement.as_mut().filter(|a| a.is_leader()) else { return };
        if self.stopped.is_some() || self.quitting {
            return;
        }
        let starting = agreement.state().is_some_and(|s| s.step == 0 && s.epoch == Epoch::default());
        let (voters, learners) = agreement.members();
        self.roster.lead(agreement.term(), &voters, &learners, starting);
        if !agreement.leads_with_a_committed_term() {
            return;
        }
        if let Some((change, why)) = self.roster.next_change(agreement, me, &self.members, now, starting) {
            match agreement.change(change) {
                Ok(true) => {
                    if let (Change::Remove(peer), Some(why)) = (change, why) {
                        self.event(Event::Dropped { peer, step: self.applied, why });
                    }
                }
                Ok(false) => {}
                Err(e) => return self.stop(Stop::Agreement(e)),
            }
        }
        // A boundary as good as any: not computing, or — one step a sync, whose compute leaves
        // the weights as they were — done computing. (In `outer:H` a finished compute has moved
        // the weights through its window, and ran ahead with an overlap: only the next apply is
        // a boundary.)
        let one_step = self.run.is_some_and(|r| r.sync.mode.steps_per_sync() == 1);
        let boundary = self.asked.is_none_or(|a| a.step != self.applied + 1 || (one_step && a.ready.is_some()));
        if boundary || self.finished {
            self.serve_at_boundary();
        }
        self.propose();
    }

    /// (Leader, weights at a step boundary) resumes asked for and observers not yet told.
    fn serve_at_boundary(&mut self) {
        if !self.is_leader() || !self.current() && !self.finished || self.pending.is_some() {
            return;
        }
        let now = self.timing.now_ms();
        for peer in self.roster.resumes_due(&self.members, now) {
            self.out.push(Output::SendSnapshot { to: peer });
        }
        let Some(run) = self.run else { return };
        let run_id = self.agreement.as_ref().map_or(0, Agreement::run);
        for peer in self.roster.observers_to_tell(&self.members) {
            self.send(peer, Message::RunConfig { protocol: MESH_PROTOCOL_VERSION, run_id, run });
            self.out.push(Output::SendSnapshot { to: peer });
        }
    }

    /// (Leader) proposes the next step's record once the members it waits for contributed, or
    /// the deadline passed.
    fn propose(&mut self) {
        let me = self.config.me;
        let now = self.timing.now_ms();
        let Some(run) = self.run else { return };
        let step = self.applied + 1;
        if step > run.syncs() || self.pushing.is_some() || !self.current() || self.pending.is_some() {
            return;
        }
        let Some(agreement) = self.agreement.as_ref() else { return };
        let term = agreement.term();
        if self.proposed == Some((term, step)) {
            return;
        }
        let Some(Asked { ready: Some((ready_ms, compute_ms)), .. }) = self.asked.filter(|a| a.step == step) else {
            return;
        };
        let Some(own) = self.contributions.get(step, me).map(|h| h.gradient.whash) else { return };
        let (voters, learners) = agreement.members();
        let present: Vec<(PeerId, Named)> = self
            .contributions
            .at(step)
            .filter(|(p, _)| *p == me || agreement.is_member(*p))
            .map(|(peer, held)| (peer, Named { peer, digest: held.digest, weight: held.gradient.weight }))
            .collect();
        let has = |p: &PeerId| present.iter().any(|(q, _)| q == p);
        let late: Vec<PeerId> = voters
            .iter()
            .chain(&learners)
            .copied()
            .filter(|p| *p != me && self.roster.expected(*p) && !has(p))
            .collect();
        let waited = now.saturating_sub(ready_ms);
        let deadline = self.timing.deadline_ms(self.config.deadline, compute_ms);
        // At the run's start every member that can compute is in the first step (once the
        // configuration has it), unless the deadline passes first.
        let starting = agreement.state().is_some_and(|s| s.step == 0 && s.epoch == Epoch::default());
        let joining = starting && self.roster.unjoined(agreement, me, &self.members);
        if (!late.is_empty() || joining) && waited < deadline {
            self.ask_late(step, &late, waited);
            return;
        }
        // (Every contribution here passed the guard as it came: `guard_held`.)
        let record = StepRecord { step, whash: own, contributions: present.iter().map(|(_, n)| *n).collect() };
        match self.agreement.as_mut().map(|a| a.propose(&LogEntry::Step(record))) {
            Some(Ok(true)) => {}
            Some(Ok(false)) | None => return,
            Some(Err(e)) => return self.stop(Stop::Agreement(e)),
        }
        self.proposed = Some((term, step));
        if late.is_empty() {
            self.timing.waited(waited);
        }
        for peer in late {
            let backoff = self.roster.missed(peer);
            self.event(Event::Dropped { peer, step, why: DropReason::Deadline { deadline_ms: deadline, backoff } });
        }
        // Elastic windows' slow-member rule, at this boundary.
        for peer in self.window.too_slow(self.config.slow_windows, me) {
            self.window.forget(peer);
            self.remove_for_good(peer, Removal::Slow { windows: self.config.slow_windows });
        }
    }

    /// (Leader) members it waits for whose contribution is not here after a repair interval are
    /// asked for it (it may have been lost with a link that closed), once per interval.
    fn ask_late(&mut self, step: u32, late: &[PeerId], waited: u64) {
        let now = self.timing.now_ms();
        let after = self.config.repair_after_ms;
        let asked_recently = self.late_asked.is_some_and(|(s, t)| s == step && now.saturating_sub(t) < after);
        if waited < after || asked_recently {
            return;
        }
        self.late_asked = Some((step, now));
        let reachable: Vec<PeerId> = late.iter().copied().filter(|p| self.members.contains(p)).collect();
        for peer in reachable {
            self.send(peer, Message::RepairRequest { step, peer });
        }
    }

    /// (Leader) `peer` is out of the run for good: told why, then taken out of the
    /// configuration.
    fn remove_for_good(&mut self, peer: PeerId, why: Removal) {
        self.roster.kick(peer, why.clone());
        if self.members.contains(&peer) {
            self.send(peer, Message::Removed { step: self.applied, why });
        }
    }

    fn on_kick(&mut self, peer: PeerId, why: String) {
        if !self.is_leader() || self.run.is_none() {
            let leader = self.leader();
            self.event(Event::Problem(Problem::NotLeader { action: LeaderAction::Kick, leader }));
        } else if peer == self.config.me {
            self.event(Event::Problem(Problem::KickSelf));
        } else {
            self.remove_for_good(peer, Removal::Kicked(why));
        }
    }

    fn on_push(&mut self, bytes: Vec<u8>) {
        if self.pending.is_some() || self.pushing.is_some() {
            self.event(Event::Problem(Problem::Busy));
            return;
        }
        if self.run.is_none() {
            // No run: this node's state only.
            let epoch = Epoch { count: self.epochs.mine().count + 1, pusher: self.config.me };
            self.pending = Some(Pending::Push { from: self.config.me, epoch });
            self.out.push(Output::Restore { bytes });
            return;
        }
        if !self.is_leader() {
            let leader = self.leader();
            self.event(Event::Problem(Problem::NotLeader { action: LeaderAction::Push, leader }));
            return;
        }
        let digest = lockstep_luts::hash::fnv1a64(&bytes);
        let epoch = Epoch { count: self.epochs.mine().count + 1, pusher: self.config.me };
        match self.agreement.as_mut().map(|a| a.propose(&LogEntry::Push { epoch, digest })) {
            Some(Ok(true)) => {}
            Some(Err(e)) => return self.stop(Stop::Agreement(e)),
            _ => {
                let leader = self.leader();
                self.event(Event::Problem(Problem::NotLeader { action: LeaderAction::Push, leader }));
                return;
            }
        }
        self.pushing = Some(digest);
        self.broadcast(&Message::CheckpointPush(bytes.clone()));
        self.push_bytes = Some((digest, bytes, self.config.me));
    }

    // ---- time ----

    fn on_tick(&mut self, now_ms: u64) {
        let timing = self.config.agreement;
        let ticked = self.timing.tick(now_ms, timing.tick_ms, timing.longest_election_ms() / 4);
        if let Some(ms) = ticked.slept_ms {
            self.event(Event::Slept { ms });
            // The gap was ours: every wait restarts where it stood.
            if let Some(asked) = &mut self.asked {
                asked.at_ms = asked.at_ms.saturating_add(ms);
                asked.ready = asked.ready.map(|(t, c)| (t.saturating_add(ms), c));
            }
            self.repairs.last_ms = self.repairs.last_ms.map(|t| t.saturating_add(ms));
            self.leaderless_since = self.leaderless_since.map(|t| t.saturating_add(ms));
        }
        if self.stopped.is_some() {
            return;
        }
        for _ in 0..ticked.raft_ticks {
            if let Some(Err(e)) = self.agreement.as_mut().map(Agreement::tick) {
                return self.stop(Stop::Agreement(e));
            }
        }
        // A member behind asks again; repairs are asked again.
        if self.catching_up.is_some() {
            self.catch_up();
        }
    }

    /// Says when the leader changes, and when this node has none for an election timeout.
    fn tell_agreement(&mut self) {
        let me = self.config.me;
        let now = self.timing.now_ms();
        let Some(agreement) = &self.agreement else { return };
        if self.stopped.is_some() {
            return;
        }
        let term = agreement.term();
        match agreement.leader() {
            Some(leader) => {
                self.leaderless_since = None;
                self.told_no_majority = false;
                if self.told_leader != Some((leader, term)) {
                    self.told_leader = Some((leader, term));
                    self.event(Event::Leader { peer: leader, term });
                }
            }
            None => {
                let since = *self.leaderless_since.get_or_insert(now);
                let (voters, _) = agreement.members();
                let waited = now.saturating_sub(since) >= self.config.agreement.longest_election_ms();
                if waited && !self.told_no_majority && agreement.is_member(me) {
                    self.told_no_majority = true;
                    let reach = voters.iter().copied().filter(|p| *p == me || self.members.contains(p)).collect();
                    self.event(Event::NoMajority { reach, voters, term });
                }
            }
        }
    }

    /// Moves everything on that can move after an input.
    fn advance(&mut self) {
        for _ in 0..16 {
            let before = self.out.len();
            self.pump();
            self.take_committed();
            self.maybe_compute();
            self.lead();
            self.pump();
            self.tell_agreement();
            if self.out.len() == before {
                break;
            }
        }
    }

    // ---- messages ----

    fn on_message(&mut self, from: PeerId, message: Message) {
        let step_message =
            matches!(message, Message::Gradient(_) | Message::RepairRequest { .. } | Message::RepairResponse { .. });
        if !step_message {
            return self.dispatch(from, message);
        }
        match self.epochs.admit(from, message) {
            Admitted::Now(message) => self.dispatch(from, message),
            Admitted::Held => {}
            Admitted::Stale(why) | Admitted::Dropped(why) => self.ignore(from, &why),
        }
    }

    /// Acts on a message (a step message only once admitted to our epoch).
    fn dispatch(&mut self, from: PeerId, message: Message) {
        match message {
            Message::Epoch(epoch) => self.epochs.announced(from, epoch),
            Message::Raft { run, bytes } => self.on_raft(from, run, &bytes),
            Message::RunConfig { protocol, run_id: _, run } => {
                if protocol != MESH_PROTOCOL_VERSION {
                    let why =
                        format!("a run config for mesh protocol {protocol} (this node speaks {MESH_PROTOCOL_VERSION})");
                    self.ignore(from, &why);
                } else if self.config.computes {
                    self.ignore(from, "a run config (members take the run from its log)");
                } else if self.run != Some(run) {
                    // We watch: the run as its leader tells it.
                    self.run = Some(run);
                    self.event(Event::RunStarted { leader: from, settings: run });
                }
            }
            Message::Resume(bytes) => {
                if !self.config.computes || self.catching_up.is_none() {
                    self.ignore(from, "a resume this node did not ask for");
                } else if self.leader() != Some(from) {
                    self.ignore(from, "a resume from a peer that is not the leader");
                } else if self.pending.is_none() {
                    self.pending = Some(Pending::Resume(self.epochs.of(from)));
                    self.out.push(Output::Restore { bytes });
                }
            }
            Message::CatchUp { applied: _ } => {
                if self.is_leader() && self.agreement.as_ref().is_some_and(|a| a.is_member(from)) {
                    self.roster.resume_wanted(from);
                } else {
                    self.ignore(from, "a resume request, but only the leader serves them to members");
                }
            }
            Message::CheckpointPush(bytes) => {
                if self.leader() != Some(from) || self.run.is_none() {
                    // Pushes have authority: only the run's leader may rewind the group.
                    self.event(Event::PushRefused { from });
                    self.ignore(from, "a checkpoint push from a member that is not the run's leader");
                } else {
                    self.push_bytes = Some((lockstep_luts::hash::fnv1a64(&bytes), bytes, from));
                }
            }
            Message::Removed { step, why } => {
                if self.leader() != Some(from) || self.is_leader() {
                    self.ignore(from, "a removal from a peer that is not the leader");
                } else {
                    self.event(Event::Removed { step, why: why.clone() });
                    self.stop(Stop::Removed { step, why });
                }
            }
            Message::Leaving => {
                self.roster.leaving(from);
                self.event(Event::PeerLeaving(from));
            }
            Message::Fragment { .. } => self.ignore(from, "a fragment (the adapter reassembles them)"),
            Message::PeerInfo { .. } | Message::Ping { .. } | Message::Pong { .. } => {
                self.ignore(from, "a link message (the adapter handles them)")
            }
            Message::Gradient(gradient) => {
                if self.roster.is_observer(from) {
                    self.ignore(from, "a contribution from an observer (it cannot compute)");
                } else {
                    self.offer(from, gradient);
                }
            }
            Message::RepairRequest { step, .. } if !self.takes_part(from, step) => {
                self.ignore(from, "a repair for a member that contributes nothing (it catches up by resume)")
            }
            Message::RepairRequest { step, peer } => match self.contributions.get(step, peer) {
                Some(held) => {
                    let gradient = held.gradient.clone();
                    self.send(from, Message::RepairResponse { peer, gradient });
                    self.event(Event::RepairServed { step, peer, to: from });
                }
                None => self.ignore(from, "a repair request for a contribution this node does not hold"),
            },
            Message::RepairResponse { peer, gradient } => {
                let step = gradient.step;
                let wanted = self.contributions.get(step, peer).is_none();
                if self.offer(peer, gradient) && wanted {
                    self.event(Event::Repaired { step, peer });
                }
            }
        }
    }

    /// A message of a run's Raft group.
    fn on_raft(&mut self, from: PeerId, run: u64, bytes: &[u8]) {
        if self.stopped.is_some() && self.agreement.as_ref().is_some_and(|a| a.run() == run) {
            return; // a stopped node takes no part in its run's agreement any more
        }
        let ours = self.agreement.as_ref().map(Agreement::run);
        if ours != Some(run) {
            if self.in_run() && ours.is_some() || !self.config.computes {
                return self.ignore(from, "a message of another run's log");
            }
            // A run reached us (or a new one, ours being over): its log starts empty here.
            match Agreement::join(self.config.me, run, self.config.agreement) {
                Ok(agreement) => self.new_run(Some(agreement)),
                Err(e) => return self.stop(Stop::Agreement(e)),
            }
        }
        let Some(agreement) = &mut self.agreement else { return };
        match agreement.step(from, bytes) {
            Ok(()) => {}
            Err(e @ AgreementError::Broken(_)) => self.stop(Stop::Agreement(e)),
            Err(e) => self.ignore(from, &e.to_string()),
        }
    }
}
