//! The steps in flight: the contributions a member holds for steps it has not applied yet (they
//! arrive before the step's commit record, from anyone who computed them), the ones it keeps
//! after applying a step (to repair a member that missed one), and what a committed record
//! needs from them: its contributions, by digest, summed in the record's order, with the guard.
//!
//! Summing is `crate::sync::reduce` over the record's contributions in roster (ascending id)
//! order: f32 contributions are summed in that order, each addition an f32 rounding, then
//! divided by `n` (float addition is not associative, so the order is part of the protocol);
//! `int8` and `int4` ones are summed exactly in integers, where the order cannot matter —
//! weighted by the inner steps each stands for in elastic windows.
//!
//! With chunk owners (`docs/OWNERS.md`) a member holds most contributions by their header
//! alone, the chunks it owns of them, and the owners' sums of the others' chunks: the record's
//! sum is those chunk sums laid end to end ([`Contributions::reduce_owned`]), the same integers
//! and so the same bits as summing the whole contributions.

use std::collections::BTreeMap;
use std::ops::Range;

use super::log::StepRecord;
use crate::sync::owners::{self, ChunkSum, ChunkSumError};
use crate::sync::{self, Compression, Packed, Reduced, SyncConfig, Values, EMPTY_BLOCK};
use crate::wire::{Chunk, Gradient, Header, PeerId};
use lockstep_luts::units::BLOCK;

mod sums;
use sums::Sums;

/// Applied steps whose contributions a member keeps for repairs.
pub const RETAINED_STEPS: u32 = 4;

/// What happened to an offered contribution.
#[derive(Clone, Debug, PartialEq)]
pub enum Offer {
    Accepted,
    /// The values of a contribution held by its header alone (chunk owners: a repair).
    Filled,
    /// Already held: the same contribution again (a duplicate delivery, a repair that crossed
    /// the original), or another one from the same member for the same step — the record
    /// decides which is summed; the first stays until a record names another.
    Duplicate,
    /// A weight the run does not allow (`SyncConfig::weights_allowed`).
    WrongWeight {
        weight: u32,
        allowed: std::ops::RangeInclusive<u32>,
    },
    /// The contribution's length is not the model's.
    WrongLength {
        expected: usize,
        actual: usize,
    },
    /// Sent as another encoding than the run's compression.
    WrongEncoding {
        expected: Compression,
        actual: Compression,
    },
    /// A value is not finite or past the bound (`sync::Values::check_bounds`): refused before it
    /// could reach any sum.
    OutOfBounds(crate::sync::OutOfBounds),
}

/// The guard stopped the run: replicas disagree or a kernel misbehaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardFailure {
    pub step: u32,
    /// Peers whose weight hash differs from the record's (this node among them when its own
    /// weights do).
    pub weight_mismatch: Vec<PeerId>,
    /// Peers whose probe hash differs from the expected one.
    pub probe_mismatch: Vec<PeerId>,
}

impl std::fmt::Display for GuardFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sync guard stopped the run at step {}", self.step)?;
        if !self.weight_mismatch.is_empty() {
            write!(f, "; weights differ on peers {:?}", self.weight_mismatch)?;
        }
        if !self.probe_mismatch.is_empty() {
            write!(f, "; probe hash wrong on peers {:?}", self.probe_mismatch)?;
        }
        Ok(())
    }
}

/// A contribution as a member holds it: its header and digest (computed once, on arrival), and
/// its values — whole (ours, a mesh run's, a repair), or with chunk owners only the chunks this
/// member owns of it.
#[derive(Clone, Debug)]
pub struct Held {
    pub header: Header,
    pub digest: u64,
    pub whole: Option<Gradient>,
    pub chunks: Vec<Chunk>,
}

impl Held {
    /// `gradient` whole, with its header where it is made already.
    fn whole(gradient: Gradient, header: Option<Header>) -> Held {
        let header = header.unwrap_or_else(|| gradient.header());
        Held { digest: header.digest(), header, whole: Some(gradient), chunks: Vec::new() }
    }

    /// The packed values that hold `range` (the whole, or one chunk held that covers it), and
    /// the value they start at.
    fn holding(&self, range: &Range<usize>) -> Option<(&Packed, usize)> {
        if let Some(p) = self.whole.as_ref().and_then(|g| g.values.packed()) {
            return Some((p, 0));
        }
        let len = self.header.len as usize;
        self.chunks.iter().find_map(|c| {
            let (held, p) = (c.range(len), c.values.packed()?);
            (held.start <= range.start && range.end <= held.end).then_some((p, held.start))
        })
    }

