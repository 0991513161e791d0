//! `lockstep train`: single-node training, no network.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use lockstep_mesh::data_client::RemoteSource;
use lockstep_node::admission::{AtRunShapes, ShapesRefused};
use lockstep_node::checkpoint;
use lockstep_node::config::RunConfig;
use lockstep_node::data::{Corpus, CorpusSource, DataSource, Origin};
use lockstep_node::sync::{self, Values};
use lockstep_node::trainer::{TrainState, Trainer};

use crate::backend::{admit_at_run_shapes, gemm_for};
use crate::run_args::{CorpusArg, RunArgs};

#[derive(clap::Args)]
pub struct TrainArgs {
    /// The run (with `--resume`: only `--steps`, which extends the checkpoint's run).
    #[command(flatten)]
    run: RunArgs,
    /// `auto` (DP4A, then LUT, then CPU, each gated, hardware GPUs only), `cpu`, `lut`,
    /// `dp4a`, a plugin path, or `float` for the float reference trainer (no units).
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Hot-swap the backend after a step: `STEP:NAME` (repeatable). The new backend is gated
    /// first; if it is refused, training continues on the old one.
    #[arg(long = "swap", value_name = "STEP:NAME")]
    swaps: Vec<String>,
    /// Live audit: every this many steps one product of the step is recomputed by the CPU
    /// reference and compared bit for bit; a mismatch stops the run (0: off).
    #[arg(long, default_value_t = 100)]
    audit_every: u32,
    /// Threads for CPU backends (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: u32,
    /// Stop after this many completed steps (default: the run length).
    #[arg(long)]
    until: Option<u32>,
    /// Continue from a checkpoint (its run settings replace the flags above, except `--steps`,
    /// which extends the run).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Write a checkpoint here at the end.
    #[arg(long)]
    ckpt_out: Option<PathBuf>,
    /// Held-out batches evaluated at the end (0: skip).
    #[arg(long, default_value_t = 4)]
    eval_batches: usize,
    /// Print one JSON line per step instead of the progress display.
    #[arg(long)]
    json: bool,
    /// Replay a mesh group in this one process: one replica per listed peer id (each on its
    /// own data stream, as `lockstep node` samples it), contributions averaged as the run's
    /// sync settings say, one update per sync; prints the same per-sync weight hashes the
    /// group's nodes report.
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    replay_group: Vec<u64>,
    /// With `--replay-group` in elastic windows: each sync's weights (the inner steps each
    /// member's contribution stood for, as the nodes' `step` events report them), one
    /// `W/W/…` per sync in the order of the ids, the syncs separated by commas.
    #[arg(long, value_delimiter = ',', value_name = "W/W/…")]
    replay_weights: Vec<String>,
    /// Fetch training text from a signaling server's `/data` (e.g. `http://127.0.0.1:8787/data`)
    /// instead of the corpus; falls back to the built-in corpus when it is unreachable.
    #[arg(long)]
    data: Option<String>,
    #[command(flatten)]
    corpus: CorpusArg,
}

/// A mesh group's arithmetic in one process: one trainer per member id (each on its own data
/// stream, as `lockstep node` samples it), contributions averaged as the run's sync settings
/// say. Averaged here by hand rather than with the session's `Contributions`, so the mesh tests
/// compare the protocol's arithmetic with an independent statement of it: f32 summed in
/// ascending id order; int8 and int4 by `sync::reduce` (the exact sum, weighed in elastic
/// windows), whose bits no order or schedule can change — its unit tests and the session
/// simulations' written-out sums check it.
pub struct GroupReplay {
    replicas: Vec<Trainer>,
}

