//! Who is in the run, as the leader decides it through the log's configuration changes: who
//! computes (peer info), who learns, who votes, who is waited for, who is out.
//!
//! - A member whose peer info says it can compute joins the configuration as a **learner**: it
//!   follows the log and contributes once resumed, but nobody waits for it. At the run's start
//!   (no step committed yet) every member is waited for from the first step. Only a member
//!   whose contribution reached the leader in time at least once ever votes.
//! - A member is **waited for** (`Standing::Expected`) or not (`Standing::Backoff`). One not
//!   waited for whose contributions reach the leader within the step deadline for
//!   [`Standing::needed`] steps in a row (summed or, arriving after the record was proposed,
//!   not) is waited for again and **votes** (`Change::Voter`). A member waited for that misses
//!   a step's deadline is not waited for from then on, and needs more steps in a row to come
//!   back each time it misses again (1, 4, 8, … 128): one lazy member costs the group one
//!   deadline, not one a step, and a slower one is not shut out by being second.
//!   It stops voting (`Change::Learner`) where [`MIN_VOTERS`] voters remain without it. A
//!   leader can find itself demoted — its predecessor's demotion of it committed under it,
//!   which raft-rs lets lead on — and votes again by the next change.
//! - A member that says it is leaving, that a person forgets or kicks, or whose link has been
//!   closed for [`GONE_MS`] leaves the configuration (`Change::Remove`); kicked ones stay out.
//! - A member whose peer info says it cannot compute is an **observer**: never in the
//!   configuration (one that says so once in it — its backend refused at the run's shapes —
//!   leaves it); the leader tells it the run and sends it one resume, so it can watch.
//!
//! One configuration change is under way at a time (Raft's rule); removals go first, then the
//! leader's own vote, demotions, additions, promotions.

use std::collections::{BTreeMap, BTreeSet};

use super::agreement::{Agreement, Change};
use super::events::DropReason;
use crate::wire::{PeerId, Removal};

/// Voters a group keeps where it has as many members: below three a majority is everyone, and
/// one member asleep would stop the group.
pub const MIN_VOTERS: usize = 3;
/// A learner whose link has been closed this long leaves the configuration (it joins again,
/// as a new learner, if it comes back).
pub const GONE_MS: u64 = 60_000;
/// A peer that has not said what computes on it this long after its link opened is told the
/// run as an observer (a Lockstep node says so at once, `-9`).
pub const SILENT_PEER_MS: u64 = 2_000;
/// The first wait between two resumes of one member, and the longest (each doubles it).
const RESUME_FIRST_MS: u64 = 1_000;
const RESUME_MAX_MS: u64 = 300_000;

/// Whether the leader waits for a member's contributions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    Expected,
    /// Not waited for: its contribution is summed when it is there before the record; after
    /// [`Standing::needed`]`(misses)` steps in a row whose contribution came within the
    /// deadline (`kept`, the last of them `last`), it is waited for again.
    Backoff {
        misses: u32,
        kept: u32,
        last: Option<u32>,
    },
}

impl Standing {
    /// Steps in a row a member that missed `misses` deadlines must keep up for.
    pub fn needed(misses: u32) -> u32 {
        if misses == 0 {
            1
        } else {
            4 << (misses - 1).min(5)
        }
    }
}

/// A resume a member asked for, and how soon it may have the next.
#[derive(Clone, Copy, Debug)]
struct Resume {
    wanted: bool,
    next_ms: u64,
    wait_ms: u64,
}

/// The leader's view of the run's members, and what every node knows of its peers.
#[derive(Debug, Default)]
pub struct Roster {
    /// What each peer said computes on it (`-9`): true if it can.
    computes: BTreeMap<PeerId, bool>,
    /// The Raft term these standings were made in (a new leader makes its own).
    term: Option<u64>,
    standing: BTreeMap<PeerId, Standing>,
    /// Members whose contribution reached the leader within a step's deadline at least once
    /// (only they vote: one that never computes never does).
    proven: BTreeSet<PeerId>,
    /// Deadlines missed by members the leader waits for again since a resume (their next miss
    /// counts on from there).
    misses_before: BTreeMap<PeerId, u32>,
    /// Members resumed at least once (a member never proven is waited for after its first
    /// resume only).
    resumed_once: BTreeSet<PeerId>,
    kicked: BTreeMap<PeerId, Removal>,
    leaving: BTreeSet<PeerId>,
    forgotten: BTreeSet<PeerId>,
    /// When each member's link closed, and when each open one opened.
    closed_since: BTreeMap<PeerId, u64>,
    opened_at: BTreeMap<PeerId, u64>,
    resumes: BTreeMap<PeerId, Resume>,
    /// Observers told of the run.
    told: BTreeSet<PeerId>,
}

