//! Stats end to end: the built worker in `wrangler dev` counts what it did
//! and writes it, after responses, at most every `stats_every`; with stats
//! off it writes nothing and calls nothing more.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::time::{Duration, Instant};

use edge_limiter::decision::stats::{
    counts::{RuleCount, TotalCount},
    stored::{day_key, read_rule_day, read_totals_day, DAY_MS, STATS},
    timer::WAKE_WITHIN_MS,
    top::{Denials, TopDenied},
};
use edge_limiter::decision::transport::protocol::LIMITER;
use edge_limiter_local::fault_proxy::Fault;
use serde_json::Value;
use support::{
    carried,
    report::Table,
    worker::{Stack, Worker},
    Backend, Sent, TOKEN,
};

const PER_IP: &str = r#"
[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 3
"#;

/// The same rule, with stats written every second.
fn with_stats(rules: &str) -> String {
    format!("[vars.LIMITER]\nstats = true\nstats_every = \"1s\"\n{rules}")
}

/// Sends `n` requests from `ip`, one after the other; their statuses.
async fn send(url: &str, ip: &str, n: usize) -> Vec<u16> {
    let client = support::http();
    let mut statuses = Vec::new();
    for _ in 0..n {
        let r = client
            .get(url)
            .header("CF-Connecting-IP", ip)
            .send()
            .await
            .expect("the worker answers");
        statuses.push(r.status().as_u16());
    }
    statuses
}

/// A key's (field, value) pairs, read straight from Redis.
fn pairs(b: &Backend, key: &str) -> Vec<(String, String)> {
    let text = b.redis(&["HGETALL", key]);
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines
        .chunks_exact(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect()
}

fn today() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    now.as_millis() as u64 / DAY_MS
}

/// A summary's names and counts, most first.
fn names(top: &TopDenied) -> Vec<(String, u64)> {
    let top = top.top(10).into_iter();
    top.map(|e| (e.name.clone(), e.count)).collect()
}

/// Today's request-wide figures and `rule`'s, summed over the minutes, and
/// whom it denied and from where.
fn kept(b: &Backend, rule: &str) -> (Vec<u64>, Vec<u64>, Denials) {
    let day = today();
    let mut totals = vec![0; TotalCount::ALL.len()];
    for (_, t) in read_totals_day(day, &pairs(b, &day_key(day, None))) {
        totals.iter_mut().zip(t.0).for_each(|(a, b)| *a += b);
    }
    let mut rules = vec![0; RuleCount::ALL.len()];
    // The traffic may straddle a minute.
    let mut denials = Denials::default();
    for (_, r, top) in read_rule_day(day, &pairs(b, &day_key(day, Some(rule)))) {
        rules.iter_mut().zip(r.0).for_each(|(a, b)| *a += b);
        denials.merge(&top);
    }
    (totals, rules, denials)
}

/// Waits until Redis holds `sent` requests counted today.
async fn wait_for_requests(stack: &Stack, sent: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (totals, _, _) = kept(&stack.backend, "per-ip");
        if totals[TotalCount::Requests as usize] == sent {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "kept {totals:?} of {sent}; log:\n{}",
            stack.worker.log()
        );
    }
}

