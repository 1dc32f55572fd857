//! Request logs read into the requests the worker would have seen: CSV with
//! a header row, the Common (or Combined) Log Format, and Cloudflare Logpush
//! HTTP-request JSON lines. A line that cannot be read is an error for that
//! line only; reading goes on.

use std::{
    borrow::Cow,
    collections::HashMap,
    io::{BufRead, Read},
};

use serde::Deserialize;

use super::clock;
use crate::rules::request::{CfField, RequestMeta};

/// How far out of order a log's requests may come and still be decided in
/// time order: nginx and Apache write a request when it ends, and Logpush
/// batches overlap. Requests later than this are decided at the latest time
/// already reached, and counted.
pub const REORDER_MS: u64 = 60_000;

/// A log format the simulator reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated values with a header row naming the columns.
    Csv,
    /// The Common Log Format, and its Combined extension (referer, user agent).
    Clf,
    /// Cloudflare Logpush HTTP requests, one JSON object a line.
    Logpush,
}

impl Format {
    /// The format's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Clf => "clf",
            Format::Logpush => "logpush",
        }
    }

    /// Where a line of the format says how long its response took, if it
    /// can.
    pub fn durations(self) -> Option<&'static str> {
        match self {
            Format::Csv => Some("a duration_ms column"),
            Format::Clf => None,
            Format::Logpush => Some("EdgeEndTimestamp"),
        }
    }

    /// The format a log's first line looks like, if any.
    pub fn guess(first_line: &str) -> Option<Format> {
        let line = first_line.trim_start_matches('\u{feff}').trim();
        if line.starts_with('{') {
            Some(Format::Logpush)
        } else if parse_clf(line, None).is_ok() {
            Some(Format::Clf)
        } else if csv_columns(line).is_ok_and(|c| c.time.is_some()) {
            Some(Format::Csv)
        } else {
            None
        }
    }
}

/// One request from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// 1-based line of the log it came from.
    pub line: u64,
    /// When it arrived, epoch milliseconds.
    pub time_ms: u64,
    /// The request as the rules see it.
    pub request: RequestMeta,
    /// The origin's status code, when the log has it. Kept for rules that
    /// count responses by status (`count_status`).
    pub status: Option<u16>,
    /// How long its response took to end, ms, when the log tells: when an
    /// in-flight limit's slot comes back.
    pub duration_ms: Option<u64>,
}

/// What a line gives: arrival (epoch ms), request, status and duration (ms).
type Line = (u64, RequestMeta, Option<u16>, Option<u64>);

/// A line that could not be read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line number.
    pub line: u64,
    /// What is wrong with it.
    pub reason: String,
    /// The line's start, for the report.
    pub text: String,
}

/// What keeps a whole log from being read.
#[derive(Debug)]
#[non_exhaustive]
pub enum LogError {
    /// Reading the file failed.
    Io(std::io::Error),
    /// `--format` was not given and the log holds nothing to guess it from.
    Empty,
    /// `--format` was not given and the first non-blank line fits none:
    /// its number and its start.
    Unrecognized(u64, String),
    /// The CSV header row lacks a column the simulator needs.
    Columns(String),
}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogError::Io(e) => write!(f, "cannot read the log: {e}"),
            LogError::Empty => write!(f, "the log is empty"),
            LogError::Unrecognized(n, line) => write!(
                f,
                "the log's first non-blank line is neither CSV with a `time` column, the Common \
                 Log Format, nor Logpush JSON; name the format with --format (line {n}: {line:?})"
            ),
            LogError::Columns(why) => write!(f, "CSV header row: {why}"),
        }
    }
}

impl std::error::Error for LogError {}

impl From<std::io::Error> for LogError {
    fn from(e: std::io::Error) -> LogError {
        LogError::Io(e)
    }
}

/// Reads records from a log, one at a time.
pub struct LogReader<R> {
    input: R,
    format: Format,
    /// A CSV log's columns.
    columns: Columns,
    /// Host for records whose format carries none (CLF).
    default_host: String,
    /// Lines read so far (the last one's number).
    line: u64,
    buf: Vec<u8>,
    /// The input failed: nothing more can be read from it.
    failed: bool,
    /// Bytes read, for a progress bar.
    bytes: u64,
    /// The line whose look decided the format, when it was guessed.
    guessed_from: Option<u64>,
}

/// Column positions of a CSV log.
#[derive(Debug, Default, Clone)]
struct Columns {
    time: Option<usize>,
    ip: Option<usize>,
    method: Option<usize>,
    path: Option<usize>,
    host: Option<usize>,
    status: Option<usize>,
    duration_ms: Option<usize>,
    /// `header:NAME` columns, names lower-cased.
    headers: Vec<(String, usize)>,
    /// `cookie:NAME` columns.
    cookies: Vec<(String, usize)>,
    /// `cf:NAME` columns: facts of `request.cf` (`cf:colo` also routes a
    /// request to its region).
    cf: Vec<(CfField, usize)>,
}

