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
// Where the block sums read their operands: the workgroup's BM rows of A and BN rows of B for
// one block, staged in workgroup memory (`a_tile`, `b_tile`, rows WORDS words apart) by every
// invocation at once, each word read from the operand buffers once a workgroup. Block b + 1's
// words are read into registers while block b's sums are formed and its terms added, and
// stored into the tiles after the terms: the loads' latency is hidden behind the epilogue.
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

// One block's exact i32 sums of the workgroup's BM × BN outputs, rows SUMS_STRIDE apart. Two
// barriers a block: after the tiles are staged (block b + 1's sums overwrite block b's only
// after every invocation passed it, which it reaches after adding block b's terms) and after
// the sums are formed.
var<workgroup> sums: array<i32, BM * SUMS_STRIDE>;

// One block's operand rows, staged: A's BM rows and B's BN rows, WORDS words each.
var<workgroup> a_tile: array<u32, BM * WORDS>;
var<workgroup> b_tile: array<u32, BN * WORDS>;

// Words of the tiles each invocation stages (the last invocations may have fewer).
const A_EACH: u32 = (BM * WORDS + THREADS - 1u) / THREADS;
const B_EACH: u32 = (BN * WORDS + THREADS - 1u) / THREADS;

// The block sums of one block for one subgroup's FR·FM rows × FC·FN columns: A's rows from word
// `a_word` of a_tile and B's from word `b_word` of b_tile, `row_words` words apart; into `sums`
// from `sums_at`, rows SUMS_STRIDE apart. Called by whole subgroups in uniform control flow.
fn tc_block_sums(a_word: u32, b_word: u32, row_words: u32, sums_at: u32, lane: u32) {
    for (var o = lane; o < FR * FM * FC * FN; o += SUBGROUP) {
        let r = o / (FC * FN);
        let c = o % (FC * FN);
        var acc = 0;
        for (var w = 0u; w < WORDS; w++) {
            acc = dot4I8Packed(a_tile[a_word + r * row_words + w], b_tile[b_word + c * row_words + w]) + acc;
        }
        sums[sums_at + r * SUMS_STRIDE + c] = acc;
    }
}

// Block `blk`'s words of the workgroup's operand rows (A's from word `a_base` of qa, B's from
// `b_base` of qb, `row_words` apart) that invocation `tid` stages: word `tid + i·THREADS` of
// the A tile, then of the B tile (none read past a tile's end).
fn stage_load(blk: u32, a_base: u32, b_base: u32, row_words: u32, tid: u32) -> array<u32, A_EACH + B_EACH> {
    var words: array<u32, A_EACH + B_EACH>;
    for (var i = 0u; i < A_EACH; i++) {
        let at = tid + i * THREADS;
        if at < BM * WORDS {
            words[i] = qa[a_base + (at / WORDS) * row_words + blk * WORDS + at % WORDS];
        }
    }
    for (var i = 0u; i < B_EACH; i++) {
        let at = tid + i * THREADS;
        if at < BN * WORDS {
            words[A_EACH + i] = qb[b_base + (at / WORDS) * row_words + blk * WORDS + at % WORDS];
        }
    }
    return words;
}

// Stores what `stage_load` read into the tiles.
fn stage_store(words: array<u32, A_EACH + B_EACH>, tid: u32) {
    for (var i = 0u; i < A_EACH; i++) {
        let at = tid + i * THREADS;
        if at < BM * WORDS {
            a_tile[at] = words[i];
        }
    }
    for (var i = 0u; i < B_EACH; i++) {
        let at = tid + i * THREADS;
        if at < BN * WORDS {
            b_tile[at] = words[A_EACH + i];
        }
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

    let a_base = (a_rows + row0) * row_words;
    let b_base = (b_rows + col0) * row_words;
    if blocks > 0u {
        stage_store(stage_load(0u, a_base, b_base, row_words, tid), tid);
    }
    for (var blk = 0u; blk < blocks; blk++) {
        // The tiles hold block blk, and every invocation is done with the last block's sums
        // (it added their terms before it stored this block's tiles).
        workgroupBarrier();
        tc_block_sums(sub_row * WORDS, sub_col * WORDS, WORDS, sub_row * SUMS_STRIDE + sub_col, lane);
        // The next block's words, on their way while this block's sums are added.
        var next: array<u32, A_EACH + B_EACH>;
        if blk + 1u < blocks {
            next = stage_load(blk + 1u, a_base, b_base, row_words, tid);
        }
        // The sums are in, and every subgroup is done reading the tiles.
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
                let acc = sums[(lid.y + i * WY) * SUMS_STRIDE + lid.x + j * WX];
                if clean {
                    let scale = bitcast<f32>(((xa[i] + 127) << 23u) + (xb[j] << 23u));
                    sum[i * TN + j] = sum[i * TN + j] + f32(acc) * scale;
                } else {
                    sum[i * TN + j] = flush_partial(sum[i * TN + j] + block_term(acc, xa[i] + xb[j]));
                }
            }
        }
        if blk + 1u < blocks {
            stage_store(next, tid);
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