#[tokio::test]
async fn a_worker_writes_what_it_did_after_stats_every() {
    let stack = Stack::start(&with_stats(PER_IP));
    let url = format!("{}/page", stack.worker.url);
    let started = Instant::now();
    let statuses = send(&url, "203.0.113.10", 5).await;
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let b = &stack.backend;
    // The worker saw them all within a second of the first (unless this
    // machine is too loaded to tell): no write was due yet.
    if started.elapsed() < Duration::from_millis(1000) {
        assert_eq!(kept(b, "per-ip").0[0], 0, "nothing written before a second");
    }
    // The worker's own timer writes everything at `stats_every`, with no
    // request after.
    let sent = 5;
    wait_for_requests(&stack, sent).await;
    let (totals, rule, denials) = kept(b, "per-ip");
    let denied = sent - 3;
    let mut want = vec![0; TotalCount::ALL.len()];
    want[TotalCount::Requests as usize] = sent;
    want[TotalCount::Admitted as usize] = 3;
    want[TotalCount::Denied as usize] = denied;
    // Three admissions and the first denial asked Redis; the block cache
    // answered the rest.
    want[TotalCount::Calls as usize] = 4;
    assert_eq!(totals, want);
    let mut want = vec![0; RuleCount::ALL.len()];
    want[RuleCount::Matched as usize] = sent;
    want[RuleCount::Admitted as usize] = 3;
    want[RuleCount::Denied as usize] = denied;
    want[RuleCount::Calls as usize] = 4;
    assert_eq!(rule, want);
    assert_eq!(names(&denials.clients), [("203.0.113.10".into(), denied)]);
    // Where wrangler dev places every request (miniflare's stand-in for
    // `request.cf`, with CLOUDFLARE_CF_FETCH_ENABLED=false).
    assert_eq!(names(&denials.countries), [("US".into(), denied)]);
    assert_eq!(names(&denials.networks), [("395747".into(), denied)]);
    assert_eq!(stack.origin.hits().await["total"], Value::from(3));

    // `edge-limiter stats` beside the worker's wrangler.toml and .dev.vars
    // reads the same, and tells it as simulate would.
    let (report, _) = stats_command(&stack, &["--json"]);
    let report: Value = serde_json::from_str(&report).unwrap();
    assert_eq!(
        (&report["requests"], &report["admitted"], &report["denied"]),
        (&Value::from(sent), &Value::from(3), &Value::from(denied))
    );
    let rule = &report["rules"]["per-ip"];
    assert_eq!(
        (&rule["matched"], &rule["denied"], &rule["calls"]),
        (&Value::from(sent), &Value::from(denied), &Value::from(4))
    );
    assert_eq!(
        report["top_denied"],
        serde_json::json!([{"client": "203.0.113.10", "rule": "per-ip", "denied": denied}])
    );
    let plot = stack.worker.dir.join("stats.svg");
    let (text, _) = stats_command(&stack, &["per-ip", "--plot", plot.to_str().unwrap()]);
    let row = format!(
        "| per-ip | enforce | {sent:>7} |        3 | {denied:>6} |                     0 |"
    );
    assert!(text.contains(&row), "{text}");
    assert!(text.contains("| 203.0.113.10 | per-ip |"), "{text}");
    assert!(std::fs::read_to_string(plot).unwrap().starts_with("<svg"));
}

/// Every key in `b` and everything each holds, as text.
fn everything_kept(b: &Backend) -> String {
    let mut all = String::new();
    for key in b.redis(&["KEYS", "*"]).lines() {
        let read: &[&str] = match b.redis(&["TYPE", key]).as_str() {
            "string" => &["GET"],
            "hash" => &["HGETALL"],
            "zset" => &["ZRANGE", "0", "-1", "WITHSCORES"],
            "set" => &["SMEMBERS"],
            "list" => &["LRANGE", "0", "-1"],
            other => panic!("{key} is a {other}"),
        };
        let mut args = vec![read[0], key];
        args.extend(&read[1..]);
        all += &format!("{key}\n{}\n", b.redis(&args));
    }
    all
}

/// HMAC-SHA1 of `parts` each after its length as 8 bytes big-endian, the
/// limiter's keyed form, worked out by `openssl` rather than the crate.
fn openssl_hmac(secret: &str, parts: &[&str]) -> String {
    use std::io::Write;
    let mut message = Vec::new();
    for p in parts {
        message.extend((p.len() as u64).to_be_bytes());
        message.extend(p.as_bytes());
    }
    let mut child = std::process::Command::new("openssl")
        .args(["dgst", "-sha1", "-hmac", secret])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl runs");
    child.stdin.take().unwrap().write_all(&message).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.split_whitespace().last().unwrap().to_owned()
}

