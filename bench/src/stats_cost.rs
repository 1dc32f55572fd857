//! What stats cost the worker (issue 33), measured with part 2's load: our
//! worker with `stats = true` against the same build with stats off, rounds
//! interleaved, each behind a fault proxy of its own (passing everything)
//! that counts its REST calls. Stats are written every second, the most
//! often `stats_every` allows, so the CPU figure bounds what any setting
//! costs: stats on should cost no CPU a round of stats off would not. Its
//! calls per minute show the writes it adds (at the default 30 s, 2 a
//! minute).

use std::path::Path;

use edge_limiter::decision::stats::stored::STATS;
use edge_limiter_local::fault_proxy::{Exchange, FaultProxy};

use crate::{
    load::{self, Run, Shape},
    stack::{copy_build, rest_vars, Origin, Worker},
    stats::{median, spread},
};

/// Labels of the two workers (load paths and client slots of their own).
pub const OURS_STATS_OFF: &str = "ours-stats-off";
pub const OURS_STATS_ON: &str = "ours-stats-on";

/// Both workers' runs, and what the proxies counted.
#[derive(Debug, Default)]
pub struct StatsCost {
    /// One run per round, stats off.
    pub off: Vec<Run>,
    /// One run per round, stats on.
    pub on: Vec<Run>,
    /// Minutes each worker spent under load (warm-up included), stats off
    /// then on.
    pub minutes: [f64; 2],
    /// REST calls each worker made, stats off then on.
    pub calls: [u64; 2],
    /// Of those, calls of the stats script (stats on).
    pub writes: u64,
}

/// Our worker on a copy of `built`, with the load rule and stats as asked,
/// its REST calls through `rest`.
fn spawn(
    label: &'static str,
    built: &Path,
    scratch: &Path,
    rest: &str,
    origin: &str,
    stats: bool,
) -> Result<Worker, String> {
    let dir = scratch.join(label);
    copy_build(built, &dir)?;
    let rules = format!(
        "[vars.LIMITER]\nstats = {stats}\nstats_every = \"1s\"\n\n[[vars.LIMITER.rules]]\nname = \"load\"\nkey = [\"ip\"]\nalgorithm = \"windowed\"\nwindows = [[\"1d\", {}, \"24m\"]]\npath_prefix = \"/load\"\n",
        load::HOT_LIMIT
    );
    Worker::spawn(
        label,
        dir,
        Path::new("build/worker/shim.mjs"),
        &rest_vars(rest, origin),
        &rules,
    )
}

/// Whether `x` called the stats script.
fn writes(x: &Exchange) -> bool {
    let body: Vec<serde_json::Value> = serde_json::from_slice(&x.request).unwrap_or_default();
    body.get(1)
        .and_then(|v| v.as_str())
        .is_some_and(|s| s == STATS.sha1 || s == STATS.source)
}

/// Runs both workers under `shape`, `rounds` rounds after a warm-up each.
pub async fn measure(
    http: &reqwest::Client,
    origin: &Origin,
    endpoint: std::net::SocketAddr,
    built: &Path,
    scratch: &Path,
    shape: Shape,
    rounds: u32,
) -> Result<StatsCost, String> {
    let proxy = || FaultProxy::start(endpoint).map_err(|e| format!("fault proxy: {e}"));
    let proxies = [proxy()?, proxy()?];
    let rest = format!("http://{endpoint}");
    let workers = [
        spawn(
            OURS_STATS_OFF,
            built,
            scratch,
            &proxies[0].url(),
            &origin.url,
            false,
        )?,
        spawn(
            OURS_STATS_ON,
            built,
            scratch,
            &proxies[1].url(),
            &origin.url,
            true,
        )?,
    ];
    for w in &workers {
        w.ready(http).await?;
    }
    let targets = [
        load::Target {
            worker: &workers[0],
            label: OURS_STATS_OFF,
            prefix: "/load",
            slot: 5,
        },
        load::Target {
            worker: &workers[1],
            label: OURS_STATS_ON,
            prefix: "/load",
            slot: 6,
        },
    ];
    let warm = Shape {
        seconds: 2,
        ..shape
    };
    let mut cost = StatsCost::default();
    for (k, t) in targets.into_iter().enumerate() {
        let started = std::time::Instant::now();
        load::run(http, &rest, t, origin, warm, (0, 0)).await?;
        cost.minutes[k] += started.elapsed().as_secs_f64() / 60.0;
    }
    for round in 1..=rounds {
        for i in 0..2 {
            let k = (i + round as usize) % 2;
            let started = std::time::Instant::now();
            let run = load::run(http, &rest, targets[k], origin, shape, (round, 0)).await?;
            cost.minutes[k] += started.elapsed().as_secs_f64() / 60.0;
            match k {
                0 => cost.off.push(run),
                _ => cost.on.push(run),
            }
        }
    }
    for (k, p) in proxies.iter().enumerate() {
        cost.calls[k] = p.exchanges().len() as u64;
    }
    cost.writes = proxies[1].exchanges().iter().filter(|x| writes(x)).count() as u64;
    Ok(cost)
}

