//! Every response the worker makes itself, and the headers it adds to the
//! origin's: `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers-11), the `X-RateLimit-*`
//! convention, `Retry-After` (RFC 9110), and RFC 9457 problem documents
//! for 429, 400, 503 and a misconfigured worker.

use serde_json::json;

use crate::{
    decision::{
        limiter::{Decided, Forward, Outcome, UNAVAILABLE_RETRY_S},
        outcomes::verdict::{seconds_up, Decision, Retry, RuleState},
    },
    rules::{
        config::Config,
        overrides::{Override, BLOCK_TEXT},
        policy::Policy,
        rule::{Ambiguous, Rule},
    },
};

/// Header telling the client the limiter could not decide and let it through.
pub const BYPASS_HEADER: &str = "X-RateLimit-Bypassed";

/// A problem document's media type.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// What the worker does with a request, ready for the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Send it to the origin, then add `headers` to the origin's response.
    Forward {
        /// Headers to add.
        headers: Vec<(String, String)>,
        /// Milliseconds to wait first: the instant a delaying rule
        /// reserved for it (0: none).
        after_ms: u64,
    },
    /// Answer it here; the origin never sees it.
    Answer {
        /// HTTP status.
        status: u16,
        /// The body's media type.
        content_type: String,
        /// The body.
        body: String,
        /// Headers besides `Content-Type`.
        headers: Vec<(String, String)>,
    },
}

impl Response {
    /// The headers this response carries or adds.
    pub fn headers(&self) -> &[(String, String)] {
        match self {
            Response::Forward { headers, .. } | Response::Answer { headers, .. } => headers,
        }
    }
}

/// The response for `outcome` under `config`'s header switches.
pub fn render(outcome: &Outcome<'_>, config: &Config) -> Response {
    let style = HeaderStyle {
        x_ratelimit: config.x_ratelimit_headers,
    };
    match outcome {
        Outcome::Forward(Forward::Unlimited) => Response::Forward {
            headers: vec![],
            after_ms: 0,
        },
        Outcome::Forward(Forward::Admitted(decided)) => Response::Forward {
            headers: for_decision(&decided.rules, &decided.decision, style),
            after_ms: decided.decision.delay_ms(),
        },
        Outcome::Forward(Forward::Bypassed) => Response::Forward {
            headers: vec![(BYPASS_HEADER.to_owned(), "redis-unavailable".to_owned())],
            after_ms: 0,
        },
        Outcome::Deny(decided) => denial(decided, style),
        Outcome::Refuse { rule, ambiguous } => refusal(rule, ambiguous),
        Outcome::Unavailable => Response::Answer {
            status: 503,
            content_type: PROBLEM_JSON.to_owned(),
            body: json!({
                "type": "about:blank",
                "title": "Service Unavailable",
                "status": 503,
                "detail": "The rate limiter cannot decide right now; retry shortly.",
            })
            .to_string(),
            headers: vec![("Retry-After".to_owned(), UNAVAILABLE_RETRY_S.to_string())],
        },
    }
}

/// A 429: the binding rule's configured body, or a problem document.
fn denial(decided: &Decided<'_>, style: HeaderStyle) -> Response {
    let rule = decided.rules[decided.decision.binding()];
    let (content_type, body) = match &rule.deny_body {
        Some(custom) => (custom.content_type.clone(), custom.body.clone()),
        None => (
            PROBLEM_JSON.to_owned(),
            problem_body(rule, &decided.decision),
        ),
    };
    Response::Answer {
        status: 429,
        content_type,
        body,
        headers: for_decision(&decided.rules, &decided.decision, style),
    }
}

/// A 400 for a request that gives an enforced rule's key part several
/// values: the origin may read any of them, so no bucket would be right,
/// and charging one would let the client pick which.
fn refusal(rule: &Rule, a: &Ambiguous) -> Response {
    let body = json!({
        "type": "about:blank",
        "title": "Bad Request",
        "status": 400,
        "detail": format!(
            "`{}` appears more than once with different values; rule `{}` identifies clients by it, so send it once.",
            a.part, rule.name
        ),
        "parameter": a.part.to_string(),
        "policy": rule.name,
    });
    Response::Answer {
        status: 400,
        content_type: PROBLEM_JSON.to_owned(),
        body: body.to_string(),
        headers: vec![],
    }
}

