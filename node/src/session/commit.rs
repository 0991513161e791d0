//! The weights taking the log: committed entries queued in order, each step applied once its
//! record is committed and its contributions are here (repaired if not), a resume asked for when
//! they are gone.

use super::*;

use std::collections::BTreeMap;

/// Committed records whose rosters a member keeps (chunk owners: a resume's next owners).
const ROSTERS_KEPT: usize = 16;

/// The weights taking the log: how far they are, what is committed and waits for them, a step
/// taken ahead of its commit, the repairs and the resume waited for, a push's bytes.
#[derive(Debug, Default)]
pub(super) struct Taking {
    /// Steps applied: the weights are the result of `applied` updates.
    pub applied: u32,
    pub queue: VecDeque<Queued>,
    /// A step the weights took before its record committed.
    pub tentative: Option<Tentative>,
    pub repairs: Repairs,
    /// Since when this node waits for a resume, and when it last asked.
    pub catching_up: Option<(u64, u64)>,
    /// A push's bytes, held until its entry commits (their digest, and who sent them).
    pub push_bytes: Option<(u64, Vec<u8>, PeerId)>,
    /// Chunk owners: the roster of the last record applied (the next step's owners), by step.
    pub last_roster: Option<(u32, Vec<PeerId>)>,
    /// Chunk owners: the rosters of the last committed records, by step (a resume's weights
    /// take the next step's owners from them).
    pub rosters: BTreeMap<u32, Vec<PeerId>>,
    /// Chunk owners: the chunk sums waited for (`owners.rs`).
    pub sum_wait: Option<super::owners::SumWait>,
    /// Chunk owners: since when this owner waits for parts of its chunk of a committed step (or
    /// when it last asked for them).
    pub parts_asked: Option<(u32, u64)>,
    /// Chunk owners: the sums asked of anyone (step, record, owner), taken from anyone.
    pub sums_asked: std::collections::BTreeSet<(u32, u64, u16)>,
    /// Chunk owners: the pieces asked for (step, author, first, end), taken from anyone.
    pub chunks_asked: std::collections::BTreeSet<(u32, PeerId, u8, u8)>,
    /// Chunk owners: who told this member it holds which pieces (step, author, holder, first).
    pub acks: std::collections::BTreeSet<(u32, PeerId, PeerId, u8)>,
    /// Chunk owners: when this member last chased what is missing of a step before its record.
    pub chased: Option<(u32, u64)>,
    /// Chunk owners: the pieces this member told the leader it holds (step, author, first),
    /// when it last told, and how many times before (told again after 1, 2, 4, 8 repair
    /// intervals until the step is applied: a link to the leader may have been down).
    pub acked: BTreeMap<(u32, PeerId, u8), (u64, u32)>,
    /// The leader's appends held until its own contribution is here (`appends.rs`).
    pub appends: Option<super::appends::HeldAppends>,
}

/// What to do about a committed step's missing contributions now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RepairRound {
    /// A round was asked for within its wait: nothing yet.
    Wait,
    /// Ask again: round `attempt` (1 and 2 ask the leader and the authors, later ones everyone).
    Ask { attempt: u32 },
    /// Repairs will not do (too many rounds, or the steps to catch up are gone): a resume.
    Resume,
}

/// What to do about a resume waited for now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ResumeAsk {
    /// Asked within [`CATCH_UP_AGAIN_MS`]: nothing yet.
    Wait,
    /// Ask (again); `first`: the wait began now.
    Ask { first: bool },
}

impl Taking {
    /// The next round of repairs of `step` at `now_ms`: each round waits twice as long as the
    /// last (from `after_ms`, up to 16 times it); past [`REPAIRS_BEFORE_RESUME`] rounds, or when
    /// the log committed (`committed`) more steps past ours than contributions are kept, a
    /// resume.
    pub fn repair_round(&mut self, step: u32, now_ms: u64, after_ms: u64, committed: u32) -> RepairRound {
        if self.repairs.step != step {
            self.repairs = Repairs { step, last_ms: None, attempts: 0 };
        }
        let wait = after_ms << self.repairs.attempts.min(4);
        if self.repairs.last_ms.is_some_and(|t| now_ms.saturating_sub(t) < wait) {
            return RepairRound::Wait;
        }
        if self.repairs.attempts >= REPAIRS_BEFORE_RESUME || self.applied + RETAINED_STEPS < committed {
            return RepairRound::Resume;
        }
        self.repairs.last_ms = Some(now_ms);
        self.repairs.attempts += 1;
        RepairRound::Ask { attempt: self.repairs.attempts }
    }

