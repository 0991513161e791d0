use super::sum::{lowest_terms, pow2};
use super::*;

/// The int8 bound is the f32 one on the values the packing stands for: 64 · 2^26 = 2^32
/// passes, 64 · 2^27 does not; an f32 contribution of exactly 2^32 passes.
#[test]
fn contributions_past_the_bound_are_found_in_either_encoding() {
    let mut p = pack(&[1.0; 40]).unwrap();
    assert_eq!(p.q[BLOCK], 64, "1.0 packs as 64 · 2^-6");
    p.exponents[1] = (26 + EXPONENT_BIAS) as u8;
    assert_eq!(Values::Int8(p.clone()).check_bounds(), Ok(()));
    p.exponents[1] = (27 + EXPONENT_BIAS) as u8;
    let e = Values::Int8(p).check_bounds().unwrap_err();
    assert_eq!(e.index, BLOCK);
    assert_eq!(e.value, 2.0 * CONTRIBUTION_BOUND, "{e}");
    assert_eq!(Values::F32(vec![CONTRIBUTION_BOUND, -CONTRIBUTION_BOUND]).check_bounds(), Ok(()));
    let e = Values::F32(vec![0.0, f32::NAN]).check_bounds().unwrap_err();
    assert_eq!(e.index, 1);
    assert!(e.to_string().contains("not finite"), "{e}");
}
use lockstep_luts::rng::SplitMix64;

/// Values over a wide range of magnitudes, with zero and subnormal blocks, so grids differ
/// between members block by block.
fn contribution(seed: u64, len: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..len)
        .map(|i| {
            let block = i / BLOCK;
            match block % 7 {
                5 => 0.0,
                6 => f32::from_bits(1 + (rng.next_u64() % 1000) as u32), // subnormal
                _ => {
                    let magnitude = 2f32.powi((block % 5) as i32 * 3 - 8 + (seed % 3) as i32);
                    ((rng.next_u64() % 2001) as f32 / 1000.0 - 1.0) * magnitude
                }
            }
        })
        .collect()
}

#[test]
fn modes_and_compressions_read_what_they_print() {
    for mode in [SyncMode::EveryStep, SyncMode::Outer { inner_steps: 32 }] {
        assert_eq!(mode.to_string().parse::<SyncMode>(), Ok(mode));
    }
    for c in [Compression::None, Compression::Int8, Compression::Int4, Compression::TopK(1), Compression::TopK(4096)] {
        assert_eq!(c.to_string().parse::<Compression>(), Ok(c));
        // And the run config's byte carries it.
        let config = SyncConfig { compression: c, ..SyncConfig::SEED };
        assert_eq!(SyncConfig::decode(&config.encode()), Ok(config));
    }
    assert_eq!("topk:16".parse::<Compression>(), Ok(Compression::TopK(16)));
    assert!("outer:0".parse::<SyncMode>().is_err());
    assert!("outer".parse::<SyncMode>().is_err());
    for wrong in ["fp16", "topk:0", "topk:3", "topk:8192", "topk:", "topk:-4"] {
        assert!(wrong.parse::<Compression>().is_err(), "{wrong}");
    }
    let mut bytes = SyncConfig::SEED.encode();
    bytes[5] = 29;
    assert_eq!(SyncConfig::decode(&bytes), Err(SyncError::CompressionByte(29)));
    for rule in [StepRule::Adam, StepRule::Sign { momentum: 0.999 }, StepRule::Sign { momentum: 1.0 }] {
        assert_eq!(rule.to_string().parse::<StepRule>(), Ok(rule));
    }
    assert_eq!("frozen:30".parse::<StepRule>(), Ok(StepRule::Frozen { warmup: 30 }));
    assert_eq!(StepRule::Frozen { warmup: 30 }.to_string(), "frozen:30");
    for wrong in ["sign", "sign:0", "sign:1.5", "sign:-0.5", "sign:NaN", "lion", "frozen:0", "frozen:-1", "frozen"] {
        assert!(wrong.parse::<StepRule>().is_err(), "{wrong}");
    }
}

