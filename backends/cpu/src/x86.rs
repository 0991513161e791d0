//! The x86-64 micro-kernels: `MR` rows × a 32-column panel of `C` over the whole of `k`.
//!
//! Packed B, shared by every kernel, per 32-column panel and per quad of `k` positions
//! (`kq`): `[kq][32 cols][4]` signed bytes (128 bytes), plus per block and column the scale
//! `2^eb` (f32) and the offset `128 · Σ b` over the block (i32, used by the VNNI kernels).
//!
//! Packed A, per 4-row panel and `kq`: for [`tile_avx2`] `[4 rows][|a|, a]` byte quads; for
//! the VNNI kernels `[4 rows]` quads of `a + 128` bytes.
//!
//! - [`tile_avx2`] (AVX2): `vpsignb` moves A's signs onto B, `vpmaddubsw` multiplies `|a|` by
//!   `sign(b, a)` and adds adjacent pairs into i16 — exact, since quants lie in `[-127, 127]`
//!   so a pair sum is at most `2 · 127² = 32258` — and `vpmaddwd` by ones widens to i32.
//! - [`tile_avx_vnni`] (AVX-VNNI, 256-bit) and [`tile_avx512_vnni`] (AVX-512 VNNI):
//!   `vpdpbusd` adds four `(a + 128) · b` products per lane straight into i32 with no
//!   narrowing step, and the block's `128 · Σ b` is subtracted afterwards. A block's raw sum is
//!   at most `32 · 255 · 127` in magnitude: exact.
//!
//! With [`Out::Raw`] a kernel stops at the exact i32 block sums and the caller finishes with
//! the reference epilogue (tiles whose exponents leave the FMA-safe range). Otherwise each
//! block's exact i32 sum becomes a term `cvt(acc) · (2^ea · 2^eb)` added to the running
//! sum with one FMA. The caller guarantees every `ea + eb` of the tile lies in `[-126, 108]`:
//! then the term is an exact normal f32, so the FMA rounds exactly once, as `sum + term` does
//! in the reference, and no partial sum can be subnormal (all are multiples of 2^-126).

use std::arch::x86_64::*;

use lockstep_luts::units::BLOCK;

/// Rows of a tile (and of a packed A panel).
pub const MR: usize = 4;
/// Columns of a packed B panel; the 256-bit kernels do it in two halves.
pub const PANEL: usize = 32;
/// `k` quads per block.
pub const QUADS: usize = BLOCK / 4;
/// Bytes of packed B per `kq`.
pub const B_BYTES_PER_QUAD: usize = PANEL * 4;
/// Packed A words per `kq`, sign-trick layout.
pub const SIGN_A_WORDS_PER_QUAD: usize = MR * 2;
/// Packed A words per `kq`, offset layout.
pub const OFFSET_A_WORDS_PER_QUAD: usize = MR;

/// Where a tile's results go.
pub enum Out<'a> {
    /// The finished sums through the FMA epilogue (`MR × PANEL`, row-major). Only for tiles
    /// whose scale exponents keep every term an exact normal f32.
    Sums(&'a mut [f32; MR * PANEL]),
    /// The exact i32 block sums, `[block][MR][PANEL]`, for the caller's exact epilogue.
    Raw(&'a mut [i32]),
}

/// One packed B panel.
#[derive(Clone, Copy)]
pub struct PanelB<'a> {
    pub bytes: &'a [i8],
    pub scales: &'a [f32],
    pub offsets: &'a [i32],
}

fn check_lengths(
    blocks: usize,
    a_words: &[u32],
    words_per_quad: usize,
    a_scales: &[f32],
    b: PanelB<'_>,
    out: &Out<'_>,
) {
    if let Out::Raw(raw) = out {
        assert!(raw.len() >= blocks * MR * PANEL, "raw output too short");
    }
    assert!(a_words.len() >= blocks * QUADS * words_per_quad, "packed A too short");
    assert!(a_scales.len() >= blocks * MR, "A scales too short");
    assert!(b.bytes.len() >= blocks * QUADS * B_BYTES_PER_QUAD, "packed B too short");
    assert!(b.scales.len() >= blocks * PANEL && b.offsets.len() >= blocks * PANEL, "B scales too short");
}

