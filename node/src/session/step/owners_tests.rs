use super::*;

use crate::session::log::Named;
use crate::sync::{Exchange, SyncMode};

const LEN: usize = 97 * BLOCK + 5;

fn int8() -> SyncConfig {
    SyncConfig { compression: Compression::Int8, exchange: Exchange::Owners, ..SyncConfig::SEED }
}

fn packed(step: u32, seed: u64) -> Gradient {
    let mut rng = lockstep_luts::rng::SplitMix64::new(seed);
    let x: Vec<f32> = (0..LEN).map(|i| rng.next_signed_unit() * (1 + i % 7) as f32).collect();
    let values = Values::Int8(sync::pack(&x).unwrap());
    Gradient { step, whash: 9, phash: 7, loss: seed as f32, values, weight: 1, state: 0 }
}

fn record(gradients: &[(PeerId, &Gradient)]) -> StepRecord {
    let contributions =
        gradients.iter().map(|(peer, g)| Named { peer: *peer, digest: g.digest(), weight: 1 }).collect();
    StepRecord { step: gradients[0].1.step, whash: 9, contributions }
}

/// One member of three holding the others by header and its own chunk, with the other two
/// owners' sums: the record's mean is the bits of summing the whole contributions; a sum
/// refused or missing is said, and summed here once the chunk's values are here.
#[test]
fn a_record_summed_from_owners_sums_has_the_bits_of_the_whole_sum() {
    assert_eq!(int8().mode, SyncMode::EveryStep);
    let gradients: Vec<Gradient> = (1..=3).map(|s| packed(4, 40 + s)).collect();
    let peers = [10, 20, 30];
    let named: Vec<(PeerId, &Gradient)> = peers.iter().copied().zip(&gradients).collect();
    let record = record(&named);
    let mut whole = Contributions::new(LEN, &int8());
    for (p, g) in &named {
        assert_eq!(whole.offer(*p, (*g).clone()), Offer::Accepted);
    }
    let expected = whole.reduce(&record).unwrap();
    // Member 20 owns chunk 1 of 3: its own contribution whole, the others' headers and
    // chunks.
    let mut member = Contributions::new(LEN, &int8());
    let pieces = owners::owned_pieces(3, 1);
    for (p, g) in &named {
        if *p == 20 {
            assert_eq!(member.offer(20, (*g).clone()), Offer::Accepted);
        } else {
            assert_eq!(member.offer_header(*p, g.header()), Offer::Accepted);
            let chunk = Chunk::of(g, *p, pieces.clone());
            assert_eq!(member.offer_chunk(chunk.clone()), ChunkOffer::Accepted);
            assert_eq!(member.offer_chunk(chunk), ChunkOffer::Duplicate);
        }
    }
    assert!(member.holds(&record) && member.reduce(&record).is_none(), "no whole values of the others");
    let lacking = member.reduce_owned(&record, 3).unwrap_err();
    assert_eq!(lacking, Lacking { chunks: vec![0, 2], refused: Vec::new() });
    // The other owners' sums, as they form them (from their own wholes and the chunks).
    let sum_of = |c: usize| whole.chunk_sum(&record, owners::chunk(LEN, 3, c)).unwrap();
    let bytes = |c: usize| sum_of(c).encode(i8::MAX, 3);
    // A sum cut short is refused and said; the chunk still lacks.
    let mut short = bytes(0);
    short.pop();
    assert!(member.offer_sum(4, record.digest(), 0, 10, short, true));
    let lacking = member.reduce_owned(&record, 3).unwrap_err();
    assert!(matches!(lacking.refused[..], [(0, 10, ChunkSumError::Truncated { .. })]), "{lacking:?}");
    assert!(member.offer_sum(4, record.digest(), 0, 10, bytes(0), true));
    assert!(member.offer_sum(4, record.digest(), 2, 30, bytes(2), true));
    let (reduced, loss) = member.reduce_owned(&record, 3).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&reduced.mean), bits(&expected.0.mean));
    assert_eq!((reduced.grid, loss.to_bits()), (expected.0.grid, expected.1.to_bits()));
    assert_eq!(member.grid_of(4), Some(&whole.reduce(&record).unwrap().0.grid));
    // A sum from another than its owner is dropped, unless that one was asked of anyone;
    // its owner's replaces it, and is not replaced.
    let mut other = Contributions::new(LEN, &int8());
    assert!(other.offer_sum(4, record.digest(), 1, 99, vec![7], false));
    assert_eq!(other.drop_unsent(&record, &peers, &[1]), Vec::new());
    assert_eq!(other.sum_from(4, record.digest(), 1), Some(99));
    assert!(other.offer_sum(4, record.digest(), 1, 20, bytes(1), true), "the owner's replaces it");
    assert!(!other.offer_sum(4, record.digest(), 1, 98, vec![7], false), "and is kept");
    assert_eq!(other.drop_unsent(&record, &peers, &[]), Vec::new());
    assert_eq!(other.sum_bytes(4, record.digest(), 1), Some(&bytes(1)));
    assert!(other.offer_sum(4, record.digest(), 0, 99, vec![7], false));
    assert_eq!(other.drop_unsent(&record, &peers, &[]), vec![(0, 99)]);
    assert!(!other.has_sum(4, record.digest(), 0));
    assert!(!other.offer_sum(4, record.digest(), 2, 30, vec![0; 10 * LEN], true), "longer than any sum");
}

