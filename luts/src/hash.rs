//! 32-bit FNV-1a, the seed's `whash`: the weight hash and the probe hash both use it.

const OFFSET_BASIS: u32 = 0x811c_9dc5;
const PRIME: u32 = 0x0100_0193;

/// FNV-1a over `bytes`, 32-bit.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    fnv1a32_continue(OFFSET_BASIS, bytes)
}

/// Continues an FNV-1a hash over more bytes, so a hash can be fed in pieces.
pub fn fnv1a32_continue(mut hash: u32, bytes: &[u8]) -> u32 {
    for &byte in bytes {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash
}

/// FNV-1a over `bytes`, 64-bit (checkpoint checksums).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// FNV-1a over the little-endian bytes of `values`.
pub fn fnv1a32_f32(values: &[f32]) -> u32 {
    values.iter().fold(OFFSET_BASIS, |hash, value| fnv1a32_continue(hash, &value.to_le_bytes()))
}

/// FNV-1a over the little-endian bytes of `words`: [`fnv1a32_f32`] of the f32 values with these
/// bits.
pub fn fnv1a32_u32(words: &[u32]) -> u32 {
    words.iter().fold(OFFSET_BASIS, |hash, word| fnv1a32_continue(hash, &word.to_le_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // Published FNV-1a 32-bit test vectors (draft-eastlake-fnv).
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn pieces_equal_whole() {
        let whole = fnv1a32(b"lockstep units");
        let piece = fnv1a32_continue(fnv1a32(b"lockstep "), b"units");
        assert_eq!(whole, piece);
        let floats = [1.5f32, -0.0, f32::MIN_POSITIVE];
        let bytes: Vec<u8> = floats.iter().flat_map(|f| f.to_le_bytes()).collect();
        assert_eq!(fnv1a32_f32(&floats), fnv1a32(&bytes));
        let words: Vec<u32> = floats.iter().map(|f| f.to_bits()).collect();
        assert_eq!(fnv1a32_u32(&words), fnv1a32(&bytes));
    }
}
