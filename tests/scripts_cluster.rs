//! The script on Redis Cluster (issue 25: overrides read in the decision's
//! own call keep a cluster working). A one-node cluster holding every slot
//! refuses, as any cluster does, a script whose keys lie in more than one
//! slot. Every call the worker makes for one client runs there: its rules
//! keyed on the same identifier, with a penalty, a lease, a refund and its
//! override keys, a lone rule with its override key, and a reset. Rules
//! keyed on different identifiers do not, as the cluster section of
//! docs/how-it-works.md says: the check is real. The rule-wide overrides, one key per rule in
//! no client's slot, are read too.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::cell::RefCell;

use edge_limiter::{
    decision::{
        limiter::Limiter,
        memory::block_cache::BlockCache,
        memory::in_flight::InFlight,
        memory::leases::Leases,
        memory::rule_wide::{RuleWide, REREAD_MS},
        outcomes::events::Action,
        runtime::TokioPause,
        transport::keys::{override_key, redis_key, rule_wide_key},
        transport::protocol::{run, Check, LeaseAsk, RefundCharge, Reply, ScriptCall},
    },
    rules::{config::Config, overrides::Override, rule::Rule},
};
use serde_json::json;
use support::{rules, Backend, BUDGET};

async fn answered(b: &Backend, call: &ScriptCall) -> Reply {
    run(&b.client, call, BUDGET)
        .await
        .unwrap_or_else(|e| panic!("{call:?}: {e}"))
}

fn unit<'a>(rule: &'a Rule, id: &'a str) -> (Check<'a>, Vec<&'a str>) {
    (Check { rule, cost: 1 }, vec![id])
}

