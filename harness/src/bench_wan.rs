//! `lockstep bench wan`: a group of real nodes on a shaped network, one run per sync mode.
//!
//! The network: a network namespace per node and one for the hub (a Linux bridge and the
//! signaling server), each node joined to the bridge by a veth pair. Each node's uplink is
//! shaped by the kernel (`tc` `tbf` on its end of the pair, `--rate-mbit`); its latency and
//! loss come from the mesh's socket shim (`lockstep node --link-delay-ms`, half the round trip
//! on each side), because this kernel has no `netem`. Needs root, as CI has.
//!
//! Per mode it reports group tokens/s, bytes each node sent per token it trained on, the
//! utilisation (group tokens/s ÷ the tokens/s of the same number of `lockstep train`
//! processes computing side by side with no exchange, measured in the same run, so that CPU
//! sharing on a small machine is not counted against the network) and the held-out loss of
//! the group's final weights.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use lockstep_node::config::RunConfig;
use lockstep_node::data::Corpus;
use lockstep_node::settings;
use lockstep_node::sync::{OuterOptimizer, SyncConfig};
use serde_json::{json, Value};

use lockstep_tui::run_args::{CorpusArg, Defaults, RunArgs};
use lockstep_tui::train::GroupReplay;

use crate::client::{at, Headless, SignalServer};
use crate::netns::{Network, Shaping, HUB_ADDRESS};
use crate::plot::{Plot, Series};

#[derive(clap::Args)]
pub struct WanArgs {
    /// Nodes in the group.
    #[arg(long, alias = "members", default_value_t = 4)]
    nodes: usize,
    /// Each node's uplink, Mbit/s (kernel `tbf`).
    #[arg(long, default_value_t = 50.0)]
    rate_mbit: f64,
    /// Round-trip time between two nodes, ms (socket shim: half on each side).
    #[arg(long, default_value_t = 40)]
    rtt_ms: u64,
    /// How much an uplink queues before the kernel drops, in ms at its rate (`tbf latency`).
    #[arg(long, default_value_t = 400)]
    queue_ms: u64,
    /// Datagrams lost per thousand, on each node's sends (socket shim).
    #[arg(long, default_value_t = 0)]
    loss_per_mille: u32,
    /// Every node waits for each step's commit before computing the next (`lockstep node
    /// --no-compute-ahead`): the cost of a commit, against the default.
    #[arg(long)]
    no_compute_ahead: bool,
    /// Every-step modes run this many steps on the network (their throughput) and the whole
    /// run in one process (their loss: the group's arithmetic, bit-identical, checked against
    /// the network's hashes at every step it ran); 0 runs them whole on the network. [default:
    /// 12]
    #[arg(long)]
    sample_steps: Option<u32>,
    /// `H` of the outer mode. [default: 30]
    #[arg(long)]
    outer: Option<u32>,
    /// Modes to run, as SYNC/COMPRESSION (`outer` takes `--outer`; `outer+` is `outer` with the
    /// run setting `--overlap`, 3 unless given, `outer:H+D` names both; other modes run with no
    /// overlap), with `/elastic` after an outer mode for elastic windows, `/owners` after an
    /// every-step packed one for chunk owners (`--exchange owners`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "every-step/none,every-step/int8,outer/int8,outer+/int8,outer+/int4"
    )]
    modes: Vec<String>,
    /// A run of a few minutes (the one CI runs): a model of 64 wide, 2 layers, context 64,
    /// batch 8, 48 steps per node, `--outer 8`, an overlap of 2, every-step modes sampled for 6
    /// steps; settings and flags given on the command line still win.
    #[arg(long)]
    quick: bool,
    /// The run every mode trains (the table of run settings; `--sync` and `--compress` come from
    /// `--modes`). The bench's own defaults: 120 steps per node (the same tokens for every mode),
    /// and plain averaging for the outer step (`--outer-lr 1 --outer-momentum 0` rather than
    /// DiLoCo's 0.7 and 0.9: a few-minute run has a handful of outer steps, too few for momentum
    /// to pay; `docs/PERFORMANCE.md` has the sweep).
    #[command(flatten)]
    run: RunArgs<WanDefaults>,
    /// CPU threads per node (and per process of the no-exchange measurement).
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// Held-out batches for the loss.
    #[arg(long, default_value_t = 8)]
    eval_batches: usize,
    /// One JSON object per mode instead of a table.
    #[arg(long)]
    json: bool,
    /// Members of different speeds: each node's share of the compute, as a CPU quota (a
    /// cgroup's), one number per node, relative to the fastest (`4,1,1,1`: the first has four
    /// times the others' compute). The no-exchange rate is then the sum of each member's rate
    /// alone under its quota. Empty: no quotas.
    #[arg(long, value_delimiter = ',', value_name = "S,S,…")]
    speeds: Vec<f64>,
    /// With `--speeds`: the fastest member's quota, in CPUs (the others get their share of it).
    #[arg(long, default_value_t = 0.5)]
    fastest_cpus: f64,
    /// The learning rates every mode and the member alone are replayed at; each is reported at
    /// its best (lowest final held-out loss). The network runs at the run's `--lr` (its
    /// throughput and bytes do not depend on it). Empty: the run's `--lr` alone. [default:
    /// 1e-3,2e-3,4e-3,8e-3; `--quick`: empty]
    #[arg(long, value_delimiter = ',', value_name = "LR,LR,…")]
    lr_grid: Option<Vec<f32>>,
    /// Steps of the member alone, whose final held-out loss every mode and the bound are timed
    /// to. [default: 600; `--quick`: the run's steps]
    #[arg(long)]
    solo_steps: Option<u32>,
    /// The bound (the exact every-step mean at full speed: perfect data parallelism) has its
    /// held-out loss evaluated every this many steps.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    bound_every: u32,
    /// Draw held-out loss against wall-clock seconds, every mode at its best learning rate and
    /// the member alone, into this SVG file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    #[command(flatten)]
    corpus: CorpusArg,
    /// Replays only, for quick checks of learning (no namespaces, no root): each mode's loss at
    /// each rate of the grid, its time the compute alone at the side-by-side rate (what an
    /// exchange hidden entirely would give); no bytes. Elastic modes need the network.
    #[arg(long)]
    no_network: bool,
}

