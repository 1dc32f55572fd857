//! The policy vocabulary of edge rate-limiting rules, end to end in
//! `wrangler dev`: each field beside a rule without it, so that every test
//! fails without the field. `count_status` (charged up front and given
//! back after the response when the status is not counted, also under
//! concurrency and a Redis fault), `penalty` (also under 64-way concurrency, and
//! in a shadow rule), `except_ips`, `cf:*` key parts, body key parts
//! (`json:`, `form:`, with `fold`, a 10 MB body and hostile JSON), and the
//! JSON decision log.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::time::{Duration, Instant};

use edge_limiter_local::fault_proxy::Fault;
use reqwest::{Response, StatusCode};
use serde_json::Value;
use support::{
    header,
    report::Table,
    worker::{Stack, Worker},
    Backend,
};

fn client() -> reqwest::Client {
    support::http()
}

async fn get(url: &str, ip: &str) -> Response {
    client()
        .get(url)
        .header("CF-Connecting-IP", ip)
        .send()
        .await
        .expect("the worker answers")
}

async fn post(url: &str, ip: &str, content_type: &str, body: Vec<u8>) -> Response {
    client()
        .post(url)
        .header("CF-Connecting-IP", ip)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("the worker answers")
}

/// Events of `action` under `rule`, once there are at least `n` (wrangler
/// prints asynchronously), or after 10 s.
async fn wait_events(worker: &Worker, action: &str, rule: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found: Vec<Value> = worker
            .events()
            .into_iter()
            .filter(|e| e["action"] == action && e["rule"] == rule)
            .collect();
        if found.len() >= n || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the refunds the worker queued have landed: a successful
/// login's charge is given back once its response has gone.
async fn settle_charges() {
    tokio::time::sleep(Duration::from_millis(400)).await;
}

// ----------------------------------------------------------- count_status

const LOGIN: &str = r#"
[[vars.LIMITER.rules]]
name = "failed-logins"
key = ["ip"]
path_prefix = "/login"
methods = ["POST"]
algorithm = "windowed"
windows = [["15m", 3, "1m"]]
count_status = [401, 403]

[[vars.LIMITER.rules]]
name = "every-login"
key = ["ip"]
path_prefix = "/every-login"
methods = ["POST"]
algorithm = "windowed"
windows = [["15m", 3, "1m"]]
"#;

#[tokio::test]
async fn count_status_keeps_only_the_listed_statuses_charged() {
    let stack = Stack::start(LOGIN);
    let url = |path: &str| format!("{}{path}", stack.worker.url);
    let ip = "203.0.113.60";
    let statuses = |v: Vec<Response>| v.iter().map(|r| r.status().as_u16()).collect::<Vec<_>>();
    let mut sent = Vec::new();

    // Successful logins are charged up front and given back once the origin
    // has answered, so the rule with count_status keeps none of them...
    for _ in 0..6 {
        sent.push(post(&url("/login?status=200"), ip, "text/plain", vec![]).await);
        settle_charges().await;
    }
    assert_eq!(statuses(std::mem::take(&mut sent)), [200; 6]);
    // ...while the same rule without it counts every one.
    for _ in 0..5 {
        sent.push(post(&url("/every-login?status=200"), ip, "text/plain", vec![]).await);
    }
    assert_eq!(
        statuses(std::mem::take(&mut sent)),
        [200, 200, 200, 429, 429]
    );

    // Failed logins reach the origin and keep their charge; once three
    // are counted, the next is refused before the origin.
    for _ in 0..3 {
        sent.push(post(&url("/login?status=401"), ip, "text/plain", vec![]).await);
    }
    sent.push(post(&url("/login?status=401"), ip, "text/plain", vec![]).await);
    sent.push(post(&url("/login?status=200"), ip, "text/plain", vec![]).await);
    assert_eq!(statuses(sent), [401, 401, 401, 429, 429]);
    let hits = stack.origin.hits().await;
    assert_eq!(
        hits["paths"]["/login"],
        6 + 3,
        "refused logins never reached the origin: {hits}"
    );
}

/// One POST to `url` from each of `ips`, all at once; the statuses.
async fn at_once(url: &str, ips: impl Iterator<Item = String>) -> Vec<StatusCode> {
    let handles: Vec<_> = ips
        .map(|ip| {
            let url = url.to_owned();
            tokio::spawn(async move { post(&url, &ip, "text/plain", vec![]).await.status() })
        })
        .collect();
    let mut statuses = Vec::new();
    for h in handles {
        statuses.push(h.await.unwrap());
    }
    statuses
}

/// Loads the script with one request to `url` from an address of its
/// own, then slows every REST reply to `ROUND_TRIP`; the script calls
/// made so far.
async fn slowed(stack: &Stack, url: &str) -> usize {
    let warm = post(url, "192.0.2.250", "text/plain", vec![]).await;
    assert_ne!(warm.status(), StatusCode::TOO_MANY_REQUESTS);
    let proxy = stack.proxy.as_ref().expect("a proxy");
    assert!(proxy.wait_idle(Duration::from_secs(10)), "calls still held");
    proxy.set(Fault::DelayReply(ROUND_TRIP));
    stack.script_calls()
}

/// How long a REST reply takes in the 64-way tests: the whole burst
/// arrives while the first request's call is out.
const ROUND_TRIP: Duration = Duration::from_millis(300);

/// Units `ip` has left on the failed-logins rule, by a peek.
async fn logins_left(stack: &Stack, ip: &str) -> u64 {
    let rule = &support::rules(serde_json::json!([{
        "name": "failed-logins", "key": ["ip"], "path_prefix": "/login", "methods": ["POST"],
        "algorithm": "windowed", "windows": [["15m", 3, "1m"]], "count_status": [401, 403]
    }]))[0];
    stack.backend.decide(&[rule], ip, 0, None).await.rules[0].remaining
}

#[tokio::test]
async fn concurrent_failures_reach_the_origin_at_most_the_limit() {
    // Charged up front, requests in flight count: N failed logins at once
    // on a fresh limit of L reach the origin exactly L times, whatever N;
    // Redis a round trip away, so that those that come while the first
    // call is out are decided together by one call (issue 32).
    let stack = Stack::builder(LOGIN).through_fault_proxy().start();
    let url = format!("{}/login?status=403", stack.worker.url);
    let (limit, n) = (3u64, 64u64);
    let ip = "203.0.113.61";
    let calls = slowed(&stack, &url).await;
    let statuses = at_once(&url, (0..n).map(|_| ip.to_owned())).await;
    let calls = stack.script_calls() - calls;
    let admitted = statuses
        .iter()
        .filter(|s| **s == StatusCode::FORBIDDEN)
        .count() as u64;
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count() as u64;
    assert_eq!((admitted, refused), (limit, n - limit), "{statuses:?}");
    let hits = stack.origin.hits().await["paths"]["/login"].as_u64();
    assert_eq!(
        hits,
        Some(limit + 1),
        "refused ones never reached the origin"
    );
    assert!(calls as u64 * 4 <= n, "{calls} calls: few decided together");
    stack.proxy.as_ref().unwrap().set(Fault::Pass);
    settle_charges().await;
    assert_eq!(
        logins_left(&stack, ip).await,
        0,
        "the failures stay counted"
    );
    let later = post(&url, ip, "text/plain", vec![]).await;
    assert_eq!(later.status(), StatusCode::TOO_MANY_REQUESTS);
    let mut table = Table::new(
        "count_status: concurrent failed logins on a fresh limit",
        &[
            "limit L",
            "at once N",
            "REST calls",
            "reached the origin",
            "units left after",
            "later ones",
        ],
    );
    table.row(vec![
        limit.to_string(),
        n.to_string(),
        calls.to_string(),
        admitted.to_string(),
        "0".into(),
        "429".into(),
    ]);
    table.print("count-status-concurrency");
}

#[tokio::test]
async fn successful_logins_all_reach_the_origin_and_leave_the_limit_whole() {
    let stack = Stack::start(LOGIN);
    let ok = format!("{}/login?status=200", stack.worker.url);
    // 64 clients at once, one login each.
    let ips: Vec<String> = (0..64).map(|i| format!("198.51.100.{}", i + 100)).collect();
    let statuses = at_once(&ok, ips.iter().cloned()).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    // One client, 64 logins in waves of its limit: each wave's charges are
    // given back before the next.
    let ip = "203.0.113.64";
    for _ in 0..64 / 4 {
        let wave = at_once(&ok, (0..3).map(|_| ip.to_owned())).await;
        assert!(wave.iter().all(|s| *s == StatusCode::OK), "{wave:?}");
        settle_charges().await;
    }
    let hits = stack.origin.hits().await["paths"]["/login"].as_u64();
    assert_eq!(
        hits,
        Some(64 + 64 / 4 * 3),
        "every login reached the origin"
    );
    settle_charges().await;
    assert_eq!(logins_left(&stack, ip).await, 3, "the full limit");
    for ip in &ips[..4] {
        assert_eq!(logins_left(&stack, ip).await, 3, "{ip}: the full limit");
    }
}

#[tokio::test]
async fn failed_and_successful_logins_mixed_in_either_order() {
    let stack = Stack::start(LOGIN);
    let url = |status: u16| format!("{}/login?status={status}", stack.worker.url);
    let send = |status: u16, ip: &'static str| {
        let url = url(status);
        async move {
            let got = post(&url, ip, "text/plain", vec![]).await.status().as_u16();
            settle_charges().await;
            got
        }
    };
    // Successes first: none counts, then three failures fill the limit.
    let mut got = Vec::new();
    for status in [200, 200, 200, 200, 401, 401, 401, 401, 200] {
        got.push(send(status, "203.0.113.70").await);
    }
    assert_eq!(got, [200, 200, 200, 200, 401, 401, 401, 429, 429]);
    // Failures first, successes between them: only the failures count.
    let mut got = Vec::new();
    for status in [401, 200, 401, 200, 200, 401, 200] {
        got.push(send(status, "203.0.113.71").await);
    }
    assert_eq!(got, [401, 200, 401, 200, 200, 401, 429]);
}

