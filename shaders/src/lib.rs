//! WGSL sources of the GPU units and of the training step's ops, as data with a typed index.
//!
//! A kernel is a *family* ([`Kernel`]: the blocked unit, the raw integer product, or one of the
//! step's ops, [`StepKernel`]) combined with a *product* ([`Product`]: the DP4A instruction or
//! the product table) and, for the tiled unit, a [`Tile`]. [`source`] assembles the module:
//! the product snippet first (it may open with a `requires` directive, which WGSL wants before
//! any declaration), then the tile constants, then the exact float arithmetic
//! (`exact_f32.wgsl`) where the family does float math, then the family's body. No wgpu here;
//! `cargo test` validates every combination with naga and checks the SPIR-V naga emits for
//! what the exact arithmetic rules out.
//!
//! Every combination computes the same bits: the tile only decides which invocation computes
//! an output, never the order of its additions.

mod peak;

pub use peak::{
    peak_tc_words, peak_words, PEAK_CALLS, PEAK_ITERATIONS, PEAK_SEED_MASK, PEAK_TC_MULADDS, PEAK_TC_SUBGROUPS,
    PEAK_WORKGROUP,
};

/// A kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// The verified unit `C = A · Bᵀ` on quantized operands, with the exact epilogue.
    GemmUnits,
    /// The same unit for few outputs and a long k: a stage's block sums formed in parallel
    /// (`gemm_split.wgsl`), the same additions in the same order.
    GemmUnitsSplit,
    /// The same unit with its block sums on cooperative matrices (`gemm_tc.wgsl`): the
    /// portable module, whose `tc_block_sums` the `tc` plugin replaces in the SPIR-V.
    GemmTc(CoopTile),
    /// The raw integer product over the full i8 range, i32 out.
    GemmI8,
    /// The product path's ceiling: `dot4` in a register-resident loop (`peak.wgsl`).
    Peak,
    /// The cooperative-matrix path's ceiling (`peak_tc.wgsl`): the portable module, whose
    /// `tc_peak` the `tc` plugin replaces in the SPIR-V.
    PeakTc(CoopTile),
    /// One entry point of the step's ops (`step_ops.wgsl`).
    Step(StepKernel),
}

