//! `lockstep node --headless`: one mesh node driven by JSON lines.
//!
//! Events go to stdout, one JSON object per line (`lockstep_mesh::Report::to_json`); commands
//! come from stdin, one JSON object per line:
//!
//! - `{"cmd": "start", "steps": 50, "width": 32, "context": 32, "layers": 1, "heads": 2,
//!   "batch": 4, "lr": 0.003, "seed": 1}` — start a run and lead it (omitted fields take the
//!   defaults of `lockstep train`);
//! - `{"cmd": "push", "path": "run.ckpt"}` — restore the whole group from a checkpoint;
//! - `{"cmd": "cut", "peer": 42}` — fault injection for tests: stop sending to that peer;
//! - `{"cmd": "flip"}` — fault injection for tests: flip one bit of this node's weights;
//! - `{"cmd": "quit"}` (or end of input) — leave.
//!
//! `docs/PROTOCOL.md` lists every event.

use std::io::{BufRead, Write};
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use lockstep_mesh::{Command, MeshConfig, Replica, Report};
use lockstep_node::checkpoint;
use lockstep_node::config::{ModelConfig, RunConfig};
use lockstep_node::data::{node_data_seed, BuiltinSource};
use lockstep_node::gemm::Gemm;
use lockstep_node::trainer::Trainer;
use lockstep_node::wire::{Gradient, RunSettings, MESH_PROTOCOL_VERSION};
use serde_json::Value;

#[derive(clap::Args)]
pub struct NodeArgs {
    /// Print events as JSON lines and read commands from stdin (the console arrives later).
    #[arg(long)]
    headless: bool,
    /// The signaling server's WebSocket URL, e.g. `ws://127.0.0.1:8787/ws?room=demo`.
    #[arg(long)]
    signal: String,
    /// `cpu`, `lut`, `dp4a`, a plugin path, or `auto`.
    #[arg(long, default_value = "auto")]
    backend: String,
    /// Threads for CPU backends (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: u32,
    /// The address WebRTC binds and offers as its host candidate.
    #[arg(long, default_value = "127.0.0.1")]
    bind_ip: IpAddr,
    /// STUN or TURN server URLs (`stun:host:3478`, `turn:host:3478`), repeatable.
    #[arg(long = "ice-server")]
    ice_servers: Vec<String>,
    #[arg(long, default_value = "")]
    turn_username: String,
    #[arg(long, default_value = "")]
    turn_credential: String,
    /// How long to wait for a gradient before asking the leader for it.
    #[arg(long, default_value_t = 2000)]
    repair_after_ms: u64,
}

/// The trainer as the mesh sees it.
pub struct TrainerReplica {
    backend: String,
    threads: u32,
    /// This node's id: its data stream is `node_data_seed(run seed, id)`.
    me: u64,
    /// A backend already gated (at start-up), used by the first run instead of gating again.
    admitted: Option<Box<dyn Gemm + Send>>,
    trainer: Option<Trainer>,
    /// The current weights' hash: computed once per update (or restore) and reported as the
    /// next step's `whash`.
    whash: Option<u32>,
    hash_seconds: f64,
}

impl TrainerReplica {
    /// `admitted`: a gated instance of `backend` to use for the first run, if there is one.
    pub fn new(backend: &str, threads: u32, admitted: Option<Box<dyn Gemm + Send>>) -> Self {
        TrainerReplica {
            backend: backend.to_string(),
            threads,
            me: 0,
            admitted,
            trainer: None,
            whash: None,
            hash_seconds: 0.0,
        }
    }

    fn trainer(&mut self) -> Result<&mut Trainer, String> {
        self.trainer.as_mut().ok_or_else(|| "no run is configured".to_string())
    }

    /// Hashes the current weights once and keeps the hash.
    fn rehash(&mut self) -> u32 {
        let began = std::time::Instant::now();
        let whash = self.trainer.as_ref().map_or(0, |t| t.weight_hash());
        self.hash_seconds += began.elapsed().as_secs_f64();
        self.whash = Some(whash);
        whash
    }
}

fn run_config(settings: &RunSettings) -> RunConfig {
    RunConfig {
        model: ModelConfig {
            width: settings.width as usize,
            context: settings.context as usize,
            layers: settings.layers as usize,
            heads: settings.heads as usize,
        },
        batch: settings.batch as usize,
        steps: settings.steps,
        lr: settings.lr,
        seed: settings.seed,
    }
}

impl Replica for TrainerReplica {
    fn configure(&mut self, settings: &RunSettings) -> Result<usize, String> {
        let run = run_config(settings);
        run.validate()?;
        let gemm = match self.admitted.take() {
            Some(gemm) => gemm,
            None => crate::train::gemm_for(&self.backend, self.threads, true).map_err(|e| format!("{e:#}"))?,
        };
        let data = Box::new(BuiltinSource::new(node_data_seed(run.seed, self.me)));
        let trainer = Trainer::new(run, gemm, data)?;
        let weights = trainer.weights().len();
        self.trainer = Some(trainer);
        self.rehash();
        Ok(weights)
    }

    fn compute(&mut self, step: u32) -> Result<Gradient, String> {
        let whash = match self.whash {
            Some(whash) => whash,
            None => self.rehash(),
        };
        let trainer = self.trainer()?;
        if trainer.step_count() + 1 != step {
            return Err(format!("asked for step {step} at step {}", trainer.step_count()));
        }
        let probing = std::time::Instant::now();
        let phash = trainer.probe_hash().map_err(|e| e.to_string())?;
        let probe_seconds = probing.elapsed().as_secs_f64();
        let (loss, grad, _) = trainer.gradient().map_err(|e| e.to_string())?;
        self.hash_seconds += probe_seconds;
        Ok(Gradient { step, whash, phash, loss, grad })
    }

