//! A contribution on the wire: its fields, its digest (what a commit record names it by) and
//! its four encodings (f32 `≥ 0`, f32 with a private state `-26`, int8 `-14`, int4 `-18`: the
//! table in `wire.rs`).

use super::*;
use crate::sync::owners::{piece, PIECES};

/// One node's contribution to a step.
#[derive(Clone, Debug, PartialEq)]
pub struct Gradient {
    pub step: u32,
    /// Weight hash before the step.
    pub whash: u32,
    /// Probe hash through the node's live kernel.
    pub phash: u32,
    pub loss: f32,
    /// The gradient (`every-step`) or pseudo-gradient (`outer:H`), f32 or packed.
    pub values: Values,
    /// Its weight in the group's mean (`sync::SyncConfig::weights_allowed`): the inner steps it
    /// stands for in elastic windows, else 1. Packed messages carry it; an f32 one is 1.
    pub weight: u32,
    /// The private state the values were made with, by digest ([`state_digest`] of the int8 or
    /// int4 error-feedback residual added before packing): what an auditor asks for (`-22`) to
    /// recompute the contribution; `outer:H` windows name their inner optimizer's state with it.
    /// Packed messages carry it; an f32 one carries it in the `-26` form, which an f32
    /// contribution with a state takes (else the seed's `≥ 0`, with none).
    pub state: u64,
}

impl Gradient {
    /// The contribution's 64-bit digest, what a step's commit record names it by
    /// (`docs/PROTOCOL.md`, "The log"): its [`Header`]'s ([`Header::digest`]) — the fields and
    /// the digests of its [`PIECES`] pieces. A function of what the wire carries, so a repair
    /// (`-8`) has the same digest as the original, and a header (`-29`) names the same
    /// contribution as the whole of it.
    pub fn digest(&self) -> u64 {
        self.header().digest()
    }

    /// The contribution without its values: its fields and its pieces' digests.
    pub fn header(&self) -> Header {
        Header {
            step: self.step,
            whash: self.whash,
            phash: self.phash,
            loss: self.loss,
            weight: self.weight,
            state: self.state,
            encoding: self.values.compression(),
            len: self.values.len() as u32,
            pieces: (0..PIECES).map(|p| piece_digest(&self.values, piece(self.values.len(), p))).collect(),
        }
    }
}

/// The digest of `values`' values `range` (one piece, or several: a chunk's): [`WordHash`] over
/// their count, then f32 bits two to a word, or the blocks' exponent bytes then the quants one
/// byte each, as little-endian words. `range` is block-aligned for packed values.
pub fn piece_digest(values: &Values, range: std::ops::Range<usize>) -> u64 {
    let mut h = WordHash(WordHash::BASIS);
    h.word(range.len() as u64);
    match values {
        Values::F32(values) => h.f32s(&values[range]),
        Values::Int8(p) | Values::Int4(p) => {
            h.bytes(&p.exponents[range.start / BLOCK..range.end.div_ceil(BLOCK)]);
            // Quants are i8: their bytes are their two's complement.
            h.bytes(bytemuck_i8(&p.q[range]));
        }
    }
    h.0
}

/// `i8`s as the bytes they are.
fn bytemuck_i8(q: &[i8]) -> &[u8] {
    // SAFETY: `i8` and `u8` have the same size, alignment and validity (every bit pattern).
    unsafe { std::slice::from_raw_parts(q.as_ptr().cast::<u8>(), q.len()) }
}

pub(super) fn put_gradient(out: &mut Vec<u8>, g: &Gradient) {
    assert!(g.step <= i32::MAX as u32, "steps fit the wire's i32");
    let sentinel = match g.values {
        Values::F32(_) if g.state != 0 => Some(F32_STATE_GRADIENT),
        Values::F32(_) => None,
        Values::Int8(_) => Some(PACKED_GRADIENT),
        Values::Int4(_) => Some(PACKED4_GRADIENT),
    };
    match sentinel {
        Some(sentinel) => {
            out.extend_from_slice(&sentinel.to_le_bytes());
            out.extend_from_slice(&g.step.to_le_bytes());
        }
        None => out.extend_from_slice(&(g.step as i32).to_le_bytes()),
    }
    out.extend_from_slice(&g.whash.to_le_bytes());
    out.extend_from_slice(&g.phash.to_le_bytes());
    out.extend_from_slice(&g.loss.to_le_bytes());
    if sentinel.is_some() {
        out.extend_from_slice(&g.weight.to_le_bytes());
        out.extend_from_slice(&g.state.to_le_bytes());
    }
    if matches!(g.values, Values::F32(_)) {
        assert_eq!(g.weight, 1, "an f32 gradient's weight is 1 (elastic windows need int8 or int4)");
    }
    match &g.values {
        Values::F32(values) => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        packed => put_packed(out, packed),
    }
}

