// The training step's ops (ABI 2, `lockstep_luts::ops`) on plugin-owned buffers.
//
// Every buffer of an instance is a range of one arena, `mem` (32-bit words: f32 bits, token
// ids, hashes), so every kernel binds the same storage and finds its operands by the word
// offsets in its parameters. Parameters come as 64 words of a uniform record (one per
// dispatch, at a dynamic offset); word 63 is always 0 and feeds `opaque_zero` (exact_f32.wgsl,
// prepended), word 62 is the op's index in its call, for `status`.
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

@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 16>;
@group(0) @binding(1) var<storage, read_write> mem: array<u32>;
@group(0) @binding(2) var<storage, read_write> q: array<u32>;
@group(0) @binding(3) var<storage, read_write> e: array<i32>;
@group(0) @binding(4) var<storage, read_write> status: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read_write> scratch: array<u32>;

const STATUS_NON_FINITE: u32 = 1u;
const STATUS_TOKEN: u32 = 2u;

fn pw(i: u32) -> u32 {
    return params[i >> 2u][i & 3u];
}

fn fail(kind: u32) {
    atomicMin(&status[0], (pw(62u) << 4u) | kind);
}

// The invocation's index in a dispatch of 256-wide workgroups over a (gx, gy) grid.
fn begin(gid: vec3<u32>, groups: vec3<u32>) -> u32 {
    opaque_zero = pw(63u);
    return gid.y * groups.x * 256u + gid.x;
}

// ---- products: the operand quantizer ----

// p0 rows, p1 k, p2 blocks, p3 batch[1], p4 batches, p5 offset, p6 row stride, p7 col stride,
// p8 batch stride 0, p9 batch stride 1.
@compute @workgroup_size(256)
fn quantize(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    let rows = pw(0u);
    let k = pw(1u);
    let blocks = pw(2u);
    if i >= pw(4u) * rows * blocks {
        return;
    }
    let blk = i % blocks;
    let row = (i / blocks) % rows;
    let z = i / (blocks * rows);
    let base = pw(5u) + (z / pw(3u)) * pw(8u) + (z % pw(3u)) * pw(9u) + row * pw(6u);
    let col_stride = pw(7u);
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

// p0 rows, p1 seq, p2 width, p3 vocab, p4 tokens, p5 tok, p6 pos, p7 out.
@compute @workgroup_size(256)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    let width = pw(2u);
    if i >= pw(0u) * width {
        return;
    }
    let r = i / width;
    let j = i % width;
    let t = mem[pw(4u) + r];
    if t >= pw(3u) {
        fail(STATUS_TOKEN);
        return;
    }
    mem[pw(7u) + i] = x_add(mem[pw(5u) + t * width + j], mem[pw(6u) + (r % pw(1u)) * width + j]);
}

// p0 rows, p1 seq, p2 width, p3 vocab, p4 positions, p5 tokens, p6 dy, p7 dtok, p8 dpos.
// One invocation per output word of dtok (vocab × width) then dpos (positions × width), each
// summing its rows in order from +0.
@compute @workgroup_size(256)
fn embed_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    let rows = pw(0u);
    let seq = pw(1u);
    let width = pw(2u);
    let vocab = pw(3u);
    if i >= (vocab + pw(4u)) * width {
        return;
    }
    let v = i / width;
    let j = i % width;
    var acc = 0u;
    if v < vocab {
        for (var r = 0u; r < rows; r++) {
            let t = mem[pw(5u) + r];
            if t >= vocab && i == 0u {
                fail(STATUS_TOKEN);
            }
            if t == v {
                acc = x_add(acc, mem[pw(6u) + r * width + j]);
            }
        }
        mem[pw(7u) + i] = acc;
    } else {
        let p = v - vocab;
        if p < seq {
            for (var r = p; r < rows; r += seq) {
                acc = x_add(acc, mem[pw(6u) + r * width + j]);
            }
        }
        mem[pw(8u) + p * width + j] = acc;
    }
}

// p0 len, p1 x, p2 y.
@compute @workgroup_size(256)
fn gelu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    if i >= pw(0u) {
        return;
    }
    mem[pw(2u) + i] = x_gelu(mem[pw(1u) + i]);
}

