//! Part 7, a hot key under quota leases: one client at a steady 70 % of
//! its limit, ours (with `lease`) and the peer side by side, each request
//! timed beside a passthrough request made just before it; REST calls
//! counted at a proxy in front of each worker's endpoint; what reached the
//! origin checked against the limit from the origin's own arrival times.
//! Then two of our workers sharing one Redis, both sending the same key
//! above its limit.

use std::time::Duration;

use edge_limiter_local::fault_proxy::FaultProxy;

use crate::{
    cpu,
    stack::{Origin, Worker},
    stats::percentile,
    timed::timed_as_client,
};

/// The hot client's limit: GCRA, this many a second, as burst too.
pub const RATE: u64 = 100;
/// Its lease: units, and how long (ms).
pub const LEASE: (u64, u64) = (20, 500);
/// What the hot client sends, a second: 70 % of its limit.
pub const SEND_RPS: u64 = 70;
/// The shared key's limit (GCRA, a second, as burst too) and lease, for
/// two workers each sending [`SEND_RPS`].
pub const SHARED: (u64, (u64, u64)) = (50, (10, 200));

/// The `[[vars.LIMITER.rules]]` of ours for this part: `/timed/hot` and
/// `/timed/shared`, each keyed on the API key.
pub fn our_rules() -> String {
    let rule = |name: &str, rate: u64, (units, for_ms): (u64, u64)| {
        format!(
            "[[vars.LIMITER.rules]]\nname = \"{name}\"\nkey = [\"header:x-api-key\"]\nalgorithm = \"gcra\"\nrate = {rate}\nperiod = \"1s\"\nburst = {rate}\nlease = {units}\nlease_for = \"{for_ms}ms\"\npath_prefix = \"/timed/{name}\"\n\n"
        )
    };
    // Part 6's page load without a lease: the hot rule's figures.
    let page = format!(
        "[[vars.LIMITER.rules]]\nname = \"page\"\nkey = [\"header:x-api-key\"]\nalgorithm = \"gcra\"\nrate = {RATE}\nperiod = \"1s\"\nburst = {RATE}\npath_prefix = \"/timed/page\"\n\n"
    );
    rule("hot", RATE, LEASE) + &rule("shared", SHARED.0, SHARED.1) + &page
}

/// The peer's rule for the hot path, as `PEER_RULES` holds it.
pub fn peer_rule() -> String {
    format!("{{\"prefix\": \"/timed/hot\", \"limit\": {RATE}, \"window\": \"1 s\"}}")
}

/// One worker's steady run.
#[derive(Debug, Clone, Default)]
pub struct Steady {
    /// Each request's latency, ms, and the passthrough's just before it.
    pub worker_ms: Vec<f64>,
    pub passthrough_ms: Vec<f64>,
    /// Requests the worker admitted, and REST calls it made meanwhile.
    pub admitted: u64,
    pub calls: u64,
    /// workerd CPU seconds, the worker's and the passthrough's.
    pub cpu_s: f64,
    pub passthrough_cpu_s: f64,
    /// What reached the origin over the limit, from its arrival times.
    pub over: u64,
}

impl Steady {
    /// Added latency at the `p`-th percentile over the passthrough, ms.
    pub fn added_ms(&self, p: f64) -> f64 {
        percentile(&self.worker_ms, p) - percentile(&self.passthrough_ms, p)
    }

    /// REST calls per admitted request.
    pub fn calls_per_allowed(&self) -> f64 {
        self.calls as f64 / self.admitted.max(1) as f64
    }

    /// workerd CPU per request over the passthrough's, ms.
    pub fn cpu_ms(&self) -> f64 {
        (self.cpu_s - self.passthrough_cpu_s) * 1000.0 / self.worker_ms.len().max(1) as f64
    }
}

/// `worker`'s REST calls go through `proxy`; `key` is the hot client's
/// (fresh per run), `seconds` how long it sends at [`SEND_RPS`].
pub struct Subject<'a> {
    pub worker: &'a Worker,
    pub proxy: &'a FaultProxy,
    pub key: String,
    pub seconds: u64,
}

