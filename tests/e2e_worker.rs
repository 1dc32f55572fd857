//! The complete worker end to end in `wrangler dev`: several rules on one
//! request, exact headers, the block cache, shadow mode, fail modes with
//! Redis stopped, a wrong token, and a bad configuration.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::time::{Duration, Instant};

use reqwest::{Response, StatusCode};
use support::{
    header,
    worker::{Stack, Worker},
    TOKEN,
};

const IP: &str = "203.0.113.50";

async fn send(method: reqwest::Method, url: String, ip: &str) -> Response {
    support::http()
        .request(method, url)
        .header("CF-Connecting-IP", ip)
        .send()
        .await
        .expect("the worker answers")
}

/// After the denial in the test below: per-ip spent, login untouched at 1
/// left. Each reset counts down from the admissions, so a slow machine may
/// see it a second lower (and login's 1 s buckets may also have moved).
fn assert_denied_state(r: &Response) {
    let got = header(r, "RateLimit").unwrap();
    let fits = [240, 239].iter().any(|ip| {
        [60, 59]
            .iter()
            .any(|login| got == format!("\"per-ip\";r=0;t={ip}, \"login.1\";r=1;t={login}"))
    });
    assert!(fits, "{got}");
}

/// Retry-After counts down from the denial: `full` seconds, or one less once
/// a second has passed on a slow machine.
fn assert_retry_after(r: &Response, full: u64) {
    let got: u64 = header(r, "Retry-After").unwrap().parse().unwrap();
    assert!(
        got == full || got + 1 == full,
        "Retry-After {got}, not {full}"
    );
}

const MULTI: &str = r#"
[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 4
cost = { GET = 1, POST = 2 }

[[vars.LIMITER.rules]]
name = "login"
key = ["ip"]
path_prefix = "/login"
methods = ["POST"]
algorithm = "windowed"
windows = [["1m", 3, "1s"], ["1h", 5, "1s"]]
"#;

#[tokio::test]
async fn every_matching_rule_is_decided_at_once_with_exact_headers() {
    let stack = Stack::start(MULTI);
    let login = format!("{}/login", stack.worker.url);
    let policy = "\"per-ip\";q=4;w=240, \"login.1\";q=3;w=60, \"login.2\";q=5;w=3600";

    // (RateLimit, X-RateLimit-Limit/Remaining/Reset) after each admitted POST:
    // per-ip spends 2 of its burst of 4 (one unit per minute), login 1 of 3.
    let admitted = [
        (
            "\"per-ip\";r=2;t=120, \"login.1\";r=2;t=60",
            ["4", "2", "120"],
        ),
        (
            "\"per-ip\";r=0;t=240, \"login.1\";r=1;t=60",
            ["4", "0", "240"],
        ),
    ];
    for (ratelimit, x) in admitted {
        let r = send(reqwest::Method::POST, login.clone(), IP).await;
        assert_eq!(r.status(), StatusCode::OK, "{}", stack.worker.log());
        assert_eq!(header(&r, "RateLimit-Policy"), Some(policy));
        assert_eq!(header(&r, "RateLimit"), Some(ratelimit));
        let got = [
            "X-RateLimit-Limit",
            "X-RateLimit-Remaining",
            "X-RateLimit-Reset",
        ]
        .map(|h| header(&r, h).unwrap().to_owned());
        assert_eq!(got, x);
        assert_eq!(header(&r, "Retry-After"), None);
    }

    // The third POST needs 2 more units of per-ip: denied by it, and login,
    // which would have admitted it, is not charged (still r=1).
    let r = send(reqwest::Method::POST, login.clone(), IP).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_retry_after(&r, 120);
    assert_denied_state(&r);
    assert_eq!(header(&r, "Content-Type"), Some("application/problem+json"));
    // The body says what the header says, however long the requests took.
    let retry_after = header(&r, "Retry-After").and_then(|s| s.parse::<u64>().ok());
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (body["policy"].as_str(), body["retry_after"].as_u64()),
        (Some("per-ip"), retry_after)
    );

    // A GET costs one unit and falls under per-ip only: free in a minute.
    let r = send(reqwest::Method::GET, format!("{}/", stack.worker.url), IP).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_retry_after(&r, 60);
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"per-ip\";q=4;w=240"));

    // Denied again: answered from the isolate's cache, with no script call.
    let before = stack.backend.script_calls();
    for _ in 0..5 {
        let r = send(reqwest::Method::POST, login.clone(), IP).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_retry_after(&r, 120);
        assert_denied_state(&r);
    }
    assert_eq!(
        stack.backend.script_calls(),
        before,
        "cached denials made round trips"
    );

    let hits = stack.origin.hits().await;
    assert_eq!(
        hits["total"], 2,
        "only the admitted requests reached the origin: {hits}"
    );
}

