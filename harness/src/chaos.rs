//! `lockstep chaos`: a randomized fault campaign on real processes.
//!
//! Each episode starts from a seed: a signaling server and three or four headless nodes (this
//! binary, as separate processes, each in a network namespace of its own on one bridge — or all
//! on loopback with `--network loopback`), a tiny run in `every-step` — its contributions f32,
//! int8, or the sparse sync's `topk:64` picks with the sign rule, the packed ones summed by the
//! mesh or by chunk owners (`--exchange owners`) — or, with int8, `outer:2` —
//! plain, overlapped (`--overlap 1`) or in elastic windows (`outer:4`) — then a
//! plan of faults drawn from the seed and played in real time, overlapping: a member or the
//! leader suspended (SIGSTOP, now and then for 40 s, past the life of its WebRTC links) and
//! woken, a node killed (SIGKILL) and a new one started, the links between two halves cut and
//! healed, one member deaf to another (a one-way cut: it hears, it is not heard), bursts of
//! packet loss on one node's links (10–50% of its packets both ways), the signaling server
//! killed and started again, a node quitting and a new one joining. Through namespaces, cuts and
//! losses are nftables rules on the bridge (`netns.rs`): the packets vanish in the network and
//! the links find out as a real network would let them; on loopback, cuts are `cut` commands
//! inside the nodes (the channels stay open) and there is no loss. After the last fault heals, every live node must apply new steps within
//! a bound; then everything stops and the reports are checked. (A plan never takes a majority
//! of the run's members away for good — kills and quits are fewer than half the nodes: Raft
//! cannot tell that from a cut, and a minority commits nothing, by design.)
//!
//! - **forks**: two nodes that reported different weights for one step — any step, from any
//!   node, dead ones included: nobody applies a step before its record is committed;
//! - **hangs**: a live node that applied nothing new within the bound after the last heal;
//! - **guard stops**.
//!
//! Every `step` event carries the Raft term and log index of its record, and `leader` and
//! `no-majority` events the term, so a failed episode's reports (`--keep`) can be read.
//!
//! Adding a fault kind: a [`Kind`] variant, its draw in [`Plan::draw`] (from the second
//! generator, so the plans of the seeds published so far stay what they were), its `Display`,
//! and its begin and end in [`episode`]'s timeline.
//!
//! An episode line names its seed; `--seed S --episodes 1` replays its plan (the timing is
//! real, so the interleaving is not bit-for-bit the same).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use lockstep_luts::rng::SplitMix64;
use serde_json::{json, Value};

use crate::client::{self, Headless, SignalServer};
use crate::netns::{self, DropRule};

#[derive(clap::Args)]
pub struct ChaosArgs {
    /// Episodes to run.
    #[arg(long, default_value_t = 10)]
    episodes: u64,
    /// The first episode's seed; episode `i` uses `seed + i`.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Episodes run at once (each has its own signaling server and nodes).
    #[arg(long, default_value_t = 1)]
    jobs: u64,
    /// Faults per episode: at least 2, at most this many.
    #[arg(long, default_value_t = 4)]
    max_faults: u64,
    /// The longest ordinary fault, in seconds.
    #[arg(long, default_value_t = 10)]
    max_fault_s: u64,
    /// Per cent of suspensions that last 40 s (the links die while the node sleeps).
    #[arg(long, default_value_t = 15)]
    long_sleep_pct: u64,
    /// Faults begin within this many seconds of the run's third step (so they overlap).
    #[arg(long, default_value_t = 20)]
    window_s: u64,
    /// Seconds every live node has to apply new steps after the last fault heals.
    #[arg(long, default_value_t = 90)]
    progress_bound_s: u64,
    /// The nodes' shortest election timeout, in ms (`lockstep node --election-ms`).
    #[arg(long, default_value_t = 3000)]
    election_ms: u64,
    /// One JSON object per episode, then the summary.
    #[arg(long)]
    json: bool,
    /// Keep every node's reports of a failed episode here (`seed-S/node-ID.jsonl`).
    #[arg(long)]
    keep: Option<std::path::PathBuf>,
    /// Where the nodes' packets travel: `netns`, a namespace per node on one bridge, cuts and
    /// loss bursts by nftables rules on it (root and `nft` needed); `loopback`, one network,
    /// cuts played inside the nodes (`cut`/`heal` commands) and no loss bursts.
    #[arg(long, value_enum, default_value_t = Network::Netns)]
    network: Network,
}

