//! `lockstep bench train`: tokens/s of one node's training step, side by side with the float
//! reference and PyTorch on the same model and batch: eager f32 on the CPU at each thread count
//! the units ran at, and — where CUDA is available — CUDA eager f32 with TF32 off and
//! `torch.compile`. Peak memory beside each row.

use std::io::Write;
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use lockstep_luts::ops::Op;
use lockstep_node::data::{CorpusSource, BUILTIN_CORPUS};
use lockstep_node::params::{init, Layout};
use lockstep_node::program::Program;
use lockstep_node::trainer::Trainer;

use lockstep_tui::backend::gemm_for;
use lockstep_tui::run_args::RunArgs;

const TORCH_SCRIPT: &str = include_str!("../bench/torch_gpt.py");
/// The trainer name of PyTorch's CPU rows.
const TORCH_CPU: &str = "pytorch eager f32";
/// PyTorch's CUDA modes (`--torch-modes`), each `MODE-PRECISION` as `torch_gpt.py` takes them:
/// eager or compiled, each in f32 with TF32 off, with TF32 matmuls, or under bf16 autocast —
/// what a user would pick. The first always runs: the GPU rows' first peer.
const TORCH_CUDA_MODES: [&str; 6] =
    ["eager-f32", "eager-tf32", "eager-bf16", "compile-f32", "compile-tf32", "compile-bf16"];

/// The trainer name of a PyTorch CUDA row of `mode` (one of [`TORCH_CUDA_MODES`]).
fn torch_cuda_trainer(mode: &str) -> String {
    let (mode, precision) = mode.split_once('-').expect("MODE-PRECISION");
    let precision = match precision {
        "f32" => "f32 (tf32 off)",
        "tf32" => "tf32",
        _ => "bf16 autocast",
    };
    format!("pytorch cuda {mode} {precision}")
}

#[derive(clap::Args)]
pub struct TrainBenchArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Measured steps per trainer.
    #[arg(long, default_value_t = 20)]
    measure_steps: u32,
    /// Unmeasured steps first.
    #[arg(long, default_value_t = 2)]
    warmup_steps: u32,
    /// Units backend to measure.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Skip PyTorch even when it is installed.
    #[arg(long)]
    no_torch: bool,
    /// PyTorch's CUDA modes to run (eager-f32 always runs: the GPU rows' first peer).
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = clap::builder::PossibleValuesParser::new(TORCH_CUDA_MODES),
        default_values_t = TORCH_CUDA_MODES.map(String::from)
    )]
    torch_modes: Vec<String>,
    /// Skip the float reference trainer (one thread, plain sgemm: minutes a step at large
    /// sizes).
    #[arg(long)]
    no_float: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Also time each op of the step on the backend at all threads, one op at a time (ABI 2
    /// backends): where the step's time goes.
    #[arg(long)]
    breakdown: bool,
}

struct Row {
    trainer: String,
    threads: usize,
    tokens_per_s: f64,
    loss: f32,
    /// Peak memory of the run: resident set on the CPU, allocated device memory on CUDA.
    peak_memory_bytes: Option<u64>,
    note: String,
}

/// The device memory a GPU plugin held at most, in MiB, read off its description (the
/// lockstep GPU plugins end it with "… MiB of device buffers (peak X MiB)"; the plugin ABI
/// carries descriptions as text). `None` for other rows.
fn device_peak_mib(note: &str) -> Option<f64> {
    let (_, tail) = note.rsplit_once("(peak ")?;
    tail.strip_suffix(" MiB)")?.parse().ok()
}

/// Resets this process's peak resident set (Linux `clear_refs` 5), so the next reading of
/// [`peak_rss_bytes`] covers what ran since.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// This process's peak resident set (`VmHWM`), if the kernel says.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What one of our trainers measured.
struct Measured {
    tokens_per_s: f64,
    loss: f32,
    peak_rss: Option<u64>,
    /// An accelerator's own description after the run (adapter, device memory held), if the
    /// backend computes on one.
    device: Option<String>,
}

fn measure(args: &TrainBenchArgs, backend: &str, threads: u32) -> anyhow::Result<Measured> {
    let run = args.run.run_config()?;
    reset_peak_rss();
    let gemm = gemm_for(backend, threads, true)?;
    let mut trainer = Trainer::new(run, gemm, Box::new(CorpusSource::builtin(run.seed)))?;
    for _ in 0..args.warmup_steps {
        trainer.step()?;
    }
    let started = Instant::now();
    let mut loss = f32::NAN;
    for _ in 0..args.measure_steps {
        loss = trainer.step()?.loss;
    }
    let seconds = started.elapsed().as_secs_f64();
    let peak_rss = peak_rss_bytes();
    let mut gemm = trainer.into_gemm();
    let device = gemm.device().filter(|d| d.accelerator()).map(|d| d.describe_now());
    Ok(Measured {
        tokens_per_s: f64::from(args.measure_steps) * run.tokens_per_step() as f64 / seconds,
        loss,
        peak_rss,
        device,
    })
}

