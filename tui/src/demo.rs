//! `lockstep demo`: a signaling server and three nodes in this process, the console on the
//! leader.
//!
//! The first node (the console's) opens room `demo` and hosts it; the others ask to join and
//! are approved as the demo's own (any other joiner still needs the console's approval); the
//! run starts once all three channels are open. Backends: the first node uses `--backends`'
//! first entry (default `cpu`); the others try theirs (`lut`, `dp4a`) on hardware GPUs only and
//! fall back to `cpu` with the gate's reason in the log (a software adapter such as lavapipe is
//! exact but far slower than the CPU mirror). Training text is the packaged corpus
//! (`--corpus`, read once and shared by the three nodes; the demo's server serves it under
//! `/corpus/` for nodes on other machines), or the built-in text when it has not been built —
//! the first log line then names the command that builds it. `--data` tries FineWeb-Edu
//! slices from the server's `/data` instead.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use lockstep_mesh::corpus::CorpusChoice;
use lockstep_mesh::data_client::RemoteSource;
use lockstep_mesh::Report;
use lockstep_node::session::Event;
use lockstep_signaling::{serve, ServerConfig};

use crate::backend::Opening;
use crate::console::state::{update, Action, RunState, State};
use crate::console::{action_sink, execute_effects, find_checkpoints, run_console};
use crate::headless::{emit, report_json};
use crate::node_runtime::{prepare, MeshArgs, NodeHandle, Prepared, Sink};
use crate::run_args::{CorpusArg, RunArgs};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Print every node's events as JSON lines (field `node`) instead of the console; exits
    /// when the run ends.
    #[arg(long)]
    headless: bool,
    /// One backend per node; the first is the console's. Later ones fall back to `cpu` when no
    /// hardware GPU admits them.
    #[arg(long, value_delimiter = ',', default_value = "cpu,lut,dp4a")]
    backends: Vec<String>,
    /// Threads per node for CPU backends (0: the cores shared out among the nodes).
    #[arg(long, default_value_t = 0)]
    threads: u32,
    /// Train on random FineWeb-Edu slices from the demo server's `/data` (needs the internet;
    /// the corpus when unreachable) instead of the corpus.
    #[arg(long)]
    data: bool,
    #[command(flatten)]
    corpus: CorpusArg,
    /// Where the console saves checkpoints.
    #[arg(long, default_value = "checkpoints")]
    ckpt_dir: PathBuf,
    /// Audits by recomputation: the share of its steps in which each node recomputes another's
    /// contribution (`lockstep node --audit-rate`).
    #[arg(long, default_value_t = 0.1)]
    audit_rate: f64,
    #[command(flatten)]
    run: RunArgs,
}