#[tokio::test]
async fn a_refund_held_past_the_budget_delays_nothing_and_only_tightens() {
    let stack = Stack::builder(LOGIN).through_fault_proxy().start();
    let (worker, proxy) = (&stack.worker, stack.proxy.as_ref().unwrap());
    // A first request loads the script, so that the timed one's up-front
    // decision takes milliseconds.
    let warm = post(
        &format!("{}/login", worker.url),
        "203.0.113.63",
        "text/plain",
        vec![],
    )
    .await;
    assert_eq!(warm.status(), StatusCode::OK);
    let url = format!("{}/login?status=200&delay=400", worker.url);
    let request = tokio::spawn(async move {
        let started = Instant::now();
        let r = post(&url, "203.0.113.62", "text/plain", vec![]).await;
        (r.status(), started.elapsed())
    });
    // The up-front decision charges; while the origin takes its time, Redis
    // becomes slow: the refund is held 3 s, past the rule's 1 s budget. A
    // response that waited for it would take 1.4 s at least (400 ms at the
    // origin, then the budget).
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set(Fault::Delay(Duration::from_secs(3)));
    let (status, took) = request.await.unwrap();
    assert_eq!(status, StatusCode::OK, "the origin's answer arrived");
    assert!(
        took < Duration::from_millis(1400),
        "the response waited for the refund: {took:?}"
    );
    let failed = wait_events(worker, "refund_failed", "failed-logins", 1).await;
    assert_eq!(failed.len(), 1, "{}", worker.log());
    assert_eq!(failed[0]["status"], 200);
    assert_eq!(
        failed[0]["error"], "the Redis REST endpoint did not answer within 1000 ms",
        "the refund timed out at the rule's budget"
    );
    assert_eq!(failed[0]["key"], "el:{203.0.113.62}:failed-logins");
    // The lost refund leaves the charge counted: tighter, never looser.
    proxy.set(Fault::Pass);
    assert_eq!(logins_left(&stack, "203.0.113.62").await, 2);
}

