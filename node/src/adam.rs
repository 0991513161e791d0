//! Deterministic Adam with bias correction.
//!
//! For step `t = 1, 2, …` (the optimizer's own count), in f32, element by element in index
//! order:
//!
//! ```text
//! β1ᵗ ← β1ᵗ⁻¹ · β1          β2ᵗ ← β2ᵗ⁻¹ · β2          (running f32 products, start at 1)
//! m ← β1·m + (1−β1)·g
//! v ← β2·v + (1−β2)·(g·g)
//! w ← w − lr_t · (m / (1 − β1ᵗ)) / (√(v / (1 − β2ᵗ)) + ε)
//! ```
//!
//! with `β1 = 0.9`, `β2 = 0.95`, `ε = 1e-8`, no weight decay and no clipping. `(1−β1)` and
//! `(1−β2)` are f32 subtractions evaluated once. Every operation is a correctly rounded IEEE
//! operation (`√` included), so the update is the same on every machine. `m`, `v`, `β1ᵗ`,
//! `β2ᵗ` and `t` are the state a checkpoint or mid-run resume must carry.
//!
//! The learning rate `lr_t` warms up linearly over the first `min(100, steps/10)` steps and
//! then decays linearly to `lr/10` at `steps` (and stays there).

pub use lockstep_luts::ops::{ADAM_BETA1 as BETA1, ADAM_BETA2 as BETA2, ADAM_EPS as EPS};

/// The optimizer state.
#[derive(Clone, Debug, PartialEq)]
pub struct Adam {
    pub m: Vec<f32>,
    pub v: Vec<f32>,
    pub beta1_power: f32,
    pub beta2_power: f32,
    /// Updates applied so far.
    pub t: u32,
}

impl Adam {
    pub fn new(len: usize) -> Self {
        Self { m: vec![0.0; len], v: vec![0.0; len], beta1_power: 1.0, beta2_power: 1.0, t: 0 }
    }

    /// The next update's bias corrections `(1 − β1ᵗ, 1 − β2ᵗ)`, without counting it: the scalar
    /// half of [`Adam::update`], for an update whose element-wise half runs elsewhere (a
    /// device's `adam` op, on moments kept there), which [`Adam::advance`] then counts.
    pub fn next_corrections(&self) -> (f32, f32) {
        (1.0 - self.beta1_power * BETA1, 1.0 - self.beta2_power * BETA2)
    }

    /// Counts one more update and returns its bias corrections (see [`Adam::next_corrections`]).
    pub fn advance(&mut self) -> (f32, f32) {
        let corrections = self.next_corrections();
        self.t += 1;
        self.beta1_power *= BETA1;
        self.beta2_power *= BETA2;
        corrections
    }

    /// One update of `weights` from `grad` at learning rate `lr`, split over `threads` threads
    /// (element by element, so any split gives the same bits).
    pub fn update(&mut self, weights: &mut [f32], grad: &[f32], lr: f32, threads: usize) {
        assert!(weights.len() == grad.len() && grad.len() == self.m.len(), "Adam: length mismatch");
        let (correction1, correction2) = self.advance();
        let update = |w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]| {
            lockstep_luts::ops::adam_into(w, g, m, v, lr, correction1, correction2)
        };
        // Below a few chunks' worth a thread costs more than it saves.
        const MIN_PER_THREAD: usize = 1 << 15;
        let parts = threads.min(weights.len() / MIN_PER_THREAD).max(1);
        if parts == 1 {
            return update(weights, grad, &mut self.m, &mut self.v);
        }
        let per = weights.len().div_ceil(parts);
        rayon::scope(|scope| {
            let chunks =
                weights.chunks_mut(per).zip(grad.chunks(per)).zip(self.m.chunks_mut(per)).zip(self.v.chunks_mut(per));
            for (((w, g), m), v) in chunks {
                let update = &update;
                scope.spawn(move |_| update(w, g, m, v));
            }
        });
    }

    /// One update with the second moment frozen (1-bit Adam's, `sync::StepRule::Frozen`): `m`,
    /// `β1ᵗ` and `t` advance as in [`Adam::update`], `v` and `β2ᵗ` stay where they are, and
    /// `w ← w − lr · (m / (1 − β1ᵗ)) / (√(v / (1 − β2ᵗ)) + ε)` in the order [`Adam::update`]
    /// rounds it, element by element.
    pub fn update_frozen(&mut self, weights: &mut [f32], grad: &[f32], lr: f32) {
        assert!(weights.len() == grad.len() && grad.len() == self.m.len(), "Adam: length mismatch");
        let correction1 = 1.0 - self.beta1_power * BETA1;
        let correction2 = 1.0 - self.beta2_power;
        self.t += 1;
        self.beta1_power *= BETA1;
        let one_minus_b1 = 1.0 - BETA1;
        for (((w, &g), m), &v) in weights.iter_mut().zip(grad).zip(self.m.iter_mut()).zip(&self.v) {
            *m = BETA1 * *m + one_minus_b1 * g;
            let m_hat = *m / correction1;
            let v_hat = v / correction2;
            *w -= lr * m_hat / (v_hat.sqrt() + EPS);
        }
    }
}

