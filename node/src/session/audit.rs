//! Audits by recomputation (`docs/TRUST.md`): every member's contribution is a function of
//! public data — the committed weights, its own batch (a function of the run's seed, its id and
//! the step) — so anyone can recompute it and compare bits.
//!
//! - **Who audits whom** is decided after each commit by a rule every member computes from the
//!   committed record ([`assignment`]): its digests make it unpredictable before the commit, so a
//!   member cannot know whether the contribution it sends will be checked. Each member of the
//!   step's roster audits, with probability `rate` (per mille), one other member of it.
//! - **An auditor** recomputes its target's contribution (`Output::Audit`, on a worker of the
//!   adapter's, beside its own step) and compares the digest the record named. Equal, it says so
//!   (`Event::Audited`); different, it accuses the target to the leader with the first differing
//!   word (`-21`), or, leading, checks it itself.
//! - **The leader checks** an accusation by recomputing the same contribution, from the digest
//!   its own copy of the record names (an accuser cannot make it check another): if the
//!   contribution departs, its target is convicted; if it is the definition's, the accuser is.
//!   Either way the verdict goes **through the run's log** (`LogEntry::Verdict`, with its
//!   evidence), so every member agrees who was removed and why; on commit every member takes the
//!   convicted member out of the run for good (as a kick: the leader removes it from the
//!   configuration and tells it, `-13` kind 2).
//!
//! Audits run on `every-step` runs whose contributions are f32 (an int8 contribution depends on
//! its member's private error-feedback residual, an `outer:H` one on its inner optimizer state:
//! not built, `docs/TRUST.md`). One audit at a time per member: an assignment that finds the
//! worker busy is skipped and counted.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::log::{LogEntry, StepRecord};
use super::*;
use crate::wire::{AuditVerdict, Evidence};

/// Committed records a member keeps to check accusations against (the digest each named).
const RECORDS_KEPT: usize = 256;

/// What the audit worker is recomputing: whose contribution to which step, the digest the
/// committed record named, the contribution itself (while held: the evidence's source), and the
/// members whose accusation this recomputation checks (the leader's).
#[derive(Clone, Debug)]
pub(super) struct Running {
    pub step: u32,
    pub target: PeerId,
    pub whash: u32,
    pub named: u64,
    pub claimed: Option<Gradient>,
    pub accusers: Vec<PeerId>,
}

/// The counts the step-health pane and the headless JSON show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuditStats {
    /// Contributions this member recomputed, and how many matched.
    pub audited: u32,
    pub matched: u32,
    /// Assignments skipped because the worker was busy.
    pub skipped: u32,
    /// Accusations this member made.
    pub accused: u32,
}

/// The audits' part of the session.
#[derive(Debug, Default)]
pub(super) struct Audits {
    /// The last committed records (of this epoch), newest last.
    records: VecDeque<StepRecord>,
    pub running: Option<Running>,
    /// (Leader) accusations waiting for the worker: by (step, target), who accused.
    pub checks: BTreeMap<(u32, PeerId), Vec<PeerId>>,
    /// Members a verdict was proposed or committed against (nothing twice).
    pub convicted: BTreeSet<PeerId>,
    pub stats: AuditStats,
}

impl Audits {
    /// A record committed: kept for checking accusations against.
    pub fn committed(&mut self, record: &StepRecord) {
        self.records.push_back(record.clone());
        while self.records.len() > RECORDS_KEPT {
            self.records.pop_front();
        }
    }

    /// The record of `step` this member holds.
    pub fn record(&self, step: u32) -> Option<&StepRecord> {
        self.records.iter().rev().find(|r| r.step == step)
    }

    /// A push or a restore replaced the state: records of other weights are no evidence now.
    pub fn forget_records(&mut self) {
        self.records.clear();
        self.checks.clear();
    }
}

/// Whether a run's contributions can be audited: `every-step`, f32 (see the module docs).
fn auditable(run: &RunConfig) -> bool {
    run.sync.mode.steps_per_sync() == 1 && run.sync.compression == crate::sync::Compression::None
}

impl Session {
    /// A committed record was applied: kept (accusations are checked against it), and the audit
    /// it assigns this member started.
    pub(super) fn audit_after(&mut self, record: &StepRecord) {
        self.audits.committed(record);
        if !self.run.is_some_and(|run| auditable(&run)) {
            return;
        }
        let me = self.config.me;
        let Some(target) = assignment(record, me, self.config.audit_rate) else { return };
        if self.audits.running.is_some() {
            self.audits.stats.skipped += 1;
            return;
        }
        self.start_audit(record, target, Vec::new());
    }