// ---------------------------------------------------------------- penalty

const PENALTY: &str = r#"
[[vars.LIMITER.rules]]
name = "with-penalty"
key = ["ip"]
path_prefix = "/p"
algorithm = "gcra"
rate = 1
period = "1s"
burst = 2
penalty = "3s"

[[vars.LIMITER.rules]]
name = "without-penalty"
key = ["ip"]
path_prefix = "/n"
algorithm = "gcra"
rate = 1
period = "1s"
burst = 2

[[vars.LIMITER.rules]]
name = "shadow-penalty"
key = ["ip"]
path_prefix = "/s"
algorithm = "gcra"
rate = 1
period = "1s"
burst = 2
penalty = "3s"
mode = "shadow"
"#;

#[tokio::test]
async fn a_penalty_holds_a_client_for_its_whole_length_and_no_longer() {
    let stack = Stack::start(PENALTY);
    let url = |path: &str| format!("{}{path}", stack.worker.url);
    let ip = "203.0.113.70";
    for path in ["/p", "/n"] {
        assert_eq!(get(&url(path), ip).await.status(), StatusCode::OK);
        assert_eq!(get(&url(path), ip).await.status(), StatusCode::OK);
        let denied = get(&url(path), ip).await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        let expected = if path == "/p" { "3" } else { "1" };
        assert_eq!(header(&denied, "Retry-After"), Some(expected), "{path}");
    }
    let key = "el:{203.0.113.70}:with-penalty:p";
    let pttl = |b: &Backend| b.redis(&["PTTL", key]).parse::<i64>().unwrap();
    let started = pttl(&stack.backend);
    assert!(
        (2_500..=3_000).contains(&started),
        "penalty key lives {started} ms"
    );
    // A second later the rate allows a request again: without a penalty it
    // is admitted, with one it is still denied, Retry-After counting down.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(get(&url("/n"), ip).await.status(), StatusCode::OK);
    let held = get(&url("/p"), ip).await;
    assert_eq!(held.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&held, "Retry-After"), Some("2"));
    // Requests during the penalty never extend it.
    for _ in 0..5 {
        get(&url("/p"), ip).await;
    }
    assert!(
        pttl(&stack.backend) < started - 1000,
        "the penalty was extended"
    );
    // Once it has run out, the client is admitted again.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(get(&url("/p"), ip).await.status(), StatusCode::OK);
    assert_eq!(
        pttl(&stack.backend),
        -2,
        "the penalty key expired by itself"
    );
    let starts = wait_events(&stack.worker, "penalty_start", "with-penalty", 1).await;
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0]["retry_after"], 3);
    assert_eq!(starts[0]["key"], key);
}