/// What one PyTorch run measured.
struct TorchRun {
    tokens_per_s: f64,
    loss: f32,
    peak_memory_bytes: Option<u64>,
    note: String,
}

/// PyTorch on `device` in `mode` (`MODE-PRECISION`, [`TORCH_CUDA_MODES`]; the CPU runs `eager-f32`).
fn torch(args: &TrainBenchArgs, threads: usize, device: &str, mode: &str) -> Result<TorchRun, String> {
    let (mode, precision) = mode.split_once('-').expect("MODE-PRECISION");
    let dir = std::env::temp_dir().join(format!("lockstep-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let corpus = dir.join("corpus.txt");
    std::fs::write(&corpus, BUILTIN_CORPUS).map_err(|e| e.to_string())?;
    let run = args.run.run_config().map_err(|e| e.to_string())?;
    let m = run.model;
    let mut child = Command::new("python3")
        .arg("-")
        .args([
            corpus.to_str().unwrap_or_default().to_string(),
            m.width.to_string(),
            m.context.to_string(),
            m.layers.to_string(),
            m.heads.to_string(),
            run.batch.to_string(),
            args.measure_steps.to_string(),
            args.warmup_steps.to_string(),
            run.lr.to_string(),
            threads.to_string(),
            device.to_string(),
            mode.to_string(),
            precision.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("python3: {e}"))?;
    child.stdin.take().expect("piped").write_all(TORCH_SCRIPT.as_bytes()).map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(if err.contains("No module named 'torch'") {
            "not installed (pip install torch)".into()
        } else {
            format!("failed: {}", err.lines().last().unwrap_or(""))
        });
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(TorchRun {
        tokens_per_s: v["tokens_per_s"].as_f64().unwrap_or(f64::NAN),
        loss: v["loss"].as_f64().unwrap_or(f64::NAN) as f32,
        peak_memory_bytes: v["peak_memory_bytes"].as_u64(),
        note: format!("torch {}", v["torch"].as_str().unwrap_or("?")),
    })
}

fn torch_row(trainer: &str, threads: usize, run: Result<TorchRun, String>) -> Row {
    match run {
        Ok(r) => Row {
            trainer: trainer.into(),
            threads,
            tokens_per_s: r.tokens_per_s,
            loss: r.loss,
            peak_memory_bytes: r.peak_memory_bytes,
            note: r.note,
        },
        Err(why) => Row {
            trainer: trainer.into(),
            threads,
            tokens_per_s: f64::NAN,
            loss: f32::NAN,
            peak_memory_bytes: None,
            note: why,
        },
    }
}

/// One kind of op in the breakdown: its label, calls per step and seconds per step.
#[derive(Clone)]
struct OpTime {
    label: String,
    calls: usize,
    seconds: f64,
    /// Bytes per step the element-wise ops' buffers move (a word read, written, or both for an
    /// in-place update): what their time is measured against. `None` for products, whose
    /// ceiling is their path's (`bench gemm`).
    bytes: Option<f64>,
}

/// Bytes `op` must move at least: each word of its ranges once read, once written (`None` for a
/// product, whose strided views' ranges overstate what it touches).
fn moved_bytes(op: &Op) -> Option<f64> {
    if matches!(op, Op::Matmul(_)) {
        return None;
    }
    let words: u64 = op
        .accesses()
        .iter()
        .map(|a| (a.end.saturating_sub(a.start)) * if a.kind == lockstep_luts::ops::Kind::Update { 2 } else { 1 })
        .sum();
    Some(words as f64 * 4.0)
}

/// What a matmul op is, for the breakdown.
fn op_label(op: &Op) -> String {
    match op {
        Op::Matmul(mm) if mm.batch != [1, 1] => "matmul: attention (batched)".into(),
        Op::Matmul(mm) if mm.a.col_stride != 1 => "matmul: weight gradient (Aᵀ·B)".into(),
        Op::Matmul(mm) if mm.b.col_stride != 1 => "matmul: input gradient (A·B)".into(),
        Op::Matmul(_) => "matmul: linear forward (A·Bᵀ)".into(),
        other => other.name().into(),
    }
}

/// Runs the step's ops one at a time on the backend with `threads` (0: all), `steps` times, and returns
/// per label: calls per step and seconds per step; plus the whole sequence's seconds per step
/// when it runs in one call.
fn breakdown(args: &TrainBenchArgs, threads: u32, steps: usize) -> anyhow::Result<(Vec<OpTime>, f64)> {
    let run = args.run.run_config()?;
    let mut gemm = gemm_for(&args.backend, threads, true)?;
    let Some(device) = gemm.device() else {
        anyhow::bail!("backend `{}` runs products only (ABI 1): the host runs its ops", args.backend);
    };
    let layout = Layout::new(run.model);
    let (batch, seq) = (run.batch, run.model.context);
    let program = Program::new(device, &layout, batch, seq)?;
    let weights: Vec<u32> = init(&layout, run.seed).iter().map(|v| v.to_bits()).collect();
    device.write(program.weights, 0, &weights)?;
    let mut source = CorpusSource::builtin(run.seed);
    let (data, _) = lockstep_node::data::DataSource::next_batch(&mut source, batch, seq);
    device.write(program.tokens, 0, &data.tokens.iter().map(|&t| u32::from(t)).collect::<Vec<_>>())?;
    device.write(program.targets, 0, &data.targets.iter().map(|&t| u32::from(t)).collect::<Vec<_>>())?;
    let ops = program.step();
    device.run(ops)?; // warm-up: scratch sized, pages touched
                      // On an accelerator each call costs a submission and a wait, longer than many ops: an op
                      // there is timed as `REPEAT` copies of itself in one call (each copy recomputes the same
                      // outputs from the same inputs; an accumulating product or an in-place softmax changes its
                      // values, not its work).
    const REPEAT: usize = 10;
    let repeat = if device.accelerator() { REPEAT } else { 1 };
    let mut totals: Vec<OpTime> = Vec::new();
    for _ in 0..steps {
        for op in ops {
            let copies = vec![*op; repeat];
            let started = Instant::now();
            device.run(&copies)?;
            let seconds = started.elapsed().as_secs_f64() / repeat as f64;
            let label = op_label(op);
            let bytes = moved_bytes(op);
            match totals.iter_mut().find(|t| t.label == label) {
                Some(entry) => {
                    entry.calls += 1;
                    entry.seconds += seconds;
                    entry.bytes = entry.bytes.zip(bytes).map(|(a, b)| a + b);
                }
                None => totals.push(OpTime { label, calls: 1, seconds, bytes }),
            }
        }
    }
    let started = Instant::now();
    for _ in 0..steps {
        device.run(ops)?;
    }
    let whole = started.elapsed().as_secs_f64() / steps as f64;
    for entry in &mut totals {
        entry.calls /= steps;
        entry.seconds /= steps as f64;
        entry.bytes = entry.bytes.map(|b| b / steps as f64);
    }
    totals.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    Ok((totals, whole))
}

fn print_breakdown(args: &TrainBenchArgs, step_tokens: usize, on_gpu: bool) -> anyhow::Result<()> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (rows, whole) = breakdown(args, 0, 5)?;
    // Host threads do not feed a GPU's ops: one pass there.
    let (one, one_whole) = if on_gpu { (rows.clone(), whole) } else { breakdown(args, 1, 3)? };
    let sum: f64 = rows.iter().map(|r| r.seconds).sum();
    let alone = |label: &str| one.iter().find(|r| r.label == label).map_or(f64::NAN, |r| r.seconds);
    let rate = |r: &OpTime| r.bytes.map(|b| b / r.seconds / 1e9);
    if args.json {
        for r in &rows {
            println!(
                "{}",
                serde_json::json!({"breakdown_op": r.label, "calls_per_step": r.calls, "ms_per_step": r.seconds * 1e3, "share": r.seconds / sum,
                    "threads": all, "ms_per_step_1_thread": alone(&r.label) * 1e3, "bytes_per_step": r.bytes, "gb_per_s": rate(r)})
            );
        }
        println!(
            "{}",
            serde_json::json!({"breakdown_ops_ms": sum * 1e3, "breakdown_sequence_ms": whole * 1e3, "breakdown_sequence_ms_1_thread": one_whole * 1e3})
        );
        return Ok(());
    }
    println!();
    if on_gpu {
        println!(
            "where a step's time goes: `{}` on its device, each op timed alone (10 copies of it in one call, waited for)",
            args.backend
        );
        println!("{:<36} {:>6} {:>12} {:>7} {:>9}", "op", "calls", "ms/step", "share", "GB/s");
        for r in &rows {
            let gbs = rate(r).map_or("-".to_string(), |g| format!("{g:.1}"));
            println!(
                "{:<36} {:>6} {:>12.2} {:>6.1}% {:>9}",
                r.label,
                r.calls,
                r.seconds * 1e3,
                100.0 * r.seconds / sum,
                gbs
            );
        }
        println!(
            "the whole sequence in one call: {:.1} ms/step ({:.0} tokens/s before the rest of the step: the gradient out, the mean in, Adam and the hash)",
            whole * 1e3,
            step_tokens as f64 / whole
        );
        return Ok(());
    }
    println!("where a step's time goes: `{}`, each op timed alone, at 1 and {all} threads", args.backend);
    println!(
        "{:<36} {:>6} {:>12} {:>12} {:>8} {:>7} {:>9}",
        "op",
        "calls",
        "ms/step 1t",
        format!("ms/step {all}t"),
        "speedup",
        "share",
        "GB/s"
    );
    for r in &rows {
        let single = alone(&r.label);
        println!(
            "{:<36} {:>6} {:>12.2} {:>12.2} {:>7.1}x {:>6.1}% {:>9}",
            r.label,
            r.calls,
            single * 1e3,
            r.seconds * 1e3,
            single / r.seconds,
            100.0 * r.seconds / sum,
            rate(r).map_or("-".to_string(), |g| format!("{g:.1}"))
        );
    }
    println!(
        "the whole sequence in one call: {:.1} ms/step at 1 thread, {:.1} at {all} ({:.0} tokens/s before the host's share: Adam, hash, copies)",
        one_whole * 1e3,
        whole * 1e3,
        step_tokens as f64 / whole
    );
    Ok(())
}

pub fn run(args: TrainBenchArgs) -> anyhow::Result<ExitCode> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let run = args.run.run_config()?;
    let mut rows = Vec::new();
    let mut thread_counts: Vec<usize> = if all == 1 { vec![1] } else { vec![1, all] };
    let first = measure(&args, &args.backend, thread_counts[0] as u32)?;
    let on_gpu = first.device.is_some();
    let row = |trainer: String, threads: usize, m: Measured| Row {
        trainer,
        threads,
        tokens_per_s: m.tokens_per_s,
        loss: m.loss,
        peak_memory_bytes: m.peak_rss,
        note: m.device.unwrap_or_default(),
    };
    if on_gpu {
        // One GPU row (host threads only feed it); the CPU node of the same host beside it,
        // at all threads: the peer the GPU node is judged against.
        thread_counts = vec![all];
        rows.push(row(format!("units ({})", args.backend), all, first));
        if args.backend != "cpu" {
            rows.push(row("units (cpu)".into(), all, measure(&args, "cpu", all as u32)?));
        }
    } else {
        rows.push(row(format!("units ({})", args.backend), thread_counts[0], first));
        for &threads in &thread_counts[1..] {
            rows.push(row(
                format!("units ({})", args.backend),
                threads,
                measure(&args, &args.backend, threads as u32)?,
            ));
        }
    }
    if !args.no_float {
        rows.push(row("float reference".into(), 1, measure(&args, "float", 1)?));
    }
    let mut cuda_note = None;
    if !args.no_torch {
        // PyTorch on the CPU at every thread count the units ran at: the peer of each row.
        for &threads in &thread_counts {
            rows.push(torch_row(TORCH_CPU, threads, torch(&args, threads, "cpu", "eager-f32")));
        }
        match torch(&args, all, "cuda", TORCH_CUDA_MODES[0]) {
            Err(why) if why.contains("no CUDA device") => cuda_note = Some("no CUDA device: no CUDA rows".to_string()),
            eager => {
                rows.push(torch_row(&torch_cuda_trainer(TORCH_CUDA_MODES[0]), all, eager));
                for mode in TORCH_CUDA_MODES[1..].iter().filter(|m| args.torch_modes.iter().any(|w| w == *m)) {
                    rows.push(torch_row(&torch_cuda_trainer(mode), all, torch(&args, all, "cuda", mode)));
                }
            }
        }
    }
    // Each row against PyTorch on the CPU at the same thread count.
    let peer = |threads: usize| {
        rows.iter()
            .find(|r| r.trainer == TORCH_CPU && r.threads == threads && r.tokens_per_s.is_finite())
            .map(|r| r.tokens_per_s)
    };
    let config = format!(
        "c={} t={} b={} layers={} heads={}",
        run.model.width, run.model.context, run.batch, run.model.layers, run.model.heads
    );
    // A GPU row is also judged against PyTorch CUDA eager and the CPU node on the same host.
    let speed =
        |name: &str| rows.iter().find(|r| r.trainer == name && r.tokens_per_s.is_finite()).map(|r| r.tokens_per_s);
    // PyTorch's fastest CUDA mode of this run.
    let torch_best = rows
        .iter()
        .filter(|r| r.trainer.starts_with("pytorch cuda") && r.tokens_per_s.is_finite())
        .max_by(|a, b| a.tokens_per_s.total_cmp(&b.tokens_per_s))
        .map(|r| (r.trainer.clone(), r.tokens_per_s));
    let gpu_ratios = on_gpu.then(|| {
        let ours = speed(&format!("units ({})", args.backend)).unwrap_or(f64::NAN);
        (
            speed(&torch_cuda_trainer(TORCH_CUDA_MODES[0])).map(|p| ours / p),
            speed("units (cpu)").map(|p| ours / p),
            torch_best.as_ref().map(|(name, p)| (name.clone(), ours / p)),
        )
    });
    if args.json {
        for r in &rows {
            println!(
                "{}",
                serde_json::json!({"trainer": r.trainer, "threads": r.threads, "tokens_per_s": r.tokens_per_s, "loss": r.loss, "note": r.note,
                    "peak_memory_bytes": r.peak_memory_bytes, "device_peak_mib": device_peak_mib(&r.note), "vs_torch_cpu_same_threads": peer(r.threads).filter(|_| r.tokens_per_s.is_finite()).map(|p| r.tokens_per_s / p),
                    "config": config})
            );
        }
        if let Some((cuda, cpu, best)) = &gpu_ratios {
            println!(
                "{}",
                serde_json::json!({"gpu_backend": args.backend, "vs_torch_cuda_eager": cuda, "vs_cpu_node_all_threads": cpu,
                    "torch_cuda_best": best.as_ref().map(|b| &b.0), "vs_torch_cuda_best": best.as_ref().map(|b| b.1), "config": config})
            );
        }
    } else {
        println!(
            "model {config} ({} parameters); {} measured steps after {} warm-up; loss = last measured step",
            lockstep_node::params::Layout::new(run.model).len,
            args.measure_steps,
            args.warmup_steps
        );
        println!(
            "{:<36} {:>7} {:>12} {:>9} {:>10} {:>14}  note",
            "trainer", "threads", "tokens/s", "loss", "peak MiB", "vs torch cpu"
        );
        for r in &rows {
            let ratio = peer(r.threads)
                .filter(|_| r.tokens_per_s.is_finite())
                .map_or("-".to_string(), |p| format!("{:.2}x", r.tokens_per_s / p));
            let peak = r.peak_memory_bytes.map_or("-".to_string(), |b| format!("{:.0}", b as f64 / (1024.0 * 1024.0)));
            println!(
                "{:<36} {:>7} {:>12.0} {:>9.4} {:>10} {:>14}  {}",
                r.trainer, r.threads, r.tokens_per_s, r.loss, peak, ratio, r.note
            );
        }
        if let Some(note) = cuda_note {
            println!("{note}");
        }
        if let Some((cuda, cpu, best)) = gpu_ratios {
            let show = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}x"));
            println!(
                "`{}` against PyTorch CUDA eager: {}; against PyTorch's best mode{}: {}; against the CPU node ({all} threads): {}",
                args.backend,
                show(cuda),
                best.as_ref().map_or(String::new(), |b| format!(" ({})", b.0)),
                show(best.map(|b| b.1)),
                show(cpu)
            );
        }
    }
    if args.breakdown {
        print_breakdown(&args, run.tokens_per_step(), on_gpu)?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::{device_peak_mib, torch_cuda_trainer, TORCH_CUDA_MODES};

    #[test]
    fn every_pytorch_cuda_mode_has_a_row_name_of_its_own() {
        let names: Vec<String> = TORCH_CUDA_MODES.iter().map(|m| torch_cuda_trainer(m)).collect();
        assert_eq!(names[0], "pytorch cuda eager f32 (tf32 off)");
        assert_eq!(names[5], "pytorch cuda compile bf16 autocast");
        assert_eq!(names.iter().collect::<std::collections::BTreeSet<_>>().len(), names.len());
    }

    #[test]
    fn the_device_peak_is_read_off_a_gpu_plugins_description() {
        let note = "NVIDIA H200 (Vulkan, DiscreteGpu, NVIDIA 580.159.04), tile 64x64 of 4x4 outputs, 2 block(s) per stage (64x32 below 256 workgroups), 1641.3 MiB of device buffers (peak 1641.4 MiB)";
        assert_eq!(device_peak_mib(note), Some(1641.4));
        assert_eq!(device_peak_mib("torch 2.11.0+cu130"), None);
        assert_eq!(device_peak_mib(""), None);
    }
}
