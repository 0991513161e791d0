//! What the session tells the world: events for the console and the JSON-lines stream, and the
//! typed reasons inside them (`docs/ARCHITECTURE.md`: errors stay types until the edge).

use std::sync::Arc;

use super::agreement::AgreementError;
use super::step::{ChunkOffer, GuardFailure};
use crate::config::RunConfig;
use crate::sync::{Compression, OutOfBounds};
use crate::wire::{AuditVerdict, Epoch, Evidence, PeerId, Removal};

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
        why: Ignored,
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
    /// This node recomputed `target`'s contribution to `step` (an audit the committed record
    /// assigned it): it is the definition's, bit for bit.
    Audited {
        step: u32,
        target: PeerId,
    },
    /// `by` (this node, or, at the leader, the member whose accusation arrived) recomputed
    /// `target`'s contribution to `step` and it departs, as `evidence` shows: the leader checks
    /// it.
    Accused {
        step: u32,
        target: PeerId,
        by: PeerId,
        evidence: Evidence,
    },
    /// An audit's verdict committed: its target is out of the run for good, on every member.
    Verdict(AuditVerdict),
    /// This node found the leader's contribution to `step` wrong (its own audit, or its check
    /// of another's accusation): it follows that leader no more, and the next leader proposes
    /// the verdict.
    LeaderShunned {
        leader: PeerId,
        step: u32,
    },
    /// The leader this node shunned for its contribution to `step` was replaced by nobody
    /// within `waited_ms` (no majority confirmed the finding): this node follows it again.
    ShunLapsed {
        leader: PeerId,
        step: u32,
        waited_ms: u64,
    },
    /// (Leader) `target`'s contribution to `step` departs (`evidence`): before the verdict is
    /// proposed, the dispute is narrowed to the op of its step where it first departs; the
    /// target is not summed meanwhile.
    Disputing {
        step: u32,
        target: PeerId,
        evidence: Evidence,
    },
    /// An audit assigned to this node could not be done (the weights it needed are gone, the
    /// worker failed): nobody is accused.
    AuditFailed {
        step: u32,
        target: PeerId,
        error: Failure,
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
    /// Chunk owners: the contributors' fingerprints of chunk `chunk` of `step` do not add up
    /// to its owner's sum as this node applied it: the owner is accused (the leader settles
    /// it by recomputing the sum).
    SumCheckFailed {
        step: u32,
        chunk: u16,
        owner: PeerId,
    },
    /// (Leader) a disputed chunk sum recomputed from its authors' chunks: the sum and every
    /// fingerprint the leader holds of it are right — nobody is convicted (a contributor may
    /// have sent another member other fingerprints than the leader's).
    SumSettled {
        step: u32,
        chunk: u16,
        owner: PeerId,
    },
    /// (Leader) `author`'s fingerprints of `step`, still missing after they were asked for
    /// again, computed here from its chunks (checked against its header) and checked with.
    PrintsRecomputed {
        step: u32,
        author: PeerId,
    },
    /// (Leader) a disputed chunk sum whose authors' chunks did not come within the wait:
    /// nobody is convicted.
    SumUnsettled {
        step: u32,
        chunk: u16,
        owner: PeerId,
    },
    /// Elastic windows: this node's window of `step` ended after `steps` of its `of` inner steps
    /// (another member finished the window first) — it trains slower than the group's fastest.
    Behind {
        step: u32,
        steps: u32,
        of: u32,
    },
}

