//! A record is appended where the leader's own contribution is.
//!
//! A member that appends a record to its log may have to take it as a leader of a later term:
//! Raft commits every entry a new leader holds. A record names contributions by digest; each
//! other author's is held by its author and by the leader (which named it because it held
//! it), so one member lost loses none of them. The leader's own is held by the leader alone
//! until it reaches the others — whole, in the mesh and at the first step of chunk owners. A
//! leader killed right after its record reached a majority, its contribution lost with it (a
//! cut link, a queue that never drained), left a record that every survivor appended and
//! none could take: they elected one another for ever (the campaign's seeds 192, 490 and
//! 658; `docs/AGREEMENT.md`).
//!
//! So a member appends a record naming the leader's whole contribution to the step it collects
//! only once it holds that contribution with the digest named. Until then the leader's append
//! messages wait here, in order, as if the link were slow — which Raft allows — and the
//! contribution is asked of the leader at once (as a committed record's would be: it may have
//! come before this member could take it, at a run's start), then once each repair interval.
//! Its other messages are taken (a heartbeat commits only what this member acknowledged, and
//! keeps it from campaigning against a leader that is there). Once the contribution is here
//! the appends are taken; a leader whose contribution does not come within
//! [`APPEND_WAIT_ROUNDS`] repair intervals has them taken anyway (it is alive, and answering):
//! the record then commits as before this rule. A link to the leader that closes drops them
//! (Raft sends them again to a follower that answers).
//!
//! On one reliable ordered link the leader's contribution, sent before its record, is there
//! first, and nothing waits. Over WebRTC the small record overtakes a large contribution: the
//! record then commits only once a majority holds the leader's contribution, and what waits on
//! the commit waits that much longer (`docs/AGREEMENT.md`: −4.6% on `bench wan` every-step int8).

use super::*;

/// Repair intervals the leader's appends wait for its contribution before they are taken anyway.
pub(super) const APPEND_WAIT_ROUNDS: u64 = 10;

/// The most append messages from the leader held while its contribution is awaited (past that,
/// the oldest is dropped: the leader sends again what was not acknowledged).
const MOST_HELD: usize = 32;

/// The leader's append messages held until its contribution is here.
#[derive(Clone, Debug)]
pub(super) struct HeldAppends {
    pub leader: PeerId,
    pub run: u64,
    /// The leader's contributions awaited: (step, digest).
    pub awaited: Vec<(u32, u64)>,
    /// When the wait began, and when the leader was last asked (at once, then each repair
    /// interval).
    pub since_ms: u64,
    pub asked_ms: Option<u64>,
    /// The messages, in the order they came.
    pub messages: Vec<Vec<u8>>,
}

impl Session {
    /// (Leader, proposing `step`'s record) our own contribution, sent whole, goes to the members
    /// taking part now that it did not go to when it was computed (those the configuration took
    /// in since: a late joiner, or a run's first step): each holds it before the record reaches
    /// it — the link carries it first — instead of asking for it to append the record.
    pub(super) fn send_own_to_the_rest(&mut self, step: u32) {
        let Some((at, sent)) = self.computing.sent_whole.as_ref().filter(|(at, _)| *at == step) else { return };
        let rest: Vec<PeerId> = self.taking_part(step).into_iter().filter(|p| !sent.contains(p)).collect();
        let whole = self.contributions.get(*at, self.config.me).and_then(|h| h.whole.clone());
        let Some(gradient) = whole.filter(|_| !rest.is_empty()) else { return };
        for &to in &rest {
            self.send(to, Message::Gradient(gradient.clone()));
        }
        if let Some((_, sent)) = self.computing.sent_whole.as_mut() {
            sent.extend(rest);
        }
    }

