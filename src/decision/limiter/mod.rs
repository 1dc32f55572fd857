//! The limiter's whole job for one request, runtime-independent, as one
//! pipeline ([`Limiter::handle`]) of named steps, each feature's in its
//! own file: pick the matching rules (`selection`); make their call once,
//! under the rule-wide overrides held (`wide_overrides`); spend leased
//! units (`leased`); answer from a remembered denial (`cached`); wait in
//! line behind the same call in flight (`grouped`); or send the call, the
//! one `send` here; then say what should happen to the request
//! (`outcome`), which `crate::edge::responses` renders. After the
//! response: refunds (`refunded`), lease refreshes and rule-wide reads.

use std::{borrow::Cow, time::Duration};

mod cached;
mod grouped;
mod leased;
mod outcome;
mod pooled;
mod refunded;
mod selection;
mod state;
mod wide_overrides;

use leased::Leased;
pub use outcome::{
    ambiguity, Decided, Forward, Handled, LeaseRefresh, Outcome, PendingRefund, PoolWork,
    RefundRule, Refusal, TopUpAsk, UNAVAILABLE_RETRY_S,
};
use outcome::{decided, failed, refused};
use selection::budget_of;
pub use selection::{select, Selection};
pub use state::Limiter;

use crate::decision::{
    memory::in_flight::Sending,
    outcomes::events::{Action, Event},
    outcomes::verdict::Decision,
    transport::protocol::{run, Check, PoolSpend, ScriptCall, ScriptError, ScriptRunner},
};
use crate::rules::{request::RequestMeta, rule::Rule};

