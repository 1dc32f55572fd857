//! Part 9, requests in flight: our worker under an in-flight rule
//! (`algorithm = "concurrency"`), its REST endpoint behind a proxy that
//! counts the REST requests, which carry each decision and each release
//! after a response. First clients at once that each stay within the
//! limit, for the REST requests per request; then one client sending
//! more at once than the limit, for what the origin, counting for itself,
//! held at once. The peer has no in-flight limit.

use std::time::Duration;

use edge_limiter_local::fault_proxy::FaultProxy;
use futures_util::future::join_all;

use crate::stack::{Origin, Worker};

/// The rule: at most this many requests of a client in flight.
pub const LIMIT: u64 = 4;

/// Clients at once, each sending `ROUNDS` requests one after another.
pub const CLIENTS: u64 = 8;

/// Requests each client sends in the first run.
const ROUNDS: u64 = 40;

/// How long the origin takes over each body, ms: a slow answer; and the
/// crowd's, long enough that its admitted requests overlap at the origin.
const DRIP_MS: u64 = 20;
const CROWD_DRIP_MS: u64 = 500;

/// The rules of the part's worker.
pub fn rules() -> String {
    format!(
        "[[vars.LIMITER.rules]]\nname = \"in-flight\"\nkey = [\"ip\"]\nalgorithm = \"concurrency\"\n\
         limit = {LIMIT}\npath_prefix = \"/held/\"\n"
    )
}

/// What part 9 measured.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlight {
    /// Requests of the first run, and the REST requests they took,
    /// releases included.
    pub requests: u64,
    pub rest_requests: u64,
    /// The second run: requests sent at once by one client, and the most
    /// the origin held at once.
    pub crowd: u64,
    pub most_held: u64,
}

impl InFlight {
    /// REST requests per request of the first run.
    pub fn per_request(&self) -> f64 {
        self.rest_requests as f64 / self.requests.max(1) as f64
    }
}

/// Runs both measurements through `worker`, whose endpoint `proxy` fronts.
pub async fn measure(
    http: &reqwest::Client,
    worker: &Worker,
    proxy: &FaultProxy,
    origin: &Origin,
) -> Result<InFlight, String> {
    let key = std::process::id();
    let path = format!("/held/bench-{key}");
    let ip = |c: u64| format!("198.51.100.{}", 1 + c % 200);
    // Each client's first request loads the script: not what is counted.
    let ips: Vec<String> = (0..CLIENTS).map(ip).collect();
    join_all(
        ips.iter()
            .map(|ip| get(http, &worker.url, &path, ip, DRIP_MS)),
    )
    .await;
    settle(proxy).await;
    let before = proxy.exchanges().len() as u64;
    let clients = ips.iter().map(|ip| {
        let path = &path;
        async move {
            for _ in 0..ROUNDS {
                get(http, &worker.url, path, ip, DRIP_MS).await?;
            }
            Ok::<(), String>(())
        }
    });
    join_all(clients)
        .await
        .into_iter()
        .collect::<Result<(), _>>()?;
    settle(proxy).await;
    let rest_requests = proxy.exchanges().len() as u64 - before;
    let crowd = 4 * LIMIT;
    let crowded = format!("/held/crowd-{key}");
    let sent = (0..crowd).map(|_| get(http, &worker.url, &crowded, "203.0.113.99", CROWD_DRIP_MS));
    join_all(sent)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let held = format!("{}/__origin/held?path={crowded}", origin.url);
    let counted: serde_json::Value = http
        .get(held)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    Ok(InFlight {
        requests: CLIENTS * ROUNDS,
        rest_requests,
        crowd,
        most_held: counted["most"].as_u64().unwrap_or(u64::MAX),
    })
}

/// One request from `ip` whose body comes `drip_ms` after its headers,
/// read to the end; its status.
pub async fn get(
    http: &reqwest::Client,
    url: &str,
    path: &str,
    ip: &str,
    drip_ms: u64,
) -> Result<u16, String> {
    let r = http
        .get(format!("{url}{path}?drip={drip_ms}"))
        .header("CF-Connecting-IP", ip)
        .send()
        .await
        .map_err(|e| format!("part 9: {e}"))?;
    let status = r.status().as_u16();
    r.bytes().await.map_err(|e| format!("part 9: {e}"))?;
    Ok(status)
}

/// Waits until the releases after the last responses have gone.
async fn settle(proxy: &FaultProxy) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.wait_idle(Duration::from_secs(5));
}
