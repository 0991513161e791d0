//! `GpuUnits`: one wgpu device with the units' kernels, ABI 1's products and (in `step.rs`)
//! ABI 2's buffers and ops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockstep_luts::units::{blocks_for, UnitError, BLOCK};
use lockstep_shaders::{
    binding, step_binding, step_params, CoopTile, Kernel, Product, Tile, GEMM_I8_WORKGROUP, PAGE_BINDINGS, TILES,
};
use wgpu::util::DeviceExt;

mod step;

/// Why a GPU call failed.
#[derive(Debug)]
pub enum GpuError {
    /// No usable adapter, or the chosen one lacks what the product needs.
    Unavailable(String),
    /// The device or driver failed (validation, out of memory, lost device, timeout).
    Device(String),
    /// The shape is outside what one dispatch can address.
    Shape(String),
    /// The units refuse the input (a NaN or ±Inf), as the reference does.
    Unit(UnitError),
    /// An op met a non-finite operand of a product on the device.
    NonFinite(String),
}

impl std::fmt::Display for GpuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuError::Unavailable(m) | GpuError::Device(m) | GpuError::Shape(m) | GpuError::NonFinite(m) => {
                f.write_str(m)
            }
            GpuError::Unit(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for GpuError {}

/// What forms an instance's exact block sums (the rest of the step is the same WGSL for all).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Engine {
    /// Lookups in the product table, through WGSL (`lut`).
    Lut,
    /// The hardware int8 dot product, `dot4I8Packed`, through WGSL (`dp4a`).
    Dp4a,
    /// Integer cooperative matrices (tensor cores) through SPIR-V passthrough (`tc`); the split
    /// kernel and the integer product as `dp4a`.
    Tc,
}

impl Engine {
    /// The WGSL product snippet of its WGSL kernels.
    pub fn product(self) -> Product {
        match self {
            Engine::Lut => Product::Lut,
            Engine::Dp4a | Engine::Tc => Product::Dp4a,
        }
    }
}

/// How to create a [`GpuUnits`].
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Refuse software adapters.
    pub hardware_only: bool,
    /// Force a tile (benchmarks sweep them); `None` picks by adapter type.
    pub tile: Option<Tile>,
    /// With `tile` forced, the narrow tile for products `tile` would cover with fewer than
    /// `NARROW_BELOW_GROUPS` workgroups (tests run the choice on any adapter); `None`: `tile`
    /// for every product. Without `tile`, the adapter type decides both.
    pub narrow: Option<Tile>,
    /// Use the adapter whose name contains this (case-insensitive); `None`: the best one.
    pub adapter: Option<String>,
    /// Quantizer threads; 0 means all available.
    pub threads: usize,
    /// Every add and multiply of the exact arithmetic on the integer routines instead of the
    /// hardware where it is exact (same bits, slower): how tests check those routines on every
    /// input, not only the subnormal ones the hardware path hands them.
    pub soft_float: bool,
    /// Hold arena pages to this many words, below the device's largest binding (tests make
    /// a small model take several pages); `None`: the binding's size.
    pub page_words: Option<u64>,
}

/// What the chosen adapter is.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub software: bool,
}

#[derive(Default)]
struct Buffers {
    /// Uniform records, 256 bytes apart (dynamic offsets).
    params: Option<wgpu::Buffer>,
    a: Option<wgpu::Buffer>,
    b: Option<wgpu::Buffer>,
    a_exp: Option<wgpu::Buffer>,
    b_exp: Option<wgpu::Buffer>,
    out: Option<wgpu::Buffer>,
    staging: Option<wgpu::Buffer>,
    /// ABI 2's quantized operands (the unit kernel reads `a`, `b`, `a_exp`, `b_exp` for both
    /// paths), the cross-entropy's per-row losses, and the status word with its read-back.
    scratch: Option<wgpu::Buffer>,
    /// Bound where the arena has no page (the kernels never address it).
    page_stand_in: Option<wgpu::Buffer>,
    status: Option<wgpu::Buffer>,
    status_staging: Option<wgpu::Buffer>,
}

/// Host-side quantized operands, kept between calls (they only grow).
#[derive(Default)]
struct HostScratch {
    a_q: Vec<i8>,
    a_exp: Vec<i32>,
    b_q: Vec<i8>,
    b_exp: Vec<i32>,
}

/// One GPU device running the units with one product kind.
pub struct GpuUnits {
    product: Product,
    /// The `tc` engine's cooperative tile (its unit kernel is [`Kernel::GemmTc`], on `tile`,
    /// which is this tile's epilogue).
    coop: Option<CoopTile>,
    tile: Tile,
    /// The tile for products `tile` would cover with few workgroups (`None`: `tile` for all;
    /// a forced tile and software adapters have none).
    narrow: Option<Tile>,
    threads: usize,
    soft_float: bool,
    adapter: AdapterSummary,
    device: wgpu::Device,
    queue: wgpu::Queue,
    /// The pipeline cache, built on first use: by kernel, tile (the unit kernel's; the others
    /// are built with the instance's) and whether it chooses among several arena pages.
    pipelines: HashMap<(Kernel, Tile, bool), wgpu::ComputePipeline>,
    /// Explicit layouts (dynamic parameter offsets) of the unit kernel and the step kernels.
    gemm_layout: Layout,
    step_layout: Layout,
    /// The path-ceiling kernels' layout: their output (and the product table, LUT).
    peak_layout: Layout,
    mul_lut: Option<wgpu::Buffer>,
    buffers: Buffers,
    arena: step::Arena,
    /// The most device memory held at once so far ([`GpuUnits::peak_device_bytes`]).
    peak_bytes: u64,
    host: HostScratch,
    /// Errors wgpu reports outside an error scope, surfaced on the next call.
    uncaptured: Arc<Mutex<Vec<String>>>,
}

/// A tile the host asked for, checked: each field 1..=64, at most 256 invocations. The tile
/// decides only which invocation computes an output, never the order of its additions, so it
/// cannot change a bit (the `tiles` test runs every tile in `TILES`).
pub fn requested_tile([tm, tn, wx, wy, kb]: [u32; 5]) -> Result<Tile, GpuError> {
    if [tm, tn, wx, wy, kb].iter().all(|v| (1..=64).contains(v)) && wx * wy <= 256 {
        Ok(Tile { tm, tn, wx, wy, kb })
    } else {
        Err(GpuError::Unavailable(format!(
            "tile {tm}x{tn}x{wx}x{wy}x{kb} is not TMxTNxWXxWYxKB with fields 1..=64 and at most 256 invocations"
        )))
    }
}

