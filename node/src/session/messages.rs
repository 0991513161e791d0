//! Messages from members: step messages taken in their sender's epoch, each kind acted on, the
//! run's Raft messages stepped into its log.

use super::*;

impl Session {
    pub(super) fn on_message(&mut self, from: PeerId, message: Message) {
        let step_message =
            matches!(message, Message::Gradient(_) | Message::RepairRequest { .. } | Message::RepairResponse { .. });
        if !step_message {
            return self.dispatch(from, message);
        }
        match self.epochs.admit(from, message) {
            Admitted::Now(message) => self.dispatch(from, message),
            Admitted::Held => {}
            Admitted::Stale(why) | Admitted::Dropped(why) => self.ignore(from, &why),
        }
    }

    /// Acts on a message (a step message only once admitted to our epoch).
    pub(super) fn dispatch(&mut self, from: PeerId, message: Message) {
        match message {
            Message::Epoch(epoch) => self.epochs.announced(from, epoch),
            Message::Raft { run, bytes } => self.on_raft(from, run, &bytes),
            Message::RunConfig { protocol, run_id: _, run } => {
                if protocol != MESH_PROTOCOL_VERSION {
                    let why =
                        format!("a run config for mesh protocol {protocol} (this node speaks {MESH_PROTOCOL_VERSION})");
                    self.ignore(from, &why);
                } else if self.config.computes {
                    self.ignore(from, "a run config (members take the run from its log)");
                } else if self.run != Some(run) {
                    // We watch: the run as its leader tells it.
                    self.run = Some(run);
                    self.event(Event::RunStarted { leader: from, settings: run });
                }
            }
            Message::Resume(bytes) => {
                if !self.config.computes || self.catching_up.is_none() {
                    self.ignore(from, "a resume this node did not ask for");
                } else if self.leader() != Some(from) {
                    self.ignore(from, "a resume from a peer that is not the leader");
                } else if self.pending.is_none() {
                    self.pending = Some(Pending::Resume(self.epochs.of(from)));
                    self.out.push(Output::Restore { bytes });
                }
            }
            Message::CatchUp { applied: _ } => {
                if self.is_leader() && self.agreement.as_ref().is_some_and(|a| a.is_member(from)) {
                    self.roster.resume_wanted(from);
                } else {
                    self.ignore(from, "a resume request, but only the leader serves them to members");
                }
            }
            Message::CheckpointPush(bytes) => {
                if self.leader() != Some(from) || self.run.is_none() {
                    // Pushes have authority: only the run's leader may rewind the group.
                    self.event(Event::PushRefused { from });
                    self.ignore(from, "a checkpoint push from a member that is not the run's leader");
                } else {
                    self.push_bytes = Some((lockstep_luts::hash::fnv1a64(&bytes), bytes, from));
                }
            }
            Message::Removed { step, why } => {
                if self.leader() != Some(from) || self.is_leader() {
                    self.ignore(from, "a removal from a peer that is not the leader");
                } else {
                    self.event(Event::Removed { step, why: why.clone() });
                    self.stop(Stop::Removed { step, why });
                }
            }
            Message::Leaving => {
                self.roster.leaving(from);
                self.event(Event::PeerLeaving(from));
            }
            Message::Fragment { .. } => self.ignore(from, "a fragment (the adapter reassembles them)"),
            Message::PeerInfo { .. } | Message::Ping { .. } | Message::Pong { .. } => {
                self.ignore(from, "a link message (the adapter handles them)")
            }
            Message::Gradient(gradient) => {
                if self.roster.is_observer(from) {
                    self.ignore(from, "a contribution from an observer (it cannot compute)");
                } else {
                    self.offer(from, gradient);
                }
            }
            Message::RepairRequest { step, .. } if !self.takes_part(from, step) => {
                self.ignore(from, "a repair for a member that contributes nothing (it catches up by resume)")
            }
            Message::RepairRequest { step, peer } => match self.contributions.get(step, peer) {
                Some(held) => {
                    let gradient = held.gradient.clone();
                    self.send(from, Message::RepairResponse { peer, gradient });
                    self.event(Event::RepairServed { step, peer, to: from });
                }
                None => self.ignore(from, "a repair request for a contribution this node does not hold"),
            },
            Message::RepairResponse { peer, gradient } => {
                let step = gradient.step;
                let wanted = self.contributions.get(step, peer).is_none();
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
        let ours = self.agreement.as_ref().map(Agreement::run);
        if ours != Some(run) {
            if self.in_run() && ours.is_some() || !self.config.computes {
                return self.ignore(from, "a message of another run's log");
            }
            // A run reached us (or a new one, ours being over): its log starts empty here.
            match Agreement::join(self.config.me, run, self.config.agreement) {
                Ok(agreement) => self.new_run(Some(agreement)),
                Err(e) => return self.stop(Stop::Agreement(e)),
            }
        }
        let Some(agreement) = &mut self.agreement else { return };
        match agreement.step(from, bytes) {
            Ok(()) => {}
            Err(e @ AgreementError::Broken(_)) => self.stop(Stop::Agreement(e)),
            Err(e) => self.ignore(from, &e.to_string()),
        }
    }
}
