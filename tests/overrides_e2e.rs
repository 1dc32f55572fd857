//! Limits changed at runtime (issue 25), end to end: `edge-limiter limit`
//! run as an operator would, beside a worker in `wrangler dev`, reading the
//! worker's own `wrangler.toml` and `.dev.vars`. A client's override, a
//! block and its clearing, a rule-wide override and its expiry, garbage in
//! an override key, two instances seeing the same override, and a rule-wide
//! block held through the REST endpoint failing.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::{
    process::Command,
    time::{Duration, Instant},
};

use edge_limiter::decision::memory::rule_wide::REREAD_MS;
use edge_limiter_local::{fault_proxy::Fault, testenv::Scratch};
use reqwest::StatusCode;
use support::{header, worker::Stack, worker::Worker};

const RULES: &str = r#"
[vars.LIMITER]
cache_hold = "1s"

[[vars.LIMITER.rules]]
name = "api"
key = ["header:x-api-key"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 2
overrides = true

[[vars.LIMITER.rules]]
name = "pages"
path_prefix = "/pages"
key = ["header:x-api-key"]
algorithm = "windowed"
windows = [["1m", 4, "1s"], ["1h", 10, "1m"]]
overrides = true
"#;

async fn get(worker: &Worker, key: &str) -> reqwest::Response {
    get_at(worker, "/api", key).await
}

async fn get_at(worker: &Worker, path: &str, key: &str) -> reqwest::Response {
    support::http()
        .get(format!("{}{path}", worker.url))
        .header("x-api-key", key)
        .header("CF-Connecting-IP", "198.51.100.25")
        .send()
        .await
        .expect("the worker answers")
}

async fn statuses(worker: &Worker, key: &str, n: usize) -> Vec<u16> {
    statuses_at(worker, "/api", key, n).await
}

async fn statuses_at(worker: &Worker, path: &str, key: &str, n: usize) -> Vec<u16> {
    let mut out = vec![];
    for _ in 0..n {
        out.push(get_at(worker, path, key).await.status().as_u16());
    }
    out
}

/// The worker's events of `action` from the `from`th on, once there is
/// one (wrangler prints asynchronously), or after 10 s.
async fn events_from(worker: &Worker, action: &str, from: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events = worker.events_of(action);
        if events.len() > from || Instant::now() > deadline {
            return events.into_iter().skip(from).collect();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `edge-limiter limit ARGS` in the worker's directory, as an operator
/// beside its `wrangler.toml` and `.dev.vars`; its stdout.
fn limit(worker: &Worker, args: &[&str]) -> String {
    let mut all = vec!["limit"];
    all.extend(args);
    operator(worker, &all)
}

/// `edge-limiter ARGS` in the worker's directory; its stdout.
fn operator(worker: &Worker, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_edge-limiter"))
        .args(args)
        .current_dir(&worker.dir)
        .env_remove("UPSTASH_REDIS_REST_URL")
        .env_remove("UPSTASH_REDIS_REST_TOKEN")
        .output()
        .expect("the command runs");
    assert!(out.status.success(), "{args:?}: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains(support::TOKEN), "the token in {text}");
    text
}

/// `limit set` checks the whole rule as `wrangler.toml`'s checks do
/// (issue 31), before it needs any setting: a cost the new figures can
/// never admit, a lease they cannot grant, and a `--for` without its unit
/// or over 366 days are refused, naming the field or option.
#[test]
fn limit_set_checks_the_whole_rule() {
    let dir = Scratch::new("limit-set");
    let rules = r#"
[[vars.LIMITER.rules]]
name = "api"
key = ["header:x-api-key"]
algorithm = "gcra"
rate = 10
period = "1s"
burst = 20
cost = { POST = 5 }
overrides = true

[[vars.LIMITER.rules]]
name = "hot"
key = ["header:x-api-key"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 300
lease = 20
lease_for = "2s"
overrides = true
"#;
    std::fs::write(dir.join("wrangler.toml"), rules).unwrap();
    let set = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_edge-limiter"))
            .args(["limit", "set"])
            .args(args)
            .current_dir(&dir)
            .env_remove("UPSTASH_REDIS_REST_URL")
            .env_remove("UPSTASH_REDIS_REST_TOKEN")
            .output()
            .expect("the command runs");
        assert!(!out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    for (args, says) in [
        (
            &["api", "--burst", "1"][..],
            "rule `api`, field `cost`: 5 exceeds",
        ),
        (&["hot", "--burst", "100"], "rule `hot`, field `lease_for`"),
        (
            &["hot", "k-1", "--burst", "30"],
            "rule `hot`, field `lease`",
        ),
        (&["api", "--block", "--for", "3600"], "--for: `3600`"),
        (&["api", "--block", "--for", "367d"], "--for: `367d`"),
        (&["api", "--period", "60", "--rate", "1"], "--period: `60`"),
    ] {
        let err = set(args);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // Figures the whole rule takes pass, and only then is a setting read.
    for args in [
        &["api", "--burst", "5"][..],
        &["hot", "--burst", "250", "--for", "3600s"],
        &["api", "--block", "--for", "366d"],
    ] {
        let err = set(args);
        assert!(err.contains("UPSTASH_REDIS_REST_URL"), "{args:?}: {err}");
    }
}

#[tokio::test]
async fn a_clients_override_and_block_reach_that_client_alone() {
    let stack = Stack::start(RULES);
    let w = &stack.worker;
    assert_eq!(statuses(w, "partner", 3).await, [200, 200, 429]);
    assert_eq!(statuses(w, "other", 3).await, [200, 200, 429]);
    // Ten times the burst for the partner, from its next request once the
    // isolate's memory of its denial has lapsed (`cache_hold`, 1 s here).
    let set = limit(w, &["set", "api", "partner", "--burst", "20"]);
    assert!(
        set.contains("gcra 1/60000ms burst 20 in place of gcra 1/60000ms burst 2"),
        "{set}"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = get(w, "partner").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"api\";q=20;w=1200"));
    assert_eq!(statuses(w, "other", 1).await, [429]);
    let shown = operator(w, &["inspect", "api", "partner"]);
    assert!(
        shown.contains("override: v1 gcra 1 60000 20 60000000 (the client's own)"),
        "{shown}"
    );
    let got = limit(w, &["get", "api", "partner", "--json"]);
    assert!(
        got.contains("\"override\":\"v1 gcra 1 60000 20 60000000\""),
        "{got}"
    );
    // A block for 30 s: 429 with its time left, and no origin hit.
    let hits = stack.origin.hits().await["total"].as_u64().unwrap();
    limit(w, &["set", "api", "partner", "--block", "--for", "30s"]);
    let r = get(w, "partner").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = header(&r, "Retry-After").unwrap().parse().unwrap();
    assert!((29..=30).contains(&retry), "Retry-After {retry}");
    assert_eq!(stack.origin.hits().await["total"].as_u64().unwrap(), hits);
    let denied = w.events_of("deny");
    assert!(
        denied.iter().any(|e| e["override"] == "client: v1 block"),
        "{denied:?}"
    );
    // Cleared: within the block cache's hold (1 s here), the partner is back
    // on the configured figures (its 3 admitted since then leave none).
    assert!(limit(w, &["clear", "api", "partner"]).contains("removed"));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = get(w, "partner").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"api\";q=2;w=120"));
    // A block without end: 429 and no Retry-After.
    limit(w, &["set", "api", "stopped", "--block"]);
    let r = get(w, "stopped").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "Retry-After"), None);
    let listed = limit(w, &["list", "api"]);
    assert!(
        listed.contains("el:{stopped}:api:o: blocked, until cleared"),
        "{listed}"
    );
    // Listed from the index `limit` keeps, with no SCAN: an entry goes
    // once its override has expired.
    limit(w, &["set", "api", "brief", "--block", "--for", "1s"]);
    assert!(limit(w, &["list", "api"]).contains("el:{brief}:api:o: blocked"));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(!limit(w, &["list", "api"]).contains("brief"));
    let b = &stack.backend;
    let index = "el:{#overrides}:api";
    assert_eq!(
        b.redis(&["ZRANGE", index, "0", "-1"]).trim(),
        "el:{stopped}:api:o"
    );
    // A block until cleared keeps the index as long.
    assert_eq!(b.redis(&["PTTL", index]).trim(), "-1");
    // One an earlier release wrote, outside the index: `--scan` finds it
    // and puts it there.
    b.redis(&["SET", "el:{old}:api:o", "v1 block"]);
    assert!(!limit(w, &["list", "api"]).contains("{old}"));
    assert!(limit(w, &["list", "api", "--scan"]).contains("el:{old}:api:o: blocked"));
    assert!(limit(w, &["list", "api"]).contains("el:{old}:api:o: blocked"));
    // Cleared: out of the index too; the last entry gone, so is the index.
    for client in ["stopped", "old"] {
        assert!(limit(w, &["clear", "api", client]).contains("removed"));
    }
    assert_eq!(b.redis(&["EXISTS", index]).trim(), "0");
}

/// A blocked client is told so, and nothing it gets says it has quota
/// left: 0 remaining in every header, a reset at the block's end (none for
/// a block without end), and a detail that names an operator's block; the
/// same when the isolate answers it again from its block cache.
#[tokio::test]
async fn a_blocked_client_is_told_it_has_nothing_left_and_why() {
    let stack = Stack::start(RULES);
    let w = &stack.worker;
    // Fresh clients: their buckets hold the whole burst of 2.
    limit(w, &["set", "api", "held", "--block", "--for", "90s"]);
    for _ in 0..2 {
        let r = get(w, "held").await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let retry = header(&r, "Retry-After").unwrap().to_owned();
        assert!(
            (89..=90).contains(&retry.parse::<u64>().unwrap()),
            "{retry}"
        );
        assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("0"));
        assert_eq!(header(&r, "X-RateLimit-Reset"), Some(retry.as_str()));
        assert_eq!(
            header(&r, "RateLimit").map(str::to_owned),
            Some(format!("\"api\";r=0;t={retry}"))
        );
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(
            body["detail"],
            format!("An operator blocked this client on `api`; retry in {retry} s.")
        );
    }
    limit(w, &["set", "api", "stopped", "--block"]);
    let r = get(w, "stopped").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "RateLimit"), Some("\"api\";r=0"));
    assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("0"));
    assert_eq!(header(&r, "X-RateLimit-Reset"), None);
    assert_eq!(header(&r, "Retry-After"), None);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        body["detail"],
        "An operator blocked this client on `api` until the block is lifted."
    );
}

