//! Reliability: the built worker in `wrangler dev`, limiting through a
//! fault-injecting proxy in front of the REST endpoint and a durable
//! redis-server, answers every request within its rule's budget and in its
//! rule's fail mode while something is broken, and limits exactly again,
//! with no count lost or doubled, once it is fixed.
//!
//! "Counts exact" is checked against the wire: the proxy logs every script
//! call that reached the endpoint and what Redis answered (even when the
//! worker never heard back), so after each fault the worker's own count must
//! equal the admissions Redis acknowledged, one unit each.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use edge_limiter::decision::{
    transport::protocol::{Check, ScriptCall, ScriptError, LIMITER},
    transport::redis_rest::{RestClient, RestError},
};
use edge_limiter_local::{
    fault_proxy::{Exchange, Fault, FaultProxy},
    testenv::{redis_cli, Endpoint, RedisServer},
};
use serde_json::{json, Value};
use support::{
    carried,
    report::{assert_no_secret, settled, Table},
    rules,
    worker::{Origin, Worker},
    Sent, TOKEN,
};

/// Units each client may spend per rule: far more than a scenario sends, so
/// every decided request is admitted and its count shows in `remaining`.
const LIMIT: u64 = 1000;
const BUDGET_MS: u64 = 300;
/// What the worker, workerd and the test client may add to the budget.
const MARGIN_MS: u64 = 200;
/// Requests per rule while a fault lasts.
const PER_RULE: usize = 4;

const RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "open"
key = ["ip"]
algorithm = "windowed"
windows = [["1h", 1000, "1h"]]
path_prefix = "/open"
fail = "open"
budget = "300ms"

[[vars.LIMITER.rules]]
name = "closed"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1000
path_prefix = "/closed"
fail = "closed"
budget = "300ms"
"#;

/// Which of the two rules a request falls under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Open,
    Closed,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Open => "open",
            Side::Closed => "closed",
        }
    }
}

/// What an answer was.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// Redis decided: 200 with rate-limit headers, or 429.
    Decided,
    /// Forwarded unlimited, saying so.
    FailedOpen,
    /// 503 with `Retry-After: 1`.
    FailedClosed,
    /// Anything else: a 500, a hang, a mode not asked for.
    Broken(String),
}

#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The rule's fail mode.
    FailMode,
    /// A normal decision.
    Decided,
    /// Either, as in a restart, but nothing else.
    Either,
}

#[derive(Debug, Clone)]
struct Answer {
    side: Side,
    kind: Kind,
    status: u16,
    elapsed: Duration,
    remaining: Option<u64>,
}

impl Answer {
    fn honours(&self, expect: Expect) -> bool {
        let fail_mode = match self.side {
            Side::Open => Kind::FailedOpen,
            Side::Closed => Kind::FailedClosed,
        };
        match expect {
            Expect::FailMode => self.kind == fail_mode,
            Expect::Decided => self.kind == Kind::Decided,
            Expect::Either => self.kind == fail_mode || self.kind == Kind::Decided,
        }
    }

    fn in_budget(&self) -> bool {
        self.elapsed <= Duration::from_millis(BUDGET_MS + MARGIN_MS)
    }
}

struct Stack {
    worker: Worker,
    origin: Origin,
    proxy: FaultProxy,
    _endpoint: Endpoint,
    redis: Arc<Mutex<RedisServer>>,
    redis_addr: String,
    http: reqwest::Client,
    /// Every response the worker gave, for the secret scan.
    seen: Mutex<Vec<String>>,
}

