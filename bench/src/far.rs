//! Part 6, Redis far away: the REST endpoint behind the fault proxy, which
//! holds every request 40 ms before passing it on, so that each REST call
//! costs what a real round trip to a distant Redis does. One request at a
//! time, each worker request just after a passthrough one, so that the added
//! latency compares two requests made under the same conditions.

use std::time::Duration;

use edge_limiter_local::fault_proxy::FaultProxy;

use crate::{
    stack::Worker,
    stats::percentile,
    timed::{timed, timed_as_client},
};

/// How far away Redis is: the delay the proxy adds to every REST call.
pub const DELAY: Duration = Duration::from_millis(40);

/// What each client's first, second and third request meet, in that order,
/// under a rule that admits one request per client per day.
pub const SITUATIONS: [&str; 3] = ["allowed", "denied", "denied again (cacheable)"];

/// One situation, for one worker.
#[derive(Debug, Clone, Default)]
pub struct Situation {
    /// Each request's latency through the worker, ms.
    pub worker_ms: Vec<f64>,
    /// The passthrough's, one request sent just before each of those.
    pub passthrough_ms: Vec<f64>,
    /// REST calls that reached the proxy during the situation.
    pub calls: u64,
    /// The worker's answers, as (status, how many).
    pub statuses: Vec<(u16, u64)>,
}

impl Situation {
    /// How much later than the passthrough the worker answers at the `p`-th
    /// percentile (0..100), ms.
    pub fn added_ms(&self, p: f64) -> f64 {
        percentile(&self.worker_ms, p) - percentile(&self.passthrough_ms, p)
    }

    /// REST calls per request.
    pub fn calls_per_decision(&self) -> f64 {
        self.calls as f64 / self.worker_ms.len().max(1) as f64
    }

    /// Keeps a worker request's latency and status.
    fn answered(&mut self, ms: f64, status: u16) {
        self.worker_ms.push(ms);
        match self.statuses.iter_mut().find(|(st, _)| *st == status) {
            Some((_, n)) => *n += 1,
            None => self.statuses.push((status, 1)),
        }
    }
}

/// REST calls `proxy` has seen since it had seen `before`, once `worker`'s
/// are over: calls a worker makes after answering (waitUntil) count too.
async fn calls_since(proxy: &FaultProxy, before: usize, worker: &Worker) -> Result<u64, String> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    if !proxy.wait_idle(Duration::from_secs(10)) {
        return Err(format!("{}: REST calls still in flight", worker.label));
    }
    Ok((proxy.exchanges().len() - before) as u64)
}

/// Sends `clients` fresh clients through `worker`'s `/rt` rule three times
/// each, one situation after the other; `salt` keeps these clients apart
/// from any other run's. Nothing else may use the proxy meanwhile.
pub async fn measure(
    http: &reqwest::Client,
    worker: &Worker,
    passthrough: &Worker,
    proxy: &FaultProxy,
    clients: u32,
    salt: u16,
) -> Result<Vec<Situation>, String> {
    let mut out = Vec::with_capacity(SITUATIONS.len());
    for _ in SITUATIONS {
        let before = proxy.exchanges().len();
        let mut s = Situation::default();
        for client in 0..clients {
            // A /64 of its own: ours counts an IPv6 client by its /64.
            let ip = format!("2001:db8:{salt:x}:{client:x}::1");
            let by_ip = [("CF-Connecting-IP", ip.as_str())];
            let (base, _) = timed(http, &format!("{}/rt/page", passthrough.url), &by_ip).await?;
            let (ms, status) = timed(http, &format!("{}/rt/page", worker.url), &by_ip).await?;
            s.passthrough_ms.push(base);
            s.answered(ms, status);
        }
        s.calls = calls_since(proxy, before, worker).await?;
        out.push(s);
    }
    Ok(out)
}

/// Requests a fresh client sends at once in a page load: the document and
/// what it pulls in, as a browser opening a page does.
pub const PAGE: usize = 30;

/// Where each worker's page load goes, and whether it leases: ours under
/// GCRA 100 a second with `lease` (`/timed/hot`) and without
/// (`/timed/page`), the peer under its sliding window of 100 a second.
pub const PAGE_LOADS: [(&str, &str); 3] = [
    ("lease = 20", "/timed/hot"),
    ("no lease", "/timed/page"),
    ("peer", "/timed/hot"),
];

/// `pages` page loads through `worker` at `path`, each [`PAGE`] requests of
/// a fresh client at once (`salt` keeps the clients apart from other
/// runs'), each just after as many at once through the passthrough; the
/// REST calls counted at `proxy` over all `pages` (the report divides).
pub async fn page_loads(
    http: &reqwest::Client,
    worker: &Worker,
    passthrough: &Worker,
    proxy: &FaultProxy,
    path: &str,
    pages: u32,
    salt: &str,
) -> Result<Situation, String> {
    let mut s = Situation::default();
    for page in 0..pages {
        let key = format!("page-{salt}-{page}");
        let base = at_once(http, &format!("{}{path}", passthrough.url), &key).await?;
        s.passthrough_ms.extend(base.iter().map(|(ms, _)| ms));
        let before = proxy.exchanges().len();
        for (ms, status) in at_once(http, &format!("{}{path}", worker.url), &key).await? {
            s.answered(ms, status);
        }
        s.calls += calls_since(proxy, before, worker).await?;
    }
    Ok(s)
}

/// [`PAGE`] requests of the client `key` to `url`, all sent at once.
async fn at_once(http: &reqwest::Client, url: &str, key: &str) -> Result<Vec<(f64, u16)>, String> {
    let mut sent = tokio::task::JoinSet::new();
    for i in 0..PAGE {
        let (http, url, key) = (http.clone(), format!("{url}/{i}"), key.to_owned());
        sent.spawn(async move { timed_as_client(&http, &url, &key).await });
    }
    let mut out = Vec::with_capacity(PAGE);
    while let Some(done) = sent.join_next().await {
        out.push(done.map_err(|e| e.to_string())??);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_latency_and_calls() {
        let s = Situation {
            worker_ms: vec![45.0, 50.0, 44.0, 60.0],
            passthrough_ms: vec![4.0, 5.0, 6.0, 9.0],
            calls: 4,
            statuses: vec![(200, 4)],
        };
        assert_eq!(s.added_ms(50.0), 40.0);
        assert_eq!(s.added_ms(99.0), 51.0);
        assert_eq!(s.calls_per_decision(), 1.0);
    }
}
