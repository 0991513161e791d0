//! The step's ops on the GPU against the reference, on inputs drawn from every binary32
//! exponent, with the hardware add and multiply where they are exact (the plugins' path) and
//! with every add and multiply on the integer routines (`GpuOptions::soft_float`), so those
//! routines are checked on all inputs, not only the subnormal ones the hardware path hands them.
//! Runs on the adapter wgpu finds (lavapipe in CI); failing to create one fails the test.

use lockstep_gpu::{Engine, GpuOptions, GpuUnits};
use lockstep_luts::ops::{self, run_reference, MatView, Matmul, Memory, Op, Span};
use lockstep_luts::rng::SplitMix64;
use lockstep_shaders::{Tile, DEFAULT_TILE, NARROW_TILE};

/// Finite values whose bit patterns are uniform: every exponent equally likely, subnormals and
/// zeros included.
fn any_finite(rng: &mut SplitMix64, len: usize) -> Vec<u32> {
    (0..len)
        .map(|_| loop {
            let bits = rng.next_u32();
            if bits & 0x7f80_0000 != 0x7f80_0000 {
                break bits;
            }
        })
        .collect()
}

/// Moderate values (|x| < 2^8, any sign) with subnormals and zeros mixed in.
fn moderate(rng: &mut SplitMix64, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| match i % 9 {
            0 => rng.next_u32() & 0x807f_ffff,
            _ => (rng.next_signed_unit() * 2f32.powi(rng.below(16) as i32 - 8)).to_bits(),
        })
        .collect()
}

/// `page_words`: hold arena pages to that many words (`None`: one page holds everything);
/// `tiles`: the unit kernel's tile and narrow tile (`None`: the adapter's choice).
fn check(engine: Engine, soft_float: bool, page_words: Option<u64>, tiles: Option<(Tile, Tile)>) {
    let options = GpuOptions {
        soft_float,
        page_words,
        tile: tiles.map(|t| t.0),
        narrow: tiles.map(|t| t.1),
        ..GpuOptions::default()
    };
    let mut units = GpuUnits::new(engine, &options).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = SplitMix64::new(0xe8ac7 + u64::from(soft_float));
    let len = 30_011usize;
    let (rows, width) = (97u32, 61u32);
    let mut memory = Memory::new();
    let mut handles = Vec::new();
    for i in 0..12 {
        let h = units.buffer_create(len).unwrap();
        let mut words = if i < 4 || i == 11 { any_finite(&mut rng, len) } else { moderate(&mut rng, len) };
        if i == 3 {
            words.iter_mut().for_each(|w| *w &= 0x7fff_ffff); // second moments
        }
        if i == 7 {
            words.iter_mut().for_each(|w| *w %= width); // targets
        }
        units.buffer_write(h, 0, &words).unwrap();
        memory.insert(h, words);
        handles.push(h);
    }
    let s = |i: usize| Span::new(handles[i], 0);
    let len32 = len as u32;
    let t = 16u32;
    let ops = [
        Op::Gelu(ops::Gelu { len: len32, x: s(0), y: s(4) }),
        Op::GeluBackward(ops::GeluBackward { len: len32, dy: s(1), x: s(0), dx: s(5) }),
        Op::Adam(ops::Adam {
            len: len32,
            weights: s(0),
            grad: s(1),
            m: s(2),
            v: s(3),
            lr: 1e-3,
            correction1: 0.19,
            correction2: 0.0975,
        }),
        Op::LayerNorm(ops::LayerNorm {
            rows,
            width,
            x: s(4),
            gain: s(5),
            bias: Span::new(handles[5], 100),
            y: s(6),
            xhat: Span::new(handles[6], 10_000),
            rstd: Span::new(handles[6], 20_000),
        }),
        Op::CausalSoftmax(ops::CausalSoftmax { blocks: 50, t, scale: 0.125, scores: s(5) }),
        Op::CrossEntropy(ops::CrossEntropy {
            rows,
            vocab: width,
            logits: s(4),
            targets: s(7),
            dlogits: Span::new(handles[6], 21_000),
            loss: Span::new(handles[6], 29_000),
        }),
        Op::Matmul(Matmul {
            m: 40,
            n: 24,
            k: 70,
            batch: [2, 3],
            a: MatView::rows(handles[8], 0, 70).batched([3 * 40 * 70, 40 * 70]),
            b: MatView::transposed(handles[9], 0, 24).batched([3 * 70 * 24, 70 * 24]),
            c: MatView::rows(handles[10], 0, 24).batched([3 * 40 * 24, 40 * 24]),
            bias: Some(Span::new(handles[10], 9_000)),
            accumulate: true,
        }),
        // Few outputs, eleven blocks of k: the split kernel (`gemm_split.wgsl`), on operands of
        // every exponent (terms past the normal range both ways, infinite sums).
        Op::Matmul(Matmul {
            m: 20,
            n: 36,
            k: 333,
            batch: [1, 2],
            a: MatView::transposed(handles[11], 0, 20).batched([0, 20 * 333]),
            b: MatView::rows(handles[11], 14_000, 333),
            c: MatView::rows(handles[10], 12_000, 36).batched([0, 20 * 36]),
            bias: Some(Span::new(handles[10], 9_100)),
            accumulate: false,
        }),
        // Eight chunks, the last one short.
        Op::Hash(ops::Hash { len: len32, data: s(3), out: Span::new(handles[7], 5) }),
    ];
    for (index, op) in ops.iter().enumerate() {
        // (The products' operands are buffers 8 to 11, which no op before touches: products
        // refuse non-finite operands.)
        run_reference(op, &mut memory).unwrap_or_else(|e| panic!("the reference refused op #{index}: {e}"));
        units.run_ops(std::slice::from_ref(op)).unwrap_or_else(|e| panic!("op #{index} {}: {e}", op.name()));
        for (buffer, end) in op.extents() {
            let mut actual = vec![0u32; end as usize];
            units.buffer_read(buffer, 0, &mut actual).unwrap();
            let expected = &memory[&buffer][..end as usize];
            let wrong = expected.iter().zip(&actual).filter(|(e, a)| e != a).count();
            if let Some(i) = expected.iter().zip(&actual).position(|(e, a)| e != a) {
                panic!(
                    "soft_float {soft_float}, op #{index} {}: {wrong} words differ; first: buffer {buffer} word {i} expected {:#010x}, got {:#010x}",
                    op.name(),
                    expected[i],
                    actual[i]
                );
            }
        }
    }
}

