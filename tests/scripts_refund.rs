//! Refundable charges (issue 23's script side), against a real
//! `redis-server` through the REST endpoint: a `count_status` rule charged
//! up front gives its charge back exactly, from where it was charged, and
//! never more than what is still outstanding, so that no refund can undo
//! another request's charge.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use edge_limiter::{
    decision::{
        outcomes::verdict::Decision,
        transport::keys::redis_key,
        transport::protocol::{run, Check, RefundCharge, Reply, ScriptCall},
    },
    operator::simulate::model::Model,
    rules::{overrides::Override, rule::Rule},
};
use serde_json::json;
use support::{rules, Backend, BUDGET};

/// A pinned clock, for the tests that compare with the model.
const T0: u64 = 1_795_168_800_000;

/// A decision charging `rule` one unit, with its refund mark, at `now_ms`.
async fn charge(b: &Backend, rule: &Rule, id: &str, now_ms: Option<u64>) -> Decision {
    charge_of(b, rule, id, 1, now_ms).await
}

/// A decision charging `rule` `cost` units, with its refund mark.
async fn charge_of(b: &Backend, rule: &Rule, id: &str, cost: u64, now_ms: Option<u64>) -> Decision {
    let call = ScriptCall::decide(&[(Check { rule, cost }, vec![id])], now_ms);
    run(&b.client, &call, BUDGET)
        .await
        .and_then(Reply::decision)
        .expect("a decision")
}

/// The mark of `d`'s only rule, which must have been charged.
fn mark(d: &Decision) -> u64 {
    Backend::mark(d)
}

/// Gives back the one-unit charge `mark` stands for; whether anything was.
async fn refund(b: &Backend, rule: &Rule, id: &str, mark: u64, now_ms: Option<u64>) -> bool {
    refund_of(b, rule, id, (1, mark), now_ms).await
}

/// Gives back the charge of `cost` units that `mark` stands for.
async fn refund_of(
    b: &Backend,
    rule: &Rule,
    id: &str,
    (cost, mark): (u64, u64),
    now_ms: Option<u64>,
) -> bool {
    b.settle((rule, id), (cost, mark), now_ms, false).await
}

/// Units left for `id` at `now_ms`, by a peek.
async fn left(b: &Backend, rule: &Rule, id: &str, now_ms: Option<u64>) -> u64 {
    b.decide(&[rule], id, 0, now_ms).await.rules[0].remaining
}

fn gcra(burst: u64) -> Rule {
    rules(
        json!([{"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m",
                  "burst": burst, "count_status": [401]}]),
    )
    .remove(0)
}

#[tokio::test]
async fn gcra_gives_back_what_is_still_outstanding() {
    let b = Backend::start();
    let rule = gcra(3);
    let t0 = 1_795_168_800_000;
    let marks = [
        mark(&charge(&b, &rule, "a", Some(t0)).await),
        mark(&charge(&b, &rule, "a", Some(t0)).await),
        mark(&charge(&b, &rule, "a", Some(t0)).await),
    ];
    // Each mark is the TAT its charge left: 60, 120 and 180 s ahead.
    assert_eq!(marks, [1, 2, 3].map(|n| (t0 + n * 60_000) * 1000));
    assert!(!charge(&b, &rule, "a", Some(t0)).await.admitted());
    // The last charge, given back at once, gives back its whole unit.
    assert!(refund(&b, &rule, "a", marks[2], Some(t0 + 100)).await);
    assert_eq!(left(&b, &rule, "a", Some(t0 + 100)).await, 1);
    // The first gives back all but what time has paid off since (100 ms):
    // no refund can tell whose that was, so it stays counted, a little
    // tighter than one charge at t0 alone (59.9 s ahead).
    assert!(refund(&b, &rule, "a", marks[0], Some(t0 + 100)).await);
    assert_eq!(left(&b, &rule, "a", Some(t0 + 100)).await, 2);
    let d = b.decide(&[&rule], "a", 0, Some(t0 + 100)).await;
    assert_eq!(d.rules[0].reset_after_ms, 60_000, "{d:?}");
}