/// Under `stats_clients = "hmac"` the stats and every key name a client by
/// its HMAC under the secret, so Redis holds no address; an operator reaches
/// the client by that form with no secret; and a worker without the secret
/// refuses to run and says which one it needs.
#[tokio::test]
async fn hmac_clients_leave_no_address_in_redis_and_are_reached_as_shown() {
    let secret = "an-example-secret-of-forty-bytes-0123456";
    let ip = "203.0.113.44";
    let rules =
        with_stats(PER_IP).replace("stats = true", "stats = true\nstats_clients = \"hmac\"");
    let stack = Stack::builder(&rules)
        .dev_vars(&format!("STATS_SECRET={secret}\n"))
        .start();
    let url = format!("{}/page", stack.worker.url);
    assert_eq!(send(&url, ip, 5).await, [200, 200, 200, 429, 429]);
    wait_for_requests(&stack, 5).await;
    let shown = format!("~{}", openssl_hmac(secret, &[ip]));
    let (_, _, denials) = kept(&stack.backend, "per-ip");
    assert_eq!(names(&denials.clients), [(shown.clone(), 2)]);
    let kept = everything_kept(&stack.backend);
    assert!(kept.contains(&format!("el:{{{shown}}}:per-ip")), "{kept}");
    assert!(!kept.contains(ip), "Redis holds the address:\n{kept}");

    // Elsewhere, with the configuration but no secret: the values cannot
    // name the client, the shown form can.
    let elsewhere = edge_limiter_local::testenv::Scratch::new("no-secret");
    let config = stack.worker.dir.join("wrangler.toml");
    let run = |args: &[&str]| {
        let out = stack
            .edge_limiter(args)
            .args(["--config", config.to_str().unwrap()])
            .current_dir(&*elsewhere)
            .output()
            .unwrap();
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        (out.status.code(), text(out.stdout), text(out.stderr))
    };
    let (status, _, why) = run(&["inspect", "per-ip", ip]);
    assert_eq!(status, Some(1));
    assert!(why.contains("STATS_SECRET"), "{why}");
    let (status, standing, why) = run(&["inspect", "per-ip", "--client", &shown]);
    assert_eq!(status, Some(0), "{why}");
    assert!(
        standing.contains(&format!("(key el:{{{shown}}}:per-ip)")),
        "{standing}"
    );
    assert!(standing.contains("0 of 3 left"), "{standing}");
    let (status, _, why) = run(&["inspect", "per-ip", "--client", "203.0.113.44"]);
    assert_eq!(status, Some(1));
    assert!(why.contains("stats_clients = \"hmac\""), "{why}");
    let (status, removed, why) = run(&["reset", "per-ip", "--client", &shown]);
    assert_eq!(status, Some(0), "{why}");
    assert!(removed.contains("removed"), "{removed}");
    let (_, standing, _) = run(&["inspect", "per-ip", "--client", &shown]);
    assert!(standing.contains("3 of 3 left"), "{standing}");

    let without = Stack::start(&rules);
    let r = support::http()
        .get(&without.worker.url)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 500);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !without.worker.log().contains("STATS_SECRET") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = without.worker.log();
    let why = "secret `STATS_SECRET`: `stats_clients = \"hmac\"` needs it";
    assert!(log.contains(why), "{log}");
    assert_eq!(without.origin.hits().await["total"], 0);
}

/// An isolate whose write is due an hour on, and that hears no request
/// after its first three, writes them itself: its last timer, set within
/// the 30 s the platform lets `waitUntil` run, writes what is left rather
/// than hold it for a request that may never come.
#[tokio::test]
async fn a_quiet_isolate_writes_its_counts_itself() {
    let rules = format!("[vars.LIMITER]\nstats = true\nstats_every = \"1h\"\n{PER_IP}");
    let stack = Stack::start(&rules);
    let url = format!("{}/page", stack.worker.url);
    let started = Instant::now();
    assert_eq!(send(&url, "203.0.113.11", 3).await, [200, 200, 200]);
    let b = &stack.backend;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (totals, _, _) = kept(b, "per-ip");
        if totals[TotalCount::Requests as usize] == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kept {totals:?}; log:\n{}",
            stack.worker.log()
        );
    }
    // Its timer woke WAKE_WITHIN_MS after the first request, no sooner.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(WAKE_WITHIN_MS),
        "{waited:?}"
    );
}

