//! The guard's disputes, the replica's side (`docs/TRUST.md`, "The guard's disputes"): the
//! last few updates it applied, each with the state it started from and the group's mean, so
//! the leader can run its own update again by the definition and compare the weights it left
//! with those its contributions were computed from; and a member's answer, the first chunk of
//! its weights that parts from the leader's digests.

use std::collections::VecDeque;
use std::sync::Arc;

use super::*;
use crate::session::{first_departure, WeightsChecked};
use crate::wire::{chunk_range, state_chunk_digests};

/// Updates kept: the last one confirmed, and one more while a step is taken ahead of its
/// commit (the dispute asks about the one before it).
const UPDATES_KEPT: usize = 2;

/// One update this replica applied: the sync it ended, the state before it, the group's mean
/// and grid, whether the mean summed our contribution.
struct KeptUpdate {
    sync: u32,
    before: Arc<Undo>,
    mean: Arc<Vec<f32>>,
    grid: Arc<Vec<u8>>,
    ours: bool,
}

/// The last [`UPDATES_KEPT`] updates (kept only while audits keep the weights each step
/// started from: the dispute compares the update's result with those), and the weights the
/// run's history here began from — a fresh model's (the run's seed gives them) or a restored
/// checkpoint's (the group's, sent by its leader) — which no update left.
#[derive(Default)]
pub(super) struct KeptUpdates {
    updates: VecDeque<KeptUpdate>,
    base: Option<(u32, Arc<Vec<f32>>)>,
}

impl KeptUpdates {
    /// The update ending `sync`, from `before`, was applied.
    pub fn keep(&mut self, sync: u32, before: Arc<Undo>, mean: &[f32], grid: &[u8], ours: bool) {
        self.updates.retain(|u| u.sync < sync);
        let (mean, grid) = (Arc::new(mean.to_vec()), Arc::new(grid.to_vec()));
        self.updates.push_back(KeptUpdate { sync, before, mean, grid, ours });
        while self.updates.len() > UPDATES_KEPT {
            self.updates.pop_front();
        }
    }

    /// The update ending `sync` was undone (a step taken ahead whose record did not commit).
    pub fn undone(&mut self, sync: u32) {
        self.updates.retain(|u| u.sync != sync);
    }

    /// The state is another history's, which begins with `weights` after `sync` syncs (a new
    /// run's fresh model, a restore); `None`: nothing is kept (audits off).
    pub fn begin(&mut self, base: Option<(u32, Arc<Vec<f32>>)>) {
        self.updates.clear();
        self.base = base;
    }
}

impl TrainerReplica {
    /// Whether this replica keeps its updates for the guard's disputes: while it keeps the
    /// weights each step started from (audits are on). An overlapped window's update is one
    /// state's too: the state is taken once its steps run ahead are back (`settle`), and the
    /// definition's update moves them onto the group's weights as the member's did.
    pub(super) fn keeps_updates(&self) -> bool {
        self.audit_weights.is_some()
    }

    /// A history begins here (a configure, a restore): its weights are kept as the base of
    /// the updates that follow (one copy a history: whether audits keep them is said after a
    /// configure).
    pub(super) fn begin_updates(&mut self) {
        let base = self.trainer.as_mut().and_then(|trainer| {
            let sync = syncs_done(trainer);
            trainer.weights().ok().map(|w| (sync, Arc::new(w.to_vec())))
        });
        self.updates.begin(base);
    }

    /// The state the next update starts from, where updates are kept (`None` otherwise, or
    /// when it cannot be had: a dispute about that update then finds it gone).
    pub(super) fn before_update(&mut self) -> Option<Arc<Undo>> {
        if !self.keeps_updates() {
            return None;
        }
        self.trainer.as_mut()?.undo_point().ok().map(Arc::new)
    }

    /// The update just applied from `before` with the group's `mean` is kept, by the sync it
    /// ended (counted after it: an `outer:H` window's inner steps count before its mean comes).
    pub(super) fn keep_update(&mut self, before: Option<Arc<Undo>>, mean: &[f32], grid: &[u8], ours: bool) {
        let (Some(before), Some(trainer)) = (before, self.trainer.as_ref()) else { return };
        if self.failed.is_none() {
            self.updates.keep(syncs_done(trainer), before, mean, grid, ours);
        }
    }

    /// (Leader) the weights our contribution to `step` was computed from, checked against the
    /// definition's update of `step - 1` run again from the state before it — whose weights
    /// are first checked against those the contribution to `step - 1` was computed from (what
    /// the group agreed on then).
    pub(super) fn check_weights_of(&mut self, step: u32) -> Result<WeightsChecked, ReplicaError> {
        self.settle();
        let held = self.started_from(step)?;
        let kept = self.updates.updates.iter().find(|u| u.sync + 1 == step);
        let definition = match (kept, &self.updates.base) {
            (Some(u), _) => {
                let (before, mean, grid, ours) = (u.before.clone(), u.mean.clone(), u.grid.clone(), u.ours);
                // The update started from the weights the step before it was computed from
                // (those every contribution to it named), or ours changed in between.
                if let Ok(agreed) = self.started_from(step - 1) {
                    if let Some(departs) = first_departure(&agreed, before.sync_start()) {
                        let digests = Arc::new(Vec::new());
                        return Ok(WeightsChecked { departs: Some(departs), definition: agreed, digests });
                    }
                }
                let trainer = self.trainer.as_mut().ok_or(ReplicaError::NoRun)?;
                trainer.update_by_definition(&before, &mean, &grid, ours)?
            }
            // No update since the history began: its weights are the definition's.
            (None, Some((sync, base))) if sync + 1 == step => base.to_vec(),
            (None, _) => return Err(ReplicaError::UpdateGone { step }),
        };
        let departs = first_departure(&definition, &held);
        let digests = Arc::new(state_chunk_digests(&definition));
        Ok(WeightsChecked { departs, definition: Arc::new(definition), digests })
    }

    /// (A disputed member) the first chunk of the weights our contribution to `step` was
    /// computed from whose digest is not `digests`' (the leader's), with its words; `None`
    /// when they are no longer kept or none parts.
    pub(super) fn weights_apart_of(&mut self, step: u32, digests: &[u64]) -> Option<(u32, Vec<u32>)> {
        let held = self.started_from(step).ok()?;
        let ours = state_chunk_digests(&held);
        let chunk = (0..ours.len()).find(|&i| digests.get(i) != Some(&ours[i]))?;
        let words = held[chunk_range(chunk as u32, held.len())].iter().map(|w| w.to_bits()).collect();
        Some((chunk as u32, words))
    }
}
