//! Packed contributions' private states in audits (`docs/TRUST.md`): what an auditor asks a
//! target for (the whole state, or a part of its chunks), how a served state is taken, a
//! routine audit of a part compared, and the links — the state an audited contribution leaves
//! against the one its member's next contribution names — checked whole or by chunk digests.

use std::sync::Arc;

use super::audit::{names_state, word_of, Unfinished};
use super::audits::PRIVATE_KEPT;
use super::log::StepRecord;
use super::*;
use crate::audit::Urgency;
use crate::wire::{AuditVerdict, Evidence, NotServed, ServedState, StatePart};

/// A member serves the states of its last few contributions: asked about a step at most this
/// many behind the last the asker applied or knows committed, "none kept" is withholding;
/// further behind, the audit is given up. (A member keeps more than this: `Replica`'s
/// `states_kept`.) Nor is it withholding when the member was silent for an election timeout
/// at a stretch since the request (the link was down, and the group, on the other side, went
/// on: the request reached it late).
pub const STATE_PROMISED_STEPS: u32 = 3;

/// A packed contribution's audit: the residual it named and the grid the step was summed on;
/// `asked_ms`: while the auditor waits for the target to serve it.
#[derive(Clone, Debug)]
pub(super) struct Private {
    pub state: u64,
    pub grid: Arc<Vec<u8>>,
    pub asked_ms: Option<u64>,
    /// When the target was last heard from since the request (its answer, or anything else),
    /// and the longest it was silent since the request, before that.
    pub heard_ms: Option<u64>,
    pub silence_ms: u64,
    /// What of the state was asked for: a routine audit, some chunks; a check, the whole.
    pub part: StatePart,
    /// Whether it was asked again, after a first wait that went unanswered while the target
    /// was heard from (its answer may wait behind everything it sends us: `audit_tick`).
    pub again: bool,
}

impl Private {
    /// The target was heard from at `now_ms`.
    pub(super) fn heard(&mut self, now_ms: u64) {
        if let Some(asked) = self.asked_ms {
            let since = self.heard_ms.unwrap_or(asked);
            self.silence_ms = self.silence_ms.max(now_ms.saturating_sub(since));
            self.heard_ms = Some(now_ms);
        }
    }

    /// Whether the target was silent for more than `election_ms` at a stretch since it was
    /// asked (up to `now_ms`): a link down meanwhile (a cut, a partition), over which the
    /// request or its answer may have waited, and the group moved on.
    pub(super) fn silent_since_asked(&self, now_ms: u64, election_ms: u64) -> bool {
        let Some(asked) = self.asked_ms else { return false };
        let last = now_ms.saturating_sub(self.heard_ms.unwrap_or(asked));
        self.silence_ms.max(last) > election_ms
    }
}

/// An assignment that came while the worker was busy. In a packed run its state is asked for
/// at once, so that it is here when the worker is free: an overlapped window's whole state came
/// over a busy link more slowly than two assignments, and the worker waiting for one had most
/// of the next skipped (13 of 20 rogues named within 10 syncs on the device, 2026-12-06).
#[derive(Debug)]
pub(super) struct Pending {
    pub step: u32,
    pub target: PeerId,
    /// The state asked for (`None`: the run names none, or its request failed — the audit asks
    /// again when it starts, and judges the answer then).
    pub private: Option<Private>,
    /// Served and checked against the digest its contribution named.
    pub served: Option<Arc<Vec<f32>>>,
}

/// A link to check once `target`'s next contribution is committed: the residual its audited
/// contribution left (by digest), and the accusers of a broken link this check settles.
#[derive(Clone, Debug)]
pub(super) struct Link {
    pub from_step: u32,
    pub expected: Expected,
    pub accusers: Vec<PeerId>,
}

/// The state an audited contribution leaves: by its digest (the whole state was served), or by
/// the digests of the chunks checked (a part), which the member is asked for once its next
/// contribution commits.
#[derive(Clone, Debug)]
pub(super) enum Expected {
    Whole(u64),
    Chunks(Vec<(u32, u64)>),
}

