//! The limiter's whole job for one request, runtime-independent: pick the
//! matching rules, answer from the block cache or ask Redis once, and say
//! what to answer.

use std::{borrow::Cow, cell::RefCell, time::Duration};

use serde_json::Value;

use crate::{
    cache::{self, BlockCache},
    config::{Config, FailMode, Mode, Rule, DEFAULT_BUDGET_MS},
    decision::{Check, Decision, ScriptCall},
    headers::{self, HeaderStyle},
    redis_rest::{RestClient, RestError},
    rules::{Ambiguous, RequestMeta},
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
        content_type: String,
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
    /// Lines for the log, when something deserves them.
    pub log: Vec<String>,
}

/// Header telling the client the limiter could not decide and let it through.
pub const BYPASS_HEADER: &str = "X-RateLimit-Bypassed";

/// What one request is decided with: the configuration, Redis, and this
/// isolate's memory of denials and clock.
pub struct Limiter<'a, S> {
    /// The rules.
    pub config: &'a Config,
    /// Where the script runs.
    pub store: &'a S,
    /// Denials still in force, shared by the isolate's requests. Borrowed
    /// only briefly, never across an await, since requests interleave.
    pub cache: &'a RefCell<BlockCache>,
}

impl<S: ScriptRunner> Limiter<'_, S> {
    /// Decides `req` at `now_ms` (the isolate's clock, used only to age
    /// cached denials). Never fails: a Redis fault becomes the fail mode.
    pub async fn handle(&self, req: &RequestMeta, now_ms: u64) -> Outcome {
        let selection = match select(self.config, req) {
            Ok(selection) => selection,
            Err((rule, a)) => return ambiguous(rule, &a),
        };
        let mut notes: Vec<String> = selection
            .shadow_ambiguous
            .iter()
            .map(|(rule, a)| shadow_refusal_note(rule, a))
            .collect();
        if selection.rules.is_empty() {
            return Outcome {
                action: Action::Forward,
                headers: vec![],
                log: notes,
            };
        }
        let matched: Vec<&Rule> = selection.rules.iter().map(|(r, _)| *r).collect();
        let checks = selection.checks(&req.method);
        let mut outcome = self.decide(&matched, &checks, now_ms).await;
        notes.append(&mut outcome.log);
        outcome.log = notes;
        outcome
    }

    /// Decides the checks of the matched rules, from the cache or Redis.
    async fn decide(
        &self,
        matched: &[&Rule],
        checks: &[(Check<'_>, Vec<&str>)],
        now_ms: u64,
    ) -> Outcome {
        let call = ScriptCall::decide(checks, None);
        let signature = cache::signature(&call);
        let cached = self.cache.borrow_mut().lookup(&signature, now_ms);
        if let Some(decision) = cached {
            return self.decided(matched, &decision);
        }
        // The tightest budget wins: no matched rule waits longer than it allows.
        let budget = matched
            .iter()
            .map(|r| r.budget_ms)
            .min()
            .unwrap_or(DEFAULT_BUDGET_MS);
        let result = self.store.run(&call, Duration::from_millis(budget)).await;
        match result.and_then(|reply| call.decision(&reply)) {
            Ok(decision) => {
                self.cache
                    .borrow_mut()
                    .remember(signature, &decision, now_ms);
                self.decided(matched, &decision)
            }
            Err(error) => failed(matched, &error),
        }
    }

    fn decided(&self, matched: &[&Rule], decision: &Decision) -> Outcome {
        let style = HeaderStyle {
            x_ratelimit: self.config.x_ratelimit_headers,
        };
        let headers = headers::for_decision(matched, decision, style);
        let log = matched
            .iter()
            .zip(&decision.rules)
            .filter(|(r, s)| r.mode == Mode::Shadow && !s.allowed)
            .map(|(r, s)| {
                let wait = s
                    .retry_after_ms
                    .map_or("never".to_owned(), |ms| format!("{ms} ms"));
                format!(
                    "edge-limiter: shadow rule `{}` would deny this request (retry after {wait})",
                    r.name
                )
            })
            .collect();
        if decision.allowed {
            return Outcome {
                action: Action::Forward,
                headers,
                log,
            };
        }
        let rule = matched[decision.binding];
        let (content_type, body) = match &rule.deny_body {
            Some(custom) => (custom.content_type.clone(), custom.body.clone()),
            None => (
                "application/problem+json".to_owned(),
                headers::problem_body(rule, decision),
            ),
        };
        Outcome {
            action: Action::Respond {
                status: 429,
                content_type,
                body,
            },
            headers,
            log,
        }
    }
}

/// The rules a request falls under, as the worker picks them.
#[derive(Debug)]
pub struct Selection<'c, 'r> {
    /// Every matching rule that identifies the client, in configuration
    /// order, with the identifier's parts.
    pub rules: Vec<(&'c Rule, Vec<Cow<'r, str>>)>,
    /// Matching shadow rules that cannot identify the client (a key part
    /// given twice): they block nothing and are only logged.
    pub shadow_ambiguous: Vec<(&'c Rule, Ambiguous)>,
}

impl Selection<'_, '_> {
    /// The script's checks for a request with this (upper-case) method.
    pub fn checks(&self, method: &str) -> Vec<(Check<'_>, Vec<&str>)> {
        self.rules
            .iter()
            .map(|(rule, id)| {
                (
                    Check {
                        rule,
                        cost: rule.cost.for_method(method),
                    },
                    id.iter().map(|p| p.as_ref()).collect(),
                )
            })
            .collect()
    }
}

/// An enforced rule that cannot identify a request's client, and why: the
/// request is refused with a 400.
pub type Refusal<'c> = (&'c Rule, Ambiguous);

/// Picks the rules for `req`. `Err` names the first matching enforced rule
/// that cannot identify the client: the request is then refused with a 400
/// and nothing is decided. The worker and `edge-limiter simulate` share it.
pub fn select<'c, 'r>(
    config: &'c Config,
    req: &'r RequestMeta,
) -> Result<Selection<'c, 'r>, Refusal<'c>> {
    let mut selection = Selection {
        rules: Vec::new(),
        shadow_ambiguous: Vec::new(),
    };
    for rule in config.rules.iter().filter(|r| r.matches(req)) {
        match rule.identifier(req) {
            Ok(id) => selection.rules.push((rule, id)),
            // A shadow rule never blocks, not even an ambiguous request.
            Err(a) if rule.mode == Mode::Shadow => selection.shadow_ambiguous.push((rule, a)),
            Err(a) => return Err((rule, a)),
        }
    }
    Ok(selection)
}