    /// Whether the values `range` are held, without copying them.
    fn covers(&self, range: &Range<usize>) -> bool {
        self.holding(range).is_some()
    }

    /// The packed values `range` (block-aligned, within one chunk held or the whole).
    fn part(&self, range: &Range<usize>) -> Option<Packed> {
        let (p, at) = self.holding(range)?;
        let blocks = (range.start - at) / BLOCK..(range.end - at).div_ceil(BLOCK);
        Some(Packed { exponents: p.exponents[blocks].to_vec(), q: p.q[range.start - at..range.end - at].to_vec() })
    }
}

/// `part` with each block whose values could pass the run's bound made empty (the test of
/// `Values::check_bounds`, block by block: `sync::block_past_bound`).
fn within_bound(mut part: Packed) -> Packed {
    for block in 0..part.exponents.len() {
        let quants = block * BLOCK..((block + 1) * BLOCK).min(part.q.len());
        if sync::block_past_bound(part.exponents[block], &part.q[quants.clone()]).is_some() {
            part.exponents[block] = EMPTY_BLOCK;
            part.q[quants].fill(0);
        }
    }
    part
}

/// What happened to an offered chunk (chunk owners).
#[derive(Clone, Debug, PartialEq)]
pub enum ChunkOffer {
    Accepted,
    /// Held already, or the whole contribution is.
    Duplicate,
    /// No header of its author for its step is held (it arrives first on the same channel).
    NoHeader,
    /// Its pieces are not the ones its author's header names.
    NotNamed,
    /// Pieces this member does not own in the step (the session checks).
    NotOwned,
}

/// Why a record cannot be summed from what is here (chunk owners).
#[derive(Clone, Debug, PartialEq)]
pub struct Lacking {
    /// Chunks with neither an owner's sum nor every contribution's values.
    pub chunks: Vec<u16>,
    /// Owners' sums refused: the owner, who sent it, and why.
    pub refused: Vec<(u16, PeerId, ChunkSumError)>,
}

/// Every contribution a member holds, by step and sender.
#[derive(Clone, Debug)]
pub struct Contributions {
    len: usize,
    compression: Compression,
    /// The weights a contribution may carry.
    weights: std::ops::RangeInclusive<u32>,
    /// Steps not applied yet.
    held: BTreeMap<u32, BTreeMap<PeerId, Held>>,
    /// The last applied steps', summed already.
    retained: BTreeMap<u32, BTreeMap<PeerId, Held>>,
    /// Chunk owners: the owners' sums, by step and record digest.
    sums: BTreeMap<(u32, u64), Sums>,
    /// Chunk owners: the grid of each applied step summed from chunk sums (what an audit's
    /// private state is made with, where the contributions are not held whole).
    grids: BTreeMap<u32, Vec<u8>>,
    /// Chunk owners: chunks that came before their author's header, by step and author (taken
    /// when it comes).
    early: BTreeMap<(u32, PeerId), Vec<Chunk>>,
}

impl Contributions {
    /// For a model of `len` weights trained with `sync`.
    pub fn new(len: usize, sync: &SyncConfig) -> Self {
        Contributions {
            len,
            compression: sync.compression,
            weights: sync.weights_allowed(),
            held: BTreeMap::new(),
            retained: BTreeMap::new(),
            sums: BTreeMap::new(),
            grids: BTreeMap::new(),
            early: BTreeMap::new(),
        }
    }

    /// The model's length (every contribution's).
    pub fn len(&self) -> usize {
        self.len
    }

    /// The checks a contribution's fields must pass, whole or by its header.
    fn admissible(&self, header: &Header) -> Result<(), Offer> {
        if header.encoding != self.compression.values_as() {
            return Err(Offer::WrongEncoding { expected: self.compression.values_as(), actual: header.encoding });
        }
        if !self.weights.contains(&header.weight) {
            return Err(Offer::WrongWeight { weight: header.weight, allowed: self.weights.clone() });
        }
        if header.len as usize != self.len {
            return Err(Offer::WrongLength { expected: self.len, actual: header.len as usize });
        }
        Ok(())
    }