impl<'c, S: ScriptRunner> Limiter<'c, '_, S> {
    /// Decides `req` at `now_ms` (the isolate's clock: it ages cached
    /// denials and leases, and is the script's clock only when
    /// [`Limiter::pinned`]). Never fails: a Redis fault becomes the fail
    /// mode.
    pub async fn handle(&self, req: &RequestMeta, now_ms: u64) -> Handled<'c> {
        let selection = match select(self.config, req) {
            Ok(selection) => selection,
            Err(refusal) => return refused(refusal),
        };
        // A shadow rule never blocks, not even an ambiguous request.
        let mut events: Vec<Event> = selection
            .shadow_ambiguous
            .iter()
            .map(|(_, rule, a)| Event {
                error: Some(ambiguity(a)),
                ..Event::new(Action::Refuse, &rule.name)
            })
            .collect();
        if selection.rules.is_empty() {
            return Handled::new(Outcome::Forward(Forward::Unlimited), events);
        }
        let methods = req.methods();
        // Away from the home, shared rules from the region's pools, spent
        // in the same call as the other rules' decision.
        let shared = |r: &Rule| r.shared.is_some();
        let mut handled = match self.home {
            Some(home) if selection.rules.iter().any(|(_, r, _)| shared(r)) => {
                let (pooling, rest): (Vec<_>, Vec<_>) =
                    (selection.rules.into_iter()).partition(|(_, r, _)| shared(r));
                let pooling = Selection {
                    rules: pooling,
                    shadow_ambiguous: vec![],
                };
                let rest = Selection {
                    rules: rest,
                    shadow_ambiguous: vec![],
                };
                self.pooled(home, &pooling, &rest, methods, now_ms).await
            }
            _ => {
                let handled = self.handle_selected(&selection, methods, &[], now_ms);
                handled.await
            }
        };
        events.append(&mut handled.events);
        handled.events = events;
        handled
    }

    /// Decides `selection` for a request that may be taken for any of
    /// `methods`, at `now_ms`; in a region away from the home, with
    /// `pools` of its shared rules spent in its call when it makes one.
    async fn handle_selected(
        &self,
        selection: &Selection<'c, Cow<'_, str>>,
        methods: &[String],
        pools: &[PoolSpend],
        now_ms: u64,
    ) -> Handled<'c> {
        let checks = selection.checks(methods);
        // The request's call without lease asks, where each rule's key is
        // made once: its line, its leases, the block cache's signature and
        // the call it sends are all drawn from it.
        let own = self.call_for(&checks, now_ms);
        let leased = self.observe(&checks, &own.rule_keys(), now_ms);
        let reread = self.reread_due(&checks, now_ms);
        if let Some(leased) = &leased {
            if let Some(mut handled) = self.served_from_leases(selection, &checks, leased, now_ms) {
                handled.reread = reread;
                return handled;
            }
        }
        let decided = self.decide(selection, &checks, leased.as_ref(), (&own, pools), now_ms);
        let mut handled = decided.await;
        handled.reread = reread;
        if let Outcome::Forward(Forward::Admitted(decided)) = &handled.outcome {
            handled.refund = selection.pending_refund(&decided.decision, methods, &own);
        }
        handled
    }

    /// The request admitted from leased units, when every matching rule
    /// leases and holds what it costs. Only a request served from leases
    /// refreshes them: one that made a call asked for its lease in it.
    fn served_from_leases(
        &self,
        selection: &Selection<'c, Cow<'_, str>>,
        checks: &[(Check<'c>, Vec<&str>)],
        leased: &Leased,
        now_ms: u64,
    ) -> Option<Handled<'c>> {
        let mut handled = self.admit_from_leases(checks, leased, now_ms)?;
        handled.refresh = self.refresh_due(selection, leased, now_ms);
        Some(handled)
    }

    /// The script's clock for a call at `now_ms`: Redis's own unless pinned.
    fn clock(&self, now_ms: u64) -> Option<u64> {
        self.pinned.then_some(now_ms)
    }

    /// Runs `call` within `budget`, for its decisions (a group's, in
    /// order, or the one). For `leasing` rules, an answered call's time is
    /// taken into the round trip leases are sized by (a failed one's says
    /// nothing of it: a timeout's is the budget's); every such call counts,
    /// asking for a lease or not, so that an isolate too far for leases,
    /// which then asks for none, still sees Redis come nearer.
    async fn call(
        &self,
        call: &ScriptCall,
        budget: Duration,
        leasing: bool,
    ) -> Result<Vec<Decision>, ScriptError> {
        let sent_ms = self.in_flight.now_ms();
        let reply = run(self.store, call, budget).await?;
        if leasing {
            let took_ms = self.in_flight.now_ms().saturating_sub(sent_ms);
            self.leases.borrow_mut().round_trip(took_ms);
        }
        reply.decisions()
    }

    /// Decides the checks of the matched rules (`own`: their call without
    /// lease asks), from the cache or Redis;
    /// with `leased` keys, asking for their leases in the call and
    /// settling what it brings back. While a call for the same rules and
    /// keys is in flight, the request waits for it (see `grouped.rs`),
    /// unless its call spends `pools` too: a group spends none.
    async fn decide(
        &self,
        selection: &Selection<'c, Cow<'_, str>>,
        checks: &[(Check<'c>, Vec<&str>)],
        leased: Option<&Leased>,
        (own, pools): (&ScriptCall, &[PoolSpend]),
        now_ms: u64,
    ) -> Handled<'c> {
        let signature = own.signature();
        if let Some(handled) = self.cached_denial(checks, (own, &signature), now_ms) {
            return handled;
        }
        let line = own.rule_keys().join("\n");
        let lined = pools.is_empty();
        if lined && self.in_flight.busy(&line, now_ms) {
            return self
                .wait_in_line(selection, checks, leased, (own, signature), &line, now_ms)
                .await;
        }
        let budget = budget_of(checks.iter().map(|(c, _)| c.rule));
        let _hold = lined.then(|| (self.in_flight).hold(&line, now_ms, budget.as_millis() as u64));
        let sent = self.send(
            checks,
            leased,
            (None, pools),
            (own, signature),
            budget,
            now_ms,
        );
        sent.await
    }

    /// Sends the call deciding this request at `now_ms` within `budget`:
    /// alone, or last of `group`, the requests that waited in its line,
    /// each of which it gives its decision; alone, it may spend `pools`
    /// too. Settles what the call brings back: the leases this request's
    /// rules ask for in it, and its decision, which the block cache keeps
    /// under `signature` when it is a denial (`own`: the request's call
    /// without lease asks).
    async fn send(
        &self,
        checks: &[(Check<'c>, Vec<&str>)],
        leased: Option<&Leased>,
        (group, pools): (Option<Sending<'_>>, &[PoolSpend]),
        (own, signature): (&ScriptCall, String),
        budget: Duration,
        now_ms: u64,
    ) -> Handled<'c> {
        let asks = leased.map_or_else(Vec::new, |l| self.lease_asks(checks, l, now_ms));
        let costs = group.as_ref().map_or_else(Vec::new, Sending::costs);
        let call = (own.clone().grouped(&costs).asking(asks)).pooling(pools.to_vec());
        let call = self.under_rule_wide(call, checks, now_ms);
        let (result, granted) = match leased {
            Some(_) => self.call_leasing(checks, &call, budget, now_ms).await,
            None => (self.call(&call, budget, false).await, vec![]),
        };
        let result = result.and_then(|mut decisions| {
            let mine = decisions.pop();
            mine.map(|d| (decisions, d))
                .ok_or_else(|| ScriptError::Reply("holds no decision".into()))
        });
        // A group of one shared its call with nobody.
        let shared = (group.as_ref()).filter(|g| !g.alone()).map(Sending::shared);
        let mut handled = match result {
            Ok((others, mine)) => {
                if let Some(group) = group {
                    group.deliver(others.into_iter().map(Ok));
                }
                self.remember(checks, signature, &mine, now_ms);
                decided(checks, own, mine)
            }
            Err(error) => {
                if let Some(group) = group {
                    group.deliver(std::iter::repeat(Err(error.clone())));
                }
                failed(checks, own, &error)
            }
        };
        handled.events.extend(granted);
        handled.shared = shared;
        handled
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::decision::{
        memory::{
            block_cache::BlockCache, in_flight::InFlight, leases::Leases, rule_wide::RuleWide,
        },
        outcomes::verdict::{RequestVerdict, Retry},
        runtime::TokioPause,
        transport::keys::redis_key,
        transport::redis_rest::{RestError, Script},
    };
    use crate::rules::{config::Config, rule::RuleId};
    use serde_json::{json, Value};
    use std::cell::Cell;

    /// How long the tests' block caches answer a denial from memory.
    const HOLD: u64 = 10_000;

    /// A call's keys, arguments and budget, as the store received them.
    #[derive(Debug, Clone)]
    struct Sent {
        keys: Vec<String>,
        args: Vec<String>,
        budget: Duration,
    }

    struct Fake {
        reply: Result<Value, RestError>,
        calls: Cell<usize>,
        last: RefCell<Option<Sent>>,
    }

    impl ScriptRunner for Fake {
        async fn eval(
            &self,
            _: &Script,
            keys: &[String],
            args: &[String],
            budget: Duration,
        ) -> Result<Value, RestError> {
            self.calls.set(self.calls.get() + 1);
            *self.last.borrow_mut() = Some(Sent {
                keys: keys.to_vec(),
                args: args.to_vec(),
                budget,
            });
            self.reply.clone()
        }

        /// The reply's items, as one result each.
        async fn commands(
            &self,
            _: &[Vec<String>],
            _: Duration,
        ) -> Result<Vec<Result<Value, RestError>>, RestError> {
            self.calls.set(self.calls.get() + 1);
            let items = self.reply.clone()?;
            Ok(items
                .as_array()
                .into_iter()
                .flatten()
                .cloned()
                .map(Ok)
                .collect())
        }
    }

    fn last(store: &Fake) -> Sent {
        store.last.borrow().clone().expect("a call was made")
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
        let ip = ("cf-connecting-ip".to_owned(), "192.0.2.1".to_owned());
        RequestMeta::new("GET", "example.com", path, None, [ip])
    }

    fn run<'c>(
        config: &'c Config,
        store: &Fake,
        cache: &RefCell<BlockCache>,
        path: &str,
        now: u64,
    ) -> Handled<'c> {
        let limiter = Limiter {
            config,
            store,
            cache,
            leases: &RefCell::new(Leases::new()),
            wide: &RefCell::new(RuleWide::new()),
            in_flight: &InFlight::new(TokioPause(|| 0)),
            pinned: false,
            home: None,
        };
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(limiter.handle(&req(path), now))
    }

    fn once<'c>(config: &'c Config, store: &Fake, path: &str) -> Handled<'c> {
        run(config, store, &RefCell::new(BlockCache::new(HOLD)), path, 0)
    }

    const ADMIT_ONE: &str = "[1, 5, 4, 200, 0, 1]";
    const DENY_LOGIN: &str = "[1, 5, 4, 200, 0, 1, 0, 1, 0, 60000, 60000, 1]";

    /// A GCRA rule that leases and takes overrides.
    fn leasing_with_overrides() -> Config {
        Config::from_json(&json!({"rules": [{"name": "hot", "key": ["ip"],
            "algorithm": "gcra", "rate": 100, "period": "1s", "burst": 300, "lease": 20,
            "overrides": true}]}))
        .unwrap()
    }

    /// Asks, at 10 ms, for 5 units of rule 0 for client 192.0.2.1.
    fn refresh_one(limiter: &Limiter<'_, '_, Fake>) {
        let pending = LeaseRefresh {
            rules: vec![(RuleId(0), redis_key("hot", &["192.0.2.1"]), 5)],
        };
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(limiter.refresh(&pending, 10));
    }

    /// Lease refreshes, sent after responses, are decided under the
    /// rule-wide override the isolate holds, as requests' own calls are.
    #[test]
    fn a_lease_refresh_carries_the_rule_wide_override() {
        let store = fake(Ok(serde_json::from_str(ADMIT_ONE).unwrap()));
        let c = leasing_with_overrides();
        let wide = RefCell::new(RuleWide::new());
        let text = "v1 gcra 100 1000 30 10000";
        assert!(wide.borrow_mut().start_read("hot", 0));
        wide.borrow_mut().keep("hot", text.into(), -1, 0);
        let limiter = Limiter {
            config: &c,
            store: &store,
            cache: &RefCell::new(BlockCache::new(HOLD)),
            leases: &RefCell::new(Leases::new()),
            wide: &wide,
            in_flight: &InFlight::new(TokioPause(|| 0)),
            pinned: false,
            home: None,
        };
        refresh_one(&limiter);
        let sent = last(&store);
        assert!(sent.args.iter().any(|a| a == text), "{:?}", sent.args);
    }

    /// A refresh is a call: a block it reads ends the client's leases there
    /// and then, not only at the next request's own call.
    #[test]
    fn a_lease_refresh_that_reads_a_block_ends_the_leases() {
        let block = crate::rules::overrides::BLOCK_TEXT;
        // Denied without end, no lease granted, the client's override: a block.
        let store = fake(Ok(json!([0, 300, 0, 0, -1, 1, 0, 0, 1, 0, block])));
        let c = leasing_with_overrides();
        let leases = RefCell::new(Leases::new());
        let key = redis_key("hot", &["192.0.2.1"]);
        let held = crate::decision::outcomes::verdict::RuleState {
            verdict: crate::decision::outcomes::verdict::Verdict::Admitted,
            limit: 300,
            remaining: 200,
            reset_after_ms: 0,
            window: 1,
        };
        leases.borrow_mut().grant(&key, 20, 2_000, 0, (held, None));
        assert!(leases.borrow_mut().can_spend(&key, 1, 10));
        let limiter = Limiter {
            config: &c,
            store: &store,
            cache: &RefCell::new(BlockCache::new(HOLD)),
            leases: &leases,
            wide: &RefCell::new(RuleWide::new()),
            in_flight: &InFlight::new(TokioPause(|| 0)),
            pinned: false,
            home: None,
        };
        refresh_one(&limiter);
        assert_eq!(store.calls.get(), 1);
        assert!(!leases.borrow_mut().can_spend(&key, 1, 20));
    }

    #[test]
    fn only_matching_rules_are_sent() {
        let store = fake(Ok(serde_json::from_str(ADMIT_ONE).unwrap()));
        let c = config(json!({}));
        let out = once(&c, &store, "/");
        assert!(matches!(
            out.outcome,
            Outcome::Forward(Forward::Admitted(_))
        ));
        let sent = last(&store);
        assert_eq!(sent.keys, ["el:{192.0.2.1}:ip"]);
        assert_eq!(sent.budget, Duration::from_millis(300));
    }

    #[test]
    fn a_denial_is_then_served_from_the_cache() {
        let store = fake(Ok(serde_json::from_str(DENY_LOGIN).unwrap()));
        let c = config(json!({}));
        let cache = RefCell::new(BlockCache::new(HOLD));
        let denied = |out: &Handled<'_>| match &out.outcome {
            Outcome::Deny(d) => (
                d.rules[d.decision.binding()].name.clone(),
                d.decision.wait_ms(),
            ),
            other => panic!("{other:?}"),
        };
        let out = run(&c, &store, &cache, "/login", 1_000);
        assert_eq!(denied(&out), ("login".to_owned(), Some(60_000)));
        let again = run(&c, &store, &cache, "/login", 8_000);
        assert_eq!(store.calls.get(), 1, "the second denial made no round trip");
        assert_eq!(denied(&again), ("login".to_owned(), Some(53_000)));
        run(&c, &store, &cache, "/login", 11_000);
        assert_eq!(
            store.calls.get(),
            2,
            "after the cache's hold, Redis decides again"
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
        let Outcome::Forward(Forward::Admitted(decided)) = &out.outcome else {
            panic!("{out:?}")
        };
        assert_eq!(
            decided.decision.verdict,
            RequestVerdict::Admitted {
                tightest: 1,
                delay_ms: 0
            }
        );
        assert_eq!(
            decided.decision.rules[1].retry(),
            Some(Retry::After { ms: 60_000 })
        );
        assert_eq!(
            out.events,
            [Event {
                retry_after: Some(60),
                key: Some("el:{192.0.2.1}:login".into()),
                ..Event::new(Action::WouldDeny, "login")
            }]
        );
        assert_eq!(last(&store).args[2], "es");
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
            assert_eq!(open.outcome, Outcome::Forward(Forward::Bypassed));
            assert_eq!(open.events.len(), 1);
            assert_eq!(open.events[0].action, Action::FailOpen);
            assert_eq!(open.events[0].error, Some(error.to_string()));
            // /login also matches the default-closed rule, so closed wins.
            let closed = once(&c, &fake(Err(error)), "/login");
            assert_eq!(closed.outcome, Outcome::Unavailable);
            let actions: Vec<_> = closed
                .events
                .iter()
                .map(|e| (e.action, e.rule.as_str(), e.status))
                .collect();
            assert_eq!(
                actions,
                [
                    (Action::FailClosed, "ip", Some(503)),
                    (Action::FailClosed, "login", Some(503))
                ]
            );
        }
        let garbage = once(&c, &fake(Ok(json!("OK"))), "/login");
        assert_eq!(garbage.outcome, Outcome::Unavailable);
        assert!(garbage.events[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("outside the protocol")));
    }

    /// A charge made under a client's override goes back at the override's
    /// figures: the refund call carries its interval, not the rule's.
    #[test]
    fn a_refund_carries_the_figures_its_charge_was_made_under() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "login", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m",
             "burst": 10, "count_status": [401], "overrides": true}
        ]}))
        .unwrap();
        let faster = "v1 gcra 10 60000 10 6000000";
        // Six fields, the refund mark, then the override read: the client's.
        let store = fake(Ok(json!([1, 10, 9, 6000, 0, 1, 12_345, 1, 0, faster])));
        let out = once(&c, &store, "/");
        let pending = out.refund.expect("a refund for after the response");
        assert_eq!(pending.rules[0].under, faster);
        let limiter = Limiter {
            config: &c,
            store: &store,
            cache: &RefCell::new(BlockCache::new(HOLD)),
            leases: &RefCell::new(Leases::new()),
            wide: &RefCell::new(RuleWide::new()),
            in_flight: &InFlight::new(TokioPause(|| 0)),
            pinned: false,
            home: None,
        };
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(limiter.refund(&pending, (200, &[]), 0));
        let sent = last(&store).args;
        assert_eq!(sent[..4], ["refund", "", "gcra", "1"]);
        assert_eq!(sent[4], "6000000", "{sent:?}");
    }

    #[test]
    fn count_status_rules_are_charged_up_front_and_refunded_after_the_response() {
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
        // Up front: charged with a refund mark ('r'), six fields and the mark back.
        let store = fake(Ok(json!([
            1,
            5,
            4,
            180000,
            0,
            1,
            1_795_169_160_000_000_u64
        ])));
        let limiter = Limiter {
            config: &c,
            store: &store,
            cache: &cache,
            leases: &RefCell::new(Leases::new()),
            wide: &RefCell::new(RuleWide::new()),
            in_flight: &InFlight::new(TokioPause(|| 0)),
            pinned: false,
            home: None,
        };
        let out = rt.block_on(limiter.handle(&req("/login"), 0));
        assert!(matches!(
            out.outcome,
            Outcome::Forward(Forward::Admitted(_))
        ));
        assert_eq!(last(&store).args[2], "r");
        let refund = out.refund.expect("a refund for after the response");
        // A status the rule counts: the charge stays, no call at all.
        assert!(rt
            .block_on(limiter.refund(&refund, (401, &[]), 0))
            .is_empty());
        assert_eq!(store.calls.get(), 1);
        // Any other: one call giving the charge back by its mark.
        let store = fake(Ok(json!([1])));
        let limiter = Limiter {
            config: &c,
            store: &store,
            cache: &cache,
            leases: &RefCell::new(Leases::new()),
            wide: &RefCell::new(RuleWide::new()),
            in_flight: &InFlight::new(TokioPause(|| 0)),
            pinned: false,
            home: None,
        };
        assert!(rt
            .block_on(limiter.refund(&refund, (200, &[]), 0))
            .is_empty());
        let sent = last(&store);
        assert_eq!(
            (sent.args.as_slice(), sent.keys.as_slice()),
            (
                &[
                    "refund",
                    "",
                    "gcra",
                    "1",
                    "180000000",
                    "5",
                    "0",
                    "1795169160000000"
                ]
                .map(String::from)[..],
                &["el:{192.0.2.1}:login".to_owned()][..]
            )
        );
        // On a pinned clock (simulate, tests) the refund runs at the
        // response's time too, as the charge ran at the request's.
        let pinned = Limiter {
            pinned: true,
            home: None,
            ..limiter
        };
        rt.block_on(pinned.refund(&refund, (200, &[]), 1_795_169_161_000));
        assert_eq!(last(&store).args[..2], ["refund", "1795169161000"]);
        // A fault after the response is only logged, and the charge stays.
        let store = fake(Err(RestError::Timeout { budget_ms: 1000 }));
        let limiter = Limiter {
            config: &c,
            store: &store,
            cache: &cache,
            leases: &RefCell::new(Leases::new()),
            wide: &RefCell::new(RuleWide::new()),
            in_flight: &InFlight::new(TokioPause(|| 0)),
            pinned: false,
            home: None,
        };
        let events = rt.block_on(limiter.refund(&refund, (200, &[]), 0));
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].action, events[0].status),
            (Action::RefundFailed, Some(200))
        );
        // A denied request made no charge, so it leaves nothing to give back.
        let store = fake(Ok(json!([0, 5, 0, 900000, 180000, 1, 0])));
        let denied = run(
            &c,
            &store,
            &RefCell::new(BlockCache::new(HOLD)),
            "/login",
            0,
        );
        assert!(denied.refund.is_none());
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
        assert_eq!(actions, [Action::PenaltyStart, Action::Deny]);
        assert_eq!(first.events[0].key.as_deref(), Some("el:{192.0.2.1}:p:p"));
        assert_eq!(first.events[0].retry_after, Some(600));
        assert_eq!(
            last(&store).keys,
            ["el:{192.0.2.1}:p", "el:{192.0.2.1}:p:p"]
        );
        let again = run(&c, &store, &cache, "/", 1000);
        assert_eq!(store.calls.get(), 1, "answered from the cache");
        let actions: Vec<_> = again.events.iter().map(|e| e.action).collect();
        assert_eq!(actions, [Action::Deny]);
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
        assert!(matches!(
            out.outcome,
            Outcome::Forward(Forward::Admitted(_))
        ));
        let actions: Vec<_> = out.events.iter().map(|e| (e.action, e.status)).collect();
        assert_eq!(
            actions,
            [(Action::WouldDeny, None), (Action::WouldPenaltyStart, None)]
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
        assert_eq!(out.outcome, Outcome::Forward(Forward::Unlimited));
        assert_eq!(store.calls.get(), 0);
    }

    /// A rule-wide key holding no override of its rule (here `v1 block`
    /// and 8 000 numbers) counts as none in the isolate, logged at each
    /// read, and is never passed to the script; an override is kept.
    #[test]
    fn a_rule_wide_value_that_is_no_override_is_held_as_none() {
        let c = leasing_with_overrides();
        let huge = format!("v1 block{}", " 1".repeat(8000));
        for (text, kept) in [(huge.as_str(), false), ("v1 block", true)] {
            let store = fake(Ok(json!([text, -1])));
            let wide = RefCell::new(RuleWide::new());
            let limiter = Limiter {
                config: &c,
                store: &store,
                cache: &RefCell::new(BlockCache::new(HOLD)),
                leases: &RefCell::new(Leases::new()),
                wide: &wide,
                in_flight: &InFlight::new(TokioPause(|| 0)),
                pinned: false,
                home: None,
            };
            assert!(wide.borrow_mut().start_read("hot", 0));
            let events = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(limiter.reread(&["hot".to_owned()], 0));
            let held = wide.borrow().in_force("hot", 1);
            if kept {
                assert_eq!(held, Some((text.to_owned(), -1)));
                assert_eq!(events, []);
            } else {
                assert_eq!(held, None);
                assert_eq!(events.len(), 1, "{events:?}");
                assert_eq!(events[0].action, Action::OverrideIgnored);
                assert_eq!(events[0].key.as_deref(), Some("el:rule:hot:o"));
            }
        }
    }

    /// Decides a request for `path` at `now` while the isolate's lease
    /// table is held elsewhere: every lease step reads or writes it, so
    /// one would find it borrowed and panic.
    fn with_leases_held<'c>(
        config: &'c Config,
        store: &Fake,
        cache: &RefCell<BlockCache>,
        path: &str,
        now: u64,
    ) -> Handled<'c> {
        let leases = RefCell::new(Leases::new());
        let _held = leases.borrow_mut();
        let limiter = Limiter {
            config,
            store,
            cache,
            leases: &leases,
            wide: &RefCell::new(RuleWide::new()),
            in_flight: &InFlight::new(TokioPause(|| 0)),
            pinned: false,
            home: None,
        };
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(limiter.handle(&req(path), now))
    }

    /// A request under rules without `lease` takes no lease step: not on
    /// the one-rule path, the general one, a denial from the cache or a
    /// failed call. A request under a rule that leases does, as the same
    /// hold shows.
    #[test]
    fn a_request_under_rules_that_do_not_lease_takes_no_lease_step() {
        let c = config(json!({}));
        let cache = RefCell::new(BlockCache::new(HOLD));
        let admit = fake(Ok(serde_json::from_str(ADMIT_ONE).unwrap()));
        let one = with_leases_held(&c, &admit, &cache, "/", 0);
        assert!(matches!(
            one.outcome,
            Outcome::Forward(Forward::Admitted(_))
        ));
        let deny = fake(Ok(serde_json::from_str(DENY_LOGIN).unwrap()));
        for now in [0, 1_000] {
            let general = with_leases_held(&c, &deny, &cache, "/login", now);
            assert!(matches!(general.outcome, Outcome::Deny(_)));
        }
        assert_eq!(deny.calls.get(), 1, "the second denial came from the cache");
        let fault = fake(Err(RestError::Timeout { budget_ms: 300 }));
        let failed = with_leases_held(&c, &fault, &cache, "/", 0);
        assert_eq!(failed.outcome, Outcome::Forward(Forward::Bypassed));

        let leasing = leasing_with_overrides();
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_leases_held(&leasing, &admit, &cache, "/", 0);
        }));
        assert!(
            stepped.is_err(),
            "a leasing request's steps find the table held"
        );
    }
}