// p0 len, p1 dy, p2 x, p3 dx.
@compute @workgroup_size(256)
fn gelu_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    if i >= pw(0u) {
        return;
    }
    mem[pw(3u) + i] = x_mul(mem[pw(1u) + i], x_gelu_grad(mem[pw(2u) + i]));
}

// p0 len, p1 weights, p2 grad, p3 m, p4 v, p5 lr, p6 correction1, p7 correction2.
@compute @workgroup_size(256)
fn adam(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    if i >= pw(0u) {
        return;
    }
    let beta1 = 0x3f666666u; // 0.9
    let beta2 = 0x3f733333u; // 0.95
    let eps = 0x322bcc77u; // 1e-8
    let g = mem[pw(2u) + i];
    let m = x_add(x_mul(beta1, mem[pw(3u) + i]), x_mul(x_sub(F_ONE, beta1), g));
    let v = x_add(x_mul(beta2, mem[pw(4u) + i]), x_mul(x_sub(F_ONE, beta2), x_mul(g, g)));
    let m_hat = x_div(m, pw(6u));
    let v_hat = x_div(v, pw(7u));
    let step = x_div(x_mul(pw(5u), m_hat), x_add(x_sqrt(v_hat), eps));
    mem[pw(1u) + i] = x_sub(mem[pw(1u) + i], step);
    mem[pw(3u) + i] = m;
    mem[pw(4u) + i] = v;
}

// ---- rows ----

// p0 rows, p1 width, p2 x, p3 gain, p4 bias, p5 y, p6 xhat, p7 rstd.
@compute @workgroup_size(256)
fn layer_norm(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = begin(gid, groups);
    if r >= pw(0u) {
        return;
    }
    let width = pw(1u);
    let c = x_from_u32(width);
    let x = pw(2u) + r * width;
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
    let s = x_div(F_ONE, x_sqrt(x_add(x_div(var_sum, c), 0x3727c5acu)));
    for (var j = 0u; j < width; j++) {
        let h = x_mul(x_sub(mem[x + j], mean), s);
        mem[pw(6u) + r * width + j] = h;
        mem[pw(5u) + r * width + j] = x_add(x_mul(h, mem[pw(3u) + j]), mem[pw(4u) + j]);
    }
    mem[pw(7u) + r] = s;
}

// p0 rows, p1 width, p2 dy, p3 xhat, p4 rstd, p5 gain, p6 dx, p7 accumulate.
@compute @workgroup_size(256)
fn layer_norm_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = begin(gid, groups);
    if r >= pw(0u) {
        return;
    }
    let width = pw(1u);
    let c = x_from_u32(width);
    let dy = pw(2u) + r * width;
    let h = pw(3u) + r * width;
    var m1 = 0u;
    var m2 = 0u;
    for (var j = 0u; j < width; j++) {
        let d = x_mul(mem[dy + j], mem[pw(5u) + j]);
        m1 = x_add(m1, d);
        m2 = x_add(m2, x_mul(d, mem[h + j]));
    }
    m1 = x_div(m1, c);
    m2 = x_div(m2, c);
    let s = mem[pw(4u) + r];
    let dx = pw(6u) + r * width;
    for (var j = 0u; j < width; j++) {
        let d = x_mul(mem[dy + j], mem[pw(5u) + j]);
        let v = x_mul(x_sub(x_sub(d, m1), x_mul(mem[h + j], m2)), s);
        if pw(7u) != 0u {
            mem[dx + j] = x_add(mem[dx + j], v);
        } else {
            mem[dx + j] = v;
        }
    }
}

