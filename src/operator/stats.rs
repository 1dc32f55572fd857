//! `edge-limiter stats`: what the deployment's isolates recorded, read from
//! its Redis with the settings `inspect` uses, and told as the very report
//! `simulate` prints ([`Report`], rendered by the same code), so that what a
//! policy would have done and what it did read alike.

use std::future::Future;

use crate::{
    decision::{
        stats::{
            counts::{add, RuleCount, RuleCounts, TotalCount, TotalCounts},
            recorder::MINUTE_MS,
            stored::{
                day_key, field, read_rule_day, read_totals_day, rule_fields, DAY_MINUTES, DAY_MS,
            },
            top::{Denials, KEPT},
        },
        transport::redis_rest::{RestClient, RestError},
    },
    operator::{
        inspect::{find_rule, InspectError},
        simulate::report::{
            most_denied, BucketReport, ClientReport, Kind, Point, Report, RuleReport, TotalPoint,
        },
    },
    rules::{config::Config, rule::Mode},
};

impl Recorded {
    /// Adds what `other` recorded over the same span for the same rules
    /// (another region's isolates): each minute's figures summed, and its
    /// denials' summaries merged.
    pub fn add(&mut self, other: Recorded) {
        for (minute, t) in other.totals {
            match self.totals.iter_mut().find(|(m, _)| *m == minute) {
                Some((_, mine)) => add(&mut mine.0, &t.0),
                None => self.totals.push((minute, t)),
            }
        }
        self.totals.sort_by_key(|(m, _)| *m);
        for ((_, mine), (_, theirs)) in self.rules.iter_mut().zip(other.rules) {
            for (minute, counts, denials) in theirs {
                match mine.iter_mut().find(|(m, _, _)| *m == minute) {
                    Some((_, c, d)) => {
                        add(&mut c.0, &counts.0);
                        d.merge(&denials);
                        d.trim(KEPT);
                    }
                    None => mine.push((minute, counts, denials)),
                }
            }
            mine.sort_by_key(|(m, _, _)| *m);
        }
    }
}

/// The span asked for: from `since_ms` (inclusive) to `until_ms`
/// (exclusive), epoch milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Its start.
    pub since_ms: u64,
    /// Its end.
    pub until_ms: u64,
}

impl Span {
    /// The minutes (since the epoch) the span touches.
    fn minutes(self) -> std::ops::Range<u64> {
        self.since_ms / MINUTE_MS..self.until_ms.saturating_sub(1) / MINUTE_MS + 1
    }

    /// The days (since the epoch) the span touches.
    fn days(self) -> std::ops::RangeInclusive<u64> {
        self.since_ms / DAY_MS..=self.until_ms.saturating_sub(1) / DAY_MS
    }
}

/// One minute of one rule, as recorded.
pub type RuleMinute = (u64, RuleCounts, Denials);

/// What the isolates recorded over a span, minute by minute.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// Over every request: per minute (since the epoch), its figures.
    pub totals: Vec<(u64, TotalCounts)>,
    /// Per rule read, in the order asked: its name and its minutes.
    pub rules: Vec<(String, Vec<RuleMinute>)>,
}

/// The `fields` of the hash at `key` that hold something, with their
/// values, in one `HMGET`: only what a span shows is read, not the day.
pub(crate) async fn hmget(
    client: &RestClient,
    key: &str,
    fields: &[String],
) -> Result<Vec<(String, String)>, RestError> {
    if fields.is_empty() {
        return Ok(vec![]);
    }
    let mut command = vec!["HMGET", key];
    command.extend(fields.iter().map(String::as_str));
    let reply = client.command(&command).await?;
    let values = reply
        .as_array()
        .ok_or_else(|| RestError::Malformed("HMGET answered something other than a list".into()))?;
    Ok((fields.iter().zip(values))
        .filter_map(|(f, v)| Some((f.clone(), v.as_str()?.to_owned())))
        .collect())
}

