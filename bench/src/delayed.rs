//! Part 9, a wait instead of 429: part 9's worker also holds a GCRA rule
//! with `on_limit = "delay"`. The CPU its own workerd spends on a delayed
//! request, against an admitted one of the same rule (each one script
//! call); then one client sending more at once than `max_delay` lets wait,
//! and the origin's own arrival times checked against the rule. The peer
//! has no wait at the edge: `blockUntilReady` polls from the client.

use std::time::{Duration, Instant};

use futures_util::future::join_all;

use crate::{
    cpu,
    in_flight::get,
    stack::{Origin, Worker},
};

/// The rule: one request per `INTERVAL_MS`, one at once, a wait of up to
/// a second.
pub const INTERVAL_MS: u64 = 50;
const MAX_DELAY_MS: u64 = 1000;

/// Requests in each CPU batch, and how many go at once.
pub const BATCH: usize = 400;
const LANES: usize = 8;

/// Requests one client sends at once, more than the wait admits.
pub const CROWD: usize = 30;

/// How far an arrival may be early by the origin's clock before it counts
/// as over the rule, ms: the reply's trip, the timer, the forward.
pub const SLACK_MS: f64 = 10.0;

/// The rule, beside part 9's in-flight one (which covers `/held/` only).
pub fn rule() -> String {
    format!(
        "[[vars.LIMITER.rules]]\nname = \"paced\"\nkey = [\"ip\"]\nalgorithm = \"gcra\"\n\
         rate = 1\nperiod = {INTERVAL_MS}\nburst = 1\non_limit = \"delay\"\n\
         max_delay = {MAX_DELAY_MS}\npath_prefix = \"/timed/paced\"\n"
    )
}

/// What the delay measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Delayed {
    /// workerd CPU ms per request: a fresh client's request (admitted at
    /// once), and one sent beside it (delayed about one interval): a
    /// pair's CPU less an admitted one's.
    pub admitted_cpu_ms: f64,
    pub delayed_cpu_ms: f64,
    /// Of the pairs, how many had one request take at least most of an
    /// interval: delayed, as meant.
    pub waited: usize,
    /// The crowd: admitted of `CROWD`, and arrivals early by more than
    /// `SLACK_MS` by the origin's clock.
    pub crowd_admitted: usize,
    pub early: usize,
    /// The crowd's arrivals: ms apart on average, and how far they strayed
    /// around that even pace (largest less smallest offset). An even pace
    /// of the interval with a spread over the slack is the forward's
    /// timing, not the limiter's schedule.
    pub pace_ms: f64,
    pub spread_ms: f64,
}

impl Delayed {
    /// CPU of a delayed request over an admitted one's.
    pub fn ratio(&self) -> f64 {
        self.delayed_cpu_ms / self.admitted_cpu_ms.max(f64::MIN_POSITIVE)
    }
}

/// Runs both measurements through `worker`.
pub async fn measure(
    http: &reqwest::Client,
    worker: &Worker,
    origin: &Origin,
) -> Result<Delayed, String> {
    let key = std::process::id();
    let path = format!("/timed/paced/bench-{key}");
    let ips = |lot: usize| -> Vec<String> {
        (0..BATCH)
            .map(|i| format!("10.{}.{}.{}", key % 200, lot * 2 + i / 250, i % 250))
            .collect()
    };
    let own = worker.own_workerd(&cpu::snapshot());
    let (admitted_cpu_ms, _) = batch(http, worker, &path, &ips(0), &own, 1).await?;
    let (pair_cpu_ms, took) = batch(http, worker, &path, &ips(1), &own, 2).await?;
    let waited = (took.iter())
        .filter(|t| **t >= Duration::from_millis(INTERVAL_MS * 4 / 5))
        .count();
    let delayed_cpu_ms = pair_cpu_ms - admitted_cpu_ms;
    let crowded = format!("/timed/paced/crowd-{key}");
    let sent = (0..CROWD).map(|_| get(http, &worker.url, &crowded, "203.0.113.98", 0));
    let statuses = join_all(sent)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let arrivals = format!("{}/__origin/arrivals?path={crowded}", origin.url);
    let seen: serde_json::Value = (http.get(arrivals).send().await)
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    let mut times: Vec<f64> = (seen.as_array().into_iter().flatten())
        .filter_map(|t| t.as_f64())
        .collect();
    times.sort_by(f64::total_cmp);
    let (pace_ms, spread_ms) = pace(&times);
    Ok(Delayed {
        admitted_cpu_ms,
        delayed_cpu_ms,
        waited,
        crowd_admitted: statuses.iter().filter(|s| **s == 200).count(),
        early: early(&times, INTERVAL_MS as f64),
        pace_ms,
        spread_ms,
    })
}