/// A chunk is taken only of a contribution held by its header, and only as the header
/// names its pieces; a part past the run's bound is summed as empty, by whoever sums it.
#[test]
fn chunks_are_checked_against_their_header_and_a_part_out_of_bound_sums_as_empty() {
    let mut c = Contributions::new(LEN, &int8());
    let g = packed(2, 7);
    // A chunk before its header is held until the header comes, then taken.
    let chunk = Chunk::of(&g, 5, 0..32);
    assert_eq!(c.offer_chunk(chunk.clone()), ChunkOffer::NoHeader);
    assert_eq!(c.early_authors(2), vec![5]);
    assert_eq!(c.offer_header(5, g.header()), Offer::Accepted);
    assert!(c.early_authors(2).is_empty());
    assert_eq!(c.offer_chunk(chunk), ChunkOffer::Duplicate);
    let mut wrong = Chunk::of(&g, 5, 32..64);
    if let Values::Int8(p) = &mut wrong.values {
        p.q[3] = if p.q[3] == 1 { 2 } else { 1 };
    }
    assert_eq!(c.offer_chunk(wrong), ChunkOffer::NotNamed);
    assert!(c.whole_of(2, 5).is_none(), "half of it is here");
    assert!(!c.holds_whole(2, 5), "half of it is here");
    // What is held, told without copying it: as `chunk_of` finds it.
    for pieces in [0..32, 3..9, 0..33, 32..64, 0..64] {
        let held = c.chunk_of(2, 5, pieces.clone()).is_some();
        assert_eq!(c.holds_part(2, 5, pieces.clone()), held, "{pieces:?}");
        assert_eq!(held, pieces.end <= 32, "{pieces:?}");
    }
    assert!(!c.holds_part(2, 6, 0..1) && !c.holds_part(3, 5, 0..1), "another author, another step");
    assert_eq!(c.lacking_part(&record(&[(5, &g)]), 0..BLOCK), Vec::<PeerId>::new());
    assert_eq!(c.lacking_part(&record(&[(5, &g)]), 0..LEN), vec![5]);
    assert_eq!(c.offer_chunk(Chunk::of(&g, 5, 0..64)), ChunkOffer::Accepted);
    assert_eq!(c.whole_of(2, 5), Some(g.clone()), "all of it, from the chunk of every piece");
    assert!(c.holds_whole(2, 5), "all of it, from the chunk of every piece");
    // An f32 contribution whole is all here, though no part of it is a chunk.
    let mut f32s = Contributions::new(LEN, &SyncConfig::SEED);
    let values = Values::F32(vec![0.5; LEN]);
    let plain = Gradient { step: 2, whash: 9, phash: 7, loss: 1.0, values, weight: 1, state: 0 };
    assert_eq!(f32s.offer(5, plain), Offer::Accepted);
    assert!(f32s.holds_whole(2, 5) && !f32s.holds_part(2, 5, 0..1) && !f32s.holds_whole(2, 6));
    assert_eq!(c.lacking_part(&record(&[(5, &g)]), 0..LEN), Vec::<PeerId>::new());
    // The whole one fills the header (a repair), and is then served whole.
    assert_eq!(c.offer(5, g.clone()), Offer::Filled);
    assert!(c.get(2, 5).unwrap().whole.is_some());
    // A block of huge values: that block is summed as empty by whoever sums it, however the
    // values are cut into chunks.
    let mut x = vec![0.5f32; LEN];
    x[..BLOCK].fill(1e12);
    let huge = Gradient { values: Values::Int8(sync::pack(&x).unwrap()), ..packed(3, 1) };
    let fine = packed(3, 2);
    let mut h = Contributions::new(LEN, &int8());
    assert!(matches!(h.offer(1, huge.clone()), Offer::OutOfBounds(_)));
    assert_eq!(h.offer_header(1, huge.header()), Offer::Accepted);
    assert_eq!(h.offer_chunk(Chunk::of(&huge, 1, 0..64)), ChunkOffer::Accepted);
    assert_eq!(h.offer(2, fine.clone()), Offer::Accepted);
    let r = record(&[(1, &huge), (2, &fine)]);
    let sum = h.chunk_sum(&r, 0..LEN).unwrap();
    let mut emptied = huge.values.packed().unwrap().clone();
    emptied.exponents[0] = EMPTY_BLOCK;
    emptied.q[..BLOCK].fill(0);
    let alone = ChunkSum::of(&[(&emptied, 1), (fine.values.packed().unwrap(), 1)], 0..LEN);
    assert_eq!((&sum.grid, &sum.sum), (&alone.grid, &alone.sum));
    assert_ne!(sum.grid[1], EMPTY_BLOCK, "only the block past the bound is emptied");
    for cut in [BLOCK..LEN, 0..BLOCK] {
        let part = h.chunk_sum(&r, cut.clone()).unwrap();
        assert_eq!(part.sum, sum.sum[cut].to_vec(), "the same block by block");
    }
}
