//! The mesh session core: roster, leader, step scheduling, averaging order, the sync guard,
//! gradient repair, mid-run resume and checkpoint push — a state machine without I/O
//! (`docs/ARCHITECTURE.md`, invariant 2). It never reads a clock, touches a socket or runs the model.
//!
//! The adapter feeds [`Input`]s (connections, decoded messages, compute results, ticks carrying
//! `now`) to [`Session::handle`] and executes the returned [`Output`]s **in order**. Three
//! outputs are requests the adapter must answer before it feeds anything else:
//! `Configure` with `Configured` (or `Failed`), `Restore` with `Restored` (or `Failed`), and
//! `Compute` — whose answer, `Computed`, may come later, interleaved with other inputs. A
//! computation still under way when the adapter executes a `Restore` or `Configure` belongs to
//! the state before it: the adapter drops its result (its step number may come round again).
//!
//! # The protocol as this core runs it
//!
//! - **Leader**: whoever starts the run. It sends the run config (-3) to every member, then for
//!   each step `s` a roster (-4) listing, in averaging order (ascending peer id), the members in
//!   sync. Every roster member computes its gradient at the current weights and sends
//!   `[step][whash][phash][loss][grad]` to every other roster member.
//! - **Commit**: the leader applies step `s` once it holds every roster gradient and the guard
//!   passes, then announces the roster of `s + 1`. That announcement is the commit: a follower
//!   applies `s` only when it arrives (after the last step, the commit is a roster of
//!   `steps + 1` with no peers). Because the leader held every gradient of a committed step, a
//!   follower that lacks one can always repair it from the leader (-7/-8), and no follower ever
//!   applies a step with a roster the leader did not commit.
//! - **Guard**: before applying, every roster gradient's weight hash must equal ours and its
//!   probe hash the expected one; otherwise the run stops with the step and the peers named.
//! - **A peer that leaves** mid-step: if the leader already holds its gradient the step keeps
//!   its roster (others repair); otherwise the leader revises the step's roster without it
//!   (a second -4 for the same step). Either way it is absent from the next roster.
//! - **A leader that leaves**: every node picks the same successor, the smallest id among the
//!   connected members of the latest roster (and itself). The successor re-announces the
//!   in-flight step's roster (revised as above) and carries on. If the old leader's commit
//!   reached only some nodes, the survivors may disagree about that step's roster; the guard
//!   then stops the run at the next step rather than let it fork silently.
//! - **Step deadline**: a roster member whose gradient has not come within
//!   [`Session::deadline_ms`] (4 × the longest of the last steps, between a floor and a ceiling)
//!   is dropped: the leader re-announces the step without it and tells it why (-13); once it
//!   answers, it is resumed at the next step boundary. A kicked member is told and stays out.
//! - **Late joiner**: the leader sends it the run config at once and, at the next step
//!   boundary, a resume (-6: a checkpoint of everything that determines the next update), then
//!   includes it in the next roster.
//! - **Checkpoint push** (-2): only the run's leader may push (a push from anyone else is
//!   refused and named on every node, and a follower's own attempt is refused locally): it
//!   restores the checkpoint locally and sends it to every member; each restores it (the
//!   replica refuses a checkpoint whose settings are not a sane run or train another way); the
//!   leader then announces the next step from the checkpoint's step.
//! - **Epochs** (-12): a restore rewinds the step count, so the steps after a push reuse step
//!   numbers that gradients from before it still carry. Every node counts the pushes its state
//!   descends from ([`Epoch`]: how many, and the last pusher) and tells each member its epoch
//!   when their channel opens and whenever it changes — the pusher just before its push, the
//!   others right after their restore. Channels are ordered, so every step message (roster,
//!   gradient, repair) belongs to the epoch its sender last announced: one from an earlier epoch
//!   is dropped, one from a later epoch is held until this node restores that push too, then
//!   replayed. Two pushes made at once are ordered by pusher id, so every node ends on the same
//!   one. A joiner takes its leader's epoch with the run config.
//! - **Quorum**: a roster commits only with a quorum of the *base*, the final roster of the
//!   last step this node applied (before its first, the roster of the step in flight): more
//!   than half of the base, counted over the leader's backers (itself and the members that
//!   said they follow it, `-17`).
//!   Members that said they are leaving (-15) and members the leader kicked are not counted.
//!   A leader whose next or revised roster lacks a quorum, or a successor whose candidates
//!   lack one, *stands by* ([`Standby::QuorumLost`]): it leads, computes and applies nothing,
//!   keeps its state and says so; it shows life to every member, follows the first one that
//!   sends it the run's config or takes it out of a step, and is resumed by that leader.
//! - **A silent leader** is deposed by its followers: a roster member that has sent its own
//!   contribution and hears nothing from the leader for 1.5 × the step deadline (each node
//!   times the steps itself) says so ([`Event::LeaderDeposed`]) and picks the successor as if
//!   the leader had left. The successor takes the deposed leader out of the run (-13, it may
//!   return) and resumes it once it shows life; the old leader, told so, stands by
//!   ([`Standby::Deposed`]) until that resume.
//! - **Sleep**: a gap between two ticks longer than half the deadline means this node was
//!   suspended (or starved): its timers skip the gap, so it never blames its peers for its
//!   own absence. A leader that slept past the point where its followers would depose it
//!   stands by for one deadline ([`Standby::Woke`]), committing nothing, in case it was; if
//!   nobody took its place, it re-announces the step in flight and leads on.
//! - Duplicate, late, early-beyond-one-step and outsider messages are ignored and counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::config::RunConfig;
use crate::step::{GuardFailure, Offer, RepairStore, StepCollector};
use crate::sync::{OutOfBounds, SyncConfig};
use crate::wire::{Epoch, Gradient, Message, PeerId, MESH_PROTOCOL_VERSION};

/// Step messages held per member from an epoch this node has not reached (a roster, gradients
/// of a step or two, repairs: a handful is all a member in step can send before we catch up).
const HELD_PER_PEER: usize = 8;

/// What the adapter feeds the session.
#[derive(Clone, Debug)]
pub enum Input {
    /// A data channel to `peer` is open.
    Connected(PeerId),
    /// The channel to `peer` is gone.
    Disconnected(PeerId),
    /// A decoded, reassembled message from `from`.
    Received { from: PeerId, message: Message },
    /// Our gradient for a step we were asked to compute (`whash`: our weights before it).
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
    /// The user pushes a checkpoint to the whole group.
    PushCheckpoint { bytes: Vec<u8> },
    /// The user removes `peer` from the run (leader only): it is told why and stays out.
    Kick { peer: PeerId, why: String },
    /// The user vouches that `peer` is gone for good (crashed, or quit where its word could not
    /// reach us): the quorum stops counting it, as if it had said it was leaving. For a group
    /// that lost a majority of its members for good and stands by (`docs/PROTOCOL.md`).
    Forget { peer: PeerId },
}

/// Why a node stands by: it leads, computes and applies nothing, keeps its state, and waits to
/// be resumed by a leader of its run (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub enum Standby {
    /// Its roster would lack a quorum of the base.
    QuorumLost,
    /// It led, and `by` took its place (told with -13).
    Deposed { by: PeerId },
    /// It led, and woke from a sleep its followers may have deposed it for: it waits for word
    /// until `until_ms`, then leads on.
    Woke { until_ms: u64 },
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
    /// Compute our gradient for `step` at the current weights; answer `Computed`.
    Compute {
        step: u32,
    },
    /// End sync `step` with the group's mean (`grid`: the grid it was summed on, `int8`
    /// only): one optimizer update (`every-step`) or one outer step (`outer:H`).
    Apply {
        step: u32,
        mean: Vec<f32>,
        grid: Vec<u8>,
        loss: f32,
    },
    /// Send `to` a resume message (-6) with a checkpoint of the current state (a step boundary).
    SendSnapshot {
        to: PeerId,
    },
    /// Replace the state with a checkpoint; answer `Restored`.
    Restore {
        bytes: Vec<u8>,
    },
    /// Elastic windows: another member finished its whole window of `step` (`H` inner steps)
    /// first, so ours ends after the inner step under way (`Compute { step }` is still
    /// answered, with the steps done). Said once a step, after its `Compute`, even when ours is
    /// done (the adapter times windows by it). Nothing to answer.
    Hurry {
        step: u32,
    },
    Event(Event),
}

