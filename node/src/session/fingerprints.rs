//! The owners' fingerprints (`docs/OWNERS.md`, "How an owner is checked"): with chunk owners a
//! member applies sums of chunks it never held, so it cannot recompute them — and the weight
//! hash guard cannot see a wrong sum every member applied alike. Fingerprints check every
//! owner's sum on every step, for eight bytes a chunk.
//!
//! - **Challenges nobody knew.** When the record of step `s + 1` is applied, its digest seeds the
//!   challenges of step `s` (`sync::owners::challenge`): every owner sent its step-`s` sum before
//!   that record existed.
//! - **Each contributor** of step `s` sends every member taking part its fingerprint of its own
//!   terms in each chunk sum it applied (`-35`; `sync::owners::GRID_WRONG` where the sum's grid
//!   misrepresents it).
//! - **Every member checks** every chunk sum it applied against the contributors'
//!   fingerprints, weighted (`sync::owners::sum_checks`). A failed check accuses the chunk's
//!   owner ([`Evidence::SumCheck`]) — to the leader; a leader's own chunk to everyone, each of
//!   which shuns it where its own check failed too (`shun.rs`), and the next leader settles it.
//! - **The leader settles** an accusation by recomputation: it asks the chunk's authors and its
//!   owner for the chunk's pieces (each checked against its author's header, which the record
//!   committed to), sums them, and compares the owner's sum word by word. Wrong: the owner is
//!   convicted ([`Evidence::SumWrong`]). Right: each contributor whose fingerprint the leader
//!   holds is checked against its own chunk, and one that lied is convicted
//!   ([`Evidence::Fingerprint`]). Neither: nobody is (a contributor may have told others other
//!   fingerprints than the leader's; nothing proves what it sent them).
//!
//! A fingerprint that never comes (its contributor gone, a link cut) leaves that step's sums
//! unchecked here, counted ([`super::AuditStats::sums_unchecked`]): checking is detection one
//! step late, as the audits are, never a wait of the step. **The leader does not depend on
//! them**: a contributor's fingerprints still missing a step after they were asked for again
//! (withheld, or lost) the leader computes itself, from the contributor's chunks — asked of it
//! and of each chunk's holder, checked against its header — and checks the step's sums with
//! them ([`Event::PrintsRecomputed`]). A contributor that withholds them cannot shield a wrong
//! owner; it costs the leader one contribution's bytes a step, as an audit does.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::sync::owners::{chunk, owned_pieces, sum_checks, ChunkSum};
use crate::wire::{AuditVerdict, Evidence};

/// How long the leader waits for the pieces a disputed sum is recomputed from, in the run's
/// longest election timeouts, before it gives the dispute up.
pub const SUM_DISPUTE_WAIT_ELECTIONS: u64 = 3;
/// Disputed chunk sums a leader holds at once (more are refused until some settle).
const DISPUTES_HELD: usize = 64;

/// An applied step summed from its owners' sums, until checked (or too old to be).
#[derive(Clone, Debug)]
struct Checking {
    record: StepRecord,
    /// The step's owners, by chunk.
    owners: Vec<PeerId>,
    /// The next record's digest, once applied here: the challenges' seed.
    seed: Option<u64>,
    /// Each contributor's fingerprints, with the seed it drew them under (the first each sent).
    prints: BTreeMap<PeerId, (u64, Vec<u64>)>,
    /// Chunks whose check failed here (known once checked).
    failed: BTreeSet<u16>,
    checked: bool,
    /// Whether the fingerprints still missing were asked for again.
    asked: bool,
    /// (Leader) contributors whose fingerprints it computes itself (still missing after they
    /// were asked for again), and since when it waits for their chunks (once a step: those
    /// that did not come in time are given up, not asked for again).
    recomputing: BTreeSet<PeerId>,
    recomputing_since: Option<u64>,
}