/// Where an episode's packets travel (`--network`).
#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
pub enum Network {
    Netns,
    Loopback,
}

/// A long suspension: past the ~30 s after which WebRTC fails a silent link.
const LONG_SLEEP_S: f64 = 40.0;
/// The step deadline the campaign's nodes use (floor, ceiling), in ms.
const DEADLINE_MS: (u64, u64) = (2000, 10_000);

/// One fault of a plan: what, to whom, when (seconds after the run's third step) and for how
/// long.
#[derive(Clone, Debug)]
struct Fault {
    kind: Kind,
    at_s: f64,
    secs: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// SIGSTOP, then SIGCONT.
    Suspend(usize),
    /// SIGKILL; a new node starts when the fault ends.
    Kill(usize),
    /// The nodes of the first half stop sending to those of the second, and back; healed.
    Cut,
    /// The signaling server is killed, and started again on its port with its resume key.
    SignalDown,
    /// The node quits; a new one joins when the fault ends.
    Quit(usize),
    /// The first node stops sending to the second (it still hears it); healed.
    OneWay(usize, usize),
    /// A share of the node's packets, both ways, lost at random (`--network netns` only).
    Loss(usize, u32),
}

/// How an episode's run syncs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    EveryStep,
    /// `every-step` with int8 (error feedback's residual in every checkpoint and resume).
    EveryStepInt8,
    /// The sparse sync: `every-step` with `topk:64` and the sign rule (`sign:0.999`: the
    /// residual a decaying momentum).
    Sparse,
    /// `every-step` int8 summed by chunk owners.
    Owners,
    /// The sparse sync summed by chunk owners.
    SparseOwners,
    /// `outer:2` with int8.
    Outer,
    /// `outer:2` with int8 and an overlap of one step.
    Overlapped,
    /// `outer:4` with int8 in elastic windows.
    Elastic,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::EveryStep => "every-step",
            Mode::EveryStepInt8 => "every-step int8",
            Mode::Sparse => "every-step topk:64 sign:0.999",
            Mode::Owners => "every-step int8 owners",
            Mode::SparseOwners => "every-step topk:64 sign:0.999 owners",
            Mode::Outer => "outer:2 int8",
            Mode::Overlapped => "outer:2 int8 overlap 1",
            Mode::Elastic => "outer:4 int8 elastic",
        }
    }

    /// The `start` command's sync settings.
    fn settings(self, start: &mut Value) {
        let (sync, overlap, elastic) = match self {
            Mode::EveryStep => return,
            Mode::EveryStepInt8 => {
                start["compress"] = "int8".into();
                return;
            }
            Mode::Sparse | Mode::SparseOwners => {
                start["compress"] = "topk:64".into();
                start["step-rule"] = "sign:0.999".into();
                if self == Mode::SparseOwners {
                    start["exchange"] = "owners".into();
                }
                return;
            }
            Mode::Owners => {
                start["compress"] = "int8".into();
                start["exchange"] = "owners".into();
                return;
            }
            Mode::Outer => ("outer:2", 0, false),
            Mode::Overlapped => ("outer:2", 1, false),
            Mode::Elastic => ("outer:4", 0, true),
        };
        start["sync"] = sync.into();
        start["compress"] = "int8".into();
        if overlap > 0 {
            start["overlap"] = overlap.into();
        }
        if elastic {
            start["elastic"] = true.into();
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.kind {
            Kind::Suspend(n) => format!("suspend n{n}"),
            Kind::Kill(n) => format!("kill n{n}"),
            Kind::Cut => "cut halves".to_string(),
            Kind::SignalDown => "signal down".to_string(),
            Kind::Quit(n) => format!("quit n{n}"),
            Kind::OneWay(a, b) => format!("n{a} deaf-to n{b}"),
            Kind::Loss(n, per_cent) => format!("loss {per_cent}% n{n}"),
        };
        write!(f, "{what} {:.0}s@{:.0}s", self.secs, self.at_s)
    }
}

