// The training step's ops (ABI 2, `lockstep_luts::ops`) on plugin-owned buffers.
//
// Every buffer of an instance is a range of one arena, `mem` (32-bit words: f32 bits, token
// ids, hashes), so every kernel binds the same storage and finds its operands by word
// addresses in its parameters. Parameters come as 64 words of a uniform record (one per
// dispatch, at a dynamic offset, `params` and `pw` prepended): words 0 … 23 are the op's ABI
// params with every buffer offset turned into its arena address, read by the names the op
// table generates (generated_ops.wgsl, prepended: `pw(LAYER_NORM_WIDTH)`); P_FLAGS holds the
// op's flags, P_PART which operand a product's quantizer takes, P_OP_INDEX the op's index in its
// call (for `status`), and P_ZERO is always 0 and feeds `opaque_zero` (exact_f32.wgsl).
//
// Each kernel computes an output with the reference's operations in the reference's order,
// through exact_f32.wgsl: one invocation per element for element-wise ops, per row for row
// ops (LayerNorm, softmax, cross-entropy: their sums run along the row in index order), per
// column for column sums (bias and LayerNorm parameter gradients: rows in order from +0). The
// dispatch is 256 invocations wide and, past 65535 workgroups, two-dimensional; invocations past
// the end return at once.
//
// `quantize` prepares a product's operand for `gemm_units` (prepended file's unit kernel): for
// one (batch, row, block) of a strided view it finds the block exponent and packs the 32 quants
// exactly as `lockstep_luts::units::quantize_rows` does, into `q` (8 words per block) and `e`.
//
// A kernel that meets a non-finite operand or a token id past the vocabulary records
// `(op << 4) | kind` with atomicMin in `status[0]`, so the host learns the first op that failed.

@group(0) @binding(1) var<storage, read_write> mem: array<u32>;
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

// ---- products: the operand quantizer ----

// The matmul's parameter `a` names for its A operand (P_PART 0), `b` for its B operand.
fn operand(a: u32, b: u32) -> u32 {
    return pw(select(a, b, pw(P_PART) == 1u));
}

// One (batch, row, block) of the matmul's A (P_PART 0) or B (P_PART 1) view.
@compute @workgroup_size(256)
fn quantize(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    let rows = operand(MATMUL_M, MATMUL_N);
    let k = pw(MATMUL_K);
    let blocks = (k + 31u) / 32u;
    let batch1 = pw(MATMUL_BATCH1);
    if i >= pw(MATMUL_BATCH0) * batch1 * rows * blocks {
        return;
    }
    let blk = i % blocks;
    let row = (i / blocks) % rows;
    let z = i / (blocks * rows);
    let base = operand(MATMUL_A_OFFSET, MATMUL_B_OFFSET)
        + (z / batch1) * operand(MATMUL_A_BATCH_STRIDE0, MATMUL_B_BATCH_STRIDE0)
        + (z % batch1) * operand(MATMUL_A_BATCH_STRIDE1, MATMUL_B_BATCH_STRIDE1)
        + row * operand(MATMUL_A_ROW_STRIDE, MATMUL_B_ROW_STRIDE);
    let col_stride = operand(MATMUL_A_COL_STRIDE, MATMUL_B_COL_STRIDE);
    let start = blk * 32u;
    let end = min(start + 32u, k);
    var amax = 0u;
    var finite = true;
    for (var l = start; l < end; l++) {
        let bits = mem[base + l * col_stride];
        finite = finite && (bits & EXPM) != EXPM;
        amax = max(amax, bits & 0x7fffffffu);
    }
    if !finite {
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
    e[i] = ex;
    // lockstep_luts::units::quantize_value, four quants to a word (little-endian bytes).
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var b = 0u; b < 4u; b++) {
            let l = start + w * 4u + b;
            var quant = 0;
            if l < end {
                let bits = mem[base + l * col_stride];
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
            }
            word = word | ((u32(quant) & 0xffu) << (8u * b));
        }
        q[i * 8u + w] = word;
    }
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
    let t = mem[pw(EMBED_TOKENS) + r];
    if t >= pw(EMBED_VOCAB) {
        fail(STATUS_TOKEN);
        return;
    }
    let pos = (r % pw(EMBED_SEQ)) * width + j;
    mem[pw(EMBED_OUT) + i] = x_add(mem[pw(EMBED_TOK) + t * width + j], mem[pw(EMBED_POS) + pos]);
}