/// The fingerprints' part of the session.
#[derive(Debug, Default)]
pub(super) struct Prints {
    steps: BTreeMap<u32, Checking>,
    /// (Leader) chunk sums under dispute, by (step, chunk): who found it, and since when.
    disputes: BTreeMap<(u32, u16), (PeerId, u64)>,
    /// Fault injection: this member's own chunk sums are off by one (a wrong owner that applies
    /// its wrong sum itself, so the weight-hash guard cannot see it).
    pub wrong_owner: bool,
    /// Fault injection: this member's fingerprints of its first chunk are off by one (a
    /// contributor that makes an honest owner's sum fail its check).
    pub false_prints: bool,
    /// Fault injection: this member sends no fingerprints, and answers no request for them (a
    /// contributor that would leave a wrong owner's sums unchecked).
    pub withhold_prints: bool,
}

impl Prints {
    /// A restore replaced the weights: no step before it is checked here any more.
    pub fn restored(&mut self) {
        self.steps.clear();
        self.disputes.clear();
    }

    /// Whether this member's own check of `chunk` of `step` failed.
    fn failed_here(&self, step: u32, chunk: u16) -> bool {
        self.steps.get(&step).is_some_and(|c| c.failed.contains(&chunk))
    }
}

/// The first word where `claimed` departs from `expected` (grid bytes, then whose each block's
/// grid is, then the values: [`Evidence::SumWrong`]'s words), with both.
fn first_difference(expected: &ChunkSum, claimed: &ChunkSum) -> Option<(u32, i64, i64)> {
    let words = |s: &ChunkSum| -> Vec<i64> {
        let grid = s.grid.iter().chain(&s.by).map(|&b| i64::from(b));
        grid.chain(s.sum.iter().copied()).collect()
    };
    let (expected, claimed) = (words(expected), words(claimed));
    let longest = expected.len().max(claimed.len());
    (0..longest).find_map(|w| {
        let (e, c) = (expected.get(w).copied().unwrap_or(0), claimed.get(w).copied().unwrap_or(0));
        (e != c || expected.len() != claimed.len() && w + 1 == longest).then_some((w as u32, e, c))
    })
}

impl Session {
    /// Fault injection (`{"cmd":"wrong-owner"}`): from now on this member's own chunk sums
    /// are off by one in a value — formed, sent and applied alike, so only the fingerprints can
    /// find them.
    pub fn play_wrong_owner(&mut self) {
        self.audits.prints.wrong_owner = true;
    }

    /// Fault injection (`{"cmd":"false-fingerprints"}`): from now on this member's fingerprint
    /// of the first chunk it sends is off by one — an honest owner's sum fails every member's
    /// check, and the leader's recomputation must name this member, not the owner.
    pub fn play_false_fingerprints(&mut self) {
        self.audits.prints.false_prints = true;
    }

    /// Fault injection (`{"cmd":"withhold-fingerprints"}`): from now on this member sends no
    /// fingerprints and refuses every request for them — the leader must compute them itself.
    pub fn play_withheld_fingerprints(&mut self) {
        self.audits.prints.withhold_prints = true;
    }

    /// A committed record is being applied (before the next step's owners are taken from it):
    /// a step summed from owners' sums is kept to be checked, the step before it gets its
    /// challenges — this member's fingerprints go out and its checks run — and steps too old
    /// to check any more go, counted where unchecked.
    pub(super) fn fingerprint_after(&mut self, record: &StepRecord) {
        if !self.owners_run() {
            return;
        }
        let step = record.step;
        if let Some(owners) = self.owners_of(step).filter(|_| !record.contributions.is_empty()) {
            let checking = Checking {
                record: record.clone(),
                owners,
                seed: None,
                prints: BTreeMap::new(),
                failed: BTreeSet::new(),
                checked: false,
                asked: false,
                recomputing: BTreeSet::new(),
                recomputing_since: None,
            };
            self.audits.prints.steps.insert(step, checking);
        }
        if let Some(before) = step.checked_sub(1).filter(|s| self.audits.prints.steps.contains_key(s)) {
            let seed = record.digest();
            let checking = self.audits.prints.steps.get_mut(&before).expect("held");
            checking.seed = Some(seed);
            checking.prints.retain(|_, (drawn, _)| *drawn == seed);
            self.send_prints(before, seed);
            self.check_prints(before);
        }
        self.ask_prints_again(step);
        let len = self.contributions.len();
        let stats = &mut self.audits.stats;
        self.audits.prints.steps.retain(|s, c| {
            let kept = s + RETAINED_STEPS > step;
            if !kept && !c.checked {
                let n = c.owners.len();
                stats.sums_unchecked += (0..n).filter(|&k| !chunk(len, n, k).is_empty()).count() as u32;
            }
            kept
        });
    }

