//! `mul_lut.bin`: the exact int8 product table.
//!
//! 65536 little-endian `i16`; the entry at `((a as u8 as usize) << 8) | (b as u8 as usize)` is
//! `a * b` for every `a, b: i8`. The file is written by `cargo run -p lockstep-luts --bin
//! generate-luts`, committed, and embedded here; a test proves file == generator == `*`.

use std::sync::OnceLock;

/// Number of entries: every ordered pair of `i8`.
pub const MUL_LUT_ENTRIES: usize = 1 << 16;

/// The committed table file, embedded.
pub static MUL_LUT_FILE: &[u8; MUL_LUT_ENTRIES * 2] = include_bytes!("../mul_lut.bin");

/// The table index of the pair `(a, b)`.
pub fn mul_lut_index(a: i8, b: i8) -> usize {
    ((a as u8 as usize) << 8) | (b as u8 as usize)
}

/// Generates the table's bytes from first principles: the generator behind `mul_lut.bin`.
pub fn generate_mul_lut() -> Vec<u8> {
    let mut bytes = Vec::with_capacity(MUL_LUT_ENTRIES * 2);
    for index in 0..MUL_LUT_ENTRIES {
        let a = (index >> 8) as u8 as i8;
        let b = (index & 0xff) as u8 as i8;
        let product = i16::from(a) * i16::from(b);
        bytes.extend_from_slice(&product.to_le_bytes());
    }
    bytes
}

/// The embedded table, decoded once.
pub fn mul_lut() -> &'static [i16; MUL_LUT_ENTRIES] {
    static TABLE: OnceLock<Box<[i16; MUL_LUT_ENTRIES]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = Box::new([0i16; MUL_LUT_ENTRIES]);
        for (entry, pair) in table.iter_mut().zip(MUL_LUT_FILE.chunks_exact(2)) {
            *entry = i16::from_le_bytes([pair[0], pair[1]]);
        }
        table
    })
}

/// `a * b` by table lookup.
pub fn lut_mul(a: i8, b: i8) -> i32 {
    i32::from(mul_lut()[mul_lut_index(a, b)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_equals_generator_equals_multiplication() {
        let generated = generate_mul_lut();
        assert_eq!(
            &generated[..],
            &MUL_LUT_FILE[..],
            "mul_lut.bin is stale: run `cargo run -p lockstep-luts --bin generate-luts`"
        );
        let mut checked = 0;
        for a in i8::MIN..=i8::MAX {
            for b in i8::MIN..=i8::MAX {
                let index = mul_lut_index(a, b);
                let from_file = i16::from_le_bytes([MUL_LUT_FILE[2 * index], MUL_LUT_FILE[2 * index + 1]]);
                assert_eq!(i32::from(from_file), i32::from(a) * i32::from(b), "entry {a} * {b}");
                assert_eq!(lut_mul(a, b), i32::from(a) * i32::from(b));
                checked += 1;
            }
        }
        assert_eq!(checked, MUL_LUT_ENTRIES);
    }

    #[test]
    fn index_layout_is_a_major() {
        assert_eq!(mul_lut_index(0, 0), 0);
        assert_eq!(mul_lut_index(0, -1), 0x00ff);
        assert_eq!(mul_lut_index(-1, 0), 0xff00);
        assert_eq!(mul_lut_index(-128, 1), 0x8001);
        // The entry for (-128, -128) is 16384: the table holds the full i8 range.
        assert_eq!(lut_mul(-128, -128), 16384);
    }
}