/// A CPU quota for the processes put in it (a cgroup of its own, v2's `cpu.max` or v1's
/// `cpu.cfs_quota_us`); removed on drop.
struct CpuQuota {
    dir: PathBuf,
}

impl CpuQuota {
    const PERIOD_US: u64 = 100_000;

    fn new(name: &str, cpus: f64) -> anyhow::Result<CpuQuota> {
        let quota = ((cpus * Self::PERIOD_US as f64) as u64).max(1000);
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let dir;
        if std::fs::read_to_string(v2).is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu")) {
            // The parent must hand the cpu controller down (it may already).
            let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpu");
            dir = PathBuf::from("/sys/fs/cgroup").join(name);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
            std::fs::write(dir.join("cpu.max"), format!("{quota} {}", Self::PERIOD_US)).context("cpu.max")?;
        } else {
            dir = PathBuf::from("/sys/fs/cgroup/cpu").join(name);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("creating cgroup {} (--speeds needs cgroups and root)", dir.display()))?;
            std::fs::write(dir.join("cpu.cfs_period_us"), Self::PERIOD_US.to_string()).context("cfs_period_us")?;
            std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()).context("cfs_quota_us")?;
        }
        Ok(CpuQuota { dir })
    }

    /// Moves the process `pid` (every thread of it) under the quota.
    fn add(&self, pid: u32) -> anyhow::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("putting process {pid} in {}", self.dir.display()))
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        // Empty once its processes are gone; a moment for them to be reaped.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `--speeds` as quotas, one per node (none without `--speeds`).
fn quotas(args: &WanArgs) -> anyhow::Result<Vec<CpuQuota>> {
    if args.speeds.is_empty() {
        return Ok(Vec::new());
    }
    ensure!(args.speeds.len() == args.nodes, "--speeds gives {} shares for {} nodes", args.speeds.len(), args.nodes);
    let fastest = args.speeds.iter().copied().fold(0f64, f64::max);
    ensure!(args.speeds.iter().all(|s| *s > 0.0 && s.is_finite()), "--speeds: shares are positive numbers");
    args.speeds
        .iter()
        .enumerate()
        .map(|(i, s)| {
            CpuQuota::new(&format!("lockstep-wan-{}-{i}", std::process::id()), args.fastest_cpus * s / fastest)
        })
        .collect()
}

/// The namespaces, the bridge and each node's uplink shaped; removed on drop.
fn shaped_network(nodes: usize, rate_mbit: f64, queue_ms: u64) -> anyhow::Result<Network> {
    let mut network = Network::new(&format!("lsw{}", std::process::id())).context("bench wan needs root")?;
    for _ in 0..nodes {
        network.add_node(Some(Shaping { rate_mbit, queue_ms }))?;
    }
    Ok(network)
}

/// [`Headless::wait_for`] in whole seconds, failing at once where the guard stopped the run.
fn wait_for(node: &Headless, what: &str, secs: u64, pred: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
    node.wait_for(what, Duration::from_secs(secs), |e| pred(e) || e["event"] == "guard-stopped").and_then(|found| {
        ensure!(found["event"] != "guard-stopped" || pred(&found), "{what}: the guard stopped the run: {found}");
        Ok(found)
    })
}

/// One mode's figures.
struct Measured {
    mode: String,
    overlap: u32,
    elastic: bool,
    tokens_per_s: f64,
    bytes_per_token: f64,
    heldout_loss: f32,
    seconds: f64,
    syncs: u32,
    /// Ran only the first syncs on the network.
    sampled: bool,
    /// Mean per node and sync: compute, exchange, hash and guard seconds.
    breakdown: [f64; 3],
    /// Elastic windows: each member's mean inner steps a window (roster order: ascending ids),
    /// over the timed syncs; empty otherwise.
    window_steps: Vec<f64>,
    /// Seconds from the first roster until the group's held-out loss was first at most the
    /// solo member's final one (`None`: not within the run), and whether that time is an
    /// estimate (a sampled run: the sync's number times the measured seconds per sync).
    time_to_loss: Option<(f64, bool)>,
    /// The grid's learning rate whose replay ended lowest (the figures of loss are its).
    lr: f32,
    /// At that rate: (seconds from the first roster, held-out loss) after the evaluated syncs.
    curve: Vec<(f64, f32)>,
}

/// The bench's defaults for the run (see `WanArgs::run`).
#[derive(Clone, Debug, Default)]
pub struct WanDefaults;

impl Defaults for WanDefaults {
    fn base() -> RunConfig {
        let outer = OuterOptimizer { lr: 1.0, momentum: 0.0 };
        RunConfig { steps: 120, sync: SyncConfig { outer, ..SyncConfig::SEED }, ..RunConfig::DEFAULT }
    }
}

