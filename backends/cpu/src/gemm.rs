//! The unit call: checks, quantization, packing, threads and tiles.

use lockstep_luts::units::{Operand, UnitError, BLOCK};

use crate::portable;
use crate::quantize::{first_non_finite_error, quantize_rows};

/// The environment variable that picks a [`Path`] instead of the fastest ([`Path::chosen`]);
/// it also caps the element-wise ops' vector width (`avx512-vnni` their AVX-512 tier, `avx-vnni`
/// and `avx2` their AVX2 tier, `portable` scalar).
pub const PATH_ENV: &str = lockstep_worker_api::CPU_PATH_ENV;

/// Which kernel computes the tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// `vpdpbusd` on 512-bit vectors (AVX-512 F, BW, VNNI).
    Avx512Vnni,
    /// `vpdpbusd` on 256-bit vectors (AVX-VNNI).
    AvxVnni,
    /// `vpsignb` + `vpmaddubsw` + `vpmaddwd` (AVX2 and FMA).
    Avx2,
    /// Scalar integer products, any CPU.
    Portable,
}

impl Path {
    /// Every path this CPU can run, fastest first.
    pub fn available() -> Vec<Path> {
        let mut paths = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma");
            if avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
                paths.push(Path::Avx512Vnni);
            }
            if avx2 && has!("avxvnni") {
                paths.push(Path::AvxVnni);
            }
            if avx2 {
                paths.push(Path::Avx2);
            }
        }
        paths.push(Path::Portable);
        paths
    }

    /// The fastest path this CPU supports.
    pub fn detect() -> Self {
        Path::available()[0]
    }

    /// The path named by [`PATH_ENV`] (`avx512-vnni`, `avx-vnni`, `avx2`, `portable`), or the
    /// fastest when it is unset: one machine runs members of two CPU kinds (every path gives the
    /// same bits; a mixed group checks it). A name this CPU cannot run, or no path's, is refused.
    pub fn chosen() -> Result<Self, String> {
        Path::named(std::env::var(PATH_ENV).ok().as_deref())
    }

    /// The path called `name` if this CPU runs it (`None`: the fastest).
    pub fn named(name: Option<&str>) -> Result<Self, String> {
        let Some(name) = name else { return Ok(Path::detect()) };
        let available = Path::available();
        let names: Vec<&str> = available.iter().map(|p| p.name()).collect();
        match available.iter().find(|p| p.name() == name) {
            Some(&path) => Ok(path),
            None => Err(format!("{PATH_ENV}={name}: this CPU runs {}", names.join(", "))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Path::Avx512Vnni => "avx512-vnni",
            Path::AvxVnni => "avx-vnni",
            Path::Avx2 => "avx2",
            Path::Portable => "portable",
        }
    }
}

/// Runs `f` on every item, on `pool`'s threads when there is one (else on this thread), and
/// tells whether every call returned true. Each item writes its own disjoint outputs, so
/// which thread runs it never matters.
fn for_all<I: Send>(
    pool: Option<&rayon::ThreadPool>,
    items: impl Iterator<Item = I>,
    f: impl Fn(I) -> bool + Sync,
) -> bool {
    match pool {
        None => items.map(&f).fold(true, |ok, item| ok & item),
        Some(pool) => {
            let ok = std::sync::atomic::AtomicBool::new(true);
            let items: Vec<I> = items.collect();
            pool.scope(|scope| {
                for item in items {
                    let (f, ok) = (&f, &ok);
                    scope.spawn(move |_| {
                        if !f(item) {
                            ok.store(false, std::sync::atomic::Ordering::Relaxed);
                        }
                    });
                }
            });
            ok.into_inner()
        }
    }
}

/// Below this many multiply-adds a call runs on one thread: spawning costs more than it saves.
const PARALLEL_MIN_MACS: usize = 1 << 20;
/// Rows per packed A panel and columns per packed B panel.
const MR: usize = 4;
const PANEL: usize = 32;
/// Bytes of packed A kept in L2 while B panels stream past it from L1 (measured on a 2 MiB L2:
/// larger chunks mean fewer passes over packed B).
const A_CHUNK_BYTES: usize = 512 * 1024;

/// Quantized rows: `blocks × BLOCK` quants and `blocks` exponents per row.
#[derive(Default)]
struct Quantized {
    q: Vec<i8>,
    exp: Vec<i32>,
}