/// The two 256-bit kernels, one body: an `MR × 16` tile at columns `16·half ..` of the panel
/// (`out` is `MR × PANEL` row-major and only the half's columns are written). They differ only
/// in how a quad of products reaches the i32 sums (`$accumulate`, on `$acc`, the row's two
/// accumulators, from A's quad words `$a` of row `$r` and B's two vectors `$b0`, `$b1`) and in
/// whether the block's `128 · Σ b` offsets come off afterwards (`$offset`).
macro_rules! tile_256 {
    (
        $(#[$doc:meta])*
        $name:ident, $features:literal, words per quad $words:expr, offsets $offset:expr,
        |$acc:ident, $a:ident, $r:ident, $b0:ident, $b1:ident| $accumulate:block
    ) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub unsafe fn $name(
            blocks: usize,
            a_words: &[u32],
            a_scales: &[f32],
            b: PanelB<'_>,
            half: usize,
            mut out: Out<'_>,
        ) {
            check_lengths(blocks, a_words, $words, a_scales, b, &out);
            assert!(half < 2);
            let a_ptr = a_words.as_ptr().cast::<i32>();
            let b_ptr = b.bytes[half * 64..].as_ptr();
            let col0 = half * 16;
            // SAFETY: offsets are inside the checked lengths; loads are unaligned.
            unsafe {
                let mut sums = [_mm256_setzero_ps(); 2 * MR];
                for block in 0..blocks {
                    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
                    for quad in 0..QUADS {
                        let kq = block * QUADS + quad;
                        let $b0 = _mm256_loadu_si256(b_ptr.add(kq * B_BYTES_PER_QUAD).cast());
                        let $b1 = _mm256_loadu_si256(b_ptr.add(kq * B_BYTES_PER_QUAD + 32).cast());
                        let $a = a_ptr.add(kq * $words);
                        for ($r, $acc) in acc.iter_mut().enumerate() {
                            $accumulate
                        }
                    }
                    if $offset {
                        let off0 = _mm256_loadu_si256(b.offsets.as_ptr().add(block * PANEL + col0).cast());
                        let off1 = _mm256_loadu_si256(b.offsets.as_ptr().add(block * PANEL + col0 + 8).cast());
                        for row in acc.iter_mut() {
                            *row = [_mm256_sub_epi32(row[0], off0), _mm256_sub_epi32(row[1], off1)];
                        }
                    }
                    if let Out::Raw(raw) = &mut out {
                        for (r, row) in acc.iter().enumerate() {
                            let at = raw.as_mut_ptr().add((block * MR + r) * PANEL + col0);
                            _mm256_storeu_si256(at.cast(), row[0]);
                            _mm256_storeu_si256(at.add(8).cast(), row[1]);
                        }
                        continue;
                    }
                    let sb0 = _mm256_loadu_ps(b.scales.as_ptr().add(block * PANEL + col0));
                    let sb1 = _mm256_loadu_ps(b.scales.as_ptr().add(block * PANEL + col0 + 8));
                    for (r, row) in acc.iter().enumerate() {
                        let sa = _mm256_set1_ps(*a_scales.as_ptr().add(block * MR + r));
                        let (s0, s1) = (_mm256_mul_ps(sa, sb0), _mm256_mul_ps(sa, sb1));
                        sums[2 * r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(row[0]), s0, sums[2 * r]);
                        sums[2 * r + 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(row[1]), s1, sums[2 * r + 1]);
                    }
                }
                if let Out::Sums(out) = out {
                    for r in 0..MR {
                        _mm256_storeu_ps(out.as_mut_ptr().add(r * PANEL + col0), sums[2 * r]);
                        _mm256_storeu_ps(out.as_mut_ptr().add(r * PANEL + col0 + 8), sums[2 * r + 1]);
                    }
                }
            }
        }
    };
}

