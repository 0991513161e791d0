//! The leader's work: the configuration it changes, the resumes and observers it serves at step
//! boundaries, the records it proposes, the lead it hands over.

use super::*;

/// (Leader) what the leader keeps between its proposals.
#[derive(Debug, Default)]
pub(super) struct Lead {
    /// The step proposed in a term.
    pub proposed: Option<(u64, u32)>,
    /// Each recent step's deadline: when its members' contributions are due.
    pub due: VecDeque<(u32, u64)>,
    /// When it last asked late members again for their contribution to a step.
    pub late_asked: Option<(u32, u64)>,
    /// A push proposed and not yet restored (its digest): nothing else is proposed.
    pub pushing: Option<u64>,
}

/// Steps whose deadlines the leader keeps.
const DUE_KEPT: usize = 8;

impl Lead {
    /// Contributions to `step` are due at `due_ms` (the few most recent steps are kept).
    pub fn expect(&mut self, step: u32, due_ms: u64) {
        self.due.push_back((step, due_ms));
        while self.due.len() > DUE_KEPT {
            self.due.pop_front();
        }
    }

    /// Whether a contribution to `step` arriving at `now_ms` came within its deadline (one
    /// whose deadline is not kept counts as in time).
    pub fn in_time(&self, step: u32, now_ms: u64) -> bool {
        self.due.iter().find(|(s, _)| *s == step).is_none_or(|(_, due)| now_ms <= *due)
    }

    /// Whether to ask the late members of `step` again now, `waited_ms` after our own
    /// contribution was ready: once a repair interval (`after_ms`) has passed, and then once
    /// an interval; true marks it asked.
    pub fn ask_late(&mut self, step: u32, now_ms: u64, waited_ms: u64, after_ms: u64) -> bool {
        let asked_recently = self.late_asked.is_some_and(|(s, t)| s == step && now_ms.saturating_sub(t) < after_ms);
        if waited_ms < after_ms || asked_recently {
            return false;
        }
        self.late_asked = Some((step, now_ms));
        true
    }
}

impl Session {
    /// The leader's work: the configuration, resumes at boundaries, the next record.
    pub(super) fn lead(&mut self) {
        let me = self.config.me;
        let now = self.timing.now_ms();
        let Some(agreement) = self.agreement.as_mut().filter(|a| a.is_leader()) else { return };
        if self.stopped.is_some() || self.quitting {
            return;
        }
        let starting = agreement.state().is_some_and(|s| s.step == 0 && s.epoch == Epoch::default());
        let (voters, learners) = agreement.members();
        self.roster.lead(agreement.term(), &voters, &learners, starting);
        if !agreement.leads_with_a_committed_term() {
            return;
        }
        if let Some((change, why)) = self.roster.next_change(agreement, me, &self.members, now, starting) {
            match agreement.change(change) {
                Ok(true) => {
                    if let (Change::Remove(peer), Some(why)) = (change, why) {
                        self.event(Event::Dropped { peer, step: self.taking.applied, why });
                    }
                }
                Ok(false) => {}
                Err(e) => return self.stop(Stop::Agreement(e)),
            }
        }
        self.serve_at_boundary();
        self.propose();
    }

    /// Whether the replica's state is the group's at the last applied step, as a checkpoint
    /// must be: not computing the next step, or — one step a sync, whose compute leaves the
    /// weights as they were — done computing it. (In `outer:H` a compute moves the weights
    /// through its window — also one computed behind a commit, once that step stands — and
    /// with an overlap runs ahead: only the next apply is a boundary.)
    fn at_boundary(&self) -> bool {
        let one_step = self.run.is_some_and(|r| r.sync.mode.steps_per_sync() == 1);
        self.finished
            || self.computing.asked.is_none_or(|a| a.step != self.taking.applied + 1 || (one_step && a.ready.is_some()))
    }

    /// (Leader, weights at a step boundary) resumes asked for and observers not yet told.
    pub(super) fn serve_at_boundary(&mut self) {
        if !self.is_leader() || !self.current() && !self.finished || self.pending.is_some() || !self.at_boundary() {
            return;
        }
        let now = self.timing.now_ms();
        for peer in self.roster.resumes_due(&self.members, now) {
            self.out.push(Output::SendSnapshot { to: peer });
        }
        let Some(run) = self.run else { return };
        let run_id = self.agreement.as_ref().map_or(0, Agreement::run);
        for peer in self.roster.observers_to_tell(&self.members, now) {
            self.send(peer, Message::RunConfig { protocol: MESH_PROTOCOL_VERSION, run_id, run });
            self.out.push(Output::SendSnapshot { to: peer });
        }
    }

