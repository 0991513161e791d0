//! What the session tells the world: events for the console and the JSON-lines stream, and the
//! typed reasons inside them (`docs/ARCHITECTURE.md`: errors stay types until the edge).

use std::sync::Arc;

use super::step::GuardFailure;
use crate::config::RunConfig;
use crate::sync::OutOfBounds;
use crate::wire::{PeerId, Removal};

/// What happened, for the console and the JSON-lines stream.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    PeerJoined(PeerId),
    PeerLeft(PeerId),
    /// `peer` said it cannot compute (its backend is not admitted): it watches the run and
    /// never enters its configuration.
    Observer(PeerId),
    /// The run's leader as this node sees it, elected in Raft term `term`.
    Leader {
        peer: PeerId,
        term: u64,
    },
    /// No leader this node can hear, and it reaches too few of the run's voters to elect one:
    /// nothing commits on its side until it does (`reach`: the voters it heard from within an election
    /// timeout, itself included). Said once a time it happens; a [`Event::Leader`] ends it.
    NoMajority {
        reach: Vec<PeerId>,
        voters: Vec<PeerId>,
        term: u64,
    },
    RunStarted {
        leader: PeerId,
        settings: RunConfig,
    },
    /// The run's configuration changed (a committed entry at log `index`): who votes, who
    /// only follows the log.
    Members {
        voters: Vec<PeerId>,
        learners: Vec<PeerId>,
        index: u64,
    },
    StepApplied {
        step: u32,
        loss: f32,
        /// The step's roster: whose contributions its record sums.
        peers: Vec<PeerId>,
        whash: u32,
        /// Elastic windows: each roster member's weight in the mean (the inner steps its
        /// contribution stands for), in roster order; empty otherwise.
        weights: Vec<(PeerId, u32)>,
        /// The Raft term and log index of the step's commit record.
        term: u64,
        index: u64,
    },
    /// A step this node had taken tentatively (computing the next behind its commit) was
    /// undone: another record committed in its place.
    Undone {
        step: u32,
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
    /// This node's weights are `applied` steps in, behind the `committed` the log holds, and
    /// the contributions to catch up are gone: it asked the leader for a resume.
    CatchingUp {
        applied: u32,
        committed: u32,
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
    /// (Leader) `step` goes on without `peer`, or `peer` left the run's configuration.
    Dropped {
        peer: PeerId,
        step: u32,
        why: DropReason,
    },
    /// (Leader) a member dropped for missing deadlines kept up for `steps` steps: it is waited
    /// for again (and votes again).
    Readmitted {
        peer: PeerId,
        steps: u32,
    },
    /// A checkpoint push from `from` was refused: only the run's leader may push.
    PushRefused {
        from: PeerId,
    },
    /// `peer`'s contribution to `step` was not finite or past the bound: refused on arrival
    /// (never summed).
    ContributionRefused {
        peer: PeerId,
        step: u32,
        why: OutOfBounds,
    },
    /// The leader took this node out of the run at `step`, not to return.
    Removed {
        step: u32,
        why: Removal,
    },
    /// No tick for `ms`: this node was suspended or starved (its timers skip the gap).
    Slept {
        ms: u64,
    },
    /// `peer` said it is quitting: the leader takes it out of the run's configuration.
    PeerLeaving(PeerId),
    /// Elastic windows: this node's window of `step` ended after `steps` of its `of` inner steps
    /// (another member finished the window first) — it trains slower than the group's fastest.
    Behind {
        step: u32,
        steps: u32,
        of: u32,
    },
}

/// Why the leader went on without a member (wire `-13` tells a member removed for good).
#[derive(Clone, Debug, PartialEq)]
pub enum DropReason {
    /// Nothing arrived from it within the step deadline. It follows the log as a learner (it
    /// no longer votes, where three voters remain without it) and is waited for again once
    /// it has kept up for `backoff` steps.
    Deadline { deadline_ms: u64, backoff: u32 },
    /// Its contribution was refused on arrival; as for a deadline.
    Refused { why: OutOfBounds, backoff: u32 },
    /// Its link closed; as for a deadline.
    Disconnected { backoff: u32 },
    /// It said it is leaving: out of the configuration.
    Left,
    /// A person vouched it is gone for good (`forget`): out of the configuration; it may come
    /// back as a new learner.
    Forgotten,
    /// Its link has been closed for a while: out of the configuration (a member that comes
    /// back joins again as a learner).
    Gone { ms: u64 },
    /// Out for good.
    Removed(Removal),
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DropReason::Deadline { deadline_ms, backoff } => write!(
                f,
                "no contribution within the step deadline ({deadline_ms} ms); waited for again after keeping up for {backoff} steps"
            ),
            DropReason::Refused { why, backoff } => {
                write!(f, "its contribution was refused: {why}; waited for again after keeping up for {backoff} steps")
            }
            DropReason::Disconnected { backoff } => {
                write!(f, "its link closed; waited for again after keeping up for {backoff} steps")
            }
            DropReason::Left => f.write_str("it left"),
            DropReason::Forgotten => f.write_str("forgotten: a person vouched it is gone"),
            DropReason::Gone { ms } => write!(f, "its link has been closed for {ms} ms"),
            DropReason::Removed(why) => write!(f, "{why}"),
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
    Forget,
}

/// Why this node's run stopped: it contributes nothing until a new run.
#[derive(Clone, Debug, PartialEq)]
pub enum Stop {
    /// The guard found replicas disagreeing.
    Guard(GuardFailure),
    /// The leader took this node out of the run, not to return.
    Removed { step: u32, why: Removal },
    /// This node's replica could not compute its contribution.
    Compute { step: u32, error: Failure },
    /// The agreement core could not go on (`agreement.rs`).
    Agreement(super::agreement::AgreementError),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Guard(failure) => write!(f, "{failure}"),
            Stop::Removed { step, why } => write!(f, "removed from the run at step {step}: {why}"),
            Stop::Compute { step, error } => {
                write!(f, "computing step {step} failed, this node stops contributing: {error}")
            }
            Stop::Agreement(e) => write!(f, "{e}"),
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
            Problem::NotLeader { action: LeaderAction::Forget, leader: l } => {
                write!(f, "only the run's leader ({}) can take a member out of the run's configuration", leader(l))
            }
            Problem::KickSelf => f.write_str("the leader cannot remove itself; quit instead"),
            Problem::RunGoing => f.write_str("a run is already going"),
            Problem::Unasked(task) => write!(f, "the adapter answered {task}, which nobody asked for"),
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
            Problem::Stopped(_) => "stopped",
        }
    }
}
