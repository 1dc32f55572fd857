//! Decisions for different clients made at the same moment in one isolate
//! share REST requests, end to end in `wrangler dev`: counted at the REST
//! endpoint (requests, and the commands each carried) while 64 fresh
//! clients send one request each at once; each decided on its own, each
//! one billed command; a Redis error in some entries (`WRONGTYPE` on their
//! state keys) fails those decisions alone; after `SCRIPT FLUSH`, each
//! entry's `NOSCRIPT` is answered by that call's own `EVAL`, and the
//! fallbacks of a busy moment on a fresh Redis (each carrying the script's
//! source) go in requests the endpoint's body limit takes. Clients one
//! after another each get a REST request of their own.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use reqwest::StatusCode;
use serde_json::Value;
use std::time::Duration;

use edge_limiter_local::{fault_proxy::Fault, DEFAULT_MAX_BODY_BYTES};
use support::{header, report::Table, worker::Stack};

const CLIENTS: usize = 64;
const LIMIT: u64 = 5;

const RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
algorithm = "gcra"
rate = 7
period = "1s"
burst = 5
"#;

/// What the endpoint counted between `before` and `after`: requests,
/// commands, and requests by the commands they carried.
fn counted(before: &Value, after: &Value) -> (u64, u64, Vec<(u64, u64)>) {
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let mut carrying = vec![];
    for (size, count) in after["carrying"].as_object().unwrap() {
        let more = count.as_u64().unwrap() - before["carrying"][size].as_u64().unwrap_or(0);
        if more > 0 {
            carrying.push((size.parse().unwrap(), more));
        }
    }
    carrying.sort();
    (
        n(after, "requests") - n(before, "requests"),
        n(after, "commands") - n(before, "commands"),
        carrying,
    )
}

/// One request from each of `n` fresh addresses (`prefix.N`), all at once
/// or one after another: each one's status and units left.
async fn fresh_clients(
    stack: &Stack,
    prefix: &str,
    n: usize,
    at_once: bool,
) -> Vec<(StatusCode, Option<u64>)> {
    // One client for all: 64 of them, each setting up at once, make
    // wrangler's proxy drop some connections on a loaded machine.
    let http = reqwest::Client::new();
    let send = |i: usize| {
        let request = http
            .get(format!("{}/page", stack.worker.url))
            .header("CF-Connecting-IP", format!("{prefix}.{i}"));
        tokio::spawn(async move {
            let r = request.send().await.unwrap();
            let left = header(&r, "X-RateLimit-Remaining").and_then(|v| v.parse().ok());
            (r.status(), left)
        })
    };
    let mut answers = vec![];
    if at_once {
        let tasks: Vec<_> = (0..n).map(send).collect();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
    } else {
        for i in 0..n {
            answers.push(send(i).await.unwrap());
        }
    }
    answers
}