/// `every-step/none`, `outer/int8` (H from `--outer`), `outer:20/int8`, `outer+/int8` (the
/// overlap from `--overlap`), `outer:20+2/int8` → the run of that mode: the sync, compression
/// and overlap settings read by the table of run settings.
fn mode_run(base: RunConfig, text: &str, h: u32, overlap: u32) -> anyhow::Result<RunConfig> {
    let (sync, compression) = text.split_once('/').with_context(|| format!("mode `{text}` is not SYNC/COMPRESSION"))?;
    let (compression, elastic, exchange) = match compression.split_once('/') {
        Some((compression, "elastic")) => (compression, "true", "mesh"),
        Some((compression, "owners")) => (compression, "false", "owners"),
        Some((_, other)) => bail!("mode `{text}`: `{other}` is not `elastic` or `owners`"),
        None => (compression, "false", "mesh"),
    };
    let (sync, overlap) = match sync.split_once('+') {
        Some((sync, "")) => (sync, overlap.to_string()),
        Some((sync, d)) => (sync, d.to_string()),
        None => (sync, "0".to_string()),
    };
    let sync = if sync == "outer" { format!("outer:{h}") } else { sync.to_string() };
    let run = settings::with(
        base,
        [
            ("sync", sync.as_str()),
            ("compress", compression),
            ("overlap", overlap.as_str()),
            ("elastic", elastic),
            ("exchange", exchange),
        ],
    )?;
    run.validate().with_context(|| format!("mode `{text}`"))?;
    ensure!(
        run.steps.is_multiple_of(run.steps_per_sync()),
        "--steps {} is not a whole number of {} syncs",
        run.steps,
        run.sync.mode
    );
    Ok(run)
}

/// Every setting of `run` as `--name value` flags.
fn setting_flags(run: &RunConfig) -> Vec<String> {
    settings::describe(run).into_iter().flat_map(|(s, value)| [format!("--{}", s.name), value]).collect()
}

