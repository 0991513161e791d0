//! The console without a terminal: `update` driven by actions, views drawn on ratatui's
//! `TestBackend` at 80×24 and 120×40 and compared with insta snapshots.

use std::path::PathBuf;

use lockstep_mesh::{CheckpointTarget, Command, Report, StepTiming, SwapProgress};
use lockstep_node::config::RunConfig;
use lockstep_node::replica::BackendChange;
use lockstep_node::session::GuardFailure;
use lockstep_node::session::{Event, Ignored};
use lockstep_node::sync::{Compression, OuterOptimizer, SyncConfig, SyncMode};
use lockstep_node::verdict::Verdict;
use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::panes::{PaneId as Pane, PANES};
use super::state::{update, Action, CheckpointRow, Effect, Key, Modal, RunState, State};
use super::view::render;

const VERDICT: Verdict = Verdict::Admitted { cases: 40 };
const CPU_DEVICE: &str = "AVX-512 VNNI path, 2 thread(s)";

fn fresh() -> State {
    State::new("cpu", &VERDICT, CPU_DEVICE, RunConfig::DEFAULT, PathBuf::from("checkpoints"))
}

fn report(state: &mut State, report: Report, at: f64) -> Vec<Effect> {
    update(state, Action::Report(report, at))
}

fn keys(state: &mut State, keys: &[Key]) -> Vec<Effect> {
    keys.iter().flat_map(|&k| update(state, Action::Key(k))).collect()
}

fn connected(state: &mut State) {
    let members = vec![1];
    report(state, Report::Connected { id: 1, members, group: "room demo".into(), host: 1 }, 0.5);
}

/// A node mid-run: three peers, 120 steps of a falling loss, two checkpoints, a full log.
fn running() -> State {
    running_with(fresh())
}

/// The same in `outer:20` with int8 and an overlap of 3 (the session's steps are outer steps;
/// the one in flight is summed while the next window runs).
fn running_outer() -> State {
    let sync = SyncConfig {
        mode: SyncMode::Outer { inner_steps: 20 },
        compression: Compression::Int8,
        outer: OuterOptimizer::DEFAULT,
        overlap: 3,
        elastic: false,
        rule: lockstep_node::sync::StepRule::Adam,
        exchange: lockstep_node::sync::Exchange::Mesh,
    };
    let settings = RunConfig { steps: 4800, sync, ..RunConfig::DEFAULT };
    running_with(State::new("cpu", &VERDICT, CPU_DEVICE, settings, PathBuf::from("checkpoints")))
}

fn running_with(mut state: State) -> State {
    connected(&mut state);
    for (peer, backend, rtt) in [(2u64, "lut", 0.8), (3, "dp4a", 1.7)] {
        report(&mut state, Report::ChannelOpen(peer), 1.0);
        report(&mut state, Report::PeerInfo { peer, backend: backend.into(), verdict: VERDICT }, 1.0);
        let link = Report::Link { peer, rtt_ms: Some(rtt), bytes_in: 41_000_000 * peer, bytes_out: 39_500_000 * peer };
        report(&mut state, link, 1.0);
        report(&mut state, Report::Session(Event::PeerJoined(peer)), 1.0);
    }
    let settings = state.node.start_settings;
    report(&mut state, Report::Session(Event::RunStarted { leader: 1, settings }), 2.0);
    report(&mut state, Report::Session(Event::Leader { peer: 1, term: 2 }), 2.0);
    let members = Event::Members { voters: vec![1, 2, 3], learners: Vec::new(), index: 7 };
    report(&mut state, Report::Session(members), 2.0);
    for step in 1..=120u32 {
        let at = 2.0 + f64::from(step) * 0.25;
        let loss = 3.5 + 2.0 * 40.0 / (40.0 + f64::from(step));
        let applied = Event::StepApplied {
            step,
            loss: loss as f32,
            peers: vec![1, 2, 3],
            whash: 0x1000 + step,
            weights: Vec::new(),
            term: 2,
            index: 7 + u64::from(step),
        };
        report(&mut state, Report::Session(applied), at);
        let timing = StepTiming {
            compute: 0.180,
            hash_guard: 0.004,
            exchange: 0.061,
            sent_bytes: 7_010_000,
            ..StepTiming::default()
        };
        report(&mut state, Report::Applied { step, whash: 0x5eed_0000 + step, timing }, at);
    }
    report(&mut state, Report::Session(Event::RepairServed { step: 40, peer: 2, to: 3 }), 12.0);
    report(
        &mut state,
        Report::CheckpointSaved { path: "checkpoints/node1-step000060.ckpt".into(), step: 60, whash: 0x0bad_cafe },
        17.0,
    );
    report(
        &mut state,
        Report::CheckpointSaved { path: "checkpoints/node1-step000120.ckpt".into(), step: 120, whash: 0x5eed_0078 },
        32.0,
    );
    update(&mut state, Action::BackendVerdict { name: "cpu".into(), verdict: VERDICT, device: CPU_DEVICE.into() });
    update(
        &mut state,
        Action::BackendVerdict {
            name: "lut".into(),
            verdict: VERDICT,
            device: "llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu, Mesa 22.3.6 (LLVM 15.0.6)), tile 64x64 of 4x4 outputs, 2 block(s) per stage".into(),
        },
    );
    update(
        &mut state,
        Action::BackendVerdict {
            name: "dp4a".into(),
            verdict: Verdict::NotLoadable { why: "no GPU adapter with an integer dot product".into() },
            device: String::new(),
        },
    );
    update(&mut state, Action::Tick(32.0));
    state
}

