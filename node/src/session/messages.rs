//! Messages from members: step messages taken in their sender's epoch, each kind acted on, the
//! run's Raft messages stepped into its log.

use super::*;

impl Session {
    pub(super) fn on_message(&mut self, from: PeerId, message: Message) {
        if !message.is_step_message() {
            return self.dispatch(from, message);
        }
        match self.epochs.admit(from, message) {
            Admitted::Now(message) => self.dispatch(from, message),
            Admitted::Held => {}
            Admitted::Stale(why) | Admitted::Dropped(why) => self.ignore(from, why),
        }
    }

    /// Acts on a message (a step message only once admitted to our epoch).
    pub(super) fn dispatch(&mut self, from: PeerId, message: Message) {
        match message {
            Message::Epoch(epoch) => self.epochs.announced(from, epoch),
            Message::Raft { run, bytes } => self.on_raft(from, run, &bytes),
            Message::RunConfig { protocol, run_id: _, run } => {
                if protocol != MESH_PROTOCOL_VERSION {
                    self.ignore(from, Ignored::OtherProtocol { protocol });
                } else if self.config.computes {
                    self.ignore(from, Ignored::RunConfigToMember);
                } else if self.run != Some(run) {
                    // We watch: the run as its leader tells it.
                    self.run = Some(run);
                    self.event(Event::RunStarted { leader: from, settings: run });
                }
            }
            Message::Resume(bytes) => {
                if !self.config.computes || self.taking.catching_up.is_none() {
                    self.ignore(from, Ignored::UnaskedResume);
                } else if self.leader() != Some(from) {
                    self.ignore(from, Ignored::ResumeFromNonLeader);
                } else if self.pending.is_none() {
                    self.pending = Some(Pending::Resume(self.epochs.of(from)));
                    self.out.push(Output::Restore { bytes });
                }
            }
            Message::Accusation { step, target, evidence } => self.on_accusation(from, step, target, evidence),
            Message::StateRequest { step, part } => self.on_state_request(from, step, part),
            Message::State { step, served } => self.on_state(from, step, served),
            Message::TraceRequest { step, definition } => self.on_trace_request(from, step, definition),
            Message::Trace { step, answer } => self.on_trace(from, step, answer),
            Message::WeightsRequest { step, digests } => self.on_weights_request(from, step, digests),
            Message::Weights { step, words } => self.on_weights(from, step, words),
            Message::CatchUp { applied: _ } => {
                if self.is_leader() && self.agreement.as_ref().is_some_and(|a| a.is_member(from)) {
                    self.roster.resume_wanted(from);
                } else {
                    self.ignore(from, Ignored::CatchUpToNonLeader);
                }
            }
            Message::CheckpointPush(bytes) => {
                if self.leader() != Some(from) || self.run.is_none() {
                    // Pushes have authority: only the run's leader may rewind the group.
                    self.event(Event::PushRefused { from });
                    self.ignore(from, Ignored::PushFromNonLeader);
                } else {
                    self.taking.push_bytes = Some((lockstep_luts::hash::fnv1a64(&bytes), bytes, from));
                }
            }
            Message::Removed { step, why } => {
                if self.leader() != Some(from) || self.is_leader() {
                    self.ignore(from, Ignored::RemovalFromNonLeader);
                } else {
                    self.event(Event::Removed { step, why: why.clone() });
                    self.stop(Stop::Removed { step, why });
                }
            }
            Message::Leaving => {
                self.roster.leaving(from);
                self.event(Event::PeerLeaving(from));
            }
            Message::Fragment { .. } => self.ignore(from, Ignored::Fragment),
            Message::PeerInfo { .. } | Message::Ping { .. } | Message::Pong { .. } => {
                self.ignore(from, Ignored::LinkMessage)
            }
            Message::Gradient(gradient) => {
                if self.roster.is_observer(from) {
                    self.ignore(from, Ignored::ContributionFromObserver);
                } else {
                    self.offer(from, gradient);
                }
            }
            Message::RepairRequest { step, .. } if !self.takes_part(from, step) => {
                self.ignore(from, Ignored::RepairForQuietMember)
            }
            Message::RepairRequest { step, peer } => match self.contributions.get(step, peer) {
                Some(held) => {
                    // Whole; chunk owners: its header (its values are asked for by pieces).
                    let message = match &held.whole {
                        Some(gradient) if !self.owners_run() => {
                            Message::RepairResponse { peer, gradient: gradient.clone() }
                        }
                        _ => Message::Header { author: peer, header: held.header.clone() },
                    };
                    self.send(from, message);
                    self.event(Event::RepairServed { step, peer, to: from });
                }
                None => self.ignore(from, Ignored::RepairNotHeld),
            },
            Message::Header { author, header } => self.on_header(from, author, header),
            Message::Chunk(chunk) => self.on_chunk(from, chunk),
            Message::ChunkSum(sum) => self.on_chunk_sum(from, sum),
            Message::SumRequest { step, record, owner, owners } => {
                self.on_sum_request(from, step, record, owner, owners)
            }
            Message::ChunkRequest { step, author, first, end } => self.on_chunk_request(from, step, author, first, end),
            Message::ChunkHeld { step, author, first, end } => self.on_chunk_held(from, step, author, first, end),
            Message::Fingerprints { step, record, seed, prints } => {
                self.on_fingerprints(from, step, record, seed, prints)
            }
            Message::FingerprintsRequest { step, record } => self.on_fingerprints_request(from, step, record),
            Message::RepairResponse { peer, gradient } => {
                let step = gradient.step;
                let wanted = self.contributions.get(step, peer).is_none_or(|h| h.whole.is_none());
                if self.offer(peer, gradient) && wanted {
                    self.event(Event::Repaired { step, peer });
                }
            }
        }
    }

    /// A message of a run's Raft group.
    pub(super) fn on_raft(&mut self, from: PeerId, run: u64, bytes: &[u8]) {
        if self.stopped.is_some() && self.agreement.as_ref().is_some_and(|a| a.run() == run) {
            return; // a stopped node takes no part in its run's agreement any more
        }
        if self.shuns(from) {
            return; // a leader found wrong is followed no more (`session/audit.rs`)
        }
        let ours = self.agreement.as_ref().map(Agreement::run);
        if ours != Some(run) {
            if self.in_run() && ours.is_some() || !self.config.computes {
                return self.ignore(from, Ignored::OtherRun);
            }
            // A run reached us (or a new one, ours being over): its log starts empty here.
            match Agreement::join(self.config.me, run, self.config.agreement) {
                Ok(agreement) => self.new_run(Some(agreement)),
                Err(e) => return self.stop(Stop::Agreement(e)),
            }
        }
        // The leader's record waits for the leader's contribution (`appends.rs`).
        if !self.holds_back_raft(from, run, bytes) {
            self.step_raft(from, bytes);
        }
    }

    /// Takes a Raft message of our run's group.
    pub(super) fn step_raft(&mut self, from: PeerId, bytes: &[u8]) {
        let Some(agreement) = &mut self.agreement else { return };
        match agreement.step(from, bytes) {
            Ok(()) => {}
            Err(e @ AgreementError::Broken(_)) => self.stop(Stop::Agreement(e)),
            Err(e) => self.ignore(from, Ignored::Agreement(e)),
        }
    }
}
