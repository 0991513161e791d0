//! The default backend choice, as in the seed: try DP4A, then the LUT kernel, then the CPU
//! mirror, gating each, and take the first one admitted.
//!
//! GPU plugins are created with `create_flags::HARDWARE_ONLY`: a software Vulkan adapter
//! (lavapipe) runs the GPU kernels exactly, but slower than the CPU mirror, so the automatic
//! choice never picks it. Naming `lut` or `dp4a` explicitly still runs them there.

use lockstep_worker_api::create_flags;

use crate::gate::{run_gate, GateReport};
use crate::loader::{resolve_plugin, Plugin};
use crate::{Backend, InstanceOptions};

/// The order the automatic choice tries.
pub const AUTO_ORDER: &[&str] = &["dp4a", "lut", "cpu"];

/// What happened to one candidate.
#[derive(Debug)]
pub enum Verdict {
    /// Not built, not loadable, or no device for it.
    Unavailable { name: &'static str, why: String },
    /// Created and gated.
    Gated { name: &'static str, report: GateReport, device: String },
}

impl Verdict {
    /// One line for logs.
    pub fn line(&self) -> String {
        match self {
            Verdict::Unavailable { name, why } => format!("{name}: unavailable: {why}"),
            Verdict::Gated { name, report, device } => format!("{name}: {} ({device})", report.verdict_line()),
        }
    }
}

/// The chosen backend: its plugin, the gated instance and every verdict on the way.
pub struct Choice {
    pub plugin: Plugin,
    pub backend: Backend,
    /// The chosen backend's verdict (admitted).
    pub verdict: lockstep_node::verdict::Verdict,
    pub verdicts: Vec<Verdict>,
}

/// Tries [`AUTO_ORDER`] and returns the first admitted backend, or every verdict if none is.
/// `options` go to each plugin (threads 0: all cores), with `HARDWARE_ONLY` added.
pub fn choose(options: &InstanceOptions) -> Result<Choice, Vec<Verdict>> {
    let options = InstanceOptions { flags: options.flags | create_flags::HARDWARE_ONLY, ..options.clone() };
    let mut verdicts = Vec::new();
    for &name in AUTO_ORDER {
        let opened = resolve_plugin(name)
            .map_err(|e| e.to_string())
            .and_then(|path| Plugin::load(&path).map_err(|e| e.to_string()))
            .and_then(|plugin| {
                let backend = plugin.instantiate_options(&options).map_err(|e| e.to_string())?;
                Ok((plugin, backend))
            });
        let (plugin, mut backend) = match opened {
            Ok(pair) => pair,
            Err(why) => {
                verdicts.push(Verdict::Unavailable { name, why });
                continue;
            }
        };
        let report = run_gate(&mut backend, &mut |_| {});
        let verdict = report.verdict();
        verdicts.push(Verdict::Gated { name, report, device: backend.describe() });
        if verdict.is_admitted() {
            return Ok(Choice { plugin, backend, verdict, verdicts });
        }
    }
    Err(verdicts)
}
