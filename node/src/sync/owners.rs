//! Chunk owners (`docs/OWNERS.md`): the pieces of the group sum's owners' schedule that a wire
//! will carry, without I/O — which values each owner sums, an owner's chunk sum in as few bits
//! as its terms need, and the fingerprints by which every member checks an owner's sum without
//! holding the chunks it summed.
//!
//! An owner's sum is a sum of integers, so whoever forms it gets [`sum_direct`]'s integers for
//! its values ([`super::schedules::sum_by_owners`] proves the schedule). What a member cannot see
//! is whether the owner formed it at all: it never holds the other members' chunks. Fingerprints
//! make that checkable. For challenge weights `wᵢ` drawn after the sum was sent, every
//! contributor `p` says `f_p = Σᵢ wᵢ·tₚᵢ mod P` of its own terms on the sum's grid, and a sum `S`
//! is right when `Σᵢ wᵢ·Sᵢ ≡ Σₚ f_p (mod P)`. A wrong sum differs by a vector `D ≠ 0` whose
//! entries are far below `P`, so the check misses it only where `Σᵢ wᵢ·Dᵢ ≡ 0`: for weights the
//! owner could not know, with probability at most `1/(P − 1)` — a single wrong value never.

use std::ops::Range;

use super::schedules::chunk_start;
use super::*;

/// The fingerprints' field: the Mersenne prime 2⁶¹ − 1.
pub const FINGERPRINT_PRIME: u64 = (1 << 61) - 1;

/// Pieces a contribution is cut into whatever the group's size: its digest is the digest of
/// its pieces' digests (`wire::Header`), and an owner's chunk is whole pieces, so a header names
/// every chunk of every group and a chunk is checked against it piece by piece.
pub const PIECES: usize = 64;

/// The values of piece `p` of a contribution of `len` values: block-aligned, as even as blocks
/// allow (empty where there are fewer blocks than pieces).
pub fn piece(len: usize, p: usize) -> Range<usize> {
    chunk_start(len, PIECES, p)..chunk_start(len, PIECES, p + 1)
}

/// The pieces owner `c` of `owners` sums: as even as pieces allow (none past [`PIECES`] owners).
pub fn owned_pieces(owners: usize, c: usize) -> Range<usize> {
    let at = |c: usize| (PIECES * c).checked_div(owners).unwrap_or(0).min(PIECES);
    at(c)..at(c + 1)
}

/// The values owner `c` of `owners` sums: its pieces' ([`owned_pieces`]).
pub fn chunk(len: usize, owners: usize, c: usize) -> Range<usize> {
    pieces_values(len, owned_pieces(owners, c))
}

/// The values pieces `pieces` of a contribution of `len` values hold.
pub fn pieces_values(len: usize, pieces: Range<usize>) -> Range<usize> {
    let start = |p: usize| if p >= PIECES { len } else { piece(len, p).start };
    start(pieces.start)..start(pieces.end)
}

/// Bits of the two's-complement field that holds any sum of `weight` terms of at most `limit`
/// each (`weight`: the weights of the sum's contributions added up — their number, or their
/// inner steps in elastic windows; `limit`: the compression's largest quant, 127 for int8 and
/// 7 for int4, which a term on a coarser grid never exceeds): the magnitude and a sign.
pub fn sum_bits(limit: i8, weight: u64) -> u32 {
    65 - bound(limit, weight).leading_zeros()
}

fn bound(limit: i8, weight: u64) -> u64 {
    limit.unsigned_abs() as u64 * weight.max(1)
}

/// What an owner sends of its chunk: where it starts, the grid of its blocks, and its sum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkSum {
    /// The chunk's first value (block-aligned).
    pub start: usize,
    /// One exponent byte per block of the chunk ([`EMPTY_BLOCK`] where every term is empty).
    pub grid: Vec<u8>,
    /// Per block, the contribution (its place in the record's order) whose exponent the grid's
    /// is: the one that checks the grid is no higher than the largest (0 for an empty block).
    pub by: Vec<u8>,
    pub sum: Vec<i64>,
}

/// Why a chunk sum's bytes were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkSumError {
    /// Fewer bytes than the header, or than the header says follow.
    Truncated { needed: usize, have: usize },
    /// More bytes than the header says.
    TrailingBytes { extra: usize },
    /// A chunk that does not begin a block, or is not the owner's.
    NotTheChunk { start: usize, len: usize, expected: Range<usize> },
    /// A field width other than the one the sum's weight needs.
    Bits { bits: u32, expected: u32 },
    /// A value past what `weight` terms can sum to.
    PastBound { index: usize, value: i64, bound: i64 },
    /// A block the grid says is empty holds a non-zero value.
    EmptyBlockNotZero { block: usize },
    /// A block's grid said to be a contribution's that the record does not have.
    NoSuchContribution { block: usize, by: u8, contributions: usize },
}