/// The rules `names` asks for, in `config`'s order when it names none.
pub fn selected(config: &Config, names: &[String]) -> Result<Vec<String>, InspectError> {
    if names.is_empty() {
        return Ok(config.rules.iter().map(|r| r.name.clone()).collect());
    }
    names
        .iter()
        .map(|n| find_rule(config, n).map(|r| r.name.clone()))
        .collect()
}

/// Reads what the isolates recorded over `span` for `rules`: one `HMGET`
/// of the span's minutes per day, and per rule and day.
pub async fn read(
    client: &RestClient,
    rules: &[String],
    span: Span,
) -> Result<Recorded, InspectError> {
    let wanted = span.minutes();
    let mut recorded = Recorded {
        totals: Vec::new(),
        rules: rules.iter().map(|r| (r.clone(), Vec::new())).collect(),
    };
    for day in span.days() {
        let minutes = (day * DAY_MINUTES..(day + 1) * DAY_MINUTES).filter(|m| wanted.contains(m));
        let minutes: Vec<u64> = minutes.collect();
        let figures: Vec<String> = minutes.iter().map(|m| field(*m, None)).collect();
        let every: Vec<String> = minutes.iter().flat_map(|m| rule_fields(*m)).collect();
        let key = day_key(day, None);
        let totals = hmget(client, &key, &figures).await?;
        recorded.totals.extend(
            read_totals_day(day, &totals)
                .into_iter()
                .filter(|(m, _)| wanted.contains(m)),
        );
        for (rule, minutes) in &mut recorded.rules {
            let key = day_key(day, Some(rule));
            let fields = hmget(client, &key, &every).await?;
            minutes.extend(
                read_rule_day(day, &fields)
                    .into_iter()
                    .filter(|(m, _, _)| wanted.contains(m)),
            );
        }
    }
    recorded.totals.sort_by_key(|(m, _)| *m);
    for (_, minutes) in &mut recorded.rules {
        minutes.sort_by_key(|(m, _, _)| *m);
    }
    Ok(recorded)
}

/// [`read`] of each region's Redis in `clients`, added up.
pub async fn read_all(
    clients: &[RestClient],
    rules: &[String],
    span: Span,
) -> Result<Recorded, InspectError> {
    added_up(clients, |c| read(c, rules, span), Recorded::add).await
}

/// What `each` reads from every client in turn, the first as it is and
/// each after it put in with `add`; the default for no client.
pub(crate) async fn added_up<'c, T: Default, R: Future<Output = Result<T, InspectError>>>(
    clients: &'c [RestClient],
    each: impl Fn(&'c RestClient) -> R,
    add: fn(&mut T, T),
) -> Result<T, InspectError> {
    let mut all: Option<T> = None;
    for client in clients {
        let read = each(client).await?;
        match &mut all {
            Some(all) => add(all, read),
            None => all = Some(read),
        }
    }
    Ok(all.unwrap_or_default())
}

