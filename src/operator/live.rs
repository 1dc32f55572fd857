//! `edge-limiter stats --serve`: a page that redraws itself every few
//! seconds with what the isolates recorded over the last hour (the same
//! report and plot as `stats`), the overrides and blocks in force, and the
//! rules failing open; and `/metrics`, the counters for Prometheus
//! ([`super::metrics`]). Read only: it answers `GET` alone, nothing it serves
//! carries the REST token or URL (the token stays in this process), and on
//! a loopback address it answers only requests addressed to that address,
//! so that a web page elsewhere cannot read it through a rebound DNS name.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    time::{Duration, Instant},
};

use super::{
    limits,
    metrics::{exposition, read_counters, scrape_all, Flavor},
    simulate::{
        clock::format_ms,
        plot::{escape, svg, table_html, Look},
        report::{shown_count, Report, PLACES_TITLE},
    },
    stats::{read_all, report, Span},
};
use crate::{
    decision::{
        stats::{counts::RuleCount, recorder::MINUTE_MS},
        transport::redis_rest::RestClient,
    },
    rules::config::Config,
};

/// How often the page redraws itself, ms.
pub const REDRAW_MS: u64 = 5_000;

/// How long the overrides listed stay before they are read again: each
/// costs two commands, as in `limit list`.
const OVERRIDES_FOR: Duration = Duration::from_secs(30);

/// The longest request head read.
const MAX_HEAD: usize = 16 * 1024;

/// The page: a frame the script fills from `/live`.
const PAGE: &str = include_str!("live/page.html");

/// The script that redraws it.
const SCRIPT: &str = include_str!("live/redraw.js");

/// What the page shows, and where it reads it.
pub struct Live<'a> {
    /// The rules, as the command read them.
    pub config: &'a Config,
    /// The rules shown, in order.
    pub rules: Vec<String>,
    /// The REST endpoint of each region read (the one Redis, the home's
    /// first, or the one `--region` names); their figures are added up.
    pub clients: &'a [RestClient],
    /// How far back the page looks, ms.
    pub window_ms: u64,
    /// The overrides in force as last listed, and when.
    overrides: Option<(Instant, String)>,
    /// The figures as last read, and when: one read serves every page
    /// open for [`REDRAW_MS`], each drawn at its own width.
    shown: Option<(Instant, Shown)>,
}

/// What one read found: the report, the overrides as HTML, and when the
/// isolates last wrote (ms, Redis's clock).
#[derive(Clone)]
struct Shown {
    report: Report,
    overrides: String,
    written_ms: Option<u64>,
}

