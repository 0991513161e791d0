//! Checkpoints: the files saved or loaded here, one selected for a broadcast.

use std::path::PathBuf;

use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::{move_selection, Pane, PaneRequest};
use crate::console::key::Key;
use crate::console::node::Node;

#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointRow {
    pub path: PathBuf,
    pub step: u32,
    pub whash: u32,
}

#[derive(Clone, Debug)]
pub struct Checkpoints {
    /// Where `c` saves.
    pub dir: PathBuf,
    pub rows: Vec<CheckpointRow>,
    pub selected: usize,
}

impl Checkpoints {
    pub fn new(dir: PathBuf) -> Self {
        Checkpoints { dir, rows: Vec::new(), selected: 0 }
    }

    /// Adds a file (replacing an older row of the same path), selected.
    pub fn add(&mut self, row: CheckpointRow) {
        self.rows.retain(|c| c.path != row.path);
        self.rows.push(row);
        self.selected = self.rows.len() - 1;
    }

    /// Files found on disk (at start-up), not selected.
    pub fn found(&mut self, rows: Vec<CheckpointRow>) {
        for row in rows {
            if !self.rows.iter().any(|c| c.path == row.path) {
                self.rows.push(row);
            }
        }
    }

    pub fn selected(&self) -> Option<&CheckpointRow> {
        self.rows.get(self.selected)
    }
}

impl Pane for Checkpoints {
    fn title(&self, _node: &Node) -> String {
        "Checkpoints".into()
    }

    fn on_key(&mut self, key: Key) -> Option<PaneRequest> {
        match key {
            Key::Up | Key::Down => move_selection(&mut self.selected, self.rows.len(), key == Key::Down),
            Key::Enter => return Some(PaneRequest::Broadcast),
            _ => {}
        }
        None
    }

    fn render(&self, _node: &Node, _focused: bool, frame: &mut Frame<'_>, area: Rect) {
        let mut lines = vec![Line::from(format!("in {}  (c save, b broadcast, l load)", self.dir.display()))];
        if self.rows.is_empty() {
            lines.push(Line::from("none yet"));
        }
        for (i, row) in self.rows.iter().enumerate() {
            let marker = if i == self.selected { ">" } else { " " };
            let name =
                row.path.file_name().map_or_else(|| row.path.display().to_string(), |n| n.to_string_lossy().into());
            lines.push(Line::from(format!("{marker} {name}  step {}  {:#010x}", row.step, row.whash)));
        }
        frame.render_widget(Paragraph::new(lines), area);
    }
}
