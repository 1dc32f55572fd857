//! Part 10, one limit across two regions (issue 48): a home Redis and a
//! second region's (`eu`), each a redis-server and REST endpoint of its
//! own, each 80 ms from the other region's workers through a delaying
//! fault proxy. Two instances of each worker, one per region: ours with
//! a shared GCRA rule, the peer with `MultiRegionRatelimit` over the same
//! two Redis servers (its near one first), as its README writes it.
//!
//! Measured: a steady client in the far region (its latency added to a
//! passthrough's, beside a bare REST round trip to its near Redis, and
//! the far calls per allowed request); a fresh client's page load (near
//! and far calls); and a client sending to both regions at once, as the
//! origin's own arrival times count what got over the limit.

use std::{path::Path, time::Duration};

use edge_limiter::{
    operator::simulate::conform::{self, Charge},
    rules::config::Config,
};
use edge_limiter_local::{
    fault_proxy::{Fault, FaultProxy},
    testenv::{Endpoint, RedisServer},
};

use crate::{
    stack::{copy_build, repo, Origin, Worker, TOKEN},
    stats::percentile,
    timed::timed,
};

/// How far each region's workers are from the other region's Redis.
pub const FAR: Duration = Duration::from_millis(80);
/// The rule both sides keep: 100 a minute, as many at once (GCRA's
/// burst when none is written).
pub const RATE_PER_MINUTE: u64 = 100;
/// Its burst.
pub const BURST: u64 = 100;
/// Of which each region other than ours decides alone (`region_share`).
pub const SHARE: u64 = 5;
/// Ours again, with its isolates holding units of their own: at most
/// this many, for at most this long.
pub const LEASE: u64 = 10;
pub const LEASE_FOR: &str = "5s";
/// The steady client's requests, and how far apart: below the rate. Each
/// order of a round's four requests three times ([`round_order`]); enough
/// requests that one top-up more or less, by where the run starts in a
/// pool's length, keeps a steady client's far calls a request at its rate.
pub const STEADY: (usize, u64) = (72, 700);
/// The requests a page load sends at once.
pub const PAGE: usize = 4;
/// The requests the client sends to each region at once, in waves: more
/// than its burst in all.
pub const BOTH: (usize, usize) = (40, 4);

/// What part 10 measured of a steady client in eu.
#[derive(Debug, Clone, Default)]
pub struct Steady {
    /// Its latency added to a passthrough's, ms, p50.
    pub added_p50_ms: f64,
    /// A bare REST round trip to the near Redis, ms, p50.
    pub near_rtt_ms: f64,
    /// The same made by a worker (`bench/workers/near-call.mjs`): its
    /// latency added to a passthrough's, ms, p50.
    pub worker_rtt_ms: f64,
    /// Far REST calls per allowed request.
    pub far_per_allowed: f64,
    /// REST requests eu's endpoint took from the worker per request.
    pub near_per_request: f64,
}

/// What part 10 measured of one side.
#[derive(Debug, Clone, Default)]
pub struct Side {
    /// The steady client.
    pub steady: Steady,
    /// Ours only: the same under a rule with `lease`.
    pub leased: Option<Steady>,
    /// Ours only: the same under a rule without `regions`, one decision in
    /// eu's own Redis: what a request costs the worker with no region in it.
    pub plain: Option<Steady>,
    /// Near and far REST calls of a fresh client's page load, and the
    /// commands its near ones carried.
    pub page_near: u64,
    pub page_far: u64,
    pub page_commands: u64,
    /// Of the client sending to both regions: admitted at the origin, and
    /// of those over the limit by their arrival times.
    pub both_admitted: u64,
    pub both_over: u64,
    /// Of its requests, those that got no answer.
    pub both_lost: u64,
}

/// Both sides, ours first.
#[derive(Debug, Clone, Default)]
pub struct Regions {
    pub ours: Side,
    pub peer: Side,
    pub peer_version: String,
}

/// The two Redis servers, their endpoints, and the proxies that put each
/// 80 ms from the other region's workers.
struct Place {
    _redis: RedisServer,
    endpoint: Endpoint,
    far: FaultProxy,
}

impl Place {
    fn start() -> Result<Place, String> {
        let redis = RedisServer::start();
        let endpoint = Endpoint::start(&redis.addr(), TOKEN);
        let far = FaultProxy::start(endpoint.addr()).map_err(|e| format!("fault proxy: {e}"))?;
        far.set(Fault::Delay(FAR));
        Ok(Place {
            _redis: redis,
            endpoint,
            far,
        })
    }
}

