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
            counts::{
                add, RuleCount, RuleCounts, TotalCount, TotalCounts, RULE_COUNTS, TOTAL_COUNTS,
            },
            recorder::MINUTE_MS,
            stored::{
                day_key, field, read_figures, read_rule_day, ALL_REQUESTS, COUNTERS_KEY,
                DAY_MINUTES, WRITTEN,
            },
            top::{Denials, KEPT, PLACES},
        },
        transport::redis_rest::{RestClient, RestError, COMMAND_BUDGET},
    },
    operator::{
        inspect::InspectError,
        stats::{added_up, hmget},
    },
};

/// The counters of some rules, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Over every request.
    pub totals: TotalCounts,
    /// Per rule asked for, in that order (zeros for a rule never written).
    pub rules: Vec<(String, RuleCounts)>,
    /// When the last write landed, ms on the reading machine's clock (Redis
    /// stamped it with its own: see [`read_counters`]); `None` before any.
    pub written_ms: Option<u64>,
    /// Per rule asked for: where its denials came from over the last
    /// [`PLACES_MINUTES`] (empty when not read).
    pub places: Vec<(String, Denials)>,
}

impl Counters {
    /// Adds what `other` read for the same rules (another region's Redis):
    /// every counter summed, the places merged, and the newest write kept.
    pub fn add(&mut self, other: Counters) {
        add(&mut self.totals.0, &other.totals.0);
        for ((_, mine), (_, theirs)) in self.rules.iter_mut().zip(&other.rules) {
            add(&mut mine.0, &theirs.0);
        }
        for ((_, mine), (_, theirs)) in self.places.iter_mut().zip(&other.places) {
            mine.merge(theirs);
            mine.trim(KEPT);
        }
        self.written_ms = self.written_ms.max(other.written_ms);
    }
}

/// The minutes the places gauges cover: the read's own, as far as it was
/// written, and those before it.
pub const PLACES_MINUTES: u64 = 5;

/// Everything `/metrics` serves, read at `now_ms` (this machine's clock):
/// the counters in one `HMGET`, and per rule one more (two across
/// midnight) of the places its last [`PLACES_MINUTES`] denied from, those
/// minutes by Redis's clock, which stamped them.
pub async fn scrape(
    client: &RestClient,
    rules: &[String],
    now_ms: u64,
) -> Result<Counters, InspectError> {
    let (mut counters, redis_ms) = read_counters_timed(client, rules, now_ms).await?;
    let next = redis_ms / MINUTE_MS + 1;
    let minutes = next.saturating_sub(PLACES_MINUTES)..next;
    for rule in rules {
        let mut denials = Denials::default();
        let days = minutes.start / DAY_MINUTES..=minutes.end.saturating_sub(1) / DAY_MINUTES;
        for day in days {
            let fields: Vec<String> = (minutes.clone())
                .filter(|m| m / DAY_MINUTES == day)
                .flat_map(|m| [field(m, Some('g')), field(m, Some('a'))])
                .collect();
            let read = hmget(client, &day_key(day, Some(rule)), &fields).await?;
            for (_, _, d) in read_rule_day(day, &read) {
                denials.merge(&d);
            }
        }
        denials.trim(KEPT);
        counters.places.push((rule.clone(), denials));
    }
    Ok(counters)
}

/// [`scrape`] of each region's Redis in `clients`, added up.
pub async fn scrape_all(
    clients: &[RestClient],
    rules: &[String],
    now_ms: u64,
) -> Result<Counters, InspectError> {
    added_up(clients, |c| scrape(c, rules, now_ms), Counters::add).await
}

/// Reads the counters of `rules` in one `HMGET`, with the time of the
/// last write moved onto this machine's clock, which read `now_ms`.
pub async fn read_counters(
    client: &RestClient,
    rules: &[String],
    now_ms: u64,
) -> Result<Counters, InspectError> {
    Ok(read_counters_timed(client, rules, now_ms).await?.0)
}

/// [`read_counters`], and Redis's clock as it read them, ms: the `HMGET`
/// and a `TIME` in one pipeline.
async fn read_counters_timed(
    client: &RestClient,
    rules: &[String],
    now_ms: u64,
) -> Result<(Counters, u64), InspectError> {
    let mut command = vec!["HMGET", COUNTERS_KEY, ALL_REQUESTS, WRITTEN];
    command.extend(rules.iter().map(String::as_str));
    let commands = [
        command.iter().map(|&c| c.to_owned()).collect(),
        vec!["TIME".to_owned()],
    ];
    let mut replies = client
        .pipeline(&commands, COMMAND_BUDGET)
        .await?
        .into_iter();
    let (Some(values), Some(time)) = (replies.next(), replies.next()) else {
        return Err(
            RestError::Malformed("the pipeline answered fewer than two results".into()).into(),
        );
    };
    let (values, time) = (values?, time?);
    let values = values
        .as_array()
        .ok_or_else(|| RestError::Malformed("HMGET answered something other than a list".into()))?;
    let redis_ms = redis_time_ms(&time)
        .ok_or_else(|| RestError::Malformed(format!("TIME answered {time}")))?;
    let text = |i: usize| values.get(i).and_then(Value::as_str).unwrap_or_default();
    let counters = Counters {
        totals: TotalCounts(read_figures::<TOTAL_COUNTS>(text(0))),
        written_ms: (text(1).parse().ok()).map(|w| on_local_clock(w, redis_ms, now_ms)),
        places: vec![],
        rules: (rules.iter().enumerate())
            .map(|(i, name)| {
                let figures = read_figures::<RULE_COUNTS>(text(i + 2));
                (name.clone(), RuleCounts(figures))
            })
            .collect(),
    };
    Ok((counters, redis_ms))
}