/// The sign rule moves a weight by exactly the learning rate against its mean's sign (one f32
/// rounding of `w ∓ lr`), and not at all where the mean is zero of either sign; a member's
/// residual is scaled by the rule's momentum before its gradient is added.
#[test]
fn the_sign_rule_steps_by_the_learning_rate_and_decays_the_residual() {
    let mut w = [1.0f32, 1.0, 1.0, 1.0, 3.0e-8];
    sign_step(&mut w, &[0.25, -1e-30, 0.0, -0.0, 7.0], 0.125);
    assert_eq!(w, [0.875, 1.125, 1.0, 1.0, 3.0e-8 - 0.125]);
    // A weight far larger than the step: the subtraction rounds, once.
    let mut big = [1.0e9f32];
    sign_step(&mut big, &[1.0], 0.001);
    assert_eq!(big[0].to_bits(), (1.0e9f32 - 0.001).to_bits());
    assert_eq!(StepRule::Adam.residual_decay(), 1.0);
    let config =
        SyncConfig { compression: Compression::Int8, rule: StepRule::Sign { momentum: 0.5 }, ..SyncConfig::SEED };
    let mut strategy = Strategy::new(config, SyncState::new(&config, 100));
    let mut ramp = Ramp { step: 0, weights: vec![0.0; 100], frozen: 0 };
    let first = strategy.contribute(&mut ramp).unwrap();
    let reduced = reduce_one(first.values);
    strategy.finish(&mut ramp, &reduced.mean, &reduced.grid, true).unwrap();
    let left = strategy.state().residual.clone();
    assert!(left.iter().any(|&r| r != 0.0), "int8 leaves a residual");
    let second = strategy.contribute(&mut ramp).unwrap();
    let mut expected = Ramp::gradient_at(2);
    expected.iter_mut().zip(&left).for_each(|(g, r)| *g += 0.5 * r);
    assert_eq!(second.values, Values::Int8(pack(&expected).unwrap()));
    assert_eq!(bits(&ramp.weights[..1]), bits(&[-0.5f32 * reduced.mean[0].signum()]), "the ramp's sign step moved it");
}

/// `topk:K` keeps, in each chunk of 4,096 values, the `K` of largest magnitude — ties to the
/// lower index — packed as int8 packs them, and nothing else; a short last chunk of `K` or
/// fewer keeps all its values. What it leaves (the rest, and what packing rounded off) is the
/// member's residual: the values it sent plus the residual give back every value, exactly,
/// when the group's grid is its own.
#[test]
fn topk_keeps_the_k_largest_of_each_chunk_and_the_residual_keeps_the_rest() {
    let len = 2 * TOPK_CHUNK + 3;
    let mut x: Vec<f32> = (0..len).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4).collect();
    // Chunk 0: the largest, then three of equal magnitude and either sign for two places (the
    // lower indices take them), then a smaller one left out.
    x[10] = 0.5;
    x[20] = -0.75;
    x[50] = 0.625;
    x[30] = 0.625;
    x[40] = -0.625;
    let packed = pack_topk(&x, 3).unwrap();
    let kept = |range: std::ops::Range<usize>| -> Vec<usize> { range.filter(|&i| packed.q[i] != 0).collect() };
    assert_eq!(kept(0..TOPK_CHUNK), [20, 30, 40]);
    assert_eq!(kept(TOPK_CHUNK..2 * TOPK_CHUNK).len(), 3);
    // The last chunk's three values are all kept (at most K).
    let last = 2 * TOPK_CHUNK;
    let mut whole = x.clone();
    whole[..last].fill(0.0);
    assert_eq!(pack_topk(&whole, 3).unwrap().q[last..], pack(&x[last..]).unwrap().q[..]);
    // Of chunk 1's, none smaller than one left out.
    let chunk1 = &x[TOPK_CHUNK..2 * TOPK_CHUNK];
    let smallest_kept = kept(TOPK_CHUNK..2 * TOPK_CHUNK).iter().map(|&i| x[i].abs()).fold(f32::INFINITY, f32::min);
    let dropped = chunk1.iter().enumerate().filter(|(i, _)| packed.q[TOPK_CHUNK + i] == 0);
    assert!(dropped.map(|(_, v)| v.abs()).all(|v| v <= smallest_kept));
    // The residual on the member's own grid: what was sent plus it is x, bit for bit.
    let reduced = reduce(&[&Values::Int8(packed.clone())], &[1]);
    let left = residual(&x, &packed, &reduced.grid);
    let sent: Vec<f32> = reduced.mean.clone();
    for i in 0..len {
        assert_eq!((sent[i] + left[i]).to_bits(), x[i].to_bits(), "value {i}");
    }
    // Every K of 4096: int8 itself.
    assert_eq!(pack_topk(&x, TOPK_CHUNK).unwrap(), pack(&x).unwrap());
    assert!(pack_topk(&[1.0, f32::NAN], 1).is_err());
}

