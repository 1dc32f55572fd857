//! Overrides on the script's side (issue 25), against a real
//! `redis-server` through the REST endpoint: a client's override key read in
//! the decision's own call, the rule-wide text the isolate passes, blocks,
//! and keys that hold anything else.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use edge_limiter::{
    decision::{
        outcomes::verdict::{Decision, OverrideSource, Retry},
        transport::keys::override_key,
        transport::protocol::{read_rule_wide, run, Check, Reply, ScriptCall, WideRead, LIMITER},
    },
    rules::{
        overrides::{Override, BLOCK_TEXT, MAX_TEXT_BYTES},
        policy::Policy,
        rule::Rule,
    },
};
use serde_json::{json, Value};
use support::{rules, Backend, BUDGET};

const T0: u64 = 1_795_168_800_000;

/// One unit for `id` at `now_ms`, with `wide` as the rule-wide override's
/// text and ms left.
async fn decide(
    b: &Backend,
    rule: &Rule,
    id: &str,
    wide: Option<(&str, i64)>,
    now_ms: u64,
) -> Decision {
    let mut call = ScriptCall::decide(&[(Check { rule, cost: 1 }, vec![id])], Some(now_ms));
    if let (ScriptCall::Decide(g), Some((text, ms))) = (&mut call, wide) {
        g.overrides[0].wide = text.to_owned();
        g.overrides[0].wide_ms = ms;
    }
    run(&b.client, &call, BUDGET)
        .await
        .and_then(Reply::decision)
        .expect("a decision")
}

fn admitted(ds: &[Decision]) -> Vec<bool> {
    ds.iter().map(Decision::admitted).collect()
}

fn gcra() -> Rule {
    rules(
        json!([{"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m",
        "burst": 2, "overrides": true}]),
    )
    .remove(0)
}

async fn run_of(
    b: &Backend,
    rule: &Rule,
    id: &str,
    n: usize,
    wide: Option<(&str, i64)>,
) -> Vec<Decision> {
    let mut out = vec![];
    for _ in 0..n {
        out.push(decide(b, rule, id, wide, T0).await);
    }
    out
}

#[tokio::test]
async fn a_clients_override_replaces_the_figures_for_that_client() {
    let b = Backend::start();
    let rule = gcra();
    let more =
        Override::changed(&rule, serde_json::json!({"burst": 4}).as_object().unwrap()).unwrap();
    b.redis(&["SET", "el:{a}:g:o", &more.to_text()]);
    let a = run_of(&b, &rule, "a", 5, None).await;
    assert_eq!(admitted(&a), [true, true, true, true, false]);
    assert_eq!(a[0].rules[0].limit, 4);
    assert_eq!(a[0].overrides[0].source, OverrideSource::Client);
    assert_eq!(a[0].overrides[0].text, more.to_text());
    let other = run_of(&b, &rule, "b", 3, None).await;
    assert_eq!(admitted(&other), [true, true, false]);
    assert_eq!(other[0].overrides[0].source, OverrideSource::None);
}

#[tokio::test]
async fn a_block_denies_for_its_time_left_or_for_ever() {
    let b = Backend::start();
    let rule = gcra();
    b.redis(&["SET", "el:{a}:g:o", "v1 block", "PX", "30000"]);
    let d = decide(&b, &rule, "a", None, T0).await;
    assert!(!d.admitted());
    let Some(Retry::After { ms }) = d.retry() else {
        panic!("{d:?}")
    };
    assert!((29_000..=30_000).contains(&ms), "{ms}");
    // Nothing was charged, and no penalty or state was written.
    assert_eq!(b.redis(&["EXISTS", "el:{a}:g"]), "0");
    b.redis(&["SET", "el:{a}:g:o", "v1 block"]);
    let d = decide(&b, &rule, "a", None, T0).await;
    assert_eq!(d.retry(), Some(Retry::Never));
}

#[tokio::test]
async fn the_rule_wide_override_holds_where_a_client_has_none() {
    let b = Backend::start();
    let rule = gcra();
    let wide = Override::changed(&rule, serde_json::json!({"burst": 3}).as_object().unwrap())
        .unwrap()
        .to_text();
    let a = run_of(&b, &rule, "a", 4, Some((&wide, -1))).await;
    assert_eq!(admitted(&a), [true, true, true, false]);
    assert_eq!(a[0].overrides[0].source, OverrideSource::Rule);
    // A client's own goes first: a block beats the rule's figures.
    b.redis(&["SET", &override_key("el:{c}:g"), "v1 block"]);
    let c = decide(&b, &rule, "c", Some((&wide, -1)), T0).await;
    assert!(!c.admitted());
    assert_eq!(c.overrides[0].source, OverrideSource::Client);
    // A rule-wide block for 5 s.
    let d = decide(&b, &rule, "d", Some((BLOCK_TEXT, 5000)), T0).await;
    assert_eq!(d.retry(), Some(Retry::After { ms: 5000 }));
}

