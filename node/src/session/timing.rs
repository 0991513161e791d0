//! Time as the session sees it: `now` from the adapter's ticks, the Raft clock's ticks, sleeps
//! noticed from gaps between ticks, and the step deadline the leader holds its members to.
//! Nothing here reads a clock.

use std::collections::VecDeque;

/// Steps the deadline looks back over.
const TIMED_STEPS: usize = 8;

/// The step deadline, counted from the moment the leader's own contribution is ready: `factor`
/// times the longest wait of the last few steps for the members' contributions, or this
/// step's own compute time when that is longer (a member as fast as the leader needs about
/// as long), never below `floor_ms` nor above `ceiling_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepDeadline {
    pub floor_ms: u64,
    pub ceiling_ms: u64,
    pub factor: u64,
}

impl Default for StepDeadline {
    fn default() -> Self {
        StepDeadline { floor_ms: 5_000, ceiling_ms: 120_000, factor: 4 }
    }
}

/// The session's clock and the waits it measured.
#[derive(Debug, Default)]
pub struct Timing {
    now_ms: u64,
    last_tick_ms: Option<u64>,
    /// When the Raft clock ticks next.
    next_raft_ms: u64,
    /// (Leader) how long the last steps waited for their members' contributions, from our own
    /// being ready to the last that came within the deadline (ms).
    waits: VecDeque<u64>,
}

/// What a tick brought.
#[derive(Debug, PartialEq, Eq)]
pub struct Ticked {
    /// The gap since the last tick, when it means this node was suspended or starved.
    pub slept_ms: Option<u64>,
    /// Raft ticks due now.
    pub raft_ticks: usize,
}

impl Timing {
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Time moved to `now_ms`. A gap longer than `sleep_ms` means this node slept: its Raft
    /// clock takes one tick for it rather than all it missed (the gap was ours, not our
    /// peers'), so a woken leader does not step down before it hears whether it still leads.
    pub fn tick(&mut self, now_ms: u64, tick_ms: u64, sleep_ms: u64) -> Ticked {
        let gap = self.last_tick_ms.map_or(0, |t| now_ms.saturating_sub(t));
        self.last_tick_ms = Some(now_ms);
        self.now_ms = now_ms;
        let slept_ms = (gap > sleep_ms).then_some(gap);
        if slept_ms.is_some() {
            self.next_raft_ms = now_ms + tick_ms;
            return Ticked { slept_ms, raft_ticks: 1 };
        }
        let mut raft_ticks = 0;
        while self.next_raft_ms <= now_ms {
            raft_ticks += 1;
            self.next_raft_ms += tick_ms;
        }
        Ticked { slept_ms, raft_ticks }
    }

    /// When the session needs its next tick: its Raft clock's next one.
    pub fn next_tick_ms(&self) -> u64 {
        self.next_raft_ms.max(self.now_ms)
    }

    /// (Leader) one step waited `ms` for its members.
    pub fn waited(&mut self, ms: u64) {
        self.waits.push_back(ms);
        if self.waits.len() > TIMED_STEPS {
            self.waits.pop_front();
        }
    }

    /// The step deadline now, for a step whose own compute took `own_compute_ms`.
    pub fn deadline_ms(&self, policy: StepDeadline, own_compute_ms: u64) -> u64 {
        let longest = self.waits.iter().copied().max().unwrap_or(0).max(own_compute_ms);
        longest.saturating_mul(policy.factor).clamp(policy.floor_ms, policy.ceiling_ms)
    }

    /// A new run: nothing measured carries over.
    pub fn reset_waits(&mut self) {
        self.waits.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raft_ticks_follow_the_clock_and_a_sleep_is_one_tick() {
        let mut t = Timing::default();
        assert_eq!(t.tick(0, 100, 2000), Ticked { slept_ms: None, raft_ticks: 1 });
        assert_eq!(t.tick(50, 100, 2000).raft_ticks, 0);
        assert_eq!(t.tick(350, 100, 2000).raft_ticks, 3);
        assert_eq!(t.next_tick_ms(), 400);
        assert_eq!(t.tick(40_350, 100, 2000), Ticked { slept_ms: Some(40_000), raft_ticks: 1 });
        assert_eq!(t.tick(40_460, 100, 2000).raft_ticks, 1);
    }

    #[test]
    fn the_deadline_follows_the_longest_wait_within_its_bounds() {
        let policy = StepDeadline { floor_ms: 1000, ceiling_ms: 10_000, factor: 4 };
        let mut t = Timing::default();
        assert_eq!(t.deadline_ms(policy, 10), 1000, "the floor before anything is timed");
        assert_eq!(t.deadline_ms(policy, 600), 2400, "a member as fast as the leader needs as long");
        t.waited(700);
        t.waited(100);
        assert_eq!(t.deadline_ms(policy, 10), 2800);
        t.waited(9000);
        assert_eq!(t.deadline_ms(policy, 10), 10_000, "the ceiling");
    }
}
