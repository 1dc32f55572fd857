//! The GCRA script against a real redis-server, through the REST endpoint.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use edge_limiter::decision::transport::protocol::LIMITER;
use edge_limiter_local::testenv::redis_call;
use serde_json::json;
use support::{rules, Backend};

#[tokio::test]
async fn embedded_sha1_is_the_sources_and_what_redis_computes() {
    assert_eq!(
        LIMITER.sha1,
        sha1_smol::Sha1::from(LIMITER.source).digest().to_string()
    );
    assert!(LIMITER
        .source
        .starts_with("#!lua flags=allow-key-locking\n"));
    let b = Backend::start();
    let loaded = b
        .client
        .command(&["SCRIPT", "LOAD", LIMITER.source])
        .await
        .unwrap();
    assert_eq!(loaded, json!(LIMITER.sha1));
}

#[tokio::test]
async fn admits_exactly_the_burst_back_to_back_then_denies() {
    let b = Backend::start();
    // One unit per hour: nothing refills while the test runs, on Redis's clock.
    let r = rules(
        json!([{"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1h", "burst": 5}]),
    );
    for i in 0..5 {
        let d = b.decide(&[&r[0]], "198.51.100.1", 1, None).await;
        assert!(d.admitted(), "request {i}: {d:?}");
        assert_eq!(d.rules[0].remaining, 4 - i);
        assert_eq!(d.rules[0].limit, 5);
    }
    for _ in 0..3 {
        let d = b.decide(&[&r[0]], "198.51.100.1", 1, None).await;
        assert!(!d.admitted(), "{d:?}");
        assert_eq!(d.rules[0].remaining, 0);
        let retry = d.wait_ms().unwrap();
        assert!(retry > 3_590_000 && retry <= 3_600_000, "{retry}");
    }
    // Another client is untouched.
    assert!(b.decide(&[&r[0]], "198.51.100.2", 1, None).await.admitted());
}

#[tokio::test]
async fn retry_after_is_exact_to_the_millisecond() {
    let b = Backend::start();
    // 3 per second: one unit per 333 333 us, so retry-after is not a round number.
    let r = rules(
        json!([{"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 3, "period": "1s", "burst": 2}]),
    );
    let t0 = 1_700_000_000_000;
    assert!(b.decide(&[&r[0]], "c", 1, Some(t0)).await.admitted());
    assert!(b.decide(&[&r[0]], "c", 1, Some(t0)).await.admitted());
    let denied = b.decide(&[&r[0]], "c", 1, Some(t0)).await;
    assert!(!denied.admitted());
    let retry = denied.wait_ms().unwrap();
    assert_eq!(retry, 334, "333.333 ms, rounded up");
    let early = b.decide(&[&r[0]], "c", 1, Some(t0 + retry - 1)).await;
    assert!(
        !early.admitted(),
        "one millisecond early must still be denied: {early:?}"
    );
    assert_eq!(early.wait_ms(), Some(1));
    let on_time = b.decide(&[&r[0]], "c", 1, Some(t0 + retry)).await;
    assert!(
        on_time.admitted(),
        "a call at retry-after must be admitted: {on_time:?}"
    );
}

#[tokio::test]
async fn the_key_expires_when_its_debt_is_paid() {
    let b = Backend::start();
    let r = rules(
        json!([{"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1m", "burst": 10}]),
    );
    let d = b.decide(&[&r[0]], "ttl", 3, None).await;
    assert!(d.admitted());
    let pttl: i64 = b.redis(&["PTTL", "el:{ttl}:g"]).parse().unwrap();
    // Three units of 6 s each: the TAT is 18 s ahead, and so is the expiry.
    assert!(pttl > 17_000 && pttl <= 18_000, "{pttl}");
    assert_eq!(d.rules[0].reset_after_ms, 18_000);
    // A denied request writes nothing, so it cannot extend the expiry.
    let before = b.redis(&["GET", "el:{ttl}:g"]);
    let denied = b.decide(&[&r[0]], "ttl", 8, None).await;
    assert!(!denied.admitted());
    assert_eq!(b.redis(&["GET", "el:{ttl}:g"]), before);
    let after: i64 = b.redis(&["PTTL", "el:{ttl}:g"]).parse().unwrap();
    assert!(after <= pttl, "{after} > {pttl}");
}

#[tokio::test]
async fn a_flushed_script_is_sent_again() {
    let b = Backend::start();
    let r = rules(
        json!([{"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1h", "burst": 3}]),
    );
    assert!(b.decide(&[&r[0]], "f", 1, None).await.admitted());
    b.redis(&["SCRIPT", "FLUSH"]);
    let d = b.decide(&[&r[0]], "f", 1, None).await;
    assert!(d.admitted());
    assert_eq!(d.rules[0].remaining, 1, "the state survived the flush");
}

#[tokio::test]
async fn on_redis_clock_a_fractional_interval_keeps_its_microseconds() {
    // The key's expiry holds the TAT to the millisecond; what rounding it up
    // added is stored beside it, or the TAT would drift later with every
    // admission and the rule admit less than configured.
    let b = Backend::start();
    let r = rules(
        json!([{"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 3, "period": "1s", "burst": 100}]),
    );
    // Writes a GCRA key by hand, expiring in `px` ms.
    let set = |key: &str, value: &[u8], px: &str| {
        redis_call(
            &b.redis.addr(),
            &[&b"SET"[..], key.as_bytes(), value, b"PX", px.as_bytes()],
        )
    };
    // A TAT 10 s ahead, of which the last 500 us are rounding.
    set("el:{frac}:g", b"500", "10000");
    let d = b.decide(&[&r[0]], "frac", 1, None).await;
    assert!(d.admitted(), "{d:?}");
    // ahead = whole ms - 500 us, plus 333 333 us: the new TAT ends in 833 us
    // past a millisecond, so rounding it up adds 167 us, whatever time passed.
    assert_eq!(b.redis(&["GET", "el:{frac}:g"]), "167");
    let ttl: i64 = b.redis(&["PTTL", "el:{frac}:g"]).parse().unwrap();
    assert!(ttl > 10_000 && ttl <= 10_334, "{ttl}");
    assert_eq!(
        d.rules[0].remaining,
        100 - 31,
        "about 10.33 s of 33.3 s used"
    );

    // Older releases stored the TAT itself, or the remainder as a packed
    // double, beside the same expiry: the expiry still tells the debt, and
    // neither value is taken for a remainder. 10.1 s ahead plus one
    // interval leaves 68.7 intervals of the tolerance, so the figure holds
    // until 233 ms pass.
    set("el:{old}:g", b"1700000000000000", "10100");
    let d = b.decide(&[&r[0]], "old", 1, None).await;
    assert_eq!(d.rules[0].remaining, 68, "{d:?}");
    set("el:{old}:g", &900.0f64.to_le_bytes(), "10100");
    let d = b.decide(&[&r[0]], "old", 1, None).await;
    assert_eq!(d.rules[0].remaining, 68, "{d:?}");
}