fn rank(device_type: wgpu::DeviceType) -> u8 {
    match device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

/// True when the adapter executes `dot4I8Packed` natively (see the crate docs).
fn has_integer_dot_product(adapter: &wgpu::Adapter) -> bool {
    // SAFETY: the hal adapter is only read, while `adapter` keeps it alive.
    let vulkan = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() };
    match vulkan {
        Some(hal) => {
            let caps = hal.physical_device_capabilities();
            let api = caps.properties().api_version;
            let (major, minor) = (api >> 22, (api >> 12) & 0x3ff);
            (major, minor) >= (1, 3) || caps.supports_extension(c"VK_KHR_shader_integer_dot_product")
        }
        // Metal and D3D12 have no such report through wgpu; they run naga's polyfill,
        // which is exact but not DP4A.
        None => false,
    }
}

/// The int8 cooperative-matrix shapes `(M, N, K)` the adapter's Vulkan driver reports for
/// s8 × s8 → s32 products at subgroup scope without saturation (what exact block sums need),
/// asked of the driver itself: wgpu 30 lists only f16 and f32 configurations.
pub fn int8_cooperative_shapes(adapter: &wgpu::Adapter) -> Vec<(u32, u32, u32)> {
    use ash::vk::{ComponentTypeKHR as C, ScopeKHR};
    // SAFETY: the hal adapter, its instance and physical device are only read, while `adapter`
    // keeps them alive.
    let Some(hal) = (unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }) else {
        return Vec::new();
    };
    if !hal.physical_device_capabilities().supports_extension(c"VK_KHR_cooperative_matrix") {
        return Vec::new();
    }
    let shared = hal.shared_instance();
    let extension = ash::khr::cooperative_matrix::Instance::new(shared.entry(), shared.raw_instance());
    // SAFETY: the extension is present on this physical device (checked above).
    let reported = unsafe { extension.get_physical_device_cooperative_matrix_properties(hal.raw_physical_device()) };
    reported
        .unwrap_or_default()
        .iter()
        .filter(|p| {
            (p.a_type, p.b_type, p.c_type, p.result_type) == (C::SINT8, C::SINT8, C::SINT32, C::SINT32)
                && p.scope == ScopeKHR::SUBGROUP
                && p.saturating_accumulation == 0
        })
        .map(|p| (p.m_size, p.n_size, p.k_size))
        .collect()
}

/// The cooperative tile the `tc` engine runs on `adapter`, or why there is none: an int8 shape
/// whose k divides the block of 32 (the largest output tile first), a fixed subgroup size, and
/// wgpu's cooperative-matrix, subgroup and passthrough features (which make it enable the
/// driver's extension).
fn cooperative_tile(adapter: &wgpu::Adapter) -> Result<CoopTile, String> {
    let info = adapter.get_info();
    let shapes = int8_cooperative_shapes(adapter);
    let mut usable: Vec<_> =
        shapes.iter().copied().filter(|&(m, n, k)| k > 0 && 32 % k == 0 && m > 0 && n > 0).collect();
    usable.sort_by_key(|&(m, n, k)| std::cmp::Reverse((m * n, k)));
    let Some(&(m, n, k)) = usable.first() else {
        return Err(if shapes.is_empty() {
            "reports no int8 cooperative matrix (VK_KHR_cooperative_matrix with s8 × s8 → s32 at subgroup scope)".into()
        } else {
            format!("reports int8 cooperative matrices {shapes:?} (M, N, K), none with a K that divides 32")
        });
    };
    if info.subgroup_min_size != info.subgroup_max_size {
        return Err(format!(
            "runs subgroups of {} to {} invocations; the cooperative kernel needs one fixed size",
            info.subgroup_min_size, info.subgroup_max_size
        ));
    }
    let wanted = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::SUBGROUP
        | wgpu::Features::PASSTHROUGH_SHADERS;
    if !adapter.features().contains(wanted) {
        return Err(format!("lacks wgpu features {:?}", wanted - adapter.features()));
    }
    let coop = lockstep_shaders::coop_tile(m, n, k, info.subgroup_min_size);
    coop.epilogue().map(|_| coop).ok_or_else(|| format!("has no epilogue tile for {coop:?}"))
}

fn summarize(adapter: &wgpu::Adapter) -> AdapterSummary {
    let info = adapter.get_info();
    AdapterSummary {
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
        software: info.device_type == wgpu::DeviceType::Cpu,
    }
}

fn storage(device: &wgpu::Device, label: &str, size: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: false })
}

/// Makes sure `slot` holds a buffer of at least `size` bytes (rounded up; never shrinks).
fn ensure(
    device: &wgpu::Device,
    slot: &mut Option<wgpu::Buffer>,
    label: &str,
    size: u64,
    usage: wgpu::BufferUsages,
) -> wgpu::Buffer {
    let size = size.max(16).next_multiple_of(256);
    if slot.as_ref().is_none_or(|b| b.size() < size) {
        *slot = Some(storage(device, label, size, usage));
    }
    slot.clone().expect("just filled")
}