fn run_mode(
    args: &WanArgs,
    network: &Network,
    quotas: &[CpuQuota],
    url: &str,
    run: RunConfig,
    dir: &Path,
    data: &Data,
) -> anyhow::Result<Measured> {
    let solo_loss = data.solo_loss;
    let label = run.sync.to_string();
    // A room of its own per mode (the last mode's members may still be leaving the server).
    let room = format!(
        "{url}?room=wan-{}-{}-o{}{}",
        run.sync.mode.to_string().replace(':', ""),
        run.sync.compression,
        run.sync.overlap,
        if run.sync.elastic { "-e" } else { "" }
    );
    let bin = std::env::current_exe().context("the lockstep binary")?;
    let mut nodes: Vec<Headless> = Vec::new();
    let mut ids = Vec::new();
    for index in 0..args.nodes {
        let mut command = network.launcher(index, &bin);
        command.args(["node", "--headless", "--signal", &room]);
        command.args(["--backend", "cpu", "--threads", &args.threads.to_string()]);
        command.args(["--corpus", &args.corpus.choice]);
        command.args(["--link-delay-ms", &(args.rtt_ms / 2).to_string()]);
        command.args(["--link-loss-per-mille", &args.loss_per_mille.to_string()]);
        if args.no_compute_ahead {
            command.arg("--no-compute-ahead");
        }
        // A full-mesh f32 step on a slow link takes seconds: no member is dropped for it.
        command.args(["--step-deadline-floor-ms", "300000", "--step-deadline-ceiling-ms", "600000"]);
        // The sync alone: audits serve private states (an `outer:H` window's, 12 bytes a weight)
        // on the same links, drawn at random — 40% more bytes in one run, none in the next.
        // `bench audit` measures what they cost.
        command.args(["--audit-rate", "0"]);
        command.arg("--ckpt-dir").arg(dir);
        let node = Headless::join(command, Duration::from_secs(30))?;
        // `ip netns exec` execs the node: the pid is the node's.
        if let Some(quota) = quotas.get(index) {
            quota.add(node.pid())?;
        }
        let first = nodes.is_empty();
        let id = node.id;
        if !first {
            nodes[0].command(&json!({"cmd": "approve", "peer": id}))?;
        }
        ids.push(id);
        nodes.push(node);
    }
    for (node, id) in nodes.iter().zip(&ids) {
        for other in ids.iter().filter(|o| *o != id) {
            wait_for(node, "an open channel", 60, |e| e["event"] == "channel-open" && e["peer"] == *other)?;
        }
    }
    let sample_steps = args.sample_steps.unwrap_or(if args.quick { 6 } else { 12 });
    let sampled = run.steps_per_sync() == 1 && sample_steps > 0 && sample_steps < run.steps;
    let mut start = serde_json::Map::new();
    start.insert("cmd".into(), json!("start"));
    for (setting, value) in settings::describe(&run) {
        start.insert(setting.json_key(), json!(value));
    }
    nodes[0].command(&Value::Object(start))?;
    // A sampled run is the whole run's first syncs (the learning-rate schedule spans the run).
    let syncs = if sampled { sample_steps.max(2) } else { run.syncs() };
    let ended_run = |e: &Value| {
        (e["event"] == "step" && e["step"].as_u64() == Some(u64::from(syncs))) || e["event"] == "run-finished"
    };
    let began = at(&wait_for(&nodes[0], "the run started", 60, |e| e["event"] == "run-started")?);
    let mut said = Instant::now();
    while !nodes.iter().all(|n| n.events().iter().any(ended_run)) {
        if let Some(error) = nodes[0].events().into_iter().find(|e| e["event"] == "guard-stopped") {
            bail!("{label}: the guard stopped the run: {error}");
        }
        if said.elapsed() > Duration::from_secs(10) {
            let step = nodes[0].events().iter().filter(|e| e["event"] == "weights").count();
            eprintln!("bench wan: {label}: {step}/{syncs} syncs after {:.0} s", began.elapsed().as_secs_f64());
            said = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Timed from the first sync's end (the links' slow start is in the first) to the last's.
    let first = at(&wait_for(&nodes[0], "the first sync", 60, |e| e["event"] == "step" && e["step"] == 1)?);
    let mut ended = first;
    for node in &nodes {
        ended = ended.max(at(&wait_for(node, "the last sync", 3600, ended_run)?));
    }
    let seconds = ended.duration_since(first).as_secs_f64();
    // When each sync had ended on every node, from the first roster.
    let mut sync_ended = vec![0f64; syncs as usize];
    for node in &nodes {
        for e in node.events() {
            let k = e["step"].as_u64().unwrap_or(0) as usize;
            if e["event"] == "step" && (1..=sync_ended.len()).contains(&k) {
                sync_ended[k - 1] = sync_ended[k - 1].max(at(&e).duration_since(began).as_secs_f64());
            }
        }
    }
    // Every node's last step is reported once its hash is known; wait for those.
    for node in &nodes {
        wait_for(node, "the last step's hash", 60, |e| e["event"] == "weights" && e["step"] == syncs)?;
    }
    let mut hashes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut sent = 0u64;
    // Per node and sync: compute, waiting for the exchange, hashing and the guard (seconds).
    let mut breakdown = [0f64; 3];
    let mut timed_syncs = 0f64;
    for node in &nodes {
        for e in node.events().iter().filter(|e| e["event"] == "weights") {
            let step = e["step"].as_u64().unwrap_or(0);
            if step > u64::from(syncs) {
                continue;
            }
            if step > 1 {
                sent += e["sent_bytes"].as_u64().unwrap_or(0);
                for (slot, key) in breakdown.iter_mut().zip(["compute_ms", "exchange_ms", "hash_guard_ms"]) {
                    *slot += e[key].as_f64().unwrap_or(0.0) / 1e3;
                }
                timed_syncs += 1.0;
            }
            hashes.entry(step).or_default().push(e["whash"].as_str().unwrap_or("").to_string());
        }
    }
    ensure!(hashes.values().all(|h| h.iter().all(|x| *x == h[0])), "{label}: the replicas disagree");
    // Elastic windows: each sync's weights (the inner steps each member trained, in roster
    // order: ascending ids), as the first node applied them.
    let weights: BTreeMap<u64, Vec<u32>> = nodes[0]
        .events()
        .iter()
        .filter(|e| e["event"] == "step" && e["weights"].is_array())
        .map(|e| {
            let pairs = e["weights"].as_array().into_iter().flatten();
            (e["step"].as_u64().unwrap_or(0), pairs.map(|p| p[1].as_u64().unwrap_or(0) as u32).collect())
        })
        .collect();
    ensure!(
        !run.sync.elastic || (1..=u64::from(syncs)).all(|k| weights.get(&k).is_some_and(|w| w.len() == ids.len())),
        "{label}: a sync without every member's weight"
    );
    drop(nodes);
    // The network ran the group's arithmetic: a replay of the same members agrees with it at
    // every sync it ran (a sampled run), or at its first two (a whole one; the e2e tests check
    // whole runs).
    let checked = if sampled { syncs } else { syncs.min(2) };
    eprintln!("bench wan: {label}: checking {checked} syncs against a one-process replay");
    let mut check = GroupReplay::new(run, &ids, "cpu", 0, data.corpus.clone())?;
    for sync in 1..=u64::from(checked) {
        let whash = format!("{:#010x}", check.sync_weighted(weights.get(&sync).map(Vec::as_slice))?);
        let network = hashes.get(&sync).and_then(|h| h.first());
        ensure!(network == Some(&whash), "{label}: the replay differs from the network at sync {sync}");
    }
    // The loss: the whole run, replayed for members 1..=N (the same data streams for every
    // mode; the network's ids are the signaling server's, new for each mode), at each rate of
    // the grid; the lowest final loss is the mode's.
    let fixed: Vec<u64> = (1..=args.nodes as u64).collect();
    let per_sync = seconds / f64::from(syncs - 1).max(1.0);
    // When sync `k` ended: measured where the network ran it, else estimated from the seconds
    // per sync measured.
    let ended_at = |k: u32| match sync_ended.get(k as usize - 1) {
        Some(&at) if !sampled => (at, false),
        _ => (sync_ended.first().copied().unwrap_or(0.0) + f64::from(k - 1) * per_sync, true),
    };
    let (lr, curve) = best_curve(&label, run, &fixed, &weights, args, data)?;
    let (heldout_loss, time_to_loss, curve) = on_the_clock(&curve, solo_loss, ended_at);
    // Syncs 2.. were timed and counted: every member's steps (in elastic windows, the steps
    // each trained).
    let steps: f64 = if run.sync.elastic {
        weights.range(2..=u64::from(syncs)).flat_map(|(_, w)| w).map(|&w| f64::from(w)).sum()
    } else {
        f64::from(syncs - 1) * f64::from(run.steps_per_sync()) * args.nodes as f64
    };
    let tokens = steps * run.tokens_per_step() as f64;
    let timed_weights: Vec<&Vec<u32>> = weights.range(2..=u64::from(syncs)).map(|(_, w)| w).collect();
    let window_steps: Vec<f64> = (0..ids.len())
        .filter(|_| !timed_weights.is_empty())
        .map(|i| {
            let total: f64 = timed_weights.iter().map(|w| f64::from(w.get(i).copied().unwrap_or(0))).sum();
            total / timed_weights.len() as f64
        })
        .collect();
    Ok(Measured {
        mode: label,
        overlap: run.sync.overlap,
        elastic: run.sync.elastic,
        time_to_loss,
        tokens_per_s: tokens / seconds,
        bytes_per_token: sent as f64 / tokens,
        heldout_loss,
        seconds,
        syncs,
        sampled,
        breakdown: breakdown.map(|b| b / timed_syncs.max(1.0)),
        window_steps,
        lr,
        curve,
    })
}

/// What every mode is measured against: the corpus, the learning-rate grid, and the final
/// held-out loss of one member alone (at its best rate).
struct Data {
    corpus: Arc<Corpus>,
    grid: Vec<f32>,
    solo_loss: f32,
}

/// [`replay_curve`] at each rate of the grid: the rate whose final loss is lowest, and its curve.
fn best_curve(
    what: &str,
    run: RunConfig,
    ids: &[u64],
    weights: &BTreeMap<u64, Vec<u32>>,
    args: &WanArgs,
    data: &Data,
) -> anyhow::Result<(f32, Vec<(u32, f32)>)> {
    let mut best: Option<(f32, Vec<(u32, f32)>)> = None;
    let last = |curve: &[(u32, f32)]| curve.last().map_or(f32::INFINITY, |&(_, loss)| loss);
    for &lr in &data.grid {
        eprintln!("bench wan: {what}: replaying the whole run ({} steps, members {ids:?}) at lr {lr}", run.steps);
        let curve = replay_curve(RunConfig { lr, ..run }, ids, weights, args.eval_batches, data)?;
        if best.as_ref().is_none_or(|(_, b)| last(&curve) < last(b)) {
            best = Some((lr, curve));
        }
    }
    best.context("the learning-rate grid is empty")
}

/// The bound's replays: the rate of the grid whose curve first reaches the member alone's loss
/// (the lowest final loss among those that reach it at the same step, or where none does), the
/// first evaluated step at or below it, and that rate's curve as (step, loss).
struct Bound {
    lr: f32,
    steps: Option<u32>,
    curve: Vec<(u32, f32)>,
}

/// The exact every-step mean (`every-step none`) of every member replayed for the run's steps
/// at each rate of the grid, its held-out loss every `--bound-every` steps and after the last.
fn bound_curve(base: RunConfig, args: &WanArgs, data: &Data) -> anyhow::Result<Bound> {
    let run = RunConfig { sync: SyncConfig::SEED, ..base };
    let ids: Vec<u64> = (1..=args.nodes as u64).collect();
    let mut best: Option<Bound> = None;
    for &lr in &data.grid {
        eprintln!(
            "bench wan: the bound: replaying the exact every-step mean ({} steps, members {ids:?}) at lr {lr}",
            run.steps
        );
        let curve = replay_curve_every(
            RunConfig { lr, ..run },
            &ids,
            &BTreeMap::new(),
            args.eval_batches,
            data,
            args.bound_every,
        )?;
        let steps = curve.iter().find(|&&(_, loss)| loss <= data.solo_loss).map(|&(k, _)| k);
        let candidate = Bound { lr, steps, curve };
        // The earlier to reach the member's loss; then (or where neither does) the lower end.
        let key = |b: &Bound| (b.steps.unwrap_or(u32::MAX), b.curve.last().map_or(f32::INFINITY, |&(_, loss)| loss));
        if best.as_ref().is_none_or(|b| key(&candidate) < key(b)) {
            best = Some(candidate);
        }
    }
    best.context("the learning-rate grid is empty")
}

/// `--no-network`: a mode's figures from replays alone, each sync taking the compute of its
/// inner steps at `member_rate` (tokens/s of one member).
fn replay_mode(args: &WanArgs, run: RunConfig, data: &Data, member_rate: f64) -> anyhow::Result<Measured> {
    let label = run.sync.to_string();
    ensure!(!run.sync.elastic, "{label}: elastic windows need the network (the members' speeds decide them)");
    let ids: Vec<u64> = (1..=args.nodes as u64).collect();
    let (lr, curve) = best_curve(&label, run, &ids, &BTreeMap::new(), args, data)?;
    let per_sync = f64::from(run.steps_per_sync()) * run.tokens_per_step() as f64 / member_rate;
    let (heldout_loss, time_to_loss, curve) = on_the_clock(&curve, data.solo_loss, |k| (f64::from(k) * per_sync, true));
    Ok(Measured {
        mode: label,
        overlap: run.sync.overlap,
        elastic: false,
        tokens_per_s: member_rate * args.nodes as f64,
        bytes_per_token: f64::NAN,
        heldout_loss,
        seconds: f64::from(run.syncs()) * per_sync,
        syncs: run.syncs(),
        sampled: false,
        breakdown: [0.0; 3],
        window_steps: Vec::new(),
        time_to_loss,
        lr,
        curve,
    })
}

/// A mode's final loss, when it reached the member alone's (seconds, estimated), and its
/// curve as (seconds, loss).
type Timed = (f32, Option<(f64, bool)>, Vec<(f64, f32)>);

/// A replayed curve of (sync, loss) on the clock, `at(k)` being when sync `k` ended (and
/// whether that is an estimate).
fn on_the_clock(curve: &[(u32, f32)], solo_loss: f32, at: impl Fn(u32) -> (f64, bool)) -> Timed {
    let last = curve.last().map_or(f32::NAN, |&(_, loss)| loss);
    let reached = curve.iter().find(|&&(_, loss)| loss <= solo_loss).map(|&(k, _)| at(k));
    (last, reached, curve.iter().map(|&(k, loss)| (at(k).0, loss)).collect())
}

/// The whole run replayed in one process for `ids` (each sync's elastic weights as the
/// network applied them): the held-out loss after about 24 evenly spaced syncs and the last,
/// as (sync, loss).
fn replay_curve(
    run: RunConfig,
    ids: &[u64],
    weights: &BTreeMap<u64, Vec<u32>>,
    eval_batches: usize,
    data: &Data,
) -> anyhow::Result<Vec<(u32, f32)>> {
    replay_curve_every(run, ids, weights, eval_batches, data, run.syncs().div_ceil(24).max(1))
}

/// [`replay_curve`], the held-out loss after every `stride`-th sync and the last.
fn replay_curve_every(
    run: RunConfig,
    ids: &[u64],
    weights: &BTreeMap<u64, Vec<u32>>,
    eval_batches: usize,
    data: &Data,
    stride: u32,
) -> anyhow::Result<Vec<(u32, f32)>> {
    let mut replay = GroupReplay::new(run, ids, "cpu", 0, data.corpus.clone())?;
    let mut curve = Vec::new();
    while replay.step_count() < run.steps {
        let next = u64::from(replay.step_count() / run.steps_per_sync() + 1);
        replay.sync_weighted(weights.get(&next).map(Vec::as_slice))?;
        let sync = replay.step_count() / run.steps_per_sync();
        if sync.is_multiple_of(stride) || sync == run.syncs() {
            curve.push((sync, replay.heldout_loss(eval_batches)?));
        }
    }
    Ok(curve)
}

/// Tokens/s of each of `nodes` lone trainers computing side by side (no exchange), same model,
/// each under its node's quota (if any).
fn side_by_side(args: &WanArgs, quotas: &[CpuQuota], run: RunConfig) -> anyhow::Result<Vec<f64>> {
    let bin = std::env::current_exe().context("the lockstep binary")?;
    // Enough steps to time, fewer than the run (the rate is steady after the first), each
    // trainer alone (the seed's sync settings).
    let run = RunConfig { steps: run.steps.clamp(4, 24), sync: SyncConfig::SEED, ..run };
    let mut children = Vec::new();
    for _ in 0..args.nodes {
        let mut command = Command::new(&bin);
        command.args(["train", "--backend", "cpu", "--threads", &args.threads.to_string(), "--json"]);
        command.args(["--eval-batches", "0", "--audit-every", "0", "--corpus", &args.corpus.choice]);
        command.args(setting_flags(&run));
        let child = command.stdout(Stdio::piped()).spawn().context("spawning lockstep train")?;
        if let Some(quota) = quotas.get(children.len()) {
            quota.add(child.id())?;
        }
        children.push(child);
    }
    // Each prints its own tokens/s since its first step (start-up and the gate excluded).
    let mut rates = Vec::new();
    for child in children {
        let out = child.wait_with_output()?;
        ensure!(out.status.success(), "a side-by-side trainer failed");
        let last = String::from_utf8_lossy(&out.stdout).lines().last().map(str::to_string).unwrap_or_default();
        let line: Value = serde_json::from_str(&last).context("a trainer's last line")?;
        rates.push(line["tokens_per_s"].as_f64().context("tokens_per_s")?);
    }
    Ok(rates)
}

/// `--quick`'s run settings, for those not given on the command line.
const QUICK: [(&str, &str); 6] =
    [("width", "64"), ("context", "64"), ("layers", "2"), ("heads", "2"), ("batch", "8"), ("steps", "48")];

pub fn run(args: WanArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.nodes >= 2, "a group needs at least 2 nodes");
    let mut base = args.run.run_config()?;
    if args.quick {
        base = settings::with(base, QUICK.into_iter().filter(|(name, _)| args.run.given(name).is_none()))?;
    }
    let outer = args.outer.unwrap_or(if args.quick { 8 } else { 30 });
    let overlap = match args.run.given("overlap") {
        Some(given) => given.parse().context("--overlap")?,
        None if args.quick => 2,
        None => 3,
    };
    let modes: Vec<RunConfig> =
        args.modes.iter().map(|m| mode_run(base, m, outer, overlap)).collect::<anyhow::Result<_>>()?;
    let corpus = args.corpus.load(&mut |line| eprintln!("bench wan: {line}"))?;
    let grid = match &args.lr_grid {
        Some(grid) if !grid.is_empty() => grid.clone(),
        Some(_) => vec![base.lr],
        None if args.quick => vec![base.lr],
        None => vec![1e-3, 2e-3, 4e-3, 8e-3],
    };
    ensure!(grid.iter().all(|lr| lr.is_finite() && *lr > 0.0), "--lr-grid: rates are positive numbers");
    let mut data = Data { corpus, grid, solo_loss: f32::NAN };
    let dir: PathBuf = std::env::temp_dir().join(format!("lockstep-wan-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // The shaped network and its signaling server (none with `--no-network`).
    let network = match args.no_network {
        true => None,
        false => {
            let network = shaped_network(args.nodes, args.rate_mbit, args.queue_ms)?;
            let bin = std::env::current_exe().context("the lockstep binary")?;
            let address = format!("{HUB_ADDRESS}:8765");
            let signal = SignalServer::start(&bin, Some(&network.hub), &address, None)?;
            Some((network, signal))
        }
    };
    let quotas = quotas(&args)?;
    let rates = side_by_side(&args, &quotas, base)?;
    let alone: f64 = rates.iter().sum();
    // One member alone: its final held-out loss (a one-process run of member 1's stream for
    // `--solo-steps` steps), and its wall time for them at the rate each of the side-by-side
    // trainers had (the share of this machine a group member has).
    let solo_steps = args.solo_steps.unwrap_or(if args.quick { base.steps } else { 600 });
    ensure!(solo_steps > 0, "--solo-steps: at least one step");
    let solo_run = RunConfig { sync: SyncConfig::SEED, steps: solo_steps, ..base };
    let (solo_lr, solo_curve) = best_curve("one member alone", solo_run, &[1], &BTreeMap::new(), &args, &data)?;
    let solo_loss = solo_curve.last().map_or(f32::NAN, |&(_, loss)| loss);
    data.solo_loss = solo_loss;
    // (With `--speeds`, member 1's own rate under its quota.)
    let solo_rate = if quotas.is_empty() { alone / args.nodes as f64 } else { rates[0] };
    let step_seconds = base.tokens_per_step() as f64 / solo_rate;
    let solo_seconds = f64::from(solo_steps) * step_seconds;
    let solo_points: Vec<(f64, f32)> =
        solo_curve.iter().map(|&(step, loss)| (f64::from(step) * step_seconds, loss)).collect();
    // The bound: every member's gradient summed exactly every step, each member computing at
    // its side-by-side rate and nothing waiting for the network.
    let bound = bound_curve(base, &args, &data)?;
    let bound_points: Vec<(f64, f32)> =
        bound.curve.iter().map(|&(step, loss)| (f64::from(step) * step_seconds, loss)).collect();
    let bound_seconds = bound.steps.map(|k| f64::from(k) * step_seconds);
    let mut measured = Vec::new();
    for mode in &modes {
        let result = match &network {
            Some((network, signal)) => run_mode(&args, network, &quotas, &signal.url(), *mode, &dir, &data),
            None => replay_mode(&args, *mode, &data, solo_rate),
        };
        match result {
            Ok(m) => measured.push(m),
            Err(e) => return Err(e.context(format!("mode {}", mode.sync))),
        }
    }
    drop(network);
    let _ = std::fs::remove_dir_all(&dir);
    let seed = measured.first();
    let seed_bytes = seed.map_or(f64::NAN, |m| m.bytes_per_token);
    let seed_loss = seed.map_or(f32::NAN, |m| m.heldout_loss);
    let run = base;
    // Tokens are bytes: the most any mode trained on (every member's steps), against the
    // corpus's training text.
    let trained = args.nodes as f64 * f64::from(run.steps) * run.tokens_per_step() as f64;
    let share = trained / data.corpus.train().len().max(1) as f64;
    if let Some(path) = &args.svg {
        let mut series = vec![
            Series { label: format!("one member alone (lr {solo_lr})"), points: solo_points.clone() },
            Series {
                label: format!("bound: exact every-step mean, no waiting (lr {})", bound.lr),
                points: bound_points,
            },
        ];
        series.extend(measured.iter().map(|m| Series {
            label: format!(
                "{}{} (lr {})",
                m.mode,
                if m.time_to_loss.is_some_and(|(_, e)| e) { " ~" } else { "" },
                m.lr
            ),
            points: m.curve.clone(),
        }));
        let title = format!(
            "{} members × {} Mbit/s × {} ms, c={} layers={} batch={}, {} steps\n{}",
            args.nodes,
            args.rate_mbit,
            args.rtt_ms,
            run.model.width,
            run.model.layers,
            run.batch,
            run.steps,
            data.corpus.name()
        );
        let plot = Plot { title, x_label: "wall-clock seconds".into(), y_label: "held-out loss".into(), series };
        std::fs::write(path, plot.svg()).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench wan: wrote {}", path.display());
    }
    if !args.json {
        println!(
            "corpus: {}; the group trains on {:.0} tokens, {:.1}% of its training text; learning rates {:?}",
            data.corpus.describe(),
            trained,
            share * 100.0,
            data.grid
        );
        let link = match args.no_network {
            true => "no network (replays; each sync its compute alone)".to_string(),
            false => format!(
                "{} Mbit/s uplink × {} ms RTT{}",
                args.rate_mbit,
                args.rtt_ms,
                if args.loss_per_mille > 0 { format!(" × {}‰ loss", args.loss_per_mille) } else { String::new() }
            ),
        };
        println!(
            "{} nodes × {link}, c={} t={} layers={} heads={} batch={}, {} steps per node; no exchange: {:.0} tok/s",
            args.nodes,
            run.model.width,
            run.model.context,
            run.model.layers,
            run.model.heads,
            run.batch,
            run.steps,
            alone
        );
        if !args.speeds.is_empty() {
            let each: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
            println!(
                "speeds {:?} as CPU quotas (the fastest {} CPUs): tok/s of each alone {}",
                args.speeds,
                args.fastest_cpus,
                each.join(" + ")
            );
        }
        println!(
            "one member alone: held-out loss {solo_loss:.4} after {solo_steps} steps at lr {solo_lr}, {solo_seconds:.0} s \
             at its side-by-side rate"
        );
        match (bound.steps, bound_seconds) {
            (Some(k), Some(at)) => println!(
                "bound (perfect data parallelism: the exact every-step mean, nothing waiting), lr {}: at or below it \
                 at step {k}, {at:.0} s, {:.0}% of the member alone's time",
                bound.lr,
                at / solo_seconds * 100.0
            ),
            _ => println!(
                "bound (perfect data parallelism: the exact every-step mean, nothing waiting): not at or below it \
                 within the run's {} steps (lowest {:.4}, lr {})",
                run.steps,
                bound.curve.iter().map(|&(_, l)| l).fold(f32::INFINITY, f32::min),
                bound.lr
            ),
        }
        println!(
            "{:<26} {:>7} {:>6} {:>10} {:>12} {:>9} {:>6} {:>9} {:>9} {:>7} {:>9} {:>8}",
            "mode",
            "lr",
            "syncs",
            "tok/s",
            "bytes/token",
            "vs first",
            "util",
            "loss",
            "vs first",
            "secs",
            "to loss",
            "vs solo"
        );
    }
    for m in &measured {
        let utilization = m.tokens_per_s / alone;
        let fewer = seed_bytes / m.bytes_per_token;
        let loss_gap = f64::from(m.heldout_loss / seed_loss - 1.0);
        let to_loss = m.time_to_loss.map(|(at, _)| at);
        if args.json {
            let mut row = json!({"mode": m.mode, "tokens_per_s": m.tokens_per_s, "bytes_per_token": m.bytes_per_token,
                    "utilization": utilization, "heldout_loss": m.heldout_loss, "syncs": m.syncs,
                    "bytes_fewer_than_first": fewer, "loss_vs_first": loss_gap, "seconds": m.seconds,
                    "no_exchange_tokens_per_s": alone, "nodes": args.nodes, "rate_mbit": args.rate_mbit,
                    "rtt_ms": args.rtt_ms, "steps": run.steps, "outer": outer, "overlap": m.overlap,
                    "sampled": m.sampled, "time_to_loss_s": to_loss, "solo_time_to_loss_s": solo_seconds,
                    "time_to_loss_estimated": m.time_to_loss.is_some_and(|(_, estimated)| estimated),
                    "solo_heldout_loss": solo_loss, "elastic": m.elastic, "speeds": args.speeds,
                    "window_steps": m.window_steps,
                    "compute_s": m.breakdown[0], "exchange_s": m.breakdown[1], "hash_guard_s": m.breakdown[2],
                    "outer_lr": run.sync.outer.lr, "outer_momentum": run.sync.outer.momentum,
                    "lr": m.lr, "solo_lr": solo_lr, "lr_grid": data.grid, "corpus": data.corpus.name(),
                    "corpus_digest": format!("{:#018x}", data.corpus.digest()), "corpus_share": share,
                    "curve": m.curve, "solo_curve": solo_points});
            // (Beside the row: `json!` nests too deep for one literal of every field.)
            for (key, value) in [
                ("solo_steps", json!(solo_steps)),
                ("bound_steps", json!(bound.steps)),
                ("bound_time_to_loss_s", json!(bound_seconds)),
                ("bound_lr", json!(bound.lr)),
                ("bound_every", json!(args.bound_every)),
                ("bound_curve", json!(bound.curve)),
            ] {
                row[key] = value;
            }
            println!("{row}");
        } else {
            let (to_loss, vs_solo) = match m.time_to_loss {
                Some((at, estimated)) => (
                    format!("{at:.0}{}", if estimated { "~" } else { "" }),
                    format!("{:.0}%", at / solo_seconds * 100.0),
                ),
                None => ("—".to_string(), "—".to_string()),
            };
            println!(
                "{:<26} {:>7} {:>6} {:>10.0} {:>12.2} {:>8.1}x {:>5.0}% {:>9.4} {:>+8.2}% {:>7.1} {:>9} {:>8}",
                m.mode,
                m.lr,
                if m.sampled { format!("{}*", m.syncs) } else { m.syncs.to_string() },
                m.tokens_per_s,
                m.bytes_per_token,
                fewer,
                utilization * 100.0,
                m.heldout_loss,
                loss_gap * 100.0,
                m.seconds,
                to_loss,
                vs_solo
            );
        }
    }
    if !args.json {
        println!("per node and sync, syncs after the first: compute / waiting for the exchange / hash and guard");
        for m in &measured {
            let [compute, exchange, hash] = m.breakdown;
            println!("{:<26} {compute:>8.2} s {exchange:>8.2} s {hash:>8.3} s", m.mode);
        }
        for m in measured.iter().filter(|m| !m.window_steps.is_empty()) {
            let each: Vec<String> = m.window_steps.iter().map(|s| format!("{s:.1}")).collect();
            println!("{}: inner steps a window, each member in roster order (mean): {}", m.mode, each.join(" / "));
        }
    }
    if !args.json && measured.iter().any(|m| m.sampled) {
        println!("* ran these syncs on the network (throughput, bytes), checked bit-identical to a one-process replay");
        println!("~ the sync that reached the loss times the measured seconds per sync (the run was sampled)");
    }
    if !args.json {
        println!(
            "to loss: seconds from the first roster until the group's held-out loss was at most the member alone's \
             final one (— not within the run); vs solo: of the member alone's time (the bound's above)"
        );
    }
    Ok(ExitCode::SUCCESS)
}