    /// Checks a contribution and holds it (the caller decides which steps it takes). The values
    /// of one held by its header alone fill it ([`Offer::Filled`]).
    pub fn offer(&mut self, from: PeerId, gradient: Gradient) -> Offer {
        self.offer_headed(from, gradient, None)
    }

    /// [`Contributions::offer`] of a contribution whose header is made already (`header`: ours,
    /// sent to the members as it is).
    pub fn offer_headed(&mut self, from: PeerId, gradient: Gradient, header: Option<Header>) -> Offer {
        if gradient.values.compression() != self.compression.values_as() {
            return Offer::WrongEncoding {
                expected: self.compression.values_as(),
                actual: gradient.values.compression(),
            };
        }
        if !self.weights.contains(&gradient.weight) {
            return Offer::WrongWeight { weight: gradient.weight, allowed: self.weights.clone() };
        }
        if gradient.values.len() != self.len {
            return Offer::WrongLength { expected: self.len, actual: gradient.values.len() };
        }
        if let Err(e) = gradient.values.check_bounds() {
            return Offer::OutOfBounds(e);
        }
        let held = Held::whole(gradient, header);
        let step = held.header.step;
        let steps = if self.held.contains_key(&step) || !self.retained.contains_key(&step) {
            self.held.entry(step).or_default()
        } else {
            self.retained.entry(step).or_default()
        };
        match steps.get_mut(&from) {
            Some(h) if h.whole.is_none() && h.digest == held.digest => {
                *h = held;
                Offer::Filled
            }
            Some(_) => Offer::Duplicate,
            None => {
                steps.insert(from, held);
                Offer::Accepted
            }
        }
    }

    /// Chunk owners: holds a contribution by its header (checked as a whole one's fields are;
    /// its values are checked by the owners of its chunks).
    pub fn offer_header(&mut self, from: PeerId, header: Header) -> Offer {
        if let Err(why) = self.admissible(&header) {
            return why;
        }
        let step = self.held.entry(header.step).or_default();
        if step.contains_key(&from) {
            return Offer::Duplicate;
        }
        let digest = header.digest();
        let key = (header.step, from);
        step.insert(from, Held { header, digest, whole: None, chunks: Vec::new() });
        for chunk in self.early.remove(&key).unwrap_or_default() {
            self.offer_chunk(chunk);
        }
        Offer::Accepted
    }

    /// Chunk owners: the authors of chunks to `step` held until their header comes.
    pub fn early_authors(&self, step: u32) -> Vec<PeerId> {
        self.early.range((step, 0)..=(step, PeerId::MAX)).map(|((_, a), _)| *a).collect()
    }

    /// Chunk owners: `peer`'s contribution to `step` whole, where its values are here (whole,
    /// or a chunk of every piece).
    pub fn whole_of(&self, step: u32, peer: PeerId) -> Option<Gradient> {
        let held = self.get(step, peer)?;
        if let Some(whole) = &held.whole {
            return Some(whole.clone());
        }
        let chunk = self.chunk_of(step, peer, 0..owners::PIECES)?;
        let h = &held.header;
        let (step, whash, phash, loss, weight, state) = (h.step, h.whash, h.phash, h.loss, h.weight, h.state);
        Some(Gradient { step, whash, phash, loss, values: chunk.values, weight, state })
    }

    /// Chunk owners: holds a chunk of a contribution held by its header, once its pieces are
    /// the header's.
    pub fn offer_chunk(&mut self, chunk: Chunk) -> ChunkOffer {
        let step = match self.held.get(&chunk.step).is_some_and(|s| s.contains_key(&chunk.author)) {
            true => self.held.get_mut(&chunk.step),
            false => self.retained.get_mut(&chunk.step),
        };
        let Some(held) = step.and_then(|s| s.get_mut(&chunk.author)) else {
            // Held only if it can be a chunk of the model, once for its pieces.
            let early = self.early.entry((chunk.step, chunk.author)).or_default();
            let fits = chunk.values.len() == chunk.range(self.len).len();
            if fits
                && early.len() < owners::PIECES
                && !early.iter().any(|c| (c.first, c.end) == (chunk.first, chunk.end))
            {
                early.push(chunk);
            }
            return ChunkOffer::NoHeader;
        };
        let range = chunk.range(held.header.len as usize);
        if held.whole.is_some() || held.part(&range).is_some() {
            return ChunkOffer::Duplicate;
        }
        if !held.header.names(&chunk) {
            return ChunkOffer::NotNamed;
        }
        held.chunks.push(chunk);
        ChunkOffer::Accepted
    }

