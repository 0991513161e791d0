//! Who audits whom after a commit (`docs/TRUST.md`): one draw every member makes alike from
//! the committed record, unpredictable before it.

use super::log::StepRecord;
use super::*;

/// The member `me` audits after `record` committed, if any. The record's digests seed one draw
/// every member makes alike: the roster in a random cycle (Sattolo's shuffle), each member's
/// target the next in it — so at rate 1000 every contribution is audited exactly once, and at
/// any rate no member audits itself and none is audited twice while another is skipped. Each
/// member then draws from the same seed and its own id whether it audits (`rate` in a thousand).
pub fn assignment(record: &StepRecord, me: PeerId, rate: u32) -> Option<PeerId> {
    let roster = record.roster();
    let at = roster.iter().position(|&p| p == me)?;
    if roster.len() < 2 || rate == 0 {
        return None;
    }
    let mut seed = lockstep_luts::hash::fnv1a64(&record.step.to_le_bytes()) ^ u64::from(record.whash);
    for c in &record.contributions {
        seed = lockstep_luts::rng::SplitMix64::new(seed ^ c.digest ^ c.peer.rotate_left(17)).next_u64();
    }
    let mut draw = lockstep_luts::rng::SplitMix64::new(seed ^ me.rotate_left(31));
    if draw.below(1000) >= u64::from(rate) {
        return None;
    }
    let mut cycle: Vec<usize> = (0..roster.len()).collect();
    let mut shuffle = lockstep_luts::rng::SplitMix64::new(seed);
    for i in (1..cycle.len()).rev() {
        let j = shuffle.below(i as u64) as usize;
        cycle.swap(i, j);
    }
    // `cycle` is one cycle through every position: `at`'s target is the next one in it.
    Some(roster[cycle[at]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::log::Named;
    use std::collections::BTreeMap;

    fn record(step: u32, peers: &[PeerId]) -> StepRecord {
        let contributions = peers.iter().map(|&peer| Named {
            peer,
            digest: peer.wrapping_mul(0x9e37_79b9) ^ u64::from(step),
            weight: 1,
        });
        StepRecord { step, whash: 7, contributions: contributions.collect() }
    }

    #[test]
    fn each_roster_member_audits_another_at_the_rate_and_no_one_can_tell_before_the_commit() {
        let peers = [3, 8, 21, 40];
        let (mut audits, mut of) = (0, BTreeMap::<PeerId, u32>::new());
        for step in 1..=2000 {
            let r = record(step, &peers);
            for &me in &peers {
                if let Some(target) = assignment(&r, me, 250) {
                    assert!(target != me && peers.contains(&target));
                    audits += 1;
                    *of.entry(target).or_default() += 1;
                }
                assert_eq!(assignment(&r, me, 0), None);
                assert!(assignment(&r, me, 1000).is_some());
            }
            // Not in the roster: audits nobody.
            assert_eq!(assignment(&r, 99, 1000), None);
        }
        // A quarter of 8,000 draws, each target about a quarter of those.
        assert!((1800..2200).contains(&audits), "{audits}");
        assert!(of.values().all(|&n| (400..600).contains(&n)), "{of:?}");
        // At rate 1000 every member of a roster is audited exactly once, by another: the
        // targets are a permutation without fixed points, a different one from step to step.
        let mut cycles = BTreeSet::new();
        for step in 1..=200 {
            let r = record(step, &[3, 8, 21, 40, 55]);
            let targets: Vec<PeerId> = r.roster().iter().map(|&me| assignment(&r, me, 1000).unwrap()).collect();
            let mut sorted = targets.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, r.roster(), "step {step}: {targets:?}");
            cycles.insert(targets);
        }
        // Five members make 4! = 24 cycles; 200 steps see nearly all of them.
        assert!(cycles.len() >= 20, "{} cycles", cycles.len());
        // One digest of the record changed: another assignment (a member cannot foresee it).
        let (a, mut b) = (record(5, &peers), record(5, &peers));
        b.contributions[2].digest ^= 1;
        let differs = (0..64u64).any(|salt| {
            let (mut a, mut b) = (a.clone(), b.clone());
            a.whash ^= salt as u32;
            b.whash ^= salt as u32;
            peers.iter().any(|&me| assignment(&a, me, 500) != assignment(&b, me, 500))
        });
        assert!(differs);
        assert_eq!(assignment(&record(1, &[3]), 3, 1000), None, "a member alone has nobody to audit");
    }
}
