//! Reports as files: a self-contained HTML page with inline SVG charts (no scripts, no
//! external fetches, readable printed) and CSV tables.
//!
//! # Layout
//!
//! - this module: the pieces (page, SVG line and bar charts, escaping, CSV fields),
//!   used by the demo's report, the backtest's and the status page.
//! - [`energy_report`]: `powerplane report`: the ledger grouped, as table, CSV, JSON or HTML.
#![forbid(unsafe_code)]

pub mod energy_report;

use std::fmt::Write as _;

/// One line of a chart.
pub struct Line<'a> {
    pub name: &'a str,
    pub color: &'a str,
    pub points: Vec<(f64, f64)>,
    /// Drawn as steps (a value holds until the next point), e.g. prices.
    pub steps: bool,
    /// Plotted against the right-hand axis.
    pub right_axis: bool,
}

/// A horizontal reference line (a budget, a limit).
pub struct Rule<'a> {
    pub name: &'a str,
    pub color: &'a str,
    pub y: f64,
}

pub struct Chart<'a> {
    pub title: &'a str,
    pub y_label: &'a str,
    pub right_label: Option<&'a str>,
    pub lines: Vec<Line<'a>>,
    pub rules: Vec<Rule<'a>>,
    /// Labels along the x axis: (x, text).
    pub x_ticks: Vec<(f64, String)>,
}

const W: f64 = 880.0;
const H: f64 = 260.0;
const L: f64 = 60.0;
const R: f64 = 60.0;
const T: f64 = 44.0;
const B: f64 = 40.0;

pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn bounds<'a>(ys: impl Iterator<Item = &'a f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for &y in ys {
        lo = lo.min(y);
        hi = hi.max(y);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-9 {
        hi = lo + 1.0;
    }
    let pad = (hi - lo) * 0.08;
    // counts and powers never dip below zero on the axis
    let floor = if lo >= 0.0 { 0.0 } else { f64::NEG_INFINITY };
    ((lo - pad).max(floor), hi + pad)
}

impl Chart<'_> {
    /// The chart as an inline SVG element.
    pub fn svg(&self) -> String {
        let sc = Scale::of(self);
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" role="img" aria-label="{}">"#,
            escape(self.title)
        );
        let _ = write!(
            s,
            r#"<text x="{L}" y="18" class="ct">{}</text>"#,
            escape(self.title)
        );
        self.axes(&sc, &mut s);
        self.plot(&sc, &mut s);
        self.legend(&mut s);
        s.push_str("</svg>");
        s
    }

    /// The frame, the grid with the left (and right) axis values, the axis labels and
    /// the x ticks.
    fn axes(&self, sc: &Scale, s: &mut String) {
        let _ = write!(
            s,
            r##"<rect x="{L}" y="{T}" width="{}" height="{}" fill="none" stroke="#bbb"/>"##,
            W - L - R,
            H - T - B
        );
        for i in 0..=4 {
            let y = sc.ly0 + (sc.ly1 - sc.ly0) * f64::from(i) / 4.0;
            let py = sc.y(y, false);
            let _ = write!(
                s,
                r##"<line x1="{L}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="#eee"/><text x="{}" y="{:.1}" class="ax" text-anchor="end">{}</text>"##,
                W - R,
                L - 6.0,
                py + 4.0,
                fmt_num(y)
            );
            if sc.has_right {
                let ry = sc.ry0 + (sc.ry1 - sc.ry0) * f64::from(i) / 4.0;
                let _ = write!(
                    s,
                    r#"<text x="{}" y="{:.1}" class="ax">{}</text>"#,
                    W - R + 6.0,
                    sc.y(ry, true) + 4.0,
                    fmt_num(ry)
                );
            }
        }
        let _ = write!(
            s,
            r#"<text x="12" y="{}" class="ax" transform="rotate(-90 12 {})" text-anchor="middle">{}</text>"#,
            H / 2.0,
            H / 2.0,
            escape(self.y_label)
        );
        if let Some(r) = self.right_label {
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" class="ax" transform="rotate(90 {} {})" text-anchor="middle">{}</text>"#,
                W - 12.0,
                H / 2.0,
                W - 12.0,
                H / 2.0,
                escape(r)
            );
        }
        for (x, label) in &self.x_ticks {
            let px = sc.x(*x);
            let _ = write!(
                s,
                r#"<text x="{px:.1}" y="{}" class="ax" text-anchor="middle">{}</text>"#,
                H - B + 16.0,
                escape(label)
            );
        }
    }

    /// The rules (dashed) and the lines.
    fn plot(&self, sc: &Scale, s: &mut String) {
        for r in &self.rules {
            let py = sc.y(r.y, false);
            let _ = write!(
                s,
                r#"<line x1="{L}" x2="{}" y1="{py:.1}" y2="{py:.1}" stroke="{}" stroke-dasharray="6 4" stroke-width="1.5"/>"#,
                W - R,
                r.color
            );
        }
        for l in &self.lines {
            let mut d = String::new();
            let mut prev: Option<(f64, f64)> = None;
            for &(x, y) in &l.points {
                let (px, py) = (sc.x(x), sc.y(y, l.right_axis));
                match prev {
                    None => {
                        let _ = write!(d, "M{px:.1},{py:.1}");
                    }
                    Some((_, ppy)) if l.steps => {
                        let _ = write!(d, " L{px:.1},{ppy:.1} L{px:.1},{py:.1}");
                    }
                    Some(_) => {
                        let _ = write!(d, " L{px:.1},{py:.1}");
                    }
                }
                prev = Some((px, py));
            }
            let _ = write!(
                s,
                r#"<path d="{d}" fill="none" stroke="{}" stroke-width="1.6"/>"#,
                l.color
            );
        }
    }

    /// The legend, on its own line under the title.
    fn legend(&self, s: &mut String) {
        let mut lx = L;
        let entries: Vec<(&str, &str, bool)> = self
            .lines
            .iter()
            .map(|l| (l.name, l.color, false))
            .chain(self.rules.iter().map(|r| (r.name, r.color, true)))
            .collect();
        for (name, color, dashed) in entries {
            let dash = if dashed {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            let _ = write!(
                s,
                r#"<line x1="{lx}" x2="{}" y1="31" y2="31" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="35" class="ax">{}</text>"#,
                lx + 18.0,
                lx + 22.0,
                escape(name)
            );
            lx += 30.0 + 6.5 * name.len() as f64;
        }
    }
}