#[test]
fn pack_is_the_units_quantizer_with_empty_blocks_marked() {
    let x = [1.0f32, -0.5, 0.25, 127.0];
    let p = pack(&x).unwrap();
    // amax 127 → e = 0: the values are their own quants, rounded half to even.
    assert_eq!(p.exponents, vec![EXPONENT_BIAS as u8]);
    assert_eq!(p.q, vec![1, 0, 0, 127]);
    let zeros = pack(&[0.0, -0.0, f32::from_bits(5)]).unwrap();
    assert_eq!(zeros.exponents, vec![EMPTY_BLOCK]);
    assert_eq!(zeros.q, vec![0, 0, 0]);
    assert_eq!(pack(&[1.0, f32::NAN]), Err(NonFinite { index: 1 }));
    assert!(p.validate(127).is_ok());
    let bad = Packed { exponents: vec![EMPTY_BLOCK], q: vec![3] };
    assert_eq!(bad.validate(127), Err(SyncError::EmptyBlockNotEmpty { block: 0 }));
    assert!(Packed { exponents: vec![1], q: vec![i8::MIN] }.validate(127).is_err());
    assert_eq!(
        Packed { exponents: vec![1], q: vec![7, -8] }.validate(INT4_LIMIT),
        Err(SyncError::QuantRange { index: 1, quant: -8 })
    );
}

#[test]
fn every_schedule_gives_the_same_bits() {
    let len = 7 * BLOCK * 5 + 13; // a short last block, chunks of unequal size
    let xs: Vec<Vec<f32>> = (0..5).map(|s| contribution(s, len)).collect();
    let packed: Vec<Packed> = xs.iter().map(|x| pack(x).unwrap()).collect();
    let refs: Vec<&Packed> = packed.iter().collect();
    let direct = sum_direct(&refs);
    assert_eq!(schedules::sum_by_owners(&refs), direct);
    for first in 0..5 {
        assert_eq!(schedules::sum_ring(&refs, first), direct);
    }
    let mut reversed = refs.clone();
    reversed.reverse();
    assert_eq!(sum_direct(&reversed), direct);
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(mean(&direct.1, &direct.0, 5)), bits(mean(&sum_direct(&reversed).1, &direct.0, 5)));
    // The grids really differ between members (otherwise the test would prove little).
    assert!(packed.iter().any(|p| p.exponents != direct.0));
    // Whereas f32 addition in another order is another result on these very values.
    let f32_sum = |order: &[usize]| -> Vec<u32> {
        (0..len).map(|k| order.iter().fold(0f32, |s, &i| s + xs[i][k]).to_bits()).collect()
    };
    assert_ne!(f32_sum(&[0, 1, 2, 3, 4]), f32_sum(&[4, 3, 2, 1, 0]));
}

#[test]
fn terms_round_to_the_grid_half_to_even_and_the_mean_is_exact_where_it_can_be() {
    // Block A has e = 0 (amax 127); block B's quants sit 2 exponents below.
    let a = Packed { exponents: vec![EXPONENT_BIAS as u8], q: vec![127, 2, -6, 1] };
    let b = Packed { exponents: vec![(EXPONENT_BIAS - 2) as u8], q: vec![6, 10, 2, -2] };
    let (grid, sum) = sum_direct(&[&a, &b]);
    assert_eq!(grid, vec![EXPONENT_BIAS as u8]);
    // 6/4 = 1.5 → 2; 10/4 = 2.5 → 2; 2/4 = 0.5 → 0; -2/4 = -0.5 → -0.
    assert_eq!(sum, vec![129, 4, -6, 1]);
    assert_eq!(mean(&sum, &grid, 2), vec![64.5, 2.0, -3.0, 0.5]);
    // What the group did not take of b stays with b.
    let x = [1.5f32, 2.5, 0.5, -0.5];
    assert_eq!(residual(&x, &b, &grid), vec![-0.5, 0.5, 0.5, -0.5]);
}