impl GroupReplay {
    pub fn new(
        run: RunConfig,
        ids: &[u64],
        backend: &str,
        threads: u32,
        corpus: Arc<Corpus>,
    ) -> anyhow::Result<GroupReplay> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        anyhow::ensure!(!ids.is_empty(), "a group needs a member");
        let mut replicas = Vec::new();
        for &id in &ids {
            let gemm = gemm_for(backend, threads, true)?;
            let data = Box::new(CorpusSource::new(corpus.clone(), lockstep_node::data::node_data_seed(run.seed, id)));
            replicas.push(Trainer::new(run, gemm, data)?);
        }
        Ok(GroupReplay { replicas })
    }

    /// Optimizer steps each member has taken.
    pub fn step_count(&self) -> u32 {
        self.replicas[0].step_count()
    }

    /// One sync of the whole group; returns the weight hash after it.
    pub fn sync(&mut self) -> anyhow::Result<u32> {
        self.sync_weighted(None)
    }

    /// One sync in which, in elastic windows, member `i`'s window ends after `weights[i]` of
    /// its inner steps (ascending ids; `None`: every window runs its H); returns the weight hash
    /// after it.
    pub fn sync_weighted(&mut self, weights: Option<&[u32]>) -> anyhow::Result<u32> {
        if let Some(weights) = weights {
            anyhow::ensure!(
                weights.len() == self.replicas.len(),
                "{} weights for {} members",
                weights.len(),
                self.replicas.len()
            );
        }
        let mut contributions = Vec::new();
        let mut taken = Vec::new();
        for (i, replica) in self.replicas.iter_mut().enumerate() {
            let after = weights.map_or(u32::MAX, |w| w[i]);
            replica.hurry().store(after, std::sync::atomic::Ordering::Relaxed);
            let contribution = replica.contribute().context("training step failed")?;
            taken.push(contribution.weight);
            contributions.push(contribution.values);
        }
        if let Some(weights) = weights {
            anyhow::ensure!(taken == weights, "the windows took {taken:?} steps, not {weights:?}");
        }
        // An overlapped run's members run ahead while the group sums (in the mesh, on a thread
        // of their own).
        for replica in &mut self.replicas {
            replica.run_ahead().context("training step failed")?;
        }
        let n = self.replicas.len();
        let (mean, grid) = match &contributions[0] {
            Values::F32(first) => {
                let mut sum = first.clone();
                for values in &contributions[1..] {
                    let Values::F32(v) = values else { bail!("mixed encodings") };
                    sum.iter_mut().zip(v).for_each(|(t, g)| *t += g);
                }
                (sum.iter().map(|v| v / n as f32).collect(), Vec::new())
            }
            // The exact sum is `sync`'s (summed and weighed there; the order cannot matter).
            Values::Int8(_) | Values::Int4(_) => {
                let reduced = sync::reduce(&contributions.iter().collect::<Vec<_>>(), &taken);
                (reduced.mean, reduced.grid)
            }
        };
        for replica in &mut self.replicas {
            replica.finish_sync(&mean, &grid, true)?;
        }
        let whash = self.replicas[0].weight_hash();
        anyhow::ensure!(self.replicas.iter().all(|r| r.weight_hash() == whash), "replicas diverged");
        Ok(whash)
    }

    /// Held-out loss of the group's weights.
    pub fn heldout_loss(&mut self, batches: usize) -> anyhow::Result<f32> {
        Ok(self.replicas[0].heldout_loss(batches)?)
    }
}

