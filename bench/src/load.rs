//! Parts 2 and 5: `wrk` against each worker with `bench/wrk/load.lua`, which
//! spreads requests over fresh clients and drives one hot client past its
//! limit; the origin's count for the hot path is what that client got through.

use std::{collections::BTreeMap, process::Command, time::Duration};

use crate::{
    cpu,
    stack::{repo, Origin, Worker, TOKEN},
};

/// The load rule's limit per client and day: far above what a fresh client
/// sends, well below what the hot one does.
pub const HOT_LIMIT: u64 = 50;

/// Load shape, the same for every worker.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub connections: u32,
    pub seconds: u32,
    /// One request in this many comes from the hot client.
    pub hot_every: u32,
}

/// One wrk run's figures.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub requests: u64,
    /// How long wrk sent for, seconds.
    pub seconds: f64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub hot_sent: u64,
    /// Hot requests that reached the origin.
    pub hot_admitted: u64,
    pub socket_errors: u64,
    /// CPU seconds the run cost each part of the stack.
    pub cpu: Cpu,
    /// Latency at a grid of percentiles, as (percentile, ms), ascending.
    pub quantiles: Vec<(f64, f64)>,
    /// REST requests the endpoint took during the run, by the commands
    /// each carried: how the worker's calls grouped.
    pub carrying: BTreeMap<u64, u64>,
}

/// CPU seconds, per process, over one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    /// Both workerd processes of the worker's `wrangler dev` (the one of a
    /// bare worker).
    pub workerd: f64,
    /// Of which the one that runs the worker; the other is wrangler's proxy
    /// in front of it, which also relays the inspector's traffic (console
    /// lines among it) to wrangler.
    pub worker_process: f64,
    /// wrangler's node process around it, which also works per request.
    pub wrangler: f64,
    pub endpoint: f64,
    pub redis: f64,
    pub origin: f64,
}

impl Run {
    /// CPU milliseconds per completed request.
    pub fn per_request(&self, seconds: f64) -> f64 {
        seconds * 1000.0 / self.requests.max(1) as f64
    }
}

/// Where requests go: under a rule's path prefix, or outside every rule.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub worker: &'a Worker,
    /// Names the hot path, so that no two runs share one.
    pub label: &'static str,
    pub prefix: &'static str,
    /// Which of the run's workers (0 to 7): the client addresses of each are
    /// its own, so ours and `--baseline` never meet each other's clients in
    /// the one Redis.
    pub slot: u32,
}

/// The path the hot client uses in `round` (`load.lua` builds the same).
pub fn hot_path(target: Target<'_>, round: u32) -> String {
    format!("{}/hot-{}-{round}", target.prefix, target.label)
}

/// REST requests the endpoint at `rest` has taken so far, by the commands
/// each carried (its `GET /__stats`).
async fn carrying(http: &reqwest::Client, rest: &str) -> Result<BTreeMap<u64, u64>, String> {
    let stats: serde_json::Value = async {
        let sent = http.get(format!("{rest}/__stats")).bearer_auth(TOKEN);
        sent.send().await?.json().await
    }
    .await
    .map_err(|e| format!("cannot read the endpoint's counts: {e}"))?;
    let by_size = stats["carrying"].as_object().cloned().unwrap_or_default();
    Ok(by_size
        .iter()
        .filter_map(|(n, count)| Some((n.parse().ok()?, count.as_u64()?)))
        .collect())
}

