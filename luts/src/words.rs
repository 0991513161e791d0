//! Buffers hold 32-bit words; the ops read most of them as f32. These views reinterpret one as
//! the other without a copy (every bit pattern is valid for both types, and they share size and
//! alignment), so the reference, the CPU mirror and the host device need no copies and no
//! unsafe code of their own for it.

/// Words as f32.
pub fn f32s(words: &[u32]) -> &[f32] {
    // SAFETY: u32 and f32 have the same size and alignment and every bit pattern is valid for
    // both; the result borrows `words` for its lifetime.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<f32>(), words.len()) }
}

/// Words as f32 to write.
pub fn f32s_mut(words: &mut [u32]) -> &mut [f32] {
    // SAFETY: as in `f32s`; the result borrows `words` exclusively.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<f32>(), words.len()) }
}

/// f32 values as words.
pub fn of_f32s(values: &[f32]) -> &[u32] {
    // SAFETY: as in `f32s`.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u32>(), values.len()) }
}

/// f32 values as words to write.
pub fn of_f32s_mut(values: &mut [f32]) -> &mut [u32] {
    // SAFETY: as in `f32s`; the result borrows `values` exclusively.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u32>(), values.len()) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn views_keep_every_bit() {
        let mut words = vec![0x7fc0_0001u32, 0x8000_0000, 1, 0x3f80_0000];
        assert_eq!(super::f32s(&words)[3], 1.0);
        super::f32s_mut(&mut words)[2] = -2.0;
        assert_eq!(words[2], (-2.0f32).to_bits());
        assert_eq!(super::of_f32s(super::f32s(&words)), &words[..]);
        super::of_f32s_mut(&mut [0.5f32])[0] = 7;
    }
}
