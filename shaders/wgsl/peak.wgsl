// The ceiling of a product path (`time_peak`): each invocation folds PEAK_ITERATIONS rounds of
// eight four-pair int8 dot products (`dot4` of the product snippet prepended: DP4A or table
// lookups) into eight independent accumulators held in registers, so nothing but the product
// and its add is measured. Ops per invocation: PEAK_ITERATIONS · 8 · 4 multiply-adds.

@group(0) @binding(5) var<storage, read_write> peak_out: array<i32>;

// PEAK_ITERATIONS is prepended (`lockstep_shaders::PEAK_ITERATIONS`).

@compute @workgroup_size(256, 1, 1)
fn peak(@builtin(global_invocation_id) gid: vec3<u32>) {
    let s = gid.x * 2654435761u;
    var a0 = bitcast<i32>(s ^ 0x11111111u);
    var a1 = bitcast<i32>(s ^ 0x22222222u);
    var a2 = bitcast<i32>(s ^ 0x33333333u);
    var a3 = bitcast<i32>(s ^ 0x44444444u);
    var a4 = bitcast<i32>(s ^ 0x55555555u);
    var a5 = bitcast<i32>(s ^ 0x66666666u);
    var a6 = bitcast<i32>(s ^ 0x77777777u);
    var a7 = bitcast<i32>(s ^ 0x01020304u);
    // Bytes in [1, 127]: the units' range.
    let b = ((s >> 3u) | 0x01010101u) & 0x7f7f7f7fu;
    for (var i = 0u; i < PEAK_ITERATIONS; i++) {
        a0 = dot4(bitcast<u32>(a0), b) + a0;
        a1 = dot4(bitcast<u32>(a1), b) + a1;
        a2 = dot4(bitcast<u32>(a2), b) + a2;
        a3 = dot4(bitcast<u32>(a3), b) + a3;
        a4 = dot4(bitcast<u32>(a4), b) + a4;
        a5 = dot4(bitcast<u32>(a5), b) + a5;
        a6 = dot4(bitcast<u32>(a6), b) + a6;
        a7 = dot4(bitcast<u32>(a7), b) + a7;
    }
    peak_out[gid.x] = a0 ^ a1 ^ a2 ^ a3 ^ a4 ^ a5 ^ a6 ^ a7;
}
