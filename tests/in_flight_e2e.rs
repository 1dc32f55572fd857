//! The in-flight limit end to end in `wrangler dev` (issue 46): the origin,
//! counting for itself, never holds more of a key's requests at once than
//! the limit, through one instance or two on one Redis; a slot comes back
//! when the body has been delivered, when the client hangs up and when the
//! origin fetch fails; and one whose worker is killed mid-answer is free
//! after `hold_for`.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use reqwest::StatusCode;
use support::{header, worker::Stack};

const IN_FLIGHT: &str = r#"
[[vars.LIMITER.rules]]
name = "slots"
key = ["ip"]
algorithm = "concurrency"
limit = 4
hold_for = "30s"
"#;

/// What the origin counted of `path`: the most it held at once, and now.
async fn held(stack: &Stack, path: &str) -> (u64, u64) {
    let url = format!("{}/__origin/held?path={path}", stack.origin.url);
    let v = support::json_of(support::http().get(url)).await;
    (v["most"].as_u64().unwrap(), v["now"].as_u64().unwrap())
}

/// A request from `ip`, its body read to the end; its status.
async fn fetch_whole(url: &str, ip: &str) -> StatusCode {
    let r = support::http()
        .get(url)
        .header("CF-Connecting-IP", ip)
        .send()
        .await
        .expect("the worker answers");
    let status = r.status();
    r.bytes().await.expect("the body arrives");
    status
}

/// Waits until the origin holds none of `path` and the releases have run.
async fn settle(stack: &Stack, path: &str) {
    for _ in 0..100 {
        if held(stack, path).await.1 == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The release runs in the background once the body has gone; a
    // denied client is answered from the isolate's memory for its
    // Retry-After (1 s).
    tokio::time::sleep(Duration::from_millis(1200)).await;
}

/// 64 slow requests at once from one client, then again: the origin never
/// holds more than 4, every denial is a 429 with the headers, and the
/// slots come back when the bodies end.
async fn sixty_four_at_once(stack: &Stack, urls: &[String], path: &str) {
    for round in 0..2 {
        let sent = (0..64).map(|i| {
            let url = urls[i % urls.len()].clone();
            async move {
                let r = support::http()
                    .get(format!("{url}{path}?drip=400"))
                    .header("CF-Connecting-IP", "198.51.100.9")
                    .send()
                    .await
                    .expect("the worker answers");
                let status = r.status();
                let limit = header(&r, "RateLimit").map(str::to_owned);
                let retry = header(&r, "Retry-After").map(str::to_owned);
                r.bytes().await.expect("the body arrives");
                (status, limit, retry)
            }
        });
        let answered = join_all(sent).await;
        let ok = answered.iter().filter(|a| a.0 == StatusCode::OK).count();
        let denied: Vec<_> = answered
            .iter()
            .filter(|a| a.0 == StatusCode::TOO_MANY_REQUESTS)
            .collect();
        assert_eq!(ok + denied.len(), 64, "round {round}: {answered:?}");
        let log: String = (stack.worker.log().lines())
            .filter(|l| !l.contains("[wrangler:info] GET"))
            .collect::<Vec<_>>()
            .join("\n");
        let tail = &log[log.len().saturating_sub(3000)..];
        assert!(
            ok >= 4,
            "round {round}: {ok} admitted; the worker's log ends:\n{tail}"
        );
        for (_, limit, retry) in &denied {
            assert_eq!(retry.as_deref(), Some("1"), "{answered:?}");
            assert!(limit.as_deref().is_some_and(|l| l.contains("r=0")));
        }
        let (most, now) = held(stack, path).await;
        assert!(most <= 4, "round {round}: the origin held {most} at once");
        assert_eq!(now, 0);
        settle(stack, path).await;
    }
    // Every slot came back: four more are admitted at once.
    let again: Vec<String> = (0..4)
        .map(|i| format!("{}{path}", urls[i % urls.len()]))
        .collect();
    let answered = join_all(again.iter().map(|url| fetch_whole(url, "198.51.100.9"))).await;
    assert!(
        answered.iter().all(|s| *s == StatusCode::OK),
        "{answered:?}"
    );
}

#[tokio::test]
async fn the_origin_never_holds_more_than_the_limit() {
    let stack = Stack::start(IN_FLIGHT);
    sixty_four_at_once(&stack, std::slice::from_ref(&stack.worker.url), "/held/one").await;
}

#[tokio::test]
async fn two_instances_on_one_redis_share_the_limit() {
    let stack = Stack::builder(IN_FLIGHT).instances(2).start();
    let urls = [stack.worker.url.clone(), stack.others[0].url.clone()];
    sixty_four_at_once(&stack, &urls, "/held/two").await;
}

#[tokio::test]
async fn a_slot_comes_back_on_hang_up_and_on_origin_failure() {
    let stack = Stack::start(IN_FLIGHT.replace("limit = 4", "limit = 1").as_str());
    let url = format!("{}/held/cut", stack.worker.url);
    // The client goes away while the body is still coming, a byte every
    // 100 ms for 20 s: workerd finds it gone at the next byte (in
    // production the request's signal tells it at once).
    let r = support::http()
        .get(format!("{url}?trickle=20000"))
        .header("CF-Connecting-IP", "198.51.100.10")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let busy = fetch_whole(&url, "198.51.100.10").await;
    assert_eq!(busy, StatusCode::TOO_MANY_REQUESTS, "the one slot is held");
    drop(r);
    // Its slot comes back long before the body would have ended.
    let back = async {
        while fetch_whole(&url, "198.51.100.10").await != StatusCode::OK {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), back)
        .await
        .expect("the slot is back within 5 s of the hang-up");
    settle(&stack, "/held/cut").await;
    // The origin hangs up unanswered: the fetch fails, the slot comes back.
    let failed = fetch_whole(&format!("{url}?hangup=1"), "198.51.100.10").await;
    assert!(failed.is_server_error(), "{failed}");
    settle(&stack, "/held/cut").await;
    assert_eq!(fetch_whole(&url, "198.51.100.10").await, StatusCode::OK);
}

#[tokio::test]
async fn a_slot_whose_release_never_comes_is_free_after_hold_for() {
    let rules = IN_FLIGHT
        .replace("limit = 4", "limit = 1")
        .replace("\"30s\"", "\"2s\"");
    let mut stack = Stack::builder(&rules).instances(2).start();
    let doomed = stack.others.pop().expect("a second worker");
    let ip = "198.51.100.11";
    // The second worker takes the one slot for a slow answer, then is
    // killed before the answer ends: nothing will ever release the slot.
    let slow = support::http()
        .get(format!("{}/held/evicted?drip=20000", doomed.url))
        .header("CF-Connecting-IP", ip)
        .send();
    let slow = tokio::spawn(slow);
    let url = format!("{}/held/evicted", stack.worker.url);
    let at_origin = async {
        while held(&stack, "/held/evicted").await.1 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), at_origin)
        .await
        .expect("the slow request reaches the origin");
    assert_eq!(fetch_whole(&url, ip).await, StatusCode::TOO_MANY_REQUESTS);
    let taken = std::time::Instant::now();
    drop(doomed);
    let _ = slow.await;
    // Denied until hold_for (2 s) has passed since the slot was taken,
    // then admitted. The denial above is answered from memory for a
    // second: a slot freed at the kill would show as about 1 s.
    let back = async {
        while fetch_whole(&url, ip).await != StatusCode::OK {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(6), back)
        .await
        .expect("the slot is free after hold_for");
    let waited = taken.elapsed();
    assert!(
        waited >= Duration::from_millis(1500),
        "free after {waited:?}"
    );
}