impl Session {
    /// The length of a packed contribution's private state in this run (0: no run).
    pub(super) fn state_len(&self) -> usize {
        self.run.map_or(0, |run| crate::sync::private_state_len(&run.sync, self.contributions.len()))
    }

    /// Asks `target` for the state its contribution to `record`'s step named — a routine
    /// audit of a contribution held here, a part of it; a check (its evidence a verdict's), the
    /// whole — and gives what was asked. `None`: the run names no state, or the step's grid and
    /// named states are no longer held here.
    pub(super) fn ask_state(&mut self, record: &StepRecord, target: PeerId, urgency: Urgency) -> Option<Private> {
        if !self.run.is_some_and(|run| names_state(&run)) {
            return None;
        }
        let step = record.step;
        let named = record.contributions.iter().find(|c| c.peer == target)?.digest;
        let (grid, state) = self.audits.private_of(step, target)?;
        let every_step = self.run.is_some_and(|run| run.sync.mode.steps_per_sync() == 1);
        let held = self.contributions.get(step, target).is_some();
        let len = self.state_len();
        let part = match urgency {
            Urgency::Routine if every_step && held => {
                let unit = self.run.map_or(1, |run| state_unit(run.sync.compression));
                state_part(len, self.config.audit_state_part, named ^ self.config.me.rotate_left(23), unit)
            }
            _ => StatePart::Whole,
        };
        let asked_ms = Some(self.timing.now_ms());
        self.send(target, Message::StateRequest { step, part: part.clone() });
        Some(Private { state, grid, asked_ms, heard_ms: None, silence_ms: 0, part, again: false })
    }

    /// The state `target`'s contribution to `record`'s step named, whole, if this member's
    /// audit of its previous contribution left it ([`Recomputed::next_words`]): an audit that
    /// starts from it asks nothing (the target cannot tell it is audited).
    pub(super) fn derived_private(&self, record: &StepRecord, target: PeerId) -> Option<(Private, Arc<Vec<f32>>)> {
        if !self.run.is_some_and(|run| names_state(&run)) {
            return None;
        }
        let (grid, state) = self.audits.private_of(record.step, target)?;
        let words = self.audits.derived_of(record.step, target, state)?;
        let private = Private {
            state,
            grid,
            asked_ms: None,
            heard_ms: None,
            silence_ms: 0,
            part: StatePart::Whole,
            again: false,
        };
        Some((private, words))
    }

    /// `from` asks for `part` of the state its contribution to `step` named: the adapter
    /// serves it.
    pub(super) fn on_state_request(&mut self, from: PeerId, step: u32, part: StatePart) {
        if !self.run.is_some_and(|run| names_state(&run)) {
            return self.ignore(from, Ignored::StateOfStatelessRun);
        }
        let routine = self.leader() != Some(from);
        self.out.push(Output::ServeState { to: from, step, part, routine });
    }