impl Quantized {
    /// Sizes the buffers for `rows` rows without clearing them: the quantizer writes every
    /// element it is asked for.
    fn prepare(&mut self, rows: usize, blocks: usize) {
        grow(&mut self.q, rows * blocks * BLOCK, 0);
        grow(&mut self.exp, rows * blocks, 0);
    }
}

/// Makes `v` at least `len` long, keeping whatever it held: callers work on `v[..len]` and
/// overwrite what they read. Never shrinking means shapes that alternate (as a training step's
/// do) do not pay for refilling the buffer on every call.
fn grow<T: Copy>(v: &mut Vec<T>, len: usize, fill: T) {
    if v.len() < len {
        v.resize(len, fill);
    }
}

/// Buffers reused from call to call, so a call allocates (and clears) nothing once warm.
#[derive(Default)]
pub struct Scratch {
    b_quant: Quantized,
    b_packed: PackedB,
    per_thread: Vec<ThreadScratch>,
}

#[derive(Default)]
struct ThreadScratch {
    a_quant: Quantized,
    a_words: Vec<u32>,
    a_scales: Vec<f32>,
    a_ranges: Vec<ExpRange>,
    /// Exact block sums of a tile that needs the reference epilogue.
    raw: Vec<i32>,
}

/// `c = a · bᵀ` (A `m × k`, B `n × k`, C `m × n`), bit-identical to `lockstep_luts::gemm_nt`,
/// on `pool`'s threads (or this one).
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32(
    path: Path,
    pool: Option<&rayon::ThreadPool>,
    scratch: &mut Scratch,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
) -> Result<(), UnitError> {
    check_shape(a, m * k, Operand::A)?;
    check_shape(b, n * k, Operand::B)?;
    if c.len() != m * n {
        return Err(UnitError::Shape { operand: Operand::A, expected: m * n, actual: c.len() });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        c.fill(0.0); // a sum of no terms is +0
        return Ok(());
    }
    let blocks = k.div_ceil(BLOCK);
    let a_panels = m.div_ceil(MR);
    let threads = match pool {
        Some(pool) if m * n * k >= PARALLEL_MIN_MACS => pool.current_num_threads().clamp(1, a_panels),
        _ => 1,
    };
    let pool = pool.filter(|_| threads > 1);

    // Phase 1: quantize (and, for the SIMD paths, pack) all of B, split across threads. The
    // quantizer notices non-finite values; only then is the input scanned to name the first.
    let non_finite = || first_non_finite_error(a, b);
    let Scratch { b_quant, b_packed, per_thread } = scratch;
    if !quantize_parallel(b, n, k, blocks, threads, pool, b_quant) {
        return Err(non_finite());
    }
    let b_quant = &*b_quant;
    let b_packed = if path == Path::Portable {
        None
    } else {
        pack_b(b_quant, n, blocks, threads, pool, b_packed);
        Some(&*b_packed)
    };
    if per_thread.len() < threads {
        per_thread.resize_with(threads, ThreadScratch::default);
    }

    // Phase 2: each thread owns a contiguous range of A panels, hence of C rows.
    let panels_per_thread = a_panels.div_ceil(threads);
    let rows_per_thread = panels_per_thread * MR;
    let work = a.chunks(rows_per_thread * k).zip(c.chunks_mut(rows_per_thread * n)).zip(per_thread.iter_mut());
    let run = |((a_rows, c_rows), mine): ((&[f32], &mut [f32]), &mut ThreadScratch)| -> bool {
        let rows = a_rows.len() / k;
        mine.a_quant.prepare(rows, blocks);
        if quantize_rows(a_rows, k, &mut mine.a_quant.q, &mut mine.a_quant.exp).is_err() {
            return false;
        }
        match b_packed {
            Some(b_packed) => simd_rows(path, rows, b_quant, b_packed, n, blocks, c_rows, mine),
            None => portable_rows(&mine.a_quant, rows, b_quant, n, blocks, c_rows),
        }
        true
    };
    let all_finite = for_all(pool, work, run);
    if !all_finite {
        return Err(non_finite());
    }
    Ok(())
}

fn check_shape(values: &[f32], expected: usize, operand: Operand) -> Result<(), UnitError> {
    if values.len() != expected {
        return Err(UnitError::Shape { operand, expected, actual: values.len() });
    }
    Ok(())
}