/// `TIME`'s reply (seconds and microseconds, as strings) in ms.
fn redis_time_ms(time: &Value) -> Option<u64> {
    let part = |i: usize| time.get(i)?.as_str()?.parse::<u64>().ok();
    Some(part(0)? * 1000 + part(1)? / 1000)
}

/// `written_ms`, stamped by a Redis whose clock read `redis_ms` when this
/// machine's read `now_ms`, on this machine's clock: the age stays the
/// age Redis sees, however far apart the two clocks are.
fn on_local_clock(written_ms: u64, redis_ms: u64, now_ms: u64) -> u64 {
    now_ms.saturating_sub(redis_ms.saturating_sub(written_ms))
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
    places(&mut out, flavor, &counters.places);
    let help = "Seconds since the last stats write landed in Redis.";
    let gauge = ("edge_limiter_stats_age_seconds", "gauge", help);
    family(&mut out, flavor, gauge, &age);
    if flavor == Flavor::OpenMetrics {
        out.push_str("# EOF\n");
    }
    out
}

/// The places gauges: per rule, the ten countries and networks it denied
/// most over the last [`PLACES_MINUTES`], and how far each may be above
/// its true number where the count is approximate.
fn places(out: &mut String, flavor: Flavor, rules: &[(String, Denials)]) {
    for (at, what) in PLACES.into_iter().enumerate() {
        // A network's label is its number, as Prometheus users know it.
        let key = if what == "network" { "asn" } else { what };
        let mut counts = vec![];
        let mut over = vec![];
        for (rule, d) in rules {
            for e in d.places()[at].1.top(KEPT) {
                let labels = format!("{{rule=\"{}\",{key}=\"{}\"}}", label(rule), label(&e.name));
                counts.push((labels.clone(), e.count.to_string()));
                if e.over > 0 {
                    over.push((labels, e.over.to_string()));
                }
            }
        }
        let name = format!("edge_limiter_rule_denied_by_{what}");
        let help = format!(
            "Denials over the last {PLACES_MINUTES} minutes (this one so far) from the ten {what}s the rule \
             denied most (request.cf; \"-\": none given). An upper bound where approximate."
        );
        family(out, flavor, (&name, "gauge", &help), &counts);
        let name = format!("{name}_over");
        let help =
            format!("How far {what} counts shown as approximate may be above the true number.");
        family(out, flavor, (&name, "gauge", &help), &over);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::stats::top::{Counted, TopDenied};

    /// A write Redis stamped 2 s before its own now is 2 s old whichever
    /// way this machine's clock is off, and never from the future.
    #[test]
    fn a_writes_age_is_the_one_redis_sees() {
        let redis_ms = 1_700_000_002_000;
        for skew_ms in [0, 90_000, 3_600_000] {
            for now_ms in [redis_ms + skew_ms, redis_ms - skew_ms] {
                let written = on_local_clock(redis_ms - 2_000, redis_ms, now_ms);
                assert_eq!(now_ms - written, 2_000, "{skew_ms}");
            }
        }
        assert_eq!(on_local_clock(redis_ms + 5, redis_ms, 10), 10);
        let time = serde_json::json!(["1700000002", "345678"]);
        assert_eq!(redis_time_ms(&time), Some(1_700_000_002_345));
        assert_eq!(redis_time_ms(&serde_json::json!("OK")), None);
    }

    fn counters() -> Counters {
        let mut totals = TotalCounts::default();
        totals[TotalCount::Requests] = 12;
        totals[TotalCount::WriteFailures] = 1;
        let mut api = RuleCounts::default();
        api[RuleCount::Admitted] = 7;
        api[RuleCount::DelayedMs] = 1500;
        let mut places = Denials::default();
        places.countries.add("NL", 4);
        places.networks = TopDenied::from_parts(
            vec![Counted {
                name: "64496".into(),
                count: 9,
                over: 2,
            }],
            2,
        );
        Counters {
            totals,
            rules: vec![("api".into(), api), ("login".into(), RuleCounts::default())],
            written_ms: Some(10_000),
            places: vec![("api".into(), places)],
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
            "# TYPE edge_limiter_rule_denied_by_country gauge\n",
            "edge_limiter_rule_denied_by_country{rule=\"api\",country=\"NL\"} 4\n",
            "edge_limiter_rule_denied_by_network{rule=\"api\",asn=\"64496\"} 9\n",
            "edge_limiter_rule_denied_by_network_over{rule=\"api\",asn=\"64496\"} 2\n",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
        assert!(!text.contains("# EOF"));
        let families = text.matches("# TYPE ").count();
        assert_eq!(families, TOTAL_COUNTS + RULE_COUNTS + 5);
        assert!(!text.contains("by_country_over{"), "NL's count is exact");
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