/// The entry points of `step_ops.wgsl`: each kernel's name in the enum, its entry point, and its
/// workgroup width, listed once.
macro_rules! step_kernels {
    ($( $(#[doc = $doc:literal])* $kernel:ident $entry:literal $workgroup:expr, )*) => {
        /// The entry points of `step_ops.wgsl`, one per op of ABI 2 (some ops take two).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum StepKernel {
            $( $(#[doc = $doc])* $kernel, )*
        }

        impl StepKernel {
            pub const ALL: &'static [StepKernel] = &[$(StepKernel::$kernel),*];

            /// The entry point's name.
            pub fn entry_point(self) -> &'static str {
                match self { $( StepKernel::$kernel => $entry, )* }
            }

            /// Workgroup width of the entry point (256 for most; the kernels that run as one
            /// workgroup, [`StepKernel::single`], may be narrower).
            pub fn workgroup(self) -> u32 {
                match self { $( StepKernel::$kernel => $workgroup, )* }
            }
        }
    };
}

step_kernels! {
    /// A product's operand, quantized on the device for [`Kernel::GemmUnits`].
    Quantize "quantize" STEP_WORKGROUP,
    Embed "embed" STEP_WORKGROUP,
    /// The embedding gradient's row lists (one workgroup) ...
    EmbedLists "embed_lists" STEP_WORKGROUP,
    /// ... and the gradient, one invocation per table word.
    EmbedBackward "embed_backward" STEP_WORKGROUP,
    Gelu "gelu" STEP_WORKGROUP,
    GeluBackward "gelu_backward" STEP_WORKGROUP,
    Adam "adam" STEP_WORKGROUP,
    /// 32 lanes per row, 8 rows per workgroup (as every row kernel).
    LayerNorm "layer_norm" STEP_WORKGROUP,
    /// LayerNorm's input gradient.
    LayerNormBackward "layer_norm_backward" STEP_WORKGROUP,
    /// LayerNorm's gain and bias gradients, 32 lanes per column, 8 columns per workgroup.
    LayerNormParamGrads "layer_norm_param_grads" STEP_WORKGROUP,
    CausalSoftmax "causal_softmax" STEP_WORKGROUP,
    CausalSoftmaxBackward "causal_softmax_backward" STEP_WORKGROUP,
    /// Cross-entropy per row (losses into the scratch buffer) ...
    CrossEntropy "cross_entropy" STEP_WORKGROUP,
    /// ... and their mean, one workgroup of 32 lanes.
    CrossEntropyMean "cross_entropy_mean" 32,
    BiasGrad "bias_grad" STEP_WORKGROUP,
    /// The weight hash's chunks, one invocation each (into the scratch buffer) ...
    HashChunks "hash_chunks" STEP_WORKGROUP,
    /// ... and the hash over them, in one invocation.
    HashFold "hash_fold" 1,
}

/// Invocations per workgroup of the step's parallel kernels (one dimension).
pub const STEP_WORKGROUP: u32 = 256;

impl StepKernel {
    /// The kernels that run as a single workgroup, whatever the op's size.
    pub fn single(self) -> bool {
        matches!(self, StepKernel::EmbedLists | StepKernel::CrossEntropyMean | StepKernel::HashFold)
    }

    /// Whether the kernel runs one invocation per lane of each output row (or column): `LANES`
    /// (`lockstep_luts::ops::LANES`, the lane sums' 32) invocations an output instead of one.
    pub fn per_lane(self) -> bool {
        use StepKernel as K;
        matches!(
            self,
            K::LayerNorm
                | K::LayerNormBackward
                | K::LayerNormParamGrads
                | K::CausalSoftmax
                | K::CausalSoftmaxBackward
                | K::CrossEntropy
                | K::BiasGrad
        )
    }
}

/// The kernels' uniform record (the step kernels' and the unit kernel's): 64 words, one record
/// per dispatch at a dynamic offset. Words 0 … 23 are the op's ABI params, its buffer offsets
/// turned into arena addresses (`lockstep_luts::ops::Record`); the WGSL reads them by the names
/// `generated_ops.wgsl` gives and the words below by `P_FLAGS`, `P_PART`, `P_OP_INDEX`, `P_ZERO`.
pub mod step_params {
    /// Words in a record.
    pub const WORDS: usize = 64;
    /// Bytes in a record (also the dynamic-offset stride).
    pub const BYTES: u64 = 256;
    /// The op's flags.
    pub const FLAGS: usize = 60;
    /// Which operand a product's quantizer takes (0: A, 1: B).
    pub const PART: usize = 61;
    /// The word holding the op's index in its call (reported through `status`).
    pub const OP_INDEX: usize = 62;
    /// The word that is always 0 (the contraction barrier's operand).
    pub const ZERO: usize = 63;
}

/// What a step kernel records in `status[0]` (`(op << 4) | kind`, the smallest wins).
pub mod step_status {
    /// Nothing failed (the host writes this before a call).
    pub const CLEAR: u32 = u32::MAX;
    pub const NON_FINITE: u32 = 1;
    pub const TOKEN: u32 = 2;
}

/// Binding slots of `step_ops.wgsl`.
pub mod step_binding {
    pub const PARAMS: u32 = 0;
    /// The arena's first page (the others: [`PAGE_BINDINGS`](super::PAGE_BINDINGS)).
    pub const MEM: u32 = 1;
    pub const Q: u32 = 2;
    pub const E: u32 = 3;
    pub const STATUS: u32 = 4;
    pub const SCRATCH: u32 = 5;
}

/// The arena's pages after the first (`arena.wgsl`: `page1` … `page3`), in the step kernels'
/// and the unit kernels' modules alike.
pub const PAGE_BINDINGS: [u32; 3] = [7, 8, 9];
/// Pages an arena may have (`page0` and [`PAGE_BINDINGS`]).
pub const MAX_PAGES: usize = 4;
/// A word address is `page << PAGE_SHIFT | word` (`arena.wgsl`), so a page holds at most
/// 2^30 words (4 GiB, as large as any device's binding: NVIDIA's is 4 GiB − 1 byte) and four
/// pages fill the 32-bit address.
pub const PAGE_SHIFT: u32 = 30;

/// How four packed int8 pairs are multiplied and summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Product {
    /// `dot4I8Packed` (`requires packed_4x8_integer_dot_product`).
    Dp4a,
    /// Lookups in the 65536-entry product table (`mul_lut.bin`) bound at `@binding(6)`.
    Lut,
}

/// Work per invocation (`tm × tn` outputs), workgroup shape (`wx × wy` invocations) and
/// blocks of k staged in workgroup memory between barriers (`kb`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub tm: u32,
    pub tn: u32,
    pub wx: u32,
    pub wy: u32,
    pub kb: u32,
}

impl Tile {
    /// Rows of C per workgroup.
    pub fn rows(self) -> u32 {
        self.tm * self.wy
    }

    /// Columns of C per workgroup.
    pub fn cols(self) -> u32 {
        self.tn * self.wx
    }