/// A shadow rule's penalty runs as an enforced one would, blocking nothing:
/// its log shows what enforcing it would deny, penalty included.
#[tokio::test]
async fn a_shadow_penalty_reports_would_deny_for_its_length_and_blocks_nothing() {
    let stack = Stack::start(PENALTY);
    let url = format!("{}/s", stack.worker.url);
    let ip = "203.0.113.72";
    for _ in 0..3 {
        assert_eq!(get(&url, ip).await.status(), StatusCode::OK);
    }
    let key = "el:{203.0.113.72}:shadow-penalty:p";
    let pttl = |b: &Backend| b.redis(&["PTTL", key]).parse::<i64>().unwrap();
    assert!((2_500..=3_000).contains(&pttl(&stack.backend)));
    let starts = wait_events(&stack.worker, "would_penalty_start", "shadow-penalty", 1).await;
    assert_eq!(starts.len(), 1, "{}", stack.worker.log());
    assert_eq!(starts[0]["retry_after"], 3);
    assert_eq!(
        starts[0]["status"],
        Value::Null,
        "the client was not refused"
    );
    // The rate allows a request again, the penalty does not: would-deny,
    // counting the penalty down, and still forwarded.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(get(&url, ip).await.status(), StatusCode::OK);
    let would = wait_events(&stack.worker, "would_deny", "shadow-penalty", 2).await;
    assert_eq!(would.len(), 2, "{}", stack.worker.log());
    assert_eq!(would[1]["retry_after"], 2);
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(
        pttl(&stack.backend),
        -2,
        "the penalty key expired by itself"
    );
    assert_eq!(get(&url, ip).await.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let would_deny = |e: &Value| e["action"] == "would_deny" && e["rule"] == "shadow-penalty";
    let after = stack.worker.events().into_iter().filter(would_deny).count();
    assert_eq!(after, 2, "admitted once the penalty ended");
    assert!(stack
        .worker
        .events()
        .iter()
        .all(|e| e["action"] != "deny" && e["action"] != "penalty_start"));
}

#[tokio::test]
async fn sixty_four_at_once_start_exactly_one_penalty() {
    // Redis a round trip away: those that come while the first call is
    // out are decided together by one call (issue 32).
    let stack = Stack::builder(PENALTY).through_fault_proxy().start();
    let url = format!("{}/p", stack.worker.url);
    let ip = "203.0.113.71";
    let calls = slowed(&stack, &url).await;
    let handles: Vec<_> = (0..64)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { get(&url, ip).await.status() })
        })
        .collect();
    let mut admitted = 0;
    for h in handles {
        if h.await.unwrap() == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2, "the burst, and nothing more");
    let calls = stack.script_calls() - calls;
    let starts = wait_events(&stack.worker, "penalty_start", "with-penalty", 1).await;
    let denials = stack.worker.count_of("deny", "with-penalty", 62).await;
    let lines = stack.worker.events_of("deny").len();
    let mut table = Table::new(
        "penalty: 64 requests at once from one client (burst 2, penalty 3 s)",
        &[
            "REST calls",
            "admitted",
            "denied",
            "deny lines",
            "penalty starts",
        ],
    );
    table.row(vec![
        calls.to_string(),
        admitted.to_string(),
        denials.to_string(),
        lines.to_string(),
        starts.len().to_string(),
    ]);
    table.print("penalty-concurrency");
    assert_eq!(starts.len(), 1, "{}", stack.worker.log());
    assert_eq!(denials, 62);
    assert!(
        lines <= 3,
        "{lines} lines for one client's denials within a second"
    );
    assert!(calls * 4 <= 64, "{calls} calls: few decided together");
}

