//! The log: what happened, newest at the bottom, repeats counted.

use std::collections::VecDeque;

use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::Pane;
use crate::console::node::Node;
use crate::console::text::wrap;

/// Log lines kept.
const LOG_LINES: usize = 500;
/// A line equal to one of the last this many is not repeated: that line is counted and moves
/// to the end (a chatty peer's messages, repeated every few seconds, stay readable).
const COALESCE_WINDOW: usize = 6;

/// One log line: when it last happened, what, and how many times in a row (see
/// [`COALESCE_WINDOW`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    /// Seconds since the console started.
    pub at: f64,
    pub text: String,
    pub count: u32,
}

impl std::fmt::Display for LogLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stamp = self.at as u64;
        write!(f, "{:02}:{:02} {}", stamp / 60, stamp % 60, self.text)?;
        if self.count > 1 {
            write!(f, " (×{})", self.count)?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Default)]
pub struct Log {
    pub lines: VecDeque<LogLine>,
}

impl Log {
    /// `text` at `at` (a repeat of a recent line counts it instead).
    pub fn push(&mut self, at: f64, text: String) {
        let recent = self.lines.len().saturating_sub(COALESCE_WINDOW);
        let repeated = self.lines.iter().skip(recent).position(|l| l.text == text).map(|i| recent + i);
        let count = match repeated.and_then(|i| self.lines.remove(i)) {
            Some(earlier) => earlier.count + 1,
            None => 1,
        };
        self.lines.push_back(LogLine { at, text, count });
        while self.lines.len() > LOG_LINES {
            self.lines.pop_front();
        }
    }
}

impl Pane for Log {
    fn title(&self, _node: &Node) -> String {
        "Log".into()
    }

    fn render(&self, _node: &Node, _focused: bool, frame: &mut Frame<'_>, area: Rect) {
        // Newest at the bottom; long lines wrap (indented) rather than being cut.
        let (width, height) = (area.width as usize, area.height as usize);
        let mut rows: Vec<String> = Vec::new();
        for line in self.lines.iter().rev().map(ToString::to_string) {
            let mut wrapped = wrap(&line, width);
            wrapped.reverse();
            rows.extend(wrapped);
            if rows.len() >= height {
                break;
            }
        }
        rows.truncate(height);
        rows.reverse();
        frame.render_widget(Paragraph::new(rows.into_iter().map(Line::from).collect::<Vec<_>>()), area);
    }
}