fn csv_columns(header_line: &str) -> Result<Columns, LogError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(header_line.as_bytes());
    let mut row = csv::StringRecord::new();
    match reader.read_record(&mut row) {
        Ok(true) => columns_of(&row),
        _ => Err(LogError::Columns("no header row".into())),
    }
}

fn columns_of(row: &csv::StringRecord) -> Result<Columns, LogError> {
    let mut c = Columns::default();
    for (i, name) in row.iter().enumerate() {
        let name = name.trim().trim_start_matches('\u{feff}');
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            "time" => c.time = Some(i),
            "ip" => c.ip = Some(i),
            "method" => c.method = Some(i),
            "path" => c.path = Some(i),
            "host" => c.host = Some(i),
            "status" => c.status = Some(i),
            "duration_ms" => c.duration_ms = Some(i),
            _ => {
                let cf = lower.strip_prefix("cf:");
                if let Some(h) = lower.strip_prefix("header:") {
                    c.headers.push((h.to_owned(), i));
                } else if let Some(f) =
                    cf.and_then(|n| CfField::ALL.into_iter().find(|f| f.name() == n))
                {
                    c.cf.push((f, i));
                } else if let Some(k) = name
                    .strip_prefix("cookie:")
                    .or(name.strip_prefix("Cookie:"))
                {
                    c.cookies.push((k.to_owned(), i));
                }
                // Other columns are the log's own business.
            }
        }
    }
    let missing: Vec<&str> = [
        ("time", c.time),
        ("ip", c.ip),
        ("method", c.method),
        ("path", c.path),
    ]
    .iter()
    .filter(|(_, at)| at.is_none())
    .map(|(name, _)| *name)
    .collect();
    if missing.is_empty() {
        Ok(c)
    } else {
        Err(LogError::Columns(format!(
            "missing column(s) {}; the header row must name time, ip, method and path \
             (and may name host, status, duration_ms, header:NAME, cookie:NAME)",
            missing.join(", ")
        )))
    }
}

/// How much of a bad line the report quotes.
const EXCERPT: usize = 120;

fn excerpt(text: &str) -> String {
    let text = text.trim_end_matches(['\r', '\n']);
    let mut out: String = text.chars().take(EXCERPT).collect();
    if text.chars().count() > EXCERPT {
        out.push('…');
    }
    out
}

/// A path that may carry a query, split in two.
fn split_target(target: &str) -> (&str, Option<&str>) {
    let target = target.split('#').next().unwrap_or_default();
    match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    }
}

/// A host without its port, as the worker's URL gives it.
fn without_port(host: &str) -> &str {
    let host = host.trim();
    let without_port = if host.starts_with('[') {
        host.split_inclusive(']').next().unwrap_or(host)
    } else {
        host.rsplit_once(':').map_or(host, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        })
    };
    without_port
}

/// Builds the request the worker would see.
struct RequestParts<'a> {
    method: &'a str,
    host: &'a str,
    target: &'a str,
    ip: &'a str,
    user_agent: Option<&'a str>,
    headers: Vec<(String, String)>,
    cookies: Vec<String>,
    cf: Vec<(CfField, String)>,
}

impl RequestParts<'_> {
    fn build(self) -> RequestMeta {
        // An absolute-form target (`GET http://host/path`) names its host.
        let (host, target) = match self
            .target
            .strip_prefix("http://")
            .or_else(|| self.target.strip_prefix("https://"))
        {
            Some(rest) => {
                let at = rest.find('/').unwrap_or(rest.len());
                (&rest[..at], if at < rest.len() { &rest[at..] } else { "/" })
            }
            None => (self.host, self.target),
        };
        let (path, query) = split_target(target);
        let mut headers = Vec::with_capacity(self.headers.len() + 3);
        if !self.ip.is_empty() && self.ip != "-" {
            headers.push(("cf-connecting-ip".to_owned(), self.ip.to_owned()));
        }
        if let Some(ua) = self.user_agent.filter(|ua| !ua.is_empty() && *ua != "-") {
            headers.push(("user-agent".to_owned(), ua.to_owned()));
        }
        if !self.cookies.is_empty() {
            headers.push(("cookie".to_owned(), self.cookies.join("; ")));
        }
        headers.extend(self.headers);
        let mut meta = RequestMeta::new(self.method, without_port(host), path, query, headers);
        meta.cf = self.cf;
        meta
    }
}

fn is_method(m: &str) -> bool {
    !m.is_empty() && m.len() <= 20 && m.bytes().all(|b| b.is_ascii_alphabetic())
}

