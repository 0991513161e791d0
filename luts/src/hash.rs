//! 32-bit FNV-1a: the probe hash, and (chunked, [`chunked_words`]) the weight hash `whash`.
//!
//! FNV-1a is a chain: each byte waits for the one before, ~0.8 GB/s on one core and far slower
//! on one GPU invocation. The weight hash is therefore FNV-1a *of chunk hashes*: the words are
//! cut into chunks of [`HASH_CHUNK_WORDS`] (the last may be short), each chunk hashed on its own
//! (in parallel, on any number of threads or invocations), then FNV-1a over the chunk hashes'
//! little-endian bytes, in chunk order.

/// FNV-1a 32's offset basis and prime.
pub const OFFSET_BASIS: u32 = 0x811c_9dc5;
pub const PRIME: u32 = 0x0100_0193;

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

/// FNV-1a 64's offset basis.
pub const OFFSET_BASIS_64: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a over `bytes`, 64-bit (checkpoint checksums).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_continue(OFFSET_BASIS_64, bytes)
}

/// Continues a 64-bit FNV-1a hash over more bytes (a hash fed in pieces, no copy of them).
pub fn fnv1a64_continue(mut hash: u64, bytes: &[u8]) -> u64 {
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

/// Words per chunk of [`chunked_words`] (16 KiB).
pub const HASH_CHUNK_WORDS: usize = 4096;

/// The chunked hash of `words`: FNV-1a over the little-endian bytes of each chunk's
/// [`fnv1a32_u32`], in order (see the module docs). No words: FNV-1a of nothing.
pub fn chunked_words(words: &[u32]) -> u32 {
    chunked(words, 1, fnv1a32_u32)
}

/// [`chunked_words`] with the chunks hashed on up to `threads` threads (same bits).
pub fn chunked_words_threaded(words: &[u32], threads: usize) -> u32 {
    chunked(words, threads, fnv1a32_u32)
}

/// [`chunked_words`] of the bits of `values`, on up to `threads` threads (no copy of them).
pub fn chunked_f32(values: &[f32], threads: usize) -> u32 {
    chunked(values, threads, fnv1a32_f32)
}

/// The chunk hashes of `items` by `hash` (split over up to `threads` threads), then FNV-1a
/// over them in order.
fn chunked<T: Sync>(items: &[T], threads: usize, hash: fn(&[T]) -> u32) -> u32 {
    let chunks = items.len().div_ceil(HASH_CHUNK_WORDS);
    let mut hashes = vec![0u32; chunks];
    let per = chunks.div_ceil(threads.clamp(1, chunks.max(1))).max(1);
    let hash_part = |out: &mut [u32], part: &[T]| {
        for (h, chunk) in out.iter_mut().zip(part.chunks(HASH_CHUNK_WORDS)) {
            *h = hash(chunk);
        }
    };
    if per >= chunks {
        hash_part(&mut hashes, items);
    } else {
        std::thread::scope(|scope| {
            for (out, part) in hashes.chunks_mut(per).zip(items.chunks(per * HASH_CHUNK_WORDS)) {
                scope.spawn(move || hash_part(out, part));
            }
        });
    }
    fnv1a32_u32(&hashes)
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
        assert_eq!(fnv1a64_continue(fnv1a64(b"foo"), b"bar"), 0x8594_4171_f739_67e8, "fed in pieces");
    }

    /// The chunked hash by its definition, on lengths around the chunk size, on any threads.
    #[test]
    fn chunked_hash_is_fnv_of_the_chunk_hashes_on_any_threads() {
        let words: Vec<u32> = (0..3 * HASH_CHUNK_WORDS as u32 + 5).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        for len in [0, 1, HASH_CHUNK_WORDS - 1, HASH_CHUNK_WORDS, HASH_CHUNK_WORDS + 1, words.len()] {
            let w = &words[..len];
            let mut chunk_bytes = Vec::new();
            for chunk in w.chunks(HASH_CHUNK_WORDS) {
                let bytes: Vec<u8> = chunk.iter().flat_map(|x| x.to_le_bytes()).collect();
                chunk_bytes.extend_from_slice(&fnv1a32(&bytes).to_le_bytes());
            }
            let expected = fnv1a32(&chunk_bytes);
            assert_eq!(chunked_words(w), expected, "{len} words");
            for threads in [1, 2, 3, 16] {
                assert_eq!(chunked_words_threaded(w, threads), expected, "{len} words, {threads} threads");
            }
        }
        let floats = [1.5f32, -0.0, f32::MIN_POSITIVE];
        assert_eq!(chunked_f32(&floats, 2), chunked_words(&floats.map(f32::to_bits)));
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
