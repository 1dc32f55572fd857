//! The cost the origin reports, end to end in `wrangler dev` (issue 46):
//! a rule's `cost` is charged up front as the estimate, and once the
//! response has gone the difference the `cost_header` reports is settled
//! in the background: given back, or charged into debt, so that the client
//! is denied until it is paid off. A value that is no cost leaves the
//! estimate standing, and one log line a minute says so.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use reqwest::StatusCode;
use support::{header, worker::Stack};

/// 100 units an hour (one per 36 s: nothing refills within a test), each
/// request estimated at 10.
const REPORTED: &str = r#"
[[vars.LIMITER.rules]]
name = "tokens"
key = ["ip"]
algorithm = "gcra"
rate = 100
period = "1h"
burst = 100
cost = 10
cost_header = "X-Cost"
"#;

/// A request from `ip` whose response reports `cost` (none: no header);
/// its status, the units its `RateLimit` header says are left, and its
/// `Retry-After`.
async fn send(stack: &Stack, ip: &str, cost: Option<&str>) -> (StatusCode, u64, Option<u64>) {
    let query = cost.map_or(String::new(), |c| format!("?header=X-Cost:{c}"));
    let r = support::http()
        .get(format!("{}/api{query}", stack.worker.url))
        .header("CF-Connecting-IP", ip)
        .send()
        .await
        .expect("the worker answers");
    let left = header(&r, "RateLimit")
        .and_then(|v| v.split(";r=").nth(1))
        .and_then(|v| v.split(';').next())
        .and_then(|v| v.parse().ok())
        .expect("a RateLimit header");
    let retry = header(&r, "Retry-After").and_then(|v| v.parse().ok());
    (r.status(), left, retry)
}

/// Lets the settlement after the last response land.
async fn settled() {
    tokio::time::sleep(Duration::from_millis(400)).await;
}

#[tokio::test]
async fn more_than_the_estimate_goes_into_debt_and_less_is_given_back() {
    let stack = Stack::start(REPORTED);
    let ip = "198.51.100.50";
    // 10 up front, 60 reported: 50 more.
    assert_eq!(send(&stack, ip, Some("60")).await.0, StatusCode::OK);
    settled().await;
    // 10 up front on 60: 30 left; the response says 10, as estimated.
    let (status, left, _) = send(&stack, ip, Some("10")).await;
    assert_eq!((status, left), (StatusCode::OK, 30));
    settled().await;
    // 10 on 70, then 45 reported: 35 more, 115 of 100, in debt.
    assert_eq!(send(&stack, ip, Some("45")).await.0, StatusCode::OK);
    settled().await;
    let (status, left, retry) = send(&stack, ip, Some("10")).await;
    assert_eq!((status, left), (StatusCode::TOO_MANY_REQUESTS, 0));
    // 10 more on 115 would end at 125: 25 units past the burst, 900 s.
    assert!(retry.is_some_and(|s| (895..=900).contains(&s)), "{retry:?}");

    let ip = "198.51.100.51";
    // 10 up front, 0 reported: all of it back.
    assert_eq!(send(&stack, ip, Some("0")).await.1, 90);
    settled().await;
    assert_eq!(send(&stack, ip, Some("10")).await.1, 90);
}

#[tokio::test]
async fn a_value_that_is_no_cost_leaves_the_estimate_and_is_logged_once() {
    let stack = Stack::start(REPORTED);
    let ip = "198.51.100.52";
    let mut left = vec![];
    for bad in [
        None,
        Some("-5"),
        Some("2.5"),
        Some("101"),
        Some("99999999999999999999"),
        Some("ten"),
    ] {
        left.push(send(&stack, ip, bad).await.1);
        settled().await;
    }
    // Each charged its estimate, none settled: 10 less each time.
    assert_eq!(left, [90, 80, 70, 60, 50, 40]);
    let lines = stack.worker.events_of("cost_ignored");
    // Six within a minute, one line (two if the minute turned meanwhile).
    assert!((1..=2).contains(&lines.len()), "{lines:?}");
    assert_eq!(lines[0]["rule"], "tokens");
}

#[tokio::test]
async fn settlements_of_requests_at_once_add_up() {
    let stack = Stack::start(&REPORTED.replace("cost = 10", "cost = 1"));
    let ip = "198.51.100.53";
    // Ten at once, each estimated at 1 and reporting 3.
    let sent = (0..10).map(|_| send(&stack, ip, Some("3")));
    let answered = join_all(sent).await;
    assert!(
        answered.iter().all(|a| a.0 == StatusCode::OK),
        "{answered:?}"
    );
    settled().await;
    // 30 spent, and this one's 1.
    assert_eq!(send(&stack, ip, Some("1")).await.1, 69);
}

/// docs/rules.md's example, run: what each response's `RateLimit` says.
#[tokio::test]
async fn the_documented_example_answers_as_the_page_says() {
    let stack = Stack::start(&support::documented_rule("## The cost the origin reports"));
    let mut left = vec![];
    for cost in ["3000", "500", "9000"] {
        let r = support::http()
            .get(format!(
                "{}/v1/chat?header=X-Tokens:{cost}",
                stack.worker.url
            ))
            .header("CF-Connecting-IP", "198.51.100.54")
            .header("authorization", "Bearer k1")
            .send()
            .await
            .expect("the worker answers");
        assert_eq!(r.status(), StatusCode::OK);
        left.push(header(&r, "RateLimit").unwrap().to_owned());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let shown: Vec<&str> = left
        .iter()
        .map(|l| l.split(";t=").next().unwrap())
        .collect();
    assert_eq!(
        shown,
        [
            "\"tokens\";r=19500",
            "\"tokens\";r=16500",
            "\"tokens\";r=16000"
        ]
    );
}
