//! The steps in flight: the contributions a member holds for steps it has not applied yet (they
//! arrive before the step's commit record, from anyone who computed them), the ones it keeps
//! after applying a step (to repair a member that missed one), and what a committed record
//! needs from them: its contributions, by digest, summed in the record's order, with the guard.
//!
//! Summing is `crate::sync::reduce` over the record's contributions in roster (ascending id)
//! order: f32 contributions are summed in that order, each addition an f32 rounding, then
//! divided by `n` (float addition is not associative, so the order is part of the protocol);
//! `int8` and `int4` ones are summed exactly in integers, where the order cannot matter —
//! weighted by the inner steps each stands for in elastic windows.

use std::collections::BTreeMap;

use super::log::StepRecord;
use crate::sync::{self, Compression, Reduced, SyncConfig};
use crate::wire::{Gradient, PeerId};

/// Applied steps whose contributions a member keeps for repairs.
pub const RETAINED_STEPS: u32 = 4;

/// What happened to an offered contribution.
#[derive(Clone, Debug, PartialEq)]
pub enum Offer {
    Accepted,
    /// Already held: the same contribution again (a duplicate delivery, a repair that crossed
    /// the original), or another one from the same member for the same step — the record
    /// decides which is summed; the first stays until a record names another.
    Duplicate,
    /// A weight the run does not allow (`SyncConfig::weights_allowed`).
    WrongWeight {
        weight: u32,
        allowed: std::ops::RangeInclusive<u32>,
    },
    /// The contribution's length is not the model's.
    WrongLength {
        expected: usize,
        actual: usize,
    },
    /// Sent as another encoding than the run's compression.
    WrongEncoding {
        expected: Compression,
        actual: Compression,
    },
    /// A value is not finite or past the bound (`sync::Values::check_bounds`): refused before it
    /// could reach any sum.
    OutOfBounds(crate::sync::OutOfBounds),
}

/// The guard stopped the run: replicas disagree or a kernel misbehaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardFailure {
    pub step: u32,
    /// Peers whose weight hash differs from the record's (this node among them when its own
    /// weights do).
    pub weight_mismatch: Vec<PeerId>,
    /// Peers whose probe hash differs from the expected one.
    pub probe_mismatch: Vec<PeerId>,
}

impl std::fmt::Display for GuardFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sync guard stopped the run at step {}", self.step)?;
        if !self.weight_mismatch.is_empty() {
            write!(f, "; weights differ on peers {:?}", self.weight_mismatch)?;
        }
        if !self.probe_mismatch.is_empty() {
            write!(f, "; probe hash wrong on peers {:?}", self.probe_mismatch)?;
        }
        Ok(())
    }
}

/// A contribution and its digest (computed once, on arrival).
#[derive(Clone, Debug)]
pub struct Held {
    pub gradient: Gradient,
    pub digest: u64,
}

/// Every contribution a member holds, by step and sender.
#[derive(Clone, Debug)]
pub struct Contributions {
    len: usize,
    compression: Compression,
    /// The weights a contribution may carry.
    weights: std::ops::RangeInclusive<u32>,
    /// Steps not applied yet.
    held: BTreeMap<u32, BTreeMap<PeerId, Held>>,
    /// The last applied steps', summed already.
    retained: BTreeMap<u32, BTreeMap<PeerId, Held>>,
}

impl Contributions {
    /// For a model of `len` weights trained with `sync`.
    pub fn new(len: usize, sync: &SyncConfig) -> Self {
        Contributions {
            len,
            compression: sync.compression,
            weights: sync.weights_allowed(),
            held: BTreeMap::new(),
            retained: BTreeMap::new(),
        }
    }

    /// The model's length (every contribution's).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Checks a contribution and holds it (the caller decides which steps it takes).
    pub fn offer(&mut self, from: PeerId, gradient: Gradient) -> Offer {
        if gradient.values.compression() != self.compression.values_as() {
            return Offer::WrongEncoding {
                expected: self.compression.values_as(),
                actual: gradient.values.compression(),
            };
        }
        if !self.weights.contains(&gradient.weight) {
            return Offer::WrongWeight { weight: gradient.weight, allowed: self.weights.clone() };
        }
        if gradient.values.len() != self.len {
            return Offer::WrongLength { expected: self.len, actual: gradient.values.len() };
        }
        if let Err(e) = gradient.values.check_bounds() {
            return Offer::OutOfBounds(e);
        }
        let step = self.held.entry(gradient.step).or_default();
        if step.contains_key(&from) {
            return Offer::Duplicate;
        }
        let digest = gradient.digest();
        step.insert(from, Held { gradient, digest });
        Offer::Accepted
    }

