//! The guard's disputes (`docs/TRUST.md`, "The guard's disputes"). Contributions to one step
//! are computed from the same committed weights, so one whose weight hash is not the leader's
//! was computed from other weights — a flipped bit, an update its member's backend got wrong —
//! unless the leader's own are the wrong ones. Nothing is summed and nobody named on a hash
//! alone:
//!
//! - The leader runs its own last update again by the definition, on the host, from the state
//!   before it and the committed mean (`Output::CheckWeights`), and proposes no record
//!   meanwhile.
//! - Where its weights are the definition's, each member apart is sent their chunks' digests
//!   (`-27`) and answers with the first chunk where its own part and its words (`-28`); the
//!   verdict, committed through the log, names the word and both values — or both weight
//!   hashes, where the member does not answer within a dispute's wait — and the member is out
//!   of the run for good. The group trains on without it.
//! - Where the leader's own weights depart, it names itself, stops and hands the lead on: the
//!   others' weights agree, and the next leader goes on from them.
//! - A probe hash other than every healthy backend's is its member's own evidence: convicted at
//!   once.
//!
//! Members that do not lead leave it to the leader (a member apart from the record's weights
//! stops at the record it cannot apply, as before, and its verdict follows). Where nothing is
//! kept to check against — audits off — the guard stops the run, as it always did.

use std::collections::BTreeMap;

use super::*;
use crate::wire::{chunk_range, AuditVerdict, Evidence};

/// (Leader) what the adapter's check of our weights found: where they part from the
/// definition's (word, the definition's bits, ours; `None`: they are its), and the definition's
/// weights and their chunks' digests (what a member apart is sent, and its answer compared
/// with).
#[derive(Clone, Debug, PartialEq)]
pub struct WeightsChecked {
    pub departs: Option<(u64, u32, u32)>,
    pub definition: Arc<Vec<f32>>,
    pub digests: Arc<Vec<u64>>,
}

/// (Leader) the guard's disputes under way.
#[derive(Debug, Default)]
pub(super) struct Apart {
    /// Members whose contribution to a step was computed from weights other than ours, waiting
    /// for our check of that step's weights (and for the step's other contributions, which
    /// the check's count of who agrees with whom reads): by member, (step, the weight hash it
    /// named, when found).
    waiting: BTreeMap<PeerId, (u32, u32, u64)>,
    /// The step whose weights the adapter is checking (one at a time).
    checking: Option<u32>,
    /// Our weights of a step, checked: the definition's.
    checked: Option<(u32, Arc<WeightsChecked>)>,
    /// Members asked where their weights part: by member.
    asked: BTreeMap<PeerId, Asked>,
}

/// A member asked where its weights of `step` part: the weight hash its contribution named
/// and ours, and when.
#[derive(Clone, Copy, Debug)]
struct Asked {
    step: u32,
    theirs: u32,
    ours: u32,
    at_ms: u64,
}

impl Apart {
    /// Whether `peer`'s weights are in dispute (its contributions are not summed meanwhile).
    pub fn holds(&self, peer: PeerId) -> bool {
        self.waiting.contains_key(&peer) || self.asked.contains_key(&peer)
    }

    /// Whether our own weights are being checked, or members apart wait for the count of who
    /// agrees with whom (no record is proposed meanwhile: one could name weights that depart).
    pub fn undecided(&self) -> bool {
        self.checking.is_some() || !self.waiting.is_empty()
    }
}

impl Session {
    /// Whether this node's guard settles a weight or probe mismatch by a dispute instead of
    /// stopping the run: audits keep the weights each step started from and the leader keeps
    /// its updates.
    pub(super) fn guard_settles(&self) -> bool {
        self.config.audit_rate > 0 && self.run.is_some()
    }

    /// (Leader) `peer`'s contribution to `step` named weight hash `whash`, not ours: our
    /// weights of the step are checked first (once per step), then it is asked where its part.
    pub(super) fn found_apart(&mut self, step: u32, peer: PeerId, whash: u32) {
        if self.audits.convicted.contains(&peer) || self.audits.apart.holds(peer) {
            return;
        }
        let now = self.timing.now_ms();
        self.audits.apart.waiting.insert(peer, (step, whash, now));
        self.next_weights_check();
    }

    /// (Leader) another contribution is here, or time passed: a dispute waiting for the
    /// step's contributions (or a dispute's wait) may go on.
    pub(super) fn weights_step_grew(&mut self) {
        if !self.audits.apart.waiting.is_empty() {
            self.next_weights_check();
        }
    }

