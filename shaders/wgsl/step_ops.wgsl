// The training step's ops (ABI 2, `lockstep_luts::ops`) on plugin-owned buffers.
//
// Every buffer of an instance is a range of the arena (32-bit words: f32 bits, token ids,
// hashes): up to four pages, `page0` here and `page1` … `page3` in arena.wgsl (prepended), each
// a storage binding, so every kernel binds the same storage and finds its operands by word
// addresses in its parameters, read and written through `ld` and `st` (arena.wgsl). Parameters come as 64 words of a uniform record (one per
// dispatch, at a dynamic offset, `params` and `pw` prepended): words 0 … 23 are the op's ABI
// params with every buffer offset turned into its arena address, read by the names the op
// table generates (generated_ops.wgsl, prepended: `pw(LAYER_NORM_WIDTH)`); P_FLAGS holds the
// op's flags, P_PART which operand a product's quantizer takes, P_OP_INDEX the op's index in its
// call (for `status`), and P_ZERO is always 0 and feeds `opaque_zero` (exact_f32.wgsl).
//
// Each kernel computes an output with the reference's operations in the reference's order,
// through exact_f32.wgsl: one invocation per element for element-wise ops. Every sum is a lane
// sum (`lockstep_luts::ops::lane_sum`: value i in lane i mod 32, each lane in order from +0, then
// the lanes in lane order), and the definition's 32 lanes are 32 invocations here: a row op
// runs a workgroup of 8 rows × 32 lanes, a column sum one of 8 columns × 32 lanes, and
// `lane_total` adds a row's (or column's) 32 lane totals in lane order through workgroup memory.
// The dispatch is 256 invocations wide and, past 65535 workgroups, two-dimensional; invocations
// past the end return at once, or, in kernels with barriers, stay and compute nothing.
//
// `quantize` prepares a product's operand for `gemm_units` (prepended file's unit kernel): for
// one (batch, 32 rows, block) of a strided view, read in runs of neighbouring words, it finds
// each row's block exponent and packs its 32 quants exactly as `lockstep_luts::units::quantize_rows`
// does, into `q` (8 words per block) and `e`.
//
// A kernel that meets a non-finite operand or a token id past the vocabulary records
// `(op << 4) | kind` with atomicMin in `status[0]`, so the host learns the first op that failed.

@group(0) @binding(1) var<storage, read_write> page0: array<u32>;
@group(0) @binding(2) var<storage, read_write> q: array<u32>;
@group(0) @binding(3) var<storage, read_write> e: array<i32>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read_write> scratch: array<u32>;

const STATUS_NON_FINITE: u32 = 1u;
const STATUS_TOKEN: u32 = 2u;

fn fail(kind: u32) {
    atomicMin(&status[0], (pw(P_OP_INDEX) << 4u) | kind);
}

// The invocation's index in a dispatch of 256-wide workgroups over a (gx, gy) grid.
fn begin(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    opaque_zero = pw(P_ZERO);
    return gid.y * groups.x * 256u + gid.x;
}

// ---- lane sums ----

// Rows (or columns) per workgroup in the lane kernels: 8 × 32 lanes = 256 invocations.
const SLOTS: u32 = 8u;

var<workgroup> lane_part: array<u32, 256>;
var<workgroup> slot_total: array<u32, SLOTS>;

// The workgroup's index in a (gx, gy) grid of workgroups.
fn group_index(wid: vec3<u32>, groups: vec3<u32>) -> u32 {
    opaque_zero = pw(P_ZERO);
    return wid.y * groups.x + wid.x;
}

// Slot `slot`'s lane `lane` holds its lane total `v`: every lane of the slot gets the slot's
// lane sum, the 32 totals added in lane order (by lane 0; `lockstep_luts::ops::combine_lanes`).
// Every invocation of the workgroup must call it (it holds barriers); a slot past the end
// passes anything and ignores the result.
fn lane_total(slot: u32, lane: u32, v: u32) -> u32 {
    lane_part[slot * LANES + lane] = v;
    workgroupBarrier();
    if lane == 0u {
        var sum = lane_part[slot * LANES];
        for (var l = 1u; l < LANES; l++) {
            sum = x_add(sum, lane_part[slot * LANES + l]);
        }
        slot_total[slot] = sum;
    }
    workgroupBarrier();
    return slot_total[slot];
}

