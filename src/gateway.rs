//! The limiter's whole job for one request, runtime-independent: pick the
//! matching rules, answer from the block cache or ask Redis once, and say
//! what to answer.

use std::{borrow::Cow, cell::RefCell, time::Duration};

use serde_json::Value;

use crate::{
    cache::BlockCache,
    config::{Config, FailMode, Mode, Rule, DEFAULT_BUDGET_MS},
    decision::{penalty_key, Check, Decision, ScriptCall},
    events::{Action as EventAction, Event},
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
    /// Events for the log, one JSON line each.
    pub events: Vec<Event>,
    /// Rules to charge once the origin has answered, if it answers one of
    /// their `count_status`: see [`Limiter::charge`].
    pub charge: Option<Charge>,
}

impl Outcome {
    fn forward(headers: Vec<(String, String)>, events: Vec<Event>) -> Outcome {
        Outcome {
            action: Action::Forward,
            headers,
            events,
            charge: None,
        }
    }
}

/// The after-response charge of a forwarded request's `count_status`
/// rules: which rules (by index in the configuration), for which client,
/// at what cost. Owned, so it can outlive the request's borrows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// Rule index, the client's identifier parts, and the cost.
    pub rules: Vec<(usize, Vec<String>, u64)>,
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
        // A shadow rule never blocks, not even an ambiguous request.
        let mut events: Vec<Event> = selection
            .shadow_ambiguous
            .iter()
            .map(|(rule, a)| Event {
                error: Some(ambiguity(a)),
                ..Event::new(EventAction::Refuse, &rule.name)
            })
            .collect();
        if selection.rules.is_empty() {
            return Outcome::forward(vec![], events);
        }
        let checks = selection.checks(&req.methods());
        let mut outcome = self.decide(&checks, now_ms).await;
        events.append(&mut outcome.events);
        outcome.events = events;
        if outcome.action == Action::Forward {
            // A rule's index is looked up only for the rare count_status rule.
            let later: Vec<(usize, Vec<String>, u64)> = checks
                .iter()
                .filter(|(c, _)| !c.rule.count_status.is_empty())
                .map(|(c, id)| {
                    (
                        self.config.index_of(c.rule),
                        id.iter().map(|p| p.to_string()).collect(),
                        c.cost,
                    )
                })
                .collect();
            if !later.is_empty() {
                outcome.charge = Some(Charge { rules: later });
            }
        }
        outcome
    }

    /// Charges the `count_status` rules of a forwarded request whose list
    /// holds the origin's `status`, in one script call; nothing when none
    /// does. Runs after the response has gone: a fault is only logged.
    pub async fn charge(&self, charge: &Charge, status: u16) -> Vec<Event> {
        let checks: Vec<(Check<'_>, Vec<&str>)> = charge
            .rules
            .iter()
            .filter_map(|(i, id, cost)| {
                let rule = self.config.rules.get(*i)?;
                rule.count_status.contains(&status).then(|| {
                    let id = id.iter().map(String::as_str).collect();
                    (Check { rule, cost: *cost }, id)
                })
            })
            .collect();
        if checks.is_empty() {
            return vec![];
        }
        let call = ScriptCall::charge(&checks, None);
        let budget = budget_of(checks.iter().map(|(c, _)| c.rule));
        match self
            .store
            .run(&call, budget)
            .await
            .and_then(|reply| call.decision(&reply))
        {
            Ok(decision) => penalty_events(&checks, &call, &decision),
            Err(error) => checks
                .iter()
                .zip(&call.keys)
                .map(|((check, _), key)| Event {
                    status: Some(status),
                    key: Some(key.clone()),
                    error: Some(error.to_string()),
                    ..Event::new(EventAction::ChargeFailed, &check.rule.name)
                })
                .collect(),
        }
    }

    /// Decides the checks of the matched rules, from the cache or Redis.
    async fn decide(&self, checks: &[(Check<'_>, Vec<&str>)], now_ms: u64) -> Outcome {
        let call = ScriptCall::decide(checks, None);
        let signature = call.signature();
        let cached = self.cache.borrow_mut().lookup(&signature, now_ms);
        if let Some(decision) = cached {
            return self.decided(checks, &call, &decision);
        }
        let budget = budget_of(checks.iter().map(|(c, _)| c.rule));
        let result = self.store.run(&call, budget).await;
        match result.and_then(|reply| call.decision(&reply)) {
            Ok(decision) => {
                self.cache
                    .borrow_mut()
                    .remember(signature, &decision, now_ms);
                self.decided(checks, &call, &decision)
            }
            Err(error) => failed(checks, &call, &error),
        }
    }

    fn decided(
        &self,
        checks: &[(Check<'_>, Vec<&str>)],
        call: &ScriptCall,
        decision: &Decision,
    ) -> Outcome {
        let rules: Vec<&Rule> = checks.iter().map(|(c, _)| c.rule).collect();
        let style = HeaderStyle {
            x_ratelimit: self.config.x_ratelimit_headers,
        };
        let headers = headers::for_decision(&rules, decision, style);
        let retry_s = |ms: Option<u64>| ms.map(|ms| headers::seconds_up(ms).max(1));
        let mut events: Vec<Event> = rules
            .iter()
            .zip(&decision.rules)
            .zip(&call.keys)
            .filter(|((r, s), _)| r.mode == Mode::Shadow && !s.allowed)
            .map(|((r, s), key)| Event {
                retry_after: retry_s(s.retry_after_ms),
                key: Some(key.clone()),
                ..Event::new(EventAction::WouldDeny, &r.name)
            })
            .collect();
        events.extend(penalty_events(checks, call, decision));
        if decision.allowed {
            return Outcome::forward(headers, events);
        }
        let rule = rules[decision.binding];
        events.push(Event {
            status: Some(429),
            retry_after: retry_s(decision.retry_after_ms),
            key: call.keys.get(decision.binding).cloned(),
            ..Event::new(EventAction::Deny, &rule.name)
        });
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
            events,
            charge: None,
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
    /// The script's checks for a request the origin may take for any of
    /// these (upper-case) methods.
    pub fn checks(&self, methods: &[String]) -> Vec<(Check<'_>, Vec<&str>)> {
        self.rules
            .iter()
            .map(|(rule, id)| {
                (
                    Check {
                        rule,
                        cost: rule.cost.for_methods(methods),
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

/// The tightest budget of these rules: none waits longer than it allows.
fn budget_of<'a>(rules: impl Iterator<Item = &'a Rule>) -> Duration {
    Duration::from_millis(
        rules
            .map(|r| r.budget_ms)
            .min()
            .unwrap_or(DEFAULT_BUDGET_MS),
    )
}

/// One event per penalty the decision started, naming its penalty key.
fn penalty_events(
    checks: &[(Check<'_>, Vec<&str>)],
    call: &ScriptCall,
    decision: &Decision,
) -> Vec<Event> {
    decision
        .penalties_started
        .iter()
        .filter_map(|&i| {
            let rule = checks.get(i)?.0.rule;
            let action = match rule.mode {
                Mode::Shadow => EventAction::WouldPenaltyStart,
                Mode::Enforce => EventAction::PenaltyStart,
            };
            Some(Event {
                status: (!decision.allowed).then_some(429),
                retry_after: rule.penalty_ms.map(headers::seconds_up),
                key: call.keys.get(i).map(|k| penalty_key(k)),
                ..Event::new(action, &rule.name)
            })
        })
        .collect()
}

fn ambiguity(a: &Ambiguous) -> String {
    format!("`{}` came with several different values", a.part)
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
        events: vec![Event {
            status: Some(400),
            error: Some(ambiguity(a)),
            ..Event::new(EventAction::Refuse, &rule.name)
        }],
        charge: None,
    }
}

/// Seconds a client is told to wait when the limiter cannot decide.
const UNAVAILABLE_RETRY_S: u64 = 1;

fn failed(checks: &[(Check<'_>, Vec<&str>)], call: &ScriptCall, error: &RestError) -> Outcome {
    let rules: Vec<&Rule> = checks.iter().map(|(c, _)| c.rule).collect();
    // One enforced closed rule is enough to refuse: it asked never to be
    // bypassed. Shadow rules never block, not even here.
    let closed = rules
        .iter()
        .any(|r| r.fail == FailMode::Closed && r.mode == Mode::Enforce);
    let events = rules
        .iter()
        .zip(&call.keys)
        .map(|(rule, key)| Event {
            status: closed.then_some(503),
            retry_after: closed.then_some(UNAVAILABLE_RETRY_S),
            key: Some(key.clone()),
            error: Some(error.to_string()),
            ..Event::new(
                if closed {
                    EventAction::FailClosed
                } else {
                    EventAction::FailOpen
                },
                &rule.name,
            )
        })
        .collect();
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
            events,
            charge: None,
        };
    }
    Outcome::forward(
        vec![(BYPASS_HEADER.to_owned(), "redis-unavailable".to_owned())],
        events,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::normalize_path;
    use serde_json::json;
    use std::cell::Cell;

    /// How long the tests' block caches answer a denial from memory.
    const HOLD: u64 = 10_000;

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
            ..RequestMeta::default()
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
        run(config, store, &RefCell::new(BlockCache::new(HOLD)), path, 0)
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
        let cache = RefCell::new(BlockCache::new(HOLD));
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
        let again = run(&c, &store, &cache, "/login", 8_000);
        assert_eq!(store.calls.get(), 1, "the second denial made no round trip");
        assert!(again.headers.contains(&("Retry-After".into(), "53".into())));
        run(&c, &store, &cache, "/login", 11_000);
        assert_eq!(
            store.calls.get(),
            2,
            "after the cache's hold, Redis decides again"
        );
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
            out.events,
            [Event {
                retry_after: Some(60),
                key: Some("el:{192.0.2.1}:login".into()),
                ..Event::new(EventAction::WouldDeny, "login")
            }]
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
            assert_eq!(open.events.len(), 1);
            assert_eq!(open.events[0].action, EventAction::FailOpen);
            assert_eq!(open.events[0].error, Some(error.to_string()));
            // /login also matches the default-closed rule, so closed wins.
            let closed = once(&c, &fake(Err(error)), "/login");
            assert!(matches!(closed.action, Action::Respond { status: 503, .. }));
            assert!(closed.headers.contains(&("Retry-After".into(), "1".into())));
            let actions: Vec<_> = closed
                .events
                .iter()
                .map(|e| (e.action, e.rule.as_str(), e.status))
                .collect();
            assert_eq!(
                actions,
                [
                    (EventAction::FailClosed, "ip", Some(503)),
                    (EventAction::FailClosed, "login", Some(503))
                ]
            );
        }
        let garbage = once(&c, &fake(Ok(json!("OK"))), "/login");
        assert!(matches!(
            garbage.action,
            Action::Respond { status: 503, .. }
        ));
    }

    #[test]
    fn count_status_rules_are_checked_up_front_and_charged_after_the_response() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "login", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "15m",
             "count_status": [401, 403]}
        ]}))
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let cache = RefCell::new(BlockCache::new(HOLD));
        // Up front: checked at its cost, not charged ('c'), six fields back.
        let store = fake(Ok(json!([1, 5, 4, 180000, 0, 1])));
        let limiter = Limiter {
            config: &c,
            store: &store,
            cache: &cache,
        };
        let out = rt.block_on(limiter.handle(&req("/login"), 0));
        assert_eq!(out.action, Action::Forward);
        assert_eq!(store.last.borrow().as_ref().unwrap().0.args[2], "c");
        let charge = out.charge.expect("a charge for after the response");
        // A status the rule does not count: no call at all.
        assert!(rt.block_on(limiter.charge(&charge, 200)).is_empty());
        assert_eq!(store.calls.get(), 1);
        // A counted status: one call, charging (a rule alone: GCRA's own path).
        let store = fake(Ok(json!(0)));
        let limiter = Limiter {
            config: &c,
            store: &store,
            cache: &cache,
        };
        assert!(rt.block_on(limiter.charge(&charge, 401)).is_empty());
        let (call, _) = store.last.borrow().clone().unwrap();
        assert_eq!(
            (call.args.as_slice(), call.keys.as_slice()),
            (
                &["180000000".to_owned(), "5".to_owned()][..],
                &["el:{192.0.2.1}:login".to_owned()][..]
            )
        );
        // A fault after the response is only logged.
        let store = fake(Err(RestError::Timeout { budget_ms: 1000 }));
        let limiter = Limiter {
            config: &c,
            store: &store,
            cache: &cache,
        };
        let events = rt.block_on(limiter.charge(&charge, 403));
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].action, events[0].status),
            (EventAction::ChargeFailed, Some(403))
        );
    }

    #[test]
    fn a_penalty_start_is_one_event_and_cached_denials_start_none() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "p", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m", "penalty": "10m"}
        ]}))
        .unwrap();
        // Denied, and the penalty started (the mask after the six fields).
        let store = fake(Ok(json!([0, 1, 0, 600000, 600000, 1, 1])));
        let cache = RefCell::new(BlockCache::new(HOLD));
        let first = run(&c, &store, &cache, "/", 0);
        let actions: Vec<_> = first.events.iter().map(|e| e.action).collect();
        assert_eq!(actions, [EventAction::PenaltyStart, EventAction::Deny]);
        assert_eq!(first.events[0].key.as_deref(), Some("el:{192.0.2.1}:p:p"));
        assert_eq!(first.events[0].retry_after, Some(600));
        let (call, _) = store.last.borrow().clone().unwrap();
        assert_eq!(call.keys, ["el:{192.0.2.1}:p", "el:{192.0.2.1}:p:p"]);
        let again = run(&c, &store, &cache, "/", 1000);
        assert_eq!(store.calls.get(), 1, "answered from the cache");
        let actions: Vec<_> = again.events.iter().map(|e| e.action).collect();
        assert_eq!(actions, [EventAction::Deny]);
    }

    #[test]
    fn a_shadow_penalty_start_is_logged_and_blocks_nothing() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "s", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m",
             "penalty": "10m", "mode": "shadow"}
        ]}))
        .unwrap();
        let store = fake(Ok(json!([0, 1, 0, 600000, 600000, 1, 1])));
        let cache = RefCell::new(BlockCache::new(HOLD));
        let out = run(&c, &store, &cache, "/", 0);
        assert_eq!(out.action, Action::Forward);
        let actions: Vec<_> = out.events.iter().map(|e| (e.action, e.status)).collect();
        assert_eq!(
            actions,
            [
                (EventAction::WouldDeny, None),
                (EventAction::WouldPenaltyStart, None)
            ]
        );
        assert_eq!(out.events[1].retry_after, Some(600));
        run(&c, &store, &cache, "/", 1000);
        assert_eq!(store.calls.get(), 2, "a shadow verdict is never cached");
    }

    #[test]
    fn exempt_clients_make_no_call() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "ip", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m",
             "except_ips": ["192.0.2.0/24", "2001:db8::/32"]}
        ]}))
        .unwrap();
        let store = fake(Ok(json!(0)));
        let out = once(&c, &store, "/");
        assert_eq!((out.action, out.headers.len()), (Action::Forward, 0));
        assert_eq!(store.calls.get(), 0);
    }
}