/// One CLF line: `ip ident user [time] "METHOD target PROTO" status bytes`,
/// optionally followed by `"referer" "user agent"` (Combined).
fn parse_clf(line: &str, host: Option<&str>) -> Result<Line, String> {
    let (ip, rest) = line
        .split_once(' ')
        .ok_or("no client address followed by a space")?;
    let open = rest.find('[').ok_or("no [time]")?;
    let close = rest[open..]
        .find(']')
        .ok_or("no closing ] after the time")?
        + open;
    let time_ms = clock::clf_ms(&rest[open + 1..close])
        .ok_or_else(|| format!("unreadable time {:?}", &rest[open + 1..close]))?;
    let rest = rest[close + 1..]
        .trim_start()
        .strip_prefix('"')
        .ok_or("no quoted request after the time")?;
    let (request, rest) = quoted(rest).ok_or("the request's quotes do not close")?;
    let mut words = request.split(' ');
    let (method, target) = match (words.next(), words.next()) {
        (Some(m), Some(t)) if is_method(m) && !t.is_empty() => (m, t),
        _ => return Err("the quoted request is not `METHOD target PROTOCOL`".into()),
    };
    let mut fields = rest.trim_start().splitn(3, ' ');
    let status = match fields.next() {
        Some(s) if s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
        Some("-") => None,
        _ => return Err("no status code after the request".into()),
    };
    let after_bytes = fields.nth(1).unwrap_or_default();
    // Combined: "referer" "user agent".
    let user_agent = after_bytes
        .trim_start()
        .strip_prefix('"')
        .and_then(quoted)
        .and_then(|(_, rest)| rest.trim_start().strip_prefix('"').and_then(quoted))
        .map(|(ua, _)| ua);
    let meta = RequestParts {
        method,
        host: host.unwrap_or_default(),
        target,
        ip,
        user_agent: user_agent.as_deref(),
        headers: vec![],
        cookies: vec![],
        cf: vec![],
    }
    .build();
    Ok((time_ms, meta, status, None))
}

/// The text up to the closing `"` (a `\"` inside is a quote, as nginx and
/// Apache escape it), unescaped, and what follows the quote. Borrowed when
/// there is nothing to unescape, as in most lines.
fn quoted(text: &str) -> Option<(Cow<'_, str>, &str)> {
    let end = text.find(['"', '\\'])?;
    if text.as_bytes()[end] == b'"' {
        return Some((Cow::Borrowed(&text[..end]), &text[end + 1..]));
    }
    let mut out = String::from(&text[..end]);
    let mut chars = text[end..].char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((Cow::Owned(out), &text[end + i + 1..])),
            '\\' => match chars.next() {
                Some((_, '"')) => out.push('"'),
                Some((_, '\\')) => out.push('\\'),
                Some((_, other)) => {
                    out.push('\\');
                    out.push(other);
                }
                None => return None,
            },
            c => out.push(c),
        }
    }
    None
}

/// A Logpush timestamp: RFC 3339 text, or an epoch number in any unit.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stamp {
    Number(serde_json::Number),
    Text(String),
}

/// The fields of a Logpush HTTP request the simulator reads.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Logpush {
    edge_start_timestamp: Option<Stamp>,
    edge_end_timestamp: Option<Stamp>,
    #[serde(rename = "ClientIP")]
    client_ip: Option<String>,
    client_request_method: Option<String>,
    #[serde(rename = "ClientRequestURI")]
    client_request_uri: Option<String>,
    client_request_host: Option<String>,
    client_request_user_agent: Option<String>,
    edge_response_status: Option<u16>,
    /// The data centre that received it: where `regions` route it.
    edge_colo_code: Option<String>,
    /// Custom fields: request headers a Logpush job was set to include.
    #[serde(default)]
    request_headers: HashMap<String, String>,
    /// Custom fields: cookies a Logpush job was set to include.
    #[serde(default)]
    cookies: HashMap<String, String>,
}

/// A Logpush timestamp as epoch milliseconds, if it reads as one.
fn stamp_ms(stamp: Stamp) -> Option<u64> {
    match stamp {
        Stamp::Number(n) => match n.as_u64() {
            Some(whole) => Some(clock::epoch_int_ms(whole)),
            None => n.as_f64().and_then(clock::epoch_any_ms),
        },
        Stamp::Text(t) => {
            clock::rfc3339_ms(&t).or_else(|| t.parse::<f64>().ok().and_then(clock::epoch_any_ms))
        }
    }
}

