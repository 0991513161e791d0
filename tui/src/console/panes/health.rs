//! Step health: rates, where a step's time went, the guard, the loss and its chart.

use std::collections::VecDeque;

use lockstep_mesh::StepTiming;
use lockstep_node::session::AuditStats;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::symbols::Marker;
use ratatui::text::Line;
use ratatui::widgets::{Axis, Chart, Dataset, GraphType, Paragraph, Wrap};
use ratatui::Frame;

use super::Pane;
use crate::console::node::{Node, RunState};
use crate::console::text::{human_bytes, human_count};

/// Loss points kept for the chart (older ones are thinned, never the latest).
const LOSS_POINTS: usize = 1200;
/// Window for steps/s.
const RATE_WINDOW_S: f64 = 10.0;

#[derive(Clone, Debug, Default)]
pub struct Health {
    pub whash: Option<u32>,
    pub losses: Vec<(f64, f64)>,
    /// (time, step) samples for the rate.
    pub step_times: VecDeque<(f64, u32)>,
    pub compute_ms: f64,
    pub hash_guard_ms: f64,
    pub exchange_ms: f64,
    /// Bytes this node sent in the last step (sync), and the share of its time computing.
    pub sent_bytes: u64,
    pub utilization: f64,
    /// This node's audits in the run, and the milliseconds they recomputed in the last step.
    pub audits: AuditStats,
    pub audit_ms: f64,
}

impl Health {
    /// A new run: no losses, no rate yet.
    pub fn restart(&mut self) {
        self.losses.clear();
        self.step_times.clear();
    }

    /// This node's hash and timing of step `step`, at `now`.
    pub fn applied(&mut self, now: f64, step: u32, whash: u32, timing: &StepTiming) {
        self.whash = Some(whash);
        self.compute_ms = timing.compute * 1e3;
        self.hash_guard_ms = timing.hash_guard * 1e3;
        self.exchange_ms = timing.exchange * 1e3;
        self.sent_bytes = timing.sent_bytes;
        self.utilization = timing.utilization();
        self.audits = timing.audits;
        self.audit_ms = timing.audit_seconds * 1e3;
        self.step_times.push_back((now, step));
    }

    /// The state was replaced by a checkpoint's.
    pub fn restored(&mut self, whash: u32) {
        self.whash = Some(whash);
        self.step_times.clear();
    }

    /// The group's loss at `step`.
    pub fn loss(&mut self, step: u32, loss: f32) {
        self.losses.push((f64::from(step), f64::from(loss)));
        if self.losses.len() > LOSS_POINTS {
            // Thin the older half, keep the recent half whole.
            let half = self.losses.len() / 2;
            let mut kept: Vec<(f64, f64)> = self.losses[..half].iter().step_by(2).copied().collect();
            kept.extend_from_slice(&self.losses[half..]);
            self.losses = kept;
        }
    }

    /// The clock: samples older than the rate's window go.
    pub fn tick(&mut self, now: f64) {
        while self.step_times.len() > 2 && self.step_times.front().is_some_and(|&(t, _)| now - t > RATE_WINDOW_S) {
            self.step_times.pop_front();
        }
    }

    /// Steps per second over the last few seconds.
    pub fn steps_per_second(&self) -> Option<f64> {
        let (&(t0, s0), &(t1, s1)) = (self.step_times.front()?, self.step_times.back()?);
        (t1 > t0 && s1 > s0).then(|| f64::from(s1 - s0) / (t1 - t0))
    }

    /// Tokens per second through the whole group (every roster member's batch).
    pub fn tokens_per_second(&self, node: &Node) -> Option<f64> {
        let run = node.run.as_ref()?;
        // A session step is a sync: `H` optimizer steps in `outer:H`.
        let per_step = run.tokens_per_step() as f64 * f64::from(run.steps_per_sync()) * node.in_roster() as f64;
        Some(self.steps_per_second()? * per_step)
    }
}

impl Pane for Health {
    fn title(&self, _node: &Node) -> String {
        "Step health".into()
    }

    fn render(&self, node: &Node, _focused: bool, frame: &mut Frame<'_>, area: Rect) {
        // A step of the session is a sync: `outer:H` counts outer steps.
        let steps = node.run.as_ref().map_or_else(
            || "no run".to_string(),
            |r| format!("{} {}/{}", r.sync.mode.sync_name(), node.step, r.syncs()),
        );
        let sync = node.run.as_ref().map_or(node.start_settings.sync, |r| r.sync);
        let rate = self.steps_per_second().map_or_else(|| "-/s".into(), |r| format!("{r:.2}/s"));
        let tokens =
            self.tokens_per_second(node).map_or_else(|| "- tok/s".into(), |t| format!("{} tok/s", human_count(t)));
        let guard = match &node.run_state {
            RunState::Stopped(why) => format!("guard: STOPPED: {why}"),
            RunState::NoMajority(why) => format!("no majority: {why}"),
            _ if node.step > 0 => format!("guard: ok, hashes agree at step {}", node.step),
            _ => "guard: waiting for the first step".to_string(),
        };
        let loss = match (self.losses.first(), self.losses.last()) {
            (Some(first), Some(last)) => format!("loss {:.4} (first {:.4})", last.1, first.1),
            _ => "loss -".to_string(),
        };
        let whash = self.whash.map_or_else(|| "-".to_string(), |w| format!("{w:#010x}"));
        let a = self.audits;
        let audits = if a.audited + a.skipped > 0 {
            let wrong = a.audited - a.matched;
            let wrong = if wrong > 0 { format!(", {wrong} WRONG") } else { String::new() };
            let links = if a.linked > 0 { format!(", {} linked", a.linked) } else { String::new() };
            format!("  audits {} ok{wrong}{links} {:.0}ms", a.matched, self.audit_ms)
        } else {
            String::new()
        };
        let lines = vec![
            Line::from(format!("{steps}  {rate}  {tokens}")),
            Line::from(format!(
                "compute {:.0}ms {:.0}%  exchange {:.0}ms",
                self.compute_ms,
                self.utilization * 100.0,
                self.exchange_ms
            )),
            Line::from(format!("hash+guard {:.1}ms  sent {}/step", self.hash_guard_ms, human_bytes(self.sent_bytes))),
            Line::from(match node.run.as_ref().filter(|r| r.sync.overlap > 0 && node.step < r.syncs()) {
                // An overlapped run: the sync in flight is summed while the next window runs
                // (its mean lands `overlap` steps into it).
                Some(_) => format!("sync {sync} · {} in flight{audits}", node.step + 1),
                None => format!("sync {sync}{audits}"),
            }),
            Line::from(guard),
            Line::from(format!("{loss}  whash {whash}")),
        ];
        let [text, chart] = Layout::vertical([Constraint::Length(7), Constraint::Min(0)]).areas(area);
        frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), text);
        if chart.height >= 3 && self.losses.len() >= 2 {
            let (x0, x1) = (self.losses[0].0, self.losses[self.losses.len() - 1].0);
            let (lo, hi) = self.losses.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &(_, l)| (lo.min(l), hi.max(l)));
            let hi = if hi > lo { hi } else { lo + 1.0 };
            let dataset = Dataset::default().marker(Marker::Braille).graph_type(GraphType::Line).data(&self.losses);
            let widget = Chart::new(vec![dataset])
                .x_axis(Axis::default().bounds([x0, x1.max(x0 + 1.0)]).labels([format!("{x0:.0}"), format!("{x1:.0}")]))
                .y_axis(Axis::default().bounds([lo, hi]).labels([format!("{lo:.2}"), format!("{hi:.2}")]));
            frame.render_widget(widget, chart);
        }
    }
}
