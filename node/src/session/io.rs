//! What the adapter feeds the session ([`Input`]) and what the session asks of it, in order
//! ([`Output`]): the boundary the module docs describe.

use std::sync::Arc;

use super::*;

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
    /// Answer to `Output::Audit`: the audited member's contribution to `step` as the definition
    /// gives it (its loss and values), or why it could not be recomputed.
    Audited { step: u32, target: PeerId, outcome: Result<Recomputed, Failure> },
    /// Answer to `Output::Settle`: where the definition's trace of the step first parts from
    /// the target's (this side's words of the first differing chunk), that they agree, or why
    /// it could not be run.
    Settled { step: u32, target: PeerId, outcome: Result<Traced, Failure> },
    /// Answer to `Output::CheckWeights`: the weights our contribution to `step` was computed
    /// from, checked against the definition's update that left them, or why they could not be.
    WeightsChecked { step: u32, outcome: Result<WeightsChecked, Failure> },
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
    /// its own for the next, `sync::Strategy::finish`). `tentative`: the step's record is not
    /// committed yet — keep what undoes it until `Confirm` or `Rollback` says which; report
    /// nothing of it before `Confirm`.
    Apply {
        step: u32,
        mean: Vec<f32>,
        grid: Vec<u8>,
        loss: f32,
        ours: bool,
        tentative: bool,
    },
    /// The tentative `step` stands: it is applied in every sense (its weights are the group's).
    Confirm {
        step: u32,
    },
    /// The tentative `step` is undone: the state is again the one before it, and whatever was
    /// computed on top of it (a `Compute` under way) belongs to weights that are gone.
    Rollback {
        step: u32,
    },
    /// Send `to` a resume message (-6) with a checkpoint of the current state (a step boundary).
    SendSnapshot {
        to: PeerId,
    },
    /// Replace the state with a checkpoint; answer `Restored`.
    Restore {
        bytes: Vec<u8>,
    },
    /// Recompute `target`'s contribution to `step` from the weights the step was computed from
    /// (those before it) and `target`'s own batch, off the step's path; answer `Audited` (later,
    /// interleaved with other inputs).
    Audit {
        step: u32,
        target: PeerId,
        /// Packed runs: the residual the contribution named (served by the target, its digest
        /// checked) and the grid the group summed the step on.
        private: Option<PrivateInputs>,
        /// Record the definition's trace of the step too (`Recomputed::trace`): the leader's,
        /// whose departures it narrows to one op.
        trace: bool,
        /// A routine audit (spare cycles only), or the leader's check of an accusation.
        urgency: Urgency,
    },
    /// Disputes: send `to` (the leader) our trace of `step` — our own backend's step run again
    /// from the weights it started from, compared op by op with `definition` (the leader's):
    /// every op's chunk digests up to the first that parts, and our words of its first parting
    /// chunk (`-25`; empty when it cannot be made). Nothing to answer.
    ServeTrace {
        to: PeerId,
        step: u32,
        definition: Arc<Trace>,
    },
    /// Disputes (leader): `target`'s step `step` run again on the referee (the definition),
    /// compared op by op with `theirs`, its trace; answer `Settled`.
    Settle {
        step: u32,
        target: PeerId,
        theirs: Arc<Trace>,
    },
    /// The guard's disputes (leader): check the weights our contribution to `step` was
    /// computed from against the definition's update that left them (run again on the host
    /// from the state before it and the committed mean); answer `WeightsChecked`.
    CheckWeights {
        step: u32,
    },
    /// The guard's disputes (a disputed member): send `to` (the leader) the first chunk of the
    /// weights our contribution to `step` was computed from whose digest is not in `digests`,
    /// with its words (`-28`; none when they are no longer kept or none parts). Nothing to
    /// answer.
    ServeWeights {
        to: PeerId,
        step: u32,
        digests: Arc<Vec<u64>>,
    },
    /// Send `to` `part` of the private state (the residual) our contribution to `step` was
    /// made with, if still kept (`-23`; nothing kept: no values). Nothing to answer.
    /// `routine`: the asker is not the leader, so no check of an accusation waits for it — it
    /// may wait for the link's time the group's own traffic leaves (an answer to the leader
    /// never does: a check's "withheld" is a conviction).
    ServeState {
        to: PeerId,
        step: u32,
        part: crate::wire::StatePart,
        routine: bool,
    },
    /// Elastic windows: another member finished its whole window of `step` first, so ours ends
    /// after the inner step under way (`Compute { step }` is still answered, with the steps
    /// done). Nothing to answer.
    Hurry {
        step: u32,
    },
    Event(Event),
}
