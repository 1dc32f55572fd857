//! What a simulation counts, request by request, and how it reads: a table
//! per rule, the clients most denied, the busiest second; as text or JSON.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::{
    clock::format_ms,
    log::{LineError, REORDER_MS},
};
use crate::{
    decision::verdict::Decision,
    rules::{config::Config, rule::Mode},
};

/// How many unreadable lines the report quotes.
pub const QUOTED_LINES: usize = 5;

/// How many clients the "most denied" list holds.
pub const TOP_CLIENTS: usize = 10;

/// One rule's figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleReport {
    /// The rule's name.
    pub name: String,
    /// Whether it enforces or only reports.
    pub shadow: bool,
    /// Requests decided under it, or refused by it.
    pub matched: u64,
    /// Of those, requests the worker let through.
    pub admitted: u64,
    /// Requests it denied itself (several enforced rules may deny one).
    pub denied: u64,
    /// Requests it would have admitted, denied by another rule.
    pub denied_by_others: u64,
    /// A shadow rule: requests it would have denied (they went through).
    pub shadow_would_deny: u64,
    /// Requests it refused with 400: a key part given twice with different
    /// values (a shadow rule's count is of requests it would have refused).
    pub refused: u64,
    /// Penalties its denials started. Rules have no penalties yet (issue
    /// 13 adds them), so this stays 0 until they do.
    pub penalties_started: u64,
}

/// A client among the most denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientReport {
    /// The rule that denied it.
    pub rule: String,
    /// Its identifier under that rule, parts joined by ` | `.
    pub client: String,
    /// Requests of it that this rule denied.
    pub denied: u64,
    /// All its requests under this rule.
    pub requests: u64,
}

/// The second with the most requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SecondReport {
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
/// rule in one second of the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    /// Seconds since the epoch.
    pub second: u64,
    /// Requests under the rule that went through.
    pub admitted: u64,
    /// Requests the rule denied (a shadow rule: would have denied).
    pub denied: u64,
    /// Requests the rule admitted that another rule denied.
    pub denied_by_others: u64,
}

/// How one request counts on its rule's panel.
struct Counted {
    admitted: bool,
    denied: bool,
    denied_by_others: bool,
}

/// Everything a simulation found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// `redis` or `model`.
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
    /// The first and last request's time, epoch milliseconds.
    pub span_ms: Option<(u64, u64)>,
    /// Per rule, in configuration order.
    pub rules: Vec<RuleReport>,
    /// The clients most denied, most first.
    pub top_denied: Vec<ClientReport>,
    /// The busiest second, if any request was read.
    pub busiest: Option<SecondReport>,
    /// Lines that could not be read.
    pub unreadable: u64,
    /// The first [`QUOTED_LINES`] of them.
    pub unreadable_first: Vec<LineError>,
    /// Requests logged earlier than requests already decided (beyond the
    /// reordering window), decided at the latest time already reached.
    pub late: u64,
    /// Per rule, one point per second that had requests under it.
    pub series: Vec<Vec<Point>>,
}

