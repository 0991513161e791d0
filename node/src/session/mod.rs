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
//! - **A record outlives its leader** (`appends.rs`): a member appends a record naming the
//!   leader's whole contribution only once it holds it (the leader's appends wait for it), so
//!   a leader killed with its contribution undelivered leaves no record that a survivor might
//!   commit and could not take.
//! - **Chunk owners** (`--exchange owners`, `owners.rs`): a member sends every other its
//!   contribution's header and each owner only its chunk; the leader names a contribution once
//!   every chunk of it is held by another member than its author; each owner sums its chunk of
//!   the record and sends the sum; members apply the sums laid end to end — the same integers,
//!   so the same bits.
//! - **Computing behind the commit**: while a record is replicated, a member that holds every
//!   contribution it names may take it tentatively (`Output::Apply { tentative: true }`) and
//!   compute the next step at once — holding that contribution back until the record commits,
//!   so nothing any other member sees rests on an uncommitted step. When the record commits, the
//!   step stands (`Output::Confirm`, then it is applied in every sense: events, hashes); when
//!   another record commits in its place (a new leader's), it is undone (`Output::Rollback`)
//!   and the committed one applied. What a commit costs a step is then at most what computing
//!   the next one does not cover.
//! - **Guard**: every contribution a record sums was computed from the record's weights with a
//!   healthy probe, and so was ours. With audits on, the leader settles a contribution from
//!   other weights (`apart.rs`: its own checked against the definition's update, the member
//!   named to the word and removed, or the leader itself stepping aside); without them, or for
//!   a member whose own weights are not a committed record's, the run stops here, naming the
//!   peers.
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
mod apart;
mod appends;
mod assignment;
mod audit;
mod audits;
mod commit;
mod contribute;
mod dispute;
mod epoch;
mod events;
mod fingerprints;
mod io;
mod leader;
pub mod log;
mod messages;
mod owners;
mod private;
mod roster;
mod shun;
mod step;
mod timing;
mod window;

use std::collections::{BTreeSet, VecDeque};

pub use agreement::{AgreementError, AgreementTiming, Change, Committed, KEPT_ENTRIES};
pub use apart::{first_departure, WeightsChecked};
pub use assignment::assignment;
pub use audit::{PrivateInputs, Recomputed, Unfinished, STATE_WAIT_ELECTIONS};
pub use audits::AuditStats;
pub use dispute::DISPUTE_WAIT_ELECTIONS;
pub use events::{DropReason, Event, Failure, Ignored, LeaderAction, Problem, Stop, Task};
pub use fingerprints::SUM_DISPUTE_WAIT_ELECTIONS;
pub use io::{Input, Output};
pub use private::STATE_PROMISED_STEPS;
pub use roster::{Standing, GONE_MS, MIN_VOTERS};
pub use shun::SHUN_LAPSES_ELECTIONS;
pub use step::{ChunkOffer, GuardFailure, Offer, RETAINED_STEPS};
pub use timing::StepDeadline;

use agreement::Agreement;
use audits::Audits;
use commit::{Queued, Repairs, Taking};
use contribute::{Asked, Computing};
use epoch::{Admitted, Epochs};
use leader::Lead;
use log::{LogEntry, Named, StepRecord};
use roster::Roster;
use step::Contributions;
use timing::Timing;
use window::Window;

use std::sync::Arc;

use crate::audit::{Trace, Traced, Urgency};
use crate::config::RunConfig;
use crate::wire::{Epoch, Gradient, Message, PeerId, Removal, Values, MESH_PROTOCOL_VERSION};

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
    /// Whether the weights take a record tentatively while it is replicated, so the next step
    /// computes behind the commit (see the module docs).
    pub compute_ahead: bool,
    /// Audits by recomputation (`audit.rs`): how many in a thousand of the steps this node
    /// contributes to it audits another member's contribution of (0: none).
    pub audit_rate: u32,
    /// Packed runs: how many in a thousand of a contribution's state's chunks a routine audit
    /// asks for and checks (at least one; 1000: the whole state, as a check always does).
    pub audit_state_part: u32,
    /// How many audits may run at once on this member (at least one): more only where it has
    /// cores to spare beside its own step.
    pub audit_workers: u32,
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