/// `inspect` shows a client under the figures in force, and whose they
/// are: the rule's for every client, a client's own for each of several
/// windows, and a block with its time left.
#[tokio::test]
async fn inspect_shows_the_override_in_force() {
    let stack = Stack::start(RULES);
    let w = &stack.worker;
    limit(w, &["set", "api", "--burst", "5"]);
    let shown = operator(w, &["inspect", "api", "anyone"]);
    assert!(
        shown.contains("gcra 1/60000ms burst 5: 5 of 5 left"),
        "{shown}"
    );
    assert!(
        shown.contains("override: v1 gcra 1 60000 5 60000000 (the rule's, for every client)"),
        "{shown}"
    );
    limit(w, &["set", "pages", "k", "--limit", "7", "--limit", "70"]);
    let shown = operator(w, &["inspect", "pages", "k"]);
    for line in [
        "window 60000ms by 1000ms: 7 of 7 left",
        "window 3600000ms by 60000ms: 70 of 70 left",
        "override: v1 windows 60000:7 3600000:70 (the client's own)",
    ] {
        assert!(shown.contains(line), "{line} in {shown}");
    }
    limit(w, &["set", "pages", "k", "--block", "--for", "30s"]);
    let shown = operator(w, &["inspect", "pages", "k"]);
    let left = shown
        .split("override: v1 block (the client's own), ")
        .nth(1)
        .and_then(|rest| rest.split(" ms left").next())
        .and_then(|ms| ms.parse::<u64>().ok());
    assert!(
        left.is_some_and(|ms| ms > 29_000 && ms <= 30_000),
        "{shown}"
    );
}

