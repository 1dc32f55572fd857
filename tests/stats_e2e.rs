//! Stats end to end: the built worker in `wrangler dev` counts what it did
//! and writes it, after responses, at most every `stats_every`; with stats
//! off it writes nothing and calls nothing more.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::time::{Duration, Instant};

use edge_limiter::decision::stats::{
    counts::{RuleCount, TotalCount},
    stored::{day_key, read_rule_day, read_totals_day, DAY_MS, STATS},
};
use serde_json::Value;
use support::{worker::Stack, Backend};

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
    let client = reqwest::Client::new();
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

/// Today's request-wide figures and `rule`'s, summed over the minutes.
fn kept(b: &Backend, rule: &str) -> (Vec<u64>, Vec<u64>, Vec<(String, u64)>) {
    let day = today();
    let mut totals = vec![0; TotalCount::ALL.len()];
    for (_, t) in read_totals_day(day, &pairs(b, &day_key(day, None))) {
        totals.iter_mut().zip(t.0).for_each(|(a, b)| *a += b);
    }
    let mut rules = vec![0; RuleCount::ALL.len()];
    let mut clients: Vec<(String, u64)> = Vec::new();
    for (_, r, top) in read_rule_day(day, &pairs(b, &day_key(day, Some(rule)))) {
        rules.iter_mut().zip(r.0).for_each(|(a, b)| *a += b);
        for (c, n) in top.top(10) {
            clients.push((c.to_owned(), n));
        }
    }
    (totals, rules, clients)
}

#[tokio::test]
async fn a_worker_writes_what_it_did_after_stats_every() {
    let stack = Stack::start(&with_stats(PER_IP));
    let url = format!("{}/page", stack.worker.url);
    let statuses = send(&url, "203.0.113.10", 5).await;
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let b = &stack.backend;
    assert_eq!(kept(b, "per-ip").0[0], 0, "nothing written before a second");
    // The next request after `stats_every` writes everything, itself too.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut sent = 5;
    loop {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        send(&url, "203.0.113.10", 1).await;
        sent += 1;
        let (totals, _, _) = kept(b, "per-ip");
        if totals[TotalCount::Requests as usize] == sent {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kept {totals:?} of {sent}; log:\n{}",
            stack.worker.log()
        );
    }
    let (totals, rule, clients) = kept(b, "per-ip");
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
    assert_eq!(clients, [("203.0.113.10".to_owned(), denied)]);
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

/// `edge-limiter stats ARGS` in the worker's directory, reading its
/// wrangler.toml and .dev.vars as an operator beside it would: stdout and
/// stderr, once it succeeded.
fn stats_command(stack: &Stack, args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edge-limiter"))
        .arg("stats")
        .args(args)
        .current_dir(&stack.worker.dir)
        .env_remove("UPSTASH_REDIS_REST_URL")
        .env_remove("UPSTASH_REDIS_REST_TOKEN")
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
