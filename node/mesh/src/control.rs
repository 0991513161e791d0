//! What a user (the console, the headless stdin) asks of a node, and what the node reports.

use std::path::PathBuf;

use lockstep_node::admission::AtRunShapes;
use lockstep_node::config::RunConfig;
use lockstep_node::replica::BackendChange;
use lockstep_node::session::Event;
use lockstep_node::verdict::Verdict;
use lockstep_node::wire::PeerId;

use crate::checkpoint_file::CheckpointTarget;

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

/// What a user (console, stdin) asks of the node.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Start(RunConfig),
    PushCheckpoint(Vec<u8>),
    /// For fault-injection tests: stop sending anything to this peer (the channel stays open).
    CutLinkTo(PeerId),
    /// Fault injection: send to `peer` again after a cut.
    HealLinkTo(PeerId),
    /// (Leader) the user vouches that `peer` is gone for good: it leaves the run's configuration.
    Forget(PeerId),
    /// For fault-injection tests: flip one bit of this replica's weights.
    FlipWeightBit,
    /// For fault-injection tests: from now on this node is asked to compute and never does (a
    /// member that says it computes and does not: a careless or hostile one).
    NeverCompute,
    /// For fault-injection tests: from the next step on, send this value in place of every
    /// value of this node's contributions (with the honest hashes): a rogue member.
    PoisonContributions(f32),
    /// Fault injection: this node sends wrong contributions of `Rogue`'s kind from its next one
    /// on (finite, in bounds, honest hashes: only audits can see them).
    PlayRogue(lockstep_node::replica::Rogue),
    /// Fault injection: this node's chunk sums (chunk owners) are off by one in a value from now
    /// on, applied by itself too (`Session::play_wrong_owner`).
    PlayWrongOwner,
    /// Fault injection: this node's fingerprints of its first chunk are off by one from now on
    /// (`Session::play_false_fingerprints`).
    PlayFalseFingerprints,
    /// Fault injection: this node sends no fingerprints and refuses every request for them
    /// from now on (`Session::play_withheld_fingerprints`).
    PlayWithheldFingerprints,
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
    /// Fault injection: this node's contribution to `step` is the first its rogue made wrong.
    RogueBegan {
        step: u32,
    },
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
    /// Nothing came over the link to `peer` for `silent_ms` (our pings go unanswered): it is
    /// named dead before WebRTC gives up on it (the link stays, in case it answers again).
    LinkSilent {
        peer: PeerId,
        silent_ms: u64,
    },
    /// The link to `peer` closed while the signaling server still lists it: offered again in
    /// `retry_ms` (we have the smaller id), or awaited (it has).
    LinkRetry {
        peer: PeerId,
        retry_ms: u64,
    },
    Swap(SwapProgress),
    /// Our backend at the run's own shapes (`lockstep_node::admission`), before it computed any
    /// of the run: admitted (the ops checked, in seconds) or refused (this node then watches
    /// the run as an observer).
    AtRunShapes {
        backend: String,
        verdict: AtRunShapes,
    },
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
    /// Of `sent_bytes`, the answers this node served to auditors (its residuals and window
    /// states, `-23`; its traces, `-25`).
    pub audit_bytes: u64,
    /// Seconds this node's audits recomputed since the step before (beside its own step, on
    /// the referee), and its audits' counts in the run so far.
    pub audit_seconds: f64,
    pub audits: lockstep_node::session::AuditStats,
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
    /// The run had to stop here (kicked, a failed compute, a resume that could not be
    /// restored): why, and where the last committed state was saved first (or why it was not).
    Stopped { why: String, checkpoint: Result<std::path::PathBuf, String> },
}