impl std::fmt::Display for ChunkSumError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChunkSumError::Truncated { needed, have } => {
                write!(f, "a chunk sum of {have} bytes where {needed} are needed")
            }
            ChunkSumError::TrailingBytes { extra } => write!(f, "{extra} bytes after a chunk sum"),
            ChunkSumError::NotTheChunk { start, len, expected } => {
                write!(f, "a chunk sum of values {start}..{} where the owner's are {expected:?}", start + len)
            }
            ChunkSumError::Bits { bits, expected } => {
                write!(f, "a chunk sum in {bits}-bit fields where the group's weight needs {expected}")
            }
            ChunkSumError::PastBound { index, value, bound } => {
                write!(f, "a chunk sum's value {index} is {value}, past the bound ±{bound} of its terms")
            }
            ChunkSumError::EmptyBlockNotZero { block } => {
                write!(f, "a chunk sum's block {block} is empty on its grid and holds a non-zero value")
            }
            ChunkSumError::NoSuchContribution { block, by, contributions } => {
                write!(f, "a chunk sum's block {block} has the grid of contribution {by} of {contributions}")
            }
        }
    }
}

impl std::error::Error for ChunkSumError {}

/// Header of a chunk sum's bytes: `[start u32][len u32][bits u8]`, little-endian.
const HEADER: usize = 9;

impl ChunkSum {
    /// The most bytes [`ChunkSum::encode`] writes for a chunk of `values` values (every field
    /// 64 bits): what a peer's sum may take before it is read.
    pub fn longest_encoding(values: usize) -> usize {
        HEADER + 2 * values.div_ceil(BLOCK) + 8 * values
    }

    /// The chunk `range` of the sum of `contributions` (each with its weight), on their grid.
    pub fn of(contributions: &[(&Packed, u32)], range: Range<usize>) -> ChunkSum {
        let blocks = range.start / BLOCK..range.end.div_ceil(BLOCK);
        let mut grid = vec![EMPTY_BLOCK; blocks.len()];
        let mut by = vec![0u8; blocks.len()];
        for (index, (p, _)) in contributions.iter().enumerate() {
            for ((g, b), &e) in grid.iter_mut().zip(&mut by).zip(&p.exponents[blocks.clone()]) {
                if e > *g {
                    (*g, *b) = (e, index as u8);
                }
            }
        }
        let mut sum = vec![0i64; range.len()];
        let mut terms = vec![0i32; range.len()];
        for &(p, weight) in contributions {
            terms.fill(0);
            on_grid(p, &grid, range.clone(), &mut terms);
            for (s, &t) in sum.iter_mut().zip(&terms) {
                *s += i64::from(weight) * i64::from(t);
            }
        }
        ChunkSum { start: range.start, grid, by, sum }
    }

    /// The bytes an owner sends: the header, the grid, whose each block's grid is, then each
    /// value in a field of [`sum_bits`]`(limit, weight)` bits, least significant bit first, the
    /// last byte zero-padded.
    pub fn encode(&self, limit: i8, weight: u64) -> Vec<u8> {
        let bits = sum_bits(limit, weight);
        let mut out = Vec::with_capacity(HEADER + 2 * self.grid.len() + (self.sum.len() * bits as usize).div_ceil(8));
        out.extend_from_slice(&(self.start as u32).to_le_bytes());
        out.extend_from_slice(&(self.sum.len() as u32).to_le_bytes());
        out.push(bits as u8);
        out.extend_from_slice(&self.grid);
        out.extend_from_slice(&self.by);
        let mask = (1u64 << bits) - 1;
        let (mut acc, mut held) = (0u128, 0u32);
        for &v in &self.sum {
            acc |= u128::from(v as u64 & mask) << held;
            held += bits;
            while held >= 8 {
                out.push(acc as u8);
                acc >>= 8;
                held -= 8;
            }
        }
        if held > 0 {
            out.push(acc as u8);
        }
        out
    }

