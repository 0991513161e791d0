//! `lockstep chaos`: a randomized fault campaign on real processes.
//!
//! Each episode starts from a seed: a signaling server and three or four headless nodes (this
//! binary, as separate processes on loopback), a tiny run in `every-step` or, with int8,
//! `outer:2` — plain, overlapped (`--overlap 1`) or in elastic windows (`outer:4`) — then a
//! plan of faults drawn from the seed and played in real time, overlapping: a member or the
//! leader suspended (SIGSTOP, now and then for 40 s, past the life of its WebRTC links) and
//! woken, a node killed (SIGKILL) and a new one started, the links between two halves cut
//! (`cut`, the channels left open) and healed, one member deaf to another (a one-way cut: it
//! hears, it is not heard), the signaling server killed and started again, a node quitting and
//! a new one joining. After the last fault heals, every live node must apply new steps within
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
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use lockstep_luts::rng::SplitMix64;
use serde_json::{json, Value};

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
}

/// How an episode's run syncs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    EveryStep,
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
            Mode::Outer => "outer:2 int8",
            Mode::Overlapped => "outer:2 int8 overlap 1",
            Mode::Elastic => "outer:4 int8 elastic",
        }
    }

    /// The `start` command's sync settings.
    fn settings(self, start: &mut Value) {
        let (sync, overlap, elastic) = match self {
            Mode::EveryStep => return,
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
            (false, _) => Mode::EveryStep,
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
        faults.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        Plan { seed, nodes, mode, faults }
    }
}

/// One headless node process and the events it printed, each with when it came.
struct NodeProc {
    child: Child,
    stdin: ChildStdin,
    events: Arc<Mutex<Vec<Value>>>,
    id: u64,
    /// How it ended, if it did: `true` for a kill or a quit (its last step may be its own).
    ended: bool,
}