#[tokio::test]
async fn garbage_in_an_override_key_counts_as_none() {
    let stack = Stack::start(RULES);
    let w = &stack.worker;
    for (i, junk) in ["v1 gcra 1 60000 2000 1", "{\"burst\": 100}", "v2 block"]
        .iter()
        .enumerate()
    {
        let client = format!("junk-{i}");
        stack
            .backend
            .redis(&["SET", &format!("el:{{{client}}}:api:o"), junk]);
        assert_eq!(statuses(w, &client, 3).await, [200, 200, 429], "{junk}");
    }
    let ignored = w.events_of("override_ignored");
    assert!(!ignored.is_empty());
    assert_eq!(ignored[0]["key"], "el:{junk-0}:api:o");
}

/// One rule of each fail mode, both taking overrides.
const FAIL_MODES: &str = r#"
[vars.LIMITER]
cache_hold = "1s"

[[vars.LIMITER.rules]]
name = "shut"
path_prefix = "/shut"
key = ["header:x-api-key"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 2
overrides = true

[[vars.LIMITER.rules]]
name = "open"
path_prefix = "/open"
key = ["header:x-api-key"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 2
overrides = true
fail = "open"
"#;

/// No stored value sends a rule to its fail mode (issue 31): `v1 block`
/// and 8 000 numbers, in a client's key or in the rule-wide key, counts as
/// none under either fail mode, never a 503 nor unlimited, and is logged.
#[tokio::test]
async fn an_override_of_any_length_counts_as_none_under_either_fail_mode() {
    let stack = Stack::start(FAIL_MODES);
    let w = &stack.worker;
    let huge = format!("v1 block{}", " 1".repeat(8000));
    for rule in ["shut", "open"] {
        let path = format!("/{rule}");
        // Both keys before the isolate's first read of the rule-wide one,
        // which starts after its first response under the rule.
        for key in [format!("el:{{junk}}:{rule}:o"), format!("el:rule:{rule}:o")] {
            stack.backend.redis(&["SET", &key, &huge]);
        }
        assert_eq!(
            statuses_at(w, &path, "junk", 3).await,
            [200, 200, 429],
            "{rule}: a client's key"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            statuses_at(w, &path, "fresh", 3).await,
            [200, 200, 429],
            "{rule}: the rule-wide key"
        );
    }
    let ignored: Vec<String> = w
        .events_of("override_ignored")
        .iter()
        .filter_map(|e| e["key"].as_str().map(str::to_owned))
        .collect();
    for key in [
        "el:{junk}:shut:o",
        "el:rule:shut:o",
        "el:{junk}:open:o",
        "el:rule:open:o",
    ] {
        assert!(ignored.iter().any(|k| k == key), "{key} in {ignored:?}");
    }
}

#[tokio::test]
async fn a_rule_wide_override_reaches_every_client_and_ends_by_itself() {
    let stack = Stack::builder(RULES).instances(2).start();
    let [a, b] = [&stack.worker, &stack.others[0]];
    // Every client gets burst 5 for 3 s.
    limit(a, &["set", "api", "--burst", "5", "--for", "3s"]);
    // An isolate reads it after a response, so each worker's second
    // request on is decided under it.
    get(a, "warm-a").await;
    get(b, "warm-b").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(statuses(a, "c1", 5).await, [200; 5]);
    assert_eq!(statuses(b, "c2", 6).await, [200, 200, 200, 200, 200, 429]);
    // A client's own override goes before the rule's: a block on both.
    let got = limit(a, &["get", "api", "c1"]);
    assert!(
        got.starts_with(
            "no override of its own; every client's holds: el:rule:api:o: gcra 1/60000ms burst 5"
        ),
        "{got}"
    );
    limit(b, &["set", "api", "c3", "--block"]);
    assert_eq!(statuses(a, "c3", 1).await, [429]);
    assert_eq!(statuses(b, "c3", 1).await, [429]);
    // After 3 s, and one more read, the configured burst of 2 holds again.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    get(a, "warm-a").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(statuses(a, "c4", 3).await, [200, 200, 429]);
}

/// A fault never opens the gate: a read of the rule-wide override that
/// fails keeps the isolate's copy, so a rule-wide block holds through an
/// outage (during which the rule fails closed) and after it.
#[tokio::test]
async fn a_failed_read_keeps_the_rule_wide_block() {
    let stack = Stack::builder(RULES).through_fault_proxy().start();
    let (w, proxy) = (&stack.worker, stack.proxy.as_ref().unwrap());
    limit(w, &["set", "api", "--block"]);
    get(w, "warm").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(statuses(w, "c1", 1).await, [429]);
    // Once the copy is due a read, every read after a response fails.
    tokio::time::sleep(Duration::from_millis(REREAD_MS + 200)).await;
    proxy.set(Fault::Status {
        status: 500,
        body: "down".into(),
    });
    let before = proxy.exchanges().len();
    assert_eq!(statuses(w, "c2", 5).await, [503; 5]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A failed read is retried a second later, not after every response.
    let reads = proxy.exchanges()[before..]
        .iter()
        .filter(|e| String::from_utf8_lossy(&e.request).contains("el:rule:api:o"))
        .count();
    assert_eq!(
        reads, 1,
        "reads of the rule-wide override during the outage"
    );
    proxy.set(Fault::Pass);
    let denied_before = w.events_of("deny").len();
    assert_eq!(statuses(w, "c3", 1).await, [429]);
    let denied = events_from(w, "deny", denied_before).await;
    assert!(
        denied.iter().any(|e| e["override"] == "rule: v1 block"),
        "{denied:?}"
    );
}

/// A new isolate decides under the configured figures (and each client's
/// own override) until its first read of the rule-wide override, which
/// starts after its first response under the rule: it never waits for it
/// on a request's path.
#[tokio::test]
async fn a_new_isolate_holds_no_rule_wide_override_until_its_first_read() {
    let stack = Stack::start(RULES);
    let w = &stack.worker;
    stack.backend.redis(&["SET", "el:rule:api:o", "v1 block"]);
    let r = get(w, "first").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"api\";q=2;w=120"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(statuses(w, "second", 1).await, [429]);
}

const LEASED: &str = r#"
[vars.LIMITER]
cache_hold = "1s"

[[vars.LIMITER.rules]]
name = "hot"
key = ["header:x-api-key"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 300
lease = 20
lease_for = "2s"
overrides = true
"#;

/// A block ends a client's leases on the isolate's next call: what it
/// still holds is spent (it was charged), then every request is denied.
#[tokio::test]
async fn a_block_ends_the_clients_leases() {
    let stack = Stack::start(LEASED);
    let w = &stack.worker;
    w.stream_until_leased(|| async { assert_eq!(statuses(w, "busy", 1).await, [200]) })
        .await;
    assert!(
        !w.events_of("lease_grant").is_empty(),
        "leases were granted"
    );
    limit(w, &["set", "hot", "busy", "--block"]);
    let after = statuses(w, "busy", 40).await;
    let served = after.iter().take_while(|s| **s == 200).count();
    assert!(served <= 30, "{after:?}");
    assert!(after[served..].iter().all(|s| *s == 429), "{after:?}");
    assert!(served < after.len(), "the block never took: {after:?}");
}

/// Requests decided from leased units carry the figures the lease was
/// granted under: the client's override, not the configured ones.
#[tokio::test]
async fn leased_requests_show_the_override_they_were_granted_under() {
    let stack = Stack::start(LEASED);
    let w = &stack.worker;
    limit(w, &["set", "hot", "partner", "--burst", "250"]);
    // 250 units, one every 10 ms: all back in 2.5 s.
    let one = || async {
        let r = get(w, "partner").await;
        assert_eq!(r.status(), StatusCode::OK);
        let policy = header(&r, "RateLimit-Policy").unwrap_or_default();
        assert_eq!(policy, "\"hot\";q=250;w=3");
    };
    w.stream_until_leased(one).await;
    let before = stack.backend.script_calls();
    for _ in 0..30 {
        one().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let calls = stack.backend.script_calls() - before;
    assert!(
        calls < 20,
        "{calls} script calls: too few requests were leased"
    );
}

const WINDOWED: &str = r#"
[vars.LIMITER]
cache_hold = "1s"

[[vars.LIMITER.rules]]
name = "pages"
key = ["header:x-api-key"]
algorithm = "windowed"
windows = [["1m", 2, "1s"]]
overrides = true
"#;

/// A lone windowed rule reads its client's override on its one-rule path:
/// the client's raised limit holds from its next request, in its headers
/// too, and no other client's.
#[tokio::test]
async fn a_lone_windowed_rule_takes_its_clients_override() {
    let stack = Stack::start(WINDOWED);
    let w = &stack.worker;
    limit(w, &["set", "pages", "partner", "--limit", "5"]);
    assert_eq!(
        statuses(w, "partner", 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    assert_eq!(statuses(w, "other", 3).await, [200, 200, 429]);
    let r = get(w, "fresh").await;
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"pages\";q=2;w=60"));
    limit(w, &["set", "pages", "fresh", "--limit", "5"]);
    let r = get(w, "fresh").await;
    assert_eq!(header(&r, "RateLimit-Policy"), Some("\"pages\";q=5;w=60"));
}
