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
//! - **Packed contributions** (`int8`, `int4`) are the gradient plus the member's private
//!   error-feedback residual, packed; each names its residual by digest ([`Gradient::state`]).
//!   The auditor asks the target for it (`-22`), checks it against the digest, recomputes the
//!   contribution from it ([`crate::sync::repack`]) — and derives the residual the step leaves
//!   on the group's grid, which the target's next contribution must name: a **link** checked
//!   once that record commits ([`Evidence::State`]). A residual forged to make a wrong
//!   contribution look right breaks the link before it. A target that does not serve the state
//!   it named, or serves another, while it is heard from, is accused of withholding it
//!   ([`Evidence::Withheld`]); the leader asks it too, and convicts it if it withholds again
//!   (never the accuser: the target may have served the leader only).
//!
//! - **`outer:H` windows** (packed or f32) name their inner optimizer's state at the window's
//!   start with the residual, if any (`sync::window_state`; an f32 window's message is `-26`,
//!   which has room for it) — overlapped, as the window's first steps began from the member's
//!   own weights before the mean came, with their count and those weights. The auditor runs
//!   the window again from the group's weights (those steps from the named ones, then moved
//!   onto the group's), that state, the target's batches and the inner steps it claims (its
//!   weight), on the member's own code path; the link is the state the window leaves.
//!
//! - **A wrong leader** would never propose a verdict against itself. An auditor that finds the
//!   leader's contribution wrong tells every member (the leader too: an honest one checks
//!   itself); each rechecks it and, confirming it, drops the leader's Raft messages from then
//!   on (`shun.rs`): the members that confirmed elect another leader among
//!   themselves, which proposes the verdict. A false accusation against an honest leader is
//!   checked by the leader, which convicts its accuser. A shun that no majority confirms (no
//!   other leader within `SHUN_LAPSES_ELECTIONS`) lapses: the member follows again.
//!
//! At most `SessionConfig::audit_workers` audits at a time per member (one by default; more on
//! members with cores to spare): an assignment that finds every worker busy waits for one (the
//! newest one only, and only while its step is within [`PENDING_WITHIN`] of the applied one),
//! its state asked for at once ([`Pending`]); the one it replaces, or one that waited too long,
//! is skipped and counted.

use std::sync::Arc;

use super::audits::Running;
use super::log::{LogEntry, StepRecord};
use super::private::{Expected, Link, Pending, Private};
use super::*;
use crate::audit::Urgency;
use crate::wire::{AuditVerdict, Evidence, StatePart};

/// How long an auditor waits for the state it asked for, in the run's longest election
/// timeouts (30 s by default), before it calls it withheld (when it heard from the target
/// meanwhile) or gives the audit up (when it did not).
pub const STATE_WAIT_ELECTIONS: u64 = 5;
/// An assignment that waited for a busy worker is started once it is free if its step is at
/// most this many behind the applied one (its weights, and its target's state, are then
/// surely kept: `Replica`'s `audit_weights_kept` and `states_kept`); else it is skipped.
const PENDING_WITHIN: u32 = 2;
/// What recomputing a packed contribution needs beside the weights and the batch
/// ([`Output::Audit`]): the residual it named (served by its member, length and digest checked)
/// and the grid the group summed the step on.
#[derive(Clone, Debug, PartialEq)]
pub struct PrivateInputs {
    /// The state it named: `every-step`, the residual; `outer:H`, `sync::window_state` (zeros
    /// outside the chunks served, when a part was asked for).
    pub residual: Arc<Vec<f32>>,
    /// The chunks of it served ([`crate::wire::STATE_CHUNK`] values each), when an audit of a
    /// part asked for some only: the contribution's values there are compared, the others
    /// not. `None`: the whole state.
    pub checked: Option<Arc<Vec<u32>>>,
    pub grid: Arc<Vec<u8>>,
    /// The inner steps it claims to stand for (elastic windows; else 1).
    pub weight: u32,
}

