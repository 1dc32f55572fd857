//! A request in a region away from the home that matches a shared rule
//! and rules that are not shared (issue 48): its region's Redis decides it
//! in one nearby call while the pool or the share lasts, the pool spent
//! and the other rules charged together or not at all. Two real
//! redis-servers behind the REST endpoint, the home's and the region's,
//! with each one's script calls counted.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::time::Duration;

use edge_limiter::{
    decision::{
        limiter::{Forward, Handled, Limiter, Outcome},
        memory::{in_flight::InFlight, IsolateMemory},
        runtime::TokioPause,
        transport::{
            keys::{pool_key, rule_key},
            redis_rest::RestClient,
        },
    },
    rules::{config::Config, request::RequestMeta},
};
use edge_limiter_local::fault_proxy::{Fault, FaultProxy};
use serde_json::json;
use support::Backend;

/// The pinned clock's start.
const T0: u64 = 1_795_168_800_000;

/// A shared rule on every path, decided 5 units at once in the region
/// alone (`region_share`), and a login rule of one a minute on `/login`
/// that is not shared.
fn config() -> Config {
    let shared = json!({"name": "api", "key": ["ip"], "algorithm": "gcra", "rate": 100,
                        "period": "1m", "burst": 20, "regions": "shared", "region_share": 5});
    let login = json!({"name": "login", "key": ["ip"], "algorithm": "gcra", "rate": 1,
                       "period": "1m", "path_prefix": "/login"});
    let regions = json!([{"name": "us", "home": true}, {"name": "eu", "colos": ["FRA"]}]);
    Config::from_json(&json!({"rules": [shared, login], "regions": regions})).unwrap()
}

/// Each request's status, and the script calls each Redis took for it.
struct Seen {
    admitted: bool,
    near: u64,
    far: u64,
}

async fn send(
    limiter: &Limiter<'_, '_, RestClient>,
    (home, eu): (&Backend, &Backend),
    ip: &str,
    path: &str,
) -> Seen {
    let (near, far) = (eu.script_calls(), home.script_calls());
    let header = ("cf-connecting-ip".to_owned(), ip.to_owned());
    let req = RequestMeta::new("GET", "example.com", path, None, [header]);
    let handled: Handled<'_> = limiter.handle(&req, T0).await;
    Seen {
        admitted: matches!(handled.outcome, Outcome::Forward(Forward::Admitted(_))),
        near: eu.script_calls() - near,
        far: home.script_calls() - far,
    }
}

#[tokio::test]
async fn a_request_is_decided_by_one_nearby_call_while_its_pool_lasts() {
    let (home, eu) = (Backend::start(), Backend::start());
    let config = config();
    let memory = IsolateMemory::new(config.cache_hold_ms, InFlight::new(TokioPause(|| 0)));
    let limiter = Limiter::new(&config, &eu.client, &memory, true).away_from(&home.client);
    let both = (&home, &eu);
    // Each Redis loads the script once: its first call is sent twice.
    for b in [&home, &eu] {
        b.decide(&[&config.rules[1]], "warm", 1, Some(T0)).await;
    }

    // The share covers a login: one call spends it and charges the login.
    let seen = send(&limiter, both, "192.0.2.1", "/login").await;
    assert!(seen.admitted && (seen.near, seen.far) == (1, 0));
    // The login rule denies the next one in the same call, which spends
    // nothing from the share: the pool key is as it was.
    let pool_key = "el:{192.0.2.1}:api:pool";
    let before = eu.redis(&["GET", pool_key]);
    let seen = send(&limiter, both, "192.0.2.1", "/login").await;
    assert!(!seen.admitted && (seen.near, seen.far) == (1, 0));
    assert_eq!(eu.redis(&["GET", pool_key]), before);

    // A client whose share is spent: a login the login rule would admit
    // commits nothing in the region's call, the home decides the shared
    // rule, and a second nearby call charges the login, once.
    for _ in 0..5 {
        let seen = send(&limiter, both, "192.0.2.2", "/").await;
        assert!(seen.admitted && (seen.near, seen.far) == (1, 0));
    }
    let seen = send(&limiter, both, "192.0.2.2", "/login").await;
    assert!(seen.admitted && (seen.near, seen.far) == (2, 1));
    let login = eu.redis(&["PTTL", "el:{192.0.2.2}:login"]);
    assert!(login.parse::<i64>().unwrap() > 0, "the login was charged");
    // One the login rule denies is refused by the region alone: the home
    // is not asked for a request that cannot pass.
    let seen = send(&limiter, both, "192.0.2.2", "/login").await;
    assert!(!seen.admitted && (seen.near, seen.far) == (1, 0));
}