#[tokio::test]
async fn decisions_made_at_once_share_rest_requests_each_decided_on_its_own() {
    let stack = Stack::start(RULES);
    let mut table = Table::new(
        "fresh clients through one isolate",
        &[
            "case",
            "decisions",
            "REST requests",
            "commands",
            "requests by commands carried",
        ],
    );
    // What the endpoint counted while `send` ran: requests, commands.
    let mut count = async |name: &str, prefix: &str, decisions: usize, at_once: bool| {
        let before = stack.backend.endpoint_stats().await;
        let answers = fresh_clients(&stack, prefix, decisions, at_once).await;
        let after = stack.backend.endpoint_stats().await;
        let (requests, commands, carrying) = counted(&before, &after);
        let shown: Vec<String> = carrying.iter().map(|(n, c)| format!("{n}: {c}")).collect();
        table.row(vec![
            name.into(),
            decisions.to_string(),
            requests.to_string(),
            commands.to_string(),
            shown.join(", "),
        ]);
        (answers, requests, commands, carrying)
    };
    let fresh = (StatusCode::OK, Some(LIMIT - 1));

    // The isolate is up, and Redis holds the script.
    fresh_clients(&stack, "198.51.100.200", 1, false).await;
    // One after another: nothing else in flight, so each call goes at
    // once, alone.
    let (answers, requests, _, carrying) = count("one after another", "198.51.100", 8, false).await;
    assert_eq!(answers, vec![fresh; 8]);
    assert_eq!(
        (requests, carrying),
        (8, vec![(1, 8)]),
        "one REST request each"
    );

    let (answers, requests, commands, _) = count("at once", "203.0.113", CLIENTS, true).await;
    assert_eq!(answers, vec![fresh; CLIENTS]);
    assert_eq!(commands, CLIENTS as u64, "one command per decision");
    assert!(
        requests < CLIENTS as u64,
        "{requests} REST requests: no two decisions shared one"
    );

    // Every eighth client's state key holds a list with a TTL: the script
    // reads it (a TTL, and an interval of no whole ms, make it GET the
    // key), Redis answers WRONGTYPE, and the rule fails closed for that
    // client alone.
    let broken: Vec<usize> = (0..CLIENTS).step_by(8).collect();
    for i in &broken {
        let key = format!("el:{{192.0.2.{i}}}:per-ip");
        stack.backend.redis(&["RPUSH", &key, "x"]);
        stack.backend.redis(&["PEXPIRE", &key, "600000"]);
    }
    let (answers, requests, _, carrying) =
        count("at once, WRONGTYPE in every 8th", "192.0.2", CLIENTS, true).await;
    for (i, answer) in answers.iter().enumerate() {
        match broken.contains(&i) {
            true => assert_eq!(answer.0, StatusCode::SERVICE_UNAVAILABLE, "client {i}"),
            false => assert_eq!(*answer, fresh, "client {i}"),
        }
    }
    assert!(requests < CLIENTS as u64, "{requests} REST requests");
    let alone = carrying
        .iter()
        .find(|(n, _)| *n == 1)
        .map_or(0, |(_, c)| *c);
    assert!(
        alone < broken.len() as u64,
        "{alone} calls went alone: perhaps no WRONGTYPE shared a pipeline"
    );

    // NOSCRIPT for the EVALSHAs that reach Redis before an EVAL has
    // loaded the script again: each such call follows with its own EVAL.
    stack.backend.redis(&["SCRIPT", "FLUSH"]);
    let (answers, requests, commands, _) =
        count("at once, after SCRIPT FLUSH", "10.0.0", CLIENTS, true).await;
    assert_eq!(answers, vec![fresh; CLIENTS]);
    assert!(commands > CLIENTS as u64, "no NOSCRIPT was answered");
    assert!(requests < commands, "{requests} REST requests");
    table.print("batched-calls");
}

#[tokio::test]
async fn a_busy_moment_on_a_fresh_redis_falls_back_in_requests_the_endpoint_takes() {
    let stack = Stack::builder(RULES).through_fault_proxy().start();
    let proxy = stack.proxy.as_ref().unwrap();
    // Redis 150 ms away: while the first client's call is out, the other
    // 63 gather into one pipeline; Redis has no script, so all 63 come
    // back NOSCRIPT together and fall back to EVAL (the script's source
    // each, 1.3 MB in all) at the same moment.
    stack.backend.redis(&["SCRIPT", "FLUSH"]);
    proxy.set(Fault::Delay(Duration::from_millis(150)));
    let answers = fresh_clients(&stack, "198.18.0", CLIENTS, true).await;
    assert_eq!(answers, vec![(StatusCode::OK, Some(LIMIT - 1)); CLIENTS]);
    let exchanges = proxy.exchanges();
    let largest = exchanges.iter().map(|e| e.request.len()).max().unwrap();
    let evals = exchanges
        .iter()
        .filter(|e| e.request.windows(7).any(|w| w == b"[\"EVAL\""))
        .count();
    assert!(evals > 0, "no call fell back to EVAL");
    assert!(
        largest <= DEFAULT_MAX_BODY_BYTES,
        "a request of {largest} bytes"
    );
}