    /// `from` served (a part of) the state its contribution to `step` named, or none: for the
    /// audit under way, or for the link of a part (its chunks' digests, which any answer
    /// carries; an answer of digests alone is never the audit's, which asked for values).
    pub(super) fn on_state(&mut self, from: PeerId, step: u32, served: ServedState) {
        let len = self.state_len();
        let linked = self.audits.links_asked.remove(&(step, from));
        let digests_alone = served.parts.is_empty() && served.len != 0;
        let waits = self.audits.waiting_for(from, step).is_some() && !digests_alone;
        let was_linked = linked.is_some();
        if let Some((link, _)) = linked {
            if !digests_alone {
                // An audit's answer checked the link asked for too: the link's own answer, of
                // digests alone, is still to come.
                self.audits.answer_expected(step, from);
            }
            self.link_served(from, step, len, link, &served);
        }
        if !waits && !digests_alone {
            if let Some(pending) = self.audits.prefetching(from, step) {
                // Asked for an assignment waiting for the worker: kept if it is the one its
                // contribution named; else asked again when the audit starts, judged then.
                let private = pending.private.as_mut().expect("asked");
                match served.check(len, private.state, &private.part) {
                    Ok(residual) => {
                        private.asked_ms = None;
                        pending.served = Some(Arc::new(residual));
                    }
                    Err(_) => pending.private = None,
                }
                return;
            }
        }
        if !waits {
            if !was_linked && !self.audits.was_awaited(from, step) {
                self.ignore(from, Ignored::UnaskedState);
            }
            return;
        }
        let known = self.taking.applied.max(self.committed_step());
        let (now, election_ms) = (self.timing.now_ms(), self.config.agreement.longest_election_ms());
        let running = self.audits.waiting_for(from, step).expect("waits");
        let private = running.private.as_ref().expect("asked: packed");
        let residual = match served.check(len, private.state, &private.part) {
            Ok(residual) => residual,
            Err(NotServed::Gone) if known > step + STATE_PROMISED_STEPS => {
                self.audits.take_running(step, from);
                return self.give_up(step, from, Unfinished::StateGone);
            }
            Err(NotServed::Gone) if private.silent_since_asked(now, election_ms) => {
                self.audits.take_running(step, from);
                return self.give_up(step, from, Unfinished::SilentThenGone);
            }
            Err(_) => {
                let running = self.audits.take_running(step, from).expect("matched above");
                return self.withheld(running);
            }
        };
        self.recompute_with(step, from, Arc::new(residual));
    }

    /// The audit under way of `target`'s contribution to `step` has the target's state
    /// (`residual`, checked): the recomputation is asked for.
    pub(super) fn recompute_with(&mut self, step: u32, target: PeerId, residual: Arc<Vec<f32>>) {
        let running = self.audits.running_mut(step, target).expect("an audit under way");
        let private = running.private.as_mut().expect("packed");
        private.asked_ms = None;
        let checked = match &private.part {
            StatePart::Whole => None,
            StatePart::Chunks(chunks) => Some(Arc::new(chunks.clone())),
        };
        let grid = private.grid.clone();
        let private = PrivateInputs { residual, checked, grid, weight: running.weight };
        let (step, target, trace, urgency) = (running.step, running.target, running.trace, running.urgency());
        self.out.push(Output::Audit { step, target, private: Some(private), trace, urgency });
    }

    /// The chunks' digests of the state `from`'s contribution to `step` named, asked for to
    /// check `link`, a part's: the chunks checked must be those its audited contribution left.
    fn link_served(&mut self, from: PeerId, step: u32, len: usize, link: Link, served: &ServedState) {
        let Expected::Chunks(expected) = &link.expected else { return };
        let Some((_, named)) = self.audits.private_of(step, from) else { return };
        if served.len == 0 && served.digests.is_empty() {
            let error = Failure::new(Unfinished::StateGone);
            return self.event(Event::AuditFailed { step: link.from_step, target: from, error });
        }
        let digests = &served.digests;
        if served.len as usize != len || crate::wire::state_digest_of(len, digests) != named {
            return self.accuse_part(link.from_step, from, Evidence::Withheld);
        }
        match expected.iter().find(|&&(chunk, digest)| digests.get(chunk as usize) != Some(&digest)) {
            None => self.audits.stats.linked += 1,
            Some(&(chunk, digest)) => {
                let claimed = digests.get(chunk as usize).copied().unwrap_or(0);
                self.accuse_part(link.from_step, from, Evidence::State { expected: digest, claimed });
            }
        }
    }

    /// The link of a part broken (or its digests withheld): another member accuses `target`'s
    /// contribution to `step` to the leader, whose check recomputes it whole; the leader itself
    /// checks it whole before anything is proposed (a link's evidence in a verdict is always a
    /// whole state's digests).
    fn accuse_part(&mut self, step: u32, target: PeerId, evidence: Evidence) {
        if !self.is_leader() {
            return self.accuse(step, target, None, evidence);
        }
        let me = self.config.me;
        self.audits.stats.accused += 1;
        self.event(Event::Accused { step, target, by: me, evidence });
        if self.audits.convicted.contains(&target) || self.audits.disputed(target) {
            return;
        }
        self.audits.checks.entry((step, target)).or_default().push((me, evidence));
        self.next_check();
    }