    /// Chunk owners: pieces `pieces` of `author`'s contribution to `step`, where its values
    /// there are held (whole, or a chunk that covers them).
    pub fn chunk_of(&self, step: u32, author: PeerId, pieces: Range<usize>) -> Option<Chunk> {
        let held = self.get(step, author)?;
        let range = Chunk::values(self.len, pieces.clone());
        let part = held.part(&range)?;
        let values = Values::packed_as(held.header.encoding, part);
        Some(Chunk { step, author, first: pieces.start as u8, end: pieces.end as u8, values })
    }

    /// Chunk owners: whether pieces `pieces` of `author`'s contribution to `step` are held
    /// ([`Contributions::chunk_of`] without copying them: asked on every pass of the session).
    pub fn holds_part(&self, step: u32, author: PeerId, pieces: Range<usize>) -> bool {
        self.get(step, author).is_some_and(|held| held.covers(&Chunk::values(self.len, pieces)))
    }

    /// Whether all of `author`'s contribution to `step` is here: whole (f32 among them: not
    /// packed, so no part of it is a chunk), or as one chunk of every piece (a repair asked of
    /// chunk owners, `Session::ask_whole`).
    pub fn holds_whole(&self, step: u32, author: PeerId) -> bool {
        self.get(step, author).is_some_and(|held| held.whole.is_some())
            || self.holds_part(step, author, 0..owners::PIECES)
    }

    /// `peer`'s contribution to `step`, held or retained.
    pub fn get(&self, step: u32, peer: PeerId) -> Option<&Held> {
        self.held.get(&step).or_else(|| self.retained.get(&step)).and_then(|s| s.get(&peer))
    }

    /// The contributions held for `step` (not applied yet), ascending by sender.
    pub fn at(&self, step: u32) -> impl Iterator<Item = (PeerId, &Held)> {
        self.held.get(&step).into_iter().flatten().map(|(p, h)| (*p, h))
    }

    /// The record's contributions this member lacks: absent, or held with another digest (those
    /// are dropped, to be repaired with the one the record names). One held by its header
    /// alone is held.
    pub fn missing(&mut self, record: &StepRecord) -> Vec<PeerId> {
        let step = self.held.entry(record.step).or_default();
        let mut missing = Vec::new();
        for named in &record.contributions {
            if step.get(&named.peer).is_some_and(|h| h.digest != named.digest) {
                step.remove(&named.peer);
            }
            if !step.contains_key(&named.peer) {
                missing.push(named.peer);
            }
        }
        missing
    }

    /// Whether every contribution the record names is here, with the digest it names (nothing
    /// is dropped: the record may not be the one that commits).
    pub fn holds(&self, record: &StepRecord) -> bool {
        let step = self.held.get(&record.step);
        record.contributions.iter().all(|n| step.and_then(|s| s.get(&n.peer)).is_some_and(|h| h.digest == n.digest))
    }

    /// The guard over a record whose contributions are all here: each was computed from the
    /// record's weights with a healthy probe, and so were ours (`own`: our weight hash, if this
    /// node knows it).
    pub fn guard(
        &self,
        record: &StepRecord,
        me: PeerId,
        own: Option<u32>,
        expected_phash: u32,
    ) -> Result<(), GuardFailure> {
        let mut failure = GuardFailure { step: record.step, weight_mismatch: Vec::new(), probe_mismatch: Vec::new() };
        for named in &record.contributions {
            let Some(held) = self.get(record.step, named.peer) else { continue };
            if held.header.whash != record.whash {
                failure.weight_mismatch.push(named.peer);
            }
            if held.header.phash != expected_phash {
                failure.probe_mismatch.push(named.peer);
            }
        }
        if own.is_some_and(|w| w != record.whash) && !failure.weight_mismatch.contains(&me) {
            failure.weight_mismatch.push(me);
        }
        if failure.weight_mismatch.is_empty() && failure.probe_mismatch.is_empty() {
            Ok(())
        } else {
            Err(failure)
        }
    }

    /// The record's contributions, held, in its order (`None` unless all are).
    fn named(&self, record: &StepRecord) -> Option<Vec<&Held>> {
        record.contributions.iter().map(|n| self.get(record.step, n.peer)).collect()
    }

