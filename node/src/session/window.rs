//! Elastic windows (`--sync outer:H --elastic`): a window ends for every member when the first
//! has done its `H` inner steps, and each contributes the steps it finished (the contribution's
//! weight). This part decides when our window is told to end ([`Window::hurry`]), how many steps
//! a member much slower than the group's fastest takes before ending its own ([`Pace`]), and
//! counts each member's slow syncs for the leader's slow-member rule. Only how many steps a
//! member takes depends on time here — the count travels with its contribution — never a bit
//! of the sum.

use std::collections::BTreeMap;

use crate::config::RunConfig;
use crate::wire::PeerId;

/// How long our windows take against the group's, measured on the session's clock.
#[derive(Debug, Default)]
pub struct Pace {
    /// The step whose window we compute, and when its compute began (ms).
    began: Option<(u32, u64)>,
    /// Milliseconds from a window's compute start to the first whole window's arrival, last seen.
    window_ms: Option<u64>,
    /// Our milliseconds per inner step, and the steps our last contribution stood for.
    step_ms: Option<f64>,
    last_weight: Option<u32>,
}

impl Pace {
    /// The steps after which our next window ends (counting `overlap` steps run ahead): as many
    /// as fit the last window when our last contribution stood for at most half a window; else
    /// `u32::MAX` (the whole window, unless hurried).
    pub fn cap(&self, h: u32, overlap: u32) -> u32 {
        match (self.window_ms, self.step_ms, self.last_weight) {
            (Some(window), Some(step), Some(last)) if last.saturating_mul(2) <= h && step > 0.0 => {
                (overlap + (window as f64 / step).floor() as u32).clamp(1, h)
            }
            _ => u32::MAX,
        }
    }

    /// The first whole window of `step` arrived at `now_ms`.
    fn window_ended(&mut self, step: u32, now_ms: u64) {
        if let Some((_, began)) = self.began.filter(|(s, _)| *s == step) {
            self.window_ms = Some(now_ms.saturating_sub(began));
        }
    }

    /// Our contribution of `weight` steps came at `now_ms` (its steps past those run ahead,
    /// with an overlap, were computed since the compute began).
    fn computed(&mut self, weight: u32, overlap: u32, now_ms: u64) {
        let Some((_, began)) = self.began else { return };
        let computed = if weight > overlap { weight - overlap } else { weight };
        self.step_ms = Some(now_ms.saturating_sub(began) as f64 / f64::from(computed.max(1)));
        self.last_weight = Some(weight);
    }
}

/// One member's view of the run's windows.
#[derive(Debug, Default)]
pub struct Window {
    pace: Pace,
    /// The last step we were asked to compute, and the last whose window we were told to end.
    asked: Option<u32>,
    hurried: Option<u32>,
    /// Per member, the syncs in a row whose contribution stood for a quarter of the window or
    /// less.
    slow: BTreeMap<PeerId, u32>,
}

impl Window {
    /// We compute `step` from `now_ms`: how many inner steps at most (`u32::MAX`: all `H`).
    pub fn compute(&mut self, run: &RunConfig, step: u32, now_ms: u64) -> u32 {
        self.asked = Some(step);
        self.pace.began = Some((step, now_ms));
        if run.sync.elastic {
            self.pace.cap(run.sync.mode.steps_per_sync(), run.sync.overlap)
        } else {
            u32::MAX
        }
    }

    /// Our contribution of `weight` inner steps is ready.
    pub fn computed(&mut self, run: &RunConfig, weight: u32, now_ms: u64) {
        self.pace.computed(weight, run.sync.overlap, now_ms);
    }

    /// Another member's whole window (a contribution of weight `H`) for `step` is here: ours
    /// ends after its inner step under way — said once a step, and even when ours is done (the
    /// pace learns how long windows last). True when it should be said now.
    pub fn hurry(&mut self, run: &RunConfig, step: u32, whole_window_from_another: bool, now_ms: u64) -> bool {
        if !run.sync.elastic || !whole_window_from_another || self.asked != Some(step) || self.hurried == Some(step) {
            return false;
        }
        self.hurried = Some(step);
        self.pace.window_ended(step, now_ms);
        true
    }

    /// A step was applied with these weights: counts each member's slow syncs. Returns our own
    /// count of steps when our window ended early.
    pub fn applied(&mut self, run: &RunConfig, me: PeerId, weights: &[(PeerId, u32)]) -> Option<u32> {
        let h = run.sync.mode.steps_per_sync();
        let mut ours = None;
        for &(peer, steps) in weights {
            if steps.saturating_mul(4) <= h {
                *self.slow.entry(peer).or_default() += 1;
            } else {
                self.slow.remove(&peer);
            }
            if peer == me && steps < h {
                ours = Some(steps);
            }
        }
        ours
    }

    /// Members slow in each of their last `windows` syncs (the leader's rule), not `me`.
    pub fn too_slow(&self, windows: u32, me: PeerId) -> Vec<PeerId> {
        if windows == 0 {
            return Vec::new();
        }
        self.slow.iter().filter(|(p, n)| **n >= windows && **p != me).map(|(p, _)| *p).collect()
    }

    /// `peer` is out of the run: its count goes.
    pub fn forget(&mut self, peer: PeerId) {
        self.slow.remove(&peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member whose last contribution stood for half a window or less ends its next one
    /// after as many steps as fit the last window (plus those run ahead, at least one, at most
    /// H); any other runs its whole window until hurried.
    #[test]
    fn a_slow_member_ends_its_window_by_the_last_ones_length() {
        let mut pace = Pace::default();
        assert_eq!(pace.cap(8, 0), u32::MAX, "nothing known yet");
        pace.began = Some((1, 0));
        pace.computed(2, 0, 1000); // 500 ms a step
        pace.window_ms = Some(1900);
        assert_eq!(pace.cap(8, 0), 3);
        assert_eq!(pace.cap(8, 2), 5, "the steps run ahead count in the window");
        pace.window_ms = Some(100);
        assert_eq!(pace.cap(8, 0), 1, "one step at least");
        pace.window_ms = Some(100_000);
        assert_eq!(pace.cap(8, 0), 8, "H at most");
        pace.computed(5, 0, 1000);
        assert_eq!(pace.cap(8, 0), u32::MAX, "more than half a window: no cap");
        // The window's length is taken when its whole window arrives, for the step begun.
        pace.began = Some((4, 2000));
        pace.window_ended(3, 2300);
        assert_eq!(pace.window_ms, Some(100_000), "another step's");
        pace.window_ended(4, 2300);
        assert_eq!(pace.window_ms, Some(300));
    }
}