    /// A routine audit of a part: the loss and the values of the chunks checked compared
    /// with the contribution held (the one the record named), and the link of those chunks
    /// kept for the next commit. A value that departs is as much proof as a whole audit's (the
    /// chunk's residual was checked against the digest the contribution named, and a chunk is
    /// packed on its own): accused, or disputed, at once.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn compare_part(
        &mut self,
        target: PeerId,
        recomputed: &Gradient,
        claimed: Option<&Gradient>,
        named: u64,
        chunks: &[u32],
        next_state: Option<Vec<u64>>,
        trace: Option<Arc<Trace>>,
    ) {
        let step = recomputed.step;
        // A part is audited only of a contribution held (`start_audit`), the one named.
        let Some(claimed) = claimed.filter(|c| c.digest() == named) else {
            return self.event(Event::AuditFailed { step, target, error: Failure::new(Unfinished::NotHeld) });
        };
        self.audits.stats.audited += 1;
        let len = recomputed.values.len();
        let ranges: Vec<_> = chunks.iter().map(|&c| crate::wire::chunk_range(c, len)).collect();
        let departure = if len != claimed.values.len() {
            // No contribution can be made from the state named (its values are not finite).
            Some(Evidence::Digest { named, recomputed: recomputed.digest() })
        } else {
            departure_within(recomputed, claimed, &ranges)
        };
        if let Some(evidence) = departure {
            return self.departs(step, target, None, evidence, trace);
        }
        self.audits.stats.matched += 1;
        self.event(Event::Audited { step, target });
        if let Some(digests) = next_state {
            let expected = chunks.iter().filter_map(|&c| Some((c, *digests.get(c as usize)?))).collect();
            let link = Link { from_step: step, expected: Expected::Chunks(expected), accusers: Vec::new() };
            self.audits.links.insert((step + 1, target), link);
            self.check_links(step + 1);
        }
    }

    /// The links whose next step `step` is, once its record committed here: the state each
    /// target's contribution to it named is the one its audited contribution left, or the
    /// target is accused. A target that did not contribute to it leaves its link unchecked.
    pub(super) fn check_links(&mut self, step: u32) {
        if self.audits.record(step).is_none() {
            return;
        }
        let me = self.config.me;
        let due: Vec<PeerId> = self.audits.links.range((step, 0)..=(step, PeerId::MAX)).map(|(k, _)| k.1).collect();
        for target in due {
            let link = self.audits.links.remove(&(step, target)).expect("listed");
            let Some((_, named)) = self.audits.private_of(step, target) else { continue };
            let expected = match link.expected {
                Expected::Whole(expected) => expected,
                Expected::Chunks(_) => {
                    // The next state's chunk digests are asked for (the member's answer checked
                    // against the digest its contribution named).
                    self.send(target, Message::StateRequest { step, part: StatePart::Chunks(Vec::new()) });
                    self.audits.links_asked.insert((step, target), (link, self.timing.now_ms()));
                    continue;
                }
            };
            if named == expected {
                self.audits.stats.linked += 1;
                for accuser in link.accusers {
                    let evidence = Evidence::FalseAccusation { accused: target };
                    self.convict(AuditVerdict { step: link.from_step, target: accuser, found_by: me, evidence });
                }
                continue;
            }
            let evidence = Evidence::State { expected, claimed: named };
            self.accuse(link.from_step, target, link.accusers.first().copied(), evidence);
        }
        // Links of steps long committed (their target never contributed again) go.
        self.audits.links.retain(|&(next, _), _| next + PRIVATE_KEPT as u32 > step);
    }
}

