//! The classic Redis rate-limiter defects, one test each, against the real
//! script on a real redis-server through the REST endpoint.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::sync::Arc;

use edge_limiter::decision::{
    outcomes::verdict::{Decision, Retry},
    transport::protocol::{Check, Reply, ScriptCall, LIMITER},
};
use edge_limiter_local::testenv::redis_call;
use serde_json::json;
use support::{rules, Backend, BUDGET};

fn gcra_and_windowed() -> Vec<edge_limiter::rules::rule::Rule> {
    rules(json!([
        {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1m", "burst": 5},
        {"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 3, "100ms"], ["1m", 6, "1s"], ["1h", 50, "1m"]]}
    ]))
}

fn all_keys(b: &Backend) -> Vec<String> {
    b.redis(&["KEYS", "*"])
        .lines()
        .map(str::to_owned)
        .filter(|k| !k.is_empty())
        .collect()
}

fn pttl(b: &Backend, key: &str) -> i64 {
    b.redis(&["PTTL", key]).parse().unwrap()
}

#[tokio::test]
async fn lost_expire_and_keys_without_ttl_cannot_happen() {
    // The expiry is written in the same atomic script as the state, so no
    // crash between two round trips can leave a key without one.
    let b = Backend::start();
    let rs = gcra_and_windowed();
    for i in 0..40 {
        let id = format!("client-{}", i % 7);
        b.decide(&[&rs[0], &rs[1]], &id, 1 + i % 2, None).await;
        b.decide(&[&rs[i as usize % 2]], &id, 1, None).await;
        for key in all_keys(&b) {
            let ttl = pttl(&b, &key);
            // Never -1 (no expiry); never longer than the longest window (1 h).
            assert!(
                ttl > 0 && ttl <= 3_600_000,
                "{key} has PTTL {ttl} after step {i}"
            );
        }
    }
    assert!(!all_keys(&b).is_empty());
}

#[tokio::test]
async fn a_flood_of_denied_requests_grows_nothing() {
    let b = Backend::start();
    let rs = gcra_and_windowed();
    // One instant throughout: nothing frees up while the flood runs, however
    // slowly the machine serves it.
    const T: u64 = 1_800_000_000_000;
    while b
        .decide(&[&rs[0], &rs[1]], "flooder", 1, Some(T))
        .await
        .admitted()
    {}
    let keys = all_keys(&b);
    let hlen = b.redis(&["HLEN", "el:{flooder}:w"]);
    let memory = |b: &Backend| b.redis(&["MEMORY", "USAGE", "el:{flooder}:w"]);
    let before = (b.redis(&["GET", "el:{flooder}:g"]), memory(&b));
    for _ in 0..500 {
        assert!(!b
            .decide(&[&rs[0], &rs[1]], "flooder", 1, Some(T))
            .await
            .admitted());
    }
    assert_eq!(all_keys(&b), keys);
    assert_eq!(b.redis(&["HLEN", "el:{flooder}:w"]), hlen);
    assert_eq!((b.redis(&["GET", "el:{flooder}:g"]), memory(&b)), before);
    // Clients that can never be admitted (cost above every limit) write nothing at all.
    for i in 0..200 {
        let d = b
            .decide(&[&rs[0], &rs[1]], &format!("new-{i}"), 99, None)
            .await;
        assert!(!d.admitted());
        assert_eq!(
            d.retry(),
            Some(Retry::Never),
            "never: the cost exceeds the limit"
        );
    }
    assert_eq!(all_keys(&b), keys);
}

#[tokio::test]
async fn denied_requests_never_extend_the_expiry_into_a_lockout() {
    let b = Backend::start();
    let rs = gcra_and_windowed();
    // GCRA on an explicit clock: hammer every millisecond while denied.
    let t0 = 1_800_000_000_000;
    for _ in 0..5 {
        assert!(b.decide(&[&rs[0]], "hammer", 1, Some(t0)).await.admitted());
    }
    let denied = b.decide(&[&rs[0]], "hammer", 1, Some(t0)).await;
    let retry = denied.wait_ms().unwrap();
    assert_eq!(retry, 6000, "one unit per 6 s");
    let ttl = pttl(&b, "el:{hammer}:g");
    for t in (0..retry).step_by(97) {
        assert!(!b
            .decide(&[&rs[0]], "hammer", 1, Some(t0 + t))
            .await
            .admitted());
        assert!(
            pttl(&b, "el:{hammer}:g") <= ttl,
            "a denial extended the expiry"
        );
    }
    assert!(
        b.decide(&[&rs[0]], "hammer", 1, Some(t0 + retry))
            .await
            .admitted(),
        "admitted at retry-after despite the hammering"
    );

    // Windowed: same, across the bucket edges of all three windows.
    let t1 = t0 + 10_000_000;
    let mut now = t1;
    while b.decide(&[&rs[1]], "hammer", 1, Some(now)).await.admitted() {
        now += 50;
    }
    let denied = b.decide(&[&rs[1]], "hammer", 1, Some(now)).await;
    let free_at = now + denied.wait_ms().unwrap();
    let ttl = pttl(&b, "el:{hammer}:w");
    while now < free_at {
        assert!(!b.decide(&[&rs[1]], "hammer", 1, Some(now)).await.admitted());
        assert!(pttl(&b, "el:{hammer}:w") <= ttl);
        now += 7;
    }
    assert!(b
        .decide(&[&rs[1]], "hammer", 1, Some(free_at))
        .await
        .admitted());
}

/// 64 clients at once, each one request through the REST endpoint.
async fn concurrent_admissions(
    b: &Backend,
    rule_set: &[edge_limiter::rules::rule::Rule],
    id: &str,
) -> (usize, Vec<Decision>) {
    let b_client = Arc::new(b.client.clone());
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let client = b_client.clone();
        let checks: Vec<_> = rule_set
            .iter()
            .map(|r| (Check { rule: r, cost: 1 }, vec![id]))
            .collect();
        let call = ScriptCall::decide(&checks, None);
        tasks.push(tokio::spawn(async move {
            let reply = client
                .run_script(&LIMITER, &call.keys(), &call.args(), BUDGET)
                .await
                .expect("script call");
            call.decode(&reply).and_then(Reply::decision).unwrap()
        }));
    }
    let mut decisions = Vec::new();
    for t in tasks {
        decisions.push(t.await.unwrap());
    }
    (decisions.iter().filter(|d| d.admitted()).count(), decisions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_then_act_races_admit_exactly_the_limit() {
    let b = Backend::start();
    let gcra = rules(
        json!([{"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 20, "period": "1h", "burst": 20}]),
    );
    assert_eq!(concurrent_admissions(&b, &gcra, "race").await.0, 20);
    let windowed = rules(
        json!([{"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [["1h", 20, "1m"], ["1d", 100, "1h"]]}]),
    );
    assert_eq!(concurrent_admissions(&b, &windowed, "race").await.0, 20);
    // Several rules at once: the tighter one binds, and the looser one is
    // charged for exactly the admitted requests, not the denied ones.
    let both = rules(json!([
        {"name": "g2", "key": ["ip"], "algorithm": "gcra", "rate": 30, "period": "1h", "burst": 30},
        {"name": "w2", "key": ["ip"], "algorithm": "windowed", "windows": [["1h", 20, "1m"]]}
    ]));
    let (admitted, _) = concurrent_admissions(&b, &both, "race").await;
    assert_eq!(admitted, 20);
    let peek = b.decide(&[&both[0]], "race", 0, None).await;
    assert_eq!(peek.rules[0].remaining, 10);
}

#[tokio::test]
async fn fixed_windows_do_not_reset_every_client_at_once() {
    let b = Backend::start();
    let fixed = rules(
        json!([{"name": "f", "key": ["ip"], "algorithm": "windowed", "windows": [["1m", 10, "1m"]]}]),
    );
    let mut resets = std::collections::BTreeSet::new();
    for i in 0..100 {
        let d = b
            .decide(
                &[&fixed[0]],
                &format!("198.51.100.{i}"),
                1,
                Some(1_800_000_000_000),
            )
            .await;
        resets.insert(d.rules[0].reset_after_ms);
    }
    // Each client's window is offset by its key: resets spread over the minute.
    assert!(
        resets.len() > 90,
        "only {} distinct reset instants among 100 clients",
        resets.len()
    );
    assert!(*resets.last().unwrap() - *resets.first().unwrap() > 50_000);
}

#[tokio::test]
async fn a_script_flush_mid_run_loses_nothing() {
    let b = Backend::start();
    let rs = gcra_and_windowed();
    let mut admitted = 0;
    for i in 0..12 {
        if i % 4 == 2 {
            b.redis(&["SCRIPT", "FLUSH"]);
        }
        if b.decide(&[&rs[0], &rs[1]], "flush", 1, Some(1_800_000_000_000))
            .await
            .admitted()
        {
            admitted += 1;
        }
    }
    // The 1 s window allows 3; every flush was recovered through EVAL.
    assert_eq!(admitted, 3);
}

#[tokio::test]
async fn cost_zero_peeks_without_writing_and_reset_forgets() {
    let b = Backend::start();
    let rs = gcra_and_windowed();
    let peek = b.decide(&[&rs[0], &rs[1]], "peek", 0, None).await;
    assert!(peek.admitted());
    assert_eq!((peek.rules[0].remaining, peek.rules[1].remaining), (5, 3));
    assert!(all_keys(&b).is_empty(), "a peek wrote {:?}", all_keys(&b));
    b.decide(&[&rs[0], &rs[1]], "peek", 2, None).await;
    let state = (
        b.redis(&["GET", "el:{peek}:g"]),
        b.redis(&["HGETALL", "el:{peek}:w"]),
    );
    let ttl = pttl(&b, "el:{peek}:w");
    let peek = b.decide(&[&rs[0], &rs[1]], "peek", 0, None).await;
    assert_eq!((peek.rules[0].remaining, peek.rules[1].remaining), (3, 1));
    assert_eq!(
        (
            b.redis(&["GET", "el:{peek}:g"]),
            b.redis(&["HGETALL", "el:{peek}:w"])
        ),
        state
    );
    assert!(pttl(&b, "el:{peek}:w") <= ttl);

    let reset = ScriptCall::reset(&[(&rs[0], vec!["peek"]), (&rs[1], vec!["peek"])]);
    let deleted = b
        .client
        .run_script(&LIMITER, &reset.keys(), &reset.args(), BUDGET)
        .await
        .unwrap();
    assert_eq!(deleted, json!(2));
    assert!(all_keys(&b).is_empty());
    let fresh = b.decide(&[&rs[0], &rs[1]], "peek", 0, None).await;
    assert_eq!((fresh.rules[0].remaining, fresh.rules[1].remaining), (5, 3));
}

#[tokio::test]
async fn edges_with_skewed_clocks_agree_because_redis_keeps_time() {
    // The worker never sends its own clock: the script reads Redis's (a
    // key's PTTL, or TIME), so two edge locations minutes apart in local
    // time see one timeline.
    let b = Backend::start();
    let rs = gcra_and_windowed();
    let checks = vec![(
        Check {
            rule: &rs[0],
            cost: 1,
        },
        vec!["skew"],
    )];
    let call = ScriptCall::decide(&checks, None);
    assert_eq!(
        call.args(),
        ["gcra", "1", "6000000", "5", "0"],
        "no clock is sent"
    );
    b.decide(&[&rs[0]], "skew", 1, None).await;
    // The TAT is the key's expiry, kept by Redis: one interval (6 s) ahead
    // of Redis's now, give or take the milliseconds between the two calls.
    let ahead = pttl(&b, "el:{skew}:g");
    assert!(
        (5_900..=6_000).contains(&ahead),
        "TAT is {ahead} ms ahead of Redis's clock"
    );
    assert_eq!(
        b.redis(&["GET", "el:{skew}:g"]),
        "",
        "a whole-millisecond interval needs nothing stored beside the expiry"
    );
    // The windowed rule reads Redis's TIME for a fresh key: the time it
    // stored as its last admission's (`t`, shifted by the key's offset) is
    // Redis's, and so is the key's expiry (`e`, as PTTL then tells).
    assert!(b.decide(&[&rs[1]], "skew", 1, None).await.admitted());
    let time = b.redis(&["TIME"]);
    let mut parts = time.lines().map(|l| l.parse::<u64>().unwrap());
    let redis_now_ms = parts.next().unwrap() * 1000 + parts.next().unwrap() / 1000;
    let offset = edge_limiter::decision::transport::keys::window_offset("el:{skew}:w", 3_600_000);
    let field = |name: &str| -> u64 { b.redis(&["HGET", "el:{skew}:w", name]).parse().unwrap() };
    let stored = field("t");
    assert!(
        (redis_now_ms + offset).abs_diff(stored) <= 20,
        "admitted at {stored} (shifted), Redis's clock says {}",
        redis_now_ms + offset
    );
    let expires = b
        .redis(&["PEXPIRETIME", "el:{skew}:w"])
        .parse::<u64>()
        .unwrap();
    assert_eq!(
        expires + offset,
        field("e"),
        "the expiry is where the hash says"
    );
}

#[tokio::test]
async fn state_in_another_format_counts_as_none() {
    // A value the scripts did not write (an older release's packed
    // doubles, a stray SET) must neither break a decision nor lock a client
    // out, nor linger in the hash.
    let b = Backend::start();
    let rs = gcra_and_windowed();
    // The largest double, with no expiry: were it taken for a TAT, or the
    // key for one without end, the client would be locked out.
    redis_call(
        &b.redis.addr(),
        &[&b"SET"[..], b"el:{stray}:g", &f64::MAX.to_le_bytes()],
    );
    // The previous release's window state (three packed doubles: 3 units in
    // a bucket far ahead), one of its bucket fields, and a stray field.
    let packed: Vec<u8> = [3.0f64, 9e12, 3.0]
        .iter()
        .flat_map(|d| d.to_le_bytes())
        .collect();
    let old_bucket: Vec<u8> = b"1000:100"
        .iter()
        .copied()
        .chain(9e12f64.to_le_bytes())
        .collect();
    redis_call(
        &b.redis.addr(),
        &[
            &b"HSET"[..],
            b"el:{stray}:w",
            b"1000:100",
            &packed,
            &old_bucket,
            b"x",
            b"60000:1000",
            b"12",
        ],
    );
    let d = b.decide(&[&rs[0], &rs[1]], "stray", 1, None).await;
    assert!(d.admitted(), "{d:?}");
    assert_eq!(
        d.rules[0].remaining, 4,
        "a fresh GCRA key: burst 5, one used"
    );
    assert_eq!(d.rules[1].remaining, 2, "a fresh 1 s window: 3, one used");
    let ttl = pttl(&b, "el:{stray}:g");
    assert!(
        ttl > 0 && ttl <= 6_000,
        "the admission gave the key its expiry: {ttl}"
    );
    let fields = b.redis(&["HKEYS", "el:{stray}:w"]);
    let mut fields: Vec<&str> = fields.lines().collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "1000/3/100/60000/6/1000/3600000/50/60000",
            "1000:100",
            "1000:100:n",
            "3600000:60000",
            "3600000:60000:n",
            "60000:1000",
            "60000:1000:n",
            "a",
            "b",
            "e",
            "s",
            "t",
            "u"
        ],
        "two fields per window and seven per key: the old fields went with the first admission"
    );
    assert!(pttl(&b, "el:{stray}:w") > 0, "and the hash expires");
}

#[tokio::test]
async fn a_limit_changed_under_a_live_key_holds_at_once() {
    // The lone-window path adds to the room left at the last admission,
    // which came from the limits then: lowered, they must bind on the next
    // request, not when a bucket next moves.
    let b = Backend::start();
    let window = |limit: u64| {
        rules(
            json!([{"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [["1h", limit, "1h"]]}]),
        )
    };
    let (wide, narrow) = (window(10), window(3));
    for _ in 0..3 {
        assert!(b.decide(&[&wide[0]], "lim", 1, None).await.admitted());
    }
    let d = b.decide(&[&narrow[0]], "lim", 1, None).await;
    assert!(!d.admitted(), "3 of 3 used: {d:?}");
    let d = b.decide(&[&wide[0]], "lim", 1, None).await;
    assert!(d.admitted(), "raised again, 4 of 10: {d:?}");
    assert_eq!(d.rules[0].remaining, 6);
    let d = b.decide(&[&narrow[0]], "lim", 1, None).await;
    assert!(!d.admitted(), "and lowered again: {d:?}");
    let fields = b.redis(&["HKEYS", "el:{lim}:w"]);
    assert!(
        !fields.lines().any(|f| f == "3600000/3/3600000"),
        "the narrow limit never admitted, so wrote nothing: {fields}"
    );
}

#[tokio::test]
async fn the_previous_releases_window_state_carries_over() {
    // Before the room field, the hash counted the cost since t in `c` and
    // kept `v` under that name; a deploy must neither forget those counts
    // (a fresh budget for every client) nor keep the old fields.
    let b = Backend::start();
    let rs = rules(
        json!([{"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [["1h", 10, "1h"]]}]),
    );
    assert!(b.decide(&[&rs[0]], "old", 1, None).await.admitted());
    let key = "el:{old}:w";
    let field = |name: &str| b.redis(&["HGET", key, name]);
    let (e, t, v) = (field("e"), field("t"), field("3600000/10/3600000"));
    // As that release left it: 4 at t, 3 more since.
    b.redis(&["DEL", key]);
    let ttl = (e.parse::<i64>().unwrap() - t.parse::<i64>().unwrap()).to_string();
    for pair in [
        ["e", &e],
        ["t", &t],
        ["v", &v],
        ["c", "3"],
        ["3600000:3600000", "4"],
        ["3600000:3600000:n", "4"],
    ] {
        b.redis(&["HSET", key, pair[0], pair[1]]);
    }
    b.redis(&["PEXPIRE", key, &ttl]);
    let d = b.decide(&[&rs[0]], "old", 1, None).await;
    assert!(d.admitted(), "{d:?}");
    assert_eq!(d.rules[0].remaining, 2, "7 counted before, 8 now");
    let fields = b.redis(&["HKEYS", key]);
    assert!(
        !fields.lines().any(|f| f == "c" || f == "v"),
        "the old fields are gone: {fields}"
    );
    for _ in 0..2 {
        assert!(b.decide(&[&rs[0]], "old", 1, None).await.admitted());
    }
    assert!(
        !b.decide(&[&rs[0]], "old", 1, None).await.admitted(),
        "10 of 10"
    );
}