/// Runs wrk once against `target`, whose REST calls go to the endpoint at
/// `rest` (round 0 is the warm-up); `slice` numbers the runs of one round,
/// whose clients are each their own.
pub async fn run(
    http: &reqwest::Client,
    rest: &str,
    target: Target<'_>,
    origin: &Origin,
    shape: Shape,
    (round, slice): (u32, u32),
) -> Result<Run, String> {
    let worker = target.worker;
    let path = hot_path(target, round);
    let before = origin.hits(http, &path).await?;
    let carried_before = carrying(http, rest).await?;
    let cpu_before = cpu::snapshot();
    let output = Command::new("wrk")
        .args(["-t1", "-c", &shape.connections.to_string()])
        .args(["-d", &format!("{}s", shape.seconds), "--timeout", "10s"])
        .arg("-s")
        .arg(repo().join("bench/wrk/load.lua"))
        .arg(&worker.url)
        .arg("--")
        .args([&round.to_string(), &shape.hot_every.to_string()])
        .args([target.label, target.prefix, &target.slot.to_string()])
        .arg(slice.to_string())
        .output()
        .map_err(|e| format!("cannot run wrk: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut run = parse(&stdout).ok_or_else(|| {
        format!(
            "wrk against {} printed no BENCH line ({}): {stdout} {}",
            worker.label,
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    // wrk stops without waiting for replies in flight; let them land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let used = cpu::snapshot();
    // The endpoint and Redis are this process's children (testenv).
    let me = std::process::id();
    let child = |name: &'static str| move |_, p: &cpu::Proc| p.ppid == me && p.comm == name;
    let group = worker.group.child.id();
    let own = worker.own_workerd(&used);
    run.cpu = Cpu {
        workerd: used.since(&cpu_before, |_, p| p.pgrp == group && p.comm == "workerd"),
        worker_process: used.since(&cpu_before, |pid, _| own.contains(&pid)),
        wrangler: used.since(&cpu_before, |_, p| p.pgrp == group && p.comm != "workerd"),
        endpoint: used.since(&cpu_before, child("upstash-local")),
        redis: used.since(&cpu_before, child("redis-server")),
        origin: used.since(&cpu_before, |_, p| p.pgrp == origin.group.child.id()),
    };
    run.hot_admitted = origin.hits(http, &path).await? - before;
    let carried = carrying(http, rest).await?;
    run.carrying = carried
        .into_iter()
        .map(|(n, count)| (n, count - carried_before.get(&n).copied().unwrap_or(0)))
        .filter(|&(_, count)| count > 0)
        .collect();
    Ok(run)
}

/// Reads the `BENCH key=value ...` line `load.lua` prints when done.
fn parse(text: &str) -> Option<Run> {
    let line = text.lines().find_map(|l| l.strip_prefix("BENCH "))?;
    let field = |key: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    let requests = field("requests")?;
    let duration_us = field("duration_us")?;
    let quantiles = text
        .lines()
        .find_map(|l| l.strip_prefix("PCT"))
        .map(|points| {
            points
                .split_whitespace()
                .filter_map(|point| {
                    let (p, us) = point.split_once(':')?;
                    Some((p.parse().ok()?, us.parse::<f64>().ok()? / 1000.0))
                })
                .collect()
        })
        .unwrap_or_default();
    let seconds = duration_us.max(1) as f64 / 1e6;
    Some(Run {
        requests,
        seconds,
        rps: requests as f64 / seconds,
        p50_ms: field("p50_us")? as f64 / 1000.0,
        p99_ms: field("p99_us")? as f64 / 1000.0,
        hot_sent: field("hot_sent")?,
        hot_admitted: 0,
        socket_errors: field("socket_errors")?,
        quantiles,
        ..Run::default()
    })
}

/// One round's slices as one run: counts and CPU summed, the latencies
/// pooled (at the grid `load.lua` prints, so that rounds pool in turn).
pub fn merged(slices: &[Run]) -> Run {
    let requests = slices.iter().map(|r| r.requests).sum();
    let seconds: f64 = slices.iter().map(|r| r.seconds).sum();
    let sum = |pick: fn(&Run) -> u64| slices.iter().map(pick).sum();
    let cpu = |pick: fn(&Cpu) -> f64| slices.iter().map(|r| pick(&r.cpu)).sum();
    let grid = slices.first().map_or(&[][..], |r| &r.quantiles[..]);
    let mut carrying = BTreeMap::new();
    for (&n, &count) in slices.iter().flat_map(|r| &r.carrying) {
        *carrying.entry(n).or_default() += count;
    }
    Run {
        requests,
        seconds,
        rps: requests as f64 / seconds.max(1e-9),
        p50_ms: pooled_percentile(slices, 50.0).0,
        p99_ms: pooled_percentile(slices, 99.0).0,
        hot_sent: sum(|r| r.hot_sent),
        hot_admitted: sum(|r| r.hot_admitted),
        socket_errors: sum(|r| r.socket_errors),
        cpu: Cpu {
            workerd: cpu(|c| c.workerd),
            worker_process: cpu(|c| c.worker_process),
            wrangler: cpu(|c| c.wrangler),
            endpoint: cpu(|c| c.endpoint),
            redis: cpu(|c| c.redis),
            origin: cpu(|c| c.origin),
        },
        quantiles: grid
            .iter()
            .map(|&(p, _)| (p, pooled_percentile(slices, p).0))
            .collect(),
        carrying,
    }
}

/// The `p`-th percentile (0..100), ms, of the latencies of all these runs
/// pooled, and how many requests they made: one slow moment in one round
/// then weighs as what it is, a few requests among many. Each run's share
/// between two grid percentiles is counted at the upper one's latency, so
/// the figure errs high, never low.
pub fn pooled_percentile(runs: &[Run], p: f64) -> (f64, u64) {
    let mut mass: Vec<(f64, f64)> = Vec::new();
    for run in runs {
        let mut below = 0.0;
        for &(q, ms) in &run.quantiles {
            mass.push((ms, (q - below) / 100.0 * run.requests as f64));
            below = q;
        }
    }
    mass.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = mass.iter().map(|(_, m)| m).sum();
    let requests = runs
        .iter()
        .filter(|r| !r.quantiles.is_empty())
        .map(|r| r.requests)
        .sum();
    let mut seen = 0.0;
    for (ms, m) in mass {
        seen += m;
        if seen >= p / 100.0 * total - 1e-9 {
            return (ms, requests);
        }
    }
    (f64::NAN, requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_bench_line() {
        let out = "Running 5s test @ http://127.0.0.1:1\n  1 threads and 8 connections\nBENCH requests=2500 duration_us=5000000 p50_us=15691 p99_us=68116 hot_sent=240 non2xx=12 socket_errors=1\n";
        let run = parse(out).unwrap();
        assert_eq!(run.requests, 2500);
        assert_eq!(run.rps, 500.0);
        assert_eq!((run.p50_ms, run.p99_ms), (15.691, 68.116));
        assert_eq!((run.hot_sent, run.socket_errors), (240, 1));
        assert!(parse("wrk: connection refused\n").is_none());
        let with_grid = format!("{out}PCT 50:1500 99:20000 100:68116\n");
        assert_eq!(
            parse(&with_grid).unwrap().quantiles,
            [(50.0, 1.5), (99.0, 20.0), (100.0, 68.116)]
        );
    }

    #[test]
    fn slices_merge_into_one_run() {
        let slice = |requests, ms: f64, hot| Run {
            requests,
            seconds: 2.0,
            hot_admitted: hot,
            quantiles: vec![(50.0, ms), (100.0, 2.0 * ms)],
            cpu: Cpu {
                workerd: 0.5,
                ..Cpu::default()
            },
            carrying: BTreeMap::from([(1, requests / 2)]),
            ..Run::default()
        };
        let round = merged(&[slice(300, 10.0, 30), slice(100, 40.0, 20)]);
        assert_eq!(
            (round.requests, round.rps, round.hot_admitted),
            (400, 100.0, 50)
        );
        // 150 of 400 requests at 10 ms or less: the median is the next step.
        assert_eq!((round.p50_ms, round.p99_ms), (20.0, 80.0));
        assert_eq!(round.quantiles, [(50.0, 20.0), (100.0, 80.0)]);
        assert_eq!(round.cpu.workerd, 1.0);
        assert_eq!(round.carrying, BTreeMap::from([(1, 200)]));
    }

    #[test]
    fn percentiles_pool_every_round() {
        let run = |requests, quantiles: Vec<(f64, f64)>| Run {
            requests,
            quantiles,
            ..Run::default()
        };
        // A fast round of 900 requests and a slow one of 100 whose slowest
        // 10 % took 50 ms: pooled, 1 % of all requests took 50 ms.
        let runs = [
            run(900, vec![(50.0, 1.0), (100.0, 2.0)]),
            run(100, vec![(90.0, 3.0), (100.0, 50.0)]),
        ];
        assert_eq!(pooled_percentile(&runs, 40.0), (1.0, 1000));
        assert_eq!(pooled_percentile(&runs, 50.0), (2.0, 1000));
        assert_eq!(pooled_percentile(&runs, 98.0), (3.0, 1000));
        assert_eq!(pooled_percentile(&runs, 99.0), (3.0, 1000));
        assert_eq!(pooled_percentile(&runs, 99.5), (50.0, 1000));
        assert!(pooled_percentile(&[], 99.0).0.is_nan());
    }
}
