//! `--plot FILE.svg`: bus bandwidth against size (log2 x, linear y) and latency against size
//! (log-log), one line per library and placement, written as plain SVG.

use std::fmt::Write as _;

use super::report::{Measurement, Row};

const WIDTH: f64 = 900.0;
const PANEL: f64 = 380.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 50.0;

/// One line of a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text, e.g. `mscclpp out-of-place`.
    pub name: String,
    /// Stroke colour.
    pub color: &'static str,
    /// Dashed (in-place) or solid.
    pub dashed: bool,
    /// (bytes, value) points in size order.
    pub points: Vec<(f64, f64)>,
}

/// The lines of the table: mscclpp out-of-place and in-place, and NCCL's when present,
/// valued by `f` (bus bandwidth or time).
pub fn series(rows: &[Row], f: impl Fn(&Measurement) -> f64) -> Vec<Series> {
    let mut out = Vec::new();
    let line = |name: &str, color, dashed, pick: &dyn Fn(&Row) -> Option<Measurement>| Series {
        name: name.to_string(),
        color,
        dashed,
        points: rows
            .iter()
            .filter_map(|r| pick(r).map(|m| (r.bytes as f64, f(&m))))
            .collect(),
    };
    out.push(line("mscclpp out-of-place", "#1f77b4", false, &|r| {
        Some(r.mscclpp.out_of_place)
    }));
    out.push(line("mscclpp in-place", "#1f77b4", true, &|r| {
        Some(r.mscclpp.in_place)
    }));
    if rows.iter().any(|r| r.nccl.is_some()) {
        out.push(line("NCCL out-of-place", "#ff7f0e", false, &|r| {
            r.nccl.map(|n| n.out_of_place)
        }));
        out.push(line("NCCL in-place", "#ff7f0e", true, &|r| {
            r.nccl.map(|n| n.in_place)
        }));
    }
    out
}

/// A byte count as a short label: `8`, `1K`, `32M`, `1G`.
pub fn size_label(bytes: f64) -> String {
    let b = bytes.round() as u64;
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    b.to_string()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A 1-2-5 step giving about `n` ticks up to `max`.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let m = raw / mag;
    let k = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    k * mag
}

enum YScale {
    Linear { max: f64, step: f64 },
    Log10 { lo: i32, hi: i32 },
}

struct Panel<'a> {
    title: String,
    y_title: &'a str,
    y: YScale,
    series: &'a [Series],
    top: f64,
}

fn x_range(series: &[Series]) -> (f64, f64) {
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0.max(1.0).log2()))
        .collect();
    let lo = xs.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    let (lo, hi) = (lo.floor(), hi.ceil());
    if hi - lo < 1.0 {
        (lo - 1.0, hi + 1.0)
    } else {
        (lo, hi)
    }
}

/// Where a panel's plot area lies and how values map into it.
struct Frame<'a> {
    /// Left and right edges of the plot area.
    x0: f64,
    x1: f64,
    /// Bottom and top edges.
    y0: f64,
    y1: f64,
    /// The x range, in log2 of bytes.
    x_lo: f64,
    x_hi: f64,
    y: &'a YScale,
}

impl Frame<'_> {
    /// The x coordinate of `b` bytes.
    fn px(&self, b: f64) -> f64 {
        self.x0 + (b.max(1.0).log2() - self.x_lo) / (self.x_hi - self.x_lo) * (self.x1 - self.x0)
    }

    /// The y coordinate of value `v`.
    fn py(&self, v: f64) -> f64 {
        let (y0, y1) = (self.y0, self.y1);
        match *self.y {
            YScale::Linear { max, .. } => y0 - v / max * (y0 - y1),
            YScale::Log10 { lo, hi } => {
                let l = v.max(1e-300).log10();
                y0 - (l - lo as f64) / (hi - lo) as f64 * (y0 - y1)
            }
        }
    }
}

fn draw_panel(svg: &mut String, p: &Panel<'_>, (x_lo, x_hi): (f64, f64)) {
    let f = Frame {
        x0: LEFT,
        x1: WIDTH - RIGHT,
        y0: p.top + PANEL - BOTTOM,
        y1: p.top + TOP,
        x_lo,
        x_hi,
        y: &p.y,
    };
    let (x0, x1, y0, y1) = (f.x0, f.x1, f.y0, f.y1);
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="16" text-anchor="middle">{}</text>"#,
        (x0 + x1) / 2.0,
        p.top + 28.0,
        escape(&p.title)
    );
    // Grid and y ticks.
    for (v, label) in &y_ticks(&p.y) {
        let y = f.py(*v);
        let _ = writeln!(
            svg,
            r##"<line class="grid" x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}" stroke="#dddddd"/>"##
        );
        let _ = writeln!(
            svg,
            r#"<text class="ytick" x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{label}</text>"#,
            x0 - 6.0,
            y + 4.0
        );
    }
    draw_x_ticks(svg, &f);
    // Axes and their titles.
    let _ = writeln!(
        svg,
        r#"<line class="axis" x1="{x0:.1}" y1="{y0:.1}" x2="{x1:.1}" y2="{y0:.1}" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<line class="axis" x1="{x0:.1}" y1="{y0:.1}" x2="{x0:.1}" y2="{y1:.1}" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" text-anchor="middle">size (bytes)</text>"#,
        (x0 + x1) / 2.0,
        y0 + 36.0
    );
    let (tx, ty) = (18.0, (y0 + y1) / 2.0);
    let _ = writeln!(
        svg,
        r#"<text x="{tx:.1}" y="{ty:.1}" font-size="13" text-anchor="middle" transform="rotate(-90 {tx:.1} {ty:.1})">{}</text>"#,
        escape(p.y_title)
    );
    draw_series(svg, &f, p.series);
}

