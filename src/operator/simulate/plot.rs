//! Admitted and denied requests over time, one panel per rule, drawn with
//! plotters as SVG, and an HTML page that shows the plot with the report.

use plotters::prelude::*;

use super::{
    clock::format_ms,
    report::{Kind, Point, Report, RuleReport, TotalPoint},
};
use crate::decision::stats::counts::RuleCount;

/// Admitted requests' colour.
pub const ADMITTED: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
/// Denied (or, for a shadow rule, would-deny) requests' colour.
pub const DENIED: RGBColor = RGBColor(0xd6, 0x27, 0x28);
/// Requests the rule admitted that another rule denied.
pub const DENIED_BY_OTHERS: RGBColor = RGBColor(0x7f, 0x7f, 0x7f);

/// Requests refused with 400, on the totals panel.
pub const REFUSED: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
/// Requests forwarded undecided, Redis unavailable (fail open).
pub const FAIL_OPEN: RGBColor = RGBColor(0x94, 0x67, 0xbd);
/// Requests answered 503, Redis unavailable (fail closed).
pub const FAIL_CLOSED: RGBColor = RGBColor(0x8c, 0x56, 0x4b);

/// Height of each panel, pixels.
const PANEL: u32 = 260;
/// Height of a line of a panel's head (its caption, then its legend rows).
const HEAD_LINE: i32 = 18;
/// Height of the title, when there is one.
const TITLE: u32 = 40;
/// At most this many points across a panel: buckets grow to keep to it.
const MAX_BUCKETS: u64 = 300;

/// Bucket widths to choose from, seconds: round figures a reader can add up.
const BUCKETS_S: [u64; 16] = [
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21_600, 86_400,
];

/// Steps between the time axis's ticks, seconds: whole seconds, minutes,
/// hours or days.
const TICKS_S: [u64; 20] = [
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400,
    172_800, 604_800,
];

/// How to draw a plot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// Its width, pixels.
    pub width: u32,
    /// Whether it states its span in a title of its own; a page that
    /// states it elsewhere draws none, so that it is said once.
    pub titled: bool,
    /// Now (ms), for figures still being counted: the bucket holding it is
    /// drawn dashed, as partial. `None` for a replay, whose log has ended.
    pub now_ms: Option<u64>,
}

impl Look {
    /// A plot written to a file, of figures counted up to `now_ms` when
    /// they may still grow.
    pub fn file(now_ms: Option<u64>) -> Look {
        Look {
            width: 1000,
            titled: true,
            now_ms,
        }
    }
}

/// The bucket width for figures spanning `span_s` seconds, counted in
/// buckets of `least_s` (no point drawn finer than the figures).
fn bucket_for(span_s: u64, least_s: u64) -> u64 {
    BUCKETS_S
        .iter()
        .copied()
        .find(|b| *b >= least_s && span_s / b < MAX_BUCKETS)
        .unwrap_or_else(|| (span_s / MAX_BUCKETS + 1).max(least_s))
}

/// Counts summed into the axis's buckets, every bucket present (empty ones
/// as 0), so that a line falls to zero between bursts rather than joining
/// them: each bucket's start (s) and count.
fn bucketed(counts: &[(u64, u64)], axis: Axis) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = (0..axis.buckets)
        .map(|i| (axis.start + i * axis.bucket, 0))
        .collect();
    for (start_s, n) in counts {
        let i = (start_s.saturating_sub(axis.start) / axis.bucket) as usize;
        if let Some(b) = out.get_mut(i) {
            b.1 += n;
        }
    }
    out
}

/// A tick's label: the time of day, to the minute when ticks fall on whole
/// minutes, with the date over a day or more.
fn label(seconds: u64, axis: Axis) -> String {
    let text = format_ms(seconds * 1000);
    // 2026-11-20T10:00:00Z
    match (axis.span >= 86_400, axis.tick.is_multiple_of(60)) {
        (true, _) => format!("{} {}", &text[5..10], &text[11..16]),
        (false, true) => text[11..16].to_owned(),
        (false, false) => text[11..19].to_owned(),
    }
}

/// The time axis every panel shares: buckets of `bucket` seconds from
/// `start`, the last starting at `last`, where the data ends; ticks every
/// `tick` seconds; over figures spanning `span` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Axis {
    start: u64,
    last: u64,
    buckets: u64,
    bucket: u64,
    tick: u64,
    span: u64,
}

