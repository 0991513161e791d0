//! Disputes (`docs/TRUST.md`, "Disputes narrowed to one op"): before the leader proposes a
//! verdict on a contribution's values, it narrows the departure to the op of the target's step
//! where it first departs. Its recomputation recorded the definition's trace, which it sends the
//! target (`-24`); the target runs its step again on its own backend, comparing as it goes, and
//! answers its trace up to the first op and chunk where they part and its words of that chunk
//! (`-25`); the leader runs the definition's step up to that op for its own words, and the
//! verdict names the op, the buffer and word and both values. The target is not summed meanwhile; a dispute that narrows
//! to nothing keeps the contribution's evidence.

use std::sync::Arc;

use super::*;
use crate::audit::Departure;
use crate::wire::{AuditVerdict, Evidence, TraceAnswer};

/// How long the leader waits for a disputed member's trace (and for each of its answers), in
/// the run's longest election timeouts, before it proposes the verdict on the contribution's
/// evidence alone.
pub const DISPUTE_WAIT_ELECTIONS: u64 = 1;
/// (Leader) a departure narrowed to one op before its verdict is proposed: the verdict as the
/// contribution's evidence gives it (what is proposed if the narrowing does not end in an op),
/// since when the leader waits, and for what.
#[derive(Clone, Debug)]
pub(super) struct Dispute {
    pub verdict: AuditVerdict,
    pub since_ms: u64,
    pub stage: Stage,
}

#[derive(Clone, Debug)]
pub(super) enum Stage {
    /// The target's trace of the step, asked for (`-24`), and the definition's, recorded by the
    /// leader's recomputation.
    Trace { definition: Arc<Trace> },
    /// The first op and chunk where the two part: the definition's words of it (the worker runs
    /// the step again up to that op) and the target's (`-25`, their digest the one its trace
    /// gave the chunk), each once here.
    Narrowing { op: usize, chunk: usize, digest: u64, ours: Option<Departure>, theirs: Option<Vec<u32>> },
}

impl Session {
    /// (Leader) a contribution to an `every-step` run found to depart by its values: before the
    /// verdict is proposed, the dispute is narrowed to the op of the target's step where it
    /// first departs (`docs/TRUST.md`, "Disputes"), the target not summed meanwhile. Other
    /// evidence (a state, a withheld one, a false accusation), no trace of the definition (an
    /// `outer:H` window), a target gone or a dispute already under way: the verdict is proposed
    /// at once. An owner's sum whose fingerprints failed (chunk owners) is recomputed first
    /// (`fingerprints.rs`): its accusation names the owner, but a contributor may be the liar.
    pub(super) fn dispute_or_convict(&mut self, verdict: AuditVerdict) {
        if let Evidence::SumCheck { chunk } = verdict.evidence {
            // An owner's sum whose fingerprints did not add up: the owner or a contributor
            // lied, and only recomputing the sum says which (`fingerprints.rs`).
            return self.dispute_sum(verdict.step, chunk, verdict.found_by);
        }
        let target = verdict.target;
        if self.audits.disputed(target) {
            return; // its dispute ends in a verdict
        }
        let key = (verdict.step, target);
        let definition = self.audits.definition.take().filter(|(k, _)| *k == key).map(|(_, t)| t);
        let by_values = matches!(verdict.evidence, Evidence::Word { .. } | Evidence::Digest { .. });
        let free = self.audits.dispute.is_none() && !self.audits.convicted.contains(&target);
        let reachable = target != self.config.me && self.members.contains(&target);
        let Some(definition) = definition.filter(|_| by_values && free && reachable) else {
            return self.convict(verdict);
        };
        let since_ms = self.timing.now_ms();
        // The definition's trace goes with the request: one answer brings the target's trace up
        // to the op where they part and its words there.
        let request = Message::TraceRequest { step: verdict.step, definition: (*definition).clone() };
        self.audits.dispute = Some(Dispute { verdict, since_ms, stage: Stage::Trace { definition } });
        self.event(Event::Disputing { step: verdict.step, target, evidence: verdict.evidence });
        self.send(target, request);
    }

    /// The disputed member's trace (up to the first op where it parts from the definition's),
    /// compared with the definition's: where they part, the definition's words of that chunk are
    /// asked of the worker (it runs the step again up to that op); the target's came with it.
    fn on_their_trace(&mut self, theirs: Arc<Trace>) {
        let Some(dispute) = self.audits.dispute.as_mut() else { return };
        let Stage::Trace { definition } = &dispute.stage else { return };
        let definition = definition.clone();
        let (step, target) = (dispute.verdict.step, dispute.verdict.target);
        if theirs.ops.is_empty() {
            return self.settle(None); // it could not trace the step
        }
        dispute.since_ms = self.timing.now_ms();
        if theirs.ops.len() > definition.ops.len() {
            return self.settle(None); // not a trace of this step
        }
        let parted = (0..theirs.ops.len()).find(|&i| definition.ops[i] != theirs.ops[i]);
        let Some(op) = parted else { return self.settle(None) }; // every op agrees
        if op + 1 != theirs.ops.len() {
            return self.settle(None); // it went on past the op where it parts
        }
        let (ours, their) = (&definition.ops[op], &theirs.ops[op]);
        let chunk = ours.iter().zip(their).position(|(a, b)| a != b).unwrap_or(ours.len().min(their.len()));
        let Some(&digest) = their.get(chunk) else { return self.settle(None) };
        dispute.stage = Stage::Narrowing { op, chunk, digest, ours: None, theirs: None };
        self.out.push(Output::Settle { step, target, theirs });
    }