/// An audit's recomputation of a contribution ([`Input::Audited`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Recomputed {
    pub loss: f32,
    pub values: Values,
    /// Packed: the chunks' digests of the residual the contribution leaves on the group's
    /// grid (its member's next contribution must name the state they make; of a part, the
    /// chunks checked are right, the others not).
    pub next_state: Option<Vec<u64>>,
    /// A whole state's recomputation: the state itself whose chunks `next_state` names. The
    /// auditor keeps it (`Audits::derived`): if its next audit is of the same member, it starts
    /// from it without asking (the digest the next contribution names must be its digest).
    pub next_words: Option<Arc<Vec<f32>>>,
    /// Asked for (`Output::Audit`'s `trace`): the definition's trace of the step, recorded as
    /// it was recomputed — what a dispute compares the target's with.
    pub trace: Option<Arc<Trace>>,
}

impl Recomputed {
    /// From the state the member named, the definition gives values that are not finite: no
    /// contribution could be made of them (an honest member whose training diverged sends
    /// none), so the one it sent departs — its evidence the digests (the recomputation's is
    /// of no values).
    pub fn no_contribution(loss: f32) -> Recomputed {
        Recomputed { loss, values: Values::F32(Vec::new()), next_state: None, next_words: None, trace: None }
    }
}

/// Why an audit was given up (nobody is accused).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unfinished {
    /// The committed contribution's named state or the step's grid is no longer held here.
    NotHeld,
    /// The target no longer keeps the state (asked too long after the step).
    StateGone,
    /// The target was silent for an election timeout while its state was waited for (it may
    /// be gone, or the link was down and the request held or lost).
    TargetSilent,
    /// The target, silent for an election timeout after it was asked, then kept the state no
    /// more (the request reached it late).
    SilentThenGone,
}

impl std::fmt::Display for Unfinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unfinished::NotHeld => "the contribution's named state or the step's grid is no longer held here",
            Unfinished::StateGone => "the member no longer keeps that step's state (asked too late)",
            Unfinished::TargetSilent => "the member was silent for an election timeout while its state was waited for",
            Unfinished::SilentThenGone => {
                "the member, silent for an election timeout after it was asked, no longer keeps that step's state"
            }
        })
    }
}

impl std::error::Error for Unfinished {}

/// Whether a run's contributions name a private state an auditor asks for (packed ones, and
/// `outer:H` windows: `sync::names_state`).
pub(super) fn names_state(run: &RunConfig) -> bool {
    crate::sync::names_state(&run.sync)
}

impl Session {
    /// A committed record was applied: kept (accusations are checked against it), the links
    /// it settles checked, and the audit it assigns this member started.
    pub(super) fn audit_after(&mut self, record: &StepRecord) {
        self.audits.committed(record);
        let Some(run) = self.run else { return };
        if names_state(&run) {
            let held: Vec<&step::Held> =
                record.contributions.iter().filter_map(|c| self.contributions.get(record.step, c.peer)).collect();
            // Every contribution the record names is held here (the step was just reduced), whole
            // or — chunk owners — by its header, the group's grid kept from the chunk sums.
            if held.len() == record.contributions.len() {
                let wholes: Option<Vec<&Gradient>> = held.iter().map(|h| h.whole.as_ref()).collect();
                let grid = match wholes {
                    Some(wholes) => Some(crate::sync::group_grid(wholes.iter().filter_map(|g| g.values.packed()))),
                    None => self.contributions.grid_of(record.step).cloned(),
                };
                let states = record.contributions.iter().zip(&held).map(|(c, h)| (c.peer, h.header.state)).collect();
                if let Some(grid) = grid {
                    self.audits.keep_private(record.step, grid, states);
                }
            }
            self.check_links(record.step);
        }
        let me = self.config.me;
        let Some(target) = assignment(record, me, self.config.audit_rate) else { return };
        // A state derived here is at hand when a worker is free, or will be when the audit under
        // way of the same member's previous contribution, whole, ends: nothing to ask — and,
        // with a worker free meanwhile, the assignment waits for that audit rather than ask.
        let derives = self.audits.derives(record.step, target);
        if derives || self.audits.running.len() >= self.audit_workers() {
            if let Some(replaced) = self.audits.pending.take() {
                self.audits.stats.skipped += 1;
                self.audits.unawait(replaced.step, replaced.target, replaced.private.as_ref());
            }
            let private = match derives || self.derived_private(record, target).is_some() {
                true => None,
                false => self.ask_state(record, target, Urgency::Routine),
            };
            self.audits.pending = Some(Pending { step: record.step, target, private, served: None });
            return;
        }
        self.start_audit(record, target, Vec::new(), None);
    }

