//! `lockstep bisect`: where a backend first departs from the definition.
//!
//! From a checkpoint (the last step two members agreed on, say) or from a fresh run, each named
//! backend trains the next steps with **every op of every step** recomputed by the reference
//! (`lockstep_luts::ops::run_reference`) from copies of what the op read, before the next op
//! runs (`Trainer::set_audit_all`, `audit::Audit::Every`). Ops before the first departure
//! agree bit for bit, so the first op whose words differ is the backend's own error: it is named
//! with the step, its position and name, the buffer and word, the definition's bits and the
//! backend's, and how many words differ. Backends that follow the definition to the end report
//! each step's weight hash, which every exact backend shares. This is divergence localisation
//! for a group: when the guard stops a run because replicas disagree, replaying the last
//! agreed checkpoint here on each member's backend names the op and the backend that left.
//!
//! Each backend is gated in a child process first, as everywhere (`gate_child.rs`), and its
//! verdict shown; unlike training, bisect goes on with a backend the gate rejected for its bits
//! (that is what it is for), but not with one that crashed, hung or wrote outside its output
//! there. The replay runs at the reference's speed.
//!
//! Exit codes: 0 every backend followed the definition, 1 a backend departed from it, 2 the
//! command could not run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use lockstep_node::checkpoint;
use lockstep_node::compute_error::ComputeError;
use lockstep_node::data::{CorpusSource, DataSource};
use lockstep_node::sync::ContributeError;
use lockstep_node::trainer::Trainer;
use serde_json::json;

use lockstep_tui::backend::{open_backend, threads_or_all, Opening};
use lockstep_tui::run_args::{CorpusArg, RunArgs};

#[derive(clap::Args)]
pub struct BisectArgs {
    /// A backend to examine (a built-in name or a plugin path); give it more than once to
    /// examine several, each from the same state.
    #[arg(long = "backend", required = true)]
    backends: Vec<String>,
    /// Start from this checkpoint (else from the run the run flags describe, at step 0).
    #[arg(long)]
    ckpt: Option<PathBuf>,
    /// Steps to replay.
    #[arg(long, default_value_t = 1)]
    replay: u32,
    /// Threads for CPU plugins (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: u32,
    /// One JSON object per backend instead of text.
    #[arg(long)]
    json: bool,
    /// The run when no checkpoint is given.
    #[command(flatten)]
    run: RunArgs,
    /// The corpus the run trained on (its batches are drawn from it).
    #[command(flatten)]
    corpus: CorpusArg,
}

/// Where one backend ended up.
enum Outcome {
    /// Every op of every replayed step followed the definition: each step's weight hash.
    Followed(Vec<(u32, u32)>),
    /// The first op that did not.
    Departed(lockstep_node::compute_error::AuditFailure),
}

pub fn run(args: BisectArgs) -> anyhow::Result<ExitCode> {
    let state = match &args.ckpt {
        Some(path) => Some(checkpoint::load(path, None).with_context(|| format!("reading {}", path.display()))?),
        None => None,
    };
    let run = match &state {
        Some(s) => s.run,
        None => args.run.run_config()?,
    };
    let start = state.as_ref().map_or(0, |s| s.step);
    let end = start.saturating_add(args.replay).min(run.steps);
    if end <= start {
        bail!("the checkpoint is at step {start} of a {}-step run: nothing to replay", run.steps);
    }
    let mut departed = false;
    let corpus = args.corpus.load(&mut |line| eprintln!("bisect: {line}"))?;
    for name in &args.backends {
        if name == "float" {
            bail!("`float` is not exact: bisect compares backends with the definition's bits");
        }
        let gated = lockstep_tui::gate_child::gate_in_child(
            name,
            &lockstep_tui::backend::child_options(args.threads, Opening::default()),
            lockstep_tui::backend::gate_timeout(),
            &mut |_| {},
        );
        if gated.report.is_none() || gated.verdict_line.contains("wrote outside the output") {
            bail!("`{name}` is not examined in this process: {}", gated.verdict_line);
        }
        if !args.json {
            println!("{name}: gate: {}", gated.verdict_line);
        }
        let (_plugin, backend) = open_backend(name, args.threads, Opening::default())?;
        let label = format!("{} ({})", backend.name(), backend.describe());
        let gemm = lockstep_backends::UnitsGemm::with_threads(backend, threads_or_all(args.threads));
        let source: Box<dyn DataSource> = Box::new(CorpusSource::new(corpus.clone(), run.seed));
        let mut trainer = Trainer::new(run, Box::new(gemm), source)?;
        if let Some(s) = &state {
            trainer.restore(s.clone())?;
        }
        trainer.set_audit_all(true);
        let mut hashes = Vec::new();
        let mut outcome = None;
        while trainer.step_count() < end {
            match trainer.step() {
                Ok(report) => hashes.push((report.step, report.weight_hash)),
                Err(ContributeError::Compute(ComputeError::Audit(failure))) => {
                    outcome = Some(Outcome::Departed(failure));
                    break;
                }
                Err(e) => return Err(anyhow::Error::new(e).context(format!("replaying on `{name}`"))),
            }
        }
        let outcome = outcome.unwrap_or(Outcome::Followed(hashes));
        departed |= matches!(outcome, Outcome::Departed(_));
        report(name, &label, start, end, &outcome, args.json);
    }
    Ok(ExitCode::from(u8::from(departed)))
}

fn report(name: &str, label: &str, start: u32, end: u32, outcome: &Outcome, json: bool) {
    match (outcome, json) {
        (Outcome::Followed(hashes), false) => {
            let (step, hash) = hashes.last().copied().unwrap_or_default();
            println!(
                "{name}: steps {}..={end} follow the definition at every op; weight hash after step {step}: {hash:#010x} ({label})",
                start + 1
            );
        }
        (Outcome::Followed(hashes), true) => {
            let steps: Vec<_> = hashes.iter().map(|(s, h)| json!({"step": s, "whash": format!("{h:#010x}")})).collect();
            println!("{}", json!({"backend": name, "device": label, "followed": true, "steps": steps}));
        }
        (Outcome::Departed(f), false) => {
            let m = &f.mismatch;
            println!(
                "{name}: DEPARTS at step {}, op #{} ({}): {} word(s) of buffer {} differ; first, word {}: the definition gives {:#010x} ({}), the backend {:#010x} ({}) ({label})",
                f.step,
                m.call,
                m.op,
                m.differing,
                m.buffer,
                m.index,
                m.expected_bits,
                f32::from_bits(m.expected_bits),
                m.actual_bits,
                f32::from_bits(m.actual_bits)
            );
        }
        (Outcome::Departed(f), true) => {
            let m = &f.mismatch;
            println!(
                "{}",
                json!({"backend": name, "device": label, "followed": false, "step": f.step, "op_index": m.call,
                    "op": m.op, "buffer": m.buffer, "word": m.index, "expected_bits": format!("{:#010x}", m.expected_bits),
                    "actual_bits": format!("{:#010x}", m.actual_bits), "differing": m.differing})
            );
        }
    }
}
