// The ceiling of the cooperative-matrix path (`time_peak` of `tc`): each subgroup repeats
// `tc_peak` PEAK_CALLS times on its own region of workgroup memory, four accumulators of FM × FN
// words. `tc_peak`'s body here is a portable stand-in; the `tc` plugin replaces it (`lockstep_gpu`'s
// `coop` module) with: the A fragment (FM × FK int8, row-major) loaded from the start of the first
// accumulator's words, the B fragment (FK × FN, column-major) from the start of the second's, the
// four accumulators loaded, PEAK_TC_MULADDS multiply-adds into them in turn, the four stored back
// and a subgroup barrier. Ops per call: PEAK_TC_MULADDS · FM · FN · FK multiply-adds.
//
// Every multiply-add counts in the result, so no compiler may skip one: each call's operands are
// the words the last call stored, the accumulators carry over from call to call, and at the end
// every word of every region is folded into the output. `lockstep_shaders::peak_tc_model`
// computes the same words on the host; `time_peak` compares them before it reports a rate. (The
// first version stored three accumulators nobody read again, and one subgroup's region alone was
// read out: a driver could drop most of the work, and the H100 reported 2,875 int8 TOP/s.)
//
// The prepended constants: FM, FN, FK, SUBGROUP, SUBGROUPS (a workgroup's), PEAK_CALLS
// (`lockstep_shaders::PEAK_CALLS`), PEAK_SEED_MASK (`lockstep_shaders::PEAK_SEED_MASK`: small
// first words, so that no accumulator can overflow in PEAK_CALLS calls).

@group(0) @binding(5) var<storage, read_write> peak_out: array<u32>;

const ACC: u32 = FM * FN;
const REGION: u32 = 4u * ACC;
const THREADS: u32 = SUBGROUPS * SUBGROUP;
const TILE: u32 = SUBGROUPS * REGION;

var<workgroup> peak_tile: array<u32, TILE>;

fn tc_peak(at: u32, lane: u32) {
    for (var w = lane; w < REGION; w += SUBGROUP) {
        peak_tile[at + w] = u32(dot4I8Packed(peak_tile[at + w], peak_tile[at + (w + ACC) % REGION]));
    }
}

@compute @workgroup_size(THREADS, 1, 1)
fn peak_tc(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) subgroup: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    for (var w = tid; w < TILE; w += THREADS) {
        peak_tile[w] = ((w + wid.x) * 2654435761u) & PEAK_SEED_MASK;
    }
    workgroupBarrier();
    for (var i = 0u; i < PEAK_CALLS; i++) {
        tc_peak(subgroup * REGION, lane);
    }
    workgroupBarrier();
    var folded = 0u;
    for (var w = tid; w < TILE; w += THREADS) {
        folded ^= peak_tile[w];
    }
    peak_out[wid.x * THREADS + tid] = folded;
}