    /// This member's fingerprints of its own contribution to `step`, one for each chunk sum it
    /// applied, under `seed`: to every member, and held here.
    fn send_prints(&mut self, step: u32, seed: u64) {
        let me = self.config.me;
        let Some(checking) = self.audits.prints.steps.get(&step) else { return };
        let Some(index) = checking.record.contributions.iter().position(|c| c.peer == me) else { return };
        let (digest, n, len) = (checking.record.digest(), checking.owners.len(), self.contributions.len());
        let mut prints = Vec::with_capacity(n);
        for c in 0..n {
            if chunk(len, n, c).is_empty() {
                prints.push(0);
                continue;
            }
            let sum = self.contributions.read_sum(step, digest, c as u16);
            match sum.and_then(|sum| self.contributions.fingerprint(step, me, index, sum, seed)) {
                Some(print) => prints.push(print),
                None => return, // not applied from these sums here, or ours no longer held
            }
        }
        if self.audits.prints.false_prints {
            if let Some(first) = prints.iter_mut().find(|p| **p != 0) {
                *first = (*first + 1) % crate::sync::owners::FINGERPRINT_PRIME;
            }
        }
        let message = Message::Fingerprints { step, record: digest, seed, prints: prints.clone() };
        let targets = if self.audits.prints.withhold_prints { Vec::new() } else { self.taking_part(step) };
        for to in targets {
            self.send(to, message.clone());
        }
        let checking = self.audits.prints.steps.get_mut(&step).expect("held");
        checking.prints.insert(me, (seed, prints));
    }

    /// Once a step later than their challenges (`step` is being applied), the fingerprints still
    /// missing of every step not checked are asked for again, once, of their contributors (a
    /// link lost them; one whose author is gone stays unchecked). A step after that, the leader
    /// computes those still missing itself ([`Session::recompute_prints`]).
    fn ask_prints_again(&mut self, step: u32) {
        let me = self.config.me;
        let mut asks = Vec::new();
        let mut recompute = Vec::new();
        for (&s, checking) in self.audits.prints.steps.iter_mut() {
            if s + 3 <= step && checking.asked && !checking.checked && checking.recomputing_since.is_none() {
                recompute.push(s);
            }
            if s + 2 > step || checking.checked || checking.asked || checking.seed.is_none() {
                continue;
            }
            checking.asked = true;
            let record = checking.record.digest();
            for named in &checking.record.contributions {
                if named.peer != me && !checking.prints.contains_key(&named.peer) {
                    asks.push((named.peer, Message::FingerprintsRequest { step: s, record }));
                }
            }
        }
        for (to, message) in asks {
            if self.members.contains(&to) {
                self.send(to, message);
            }
        }
        if self.is_leader() {
            for s in recompute {
                self.recompute_prints(s);
            }
        }
    }

    /// (Leader) the contributors to `step` whose fingerprints are still missing, asked for
    /// again: their chunks not here are asked of them and of each chunk's holder, and their
    /// fingerprints computed here once the chunks are ([`Session::fill_prints`]).
    fn recompute_prints(&mut self, step: u32) {
        let me = self.config.me;
        let Some(checking) = self.audits.prints.steps.get(&step) else { return };
        let missing: Vec<PeerId> = checking
            .record
            .contributions
            .iter()
            .map(|n| n.peer)
            .filter(|p| *p != me && !checking.prints.contains_key(p))
            .collect();
        let owners = checking.owners.clone();
        for &author in &missing {
            for c in 0..owners.len() {
                let pieces = owned_pieces(owners.len(), c);
                if !pieces.is_empty() && !self.contributions.holds_part(step, author, pieces) {
                    self.ask_chunk_of(step, author, &owners, c);
                }
            }
        }
        let now = self.timing.now_ms();
        let checking = self.audits.prints.steps.get_mut(&step).expect("held");
        checking.recomputing = missing.into_iter().collect();
        checking.recomputing_since = Some(now);
        self.fill_prints();
    }