/// The body of a response the worker answers when it cannot serve at all
/// (a misconfiguration): a problem document with `status` and `detail`.
pub fn failure_body(status: u16, detail: &str) -> String {
    json!({ "type": "about:blank", "status": status, "detail": detail }).to_string()
}

/// `RateLimit-Policy` items of `rule`, one per window, `"name";q=Q;w=W`
/// (a rule with several windows names them `name.1`, `name.2`...): its
/// quota and window (for GCRA, the time a full burst takes to refill),
/// under `overridden` where an override holds, else the rule's figures.
fn policy_items(rule: &Rule, overridden: Option<Policy>, out: &mut Vec<String>) {
    let quotas = (overridden.as_ref().unwrap_or(&rule.policy))
        .algorithm()
        .quotas();
    for (i, (q, w)) in quotas.iter().enumerate() {
        let name = match quotas.len() {
            1 => rule.name.clone(),
            _ => format!("{}.{}", rule.name, i + 1),
        };
        out.push(format!("\"{name}\";q={q};w={w}"));
    }
}

fn item_name(rule: &Rule, window: usize) -> String {
    match rule.policy.algorithm().items() {
        1 => rule.name.clone(),
        _ => format!("{}.{}", rule.name, window),
    }
}

/// Header switches a deployment may turn off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderStyle {
    /// Also send `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
    pub x_ratelimit: bool,
}

impl Default for HeaderStyle {
    fn default() -> Self {
        HeaderStyle { x_ratelimit: true }
    }
}

/// The headers for `decision` over `rules` (same order as the decision).
pub fn for_decision(
    rules: &[&Rule],
    decision: &Decision,
    style: HeaderStyle,
) -> Vec<(String, String)> {
    let mut policies = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        policy_items(r, overridden(r, decision, i), &mut policies);
    }
    let current: Vec<String> = rules
        .iter()
        .zip(&decision.rules)
        .enumerate()
        .map(|(i, (r, s))| {
            let (remaining, reset) = shown(s, blocked(decision, i));
            let name = item_name(r, s.window);
            match reset {
                Some(t) => format!("\"{name}\";r={remaining};t={t}"),
                None => format!("\"{name}\";r={remaining}"),
            }
        })
        .collect();
    let mut headers = vec![
        ("RateLimit-Policy".to_owned(), policies.join(", ")),
        ("RateLimit".to_owned(), current.join(", ")),
    ];
    if style.x_ratelimit {
        let i = decision.binding();
        let b = &decision.rules[i];
        let (remaining, reset) = shown(b, blocked(decision, i));
        headers.push(("X-RateLimit-Limit".to_owned(), b.limit.to_string()));
        headers.push(("X-RateLimit-Remaining".to_owned(), remaining.to_string()));
        if let Some(t) = reset {
            headers.push(("X-RateLimit-Reset".to_owned(), t.to_string()));
        }
    }
    if let Some(s) = decision.retry().and_then(Retry::seconds) {
        headers.push(("Retry-After".to_owned(), s.to_string()));
    }
    headers
}

/// A rule's units left and seconds to its reset as the headers give them.
/// A rule that denies the request has none left for it, whatever its
/// count says (a running penalty or a block denies with units in the
/// bucket; a request that costs more than is left sees none either), and a
/// block without end never resets: no reset at all, rather than a time
/// after which the client would still be refused.
fn shown(state: &RuleState, blocked: bool) -> (u64, Option<u64>) {
    match state.retry() {
        None => (state.remaining, Some(seconds_up(state.reset_after_ms))),
        Some(Retry::Never) if blocked => (0, None),
        Some(_) => (0, Some(seconds_up(state.reset_after_ms))),
    }
}

/// Whether rule `i` was decided under a block an operator set.
fn blocked(decision: &Decision, i: usize) -> bool {
    decision
        .override_of(i)
        .is_some_and(|o| o.text == BLOCK_TEXT)
}