    /// Workgroup memory the unit kernel uses, in bytes: `kb` blocks (8 words each) of each
    /// operand tile and their exponents.
    pub fn workgroup_bytes(self) -> u32 {
        (self.rows() + self.cols()) * (8 + 1) * 4 * self.kb
    }
}

/// The tiled unit on cooperative matrices ([`Kernel::GemmTc`]): the hardware's matrix shape
/// (`fm × fn_` outputs over `fk` of k, one multiply-add), the fragments each subgroup owns
/// (`fr × fc`), the subgroups of a workgroup (`sr × sc`) and their size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopTile {
    pub fm: u32,
    pub fn_: u32,
    pub fk: u32,
    pub fr: u32,
    pub fc: u32,
    pub sr: u32,
    pub sc: u32,
    pub subgroup: u32,
}

impl CoopTile {
    /// Rows of C per workgroup.
    pub fn rows(self) -> u32 {
        self.sr * self.fr * self.fm
    }

    /// Columns of C per workgroup.
    pub fn cols(self) -> u32 {
        self.sc * self.fc * self.fn_
    }

    /// Invocations per workgroup.
    pub fn threads(self) -> u32 {
        self.sr * self.sc * self.subgroup
    }

    /// Who adds which output's terms: 4 rows by `tn` columns an invocation over the same
    /// `rows × cols` outputs, or `None` where the shape does not divide so (or k's block of 32
    /// is not a whole number of `fk`).
    pub fn epilogue(self) -> Option<Tile> {
        let outputs = self.rows() * self.cols();
        let (tm, threads) = (4, self.threads());
        if self.fk == 0
            || !32u32.is_multiple_of(self.fk)
            || !self.rows().is_multiple_of(tm)
            || !outputs.is_multiple_of(threads * tm)
        {
            return None;
        }
        let tn = outputs / (threads * tm);
        let (wy, wx) = (self.rows() / tm, self.cols().checked_div(tn)?);
        (tn > 0 && self.cols().is_multiple_of(tn) && wx * wy == threads).then_some(Tile { tm, tn, wx, wy, kb: 1 })
    }

    /// Words from one row of the kernel's block sums to the next: the tile's columns and 8 more,
    /// so a warp's reads of the epilogue meet no bank conflict (`gemm_tc.wgsl`). A multiple of 4,
    /// as a cooperative store's stride must be (16 bytes).
    pub fn sums_stride(self) -> u32 {
        self.cols() + 8
    }

    /// Workgroup memory of the kernel: two blocks' i32 sums of the workgroup's outputs.
    pub fn workgroup_bytes(self) -> u32 {
        2 * self.rows() * self.sums_stride() * 4
    }
}

/// The cooperative tile for a hardware matrix shape `fm × fn_ × fk` and subgroup size: two by
/// two subgroups, each two by two fragments (NVIDIA's 16 × 16 × 32 and 32-wide subgroups: 64 ×
/// 64 outputs a workgroup of 128; lavapipe's 8 × 8 × 8 and 8-wide ones: 32 × 32 of 32).
pub fn coop_tile(fm: u32, fn_: u32, fk: u32, subgroup: u32) -> CoopTile {
    CoopTile { fm, fn_, fk, fr: 2, fc: 2, sr: 2, sc: 2, subgroup }
}

/// Tiles a plugin may pick from. Large tiles suit discrete GPUs; small ones keep shader
/// compilation and register use modest on software rasterizers such as lavapipe.
/// The first is the default on hardware GPUs (the second its narrow companion), the last on
/// software adapters.
pub const TILES: &[Tile] = &[
    Tile { tm: 4, tn: 4, wx: 16, wy: 16, kb: 2 },
    Tile { tm: 4, tn: 4, wx: 8, wy: 16, kb: 2 },
    Tile { tm: 8, tn: 4, wx: 16, wy: 16, kb: 2 },
    Tile { tm: 8, tn: 8, wx: 16, wy: 16, kb: 1 },
    Tile { tm: 8, tn: 8, wx: 16, wy: 16, kb: 3 },
    Tile { tm: 4, tn: 8, wx: 16, wy: 16, kb: 2 },
    Tile { tm: 4, tn: 4, wx: 16, wy: 16, kb: 1 },
    Tile { tm: 4, tn: 4, wx: 8, wy: 8, kb: 3 },
    Tile { tm: 4, tn: 4, wx: 8, wy: 8, kb: 1 },
];

