//! The console's panes, each a component: its own state, the keys it takes while focused, and
//! its view. `view.rs` places them on the screen by a layout table; `state.rs` hands them what
//! they need of reports and keys. A new pane is a file here, a `PaneId`, its field in [`Panes`]
//! and its place in the layouts.

mod backends;
mod checkpoints;
mod health;
mod log;
mod room;
mod roster;

pub use backends::Backends;
pub use checkpoints::{CheckpointRow, Checkpoints};
pub use health::Health;
pub use log::Log;
pub use room::Room;
pub use roster::Roster;

use ratatui::layout::Rect;
use ratatui::widgets::{Block, BorderType};
use ratatui::Frame;

use super::key::Key;
use super::node::Node;

/// Which pane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaneId {
    Roster,
    Health,
    Room,
    Checkpoints,
    Backends,
    Log,
}

/// The order `Tab` cycles through.
pub const PANES: [PaneId; 6] =
    [PaneId::Roster, PaneId::Health, PaneId::Room, PaneId::Checkpoints, PaneId::Backends, PaneId::Log];

/// What a focused pane's key asks of the console (the pane cannot open dialogs itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaneRequest {
    /// Confirm broadcasting the selected checkpoint.
    Broadcast,
    /// Open the swap dialog on this backend.
    Swap { selected: usize },
    /// Open the next join request.
    ReviewRequests,
}

/// Moves a selection within `len` rows (the lists' Up and Down).
pub fn move_selection(selected: &mut usize, len: usize, down: bool) {
    if len == 0 {
        *selected = 0;
    } else if down {
        *selected = (*selected + 1).min(len - 1);
    } else {
        *selected = selected.saturating_sub(1);
    }
}

/// One pane: its title, its keys, its view.
pub trait Pane {
    fn title(&self, node: &Node) -> String;
    /// A key while this pane has the focus (keys every pane shares are the console's).
    fn on_key(&mut self, _key: Key) -> Option<PaneRequest> {
        None
    }
    /// Draws the inside of the pane (its border is drawn for it).
    fn render(&self, node: &Node, focused: bool, frame: &mut Frame<'_>, area: Rect);
}

/// Every pane.
#[derive(Clone, Debug)]
pub struct Panes {
    pub roster: Roster,
    pub health: Health,
    pub room: Room,
    pub checkpoints: Checkpoints,
    pub backends: Backends,
    pub log: Log,
}

impl Panes {
    pub fn get(&self, id: PaneId) -> &dyn Pane {
        match id {
            PaneId::Roster => &self.roster,
            PaneId::Health => &self.health,
            PaneId::Room => &self.room,
            PaneId::Checkpoints => &self.checkpoints,
            PaneId::Backends => &self.backends,
            PaneId::Log => &self.log,
        }
    }

    pub fn get_mut(&mut self, id: PaneId) -> &mut dyn Pane {
        match id {
            PaneId::Roster => &mut self.roster,
            PaneId::Health => &mut self.health,
            PaneId::Room => &mut self.room,
            PaneId::Checkpoints => &mut self.checkpoints,
            PaneId::Backends => &mut self.backends,
            PaneId::Log => &mut self.log,
        }
    }

    /// Draws pane `id` in `area` with its border: double, and `>title<`, when it has the focus
    /// (focus is visible without colour).
    pub fn render(&self, id: PaneId, node: &Node, focus: PaneId, frame: &mut Frame<'_>, area: Rect) {
        let pane = self.get(id);
        let focused = focus == id;
        let name = pane.title(node);
        let block = Block::bordered().title(if focused { format!(">{name}<") } else { name });
        let block = if focused { block.border_type(BorderType::Double) } else { block };
        let inner = block.inner(area);
        frame.render_widget(block, area);
        pane.render(node, focused, frame, inner);
    }
}