/// The figures of the override the script applied to rule `i`, if any
/// (a block has none: its denial shows the rule's own).
fn overridden(rule: &Rule, decision: &Decision, i: usize) -> Option<Policy> {
    let read = decision.override_of(i)?;
    match Override::parse(&read.text, &rule.policy)? {
        Override::Figures(policy) => Some(policy),
        Override::Block => None,
    }
}

/// An RFC 9457 problem document for a denied request; `rule` is the
/// binding one.
pub fn problem_body(rule: &Rule, decision: &Decision) -> String {
    let retry = decision.retry().and_then(Retry::seconds);
    let name = &rule.name;
    let detail = match (blocked(decision, decision.binding()), retry) {
        (true, Some(s)) => {
            format!("An operator blocked this client on `{name}`; retry in {s} s.")
        }
        (true, None) => {
            format!("An operator blocked this client on `{name}` until the block is lifted.")
        }
        (false, Some(s)) => format!("Rate limit `{name}` exceeded; retry in {s} s."),
        (false, None) => {
            format!("Rate limit `{name}` exceeded; this request costs more than the limit allows.")
        }
    };
    json!({
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": detail,
        "policy": rule.name,
        "retry_after": retry,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::outcomes::verdict::{
        OverrideRead, OverrideSource, RequestVerdict, Verdict,
    };
    use serde_json::json;

    fn config() -> Config {
        Config::from_json(&json!({"rules": [
            {"name": "burst", "key": ["ip"], "algorithm": "gcra", "rate": 100, "period": "1m"},
            {"name": "api", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 10, "100ms"], ["1h", 1000, "1m"]]}
        ]}))
        .unwrap()
    }

    fn rules() -> Vec<Rule> {
        config().rules
    }

    fn state(verdict: Verdict, limit: u64, remaining: u64, reset_after_ms: u64) -> RuleState {
        RuleState {
            verdict,
            limit,
            remaining,
            reset_after_ms,
            window: 1,
        }
    }

    fn denied(binding: usize, ms: u64, rules: Vec<RuleState>) -> Decision {
        Decision {
            verdict: RequestVerdict::Denied {
                binding,
                retry: Retry::After { ms },
            },
            rules,
            penalties_started: vec![],
            refund_marks: vec![],
            grants: vec![],
            overrides: vec![],
            pools: vec![],
        }
    }

    const ADMITTED: Verdict = Verdict::Admitted;

    fn after(ms: u64) -> Verdict {
        Verdict::Denied(Retry::After { ms })
    }

    #[test]
    fn admitted_requests_get_policy_and_state() {
        let rs = rules();
        let d = Decision {
            verdict: RequestVerdict::Admitted {
                tightest: 1,
                delay_ms: 0,
            },
            penalties_started: vec![],
            refund_marks: vec![],
            grants: vec![],
            overrides: vec![],
            pools: vec![],
            rules: vec![
                state(ADMITTED, 100, 50, 30_000),
                state(ADMITTED, 10, 4, 900),
            ],
        };
        let h = for_decision(&[&rs[0], &rs[1]], &d, HeaderStyle::default());
        let get = |n: &str| h.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(
            get("RateLimit-Policy"),
            Some("\"burst\";q=100;w=60, \"api.1\";q=10;w=1, \"api.2\";q=1000;w=3600")
        );
        assert_eq!(
            get("RateLimit"),
            Some("\"burst\";r=50;t=30, \"api.1\";r=4;t=1")
        );
        assert_eq!(
            (
                get("X-RateLimit-Limit"),
                get("X-RateLimit-Remaining"),
                get("X-RateLimit-Reset")
            ),
            (Some("10"), Some("4"), Some("1"))
        );
        assert_eq!(get("Retry-After"), None);
        let quiet = for_decision(&[&rs[0], &rs[1]], &d, HeaderStyle { x_ratelimit: false });
        assert!(quiet.iter().all(|(k, _)| !k.starts_with("X-")));
    }

    #[test]
    fn the_largest_accepted_figures_make_exact_headers() {
        use crate::rules::policy::{MAX_DURATION_MS, MAX_GCRA_SPAN_US, MAX_UNITS};
        let longest_burst = MAX_GCRA_SPAN_US / 1000 / MAX_DURATION_MS;
        let rs = Config::from_json(&json!({"rules": [
            {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": MAX_DURATION_MS, "burst": longest_burst},
            {"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [[MAX_DURATION_MS, MAX_UNITS, MAX_DURATION_MS]]}
        ]}))
        .unwrap()
        .rules;
        let d = denied(
            0,
            u64::MAX,
            vec![
                state(after(u64::MAX), longest_burst, 0, u64::MAX),
                state(ADMITTED, MAX_UNITS, MAX_UNITS, MAX_DURATION_MS),
            ],
        );
        let h = for_decision(&[&rs[0], &rs[1]], &d, HeaderStyle::default());
        let get = |n: &str| h.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let span_s = longest_burst * MAX_DURATION_MS / 1000;
        assert_eq!(
            get("RateLimit-Policy").unwrap(),
            format!("\"g\";q={longest_burst};w={span_s}, \"w\";q={MAX_UNITS};w=31622400")
        );
        assert_eq!(
            get("Retry-After").unwrap(),
            u64::MAX.div_ceil(1000).to_string()
        );
    }

    #[test]
    fn denials_round_retry_after_up() {
        let rs = rules();
        let d = denied(0, 1001, vec![state(after(1001), 100, 0, 60_000)]);
        let h = for_decision(&[&rs[0]], &d, HeaderStyle::default());
        assert!(h.contains(&("Retry-After".into(), "2".into())));
        let body: serde_json::Value = serde_json::from_str(&problem_body(&rs[0], &d)).unwrap();
        assert_eq!(body["status"], 429);
        assert_eq!(body["policy"], "burst");
        assert_eq!(body["retry_after"], 2);
        let soon = denied(0, 1, d.rules.clone());
        assert!(for_decision(&[&rs[0]], &soon, HeaderStyle::default())
            .contains(&("Retry-After".into(), "1".into())));
    }

    /// The 429 for one rule denied with `state`, under an operator's block
    /// when `block`: its headers and its problem document.
    fn answered(state: RuleState, block: bool) -> (Vec<(String, String)>, serde_json::Value) {
        let config = config();
        let retry = state.retry().expect("a denied rule");
        let mut decision = denied(0, 0, vec![state]);
        decision.verdict = RequestVerdict::Denied { binding: 0, retry };
        if block {
            decision.overrides.push(OverrideRead {
                rule: 0,
                source: OverrideSource::Client,
                text: BLOCK_TEXT.to_owned(),
                ignored: false,
            });
        }
        let decided = Decided {
            rules: vec![&config.rules[0]],
            decision,
        };
        match render(&Outcome::Deny(decided), &config) {
            Response::Answer {
                status: 429,
                body,
                headers,
                ..
            } => (headers, serde_json::from_str(&body).unwrap()),
            other => panic!("{other:?}"),
        }
    }

    fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_refused_request_is_never_told_it_has_units_left() {
        // A running penalty denies with the bucket full (20 of 100 here);
        // a request that costs more than is left is refused with 3 left.
        for (state, retry_s) in [
            (state(after(90_000), 100, 20, 90_000), "90"),
            (state(after(1_000), 100, 3, 58_800), "1"),
        ] {
            let (h, body) = answered(state, false);
            let reset = seconds_up(state.reset_after_ms).to_string();
            assert_eq!(
                header(&h, "RateLimit"),
                Some(format!("\"burst\";r=0;t={reset}").as_str())
            );
            assert_eq!(header(&h, "X-RateLimit-Remaining"), Some("0"));
            assert_eq!(header(&h, "X-RateLimit-Reset"), Some(reset.as_str()));
            assert_eq!(header(&h, "Retry-After"), Some(retry_s));
            assert!(
                body["detail"]
                    .as_str()
                    .unwrap()
                    .starts_with("Rate limit `burst` exceeded"),
                "{body}"
            );
        }
        // Beside a denying rule, an admitting one still tells its own count.
        let rs = rules();
        let d = denied(
            0,
            5_000,
            vec![
                state(after(5_000), 100, 7, 5_000),
                state(ADMITTED, 10, 4, 900),
            ],
        );
        let h = for_decision(&[&rs[0], &rs[1]], &d, HeaderStyle::default());
        assert_eq!(
            header(&h, "RateLimit"),
            Some("\"burst\";r=0;t=5, \"api.1\";r=4;t=1")
        );
    }

    #[test]
    fn a_block_says_who_blocked_and_an_endless_one_never_resets() {
        // A block for 90 s over a bucket with 20 units in it.
        let (h, body) = answered(state(after(90_000), 100, 20, 90_000), true);
        assert_eq!(header(&h, "RateLimit"), Some("\"burst\";r=0;t=90"));
        assert_eq!(header(&h, "X-RateLimit-Remaining"), Some("0"));
        assert_eq!(header(&h, "X-RateLimit-Reset"), Some("90"));
        assert_eq!(header(&h, "Retry-After"), Some("90"));
        assert_eq!(
            body["detail"],
            "An operator blocked this client on `burst`; retry in 90 s."
        );
        assert_eq!(body["retry_after"], 90);
        // Without end: no reset and no Retry-After, which would promise one.
        let (h, body) = answered(state(Verdict::Denied(Retry::Never), 100, 0, 0), true);
        assert_eq!(header(&h, "RateLimit"), Some("\"burst\";r=0"));
        assert_eq!(header(&h, "X-RateLimit-Remaining"), Some("0"));
        assert_eq!(header(&h, "X-RateLimit-Reset"), None);
        assert_eq!(header(&h, "Retry-After"), None);
        assert_eq!(
            body["detail"],
            "An operator blocked this client on `burst` until the block is lifted."
        );
        assert_eq!(body["retry_after"], serde_json::Value::Null);
    }

    #[test]
    fn configured_bodies_and_header_switches_apply() {
        let c = Config::from_json(&json!({"x_ratelimit_headers": false, "rules": [
            {"name": "login", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m", "deny_body": "slow down"}
        ]}))
        .unwrap();
        let decided = Decided {
            rules: vec![&c.rules[0]],
            decision: denied(0, 60_000, vec![state(after(60_000), 1, 0, 60_000)]),
        };
        let Response::Answer {
            status,
            content_type,
            body,
            headers,
        } = render(&Outcome::Deny(decided), &c)
        else {
            panic!("a denial is answered here")
        };
        assert_eq!(
            (status, content_type.as_str(), body.as_str()),
            (429, "text/plain; charset=utf-8", "slow down")
        );
        assert!(headers.contains(&("Retry-After".into(), "60".into())));
        assert!(
            headers.iter().all(|(k, _)| !k.starts_with("X-RateLimit")),
            "{headers:?}"
        );
    }

    #[test]
    fn every_outcome_has_its_response() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "login", "key": ["query:u"], "algorithm": "gcra", "rate": 1, "period": "1m"}
        ]}))
        .unwrap();
        let rule = &c.rules[0];
        let decided = Decided {
            rules: vec![rule],
            decision: denied(0, 60_000, vec![state(after(60_000), 1, 0, 60_000)]),
        };
        let answer = |outcome: Outcome<'_>| match render(&outcome, &c) {
            Response::Answer {
                status,
                content_type,
                body,
                headers,
            } => (status, content_type, body, headers),
            forward => panic!("{forward:?}"),
        };
        let (status, content_type, body, _) = answer(Outcome::Deny(decided));
        assert_eq!((status, content_type.as_str()), (429, PROBLEM_JSON));
        assert!(body.contains("\"policy\":\"login\""), "{body}");
        let ambiguous = Ambiguous {
            part: rule.key[0].clone(),
        };
        let (status, _, body, _) = answer(Outcome::Refuse { rule, ambiguous });
        assert_eq!(status, 400);
        assert!(body.contains("\"parameter\":\"query:u\""), "{body}");
        let (status, _, _, headers) = answer(Outcome::Unavailable);
        assert_eq!(status, 503);
        assert_eq!(headers, [("Retry-After".to_owned(), "1".to_owned())]);
        assert_eq!(
            render(&Outcome::Forward(Forward::Bypassed), &c).headers(),
            [(BYPASS_HEADER.to_owned(), "redis-unavailable".to_owned())]
        );
        assert!(render(&Outcome::Forward(Forward::Unlimited), &c)
            .headers()
            .is_empty());
    }
}