    /// A narrowing with both sides' words of the chunk where they part ends in the op's evidence.
    fn narrowed(&mut self) {
        let Some(Dispute { stage: Stage::Narrowing { ours: Some(ours), theirs: Some(theirs), .. }, .. }) =
            &self.audits.dispute
        else {
            return;
        };
        let evidence = op_evidence(ours, theirs);
        self.settle(evidence);
    }

    /// The dispute ends: its verdict proposed with `evidence` (an op), or with the contribution's.
    fn settle(&mut self, evidence: Option<Evidence>) {
        let Some(dispute) = self.audits.dispute.take() else { return };
        let verdict = AuditVerdict { evidence: evidence.unwrap_or(dispute.verdict.evidence), ..dispute.verdict };
        self.convict(verdict);
    }

    /// The leader asks for this member's trace of `step` (a dispute of its contribution): the
    /// adapter runs the step again on this member's backend and answers. Only the leader's
    /// requests are served (each costs a step).
    pub(super) fn on_trace_request(&mut self, from: PeerId, step: u32, definition: Trace) {
        if self.leader() != Some(from) || self.is_leader() {
            return self.ignore(from, Ignored::TraceRequestFromNonLeader);
        }
        self.out.push(Output::ServeTrace { to: from, step, definition: Arc::new(definition) });
    }

    /// A disputed member's answer to the definition's trace: its own up to the op where they
    /// part, and its words of that op's first parting chunk — checked against the digest its
    /// trace gave that chunk.
    pub(super) fn on_trace(&mut self, from: PeerId, step: u32, answer: TraceAnswer) {
        let asked = |d: &Dispute| d.verdict.target == from && d.verdict.step == step;
        let waiting = self.audits.dispute.as_ref().is_some_and(|d| asked(d) && matches!(d.stage, Stage::Trace { .. }));
        let TraceAnswer { trace, words } = answer;
        if !waiting {
            return self.ignore(from, Ignored::UnaskedTrace);
        }
        self.on_their_trace(Arc::new(trace));
        // Still narrowing: its words of the chunk where it parts, in the same answer.
        if self.audits.dispute.as_ref().is_some_and(|d| matches!(d.stage, Stage::Narrowing { .. })) {
            match words {
                Some((op, chunk, words)) => self.their_words(from, step, op, chunk, words),
                None => self.settle(None),
            }
        }
    }

    /// The disputed member's words of the chunk where its trace parts from the definition's,
    /// checked against the digest its trace gave that chunk.
    fn their_words(&mut self, from: PeerId, step: u32, op: u32, chunk: u32, words: Vec<u32>) {
        let disputed = |d: &&mut Dispute| d.verdict.target == from && d.verdict.step == step;
        let Some(Dispute { stage: Stage::Narrowing { op: o, chunk: c, digest, theirs, .. }, .. }) =
            self.audits.dispute.as_mut().filter(disputed)
        else {
            return self.ignore(from, Ignored::UnaskedTrace);
        };
        if (op as usize, chunk as usize) != (*o, *c) || theirs.is_some() {
            return self.ignore(from, Ignored::UnaskedTrace);
        }
        // Words that are not the chunk its trace named prove nothing about the op.
        if crate::wire::words_digest(&words) != *digest {
            return self.settle(None);
        }
        *theirs = Some(words);
        self.narrowed();
    }

    /// The definition's run of the disputed step up to the op where the two traces part: its
    /// words of the chunk that differs (the narrowing ends once the target's are here too), or,
    /// where it parts elsewhere or failed, the verdict on the contribution's evidence.
    pub(super) fn on_settled(&mut self, step: u32, target: PeerId, outcome: Result<Traced, Failure>) {
        let ours = |d: &Dispute| d.verdict.target == target && d.verdict.step == step;
        let Some(dispute) = self.audits.dispute.as_mut().filter(|d| ours(d)) else { return };
        let Ok(Traced::Departs(departure)) = outcome else { return self.settle(None) };
        match &mut dispute.stage {
            Stage::Narrowing { op, chunk, ours, .. } if (*op, *chunk) == (departure.op, departure.chunk) => {
                *ours = Some(departure);
                self.narrowed();
            }
            // The definition's run parted from the trace elsewhere than its own trace did.
            _ => self.settle(None),
        }
    }

    /// (Leader) a dispute whose target has not answered for [`DISPUTE_WAIT_ELECTIONS`] election
    /// timeouts ends on the contribution's evidence.
    pub(super) fn dispute_tick(&mut self, now_ms: u64) {
        let Some(since) = self.audits.dispute.as_ref().map(|d| d.since_ms) else { return };
        let wait = DISPUTE_WAIT_ELECTIONS * self.config.agreement.longest_election_ms();
        if now_ms.saturating_sub(since) >= wait {
            self.settle(None);
        }
    }
}

/// The first word where the target's words of a chunk part from the definition's, as
/// evidence: the op, the buffer and word it wrote, both values (`None`: they do not part).
fn op_evidence(departure: &Departure, theirs: &[u32]) -> Option<Evidence> {
    let ours = &departure.words;
    let at = (0..ours.len().min(theirs.len())).find(|&i| ours[i] != theirs[i])?;
    let (buffer, word) = departure.place(at)?;
    Some(Evidence::Op {
        op: departure.op as u32,
        code: departure.code,
        buffer,
        word,
        expected: ours[at],
        claimed: theirs[at],
    })
}