    /// The mean loss of the record's contributions, in its order.
    fn loss(held: &[&Held]) -> f32 {
        held.iter().fold(0.0f32, |a, h| a + h.header.loss) / held.len() as f32
    }

    /// The record's mean and mean loss (in roster order), once every contribution is here whole.
    pub fn reduce(&self, record: &StepRecord) -> Option<(Reduced, f32)> {
        let held = self.named(record)?;
        if held.is_empty() {
            return Some((Reduced { mean: vec![0.0; self.len], grid: Vec::new() }, f32::NAN));
        }
        let wholes: Option<Vec<&Gradient>> = held.iter().map(|h| h.whole.as_ref()).collect();
        let wholes = wholes?;
        let values: Vec<&sync::Values> = wholes.iter().map(|g| &g.values).collect();
        let weights: Vec<u32> = held.iter().map(|h| h.header.weight).collect();
        Some((sync::reduce(&values, &weights), Self::loss(&held)))
    }

    /// The largest quant of the run's compression.
    fn limit(&self) -> i8 {
        match self.compression.values_as() {
            Compression::Int4 => sync::INT4_LIMIT,
            _ => i8::MAX,
        }
    }

    /// Chunk owners: the sum of chunk `range` of the record's contributions from their values
    /// held here (whole, or the chunk owned), where all are. A block out of the run's bound is
    /// summed as empty: the owner of a chunk is the only member that sees it, and whoever sums
    /// it — however the values are cut into chunks — decides alike, block by block.
    pub fn chunk_sum(&self, record: &StepRecord, range: Range<usize>) -> Option<ChunkSum> {
        let held = self.named(record)?;
        let parts: Option<Vec<Packed>> = held.iter().map(|h| h.part(&range).map(within_bound)).collect();
        let parts = parts?;
        let weighted: Vec<(&Packed, u32)> = parts.iter().zip(&held).map(|(p, h)| (p, h.header.weight)).collect();
        let mut sum = ChunkSum::of(&weighted, 0..range.len());
        sum.start = range.start;
        Some(sum)
    }

    /// Chunk owners: `author`'s fingerprint of its terms in `sum` under `seed`, the
    /// contribution at place `index` of its record ([`owners::GRID_WRONG`] where the sum's grid
    /// misrepresents it), from its values there as held here — each block past the run's bound
    /// empty, as the owner summed it; `None` where they are not held.
    pub fn fingerprint(&self, step: u32, author: PeerId, index: usize, sum: &ChunkSum, seed: u64) -> Option<u64> {
        let range = sum.start..sum.start + sum.sum.len();
        let part = within_bound(self.get(step, author)?.part(&range)?);
        Some(owners::contribution_fingerprint(&part, range.start, index, sum, seed).unwrap_or(owners::GRID_WRONG))
    }

    /// Chunk owners: the record's contributions whose values `range` are not held here (neither
    /// whole nor the chunk).
    pub fn lacking_part(&self, record: &StepRecord, range: Range<usize>) -> Vec<PeerId> {
        record
            .contributions
            .iter()
            .filter(|n| self.get(record.step, n.peer).is_none_or(|h| !h.covers(&range)))
            .map(|n| n.peer)
            .collect()
    }