/// The screen as text, one line per row, trailing spaces trimmed.
fn draw(state: &State, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("a test terminal");
    terminal.draw(|frame| render(state, frame)).expect("drawing never fails on a test backend");
    let buffer = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..height {
        let line: String = (0..width).map(|x| buffer[(x, y)].symbol().to_string()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Every view, at both sizes.
#[test]
fn views() {
    let mut views: Vec<(&str, State)> = Vec::new();
    views.push(("connecting", fresh()));
    let mut idle = fresh();
    connected(&mut idle);
    views.push(("idle", idle));
    for pane in PANES {
        let mut state = running();
        state.focus = pane;
        let name = match pane {
            Pane::Roster => "running_roster",
            Pane::Health => "running_health",
            Pane::Room => "running_room",
            Pane::Checkpoints => "running_checkpoints",
            Pane::Backends => "running_backends",
            Pane::Log => "running_log",
        };
        views.push((name, state));
    }
    let mut outer = running_outer();
    outer.focus = Pane::Health;
    views.push(("running_outer_health", outer));
    let mut help = running();
    keys(&mut help, &[Key::Char('?')]);
    views.push(("help", help));
    let mut join = running();
    report(&mut join, Report::JoinRequest { peer: 4, address: "192.0.2.7".into() }, 33.0);
    views.push(("join_request", join));
    let mut swap = running();
    keys(&mut swap, &[Key::Char('w'), Key::Down]);
    views.push(("swap_pick", swap));
    let mut typing = running();
    keys(&mut typing, &[Key::Char('w'), Key::Char('p')]);
    keys(&mut typing, &"/opt/plugins/libmine.so".chars().map(Key::Char).collect::<Vec<_>>());
    views.push(("swap_path", typing));
    let mut gating = running();
    keys(&mut gating, &[Key::Char('w'), Key::Down, Key::Enter]);
    report(&mut gating, Report::Swap(SwapProgress::Gating { backend: "lut".into(), done: 17, total: 40 }), 33.0);
    views.push(("swap_gating", gating));
    let mut broadcast = running();
    keys(&mut broadcast, &[Key::Char('b')]);
    views.push(("broadcast_confirm", broadcast));
    let mut load = running();
    keys(&mut load, &[Key::Char('l')]);
    keys(&mut load, &"/srv/runs/best.ckpt".chars().map(Key::Char).collect::<Vec<_>>());
    views.push(("load_path", load));
    let mut start = fresh();
    connected(&mut start);
    keys(&mut start, &[Key::Char('s')]);
    views.push(("start_confirm", start));
    let mut quit = running();
    keys(&mut quit, &[Key::Char('q')]);
    views.push(("quit_confirm", quit));
    let mut stopped = running();
    let failure = GuardFailure { step: 121, weight_mismatch: vec![3], probe_mismatch: vec![] };
    report(&mut stopped, Report::Session(Event::GuardStopped(failure)), 33.0);
    views.push(("guard_stopped", stopped));
    for (name, state) in &views {
        for (width, height) in [(80, 24), (120, 40)] {
            insta::assert_snapshot!(format!("{name}_{width}x{height}"), draw(state, width, height));
        }
    }
}

#[test]
fn a_join_request_opens_a_modal_and_y_approves_it() {
    let mut state = running();
    report(&mut state, Report::JoinRequest { peer: 4, address: "10.0.0.4".into() }, 33.0);
    report(&mut state, Report::JoinRequest { peer: 5, address: "10.0.0.5".into() }, 33.0);
    assert_eq!(state.modal, Some(Modal::Approve { peer: 4, address: "10.0.0.4".into() }));
    assert_eq!(keys(&mut state, &[Key::Char('y')]), vec![Effect::Mesh(Command::Approve(4))]);
    // The next request is asked about at once.
    assert_eq!(state.modal, Some(Modal::Approve { peer: 5, address: "10.0.0.5".into() }));
    assert_eq!(
        keys(&mut state, &[Key::Char('n')]),
        vec![Effect::Mesh(Command::Deny { peer: 5, reason: "the host declined".into() })]
    );
    assert_eq!(state.modal, None);
    assert!(state.panes.room.pending.is_empty());
}

#[test]
fn a_request_can_wait_and_be_reviewed_later_or_withdrawn() {
    let mut state = running();
    report(&mut state, Report::JoinRequest { peer: 4, address: "10.0.0.4".into() }, 33.0);
    assert!(keys(&mut state, &[Key::Esc]).is_empty());
    assert_eq!(state.modal, None);
    assert_eq!(state.panes.room.pending, vec![(4, "10.0.0.4".to_string())]);
    // A trusted joiner approved meanwhile leaves it deferred.
    state.trusted.insert(6);
    let effects = report(&mut state, Report::JoinRequest { peer: 6, address: "10.0.0.6".into() }, 33.5);
    assert_eq!(effects, vec![Effect::Mesh(Command::Approve(6))]);
    assert_eq!(state.modal, None);
    assert_eq!(state.panes.room.pending, vec![(4, "10.0.0.4".to_string())]);
    keys(&mut state, &[Key::Char('a')]);
    assert!(matches!(state.modal, Some(Modal::Approve { peer: 4, .. })));
    report(&mut state, Report::SignalPeerLeft(4), 34.0);
    assert_eq!(state.modal, None);
    assert!(state.panes.room.pending.is_empty());
}

#[test]
fn the_demo_approves_its_own_nodes_without_asking() {
    let mut state = fresh();
    connected(&mut state);
    assert!(update(&mut state, Action::TrustJoiner(2)).is_empty());
    let effects = report(&mut state, Report::JoinRequest { peer: 2, address: "127.0.0.1".into() }, 1.0);
    assert_eq!(effects, vec![Effect::Mesh(Command::Approve(2))]);
    assert_eq!(state.modal, None);
    // A request that arrived before the demo knew the id is approved when it learns it.
    report(&mut state, Report::JoinRequest { peer: 3, address: "127.0.0.1".into() }, 1.0);
    assert_eq!(update(&mut state, Action::TrustJoiner(3)), vec![Effect::Mesh(Command::Approve(3))]);
    assert_eq!(state.modal, None);
}

#[test]
fn autostart_starts_once_when_enough_channels_are_open() {
    let mut state = fresh();
    state.autostart = Some(3);
    connected(&mut state);
    assert!(report(&mut state, Report::ChannelOpen(2), 1.0).is_empty());
    let effects = report(&mut state, Report::ChannelOpen(3), 1.0);
    assert_eq!(effects, vec![Effect::Mesh(Command::Start(state.node.start_settings))]);
    assert_eq!(state.node.run_state, RunState::Starting);
    assert!(report(&mut state, Report::ChannelOpen(4), 1.0).is_empty());
}

#[test]
fn start_asks_first() {
    let mut state = fresh();
    assert!(keys(&mut state, &[Key::Char('s')]).is_empty());
    assert_eq!(state.modal, None, "not connected yet: nothing to start");
    connected(&mut state);
    keys(&mut state, &[Key::Char('s')]);
    assert_eq!(state.modal, Some(Modal::ConfirmStart));
    assert!(keys(&mut state, &[Key::Char('n')]).is_empty());
    keys(&mut state, &[Key::Char('s')]);
    assert_eq!(keys(&mut state, &[Key::Char('y')]), vec![Effect::Mesh(Command::Start(state.node.start_settings))]);
    keys(&mut state, &[Key::Char('s')]);
    assert_eq!(state.modal, None, "a run is already starting");
}

#[test]
fn quit_confirms_only_during_a_run() {
    let mut idle = fresh();
    assert_eq!(keys(&mut idle, &[Key::Char('q')]), vec![Effect::Quit]);
    let mut state = running();
    assert!(keys(&mut state, &[Key::Char('q')]).is_empty());
    assert_eq!(state.modal, Some(Modal::ConfirmQuit));
    assert!(keys(&mut state, &[Key::Char('n')]).is_empty());
    assert_eq!(state.modal, None, "n stays");
    assert_eq!(keys(&mut state, &[Key::Char('q'), Key::Char('y')]), vec![Effect::Quit]);
}

#[test]
fn tab_cycles_every_pane_and_wraps() {
    let mut state = fresh();
    let mut seen = vec![state.focus];
    for _ in 0..PANES.len() {
        keys(&mut state, &[Key::Tab]);
        seen.push(state.focus);
    }
    assert_eq!(&seen[..PANES.len()], &PANES);
    assert_eq!(seen[PANES.len()], PANES[0]);
    keys(&mut state, &[Key::BackTab]);
    assert_eq!(state.focus, PANES[PANES.len() - 1]);
}

#[test]
fn swap_by_pick_or_path_and_the_outcome_is_shown() {
    let mut state = running();
    assert_eq!(keys(&mut state, &[Key::Char('w'), Key::Down, Key::Enter]), vec![Effect::Swap("lut".into())]);
    assert!(state.node.swap.is_some());
    keys(&mut state, &[Key::Char('w')]);
    assert_eq!(state.modal, None, "one swap at a time");
    report(
        &mut state,
        Report::Swap(SwapProgress::Refused {
            backend: "lut".into(),
            verdict: Verdict::Rejected { case: "case 3".into(), detail: "bits differ".into() },
        }),
        40.0,
    );
    assert_eq!(state.node.swap, None);
    assert_eq!(state.node.backend, "cpu");
    assert!(state
        .panes
        .log
        .lines
        .back()
        .unwrap()
        .text
        .contains("refused, keeping `cpu`: REJECTED: failed case `case 3`: bits differ"));

    let typed: Vec<Key> =
        "/x/p.so".chars().map(Key::Char).chain([Key::Backspace, Key::Char('o'), Key::Enter]).collect();
    let mut all = vec![Key::Char('w'), Key::Char('p')];
    all.extend(typed);
    assert_eq!(keys(&mut state, &all), vec![Effect::Swap("/x/p.so".into())]);
    report(&mut state, Report::Swap(SwapProgress::Staged { backend: "mine".into(), verdict: VERDICT }), 41.0);
    assert!(state.node.swap.as_deref().unwrap().contains("next step"));
    let change = BackendChange { backend: "mine".into(), verdict: VERDICT, step: 122 };
    report(&mut state, Report::BackendSwapped(change), 42.0);
    assert_eq!(state.node.swap, None);
    assert_eq!(state.node.backend, "mine");
    assert_eq!(state.node.peers[&1].backend.as_deref(), Some("mine"));
}

#[test]
fn save_and_broadcast() {
    let mut idle = fresh();
    connected(&mut idle);
    assert!(keys(&mut idle, &[Key::Char('c'), Key::Char('b')]).is_empty(), "no run: nothing to save or restore");
    let mut state = running();
    let save = keys(&mut state, &[Key::Char('c')]);
    assert_eq!(save, vec![Effect::Mesh(Command::SaveCheckpoint(CheckpointTarget::InDir("checkpoints".into())))]);
    // `b` offers the selected (latest) checkpoint; Up selects the older one.
    keys(&mut state, &[Key::Char('b'), Key::Char('n'), Key::Up, Key::Enter]);
    let Some(Modal::ConfirmBroadcast(CheckpointRow { path, step, .. })) = state.modal.clone() else {
        panic!("expected the broadcast confirmation, got {:?}", state.modal)
    };
    assert_eq!((path.to_str(), step), (Some("checkpoints/node1-step000060.ckpt"), 60));
    assert_eq!(keys(&mut state, &[Key::Char('y')]), vec![Effect::Broadcast(path)]);
}

#[test]
fn rates_hashes_and_the_guard() {
    let mut state = running();
    // 120 steps at 4 steps/s; the rate window keeps the last 10 s.
    let rate = state.panes.health.steps_per_second().unwrap();
    assert_eq!(rate, 4.0);
    let run = RunConfig::DEFAULT;
    assert_eq!(
        state.panes.health.tokens_per_second(&state.node).unwrap(),
        4.0 * (run.batch * run.model.context * 3) as f64
    );
    // In `outer:20` a step of the session is 20 optimizer steps on every member.
    let outer = running_outer();
    assert_eq!(
        outer.panes.health.tokens_per_second(&outer.node).unwrap(),
        4.0 * (20 * run.batch * run.model.context * 3) as f64
    );
    assert_eq!((state.panes.health.sent_bytes, state.panes.health.utilization), (7_010_000, 0.180 / 0.245));
    assert!(state.node.peers.values().all(|p| p.agreed_at == Some(120)));
    assert_eq!(state.node.peers[&3].repairs, 1);
    let failure = GuardFailure { step: 121, weight_mismatch: vec![3], probe_mismatch: vec![2] };
    report(&mut state, Report::Session(Event::GuardStopped(failure)), 33.0);
    assert!(state.node.peers[&3].weight_mismatch && state.node.peers[&2].probe_mismatch);
    assert!(matches!(state.node.run_state, RunState::Stopped(_)));
    // A stopped run no longer asks before quitting.
    assert_eq!(keys(&mut state, &[Key::Char('q')]), vec![Effect::Quit]);
}

#[test]
fn a_checkpoint_loaded_by_path_is_listed_and_offered_for_broadcast() {
    let mut state = running();
    let mut typed = vec![Key::Char('l')];
    typed.extend("/srv/x.ckptt".chars().map(Key::Char));
    typed.extend([Key::Backspace, Key::Enter]);
    assert_eq!(keys(&mut state, &typed), vec![Effect::Inspect("/srv/x.ckpt".into())]);
    update(&mut state, Action::CheckpointLoaded(Err("/srv/x.ckpt: truncated".into())));
    assert!(state.panes.log.lines.back().unwrap().text.contains("cannot load: /srv/x.ckpt: truncated"));
    assert_eq!(state.modal, None);
    let row = CheckpointRow { path: "/srv/x.ckpt".into(), step: 7, whash: 0x1234_5678 };
    update(&mut state, Action::CheckpointLoaded(Ok(row.clone())));
    assert_eq!(state.modal, Some(Modal::ConfirmBroadcast(row.clone())));
    assert_eq!(state.panes.checkpoints.rows.last(), Some(&row));
    assert_eq!(keys(&mut state, &[Key::Char('y')]), vec![Effect::Broadcast(row.path)]);
}

#[test]
fn checkpoint_files_in_the_directory_are_listed_by_step_with_their_hashes() {
    use lockstep_node::checkpoint;
    use lockstep_node::config::ModelConfig;
    use lockstep_node::trainer::Trainer;
    let dir = std::env::temp_dir().join(format!("lockstep-scan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tiny = RunConfig {
        model: ModelConfig { width: 32, context: 32, layers: 1, heads: 2 },
        batch: 2,
        ..RunConfig::DEFAULT
    };
    let gemm = Box::new(lockstep_node::gemm::FloatGemm::new(1));
    let mut trainer = Trainer::new(tiny, gemm, Box::new(lockstep_node::data::CorpusSource::builtin(1))).unwrap();
    let first = trainer.state().unwrap();
    trainer.step().unwrap();
    let second = trainer.state().unwrap();
    // Names in the opposite order to the steps; a damaged file and another file are skipped.
    checkpoint::save(&dir.join("a.ckpt"), &second).unwrap();
    checkpoint::save(&dir.join("b.ckpt"), &first).unwrap();
    std::fs::write(dir.join("damaged.ckpt"), b"LOCKSTEP but not much else").unwrap();
    std::fs::write(dir.join("notes.txt"), b"not a checkpoint").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    super::find_checkpoints(tx, dir.clone());
    let found = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("the scan answers");
    let Action::CheckpointsFound(rows) = found else { panic!("{found:?}") };
    let row = |name: &str, state: &lockstep_node::trainer::TrainState| CheckpointRow {
        path: dir.join(name),
        step: state.step,
        whash: lockstep_node::params::weight_hash(&state.weights),
    };
    assert_eq!(rows, vec![row("b.ckpt", &first), row("a.ckpt", &second)]);
    assert_eq!((first.step, second.step), (0, 1));
    assert_ne!(rows[0].whash, rows[1].whash, "each file's own weights are hashed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_backends_pane_puts_name_verdict_and_device_kind_first_and_cuts_nothing() {
    let mut state = running();
    state.focus = Pane::Backends;
    let screen = draw(&state, 120, 40);
    // The whole adapter description does not fit in the pane: the pane shows the verdict and
    // the device's kind, each whole; the description is in the swap dialog.
    for expected in [
        "*cpu   admitted 40/40  cpu",
        "  lut   admitted 40/40  software gpu",
        "  dp4a  n/a: no GPU adapter with an integer dot product",
    ] {
        assert!(screen.contains(expected), "{expected:?} is not on the screen:\n{screen}");
    }
    assert!(!screen.contains("llvmpipe"), "the adapter's name belongs to the swap dialog:\n{screen}");
    keys(&mut state, &[Key::Char('w')]);
    let dialog = draw(&state, 120, 40);
    assert!(dialog.contains("llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu, Mesa 22.3.6"), "{dialog}");
}

#[test]
fn repeated_log_lines_are_counted_not_repeated() {
    let mut state = running();
    let before = state.panes.log.lines.len();
    // A slow leader: each of two peers asks for a repair every two seconds.
    for round in 0..10 {
        for from in [2, 3] {
            let why = Ignored::RepairNotHeld;
            report(&mut state, Report::Session(Event::Ignored { from, why }), 40.0 + f64::from(round) * 2.0);
        }
    }
    assert_eq!(state.panes.log.lines.len(), before + 2, "{:#?}", state.panes.log.lines);
    let last: Vec<String> = state.panes.log.lines.iter().rev().take(2).map(ToString::to_string).collect();
    assert_eq!(
        last,
        [
            "00:58 ignored from node 3: a repair request for a contribution this node does not hold (×10)",
            "00:58 ignored from node 2: a repair request for a contribution this node does not hold (×10)",
        ]
    );
    // Something else in between is kept in order; a repeat after it is counted again.
    update(&mut state, Action::Log("the operator says hello".into()));
    report(&mut state, Report::Session(Event::Ignored { from: 2, why: Ignored::RepairNotHeld }), 80.0);
    let last: Vec<String> = state.panes.log.lines.iter().rev().take(3).map(|l| l.text.clone()).collect();
    assert_eq!(last[1], "the operator says hello");
    assert_eq!(state.panes.log.lines.back().map(|l| l.count), Some(11));
}

#[test]
fn the_leader_removes_a_member_after_naming_it_and_confirming() {
    let mut state = running();
    // Typed, checked against the roster, then confirmed.
    assert!(keys(&mut state, &[Key::Char('k'), Key::Char('9'), Key::Enter]).is_empty());
    assert_eq!(state.modal, None);
    assert!(state.panes.log.lines.back().unwrap().text.contains("no other member is node 9"));
    assert!(keys(&mut state, &[Key::Char('k'), Key::Char('3'), Key::Enter]).is_empty());
    assert_eq!(state.modal, Some(Modal::ConfirmKick(3)));
    assert!(keys(&mut state, &[Key::Char('n')]).is_empty(), "n keeps it");
    let effects = keys(&mut state, &[Key::Char('k'), Key::Char('3'), Key::Enter, Key::Char('y')]);
    assert_eq!(effects, vec![Effect::Mesh(Command::Kick { peer: 3, why: "the console's operator removed it".into() })]);
    // A follower's console says who can.
    let mut follower = fresh();
    report(&mut follower, Report::Connected { id: 2, members: vec![1, 2], group: "room demo".into(), host: 1 }, 0.5);
    assert!(keys(&mut follower, &[Key::Char('k')]).is_empty());
    assert_eq!(follower.modal, None);
}

/// Elastic windows: a member whose windows keep ending early is told once, counted, not once
/// per outer step.
#[test]
fn a_member_behind_in_elastic_windows_is_told_once_counted() {
    let mut state = running_outer();
    let before = state.panes.log.lines.len();
    for step in 1..=5 {
        report(&mut state, Report::Session(Event::Behind { step, steps: 7, of: 20 }), 30.0 + f64::from(step) * 20.0);
    }
    assert_eq!(state.panes.log.lines.len(), before + 1, "{:#?}", state.panes.log.lines);
    assert_eq!(
        state.panes.log.lines.back().unwrap().to_string(),
        "02:10 elastic windows: this node's window ended after 7 of 20 inner steps (a faster member finished first) (×5)"
    );
}

/// The step-health pane says what this node's audits did: how many contributions it recomputed
/// and found right, how long the last step's audits took, and loudly any that were wrong; the
/// log names a verdict's member and why.
#[test]
fn step_health_shows_the_audits_and_the_log_the_verdict() {
    use lockstep_node::session::AuditStats;
    use lockstep_node::wire::{AuditVerdict, Evidence};
    let mut state = running();
    let audits = AuditStats {
        audited: 12,
        matched: 12,
        skipped: 3,
        prefetched: 0,
        derived: 0,
        accused: 0,
        linked: 0,
        ..AuditStats::default()
    };
    let timing = StepTiming { compute: 0.1, audit_seconds: 0.042, audits, ..StepTiming::default() };
    report(&mut state, Report::Applied { step: 102, whash: 1, timing }, 50.0);
    let shown = draw(&state, 120, 40);
    assert!(shown.contains("sync every-step none  audits 12 ok 42ms"), "{shown}");
    let audits = AuditStats {
        audited: 13,
        matched: 12,
        skipped: 3,
        prefetched: 0,
        derived: 0,
        accused: 1,
        linked: 0,
        ..AuditStats::default()
    };
    report(&mut state, Report::Applied { step: 103, whash: 1, timing: StepTiming { audits, ..timing } }, 51.0);
    assert!(draw(&state, 120, 40).contains("audits 12 ok, 1 WRONG 42ms"));
    // Packed runs: the links checked (a member's next contribution named what its last left).
    let audits = AuditStats { linked: 9, ..audits };
    report(&mut state, Report::Applied { step: 104, whash: 1, timing: StepTiming { audits, ..timing } }, 51.5);
    assert!(draw(&state, 120, 40).contains("audits 12 ok, 1 WRONG, 9 linked 42ms"));
    let evidence = Evidence::Word { word: 3, expected: 0x3f80_0000, claimed: 0x3f80_20c5 };
    let verdict = AuditVerdict { step: 101, target: 3, found_by: 2, evidence };
    report(&mut state, Report::Session(Event::Verdict(verdict)), 52.0);
    let line = state.panes.log.lines.back().map(ToString::to_string).unwrap_or_default();
    assert!(
        line.contains("VERDICT: an audit found node 3's contribution to step 101 wrong (found by node 2): value 2 of its contribution: the definition gives 0x3f800000 (1), it sent 0x3f8020c5"),
        "{line}"
    );
}
