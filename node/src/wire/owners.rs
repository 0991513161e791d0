//! The chunk owners' frames (`docs/OWNERS.md`): a contribution's header (`-29`), a chunk of it
//! sent to its owner (`-30`) and an owner's chunk sum (`-31`) — the table in `wire.rs`.

use super::gradient::{put_packed, read_packed};
use super::*;
use crate::sync::owners::{piece, PIECES};

/// A contribution without its values (`-29`): its fields and the digests of its [`PIECES`]
/// pieces, from which its digest follows ([`Header::digest`]). What every member of a group
/// with chunk owners is sent of every other's contribution.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub step: u32,
    pub whash: u32,
    pub phash: u32,
    pub loss: f32,
    pub weight: u32,
    pub state: u64,
    /// The values' form: f32 (`None`), int8 or int4.
    pub encoding: Compression,
    /// How many values.
    pub len: u32,
    /// Each piece's [`piece_digest`], [`PIECES`] of them.
    pub pieces: Vec<u64>,
}

impl Header {
    /// The contribution's digest ([`Gradient::digest`]): [`WordHash`] over the words `step`,
    /// `whash`, `phash`, the loss's bits, `weight`, `state`, the encoding (0 f32, 1 int8, 2 int4)
    /// and the value count, then the pieces' digests in order.
    pub fn digest(&self) -> u64 {
        let mut h = WordHash(WordHash::BASIS);
        for word in [u64::from(self.step), u64::from(self.whash), u64::from(self.phash)] {
            h.word(word);
        }
        let kind = encoding_byte(self.encoding);
        for word in [u64::from(self.loss.to_bits()), u64::from(self.weight), self.state, u64::from(kind)] {
            h.word(word);
        }
        h.word(u64::from(self.len));
        self.pieces.iter().for_each(|&d| h.word(d));
        h.0
    }

    /// Whether `chunk` is this contribution's values over its pieces (each piece's digest the
    /// header's), of its encoding and step.
    pub fn names(&self, chunk: &Chunk) -> bool {
        let len = self.len as usize;
        let range = chunk.range(len);
        chunk.step == self.step
            && chunk.values.compression() == self.encoding
            && chunk.values.len() == range.len()
            && chunk.pieces().all(|p| {
                let values = piece(len, p);
                piece_digest(&chunk.values, values.start - range.start..values.end - range.start) == self.pieces[p]
            })
    }
}

/// `0` f32, `1` int8, `2` int4: a header's encoding byte and a digest's kind word.
fn encoding_byte(encoding: Compression) -> u8 {
    match encoding.values_as() {
        Compression::None => 0,
        Compression::Int4 => 2,
        _ => 1,
    }
}

/// Pieces `first..end` of `author`'s contribution to `step` (`-30`), sent to the owner who sums
/// them: packed values only (chunk owners sum integers).
#[derive(Clone, Debug, PartialEq)]
pub struct Chunk {
    pub step: u32,
    pub author: PeerId,
    pub first: u8,
    pub end: u8,
    pub values: Values,
}

impl Chunk {
    /// Pieces `pieces` of `gradient`'s values, as its author sends them.
    pub fn of(gradient: &Gradient, author: PeerId, pieces: std::ops::Range<usize>) -> Chunk {
        let len = gradient.values.len();
        let range = Chunk::values(len, pieces.clone());
        let values = match &gradient.values {
            Values::F32(v) => Values::F32(v[range].to_vec()),
            Values::Int8(p) | Values::Int4(p) => {
                let blocks = range.start / BLOCK..range.end.div_ceil(BLOCK);
                let part = Packed { exponents: p.exponents[blocks].to_vec(), q: p.q[range].to_vec() };
                Values::packed_as(gradient.values.compression(), part)
            }
        };
        Chunk { step: gradient.step, author, first: pieces.start as u8, end: pieces.end as u8, values }
    }

    /// The values pieces `pieces` of a contribution of `len` values hold.
    pub fn values(len: usize, pieces: std::ops::Range<usize>) -> std::ops::Range<usize> {
        crate::sync::owners::pieces_values(len, pieces)
    }

    /// Its pieces.
    pub fn pieces(&self) -> std::ops::Range<usize> {
        usize::from(self.first)..usize::from(self.end)
    }