#[test]
fn error_feedback_carries_what_a_small_member_loses() {
    // A member whose values sit far below the others' grid contributes nothing at once, but
    // its residual grows until the group takes it: over many syncs the sum of what was taken
    // tracks the sum of what was offered.
    let taken_total = taken_from_a_small_member(pack);
    assert!((taken_total - 300.0).abs() <= 1.0, "{taken_total}");
}

/// Over 1000 syncs with a member of 100s, what the group took of a member offering 0.3 a
/// sync (its first value), each packed by `pack` with error feedback.
fn taken_from_a_small_member(pack: fn(&[f32]) -> Result<Packed, NonFinite>) -> f64 {
    let (big, small) = ([100.0f32; BLOCK], [0.3f32; BLOCK]);
    let q_big = pack(&big).unwrap();
    let mut r = vec![0f32; BLOCK];
    let mut taken_total = 0f64;
    for _ in 0..1000 {
        let x: Vec<f32> = small.iter().zip(&r).map(|(a, b)| a + b).collect();
        let p = pack(&x).unwrap();
        let grid = group_grid([&q_big, &p]);
        let mut mine = vec![0i32; BLOCK];
        on_grid(&p, &grid, 0..BLOCK, &mut mine);
        taken_total += f64::from(mine[0]) * pow2(i32::from(grid[0]) - EXPONENT_BIAS);
        r = residual(&x, &p, &grid);
    }
    taken_total
}

/// int4 is int8's quants on a grid 16 times coarser, rounded half to even and clamped to
/// `[-7, 7]`; every schedule sums it to the same bits; error feedback carries what it drops
/// (a value of 0.3 in a block of 100s is taken in full over many syncs).
#[test]
fn int4_is_int8_on_a_coarser_grid_and_error_feedback_keeps_what_it_drops() {
    let len = 7 * BLOCK * 3 + 5;
    let x = contribution(2, len);
    let (p8, p4) = (pack(&x).unwrap(), pack4(&x).unwrap());
    p4.validate(INT4_LIMIT).expect("int4 quants");
    for (block, (&e8, &e4)) in p8.exponents.iter().zip(&p4.exponents).enumerate() {
        let end = ((block + 1) * BLOCK).min(len);
        if e8 == EMPTY_BLOCK {
            assert_eq!(e4, EMPTY_BLOCK);
            continue;
        }
        assert_eq!(e4, e8 + 4);
        for (&q8, &q4) in p8.q[block * BLOCK..end].iter().zip(&p4.q[block * BLOCK..end]) {
            // Written out: nearest multiple of 16, ties to the even multiple, then clamped.
            let (low, rem) = (i32::from(q8).div_euclid(16), i32::from(q8).rem_euclid(16));
            let nearest = if rem > 8 || (rem == 8 && low % 2 != 0) { low + 1 } else { low };
            assert_eq!(i32::from(q4), nearest.clamp(-7, 7), "q8 {q8}");
        }
    }
    let xs: Vec<Vec<f32>> = (0..4).map(|s| contribution(s, len)).collect();
    let packed: Vec<Packed> = xs.iter().map(|x| pack4(x).unwrap()).collect();
    let refs: Vec<&Packed> = packed.iter().collect();
    let direct = sum_direct(&refs);
    assert_eq!(schedules::sum_by_owners(&refs), direct);
    assert_eq!(schedules::sum_ring(&refs, 2), direct);
    let taken_total = taken_from_a_small_member(pack4);
    assert!((taken_total - 300.0).abs() <= 8.0, "{taken_total}");
}

/// A group of one reduced by value is the group reduced by reference, bit for bit.
#[test]
fn reduce_one_is_reduce_of_one() {
    let x = contribution(3, 5 * BLOCK + 7);
    for values in [Values::F32(x.clone()), Values::Int8(pack(&x).unwrap())] {
        let by_ref = reduce(&[&values], &[1]);
        let by_value = reduce_one(values);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&by_value.mean), bits(&by_ref.mean));
        assert_eq!(by_value.grid, by_ref.grid);
    }
}