    /// Starts recomputing `target`'s contribution to `record`'s step (`accusers`: whose
    /// accusations it checks): at once for an f32 one; packed, once the target serves the state
    /// it named (`prefetched`: asked for while it waited for the worker, and served if so).
    fn start_audit(
        &mut self,
        record: &StepRecord,
        target: PeerId,
        accusers: Vec<(PeerId, Evidence)>,
        prefetched: Option<(Private, Option<Arc<Vec<f32>>>)>,
    ) {
        let Some(c) = record.contributions.iter().find(|c| c.peer == target) else { return };
        let (named, weight, step) = (c.digest, c.weight, record.step);
        let claimed = self.contributions.whole_of(step, target);
        if claimed.is_none() && self.owners_run() && self.members.contains(&target) {
            // Chunk owners: the target's values are asked of it, to be here when the
            // recomputation is compared with them.
            self.ask_whole(step, target);
        }
        let whash = record.whash;
        // The leader's recomputations record the definition's trace, which a dispute sends the
        // target to compare its own with.
        let every_step = self.run.is_some_and(|run| run.sync.mode.steps_per_sync() == 1);
        let trace = every_step && self.is_leader();
        let mut running = Running { step, target, whash, named, weight, claimed, accusers, private: None, trace };
        if self.run.is_some_and(|run| names_state(&run)) {
            let (private, served) = match prefetched {
                Some((private, Some(served))) => {
                    self.audits.stats.prefetched += 1;
                    (private, Some(served))
                }
                // Asked for and not yet here: a state derived here meanwhile does instead (the
                // answer, when it comes, is not waited for).
                Some((private, None)) => match self.derived_private(record, target) {
                    Some((derived, words)) => {
                        self.audits.stats.derived += 1;
                        self.audits.unawait(step, target, Some(&private));
                        (derived, Some(words))
                    }
                    None => (private, None),
                },
                None => match self.derived_private(record, target) {
                    Some((private, words)) => {
                        self.audits.stats.derived += 1;
                        (private, Some(words))
                    }
                    None => match self.ask_state(record, target, running.urgency()) {
                        Some(private) => (private, None),
                        None => return self.give_up(step, target, Unfinished::NotHeld),
                    },
                },
            };
            running.private = Some(private);
            self.start_running(running);
            if let Some(residual) = served {
                self.recompute_with(step, target, residual);
            }
            return;
        }
        let urgency = running.urgency();
        self.start_running(running);
        self.out.push(Output::Audit { step, target, private: None, trace, urgency });
    }

    /// How many audits may be under way at once here (at least one).
    pub(super) fn audit_workers(&self) -> usize {
        self.config.audit_workers.max(1) as usize
    }

    /// `running` is under way: an audit of the same contribution that was (a routine one, now
    /// a check of it) is replaced — its answer, when it comes, is this one's.
    fn start_running(&mut self, running: Running) {
        if self.audits.take_running(running.step, running.target).is_some() {
            self.audits.stats.skipped += 1;
        }
        self.audits.running.push(running);
    }

    /// An audit ends without a recomputation: said, and the worker free for the next.
    pub(super) fn give_up(&mut self, step: u32, target: PeerId, why: Unfinished) {
        self.event(Event::AuditFailed { step, target, error: Failure::new(why) });
        self.next_check();
    }