// One invocation per output word of dtok (vocab × width) then dpos (positions × width), each
// summing its rows in order from +0.
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
        for (var r = 0u; r < rows; r++) {
            let t = mem[pw(EMBED_BACKWARD_TOKENS) + r];
            if t >= vocab && i == 0u {
                fail(STATUS_TOKEN);
            }
            if t == v {
                acc = x_add(acc, mem[dy + r * width + j]);
            }
        }
        mem[pw(EMBED_BACKWARD_DTOK) + i] = acc;
    } else {
        let p = v - vocab;
        if p < seq {
            for (var r = p; r < rows; r += seq) {
                acc = x_add(acc, mem[dy + r * width + j]);
            }
        }
        mem[pw(EMBED_BACKWARD_DPOS) + p * width + j] = acc;
    }
}

@compute @workgroup_size(256)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    if i >= pw(GELU_LEN) {
        return;
    }
    mem[pw(GELU_Y) + i] = x_gelu(mem[pw(GELU_X) + i]);
}

@compute @workgroup_size(256)
fn gelu_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    if i >= pw(GELU_BACKWARD_LEN) {
        return;
    }
    let x = mem[pw(GELU_BACKWARD_X) + i];
    mem[pw(GELU_BACKWARD_DX) + i] = x_mul(mem[pw(GELU_BACKWARD_DY) + i], x_gelu_grad(x));
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
    let g = mem[pw(ADAM_GRAD) + i];
    let m = x_add(x_mul(ADAM_BETA1, mem[at_m]), x_mul(x_sub(F_ONE, ADAM_BETA1), g));
    let v = x_add(x_mul(ADAM_BETA2, mem[at_v]), x_mul(x_sub(F_ONE, ADAM_BETA2), x_mul(g, g)));
    let m_hat = x_div(m, pw(ADAM_CORRECTION1));
    let v_hat = x_div(v, pw(ADAM_CORRECTION2));
    let step = x_div(x_mul(pw(ADAM_LR), m_hat), x_add(x_sqrt(v_hat), ADAM_EPS));
    mem[w] = x_sub(mem[w], step);
    mem[at_m] = m;
    mem[at_v] = v;
}

// ---- rows ----

@compute @workgroup_size(256)
fn layer_norm(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = begin(gid, groups);
    if r >= pw(LAYER_NORM_ROWS) {
        return;
    }
    let width = pw(LAYER_NORM_WIDTH);
    let c = x_from_u32(width);
    let x = pw(LAYER_NORM_X) + r * width;
    var sum = 0u;
    for (var j = 0u; j < width; j++) {
        sum = x_add(sum, mem[x + j]);
    }
    let mean = x_div(sum, c);
    var var_sum = 0u;
    for (var j = 0u; j < width; j++) {
        let d = x_sub(mem[x + j], mean);
        var_sum = x_add(var_sum, x_mul(d, d));
    }
    let s = x_div(F_ONE, x_sqrt(x_add(x_div(var_sum, c), LN_EPS)));
    let y = pw(LAYER_NORM_Y) + r * width;
    let xhat = pw(LAYER_NORM_XHAT) + r * width;
    for (var j = 0u; j < width; j++) {
        let h = x_mul(x_sub(mem[x + j], mean), s);
        mem[xhat + j] = h;
        mem[y + j] = x_add(x_mul(h, mem[pw(LAYER_NORM_GAIN) + j]), mem[pw(LAYER_NORM_BIAS) + j]);
    }
    mem[pw(LAYER_NORM_RSTD) + r] = s;
}

