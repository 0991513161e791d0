//! What a member keeps for its audits (`audit.rs` drives them): the committed records and
//! the states contributions named, the audits under way and the assignment waiting for a
//! worker, the states its own audits derived, the requests it no longer waits for, and the
//! counts the step-health pane shows.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use super::dispute::Dispute;
use super::log::StepRecord;
use super::private::{Link, Pending, Private};
use super::shun::Shuns;
use super::*;
use crate::audit::Urgency;
use crate::wire::{Evidence, StatePart};

/// Committed records a member keeps to check accusations against (the digest each named).
const RECORDS_KEPT: usize = 256;
/// Packed runs: the steps whose grid and named states a member keeps (an audit starts within
/// a few steps of its record's commit).
pub(super) const PRIVATE_KEPT: usize = 8;

/// A committed step of a packed run, as audits need it: the grid it was summed on and the
/// state each contribution named.
#[derive(Debug)]
pub(super) struct StepPrivate {
    step: u32,
    grid: Arc<Vec<u8>>,
    states: BTreeMap<PeerId, u64>,
}

/// What the audit worker is recomputing: whose contribution to which step, the digest the
/// committed record named, the contribution itself (while held: the evidence's source), and the
/// members whose accusation this recomputation checks, with their evidence (the leader's).
#[derive(Clone, Debug)]
pub(super) struct Running {
    pub step: u32,
    pub target: PeerId,
    pub whash: u32,
    pub named: u64,
    /// The weight the record gave the contribution (the inner steps it claims).
    pub weight: u32,
    pub claimed: Option<Gradient>,
    pub accusers: Vec<(PeerId, Evidence)>,
    /// Packed runs: the state the contribution named and the step's grid.
    pub private: Option<Private>,
    /// (Leader) the recomputation records the definition's trace (for a check, the target was
    /// asked for its own at once), so a departure is narrowed without running the step again.
    pub trace: bool,
}

impl Running {
    /// A check of accusations runs at the member's own priority, a routine audit on spare cycles.
    pub(super) fn urgency(&self) -> Urgency {
        if self.accusers.is_empty() {
            Urgency::Routine
        } else {
            Urgency::Check
        }
    }
}

/// The counts the step-health pane and the headless JSON show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuditStats {
    /// Contributions this member recomputed, and how many matched.
    pub audited: u32,
    pub matched: u32,
    /// Assignments skipped because the worker was busy (replaced by a newer one while waiting
    /// for it, or too old once it was free), or given up for a check of an accusation.
    pub skipped: u32,
    /// Of the assignments that waited for the worker, those whose state (asked for as they
    /// came) was here when it was free.
    pub prefetched: u32,
    /// Audits started from the state this member's own last audit of the same member left
    /// (the one its next contribution named, by digest): no request, no bytes.
    pub derived: u32,
    /// Accusations this member made.
    pub accused: u32,
    /// Packed runs: links checked (a member's next contribution named the residual its audited
    /// one left).
    pub linked: u32,
    /// Chunk owners: owners' sums this member checked by the contributors' fingerprints and
    /// found right, found wrong, and dropped unchecked (a contributor's fingerprints never came).
    pub sums_checked: u32,
    pub sums_failed: u32,
    pub sums_unchecked: u32,
}