    /// Time passes: an auditor waiting too long for a state asks once more, then calls it
    /// withheld (the target was heard from all along, never silent for an election timeout) —
    /// or gives up (it was: a link down meanwhile may have held or lost the request).
    pub(super) fn audit_tick(&mut self, now_ms: u64) {
        self.dispute_tick(now_ms);
        self.settle_sums();
        self.fill_prints();
        self.apart_tick(now_ms);
        self.lapse_shuns(now_ms);
        let wait = STATE_WAIT_ELECTIONS * self.config.agreement.longest_election_ms();
        // Chunk owners: a target's values that did not come within the wait: given up.
        let (late, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.audits.awaiting_values)
            .into_iter()
            .partition(|(_, _, at)| now_ms.saturating_sub(*at) >= wait);
        self.audits.awaiting_values = waiting;
        for (running, _, _) in late {
            self.give_up(running.step, running.target, Unfinished::NotHeld);
        }
        // A link of a part unanswered: unchecked (a member gone, or a channel cut).
        self.audits.links_asked.retain(|_, (_, asked)| now_ms.saturating_sub(*asked) < wait);
        let overdue =
            |r: &Running| r.private.as_ref().and_then(|p| p.asked_ms).is_some_and(|a| now_ms.saturating_sub(a) >= wait);
        while let Some(at) = self.audits.running.iter().position(overdue) {
            // A target heard from all along is asked once more before it is called withholding:
            // its answer goes behind everything it sends us, and a link with a backlog (a cut
            // healed, a leader catching members up) takes longer than one wait to drain it.
            let election_ms = self.config.agreement.longest_election_ms();
            let running = &mut self.audits.running[at];
            if let Some(private) =
                running.private.as_mut().filter(|p| !p.again && !p.silent_since_asked(now_ms, election_ms))
            {
                (private.again, private.asked_ms, private.heard_ms, private.silence_ms) = (true, Some(now_ms), None, 0);
                let (target, step, part) = (running.target, running.step, private.part.clone());
                self.send(target, Message::StateRequest { step, part });
                continue;
            }
            let running = self.audits.running.remove(at);
            self.audits.unawait(running.step, running.target, running.private.as_ref());
            let election_ms = self.config.agreement.longest_election_ms();
            // Silent a while since the request: over a link that was down meanwhile (or died)
            // the request may have waited, or been lost, which is no withholding.
            let silent = running.private.as_ref().is_none_or(|p| p.silent_since_asked(now_ms, election_ms));
            if !silent {
                self.withheld(running);
            } else {
                self.give_up(running.step, running.target, Unfinished::TargetSilent);
            }
        }
    }

    /// The target did not serve the state its contribution named: accused (never its accusers
    /// convicted for it: the target may have served them).
    pub(super) fn withheld(&mut self, running: Running) {
        let Running { step, target, accusers, .. } = running;
        self.accuse(step, target, accusers.first().map(|(a, _)| *a), Evidence::Withheld);
        self.next_check();
    }

    /// `target`'s contribution to `step` departs as `evidence` shows: the leader convicts it;
    /// another member accuses it to the leader (`found_by`: the accuser whose check this was,
    /// `None` for this member's own audit).
    pub(super) fn accuse(&mut self, step: u32, target: PeerId, found_by: Option<PeerId>, evidence: Evidence) {
        let me = self.config.me;
        if found_by.is_none() {
            self.audits.stats.accused += 1;
            self.event(Event::Accused { step, target, by: me, evidence });
        }
        let verdict = AuditVerdict { step, target, found_by: found_by.unwrap_or(me), evidence };
        if self.is_leader() {
            self.dispute_or_convict(verdict);
        } else if self.leader() == Some(target) {
            // The leader itself departs: every member is told (the leader too: an honest one
            // checks itself), and this one follows it no more.
            if found_by.is_none() {
                let members: Vec<PeerId> = self.members.iter().copied().collect();
                for member in members {
                    self.send(member, Message::Accusation { step, target, evidence });
                }
            }
            self.shun(verdict);
        } else if let Some(leader) = self.leader().filter(|&l| l != me && l != target) {
            self.send(leader, Message::Accusation { step, target, evidence });
        }
    }

    /// The adapter's recomputation of `target`'s contribution to `step`.
    pub(super) fn on_audited(&mut self, step: u32, target: PeerId, outcome: Result<Recomputed, Failure>) {
        let Some(running) = self.audits.take_running(step, target) else {
            return; // not asked (a new run began since)
        };
        match outcome {
            Err(error) => self.event(Event::AuditFailed { step, target, error }),
            Ok(recomputed) => self.compare(running, recomputed),
        }
        self.next_check();
    }

