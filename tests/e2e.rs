//! End to end: real HTTP to the worker in `wrangler dev`, limiting through
//! the REST endpoint and a real redis-server, in front of the demo origin.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use reqwest::StatusCode;
use support::{header, worker::Stack};

const PER_IP: &str = r#"
[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 3
"#;

async fn get(client: &reqwest::Client, url: &str, ip: &str) -> reqwest::Response {
    client
        .get(url)
        .header("CF-Connecting-IP", ip)
        .header("X-Forwarded-For", "192.0.2.200")
        .send()
        .await
        .expect("the worker answers")
}

#[tokio::test]
async fn requests_beyond_the_burst_get_429_and_never_reach_the_origin() {
    let stack = Stack::start(PER_IP);
    let client = support::http();
    let url = format!("{}/page", stack.worker.url);

    for i in 0..3u32 {
        let r = get(&client, &url, "203.0.113.10").await;
        assert_eq!(
            r.status(),
            StatusCode::OK,
            "request {i}; log:\n{}",
            stack.worker.log()
        );
        assert_eq!(header(&r, "RateLimit-Policy"), Some("\"per-ip\";q=3;w=180"));
        assert_eq!(
            header(&r, "RateLimit").map(str::to_owned),
            Some(format!("\"per-ip\";r={};t={}", 2 - i, 60 * (i + 1)))
        );
        assert_eq!(
            header(&r, "X-Demo-Origin"),
            Some("1"),
            "the origin's own headers are kept"
        );
        assert!(r
            .text()
            .await
            .unwrap()
            .starts_with("hello from the demo origin: GET /page"));
    }
    for _ in 0..4 {
        let r = get(&client, &url, "203.0.113.10").await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        // One unit frees up a minute after the first request: 60 s minus the
        // few ms this test took, rounded up.
        assert_eq!(header(&r, "Retry-After"), Some("60"));
        assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("0"));
        assert_eq!(header(&r, "Content-Type"), Some("application/problem+json"));
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["policy"], "per-ip");
        assert_eq!(body["status"], 429);
    }
    // Another client has its own budget; X-Forwarded-For (the same on every
    // request above) does not merge the two.
    assert_eq!(
        get(&client, &url, "203.0.113.11").await.status(),
        StatusCode::OK
    );

    let hits = stack.origin.hits().await;
    assert_eq!(
        hits["total"], 4,
        "the origin saw exactly the admitted requests: {hits}"
    );
}

#[tokio::test]
async fn requests_outside_every_rule_pass_without_headers() {
    let rules = PER_IP.replace("burst = 3", "burst = 3\npath_prefix = \"/api\"");
    let stack = Stack::start(&rules);
    let client = support::http();
    for _ in 0..5 {
        let r = get(
            &client,
            &format!("{}/static/app.js", stack.worker.url),
            "203.0.113.12",
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "RateLimit"), None);
    }
    assert_eq!(stack.origin.hits().await["total"], 5);
}
