//! A running node, shared by the console, the headless mode and the demo: the mesh on its own
//! thread with its own async runtime ([`NodeHandle`]), a command channel, hot-swaps gated off
//! the event loop, and what a replica needs from outside `lockstep_node` ([`HostProvider`]:
//! backends through the plugin host, data through the `/data` client).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use lockstep_mesh::data_client::RemoteSource;
use lockstep_mesh::{new_member_id, Command, Ended, LinkShim, MeshConfig, Report, SwapProgress};
use lockstep_node::admission::check_at_run_shapes;
use lockstep_node::checkpoint;
use lockstep_node::data::{Corpus, CorpusSource, DataSource};
use lockstep_node::gemm::Gemm;
use lockstep_node::replica::{ForeignError, Provider, Replica, TrainerReplica};
use lockstep_node::session::{AgreementTiming, StepDeadline};
use lockstep_node::verdict::Verdict;

use crate::backend::{admit, gemm_for, Opening};
use crate::route::bind_ip_for;
use crate::run_args::CorpusArg;

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
    /// How long to wait for a contribution a committed step names before asking for it again.
    #[arg(long, default_value_t = 2000)]
    pub repair_after_ms: u64,
    /// The step deadline's floor: the leader waits for a member's contribution this long after
    /// its own is ready (or 4× the recent waits or its own compute time, whichever is longer,
    /// up to the ceiling), then goes on without it and waits for it again once it keeps up.
    #[arg(long, default_value_t = StepDeadline::default().floor_ms)]
    pub step_deadline_floor_ms: u64,
    /// The step deadline's ceiling.
    #[arg(long, default_value_t = StepDeadline::default().ceiling_ms)]
    pub step_deadline_ceiling_ms: u64,
    /// The shortest election timeout of the run's Raft group, in ms (each member's is this plus
    /// up to as much again, drawn from its id; heartbeats every tenth of it).
    #[arg(long, default_value_t = AgreementTiming::default().longest_election_ms() / 2)]
    pub election_ms: u64,
    /// Wait for each step's commit before computing the next (by default the next step
    /// computes while the record is replicated, and its contribution waits for the commit).
    #[arg(long)]
    pub no_compute_ahead: bool,
    /// Audits by recomputation (`docs/TRUST.md`): the share of the steps this node contributes
    /// to in which it recomputes another member's contribution, chosen by the committed record,
    /// on the CPU mirror beside its own step (0: none; `every-step` f32 runs).
    #[arg(long, default_value_t = 0.1, value_parser = parse_share)]
    pub audit_rate: f64,
    /// Packed runs (`int8`, `int4`, every step): the share of a contribution's residual a
    /// routine audit asks its member for and checks, in chunks of 1,024 values drawn after the
    /// commit (at least one; 1: the whole residual, 4 bytes a weight; a check of an accusation
    /// always asks for the whole).
    #[arg(long, default_value_t = AUDIT_STATE_PART, value_parser = parse_share)]
    pub audit_state_part: f64,
    /// Routine audits at this node's own priority, taking their share of a machine its training
    /// keeps busy (by default they run on spare cycles only, at the lowest priority, and on a
    /// saturated machine may never run).
    #[arg(long)]
    pub audits_at_own_priority: bool,
    /// How many audits may run at once on this node, each on a thread of its own (by default
    /// two on a machine of eight cores or more, else one: `docs/TRUST.md`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8))]
    pub audit_workers: Option<u32>,
    /// The threads each audit's recomputation runs on, at the lowest priority (0: every core;
    /// by default one for every eight cores, at least one: `docs/TRUST.md`).
    #[arg(long, value_name = "N")]
    pub audit_threads: Option<u32>,
    /// The step's traffic this node may have sent and not yet had acknowledged, over all its
    /// peers together, in KiB: about two thirds of what its uplink queues before it drops
    /// (the default suits a consumer uplink; raise it for fast links with a long round trip,
    /// which it caps at this much a round trip: `docs/PERFORMANCE.md`, "In flight").
    #[arg(long, default_value_t = lockstep_mesh::IN_FLIGHT_BYTES / 1024, value_name = "KIB",
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(96..=1_048_576))]
    pub in_flight_kib: usize,
    /// Elastic windows, when this node leads: take a member out of the run once each of its
    /// last N contributions stood for a quarter of the window or less (0: keep every member;
    /// a slow member's steps still count).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub drop_slow_after: u32,
    /// Where checkpoints are saved (and listed for broadcast); a node that must stop (kicked,
    /// a failed compute, a resume it cannot restore) saves its last committed state here first.
    #[arg(long, default_value = "checkpoints")]
    pub ckpt_dir: PathBuf,
    /// Fetch training text from a `/data` URL (e.g. `http://HOST:8787/data`) instead of the
    /// corpus (random FineWeb-Edu slices: not a function of the seed); unreachable means the
    /// built-in corpus.
    #[arg(long)]
    pub data: Option<String>,
    #[command(flatten)]
    pub corpus: CorpusArg,
    /// Benchmarks and tests: delay every datagram this node sends by this much (one way). This
    /// kernel's traffic control has no `netem`; the rate of a link is shaped with `tc`, its
    /// latency here (`docs/PERFORMANCE.md`).
    #[arg(long, default_value_t = 0)]
    pub link_delay_ms: u64,
    /// Benchmarks and tests: drop this many of every thousand datagrams this node sends
    /// (seeded).
    #[arg(long, default_value_t = 0)]
    pub link_loss_per_mille: u32,
}