/// Quantizes `rows × k` values across threads into `out`; false if any is non-finite.
fn quantize_parallel(
    values: &[f32],
    rows: usize,
    k: usize,
    blocks: usize,
    threads: usize,
    pool: Option<&rayon::ThreadPool>,
    out: &mut Quantized,
) -> bool {
    out.prepare(rows, blocks);
    let rows_per_thread = rows.div_ceil(threads);
    let work = values
        .chunks(rows_per_thread * k)
        .zip(out.q[..rows * blocks * BLOCK].chunks_mut(rows_per_thread * blocks * BLOCK))
        .zip(out.exp[..rows * blocks].chunks_mut(rows_per_thread * blocks));
    for_all(pool, work, |((v, q), e)| quantize_rows(v, k, q, e).is_ok())
}

fn portable_rows(a: &Quantized, rows: usize, b: &Quantized, n: usize, blocks: usize, c: &mut [f32]) {
    for row in 0..rows {
        for col in 0..n {
            c[row * n + col] = portable_element(a, row, b, col, blocks);
        }
    }
}

fn portable_element(a: &Quantized, row: usize, b: &Quantized, col: usize, blocks: usize) -> f32 {
    let stride = blocks * BLOCK;
    portable::element(
        &a.q[row * stride..(row + 1) * stride],
        &a.exp[row * blocks..(row + 1) * blocks],
        &b.q[col * stride..(col + 1) * stride],
        &b.exp[col * blocks..(col + 1) * blocks],
    )
}

/// `2^e` as an f32 when it is normal, else 0 (such tiles never take the fast path).
fn pow2_or_zero(e: i32) -> f32 {
    if (-126..=127).contains(&e) {
        f32::from_bits(((127 + e) as u32) << 23)
    } else {
        0.0
    }
}

/// One packed panel's exponent range.
#[derive(Clone, Copy)]
struct ExpRange {
    min: i32,
    max: i32,
}

impl ExpRange {
    const EMPTY: ExpRange = ExpRange { min: i32::MAX, max: i32::MIN };

    fn include(&mut self, e: i32) {
        self.min = self.min.min(e);
        self.max = self.max.max(e);
    }
}

/// Whether a tile may take the FMA fast path: both scales are normal f32 and every term
/// `acc · 2^(ea+eb)` is an exact normal f32.
fn fast_tile(a: ExpRange, b: ExpRange) -> bool {
    a.min >= -126 && a.max <= 127 && b.min >= -126 && b.max <= 127 && a.min + b.min >= -126 && a.max + b.max <= 108
}

/// All of B in `[panel][kq][PANEL][4]` bytes plus `[panel][block][PANEL]` scales and offsets.
#[derive(Default)]
struct PackedB {
    bytes: Vec<i8>,
    scales: Vec<f32>,
    offsets: Vec<i32>,
    ranges: Vec<ExpRange>,
    /// Panels of the current call (the buffers may be longer).
    panels: usize,
}