    /// (Leader) chunk `c` of `author`'s contribution to `step`, asked of the author (which keeps
    /// its contribution) and of the chunk's holder among `owners`, and taken from either.
    fn ask_chunk_of(&mut self, step: u32, author: PeerId, owners: &[PeerId], c: usize) {
        let pieces = owned_pieces(owners.len(), c);
        let (first, end) = (pieces.start as u8, pieces.end as u8);
        self.taking.chunks_asked.insert((step, author, first, end));
        for to in [author, Self::holder(owners, author, c)] {
            if to != self.config.me && self.members.contains(&to) {
                self.send(to, Message::ChunkRequest { step, author, first, end });
            }
        }
    }

    /// (Leader) the fingerprints it computes itself whose chunks are all here: computed, held
    /// as their contributor's, and the step checked with them; those whose chunks did not come
    /// within the wait are given up (the step stays unchecked).
    pub(super) fn fill_prints(&mut self) {
        let now = self.timing.now_ms();
        let wait = SUM_DISPUTE_WAIT_ELECTIONS * self.config.agreement.longest_election_ms();
        let steps: Vec<u32> =
            self.audits.prints.steps.iter().filter(|(_, c)| !c.recomputing.is_empty()).map(|(s, _)| *s).collect();
        for step in steps {
            let checking = &self.audits.prints.steps[&step];
            let Some(seed) = checking.seed else { continue };
            let (digest, n, len) = (checking.record.digest(), checking.owners.len(), self.contributions.len());
            let mut computed = Vec::new();
            for &author in &checking.recomputing {
                // Computed once every chunk is here (asked without copying any): a pass of the
                // session's advance must not fingerprint the chunks that came while one lacks.
                let here = (0..n).all(|c| {
                    let pieces = owned_pieces(n, c);
                    pieces.is_empty() || self.contributions.holds_part(step, author, pieces)
                });
                let index = checking.record.contributions.iter().position(|c| c.peer == author);
                let Some(index) = index.filter(|_| here) else { continue };
                let prints: Option<Vec<u64>> = (0..n)
                    .map(|c| match chunk(len, n, c).is_empty() {
                        true => Some(0),
                        false => self
                            .contributions
                            .read_sum(step, digest, c as u16)
                            .and_then(|sum| self.contributions.fingerprint(step, author, index, sum, seed)),
                    })
                    .collect();
                if let Some(prints) = prints {
                    computed.push((author, prints));
                }
            }
            let late = checking.recomputing_since.is_some_and(|since| now.saturating_sub(since) >= wait);
            let checking = self.audits.prints.steps.get_mut(&step).expect("held");
            let authors: Vec<PeerId> = computed.iter().map(|(a, _)| *a).collect();
            for (author, prints) in computed {
                checking.recomputing.remove(&author);
                checking.prints.entry(author).or_insert((seed, prints));
            }
            if late {
                checking.recomputing.clear();
            }
            for author in authors {
                self.event(Event::PrintsRecomputed { step, author });
            }
            self.check_prints(step);
        }
    }

    /// `from` asks for this member's fingerprints of `record` of `step` again.
    pub(super) fn on_fingerprints_request(&mut self, from: PeerId, step: u32, record: u64) {
        let me = self.config.me;
        let held = self.audits.prints.steps.get(&step).filter(|c| c.record.digest() == record);
        let held = held.filter(|_| !self.audits.prints.withhold_prints);
        match held.and_then(|c| c.prints.get(&me).map(|(seed, prints)| (*seed, prints.clone()))) {
            Some((seed, prints)) => self.send(from, Message::Fingerprints { step, record, seed, prints }),
            None => self.ignore(from, Ignored::FingerprintsRefused { step }),
        }
    }

    /// `from`'s fingerprints of its contribution to `step`.
    pub(super) fn on_fingerprints(&mut self, from: PeerId, step: u32, record: u64, seed: u64, prints: Vec<u64>) {
        if !self.owners_run() {
            return self.ignore(from, Ignored::NotOwners);
        }
        let taken = self.audits.prints.steps.get_mut(&step).is_some_and(|c| {
            let fits = c.record.digest() == record
                && c.record.contributions.iter().any(|n| n.peer == from)
                && prints.len() == c.owners.len()
                && c.seed.is_none_or(|s| s == seed)
                && !c.prints.contains_key(&from);
            if fits {
                c.prints.insert(from, (seed, prints));
            }
            fits
        });
        if !taken {
            return self.ignore(from, Ignored::FingerprintsRefused { step });
        }
        self.check_prints(step);
    }