/// The default tile of both products on hardware GPUs: 64 × 64 outputs a workgroup, 4 × 4 an
/// invocation, two blocks a stage. Measured on the H200 (2026-12-04, `docs/PERFORMANCE.md`) at
/// every product shape of the 25.6M configuration, for DP4A and the LUT alike: as fast as or
/// faster than 128 × 64 (the previous default), 4 × 8 outputs and one block a stage.
pub const DEFAULT_TILE: Tile = TILES[0];
/// The tile for products the default tile would cover with few workgroups
/// ([`NARROW_BELOW_GROUPS`]): 64 × 32 outputs a workgroup of 128 invocations, so twice the
/// workgroups. Measured on the H200: the weight gradients with 512 output rows and k = 4096
/// 16 to 22% faster than on the default tile.
pub const NARROW_TILE: Tile = TILES[1];
/// A product the default tile covers with fewer workgroups than this runs on [`NARROW_TILE`]
/// (on hardware GPUs, unless a tile is forced). Which tile computes an output never changes a
/// bit.
pub const NARROW_BELOW_GROUPS: u64 = 256;

/// The split unit kernel's output tile (`gemm_split.wgsl`: 16 × 32 outputs a workgroup of 256
/// invocations, k in stages of 8 blocks, one block a slice of 32 invocations).
pub const SPLIT_TILE: (u32, u32) = (16, 32);
/// Blocks of k the split kernel forms at once.
pub const SPLIT_SLICES: u32 = 8;
/// Rows of an operand one workgroup of the step's quantizer takes, one block of k each
/// (`step_ops.wgsl`: `QUANT_ROWS`).
pub const QUANT_ROWS: u32 = 32;

/// Workgroup memory every Vulkan 1.3 device offers compute shaders (and wgpu's default).
pub const PORTABLE_WORKGROUP_BYTES: u32 = 16 * 1024;

/// Workgroup size of [`Kernel::GemmI8`] (`8 × 8`, one output per invocation).
pub const GEMM_I8_WORKGROUP: (u32, u32) = (8, 8);

/// Binding slots shared by both families (see the WGSL files).
pub mod binding {
    pub const PARAMS: u32 = 0;
    pub const A: u32 = 1;
    pub const B: u32 = 2;
    pub const A_EXP: u32 = 3;
    pub const B_EXP: u32 = 4;
    pub const OUT: u32 = 5;
    pub const MUL_LUT: u32 = 6;
}

const PRODUCT_DP4A: &str = include_str!("../wgsl/product_dp4a.wgsl");
const PRODUCT_LUT: &str = include_str!("../wgsl/product_lut.wgsl");
const GEMM_COMMON: &str = include_str!("../wgsl/gemm_common.wgsl");
const GEMM_UNITS: &str = include_str!("../wgsl/gemm_units.wgsl");
const GEMM_SPLIT: &str = include_str!("../wgsl/gemm_split.wgsl");
const GEMM_I8: &str = include_str!("../wgsl/gemm_i8.wgsl");
const GEMM_TC: &str = include_str!("../wgsl/gemm_tc.wgsl");
const GEMM_TILE: &str = include_str!("../wgsl/gemm_tile.wgsl");
const PEAK: &str = include_str!("../wgsl/peak.wgsl");
const PEAK_TC: &str = include_str!("../wgsl/peak_tc.wgsl");
const EXACT_F32: &str = include_str!("../wgsl/exact_f32.wgsl");

const ARENA: &str = include_str!("../wgsl/arena.wgsl");
const STEP_OPS: &str = include_str!("../wgsl/step_ops.wgsl");
/// The op table's parameter slots and the definitions' constants (generated from
/// `lockstep_luts::ops`; a test keeps it current).
const GENERATED_OPS: &str = include_str!("../wgsl/generated_ops.wgsl");

/// The record binding, its reader `pw` and the names of its last words ([`step_params`]).
fn record_prelude() -> String {
    use step_params as p;
    format!(
        "@group(0) @binding(0) var<uniform> params: array<vec4<u32>, {}>;\n\
         const P_FLAGS: u32 = {}u;\nconst P_PART: u32 = {}u;\nconst P_OP_INDEX: u32 = {}u;\nconst P_ZERO: u32 = {}u;\n\
         fn pw(i: u32) -> u32 {{\n    return params[i >> 2u][i & 3u];\n}}\n",
        p::WORDS / 4,
        p::FLAGS,
        p::PART,
        p::OP_INDEX,
        p::ZERO
    )
}

