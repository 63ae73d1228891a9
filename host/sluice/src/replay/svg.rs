//! The simulation's plots as standalone SVG: the wait-time CDF per bucket and variant, and
//! queue depth over time. Written by hand (lines, axes, a legend), so the bytes depend on the
//! figures alone and a browser opens them with no script and no fonts of ours.

use super::report::{SimReport, duration};
use sluice_model::Priority;
use std::fmt::Write as _;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

/// A line to draw: its legend, colour, dashes and points.
pub struct Series {
    pub name: String,
    pub colour: &'static str,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// A log-10 x axis (for waits, which span ms to hours).
    pub log_x: bool,
    pub series: Vec<Series>,
}

fn colour(bucket: Priority) -> &'static str {
    match bucket {
        Priority::Urgent => "#c0392b",
        Priority::Normal => "#2471a3",
        Priority::Low => "#7d8c2e",
    }
}

/// Escapes text for an SVG text node or attribute.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The smallest of 1, 2 or 5 times a power of ten at or above `value` (at least 1), so the
/// y axis ends on a round number.
fn nice_ceiling(value: f64) -> f64 {
    if value <= 1.0 {
        return 1.0;
    }
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&ceiling| ceiling >= value)
        .unwrap_or(10.0 * power)
}

impl Chart {
    pub fn render(&self) -> String {
        let points = self.series.iter().flat_map(|s| s.points.iter());
        let x_of = |x: f64| if self.log_x { x.max(1.0).log10() } else { x };
        let (mut x_min, mut x_max, mut y_max) = (f64::MAX, f64::MIN, 0.0f64);
        for &(x, y) in points {
            x_min = x_min.min(x_of(x));
            x_max = x_max.max(x_of(x));
            y_max = y_max.max(y);
        }
        if x_min > x_max {
            (x_min, x_max) = (0.0, 1.0);
        }
        if self.log_x {
            x_min = x_min.floor();
            x_max = x_max.ceil().max(x_min + 1.0);
        } else if x_max <= x_min {
            x_max = x_min + 1.0;
        }
        let y_max = nice_ceiling(y_max);
        let plot_w = WIDTH - LEFT - RIGHT;
        let plot_h = HEIGHT - TOP - BOTTOM;
        let sx = |x: f64| LEFT + (x_of(x) - x_min) / (x_max - x_min) * plot_w;
        let sy = |y: f64| TOP + plot_h - y / y_max * plot_h;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            svg,
            r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="28" font-size="16" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            escape(&self.title)
        );
        // Axes and ticks.
        let _ = writeln!(
            svg,
            r#"<path d="M{LEFT},{TOP} V{} H{}" fill="none" stroke="black"/>"#,
            TOP + plot_h,
            LEFT + plot_w
        );
        let x_ticks: Vec<(f64, String)> = if self.log_x {
            (x_min as i32..=x_max as i32)
                .map(|e| {
                    let x = 10f64.powi(e);
                    (x, duration(x as u64))
                })
                .collect()
        } else {
            (0..=5)
                .map(|i| {
                    let x = x_min + (x_max - x_min) * f64::from(i) / 5.0;
                    (x, format!("{x:.0}"))
                })
                .collect()
        };
        for (x, label) in x_ticks {
            let px = sx(x);
            let _ = writeln!(
                svg,
                r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#ddd"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + plot_h,
                TOP + plot_h + 18.0,
                escape(&label)
            );
        }
        for i in 0..=5 {
            let y = y_max * f64::from(i) / 5.0;
            let py = sy(y);
            let label = if y_max <= 1.0 {
                format!("{y:.1}")
            } else {
                format!("{y:.0}")
            };
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
                LEFT + plot_w,
                LEFT - 8.0,
                py + 4.0
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + plot_w / 2.0,
            HEIGHT - 16.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            svg,
            r#"<text x="20" y="{:.1}" text-anchor="middle" transform="rotate(-90 20 {:.1})">{}</text>"#,
            TOP + plot_h / 2.0,
            TOP + plot_h / 2.0,
            escape(&self.y_label)
        );
        for (n, series) in self.series.iter().enumerate() {
            let path: Vec<String> = series
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
                .collect();
            let dash = if series.dashed {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            if !path.is_empty() {
                let _ = writeln!(
                    svg,
                    r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
                    path.join(" "),
                    series.colour
                );
            }
            let ly = TOP + 10.0 + n as f64 * 20.0;
            let lx = LEFT + plot_w + 16.0;
            let _ = writeln!(
                svg,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 24.0,
                series.colour,
                lx + 30.0,
                ly + 4.0,
                escape(&series.name)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

/// The wait-time CDF of each bucket in each variant (variants after the first dashed).
pub fn wait_cdf(report: &SimReport) -> String {
    let mut series = Vec::new();
    for (n, variant) in report.variants.iter().enumerate() {
        for (bucket, wait) in &variant.wait_ms {
            if wait.claimed == 0 {
                continue;
            }
            let mut points = vec![(wait.percentiles_ms[0] as f64, 0.0)];
            points.extend(
                (1..)
                    .zip(&wait.percentiles_ms)
                    .map(|(p, &ms)| (ms as f64, f64::from(p) / 100.0)),
            );
            series.push(Series {
                name: format!("{} {}", variant.name, bucket.as_str()),
                colour: colour(*bucket),
                dashed: n > 0,
                points,
            });
        }
    }
    Chart {
        title: "Wait from submission to first claim".into(),
        x_label: "wait (log scale)".into(),
        y_label: "share of the bucket's tasks".into(),
        log_x: true,
        series,
    }
    .render()
}

/// Queued tasks per bucket over virtual time, in each variant.
pub fn queue_depth(report: &SimReport) -> String {
    let mut series = Vec::new();
    for (n, variant) in report.variants.iter().enumerate() {
        let depth = &variant.queue_depth;
        let interval_s = depth.interval_ms as f64 / 1_000.0;
        for (bucket, samples) in [
            (Priority::Urgent, &depth.urgent),
            (Priority::Normal, &depth.normal),
            (Priority::Low, &depth.low),
        ] {
            series.push(Series {
                name: format!("{} {}", variant.name, bucket.as_str()),
                colour: colour(bucket),
                dashed: n > 0,
                points: (0u32..)
                    .zip(samples)
                    .map(|(i, &d)| (f64::from(i) * interval_s, f64::from(d)))
                    .collect(),
            });
        }
    }
    Chart {
        title: "Queued tasks per bucket".into(),
        x_label: "virtual time (s)".into(),
        y_label: "queued tasks".into(),
        log_x: false,
        series,
    }
    .render()
}
