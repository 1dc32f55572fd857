//! What the isolates counted, as Prometheus reads it: `/metrics` on
//! `stats --serve`, and `stats --format openmetrics` for one print.
//!
//! The figures are the counters the stats script keeps beside the minutes
//! (`lua/stats.lua`): every figure ever written, added once per write,
//! whichever isolate wrote it. They only grow, so `rate()` and `increase()`
//! over them count what was written over the span; they start again from 0
//! only when no isolate has written for `stats_keep`, which Prometheus
//! reads as a counter reset.

use serde_json::Value;

use crate::{
    decision::{
        stats::{
            counts::{RuleCount, RuleCounts, TotalCount, TotalCounts, RULE_COUNTS, TOTAL_COUNTS},
            stored::{read_figures, ALL_REQUESTS, COUNTERS_KEY, WRITTEN},
        },
        transport::redis_rest::{RestClient, RestError},
    },
    operator::inspect::InspectError,
};

/// The counters of some rules, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Over every request.
    pub totals: TotalCounts,
    /// Per rule asked for, in that order (zeros for a rule never written).
    pub rules: Vec<(String, RuleCounts)>,
    /// When the last write landed, ms on Redis's clock; `None` before any.
    pub written_ms: Option<u64>,
}

/// Reads the counters of `rules` in one `HMGET`.
pub async fn read_counters(
    client: &RestClient,
    rules: &[String],
) -> Result<Counters, InspectError> {
    let mut command = vec!["HMGET", COUNTERS_KEY, ALL_REQUESTS, WRITTEN];
    command.extend(rules.iter().map(String::as_str));
    let reply = client.command(&command).await?;
    let values = reply
        .as_array()
        .ok_or_else(|| RestError::Malformed("HMGET answered something other than a list".into()))?;
    let text = |i: usize| values.get(i).and_then(Value::as_str).unwrap_or_default();
    Ok(Counters {
        totals: TotalCounts(read_figures::<TOTAL_COUNTS>(text(0))),
        written_ms: text(1).parse().ok(),
        rules: (rules.iter().enumerate())
            .map(|(i, name)| {
                let figures = read_figures::<RULE_COUNTS>(text(i + 2));
                (name.clone(), RuleCounts(figures))
            })
            .collect(),
    })
}

/// Which text format to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Prometheus's text exposition format, version 0.0.4.
    Prometheus,
    /// OpenMetrics 1.0 text, which ends in `# EOF`.
    OpenMetrics,
}

impl Flavor {
    /// The content type its answer carries.
    pub fn content_type(self) -> &'static str {
        match self {
            Flavor::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Flavor::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The flavor a scraper's `Accept` header asks for: OpenMetrics when it
    /// names it, else Prometheus's own.
    pub fn accepted(accept: &str) -> Flavor {
        match accept.contains("application/openmetrics-text") {
            true => Flavor::OpenMetrics,
            false => Flavor::Prometheus,
        }
    }
}

/// What a figure over every request counts, for its `# HELP` line.
fn total_help(t: TotalCount) -> &'static str {
    match t {
        TotalCount::Requests => "Requests the worker saw.",
        TotalCount::Admitted => {
            "Requests forwarded: every enforced rule admitted them, or none matched."
        }
        TotalCount::Denied => "Requests answered 429.",
        TotalCount::Refused => {
            "Requests answered 400: a key part given twice with different values."
        }
        TotalCount::Unmatched => "Requests no rule matched.",
        TotalCount::Bypassed => {
            "Requests forwarded undecided: Redis unavailable and every rule open."
        }
        TotalCount::Unavailable => "Requests answered 503: Redis unavailable and a rule closed.",
        TotalCount::Calls => {
            "Script calls the limiter made, each once however many rules it served."
        }
        TotalCount::WriteFailures => {
            "Stats writes that failed and were sent again, as the isolates reported later."
        }
        TotalCount::DroppedMinutes => {
            "Minutes of figures the isolates dropped unwritten, as they reported later."
        }
    }
}

/// What a rule's figure counts, for its `# HELP` line.
fn rule_help(r: RuleCount) -> &'static str {
    match r {
        RuleCount::Matched => {
            "Requests decided under the rule, refused by it, or undecided with Redis unavailable."
        }
        RuleCount::Admitted => "Requests of the rule that every enforced rule admitted.",
        RuleCount::Denied => "Requests the rule denied itself.",
        RuleCount::DeniedByOthers => {
            "Requests the rule would have admitted that another rule denied."
        }
        RuleCount::ShadowWouldDeny => "Requests a shadow rule would have denied.",
        RuleCount::Refused => "Requests the rule refused with 400.",
        RuleCount::FailOpen => {
            "Requests forwarded undecided under fail = \"open\", Redis unavailable."
        }
        RuleCount::FailClosed => {
            "Requests answered 503 under fail = \"closed\", Redis unavailable."
        }
        RuleCount::PenaltiesStarted => "Penalties the rule's denials started.",
        RuleCount::Leased => "Requests decided in an isolate from leased units, with no call.",
        RuleCount::Calls => "Script calls made for the rule.",
        RuleCount::Delayed => "Requests the rule had wait instead of denying them.",
        RuleCount::DelayedMs => "Milliseconds those requests waited, summed.",
    }
}