/// What happened, for the console and the JSON-lines stream.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    PeerJoined(PeerId),
    PeerLeft(PeerId),
    Leader(PeerId),
    RunStarted {
        leader: PeerId,
        settings: RunConfig,
    },
    Roster {
        step: u32,
        peers: Vec<PeerId>,
    },
    StepApplied {
        step: u32,
        loss: f32,
        peers: usize,
        whash: u32,
        /// Elastic windows: each roster member's weight in the mean (the inner steps its
        /// contribution stands for), in roster order; empty otherwise.
        weights: Vec<(PeerId, u32)>,
    },
    RepairRequested {
        step: u32,
        peer: PeerId,
    },
    Repaired {
        step: u32,
        peer: PeerId,
    },
    RepairServed {
        step: u32,
        peer: PeerId,
        to: PeerId,
    },
    Resumed {
        step: u32,
    },
    CheckpointRestored {
        from: PeerId,
        step: u32,
    },
    GuardStopped(GuardFailure),
    RunFinished {
        step: u32,
    },
    Ignored {
        from: PeerId,
        why: String,
    },
    /// Something the session could not do, or why its run stopped.
    Problem(Problem),
    /// (Leader) `peer` delivered nothing for `step` within the step deadline, or was kicked:
    /// the step goes on without it. A dropped (not kicked) member comes back through a resume
    /// as soon as it shows life.
    Dropped {
        peer: PeerId,
        step: u32,
        why: DropReason,
    },
    /// (Leader) a dropped member showed life: it is resumed at the next step boundary.
    Readmitted(PeerId),
    /// A checkpoint push from `from` was refused: only the run's leader may push.
    PushRefused {
        from: PeerId,
    },
    /// `peer`'s contribution to `step` was not finite or past the bound: refused on arrival
    /// (never summed). The leader then drops the peer from the step.
    ContributionRefused {
        peer: PeerId,
        step: u32,
        why: OutOfBounds,
    },
    /// The leader took this node out of the roster at `step`, saying why; it contributes
    /// nothing until the leader resumes it.
    Removed {
        step: u32,
        why: String,
    },
    /// This node's roster would lack a quorum of `base` (it could reach only `have`): it stands
    /// by at `step` steps applied — the last of them possibly not the run's — until a leader of
    /// the run resumes it.
    QuorumLost {
        step: u32,
        have: Vec<PeerId>,
        base: Vec<PeerId>,
    },
    /// (Follower) nothing came from `leader` for `silent_ms` during `step`: it is deposed, and
    /// the successor is chosen without it.
    LeaderDeposed {
        leader: PeerId,
        step: u32,
        silent_ms: u64,
    },
    /// (The old leader) `by` took this node's place while it was silent; it stands by, at
    /// `step` steps applied — the last of them possibly not the run's — until `by` resumes it.
    Deposed {
        by: PeerId,
        step: u32,
        why: String,
    },
    /// No tick for `ms`: this node was suspended or starved (its timers skip the gap).
    Slept {
        ms: u64,
    },
    /// `peer` said it is quitting: the quorum no longer counts it.
    PeerLeaving(PeerId),
    /// The user vouched that `peer` is gone for good: the quorum no longer counts it.
    Forgotten(PeerId),
    /// A leader that stood by after a sleep heard of no successor: it leads on from `step`.
    LeadsOn {
        step: u32,
    },
    /// Elastic windows: this node's window of `step` ended after `steps` of its `of` inner steps
    /// (another member finished the window first) — it trains slower than the group's fastest.
    Behind {
        step: u32,
        steps: u32,
        of: u32,
    },
}

/// Why the leader took a member out of a step (the removed member is told in words: wire `-13`).
#[derive(Clone, Debug, PartialEq)]
pub enum DropReason {
    /// Nothing arrived from it within the step deadline.
    Deadline { step: u32, deadline_ms: u64 },
    /// The user removed it, saying why; it stays out.
    Kicked(String),
    /// Its contribution was refused on arrival.
    Refused { step: u32, why: OutOfBounds },
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DropReason::Deadline { step, deadline_ms } => {
                write!(f, "no gradient for step {step} within the step deadline ({deadline_ms} ms)")
            }
            DropReason::Kicked(why) => write!(f, "removed: {why}"),
            DropReason::Refused { step, why } => write!(f, "its contribution to step {step} was refused: {why}"),
        }
    }
}

/// An error from outside the session (the replica's, the adapter's), kept whole and typed until
/// a person reads it. Two failures are equal when they say the same (events are compared in
/// tests); the error itself can be downcast.
#[derive(Clone, Debug)]
pub struct Failure(pub Arc<dyn std::error::Error + Send + Sync>);

impl Failure {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Failure {
        Failure(Arc::new(error))
    }
}

impl PartialEq for Failure {
    fn eq(&self, other: &Failure) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A task the session gives the adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    Configure,
    Restore,
    Compute { step: u32 },
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Task::Configure => f.write_str("configuring the run"),
            Task::Restore => f.write_str("restoring a checkpoint"),
            Task::Compute { step } => write!(f, "computing step {step}"),
        }
    }
}

/// What only the run's leader may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaderAction {
    Push,
    Kick,
}

/// Why this node's run stopped: it contributes nothing until a resume or a new run.
#[derive(Clone, Debug, PartialEq)]
pub enum Stop {
    /// The guard found replicas disagreeing.
    Guard(GuardFailure),
    /// The leader took this node out of the run, not to return.
    Removed { step: u32, why: String },
    /// A step was committed that this node never heard announced.
    Unannounced { step: u32 },
    /// This node's replica could not compute its contribution.
    Compute { step: u32, error: Failure },
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Guard(failure) => write!(f, "{failure}"),
            Stop::Removed { step, why } => write!(f, "removed from the run at step {step}: {why}"),
            Stop::Unannounced { step } => write!(f, "step {step} was committed but never announced here"),
            Stop::Compute { step, error } => {
                write!(f, "computing step {step} failed, this node stops contributing: {error}")
            }
        }
    }
}

/// What the session could not do, or why its run stopped: a type until the edge, where the
/// console and the headless JSON each make one text of it ([`Problem`]'s `Display`).
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// The replica failed a task the session gave it (the session stays as it was).
    Failed { task: Task, error: Failure },
    /// A restore is already under way.
    Busy,
    /// Only the run's leader may do this.
    NotLeader { action: LeaderAction, leader: Option<PeerId> },
    /// The leader cannot remove itself.
    KickSelf,
    /// A run is already going.
    RunGoing,
    /// The adapter answered a task the session had not given.
    Unasked(Task),
    /// The leader left before this node was in step: it waits for the new leader's config.
    LeaderLeftBeforeInStep,
    /// The run stopped here.
    Stopped(Stop),
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let leader = |leader: &Option<PeerId>| leader.map_or_else(|| "no leader".to_string(), |l| format!("node {l}"));
        match self {
            Problem::Failed { task, error } => write!(f, "{task} failed: {error}"),
            Problem::Busy => f.write_str("busy: a restore is already under way"),
            Problem::NotLeader { action: LeaderAction::Push, leader: l } => write!(
                f,
                "only the run's leader ({}) may push a checkpoint to the group; ask it to load the file",
                leader(l)
            ),
            Problem::NotLeader { action: LeaderAction::Kick, leader: l } => {
                write!(f, "only the run's leader ({}) can remove a member", leader(l))
            }
            Problem::KickSelf => f.write_str("the leader cannot remove itself; quit instead"),
            Problem::RunGoing => f.write_str("a run is already going"),
            Problem::Unasked(task) => write!(f, "the adapter answered {task}, which nobody asked for"),
            Problem::LeaderLeftBeforeInStep => {
                f.write_str("the leader left before this node was in step; waiting for the new leader")
            }
            Problem::Stopped(stop) => write!(f, "{stop}"),
        }
    }
}

impl Problem {
    /// A short stable name for machines (the headless JSON's `kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::Failed { .. } => "failed",
            Problem::Busy => "busy",
            Problem::NotLeader { .. } => "not-leader",
            Problem::KickSelf => "kick-self",
            Problem::RunGoing => "run-going",
            Problem::Unasked(_) => "unasked",
            Problem::LeaderLeftBeforeInStep => "leader-left",
            Problem::Stopped(_) => "stopped",
        }
    }
}

/// Settings of one node's session.
#[derive(Clone, Copy, Debug)]
pub struct SessionConfig {
    pub me: PeerId,
    /// The probe hash every healthy backend reports.
    pub expected_phash: u32,
    /// How long a follower waits for a roster gradient before asking the leader.
    pub repair_after_ms: u64,
    /// How long the leader waits for a roster member's gradient before the step goes on
    /// without it.
    pub deadline: StepDeadline,
    /// Elastic windows, the leader's rule for slow members: a member whose contributions stood
    /// for a quarter of the window or less in each of its last `slow_windows` syncs is taken out
    /// of the run for good (told why); 0 keeps every member, however slow (the default: a slow
    /// member's steps still count).
    pub slow_windows: u32,
}

/// The step deadline: `factor` times the longest of the last few steps (announce to apply, as
/// the leader saw them), never below `floor_ms` nor above `ceiling_ms`; `ceiling_ms` until a
/// step has been timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepDeadline {
    pub floor_ms: u64,
    pub ceiling_ms: u64,
    pub factor: u64,
}

impl Default for StepDeadline {
    fn default() -> Self {
        StepDeadline { floor_ms: 10_000, ceiling_ms: 120_000, factor: 4 }
    }
}

/// Steps the deadline looks back over.
const TIMED_STEPS: usize = 8;

/// Why the adapter is owed an answer.
#[derive(Clone, Debug, PartialEq)]
enum Pending {
    Configure,
    /// A resume from the leader, whose epoch it is.
    Resume(Epoch),
    /// A push from `from` (ours carries its bytes, to send on once restored here).
    Push {
        from: PeerId,
        bytes: Option<Vec<u8>>,
        epoch: Epoch,
    },
}

