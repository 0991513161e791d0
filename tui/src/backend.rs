//! Turning a backend name into an admitted, ready-to-use backend.

use anyhow::{bail, Context};
use lockstep_backends::gate::run_gate;
use lockstep_backends::{auto, resolve_plugin, Backend, Plugin};
use lockstep_node::gemm::UnitsGemm;
use lockstep_worker_api::caps;

/// Loads the plugin `name` (a built-in name or a path) and creates an instance, not yet gated.
pub fn open_backend(name: &str, threads: u32) -> anyhow::Result<(Plugin, Backend)> {
    let path = resolve_plugin(name)?;
    let plugin = Plugin::load(&path).with_context(|| format!("loading backend `{name}`"))?;
    let backend = plugin.instantiate(threads).with_context(|| format!("creating backend `{name}`"))?;
    Ok((plugin, backend))
}

/// Loads `name` (a built-in name, a path, or `auto`), runs the exact gate, and returns the
/// backend only if it is admitted. CPU plugins get one lane per thread (`threads`, 0 for every
/// core): the main instance threads large products itself, the others run small ones in
/// parallel; device plugins get one instance. Verdicts are printed unless `quiet`.
///
/// `auto` follows the seed: DP4A, then LUT, then CPU, each gated, hardware GPUs only (see
/// `lockstep_backends::auto`); every verdict is printed.
pub fn admitted_gemm(name: &str, threads: u32, quiet: bool) -> anyhow::Result<UnitsGemm> {
    let (plugin, backend) = if name == "auto" {
        match auto::choose(threads) {
            Ok(choice) => {
                if !quiet {
                    for verdict in &choice.verdicts {
                        println!("auto: {}", verdict.line());
                    }
                    println!("auto: chose `{}`", choice.backend.name());
                }
                (choice.plugin, choice.backend)
            }
            Err(verdicts) => {
                let lines: Vec<String> = verdicts.iter().map(|v| v.line()).collect();
                bail!("no backend was admitted:\n  {}", lines.join("\n  "));
            }
        }
    } else {
        let (plugin, mut backend) = open_backend(name, threads)?;
        let report = run_gate(&mut backend, &mut |_| {});
        if !quiet {
            println!("gate: {} ({})", report.verdict_line(), backend.describe());
        }
        if !report.admitted() {
            bail!("backend `{name}` was not admitted: {}", report.verdict_line());
        }
        (plugin, backend)
    };
    let lanes = if plugin.capabilities() & caps::DEVICE != 0 { 1 } else { crate::train::threads_or_all(threads) };
    let extra = (1..lanes).map(|_| plugin.instantiate(1)).collect::<Result<Vec<_>, _>>()?;
    Ok(UnitsGemm::with_lanes(backend, extra))
}
