//! Quota leases end to end in `wrangler dev` (issue 24): a hot key is
//! mostly decided in the isolate, two instances sharing a key above its
//! limit never admit more than the limit, and leased units outlive an
//! unreachable Redis until their deadline, no longer. Then (issue 31) the
//! work due after a response whose origin fetch failed, and what reaches
//! the origin and Redis once a client is blocked or a rule tightened.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::time::{Duration, Instant};

use edge_limiter::rules::overrides::BLOCK_TEXT;
use edge_limiter_local::fault_proxy::Fault;
use futures_util::future::join_all;
use reqwest::StatusCode;
use support::{
    header,
    worker::{Stack, Worker},
};

async fn get(url: &str, ip: &str) -> reqwest::Response {
    support::http()
        .get(url)
        .header("CF-Connecting-IP", ip)
        .send()
        .await
        .expect("the worker answers")
}

/// Requests that reached the origin.
async fn origin_hits(stack: &Stack) -> u64 {
    stack.origin.hits().await["total"].as_u64().unwrap_or(0)
}

const HOT: &str = r#"
[[vars.LIMITER.rules]]
name = "hot"
key = ["ip"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 300
lease = 20
lease_for = "2s"
"#;

#[tokio::test]
async fn a_hot_key_is_mostly_decided_in_the_isolate() {
    let stack = Stack::start(HOT);
    let url = format!("{}/hot", stack.worker.url);
    stream(&stack.worker, &url, "198.51.100.7").await;
    let before = stack.backend.script_calls();
    let hits_before = origin_hits(&stack).await;
    let n = 150;
    let mut limits = vec![];
    for _ in 0..n {
        let r = get(&url, "198.51.100.7").await;
        assert_eq!(r.status(), StatusCode::OK);
        limits.push(header(&r, "RateLimit").map(str::to_owned));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let calls = stack.backend.script_calls() - before;
    eprintln!("{calls} script calls for {n} requests");
    assert!(calls * 4 <= n, "{calls} script calls for {n} requests");
    // Every answer, lease-served or not, says where the client stands.
    assert!(limits
        .iter()
        .all(|l| l.as_deref().is_some_and(|v| v.starts_with("\"hot\";r="))));
    assert_eq!(origin_hits(&stack).await - hits_before, n);
    assert!(!stack.worker.events_of("lease_grant").is_empty());
}

const SHARED: &str = r#"
[[vars.LIMITER.rules]]
name = "shared"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 40
lease = 8
lease_for = "1s"
"#;

#[tokio::test]
async fn two_instances_over_the_limit_admit_no_more_than_it() {
    let stack = Stack::builder(SHARED).instances(2).start();
    let urls = [&stack.worker.url, &stack.others[0].url].map(|u| format!("{u}/shared"));
    let started = Instant::now();
    let mut admitted = 0u64;
    // Waves of 8 concurrent requests on each instance, well above the limit.
    for _ in 0..20 {
        let sent = urls
            .iter()
            .flat_map(|u| (0..8).map(move |_| get(u, "198.51.100.8")));
        for r in join_all(sent).await {
            match r.status() {
                StatusCode::OK => admitted += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("unexpected {other}"),
            }
        }
    }
    // The burst, and one unit per minute since the first request.
    let bound = 40 + started.elapsed().as_secs() / 60 + 1;
    eprintln!("{admitted} admitted of 320 (bound {bound})");
    assert!(admitted <= bound, "{admitted} admitted, bound {bound}");
    assert_eq!(origin_hits(&stack).await, admitted);
    assert!(admitted >= 20, "only {admitted} admitted of a burst of 40");
}

const FAULTY: &str = r#"
[[vars.LIMITER.rules]]
name = "faulty"
key = ["ip"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 300
lease = 20
lease_for = "2s"
fail = "closed"
"#;

#[tokio::test]
async fn leased_units_outlive_an_unreachable_redis_until_their_deadline() {
    let stack = Stack::builder(FAULTY).through_fault_proxy().start();
    let proxy = stack.proxy.as_ref().unwrap();
    let url = format!("{}/faulty", stack.worker.url);
    stream(&stack.worker, &url, "198.51.100.9").await;
    let hits_before = origin_hits(&stack).await;
    proxy.set(Fault::Status {
        status: 500,
        body: "down".into(),
    });
    let faulted = Instant::now();
    // More than an isolate may hold: a refresh tops up a lease once half
    // of it is left, so 1.5 x `lease` at most (docs/leases.md).
    let (sent, most) = (40, 30);
    let mut during = vec![];
    for _ in 0..sent {
        during.push(get(&url, "198.51.100.9").await.status());
    }
    let within = faulted.elapsed();
    // Whatever is left once the deadline has passed falls to the fail mode.
    tokio::time::sleep(Duration::from_millis(2100).saturating_sub(within)).await;
    let after = get(&url, "198.51.100.9").await.status();
    proxy.set(Fault::Pass);
    let served = during.iter().filter(|s| **s == StatusCode::OK).count();
    eprintln!("{served} of {sent} served from the lease in {within:?}, then {after}");
    assert!(served >= 1, "no leased unit was spent: {during:?}");
    assert!(served <= most, "more than an isolate holds: {during:?}");
    // Served first, then the fail mode: never a unit after the fail mode.
    assert!(
        during[..served].iter().all(|s| *s == StatusCode::OK),
        "{during:?}"
    );
    assert!(during[served..]
        .iter()
        .all(|s| *s == StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(after, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(origin_hits(&stack).await - hits_before, served as u64);
}

/// Requests `n` times, `gap` apart; the statuses.
/// Requests from `ip` to `url` until `worker` has leased to it.
async fn stream(worker: &Worker, url: &str, ip: &str) {
    worker
        .stream_until_leased(|| async { assert_eq!(get(url, ip).await.status(), StatusCode::OK) })
        .await;
}

async fn statuses(url: &str, ip: &str, n: usize, gap: Duration) -> Vec<u16> {
    let mut out = vec![];
    for _ in 0..n {
        out.push(get(url, ip).await.status().as_u16());
        tokio::time::sleep(gap).await;
    }
    out
}

const TWO: &str = r#"
[[vars.LIMITER.rules]]
name = "wide"
path_prefix = "/wide"
key = ["ip"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 300
lease = 20
lease_for = "2s"
overrides = true

[[vars.LIMITER.rules]]
name = "login"
path_prefix = "/login"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 5
count_status = [401]
"#;

/// The first request's origin hangs up: the isolate still makes its first
/// read of the rule-wide override, due after that response, and the
/// charge of a `count_status` rule stays (the origin may have acted).
#[tokio::test]
async fn a_failed_origin_fetch_still_rereads_and_keeps_its_charge() {
    let stack = Stack::start(TWO);
    stack.backend.redis(&["SET", "el:rule:wide:o", BLOCK_TEXT]);
    let url = format!("{}/wide", stack.worker.url);
    let ip = "198.51.100.40";
    // Before its first read the isolate knows of no override.
    let failed = get(&format!("{url}?hangup=1"), ip).await.status();
    assert!(failed.is_server_error(), "{failed}");
    let mut seen = vec![];
    for _ in 0..50 {
        seen.push(get(&url, ip).await.status().as_u16());
        if seen.last() == Some(&429) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen.last(), Some(&429), "the block never arrived: {seen:?}");
    let login = format!("{}/login", stack.worker.url);
    let failed = get(&format!("{login}?hangup=1"), ip).await.status();
    assert!(failed.is_server_error(), "{failed}");
    let counted = format!("{login}?status=401");
    let after = statuses(&counted, ip, 6, Duration::from_millis(50)).await;
    assert_eq!(after, [401, 401, 401, 401, 429, 429], "5 of the burst");
}

/// Responses whose origin fetch fails while the client's leases run low:
/// the refreshes due then still run, and the client leases again after.
#[tokio::test]
async fn a_failed_origin_fetch_leaves_the_client_leasing() {
    let stack = Stack::start(HOT);
    let url = format!("{}/hot", stack.worker.url);
    let ip = "198.51.100.41";
    let gap = Duration::from_millis(10);
    stream(&stack.worker, &url, ip).await;
    assert!(!stack.worker.events_of("lease_grant").is_empty());
    // Two leases' worth, each response lost.
    let lost = statuses(&format!("{url}?hangup=1"), ip, 40, gap).await;
    assert!(lost.iter().all(|s| *s >= 500), "{lost:?}");
    let before = stack.backend.script_calls();
    let n = 100;
    assert!(statuses(&url, ip, n, gap).await.iter().all(|s| *s == 200));
    let calls = stack.backend.script_calls() - before;
    eprintln!("{calls} script calls for {n} requests");
    assert!(
        calls * 4 <= n as u64,
        "{calls} script calls for {n} requests"
    );
}

const BLOCKABLE: &str = r#"
[[vars.LIMITER.rules]]
name = "blockable"
key = ["ip"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 300
lease = 20
lease_for = "2s"
overrides = true
"#;

/// A block without end on a leasing client: the units the isolate held
/// are all that reach the origin after it, and its denials are answered
/// from the isolate's memory of them, not by Redis each time.
#[tokio::test]
async fn a_block_on_a_leasing_client_stops_it_at_the_isolate() {
    let stack = Stack::start(BLOCKABLE);
    let url = format!("{}/blocked", stack.worker.url);
    let ip = "198.51.100.42";
    let gap = Duration::from_millis(10);
    stream(&stack.worker, &url, ip).await;
    assert!(!stack.worker.events_of("lease_grant").is_empty());
    stack
        .backend
        .redis(&["SET", &format!("el:{{{ip}}}:blockable:o"), BLOCK_TEXT]);
    let hits = origin_hits(&stack).await;
    let calls = stack.backend.script_calls();
    let n = 60;
    let after = statuses(&url, ip, n, gap).await;
    let served = after.iter().take_while(|s| **s == 200).count();
    assert!(after[served..].iter().all(|s| *s == 429), "{after:?}");
    // 1.5 x `lease` at most, held when the block was set.
    assert!(served <= 30, "{after:?}");
    assert_eq!(origin_hits(&stack).await - hits, served as u64);
    let calls = stack.backend.script_calls() - calls;
    eprintln!("{calls} script calls for {n} requests, {served} served from leases");
    // The call that read the block, and a refresh or two.
    assert!(calls <= 4, "{calls} script calls: {after:?}");
}

const TIGHTENED: &str = r#"
[[vars.LIMITER.rules]]
name = "tightened"
key = ["ip"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 300
overrides = true
"#;

/// A rule-wide override with an end, lowering the rule: once a client is
/// denied under it, its next denials come from the isolate's memory.
#[tokio::test]
async fn denials_under_a_rule_wide_override_with_an_end_are_cached() {
    let stack = Stack::start(TIGHTENED);
    // One a minute, a burst of 2, for ten minutes.
    let text = "v1 gcra 1 60000 2 60000000";
    stack
        .backend
        .redis(&["SET", "el:rule:tightened:o", text, "PX", "600000"]);
    let url = format!("{}/tight", stack.worker.url);
    let ip = "198.51.100.43";
    // The first request has the isolate read the override.
    let mut seen = vec![];
    while seen.last() != Some(&429) {
        assert!(seen.len() < 50, "never denied: {seen:?}");
        seen.push(get(&url, ip).await.status().as_u16());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hits = origin_hits(&stack).await;
    let calls = stack.backend.script_calls();
    let n = 20;
    let after = statuses(&url, ip, n, Duration::from_millis(10)).await;
    assert!(after.iter().all(|s| *s == 429), "{after:?}");
    assert_eq!(origin_hits(&stack).await, hits);
    let calls = stack.backend.script_calls() - calls;
    eprintln!("{calls} script calls for {n} denials");
    assert_eq!(calls, 0, "{calls} script calls for {n} denials");
}