/// The session state machine. See the module docs.
pub struct Session {
    config: SessionConfig,
    now_ms: u64,
    members: BTreeSet<PeerId>,
    run: Option<RunConfig>,
    leader: Option<PeerId>,
    weights: usize,
    /// Steps applied: the weights are the result of `applied` updates.
    applied: u32,
    /// The step being collected (`applied + 1`).
    collector: Option<StepCollector>,
    collector_since_ms: u64,
    /// When our own gradient for the step in flight was ready (the network's part of the
    /// wait starts there).
    own_ready_ms: Option<u64>,
    /// The network part of the last steps (our gradient ready to the step's end, ms), of
    /// steps that needed no repair.
    net_waits: std::collections::VecDeque<u64>,
    /// This node asked for a repair (or, leading, repeated a roster) in the step in flight.
    repaired_in_step: bool,
    last_repair_ms: Option<u64>,
    /// Roster of `applied + 2`, received before `applied + 1` could be applied (the commit).
    commit: Option<Vec<PeerId>>,
    /// Gradients for `applied + 2` that arrived before its roster.
    early: BTreeMap<PeerId, Gradient>,
    /// Elastic windows: the last step whose window we were told to end ([`Output::Hurry`]),
    /// and the last step we were asked to compute (a hurry comes after its `Compute`).
    hurried: Option<u32>,
    asked: Option<u32>,
    /// Elastic windows: per member, the syncs in a row whose contribution stood for a quarter
    /// of the window or less ([`SessionConfig::slow_windows`]).
    slow: BTreeMap<PeerId, u32>,
    /// Leader: everyone's gradients of the last steps, and those steps' final rosters.
    repairs: RepairStore,
    /// Leader: members in step with the run (they get rosters).
    synced: BTreeSet<PeerId>,
    /// Leader: members to resume at the next step boundary.
    joiners: BTreeSet<PeerId>,
    /// Leader: members dropped for missing the step deadline (back on their first sign of
    /// life), and members kicked (back only if someone readmits them).
    dropped: BTreeSet<PeerId>,
    kicked: BTreeSet<PeerId>,
    /// Leader: how long the last steps took, announce to apply (ms).
    step_times: std::collections::VecDeque<u64>,
    /// The leader took us out of the roster; nothing is contributed until a resume.
    removed: bool,
    /// Leader: the step in flight lost members to the deadline (its time says nothing about
    /// how long steps take, so it is not timed).
    dropped_in_step: bool,
    /// The last roster announced or received, for choosing a successor.
    last_roster: Vec<PeerId>,
    /// The final roster of the last step applied here: the quorum's base.
    base: Vec<PeerId>,
    /// Members that said they are leaving: the quorum does not count them.
    leaving: BTreeSet<PeerId>,
    /// Leaders deposed for silence: no successor is chosen among them while they stay silent.
    deposed: BTreeSet<PeerId>,
    /// Why this node stands by, if it does.
    standby: Option<Standby>,
    /// (Follower) when anything last came from the leader.
    leader_heard_ms: u64,
    /// The last tick's `now`: a long gap since then means this node slept.
    last_tick_ms: Option<u64>,
    /// (Standing by) when this node last showed the members it is alive.
    shown_life_ms: u64,
    /// Members that said they stand by, with the steps each holds (until they send a step).
    standing_by: BTreeMap<PeerId, u32>,
    /// Whom each member said it follows (`-17`): a leader's quorum counts its own followers.
    follows: BTreeMap<PeerId, PeerId>,
    /// (A new leader) since when it waits for the members to follow it, and the step it will
    /// announce once a quorum does.
    claim: Option<(u64, u32, Vec<PeerId>)>,
    /// (Leader) when it last said `-17` to everyone: while it waits on the network it says so
    /// every quarter deadline, so its followers can tell a slow step from a hung leader.
    heartbeat_ms: u64,
    /// The checkpoint push this node's state descends from.
    epoch: Epoch,
    /// Each member's epoch, as it last announced it.
    peer_epochs: BTreeMap<PeerId, Epoch>,
    /// Step messages from members already in a later epoch, in arrival order.
    held: Vec<(PeerId, Epoch, Message)>,
    pending: Option<Pending>,
    stopped: Option<Stop>,
    finished: bool,
    /// Leader: times the final commit was repeated.
    final_repeats: u32,
    ignored: u64,
    out: Vec<Output>,
}

impl Session {
    pub fn new(config: SessionConfig) -> Self {
        Session {
            config,
            now_ms: 0,
            members: BTreeSet::new(),
            run: None,
            leader: None,
            weights: 0,
            applied: 0,
            collector: None,
            collector_since_ms: 0,
            own_ready_ms: None,
            net_waits: std::collections::VecDeque::new(),
            repaired_in_step: false,
            last_repair_ms: None,
            commit: None,
            early: BTreeMap::new(),
            hurried: None,
            asked: None,
            slow: BTreeMap::new(),
            repairs: RepairStore::default(),
            synced: BTreeSet::new(),
            joiners: BTreeSet::new(),
            dropped: BTreeSet::new(),
            kicked: BTreeSet::new(),
            step_times: std::collections::VecDeque::new(),
            removed: false,
            dropped_in_step: false,
            last_roster: Vec::new(),
            base: Vec::new(),
            leaving: BTreeSet::new(),
            deposed: BTreeSet::new(),
            standby: None,
            leader_heard_ms: 0,
            last_tick_ms: None,
            shown_life_ms: 0,
            standing_by: BTreeMap::new(),
            follows: BTreeMap::new(),
            claim: None,
            heartbeat_ms: 0,
            epoch: Epoch::default(),
            peer_epochs: BTreeMap::new(),
            held: Vec::new(),
            pending: None,
            stopped: None,
            finished: false,
            final_repeats: 0,
            ignored: 0,
            out: Vec::new(),
        }
    }

    pub fn me(&self) -> PeerId {
        self.config.me
    }

    pub fn leader(&self) -> Option<PeerId> {
        self.leader
    }

