//! `lockstep bench audit`: audits by recomputation measured on real processes (`docs/TRUST.md`).
//!
//! For each wrong-member kind (`--kinds`: the headless `rogue` command's kinds) it runs a group of
//! `--members` CPU nodes on loopback, `--runs` times: the group trains `every-step` (f32, or
//! packed with `--compress int8|int4`) with `--audit-rate`, the last member turns rogue after a few steps, and the bench records the syncs
//! from its first wrong contribution until every honest member has reported the verdict that
//! removes it, and any verdict against anyone else (a false accusation). Then the same group
//! honest, with audits at the rate and without, alternated `--pairs` times: the audited honest
//! contributions (and any accusation among them) and the audits' share of the group's tokens/s
//! (the median of the pairs').
//!
//! `--sync outer:H` runs windows instead of steps (f32 or packed; `--overlap D`: each window's
//! first `D` steps run ahead of the last mean, from the member's own weights).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use serde_json::{json, Value};

use crate::client::{node_command, Headless, SignalServer};

#[derive(clap::Args)]
pub struct AuditArgs {
    /// Members of the group (the last one turns rogue).
    #[arg(long, default_value_t = 4)]
    members: usize,
    /// Runs per wrong-member kind.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Every member's `--threads` (its training's; its audits run on a worker of their own at
    /// the lowest priority, whatever this is).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Every member's `--audit-state-part` (packed runs: the share of a residual a routine
    /// audit asks for; 1: the whole).
    #[arg(long, default_value_t = lockstep_tui::node_runtime::AUDIT_STATE_PART)]
    state_part: f64,
    /// Routine audits at the members' own priority (`lockstep node --audits-at-own-priority`)
    /// instead of on spare cycles only: on a machine kept busy by something else too, spare
    /// cycles may never come.
    #[arg(long)]
    own_priority: bool,
    /// Every member's `--audit-workers` (how many audits it runs at once; by default the
    /// node's own choice from its machine's cores).
    #[arg(long)]
    audit_workers: Option<u32>,
    /// Every member's `--audit-threads` (0: every core; by default the node's choice from its
    /// machine's cores).
    #[arg(long)]
    audit_threads: Option<u32>,
    /// Every member's `--audit-rate`.
    #[arg(long, default_value_t = 0.5)]
    rate: f64,
    /// Wrong-member kinds (the headless `rogue` command's): `scale:F`, `flip`, `batch` (the first
    /// member's batch), `stale`, `state` (packed runs: a forged residual); `weights` (the
    /// headless `flip` command: one weight's lowest bit flipped once, which the guard's disputes
    /// settle); or `plugin:PATH`, the
    /// last member computing on that plugin from the run's first step (`flaw_rare_flip`: a bit
    /// flipped once in a thousand products), counted from step 1.
    #[arg(long, value_delimiter = ',', default_value = "stale,flip,scale:1.001,batch")]
    kinds: Vec<String>,
    /// The sync mode: `every-step` or `outer:H`.
    #[arg(long, default_value = "every-step")]
    sync: String,
    /// `outer:H`: the steps of each window run ahead of the last mean (below `H`).
    #[arg(long, default_value_t = 0)]
    overlap: u32,
    /// The contributions' compression: `none` (f32), `int8` or `int4`.
    #[arg(long, default_value = "none", value_parser = ["none", "int8", "int4"])]
    compress: String,
    /// Steps of the honest group, with audits and without, for their cost.
    #[arg(long, default_value_t = 60)]
    honest_steps: u32,
    /// Honest runs without audits and with them, alternated this many times: the audits' share
    /// is the median of the pairs' (one machine's load drifts between runs).
    #[arg(long, default_value_t = 3)]
    pairs: usize,
    /// The honest members' backends, member by member (repeated when fewer than `--members`;
    /// a rogue run's last member, the rogue, is on `cpu` or its plugin):
    /// a plugin name (`cpu`, `lut`, `dp4a`, `tc`) or `cpu@PATH`, the CPU mirror on one path of
    /// this CPU's (`avx512-vnni`, `avx-vnni`, `avx2`, `portable`: `LOCKSTEP_CPU_PATH`) — members of
    /// two CPU kinds on one machine.
    #[arg(long, value_delimiter = ',', default_value = "cpu")]
    honest_backends: Vec<String>,
    /// The model: width, context, layers, heads, batch (the tests' tiny model by default).
    #[arg(long, value_delimiter = ',', default_value = "32,32,1,2,4")]
    model: Vec<u32>,
    /// Seconds to wait for a verdict before counting the run as missed.
    #[arg(long, default_value_t = 120)]
    within_s: u64,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Keep every member's reports of each rogue run here (`KIND-RUN/node-ID.jsonl`, the kind
    /// a plugin's file name), to see where a run's syncs went.
    #[arg(long)]
    keep: Option<std::path::PathBuf>,
}