/// The audits' part of the session.
#[derive(Debug, Default)]
pub(super) struct Audits {
    /// The last committed records (of this epoch), newest last.
    pub(super) records: VecDeque<StepRecord>,
    /// Packed runs: for the last few committed steps, the grid they were summed on and the
    /// state each contribution named.
    pub(super) private: VecDeque<StepPrivate>,
    /// The audits under way (at most `SessionConfig::audit_workers`), each waiting for its
    /// target's state or recomputing.
    pub(super) running: Vec<Running>,
    /// The newest assignment every worker was busy for, its state asked for at once.
    pub(super) pending: Option<Pending>,
    /// (Leader) accusations waiting for the worker: by (step, target), who accused and how.
    pub checks: BTreeMap<(u32, PeerId), Vec<(PeerId, Evidence)>>,
    /// Links waiting for their record: by (the next step, target).
    pub links: BTreeMap<(u32, PeerId), Link>,
    /// Links of a part whose next state's chunk digests were asked for: by (the next step,
    /// target), with when.
    pub(super) links_asked: BTreeMap<(u32, PeerId), (Link, u64)>,
    /// Members a verdict was proposed or committed against (nothing twice).
    pub convicted: BTreeSet<PeerId>,
    /// Leaders this member found wrong (`shun.rs`).
    pub shunned: Shuns,
    /// (Leader) the departure being narrowed to one op (one at a time).
    pub dispute: Option<Dispute>,
    /// (Leader) the guard's disputes: members whose contributions were computed from weights
    /// other than ours (`apart.rs`).
    pub(super) apart: super::apart::Apart,
    /// Chunk owners: recomputations done whose target's values (asked of it) are not here yet,
    /// with when they were done: compared once the values come.
    pub(super) awaiting_values: Vec<(Running, super::Recomputed, u64)>,
    /// The definition's trace of the contribution just found to depart, for the dispute it
    /// opens (set only while [`Session::accuse`] runs for it).
    pub(super) definition: Option<((u32, PeerId), Arc<Trace>)>,
    /// By member, the whole state its contribution to a step should name, as this member's
    /// audit of its previous contribution left it ([`Recomputed::next_words`]): the step, the
    /// state's digest and its words, within [`DERIVED_BYTES`].
    pub(super) derived: BTreeMap<PeerId, (u32, u64, Arc<Vec<f32>>)>,
    /// States asked for and no longer waited for, by (step, target) ([`Audits::unawait`]).
    pub(super) unawaited: VecDeque<(u32, PeerId)>,
    /// Chunk owners: the owners' sums checked by fingerprints (`fingerprints.rs`).
    pub(super) prints: super::fingerprints::Prints,
    pub stats: AuditStats,
}

/// How many requests no longer waited for a member remembers (their answers come within a few
/// steps).
const UNAWAITED_KEPT: usize = 32;

/// What the states an auditor derived ([`Audits::derived`]) may take, all of them: a window's
/// state is 12 bytes a weight, and a state past this is not kept (the next audit asks for it).
const DERIVED_BYTES: usize = 64 << 20;

impl Audits {
    /// A record committed: kept for checking accusations against.
    pub fn committed(&mut self, record: &StepRecord) {
        self.records.push_back(record.clone());
        while self.records.len() > RECORDS_KEPT {
            self.records.pop_front();
        }
    }

    /// `from` was heard from at `now_ms`: an audit waiting for its state keeps the longest
    /// silence since it asked (a long one means the request may have waited in a cut link).
    pub(super) fn heard(&mut self, from: PeerId, now_ms: u64) {
        for running in self.running.iter_mut().filter(|r| r.target == from) {
            if let Some(private) = running.private.as_mut() {
                private.heard(now_ms);
            }
        }
        if let Some(private) = self.pending.as_mut().filter(|p| p.target == from).and_then(|p| p.private.as_mut()) {
            private.heard(now_ms);
        }
    }

    /// A request for the state `target`'s contribution to `step` named, if `private` says one
    /// was sent, is no longer waited for (its assignment skipped, served otherwise, or given
    /// up): its answer, when it comes, is dropped without a word.
    pub(super) fn unawait(&mut self, step: u32, target: PeerId, private: Option<&Private>) {
        if private.is_some_and(|p| p.asked_ms.is_some()) {
            self.answer_expected(step, target);
        }
    }

    /// An answer from `target` for `step` is still to come and nothing waits for it.
    pub(super) fn answer_expected(&mut self, step: u32, target: PeerId) {
        self.unawaited.push_back((step, target));
        while self.unawaited.len() > UNAWAITED_KEPT {
            self.unawaited.pop_front();
        }
    }

    /// Whether an answer from `from` for `step` is one [`Audits::unawait`] no longer waits for
    /// (forgotten as it is taken).
    pub(super) fn was_awaited(&mut self, from: PeerId, step: u32) -> bool {
        let at = self.unawaited.iter().position(|&(s, t)| s == step && t == from);
        at.and_then(|at| self.unawaited.remove(at)).is_some()
    }