/// A packed body: `[u32 len][u8 block byte × ⌈len/32⌉]`, then the quants, int8's a byte each,
/// int4's two to a byte (`-14`, `-18`, and a chunk's `-30`). f32 values write nothing.
pub(super) fn put_packed(out: &mut Vec<u8>, values: &Values) {
    match values {
        Values::F32(_) => {}
        Values::Int8(p) => {
            out.extend_from_slice(&(p.q.len() as u32).to_le_bytes());
            out.extend_from_slice(&p.exponents);
            out.extend(p.q.iter().map(|&q| q as u8));
        }
        Values::Int4(p) => {
            out.extend_from_slice(&(p.q.len() as u32).to_le_bytes());
            out.extend_from_slice(&p.exponents);
            out.extend(p.q.chunks(2).map(|pair| {
                let high = pair.get(1).copied().unwrap_or(0);
                (pair[0] as u8 & 15) | ((high as u8) << 4)
            }));
        }
    }
}

/// [`put_packed`]'s body, int4's (`int4`) or int8's, validated.
pub(super) fn read_packed(r: &mut Reader<'_>, int4: bool) -> Result<Values, WireError> {
    let len = r.u32()? as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(WireError::Invalid(format!("a packed gradient of {len} values")));
    }
    let exponents = r.take(len.div_ceil(BLOCK))?.to_vec();
    if !int4 {
        let q: Vec<i8> = r.take(len)?.iter().map(|&b| b as i8).collect();
        let packed = Packed { exponents, q };
        packed.validate(i8::MAX).map_err(WireError::Sync)?;
        Ok(Values::Int8(packed))
    } else {
        // Each nibble sign-extended: shift it to the top of an i8 and back.
        let bytes = r.take(len.div_ceil(2))?;
        if len % 2 == 1 && bytes[len / 2] >> 4 != 0 {
            return Err(WireError::Invalid("an int4 gradient's last high nibble is not 0".into()));
        }
        let q: Vec<i8> = (0..len).map(|i| ((bytes[i / 2] >> (4 * (i % 2))) << 4) as i8 >> 4).collect();
        let packed = Packed { exponents, q };
        packed.validate(crate::sync::INT4_LIMIT).map_err(WireError::Sync)?;
        Ok(Values::Int4(packed))
    }
}

/// Whether a message's first word is a gradient's sentinel (packed int8 or int4, or f32 with a
/// state), its step in the next word.
pub(super) fn is_gradient_sentinel(first: i32) -> bool {
    first == PACKED_GRADIENT || first == PACKED4_GRADIENT || first == F32_STATE_GRADIENT
}

/// A gradient message, any form, from its first word on.
pub(super) fn read_gradient(r: &mut Reader<'_>) -> Result<Gradient, WireError> {
    let first = r.i32()?;
    let sentinel = is_gradient_sentinel(first);
    let packed = sentinel && first != F32_STATE_GRADIENT;
    let step = if sentinel { r.u32()? } else { first as u32 };
    if !sentinel && first < 0 {
        return Err(WireError::Invalid(format!("gradient step {first} is negative")));
    }
    if step > i32::MAX as u32 {
        return Err(WireError::Invalid(format!("gradient step {step} is beyond the wire's range")));
    }
    let whash = r.u32()?;
    let phash = r.u32()?;
    let loss = r.f32()?;
    let weight = if sentinel { r.u32()? } else { 1 };
    if weight == 0 {
        return Err(WireError::Invalid("a gradient of weight 0".into()));
    }
    if !packed && weight != 1 {
        return Err(WireError::Invalid(format!("an f32 gradient of weight {weight} (elastic windows are packed)")));
    }
    let state = if sentinel { r.u64()? } else { 0 };
    if first == F32_STATE_GRADIENT && state == 0 {
        // One form for each gradient: an f32 one without a state is the seed's `≥ 0`.
        return Err(WireError::Invalid("an f32 gradient with a state names state 0".into()));
    }
    let values = if packed {
        read_packed(r, first == PACKED4_GRADIENT)?
    } else {
        let body = r.rest();
        if !body.len().is_multiple_of(4) {
            return Err(WireError::Invalid(format!("gradient body of {} bytes is not whole f32s", body.len())));
        }
        Values::F32(body.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    };
    Ok(Gradient { step, whash, phash, loss, values, weight, state })
}
