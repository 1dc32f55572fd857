//! Admitted and denied requests over time, one panel per rule, drawn with
//! plotters as SVG, and an HTML page that shows the plot with the report.

use plotters::prelude::*;

use super::{
    clock::format_ms,
    report::{Kind, Point, Report, RuleReport},
};
use crate::decision::stats::counts::RuleCount;

/// Admitted requests' colour.
pub const ADMITTED: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
/// Denied (or, for a shadow rule, would-deny) requests' colour.
pub const DENIED: RGBColor = RGBColor(0xd6, 0x27, 0x28);
/// Requests the rule admitted that another rule denied.
pub const DENIED_BY_OTHERS: RGBColor = RGBColor(0x7f, 0x7f, 0x7f);

/// The plot's width, pixels.
const WIDTH: u32 = 1000;
/// Height of each rule's panel, pixels.
const PANEL: u32 = 260;
/// At most this many points across a panel: buckets grow to keep to it.
const MAX_BUCKETS: u64 = 300;

/// Bucket widths to choose from, seconds: round figures a reader can add up.
const BUCKETS_S: [u64; 16] = [
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21_600, 86_400,
];

/// The bucket width for figures spanning `span_s` seconds, counted in
/// buckets of `least_s` (no point drawn finer than the figures).
fn bucket_for(span_s: u64, least_s: u64) -> u64 {
    BUCKETS_S
        .iter()
        .copied()
        .find(|b| *b >= least_s && span_s / b < MAX_BUCKETS)
        .unwrap_or_else(|| (span_s / MAX_BUCKETS + 1).max(least_s))
}

/// One bucket of a panel: its start (s), then requests admitted, denied by
/// the rule, and denied by other rules.
type Bucket = (u64, u64, u64, u64);

/// Which count of a bucket a line draws.
type Pick = fn(&Bucket) -> u64;

/// A rule's points summed into buckets of `bucket` seconds from `start`,
/// every bucket present (empty ones as 0), so the lines fall to zero
/// between bursts rather than joining them.
fn bucketed(points: &[Point], start: u64, buckets: u64, bucket: u64) -> Vec<Bucket> {
    let mut out: Vec<Bucket> = (0..buckets)
        .map(|i| (start + i * bucket, 0, 0, 0))
        .collect();
    for p in points {
        let i = ((p.start_s - start) / bucket) as usize;
        if let Some(b) = out.get_mut(i) {
            b.1 += p.admitted;
            b.2 += p.denied;
            b.3 += p.denied_by_others;
        }
    }
    out
}

fn label(seconds: u64, span_s: u64) -> String {
    let text = format_ms(seconds * 1000);
    // 2026-11-20T10:00:00Z: the date only matters over a day or more.
    if span_s < 86_400 {
        text[11..19].to_owned()
    } else {
        format!("{} {}", &text[5..10], &text[11..16])
    }
}

/// The time axis every panel shares: seconds from `start` to `end`, in
/// `buckets` buckets of `bucket` seconds, over a log of `span` seconds.
#[derive(Debug, Clone, Copy)]
struct Axis {
    start: u64,
    end: u64,
    buckets: u64,
    bucket: u64,
    span: u64,
}

impl Axis {
    fn of(report: &Report) -> Axis {
        let (first, last) = report.span_ms.map_or((0, 0), |(a, b)| (a / 1000, b / 1000));
        let span = last - first + 1;
        let bucket = bucket_for(span, (report.bucket_ms / 1000).max(1));
        // Buckets start on a multiple of their width, as a reader would count them.
        let start = first - first % bucket;
        let buckets = (last - start) / bucket + 1;
        Axis {
            start,
            end: start + buckets * bucket,
            buckets,
            bucket,
            span,
        }
    }
}

/// A drawing failure, as text.
fn failed<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    format!("drawing the plot: {e}")
}

/// The plot as an SVG document.
pub fn svg(report: &Report) -> Result<String, String> {
    let axis = Axis::of(report);
    let rules = report.rules.len().max(1) as u32;
    let mut out = String::new();
    {
        let root =
            SVGBackend::with_string(&mut out, (WIDTH, 40 + PANEL * rules)).into_drawing_area();
        root.fill(&WHITE).map_err(failed)?;
        let (title, body) = root.split_vertically(40);
        title
            .titled(
                &format!(
                    "edge-limiter {}: requests per {} s, {} to {}",
                    command(report),
                    axis.bucket,
                    format_ms(axis.start * 1000),
                    format_ms(axis.end * 1000)
                ),
                ("sans-serif", 20),
            )
            .map_err(failed)?;
        let panels = body.split_evenly((rules as usize, 1));
        for ((panel, rule), points) in panels.iter().zip(&report.rules).zip(&report.series) {
            draw_panel(panel, rule, points, axis)?;
        }
        root.present().map_err(failed)?;
    }
    Ok(out)
}

/// The command whose report it is.
fn command(report: &Report) -> &'static str {
    match report.kind {
        Kind::Replayed => "simulate",
        Kind::Recorded => "stats",
    }
}