    /// Asks the adapter to recompute `target`'s contribution to `record`'s step; `accusers`: the
    /// members whose accusation it checks.
    fn start_audit(&mut self, record: &StepRecord, target: PeerId, accusers: Vec<PeerId>) {
        let Some(named) = record.contributions.iter().find(|c| c.peer == target).map(|c| c.digest) else { return };
        let step = record.step;
        let claimed = self.contributions.get(step, target).map(|h| h.gradient.clone());
        self.audits.running = Some(Running { step, target, whash: record.whash, named, claimed, accusers });
        self.out.push(Output::Audit { step, target });
    }

    /// The adapter's recomputation of `target`'s contribution to `step`.
    pub(super) fn on_audited(&mut self, step: u32, target: PeerId, outcome: Result<(f32, Values), Failure>) {
        let Some(running) = self.audits.running.take_if(|r| r.step == step && r.target == target) else {
            return; // not asked (a new run began since)
        };
        match outcome {
            Err(error) => self.event(Event::AuditFailed { step, target, error }),
            Ok((loss, values)) => self.compare(running, loss, values),
        }
        self.next_check();
    }

    fn compare(&mut self, running: Running, loss: f32, values: Values) {
        let me = self.config.me;
        let Running { step, target, whash, named, claimed, accusers } = running;
        let recomputed = Gradient { step, whash, phash: self.config.expected_phash, loss, values, weight: 1 };
        self.audits.stats.audited += 1;
        if recomputed.digest() == named {
            self.audits.stats.matched += 1;
            self.event(Event::Audited { step, target });
            // The contribution is the definition's: whoever accused it accused falsely.
            for accuser in accusers {
                let evidence = Evidence::FalseAccusation { accused: target };
                self.convict(AuditVerdict { step, target: accuser, found_by: me, evidence });
            }
            return;
        }
        let evidence = evidence(&recomputed, claimed.as_ref(), named);
        let found_by = accusers.first().copied().unwrap_or(me);
        if accusers.is_empty() {
            self.audits.stats.accused += 1;
            self.event(Event::Accused { step, target, by: me, evidence });
        }
        if self.is_leader() {
            self.convict(AuditVerdict { step, target, found_by, evidence });
        } else if let Some(leader) = self.leader().filter(|&l| l != me && l != target) {
            self.send(leader, Message::Accusation { step, target, evidence });
        }
    }

    /// (Leader) the next accusation waiting, checked once the worker is free.
    fn next_check(&mut self) {
        if self.audits.running.is_some() || !self.is_leader() {
            return;
        }
        while let Some(((step, target), accusers)) = self.audits.checks.pop_first() {
            if self.audits.convicted.contains(&target) {
                continue;
            }
            if let Some(record) = self.audits.record(step).cloned() {
                return self.start_audit(&record, target, accusers);
            }
        }
    }

    /// `from` accuses `target`'s contribution to `step`: the leader checks it by recomputing it.
    pub(super) fn on_accusation(&mut self, from: PeerId, step: u32, target: PeerId, evidence: Evidence) {
        if !self.is_leader() {
            return self.ignore(from, Ignored::AccusationToNonLeader);
        }
        let named = self.audits.record(step).is_some_and(|r| r.roster().contains(&target));
        if !named {
            return self.ignore(from, Ignored::AccusationOfNoContribution { step, target });
        }
        self.event(Event::Accused { step, target, by: from, evidence });
        if self.audits.convicted.contains(&target) {
            return;
        }
        let accusers = self.audits.checks.entry((step, target)).or_default();
        if !accusers.contains(&from) {
            accusers.push(from);
        }
        self.next_check();
    }

    /// (Leader) proposes `verdict` to the run's log, once a member.
    fn convict(&mut self, verdict: AuditVerdict) {
        if !self.audits.convicted.insert(verdict.target) {
            return;
        }
        match self.agreement.as_mut().map(|a| a.propose(&LogEntry::Verdict(verdict))) {
            Some(Ok(true)) => {}
            Some(Err(e)) => self.stop(Stop::Agreement(e)),
            // No longer leading: the accusation is for the next leader to check.
            _ => {
                self.audits.convicted.remove(&verdict.target);
            }
        }
    }

    /// A verdict committed: its target is out of the run for good, on every member.
    pub(super) fn on_verdict(&mut self, verdict: AuditVerdict) {
        self.audits.convicted.insert(verdict.target);
        self.event(Event::Verdict(verdict));
        let why = Removal::Audit(verdict);
        if verdict.target == self.config.me {
            let step = self.taking.applied;
            self.event(Event::Removed { step, why: why.clone() });
            self.stop(Stop::Removed { step, why });
        } else if self.is_leader() {
            self.remove_for_good(verdict.target, why);
        } else {
            self.roster.kick(verdict.target, why);
        }
    }
}