/// Where values land on a chart: the x range and the left and right axes' ranges.
struct Scale {
    x0: f64,
    x1: f64,
    ly0: f64,
    ly1: f64,
    ry0: f64,
    ry1: f64,
    /// Whether any line is drawn against the right axis.
    has_right: bool,
}

impl Scale {
    fn of(c: &Chart<'_>) -> Self {
        let xs = c.lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
        let (x0, x1) = bounds(xs.collect::<Vec<_>>().iter());
        let left: Vec<f64> = c
            .lines
            .iter()
            .filter(|l| !l.right_axis)
            .flat_map(|l| l.points.iter().map(|p| p.1))
            .chain(c.rules.iter().map(|r| r.y))
            .collect();
        let right: Vec<f64> = c
            .lines
            .iter()
            .filter(|l| l.right_axis)
            .flat_map(|l| l.points.iter().map(|p| p.1))
            .collect();
        let (ly0, ly1) = bounds(left.iter());
        let (ry0, ry1) = bounds(right.iter());
        Scale {
            x0,
            x1,
            ly0,
            ly1,
            ry0,
            ry1,
            has_right: !right.is_empty(),
        }
    }

    fn x(&self, x: f64) -> f64 {
        L + (x - self.x0) / (self.x1 - self.x0) * (W - L - R)
    }

    fn y(&self, y: f64, right: bool) -> f64 {
        let (a, b) = if right {
            (self.ry0, self.ry1)
        } else {
            (self.ly0, self.ly1)
        };
        H - B - (y - a) / (b - a) * (H - T - B)
    }
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A horizontal bar chart of labelled values.
pub fn bars(title: &str, unit: &str, rows: &[(String, f64)], color: &str) -> String {
    let h = 30.0 + rows.len() as f64 * 24.0 + 10.0;
    let max = rows.iter().map(|r| r.1).fold(0.0_f64, f64::max).max(1e-9);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" role="img" aria-label="{}">"#,
        escape(title)
    );
    let _ = write!(
        s,
        r#"<text x="10" y="18" class="ct">{}</text>"#,
        escape(title)
    );
    for (i, (label, v)) in rows.iter().enumerate() {
        let y = 30.0 + i as f64 * 24.0;
        let w = (W - 330.0) * v / max;
        let _ = write!(
            s,
            r#"<text x="170" y="{}" class="ax" text-anchor="end">{}</text><rect x="180" y="{y}" width="{w:.1}" height="16" fill="{color}"/><text x="{:.1}" y="{}" class="ax">{} {}</text>"#,
            y + 12.0,
            escape(label),
            186.0 + w,
            y + 12.0,
            fmt_num(*v),
            escape(unit)
        );
    }
    s.push_str("</svg>");
    s
}

/// Wraps sections into one self-contained page.
pub fn page(title: &str, body: &str) -> String {
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{t}</title>
<style>
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1b1f24; margin: 2em auto; max-width: 920px; padding: 0 1em; }}
h1 {{ font-size: 1.6em; margin-bottom: .2em; }} h2 {{ font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }}
table {{ border-collapse: collapse; margin: .5em 0; }} td, th {{ padding: .25em .8em; border-bottom: 1px solid #eee; text-align: left; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
svg {{ width: 100%; height: auto; margin: .5em 0; }} .ct {{ font: bold 13px sans-serif; }} .ax {{ font: 11px sans-serif; fill: #444; }}
.muted {{ color: #666; }}
@media print {{ body {{ margin: 0; max-width: none; }} h2 {{ break-after: avoid; }} svg {{ break-inside: avoid; }} }}
</style></head><body>
{body}
</body></html>
"#,
        t = escape(title)
    )
}

/// Quotes a CSV field when it needs it.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_is_one_svg_with_its_title_and_every_line() {
        let c = Chart {
            title: "Power <IT>",
            y_label: "kW",
            right_label: Some("EUR/kWh"),
            lines: vec![
                Line {
                    name: "IT",
                    color: "#1f77b4",
                    points: vec![(0.0, 1.0), (1.0, 2.0)],
                    steps: false,
                    right_axis: false,
                },
                Line {
                    name: "price",
                    color: "#d62728",
                    points: vec![(0.0, 0.1), (1.0, 0.3)],
                    steps: true,
                    right_axis: true,
                },
            ],
            rules: vec![Rule {
                name: "budget",
                color: "#000",
                y: 1.5,
            }],
            x_ticks: vec![(0.0, "06:00".into())],
        };
        let svg = c.svg();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("Power &lt;IT&gt;"));
        assert_eq!(svg.matches("<path").count(), 2);
        assert!(svg.contains("stroke-dasharray"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn csv_fields_are_quoted_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