/// A panel's caption: the same counts as the report's table, so that its
/// lines add up to what it says.
fn caption(rule: &RuleReport) -> String {
    let c = &rule.counts;
    let (denied, verb) = match rule.shadow {
        true => (c[RuleCount::ShadowWouldDeny], "would deny"),
        false => (c[RuleCount::Denied], "denied"),
    };
    let others = match c[RuleCount::DeniedByOthers] {
        0 => String::new(),
        n => format!(", {n} denied by other rules"),
    };
    format!(
        "{}{}: {} matched, {} admitted, {denied} {verb}{others}",
        rule.name,
        if rule.shadow { " (shadow)" } else { "" },
        c[RuleCount::Matched],
        c[RuleCount::Admitted],
    )
}

/// One rule's panel: admitted and denied requests per bucket, and those
/// another rule denied where there are any.
fn draw_panel(
    panel: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    rule: &RuleReport,
    points: &[Point],
    axis: Axis,
) -> Result<(), String> {
    let series = bucketed(points, axis.start, axis.buckets, axis.bucket);
    let top = series
        .iter()
        .map(|b| b.1.max(b.2).max(b.3))
        .max()
        .unwrap_or(0)
        .max(1);
    let top = top + top / 10 + 1;
    let mut chart = ChartBuilder::on(panel)
        .caption(caption(rule), ("sans-serif", 16))
        .margin(12)
        .margin_right(40)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(axis.start..axis.end, 0u64..top)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_labels(8)
        .y_labels(5)
        .x_label_formatter(&|s| label(*s, axis.span))
        .y_desc("requests")
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(failed)?;
    let denied_label = if rule.shadow { "would deny" } else { "denied" };
    let mut lines: Vec<(RGBColor, &str, Pick)> = vec![
        (ADMITTED, "admitted", |b| b.1),
        (DENIED, denied_label, |b| b.2),
    ];
    if rule.counts[RuleCount::DeniedByOthers] > 0 {
        lines.push((DENIED_BY_OTHERS, "denied by other rules", |b| b.3));
    }
    for (color, name, pick) in lines {
        let line = series.iter().map(|b| (b.0, pick(b)));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(failed)?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()
        .map_err(failed)?;
    Ok(())
}

/// Text made safe inside HTML.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An HTML table of `header` and `rows`, every cell escaped.
pub fn table_html(header: &[&str], rows: &[Vec<String>]) -> String {
    let head: String = header
        .iter()
        .map(|h| format!("<th>{}</th>", escape(h)))
        .collect();
    let body: String = rows
        .iter()
        .map(|r| {
            let cells: String = r
                .iter()
                .map(|c| format!("<td>{}</td>", escape(c)))
                .collect();
            format!("<tr>{cells}</tr>\n")
        })
        .collect();
    format!("<table>\n<tr>{head}</tr>\n{body}</table>\n")
}

/// A page with the plot inline and the per-rule table under it.
pub fn html(report: &Report, source: &str) -> Result<String, String> {
    let svg = svg(report)?;
    let (header, rows) = report.rule_rows();
    let table = table_html(&header, &rows);
    let by = match report.kind {
        Kind::Replayed => format!("Decided by {}.", report.engine),
        Kind::Recorded => "As the isolates recorded them.".to_owned(),
    };
    let summary = format!(
        "{} requests: admitted {}, denied (429) {}, refused (400) {}; no rule matched {}. {by}",
        report.requests, report.admitted, report.denied, report.refused, report.unmatched,
    );
    Ok(format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>edge-limiter {command}: {title}</title>\n<style>\n\
         body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}\n\
         table {{ border-collapse: collapse; margin-top: 1em; }}\n\
         th, td {{ border: 1px solid #bbb; padding: 0.25em 0.6em; }}\n\
         td {{ text-align: right; }} td:first-child, td:nth-child(2) {{ text-align: left; }}\n\
         </style>\n</head>\n<body>\n<h1>edge-limiter {command}: {title}</h1>\n<p>{summary}</p>\n\
         <figure>\n{svg}\n</figure>\n{table}</body>\n</html>\n",
        title = escape(source),
        summary = escape(&summary),
        command = command(report),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_panels_readable() {
        assert_eq!(bucket_for(1, 1), 1);
        assert_eq!(bucket_for(299, 1), 1);
        assert_eq!(bucket_for(300, 1), 2);
        assert_eq!(bucket_for(3600, 1), 15);
        assert_eq!(bucket_for(7 * 86_400, 1), 3600);
        // Figures counted per minute are never drawn finer.
        assert_eq!(bucket_for(3600, 60), 60);
        assert_eq!(bucket_for(7 * 86_400, 60), 3600);
        let points = [
            Point {
                start_s: 100,
                admitted: 2,
                denied: 1,
                denied_by_others: 4,
            },
            Point {
                start_s: 104,
                admitted: 3,
                ..Point::default()
            },
        ];
        assert_eq!(
            bucketed(&points, 100, 3, 2),
            [(100, 2, 1, 4), (102, 0, 0, 0), (104, 3, 0, 0)]
        );
    }
}