/// An episode's setting and faults, all drawn from its seed.
#[derive(Clone, Debug)]
struct Plan {
    seed: u64,
    nodes: usize,
    mode: Mode,
    faults: Vec<Fault>,
}

impl Plan {
    fn draw(seed: u64, args: &ChaosArgs) -> Plan {
        let mut rng = SplitMix64::new(seed);
        let nodes = 3 + rng.below(2) as usize;
        let outer = rng.below(2) == 1;
        let count = 2 + rng.below(args.max_faults.saturating_sub(1).max(1)) as usize;
        let mut gone = BTreeSet::new();
        let mut faults = Vec::new();
        for _ in 0..count {
            let at_s = rng.below(args.window_s.max(1) * 10) as f64 / 10.0;
            let mut secs = 1.0 + rng.below(args.max_fault_s.max(1) * 10) as f64 / 10.0;
            let node = rng.below(nodes as u64) as usize;
            let kind = match rng.below(10) {
                0..=3 if !gone.contains(&node) => {
                    if rng.below(100) < args.long_sleep_pct {
                        secs = LONG_SLEEP_S;
                    }
                    Kind::Suspend(node)
                }
                // Never a majority of the run's members gone for good: survivors that are a
                // minority cannot tell that from a cut (the operator's `forget` is for that).
                4 | 5 if !gone.contains(&node) && 2 * (gone.len() + 1) < nodes => {
                    gone.insert(node);
                    if rng.below(2) == 0 {
                        Kind::Kill(node)
                    } else {
                        Kind::Quit(node)
                    }
                }
                0..=6 => Kind::Cut,
                _ => Kind::SignalDown,
            };
            faults.push(Fault { kind, at_s, secs });
        }
        // What later campaigns added is drawn from a second generator: the plans of the seeds
        // published before (mode and faults alike) stay what they were.
        let mut more = SplitMix64::new(seed ^ 0x6c6f_636b_7374_6570);
        let mode = match (outer, more.below(3)) {
            // Every-step's contributions from a third generator (since 2026-12-07; the
            // every-step episodes of earlier campaigns all sent f32).
            // The packed ones summed by chunk owners every other time, from a fourth (since
            // 2026-12-07, later that day; its key chosen so that CI's twenty episodes from seed
            // 2000 draw every mode).
            (false, _) => {
                let owners = SplitMix64::new(seed ^ 0x6f77_6e65_7275).below(2) == 0;
                match (SplitMix64::new(seed ^ 0x7370_6172_7365).below(3), owners) {
                    (0, _) => Mode::EveryStep,
                    (1, false) => Mode::EveryStepInt8,
                    (1, true) => Mode::Owners,
                    (_, false) => Mode::Sparse,
                    (_, true) => Mode::SparseOwners,
                }
            }
            (true, 0) => Mode::Outer,
            (true, 1) => Mode::Overlapped,
            (true, _) => Mode::Elastic,
        };
        if more.below(3) == 0 {
            let a = more.below(nodes as u64) as usize;
            let b = (a + 1 + more.below(nodes as u64 - 1) as usize) % nodes;
            let at_s = more.below(args.window_s.max(1) * 10) as f64 / 10.0;
            let secs = 1.0 + more.below(args.max_fault_s.max(1) * 10) as f64 / 10.0;
            faults.push(Fault { kind: Kind::OneWay(a, b), at_s, secs });
        }
        // Loss bursts only travel through namespaces: a third generator, so a loopback plan
        // is the plan published before them.
        if args.network == Network::Netns {
            let mut third = SplitMix64::new(seed ^ 0x6e65_746e_735f_6c6f);
            for _ in 0..third.below(3) {
                let node = third.below(nodes as u64) as usize;
                let per_cent = 10 + 10 * third.below(5) as u32;
                let at_s = third.below(args.window_s.max(1) * 10) as f64 / 10.0;
                let secs = 1.0 + third.below(args.max_fault_s.max(1) * 10) as f64 / 10.0;
                faults.push(Fault { kind: Kind::Loss(node, per_cent), at_s, secs });
            }
        }
        faults.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        Plan { seed, nodes, mode, faults }
    }
}

