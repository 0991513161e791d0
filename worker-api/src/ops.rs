//! ABI 2's ops as C data: [`OpCall`], one fixed-size record per op. Its layout is the op table's
//! record rule (`lockstep_luts::ops::define`: each op's fields in order, scalars and buffer
//! offsets into `params`, handles into `buffers`, flags into `flags`); the codes, flags and the
//! index of every parameter are generated from the table into the C header
//! (`include/lockstep_worker.h`). A decoder refuses unknown codes and flags.

use lockstep_luts::ops::{DecodeError, Op, Record, OPS};

pub use lockstep_luts::ops::{FLAG_ACCUMULATE, FLAG_BIAS};

/// One op, as it crosses the ABI. 168 bytes, pinned by a layout test.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpCall {
    pub code: u32,
    pub flags: u32,
    pub buffers: [u64; 8],
    pub params: [u32; 24],
}

/// How many op codes this version defines.
pub const COUNT: u32 = OPS.len() as u32;

/// The capability bit of op `code` in [`crate::WorkerVTable::ops`].
pub const fn bit(code: u32) -> u64 {
    1 << code
}

/// Every op this version defines.
pub const ALL: u64 = (1 << COUNT) - 1;

// ABI 2.0 defined thirteen ops; later versions only append (their codes never change).
const _: () = assert!(COUNT >= 13 && COUNT <= 64);

/// Encodes an op.
pub fn encode(op: &Op) -> OpCall {
    let Record { code, flags, buffers, params } = op.record();
    OpCall { code, flags, buffers, params }
}

/// Decodes a record.
pub fn decode(call: &OpCall) -> Result<Op, DecodeError> {
    let OpCall { code, flags, buffers, params } = *call;
    Op::from_record(&Record { code, flags, buffers, params })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn op_call_layout_is_pinned() {
        assert_eq!(size_of::<OpCall>(), 168);
        assert_eq!(offset_of!(OpCall, code), 0);
        assert_eq!(offset_of!(OpCall, flags), 4);
        assert_eq!(offset_of!(OpCall, buffers), 8);
        assert_eq!(offset_of!(OpCall, params), 72);
        assert_eq!((FLAG_ACCUMULATE, FLAG_BIAS), (1, 2));
        assert_eq!(ALL, (1u64 << COUNT) - 1);
        // The record the table's rule gives fits the C struct.
        assert_eq!(std::mem::size_of_val(&Record { code: 0, flags: 0, buffers: [0; 8], params: [0; 24] }), 8 + 64 + 96);
    }

    /// Every sample of the op table survives the trip through the C record.
    #[test]
    fn every_op_round_trips() {
        for op in lockstep_luts::ops::samples() {
            assert_eq!(decode(&encode(&op)), Ok(op), "{op:?}");
        }
        let gelu = encode(&lockstep_luts::ops::samples()[0]);
        assert_eq!(decode(&OpCall { code: COUNT, ..gelu }), Err(DecodeError::UnknownCode(COUNT)));
    }
}
