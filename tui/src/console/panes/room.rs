//! The room: the group, its host, its members, and join requests waiting for approval.

use lockstep_node::wire::PeerId;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};
use ratatui::Frame;

use super::{Pane, PaneRequest};
use crate::console::key::Key;
use crate::console::node::{Link, Node};

#[derive(Clone, Debug, Default)]
pub struct Room {
    /// Join requests waiting for the host's answer: who, from where.
    pub pending: Vec<(PeerId, String)>,
    /// This node waits for a host's approval.
    pub waiting_for_host: bool,
}

impl Pane for Room {
    fn title(&self, _node: &Node) -> String {
        "Room".into()
    }

    fn on_key(&mut self, key: Key) -> Option<PaneRequest> {
        (key == Key::Enter).then_some(PaneRequest::ReviewRequests)
    }

    fn render(&self, node: &Node, _focused: bool, frame: &mut Frame<'_>, area: Rect) {
        let host = match node.host {
            Some(h) if node.me == Some(h) => format!("node {h} (this node)"),
            Some(h) => format!("node {h}"),
            None => "-".into(),
        };
        let members: Vec<String> =
            node.peers.iter().filter(|(_, r)| r.link != Link::Left).map(|(id, _)| id.to_string()).collect();
        let mut lines = vec![
            Line::from(format!("group: {}", node.group)),
            Line::from(format!("host: {host}")),
            Line::from(format!("members: {}", members.join(", "))),
        ];
        if self.waiting_for_host {
            lines.push(Line::from("waiting for the host's approval"));
        }
        if self.pending.is_empty() {
            lines.push(Line::from("no join requests"));
        }
        for (peer, address) in &self.pending {
            lines.push(Line::from(format!("waiting: node {peer} at {address} (a: review)")));
        }
        frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), area);
    }
}