impl NodeProc {
    fn spawn(bin: &std::path::Path, url: &str, ckpt: &std::path::Path, election_ms: u64) -> anyhow::Result<NodeProc> {
        let (floor, ceiling) = DEADLINE_MS;
        let mut child = Command::new(bin)
            .args(["node", "--headless", "--signal", url, "--backend", "cpu", "--threads", "1"])
            .args(["--repair-after-ms", "300", "--step-deadline-floor-ms", &floor.to_string()])
            .args(["--step-deadline-ceiling-ms", &ceiling.to_string()])
            .args(["--election-ms", &election_ms.to_string()])
            .arg("--ckpt-dir")
            .arg(ckpt)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting a node")?;
        let stdin = child.stdin.take().context("the node's stdin")?;
        let stdout = child.stdout.take().context("the node's stdout")?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(value) = serde_json::from_str::<Value>(&line) {
                    sink.lock().unwrap_or_else(|p| p.into_inner()).push(value);
                }
            }
        });
        let mut node = NodeProc { child, stdin, events, id: 0, ended: false };
        let connected = node.wait_for(|e| e["event"] == "connected", Duration::from_secs(30))?;
        node.id = connected["id"].as_u64().unwrap_or(0);
        Ok(node)
    }

    fn events(&self) -> Vec<Value> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn wait_for(&self, pred: impl Fn(&Value) -> bool, within: Duration) -> anyhow::Result<Value> {
        let started = Instant::now();
        loop {
            if let Some(found) = self.events().into_iter().find(|e| pred(e)) {
                return Ok(found);
            }
            anyhow::ensure!(started.elapsed() < within, "node {} did not report it within {within:?}", self.id);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A command line; a node that is gone cannot take it (nothing to do then).
    fn command(&mut self, command: Value) {
        let _ = writeln!(self.stdin, "{command}").and_then(|()| self.stdin.flush());
    }

    fn signal(&self, which: &str) {
        let _ = Command::new("kill").args([which, &self.child.id().to_string()]).status();
    }

    fn last_step(&self) -> u64 {
        self.events().iter().filter(|e| e["event"] == "weights").filter_map(|e| e["step"].as_u64()).max().unwrap_or(0)
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The signaling server of an episode, restartable on its port with its resume key.
struct SignalProc {
    child: Option<Child>,
    port: u16,
    secret: std::path::PathBuf,
}

impl SignalProc {
    fn start(bin: &std::path::Path, port: u16, secret: &std::path::Path) -> anyhow::Result<SignalProc> {
        let mut signal = SignalProc { child: None, port, secret: secret.to_path_buf() };
        signal.restart(bin)?;
        Ok(signal)
    }

    fn restart(&mut self, bin: &std::path::Path) -> anyhow::Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        let child = Command::new(bin)
            .args(["signal", "--bind", &format!("127.0.0.1:{}", self.port), "--no-data", "--resume-secret"])
            .arg(&self.secret)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the signaling server")?;
        self.child = Some(child);
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(10), "the signaling server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SignalProc {
    fn drop(&mut self) {
        self.kill();
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
                "progress_bound_s": args.progress_bound_s})
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
fn episode(bin: &std::path::Path, plan: &Plan, args: &ChaosArgs) -> anyhow::Result<Outcome> {
    let dir = std::env::temp_dir().join(format!("lockstep-chaos-{}-{}", std::process::id(), plan.seed));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut signal = SignalProc::start(bin, port, &dir.join("resume.key"))?;
    let url = format!("ws://127.0.0.1:{port}/ws");
    let mut nodes: Vec<NodeProc> = Vec::new();
    for _ in 0..plan.nodes {
        nodes.push(NodeProc::spawn(bin, &url, &dir, args.election_ms)?);
    }
    for node in &nodes {
        let open = |e: &Value| e["event"] == "channel-open";
        let started = Instant::now();
        while node.events().iter().filter(|e| open(e)).count() < plan.nodes - 1 {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(60), "channels did not open");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let mut start =
        json!({"cmd": "start", "steps": 1_000_000, "width": 32, "context": 32, "layers": 1, "heads": 2, "batch": 4});
    plan.mode.settings(&mut start);
    nodes[0].command(start);
    for node in &nodes {
        node.wait_for(|e| e["event"] == "weights" && e["step"].as_u64() >= Some(3), Duration::from_secs(60))?;
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
        std::thread::sleep(wait);
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
        if !outermost && matches!(kind, Kind::Suspend(_) | Kind::Cut | Kind::SignalDown | Kind::OneWay(..)) {
            continue;
        }
        match (kind, begins) {
            (Kind::Suspend(n), true) => nodes[*n].signal("-STOP"),
            (Kind::Suspend(n), false) => nodes[*n].signal("-CONT"),
            (Kind::Kill(n), true) => {
                let _ = nodes[*n].child.kill();
                nodes[*n].ended = true;
            }
            (Kind::Quit(n), true) => {
                nodes[*n].command(json!({"cmd": "quit"}));
                nodes[*n].ended = true;
            }
            (Kind::Kill(_) | Kind::Quit(_), false) => {
                // A newcomer: with the server down it cannot join yet; it is started later.
                if signal.child.is_some() {
                    nodes.push(NodeProc::spawn(bin, &url, &dir, args.election_ms)?);
                }
            }
            (Kind::Cut, begins) => {
                let ids: Vec<u64> = nodes[..plan.nodes].iter().map(|n| n.id).collect();
                let cmd = if begins { "cut" } else { "heal" };
                for a in 0..half {
                    for b in half..plan.nodes {
                        nodes[a].command(json!({"cmd": cmd, "peer": ids[b]}));
                        nodes[b].command(json!({"cmd": cmd, "peer": ids[a]}));
                    }
                }
            }
            (Kind::OneWay(a, b), begins) => {
                let peer = nodes[*b].id;
                nodes[*a].command(json!({"cmd": if begins { "cut" } else { "heal" }, "peer": peer}));
            }
            (Kind::SignalDown, true) => signal.kill(),
            (Kind::SignalDown, false) => signal.restart(bin)?,
        }
    }
    if signal.child.is_none() {
        signal.restart(bin)?;
    }
    // Every live node in the run applies new steps within the bound.
    let healed = Instant::now();
    let top = nodes.iter().filter(|n| !n.ended).map(NodeProc::last_step).max().unwrap_or(0);
    let bound = Duration::from_secs(args.progress_bound_s);
    let mut pending: BTreeSet<usize> = (0..nodes.len()).filter(|i| !nodes[*i].ended).collect();
    while !pending.is_empty() && healed.elapsed() < bound {
        pending.retain(|i| nodes[*i].last_step() < top + 3);
        std::thread::sleep(Duration::from_millis(100));
    }
    let recovered_s = pending.is_empty().then(|| healed.elapsed().as_secs_f64());
    let hung: Vec<u64> = pending.iter().map(|i| nodes[*i].id).collect();
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
            let lines: Vec<String> = node.events().iter().map(Value::to_string).collect();
            std::fs::write(dir.join(format!("node-{}.jsonl", node.id)), lines.join("\n") + "\n")?;
        }
    }
    drop(nodes);
    drop(signal);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(outcome)
}

/// Reads every node's reports: which weights each applied for each step (every one committed,
/// so any two that differ are a fork), and guard stops.
fn judge(nodes: &[NodeProc]) -> Outcome {
    let mut by_step: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    let mut outcome = Outcome::default();
    for node in nodes {
        for event in node.events() {
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
