//! The in-flight limit's script (`lua/concurrency.lua`) against a real
//! redis-server: slots taken with the rest of a decision, given back one
//! release at a time, free after `hold_for` when no release comes, and
//! exact under many callers at once.

mod support;

use std::collections::HashSet;

use edge_limiter::{
    decision::{
        outcomes::verdict::Decision,
        transport::keys::redis_key,
        transport::protocol::{run, Check, RefundCharge, Reply, ScriptCall},
    },
    rules::rule::Rule,
};
use serde_json::json;
use support::{rules, Backend, BUDGET};

/// A pinned clock.
const T0: u64 = 1_795_168_800_000;

fn in_flight(limit: u64) -> Rule {
    rules(
        json!([{"name": "f", "key": ["ip"], "algorithm": "concurrency",
                  "limit": limit, "hold_for": "10s"}]),
    )
    .remove(0)
}

/// A request of `cost` slots under `rule`, at `now_ms` (None: Redis's clock).
async fn take(b: &Backend, rule: &Rule, cost: u64, now_ms: Option<u64>) -> Decision {
    b.decide(&[rule], "a", cost, now_ms).await
}

/// The release mark of an admitted request.
fn mark(d: &Decision) -> u64 {
    Backend::mark(d)
}

/// Gives back the `cost` slots from `mark`; whether any was still held.
async fn release(b: &Backend, rule: &Rule, (cost, mark): (u64, u64), now_ms: Option<u64>) -> bool {
    let key = redis_key(&rule.name, &["a"]);
    let charge = RefundCharge {
        check: Check { rule, cost },
        id: vec!["a"],
        key: &key,
        mark,
        under: "",
    };
    match run(&b.client, &ScriptCall::refund(&[charge], now_ms), BUDGET).await {
        Ok(Reply::Refunded(given)) => given == [true],
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn slots_are_taken_to_the_limit_and_each_release_frees_its_own() {
    let b = Backend::start();
    let rule = in_flight(3);
    let mut marks = vec![];
    for left in [2, 1, 0] {
        let d = take(&b, &rule, 1, Some(T0)).await;
        assert_eq!(d.rules[0].remaining, left, "{d:?}");
        marks.push(mark(&d));
    }
    let denied = take(&b, &rule, 1, Some(T0)).await;
    assert!(!denied.admitted(), "{denied:?}");
    assert!(denied.refund_marks.iter().all(|(_, m)| *m == 0));
    // A denial takes nothing: the key holds three slots and the counter.
    let key = redis_key("f", &["a"]);
    assert_eq!(b.redis(&["ZCARD", &key]), "4");
    // Every mark names a slot of its own; a release frees that one alone,
    // once: a second release of it frees nothing.
    assert_eq!(marks.iter().collect::<HashSet<_>>().len(), 3);
    assert!(release(&b, &rule, (1, marks[1]), Some(T0)).await);
    assert!(!release(&b, &rule, (1, marks[1]), Some(T0)).await);
    let d = take(&b, &rule, 1, Some(T0)).await;
    assert_eq!(d.rules[0].remaining, 0, "one slot was free: {d:?}");
    assert!(!take(&b, &rule, 1, Some(T0)).await.admitted());
    // A request of two slots takes two, and its release gives both back.
    for m in [marks[0], marks[2], mark(&d)] {
        assert!(release(&b, &rule, (1, m), Some(T0)).await);
    }
    let two = take(&b, &rule, 2, Some(T0)).await;
    assert_eq!(two.rules[0].remaining, 1);
    assert!(release(&b, &rule, (2, mark(&two)), Some(T0)).await);
    assert_eq!(take(&b, &rule, 0, Some(T0)).await.rules[0].remaining, 3);
    // More slots than the limit: never, and no wait helps.
    let huge = take(&b, &rule, 4, Some(T0)).await;
    assert!(!huge.admitted());
}

#[tokio::test]
async fn a_slot_never_released_is_free_after_hold_for_and_the_key_expires() {
    let b = Backend::start();
    let rule = in_flight(1);
    let first = take(&b, &rule, 1, Some(T0)).await;
    let stale = mark(&first);
    let full = take(&b, &rule, 1, Some(T0 + 9_999)).await;
    assert!(!full.admitted());
    // The retry waits for the slot to be free, at most a second.
    assert_eq!(full.rules[0].retry().and_then(|r| r.ms()), Some(1));
    let later = take(&b, &rule, 1, Some(T0 + 10_000)).await;
    let fresh = mark(&later);
    assert!(fresh > stale, "numbers never repeat: {stale} then {fresh}");
    // The stale holder's late release cannot free the new slot.
    assert!(!release(&b, &rule, (1, stale), Some(T0 + 10_000)).await);
    assert!(!take(&b, &rule, 1, Some(T0 + 10_000)).await.admitted());
    // On Redis's clock the key lives as long as its newest slot.
    let b = Backend::start();
    let d = take(&b, &rule, 1, None).await;
    mark(&d);
    let ttl: i64 = b.redis(&["PTTL", &redis_key("f", &["a"])]).parse().unwrap();
    assert!((9_000..=10_000).contains(&ttl), "{ttl}");
}

#[tokio::test]
async fn many_callers_at_once_hold_no_more_than_the_limit() {
    let b = Backend::start();
    let rule = in_flight(5);
    let calls = (0..64).map(|_| take(&b, &rule, 1, None));
    let decided = futures_util::future::join_all(calls).await;
    let admitted: Vec<u64> = decided.iter().filter(|d| d.admitted()).map(mark).collect();
    assert_eq!(admitted.len(), 5, "{decided:?}");
    for m in &admitted {
        assert!(release(&b, &rule, (1, *m), None).await);
    }
    let again = (0..64).map(|_| take(&b, &rule, 1, None));
    let decided = futures_util::future::join_all(again).await;
    assert_eq!(decided.iter().filter(|d| d.admitted()).count(), 5);
}

#[tokio::test]
async fn an_in_flight_rule_is_decided_with_the_others_all_or_nothing() {
    let b = Backend::start();
    let both = rules(json!([
        {"name": "f", "key": ["ip"], "algorithm": "concurrency", "limit": 5},
        {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m", "burst": 1}
    ]));
    let pair = [&both[0], &both[1]];
    let decide = |cost| b.decide(&pair, "a", cost, Some(T0));
    let first = decide(1).await;
    assert!(first.admitted());
    assert_eq!(first.rules[0].remaining, 4);
    // GCRA denies the second: the in-flight rule takes no slot for it.
    let second = decide(1).await;
    assert!(!second.admitted());
    assert_eq!(decide(0).await.rules[0].remaining, 4);
}

#[tokio::test]
async fn inspect_shows_the_slots_held_and_until_when() {
    use edge_limiter::operator::inspect::inspect;
    let b = Backend::start();
    let rule = rules(
        json!([{"name": "f", "key": ["header:x-k"], "algorithm": "concurrency",
                             "limit": 3, "hold_for": "10s"}]),
    )
    .remove(0);
    let none = inspect(&b.client, &rule, &["k-1"]).await.unwrap();
    assert_eq!(none.slots_ms, Some(vec![]));
    assert!(
        none.render().contains("slots held: none"),
        "{}",
        none.render()
    );
    let d = b.decide(&[&rule], "k-1", 1, None).await;
    mark(&d);
    b.decide(&[&rule], "k-1", 1, None).await;
    let two = inspect(&b.client, &rule, &["k-1"]).await.unwrap();
    let slots = two.slots_ms.clone().unwrap();
    assert_eq!(slots.len(), 2, "{two:?}");
    assert!(
        slots.iter().all(|ms| (9_000..=10_000).contains(ms)),
        "{slots:?}"
    );
    assert_eq!(two.windows[0].remaining, 1);
    assert!(
        two.render()
            .contains("slots held: 2, free when their responses end"),
        "{}",
        two.render()
    );
    assert_eq!(two.to_json()["slots_ms"].as_array().map(Vec::len), Some(2));
}