/// An answer: status, content type, body.
type PageAnswer = (u16, &'static str, String);

impl<'a> Live<'a> {
    /// The page for `rules` of `config`, over the last `window_ms`.
    pub fn new(
        config: &'a Config,
        rules: Vec<String>,
        clients: &'a [RestClient],
        window_ms: u64,
    ) -> Live<'a> {
        Live {
            config,
            rules,
            clients,
            window_ms,
            overrides: None,
            shown: None,
        }
    }

    /// Serves the page on `listener` until the process ends, one
    /// connection at a time, running REST calls on `runtime`.
    pub fn serve(
        &mut self,
        listener: &TcpListener,
        runtime: &tokio::runtime::Runtime,
    ) -> std::io::Result<()> {
        let bound = listener.local_addr()?;
        for stream in listener.incoming() {
            // A client that misbehaves costs its own connection only.
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let answer = match read_head(&mut stream) {
                Some(head) => self.answer(&head, bound, runtime),
                None => (400, "text/plain", "a request head was expected\n".into()),
            };
            let _ = respond(&mut stream, answer);
        }
        Ok(())
    }

    /// The answer to a request whose head is `head`, on a listener bound
    /// to `bound`.
    fn answer(
        &mut self,
        head: &str,
        bound: SocketAddr,
        runtime: &tokio::runtime::Runtime,
    ) -> PageAnswer {
        let mut words = head.lines().next().unwrap_or_default().split(' ');
        let (method, target) = (
            words.next().unwrap_or_default(),
            words.next().unwrap_or_default(),
        );
        if !host_allowed(head, bound) {
            return (
                421,
                "text/plain",
                "this page answers only at the address it was started on\n".into(),
            );
        }
        if method != "GET" {
            return (405, "text/plain", "read only: GET alone\n".into());
        }
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        match path {
            "/" => (
                200,
                "text/html; charset=utf-8",
                PAGE.replace("{redraw_ms}", &REDRAW_MS.to_string()),
            ),
            "/redraw.js" => (200, "text/javascript; charset=utf-8", SCRIPT.into()),
            "/live" => match runtime.block_on(self.figures()) {
                Ok(shown) => match fragment(&shown, self.config, page_width(query)) {
                    Ok(html) => (200, "text/html; charset=utf-8", html),
                    Err(e) => (500, "text/plain", format!("{e}\n")),
                },
                Err(e) => (502, "text/plain", format!("{e}\n")),
            },
            "/metrics" => {
                let flavor = Flavor::accepted(header(head, "accept").unwrap_or_default());
                match runtime.block_on(scrape_all(self.clients, &self.rules, now_ms())) {
                    Ok(c) => (200, flavor.content_type(), exposition(&c, now_ms(), flavor)),
                    Err(e) => (502, "text/plain", format!("{e}\n")),
                }
            }
            _ => (404, "text/plain", "not found\n".into()),
        }
    }

    /// The figures, read at most once per [`REDRAW_MS`].
    async fn figures(&mut self) -> Result<Shown, String> {
        if let Some((at, shown)) = &self.shown {
            if at.elapsed() < Duration::from_millis(REDRAW_MS) {
                return Ok(shown.clone());
            }
        }
        let now_ms = now_ms();
        let span = Span {
            since_ms: now_ms.saturating_sub(self.window_ms),
            until_ms: now_ms,
        };
        let recorded = read_all(self.clients, &self.rules, span)
            .await
            .map_err(|e| e.to_string())?;
        // The newest write of any region's isolates.
        let mut written_ms = None;
        for client in self.clients {
            let counters = read_counters(client, &[], now_ms).await;
            written_ms = written_ms.max(counters.map_err(|e| e.to_string())?.written_ms);
        }
        let shown = Shown {
            report: report(self.config, span, &recorded),
            overrides: self.overrides().await?,
            written_ms,
        };
        self.shown = Some((Instant::now(), shown.clone()));
        Ok(shown)
    }

    /// The overrides and blocks in force, as a list; read again once
    /// [`OVERRIDES_FOR`] old.
    async fn overrides(&mut self) -> Result<String, String> {
        if let Some((at, html)) = &self.overrides {
            if at.elapsed() < OVERRIDES_FOR {
                return Ok(html.clone());
            }
        }
        let mut lines = Vec::new();
        let taking = self.config.rules.iter().filter(|r| r.overrides);
        for rule in taking.filter(|r| self.rules.contains(&r.name)) {
            for (at, client) in self.clients.iter().enumerate() {
                let listed = limits::list(client, rule, false).await;
                for stored in listed.map_err(|e| e.to_string())? {
                    // Each region holds its own: name it where several are read.
                    let region = match self.config.regions.get(at) {
                        Some(r) if self.clients.len() > 1 => format!("[{}] ", r.name),
                        _ => String::new(),
                    };
                    let text = region + &stored.render(&rule.policy);
                    lines.push(format!("<li>{}</li>", escape(&text)));
                }
            }
        }
        let html = match lines.is_empty() {
            true => "<p>None.</p>\n".to_owned(),
            false => format!("<ul>\n{}\n</ul>\n", lines.join("\n")),
        };
        self.overrides = Some((Instant::now(), html.clone()));
        Ok(html)
    }
}

/// The width to draw the plot at for a page that asked with `w=N` in
/// `query`, within what stays readable.
fn page_width(query: &str) -> u32 {
    let asked = query
        .split('&')
        .find_map(|p| p.strip_prefix("w=")?.parse().ok());
    asked.unwrap_or(1000).clamp(360, 1600)
}

/// How old the newest figures are, as a line for the page: a warning when
/// no isolate has written for more than twice `stats_every`.
fn age_line(written_ms: Option<u64>, every_ms: Option<u64>, now_ms: u64) -> String {
    let Some(written) = written_ms else {
        return "<p class=\"stale\">No isolate has written figures yet.</p>\n".to_owned();
    };
    let age_s = now_ms.saturating_sub(written) / 1000;
    match every_ms {
        Some(every) if now_ms.saturating_sub(written) > 2 * every => format!(
            "<p class=\"stale\">No isolate has written for {age_s} s, more than twice \
             stats_every ({} s): no traffic since, or stats writes failing.</p>\n",
            every / 1000
        ),
        _ => format!("<p class=\"age\">The newest figures were written {age_s} s ago.</p>\n"),
    }
}

