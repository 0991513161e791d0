//! The text other languages read the op table through: the C header's op constants
//! (`worker-api/include/lockstep_worker.h`, between its generated markers) and the WGSL prelude
//! of parameter slots and shared constants (`shaders/wgsl/generated_ops.wgsl`). Tests in
//! `lockstep-worker-api` and `lockstep-shaders` compare the committed files with what these
//! functions write and, when they differ, rewrite the file and fail: run the tests again, and
//! commit the result. (This module only makes text; the tests do the file I/O.)

use super::define::{FieldKind, OpSpec, FLAGS};
use super::{ADAM_BETA1, ADAM_BETA2, ADAM_EPS, LANES, LN_EPS, OPS};

/// Where the generated part of the C header begins and ends.
pub const C_BEGIN: &str = "/* ---- generated from the op table (luts/src/ops/table.rs): do not edit by hand ---- */";
pub const C_END: &str = "/* ---- end of the generated op constants ---- */";

fn upper(name: &str) -> String {
    name.to_ascii_uppercase()
}

fn ops_with_flag(bit: u32) -> String {
    let names: Vec<&str> = OPS.iter().filter(|o| o.flags & bit != 0).map(|o| o.name).collect();
    names.join(", ")
}

fn summary(op: &OpSpec) -> String {
    let buffers: Vec<&str> = op.buffer_slots().into_iter().map(|(name, _)| name).collect();
    let params: Vec<String> = op.param_slots().into_iter().map(|(name, _)| name).collect();
    let flags: Vec<&str> = op
        .fields
        .iter()
        .filter_map(|f| match f.kind {
            FieldKind::Flag { .. } | FieldKind::Buffer { flag: Some(_), .. } => Some(f.name),
            _ => None,
        })
        .collect();
    let mut s = format!("buffers {}; params {}", buffers.join(", "), params.join(", "));
    if !flags.is_empty() {
        s += &format!("; flags {}", flags.join(", "));
    }
    s
}

/// The generated part of the C header, markers included.
pub fn c_header() -> String {
    let mut out = vec![C_BEGIN.to_string()];
    out.push("/* Op codes (LockstepOpCall.code); bit (1 << code) in LockstepWorkerVTable.ops. */".into());
    for op in OPS {
        out.push(format!("#define LOCKSTEP_OP_{} {}", upper(op.name), op.code));
    }
    out.push(format!("#define LOCKSTEP_OP_COUNT {}", OPS.len()));
    out.push("#define LOCKSTEP_OPS_ALL ((1ull << LOCKSTEP_OP_COUNT) - 1)".into());
    out.push("/* Lanes of every float sum an op makes (docs/VERIFICATION.md §9, \"Lane sums\"). */".into());
    out.push(format!("#define LOCKSTEP_OP_LANES {LANES}"));
    out.push(String::new());
    out.push("/* LockstepOpCall.flags. */".into());
    for (name, bit) in FLAGS {
        out.push(format!("#define LOCKSTEP_OP_FLAG_{} {bit}u /* {} */", upper(name), ops_with_flag(bit)));
    }
    out.push(String::new());
    out.push("/*".into());
    out.push(" * Each op's record (docs/VERIFICATION.md §9 defines what it computes): its fields in order; a".into());
    out.push(" * scalar takes its words of `params` (f32 values by their bits), a buffer the next slot of".into());
    out.push(" * `buffers` and its words of `params` (the offset in words, then a view's row, column and two".into());
    out.push(" * batch strides), a flag a bit of `flags`; an optional buffer is absent (handle and offset 0)".into());
    out.push(" * without its flag. LOCKSTEP_P_<OP>_<PARAM> is a word's index in `params`,".into());
    out.push(" * LOCKSTEP_B_<OP>_<BUFFER> a buffer's index in `buffers`.".into());
    out.push(" */".into());
    for op in OPS {
        out.push(format!("/* {}: {} */", op.name, summary(op)));
        for (name, at) in op.param_slots() {
            out.push(format!("#define LOCKSTEP_P_{}_{} {at}", upper(op.name), upper(&name)));
        }
        for (i, (name, _)) in op.buffer_slots().into_iter().enumerate() {
            out.push(format!("#define LOCKSTEP_B_{}_{} {i}", upper(op.name), upper(name)));
        }
    }
    out.push(C_END.to_string());
    out.join("\n") + "\n"
}

/// The WGSL prelude: each op's parameter slots in a step kernel's record (the op's ABI params,
/// every buffer offset turned into the word address of the arena it lives in), the flags, and
/// the constants the definitions use, as binary32 bits.
pub fn wgsl_prelude() -> String {
    let mut out = vec![
        "// Generated from the op table (luts/src/ops/table.rs) by lockstep_luts::ops::generate: do not".to_string(),
        "// edit by hand (the test `the_generated_prelude_is_current` rewrites it). A step kernel reads".into(),
        "// its op's parameters by these names: the op's ABI params, each buffer offset turned into a".into(),
        "// word address of the arena.".into(),
    ];
    for op in OPS {
        out.push(String::new());
        out.push(format!("// {} (code {}): {}", op.name, op.code, summary(op)));
        for (name, at) in op.param_slots() {
            out.push(format!("const {}_{}: u32 = {at}u;", upper(op.name), upper(&name)));
        }
    }
    out.push(String::new());
    out.push("// Flags (the record's flag word).".into());
    for (name, bit) in FLAGS {
        out.push(format!("const FLAG_{}: u32 = {bit}u;", upper(name)));
    }
    out.push(String::new());
    out.push("// The definitions' constants (lockstep_luts::ops, lockstep_luts::hash), as bits.".into());
    for (name, value) in
        [("LN_EPS", LN_EPS), ("ADAM_BETA1", ADAM_BETA1), ("ADAM_BETA2", ADAM_BETA2), ("ADAM_EPS", ADAM_EPS)]
    {
        out.push(format!("const {name}: u32 = {:#010x}u;", value.to_bits()));
    }
    out.push(format!("const LANES: u32 = {LANES}u;"));
    out.push(format!("const HASH_CHUNK: u32 = {}u;", crate::hash::HASH_CHUNK_WORDS));
    out.push(format!("const FNV_BASIS: u32 = {:#010x}u;", crate::hash::OFFSET_BASIS));
    out.push(format!("const FNV_PRIME: u32 = {:#010x}u;", crate::hash::PRIME));
    out.join("\n") + "\n"
}