    /// `peer`'s contribution to `step`, held or retained.
    pub fn get(&self, step: u32, peer: PeerId) -> Option<&Held> {
        self.held.get(&step).or_else(|| self.retained.get(&step)).and_then(|s| s.get(&peer))
    }

    /// The contributions held for `step` (not applied yet), ascending by sender.
    pub fn at(&self, step: u32) -> impl Iterator<Item = (PeerId, &Held)> {
        self.held.get(&step).into_iter().flatten().map(|(p, h)| (*p, h))
    }

    /// The record's contributions this member lacks: absent, or held with another digest (those
    /// are dropped, to be repaired with the one the record names).
    pub fn missing(&mut self, record: &StepRecord) -> Vec<PeerId> {
        let step = self.held.entry(record.step).or_default();
        let mut missing = Vec::new();
        for named in &record.contributions {
            if step.get(&named.peer).is_some_and(|h| h.digest != named.digest) {
                step.remove(&named.peer);
            }
            if !step.contains_key(&named.peer) {
                missing.push(named.peer);
            }
        }
        missing
    }

    /// Whether every contribution the record names is here, with the digest it names (nothing
    /// is dropped: the record may not be the one that commits).
    pub fn holds(&self, record: &StepRecord) -> bool {
        let step = self.held.get(&record.step);
        record.contributions.iter().all(|n| step.and_then(|s| s.get(&n.peer)).is_some_and(|h| h.digest == n.digest))
    }

    /// The guard over a record whose contributions are all here: each was computed from the
    /// record's weights with a healthy probe, and so were ours (`own`: our weight hash, if this
    /// node knows it).
    pub fn guard(
        &self,
        record: &StepRecord,
        me: PeerId,
        own: Option<u32>,
        expected_phash: u32,
    ) -> Result<(), GuardFailure> {
        let mut failure = GuardFailure { step: record.step, weight_mismatch: Vec::new(), probe_mismatch: Vec::new() };
        for named in &record.contributions {
            let Some(held) = self.get(record.step, named.peer) else { continue };
            if held.gradient.whash != record.whash {
                failure.weight_mismatch.push(named.peer);
            }
            if held.gradient.phash != expected_phash {
                failure.probe_mismatch.push(named.peer);
            }
        }
        if own.is_some_and(|w| w != record.whash) && !failure.weight_mismatch.contains(&me) {
            failure.weight_mismatch.push(me);
        }
        if failure.weight_mismatch.is_empty() && failure.probe_mismatch.is_empty() {
            Ok(())
        } else {
            Err(failure)
        }
    }

    /// The record's mean and mean loss (in roster order), once every contribution is here.
    pub fn reduce(&self, record: &StepRecord) -> Option<(Reduced, f32)> {
        let held: Option<Vec<&Held>> = record.contributions.iter().map(|n| self.get(record.step, n.peer)).collect();
        let held = held?;
        if held.is_empty() {
            return Some((Reduced { mean: vec![0.0; self.len], grid: Vec::new() }, f32::NAN));
        }
        let values: Vec<&sync::Values> = held.iter().map(|h| &h.gradient.values).collect();
        let weights: Vec<u32> = held.iter().map(|h| h.gradient.weight).collect();
        let loss = held.iter().fold(0.0f32, |a, h| a + h.gradient.loss) / held.len() as f32;
        Some((sync::reduce(&values, &weights), loss))
    }

    /// `step` is applied: what was held for it is kept for repairs, everything held for it or
    /// before is done with, and retained steps older than [`RETAINED_STEPS`] go.
    pub fn applied(&mut self, step: u32) {
        let done: Vec<u32> = self.held.range(..=step).map(|(s, _)| *s).collect();
        for s in done {
            let contributions = self.held.remove(&s).unwrap_or_default();
            if s == step {
                self.retained.insert(s, contributions);
            }
        }
        self.retained.retain(|s, _| step.saturating_sub(*s) < RETAINED_STEPS);
    }

