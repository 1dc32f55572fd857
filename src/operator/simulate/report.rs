//! What a simulation counts, request by request, and how a report reads,
//! whether its figures were replayed from a log or recorded by the
//! deployment's isolates (`edge-limiter stats`): a table per rule, the
//! clients most denied, the busiest second or minute; as text or JSON.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::{
    clock::format_ms,
    log::{LineError, REORDER_MS},
};
use crate::{
    decision::{
        outcomes::verdict::Decision,
        stats::{
            counts::{Fate, RuleCount, RuleCounts, RuleFate},
            top::{Counted, Denials, TopDenied, KEPT, TRACKED, UNPLACED},
        },
    },
    rules::{config::Config, rule::Mode},
};

/// How many unreadable lines the report quotes.
pub const QUOTED_LINES: usize = 5;

/// How many clients the "most denied" list holds.
pub const TOP_CLIENTS: usize = 10;

/// One rule's figures: what [`RuleCount`] names. A replay counts no fail
/// mode, lease or call, which stay 0.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleReport {
    /// The rule's name.
    pub name: String,
    /// Whether it enforces or only reports.
    pub shadow: bool,
    /// Its figures.
    pub counts: RuleCounts,
    /// An in-flight limit's requests whose log line gave no duration: their
    /// slots came back at once.
    pub without_duration: u64,
    /// A `cost_header` rule's admitted requests, each charged its estimate
    /// (`cost`): a log has no column for the cost the origin reported.
    pub at_estimate: u64,
    /// Whom it denied and from where, as the isolates recorded it (empty in
    /// a replay): bounded summaries, with their errors.
    pub denials: Denials,
}

/// A client among the most denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientReport {
    /// The rule that denied it.
    pub rule: String,
    /// Its identifier under that rule: in a replay its parts joined by
    /// ` | `, in what the isolates recorded as the rule's key shows it.
    pub client: String,
    /// Requests of it that this rule denied, or more (see `over`).
    pub denied: u64,
    /// How far `denied` may be above the true number: 0 when exact.
    pub over: u64,
    /// All its requests under this rule, where they were counted (the
    /// isolates count denials only).
    pub requests: Option<u64>,
}

/// Where a report's figures come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Kind {
    /// A log replayed through the rules (`simulate`).
    #[default]
    Replayed,
    /// What the deployment's isolates recorded (`stats`).
    Recorded,
}

/// The bucket of time (a second in a replay, a minute in what the isolates
/// recorded) with the most requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BucketReport {
    /// Its start, epoch milliseconds.
    pub start_ms: u64,
    /// Requests in it.
    pub requests: u64,
    /// Of which admitted.
    pub admitted: u64,
    /// Of which denied (429).
    pub denied: u64,
}

/// Admitted and denied (or, for a shadow rule, would-deny) requests of one
/// rule in one bucket of time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    /// The bucket's start, seconds since the epoch.
    pub start_s: u64,
    /// Requests under the rule that went through.
    pub admitted: u64,
    /// Requests the rule denied (a shadow rule: would have denied).
    pub denied: u64,
    /// Requests the rule admitted that another rule denied.
    pub denied_by_others: u64,
}

/// Every request in one bucket of time: what the totals panel draws.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TotalPoint {
    /// The bucket's start, seconds since the epoch.
    pub start_s: u64,
    /// Requests forwarded.
    pub admitted: u64,
    /// Requests answered 429.
    pub denied: u64,
    /// Requests answered 400.
    pub refused: u64,
    /// Requests forwarded undecided, Redis unavailable (recorded only).
    pub bypassed: u64,
    /// Requests answered 503, Redis unavailable (recorded only).
    pub unavailable: u64,
}

/// How one request counts on its rule's panel.
struct PanelCount {
    admitted: bool,
    denied: bool,
    denied_by_others: bool,
}

