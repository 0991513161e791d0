// The verified INT8 unit C = A · Bᵀ on quantized operands (docs/VERIFICATION.md).
//
// The host quantizes: `qa` holds A's rows as blocks of 32 int8 (8 packed words per block,
// block order along k, zero-padded), `ea` one power-of-two exponent per (row, block); the
// same for B. Each invocation owns a TM × TN sub-tile of C and, for every block in order,
// (1) sums the 32 exact products of each output in i32 (`dot4_prepared`, from the product snippet
// prepended to this file), then (2) adds the block's term `acc · 2^(ea + eb)` to the output's
// f32 running sum.
//
// Contraction-proof epilogue: while every exponent sum of every block so far lies in
// [-126, 108] (`clean`), each term is a normal f32 or +0 (|acc| < 2^19) and `f32(acc) * 2^s`
// is exact, so an FMA the compiler may form rounds exactly like the separate add; all partial
// sums are then multiples of 2^-126 and can be neither subnormal nor -0, so the flush rule has
// nothing to do. From the first block outside that range on, each term is built on its bits
// like `lockstep_luts::block_term` and every partial sum is flushed. Either way each output sees one fixed sequence of additions, whatever TM/TN/WX/WY
// are. No float multiply-add pattern exists whose product is inexact.
//
// Workgroup: WX × WY × 1 invocations, the grid's z the batch; tile BM = TM·WY rows × BN = TN·WX columns. Invocation
// (x, y) owns rows y·TM + i and columns x·TN + j, so it reads its operands from workgroup
// memory as 16-byte vectors (TM and TN are multiples of 4) and a warp's reads are broadcasts
// or consecutive vectors. A stage loads KB blocks between barriers. The
// prepended constants choose TM, TN, WX, WY, KB.
//
// Bindings, the block term, the flush and the output store: gemm_common.wgsl (prepended).

@group(0) @binding(1) var<storage, read> qa: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> qb: array<vec4<u32>>;

const BM: u32 = TM * WY;
const BN: u32 = TN * WX;
const THREADS: u32 = WX * WY;
// Packed words per block of 32 int8, and 16-byte groups per row of a stage.
const WORDS: u32 = 8u;
const GROUPS: u32 = WORDS * KB / 4u;

// KB blocks of the A and B tiles (one stage) in one array, A's BM rows first and B's BN
// after them (from word B_TILE), word-major so the inner loop reads consecutive rows; their
// exponents the same way (B's from BM·KB).
const B_TILE: u32 = BM * WORDS * KB;
var<workgroup> tiles: array<vec4<u32>, (BM + BN) * WORDS * KB / 4u>;
var<workgroup> tile_e: array<i32, (BM + BN) * KB>;

// Stages KB blocks from block `blk0` of one operand (side 0: A from `qa` and `ea`, BM rows;
// side 1: B from `qb` and `eb`, BN rows): its rows `first + tile_row0 ..`, those at or past
// `limit` (and blocks past k) as zeros — never summed: blocks past k end the stage's loop.
// Each invocation moves 16-byte groups of one row (consecutive invocations take consecutive
// rows, so the workgroup-memory stores do not conflict).
fn stage(side: u32, tid: u32, blk0: u32, blocks: u32, first: u32, tile_row0: u32, limit: u32) {
    let rows = select(BM, BN, side == 1u);
    let words_at = select(0u, B_TILE, side == 1u);
    let exps_at = select(0u, BM * KB, side == 1u);
    let row_words = blocks * WORDS;
    for (var idx = tid; idx < rows * GROUPS; idx += THREADS) {
        let r = idx % rows;
        let g = idx / rows;
        var v = vec4<u32>(0u);
        if tile_row0 + r < limit && blk0 * WORDS + g * 4u < row_words {
            let at = ((first + tile_row0 + r) * row_words + blk0 * WORDS) / 4u + g;
            if side == 0u {
                v = qa[at];
            } else {
                v = qb[at];
            }
        }
        for (var e = 0u; e < 4u; e++) {
            let at = words_at + (g * 4u + e) * rows + r;
            tiles[at / 4u][at % 4u] = v[e];
        }
    }
    for (var idx = tid; idx < rows * KB; idx += THREADS) {
        let r = idx / KB;
        let sb = idx % KB;
        var e = 0;
        if tile_row0 + r < limit && blk0 + sb < blocks {
            let at = (first + tile_row0 + r) * blocks + blk0 + sb;
            if side == 0u {
                e = ea[at];
            } else {
                e = eb[at];
            }
        }
        tile_e[exps_at + sb * rows + r] = e;
    }
}