/// A group of headless CPU nodes behind one signaling server.
struct Group {
    _server: SignalServer,
    nodes: Vec<Headless>,
    /// Where a removed member saves its state: a scratch directory, removed with the group.
    ckpt: std::path::PathBuf,
}

impl Drop for Group {
    fn drop(&mut self) {
        // The members stop first: none writes there after it is gone.
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.ckpt);
    }
}

impl Group {
    /// `backends`: member `i`'s backend is `backends[i]` (`cpu@PATH`: the CPU mirror on that path).
    fn start(bin: &Path, args: &AuditArgs, rate: f64, backends: &[String]) -> anyhow::Result<Group> {
        let server = SignalServer::on_loopback(bin, None)?;
        let url = server.url();
        let (rate, threads, part) = (rate.to_string(), args.threads.to_string(), args.state_part.to_string());
        // A removed member saves its state: into a scratch directory, not the caller's.
        let ckpt = std::env::temp_dir().join(format!("lockstep-bench-audit-{}", std::process::id()));
        let mut nodes = Vec::new();
        for backend in backends {
            let (name, path) = match backend.split_once('@') {
                Some((name, path)) => (name, Some(path)),
                None => (backend.as_str(), None),
            };
            let mut command = node_command(
                std::process::Command::new(bin),
                &url,
                name,
                &["--audit-rate", &rate, "--threads", &threads, "--audit-state-part", &part],
            );
            command.arg("--ckpt-dir").arg(&ckpt);
            if args.own_priority {
                command.arg("--audits-at-own-priority");
            }
            if let Some(workers) = args.audit_workers {
                command.arg("--audit-workers").arg(workers.to_string());
            }
            if let Some(threads) = args.audit_threads {
                command.arg("--audit-threads").arg(threads.to_string());
            }
            if let Some(path) = path {
                command.env(lockstep_worker_api::CPU_PATH_ENV, path);
            }
            nodes.push(Headless::join(command, Duration::from_secs(30))?);
        }
        for node in &nodes {
            for other in nodes.iter().filter(|o| o.id != node.id) {
                let open = |e: &Value| e["event"] == "channel-open" && e["peer"] == other.id;
                node.wait_for("an open channel", Duration::from_secs(30), open)?;
            }
        }
        Ok(Group { _server: server, nodes, ckpt })
    }

    fn train(&mut self, args: &AuditArgs, steps: u32) -> anyhow::Result<()> {
        let [width, context, layers, heads, batch] = &args.model[..] else {
            anyhow::bail!("--model takes five numbers")
        };
        let start = json!({"cmd": "start", "steps": steps, "width": width, "context": context,
            "layers": layers, "heads": heads, "batch": batch, "compress": args.compress, "sync": args.sync,
            "overlap": args.overlap});
        self.nodes[0].command(&start)
    }

    fn wait_step(&self, step: u64, within: Duration) -> anyhow::Result<()> {
        for node in &self.nodes {
            node.wait_for("a step", within, |e| e["event"] == "weights" && e["step"].as_u64() >= Some(step))?;
        }
        Ok(())
    }

    /// Events named `kind` across the group.
    fn count(&self, kind: &str) -> usize {
        self.nodes.iter().map(|n| n.events().iter().filter(|e| e["event"] == kind).count()).sum()
    }
}

/// One rogue run's outcome.
struct Caught {
    /// Syncs from its first wrong contribution to the step at which every honest member had
    /// the verdict; `None`: not named in time.
    syncs: Option<u64>,
    /// Syncs from its first wrong contribution to the first accusation of it, and to the start
    /// of the leader's dispute (a departure in values, `every-step`), where there was one.
    accused: Option<u64>,
    disputing: Option<u64>,
    /// Syncs from the first contribution of its an audit found wrong to its removal.
    from_found: Option<u64>,
    /// Of its contributions before the one found wrong, those no audit confirmed.
    unconfirmed: usize,
    false_accusations: usize,
    audited: usize,
    counts: AuditCounts,
}

/// The group's audit counters at the end of a run (each member's last report of its
/// cumulative counts, summed): assignments skipped behind a busy worker, audits started from a
/// state asked for while they waited, and from a state the auditor's last audit of the same
/// member derived (no request at all).
#[derive(Clone, Copy, Default)]
struct AuditCounts {
    skipped: u64,
    prefetched: u64,
    derived: u64,
}