/// Counts requests as they are decided, in time order.
pub struct Tally {
    report: Report,
    /// Per rule, requests and denials per client identifier.
    clients: Vec<HashMap<String, (u64, u64)>>,
    second: SecondReport,
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
                ..Report::default()
            },
            clients: vec![HashMap::new(); config.rules.len()],
            second: SecondReport::default(),
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
            self.second = SecondReport {
                start_ms,
                ..SecondReport::default()
            };
        }
        self.second.requests += 1;
        if admitted {
            r.admitted += 1;
            self.second.admitted += 1;
        } else if denied {
            r.denied += 1;
            self.second.denied += 1;
        } else {
            r.refused += 1;
        }
        // The earliest of equally busy seconds; the busiest so far grows with itself.
        if r.busiest.is_none_or(|b| self.second.requests > b.requests) {
            r.busiest = Some(self.second);
        }
    }

    fn point(&mut self, rule: usize, time_ms: u64, counted: Counted) {
        let second = time_ms / 1000;
        let series = &mut self.report.series[rule];
        if series.last().is_none_or(|p| p.second != second) {
            series.push(Point {
                second,
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
        let r = &mut self.report.rules[rule];
        r.matched += 1;
        r.refused += 1;
        self.request(time_ms, false, false);
    }

    /// A shadow rule that could not identify a request's client: it would
    /// have refused it, and is left out of the decision.
    pub fn shadow_refused(&mut self, rule: usize) {
        let r = &mut self.report.rules[rule];
        r.matched += 1;
        r.refused += 1;
    }

    /// A decided request: `rules` are the indices of the rules in the call,
    /// in call order, with the client's identifier under each.
    pub fn decided(&mut self, time_ms: u64, rules: &[(usize, String)], decision: &Decision) {
        self.request(time_ms, decision.admitted(), !decision.admitted());
        for (i, ((rule, client), state)) in rules.iter().zip(&decision.rules).enumerate() {
            let r = &mut self.report.rules[*rule];
            r.matched += 1;
            let denied_here = !state.admitted() && !r.shadow;
            // The panel's lines count what its title counts: a shadow rule's
            // red line is its would-deny, whatever became of the request.
            let counted = Counted {
                admitted: decision.admitted(),
                denied: denied_here || (r.shadow && !state.admitted()),
                denied_by_others: !decision.admitted() && !denied_here,
            };
            if counted.admitted {
                r.admitted += 1;
            } else if denied_here {
                r.denied += 1;
            } else {
                r.denied_by_others += 1;
            }
            if r.shadow && !state.admitted() {
                r.shadow_would_deny += 1;
            }
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
                self.report.rules[*rule].penalties_started += 1;
            }
        }
    }

    /// The report, with the most denied clients picked out.
    pub fn finish(mut self) -> Report {
        let mut denied: Vec<ClientReport> = self
            .clients
            .into_iter()
            .enumerate()
            .flat_map(|(rule, clients)| clients.into_iter().map(move |c| (rule, c)))
            .filter(|(_, (_, (_, d)))| *d > 0)
            .map(|(rule, (client, (requests, denied)))| ClientReport {
                rule: self.report.rules[rule].name.clone(),
                client,
                denied,
                requests,
            })
            .collect();
        // Ties in a stable order, so that a report reads the same every run.
        denied.sort_by(|a, b| {
            b.denied
                .cmp(&a.denied)
                .then_with(|| a.rule.cmp(&b.rule))
                .then_with(|| a.client.cmp(&b.client))
        });
        denied.truncate(TOP_CLIENTS);
        self.report.top_denied = denied;
        self.report
    }
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

impl Report {
    /// The per-rule table's header and rows.
    pub fn rule_rows(&self) -> (Vec<&'static str>, Vec<Vec<String>>) {
        let header = vec![
            "rule",
            "mode",
            "matched",
            "admitted",
            "denied",
            "denied by other rules",
            "shadow would deny",
            "refused (400)",
            "penalties started",
        ];
        let rows = self
            .rules
            .iter()
            .map(|r| {
                vec![
                    r.name.clone(),
                    if r.shadow { "shadow" } else { "enforce" }.to_owned(),
                    r.matched.to_string(),
                    r.admitted.to_string(),
                    r.denied.to_string(),
                    r.denied_by_others.to_string(),
                    r.shadow_would_deny.to_string(),
                    r.refused.to_string(),
                    r.penalties_started.to_string(),
                ]
            })
            .collect();
        (header, rows)
    }

    /// The report as text: a summary, the tables, and what could not be read.
    pub fn render_text(&self, source: &str) -> String {
        let mut out = String::new();
        let span = match self.span_ms {
            Some((a, b)) => format!(", {} to {}", format_ms(a), format_ms(b)),
            None => String::new(),
        };
        let format = match self.format_guessed_from {
            Some(line) => format!("{}, guessed from line {line}", self.format),
            None => self.format.clone(),
        };
        out.push_str(&format!(
            "{source} ({format}): {} requests{span}, decided by {}\n",
            self.requests, self.engine
        ));
        out.push_str(&format!(
            "admitted {}, denied (429) {}, refused (400) {}; no rule matched {}\n\n",
            self.admitted, self.denied, self.refused, self.unmatched
        ));
        let (header, rows) = self.rule_rows();
        out.push_str(&table(&header, &rows));
        if self.top_denied.is_empty() {
            out.push_str("\nNo client was denied.\n");
        } else {
            out.push_str("\nClients most denied:\n\n");
            let rows: Vec<Vec<String>> = self
                .top_denied
                .iter()
                .map(|c| {
                    vec![
                        c.client.clone(),
                        c.rule.clone(),
                        c.denied.to_string(),
                        c.requests.to_string(),
                    ]
                })
                .collect();
            out.push_str(&table(&["client", "rule", "denied", "of requests"], &rows));
        }
        if let Some(b) = self.busiest {
            out.push_str(&format!(
                "\nBusiest second: {}, {} requests: {} admitted, {} denied\n",
                format_ms(b.start_ms),
                b.requests,
                b.admitted,
                b.denied
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
        let rules: serde_json::Map<String, Value> = self
            .rules
            .iter()
            .map(|r| {
                (
                    r.name.clone(),
                    json!({
                        "mode": if r.shadow { "shadow" } else { "enforce" },
                        "matched": r.matched,
                        "admitted": r.admitted,
                        "denied": r.denied,
                        "denied_by_other_rules": r.denied_by_others,
                        "shadow_would_deny": r.shadow_would_deny,
                        "refused": r.refused,
                        "penalties_started": r.penalties_started,
                    }),
                )
            })
            .collect();
        json!({
            "engine": self.engine,
            "format": self.format,
            "format_guessed_from": self.format_guessed_from,
            "requests": self.requests,
            "admitted": self.admitted,
            "denied": self.denied,
            "refused": self.refused,
            "unmatched": self.unmatched,
            "first": self.span_ms.map(|s| format_ms(s.0)),
            "last": self.span_ms.map(|s| format_ms(s.1)),
            "rules": rules,
            "top_denied": self.top_denied.iter().map(|c| json!({
                "client": c.client, "rule": c.rule, "denied": c.denied, "requests": c.requests,
            })).collect::<Vec<_>>(),
            "busiest_second": self.busiest.map(|b| json!({
                "start": format_ms(b.start_ms),
                "requests": b.requests,
                "admitted": b.admitted,
                "denied": b.denied,
            })),
            "late": self.late,
            "unreadable": {
                "count": self.unreadable,
                "first": self.unreadable_first.iter().map(|e| json!({
                    "line": e.line, "reason": e.reason, "text": e.text,
                })).collect::<Vec<_>>(),
            },
        })
    }
}