// `lane_total` for a maximum (`lockstep_luts::ops::lane_max_by`): lane maxima folded in lane
// order with `x_max`.
fn lane_max_total(slot: u32, lane: u32, v: u32) -> u32 {
    lane_part[slot * LANES + lane] = v;
    workgroupBarrier();
    if lane == 0u {
        var mx = lane_part[slot * LANES];
        for (var l = 1u; l < LANES; l++) {
            mx = x_max(mx, lane_part[slot * LANES + l]);
        }
        slot_total[slot] = mx;
    }
    workgroupBarrier();
    return slot_total[slot];
}

// ---- products: the operand quantizer ----

// The matmul's parameter `a` names for its A operand (P_PART 0), `b` for its B operand.
fn operand(a: u32, b: u32) -> u32 {
    return pw(select(a, b, pw(P_PART) == 1u));
}

// Rows of a view one quantizer workgroup takes (one block of k each).
const QUANT_ROWS: u32 = 32u;

// The workgroup's 32 rows × 32 values of one block, staged so that the arena is read in runs
// of neighbouring words whichever way the view runs (row `r`, value `c` at `r * 33 + c`: the
// padding word keeps a column's reads on distinct banks).
var<workgroup> quant_tile: array<u32, 1056>;
// Each row's eight partial maxima of magnitude bits (one per word), non-finite values as
// `EXPM` or more: a maximum is the same whichever way it is folded.
var<workgroup> quant_max: array<u32, 256>;

// One (batch, 32 rows, block) of the matmul's A (P_PART 0) or B (P_PART 1) view. The values
// are read four per invocation: along the block when the view's values are contiguous there
// (`col_stride` 1: a row of the buffer per row), else across the rows (a transposed view: a
// column of the buffer per row), so neighbouring invocations read neighbouring words. Then
// each invocation packs one word of one row: the row's block exponent from its 32 values, its
// four quants — exactly `lockstep_luts::units::quantize_rows`, which does not depend on how the
// values were read.
@compute @workgroup_size(256)
fn quantize(
    @builtin(local_invocation_index) t: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let g = group_index(wid, groups);
    let rows = operand(MATMUL_M, MATMUL_N);
    let k = pw(MATMUL_K);
    let blocks = (k + 31u) / 32u;
    let batch1 = pw(MATMUL_BATCH1);
    let tiles = (rows + QUANT_ROWS - 1u) / QUANT_ROWS;
    // Workgroups past the end stay for the barrier and compute nothing.
    let live = g < pw(MATMUL_BATCH0) * batch1 * tiles * blocks;
    let first_row = (g % tiles) * QUANT_ROWS;
    let blk = (g / tiles) % blocks;
    let z = g / (tiles * blocks);
    let base = operand(MATMUL_A_OFFSET, MATMUL_B_OFFSET)
        + (z / batch1) * operand(MATMUL_A_BATCH_STRIDE0, MATMUL_B_BATCH_STRIDE0)
        + (z % batch1) * operand(MATMUL_A_BATCH_STRIDE1, MATMUL_B_BATCH_STRIDE1);
    let row_stride = operand(MATMUL_A_ROW_STRIDE, MATMUL_B_ROW_STRIDE);
    let col_stride = operand(MATMUL_A_COL_STRIDE, MATMUL_B_COL_STRIDE);
    let start = blk * 32u;
    let along_block = col_stride == 1u;
    for (var j = 0u; j < 4u; j++) {
        var r = t % 32u;
        var c = t / 32u + 8u * j;
        if along_block {
            r = t / 32u + 8u * j;
            c = t % 32u;
        }
        var bits = 0u;
        if live && first_row + r < rows && start + c < k {
            bits = ld(base + (first_row + r) * row_stride + (start + c) * col_stride);
        }
        quant_tile[r * 33u + c] = bits;
    }
    workgroupBarrier();
    let r = t / 8u;
    let w = t % 8u;
    let row = first_row + r;
    // Values past k read as +0: no effect on the maximum, a quant of 0. A magnitude of EXPM or
    // more is an infinity or a NaN.
    var part = 0u;
    for (var b = 0u; b < 4u; b++) {
        part = max(part, quant_tile[r * 33u + w * 4u + b] & 0x7fffffffu);
    }
    quant_max[t] = part;
    workgroupBarrier();
    if !live || row >= rows {
        return;
    }
    var amax = 0u;
    for (var p = 0u; p < 8u; p++) {
        amax = max(amax, quant_max[r * 8u + p]);
    }
    if amax >= EXPM {
        fail(STATUS_NON_FINITE);
        return;
    }
    // lockstep_luts::units::block_exponent.
    var ex = 0;
    let biased = i32(amax >> 23u);
    if biased != 0 {
        ex = biased - 133;
        if ((amax & MANT) | 0x00800000u) > (127u << 17u) {
            ex = ex + 1;
        }
    }
    let unit = (z * rows + row) * blocks + blk;
    if w == 0u {
        e[unit] = ex;
    }
    // lockstep_luts::units::quantize_value, four quants to a word (little-endian bytes).
    var word = 0u;
    for (var b = 0u; b < 4u; b++) {
        let bits = quant_tile[r * 33u + w * 4u + b];
        var quant = 0;
        let be = i32((bits >> 23u) & 0xffu);
        if be != 0 {
            let mant = (bits & MANT) | 0x00800000u;
            let shift = 150 + ex - be;
            var magnitude = 0u;
            if shift <= 24 {
                let s = u32(shift);
                let truncated = mant >> s;
                let remainder = mant & ((1u << s) - 1u);
                let half = 1u << (s - 1u);
                magnitude = truncated;
                if remainder > half || (remainder == half && (truncated & 1u) == 1u) {
                    magnitude = truncated + 1u;
                }
            }
            quant = select(i32(magnitude), -i32(magnitude), (bits >> 31u) == 1u);
        }
        word = word | ((u32(quant) & 0xffu) << (8u * b));
    }
    q[unit * 8u + w] = word;
}

