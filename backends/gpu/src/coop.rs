//! The `tc` plugin's unit kernel: `gemm_tc.wgsl` through naga to SPIR-V, then the body of its
//! `tc_block_sums` replaced by cooperative-matrix instructions (`SPV_KHR_cooperative_matrix`).
//!
//! WGSL has no integer cooperative matrices (wgpu 30 lists only f16 and f32 configurations, and
//! naga's WGSL has no i8 matrix type), so the module is written in WGSL with a portable body for
//! the one step the tensor cores take (each lane forms every `SUBGROUP`-th block sum through
//! `dot4I8Packed`), compiled by naga as wgpu would, and that one function is rewritten here:
//! for each of the `32 / FK` slices of a block, `FR` A fragments (`FM × FK` int8, row-major in
//! `qa`) and `FC` B fragments (`FK × FN`, column-major in `qb`, since B's rows are the product's
//! columns) are loaded straight from the operand buffers — the pointer type (u32) may differ
//! from the component type (i8), the stride then counts words — multiplied into `FR × FC`
//! signed i32 accumulators, which are stored into the workgroup's `sums`. Integer products and
//! sums are exact, so the result is the portable body's, bit for bit; everything else in the
//! module (the epilogue, the flush, the store through the arena) is naga's, unchanged.
//!
//! The rewrite is done on the words (a SPIR-V module is a header and a flat list of
//! instructions): capabilities and the extension are added, new types and constants are
//! appended to the type section, and the function's blocks are replaced. Nothing else moves, so
//! ids naga assigned keep their meaning.

use std::collections::HashMap;

use lockstep_shaders::{CoopTile, Kernel, Product};
use spirv::Op;

/// Why a cooperative module could not be built (a bug of this crate, never of the input).
#[derive(Debug)]
pub struct CoopError(pub String);

impl std::fmt::Display for CoopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the cooperative-matrix kernel cannot be built: {}", self.0)
    }
}

impl std::error::Error for CoopError {}

/// SPIR-V of the `tc` unit kernel for `coop`, its overrides set (`SOFT_FLOAT`, `PAGES`), with
/// cooperative-matrix block sums (`cooperative`) or naga's portable ones (tests compare both).
pub fn spirv(coop: CoopTile, soft_float: bool, pages: u32, cooperative: bool) -> Result<Vec<u32>, CoopError> {
    let tile = coop.epilogue().ok_or_else(|| CoopError(format!("{coop:?} has no epilogue tile")))?;
    let source = lockstep_shaders::source(Kernel::GemmTc(coop), Product::Dp4a, tile);
    let module = naga::front::wgsl::parse_str(&source).map_err(|e| CoopError(e.emit_to_string(&source)))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .map_err(|e| CoopError(e.emit_to_string(&source)))?;
    let mut constants = naga::back::PipelineConstants::default();
    constants.insert("SOFT_FLOAT".into(), if soft_float { 1.0 } else { 0.0 });
    constants.insert("PAGES".into(), f64::from(pages));
    let (module, info) = naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants)
        .map_err(|e| CoopError(format!("{e:?}")))?;
    let options = naga::back::spv::Options {
        // Cooperative matrices need SPIR-V 1.3 or later; 1.6 is Vulkan 1.3's.
        lang_version: (1, 6),
        flags: naga::back::spv::WriterFlags::DEBUG,
        // `sums` is written before it is read, every block.
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        // As wgpu compiles the other unit kernels (`create_shader_module_trusted`): every
        // index is in range by construction (gemm_tc.wgsl says how), and loops are bounded.
        force_loop_bounding: false,
        ..naga::back::spv::Options::default()
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, None).map_err(|e| CoopError(format!("{e}")))?;
    if cooperative {
        splice(&words, coop)
    } else {
        Ok(words)
    }
}

/// One instruction: opcode and operand words.
#[derive(Clone, Debug)]
struct Inst {
    op: u32,
    words: Vec<u32>,
}