/// A label value as the text formats quote it.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One metric family's lines: its `# HELP` and `# TYPE`, then a sample per
/// `(labels, value)`.
fn family(
    out: &mut String,
    flavor: Flavor,
    (name, kind, help): (&str, &str, &str),
    samples: &[(String, String)],
) {
    // OpenMetrics names a counter's family without the `_total` its samples carry.
    let family = match (flavor, kind) {
        (Flavor::OpenMetrics, "counter") => name.trim_end_matches("_total"),
        _ => name,
    };
    out.push_str(&format!("# HELP {family} {help}\n# TYPE {family} {kind}\n"));
    for (labels, value) in samples {
        out.push_str(&format!("{name}{labels} {value}\n"));
    }
}

/// The exposition of `counters` at `now_ms`: a counter per figure over
/// every request (`edge_limiter_<figure>_total`) and per rule
/// (`edge_limiter_rule_<figure>_total{rule="..."}`), each figure named as
/// `stats --json` names it, and how old the last write is
/// (`edge_limiter_stats_age_seconds`, absent before any write).
pub fn exposition(counters: &Counters, now_ms: u64, flavor: Flavor) -> String {
    let mut out = String::new();
    for t in TotalCount::ALL {
        let name = format!("edge_limiter_{}_total", t.name());
        let samples = [(String::new(), counters.totals[t].to_string())];
        family(
            &mut out,
            flavor,
            (&name, "counter", total_help(t)),
            &samples,
        );
    }
    for r in RuleCount::ALL {
        let name = format!("edge_limiter_rule_{}_total", r.name());
        let samples: Vec<(String, String)> = (counters.rules.iter())
            .map(|(rule, c)| (format!("{{rule=\"{}\"}}", label(rule)), c[r].to_string()))
            .collect();
        family(&mut out, flavor, (&name, "counter", rule_help(r)), &samples);
    }
    let age: Vec<(String, String)> = (counters.written_ms.iter())
        .map(|w| {
            let ms = now_ms.saturating_sub(*w);
            (String::new(), format!("{}.{:03}", ms / 1000, ms % 1000))
        })
        .collect();
    let help = "Seconds since the last stats write landed in Redis.";
    let gauge = ("edge_limiter_stats_age_seconds", "gauge", help);
    family(&mut out, flavor, gauge, &age);
    if flavor == Flavor::OpenMetrics {
        out.push_str("# EOF\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters() -> Counters {
        let mut totals = TotalCounts::default();
        totals[TotalCount::Requests] = 12;
        totals[TotalCount::WriteFailures] = 1;
        let mut api = RuleCounts::default();
        api[RuleCount::Admitted] = 7;
        api[RuleCount::DelayedMs] = 1500;
        Counters {
            totals,
            rules: vec![("api".into(), api), ("login".into(), RuleCounts::default())],
            written_ms: Some(10_000),
        }
    }

    #[test]
    fn every_figure_is_a_counter_named_as_stats_json_names_it() {
        let text = exposition(&counters(), 12_345, Flavor::Prometheus);
        for line in [
            "# TYPE edge_limiter_requests_total counter\n",
            "edge_limiter_requests_total 12\n",
            "edge_limiter_write_failures_total 1\n",
            "edge_limiter_dropped_minutes_total 0\n",
            "# TYPE edge_limiter_rule_admitted_total counter\n",
            "edge_limiter_rule_admitted_total{rule=\"api\"} 7\n",
            "edge_limiter_rule_admitted_total{rule=\"login\"} 0\n",
            "edge_limiter_rule_delayed_ms_total{rule=\"api\"} 1500\n",
            "edge_limiter_rule_denied_by_other_rules_total{rule=\"api\"} 0\n",
            "# TYPE edge_limiter_stats_age_seconds gauge\n",
            "edge_limiter_stats_age_seconds 2.345\n",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
        assert!(!text.contains("# EOF"));
        let families = text.matches("# TYPE ").count();
        assert_eq!(families, TOTAL_COUNTS + RULE_COUNTS + 1);
    }

    #[test]
    fn openmetrics_names_families_without_total_and_ends_in_eof() {
        let text = exposition(&counters(), 12_345, Flavor::OpenMetrics);
        assert!(
            text.contains("# TYPE edge_limiter_requests counter\nedge_limiter_requests_total 12\n")
        );
        assert!(
            text.ends_with("edge_limiter_stats_age_seconds 2.345\n# EOF\n"),
            "{text}"
        );
        let never = Counters {
            written_ms: None,
            ..counters()
        };
        let text = exposition(&never, 0, Flavor::OpenMetrics);
        assert!(
            text.ends_with("# TYPE edge_limiter_stats_age_seconds gauge\n# EOF\n"),
            "{text}"
        );
        assert_eq!(
            Flavor::accepted("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
            Flavor::OpenMetrics
        );
        assert_eq!(Flavor::accepted("*/*"), Flavor::Prometheus);
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
