//! Concurrency across instances: two `wrangler dev` workers (two isolates,
//! nothing shared but Redis) under 64 concurrent clients on one key admit
//! exactly the limit, for each algorithm and for two rules on one request.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::sync::Arc;

use support::{
    report::{assert_no_secret, settled, Table},
    worker::Stack,
    TOKEN,
};
use tokio::sync::Barrier;

const CLIENTS: usize = 64;
/// Requests each client sends per case, one to each worker.
const EACH: usize = 2;

const RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "gcra"
key = ["header:x-client"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 40
path_prefix = "/gcra"
budget = "10s"

[[vars.LIMITER.rules]]
name = "windowed"
key = ["header:x-client"]
algorithm = "windowed"
windows = [["1h", 40, "1m"]]
path_prefix = "/windowed"
budget = "10s"

[[vars.LIMITER.rules]]
name = "multi"
key = ["header:x-client"]
algorithm = "windowed"
windows = [["10m", 60, "1m"], ["1h", 35, "5m"]]
path_prefix = "/multi"
budget = "10s"

[[vars.LIMITER.rules]]
name = "both-g"
key = ["header:x-client"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 50
path_prefix = "/both"
budget = "10s"

[[vars.LIMITER.rules]]
name = "both-w"
key = ["header:x-client"]
algorithm = "windowed"
windows = [["1h", 30, "1m"]]
path_prefix = "/both"
budget = "10s"
"#;

/// What came back for one case.
#[derive(Default)]
struct Tally {
    admitted: [u64; 2],
    denied: u64,
    other: Vec<String>,
    /// The last denial's `RateLimit` header: every rule's units left.
    ratelimit: String,
}

async fn hammer(workers: &[String; 2], path: &str, client_key: &str) -> (Tally, Vec<String>) {
    let http = support::http();
    let start = Arc::new(Barrier::new(CLIENTS));
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (http, start) = (http.clone(), start.clone());
            let urls: Vec<String> = (0..EACH)
                .map(|i| format!("{}{path}", workers[(c + i) % 2]))
                .collect();
            let client_key = client_key.to_owned();
            tokio::spawn(async move {
                start.wait().await;
                let mut out = Vec::new();
                for (i, url) in urls.iter().enumerate() {
                    let r = http.get(url).header("x-client", &client_key).send().await;
                    let (status, ratelimit, dump) = match r {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let ratelimit = r
                                .headers()
                                .get("ratelimit")
                                .map(|v| v.to_str().unwrap_or("").to_owned())
                                .unwrap_or_default();
                            let head = format!("{status}\n{:?}\n", r.headers());
                            let body = r.text().await.unwrap_or_default();
                            (status, ratelimit, head + &body)
                        }
                        Err(e) => (0, String::new(), e.to_string()),
                    };
                    out.push(((c + i) % 2, status, ratelimit, dump));
                }
                out
            })
        })
        .collect();
    let mut tally = Tally::default();
    let mut dumps = Vec::new();
    for task in tasks {
        for (worker, status, ratelimit, dump) in task.await.expect("client task") {
            match status {
                200 => tally.admitted[worker] += 1,
                429 => {
                    tally.denied += 1;
                    tally.ratelimit = ratelimit;
                }
                _ => tally.other.push(format!("worker {worker}: {dump:.200}")),
            }
            dumps.push(dump);
        }
    }
    (tally, dumps)
}

/// `r` of one item in a `RateLimit` header: `"name";r=N;t=T, ...`.
fn units_left(ratelimit: &str, name: &str) -> Option<u64> {
    ratelimit
        .split(',')
        .find(|item| item.trim().starts_with(&format!("\"{name}\";")))?
        .split(';')
        .find_map(|p| p.trim().strip_prefix("r="))?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_admit_exactly_the_limit_under_64_concurrent_clients() {
    let stack = Stack::builder(RULES).instances(2).start();
    let (a, b, origin) = (&stack.worker, &stack.others[0], &stack.origin);
    let workers = [a.url.clone(), b.url.clone()];
    // Compile the worker in both isolates before the clock matters.
    for w in &workers {
        support::http()
            .get(format!("{w}/warm"))
            .send()
            .await
            .unwrap();
    }

    let cases = [
        ("GCRA, burst 40", "/gcra", 40, None),
        ("windowed, 40 per hour", "/windowed", 40, None),
        ("windowed, 60/10 min and 35/h", "/multi", 35, None),
        (
            "GCRA burst 50 + windowed 30 on one request",
            "/both",
            30,
            Some(("both-g", 50 - 30)),
        ),
    ];
    let mut table = Table::new(
        &format!(
            "Two wrangler dev instances, one Redis, {CLIENTS} concurrent clients on one key, {EACH} requests each"
        ),
        &[
            "case",
            "limit",
            "requests",
            "admitted (A + B)",
            "denied",
            "other",
            "exact",
        ],
    );
    let mut failures = Vec::new();
    let mut dumps = Vec::new();
    for (name, path, limit, other_rule) in cases {
        let (tally, seen) = hammer(&workers, path, "tenant-1").await;
        dumps.extend(seen);
        let admitted = tally.admitted[0] + tally.admitted[1];
        let hits = origin.hits().await["paths"][path].as_u64().unwrap_or(0);
        // The non-binding rule consumed for exactly the admitted requests.
        let other_ok =
            other_rule.is_none_or(|(rule, left)| units_left(&tally.ratelimit, rule) == Some(left));
        let exact = admitted == limit
            && tally.denied == (CLIENTS * EACH) as u64 - limit
            && tally.other.is_empty()
            && hits == admitted
            && other_ok;
        table.row(vec![
            name.to_owned(),
            limit.to_string(),
            (CLIENTS * EACH).to_string(),
            format!("{admitted} ({} + {})", tally.admitted[0], tally.admitted[1]),
            tally.denied.to_string(),
            tally.other.len().to_string(),
            if exact { "yes" } else { "NO" }.to_owned(),
        ]);
        if !exact {
            failures.push(format!(
                "{name}: admitted {admitted} of limit {limit}, origin saw {hits}, last RateLimit `{}`, other answers {:?}",
                tally.ratelimit, tally.other
            ));
        }
    }
    table.print("instances");
    assert!(
        failures.is_empty(),
        "{failures:#?}\nworker A log:\n{}\nworker B log:\n{}",
        a.log(),
        b.log()
    );
    assert_no_secret(TOKEN, "a worker response", dumps.iter().map(String::as_str));
    let logs = [settled(|| a.log()), settled(|| b.log())];
    assert_no_secret(TOKEN, "the workers' logs", logs.iter().map(String::as_str));
}
