//! The roster: every member with its backend, gate verdict, state, hash agreement, link.

use lockstep_node::verdict::Verdict;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Cell, Row, Table};
use ratatui::Frame;

use super::Pane;
use crate::console::node::{Link, Node, PeerRow, Role};
use crate::console::text::human_bytes;

/// The roster owns nothing: it shows [`Node::peers`].
#[derive(Clone, Debug, Default)]
pub struct Roster;

fn peer_state(node: &Node, id: u64, row: &PeerRow) -> &'static str {
    match (row.link, row.role) {
        (Link::Left, _) => "left",
        (Link::Joining, _) => "joining",
        (Link::Open, Role::Voter) if node.leader == Some(id) => "leader",
        (Link::Open, Role::Voter) => "voter",
        (Link::Open, Role::Learner) => "learner",
        (Link::Open, Role::Observer) => "observer",
        (Link::Open, Role::None) => "open",
    }
}

impl Pane for Roster {
    fn title(&self, node: &Node) -> String {
        format!("Roster ({})", node.group)
    }

    fn render(&self, node: &Node, _focused: bool, frame: &mut Frame<'_>, area: Rect) {
        let header = Row::new(["node", "backend", "gate", "state", "hashes", "rtt", "in", "out", "rep"])
            .style(Style::new().add_modifier(Modifier::BOLD));
        let rows: Vec<Row<'_>> = node
            .peers
            .iter()
            .map(|(&id, row)| {
                let me = node.me == Some(id);
                let hashes = if row.weight_mismatch {
                    "WEIGHTS!".to_string()
                } else if row.probe_mismatch {
                    "PROBE!".to_string()
                } else {
                    row.agreed_at.map_or_else(|| "-".to_string(), |s| format!("ok@{s}"))
                };
                let rtt =
                    if me { "-".to_string() } else { row.rtt_ms.map_or_else(|| "-".into(), |r| format!("{r:.1}ms")) };
                let (bytes_in, bytes_out) = if me {
                    ("-".to_string(), "-".to_string())
                } else {
                    (human_bytes(row.bytes_in), human_bytes(row.bytes_out))
                };
                Row::new(vec![
                    Cell::from(if me { format!("{id} me") } else { id.to_string() }),
                    Cell::from(row.backend.clone().unwrap_or_else(|| "?".into())),
                    Cell::from(row.verdict.as_ref().map_or("-", Verdict::word)),
                    Cell::from(peer_state(node, id, row)),
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
}