#[tokio::test]
async fn gcra_never_gives_back_below_now_nor_undoes_a_later_charge() {
    let b = Backend::start();
    let rule = gcra(1);
    let t0 = 1_795_168_800_000;
    // A charge half paid off by time gives back only the other half, and
    // the key is then as fresh as one never charged.
    let first = mark(&charge(&b, &rule, "h", Some(t0)).await);
    assert!(refund(&b, &rule, "h", first, Some(t0 + 30_000)).await);
    assert_eq!(b.redis(&["EXISTS", "el:{h}:g"]).trim(), "0");
    assert_eq!(left(&b, &rule, "h", Some(t0 + 30_000)).await, 1);

    // R is charged, fully paid off by time, then S is charged: R's refund
    // must not take S's charge back (a refund of R's whole unit would).
    let r = mark(&charge(&b, &rule, "s", Some(t0)).await);
    let s = charge(&b, &rule, "s", Some(t0 + 70_000)).await;
    assert!(s.admitted());
    assert!(!refund(&b, &rule, "s", r, Some(t0 + 70_500)).await);
    assert!(
        !charge(&b, &rule, "s", Some(t0 + 71_000)).await.admitted(),
        "S still counts"
    );
    // A refund after the key has paid off everything gives nothing back.
    assert!(!refund(&b, &rule, "s", r, Some(t0 + 200_000)).await);
}

#[tokio::test]
async fn gcra_on_redis_clock_gives_a_prompt_refund_back_whole() {
    let b = Backend::start();
    let rule = gcra(2);
    let first = mark(&charge(&b, &rule, "c", None).await);
    let second = mark(&charge(&b, &rule, "c", None).await);
    assert!(!charge(&b, &rule, "c", None).await.admitted());
    assert!(refund(&b, &rule, "c", second, None).await);
    assert!(refund(&b, &rule, "c", first, None).await);
    // What is left is what time has paid off since the first charge: the
    // milliseconds between it and its refund.
    let d = b.decide(&[&rule], "c", 0, None).await;
    assert!(d.rules[0].reset_after_ms <= 50, "{d:?}");
    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    assert_eq!(left(&b, &rule, "c", None).await, 2, "the full burst again");
    // The key expires by itself, as every key the script writes.
    let pttl: i64 = b.redis(&["PTTL", "el:{c}:g"]).trim().parse().unwrap();
    assert!(pttl == -2 || (0..=1).contains(&pttl), "{pttl}");
}

fn windows(spec: serde_json::Value) -> Rule {
    rules(
        json!([{"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": spec,
                  "count_status": [401]}]),
    )
    .remove(0)
}

#[tokio::test]
async fn a_window_gives_back_from_the_bucket_it_counted_in() {
    let b = Backend::start();
    let rule = windows(json!([["1m", 3, "10s"]]));
    let t0 = 1_795_168_800_000;
    // The first charge moves the buckets (into the totals), the next two
    // land in the cost since (the same buckets); each mark is the charge's
    // time on the key's shifted clock.
    let marks = [
        mark(&charge(&b, &rule, "a", Some(t0)).await),
        mark(&charge(&b, &rule, "a", Some(t0 + 10)).await),
        mark(&charge(&b, &rule, "a", Some(t0 + 20)).await),
    ];
    assert_eq!(marks[1] - marks[0], 10, "{marks:?}");
    assert!(!charge(&b, &rule, "a", Some(t0 + 30)).await.admitted());
    assert!(refund(&b, &rule, "a", marks[1], Some(t0 + 40)).await);
    assert_eq!(left(&b, &rule, "a", Some(t0 + 40)).await, 1);
    assert!(refund(&b, &rule, "a", marks[0], Some(t0 + 40)).await);
    assert_eq!(left(&b, &rule, "a", Some(t0 + 40)).await, 2);
    // Two admitted again, then the limit holds.
    assert!(charge(&b, &rule, "a", Some(t0 + 50)).await.admitted());
    assert!(charge(&b, &rule, "a", Some(t0 + 60)).await.admitted());
    assert!(!charge(&b, &rule, "a", Some(t0 + 70)).await.admitted());
}

/// The charge that moved a bucket is counted in its total, those after it
/// in the cost since; a refund takes from the cost since first. Once the
/// move's own refund has taken from it, a later charge's refund finds less
/// there than it charged, and takes the rest from the bucket: every charge
/// goes back whole, in any order (the model test found the rest kept).
#[tokio::test]
async fn charges_in_one_bucket_go_back_whole_in_any_order() {
    let b = Backend::start();
    let rule = windows(json!([["1m", 5, "1m"]]));
    let moved = mark(&charge_of(&b, &rule, "a", 1, Some(T0)).await);
    let after = mark(&charge_of(&b, &rule, "a", 2, Some(T0 + 10)).await);
    assert_eq!(left(&b, &rule, "a", Some(T0 + 20)).await, 2);
    assert!(refund_of(&b, &rule, "a", (1, moved), Some(T0 + 20)).await);
    assert_eq!(left(&b, &rule, "a", Some(T0 + 20)).await, 3);
    assert!(refund_of(&b, &rule, "a", (2, after), Some(T0 + 30)).await);
    assert_eq!(left(&b, &rule, "a", Some(T0 + 30)).await, 5);
    // Nothing more to give back, and the limit holds again.
    assert!(!refund_of(&b, &rule, "a", (2, after), Some(T0 + 40)).await);
    assert!(charge_of(&b, &rule, "a", 5, Some(T0 + 50)).await.admitted());
    assert!(!charge_of(&b, &rule, "a", 1, Some(T0 + 60)).await.admitted());
}