    /// Whether to ask for the resume waited for at `now_ms` (again every
    /// [`CATCH_UP_AGAIN_MS`]).
    pub fn resume_ask(&mut self, now_ms: u64) -> ResumeAsk {
        match self.catching_up {
            Some((_, asked)) if now_ms.saturating_sub(asked) < CATCH_UP_AGAIN_MS => ResumeAsk::Wait,
            Some((since, _)) => {
                self.catching_up = Some((since, now_ms));
                ResumeAsk::Ask { first: false }
            }
            None => {
                self.catching_up = Some((now_ms, now_ms));
                ResumeAsk::Ask { first: true }
            }
        }
    }
}

/// A committed entry the weights have yet to take.
#[derive(Clone, Debug)]
pub(super) enum Queued {
    Step { record: StepRecord, index: u64, term: u64 },
    Push { epoch: Epoch, digest: u64 },
}

/// A step taken tentatively: its record, replicated and not yet committed, and what was
/// computed on top of it (our next contribution, held back until the record commits).
#[derive(Clone, Debug)]
pub(super) struct Tentative {
    pub record: StepRecord,
    /// Where the log holds the record: its index and term.
    pub entry: (u64, u64),
    pub loss: f32,
    pub held: Option<(Gradient, u64)>,
}

/// The repairs of the step waiting for them.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Repairs {
    pub step: u32,
    pub last_ms: Option<u64>,
    pub attempts: u32,
}

impl Session {
    /// What raft-rs has ready: messages go out, committed entries are taken in order.
    pub(super) fn pump(&mut self) {
        let Some(agreement) = &mut self.agreement else { return };
        let run = agreement.run();
        match agreement.poll() {
            Ok(polled) => {
                for (to, bytes) in polled.messages {
                    self.send(to, Message::Raft { run, bytes });
                }
                for error in polled.errors {
                    self.ignore(self.leader().unwrap_or(0), Ignored::Agreement(error));
                }
                for committed in polled.committed {
                    self.on_committed(committed);
                }
            }
            Err(e) => self.stop(Stop::Agreement(e)),
        }
    }

    pub(super) fn on_committed(&mut self, committed: Committed) {
        match committed {
            Committed::Run(run) => self.follow_run(run),
            Committed::State { state, .. } => {
                // Everything below the snapshot is in its state: the weights catch up by a resume
                // unless they are there already (a tentative step is undone first: its record
                // may be inside the snapshot, never to come as an entry).
                self.roll_back();
                self.taking.queue.clear();
                self.follow_run(state.run);
            }
            Committed::Step { record, index, term } => {
                self.taking.rosters.insert(record.step, record.roster());
                while self.taking.rosters.len() > ROSTERS_KEPT {
                    self.taking.rosters.pop_first();
                }
                if record.step > self.taking.applied || self.pending.is_some() {
                    self.taking.queue.push_back(Queued::Step { record, index, term });
                }
            }
            Committed::Push { epoch, digest } => self.taking.queue.push_back(Queued::Push { epoch, digest }),
            Committed::Verdict(verdict) => self.on_verdict(verdict),
            Committed::Members { voters, learners, index } => {
                self.computing.configuration(&voters, &learners, self.taking.applied);
                self.event(Event::Members { voters, learners, index });
            }
        }
        while self.taking.queue.len() > MAX_QUEUED {
            self.taking.queue.pop_front();
        }
    }

    /// The log's run reached us: build its model (once).
    pub(super) fn follow_run(&mut self, run: RunConfig) {
        if self.configured || self.pending == Some(Pending::Configure) {
            return;
        }
        self.run = Some(run);
        self.event(Event::RunStarted { leader: self.leader().unwrap_or(0), settings: run });
        if self.config.computes {
            self.pending = Some(Pending::Configure);
            self.out.push(Output::Configure(run));
        }
    }

    /// Whether the weights hold everything the log committed.
    pub(super) fn current(&self) -> bool {
        let Some(state) = self.agreement.as_ref().and_then(Agreement::state) else { return false };
        let at_the_start = state.epoch == Epoch::default() && state.step == 0;
        self.configured
            && self.pending.is_none()
            && self.taking.queue.is_empty()
            && self.taking.tentative.is_none()
            && self.epochs.mine() == state.epoch
            && (if at_the_start {
                self.taking.applied == 0
            } else {
                state.step == 0 || self.taking.applied == state.step
            })
    }