#[tokio::test]
async fn a_window_rules_override_sets_each_limit() {
    let b = Backend::start();
    let rule = rules(json!([{"name": "w", "key": ["ip"], "algorithm": "windowed",
        "windows": [["1m", 2, "1m"], ["1h", 100, "1h"]], "overrides": true}]))
    .remove(0);
    let more = Override::changed(
        &rule,
        serde_json::json!({"limits": [4, 100]}).as_object().unwrap(),
    )
    .unwrap();
    b.redis(&["SET", "el:{a}:w:o", &more.to_text()]);
    let a = run_of(&b, &rule, "a", 5, None).await;
    assert_eq!(admitted(&a), [true, true, true, true, false]);
    // Removed, the configured limit of 2 holds at once: 4 already counted.
    b.redis(&["DEL", "el:{a}:w:o"]);
    assert!(!decide(&b, &rule, "a", None, T0).await.admitted());
}

/// A windowed override names its windows (issue 31): after a redeploy
/// that changes a duration but not the number of windows, an override
/// written for the old windows is none, noted, in a client's key and as
/// the rule-wide text, and never sets limits on other windows.
#[tokio::test]
async fn a_window_override_holds_only_for_the_windows_it_names() {
    let b = Backend::start();
    let windowed = |windows: Value| {
        rules(json!([{"name": "w", "key": ["ip"], "algorithm": "windowed",
            "windows": windows, "overrides": true}]))
        .remove(0)
    };
    let before = windowed(json!([["1m", 2, "1m"], ["1h", 100, "1h"]]));
    let after = windowed(json!([["1m", 2, "1m"], ["1d", 100, "1h"]]));
    let raised = Override::changed(
        &before,
        serde_json::json!({"limits": [4, 100]}).as_object().unwrap(),
    )
    .unwrap()
    .to_text();
    // Under the windows it names, it holds.
    b.redis(&["SET", "el:{a}:w:o", &raised]);
    let a = run_of(&b, &before, "a", 5, None).await;
    assert_eq!(admitted(&a), [true, true, true, true, false]);
    // Under the redeployed rule, the configured limit of 2.
    b.redis(&["SET", "el:{c}:w:o", &raised]);
    let client = run_of(&b, &after, "c", 3, None).await;
    assert_eq!(admitted(&client), [true, true, false]);
    assert!(client[0].overrides[0].ignored);
    let wide = run_of(&b, &after, "d", 3, Some((&raised, -1))).await;
    assert_eq!(admitted(&wide), [true, true, false]);
    assert_eq!(wide[0].overrides[0].source, OverrideSource::None);
}

#[tokio::test]
async fn anything_else_in_an_override_key_is_no_override() {
    let b = Backend::start();
    let rule = gcra();
    for junk in [
        "v1 gcra 1 60000 200 1",
        "v1 gcra 1 60000 0200 60000000",
        "v1 windows 5",
        "v1 gcra 1 60000 200 60000000 1",
        "v2 block",
        "block",
        "",
    ] {
        b.redis(&["SET", "el:{j}:g:o", junk]);
        b.redis(&["DEL", "el:{j}:g"]);
        let j = run_of(&b, &rule, "j", 3, None).await;
        assert_eq!(admitted(&j), [true, true, false], "{junk:?}");
        assert!(j[0].overrides[0].ignored, "{junk:?}");
        assert_eq!(j[0].overrides[0].source, OverrideSource::None);
    }
    // A hash where text was expected: an error from GET, not a decision.
    b.redis(&["DEL", "el:{h}:g:o"]);
    b.redis(&["HSET", "el:{h}:g:o", "x", "1"]);
    let h = run_of(&b, &rule, "h", 3, None).await;
    assert_eq!(
        admitted(&h),
        [true, true, false],
        "a wrong type counts as none"
    );
    assert!(h[0].overrides[0].ignored);
}

/// No stored value makes the script fail (issue 31): `v1 block` and 8 000
/// numbers, more results than Lua's `unpack` returns, counts as none in a
/// client's key, on the general path and the lone rule's, and as the
/// rule-wide text, where the configured figures then hold.
#[tokio::test]
async fn an_override_of_any_length_counts_as_none() {
    let b = Backend::start();
    let rule = gcra();
    let huge = format!("{BLOCK_TEXT}{}", " 1".repeat(8000));
    b.redis(&["SET", "el:{big}:g:o", &huge]);
    let general = run_of(&b, &rule, "big", 3, None).await;
    assert_eq!(admitted(&general), [true, true, false]);
    assert_eq!(general[0].overrides[0].source, OverrideSource::None);
    assert!(general[0].overrides[0].ignored);
    b.redis(&["DEL", "el:{big}:g"]);
    let mut lone = vec![];
    for _ in 0..3 {
        lone.push(b.decide(&[&rule], "big", 1, None).await);
    }
    assert_eq!(admitted(&lone), [true, true, false]);
    assert!(lone[0].overrides[0].ignored);
    let wide = run_of(&b, &rule, "w", 3, Some((&huge, -1))).await;
    assert_eq!(admitted(&wide), [true, true, false]);
    assert_eq!(wide[0].overrides[0].source, OverrideSource::None);
    assert_eq!(wide[0].rules[0].limit, 2);
}

