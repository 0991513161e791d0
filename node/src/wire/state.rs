//! A packed contribution's private state on the wire: how it is named, asked for and served
//! (`-22`, `-23`; `docs/TRUST.md`, "An audit of a part").
//!
//! A state (the error-feedback residual; an `outer:H` window's inner optimizer state with it) is
//! cut into chunks of [`STATE_CHUNK`] values; its digest, which the contribution names, is the
//! digest of its length and its chunks' digests. An auditor asks for some chunks only: the
//! answer carries every chunk's digest (8 bytes for 4 KB of state), so each chunk served is
//! checked against the digest the contribution named, and the values of the chunks not asked
//! for never travel.
//!
//! | message | bytes |
//! |---|---|
//! | state request | `[u32 step][u32 n][u32 chunk × n]` (`n` = `0xffffffff` and no list: the whole state; `n` = 0: the chunks' digests alone) |
//! | state | `[u32 step][u32 len][u32 chunks][u64 digest × chunks][u32 parts][part × parts]`, a part `[u32 chunk][f32 × the chunk's values]`; `len` 0 and nothing more: not kept |

use std::ops::Range;

use super::{Reader, WireError, WordHash};

/// Values in a chunk of a state (the last one may be short): a multiple of the packed
/// encoding's block, so a chunk's values are packed on their own.
pub const STATE_CHUNK: usize = 1024;
const WHOLE: u32 = u32::MAX;

/// The values of chunk `chunk` of a state of `len` values.
pub fn chunk_range(chunk: u32, len: usize) -> Range<usize> {
    let start = (chunk as usize).saturating_mul(STATE_CHUNK).min(len);
    start..(start + STATE_CHUNK).min(len)
}

/// How many chunks a state of `len` values has.
pub fn chunks_of(len: usize) -> usize {
    len.div_ceil(STATE_CHUNK)
}

/// Each chunk's digest: [`WordHash`] over its length, then its f32 bits two to a word.
pub fn state_chunk_digests(values: &[f32]) -> Vec<u64> {
    values
        .chunks(STATE_CHUNK)
        .map(|chunk| {
            let mut h = WordHash(WordHash::BASIS);
            h.word(chunk.len() as u64);
            h.f32s(chunk);
            h.0
        })
        .collect()
}

/// The digest a contribution names its state by, from the state's length and its chunks'
/// digests.
pub fn state_digest_of(len: usize, digests: &[u64]) -> u64 {
    let mut h = WordHash(WordHash::BASIS);
    h.word(len as u64);
    digests.iter().for_each(|&d| h.word(d));
    h.0
}

/// [`state_digest_of`] a state's values.
pub fn state_digest(values: &[f32]) -> u64 {
    state_digest_of(values.len(), &state_chunk_digests(values))
}

/// What an auditor asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatePart {
    Whole,
    /// These chunks (none: the digests alone), in increasing order.
    Chunks(Vec<u32>),
}

impl StatePart {
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            StatePart::Whole => out.extend_from_slice(&WHOLE.to_le_bytes()),
            StatePart::Chunks(chunks) => {
                out.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
                chunks.iter().for_each(|c| out.extend_from_slice(&c.to_le_bytes()));
            }
        }
    }

    pub(super) fn decode(r: &mut Reader) -> Result<StatePart, WireError> {
        let n = r.u32()?;
        if n == WHOLE {
            return Ok(StatePart::Whole);
        }
        if n as usize > r.remaining() / 4 {
            return Err(WireError::Invalid(format!("a state request for {n} chunks in {} bytes", r.remaining())));
        }
        let chunks = (0..n).map(|_| r.u32()).collect::<Result<Vec<u32>, _>>()?;
        if !chunks.windows(2).all(|w| w[0] < w[1]) {
            return Err(WireError::Invalid("a state request's chunks out of order".into()));
        }
        Ok(StatePart::Chunks(chunks))
    }

    /// The chunks it names of a state of `len` values.
    pub fn chunks(&self, len: usize) -> Vec<u32> {
        match self {
            StatePart::Whole => (0..chunks_of(len) as u32).collect(),
            StatePart::Chunks(chunks) => chunks.clone(),
        }
    }
}