/// A shared rule with `lease`: away from the home, the isolate takes
/// units from its region's pool in a spend's own call, and after responses
/// (a refresh, as the worker sends), and spends them itself, so that a
/// steady client's requests mostly make no call before their response;
/// the pool is topped up from the home after responses, as the worker does.
#[tokio::test]
async fn a_steady_client_is_served_from_units_its_isolate_took_from_the_pool() {
    let (home, eu) = (Backend::start(), Backend::start());
    let shared = json!({"name": "api", "key": ["ip"], "algorithm": "gcra", "rate": 100,
                        "period": "1m", "burst": 100, "regions": "shared", "region_share": 5,
                        "lease": 10, "lease_for": "5s"});
    let regions = json!([{"name": "us", "home": true}, {"name": "eu", "colos": ["FRA"]}]);
    let config = Config::from_json(&json!({"rules": [shared], "regions": regions})).unwrap();
    let memory = IsolateMemory::new(config.cache_hold_ms, InFlight::new(TokioPause(|| 0)));
    let limiter = Limiter::new(&config, &eu.client, &memory, true).away_from(&home.client);
    let (near, far) = (eu.script_calls(), home.script_calls());
    let header = ("cf-connecting-ip".to_owned(), "192.0.2.9".to_owned());
    let req = RequestMeta::new("GET", "example.com", "/", None, [header]);
    let (mut admitted, mut waited) = (0, 0);
    // 60 requests 700 ms apart: 42 s, well below 100 a minute.
    for k in 0..60 {
        let now = T0 + k * 700;
        let before = eu.script_calls() + home.script_calls();
        let handled = limiter.handle(&req, now).await;
        waited += u64::from(eu.script_calls() + home.script_calls() > before);
        admitted += u64::from(matches!(
            handled.outcome,
            Outcome::Forward(Forward::Admitted(_))
        ));
        if !handled.pool.is_empty() {
            limiter.top_up(&handled.pool, now + 1).await;
        }
        if let Some(refresh) = &handled.refresh {
            limiter.refresh(refresh, now + 1).await;
        }
    }
    let (near, far) = (eu.script_calls() - near, home.script_calls() - far);
    assert_eq!(admitted, 60);
    // The share's five, then one where a pool's tranche ended with the
    // units its isolate held (10 in all, on this timeline).
    assert!(waited <= 12, "{waited} of 60 requests made a call");
    // Spends, refreshes and credits in the region, top-ups at the home
    // (each first call to a fresh Redis is sent twice).
    assert!(near <= 30, "{near} calls in the region for 60 requests");
    assert!(far <= 10, "{far} calls at the home");
}

