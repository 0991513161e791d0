//! `lockstep bench exchange`: how fast gradients move between two processes' worth of
//! WebRTC on loopback — one pair and a 3-node mesh, the mesh's channel settings against a
//! naive channel with the crate's defaults, beside plain TCP, all in the same run, 48 KB
//! messages (the mesh's fragment size).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use lockstep_mesh::bench::{data_channel_mb_per_s, tcp_mb_per_s, Flavor};
use lockstep_mesh::{Command, MeshConfig, Report, StepTiming};
use lockstep_node::config::RunConfig;
use lockstep_node::data::Corpus;
use lockstep_node::replica::{Replica, TrainerReplica};
use lockstep_node::session::Event;
use lockstep_node::wire::FRAGMENT_BYTES;
use lockstep_signaling::{serve, Limits, ServerConfig};

use lockstep_tui::backend::{admit, Opening};
use lockstep_tui::node_runtime::{HostProvider, Text};

#[derive(clap::Args)]
pub struct ExchangeArgs {
    /// Megabytes sent per pair per measurement.
    #[arg(long, default_value_t = 64)]
    mb: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Rounds of throughput measurements; each figure is the best round.
    #[arg(long, default_value_t = 3)]
    trials: usize,
    /// Steps per group size in the step-time breakdown (the first two are not counted).
    #[arg(long, default_value_t = 8)]
    steps: u32,
    /// Group sizes for the step-time breakdown (0 to skip it).
    #[arg(long, value_delimiter = ',', default_value = "2,3,4")]
    nodes: Vec<usize>,
    /// The step-time breakdown with each step's commit waited for before the next computes
    /// (`lockstep node --no-compute-ahead`), for the cost of a commit.
    #[arg(long)]
    no_compute_ahead: bool,
}