/// Our regions, and the place wrangler dev gives every request (North
/// America) routed to `home_of` or to `eu`.
fn our_toml(in_eu: bool) -> String {
    let places = if in_eu { "[\"NA\"]" } else { "[\"EU\"]" };
    format!(
        "[vars.LIMITER]\nregions = [{{ name = \"us\", home = true }}, {{ name = \"eu\", continents = {places} }}]\n\n\
         [[vars.LIMITER.rules]]\nname = \"shared\"\nkey = [\"ip\"]\nalgorithm = \"gcra\"\nrate = {RATE_PER_MINUTE}\n\
         period = \"1m\"\nburst = {BURST}\nregions = \"shared\"\nregion_share = {SHARE}\npath_prefix = \"/timed/\"\n\n\
         [[vars.LIMITER.rules]]\nname = \"leased\"\nkey = [\"ip\"]\nalgorithm = \"gcra\"\nrate = {RATE_PER_MINUTE}\n\
         period = \"1m\"\nburst = {BURST}\nregions = \"shared\"\nregion_share = {SHARE}\npath_prefix = \"/leased/\"\n\
         lease = {LEASE}\nlease_for = \"{LEASE_FOR}\"\n\n\
         [[vars.LIMITER.rules]]\nname = \"plain\"\nkey = [\"ip\"]\nalgorithm = \"gcra\"\nrate = {RATE_PER_MINUTE}\n\
         period = \"1m\"\nburst = {BURST}\npath_prefix = \"/plain/\"\n"
    )
}

/// A worker's `[vars]`: its near and far Redis, named as each side reads them.
fn vars(ours: bool, in_eu: bool, home: &Place, eu: &Place, origin: &str) -> String {
    let (home_url, eu_url) = match in_eu {
        true => (home.far.url(), eu.endpoint.url()),
        false => (home.endpoint.url(), eu.far.url()),
    };
    let (near, far) = if in_eu {
        (&eu_url, &home_url)
    } else {
        (&home_url, &eu_url)
    };
    let redis = match ours {
        true => format!("UPSTASH_REDIS_REST_URL = \"{home_url}\"\nUPSTASH_REDIS_REST_URL_EU = \"{eu_url}\"\nUPSTASH_REDIS_REST_TOKEN_EU = \"{TOKEN}\""),
        false => format!("NEAR_URL = \"{near}\"\nFAR_URL = \"{far}\"\nPEER_LIMIT = \"{BURST}\"\nPEER_WINDOW = \"60 s\""),
    };
    format!("{redis}\nUPSTASH_REDIS_REST_TOKEN = \"{TOKEN}\"\nORIGIN_URL = \"{origin}\"")
}

/// Starts the five workers: ours in eu and at the home, the peer's the
/// same, and the one that makes one call to eu's Redis.
fn spawn(
    built: &Path,
    scratch: &Path,
    (home, eu): (&Place, &Place),
    origin: &str,
) -> Result<[Worker; 5], String> {
    let ours = |label: &'static str, in_eu: bool| -> Result<Worker, String> {
        let dir = scratch.join(label);
        copy_build(built, &dir)?;
        let main = Path::new("build/worker/shim.mjs");
        Worker::spawn(
            label,
            dir,
            main,
            &vars(true, in_eu, home, eu, origin),
            &our_toml(in_eu),
        )
    };
    let peer = |label: &'static str, in_eu: bool| -> Result<Worker, String> {
        let main = repo().join("bench/workers/peer-regions.mjs");
        Worker::spawn(
            label,
            scratch.join(label),
            &main,
            &vars(false, in_eu, home, eu, origin),
            "",
        )
    };
    Ok([
        ours("regions-ours-eu", true)?,
        ours("regions-ours-us", false)?,
        peer("regions-peer-eu", true)?,
        peer("regions-peer-us", false)?,
        Worker::spawn(
            "regions-near-call",
            scratch.join("regions-near-call"),
            &repo().join("bench/workers/near-call.mjs"),
            &format!(
                "NEAR_URL = \"{}\"\nUPSTASH_REDIS_REST_TOKEN = \"{TOKEN}\"\nORIGIN_URL = \"{origin}\"",
                eu.endpoint.url()
            ),
            "",
        )?,
    ])
}

/// The order in which steady round `round` sends its four requests (the
/// passthrough, a worker's near call, the worker measured, a bare round
/// trip): each of the 24 orders in turn. A fixed order put one of them
/// first after every pause and each behind the same one, which moved a
/// worker's p50 by up to a millisecond with its place alone.
fn round_order(round: usize) -> [usize; 4] {
    let (mut left, mut code) = (vec![0, 1, 2, 3], round % 24);
    let mut order = [0; 4];
    for (slot, weight) in order.iter_mut().zip([6, 2, 1, 1]) {
        *slot = left.remove(code / weight);
        code %= weight;
    }
    order
}

