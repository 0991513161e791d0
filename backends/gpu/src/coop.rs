//! The `tc` plugin's unit kernel: `gemm_tc.wgsl` through naga to SPIR-V, then the body of its
//! `tc_block_sums` replaced by cooperative-matrix instructions (`SPV_KHR_cooperative_matrix`).
//!
//! WGSL has no integer cooperative matrices (wgpu 30 lists only f16 and f32 configurations, and
//! naga's WGSL has no i8 matrix type), so the module is written in WGSL with a portable body for
//! the one step the tensor cores take (each lane forms every `SUBGROUP`-th block sum through
//! `dot4I8Packed`), compiled by naga as wgpu would, and that one function is rewritten here:
//! for each of the `32 / FK` slices of a block, `FR` A fragments (`FM × FK` int8, row-major in
//! `a_tile`) and `FC` B fragments (`FK × FN`, column-major in `b_tile`, since B's rows are the
//! product's columns) are loaded from the block's operand rows, which the whole workgroup staged
//! in workgroup memory (`gemm_tc.wgsl`) — the pointer type (u32) may differ from the component
//! type (i8), the stride then counts words — multiplied into `FR × FC`
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
use naga::back::spv::BindingMap;
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
/// cooperative-matrix block sums, its bindings numbered as `bindings` says (the layout's Vulkan
/// numbers: `units.rs`, `Layout`).
pub fn spirv(coop: CoopTile, soft_float: bool, pages: u32, bindings: &BindingMap) -> Result<Vec<u32>, CoopError> {
    let overrides = unit_overrides(soft_float, pages);
    splice(&naga_spirv(Kernel::GemmTc(coop), &overrides, bindings)?, "tc_block_sums", coop, block_sums_body)
}

/// SPIR-V of the `tc` path's ceiling (`peak_tc.wgsl`) for `coop`, with cooperative multiply-adds,
/// its bindings numbered as `bindings` says.
pub fn peak_spirv(coop: CoopTile, bindings: &BindingMap) -> Result<Vec<u32>, CoopError> {
    splice(&naga_spirv(Kernel::PeakTc(coop), &[], bindings)?, "tc_peak", coop, peak_body)
}