// The input gradient, one invocation per row (`layer_norm_param_grads` then takes the columns).
@compute @workgroup_size(256)
fn layer_norm_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = begin(gid, groups);
    if r >= pw(LAYER_NORM_BACKWARD_ROWS) {
        return;
    }
    let width = pw(LAYER_NORM_BACKWARD_WIDTH);
    let c = x_from_u32(width);
    let dy = pw(LAYER_NORM_BACKWARD_DY) + r * width;
    let h = pw(LAYER_NORM_BACKWARD_XHAT) + r * width;
    let gain = pw(LAYER_NORM_BACKWARD_GAIN);
    var m1 = 0u;
    var m2 = 0u;
    for (var j = 0u; j < width; j++) {
        let d = x_mul(mem[dy + j], mem[gain + j]);
        m1 = x_add(m1, d);
        m2 = x_add(m2, x_mul(d, mem[h + j]));
    }
    m1 = x_div(m1, c);
    m2 = x_div(m2, c);
    let s = mem[pw(LAYER_NORM_BACKWARD_RSTD) + r];
    let dx = pw(LAYER_NORM_BACKWARD_DX) + r * width;
    let accumulate = (pw(P_FLAGS) & FLAG_ACCUMULATE) != 0u;
    for (var j = 0u; j < width; j++) {
        let d = x_mul(mem[dy + j], mem[gain + j]);
        let v = x_mul(x_sub(x_sub(d, m1), x_mul(mem[h + j], m2)), s);
        if accumulate {
            mem[dx + j] = x_add(mem[dx + j], v);
        } else {
            mem[dx + j] = v;
        }
    }
}

// In place.
@compute @workgroup_size(256)
fn causal_softmax(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = begin(gid, groups);
    let t = pw(CAUSAL_SOFTMAX_T);
    if r >= pw(CAUSAL_SOFTMAX_BLOCKS) * t {
        return;
    }
    let i = r % t;
    let row = pw(CAUSAL_SOFTMAX_SCORES) + r * t;
    let scale = pw(CAUSAL_SOFTMAX_SCALE);
    var mx = NEG_INF;
    for (var j = 0u; j <= i; j++) {
        let v = x_mul(mem[row + j], scale);
        mem[row + j] = v;
        mx = x_max(mx, v);
    }
    var sum = 0u;
    for (var j = 0u; j <= i; j++) {
        let ev = x_exp(x_sub(mem[row + j], mx));
        mem[row + j] = ev;
        sum = x_add(sum, ev);
    }
    for (var j = 0u; j <= i; j++) {
        mem[row + j] = x_div(mem[row + j], sum);
    }
    for (var j = i + 1u; j < t; j++) {
        mem[row + j] = 0u;
    }
}

@compute @workgroup_size(256)
fn causal_softmax_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = begin(gid, groups);
    let t = pw(CAUSAL_SOFTMAX_BACKWARD_T);
    if r >= pw(CAUSAL_SOFTMAX_BACKWARD_BLOCKS) * t {
        return;
    }
    let i = r % t;
    let p = pw(CAUSAL_SOFTMAX_BACKWARD_PROBS) + r * t;
    let dp = pw(CAUSAL_SOFTMAX_BACKWARD_DPROBS) + r * t;
    let ds = pw(CAUSAL_SOFTMAX_BACKWARD_DSCORES) + r * t;
    let scale = pw(CAUSAL_SOFTMAX_BACKWARD_SCALE);
    var dot = 0u;
    for (var j = 0u; j <= i; j++) {
        dot = x_add(dot, x_mul(mem[p + j], mem[dp + j]));
    }
    for (var j = 0u; j <= i; j++) {
        mem[ds + j] = x_mul(x_mul(mem[p + j], x_sub(mem[dp + j], dot)), scale);
    }
    for (var j = i + 1u; j < t; j++) {
        mem[ds + j] = 0u;
    }
}