tile_256! {
    /// The sign trick (module docs): `vpsignb`, `vpmaddubsw`, `vpmaddwd` by ones.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA. Lengths are checked.
    tile_avx2, "avx2,fma", words per quad SIGN_A_WORDS_PER_QUAD, offsets false,
    |acc, a_quad, r, b0, b1| {
        let ones = _mm256_set1_epi16(1);
        let magnitude = _mm256_set1_epi32(*a_quad.add(2 * r));
        let signs = _mm256_set1_epi32(*a_quad.add(2 * r + 1));
        let p0 = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(b0, signs));
        let p1 = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(b1, signs));
        acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(p0, ones));
        acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(p1, ones));
    }
}

tile_256! {
    /// AVX-VNNI and the offset layout of A: `vpdpbusd`, then the offsets off.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and AVX-VNNI. Lengths are checked.
    tile_avx_vnni, "avx2,fma,avxvnni", words per quad OFFSET_A_WORDS_PER_QUAD, offsets true,
    |acc, a_quad, r, b0, b1| {
        let shifted = _mm256_set1_epi32(*a_quad.add(r));
        acc[0] = _mm256_dpbusd_avx_epi32(acc[0], shifted, b0);
        acc[1] = _mm256_dpbusd_avx_epi32(acc[1], shifted, b1);
    }
}

/// The whole `MR × PANEL` tile with AVX-512 VNNI and the offset layout of A.
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VNNI, and FMA. Lengths are checked.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
pub unsafe fn tile_avx512_vnni(blocks: usize, a_words: &[u32], a_scales: &[f32], b: PanelB<'_>, mut out: Out<'_>) {
    check_lengths(blocks, a_words, OFFSET_A_WORDS_PER_QUAD, a_scales, b, &out);
    let a_ptr = a_words.as_ptr().cast::<i32>();
    let b_ptr = b.bytes.as_ptr();
    // SAFETY: offsets are inside the checked lengths; loads are unaligned.
    unsafe {
        let mut sums = [_mm512_setzero_ps(); 2 * MR];
        for block in 0..blocks {
            let mut acc = [_mm512_setzero_si512(); 2 * MR];
            for quad in 0..QUADS {
                let kq = block * QUADS + quad;
                let b0 = _mm512_loadu_si512(b_ptr.add(kq * B_BYTES_PER_QUAD).cast());
                let b1 = _mm512_loadu_si512(b_ptr.add(kq * B_BYTES_PER_QUAD + 64).cast());
                let a_quad = a_ptr.add(kq * OFFSET_A_WORDS_PER_QUAD);
                for r in 0..MR {
                    let shifted = _mm512_set1_epi32(*a_quad.add(r));
                    acc[2 * r] = _mm512_dpbusd_epi32(acc[2 * r], shifted, b0);
                    acc[2 * r + 1] = _mm512_dpbusd_epi32(acc[2 * r + 1], shifted, b1);
                }
            }
            let off0 = _mm512_loadu_si512(b.offsets.as_ptr().add(block * PANEL).cast());
            let off1 = _mm512_loadu_si512(b.offsets.as_ptr().add(block * PANEL + 16).cast());
            if let Out::Raw(raw) = &mut out {
                for r in 0..MR {
                    let at = raw.as_mut_ptr().add((block * MR + r) * PANEL);
                    _mm512_storeu_si512(at.cast(), _mm512_sub_epi32(acc[2 * r], off0));
                    _mm512_storeu_si512(at.add(16).cast(), _mm512_sub_epi32(acc[2 * r + 1], off1));
                }
                continue;
            }
            let sb0 = _mm512_loadu_ps(b.scales.as_ptr().add(block * PANEL));
            let sb1 = _mm512_loadu_ps(b.scales.as_ptr().add(block * PANEL + 16));
            for r in 0..MR {
                let sa = _mm512_set1_ps(*a_scales.as_ptr().add(block * MR + r));
                let acc0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[2 * r], off0));
                let acc1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[2 * r + 1], off1));
                sums[2 * r] = _mm512_fmadd_ps(acc0, _mm512_mul_ps(sa, sb0), sums[2 * r]);
                sums[2 * r + 1] = _mm512_fmadd_ps(acc1, _mm512_mul_ps(sa, sb1), sums[2 * r + 1]);
            }
        }
        if let Out::Sums(out) = out {
            for r in 0..MR {
                _mm512_storeu_ps(out.as_mut_ptr().add(r * PANEL), sums[2 * r]);
                _mm512_storeu_ps(out.as_mut_ptr().add(r * PANEL + 16), sums[2 * r + 1]);
            }
        }
    }
}

