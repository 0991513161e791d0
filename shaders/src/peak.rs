//! The path-ceiling kernels (`peak.wgsl`, `peak_tc.wgsl`): their sizes, and what each computes,
//! word for word, on the host.
//!
//! A ceiling is a rate, and a rate is only as true as the work behind it: a driver may drop any
//! instruction whose result nobody reads. So every operation these kernels count reaches their
//! output, and [`peak_words`] and [`peak_tc_words`] compute that output here, in plain integer
//! arithmetic; `time_peak` compares a workgroup's output with them before it reports a rate, and
//! a test does the same on lavapipe. A rate can then be no higher than what the counted
//! operations, all of them done, took.

/// `peak.wgsl`: rounds of eight `dot4`s an invocation runs, and its workgroup width.
pub const PEAK_ITERATIONS: u32 = 1024;
pub const PEAK_WORKGROUP: u32 = 256;
/// `peak_tc.wgsl`: calls of `tc_peak` a subgroup makes, subgroups a workgroup, and the
/// cooperative multiply-adds one call makes (the `tc` plugin's spliced body), spread over the
/// four accumulators in turn.
pub const PEAK_CALLS: u32 = 64;
pub const PEAK_TC_SUBGROUPS: u32 = 4;
pub const PEAK_TC_MULADDS: u32 = 64;
/// `peak_tc.wgsl`: the mask of a region's first words. Bytes below 32 keep every accumulator
/// inside i32 through all `PEAK_CALLS` calls (each call adds at most `16 · fk · 128²` to an
/// element: 2^29 in 64 calls at `fk` = 32), so the result never depends on how a driver treats
/// overflow ([`peak_tc_words`] checks it).
pub const PEAK_SEED_MASK: u32 = 0x1f1f_1f1f;

/// The largest `fk` a cooperative shape may have (k's block of 32 must be whole fragments).
const MAX_FK: u32 = 32;
const _: () = assert!(
    (PEAK_SEED_MASK as u64) + PEAK_CALLS as u64 * (PEAK_TC_MULADDS as u64 / 4) * MAX_FK as u64 * 128 * 128
        <= i32::MAX as u64
);

/// The sign-extended bytes of a word, lowest first.
fn bytes(word: u32) -> [i32; 4] {
    word.to_le_bytes().map(|b| i32::from(b as i8))
}

fn dot4(a: u32, b: u32) -> i32 {
    bytes(a).iter().zip(bytes(b)).map(|(x, y)| x * y).sum()
}

/// What workgroup `workgroup` of `peak.wgsl` writes: one word an invocation, `PEAK_WORKGROUP`
/// words (`dot4` is the same exact product through DP4A or the table).
pub fn peak_words(workgroup: u32) -> Vec<u32> {
    (0..PEAK_WORKGROUP)
        .map(|local| {
            let s = (workgroup * PEAK_WORKGROUP + local).wrapping_mul(2_654_435_761);
            let mut a = [
                0x1111_1111u32,
                0x2222_2222,
                0x3333_3333,
                0x4444_4444,
                0x5555_5555,
                0x6666_6666,
                0x7777_7777,
                0x0102_0304,
            ]
            .map(|x| (s ^ x) as i32);
            let b = ((s >> 3) | 0x0101_0101) & 0x7f7f_7f7f;
            for _ in 0..PEAK_ITERATIONS {
                for x in &mut a {
                    *x = dot4(*x as u32, b).wrapping_add(*x);
                }
            }
            a.iter().fold(0, |folded, &x| folded ^ x) as u32
        })
        .collect()
}

/// What workgroup `workgroup` of `peak_tc.wgsl`, its `tc_peak` spliced for the cooperative shape
/// `fm × fn_ × fk` on subgroups of `subgroup`, writes: one word an invocation.
pub fn peak_tc_words(fm: u32, fn_: u32, fk: u32, subgroup: u32, workgroup: u32) -> Vec<u32> {
    let (acc, threads) = ((fm * fn_) as usize, (PEAK_TC_SUBGROUPS * subgroup) as usize);
    let region = 4 * acc;
    let (fm, fn_, fk) = (fm as usize, fn_ as usize, fk as usize);
    let mut tile: Vec<u32> = (0..PEAK_TC_SUBGROUPS as usize * region)
        .map(|w| ((w as u32).wrapping_add(workgroup)).wrapping_mul(2_654_435_761) & PEAK_SEED_MASK)
        .collect();
    let byte = |tile: &[u32], word: usize, k: usize| bytes(tile[word + k / 4])[k % 4];
    for at in (0..tile.len()).step_by(region) {
        for _ in 0..PEAK_CALLS {
            // A: row-major from the first accumulator's words, rows fk/4 words apart; B:
            // column-major from the second's, columns fk/4 words apart.
            let product: Vec<i64> = (0..fm * fn_)
                .map(|e| {
                    let (i, j) = (e / fn_, e % fn_);
                    (0..fk)
                        .map(|k| {
                            i64::from(byte(&tile, at + i * fk / 4, k))
                                * i64::from(byte(&tile, at + acc + j * fk / 4, k))
                        })
                        .sum()
                })
                .collect();
            for j in 0..4 {
                for (e, &p) in product.iter().enumerate() {
                    let word = &mut tile[at + j * acc + e];
                    let sum = i64::from(*word as i32) + i64::from(PEAK_TC_MULADDS / 4) * p;
                    let sum = i32::try_from(sum).expect("PEAK_SEED_MASK keeps the accumulators inside i32");
                    *word = sum as u32;
                }
            }
        }
    }
    (0..threads).map(|t| tile.iter().skip(t).step_by(threads).fold(0, |folded, &w| folded ^ w)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_models_fold_every_counted_operation_into_the_output() {
        // The models are checked against the kernels themselves on lavapipe (the conformance
        // suite's `times_its_product_path`); here, that each workgroup's words are its own.
        assert_eq!(peak_words(0).len(), PEAK_WORKGROUP as usize);
        assert_ne!(peak_words(0), peak_words(1));
        let lavapipe = peak_tc_words(8, 8, 8, 8, 0);
        assert_eq!(lavapipe.len(), (PEAK_TC_SUBGROUPS * 8) as usize);
        assert_ne!(lavapipe, peak_tc_words(8, 8, 8, 8, 1));
        assert_eq!(peak_tc_words(16, 16, 32, 32, 3).len(), 128);
    }

    #[test]
    fn dot4_sign_extends_each_byte() {
        assert_eq!(dot4(0x0000_00ff, 0x0000_00ff), 1);
        assert_eq!(dot4(0x8080_8080, 0x8080_8080), 4 * 128 * 128);
        assert_eq!(dot4(0x7f7f_7f7f, 0x8181_8181), -4 * 127 * 127);
        assert_eq!(dot4(0x0102_0304, 0x0101_0101), 10);
    }
}
