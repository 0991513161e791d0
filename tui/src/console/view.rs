//! Rendering: reads [`State`], draws a frame, changes nothing.
//!
//! The header, the footer and the dialogs are drawn here; the panes draw themselves
//! (`panes/`), placed by [`LAYOUTS`]: the first layout whose minimum size the terminal has.
//! Below 110×34 the roster and step health are always shown and the pane `Tab` selects (room,
//! checkpoints, backends, log) shares the lower half; from 110×34 up every pane has a place. The
//! focused pane has a double border and a `>` in its title, so focus is visible without colour.

use lockstep_node::verdict::Verdict;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Clear, Paragraph};
use ratatui::Frame;

use super::node::RunState;
use super::panes::PaneId;
use super::state::{Modal, State};
use super::text::wrap;

/// Where the panes go on a screen of at least `min_width × min_height`.
pub struct ScreenLayout {
    pub min_width: u16,
    pub min_height: u16,
    /// The panes and their areas within the body (the screen less header and footer).
    pub place: fn(&State, Rect) -> Vec<(PaneId, Rect)>,
}

/// The layouts, largest first: the first one the terminal fits is used.
pub const LAYOUTS: &[ScreenLayout] = &[
    ScreenLayout { min_width: 110, min_height: 34, place: every_pane },
    ScreenLayout { min_width: 0, min_height: 0, place: focused_detail },
];

/// Every pane has a place: room and backends on top, the roster, health beside checkpoints,
/// the log below.
fn every_pane(state: &State, body: Rect) -> Vec<(PaneId, Rect)> {
    let roster_height = (state.node.peers.len() as u16 + 3).clamp(5, 10);
    let [top, roster, middle, log] = Layout::vertical([
        Constraint::Length(7),
        Constraint::Length(roster_height),
        Constraint::Length(13),
        Constraint::Min(4),
    ])
    .areas(body);
    let [room, backends] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(top);
    let [health, checkpoints] =
        Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(middle);
    vec![
        (PaneId::Room, room),
        (PaneId::Backends, backends),
        (PaneId::Roster, roster),
        (PaneId::Health, health),
        (PaneId::Checkpoints, checkpoints),
        (PaneId::Log, log),
    ]
}

/// The roster and health always; the focused other pane (or the log) beside health.
fn focused_detail(state: &State, body: Rect) -> Vec<(PaneId, Rect)> {
    let roster_height = (state.node.peers.len() as u16 + 3).clamp(4, 8);
    let [roster, lower] = Layout::vertical([Constraint::Length(roster_height), Constraint::Min(0)]).areas(body);
    let [health, detail] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(lower);
    let shown = match state.focus {
        PaneId::Roster | PaneId::Health => PaneId::Log,
        other => other,
    };
    vec![(PaneId::Roster, roster), (PaneId::Health, health), (shown, detail)]
}

pub fn render(state: &State, frame: &mut Frame<'_>) {
    let area = frame.area();
    let [header, body, footer] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(0), Constraint::Length(1)]).areas(area);
    frame
        .render_widget(Paragraph::new(header_line(state)).style(Style::new().add_modifier(Modifier::REVERSED)), header);
    frame.render_widget(Paragraph::new(footer_line(state)), footer);
    let layout = LAYOUTS
        .iter()
        .find(|l| area.width >= l.min_width && area.height >= l.min_height)
        .expect("the last layout fits any size");
    for (pane, rect) in (layout.place)(state, body) {
        state.panes.render(pane, &state.node, state.focus, frame, rect);
    }
    if let Some(modal) = &state.modal {
        render_modal(state, modal, frame, area);
    }
}

fn run_label(state: &State) -> String {
    match &state.node.run_state {
        RunState::Idle => "idle".into(),
        RunState::Starting => "starting".into(),
        RunState::Running => "RUNNING".into(),
        RunState::Finished => "finished".into(),
        RunState::NoMajority(_) => "NO MAJORITY".into(),
        RunState::Stopped(lockstep_node::session::Stop::Guard(_)) => "STOPPED by the guard".into(),
        RunState::Stopped(_) => "STOPPED".into(),
    }
}

fn header_line(state: &State) -> Line<'static> {
    let node = &state.node;
    let me = node.me.map_or_else(|| "-".to_string(), |id| id.to_string());
    let mut roles = Vec::new();
    if node.is_host() {
        roles.push("host");
    }
    if node.is_leader() {
        roles.push("leader");
    }
    let roles = if roles.is_empty() { String::new() } else { format!(" ({})", roles.join(", ")) };
    let steps = node.run.as_ref().map_or_else(|| "-".to_string(), |r| format!("{}/{}", node.step, r.syncs()));
    let signal = if node.signal_lost { " | NO SIGNALING" } else { "" };
    Line::from(format!(
        " lockstep | {} | node {me}{roles} | {} | step {steps} | {}{signal}",
        node.group,
        node.backend,
        run_label(state)
    ))
}