    /// The chunk sum in `bytes`, which must be owner `c`'s chunk of a model of `len` values in a
    /// group of `owners`, summed over `contributions` of total weight `weight` whose quants are
    /// at most `limit`.
    pub fn decode(
        bytes: &[u8],
        (len, owners, c): (usize, usize, usize),
        (contributions, limit, weight): (usize, i8, u64),
    ) -> Result<ChunkSum, ChunkSumError> {
        let truncated = |needed| ChunkSumError::Truncated { needed, have: bytes.len() };
        if bytes.len() < HEADER {
            return Err(truncated(HEADER));
        }
        let word = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        let (start, values, bits) = (word(0), word(4), u32::from(bytes[8]));
        let expected = chunk(len, owners, c);
        if start != expected.start || values != expected.len() {
            return Err(ChunkSumError::NotTheChunk { start, len: values, expected });
        }
        let wanted = sum_bits(limit, weight);
        if bits != wanted {
            return Err(ChunkSumError::Bits { bits, expected: wanted });
        }
        let blocks = values.div_ceil(BLOCK);
        let needed = HEADER + 2 * blocks + (values * bits as usize).div_ceil(8);
        if bytes.len() < needed {
            return Err(truncated(needed));
        }
        if bytes.len() > needed {
            return Err(ChunkSumError::TrailingBytes { extra: bytes.len() - needed });
        }
        let grid = bytes[HEADER..HEADER + blocks].to_vec();
        let by = bytes[HEADER + blocks..HEADER + 2 * blocks].to_vec();
        if let Some(block) = by.iter().position(|&b| usize::from(b) >= contributions.max(1)) {
            let (block, by) = (start / BLOCK + block, by[block]);
            return Err(ChunkSumError::NoSuchContribution { block, by, contributions });
        }
        let bound = bound(limit, weight) as i64;
        let mut sum = Vec::with_capacity(values);
        let (mut acc, mut held) = (0u128, 0u32);
        let mut body = bytes[HEADER + 2 * blocks..].iter();
        let shift = 64 - bits;
        for index in 0..values {
            while held < bits {
                acc |= u128::from(*body.next().expect("length checked")) << held;
                held += 8;
            }
            // Sign-extend the field.
            let value = ((acc as u64) << shift) as i64 >> shift;
            acc >>= bits;
            held -= bits;
            if value.abs() > bound {
                return Err(ChunkSumError::PastBound { index, value, bound });
            }
            if value != 0 && grid[index / BLOCK] == EMPTY_BLOCK {
                return Err(ChunkSumError::EmptyBlockNotZero { block: start / BLOCK + index / BLOCK });
            }
            sum.push(value);
        }
        Ok(ChunkSum { start, grid, by, sum })
    }
}

/// A contribution's exponents against a chunk sum's grid: the grid is the largest exponent of
/// each block only if none is above it and the contribution it names has it — each contributor
/// checks its own part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridWrong {
    pub block: usize,
    pub grid: u8,
    pub exponent: u8,
}

impl std::fmt::Display for GridWrong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let GridWrong { block, grid, exponent } = self;
        write!(f, "block {block}'s grid is {grid} where this contribution's exponent is {exponent}")
    }
}

impl std::error::Error for GridWrong {}

/// The challenges' root under `seed`: uniform in `2..P − 1` (never 0, 1 or −1, whose powers
/// would repeat at once), the same for every member that knows the seed.
fn root(seed: u64) -> u64 {
    let mut rng = lockstep_luts::rng::SplitMix64::new(seed ^ 0xd605_bbb5_8c8a_bbe5);
    2 + rng.below(FINGERPRINT_PRIME - 3)
}

/// Challenge weight `wᵢ` of value `i` under `seed`: `r^(i+1)` for the seed's root `r` — never
/// 0 (so no single wrong value can escape), the same for every member that knows the seed. A
/// wrong sum differs by `D ≠ 0`, and `Σᵢ Dᵢ·r^(i+1)` is a polynomial in `r` of degree at most
/// the model's length `L`: it vanishes for at most `L` of the `P − 3` roots, so a wrong sum
/// passes with probability at most `L/(P − 3)` — about 4·10⁻¹³ for a million values. Powers
/// make a fingerprint one multiply-add a value (Horner's rule), not a draw.
pub fn challenge(seed: u64, i: usize) -> u64 {
    pow_mod(root(seed), i as u64 + 1)
}

/// `v mod P`, for any `i64`.
fn field(v: i64) -> u64 {
    let m = v.unsigned_abs();
    let m = if m < FINGERPRINT_PRIME { m } else { m % FINGERPRINT_PRIME };
    if v < 0 && m != 0 {
        FINGERPRINT_PRIME - m
    } else {
        m
    }
}

