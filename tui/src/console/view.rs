//! Rendering: reads [`State`], draws a frame, changes nothing.
//!
//! Two layouts: below 110×34 the roster and step health are always shown and the pane `Tab`
//! selects (room, checkpoints, backends, log) shares the lower half; from 110×34 up every pane
//! has a place. The focused pane has a double border and a `>` in its title, so focus is
//! visible without colour.

use lockstep_node::verdict::Verdict;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, BorderType, Cell, Chart, Clear, Dataset, GraphType, Paragraph, Row, Table, Wrap};
use ratatui::Frame;

use super::state::{Link, Modal, Pane, PeerRow, RunState, State};

pub fn render(state: &State, frame: &mut Frame<'_>) {
    let area = frame.area();
    let [header, body, footer] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(0), Constraint::Length(1)]).areas(area);
    frame
        .render_widget(Paragraph::new(header_line(state)).style(Style::new().add_modifier(Modifier::REVERSED)), header);
    frame.render_widget(Paragraph::new(footer_line(state)), footer);
    if area.width >= 110 && area.height >= 34 {
        let roster_height = (state.peers.len() as u16 + 3).clamp(5, 10);
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
        pane(state, frame, Pane::Room, room);
        pane(state, frame, Pane::Backends, backends);
        pane(state, frame, Pane::Roster, roster);
        pane(state, frame, Pane::Health, health);
        pane(state, frame, Pane::Checkpoints, checkpoints);
        pane(state, frame, Pane::Log, log);
    } else {
        let roster_height = (state.peers.len() as u16 + 3).clamp(4, 8);
        let [roster, lower] = Layout::vertical([Constraint::Length(roster_height), Constraint::Min(0)]).areas(body);
        let [health, detail] =
            Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(lower);
        pane(state, frame, Pane::Roster, roster);
        pane(state, frame, Pane::Health, health);
        let shown = match state.focus {
            Pane::Roster | Pane::Health => Pane::Log,
            other => other,
        };
        pane(state, frame, shown, detail);
    }
    if let Some(modal) = &state.modal {
        render_modal(state, modal, frame, area);
    }
}

fn block(state: &State, which: Pane) -> Block<'static> {
    let focused = state.focus == which;
    let name = match which {
        Pane::Roster => format!("Roster ({})", state.group),
        other => other.title().to_string(),
    };
    let title = if focused { format!(">{name}<") } else { name };
    let block = Block::bordered().title(title);
    if focused {
        block.border_type(BorderType::Double)
    } else {
        block
    }
}

fn pane(state: &State, frame: &mut Frame<'_>, which: Pane, area: Rect) {
    let block = block(state, which);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    match which {
        Pane::Roster => roster(state, frame, inner),
        Pane::Health => health(state, frame, inner),
        Pane::Room => frame.render_widget(Paragraph::new(room_lines(state)).wrap(Wrap { trim: true }), inner),
        Pane::Checkpoints => frame.render_widget(Paragraph::new(checkpoint_lines(state)), inner),
        Pane::Backends => frame.render_widget(Paragraph::new(backend_lines(state)), inner),
        Pane::Log => {
            // Newest at the bottom; long lines wrap (indented) rather than being cut.
            let (width, height) = (inner.width as usize, inner.height as usize);
            let mut rows: Vec<String> = Vec::new();
            for line in state.log.iter().rev().map(ToString::to_string) {
                let mut wrapped = wrap(&line, width);
                wrapped.reverse();
                rows.extend(wrapped);
                if rows.len() >= height {
                    break;
                }
            }
            rows.truncate(height);
            rows.reverse();
            frame.render_widget(Paragraph::new(rows.into_iter().map(Line::from).collect::<Vec<_>>()), inner);
        }
    }
}

/// `text` cut into rows of at most `width` characters, continuation rows indented by two.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if width <= 4 || chars.len() <= width {
        return vec![text.to_string()];
    }
    let mut rows = vec![chars[..width].iter().collect::<String>()];
    for chunk in chars[width..].chunks(width - 2) {
        rows.push(format!("  {}", chunk.iter().collect::<String>()));
    }
    rows
}