/// The report of what was recorded over `span`, under `config`'s rules.
pub fn report(config: &Config, span: Span, recorded: &Recorded) -> Report {
    let mut totals = TotalCounts::default();
    let mut busiest: Option<BucketReport> = None;
    let mut totals_series = Vec::new();
    for (minute, t) in &recorded.totals {
        add(&mut totals.0, &t.0);
        totals_series.push(TotalPoint {
            start_s: minute * MINUTE_MS / 1000,
            admitted: t[TotalCount::Admitted],
            denied: t[TotalCount::Denied],
            refused: t[TotalCount::Refused],
            bypassed: t[TotalCount::Bypassed],
            unavailable: t[TotalCount::Unavailable],
        });
        // The earliest of equally busy minutes.
        if busiest.is_none_or(|b| t[TotalCount::Requests] > b.requests) {
            busiest = Some(BucketReport {
                start_ms: minute * MINUTE_MS,
                requests: t[TotalCount::Requests],
                admitted: t[TotalCount::Admitted],
                denied: t[TotalCount::Denied],
            });
        }
    }
    let mut rules = Vec::new();
    let mut series = Vec::new();
    let mut top_denied = Vec::new();
    for (name, minutes) in &recorded.rules {
        let shadow = config
            .rules
            .iter()
            .find(|r| r.name == *name)
            .is_some_and(|r| r.mode == Mode::Shadow);
        let mut counts = RuleCounts::default();
        let mut denials = Denials::default();
        let mut points = Vec::new();
        for (minute, c, top) in minutes {
            add(&mut counts.0, &c.0);
            denials.merge(top);
            points.push(Point {
                start_s: minute * MINUTE_MS / 1000,
                admitted: c[RuleCount::Admitted],
                // As in a replay: a shadow rule's red line is its would-deny.
                denied: c[RuleCount::Denied] + c[RuleCount::ShadowWouldDeny],
                denied_by_others: c[RuleCount::DeniedByOthers],
            });
        }
        top_denied.extend(
            (denials.clients.top(KEPT).into_iter()).map(|e| ClientReport {
                rule: name.clone(),
                client: e.name.clone(),
                denied: e.count,
                over: e.over,
                requests: None,
            }),
        );
        denials.trim(KEPT);
        rules.push(RuleReport {
            name: name.clone(),
            shadow,
            counts,
            denials,
            ..RuleReport::default()
        });
        series.push(points);
    }
    Report {
        kind: Kind::Recorded,
        requests: totals[TotalCount::Requests],
        admitted: totals[TotalCount::Admitted],
        denied: totals[TotalCount::Denied],
        refused: totals[TotalCount::Refused],
        unmatched: totals[TotalCount::Unmatched],
        bypassed: totals[TotalCount::Bypassed],
        unavailable: totals[TotalCount::Unavailable],
        calls: totals[TotalCount::Calls],
        span_ms: Some((span.since_ms, span.until_ms)),
        rules,
        // Ordered as a replay orders them.
        top_denied: most_denied(top_denied),
        bucket_ms: MINUTE_MS,
        busiest,
        series,
        totals_series,
        ..Report::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decision::stats::top::{Counted, TopDenied},
        operator::simulate::clock::format_ms,
    };
    use serde_json::json;

    fn config() -> Config {
        Config::from_json(&json!({"rules": [
            {"name": "api", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s"},
            {"name": "look", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s",
             "mode": "shadow"}
        ]}))
        .unwrap()
    }

    #[test]
    fn a_span_names_the_minutes_and_days_it_touches() {
        let span = Span {
            since_ms: DAY_MS - MINUTE_MS - 1,
            until_ms: DAY_MS + MINUTE_MS,
        };
        let day = DAY_MS / MINUTE_MS;
        assert_eq!(span.minutes(), day - 2..day + 1);
        assert_eq!(span.days(), 0..=1);
    }

    #[test]
    fn regions_recorded_add_up_minute_by_minute() {
        let counts = |n: u64| {
            let mut t = TotalCounts::default();
            t[TotalCount::Requests] = n;
            let mut r = RuleCounts::default();
            r[RuleCount::Denied] = n;
            (t, r)
        };
        let denied = |client: &str, n: u64| {
            let mut d = Denials::default();
            d.clients.add(client, n);
            d
        };
        let recorded = |minutes: &[(u64, u64, &str)]| Recorded {
            totals: minutes.iter().map(|&(m, n, _)| (m, counts(n).0)).collect(),
            rules: vec![(
                "api".into(),
                minutes
                    .iter()
                    .map(|&(m, n, c)| (m, counts(n).1, denied(c, n)))
                    .collect(),
            )],
        };
        let mut home = recorded(&[(10, 2, "192.0.2.1"), (12, 5, "192.0.2.1")]);
        home.add(recorded(&[(11, 1, "192.0.2.2"), (12, 3, "192.0.2.2")]));
        let requests: Vec<(u64, u64)> = (home.totals.iter())
            .map(|(m, t)| (*m, t[TotalCount::Requests]))
            .collect();
        assert_eq!(requests, [(10, 2), (11, 1), (12, 8)]);
        let (_, minutes) = &home.rules[0];
        let last = &minutes[2];
        assert_eq!((last.0, last.1[RuleCount::Denied]), (12, 8));
        let both: Vec<(&str, u64)> = (last.2.clients.top(KEPT).into_iter())
            .map(|e| (e.name.as_str(), e.count))
            .collect();
        assert_eq!(both, [("192.0.2.1", 5), ("192.0.2.2", 3)]);
    }

    #[test]
    fn recorded_minutes_make_the_replays_report() {
        let c = config();
        let mut busy = TotalCounts::default();
        busy[TotalCount::Requests] = 9;
        busy[TotalCount::Admitted] = 6;
        busy[TotalCount::Denied] = 3;
        let mut quiet = TotalCounts::default();
        quiet[TotalCount::Requests] = 2;
        quiet[TotalCount::Admitted] = 2;
        let mut api = RuleCounts::default();
        api[RuleCount::Matched] = 9;
        api[RuleCount::Admitted] = 6;
        api[RuleCount::Denied] = 3;
        let mut top = Denials::default();
        top.clients.add("192.0.2.9", 3);
        top.countries.add("NL", 3);
        // An earlier minute whose summary Redis cut to what it keeps: a
        // client left out of it had at most one denial there.
        let seven = Counted {
            name: "192.0.2.7".into(),
            count: 2,
            over: 0,
        };
        let cut = Denials {
            clients: TopDenied::from_parts(vec![seven], 1),
            ..Denials::default()
        };
        let mut look = RuleCounts::default();
        look[RuleCount::Matched] = 2;
        look[RuleCount::Admitted] = 2;
        look[RuleCount::ShadowWouldDeny] = 1;
        let recorded = Recorded {
            totals: vec![(10, quiet), (11, busy)],
            rules: vec![
                (
                    "api".into(),
                    vec![(10, RuleCounts::default(), cut), (11, api, top)],
                ),
                ("look".into(), vec![(10, look, Denials::default())]),
            ],
        };
        let span = Span {
            since_ms: 10 * MINUTE_MS,
            until_ms: 12 * MINUTE_MS,
        };
        let r = report(&c, span, &recorded);
        assert_eq!((r.requests, r.admitted, r.denied), (11, 8, 3));
        assert_eq!(r.rules[0].counts.0[..3], api.0[..3]);
        assert!(r.rules[1].shadow);
        assert_eq!(
            r.top_denied,
            [
                ClientReport {
                    rule: "api".into(),
                    client: "192.0.2.9".into(),
                    denied: 4,
                    over: 1,
                    requests: None
                },
                ClientReport {
                    rule: "api".into(),
                    client: "192.0.2.7".into(),
                    denied: 2,
                    over: 0,
                    requests: None
                }
            ]
        );
        assert_eq!(r.busiest.unwrap().start_ms, 11 * MINUTE_MS);
        assert_eq!(r.series[1][0].denied, 1, "a shadow rule's would-deny");
        let text = r.render_text("stats");
        assert!(
            text.contains("Busiest minute: 1970-01-01T00:11:00"),
            "{text}"
        );
        assert!(text.contains("| 192.0.2.9 | api  | 3-4    |\n"), "{text}");
        assert!(text.contains("| api  | country NL |      3 |\n"), "{text}");
        assert!(
            text.contains("a client not listed under `api` at most 1."),
            "{text}"
        );
        let json = r.to_json();
        assert_eq!(json["top_denied"][0]["denied_at_least"], 3);
        let from = &json["rules"]["api"]["denied_from"];
        assert_eq!(
            from["countries"]["top"][0],
            json!({"country": "NL", "denied": 3})
        );
        assert_eq!(from["clients_unlisted_at_most"], 1);
        assert_eq!(r.to_json()["rules"]["look"]["shadow_would_deny"], 1);
        assert_eq!(r.to_json()["busiest_minute"]["requests"], 9);
        let minutes = &r.to_json()["rules"]["api"]["minutes"];
        assert_eq!(minutes.as_array().map(Vec::len), Some(2), "{minutes}");
        assert_eq!(minutes[1]["start"], format_ms(11 * MINUTE_MS));
        assert_eq!(
            (&minutes[1]["admitted"], &minutes[1]["denied"]),
            (&json!(6), &json!(3))
        );
        assert_eq!(r.to_json()["rules"]["look"]["minutes"][0]["denied"], 1);
    }
}
