//! Part 3, round trips: REST calls per decision, counted by the endpoint
//! (`GET /__stats`) around single requests to a worker whose `/rt` rule
//! admits one request per client per day, and, for ours, logins under a
//! `count_status` rule.

use std::time::Duration;

use edge_limiter_local::testenv::redis_call;
use serde_json::Value;

use crate::stack::{Worker, TOKEN};

/// The situations measured, in the order they are produced.
pub const STEPS: [&str; 6] = [
    "allowed",
    "denied",
    "denied again (cacheable)",
    "first call after SCRIPT FLUSH",
    "failed login (count_status, kept)",
    "successful login (count_status, given back)",
];

/// REST calls for each of [`STEPS`], with the status the worker answered.
pub type Counts = Vec<(u64, u16)>;

/// Requests the endpoint has served (`GET /__stats`).
pub async fn requests(http: &reqwest::Client, endpoint: &str) -> Result<u64, String> {
    let stats: Value = async {
        http.get(format!("{endpoint}/__stats"))
            .bearer_auth(TOKEN)
            .send()
            .await?
            .json()
            .await
    }
    .await
    .map_err(|e| format!("reading the endpoint's request count: {e}"))?;
    stats["requests"]
        .as_u64()
        .ok_or_else(|| format!("the endpoint has no request counter: {stats}"))
}

/// Sends one request for `path` as `ip` and returns (REST calls it
/// caused, status).
async fn one(
    http: &reqwest::Client,
    endpoint: &str,
    worker: &Worker,
    ip: &str,
    path: &str,
) -> Result<(u64, u16), String> {
    let before = requests(http, endpoint).await?;
    let status = http
        .get(format!("{}{path}", worker.url))
        .header("CF-Connecting-IP", ip)
        .send()
        .await
        .map_err(|e| format!("{}: {e}", worker.label))?
        .status()
        .as_u16();
    // Calls a worker makes after answering (waitUntil) count too.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok((requests(http, endpoint).await? - before, status))
}

/// Runs the first four steps against `worker`, and the logins too when
/// `logins`; `salt` keeps its clients apart from any other run's. Nothing
/// else may use the endpoint meanwhile.
pub async fn count(
    http: &reqwest::Client,
    endpoint: &str,
    redis: &str,
    worker: &Worker,
    salt: u8,
    logins: bool,
) -> Result<Counts, String> {
    let page = "/rt/page";
    // An earlier SCRIPT FLUSH may have left this worker's script unloaded,
    // which would add a call to the first step: one decision reloads it.
    one(
        http,
        endpoint,
        worker,
        &format!("198.51.100.{}", salt.wrapping_add(200)),
        page,
    )
    .await?;
    let ip = format!("198.51.100.{salt}");
    let mut counts = Vec::with_capacity(STEPS.len());
    for _ in 0..3 {
        counts.push(one(http, endpoint, worker, &ip, page).await?);
    }
    redis_call(redis, &["SCRIPT", "FLUSH"]);
    let fresh = format!("198.51.100.{}", salt.wrapping_add(100));
    counts.push(one(http, endpoint, worker, &fresh, page).await?);
    if logins {
        for status in [401, 200] {
            let path = format!("/login/page?status={status}");
            counts.push(one(http, endpoint, worker, &ip, &path).await?);
        }
    }
    Ok(counts)
}
