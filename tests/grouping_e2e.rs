//! A client's simultaneous requests decided together, end to end in
//! `wrangler dev` (issue 32): a fresh client's page load, 30 requests at
//! once through one worker whose Redis is a round trip away, costs at most
//! two REST calls (the first request's, then one for every request that
//! came while it was in flight), and admits exactly what the rule allows,
//! with and without `lease`. REST calls are counted where they arrive, at
//! a proxy in front of the endpoint.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::time::Duration;

use edge_limiter_local::fault_proxy::Fault;
use futures_util::future::join_all;
use reqwest::StatusCode;
use support::{report::Table, worker::Stack};

/// What a page costs: the document and its resources, all at once.
const PAGE: usize = 30;

/// How long each REST call's reply takes: long enough that the whole page
/// arrives while the first request's call is out, as it does with hosted
/// Redis tens of milliseconds away.
const ROUND_TRIP: Duration = Duration::from_millis(300);

/// Per client, a burst of 20 and one unit a minute after it; the same
/// with a lease; and 20 an hour in windows.
const RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "plain"
key = ["ip"]
path_prefix = "/plain"
algorithm = "gcra"
rate = 1
period = "1m"
burst = 20

[[vars.LIMITER.rules]]
name = "leased"
key = ["ip"]
path_prefix = "/leased"
algorithm = "gcra"
rate = 1
period = "1m"
burst = 20
lease = 4
lease_for = "1s"

[[vars.LIMITER.rules]]
name = "windowed"
key = ["ip"]
path_prefix = "/windowed"
algorithm = "windowed"
windows = [["1h", 20, "1m"]]
"#;

/// `PAGE` requests for `path` from `ip`, all at once; their statuses.
async fn page(stack: &Stack, path: &str, ip: &str) -> Vec<StatusCode> {
    let http = reqwest::Client::new();
    let url = format!("{}{path}", stack.worker.url);
    let sent = (0..PAGE).map(|_| {
        let request = http.get(&url).header("CF-Connecting-IP", ip).send();
        async move { request.await.expect("the worker answers").status() }
    });
    join_all(sent).await
}

#[tokio::test]
async fn a_fresh_clients_page_load_costs_two_calls_and_admits_exactly_the_limit() {
    let stack = Stack::builder(RULES).through_fault_proxy().start();
    let proxy = stack.proxy.as_ref().expect("a proxy");
    // The script loaded (EVALSHA's NOSCRIPT, then EVAL) before the count.
    for path in ["/plain", "/leased", "/windowed"] {
        let url = format!("{}{path}", stack.worker.url);
        let warm = reqwest::Client::new().get(url);
        let warm = warm.header("CF-Connecting-IP", "203.0.113.200").send();
        assert_eq!(warm.await.unwrap().status(), StatusCode::OK);
    }
    proxy.set(Fault::DelayReply(ROUND_TRIP));
    let mut table = Table::new(
        &format!("A fresh client's page load: {PAGE} requests at once through one worker, each REST call {} ms", ROUND_TRIP.as_millis()),
        &["rule", "REST calls", "admitted", "the rule allows"],
    );
    let mut failures = vec![];
    for (k, path) in ["/plain", "/leased", "/windowed"].into_iter().enumerate() {
        let ip = format!("203.0.113.{}", 10 + k);
        let before = stack.script_calls();
        let statuses = page(&stack, path, &ip).await;
        assert!(proxy.wait_idle(Duration::from_secs(10)), "calls still held");
        let calls = stack.script_calls() - before;
        let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
        let denied = statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count();
        table.row(vec![
            path.to_owned(),
            calls.to_string(),
            admitted.to_string(),
            "20".into(),
        ]);
        if calls > 2 || (admitted, denied) != (20, PAGE - 20) {
            failures.push(format!("{path}: {calls} calls, statuses {statuses:?}"));
        }
    }
    table.print("page-load");
    assert!(failures.is_empty(), "{failures:#?}\n{}", stack.worker.log());
    let hits = stack.origin.hits().await["total"].as_u64();
    assert_eq!(hits, Some(3 + 3 * 20), "only admitted requests reached it");
}