fn parse_logpush(line: &str) -> Result<Line, String> {
    let l: Logpush = serde_json::from_str(line).map_err(|e| format!("not Logpush JSON: {e}"))?;
    let time_ms = stamp_ms(l.edge_start_timestamp.ok_or("no EdgeStartTimestamp")?)
        .ok_or("unreadable EdgeStartTimestamp")?;
    // The edge's last byte to the client: when a slot would come back.
    let duration_ms = (l.edge_end_timestamp)
        .and_then(stamp_ms)
        .and_then(|end| end.checked_sub(time_ms));
    let method = l
        .client_request_method
        .filter(|m| is_method(m))
        .ok_or("no ClientRequestMethod")?;
    let target = l.client_request_uri.ok_or("no ClientRequestURI")?;
    let mut headers: Vec<(String, String)> = l
        .request_headers
        .into_iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v))
        .collect();
    headers.sort();
    let mut cookies: Vec<String> = l.cookies.iter().map(|(n, v)| format!("{n}={v}")).collect();
    cookies.sort();
    let meta = RequestParts {
        method: &method,
        host: l.client_request_host.as_deref().unwrap_or_default(),
        target: &target,
        ip: l.client_ip.as_deref().unwrap_or_default(),
        user_agent: l.client_request_user_agent.as_deref(),
        headers,
        cookies,
        cf: (l.edge_colo_code.into_iter())
            .map(|colo| (CfField::Colo, colo))
            .collect(),
    }
    .build();
    Ok((time_ms, meta, l.edge_response_status, duration_ms))
}

/// The fields of one CSV record: split on commas when it has no quotes
/// (most logs' rows, and much faster), else by the csv crate.
fn csv_fields(text: &str) -> Result<csv::StringRecord, String> {
    if !text.contains('"') {
        return Ok(text.split(',').collect());
    }
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(text.as_bytes());
    let mut row = csv::StringRecord::new();
    match reader.read_record(&mut row) {
        Ok(true) => Ok(row),
        Ok(false) => Err("an empty row".into()),
        Err(e) => Err(format!("unreadable CSV row: {e}")),
    }
}

fn parse_csv_row(c: &Columns, text: &str, default_host: &str) -> Result<Line, String> {
    let row = csv_fields(text)?;
    let row = &row;
    let field = |at: Option<usize>| at.and_then(|i| row.get(i)).map(str::trim);
    let time = field(c.time).filter(|t| !t.is_empty()).ok_or("no time")?;
    let time_ms = if time.bytes().all(|b| b.is_ascii_digit()) {
        time.parse().ok()
    } else {
        clock::rfc3339_ms(time)
    }
    .ok_or_else(|| format!("time {time:?} is neither epoch milliseconds nor RFC 3339"))?;
    let method = field(c.method)
        .filter(|m| is_method(m))
        .ok_or("no method")?;
    let target = field(c.path).filter(|p| !p.is_empty()).ok_or("no path")?;
    let status = match field(c.status) {
        None | Some("") | Some("-") => None,
        Some(s) => Some(
            s.parse::<u16>()
                .ok()
                .filter(|s| (100..=999).contains(s))
                .ok_or_else(|| format!("status {s:?} is no HTTP status code"))?,
        ),
    };
    let duration_ms = match field(c.duration_ms) {
        None | Some("") | Some("-") => None,
        Some(d) => {
            Some(duration_of(d).ok_or_else(|| format!("duration_ms {d:?} is no number of ms"))?)
        }
    };
    let headers = c
        .headers
        .iter()
        .filter_map(|(name, i)| {
            row.get(*i)
                .filter(|v| !v.is_empty())
                .map(|v| (name.clone(), v.to_owned()))
        })
        .collect();
    let cookies = c
        .cookies
        .iter()
        .filter_map(|(name, i)| {
            row.get(*i)
                .filter(|v| !v.is_empty())
                .map(|v| format!("{name}={v}"))
        })
        .collect();
    let host = field(c.host)
        .filter(|h| !h.is_empty())
        .unwrap_or(default_host);
    let meta = RequestParts {
        method,
        host,
        target,
        ip: field(c.ip).unwrap_or_default(),
        user_agent: None,
        headers,
        cookies,
        cf: (c.cf.iter())
            .filter_map(|(f, i)| Some((*f, row.get(*i).filter(|v| !v.is_empty())?.to_string())))
            .collect(),
    }
    .build();
    Ok((time_ms, meta, status, duration_ms))
}

/// A duration in ms, whole or with a fraction (rounded up: a slot is held
/// at least that long), as logs write them.
fn duration_of(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    whole.checked_add(u64::from(fraction.bytes().any(|b| b != b'0')))
}

/// The log's input with its first non-blank line put back in front.
pub type ReplayedInput<R> = std::io::Chain<std::io::Cursor<Vec<u8>>, R>;

