// The verified INT8 unit C = A · Bᵀ with its block sums on cooperative matrices (tensor cores).
//
// The same unit as gemm_units.wgsl (docs/VERIFICATION.md): `qa`/`qb` hold the rows as blocks of 32
// int8 (8 packed words a block), `ea`/`eb` a power-of-two exponent per (row, block). For each
// block in order the workgroup forms the exact i32 block sums of its BM × BN outputs into
// `sums`, then each invocation adds the block's terms of the TM × TN outputs it owns to their f32
// running sums, exactly as gemm_units.wgsl does (the same `clean` fast path, the same
// `block_term` and flush outside it). Integer sums have one answer whoever forms them, so the
// outputs' bits are the reference's.
//
// Who forms the block sums: the workgroup is SR × SC subgroups of SUBGROUP invocations; each
// subgroup owns FR × FC fragments of FM × FN outputs (the hardware's cooperative-matrix shape,
// FK of k at a time: 32 / FK multiply-adds a block). `tc_block_sums` below is the portable form
// of that step (each lane takes every SUBGROUP-th output through dot4I8Packed); the `tc` plugin
// replaces its body in the SPIR-V with cooperative-matrix loads, multiply-adds and stores
// (`lockstep_gpu`'s `coop` module), which give the same integers.
//
// Operand rows are read without a bound check up to BM (or BN) rows past a batch's first row:
// the host leaves that many rows of slack after the last batch (`TC_SLACK_ROWS`), and sums of rows
// or columns past m or n are never stored.
//
// Who adds which output's terms: invocation (x, y) owns rows y + i·WY and columns x + j·WX
// (i < TM, j < TN), and `sums` keeps its rows SUMS_STRIDE words apart (BN + 8): a warp's reads of
// one (i, j) then fall in 32 different banks of workgroup memory (rows of 64 or 32 words would
// put four or eight lanes on one bank).
//
// The prepended constants choose TM, TN, WX, WY, SUMS_STRIDE and FM, FN, FK, FR, FC, SR, SC,
// SUBGROUP, with BM = TM·WY = SR·FR·FM and BN = TN·WX = SC·FC·FN.
// Bindings, the block term, the flush and the output store: gemm_common.wgsl (prepended).

@group(0) @binding(1) var<storage, read> qa: array<u32>;
@group(0) @binding(2) var<storage, read> qb: array<u32>;

const BM: u32 = TM * WY;
// One dimension (subgroup builtins want it); invocation t owns the outputs gemm_units.wgsl's
// invocation (t % WX, t / WX) would.
const THREADS: u32 = WX * WY;
const BN: u32 = TN * WX;
// Packed words per block of 32 int8.
const WORDS: u32 = 8u;

// Two blocks' exact i32 sums of the workgroup's BM × BN outputs, rows SUMS_STRIDE apart: block b's in half
// b % 2. One barrier a block suffices: block b + 2 overwrites the half block b was read from
// only after every invocation passed block b + 1's barrier, which it reaches after reading b.
var<workgroup> sums: array<i32, 2u * BM * SUMS_STRIDE>;

// The block sums of one block for one subgroup's FR·FM rows × FC·FN columns: A's rows from word
// `a_word` of qa and B's from word `b_word` of qb, `row_words` words apart; into `sums` from
// `sums_at`, rows SUMS_STRIDE apart. Called by whole subgroups in uniform control flow.
fn tc_block_sums(a_word: u32, b_word: u32, row_words: u32, sums_at: u32, lane: u32) {
    for (var o = lane; o < FR * FM * FC * FN; o += SUBGROUP) {
        let r = o / (FC * FN);
        let c = o % (FC * FN);
        var acc = 0;
        for (var w = 0u; w < WORDS; w++) {
            acc = dot4I8Packed(qa[a_word + r * row_words + w], qb[b_word + c * row_words + w]) + acc;
        }
        sums[sums_at + r * SUMS_STRIDE + c] = acc;
    }
}

@compute @workgroup_size(THREADS, 1, 1)
fn gemm_tc(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) subgroup: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    opaque_zero = pw(P_ZERO);
    let lid = vec2<u32>(tid % WX, tid / WX);
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let m = pw(MATMUL_M);
    let n = pw(MATMUL_N);
    let blocks = (pw(MATMUL_K) + 31u) / 32u;
    let row_words = blocks * WORDS;
    // This batch's operand rows.
    let a_rows = wid.z * m;
    let b_rows = wid.z * n;
    // This subgroup's fragments.
    let sub_row = (subgroup / SC) * FR * FM;
    let sub_col = (subgroup % SC) * FC * FN;

    var clean = true;
    var sum: array<f32, TM * TN>;
    for (var o = 0u; o < TM * TN; o++) {
        sum[o] = 0.0;
    }

    for (var blk = 0u; blk < blocks; blk++) {
        let half = (blk % 2u) * BM * SUMS_STRIDE;
        tc_block_sums(
            (a_rows + row0 + sub_row) * row_words + blk * WORDS,
            (b_rows + col0 + sub_col) * row_words + blk * WORDS,
            row_words,
            half + sub_row * SUMS_STRIDE + sub_col,
            lane,
        );
        workgroupBarrier();

        // Exponents of rows and columns past m or n are never used for a stored output.
        var xa: array<i32, TM>;
        var xb: array<i32, TN>;
        for (var i = 0u; i < TM; i++) {
            let row = row0 + lid.y + i * WY;
            xa[i] = select(0, ea[(a_rows + row) * blocks + blk], row < m);
        }
        for (var j = 0u; j < TN; j++) {
            let col = col0 + lid.x + j * WX;
            xb[j] = select(0, eb[(b_rows + col) * blocks + blk], col < n);
        }
        // The block's terms, added in block order (gemm_units.wgsl says why each path is exact).
        clean = clean && fast_range(xa, xb);
        for (var i = 0u; i < TM; i++) {
            for (var j = 0u; j < TN; j++) {
                let acc = sums[half + (lid.y + i * WY) * SUMS_STRIDE + lid.x + j * WX];
                if clean {
                    let scale = bitcast<f32>(((xa[i] + 127) << 23u) + (xb[j] << 23u));
                    sum[i * TN + j] = sum[i * TN + j] + f32(acc) * scale;
                } else {
                    sum[i * TN + j] = flush_partial(sum[i * TN + j] + block_term(acc, xa[i] + xb[j]));
                }
            }
        }
    }

    for (var i = 0u; i < TM; i++) {
        let row = row0 + lid.y + i * WY;
        for (var j = 0u; j < TN; j++) {
            let col = col0 + lid.x + j * WX;
            if row < m && col < n {
                store_output(wid.z, row, col, sum[i * TN + j]);
            }
        }
    }
}