/// A share in `[0, 1]`.
/// `--audit-state-part`'s default: one chunk in eight (`docs/TRUST.md`, "An audit of a part").
pub const AUDIT_STATE_PART: f64 = 0.125;

/// `--audit-workers`' default: a second audit at once where the machine has cores to spare
/// beside the member's own step and its loop (eight or more), else one (`docs/TRUST.md`).
pub fn default_audit_workers() -> u32 {
    match cores() {
        cores if cores >= 8 => 2,
        _ => 1,
    }
}

/// The cores this process may run on.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `--audit-threads`' default: one for every eight cores, at least one. A referee on every core
/// kept a whole machine's threads waking and spinning at the lowest priority for each audit;
/// on the device's 16 cores, two threads an audit halved the audits' cost with every rogue still
/// named within 10 syncs (`docs/TRUST.md`). At rate 0.1 an audit on an eighth of the cores
/// keeps up with a member whose step takes them all.
pub fn default_audit_threads() -> u32 {
    (cores() / 8).max(1) as u32
}

fn parse_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!("`{text}` is not a share between 0 and 1")),
    }
}

/// Where a node's training text comes from.
pub enum Text {
    /// A corpus read once (`--corpus`): batches by seed and position.
    Corpus(Arc<Corpus>),
    /// A `/data` URL (`--data`): random slices, the built-in text when it fails.
    Remote(String),
}

/// Backends through the plugin host (gated), training text from `text`.
pub struct HostProvider {
    pub threads: u32,
    pub text: Text,
    /// The threads of each audit's referee (`--audit-threads`; 0: every core).
    pub audit_threads: u32,
}

impl Provider for HostProvider {
    fn open_backend(&mut self, name: &str) -> Result<Box<dyn Gemm + Send>, ForeignError> {
        gemm_for(name, self.threads, true).map_err(|e| Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(e)))
    }

    fn data_source(&mut self, seed: u64) -> Result<Box<dyn DataSource>, ForeignError> {
        Ok(match &self.text {
            Text::Remote(url) => Box::new(RemoteSource::new(url, seed).map_err(|e| Arc::new(e) as ForeignError)?),
            Text::Corpus(corpus) => Box::new(CorpusSource::new(corpus.clone(), seed)),
        })
    }

    fn corpus_digest(&self) -> u64 {
        match &self.text {
            Text::Corpus(corpus) => corpus.digest(),
            Text::Remote(_) => 0,
        }
    }

    fn referee_opener(&self) -> lockstep_node::replica::RefereeOpener {
        Arc::new(|| {
            crate::backend::referee().map_err(|e| Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(e)))
        })
    }

    fn audit_referee_opener(&self) -> lockstep_node::replica::RefereeOpener {
        let threads = self.audit_threads;
        Arc::new(move || {
            crate::backend::referee_on(threads)
                .map_err(|e| Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(e)))
        })
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
    thread: std::thread::JoinHandle<anyhow::Result<Ended>>,
}

impl NodeHandle {
    /// Joins the group at `config.signal_url` with `replica`; reports go to `sink`. `threads`
    /// is what swapped-in CPU backends get.
    pub fn start(config: MeshConfig, replica: TrainerReplica, threads: u32, sink: Sink) -> anyhow::Result<NodeHandle> {
        let replica = Arc::new(Mutex::new(replica));
        let (commands, rx) = tokio::sync::mpsc::unbounded_channel();
        let shared: Arc<Mutex<dyn Replica>> = replica.clone();
        let report = sink.clone();
        let thread = std::thread::Builder::new()
            .name("mesh".into())
            .spawn(move || -> anyhow::Result<Ended> {
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

    /// Whether the mesh has stopped (refused, denied, or quit).
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
            let admitted = match admit(&name, threads, opening, &mut progress, &mut |_| {}) {
                Ok(admitted) => admitted,
                Err(refused) => {
                    return sink(Report::Swap(SwapProgress::Refused { backend: name, verdict: refused.verdict }))
                }
            };
            // Then at the running run's own shapes, without holding the replica while it checks.
            let lock = || replica.lock().unwrap_or_else(|p| p.into_inner());
            let kit = lock().shapes_kit();
            let gemm: Box<dyn Gemm + Send> = Box::new(admitted.gemm);
            let gemm = match kit {
                Ok(None) => gemm,
                Ok(Some(kit)) => {
                    let began = std::time::Instant::now();
                    let checked = check_at_run_shapes(&kit.run, gemm, kit.referee, kit.data);
                    lock().return_referee(checked.referee);
                    let backend = admitted.name.clone();
                    match checked.verdict {
                        Ok(ops) => {
                            let verdict = Ok((ops, began.elapsed().as_secs_f64()));
                            sink(Report::AtRunShapes { backend, verdict });
                            checked.gemm
                        }
                        // The current backend stays: the swap is what is refused.
                        Err(refused) => {
                            let verdict = refused.verdict();
                            return sink(Report::Swap(SwapProgress::Refused { backend, verdict }));
                        }
                    }
                }
                Err(e) => {
                    let verdict = Verdict::NotLoadable { why: e.to_string() };
                    return sink(Report::Swap(SwapProgress::Refused { backend: name, verdict }));
                }
            };
            sink(Report::Swap(SwapProgress::Staged {
                backend: admitted.name.clone(),
                verdict: admitted.verdict.clone(),
            }));
            lock().stage(admitted.name, admitted.verdict, gemm);
        });
    }

