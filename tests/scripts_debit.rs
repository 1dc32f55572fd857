//! Debits (issue 46, the cost a response reports), against a real
//! `redis-server` through the REST endpoint: a charge's units charged
//! again past the limit go into debt, the client is denied until it is
//! paid off and told when, on Redis's clock and a pinned one alike, and no
//! run of debts takes a GCRA client more than two bursts ahead.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use edge_limiter::{decision::outcomes::verdict::Retry, rules::rule::Rule};
use serde_json::json;
use support::{rules, Backend};

/// A pinned clock.
const T0: u64 = 1_795_168_800_000;

/// Charges `cost` units more to `rule`'s client `id`, its decision's mark
/// `mark`; whether anything moved.
async fn debit(b: &Backend, rule: &Rule, id: &str, charge: (u64, u64), now: Option<u64>) -> bool {
    b.settle((rule, id), charge, now, true).await
}

fn rule(policy: serde_json::Value) -> Rule {
    let mut r = json!({"name": "d", "key": ["ip"], "count_status": [200]});
    r.as_object_mut()
        .unwrap()
        .extend(policy.as_object().unwrap().clone());
    rules(json!([r])).remove(0)
}

#[tokio::test]
async fn a_gcra_debt_denies_until_paid_and_stops_at_two_bursts() {
    let b = Backend::start();
    // One unit a second, five at once.
    let g = rule(json!({"algorithm": "gcra", "rate": 1, "period": "1s", "burst": 5}));
    for now in [Some(T0), None] {
        let id = if now.is_some() { "pinned" } else { "redis" };
        let d = b.decide(&[&g], id, 1, now).await;
        assert!(d.admitted());
        let mark = Backend::mark(&d);
        // The response cost 7, not 1: six more, one past the burst.
        assert!(debit(&b, &g, id, (6, mark), now).await);
        let denied = b.decide(&[&g], id, 1, now).await;
        assert!(!denied.admitted(), "{denied:?}");
        // The TAT lies 7 s ahead; this request would take it to 8, 3 s
        // past the burst's 5.
        let retry = denied.retry().and_then(Retry::ms).unwrap();
        assert!((2900..=3000).contains(&retry), "{retry}");
        // However much more is reported, the debt stops at two bursts.
        assert!(debit(&b, &g, id, (5, mark), now).await);
        // On Redis's clock the TAT has come a few ms nearer meanwhile.
        let moved = debit(&b, &g, id, (5, mark), now).await;
        assert!(now.is_none() || !moved, "already two bursts ahead");
        let capped = b.decide(&[&g], id, 1, now).await;
        let retry = capped.retry().and_then(Retry::ms).unwrap();
        assert!((5900..=6000).contains(&retry), "{retry}");
    }
}

#[tokio::test]
async fn a_windowed_debt_counts_past_the_limit_until_it_leaves_the_window() {
    let b = Backend::start();
    let w = rule(json!({"algorithm": "windowed", "windows": [["10s", 5, "1s"]]}));
    let d = b.decide(&[&w], "w", 1, Some(T0)).await;
    let mark = Backend::mark(&d);
    assert!(debit(&b, &w, "w", (7, mark), Some(T0)).await);
    // Eight counted of five: denied, even a request that costs nothing
    // shows none left.
    let denied = b.decide(&[&w], "w", 1, Some(T0 + 100)).await;
    assert!(!denied.admitted());
    assert_eq!(denied.rules[0].remaining, 0);
    // Once the debt's bucket has left the window, the client is back.
    let back = b.decide(&[&w], "w", 1, Some(T0 + 11_000)).await;
    assert!(back.admitted(), "{back:?}");
}