/// The answer to a state request: the state's length, every chunk's digest, and the values of
/// the chunks asked for; or nothing (`len` 0) when the state is no longer kept.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServedState {
    pub len: u32,
    pub digests: Vec<u64>,
    pub parts: Vec<(u32, Vec<f32>)>,
}

/// Why a served state is not the one asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotServed {
    /// None kept.
    Gone,
    /// Another state's, or not the part asked for.
    Another,
}

impl ServedState {
    /// What a member serves of `state` (whose chunk digests are `digests`) for `part`; chunks
    /// past the state are left out (the asker finds the part missing).
    pub fn of(state: &[f32], digests: &[u64], part: &StatePart) -> ServedState {
        let parts = part
            .chunks(state.len())
            .into_iter()
            .filter(|&c| (c as usize) < digests.len())
            .map(|c| (c, state[chunk_range(c, state.len())].to_vec()))
            .collect();
        ServedState { len: state.len() as u32, digests: digests.to_vec(), parts }
    }

    /// Checks the answer against the asker's expectations — a state of `len` values named
    /// `named`, `part` of it — and gives the state with the chunks served in place (zeros
    /// elsewhere).
    pub fn check(&self, len: usize, named: u64, part: &StatePart) -> Result<Vec<f32>, NotServed> {
        if self.len == 0 && self.digests.is_empty() {
            return Err(NotServed::Gone);
        }
        let whole = self.len as usize == len
            && self.digests.len() == chunks_of(len)
            && state_digest_of(len, &self.digests) == named;
        let asked = part.chunks(len);
        let served: Vec<u32> = self.parts.iter().map(|(c, _)| *c).collect();
        if !whole || served != asked {
            return Err(NotServed::Another);
        }
        let mut state = vec![0.0; len];
        for (chunk, values) in &self.parts {
            let range = chunk_range(*chunk, len);
            if state_chunk_digests(values) != [self.digests[*chunk as usize]] || values.len() != range.len() {
                return Err(NotServed::Another);
            }
            state[range].copy_from_slice(values);
        }
        Ok(state)
    }

    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.len.to_le_bytes());
        if self.len == 0 && self.digests.is_empty() {
            return;
        }
        out.extend_from_slice(&(self.digests.len() as u32).to_le_bytes());
        self.digests.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
        out.extend_from_slice(&(self.parts.len() as u32).to_le_bytes());
        for (chunk, values) in &self.parts {
            out.extend_from_slice(&chunk.to_le_bytes());
            values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        }
    }

    pub(super) fn decode(r: &mut Reader) -> Result<ServedState, WireError> {
        let len = r.u32()?;
        if len == 0 && r.remaining() == 0 {
            return Ok(ServedState::default());
        }
        let chunks = r.u32()? as usize;
        if chunks != chunks_of(len as usize) {
            return Err(WireError::Invalid(format!("a state of {len} values in {chunks} chunks")));
        }
        if chunks > r.remaining() / 8 {
            return Err(WireError::Truncated { needed: chunks * 8, have: r.remaining() });
        }
        let digests = (0..chunks).map(|_| r.u64()).collect::<Result<Vec<u64>, _>>()?;
        let parts = r.u32()? as usize;
        if parts > chunks {
            return Err(WireError::Invalid(format!("{parts} parts of a state of {chunks} chunks")));
        }
        let mut served = Vec::with_capacity(parts);
        for _ in 0..parts {
            let chunk = r.u32()?;
            if chunk as usize >= chunks {
                return Err(WireError::Invalid(format!("chunk {chunk} of a state of {chunks} chunks")));
            }
            let words = chunk_range(chunk, len as usize).len();
            let bytes = r.take(words * 4)?;
            served.push((chunk, bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()));
        }
        Ok(ServedState { len, digests, parts: served })
    }
}