/// The learning rate for the update that ends step `step` (0-based) of a `steps`-step run.
pub fn schedule(lr: f32, step: u32, steps: u32) -> f32 {
    let warmup = (steps / 10).clamp(1, 100);
    if step < warmup {
        return lr * ((step + 1) as f32 / warmup as f32);
    }
    let decay_span = steps.saturating_sub(warmup).max(1);
    let progress = ((step - warmup) as f32 / decay_span as f32).min(1.0);
    lr * (1.0 - 0.9 * progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_update_moves_each_weight_by_about_lr() {
        // With bias correction, the first step is lr · g / (|g| + ε) ≈ ±lr.
        let mut adam = Adam::new(3);
        let mut w = vec![1.0f32, 1.0, 1.0];
        adam.update(&mut w, &[0.5, -2.0, 0.0], 0.01, 1);
        assert!((w[0] - 0.99).abs() < 1e-6 && (w[1] - 1.01).abs() < 1e-6 && w[2] == 1.0, "{w:?}");
        assert_eq!(adam.t, 1);
        assert_eq!(adam.beta1_power, BETA1);
    }

    /// Reproducible bit for bit, and the same on any number of threads (a length that splits
    /// into parts of unequal size).
    #[test]
    fn updates_are_reproducible_bit_for_bit_on_any_thread_count() {
        let len = 100_003;
        let run = |threads: usize| {
            let mut adam = Adam::new(len);
            let mut w: Vec<f32> = (0..len).map(|i| i as f32 * 0.01).collect();
            for step in 0..20 {
                let g: Vec<f32> = (0..len).map(|i| ((i * 7 + step * 13) % 17) as f32 * 0.001 - 0.008).collect();
                adam.update(&mut w, &g, schedule(0.003, step as u32, 20), threads);
            }
            w.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        let one = run(1);
        assert_eq!(run(1), one);
        assert_eq!(run(3), one);
    }

    /// The frozen update is Adam's with `v` and `β2ᵗ` held: `v` never moves, `m` and `β1ᵗ` do,
    /// and a weight moves as the formula says, worked by hand in f32.
    #[test]
    fn a_frozen_update_is_adams_with_the_second_moment_held() {
        let mut live = Adam::new(4);
        let mut w = vec![0.5f32, -0.25, 1.0, 0.0];
        live.update(&mut w, &[1.0, -2.0, 0.5, 0.0], 0.01, 1);
        let mut frozen = live.clone();
        let mut w_frozen = w.clone();
        frozen.update_frozen(&mut w_frozen, &[0.25, 0.5, -1.0, 0.125], 0.01);
        assert_eq!(frozen.v, live.v, "v is held");
        assert_eq!((frozen.t, frozen.beta2_power), (2, live.beta2_power));
        assert_eq!(frozen.beta1_power, BETA1 * BETA1);
        // By hand, for weight 0: m = 0.9·0.1 + 0.1·0.25, v = 0.05 (from the first step).
        let m0 = BETA1 * (1.0 - BETA1) + (1.0 - BETA1) * 0.25f32;
        let c1 = 1.0 - BETA1 * BETA1;
        let c2 = 1.0 - BETA2;
        let expected = w[0] - 0.01 * (m0 / c1) / ((live.v[0] / c2).sqrt() + EPS);
        assert_eq!(w_frozen[0].to_bits(), expected.to_bits());
        assert_eq!(frozen.m[0].to_bits(), m0.to_bits());
    }

    #[test]
    fn schedule_warms_up_and_decays() {
        assert!((schedule(1.0, 0, 1000) - 0.01).abs() < 1e-7);
        assert_eq!(schedule(1.0, 99, 1000), 1.0);
        assert_eq!(schedule(1.0, 100, 1000), 1.0);
        assert!((schedule(1.0, 1000, 1000) - 0.1).abs() < 1e-6);
        assert!((schedule(1.0, 5000, 1000) - 0.1).abs() < 1e-6);
        assert_eq!(schedule(1.0, 0, 1), 1.0);
    }
}