#[tokio::test]
async fn each_window_gives_back_only_while_it_counts_the_bucket() {
    let b = Backend::start();
    let rule = windows(json!([["10s", 2, "1s"], ["1m", 3, "10s"]]));
    let t0 = 1_795_168_800_000
        - edge_limiter::decision::transport::keys::window_offset("el:{m}:w", 60_000);
    // Charged at 0 s and 1.5 s: the second moves the 1 s buckets, so the
    // first lies in an older 1 s bucket and in the newest 10 s one.
    let first = mark(&charge(&b, &rule, "m", Some(t0)).await);
    mark(&charge(&b, &rule, "m", Some(t0 + 1_500)).await);
    assert!(refund(&b, &rule, "m", first, Some(t0 + 2_000)).await);
    let d = b.decide(&[&rule], "m", 0, Some(t0 + 2_000)).await;
    // Peeking reports the binding window: 1 of 2 left in 10 s.
    assert_eq!((d.rules[0].remaining, d.rules[0].window), (1, 1), "{d:?}");
    assert!(charge(&b, &rule, "m", Some(t0 + 2_100)).await.admitted());
    assert!(!charge(&b, &rule, "m", Some(t0 + 2_200)).await.admitted());

    // A charge whose bucket has left every window gives nothing back.
    let old = mark(&charge(&b, &rule, "n", Some(t0)).await);
    // A second charge in the same millisecond sits in the cost since the
    // move the first made; given back, it counts the same.
    let same_ms = mark(&charge(&b, &rule, "n", Some(t0)).await);
    assert_eq!(same_ms, old);
    assert!(refund(&b, &rule, "n", same_ms, Some(t0 + 10)).await);
    assert_eq!(
        left(&b, &rule, "n", Some(t0 + 10)).await,
        1,
        "the 10 s window: one of two"
    );
    let later = t0 + 70_000;
    let before = left(&b, &rule, "n", Some(later)).await;
    assert!(!refund(&b, &rule, "n", old, Some(later)).await);
    assert_eq!(left(&b, &rule, "n", Some(later)).await, before);
}

#[tokio::test]
async fn charges_of_one_millisecond_are_all_given_back() {
    let b = Backend::start();
    let rule = windows(json!([["10s", 3, "1s"], ["1h", 20, "1h"]]));
    let t0 = 1_795_168_800_000;
    // The first moves the buckets, the other two land in the cost since,
    // all three in the same millisecond: one mark for all.
    let mut marks = Vec::new();
    for _ in 0..3 {
        marks.push(mark(&charge(&b, &rule, "t", Some(t0)).await));
    }
    assert!(marks.iter().all(|m| *m == marks[0]));
    for m in &marks {
        assert!(refund(&b, &rule, "t", *m, Some(t0)).await);
    }
    assert_eq!(left(&b, &rule, "t", Some(t0)).await, 3, "all three back");
}

#[tokio::test]
async fn refunds_write_no_key_that_is_gone() {
    let b = Backend::start();
    let rule = windows(json!([["1s", 2, "1s"]]));
    let m = mark(&charge(&b, &rule, "x", None).await);
    b.redis(&["DEL", "el:{x}:w"]);
    assert!(!refund(&b, &rule, "x", m, None).await);
    assert_eq!(
        b.redis(&["EXISTS", "el:{x}:w"]).trim(),
        "0",
        "no key without expiry"
    );
    let g = gcra(2);
    let m = mark(&charge(&b, &g, "y", None).await);
    b.redis(&["DEL", "el:{y}:g"]);
    assert!(!refund(&b, &g, "y", m, None).await);
    assert_eq!(b.redis(&["EXISTS", "el:{y}:g"]).trim(), "0");
}