// p0 blocks, p1 t, p2 scale, p3 scores (in place).
@compute @workgroup_size(256)
fn causal_softmax(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = begin(gid, groups);
    let t = pw(1u);
    if r >= pw(0u) * t {
        return;
    }
    let i = r % t;
    let row = pw(3u) + r * t;
    let scale = pw(2u);
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

// p0 blocks, p1 t, p2 scale, p3 probs, p4 dprobs, p5 dscores.
@compute @workgroup_size(256)
fn causal_softmax_backward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = begin(gid, groups);
    let t = pw(1u);
    if r >= pw(0u) * t {
        return;
    }
    let i = r % t;
    let p = pw(3u) + r * t;
    let dp = pw(4u) + r * t;
    let ds = pw(5u) + r * t;
    let scale = pw(2u);
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

// p0 rows, p1 vocab, p2 logits, p3 targets, p4 dlogits. Each row's loss goes to scratch[row];
// `cross_entropy_mean` then writes the mean.
@compute @workgroup_size(256)
fn cross_entropy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let r = begin(gid, groups);
    let rows = pw(0u);
    if r >= rows {
        return;
    }
    let vocab = pw(1u);
    let goal = mem[pw(3u) + r];
    if goal >= vocab {
        fail(STATUS_TOKEN);
        return;
    }
    let row = pw(2u) + r * vocab;
    let d = pw(4u) + r * vocab;
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

// p0 rows, p5 loss: the mean of the rows' losses, rows in order (one invocation).
@compute @workgroup_size(1)
fn cross_entropy_mean(@builtin(global_invocation_id) gid: vec3<u32>) {
    opaque_zero = pw(63u);
    let rows = pw(0u);
    var total = 0u;
    for (var r = 0u; r < rows; r++) {
        total = x_add(total, scratch[r]);
    }
    mem[pw(5u)] = x_mul(total, x_div(F_ONE, x_from_u32(rows)));
}

// ---- columns ----

// p0 rows, p1 width, p2 dy, p3 db.
@compute @workgroup_size(256)
fn bias_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let j = begin(gid, groups);
    let width = pw(1u);
    if j >= width {
        return;
    }
    var acc = 0u;
    for (var r = 0u; r < pw(0u); r++) {
        acc = x_add(acc, mem[pw(2u) + r * width + j]);
    }
    mem[pw(3u) + j] = acc;
}

// p0 rows, p1 width, p2 dy, p3 xhat, p4 dgain, p5 dbias.
@compute @workgroup_size(256)
fn layer_norm_param_grads(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let j = begin(gid, groups);
    let width = pw(1u);
    if j >= width {
        return;
    }
    var g = 0u;
    var b = 0u;
    for (var r = 0u; r < pw(0u); r++) {
        let d = mem[pw(2u) + r * width + j];
        g = x_add(g, x_mul(d, mem[pw(3u) + r * width + j]));
        b = x_add(b, d);
    }
    mem[pw(4u) + j] = g;
    mem[pw(5u) + j] = b;
}

// ---- the hash ----

const FNV_BASIS: u32 = 0x811c9dc5u;
const FNV_PRIME: u32 = 0x01000193u;
const HASH_CHUNK: u32 = 4096u;

fn fnv_word(h: u32, w: u32) -> u32 {
    var x = h;
    for (var b = 0u; b < 4u; b++) {
        x = (x ^ ((w >> (8u * b)) & 0xffu)) * FNV_PRIME;
    }
    return x;
}

// p0 len, p1 data: chunk i's FNV-1a 32 (4096 words, the last may be short) into scratch[i]
// (`lockstep_luts::hash::chunked_words`, its parallel half).
@compute @workgroup_size(256)
fn hash_chunks(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = begin(gid, groups);
    let len = pw(0u);
    if i * HASH_CHUNK >= len {
        return;
    }
    var h = FNV_BASIS;
    let end = min(len, (i + 1u) * HASH_CHUNK);
    for (var at = i * HASH_CHUNK; at < end; at++) {
        h = fnv_word(h, mem[pw(1u) + at]);
    }
    scratch[i] = h;
}

// p0 len, p2 out: FNV-1a 32 over the chunk hashes in order (one invocation).
@compute @workgroup_size(1)
fn hash_fold(@builtin(global_invocation_id) gid: vec3<u32>) {
    let chunks = (pw(0u) + HASH_CHUNK - 1u) / HASH_CHUNK;
    var h = FNV_BASIS;
    for (var i = 0u; i < chunks; i++) {
        h = fnv_word(h, scratch[i]);
    }
    mem[pw(2u)] = h;
}