/// Mean step timing over the nodes of an in-process group training the default model.
async fn step_breakdown(nodes: usize, steps: u32, compute_ahead: bool) -> anyhow::Result<(StepTiming, f64)> {
    let server = serve(ServerConfig {
        bind: "127.0.0.1:0".parse()?,
        static_dir: None,
        corpus_dir: None,
        trusted_proxy: None,
        limits: Limits::default(),
        data: None,
        resume_secret: None,
    })
    .await?;
    let url = format!("ws://{}/ws", server.local_addr);
    let expected_phash = lockstep_luts::probe::reference_probe_hash()?;
    let reports: Arc<Mutex<Vec<(usize, Instant, Report)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut controls = Vec::new();
    let threads = (std::thread::available_parallelism().map_or(1, |n| n.get()) / nodes).max(1) as u32;
    for index in 0..nodes {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        controls.push(tx);
        let admitted = admit("cpu", threads, Opening::default(), &mut |_| {}, &mut |_| {})?;
        let config = MeshConfig {
            signal_url: url.clone(),
            bind_ip: "127.0.0.1".parse()?,
            ice_servers: Vec::new(),
            turn_username: String::new(),
            turn_credential: String::new(),
            expected_phash,
            repair_after_ms: 5_000,
            deadline: lockstep_node::session::StepDeadline::default(),
            slow_windows: 0,
            agreement: lockstep_node::session::AgreementTiming::default(),
            compute_ahead,
            // The exchange's cost alone.
            audit_rate: 0,
            audit_state_part: 1000,
            audits_on_spare_cycles: true,
            audit_workers: 1,
            id: lockstep_mesh::new_member_id(),
            backend: admitted.name.clone(),
            verdict: admitted.verdict.clone(),
            link: lockstep_mesh::LinkShim::default(),
            in_flight_bytes: lockstep_mesh::IN_FLIGHT_BYTES,
            // Nothing here is kicked or fails on purpose; a bench node that must stop saves
            // where the system keeps temporary files.
            ckpt_dir: std::env::temp_dir(),
        };
        // Throughput only: the built-in text is as good as any.
        let provider = HostProvider { threads, text: Text::Corpus(Arc::new(Corpus::builtin())), audit_threads: 0 };
        let replica = TrainerReplica::new(&admitted.name, Box::new(provider), Some(Box::new(admitted.gemm)));
        let replica: Arc<Mutex<dyn Replica>> = Arc::new(Mutex::new(replica));
        let sink = reports.clone();
        tokio::spawn(lockstep_mesh::run(config, replica, rx, move |r| {
            sink.lock().unwrap_or_else(|p| p.into_inner()).push((index, Instant::now(), r))
        }));
        // Join one at a time so the first node is the oldest.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let opened = |reports: &[(usize, Instant, Report)]| {
        reports.iter().filter(|(_, _, r)| matches!(r, Report::ChannelOpen(_))).count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while opened(&reports.lock().unwrap_or_else(|p| p.into_inner())) < nodes * (nodes - 1) {
        anyhow::ensure!(Instant::now() < deadline, "the {nodes}-node mesh did not connect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    controls[0].send(Command::Start(RunConfig { steps, ..RunConfig::DEFAULT }))?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let applied = |reports: &[(usize, Instant, Report)]| {
        reports.iter().filter(|(_, _, r)| matches!(r, Report::Applied { step, .. } if *step == steps)).count()
    };
    while applied(&reports.lock().unwrap_or_else(|p| p.into_inner())) < nodes {
        anyhow::ensure!(Instant::now() < deadline, "the {nodes}-node run did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for control in &controls {
        let _ = control.send(Command::Quit);
    }
    let reports = reports.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut sum = StepTiming::default();
    let mut count = 0.0;
    let mut leader_times: BTreeMap<u32, Instant> = BTreeMap::new();
    let mut hashes: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (index, at, report) in &reports {
        // Step times from the session's applies (the `Applied` report waits for the new
        // weights' hash, which is computed alongside the next step).
        if let (0, Report::Session(Event::StepApplied { step, .. })) = (*index, report) {
            leader_times.insert(*step, *at);
        }
        if let Report::Applied { step, whash, timing } = report {
            hashes.entry(*step).or_default().push(*whash);
            if *step > 2 {
                sum.compute += timing.compute;
                sum.hash_guard += timing.hash_guard;
                sum.exchange += timing.exchange;
                count += 1.0;
            }
        }
    }
    anyhow::ensure!(hashes.values().all(|h| h.iter().all(|x| *x == h[0])), "the replicas disagreed");
    let first = leader_times.get(&2).context("step 2")?;
    let last = leader_times.get(&steps).context("last step")?;
    let step_time = last.duration_since(*first).as_secs_f64() / f64::from(steps - 2);
    let mean = StepTiming {
        compute: sum.compute / count,
        hash_guard: sum.hash_guard / count,
        exchange: sum.exchange / count,
        ..StepTiming::default()
    };
    Ok((mean, step_time))
}

pub fn run(args: ExchangeArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let total = args.mb * 1_000_000 / FRAGMENT_BYTES * FRAGMENT_BYTES;
    let rows: Vec<(&str, &str, f64)> = runtime.block_on(async {
        let mut rows = vec![("tcp", "1 pair", tcp_mb_per_s(FRAGMENT_BYTES, total).await?)];
        let channels = [
            ("naive data channel", Flavor::Naive, 1, "1 pair"),
            ("mesh data channel", Flavor::Mesh, 1, "1 pair"),
            ("naive data channel", Flavor::Naive, 3, "3 pairs"),
            ("mesh data channel", Flavor::Mesh, 3, "3 pairs"),
        ];
        for (name, flavor, pairs, label) in channels {
            rows.push((name, label, data_channel_mb_per_s(flavor, pairs, FRAGMENT_BYTES, total).await?));
        }
        Ok::<_, anyhow::Error>(rows)
    })?;
    let mut breakdown = Vec::new();
    for &n in args.nodes.iter().filter(|&&n| n >= 2) {
        let (timing, step) = runtime.block_on(step_breakdown(n, args.steps.max(4), !args.no_compute_ahead))?;
        breakdown.push((n, timing, step));
    }
    let naive = rows[1].2;
    if args.json {
        for (what, links, mb) in &rows {
            println!(
                "{}",
                serde_json::json!({"transport": what, "links": links, "mb_per_s": mb, "vs_naive_pair": mb / naive})
            );
        }
    } else {
        println!("{:<20} {:<8} {:>10} {:>14}", "transport", "links", "MB/s", "vs naive pair");
        for (what, links, mb) in &rows {
            println!("{what:<20} {links:<8} {mb:>10.1} {:>13.2}x", mb / naive);
        }
        println!(
            "({} MB per link, {FRAGMENT_BYTES}-byte messages, 127.0.0.1, best of {} rounds)",
            total / 1_000_000,
            args.trials.max(1)
        );
    }
    if !breakdown.is_empty() && !args.json {
        println!();
        println!("step time, default model, nodes in one process on 127.0.0.1 (mean per node)");
        println!(
            "{:<6} {:>10} {:>12} {:>12} {:>16} {:>9}",
            "nodes", "step ms", "compute ms", "exchange ms", "hash+guard ms", "hash %"
        );
    }
    for (n, t, step) in &breakdown {
        let share = 100.0 * t.hash_guard / step;
        if args.json {
            println!(
                "{}",
                serde_json::json!({"nodes": n, "step_ms": step * 1e3, "compute_ms": t.compute * 1e3,
                "exchange_ms": t.exchange * 1e3, "hash_guard_ms": t.hash_guard * 1e3, "hash_guard_percent": share})
            );
        } else {
            println!(
                "{n:<6} {:>10.1} {:>12.1} {:>12.1} {:>16.2} {:>8.2}%",
                step * 1e3,
                t.compute * 1e3,
                t.exchange * 1e3,
                t.hash_guard * 1e3,
                share
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