    /// Checks every chunk sum of `step` once its challenges are drawn and every contributor's
    /// fingerprints are here; a failed check accuses the chunk's owner.
    fn check_prints(&mut self, step: u32) {
        let Some(checking) = self.audits.prints.steps.get(&step) else { return };
        let Some(seed) = checking.seed.filter(|_| !checking.checked) else { return };
        let complete = checking.record.contributions.iter().all(|n| checking.prints.contains_key(&n.peer));
        if !complete {
            return;
        }
        let (digest, n, len) = (checking.record.digest(), checking.owners.len(), self.contributions.len());
        let mut failed = BTreeSet::new();
        let (mut right, mut unchecked) = (0, 0);
        for c in 0..n {
            if chunk(len, n, c).is_empty() {
                continue;
            }
            let Some(sum) = self.contributions.read_sum(step, digest, c as u16) else {
                unchecked += 1;
                continue;
            };
            let parts: Vec<(u64, u32)> = checking
                .record
                .contributions
                .iter()
                .map(|named| (checking.prints[&named.peer].1[c], named.weight))
                .collect();
            if sum_checks(sum, &parts, seed) {
                right += 1;
            } else {
                failed.insert(c as u16);
            }
        }
        let owners = checking.owners.clone();
        let stats = &mut self.audits.stats;
        stats.sums_checked += right;
        stats.sums_unchecked += unchecked;
        stats.sums_failed += failed.len() as u32;
        let checking = self.audits.prints.steps.get_mut(&step).expect("held");
        checking.checked = true;
        checking.failed = failed.clone();
        for c in failed {
            let owner = owners[usize::from(c)];
            self.event(Event::SumCheckFailed { step, chunk: c, owner });
            self.accuse(step, owner, None, Evidence::SumCheck { chunk: c });
        }
    }

    /// `from` accuses `owner`'s sum of `chunk` of `step` (its fingerprints' check failed): the
    /// leader settles it; the leader's own sum, each member by its own check.
    pub(super) fn on_sum_accusation(&mut self, from: PeerId, step: u32, owner: PeerId, chunk: u16) {
        let evidence = Evidence::SumCheck { chunk };
        if self.is_leader() {
            self.event(Event::Accused { step, target: owner, by: from, evidence });
            self.dispute_sum(step, chunk, from);
        } else if self.leader() == Some(owner) {
            self.event(Event::Accused { step, target: owner, by: from, evidence });
            if self.audits.prints.failed_here(step, chunk) {
                let me = self.config.me;
                self.shun(AuditVerdict { step, target: owner, found_by: me, evidence });
            }
        } else {
            self.ignore(from, Ignored::AccusationToNonLeader);
        }
    }

    /// (Leader) `chunk` of `step` is disputed (`found_by` found its check failed): its
    /// authors' pieces not here are asked of them and of the chunk's owner, and the sum is
    /// recomputed once they are here ([`Session::settle_sums`]).
    pub(super) fn dispute_sum(&mut self, step: u32, chunk_index: u16, found_by: PeerId) {
        let prints = &self.audits.prints;
        let Some(checking) = prints.steps.get(&step) else { return };
        let key = (step, chunk_index);
        let c = usize::from(chunk_index);
        if prints.disputes.contains_key(&key) || prints.disputes.len() >= DISPUTES_HELD || c >= checking.owners.len() {
            return;
        }
        let (record, owners) = (checking.record.clone(), checking.owners.clone());
        let owner = owners[c];
        let now = self.timing.now_ms();
        self.audits.prints.disputes.insert(key, (found_by, now));
        self.event(Event::Disputing { step, target: owner, evidence: Evidence::SumCheck { chunk: chunk_index } });
        let range = chunk(self.contributions.len(), owners.len(), c);
        for author in self.contributions.lacking_part(&record, range) {
            self.ask_chunk_of(step, author, &owners, c);
        }
        self.settle_sums();
    }