fn pack_b(
    b: &Quantized,
    n: usize,
    blocks: usize,
    threads: usize,
    pool: Option<&rayon::ThreadPool>,
    packed: &mut PackedB,
) {
    let panels = n.div_ceil(PANEL);
    let bytes_len = blocks * BLOCK * PANEL;
    let per_block_len = blocks * PANEL;
    grow(&mut packed.bytes, panels * bytes_len, 0);
    grow(&mut packed.scales, panels * per_block_len, 0.0);
    grow(&mut packed.offsets, panels * per_block_len, 0);
    grow(&mut packed.ranges, panels, ExpRange::EMPTY);
    let per_thread = panels.div_ceil(threads);
    let pack_range =
        |first_panel: usize, bytes: &mut [i8], scales: &mut [f32], offsets: &mut [i32], ranges: &mut [ExpRange]| {
            for (offset, range) in ranges.iter_mut().enumerate() {
                let panel = first_panel + offset;
                let bytes = &mut bytes[offset * bytes_len..(offset + 1) * bytes_len];
                let scales = &mut scales[offset * per_block_len..(offset + 1) * per_block_len];
                let offsets = &mut offsets[offset * per_block_len..(offset + 1) * per_block_len];
                // The buffers are reused from earlier calls: write every lane, padding included.
                *range = ExpRange::EMPTY;
                for lane in 0..PANEL {
                    let col = panel * PANEL + lane;
                    if col >= n {
                        // Padding: zero quants, exponent 0 (scale 1), no offset.
                        for kq in 0..blocks * BLOCK / 4 {
                            bytes[(kq * PANEL + lane) * 4..][..4].fill(0);
                        }
                        for block in 0..blocks {
                            scales[block * PANEL + lane] = 1.0;
                            offsets[block * PANEL + lane] = 0;
                        }
                        range.include(0);
                        continue;
                    }
                    let q = &b.q[col * blocks * BLOCK..(col + 1) * blocks * BLOCK];
                    for (kq, quad) in q.chunks_exact(4).enumerate() {
                        let start = (kq * PANEL + lane) * 4;
                        bytes[start..start + 4].copy_from_slice(quad);
                    }
                    for (block, values) in q.chunks_exact(BLOCK).enumerate() {
                        let e = b.exp[col * blocks + block];
                        scales[block * PANEL + lane] = pow2_or_zero(e);
                        offsets[block * PANEL + lane] = 128 * values.iter().map(|&v| i32::from(v)).sum::<i32>();
                        range.include(e);
                    }
                }
            }
        };
    packed.panels = panels;
    let work = packed.bytes[..panels * bytes_len]
        .chunks_mut(per_thread * bytes_len)
        .zip(packed.scales[..panels * per_block_len].chunks_mut(per_thread * per_block_len))
        .zip(packed.offsets[..panels * per_block_len].chunks_mut(per_thread * per_block_len))
        .zip(packed.ranges[..panels].chunks_mut(per_thread))
        .enumerate();
    for_all(pool, work, |(i, (((p, s), o), r))| {
        pack_range(i * per_thread, p, s, o, r);
        true
    });
}

/// Packed A words per `kq` for `path`.
fn a_words_per_quad(path: Path) -> usize {
    match path {
        Path::Avx2 => MR * 2,
        _ => MR,
    }
}

/// Packs A panel `panel` (rows `panel·MR ..`) in `path`'s layout (see `x86.rs`) plus
/// `[block][MR]` scales. Rows past the end are zero quants with scale 1.
fn pack_a_panel(
    path: Path,
    a: &Quantized,
    rows: usize,
    blocks: usize,
    panel: usize,
    words: &mut [u32],
    scales: &mut [f32],
) -> ExpRange {
    #[cfg(target_arch = "x86_64")]
    if (panel + 1) * MR <= rows && path != Path::Portable {
        // A full panel: the quants transposed in registers (every SIMD path has AVX2).
        let row = |lane: usize| &a.q[(panel * MR + lane) * blocks * BLOCK..(panel * MR + lane + 1) * blocks * BLOCK];
        let quads = blocks * BLOCK / 4;
        // SAFETY: `path` is a SIMD path, which `Path::available` offers only with AVX2; each
        // row is `quads · 4` bytes, `quads` is a multiple of 8 (blocks of 32), and `words` is
        // the panel's `quads · per_quad` words.
        unsafe { crate::x86::pack_a_panel([row(0), row(1), row(2), row(3)], quads, path == Path::Avx2, words) };
        let mut range = ExpRange::EMPTY;
        for lane in 0..MR {
            lane_scales(a, blocks, panel * MR + lane, lane, scales, &mut range);
        }
        return range;
    }
    pack_a_lanes(path, a, rows, blocks, panel, words, scales)
}

/// Lane `lane`'s `2^e` scales of A row `row`, `[block][MR]`, its exponents into `range`.
fn lane_scales(a: &Quantized, blocks: usize, row: usize, lane: usize, scales: &mut [f32], range: &mut ExpRange) {
    for block in 0..blocks {
        let e = a.exp[row * blocks + block];
        scales[block * MR + lane] = pow2_or_zero(e);
        range.include(e);
    }
}