impl AuditCounts {
    fn of(group: &Group) -> AuditCounts {
        let last = |field: &str| -> u64 {
            group.nodes.iter().filter_map(|n| n.events().iter().rev().find_map(|e| e[field].as_u64())).sum()
        };
        AuditCounts {
            skipped: last("audits_skipped"),
            prefetched: last("audits_prefetched"),
            derived: last("audits_derived"),
        }
    }

    fn add(self, other: AuditCounts) -> AuditCounts {
        AuditCounts {
            skipped: self.skipped + other.skipped,
            prefetched: self.prefetched + other.prefetched,
            derived: self.derived + other.derived,
        }
    }
}

/// Member `i`'s backend in an honest group: `--honest-backends`, repeated to `--members`.
fn honest_backends(args: &AuditArgs) -> Vec<String> {
    args.honest_backends.iter().cycle().take(args.members).cloned().collect()
}

fn rogue_run(bin: &Path, args: &AuditArgs, kind: &str, keep: Option<&Path>) -> anyhow::Result<Caught> {
    let plugin = kind.strip_prefix("plugin:");
    // The honest members on `--honest-backends`, as in the honest groups; the rogue on the CPU
    // mirror (or the plugin).
    let mut backends = honest_backends(args);
    backends[args.members - 1] = plugin.unwrap_or("cpu").to_string();
    let mut group = Group::start(bin, args, args.rate, &backends)?;
    group.train(args, 1_000_000)?;
    let mut rogue = group.nodes.pop().context("a member")?;
    let from = match plugin {
        Some(_) => 1,
        None if kind == "weights" => {
            group.wait_step(3, Duration::from_secs(60))?;
            rogue.command(&json!({"cmd": "flip"}))?;
            // Counted from the first step computed from the flipped weights.
            let flipped =
                |e: &Value| e["event"] == "warning" && e["message"].as_str().is_some_and(|m| m.contains("flipped"));
            let said = rogue.wait_for("the flip", Duration::from_secs(60), flipped)?;
            let after: u64 =
                said["message"].as_str().and_then(|m| m.rsplit(' ').next()?.parse().ok()).context("its step")?;
            after + 1
        }
        None => {
            group.wait_step(3, Duration::from_secs(60))?;
            rogue.wait_for("a step", Duration::from_secs(60), |e| e["event"] == "weights")?;
            let kind = if kind == "batch" { format!("batch:{}", group.nodes[0].id) } else { kind.to_string() };
            rogue.command(&json!({"cmd": "rogue", "kind": kind}))?;
            // Counted from its first wrong contribution (steps already computing when the
            // command came are honest).
            let began = rogue
                .wait_for("its first wrong contribution", Duration::from_secs(60), |e| e["event"] == "rogue-began")?;
            began["step"].as_u64().context("the step")?
        }
    };
    let is_verdict = |e: &Value| e["event"] == "verdict" && e["target"] == rogue.id;
    let mut removed_at = Some(0);
    for node in &group.nodes {
        match node.wait_for("the verdict", Duration::from_secs(args.within_s), is_verdict) {
            Ok(verdict) => removed_at = removed_at.map(|r: u64| r.max(applied_when(node, &verdict))),
            Err(_) => removed_at = None,
        }
    }
    // Where the syncs went: the first accusation of it (an auditor's, or the leader's own
    // audit's) and the start of the leader's dispute, each at the step the member that said it
    // had applied then.
    let first = |kind: &str| {
        group
            .nodes
            .iter()
            .filter_map(|n| {
                let events = n.events();
                let e = events.iter().find(|e| e["event"] == kind && e["target"] == rogue.id)?;
                Some(applied_when(n, e))
            })
            .min()
    };
    let since = |at: u64| (at + 1).saturating_sub(from);
    let (accused, disputing) = (first("accused").map(since), first("disputing").map(since));
    // The first contribution of its that an audit found wrong (a plugin's first wrong one, where
    // no audit of its steps was skipped: `--rate 1` audits each once).
    // The steps of its contributions the honest members reported `kind` of.
    let steps_of = |kind: &str| -> std::collections::BTreeSet<u64> {
        let events = group.nodes.iter().flat_map(|n| n.events());
        events.filter(|e| e["event"] == kind && e["target"] == rogue.id).filter_map(|e| e["step"].as_u64()).collect()
    };
    let found = steps_of("accused").first().copied();
    let from_found = removed_at.zip(found).map(|(at, found)| (at + 1).saturating_sub(found));
    // Its contributions before that one (from `from`) no audit confirmed: where none, the one
    // found was its first wrong one.
    let confirmed = steps_of("audited");
    let unconfirmed = found.map_or(0, |found| (from..found).filter(|s| !confirmed.contains(s)).count());
    let everyone: Vec<&Headless> = group.nodes.iter().chain(std::iter::once(&rogue)).collect();
    if let Some(dir) = keep {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for node in &everyone {
            let lines: Vec<String> = node.events().iter().map(Value::to_string).collect();
            std::fs::write(dir.join(format!("node-{}.jsonl", node.id)), lines.join("\n") + "\n")?;
        }
    }
    let false_accusations =
        everyone.iter().flat_map(|n| n.events()).filter(|e| e["event"] == "verdict" && e["target"] != rogue.id).count();
    let audited = group.count("audited");
    let counts = AuditCounts::of(&group);
    Ok(Caught {
        syncs: removed_at.map(since),
        accused,
        disputing,
        from_found,
        unconfirmed,
        false_accusations,
        audited,
        counts,
    })
}