/// `--replay-group`: the group's arithmetic in one process (see the flag's help).
fn replay_group(args: &TrainArgs, run: RunConfig, corpus: Arc<Corpus>) -> anyhow::Result<ExitCode> {
    let mut group = GroupReplay::new(run, &args.replay_group, &args.backend, args.threads, corpus)?;
    let weights = args
        .replay_weights
        .iter()
        .map(|sync| {
            sync.split('/')
                .map(|w| {
                    w.parse::<u32>().with_context(|| format!("--replay-weights: `{w}` in `{sync}` is not a count"))
                })
                .collect::<anyhow::Result<Vec<u32>>>()
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let until = args.until.unwrap_or(run.steps);
    while group.step_count() < until {
        let done = (group.step_count() / run.steps_per_sync()) as usize;
        let whash = group.sync_weighted(weights.get(done).map(Vec::as_slice))?;
        let sync = group.step_count() / run.steps_per_sync();
        println!("{}", serde_json::json!({"step": sync, "whash": format!("{whash:#010x}")}));
    }
    if args.eval_batches > 0 {
        let loss = group.heldout_loss(args.eval_batches)?;
        println!("{}", serde_json::json!({"heldout_loss": loss, "steps": group.step_count()}));
    }
    Ok(ExitCode::SUCCESS)
}

/// `STEP:NAME` pairs, sorted by step.
fn parse_swaps(specs: &[String]) -> anyhow::Result<Vec<(u32, String)>> {
    let mut swaps = specs
        .iter()
        .map(|spec| {
            let (step, name) = spec.split_once(':').with_context(|| format!("--swap `{spec}` is not STEP:NAME"))?;
            let step =
                step.parse::<u32>().with_context(|| format!("--swap `{spec}`: `{step}` is not a step number"))?;
            anyhow::ensure!(!name.is_empty(), "--swap `{spec}` names no backend");
            Ok((step, name.to_string()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    swaps.sort_by_key(|(step, _)| *step);
    Ok(swaps)
}

/// Gates `name` and, if admitted, makes it compute from the next step on; otherwise says why
/// and keeps the current backend.
fn swap_backend(trainer: &mut Trainer, name: &str, threads: u32, json: bool, data: Box<dyn DataSource>) {
    let step = trainer.step_count();
    let run = *trainer.run_config();
    match gemm_for(name, threads, true).and_then(|gemm| {
        let (gemm, verdict) = admit_at_run_shapes(&run, gemm, data)?;
        if let Err(refused) = report_at_run_shapes(name, &verdict, json) {
            bail!("{refused}");
        }
        let label = gemm.label();
        trainer
            .replace_gemm(gemm)
            .map(|_old| label)
            .map_err(|(e, _new)| anyhow::anyhow!(e).context("bringing the training state back from the old backend"))
    }) {
        Ok(label) => {
            if json {
                println!("{}", serde_json::json!({"swap": name, "after_step": step, "ok": true, "now": label}));
            } else {
                println!("swap: after step {step}: now {label}");
            }
        }
        Err(error) => {
            let why = format!("{error:#}");
            if json {
                println!("{}", serde_json::json!({"swap": name, "after_step": step, "ok": false, "why": why}));
            } else {
                println!("swap: after step {step}: `{name}` refused, keeping {}: {why}", trainer.gemm_label());
            }
        }
    }
}

/// Says how `backend` fared at the run's own shapes (a JSON line with `json`); the refusal
/// back as an error.
fn report_at_run_shapes(backend: &str, verdict: &AtRunShapes, json: bool) -> Result<(), ShapesRefused> {
    if json {
        println!("{}", crate::headless::at_run_shapes_json(backend, verdict));
    }
    match verdict {
        Ok((admitted, seconds)) => {
            if !json && admitted.ops > 0 {
                println!(
                    "train: `{backend}` admitted at the run's own shapes: one step, its {} ops each checked against the definition, in {seconds:.1} s",
                    admitted.ops
                );
            }
            Ok(())
        }
        Err(refused) => Err(refused.clone()),
    }
}

/// `--resume` with `--steps N`: the run is `N` steps long from now on. The learning-rate
/// schedule is a function of the step and the run length, so the steps after the checkpoint
/// follow the schedule of an `N`-step run (`docs/MODEL.md`). A length the checkpoint has
/// already reached would train nothing: refused.
fn extend_run(mut state: TrainState, steps: u32) -> anyhow::Result<TrainState> {
    if steps <= state.step {
        bail!(
            "the checkpoint is at step {} of a {}-step run; --steps {steps} would train nothing \
             (give a larger --steps to extend the run, or leave it out)",
            state.step,
            state.run.steps
        );
    }
    state.run.steps = steps;
    Ok(state)
}

pub fn run(args: TrainArgs) -> anyhow::Result<ExitCode> {
    let resumed = match &args.resume {
        Some(path) => Some(checkpoint::load(path, None).with_context(|| format!("resuming from {}", path.display()))?),
        None => None,
    };
    let resumed = match (resumed, args.run.given("steps")) {
        (Some(state), Some(_)) => Some(extend_run(state, args.run.run_config()?.steps)?),
        (resumed, _) => resumed,
    };
    let mut run = match &resumed {
        Some(state) => state.run,
        None => args.run.run_config()?,
    };
    if let Err(why) = run.validate() {
        bail!("invalid configuration: {why}");
    }
    // The corpus is read only where the run trains on it (`--data` trains on `/data`'s slices).
    let load_corpus = || args.corpus.load(&mut |line| eprintln!("train: {line}"));
    if !args.replay_group.is_empty() {
        return replay_group(&args, run, load_corpus()?);
    }
    let (source, corpus): (Box<dyn DataSource>, _) = match &args.data {
        Some(url) => (Box::new(RemoteSource::new(url, run.seed)?), None),
        None => {
            let corpus = load_corpus()?;
            (Box::new(CorpusSource::new(corpus.clone(), run.seed)), Some(corpus))
        }
    };
    if resumed.is_none() {
        // The run's text, as a group's would record it (its checkpoints carry it).
        run.corpus = corpus.as_ref().map_or(0, |c| c.digest());
    }
    let gemm = gemm_for(&args.backend, args.threads, args.json)?;
    // Admitted by the gate; now at the run's own shapes, before it trains any of it.
    let check_data = || -> Box<dyn DataSource> {
        match &corpus {
            Some(corpus) => Box::new(CorpusSource::new(corpus.clone(), run.seed)),
            None => Box::new(CorpusSource::builtin(run.seed)),
        }
    };
    let (gemm, verdict) = admit_at_run_shapes(&run, gemm, check_data())?;
    if let Err(refused) = report_at_run_shapes(&args.backend, &verdict, args.json) {
        bail!("`{}` may not train this run: {refused}", args.backend);
    }
    let mut swaps = parse_swaps(&args.swaps)?;
    let mut trainer = Trainer::new(run, gemm, source)?;
    if args.backend != "float" {
        trainer.set_audit_every(args.audit_every);
    }
    if let Some(state) = resumed {
        trainer.restore(state)?;
    }
    let until = args.until.unwrap_or(run.steps);
    if !args.json {
        let params = trainer.parameter_count();
        println!(
            "train: {params} parameters (c={} t={} layers={} heads={}), batch {}, lr {}, seed {}, {}",
            run.model.width,
            run.model.context,
            run.model.layers,
            run.model.heads,
            run.batch,
            run.lr,
            run.seed,
            trainer.gemm_label()
        );
        println!(
            "       data: {}; steps {} → {until} of {}",
            trainer.data_description(),
            trainer.step_count(),
            run.steps
        );
    }
    let live = !args.json && std::io::stdout().is_terminal();
    let started = Instant::now();
    let first_step = trainer.step_count();
    let mut last = None;
    let mut last_origin_kind = None;
    while trainer.step_count() < until {
        // Hot-swaps happen here, at a step boundary.
        while let Some(&(at, ref name)) = swaps.first() {
            if at > trainer.step_count() {
                break;
            }
            swap_backend(&mut trainer, name, args.threads, args.json, check_data());
            swaps.remove(0);
        }
        let report = trainer.step().context("training step failed")?;
        // Say when the data's origin changes (remote, built-in, or a fallback and why).
        let kind = std::mem::discriminant(&report.origin);
        if last_origin_kind != Some(kind) && !args.json {
            match &report.origin {
                Origin::Corpus => {}
                Origin::Remote(what) => eprintln!("\rdata: step {} from /data ({what})", report.step),
                Origin::Fallback { reason } => eprintln!("\rdata: step {}: {reason}", report.step),
            }
        }
        last_origin_kind = Some(kind);
        let elapsed = started.elapsed().as_secs_f64();
        let tokens_per_s = (report.step - first_step) as f64 * report.tokens as f64 / elapsed.max(1e-9);
        if args.json {
            println!(
                "{}",
                serde_json::json!({"step": report.step, "loss": report.loss, "whash": format!("{:#010x}", report.weight_hash), "tokens_per_s": tokens_per_s, "audited": report.audited.map(|(op, name)| format!("#{op} {name}"))})
            );
        } else if live {
            let done = (report.step - first_step) as f64 / (until - first_step).max(1) as f64;
            let bar: String = (0..30).map(|i| if (i as f64) < done * 30.0 { '#' } else { '.' }).collect();
            print!("\rstep {:>6}/{until} [{bar}] loss {:.4}  {:>8.0} tok/s", report.step, report.loss, tokens_per_s);
            let _ = std::io::stdout().flush();
        } else if report.step % 50 == 0 || report.step == until {
            println!(
                "step {:>6}/{until} loss {:.4} {:>8.0} tok/s whash {:#010x}",
                report.step, report.loss, tokens_per_s, report.weight_hash
            );
        }
        last = Some(report);
    }
    if live {
        println!();
    }
    if let Some(path) = &args.ckpt_out {
        let state = trainer.state().context("bringing the training state back from the backend")?;
        checkpoint::save(path, &state).with_context(|| format!("writing {}", path.display()))?;
        if !args.json {
            println!("checkpoint: {}", path.display());
        }
    }
    // Tokens are bytes: the share of the corpus's training text this run has seen (windows
    // drawn at random, so some of it twice: `docs/DATA.md`).
    let tokens = u64::from(trainer.step_count()) * run.tokens_per_step() as u64;
    let share = corpus.map(|corpus| tokens as f64 / corpus.train().len().max(1) as f64);
    if args.eval_batches > 0 {
        let heldout = trainer.heldout_loss(args.eval_batches).context("evaluation failed")?;
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "heldout_loss": heldout,
                    "heldout_loss_bits": format!("{:#010x}", heldout.to_bits()),
                    "tokens": tokens,
                    "corpus_share": share,
                })
            );
        } else {
            println!(
                "held-out loss: {heldout:.4} ({} windows of {})",
                args.eval_batches * run.batch,
                run.model.context
            );
        }
    }
    if let (false, Some(share)) = (args.json, share) {
        println!("trained on {tokens} tokens, {:.2}% of the size of the corpus's training text", share * 100.0);
    }
    if !args.json {
        let step = trainer.step_count();
        let whash = trainer.weight_hash();
        match &last {
            Some(report) => println!("final: step {step} loss {:.4} whash {whash:#010x}", report.loss),
            None => println!("final: step {step} (no step trained) whash {whash:#010x}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