/// The rule-wide read: each key's text and time to live, none for a
/// missing key, a hash as no text, and no more of a long value than it
/// takes to know it is no override.
#[tokio::test]
async fn a_rule_wide_read_returns_each_keys_text_and_time_to_live() {
    let b = Backend::start();
    b.redis(&["SET", "el:rule:g:o", "v1 block", "PX", "30000"]);
    b.redis(&["HSET", "el:rule:h:o", "x", "1"]);
    b.redis(&["SET", "el:rule:long:o", &"v1 block".repeat(1000)]);
    let keys = ["g", "none", "h", "long"].map(|r| format!("el:rule:{r}:o"));
    let read = read_rule_wide(&b.client, &keys, BUDGET).await.unwrap();
    let WideRead::Text(text, ms) = &read[0] else {
        panic!("{read:?}")
    };
    assert_eq!(text, "v1 block");
    assert!((29_000..=30_000).contains(ms), "{read:?}");
    assert_eq!(read[1], WideRead::Text(String::new(), -1));
    assert_eq!(read[2], WideRead::NotText);
    let WideRead::Text(long, -1) = &read[3] else {
        panic!("{read:?}")
    };
    assert_eq!(long.len(), MAX_TEXT_BYTES + 1);
}

/// A lone rule on Redis's clock keeps its one-rule path, one integer for
/// GCRA, while its client has no override; with one, the same call answers
/// as the general decision under it, and garbage counts as none.
#[tokio::test]
async fn a_lone_rule_reads_its_clients_override_on_its_own_path() {
    let b = Backend::start();
    let windows = rules(json!([{"name": "w", "key": ["ip"], "algorithm": "windowed",
        "windows": [["1m", 2, "1s"]], "overrides": true}]))
    .remove(0);
    for rule in [gcra(), windows] {
        let check = [(
            Check {
                rule: &rule,
                cost: 1,
            },
            vec!["a"],
        )];
        let call = ScriptCall::decide(&check, None);
        let ScriptCall::OneRule(one) = &call else {
            panic!("{call:?} is no one-rule call");
        };
        assert_eq!(
            call.keys(),
            [one.rule.key.clone(), override_key(&one.rule.key)]
        );
        let raw = b
            .client
            .run_script(&LIMITER, &call.keys(), &call.args(), BUDGET)
            .await
            .unwrap();
        assert!(raw.is_i64(), "{}: {raw}", rule.name);
        let decide = || async {
            run(&b.client, &call, BUDGET)
                .await
                .and_then(Reply::decision)
                .unwrap()
        };
        let plain = decide().await;
        assert_eq!(plain.overrides[0].source, OverrideSource::None);
        assert_eq!(plain.rules[0].limit, 2);

        let more = match &rule.policy {
            Policy::Concurrency(_) => Override::changed(
                &rule,
                serde_json::json!({"limits": [5]}).as_object().unwrap(),
            ),
            Policy::Windowed(ws) => Override::changed(
                &rule,
                serde_json::json!({"limits": vec![5; ws.len()]})
                    .as_object()
                    .unwrap(),
            ),
            Policy::Gcra(_) => {
                Override::changed(&rule, serde_json::json!({"burst": 5}).as_object().unwrap())
            }
        }
        .unwrap();
        b.redis(&["SET", &override_key(&one.rule.key), &more.to_text()]);
        let raised = decide().await;
        assert!(raised.admitted(), "{}: {raised:?}", rule.name);
        assert_eq!(raised.rules[0].limit, 5);
        assert_eq!(raised.overrides[0].source, OverrideSource::Client);
        assert_eq!(raised.overrides[0].text, more.to_text());

        b.redis(&["SET", &override_key(&one.rule.key), "v1 gcra 0"]);
        let junk = decide().await;
        assert!(!junk.admitted(), "{}: {junk:?}", rule.name);
        assert_eq!(junk.rules[0].limit, 2);
        assert!(junk.overrides[0].ignored);
        // A hash where text was expected: none, noted, on this path too.
        b.redis(&["DEL", &override_key(&one.rule.key), &one.rule.key]);
        b.redis(&["HSET", &override_key(&one.rule.key), "f", "1"]);
        let hash = decide().await;
        assert!(hash.admitted(), "{}: {hash:?}", rule.name);
        assert_eq!(hash.rules[0].limit, 2);
        assert_eq!(hash.overrides[0].source, OverrideSource::None);
        assert!(hash.overrides[0].ignored);
    }
}