// ---- element-wise ----

@compute @workgroup_size(256)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    let width = pw(EMBED_WIDTH);
    if i >= pw(EMBED_ROWS) * width {
        return;
    }
    let r = i / width;
    let j = i % width;
    let t = ld(pw(EMBED_TOKENS) + r);
    if t >= pw(EMBED_VOCAB) {
        fail(STATUS_TOKEN);
        return;
    }
    let pos = (r % pw(EMBED_SEQ)) * width + j;
    st(pw(EMBED_OUT) + i, x_add(ld(pw(EMBED_TOK) + t * width + j), ld(pw(EMBED_POS) + pos)));
}

// The embedding gradient's row lists, one workgroup: scratch[v] becomes the first entry of
// token v's list and scratch[vocab] their total, and from scratch[vocab + 1] on the lists: for
// each token, its rows grouped by lane (lane 0's rows first), in row order within a lane — the
// order in which `embed_backward` adds them.
@compute @workgroup_size(256)
fn embed_lists(@builtin(local_invocation_index) li: u32) {
    opaque_zero = pw(P_ZERO);
    let rows = pw(EMBED_BACKWARD_ROWS);
    let vocab = pw(EMBED_BACKWARD_VOCAB);
    let tokens = pw(EMBED_BACKWARD_TOKENS);
    for (var v = li; v < vocab; v += 256u) {
        var count = 0u;
        for (var r = 0u; r < rows; r++) {
            count += select(0u, 1u, ld(tokens + r) == v);
        }
        scratch[v] = count;
    }
    if li == 0u {
        for (var r = 0u; r < rows; r++) {
            if ld(tokens + r) >= vocab {
                fail(STATUS_TOKEN);
            }
        }
    }
    storageBarrier();
    workgroupBarrier();
    if li == 0u {
        var at = 0u;
        for (var v = 0u; v < vocab; v++) {
            let count = scratch[v];
            scratch[v] = at;
            at += count;
        }
        scratch[vocab] = at;
    }
    storageBarrier();
    workgroupBarrier();
    for (var v = li; v < vocab; v += 256u) {
        var at = vocab + 1u + scratch[v];
        for (var l = 0u; l < LANES; l++) {
            for (var r = l; r < rows; r += LANES) {
                if ld(tokens + r) == v {
                    scratch[at] = r;
                    at++;
                }
            }
        }
    }
}

