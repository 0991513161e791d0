//! Epochs (wire `-12`): a checkpoint push rewinds the step count, so the steps after it reuse
//! step numbers that contributions from before it still carry. Every node counts the pushes
//! its state descends from ([`Epoch`]) and tells each member its epoch when their channel opens
//! and whenever it changes. Channels are ordered, so every step message (a contribution, a
//! repair) belongs to the epoch its sender last announced: one from an earlier epoch is dropped,
//! one from a later epoch is held (a bounded few) until this node restores that push too, then
//! replayed.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use super::events::Ignored;
use crate::wire::{Epoch, Message, PeerId};

/// Step messages held per member from an epoch this node has not reached (a contribution or
/// two and their repairs: a handful is all a member in step can send before we catch up).
const HELD_PER_PEER: usize = 8;

/// What became of a step message.
#[derive(Debug, PartialEq)]
pub enum Admitted {
    /// Of our epoch: take it now.
    Now(Message),
    /// From before our epoch: dropped (why, for the log).
    Stale(Ignored),
    /// From a later epoch: held (or, past the bound, dropped with why).
    Held,
    Dropped(Ignored),
}

/// What a restore released: messages to take now, and the senders and epochs of those dropped.
#[derive(Debug, Default)]
pub struct Released {
    pub now: Vec<(PeerId, Message)>,
    pub stale: Vec<(PeerId, Epoch)>,
}

/// Our epoch, our members', and what is held for later.
#[derive(Debug, Default)]
pub struct Epochs {
    mine: Epoch,
    peers: BTreeMap<PeerId, Epoch>,
    held: Vec<(PeerId, Epoch, Message)>,
}

impl Epochs {
    pub fn mine(&self) -> Epoch {
        self.mine
    }

    /// The epoch `peer` last announced (a member that has announced none is at the start).
    pub fn of(&self, peer: PeerId) -> Epoch {
        self.peers.get(&peer).copied().unwrap_or_default()
    }

    /// `peer` announced `epoch`.
    pub fn announced(&mut self, peer: PeerId, epoch: Epoch) {
        self.peers.insert(peer, epoch);
    }

    /// From now on our state descends from `epoch`; true if that changed it (every member must
    /// hear of it).
    pub fn enter(&mut self, epoch: Epoch) -> bool {
        std::mem::replace(&mut self.mine, epoch) != epoch
    }

    /// A step message from `from`, taken in the epoch its sender is in.
    pub fn admit(&mut self, from: PeerId, message: Message) -> Admitted {
        let theirs = self.of(from);
        match theirs.cmp(&self.mine) {
            Ordering::Equal => Admitted::Now(message),
            Ordering::Less => Admitted::Stale(Ignored::BeforeOurEpoch { mine: self.mine }),
            Ordering::Greater => {
                let theirs_held = || self.held.iter().filter(|(f, _, _)| *f == from);
                if theirs_held().any(|(_, _, m)| *m == message) {
                    Admitted::Held
                } else if theirs_held().count() < HELD_PER_PEER {
                    self.held.push((from, theirs, message));
                    Admitted::Held
                } else {
                    Admitted::Dropped(Ignored::TooManyAhead { theirs })
                }
            }
        }
    }

    /// Messages held for the epoch we are now in, in arrival order (those of an epoch we passed
    /// come back as stale; later ones wait on).
    pub fn release(&mut self) -> Released {
        let mut released = Released::default();
        for (from, epoch, message) in std::mem::take(&mut self.held) {
            match epoch.cmp(&self.mine) {
                Ordering::Equal => released.now.push((from, message)),
                Ordering::Less => released.stale.push((from, epoch)),
                Ordering::Greater => self.held.push((from, epoch, message)),
            }
        }
        released
    }

    /// `peer` left: its epoch and what it sent for later go.
    pub fn forget(&mut self, peer: PeerId) {
        self.peers.remove(&peer);
        self.held.retain(|(from, _, _)| *from != peer);
    }

    /// A new run's log: what was held belongs to the old one.
    pub fn clear_held(&mut self) {
        self.held.clear();
    }
}