/// `x mod P` for `x < 2¹²²` (a product of two field elements): `2⁶¹ ≡ 1`, so the high bits
/// fold onto the low ones.
fn reduce(x: u128) -> u64 {
    let folded = (x as u64 & FINGERPRINT_PRIME) + (x >> 61) as u64;
    let folded = (folded & FINGERPRINT_PRIME) + (folded >> 61);
    if folded >= FINGERPRINT_PRIME {
        folded - FINGERPRINT_PRIME
    } else {
        folded
    }
}

fn mul_mod(a: u64, b: u64) -> u64 {
    reduce(u128::from(a) * u128::from(b))
}

fn add_mod(a: u64, b: u64) -> u64 {
    let s = a + b;
    if s >= FINGERPRINT_PRIME {
        s - FINGERPRINT_PRIME
    } else {
        s
    }
}

fn pow_mod(mut base: u64, mut exponent: u64) -> u64 {
    let mut result = 1;
    while exponent > 0 {
        if exponent & 1 == 1 {
            result = mul_mod(result, base);
        }
        base = mul_mod(base, base);
        exponent >>= 1;
    }
    result
}

/// Independent Horner chains a fingerprint runs side by side: each multiply-add waits for the one
/// before it in its chain, so one chain is bound by the multiplier's latency (about 4 ns a value
/// on this project's AMD EPYC); four keep it busy.
const LANES: usize = 4;

/// `Σₖ w_{start+k}·vₖ mod P` over values `start..` under `seed`: the values cut into [`LANES`]
/// runs (and the few left over), each by Horner's rule from its last value times `r` to the
/// power of its first value's index + 1 — one field element, however it is cut.
fn fingerprint_of<T: Copy + Into<i64>>(seed: u64, start: usize, values: &[T]) -> u64 {
    let r = root(seed);
    let run = values.len() / LANES;
    let mut acc = [0u64; LANES];
    for k in (0..run).rev() {
        for (lane, a) in acc.iter_mut().enumerate() {
            *a = add_mod(mul_mod(*a, r), field(values[lane * run + k].into()));
        }
    }
    let rest = values[LANES * run..].iter().rev().fold(0, |a, &v| add_mod(mul_mod(a, r), field(v.into())));
    let at = |first: usize| pow_mod(r, (start + first) as u64 + 1);
    let lanes = acc.iter().enumerate().fold(0, |f, (lane, &a)| add_mod(f, mul_mod(a, at(lane * run))));
    add_mod(lanes, mul_mod(rest, at(LANES * run)))
}

/// What a contributor sends for a chunk whose grid misrepresents its contribution (not a field
/// element, so it never adds up).
pub const GRID_WRONG: u64 = u64::MAX;

/// A contributor's fingerprint of its terms on `sum`'s grid (what it put into that chunk), the
/// contribution at place `index` of the record's order — or where the grid is wrong by its
/// exponents: below one of them, or not its own where the sum names it. `p` holds the
/// contribution's values from value `at` on (0: all of them; a chunk's start: that chunk).
pub fn contribution_fingerprint(
    p: &Packed,
    at: usize,
    index: usize,
    sum: &ChunkSum,
    seed: u64,
) -> Result<u64, GridWrong> {
    let range = sum.start..sum.start + sum.sum.len();
    let local = range.start - at..range.end - at;
    let first = local.start / BLOCK;
    for (offset, (&grid, &by)) in sum.grid.iter().zip(&sum.by).enumerate() {
        let exponent = p.exponents[first + offset];
        let named = usize::from(by) == index && grid != EMPTY_BLOCK;
        if exponent > grid || named && exponent != grid {
            return Err(GridWrong { block: range.start / BLOCK + offset, grid, exponent });
        }
    }
    let mut terms = vec![0i32; range.len()];
    on_grid(p, &sum.grid, local, &mut terms);
    Ok(fingerprint_of(seed, range.start, &terms))
}