impl Axis {
    fn of(report: &Report, width: u32) -> Axis {
        let (first, last) = report.span_ms.map_or((0, 0), |(a, b)| (a / 1000, b / 1000));
        let span = last - first + 1;
        let bucket = bucket_for(span, (report.bucket_ms / 1000).max(1));
        // Buckets start on a multiple of their width, as a reader would count them.
        let start = first - first % bucket;
        let buckets = (last - start) / bucket + 1;
        let last = start + (buckets - 1) * bucket;
        // A label takes about 90 pixels.
        let most = u64::from(width / 90).clamp(2, 12);
        let tick = TICKS_S
            .iter()
            .copied()
            .find(|t| *t >= bucket && (last - start) / t < most)
            .unwrap_or(604_800);
        Axis {
            start,
            last,
            buckets,
            bucket,
            tick,
            span,
        }
    }

    /// The time drawn: from the first bucket to the last, where the data ends.
    fn range(self) -> std::ops::Range<u64> {
        self.start..self.last.max(self.start + 1)
    }

    /// Where the ticks fall: every whole multiple of `tick` drawn.
    fn ticks(self) -> Vec<u64> {
        let first = self.start.div_ceil(self.tick) * self.tick;
        (first..=self.last).step_by(self.tick as usize).collect()
    }

    /// Whether the last bucket is still being counted at `now_ms`.
    fn partial(self, now_ms: Option<u64>) -> bool {
        now_ms.is_some_and(|now| now / 1000 < self.last + self.bucket)
    }
}

/// A drawing failure, as text.
fn failed<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    format!("drawing the plot: {e}")
}

/// One line of a panel: its colour, its name in the legend, and its
/// counts by start (s).
struct Line {
    color: RGBColor,
    name: &'static str,
    counts: Vec<(u64, u64)>,
}

/// One panel: what its caption says, and its lines.
struct Panel {
    caption: String,
    lines: Vec<Line>,
}

/// Which figure of a [`TotalPoint`] a line draws.
type TotalPick = fn(&TotalPoint) -> u64;

/// The panel of every request: admitted and denied, and where there were
/// any, refused, forwarded undecided and answered 503.
fn totals_panel(report: &Report) -> Panel {
    let pick = |f: TotalPick| -> Vec<(u64, u64)> {
        report
            .totals_series
            .iter()
            .map(|p| (p.start_s, f(p)))
            .collect()
    };
    let mut lines = vec![
        Line {
            color: ADMITTED,
            name: "admitted",
            counts: pick(|p| p.admitted),
        },
        Line {
            color: DENIED,
            name: "denied (429)",
            counts: pick(|p| p.denied),
        },
    ];
    let mut caption = format!(
        "every request: {} requests, {} admitted, {} denied",
        report.requests, report.admitted, report.denied
    );
    let more: [(u64, RGBColor, &str, TotalPick); 3] = [
        (report.refused, REFUSED, "refused (400)", |p| p.refused),
        (report.bypassed, FAIL_OPEN, "fail open", |p| p.bypassed),
        (report.unavailable, FAIL_CLOSED, "fail closed (503)", |p| {
            p.unavailable
        }),
    ];
    for (total, color, name, f) in more {
        if total > 0 {
            caption.push_str(&format!(", {total} {name}"));
            lines.push(Line {
                color,
                name,
                counts: pick(f),
            });
        }
    }
    Panel { caption, lines }
}

/// A rule's panel: admitted and denied requests, and those another rule
/// denied where there are any; its caption has the report's counts, so
/// that its lines add up to what it says.
fn rule_panel(rule: &RuleReport, points: &[Point]) -> Panel {
    let c = &rule.counts;
    let (denied, verb) = match rule.shadow {
        true => (c[RuleCount::ShadowWouldDeny], "would deny"),
        false => (c[RuleCount::Denied], "denied"),
    };
    let others = match c[RuleCount::DeniedByOthers] {
        0 => String::new(),
        n => format!(", {n} denied by other rules"),
    };
    let caption = format!(
        "{}{}: {} matched, {} admitted, {denied} {verb}{others}",
        rule.name,
        if rule.shadow { " (shadow)" } else { "" },
        c[RuleCount::Matched],
        c[RuleCount::Admitted],
    );
    let pick = |f: fn(&Point) -> u64| -> Vec<(u64, u64)> {
        points.iter().map(|p| (p.start_s, f(p))).collect()
    };
    let mut lines = vec![
        Line {
            color: ADMITTED,
            name: "admitted",
            counts: pick(|p| p.admitted),
        },
        Line {
            color: DENIED,
            name: verb,
            counts: pick(|p| p.denied),
        },
    ];
    if c[RuleCount::DeniedByOthers] > 0 {
        let counts = pick(|p| p.denied_by_others);
        lines.push(Line {
            color: DENIED_BY_OTHERS,
            name: "denied by other rules",
            counts,
        });
    }
    Panel { caption, lines }
}