impl Stack {
    fn start() -> Stack {
        let stack = support::worker::Stack::builder(RULES)
            .durable()
            .through_fault_proxy()
            .start();
        let redis_addr = stack.backend.redis.addr();
        Stack {
            worker: stack.worker,
            origin: stack.origin,
            proxy: stack.proxy.expect("asked for"),
            _endpoint: stack.backend.endpoint,
            redis: Arc::new(Mutex::new(stack.backend.redis)),
            redis_addr,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            seen: Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on the Redis process off the async thread, so that requests
    /// in flight keep being answered (and timed) meanwhile.
    async fn with_redis(&self, f: impl FnOnce(&mut RedisServer) + Send + 'static) {
        let redis = self.redis.clone();
        tokio::task::spawn_blocking(move || f(&mut redis.lock().unwrap()))
            .await
            .expect("redis control");
    }

    async fn send(&self, side: Side, client: usize) -> Answer {
        let url = format!("{}/{}/{client}", self.worker.url, side.name());
        let started = Instant::now();
        let result = self
            .http
            .get(&url)
            .header("CF-Connecting-IP", ip(client))
            .send()
            .await;
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                return Answer {
                    side,
                    kind: Kind::Broken(format!("no answer: {e}")),
                    status: 0,
                    elapsed: started.elapsed(),
                    remaining: None,
                }
            }
        };
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        let (bypassed, retry_after) = (header("x-ratelimit-bypassed"), header("retry-after"));
        let (limited, remaining) = (header("ratelimit"), header("x-ratelimit-remaining"));
        let headers = format!("{:?}", response.headers());
        let body = response.text().await.unwrap_or_default();
        let elapsed = started.elapsed();
        self.seen
            .lock()
            .unwrap()
            .push(format!("{status}\n{headers}\n{body}"));
        let kind = match (side, status, bypassed.as_deref()) {
            (_, 200, None) if limited.is_some() => Kind::Decided,
            (_, 429, None) => Kind::Decided,
            (Side::Open, 200, Some("redis-unavailable")) => Kind::FailedOpen,
            (Side::Closed, 503, None) if retry_after.as_deref() == Some("1") => Kind::FailedClosed,
            _ => Kind::Broken(format!("{status}, bypassed {bypassed:?}: {body:.120}")),
        };
        Answer {
            side,
            kind,
            status,
            elapsed,
            remaining: remaining.and_then(|r| r.parse().ok()),
        }
    }
}

fn ip(client: usize) -> String {
    format!("198.51.100.{client}")
}

fn key(side: Side, client: usize) -> String {
    format!("el:{{{}}}:{}", ip(client), side.name())
}

/// The keys a script call in a request body names.
fn call_keys(command: &Value) -> Vec<String> {
    let Value::Array(items) = command else {
        return vec![];
    };
    let n = items.get(2).and_then(|n| {
        n.as_u64()
            .or_else(|| n.as_str().and_then(|s| s.parse().ok()))
    });
    let n = n.unwrap_or(0) as usize;
    items
        .iter()
        .skip(3)
        .take(n)
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect()
}

/// Whether Redis ran this call and admitted it (so it consumed a unit). A
/// rule alone replies with six fields, allowed first, or with one integer,
/// negative only when denied (see `lua/limiter.lua`).
fn admitted(call: &Sent) -> bool {
    call.reply.as_ref().is_some_and(|v| {
        let result = &v["result"];
        result[0].as_i64() == Some(1) || result.as_i64().is_some_and(|n| n >= 0)
    })
}

/// Units Redis acknowledged for `key`, as seen on the wire.
fn commits(exchanges: &[Exchange], key: &str) -> u64 {
    carried(exchanges)
        .iter()
        .filter(|c| admitted(c) && call_keys(&c.command).iter().any(|k| k == key))
        .count() as u64
}

/// One line of the summary.
struct Row {
    fault: String,
    answers: Vec<Answer>,
    expect: Expect,
    counts_exact: bool,
    /// What the count check compared, for the table and for failures.
    counts: String,
    note: String,
}

impl Row {
    fn within(&self) -> usize {
        self.answers.iter().filter(|a| a.in_budget()).count()
    }

    fn honoured(&self) -> usize {
        self.answers
            .iter()
            .filter(|a| a.honours(self.expect))
            .count()
    }