impl Roster {
    /// What `peer` said computes on it.
    pub fn peer_info(&mut self, peer: PeerId, computes: bool) {
        self.computes.insert(peer, computes);
    }

    pub fn is_observer(&self, peer: PeerId) -> bool {
        self.computes.get(&peer) == Some(&false)
    }

    pub fn connected(&mut self, peer: PeerId, now_ms: u64) {
        self.closed_since.remove(&peer);
        self.opened_at.insert(peer, now_ms);
    }

    pub fn disconnected(&mut self, peer: PeerId, now_ms: u64) {
        self.closed_since.entry(peer).or_insert(now_ms);
        self.opened_at.remove(&peer);
        self.told.remove(&peer);
        if let Some(resume) = self.resumes.get_mut(&peer) {
            resume.wanted = false;
        }
    }

    pub fn leaving(&mut self, peer: PeerId) {
        self.leaving.insert(peer);
    }

    pub fn forget(&mut self, peer: PeerId) {
        self.forgotten.insert(peer);
    }

    pub fn kick(&mut self, peer: PeerId, why: Removal) {
        self.kicked.insert(peer, why);
    }

    /// Whether `peer` is out of the run for good (kicked, or convicted by an audit).
    pub fn is_out(&self, peer: PeerId) -> bool {
        self.kicked.contains_key(&peer)
    }

    /// A new run: the members stay, what was decided about them goes (kicks included: they
    /// were for the old run).
    pub fn new_run(&mut self) {
        self.term = None;
        self.standing.clear();
        self.proven.clear();
        self.misses_before.clear();
        self.resumed_once.clear();
        self.kicked.clear();
        self.leaving.clear();
        self.forgotten.clear();
        self.resumes.clear();
        self.told.clear();
    }

    /// (Leader) the standings for term `term`: kept if made in it, else made afresh — voters
    /// waited for, learners not (at the run's start, `starting`, everyone is). A member the
    /// configuration gained since they were made — a change the last leader proposed, applied
    /// after this term began — stands as one that joined now: without a standing, its first
    /// resume would not make it waited for ([`Roster::resumes_due`]), and in a group whose steps
    /// are faster than a resume's trip it would be resumed, behind, forever (chaos seed 2115).
    pub fn lead(&mut self, term: u64, voters: &[PeerId], learners: &[PeerId], starting: bool) {
        if self.term != Some(term) {
            self.term = Some(term);
            self.standing.clear();
        }
        for &p in voters {
            self.standing.entry(p).or_insert(Standing::Expected);
        }
        for &p in learners {
            self.standing.entry(p).or_insert_with(|| Roster::joining(starting));
        }
    }

    /// How a member that joins the configuration stands: waited for at the run's start, not
    /// before it kept up once later.
    fn joining(starting: bool) -> Standing {
        if starting {
            Standing::Expected
        } else {
            Standing::Backoff { misses: 0, kept: 0, last: None }
        }
    }

    /// (Leader) whether the leader waits for `peer`.
    pub fn expected(&self, peer: PeerId) -> bool {
        self.standing.get(&peer) == Some(&Standing::Expected)
    }

    /// (Leader) `peer`, waited for, missed a step: how many steps in a row bring it back.
    pub fn missed(&mut self, peer: PeerId) -> u32 {
        let misses = match self.standing.get(&peer) {
            Some(Standing::Backoff { misses, .. }) => misses + 1,
            _ => self.misses_before.remove(&peer).unwrap_or(0) + 1,
        };
        self.standing.insert(peer, Standing::Backoff { misses, kept: 0, last: None });
        Standing::needed(misses)
    }

    /// (Leader) `peer`'s contribution to `step` arrived, within the step's deadline or not.
    /// Returns the steps in a row it kept up for when that makes it waited for again.
    pub fn arrived(&mut self, peer: PeerId, step: u32, in_time: bool) -> Option<u32> {
        if in_time {
            self.proven.insert(peer);
            if self.expected(peer) {
                // Keeping up: its next resume, if it ever needs one, comes at once.
                self.resumes.remove(&peer);
                self.misses_before.remove(&peer);
            }
        }
        let Some(Standing::Backoff { misses, kept, last }) = self.standing.get_mut(&peer) else { return None };
        if last.is_some_and(|l| l >= step) {
            return None; // counted already
        }
        *kept = match (in_time, *last) {
            (false, _) => 0,
            (true, Some(l)) if l + 1 == step => *kept + 1,
            (true, _) => 1,
        };
        *last = Some(step);
        if *kept < Standing::needed(*misses) {
            return None;
        }
        let steps = *kept;
        self.standing.insert(peer, Standing::Expected);
        self.resumes.remove(&peer);
        Some(steps)
    }