fn footer_line(state: &State) -> Line<'static> {
    if let Some(swap) = &state.node.swap {
        return Line::from(format!(" swap: {swap}"));
    }
    let pending = state.panes.room.pending.len();
    let waiting = if pending == 0 { String::new() } else { format!("a approve({pending}) ") };
    Line::from(format!(" {waiting}s start  w swap  c save  b broadcast  Tab pane  ? help  q quit"))
}

fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let width = width.min(area.width);
    let height = height.min(area.height);
    Rect { x: area.x + (area.width - width) / 2, y: area.y + (area.height - height) / 2, width, height }
}

fn render_modal(state: &State, modal: &Modal, frame: &mut Frame<'_>, area: Rect) {
    let (title, lines): (&str, Vec<Line<'static>>) = match modal {
        Modal::Help => (
            "Help",
            vec![
                Line::from("Tab / Shift-Tab  move between panes"),
                Line::from("Up / Down        select in Checkpoints, Backends"),
                Line::from("Enter            act on the selection"),
                Line::from("s                start a run (you lead it)"),
                Line::from("a                review join requests"),
                Line::from("w                hot-swap the backend (gated first)"),
                Line::from("c                save a checkpoint"),
                Line::from("b                broadcast a checkpoint to all"),
                Line::from("l                load a checkpoint file by path"),
                Line::from("k                remove a member (leader, asks)"),
                Line::from("?                this help"),
                Line::from("q                quit (asks during a run)"),
                Line::from(""),
                Line::from("Esc closes this window."),
            ],
        ),
        Modal::Approve { peer, address } => (
            "Join request",
            vec![
                Line::from(format!("Node {peer} at {address}")),
                Line::from(format!("asks to join {}.", state.node.group)),
                Line::from(""),
                Line::from("y approve   n deny   Esc later"),
            ],
        ),
        Modal::Swap { selected, typing } => {
            let mut lines = vec![Line::from(format!("Now: {}", state.node.backend)), Line::from("")];
            for (i, row) in state.panes.backends.rows.iter().enumerate() {
                let marker = if i == *selected && typing.is_none() { ">" } else { " " };
                let verdict = row.verdict.as_ref().map_or_else(|| "checking…".to_string(), Verdict::short);
                lines.push(Line::from(format!("{marker} {:<5} {verdict}", row.name)));
                // The full description, wrapped to the screen (the pane shows only its kind).
                let room = (area.width as usize).saturating_sub(14).max(20);
                for piece in wrap(&row.device, room).into_iter().filter(|p| !p.trim().is_empty()) {
                    lines.push(Line::from(format!("        {}", piece.trim_start())));
                }
            }
            lines.push(Line::from(""));
            match typing {
                Some(path) => {
                    lines.push(Line::from(vec![Span::raw("path: "), Span::raw(path.clone()), Span::raw("_")]));
                    lines.push(Line::from("Enter gate and swap   Esc back"));
                }
                None => lines.push(Line::from("Enter gate and swap   p type a path   Esc cancel")),
            }
            ("Swap backend", lines)
        }
        Modal::ConfirmBroadcast(row) => (
            "Broadcast checkpoint",
            vec![
                Line::from(format!("Restore every node from {}", row.path.display())),
                Line::from(format!("(step {}, whash {:#010x})?", row.step, row.whash)),
                Line::from(""),
                Line::from("y broadcast   n cancel"),
            ],
        ),
        Modal::LoadPath(path) => (
            "Load a checkpoint",
            vec![
                Line::from("Path of a checkpoint file to broadcast:"),
                Line::from(format!("{path}_")),
                Line::from(""),
                Line::from("Enter load and confirm   Esc cancel"),
            ],
        ),
        Modal::KickPeer(typed) => (
            "Remove a member",
            vec![
                Line::from("Id of the node to take out of the run:"),
                Line::from(format!("{typed}_")),
                Line::from(""),
                Line::from("Enter choose   Esc cancel"),
            ],
        ),
        Modal::ConfirmKick(peer) => (
            "Remove a member",
            vec![
                Line::from(format!("Take node {peer} out of the run?")),
                Line::from("It is told why and stays out."),
                Line::from(""),
                Line::from("y remove   n cancel"),
            ],
        ),
        Modal::ConfirmStart => {
            let s = &state.node.start_settings;
            (
                "Start a run",
                vec![
                    Line::from(format!(
                        "c={} t={} layers={} heads={}",
                        s.model.width, s.model.context, s.model.layers, s.model.heads
                    )),
                    Line::from(format!("batch {} steps {} lr {} seed {}", s.batch, s.steps, s.lr, s.seed)),
                    Line::from(format!("sync {}", s.sync)),
                    Line::from("You lead it; every member joins."),
                    Line::from(""),
                    Line::from("y start   n cancel"),
                ],
            )
        }
        Modal::ConfirmQuit => (
            "Quit",
            vec![
                Line::from("A run is in progress."),
                Line::from("Leave the group?"),
                Line::from(""),
                Line::from("y quit   n stay"),
            ],
        ),
    };
    let width = lines.iter().map(|l| l.width() as u16).max().unwrap_or(20).max(title.len() as u16 + 4) + 4;
    let rect = centered(area, width, lines.len() as u16 + 2);
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().border_type(BorderType::Double).title(title)),
        rect,
    );
}