    /// (Leader) every disputed chunk sum whose pieces are all here is recomputed: the owner
    /// convicted where its sum departs, else a contributor whose fingerprint departs from its
    /// own chunk; one whose pieces did not come within the wait is given up. A member that no
    /// longer leads drops its disputes (their accusers' checks are the next leader's to repeat).
    pub(super) fn settle_sums(&mut self) {
        if self.audits.prints.disputes.is_empty() {
            return;
        }
        if !self.is_leader() {
            return self.audits.prints.disputes.clear();
        }
        let now = self.timing.now_ms();
        let wait = SUM_DISPUTE_WAIT_ELECTIONS * self.config.agreement.longest_election_ms();
        let disputes: Vec<((u32, u16), (PeerId, u64))> =
            self.audits.prints.disputes.iter().map(|(k, v)| (*k, *v)).collect();
        for ((step, c), (found_by, since)) in disputes {
            let contributions = &self.contributions;
            // Whether every piece of the chunk is here (asked without copying any), and whose.
            let ready = self.audits.prints.steps.get(&step).map(|checking| {
                let range = chunk(contributions.len(), checking.owners.len(), usize::from(c));
                let here = checking.seed.is_some() && contributions.lacking_part(&checking.record, range).is_empty();
                (here, checking.owners[usize::from(c)])
            });
            let owner = match ready {
                None => {
                    self.audits.prints.disputes.remove(&(step, c));
                    continue;
                }
                Some((false, owner)) => {
                    if now.saturating_sub(since) >= wait {
                        self.audits.prints.disputes.remove(&(step, c));
                        self.event(Event::SumUnsettled { step, chunk: c, owner });
                    }
                    continue;
                }
                Some((true, owner)) => owner,
            };
            self.audits.prints.disputes.remove(&(step, c));
            let checking = self.audits.prints.steps[&step].clone();
            let range = chunk(self.contributions.len(), checking.owners.len(), usize::from(c));
            let digest = checking.record.digest();
            let truth = self.contributions.chunk_sum(&checking.record, range);
            let claimed = self.contributions.read_sum(step, digest, c).cloned();
            let (Some(truth), Some(claimed), Some(seed)) = (truth, claimed, checking.seed) else {
                // Every piece is here; a sum not applied from owners' sums here is not settled.
                self.event(Event::SumUnsettled { step, chunk: c, owner });
                continue;
            };
            if let Some((word, expected, claimed)) = first_difference(&truth, &claimed) {
                let evidence = Evidence::SumWrong { chunk: c, word, expected, claimed };
                self.convict(AuditVerdict { step, target: owner, found_by, evidence });
                continue;
            }
            let mut liars = Vec::new();
            for (index, named) in checking.record.contributions.iter().enumerate() {
                let Some((_, prints)) = checking.prints.get(&named.peer) else { continue };
                let expected = self.contributions.fingerprint(step, named.peer, index, &truth, seed);
                let claimed = prints[usize::from(c)];
                if let Some(expected) = expected.filter(|e| *e != claimed) {
                    liars.push((named.peer, Evidence::Fingerprint { chunk: c, expected, claimed }));
                }
            }
            if liars.is_empty() {
                self.event(Event::SumSettled { step, chunk: c, owner });
            }
            for (liar, evidence) in liars {
                self.convict(AuditVerdict { step, target: liar, found_by, evidence });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(grid: Vec<u8>, by: Vec<u8>, sum: Vec<i64>) -> ChunkSum {
        ChunkSum { start: 0, grid, by, sum }
    }

    #[test]
    fn the_first_difference_is_named_by_its_word() {
        let right = sum(vec![120, 121], vec![0, 2], vec![5, -3, 0, 7]);
        assert_eq!(first_difference(&right, &right.clone()), None);
        let mut grid = right.clone();
        grid.grid[1] = 122;
        assert_eq!(first_difference(&right, &grid), Some((1, 121, 122)));
        let mut by = right.clone();
        by.by[0] = 1;
        assert_eq!(first_difference(&right, &by), Some((2, 0, 1)));
        let mut value = right.clone();
        value.sum[3] = 6;
        assert_eq!(first_difference(&right, &value), Some((7, 7, 6)));
        let mut shorter = right.clone();
        shorter.sum.pop();
        assert_eq!(first_difference(&right, &shorter), Some((7, 7, 0)));
    }
}