impl GpuUnits {
    /// Opens the best adapter for `product` and builds nothing else until first use.
    pub fn new(engine: Engine, options: &GpuOptions) -> Result<Self, GpuError> {
        let product = engine.product();
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
        let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        if adapters.is_empty() {
            return Err(GpuError::Unavailable(
                "no GPU adapter found (no Vulkan, Metal or D3D12 driver; on Debian, `apt-get install mesa-vulkan-drivers` gives the lavapipe software adapter)".into(),
            ));
        }
        adapters.sort_by_key(|a| rank(a.get_info().device_type));
        let seen: Vec<String> = adapters
            .iter()
            .map(|a| {
                let i = a.get_info();
                format!("{} ({:?}, {:?})", i.name, i.backend, i.device_type)
            })
            .collect();
        if let Some(wanted) = &options.adapter {
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(&wanted.to_lowercase()));
            if adapters.is_empty() {
                return Err(GpuError::Unavailable(format!("adapter {wanted:?} matches none of: {}", seen.join(", "))));
            }
        }
        if options.hardware_only {
            adapters.retain(|a| a.get_info().device_type != wgpu::DeviceType::Cpu);
            if adapters.is_empty() {
                return Err(GpuError::Unavailable(format!(
                    "no hardware GPU adapter (only software ones: {})",
                    seen.join(", ")
                )));
            }
        }
        let mut coop = None;
        let adapter = match engine {
            Engine::Dp4a => adapters.into_iter().find(has_integer_dot_product).ok_or_else(|| {
                GpuError::Unavailable(format!(
                    "no adapter with a native integer dot product (packed_4x8_integer_dot_product needs Vulkan 1.3 or VK_KHR_shader_integer_dot_product); adapters: {}",
                    seen.join(", ")
                ))
            })?,
            Engine::Tc => {
                let mut refusals = Vec::new();
                let mut found = None;
                for adapter in adapters {
                    let info = adapter.get_info();
                    let tile = if has_integer_dot_product(&adapter) {
                        cooperative_tile(&adapter)
                    } else {
                        Err("has no native integer dot product (its split kernel's)".into())
                    };
                    match tile {
                        Ok(tile) => {
                            found = Some((adapter, tile));
                            break;
                        }
                        Err(why) => refusals.push(format!("{} ({}) {why}", info.name, info.driver_info)),
                    }
                }
                let (adapter, tile) = found.ok_or_else(|| {
                    GpuError::Unavailable(format!(
                        "no adapter offers exact int8 tensor cores: {}",
                        refusals.join("; ")
                    ))
                })?;
                coop = Some(tile);
                adapter
            }
            Engine::Lut => adapters.into_iter().next().expect("checked non-empty"),
        };
        let summary = summarize(&adapter);
        let workgroup_limit = adapter.limits().max_compute_workgroup_storage_size;
        let (tile, narrow) = match (coop, options.tile) {
            // The cooperative kernel's epilogue tile follows from its cooperative tile.
            (Some(coop), _) => (coop.epilogue().expect("cooperative_tile checked it"), None),
            (None, Some(tile)) => (tile, options.narrow),
            (None, None) if summary.software => (*TILES.last().expect("tiles"), None),
            (None, None) => {
                // Measured on an H200 (docs/PERFORMANCE.md); both products prefer the same.
                let fits = |t: &Tile| t.workgroup_bytes() <= workgroup_limit;
                let narrow = Some(lockstep_shaders::NARROW_TILE).filter(fits);
                if fits(&lockstep_shaders::DEFAULT_TILE) {
                    (lockstep_shaders::DEFAULT_TILE, narrow)
                } else {
                    (*TILES.iter().find(|t| fits(t)).unwrap_or(TILES.last().expect("tiles")), None)
                }
            }
        };
        if let Some(coop) = coop.filter(|c| c.workgroup_bytes() > workgroup_limit) {
            return Err(GpuError::Unavailable(format!(
                "{}: the cooperative tile {coop:?} needs {} bytes of workgroup memory, the device offers {workgroup_limit}",
                summary.name,
                coop.workgroup_bytes()
            )));
        }
        if let Some(tile) = [Some(tile), narrow].into_iter().flatten().find(|t| t.workgroup_bytes() > workgroup_limit) {
            return Err(GpuError::Unavailable(format!(
                "{}: tile {tile:?} needs {} bytes of workgroup memory, the device offers {workgroup_limit}",
                summary.name,
                tile.workgroup_bytes()
            )));
        }
        // The unit kernel binds nine storage buffers with the product table (the operands and
        // their exponents, the table, four arena pages); every desktop driver offers far more
        // than WebGPU's default eight (lavapipe 32).
        const STORAGE_BUFFERS: u32 = 9;
        if adapter.limits().max_storage_buffers_per_shader_stage < STORAGE_BUFFERS {
            return Err(GpuError::Unavailable(format!(
                "{}: the kernels bind {STORAGE_BUFFERS} storage buffers, the device offers {}",
                summary.name,
                adapter.limits().max_storage_buffers_per_shader_stage
            )));
        }
        let needed = wgpu::Limits {
            max_storage_buffers_per_shader_stage: STORAGE_BUFFERS,
            max_storage_buffer_binding_size: adapter.limits().max_storage_buffer_binding_size,
            max_buffer_size: adapter.limits().max_buffer_size,
            max_compute_workgroup_storage_size: adapter.limits().max_compute_workgroup_storage_size,
            ..wgpu::Limits::default()
        };
        let required_features = if coop.is_some() {
            wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
                | wgpu::Features::SUBGROUP
                | wgpu::Features::PASSTHROUGH_SHADERS
        } else {
            wgpu::Features::empty()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("lockstep units"),
            required_features,
            required_limits: needed,
            experimental_features: if coop.is_some() {
                // SAFETY: the one experimental feature asked for (cooperative matrices) is used
                // only through the `tc` kernel's SPIR-V, whose every product the gate checks.
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        }))
        .map_err(|e| GpuError::Unavailable(format!("{}: cannot open the device: {e}", summary.name)))?;
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(error.to_string());
        }));
        let mul_lut = (product == Product::Lut).then(|| {
            // The committed table file, byte for byte.
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("mul_lut"),
                contents: lockstep_luts::table::MUL_LUT_FILE,
                usage: wgpu::BufferUsages::STORAGE,
            })
        });
        let threads = match options.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let (gemm_layout, step_layout, peak_layout) = layouts(&device, product);
        let binding = device.limits().max_storage_buffer_binding_size.min(device.limits().max_buffer_size);
        let arena = step::Arena::new(options.page_words.map_or(binding, |words| binding.min(words * 4)));
        Ok(Self {
            product,
            coop,
            tile,
            narrow,
            threads,
            soft_float: options.soft_float,
            adapter: summary,
            device,
            queue,
            pipelines: HashMap::new(),
            gemm_layout,
            step_layout,
            peak_layout,
            peak_bytes: 0,
            mul_lut,
            buffers: Buffers::default(),
            arena,
            host: HostScratch::default(),
            uncaptured,
        })
    }

    pub fn tile(&self) -> Tile {
        self.tile
    }

    /// The most bytes of device buffers this instance has held at once (two arenas while one
    /// grows into the other included).
    pub fn peak_device_bytes(&self) -> u64 {
        self.peak_bytes.max(self.device_bytes())
    }

    /// Bytes of device buffers this instance holds: the arena, scratch and staging.
    pub fn device_bytes(&self) -> u64 {
        let b = &self.buffers;
        let held =
            [&b.params, &b.a, &b.b, &b.a_exp, &b.b_exp, &b.out, &b.staging, &b.scratch, &b.status, &b.status_staging];
        held.iter().filter_map(|x| x.as_ref()).map(|x| x.size()).sum::<u64>()
            + self.arena.pages.iter().filter_map(|p| p.buffer.as_ref()).map(|x| x.size()).sum::<u64>()
            + self.mul_lut.as_ref().map_or(0, |x| x.size())
    }

    /// One line: adapter, backend, driver, tile, and the device memory held so far.
    pub fn describe(&self) -> String {
        let a = &self.adapter;
        let engine = self.coop.map_or(String::new(), |c| {
            format!(
                "int8 cooperative matrices {}x{}x{} in {}x{} fragments a subgroup of {}, ",
                c.fm, c.fn_, c.fk, c.fr, c.fc, c.subgroup
            )
        });
        format!(
            "{} ({}, {}, {}), {engine}tile {}x{} of {}x{} outputs, {} block(s) per stage{}, {:.1} MiB of device buffers (peak {:.1} MiB)",
            a.name,
            a.backend,
            a.device_type,
            a.driver,
            self.tile.rows(),
            self.tile.cols(),
            self.tile.tm,
            self.tile.tn,
            self.tile.kb,
            self.narrow.map_or(String::new(), |t| format!(
                " ({}x{} below {} workgroups)",
                t.rows(),
                t.cols(),
                lockstep_shaders::NARROW_BELOW_GROUPS
            )),
            self.device_bytes() as f64 / (1024.0 * 1024.0),
            self.peak_device_bytes() as f64 / (1024.0 * 1024.0)
        )
    }

    /// The pipeline of `kernel` (a unit kernel: on `tile`); `paged`: its `ld`/`st` choose among
    /// four arena pages (`arena.wgsl`'s `PAGES`), else they read the first page alone.
    fn pipeline(&mut self, kernel: Kernel, tile: Tile, paged: bool) -> Result<wgpu::ComputePipeline, GpuError> {
        let tile = if kernel == Kernel::GemmUnits { tile } else { self.tile };
        if let Some(p) = self.pipelines.get(&(kernel, tile, paged)) {
            return Ok(p.clone());
        }
        let pages = if paged { lockstep_shaders::MAX_PAGES as u32 } else { 1 };
        // The `tc` engine's kernels: SPIR-V with cooperative matrices, passed through.
        let cooperative = match kernel {
            Kernel::GemmTc(coop) => {
                let words = crate::coop::spirv(coop, self.soft_float, pages, &self.gemm_layout.vulkan);
                Some((words, coop.threads(), &self.gemm_layout.group))
            }
            Kernel::PeakTc(coop) => {
                let (threads, _) = kernel.peak_workgroup().expect("a path-ceiling kernel");
                Some((crate::coop::peak_spirv(coop, &self.peak_layout.vulkan), threads, &self.peak_layout.group))
            }
            _ => None,
        };
        if let Some((words, threads, layout)) = cooperative {
            let words = words.map_err(|e| GpuError::Device(e.to_string()))?;
            let pipeline = self.passthrough_pipeline(kernel.entry_point(), words, threads, layout)?;
            self.pipelines.insert((kernel, tile, paged), pipeline.clone());
            return Ok(pipeline);
        }
        let source = lockstep_shaders::source(kernel, self.product, tile);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        // SAFETY: runtime bounds checks are off. Every index the kernels compute is in range by
        // construction: rows and columns are guarded against m and n, words stay inside a row
        // of `blocks × 8` words (the buffers are sized from the same numbers), and table
        // indices are masked to 16 bits of a 65536-entry array.
        let module = unsafe {
            self.device.create_shader_module_trusted(
                wgpu::ShaderModuleDescriptor {
                    label: Some(kernel.entry_point()),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                },
                wgpu::ShaderRuntimeChecks::unchecked(),
            )
        };
        let overrides = crate::coop::unit_overrides(self.soft_float, pages);
        let bind_layout = match kernel {
            Kernel::GemmUnits | Kernel::GemmUnitsSplit | Kernel::GemmTc(_) => Some(&self.gemm_layout.group),
            Kernel::Peak | Kernel::PeakTc(_) => Some(&self.peak_layout.group),
            Kernel::Step(_) => Some(&self.step_layout.group),
            Kernel::GemmI8 => None,
        };
        let layout = bind_layout.map(|l| {
            self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(l)],
                immediate_size: 0,
            })
        });
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(kernel.entry_point()),
            layout: layout.as_ref(),
            module: &module,
            entry_point: Some(kernel.entry_point()),
            compilation_options: wgpu::PipelineCompilationOptions {
                // Only the modules with the exact arithmetic and the arena declare the overrides.
                constants: if matches!(kernel, Kernel::GemmI8 | Kernel::Peak) { &[] } else { &overrides },
                ..Default::default()
            },
            cache: None,
        });
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Device(format!("cannot build the {} kernel: {error}", kernel.entry_point())));
        }
        self.pipelines.insert((kernel, tile, paged), pipeline.clone());
        Ok(pipeline)
    }

    /// A pipeline of SPIR-V `words` (the `tc` engine's, from `coop`: naga's module with
    /// cooperative matrices spliced in) passed through to the driver: entry point `name`, a
    /// workgroup of `threads`, on `layout`.
    fn passthrough_pipeline(
        &self,
        name: &str,
        words: Vec<u32>,
        threads: u32,
        layout: &wgpu::BindGroupLayout,
    ) -> Result<wgpu::ComputePipeline, GpuError> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let entry = [wgpu::PassthroughShaderEntryPoint { name: name.into(), workgroup_size: (threads, 1, 1) }];
        // SAFETY: the words are naga's module for the kernel's WGSL (validated by naga) with one
        // function's body rewritten by `coop::splice` into cooperative-matrix instructions of
        // a shape the driver reported, on features this device enabled.
        let module = unsafe {
            self.device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                label: Some(name),
                entry_points: std::borrow::Cow::Borrowed(&entry),
                spirv: Some(std::borrow::Cow::Owned(words)),
                ..Default::default()
            })
        };
        let layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(layout)],
            immediate_size: 0,
        });
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: Some(&layout),
            module: &module,
            entry_point: Some(name),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Device(format!("cannot build the {name} kernel: {error}")));
        }
        Ok(pipeline)
    }

    /// The tiled unit kernel of this instance: the cooperative one for `tc`.
    fn unit_kernel(&self) -> Kernel {
        self.coop.map_or(Kernel::GemmUnits, Kernel::GemmTc)
    }

    /// Zero rows after the host-quantized operands, so the cooperative kernel's whole-tile reads
    /// stay inside the buffers (`gemm_tc.wgsl`); none for the other kernels.
    fn pad_for_tiles(&mut self, row_words: usize) {
        if self.coop.is_some() {
            let (rows, cols) = (self.tile.rows() as usize, self.tile.cols() as usize);
            let (a, b) = (self.host.a_q.len(), self.host.b_q.len());
            self.host.a_q.resize(a + rows * row_words * 4, 0);
            self.host.b_q.resize(b + cols * row_words * 4, 0);
        }
    }

    fn take_uncaptured(&self) -> Result<(), GpuError> {
        let mut errors = self.uncaptured.lock().unwrap_or_else(|p| p.into_inner());
        if errors.is_empty() {
            Ok(())
        } else {
            Err(GpuError::Device(errors.drain(..).collect::<Vec<_>>().join("; ")))
        }
    }

    fn check_shape(&self, m: usize, n: usize, row_words: usize) -> Result<(), GpuError> {
        let limit = self.device.limits().max_storage_buffer_binding_size;
        let biggest = [m * row_words * 4, n * row_words * 4, m * n * 4].into_iter().max().unwrap_or(0) as u64;
        let groups = [m.div_ceil(self.tile.rows() as usize), n.div_ceil(self.tile.cols() as usize)];
        if biggest > limit || groups.iter().any(|&g| g > 65535) || m * n >= 1 << 32 {
            return Err(GpuError::Shape(format!(
                "{m}x{n} with {row_words} words per row needs {biggest} bytes in one binding (limit {limit}) or too many workgroups"
            )));
        }
        Ok(())
    }

    /// Quantizes `values` (`rows × k`) into `q`/`exp`, splitting rows across threads.
    fn quantize(threads: usize, values: &[f32], rows: usize, k: usize, q: &mut Vec<i8>, exp: &mut Vec<i32>) -> bool {
        let blocks = blocks_for(k);
        q.resize(rows * blocks * BLOCK, 0);
        exp.resize(rows * blocks, 0);
        if k == 0 {
            return true;
        }
        let threads = if rows * k < 1 << 18 { 1 } else { threads.clamp(1, rows) };
        let per = rows.div_ceil(threads);
        std::thread::scope(|s| {
            let work: Vec<_> = values
                .chunks(per * k)
                .zip(q.chunks_mut(per * blocks * BLOCK))
                .zip(exp.chunks_mut(per * blocks))
                .map(|((v, q), e)| s.spawn(move || lockstep_quantize::quantize_rows(v, k, q, e).is_ok()))
                .collect();
            work.into_iter().all(|h| h.join().unwrap_or(false))
        })
    }

    /// The unit `c = a · bᵀ` (`a` m × k, `b` n × k, `c` m × n), bit for bit the reference's.
    pub fn gemm_f32(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), GpuError> {
        let blocks = blocks_for(k);
        let row_words = blocks * BLOCK / 4;
        self.check_shape(m, n, row_words)?;
        let threads = self.threads;
        let ok_a = Self::quantize(threads, a, m, k, &mut self.host.a_q, &mut self.host.a_exp);
        let ok_b = ok_a && Self::quantize(threads, b, n, k, &mut self.host.b_q, &mut self.host.b_exp);
        if !ok_b {
            return Err(GpuError::Unit(lockstep_quantize::first_non_finite_error(a, b)));
        }
        self.pad_for_tiles(row_words);
        let out_bytes = (m * n * 4) as u64;
        self.upload(&step::unit_record(m, n, k), out_bytes)?;
        let groups = (n.div_ceil(self.tile.cols() as usize) as u32, m.div_ceil(self.tile.rows() as usize) as u32);
        self.run(self.unit_kernel(), groups, 1, out_bytes, bytemuck::cast_slice_mut(c))
    }

    /// The raw integer product over the full i8 range, i32 out (wrapping).
    pub fn gemm_i8(&mut self, m: usize, n: usize, k: usize, a: &[i8], b: &[i8], c: &mut [i32]) -> Result<(), GpuError> {
        let words = k.div_ceil(4);
        self.check_shape(m, n, words)?;
        let pad = |src: &[i8], rows: usize, dst: &mut Vec<i8>| {
            dst.clear();
            dst.resize(rows * words * 4, 0);
            if k > 0 {
                for (row, out) in src.chunks_exact(k).zip(dst.chunks_exact_mut(words * 4)) {
                    out[..k].copy_from_slice(row);
                }
            }
        };
        pad(a, m, &mut self.host.a_q);
        pad(b, n, &mut self.host.b_q);
        self.host.a_exp.clear();
        self.host.b_exp.clear();
        let params = [m as u32, n as u32, words as u32, 0];
        let out_bytes = (m * n * 4) as u64;
        self.upload(&params, out_bytes)?;
        let groups = (n.div_ceil(GEMM_I8_WORKGROUP.0 as usize) as u32, m.div_ceil(GEMM_I8_WORKGROUP.1 as usize) as u32);
        self.run(Kernel::GemmI8, groups, 1, out_bytes, bytemuck::cast_slice_mut(c))
    }

    /// Writes the host scratch and `params` into the device buffers.
    fn upload(&mut self, params: &[u32], out_bytes: u64) -> Result<(), GpuError> {
        use wgpu::BufferUsages as U;
        let d = &self.device;
        let b = &mut self.buffers;
        let h = &self.host;
        let input = U::STORAGE | U::COPY_DST;
        let params_buf = ensure(d, &mut b.params, "params", step_params::BYTES, U::UNIFORM | U::COPY_DST);
        let a = ensure(d, &mut b.a, "a", h.a_q.len() as u64, input);
        let bb = ensure(d, &mut b.b, "b", h.b_q.len() as u64, input);
        let ae = ensure(d, &mut b.a_exp, "a_exp", h.a_exp.len() as u64 * 4, input);
        let be = ensure(d, &mut b.b_exp, "b_exp", h.b_exp.len() as u64 * 4, input);
        ensure(d, &mut b.out, "out", out_bytes, U::STORAGE | U::COPY_SRC);
        ensure(d, &mut b.staging, "staging", out_bytes, U::MAP_READ | U::COPY_DST);
        ensure(d, &mut b.page_stand_in, "absent page", 256, U::STORAGE);
        self.queue.write_buffer(&params_buf, 0, bytemuck::cast_slice(params));
        let write = |buf: &wgpu::Buffer, bytes: &[u8]| {
            // Quantized rows are whole blocks and integer rows whole words, so every length is
            // a multiple of the 4 bytes `write_buffer` wants.
            debug_assert_eq!(bytes.len() % 4, 0);
            if !bytes.is_empty() {
                self.queue.write_buffer(buf, 0, bytes);
            }
        };
        write(&a, bytemuck::cast_slice(&h.a_q));
        write(&bb, bytemuck::cast_slice(&h.b_q));
        write(&ae, bytemuck::cast_slice(&h.a_exp));
        write(&be, bytemuck::cast_slice(&h.b_exp));
        Ok(())
    }

    /// The bind group `kernel` runs with on a plain call: the unit kernels' (operands,
    /// exponents, output), the path ceilings' (output, table), the integer product's.
    fn bind_group(&self, pipeline: &wgpu::ComputePipeline, kernel: Kernel) -> wgpu::BindGroup {
        let b = &self.buffers;
        let get = |buf: &Option<wgpu::Buffer>| buf.clone().expect("uploaded");
        fn whole(buf: &Option<wgpu::Buffer>) -> wgpu::BindingResource<'_> {
            buf.as_ref().expect("uploaded").as_entire_binding()
        }
        let table = self
            .mul_lut
            .iter()
            .map(|t| wgpu::BindGroupEntry { binding: binding::MUL_LUT, resource: t.as_entire_binding() });
        if uses_unit_group(kernel) {
            let [params, qa, qb, ea, eb, out, stand_in] =
                [&b.params, &b.a, &b.b, &b.a_exp, &b.b_exp, &b.out, &b.page_stand_in].map(get);
            return self.unit_group(
                &params,
                [&qa, &qb, &ea, &eb],
                &[out, stand_in.clone(), stand_in.clone(), stand_in],
            );
        }
        if kernel.peak_workgroup().is_some() {
            let out = wgpu::BindGroupEntry { binding: binding::OUT, resource: whole(&b.out) };
            let entries: Vec<_> = std::iter::once(out).chain(table).collect();
            return self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &self.peak_layout.group,
                entries: &entries,
            });
        }
        let out = wgpu::BindGroupEntry { binding: binding::OUT, resource: whole(&b.out) };
        let entries: Vec<_> = [
            wgpu::BindGroupEntry { binding: binding::PARAMS, resource: whole(&b.params) },
            wgpu::BindGroupEntry { binding: binding::A, resource: whole(&b.a) },
            wgpu::BindGroupEntry { binding: binding::B, resource: whole(&b.b) },
            out,
        ]
        .into_iter()
        .chain(table)
        .collect();
        let layout = pipeline.get_bind_group_layout(0);
        self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &layout, entries: &entries })
    }

    /// The unit kernel's bind group: its parameter record (at dynamic offsets of `params`), the
    /// quantized operands and exponents `[qa, qb, ea, eb]`, the output's pages, and the product
    /// table. One for both paths: an ABI 1 call (the call's output, and stand-ins for the other
    /// pages) and ABI 2's (the arena's pages).
    fn unit_group(
        &self,
        params: &wgpu::Buffer,
        operands: [&wgpu::Buffer; 4],
        pages: &[wgpu::Buffer; lockstep_shaders::MAX_PAGES],
    ) -> wgpu::BindGroup {
        let [qa, qb, ea, eb] = operands;
        let mut entries = vec![
            wgpu::BindGroupEntry { binding: binding::PARAMS, resource: record(params, step_params::BYTES) },
            wgpu::BindGroupEntry { binding: binding::A, resource: qa.as_entire_binding() },
            wgpu::BindGroupEntry { binding: binding::B, resource: qb.as_entire_binding() },
            wgpu::BindGroupEntry { binding: binding::A_EXP, resource: ea.as_entire_binding() },
            wgpu::BindGroupEntry { binding: binding::B_EXP, resource: eb.as_entire_binding() },
            wgpu::BindGroupEntry { binding: binding::OUT, resource: pages[0].as_entire_binding() },
            wgpu::BindGroupEntry { binding: PAGE_BINDINGS[0], resource: pages[1].as_entire_binding() },
            wgpu::BindGroupEntry { binding: PAGE_BINDINGS[1], resource: pages[2].as_entire_binding() },
            wgpu::BindGroupEntry { binding: PAGE_BINDINGS[2], resource: pages[3].as_entire_binding() },
        ];
        if let Some(table) = &self.mul_lut {
            entries.push(wgpu::BindGroupEntry { binding: binding::MUL_LUT, resource: table.as_entire_binding() });
        }
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.gemm_layout.group,
            entries: &entries,
        })
    }

    /// Dispatches `kernel` `repeat` times over `groups`, then copies `out_bytes` of the output
    /// into `out` (when `out` is non-empty).
    fn run(
        &mut self,
        kernel: Kernel,
        groups: (u32, u32),
        repeat: usize,
        out_bytes: u64,
        out: &mut [u8],
    ) -> Result<(), GpuError> {
        self.take_uncaptured()?;
        let pipeline = &self.pipeline(kernel, self.tile, false)?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let unit = uses_unit_group(kernel);
        let bind_group = self.bind_group(pipeline, kernel);
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(pipeline);
            let offsets: &[u32] = if unit { &[0] } else { &[] };
            pass.set_bind_group(0, &bind_group, offsets);
            for _ in 0..repeat {
                pass.dispatch_workgroups(groups.0, groups.1, 1);
            }
        }
        let staging = (!out.is_empty()).then(|| self.buffers.staging.clone().expect("uploaded"));
        if let Some(staging) = &staging {
            encoder.copy_buffer_to_buffer(self.buffers.out.as_ref().expect("uploaded"), 0, staging, 0, out_bytes);
        }
        self.queue.submit([encoder.finish()]);
        let oom = pollster::block_on(oom.pop());
        let validation = pollster::block_on(scope.pop());
        if let Some(error) = validation.or(oom) {
            return Err(GpuError::Device(format!("dispatch failed: {error}")));
        }
        match staging {
            Some(staging) => self.map_staging(&staging, out)?,
            None => self.wait()?,
        }
        self.take_uncaptured()
    }

    /// Maps the first `out.len()` bytes of `staging` (after everything submitted so far has
    /// run), copies them out and unmaps.
    fn map_staging(&self, staging: &wgpu::Buffer, out: &mut [u8]) -> Result<(), GpuError> {
        let len = out.len() as u64;
        let mapped = Arc::new(Mutex::new(None));
        let flag = mapped.clone();
        staging.slice(..len).map_async(wgpu::MapMode::Read, move |r| {
            *flag.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        });
        self.wait()?;
        match mapped.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(GpuError::Device(format!("cannot read the result back: {e}"))),
            None => return Err(GpuError::Device("the result was never mapped".into())),
        }
        {
            let view = staging
                .slice(..len)
                .get_mapped_range()
                .map_err(|e| GpuError::Device(format!("cannot read the mapped result: {e}")))?;
            out.copy_from_slice(&view[..out.len()]);
        }
        staging.unmap();
        Ok(())
    }

    /// Copies `out.len()` bytes of `source` from byte `offset` to the host.
    fn read_back(&mut self, source: &wgpu::Buffer, offset: u64, out: &mut [u8]) -> Result<(), GpuError> {
        use wgpu::BufferUsages as U;
        let len = out.len() as u64;
        let staging = ensure(&self.device, &mut self.buffers.staging, "staging", len, U::MAP_READ | U::COPY_DST);
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        encoder.copy_buffer_to_buffer(source, offset, &staging, 0, len);
        self.queue.submit([encoder.finish()]);
        self.map_staging(&staging, out)?;
        self.take_uncaptured()
    }

    /// Encodes `dispatches` in one compute pass, submits them, and returns the status word.
    fn run_dispatches(&mut self, dispatches: &[step::Dispatch], needs: step::Needs) -> Result<u32, GpuError> {
        use wgpu::BufferUsages as U;
        let paged = self.arena.paged();
        let mut pipelines = Vec::with_capacity(dispatches.len());
        for d in dispatches {
            pipelines.push(self.pipeline(d.kernel, d.tile.unwrap_or(self.tile), paged)?);
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let dev = &self.device;
        let b = &mut self.buffers;
        let rw = U::STORAGE | U::COPY_DST | U::COPY_SRC;
        let params = ensure(
            dev,
            &mut b.params,
            "params",
            dispatches.len() as u64 * step_params::BYTES,
            U::UNIFORM | U::COPY_DST,
        );
        let q_a = ensure(dev, &mut b.a, "a", needs.q_a * 4, rw);
        let q_b = ensure(dev, &mut b.b, "b", needs.q_b * 4, rw);
        let e_a = ensure(dev, &mut b.a_exp, "a_exp", needs.e_a * 4, rw);
        let e_b = ensure(dev, &mut b.b_exp, "b_exp", needs.e_b * 4, rw);
        let scratch = ensure(dev, &mut b.scratch, "scratch", needs.scratch * 4, rw);
        let status = ensure(dev, &mut b.status, "status", 16, rw);
        let status_staging = ensure(dev, &mut b.status_staging, "status staging", 16, U::MAP_READ | U::COPY_DST);
        let stand_in = ensure(dev, &mut b.page_stand_in, "absent page", 256, rw);
        if self.arena.pages.is_empty() {
            return Err(GpuError::Shape("no buffers exist yet".into()));
        }
        let pages: [wgpu::Buffer; lockstep_shaders::MAX_PAGES] = std::array::from_fn(|i| {
            self.arena.pages.get(i).and_then(|p| p.buffer.clone()).unwrap_or_else(|| stand_in.clone())
        });

        let mut records = Vec::with_capacity(dispatches.len() * step_params::WORDS);
        for d in dispatches {
            records.extend_from_slice(&d.params);
        }
        self.queue.write_buffer(&params, 0, bytemuck::cast_slice(&records));
        self.queue.write_buffer(&status, 0, bytemuck::cast_slice(&[lockstep_shaders::step_status::CLEAR; 4]));

        let step_group = |q: &wgpu::Buffer, e: &wgpu::Buffer| {
            use step_binding as s;
            self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &self.step_layout.group,
                entries: &[
                    wgpu::BindGroupEntry { binding: s::PARAMS, resource: record(&params, step_params::BYTES) },
                    wgpu::BindGroupEntry { binding: s::MEM, resource: pages[0].as_entire_binding() },
                    wgpu::BindGroupEntry { binding: s::Q, resource: q.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: s::E, resource: e.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: s::STATUS, resource: status.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: s::SCRATCH, resource: scratch.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: PAGE_BINDINGS[0], resource: pages[1].as_entire_binding() },
                    wgpu::BindGroupEntry { binding: PAGE_BINDINGS[1], resource: pages[2].as_entire_binding() },
                    wgpu::BindGroupEntry { binding: PAGE_BINDINGS[2], resource: pages[3].as_entire_binding() },
                ],
            })
        };
        let group_a = step_group(&q_a, &e_a);
        let group_b = step_group(&q_b, &e_b);
        let group_gemm = self.unit_group(&params, [&q_a, &q_b, &e_a, &e_b], &pages);

        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for (i, (d, pipeline)) in dispatches.iter().zip(&pipelines).enumerate() {
                let group = match d.bind {
                    step::Bind::StepA => &group_a,
                    step::Bind::StepB => &group_b,
                    step::Bind::Gemm => &group_gemm,
                };
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, group, &[(i as u64 * step_params::BYTES) as u32]);
                pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
            }
        }
        encoder.copy_buffer_to_buffer(&status, 0, &status_staging, 0, 16);
        self.queue.submit([encoder.finish()]);
        let oom = pollster::block_on(oom.pop());
        let validation = pollster::block_on(scope.pop());
        if let Some(error) = validation.or(oom) {
            return Err(GpuError::Device(format!("the ops' dispatch failed: {error}")));
        }
        let mut word = [0u8; 16];
        self.map_staging(&status_staging, &mut word)?;
        self.take_uncaptured()?;
        Ok(u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
    }

    fn wait(&self) -> Result<(), GpuError> {
        self.device
            .poll(wgpu::PollType::Wait { submission_index: None, timeout: Some(Duration::from_secs(600)) })
            .map(|_| ())
            .map_err(|e| GpuError::Device(format!("waiting for the GPU failed: {e}")))
    }

    /// The product path's ceiling: `repeat` dispatches of the register-resident loop of its
    /// product (`peak.wgsl`: `dot4` of DP4A or the table; `peak_tc.wgsl`: cooperative
    /// multiply-adds) after one warm-up, timed with the host waiting, as [`Self::time_kernel`]
    /// times the unit. Returns int8 operations (a multiply and an add each) per second.
    pub fn time_peak(&mut self, repeat: usize) -> Result<f64, GpuError> {
        // Enough workgroups to fill a large GPU (an H200 has 132 multiprocessors); a software
        // adapter gets a few, so a test's call stays short.
        let wide: u32 = if self.adapter.software { 4 } else { 132 * 16 };
        let kernel = self.coop.map_or(Kernel::Peak, Kernel::PeakTc);
        let (threads, ops) = kernel.peak_workgroup().expect("a path-ceiling kernel");
        let bytes = u64::from(wide * threads) * 4;
        ensure(
            &self.device,
            &mut self.buffers.out,
            "out",
            bytes,
            wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        );
        self.run(kernel, (wide, 1), 1, 0, &mut [])?;
        let start = Instant::now();
        self.run(kernel, (wide, 1), repeat, 0, &mut [])?;
        let rate = (u64::from(wide) * ops) as f64 * repeat as f64 / start.elapsed().as_secs_f64();
        // The rate counts every operation as done: the kernels fold each one into their output,
        // so a workgroup's words equal the host's model only if none was dropped.
        let out = self.buffers.out.clone().expect("ensured above");
        let (first, last) = (0, wide - 1);
        for workgroup in [first, last] {
            let expected = match self.coop {
                Some(c) => lockstep_shaders::peak_tc_words(c.fm, c.fn_, c.fk, c.subgroup, workgroup),
                None => lockstep_shaders::peak_words(workgroup),
            };
            let mut bytes = vec![0u8; expected.len() * 4];
            self.read_back(&out, u64::from(workgroup * threads) * 4, &mut bytes)?;
            let words = bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            if let Some((i, (got, want))) = words.zip(&expected).enumerate().find(|(_, (g, w))| g != *w) {
                return Err(GpuError::Device(format!(
                    "the {} kernel did not compute what it counts (workgroup {workgroup}, word {i}: {got:#010x}, the host's model {want:#010x}); its rate would not be a ceiling",
                    kernel.entry_point()
                )));
            }
        }
        Ok(rate)
    }

    /// Kernel-only timing: uploads random quantized operands of an `m × n × k` unit once,
    /// then times `repeat` back-to-back dispatches (after one warm-up) with the host waiting
    /// for completion. Quantization and transfers are excluded. Returns seconds per dispatch.
    pub fn time_kernel(&mut self, m: usize, n: usize, k: usize, repeat: usize) -> Result<f64, GpuError> {
        let blocks = blocks_for(k);
        self.check_shape(m, n, blocks * BLOCK / 4)?;
        let mut rng = lockstep_luts::rng::SplitMix64::new(0x6b65726e656c);
        let mut fill = |rows: usize, q: &mut Vec<i8>, e: &mut Vec<i32>| {
            q.clear();
            q.extend((0..rows * blocks * BLOCK).map(|_| (rng.below(255) as i32 - 127) as i8));
            e.clear();
            e.extend((0..rows * blocks).map(|_| rng.below(40) as i32 - 20));
        };
        fill(m, &mut self.host.a_q, &mut self.host.a_exp);
        fill(n, &mut self.host.b_q, &mut self.host.b_exp);
        self.pad_for_tiles(blocks * BLOCK / 4);
        let out_bytes = (m * n * 4) as u64;
        self.upload(&step::unit_record(m, n, k), out_bytes)?;
        let groups = (n.div_ceil(self.tile.cols() as usize) as u32, m.div_ceil(self.tile.rows() as usize) as u32);
        let kernel = self.unit_kernel();
        self.run(kernel, groups, 1, out_bytes, &mut [])?;
        let start = Instant::now();
        self.run(kernel, groups, repeat, out_bytes, &mut [])?;
        Ok(start.elapsed().as_secs_f64() / repeat as f64)
    }
}

