//! Horizontal bar charts as SVG, for the benches' `--svg FILE`: one group of bars per row of
//! a bench's table, one bar per series, each bar labelled with its value and each row with an
//! optional note (a ratio). Plain SVG 1.1, no scripts or external fonts, so that it renders
//! the same in a browser and on a code host's page.

use std::fmt::Write as _;

/// A bar chart: its title, the unit of its values, its series and its rows.
pub struct Chart {
    /// Printed above the chart.
    pub title: String,
    /// Printed after each value (`ns`, `requests/s`).
    pub unit: &'static str,
    /// The series' names, in the order of each row's values.
    pub series: Vec<&'static str>,
    /// The heading of the rows' notes.
    pub note_title: &'static str,
    /// The rows: a label, one value per series (`None`: no bar), and a note printed at the
    /// right of the row.
    pub rows: Vec<Row>,
}

/// One row of a [`Chart`].
pub struct Row {
    pub label: String,
    pub values: Vec<Option<f64>>,
    pub note: String,
}

/// Bar colours, one per series (colour-blind safe: blue, orange, grey).
const COLOURS: [&str; 3] = ["#4477aa", "#ee7733", "#999999"];

const WIDTH: f64 = 860.0;
const LABEL_W: f64 = 300.0;
const BARS_W: f64 = 380.0;
const BAR_H: f64 = 14.0;
const GAP: f64 = 8.0;
const TOP: f64 = 52.0;

impl Chart {
    /// The chart as an SVG document.
    pub fn svg(&self) -> String {
        let max = self
            .rows
            .iter()
            .flat_map(|r| r.values.iter().flatten())
            .fold(0.0_f64, |m, &v| m.max(v));
        let scale = if max > 0.0 { BARS_W / max } else { 0.0 };
        let group_h = BAR_H * self.series.len().max(1) as f64 + GAP;
        let height = TOP + group_h * self.rows.len() as f64 + 12.0;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
             viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" font-size=\"12\">"
        );
        let _ = writeln!(
            out,
            "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n\
             <text x=\"8\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>",
            escape(&self.title)
        );
        // the legend, one swatch per series
        let mut x = LABEL_W;
        for (s, name) in self.series.iter().enumerate() {
            let _ = writeln!(
                out,
                "<rect x=\"{x}\" y=\"28\" width=\"12\" height=\"12\" fill=\"{}\"/>\
                 <text x=\"{}\" y=\"38\">{}</text>",
                COLOURS[s % COLOURS.len()],
                x + 16.0,
                escape(name)
            );
            x += 24.0 + 7.0 * name.len() as f64;
        }
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"38\" text-anchor=\"end\" font-weight=\"bold\">{}</text>",
            WIDTH - 8.0,
            escape(self.note_title)
        );
        for (r, row) in self.rows.iter().enumerate() {
            let y0 = TOP + group_h * r as f64;
            let mid = y0 + (group_h - GAP) / 2.0 + 4.0;
            let _ = writeln!(
                out,
                "<text x=\"{}\" y=\"{mid}\" text-anchor=\"end\">{}</text>",
                LABEL_W - 8.0,
                escape(&row.label)
            );
            for (s, value) in row.values.iter().enumerate() {
                let Some(v) = value else { continue };
                let y = y0 + BAR_H * s as f64;
                let w = (v * scale).max(1.0);
                let _ = writeln!(
                    out,
                    "<rect x=\"{LABEL_W}\" y=\"{y}\" width=\"{w:.1}\" height=\"{}\" \
                     fill=\"{}\"/><text x=\"{:.1}\" y=\"{}\" font-size=\"11\">{} {}</text>",
                    BAR_H - 2.0,
                    COLOURS[s % COLOURS.len()],
                    LABEL_W + w + 4.0,
                    y + BAR_H - 4.0,
                    format_value(*v),
                    self.unit
                );
            }
            if !row.note.is_empty() {
                let _ = writeln!(
                    out,
                    "<text x=\"{}\" y=\"{mid}\" text-anchor=\"end\" font-weight=\"bold\">{}</text>",
                    WIDTH - 8.0,
                    escape(&row.note)
                );
            }
        }
        out.push_str("</svg>\n");
        out
    }

    /// Writes the chart to `path`, and says where on stderr.
    pub fn write(&self, path: &str) {
        match std::fs::write(path, self.svg()) {
            Ok(()) => eprintln!("chart written to {path}"),
            Err(e) => {
                eprintln!("cannot write the chart to {path}: {e}");
                std::process::exit(1);
            }
        }
    }
}

/// A value as the tables print it: whole numbers, with a decimal below 10.
fn format_value(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// Text made safe for SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