/// The pipeline overrides of the modules with the exact arithmetic and the arena (every unit and
/// step kernel, WGSL or passed through): `SOFT_FLOAT` and `PAGES`.
pub(crate) fn unit_overrides(soft_float: bool, pages: u32) -> [(&'static str, f64); 2] {
    [("SOFT_FLOAT", if soft_float { 1.0 } else { 0.0 }), ("PAGES", f64::from(pages))]
}

/// naga's SPIR-V for `kernel`'s WGSL, as wgpu would write it, with `overrides` set and its
/// bindings renumbered by `bindings` (those it does not name keep their WGSL numbers).
fn naga_spirv(kernel: Kernel, overrides: &[(&str, f64)], bindings: &BindingMap) -> Result<Vec<u32>, CoopError> {
    let tile = match kernel {
        Kernel::GemmTc(coop) => coop.epilogue().ok_or_else(|| CoopError(format!("{coop:?} has no epilogue tile")))?,
        _ => lockstep_shaders::TILES[0],
    };
    let source = lockstep_shaders::source(kernel, Product::Dp4a, tile);
    let module = naga::front::wgsl::parse_str(&source).map_err(|e| CoopError(e.emit_to_string(&source)))?;
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
        .validate(&module)
        .map_err(|e| CoopError(e.emit_to_string(&source)))?;
    let mut constants = naga::back::PipelineConstants::default();
    for &(name, value) in overrides {
        constants.insert(name.into(), value);
    }
    let (module, info) = naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants)
        .map_err(|e| CoopError(format!("{e:?}")))?;
    let options = naga::back::spv::Options {
        // Cooperative matrices need SPIR-V 1.3 or later; 1.6 is Vulkan 1.3's.
        lang_version: (1, 6),
        flags: naga::back::spv::WriterFlags::DEBUG,
        // Every workgroup variable is written before it is read.
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        // As wgpu compiles the other unit kernels (`create_shader_module_trusted`): every
        // index is in range by construction (gemm_tc.wgsl says how), and loops are bounded.
        force_loop_bounding: false,
        binding_map: bindings.clone(),
        ..naga::back::spv::Options::default()
    };
    naga::back::spv::write_vec(&module, &info, &options, None).map_err(|e| CoopError(format!("{e}")))
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

/// What builds a spliced function's body from its parameters.
type BodyFn = fn(&mut Builder, &[u32], CoopTile) -> Result<Vec<Inst>, CoopError>;

/// Fresh ids, and the new types and constants (appended to the type section), u32 constants
/// declared once each.
struct Declared {
    bound: u32,
    types: Vec<Inst>,
    constants: HashMap<u32, u32>,
    u32_type: u32,
}

impl Declared {
    fn id(&mut self) -> u32 {
        self.bound += 1;
        self.bound - 1
    }

    /// The u32 constant `value`, declared once.
    fn u32(&mut self, value: u32) -> u32 {
        if let Some(&id) = self.constants.get(&value) {
            return id;
        }
        let id = self.id();
        self.types.push(inst(Op::Constant, vec![self.u32_type, id, value]));
        self.constants.insert(value, id);
        id
    }

    /// A new type or constant `op` whose result id is its operand `at`.
    fn declare(&mut self, op: Op, mut operands: Vec<u32>, at: usize) -> u32 {
        let id = self.id();
        operands.insert(at, id);
        self.types.push(inst(op, operands));
        id
    }
}

/// What a spliced body is built with: [`Declared`], naga's globals by name, and the cooperative
/// types of the shape.
struct Builder {
    declared: Declared,
    names: HashMap<Vec<u32>, u32>,
    u32_type: u32,
    /// `FM × FK` i8 (use A), `FK × FN` i8 (use B), `FM × FN` i32 (accumulator), and the zero
    /// accumulator.
    a_type: u32,
    b_type: u32,
    acc_type: u32,
    zero_acc: u32,
    /// Pointers to a u32 and to an i32 in workgroup memory.
    workgroup_u32: u32,
    workgroup_i32: u32,
    row_major: u32,
    col_major: u32,
    /// All four `…SignedComponentsKHR` operands: every matrix signed.
    signed: u32,
}

impl Builder {
    /// Declares the cooperative types of `coop` and the pointer types the bodies use, after naga's
    /// module's types (`u32_type`, `i32_type`, ids from `bound`).
    fn new(bound: u32, u32_type: u32, i32_type: u32, names: HashMap<Vec<u32>, u32>, coop: CoopTile) -> Self {
        use spirv::CooperativeMatrixUse as Use;
        use spirv::StorageClass as Class;
        let mut d = Declared { bound, types: Vec::new(), constants: HashMap::new(), u32_type };
        let i8_type = d.declare(Op::TypeInt, vec![8, 1], 0);
        let scope = d.u32(spirv::Scope::Subgroup as u32);
        let mut matrix = |component: u32, rows: u32, cols: u32, usage: Use| {
            let (rows, cols, usage) = (d.u32(rows), d.u32(cols), d.u32(usage as u32));
            d.declare(Op::TypeCooperativeMatrixKHR, vec![component, scope, rows, cols, usage], 0)
        };
        let a_type = matrix(i8_type, coop.fm, coop.fk, Use::MatrixAKHR);
        let b_type = matrix(i8_type, coop.fk, coop.fn_, Use::MatrixBKHR);
        let acc_type = matrix(i32_type, coop.fm, coop.fn_, Use::MatrixAccumulatorKHR);
        let zero_i32 = d.declare(Op::Constant, vec![i32_type, 0], 1);
        let zero_acc = d.declare(Op::ConstantComposite, vec![acc_type, zero_i32], 1);
        let mut pointer = |class: Class, ty: u32| d.declare(Op::TypePointer, vec![class as u32, ty], 0);
        let (workgroup_u32, workgroup_i32) = (pointer(Class::Workgroup, u32_type), pointer(Class::Workgroup, i32_type));
        let row_major = d.u32(spirv::CooperativeMatrixLayout::RowMajorKHR as u32);
        let col_major = d.u32(spirv::CooperativeMatrixLayout::ColumnMajorKHR as u32);
        let signed = spirv::CooperativeMatrixOperands::MATRIX_A_SIGNED_COMPONENTS_KHR
            | spirv::CooperativeMatrixOperands::MATRIX_B_SIGNED_COMPONENTS_KHR
            | spirv::CooperativeMatrixOperands::MATRIX_C_SIGNED_COMPONENTS_KHR
            | spirv::CooperativeMatrixOperands::MATRIX_RESULT_SIGNED_COMPONENTS_KHR;
        Builder {
            declared: d,
            names,
            u32_type,
            a_type,
            b_type,
            acc_type,
            zero_acc,
            workgroup_u32,
            workgroup_i32,
            row_major,
            col_major,
            signed: signed.bits(),
        }
    }

    fn id(&mut self) -> u32 {
        self.declared.id()
    }

    fn u32(&mut self, value: u32) -> u32 {
        self.declared.u32(value)
    }

    fn named(&self, name: &str) -> Result<u32, CoopError> {
        self.names.get(&string_words(name)).copied().ok_or_else(|| CoopError(format!("naga's module has no {name}")))
    }

    /// `base + scale · by + offset` in u32, into `body`.
    fn address(&mut self, body: &mut Vec<Inst>, base: u32, scale: u32, by: u32, offset: u32) -> u32 {
        let (scale, offset) = (self.u32(scale), self.u32(offset));
        let (scaled, shifted, word) = (self.id(), self.id(), self.id());
        body.push(inst(Op::IMul, vec![self.u32_type, scaled, scale, by]));
        body.push(inst(Op::IAdd, vec![self.u32_type, shifted, base, scaled]));
        body.push(inst(Op::IAdd, vec![self.u32_type, word, shifted, offset]));
        word
    }

    /// `base + offset` in u32, into `body`.
    fn plus(&mut self, body: &mut Vec<Inst>, base: u32, offset: u32) -> u32 {
        let (offset, sum) = (self.u32(offset), self.id());
        body.push(inst(Op::IAdd, vec![self.u32_type, sum, base, offset]));
        sum
    }

    /// A cooperative load of `ty` from word `word` of the workgroup array of u32 `var` (a
    /// staged tile, the ceiling's region), rows or columns `stride` words apart.
    fn load(&mut self, body: &mut Vec<Inst>, var: u32, word: u32, ty: u32, layout: u32, stride: u32) -> u32 {
        let (pointer, value) = (self.id(), self.id());
        body.push(inst(Op::AccessChain, vec![self.workgroup_u32, pointer, var, word]));
        body.push(inst(Op::CooperativeMatrixLoadKHR, vec![ty, value, pointer, layout, stride]));
        value
    }

    fn mul_add(&mut self, body: &mut Vec<Inst>, a: u32, b: u32, acc: u32) -> u32 {
        let sum = self.id();
        body.push(inst(Op::CooperativeMatrixMulAddKHR, vec![self.acc_type, sum, a, b, acc, self.signed]));
        sum
    }

    /// A row-major store of accumulator `value` at element `at` of workgroup array `var` (of
    /// `pointer`'s element type), rows `stride` elements apart.
    fn store(&mut self, body: &mut Vec<Inst>, var: u32, pointer_type: u32, at: u32, value: u32, stride: u32) {
        let (pointer, stride) = (self.id(), self.u32(stride));
        body.push(inst(Op::AccessChain, vec![pointer_type, pointer, var, at]));
        body.push(inst(Op::CooperativeMatrixStoreKHR, vec![pointer, value, self.row_major, stride]));
    }
}

/// The cooperative body of `tc_block_sums(a_word, b_word, row_words, sums_at, lane)`: for each
/// of the `32 / FK` slices of a block, `FR` A and `FC` B fragments from the block's operand
/// rows staged in workgroup memory (`a_tile`, `b_tile`) and `FR × FC` multiply-adds; then each
/// accumulator stored into `sums`.
fn block_sums_body(b: &mut Builder, params: &[u32], coop: CoopTile) -> Result<Vec<Inst>, CoopError> {
    let &[a_word, b_word, row_words, sums_at, _lane] = params else {
        return Err(CoopError(format!("tc_block_sums has {} parameters, not 5", params.len())));
    };
    let (a_tile, b_tile, sums) = (b.named("a_tile")?, b.named("b_tile")?, b.named("sums")?);
    let mut body = Vec::new();
    let mut acc = vec![b.zero_acc; (coop.fr * coop.fc) as usize];
    for slice in 0..32 / coop.fk {
        // Four int8 a word: the slice starts fk / 4 words into the block.
        let offset = slice * coop.fk / 4;
        let a: Vec<u32> = (0..coop.fr)
            .map(|r| {
                let word = b.address(&mut body, a_word, r * coop.fm, row_words, offset);
                b.load(&mut body, a_tile, word, b.a_type, b.row_major, row_words)
            })
            .collect();
        // B's rows are the product's columns: a B fragment is column-major in `qb`.
        let bs: Vec<u32> = (0..coop.fc)
            .map(|c| {
                let word = b.address(&mut body, b_word, c * coop.fn_, row_words, offset);
                b.load(&mut body, b_tile, word, b.b_type, b.col_major, row_words)
            })
            .collect();
        for (r, &a) in a.iter().enumerate() {
            for (c, &fragment) in bs.iter().enumerate() {
                let at = r * coop.fc as usize + c;
                acc[at] = b.mul_add(&mut body, a, fragment, acc[at]);
            }
        }
    }
    let stride = coop.sums_stride();
    for r in 0..coop.fr {
        for c in 0..coop.fc {
            let at = b.plus(&mut body, sums_at, r * coop.fm * stride + c * coop.fn_);
            let pointer_type = b.workgroup_i32;
            b.store(&mut body, sums, pointer_type, at, acc[(r * coop.fc + c) as usize], stride);
        }
    }
    Ok(body)
}

/// The cooperative body of `tc_peak(at, lane)` (`peak_tc.wgsl` says why each part is there): the A
/// fragment from the start of the region's first accumulator, the B fragment from the start of
/// its second, the four accumulators loaded, [`lockstep_shaders::PEAK_TC_MULADDS`] multiply-adds
/// into them in turn, the four stored back, a subgroup barrier. `lockstep_shaders::peak_tc_words`
/// is the same on the host.
fn peak_body(b: &mut Builder, params: &[u32], coop: CoopTile) -> Result<Vec<Inst>, CoopError> {
    let &[at, _lane] = params else {
        return Err(CoopError(format!("tc_peak has {} parameters, not 2", params.len())));
    };
    let tile = b.named("peak_tile")?;
    let mut body = Vec::new();
    let acc_words = coop.fm * coop.fn_;
    let (words_k, row_words) = (b.u32(coop.fk / 4), b.u32(coop.fn_));
    let a = b.load(&mut body, tile, at, b.a_type, b.row_major, words_k);
    let b_at = b.plus(&mut body, at, acc_words);
    let fragment = b.load(&mut body, tile, b_at, b.b_type, b.col_major, words_k);
    let places: Vec<u32> = (0..4).map(|j| b.plus(&mut body, at, j * acc_words)).collect();
    let mut acc: Vec<u32> =
        places.iter().map(|&word| b.load(&mut body, tile, word, b.acc_type, b.row_major, row_words)).collect();
    for round in 0..lockstep_shaders::PEAK_TC_MULADDS as usize {
        acc[round % 4] = b.mul_add(&mut body, a, fragment, acc[round % 4]);
    }
    for (&word, &value) in places.iter().zip(&acc) {
        let pointer_type = b.workgroup_u32;
        b.store(&mut body, tile, pointer_type, word, value, coop.fn_);
    }
    // The next call's loads read what other lanes stored.
    let (scope, semantics) = (
        b.u32(spirv::Scope::Subgroup as u32),
        b.u32((spirv::MemorySemantics::WORKGROUP_MEMORY | spirv::MemorySemantics::ACQUIRE_RELEASE).bits()),
    );
    body.push(inst(Op::ControlBarrier, vec![scope, scope, semantics]));
    Ok(body)
}

/// Replaces the body of `function` in naga's `words` with the instructions `build` makes for
/// `coop` from the function's parameters.
fn splice(words: &[u32], function: &str, coop: CoopTile, build: BodyFn) -> Result<Vec<u32>, CoopError> {
    let (mut header, code) = parse(words)?;
    let missing = |what: &str| CoopError(format!("naga's module has no {what}"));
    let int_type = |width: u32, signed: u32| {
        code.iter().find(|i| i.op == Op::TypeInt as u32 && i.words[1..] == [width, signed]).map(|i| i.words[0])
    };
    let u32_type = int_type(32, 0).ok_or_else(|| missing("u32 type"))?;
    let i32_type = int_type(32, 1).ok_or_else(|| missing("i32 type"))?;
    if int_type(8, 1).is_some() {
        return Err(CoopError("naga's module already declares an i8 type".into()));
    }
    let names = code.iter().filter(|i| i.op == Op::Name as u32).map(|i| (i.words[1..].to_vec(), i.words[0])).collect();
    let mut b = Builder::new(header[3], u32_type, i32_type, names, coop);

    let target = b.named(function)?;
    let start = code
        .iter()
        .position(|i| i.op == Op::Function as u32 && i.words[1] == target)
        .ok_or_else(|| missing(&format!("{function} function")))?;
    let params: Vec<u32> =
        code[start + 1..].iter().take_while(|i| i.op == Op::FunctionParameter as u32).map(|i| i.words[1]).collect();
    let body_start = start + 1 + params.len();
    let end = body_start
        + code[body_start..]
            .iter()
            .position(|i| i.op == Op::FunctionEnd as u32)
            .ok_or_else(|| missing("function end"))?;
    let label = b.id();
    let mut body = vec![inst(Op::Label, vec![label])];
    body.extend(build(&mut b, &params, coop)?);
    body.push(inst(Op::Return, vec![]));

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
    // Capabilities and the extension first, the new types and constants at the end of the type
    // section (before the first function), the new body in place of naga's.
    let first_non_capability =
        code.iter().position(|i| i.op != Op::Capability as u32).ok_or_else(|| missing("instructions"))?;
    let first_function = code.iter().position(|i| i.op == Op::Function as u32).ok_or_else(|| missing("function"))?;
    let mut out = Vec::with_capacity(code.len() + body.len() + b.declared.types.len() + 4);
    out.extend_from_slice(&code[..first_non_capability]);
    out.push(inst(Op::Capability, vec![spirv::Capability::Int8 as u32]));
    out.push(inst(Op::Capability, vec![spirv::Capability::CooperativeMatrixKHR as u32]));
    out.push(inst(Op::Extension, string_words("SPV_KHR_cooperative_matrix")));
    out.extend(code[first_non_capability..first_function].iter().filter(|i| !orphan(i)).cloned());
    out.append(&mut b.declared.types);
    out.extend_from_slice(&code[first_function..body_start]);
    out.extend(body);
    out.extend_from_slice(&code[end..]);
    header[3] = b.declared.bound;
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
            let portable = naga_spirv(Kernel::GemmTc(coop), &unit_overrides(false, 1), &BindingMap::default()).unwrap();
            let spliced = spirv(coop, false, 1, &BindingMap::default()).unwrap();
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

    #[test]
    fn the_path_ceiling_makes_the_multiply_adds_it_counts() {
        // `Kernel::peak_workgroup` counts PEAK_TC_MULADDS multiply-adds of fm · fn · fk a call;
        // the spliced body has exactly that many, on two operand loads and four accumulator
        // loads and stores (that every one of them is executed is `time_peak`'s check of the
        // output against `lockstep_shaders::peak_tc_words`).
        for (fm, fn_, fk, subgroup) in [(16, 16, 32, 32), (16, 8, 32, 32), (8, 8, 8, 8)] {
            let coop = lockstep_shaders::coop_tile(fm, fn_, fk, subgroup);
            let words = peak_spirv(coop, &BindingMap::default()).unwrap();
            let count = |op: Op| ops(&words).iter().filter(|&&o| o == op as u32).count();
            assert_eq!(count(Op::CooperativeMatrixMulAddKHR), lockstep_shaders::PEAK_TC_MULADDS as usize);
            assert_eq!(count(Op::CooperativeMatrixLoadKHR), 6);
            assert_eq!(count(Op::CooperativeMatrixStoreKHR), 4);
            let (_, counted) = Kernel::PeakTc(coop).peak_workgroup().unwrap();
            let per_call = u64::from(lockstep_shaders::PEAK_TC_MULADDS) * u64::from(fm * fn_ * fk) * 2;
            let calls = u64::from(lockstep_shaders::PEAK_TC_SUBGROUPS * lockstep_shaders::PEAK_CALLS);
            assert_eq!(counted, per_call * calls);
        }
    }
}

/// SPIRV-Tools' validator, run on every cooperative module this crate builds (for Vulkan 1.3,
/// as NVIDIA's and Mesa's drivers read it): from the directory `scripts/vulkan-coopmat.sh`
/// unpacks (trixie's `spirv-val`, under trixie's dynamic loader).
#[cfg(test)]
mod validator {
    use lockstep_faulty_plugins::coopmat::CoopmatDriver;
    use lockstep_shaders::Kernel;
    use naga::back::spv::BindingMap;

    fn validate(words: &[u32], what: &str) {
        let driver = CoopmatDriver::unpacked();
        let file = std::env::temp_dir().join(format!("lockstep-coop-{}-{what}.spv", std::process::id()));
        std::fs::write(&file, words.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        let out =
            driver.command(&driver.bin("spirv-val")).args(["--target-env", "vulkan1.3"]).arg(&file).output().unwrap();
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
            let shape = format!("{fm}x{fn_}x{fk}");
            for pages in [1, 4] {
                let overrides = super::unit_overrides(false, pages);
                let portable = super::naga_spirv(Kernel::GemmTc(coop), &overrides, &BindingMap::default()).unwrap();
                validate(&portable, &format!("{shape}-pages{pages}-portable"));
                validate(
                    &super::spirv(coop, false, pages, &BindingMap::default()).unwrap(),
                    &format!("{shape}-pages{pages}"),
                );
            }
            let portable = super::naga_spirv(Kernel::PeakTc(coop), &[], &BindingMap::default()).unwrap();
            validate(&portable, &format!("peak-{shape}-portable"));
            validate(&super::peak_spirv(coop, &BindingMap::default()).unwrap(), &format!("peak-{shape}"));
        }
    }
}