/// Whether `kernel` binds the unit kernel's group (its record at a dynamic offset).
fn uses_unit_group(kernel: Kernel) -> bool {
    matches!(kernel, Kernel::GemmUnits | Kernel::GemmTc(_))
}

/// One `size`-byte parameter record of `buffer`, bound at a dynamic offset.
fn record(buffer: &wgpu::Buffer, size: u64) -> wgpu::BindingResource<'_> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer, offset: 0, size: std::num::NonZeroU64::new(size) })
}

/// A bind group layout, and where its bindings are in Vulkan's numbering.
///
/// wgpu's Vulkan backend numbers a layout's bindings `0..n` in the order of its entries, not by
/// their WGSL numbers, and renumbers the bindings of every WGSL module it compiles to match
/// (wgpu-hal's `binding_map`). A module passed through as SPIR-V is not renumbered: it must be
/// written with `vulkan`'s numbers already. (Written with the WGSL numbers, `tc`'s modules read
/// other buffers than the ones bound — the path ceiling's lone binding 5 past the only
/// descriptor, which crashed Mesa 26's lavapipe; the unit kernel's arena pages 1-3 one binding
/// off, which wrote a product's outputs to the wrong page once a run's buffers took more than one:
/// `docs/TENSOR_CORES.md`.)
struct Layout {
    group: wgpu::BindGroupLayout,
    vulkan: naga::back::spv::BindingMap,
}