    /// Whether a Raft message from `from` waits here for `from`'s contribution
    /// (the module docs); if so it is held.
    pub(super) fn holds_back_raft(&mut self, from: PeerId, run: u64, bytes: &[u8]) -> bool {
        let now = self.timing.now_ms();
        // Only appends wait (the message read once here; Raft reads it again when it is taken).
        let Some(records) = self.agreement.as_ref().and_then(|a| a.appended_records(bytes)) else { return false };
        if let Some(held) = self.taking.appends.as_mut().filter(|h| h.leader == from && h.run == run) {
            // The oldest go first: the leader sends again from what we hold (Raft's probe).
            if held.messages.len() == MOST_HELD {
                held.messages.remove(0);
            }
            held.messages.push(bytes.to_vec());
            return true;
        }
        let awaited = self.leaders_contribution_lacking(from, records);
        if awaited.is_empty() {
            return false;
        }
        // Another leader's appends still held are stale now: Raft sends what it must again.
        self.taking.appends = Some(HeldAppends {
            leader: from,
            run,
            awaited,
            since_ms: now,
            asked_ms: None,
            messages: vec![bytes.to_vec()],
        });
        true
    }

    /// The leader's contributions (step, digest) that `records` name, of a whole step this
    /// member collects now, which it does not hold.
    fn leaders_contribution_lacking(&self, leader: PeerId, records: Vec<StepRecord>) -> Vec<(u32, u64)> {
        // Learners too: one may be a voter by the time the record commits (a change before it
        // in the same append, taken when it commits).
        if !self.configured || self.stopped.is_some() {
            return Vec::new();
        }
        // A whole step collected here: in the mesh the next two (a record of the step after
        // the one taken tentatively comes before that one's commit is heard); with chunk owners
        // the next, whose owners this member does not know (its first, or the first after a push).
        let next = self.taking.applied + 1;
        let whole = |step: u32| match self.owners_run() {
            true => step == next && self.owners_of(step).is_none(),
            false => self.collects(step),
        };
        records
            .into_iter()
            .filter(|r| whole(r.step))
            .filter_map(|r| r.contributions.iter().find(|c| c.peer == leader).map(|c| (r.step, c.digest)))
            .filter(|&(step, digest)| !self.holds_whole_of(step, leader, digest))
            .collect()
    }

    /// Whether `author`'s contribution to `step` is here with `digest`, all of its values.
    fn holds_whole_of(&self, step: u32, author: PeerId, digest: u64) -> bool {
        self.contributions.get(step, author).is_some_and(|h| h.digest == digest)
            && self.contributions.holds_whole(step, author)
    }

    /// Takes the held appends once the leader's contribution is here (or past
    /// [`APPEND_WAIT_ROUNDS`] repair intervals), asks for it again each interval, and drops
    /// them when the link to the leader is gone.
    pub(super) fn take_held_appends(&mut self) {
        let Some(held) = self.taking.appends.as_mut() else { return };
        let (now, every) = (self.timing.now_ms(), self.config.repair_after_ms.max(1));
        let (leader, run) = (held.leader, held.run);
        if !self.members.contains(&leader) || self.agreement.as_ref().is_none_or(|a| a.run() != run) {
            self.taking.appends = None;
            return;
        }
        let awaited = held.awaited.clone();
        let here = awaited.iter().all(|&(step, digest)| self.holds_whole_of(step, leader, digest));
        let Some(held) = self.taking.appends.as_mut() else { return };
        if !(here || now.saturating_sub(held.since_ms) >= APPEND_WAIT_ROUNDS * every) {
            if held.asked_ms.is_none_or(|t| now.saturating_sub(t) >= every) {
                held.asked_ms = Some(now);
                // Its header, and — chunk owners answer a repair with the header alone — its
                // values by pieces.
                for (step, _) in awaited {
                    self.send(leader, Message::RepairRequest { step, peer: leader });
                    if self.owners_run() {
                        self.ask_whole(step, leader);
                    }
                }
            }
            return;
        }
        let Some(held) = self.taking.appends.take() else { return };
        for bytes in held.messages {
            self.step_raft(leader, &bytes);
        }
    }
}