impl Kernel {
    /// A path-ceiling kernel's ([`Kernel::Peak`], [`Kernel::PeakTc`]) workgroup: its invocations
    /// (one dimension) and the int8 operations, a multiply and an add each, it makes.
    pub fn peak_workgroup(self) -> Option<(u32, u64)> {
        match self {
            // Eight `dot4` chains, four multiply-adds each, every round.
            Kernel::Peak => Some((PEAK_WORKGROUP, u64::from(PEAK_WORKGROUP * PEAK_ITERATIONS) * 8 * 4 * 2)),
            Kernel::PeakTc(c) => Some((
                PEAK_TC_SUBGROUPS * c.subgroup,
                u64::from(PEAK_TC_SUBGROUPS * PEAK_CALLS * PEAK_TC_MULADDS) * u64::from(c.fm * c.fn_ * c.fk) * 2,
            )),
            _ => None,
        }
    }

    /// The entry point's name.
    pub fn entry_point(self) -> &'static str {
        match self {
            Kernel::GemmUnits => "gemm_units",
            Kernel::GemmUnitsSplit => "gemm_units_split",
            Kernel::GemmTc(_) => "gemm_tc",
            Kernel::GemmI8 => "gemm_i8",
            Kernel::Peak => "peak",
            Kernel::PeakTc(_) => "peak_tc",
            Kernel::Step(k) => k.entry_point(),
        }
    }
}