/// The log line for a shadow rule that could not identify a client.
fn shadow_refusal_note(rule: &Rule, a: &Ambiguous) -> String {
    format!(
        "edge-limiter: shadow rule `{}` would refuse this request: `{}` has several values",
        rule.name, a.part
    )
}

/// A 400 for a request that gives an enforced rule's key part several
/// values: the origin may read any of them, so no bucket would be right,
/// and charging one would let the client pick which.
fn ambiguous(rule: &Rule, a: &Ambiguous) -> Outcome {
    Outcome {
        action: Action::Respond {
            status: 400,
            content_type: "application/problem+json".to_owned(),
            body: serde_json::json!({
                "type": "about:blank",
                "title": "Bad Request",
                "status": 400,
                "detail": format!(
                    "`{}` appears more than once with different values; rule `{}` identifies clients by it, so send it once.",
                    a.part, rule.name
                ),
                "parameter": a.part.to_string(),
                "policy": rule.name,
            })
            .to_string(),
        },
        headers: vec![],
        log: vec![format!(
            "edge-limiter: rule `{}` refused a request naming `{}` with several values",
            rule.name, a.part
        )],
    }
}

/// Seconds a client is told to wait when the limiter cannot decide.
const UNAVAILABLE_RETRY_S: u64 = 1;