    /// The weights were replaced (a resume, a push): nothing held belongs to them.
    pub fn clear(&mut self) {
        self.held.clear();
        self.retained.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::session::log::Named;
    use crate::sync::Values;

    fn g(step: u32, whash: u32, values: &[f32]) -> Gradient {
        Gradient { step, whash, phash: 7, loss: 1.0, values: Values::F32(values.to_vec()), weight: 1, state: 0 }
    }

    fn record_of(c: &Contributions, step: u32, whash: u32, peers: &[PeerId]) -> StepRecord {
        let contributions =
            peers.iter().map(|&peer| Named { peer, digest: c.get(step, peer).unwrap().digest, weight: 1 }).collect();
        StepRecord { step, whash, contributions }
    }

    #[test]
    fn sums_in_the_records_order_whatever_the_arrival_order() {
        // 1e8 + 1 - 1e8 rounds differently depending on order: the record decides.
        let big = 1.0e8f32;
        let grads = [(10u64, [big]), (20, [1.0]), (30, [-big])];
        let mut forward = Contributions::new(1, &SyncConfig::SEED);
        let mut reversed = Contributions::new(1, &SyncConfig::SEED);
        for (p, v) in grads {
            assert_eq!(forward.offer(p, g(5, 1, &v)), Offer::Accepted);
        }
        for (p, v) in grads.iter().rev() {
            reversed.offer(*p, g(5, 1, v));
        }
        let record = record_of(&forward, 5, 1, &[10, 20, 30]);
        let a = forward.reduce(&record).unwrap().0.mean;
        assert_eq!(a[0].to_bits(), reversed.reduce(&record).unwrap().0.mean[0].to_bits());
        assert_eq!(a[0], ((big + 1.0) - big) / 3.0);
        // A record naming fewer sums fewer.
        let two = record_of(&forward, 5, 1, &[10, 30]);
        assert_eq!(forward.reduce(&two).unwrap().0.mean, vec![0.0]);
    }

    #[test]
    fn refused_contributions_say_why_and_duplicates_keep_the_first() {
        let mut c = Contributions::new(2, &SyncConfig::SEED);
        assert_eq!(c.offer(1, g(3, 9, &[1.0, 2.0])), Offer::Accepted);
        assert_eq!(c.offer(1, g(3, 9, &[5.0, 5.0])), Offer::Duplicate);
        assert_eq!(c.offer(2, g(3, 9, &[1.0])), Offer::WrongLength { expected: 2, actual: 1 });
        let packed = Gradient { values: Values::Int8(crate::sync::pack(&[1.0, 2.0]).unwrap()), ..g(3, 9, &[]) };
        assert_eq!(c.offer(2, packed), Offer::WrongEncoding { expected: Compression::None, actual: Compression::Int8 });
        let bound = crate::sync::CONTRIBUTION_BOUND;
        for (values, index) in [([1.0, f32::NAN], 1), ([f32::NEG_INFINITY, 0.0], 0), ([0.0, bound * 2.0], 1)] {
            match c.offer(2, g(3, 9, &values)) {
                Offer::OutOfBounds(e) => assert_eq!(e.index, index, "{values:?}"),
                other => panic!("{values:?}: {other:?}"),
            }
        }
        assert!(c.get(3, 2).is_none(), "nothing refused was kept");
        assert_eq!(c.get(3, 1).unwrap().gradient.values, Values::F32(vec![1.0, 2.0]));
    }

    #[test]
    fn a_record_names_its_contributions_by_digest() {
        let mut c = Contributions::new(1, &SyncConfig::SEED);
        c.offer(1, g(4, 9, &[1.0]));
        c.offer(2, g(4, 9, &[2.0]));
        let mut record = record_of(&c, 4, 9, &[1, 2]);
        assert_eq!(c.missing(&record), Vec::<PeerId>::new());
        // The record names another contribution of member 2: ours is dropped, to be repaired.
        record.contributions[1].digest ^= 1;
        assert_eq!(c.missing(&record), vec![2]);
        assert!(c.get(4, 2).is_none());
        assert!(c.reduce(&record).is_none());
        // Kept once applied, for repairs, four steps deep.
        c.applied(4);
        assert!(c.get(4, 1).is_some() && c.at(4).next().is_none());
        for step in 5..9 {
            c.offer(1, g(step, 9, &[1.0]));
            c.applied(step);
        }
        assert!(c.get(4, 1).is_none() && c.get(5, 1).is_some());
    }

    #[test]
    fn the_guard_names_step_and_peers() {
        let mut c = Contributions::new(1, &SyncConfig::SEED);
        c.offer(1, g(8, 0xaa, &[0.0]));
        c.offer(2, Gradient { phash: 6, ..g(8, 0xab, &[0.0]) });
        c.offer(3, g(8, 0xaa, &[0.0]));
        let record = record_of(&c, 8, 0xaa, &[1, 2, 3]);
        let failure = c.guard(&record, 1, Some(0xaa), 7).unwrap_err();
        assert_eq!(failure, GuardFailure { step: 8, weight_mismatch: vec![2], probe_mismatch: vec![2] });
        assert!(failure.to_string().contains("step 8") && failure.to_string().contains("[2]"));
        let ok = record_of(&c, 8, 0xaa, &[1, 3]);
        assert_eq!(c.guard(&ok, 1, Some(0xaa), 7), Ok(()));
        // Our own weights differ from the record's: we are named.
        assert_eq!(c.guard(&ok, 5, Some(0xbb), 7).unwrap_err().weight_mismatch, vec![5]);
    }
}