/// With a hardware GPU's tiles: the products (6 and 2 workgroups of the default tile) run on
/// the narrow tile, the first on the tiled kernel, the second then on the split kernel.
#[test]
fn step_ops_match_the_reference_on_the_hardware_path() {
    check(Engine::Lut, false, None, Some((DEFAULT_TILE, NARROW_TILE)));
}

#[test]
fn step_ops_match_the_reference_with_every_add_and_multiply_on_the_integer_routines() {
    check(Engine::Lut, true, None, None);
}

/// Pages of 100,000 words hold three of the twelve buffers each: the arena takes all four
/// pages, and the ops read and write across them (the products' operands and outputs lie in
/// pages 2 and 3, LayerNorm's input in page 1 and its outputs in page 2) through the kernels'
/// page choice, with the reference's bits; a thirteenth buffer fits in no page and is refused.
#[test]
fn step_ops_match_the_reference_across_four_arena_pages() {
    check(Engine::Lut, false, Some(100_000), None);
    let mut units = GpuUnits::new(Engine::Dp4a, &GpuOptions { page_words: Some(1024), ..GpuOptions::default() })
        .unwrap_or_else(|e| panic!("{e}"));
    for _ in 0..4 {
        units.buffer_create(900).unwrap();
    }
    let refused = units.buffer_create(900).unwrap_err().to_string();
    assert!(refused.contains("4 pages of 1024 words"), "{refused}");
    let too_big = units.buffer_create(1100).unwrap_err().to_string();
    assert!(too_big.contains("largest storage binding holds 1024 words"), "{too_big}");
}

/// Set in the child process [`tc_ops_match_the_reference_across_four_arena_pages`] starts.
const COOPERATIVE_CHILD: &str = "LOCKSTEP_COOPMAT_CHILD";

/// The same on `tc`, whose unit kernel is SPIR-V passed through wgpu: its tiled product's
/// output lies in the arena's last page. Its modules once kept their WGSL binding numbers where
/// wgpu's Vulkan backend numbers a layout's bindings by position, so pages 1 to 3 were one
/// binding off and a product wrote to the wrong page (or none) once a run's buffers took more
/// than one (`docs/TENSOR_CORES.md`). Runs on Mesa 26's lavapipe, in a child process.
#[test]
fn tc_ops_match_the_reference_across_four_arena_pages() {
    if std::env::var_os(COOPERATIVE_CHILD).is_some() {
        return check(Engine::Tc, false, Some(100_000), None);
    }
    lockstep_faulty_plugins::coopmat::CoopmatDriver::unpacked().rerun_test(
        "tc_ops_match_the_reference_across_four_arena_pages",
        COOPERATIVE_CHILD,
        &[],
    );
}