fn parse(words: &[u32]) -> Result<(Vec<u32>, Vec<Inst>), CoopError> {
    if words.len() < 5 || words[0] != spirv::MAGIC_NUMBER {
        return Err(CoopError("not a SPIR-V module".into()));
    }
    let mut out = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        if count == 0 || at + count > words.len() {
            return Err(CoopError(format!("a malformed instruction at word {at}")));
        }
        out.push(Inst { op: words[at] & 0xffff, words: words[at + 1..at + count].to_vec() });
        at += count;
    }
    Ok((words[..5].to_vec(), out))
}

fn assemble(mut header: Vec<u32>, code: &[Inst]) -> Vec<u32> {
    for inst in code {
        header.push(((inst.words.len() as u32 + 1) << 16) | inst.op);
        header.extend_from_slice(&inst.words);
    }
    header
}

/// A literal string as SPIR-V words (nul-terminated, zero-padded).
fn string_words(s: &str) -> Vec<u32> {
    let mut bytes = s.as_bytes().to_vec();
    bytes.push(0);
    bytes.resize(bytes.len().next_multiple_of(4), 0);
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn inst(op: Op, words: Vec<u32>) -> Inst {
    Inst { op: op as u32, words }
}

/// Appends instructions that define new ids.
struct Ids<'a> {
    bound: &'a mut u32,
}

impl Ids<'_> {
    fn next(&mut self) -> u32 {
        let id = *self.bound;
        *self.bound += 1;
        id
    }
}