/// The y axis's ticks: (value, label).
fn y_ticks(y: &YScale) -> Vec<(f64, String)> {
    let mut y_ticks: Vec<(f64, String)> = Vec::new();
    match *y {
        YScale::Linear { max, step } => {
            let decimals = (-step.log10().floor()).max(0.0) as usize;
            let mut k = 0.0;
            while k * step <= max * 1.0001 {
                let v = k * step;
                y_ticks.push((v, format!("{v:.decimals$}")));
                k += 1.0;
            }
        }
        YScale::Log10 { lo, hi } => {
            for e in lo..=hi {
                let v = 10f64.powi(e);
                let label = if e >= 0 {
                    format!("{v:.0}")
                } else {
                    format!("{v}")
                };
                y_ticks.push((v, label));
            }
        }
    }
    y_ticks
}

/// x ticks at powers of two, labelled at most about 12 times.
fn draw_x_ticks(svg: &mut String, f: &Frame<'_>) {
    let (x_lo, x_hi, y0) = (f.x_lo, f.x_hi, f.y0);
    let span = (x_hi - x_lo) as i64;
    let every = ((span + 11) / 12).max(1);
    for e in (x_lo as i64)..=(x_hi as i64) {
        let x = f.px(2f64.powi(e as i32));
        let _ = writeln!(
            svg,
            r#"<line class="xtick" x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{:.1}" stroke="black"/>"#,
            y0 + 4.0
        );
        if (e - x_lo as i64) % every == 0 {
            let _ = writeln!(
                svg,
                r#"<text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
                y0 + 17.0,
                size_label(2f64.powi(e as i32))
            );
        }
    }
}

/// The series' lines and points, and the legend beside the plot area.
fn draw_series(svg: &mut String, f: &Frame<'_>, series: &[Series]) {
    for (i, s) in series.iter().enumerate() {
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(b, v)| format!("{:.1},{:.1}", f.px(b), f.py(v)))
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<polyline class="series" data-name="{}" fill="none" stroke="{}" stroke-width="2"{dash} points="{}"/>"#,
            escape(&s.name),
            s.color,
            pts.join(" ")
        );
        for &(b, v) in &s.points {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{}"/>"#,
                f.px(b),
                f.py(v),
                s.color
            );
        }
        let ly = f.y1 + 10.0 + 20.0 * i as f64;
        let lx = f.x1 + 20.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash}/>"#,
            lx + 30.0,
            s.color
        );
        let _ = writeln!(
            svg,
            r#"<text class="legend" x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            lx + 36.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
}

/// The SVG document: bus bandwidth (top) and latency (bottom) against size.
pub fn svg(title: &str, rows: &[Row]) -> String {
    let bw = series(rows, |m| m.busbw_gbps);
    let lat = series(rows, |m| m.time_us);
    let x = x_range(&bw);
    let bw_max = bw
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let step = nice_step(if bw_max > 0.0 { bw_max } else { 1.0 }, 5.0);
    let top = ((bw_max / step).ceil() * step).max(step);
    let lat_vals: Vec<f64> = lat
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let (lo, hi) = if lat_vals.is_empty() {
        (0, 1)
    } else {
        let lo = lat_vals.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = lat_vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        (lo, hi.max(lo + 1))
    };
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{}" viewBox="0 0 {WIDTH} {}" font-family="sans-serif">"#,
        2.0 * PANEL,
        2.0 * PANEL
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    draw_panel(
        &mut svg,
        &Panel {
            title: format!("{title}: bus bandwidth"),
            y_title: "busbw (GB/s)",
            y: YScale::Linear { max: top, step },
            series: &bw,
            top: 0.0,
        },
        x,
    );
    draw_panel(
        &mut svg,
        &Panel {
            title: format!("{title}: latency"),
            y_title: "time (us)",
            y: YScale::Log10 { lo, hi },
            series: &lat,
            top: PANEL,
        },
        x,
    );
    svg.push_str("</svg>\n");
    svg
}
