//! The replica's weight hash: computed once per update (or restore) and reported as the next
//! step's `whash`; after an update it runs on a thread of its own while the next step computes.

use super::*;

/// The current weights' hash, or the thread computing it.
pub(super) enum WeightHash {
    Unknown,
    Known(u32),
    /// After an update it runs on a thread of its own, over a copy of the weights, while the
    /// next step computes; the step joins it at the end.
    Pending(std::thread::JoinHandle<u32>),
}

impl TrainerReplica {
    /// Hashes the current weights once and keeps the hash.
    pub(super) fn rehash(&mut self) -> u32 {
        let began = std::time::Instant::now();
        let whash = self.trainer.as_ref().map_or(0, |t| t.weight_hash());
        self.hash_seconds += began.elapsed().as_secs_f64();
        self.whash = WeightHash::Known(whash);
        whash
    }

    /// The current weights' hash: known, joined from its thread, or computed now.
    pub(super) fn resolve_hash(&mut self) -> u32 {
        let whash = match std::mem::replace(&mut self.whash, WeightHash::Unknown) {
            WeightHash::Known(whash) => whash,
            WeightHash::Pending(thread) => {
                let began = std::time::Instant::now();
                let Ok(whash) = thread.join() else { return self.rehash() };
                // Only the wait is on the step's path.
                self.hash_seconds += began.elapsed().as_secs_f64();
                whash
            }
            WeightHash::Unknown => return self.rehash(),
        };
        self.whash = WeightHash::Known(whash);
        whash
    }
    /// Ends the sync with the group's mean, and starts hashing the new weights.
    pub(super) fn finish(&mut self, mean: &[f32], grid: &[u8], ours: bool) {
        self.settle();
        let Some(trainer) = self.trainer.as_mut() else { return };
        if let Err(e) = trainer.finish_sync(mean, grid, ours) {
            self.failed = Some(e);
            self.whash = WeightHash::Unknown;
            return;
        }
        if let Some(whash) = trainer.device_weight_hash() {
            // The device hashed its own update.
            self.whash = WeightHash::Known(whash);
            return;
        }
        let began = std::time::Instant::now();
        let weights = match trainer.weights() {
            Ok(w) => w.to_vec(),
            Err(e) => {
                self.failed = Some(e);
                self.whash = WeightHash::Unknown;
                return;
            }
        };
        self.hash_seconds += began.elapsed().as_secs_f64();
        self.whash = match std::thread::Builder::new()
            .name("weight-hash".into())
            .spawn(move || crate::params::weight_hash(&weights))
        {
            Ok(thread) => WeightHash::Pending(thread),
            Err(_) => WeightHash::Unknown,
        };
    }
}
