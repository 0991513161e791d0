//! Turning a backend name into an admitted, ready-to-use backend.

use std::sync::OnceLock;

use anyhow::Context;
use lockstep_backends::gate::GateProgress;
use lockstep_backends::{resolve_plugin, Backend, InstanceOptions, Plugin, UnitsGemm};
use lockstep_node::admission::{check_at_run_shapes, AtRunShapes, ShapesAdmitted};
use lockstep_node::config::RunConfig;
use lockstep_node::data::DataSource;
use lockstep_node::gemm::{FloatGemm, Gemm};
use lockstep_node::verdict::Verdict;
use lockstep_worker_api::create_flags;

/// The device choice the command line made (`--gpu-adapter`, `--gpu-tile`), for every
/// instance this process creates; set once at start-up.
static DEVICE: OnceLock<DeviceChoice> = OnceLock::new();

/// Which GPU adapter and tile device plugins use; `None` leaves it to the plugin.
#[derive(Clone, Debug, Default)]
pub struct DeviceChoice {
    pub adapter: Option<String>,
    pub tile: Option<[u32; 5]>,
}

/// Records the command line's device choice (the first call wins).
pub fn choose_device(choice: DeviceChoice) {
    let _ = DEVICE.set(choice);
}

/// How a gate's child process opens `threads` instances with `opening` and this process's
/// device choice.
pub fn child_options(threads: u32, opening: Opening) -> crate::gate_child::ChildOptions {
    let device = DEVICE.get().cloned().unwrap_or_default();
    let mut device_args = Vec::new();
    if let Some(adapter) = device.adapter {
        device_args.extend(["--gpu-adapter".to_string(), adapter]);
    }
    if let Some([tm, tn, wx, wy, kb]) = device.tile {
        device_args.extend(["--gpu-tile".to_string(), format!("{tm}x{tn}x{wx}x{wy}x{kb}")]);
    }
    crate::gate_child::ChildOptions {
        threads,
        hardware_only: opening.hardware_only,
        fresh_copy: opening.fresh_copy,
        extra_args: device_args,
    }
}

/// How long a gate may run in its child process (`--gate-timeout`); set once at start-up.
static GATE_TIMEOUT: OnceLock<std::time::Duration> = OnceLock::new();

/// Records `--gate-timeout` (the first call wins).
pub fn choose_gate_timeout(limit: std::time::Duration) {
    let _ = GATE_TIMEOUT.set(limit);
}

pub fn gate_timeout() -> std::time::Duration {
    GATE_TIMEOUT.get().copied().unwrap_or(std::time::Duration::from_secs(crate::gate_child::DEFAULT_TIMEOUT_S))
}

/// The options every instance is created with: `threads`, `flags`, and the device choice.
pub fn instance_options(threads: u32, flags: u64) -> InstanceOptions {
    let device = DEVICE.get().cloned().unwrap_or_default();
    InstanceOptions { threads, flags, adapter: device.adapter, tile: device.tile }
}

/// `TMxTNxWXxWYxKB`, as `--gpu-tile` takes it (the plugin checks the ranges).
pub fn parse_tile(text: &str) -> Result<[u32; 5], String> {
    let parts: Vec<u32> =
        text.split('x').map(|p| p.parse().map_err(|_| format!("`{p}` is not a number"))).collect::<Result<_, _>>()?;
    parts.try_into().map_err(|_| format!("`{text}` is not TMxTNxWXxWYxKB"))
}

/// Loads the plugin `name` (a built-in name or a path) and creates an instance, not yet gated.
pub fn open_backend(name: &str, threads: u32, opening: Opening) -> anyhow::Result<(Plugin, Backend)> {
    let path = resolve_plugin(name)?;
    let plugin = if opening.fresh_copy { Plugin::load_fresh_copy(&path) } else { Plugin::load(&path) }
        .with_context(|| format!("loading backend `{name}`"))?;
    let flags = if opening.hardware_only { create_flags::HARDWARE_ONLY } else { 0 };
    let backend = plugin
        .instantiate_options(&instance_options(threads, flags))
        .with_context(|| format!("creating backend `{name}`"))?;
    Ok((plugin, backend))
}

/// An admitted backend and what the gate said about it.
pub struct Admitted {
    pub gemm: UnitsGemm,
    /// The plugin's name (`cpu`, `lut`, …; `auto` resolves to the chosen one).
    pub name: String,
    pub verdict: Verdict,
    /// The device it computes on, as the plugin describes it.
    pub device: String,
}

/// Why [`admit`] returned no backend: the gate's verdict, or why nothing could be gated.
#[derive(Debug)]
pub struct NotAdmitted {
    pub name: String,
    pub verdict: Verdict,
}

impl std::fmt::Display for NotAdmitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "backend `{}` was not admitted: {}", self.name, self.verdict)
    }
}

impl std::error::Error for NotAdmitted {}

/// How to open a backend for [`admit`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Opening {
    /// Refuse software GPU adapters (lavapipe): for automatic choices, where a software
    /// adapter would be slower than the CPU mirror.
    pub hardware_only: bool,
    /// Load a copy of the library under a unique name (hot-swaps: a rebuilt plugin at the same
    /// path is really loaded anew).
    pub fresh_copy: bool,
}