/// Whether `sum` is the weighted sum of the contributions whose fingerprints under `seed` are
/// `fingerprints` (each with its contribution's weight). [`GRID_WRONG`], or any value past the
/// field, never checks.
pub fn sum_checks(sum: &ChunkSum, fingerprints: &[(u64, u32)], seed: u64) -> bool {
    if fingerprints.iter().any(|&(f, _)| f >= FINGERPRINT_PRIME) {
        return false;
    }
    let claimed = fingerprint_of(seed, sum.start, &sum.sum);
    let parts = fingerprints.iter().fold(0, |acc, &(f, weight)| add_mod(acc, mul_mod(f, u64::from(weight))));
    claimed == parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contributions(n: usize, len: usize) -> Vec<Packed> {
        (0..n)
            .map(|s| {
                let mut rng = lockstep_luts::rng::SplitMix64::new(900 + s as u64);
                // Blocks of very different sizes (grids that differ between members), and one
                // block of every member empty.
                let x: Vec<f32> = (0..len)
                    .map(|i| {
                        let block = i / BLOCK;
                        if block == 2 {
                            return 0.0;
                        }
                        rng.next_signed_unit() * (2f32).powi(((block * 7 + s * 3) % 23) as i32 - 11)
                    })
                    .collect();
                pack(&x).unwrap()
            })
            .collect()
    }

    /// Pieces tile the values block by block whatever the length; each owner's chunk is whole
    /// pieces and the chunks tile the values for every group size, past [`PIECES`] owners too
    /// (some owners then own nothing).
    #[test]
    fn owners_take_whole_pieces_and_the_chunks_tile_the_values() {
        for len in [0, 5, 40 * BLOCK + 3, 64 * BLOCK, 1000 * BLOCK + 31] {
            let mut at = 0;
            for p in 0..PIECES {
                let range = piece(len, p);
                assert_eq!(range.start, at, "len {len}, piece {p}");
                assert!(range.start.is_multiple_of(BLOCK) || range.start == len);
                at = range.end;
            }
            assert_eq!(at, len);
            for n in [1, 2, 3, 7, 8, 63, 64, 65, 100] {
                let (mut values, mut pieces) = (0, 0);
                for c in 0..n {
                    let (range, owned) = (chunk(len, n, c), owned_pieces(n, c));
                    assert_eq!((range.start, owned.start), (values, pieces), "len {len}, n {n}, c {c}");
                    let first = owned.start.min(PIECES - 1);
                    assert!(owned.is_empty() || range.start == piece(len, first).start);
                    (values, pieces) = (range.end, owned.end);
                }
                assert_eq!((values, pieces), (len, PIECES), "len {len}, n {n}");
            }
        }
        assert_eq!((owned_pieces(3, 0), owned_pieces(3, 2)), (0..21, 42..64));
        assert_eq!((0..100).filter(|&c| !owned_pieces(100, c).is_empty()).count(), PIECES);
    }

    /// The owners' chunks tile the values, and their sums laid end to end
    /// ([`super::super::schedules::sum_by_owners`]) are the direct sum and its grid, bit for bit,
    /// for every group size; each block's grid names a contribution that has it.
    #[test]
    fn the_owners_chunks_tile_the_values_and_sum_to_the_direct_sum() {
        let len = 9 * BLOCK + 13;
        for n in 1..=9 {
            let packed = contributions(n, len);
            let refs: Vec<&Packed> = packed.iter().collect();
            assert_eq!(super::super::schedules::sum_by_owners(&refs), sum_direct(&refs), "n {n}");
            let mut at = 0;
            for c in 0..n {
                let range = chunk(len, n, c);
                assert_eq!(range.start, at, "n {n}, chunk {c}");
                assert!(range.start.is_multiple_of(BLOCK));
                at = range.end;
                let weighted: Vec<(&Packed, u32)> = refs.iter().map(|p| (*p, 1)).collect();
                let owned = ChunkSum::of(&weighted, range.clone());
                for (offset, (&g, &by)) in owned.grid.iter().zip(&owned.by).enumerate() {
                    let named = packed[usize::from(by)].exponents[range.start / BLOCK + offset];
                    assert!(g == EMPTY_BLOCK || named == g, "n {n}, chunk {c}, block {offset}");
                }
            }
            assert_eq!(at, len);
        }
    }

    #[test]
    fn a_chunk_sum_takes_the_bits_its_terms_need_and_round_trips() {
        assert_eq!(sum_bits(127, 1), 8); // ±127
        assert_eq!(sum_bits(127, 2), 9); // ±254
        assert_eq!(sum_bits(127, 4), 10); // ±508
        assert_eq!(sum_bits(127, 8), 11);
        assert_eq!(sum_bits(127, 256), 16);
        assert_eq!(sum_bits(INT4_LIMIT, 4), 6); // ±28
        assert_eq!(sum_bits(INT4_LIMIT, 8), 7);
        let len = 5 * BLOCK + 3;
        for (limit, weight) in
            [(127i8, 1u64), (127, 3), (127, 4), (127, 8), (127, 200), (INT4_LIMIT, 4), (INT4_LIMIT, 9)]
        {
            let bound = i64::from(limit) * weight as i64;
            let range = chunk(len, 2, 1);
            let mut sum: Vec<i64> = (0..range.len() as i64).map(|i| (i * 37) % (2 * bound + 1) - bound).collect();
            sum[0] = bound;
            sum[1] = -bound;
            let blocks = range.len().div_ceil(BLOCK);
            let chunk_sum =
                ChunkSum { start: range.start, grid: vec![EXPONENT_BIAS as u8; blocks], by: vec![2; blocks], sum };
            let bytes = chunk_sum.encode(limit, weight);
            let bits = sum_bits(limit, weight) as usize;
            assert_eq!(bytes.len(), HEADER + 2 * blocks + (chunk_sum.sum.len() * bits).div_ceil(8));
            assert!(bytes.len() <= ChunkSum::longest_encoding(range.len()));
            assert_eq!(ChunkSum::decode(&bytes, (len, 2, 1), (3, limit, weight)), Ok(chunk_sum));
        }
    }

    /// Every malformed chunk sum is refused with what is wrong with it.
    #[test]
    fn a_malformed_chunk_sum_is_refused_with_what_is_wrong() {
        let len = 4 * BLOCK;
        let range = chunk(len, 2, 0);
        let good = ChunkSum { start: 0, grid: vec![EXPONENT_BIAS as u8; 2], by: vec![0, 3], sum: vec![3; range.len()] };
        let bytes = good.encode(127, 4);
        let decode = |bytes: &[u8], c: usize, weight: u64| ChunkSum::decode(bytes, (len, 2, c), (4, 127, weight));
        assert_eq!(decode(&bytes, 0, 4), Ok(good.clone()));
        assert_eq!(decode(&bytes[..5], 0, 4), Err(ChunkSumError::Truncated { needed: HEADER, have: 5 }));
        let needed = bytes.len();
        assert_eq!(decode(&bytes[..needed - 1], 0, 4), Err(ChunkSumError::Truncated { needed, have: needed - 1 }));
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(decode(&long, 0, 4), Err(ChunkSumError::TrailingBytes { extra: 1 }));
        assert_eq!(
            decode(&bytes, 1, 4),
            Err(ChunkSumError::NotTheChunk { start: 0, len: range.len(), expected: chunk(len, 2, 1) })
        );
        assert_eq!(decode(&bytes, 0, 8), Err(ChunkSumError::Bits { bits: 10, expected: 11 }));
        // 10-bit fields hold up to ±511; four terms sum to ±508 at most.
        let mut past = good.clone();
        past.sum[7] = 511;
        assert_eq!(
            decode(&past.encode(127, 4), 0, 4),
            Err(ChunkSumError::PastBound { index: 7, value: 511, bound: 508 })
        );
        let named = ChunkSum { by: vec![0, 4], ..good.clone() };
        assert_eq!(
            decode(&named.encode(127, 4), 0, 4),
            Err(ChunkSumError::NoSuchContribution { block: 1, by: 4, contributions: 4 })
        );
        let empty = ChunkSum { grid: vec![EXPONENT_BIAS as u8, EMPTY_BLOCK], ..good };
        assert_eq!(decode(&empty.encode(127, 4), 0, 4), Err(ChunkSumError::EmptyBlockNotZero { block: 1 }));
    }

    fn prints(packed: &[Packed], sum: &ChunkSum, seed: u64) -> Vec<(u64, u32)> {
        packed.iter().enumerate().map(|(i, p)| (contribution_fingerprint(p, 0, i, sum, seed).unwrap(), 1)).collect()
    }

    /// Fingerprints are linear: the contributors' fingerprints, weighted, add up to the right
    /// sum's — for int8, int4 and picked contributions, equal and elastic weights.
    #[test]
    fn the_contributors_fingerprints_add_up_to_the_right_sums() {
        let len = 6 * BLOCK + 9;
        let xs: Vec<Vec<f32>> = (0..4)
            .map(|s| {
                let mut rng = lockstep_luts::rng::SplitMix64::new(40 + s);
                (0..len).map(|_| rng.next_signed_unit() * (s + 1) as f32).collect()
            })
            .collect();
        for compression in [Compression::Int8, Compression::Int4, Compression::TopK(16)] {
            let packed: Vec<Packed> = xs.iter().map(|x| pack_as(x, compression).unwrap()).collect();
            for weights in [[1u32, 1, 1, 1], [3, 1, 2, 3]] {
                let weighted: Vec<(&Packed, u32)> = packed.iter().zip(weights).collect();
                for c in 0..3 {
                    let sum = ChunkSum::of(&weighted, chunk(len, 3, c));
                    for seed in [1u64, 0xfeed] {
                        let prints: Vec<(u64, u32)> = weighted
                            .iter()
                            .enumerate()
                            .map(|(i, &(p, w))| (contribution_fingerprint(p, 0, i, &sum, seed).unwrap(), w))
                            .collect();
                        assert!(sum_checks(&sum, &prints, seed), "{compression:?} {weights:?} chunk {c}");
                    }
                }
            }
        }
    }

    /// A wrong sum is caught: any single value off by any amount its field can carry, two
    /// values swapped, a contributor left out or counted twice, a chunk summed from another
    /// member's values than the one that member fingerprints.
    #[test]
    fn a_wrong_sum_never_checks() {
        let len = 3 * BLOCK;
        let packed = contributions(4, len);
        let weighted: Vec<(&Packed, u32)> = packed.iter().map(|p| (p, 1)).collect();
        let range = chunk(len, 2, 0);
        let right = ChunkSum::of(&weighted, range.clone());
        let seed = 77;
        let prints = prints(&packed, &right, seed);
        assert!(sum_checks(&right, &prints, seed));
        for i in 0..right.sum.len() {
            for delta in [1i64, -1, 2, 508, -1016] {
                let mut wrong = right.clone();
                wrong.sum[i] += delta;
                assert!(!sum_checks(&wrong, &prints, seed), "value {i} off by {delta}");
            }
        }
        let (i, j) = (1..right.sum.len()).map(|j| (0, j)).find(|&(i, j)| right.sum[i] != right.sum[j]).unwrap();
        let mut swapped = right.clone();
        swapped.sum.swap(i, j);
        assert!(!sum_checks(&swapped, &prints, seed));
        // Left out or counted twice: the contribution whose exponent the grid is (a contribution
        // far below the grid may put only zeros there, and then the sum is right without it).
        let top = usize::from(right.by[0]);
        let others: Vec<(&Packed, u32)> = (0..4).filter(|&i| i != top).map(|i| weighted[i]).collect();
        assert!(!sum_checks(&ChunkSum::of(&others, range.clone()), &prints, seed));
        let twice: Vec<(&Packed, u32)> = [weighted[top]].into_iter().chain(weighted.iter().copied()).collect();
        assert!(!sum_checks(&ChunkSum::of(&twice, range.clone()), &prints, seed));
        // The owner summed a member's values as they arrived; that member fingerprints others
        // (one quant off by one, on the grid at its own exponent: one term off by one).
        let mut forged = packed[top].clone();
        forged.q[5] = if forged.q[5] == 127 { 126 } else { forged.q[5] + 1 };
        let mut with_forged = prints.clone();
        with_forged[top].0 = contribution_fingerprint(&forged, 0, top, &right, seed).unwrap();
        assert!(!sum_checks(&right, &with_forged, seed));
    }

    /// An owner that puts the sum on another grid is caught by the contributions' exponents: a
    /// grid below one of them, or one that names a contribution whose exponent it is not (a
    /// coarser grid would round every term more, and the fingerprints would still add up).
    #[test]
    fn a_wrong_grid_is_named_by_a_contribution_it_misrepresents() {
        let len = 3 * BLOCK;
        let packed = contributions(3, len);
        let weighted: Vec<(&Packed, u32)> = packed.iter().map(|p| (p, 1)).collect();
        let right = ChunkSum::of(&weighted, 0..len);
        let (block, by) = (0, usize::from(right.by[0]));
        let top = right.grid[block];
        // One higher: every term rounds coarser, and the sum of those terms checks — but the
        // contribution named for the block has a lower exponent than the grid says.
        let mut higher = right.clone();
        higher.grid[block] = top + 1;
        let mut full = right.grid.clone();
        full[block] = top + 1;
        higher.sum.fill(0);
        for p in &packed {
            let mut terms = vec![0i32; len];
            on_grid(p, &full, 0..len, &mut terms);
            higher.sum.iter_mut().zip(&terms).for_each(|(s, &t)| *s += i64::from(t));
        }
        assert_ne!(higher.sum, right.sum);
        let others: Vec<(u64, u32)> = (0..3)
            .filter(|&i| i != by)
            .map(|i| (contribution_fingerprint(&packed[i], 0, i, &higher, 1).unwrap(), 1))
            .collect();
        let own_terms = {
            let mut terms = vec![0i32; len];
            on_grid(&packed[by], &full, 0..len, &mut terms);
            fingerprint_of(1, 0, &terms)
        };
        let all: Vec<(u64, u32)> = others.into_iter().chain([(own_terms, 1)]).collect();
        assert!(sum_checks(&higher, &all, 1), "the coarser sum's fingerprints add up");
        assert_eq!(
            contribution_fingerprint(&packed[by], 0, by, &higher, 1),
            Err(GridWrong { block, grid: top + 1, exponent: top })
        );
        // Naming another contribution for the right grid: that one does not have it.
        let other = (0..3).find(|&i| packed[i].exponents[block] < top).expect("a contribution below the grid");
        let mut misnamed = right.clone();
        misnamed.by[block] = other as u8;
        assert!(contribution_fingerprint(&packed[other], 0, other, &misnamed, 1).is_err());
        // One lower: the named contribution's exponent is above it.
        let mut lower = right.clone();
        lower.grid[block] = top - 1;
        assert!(contribution_fingerprint(&packed[by], 0, by, &lower, 1).is_err());
        // The right grid: every contribution agrees.
        assert!((0..3).all(|i| contribution_fingerprint(&packed[i], 0, i, &right, 1).is_ok()));
    }

    /// A fingerprint is the challenge-weighted sum, computed the slow way here (`%` on 128-bit
    /// products, `rem_euclid`): Horner's rule and the folded reduction give the same field
    /// element, for values of every sign and size, at any start.
    #[test]
    fn a_fingerprint_is_the_challenge_weighted_sum_of_its_values() {
        let p = u128::from(FINGERPRINT_PRIME);
        let mut rng = lockstep_luts::rng::SplitMix64::new(3);
        let values: Vec<i64> = (0..300)
            .map(|i| match i % 5 {
                0 => 0,
                1 => -1,
                2 => i64::MIN + i,
                3 => i64::MAX - i,
                _ => rng.next_u64() as i64 >> (i % 40),
            })
            .collect();
        // Every length a cut into lanes can leave: none, fewer than the lanes, a remainder.
        for len in [0, 1, 3, LANES, 7, 299, 300] {
            for (seed, start) in [(1u64, 0usize), (0xfeed, 4096), (u64::MAX, 123_456_789)] {
                let slow = values[..len].iter().enumerate().fold(0u128, |acc, (k, &v)| {
                    let w = u128::from(challenge(seed, start + k));
                    (acc + w * (i128::from(v).rem_euclid(p as i128) as u128) % p) % p
                });
                let fast = fingerprint_of(seed, start, &values[..len]);
                assert_eq!(u128::from(fast), slow, "seed {seed}, {len} values");
            }
        }
        // The challenges are the root's powers, each below the prime.
        let r = challenge(9, 0);
        assert_eq!(u128::from(challenge(9, 1)), u128::from(r) * u128::from(r) % p);
        assert_eq!(u128::from(challenge(9, 2)), u128::from(challenge(9, 1)) * u128::from(r) % p);
        assert_eq!(reduce(u128::from(FINGERPRINT_PRIME - 1) * u128::from(FINGERPRINT_PRIME - 1)), 1);
    }

    /// A contributor holding only its chunk (an owner's copy, a dispute's recomputation) gets
    /// the fingerprint its whole contribution gives.
    #[test]
    fn a_chunk_held_alone_gives_the_whole_contributions_fingerprint() {
        let len = 5 * BLOCK + 7;
        let packed = contributions(3, len);
        let weighted: Vec<(&Packed, u32)> = packed.iter().map(|p| (p, 1)).collect();
        for c in 0..3 {
            let range = chunk(len, 3, c);
            let sum = ChunkSum::of(&weighted, range.clone());
            for (i, p) in packed.iter().enumerate() {
                let blocks = range.start / BLOCK..range.end.div_ceil(BLOCK);
                let part = Packed { exponents: p.exponents[blocks].to_vec(), q: p.q[range.clone()].to_vec() };
                assert_eq!(
                    contribution_fingerprint(&part, range.start, i, &sum, 5),
                    contribution_fingerprint(p, 0, i, &sum, 5),
                    "chunk {c}, contribution {i}"
                );
            }
        }
    }

    #[test]
    fn challenges_are_never_zero_and_follow_the_seed() {
        let a: Vec<u64> = (0..1000).map(|i| challenge(5, i)).collect();
        assert!(a.iter().all(|&w| (1..FINGERPRINT_PRIME).contains(&w)));
        assert_eq!(a, (0..1000).map(|i| challenge(5, i)).collect::<Vec<_>>());
        assert_ne!(a, (0..1000).map(|i| challenge(6, i)).collect::<Vec<_>>());
        let distinct: std::collections::BTreeSet<u64> = a.iter().copied().collect();
        assert_eq!(distinct.len(), a.len());
    }
}