/// The hot client through `subject` at [`SEND_RPS`], each request just
/// after a passthrough one, then the origin's arrivals checked.
pub async fn steady(
    http: &reqwest::Client,
    subject: &Subject<'_>,
    passthrough: &Worker,
    origin: &Origin,
) -> Result<Steady, String> {
    let path = format!("/timed/hot/{}", subject.key);
    let before = subject.proxy.exchanges().len();
    let cpu_before = cpu::snapshot();
    let mut s = Steady::default();
    let tick = Duration::from_secs(1) / SEND_RPS as u32;
    let start = tokio::time::Instant::now();
    for i in 0..subject.seconds * SEND_RPS {
        tokio::time::sleep_until(start + tick * i as u32).await;
        let (base, _) = timed_as_client(
            http,
            &format!("{}/free{path}", passthrough.url),
            &subject.key,
        )
        .await?;
        let (ms, status) =
            timed_as_client(http, &format!("{}{path}", subject.worker.url), &subject.key).await?;
        s.passthrough_ms.push(base);
        s.worker_ms.push(ms);
        s.admitted += u64::from(status == 200);
    }
    // Refreshes after a response count too.
    tokio::time::sleep(Duration::from_millis(300)).await;
    subject.proxy.wait_idle(Duration::from_secs(10));
    s.calls = (subject.proxy.exchanges().len() - before) as u64;
    let used = cpu::snapshot();
    let workerd = |w: &Worker| {
        let group = w.group.child.id();
        used.since(&cpu_before, |_, p| p.pgrp == group && p.comm == "workerd")
    };
    s.cpu_s = workerd(subject.worker);
    s.passthrough_cpu_s = workerd(passthrough);
    let arrivals = arrivals(http, origin, &path).await?;
    s.over = over(&arrivals, RATE, RATE);
    Ok(s)
}

/// What two workers sharing one Redis admitted of one key above its limit.
#[derive(Debug, Clone, Default)]
pub struct Shared {
    pub sent: u64,
    pub admitted: u64,
    /// What reached the origin over the exact bound, in any interval.
    pub over: u64,
    /// The most the limit allows over the run: burst + rate x seconds.
    pub allowed: u64,
}

/// Both `workers` send the same fresh key at [`SEND_RPS`] each for
/// `seconds`, above [`SHARED`]'s limit.
pub async fn shared(
    http: &reqwest::Client,
    workers: [&Worker; 2],
    origin: &Origin,
    key: &str,
    seconds: u64,
) -> Result<Shared, String> {
    let path = format!("/timed/shared/{key}");
    let tick = Duration::from_secs(1) / SEND_RPS as u32;
    let start = tokio::time::Instant::now();
    let mut s = Shared::default();
    for i in 0..seconds * SEND_RPS {
        tokio::time::sleep_until(start + tick * i as u32).await;
        let [a, b] = workers.map(|w| format!("{}{path}", w.url));
        let (a, b) = tokio::join!(
            timed_as_client(http, &a, key),
            timed_as_client(http, &b, key)
        );
        for (_, status) in [a?, b?] {
            s.sent += 1;
            s.admitted += u64::from(status == 200);
        }
    }
    let arrivals = arrivals(http, origin, &path).await?;
    let elapsed_s = arrivals
        .first()
        .zip(arrivals.last())
        .map_or(0.0, |(a, b)| (b - a) / 1000.0);
    s.over = over(&arrivals, SHARED.0, SHARED.0);
    s.allowed = SHARED.0 + (SHARED.0 as f64 * elapsed_s) as u64;
    Ok(s)
}

async fn arrivals(http: &reqwest::Client, origin: &Origin, path: &str) -> Result<Vec<f64>, String> {
    let url = format!("{}/__origin/arrivals?path={path}", origin.url);
    async { http.get(&url).send().await?.json().await }
        .await
        .map_err(|e| format!("reading the origin's arrivals: {e}"))
}

/// How far what reached the origin (`arrivals`, ms, ascending) went over
/// `rate` a second with `burst` at once, in the worst interval: at most
/// `burst + rate x (t_j - t_i)` may arrive in any [t_i, t_j], with 5 ms for
/// the forwarding's jitter, since the origin sees a request a little after
/// it was decided.
fn over(arrivals: &[f64], rate: u64, burst: u64) -> u64 {
    let mut worst = 0u64;
    for j in 0..arrivals.len() {
        for i in 0..=j {
            let span_s = (arrivals[j] - arrivals[i] + 5.0) / 1000.0;
            let allowed = burst as f64 + rate as f64 * span_s;
            let got = (j - i + 1) as f64;
            if got > allowed {
                worst = worst.max((got - allowed).ceil() as u64);
            }
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_counts_the_worst_interval() {
        // 3 a second, burst 2: three at once are one too many.
        assert_eq!(over(&[0.0, 0.0], 3, 2), 0);
        assert_eq!(over(&[0.0, 0.0, 0.0], 3, 2), 1);
        // Spread by a third of a second, each has refilled.
        assert_eq!(over(&[0.0, 1.0, 340.0, 680.0], 3, 2), 0);
        assert_eq!(over(&[0.0, 1.0, 2.0, 3.0, 4.0], 3, 2), 3);
    }
}