/// Why a message was ignored: harmless (a duplicate, a late or early one, one for someone
/// else), counted and logged, never acted on.
#[derive(Clone, Debug, PartialEq)]
pub enum Ignored {
    /// From a peer whose channel is not open here.
    NotConnected,
    /// A run config for another mesh protocol.
    OtherProtocol {
        protocol: u32,
    },
    /// A run config sent to a member (members take the run from its log).
    RunConfigToMember,
    /// A resume this node did not ask for.
    UnaskedResume,
    ResumeFromNonLeader,
    /// A resume request to a node that is not the leader (or from a non-member).
    CatchUpToNonLeader,
    PushFromNonLeader,
    RemovalFromNonLeader,
    /// A fragment or a link message: the adapter's to handle.
    Fragment,
    LinkMessage,
    ContributionFromObserver,
    /// A repair for a member that contributes nothing (it catches up by resume).
    RepairForQuietMember,
    /// A repair request for a contribution this node does not hold.
    RepairNotHeld,
    /// A message of another run's log.
    OtherRun,
    /// What the run's log refused (raft-rs's reason).
    Agreement(AgreementError),
    /// A step message from before `mine`, the push this node's state descends from (its sender
    /// has not restored it yet).
    BeforeOurEpoch {
        mine: Epoch,
    },
    /// A step message from `theirs`, a push this node has not restored, past those it holds.
    TooManyAhead {
        theirs: Epoch,
    },
    /// A step message from `epoch`, held for it and since replaced.
    Replaced {
        epoch: Epoch,
    },
    /// A contribution to a step this node does not collect (applied, or too far ahead).
    NotCollected {
        step: u32,
    },
    /// A contribution of a weight the run does not allow.
    WrongWeight {
        weight: u32,
        allowed: std::ops::RangeInclusive<u32>,
    },
    /// A contribution sent in another encoding than the run's compression.
    WrongEncoding {
        expected: Compression,
        actual: Compression,
    },
    /// A contribution of another length than the model's.
    WrongLength {
        expected: usize,
        actual: usize,
    },
    /// An accusation sent to a member that is not the leader (only the leader checks them).
    AccusationToNonLeader,
    /// An accusation of a contribution no record this node holds names.
    AccusationOfNoContribution {
        step: u32,
        target: PeerId,
    },
    /// A state request, but the run's contributions name no private state (`every-step` f32).
    StateOfStatelessRun,
    /// A state this node did not ask for. (An answer to a request it no longer waits for — a
    /// skipped assignment's, one a derived state served instead — is dropped without a word.)
    UnaskedState,
    /// A trace request from a member that is not the leader (only the leader disputes).
    TraceRequestFromNonLeader,
    /// A trace this node did not ask for (or no longer waits for).
    UnaskedTrace,
    /// A weights request from a member that is not the leader (only the leader disputes).
    WeightsRequestFromNonLeader,
    /// Weights this node did not ask for (or no longer waits for).
    UnaskedWeights,
    /// Chunk owners: a header, chunk or chunk sum in a run whose contributions go whole.
    NotOwners,
    /// Chunk owners: a chunk this node does not take (not its owner's, or as [`ChunkOffer`]
    /// says).
    ChunkRefused {
        step: u32,
        author: PeerId,
        why: ChunkOffer,
    },
    /// Chunk owners: an owner's sum sent by a peer that is not that chunk's owner in the
    /// step's owners as this node knows them (or it does not know them).
    NotTheOwner {
        step: u32,
        owner: u16,
    },
    /// Chunk owners: an owner's sum this node refused (`sync::owners::ChunkSumError`).
    ChunkSumRefused {
        step: u32,
        owner: u16,
        why: crate::sync::owners::ChunkSumError,
    },
    /// Chunk owners: a request for a chunk sum this node does not hold.
    SumNotHeld,
    /// Chunk owners: another member's header from a peer that is not its author, unasked.
    HeaderNotAsked {
        step: u32,
        author: PeerId,
    },
    /// Chunk owners: fingerprints this node does not check — of a step it did not apply from
    /// owners' sums (or no longer keeps), of another record, not from one of the record's
    /// contributors, of another count of chunks or under another seed, or a second time.
    FingerprintsRefused {
        step: u32,
    },
}

