// The verified INT8 unit C = A · Bᵀ for products with few outputs and a long k (the weight
// gradients `dW = dyᵀ · x`, whose k is every row of the batch): the same additions, in the same
// order, as `gemm_units`, spread over more invocations (docs/VERIFICATION.md §5).
//
// `gemm_units` gives each invocation its outputs for the whole of k, so a product with a few
// thousand outputs runs as a handful of workgroups, each walking every block in turn. Here a
// workgroup owns a tile of SBM × SBN outputs and takes k in stages of SLICES blocks. Within a
// stage, slice z of the workgroup's invocations forms the exact i32 sums of block z for the
// whole tile (each of its invocations STM × STN of them, `dot4_prepared` from the product snippet), into
// workgroup memory; after a barrier every invocation adds, for the outputs it owns (output
// `o · 256 + its index`), the stage's block terms to their running sums in block order. The
// integer work of one output is spread over SLICES invocations; its additions are not, so the
// bits are those of `gemm_units` and of the reference.
//
// The epilogue is `gemm_units`'s, per output: while every exponent sum of the output's blocks so
// far lies in [-126, 108] the term `f32(acc) * 2^s` is exact (an FMA rounds like the add), and
// from the first one outside on, terms are built on the bits and partial sums flushed.
//
// Bindings, the block term, the flush and the output store: gemm_common.wgsl (prepended).

@group(0) @binding(1) var<storage, read> qa: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> qb: array<vec4<u32>>;

const STM: u32 = 4u;
const STN: u32 = 4u;
const SWX: u32 = 8u;
const SWY: u32 = 4u;
const SLICES: u32 = 8u;
const SBM: u32 = STM * SWY;
const SBN: u32 = STN * SWX;
const SLICE_THREADS: u32 = SWX * SWY;
const SPLIT_THREADS: u32 = SLICE_THREADS * SLICES;
// Outputs each invocation adds up.
const OWN: u32 = SBM * SBN / SPLIT_THREADS;
const SWORDS: u32 = 8u;
// Where B's part of a stage begins, in words.
const S_B_TILE: u32 = SBM * SWORDS * SLICES;

// One stage: SLICES blocks of A's SBM rows, then of B's SBN rows, word-major (word w of block z
// of row r at `(z·8 + w)·rows + r`); their exponents (block z of row r at `z·rows + r`, B's
// after A's); and each block's i32 sums for the tile.
var<workgroup> split_tiles: array<vec4<u32>, (SBM + SBN) * SWORDS * SLICES / 4u>;
var<workgroup> split_exps: array<i32, (SBM + SBN) * SLICES>;
var<workgroup> split_acc: array<i32, SLICES * SBM * SBN>;

// Stages SLICES blocks from block `blk0` of one operand (side 0: A's SBM rows, side 1: B's SBN
// rows), rows at or past `limit` and blocks past k as zeros (never summed: the epilogue stops
// at k).
fn split_stage(side: u32, tid: u32, blk0: u32, blocks: u32, first: u32, tile_row0: u32, limit: u32) {
    let rows = select(SBM, SBN, side == 1u);
    let words_at = select(0u, S_B_TILE, side == 1u);
    let exps_at = select(0u, SBM * SLICES, side == 1u);
    let row_words = blocks * SWORDS;
    let groups = SWORDS * SLICES / 4u;
    for (var idx = tid; idx < rows * groups; idx += SPLIT_THREADS) {
        let r = idx % rows;
        let g = idx / rows;
        var v = vec4<u32>(0u);
        if tile_row0 + r < limit && blk0 * SWORDS + g * 4u < row_words {
            let at = ((first + tile_row0 + r) * row_words + blk0 * SWORDS) / 4u + g;
            if side == 0u {
                v = qa[at];
            } else {
                v = qb[at];
            }
        }
        for (var e = 0u; e < 4u; e++) {
            let at = words_at + (g * 4u + e) * rows + r;
            split_tiles[at / 4u][at % 4u] = v[e];
        }
    }
    for (var idx = tid; idx < rows * SLICES; idx += SPLIT_THREADS) {
        let r = idx % rows;
        let z = idx / rows;
        var e = 0;
        if tile_row0 + r < limit && blk0 + z < blocks {
            let at = (first + tile_row0 + r) * blocks + blk0 + z;
            if side == 0u {
                e = ea[at];
            } else {
                e = eb[at];
            }
        }
        split_exps[exps_at + z * rows + r] = e;
    }
}