#[tokio::test]
async fn every_call_for_one_client_runs_on_a_cluster() {
    let b = Backend::start_cluster();
    let r = rules(json!([
        {"name": "g", "key": ["header:x-api-key"], "algorithm": "gcra", "rate": 10,
         "period": "1s", "burst": 20, "overrides": true, "penalty": "1m", "lease": 4},
        {"name": "w", "key": ["header:x-api-key"], "algorithm": "windowed",
         "windows": [["1s", 10, "100ms"], ["1m", 100, "1s"]], "overrides": true,
         "count_status": [401]},
        {"name": "per-ip", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1s"},
        {"name": "lone", "key": ["header:x-api-key"], "algorithm": "gcra", "rate": 1,
         "period": "1s", "overrides": true}
    ]));
    let raised = Override::changed(
        &r[1],
        serde_json::json!({"limits": [20, 200]})
            .as_object()
            .unwrap(),
    )
    .unwrap();
    b.redis(&[
        "SET",
        &override_key(&redis_key("w", &["k-1"])),
        &raised.to_text(),
    ]);

    // Both rules of the client, a lease asked for, the override keys read.
    let both = [unit(&r[0], "k-1"), unit(&r[1], "k-1")];
    let lease = LeaseAsk {
        rule: 0,
        units: 2,
        for_ms: 100,
    };
    let call = ScriptCall::decide_leasing(&both, vec![lease], None);
    let decision = answered(&b, &call).await.decision().unwrap();
    assert!(decision.admitted(), "{decision:?}");
    assert_eq!(decision.rules[1].limit, 20, "the client's override applied");
    // Its refund, under the override it was charged under.
    let [(1, mark)] = decision.refund_marks[..] else {
        panic!("one refund mark: {decision:?}");
    };
    let text = raised.to_text();
    let key = redis_key(&both[1].0.rule.name, &["k-1"]);
    let charge = RefundCharge {
        check: both[1].0,
        id: vec!["k-1"],
        key: &key,
        mark,
        under: &text,
    };
    let refund = ScriptCall::refund(&[charge], None);
    assert_eq!(answered(&b, &refund).await, Reply::Refunded(vec![true]));
    // A lone rule with its override key; a reset.
    let lone = ScriptCall::decide(&[unit(&r[3], "k-1")], None);
    assert!(matches!(&lone, ScriptCall::OneRule(o) if o.override_key.is_some()));
    assert!(answered(&b, &lone).await.decision().unwrap().admitted());
    b.redis(&[
        "SET",
        &override_key(&redis_key("lone", &["k-1"])),
        "v1 block",
    ]);
    assert!(!answered(&b, &lone).await.decision().unwrap().admitted());
    let reset = ScriptCall::reset(&[(&r[0], vec!["k-1"]), (&r[1], vec!["k-1"])]);
    assert!(matches!(answered(&b, &reset).await, Reply::Removed(n) if n >= 2));

    // Keyed on two identifiers: two slots, which the cluster refuses.
    let two = ScriptCall::decide(&[unit(&r[0], "k-1"), unit(&r[2], "198.51.100.7")], None);
    let refused = run(&b.client, &two, BUDGET).await.unwrap_err().to_string();
    assert!(refused.contains("CROSSSLOT"), "{refused}");
}

/// The isolate's read of the rule-wide overrides runs on a cluster (issue
/// 31): two rules' keys lie in two slots (`el:rule:g:o` in 4576,
/// `el:rule:w:o` in 4739), and each is read on its own. A key of another
/// type counts as none, logged, and the other rule's is read all the same.
#[tokio::test]
async fn the_rule_wide_read_runs_on_a_cluster_and_takes_a_wrong_type_as_none() {
    let b = Backend::start_cluster();
    let config = Config::from_json(&json!({"rules": [
        {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s",
         "burst": 20, "overrides": true},
        {"name": "w", "key": ["ip"], "algorithm": "windowed",
         "windows": [["1s", 10, "100ms"], ["1m", 100, "1s"]], "overrides": true}
    ]}))
    .unwrap();
    let [g, w] = [&config.rules[0], &config.rules[1]];
    let raised = Override::changed(g, serde_json::json!({"burst": 40}).as_object().unwrap())
        .unwrap()
        .to_text();
    let lowered = Override::changed(
        w,
        serde_json::json!({"limits": [5, 50]}).as_object().unwrap(),
    )
    .unwrap()
    .to_text();
    b.redis(&["SET", &rule_wide_key("g"), &raised, "PX", "60000"]);
    b.redis(&["SET", &rule_wide_key("w"), &lowered]);
    let wide = RefCell::new(RuleWide::new());
    let limiter = Limiter {
        config: &config,
        store: &b.client,
        cache: &RefCell::new(BlockCache::new(1000)),
        leases: &RefCell::new(Leases::new()),
        wide: &wide,
        in_flight: &InFlight::new(TokioPause(|| 0)),
        pinned: false,
        home: None,
    };
    let names = ["g".to_owned(), "w".to_owned()];
    for name in &names {
        assert!(wide.borrow_mut().start_read(name, 0));
    }
    let events = limiter.reread(&names, 0).await;
    assert!(events.is_empty(), "{events:?}");
    let held = |rule: &str| wide.borrow().in_force(rule, 1).map(|(text, _)| text);
    assert_eq!(held("g"), Some(raised.clone()));
    assert_eq!(held("w"), Some(lowered));

    // A hash in `w`'s key: none there, noted; `g`'s read all the same.
    b.redis(&["DEL", &rule_wide_key("w")]);
    b.redis(&["HSET", &rule_wide_key("w"), "x", "1"]);
    for name in &names {
        assert!(wide.borrow_mut().start_read(name, REREAD_MS));
    }
    let events = limiter.reread(&names, REREAD_MS).await;
    assert_eq!(held("g"), Some(raised));
    assert_eq!(held("w"), None);
    let [ignored] = &events[..] else {
        panic!("one event: {events:?}");
    };
    assert_eq!(ignored.action, Action::OverrideIgnored);
    assert_eq!(ignored.key.as_deref(), Some("el:rule:w:o"));
}
