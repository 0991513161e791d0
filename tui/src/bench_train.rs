//! `lockstep bench train`: tokens/s of one node's training step, side by side with the float
//! reference and PyTorch eager (f32, CPU) on the same model and batch.

use std::io::Write;
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use lockstep_node::data::{BuiltinSource, BUILTIN_CORPUS};
use lockstep_node::trainer::Trainer;

use crate::backend::gemm_for;
use crate::train::ModelArgs;

const TORCH_SCRIPT: &str = include_str!("../bench/torch_gpt.py");

#[derive(clap::Args)]
pub struct TrainBenchArgs {
    #[command(flatten)]
    model: ModelArgs,
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
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

struct Row {
    trainer: String,
    threads: usize,
    tokens_per_s: f64,
    loss: f32,
    note: String,
}

fn measure(args: &TrainBenchArgs, backend: &str, threads: u32) -> anyhow::Result<(f64, f32)> {
    let run = args.model.run_config();
    let gemm = gemm_for(backend, threads, true)?;
    let mut trainer = Trainer::new(run, gemm, Box::new(BuiltinSource::new(run.seed)))?;
    for _ in 0..args.warmup_steps {
        trainer.step()?;
    }
    let started = Instant::now();
    let mut loss = f32::NAN;
    for _ in 0..args.measure_steps {
        loss = trainer.step()?.loss;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok((f64::from(args.measure_steps) * run.tokens_per_step() as f64 / seconds, loss))
}

fn torch(args: &TrainBenchArgs, threads: usize) -> Result<(f64, f32, String), String> {
    let dir = std::env::temp_dir().join(format!("lockstep-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let corpus = dir.join("corpus.txt");
    std::fs::write(&corpus, BUILTIN_CORPUS).map_err(|e| e.to_string())?;
    let m = &args.model;
    let mut child = Command::new("python3")
        .arg("-")
        .args([
            corpus.to_str().unwrap_or_default().to_string(),
            m.width.to_string(),
            m.context.to_string(),
            m.layers.to_string(),
            m.heads.to_string(),
            m.batch.to_string(),
            args.measure_steps.to_string(),
            args.warmup_steps.to_string(),
            m.lr.to_string(),
            threads.to_string(),
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
    Ok((
        v["tokens_per_s"].as_f64().unwrap_or(f64::NAN),
        v["loss"].as_f64().unwrap_or(f64::NAN) as f32,
        format!("torch {}", v["torch"].as_str().unwrap_or("?")),
    ))
}

pub fn run(args: TrainBenchArgs) -> anyhow::Result<ExitCode> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let run = args.model.run_config();
    let mut rows = Vec::new();
    for threads in [1, all] {
        let (tps, loss) = measure(&args, &args.backend, threads as u32)?;
        rows.push(Row {
            trainer: format!("units ({})", args.backend),
            threads,
            tokens_per_s: tps,
            loss,
            note: String::new(),
        });
        if all == 1 {
            break;
        }
    }
    let (tps, loss) = measure(&args, "float", 1)?;
    rows.push(Row { trainer: "float reference".into(), threads: 1, tokens_per_s: tps, loss, note: String::new() });
    if !args.no_torch {
        match torch(&args, all) {
            Ok((tps, loss, note)) => {
                rows.push(Row { trainer: "pytorch eager f32".into(), threads: all, tokens_per_s: tps, loss, note })
            }
            Err(why) => rows.push(Row {
                trainer: "pytorch eager f32".into(),
                threads: all,
                tokens_per_s: f64::NAN,
                loss: f32::NAN,
                note: why,
            }),
        }
    }
    let peer =
        rows.iter().find(|r| r.trainer.starts_with("pytorch") && r.tokens_per_s.is_finite()).map(|r| r.tokens_per_s);
    if args.json {
        for r in &rows {
            println!(
                "{}",
                serde_json::json!({"trainer": r.trainer, "threads": r.threads, "tokens_per_s": r.tokens_per_s, "loss": r.loss, "note": r.note,
                    "config": format!("c={} t={} b={} layers={} heads={}", run.model.width, run.model.context, run.batch, run.model.layers, run.model.heads)})
            );
        }
    } else {
        println!(
            "model c={} t={} b={} layers={} heads={}; {} measured steps after {} warm-up; loss = last measured step",
            run.model.width,
            run.model.context,
            run.batch,
            run.model.layers,
            run.model.heads,
            args.measure_steps,
            args.warmup_steps
        );
        println!("{:<22} {:>7} {:>12} {:>9} {:>10}  note", "trainer", "threads", "tokens/s", "loss", "vs torch");
        for r in &rows {
            let ratio = peer
                .filter(|_| r.tokens_per_s.is_finite())
                .map_or("-".to_string(), |p| format!("{:.2}x", r.tokens_per_s / p));
            println!(
                "{:<22} {:>7} {:>12.0} {:>9.4} {:>10}  {}",
                r.trainer, r.threads, r.tokens_per_s, r.loss, ratio, r.note
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