/// A node of an episode, and whether it ended: `true` for a kill or a quit (its last step may
/// be its own).
struct Member {
    node: Headless,
    ended: bool,
}

impl Member {
    /// A node joining `url`, inside the next namespace of `network` if there is one.
    fn spawn(
        bin: &Path,
        network: Option<&mut netns::Network>,
        url: &str,
        ckpt: &Path,
        election_ms: u64,
    ) -> anyhow::Result<Member> {
        let launcher = match network {
            Some(network) => {
                let index = network.add_node(None)?;
                network.launcher(index, bin)
            }
            None => Command::new(bin),
        };
        let (floor, ceiling) = DEADLINE_MS;
        let (floor, ceiling, election) = (floor.to_string(), ceiling.to_string(), election_ms.to_string());
        let extra = ["--step-deadline-floor-ms", &floor, "--step-deadline-ceiling-ms", &ceiling];
        let mut command = client::node_command(launcher, url, "cpu", &extra);
        command.args(["--election-ms", &election]).arg("--ckpt-dir").arg(ckpt);
        let node = Headless::join(command, Duration::from_secs(30))?;
        Ok(Member { node, ended: false })
    }

    /// A command line; a node that is gone cannot take it (nothing to do then).
    fn command(&mut self, command: Value) {
        let _ = self.node.command(&command);
    }
}

/// What one episode found.
#[derive(Debug, Default)]
struct Outcome {
    steps: u64,
    forks: Vec<(u64, BTreeSet<String>)>,
    hung: Vec<u64>,
    guard_stops: usize,
    /// Seconds from the last heal until every live node had applied new steps.
    recovered_s: Option<f64>,
    error: Option<String>,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.forks.is_empty() && self.hung.is_empty() && self.guard_stops == 0 && self.error.is_none()
    }
}