/// The explicit bind group layouts of the unit kernel and of the step kernels: the first
/// binding of each is a uniform record at a dynamic offset.
/// And the path-ceiling kernels' (`time_peak`): their output, and the table for the LUT.
fn layouts(device: &wgpu::Device, product: Product) -> (Layout, Layout, Layout) {
    let entry = |binding: u32, ty: wgpu::BufferBindingType, dynamic: Option<u64>| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: dynamic.is_some(),
            min_binding_size: dynamic.and_then(std::num::NonZeroU64::new),
        },
        count: None,
    };
    let uniform = wgpu::BufferBindingType::Uniform;
    let read = wgpu::BufferBindingType::Storage { read_only: true };
    let rw = wgpu::BufferBindingType::Storage { read_only: false };
    let mut gemm = vec![
        entry(binding::PARAMS, uniform, Some(step_params::BYTES)),
        entry(binding::A, read, None),
        entry(binding::B, read, None),
        entry(binding::A_EXP, read, None),
        entry(binding::B_EXP, read, None),
        entry(binding::OUT, rw, None),
    ];
    gemm.extend(PAGE_BINDINGS.map(|b| entry(b, rw, None)));
    if product == Product::Lut {
        gemm.push(entry(binding::MUL_LUT, read, None));
    }
    use step_binding as s;
    let step = [
        entry(s::PARAMS, uniform, Some(step_params::BYTES)),
        entry(s::MEM, rw, None),
        entry(s::Q, rw, None),
        entry(s::E, rw, None),
        entry(s::STATUS, rw, None),
        entry(s::SCRATCH, rw, None),
        entry(PAGE_BINDINGS[0], rw, None),
        entry(PAGE_BINDINGS[1], rw, None),
        entry(PAGE_BINDINGS[2], rw, None),
    ];
    let make = |label: &str, entries: &[wgpu::BindGroupLayoutEntry]| Layout {
        group: device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(label), entries }),
        vulkan: vulkan_bindings(entries),
    };
    let mut peak = vec![entry(binding::OUT, rw, None)];
    if product == Product::Lut {
        peak.push(entry(binding::MUL_LUT, read, None));
    }
    (make("unit kernel", &gemm), make("step kernels", &step), make("path ceiling", &peak))
}

