//! `lockstep gate NAME|PATH`: load a plugin, run the exact gate, print the verdict.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use lockstep_backends::gate::run_gate;

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
}

/// Exit codes: 0 admitted, 1 rejected, 2 could not run (load or create failed).
pub fn run(args: GateArgs) -> anyhow::Result<ExitCode> {
    let (plugin, mut backend) = crate::backend::open_backend(&args.backend, args.threads, Default::default())?;
    println!("gate: backend `{}` from {}", plugin.name(), plugin.path().display());
    println!("      {}", plugin.description());
    println!("      device: {}", backend.describe());
    let stderr = std::io::stderr();
    let live = stderr.is_terminal();
    let report = run_gate(&mut backend, &mut |progress| {
        if live {
            let mut err = stderr.lock();
            let _ = write!(err, "\r  [{:>2}/{}] {:<40}", progress.done, progress.total, progress.case);
            let _ = err.flush();
        }
    });
    if live {
        eprintln!();
    }
    for case in &report.cases {
        match &case.failure {
            None if args.verbose => println!("  pass  {:<36} {:>12} MACs", case.name, case.macs),
            None => {}
            Some(failure) => println!("  FAIL  {:<36} {failure}", case.name),
        }
    }
    if let Some(reason) = &report.aborted {
        println!("  gate aborted: {reason}");
    }
    let probe = report.probe_hash.map_or("none".to_string(), |h| format!("{h:#010x}"));
    println!("probe hash: {probe} (reference {:#010x})", report.reference_probe_hash);
    println!("{}", report.verdict_line());
    Ok(if report.admitted() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
