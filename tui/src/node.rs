//! `lockstep node`: one mesh node, with the console (default) or headless (JSON lines).
//!
//! This file holds what both front-ends share: the trainer as the mesh sees it
//! ([`TrainerReplica`]), the node's runtime ([`NodeHandle`]: the mesh on its own thread, a
//! command channel, hot-swaps gated off the event loop), and the headless front-end.
//!
//! Headless: events go to stdout, one JSON object per line (`lockstep_mesh::Report::to_json`);
//! commands come from stdin, one JSON object per line — `docs/PROTOCOL.md` lists both.

use std::io::{BufRead, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use lockstep_mesh::{BackendChange, CheckpointTarget, Command, MeshConfig, Replica, Report, SwapProgress};
use lockstep_node::checkpoint;
use lockstep_node::config::{ModelConfig, RunConfig};
use lockstep_node::data::{node_data_seed, BuiltinSource, DataSource, RemoteSource};
use lockstep_node::gemm::Gemm;
use lockstep_node::trainer::Trainer;
use lockstep_node::wire::{Gradient, PeerId, RunSettings, MESH_PROTOCOL_VERSION};
use serde_json::Value;

use crate::backend::{admit, Opening};
use crate::train::ModelArgs;

#[derive(clap::Args)]
pub struct NodeArgs {
    /// Print events as JSON lines and read commands from stdin instead of opening the console.
    #[arg(long)]
    headless: bool,
    /// The signaling server's WebSocket URL, e.g. `ws://127.0.0.1:8787/ws?room=demo`.
    #[arg(long)]
    signal: String,
    #[command(flatten)]
    mesh: MeshArgs,
    /// The run this node starts when it starts one (console `s`, headless `start` defaults).
    #[command(flatten)]
    model: ModelArgs,
}

/// How a node computes and connects (shared by `node` and `demo`).
#[derive(clap::Args, Clone)]
pub struct MeshArgs {
    /// `cpu`, `lut`, `dp4a`, a plugin path, or `auto`.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Threads for CPU backends (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: u32,
    /// The address WebRTC binds and offers as its host candidate. Default: 127.0.0.1 when the
    /// signaling server is on this machine's loopback, else the address this machine reaches
    /// the signaling server from (its LAN or public interface).
    #[arg(long)]
    pub bind_ip: Option<IpAddr>,
    /// STUN or TURN server URLs (`stun:host:3478`, `turn:host:3478`), repeatable.
    #[arg(long = "ice-server")]
    pub ice_servers: Vec<String>,
    #[arg(long, default_value = "")]
    pub turn_username: String,
    #[arg(long, default_value = "")]
    pub turn_credential: String,
    /// How long to wait for a gradient before asking the leader for it.
    #[arg(long, default_value_t = 2000)]
    pub repair_after_ms: u64,
    /// Where checkpoints are saved (and listed for broadcast).
    #[arg(long, default_value = "checkpoints")]
    pub ckpt_dir: PathBuf,
    /// Fetch training text from a `/data` URL (e.g. `http://HOST:8787/data`); unreachable means
    /// the built-in corpus.
    #[arg(long)]
    pub data: Option<String>,
}

/// A backend admitted by the gate and waiting for the next step boundary.
struct Staged {
    name: String,
    verdict: String,
    gemm: Box<dyn Gemm + Send>,
}

/// The trainer as the mesh sees it.
pub struct TrainerReplica {
    /// What a run with no backend at hand (none admitted, none from a previous run) opens.
    backend: String,
    threads: u32,
    data_url: Option<String>,
    /// This node's id: its data stream is `node_data_seed(run seed, id)`.
    me: u64,
    /// A backend already gated, used by the next run instead of gating again (a later run
    /// takes the previous run's backend).
    admitted: Option<Box<dyn Gemm + Send>>,
    staged: Option<Staged>,
    change: Option<BackendChange>,
    trainer: Option<Trainer>,
    /// The current weights' hash: computed once per update (or restore) and reported as the
    /// next step's `whash`.
    whash: WeightHash,
    hash_seconds: f64,
}

/// The current weights' hash, or the thread computing it.
enum WeightHash {
    Unknown,
    Known(u32),
    /// FNV-1a is byte-serial (~0.8 GB/s): after an update it runs on a thread of its own, over
    /// a copy of the weights, while the next step computes; the step joins it at the end.
    Pending(std::thread::JoinHandle<u32>),
}

impl TrainerReplica {
    /// `admitted`: a gated instance of `backend` to use for the first run, if there is one.
    pub fn new(backend: &str, threads: u32, admitted: Option<Box<dyn Gemm + Send>>) -> Self {
        TrainerReplica {
            backend: backend.to_string(),
            threads,
            data_url: None,
            me: 0,
            admitted,
            staged: None,
            change: None,
            trainer: None,
            whash: WeightHash::Unknown,
            hash_seconds: 0.0,
        }
    }

    /// Batches come from this `/data` URL (falling back to the built-in corpus).
    pub fn with_data(mut self, url: Option<String>) -> Self {
        self.data_url = url;
        self
    }

    /// Makes an admitted backend compute from the next step on (or the next run, between runs).
    fn stage(&mut self, name: String, verdict: String, gemm: Box<dyn Gemm + Send>) {
        let staged = Staged { name, verdict, gemm };
        if self.trainer.is_none() {
            // No run to wait for: it is in use from now (the first run takes it).
            self.admitted = Some(self.take_up(staged, 1));
        } else {
            self.staged = Some(staged);
        }
    }

    /// `staged` computes from `step` on: recorded as this node's backend and as a change to
    /// announce; its products are returned to be put in place.
    fn take_up(&mut self, staged: Staged, step: u32) -> Box<dyn Gemm + Send> {
        self.change = Some(BackendChange { backend: staged.name.clone(), verdict: staged.verdict, step });
        self.backend = staged.name;
        staged.gemm
    }

    fn trainer(&mut self) -> Result<&mut Trainer, String> {
        self.trainer.as_mut().ok_or_else(|| "no run is configured".to_string())
    }

    /// Hashes the current weights once and keeps the hash.
    fn rehash(&mut self) -> u32 {
        let began = std::time::Instant::now();
        let whash = self.trainer.as_ref().map_or(0, |t| t.weight_hash());
        self.hash_seconds += began.elapsed().as_secs_f64();
        self.whash = WeightHash::Known(whash);
        whash
    }

    /// The current weights' hash: known, joined from its thread, or computed now.
    fn resolve_hash(&mut self) -> u32 {
        let whash = match std::mem::replace(&mut self.whash, WeightHash::Unknown) {
            WeightHash::Known(whash) => whash,
            WeightHash::Pending(thread) => {
                let began = std::time::Instant::now();
                let Ok(whash) = thread.join() else { return self.rehash() };
                // Only the wait is on the step's path.
                self.hash_seconds += began.elapsed().as_secs_f64();
                whash
            }
            WeightHash::Unknown => return self.rehash(),
        };
        self.whash = WeightHash::Known(whash);
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

/// The wire's run settings for a run configuration.
pub fn settings_of(run: &RunConfig) -> RunSettings {
    RunSettings {
        protocol: MESH_PROTOCOL_VERSION,
        width: run.model.width as u32,
        context: run.model.context as u32,
        batch: run.batch as u32,
        layers: run.model.layers as u32,
        heads: run.model.heads as u32,
        steps: run.steps,
        lr: run.lr,
        seed: run.seed,
    }
}

impl Replica for TrainerReplica {
    fn configure(&mut self, settings: &RunSettings) -> Result<usize, String> {
        let run = run_config(settings);
        run.validate()?;
        let seed = node_data_seed(run.seed, self.me);
        let data: Box<dyn DataSource> = match &self.data_url {
            Some(url) => Box::new(RemoteSource::new(url, seed)?),
            None => Box::new(BuiltinSource::new(seed)),
        };
        // The backend: a swap staged during the last run, else the one admitted at start-up,
        // else the last run's (a path-loaded or swapped-in plugin stays), else open one.
        let previous = self.trainer.take();
        let gemm = if let Some(staged) = self.staged.take() {
            self.take_up(staged, 1)
        } else if let Some(gemm) = self.admitted.take() {
            gemm
        } else if let Some(previous) = previous {
            previous.into_gemm()
        } else {
            crate::train::gemm_for(&self.backend, self.threads, true).map_err(|e| format!("{e:#}"))?
        };
        let trainer = Trainer::new(run, gemm, data)?;
        let weights = trainer.weights().len();
        self.trainer = Some(trainer);
        self.rehash();
        Ok(weights)
    }

    fn compute(&mut self, step: u32) -> Result<Gradient, String> {
        // A staged hot-swap takes over here, at the step boundary.
        if let Some(staged) = self.staged.take().filter(|_| self.trainer.is_some()) {
            let gemm = self.take_up(staged, step);
            self.trainer()?.replace_gemm(gemm);
        }
        let trainer = self.trainer()?;
        if trainer.step_count() + 1 != step {
            return Err(format!("asked for step {step} at step {}", trainer.step_count()));
        }
        let probing = std::time::Instant::now();
        let phash = trainer.probe_hash().map_err(|e| e.to_string())?;
        let probe_seconds = probing.elapsed().as_secs_f64();
        let (loss, grad, _) = trainer.gradient().map_err(|e| e.to_string())?;
        self.hash_seconds += probe_seconds;
        // The hash of the weights this step started from (computed alongside, see `apply`).
        let whash = self.resolve_hash();
        Ok(Gradient { step, whash, phash, loss, grad })
    }

    fn apply(&mut self, gradient: &[f32]) {
        let Some(trainer) = self.trainer.as_mut() else { return };
        trainer.apply(gradient);
        let began = std::time::Instant::now();
        let weights = trainer.weights().to_vec();
        self.hash_seconds += began.elapsed().as_secs_f64();
        self.whash = match std::thread::Builder::new()
            .name("weight-hash".into())
            .spawn(move || lockstep_node::params::weight_hash(&weights))
        {
            Ok(thread) => WeightHash::Pending(thread),
            Err(_) => WeightHash::Unknown,
        };
    }

    fn snapshot(&self) -> Vec<u8> {
        self.trainer.as_ref().map_or_else(Vec::new, |t| checkpoint::encode(&t.state()))
    }

    fn steps_done(&self) -> u32 {
        self.trainer.as_ref().map_or(0, Trainer::step_count)
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

    fn weight_hash(&mut self) -> u32 {
        self.resolve_hash()
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
        self.whash = WeightHash::Unknown;
    }

    fn take_backend_change(&mut self) -> Option<BackendChange> {
        self.change.take()
    }
}

/// Where a node's reports go.
pub type Sink = Arc<dyn Fn(Report) + Send + Sync>;

/// A running node: the mesh on its own thread (with its own async runtime), and the handles
/// the front-ends drive it with.
pub struct NodeHandle {
    commands: tokio::sync::mpsc::UnboundedSender<Command>,
    replica: Arc<Mutex<TrainerReplica>>,
    threads: u32,
    sink: Sink,
    thread: std::thread::JoinHandle<anyhow::Result<()>>,
}

impl NodeHandle {
    /// Joins the group at `config.signal_url` with `replica`; reports go to `sink`.
    pub fn start(config: MeshConfig, replica: TrainerReplica, sink: Sink) -> anyhow::Result<NodeHandle> {
        let threads = replica.threads;
        let replica = Arc::new(Mutex::new(replica));
        let (commands, rx) = tokio::sync::mpsc::unbounded_channel();
        let shared: Arc<Mutex<dyn Replica>> = replica.clone();
        let report = sink.clone();
        let thread = std::thread::Builder::new()
            .name("mesh".into())
            .spawn(move || -> anyhow::Result<()> {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .context("starting the async runtime")?;
                runtime.block_on(lockstep_mesh::run(config, shared, rx, move |r: Report| report(r)))
            })
            .context("starting the mesh thread")?;
        Ok(NodeHandle { commands, replica, threads, sink, thread })
    }

    pub fn send(&self, command: Command) {
        let _ = self.commands.send(command);
    }

    /// Whether the mesh has stopped (signaling closed, denied, or quit).
    pub fn finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Hot-swap: gates `name` on a thread of its own (reporting progress), then stages it for
    /// the next step boundary; a refusal keeps the current backend and says why.
    pub fn swap(&self, name: String) {
        let replica = self.replica.clone();
        let sink = self.sink.clone();
        let threads = self.threads;
        std::thread::spawn(move || {
            sink(Report::Swap(SwapProgress::Gating { backend: name.clone(), done: 0, total: 0 }));
            let opening = Opening { hardware_only: false, fresh_copy: true };
            let mut progress = |p: lockstep_backends::gate::GateProgress<'_>| {
                sink(Report::Swap(SwapProgress::Gating { backend: name.clone(), done: p.done, total: p.total }))
            };
            match admit(&name, threads, opening, &mut progress, &mut |_| {}) {
                Ok(admitted) => {
                    sink(Report::Swap(SwapProgress::Staged {
                        backend: admitted.name.clone(),
                        verdict: admitted.verdict.clone(),
                    }));
                    let mut replica = replica.lock().unwrap_or_else(|p| p.into_inner());
                    replica.stage(admitted.name, admitted.verdict, Box::new(admitted.gemm));
                }
                Err(e) => sink(Report::Swap(SwapProgress::Refused { backend: name, why: format!("{e:#}") })),
            }
        });
    }

    /// Leaves the group and waits for the mesh to close its connections.
    pub fn quit(self) -> anyhow::Result<()> {
        self.send(Command::Quit);
        match self.thread.join() {
            Ok(result) => result,
            Err(_) => bail!("the mesh thread panicked"),
        }
    }
}

/// Gates the node's backend up front (so a refused backend fails before joining) and builds
/// the mesh configuration and replica for `signal_url`.
pub fn prepare(
    signal_url: &str,
    args: &MeshArgs,
    opening: Opening,
    progress_line: &mut dyn FnMut(String),
) -> anyhow::Result<(MeshConfig, TrainerReplica)> {
    let admitted = admit(&args.backend, args.threads, opening, &mut |_| {}, progress_line)?;
    let config = MeshConfig {
        signal_url: signal_url.to_string(),
        bind_ip: match args.bind_ip {
            Some(ip) => ip,
            None => {
                let (ip, why) = bind_ip_for(signal_url);
                progress_line(format!("webrtc: host candidates on {ip} ({why}; --bind-ip overrides)"));
                ip
            }
        },
        ice_servers: args.ice_servers.clone(),
        turn_username: args.turn_username.clone(),
        turn_credential: args.turn_credential.clone(),
        expected_phash: lockstep_luts::probe::reference_probe_hash().context("the reference probe")?,
        repair_after_ms: args.repair_after_ms,
        backend: admitted.name.clone(),
        verdict: admitted.verdict.clone(),
    };
    let replica =
        TrainerReplica::new(&admitted.name, args.threads, Some(Box::new(admitted.gemm))).with_data(args.data.clone());
    Ok((config, replica))
}

/// The address to offer peers when `--bind-ip` is not given, and why: loopback for a
/// signaling server on loopback, else the local address of the route to the signaling server
/// (a connected UDP socket picks it; connecting sends nothing).
pub fn bind_ip_for(signal_url: &str) -> (IpAddr, String) {
    let loopback = IpAddr::from([127, 0, 0, 1]);
    let Some(server) = signal_address(signal_url) else {
        return (loopback, format!("cannot resolve the host of {signal_url}"));
    };
    if server.ip().is_loopback() {
        return (loopback, "the signaling server is on loopback".into());
    }
    let unspecified: std::net::SocketAddr =
        if server.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    match std::net::UdpSocket::bind(unspecified).and_then(|s| s.connect(server).and_then(|()| s.local_addr())) {
        Ok(local) => (local.ip(), format!("the interface that reaches {server}")),
        Err(e) => (loopback, format!("no route to {server}: {e}")),
    }
}

/// The signaling server's socket address from `ws://HOST:PORT/…` (port 80/443 by default).
fn signal_address(signal_url: &str) -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let (scheme, rest) = signal_url.split_once("://")?;
    let authority = rest.split(['/', '?']).next()?;
    let default_port = if scheme == "wss" { 443 } else { 80 };
    let with_port = match authority.rsplit_once(':') {
        Some((_, port)) if port.parse::<u16>().is_ok() && !authority.ends_with(']') => authority.to_string(),
        _ => format!("{authority}:{default_port}"),
    };
    with_port.to_socket_addrs().ok()?.next()
}

fn settings_from(command: &Value, defaults: &RunConfig) -> anyhow::Result<RunSettings> {
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

/// Reads and checks a checkpoint file for a broadcast.
pub fn read_checkpoint(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    checkpoint::decode(&bytes, None).with_context(|| format!("{} is not a valid checkpoint", path.display()))?;
    Ok(bytes)
}

/// What one stdin line asks for.
enum Request {
    Mesh(Command),
    Swap(String),
}

/// One stdin line as a request.
fn parse_request(line: &str, defaults: &RunConfig, ckpt_dir: &std::path::Path) -> anyhow::Result<Request> {
    let value: Value = serde_json::from_str(line).context("not JSON")?;
    let peer = |what: &str| value["peer"].as_u64().with_context(|| format!("`{what}` needs a `peer`"));
    let command = match value["cmd"].as_str() {
        Some("start") => {
            let settings = settings_from(&value, defaults)?;
            run_config(&settings).validate().map_err(anyhow::Error::msg)?;
            Command::Start(settings)
        }
        Some("push" | "broadcast") => {
            let path = value["path"].as_str().context("`broadcast` needs a `path`")?;
            Command::PushCheckpoint(read_checkpoint(std::path::Path::new(path))?)
        }
        Some("save") => match value["path"].as_str() {
            Some(path) => Command::SaveCheckpoint(CheckpointTarget::File(PathBuf::from(path))),
            None => Command::SaveCheckpoint(CheckpointTarget::InDir(ckpt_dir.to_path_buf())),
        },
        Some("approve") => Command::Approve(peer("approve")?),
        Some("deny") => Command::Deny {
            peer: peer("deny")?,
            reason: value["reason"].as_str().unwrap_or("the host declined").to_string(),
        },
        Some("swap") => {
            let backend = value["backend"].as_str().context("`swap` needs a `backend` (a name or a path)")?;
            return Ok(Request::Swap(backend.to_string()));
        }
        Some("cut") => Command::CutLinkTo(peer("cut")?),
        Some("flip") => Command::FlipWeightBit,
        Some("quit") => Command::Quit,
        other => {
            bail!("unknown command {other:?} (start, approve, deny, swap, save, broadcast, push, cut, flip, quit)")
        }
    };
    Ok(Request::Mesh(command))
}

/// Prints one event as a JSON line, tagged `"node": id` when several nodes share stdout.
pub fn emit(mut value: Value, node: Option<PeerId>) {
    if let (Some(node), Some(object)) = (node, value.as_object_mut()) {
        object.insert("node".into(), node.into());
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

pub fn run(args: NodeArgs) -> anyhow::Result<ExitCode> {
    let defaults = args.model.run_config();
    defaults.validate().map_err(|why| anyhow::anyhow!("invalid run settings: {why}"))?;
    if !args.headless {
        return crate::console::run_node(&args.signal, &args.mesh, defaults);
    }
    let mut print = |line: String| emit(serde_json::json!({"event": "info", "message": line}), None);
    let (config, replica) = prepare(&args.signal, &args.mesh, Opening::default(), &mut print)?;
    let node = NodeHandle::start(config, replica, Arc::new(|report: Report| emit(report.to_json(), None)))?;
    let (tx, rx) = std::sync::mpsc::channel::<Request>();
    let ckpt_dir = args.mesh.ckpt_dir.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line.trim().is_empty() {
                continue;
            }
            match parse_request(&line, &defaults, &ckpt_dir) {
                Ok(request) => {
                    if tx.send(request).is_err() {
                        return;
                    }
                }
                Err(e) => emit(serde_json::json!({"event": "command-error", "message": format!("{e:#}")}), None),
            }
        }
        let _ = tx.send(Request::Mesh(Command::Quit));
    });
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(Request::Mesh(Command::Quit)) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Ok(Request::Mesh(command)) => node.send(command),
            Ok(Request::Swap(name)) => node.swap(name),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if node.finished() {
                    break;
                }
            }
        }
    }
    node.quit()?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_run_keeps_the_backend_the_last_run_ended_with() {
        // A name nothing resolves to: a second run that opened `backend` again would fail.
        let float = Box::new(lockstep_node::gemm::FloatGemm::new(1));
        let mut replica = TrainerReplica::new("no-such-backend", 1, Some(float));
        let tiny = RunConfig {
            model: ModelConfig { width: 32, context: 32, layers: 1, heads: 2 },
            batch: 2,
            ..RunConfig::DEFAULT
        };
        let settings = settings_of(&tiny);
        replica.configure(&settings).expect("the first run takes the admitted backend");
        let gradient = replica.compute(1).expect("a step");
        replica.apply(&gradient.grad);
        assert_eq!(replica.weight_hash(), replica.compute(2).expect("a second step").whash);
        replica.configure(&settings).expect("the second run takes the first run's backend");
        assert_eq!(replica.compute(1).expect("a step of the new run"), gradient);
    }

    #[test]
    fn a_loopback_signaling_server_means_loopback_candidates() {
        for url in ["ws://127.0.0.1:8787/ws?room=a", "ws://localhost:9/ws", "ws://[::1]:8787/ws", "ws://127.0.0.1/ws"] {
            let (ip, why) = bind_ip_for(url);
            assert_eq!(ip, IpAddr::from([127, 0, 0, 1]), "{url}: {why}");
        }
        let (ip, why) = bind_ip_for("not a url");
        assert_eq!(ip, IpAddr::from([127, 0, 0, 1]));
        assert!(why.contains("cannot resolve"), "{why}");
    }

    #[test]
    fn signal_urls_parse_to_socket_addresses() {
        assert_eq!(signal_address("ws://127.0.0.1:8787/ws?room=x"), Some(([127, 0, 0, 1], 8787).into()));
        assert_eq!(signal_address("ws://127.0.0.1?room=x"), Some(([127, 0, 0, 1], 80).into()));
        assert_eq!(signal_address("wss://127.0.0.1/ws"), Some(([127, 0, 0, 1], 443).into()));
        assert_eq!(signal_address("ws://[::1]:7/ws").map(|a| a.port()), Some(7));
        assert_eq!(signal_address("127.0.0.1:8787"), None);
    }
}