/// Everything a simulation found, or the isolates recorded.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Where the figures come from.
    pub kind: Kind,
    /// `redis` or `model` (a replay).
    pub engine: String,
    /// The log's format.
    pub format: String,
    /// The line whose look decided the format, when it was guessed.
    pub format_guessed_from: Option<u64>,
    /// Requests read.
    pub requests: u64,
    /// Requests the worker would have forwarded (no rule matched included).
    pub admitted: u64,
    /// Requests answered 429.
    pub denied: u64,
    /// Requests answered 400 (a key part given twice with different values).
    pub refused: u64,
    /// Requests no rule matched.
    pub unmatched: u64,
    /// Requests forwarded without a decision, Redis unavailable and every
    /// rule open (recorded only).
    pub bypassed: u64,
    /// Requests answered 503, Redis unavailable and a rule closed
    /// (recorded only).
    pub unavailable: u64,
    /// Script calls the limiter made, each once whatever the rules it
    /// served (recorded only).
    pub calls: u64,
    /// The first and last request's time (a replay), or the span asked for
    /// (recorded), epoch milliseconds.
    pub span_ms: Option<(u64, u64)>,
    /// Per rule, in configuration order.
    pub rules: Vec<RuleReport>,
    /// The clients most denied, most first.
    pub top_denied: Vec<ClientReport>,
    /// How long a bucket of [`Report::series`] and [`Report::busiest`] is, ms.
    pub bucket_ms: u64,
    /// The busiest bucket, if any request was counted.
    pub busiest: Option<BucketReport>,
    /// Lines that could not be read.
    pub unreadable: u64,
    /// The first [`QUOTED_LINES`] of them.
    pub unreadable_first: Vec<LineError>,
    /// Requests logged earlier than requests already decided (beyond the
    /// reordering window), decided at the latest time already reached.
    pub late: u64,
    /// Per rule, one point per bucket that had requests under it.
    pub series: Vec<Vec<Point>>,
    /// Over every request, one point per bucket that had requests.
    pub totals_series: Vec<TotalPoint>,
}

/// Counts requests as they are decided, in time order.
pub struct Tally {
    report: Report,
    /// Per rule, requests and denials per client identifier.
    clients: Vec<HashMap<String, (u64, u64)>>,
    second: BucketReport,
}

impl Tally {
    /// An empty tally over `config`'s rules, for a log in `format`, guessed
    /// from line `guessed_from` when it was.
    pub fn new(config: &Config, engine: &str, format: &str, guessed_from: Option<u64>) -> Tally {
        let rules = config
            .rules
            .iter()
            .map(|r| RuleReport {
                name: r.name.clone(),
                shadow: r.mode == Mode::Shadow,
                ..RuleReport::default()
            })
            .collect();
        Tally {
            report: Report {
                engine: engine.to_owned(),
                format: format.to_owned(),
                format_guessed_from: guessed_from,
                rules,
                series: vec![Vec::new(); config.rules.len()],
                bucket_ms: 1000,
                ..Report::default()
            },
            clients: vec![HashMap::new(); config.rules.len()],
            second: BucketReport::default(),
        }
    }

    /// A line that could not be read.
    pub fn unreadable(&mut self, error: LineError) {
        self.report.unreadable += 1;
        if self.report.unreadable_first.len() < QUOTED_LINES {
            self.report.unreadable_first.push(error);
        }
    }

    /// A request logged earlier than one already decided.
    pub fn late(&mut self) {
        self.report.late += 1;
    }

    /// Counts one request at `time_ms`; starts a new second when it moves on.
    fn request(&mut self, time_ms: u64, admitted: bool, denied: bool) {
        let r = &mut self.report;
        r.requests += 1;
        r.span_ms = Some(r.span_ms.map_or((time_ms, time_ms), |(a, _)| (a, time_ms)));
        let start_ms = time_ms - time_ms % 1000;
        if self.second.start_ms != start_ms || self.second.requests == 0 {
            self.second = BucketReport {
                start_ms,
                ..BucketReport::default()
            };
        }
        self.second.requests += 1;
        let second = time_ms / 1000;
        if r.totals_series.last().is_none_or(|p| p.start_s != second) {
            r.totals_series.push(TotalPoint {
                start_s: second,
                ..TotalPoint::default()
            });
        }
        let Some(point) = r.totals_series.last_mut() else {
            return;
        };
        if admitted {
            r.admitted += 1;
            self.second.admitted += 1;
            point.admitted += 1;
        } else if denied {
            r.denied += 1;
            self.second.denied += 1;
            point.denied += 1;
        } else {
            r.refused += 1;
            point.refused += 1;
        }
        // The earliest of equally busy seconds; the busiest so far grows with itself.
        if r.busiest.is_none_or(|b| self.second.requests > b.requests) {
            r.busiest = Some(self.second);
        }
    }