pub fn run(args: ChaosArgs) -> anyhow::Result<ExitCode> {
    let bin = std::env::current_exe().context("the lockstep binary")?;
    if args.network == Network::Netns {
        // Said once, before any episode: what namespaces need here, and the way without them.
        let probe = netns::Network::new(&format!("lsc{}p", std::process::id()));
        probe.and_then(|n| n.set_drops(&[])).context(
            "--network netns needs root, iproute2 and nftables (`nft`); `--network loopback` plays cuts inside \
             the nodes instead",
        )?;
    }
    let seeds: Vec<u64> = (0..args.episodes).map(|i| args.seed + i).collect();
    let results: Mutex<Vec<(Plan, Outcome)>> = Mutex::new(Vec::new());
    let next = Mutex::new(seeds.into_iter());
    let args = &args;
    std::thread::scope(|scope| {
        for _ in 0..args.jobs.max(1) {
            scope.spawn(|| loop {
                let Some(seed) = next.lock().unwrap_or_else(|p| p.into_inner()).next() else { return };
                let plan = Plan::draw(seed, args);
                let outcome = episode(&bin, &plan, args)
                    .unwrap_or_else(|e| Outcome { error: Some(format!("{e:#}")), ..Outcome::default() });
                print_episode(&plan, &outcome, args.json);
                results.lock().unwrap_or_else(|p| p.into_inner()).push((plan, outcome));
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    let failed: Vec<u64> = results.iter().filter(|(_, o)| !o.ok()).map(|(p, _)| p.seed).collect();
    let forks: usize = results.iter().map(|(_, o)| o.forks.len()).sum();
    let hangs: usize = results.iter().map(|(_, o)| o.hung.len()).sum();
    let guards: usize = results.iter().map(|(_, o)| o.guard_stops).sum();
    let errors = results.iter().filter(|(_, o)| o.error.is_some()).count();
    let mut recoveries: Vec<f64> = results.iter().filter_map(|(_, o)| o.recovered_s).collect();
    recoveries.sort_by(f64::total_cmp);
    let worst = recoveries.last().copied().unwrap_or(0.0);
    let at = |q: f64| recoveries.get(((recoveries.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    let (median, p90) = (at(0.5), at(0.9));
    // Two of the longest election timeouts (each node's is up to twice the shortest).
    let two_elections_s = 4.0 * args.election_ms as f64 / 1000.0;
    let faults: usize = results.iter().map(|(p, _)| p.faults.len()).sum();
    if args.json {
        println!(
            "{}",
            json!({"summary": true, "episodes": results.len(), "faults": faults, "failed": failed, "forks": forks,
                "hangs": hangs, "guard_stops": guards, "errors": errors, "median_recovery_s": median,
                "p90_recovery_s": p90, "worst_recovery_s": worst, "two_election_timeouts_s": two_elections_s,
                "progress_bound_s": args.progress_bound_s,
                "network": format!("{:?}", args.network).to_lowercase()})
        );
    } else {
        println!(
            "chaos: {} episodes, {faults} faults: {forks} forks, {hangs} hangs past {} s, {guards} guard stops, \
             {errors} harness errors; recovery after the last heal median {median:.1} s, p90 {p90:.1} s, worst \
             {worst:.1} s (two election timeouts: {two_elections_s:.0} s); failed seeds {failed:?}",
            results.len(),
            args.progress_bound_s
        );
    }
    Ok(if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn print_episode(plan: &Plan, outcome: &Outcome, as_json: bool) {
    let faults: Vec<String> = plan.faults.iter().map(Fault::to_string).collect();
    let mode = plan.mode.name();
    if as_json {
        println!(
            "{}",
            json!({"seed": plan.seed, "nodes": plan.nodes, "mode": mode, "faults": faults, "ok": outcome.ok(),
                "steps": outcome.steps, "forks": outcome.forks.iter().map(|(s, h)| json!({"step": s, "hashes": h})).collect::<Vec<_>>(),
                "hung": outcome.hung, "guard_stops": outcome.guard_stops,
                "recovered_s": outcome.recovered_s, "error": outcome.error})
        );
    } else {
        let verdict = if outcome.ok() { "ok".to_string() } else { format!("FAILED {outcome:?}") };
        let recovered = outcome.recovered_s.map_or("-".to_string(), |s| format!("{s:.1}s"));
        println!(
            "episode seed {} nodes {} {mode} [{}] steps {} forks {} recovered {recovered} {verdict}",
            plan.seed,
            plan.nodes,
            faults.join(", "),
            outcome.steps,
            outcome.forks.len(),
        );
    }
    let _ = std::io::stdout().flush();
}

/// One episode, played for real.
fn episode(bin: &Path, plan: &Plan, args: &ChaosArgs) -> anyhow::Result<Outcome> {
    let dir = std::env::temp_dir().join(format!("lockstep-chaos-{}-{}", std::process::id(), plan.seed));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let secret = dir.join("resume.key");
    let mut network = match args.network {
        Network::Netns => Some(netns::Network::new(&format!("lsc{}s{}", std::process::id(), plan.seed))?),
        Network::Loopback => None,
    };
    let mut signal = match &network {
        Some(network) => {
            SignalServer::start(bin, Some(&network.hub), &format!("{}:8765", netns::HUB_ADDRESS), Some(&secret))?
        }
        None => SignalServer::on_loopback(bin, Some(&secret))?,
    };
    // Through namespaces every node has an address of its own: they meet in a room, whose host
    // approves each joiner (the harness tells whichever node is asked to).
    let url = match &network {
        Some(_) => format!("{}?room=chaos", signal.url()),
        None => signal.url(),
    };
    let mut approved = BTreeSet::new();
    let mut nodes: Vec<Member> = Vec::new();
    for _ in 0..plan.nodes {
        nodes.push(Member::spawn(bin, network.as_mut(), &url, &dir, args.election_ms)?);
    }
    // Through namespaces, the packets each fault now under way drops (by fault index).
    let mut dropping: BTreeMap<usize, Vec<DropRule>> = BTreeMap::new();
    for index in 0..nodes.len() {
        let open = |e: &Value| e["event"] == "channel-open";
        let started = Instant::now();
        while nodes[index].node.events().iter().filter(|e| open(e)).count() < plan.nodes - 1 {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "channels did not open");
            pause(&mut nodes, &mut approved, Duration::from_millis(50));
        }
    }
    let mut start =
        json!({"cmd": "start", "steps": 1_000_000, "width": 32, "context": 32, "layers": 1, "heads": 2, "batch": 4});
    plan.mode.settings(&mut start);
    nodes[0].command(start);
    for node in &nodes {
        let third = |e: &Value| e["event"] == "weights" && e["step"].as_u64() >= Some(3);
        node.node.wait_for("its third step", Duration::from_secs(60), third)?;
    }
    // The timeline: each fault begins and ends at its time.
    let mut timeline: Vec<(f64, usize, bool)> = Vec::new();
    for (i, fault) in plan.faults.iter().enumerate() {
        timeline.push((fault.at_s, i, true));
        timeline.push((fault.at_s + fault.secs, i, false));
    }
    timeline.sort_by(|a, b| a.0.total_cmp(&b.0));
    let began = Instant::now();
    let half = plan.nodes / 2;
    // Overlapping faults of one kind nest: the node wakes, the cut heals, the server comes
    // back when the last of them ends.
    let mut depth: BTreeMap<String, u32> = BTreeMap::new();
    for (at, i, begins) in timeline {
        let wait = Duration::from_secs_f64(at).saturating_sub(began.elapsed());
        pause(&mut nodes, &mut approved, wait);
        let kind = &plan.faults[i].kind;
        let key = format!("{kind:?}");
        let level = depth.entry(key).or_default();
        let outermost = if begins {
            *level += 1;
            *level == 1
        } else {
            *level -= 1;
            *level == 0
        };
        if let (Some(network), Kind::Cut | Kind::OneWay(..) | Kind::Loss(..)) = (&network, kind) {
            // Each fault's rules while it lasts; the bridge drops the union.
            if begins {
                dropping.insert(i, drop_rules(kind, half, plan.nodes));
            } else {
                dropping.remove(&i);
            }
            network.set_drops(&dropping.values().flatten().copied().collect::<Vec<_>>())?;
            continue;
        }
        if !outermost && matches!(kind, Kind::Suspend(_) | Kind::Cut | Kind::SignalDown | Kind::OneWay(..)) {
            continue;
        }
        match (kind, begins) {
            (Kind::Suspend(n), true) => nodes[*n].node.signal("-STOP"),
            (Kind::Suspend(n), false) => nodes[*n].node.signal("-CONT"),
            (Kind::Kill(n), true) => {
                nodes[*n].node.kill();
                nodes[*n].ended = true;
            }
            (Kind::Quit(n), true) => {
                nodes[*n].command(json!({"cmd": "quit"}));
                nodes[*n].ended = true;
            }
            (Kind::Kill(_) | Kind::Quit(_), false) => {
                // A newcomer: with the server down it cannot join yet; it is started later.
                if signal.is_up() {
                    nodes.push(Member::spawn(bin, network.as_mut(), &url, &dir, args.election_ms)?);
                }
            }
            (Kind::Cut, begins) => {
                let ids: Vec<u64> = nodes[..plan.nodes].iter().map(|n| n.node.id).collect();
                let cmd = if begins { "cut" } else { "heal" };
                for a in 0..half {
                    for b in half..plan.nodes {
                        nodes[a].command(json!({"cmd": cmd, "peer": ids[b]}));
                        nodes[b].command(json!({"cmd": cmd, "peer": ids[a]}));
                    }
                }
            }
            (Kind::OneWay(a, b), begins) => {
                let peer = nodes[*b].node.id;
                nodes[*a].command(json!({"cmd": if begins { "cut" } else { "heal" }, "peer": peer}));
            }
            // Drawn only where packets travel through namespaces, and played above.
            (Kind::Loss(..), _) => {}
            (Kind::SignalDown, true) => signal.kill(),
            (Kind::SignalDown, false) => signal.restart()?,
        }
    }
    if !signal.is_up() {
        signal.restart()?;
    }
    // Every live node in the run applies new steps within the bound.
    let healed = Instant::now();
    let top = nodes.iter().filter(|n| !n.ended).map(|n| n.node.last_step()).max().unwrap_or(0);
    let bound = Duration::from_secs(args.progress_bound_s);
    let mut pending: BTreeSet<usize> = (0..nodes.len()).filter(|i| !nodes[*i].ended).collect();
    while !pending.is_empty() && healed.elapsed() < bound {
        pending.retain(|i| nodes[*i].node.last_step() < top + 3);
        pause(&mut nodes, &mut approved, Duration::from_millis(100));
    }
    let recovered_s = pending.is_empty().then(|| healed.elapsed().as_secs_f64());
    let hung: Vec<u64> = pending.iter().map(|i| nodes[*i].node.id).collect();
    for node in nodes.iter_mut().filter(|n| !n.ended) {
        node.command(json!({"cmd": "quit"}));
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut outcome = judge(&nodes);
    outcome.hung = hung;
    outcome.recovered_s = recovered_s;
    if let Some(keep) = args.keep.as_ref().filter(|_| !outcome.ok()) {
        let dir = keep.join(format!("seed-{}", plan.seed));
        std::fs::create_dir_all(&dir)?;
        for node in &nodes {
            let lines: Vec<String> = node.node.events().iter().map(Value::to_string).collect();
            std::fs::write(dir.join(format!("node-{}.jsonl", node.node.id)), lines.join("\n") + "\n")?;
        }
    }
    drop(nodes);
    drop(signal);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(outcome)
}

/// Waits `how_long`, meanwhile approving every join request a node reports (once per node and
/// joiner: a room's new host is asked again).
fn pause(nodes: &mut [Member], approved: &mut BTreeSet<(usize, u64)>, how_long: Duration) {
    let until = Instant::now() + how_long;
    loop {
        for (index, member) in nodes.iter_mut().enumerate() {
            let asked: Vec<u64> = member
                .node
                .events()
                .iter()
                .filter(|e| e["event"] == "join-request")
                .filter_map(|e| e["peer"].as_u64())
                .collect();
            for peer in asked {
                if approved.insert((index, peer)) {
                    member.command(json!({"cmd": "approve", "peer": peer}));
                }
            }
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// The packets `kind` drops on the bridge: both ways between the halves (`half` splits the
/// run's `nodes`), one way, or a share of one node's both ways.
fn drop_rules(kind: &Kind, half: usize, nodes: usize) -> Vec<DropRule> {
    let all = |from, to| DropRule { from: Some(from), to: Some(to), per_cent: 100 };
    match *kind {
        Kind::Cut => (0..half).flat_map(|a| (half..nodes).flat_map(move |b| [all(a, b), all(b, a)])).collect(),
        Kind::OneWay(a, b) => vec![all(a, b)],
        Kind::Loss(n, per_cent) => {
            vec![DropRule { from: Some(n), to: None, per_cent }, DropRule { from: None, to: Some(n), per_cent }]
        }
        _ => Vec::new(),
    }
}

/// Reads every node's reports: which weights each applied for each step (every one committed,
/// so any two that differ are a fork), and guard stops.
fn judge(nodes: &[Member]) -> Outcome {
    let mut by_step: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    let mut outcome = Outcome::default();
    for node in nodes {
        for event in node.node.events() {
            match event["event"].as_str() {
                Some("guard-stopped") => outcome.guard_stops += 1,
                Some("weights") => {
                    let (Some(step), Some(hash)) = (event["step"].as_u64(), event["whash"].as_str()) else { continue };
                    outcome.steps = outcome.steps.max(step);
                    by_step.entry(step).or_default().insert(hash.to_string());
                }
                _ => {}
            }
        }
    }
    outcome.forks = by_step.into_iter().filter(|(_, h)| h.len() > 1).collect();
    outcome
}