    /// (Leader) proposes the next step's record once the members it waits for contributed, or
    /// the deadline passed.
    pub(super) fn propose(&mut self) {
        let me = self.config.me;
        let now = self.timing.now_ms();
        let Some(run) = self.run else { return };
        let step = self.taking.applied + 1;
        if step > run.syncs() || self.lead.pushing.is_some() || !self.current() || self.pending.is_some() {
            return;
        }
        // Our own weights are being checked against the definition, or who agrees with whom is
        // not counted yet (the guard's disputes): a record now could name weights that depart.
        if self.audits.apart.undecided() {
            return;
        }
        let Some(agreement) = self.agreement.as_ref() else { return };
        let term = agreement.term();
        if self.lead.proposed == Some((term, step)) {
            return;
        }
        let Some(Asked { ready: Some((ready_ms, compute_ms)), .. }) = self.computing.asked.filter(|a| a.step == step)
        else {
            return;
        };
        let Some(own) = self.contributions.get(step, me).map(|h| h.header.whash) else { return };
        let (voters, learners) = agreement.members();
        let waited = now.saturating_sub(ready_ms);
        let deadline = self.timing.deadline_ms(self.config.deadline, compute_ms);
        let present: Vec<(PeerId, Named)> = self
            .contributions
            .at(step)
            .filter(|(p, held)| {
                // Only contributions from our weights with a healthy probe (the guard's disputes
                // settle the others; a new leader's held ones are filtered here too) — with chunk
                // owners, only those whose every chunk another member holds.
                let guarded = held.header.whash == own && held.header.phash == self.config.expected_phash;
                (*p == me
                    || guarded
                        && agreement.is_member(*p)
                        && !self.roster.is_out(*p)
                        && !self.audits.disputed(*p)
                        && !self.audits.convicted.contains(p))
                    && self.held_twice(step, *p)
            })
            .map(|(peer, held)| (peer, Named { peer, digest: held.digest, weight: held.header.weight }))
            .collect();
        let has = |p: &PeerId| present.iter().any(|(q, _)| q == p);
        let late: Vec<PeerId> = voters
            .iter()
            .chain(&learners)
            .copied()
            .filter(|p| {
                *p != me
                    && self.roster.expected(*p)
                    && !has(p)
                    && !self.roster.is_out(*p)
                    && !self.audits.disputed(*p)
                    && !self.audits.convicted.contains(p)
            })
            .collect();
        if present.is_empty() {
            // Chunk owners: not even ours is held twice yet (or ours never will be: a holder of
            // it is gone); the holders are nudged, and past the deadline the leader asks the
            // late for their headers and fetches the pieces itself.
            let late = if waited >= deadline { &late[..] } else { &[] };
            return self.ask_late(step, late, waited, deadline);
        }
        // At the run's start every member that can compute is in the first step (once the
        // configuration has it), unless the deadline passes first.
        let starting = agreement.state().is_some_and(|s| s.step == 0 && s.epoch == Epoch::default());
        let joining = starting && self.roster.unjoined(agreement, me, &self.members);
        // Chunk owners: our own contribution waits, as the others', for its chunks held twice
        // (with a holder of ours gone, it is never named: `own_held_once`).
        let own_awaited = !has(&me) && !self.own_held_once(step);
        if (!late.is_empty() || joining || own_awaited) && waited < deadline {
            self.ask_late(step, &late, waited, deadline);
            return;
        }
        if has(&me) {
            self.send_own_to_the_rest(step);
        }
        // (Every contribution here passed the guard as it came: `guard_held`.)
        let record = StepRecord { step, whash: own, contributions: present.iter().map(|(_, n)| *n).collect() };
        match self.agreement.as_mut().map(|a| a.propose(&LogEntry::Step(record))) {
            Some(Ok(true)) => {}
            Some(Ok(false)) | None => return,
            Some(Err(e)) => return self.stop(Stop::Agreement(e)),
        }
        self.lead.proposed = Some((term, step));
        if late.is_empty() {
            self.timing.waited(waited);
        }
        for peer in late {
            let backoff = self.roster.missed(peer);
            self.event(Event::Dropped { peer, step, why: DropReason::Deadline { deadline_ms: deadline, backoff } });
        }
        // Elastic windows' slow-member rule, at this boundary.
        for peer in self.window.too_slow(self.config.slow_windows, me) {
            self.window.forget(peer);
            self.remove_for_good(peer, Removal::Slow { windows: self.config.slow_windows });
        }
    }

