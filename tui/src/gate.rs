//! `lockstep gate NAME|PATH`: load a plugin, run the exact gate, print the verdict.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use lockstep_node::verdict::Verdict;
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct GateArgs {
    /// `cpu`, or the path of a plugin library.
    backend: String,
    /// Threads for CPU plugins (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: u32,
    /// List every case, not only failures.
    #[arg(long, short)]
    verbose: bool,
    /// Replay the random phase of an earlier gate: its seed, as the case names show it (`0x…`).
    #[arg(long, value_parser = parse_seed)]
    phase: Option<u64>,
}

/// A seed in hex (`0x…`) or decimal.
fn parse_seed(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|e| format!("`{text}` is not a seed: {e}"))
}

/// Exit codes: 0 admitted, 1 rejected (a crash or a hang of the plugin included: the gate runs
/// it in a child process, `gate_child.rs`), 2 could not run (load or create failed).
pub fn run(args: GateArgs) -> anyhow::Result<ExitCode> {
    let stderr = std::io::stderr();
    let live = stderr.is_terminal();
    let mut shown = false;
    let limit = crate::backend::gate_timeout();
    let mut options = crate::backend::child_options(args.threads, Default::default());
    if let Some(seed) = args.phase {
        options.extra_args.extend(["--phase".to_string(), format!("{seed:#x}")]);
    }
    let gated = crate::gate_child::gate_in_child(&args.backend, &options, limit, &mut |p| {
        if live {
            let mut err = stderr.lock();
            let _ = write!(err, "\r  [{:>2}/{}] {:<40}", p.done, p.total, p.case);
            let _ = err.flush();
            shown = true;
        }
    });
    if shown {
        eprintln!();
    }
    if let Verdict::NotLoadable { why } = &gated.verdict {
        anyhow::bail!("{why}");
    }
    if let Some(loaded) = &gated.loaded {
        let text = |key: &str| loaded[key].as_str().unwrap_or("?").to_string();
        println!("gate: backend `{}` from {}", text("name"), text("path"));
        println!("      {}", text("description"));
        println!("      device: {}", text("device"));
    }
    let report = gated.report.as_ref();
    for case in report.and_then(|r| r["cases"].as_array()).into_iter().flatten() {
        let name = case["name"].as_str().unwrap_or("?");
        match case["failure"].as_str() {
            None if args.verbose => println!("  pass  {:<36} {:>12} MACs", name, case["macs"]),
            None => {}
            Some(failure) => println!("  FAIL  {name:<36} {failure}"),
        }
    }
    if let Some(reason) = report.and_then(|r| r["aborted"].as_str()) {
        println!("  gate aborted: {reason}");
    }
    if let Some(report) = report {
        let probe = report["probe_hash"].as_u64().map_or("none".to_string(), |h| format!("{h:#010x}"));
        println!("probe hash: {probe} (reference {:#010x})", report["reference_probe_hash"].as_u64().unwrap_or(0));
    }
    println!("{}", gated.verdict_line);
    Ok(if gated.verdict.is_admitted() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `lockstep gate-child`: the gate's child process (`gate_child.rs`; hidden from `--help`).
#[derive(clap::Args)]
pub struct ChildArgs {
    backend: String,
    #[arg(long, default_value_t = 0)]
    threads: u32,
    #[arg(long)]
    hardware_only: bool,
    #[arg(long)]
    fresh_copy: bool,
    #[arg(long, value_parser = parse_seed)]
    phase: Option<u64>,
}

/// The child's side: open, gate, report; always exit 0 unless the plugin kills the process.
pub fn child_main(args: ChildArgs) -> anyhow::Result<ExitCode> {
    let opening = crate::backend::Opening { hardware_only: args.hardware_only, fresh_copy: args.fresh_copy };
    let (plugin, mut backend) = match crate::backend::open_backend(&args.backend, args.threads, opening) {
        Ok(pair) => pair,
        Err(e) => {
            emit(json!({"not-loadable": format!("{e:#}")}));
            return Ok(ExitCode::SUCCESS);
        }
    };
    emit(json!({"loaded": {
        "name": plugin.name(),
        "path": plugin.path().display().to_string(),
        "description": plugin.description(),
        "device": backend.describe(),
    }}));
    let phase = args.phase.unwrap_or_else(lockstep_backends::gate::fresh_phase_seed);
    let report = lockstep_backends::gate::run_gate_with_phase(&mut backend, phase, &mut |p| {
        emit(json!({"progress": {"done": p.done, "total": p.total, "case": p.case}}))
    });
    let cases: Vec<Value> = report
        .cases
        .iter()
        .map(|c| json!({"name": c.name, "macs": c.macs, "failure": c.failure.as_ref().map(|f| f.to_string())}))
        .collect();
    let verdict = report.verdict();
    emit(json!({"report": {
        "cases": cases,
        "aborted": report.aborted,
        "probe_hash": report.probe_hash,
        "reference_probe_hash": report.reference_probe_hash,
        "verdict_line": report.verdict_line(),
        "verdict": crate::gate_child::verdict_to_json(&verdict),
        "device": backend.describe(),
    }}));
    Ok(ExitCode::SUCCESS)
}

fn emit(value: Value) {
    // One line each; the parent reads them as they come.
    println!("{value}");
}
