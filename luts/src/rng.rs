//! SplitMix64: the one seeded generator of batteries, probes and initialisation.
//!
//! It is integer-only, so every platform draws the same stream from the same seed.

/// A SplitMix64 stream (Steele, Lea and Flood, 2014).
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The current state: `SplitMix64::new(rng.state())` continues the same stream.
    pub fn state(&self) -> u64 {
        self.state
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A uniform integer in `0..bound` (`bound > 0`), by multiply-shift.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "below(0) has no values");
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A uniform f32 in `[-1, 1)` with 24 random bits: `(i - 2^23) / 2^23`, exact in f32.
    pub fn next_signed_unit(&mut self) -> f32 {
        let i = (self.next_u64() >> 40) as i32; // 24 bits
        (i - (1 << 23)) as f32 / (1 << 23) as f32
    }

    /// A uniform i8 over all 256 values.
    pub fn next_i8(&mut self) -> i8 {
        (self.next_u64() >> 56) as u8 as i8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_stream() {
        // First outputs for seed 1234567 of the reference C implementation
        // (http://xoshiro.di.unimi.it/splitmix64.c), as published in its test vectors.
        let mut rng = SplitMix64::new(1_234_567);
        let expected = [
            6_457_827_717_110_365_317u64,
            3_203_168_211_198_807_973,
            9_817_491_932_198_370_423,
            4_593_380_528_125_082_431,
            16_408_922_859_458_223_821,
        ];
        for value in expected {
            assert_eq!(rng.next_u64(), value);
        }
    }

    #[test]
    fn unit_floats_stay_in_range() {
        let mut rng = SplitMix64::new(7);
        for _ in 0..10_000 {
            let x = rng.next_signed_unit();
            assert!((-1.0..1.0).contains(&x), "{x}");
        }
        assert!(rng.below(3) < 3);
    }
}