fn failed(matched: &[&Rule], error: &RestError) -> Outcome {
    let names: Vec<&str> = matched.iter().map(|r| r.name.as_str()).collect();
    // One enforced closed rule is enough to refuse: it asked never to be
    // bypassed. Shadow rules never block, not even here.
    let closed = matched
        .iter()
        .any(|r| r.fail == FailMode::Closed && r.mode == Mode::Enforce);
    if closed {
        return Outcome {
            action: Action::Respond {
                status: 503,
                content_type: "application/problem+json".to_owned(),
                body: serde_json::json!({
                    "type": "about:blank",
                    "title": "Service Unavailable",
                    "status": 503,
                    "detail": "The rate limiter cannot decide right now; retry shortly.",
                })
                .to_string(),
            },
            headers: vec![("Retry-After".to_owned(), UNAVAILABLE_RETRY_S.to_string())],
            log: vec![format!(
                "edge-limiter: rules {names:?} failed closed: {error}"
            )],
        };
    }
    Outcome {
        action: Action::Forward,
        headers: vec![(BYPASS_HEADER.to_owned(), "redis-unavailable".to_owned())],
        log: vec![format!(
            "edge-limiter: rules {names:?} failed open, request forwarded unlimited: {error}"
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::normalize_path;
    use serde_json::json;
    use std::cell::Cell;

    struct Fake {
        reply: Result<Value, RestError>,
        calls: Cell<usize>,
        last: RefCell<Option<(ScriptCall, Duration)>>,
    }

    impl ScriptRunner for Fake {
        async fn run(&self, call: &ScriptCall, budget: Duration) -> Result<Value, RestError> {
            self.calls.set(self.calls.get() + 1);
            *self.last.borrow_mut() = Some((call.clone(), budget));
            self.reply.clone()
        }
    }

    fn fake(reply: Result<Value, RestError>) -> Fake {
        Fake {
            reply,
            calls: Cell::new(0),
            last: RefCell::new(None),
        }
    }

    fn config(extra: Value) -> Config {
        let mut c = json!({"rules": [
            {"name": "ip", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s", "fail": "open", "budget": "300ms"},
            {"name": "login", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m", "path_prefix": "/login"}
        ]});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        Config::from_json(&c).unwrap()
    }

    fn req(path: &str) -> RequestMeta {
        RequestMeta {
            method: "GET".into(),
            host: "example.com".into(),
            path: normalize_path(path),
            query: None,
            headers: vec![("cf-connecting-ip".into(), "192.0.2.1".into())],
        }
    }

    fn run(
        config: &Config,
        store: &Fake,
        cache: &RefCell<BlockCache>,
        path: &str,
        now: u64,
    ) -> Outcome {
        let limiter = Limiter {
            config,
            store,
            cache,
        };
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(limiter.handle(&req(path), now))
    }

    fn once(config: &Config, store: &Fake, path: &str) -> Outcome {
        run(config, store, &RefCell::new(BlockCache::new()), path, 0)
    }

    const ADMIT_ONE: &str = "[1, 5, 4, 200, 0, 1]";
    const DENY_LOGIN: &str = "[1, 5, 4, 200, 0, 1, 0, 1, 0, 60000, 60000, 1]";

    #[test]
    fn only_matching_rules_are_sent() {
        let store = fake(Ok(serde_json::from_str(ADMIT_ONE).unwrap()));
        let out = once(&config(json!({})), &store, "/");
        assert_eq!(out.action, Action::Forward);
        let (call, budget) = store.last.borrow().clone().unwrap();
        assert_eq!(call.keys, ["el:{192.0.2.1}:ip"]);
        assert_eq!(budget, Duration::from_millis(300));
    }

    #[test]
    fn a_denial_answers_429_and_is_then_served_from_the_cache() {
        let store = fake(Ok(serde_json::from_str(DENY_LOGIN).unwrap()));
        let c = config(json!({}));
        let cache = RefCell::new(BlockCache::new());
        let out = run(&c, &store, &cache, "/login", 1_000);
        let Action::Respond {
            status,
            body,
            content_type,
        } = &out.action
        else {
            panic!("{out:?}")
        };
        assert_eq!(
            (*status, content_type.as_str()),
            (429, "application/problem+json")
        );
        assert!(body.contains("\"policy\":\"login\""), "{body}");
        assert!(out.headers.contains(&("Retry-After".into(), "60".into())));
        let again = run(&c, &store, &cache, "/login", 31_000);
        assert_eq!(store.calls.get(), 1, "the second denial made no round trip");
        assert!(again.headers.contains(&("Retry-After".into(), "30".into())));
        run(&c, &store, &cache, "/login", 61_000);
        assert_eq!(store.calls.get(), 2, "at retry-after, Redis decides again");
    }

    #[test]
    fn configured_bodies_and_header_switches_apply() {
        let c = Config::from_json(&json!({"x_ratelimit_headers": false, "rules": [
            {"name": "ip", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s"},
            {"name": "login", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m", "deny_body": "slow down"}
        ]}))
        .unwrap();
        let out = once(
            &c,
            &fake(Ok(serde_json::from_str(DENY_LOGIN).unwrap())),
            "/login",
        );
        assert_eq!(
            out.action,
            Action::Respond {
                status: 429,
                content_type: "text/plain; charset=utf-8".into(),
                body: "slow down".into()
            }
        );
        assert!(
            out.headers
                .iter()
                .all(|(k, _)| !k.starts_with("X-RateLimit")),
            "{:?}",
            out.headers
        );
    }

    #[test]
    fn shadow_denials_are_logged_and_forwarded() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "ip", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s"},
            {"name": "login", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m", "mode": "shadow"}
        ]}))
        .unwrap();
        // The script admits (only enforced rules count) and reports the shadow rule's verdict.
        let store = fake(Ok(json!([1, 5, 4, 200, 0, 1, 0, 1, 0, 60000, 60000, 1])));
        let out = once(&c, &store, "/login");
        assert_eq!(out.action, Action::Forward);
        assert!(out
            .headers
            .iter()
            .any(|(k, v)| k == "RateLimit" && v.contains("\"login\";r=0")));
        assert_eq!(
            out.log,
            ["edge-limiter: shadow rule `login` would deny this request (retry after 60000 ms)"]
        );
        assert_eq!(store.last.borrow().as_ref().unwrap().0.args[2], "es");
    }

    #[test]
    fn redis_faults_follow_the_fail_mode() {
        let c = config(json!({}));
        for error in [
            RestError::Timeout { budget_ms: 300 },
            RestError::Auth,
            RestError::Malformed("x".into()),
        ] {
            let open = once(&c, &fake(Err(error.clone())), "/");
            assert_eq!(open.action, Action::Forward);
            assert_eq!(
                open.headers,
                [(BYPASS_HEADER.to_owned(), "redis-unavailable".to_owned())]
            );
            assert!(open.log[0].contains("failed open"));
            // /login also matches the default-closed rule, so closed wins.
            let closed = once(&c, &fake(Err(error)), "/login");
            assert!(matches!(closed.action, Action::Respond { status: 503, .. }));
            assert!(closed.headers.contains(&("Retry-After".into(), "1".into())));
        }
        let garbage = once(&c, &fake(Ok(json!("OK"))), "/login");
        assert!(matches!(
            garbage.action,
            Action::Respond { status: 503, .. }
        ));
    }
}
