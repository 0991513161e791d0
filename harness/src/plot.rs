//! Line charts as SVG, for the benches' figures (`bench wan --svg`): a few series of (x, y)
//! points, axes with round ticks, a legend. Written by hand rather than through a plotting
//! crate: one chart of polylines needs no font rendering or raster backend, and the file is
//! plain text a reviewer can diff.

use std::fmt::Write;

/// One line of the chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f32)>,
}

/// A chart: its title (one line, or several separated by '\n'), axis labels and lines.
#[derive(Clone, Debug)]
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 560.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 150.0;
const COLOURS: [&str; 8] = ["#000000", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"];

/// Round tick values covering `lo..=hi`, about `count` of them.
fn ticks(lo: f64, hi: f64, count: usize) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / count as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(10.0 * magnitude);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

impl Plot {
    /// The chart as an SVG document.
    pub fn svg(&self) -> String {
        let points =
            || self.series.iter().flat_map(|s| s.points.iter()).filter(|(x, y)| x.is_finite() && y.is_finite());
        let (mut x_lo, mut x_hi) = (0.0f64, points().map(|p| p.0).fold(0.0, f64::max));
        let y_lo = points().map(|p| f64::from(p.1)).fold(f64::INFINITY, f64::min);
        let y_hi = points().map(|p| f64::from(p.1)).fold(f64::NEG_INFINITY, f64::max);
        let (y_lo, y_hi) = if y_lo.is_finite() { (y_lo, y_hi.max(y_lo + 1e-3)) } else { (0.0, 1.0) };
        let pad = (y_hi - y_lo) * 0.05;
        let (y_lo, y_hi) = (y_lo - pad, y_hi + pad);
        if x_hi <= x_lo {
            (x_lo, x_hi) = (0.0, 1.0);
        }
        // A title of several lines ('\n') moves the plot down by the lines after the first.
        let top = TOP + 16.0 * self.title.lines().count().saturating_sub(1) as f64;
        let plot_w = WIDTH - LEFT - RIGHT;
        let plot_h = HEIGHT - top - BOTTOM;
        let x_of = |x: f64| LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w;
        let y_of = |y: f64| top + (1.0 - (y - y_lo) / (y_hi - y_lo)) * plot_h;
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(out, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
        for (i, line) in self.title.lines().enumerate() {
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{}" font-size="14" text-anchor="middle">{}</text>"#,
                WIDTH / 2.0,
                22 + 16 * i,
                escape(line)
            );
        }
        for x in ticks(x_lo, x_hi, 8) {
            let px = x_of(x);
            let _ = writeln!(
                out,
                r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{:.1}" stroke="#e0e0e0"/>"##,
                top + plot_h
            );
            let _ =
                writeln!(out, r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{x}</text>"#, top + plot_h + 16.0);
        }
        for y in ticks(y_lo, y_hi, 6) {
            let py = y_of(y);
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e0e0e0"/>"##,
                LEFT + plot_w
            );
            let _ =
                writeln!(out, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{:.2}</text>"#, LEFT - 6.0, py + 4.0, y);
        }
        let _ = writeln!(
            out,
            r##"<rect x="{LEFT}" y="{top}" width="{plot_w:.1}" height="{plot_h:.1}" fill="none" stroke="#444"/>"##
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            top + plot_h + 36.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            out,
            r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
            top + plot_h / 2.0,
            top + plot_h / 2.0,
            escape(&self.y_label)
        );
        for (i, series) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let path: Vec<String> = series
                .points
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|&(x, y)| format!("{:.1},{:.1}", x_of(x), y_of(f64::from(y))))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
                path.join(" ")
            );
            let ly = top + plot_h + 56.0 + 16.0 * i as f64;
            let _ = writeln!(
                out,
                r#"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{}</text>"#,
                ly - 4.0,
                LEFT + 24.0,
                ly - 4.0,
                LEFT + 30.0,
                ly,
                escape(&series.label)
            );
        }
        out.push_str("</svg>\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_inside_the_range() {
        assert_eq!(ticks(0.0, 100.0, 5), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(ticks(1.83, 2.61, 4), vec![2.0, 2.2, 2.4000000000000004, 2.6]);
        assert_eq!(ticks(0.0, 7.0, 8), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    }

    #[test]
    fn a_chart_draws_every_series_and_escapes_its_labels() {
        let plot = Plot {
            title: "a <b> & c".into(),
            x_label: "s".into(),
            y_label: "loss".into(),
            series: vec![
                Series { label: "alone".into(), points: vec![(0.0, 3.0), (10.0, 2.0)] },
                Series { label: "group".into(), points: vec![(0.0, 3.0), (5.0, 1.5), (f64::NAN, 1.0)] },
            ],
        };
        let svg = plot.svg();
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        // A second line of title moves the plot down by one line (16 units).
        let two_lines = Plot { title: "a <b> & c\nsecond".into(), ..plot.clone() }.svg();
        assert!(
            two_lines.contains(r#"y="22" font-size="14" text-anchor="middle">a &lt;b&gt; &amp; c<"#),
            "{two_lines}"
        );
        assert!(two_lines.contains(r#"y="38" font-size="14" text-anchor="middle">second<"#), "{two_lines}");
        assert!(two_lines.contains(r#"points="70.0,72.1 880.0,286.6""#), "{two_lines}");
        // x from 0 to 10 over the plot's width; y from 1.425 to 3.075 (5% padding).
        assert!(svg.contains(r#"points="70.0,56.8 880.0,281.1""#), "{svg}");
        assert!(svg.contains(r#"points="70.0,56.8 475.0,393.2""#), "{svg}");
    }
}