@compute @workgroup_size(256)
fn gemm_units_split(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    opaque_zero = pw(P_ZERO);
    let row0 = wid.y * SBM;
    let col0 = wid.x * SBN;
    let slice = tid / SLICE_THREADS;
    let lx = (tid % SLICE_THREADS) % SWX;
    let ly = (tid % SLICE_THREADS) / SWX;
    let m = pw(MATMUL_M);
    let n = pw(MATMUL_N);
    let blocks = (pw(MATMUL_K) + 31u) / 32u;
    let a_rows = wid.z * m;
    let b_rows = wid.z * n;

    var sum: array<f32, OWN>;
    var clean: array<bool, OWN>;
    for (var o = 0u; o < OWN; o++) {
        sum[o] = 0.0;
        clean[o] = true;
    }

    for (var blk0 = 0u; blk0 < blocks; blk0 += SLICES) {
        split_stage(0u, tid, blk0, blocks, a_rows, row0, m);
        split_stage(1u, tid, blk0, blocks, b_rows, col0, n);
        workgroupBarrier();

        // This slice's block: exact i32 sums for the whole tile.
        var acc: array<i32, STM * STN>;
        for (var o = 0u; o < STM * STN; o++) {
            acc[o] = 0;
        }
        for (var w = 0u; w < SWORDS; w++) {
            let a_words = split_tiles[((slice * SWORDS + w) * SBM + ly * STM) / 4u];
            let b_words = split_tiles[(S_B_TILE + (slice * SWORDS + w) * SBN + lx * STN) / 4u];
            var av: array<PreparedA, STM>;
            var bv: array<PreparedB, STN>;
            for (var i = 0u; i < STM; i++) {
                av[i] = prepare_a(a_words[i]);
            }
            for (var j = 0u; j < STN; j++) {
                bv[j] = prepare_b(b_words[j]);
            }
            for (var i = 0u; i < STM; i++) {
                for (var j = 0u; j < STN; j++) {
                    acc[i * STN + j] = dot4_prepared(av[i], bv[j]) + acc[i * STN + j];
                }
            }
        }
        for (var i = 0u; i < STM; i++) {
            for (var j = 0u; j < STN; j++) {
                split_acc[(slice * SBM + ly * STM + i) * SBN + lx * STN + j] = acc[i * STN + j];
            }
        }
        workgroupBarrier();

        // The stage's terms of this invocation's outputs, in block order.
        for (var o = 0u; o < OWN; o++) {
            let out = o * SPLIT_THREADS + tid;
            let r = out / SBN;
            let col = out % SBN;
            for (var z = 0u; z < SLICES; z++) {
                if blk0 + z >= blocks {
                    break;
                }
                let block_sum = split_acc[(z * SBM + r) * SBN + col];
                let s = split_exps[z * SBM + r] + split_exps[SBM * SLICES + z * SBN + col];
                clean[o] = clean[o] && s >= -126 && s <= 108;
                if clean[o] {
                    sum[o] = sum[o] + f32(block_sum) * bitcast<f32>((s + 127) << 23u);
                } else {
                    sum[o] = flush_partial(sum[o] + block_term(block_sum, s));
                }
            }
        }
        // Everyone is done with this stage before the next one overwrites it.
        workgroupBarrier();
    }

    for (var o = 0u; o < OWN; o++) {
        let out = o * SPLIT_THREADS + tid;
        let row = row0 + out / SBN;
        let col = col0 + out % SBN;
        if row < m && col < n {
            store_output(wid.z, row, col, sum[o]);
        }
    }
}