    /// The weights take the committed entries they can, in order.
    pub(super) fn take_committed(&mut self) {
        while self.configured && self.pending.is_none() && self.stopped.is_none() {
            let Some(front) = self.taking.queue.front().cloned() else { return };
            // A tentative step stands only if the next thing committed is its very record.
            let confirms = matches!((&front, &self.taking.tentative),
                (Queued::Step { record, .. }, Some(t)) if *record == t.record);
            if !confirms && self.taking.tentative.is_some() {
                let below = matches!(&front, Queued::Step { record, .. } if record.step <= self.taking.applied);
                if !below {
                    self.roll_back();
                }
            }
            match front {
                Queued::Step { record, .. } if record.step <= self.taking.applied => {
                    self.taking.queue.pop_front();
                }
                Queued::Step { record, .. } if record.step > self.taking.applied + 1 => {
                    self.catch_up();
                    return;
                }
                Queued::Step { record, index, term } => {
                    if !self.apply(&record, index, term) {
                        return;
                    }
                    self.taking.queue.pop_front();
                    // A step boundary: the leader serves what waits for one before it computes on.
                    self.serve_at_boundary();
                }
                Queued::Push { epoch, digest } => {
                    if epoch <= self.epochs.mine() {
                        self.taking.queue.pop_front();
                        continue;
                    }
                    match self.taking.push_bytes.take() {
                        Some((held, bytes, from)) if held == digest => {
                            self.taking.queue.pop_front();
                            self.pending = Some(Pending::Push { from, epoch });
                            self.out.push(Output::Restore { bytes });
                        }
                        other => {
                            self.taking.push_bytes = other;
                            self.catch_up();
                        }
                    }
                    return;
                }
            }
        }
    }

    /// Applies a committed record once its contributions are here; false while they are not
    /// (repairs asked for) or when the guard stopped the run.
    pub(super) fn apply(&mut self, record: &StepRecord, index: u64, term: u64) -> bool {
        if let Some(tentative) = self.taking.tentative.take_if(|t| t.record == *record) {
            // Taken already: it stands (its events first, as for any step), and what was
            // computed on top of it goes out.
            self.applied_committed(record, index, term, tentative.loss);
            self.out.push(Output::Confirm { step: record.step });
            if let Some((gradient, compute_ms)) = tentative.held {
                if self.in_run() {
                    self.contribute(gradient, compute_ms);
                }
            }
            return true;
        }
        let missing = self.contributions.missing(record);
        if !missing.is_empty() {
            self.repair(record.step, &missing);
            return false;
        }
        let me = self.config.me;
        let own = self.contributions.get(record.step, me).map(|h| h.header.whash);
        if let Err(failure) = self.contributions.guard(record, me, own, self.config.expected_phash) {
            self.stop_with(failure);
            return false;
        }
        let reduced = match self.owners_run() {
            true => self.reduce_committed(record),
            false => self.contributions.reduce(record),
        };
        let Some((reduced, loss)) = reduced else { return false };
        let ours = record.contributions.iter().any(|c| c.peer == me);
        let step = record.step;
        self.out.push(Output::Apply { step, mean: reduced.mean, grid: reduced.grid, loss, ours, tentative: false });
        self.applied_committed(record, index, term, loss);
        true
    }

    /// What follows a committed step's apply (taken now, or tentatively before): the step
    /// counts, its events, the window's news, the run's end.
    fn applied_committed(&mut self, record: &StepRecord, index: u64, term: u64, loss: f32) {
        // Chunk owners: before the next step's owners are taken from this record.
        self.fingerprint_after(record);
        let me = self.config.me;
        let run = self.run.expect("a configured run");
        let step = record.step;
        let weights: Vec<(PeerId, u32)> = if run.sync.elastic {
            record.contributions.iter().map(|c| (c.peer, c.weight)).collect()
        } else {
            Vec::new()
        };
        self.taking.applied = step;
        self.contributions.applied(step);
        self.taking.repairs = Repairs::default();
        // Caught up by itself (its repairs came after all): a resume still on its way is no
        // longer asked for. Restoring it would put the weights back at a step already applied,
        // with the error-feedback residual reset — and the step after computed again, unlike the
        // contribution already sent for it (which a record may name).
        if self.taking.catching_up.is_some() && step >= self.committed_step() {
            self.taking.catching_up = None;
        }
        self.taking.last_roster = Some((step, record.roster()));
        self.taking.chunks_asked.retain(|(s, ..)| s + RETAINED_STEPS > step);
        self.taking.acks.retain(|(s, ..)| *s > step);
        self.taking.sums_asked.retain(|(s, ..)| *s > step);
        self.taking.acked.retain(|(s, ..), _| *s > step);
        let peers = record.roster();
        self.event(Event::StepApplied {
            step,
            loss,
            peers,
            whash: record.whash,
            weights: weights.clone(),
            term,
            index,
        });
        if let Some(steps) = self.window.applied(&run, me, &weights) {
            self.event(Event::Behind { step, steps, of: run.sync.mode.steps_per_sync() });
        }
        if step >= run.syncs() {
            self.finished = true;
            self.event(Event::RunFinished { step });
        }
        self.audit_after(record);
    }