/// The order `auto` tries: as in the seed DP4A, then the tensor cores where the driver offers
/// int8 cooperative matrices, the LUT kernel, the CPU mirror. `dp4a` before `tc`: on the H100
/// (2026-12-07, `docs/PERFORMANCE.md`) `dp4a`'s products ran 1.4–1.8× `tc`'s and its steps
/// 1.2–1.3× at 25.6M and GPT-2 size; where `dp4a` is refused, `tc` may still be admitted.
pub const AUTO_ORDER: &[&str] = &["dp4a", "tc", "lut", "cpu"];

/// Loads `name` (a built-in name, a path, or `auto`), runs the exact gate with `progress`,
/// and returns the backend only if it is admitted; otherwise the verdict (rejected, or not
/// loadable) comes back typed as [`NotAdmitted`]. The instance computes with `threads` (0 for
/// every core), and the host's own work beside it uses as many.
///
/// Every plugin is gated in a child process before this process loads it (a plugin that
/// crashes or hangs there is rejected and this process goes on); admitted, it is loaded here
/// with the same options. `auto` does that for each of [`AUTO_ORDER`] in turn, hardware GPUs
/// only (a software adapter such as lavapipe runs the GPU kernels exactly but slower than the
/// CPU mirror), and takes the first admitted; every verdict goes to `progress_line`.
pub fn admit(
    name: &str,
    threads: u32,
    opening: Opening,
    progress: &mut dyn FnMut(GateProgress<'_>),
    progress_line: &mut dyn FnMut(String),
) -> Result<Admitted, NotAdmitted> {
    let auto = name == "auto";
    let (candidates, opening) = if auto {
        (AUTO_ORDER, Opening { hardware_only: true, ..opening })
    } else {
        (std::slice::from_ref(&name), opening)
    };
    let mut refused = Verdict::NotLoadable { why: "no candidates".into() };
    for &candidate in candidates {
        let prefix = if auto { format!("auto: {candidate}: ") } else { "gate: ".to_string() };
        let gated =
            crate::gate_child::gate_in_child(candidate, &child_options(threads, opening), gate_timeout(), progress);
        let device = gated.loaded.as_ref().and_then(|l| l["device"].as_str()).unwrap_or("?").to_string();
        progress_line(format!("{prefix}{} ({device})", gated.verdict_line));
        if !gated.verdict.is_admitted() {
            refused = gated.verdict;
            continue;
        }
        let backend = match open_backend(candidate, threads, opening) {
            Ok((_plugin, backend)) => backend,
            Err(e) => {
                refused = Verdict::NotLoadable { why: format!("{e:#}") };
                continue;
            }
        };
        if auto {
            progress_line(format!("auto: chose `{}`", backend.name()));
        }
        let name = backend.name().to_string();
        let device = backend.describe();
        let gemm = UnitsGemm::with_threads(backend, threads_or_all(threads));
        return Ok(Admitted { gemm, name, verdict: gated.verdict, device });
    }
    Err(NotAdmitted { name: name.to_string(), verdict: refused })
}

/// [`admit`] with default opening, verdicts printed unless `quiet`.
pub fn admitted_gemm(name: &str, threads: u32, quiet: bool) -> anyhow::Result<UnitsGemm> {
    let mut print = |line: String| {
        if !quiet {
            println!("{line}");
        }
    };
    Ok(admit(name, threads, Opening::default(), &mut |_| {}, &mut print)?.gemm)
}

/// The referee of the admissions at a run's shapes (`lockstep_node::admission`): the CPU
/// mirror, gated like every backend, on every core.
pub fn referee() -> anyhow::Result<Box<dyn Gemm + Send>> {
    referee_on(0)
}

/// [`referee`] on `threads` threads (0: every core).
pub fn referee_on(threads: u32) -> anyhow::Result<Box<dyn Gemm + Send>> {
    let admitted = admit("cpu", threads, Opening::default(), &mut |_| {}, &mut |_| {})
        .context("opening the CPU mirror as a referee")?;
    Ok(Box::new(admitted.gemm))
}

/// `gemm` admitted at `run`'s own shapes (`lockstep_node::admission`, one step checked op by op
/// against the referee), or refused; `data` gives the step its batch. The float reference is
/// not the units and passes through. Both the backend and the verdict (with the seconds the
/// check took) come back.
pub fn admit_at_run_shapes(
    run: &RunConfig,
    gemm: Box<dyn Gemm + Send>,
    data: Box<dyn DataSource>,
) -> anyhow::Result<(Box<dyn Gemm + Send>, AtRunShapes)> {
    if !gemm.units() {
        return Ok((gemm, Ok((ShapesAdmitted { ops: 0 }, 0.0))));
    }
    let began = std::time::Instant::now();
    let checked = check_at_run_shapes(run, gemm, referee()?, data);
    Ok((checked.gemm, checked.verdict.map(|admitted| (admitted, began.elapsed().as_secs_f64()))))
}

/// `threads`, or every core for 0.
pub fn threads_or_all(threads: u32) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    }
}

/// The products for a backend name: `float`, or an admitted plugin; `threads` for the host's
/// work beside them (0: every core).
pub fn gemm_for(backend: &str, threads: u32, quiet: bool) -> anyhow::Result<Box<dyn Gemm + Send>> {
    if backend == "float" {
        return Ok(Box::new(FloatGemm::new(threads_or_all(threads))));
    }
    Ok(Box::new(admitted_gemm(backend, threads, quiet)?))
}