/// [`pack_a_panel`] a row at a time, for partial panels and the portable path.
fn pack_a_lanes(
    path: Path,
    a: &Quantized,
    rows: usize,
    blocks: usize,
    panel: usize,
    words: &mut [u32],
    scales: &mut [f32],
) -> ExpRange {
    let mut range = ExpRange::EMPTY;
    let per_quad = a_words_per_quad(path);
    let quads = blocks * BLOCK / 4;
    for lane in 0..MR {
        let row = panel * MR + lane;
        if row >= rows {
            for kq in 0..quads {
                // Zero quants: |a| = 0 and a = 0 (sign trick), or 0 + 128 (offset layout).
                if path == Path::Avx2 {
                    words[kq * per_quad + 2 * lane] = 0;
                    words[kq * per_quad + 2 * lane + 1] = 0;
                } else {
                    words[kq * per_quad + lane] = 0x8080_8080;
                }
            }
            scales[lane..].iter_mut().step_by(MR).take(blocks).for_each(|s| *s = 1.0);
            range.include(0);
            continue;
        }
        let q = &a.q[row * blocks * BLOCK..(row + 1) * blocks * BLOCK];
        if path == Path::Avx2 {
            for (kq, quad) in q.chunks_exact(4).enumerate() {
                let quad = [quad[0], quad[1], quad[2], quad[3]];
                words[kq * per_quad + 2 * lane] = u32::from_le_bytes(quad.map(i8::unsigned_abs));
                words[kq * per_quad + 2 * lane + 1] = u32::from_le_bytes(quad.map(|v| v as u8));
            }
        } else {
            // a + 128 as an unsigned byte is the two's-complement byte with its top bit flipped.
            for (kq, quad) in q.chunks_exact(4).enumerate() {
                let bytes = [quad[0] as u8, quad[1] as u8, quad[2] as u8, quad[3] as u8];
                words[kq * per_quad + lane] = u32::from_le_bytes(bytes) ^ 0x8080_8080;
            }
        }
        lane_scales(a, blocks, row, lane, scales, &mut range);
    }
    range
}

#[allow(clippy::too_many_arguments)]
fn simd_rows(
    path: Path,
    rows: usize,
    b: &Quantized,
    packed_b: &PackedB,
    n: usize,
    blocks: usize,
    c: &mut [f32],
    scratch: &mut ThreadScratch,
) {
    let ThreadScratch { a_quant: a, a_words, a_scales, a_ranges, raw } = scratch;
    let a = &*a;
    let a_panels = rows.div_ceil(MR);
    let words_len = blocks * BLOCK / 4 * a_words_per_quad(path);
    let scales_len = blocks * MR;
    let chunk_panels = (A_CHUNK_BYTES / (words_len * 4)).max(1);
    let b_bytes_len = blocks * BLOCK * PANEL;
    let b_block_len = blocks * PANEL;

    grow(a_words, chunk_panels * words_len, 0);
    grow(a_scales, chunk_panels * scales_len, 0.0);
    grow(a_ranges, chunk_panels, ExpRange::EMPTY);
    let mut out = [0f32; MR * PANEL];
    for first in (0..a_panels).step_by(chunk_panels) {
        let count = chunk_panels.min(a_panels - first);
        for i in 0..count {
            a_ranges[i] = pack_a_panel(
                path,
                a,
                rows,
                blocks,
                first + i,
                &mut a_words[i * words_len..(i + 1) * words_len],
                &mut a_scales[i * scales_len..(i + 1) * scales_len],
            );
        }
        for (jb, b_range) in packed_b.ranges[..packed_b.panels].iter().enumerate() {
            let panel = PanelRef {
                bytes: &packed_b.bytes[jb * b_bytes_len..(jb + 1) * b_bytes_len],
                scales: &packed_b.scales[jb * b_block_len..(jb + 1) * b_block_len],
                offsets: &packed_b.offsets[jb * b_block_len..(jb + 1) * b_block_len],
            };
            let col0 = jb * PANEL;
            let cols = PANEL.min(n - col0);
            for i in 0..count {
                let row0 = (first + i) * MR;
                let tile_rows = MR.min(rows - row0);
                let words = &a_words[i * words_len..(i + 1) * words_len];
                let scales = &a_scales[i * scales_len..(i + 1) * scales_len];
                if fast_tile(a_ranges[i], *b_range) {
                    run_tile(path, blocks, words, scales, panel, cols, TileOut::Sums(&mut out));
                    for r in 0..tile_rows {
                        let dst = (row0 + r) * n + col0;
                        if cols == PANEL {
                            // A constant length lets the copy compile to a few vector moves
                            // instead of a call per row.
                            let row: &[f32; PANEL] = out[r * PANEL..(r + 1) * PANEL].try_into().expect("PANEL floats");
                            c[dst..dst + PANEL].copy_from_slice(row);
                        } else {
                            c[dst..dst + cols].copy_from_slice(&out[r * PANEL..r * PANEL + cols]);
                        }
                    }
                } else {
                    grow(raw, blocks * MR * PANEL, 0);
                    run_tile(path, blocks, words, scales, panel, cols, TileOut::Raw(raw));
                    exact_epilogue(raw, blocks, a, row0, tile_rows, b, col0, cols, n, c);
                }
            }
        }
    }
}