    pub(super) fn compare(&mut self, running: Running, recomputed: Recomputed) {
        let me = self.config.me;
        let claimed = running.claimed.clone().or_else(|| self.contributions.whole_of(running.step, running.target));
        if claimed.is_none()
            && self.owners_run()
            && running.private.as_ref().is_some_and(|p| p.part != StatePart::Whole)
        {
            // Chunk owners: a part is compared with the target's values, asked of it when the
            // audit began and not here yet.
            let now = self.timing.now_ms();
            self.audits.awaiting_values.push((running, recomputed, now));
            return;
        }
        let Running { step, target, whash, named, weight, accusers, private, .. } = running;
        let Recomputed { loss, values, next_state, next_words, trace } = recomputed;
        let state = private.as_ref().map_or(0, |p| p.state);
        let recomputed = Gradient { step, whash, phash: self.config.expected_phash, loss, values, weight, state };
        if let Some(StatePart::Chunks(chunks)) = private.map(|p| p.part) {
            return self.compare_part(target, &recomputed, claimed.as_ref(), named, &chunks, next_state, trace);
        }
        self.audits.stats.audited += 1;
        if recomputed.digest() == named {
            self.audits.stats.matched += 1;
            self.event(Event::Audited { step, target });
            // The contribution is the definition's: whoever accused its arithmetic accused
            // falsely; an accusation of its link waits for the link's check.
            let mut link_accusers = Vec::new();
            for (accuser, evidence) in accusers {
                match evidence {
                    // Its own audit of a part was the accuser: nothing to convict.
                    _ if accuser == me => {}
                    Evidence::Withheld => {}
                    Evidence::State { .. } => link_accusers.push(accuser),
                    _ => self.convict(AuditVerdict {
                        step,
                        target: accuser,
                        found_by: me,
                        evidence: Evidence::FalseAccusation { accused: target },
                    }),
                }
            }
            if let Some(digests) = next_state {
                let len = self.state_len();
                let digest = crate::wire::state_digest_of(len, &digests);
                if let Some(words) = next_words {
                    self.audits.keep_derived(step + 1, target, digest, words);
                }
                let expected = Expected::Whole(digest);
                let link = Link { from_step: step, expected, accusers: link_accusers };
                self.audits.links.insert((step + 1, target), link);
                self.check_links(step + 1);
            }
            return;
        }
        let mut evidence = evidence(&recomputed, claimed.as_ref(), named);
        if matches!(evidence, Evidence::Digest { .. }) {
            // The contribution is no longer held here (a check that waited for the worker): an
            // accuser's word whose definition's bits this recomputation confirms names it better.
            let confirmed = |e: &Evidence| match *e {
                Evidence::Word { word, expected, .. } => word_of(&recomputed, word) == Some(expected),
                _ => false,
            };
            if let Some((_, word)) = accusers.iter().find(|(_, e)| confirmed(e)) {
                evidence = *word;
            }
        }
        self.departs(step, target, accusers.first().map(|(a, _)| *a), evidence, trace);
    }

    /// A recomputation (`trace`: the definition's trace, recorded as it ran) found `target`'s
    /// contribution to `step` departing as `evidence` shows: accused, or disputed by the leader.
    pub(super) fn departs(
        &mut self,
        step: u32,
        target: PeerId,
        found_by: Option<PeerId>,
        evidence: Evidence,
        trace: Option<Arc<Trace>>,
    ) {
        self.audits.definition = trace.map(|t| ((step, target), t));
        self.accuse(step, target, found_by, evidence);
        self.audits.definition = None;
    }