/// A demo node's sink: it tells the console to trust its join request, forwards warnings to
/// the log, and (headless) prints its events with its id.
fn member_sink(actions: Sender<Action>, print: bool, finished: Arc<AtomicUsize>) -> Sink {
    let id = AtomicU64::new(0);
    Arc::new(move |report: Report| {
        let send = |action: Action| {
            let _ = actions.send(action);
        };
        match &report {
            Report::Waiting { id: me, .. } => {
                id.store(*me, Ordering::Relaxed);
                send(Action::TrustJoiner(*me));
            }
            Report::Connected { id: me, .. } => id.store(*me, Ordering::Relaxed),
            Report::Warning(message) => send(Action::Log(format!("node {}: {message}", id.load(Ordering::Relaxed)))),
            Report::Session(Event::RunFinished { .. } | Event::GuardStopped(_)) => {
                finished.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        if print {
            emit(report_json(&report), Some(id.load(Ordering::Relaxed)));
        }
    })
}

pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let run = args.run.run_config()?;
    run.validate().map_err(|why| anyhow::anyhow!("invalid run settings: {why}"))?;
    anyhow::ensure!(!args.backends.is_empty(), "--backends names no backend");
    let nodes = args.backends.len();
    let threads = match args.threads {
        0 => (crate::backend::threads_or_all(0) / nodes).max(1) as u32,
        n => n,
    };
    let say = |line: String| {
        if !args.headless {
            println!("{line}");
        }
    };

    // The signaling server, on a runtime of its own.
    let server_runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let server = server_runtime
        .block_on(serve(ServerConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            // The corpus the nodes train on, for nodes on other machines.
            corpus_dir: args.corpus.choice.parse().ok().and_then(|choice: CorpusChoice| choice.served_dir()),
            ..ServerConfig::default()
        }))
        .context("starting the signaling server on 127.0.0.1")?;
    let addr = server.local_addr;
    let url = format!("ws://{addr}/ws?room=demo");
    say(format!("demo: signaling on ws://{addr}/ws (room `demo`); other machines can join with"));
    say(format!("      lockstep node --signal ws://<this host>:{}/ws?room=demo", addr.port()));

    let data = if !args.data {
        None
    } else {
        say("demo: checking /data …".to_string());
        let url = format!("http://{addr}/data");
        // The nodes' own client, with room for the server's first fetch from the source.
        let probe = RemoteSource::new(&url, 0).map(|s| s.with_timeouts(Duration::from_secs(15), Duration::ZERO));
        match probe.and_then(|mut source| source.probe()) {
            Ok(()) => Some(url),
            Err(why) => {
                say(format!("demo: /data is unreachable ({why}): training on the corpus"));
                None
            }
        }
    };
    let (tx, rx) = std::sync::mpsc::channel::<Action>();
    let started = Instant::now();

    // The console's node first: it opens the room and hosts it.
    let mesh = |backend: &str| MeshArgs {
        backend: backend.to_string(),
        threads,
        bind_ip: Some([127, 0, 0, 1].into()),
        ice_servers: Vec::new(),
        turn_username: String::new(),
        turn_credential: String::new(),
        repair_after_ms: 2000,
        step_deadline_floor_ms: lockstep_node::session::StepDeadline::default().floor_ms,
        step_deadline_ceiling_ms: lockstep_node::session::StepDeadline::default().ceiling_ms,
        election_ms: lockstep_node::session::AgreementTiming::default().longest_election_ms() / 2,
        drop_slow_after: 0,
        no_compute_ahead: false,
        audit_rate: args.audit_rate,
        audit_state_part: crate::node_runtime::AUDIT_STATE_PART,
        audits_at_own_priority: false,
        audit_workers: None,
        audit_threads: None,
        in_flight_kib: lockstep_mesh::IN_FLIGHT_BYTES / 1024,
        ckpt_dir: args.ckpt_dir.clone(),
        data: data.clone(),
        corpus: args.corpus.clone(),
        link_delay_ms: 0,
        link_loss_per_mille: 0,
    };
    let mut lines = Vec::new();
    let Prepared { config, replica, device } =
        prepare(&url, &mesh(&args.backends[0]), Opening::default(), &mut |l| lines.push(l))?;
    let mut state = State::new(&config.backend, &config.verdict, &device, run, args.ckpt_dir.clone());
    state.autostart = Some(nodes);
    for line in lines.drain(..) {
        update(&mut state, Action::Log(format!("this node: {line}")));
    }
    find_checkpoints(tx.clone(), args.ckpt_dir.clone());
    let (welcomed_tx, welcomed) = std::sync::mpsc::channel::<()>();
    let console_sink = action_sink(tx.clone(), started);
    let headless = args.headless;
    let leader_sink: Sink = Arc::new(move |report: Report| {
        if matches!(report, Report::Connected { .. }) {
            let _ = welcomed_tx.send(());
        }
        console_sink(report);
    });
    let leader = NodeHandle::start(config, replica, threads, leader_sink)?;
    welcomed.recv_timeout(Duration::from_secs(20)).context("the console's node was not welcomed within 20 s")?;

    // The others ask to join.
    let finished = Arc::new(AtomicUsize::new(0));
    let mut members = Vec::new();
    for backend in &args.backends[1..] {
        let opening = Opening { hardware_only: true, fresh_copy: false };
        let mut lines = Vec::new();
        let prepared = match prepare(&url, &mesh(backend), opening, &mut |l| lines.push(l)) {
            Ok(prepared) => prepared,
            Err(e) => {
                let why = format!("{e:#}").replace('\n', " ");
                let _ = tx.send(Action::Log(format!("demo: `{backend}` not admitted here ({why}); using cpu")));
                prepare(&url, &mesh("cpu"), Opening::default(), &mut |l| lines.push(l))?
            }
        };
        let Prepared { config, replica, .. } = prepared;
        members.push(NodeHandle::start(config, replica, threads, member_sink(tx.clone(), headless, finished.clone()))?);
    }

    if headless {
        let result = run_headless(&leader, state, &tx, &rx, &finished, members.len());
        for member in members {
            let _ = member.quit();
        }
        leader.quit()?;
        result?;
    } else {
        let in_use = state.node.backend.clone();
        crate::console::survey_backends(tx.clone(), &in_use);
        run_console(leader, state, (tx, rx), started)?;
        for member in members {
            let _ = member.quit();
        }
    }
    drop(server);
    Ok(ExitCode::SUCCESS)
}

/// The demo without a terminal: the console's state machine still approves, starts and
/// tracks the run; every report of the console's node is printed (field `node`).
fn run_headless(
    leader: &NodeHandle,
    mut state: State,
    tx: &Sender<Action>,
    rx: &std::sync::mpsc::Receiver<Action>,
    members_finished: &AtomicUsize,
    members: usize,
) -> anyhow::Result<()> {
    loop {
        let action = match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(action) => action,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                anyhow::ensure!(!leader.finished(), "the console's node left the group");
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
        };
        let printed = match &action {
            Action::Report(report, _) => Some(report_json(report)),
            Action::Log(line) => Some(serde_json::json!({"event": "log", "message": line})),
            _ => None,
        };
        let effects = update(&mut state, action);
        if let Some(value) = printed {
            emit(value, state.node.me);
        }
        execute_effects(leader, effects, tx);
        match &state.node.run_state {
            RunState::Finished => {
                // The others complete the last step from the leader's final commit.
                let waiting = Instant::now();
                while members_finished.load(Ordering::Relaxed) < members && waiting.elapsed() < Duration::from_secs(20)
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                return Ok(());
            }
            RunState::Stopped(why) => anyhow::bail!("the run stopped: {why}"),
            _ => {}
        }
    }
}