    /// Asks the members waiting for a step already checked where their weights part, and the
    /// adapter to check the next step's when none is being checked.
    fn next_weights_check(&mut self) {
        let apart = &self.audits.apart;
        if let Some(&(checked, _)) = apart.checked.as_ref() {
            let ready: Vec<PeerId> =
                apart.waiting.iter().filter(|(_, (s, _, _))| *s == checked).map(|(p, _)| *p).collect();
            let found = ready.iter().filter_map(|p| apart.waiting.get(p)).map(|(_, _, at)| *at).min();
            if let Some(found) = found {
                // Who agrees with whom is counted once the step's contributions are here, or
                // a dispute's wait after the first found apart.
                let wait = DISPUTE_WAIT_ELECTIONS * self.config.agreement.longest_election_ms();
                if !self.all_in(checked) && self.timing.now_ms().saturating_sub(found) < wait {
                    return;
                }
                if self.outnumbered(checked) {
                    return;
                }
            }
            for peer in ready {
                self.ask_where_apart(peer);
            }
        }
        let apart = &mut self.audits.apart;
        if apart.checking.is_none() {
            if let Some(&(step, _, _)) = apart.waiting.values().next() {
                apart.checking = Some(step);
                self.out.push(Output::CheckWeights { step });
            }
        }
    }

    fn ask_where_apart(&mut self, peer: PeerId) {
        let now = self.timing.now_ms();
        let apart = &mut self.audits.apart;
        let (Some((step, whash, _)), Some((_, checked))) = (apart.waiting.remove(&peer), apart.checked.as_ref()) else {
            return;
        };
        let digests = checked.digests.to_vec();
        let ours = self.contributions.get(step, self.config.me).map_or(0, |h| h.header.whash);
        apart.asked.insert(peer, Asked { step, theirs: whash, ours, at_ms: now });
        let evidence = Evidence::WeightHash { expected: ours, claimed: whash };
        self.event(Event::Disputing { step, target: peer, evidence });
        self.send(peer, Message::WeightsRequest { step, digests });
    }

    /// (Leader) the adapter's check of the weights our contribution to `step` was computed
    /// from.
    pub(super) fn on_weights_checked(&mut self, step: u32, outcome: Result<WeightsChecked, Failure>) {
        let me = self.config.me;
        if self.audits.apart.checking != Some(step) {
            return; // not asked (a new run began since)
        }
        self.audits.apart.checking = None;
        let waiting: Vec<PeerId> =
            self.audits.apart.waiting.iter().filter(|(_, (s, _, _))| *s == step).map(|(p, _)| *p).collect();
        match outcome {
            Err(error) => {
                // Nothing to tell who is right by: the guard stops the run, as it always did.
                for &target in &waiting {
                    self.event(Event::AuditFailed { step, target, error: error.clone() });
                }
                self.audits.apart.waiting.clear();
                self.stop_with(GuardFailure { step, weight_mismatch: waiting, probe_mismatch: Vec::new() });
                self.on_quit();
            }
            Ok(WeightsChecked { departs: Some((word, expected, claimed)), .. }) => {
                // Ours are the ones apart: said, and the lead handed on (the others agree).
                let evidence = Evidence::Weights { word, expected, claimed };
                self.event(Event::Accused { step, target: me, by: me, evidence });
                self.apart_ourselves(step);
            }
            Ok(checked) => {
                self.audits.apart.checked = Some((step, Arc::new(checked)));
                self.next_weights_check();
            }
        }
    }

    /// Whether every member the step waits for contributed to it here (a contribution held).
    fn all_in(&self, step: u32) -> bool {
        let Some(agreement) = self.agreement.as_ref() else { return true };
        let (voters, learners) = agreement.members();
        voters.iter().chain(&learners).all(|p| {
            self.contributions.get(step, *p).is_some()
                || !self.roster.expected(*p)
                || self.roster.is_out(*p)
                || *p == self.config.me
        })
    }