/// The member `me` audits after `record` committed, if any: each roster member draws from the
/// record's digests (and its own id) whether it audits (`rate` in a thousand) and whom, among
/// the other members of the roster.
pub fn assignment(record: &StepRecord, me: PeerId, rate: u32) -> Option<PeerId> {
    let roster = record.roster();
    if roster.len() < 2 || !roster.contains(&me) || rate == 0 {
        return None;
    }
    let mut seed = lockstep_luts::hash::fnv1a64(&record.step.to_le_bytes()) ^ u64::from(record.whash);
    for c in &record.contributions {
        seed = lockstep_luts::rng::SplitMix64::new(seed ^ c.digest ^ c.peer.rotate_left(17)).next_u64();
    }
    let mut draw = lockstep_luts::rng::SplitMix64::new(seed ^ me.rotate_left(31));
    if draw.below(1000) >= u64::from(rate) {
        return None;
    }
    let others: Vec<PeerId> = roster.into_iter().filter(|&p| p != me).collect();
    Some(others[draw.below(others.len() as u64) as usize])
}

/// Where `claimed` departs from `recomputed` (the definition's): the first differing word (the
/// loss, then the values), or the digests where the contribution is not held or differs
/// elsewhere (its encoding, its length).
pub fn evidence(recomputed: &Gradient, claimed: Option<&Gradient>, named: u64) -> Evidence {
    let digest = Evidence::Digest { named, recomputed: recomputed.digest() };
    let Some(claimed) = claimed else { return digest };
    if recomputed.loss.to_bits() != claimed.loss.to_bits() {
        return Evidence::Word { word: 0, expected: recomputed.loss.to_bits(), claimed: claimed.loss.to_bits() };
    }
    match (&recomputed.values, &claimed.values) {
        (Values::F32(want), Values::F32(got)) if want.len() == got.len() => {
            match want.iter().zip(got).position(|(w, g)| w.to_bits() != g.to_bits()) {
                Some(i) => {
                    Evidence::Word { word: i as u32 + 1, expected: want[i].to_bits(), claimed: got[i].to_bits() }
                }
                None => digest,
            }
        }
        _ => digest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::log::Named;

    fn record(step: u32, peers: &[PeerId]) -> StepRecord {
        let contributions = peers.iter().map(|&peer| Named {
            peer,
            digest: peer.wrapping_mul(0x9e37_79b9) ^ u64::from(step),
            weight: 1,
        });
        StepRecord { step, whash: 7, contributions: contributions.collect() }
    }

    #[test]
    fn each_roster_member_audits_another_at_the_rate_and_no_one_can_tell_before_the_commit() {
        let peers = [3, 8, 21, 40];
        let (mut audits, mut of) = (0, BTreeMap::<PeerId, u32>::new());
        for step in 1..=2000 {
            let r = record(step, &peers);
            for &me in &peers {
                if let Some(target) = assignment(&r, me, 250) {
                    assert!(target != me && peers.contains(&target));
                    audits += 1;
                    *of.entry(target).or_default() += 1;
                }
                assert_eq!(assignment(&r, me, 0), None);
                assert!(assignment(&r, me, 1000).is_some());
            }
            // Not in the roster: audits nobody.
            assert_eq!(assignment(&r, 99, 1000), None);
        }
        // A quarter of 8,000 draws, each target about a quarter of those.
        assert!((1800..2200).contains(&audits), "{audits}");
        assert!(of.values().all(|&n| (400..600).contains(&n)), "{of:?}");
        // One digest of the record changed: another assignment (a member cannot foresee it).
        let (a, mut b) = (record(5, &peers), record(5, &peers));
        b.contributions[2].digest ^= 1;
        let differs = (0..64u64).any(|salt| {
            let (mut a, mut b) = (a.clone(), b.clone());
            a.whash ^= salt as u32;
            b.whash ^= salt as u32;
            peers.iter().any(|&me| assignment(&a, me, 500) != assignment(&b, me, 500))
        });
        assert!(differs);
        assert_eq!(assignment(&record(1, &[3]), 3, 1000), None, "a member alone has nobody to audit");
    }

    #[test]
    fn the_evidence_is_the_first_word_that_departs() {
        let g =
            |loss: f32, v: Vec<f32>| Gradient { step: 3, whash: 1, phash: 2, loss, values: Values::F32(v), weight: 1 };
        let right = g(2.5, vec![1.0, -0.5, 0.25]);
        let scaled = g(2.5, vec![1.0, -0.5 * 1.001, 0.25 * 1.001]);
        assert_eq!(
            evidence(&right, Some(&scaled), scaled.digest()),
            Evidence::Word { word: 2, expected: (-0.5f32).to_bits(), claimed: (-0.5f32 * 1.001).to_bits() }
        );
        assert_eq!(
            evidence(&right, Some(&g(2.0, vec![1.0, -0.5, 0.25])), 9),
            Evidence::Word { word: 0, expected: 2.5f32.to_bits(), claimed: 2.0f32.to_bits() }
        );
        assert_eq!(evidence(&right, None, 9), Evidence::Digest { named: 9, recomputed: right.digest() });
    }
}