/// A charge made under a client's override goes back at the override's
/// interval: with the rate raised tenfold, a refund at the configured
/// interval would erase the client's other charges (six here), a bypass of
/// what the rule counts. The reference model agrees, from its own record.
#[tokio::test]
async fn a_charge_goes_back_at_the_interval_it_was_made_at() {
    let b = Backend::start();
    let rule = rules(json!([{"name": "login", "key": ["ip"], "algorithm": "gcra",
        "rate": 1, "period": "1m", "burst": 10, "count_status": [401], "overrides": true}]))
    .remove(0);
    let faster =
        Override::changed(&rule, serde_json::json!({"rate": 10}).as_object().unwrap()).unwrap();
    b.redis(&["SET", "el:{a}:login:o", &faster.to_text()]);
    let mut model = Model::new();
    model.set_override("login", &["a"], Some(&faster.to_text()));
    let check = [(
        Check {
            rule: &rule,
            cost: 1,
        },
        vec!["a"],
    )];
    let (mut real, mut modelled) = (vec![], vec![]);
    for _ in 0..6 {
        real.push(charge(&b, &rule, "a", Some(T0)).await);
        modelled.push(model.decide(&check, T0));
    }
    assert_eq!(real, modelled);
    assert_eq!(real[5].rules[0].remaining, 4);
    let last = &real[5];
    let under = &last.overrides[0].text;
    assert_eq!(under, &faster.to_text());
    let key = redis_key(&check[0].0.rule.name, &["a"]);
    let given = |under| RefundCharge {
        check: check[0].0,
        id: vec!["a"],
        key: &key,
        mark: mark(last),
        under,
    };
    let call = ScriptCall::refund(&[given(under.as_str())], Some(T0));
    let back = run(&b.client, &call, BUDGET).await.expect("a refund");
    assert_eq!(back, Reply::Refunded(vec![true]));
    assert_eq!(model.refund(&[given("")], T0), [true]);
    // One unit back, not the six charged at a tenth of the configured interval.
    assert_eq!(left(&b, &rule, "a", Some(T0)).await, 5);
    assert_eq!(
        model
            .decide(
                &[(
                    Check {
                        rule: &rule,
                        cost: 0
                    },
                    vec!["a"]
                )],
                T0
            )
            .rules[0]
            .remaining,
        5
    );
}

/// The same for windows: a charge made under a client's raised limits
/// goes back into the windows it was counted in, and the client then
/// stands where the model says, on Redis's clock as on a pinned one.
#[tokio::test]
async fn a_window_charge_goes_back_under_its_override() {
    let b = Backend::start();
    let rule = rules(
        json!([{"name": "pages", "key": ["ip"], "algorithm": "windowed",
        "windows": [["1m", 4, "1s"], ["1h", 40, "1m"]], "count_status": [401],
        "overrides": true}]),
    )
    .remove(0);
    let raised = Override::changed(
        &rule,
        serde_json::json!({"limits": [8, 80]}).as_object().unwrap(),
    )
    .unwrap();
    let text = raised.to_text();
    for (id, now_ms) in [("pinned", Some(T0)), ("live", None)] {
        b.redis(&["SET", &format!("el:{{{id}}}:pages:o"), &text]);
        let mut model = Model::new();
        model.set_override("pages", &[id], Some(&text));
        let check = [(
            Check {
                rule: &rule,
                cost: 1,
            },
            vec![id],
        )];
        let mut last = None;
        for _ in 0..6 {
            let d = charge(&b, &rule, id, now_ms).await;
            assert!(d.admitted(), "{id}: under the raised limit of 8: {d:?}");
            if now_ms.is_some() {
                assert_eq!(d, model.decide(&check, T0));
            }
            last = Some(d);
        }
        let last = last.unwrap();
        let key = redis_key(&check[0].0.rule.name, &[id]);
        let given = RefundCharge {
            check: check[0].0,
            id: vec![id],
            key: &key,
            mark: mark(&last),
            under: &text,
        };
        let call = ScriptCall::refund(std::slice::from_ref(&given), now_ms);
        let back = run(&b.client, &call, BUDGET).await.expect("a refund");
        assert_eq!(back, Reply::Refunded(vec![true]), "{id}");
        // Six charged, one given back: 3 of 8 left in the minute.
        assert_eq!(left(&b, &rule, id, now_ms).await, 3, "{id}");
        if now_ms.is_some() {
            assert_eq!(model.refund(&[given], T0), [true]);
            let peek = [(
                Check {
                    rule: &rule,
                    cost: 0,
                },
                vec![id],
            )];
            assert_eq!(model.decide(&peek, T0).rules[0].remaining, 3);
        }
    }
}