    /// (Leader) members that can compute, connected, not yet in the configuration (nor kept
    /// out of it).
    pub fn unjoined(&self, agreement: &Agreement, me: PeerId, connected: &BTreeSet<PeerId>) -> bool {
        connected.iter().any(|p| {
            *p != me
                && self.computes.get(p) == Some(&true)
                && !agreement.is_member(*p)
                && !self.kicked.contains_key(p)
                && !self.leaving.contains(p)
                && !self.forgotten.contains(p)
        })
    }

    /// (Leader) the next configuration change, with why a member leaves it (none for
    /// additions, promotions and demotions); none while one is under way.
    pub fn next_change(
        &mut self,
        agreement: &Agreement,
        me: PeerId,
        connected: &BTreeSet<PeerId>,
        now_ms: u64,
        starting: bool,
    ) -> Option<(Change, Option<DropReason>)> {
        if agreement.changing() {
            return None;
        }
        let (voters, learners) = agreement.members();
        let members = voters.iter().chain(&learners).copied().filter(|p| *p != me);
        for peer in members.clone() {
            if let Some(why) = self.kicked.get(&peer) {
                return Some((Change::Remove(peer), Some(DropReason::Removed(why.clone()))));
            }
            if self.leaving.contains(&peer) {
                return Some((Change::Remove(peer), Some(DropReason::Left)));
            }
            if self.forgotten.contains(&peer) {
                return Some((Change::Remove(peer), Some(DropReason::Forgotten)));
            }
            if self.is_observer(peer) {
                return Some((Change::Remove(peer), Some(DropReason::CannotCompute)));
            }
        }
        for &peer in &learners {
            let closed = self.closed_since.get(&peer).map(|since| now_ms.saturating_sub(*since));
            if let Some(ms) = closed.filter(|ms| *ms >= GONE_MS) {
                return Some((Change::Remove(peer), Some(DropReason::Gone { ms })));
            }
        }
        // A leader its predecessor demoted (the demotion committed under it, which raft-rs lets
        // lead on) votes again: it keeps up by leading, and the votes would otherwise rest on
        // fewer members than the group has.
        if learners.contains(&me) {
            return Some((Change::Voter(me), None));
        }
        if voters.len() > MIN_VOTERS {
            if let Some(&peer) = voters.iter().find(|p| **p != me && !self.expected(**p)) {
                return Some((Change::Learner(peer), None));
            }
        }
        let joining = connected.iter().copied().find(|p| {
            *p != me
                && self.computes.get(p) == Some(&true)
                && !agreement.is_member(*p)
                && !self.kicked.contains_key(p)
                && !self.leaving.contains(p)
                && !self.forgotten.contains(p)
        });
        debug_assert_eq!(joining.is_some(), self.unjoined(agreement, me, connected));
        if let Some(peer) = joining {
            self.standing.insert(peer, Roster::joining(starting));
            return Some((Change::Learner(peer), None));
        }
        let promoted =
            learners.iter().copied().find(|p| connected.contains(p) && self.expected(*p) && self.proven.contains(p));
        promoted.map(|peer| (Change::Voter(peer), None))
    }

    /// `peer` asked for a resume (its weights are behind the log).
    pub fn resume_wanted(&mut self, peer: PeerId) {
        let resume = self.resumes.entry(peer).or_insert(Resume { wanted: false, next_ms: 0, wait_ms: RESUME_FIRST_MS });
        resume.wanted = true;
    }

    /// (Leader, at a step boundary) the members to resume now; each waits longer for its next.
    /// A member resumed is waited for at the next step (a deadline at most) — a group whose
    /// steps are faster than a checkpoint's trip would otherwise always be ahead of it — if its
    /// contributions ever came in time, or on its first resume: one that never computes costs
    /// the group that one deadline, not one a resume. Resumes come less and less often (1 s,
    /// doubling to 5 min) until the member keeps up.
    pub fn resumes_due(&mut self, connected: &BTreeSet<PeerId>, now_ms: u64) -> Vec<PeerId> {
        let mut due = Vec::new();
        for (peer, resume) in self.resumes.iter_mut() {
            if resume.wanted && resume.next_ms <= now_ms && connected.contains(peer) {
                resume.wanted = false;
                resume.next_ms = now_ms + resume.wait_ms;
                resume.wait_ms = (resume.wait_ms * 2).min(RESUME_MAX_MS);
                due.push(*peer);
            }
        }
        for peer in &due {
            let first = self.resumed_once.insert(*peer);
            if !first && !self.proven.contains(peer) {
                continue;
            }
            if let Some(Standing::Backoff { misses, .. }) = self.standing.get(peer) {
                self.misses_before.insert(*peer, *misses);
            }
            if self.standing.contains_key(peer) {
                self.standing.insert(*peer, Standing::Expected);
            }
        }
        due
    }