/// The plot as an SVG document: every request's panel, then a panel per
/// rule, over one time axis.
pub fn svg(report: &Report, look: Look) -> Result<String, String> {
    let axis = Axis::of(report, look.width);
    let mut panels = vec![totals_panel(report)];
    panels.extend((report.rules.iter().zip(&report.series)).map(|(r, p)| rule_panel(r, p)));
    let title = if look.titled { TITLE } else { 0 };
    let height = title + PANEL * panels.len() as u32;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (look.width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(failed)?;
        let (head, body) = root.split_vertically(title);
        if look.titled {
            let text = format!(
                "edge-limiter {}: requests per {} s, {} to {}",
                command(report),
                axis.bucket,
                format_ms(axis.start * 1000),
                format_ms((axis.last + axis.bucket) * 1000)
            );
            head.titled(&text, ("sans-serif", 18)).map_err(failed)?;
        }
        let areas = body.split_evenly((panels.len(), 1));
        for (area, panel) in areas.iter().zip(&panels) {
            draw_panel(area, panel, axis, look)?;
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

/// One panel: its caption and legend above the data, then its lines per
/// bucket, the last segment dashed while its bucket is still counted.
fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    panel: &Panel,
    axis: Axis,
    look: Look,
) -> Result<(), String> {
    // A narrow plot puts the rule's name above its counts.
    let caption = match (look.width < 640, panel.caption.split_once(": ")) {
        (true, Some((name, counts))) => vec![name.to_owned(), counts.to_owned()],
        _ => vec![panel.caption.clone()],
    };
    let partial = axis.partial(look.now_ms);
    let mut legend: Vec<(ShapeStyle, &str)> = (panel.lines.iter())
        .map(|l| (l.color.stroke_width(3), l.name))
        .collect();
    if partial {
        legend.push((BLACK.mix(0.45).stroke_width(2), "dashed: still counting"));
    }
    // The legend's entries, in rows that fit the width: (x, row) each.
    let mut placed = Vec::with_capacity(legend.len());
    let (mut x, mut row) = (12, 0);
    for (_, name) in &legend {
        let wide = 36 + 7 * name.len() as i32;
        if x > 12 && x + wide > look.width as i32 - 12 {
            (x, row) = (12, row + 1);
        }
        placed.push((x, row));
        x += wide;
    }
    let rows = placed.last().map_or(0, |(_, r)| r + 1);
    let height = HEAD_LINE * (caption.len() as i32 + rows) + 10;
    let (head, data) = area.split_vertically(height as u32);
    let caption_style = ("sans-serif", 16).into_font().color(&BLACK);
    for (i, text) in caption.iter().enumerate() {
        let y = 4 + HEAD_LINE * i as i32;
        head.draw(&Text::new(text.as_str(), (12, y), caption_style.clone()))
            .map_err(failed)?;
    }
    let legend_style = ("sans-serif", 13).into_font().color(&BLACK.mix(0.8));
    for ((style, name), (x, row)) in legend.into_iter().zip(placed) {
        let y = 6 + HEAD_LINE * (caption.len() as i32 + row);
        head.draw(&PathElement::new(vec![(x, y + 7), (x + 18, y + 7)], style))
            .map_err(failed)?;
        head.draw(&Text::new(name, (x + 24, y), legend_style.clone()))
            .map_err(failed)?;
    }
    let series: Vec<Vec<(u64, u64)>> = (panel.lines.iter())
        .map(|l| bucketed(&l.counts, axis))
        .collect();
    let top = (series.iter().flatten())
        .map(|b| b.1)
        .max()
        .unwrap_or(0)
        .max(1);
    let top = top + top / 10 + 1;
    let mut chart = ChartBuilder::on(&data)
        .margin(8)
        .margin_right(24)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(axis.range().with_key_points(axis.ticks()), 0u64..top)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .y_labels(5)
        .x_label_formatter(&|s| label(*s, axis))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 13))
        .y_desc("requests")
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(failed)?;
    for (line, points) in panel.lines.iter().zip(&series) {
        let settled = match partial {
            true => points.len().saturating_sub(1),
            false => points.len(),
        };
        chart
            .draw_series(LineSeries::new(
                points[..settled].iter().copied(),
                line.color.stroke_width(2),
            ))
            .map_err(failed)?;
        if partial && points.len() >= 2 {
            let tail = points[points.len() - 2..].iter().copied();
            let style = line.color.mix(0.6).stroke_width(2);
            chart
                .draw_series(DashedLineSeries::new(tail, 6, 4, style))
                .map_err(failed)?;
        }
    }
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
pub fn html(report: &Report, source: &str, look: Look) -> Result<String, String> {
    let svg = svg(report, look)?;
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
    }

    /// Minutes from 09:56:09 to 10:04:09, as `stats` reads them.
    fn eight_minutes() -> Report {
        let at = |m: u64| 1_795_168_800_000 - 4 * 60_000 + m * 60_000;
        Report {
            kind: Kind::Recorded,
            span_ms: Some((at(0) + 9_000, at(8) + 9_000)),
            bucket_ms: 60_000,
            ..Report::default()
        }
    }

    #[test]
    fn the_axis_ends_at_the_data_and_ticks_fall_on_whole_minutes() {
        let axis = Axis::of(&eight_minutes(), 1000);
        let minute = |m: u64| (1_795_168_800 - 4 * 60) + m * 60;
        assert_eq!(
            (axis.start, axis.last, axis.bucket),
            (minute(0), minute(8), 60)
        );
        assert_eq!(
            axis.range(),
            minute(0)..minute(8),
            "no minute past the data"
        );
        assert_eq!(axis.tick, 60);
        assert!(axis.ticks().iter().all(|t| t % 60 == 0));
        assert_eq!(label(minute(4), axis), "10:00");
        // A phone's width: fewer ticks, still on whole minutes.
        let narrow = Axis::of(&eight_minutes(), 360);
        assert_eq!(narrow.tick, 300);
        assert_eq!(narrow.ticks(), [minute(4)]);
        // A week: ticks on whole days.
        let week = Report {
            span_ms: Some((0, 7 * 86_400_000)),
            ..eight_minutes()
        };
        let axis = Axis::of(&week, 1000);
        assert_eq!((axis.bucket, axis.tick), (3600, 86_400));
        assert_eq!(label(86_400, axis), "01-02 00:00");
    }

    #[test]
    fn the_minute_still_counted_is_partial() {
        let axis = Axis::of(&eight_minutes(), 1000);
        let ms = |s: u64| s * 1000;
        assert!(axis.partial(Some(ms(axis.last + 59))));
        assert!(!axis.partial(Some(ms(axis.last + 60))), "over: complete");
        assert!(!axis.partial(None), "a replay's log has ended");
    }

    #[test]
    fn counts_fill_every_bucket() {
        let axis = Axis {
            start: 100,
            last: 104,
            buckets: 3,
            bucket: 2,
            tick: 2,
            span: 5,
        };
        assert_eq!(
            bucketed(&[(100, 2), (101, 1), (104, 3)], axis),
            [(100, 3), (102, 0), (104, 3)]
        );
    }

    #[test]
    fn the_legend_sits_above_the_data_and_a_page_draws_no_title() {
        let mut report = eight_minutes();
        report.requests = 3;
        report.admitted = 3;
        report.totals_series = vec![TotalPoint {
            start_s: 1_795_168_800,
            admitted: 3,
            ..TotalPoint::default()
        }];
        let look = Look {
            width: 1000,
            titled: false,
            now_ms: report.span_ms.map(|s| s.1),
        };
        let page = svg(&report, look).unwrap();
        assert!(
            !page.contains("edge-limiter stats:"),
            "the page states the span"
        );
        assert!(page.contains("every request: 3 requests, 3 admitted, 0 denied"));
        assert!(page.contains("dashed: still counting"));
        let file = svg(&report, Look::file(None)).unwrap();
        assert!(file.contains("edge-limiter stats: requests per 60 s, "));
        assert!(!file.contains("dashed: still counting"));
    }
}
