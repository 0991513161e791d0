//! `lockstep bench gemm`: throughput of the units against an f32 sgemm peer, same shapes,
//! same run.
//!
//! GOP/s counts 2 operations per multiply-add over the whole unit call (f32 in, quantize,
//! product, epilogue, f32 out). Each figure is the best of repeated runs over at least
//! `--min-ms` milliseconds (the reference runs once: it is slow and steady).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use lockstep_backends::Backend;
use lockstep_luts::rng::SplitMix64;
use lockstep_node::gemm::{FloatGemm, Gemm};

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// GEMM throughput: reference units, backend plugins (1 thread and all), f32 sgemm.
    Gemm(GemmArgs),
    /// Data-channel throughput on loopback (the mesh's configuration and a naive one) beside
    /// plain TCP.
    Exchange(crate::bench_exchange::ExchangeArgs),
    /// Training throughput of the default model: units trainer (1 thread and all), float
    /// reference, and PyTorch eager f32 when `torch` imports.
    Train(crate::bench_train::TrainBenchArgs),
    /// A group of real nodes on network namespaces shaped by traffic control (rate by `tc`,
    /// latency and loss by the mesh's socket shim), one run per sync mode: tokens/s, bytes
    /// per token, utilisation, held-out loss. Needs root.
    Wan(crate::bench_wan::WanArgs),
    /// Audits by recomputation on real processes: each wrong-member kind named and removed
    /// (syncs), false accusations, the audits' share of the group's throughput.
    Audit(crate::bench_audit::AuditArgs),
}