/// The frame's HTML for a page `width` pixels wide: how old the figures
/// are, the summary stating the span once, the rules failing, the plot and
/// the tables, and the overrides.
fn fragment(shown: &Shown, config: &Config, width: u32) -> Result<String, String> {
    let report = &shown.report;
    let now_ms = now_ms();
    let every_ms = config.stats.map(|s| s.every_ms);
    let mut out = age_line(shown.written_ms, every_ms, now_ms);
    // The figures are per minute: the span shown starts with its first.
    let (since, until) = report.span_ms.unwrap_or_default();
    out.push_str(&format!(
        "<p class=\"summary\">From {} to {}: {} requests, admitted {}, denied (429) {}, refused (400) {}, \
         no rule matched {}, forwarded undecided (fail open) {}, unavailable (503) {}.</p>\n",
        format_ms(since - since % MINUTE_MS),
        format_ms(until),
        report.requests,
        report.admitted,
        report.denied,
        report.refused,
        report.unmatched,
        report.bypassed,
        report.unavailable
    ));
    let failing: Vec<String> = report
        .rules
        .iter()
        .filter(|r| r.counts[RuleCount::FailOpen] + r.counts[RuleCount::FailClosed] > 0)
        .map(|r| {
            format!(
                "<li><b>{}</b>: Redis could not decide; {} requests forwarded undecided (fail open), {} answered 503 (fail closed)</li>",
                escape(&r.name),
                r.counts[RuleCount::FailOpen],
                r.counts[RuleCount::FailClosed]
            )
        })
        .collect();
    if !failing.is_empty() {
        out.push_str(&format!(
            "<div class=\"failing\"><h2>Rules failing</h2>\n<ul>\n{}\n</ul></div>\n",
            failing.join("\n")
        ));
    }
    let look = Look {
        width,
        titled: false,
        now_ms: Some(now_ms),
    };
    out.push_str(&format!("<figure>\n{}\n</figure>\n", svg(report, look)?));
    let (header, rows) = report.rule_rows();
    out.push_str(&format!(
        "<h2>Per rule</h2>\n{}",
        table_html(&header, &rows)
    ));
    let (header, rows) = report.decided_rows();
    out.push_str(&format!(
        "<h2>How they were decided</h2>\n{}",
        table_html(&header, &rows)
    ));
    out.push_str("<h2>Clients most denied</h2>\n");
    if report.top_denied.is_empty() {
        out.push_str("<p>No client was denied.</p>\n");
    } else {
        let rows: Vec<Vec<String>> = report
            .top_denied
            .iter()
            .map(|c| {
                vec![
                    c.client.clone(),
                    c.rule.clone(),
                    shown_count(c.denied, c.over),
                ]
            })
            .collect();
        out.push_str(&table_html(&["client", "rule", "denied"], &rows));
    }
    let (header, rows) = report.places_rows();
    if !rows.is_empty() {
        out.push_str(&format!(
            "<h2>{}</h2>\n{}",
            escape(PLACES_TITLE),
            table_html(&header, &rows)
        ));
    }
    if let Some(note) = report.approximate_note() {
        out.push_str(&format!("<p class=\"note\">{}</p>\n", escape(&note)));
    }
    out.push_str(&format!(
        "<h2>Overrides and blocks in force</h2>\n{}",
        shown.overrides
    ));
    Ok(out)
}

/// Whether the request's `Host` is the address the listener is bound to
/// (any host for a listener on a routable address, which its operator
/// chose to expose).
fn host_allowed(head: &str, bound: SocketAddr) -> bool {
    if !bound.ip().is_loopback() {
        return true;
    }
    let host = header(head, "host").map(str::to_ascii_lowercase);
    let port = bound.port();
    host.is_some_and(|h| {
        [
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ]
        .contains(&h)
    })
}

/// The value of the request head's header `name`, if it has one.
fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().skip(1).find_map(|l| {
        let (n, value) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// The request head: up to the blank line, at most [`MAX_HEAD`] bytes.
fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).ok().filter(|n| *n > 0)?;
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return None;
        }
    }
    String::from_utf8(head).ok()
}

/// Writes `answer` and closes the connection.
fn respond(
    stream: &mut TcpStream,
    (status, content_type, body): PageAnswer,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        421 => "Misdirected Request",
        _ => "Bad Gateway",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\
         Content-Security-Policy: default-src 'self'; style-src 'self' 'unsafe-inline'\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

/// Milliseconds since the epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_page_answers_only_its_own_address() {
        let bound: SocketAddr = "127.0.0.1:8790".parse().unwrap();
        let head = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
        assert!(host_allowed(&head("127.0.0.1:8790"), bound));
        assert!(host_allowed(&head("LOCALHOST:8790"), bound));
        assert!(!host_allowed(&head("evil.example:8790"), bound));
        assert!(!host_allowed("GET / HTTP/1.1\r\n\r\n", bound));
        let open: SocketAddr = "0.0.0.0:8790".parse().unwrap();
        assert!(host_allowed(&head("stats.internal:8790"), open));
    }
}