    /// (Leader) members it waits for whose contribution is not here after a repair interval are
    /// asked for it (it may have been lost with a link that closed), once per interval.
    pub(super) fn ask_late(&mut self, step: u32, late: &[PeerId], waited: u64, deadline: u64) {
        let now = self.timing.now_ms();
        if !self.lead.ask_late(step, now, waited, self.config.repair_after_ms) {
            return;
        }
        let reachable: Vec<PeerId> = late.iter().copied().filter(|p| self.members.contains(p)).collect();
        for peer in reachable {
            self.send(peer, Message::RepairRequest { step, peer });
        }
        self.nudge_holders(step, waited >= deadline);
    }

    /// (Leader) `peer` is out of the run for good: told why, then taken out of the
    /// configuration.
    pub(super) fn remove_for_good(&mut self, peer: PeerId, why: Removal) {
        self.roster.kick(peer, why.clone());
        if self.members.contains(&peer) {
            self.send(peer, Message::Removed { step: self.taking.applied, why });
        }
    }

    pub(super) fn on_kick(&mut self, peer: PeerId, why: String) {
        if !self.is_leader() || self.run.is_none() {
            let leader = self.leader();
            self.event(Event::Problem(Problem::NotLeader { action: LeaderAction::Kick, leader }));
        } else if peer == self.config.me {
            self.event(Event::Problem(Problem::KickSelf));
        } else {
            self.remove_for_good(peer, Removal::Kicked(why));
        }
    }

    pub(super) fn on_push(&mut self, bytes: Vec<u8>) {
        if self.pending.is_some() || self.lead.pushing.is_some() {
            self.event(Event::Problem(Problem::Busy));
            return;
        }
        if self.run.is_none() {
            // No run: this node's state only.
            let epoch = Epoch { count: self.epochs.mine().count + 1, pusher: self.config.me };
            self.pending = Some(Pending::Push { from: self.config.me, epoch });
            self.out.push(Output::Restore { bytes });
            return;
        }
        if !self.is_leader() {
            let leader = self.leader();
            self.event(Event::Problem(Problem::NotLeader { action: LeaderAction::Push, leader }));
            return;
        }
        let digest = lockstep_luts::hash::fnv1a64(&bytes);
        let epoch = Epoch { count: self.epochs.mine().count + 1, pusher: self.config.me };
        match self.agreement.as_mut().map(|a| a.propose(&LogEntry::Push { epoch, digest })) {
            Some(Ok(true)) => {}
            Some(Err(e)) => return self.stop(Stop::Agreement(e)),
            _ => {
                let leader = self.leader();
                self.event(Event::Problem(Problem::NotLeader { action: LeaderAction::Push, leader }));
                return;
            }
        }
        self.lead.pushing = Some(digest);
        self.broadcast(&Message::CheckpointPush(bytes.clone()));
        self.taking.push_bytes = Some((digest, bytes, self.config.me));
    }

    /// (Leader) hands the lead to the most caught-up voter it reaches, if any.
    pub(super) fn hand_over_lead(&mut self) {
        let me = self.config.me;
        let members = self.members.clone();
        let Some(agreement) = self.agreement.as_mut().filter(|a| a.is_leader()) else { return };
        let (voters, _) = agreement.members();
        let next = voters
            .iter()
            .copied()
            .filter(|p| *p != me && members.contains(p))
            .max_by_key(|p| (agreement.has_replicated(*p, agreement.last_index()), std::cmp::Reverse(*p)));
        if let Some(next) = next {
            if let Err(e) = agreement.transfer_lead(next) {
                self.stop(Stop::Agreement(e));
            }
        }
    }

    /// (Leader) a member's contribution arrived: in time for its step's deadline, it counts
    /// toward the member being waited for again.
    pub(super) fn arrived(&mut self, from: PeerId, step: u32) {
        if !self.is_leader() {
            return;
        }
        let now = self.timing.now_ms();
        let in_time = self.lead.in_time(step, now);
        if let Some(steps) = self.roster.arrived(from, step, in_time) {
            self.event(Event::Readmitted { peer: from, steps });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contribution_is_in_time_until_its_step_is_due_and_late_members_are_asked_once_an_interval() {
        let mut lead = Lead::default();
        for step in 1..=10 {
            lead.expect(step, 1000 * u64::from(step));
        }
        assert!(lead.in_time(5, 5000) && !lead.in_time(5, 5001));
        // The first two steps' deadlines are gone: nothing says they were late.
        assert!(lead.in_time(1, u64::MAX));
        assert_eq!(lead.due.len(), DUE_KEPT);
        // Asked after a repair interval of waiting, then not again within an interval.
        assert!(!lead.ask_late(7, 100, 499, 500));
        assert!(lead.ask_late(7, 100, 500, 500));
        assert!(!lead.ask_late(7, 599, 999, 500));
        assert!(lead.ask_late(7, 600, 1000, 500));
        assert!(lead.ask_late(8, 601, 500, 500), "another step is asked for at once");
    }
}