impl<R: BufRead> LogReader<ReplayedInput<R>> {
    /// A reader of `input` in `format`, or in the format its first non-blank line
    /// gives away. `host` stands for the host of requests whose log line
    /// names none (CLF never does).
    pub fn new(mut input: R, format: Option<Format>, host: &str) -> Result<Self, LogError> {
        // The first non-blank line decides the format (or is the CSV
        // header); it is then read again as data, the blank lines before it
        // only counted.
        let (mut read, mut skipped, mut first_at, mut first) =
            (Vec::new(), 0u64, 0u64, String::new());
        while first.trim().is_empty() {
            skipped += read.len() as u64;
            read.clear();
            if input.read_until(b'\n', &mut read)? == 0 {
                break;
            }
            first_at += 1;
            first = String::from_utf8_lossy(&read).into_owned();
        }
        let guessed_from = format.is_none().then_some(first_at);
        let format = match format {
            Some(f) => f,
            None if first.trim().is_empty() => return Err(LogError::Empty),
            None => Format::guess(&first)
                .ok_or_else(|| LogError::Unrecognized(first_at, excerpt(&first)))?,
        };
        // A CSV header row is a line, and no record.
        let (replay, columns, line, bytes) = if format == Format::Csv {
            let columns = csv_columns(&first)?;
            (Vec::new(), columns, first_at, skipped + read.len() as u64)
        } else {
            (
                read,
                Columns::default(),
                first_at.saturating_sub(1),
                skipped,
            )
        };
        let reader = LogReader {
            input: std::io::Cursor::new(replay).chain(input),
            format,
            guessed_from,
            columns,
            default_host: host.to_owned(),
            line,
            buf: Vec::new(),
            failed: false,
            bytes,
        };
        Ok(reader)
    }
}

impl<R: BufRead> LogReader<R> {
    /// The format being read.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The line whose look decided the format, when it was guessed.
    pub fn guessed_from(&self) -> Option<u64> {
        self.guessed_from
    }

