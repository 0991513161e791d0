// The ceiling of the cooperative-matrix path (`time_peak` of `tc`): each subgroup repeats
// `tc_peak` PEAK_CALLS times on its own region of workgroup memory. `tc_peak`'s body here is a
// portable stand-in; the `tc` plugin replaces it (`lockstep_gpu`'s `coop` module) with one A and
// one B fragment loaded from the region, 64 multiply-adds into four independent accumulators,
// the accumulators stored back over the region (so the next call's operands differ) and a
// subgroup barrier. Ops per call: 64 · FM · FN · FK multiply-adds.
//
// The prepended constants: FM, FN, FK, SUBGROUP, SUBGROUPS (a workgroup's), PEAK_CALLS
// (`lockstep_shaders::PEAK_CALLS`).

@group(0) @binding(5) var<storage, read_write> peak_out: array<u32>;

// A subgroup's region: room for the four accumulators (FM · FN words each), which also covers
// the A (FM · FK / 4 words) and B (FK · FN / 4 words) fragments at its start.
const REGION: u32 = 4u * FM * FN;
const THREADS: u32 = SUBGROUPS * SUBGROUP;

var<workgroup> peak_tile: array<u32, SUBGROUPS * REGION>;

fn tc_peak(at: u32, lane: u32) {
    for (var w = lane; w < FM * FN; w += SUBGROUP) {
        peak_tile[at + w] = u32(dot4I8Packed(peak_tile[at + w], peak_tile[at + FM * FN + w]));
    }
}

@compute @workgroup_size(THREADS, 1, 1)
fn peak_tc(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) subgroup: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    for (var w = tid; w < SUBGROUPS * REGION; w += THREADS) {
        peak_tile[w] = ((w + wid.x) * 2654435761u) & 0x7f7f7f7fu;
    }
    workgroupBarrier();
    for (var i = 0u; i < PEAK_CALLS; i++) {
        tc_peak(subgroup * REGION, lane);
    }
    workgroupBarrier();
    peak_out[wid.x * THREADS + tid] = peak_tile[tid];
}
