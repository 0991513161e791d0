//! The pieces of one mesh step that must be identical on every replica, without I/O: collecting
//! the roster's gradients, averaging them in strict roster order, the sync guard, and the
//! leader's repair store. The session state machine (`session.rs`) drives these.
//!
//! Averaging is `crate::sync::reduce` over the roster's contributions in roster order: f32
//! contributions are summed in that order, each addition an f32 rounding, then divided by `n`
//! (float addition is not associative, so the order is part of the protocol); `int8` and `int4`
//! ones are summed exactly in integers, where the order cannot matter — weighted by the inner
//! steps each stands for in elastic windows.

use std::collections::{BTreeMap, HashMap};

use crate::sync::{self, Compression, Reduced, SyncConfig};
use crate::wire::{Gradient, PeerId};

/// Steps of everyone's gradients the leader keeps for repairs.
pub const REPAIR_DEPTH: u32 = 8;

/// What happened to an offered gradient.
#[derive(Clone, Debug, PartialEq)]
pub enum Offer {
    Accepted,
    /// Already had this peer's gradient for the step (a duplicate delivery).
    Duplicate,
    /// For another step than the one being collected (late or early).
    WrongStep {
        step: u32,
    },
    /// From a peer not in this step's roster.
    NotInRoster,
    /// A weight the run does not allow (`SyncConfig::weights_allowed`).
    WrongWeight {
        weight: u32,
        allowed: std::ops::RangeInclusive<u32>,
    },
    /// The gradient's length is not the model's.
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
    /// Peers whose weight hash differs from ours.
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

/// One step's gradients, keyed by the step's roster.
#[derive(Clone, Debug)]
pub struct StepCollector {
    pub step: u32,
    roster: Vec<PeerId>,
    len: usize,
    compression: Compression,
    /// The weights a contribution may carry.
    weights: std::ops::RangeInclusive<u32>,
    gradients: HashMap<PeerId, Gradient>,
}

impl StepCollector {
    /// `roster` in the order the leader announced; `len` the model's weight count; `sync` the
    /// run's settings (the compression and the weights contributions may carry).
    pub fn new(step: u32, roster: Vec<PeerId>, len: usize, sync: &SyncConfig) -> Self {
        let (compression, weights) = (sync.compression, sync.weights_allowed());
        StepCollector { step, roster, len, compression, weights, gradients: HashMap::new() }
    }

    pub fn roster(&self) -> &[PeerId] {
        &self.roster
    }

    /// Replaces the roster (the leader revised it, e.g. after a peer left mid-step): gradients
    /// of peers still in it are kept, the others dropped.
    pub fn revise(&mut self, roster: Vec<PeerId>) {
        self.gradients.retain(|p, _| roster.contains(p));
        self.roster = roster;
    }

    pub fn offer(&mut self, from: PeerId, gradient: Gradient) -> Offer {
        if gradient.step != self.step {
            Offer::WrongStep { step: gradient.step }
        } else if !self.roster.contains(&from) {
            Offer::NotInRoster
        } else if gradient.values.compression() != self.compression {
            Offer::WrongEncoding { expected: self.compression, actual: gradient.values.compression() }
        } else if !self.weights.contains(&gradient.weight) {
            Offer::WrongWeight { weight: gradient.weight, allowed: self.weights.clone() }
        } else if gradient.values.len() != self.len {
            Offer::WrongLength { expected: self.len, actual: gradient.values.len() }
        } else if let Err(e) = gradient.values.check_bounds() {
            Offer::OutOfBounds(e)
        } else {
            match self.gradients.entry(from) {
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(gradient);
                    Offer::Accepted
                }
                std::collections::hash_map::Entry::Occupied(_) => Offer::Duplicate,
            }
        }
    }

    /// Roster members whose gradient has not arrived, in roster order.
    pub fn missing(&self) -> Vec<PeerId> {
        self.roster.iter().copied().filter(|p| !self.gradients.contains_key(p)).collect()
    }

    pub fn is_complete(&self) -> bool {
        self.missing().is_empty()
    }

    pub fn get(&self, peer: PeerId) -> Option<&Gradient> {
        self.gradients.get(&peer)
    }

