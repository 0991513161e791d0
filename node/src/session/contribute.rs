//! Our contributions and the members': computing the next step when the weights hold everything
//! committed, sending ours to the members taking part, holding what arrives (checked, guarded,
//! hurrying an elastic window).

use std::collections::BTreeMap;

use super::*;
use crate::wire::Evidence;

/// Our computing, and whom we send contributions to.
#[derive(Debug, Default)]
pub(super) struct Computing {
    /// The step this node computes, and its timing.
    pub asked: Option<Asked>,
    /// The last step each member contributed to, and the step each joined the configuration
    /// at (who is sent contributions: [`QUIET_STEPS`]).
    pub contributed: BTreeMap<PeerId, u32>,
    pub joined_at: BTreeMap<PeerId, u32>,
    /// Our last contribution sent whole: its step, and whom it went to.
    pub sent_whole: Option<(u32, Vec<PeerId>)>,
}

impl Computing {
    /// `peer` contributed to `step`.
    pub fn contributed(&mut self, peer: PeerId, step: u32) {
        let last = self.contributed.entry(peer).or_insert(step);
        *last = (*last).max(step);
    }

    /// The configuration is `voters` and `learners` now, `applied` steps in: a member new to
    /// it joined at that step; one that left it is forgotten.
    pub fn configuration(&mut self, voters: &[PeerId], learners: &[PeerId], applied: u32) {
        for peer in voters.iter().chain(learners) {
            self.joined_at.entry(*peer).or_insert(applied);
        }
        self.joined_at.retain(|p, _| voters.contains(p) || learners.contains(p));
    }

    /// Whether `peer` contributed or joined within [`QUIET_STEPS`] of `step`.
    pub fn lately(&self, peer: PeerId, step: u32) -> bool {
        let within = |at: Option<&u32>| at.is_some_and(|&at| at + QUIET_STEPS >= step);
        within(self.contributed.get(&peer)) || within(self.joined_at.get(&peer))
    }
}

/// The step this node computes, and its timing.
#[derive(Clone, Copy, Debug)]
pub(super) struct Asked {
    pub step: u32,
    pub at_ms: u64,
    /// When our contribution was ready, and how long it took.
    pub ready: Option<(u64, u64)>,
}

impl Session {
    /// Computes the next step when the weights hold everything committed.
    pub(super) fn maybe_compute(&mut self) {
        let me = self.config.me;
        let Some(run) = self.run else { return };
        if !self.config.computes
            || !self.in_run()
            || self.quitting
            || !self.agreement.as_ref().is_some_and(|a| a.is_member(me))
            || !self.current()
        {
            return;
        }
        let step = self.taking.applied + 1;
        if step > run.syncs() || self.computing.asked.is_some_and(|a| a.step == step) {
            return;
        }
        self.ask_compute(&run, step);
        self.hurry_if_beaten(step);
    }

    /// Asks the adapter to compute our contribution to `step`, from now.
    pub(super) fn ask_compute(&mut self, run: &RunConfig, step: u32) {
        let now = self.timing.now_ms();
        self.computing.asked = Some(Asked { step, at_ms: now, ready: None });
        let cap = self.window.compute(run, step, now);
        self.out.push(Output::Compute { step, cap });
    }

    pub(super) fn on_computed(&mut self, gradient: Gradient) {
        let now = self.timing.now_ms();
        let Some(asked) = self.computing.asked.filter(|a| a.step == gradient.step && a.ready.is_none()) else {
            return; // a stale result: the weights moved on
        };
        if self.stopped.is_some() || self.pending.is_some() {
            return;
        }
        let compute_ms = now.saturating_sub(asked.at_ms);
        if let Some(tentative) = self.taking.tentative.as_mut().filter(|t| t.record.step + 1 == gradient.step) {
            // Computed behind the commit: it goes out once the record it stands on commits.
            tentative.held = Some((gradient, compute_ms));
            return;
        }
        if gradient.step != self.taking.applied + 1 {
            return;
        }
        self.contribute(gradient, compute_ms);
    }

    /// Our contribution, computed in `compute_ms`, goes to the members taking part in its step.
    pub(super) fn contribute(&mut self, gradient: Gradient, compute_ms: u64) {
        let me = self.config.me;
        let now = self.timing.now_ms();
        let Some(asked) = self.computing.asked.as_mut().filter(|a| a.step == gradient.step) else { return };
        asked.ready = Some((now, compute_ms));
        if self.is_leader() {
            let deadline = self.timing.deadline_ms(self.config.deadline, compute_ms);
            self.lead.expect(gradient.step, now + deadline);
        }
        if let Some(run) = self.run {
            self.window.computed(&run, gradient.weight, now);
        }
        let step = gradient.step;
        let targets = self.taking_part(step);
        // Its header (its pieces' digests) is made once, for the members and for us.
        let header = self.send_contribution(&gradient, &targets);
        if header.is_none() {
            self.computing.sent_whole = Some((step, targets));
        }
        let offer = self.contributions.offer_headed(me, gradient, header);
        self.offered(me, step, offer);
    }

    /// Whether `peer` takes part in `step`: in the configuration, and a voter, waited for by us
    /// (leading), or it contributed or joined within [`QUIET_STEPS`]. Only those are sent
    /// contributions and repairs: a member that computes nothing follows by resumes, at the
    /// leader's back-off, and costs the group no bandwidth. (The leader is a voter: one the log
    /// demoted votes again by its next change, `roster.rs`.)
    pub(super) fn takes_part(&self, peer: PeerId, step: u32) -> bool {
        let Some(agreement) = self.agreement.as_ref().filter(|a| a.is_member(peer)) else { return false };
        !self.roster.is_observer(peer)
            && (agreement.is_voter(peer) || self.roster.expected(peer) || self.computing.lately(peer, step))
    }

