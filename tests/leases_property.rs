//! Quota leases never go over the limit (issue 24): random arrivals from
//! several simulated isolates, each a real [`Limiter`] with its own lease
//! table, against the real script on `redis-server` on a pinned clock.
//! Every admission's time is recorded, and the independent checker
//! (`simulate::conform`, sharing no code with the script's Rust side or the
//! model) replays them: none may go over. With leases off, the admissions
//! are exactly the reference model's.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::{
    cell::RefCell,
    sync::atomic::{AtomicU64, Ordering},
};

use edge_limiter::{
    decision::{
        block_cache::BlockCache,
        keys::{redis_key, window_offset},
        leases::Leases,
        limiter::{Forward, Limiter, Outcome},
        protocol::Check,
        redis_rest::RestClient,
        rule_wide::RuleWide,
    },
    operator::simulate::{conform::over_limit, model::Model},
    rules::{config::Config, lease::Lease, policy::Policy, request::RequestMeta},
};
use proptest::{
    prelude::*,
    test_runner::{TestCaseError, TestRunner},
};
use serde_json::{json, Value};
use support::Backend;

/// A rule as the checker reads it: plain figures.
#[derive(Debug, Clone)]
enum Limit {
    /// rate per period (ms), burst.
    Gcra {
        rate: u64,
        period_ms: u64,
        burst: u64,
    },
    /// (duration, limit, precision) per window, ms.
    Windows(Vec<(u64, u64, u64)>),
}

impl Limit {
    fn json(&self, name: &str, lease: Option<(u64, Option<u64>)>) -> Value {
        let mut rule = match self {
            Limit::Gcra {
                rate,
                period_ms,
                burst,
            } => json!({"algorithm": "gcra", "rate": rate, "period": period_ms, "burst": burst}),
            Limit::Windows(ws) => json!({"algorithm": "windowed", "windows": ws}),
        };
        rule["name"] = json!(name);
        rule["key"] = json!(["ip"]);
        if let Some((units, for_ms)) = lease {
            rule["lease"] = json!(units);
            if let Some(ms) = for_ms {
                rule["lease_for"] = json!(ms);
            }
        }
        rule
    }
}

/// One request: how long after the previous one (ms; when drawn, in
/// hundredths of twice the limit's spacing), from which isolate.
#[derive(Debug, Clone)]
struct Arrival {
    wait_ms: u64,
    isolate: usize,
}

fn limit() -> impl Strategy<Value = Limit> {
    let gcra =
        (1u64..50, 100u64..2000, 4u64..200).prop_map(|(rate, period_ms, burst)| Limit::Gcra {
            rate,
            period_ms,
            burst,
        });
    let windows = (
        (10u64..200, 1u64..6, 3u64..200),
        prop::option::of((2u64..6, 2u64..4)),
    )
        .prop_map(|((precision, buckets, limit), longer)| {
            let mut ws = vec![(precision * buckets, limit, precision)];
            if let Some((times, more)) = longer {
                ws.push((
                    precision * buckets * times,
                    limit * more,
                    precision * buckets,
                ));
            }
            Limit::Windows(ws)
        });
    prop_oneof![gcra, windows]
}

fn arrivals(isolates: usize) -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec(
        (0u64..100, 0..isolates).prop_map(|(wait_ms, isolate)| Arrival { wait_ms, isolate }),
        50..250,
    )
}

