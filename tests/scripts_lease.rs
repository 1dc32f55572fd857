//! Quota leases on the script's side (issue 24), against a real
//! `redis-server` through the REST endpoint, on a pinned clock: what a
//! lease is granted, how it is charged, and when it is refused; then an
//! isolate's leases (its [`Limiter`]) against the same script, on that
//! clock or Redis's: what their responses say, and what ends them (issue
//! 31).
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::{
    cell::RefCell,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use edge_limiter::{
    decision::{
        limiter::{Forward, Handled, Limiter, Outcome},
        memory::block_cache::BlockCache,
        memory::in_flight::InFlight,
        memory::leases::Leases,
        memory::rule_wide::RuleWide,
        outcomes::events::Action,
        outcomes::verdict::{Decision, Grant},
        runtime::TokioPause,
        transport::keys::{override_key, redis_key, window_offset},
        transport::protocol::{run, Check, LeaseAsk, Reply, ScriptCall},
        transport::redis_rest::RestClient,
    },
    rules::{config::Config, overrides::BLOCK_TEXT, request::RequestMeta, rule::Rule},
};
use edge_limiter_local::fault_proxy::{Fault, FaultProxy};
use serde_json::{json, Value};
use support::{rules, Backend, BUDGET, TOKEN};

const T0: u64 = 1_795_168_800_000;

/// A decision of one unit for `id` at `now_ms`, asking for `units` more
/// lasting `for_ms`.
async fn ask(b: &Backend, rule: &Rule, id: &str, units: u64, for_ms: u64, now_ms: u64) -> Decision {
    let lease = LeaseAsk {
        rule: 0,
        units,
        for_ms,
    };
    let call = ScriptCall::decide_leasing(
        &[(Check { rule, cost: 1 }, vec![id])],
        vec![lease],
        Some(now_ms),
    );
    run(&b.client, &call, BUDGET)
        .await
        .and_then(Reply::decision)
        .expect("a decision")
}

/// Units left for `id` at `now_ms`, by a peek.
async fn left(b: &Backend, rule: &Rule, id: &str, now_ms: u64) -> u64 {
    b.decide(&[rule], id, 0, Some(now_ms)).await.rules[0].remaining
}

fn gcra(rate: u64, burst: u64) -> Rule {
    rules(json!([{"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": rate, "period": "1s", "burst": burst}]))
        .remove(0)
}

/// Exact GCRA over arrivals (us), interval and burst: how many arrivals
/// the limit would refuse. Written from the definition, sharing nothing
/// with the script or the model.
fn over_gcra(arrivals_us: &[u64], interval_us: u64, burst: u64) -> usize {
    let mut tat = 0u64;
    let mut over = 0;
    for &t in arrivals_us {
        let next = tat.max(t) + interval_us;
        if next - t > burst * interval_us {
            over += 1;
        } else {
            tat = next;
        }
    }
    over
}

#[tokio::test]
async fn naive_leases_over_admit_and_the_deadline_accounting_refuses_that_lease() {
    // docs/leases.md: rate 1/s, burst 3. Naively, A is charged 3 at
    // 0.0 and spends 2 at 2.9 while B is admitted twice at 2.0.
    let s = 1_000_000;
    let reached = [0, 2 * s, 2 * s, 2_900_000, 2_900_000];
    assert_eq!(over_gcra(&reached, s, 3), 1, "the naive lease goes over");
    // Charged as arriving at its end (2.9 s), the lease does not conform
    // at the grant: refused, and the request alone is charged.
    let b = Backend::start();
    let rule = gcra(1, 3);
    let d = ask(&b, &rule, "a", 2, 2900, T0).await;
    assert!(d.admitted());
    assert_eq!(d.grants, []);
    assert_eq!(left(&b, &rule, "a", T0).await, 2);
}

#[tokio::test]
async fn a_gcra_lease_counts_as_arriving_at_its_end() {
    let b = Backend::start();
    // 1/s, burst 10: the request and 2 units, accounted at 1 s from now.
    let rule = gcra(1, 10);
    let d = ask(&b, &rule, "a", 2, 1000, T0).await;
    assert_eq!(
        d.grants,
        [Grant {
            rule: 0,
            units: 2,
            for_ms: 1000
        }]
    );
    // The TAT lies 1 + 3 s ahead: 6 of 10 left.
    assert_eq!(left(&b, &rule, "a", T0).await, 6);
    // A lease takes at most half of what is left after the request: 2 of 5.
    let d = ask(&b, &rule, "a", 8, 1000, T0).await;
    assert_eq!(d.grants[0].units, 2);
    assert_eq!(left(&b, &rule, "a", T0).await, 3);
    // Nearly spent, the leases shrink: 1 of the 2 left after the request,
    // then none of the 0 left after the next.
    let d = ask(&b, &rule, "a", 8, 1000, T0).await;
    assert_eq!(d.grants[0].units, 1);
    let d = ask(&b, &rule, "a", 8, 1000, T0).await;
    assert!(d.admitted());
    assert_eq!(d.grants, []);
    assert_eq!(left(&b, &rule, "a", T0).await, 0);
}

#[tokio::test]
async fn a_denied_request_is_granted_nothing_and_charged_nothing() {
    let b = Backend::start();
    let rule = gcra(1, 1);
    assert!(ask(&b, &rule, "a", 1, 0, T0).await.admitted());
    let d = ask(&b, &rule, "a", 4, 1, T0).await;
    assert!(!d.admitted());
    assert_eq!(d.grants, []);
    assert_eq!(left(&b, &rule, "a", T0 + 1000).await, 1);
}

#[tokio::test]
async fn a_window_lease_ends_with_the_bucket_its_units_were_counted_in() {
    let b = Backend::start();
    let rule = rules(json!([{"name": "w", "key": ["ip"], "algorithm": "windowed",
        "windows": [["1s", 11, "100ms"], ["1m", 100, "1s"]]}]))
    .remove(0);
    let offset = window_offset(&redis_key("w", &["a"]), 60_000);
    let d = ask(&b, &rule, "a", 8, 1000, T0).await;
    // Half of the 10 left after the request: 5; until the 100 ms bucket ends.
    let into = (T0 + offset) % 100;
    assert_eq!(
        d.grants,
        [Grant {
            rule: 0,
            units: 5,
            for_ms: 100 - into
        }]
    );
    assert_eq!(d.rules[0].remaining, 5, "what is left after the lease");
    assert_eq!(left(&b, &rule, "a", T0).await, 5);
    // Charged in that bucket: gone from the short window once it slides past.
    assert_eq!(left(&b, &rule, "a", T0 + 1000).await, 11);
    // Still counted by the long one.
    let long = rules(json!([{"name": "w", "key": ["ip"], "algorithm": "windowed",
        "windows": [["1m", 100, "1s"]]}]))
    .remove(0);
    assert_eq!(left(&b, &long, "a", T0 + 1000).await, 94);
}

/// A refresh is a call at cost 0 that asks for a lease: under figures
/// lowered below what the client has spent, it reads as a denial, but no
/// request was denied, so it starts no penalty; a request then does.
#[tokio::test]
async fn a_refresh_under_lowered_figures_starts_no_penalty() {
    let b = Backend::start();
    let rule = |burst: u64| {
        rules(
            json!([{"name": "p", "key": ["ip"], "algorithm": "gcra", "rate": 10,
            "period": "1s", "burst": burst, "penalty": "1m"}]),
        )
        .remove(0)
    };
    let (was, lowered) = (rule(20), rule(2));
    // 10 units at 0.1 s each: the TAT lies 1 s ahead, beyond a burst of 2.
    assert!(b.decide(&[&was], "a", 10, Some(T0)).await.admitted());
    let lease = LeaseAsk {
        rule: 0,
        units: 4,
        for_ms: 100,
    };
    let refresh = ScriptCall::decide_leasing(
        &[(
            Check {
                rule: &lowered,
                cost: 0,
            },
            vec!["a"],
        )],
        vec![lease],
        Some(T0),
    );
    let d = run(&b.client, &refresh, BUDGET)
        .await
        .and_then(Reply::decision)
        .unwrap();
    assert!(!d.admitted());
    assert_eq!((d.grants.len(), d.penalties_started.len()), (0, 0));
    let penalty = format!("{}:p", redis_key("p", &["a"]));
    assert_eq!(b.redis(&["EXISTS", &penalty]), "0");
    let d = b.decide(&[&lowered], "a", 1, Some(T0)).await;
    assert_eq!(d.penalties_started, [0], "a request's denial starts it");
    assert_eq!(b.redis(&["EXISTS", &penalty]), "1");
}

#[tokio::test]
async fn a_window_lease_ends_within_lease_for_even_in_a_coarse_bucket() {
    let b = Backend::start();
    let config = Config::from_json(&json!({"rules": [{"name": "w", "key": ["ip"],
        "algorithm": "windowed", "windows": [["1h", 1000, "1h"]], "lease": 10,
        "lease_for": "1s"}]}))
    .expect("a windowed rule takes lease_for");
    let rule = &config.rules[0];
    let lease = rule.lease.unwrap();
    let d = ask(&b, rule, "a", 10, lease.for_ms, T0).await;
    let into = (T0 + window_offset(&redis_key("w", &["a"]), 3_600_000)) % 3_600_000;
    assert_eq!(d.grants[0].for_ms, (3_600_000 - into).min(1000));
}

/// The client's IP in the isolate tests.
const IP: &str = "198.51.100.31";

fn request() -> RequestMeta {
    let ip = ("cf-connecting-ip".to_owned(), IP.to_owned());
    RequestMeta::new("GET", "example.com", "/", None, [ip])
}

/// What one isolate keeps between requests.
struct Isolate {
    cache: RefCell<BlockCache>,
    leases: RefCell<Leases>,
    wide: RefCell<RuleWide>,
    in_flight: InFlight,
}

impl Isolate {
    fn new() -> Isolate {
        Isolate {
            cache: RefCell::new(BlockCache::new(60_000)),
            leases: RefCell::new(Leases::new()),
            wide: RefCell::new(RuleWide::new()),
            in_flight: InFlight::new(TokioPause(|| 0)),
        }
    }

    /// This isolate's limiter over `config`, calling through `store`, on
    /// the pinned clock or Redis's.
    fn limiter<'a>(
        &'a self,
        config: &'a Config,
        store: &'a RestClient,
        pinned: bool,
    ) -> Limiter<'a, 'a, RestClient> {
        Limiter {
            config,
            store,
            cache: &self.cache,
            leases: &self.leases,
            wide: &self.wide,
            in_flight: &self.in_flight,
            pinned,
            home: None,
        }
    }

    fn held(&self, key: &str, now_ms: u64) -> u64 {
        self.leases.borrow_mut().held(key, now_ms)
    }
}