    /// Leaves the group and waits for the mesh to close its connections; says why the node
    /// ended (a quit, or a refusal that came first).
    pub fn quit(self) -> anyhow::Result<Ended> {
        self.send(Command::Quit);
        match self.thread.join() {
            Ok(result) => result,
            Err(_) => bail!("the mesh thread panicked"),
        }
    }
}

/// What [`prepare`] readies: the mesh's configuration, the replica, and the device its
/// backend computes on.
pub struct Prepared {
    pub config: MeshConfig,
    pub replica: TrainerReplica,
    pub device: String,
}

/// The Raft clock for an election timeout of `election_ms` (100 ms ticks, or finer for a
/// shorter timeout: at least 10 ticks to an election, a heartbeat every tenth of it).
pub fn agreement_timing(election_ms: u64) -> AgreementTiming {
    let tick_ms = (election_ms / 10).clamp(10, 100);
    let election_ticks = (election_ms / tick_ms).max(10) as usize;
    AgreementTiming { tick_ms, heartbeat_ticks: (election_ticks / 10).max(1), election_ticks }
}

/// Gates the node's backend up front (so a refused backend fails before joining) and builds
/// the mesh configuration and replica for `signal_url`.
pub fn prepare(
    signal_url: &str,
    args: &MeshArgs,
    opening: Opening,
    progress_line: &mut dyn FnMut(String),
) -> anyhow::Result<Prepared> {
    // First, so that a missing packaged corpus is the first line a user reads; read only when
    // it is what the node trains on.
    let text = match &args.data {
        Some(url) => Text::Remote(url.clone()),
        None => Text::Corpus(args.corpus.load(progress_line)?),
    };
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
        deadline: StepDeadline {
            floor_ms: args.step_deadline_floor_ms,
            ceiling_ms: args.step_deadline_ceiling_ms.max(args.step_deadline_floor_ms),
            ..StepDeadline::default()
        },
        slow_windows: args.drop_slow_after,
        agreement: agreement_timing(args.election_ms),
        compute_ahead: !args.no_compute_ahead,
        // `/data`'s slices are not a function of the seed: nobody's contribution can be
        // recomputed (`docs/TRUST.md`).
        audit_rate: if args.data.is_some() { 0 } else { (args.audit_rate * 1000.0).round() as u32 },
        audit_state_part: (args.audit_state_part * 1000.0).round() as u32,
        audits_on_spare_cycles: !args.audits_at_own_priority,
        audit_workers: args.audit_workers.unwrap_or_else(default_audit_workers),
        id: new_member_id(),
        link: LinkShim { delay_ms: args.link_delay_ms, loss_per_mille: args.link_loss_per_mille, seed: 1 },
        in_flight_bytes: args.in_flight_kib.saturating_mul(1024),
        backend: admitted.name.clone(),
        verdict: admitted.verdict.clone(),
        ckpt_dir: args.ckpt_dir.clone(),
    };
    let audit_threads = args.audit_threads.unwrap_or_else(default_audit_threads);
    let provider = HostProvider { threads: args.threads, text, audit_threads };
    let replica = TrainerReplica::new(&admitted.name, Box::new(provider), Some(Box::new(admitted.gemm)));
    Ok(Prepared { config, replica, device: admitted.device })
}

/// Reads and checks a checkpoint file for a broadcast.
pub fn read_checkpoint(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    checkpoint::decode(&bytes, None).with_context(|| format!("{} is not a valid checkpoint", path.display()))?;
    Ok(bytes)
}

/// The process's exit status for how a node ended: 0 for a quit; 3, with the reason on
/// stderr, when the group turned it away (denied, or refused before it joined).
pub fn exit_status(ended: &Ended) -> std::process::ExitCode {
    match ended {
        Ended::Quit => std::process::ExitCode::SUCCESS,
        Ended::Denied(why) => {
            eprintln!("error: the room's host did not admit this node: {why}");
            std::process::ExitCode::from(3)
        }
        Ended::Refused(why) => {
            eprintln!("error: the signaling server refused this node: {why}");
            std::process::ExitCode::from(3)
        }
        Ended::Stopped { why, checkpoint } => {
            match checkpoint {
                Ok(path) => {
                    eprintln!("error: this node had to stop ({why}); its last committed state is in {}", path.display())
                }
                Err(e) => eprintln!("error: this node had to stop ({why}); its state could not be saved: {e}"),
            }
            std::process::ExitCode::from(4)
        }
    }
}