#[tokio::test]
async fn shadow_rules_report_but_never_block() {
    let rules = r#"
[[vars.LIMITER.rules]]
name = "trial"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 2
mode = "shadow"
"#;
    let stack = Stack::start(rules);
    let mut last = None;
    for _ in 0..5 {
        let r = send(reqwest::Method::GET, format!("{}/", stack.worker.url), IP).await;
        assert_eq!(r.status(), StatusCode::OK);
        last = header(&r, "RateLimit").map(str::to_owned);
    }
    assert_eq!(last.as_deref(), Some("\"trial\";r=0;t=7200"));
    // The origin's redirect reaches the client as it is, with the headers.
    let no_follow = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = no_follow
        .get(format!("{}/__origin/redirect", stack.worker.url))
        .header("CF-Connecting-IP", IP)
        .send()
        .await
        .expect("the worker answers");
    assert_eq!(r.status(), StatusCode::FOUND);
    assert_eq!(header(&r, "location"), Some("/landed"));
    assert!(header(&r, "RateLimit").is_some());
    assert_eq!(stack.origin.hits().await["total"], 6);
    // JSON lines for Workers Logs to count the would-be denials by.
    let would = stack.worker.count_of("would_deny", "trial", 4).await;
    assert_eq!(would, 4, "{}", stack.worker.log());
}

/// The worker's log, once it holds `needle` `times` times (wrangler prints
/// asynchronously), or after 10 s.
async fn wait_for_log(worker: &Worker, needle: &str, times: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = worker.log();
        if log.matches(needle).count() >= times || Instant::now() > deadline {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const FAIL_MODES: &str = r#"
[[vars.LIMITER.rules]]
name = "open"
key = ["ip"]
path_prefix = "/open"
algorithm = "gcra"
rate = 2
period = "1h"
fail = "open"
budget = "500ms"

[[vars.LIMITER.rules]]
name = "closed"
key = ["ip"]
path_prefix = "/closed"
algorithm = "windowed"
windows = [["1h", 2, "1m"]]
budget = "500ms"
"#;

#[tokio::test]
async fn redis_down_fails_open_or_closed_as_configured_then_recovers() {
    let mut stack = Stack::start(FAIL_MODES);
    let url = |p: &str| format!("{}{p}", stack.worker.url);
    assert_eq!(
        send(reqwest::Method::GET, url("/open"), IP).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(reqwest::Method::GET, url("/closed"), IP)
            .await
            .status(),
        StatusCode::OK
    );

    stack.backend.redis.stop();
    for i in 0..3 {
        // Clients of their own: an outage is logged per rule, not per client.
        let ip = format!("198.51.100.{i}");
        let r = send(reqwest::Method::GET, url("/open"), &ip).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            header(&r, "X-RateLimit-Bypassed"),
            Some("redis-unavailable")
        );
        let r = send(reqwest::Method::GET, url("/closed"), IP).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&r, "Retry-After"), Some("1"));
    }
    let w = &stack.worker;
    assert_eq!(
        w.count_of("fail_closed", "closed", 3).await,
        3,
        "{}",
        w.log()
    );
    assert_eq!(w.count_of("fail_open", "open", 3).await, 3, "{}", w.log());
    assert!(w.events_of("fail_open").len() <= 2, "{}", w.log());

    // Redis is back, empty and without the script: limits apply again.
    stack.backend.redis.restart();
    let statuses: Vec<u16> = futures_statuses(&url("/closed"), 4).await;
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(stack.origin.hits().await["total"], 2 + 3 + 2);
}

async fn futures_statuses(url: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            send(reqwest::Method::GET, url.to_owned(), IP)
                .await
                .status()
                .as_u16(),
        );
    }
    out
}

#[tokio::test]
async fn a_wrong_token_fails_closed_and_never_leaks() {
    let wrong = "wrong-token-7d1e";
    let stack = Stack::builder(FAIL_MODES).token(wrong).start();
    let worker = &stack.worker;
    let mut seen = String::new();
    for path in ["/open", "/closed"] {
        let r = send(reqwest::Method::GET, format!("{}{path}", worker.url), IP).await;
        let status = r.status();
        seen.push_str(&format!("{:?}", r.headers()));
        seen.push_str(&r.text().await.unwrap());
        assert_eq!(
            status,
            if path == "/open" {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            }
        );
    }
    let log = wait_for_log(worker, "rejected the token", 1).await;
    assert!(log.contains("rejected the token"), "{log}");
    for secret in [wrong, TOKEN] {
        assert!(!seen.contains(secret), "a response carried the token");
        assert!(!log.contains(secret), "the log carried the token:\n{log}");
    }
}

#[tokio::test]
async fn a_bad_configuration_answers_500_and_logs_the_field() {
    let bad = MULTI.replace("[\"1m\", 3, \"1s\"]", "[\"1m\", 3, \"7s\"]");
    let stack = Stack::start(&bad);
    let worker = &stack.worker;
    let r = send(reqwest::Method::POST, format!("{}/login", worker.url), IP).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(header(&r, "Content-Type"), Some("application/problem+json"));
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("edge-limiter is misconfigured"));
    let log = wait_for_log(worker, "field `windows[0].precision`", 1).await;
    assert!(
        log.contains("rule `login`, field `windows[0].precision`: must divide the duration evenly"),
        "{log}"
    );
    assert_eq!(stack.origin.hits().await["total"], 0);
}