    /// Bytes of the log read so far, for a progress bar.
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }

    /// Reads one more line onto `buf`; false at the end or on a failure.
    fn read_line(&mut self) -> Result<bool, LineError> {
        match self.input.read_until(b'\n', &mut self.buf) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.bytes += n as u64;
                self.line += 1;
                Ok(true)
            }
            Err(e) => {
                self.line += 1;
                self.failed = true;
                Err(LineError {
                    line: self.line,
                    reason: format!("read error: {e}"),
                    text: String::new(),
                })
            }
        }
    }

    /// The next record, a line that could not be read, or `None` at the end.
    pub fn next_record(&mut self) -> Option<Result<Record, LineError>> {
        loop {
            if self.failed {
                return None;
            }
            self.buf.clear();
            match self.read_line() {
                Ok(false) => return None,
                Ok(true) => {}
                Err(e) => return Some(Err(e)),
            }
            let line = self.line;
            if self.format == Format::Csv {
                // A quoted field may hold line breaks: a record ends where
                // its quotes balance ("" inside a field counts twice).
                while self.buf.iter().filter(|b| **b == b'"').count() % 2 == 1 {
                    match self.read_line() {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(e) => return Some(Err(e)),
                    }
                }
            }
            let text = match std::str::from_utf8(&self.buf) {
                Ok(t) => t.trim_end_matches(['\r', '\n']),
                Err(_) => {
                    return Some(Err(LineError {
                        line,
                        reason: "not UTF-8".into(),
                        text: excerpt(&String::from_utf8_lossy(&self.buf)),
                    }))
                }
            };
            // Blank lines, and CSV rows of empty fields, are no requests.
            if text.trim().is_empty()
                || (self.format == Format::Csv && text.bytes().all(|b| b == b',' || b == b' '))
            {
                continue;
            }
            let parsed = match self.format {
                Format::Clf => parse_clf(text, Some(&self.default_host)),
                Format::Logpush => parse_logpush(text),
                Format::Csv => parse_csv_row(&self.columns, text, &self.default_host),
            };
            return Some(
                parsed
                    .map(|(time_ms, request, status, duration_ms)| Record {
                        line,
                        time_ms,
                        request,
                        status,
                        duration_ms,
                    })
                    .map_err(|reason| LineError {
                        line,
                        reason,
                        text: excerpt(text),
                    }),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(text: &str, format: Option<Format>) -> (Format, Vec<Result<Record, LineError>>) {
        let mut reader = LogReader::new(text.as_bytes(), format, "example.com").unwrap();
        let mut out = Vec::new();
        while let Some(r) = reader.next_record() {
            out.push(r);
        }
        assert_eq!(reader.bytes_read(), text.len() as u64);
        (reader.format(), out)
    }

    fn header<'a>(r: &'a Record, name: &str) -> Option<&'a str> {
        r.request.header(name)
    }

    #[test]
    fn combined_log_lines_become_requests() {
        let log = concat!(
            "203.0.113.9 - frank [20/Nov/2026:10:00:01 +0100] \"GET /%61pi//items?id=5&x=%20 HTTP/1.1\" 200 2326 \"https://example.com/\" \"Mozilla/5.0 \\\"quoted\\\"\"\n",
            "2001:db8::1 - - [20/Nov/2026:09:00:02 +0000] \"POST http://API.example.com:8443/login HTTP/1.1\" 429 0\n",
            "\n",
            "203.0.113.9 - - [20/Nov/2026:09:00:03 +0000] \"\\x16\\x03\\x01\" 400 150 \"-\" \"-\"\n",
            "garbage\n",
            "203.0.113.9 - - [31/Nov/2026:09:00:03 +0000] \"GET / HTTP/1.1\" 200 1\n",
            "203.0.113.9 - - [20/Nov/2026:09:00:04 +0000] \"GET / HTTP/1.1\" 2x0 1\n",
        );
        let (format, records) = read_all(log, None);
        assert_eq!(format, Format::Clf);
        let first = records[0].as_ref().unwrap();
        assert_eq!(first.line, 1);
        assert_eq!(
            Some(first.time_ms),
            clock::rfc3339_ms("2026-11-20T09:00:01Z")
        );
        assert_eq!(first.request.method, "GET");
        assert_eq!(
            first.request.host, "example.com",
            "--host stands in for CLF's missing host"
        );
        assert_eq!(first.request.path, "/api/items");
        assert_eq!(first.request.query.as_deref(), Some("id=5&x=%20"));
        assert_eq!(header(first, "cf-connecting-ip"), Some("203.0.113.9"));
        assert_eq!(header(first, "user-agent"), Some("Mozilla/5.0 \"quoted\""));
        assert_eq!(first.status, Some(200));
        let second = records[1].as_ref().unwrap();
        assert_eq!(
            (
                second.request.host.as_str(),
                second.request.path.as_str(),
                second.status
            ),
            ("api.example.com", "/login", Some(429)),
            "an absolute-form target names its host"
        );
        assert_eq!(header(second, "user-agent"), None, "Common, not Combined");
        // The blank line is skipped, not counted; bad lines keep their numbers.
        let errors: Vec<(u64, &str)> = records[2..]
            .iter()
            .map(|r| {
                let e = r.as_ref().unwrap_err();
                (e.line, e.reason.as_str())
            })
            .collect();
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert_eq!(errors.iter().map(|e| e.0).collect::<Vec<_>>(), [4, 5, 6, 7]);
        assert!(
            errors[0].1.contains("is not `METHOD target PROTOCOL`"),
            "{errors:?}"
        );
        assert!(errors[2].1.contains("unreadable time"), "{errors:?}");
        assert!(errors[3].1.contains("status"), "{errors:?}");
        assert_eq!(records[3].as_ref().unwrap_err().text, "garbage");
    }

    #[test]
    fn csv_columns_by_name_quotes_and_all() {
        let log = concat!(
            "Time,IP,method,path,host,status,header:X-Api-Key,cookie:sid,referer\n",
            "1795168800250,198.51.100.7,get,/api/x?k=1,API.example.com:443,200,key-1,s3,-\n",
            "2026-11-20T10:00:01Z,198.51.100.7,POST,\"/login\",,,,\"a,b\",\"multi\nline\"\n",
            "soon,198.51.100.7,GET,/,,,,,\n",
            "1795168800999,198.51.100.7,GET,,,,,,\n",
            "1795168801000,198.51.100.7,GET,/,,999x,,,\n",
            "\n",
            "1795168802000,198.51.100.8,GET,/\n",
        );
        let (format, records) = read_all(log, None);
        assert_eq!(format, Format::Csv);
        let first = records[0].as_ref().unwrap();
        assert_eq!((first.line, first.time_ms), (2, 1_795_168_800_250));
        assert_eq!(
            (
                first.request.method.as_str(),
                first.request.host.as_str(),
                first.request.path.as_str()
            ),
            ("GET", "api.example.com", "/api/x")
        );
        assert_eq!(first.request.query.as_deref(), Some("k=1"));
        assert_eq!(header(first, "x-api-key"), Some("key-1"));
        assert_eq!(header(first, "cookie"), Some("sid=s3"));
        assert_eq!(first.status, Some(200));
        let second = records[1].as_ref().unwrap();
        assert_eq!((second.line, second.time_ms), (3, 1_795_168_801_000));
        assert_eq!(second.request.host, "example.com");
        assert_eq!(header(second, "cookie"), Some("sid=a,b"));
        let errors: Vec<(u64, String)> = records[2..5]
            .iter()
            .map(|r| {
                let e = r.as_ref().unwrap_err();
                (e.line, e.reason.clone())
            })
            .collect();
        // The quoted field spanned lines 3 and 4, so the bad rows are 5 to 7.
        assert_eq!(errors.iter().map(|e| e.0).collect::<Vec<_>>(), [5, 6, 7]);
        assert!(errors[0]
            .1
            .contains("neither epoch milliseconds nor RFC 3339"));
        assert!(errors[1].1.contains("no path"));
        assert!(errors[2].1.contains("no HTTP status"));
        // A short row (flexible) still reads; the blank row is skipped.
        assert_eq!(records[5].as_ref().unwrap().line, 9);
        assert_eq!(records.len(), 6);
    }

    #[test]
    fn blank_lines_before_the_first_record_leave_the_guess_and_the_line_numbers_right() {
        let clf = "203.0.113.9 - - [20/Nov/2026:10:00:00 +0000] \"GET / HTTP/1.1\" 200 5";
        let log = format!("\n  \n{clf}\n\n{clf}\n");
        let mut guessed = LogReader::new(log.as_bytes(), None, "h").unwrap();
        assert_eq!(
            (guessed.format(), guessed.guessed_from()),
            (Format::Clf, Some(3))
        );
        let lines: Vec<u64> = std::iter::from_fn(|| guessed.next_record())
            .map(|r| r.unwrap().line)
            .collect();
        assert_eq!(lines, [3, 5]);
        let named = LogReader::new(log.as_bytes(), Some(Format::Clf), "h").unwrap();
        assert_eq!(named.guessed_from(), None);
        let csv = "\ntime,ip,method,path\n1795168800,203.0.113.9,GET,/\n";
        let mut csv = LogReader::new(csv.as_bytes(), None, "h").unwrap();
        assert_eq!((csv.format(), csv.guessed_from()), (Format::Csv, Some(2)));
        assert_eq!(csv.next_record().unwrap().unwrap().line, 3);
    }

    #[test]
    fn a_csv_header_without_the_needed_columns_is_one_clear_error() {
        let err = LogReader::new(
            "when,ip,method,path\n1,2,3,4\n".as_bytes(),
            Some(Format::Csv),
            "",
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("missing column(s) time"), "{err}");
        let err = LogReader::new("hello world\n".as_bytes(), None, "")
            .err()
            .unwrap();
        assert!(err.to_string().contains("--format"), "{err}");
        let err = LogReader::new("".as_bytes(), None, "").err().unwrap();
        assert_eq!(err.to_string(), "the log is empty");
        let err = LogReader::new("\n  \n".as_bytes(), None, "").err().unwrap();
        assert_eq!(err.to_string(), "the log is empty");
        let err = LogReader::new("\n\nhello world\n".as_bytes(), None, "")
            .err()
            .unwrap();
        assert!(err.to_string().contains("line 3: \"hello world"), "{err}");
        // Named, an empty log is an empty report.
        let mut empty = LogReader::new("".as_bytes(), Some(Format::Clf), "").unwrap();
        assert!(empty.next_record().is_none());
    }

    #[test]
    fn logpush_lines_in_every_timestamp_format() {
        let log = concat!(
            r#"{"EdgeStartTimestamp":1795168800250000000,"ClientIP":"203.0.113.9","ClientRequestMethod":"GET","ClientRequestURI":"/api/items?id=5","ClientRequestHost":"Example.com","ClientRequestUserAgent":"curl/8.5.0","EdgeResponseStatus":200,"RequestHeaders":{"X-Api-Key":"k1"},"Cookies":{"sid":"s3"}}"#,
            "\n",
            r#"{"EdgeStartTimestamp":"2026-11-20T10:00:01Z","ClientIP":"203.0.113.9","ClientRequestMethod":"POST","ClientRequestURI":"/login"}"#,
            "\n",
            r#"{"EdgeStartTimestamp":1795168802,"ClientIP":"203.0.113.9","ClientRequestMethod":"GET","ClientRequestURI":"/"}"#,
            "\n",
            r#"{"EdgeStartTimestamp":"1795168803000","ClientIP":"203.0.113.9","ClientRequestMethod":"GET","ClientRequestURI":"/"}"#,
            "\n",
            r#"{"ClientIP":"203.0.113.9","ClientRequestMethod":"GET","ClientRequestURI":"/"}"#,
            "\n",
            r#"{"EdgeStartTimestamp":1795168802,"ClientIP":"203.0.113.9""#,
            "\n",
        );
        let (format, records) = read_all(log, None);
        assert_eq!(format, Format::Logpush);
        let first = records[0].as_ref().unwrap();
        assert_eq!(first.time_ms, 1_795_168_800_250);
        assert_eq!(
            (
                first.request.host.as_str(),
                first.request.path.as_str(),
                first.request.query.as_deref()
            ),
            ("example.com", "/api/items", Some("id=5"))
        );
        assert_eq!(header(first, "user-agent"), Some("curl/8.5.0"));
        assert_eq!(header(first, "x-api-key"), Some("k1"));
        assert_eq!(header(first, "cookie"), Some("sid=s3"));
        assert_eq!(first.status, Some(200));
        let times: Vec<u64> = records[1..4]
            .iter()
            .map(|r| r.as_ref().unwrap().time_ms)
            .collect();
        assert_eq!(
            times,
            [1_795_168_801_000, 1_795_168_802_000, 1_795_168_803_000]
        );
        let errors: Vec<&LineError> = records[4..]
            .iter()
            .map(|r| r.as_ref().unwrap_err())
            .collect();
        assert_eq!(
            (errors[0].line, errors[0].reason.as_str()),
            (5, "no EdgeStartTimestamp")
        );
        assert_eq!(errors[1].line, 6);
        assert!(
            errors[1].reason.starts_with("not Logpush JSON"),
            "{}",
            errors[1].reason
        );
    }

    #[test]
    fn durations_from_logpush_end_stamps_and_a_csv_column() {
        let logpush = concat!(
            r#"{"EdgeStartTimestamp":1795168800250000000,"EdgeEndTimestamp":1795168800480500000,"ClientIP":"203.0.113.9","ClientRequestMethod":"GET","ClientRequestURI":"/"}"#,
            "\n",
            r#"{"EdgeStartTimestamp":"2026-11-20T10:00:01Z","EdgeEndTimestamp":"2026-11-20T10:00:03Z","ClientIP":"203.0.113.9","ClientRequestMethod":"GET","ClientRequestURI":"/"}"#,
            "\n",
            // Ended before it began, or never: no duration.
            r#"{"EdgeStartTimestamp":1795168802,"EdgeEndTimestamp":1795168801,"ClientIP":"203.0.113.9","ClientRequestMethod":"GET","ClientRequestURI":"/"}"#,
            "\n",
            r#"{"EdgeStartTimestamp":1795168802,"ClientIP":"203.0.113.9","ClientRequestMethod":"GET","ClientRequestURI":"/"}"#,
            "\n",
        );
        let (_, records) = read_all(logpush, None);
        let durations: Vec<Option<u64>> = (records.iter())
            .map(|r| r.as_ref().unwrap().duration_ms)
            .collect();
        assert_eq!(durations, [Some(230), Some(2000), None, None]);
        assert_eq!(Format::Clf.durations(), None);
        let csv = "time,ip,method,path,Duration_ms\n1,a,GET,/,12\n2,a,GET,/,0.25\n3,a,GET,/,7.000\n4,a,GET,/,\n5,a,GET,/,-3\n6,a,GET,/,1e3\n";
        let (_, records) = read_all(csv, None);
        let read: Vec<Result<Option<u64>, &str>> = (records.iter())
            .map(|r| {
                r.as_ref()
                    .map(|r| r.duration_ms)
                    .map_err(|e| e.reason.as_str())
            })
            .collect();
        assert_eq!(
            read,
            [
                Ok(Some(12)),
                Ok(Some(1)),
                Ok(Some(7)),
                Ok(None),
                Err("duration_ms \"-3\" is no number of ms"),
                Err("duration_ms \"1e3\" is no number of ms"),
            ]
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_are_one_bad_line() {
        let mut log =
            b"203.0.113.9 - - [20/Nov/2026:10:00:00 +0000] \"GET / HTTP/1.1\" 200 1\n".to_vec();
        log.extend_from_slice(b"\xff\xfe\n");
        log.extend_from_slice(
            b"203.0.113.9 - - [20/Nov/2026:10:00:01 +0000] \"GET / HTTP/1.1\" 200 1\n",
        );
        let mut reader = LogReader::new(&log[..], None, "").unwrap();
        let mut results = Vec::new();
        while let Some(r) = reader.next_record() {
            results.push(r.map(|r| r.line).map_err(|e| (e.line, e.reason)));
        }
        assert_eq!(results, [Ok(1), Err((2, "not UTF-8".to_owned())), Ok(3)]);
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// Pieces real lines are made of, so that generated lines get past the
    /// first checks and reach the deeper ones.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("203.0.113.9 - - ".to_owned()),
            Just("[20/Nov/2026:10:00:00 +0000] ".to_owned()),
            Just("\"GET /a?b=c HTTP/1.1\" ".to_owned()),
            Just("200 12 \"-\" \"ua\"".to_owned()),
            Just("{\"EdgeStartTimestamp\":".to_owned()),
            Just("\"ClientRequestURI\":\"/\"}".to_owned()),
            Just("1795168800000,".to_owned()),
            Just("\"".to_owned()),
            Just("\\".to_owned()),
            Just("[".to_owned()),
            Just(",".to_owned()),
            "\\PC{0,12}",
            any::<char>().prop_map(String::from),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// No line, however mangled, panics a reader of any format: it is a
        /// record or a counted error.
        #[test]
        fn no_line_panics(pieces in proptest::collection::vec(piece(), 0..12), more in "\\PC{0,40}") {
            let line: String = pieces.concat() + &more;
            for format in [Format::Csv, Format::Clf, Format::Logpush] {
                let text = match format {
                    Format::Csv => format!("time,ip,method,path,status,header:x,cookie:y\n{line}\n{line}"),
                    _ => format!("{line}\n{line}"),
                };
                if let Ok(mut reader) = LogReader::new(text.as_bytes(), Some(format), "") {
                    while reader.next_record().is_some() {}
                }
            }
            let _ = Format::guess(&line);
        }
    }
}
