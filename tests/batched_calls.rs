//! Decisions for different clients made at the same moment in one isolate
//! share REST requests, end to end in `wrangler dev`: counted at the REST
//! endpoint (requests, and the commands each carried) while 64 fresh
//! clients send one request each at once; each decided on its own, each
//! one billed command; and after `SCRIPT FLUSH`, each entry's `NOSCRIPT`
//! answered by that call's own `EVAL`.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use reqwest::StatusCode;
use serde_json::Value;
use support::{header, report::Table, worker::Stack, TOKEN};

const CLIENTS: usize = 64;
const LIMIT: u64 = 5;

const RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
algorithm = "gcra"
rate = 5
period = "1h"
burst = 5
"#;

/// What the endpoint has counted so far (`GET /__stats`).
async fn endpoint_stats(stack: &Stack) -> Value {
    reqwest::Client::new()
        .get(format!("{}/__stats", stack.backend.endpoint.url()))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

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

/// One request from each of `CLIENTS` fresh addresses (`prefix.N`), all at
/// once: each one's status and units left.
async fn fresh_clients_at_once(stack: &Stack, prefix: &str) -> Vec<(StatusCode, Option<u64>)> {
    // One client for all: 64 of them, each setting up at once, make
    // wrangler's proxy drop some connections on a loaded machine.
    let http = reqwest::Client::new();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let url = format!("{}/page", stack.worker.url);
            let ip = format!("{prefix}.{i}");
            let http = http.clone();
            tokio::spawn(async move {
                let r = http
                    .get(url)
                    .header("CF-Connecting-IP", ip)
                    .send()
                    .await
                    .unwrap();
                let left = header(&r, "X-RateLimit-Remaining").and_then(|v| v.parse().ok());
                (r.status(), left)
            })
        })
        .collect();
    let mut answers = vec![];
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    answers
}

#[tokio::test]
async fn decisions_made_at_once_share_rest_requests_each_decided_on_its_own() {
    let stack = Stack::start(RULES);
    // One request first: the isolate is up, and Redis holds the script.
    let first = reqwest::Client::new()
        .get(format!("{}/page", stack.worker.url))
        .header("CF-Connecting-IP", "198.51.100.1")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let mut table = Table::new(
        "64 fresh clients at once through one isolate",
        &[
            "case",
            "decisions",
            "REST requests",
            "commands",
            "script calls in Redis",
            "requests by commands carried",
        ],
    );
    let mut case = async |name: &str, prefix: &str, flush: bool| {
        if flush {
            stack.backend.redis(&["SCRIPT", "FLUSH"]);
        }
        let before = endpoint_stats(&stack).await;
        let calls = stack.backend.script_calls();
        let answers = fresh_clients_at_once(&stack, prefix).await;
        let after = endpoint_stats(&stack).await;
        let script_calls = stack.backend.script_calls() - calls;
        let (requests, commands, carrying) = counted(&before, &after);
        let shown: Vec<String> = carrying.iter().map(|(n, c)| format!("{n}: {c}")).collect();
        table.row(vec![
            name.into(),
            CLIENTS.to_string(),
            requests.to_string(),
            commands.to_string(),
            script_calls.to_string(),
            shown.join(", "),
        ]);
        // Each client was decided by its own entry: a fresh client's
        // first request, admitted with the rest of its burst left.
        for (i, answer) in answers.iter().enumerate() {
            assert_eq!(*answer, (StatusCode::OK, Some(LIMIT - 1)), "client {i}");
        }
        (requests, commands, script_calls)
    };

    let (requests, commands, script_calls) = case("script cached", "203.0.113", false).await;
    assert_eq!(script_calls, CLIENTS as u64, "one script call per decision");
    assert_eq!(commands, CLIENTS as u64, "one command per decision");
    assert!(
        requests < CLIENTS as u64,
        "{requests} REST requests: no two decisions shared one"
    );

    let (requests, commands, _) = case("after SCRIPT FLUSH", "192.0.2", true).await;
    // Every EVALSHA answered NOSCRIPT, each followed by its own EVAL.
    assert_eq!(commands, 2 * CLIENTS as u64);
    assert!(requests < commands, "{requests} REST requests");
    table.print("batched-calls");
}