    fn point(&mut self, rule: usize, time_ms: u64, counted: PanelCount) {
        let second = time_ms / 1000;
        let series = &mut self.report.series[rule];
        if series.last().is_none_or(|p| p.start_s != second) {
            series.push(Point {
                start_s: second,
                ..Point::default()
            });
        }
        if let Some(p) = series.last_mut() {
            p.admitted += u64::from(counted.admitted);
            p.denied += u64::from(counted.denied);
            p.denied_by_others += u64::from(counted.denied_by_others);
        }
    }

    /// A request no rule matched: forwarded.
    pub fn unmatched(&mut self, time_ms: u64) {
        self.report.unmatched += 1;
        self.request(time_ms, true, false);
    }

    /// A request refused with 400 by `rule` (its index), before any decision.
    pub fn refused(&mut self, time_ms: u64, rule: usize) {
        let r = &mut self.report.rules[rule].counts;
        r[RuleCount::Matched] += 1;
        r[RuleCount::Refused] += 1;
        self.request(time_ms, false, false);
    }

    /// A shadow rule that could not identify a request's client: it would
    /// have refused it, and is left out of the decision.
    pub fn shadow_refused(&mut self, rule: usize) {
        let r = &mut self.report.rules[rule].counts;
        r[RuleCount::Matched] += 1;
        r[RuleCount::Refused] += 1;
    }

    /// A request under in-flight rule `rule` whose log line gave no duration.
    pub fn without_duration(&mut self, rule: usize) {
        self.report.rules[rule].without_duration += 1;
    }

    /// A request admitted under `cost_header` rule `rule`, charged its
    /// estimate.
    pub fn at_estimate(&mut self, rule: usize) {
        self.report.rules[rule].at_estimate += 1;
    }

    /// A decided request: `rules` are the indices of the rules in the call,
    /// in call order, with the client's identifier under each.
    pub fn decided(&mut self, time_ms: u64, rules: &[(usize, String)], decision: &Decision) {
        self.request(time_ms, decision.admitted(), !decision.admitted());
        for (i, ((rule, client), state)) in rules.iter().zip(&decision.rules).enumerate() {
            let r = &mut self.report.rules[*rule];
            // PanelCount as the worker counts what it did.
            let fate = RuleFate::of(decision, state, r.shadow);
            fate.count(&mut r.counts);
            // The panel's lines count what its title counts: a shadow rule's
            // red line is its would-deny, whatever became of the request.
            let counted = PanelCount {
                admitted: fate.fate == Fate::Admitted,
                denied: fate.fate == Fate::Denied || fate.would_deny,
                denied_by_others: fate.fate == Fate::DeniedByOthers,
            };
            self.point(*rule, time_ms, counted);
            // Most requests come from clients seen before: no key to copy then.
            let clients = &mut self.clients[*rule];
            let counts = match clients.get_mut(client.as_str()) {
                Some(counts) => counts,
                None => clients.entry(client.clone()).or_default(),
            };
            counts.0 += 1;
            // The binding rule is the one the client was told it hit.
            if !decision.admitted() && i == decision.binding() {
                counts.1 += 1;
            }
        }
        for i in &decision.penalties_started {
            if let Some((rule, _)) = rules.get(*i) {
                self.report.rules[*rule].counts[RuleCount::PenaltiesStarted] += 1;
            }
        }
    }

    /// The report, with the most denied clients picked out.
    pub fn finish(mut self) -> Report {
        let denied: Vec<ClientReport> = self
            .clients
            .into_iter()
            .enumerate()
            .flat_map(|(rule, clients)| clients.into_iter().map(move |c| (rule, c)))
            .filter(|(_, (_, (_, d)))| *d > 0)
            .map(|(rule, (client, (requests, denied)))| ClientReport {
                rule: self.report.rules[rule].name.clone(),
                client,
                denied,
                over: 0,
                requests: Some(requests),
            })
            .collect();
        self.report.top_denied = most_denied(denied);
        self.report
    }
}

