//! Backends: the plugins this node can compute with, their verdicts and devices.

use lockstep_node::verdict::Verdict;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::{move_selection, Pane, PaneRequest};
use crate::console::key::Key;
use crate::console::node::Node;

#[derive(Clone, Debug, PartialEq)]
pub struct BackendRow {
    pub name: String,
    /// `None` while the survey is still gating it.
    pub verdict: Option<Verdict>,
    /// The plugin's own description of its device (empty when unknown).
    pub device: String,
}

#[derive(Clone, Debug)]
pub struct Backends {
    pub rows: Vec<BackendRow>,
    pub selected: usize,
}

impl Backends {
    /// The built-in plugins, `backend` (in use) with its verdict and device.
    pub fn new(backend: &str, verdict: &Verdict, device: &str) -> Self {
        let rows = lockstep_backends::BUILTIN_BACKENDS
            .iter()
            .map(|&name| BackendRow {
                name: name.to_string(),
                verdict: (name == backend).then(|| verdict.clone()),
                device: if name == backend { device.to_string() } else { String::new() },
            })
            .collect();
        Backends { rows, selected: 0 }
    }

    /// A plugin's verdict from the start-up survey.
    pub fn verdict(&mut self, name: String, verdict: Verdict, device: String) {
        match self.rows.iter_mut().find(|b| b.name == name) {
            Some(row) => {
                row.verdict = Some(verdict);
                row.device = device;
            }
            None => self.rows.push(BackendRow { name, verdict: Some(verdict), device }),
        }
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

impl Pane for Backends {
    fn title(&self, _node: &Node) -> String {
        "Backends".into()
    }

    fn on_key(&mut self, key: Key) -> Option<PaneRequest> {
        match key {
            Key::Up | Key::Down => move_selection(&mut self.selected, self.rows.len(), key == Key::Down),
            Key::Enter => return Some(PaneRequest::Swap { selected: self.selected }),
            _ => {}
        }
        None
    }

    fn render(&self, node: &Node, focused: bool, frame: &mut Frame<'_>, area: Rect) {
        let mut lines = Vec::new();
        for (i, row) in self.rows.iter().enumerate() {
            let marker = if i == self.selected && focused { ">" } else { " " };
            let using = if row.name == node.backend { "*" } else { " " };
            // What matters first: name, verdict, device kind; the full description is in the
            // swap dialog.
            let verdict = row.verdict.as_ref().map_or_else(|| "checking…".to_string(), Verdict::short);
            let kind = device_kind(&row.device);
            lines.push(Line::from(format!("{marker}{using}{:<5} {verdict}  {kind}", row.name).trim_end().to_string()));
        }
        if !self.rows.iter().any(|b| b.name == node.backend) {
            lines.push(Line::from(format!("  in use: {}", node.backend)));
        }
        lines.push(Line::from(match &node.swap {
            Some(swap) => format!("swap: {swap}"),
            None => "* in use; w swaps (gated first)".to_string(),
        }));
        frame.render_widget(Paragraph::new(lines), area);
    }
}