/// Admissions (ms, one unit each) over `policy`, by the independent check.
fn over(policy: &Policy, offset_ms: u64, admitted_ms: &[u64]) -> u64 {
    let charged: Vec<(u64, u64)> = admitted_ms.iter().map(|&t| (t, 1)).collect();
    over_limit(policy, offset_ms, &charged)
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// Requests decided from leases over every case, shown at the end.
static LOCAL: AtomicU64 = AtomicU64::new(0);
static TOTAL: AtomicU64 = AtomicU64::new(0);

/// The admissions' times, and how many script calls were made, when
/// `arrivals` reach `isolates` isolates under `config`'s one rule.
async fn replay(
    client: &RestClient,
    config: &Config,
    ip: &str,
    isolates: usize,
    arrivals: &[Arrival],
    t0: u64,
) -> (Vec<u64>, usize) {
    let caches: Vec<RefCell<BlockCache>> = (0..isolates)
        .map(|_| RefCell::new(BlockCache::new(0)))
        .collect();
    let leases: Vec<RefCell<Leases>> = (0..isolates).map(|_| RefCell::new(Leases::new())).collect();
    let (mut now, mut admitted, mut calls) = (t0, vec![], 0);
    for a in arrivals {
        now += a.wait_ms;
        let limiter = Limiter {
            config,
            store: client,
            cache: &caches[a.isolate],
            leases: &leases[a.isolate],
            wide: &RefCell::new(RuleWide::new()),
            pinned: true,
        };
        let req = RequestMeta::new(
            "GET",
            "example.com",
            "/",
            None,
            [("cf-connecting-ip".to_owned(), ip.to_owned())],
        );
        let held_before = leases[a.isolate]
            .borrow_mut()
            .held(&redis_key("r", &[ip]), now);
        let handled = limiter.handle(&req, now).await;
        let held_after = leases[a.isolate]
            .borrow_mut()
            .held(&redis_key("r", &[ip]), now);
        // A request spent a unit here, or it made a call.
        if !(held_before > 0 && held_after + 1 == held_before) {
            calls += 1;
        }
        if let Outcome::Forward(Forward::Admitted(_)) = handled.outcome {
            admitted.push(now);
        }
        // The refresh the worker runs after the response.
        if let Some(refresh) = handled.refresh {
            limiter.refresh(&refresh, now).await;
            calls += 1;
        }
    }
    (admitted, calls)
}

/// The reference model's admissions for the same arrivals, one client.
fn model_admissions(config: &Config, ip: &str, arrivals: &[Arrival], t0: u64) -> Vec<u64> {
    let mut model = Model::new();
    let mut now = t0;
    let mut admitted = vec![];
    for a in arrivals {
        now += a.wait_ms;
        let check = Check {
            rule: &config.rules[0],
            cost: 1,
        };
        if model.decide(&[(check, vec![ip])], now).admitted() {
            admitted.push(now);
        }
    }
    admitted
}

thread_local! {
    static BACKEND: (Backend, tokio::runtime::Runtime) = (
        Backend::start(),
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap(),
    );
}

/// One case: `arrivals` from `isolates` isolates under `limit`, leased
/// with a share (in quarters) of the largest lease and of its longest
/// length; then the same with leases off.
fn case(
    (limit, isolates, share, length, arrivals): (Limit, usize, u64, u64, Vec<Arrival>),
) -> Result<(), TestCaseError> {
    // Gaps (drawn in hundredths) up to twice the limit's mean spacing, so
    // that arrivals come from well under the limit to well over it.
    let spacing_ms = match &limit {
        Limit::Gcra {
            rate, period_ms, ..
        } => period_ms / rate,
        Limit::Windows(ws) => ws[0].0 / ws[0].1,
    };
    let arrivals: Vec<Arrival> = arrivals
        .into_iter()
        .map(|a| Arrival {
            isolate: a.isolate % isolates,
            wait_ms: a.wait_ms * 2 * spacing_ms / 100,
        })
        .collect();
    let plain = Config::from_json(&json!({"rules": [limit.json("r", None)]})).unwrap();
    let policy = &plain.rules[0].policy;
    let units = (Lease::largest(policy, 0) * share / 4).max(1);
    let lease_for = match limit {
        Limit::Gcra { .. } => Some((Lease::longest_for_ms(policy, units) * length / 4).max(1)),
        Limit::Windows(_) => None,
    };
    let leasing = Config::from_json(&json!({"rules": [limit.json("r", Some((units, lease_for)))]}));
    prop_assume!(leasing.is_ok());
    let leasing = leasing.unwrap();
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    let t0 = 1_795_168_800_000 + case * 1000;
    BACKEND.with(|(backend, rt)| {
        let ip = format!("10.0.{}.{}", case / 200, case % 200);
        let (admitted, calls) = rt.block_on(replay(
            &backend.client,
            &leasing,
            &ip,
            isolates,
            &arrivals,
            t0,
        ));
        let offset = window_offset(&redis_key("r", &[&ip]), policy.longest_ms());
        prop_assert_eq!(
            over(policy, offset, &admitted),
            0,
            "over the limit: {:?}",
            admitted
        );
        LOCAL.fetch_add(
            arrivals.len().saturating_sub(calls) as u64,
            Ordering::Relaxed,
        );
        TOTAL.fetch_add(arrivals.len() as u64, Ordering::Relaxed);
        // Leases off: one call per request, and exactly the model's sequence.
        let ip = format!("10.1.{}.{}", case / 200, case % 200);
        let (exact, calls) = rt.block_on(replay(
            &backend.client,
            &plain,
            &ip,
            isolates,
            &arrivals,
            t0,
        ));
        prop_assert_eq!(calls, arrivals.len());
        prop_assert_eq!(&exact, &model_admissions(&plain, &ip, &arrivals, t0));
        Ok(())
    })
}

#[test]
fn leased_admissions_never_go_over_the_limit() {
    // PROPTEST_CASES runs more, e.g. 1000 before a release.
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok());
    let mut runner = TestRunner::new(ProptestConfig {
        cases: cases.unwrap_or(48),
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let cases = (limit(), 1usize..5, 1u64..=4, 1u64..=4, arrivals(4));
    if let Err(e) = runner.run(&cases, case) {
        panic!("{e}");
    }
    // The cases must exercise leases, not only the calls around them.
    let (local, total) = (LOCAL.load(Ordering::Relaxed), TOTAL.load(Ordering::Relaxed));
    eprintln!("{local} of {total} requests decided from leases");
    assert!(
        local * 5 >= total,
        "only {local} of {total} requests decided from leases"
    );
}

/// Leases are used: a hot key through two isolates makes far fewer calls
/// than requests, and is still never over.
#[test]
fn a_hot_key_is_mostly_decided_from_leases() {
    let limit = Limit::Gcra {
        rate: 100,
        period_ms: 1000,
        burst: 100,
    };
    let config =
        Config::from_json(&json!({"rules": [limit.json("r", Some((20, Some(500))))]})).unwrap();
    // 70 per second, alternating between two isolates.
    let arrivals: Vec<Arrival> = (0..700)
        .map(|i| Arrival {
            wait_ms: if i % 7 == 0 { 16 } else { 14 },
            isolate: i % 2,
        })
        .collect();
    BACKEND.with(|(backend, rt)| {
        let (admitted, calls) = rt.block_on(replay(
            &backend.client,
            &config,
            "10.9.9.9",
            2,
            &arrivals,
            1_795_000_000_000,
        ));
        let policy = &config.rules[0].policy;
        assert_eq!(over(policy, 0, &admitted), 0);
        assert!(admitted.len() >= 690, "{} admitted", admitted.len());
        eprintln!(
            "{calls} calls, {} admitted of {} requests",
            admitted.len(),
            arrivals.len()
        );
        assert!(
            calls * 5 <= arrivals.len(),
            "{calls} calls for {} requests",
            arrivals.len()
        );
    });
}