/// Part 10, both sides.
pub async fn measure(
    http: &reqwest::Client,
    built: &Path,
    scratch: &Path,
    origin: &Origin,
    passthrough: &Worker,
) -> Result<Regions, String> {
    let (home, eu) = (Place::start()?, Place::start()?);
    let workers = spawn(built, scratch, (&home, &eu), &origin.url)?;
    for w in &workers {
        w.ready(http).await?;
    }
    let [ours_eu, ours_us, peer_eu, peer_us, near_call] = &workers;
    let salt = std::process::id();
    let mut out = Regions {
        peer_version: crate::peer::version("@upstash/ratelimit"),
        ..Regions::default()
    };
    for (side, (in_eu, at_home), tag) in [
        (&mut out.ours, (ours_eu, ours_us), "ours"),
        (&mut out.peer, (peer_eu, peer_us), "peer"),
    ] {
        let run = Run {
            http,
            origin,
            passthrough,
            near_call,
            home: &home,
            eu: &eu,
        };
        *side = run.side(in_eu, at_home, tag, salt).await?;
    }
    Ok(out)
}

struct Run<'a> {
    http: &'a reqwest::Client,
    origin: &'a Origin,
    passthrough: &'a Worker,
    near_call: &'a Worker,
    home: &'a Place,
    eu: &'a Place,
}

