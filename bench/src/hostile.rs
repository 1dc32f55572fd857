//! Part 8, hostile requests: every shape of `edge_limiter_local::hostile`
//! through our worker in `wrangler dev`, under rules that read every part
//! of a request, and the CPU the worker's own workerd spends on each
//! against an ordinary request's measured just before it; the passthrough
//! the same way, for what carrying such a request costs any worker. A
//! denial the isolate cached before the part must still be answered from
//! its memory after it: a restarted isolate would ask Redis again.

use std::time::Duration;

use edge_limiter_local::hostile::{self, Shape};

use crate::{cpu, stack::Worker, trips};

/// The path of the rule whose cached denial shows the isolate lived on.
const SENTINEL: &str = "/__sentinel";
/// The client denied on it, no client of any shape.
const SENTINEL_IP: &str = "198.51.100.250";
/// Requests in flight at once: the lanes of [`cpu_per_request`].
pub const IN_FLIGHT: usize = 4;
/// The target: a hostile request costs at most this many ordinary ones.
pub const MOST_TIMES_ORDINARY: f64 = 5.0;

/// The rules of the worker under test, for its `wrangler.toml`: the
/// shapes' own, a denial held for an hour, and the sentinel's rule.
pub fn rules() -> String {
    format!(
        "[vars.LIMITER]\ncache_hold = \"1h\"\n\n[[vars.LIMITER.rules]]\nname = \"sentinel\"\npath_prefix = \"{SENTINEL}\"\nkey = [\"ip\"]\nalgorithm = \"windowed\"\nwindows = [[\"1d\", 1, \"24m\"]]\n{}",
        hostile::RULES
    )
}

/// How many requests, how often.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Requests of one shape per measurement.
    pub batch: usize,
    pub rounds: usize,
}

/// One shape's figures, per round: CPU ms per request in the worker's
/// own workerd, for the shape and for the ordinary request just before;
/// the passthrough's for the shape, and for an ordinary request at the
/// start of the round.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub name: String,
    /// Bytes the request carries.
    pub size: usize,
    /// Statuses the worker answered, each once.
    pub statuses: Vec<u16>,
    pub ours: Vec<f64>,
    pub ordinary: Vec<f64>,
    /// The passthrough's, the same way.
    pub passthrough: Vec<f64>,
    pub passthrough_ordinary: Vec<f64>,
}

impl Figures {
    /// Each round's CPU per request over the ordinary request's.
    pub fn times(&self) -> Vec<f64> {
        self.ours
            .iter()
            .zip(&self.ordinary)
            .map(|(shape, base)| shape / base)
            .collect()
    }

    /// The same, less what carrying the shape costs the passthrough beyond
    /// an ordinary request: workerd's own work on a large request (8 000
    /// headers cost the passthrough dozens of ordinary requests), which no
    /// worker can spare.
    pub fn times_beyond_carrying(&self) -> Vec<f64> {
        let carrying = self.passthrough.iter().zip(&self.passthrough_ordinary);
        self.ours
            .iter()
            .zip(&self.ordinary)
            .zip(carrying)
            .map(|((shape, base), (carried, plain))| (shape - (carried - plain).max(0.0)) / base)
            .collect()
    }
}

/// What part 8 found.
#[derive(Debug, Clone, Default)]
pub struct Hostile {
    pub shapes: Vec<Figures>,
    /// REST calls the sentinel's denial took after the part (0: answered
    /// from the isolate's memory, which therefore lived through it), and
    /// the status it got.
    pub sentinel: (u64, u16),
    pub settings: Option<Settings>,
}