/// The complete WGSL module for `kernel` with `product`. `tile` matters only for
/// [`Kernel::GemmUnits`]: the split kernel's shape is fixed ([`SPLIT_TILE`]), and the cooperative
/// kernels carry their [`CoopTile`] (a `GemmTc` whose tile has no epilogue panics). `product`
/// does not matter for the step kernels (one module holds them all; each is built from it by its
/// entry point) nor for the cooperative ones (their portable bodies call `dot4I8Packed`: the DP4A
/// snippet, whose `requires` they need).
pub fn source(kernel: Kernel, product: Product, tile: Tile) -> String {
    let product_src = match product {
        Product::Dp4a => PRODUCT_DP4A,
        Product::Lut => PRODUCT_LUT,
    };
    match kernel {
        Kernel::GemmUnits => format!(
            "{product_src}\nconst TM: u32 = {}u;\nconst TN: u32 = {}u;\nconst WX: u32 = {}u;\nconst WY: u32 = {}u;\nconst KB: u32 = {}u;\n\n{}\n{GENERATED_OPS}\n{EXACT_F32}\n{ARENA}\n{GEMM_COMMON}\n{GEMM_TILE}\n{GEMM_UNITS}",
            tile.tm, tile.tn, tile.wx, tile.wy, tile.kb, record_prelude()
        ),
        Kernel::GemmUnitsSplit => {
            format!("{product_src}\n{}\n{GENERATED_OPS}\n{EXACT_F32}\n{ARENA}\n{GEMM_COMMON}\n{GEMM_SPLIT}", record_prelude())
        }
        Kernel::GemmTc(coop) => {
            let e = coop.epilogue().unwrap_or_else(|| panic!("{coop:?} has no epilogue tile"));
            let CoopTile { fm, fn_, fk, fr, fc, sr, sc, subgroup } = coop;
            format!(
                "{PRODUCT_DP4A}\nconst TM: u32 = {}u;\nconst TN: u32 = {}u;\nconst WX: u32 = {}u;\nconst WY: u32 = {}u;\nconst SUMS_STRIDE: u32 = {}u;\n\
                 const FM: u32 = {fm}u;\nconst FN: u32 = {fn_}u;\nconst FK: u32 = {fk}u;\nconst FR: u32 = {fr}u;\nconst FC: u32 = {fc}u;\n\
                 const SR: u32 = {sr}u;\nconst SC: u32 = {sc}u;\nconst SUBGROUP: u32 = {subgroup}u;\n\n{}\n{GENERATED_OPS}\n{EXACT_F32}\n{ARENA}\n{GEMM_COMMON}\n{GEMM_TILE}\n{GEMM_TC}",
                e.tm, e.tn, e.wx, e.wy, coop.sums_stride(), record_prelude()
            )
        }
        Kernel::GemmI8 => format!("{product_src}\n{GEMM_I8}"),
        Kernel::Peak => format!("{product_src}\nconst PEAK_ITERATIONS: u32 = {PEAK_ITERATIONS}u;\n{PEAK}"),
        Kernel::PeakTc(coop) => format!(
            "{PRODUCT_DP4A}\nconst FM: u32 = {}u;\nconst FN: u32 = {}u;\nconst FK: u32 = {}u;\nconst SUBGROUP: u32 = {}u;\n\
             const SUBGROUPS: u32 = {PEAK_TC_SUBGROUPS}u;\nconst PEAK_CALLS: u32 = {PEAK_CALLS}u;\nconst PEAK_SEED_MASK: u32 = {PEAK_SEED_MASK:#x}u;\n{PEAK_TC}",
            coop.fm, coop.fn_, coop.fk, coop.subgroup
        ),
        Kernel::Step(_) => format!("{}\n{GENERATED_OPS}\n{EXACT_F32}\n{ARENA}\n{STEP_OPS}", record_prelude()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(kernel: Kernel, product: Product, tile: Tile) -> naga::Module {
        let src = source(kernel, product, tile);
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{kernel:?}/{product:?}/{tile:?}: {}", e.emit_to_string(&src)));
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{kernel:?}/{product:?}/{tile:?}: {}", e.emit_to_string(&src)));
        module
    }

    #[test]
    fn every_kernel_product_and_tile_validates() {
        for product in [Product::Dp4a, Product::Lut] {
            validate(Kernel::GemmI8, product, TILES[0]);
            let split = validate(Kernel::GemmUnitsSplit, product, TILES[0]);
            assert_eq!(split.entry_points[0].name, Kernel::GemmUnitsSplit.entry_point());
            assert_eq!(split.entry_points[0].workgroup_size, [256, 1, 1]);
            // Its workgroup memory (tiles, exponents, block sums) fits lavapipe's 32 KiB.
            let (rows, cols) = SPLIT_TILE;
            let words = (rows + cols) * (8 + 1) * SPLIT_SLICES + SPLIT_SLICES * rows * cols;
            assert!(words * 4 <= 32 * 1024, "{words} words");
            assert!(TILES.last().unwrap().workgroup_bytes() <= PORTABLE_WORKGROUP_BYTES);
            for &tile in TILES {
                assert!(tile.tm % 4 == 0 && tile.tn % 4 == 0, "{tile:?}: the kernel reads 4 rows at a time");
                let module = validate(Kernel::GemmUnits, product, tile);
                let entry = &module.entry_points[0];
                assert_eq!(entry.name, Kernel::GemmUnits.entry_point());
                assert_eq!(entry.workgroup_size, [tile.wx, tile.wy, 1]);
                // Every tile fits the 32 KiB that lavapipe offers (NVIDIA: 48 KiB), so CI runs
                // them all; a plugin still checks the device's limit before it picks one.
                assert!(tile.workgroup_bytes() <= 32 * 1024, "{tile:?}");
            }
        }
    }

    #[test]
    fn the_cooperative_kernel_validates_for_every_shape_a_driver_reports() {
        // NVIDIA (H200) reports 16 × 16 × 32 and 16 × 8 × 32 with 32-wide subgroups; lavapipe
        // 26 reports 8 × 8 × 8 with 8-wide ones.
        for (fm, fn_, fk, subgroup) in [(16, 16, 32, 32), (16, 8, 32, 32), (8, 8, 8, 8)] {
            let coop = coop_tile(fm, fn_, fk, subgroup);
            let e = coop.epilogue().unwrap_or_else(|| panic!("{coop:?}"));
            assert_eq!((e.rows(), e.cols(), e.wx * e.wy), (coop.rows(), coop.cols(), coop.threads()), "{coop:?}");
            // lavapipe offers 32 KiB (its tiles take 10), NVIDIA 48 KiB.
            assert!(coop.workgroup_bytes() <= if subgroup == 8 { 32 } else { 48 } * 1024, "{coop:?}");
            assert_eq!(coop.sums_stride() % 4, 0);
            let module = validate(Kernel::GemmTc(coop), Product::Dp4a, TILES[0]);
            let entry = &module.entry_points[0];
            assert_eq!(entry.name, "gemm_tc");
            assert_eq!(entry.workgroup_size, [e.wx * e.wy, 1, 1]);
            assert!(module.functions.iter().any(|(_, f)| f.name.as_deref() == Some("tc_block_sums")));
        }
        assert_eq!(coop_tile(8, 8, 12, 8).epilogue(), None, "k's block of 32 is not a whole number of 12");
        for (fm, fn_, fk, subgroup) in [(16, 16, 32, 32), (8, 8, 8, 8)] {
            let kernel = Kernel::PeakTc(coop_tile(fm, fn_, fk, subgroup));
            let module = validate(kernel, Product::Dp4a, TILES[0]);
            assert_eq!(module.entry_points[0].workgroup_size, [kernel.peak_workgroup().unwrap().0, 1, 1]);
        }
        for product in [Product::Dp4a, Product::Lut] {
            let module = validate(Kernel::Peak, product, TILES[0]);
            assert_eq!(module.entry_points[0].workgroup_size, [Kernel::Peak.peak_workgroup().unwrap().0, 1, 1]);
        }
    }

    #[test]
    fn the_dp4a_kernel_uses_the_dot_product_and_the_lut_kernel_the_table() {
        let dp4a = source(Kernel::GemmUnits, Product::Dp4a, TILES[0]);
        assert!(dp4a.starts_with("// The exact int8 product"));
        assert!(dp4a.contains("requires packed_4x8_integer_dot_product;"));
        assert!(!dp4a.contains("mul_lut"));
        let lut = source(Kernel::GemmUnits, Product::Lut, TILES[0]);
        assert!(lut.contains("var<storage, read> mul_lut: array<u32, 32768>"));
        assert!(!lut.contains("dot4I8Packed"));
        // Both lower to SPIR-V; the DP4A one through the integer dot product instruction.
        for (src, needle) in [(&dp4a, Some(spirv_op_sdot())), (&lut, None)] {
            let words = spirv(src, false);
            let has_sdot = words.iter().any(|&w| w & 0xffff == needle.unwrap_or(u32::MAX));
            assert_eq!(has_sdot, needle.is_some());
        }
    }

    /// The prelude is what the op table says today: when the table changed, this rewrites the
    /// file and fails, so the next run passes and the change is committed with the table.
    #[test]
    fn the_generated_prelude_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/wgsl/generated_ops.wgsl");
        let fresh = lockstep_luts::ops::generate::wgsl_prelude();
        if std::fs::read_to_string(path).unwrap_or_default() != fresh {
            std::fs::write(path, fresh).unwrap();
            panic!("{path} was stale and has been rewritten from the op table: run the tests again and commit it");
        }
    }

    #[test]
    fn the_step_module_validates_with_every_entry_point() {
        let module = validate(Kernel::Step(StepKernel::Gelu), Product::Dp4a, TILES[0]);
        for &kernel in StepKernel::ALL {
            let name = Kernel::Step(kernel).entry_point();
            let entry = module.entry_points.iter().find(|e| e.name == name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(entry.workgroup_size, [kernel.workgroup(), 1, 1], "{name}");
        }
        assert_eq!(module.entry_points.len(), StepKernel::ALL.len());
    }

    /// The arena's pages as the host lays them out: the page shift, the bindings after `page0`,
    /// and a `PAGES` override in every module that addresses the arena; and the quantizer's
    /// rows per workgroup, which the host's grid counts on.
    #[test]
    fn the_kernels_constants_match_the_host_layout() {
        let module = validate(Kernel::Step(StepKernel::Gelu), Product::Lut, TILES[0]);
        let shift = module
            .constants
            .iter()
            .find(|(_, c)| c.name.as_deref() == Some("PAGE_SHIFT"))
            .map(|(_, c)| match module.global_expressions[c.init] {
                naga::Expression::Literal(naga::Literal::U32(v)) => v,
                ref other => panic!("PAGE_SHIFT is {other:?}"),
            })
            .expect("PAGE_SHIFT");
        assert_eq!(shift, PAGE_SHIFT);
        let quant_rows = module.constants.iter().find(|(_, c)| c.name.as_deref() == Some("QUANT_ROWS"));
        let quant_rows = quant_rows.map(|(_, c)| &module.global_expressions[c.init]);
        assert!(
            matches!(quant_rows, Some(naga::Expression::Literal(naga::Literal::U32(QUANT_ROWS)))),
            "{quant_rows:?}"
        );
        assert!((MAX_PAGES as u64) << PAGE_SHIFT <= 1 << 32, "every page's words have a 32-bit address");
        for kernel in [Kernel::Step(StepKernel::Gelu), Kernel::GemmUnits, Kernel::GemmUnitsSplit] {
            let module = validate(kernel, Product::Dp4a, TILES[0]);
            let binding_of = |name: &str| {
                let (_, var) = module.global_variables.iter().find(|(_, v)| v.name.as_deref() == Some(name))?;
                var.binding.as_ref().map(|b| (b.group, b.binding))
            };
            assert!(binding_of("page0").is_some(), "{kernel:?}");
            for (page, &binding) in PAGE_BINDINGS.iter().enumerate() {
                assert_eq!(binding_of(&format!("page{}", page + 1)), Some((0, binding)), "{kernel:?}");
            }
            assert!(module.overrides.iter().any(|(_, o)| o.name.as_deref() == Some("PAGES")), "{kernel:?}");
        }
        assert_eq!(PAGE_BINDINGS.len() + 1, MAX_PAGES);
    }

    /// SPIR-V of the module `src`, as naga emits it for Vulkan once the pipeline has set the
    /// `SOFT_FLOAT` override (as wgpu does before it writes SPIR-V).
    fn spirv(src: &str, soft_float: bool) -> Vec<u32> {
        let module = naga::front::wgsl::parse_str(src).unwrap();
        let flags = naga::valid::ValidationFlags::all();
        let info = naga::valid::Validator::new(flags, naga::valid::Capabilities::all()).validate(&module).unwrap();
        let mut constants = naga::back::PipelineConstants::default();
        if module.overrides.iter().any(|(_, o)| o.name.as_deref() == Some("SOFT_FLOAT")) {
            constants.insert("SOFT_FLOAT".into(), if soft_float { 1.0 } else { 0.0 });
        }
        let (module, info) =
            naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants).unwrap();
        let options = naga::back::spv::Options { capabilities: None, ..naga::back::spv::Options::default() };
        naga::back::spv::write_vec(&module, &info, &options, None).unwrap()
    }

    /// The instructions of a SPIR-V module: (opcode, operand words).
    fn instructions(words: &[u32]) -> Vec<(u32, &[u32])> {
        let mut out = Vec::new();
        let mut at = 5; // the header
        while at < words.len() {
            let count = (words[at] >> 16) as usize;
            out.push((words[at] & 0xffff, &words[at + 1..at + count]));
            at += count;
        }
        out
    }

    /// What the exact arithmetic promises, checked on the SPIR-V the step kernels (and the unit
    /// kernel's epilogue) become: no float division, no float function of GLSL.std.450 (square
    /// root, FMA, exp, min/max, …: the Vulkan precision rules let a driver round those its own
    /// way), and no float product that feeds an addition, subtraction or another product
    /// directly (each becomes bits XORed with `opaque_zero`, the contraction barrier). The unit kernel's fast
    /// epilogue is the one place a product meets an addition, by design: its products are exact.
    #[test]
    fn the_exact_kernels_have_no_division_no_float_builtins_and_no_fusable_product() {
        const OP_EXT_INST: u32 = 12;
        const OP_BITCAST: u32 = 124;
        const OP_FADD: u32 = 129;
        const OP_FSUB: u32 = 131;
        const OP_FMUL: u32 = 133;
        const OP_FDIV: u32 = 136;
        const OP_FREM: u32 = 140;
        const OP_FMOD: u32 = 141;
        const OP_BITWISE_XOR: u32 = 198;
        // GLSL.std.450 instructions on integers: SAbs, SSign, UMin, SMin, UMax, SMax, UClamp,
        // SClamp, FindILsb, FindSMsb, FindUMsb.
        const INTEGER_EXT: [u32; 11] = [5, 7, 38, 39, 41, 42, 44, 45, 73, 74, 75];
        for (kernel, product_meets_add) in
            [(Kernel::Step(StepKernel::Adam), false), (Kernel::GemmUnits, true), (Kernel::GemmUnitsSplit, true)]
        {
            let words = spirv(&source(kernel, Product::Lut, TILES[0]), false);
            let code = instructions(&words);
            let products: std::collections::HashSet<u32> =
                code.iter().filter(|(op, _)| *op == OP_FMUL).map(|(_, w)| w[1]).collect();
            assert!(!products.is_empty(), "{kernel:?}: no hardware product at all?");
            let mut fused_candidates = 0;
            for (op, w) in &code {
                assert!(![OP_FDIV, OP_FREM, OP_FMOD].contains(op), "{kernel:?}: float division (opcode {op})");
                if *op == OP_EXT_INST {
                    assert!(INTEGER_EXT.contains(&w[3]), "{kernel:?}: GLSL.std.450 instruction {} on floats", w[3]);
                }
                if [OP_FADD, OP_FSUB, OP_FMUL].contains(op) && w[2..4].iter().any(|id| products.contains(id)) {
                    fused_candidates += 1;
                }
            }
            // Each product's bits meet `opaque_zero` in an XOR before anything else sees them.
            let product_bits: std::collections::HashSet<u32> = code
                .iter()
                .filter(|(op, w)| *op == OP_BITCAST && products.contains(&w[2]))
                .map(|(_, w)| w[1])
                .collect();
            if !product_meets_add {
                assert_eq!(product_bits.len(), products.len(), "{kernel:?}: a product is used other than as bits");
                for (op, w) in &code {
                    if w.len() > 2 && w[2..].iter().any(|id| product_bits.contains(id)) {
                        assert_eq!(*op, OP_BITWISE_XOR, "{kernel:?}: a product's bits reach opcode {op} unmasked");
                    }
                }
            }
            if product_meets_add {
                assert!(fused_candidates > 0, "{kernel:?}: the fast epilogue's exact products are expected");
            } else {
                assert_eq!(fused_candidates, 0, "{kernel:?}: a product feeds float arithmetic directly");
            }
        }
    }

    /// `OpSDot` (SPV_KHR_integer_dot_product), opcode 4450.
    fn spirv_op_sdot() -> u32 {
        4450
    }
}