    fn slowest(&self) -> Duration {
        self.answers
            .iter()
            .map(|a| a.elapsed)
            .max()
            .unwrap_or_default()
    }

    fn ok(&self) -> bool {
        let n = self.answers.len();
        n > 0 && self.within() == n && self.honoured() == n && self.counts_exact
    }
}

/// Two decided requests per rule before the fault, so that the count check
/// afterwards covers state written before it too.
async fn warm(stack: &Stack, client: usize) -> Vec<Answer> {
    let mut out = Vec::new();
    for side in [Side::Open, Side::Closed, Side::Open, Side::Closed] {
        out.push(stack.send(side, client).await);
    }
    out
}

/// After the fault: one request per rule must be decided with exactly the
/// units Redis acknowledged gone, and the origin must have seen exactly the
/// requests the worker forwarded.
async fn settle(
    stack: &Stack,
    client: usize,
    before: &[Answer],
    during: &[Answer],
) -> (bool, String) {
    assert!(
        stack.proxy.wait_idle(Duration::from_secs(10)),
        "the proxy still holds requests"
    );
    let mut probes = Vec::new();
    for side in [Side::Open, Side::Closed] {
        probes.push(stack.send(side, client).await);
    }
    let exchanges = stack.proxy.exchanges();
    let hits = stack.origin.hits().await;
    let mut exact = true;
    let mut figures = Vec::new();
    for probe in &probes {
        let committed = commits(&exchanges, &key(probe.side, client));
        let expected = LIMIT - committed;
        exact &= probe.kind == Kind::Decided && probe.remaining == Some(expected);
        let path = format!("/{}/{client}", probe.side.name());
        let forwarded = before
            .iter()
            .chain(during)
            .chain(&probes)
            .filter(|a| a.side == probe.side && a.status == 200)
            .count() as u64;
        let reached = hits["paths"][&path].as_u64().unwrap_or(0);
        exact &= reached == forwarded;
        figures.push(format!(
            "{}: {committed} acked, left {}/{expected}, origin {reached}/{forwarded}",
            probe.side.name(),
            probe.remaining.map_or("?".to_owned(), |r| r.to_string()),
        ));
    }
    exact &= before.iter().all(|a| a.kind == Kind::Decided);
    (exact, figures.join("; "))
}

/// The same number of requests under each rule, each sent with the next of
/// `faults` in force at the proxy and after `between` (e.g. something done
/// to Redis), then the proxy back to passing everything through.
async fn scenario(
    stack: &Stack,
    client: usize,
    fault: &str,
    expect: Expect,
    faults: &[Fault],
    between: Option<&(dyn Fn(&Stack) + Sync)>,
) -> Row {
    let before = warm(stack, client).await;
    let mut during = Vec::new();
    for i in 0..PER_RULE * 2 {
        if let Some(f) = faults.get(i % faults.len().max(1)) {
            stack.proxy.set(f.clone());
        }
        if let Some(between) = between {
            between(stack);
        }
        let side = if i % 2 == 0 { Side::Open } else { Side::Closed };
        during.push(stack.send(side, client).await);
    }
    stack.proxy.set(Fault::Pass);
    let (counts_exact, counts) = settle(stack, client, &before, &during).await;
    Row {
        fault: fault.to_owned(),
        answers: during,
        expect,
        counts_exact,
        counts,
        note: String::new(),
    }
}

async fn redis_down(stack: &Stack, client: usize) -> Row {
    let before = warm(stack, client).await;
    stack.with_redis(RedisServer::stop).await;
    let mut during = Vec::new();
    for i in 0..PER_RULE * 2 {
        let side = if i % 2 == 0 { Side::Open } else { Side::Closed };
        during.push(stack.send(side, client).await);
    }
    stack.with_redis(RedisServer::restart).await;
    let (counts_exact, counts) = settle(stack, client, &before, &during).await;
    Row {
        fault: "Redis down (killed, then started again)".into(),
        answers: during,
        expect: Expect::FailMode,
        counts_exact,
        counts,
        note: "state kept by Redis's append-only file".into(),
    }
}