/// Runs part 8 against `ours` (started with [`rules`]) and `passthrough`;
/// nothing else may use `endpoint` meanwhile.
pub async fn run(
    http: &reqwest::Client,
    ours: &Worker,
    passthrough: &Worker,
    endpoint: &str,
    settings: Settings,
) -> Result<Hostile, String> {
    // The first denial is Redis's, the second is cached.
    for _ in 0..2 {
        sentinel(http, ours).await?;
    }
    let ordinary = hostile::ordinary();
    let all = hostile::shapes();
    let mut shapes: Vec<Figures> = all
        .iter()
        .map(|s| Figures {
            name: s.name.to_owned(),
            size: s.size(),
            ..Figures::default()
        })
        .collect();
    // Warm both up on every shape once.
    for shape in std::iter::once(&ordinary).chain(&all) {
        for worker in [ours, passthrough] {
            send(http, worker, shape).await?;
        }
    }
    let batch = settings.batch;
    for round in 0..settings.rounds {
        let plain = cpu_per_request(http, passthrough, &ordinary, batch, &mut vec![]).await?;
        // A different order each round, so no shape always follows another.
        for i in 0..all.len() {
            let k = (i + round * 7) % all.len();
            let f = &mut shapes[k];
            f.ordinary
                .push(cpu_per_request(http, ours, &ordinary, batch, &mut vec![]).await?);
            f.ours
                .push(cpu_per_request(http, ours, &all[k], batch, &mut f.statuses).await?);
            f.passthrough
                .push(cpu_per_request(http, passthrough, &all[k], batch, &mut vec![]).await?);
            f.passthrough_ordinary.push(plain);
        }
    }
    let before = trips::requests(http, endpoint).await?;
    let status = sentinel(http, ours).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = trips::requests(http, endpoint).await? - before;
    Ok(Hostile {
        shapes,
        sentinel: (calls, status),
        settings: Some(settings),
    })
}

/// One request to the sentinel's rule; its status.
async fn sentinel(http: &reqwest::Client, worker: &Worker) -> Result<u16, String> {
    let reply = http
        .get(format!("{}{SENTINEL}", worker.url))
        .header("cf-connecting-ip", SENTINEL_IP)
        .send()
        .await
        .map_err(|e| format!("{}: {e}", worker.label))?;
    Ok(reply.status().as_u16())
}

/// CPU ms the worker's own workerd spent per request on `batch` of
/// `shape`, [`IN_FLIGHT`] at a time; the statuses it answered are added
/// to `statuses`.
async fn cpu_per_request(
    http: &reqwest::Client,
    worker: &Worker,
    shape: &Shape,
    batch: usize,
    statuses: &mut Vec<u16>,
) -> Result<f64, String> {
    let before = cpu::snapshot();
    let own = worker.own_workerd(&before);
    // Lane `first` sends requests first, first + IN_FLIGHT, ...
    let lane = |first: usize| async move {
        let mut seen = Vec::new();
        for _ in (first..batch).step_by(IN_FLIGHT) {
            seen.push(send(http, worker, shape).await?);
        }
        Ok::<_, String>(seen)
    };
    let lanes = tokio::join!(lane(0), lane(1), lane(2), lane(3));
    for seen in [lanes.0?, lanes.1?, lanes.2?, lanes.3?] {
        for status in seen {
            if !statuses.contains(&status) {
                statuses.push(status);
            }
        }
    }
    // Let what the worker does after its answers land.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let seconds = cpu::snapshot().since(&before, |pid, _| own.contains(&pid));
    Ok(seconds * 1000.0 / batch as f64)
}

/// Sends `shape` to `worker`; the status it answered, its body read. A
/// request the connection dropped is sent again once: `wrangler dev` on a
/// busy machine drops one now and then, whatever the request.
async fn send(http: &reqwest::Client, worker: &Worker, shape: &Shape) -> Result<u16, String> {
    match send_once(http, worker, shape).await {
        Err(e) if e.is_request() => send_once(http, worker, shape).await,
        other => other,
    }
    .map_err(|e| format!("{} to {}: {}", shape.name, worker.label, e.without_url()))
}

async fn send_once(
    http: &reqwest::Client,
    worker: &Worker,
    shape: &Shape,
) -> Result<u16, reqwest::Error> {
    let mut url = format!("{}{}", worker.url, shape.path);
    if let Some(query) = &shape.query {
        url.push('?');
        url.push_str(query);
    }
    let method = reqwest::Method::from_bytes(shape.method.as_bytes()).unwrap_or_default();
    let mut request = http.request(method, url);
    for (name, value) in &shape.headers {
        request = request.header(name, value);
    }
    if !shape.body.is_empty() {
        request = request.body(shape.body.clone());
    }
    let reply = request.send().await?;
    let status = reply.status().as_u16();
    reply.bytes().await?;
    Ok(status)
}