/// The chunks a routine audit of a packed contribution asks for: `per_mille` of the state's
/// chunks (at least one), drawn from `seed` (the auditor's id and the contribution's digest:
/// its member could not know them when it sent it) `unit` neighbouring chunks at a time; the
/// whole state when that is every chunk. (`topk:K` draws a whole chunk of its own at a time,
/// four of the state's: which values it picks depends on every value of its chunk.)
pub fn state_part(len: usize, per_mille: u32, seed: u64, unit: usize) -> StatePart {
    let (chunks, unit) = (crate::wire::chunks_of(len), unit.max(1));
    let units = chunks.div_ceil(unit);
    let k = (units * per_mille as usize).div_ceil(1000).max(1);
    if k >= units {
        return StatePart::Whole;
    }
    let mut all: Vec<u32> = (0..units as u32).collect();
    let mut draw = lockstep_luts::rng::SplitMix64::new(seed);
    for i in 0..k {
        let j = i + draw.below((units - i) as u64) as usize;
        all.swap(i, j);
    }
    let (unit, chunks) = (unit as u32, chunks as u32);
    let mut picked: Vec<u32> = all[..k].iter().flat_map(|&u| u * unit..((u + 1) * unit).min(chunks)).collect();
    picked.sort_unstable();
    StatePart::Chunks(picked)
}

/// The state chunks a routine audit draws together in a run of `compression` ([`state_part`]).
pub fn state_unit(compression: crate::sync::Compression) -> usize {
    match compression {
        crate::sync::Compression::TopK(_) => crate::sync::TOPK_CHUNK / crate::wire::STATE_CHUNK,
        _ => 1,
    }
}

/// Where `claimed` departs from `recomputed` within the values `ranges` (an audit of a part:
/// the values elsewhere were recomputed from no state): its loss, then the first differing
/// value there; `None` where they agree.
fn departure_within(recomputed: &Gradient, claimed: &Gradient, ranges: &[std::ops::Range<usize>]) -> Option<Evidence> {
    let words = std::iter::once(0).chain(ranges.iter().flat_map(|r| r.start as u32 + 1..r.end as u32 + 1));
    words.into_iter().find_map(|word| {
        let (expected, got) = (word_of(recomputed, word)?, word_of(claimed, word));
        (got != Some(expected)).then(|| Evidence::Word { word, expected, claimed: got.unwrap_or(0) })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A routine audit's part: the share asked for, at least one unit, drawn whole — a
    /// `topk:K` run's units are four of the state's chunks (its own chunk of 4,096 values), the
    /// last one short where the state is — and the whole state where the share is every unit.
    #[test]
    fn a_part_is_drawn_in_whole_units() {
        let len = 10 * crate::wire::STATE_CHUNK + 5; // 11 chunks
        let StatePart::Chunks(one) = state_part(len, 125, 7, 1) else { panic!("a part") };
        assert_eq!(one.len(), 2, "an eighth of 11 chunks, rounded up");
        let StatePart::Chunks(fours) = state_part(len, 125, 7, 4) else { panic!("a part") };
        // An eighth of 3 units is one unit: four chunks, or the last unit's three.
        assert!(fours.len() == 4 || fours == [8, 9, 10], "{fours:?}");
        assert!(fours.iter().all(|&c| c / 4 == fours[0] / 4) && fours[0] % 4 == 0, "{fours:?}");
        for seed in 0..50 {
            let StatePart::Chunks(part) = state_part(len, 400, seed, 4) else { panic!("a part") };
            assert!(part.windows(2).all(|w| w[0] < w[1]) && part.iter().all(|&c| c < 11), "{part:?}");
            for unit in part.iter().map(|c| c / 4) {
                let whole: Vec<u32> = (unit * 4..(unit * 4 + 4).min(11)).collect();
                assert!(whole.iter().all(|c| part.contains(c)), "unit {unit} of {part:?} drawn whole");
            }
        }
        assert_eq!(state_part(len, 1000, 7, 4), StatePart::Whole);
        assert_eq!(state_unit(crate::sync::Compression::TopK(16)), 4);
        assert_eq!(state_unit(crate::sync::Compression::Int8), 1);
    }
}