/// Four clients keep sending while Redis crashes and comes back, so some
/// requests are in flight at the crash and some arrive while it restarts.
async fn redis_restarted_under_load(stack: &Stack, client: usize) -> Row {
    let before = warm(stack, client).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = |side: Side| {
        let stop = stop.clone();
        async move {
            let mut answers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                answers.push(stack.send(side, client).await);
            }
            answers
        }
    };
    let restart = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stack.with_redis(RedisServer::crash).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        stack.with_redis(RedisServer::restart).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let (a, b, c, d, ()) = tokio::join!(
        load(Side::Open),
        load(Side::Closed),
        load(Side::Open),
        load(Side::Closed),
        restart
    );
    let during: Vec<Answer> = [a, b, c, d].into_iter().flatten().collect();
    let failed = during
        .iter()
        .filter(|x| matches!(x.kind, Kind::FailedOpen | Kind::FailedClosed))
        .count();
    let decided = during.iter().filter(|x| x.kind == Kind::Decided).count();
    let (counts_exact, counts) = settle(stack, client, &before, &during).await;
    Row {
        fault: "Redis crashed and restarted under load".into(),
        answers: during,
        expect: Expect::Either,
        // Both must have happened, or the crash missed the load.
        counts_exact: counts_exact && failed > 0 && decided > 0,
        counts,
        note: format!("{decided} decided, {failed} in fail mode"),
    }
}

fn table(rows: &[Row]) -> Table {
    let mut t = Table::new(
        &format!(
            "Faults: worker in wrangler dev, rules `open` (windowed) and `closed` (GCRA), budget {BUDGET_MS} ms"
        ),
        &[
            "fault",
            "requests",
            &format!("answered within {BUDGET_MS}+{MARGIN_MS} ms"),
            "mode honoured",
            "counts exact",
            "slowest",
            "count check (acked by Redis, left/expected, origin hits/forwarded)",
            "note",
        ],
    );
    for r in rows {
        let n = r.answers.len();
        t.row(vec![
            r.fault.clone(),
            n.to_string(),
            format!("{}/{n}", r.within()),
            format!("{}/{n}", r.honoured()),
            if r.counts_exact { "yes" } else { "NO" }.to_owned(),
            format!("{} ms", r.slowest().as_millis()),
            r.counts.clone(),
            r.note.clone(),
        ]);
    }
    t
}