/// A call a request's background work makes after its response (here the
/// refund a `count_status` rule sends for a 200) is counted after the
/// isolate's last timer may have woken and written: the work then wakes a
/// timer of its own, so the count reaches Redis with no further request.
/// Before, it waited in the isolate for the next request, and a quiet
/// isolate never wrote it.
#[tokio::test]
async fn a_call_counted_after_the_last_write_is_written_too() {
    let rules = format!(
        "[vars.LIMITER]\nstats = true\nstats_every = \"1s\"\n{PER_IP}\
         count_status = [401]\nbudget = \"5s\"\n"
    );
    let stack = Stack::builder(&rules).through_fault_proxy().start();
    let proxy = stack.proxy.as_ref().expect("asked for");
    let url = format!("{}/page", stack.worker.url);
    let b = &stack.backend;
    let calls = || kept(b, "per-ip").0[TotalCount::Calls as usize];
    let settled = |want: u64, within: Duration| async move {
        let deadline = Instant::now() + within;
        while calls() < want && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        calls()
    };
    // A decision and its refund, written (the first write loads the script).
    assert_eq!(send(&url, "203.0.113.12", 1).await, [200]);
    assert_eq!(settled(2, Duration::from_secs(30)).await, 2);
    // Past stats_every since that write, every REST call 400 ms long: the
    // request's timer wakes as its decision returns and writes at once,
    // while its refund is still on the way.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    proxy.set(Fault::Delay(Duration::from_millis(400)));
    assert_eq!(send(&url, "203.0.113.12", 1).await, [200]);
    assert_eq!(
        settled(4, Duration::from_secs(10)).await,
        4,
        "the second request's refund was never written; log:\n{}",
        stack.worker.log()
    );
}