    /// The connected peers that take part in `step` ([`Session::takes_part`]): whom a step's
    /// contributions, chunk sums and fingerprints go to.
    pub(super) fn taking_part(&self, step: u32) -> Vec<PeerId> {
        let me = self.config.me;
        self.members.iter().copied().filter(|p| *p != me && self.takes_part(*p, step)).collect()
    }

    /// Holds a contribution from `from` (ours, a member's, or a repair of `from`'s) — or the
    /// values of one held by its header (chunk owners), an applied step's too (for an audit).
    pub(super) fn offer(&mut self, from: PeerId, gradient: Gradient) -> bool {
        let step = gradient.step;
        let fills = self.contributions.get(step, from).is_some_and(|h| h.whole.is_none());
        if !(self.collects(step) || self.configured && fills) {
            self.ignore(from, Ignored::NotCollected { step });
            return false;
        }
        let offer = self.contributions.offer(from, gradient);
        self.offered(from, step, offer)
    }

    /// What follows an offer of `from`'s contribution to `step` (whole, or its header).
    pub(super) fn offered(&mut self, from: PeerId, step: u32, offer: Offer) -> bool {
        let why = match offer {
            Offer::Filled => return true,
            Offer::Accepted => {
                self.computing.contributed(from, step);
                if from != self.config.me {
                    self.hurry_if_beaten(step);
                    self.arrived(from, step);
                }
                self.guard_held(step);
                return true;
            }
            Offer::Duplicate => return false,
            Offer::WrongWeight { weight, allowed } => Ignored::WrongWeight { weight, allowed },
            Offer::WrongEncoding { expected, actual } => Ignored::WrongEncoding { expected, actual },
            Offer::WrongLength { expected, actual } => Ignored::WrongLength { expected, actual },
            Offer::OutOfBounds(e) => {
                // Refused before it can reach a sum; the leader stops waiting for the sender.
                self.event(Event::ContributionRefused { peer: from, step, why: e });
                if self.is_leader() && from != self.config.me && self.roster.expected(from) {
                    let backoff = self.roster.missed(from);
                    self.event(Event::Dropped { peer: from, step, why: DropReason::Refused { why: e, backoff } });
                }
                return false;
            }
        };
        self.ignore(from, why);
        false
    }

    /// The guard, as early as it can run: contributions to one step (of one epoch) are computed
    /// from the same committed weights, so once our own is here, one from other weights — or
    /// with an unhealthy probe — is a fork or a broken kernel. Where the guard settles it
    /// (`apart.rs`), the leader disputes it (a probe is its member's own evidence: convicted at
    /// once) and the others leave it to the leader; where it does not, the run stops here,
    /// naming the senders, before any record could sum it. Our own probe wrong stops us.
    pub(super) fn guard_held(&mut self, step: u32) {
        let me = self.config.me;
        let Some(own) = self.contributions.get(step, me).map(|h| h.header.whash) else { return };
        let (settles, leading, expected) = (self.guard_settles(), self.is_leader(), self.config.expected_phash);
        let mut failure = GuardFailure { step, weight_mismatch: Vec::new(), probe_mismatch: Vec::new() };
        let mut apart = Vec::new();
        for (peer, held) in self.contributions.at(step) {
            let (whash, phash) = (held.header.whash, held.header.phash);
            if phash != expected {
                if settles && peer != me {
                    apart.push((peer, Evidence::Probe { expected, claimed: phash }));
                } else {
                    failure.probe_mismatch.push(peer);
                }
            } else if whash != own {
                if settles {
                    apart.push((peer, Evidence::WeightHash { expected: own, claimed: whash }));
                } else {
                    failure.weight_mismatch.push(peer);
                }
            }
        }
        if !failure.weight_mismatch.is_empty() || !failure.probe_mismatch.is_empty() {
            return self.stop_with(failure);
        }
        if !leading {
            return;
        }
        for (peer, evidence) in apart {
            match evidence {
                Evidence::Probe { .. } => self.convict_apart(step, peer, evidence),
                Evidence::WeightHash { claimed, .. } => self.found_apart(step, peer, claimed),
                _ => {}
            }
        }
        // A contribution that agrees with us counts too, where a dispute waits for the step's.
        self.weights_step_grew();
    }

    /// Elastic windows: another member's whole window for the step we compute is here: ours
    /// ends after its inner step under way.
    pub(super) fn hurry_if_beaten(&mut self, step: u32) {
        let Some(run) = self.run.filter(|r| r.sync.elastic) else { return };
        let h = run.sync.mode.steps_per_sync();
        let me = self.config.me;
        let whole = self.contributions.at(step).any(|(p, held)| p != me && held.header.weight == h);
        if self.window.hurry(&run, step, whole, self.timing.now_ms()) {
            self.out.push(Output::Hurry { step });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_sent_contributions_while_it_contributed_or_joined_lately() {
        let mut computing = Computing::default();
        computing.configuration(&[1, 2], &[3], 10);
        assert!(computing.lately(3, 10 + QUIET_STEPS) && !computing.lately(3, 11 + QUIET_STEPS));
        computing.contributed(3, 30);
        computing.contributed(3, 25);
        assert!(computing.lately(3, 30 + QUIET_STEPS) && !computing.lately(3, 31 + QUIET_STEPS));
        // Out of the configuration: its join is forgotten (not its last contribution).
        computing.configuration(&[1, 2], &[], 40);
        assert_eq!(computing.joined_at.keys().copied().collect::<Vec<_>>(), [1, 2]);
        assert!(!computing.lately(4, 40));
    }
}