    /// Takes the next step tentatively while its record is replicated, when this node holds
    /// every contribution the record names (its own among them: it is not computing), and
    /// computes the step after it at once (held back until the record commits).
    pub(super) fn take_tentatively(&mut self) {
        let me = self.config.me;
        let Some(run) = self.run else { return };
        let plain = !run.sync.elastic && run.sync.overlap == 0;
        if !self.config.compute_ahead
            || !plain
            || !self.config.computes
            || !self.in_run()
            || self.quitting
            || !self.current()
            || !self.agreement.as_ref().is_some_and(|a| a.is_member(me))
        {
            return;
        }
        let step = self.taking.applied + 1;
        // Nothing to compute after the run's last step.
        if step >= run.syncs() {
            return;
        }
        // A leader with a resume or an observer to serve takes the step when it commits: in
        // `outer:H` a window computed behind the commit leaves no step boundary to serve it at.
        let one_step = run.sync.mode.steps_per_sync() == 1;
        if !one_step && self.is_leader() && self.roster.serving_due(&self.members, self.timing.now_ms()) {
            return;
        }
        let Some(own) = self.contributions.get(step, me).map(|h| h.header.whash) else { return };
        let Some((record, index, term)) = self.agreement.as_ref().and_then(Agreement::next_uncommitted_step) else {
            return;
        };
        if record.step != step || !self.contributions.holds(&record) {
            return;
        }
        // One that the guard would stop is left to the commit, which stops the run.
        if self.contributions.guard(&record, me, Some(own), self.config.expected_phash).is_err() {
            return;
        }
        let reduced = match self.owners_run() {
            // Taken only with every chunk sum here: nothing is asked for a record not committed.
            true => {
                let owners = self.owners_of(step).unwrap_or_default();
                for (owner, from) in self.contributions.drop_unsent(&record, &owners, &[]) {
                    self.ignore(from, Ignored::NotTheOwner { step, owner });
                }
                self.contributions.reduce_owned(&record, owners.len().max(1)).ok()
            }
            false => self.contributions.reduce(&record),
        };
        let Some((reduced, loss)) = reduced else { return };
        let ours = record.contributions.iter().any(|c| c.peer == me);
        self.out.push(Output::Apply { step, mean: reduced.mean, grid: reduced.grid, loss, ours, tentative: true });
        self.taking.tentative = Some(Tentative { record, entry: (index, term), loss, held: None });
        self.ask_compute(&run, step + 1);
    }

    /// Undoes the step taken tentatively where the log no longer holds its record: a leader of a
    /// later term replaced the entry (this member may lead that term itself — holding the step,
    /// it would wait for a record nobody commits, and propose nothing).
    pub(super) fn drop_replaced_tentative(&mut self) {
        let Some(tentative) = &self.taking.tentative else { return };
        let (index, term) = tentative.entry;
        if self.agreement.as_ref().is_some_and(|a| !a.holds_entry(index, term)) {
            self.roll_back();
        }
    }

    /// Undoes the step taken tentatively, if there is one: the weights are again the committed
    /// ones, and the compute on top of it is forgotten (asked again once they move on).
    pub(super) fn roll_back(&mut self) {
        let Some(tentative) = self.taking.tentative.take() else { return };
        let step = tentative.record.step;
        self.out.push(Output::Rollback { step });
        if self.computing.asked.is_some_and(|a| a.step == step + 1) {
            self.computing.asked = None;
        }
        self.event(Event::Undone { step });
    }

