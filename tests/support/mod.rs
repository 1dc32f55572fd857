//! What the native integration tests share: a real redis-server behind the
//! local REST endpoint, and helpers to run the limiter script through it.
#![allow(dead_code)] // Each test binary uses its own subset.

pub mod tls;
pub mod worker;

use std::time::Duration;

use edge_limiter::{
    decision::{
        outcomes::verdict::Decision,
        transport::keys::redis_key,
        transport::protocol::{run, Check, RefundCharge, Reply, ScriptCall},
        transport::redis_rest::RestClient,
    },
    rules::{config::Config, rule::Rule},
};
use edge_limiter_local::{
    fault_proxy::Exchange,
    testenv::{Endpoint, RedisServer},
};
use serde_json::{json, Value};

/// The token the test endpoints accept.
pub const TOKEN: &str = "test-token-8f2c";

/// Generous: these tests are about correctness, not speed.
pub const BUDGET: Duration = Duration::from_secs(10);

/// A redis-server, the REST endpoint in front of it, and a client for it.
/// Both processes die with this value, even when a test panics.
pub struct Backend {
    pub client: RestClient,
    pub endpoint: Endpoint,
    pub redis: RedisServer,
}

impl Backend {
    pub fn start() -> Backend {
        Backend::on(RedisServer::start())
    }

    /// On a Redis that keeps its data across a restart.
    pub fn start_durable() -> Backend {
        Backend::on(RedisServer::start_durable())
    }

    /// On a one-node Redis Cluster, which refuses keys of several slots.
    pub fn start_cluster() -> Backend {
        Backend::on(RedisServer::start_cluster())
    }

    fn on(redis: RedisServer) -> Backend {
        let endpoint = Endpoint::start(&redis.addr(), TOKEN);
        let client = RestClient::new(&endpoint.url(), TOKEN).unwrap();
        Backend {
            client,
            endpoint,
            redis,
        }
    }

    /// Runs a decision over `rules` for one client, `cost` each, at `now_ms`
    /// (`None`: Redis's clock).
    pub async fn decide(
        &self,
        rules: &[&Rule],
        id: &str,
        cost: u64,
        now_ms: Option<u64>,
    ) -> Decision {
        let checks: Vec<_> = rules
            .iter()
            .map(|r| (Check { rule: r, cost }, vec![id]))
            .collect();
        let call = ScriptCall::decide(&checks, now_ms);
        run(&self.client, &call, BUDGET)
            .await
            .and_then(Reply::decision)
            .expect("script call")
    }

    /// The mark of `d`'s only rule, which must have been charged: a
    /// refund's, or an in-flight release's.
    pub fn mark(d: &Decision) -> u64 {
        assert!(d.admitted(), "{d:?}");
        match d.refund_marks[..] {
            [(0, mark)] => mark,
            _ => panic!("one mark: {d:?}"),
        }
    }

    /// Gives back (or, `debit`, charges again) `cost` units of the charge
    /// `mark` stands for, made under `rule` for the client `id`, at
    /// `now_ms`: whether the call moved anything.
    pub async fn settle(
        &self,
        (rule, id): (&Rule, &str),
        (cost, mark): (u64, u64),
        now_ms: Option<u64>,
        debit: bool,
    ) -> bool {
        let key = redis_key(&rule.name, &[id]);
        let charge = RefundCharge {
            check: Check { rule, cost },
            id: vec![id],
            key: &key,
            mark,
            under: "",
        };
        let call = match debit {
            true => ScriptCall::debit(&[charge], now_ms),
            false => ScriptCall::refund(&[charge], now_ms),
        };
        match run(&self.client, &call, BUDGET)
            .await
            .expect("a settlement")
        {
            Reply::Refunded(moved) => moved == [true],
            other => panic!("{other:?}"),
        }
    }