// ------------------------------------------------------------- except_ips

#[tokio::test]
async fn exempt_addresses_are_not_subject_to_the_rule() {
    let rules = r#"
[[vars.LIMITER.rules]]
name = "exempting"
key = ["ip"]
path_prefix = "/e"
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
except_ips = ["10.0.0.0/8", "2001:db8::/32"]

[[vars.LIMITER.rules]]
name = "everyone"
key = ["ip"]
path_prefix = "/a"
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
"#;
    let stack = Stack::start(rules);
    let url = |path: &str| format!("{}{path}", stack.worker.url);
    for ip in ["10.1.2.3", "2001:db8::7"] {
        for _ in 0..3 {
            let r = get(&url("/e"), ip).await;
            assert_eq!(r.status(), StatusCode::OK, "{ip}");
            assert_eq!(header(&r, "RateLimit"), None, "{ip} was decided");
        }
        assert_eq!(get(&url("/a"), ip).await.status(), StatusCode::OK);
        assert_eq!(
            get(&url("/a"), ip).await.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(get(&url("/e"), "11.0.0.1").await.status(), StatusCode::OK);
    assert_eq!(
        get(&url("/e"), "11.0.0.1").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let keys = stack.backend.redis(&["KEYS", "el:*:exempting"]);
    assert_eq!(
        keys.lines().count(),
        1,
        "exempt clients made no Redis call: {keys}"
    );
}

// -------------------------------------------------------------- cf facts

#[tokio::test]
async fn edge_facts_key_clients() {
    let rules = r#"
[[vars.LIMITER.rules]]
name = "per-country"
key = ["cf:country"]
path_prefix = "/c"
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1

[[vars.LIMITER.rules]]
name = "per-ja4"
key = ["cf:ja4", "cf:asn"]
path_prefix = "/j"
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1

[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
path_prefix = "/i"
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1

[[vars.LIMITER.rules]]
name = "per-colo"
key = ["cf:colo"]
path_prefix = "/dc"
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1

[[vars.LIMITER.rules]]
name = "per-continent"
key = ["cf:continent"]
path_prefix = "/ct"
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
"#;
    let stack = Stack::start(rules);
    let url = |path: &str| format!("{}{path}", stack.worker.url);
    // Two addresses in one country share its bucket; keyed by address, not.
    assert_eq!(
        get(&url("/c"), "198.51.100.1").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        get(&url("/c"), "198.51.100.2").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get(&url("/i"), "198.51.100.1").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        get(&url("/i"), "198.51.100.2").await.status(),
        StatusCode::OK
    );
    // No JA4 in wrangler dev (Bot Management): a missing part, shared.
    assert_eq!(
        get(&url("/j"), "198.51.100.3").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        get(&url("/j"), "198.51.100.4").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // The AS number, a number in request.cf, keys as its digits.
    let keys = stack.backend.redis(&["KEYS", "el:*:per-ja4"]);
    let asn = keys
        .trim()
        .strip_suffix("}:per-ja4")
        .and_then(|k| k.rsplit('|').next())
        .unwrap_or_default();
    assert!(
        !asn.is_empty() && asn.bytes().all(|b| b.is_ascii_digit()),
        "the AS number is the bucket's last part: {keys}"
    );
    let keys = stack.backend.redis(&["KEYS", "el:*:per-country"]);
    let key = keys.lines().next().unwrap_or_default().to_owned();
    assert!(
        key.len() > "el:{}:per-country".len() && !key.starts_with("el:{#"),
        "the country is the bucket: {keys}"
    );
    // Two addresses served by one data center, or on one continent, share
    // its bucket; the bucket is the IATA code, or the continent's code.
    for (path, rule, letters) in [("/dc", "per-colo", 3), ("/ct", "per-continent", 2)] {
        assert_eq!(
            get(&url(path), "198.51.100.5").await.status(),
            StatusCode::OK
        );
        assert_eq!(
            get(&url(path), "198.51.100.6").await.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{rule}"
        );
        let keys = stack.backend.redis(&["KEYS", &format!("el:*:{rule}")]);
        let tag = keys
            .trim()
            .strip_prefix("el:{")
            .and_then(|k| k.strip_suffix(&format!("}}:{rule}")))
            .unwrap_or_default();
        assert!(
            tag.len() == letters && tag.bytes().all(|b| b.is_ascii_uppercase()),
            "{rule}: the bucket is the edge's code: {keys}"
        );
    }
}

// ------------------------------------------------------------- body parts

const BODY: &str = r#"
[[vars.LIMITER.rules]]
name = "account"
key = ["json:/username"]
fold = ["json:/username"]
path_prefix = "/account"
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1

[[vars.LIMITER.rules]]
name = "account-exact"
key = ["json:/username"]
path_prefix = "/exact"
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1

[[vars.LIMITER.rules]]
name = "bodies"
key = ["json:/username"]
path_prefix = "/bodies"
algorithm = "gcra"
rate = 1
period = "1h"
burst = 10

[[vars.LIMITER.rules]]
name = "form-user"
key = ["form:user"]
path_prefix = "/form"
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
"#;

fn json(username: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"username": username, "password": "x"})).unwrap()
}

#[tokio::test]
async fn json_and_form_fields_key_clients_folded_when_asked() {
    let stack = Stack::start(BODY);
    let url = |path: &str| format!("{}{path}", stack.worker.url);
    let ct = "application/json";
    // Folded: one account however it is cased or spaced, whatever the address.
    let r = post(&url("/account"), "198.51.100.10", ct, json("Alice@x.com")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = post(&url("/account"), "198.51.100.11", ct, json(" alice@X.com")).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // Without fold, the two spellings are two accounts.
    let r = post(&url("/exact"), "198.51.100.10", ct, json("Alice@x.com")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = post(&url("/exact"), "198.51.100.10", ct, json(" alice@X.com")).await;
    assert_eq!(r.status(), StatusCode::OK);
    // The origin got the admitted body byte for byte.
    let r = post(&url("/exact"), "198.51.100.12", ct, json("bob")).await;
    assert_eq!(
        header(&r, "x-body-sha1"),
        Some(sha1_hex(&json("bob")).as_str())
    );

    // A form field, urlencoded or multipart, is one client however sent.
    let urlencoded = "application/x-www-form-urlencoded";
    let r = post(
        &url("/form"),
        "198.51.100.13",
        urlencoded,
        b"user=carol&x=1".to_vec(),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let multipart =
        b"--B0\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\ncarol\r\n--B0--\r\n"
            .to_vec();
    let r = post(
        &url("/form"),
        "198.51.100.14",
        "multipart/form-data; boundary=B0",
        multipart,
    )
    .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // A form field given twice with different values is refused.
    let r = post(
        &url("/form"),
        "198.51.100.15",
        urlencoded,
        b"user=dave&user=carol".to_vec(),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // So is a JSON member: an origin reading the first would see `bob`,
    // spent above, while the last would be a fresh bucket. The same value
    // twice is still `bob`.
    for (twice, expected) in [
        (
            r#"{"username": "bob", "username": "fresh"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            r#"{"username": "fresh", "username": "bob"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            r#"{"username": "bob", "username": "bob"}"#,
            StatusCode::TOO_MANY_REQUESTS,
        ),
    ] {
        let r = post(&url("/exact"), "198.51.100.16", ct, twice.into()).await;
        assert_eq!(r.status(), expected, "{twice}");
    }

    // A number id is one client however it is written, and the same as
    // its digits sent as a string: JavaScript and Python compare them so.
    let r = post(
        &url("/exact"),
        "198.51.100.17",
        ct,
        br#"{"username": 1e18}"#.into(),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    for spelling in ["1000000000000000000", "1.0e18", r#""1000000000000000000""#] {
        let body = format!(r#"{{"username": {spelling}}}"#);
        let r = post(&url("/exact"), "198.51.100.18", ct, body.into()).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{spelling}");
    }

    // `Username` is `username` to Go and ASP.NET Core, and an array is any
    // of its elements to Laravel and Rails: `erin` spent, each spelling
    // finds her bucket or is refused.
    let r = post(&url("/exact"), "198.51.100.19", ct, json("erin")).await;
    assert_eq!(r.status(), StatusCode::OK);
    for (body, expected) in [
        (r#"{"Username": "erin"}"#, StatusCode::TOO_MANY_REQUESTS),
        (r#"{"username": ["erin"]}"#, StatusCode::TOO_MANY_REQUESTS),
        (
            r#"{"username": "fresh12", "Username": "erin"}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            r#"{"username": ["fresh13", "erin"]}"#,
            StatusCode::BAD_REQUEST,
        ),
        (r#"{"username": [["erin"]]}"#, StatusCode::TOO_MANY_REQUESTS),
        (
            r#"{"username": {"$ne": "fresh15"}}"#,
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let r = post(&url("/exact"), "198.51.100.19", ct, body.into()).await;
        assert_eq!(r.status(), expected, "{body}");
    }
    // `user[]` is the field `user` as an array (PHP, Rack, Express).
    for (body, expected) in [
        ("user[]=carol", StatusCode::TOO_MANY_REQUESTS),
        ("user=fresh14&user[]=carol", StatusCode::BAD_REQUEST),
    ] {
        let r = post(&url("/form"), "198.51.100.19", urlencoded, body.into()).await;
        assert_eq!(r.status(), expected, "{body}");
    }
    // Part headers as PHP and Go read them: folded, single-quoted, RFC
    // 2231; a value Go would decode from quoted-printable is refused.
    for (head, value, expected) in [
        (
            "form-data;\r\n name=\"user\"",
            "carol",
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (
            "form-data; name='user'",
            "carol",
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (
            "form-data; name=\"x\"; name*=UTF-8''user",
            "carol",
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (
            "form-data; name=\"user\"\r\nContent-Transfer-Encoding: quoted-printable",
            "=63arol",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let body = format!("--B1\r\nContent-Disposition: {head}\r\n\r\n{value}\r\n--B1--\r\n");
        let ct = "multipart/form-data; boundary=B1";
        let r = post(&url("/form"), "198.51.100.19", ct, body.into()).await;
        assert_eq!(r.status(), expected, "{head}");
    }
}

#[tokio::test]
async fn large_and_hostile_bodies_are_forwarded_intact_as_missing_parts() {
    let stack = Stack::start(BODY);
    let url = format!("{}/bodies", stack.worker.url);
    let mut table = Table::new(
        "Bodies on a json: rule: forwarded byte for byte, read at most 64 KB",
        &["body", "bytes", "status", "origin got", "same bytes"],
    );
    let big: Vec<u8> = {
        let mut doc = br#"{"username": "big", "pad": ""#.to_vec();
        doc.extend(std::iter::repeat_n(b'a', 10 * 1024 * 1024));
        doc.extend(br#""}"#);
        doc
    };
    let deep = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000)).into_bytes();
    let bad_utf8 = b"{\"username\": \"\xff\xfe\xfd\"}".to_vec();
    let truncated = br#"{"username": "al"#.to_vec();
    let mut failures = Vec::new();
    let first = Instant::now();
    for (label, body) in [
        ("10 MB JSON", big),
        ("nested 200 000 deep", deep),
        ("invalid UTF-8", bad_utf8),
        ("cut short", truncated),
    ] {
        let started = Instant::now();
        let r = post(&url, "198.51.100.20", "application/json", body.clone()).await;
        let status = r.status().as_u16();
        let got = header(&r, "x-body-bytes").unwrap_or("-").to_owned();
        let same = header(&r, "x-body-sha1") == Some(sha1_hex(&body).as_str());
        table.row(vec![
            label.into(),
            body.len().to_string(),
            status.to_string(),
            got.clone(),
            same.to_string(),
        ]);
        if status != 200 || !same || got != body.len().to_string() {
            failures.push(format!("{label}: the origin got {got} bytes, same: {same}"));
        }
        if status >= 500 || started.elapsed() > Duration::from_secs(30) {
            failures.push(format!("{label}: {status} after {:?}", started.elapsed()));
        }
    }
    table.print("hostile-bodies");
    assert!(failures.is_empty(), "{failures:#?}\n{}", stack.worker.log());
    // None had a readable username: all four counted as the one client
    // lacking it.
    let keys = stack.backend.redis(&["KEYS", "el:*:bodies"]);
    assert_eq!(keys.lines().count(), 1, "{keys}");
    let missing = edge_limiter::decision::transport::keys::redis_key("bodies", &[""]);
    assert_eq!(keys.trim(), missing, "a missing part");
    let r = get(&format!("{}/bodies", stack.worker.url), "198.51.100.21").await;
    // Five hours of debt, less what has passed since the first request
    // (a 10 MB upload can take over a second on a busy machine).
    let passed_s = first.elapsed().as_secs();
    let rate_limit = header(&r, "RateLimit").unwrap_or_default();
    let t: u64 = rate_limit
        .strip_prefix("\"bodies\";r=5;t=")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("five units counted: {rate_limit}"));
    assert!(
        (18_000 - passed_s - 1..=18_000).contains(&t),
        "{rate_limit} after {passed_s} s"
    );
}

fn sha1_hex(bytes: &[u8]) -> String {
    sha1_smol::Sha1::from(bytes).digest().to_string()
}

// -------------------------------------------------------- traffic classes

const CLASSES: &str = r#"
[[vars.LIMITER.rules]]
name = "keyed"
with_headers = ["x-api-key"]
key = ["header:x-api-key"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 100

[[vars.LIMITER.rules]]
name = "anonymous"
without_headers = ["x-api-key"]
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
"#;

/// A key header sent empty is no key, as Go's `Header.Get` and Node code
/// read it: such a request is anonymous, not a client of an empty key.
#[tokio::test]
async fn an_empty_key_header_is_anonymous() {
    let stack = Stack::start(CLASSES);
    let url = format!("{}/x", stack.worker.url);
    let with_key = |key: &'static str| {
        client()
            .get(&url)
            .header("CF-Connecting-IP", "198.51.100.30")
            .header("x-api-key", key)
            .send()
    };
    assert_eq!(get(&url, "198.51.100.30").await.status(), StatusCode::OK);
    for empty in ["", " ", ","] {
        let r = with_key(empty).await.expect("the worker answers");
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{empty:?}");
    }
    let keyed = with_key("k1").await.expect("the worker answers");
    assert_eq!(keyed.status(), StatusCode::OK);
}