#[tokio::test]
async fn every_fault_is_answered_within_budget_in_the_rules_fail_mode() {
    let stack = Stack::start();
    // The first request compiles the worker: not a fault, not timed.
    let _ = stack.send(Side::Open, 1).await;
    let garbage = [
        Fault::Reply("{\"result\":{\"allowed\":1}}".into()),
        Fault::Reply("{\"result\":\"OK\"}".into()),
        Fault::Reply("[{\"result\":[1,0,1,1,1000,999,0,0,1]}]".into()),
        Fault::Reply("{\"result\":[1,0,1]}".into()),
        Fault::Reply("{\"result\":[1,0,1,1,1000,999,0,0,\"x\"]}".into()),
        Fault::Reply("{\"outcome\":[1,0,1,1,1000,999,0,0,1]}".into()),
    ];
    let flush = |s: &Stack| {
        redis_cli(&s.redis_addr, &["SCRIPT", "FLUSH"]);
    };
    let mut rows = vec![
        scenario(
            &stack,
            10,
            "none (baseline)",
            Expect::Decided,
            &[Fault::Pass],
            None,
        )
        .await,
        redis_down(&stack, 11).await,
        redis_restarted_under_load(&stack, 12).await,
    ];
    let proxy_faults = [
        (
            "REST endpoint slow (1 s, past the budget)",
            vec![Fault::Delay(Duration::from_secs(1))],
            "held calls reach Redis after the worker gave up; they count",
        ),
        (
            "HTTP 502 with an HTML page",
            vec![Fault::Status {
                status: 502,
                body: "<html><body><h1>502 Bad Gateway</h1></body></html>".into(),
            }],
            "",
        ),
        (
            "HTTP 500 with a JSON error",
            vec![Fault::Status {
                status: 500,
                body: "{\"error\":\"ERR internal\"}".into(),
            }],
            "",
        ),
        (
            "200 with a body that is not JSON",
            vec![Fault::Reply("<html>OK</html>".into())],
            "",
        ),
        (
            "200 with truncated JSON",
            vec![Fault::Reply("{\"result\":[1,0,1,1,1000,99".into())],
            "",
        ),
        (
            "200 with JSON of an unexpected shape",
            garbage.to_vec(),
            "6 shapes in turn",
        ),
        ("connection reset before the call", vec![Fault::Reset], ""),
        (
            "connection reset after Redis ran the call",
            vec![Fault::LoseReply],
            "the call counts once: no retry doubles it",
        ),
        (
            "wrong token (401)",
            vec![Fault::Token("not-the-token".into())],
            "",
        ),
    ];
    for (i, (fault, faults, note)) in proxy_faults.iter().enumerate() {
        let mut row = scenario(&stack, 13 + i, fault, Expect::FailMode, faults, None).await;
        row.note = note.to_string();
        rows.push(row);
    }
    let client = 13 + proxy_faults.len();
    let mut row = scenario(
        &stack,
        client,
        "SCRIPT FLUSH before every call",
        Expect::Decided,
        &[],
        Some(&flush),
    )
    .await;
    let calls: Vec<Sent> = carried(&stack.proxy.exchanges())
        .into_iter()
        .filter(|c| call_keys(&c.command).contains(&key(Side::Open, client)))
        .collect();
    let noscript = calls
        .iter()
        .filter(|c| {
            c.reply.as_ref().is_some_and(|r| {
                r["error"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("NOSCRIPT"))
            })
        })
        .count();
    let evals = calls.iter().filter(|c| c.command[0] == "EVAL").count();
    row.note = format!("{noscript} NOSCRIPT answers, {evals} EVAL fallbacks");
    row.counts_exact &= noscript == PER_RULE && evals == PER_RULE;
    rows.push(row);
    table(&rows).print("faults");

    let log = settled(|| stack.worker.log());
    for row in &rows {
        let broken: Vec<_> = row
            .answers
            .iter()
            .filter(|a| !a.honours(row.expect) || !a.in_budget())
            .collect();
        assert!(
            row.ok(),
            "fault `{}`: {} | offending answers: {broken:?}\nworker log:\n{log}",
            row.fault,
            row.counts
        );
    }
    for sign in ["panicked", "RuntimeError", "Uncaught"] {
        assert!(!log.contains(sign), "the worker log shows `{sign}`:\n{log}");
    }
    let seen = stack.seen.lock().unwrap();
    assert_no_secret(TOKEN, "a worker response", seen.iter().map(String::as_str));
    assert_no_secret(TOKEN, "the worker log", [log.as_str()]);
}