@compute @workgroup_size(WX, WY, 1)
fn gemm_units(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    opaque_zero = pw(P_ZERO);
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let tid = lid.y * WX + lid.x;
    let m = pw(MATMUL_M);
    let n = pw(MATMUL_N);
    let blocks = (pw(MATMUL_K) + 31u) / 32u;
    // This batch's operand rows.
    let a_rows = wid.z * m;
    let b_rows = wid.z * n;

    var clean = true;
    var sum: array<f32, TM * TN>;
    for (var o = 0u; o < TM * TN; o++) {
        sum[o] = 0.0;
    }

    for (var blk0 = 0u; blk0 < blocks; blk0 += KB) {
        stage(0u, tid, blk0, blocks, a_rows, row0, m);
        stage(1u, tid, blk0, blocks, b_rows, col0, n);
        workgroupBarrier();

        for (var sb = 0u; sb < KB; sb++) {
            if blk0 + sb >= blocks {
                break;
            }
            // Exact i32 block sums.
            var acc: array<i32, TM * TN>;
            for (var o = 0u; o < TM * TN; o++) {
                acc[o] = 0;
            }
            for (var w = 0u; w < WORDS; w++) {
                // Each operand word prepared once for the TM · TN products it takes part in.
                var av: array<PreparedA, TM>;
                var bv: array<PreparedB, TN>;
                for (var q = 0u; q < TM / 4u; q++) {
                    let v = tiles[((sb * WORDS + w) * BM + lid.y * TM) / 4u + q];
                    av[4u * q] = prepare_a(v.x);
                    av[4u * q + 1u] = prepare_a(v.y);
                    av[4u * q + 2u] = prepare_a(v.z);
                    av[4u * q + 3u] = prepare_a(v.w);
                }
                for (var q = 0u; q < TN / 4u; q++) {
                    let v = tiles[(B_TILE + (sb * WORDS + w) * BN + lid.x * TN) / 4u + q];
                    bv[4u * q] = prepare_b(v.x);
                    bv[4u * q + 1u] = prepare_b(v.y);
                    bv[4u * q + 2u] = prepare_b(v.z);
                    bv[4u * q + 3u] = prepare_b(v.w);
                }
                for (var i = 0u; i < TM; i++) {
                    for (var j = 0u; j < TN; j++) {
                        acc[i * TN + j] = dot4_prepared(av[i], bv[j]) + acc[i * TN + j];
                    }
                }
            }
            var xa: array<i32, TM>;
            var xb: array<i32, TN>;
            for (var i = 0u; i < TM; i++) {
                xa[i] = tile_e[sb * BM + lid.y * TM + i];
            }
            for (var j = 0u; j < TN; j++) {
                xb[j] = tile_e[BM * KB + sb * BN + lid.x * TN + j];
            }

            // The block's terms, added in block order.
            clean = clean && fast_range(xa, xb);
            if clean {
                // Scale bits (s + 127) << 23, split as ((ea + 127) << 23) + (eb << 23).
                var scale_a: array<i32, TM>;
                var scale_b: array<i32, TN>;
                for (var i = 0u; i < TM; i++) {
                    scale_a[i] = (xa[i] + 127) << 23u;
                }
                for (var j = 0u; j < TN; j++) {
                    scale_b[j] = xb[j] << 23u;
                }
                for (var i = 0u; i < TM; i++) {
                    for (var j = 0u; j < TN; j++) {
                        let scale = bitcast<f32>(scale_a[i] + scale_b[j]);
                        sum[i * TN + j] = sum[i * TN + j] + f32(acc[i * TN + j]) * scale;
                    }
                }
            } else {
                for (var i = 0u; i < TM; i++) {
                    for (var j = 0u; j < TN; j++) {
                        let term = block_term(acc[i * TN + j], xa[i] + xb[j]);
                        sum[i * TN + j] = flush_partial(sum[i * TN + j] + term);
                    }
                }
            }
        }
        // Everyone is done with this stage before the next one overwrites it.
        workgroupBarrier();
    }

    for (var i = 0u; i < TM; i++) {
        let row = row0 + lid.y * TM + i;
        for (var j = 0u; j < TN; j++) {
            let col = col0 + lid.x * TN + j;
            if row < m && col < n {
                store_output(wid.z, row, col, sum[i * TN + j]);
            }
        }
    }
}