    /// Chunk owners: the record's mean and mean loss from the chunk sums of its `owners`
    /// owners (an owner's sum received, or the chunk summed here from the values held), laid
    /// end to end — or which chunks lack both.
    pub fn reduce_owned(&mut self, record: &StepRecord, owners: usize) -> Result<(Reduced, f32), Lacking> {
        let mut lacking = Lacking { chunks: Vec::new(), refused: Vec::new() };
        let Some(held) = self.named(record) else { return Err(lacking) };
        if held.is_empty() {
            return Ok((Reduced { mean: vec![0.0; self.len], grid: Vec::new() }, f32::NAN));
        }
        let n = held.len();
        let weight: u64 = held.iter().map(|h| u64::from(h.header.weight)).sum();
        let loss = Self::loss(&held);
        let key = (record.step, record.digest());
        let limit = self.limit();
        let mut chunks = Vec::with_capacity(owners);
        for c in 0..owners {
            let range = owners::chunk(self.len, owners, c);
            let owner = c as u16;
            let sums = self.sums.get(&key);
            let read = sums.and_then(|s| s.read.get(&owner)).cloned();
            let decoded = match (read, sums.and_then(|s| s.bytes.get(&owner))) {
                (Some(sum), _) => Some(Ok(sum)),
                (None, Some(bytes)) => Some(ChunkSum::decode(bytes, (self.len, owners, c), (n, limit, weight))),
                (None, None) => None,
            };
            let sum = match decoded {
                Some(Ok(sum)) => Some(sum),
                Some(Err(why)) => {
                    // Refused: dropped, to be asked again (or summed here).
                    let from = self.sums.get_mut(&key).and_then(|s| {
                        s.bytes.remove(&owner);
                        s.from.remove(&owner)
                    });
                    lacking.refused.push((owner, from.unwrap_or(0), why));
                    None
                }
                None => None,
            };
            let sum = sum.or_else(|| if range.is_empty() { None } else { self.chunk_sum(record, range.clone()) });
            match sum {
                Some(sum) => chunks.push(sum),
                None if range.is_empty() => {}
                None => lacking.chunks.push(owner),
            }
        }
        if !lacking.chunks.is_empty() {
            return Err(lacking);
        }
        let sums = self.sums.entry(key).or_default();
        let (mut grid, mut sum) = (Vec::with_capacity(self.len.div_ceil(BLOCK)), Vec::with_capacity(self.len));
        for (c, chunk) in chunks.into_iter().enumerate() {
            grid.extend_from_slice(&chunk.grid);
            // A sum of `n` terms of at most 127 each, weights 1 (chunk owners run every-step).
            sum.extend(chunk.sum.iter().map(|&v| v as i32));
            sums.read.insert(c as u16, chunk);
        }
        let mean = sync::mean(&sum, &grid, n);
        self.grids.insert(record.step, grid.clone());
        Ok((Reduced { mean, grid }, loss))
    }

    /// Chunk owners: the grid an applied step was summed on, where it was summed from chunk
    /// sums.
    pub fn grid_of(&self, step: u32) -> Option<&Vec<u8>> {
        self.grids.get(&step)
    }

    /// `step` is applied: what was held for it is kept for repairs, everything held for it or
    /// before is done with, and retained steps older than [`RETAINED_STEPS`] go.
    pub fn applied(&mut self, step: u32) {
        let done: Vec<u32> = self.held.range(..=step).map(|(s, _)| *s).collect();
        for s in done {
            let contributions = self.held.remove(&s).unwrap_or_default();
            if s == step {
                self.retained.insert(s, contributions);
            }
        }
        let kept = |s: &u32| step.saturating_sub(*s) < RETAINED_STEPS;
        self.retained.retain(|s, _| kept(s));
        self.sums.retain(|(s, _), _| kept(s) || *s > step);
        self.grids.retain(|s, _| kept(s));
        self.early.retain(|(s, _), _| *s > step);
    }

    /// The weights were resumed at `step` (the log's, from its leader): what is held for the
    /// steps after it stays; what was kept for the steps before it goes.
    pub fn resumed(&mut self, step: u32) {
        self.held.retain(|s, _| *s > step);
        self.retained.clear();
        self.sums.retain(|(s, _), _| *s > step);
        self.grids.clear();
        self.early.retain(|(s, _), _| *s > step);
    }