#[test]
fn the_outer_step_is_nesterov_in_f32() {
    let opt = OuterOptimizer { lr: 0.5, momentum: 0.5 };
    let mut w = vec![1.0f32, 2.0];
    let mut m = vec![0.0f32, 1.0];
    opt.step(&mut w, &mut m, &[0.5, -1.0]);
    // m = 0.5·0 + 0.5 = 0.5, w = 1 − 0.5·(0.5 + 0.25) = 0.625;
    // m = 0.5·1 − 1 = −0.5, w = 2 − 0.5·(−1 − 0.25) = 2.625.
    assert_eq!(m, vec![0.5, -0.5]);
    assert_eq!(w, vec![0.625, 2.625]);
}

/// A member whose step is plain arithmetic on its weights: cheap, deterministic, and
/// different at every step (step `k` of weight `i`: `w·0.9375 + (k + i)/64`). Step
/// `fail_at` fails instead.
struct Toy {
    weights: Vec<f32>,
    step: u32,
    steps: u32,
    fail_at: Option<u32>,
    /// Elastic windows: each window ends after this many of its steps.
    hurry_after: Option<u32>,
}

impl Toy {
    fn new(steps: u32) -> Toy {
        Toy {
            weights: (0..40).map(|i| 0.25 + i as f32 / 8.0).collect(),
            step: 0,
            steps,
            fail_at: None,
            hurry_after: None,
        }
    }
}

/// What one toy step does to `w` at step `k` (the statement the test compares with).
fn toy_step(w: &mut [f32], k: u32) {
    for (i, w) in w.iter_mut().enumerate() {
        *w = *w * 0.9375 + (k as usize + i) as f32 / 64.0;
    }
}

impl Member for Toy {
    fn gradient(&mut self) -> Result<(f32, Vec<f32>), ComputeError> {
        unreachable!("outer:H asks for steps, not gradients")
    }
    fn apply(&mut self, _grad: &[f32]) -> Result<(), ComputeError> {
        unreachable!("outer:H asks for steps, not updates")
    }
    fn apply_by_rule(&mut self, _rule: StepRule, _mean: &[f32]) {
        unreachable!("outer:H asks for steps, not updates")
    }
    fn steps_done(&self) -> u32 {
        self.step
    }
    fn step_alone(&mut self) -> Result<f32, ComputeError> {
        if self.fail_at == Some(self.step + 1) {
            return Err(ComputeError::backend(std::io::Error::other("the toy's step fails")));
        }
        self.step += 1;
        toy_step(&mut self.weights, self.step);
        Ok(self.step as f32)
    }
    fn weights(&mut self) -> &mut Vec<f32> {
        &mut self.weights
    }
    fn rewind(&mut self, steps: u32) {
        self.step -= steps;
    }
    fn steps_left(&self) -> u32 {
        self.steps - self.step
    }
    fn hurried(&self, done: u32) -> bool {
        self.hurry_after.is_some_and(|h| done >= h)
    }
    fn skip(&mut self, steps: u32) {
        self.step += steps;
    }
}