/// Units an isolate took from a pool tranche are spent no later than the
/// tranche's end, however late the reply that moved them arrives: the
/// isolate counts their time from before it sent the call, as the region
/// counted it, not from when it heard back. Counted from the arrival, they
/// would outlive the tranche by the near trip, and be spent after the home
/// charged them as spent at its end.
#[tokio::test]
async fn units_an_isolate_took_end_with_their_tranche_however_late_the_reply() {
    let (home, eu) = (Backend::start(), Backend::start());
    let shared = json!({"name": "api", "key": ["ip"], "algorithm": "gcra", "rate": 10,
                        "period": "1s", "burst": 30, "regions": "shared",
                        "lease": 5, "lease_for": "1s"});
    let regions = json!([{"name": "us", "home": true}, {"name": "eu", "colos": ["FRA"]}]);
    let config = Config::from_json(&json!({"rules": [shared], "regions": regions})).unwrap();
    let rule = &config.rules[0];
    // The isolate's clock, which the script runs on (pinned) and the
    // isolate reads after its calls.
    let start = std::time::Instant::now();
    let now = move || T0 + start.elapsed().as_millis() as u64;
    let memory = IsolateMemory::new(config.cache_hold_ms, InFlight::new(TokioPause(now)));
    let upstream = eu
        .endpoint
        .url()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let proxy = FaultProxy::start(upstream).unwrap();
    let near = RestClient::new(&proxy.url(), support::TOKEN).unwrap();
    let limiter = Limiter::new(&config, &near, &memory, true).away_from(&home.client);
    let warm = ("cf-connecting-ip".to_owned(), "192.0.2.200".to_owned());
    let warm = RequestMeta::new("GET", "example.com", "/", None, [warm]);
    limiter.handle(&warm, now()).await;

    // A pool whose first tranche ends 1.5 s in, the next later; every
    // reply then takes 300 ms to come back.
    let key = pool_key(&rule_key(rule, &["192.0.2.10"]));
    let (t0_us, tranche_ms) = (now() * 1000, 1500);
    let text = format!(
        "30 {} 30 {} 0 0 0 {t0_us} 0",
        t0_us + tranche_ms * 1000,
        t0_us + 8_000_000
    );
    eu.redis(&["SET", &key, &text, "PX", "60000"]);
    let ends_ms = t0_us / 1000 + tranche_ms;
    proxy.set(Fault::DelayReply(Duration::from_millis(300)));
    let header = ("cf-connecting-ip".to_owned(), "192.0.2.10".to_owned());
    let req = RequestMeta::new("GET", "example.com", "/", None, [header]);
    // A steady client until its isolate holds units of the first tranche.
    let served_alone = loop {
        let (calls, at) = (eu.script_calls(), now());
        assert!(at < ends_ms - 200, "the isolate took no units in time");
        let handled = limiter.handle(&req, at).await;
        assert!(matches!(
            handled.outcome,
            Outcome::Forward(Forward::Admitted(_))
        ));
        if eu.script_calls() == calls {
            break at;
        }
    };
    // Past the tranche's end, with the isolate's units counted from their
    // reply's arrival still running: the request must go to the region.
    tokio::time::sleep(Duration::from_millis(ends_ms + 100 - now())).await;
    let calls = eu.script_calls();
    limiter.handle(&req, now()).await;
    assert_eq!(
        eu.script_calls(),
        calls + 1,
        "a unit the isolate took was spent {} ms after its tranche ended \
         (the first it spent alone at {} ms)",
        now() - ends_ms,
        served_alone - t0_us / 1000
    );
}

/// A steady client's `RateLimit-Remaining` away from the home runs on
/// from the home's figures: what the pool and the share hold on top of
/// what the home had at its last grant (all of it before any), not the
/// pool's few units alone, which would tell a client at 85 a minute of a
/// limit of 100 that it has 3 left each time its pool runs low, and one
/// spending its share that it has none.
#[tokio::test]
async fn a_steady_clients_remaining_away_from_the_home_is_the_limits() {
    let (home, eu) = (Backend::start(), Backend::start());
    let shared = json!({"name": "api", "key": ["ip"], "algorithm": "gcra", "rate": 100,
                        "period": "1m", "burst": 100, "regions": "shared", "region_share": 5});
    let regions = json!([{"name": "us", "home": true}, {"name": "eu", "colos": ["FRA"]}]);
    let config = Config::from_json(&json!({"rules": [shared], "regions": regions})).unwrap();
    let memory = IsolateMemory::new(config.cache_hold_ms, InFlight::new(TokioPause(|| 0)));
    let limiter = Limiter::new(&config, &eu.client, &memory, true).away_from(&home.client);
    let header = ("cf-connecting-ip".to_owned(), "192.0.2.30".to_owned());
    let req = RequestMeta::new("GET", "example.com", "/", None, [header]);
    let mut seen = vec![];
    for k in 0..40 {
        let now = T0 + k * 700;
        let far = home.script_calls();
        let handled = limiter.handle(&req, now).await;
        let Outcome::Forward(Forward::Admitted(decided)) = &handled.outcome else {
            panic!("request {k} was not admitted");
        };
        let state = &decided.decision.rules[0];
        seen.push((
            state.remaining,
            state.reset_after_ms,
            home.script_calls() > far,
        ));
        if !handled.pool.is_empty() {
            limiter.top_up(&handled.pool, now + 1).await;
        }
    }
    let pooled: Vec<_> = seen.iter().filter(|(.., far)| !far).collect();
    assert!(pooled.len() >= 35, "{seen:?}");
    // Within what the client spent in the last minute, less the pools'
    // deadlines the home counts them at.
    assert!(pooled.iter().all(|(left, ..)| *left >= 40), "{seen:?}");
    assert!(
        pooled
            .iter()
            .all(|(_, reset, _)| (1..=60_000).contains(reset)),
        "{seen:?}"
    );
}