/// The units an admitted request's response says are left.
fn remaining(h: &Handled<'_>) -> u64 {
    match &h.outcome {
        Outcome::Forward(Forward::Admitted(d)) => d.decision.rules[0].remaining,
        other => panic!("not admitted: {other:?}"),
    }
}

fn config(rule: Value) -> Config {
    Config::from_json(&json!({ "rules": [rule] })).unwrap()
}

/// The isolate's clock.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Rate 10/s, burst 20, leases of 500 ms, one request every 100 ms: once
/// the stream has lasted half a lease, the reply says 19 left and grants 5,
/// after which Redis holds 9. A response never says more than Redis had
/// left after the grant plus the units the isolate holds.
#[tokio::test]
async fn a_leased_response_says_what_redis_and_the_isolate_hold() {
    let b = Backend::start();
    let c = config(
        json!({"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 10,
        "period": "1s", "burst": 20, "lease": 5, "lease_for": "500ms"}),
    );
    let isolate = Isolate::new();
    let l = isolate.limiter(&c, &b.client, true);
    let key = redis_key("g", &[IP]);
    // At the rate: each request finds the unit the one before spent back.
    for at in [T0, T0 + 100, T0 + 200] {
        assert_eq!(remaining(&l.handle(&request(), at).await), 19);
        assert_eq!(isolate.held(&key, at), 0, "a 200 ms run is a burst yet");
    }
    // 300 ms into the stream, with 500 ms to look ahead: 5 more asked
    // for, and granted.
    let now = T0 + 300;
    let granted = l.handle(&request(), now).await;
    assert_eq!(isolate.held(&key, now), 5);
    let redis_left = left(&b, &c.rules[0], IP, now).await;
    assert_eq!(redis_left, 9);
    assert_eq!(remaining(&granted), redis_left + 5);
    // Decided from the lease: 9 in Redis and 4 held, not 20.
    let leased = l.handle(&request(), now).await;
    assert_eq!(isolate.held(&key, now), 4);
    assert_eq!(remaining(&leased), 13);
}

