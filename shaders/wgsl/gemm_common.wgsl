// What both unit kernels share (`gemm_units.wgsl`, the tiled kernel, and `gemm_split.wgsl`,
// the kernel for few outputs and a long k): the bindings, the exact block term, the flush, the
// NaN rule and the store of an output through the op's view.
//
// Where the outputs go: the parameters are a matmul op's record (`lockstep_luts::ops::Matmul`,
// read by the generated names; `pw` and the record's words are prepended), the C view's
// offset already an arena address `c` (`ld`/`st`). A batch of `batches` products (the workgroup grid's z;
// batch z is (z / batch1, z % batch1) and its operands are rows z·m … and z·n … of qa and qb,
// quantized on the device from the A and B views, or by the host for a plain unit call), each
// element (i, j) of batch (p, q) stored at word `c_offset + p·c_batch_stride0 +
// q·c_batch_stride1 + i·c_row_stride + j·c_col_stride`. With FLAG_BIAS the element is
// `v + c[bias + j]`, with FLAG_ACCUMULATE it is added to what `c` holds, the additions through
// exact_f32.wgsl (prepended). A plain unit call is one batch, row-major, no flags.
// The quantized operands `qa` and `qb` (bindings 1 and 2) are declared by each kernel: as
// 16-byte vectors where it stages whole groups, as words where cooperative matrices load them.
@group(0) @binding(3) var<storage, read> ea: array<i32>;
@group(0) @binding(4) var<storage, read> eb: array<i32>;
// The output: the arena's first page (arena.wgsl, prepended, holds the others and `ld`/`st`),
// or a plain unit call's output buffer (one page).
@group(0) @binding(5) var<storage, read_write> page0: array<u32>;

const EXP_MASK: u32 = 0x7f800000u;
const CANONICAL_NAN: u32 = 0x7fc00000u;

// `lockstep_luts::units::block_term`: acc · 2^s built on the bits; +0 below the normal range,
// ±Inf above it. |acc| < 2^24, so f32(acc) is exact.
fn block_term(acc: i32, s: i32) -> f32 {
    if acc == 0 {
        return 0.0;
    }
    let bits = bitcast<u32>(f32(acc));
    let biased = i32((bits >> 23u) & 0xffu) + s;
    if biased <= 0 {
        return 0.0;
    }
    if biased >= 255 {
        return bitcast<f32>((bits & 0x80000000u) | EXP_MASK);
    }
    return bitcast<f32>((bits & 0x807fffffu) | (u32(biased) << 23u));
}

// Partial sums of magnitude below 2^-126 (zero or subnormal, either sign) become +0.
fn flush_partial(x: f32) -> f32 {
    if (bitcast<u32>(x) & 0x7fffffffu) < 0x00800000u {
        return 0.0;
    }
    return x;
}

fn canonicalize(x: f32) -> f32 {
    if (bitcast<u32>(x) & 0x7fffffffu) > EXP_MASK {
        return bitcast<f32>(CANONICAL_NAN);
    }
    return x;
}

// Stores output (row, col) of batch z: `sum` with its NaN canonicalized, then the op's bias
// and accumulation.
fn store_output(z: u32, row: u32, col: u32, sum: f32) {
    let batch1 = pw(MATMUL_BATCH1);
    let at = pw(MATMUL_C_OFFSET) + (z / batch1) * pw(MATMUL_C_BATCH_STRIDE0)
        + (z % batch1) * pw(MATMUL_C_BATCH_STRIDE1) + row * pw(MATMUL_C_ROW_STRIDE) + col * pw(MATMUL_C_COL_STRIDE);
    let flags = pw(P_FLAGS);
    var v = bitcast<u32>(canonicalize(sum));
    if (flags & FLAG_BIAS) != 0u {
        v = x_add(v, ld(pw(MATMUL_BIAS) + col));
    }
    if (flags & FLAG_ACCUMULATE) != 0u {
        v = x_add(ld(at), v);
    }
    st(at, v);
}