    /// The next accusation waiting, checked once a worker is free (one at a time): the leader
    /// checks every one; another member, those against the leader. Then the assignment that
    /// waited, if a worker is still free.
    pub(super) fn next_check(&mut self) {
        let (leading, leader) = (self.is_leader(), self.leader());
        let ours = |target: PeerId| leading || leader == Some(target);
        let workers = self.audit_workers();
        // One check at a time.
        let checking = self.audits.running.iter().any(|r| r.urgency() == Urgency::Check);
        let check_waits = !checking && self.audits.checks.keys().any(|(_, t)| ours(*t));
        if check_waits && self.audits.running.len() >= workers {
            // A check does not wait behind routine recomputations (it runs on a referee of its
            // own, at the member's priority): the newest routine one computing is given up, its
            // answer ignored. One waiting for a state still holds its worker (its answer is
            // asked for).
            let computing = |r: &Running| r.private.as_ref().is_none_or(|p| p.asked_ms.is_none());
            let Some(at) = self.audits.running.iter().rposition(computing) else { return };
            self.audits.running.remove(at);
            self.audits.stats.skipped += 1;
        }
        while let Some(&(step, target)) = self.audits.checks.keys().find(|(_, t)| ours(*t) && !checking) {
            if self.audits.running.len() >= workers {
                return;
            }
            let accusers = self.audits.checks.remove(&(step, target)).expect("found");
            let decided = self.audits.convicted.contains(&target) || self.audits.disputed(target);
            if decided || self.audits.shunned.contains(target) {
                continue;
            }
            if let Some(record) = self.audits.record(step).cloned() {
                return self.start_audit(&record, target, accusers, None);
            }
        }
        if self.audits.running.len() >= workers {
            return;
        }
        // Accusations checked first; then the assignment that waited, if still fresh — unless it
        // waits for the state an audit under way derives.
        if self.audits.pending.as_ref().is_some_and(|p| p.private.is_none() && self.audits.derives(p.step, p.target)) {
            return;
        }
        if let Some(Pending { step, target, private, served }) = self.audits.pending.take() {
            let fresh = self.taking.applied <= step + PENDING_WITHIN && !self.audits.convicted.contains(&target);
            match self.audits.record(step).cloned() {
                Some(record) if fresh => self.start_audit(&record, target, Vec::new(), private.map(|p| (p, served))),
                _ => {
                    self.audits.stats.skipped += 1;
                    self.audits.unawait(step, target, private.as_ref());
                }
            }
        }
    }

    /// `from` accuses `target`'s contribution to `step`: the leader checks it by recomputing it;
    /// an accusation against the leader, every member checks.
    pub(super) fn on_accusation(&mut self, from: PeerId, step: u32, target: PeerId, evidence: Evidence) {
        if let Evidence::SumCheck { chunk } = evidence {
            return self.on_sum_accusation(from, step, target, chunk);
        }
        if !self.is_leader() && self.leader() != Some(target) {
            return self.ignore(from, Ignored::AccusationToNonLeader);
        }
        let named = self.audits.record(step).is_some_and(|r| r.roster().contains(&target));
        if !named {
            return self.ignore(from, Ignored::AccusationOfNoContribution { step, target });
        }
        self.event(Event::Accused { step, target, by: from, evidence });
        if self.audits.convicted.contains(&target) || self.audits.disputed(target) {
            return;
        }
        let accusers = self.audits.checks.entry((step, target)).or_default();
        if !accusers.iter().any(|(a, _)| *a == from) {
            accusers.push((from, evidence));
        }
        self.next_check();
    }

    /// (Leader) proposes `verdict` to the run's log, once a member.
    pub(super) fn convict(&mut self, verdict: AuditVerdict) {
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

/// Word `word` of a contribution as evidence counts it (0: the loss's bits; `1 + i`: value `i`,
/// a packed one as the f32 it stands for).
pub(super) fn word_of(g: &Gradient, word: u32) -> Option<u32> {
    let Some(i) = word.checked_sub(1) else { return Some(g.loss.to_bits()) };
    let i = i as usize;
    match &g.values {
        Values::F32(values) => values.get(i).map(|v| v.to_bits()),
        Values::Int8(p) | Values::Int4(p) => (i < p.len()).then(|| p.value(i).to_bits()),
    }
}

/// Where `claimed` departs from `recomputed` (the definition's): the first differing word (the
/// loss, then the values; a packed value as the f32 it stands for, [`crate::sync::Packed::value`]),
/// or the digests where the contribution is not held or differs elsewhere (its encoding, its
/// length, its named state).
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
        (Values::Int8(want), Values::Int8(got)) | (Values::Int4(want), Values::Int4(got))
            if want.len() == got.len() =>
        {
            match (0..want.len()).find(|&i| want.value(i).to_bits() != got.value(i).to_bits()) {
                Some(i) => Evidence::Word {
                    word: i as u32 + 1,
                    expected: want.value(i).to_bits(),
                    claimed: got.value(i).to_bits(),
                },
                None => digest,
            }
        }
        _ => digest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_evidence_is_the_first_word_that_departs() {
        let g = |loss: f32, v: Vec<f32>| Gradient {
            step: 3,
            whash: 1,
            phash: 2,
            loss,
            values: Values::F32(v),
            weight: 1,
            state: 0,
        };
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