/// An op whose output overlaps its input (an in-place GELU, a product written over its own
/// operand) runs through the reference on host copies: still the reference's bits. Refusals are
/// typed and leave the instance usable: unknown buffers, ranges past a buffer, views past a
/// buffer, token ids past the vocabulary, a NaN into the units (named by op).
#[test]
fn overlapping_ops_and_bad_requests() {
    let mut units = GpuUnits::new(Engine::Lut, &GpuOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = SplitMix64::new(0x0de7);
    let len = 3000usize;
    let h = units.buffer_create(len).unwrap();
    let words = moderate(&mut rng, len);
    units.buffer_write(h, 0, &words).unwrap();
    let mut memory = Memory::new();
    memory.insert(h, words);
    let in_place = [
        Op::Gelu(ops::Gelu { len: 1000, x: Span::new(h, 0), y: Span::new(h, 0) }),
        Op::Matmul(Matmul {
            m: 8,
            n: 8,
            k: 40,
            batch: [1, 1],
            a: MatView::rows(h, 0, 40),
            b: MatView::rows(h, 320, 40),
            c: MatView::rows(h, 10, 8), // inside A: written while A is read
            bias: None,
            accumulate: true,
        }),
    ];
    for op in &in_place {
        assert!(op.writes_overlap(), "{op:?}");
        run_reference(op, &mut memory).unwrap();
        units.run_ops(std::slice::from_ref(op)).unwrap();
        let mut actual = vec![0u32; len];
        units.buffer_read(h, 0, &mut actual).unwrap();
        let first = actual.iter().zip(&memory[&h]).position(|(a, e)| a != e);
        assert_eq!(first, None, "{}: first differing word", op.name());
    }

    // Refusals, each with its reason.
    let shown = |e: lockstep_gpu::GpuError| e.to_string();
    assert!(shown(units.buffer_write(999, 0, &[1]).unwrap_err()).contains("does not exist"));
    assert!(shown(units.buffer_read(h, len - 1, &mut [0, 0]).unwrap_err()).contains("outside buffer"));
    let past = Op::Gelu(ops::Gelu { len: 10, x: Span::new(h, len as u32 - 5), y: Span::new(h, 0) });
    assert!(units.run_ops(&[past]).is_err());
    let tokens = units.buffer_create(4).unwrap();
    units.buffer_write(tokens, 0, &[1, 2, 300, 4]).unwrap();
    let embed = Op::Embed(ops::Embed {
        rows: 4,
        seq: 2,
        width: 8,
        vocab: 256,
        tokens: Span::new(tokens, 0),
        tok: Span::new(h, 0),
        pos: Span::new(h, 0),
        out: Span::new(h, 2048),
    });
    let error = shown(units.run_ops(&[embed]).unwrap_err());
    assert!(error.contains("op #0 embed") && error.contains("token id"), "{error}");
    // (The failing op may have written part of its output: the ABI makes no promise for it.)
    let mut before = vec![0u32; len];
    units.buffer_read(h, 0, &mut before).unwrap();
    let nan = units.buffer_create(64).unwrap();
    units.buffer_write(nan, 0, &[0x7fc0_0000; 64]).unwrap();
    let product = Op::Matmul(Matmul {
        m: 1,
        n: 1,
        k: 64,
        batch: [1, 1],
        a: MatView::rows(nan, 0, 64),
        b: MatView::rows(h, 0, 64),
        c: MatView::rows(tokens, 0, 1),
        bias: None,
        accumulate: false,
    });
    let gelu = Op::Gelu(ops::Gelu { len: 4, x: Span::new(h, 0), y: Span::new(h, 2900) });
    let error = shown(units.run_ops(&[gelu, product]).unwrap_err());
    assert!(error.contains("op #1 matmul") && error.contains("non-finite"), "{error}");
    // Still usable; the first op of that call ran (its words changed), nothing else of `h` did.
    let mut after = vec![0u32; len];
    units.buffer_read(h, 0, &mut after).unwrap();
    assert!(after[..2900] == before[..2900] && after[2904..] == before[2904..]);
    let mut expected = Memory::new();
    expected.insert(h, before.clone());
    run_reference(&gelu, &mut expected).unwrap();
    assert!(after[2900..2904] == expected[&h][2900..2904]);
    let empty = units.buffer_create(0).unwrap();
    units.buffer_write(empty, 0, &[]).unwrap();
    units.buffer_free(empty);
    units.buffer_free(empty); // unknown handles are ignored
}