/// Replaces the body of `tc_block_sums` in naga's `words` with cooperative-matrix code for `coop`.
fn splice(words: &[u32], coop: CoopTile) -> Result<Vec<u32>, CoopError> {
    let (mut header, code) = parse(words)?;
    let missing = |what: &str| CoopError(format!("naga's module has no {what}"));
    let names: HashMap<Vec<u32>, u32> =
        code.iter().filter(|i| i.op == Op::Name as u32).map(|i| (i.words[1..].to_vec(), i.words[0])).collect();
    let named = |name: &str| names.get(&string_words(name)).copied().ok_or_else(|| missing(name));
    let (function, qa, qb, sums) = (named("tc_block_sums")?, named("qa")?, named("qb")?, named("sums")?);
    let int_type = |width: u32, signed: u32| {
        code.iter().find(|i| i.op == Op::TypeInt as u32 && i.words[1..] == [width, signed]).map(|i| i.words[0])
    };
    let u32_type = int_type(32, 0).ok_or_else(|| missing("u32 type"))?;
    let i32_type = int_type(32, 1).ok_or_else(|| missing("i32 type"))?;
    if int_type(8, 1).is_some() {
        return Err(CoopError("naga's module already declares an i8 type".into()));
    }

    let mut bound = header[3];
    let mut ids = Ids { bound: &mut bound };
    let mut types = Vec::new();
    let mut constants: HashMap<(u32, u32), u32> = HashMap::new();
    let mut constant = |ids: &mut Ids, types: &mut Vec<Inst>, ty: u32, value: u32| {
        *constants.entry((ty, value)).or_insert_with(|| {
            let id = ids.next();
            types.push(inst(Op::Constant, vec![ty, id, value]));
            id
        })
    };
    let i8_type = ids.next();
    types.push(inst(Op::TypeInt, vec![i8_type, 8, 1]));
    let scope = constant(&mut ids, &mut types, u32_type, spirv::Scope::Subgroup as u32);
    let mut matrix = |ids: &mut Ids, types: &mut Vec<Inst>, component: u32, rows: u32, cols: u32, usage: u32| {
        let (rows, cols, usage) = (
            constant(ids, types, u32_type, rows),
            constant(ids, types, u32_type, cols),
            constant(ids, types, u32_type, usage),
        );
        let id = ids.next();
        types.push(inst(Op::TypeCooperativeMatrixKHR, vec![id, component, scope, rows, cols, usage]));
        id
    };
    use spirv::CooperativeMatrixUse as Use;
    let a_type = matrix(&mut ids, &mut types, i8_type, coop.fm, coop.fk, Use::MatrixAKHR as u32);
    let b_type = matrix(&mut ids, &mut types, i8_type, coop.fk, coop.fn_, Use::MatrixBKHR as u32);
    let acc_type = matrix(&mut ids, &mut types, i32_type, coop.fm, coop.fn_, Use::MatrixAccumulatorKHR as u32);
    let zero_i32 = ids.next();
    types.push(inst(Op::Constant, vec![i32_type, zero_i32, 0]));
    let zero_acc = ids.next();
    types.push(inst(Op::ConstantComposite, vec![acc_type, zero_acc, zero_i32]));
    let storage_u32 = ids.next();
    types.push(inst(Op::TypePointer, vec![storage_u32, spirv::StorageClass::StorageBuffer as u32, u32_type]));
    let workgroup_i32 = ids.next();
    types.push(inst(Op::TypePointer, vec![workgroup_i32, spirv::StorageClass::Workgroup as u32, i32_type]));
    let row_major = constant(&mut ids, &mut types, u32_type, spirv::CooperativeMatrixLayout::RowMajorKHR as u32);
    let col_major = constant(&mut ids, &mut types, u32_type, spirv::CooperativeMatrixLayout::ColumnMajorKHR as u32);
    let zero = constant(&mut ids, &mut types, u32_type, 0);
    let tile_cols = coop.cols();
    let sums_stride = constant(&mut ids, &mut types, u32_type, tile_cols);

    // The function's parameters, in order: a_word, b_word, row_words, sums_at, lane.
    let start = code
        .iter()
        .position(|i| i.op == Op::Function as u32 && i.words[1] == function)
        .ok_or_else(|| missing("tc_block_sums function"))?;
    let params: Vec<u32> =
        code[start + 1..].iter().take_while(|i| i.op == Op::FunctionParameter as u32).map(|i| i.words[1]).collect();
    let [a_word, b_word, row_words, sums_at, _lane] = params[..] else {
        return Err(CoopError(format!("tc_block_sums has {} parameters, not 5", params.len())));
    };
    let body_start = start + 1 + params.len();
    let end = body_start
        + code[body_start..]
            .iter()
            .position(|i| i.op == Op::FunctionEnd as u32)
            .ok_or_else(|| missing("function end"))?;

    let mut body = vec![inst(Op::Label, vec![ids.next()])];
    // word = base + rows · row_words + offset
    let mut address =
        |ids: &mut Ids, types: &mut Vec<Inst>, body: &mut Vec<Inst>, base: u32, rows: u32, offset: u32| {
            let (rows, offset) = (constant(ids, types, u32_type, rows), constant(ids, types, u32_type, offset));
            let (scaled, shifted, word) = (ids.next(), ids.next(), ids.next());
            body.push(inst(Op::IMul, vec![u32_type, scaled, rows, row_words]));
            body.push(inst(Op::IAdd, vec![u32_type, shifted, base, scaled]));
            body.push(inst(Op::IAdd, vec![u32_type, word, shifted, offset]));
            word
        };
    let signed = (spirv::CooperativeMatrixOperands::MATRIX_A_SIGNED_COMPONENTS_KHR
        | spirv::CooperativeMatrixOperands::MATRIX_B_SIGNED_COMPONENTS_KHR
        | spirv::CooperativeMatrixOperands::MATRIX_C_SIGNED_COMPONENTS_KHR
        | spirv::CooperativeMatrixOperands::MATRIX_RESULT_SIGNED_COMPONENTS_KHR)
        .bits();
    let mut acc = vec![zero_acc; (coop.fr * coop.fc) as usize];
    for slice in 0..32 / coop.fk {
        // Four int8 a word: the slice starts fk / 4 words into the block.
        let offset = slice * coop.fk / 4;
        let mut load = |ids: &mut Ids, types: &mut Vec<Inst>, body: &mut Vec<Inst>, var, base, rows, ty, layout| {
            let word = address(ids, types, body, base, rows, offset);
            let (pointer, value) = (ids.next(), ids.next());
            body.push(inst(Op::AccessChain, vec![storage_u32, pointer, var, zero, word]));
            body.push(inst(Op::CooperativeMatrixLoadKHR, vec![ty, value, pointer, layout, row_words]));
            value
        };
        let a: Vec<u32> = (0..coop.fr)
            .map(|r| load(&mut ids, &mut types, &mut body, qa, a_word, r * coop.fm, a_type, row_major))
            .collect();
        let b: Vec<u32> = (0..coop.fc)
            .map(|c| load(&mut ids, &mut types, &mut body, qb, b_word, c * coop.fn_, b_type, col_major))
            .collect();
        for (r, &a) in a.iter().enumerate() {
            for (c, &b) in b.iter().enumerate() {
                let at = r * coop.fc as usize + c;
                let sum = ids.next();
                body.push(inst(Op::CooperativeMatrixMulAddKHR, vec![acc_type, sum, a, b, acc[at], signed]));
                acc[at] = sum;
            }
        }
    }
    for r in 0..coop.fr {
        for c in 0..coop.fc {
            let offset = constant(&mut ids, &mut types, u32_type, r * coop.fm * tile_cols + c * coop.fn_);
            let (at, pointer) = (ids.next(), ids.next());
            body.push(inst(Op::IAdd, vec![u32_type, at, sums_at, offset]));
            body.push(inst(Op::AccessChain, vec![workgroup_i32, pointer, sums, at]));
            let value = acc[(r * coop.fc + c) as usize];
            body.push(inst(Op::CooperativeMatrixStoreKHR, vec![pointer, value, row_major, sums_stride]));
        }
    }
    body.push(inst(Op::Return, vec![]));

    // Capabilities and the extension first, the new types and constants at the end of the type
    // section (before the first function), the new body in place of naga's.
    let first_non_capability =
        code.iter().position(|i| i.op != Op::Capability as u32).ok_or_else(|| missing("instructions"))?;
    let first_function = code.iter().position(|i| i.op == Op::Function as u32).ok_or_else(|| missing("function"))?;
    // Names and decorations of what only the replaced body defined (its locals) go with it.
    let removed: std::collections::HashSet<u32> = code[body_start..end].iter().flat_map(|i| i.words.clone()).collect();
    let kept_uses: std::collections::HashSet<u32> = code[..body_start]
        .iter()
        .chain(&code[end..])
        .filter(|i| i.op != Op::Name as u32 && i.op != Op::Decorate as u32)
        .flat_map(|i| i.words.clone())
        .collect();
    let orphan = |i: &Inst| {
        (i.op == Op::Name as u32 || i.op == Op::Decorate as u32)
            && removed.contains(&i.words[0])
            && !kept_uses.contains(&i.words[0])
    };
    let code: Vec<Inst> = code.iter().map(|i| if orphan(i) { inst(Op::Nop, vec![]) } else { i.clone() }).collect();
    let mut out = Vec::with_capacity(code.len() + body.len() + types.len() + 4);
    out.extend_from_slice(&code[..first_non_capability]);
    out.push(inst(Op::Capability, vec![spirv::Capability::Int8 as u32]));
    out.push(inst(Op::Capability, vec![spirv::Capability::CooperativeMatrixKHR as u32]));
    out.push(inst(Op::Extension, string_words("SPV_KHR_cooperative_matrix")));
    out.extend_from_slice(&code[first_non_capability..first_function]);
    out.extend(types);
    out.extend_from_slice(&code[first_function..body_start]);
    out.extend(body);
    out.extend_from_slice(&code[end..]);
    out.retain(|i| i.op != Op::Nop as u32);
    header[3] = bound;
    Ok(assemble(header, &out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(words: &[u32]) -> Vec<u32> {
        parse(words).unwrap().1.iter().map(|i| i.op).collect()
    }

    #[test]
    fn the_splice_replaces_the_portable_body_with_cooperative_products() {
        for (fm, fn_, fk, subgroup) in [(16, 16, 32, 32), (16, 8, 32, 32), (8, 8, 8, 8)] {
            let coop = lockstep_shaders::coop_tile(fm, fn_, fk, subgroup);
            let portable = spirv(coop, false, 1, false).unwrap();
            let spliced = spirv(coop, false, 1, true).unwrap();
            let count = |words: &[u32], op: Op| ops(words).iter().filter(|&&o| o == op as u32).count();
            // The portable body's dot products are gone, the multiply-adds are there: 32 / fk
            // slices of fr × fc fragments, fr + fc loads a slice, one store a fragment.
            assert!(count(&portable, Op::SDot) > 0);
            assert_eq!(count(&spliced, Op::SDot), 0);
            let fragments = (coop.fr * coop.fc) as usize;
            let slices = (32 / fk) as usize;
            assert_eq!(count(&spliced, Op::CooperativeMatrixMulAddKHR), slices * fragments);
            assert_eq!(count(&spliced, Op::CooperativeMatrixLoadKHR), slices * (coop.fr + coop.fc) as usize);
            assert_eq!(count(&spliced, Op::CooperativeMatrixStoreKHR), fragments);
            // Everything but that function is naga's, unchanged: the epilogue's float
            // arithmetic instruction for instruction.
            for op in [Op::FAdd, Op::FMul, Op::Bitcast, Op::ControlBarrier, Op::EntryPoint] {
                assert_eq!(count(&portable, op), count(&spliced, op), "{op:?}");
            }
        }
    }
}

/// SPIRV-Tools' validator, run on every cooperative module this crate builds (for Vulkan 1.3,
/// as NVIDIA's and Mesa's drivers read it): from the directory `scripts/vulkan-coopmat.sh`
/// unpacks (trixie's `spirv-val`, under trixie's dynamic loader).
#[cfg(test)]
mod validator {
    use std::path::PathBuf;
    use std::process::Command;

    fn root() -> PathBuf {
        let root = std::env::var_os("LOCKSTEP_COOPMAT_ROOT").map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/lockstep/vulkan-coopmat")
        });
        assert!(root.join("ready").exists(), "{} is missing: run scripts/vulkan-coopmat.sh", root.display());
        root
    }

    fn validate(words: &[u32], what: &str) {
        let root = root();
        let lib = root.join("fs/usr/lib/x86_64-linux-gnu");
        let file = std::env::temp_dir().join(format!("lockstep-coop-{}-{what}.spv", std::process::id()));
        std::fs::write(&file, words.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        let out = Command::new(lib.join("ld-linux-x86-64.so.2"))
            .arg("--library-path")
            .arg(&lib)
            .arg(root.join("fs/usr/bin/spirv-val"))
            .args(["--target-env", "vulkan1.3"])
            .arg(&file)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&file);
        assert!(
            out.status.success(),
            "{what}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn spirv_val_accepts_every_cooperative_module() {
        for (fm, fn_, fk, subgroup) in [(16, 16, 32, 32), (16, 8, 32, 32), (8, 8, 8, 8)] {
            let coop = lockstep_shaders::coop_tile(fm, fn_, fk, subgroup);
            for pages in [1, 4] {
                for cooperative in [false, true] {
                    let words = super::spirv(coop, false, pages, cooperative).unwrap();
                    validate(&words, &format!("{fm}x{fn_}x{fk}-pages{pages}-coop{cooperative}"));
                }
            }
        }
    }
}
