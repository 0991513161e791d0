//! Leaders this member found wrong (`audit.rs`: a wrong leader would never propose a verdict
//! against itself). Their Raft messages are no longer taken (`on_raft`), so this member's
//! election timer runs out and the members that found the same elect another leader, which
//! proposes the verdict. A shun that no other leader answers within [`SHUN_LAPSES_ELECTIONS`]
//! lapses: nobody confirmed the finding (a withheld state nobody else was refused, a request
//! that reached the leader late), and a member that follows nobody would wait for ever.

use std::collections::BTreeMap;

use super::*;
use crate::wire::AuditVerdict;

/// A member that shuns a leader follows it again after this many of the run's longest
/// election timeouts if no other leader took its place (nobody confirmed the finding).
pub const SHUN_LAPSES_ELECTIONS: u64 = 10;

/// The leaders shunned: each one's verdict, and since when.
#[derive(Debug, Default)]
pub(super) struct Shuns(BTreeMap<PeerId, (AuditVerdict, u64)>);

impl Shuns {
    /// Whether `peer`'s Raft messages are dropped.
    pub fn contains(&self, peer: PeerId) -> bool {
        self.0.contains_key(&peer)
    }

    /// Shuns `verdict`'s target from `now_ms`; false when it already was.
    fn insert(&mut self, verdict: AuditVerdict, now_ms: u64) -> bool {
        match self.0.entry(verdict.target) {
            std::collections::btree_map::Entry::Occupied(_) => false,
            std::collections::btree_map::Entry::Vacant(entry) => {
                entry.insert((verdict, now_ms));
                true
            }
        }
    }

    /// The shuns at least `lapse_ms` old while no leader but the shunned one is known
    /// (`leader`), taken out, with how long each lasted.
    fn lapse(&mut self, now_ms: u64, lapse_ms: u64, leader: Option<PeerId>) -> Vec<(AuditVerdict, u64)> {
        let due = |(v, since): &(AuditVerdict, u64)| {
            now_ms.saturating_sub(*since) >= lapse_ms && leader.is_none_or(|l| l == v.target)
        };
        let lapsed: Vec<PeerId> = self.0.values().filter(|s| due(s)).map(|(v, _)| v.target).collect();
        lapsed
            .into_iter()
            .filter_map(|peer| self.0.remove(&peer))
            .map(|(v, since)| (v, now_ms.saturating_sub(since)))
            .collect()
    }
}

impl Session {
    /// The leader was found wrong: its Raft messages are dropped from now on, and the next
    /// leader proposes `verdict` ([`Session::propose_shunned`]).
    pub(super) fn shun(&mut self, verdict: AuditVerdict) {
        if self.audits.shunned.insert(verdict, self.timing.now_ms()) {
            self.event(Event::LeaderShunned { leader: verdict.target, step: verdict.step });
        }
    }

    /// Shuns no other leader answered in time lapse: this member follows that leader again,
    /// and says so.
    pub(super) fn lapse_shuns(&mut self, now_ms: u64) {
        let lapse_ms = SHUN_LAPSES_ELECTIONS * self.config.agreement.longest_election_ms();
        let leader = self.leader();
        for (verdict, waited_ms) in self.audits.shunned.lapse(now_ms, lapse_ms, leader) {
            self.event(Event::ShunLapsed { leader: verdict.target, step: verdict.step, waited_ms });
        }
    }

    /// Whether `from`'s Raft messages are dropped (a leader this member found wrong).
    pub(super) fn shuns(&self, from: PeerId) -> bool {
        self.audits.shunned.contains(from)
    }

    /// (A new leader) proposes the verdicts against the leaders it shunned.
    pub(super) fn propose_shunned(&mut self) {
        if self.is_leader() {
            let verdicts: Vec<AuditVerdict> = self.audits.shunned.0.values().map(|(v, _)| *v).collect();
            for verdict in verdicts {
                self.dispute_or_convict(verdict);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Evidence;

    fn verdict(target: PeerId) -> AuditVerdict {
        AuditVerdict { step: 7, target, found_by: 1, evidence: Evidence::Withheld }
    }

    #[test]
    fn a_shun_lapses_only_once_old_enough_and_while_no_other_leader_is_known() {
        let mut shuns = Shuns::default();
        assert!(shuns.insert(verdict(5), 1_000));
        assert!(!shuns.insert(verdict(5), 2_000), "shunned once");
        assert!(shuns.lapse(10_999, 10_000, Some(5)).is_empty(), "not old enough");
        assert!(shuns.lapse(20_000, 10_000, Some(6)).is_empty(), "another leader took its place");
        assert_eq!(shuns.lapse(11_000, 10_000, None), vec![(verdict(5), 10_000)]);
        assert!(!shuns.contains(5));
    }
}