/// A lease granted under the configured figures is not spent under lower
/// ones: the call that reads the lowered override ends it.
#[tokio::test]
async fn a_call_that_reads_lowered_figures_ends_the_clients_leases() {
    let b = Backend::start();
    let c = config(
        json!({"name": "o", "key": ["ip"], "algorithm": "gcra", "rate": 100,
        "period": "1s", "burst": 300, "lease": 20, "lease_for": "2s", "overrides": true}),
    );
    let isolate = Isolate::new();
    let l = isolate.limiter(&c, &b.client, true);
    let key = redis_key("o", &[IP]);
    let mut now = T0;
    while isolate.held(&key, now) == 0 {
        l.handle(&request(), now).await;
        now += 10;
    }
    b.redis(&["SET", &override_key(&key), "v1 gcra 10 1000 20 100000"]);
    let refresh = loop {
        let h = l.handle(&request(), now).await;
        now += 10;
        if let Some(r) = h.refresh {
            break r;
        }
    };
    assert!(isolate.held(&key, now) > 0);
    l.refresh(&refresh, now).await;
    assert_eq!(isolate.held(&key, now), 0, "ended by the lowered figures");
}

/// A refresh decided before a block whose answer lands after the call
/// that read the block (and ended the leases) restores nothing.
#[tokio::test]
async fn a_refresh_answered_after_a_block_restores_no_units() {
    let b = Backend::start();
    let proxy = FaultProxy::start(b.endpoint.addr()).unwrap();
    let slow = RestClient::new(&proxy.url(), TOKEN).unwrap();
    // Leases of 5 s, and calls that may take as long: longer than the
    // refresh's answer is held back.
    let c = config(
        json!({"name": "o", "key": ["ip"], "algorithm": "gcra", "rate": 100,
        "period": "1s", "burst": 1000, "lease": 20, "lease_for": "5s", "overrides": true,
        "budget": "5s"}),
    );
    let isolate = Isolate::new();
    let direct = isolate.limiter(&c, &b.client, false);
    let through = isolate.limiter(&c, &slow, false);
    let key = redis_key("o", &[IP]);
    let refresh = loop {
        let h = direct.handle(&request(), now_ms()).await;
        assert!(matches!(h.outcome, Outcome::Forward(Forward::Admitted(_))));
        if let Some(r) = h.refresh {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    proxy.set(Fault::DelayReply(Duration::from_millis(1500)));
    let late = through.refresh(&refresh, now_ms());
    let meanwhile = async {
        // By now the refresh has been decided, before the block.
        tokio::time::sleep(Duration::from_millis(400)).await;
        b.redis(&["SET", &override_key(&key), BLOCK_TEXT]);
        // What the isolate holds is spent, then a call reads the block.
        loop {
            if let Outcome::Deny(_) = direct.handle(&request(), now_ms()).await.outcome {
                break;
            }
        }
        assert_eq!(isolate.held(&key, now_ms()), 0);
    };
    let (events, ()) = tokio::join!(late, meanwhile);
    assert!(
        events.iter().all(|e| e.action != Action::LeaseFailed),
        "{events:?}"
    );
    assert_eq!(
        isolate.held(&key, now_ms()),
        0,
        "the late grant restored units"
    );
    assert!(matches!(
        direct.handle(&request(), now_ms()).await.outcome,
        Outcome::Deny(_)
    ));
}