    /// The guard: every gradient's weight hash must equal ours and its probe hash the
    /// expected value.
    pub fn guard(&self, our_whash: u32, expected_phash: u32) -> Result<(), GuardFailure> {
        let mut failure = GuardFailure { step: self.step, weight_mismatch: Vec::new(), probe_mismatch: Vec::new() };
        for peer in &self.roster {
            if let Some(g) = self.gradients.get(peer) {
                if g.whash != our_whash {
                    failure.weight_mismatch.push(*peer);
                }
                if g.phash != expected_phash {
                    failure.probe_mismatch.push(*peer);
                }
            }
        }
        if failure.weight_mismatch.is_empty() && failure.probe_mismatch.is_empty() {
            Ok(())
        } else {
            Err(failure)
        }
    }

    /// The group's mean over the roster in roster order (see the module docs), once complete.
    pub fn average(&self) -> Option<Reduced> {
        if !self.is_complete() || self.roster.is_empty() {
            return None;
        }
        let values: Vec<&sync::Values> = self.roster.iter().map(|p| &self.gradients[p].values).collect();
        let weights: Vec<u32> = self.roster.iter().map(|p| self.gradients[p].weight).collect();
        Some(sync::reduce(&values, &weights))
    }

    /// Each roster member's weight, in roster order (those whose gradient is here).
    pub fn weights(&self) -> Vec<(PeerId, u32)> {
        self.roster.iter().filter_map(|p| self.gradients.get(p).map(|g| (*p, g.weight))).collect()
    }

    /// The mean loss in roster order, for reports.
    pub fn mean_loss(&self) -> Option<f32> {
        let losses: Vec<f32> = self.roster.iter().filter_map(|p| self.gradients.get(p).map(|g| g.loss)).collect();
        (!losses.is_empty()).then(|| losses.iter().fold(0.0f32, |a, l| a + l) / losses.len() as f32)
    }
}

/// The leader's copies of every roster gradient for the last [`REPAIR_DEPTH`] steps, with
/// each step's final roster.
#[derive(Default, Debug)]
pub struct RepairStore {
    steps: BTreeMap<u32, (Vec<PeerId>, HashMap<PeerId, Gradient>)>,
}

impl RepairStore {
    /// Keeps a completed step's gradients and roster, dropping steps older than the depth. Takes
    /// the collector: its gradients move here instead of being copied (megabytes a step).
    pub fn retain(&mut self, collector: StepCollector) {
        let StepCollector { step, roster, mut gradients, .. } = collector;
        gradients.retain(|peer, _| roster.contains(peer));
        self.steps.insert(step, (roster, gradients));
        while let Some((&oldest, _)) = self.steps.iter().next() {
            if step.saturating_sub(oldest) < REPAIR_DEPTH {
                break;
            }
            self.steps.remove(&oldest);
        }
    }

    /// The original gradient of `peer` at `step`, if still kept.
    pub fn get(&self, step: u32, peer: PeerId) -> Option<&Gradient> {
        self.steps.get(&step).and_then(|(_, s)| s.get(&peer))
    }