#[derive(clap::Args)]
pub struct GemmArgs {
    /// Measure only this backend (a built-in name or a path); default: the reference, `cpu`
    /// and the sgemm peer.
    #[arg(long)]
    backend: Option<String>,
    /// Shapes as MxNxK, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "256x256x256,512x512x512,1024x1024x1024,2048x512x512")]
    shapes: Vec<String>,
    /// Minimum measuring time per figure, in milliseconds.
    #[arg(long, default_value_t = 400)]
    min_ms: u64,
    /// Skip the scalar reference (it takes seconds per large shape).
    #[arg(long)]
    no_reference: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

struct Row {
    shape: String,
    implementation: String,
    threads: usize,
    seconds: f64,
    gops: f64,
    /// A device kernel's share of its product path's ceiling (GPU plugins).
    of_path_peak: Option<f64>,
}

fn parse_shape(text: &str) -> anyhow::Result<(usize, usize, usize)> {
    let parts: Vec<usize> = text
        .split('x')
        .map(|p| p.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("shape `{text}` is not MxNxK"))?;
    match parts[..] {
        [m, n, k] if m > 0 && n > 0 && k > 0 => Ok((m, n, k)),
        _ => anyhow::bail!("shape `{text}` is not MxNxK with positive sizes"),
    }
}

/// Best time of `f` over repeated calls lasting at least `min`.
fn best_time(min: Duration, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    f()?; // warm-up: page faults, pipeline caches
    let started = Instant::now();
    let mut best = f64::INFINITY;
    while started.elapsed() < min || best.is_infinite() {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn load_backend(name: &str, threads: u32) -> anyhow::Result<Backend> {
    Ok(lockstep_tui::backend::open_backend(name, threads, Default::default())?.1)
}

pub fn run(command: BenchCommand) -> anyhow::Result<ExitCode> {
    let args = match command {
        BenchCommand::Gemm(args) => args,
        BenchCommand::Train(args) => return crate::bench_train::run(args),
        BenchCommand::Exchange(args) => return crate::bench_exchange::run(args),
        BenchCommand::Wan(args) => return crate::bench_wan::run(args),
        BenchCommand::Audit(args) => return crate::bench_audit::run(args),
    };
    let shapes: Vec<(usize, usize, usize)> =
        args.shapes.iter().map(|s| parse_shape(s)).collect::<anyhow::Result<_>>()?;
    let all_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let min = Duration::from_millis(args.min_ms);
    let backend_name = args.backend.clone().unwrap_or_else(|| "cpu".to_string());
    let mut single = load_backend(&backend_name, 1)?;
    let mut multi = load_backend(&backend_name, 0)?;
    let compare_peers = args.backend.is_none();
    // The product path's ceiling (GPU plugins, ABI 2.1): the int8 rate of its product in a
    // register-resident loop, which each shape's kernel row is set against.
    let peak_gops = if single.plugin().capabilities() & lockstep_worker_api::caps::PEAK_TIMING != 0 {
        let gops = single.time_peak(50)? / 1e9;
        if args.json {
            println!(
                "{}",
                serde_json::json!({"impl": format!("{} path peak", single.name()), "threads": 1, "gops": gops})
            );
        }
        Some(gops)
    } else {
        None
    };

    let mut rows = Vec::new();
    for &(m, n, k) in &shapes {
        let shape = format!("{m}x{n}x{k}");
        let mut rng = SplitMix64::new(0xbe_0c);
        let a: Vec<f32> = (0..m * k).map(|_| rng.next_signed_unit()).collect();
        let b: Vec<f32> = (0..n * k).map(|_| rng.next_signed_unit() * 0.05).collect();
        let ops = 2.0 * (m * n * k) as f64;
        // `peak`: the ceiling a device kernel's row is set against.
        let mut push = |implementation: &str, threads: usize, seconds: f64, peak: Option<f64>| {
            let gops = ops / seconds / 1e9;
            let row = Row {
                shape: shape.clone(),
                implementation: implementation.to_string(),
                threads,
                seconds,
                gops,
                of_path_peak: peak.map(|p| gops / p),
            };
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"shape": row.shape, "impl": row.implementation, "threads": row.threads, "ms": row.seconds * 1e3, "gops": row.gops, "of_path_peak": row.of_path_peak})
                );
            }
            rows.push(row);
        };
        if compare_peers && !args.no_reference {
            let t = Instant::now();
            lockstep_luts::gemm_nt(m, n, k, &a, &b)?;
            push("reference", 1, t.elapsed().as_secs_f64(), None);
        }
        let mut c = vec![0f32; m * n];
        let seconds = best_time(min, || Ok(single.gemm_f32_into(m, n, k, &a, &b, &mut c)?))?;
        push(single.name(), 1, seconds, None);
        let expected = c.clone();
        // Plugins that can time their device kernel alone (GPU plugins) report it beside the
        // whole call: operands resident on the device, no quantization, no transfers.
        if single.plugin().capabilities() & lockstep_worker_api::caps::KERNEL_TIMING != 0 {
            let once = single.time_kernel(m, n, k, 3)?;
            let repeat = (min.as_secs_f64() / once.max(1e-6)).clamp(3.0, 200.0) as u32;
            let seconds = single.time_kernel(m, n, k, repeat)?;
            push(&format!("{} kernel", single.name()), 1, seconds, peak_gops);
        }
        if all_threads > 1 {
            let seconds = best_time(min, || Ok(multi.gemm_f32_into(m, n, k, &a, &b, &mut c)?))?;
            push(multi.name(), all_threads, seconds, None);
            anyhow::ensure!(
                expected.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()),
                "backend `{}` gave different bits with {all_threads} threads than with 1",
                multi.name()
            );
        }
        if compare_peers {
            // The peer is the float reference trainer's own product (`matrixmultiply`'s sgemm).
            let mut sgemm = FloatGemm::default();
            let seconds = best_time(min, || Ok(sgemm.gemm_nt(m, n, k, &a, &b, &mut c)?))?;
            push("sgemm-f32", 1, seconds, None);
        }
    }
    if !args.json {
        print_table(&rows);
        if let Some(peak) = peak_gops {
            println!(
                "`{}` path peak (its product in a register loop): {peak:.1} GOP/s; kernel rows at {}",
                single.name(),
                rows.iter()
                    .filter_map(|r| Some(format!("{} {:.0}%", r.shape, 100.0 * r.of_path_peak?)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(rows: &[Row]) {
    println!("{:<16} {:<12} {:>7} {:>10} {:>9} {:>10}", "shape", "impl", "threads", "ms", "GOP/s", "vs sgemm");
    for row in rows {
        let peer = rows.iter().find(|r| r.shape == row.shape && r.implementation == "sgemm-f32");
        let ratio = peer.map_or(String::from("-"), |p| format!("{:.2}x", row.gops / p.gops));
        println!(
            "{:<16} {:<12} {:>7} {:>10.3} {:>9.1} {:>10}",
            row.shape,
            row.implementation,
            row.threads,
            row.seconds * 1e3,
            row.gops,
            ratio
        );
    }
}