    /// Calls of the limiter script that reached Redis (EVALSHA and EVAL).
    pub fn script_calls(&self) -> u64 {
        let stats = self.redis(&["INFO", "commandstats"]);
        ["cmdstat_evalsha:calls=", "cmdstat_eval:calls="]
            .iter()
            .filter_map(|prefix| stats.lines().find_map(|l| l.strip_prefix(prefix)))
            .map(|rest| rest.split(',').next().unwrap().parse::<u64>().unwrap())
            .sum()
    }

    /// What the REST endpoint has counted so far (`GET /__stats`):
    /// requests, commands, and requests by the commands they carried.
    pub async fn endpoint_stats(&self) -> Value {
        let url = format!("{}/__stats", self.endpoint.url());
        json_of(http().get(url).bearer_auth(TOKEN)).await
    }

    /// A command straight to Redis, bypassing the endpoint. An error reply
    /// fails the test: a setup step that did not happen (a `WRONGTYPE`)
    /// must not pass for a value.
    pub fn redis(&self, args: &[&str]) -> String {
        match edge_limiter_local::testenv::redis_call(&self.redis.addr(), args) {
            edge_limiter_local::resp::Value::Error(e) => panic!("{args:?}: {e}"),
            reply => reply.to_string(),
        }
    }
}

/// The HTTP client for a test's requests, one per test thread.
///
/// Each `reqwest::Client::new()` loads the system's root certificates
/// (native-tls): about 60 ms of CPU on this machine, paid per request by
/// helpers that built a client for each, and seconds on a loaded one.
/// Every request opens a connection of its own: none is kept idle, so
/// none outlives the test's runtime, which opened it.
pub fn http() -> reqwest::Client {
    thread_local! {
        static CLIENT: reqwest::Client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .expect("an HTTP client");
    }
    CLIENT.with(reqwest::Client::clone)
}

/// The JSON body of the answer to `request`, which must come.
pub async fn json_of(request: reqwest::RequestBuilder) -> Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// A response header's value, if it is there.
pub fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

/// Rules from their JSON form, e.g. `json!({"name": "a", ...})`.
pub fn rules(list: Value) -> Vec<Rule> {
    Config::from_json(&json!({ "rules": list }))
        .expect("test rules are valid")
        .rules
}

pub mod raw_http;
pub mod report;

/// One command as it went through the proxy: what was sent, and what
/// Redis answered for it (`{"result": ..}` or `{"error": ..}`), if the
/// answer came. A `/pipeline` carries several, each answered on its own.
pub struct Sent {
    /// The command, as JSON (`["EVALSHA", sha, n, keys.., args..]`).
    pub command: Value,
    /// Redis's answer to it, `None` if none came back.
    pub reply: Option<Value>,
}

/// Every command the proxy carried, in order.
pub fn carried(exchanges: &[Exchange]) -> Vec<Sent> {
    let mut all = Vec::new();
    for e in exchanges {
        let Ok(body) = serde_json::from_slice::<Value>(&e.request) else {
            continue;
        };
        let reply = e.upstream.as_ref();
        let reply = reply.and_then(|(_, b)| serde_json::from_slice::<Value>(b).ok());
        match body {
            Value::Array(entries) if entries.first().is_some_and(Value::is_array) => {
                for (i, command) in entries.into_iter().enumerate() {
                    let reply = reply.as_ref().and_then(|r| r.get(i)).cloned();
                    all.push(Sent { command, reply });
                }
            }
            command => all.push(Sent { command, reply }),
        }
    }
    all
}

/// The first TOML block under `heading` in docs/rules.md: a page's
/// example, run as written.
pub fn documented_rule(heading: &str) -> String {
    documented("docs/rules.md", heading, ("toml", 1))
}

/// The `nth` (from 1) ```LANG block after `heading` in `page` (a path
/// from the repository's root): what a user would paste from it.
pub fn documented(page: &str, heading: &str, (lang, nth): (&str, usize)) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
    let section = (text.split(heading).nth(1)).unwrap_or_else(|| panic!("{heading} in {page}"));
    let block = (section.split(&format!("```{lang}\n")).nth(nth))
        .unwrap_or_else(|| panic!("a {lang} block after {heading} in {page}"));
    block.split("```").next().unwrap().to_owned()
}
