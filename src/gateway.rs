//! The limiter's whole job for one request, runtime-independent: pick the
//! matching rules, ask Redis once, and say what to answer.

use std::time::Duration;

use serde_json::Value;

use crate::{
    config::{Config, FailMode, Rule},
    decision::{Check, Decision, ScriptCall},
    headers::{self, HeaderStyle},
    redis_rest::{RestClient, RestError},
    rules::RequestMeta,
    scripts,
};

/// Something that can run the limiter script: the REST client, or a fake.
// The worker is single-threaded, so the futures need not be `Send`.
#[allow(async_fn_in_trait)]
pub trait ScriptRunner {
    /// Runs the limiter script with this call's keys and arguments.
    async fn run(&self, call: &ScriptCall, budget: Duration) -> Result<Value, RestError>;
}

impl ScriptRunner for RestClient {
    async fn run(&self, call: &ScriptCall, budget: Duration) -> Result<Value, RestError> {
        self.run_script(&scripts::LIMITER, &call.keys, &call.args, budget)
            .await
    }
}

/// What to do with the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send it on to the origin, then add `headers` to the origin's response.
    Forward,
    /// Answer it here; the origin never sees it.
    Respond {
        /// HTTP status.
        status: u16,
        /// Body's media type.
        content_type: &'static str,
        /// Body.
        body: String,
    },
}

/// The answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Forward or answer.
    pub action: Action,
    /// Headers for the response, whichever it is.
    pub headers: Vec<(String, String)>,
    /// A line for the log, when something deserves one.
    pub log: Option<String>,
}

/// Header telling the client the limiter could not decide and let it through.
pub const BYPASS_HEADER: &str = "X-RateLimit-Bypassed";