/// `24.6k`, `980`.
fn human_count(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if value >= 1e4 {
        format!("{:.1}k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

fn run_label(state: &State) -> String {
    match &state.run_state {
        RunState::Idle => "idle".into(),
        RunState::Starting => "starting".into(),
        RunState::Running => "RUNNING".into(),
        RunState::Finished => "finished".into(),
        RunState::Stopped(_) => "STOPPED by the guard".into(),
    }
}

fn header_line(state: &State) -> Line<'static> {
    let me = state.me.map_or_else(|| "-".to_string(), |id| id.to_string());
    let mut roles = Vec::new();
    if state.is_host() {
        roles.push("host");
    }
    if state.is_leader() {
        roles.push("leader");
    }
    let roles = if roles.is_empty() { String::new() } else { format!(" ({})", roles.join(", ")) };
    let steps = state.run.as_ref().map_or_else(|| "-".to_string(), |r| format!("{}/{}", state.step, r.syncs()));
    let signal = if state.signal_lost { " | NO SIGNALING" } else { "" };
    Line::from(format!(
        " lockstep | {} | node {me}{roles} | {} | step {steps} | {}{signal}",
        state.group,
        state.backend,
        run_label(state)
    ))
}

fn footer_line(state: &State) -> Line<'static> {
    if let Some(swap) = &state.swap {
        return Line::from(format!(" swap: {swap}"));
    }
    let waiting = if state.pending.is_empty() { String::new() } else { format!("a approve({}) ", state.pending.len()) };
    Line::from(format!(" {waiting}s start  w swap  c save  b broadcast  Tab pane  ? help  q quit"))
}

/// `12.3M`, `980k`, `17`.
pub fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.1}G", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1}M", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.0}k", b / 1e3)
    } else {
        format!("{bytes}")
    }
}

/// What kind of device a plugin's description names, in a word or two: device plugins
/// describe their adapter with wgpu's device type (`Cpu` for a software rasterizer such as
/// lavapipe), the CPU mirror names its instruction path.
fn device_kind(device: &str) -> &'static str {
    if device.contains(", Cpu,") {
        "software gpu"
    } else if device.contains(" path, ") {
        "cpu"
    } else if device.contains("tile ") {
        "gpu"
    } else {
        ""
    }
}

fn peer_state(state: &State, id: u64, row: &PeerRow) -> &'static str {
    match row.link {
        Link::Left => "left",
        Link::Joining => "joining",
        Link::Open if state.leader == Some(id) && row.in_roster => "leader",
        Link::Open if row.in_roster => "in step",
        Link::Open => "open",
    }
}

fn roster(state: &State, frame: &mut Frame<'_>, area: Rect) {
    let header = Row::new(["node", "backend", "gate", "state", "hashes", "rtt", "in", "out", "rep"])
        .style(Style::new().add_modifier(Modifier::BOLD));
    let rows: Vec<Row<'_>> = state
        .peers
        .iter()
        .map(|(&id, row)| {
            let me = state.me == Some(id);
            let hashes = if row.weight_mismatch {
                "WEIGHTS!".to_string()
            } else if row.probe_mismatch {
                "PROBE!".to_string()
            } else {
                row.agreed_at.map_or_else(|| "-".to_string(), |s| format!("ok@{s}"))
            };
            let rtt = if me { "-".to_string() } else { row.rtt_ms.map_or_else(|| "-".into(), |r| format!("{r:.1}ms")) };
            let (bytes_in, bytes_out) = if me {
                ("-".to_string(), "-".to_string())
            } else {
                (human_bytes(row.bytes_in), human_bytes(row.bytes_out))
            };
            Row::new(vec![
                Cell::from(if me { format!("{id} me") } else { id.to_string() }),
                Cell::from(row.backend.clone().unwrap_or_else(|| "?".into())),
                Cell::from(row.verdict.as_ref().map_or("-", Verdict::word)),
                Cell::from(peer_state(state, id, row)),
                Cell::from(hashes),
                Cell::from(rtt),
                Cell::from(bytes_in),
                Cell::from(bytes_out),
                Cell::from(row.repairs.to_string()),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(9),
        Constraint::Length(7),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(3),
    ];
    frame.render_widget(Table::new(rows, widths).header(header).column_spacing(1), area);
}

fn health(state: &State, frame: &mut Frame<'_>, area: Rect) {
    // A step of the session is a sync: `outer:H` counts outer steps.
    let steps = state
        .run
        .as_ref()
        .map_or_else(|| "no run".to_string(), |r| format!("{} {}/{}", r.sync.mode.sync_name(), state.step, r.syncs()));
    let sync = state.run.as_ref().map_or(state.start_settings.sync, |r| r.sync);
    let rate = state.steps_per_second().map_or_else(|| "-/s".into(), |r| format!("{r:.2}/s"));
    let tokens = state.tokens_per_second().map_or_else(|| "- tok/s".into(), |t| format!("{} tok/s", human_count(t)));
    let guard = match &state.run_state {
        RunState::Stopped(why) => format!("guard: STOPPED: {why}"),
        _ if state.step > 0 => format!("guard: ok, hashes agree at step {}", state.step),
        _ => "guard: waiting for the first step".to_string(),
    };
    let loss = match (state.losses.first(), state.losses.last()) {
        (Some(first), Some(last)) => format!("loss {:.4} (first {:.4})", last.1, first.1),
        _ => "loss -".to_string(),
    };
    let whash = state.whash.map_or_else(|| "-".to_string(), |w| format!("{w:#010x}"));
    let lines = vec![
        Line::from(format!("{steps}  {rate}  {tokens}")),
        Line::from(format!(
            "compute {:.0}ms {:.0}%  exchange {:.0}ms",
            state.compute_ms,
            state.utilization * 100.0,
            state.exchange_ms
        )),
        Line::from(format!("hash+guard {:.1}ms  sent {}/step", state.hash_guard_ms, human_bytes(state.sent_bytes))),
        Line::from(format!("sync {sync}")),
        Line::from(guard),
        Line::from(format!("{loss}  whash {whash}")),
    ];
    let [text, chart] = Layout::vertical([Constraint::Length(7), Constraint::Min(0)]).areas(area);
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), text);
    if chart.height >= 3 && state.losses.len() >= 2 {
        let (x0, x1) = (state.losses[0].0, state.losses[state.losses.len() - 1].0);
        let (lo, hi) = state.losses.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &(_, l)| (lo.min(l), hi.max(l)));
        let hi = if hi > lo { hi } else { lo + 1.0 };
        let dataset = Dataset::default().marker(Marker::Braille).graph_type(GraphType::Line).data(&state.losses);
        let widget = Chart::new(vec![dataset])
            .x_axis(Axis::default().bounds([x0, x1.max(x0 + 1.0)]).labels([format!("{x0:.0}"), format!("{x1:.0}")]))
            .y_axis(Axis::default().bounds([lo, hi]).labels([format!("{lo:.2}"), format!("{hi:.2}")]));
        frame.render_widget(widget, chart);
    }
}