/// The last step `node` had applied when it reported `event`.
fn applied_when(node: &Headless, event: &Value) -> u64 {
    let at = crate::client::at(event);
    node.events()
        .iter()
        .filter(|e| e["event"] == "weights" && crate::client::at(e) <= at)
        .filter_map(|e| e["step"].as_u64())
        .max()
        .unwrap_or(0)
}

/// Optimizer steps per sync of `--sync` (`outer:H`: `H`).
fn steps_per_sync(sync: &str) -> u32 {
    sync.strip_prefix("outer:").and_then(|h| h.parse().ok()).unwrap_or(1)
}

/// Syncs per second of an honest group at `rate`, and its audits and accusations.
fn honest_run(bin: &Path, args: &AuditArgs, rate: f64) -> anyhow::Result<(f64, usize, usize, AuditCounts)> {
    let mut group = Group::start(bin, args, rate, &honest_backends(args))?;
    group.train(args, (args.honest_steps + 5) * steps_per_sync(&args.sync))?;
    group.wait_step(5, Duration::from_secs(60))?;
    let began = Instant::now();
    group.wait_step(u64::from(args.honest_steps) + 5, Duration::from_secs(600))?;
    let steps_per_s = f64::from(args.honest_steps) / began.elapsed().as_secs_f64();
    let accused = group.count("accused") + group.count("verdict");
    Ok((steps_per_s, group.count("audited"), accused, AuditCounts::of(&group)))
}