// Each row's loss goes to scratch[row]; `cross_entropy_mean` then writes the mean.
@compute @workgroup_size(256)
fn cross_entropy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = begin(gid, groups);
    let rows = pw(CROSS_ENTROPY_ROWS);
    if r >= rows {
        return;
    }
    let vocab = pw(CROSS_ENTROPY_VOCAB);
    let goal = mem[pw(CROSS_ENTROPY_TARGETS) + r];
    if goal >= vocab {
        fail(STATUS_TOKEN);
        return;
    }
    let row = pw(CROSS_ENTROPY_LOGITS) + r * vocab;
    let d = pw(CROSS_ENTROPY_DLOGITS) + r * vocab;
    let inv_rows = x_div(F_ONE, x_from_u32(rows));
    var mx = NEG_INF;
    for (var j = 0u; j < vocab; j++) {
        mx = x_max(mx, mem[row + j]);
    }
    var sum = 0u;
    for (var j = 0u; j < vocab; j++) {
        let ev = x_exp(x_sub(mem[row + j], mx));
        mem[d + j] = ev;
        sum = x_add(sum, ev);
    }
    scratch[r] = x_sub(x_add(x_ln(sum), mx), mem[row + goal]);
    for (var j = 0u; j < vocab; j++) {
        mem[d + j] = x_mul(x_div(mem[d + j], sum), inv_rows);
    }
    mem[d + goal] = x_sub(mem[d + goal], inv_rows);
}

// The mean of the rows' losses, rows in order (one invocation).
@compute @workgroup_size(1)
fn cross_entropy_mean(@builtin(global_invocation_id) gid: vec3<u32>) {
    opaque_zero = pw(P_ZERO);
    let rows = pw(CROSS_ENTROPY_ROWS);
    var total = 0u;
    for (var r = 0u; r < rows; r++) {
        total = x_add(total, scratch[r]);
    }
    mem[pw(CROSS_ENTROPY_LOSS)] = x_mul(total, x_div(F_ONE, x_from_u32(rows)));
}

// ---- columns ----

@compute @workgroup_size(256)
fn bias_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let j = begin(gid, groups);
    let width = pw(BIAS_GRAD_WIDTH);
    if j >= width {
        return;
    }
    let dy = pw(BIAS_GRAD_DY);
    var acc = 0u;
    for (var r = 0u; r < pw(BIAS_GRAD_ROWS); r++) {
        acc = x_add(acc, mem[dy + r * width + j]);
    }
    mem[pw(BIAS_GRAD_DB) + j] = acc;
}

// LayerNorm's gain and bias gradients, one invocation per column (the layer_norm_backward op's
// record).
@compute @workgroup_size(256)
fn layer_norm_param_grads(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let j = begin(gid, groups);
    let width = pw(LAYER_NORM_BACKWARD_WIDTH);
    if j >= width {
        return;
    }
    let dy = pw(LAYER_NORM_BACKWARD_DY);
    let xhat = pw(LAYER_NORM_BACKWARD_XHAT);
    var g = 0u;
    var b = 0u;
    for (var r = 0u; r < pw(LAYER_NORM_BACKWARD_ROWS); r++) {
        let d = mem[dy + r * width + j];
        g = x_add(g, x_mul(d, mem[xhat + r * width + j]));
        b = x_add(b, d);
    }
    mem[pw(LAYER_NORM_BACKWARD_DGAIN) + j] = g;
    mem[pw(LAYER_NORM_BACKWARD_DBIAS) + j] = b;
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
        h = fnv_word(h, mem[pw(HASH_DATA) + at]);
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
    mem[pw(HASH_OUT)] = h;
}