    /// Asks for the contributions a committed record names that are not here: from the leader,
    /// or their authors; after a few rounds, from everyone; past that, a resume.
    pub(super) fn repair(&mut self, step: u32, missing: &[PeerId]) {
        let now = self.timing.now_ms();
        let committed = self.committed_step();
        let attempt = match self.taking.repair_round(step, now, self.config.repair_after_ms, committed) {
            RepairRound::Wait => return,
            RepairRound::Resume => return self.catch_up(),
            RepairRound::Ask { attempt } => attempt,
        };
        let me = self.config.me;
        let leader = self.leader().filter(|l| *l != me && self.members.contains(l));
        for &peer in missing {
            let mut ask: Vec<PeerId> = match leader {
                Some(leader) if attempt <= 2 => vec![leader],
                _ => self.members.iter().copied().collect(),
            };
            if attempt <= 2 && self.members.contains(&peer) && !ask.contains(&peer) {
                ask.push(peer);
            }
            for to in ask {
                self.send(to, Message::RepairRequest { step, peer });
            }
            self.event(Event::RepairRequested { step, peer });
        }
    }

    /// The last step the log committed (since the last push).
    pub(super) fn committed_step(&self) -> u32 {
        self.agreement.as_ref().and_then(Agreement::state).map_or(0, |s| s.step)
    }

    /// The weights cannot catch up with the log from what is here: ask the leader for a resume
    /// (again every few seconds while it does not come).
    pub(super) fn catch_up(&mut self) {
        if !self.config.computes || self.pending.is_some() || self.stopped.is_some() {
            return;
        }
        let now = self.timing.now_ms();
        if self.is_leader() {
            // A leader whose weights are behind its log (it won an election with the log, not the
            // weights) cannot resume itself: it hands the lead to a voter it reaches, which then
            // resumes it.
            self.hand_over_lead();
            return;
        }
        let Some(leader) = self.leader().filter(|l| *l != self.config.me && self.members.contains(l)) else {
            return;
        };
        match self.taking.resume_ask(now) {
            ResumeAsk::Wait => return,
            ResumeAsk::Ask { first: false } => {}
            ResumeAsk::Ask { first: true } => {
                let committed = self.committed_step();
                self.event(Event::CatchingUp { applied: self.taking.applied, committed });
            }
        }
        self.send(leader, Message::CatchUp { applied: self.taking.applied });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repairs_wait_twice_as_long_each_round_then_a_resume_is_asked_for() {
        let mut taking = Taking { applied: 9, ..Taking::default() };
        let after = 100;
        // After round k the next waits `after << k`.
        assert_eq!(taking.repair_round(10, 0, after, 10), RepairRound::Ask { attempt: 1 });
        assert_eq!(taking.repair_round(10, 199, after, 10), RepairRound::Wait);
        assert_eq!(taking.repair_round(10, 200, after, 10), RepairRound::Ask { attempt: 2 });
        assert_eq!(taking.repair_round(10, 599, after, 10), RepairRound::Wait);
        assert_eq!(taking.repair_round(10, 600, after, 10), RepairRound::Ask { attempt: 3 });
        assert_eq!(taking.repair_round(10, 1400, after, 10), RepairRound::Ask { attempt: 4 });
        assert_eq!(taking.repair_round(10, 2999, after, 10), RepairRound::Wait);
        assert_eq!(taking.repair_round(10, 3000, after, 10), RepairRound::Resume);
        // Another step starts its rounds afresh; one whose contributions are gone (the log is
        // more steps ahead than are kept) resumes at once.
        assert_eq!(taking.repair_round(11, 3001, after, 11), RepairRound::Ask { attempt: 1 });
        assert_eq!(taking.repair_round(12, 3002, after, 9 + RETAINED_STEPS + 1), RepairRound::Resume);
    }

    #[test]
    fn a_resume_is_asked_for_again_every_few_seconds() {
        let mut taking = Taking::default();
        assert_eq!(taking.resume_ask(1000), ResumeAsk::Ask { first: true });
        assert_eq!(taking.resume_ask(1000 + CATCH_UP_AGAIN_MS - 1), ResumeAsk::Wait);
        assert_eq!(taking.resume_ask(1000 + CATCH_UP_AGAIN_MS), ResumeAsk::Ask { first: false });
        assert_eq!(taking.catching_up, Some((1000, 1000 + CATCH_UP_AGAIN_MS)));
    }
}