    pub fn is_leader(&self) -> bool {
        self.leader == Some(self.config.me)
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

    /// Why this node stands by (leads, computes and applies nothing), if it does.
    pub fn standby(&self) -> Option<&Standby> {
        self.standby.as_ref()
    }

    /// The checkpoint push this node's state descends from.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Messages ignored so far (duplicates, late, out of range, outsiders), over the run.
    pub fn ignored(&self) -> u64 {
        self.ignored
    }

    /// Feeds one input; returns what to do, in order.
    pub fn handle(&mut self, input: Input) -> Vec<Output> {
        match input {
            Input::Connected(peer) => self.on_connected(peer),
            Input::Disconnected(peer) => self.on_disconnected(peer),
            Input::Received { from, message } => {
                if self.members.contains(&from) {
                    // A standing-by leader still shows life (epochs): that is not leading.
                    if self.leader == Some(from) && !matches!(message, Message::Epoch(_)) {
                        self.leader_heard_ms = self.now_ms;
                    }
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
                self.pending = None;
                self.event(Event::Problem(Problem::Failed { task, error }));
            }
            Input::Tick { now_ms } => {
                self.now_ms = now_ms;
                self.on_tick();
            }
            Input::Start(settings) => self.on_start(settings),
            Input::Kick { peer, why } => self.on_kick(peer, why),
            Input::Forget { peer } => {
                self.leaving.insert(peer);
                self.event(Event::Forgotten(peer));
                // Standing by, nobody leading: perhaps the rest are a quorum now.
                if self.standby == Some(Standby::QuorumLost) && self.leader.is_none() && self.in_run() {
                    self.regain();
                }
            }
            Input::PushCheckpoint { bytes } => {
                if self.pending.is_some() {
                    self.event(Event::Problem(Problem::Busy));
                } else if self.run.is_some() && !self.is_leader() {
                    self.event(Event::Problem(Problem::NotLeader { action: LeaderAction::Push, leader: self.leader }));
                } else {
                    let epoch = Epoch { count: self.epoch.count + 1, pusher: self.config.me };
                    self.pending = Some(Pending::Push { from: self.config.me, bytes: Some(bytes.clone()), epoch });
                    self.out.push(Output::Restore { bytes });
                }
            }
        }
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

    fn active(&self) -> bool {
        self.run.is_some()
            && self.stopped.is_none()
            && !self.finished
            && self.pending.is_none()
            && self.standby.is_none()
    }

    /// Whether a run is going here that this node is not out of (it may stand by).
    fn in_run(&self) -> bool {
        self.run.is_some() && self.stopped.is_none() && !self.finished
    }

    // ---- quorum ----

    /// The members whose majority a roster needs: the base (or, before this node applied a
    /// step, the roster in flight), less those that left on purpose or were kicked.
    fn quorum_base(&self) -> Vec<PeerId> {
        let base = if self.base.is_empty() { &self.last_roster } else { &self.base };
        base.iter().copied().filter(|p| !self.leaving.contains(p) && !self.kicked.contains(p)).collect()
    }

    /// This node cannot reach a quorum with `have`: it stands by, keeping its state, and says so.
    fn lose_quorum(&mut self, have: Vec<PeerId>) {
        let base = self.quorum_base();
        self.stand_by(Standby::QuorumLost);
        self.leader = None;
        self.event(Event::QuorumLost { step: self.applied, have, base });
    }

    /// Leads, computes and applies nothing from now until a resume (or, `Woke`, the deadline).
    fn stand_by(&mut self, why: Standby) {
        self.standby = Some(why);
        self.claim = None;
        self.collector = None;
        self.commit = None;
        self.early.clear();
        self.synced.clear();
        self.joiners.clear();
        self.dropped.clear();
        self.show_life();
    }

    /// Standing by: every member hears we are alive and stand by (a leader resumes us; its
    /// followers know it stands by; other members standing by may regain a quorum with us).
    fn show_life(&mut self) {
        self.shown_life_ms = self.now_ms;
        self.broadcast(&Message::StandingBy { applied: self.applied });
    }

    /// Every member hears whom we follow now (a leader names itself).
    fn say_follow(&mut self) {
        if let Some(leader) = self.leader {
            self.broadcast(&Message::Follow { leader });
        }
    }

    /// The members of `roster` that back us as leader: this node, and those we reach that
    /// said they follow us. Only they count toward our quorum — a gradient is sent to every
    /// member, so a member that follows another leader may be in two rosters at once.
    fn backers(&self, roster: &[PeerId]) -> Vec<PeerId> {
        let me = self.config.me;
        roster
            .iter()
            .copied()
            .filter(|p| *p == me || (self.members.contains(p) && self.follows.get(p) == Some(&me)))
            .collect()
    }

    /// Leader: whether the step in flight still has a quorum of backers (a member that
    /// followed another, stood by or left may have taken it away); if not, stand by.
    fn keep_quorum(&mut self) -> bool {
        let Some(collector) = &self.collector else { return true };
        let last = self.run.as_ref().is_some_and(|r| collector.step > r.syncs());
        let backers = self.backers(collector.roster());
        if last || self.claim.is_some() || has_quorum(&self.quorum_base(), &backers) {
            return true;
        }
        self.lose_quorum(backers);
        false
    }

    /// `from` follows `leader` from now on.
    fn on_follow(&mut self, from: PeerId, leader: PeerId) {
        self.follows.insert(from, leader);
        if !self.in_run() || self.pending.is_some() || self.standby.is_some() {
            return;
        }
        let me = self.config.me;
        if self.is_leader() {
            if let Some((_, step, roster)) = self.claim.clone() {
                if leader == me {
                    // One more backer for the step we wait to announce.
                    self.announce(step, roster);
                }
            } else if leader != me {
                self.keep_quorum();
            }
        } else if leader == from && self.leader != Some(from) && self.succeeds_our_leader(from) {
            let step = self.collector.as_ref().map_or(self.applied + 1, |c| c.step);
            self.follow_successor(from, step);
        }
    }

    /// `from` stands by, holding `applied` steps.
    fn on_standing_by(&mut self, from: PeerId, applied: u32) {
        self.standing_by.insert(from, applied);
        self.follows.remove(&from);
        let running = self.run.is_some() && self.stopped.is_none();
        if !running || self.pending.is_some() || self.kicked.contains(&from) {
            return;
        }
        if self.finished && self.is_leader() {
            // The run ended while it stood by: resume it to the end, and say the end again.
            self.send(from, run_config_message(&self.run.expect("a run is going")));
            self.out.push(Output::SendSnapshot { to: from });
            self.synced.insert(from);
            self.final_repeats = 0;
            self.last_repair_ms = None;
            return;
        }
        if self.is_leader() && self.standby.is_none() {
            // A member we hold in step may have said so before our resume reached it (the
            // channel is ordered, our resume is behind it): the deadline settles a real one.
            if !self.synced.contains(&from) && !self.joiners.contains(&from) {
                self.dropped.remove(&from);
                self.joiners.insert(from);
                self.event(Event::Readmitted(from));
            }
        } else if self.leader == Some(from) && !self.is_leader() && self.standby.is_none() {
            // Our leader stands by: it has no quorum where it is (or was deposed). So do we —
            // our last step may be its tentative one — until a leader of the run resumes us.
            let here = self.quorum_base().into_iter().filter(|p| *p == self.config.me || self.members.contains(p));
            let here = here.collect();
            self.lose_quorum(here);
        } else if self.is_leader() && self.standby.is_none() {
            self.keep_quorum();
        }
    }

    // ---- membership ----

    fn on_connected(&mut self, peer: PeerId) {
        if peer == self.config.me || !self.members.insert(peer) {
            return;
        }
        self.leaving.remove(&peer);
        self.deposed.remove(&peer);
        self.event(Event::PeerJoined(peer));
        // Before anything else on this channel: which push our messages follow, and whom we
        // follow.
        self.send(peer, Message::Epoch(self.epoch));
        if let Some(leader) = self.leader.filter(|_| self.in_run() && self.standby.is_none()) {
            self.send(peer, Message::Follow { leader });
        }
        if self.is_leader() && !self.finished && self.stopped.is_none() && !self.kicked.contains(&peer) {
            if let Some(settings) = self.run {
                self.send(peer, run_config_message(&settings));
                self.joiners.insert(peer);
            }
        }
    }

    fn on_disconnected(&mut self, peer: PeerId) {
        if !self.members.remove(&peer) {
            return;
        }
        self.event(Event::PeerLeft(peer));
        self.synced.remove(&peer);
        self.joiners.remove(&peer);
        self.dropped.remove(&peer);
        self.early.remove(&peer);
        self.peer_epochs.remove(&peer);
        self.held.retain(|(from, _, _)| *from != peer);
        self.deposed.remove(&peer);
        self.standing_by.remove(&peer);
        self.follows.remove(&peer);
        if !self.in_run() {
            return;
        }
        if self.standby.is_some() {
            // Standing by: whoever we were about to follow is gone; wait for another.
            if self.leader == Some(peer) {
                self.leader = None;
            }
        } else if self.leader == Some(peer) && self.last_roster.is_empty() {
            // Never in step (a joiner awaiting its resume): wait for the new leader's config.
            self.leader = None;
            self.event(Event::Problem(Problem::LeaderLeftBeforeInStep));
        } else if self.leader == Some(peer) {
            self.succeed();
        } else if self.is_leader() {
            self.drop_from_inflight(peer);
        }
    }

    /// Our leader is gone (or deposed): every node picks the same successor, the smallest id
    /// among the members of the latest roster still here (and not deposed), and itself.
    fn succeed(&mut self) {
        let candidates = self.successor_candidates(None);
        let successor = candidates[0];
        if !has_quorum(&self.quorum_base(), &candidates) {
            // What is left of the roster here is a minority: nobody on this side may decide a
            // step (every member here comes to the same verdict from the same roster).
            self.lose_quorum(candidates);
            return;
        }
        self.leader = Some(successor);
        self.leader_heard_ms = self.now_ms;
        self.event(Event::Leader(successor));
        self.say_follow();
        if successor == self.config.me {
            // Our roster counts only members that follow us: wait for them (a deadline).
            self.claim = Some((self.now_ms, self.applied + 1, Vec::new()));
            self.take_over();
        }
    }

    /// This node just became leader: adopt the members of the latest roster as synced, settle
    /// a commit the old leader sent, and re-announce the in-flight step.
    fn take_over(&mut self) {
        self.synced = self
            .last_roster
            .iter()
            .copied()
            .filter(|p| self.members.contains(p) && !self.deposed.contains(p))
            .collect();
        let step = self.collector.as_ref().map_or(self.applied + 1, |c| c.step);
        // A leader we deposed is taken out of the run (it may return): told so, it stands by,
        // shows life, and is resumed at a step boundary.
        let deposed: Vec<PeerId> = self.deposed.iter().copied().filter(|p| self.members.contains(p)).collect();
        for peer in deposed {
            let why = "deposed: nothing came from it within the step deadline".to_string();
            self.send(peer, Message::Removed { step, may_return: true, why });
            self.dropped.insert(peer);
        }
        // Members not in step (joiners the old leader had not resumed) hear from us and are
        // resumed at the next boundary.
        let settings = self.run.expect("a run is going");
        let unsynced: Vec<PeerId> =
            self.members.iter().copied().filter(|p| !self.synced.contains(p) && !self.dropped.contains(p)).collect();
        for peer in unsynced {
            self.send(peer, run_config_message(&settings));
            self.joiners.insert(peer);
        }
        let Some(collector) = &self.collector else { return };
        let gone = |p: &PeerId| !self.members.contains(p) || self.deposed.contains(p);
        let lost = collector.missing().iter().any(|p| *p != self.config.me && gone(p));
        if self.commit.is_some() && !lost {
            // The old leader committed `applied + 1` and every gradient it needs can still
            // arrive: finish it before announcing anything new.
            self.try_commit();
            return;
        }
        // Otherwise re-announce the step without the gradients that can no longer come. (A node
        // that applied the old leader's commit would now differ; the guard stops it next step.)
        self.commit = None;
        let step = collector.step;
        let roster: Vec<PeerId> = collector
            .roster()
            .iter()
            .copied()
            .filter(|p| *p == self.config.me || !gone(p) || collector.get(*p).is_some())
            .collect();
        self.announce(step, roster);
    }

    /// The step deadline now (see [`StepDeadline`]).
    pub fn deadline_ms(&self) -> u64 {
        let policy = self.config.deadline;
        match self.step_times.iter().max() {
            None => policy.ceiling_ms,
            Some(&longest) => longest.saturating_mul(policy.factor).clamp(policy.floor_ms, policy.ceiling_ms),
        }
    }

    /// Leader: takes `peers` out of the run — each is told why — and re-announces the step in
    /// flight without the ones whose gradients are missing. Dropped members come back on
    /// their first sign of life; kicked ones (`kick`) stay out.
    fn drop_members(&mut self, peers: &[PeerId], why: DropReason) {
        let kick = matches!(why, DropReason::Kicked(_));
        let step = self.collector.as_ref().map_or(self.applied + 1, |c| c.step);
        for &peer in peers {
            self.synced.remove(&peer);
            self.joiners.remove(&peer);
            if kick {
                self.kicked.insert(peer);
                self.dropped.remove(&peer);
            } else {
                self.dropped.insert(peer);
            }
            if self.members.contains(&peer) {
                self.send(peer, Message::Removed { step, may_return: !kick, why: why.to_string() });
            }
            self.event(Event::Dropped { peer, step, why: why.clone() });
        }
        let Some(collector) = &self.collector else { return };
        let gone = |p: &PeerId| peers.contains(p) && collector.get(*p).is_none();
        if collector.roster().iter().any(gone) {
            let roster: Vec<PeerId> = collector.roster().iter().copied().filter(|p| !gone(p)).collect();
            self.announce(step, roster);
        }
    }

    fn on_kick(&mut self, peer: PeerId, why: String) {
        if !self.is_leader() || self.run.is_none() {
            self.event(Event::Problem(Problem::NotLeader { action: LeaderAction::Kick, leader: self.leader }));
        } else if peer == self.config.me {
            self.event(Event::Problem(Problem::KickSelf));
        } else {
            self.drop_members(&[peer], DropReason::Kicked(why));
        }
    }

    /// Leader: `peer` left during the in-flight step.
    fn drop_from_inflight(&mut self, peer: PeerId) {
        let Some(collector) = &self.collector else { return };
        if !collector.roster().contains(&peer) || collector.get(peer).is_some() {
            return; // not in it, or its gradient is here and can be repaired from us
        }
        let step = collector.step;
        let roster: Vec<PeerId> = collector.roster().iter().copied().filter(|p| *p != peer).collect();
        self.announce(step, roster);
    }

    // ---- starting, configuring, restoring ----

    fn on_start(&mut self, settings: RunConfig) {
        if self.run.is_some() && !self.finished && self.stopped.is_none() {
            self.event(Event::Problem(Problem::RunGoing));
            return;
        }
        self.reset_run();
        self.leader = Some(self.config.me);
        self.run = Some(settings);
        self.pending = Some(Pending::Configure);
        self.event(Event::RunStarted { leader: self.config.me, settings });
        self.say_follow();
        self.out.push(Output::Configure(settings));
    }

    fn reset_run(&mut self) {
        self.applied = 0;
        self.base.clear();
        self.last_roster.clear();
        self.leaving.clear();
        self.deposed.clear();
        self.standby = None;
        self.collector = None;
        self.commit = None;
        self.early.clear();
        self.held.clear();
        self.repairs = RepairStore::default();
        self.synced.clear();
        self.joiners.clear();
        self.dropped.clear();
        self.step_times.clear();
        self.net_waits.clear();
        self.removed = false;
        self.stopped = None;
        self.finished = false;
        self.final_repeats = 0;
    }

    fn on_configured(&mut self, weights: usize) {
        if self.pending != Some(Pending::Configure) {
            self.event(Event::Problem(Problem::Unasked(Task::Configure)));
            return;
        }
        self.pending = None;
        self.weights = weights;
        if self.is_leader() {
            let settings = self.run.expect("a run is configured");
            self.broadcast(&run_config_message(&settings));
            self.synced = self.members.clone();
            self.next_step();
        }
    }

    fn on_restored(&mut self, step: u32, weights: usize) {
        let Some(pending) = self.pending.take() else {
            self.event(Event::Problem(Problem::Unasked(Task::Restore)));
            return;
        };
        self.weights = weights;
        self.applied = step;
        self.collector = None;
        self.commit = None;
        self.early.clear();
        // Gradients kept for repair carry step numbers the restored run will use again.
        self.repairs = RepairStore::default();
        self.finished = false;
        self.stopped = None;
        self.removed = false;
        self.standby = None;
        self.base.clear();
        self.leader_heard_ms = self.now_ms;
        match pending {
            Pending::Resume(epoch) => {
                // What this node knew of rosters belongs to the state the resume replaced.
                self.last_roster.clear();
                self.deposed.clear();
                self.enter_epoch(epoch);
                self.event(Event::Resumed { step });
            }
            Pending::Push { from, bytes, epoch } => {
                self.enter_epoch(epoch);
                self.event(Event::CheckpointRestored { from, step });
                if let Some(bytes) = bytes {
                    // Our own push: restored here first, now the group (after our epoch).
                    self.broadcast(&Message::CheckpointPush(bytes));
                }
            }
            Pending::Configure => {}
        }
        if self.is_leader() {
            self.next_step();
        }
        self.replay_held();
    }

    // ---- epochs ----

    /// The epoch `peer` last announced (a member that has announced none is at the start).
    fn epoch_of(&self, peer: PeerId) -> Epoch {
        self.peer_epochs.get(&peer).copied().unwrap_or_default()
    }

    /// From now on our state descends from `epoch`; every member hears of it.
    fn enter_epoch(&mut self, epoch: Epoch) {
        if epoch != self.epoch {
            self.epoch = epoch;
            self.broadcast(&Message::Epoch(epoch));
        }
    }

    /// A step message is taken in the epoch its sender is in: now if it is ours (returned),
    /// later if it is ahead of ours (held), never if it is behind.
    fn admit(&mut self, from: PeerId, message: Message) -> Option<Message> {
        let theirs = self.epoch_of(from);
        match theirs.cmp(&self.epoch) {
            std::cmp::Ordering::Equal => return Some(message),
            std::cmp::Ordering::Less => {
                let why = format!("a step message from before {} (the sender has not restored it yet)", self.epoch);
                self.ignore(from, &why);
            }
            std::cmp::Ordering::Greater => {
                let theirs_held = || self.held.iter().filter(|(f, _, _)| *f == from);
                if theirs_held().any(|(_, _, m)| *m == message) {
                    // A roster the leader repeats while we are still restoring: one will do.
                } else if theirs_held().count() < HELD_PER_PEER {
                    self.held.push((from, theirs, message));
                } else {
                    self.ignore(
                        from,
                        &format!("too many step messages from {theirs}, which this node has not restored"),
                    );
                }
            }
        }
        None
    }

    /// Messages held for the epoch we are now in are taken, in arrival order; those of an
    /// epoch we passed are dropped; later ones wait on.
    fn replay_held(&mut self) {
        for (from, epoch, message) in std::mem::take(&mut self.held) {
            match epoch.cmp(&self.epoch) {
                std::cmp::Ordering::Equal => self.dispatch(from, message),
                std::cmp::Ordering::Less => self.ignore(from, &format!("a step message from {epoch}, since replaced")),
                std::cmp::Ordering::Greater => self.held.push((from, epoch, message)),
            }
        }
    }

    // ---- steps ----

    /// Leader: announce the roster of the next step (or the final commit).
    fn next_step(&mut self) {
        let Some(settings) = &self.run else { return };
        let total = settings.syncs();
        if self.applied >= total {
            // The final commit; `on_roster` marks the run finished.
            self.announce(self.applied + 1, Vec::new());
            return;
        }
        let settings = *settings;
        self.drop_slow_members();
        let joiners: Vec<PeerId> =
            std::mem::take(&mut self.joiners).into_iter().filter(|p| self.members.contains(p)).collect();
        let mut roster: Vec<PeerId> = self.synced.iter().copied().filter(|p| self.members.contains(p)).collect();
        roster.extend(&joiners);
        roster.push(self.config.me);
        roster.sort_unstable();
        roster.dedup();
        if !has_quorum(&self.quorum_base(), &roster) {
            // Checked before any joiner is resumed into a step that cannot commit.
            self.lose_quorum(roster);
            return;
        }
        for peer in joiners {
            // The config first: a member standing by follows whoever sends it, then takes the
            // resume from it.
            self.send(peer, run_config_message(&settings));
            self.out.push(Output::SendSnapshot { to: peer });
            self.synced.insert(peer);
        }
        self.announce(self.applied + 1, roster);
    }

    /// Leader: send a roster to every member in step with the run (a joiner gets its first
    /// roster right after its resume) and act on it locally.
    fn announce(&mut self, step: u32, roster: Vec<PeerId>) {
        let last = self.run.as_ref().is_some_and(|r| step > r.syncs());
        // Counted over our backers: a gradient held from a member that is gone, or that
        // follows another leader, is summed, but that member does not back this roster.
        let backers = self.backers(&roster);
        if !last && !has_quorum(&self.quorum_base(), &backers) {
            if self.claim.is_some() {
                // Newly leading: the members may not have heard yet; wait (a deadline at most).
                let since = self.claim.as_ref().map_or(self.now_ms, |c| c.0);
                self.claim = Some((since, step, roster));
            } else {
                self.lose_quorum(backers);
            }
            return;
        }
        self.claim = None;
        let targets: Vec<PeerId> = self.synced.iter().copied().filter(|p| self.members.contains(p)).collect();
        for to in targets {
            self.send(to, Message::Roster { step, peers: roster.clone() });
        }
        self.on_roster(step, roster);
    }

    fn on_roster(&mut self, step: u32, peers: Vec<PeerId>) {
        if step <= self.applied {
            self.ignore(self.leader.unwrap_or(0), "a roster for a step already applied");
            return;
        }
        if step == self.applied + 2 {
            // The commit of `applied + 1`.
            self.commit = Some(peers);
            self.try_commit();
            return;
        }
        if step != self.applied + 1 {
            // Sent before a checkpoint push or resume that this node has already restored.
            self.ignore(self.leader.unwrap_or(0), "a roster for a step beyond the next two");
            return;
        }
        self.last_roster = peers.clone();
        self.event(Event::Roster { step, peers: peers.clone() });
        if self.run.as_ref().is_some_and(|r| step > r.syncs()) {
            // The final commit has nothing after it.
            self.finished = true;
            self.event(Event::RunFinished { step: self.applied });
            return;
        }
        match &mut self.collector {
            Some(c) if c.step == step => {
                // A revised step waited on someone: its time says nothing of how long steps take.
                self.dropped_in_step |= c.roster() != peers.as_slice();
                c.revise(peers);
                // A repeated roster means the leader still misses someone; if that could be
                // us, say our gradient again.
                let resend = c.get(self.config.me).cloned().filter(|_| !self.is_leader());
                if let (Some(gradient), Some(leader)) = (resend, self.leader) {
                    self.send(leader, Message::Gradient(gradient));
                }
                if self.commit.is_some() {
                    self.try_commit();
                    return;
                }
            }
            _ => {
                let sync = self.run.as_ref().map_or(SyncConfig::SEED, |r| r.sync);
                self.collector = Some(StepCollector::new(step, peers.clone(), self.weights, &sync));
                (self.hurried, self.asked) = (None, None);
                self.collector_since_ms = self.now_ms;
                self.own_ready_ms = None;
                self.repaired_in_step = false;
                self.last_repair_ms = None;
                for (from, gradient) in std::mem::take(&mut self.early) {
                    self.offer(from, gradient);
                }
                if peers.contains(&self.config.me) {
                    self.out.push(Output::Compute { step });
                    self.asked = Some(step);
                    self.hurry_if_beaten();
                }
            }
        }
        if self.is_leader() {
            self.leader_try_complete();
        }
    }

    fn on_computed(&mut self, gradient: Gradient) {
        if !(self.active() || self.woke()) || self.removed {
            return;
        }
        let Some(collector) = &self.collector else { return };
        if collector.step != gradient.step {
            return; // a stale result (the roster moved on)
        }
        let targets: Vec<PeerId> =
            collector.roster().iter().copied().filter(|p| *p != self.config.me && self.members.contains(p)).collect();
        for to in targets {
            self.send(to, Message::Gradient(gradient.clone()));
        }
        self.own_ready_ms = Some(self.now_ms);
        self.offer(self.config.me, gradient);
        self.after_offer();
    }

    fn offer(&mut self, from: PeerId, gradient: Gradient) {
        let step = gradient.step;
        let Some(collector) = &mut self.collector else {
            if step == self.applied + 1 || step == self.applied + 2 {
                self.early.insert(from, gradient);
            } else {
                self.ignore(from, "a gradient for a step not being collected");
            }
            return;
        };
        if step == collector.step + 1 {
            self.early.insert(from, gradient);
            return;
        }
        let why = match collector.offer(from, gradient) {
            Offer::Accepted => {
                if from != self.config.me {
                    self.hurry_if_beaten();
                }
                return;
            }
            Offer::WrongWeight { weight, allowed } => {
                format!("a gradient of weight {weight}, the run allows {}..={}", allowed.start(), allowed.end())
            }
            Offer::Duplicate => format!("a duplicate gradient for step {step}"),
            Offer::WrongStep { step } => format!("a gradient for step {step}, not the current one"),
            Offer::NotInRoster => format!("a gradient for step {step} from outside its roster"),
            Offer::WrongEncoding { expected, actual } => {
                format!("a gradient sent as {actual}, the run's compression is {expected}")
            }
            Offer::WrongLength { expected, actual } => {
                format!("a gradient of {actual} values, the model has {expected}")
            }
            Offer::OutOfBounds(e) => {
                // Refused before it can reach a sum; the leader takes the sender out of the step
                // (it comes back, resumed from the group, on its next sign of life), so nothing
                // waits for it.
                self.event(Event::ContributionRefused { peer: from, step, why: e });
                if self.is_leader() && from != self.config.me {
                    self.drop_members(&[from], DropReason::Refused { step, why: e });
                }
                return;
            }
        };
        self.ignore(from, &why);
    }

    /// Elastic windows: once another member's whole window (a contribution of weight `H`) for a
    /// step we were asked to compute is here, the window is over: ours ends after its inner step
    /// under way (once a step; said even when ours is done, so the adapter learns how long
    /// windows last).
    fn hurry_if_beaten(&mut self) {
        let Some(h) = self.run.as_ref().filter(|r| r.sync.elastic).map(|r| r.sync.mode.steps_per_sync()) else {
            return;
        };
        let Some(collector) = &self.collector else { return };
        let me = self.config.me;
        let whole = |p: &PeerId| collector.get(*p).is_some_and(|g| g.weight == h);
        let beaten = collector.roster().iter().any(|p| *p != me && whole(p));
        let asked = self.asked == Some(collector.step);
        if asked && beaten && self.hurried != Some(collector.step) {
            self.hurried = Some(collector.step);
            self.out.push(Output::Hurry { step: collector.step });
        }
    }

    fn after_offer(&mut self) {
        if self.is_leader() {
            self.leader_try_complete();
        } else if self.commit.is_some() {
            self.try_commit();
        } else {
            // Every node runs the guard on its own as soon as it holds the whole roster: the
            // leader's refusal to commit is not a message anyone would receive.
            self.early_guard();
        }
    }

    fn early_guard(&mut self) {
        let Some(collector) = &self.collector else { return };
        let Some(ours) = collector.get(self.config.me).map(|g| g.whash) else { return };
        if !collector.is_complete() {
            return;
        }
        if let Err(failure) = collector.guard(ours, self.config.expected_phash) {
            self.stop_with(failure);
        }
    }

    /// Leader: apply the step once every roster gradient is here, then announce the next.
    fn leader_try_complete(&mut self) {
        if !self.active() || self.collector.as_ref().is_none_or(|c| !c.is_complete()) {
            return;
        }
        // Our backers at the moment of commit, not only at the announce.
        if !self.keep_quorum() {
            return;
        }
        if self.apply_collected() {
            self.next_step();
        }
    }

    /// Follower: apply the committed step once every gradient is here; ask for repairs if not.
    fn try_commit(&mut self) {
        if !self.active() {
            return;
        }
        let Some(collector) = &self.collector else {
            self.stop(Stop::Unannounced { step: self.applied + 1 });
            return;
        };
        if !collector.is_complete() {
            self.request_repairs();
            return;
        }
        if !self.apply_collected() {
            return;
        }
        if let Some(next) = self.commit.take() {
            if self.is_leader() {
                // We took over with a commit pending: announce afresh from the members we see.
                self.next_step();
            } else {
                self.on_roster(self.applied + 1, next);
            }
        }
    }

    /// Guard, average in roster order, apply. False if the guard stopped the run.
    fn apply_collected(&mut self) -> bool {
        let collector = self.collector.take().expect("checked by the caller");
        let me = self.config.me;
        let Some(ours) = collector.get(me).map(|g| g.whash) else {
            // Not in the roster: this node is not in step (it waits for a resume).
            self.applied = collector.step;
            return true;
        };
        if let Err(failure) = collector.guard(ours, self.config.expected_phash) {
            self.stop_with(failure);
            return false;
        }
        let reduced = collector.average().expect("complete");
        let loss = collector.mean_loss().unwrap_or(f32::NAN);
        let peers = collector.roster().len();
        let step = collector.step;
        let weights = if self.run.as_ref().is_some_and(|r| r.sync.elastic) { collector.weights() } else { Vec::new() };
        self.base = collector.roster().to_vec();
        // Every node times its steps: the leader for its deadline, followers for how long a
        // silent leader may be silent.
        if !std::mem::take(&mut self.dropped_in_step) {
            self.step_times.push_back(self.now_ms.saturating_sub(self.collector_since_ms));
            if self.step_times.len() > TIMED_STEPS {
                self.step_times.pop_front();
            }
        }
        if self.is_leader() {
            self.repairs.retain(collector);
        }
        // A step that needed repairs says how long repairs take, not the link: not counted
        // (counting it would stretch the next waits, and so the next repairs, ever further).
        if let Some(ready) = self.own_ready_ms.filter(|_| !std::mem::take(&mut self.repaired_in_step)) {
            self.net_waits.push_back(self.now_ms.saturating_sub(ready));
            if self.net_waits.len() > TIMED_STEPS {
                self.net_waits.pop_front();
            }
        }
        self.applied = step;
        self.note_speeds(step, &weights);
        self.out.push(Output::Apply { step, mean: reduced.mean, grid: reduced.grid, loss });
        self.event(Event::StepApplied { step, loss, peers, whash: ours, weights });
        true
    }

    /// Elastic windows: counts each member's slow syncs in a row, and says so when our own
    /// window ended early.
    fn note_speeds(&mut self, step: u32, weights: &[(PeerId, u32)]) {
        let Some(h) = self.run.as_ref().map(|r| r.sync.mode.steps_per_sync()) else { return };
        for &(peer, steps) in weights {
            if steps.saturating_mul(4) <= h {
                *self.slow.entry(peer).or_default() += 1;
            } else {
                self.slow.remove(&peer);
            }
            if peer == self.config.me && steps < h {
                self.event(Event::Behind { step, steps, of: h });
            }
        }
    }

    /// Leader, at a sync boundary: takes out the members the slow-member rule names.
    fn drop_slow_members(&mut self) {
        let windows = self.config.slow_windows;
        if windows == 0 {
            return;
        }
        let me = self.config.me;
        let slow: Vec<PeerId> =
            self.slow.iter().filter(|(p, n)| **n >= windows && **p != me).map(|(p, _)| *p).collect();
        for peer in slow {
            self.slow.remove(&peer);
            let why =
                format!("too slow: each of its last {windows} contributions stood for a quarter of the window or less");
            self.drop_members(&[peer], DropReason::Kicked(why));
        }
    }

    fn stop_with(&mut self, failure: GuardFailure) {
        self.stopped = Some(Stop::Guard(failure.clone()));
        self.event(Event::GuardStopped(failure));
    }

    fn stop(&mut self, stop: Stop) {
        self.stopped = Some(stop.clone());
        self.event(Event::Problem(Problem::Stopped(stop)));
    }

    // ---- repair ----

    fn on_tick(&mut self) {
        let gap = self.last_tick_ms.map_or(0, |t| self.now_ms.saturating_sub(t));
        self.last_tick_ms = Some(self.now_ms);
        if self.in_run() && gap > self.deadline_ms() / 2 {
            self.slept(gap);
        }
        if self.finished && self.is_leader() && self.stopped.is_none() {
            self.repeat_final_commit();
            return;
        }
        if let Some(standby) = self.standby.clone() {
            if self.in_run() && self.pending.is_none() {
                self.standby_tick(standby);
            }
            return;
        }
        if !self.active() {
            return;
        }
        let me = self.config.me;
        let waiting_on_others =
            self.collector.as_ref().is_none_or(|c| !c.roster().contains(&me) || c.get(me).is_some());
        if self.is_leader()
            && waiting_on_others
            && self.now_ms.saturating_sub(self.heartbeat_ms) >= self.deadline_ms() / 4
        {
            // Not while computing: a leader whose own compute hangs is silent, and deposed.
            self.heartbeat_ms = self.now_ms;
            self.broadcast(&Message::Follow { leader: me });
        }
        if let Some((since, _, roster)) = self.claim.clone() {
            if self.is_leader() && self.now_ms.saturating_sub(since) >= self.deadline_ms() {
                // A deadline newly leading, and too few follow us: we are a minority.
                let backers = self.backers(&roster);
                self.lose_quorum(backers);
                return;
            }
        }
        let Some(collector) = &self.collector else { return };
        let waited = self.now_ms.saturating_sub(self.collector_since_ms);
        let deadline = self.deadline_ms();
        if self.is_leader() && waited >= deadline {
            let step = collector.step;
            let silent: Vec<PeerId> = collector.missing().into_iter().filter(|p| *p != self.config.me).collect();
            if !silent.is_empty() {
                self.dropped_in_step = true;
                self.drop_members(&silent, DropReason::Deadline { step, deadline_ms: deadline });
                return;
            }
        }
        let Some(collector) = &self.collector else { return };
        let me = self.config.me;
        if let Some(leader) = self.leader.filter(|l| *l != me) {
            // Our contribution is out and the leader says nothing: past 1.5 × the deadline (the
            // leader itself waits one deadline for a late member, then says so) it is deposed.
            if collector.roster().contains(&me) && collector.get(me).is_some() {
                let since = self.leader_heard_ms.max(self.own_ready_ms.unwrap_or(self.collector_since_ms));
                let silent_ms = self.now_ms.saturating_sub(since);
                if silent_ms >= self.depose_after_ms() {
                    let step = collector.step;
                    self.deposed.insert(leader);
                    self.event(Event::LeaderDeposed { leader, step, silent_ms });
                    self.succeed();
                    return;
                }
            }
        }
        let Some(collector) = &self.collector else { return };
        // Repairs wait on the network, not on compute: while our own gradient is being
        // computed nothing can be late yet (an outer step computes for many seconds), and the
        // others' are measured from when ours was ready.
        let computing = collector.roster().contains(&self.config.me) && collector.get(self.config.me).is_none();
        if computing {
            return;
        }
        let waited = self.now_ms.saturating_sub(self.own_ready_ms.unwrap_or(self.collector_since_ms));
        if self.is_leader() {
            // A roster member that has not sent its gradient may have missed the roster (or the
            // commit before it): say it again, at most once per repair interval.
            let after = self.repair_after_ms();
            if waited >= after && self.last_repair_ms.is_none_or(|t| self.now_ms.saturating_sub(t) >= after) {
                let step = collector.step;
                let peers = collector.roster().to_vec();
                let missing: Vec<PeerId> =
                    collector.missing().into_iter().filter(|p| self.members.contains(p)).collect();
                self.last_repair_ms = Some(self.now_ms);
                self.repaired_in_step |= !missing.is_empty();
                for to in missing {
                    self.send(to, Message::Roster { step, peers: peers.clone() });
                }
            }
            return;
        }
        if waited >= self.repair_after_ms() && !collector.is_complete() {
            self.request_repairs();
        }
    }

    /// How long a follower lets its leader be silent, once its own contribution is out, before
    /// it deposes it: 1.5 × the step deadline.
    pub fn depose_after_ms(&self) -> u64 {
        let deadline = self.deadline_ms();
        deadline.saturating_add(deadline / 2)
    }

    /// No tick came for `gap` ms: this node was suspended or starved. The gap was ours, not our
    /// peers': every wait restarts where it stood. A leader gone longer than its followers
    /// wait before deposing it stands by for a deadline, in case they did.
    fn slept(&mut self, gap: u64) {
        self.event(Event::Slept { ms: gap });
        self.collector_since_ms = self.collector_since_ms.saturating_add(gap);
        self.own_ready_ms = self.own_ready_ms.map(|t| t.saturating_add(gap));
        self.leader_heard_ms = self.leader_heard_ms.saturating_add(gap);
        self.last_repair_ms = self.last_repair_ms.map(|t| t.saturating_add(gap));
        self.shown_life_ms = self.shown_life_ms.saturating_add(gap);
        if self.is_leader() && self.active() && gap >= self.depose_after_ms() {
            // Not `stand_by`: the step in flight is kept, to go on with if nobody took over.
            self.standby = Some(Standby::Woke { until_ms: self.now_ms.saturating_add(self.deadline_ms()) });
            self.broadcast(&Message::Epoch(self.epoch));
        }
    }

    /// Standing by, as time passes: a woken leader that heard of no successor leads on; the
    /// others show life every deadline (a leader that dropped them meanwhile readmits them).
    fn standby_tick(&mut self, standby: Standby) {
        match standby {
            Standby::Woke { until_ms } if self.now_ms >= until_ms => {
                let me = self.config.me;
                let Some((step, roster)) = self.collector.as_ref().map(|c| {
                    let here = c.roster().iter().copied().filter(|p| *p == me || self.members.contains(p));
                    (c.step, here.collect::<Vec<_>>())
                }) else {
                    self.standby = None;
                    return;
                };
                if !has_quorum(&self.quorum_base(), &roster) {
                    // Our links died while we slept: too few are left to lead.
                    self.lose_quorum(roster);
                    return;
                }
                self.standby = None;
                self.event(Event::LeadsOn { step });
                // Followers that missed the step's roster hear it again (and say their
                // contributions again); then it completes as usual.
                self.announce(step, roster);
                self.leader_try_complete();
            }
            Standby::Woke { .. } => {}
            Standby::QuorumLost | Standby::Deposed { .. } => {
                if self.now_ms.saturating_sub(self.shown_life_ms) >= self.deadline_ms() {
                    if standby == Standby::QuorumLost && self.leader.is_none() {
                        // A deadline of standing by, and nobody sent us the run: maybe the
                        // members here are a quorum again and nobody leads them.
                        if self.regain() {
                            return;
                        }
                    }
                    self.show_life();
                }
            }
        }
    }

    /// Standing by without a quorum, and nobody leads us: if the members that say they stand
    /// by are, with us, a quorum of our base again, the one of them holding the most steps
    /// (then the smallest id) leads, resuming the others from its state (theirs may be a
    /// commit behind). Whether we took the lead.
    fn regain(&mut self) -> bool {
        let me = self.config.me;
        // Only once every member of the base we reach said it stands by: then nobody here
        // leads, and each of us, knowing the same, picks the same one.
        let base = self.quorum_base();
        if base.iter().any(|p| *p != me && self.members.contains(p) && !self.standing_by.contains_key(p)) {
            return false;
        }
        let mut here: Vec<(PeerId, u32)> = self
            .standing_by
            .iter()
            .filter(|(p, _)| self.members.contains(p) && !self.kicked.contains(p))
            .map(|(p, applied)| (*p, *applied))
            .collect();
        here.push((me, self.applied));
        let ids: Vec<PeerId> = here.iter().map(|(p, _)| *p).collect();
        let first = here.iter().max_by_key(|(p, applied)| (*applied, std::cmp::Reverse(*p))).map(|(p, _)| *p);
        if first != Some(me) || !has_quorum(&self.quorum_base(), &ids) {
            return false;
        }
        self.standby = None;
        self.leader = Some(me);
        self.event(Event::Leader(me));
        self.event(Event::LeadsOn { step: self.applied + 1 });
        self.say_follow();
        // Those we resume follow us once they have our config: wait for them (a deadline).
        self.claim = Some((self.now_ms, self.applied + 1, Vec::new()));
        self.synced.clear();
        self.joiners = self.members.iter().copied().filter(|p| !self.kicked.contains(p)).collect();
        self.next_step();
        true
    }

    /// A woken leader still standing by after its sleep: it collects, but commits nothing.
    fn woke(&self) -> bool {
        matches!(self.standby, Some(Standby::Woke { .. }))
    }

    /// How long the network part of a step may take before repairs start: the configured
    /// interval, or 3 × the longest of the last steps' network waits (from our gradient being
    /// ready to the step's end) when that is longer — on a slow link a contribution takes
    /// seconds to arrive, and asking for it again then only sends it twice.
    pub fn repair_after_ms(&self) -> u64 {
        let longest = self.net_waits.iter().max().copied().unwrap_or(0);
        self.config.repair_after_ms.max(longest.saturating_mul(3))
    }

    /// Leader, after the last step: repeat the final commit for a while (every repair
    /// interval, 20 times) in case one was lost.
    fn repeat_final_commit(&mut self) {
        if self.final_repeats >= 20
            || self.last_repair_ms.is_some_and(|t| self.now_ms.saturating_sub(t) < self.config.repair_after_ms)
        {
            return;
        }
        self.final_repeats += 1;
        self.last_repair_ms = Some(self.now_ms);
        let step = self.applied + 1;
        let targets: Vec<PeerId> = self.synced.iter().copied().filter(|p| self.members.contains(p)).collect();
        for to in targets {
            self.send(to, Message::Roster { step, peers: Vec::new() });
        }
    }

    /// Follower: ask the leader for missing roster gradients (not our own), at most once per
    /// repair interval.
    fn request_repairs(&mut self) {
        let Some(leader) = self.leader.filter(|l| *l != self.config.me) else { return };
        if self.last_repair_ms.is_some_and(|t| self.now_ms.saturating_sub(t) < self.repair_after_ms()) {
            return;
        }
        let Some(collector) = &self.collector else { return };
        let step = collector.step;
        let missing: Vec<PeerId> = collector.missing().into_iter().filter(|p| *p != self.config.me).collect();
        if missing.is_empty() {
            return;
        }
        self.last_repair_ms = Some(self.now_ms);
        self.repaired_in_step = true;
        for peer in missing {
            self.send(leader, Message::RepairRequest { step, peer });
            self.event(Event::RepairRequested { step, peer });
        }
    }

    fn on_repair_request(&mut self, from: PeerId, step: u32, peer: PeerId) {
        if !self.is_leader() {
            self.ignore(from, "a repair request, but only the leader answers them");
            return;
        }
        let (found, roster) = match &self.collector {
            Some(c) if c.step == step => (c.get(peer).cloned(), Some(c.roster().to_vec())),
            _ => (self.repairs.get(step, peer).cloned(), self.repairs.roster(step).map(<[PeerId]>::to_vec)),
        };
        if let Some(roster) = roster.filter(|r| !r.contains(&peer)) {
            // The requester missed a revision that dropped `peer`: tell it the roster again.
            self.send(from, Message::Roster { step, peers: roster });
            return;
        }
        match found {
            Some(gradient) => {
                self.send(from, Message::RepairResponse { peer, gradient });
                self.event(Event::RepairServed { step, peer, to: from });
            }
            None => self.ignore(from, "a repair request for a gradient the leader does not hold (yet)"),
        }
    }

    // ---- messages ----

    fn on_message(&mut self, from: PeerId, message: Message) {
        let step_message = matches!(
            message,
            Message::Roster { .. }
                | Message::Gradient(_)
                | Message::RepairRequest { .. }
                | Message::RepairResponse { .. }
        );
        if matches!(
            message,
            Message::Roster { .. } | Message::Gradient(_) | Message::RunConfig { .. } | Message::Resume(_)
        ) {
            self.standing_by.remove(&from);
        }
        if self.is_leader() && self.dropped.remove(&from) {
            // A dropped member is alive after all: back at the next step boundary.
            self.joiners.insert(from);
            self.event(Event::Readmitted(from));
        }
        if !step_message {
            self.dispatch(from, message);
        } else if let Some(message) = self.admit(from, message) {
            self.dispatch(from, message);
        }
    }

    /// Acts on a message (a step message only once admitted to our epoch).
    fn dispatch(&mut self, from: PeerId, message: Message) {
        match message {
            Message::Epoch(epoch) => {
                self.peer_epochs.insert(from, epoch);
            }
            Message::RunConfig { protocol, run } => self.on_run_config(from, protocol, run),
            Message::Resume(bytes) => {
                if self.leader != Some(from) {
                    self.ignore(from, "a resume from a peer that is not the leader");
                } else if self.pending.is_none() {
                    self.pending = Some(Pending::Resume(self.epoch_of(from)));
                    self.out.push(Output::Restore { bytes });
                }
            }
            Message::CheckpointPush(bytes) => {
                let epoch = self.epoch_of(from);
                if self.leader != Some(from) {
                    // Pushes have authority: only the run's leader may rewind the group.
                    self.event(Event::PushRefused { from });
                    self.ignore(from, "a checkpoint push from a member that is not the run's leader");
                } else if self.run.is_none() || self.pending.is_some() {
                    self.ignore(from, "a checkpoint push outside a run, or during a restore");
                } else if epoch <= self.epoch {
                    let why = format!("a checkpoint push ({epoch}) that {} supersedes", self.epoch);
                    self.ignore(from, &why);
                } else {
                    self.pending = Some(Pending::Push { from, bytes: None, epoch });
                    self.out.push(Output::Restore { bytes });
                }
            }
            Message::Removed { step, may_return, why } => {
                if self.woke() && self.in_run() {
                    // We led, slept, and `from` took our place: follow it until it resumes us.
                    // (A leader that did not sleep takes no one's word for having been silent.)
                    self.event(Event::Deposed { by: from, step: self.applied, why: why.clone() });
                    self.stand_by(Standby::Deposed { by: from });
                    self.follow(from);
                }
                if self.leader != Some(from) || self.is_leader() {
                    self.ignore(from, "a removal from a peer that is not the leader");
                } else {
                    self.removed = true;
                    self.collector = None;
                    self.commit = None;
                    if may_return {
                        // We are alive: say so, and the leader resumes us at its next step.
                        self.send(from, Message::Epoch(self.epoch));
                    } else {
                        // Out of this run until someone brings us back (a resume clears it).
                        self.stopped = Some(Stop::Removed { step, why: why.clone() });
                    }
                    self.event(Event::Removed { step, why });
                }
            }
            Message::Leaving => {
                self.follows.remove(&from);
                self.leaving.insert(from);
                self.event(Event::PeerLeaving(from));
            }
            Message::StandingBy { applied } => self.on_standing_by(from, applied),
            Message::Follow { leader } => self.on_follow(from, leader),
            Message::Fragment { .. } => self.ignore(from, "a fragment (the adapter reassembles them)"),
            Message::PeerInfo { .. } | Message::Ping { .. } | Message::Pong { .. } => {
                self.ignore(from, "a link message (the adapter handles them)")
            }
            Message::Roster { step, peers } => {
                let current = self.collector.as_ref().map_or(self.applied + 1, |c| c.step);
                if self.leader != Some(from) && step >= current && self.succeeds_our_leader(from) {
                    self.follow_successor(from, step);
                }
                if self.leader != Some(from) || self.is_leader() {
                    self.ignore(from, "a roster from a peer that is not the leader");
                } else if self.active() {
                    self.on_roster(step, peers);
                }
            }
            Message::Gradient(gradient) => {
                if self.active() || self.woke() {
                    self.offer(from, gradient);
                    self.after_offer();
                }
            }
            Message::RepairRequest { step, peer } => {
                // Served after the run finished too: a follower may still be completing the
                // last step.
                if self.run.is_some() && self.stopped.is_none() && self.pending.is_none() {
                    self.on_repair_request(from, step, peer);
                }
            }
            Message::RepairResponse { peer, gradient } => {
                if self.leader != Some(from) {
                    self.ignore(from, "a repair response from a peer that is not the leader");
                } else if self.active() {
                    let step = gradient.step;
                    let wanted = self.collector.as_ref().is_some_and(|c| c.step == step && c.get(peer).is_none());
                    self.offer(peer, gradient);
                    if wanted {
                        self.event(Event::Repaired { step, peer });
                    }
                    self.after_offer();
                }
            }
        }
    }

    /// Whether `peer` is who would lead if our leader were deposed: the smallest id of the
    /// latest roster still here, less the leader and anyone deposed (and, following, this
    /// node). A roster from it means it deposed our leader.
    fn succeeds_our_leader(&self, peer: PeerId) -> bool {
        let Some(leader) = self.leader else { return false };
        if !self.active() || leader == peer || leader == self.config.me {
            return false;
        }
        // A leader we heard from lately is not replaced on another's word (a stale claim from
        // a minority that rejoined); one silent for half a deadline may have been.
        if self.now_ms.saturating_sub(self.leader_heard_ms) < self.deadline_ms() / 2 {
            return false;
        }
        self.successor_candidates(Some(leader)).first() == Some(&peer)
    }

    /// Who may succeed a leader, smallest first: the members of the latest roster still here
    /// and not deposed (less `without`), and this node.
    fn successor_candidates(&self, without: Option<PeerId>) -> Vec<PeerId> {
        let mut candidates: Vec<PeerId> = self
            .last_roster
            .iter()
            .copied()
            .filter(|p| Some(*p) != without && self.members.contains(p) && !self.deposed.contains(p))
            .collect();
        candidates.push(self.config.me);
        candidates.sort_unstable();
        candidates.dedup();
        candidates
    }

    /// Our successor leads (its roster or its `-17` said so) while our leader is silent: it
    /// deposed our leader before we did — the same verdict, sooner.
    fn follow_successor(&mut self, successor: PeerId, step: u32) {
        let old = self.leader.expect("a successor succeeds someone");
        let silent_ms = self.now_ms.saturating_sub(self.leader_heard_ms);
        self.deposed.insert(old);
        self.event(Event::LeaderDeposed { leader: old, step, silent_ms });
        self.follow(successor);
    }

    /// `leader` leads the run from now on (as this node sees it).
    fn follow(&mut self, leader: PeerId) {
        self.leader = Some(leader);
        self.leader_heard_ms = self.now_ms;
        self.event(Event::Leader(leader));
        self.say_follow();
    }

    fn on_run_config(&mut self, from: PeerId, protocol: u32, settings: RunConfig) {
        if protocol != MESH_PROTOCOL_VERSION {
            self.ignore(
                from,
                &format!("a run config for mesh protocol {protocol} (this node speaks {MESH_PROTOCOL_VERSION})"),
            );
            return;
        }
        if self.run.is_some() && !self.finished && self.stopped.is_none() {
            let same = self.run.as_ref() == Some(&settings);
            if same && self.woke() {
                // We led, slept, and `from` leads the run now: follow it until it resumes us.
                let why = "another member leads the run".to_string();
                self.event(Event::Deposed { by: from, step: self.applied, why });
                self.stand_by(Standby::Deposed { by: from });
                self.follow(from);
            } else if self.leader.is_none() && same {
                // Our leader left before resuming us (or we stand by without a quorum): this
                // is the run's leader now; it resumes us at its next step boundary.
                self.follow(from);
            } else if self.run.as_ref() != Some(&settings) || self.leader != Some(from) {
                self.ignore(from, "a second run config while a run is going");
            }
            return;
        }
        self.reset_run();
        self.leader = Some(from);
        // The run continues the leader's line of pushes (a node that joined after the last
        // one has not seen it).
        self.enter_epoch(self.epoch_of(from));
        self.run = Some(settings);
        self.pending = Some(Pending::Configure);
        self.event(Event::RunStarted { leader: from, settings });
        self.say_follow();
        self.out.push(Output::Configure(settings));
    }
}

/// Whether `roster` holds a quorum of `base`: more than half of it. (Not "half with the
/// smallest id": a base of two would then shrink to one, and a leader cut off with a stale
/// belief about one backer could go on alone.) An empty base (a run's first step) needs
/// nothing.
pub fn has_quorum(base: &[PeerId], roster: &[PeerId]) -> bool {
    if base.is_empty() {
        return true;
    }
    let have = base.iter().filter(|p| roster.contains(p)).count();
    2 * have > base.len()
}

/// The run config message for `run`, in this node's protocol.
fn run_config_message(run: &RunConfig) -> Message {
    Message::RunConfig { protocol: MESH_PROTOCOL_VERSION, run: *run }
}