/// One packed B panel, as the kernels see it.
#[derive(Clone, Copy)]
struct PanelRef<'a> {
    bytes: &'a [i8],
    scales: &'a [f32],
    offsets: &'a [i32],
}

/// Where a tile's results go (mirrors `x86::Out` without naming the module off x86-64).
enum TileOut<'a> {
    Sums(&'a mut [f32; MR * PANEL]),
    Raw(&'a mut [i32]),
}

#[cfg(target_arch = "x86_64")]
fn run_tile(
    path: Path,
    blocks: usize,
    words: &[u32],
    scales: &[f32],
    panel: PanelRef<'_>,
    cols: usize,
    out: TileOut<'_>,
) {
    use crate::x86;
    const _: () = assert!(x86::MR == MR && x86::PANEL == PANEL);
    let b = x86::PanelB { bytes: panel.bytes, scales: panel.scales, offsets: panel.offsets };
    let halves = if cols > 16 { 2 } else { 1 };
    let mut out = out;
    fn target<'b>(out: &'b mut TileOut<'_>) -> x86::Out<'b> {
        match out {
            TileOut::Sums(sums) => x86::Out::Sums(sums),
            TileOut::Raw(raw) => x86::Out::Raw(raw),
        }
    }
    // SAFETY: a path is only ever chosen from `Path::available()`, which checked the CPU
    // features each kernel is compiled for; the kernels check slice lengths themselves.
    unsafe {
        match path {
            Path::Avx512Vnni => x86::tile_avx512_vnni(blocks, words, scales, b, target(&mut out)),
            Path::AvxVnni => {
                (0..halves).for_each(|half| x86::tile_avx_vnni(blocks, words, scales, b, half, target(&mut out)))
            }
            Path::Avx2 => (0..halves).for_each(|half| x86::tile_avx2(blocks, words, scales, b, half, target(&mut out))),
            Path::Portable => unreachable!("the portable path has no packed tiles"),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn run_tile(_: Path, _: usize, _: &[u32], _: &[f32], _: PanelRef<'_>, _: usize, _: TileOut<'_>) {
    unreachable!("only the portable path exists off x86-64")
}

/// The reference epilogue over a tile's exact block sums (`raw`, `[block][MR][PANEL]`): for
/// tiles whose scale exponents could make a term subnormal or infinite.
#[allow(clippy::too_many_arguments)]
fn exact_epilogue(
    raw: &[i32],
    blocks: usize,
    a: &Quantized,
    row0: usize,
    tile_rows: usize,
    b: &Quantized,
    col0: usize,
    cols: usize,
    n: usize,
    c: &mut [f32],
) {
    use lockstep_luts::units::{block_term, canonicalize, flush_partial};
    for r in 0..tile_rows {
        let a_exp = &a.exp[(row0 + r) * blocks..(row0 + r + 1) * blocks];
        for lane in 0..cols {
            let b_exp = &b.exp[(col0 + lane) * blocks..(col0 + lane + 1) * blocks];
            let mut sum = 0.0f32;
            for block in 0..blocks {
                let acc = raw[(block * MR + r) * PANEL + lane];
                sum = flush_partial(sum + block_term(acc, a_exp[block] + b_exp[block]));
            }
            c[(row0 + r) * n + col0 + lane] = canonicalize(sum);
        }
    }
}

#[cfg(test)]
mod tests {
    /// A path is chosen by its name where the CPU runs it; another name, or one this CPU
    /// cannot run, is refused with the paths it runs.
    #[test]
    fn a_path_is_chosen_by_name_and_an_unknown_or_missing_one_refused() {
        assert_eq!(super::Path::named(None), Ok(super::Path::detect()));
        for path in super::Path::available() {
            assert_eq!(super::Path::named(Some(path.name())), Ok(path));
        }
        let refused = super::Path::named(Some("sse9")).unwrap_err();
        assert!(refused.starts_with("LOCKSTEP_CPU_PATH=sse9: this CPU runs ") && refused.ends_with("portable"));
        let all = [super::Path::Avx512Vnni, super::Path::AvxVnni, super::Path::Avx2];
        for missing in all.into_iter().filter(|p| !super::Path::available().contains(p)) {
            assert!(super::Path::named(Some(missing.name())).is_err(), "{missing:?}");
        }
    }

    use super::*;
    use lockstep_luts::rng::SplitMix64;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn check(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) {
        let expected = lockstep_luts::gemm_nt(m, n, k, a, b).unwrap();
        let expected_bits: Vec<u32> = expected.iter().map(|v| v.to_bits()).collect();
        for path in Path::available() {
            for threads in [1, 2, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let pool = Some(&pool).filter(|_| threads > 1);
                let mut c = vec![f32::from_bits(0xdead_beef); m * n];
                gemm_f32(path, pool, &mut Scratch::default(), m, n, k, a, b, &mut c).unwrap();
                // A warm scratch (stale contents from another shape) gives the same bits.
                let mut warm = Scratch::default();
                let mut other = vec![0.0; 37 * 41];
                let junk: Vec<f32> = (0..41 * 100).map(|i| (i % 13) as f32 - 6.0).collect();
                gemm_f32(path, pool, &mut warm, 37, 41, 100, &junk[..37 * 100], &junk, &mut other).unwrap();
                let mut again = vec![0.0; m * n];
                gemm_f32(path, pool, &mut warm, m, n, k, a, b, &mut again).unwrap();
                assert_eq!(bits(&again), bits(&c), "{path:?} with a warm scratch");
                let actual_bits: Vec<u32> = c.iter().map(|v| v.to_bits()).collect();
                assert_eq!(actual_bits, expected_bits, "{path:?} threads={threads} shape {m}x{n}x{k}");
            }
        }
    }

    #[test]
    fn this_machine_runs_a_simd_path() {
        // CI and development machines are x86-64 with at least AVX2: the fast paths must be
        // exercised there, not silently skipped.
        #[cfg(target_arch = "x86_64")]
        assert!(Path::available().contains(&Path::Avx2), "no AVX2 on this CPU: {:?}", Path::available());
    }

    #[test]
    fn random_shapes_match_reference_bits() {
        let mut rng = SplitMix64::new(31);
        for _ in 0..40 {
            let m = 1 + rng.below(40) as usize;
            let n = 1 + rng.below(70) as usize;
            let k = 1 + rng.below(300) as usize;
            let scale_a = f32::from_bits(((127 + rng.below(40) as i32 - 20) as u32) << 23);
            let a: Vec<f32> = (0..m * k).map(|_| rng.next_signed_unit() * scale_a).collect();
            let b: Vec<f32> = (0..n * k).map(|_| rng.next_signed_unit()).collect();
            check(m, n, k, &a, &b);
        }
    }

    #[test]
    fn one_scratch_across_alternating_shapes() {
        // Buffers never shrink: a small call after a big one leaves stale data past its end,
        // and the next big call must not read any of it.
        let mut rng = SplitMix64::new(34);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for path in Path::available() {
            let mut scratch = Scratch::default();
            for (m, n, k) in [(70, 90, 260), (5, 33, 40), (130, 64, 128), (3, 1, 7), (70, 90, 260), (64, 200, 96)] {
                let a: Vec<f32> = (0..m * k).map(|_| rng.next_signed_unit()).collect();
                let b: Vec<f32> = (0..n * k).map(|_| rng.next_signed_unit() * 0.1).collect();
                let expected = lockstep_luts::gemm_nt(m, n, k, &a, &b).unwrap();
                let mut c = vec![0.0; m * n];
                gemm_f32(path, Some(&pool), &mut scratch, m, n, k, &a, &b, &mut c).unwrap();
                assert_eq!(bits(&c), bits(&expected), "{path:?} {m}x{n}x{k}");
            }
        }
    }

    #[test]
    fn big_enough_to_thread() {
        let mut rng = SplitMix64::new(32);
        let (m, n, k) = (70, 90, 260);
        let a: Vec<f32> = (0..m * k).map(|_| rng.next_signed_unit()).collect();
        let b: Vec<f32> = (0..n * k).map(|_| rng.next_signed_unit() * 0.01).collect();
        check(m, n, k, &a, &b);
    }

    #[test]
    fn extreme_exponents_take_the_slow_tiles_and_still_match() {
        let mut rng = SplitMix64::new(33);
        let (m, n, k) = (9, 40, 70);
        let pow2 = |e: i32| f32::from_bits(((127 + e) as u32) << 23);
        for (ea, eb) in [(-120, -10), (60, 60), (-60, -70), (120, -100), (-126, 10)] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.next_signed_unit() * pow2(ea)).collect();
            let b: Vec<f32> = (0..n * k).map(|_| rng.next_signed_unit() * pow2(eb)).collect();
            check(m, n, k, &a, &b);
        }
        check(1, 1, 2, &[f32::MAX, -f32::MAX], &[f32::MAX, f32::MAX]);
    }

    #[test]
    fn full_range_quants_and_offsets() {
        // ±127 quants everywhere: the largest block sums, and the offset trick's extremes.
        let (m, n, k) = (5, 33, 96);
        let a: Vec<f32> = (0..m * k).map(|i| if i % 3 == 0 { -127.0 } else { 127.0 }).collect();
        let b: Vec<f32> = (0..n * k).map(|i| if i % 5 == 0 { 127.0 } else { -127.0 }).collect();
        check(m, n, k, &a, &b);
    }

    /// The register-transposing packer writes the words (both layouts) the row-at-a-time one
    /// does, on quants of every value.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn full_panels_pack_as_the_row_at_a_time_packer_does() {
        assert!(std::arch::is_x86_feature_detected!("avx2"), "every machine this runs on has AVX2");
        let (rows, blocks) = (9, 3);
        let mut a = Quantized::default();
        a.prepare(rows, blocks);
        let mut rng = lockstep_luts::rng::SplitMix64::new(7);
        a.q.iter_mut().for_each(|q| *q = (rng.below(255) as i32 - 127) as i8);
        a.exp.iter_mut().for_each(|e| *e = rng.below(60) as i32 - 30);
        for path in [Path::Avx2, Path::AvxVnni] {
            let len = blocks * BLOCK / 4 * a_words_per_quad(path);
            for panel in 0..rows / MR {
                let (mut fast, mut slow) = (vec![0u32; len], vec![1u32; len]);
                let (mut fast_scales, mut slow_scales) = (vec![0f32; blocks * MR], vec![1f32; blocks * MR]);
                // Full panels take the transposing packer on every SIMD path's layout.
                let fast_range = pack_a_panel(path, &a, rows, blocks, panel, &mut fast, &mut fast_scales);
                let slow_range = pack_a_lanes(path, &a, rows, blocks, panel, &mut slow, &mut slow_scales);
                assert_eq!(fast, slow, "{path:?} panel {panel}");
                assert_eq!(bits(&fast_scales), bits(&slow_scales), "{path:?} panel {panel}");
                assert_eq!((fast_range.min, fast_range.max), (slow_range.min, slow_range.max));
            }
        }
    }

    #[test]
    fn errors_and_empty_shapes() {
        let mut c = vec![1.0; 4];
        let err =
            gemm_f32(Path::detect(), None, &mut Scratch::default(), 2, 2, 1, &[1.0, f32::NAN], &[1.0, 1.0], &mut c)
                .unwrap_err();
        assert!(matches!(err, UnitError::NonFinite { operand: Operand::A, index: 1, .. }));
        // B is quantized first, but A's error is the one reported, as by the reference.
        let err = gemm_f32(
            Path::detect(),
            None,
            &mut Scratch::default(),
            2,
            2,
            1,
            &[1.0, f32::INFINITY],
            &[f32::NAN, 1.0],
            &mut c,
        )
        .unwrap_err();
        assert!(matches!(err, UnitError::NonFinite { operand: Operand::A, index: 1, .. }));
        let err = gemm_f32(
            Path::detect(),
            None,
            &mut Scratch::default(),
            2,
            2,
            1,
            &[1.0, 1.0],
            &[1.0, f32::NEG_INFINITY],
            &mut c,
        )
        .unwrap_err();
        assert!(matches!(err, UnitError::NonFinite { operand: Operand::B, index: 1, .. }));
        gemm_f32(Path::detect(), None, &mut Scratch::default(), 2, 2, 0, &[], &[], &mut c).unwrap();
        assert_eq!(c, vec![0.0; 4]);
        assert!(gemm_f32(Path::detect(), None, &mut Scratch::default(), 0, 5, 3, &[], &[0.0; 15], &mut []).is_ok());
    }
}