pub fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.members >= 3, "a group of at least three (one of them the rogue)");
    let bin = std::env::current_exe().context("the lockstep binary")?;
    let mut rows = Vec::new();
    for kind in &args.kinds {
        let mut caught = Vec::new();
        for run in 0..args.runs {
            let keep = args.keep.as_ref().map(|dir| {
                let kind = kind.rsplit('/').next().unwrap_or(kind).replace(':', "-");
                dir.join(format!("{kind}-{run}"))
            });
            caught.push(rogue_run(&bin, &args, kind, keep.as_deref())?);
        }
        let syncs: Vec<Option<u64>> = caught.iter().map(|c| c.syncs).collect();
        let within_10 = syncs.iter().filter(|s| s.is_some_and(|s| s <= 10)).count();
        let within_100 = syncs.iter().filter(|s| s.is_some_and(|s| s <= 100)).count();
        let accused: Vec<Option<u64>> = caught.iter().map(|c| c.accused).collect();
        let disputing: Vec<Option<u64>> = caught.iter().map(|c| c.disputing).collect();
        let from_found: Vec<Option<u64>> = caught.iter().map(|c| c.from_found).collect();
        let found_within_10 = from_found.iter().filter(|s| s.is_some_and(|s| s <= 10)).count();
        rows.push(json!({"kind": kind, "runs": args.runs, "syncs_to_removal": syncs,
            "syncs_to_accusation": accused, "syncs_to_dispute": disputing,
            "syncs_from_found_to_removal": from_found, "removed_within_10_syncs_of_found": found_within_10,
            "removed_within_10_syncs": within_10, "removed_within_100_syncs": within_100,
            "false_accusations": caught.iter().map(|c| c.false_accusations).sum::<usize>(),
            "audited": caught.iter().map(|c| c.audited).sum::<usize>(),
            "audits_skipped": caught.iter().map(|c| c.counts.skipped).sum::<u64>(),
            "audits_prefetched": caught.iter().map(|c| c.counts.prefetched).sum::<u64>(),
            "audits_derived": caught.iter().map(|c| c.counts.derived).sum::<u64>(),
            "unconfirmed_before_found": caught.iter().map(|c| c.unconfirmed).collect::<Vec<_>>()}));
    }
    ensure!(args.pairs >= 1, "--pairs: at least one");
    let (mut shares, mut plains, mut withs) = (Vec::new(), Vec::new(), Vec::new());
    let (mut honest_audits, mut honest_accused, mut honest_counts) = (0, 0, AuditCounts::default());
    for _ in 0..args.pairs {
        let (plain, _, _, _) = honest_run(&bin, &args, 0.0)?;
        let (with, audits, accused, counts) = honest_run(&bin, &args, args.rate)?;
        honest_counts = honest_counts.add(counts);
        shares.push(1.0 - with / plain);
        (honest_audits, honest_accused) = (honest_audits + audits, honest_accused + accused);
        plains.push(plain);
        withs.push(with);
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (share, plain, audited_rate) = (median(&shares), median(&plains), median(&withs));
    let overlap = if args.overlap > 0 { format!(" overlap {}", args.overlap) } else { String::new() };
    let mode = format!("{}/{}{overlap}", args.sync, args.compress);
    let honest_backends = honest_backends(&args);
    let summary = json!({"members": args.members, "threads": args.threads, "rate": args.rate, "state_part": args.state_part,
        "own_priority": args.own_priority, "model": args.model, "mode": mode,
        "audit_threads": args.audit_threads.unwrap_or_else(lockstep_tui::node_runtime::default_audit_threads), "audit_workers": args.audit_workers.unwrap_or_else(lockstep_tui::node_runtime::default_audit_workers),
        "honest_backends": honest_backends,
        "kinds": rows, "honest": {"steps": args.honest_steps, "steps_per_s_without": plain,
        "steps_per_s_with": audited_rate, "audits_share_of_throughput": share, "pairs_shares": shares,
        "audited_contributions": honest_audits, "accusations": honest_accused,
        "audits_skipped": honest_counts.skipped, "audits_prefetched": honest_counts.prefetched,
        "audits_derived": honest_counts.derived}});
    if args.json {
        println!("{summary}");
    } else {
        println!(
            "bench audit: {} members on loopback, {} training thread(s) each, {mode}, audit rate {}, state part {}",
            args.members, args.threads, args.rate, args.state_part
        );
        println!(
            "{:<14} {:>5} {:>28} {:>10} {:>11} {:>8} {:>8}",
            "rogue", "runs", "syncs to removal", "within 10", "within 100", "false", "audits"
        );
        for row in summary["kinds"].as_array().into_iter().flatten() {
            let syncs: Vec<String> = row["syncs_to_removal"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| s.as_u64().map_or("missed".to_string(), |s| s.to_string()))
                .collect();
            let number = |key: &str| row[key].as_u64().unwrap_or(0);
            let kind = row["kind"].as_str().unwrap_or("");
            // A plugin's path, by its file name.
            let kind = kind.rsplit('/').next().unwrap_or(kind);
            println!(
                "{:<14} {:>5} {:>28} {:>10} {:>11} {:>8} {:>8}",
                kind,
                number("runs"),
                syncs.join(" "),
                number("removed_within_10_syncs"),
                number("removed_within_100_syncs"),
                number("false_accusations"),
                number("audited")
            );
            let phase = |key: &str| -> String {
                let syncs = row[key].as_array().into_iter().flatten();
                syncs.map(|s| s.as_u64().map_or("-".to_string(), |s| s.to_string())).collect::<Vec<_>>().join(" ")
            };
            println!(
                "{:<14}   first accused at {} · disputed from {} · removed {} syncs after the first contribution found wrong ({} before it unconfirmed) · {} audits skipped",
                "",
                phase("syncs_to_accusation"),
                phase("syncs_to_dispute"),
                phase("syncs_from_found_to_removal"),
                phase("unconfirmed_before_found"),
                number("audits_skipped")
            );
        }
        let pairs: Vec<String> = shares.iter().map(|s| format!("{:.1}%", 100.0 * s)).collect();
        println!(
            "honest group ({}), {} steps × {} pairs ({}): median {:.2} steps/s without audits, {:.2} with (the audits' share {:.1}%); {} contributions audited, {} accusations",
            honest_backends.join(", "),
            args.honest_steps,
            args.pairs,
            pairs.join(" "),
            plain,
            audited_rate,
            100.0 * share,
            honest_audits,
            honest_accused
        );
    }
    let clean =
        honest_accused == 0 && summary["kinds"].as_array().into_iter().flatten().all(|r| r["false_accusations"] == 0);
    Ok(if clean { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