/// A write whose reply is lost (Redis took it, the worker cannot tell) is
/// sent again, unchanged, with the next due write, and Redis adds it once:
/// what it keeps is what the worker did. Before, the worker counted the
/// lost write's minutes again with the next, and kept counts ran ahead of
/// the requests for good.
#[tokio::test]
async fn a_write_whose_reply_was_lost_is_counted_once() {
    let stack = Stack::builder(&with_stats(PER_IP))
        .through_fault_proxy()
        .start();
    let proxy = stack.proxy.as_ref().expect("asked for");
    let url = format!("{}/page", stack.worker.url);
    let b = &stack.backend;
    let requests = || kept(b, "per-ip").0[TotalCount::Requests as usize];
    let ip = "203.0.113.20";
    let deadline = Instant::now() + Duration::from_secs(30);
    let landed = |want: u64| async move {
        while requests() < want {
            assert!(Instant::now() < deadline, "{want} requests never kept");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    assert_eq!(send(&url, ip, 4).await, [200, 200, 200, 429]);
    // A first write goes as usual (and loads the script).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(send(&url, ip, 1).await, [429]);
    landed(5).await;
    // The block cache answers this request, with no call of its own; the
    // write it makes reaches Redis, and its reply does not.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    proxy.set(Fault::LoseReply);
    assert_eq!(send(&url, ip, 1).await, [429]);
    let mut sent = 6;
    landed(sent).await;
    proxy.set(Fault::Pass);
    assert_eq!(requests(), sent, "the lost write held every request");
    // A request a second later sends the lost write again; one more, a
    // second after that, writes what came since.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        send(&url, ip, 1).await;
        sent += 1;
    }
    loop {
        let kept = requests();
        assert!(kept <= sent, "kept {kept} of {sent}: counted twice");
        if kept == sent {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kept {kept} of {sent}; log:\n{}",
            stack.worker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failed = stack.worker.events_of("stats_write_failed");
    assert_eq!(failed.len(), 1, "{}", stack.worker.log());
}

/// `edge-limiter stats ARGS` in the worker's directory, reading its
/// wrangler.toml and .dev.vars as an operator beside it would: stdout and
/// stderr, once it succeeded.
fn stats_command(stack: &Stack, args: &[&str]) -> (String, String) {
    command(stack, "stats", args)
}

/// `edge-limiter COMMAND ARGS` in the worker's directory, talking to the
/// REST endpoint itself (not through a fault proxy in front of the worker):
/// stdout and stderr, once it succeeded.
fn command(stack: &Stack, command: &str, args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edge-limiter"))
        .arg(command)
        .args(args)
        .current_dir(&stack.worker.dir)
        .env("UPSTASH_REDIS_REST_URL", stack.backend.endpoint.url())
        .env("UPSTASH_REDIS_REST_TOKEN", TOKEN)
        .output()
        .expect("the command runs");
    let (stdout, stderr) = (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    );
    assert!(out.status.success(), "{args:?}: {stderr}");
    (stdout, stderr)
}

#[tokio::test]
async fn with_stats_off_nothing_is_written_and_no_call_is_added() {
    let stack = Stack::start(PER_IP);
    let url = format!("{}/page", stack.worker.url);
    send(&url, "203.0.113.10", 5).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    send(&url, "203.0.113.10", 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = &stack.backend;
    assert_eq!(b.redis(&["KEYS", "el:{#stats}*"]).trim(), "");
    assert_eq!(
        b.redis(&["SCRIPT", "EXISTS", STATS.sha1]).trim(),
        "0",
        "the stats script was never sent"
    );
}

/// Known traffic through two workers on one Redis, the fault proxy in
/// front of it: some admitted, some denied, a shadow rule's would-deny, a
/// spell of Redis answering 503 under a rule that fails open, and a hot
/// client decided from leases.
const KNOWN: &str = r#"
[vars.LIMITER]
stats = true
stats_every = "1s"

[[vars.LIMITER.rules]]
name = "limited"
key = ["header:x-client"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 4
path_prefix = "/limited"
fail = "open"

[[vars.LIMITER.rules]]
name = "shadow"
key = ["header:x-client"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 2
path_prefix = "/shadow"
mode = "shadow"

[[vars.LIMITER.rules]]
name = "leased"
key = ["header:x-client"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 200
lease = 20
lease_for = "1s"
path_prefix = "/leased"
"#;

/// One limiter-script call the proxy saw: the keys it named, and whether
/// it only refreshed leases (every rule's cost 0). `None` for anything
/// else: the stats script, or an `EVALSHA` Redis answered `NOSCRIPT`
/// (the worker counts that call once, with the `EVAL` that follows).
fn limiter_call(call: &Sent) -> Option<(Vec<String>, bool)> {
    let body = call.command.as_array()?;
    let text = |i: usize| body.get(i).and_then(Value::as_str).unwrap_or_default();
    let ours = (text(0) == "EVALSHA" && text(1) == LIMITER.sha1)
        || (text(0) == "EVAL" && text(1) == LIMITER.source);
    let noscript = call.reply.as_ref().is_some_and(|r| {
        r["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("NOSCRIPT"))
    });
    if !ours || noscript {
        return None;
    }
    let n = body.get(2)?.as_u64()? as usize;
    let keys: Vec<String> = (3..3 + n).map(|i| text(i).to_owned()).collect();
    let args: Vec<&str> = (3 + n..body.len()).map(text).collect();
    // The general decision's ARGV: 'decide', clock, modes, then per rule
    // its algorithm and cost first (lua/limiter.lua's table).
    let refresh = args.first() == Some(&"decide") && args.get(4) == Some(&"0");
    Some((keys, refresh))
}

/// Sends `n` requests of `client` to `path`, alternating between the
/// workers; their statuses.
async fn alternate(workers: [&Worker; 2], path: &str, client: &str, n: usize) -> Vec<u16> {
    alternate_paced(workers, (path, client), n, Duration::ZERO).await
}

/// [`alternate`], `gap` between one answer and the next request.
async fn alternate_paced(
    workers: [&Worker; 2],
    (path, client): (&str, &str),
    n: usize,
    gap: Duration,
) -> Vec<u16> {
    let http = support::http();
    let mut statuses = Vec::new();
    for i in 0..n {
        if i > 0 && !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        let url = format!("{}{path}", workers[i % 2].url);
        let r = http
            .get(url)
            .header("x-client", client)
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_stats_agree_with_what_was_sent_and_decided() {
    let stack = Stack::builder(KNOWN)
        .instances(2)
        .through_fault_proxy()
        .start();
    let workers = [&stack.worker, &stack.others[0]];
    let proxy = stack.proxy.as_ref().expect("asked for");
    // Compile the worker in both isolates first; these count too.
    let mut sent = 0;
    for w in workers {
        support::http()
            .get(format!("{}/warm", w.url))
            .send()
            .await
            .unwrap();
        sent += 1;
    }
    let limited = alternate(workers, "/limited", "c1", 6).await;
    assert_eq!(limited, [200, 200, 200, 200, 429, 429]);
    let shadow = alternate(workers, "/shadow", "c2", 5).await;
    assert_eq!(shadow, [200; 5]);
    proxy.set(Fault::Status {
        status: 503,
        body: "down".into(),
    });
    // Long enough for a write to come due, and fail, in each worker.
    let mut open = alternate(workers, "/limited", "c3", 2).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    open.extend(alternate(workers, "/limited", "c3", 2).await);
    proxy.set(Fault::Pass);
    assert_eq!(open, [200; 4]);
    // An isolate leases to a stream, a run of arrivals that has lasted
    // half a lease (500 ms): paced, each worker's 20 span over a second
    // however fast the machine answers.
    let hot = alternate_paced(workers, ("/leased", "c4"), 40, Duration::from_millis(30)).await;
    assert_eq!(hot, [200; 40]);
    sent += 6 + 5 + 4 + 40;

    // Each worker's own timer writes what is left, with no request after
    // it; a write that was due during the spell failed and went again.
    let deadline = Instant::now() + Duration::from_secs(60);
    let report = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (json, _) = command(&stack, "stats", &["--json"]);
        let report: Value = serde_json::from_str(&json).unwrap();
        if report["requests"] == sent {
            break report;
        }
        assert!(
            Instant::now() < deadline && report["requests"].as_u64() < Some(sent),
            "stats hold {} requests of {sent}:\n{json}",
            report["requests"]
        );
    };

    // What the proxy saw of the limiter's calls, per rule.
    let calls: Vec<(Vec<String>, bool)> = carried(&proxy.exchanges())
        .iter()
        .filter_map(limiter_call)
        .collect();
    let calls_of = |rule: &str| {
        let named = |keys: &Vec<String>| keys.iter().any(|k| k.ends_with(&format!("}}:{rule}")));
        let all = calls.iter().filter(|(keys, _)| named(keys)).count() as u64;
        let deciding = calls
            .iter()
            .filter(|(keys, refresh)| named(keys) && !refresh)
            .count() as u64;
        (all, deciding)
    };
    let (hot_calls, hot_deciding) = calls_of("leased");
    let triggers = sent - 2 - 55;
    let expected = [
        ("requests", sent),
        ("admitted", 2 + triggers + 4 + 5 + 40),
        ("denied", 2),
        ("refused", 0),
        ("unmatched", 2 + triggers),
        ("bypassed", 4),
        ("unavailable", 0),
        ("calls", calls.len() as u64),
        ("limited.matched", 10),
        ("limited.admitted", 4),
        ("limited.denied", 2),
        ("limited.fail_open", 4),
        ("limited.calls", calls_of("limited").0),
        ("shadow.matched", 5),
        ("shadow.admitted", 5),
        ("shadow.shadow_would_deny", 3),
        ("shadow.calls", calls_of("shadow").0),
        ("leased.matched", 40),
        ("leased.admitted", 40),
        ("leased.leased", 40 - hot_deciding),
        ("leased.calls", hot_calls),
    ];
    let mut table = Table::new(
        "Stats of two workers against what was sent and what the proxy saw",
        &["figure", "expected", "recorded", "exact"],
    );
    let mut wrong = Vec::new();
    for (figure, want) in expected {
        let got = match figure.split_once('.') {
            Some((rule, name)) => &report["rules"][rule][name],
            None => &report[figure],
        };
        let exact = got.as_u64() == Some(want);
        table.row(vec![
            figure.to_owned(),
            want.to_string(),
            got.to_string(),
            if exact { "yes" } else { "NO" }.to_owned(),
        ]);
        if !exact {
            wrong.push(figure);
        }
    }
    table.print("stats_two_workers");
    assert!(wrong.is_empty(), "{wrong:?}:\n{report:#}");
    assert!(
        40 - hot_deciding > 0,
        "no request was decided from a lease: the test does not see them"
    );
    // Every other figure of every rule is 0 (its mode and minutes aside).
    for (rule, figures) in report["rules"].as_object().unwrap() {
        for (name, value) in figures.as_object().unwrap() {
            let listed = expected.iter().any(|(f, _)| *f == format!("{rule}.{name}"));
            if !listed && value.is_number() {
                assert_eq!(*value, Value::from(0), "{rule}.{name}");
            }
        }
    }
    assert_eq!(
        report["top_denied"],
        serde_json::json!([{"client": "c1", "rule": "limited", "denied": 2}])
    );
    for w in workers {
        assert!(
            !w.events_of("stats_write_failed").is_empty(),
            "no write failed during the spell, so none was kept for later:\n{}",
            w.log()
        );
    }
}

/// Rules whose decisions depend on the order of requests and not on their
/// timing (nothing refills while a test runs), so that a log replayed by
/// `simulate` on its own clock and the same requests sent to the worker
/// are decided alike.
const ORDERED: &str = r#"
[vars.LIMITER]
stats = true
stats_every = "1s"

[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 8
except_ips = ["10.0.0.1/32"]

[[vars.LIMITER.rules]]
name = "login"
path_prefix = "/login"
methods = ["POST"]
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 2
penalty = "1h"

[[vars.LIMITER.rules]]
name = "search"
path = "/api/search"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 3
mode = "shadow"

[[vars.LIMITER.rules]]
name = "k"
path_prefix = "/k"
key = ["query:k"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 2
"#;

/// The per-rule table of a text report: its lines from the header to the
/// first blank one.
fn rule_table(report: &str) -> String {
    let start = report.find("| rule ").expect("a table");
    let end = report[start..]
        .find("\n\n")
        .map_or(report.len(), |e| start + e);
    report[start..end].to_owned()
}

#[tokio::test]
async fn simulate_and_stats_of_the_same_traffic_give_the_same_table() {
    let stack = Stack::start(ORDERED);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // (ip, method, path): a browser, a scraper, a password guesser, a
    // search typist, and a query naming its key twice.
    let mut log: Vec<(&str, &str, String)> = Vec::new();
    for p in ["/", "/cart", "/api/items", "/"] {
        log.push(("203.0.113.5", "GET", p.to_owned()));
    }
    for i in 0..12 {
        log.push(("192.0.2.77", "GET", format!("/items/{i}")));
    }
    for _ in 0..6 {
        log.push(("198.51.100.23", "POST", "/login".to_owned()));
    }
    for q in ["s", "sh", "sho", "shoe", "shoes"] {
        log.push(("203.0.113.40", "GET", format!("/api/search?q={q}")));
    }
    for k in ["a", "a", "a", "b"] {
        log.push(("203.0.113.60", "GET", format!("/k?k={k}")));
    }
    log.push(("203.0.113.61", "GET", "/k?k=a&k=b".to_owned()));
    let http = support::http();
    let mut csv = String::from("time,ip,method,path\n");
    for (i, (ip, method, path)) in log.iter().enumerate() {
        csv.push_str(&format!("{},{ip},{method},{path}\n", now_ms + i as u64));
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        http.request(method, format!("{}{path}", stack.worker.url))
            .header("CF-Connecting-IP", *ip)
            .send()
            .await
            .unwrap();
    }
    let csv_path = stack.worker.dir.join("traffic.csv");
    std::fs::write(&csv_path, csv).unwrap();
    // The last interval, written by the worker's own timer.
    let deadline = Instant::now() + Duration::from_secs(30);
    let sent = log.len() as u64;
    let stats = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (json, _) = command(&stack, "stats", &["--json"]);
        let report: Value = serde_json::from_str(&json).unwrap();
        if report["requests"] == sent {
            break command(&stack, "stats", &[]).0;
        }
        assert!(Instant::now() < deadline, "stats hold {json}");
    };
    let csv_arg = csv_path.to_str().unwrap();
    let (simulated, _) = command(&stack, "simulate", &["--log", csv_arg, "--quiet"]);
    assert_eq!(
        rule_table(&stats),
        rule_table(&simulated),
        "stats:\n{stats}\nsimulate:\n{simulated}"
    );
    // The traffic reaches what it is for.
    let table = rule_table(&stats);
    for row in [
        "| per-ip | enforce |      31 |       22 |      4 |                     5 |                 0 |             0 |                 0 |",
        "| login  | enforce |       6 |        2 |      4 |                     0 |                 0 |             0 |                 1 |",
        "| search | shadow  |       5 |        5 |      0 |                     0 |                 2 |             0 |                 0 |",
        "| k      | enforce |       5 |        3 |      1 |                     0 |                 0 |             1 |                 0 |",
    ] {
        assert!(table.contains(row), "{row}\n{table}");
    }
}