// One invocation per output word of dtok (vocab × width) then dpos (positions × width): the lane
// sum of its rows (token v's list from `embed_lists`; rows p, p + seq, … for position p), each
// lane's rows in order from +0, the lane totals added in lane order.
@compute @workgroup_size(256)
fn embed_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    let rows = pw(EMBED_BACKWARD_ROWS);
    let seq = pw(EMBED_BACKWARD_SEQ);
    let width = pw(EMBED_BACKWARD_WIDTH);
    let vocab = pw(EMBED_BACKWARD_VOCAB);
    if i >= (vocab + pw(EMBED_BACKWARD_POSITIONS)) * width {
        return;
    }
    let v = i / width;
    let j = i % width;
    let dy = pw(EMBED_BACKWARD_DY);
    var acc = 0u;
    if v < vocab {
        let end = vocab + 1u + scratch[v + 1u];
        var lane = 0u;
        var part = 0u;
        for (var at = vocab + 1u + scratch[v]; at < end; at++) {
            let r = scratch[at];
            if r % LANES != lane {
                acc = x_add(acc, part);
                part = 0u;
                lane = r % LANES;
            }
            part = x_add(part, ld(dy + r * width + j));
        }
        st(pw(EMBED_BACKWARD_DTOK) + i, x_add(acc, part));
    } else {
        let p = v - vocab;
        if p < seq {
            for (var l = 0u; l < LANES; l++) {
                var part = 0u;
                for (var r = p; r < rows; r += seq) {
                    if r % LANES == l {
                        part = x_add(part, ld(dy + r * width + j));
                    }
                }
                acc = x_add(acc, part);
            }
        }
        st(pw(EMBED_BACKWARD_DPOS) + p * width + j, acc);
    }
}

@compute @workgroup_size(256)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    if i >= pw(GELU_LEN) {
        return;
    }
    st(pw(GELU_Y) + i, x_gelu(ld(pw(GELU_X) + i)));
}

@compute @workgroup_size(256)
fn gelu_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    if i >= pw(GELU_BACKWARD_LEN) {
        return;
    }
    let x = ld(pw(GELU_BACKWARD_X) + i);
    st(pw(GELU_BACKWARD_DX) + i, x_mul(ld(pw(GELU_BACKWARD_DY) + i), x_gelu_grad(x)));
}

@compute @workgroup_size(256)
fn adam(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    if i >= pw(ADAM_LEN) {
        return;
    }
    let w = pw(ADAM_WEIGHTS) + i;
    let at_m = pw(ADAM_M) + i;
    let at_v = pw(ADAM_V) + i;
    let g = ld(pw(ADAM_GRAD) + i);
    let m = x_add(x_mul(ADAM_BETA1, ld(at_m)), x_mul(x_sub(F_ONE, ADAM_BETA1), g));
    let v = x_add(x_mul(ADAM_BETA2, ld(at_v)), x_mul(x_sub(F_ONE, ADAM_BETA2), x_mul(g, g)));
    let m_hat = x_div(m, pw(ADAM_CORRECTION1));
    let v_hat = x_div(v, pw(ADAM_CORRECTION2));
    let step = x_div(x_mul(pw(ADAM_LR), m_hat), x_add(x_sqrt(v_hat), ADAM_EPS));
    st(w, x_sub(ld(w), step));
    st(at_m, m);
    st(at_v, v);
}

// ---- rows: a workgroup of 8 rows, 32 lanes each ----

@compute @workgroup_size(256)
fn layer_norm(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let slot = li / LANES;
    let lane = li % LANES;
    let r = group_index(wid, groups) * SLOTS + slot;
    let live = r < pw(LAYER_NORM_ROWS);
    let width = pw(LAYER_NORM_WIDTH);
    let c = x_from_u32(width);
    let x = pw(LAYER_NORM_X) + r * width;
    var part = 0u;
    if live {
        for (var j = lane; j < width; j += LANES) {
            part = x_add(part, ld(x + j));
        }
    }
    let mean = x_div(lane_total(slot, lane, part), c);
    part = 0u;
    if live {
        for (var j = lane; j < width; j += LANES) {
            let d = x_sub(ld(x + j), mean);
            part = x_add(part, x_mul(d, d));
        }
    }
    let var_sum = lane_total(slot, lane, part);
    if !live {
        return;
    }
    let s = x_div(F_ONE, x_sqrt(x_add(x_div(var_sum, c), LN_EPS)));
    let y = pw(LAYER_NORM_Y) + r * width;
    let xhat = pw(LAYER_NORM_XHAT) + r * width;
    for (var j = lane; j < width; j += LANES) {
        let h = x_mul(x_sub(ld(x + j), mean), s);
        st(xhat + j, h);
        st(y + j, x_add(x_mul(h, ld(pw(LAYER_NORM_GAIN) + j)), ld(pw(LAYER_NORM_BIAS) + j)));
    }
    if lane == 0u {
        st(pw(LAYER_NORM_RSTD) + r, s);
    }
}

