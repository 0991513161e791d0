//! The console: a ratatui coordinator for one node, usable over SSH, without a mouse and
//! without colour.
//!
//! - `state.rs`: `State`, `Action`, `update` (the only mutator), `Effect`;
//! - `view.rs`: `render` (reads the state, draws);
//! - here: the terminal, the one keymap, and the loop that turns node reports and keys into
//!   actions and effects into node commands.
//!
//! **Architecture Invariant:** only this module renders; the node reports through
//! `lockstep_mesh::Report` on a channel and never touches the terminal.

mod key;
pub mod node;
pub mod panes;
pub mod state;
mod text;
pub mod view;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use anyhow::Context;
use lockstep_mesh::{Command, Report};
use lockstep_node::checkpoint;
use lockstep_node::config::RunConfig;
use ratatui::crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{self, EnterAlternateScreen, LeaveAlternateScreen};
use ratatui::prelude::CrosstermBackend;
use ratatui::Terminal;

use self::state::{update, Action, CheckpointRow, Effect, Key, State};
use crate::backend::Opening;
use crate::node_runtime::{prepare, read_checkpoint, MeshArgs, NodeHandle, Prepared, Sink};
use lockstep_node::verdict::Verdict;

/// The one keymap: terminal keys to console keys.
fn key_of(event: &TermEvent) -> Option<Key> {
    let TermEvent::Key(key) = event else { return None };
    if key.kind != KeyEventKind::Press {
        return None;
    }
    Some(match key.code {
        KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => Key::Char('q'),
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Tab => Key::Tab,
        KeyCode::BackTab => Key::BackTab,
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Backspace => Key::Backspace,
        _ => return None,
    })
}

/// Lists the checkpoint files in `dir` (those that decode, oldest step first) on a thread of
/// its own — each is read whole and hashed, which must not hold up the start — and sends them
/// as `Action::CheckpointsFound`.
pub fn find_checkpoints(actions: Sender<Action>, dir: PathBuf) {
    std::thread::spawn(move || {
        let Ok(entries) = std::fs::read_dir(&dir) else { return };
        let mut rows: Vec<CheckpointRow> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "ckpt"))
            .filter_map(|path| checkpoint_row(path).ok())
            .collect();
        rows.sort_by(|a, b| (a.step, &a.path).cmp(&(b.step, &b.path)));
        let _ = actions.send(Action::CheckpointsFound(rows));
    });
}

/// A checkpoint file's step and weight hash, or why it is not a checkpoint.
fn checkpoint_row(path: PathBuf) -> Result<CheckpointRow, String> {
    let state = checkpoint::load(&path, None).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(CheckpointRow { whash: lockstep_node::params::weight_hash(&state.weights), step: state.step, path })
}

/// Gates each built-in plugin but `in_use` (gated already at start-up) once, on a thread of
/// its own, so the Backends pane can show what a swap would get; software adapters count (a
/// swap may choose them).
pub fn survey_backends(actions: Sender<Action>, in_use: &str) {
    let in_use = in_use.to_string();
    std::thread::spawn(move || {
        for name in lockstep_backends::BUILTIN_BACKENDS.iter().copied().filter(|name| *name != in_use) {
            let (verdict, device) = match crate::backend::open_backend(name, 1, Opening::default()) {
                Ok((_, mut backend)) => {
                    let report = lockstep_backends::gate::run_gate(&mut backend, &mut |_| {});
                    (report.verdict(), backend.describe())
                }
                Err(e) => (Verdict::NotLoadable { why: format!("{e:#}") }, String::new()),
            };
            if actions.send(Action::BackendVerdict { name: name.to_string(), verdict, device }).is_err() {
                return;
            }
        }
    });
}

/// A sink that turns reports into actions stamped with the console's clock.
pub fn action_sink(actions: Sender<Action>, started: Instant) -> Sink {
    std::sync::Arc::new(move |report: Report| {
        let _ = actions.send(Action::Report(report, started.elapsed().as_secs_f64()));
    })
}

/// Carries out `update`'s effects; returns false on quit.
pub fn execute_effects(node: &NodeHandle, effects: Vec<Effect>, actions: &Sender<Action>) -> bool {
    let mut going = true;
    for effect in effects {
        match effect {
            Effect::Mesh(command) => node.send(command),
            Effect::Swap(name) => node.swap(name),
            Effect::Broadcast(path) => match read_checkpoint(&path) {
                Ok(bytes) => node.send(Command::PushCheckpoint(bytes)),
                Err(e) => {
                    let _ = actions.send(Action::Log(format!("broadcast failed: {e:#}")));
                }
            },
            Effect::Inspect(path) => {
                let _ = actions.send(Action::CheckpointLoaded(checkpoint_row(path)));
            }
            Effect::Quit => going = false,
        }
    }
    going
}

/// Restores the terminal (also from the panic hook).
fn restore_terminal() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(std::io::stdout(), LeaveAlternateScreen);
}