/// `at_once` requests at once from each of `ips` in turn, `LANES` clients
/// at a time: the CPU ms the worker's workerd `own` spent per client, and
/// how long each client's slowest request took.
async fn batch(
    http: &reqwest::Client,
    worker: &Worker,
    path: &str,
    ips: &[String],
    own: &[u32],
    at_once: usize,
) -> Result<(f64, Vec<Duration>), String> {
    let before = cpu::snapshot();
    let lane = |first: usize| async move {
        let mut took = Vec::new();
        for ip in ips.iter().skip(first).step_by(LANES) {
            let started = Instant::now();
            let sent = (0..at_once).map(|_| get(http, &worker.url, path, ip, 0));
            for status in join_all(sent).await {
                status?;
            }
            took.push(started.elapsed());
        }
        Ok::<_, String>(took)
    };
    let lanes = join_all((0..LANES).map(lane)).await;
    // Let what the worker does after its answers land.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let seconds = cpu::snapshot().since(&before, |pid, _| own.contains(&pid));
    let took = lanes.into_iter().collect::<Result<Vec<_>, _>>()?.concat();
    Ok((seconds * 1000.0 / ips.len() as f64, took))
}

/// Arrivals (ms, sorted) that come earlier than one per `interval` allows
/// (burst 1) by more than [`SLACK_MS`]: GCRA's virtual scheduling.
fn early(arrivals: &[f64], interval: f64) -> usize {
    let mut tat = f64::MIN;
    let mut early = 0;
    for t in arrivals {
        if tat - t > SLACK_MS {
            early += 1;
        }
        tat = tat.max(*t) + interval;
    }
    early
}

/// Arrivals' (ms, sorted) average gap, and the spread of their offsets
/// from an even schedule at that gap: one late arrival shows as a spread,
/// where it would make every later one on time count as early.
fn pace(arrivals: &[f64]) -> (f64, f64) {
    let (Some(first), Some(last)) = (arrivals.first(), arrivals.last()) else {
        return (0.0, 0.0);
    };
    let gap = (last - first) / (arrivals.len() - 1).max(1) as f64;
    let offsets = arrivals
        .iter()
        .enumerate()
        .map(|(k, t)| t - first - k as f64 * gap);
    let (low, high) = offsets.fold((0.0f64, 0.0f64), |(l, h), o| (l.min(o), h.max(o)));
    (gap, high - low)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arrival_inside_the_interval_is_early() {
        assert_eq!(early(&[0.0, 50.0, 100.0, 160.0], 50.0), 0);
        assert_eq!(early(&[0.0, 20.0, 100.0], 50.0), 1);
        assert_eq!(early(&[0.0, 45.0], 50.0), 0, "within the slack");
    }

    #[test]
    fn one_late_arrival_is_a_spread_around_an_even_pace() {
        let (gap, spread) = pace(&[0.0, 65.0, 100.0, 150.0, 200.0]);
        assert_eq!((gap, spread), (50.0, 15.0));
        assert_eq!(early(&[0.0, 65.0, 100.0, 150.0, 200.0], 50.0), 3);
        assert_eq!(pace(&[7.0]), (0.0, 0.0));
    }
}
