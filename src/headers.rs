//! The response headers a decision produces: `RateLimit-Policy` and
//! `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11), the
//! `X-RateLimit-*` convention, and `Retry-After` (RFC 9110) on denials.

use crate::{config::Rule, decision::Decision, policy::Policy};

/// Whole seconds, rounded up: a client that waits this long is never early.
pub fn seconds_up(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// One `RateLimit-Policy` item per window of each rule: `"name";q=Q;w=W`.
/// A rule with several windows names them `name.1`, `name.2`...
fn policy_items(rule: &Rule, out: &mut Vec<String>) {
    match &rule.policy {
        Policy::Gcra(g) => {
            // A full burst refills in burst x interval (bounded by the policy).
            let w = g.span_us().div_ceil(1_000_000).max(1);
            out.push(format!("\"{}\";q={};w={}", rule.name, g.burst(), w));
        }
        Policy::Windowed(ws) => {
            for (i, win) in ws.iter().enumerate() {
                let name = if ws.len() == 1 {
                    rule.name.clone()
                } else {
                    format!("{}.{}", rule.name, i + 1)
                };
                out.push(format!(
                    "\"{}\";q={};w={}",
                    name,
                    win.limit(),
                    seconds_up(win.duration_ms()).max(1)
                ));
            }
        }
    }
}

fn item_name(rule: &Rule, window: usize) -> String {
    match &rule.policy {
        Policy::Windowed(ws) if ws.len() > 1 => format!("{}.{}", rule.name, window),
        _ => rule.name.clone(),
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
    for r in rules {
        policy_items(r, &mut policies);
    }
    let current: Vec<String> = rules
        .iter()
        .zip(&decision.rules)
        .map(|(r, s)| {
            format!(
                "\"{}\";r={};t={}",
                item_name(r, s.window),
                s.remaining,
                seconds_up(s.reset_after_ms)
            )
        })
        .collect();
    let mut headers = vec![
        ("RateLimit-Policy".to_owned(), policies.join(", ")),
        ("RateLimit".to_owned(), current.join(", ")),
    ];
    if style.x_ratelimit {
        let b = &decision.rules[decision.binding];
        headers.push(("X-RateLimit-Limit".to_owned(), b.limit.to_string()));
        headers.push(("X-RateLimit-Remaining".to_owned(), b.remaining.to_string()));
        headers.push((
            "X-RateLimit-Reset".to_owned(),
            seconds_up(b.reset_after_ms).to_string(),
        ));
    }
    if !decision.allowed {
        if let Some(ms) = decision.retry_after_ms {
            headers.push(("Retry-After".to_owned(), seconds_up(ms).max(1).to_string()));
        }
    }
    headers
}

/// An RFC 9457 problem document for a denied request.
pub fn problem_body(rule: &Rule, decision: &Decision) -> String {
    let retry = decision.retry_after_ms.map(seconds_up);
    let detail = match retry {
        Some(s) => format!(
            "Rate limit `{}` exceeded; retry in {} s.",
            rule.name,
            s.max(1)
        ),
        None => format!(
            "Rate limit `{}` exceeded; this request costs more than the limit allows.",
            rule.name
        ),
    };
    serde_json::json!({
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": detail,
        "policy": rule.name,
        "retry_after": retry.map(|s| s.max(1)),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::Config, decision::RuleState};
    use serde_json::json;

    fn rules() -> Vec<Rule> {
        Config::from_json(&json!({"rules": [
            {"name": "burst", "key": ["ip"], "algorithm": "gcra", "rate": 100, "period": "1m"},
            {"name": "api", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 10, "100ms"], ["1h", 1000, "1m"]]}
        ]}))
        .unwrap()
        .rules
    }

    fn state(
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset_after_ms: u64,
        retry: Option<u64>,
        window: usize,
    ) -> RuleState {
        RuleState {
            allowed,
            limit,
            remaining,
            reset_after_ms,
            retry_after_ms: retry,
            window,
        }
    }

    #[test]
    fn admitted_requests_get_policy_and_state() {
        let rs = rules();
        let d = Decision {
            allowed: true,
            penalties_started: vec![],
            retry_after_ms: Some(0),
            binding: 1,
            rules: vec![
                state(true, 100, 50, 30_000, Some(0), 1),
                state(true, 10, 4, 900, Some(0), 1),
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
        use crate::policy::{MAX_DURATION_MS, MAX_GCRA_SPAN_US, MAX_UNITS};
        let longest_burst = MAX_GCRA_SPAN_US / 1000 / MAX_DURATION_MS;
        let rs = Config::from_json(&json!({"rules": [
            {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": MAX_DURATION_MS, "burst": longest_burst},
            {"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [[MAX_DURATION_MS, MAX_UNITS, MAX_DURATION_MS]]}
        ]}))
        .unwrap()
        .rules;
        let d = Decision {
            allowed: false,
            penalties_started: vec![],
            retry_after_ms: Some(u64::MAX),
            binding: 0,
            rules: vec![
                state(false, longest_burst, 0, u64::MAX, Some(u64::MAX), 1),
                state(true, MAX_UNITS, MAX_UNITS, MAX_DURATION_MS, Some(0), 1),
            ],
        };
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
        let d = Decision {
            allowed: false,
            penalties_started: vec![],
            retry_after_ms: Some(1001),
            binding: 0,
            rules: vec![state(false, 100, 0, 60_000, Some(1001), 1)],
        };
        let h = for_decision(&[&rs[0]], &d, HeaderStyle::default());
        assert!(h.contains(&("Retry-After".into(), "2".into())));
        let body: serde_json::Value = serde_json::from_str(&problem_body(&rs[0], &d)).unwrap();
        assert_eq!(body["status"], 429);
        assert_eq!(body["policy"], "burst");
        assert_eq!(body["retry_after"], 2);
        let soon = Decision {
            retry_after_ms: Some(1),
            ..d
        };
        assert!(for_decision(&[&rs[0]], &soon, HeaderStyle::default())
            .contains(&("Retry-After".into(), "1".into())));
    }
}