    /// (Leader) whether a resume or an observer is waiting for a step boundary to be served at
    /// ([`Roster::resumes_due`], [`Roster::observers_to_tell`], without taking them).
    pub fn serving_due(&self, connected: &BTreeSet<PeerId>, now_ms: u64) -> bool {
        let resume = self.resumes.iter().any(|(p, r)| r.wanted && r.next_ms <= now_ms && connected.contains(p));
        let silent = |p: &PeerId| {
            !self.computes.contains_key(p)
                && self.opened_at.get(p).is_some_and(|at| now_ms.saturating_sub(*at) >= SILENT_PEER_MS)
        };
        resume || connected.iter().any(|p| (self.is_observer(*p) || silent(p)) && !self.told.contains(p))
    }

    /// (Leader) observers not yet told of the run: peers whose peer info says they cannot
    /// compute, and peers that said nothing for [`SILENT_PEER_MS`] (a browser page speaking only
    /// the handshake).
    pub fn observers_to_tell(&mut self, connected: &BTreeSet<PeerId>, now_ms: u64) -> Vec<PeerId> {
        let silent = |p: &PeerId| {
            !self.computes.contains_key(p)
                && self.opened_at.get(p).is_some_and(|at| now_ms.saturating_sub(*at) >= SILENT_PEER_MS)
        };
        let new: Vec<PeerId> = connected
            .iter()
            .copied()
            .filter(|p| (self.is_observer(*p) || silent(p)) && !self.told.contains(p))
            .collect();
        self.told.extend(&new);
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_miss_asks_for_more_records_in_a_row() {
        assert_eq!((0..8).map(Standing::needed).collect::<Vec<_>>(), vec![1, 4, 8, 16, 32, 64, 128, 128]);
        let mut roster = Roster::default();
        roster.lead(1, &[1, 2], &[3], false);
        assert!(roster.expected(2) && !roster.expected(3));
        assert_eq!(roster.arrived(3, 7, false), None, "late");
        assert_eq!(roster.arrived(3, 8, true), Some(1), "a learner in time once is waited for");
        assert_eq!(roster.arrived(3, 9, true), None, "waited for already");
        assert_eq!(roster.missed(2), 4);
        assert_eq!(roster.arrived(2, 10, true), None);
        assert_eq!(roster.arrived(2, 10, true), None, "once a step");
        assert_eq!(roster.arrived(2, 12, true), None, "a step without it starts the count again");
        assert_eq!(roster.arrived(2, 13, true), None);
        assert_eq!(roster.arrived(2, 14, false), None, "late starts it again too");
        for step in 15..18 {
            assert_eq!(roster.arrived(2, step, true), None);
        }
        assert_eq!(roster.arrived(2, 18, true), Some(4));
        // A new term's leader makes its own standings.
        roster.lead(2, &[1], &[2, 3], false);
        assert!(roster.expected(1) && !roster.expected(2));
    }

    #[test]
    fn resumes_wait_longer_each_time() {
        let mut roster = Roster::default();
        let connected: BTreeSet<PeerId> = [2].into();
        roster.resume_wanted(2);
        assert_eq!(roster.resumes_due(&connected, 0), vec![2]);
        roster.resume_wanted(2);
        assert_eq!(roster.resumes_due(&connected, 500), Vec::<PeerId>::new());
        assert_eq!(roster.resumes_due(&connected, 1000), vec![2]);
        roster.resume_wanted(2);
        assert_eq!(roster.resumes_due(&connected, 2500), Vec::<PeerId>::new());
        assert_eq!(roster.resumes_due(&connected, 3000), vec![2]);
    }

    /// A learner the configuration gained after this term's standings were made (the last
    /// leader's change, applied late) stands as a joiner: not waited for, until its first
    /// resume makes it so — as a learner this leader added would.
    #[test]
    fn a_learner_added_under_the_last_leader_is_waited_for_after_its_first_resume() {
        let mut roster = Roster::default();
        roster.lead(2, &[1, 2], &[], false);
        roster.missed(2);
        roster.lead(2, &[1, 2], &[3], false);
        assert!(!roster.expected(3), "a joiner is not waited for");
        assert!(!roster.expected(2), "a standing made in this term is kept");
        let connected: BTreeSet<PeerId> = [3].into();
        roster.resume_wanted(3);
        assert_eq!(roster.resumes_due(&connected, 0), vec![3]);
        assert!(roster.expected(3), "waited for at the step after its first resume");
    }
}