    /// Our check covers the weights our update began from and the update itself, not the
    /// optimizer's moments it read (no contribution names them): where more of the step's
    /// contributions held here were computed from other weights than from ours, ours are taken
    /// to be the ones apart — said with the weight hash most of them named, and the lead handed
    /// on, as when the check finds them. True when it ends so.
    fn outnumbered(&mut self, step: u32) -> bool {
        let me = self.config.me;
        let Some(own) = self.contributions.get(step, me).map(|h| h.header.whash) else { return false };
        let mut named: BTreeMap<u32, usize> = BTreeMap::new();
        for (_, held) in self.contributions.at(step) {
            if held.header.phash == self.config.expected_phash {
                *named.entry(held.header.whash).or_default() += 1;
            }
        }
        let ours = named.remove(&own).unwrap_or(0);
        let Some((&theirs, &most)) = named.iter().max_by_key(|(_, n)| **n) else { return false };
        if most <= ours {
            return false;
        }
        self.event(Event::Accused {
            step,
            target: me,
            by: me,
            evidence: Evidence::WeightHash { expected: theirs, claimed: own },
        });
        self.apart_ourselves(step);
        true
    }

    /// Our weights are the ones apart: the run stops here, naming us, and the lead (if ours)
    /// goes to a member whose weights agree with the others'.
    fn apart_ourselves(&mut self, step: u32) {
        let me = self.config.me;
        self.audits.apart = Apart::default();
        self.stop_with(GuardFailure { step, weight_mismatch: vec![me], probe_mismatch: Vec::new() });
        self.on_quit();
    }

    /// (A disputed member) the leader asks where our weights of `step` part from its own.
    pub(super) fn on_weights_request(&mut self, from: PeerId, step: u32, digests: Vec<u64>) {
        if self.leader() != Some(from) || self.is_leader() {
            return self.ignore(from, Ignored::WeightsRequestFromNonLeader);
        }
        self.out.push(Output::ServeWeights { to: from, step, digests: Arc::new(digests) });
    }

    /// (Leader) a disputed member's answer: the first chunk of its weights that parts from
    /// ours, and its words: the verdict names the first word that differs, or, where the
    /// answer shows none, both weight hashes.
    pub(super) fn on_weights(&mut self, from: PeerId, step: u32, words: Option<(u32, Vec<u32>)>) {
        let apart = &mut self.audits.apart;
        let Some(asked) = apart.asked.remove(&from).filter(|a| a.step == step) else {
            return self.ignore(from, Ignored::UnaskedWeights);
        };
        let mut evidence = Evidence::WeightHash { expected: asked.ours, claimed: asked.theirs };
        if let (Some((chunk, theirs)), Some((_, checked))) = (words, apart.checked.as_ref()) {
            let definition = &checked.definition;
            let range = chunk_range(chunk, definition.len());
            let theirs: Vec<f32> = theirs.into_iter().map(f32::from_bits).collect();
            if let Some((i, expected, claimed)) =
                first_departure(&definition[range.clone()], &theirs).filter(|_| theirs.len() == range.len())
            {
                evidence = Evidence::Weights { word: range.start as u64 + i, expected, claimed };
            }
        }
        self.convict_apart(step, from, evidence);
    }

    /// (Leader) a member apart convicted: the verdict goes through the log.
    pub(super) fn convict_apart(&mut self, step: u32, target: PeerId, evidence: Evidence) {
        let me = self.config.me;
        if target != me {
            self.convict(AuditVerdict { step, target, found_by: me, evidence });
        }
    }

    /// (Leader) members asked where their weights part that did not answer within a
    /// dispute's wait: convicted on both weight hashes.
    pub(super) fn apart_tick(&mut self, now_ms: u64) {
        self.weights_step_grew();
        let wait = DISPUTE_WAIT_ELECTIONS * self.config.agreement.longest_election_ms();
        let apart = &mut self.audits.apart;
        let late: Vec<PeerId> =
            apart.asked.iter().filter(|(_, a)| now_ms.saturating_sub(a.at_ms) >= wait).map(|(p, _)| *p).collect();
        for peer in late {
            let Some(a) = self.audits.apart.asked.remove(&peer) else { continue };
            self.convict_apart(a.step, peer, Evidence::WeightHash { expected: a.ours, claimed: a.theirs });
        }
    }
}

/// The first word where `held` parts from `definition`: (word, the definition's bits, held's).
/// Lengths that differ part at the shorter's end (a missing word reads as 0).
pub fn first_departure(definition: &[f32], held: &[f32]) -> Option<(u64, u32, u32)> {
    let n = definition.len().max(held.len());
    (0..n).find_map(|i| {
        let (d, h) = (definition.get(i).map_or(0, |v| v.to_bits()), held.get(i).map_or(0, |v| v.to_bits()));
        (d != h).then_some((i as u64, d, h))
    })
}