/// The session state machine. See the module docs.
pub struct Session {
    config: SessionConfig,
    timing: Timing,
    /// Peers whose data channel is open.
    members: BTreeSet<PeerId>,
    /// When each peer was last heard from (any message): who this node reaches.
    heard_ms: std::collections::BTreeMap<PeerId, u64>,
    roster: Roster,
    epochs: Epochs,
    window: Window,
    /// The run's log (none before a run reached this node).
    agreement: Option<Agreement>,
    run: Option<RunConfig>,
    /// The model is built for the run.
    configured: bool,
    weights: usize,
    contributions: Contributions,
    /// The weights taking the log (`commit.rs`).
    taking: Taking,
    /// (Leader) what the leader keeps between its proposals (`leader.rs`).
    lead: Lead,
    /// Our computing and whom we send contributions (`contribute.rs`).
    computing: Computing,
    /// Audits by recomputation (`audit.rs`).
    audits: Audits,
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
            heard_ms: std::collections::BTreeMap::new(),
            roster: Roster::default(),
            epochs: Epochs::default(),
            window: Window::default(),
            agreement: None,
            run: None,
            configured: false,
            weights: 0,
            contributions: Contributions::new(0, &crate::sync::SyncConfig::SEED),
            taking: Taking::default(),
            lead: Lead::default(),
            computing: Computing::default(),
            audits: Audits::default(),
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
        self.taking.applied
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

