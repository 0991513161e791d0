// The raw integer unit over the full i8 range: C[i][j] = Σ_k A[i][k] · B[j][k] in i32
// (wrapping), as `lockstep_luts::gemm_i8_nt`. Operands are packed four int8 per word, rows
// zero-padded to `words` words. One invocation per output; this entry serves the gate and
// exactness checks, not the training hot path, so it is not tiled.

struct Params {
    m: u32,
    n: u32,
    words: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qa: array<u32>;
@group(0) @binding(2) var<storage, read> qb: array<u32>;
@group(0) @binding(5) var<storage, read_write> c: array<i32>;

@compute @workgroup_size(8, 8, 1)
fn gemm_i8(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.y;
    let col = gid.x;
    if row >= params.m || col >= params.n {
        return;
    }
    var acc = 0;
    for (var w = 0u; w < params.words; w++) {
        acc = acc + dot4(qa[row * params.words + w], qb[col * params.words + w]);
    }
    c[row * params.n + col] = acc;
}