// The input gradient (`layer_norm_param_grads` then takes the columns).
@compute @workgroup_size(256)
fn layer_norm_backward(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let slot = li / LANES;
    let lane = li % LANES;
    let r = group_index(wid, groups) * SLOTS + slot;
    let live = r < pw(LAYER_NORM_BACKWARD_ROWS);
    let width = pw(LAYER_NORM_BACKWARD_WIDTH);
    let c = x_from_u32(width);
    let dy = pw(LAYER_NORM_BACKWARD_DY) + r * width;
    let h = pw(LAYER_NORM_BACKWARD_XHAT) + r * width;
    let gain = pw(LAYER_NORM_BACKWARD_GAIN);
    var part1 = 0u;
    var part2 = 0u;
    if live {
        for (var j = lane; j < width; j += LANES) {
            let d = x_mul(ld(dy + j), ld(gain + j));
            part1 = x_add(part1, d);
            part2 = x_add(part2, x_mul(d, ld(h + j)));
        }
    }
    let m1 = x_div(lane_total(slot, lane, part1), c);
    let m2 = x_div(lane_total(slot, lane, part2), c);
    if !live {
        return;
    }
    let s = ld(pw(LAYER_NORM_BACKWARD_RSTD) + r);
    let dx = pw(LAYER_NORM_BACKWARD_DX) + r * width;
    let accumulate = (pw(P_FLAGS) & FLAG_ACCUMULATE) != 0u;
    for (var j = lane; j < width; j += LANES) {
        let d = x_mul(ld(dy + j), ld(gain + j));
        let v = x_mul(x_sub(x_sub(d, m1), x_mul(ld(h + j), m2)), s);
        if accumulate {
            st(dx + j, x_add(ld(dx + j), v));
        } else {
            st(dx + j, v);
        }
    }
}

// In place; row r of the blocks is query i = r mod t.
@compute @workgroup_size(256)
fn causal_softmax(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let slot = li / LANES;
    let lane = li % LANES;
    let r = group_index(wid, groups) * SLOTS + slot;
    let t = pw(CAUSAL_SOFTMAX_T);
    let live = r < pw(CAUSAL_SOFTMAX_BLOCKS) * t;
    // A slot past the end walks no entries (`i + 1` of them below).
    let i = select(0u, r % t, live);
    let n = select(0u, i + 1u, live);
    let row = pw(CAUSAL_SOFTMAX_SCORES) + r * t;
    let scale = pw(CAUSAL_SOFTMAX_SCALE);
    var mx = NEG_INF;
    for (var j = lane; j < n; j += LANES) {
        let v = x_mul(ld(row + j), scale);
        st(row + j, v);
        mx = x_max(mx, v);
    }
    mx = lane_max_total(slot, lane, mx);
    var part = 0u;
    for (var j = lane; j < n; j += LANES) {
        let ev = x_exp(x_sub(ld(row + j), mx));
        st(row + j, ev);
        part = x_add(part, ev);
    }
    let sum = lane_total(slot, lane, part);
    if !live {
        return;
    }
    for (var j = lane; j < n; j += LANES) {
        st(row + j, x_div(ld(row + j), sum));
    }
    for (var j = n + lane; j < t; j += LANES) {
        st(row + j, 0u);
    }
}