    /// What this node's audits have done in this run.
    pub fn audit_stats(&self) -> AuditStats {
        self.audits.stats
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
                    let now = self.timing.now_ms();
                    self.heard_ms.insert(from, now);
                    self.audits.heard(from, now);
                    self.on_message(from, message);
                } else {
                    self.ignore(from, Ignored::NotConnected);
                }
            }
            Input::Computed(gradient) => self.on_computed(gradient),
            Input::Audited { step, target, outcome } => self.on_audited(step, target, outcome),
            Input::Settled { step, target, outcome } => self.on_settled(step, target, outcome),
            Input::WeightsChecked { step, outcome } => self.on_weights_checked(step, outcome),
            Input::Configured { weights } => self.on_configured(weights),
            Input::Restored { step, weights } => self.on_restored(step, weights),
            Input::Failed { task: Task::Compute { step }, error } => self.stop(Stop::Compute { step, error }),
            Input::Failed { task, error } => {
                if self.pending == Some(Pending::Configure) && self.agreement.is_none() {
                    self.run = None; // the run we were starting did not begin
                }
                if task == Task::Configure && self.agreement.is_some() {
                    // This node cannot compute the run its log holds (its backend was refused at
                    // the run's shapes, say): it watches it, an observer, as one whose backend
                    // the gate refused does.
                    self.config.computes = false;
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

    fn ignore(&mut self, from: PeerId, why: Ignored) {
        self.ignored += 1;
        self.event(Event::Ignored { from, why });
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
        self.roster.connected(peer, self.timing.now_ms());
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
            let step = self.taking.applied + 1;
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
        self.taking = Taking::default();
        self.lead = Lead::default();
        self.computing = Computing::default();
        self.audits = Audits::default();
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
        self.taking.applied = 0;
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
        self.taking.applied = step;
        // A resume's weights are the log's at `step`: what is held for the steps after it stays
        // (a record committed meanwhile may name it, and nobody else may hold it); a push's
        // steps are counted again, so nothing held belongs to them.
        match pending {
            Pending::Resume(_) => self.contributions.resumed(step),
            _ => self.contributions.clear(),
        }
        // The restore replaced whatever the weights took tentatively.
        self.taking.tentative = None;
        self.audits.prints.restored();
        self.computing.asked = None;
        // Step numbers come round again after a restore: what was proposed or due was for others.
        self.lead.proposed = None;
        self.lead.due.clear();
        self.taking.catching_up = None;
        self.taking.repairs = Repairs::default();
        // The owners of the next step: the roster of the record a resume's weights are at (the
        // log committed it here too); none after a push (its steps are counted again).
        self.taking.last_roster = None;
        self.taking.sum_wait = None;
        let epoch = match pending {
            Pending::Resume(epoch) => {
                self.taking.last_roster = self.taking.rosters.get(&step).map(|r| (step, r.clone()));
                self.event(Event::Resumed { step });
                epoch
            }
            Pending::Push { from, epoch } => {
                // Records of the weights before the push are no evidence about those after it.
                self.audits.forget_records();
                self.taking.rosters.clear();
                self.taking.push_bytes = None;
                self.lead.pushing = None;
                self.event(Event::CheckpointRestored { from, step });
                epoch
            }
            Pending::Configure => return,
        };
        // What the weights now hold, the queue no longer needs.
        self.taking.queue.retain(|q| match q {
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
            self.ignore(from, Ignored::Replaced { epoch });
        }
        for (from, message) in released.now {
            self.dispatch(from, message);
        }
    }

    // ---- time ----

    fn on_tick(&mut self, now_ms: u64) {
        let timing = self.config.agreement;
        let ticked = self.timing.tick(now_ms, timing.tick_ms, timing.longest_election_ms() / 4);
        if let Some(ms) = ticked.slept_ms {
            self.event(Event::Slept { ms });
            // The gap was ours: every wait restarts where it stood.
            if let Some(asked) = &mut self.computing.asked {
                asked.at_ms = asked.at_ms.saturating_add(ms);
                asked.ready = asked.ready.map(|(t, c)| (t.saturating_add(ms), c));
            }
            self.taking.repairs.last_ms = self.taking.repairs.last_ms.map(|t| t.saturating_add(ms));
            self.leaderless_since = self.leaderless_since.map(|t| t.saturating_add(ms));
        }
        if self.stopped.is_some() {
            return;
        }
        self.audit_tick(now_ms);
        for _ in 0..ticked.raft_ticks {
            if let Some(Err(e)) = self.agreement.as_mut().map(Agreement::tick) {
                return self.stop(Stop::Agreement(e));
            }
        }
        // A member behind asks again; repairs are asked again.
        if self.taking.catching_up.is_some() {
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
                // A minority said ends with a leader said, even the one it followed before in
                // the same term (pre-vote keeps the term of a node cut off and back).
                let ended_minority = std::mem::take(&mut self.told_no_majority);
                if self.told_leader != Some((leader, term)) || ended_minority {
                    if self.told_leader.map(|(l, _)| l) != Some(leader) {
                        // Chunk owners: a new leader is told again what is held.
                        self.taking.acked.clear();
                    }
                    self.told_leader = Some((leader, term));
                    self.event(Event::Leader { peer: leader, term });
                    if leader == me {
                        self.propose_shunned();
                    }
                }
            }
            None => {
                let since = *self.leaderless_since.get_or_insert(now);
                let (voters, _) = agreement.members();
                let waited = now.saturating_sub(since) >= self.config.agreement.longest_election_ms();
                // Reached: heard from within an election timeout (an open channel may be silent).
                let longest = self.config.agreement.longest_election_ms();
                let heard = |p: &PeerId| self.heard_ms.get(p).is_some_and(|t| now.saturating_sub(*t) < longest);
                let reach: Vec<PeerId> =
                    voters.iter().copied().filter(|p| *p == me || self.members.contains(p) && heard(p)).collect();
                // Reaching a majority, it is an election under way (one that needs the most
                // up-to-date log may take a few terms), not a minority.
                let minority = 2 * reach.len() <= voters.len();
                if waited && minority && !self.told_no_majority && agreement.is_member(me) {
                    self.told_no_majority = true;
                    self.event(Event::NoMajority { reach, voters, term });
                }
            }
        }
    }

    /// Moves everything on that can move after an input.
    fn advance(&mut self) {
        for _ in 0..16 {
            let before = self.out.len();
            self.take_held_appends();
            self.pump();
            self.take_committed();
            self.drop_replaced_tentative();
            self.take_tentatively();
            self.form_sums();
            self.tell_held();
            self.chase_parts();
            self.settle_sums();
            self.fill_prints();
            self.maybe_compute();
            self.lead();
            self.pump();
            self.tell_agreement();
            if self.out.len() == before {
                break;
            }
        }
    }
}
