//! Turning a backend name into an admitted, ready-to-use backend.

use anyhow::{bail, Context};
use lockstep_backends::gate::run_gate;
use lockstep_backends::{resolve_plugin, Backend, Plugin};
use lockstep_node::gemm::UnitsGemm;

/// Loads the plugin `name` (a built-in name or a path) and creates an instance, not yet gated.
pub fn open_backend(name: &str, threads: u32) -> anyhow::Result<(Plugin, Backend)> {
    let path = resolve_plugin(name)?;
    let plugin = Plugin::load(&path).with_context(|| format!("loading backend `{name}`"))?;
    let backend = plugin.instantiate(threads).with_context(|| format!("creating backend `{name}`"))?;
    Ok((plugin, backend))
}

/// Loads `name` (a built-in name or a path), runs the exact gate, and returns the backend only
/// if it is admitted, with one lane per thread (`threads`, 0 for every core): the main
/// instance threads large products itself, the others run small ones in parallel. The verdict
/// is printed unless `quiet`.
pub fn admitted_gemm(name: &str, threads: u32, quiet: bool) -> anyhow::Result<UnitsGemm> {
    let (plugin, mut backend) = open_backend(name, threads)?;
    let report = run_gate(&mut backend, &mut |_| {});
    if !quiet {
        println!("gate: {} ({})", report.verdict_line(), backend.describe());
    }
    if !report.admitted() {
        bail!("backend `{name}` was not admitted: {}", report.verdict_line());
    }
    let lanes = crate::train::threads_or_all(threads);
    let extra = (1..lanes).map(|_| plugin.instantiate(1)).collect::<Result<Vec<_>, _>>()?;
    Ok(UnitsGemm::with_lanes(backend, extra))
}