@compute @workgroup_size(256)
fn causal_softmax_backward(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let slot = li / LANES;
    let lane = li % LANES;
    let r = group_index(wid, groups) * SLOTS + slot;
    let t = pw(CAUSAL_SOFTMAX_BACKWARD_T);
    let live = r < pw(CAUSAL_SOFTMAX_BACKWARD_BLOCKS) * t;
    let n = select(0u, r % t + 1u, live);
    let p = pw(CAUSAL_SOFTMAX_BACKWARD_PROBS) + r * t;
    let dp = pw(CAUSAL_SOFTMAX_BACKWARD_DPROBS) + r * t;
    let ds = pw(CAUSAL_SOFTMAX_BACKWARD_DSCORES) + r * t;
    let scale = pw(CAUSAL_SOFTMAX_BACKWARD_SCALE);
    var part = 0u;
    for (var j = lane; j < n; j += LANES) {
        part = x_add(part, x_mul(ld(p + j), ld(dp + j)));
    }
    let dot = lane_total(slot, lane, part);
    if !live {
        return;
    }
    for (var j = lane; j < n; j += LANES) {
        st(ds + j, x_mul(x_mul(ld(p + j), x_sub(ld(dp + j), dot)), scale));
    }
    for (var j = n + lane; j < t; j += LANES) {
        st(ds + j, 0u);
    }
}

// Each row's loss goes to scratch[row]; `cross_entropy_mean` then writes the mean.
@compute @workgroup_size(256)
fn cross_entropy(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let slot = li / LANES;
    let lane = li % LANES;
    let r = group_index(wid, groups) * SLOTS + slot;
    let rows = pw(CROSS_ENTROPY_ROWS);
    let vocab = pw(CROSS_ENTROPY_VOCAB);
    var live = r < rows;
    var goal = 0u;
    if live {
        goal = ld(pw(CROSS_ENTROPY_TARGETS) + r);
        if goal >= vocab {
            fail(STATUS_TOKEN);
            live = false;
        }
    }
    let n = select(0u, vocab, live);
    let row = pw(CROSS_ENTROPY_LOGITS) + r * vocab;
    let d = pw(CROSS_ENTROPY_DLOGITS) + r * vocab;
    var mx = NEG_INF;
    for (var j = lane; j < n; j += LANES) {
        mx = x_max(mx, ld(row + j));
    }
    mx = lane_max_total(slot, lane, mx);
    var part = 0u;
    for (var j = lane; j < n; j += LANES) {
        let ev = x_exp(x_sub(ld(row + j), mx));
        st(d + j, ev);
        part = x_add(part, ev);
    }
    let sum = lane_total(slot, lane, part);
    if !live {
        return;
    }
    let inv_rows = x_div(F_ONE, x_from_u32(rows));
    if lane == 0u {
        scratch[r] = x_sub(x_add(x_ln(sum), mx), ld(row + goal));
    }
    for (var j = lane; j < n; j += LANES) {
        var v = x_mul(x_div(ld(d + j), sum), inv_rows);
        if j == goal {
            v = x_sub(v, inv_rows);
        }
        st(d + j, v);
    }
}

// The mean of the rows' losses: their lane sum times 1 / rows (one workgroup of 32 lanes).
@compute @workgroup_size(32)
fn cross_entropy_mean(@builtin(local_invocation_index) lane: u32) {
    opaque_zero = pw(P_ZERO);
    let rows = pw(CROSS_ENTROPY_ROWS);
    var part = 0u;
    for (var r = lane; r < rows; r += LANES) {
        part = x_add(part, scratch[r]);
    }
    let total = lane_total(0u, lane, part);
    if lane == 0u {
        st(pw(CROSS_ENTROPY_LOSS), x_mul(total, x_div(F_ONE, x_from_u32(rows))));
    }
}

// ---- columns: a workgroup of 8 columns, 32 lanes each ----

// A column lane's values loaded ahead of its adds (a lane of 4096 rows adds 128 in a chain).
const COL_AHEAD: u32 = 8u;