    /// The weights were replaced by a push: nothing held belongs to them.
    pub fn clear(&mut self) {
        self.held.clear();
        self.retained.clear();
        self.sums.clear();
        self.grids.clear();
        self.early.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::session::log::Named;
    use crate::sync::Values;

    fn g(step: u32, whash: u32, values: &[f32]) -> Gradient {
        Gradient { step, whash, phash: 7, loss: 1.0, values: Values::F32(values.to_vec()), weight: 1, state: 0 }
    }

    fn record_of(c: &Contributions, step: u32, whash: u32, peers: &[PeerId]) -> StepRecord {
        let contributions =
            peers.iter().map(|&peer| Named { peer, digest: c.get(step, peer).unwrap().digest, weight: 1 }).collect();
        StepRecord { step, whash, contributions }
    }

    #[test]
    fn sums_in_the_records_order_whatever_the_arrival_order() {
        // 1e8 + 1 - 1e8 rounds differently depending on order: the record decides.
        let big = 1.0e8f32;
        let grads = [(10u64, [big]), (20, [1.0]), (30, [-big])];
        let mut forward = Contributions::new(1, &SyncConfig::SEED);
        let mut reversed = Contributions::new(1, &SyncConfig::SEED);
        for (p, v) in grads {
            assert_eq!(forward.offer(p, g(5, 1, &v)), Offer::Accepted);
        }
        for (p, v) in grads.iter().rev() {
            reversed.offer(*p, g(5, 1, v));
        }
        let record = record_of(&forward, 5, 1, &[10, 20, 30]);
        let a = forward.reduce(&record).unwrap().0.mean;
        assert_eq!(a[0].to_bits(), reversed.reduce(&record).unwrap().0.mean[0].to_bits());
        assert_eq!(a[0], ((big + 1.0) - big) / 3.0);
        // A record naming fewer sums fewer.
        let two = record_of(&forward, 5, 1, &[10, 30]);
        assert_eq!(forward.reduce(&two).unwrap().0.mean, vec![0.0]);
    }

    #[test]
    fn refused_contributions_say_why_and_duplicates_keep_the_first() {
        let mut c = Contributions::new(2, &SyncConfig::SEED);
        assert_eq!(c.offer(1, g(3, 9, &[1.0, 2.0])), Offer::Accepted);
        assert_eq!(c.offer(1, g(3, 9, &[5.0, 5.0])), Offer::Duplicate);
        assert_eq!(c.offer(2, g(3, 9, &[1.0])), Offer::WrongLength { expected: 2, actual: 1 });
        let packed = Gradient { values: Values::Int8(crate::sync::pack(&[1.0, 2.0]).unwrap()), ..g(3, 9, &[]) };
        assert_eq!(c.offer(2, packed), Offer::WrongEncoding { expected: Compression::None, actual: Compression::Int8 });
        let bound = crate::sync::CONTRIBUTION_BOUND;
        for (values, index) in [([1.0, f32::NAN], 1), ([f32::NEG_INFINITY, 0.0], 0), ([0.0, bound * 2.0], 1)] {
            match c.offer(2, g(3, 9, &values)) {
                Offer::OutOfBounds(e) => assert_eq!(e.index, index, "{values:?}"),
                other => panic!("{values:?}: {other:?}"),
            }
        }
        assert!(c.get(3, 2).is_none(), "nothing refused was kept");
        assert_eq!(c.get(3, 1).unwrap().whole.as_ref().unwrap().values, Values::F32(vec![1.0, 2.0]));
    }

    #[test]
    fn a_record_names_its_contributions_by_digest() {
        let mut c = Contributions::new(1, &SyncConfig::SEED);
        c.offer(1, g(4, 9, &[1.0]));
        c.offer(2, g(4, 9, &[2.0]));
        let mut record = record_of(&c, 4, 9, &[1, 2]);
        assert_eq!(c.missing(&record), Vec::<PeerId>::new());
        // The record names another contribution of member 2: ours is dropped, to be repaired.
        record.contributions[1].digest ^= 1;
        assert_eq!(c.missing(&record), vec![2]);
        assert!(c.get(4, 2).is_none());
        assert!(c.reduce(&record).is_none());
        // Kept once applied, for repairs, four steps deep.
        c.applied(4);
        assert!(c.get(4, 1).is_some() && c.at(4).next().is_none());
        for step in 5..9 {
            c.offer(1, g(step, 9, &[1.0]));
            c.applied(step);
        }
        assert!(c.get(4, 1).is_none() && c.get(5, 1).is_some());
    }

    #[test]
    fn the_guard_names_step_and_peers() {
        let mut c = Contributions::new(1, &SyncConfig::SEED);
        c.offer(1, g(8, 0xaa, &[0.0]));
        c.offer(2, Gradient { phash: 6, ..g(8, 0xab, &[0.0]) });
        c.offer(3, g(8, 0xaa, &[0.0]));
        let record = record_of(&c, 8, 0xaa, &[1, 2, 3]);
        let failure = c.guard(&record, 1, Some(0xaa), 7).unwrap_err();
        assert_eq!(failure, GuardFailure { step: 8, weight_mismatch: vec![2], probe_mismatch: vec![2] });
        assert!(failure.to_string().contains("step 8") && failure.to_string().contains("[2]"));
        let ok = record_of(&c, 8, 0xaa, &[1, 3]);
        assert_eq!(c.guard(&ok, 1, Some(0xaa), 7), Ok(()));
        // Our own weights differ from the record's: we are named.
        assert_eq!(c.guard(&ok, 5, Some(0xbb), 7).unwrap_err().weight_mismatch, vec![5]);
    }
}

#[cfg(test)]
mod owners_tests;