    /// The audit under way of `target`'s contribution to `step`.
    pub(super) fn running_mut(&mut self, step: u32, target: PeerId) -> Option<&mut Running> {
        self.running.iter_mut().find(|r| r.step == step && r.target == target)
    }

    /// The audit under way of `target`'s contribution to `step`, ended.
    pub(super) fn take_running(&mut self, step: u32, target: PeerId) -> Option<Running> {
        let at = self.running.iter().position(|r| r.step == step && r.target == target)?;
        Some(self.running.remove(at))
    }

    /// The audit under way that waits for the state `from` serves for `step`, if any.
    pub(super) fn waiting_for(&self, from: PeerId, step: u32) -> Option<&Running> {
        self.running
            .iter()
            .find(|r| r.step == step && r.target == from && r.private.as_ref().is_some_and(|p| p.asked_ms.is_some()))
    }

    /// Whether an audit under way of `target`'s contribution to the step before `step`, whole,
    /// will leave the state its contribution to `step` names ([`Recomputed::next_words`]).
    pub(super) fn derives(&self, step: u32, target: PeerId) -> bool {
        self.running.iter().any(|r| {
            r.target == target && r.step + 1 == step && r.private.as_ref().is_some_and(|p| p.part == StatePart::Whole)
        })
    }

    /// The assignment waiting for the worker whose state `from` serves for `step`, if asked.
    pub(super) fn prefetching(&mut self, from: PeerId, step: u32) -> Option<&mut Pending> {
        self.pending
            .as_mut()
            .filter(|p| p.step == step && p.target == from && p.private.as_ref().is_some_and(|p| p.asked_ms.is_some()))
    }

    /// Packed runs: a committed step's grid and the states its contributions named.
    pub(super) fn keep_private(&mut self, step: u32, grid: Vec<u8>, states: BTreeMap<PeerId, u64>) {
        self.private.push_back(StepPrivate { step, grid: Arc::new(grid), states });
        while self.private.len() > PRIVATE_KEPT {
            self.private.pop_front();
        }
    }

    /// The grid of `step` and the state `target`'s contribution to it named, if kept.
    pub(super) fn private_of(&self, step: u32, target: PeerId) -> Option<(Arc<Vec<u8>>, u64)> {
        let kept = self.private.iter().rev().find(|p| p.step == step)?;
        Some((kept.grid.clone(), *kept.states.get(&target)?))
    }

    /// The whole state `target`'s contribution to `step` should name — `digest`, as this
    /// member's audit of its previous contribution left it — if kept.
    pub(super) fn keep_derived(&mut self, step: u32, target: PeerId, digest: u64, words: Arc<Vec<f32>>) {
        self.derived.insert(target, (step, digest, words));
        let bytes =
            |d: &BTreeMap<PeerId, (u32, u64, Arc<Vec<f32>>)>| d.values().map(|(_, _, w)| w.len() * 4).sum::<usize>();
        while bytes(&self.derived) > DERIVED_BYTES {
            let oldest = self.derived.iter().min_by_key(|(_, (s, _, _))| *s).map(|(p, _)| *p).expect("not empty");
            self.derived.remove(&oldest);
        }
    }

    /// The state `target`'s contribution to `step` named (`named`), if this member derived it.
    pub(super) fn derived_of(&self, step: u32, target: PeerId, named: u64) -> Option<Arc<Vec<f32>>> {
        let (s, digest, words) = self.derived.get(&target)?;
        (*s == step && *digest == named).then(|| words.clone())
    }

    /// The record of `step` this member holds.
    pub fn record(&self, step: u32) -> Option<&StepRecord> {
        self.records.iter().rev().find(|r| r.step == step)
    }

    /// Whether `peer`'s contribution is being disputed (the leader does not sum it meanwhile).
    pub fn disputed(&self, peer: PeerId) -> bool {
        self.dispute.as_ref().is_some_and(|d| d.verdict.target == peer) || self.apart.holds(peer)
    }

    /// A push or a restore replaced the state: records of other weights are no evidence now.
    pub fn forget_records(&mut self) {
        self.records.clear();
        self.private.clear();
        self.checks.clear();
        self.links.clear();
        self.links_asked.clear();
        self.pending = None;
        self.derived.clear();
        self.unawaited.clear();
    }
}