/// The same faults under the native REST client: each becomes its typed
/// error, within the budget.
#[tokio::test]
async fn the_rest_client_turns_every_fault_into_a_typed_error() {
    let redis = RedisServer::start_durable();
    let endpoint = Endpoint::start(&redis.addr(), TOKEN);
    let proxy = FaultProxy::start(endpoint.addr()).unwrap();
    let client = RestClient::new(&proxy.url(), TOKEN).unwrap();
    let rule = rules(json!([
        {"name": "r", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1h", "burst": 10}
    ]))
    .remove(0);
    let call = ScriptCall::decide(
        &[(
            Check {
                rule: &rule,
                cost: 1,
            },
            vec!["192.0.2.1"],
        )],
        None,
    );
    let budget = Duration::from_millis(BUDGET_MS);
    let (keys, args) = (call.keys(), call.args());
    let run = || client.run_script(&LIMITER, &keys, &args, budget);

    // The call reads its own reply: a lone GCRA rule answers with one integer.
    type Verdict = fn(&ScriptCall, &Result<Value, RestError>) -> bool;
    let cases: [(Fault, Verdict); 9] = [
        (Fault::Pass, |call, r| {
            r.as_ref().is_ok_and(|v| call.decode(v).is_ok())
        }),
        (Fault::Delay(Duration::from_millis(800)), |_, r| {
            *r == Err(RestError::Timeout {
                budget_ms: BUDGET_MS,
            })
        }),
        (
            Fault::Status {
                status: 502,
                body: "<h1>Bad Gateway</h1>".into(),
            },
            |_, r| matches!(r, Err(RestError::Status { status: 502, .. })),
        ),
        (Fault::Reply("<html>OK</html>".into()), |_, r| {
            matches!(r, Err(RestError::Malformed(_)))
        }),
        (Fault::Reply("{\"result\":[1,0,1,1".into()), |_, r| {
            matches!(r, Err(RestError::Malformed(_)))
        }),
        (
            Fault::Reply("{\"result\":{\"allowed\":1}}".into()),
            |call, r| {
                let decided = r.as_ref().map(|v| call.decode(v));
                matches!(decided, Ok(Err(ScriptError::Reply(_))))
            },
        ),
        (Fault::Reset, |_, r| {
            matches!(r, Err(RestError::Transport(_)))
        }),
        (Fault::LoseReply, |_, r| {
            matches!(r, Err(RestError::Transport(_)))
        }),
        (Fault::Token("wrong".into()), |_, r| {
            *r == Err(RestError::Auth)
        }),
    ];
    let mut t = Table::new(
        "Faults under the native REST client (budget 300 ms)",
        &["fault", "result", "elapsed"],
    );
    let mut failures = Vec::new();
    for (fault, expected) in cases {
        proxy.set(fault.clone());
        let started = Instant::now();
        let result = run().await;
        let elapsed = started.elapsed();
        let name = format!("{fault:?}");
        t.row(vec![
            name.chars().take(60).collect(),
            format!("{result:?}").chars().take(90).collect(),
            format!("{} ms", elapsed.as_millis()),
        ]);
        // A native client on loopback needs far less margin than the worker.
        if !expected(&call, &result) || elapsed > budget + Duration::from_millis(50) {
            failures.push(format!("{name}: {result:?} after {elapsed:?}"));
        }
        if let Err(e) = &result {
            let shown = e.to_string();
            let redacted = shown.replace(TOKEN, "<TOKEN>");
            assert!(!shown.contains(TOKEN), "{name}: {redacted}");
        }
    }
    proxy.set(Fault::Pass);
    t.print("faults-native");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A server that reflects the request in its error (some proxies' error
/// pages do) must not get the token into the limiter's log, which prints
/// every `RestError`: natively, and from the worker in wrangler dev.
#[tokio::test]
async fn an_error_echoing_the_request_does_not_leak_the_token() {
    let stack = support::worker::Stack::builder(RULES)
        .durable()
        .through_fault_proxy()
        .start();
    let (worker, proxy) = (&stack.worker, stack.proxy.as_ref().expect("asked for"));
    let client = RestClient::new(&proxy.url(), TOKEN).unwrap();
    for status in [400, 502] {
        proxy.set(Fault::Echo(status));
        let error = client.command(&["PING"]).await.unwrap_err();
        let shown = error.to_string();
        // The failure message must not print the secret either.
        let redacted = shown.replace(TOKEN, "<TOKEN>");
        assert!(!shown.contains(TOKEN), "HTTP {status}: {redacted}");
    }
    proxy.set(Fault::Echo(502));
    let response = support::http()
        .get(format!("{}/closed/1", worker.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let log = settled(|| worker.log());
    assert!(
        !log.contains(TOKEN),
        "the worker log holds the token:\n{}",
        log.replace(TOKEN, "<TOKEN>")
    );
}