fn room_lines(state: &State) -> Vec<Line<'static>> {
    let host = match state.host {
        Some(h) if state.me == Some(h) => format!("node {h} (this node)"),
        Some(h) => format!("node {h}"),
        None => "-".into(),
    };
    let members: Vec<String> =
        state.peers.iter().filter(|(_, r)| r.link != Link::Left).map(|(id, _)| id.to_string()).collect();
    let mut lines = vec![
        Line::from(format!("group: {}", state.group)),
        Line::from(format!("host: {host}")),
        Line::from(format!("members: {}", members.join(", "))),
    ];
    if state.waiting_for_host {
        lines.push(Line::from("waiting for the host's approval"));
    }
    if state.pending.is_empty() {
        lines.push(Line::from("no join requests"));
    }
    for (peer, address) in &state.pending {
        lines.push(Line::from(format!("waiting: node {peer} at {address} (a: review)")));
    }
    lines
}

fn checkpoint_lines(state: &State) -> Vec<Line<'static>> {
    let mut lines = vec![Line::from(format!("in {}  (c save, b broadcast, l load)", state.ckpt_dir.display()))];
    if state.checkpoints.is_empty() {
        lines.push(Line::from("none yet"));
    }
    for (i, row) in state.checkpoints.iter().enumerate() {
        let marker = if i == state.ckpt_selected { ">" } else { " " };
        let name = row.path.file_name().map_or_else(|| row.path.display().to_string(), |n| n.to_string_lossy().into());
        lines.push(Line::from(format!("{marker} {name}  step {}  {:#010x}", row.step, row.whash)));
    }
    lines
}

fn backend_lines(state: &State) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    for (i, row) in state.backends.iter().enumerate() {
        let marker = if i == state.backend_selected && state.focus == Pane::Backends { ">" } else { " " };
        let using = if row.name == state.backend { "*" } else { " " };
        // What matters first: name, verdict, device kind; the full description is in the
        // swap dialog.
        let verdict = row.verdict.as_ref().map_or_else(|| "checking…".to_string(), Verdict::short);
        let kind = device_kind(&row.device);
        lines.push(Line::from(format!("{marker}{using}{:<5} {verdict}  {kind}", row.name).trim_end().to_string()));
    }
    if !state.backends.iter().any(|b| b.name == state.backend) {
        lines.push(Line::from(format!("  in use: {}", state.backend)));
    }
    lines.push(Line::from(match &state.swap {
        Some(swap) => format!("swap: {swap}"),
        None => "* in use; w swaps (gated first)".to_string(),
    }));
    lines
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
                Line::from(format!("asks to join {}.", state.group)),
                Line::from(""),
                Line::from("y approve   n deny   Esc later"),
            ],
        ),
        Modal::Swap { selected, typing } => {
            let mut lines = vec![Line::from(format!("Now: {}", state.backend)), Line::from("")];
            for (i, row) in state.backends.iter().enumerate() {
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
            let s = &state.start_settings;
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