/// The part's rows, in the report's columns (stats off in the peer's).
pub fn rows(cost: Option<&StatsCost>) -> Vec<[String; 7]> {
    let Some(c) = cost else { return vec![] };
    let workerd =
        |runs: &[Run]| -> Vec<f64> { runs.iter().map(|x| x.per_request(x.cpu.workerd)).collect() };
    let (on, off) = (workerd(&c.on), workerd(&c.off));
    let shown = |v: &[f64]| {
        let (lo, hi) = spread(v);
        format!("{:.2} ({lo:.2}..{hi:.2})", median(v))
    };
    // One-sided: stats must add nothing beyond the noise of their absence;
    // a median below every round without them is noise too, not a cost.
    let (_, hi) = spread(&off);
    let within = !on.is_empty() && !off.is_empty() && median(&on) <= hi;
    let per_minute = |n: u64, k: usize| format!("{:.1}", n as f64 / c.minutes[k]);
    let part = "2 stats on vs off (peer column)".to_owned();
    vec![
        [
            part.clone(),
            "CPU per request in workerd, ms".into(),
            shown(&on),
            shown(&off),
            format!("{:.2}", median(&on) / median(&off)),
            "on <= off's dearest round".into(),
            if within { "yes" } else { "**no**" }.into(),
        ],
        [
            part.clone(),
            "REST calls per isolate per minute under load".into(),
            per_minute(c.calls[1], 1),
            per_minute(c.calls[0], 0),
            String::new(),
            String::new(),
            String::new(),
        ],
        [
            part,
            "of which stats writes (stats_every 1 s, the most often allowed)".into(),
            per_minute(c.writes, 1),
            "0".into(),
            String::new(),
            String::new(),
            String::new(),
        ],
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(workerd_s: f64) -> Run {
        let mut r = Run {
            requests: 1000,
            ..Run::default()
        };
        r.cpu.workerd = workerd_s;
        r
    }

    #[test]
    fn stats_on_is_held_to_the_rounds_of_stats_off() {
        let cost = |on: &[f64]| StatsCost {
            off: [2.0, 2.4, 2.2].map(run).to_vec(),
            on: on.iter().copied().map(run).collect(),
            minutes: [0.5, 0.5],
            calls: [3000, 3030],
            writes: 30,
        };
        let within = rows(Some(&cost(&[2.1, 2.5, 2.3])));
        assert_eq!(within[0][2], "2.30 (2.10..2.50)");
        assert_eq!(within[0][6], "yes");
        assert_eq!(
            (within[1][2].as_str(), within[1][3].as_str()),
            ("6060.0", "6000.0")
        );
        assert_eq!(within[2][2], "60.0");
        assert_eq!(rows(Some(&cost(&[2.5, 2.6, 2.7])))[0][6], "**no**");
        assert_eq!(rows(Some(&cost(&[1.5, 1.6, 1.7])))[0][6], "yes");
        assert!(rows(None).is_empty());
    }
}