/// Group 0's bindings as wgpu's Vulkan backend numbers them: by position among `entries`.
fn vulkan_bindings(entries: &[wgpu::BindGroupLayoutEntry]) -> naga::back::spv::BindingMap {
    entries
        .iter()
        .enumerate()
        .map(|(at, entry)| {
            let info = naga::back::spv::BindingInfo { descriptor_set: 0, binding: at as u32, binding_array_size: None };
            (naga::ResourceBinding { group: 0, binding: entry.binding }, info)
        })
        .collect()
}

/// Maps a [`GpuError`] onto a plugin error.
pub fn worker_error(error: GpuError) -> lockstep_worker_api::plugin::WorkerError {
    use lockstep_worker_api::status;
    let code = match &error {
        GpuError::Unavailable(_) | GpuError::Device(_) => status::DEVICE_ERROR,
        GpuError::Shape(_) => status::INVALID_ARGUMENT,
        GpuError::Unit(UnitError::NonFinite { .. }) | GpuError::NonFinite(_) => status::NON_FINITE_INPUT,
        GpuError::Unit(UnitError::Shape { .. }) => status::INVALID_ARGUMENT,
    };
    lockstep_worker_api::plugin::WorkerError::new(code, error.to_string())
}

/// Creates the [`GpuUnits`] behind a plugin instance from the host's options.
pub fn create_for_plugin(
    engine: Engine,
    options: &lockstep_worker_api::CreateOptions,
) -> Result<GpuUnits, lockstep_worker_api::plugin::WorkerError> {
    use lockstep_worker_api::create_flags;
    lockstep_worker_api::plugin::check_create_flags(options)?;
    use lockstep_worker_api::plugin::{requested_adapter, requested_tile};
    let tile = requested_tile(options).map(self::requested_tile).transpose().map_err(worker_error)?;
    let gpu_options = GpuOptions {
        hardware_only: options.flags & create_flags::HARDWARE_ONLY != 0,
        tile,
        adapter: requested_adapter(options)?,
        threads: options.threads as usize,
        soft_float: false,
        page_words: None,
        narrow: None,
    };
    GpuUnits::new(engine, &gpu_options).map_err(worker_error)
}