// Invocation li takes column slot li mod 8 and lane li / 8 (neighbouring invocations read
// neighbouring columns); lane l adds rows l, l + 32, … of its column.
@compute @workgroup_size(256)
fn bias_grad(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let slot = li % SLOTS;
    let lane = li / SLOTS;
    let j = group_index(wid, groups) * SLOTS + slot;
    let width = pw(BIAS_GRAD_WIDTH);
    let live = j < width;
    let rows = select(0u, pw(BIAS_GRAD_ROWS), live);
    let dy = pw(BIAS_GRAD_DY);
    var part = 0u;
    var r = lane;
    // COL_AHEAD of the lane's values loaded at once, then added in order: one memory latency
    // per COL_AHEAD adds instead of one per add.
    for (; r + (COL_AHEAD - 1u) * LANES < rows; r += COL_AHEAD * LANES) {
        var v: array<u32, COL_AHEAD>;
        for (var u = 0u; u < COL_AHEAD; u++) {
            v[u] = ld(dy + (r + u * LANES) * width + j);
        }
        for (var u = 0u; u < COL_AHEAD; u++) {
            part = x_add(part, v[u]);
        }
    }
    for (; r < rows; r += LANES) {
        part = x_add(part, ld(dy + r * width + j));
    }
    let total = lane_total(slot, lane, part);
    if live && lane == 0u {
        st(pw(BIAS_GRAD_DB) + j, total);
    }
}

// LayerNorm's gain and bias gradients (the layer_norm_backward op's record), laid out as
// `bias_grad`.
@compute @workgroup_size(256)
fn layer_norm_param_grads(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let slot = li % SLOTS;
    let lane = li / SLOTS;
    let j = group_index(wid, groups) * SLOTS + slot;
    let width = pw(LAYER_NORM_BACKWARD_WIDTH);
    let live = j < width;
    let rows = select(0u, pw(LAYER_NORM_BACKWARD_ROWS), live);
    let dy = pw(LAYER_NORM_BACKWARD_DY);
    let xhat = pw(LAYER_NORM_BACKWARD_XHAT);
    var g = 0u;
    var b = 0u;
    var r = lane;
    for (; r + (COL_AHEAD - 1u) * LANES < rows; r += COL_AHEAD * LANES) {
        var d: array<u32, COL_AHEAD>;
        var x: array<u32, COL_AHEAD>;
        for (var u = 0u; u < COL_AHEAD; u++) {
            d[u] = ld(dy + (r + u * LANES) * width + j);
            x[u] = ld(xhat + (r + u * LANES) * width + j);
        }
        for (var u = 0u; u < COL_AHEAD; u++) {
            g = x_add(g, x_mul(d[u], x[u]));
            b = x_add(b, d[u]);
        }
    }
    for (; r < rows; r += LANES) {
        let d = ld(dy + r * width + j);
        g = x_add(g, x_mul(d, ld(xhat + r * width + j)));
        b = x_add(b, d);
    }
    let dgain = lane_total(slot, lane, g);
    let dbias = lane_total(slot, lane, b);
    if live && lane == 0u {
        st(pw(LAYER_NORM_BACKWARD_DGAIN) + j, dgain);
        st(pw(LAYER_NORM_BACKWARD_DBIAS) + j, dbias);
    }
}

// ---- the hash ----

fn fnv_word(h: u32, w: u32) -> u32 {
    var x = h;
    for (var b = 0u; b < 4u; b++) {
        x = (x ^ ((w >> (8u * b)) & 0xffu)) * FNV_PRIME;
    }
    return x;
}

// Chunk i's FNV-1a 32 (HASH_CHUNK words, the last may be short) into scratch[i]
// (`lockstep_luts::hash::chunked_words`, its parallel half).
@compute @workgroup_size(256)
fn hash_chunks(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    let len = pw(HASH_LEN);
    if i * HASH_CHUNK >= len {
        return;
    }
    var h = FNV_BASIS;
    let end = min(len, (i + 1u) * HASH_CHUNK);
    for (var at = i * HASH_CHUNK; at < end; at++) {
        h = fnv_word(h, ld(pw(HASH_DATA) + at));
    }
    scratch[i] = h;
}

// FNV-1a 32 over the chunk hashes in order (one invocation).
@compute @workgroup_size(1)
fn hash_fold(@builtin(global_invocation_id) gid: vec3<u32>) {
    let chunks = (pw(HASH_LEN) + HASH_CHUNK - 1u) / HASH_CHUNK;
    var h = FNV_BASIS;
    for (var i = 0u; i < chunks; i++) {
        h = fnv_word(h, scratch[i]);
    }
    st(pw(HASH_OUT), h);
}