/// The [`TOP_CLIENTS`] of `clients` most denied, most first; ties in a
/// stable order, so that a report reads the same every run.
pub fn most_denied(mut clients: Vec<ClientReport>) -> Vec<ClientReport> {
    clients.sort_by(|a, b| {
        b.denied
            .cmp(&a.denied)
            .then_with(|| a.rule.cmp(&b.rule))
            .then_with(|| a.client.cmp(&b.client))
    });
    clients.truncate(TOP_CLIENTS);
    clients
}

/// The heading of where denials came from.
pub const PLACES_TITLE: &str = "Where denials came from (request.cf; `-`: the platform gave none)";

/// A count as shown: exact, or the range its true number lies in.
pub fn shown_count(count: u64, over: u64) -> String {
    match over {
        0 => count.to_string(),
        _ => format!("{}-{count}", count - over),
    }
}

/// A country as `request.cf` names it, or a network as `AS` and its number.
pub fn place_name(what: &str, name: &str) -> String {
    match (what, name) {
        ("network", n) if n != UNPLACED => format!("AS{n}"),
        _ => name.to_owned(),
    }
}

/// A rule's places for [`Report::to_json`]: the ten countries and networks
/// it denied most, each count with its lower bound where it is approximate,
/// and the most a place not listed was denied.
fn places_json(d: &Denials) -> Value {
    let list = |what: &str, top: &TopDenied| {
        let listed: Vec<Value> = (top.top(KEPT).into_iter())
            .map(|e: &Counted| {
                let mut place = json!({what: e.name, "denied": e.count});
                if e.over > 0 {
                    place["denied_at_least"] = json!(e.count - e.over);
                }
                place
            })
            .collect();
        json!({"top": listed, "unlisted_at_most": top.floor()})
    };
    json!({
        "countries": list("country", &d.countries),
        "networks": list("asn", &d.networks),
        "clients_unlisted_at_most": d.clients.floor(),
    })
}