    fn apply(&mut self, gradient: &[f32]) -> u32 {
        if let Some(trainer) = self.trainer.as_mut() {
            trainer.apply(gradient);
        }
        self.rehash()
    }

    fn snapshot(&self) -> Vec<u8> {
        self.trainer.as_ref().map_or_else(Vec::new, |t| checkpoint::encode(&t.state()))
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(u32, usize), String> {
        let trainer = self.trainer()?;
        let mut state = checkpoint::decode(bytes, Some(trainer.run_config().model)).map_err(|e| e.to_string())?;
        // Weights, step and optimizer come from the checkpoint; this node keeps its own data
        // stream (its batches are its own in a data-parallel group).
        state.data_state = trainer.data_state();
        let step = state.step;
        trainer.restore(state)?;
        let weights = trainer.weights().len();
        self.rehash();
        Ok((step, weights))
    }

    fn weight_hash(&self) -> u32 {
        self.whash.unwrap_or_else(|| self.trainer.as_ref().map_or(0, |t| t.weight_hash()))
    }

    fn take_hash_seconds(&mut self) -> f64 {
        std::mem::take(&mut self.hash_seconds)
    }

    fn set_identity(&mut self, peer: u64) {
        self.me = peer;
    }

    fn flip_weight_bit(&mut self) {
        if let Some(trainer) = self.trainer.as_mut() {
            let mut state = trainer.state();
            state.weights[0] = f32::from_bits(state.weights[0].to_bits() ^ 1);
            let _ = trainer.restore(state);
        }
        self.whash = None;
    }
}

fn settings_from(command: &Value) -> anyhow::Result<RunSettings> {
    let defaults = RunConfig::DEFAULT;
    let number = |key: &str, default: u64| -> anyhow::Result<u64> {
        match command.get(key) {
            None => Ok(default),
            Some(v) => v.as_u64().with_context(|| format!("`{key}` must be a non-negative integer")),
        }
    };
    let small = |key: &str, default: usize| -> anyhow::Result<u32> {
        u32::try_from(number(key, default as u64)?).with_context(|| format!("`{key}` is too large"))
    };
    let lr = match command.get("lr") {
        None => defaults.lr,
        Some(v) => v.as_f64().context("`lr` must be a number")? as f32,
    };
    Ok(RunSettings {
        protocol: MESH_PROTOCOL_VERSION,
        width: small("width", defaults.model.width)?,
        context: small("context", defaults.model.context)?,
        batch: small("batch", defaults.batch)?,
        layers: small("layers", defaults.model.layers)?,
        heads: small("heads", defaults.model.heads)?,
        steps: small("steps", defaults.steps as usize)?,
        lr,
        seed: number("seed", defaults.seed)?,
    })
}

/// One stdin line as a command.
fn parse_command(line: &str) -> anyhow::Result<Command> {
    let value: Value = serde_json::from_str(line).context("not JSON")?;
    match value["cmd"].as_str() {
        Some("start") => {
            let settings = settings_from(&value)?;
            run_config(&settings).validate().map_err(anyhow::Error::msg)?;
            Ok(Command::Start(settings))
        }
        Some("push") => {
            let path = value["path"].as_str().context("`push` needs a `path`")?;
            let bytes = std::fs::read(path).with_context(|| format!("reading {path}"))?;
            checkpoint::decode(&bytes, None).with_context(|| format!("{path} is not a valid checkpoint"))?;
            Ok(Command::PushCheckpoint(bytes))
        }
        Some("cut") => Ok(Command::CutLinkTo(value["peer"].as_u64().context("`cut` needs a `peer`")?)),
        Some("flip") => Ok(Command::FlipWeightBit),
        Some("quit") => Ok(Command::Quit),
        other => bail!("unknown command {other:?} (start, push, cut, flip, quit)"),
    }
}

fn emit(value: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

pub fn run(args: NodeArgs) -> anyhow::Result<ExitCode> {
    if !args.headless {
        bail!("the console is not built yet: run with --headless");
    }
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let config = MeshConfig {
        signal_url: args.signal.clone(),
        bind_ip: args.bind_ip,
        ice_servers: args.ice_servers.clone(),
        turn_username: args.turn_username.clone(),
        turn_credential: args.turn_credential.clone(),
        expected_phash: lockstep_luts::probe::reference_probe_hash().context("the reference probe")?,
        repair_after_ms: args.repair_after_ms,
    };
    // Gate the backend up front, so a refused backend fails before joining; the first run
    // uses this instance.
    let admitted = crate::train::gemm_for(&args.backend, args.threads, true)?;
    let replica: Arc<Mutex<dyn Replica>> =
        Arc::new(Mutex::new(TrainerReplica::new(&args.backend, args.threads, Some(admitted))));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line.trim().is_empty() {
                continue;
            }
            match parse_command(&line) {
                Ok(command) => {
                    if tx.send(command).is_err() {
                        return;
                    }
                }
                Err(e) => emit(serde_json::json!({"event": "command-error", "message": format!("{e:#}")})),
            }
        }
        let _ = tx.send(Command::Quit);
    });
    runtime.block_on(lockstep_mesh::run(config, replica, rx, |report: Report| emit(report.to_json())))?;
    Ok(ExitCode::SUCCESS)
}