impl std::fmt::Display for Ignored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ignored::NotConnected => f.write_str("a message from a peer that is not connected"),
            Ignored::OtherProtocol { protocol } => write!(
                f,
                "a run config for mesh protocol {protocol} (this node speaks {})",
                crate::wire::MESH_PROTOCOL_VERSION
            ),
            Ignored::RunConfigToMember => f.write_str("a run config (members take the run from its log)"),
            Ignored::UnaskedResume => f.write_str("a resume this node did not ask for"),
            Ignored::ResumeFromNonLeader => f.write_str("a resume from a peer that is not the leader"),
            Ignored::CatchUpToNonLeader => f.write_str("a resume request, but only the leader serves them to members"),
            Ignored::PushFromNonLeader => f.write_str("a checkpoint push from a member that is not the run's leader"),
            Ignored::RemovalFromNonLeader => f.write_str("a removal from a peer that is not the leader"),
            Ignored::Fragment => f.write_str("a fragment (the adapter reassembles them)"),
            Ignored::LinkMessage => f.write_str("a link message (the adapter handles them)"),
            Ignored::ContributionFromObserver => f.write_str("a contribution from an observer (it cannot compute)"),
            Ignored::RepairForQuietMember => {
                f.write_str("a repair for a member that contributes nothing (it catches up by resume)")
            }
            Ignored::RepairNotHeld => f.write_str("a repair request for a contribution this node does not hold"),
            Ignored::OtherRun => f.write_str("a message of another run's log"),
            Ignored::Agreement(e) => write!(f, "{e}"),
            Ignored::BeforeOurEpoch { mine } => {
                write!(f, "a step message from before {mine} (the sender has not restored it yet)")
            }
            Ignored::TooManyAhead { theirs } => {
                write!(f, "too many step messages from {theirs}, which this node has not restored")
            }
            Ignored::Replaced { epoch } => write!(f, "a step message from {epoch}, since replaced"),
            Ignored::NotCollected { step } => {
                write!(f, "a contribution to step {step}, which this node does not collect")
            }
            Ignored::WrongWeight { weight, allowed } => {
                write!(f, "a contribution of weight {weight}, the run allows {}..={}", allowed.start(), allowed.end())
            }
            Ignored::WrongEncoding { expected, actual } => {
                write!(f, "a contribution sent as {actual}, the run's compression is {expected}")
            }
            Ignored::WrongLength { expected, actual } => {
                write!(f, "a contribution of {actual} values, the model has {expected}")
            }
            Ignored::AccusationToNonLeader => f.write_str("an accusation, but only the leader checks them"),
            Ignored::AccusationOfNoContribution { step, target } => write!(
                f,
                "an accusation of node {target}'s contribution to step {step}, which no record held here names"
            ),
            Ignored::StateOfStatelessRun => {
                f.write_str("a state request, but this run's contributions have no private state")
            }
            Ignored::UnaskedState => f.write_str("a state this node did not ask for"),
            Ignored::TraceRequestFromNonLeader => {
                f.write_str("a trace request from a member that is not the leader (only the leader disputes)")
            }
            Ignored::UnaskedTrace => f.write_str("a trace this node did not ask for"),
            Ignored::WeightsRequestFromNonLeader => {
                f.write_str("a weights request from a member that is not the leader (only the leader disputes)")
            }
            Ignored::UnaskedWeights => f.write_str("weights this node did not ask for"),
            Ignored::NotOwners => f.write_str("a chunk owners' message in a run whose contributions go whole"),
            Ignored::ChunkRefused { step, author, why } => {
                let why = match why {
                    ChunkOffer::NoHeader => "no header of it is held",
                    ChunkOffer::NotNamed => "its pieces are not the ones its header names",
                    ChunkOffer::Duplicate => "it is held already",
                    ChunkOffer::NotOwned => "this node does not own its pieces in that step",
                    ChunkOffer::Accepted => "taken",
                };
                write!(f, "a chunk of node {author}'s contribution to step {step}: {why}")
            }
            Ignored::NotTheOwner { step, owner } => {
                write!(f, "a sum of chunk {owner} of step {step} from a peer that is not its owner here")
            }
            Ignored::ChunkSumRefused { step, owner, why } => write!(f, "owner {owner}'s sum for step {step}: {why}"),
            Ignored::SumNotHeld => f.write_str("a request for a chunk sum this node does not hold"),
            Ignored::HeaderNotAsked { step, author } => {
                write!(f, "node {author}'s header for step {step} from another peer, not asked for")
            }
            Ignored::FingerprintsRefused { step } => {
                write!(f, "fingerprints of step {step} that this node does not check")
            }
        }
    }
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
    /// It says it cannot compute (its backend was refused, at the run's shapes say): out of the
    /// configuration; it watches the run as an observer.
    CannotCompute,
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
            DropReason::CannotCompute => f.write_str("it cannot compute the run (its backend was refused): it watches"),
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