    /// Which values of a contribution of `len` values it holds.
    pub fn range(&self, len: usize) -> std::ops::Range<usize> {
        Chunk::values(len, self.pieces())
    }
}

pub(super) fn put_header(out: &mut Vec<u8>, author: PeerId, h: &Header) {
    out.extend_from_slice(&HEADER.to_le_bytes());
    out.extend_from_slice(&author.to_le_bytes());
    for word in [h.step, h.whash, h.phash, h.loss.to_bits(), h.weight] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(&h.state.to_le_bytes());
    out.push(encoding_byte(h.encoding));
    out.extend_from_slice(&h.len.to_le_bytes());
    assert_eq!(h.pieces.len(), PIECES, "a header names every piece");
    h.pieces.iter().for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
}

pub(super) fn read_header(r: &mut Reader<'_>) -> Result<Header, WireError> {
    let (step, whash, phash, loss, weight) = (r.u32()?, r.u32()?, r.u32()?, r.f32()?, r.u32()?);
    let state = r.u64()?;
    let encoding = match r.u8()? {
        0 => Compression::None,
        1 => Compression::Int8,
        2 => Compression::Int4,
        other => return Err(WireError::Invalid(format!("a header's encoding {other}"))),
    };
    if weight == 0 {
        return Err(WireError::Invalid("a header of weight 0".into()));
    }
    if step > i32::MAX as u32 {
        return Err(WireError::Invalid(format!("a header's step {step} is beyond the wire's range")));
    }
    let len = r.u32()?;
    let pieces = (0..PIECES).map(|_| r.u64()).collect::<Result<_, _>>()?;
    Ok(Header { step, whash, phash, loss, weight, state, encoding, len, pieces })
}

pub(super) fn put_chunk(out: &mut Vec<u8>, c: &Chunk) {
    out.extend_from_slice(&CHUNK.to_le_bytes());
    out.extend_from_slice(&c.step.to_le_bytes());
    out.extend_from_slice(&c.author.to_le_bytes());
    out.extend_from_slice(&[c.first, c.end, encoding_byte(c.values.compression())]);
    assert!(c.values.packed().is_some(), "a chunk is packed");
    put_packed(out, &c.values);
}

pub(super) fn read_chunk(r: &mut Reader<'_>) -> Result<Chunk, WireError> {
    let (step, author) = (r.u32()?, r.u64()?);
    let (first, end, encoding) = (r.u8()?, r.u8()?, r.u8()?);
    if first >= end || usize::from(end) > PIECES {
        return Err(WireError::Invalid(format!("a chunk of pieces {first}..{end} (of {PIECES})")));
    }
    let values = match encoding {
        1 | 2 => read_packed(r, encoding == 2)?,
        other => return Err(WireError::Invalid(format!("a chunk's encoding {other} (chunks are int8 or int4)"))),
    };
    Ok(Chunk { step, author, first, end, values })
}

/// An owner's sum of chunk `owner` of `owners` of the contributions `record` names (`-31`): the
/// record by its digest (`StepRecord::digest`), the sum as `sync::owners::ChunkSum::encode`
/// writes it (read by the session, which knows the model's length and the record's weights).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SumMessage {
    pub step: u32,
    pub record: u64,
    pub owner: u16,
    pub owners: u16,
    pub bytes: Vec<u8>,
}

pub(super) fn put_sum(out: &mut Vec<u8>, s: &SumMessage) {
    out.extend_from_slice(&CHUNK_SUM.to_le_bytes());
    out.extend_from_slice(&s.step.to_le_bytes());
    out.extend_from_slice(&s.record.to_le_bytes());
    out.extend_from_slice(&s.owner.to_le_bytes());
    out.extend_from_slice(&s.owners.to_le_bytes());
    out.extend_from_slice(&s.bytes);
}

pub(super) fn read_sum(r: &mut Reader<'_>) -> Result<SumMessage, WireError> {
    let (step, record, owner, owners) = (r.u32()?, r.u64()?, r.u16()?, r.u16()?);
    if owner >= owners {
        return Err(WireError::Invalid(format!("chunk {owner} of {owners} owners")));
    }
    Ok(SumMessage { step, record, owner, owners, bytes: r.rest().to_vec() })
}