/// Text from a log made safe for a terminal: control characters (a
/// hostile log line may carry escape sequences) written as escapes.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A Markdown table, columns padded to line up in a terminal.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([header[i].chars().count()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..header.len()).map(width).collect();
    // Text left, figures right.
    let numeric: Vec<bool> = (0..header.len())
        .map(|i| {
            !rows.is_empty()
                && rows.iter().all(|r| {
                    r[i].bytes()
                        .all(|b| b.is_ascii_digit() || b == b'/' || b == b' ')
                })
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if numeric[i] {
                    format!("{c:>w$}", w = widths[i])
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        format!("| {} |\n", padded.join(" | "))
    };
    let mut out = line(header.to_vec());
    let rule: Vec<String> = widths
        .iter()
        .zip(&numeric)
        .map(|(w, n)| {
            if *n {
                format!("{}:", "-".repeat(w.saturating_sub(1)))
            } else {
                "-".repeat(*w)
            }
        })
        .collect();
    out.push_str(&line(rule.iter().map(String::as_str).collect()));
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// The per-rule table's columns, in a replay and in what was recorded.
const RULE_COLUMNS: [(RuleCount, &str); 7] = [
    (RuleCount::Matched, "matched"),
    (RuleCount::Admitted, "admitted"),
    (RuleCount::Denied, "denied"),
    (RuleCount::DeniedByOthers, "denied by other rules"),
    (RuleCount::ShadowWouldDeny, "shadow would deny"),
    (RuleCount::Refused, "refused (400)"),
    (RuleCount::PenaltiesStarted, "penalties started"),
];

/// The columns a rule table adds when a rule had requests wait.
const DELAY_COLUMNS: [(RuleCount, &str); 2] = [
    (RuleCount::Delayed, "delayed"),
    (RuleCount::DelayedMs, "waited (ms)"),
];

/// The columns of the second table, of what only the isolates record.
const RECORDED_COLUMNS: [(RuleCount, &str); 4] = [
    (RuleCount::FailOpen, "fail open"),
    (RuleCount::FailClosed, "fail closed (503)"),
    (RuleCount::Leased, "from a lease"),
    (RuleCount::Calls, "script calls"),
];

impl Report {
    /// A table of `columns` per rule: its header and rows.
    fn rows_of(
        &self,
        columns: &[(RuleCount, &'static str)],
    ) -> (Vec<&'static str>, Vec<Vec<String>>) {
        let mut header = vec!["rule", "mode"];
        header.extend(columns.iter().map(|(_, name)| *name));
        let rows = self
            .rules
            .iter()
            .map(|r| {
                let mode = if r.shadow { "shadow" } else { "enforce" };
                let mut row = vec![r.name.clone(), mode.to_owned()];
                row.extend(columns.iter().map(|(c, _)| r.counts[*c].to_string()));
                row
            })
            .collect();
        (header, rows)
    }

    /// The per-rule table's header and rows.
    pub fn rule_rows(&self) -> (Vec<&'static str>, Vec<Vec<String>>) {
        let mut columns = RULE_COLUMNS.to_vec();
        if self.rules.iter().any(|r| r.counts[RuleCount::Delayed] > 0) {
            columns.extend(DELAY_COLUMNS);
        }
        self.rows_of(&columns)
    }

    /// The header and rows of the table of what only the isolates record:
    /// how each rule's requests were decided.
    pub fn decided_rows(&self) -> (Vec<&'static str>, Vec<Vec<String>>) {
        self.rows_of(&RECORDED_COLUMNS)
    }

    /// The bucket's name: `second` or `minute`.
    fn bucket_name(&self) -> &'static str {
        match self.bucket_ms {
            60_000 => "minute",
            _ => "second",
        }
    }

    /// The report as text: a summary, the tables, and what could not be read.
    pub fn render_text(&self, source: &str) -> String {
        let mut out = self.summary(source);
        let (header, rows) = self.rule_rows();
        out.push_str(&table(&header, &rows));
        if self.kind == Kind::Recorded {
            let (header, rows) = self.decided_rows();
            out.push_str("\nHow they were decided:\n\n");
            out.push_str(&table(&header, &rows));
            out.push_str(&format!(
                "\nScript calls in all: {} (one deciding several rules counts once here)\n",
                self.calls
            ));
        }
        out.push_str(&self.top_denied_text());
        out.push_str(&self.places_text());
        if let Some(b) = self.busiest {
            out.push_str(&format!(
                "\nBusiest {}: {}, {} requests: {} admitted, {} denied\n",
                self.bucket_name(),
                format_ms(b.start_ms),
                b.requests,
                b.admitted,
                b.denied
            ));
        }
        out.push_str(&self.unread_text());
        out
    }

    /// The text report's first two lines: what was read, and what became
    /// of it.
    fn summary(&self, source: &str) -> String {
        let span = match self.span_ms {
            Some((a, b)) => format!(", {} to {}", format_ms(a), format_ms(b)),
            None => String::new(),
        };
        let mut out = match self.kind {
            Kind::Replayed => {
                let format = match self.format_guessed_from {
                    Some(line) => format!("{}, guessed from line {line}", self.format),
                    None => self.format.clone(),
                };
                format!(
                    "{source} ({format}): {} requests{span}, decided by {}\n",
                    self.requests, self.engine
                )
            }
            Kind::Recorded => format!(
                "{source}: {} requests{span}, as the isolates recorded them\n",
                self.requests
            ),
        };
        let undecided = match (self.bypassed, self.unavailable) {
            (0, 0) => String::new(),
            (b, u) => format!("; forwarded undecided (fail open) {b}, unavailable (503) {u}"),
        };
        out.push_str(&format!(
            "admitted {}, denied (429) {}, refused (400) {}; no rule matched {}{undecided}\n\n",
            self.admitted, self.denied, self.refused, self.unmatched
        ));
        out
    }

    /// The text report's table of the clients most denied.
    fn top_denied_text(&self) -> String {
        if self.top_denied.is_empty() {
            return "\nNo client was denied.\n".to_owned();
        }
        // The column only where every client's requests were counted.
        let requests: Option<Vec<u64>> = self.top_denied.iter().map(|c| c.requests).collect();
        let rows: Vec<Vec<String>> = self
            .top_denied
            .iter()
            .zip(0..)
            .map(|(c, i)| {
                let mut row = vec![
                    c.client.clone(),
                    c.rule.clone(),
                    shown_count(c.denied, c.over),
                ];
                if let Some(requests) = &requests {
                    row.push(requests[i].to_string());
                }
                row
            })
            .collect();
        let header: &[&str] = match requests {
            Some(_) => &["client", "rule", "denied", "of requests"],
            None => &["client", "rule", "denied"],
        };
        format!("\nClients most denied:\n\n{}", table(header, &rows))
    }

    /// Where each rule's denials came from, as table rows: its ten
    /// countries and ten networks most denied.
    pub fn places_rows(&self) -> ([&'static str; 3], Vec<Vec<String>>) {
        let mut rows = Vec::new();
        for r in &self.rules {
            for (what, top) in r.denials.places() {
                for e in top.top(KEPT) {
                    let place = format!("{what} {}", place_name(what, &e.name));
                    rows.push(vec![r.name.clone(), place, shown_count(e.count, e.over)]);
                }
            }
        }
        (["rule", "from", "denied"], rows)
    }

    /// The text report's table of where denials came from, and what the
    /// approximate counts mean, when the isolates recorded any.
    fn places_text(&self) -> String {
        let (header, rows) = self.places_rows();
        let mut out = String::new();
        if !rows.is_empty() {
            out.push_str(&format!("\n{PLACES_TITLE}:\n\n"));
            out.push_str(&table(&header, &rows));
        }
        if let Some(note) = self.approximate_note() {
            out.push_str(&format!("\n{note}\n"));
        }
        out
    }

    /// What the approximate counts mean, when any shown is.
    pub fn approximate_note(&self) -> Option<String> {
        let clients = self.top_denied.iter().any(|c| c.over > 0);
        let floors: Vec<String> = (self.rules.iter())
            .flat_map(|r| {
                let d = &r.denials;
                std::iter::once(("client", &d.clients))
                    .chain(d.places())
                    .filter(|(_, t)| t.floor() > 0)
                    .map(|(what, t)| {
                        format!(
                            "a {what} not listed under `{}` at most {}",
                            r.name,
                            t.floor()
                        )
                    })
            })
            .collect();
        if !clients && floors.is_empty() {
            return None;
        }
        let mut note = format!(
            "Approximate: each isolate follows {TRACKED} names per rule and minute and Redis keeps \
             {KEPT}, so a count shown as a range lies somewhere in it"
        );
        if !floors.is_empty() {
            note.push_str(&format!("; denied {}", floors.join(", ")));
        }
        note.push('.');
        Some(note)
    }

    /// The text report's last words: requests whose slots were guessed or
    /// whose cost stayed at its estimate, requests logged out of order, and
    /// lines that could not be read.
    fn unread_text(&self) -> String {
        let mut out = String::new();
        for r in self.rules.iter().filter(|r| r.without_duration > 0) {
            out.push_str(&format!(
                "\nrule `{}`: {} requests had no duration in the log (CSV gives it in a duration_ms \
                 column, Logpush as EdgeEndTimestamp, CLF nowhere); their in-flight slots came \
                 back at once, so the worker may deny more of them than this replay did\n",
                r.name, r.without_duration
            ));
        }
        for r in self.rules.iter().filter(|r| r.at_estimate > 0) {
            out.push_str(&format!(
                "\nrule `{}`: {} admitted requests were charged their estimate (the rule's `cost`): \
                 a log does not carry what the origin reported in the `cost_header`, which the \
                 worker settles after each response, so it may admit fewer or more of them than \
                 this replay did\n",
                r.name, r.at_estimate
            ));
        }
        if self.late > 0 {
            out.push_str(&format!(
                "\n{} requests were logged more than {} s out of order; each was decided at the \
                 latest time reached before it\n",
                self.late,
                REORDER_MS / 1000
            ));
        }
        if self.unreadable > 0 {
            out.push_str(&format!("\nUnreadable lines: {}\n", self.unreadable));
            for e in &self.unreadable_first {
                out.push_str(&format!(
                    "  line {}: {}\n    {}\n",
                    e.line,
                    e.reason,
                    printable(&e.text)
                ));
            }
        }
        out
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> Value {
        let top_denied: Vec<Value> = self
            .top_denied
            .iter()
            .map(|c| {
                let mut client = json!({"client": c.client, "rule": c.rule, "denied": c.denied});
                if c.over > 0 {
                    client["denied_at_least"] = json!(c.denied - c.over);
                }
                if let Some(requests) = c.requests {
                    client["requests"] = json!(requests);
                }
                client
            })
            .collect();
        let busiest = self.busiest.map(|b| {
            json!({
                "start": format_ms(b.start_ms),
                "requests": b.requests,
                "admitted": b.admitted,
                "denied": b.denied,
            })
        });
        let mut out = json!({
            "requests": self.requests,
            "admitted": self.admitted,
            "denied": self.denied,
            "refused": self.refused,
            "unmatched": self.unmatched,
            "first": self.span_ms.map(|s| format_ms(s.0)),
            "last": self.span_ms.map(|s| format_ms(s.1)),
            "rules": self.rules_json(),
            "top_denied": top_denied,
        });
        out[format!("busiest_{}", self.bucket_name())] = json!(busiest);
        match self.kind {
            Kind::Replayed => {
                out["engine"] = json!(self.engine);
                out["format"] = json!(self.format);
                out["format_guessed_from"] = json!(self.format_guessed_from);
                out["late"] = json!(self.late);
                out["unreadable"] = json!({
                    "count": self.unreadable,
                    "first": self.unreadable_first.iter().map(|e| json!({
                        "line": e.line, "reason": e.reason, "text": e.text,
                    })).collect::<Vec<_>>(),
                });
            }
            Kind::Recorded => {
                out["bypassed"] = json!(self.bypassed);
                out["unavailable"] = json!(self.unavailable);
                out["calls"] = json!(self.calls);
            }
        }
        out
    }

    /// Each rule's mode and counts, by name, for [`Report::to_json`].
    fn rules_json(&self) -> Value {
        // A replay says what it counts; the isolates record more.
        let figures: &[RuleCount] = match self.kind {
            Kind::Replayed => &[
                RuleCount::Matched,
                RuleCount::Admitted,
                RuleCount::Denied,
                RuleCount::DeniedByOthers,
                RuleCount::ShadowWouldDeny,
                RuleCount::Refused,
                RuleCount::PenaltiesStarted,
                RuleCount::Delayed,
                RuleCount::DelayedMs,
            ],
            Kind::Recorded => &RuleCount::ALL,
        };
        let rules: serde_json::Map<String, Value> = (self.rules.iter().zip(0..))
            .map(|(r, i)| {
                let mut rule = serde_json::Map::new();
                rule.insert(
                    "mode".into(),
                    json!(if r.shadow { "shadow" } else { "enforce" }),
                );
                for c in figures {
                    rule.insert(c.name().into(), json!(r.counts[*c]));
                }
                if r.without_duration > 0 {
                    rule.insert("without_duration".into(), json!(r.without_duration));
                }
                if r.at_estimate > 0 {
                    rule.insert("at_estimate".into(), json!(r.at_estimate));
                }
                if self.kind == Kind::Recorded {
                    rule.insert("denied_from".into(), places_json(&r.denials));
                }
                // What the plot draws, a point a minute.
                if self.kind == Kind::Recorded {
                    let minutes = self.series.get(i).map(|points| {
                        let point = |p: &Point| {
                            json!({
                                "start": format_ms(p.start_s * 1000),
                                "admitted": p.admitted,
                                "denied": p.denied,
                                "denied_by_other_rules": p.denied_by_others,
                            })
                        };
                        points.iter().map(point).collect::<Vec<_>>()
                    });
                    rule.insert("minutes".into(), json!(minutes.unwrap_or_default()));
                }
                (r.name.clone(), Value::Object(rule))
            })
            .collect();
        Value::Object(rules)
    }
}