fn outer(h: u32, overlap: u32) -> SyncConfig {
    let outer = OuterOptimizer { lr: 0.75, momentum: 0.5 };
    SyncConfig {
        mode: SyncMode::Outer { inner_steps: h },
        compression: Compression::None,
        outer,
        overlap,
        elastic: false,
        rule: StepRule::Adam,
        exchange: Exchange::Mesh,
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `outer:4` with an overlap of 2, a group of one for three windows, against the
/// arithmetic `Strategy`'s docs state, written out here: the first window is 4 steps from
/// the start; each later one is 2 steps run ahead from where the last ended, then moved
/// onto the new global weights (`G − (L − W)`), then 2 more; its contribution is `G` minus
/// where it ends. The last window runs nothing ahead.
#[test]
fn an_overlapped_window_moves_its_early_steps_onto_the_groups_weights() {
    let config = outer(4, 2);
    let mut strategy = Strategy::new(config, SyncState::new(&config, 40));
    let mut toy = Toy::new(12);
    let mut global = toy.weights.clone();
    let mut momentum = vec![0f32; 40];
    let mut local = global.clone();
    let mut k = 0;
    for window in 0..3 {
        let begin = k;
        while k < begin + 4 - if window == 0 { 0 } else { 2 } {
            k += 1;
            toy_step(&mut local, k);
        }
        let delta: Vec<f32> = global.iter().zip(&local).map(|(g, l)| g - l).collect();
        let contribution = strategy.contribute(&mut toy).unwrap();
        assert_eq!(contribution.values, Values::F32(delta.clone()), "window {window}");
        // The mean of a group of one is its contribution (`x / 1` is `x`).
        strategy.run_ahead(&mut toy).unwrap();
        strategy.finish(&mut toy, &delta, &[], true).unwrap();
        for ((w, m), d) in global.iter_mut().zip(&mut momentum).zip(&delta) {
            *m = 0.5 * *m + d;
            *w -= 0.75 * (d + 0.5 * *m);
        }
        if window < 2 {
            let anchor = local.clone();
            for _ in 0..2 {
                k += 1;
                toy_step(&mut local, k);
            }
            for ((l, g), a) in local.iter_mut().zip(&global).zip(&anchor) {
                *l = g - (a - *l);
            }
            let (held, ahead) = strategy.global().expect("the group's weights, kept apart");
            assert_eq!((bits(held), ahead), (bits(&global), 2));
        } else {
            local = global.clone();
            assert!(strategy.global().is_none(), "the run's last window runs nothing ahead");
        }
        assert_eq!(bits(&toy.weights), bits(&local), "window {window}");
        assert_eq!(toy.step, k);
    }
    assert_eq!(toy.step, 12);
}

/// Elastic windows (`outer:4`): a member hurried after 2 of its steps contributes `G` minus
/// where those 2 steps ended, weighs 2, and passes over the window's other 2 steps (its step
/// count is the window's end, its weights stay where the 2 steps left them); a member that
/// is never hurried runs all 4 and weighs 4. The loss is the mean of the steps taken.
#[test]
fn an_elastic_window_ends_when_hurried_and_weighs_its_steps() {
    let config = SyncConfig { elastic: true, compression: Compression::Int8, ..outer(4, 0) };
    let mut toy = Toy { hurry_after: Some(2), ..Toy::new(8) };
    let mut strategy = Strategy::new(config, SyncState::new(&config, 40));
    let global = toy.weights.clone();
    let mut local = global.clone();
    toy_step(&mut local, 1);
    toy_step(&mut local, 2);
    let delta: Vec<f32> = global.iter().zip(&local).map(|(g, l)| g - l).collect();
    let contribution = strategy.contribute(&mut toy).unwrap();
    assert_eq!(contribution.weight, 2);
    assert_eq!(contribution.values, Values::Int8(pack(&delta).unwrap()), "the residual starts at 0");
    assert_eq!(contribution.loss, (1.0 + 2.0) / 2.0);
    assert_eq!((toy.step, bits(&toy.weights)), (4, bits(&local)));
    // Not hurried: the whole window.
    let mut whole = Toy::new(8);
    let mut strategy = Strategy::new(config, SyncState::new(&config, 40));
    let contribution = strategy.contribute(&mut whole).unwrap();
    assert_eq!((contribution.weight, whole.step), (4, 4));
    // Hurried from the start: one step is the least a window takes.
    let mut eager = Toy { hurry_after: Some(0), ..Toy::new(8) };
    let contribution = Strategy::new(config, SyncState::new(&config, 40)).contribute(&mut eager).unwrap();
    assert_eq!((contribution.weight, eager.step), (1, 4));
    // Without elastic windows a hurry is never asked about: every contribution weighs 1.
    let plain = SyncConfig { elastic: false, ..config };
    let mut toy = Toy { hurry_after: Some(2), ..Toy::new(8) };
    let contribution = Strategy::new(plain, SyncState::new(&plain, 40)).contribute(&mut toy).unwrap();
    assert_eq!((contribution.weight, toy.step), (1, 4));
}

/// The weighted mean, written out on values the int8 grid holds exactly: weights 1 and 3
/// give `(1·a + 3·b) / 4`; weights 2 and 6 are the same weights (lowest terms); equal
/// weights give the plain mean's bits, f32 ones too.
#[test]
fn contributions_are_weighed_by_their_steps() {
    let a = Values::Int8(pack(&[1.0, 2.0, 0.0, -4.0]).unwrap());
    let b = Values::Int8(pack(&[3.0, -1.0, 0.5, 4.0]).unwrap());
    let weighted = reduce(&[&a, &b], &[1, 3]);
    assert_eq!(weighted.mean, [2.5, -0.25, 0.375, 2.0]);
    assert_eq!(reduce(&[&a, &b], &[2, 6]), weighted);
    assert_eq!(lowest_terms(&[2, 6, 4]), [1, 3, 2]);
    assert_eq!(lowest_terms(&[5, 5]), [1, 1]);
    let plain = reduce(&[&a, &b], &[1, 1]);
    assert_eq!(reduce(&[&a, &b], &[7, 7]), plain);
    assert_eq!(plain.mean, [2.0, 0.5, 0.25, 0.0]);
    let (fa, fb) = (Values::F32(vec![1.0, 2.0]), Values::F32(vec![3.0, -1.0]));
    assert_eq!(reduce(&[&fa, &fb], &[4, 4]).mean, [2.0, 0.5]);
}

/// f32 contributions are never weighed: a run refuses elastic windows with them, and
/// `reduce` refuses unequal weights on them rather than define a mean nothing uses.
#[test]
#[should_panic(expected = "f32 contributions are never weighed")]
fn f32_contributions_of_unequal_weights_are_a_bug() {
    let (fa, fb) = (Values::F32(vec![1.0, 2.0]), Values::F32(vec![3.0, -1.0]));
    reduce(&[&fa, &fb], &[1, 3]);
}

/// One sync of a group of one, step by step: contribute, (run ahead,) finish with the
/// contribution as the mean.
fn sync_by_hand(strategy: &mut Strategy, toy: &mut Toy, run_ahead: bool) {
    let Contribution { values, .. } = strategy.contribute(toy).unwrap();
    if run_ahead {
        strategy.run_ahead(toy).unwrap();
    }
    let mean = reduce_one(values).mean;
    strategy.finish(toy, &mean, &[], true).unwrap();
}

/// With no overlap, running ahead does nothing: the windows are plain `outer:H`'s (never
/// run ahead), bit for bit; `alone` with an overlap is `contribute`, `run_ahead`, `finish`.
#[test]
fn no_overlap_is_plain_outer_and_alone_runs_ahead_too() {
    let (plain, ahead) = (outer(4, 0), outer(4, 3));
    let strategy = |config: SyncConfig| (Strategy::new(config, SyncState::new(&config, 40)), Toy::new(12));
    let (mut never, mut toy_never) = strategy(plain);
    let (mut a, mut toy_a) = strategy(plain);
    let (mut b, mut toy_b) = strategy(ahead);
    let (mut c, mut toy_c) = strategy(ahead);
    for _ in 0..3 {
        sync_by_hand(&mut never, &mut toy_never, false);
        sync_by_hand(&mut a, &mut toy_a, true);
        b.alone(&mut toy_b).unwrap();
        sync_by_hand(&mut c, &mut toy_c, true);
    }
    assert_eq!(bits(&toy_a.weights), bits(&toy_never.weights));
    assert_eq!((toy_a.step, toy_never.step), (12, 12));
    assert_eq!(bits(&toy_b.weights), bits(&toy_c.weights));
    // Three windows of the same toy: the overlap changed the arithmetic.
    assert_ne!(bits(&toy_a.weights), bits(&toy_b.weights));
}

/// A step that fails while running ahead puts the member back where it contributed from;
/// one that fails after the mean puts it back to the group's weights and the sync's step.
#[test]
fn a_failed_step_ahead_or_after_the_mean_rewinds_to_the_sync() {
    let config = outer(4, 2);
    let mut strategy = Strategy::new(config, SyncState::new(&config, 40));
    let mut toy = Toy::new(12);
    let Contribution { values, .. } = strategy.contribute(&mut toy).unwrap();
    let ended = toy.weights.clone();
    toy.fail_at = Some(6);
    assert!(strategy.run_ahead(&mut toy).is_err());
    assert_eq!((toy.step, bits(&toy.weights)), (4, bits(&ended)));
    toy.fail_at = None;
    strategy.run_ahead(&mut toy).unwrap();
    strategy.finish(&mut toy, &reduce_one(values).mean, &[], true).unwrap();
    let group = strategy.global().unwrap().0.to_vec();
    toy.fail_at = Some(7);
    assert!(strategy.contribute(&mut toy).is_err());
    assert_eq!((toy.step, bits(&toy.weights)), (4, bits(&group)));
}

/// An `every-step` member whose gradient at step `k` is a fixed function of `k`.
struct Ramp {
    step: u32,
    weights: Vec<f32>,
    /// Steps ended by the frozen rule.
    frozen: u32,
}

impl Ramp {
    fn gradient_at(k: u32) -> Vec<f32> {
        (0..100).map(|i| ((i * 7 + k as usize * 13) % 23) as f32 / 9.0 - 1.2 + k as f32 * 1e-3).collect()
    }
}

impl Member for Ramp {
    fn gradient(&mut self) -> Result<(f32, Vec<f32>), ComputeError> {
        self.step += 1;
        Ok((1.0, Ramp::gradient_at(self.step)))
    }
    fn apply(&mut self, _grad: &[f32]) -> Result<(), ComputeError> {
        Ok(())
    }
    fn apply_by_rule(&mut self, rule: StepRule, mean: &[f32]) {
        match rule {
            StepRule::Sign { .. } => crate::sync::sign_step(&mut self.weights, mean, 0.5),
            _ => self.frozen += 1,
        }
    }
    fn steps_done(&self) -> u32 {
        // `gradient` counted the step it is taking.
        self.step.saturating_sub(1)
    }
    fn weights(&mut self) -> &mut Vec<f32> {
        &mut self.weights
    }
    fn rewind(&mut self, _steps: u32) {}
    fn steps_left(&self) -> u32 {
        u32::MAX
    }
    fn skip(&mut self, _steps: u32) {}
}

/// A packed contribution is a function of public data and the state it names: `repack` of its
/// gradient and that state gives its values, and the residual it leaves on the group's grid is
/// the state the next contribution names — a link an auditor checks. A forged residual still
/// repacks to what was sent (the contribution is consistent with the state it names) but
/// breaks the link.
#[test]
fn a_packed_contribution_repacks_from_the_state_it_names_and_the_next_names_what_it_left() {
    let sign = StepRule::Sign { momentum: 0.5 };
    let rules = [(Compression::Int8, StepRule::Adam), (Compression::Int4, StepRule::Adam)];
    let frozen = StepRule::Frozen { warmup: 3 };
    let rules = rules.into_iter().chain([(Compression::TopK(8), StepRule::Adam), (Compression::TopK(8), sign)]);
    for (compression, rule) in rules.chain([(Compression::TopK(8), frozen)]) {
        let config = SyncConfig { compression, rule, ..SyncConfig::SEED };
        let mut strategy = Strategy::new(config, SyncState::new(&config, 100));
        let mut ramp = Ramp { step: 0, weights: vec![0.0; 100], frozen: 0 };
        // Another member's contribution, larger in some blocks: the grid is not ours alone.
        let big: Vec<f32> = (0..100).map(|i| if i < 40 { 30.0 } else { 0.01 }).collect();
        let other = match compression {
            Compression::Int4 => Values::Int4(pack4(&big).unwrap()),
            _ => Values::Int8(pack(&big).unwrap()),
        };
        let mut left: Option<Vec<f32>> = None;
        for k in 1..=6u32 {
            if k == 4 {
                strategy.tamper(Some(Tamper::ForgeResidual(2.0)));
            }
            let contribution = strategy.contribute(&mut ramp).unwrap();
            let state = contribution.state.clone().expect("a packed contribution names its state");
            let linked = left.as_ref().map(|l| bits(l) == bits(&state));
            assert_eq!(linked, (k > 1).then_some(k != 4), "k = {k}");
            let reduced = reduce(&[&contribution.values, &other], &[1, 1]);
            let again = repack(Ramp::gradient_at(k), &state, &config, k - 1, &reduced.grid, None).unwrap();
            assert_eq!(again.values, contribution.values, "k = {k}");
            if rule == frozen {
                // Dense through the warm-up, then the pick of 8.
                let Values::Int8(packed) = &contribution.values else { panic!("topk travels as int8") };
                let sent = packed.q.iter().filter(|&&q| q != 0).count();
                assert_eq!(sent > 8, k <= 3, "k = {k}: {sent} values sent");
            }
            strategy.finish(&mut ramp, &reduced.mean, &reduced.grid, true).unwrap();
            left = again.next_state;
            strategy.tamper(None);
        }
        assert_eq!(ramp.frozen, if rule == frozen { 3 } else { 0 }, "{rule}");
    }
    let f32_contribution = Strategy::new(SyncConfig::SEED, SyncState::default())
        .contribute(&mut Ramp { step: 0, weights: Vec::new(), frozen: 0 })
        .unwrap();
    assert_eq!(f32_contribution.state, None, "f32 contributions have no private state");
}