/// Packs one full A panel's quants — `rows[lane]` the lane's row, `quads` × 4 bytes — in the
/// layout of `sign` (the AVX2 kernel's `[4 rows][|a|, a]` words per `kq`) or else the VNNI
/// kernels' (`[4 rows]` words of `a + 128` bytes per `kq`). Sixteen bytes of each row at a time,
/// four rows transposed as 4 × 4 words in registers, so every store is contiguous; the words are
/// those the scalar packer writes (`gemm.rs`, which keeps it for partial panels and tests this
/// against it).
///
/// # Safety
/// The CPU has AVX2; `rows[_].len() >= quads * 4` and `quads` is a multiple of 4; `words` has
/// `quads * MR` words (offset layout) or `quads * 2 * MR` (sign layout).
#[target_feature(enable = "avx2")]
pub unsafe fn pack_a_panel(rows: [&[i8]; MR], quads: usize, sign: bool, words: &mut [u32]) {
    let per_quad = if sign { SIGN_A_WORDS_PER_QUAD } else { OFFSET_A_WORDS_PER_QUAD };
    debug_assert!(quads.is_multiple_of(4) && rows.iter().all(|r| r.len() >= quads * 4));
    assert!(
        words.len() >= quads * per_quad,
        "packed A is {} words, {quads} quads need {}",
        words.len(),
        quads * per_quad
    );
    let flip = _mm_set1_epi8(-128);
    let out = words.as_mut_ptr() as *mut __m128i;
    for group in 0..quads / 4 {
        let load = |lane: usize| {
            // SAFETY: each row holds quads · 4 bytes (the caller's promise) and group < quads / 4.
            unsafe { _mm_loadu_si128(rows[lane].as_ptr().add(group * 16) as *const __m128i) }
        };
        let (r0, r1, r2, r3) = (load(0), load(1), load(2), load(3));
        let (t0, t1) = (_mm_unpacklo_epi32(r0, r1), _mm_unpacklo_epi32(r2, r3));
        let (t2, t3) = (_mm_unpackhi_epi32(r0, r1), _mm_unpackhi_epi32(r2, r3));
        // quad q of the group: the four rows' words of k quad 4·group + q.
        let quad = [
            _mm_unpacklo_epi64(t0, t1),
            _mm_unpackhi_epi64(t0, t1),
            _mm_unpacklo_epi64(t2, t3),
            _mm_unpackhi_epi64(t2, t3),
        ];
        for (q, &raw) in quad.iter().enumerate() {
            let kq = group * 4 + q;
            // SAFETY: `words` holds quads · per_quad words (asserted above) and kq < quads.
            unsafe {
                if sign {
                    // [|a|, a] per row: two words a row, rows in order.
                    let abs = _mm_abs_epi8(raw);
                    _mm_storeu_si128(out.add(kq * 2), _mm_unpacklo_epi32(abs, raw));
                    _mm_storeu_si128(out.add(kq * 2 + 1), _mm_unpackhi_epi32(abs, raw));
                } else {
                    _mm_storeu_si128(out.add(kq), _mm_xor_si128(raw, flip));
                }
            }
        }
    }
}