impl Run<'_> {
    /// Far calls: what the proxy in front of the home has seen from eu.
    fn far_calls(&self) -> u64 {
        self.home.far.exchanges().len() as u64
    }

    /// Requests eu's endpoint has taken so far.
    async fn near_calls(&self) -> Result<u64, String> {
        Ok(self.near_counts().await?.0)
    }

    /// Requests and commands eu's endpoint has taken so far.
    async fn near_counts(&self) -> Result<(u64, u64), String> {
        let url = format!("{}/__stats", self.eu.endpoint.url());
        let stats: serde_json::Value = async {
            (self.http.get(url).bearer_auth(TOKEN).send().await?)
                .json()
                .await
        }
        .await
        .map_err(|e| format!("the eu endpoint's counts: {e}"))?;
        let count = |name: &str| stats[name].as_u64().unwrap_or(0);
        Ok((count("requests"), count("commands")))
    }

    /// Waits for the calls a worker makes after its responses.
    async fn settled(&self) {
        tokio::time::sleep(Duration::from_millis(400)).await;
        self.home.far.wait_idle(Duration::from_secs(10));
    }

    /// A steady client `ip` in eu on `path`: its first request, then
    /// [`STEADY`]'s, each beside the passthrough's, a worker's near call
    /// and a bare REST round trip, in every order ([`round_order`]).
    async fn steady(&self, in_eu: &Worker, ip: &str, path: &str) -> Result<Steady, String> {
        let headers = [("CF-Connecting-IP", ip)];
        let url = |w: &Worker| format!("{}{path}", w.url);
        timed(self.http, &url(in_eu), &headers).await?;
        self.settled().await;
        let (far_before, near_before) = (self.far_calls(), self.near_calls().await?);
        let (mut worker_ms, mut through_ms, mut rtt_ms) = (vec![], vec![], vec![]);
        let (mut near_call_ms, mut allowed) = (vec![], 0u64);
        for round in 0..STEADY.0 {
            for probe in round_order(round) {
                match probe {
                    0 => {
                        through_ms.push(timed(self.http, &url(self.passthrough), &headers).await?.0)
                    }
                    1 => {
                        near_call_ms.push(timed(self.http, &url(self.near_call), &headers).await?.0)
                    }
                    2 => {
                        let (ms, status) = timed(self.http, &url(in_eu), &headers).await?;
                        worker_ms.push(ms);
                        allowed += u64::from(status == 200);
                    }
                    _ => {
                        let ping = format!("{}/ping", self.eu.endpoint.url());
                        let started = std::time::Instant::now();
                        let sent = self.http.get(ping).bearer_auth(TOKEN).send().await;
                        sent.map_err(|e| format!("a REST round trip: {e}"))?;
                        rtt_ms.push(started.elapsed().as_secs_f64() * 1000.0);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(STEADY.1)).await;
        }
        self.settled().await;
        // The bare round trips and the near-call worker's PINGs reach eu's
        // endpoint too: left out of the worker's own calls.
        let pings = 2 * STEADY.0 as u64;
        let near = (self.near_calls().await? - near_before).saturating_sub(pings);
        let through = percentile(&through_ms, 50.0);
        Ok(Steady {
            added_p50_ms: percentile(&worker_ms, 50.0) - through,
            near_rtt_ms: percentile(&rtt_ms, 50.0),
            worker_rtt_ms: percentile(&near_call_ms, 50.0) - through,
            far_per_allowed: (self.far_calls() - far_before) as f64 / allowed.max(1) as f64,
            near_per_request: near as f64 / STEADY.0 as f64,
        })
    }

    async fn side(
        &self,
        in_eu: &Worker,
        at_home: &Worker,
        tag: &str,
        salt: u32,
    ) -> Result<Side, String> {
        let mut side = Side::default();
        let (n, salt) = (u32::from(tag == "peer"), format!("{tag}-{salt}"));
        let ip = |client: u32| format!("10.{}.{}.{client}", 100 + n, std::process::id() % 250);
        let url = |w: &Worker, p: &str| format!("{}{p}", w.url);
        // Each Redis has the side's scripts once another client's request
        // at each region has run: a fresh server's first call is sent twice.
        let other = ip(4);
        let warm = format!("/timed/warm-{salt}");
        for w in [at_home, in_eu] {
            let headers = [("CF-Connecting-IP", other.as_str())];
            timed(self.http, &url(w, &warm), &headers).await?;
        }
        // A steady client in eu, below the rate; ours again under a rule
        // whose isolates hold units of their own (`lease`), and under one
        // without `regions`, decided in eu's Redis alone.
        side.steady = self
            .steady(in_eu, &ip(1), &format!("/timed/steady-{salt}"))
            .await?;
        if tag == "ours" {
            let path = format!("/leased/steady-{salt}");
            side.leased = Some(self.steady(in_eu, &ip(5), &path).await?);
            let path = format!("/plain/steady-{salt}");
            side.plain = Some(self.steady(in_eu, &ip(6), &path).await?);
        }

        // A fresh client's page load: its requests at once.
        let fresh = ip(2);
        let (near_before, far_before) = (self.near_counts().await?, self.far_calls());
        let page = format!("/timed/page-{salt}");
        let (page_url, page_headers) = (url(in_eu, &page), [("CF-Connecting-IP", fresh.as_str())]);
        let loads = (0..PAGE).map(|_| timed(self.http, &page_url, &page_headers));
        for loaded in futures_util::future::join_all(loads).await {
            loaded?;
        }
        self.settled().await;
        let near = self.near_counts().await?;
        (side.page_near, side.page_commands) = (near.0 - near_before.0, near.1 - near_before.1);
        side.page_far = self.far_calls() - far_before;

        // One client at both regions at once: waves of requests to each.
        let both = ip(3);
        let path = format!("/timed/both-{salt}");
        for _ in 0..BOTH.1 {
            let sent = [in_eu, at_home].into_iter().flat_map(|w| {
                let both = both.as_str();
                let url = url(w, &path);
                (0..BOTH.0).map(move |_| {
                    let url = url.clone();
                    async move { timed(self.http, &url, &[("CF-Connecting-IP", both)]).await }
                })
            });
            // A request the worker never answers reaches no origin: counted
            // apart, so that one lost connection does not end the run.
            for answered in futures_util::future::join_all(sent).await {
                side.both_lost += u64::from(answered.is_err());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let arrivals = self.arrivals(&path).await?;
        side.both_admitted = arrivals.len() as u64;
        side.both_over = over(&arrivals);
        Ok(side)
    }

    /// The origin's arrival times on `path`, ms.
    async fn arrivals(&self, path: &str) -> Result<Vec<u64>, String> {
        let url = format!("{}/__origin/arrivals?path={path}", self.origin.url);
        let times: Vec<f64> = async { self.http.get(url).send().await?.json().await }
            .await
            .map_err(|e| format!("the origin's arrivals: {e}"))?;
        let mut times: Vec<u64> = times.into_iter().map(|t| t as u64).collect();
        times.sort_unstable();
        Ok(times)
    }
}

/// How many of `arrivals` (ms, in order) went over the rule, by the
/// independent checker: each decided at most [`SLACK_MS`] before it
/// reached the origin, and over only if no such instant conforms.
fn over(arrivals: &[u64]) -> u64 {
    let config = format!(
        "{{\"rules\": [{{\"name\": \"x\", \"key\": [\"ip\"], \"algorithm\": \"gcra\", \"rate\": {RATE_PER_MINUTE}, \"period\": \"1m\", \"burst\": {BURST}}}]}}"
    );
    let config: Config = config.parse().expect("the rule's figures");
    let policy = &config.rules[0].policy;
    let charges: Vec<Charge<'_>> = (arrivals.iter())
        .map(|&t| Charge {
            from_ms: t.saturating_sub(SLACK_MS),
            to_ms: t,
            cost: 1,
            under: vec![policy],
        })
        .collect();
    conform::over(&charges, 0)
}

/// How long before its arrival at the origin a request may have been
/// decided: the forward's own time, on a loaded machine.
pub const SLACK_MS: u64 = 50;

#[cfg(test)]
mod tests {
    use super::round_order;

    #[test]
    fn the_rounds_take_every_order_once_in_24() {
        let mut seen: Vec<[usize; 4]> = (0..24).map(round_order).collect();
        for order in &seen {
            let mut sorted = *order;
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2, 3], "{order:?}");
        }
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 24);
        assert_eq!(round_order(24), round_order(0));
    }
}