    /// The roster `step` was applied with, if still kept.
    pub fn roster(&self, step: u32) -> Option<&[PeerId]> {
        self.steps.get(&step).map(|(roster, _)| roster.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::sync::Values;

    fn g(step: u32, whash: u32, values: &[f32]) -> Gradient {
        Gradient { step, whash, phash: 7, loss: 1.0, values: Values::F32(values.to_vec()), weight: 1 }
    }

    fn mean(c: &StepCollector) -> Option<Vec<f32>> {
        c.average().map(|r| r.mean)
    }

    #[test]
    fn averages_in_roster_order_whatever_the_arrival_order() {
        // 1e8 + 1 - 1e8 rounds differently depending on order: the roster decides.
        let big = 1.0e8f32;
        let grads = [(10u64, [big]), (20, [1.0]), (30, [-big])];
        let mut forward = StepCollector::new(5, vec![10, 20, 30], 1, &SyncConfig::SEED);
        let mut reversed = StepCollector::new(5, vec![10, 20, 30], 1, &SyncConfig::SEED);
        for (p, v) in grads {
            assert_eq!(forward.offer(p, g(5, 1, &v)), Offer::Accepted);
        }
        for (p, v) in grads.iter().rev() {
            reversed.offer(*p, g(5, 1, v));
        }
        let a = mean(&forward).unwrap();
        assert_eq!(a[0].to_bits(), mean(&reversed).unwrap()[0].to_bits());
        assert_eq!(a[0], ((big + 1.0) - big) / 3.0);
        // A different roster order is a different (documented) result.
        let mut other = StepCollector::new(5, vec![10, 30, 20], 1, &SyncConfig::SEED);
        for (p, v) in grads {
            other.offer(p, g(5, 1, &v));
        }
        assert_ne!(mean(&other).unwrap()[0].to_bits(), a[0].to_bits());
    }

    #[test]
    fn duplicates_late_and_outsiders_are_refused_with_the_reason() {
        let mut c = StepCollector::new(3, vec![1, 2], 2, &SyncConfig::SEED);
        assert_eq!(c.offer(1, g(3, 9, &[1.0, 2.0])), Offer::Accepted);
        assert_eq!(c.offer(1, g(3, 9, &[5.0, 5.0])), Offer::Duplicate);
        assert_eq!(c.offer(2, g(2, 9, &[1.0, 2.0])), Offer::WrongStep { step: 2 });
        assert_eq!(c.offer(7, g(3, 9, &[1.0, 2.0])), Offer::NotInRoster);
        assert_eq!(c.offer(2, g(3, 9, &[1.0])), Offer::WrongLength { expected: 2, actual: 1 });
        assert_eq!(c.missing(), vec![2]);
        let packed = Gradient { values: Values::Int8(crate::sync::pack(&[1.0, 2.0]).unwrap()), ..g(3, 9, &[]) };
        assert_eq!(c.offer(2, packed), Offer::WrongEncoding { expected: Compression::None, actual: Compression::Int8 });
        // Not finite, or past 2^32: refused before any sum, with the place and the value.
        let mut d = StepCollector::new(3, vec![1, 2], 2, &SyncConfig::SEED);
        let bound = crate::sync::CONTRIBUTION_BOUND;
        for (values, index) in [([1.0, f32::NAN], 1), ([f32::NEG_INFINITY, 0.0], 0), ([0.0, bound * 2.0], 1)] {
            match d.offer(2, g(3, 9, &values)) {
                Offer::OutOfBounds(e) => assert_eq!(e.index, index, "{values:?}"),
                other => panic!("{values:?}: {other:?}"),
            }
        }
        assert_eq!(d.missing(), vec![1, 2], "nothing refused was kept");
        assert_eq!(d.offer(2, g(3, 9, &[-bound, bound])), Offer::Accepted, "the bound itself is allowed");
        assert_eq!(mean(&c), None);
        c.offer(2, g(3, 9, &[3.0, 4.0]));
        assert_eq!(mean(&c), Some(vec![2.0, 3.0]));
        assert_eq!(c.get(1).unwrap().values, Values::F32(vec![1.0, 2.0]), "the duplicate did not replace the first");
    }

    #[test]
    fn the_guard_names_step_and_peers() {
        let mut c = StepCollector::new(8, vec![1, 2, 3], 1, &SyncConfig::SEED);
        c.offer(1, g(8, 0xaa, &[0.0]));
        c.offer(2, Gradient { phash: 6, ..g(8, 0xab, &[0.0]) });
        c.offer(3, g(8, 0xaa, &[0.0]));
        let failure = c.guard(0xaa, 7).unwrap_err();
        assert_eq!(failure, GuardFailure { step: 8, weight_mismatch: vec![2], probe_mismatch: vec![2] });
        assert!(failure.to_string().contains("step 8") && failure.to_string().contains("[2]"));
        let mut ok = StepCollector::new(8, vec![1], 1, &SyncConfig::SEED);
        ok.offer(1, g(8, 0xaa, &[0.0]));
        assert_eq!(ok.guard(0xaa, 7), Ok(()));
    }

    #[test]
    fn the_repair_store_keeps_eight_steps() {
        let mut store = RepairStore::default();
        for step in 0..12 {
            let mut c = StepCollector::new(step, vec![1, 2], 1, &SyncConfig::SEED);
            c.offer(1, g(step, 0, &[step as f32]));
            c.offer(2, g(step, 0, &[-(step as f32)]));
            store.retain(c);
        }
        assert!(store.get(3, 1).is_none());
        assert_eq!(store.get(4, 2).unwrap().values, Values::F32(vec![-4.0]));
        assert_eq!(store.get(11, 1).unwrap().values, Values::F32(vec![11.0]));
        assert!(store.get(11, 9).is_none());
        assert_eq!(store.roster(4), Some(&[1, 2][..]));
        assert_eq!(store.roster(3), None);
    }
}