/// Decides `req` under `config`; never fails: a Redis fault becomes each
/// rule's fail mode.
pub async fn handle(config: &Config, req: &RequestMeta, store: &impl ScriptRunner) -> Outcome {
    let matched: Vec<&Rule> = config.rules.iter().filter(|r| r.matches(req)).collect();
    if matched.is_empty() {
        return Outcome {
            action: Action::Forward,
            headers: vec![],
            log: None,
        };
    }
    let checks: Vec<(Check<'_>, Vec<&str>)> = matched
        .iter()
        .map(|r| {
            (
                Check {
                    rule: r,
                    cost: r.cost,
                },
                r.identifier(req),
            )
        })
        .collect();
    let call = ScriptCall::decide(&checks, None);
    // The tightest budget wins: no matched rule waits longer than it allows.
    let budget = matched
        .iter()
        .map(|r| r.budget_ms)
        .min()
        .unwrap_or(crate::config::DEFAULT_BUDGET_MS);
    let result = store.run(&call, Duration::from_millis(budget)).await;
    match result.and_then(|reply| Decision::from_reply(&reply, matched.len())) {
        Ok(decision) => decided(&matched, &decision),
        Err(error) => failed(&matched, &error),
    }
}

fn decided(matched: &[&Rule], decision: &Decision) -> Outcome {
    let headers = headers::for_decision(matched, decision, HeaderStyle::default());
    if decision.allowed {
        return Outcome {
            action: Action::Forward,
            headers,
            log: None,
        };
    }
    let rule = matched[decision.binding];
    Outcome {
        action: Action::Respond {
            status: 429,
            content_type: "application/problem+json",
            body: headers::problem_body(rule, decision),
        },
        headers,
        log: None,
    }
}

/// Seconds a client is told to wait when the limiter cannot decide.
const UNAVAILABLE_RETRY_S: u64 = 1;

fn failed(matched: &[&Rule], error: &RestError) -> Outcome {
    let names: Vec<&str> = matched.iter().map(|r| r.name.as_str()).collect();
    // One closed rule is enough to refuse: it asked never to be bypassed.
    if matched.iter().any(|r| r.fail == FailMode::Closed) {
        return Outcome {
            action: Action::Respond {
                status: 503,
                content_type: "application/problem+json",
                body: serde_json::json!({
                    "type": "about:blank",
                    "title": "Service Unavailable",
                    "status": 503,
                    "detail": "The rate limiter cannot decide right now; retry shortly.",
                })
                .to_string(),
            },
            headers: vec![("Retry-After".to_owned(), UNAVAILABLE_RETRY_S.to_string())],
            log: Some(format!(
                "edge-limiter: rules {names:?} failed closed: {error}"
            )),
        };
    }
    Outcome {
        action: Action::Forward,
        headers: vec![(BYPASS_HEADER.to_owned(), "redis-unavailable".to_owned())],
        log: Some(format!(
            "edge-limiter: rules {names:?} failed open, request forwarded unlimited: {error}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::cell::RefCell;

    struct Fake {
        reply: Result<Value, RestError>,
        seen: RefCell<Vec<(ScriptCall, Duration)>>,
    }

    impl ScriptRunner for Fake {
        async fn run(&self, call: &ScriptCall, budget: Duration) -> Result<Value, RestError> {
            self.seen.borrow_mut().push((call.clone(), budget));
            self.reply.clone()
        }
    }

    fn fake(reply: Result<Value, RestError>) -> Fake {
        Fake {
            reply,
            seen: RefCell::new(vec![]),
        }
    }

    fn config(fail: &str) -> Config {
        Config::from_json(&json!({"rules": [
            {"name": "ip", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s", "fail": fail, "budget": "300ms"},
            {"name": "login", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m", "path_prefix": "/login"}
        ]}))
        .unwrap()
    }

    fn req(path: &str) -> RequestMeta {
        RequestMeta {
            method: "GET".into(),
            path: path.into(),
            query: None,
            headers: vec![("cf-connecting-ip".into(), "192.0.2.1".into())],
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn only_matching_rules_are_sent() {
        let store = fake(Ok(json!([1, 0, 1, 1, 5, 4, 200, 0, 1])));
        let out = block_on(handle(&config("open"), &req("/"), &store));
        assert_eq!(out.action, Action::Forward);
        let seen = store.seen.borrow();
        assert_eq!(seen[0].0.keys, ["el:{192.0.2.1}:ip"]);
        assert_eq!(seen[0].1, Duration::from_millis(300));
    }

    #[test]
    fn a_denial_answers_429_with_retry_after() {
        let store = fake(Ok(json!([
            0, 60_000, 2, 1, 5, 4, 200, 0, 1, 0, 1, 0, 60_000, 60_000, 1
        ])));
        let out = block_on(handle(&config("open"), &req("/login"), &store));
        let Action::Respond { status, body, .. } = &out.action else {
            panic!("{out:?}")
        };
        assert_eq!(*status, 429);
        assert!(body.contains("\"policy\":\"login\""), "{body}");
        assert!(out.headers.contains(&("Retry-After".into(), "60".into())));
    }

    #[test]
    fn redis_faults_follow_the_fail_mode() {
        for error in [
            RestError::Timeout { budget_ms: 300 },
            RestError::Auth,
            RestError::Malformed("x".into()),
        ] {
            let open = block_on(handle(
                &config("open"),
                &req("/"),
                &fake(Err(error.clone())),
            ));
            assert_eq!(open.action, Action::Forward);
            assert_eq!(
                open.headers,
                [(BYPASS_HEADER.to_owned(), "redis-unavailable".to_owned())]
            );
            assert!(open.log.unwrap().contains("failed open"));
            // /login also matches the default-closed rule, so closed wins.
            let closed = block_on(handle(&config("open"), &req("/login"), &fake(Err(error))));
            assert!(matches!(closed.action, Action::Respond { status: 503, .. }));
            assert!(closed.headers.contains(&("Retry-After".into(), "1".into())));
        }
        let garbage = block_on(handle(&config("closed"), &req("/"), &fake(Ok(json!("OK")))));
        assert!(matches!(
            garbage.action,
            Action::Respond { status: 503, .. }
        ));
    }
}