/// While the console draws, whatever libraries write to stderr (Vulkan drivers do) would land
/// on the screen: it goes to a log file instead, and the original stderr comes back after.
#[cfg(unix)]
struct StderrToFile {
    saved: Option<std::ffi::c_int>,
}

#[cfg(unix)]
impl StderrToFile {
    fn new(path: &Path) -> (StderrToFile, Option<String>) {
        extern "C" {
            fn dup(fd: std::ffi::c_int) -> std::ffi::c_int;
            fn dup2(from: std::ffi::c_int, to: std::ffi::c_int) -> std::ffi::c_int;
        }
        use std::os::fd::AsRawFd;
        let Ok(file) = std::fs::OpenOptions::new().create(true).append(true).open(path) else {
            return (StderrToFile { saved: None }, None);
        };
        // SAFETY: dup/dup2 on valid descriptors (2 and an open file); the file's descriptor is
        // duplicated onto 2 before `file` closes its own.
        let saved = unsafe {
            let saved = dup(2);
            (saved >= 0 && dup2(file.as_raw_fd(), 2) >= 0).then_some(saved)
        };
        let note = saved.map(|_| format!("stderr goes to {} while the console runs", path.display()));
        (StderrToFile { saved }, note)
    }
}

#[cfg(unix)]
impl Drop for StderrToFile {
    fn drop(&mut self) {
        extern "C" {
            fn dup2(from: std::ffi::c_int, to: std::ffi::c_int) -> std::ffi::c_int;
            fn close(fd: std::ffi::c_int) -> std::ffi::c_int;
        }
        if let Some(saved) = self.saved {
            // SAFETY: `saved` is the descriptor `dup` returned for the original stderr.
            unsafe {
                dup2(saved, 2);
                close(saved);
            }
        }
    }
}

/// Runs the console on a started node until `q`.
/// `started`: the clock the node's reports are stamped with (see [`action_sink`]).
pub fn run_console(
    node: NodeHandle,
    mut state: State,
    actions: (Sender<Action>, Receiver<Action>),
    started: Instant,
) -> anyhow::Result<lockstep_mesh::Ended> {
    let (tx, rx) = actions;
    let log_path = std::env::temp_dir().join(format!("lockstep-console-{}.log", std::process::id()));
    let (stderr, note) = StderrToFile::new(&log_path);
    if let Some(note) = note {
        let _ = tx.send(Action::Log(note));
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore_terminal();
        previous(info);
    }));
    terminal::enable_raw_mode().context("the console needs a terminal (or use --headless)")?;
    execute!(std::io::stdout(), EnterAlternateScreen).context("switching to the alternate screen")?;
    let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout())).context("opening the terminal")?;
    let result = (|| -> anyhow::Result<()> {
        let mut last_tick = Instant::now();
        let mut mesh_ended = false;
        loop {
            terminal.draw(|frame| view::render(&state, frame)).context("drawing")?;
            let mut batch = Vec::new();
            if event::poll(Duration::from_millis(100)).context("reading the terminal")? {
                if let Some(key) = key_of(&event::read().context("reading the terminal")?) {
                    batch.push(Action::Key(key));
                }
            }
            batch.extend(rx.try_iter());
            if last_tick.elapsed() >= Duration::from_secs(1) {
                last_tick = Instant::now();
                batch.push(Action::Tick(started.elapsed().as_secs_f64()));
                if node.finished() && !mesh_ended {
                    mesh_ended = true;
                    batch.push(Action::Log("the node left the group (see above); q quits".into()));
                }
            }
            for action in batch {
                let effects = update(&mut state, action);
                if !execute_effects(&node, effects, &tx) {
                    return Ok(());
                }
            }
        }
    })();
    restore_terminal();
    drop(stderr);
    let ended = node.quit()?;
    result.map(|()| ended)
}

/// Elsewhere stderr stays where it is.
#[cfg(not(unix))]
struct StderrToFile;

#[cfg(not(unix))]
impl StderrToFile {
    fn new(_path: &Path) -> (StderrToFile, Option<String>) {
        (StderrToFile, None)
    }
}

/// `lockstep node` without `--headless`.
pub fn run_node(signal: &str, mesh: &MeshArgs, defaults: RunConfig) -> anyhow::Result<ExitCode> {
    let mut print = |line: String| println!("{line}");
    let Prepared { config, replica, device } = prepare(signal, mesh, Opening::default(), &mut print)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let state = State::new(&config.backend, &config.verdict, &device, defaults, mesh.ckpt_dir.clone());
    find_checkpoints(tx.clone(), mesh.ckpt_dir.clone());
    survey_backends(tx.clone(), &config.backend);
    let started = Instant::now();
    let node = NodeHandle::start(config, replica, mesh.threads, action_sink(tx.clone(), started))?;
    let ended = run_console(node, state, (tx, rx), started)?;
    Ok(crate::node_runtime::exit_status(&ended))
}
