//! edge-limiter side by side with `@upstash/ratelimit` on one machine: the
//! same redis-server, REST endpoint, origin and workerd (`wrangler dev`) for
//! both. `scripts/bench` builds what it needs and runs this; it prints one
//! table and saves it, with the date and machine, to `bench/RESULTS.md`.
//!
//! The parts (see `report.rs`): Redis-side cost per decision, worker
//! overhead under load, REST calls per decision, wasm size and start,
//! exactness under load, latency with Redis far away, a hot key under
//! quota leases, hostile requests, requests in flight and waits, and one
//! limit across two regions. Only figures: no timing fails a
//! run; targets are ratios to figures of the same run.

mod bare;
mod cpu;
mod delayed;
mod far;
mod gc;
mod hostile;
mod hot;
mod in_flight;
mod load;
mod peer;
mod redis_side;
mod regions;
mod report;
mod size;
mod stack;
mod stats;
mod stats_cost;
mod timed;
mod trips;

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use edge_limiter_local::{
    fault_proxy::{Fault, FaultProxy},
    testenv::{Endpoint, RedisServer},
};

use crate::{
    load::{Shape, HOT_LIMIT},
    report::{
        Results, BARE_OURS, BARE_PASSTHROUGH, BARE_PEER, OURS, OURS_BASELINE, OURS_FAR,
        OURS_FAR_BASELINE, OURS_HOSTILE, OURS_HOT, OURS_IN_FLIGHT, OURS_SHARED, OURS_UNMATCHED,
        PASSTHROUGH, PEER, PEER_FAR, PEER_HOT,
    },
    stack::{copy, copy_build, repo, rest_vars, Origin, Worker, BUILD, TOKEN},
};

const USAGE: &str = "\
usage: edge-limiter-bench [--quick] [--rounds N] [--seconds S] [--baseline DIR]
                          [--parts LIST] [--no-save | --out FILE]

  --quick      one short round of everything, to try the setup (about a minute)
  --rounds N   interleaved rounds per part (default: 21 for Redis, 5 under load)
  --seconds S  length of each load run (default 15: part 2's pooled p99
               wants 10 000 requests of each worker over 5 rounds)
  --baseline DIR
               another build of our worker (what scripts/build-worker leaves
               in build/, e.g. of an earlier commit), run beside this one
               under load: a change's before and after in one run
  --parts LIST the parts to run, comma-separated (default 1,2,3,4,6,7,8,9,10; 2
               also measures 5): '--parts 2 --baseline DIR --no-save' compares
               two builds under load in a few minutes, '--parts 8 --no-save'
               sends the hostile requests alone
  --no-save    print the table only
  --out FILE   where to save it (default bench/RESULTS.md)";

#[derive(Debug)]
struct Options {
    redis_rounds: usize,
    load_rounds: u32,
    seconds: u32,
    redis_calls: u32,
    far_clients: u32,
    baseline: Option<PathBuf>,
    /// Requests of each hostile shape per measurement (part 8).
    hostile_batch: usize,
    /// Which parts run; index 0 is unused, 5 goes with 2.
    parts: [bool; 11],
    out: Option<PathBuf>,
}

impl Options {
    /// wrk runs per worker and round of parts 2 and 5: [`SLICES`], one
    /// second each at the least.
    fn slices(&self) -> u32 {
        SLICES.min(self.seconds).max(1)
    }

    /// Whether `part` (1 to 10) is to run.
    fn runs(&self, part: usize) -> bool {
        self.parts[part]
    }

    fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
        let mut o = Options {
            // Many short Redis rounds: the machine's mood changes within a
            // second, and a median over 21 rounds outlasts more of it.
            redis_rounds: 21,
            load_rounds: 5,
            // 5 rounds of 15 s: over 10 000 requests a worker at part 2's
            // 140 to 190 a second, for a pooled p99 of 100 in the tail.
            seconds: 15,
            redis_calls: 20_000,
            far_clients: 200,
            baseline: None,
            hostile_batch: 60,
            parts: [true; 11],
            out: Some(repo().join("bench/RESULTS.md")),
        };
        while let Some(arg) = args.next() {
            let mut number = |name: &str| -> Result<u32, String> {
                args.next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{name} needs a positive number"))
            };
            match arg.as_str() {
                "--quick" => {
                    o.redis_rounds = 1;
                    o.load_rounds = 1;
                    o.seconds = 3;
                    o.redis_calls = 20_000;
                    o.far_clients = 20;
                    o.hostile_batch = 20;
                }
                "--rounds" => {
                    let n = number("--rounds")?;
                    o.redis_rounds = n as usize;
                    o.load_rounds = n;
                }
                "--seconds" => o.seconds = number("--seconds")?,
                "--baseline" => {
                    o.baseline = Some(args.next().ok_or("--baseline needs a directory")?.into())
                }
                "--parts" => o.parts = parts(&args.next().unwrap_or_default())?,
                "--no-save" => o.out = None,
                "--out" => o.out = Some(args.next().ok_or("--out needs a file")?.into()),
                "-h" | "--help" => return Err(USAGE.to_owned()),
                other => return Err(format!("unknown argument {other:?}\n\n{USAGE}")),
            }
        }
        Ok(o)
    }
}

/// `1,2,6` as the parts it names; 5 is measured with 2, so it names 2.
fn parts(list: &str) -> Result<[bool; 11], String> {
    let mut on = [false; 11];
    for item in list.split(',') {
        match item.trim().parse::<usize>() {
            Ok(n @ 1..=10) => on[if n == 5 { 2 } else { n }] = true,
            _ => {
                return Err(format!(
                    "--parts takes numbers 1 to 10, comma-separated, not {list:?}"
                ))
            }
        }
    }
    on[5] = on[2];
    Ok(on)
}

/// Concurrency of the Redis-side runs.
const REDIS_CLIENTS: u32 = 16;
/// Concurrency under load, the same for every worker.
const CONNECTIONS: u32 = 8;
/// One request in this many comes from the hot client.
const HOT_EVERY: u32 = 8;
/// wrk runs per worker and round of parts 2 and 5 (one second each at the
/// least), taken in turns.
const SLICES: u32 = 5;

fn say(what: &str) {
    eprintln!("[bench] {what}");
}

/// The head of `bench/RESULTS.md`, above the runs.
const RESULTS_HEAD: &str = "# Benchmark results\n\nThe latest `scripts/bench` run on the reference machine first, the earlier ones below it; rerun it and commit this file to update. Figures vary about +-20 % from run to run on 2 cores. Why the scripts are written as they are, with their cost inside Redis: [SCRIPTS.md](SCRIPTS.md).\n\n";

/// The results file with `table` as its newest run, above the runs of
/// `earlier` (the file as it was): a run, whole or of some parts, never
/// erases the ones before it.
fn with_earlier(table: &str, earlier: &str) -> String {
    let runs = earlier.find("\n## ").map_or("", |at| &earlier[at + 1..]);
    format!("{RESULTS_HEAD}{}\n\n{runs}", table.trim_end())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&options).await {
        Ok(mut results) => {
            // Everything the bench started has stopped by now.
            results
                .background
                .push(format!("after the run: {}", busy()));
            let table = report::render(&results);
            println!("{table}");
            if let Some(out) = &options.out {
                let earlier = std::fs::read_to_string(out).unwrap_or_default();
                if let Err(e) = std::fs::write(out, with_earlier(&table, &earlier)) {
                    eprintln!("bench: cannot write {}: {e}", out.display());
                    return ExitCode::FAILURE;
                }
                say(&format!("saved to {}", out.display()));
            }
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("bench: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(o: &Options) -> Result<Results, String> {
    let built = repo().join("build");
    for dir in std::iter::once(&built).chain(&o.baseline) {
        check_built(dir)?;
    }
    let mut r = fresh_results(o);
    r.background.push(format!("before the run: {}", busy()));
    let b = Shared::start(built)?;

    say("part 4: sizes");
    r.wasm = size::size_of_file(&b.built.join("index_bg.wasm"))?;
    if o.runs(1) {
        say("part 1: Redis-side cost (redis-benchmark)");
        redis_part(o, &b.redis, &mut r)?;
    }
    let passthrough = near_parts(o, &b, &mut r).await?;
    if o.runs(2) {
        stats_part(o, &b, &mut r).await?;
    }
    if o.runs(6) {
        far_away_part(o, &b, &passthrough, &mut r).await?;
    }
    if o.runs(7) {
        hot_key_part(o, &b, &passthrough, &mut r).await?;
    }
    if o.runs(8) {
        hostile_part(o, &b, &passthrough, &mut r).await?;
    }
    if o.runs(9) {
        in_flight_part(&b, &mut r).await?;
    }
    if o.runs(10) {
        say("part 10: one limit across two regions, each 80 ms from the other");
        let measured = regions::measure(&b.http, &b.built, &b.scratch, &b.origin, &passthrough);
        r.regions = Some(measured.await?);
    }
    drop(passthrough);
    let _ = std::fs::remove_dir_all(&b.scratch);
    Ok(r)
}

/// What every part shares: Redis, its REST endpoint, the origin, the
/// worker build, where the workers' copies go, and an HTTP client.
/// Its fields drop in the order they are written: the origin, then the
/// endpoint, then Redis.
struct Shared {
    origin: Origin,
    endpoint: Endpoint,
    redis: RedisServer,
    /// The endpoint's URL.
    rest: String,
    http: reqwest::Client,
    /// What `scripts/build-worker` left in `build/`.
    built: PathBuf,
    scratch: PathBuf,
}

impl Shared {
    fn start(built: PathBuf) -> Result<Shared, String> {
        let redis = RedisServer::start();
        let endpoint = Endpoint::start(&redis.addr(), TOKEN);
        Ok(Shared {
            origin: Origin::start()?,
            rest: endpoint.url(),
            endpoint,
            redis,
            http: reqwest::Client::new(),
            built,
            scratch: std::env::temp_dir()
                .join(format!("edge-limiter-bench-{}", std::process::id())),
        })
    }
}

/// Parts 2 to 5, through the four workers on the endpoint itself (and the
/// `--baseline` build); returns the passthrough, which later parts measure
/// against.
async fn near_parts(o: &Options, b: &Shared, r: &mut Results) -> Result<Worker, String> {
    say("starting four workers in wrangler dev");
    let (workers, probe, baseline) = start_all(o, &b.http, &b.scratch, &b.rest, &b.origin).await?;
    let [passthrough, ours, peer, ours_unmatched] = workers;
    if o.runs(3) {
        trips_part(b, [&ours, &peer], r).await?;
    }
    if o.runs(4) {
        say("part 4: instantiation in workerd");
        r.instantiate_ms = size::instantiate_ms(&b.http, &probe, 5, 200).await?;
    }
    // Idle wrangler still wakes up now and then: keep it out of the load runs.
    drop(probe);
    r.our_bundle = ours.bundle().map(|(_, b)| size::size_of(&b)).transpose()?;
    r.peer_bundle = peer.bundle().map(|(_, b)| size::size_of(&b)).transpose()?;
    if o.runs(2) {
        say("parts 2 and 5: load through wrangler dev (wrk)");
        let mut order = vec![
            (&passthrough, PASSTHROUGH, "/load", 0),
            (&ours, OURS, "/load", 1),
            (&peer, PEER, "/load", 2),
            // Our worker where no rule applies: its cost without the Redis call.
            (&ours_unmatched, OURS_UNMATCHED, "/free", 3),
        ];
        if let Some(b) = &baseline {
            order.push((b, OURS_BASELINE, "/load", 4));
        }
        r.load = load_part(o, b, &order).await?;
        say("part 2: load through workerd alone, without wrangler (wrk)");
        let spawn = |label, like| bare::spawn(label, like, b.scratch.join(label));
        let bare = [
            spawn(BARE_PASSTHROUGH, &passthrough)?,
            spawn(BARE_OURS, &ours)?,
            spawn(BARE_PEER, &peer)?,
        ];
        // Idle wrangler still wakes up now and then (the passthrough's
        // stays: later parts measure against it).
        drop((ours, peer, ours_unmatched, baseline));
        for w in &bare {
            w.ready(&b.http).await?;
        }
        // Slots of their own: the wrangler runs' clients are in Redis.
        let order: Vec<_> = bare
            .iter()
            .zip(5..)
            .map(|(w, slot)| (w, w.label, "/load", slot))
            .collect();
        r.load.extend(load_part(o, b, &order).await?);
        for w in &bare {
            let log = std::fs::read_to_string(w.dir.join(bare::LOG)).unwrap_or_default();
            r.scavenges.push((w.label, gc::scavenges(&log)));
        }
    }
    Ok(passthrough)
}

/// Part 3: REST calls per step, ours then the peer.
async fn trips_part(b: &Shared, [ours, peer]: [&Worker; 2], r: &mut Results) -> Result<(), String> {
    say("part 3: round trips");
    // Only ours has count_status: the peer runs the first four steps.
    for (label, worker, salt, logins) in [(OURS, ours, 1, true), (PEER, peer, 2, false)] {
        let counts = trips::count(&b.http, &b.rest, &b.redis.addr(), worker, salt, logins).await?;
        r.trips.push((label, counts));
    }
    Ok(())
}

/// Part 2's stats on against stats off, in workers of their own.
async fn stats_part(o: &Options, b: &Shared, r: &mut Results) -> Result<(), String> {
    say("part 2: our worker with stats on against stats off");
    let shape = Shape {
        connections: CONNECTIONS,
        seconds: o.seconds,
        hot_every: HOT_EVERY,
    };
    let cost = stats_cost::measure(
        &b.http,
        &b.origin,
        b.endpoint.addr(),
        &b.built,
        &b.scratch,
        shape,
        o.load_rounds,
    );
    r.stats_cost = Some(cost.await?);
    Ok(())
}

/// Part 6: ours and the peer with every REST call 40 ms away, fresh
/// clients and then a hot key.
async fn far_away_part(
    o: &Options,
    b: &Shared,
    passthrough: &Worker,
    r: &mut Results,
) -> Result<(), String> {
    say("part 6: Redis 40 ms away");
    let proxy = FaultProxy::start(b.endpoint.addr()).map_err(|e| format!("fault proxy: {e}"))?;
    proxy.set(Fault::Delay(far::DELAY));
    let origin = &b.origin.url;
    let far_workers = [
        spawn_ours(OURS_FAR, &b.built, &b.scratch, &proxy.url(), origin)?,
        spawn_peer(PEER_FAR, &b.scratch, &proxy.url(), origin)?,
    ];
    let baseline = match &o.baseline {
        Some(dir) => Some(spawn_ours(
            OURS_FAR_BASELINE,
            dir,
            &b.scratch,
            &proxy.url(),
            origin,
        )?),
        None => None,
    };
    let measured: Vec<&Worker> = far_workers.iter().chain(&baseline).collect();
    far_part(o, &b.http, &measured, passthrough, &proxy, r).await?;
    drop(baseline);
    let proxies = [&proxy, &proxy];
    r.far_hot = hot_part(
        o,
        &b.http,
        &far_workers,
        passthrough,
        proxies,
        &b.origin,
        "far",
    )
    .await?;
    let [ours, peer] = &far_workers;
    r.far_pages = o.load_rounds.max(1);
    for (i, (label, path)) in far::PAGE_LOADS.into_iter().enumerate() {
        let worker = if label == "peer" { peer } else { ours };
        let salt = format!("{}-{i}", std::process::id());
        let loads = far::page_loads(
            &b.http,
            worker,
            passthrough,
            &proxy,
            path,
            r.far_pages,
            &salt,
        );
        r.far_page.push((label, loads.await?));
    }
    Ok(())
}

/// Part 7: a hot key through ours under leases and the peer, each behind
/// a proxy counting its calls; then one key shared by two of our workers.
async fn hot_key_part(
    o: &Options,
    b: &Shared,
    passthrough: &Worker,
    r: &mut Results,
) -> Result<(), String> {
    say("part 7: a hot key under leases, and two workers sharing a key");
    let proxy = || FaultProxy::start(b.endpoint.addr()).map_err(|e| format!("fault proxy: {e}"));
    let proxies = [proxy()?, proxy()?];
    let origin = &b.origin.url;
    let workers = [
        spawn_ours(OURS_HOT, &b.built, &b.scratch, &proxies[0].url(), origin)?,
        spawn_peer(PEER_HOT, &b.scratch, &proxies[1].url(), origin)?,
        spawn_ours(OURS_SHARED, &b.built, &b.scratch, &b.rest, origin)?,
    ];
    let [ours_hot, peer_hot, ours_shared] = workers;
    let pair = [ours_hot, peer_hot];
    let counted = [&proxies[0], &proxies[1]];
    r.hot = hot_part(o, &b.http, &pair, passthrough, counted, &b.origin, "near").await?;
    ours_shared.ready(&b.http).await?;
    let seconds = if o.seconds < 10 { 3 } else { 10 };
    let key = format!("shared-{}", std::process::id());
    let workers = [&pair[0], &ours_shared];
    r.shared = Some(hot::shared(&b.http, workers, &b.origin, &key, seconds).await?);
    Ok(())
}

/// Part 8: hostile requests through ours, in a worker of its own.
async fn hostile_part(
    o: &Options,
    b: &Shared,
    passthrough: &Worker,
    r: &mut Results,
) -> Result<(), String> {
    say("part 8: hostile requests");
    let ours = spawn_hostile(&b.scratch, &b.rest, &b.origin.url)?;
    ours.ready(&b.http).await?;
    let settings = hostile::Settings {
        batch: o.hostile_batch,
        rounds: o.load_rounds.clamp(1, 3) as usize,
    };
    r.hostile = hostile::run(&b.http, &ours, passthrough, &b.rest, settings).await?;
    Ok(())
}

/// Part 9: requests in flight through ours, behind a proxy counting its
/// REST requests; then requests that wait instead of a 429.
async fn in_flight_part(b: &Shared, r: &mut Results) -> Result<(), String> {
    say("part 9: requests in flight");
    let proxy = FaultProxy::start(b.endpoint.addr()).map_err(|e| format!("fault proxy: {e}"))?;
    let dir = b.scratch.join(OURS_IN_FLIGHT);
    copy_build(&b.built, &dir)?;
    let ours = Worker::spawn(
        OURS_IN_FLIGHT,
        dir,
        Path::new("build/worker/shim.mjs"),
        &rest_vars(&proxy.url(), &b.origin.url),
        &(in_flight::rules() + &delayed::rule()),
    )?;
    ours.ready(&b.http).await?;
    r.in_flight = Some(in_flight::measure(&b.http, &ours, &proxy, &b.origin).await?);
    r.delayed = Some(delayed::measure(&b.http, &ours, &b.origin).await?);
    Ok(())
}

/// Every worker of parts 2 to 5, the instantiate probe and the
/// `--baseline` build, started and ready.
async fn start_all(
    o: &Options,
    http: &reqwest::Client,
    scratch: &Path,
    rest: &str,
    origin: &Origin,
) -> Result<([Worker; 4], Worker, Option<Worker>), String> {
    let (workers, probe) = start_workers(scratch, rest, &origin.url)?;
    let baseline = match &o.baseline {
        Some(dir) => Some(spawn_ours(OURS_BASELINE, dir, scratch, rest, &origin.url)?),
        None => None,
    };
    for w in workers.iter().chain([&probe]).chain(&baseline) {
        w.ready(http).await?;
    }
    Ok((workers, probe, baseline))
}

/// The results before any part has run: the run's settings and machine.
fn fresh_results(o: &Options) -> Results {
    Results {
        when: shell("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        machine: machine(),
        redis_clients: REDIS_CLIENTS,
        redis_calls: o.redis_calls,
        load_connections: CONNECTIONS,
        load_seconds: o.seconds,
        load_slices: o.slices(),
        hot_every: HOT_EVERY,
        hot_limit: HOT_LIMIT,
        peer_version: peer::version("@upstash/ratelimit"),
        instantiate_ms: f64::NAN,
        ..Results::default()
    }
}

/// Fails unless `dir` holds what `scripts/build-worker` leaves in `build/`.
fn check_built(dir: &Path) -> Result<(), String> {
    match BUILD.iter().map(|f| dir.join(f)).find(|p| !p.exists()) {
        Some(missing) => Err(format!(
            "no built worker ({}); run scripts/build-worker (scripts/bench does)",
            missing.display()
        )),
        None => Ok(()),
    }
}

/// Part 1: every script's time per call inside Redis, rounds interleaved.
fn redis_part(o: &Options, redis: &RedisServer, r: &mut Results) -> Result<(), String> {
    let mut cases: Vec<redis_side::Case> = redis_side::our_cases()?.into();
    cases.extend(redis_side::floor_cases());
    for call in peer::capture(&redis_side::peer_policies())? {
        cases.push(redis_side::peer_case(&call));
    }
    let mut shas = Vec::with_capacity(cases.len());
    for case in &cases {
        shas.push(redis_side::load(&redis.addr(), case)?);
    }
    let pinning = redis_side::Pinning::start(&redis.addr());
    r.pinned = pinning.is_some();
    for (case, sha) in cases.iter().zip(&shas) {
        let calls = (REDIS_CLIENTS, o.redis_calls / 10);
        redis_side::run(redis.port(), sha, case, calls, pinning.as_ref())?;
    }
    r.redis = cases.iter().map(|c| (c.label, Vec::new())).collect();
    for round in 0..o.redis_rounds {
        for k in redis_side::round_order(cases.len(), round) {
            let calls = (REDIS_CLIENTS, o.redis_calls);
            let sample =
                redis_side::run(redis.port(), &shas[k], &cases[k], calls, pinning.as_ref())?;
            r.redis[k].1.push(sample);
        }
    }
    Ok(())
}

/// Parts 2 and 5: each worker under the same load, rounds interleaved, in
/// a different order each round. `order` holds each worker with its label,
/// the path prefix it is loaded on, and its slot of client addresses; the
/// runs come back per label.
async fn load_part(
    o: &Options,
    b: &Shared,
    order: &[(&Worker, &'static str, &'static str, u32)],
) -> Result<Vec<(&'static str, Vec<load::Run>)>, String> {
    let shape = Shape {
        connections: CONNECTIONS,
        seconds: o.seconds,
        hot_every: HOT_EVERY,
    };
    let order: Vec<load::Target> = order
        .iter()
        .map(|&(worker, label, prefix, slot)| load::Target {
            worker,
            label,
            prefix,
            slot,
        })
        .collect();
    let warm = Shape {
        seconds: 2,
        ..shape
    };
    for t in &order {
        load::run(&b.http, &b.rest, *t, &b.origin, warm, (0, 0)).await?;
    }
    // A round is each worker's `seconds` cut into slices, the workers taking
    // turns slice by slice: the shared machine's slow moments, which last
    // seconds, then fall on every worker of the round alike.
    let slices = o.slices();
    let slice = Shape {
        seconds: shape.seconds / slices,
        ..shape
    };
    let mut runs: Vec<_> = order.iter().map(|t| (t.label, vec![])).collect();
    for round in 1..=o.load_rounds {
        let mut taken: Vec<Vec<load::Run>> = vec![Vec::new(); order.len()];
        for s in 0..slices {
            for i in 0..order.len() {
                let k = (i + (round + s) as usize) % order.len();
                let at = (round, s);
                taken[k].push(load::run(&b.http, &b.rest, order[k], &b.origin, slice, at).await?);
            }
        }
        for (k, slices) in taken.iter().enumerate() {
            runs[k].1.push(load::merged(slices));
        }
    }
    Ok(runs)
}

/// Part 6: each worker with its REST calls held 40 ms by the proxy.
async fn far_part(
    o: &Options,
    http: &reqwest::Client,
    far_workers: &[&Worker],
    passthrough: &Worker,
    proxy: &FaultProxy,
    r: &mut Results,
) -> Result<(), String> {
    for w in far_workers {
        w.ready(http).await?;
    }
    r.far_clients = o.far_clients;
    for (salt, w) in far_workers.iter().enumerate() {
        // One client through each worker first: its first call may load the
        // script, which is not what this part measures.
        far::measure(http, w, passthrough, proxy, 1, 0xff00 + salt as u16).await?;
        let situations =
            far::measure(http, w, passthrough, proxy, o.far_clients, salt as u16 + 1).await?;
        r.far.push((w.label, situations));
    }
    Ok(())
}

/// The hot key through each of `workers` (ours, then the peer), their REST
/// calls counted at `proxies`, in interleaved rounds of a few seconds.
async fn hot_part(
    o: &Options,
    http: &reqwest::Client,
    workers: &[Worker; 2],
    passthrough: &Worker,
    proxies: [&FaultProxy; 2],
    origin: &Origin,
    run: &str,
) -> Result<Vec<(&'static str, Vec<hot::Steady>)>, String> {
    for w in workers {
        w.ready(http).await?;
    }
    let seconds = if o.seconds < 10 { 2 } else { 5 };
    let mut out: Vec<(&'static str, Vec<hot::Steady>)> =
        workers.iter().map(|w| (w.label, vec![])).collect();
    let rounds = o.load_rounds.clamp(1, 3) as usize;
    // A fresh key per run and round; round 0 warms each worker up.
    for round in 0..=rounds {
        for i in 0..workers.len() {
            let k = (i + round) % workers.len();
            let subject = hot::Subject {
                worker: &workers[k],
                proxy: proxies[k],
                key: format!("{run}-{}-{round}-{}", workers[k].label, std::process::id()),
                seconds: if round == 0 { 1 } else { seconds },
            };
            let steady = hot::steady(http, &subject, passthrough, origin).await?;
            if round > 0 {
                out[k].1.push(steady);
            }
        }
    }
    Ok(out)
}

/// Starts (a) the passthrough, (b) ours, (c) the peer, ours again for the
/// requests no rule applies to, and the instantiate probe, all at once:
/// wrangler's start-up is the slow part. Under `wrangler dev`, workerd's
/// memory grows with every request it serves, whoever the worker, and its
/// tail with it (figures in commit 9646750); so no measured worker serves
/// another's runs.
fn start_workers(
    scratch: &Path,
    rest: &str,
    origin: &str,
) -> Result<([Worker; 4], Worker), String> {
    let bench = repo().join("bench/workers");
    let passthrough = Worker::spawn(
        PASSTHROUGH,
        scratch.join(PASSTHROUGH),
        &bench.join("passthrough.mjs"),
        &format!("ORIGIN_URL = \"{origin}\""),
        "",
    )?;
    let ours = spawn_ours(OURS, &repo().join("build"), scratch, rest, origin)?;
    let peer = spawn_peer(PEER, scratch, rest, origin)?;
    let ours_unmatched = spawn_ours(OURS_UNMATCHED, &repo().join("build"), scratch, rest, origin)?;

    let probe_dir = scratch.join("instantiate");
    copy(
        bench.join("instantiate.mjs"),
        probe_dir.join("instantiate.mjs"),
    )?;
    copy(
        repo().join("build/index_bg.wasm"),
        probe_dir.join("index_bg.wasm"),
    )?;
    let probe = Worker::spawn(
        "instantiate",
        probe_dir,
        Path::new("instantiate.mjs"),
        "",
        "",
    )?;
    Ok(([passthrough, ours, peer, ours_unmatched], probe))
}

/// Our worker, from a copy of the build in `build` (so that a rebuild during
/// the run changes nothing), with the `/load` and `/rt` rules.
fn spawn_ours(
    label: &'static str,
    build: &Path,
    scratch: &Path,
    rest: &str,
    origin: &str,
) -> Result<Worker, String> {
    let dir = scratch.join(label);
    copy_build(build, &dir)?;
    // A --baseline build may predate leases: the part 7 rules are ours only.
    let hot_rules = match label {
        OURS_BASELINE | OURS_FAR_BASELINE => String::new(),
        _ => hot::our_rules(),
    };
    let rules = format!(
        "{hot_rules}[[vars.LIMITER.rules]]\nname = \"load\"\nkey = [\"ip\"]\nalgorithm = \"windowed\"\nwindows = [[\"1d\", {HOT_LIMIT}, \"24m\"]]\npath_prefix = \"/load\"\n\n[[vars.LIMITER.rules]]\nname = \"rt\"\nkey = [\"ip\"]\nalgorithm = \"windowed\"\nwindows = [[\"1d\", 1, \"24m\"]]\npath_prefix = \"/rt\"\n\n[[vars.LIMITER.rules]]\nname = \"login\"\nkey = [\"ip\"]\nalgorithm = \"windowed\"\nwindows = [[\"1d\", 100, \"24m\"]]\npath_prefix = \"/login\"\ncount_status = [401]\n"
    );
    Worker::spawn(
        label,
        dir,
        Path::new("build/worker/shim.mjs"),
        &rest_vars(rest, origin),
        &rules,
    )
}

/// Our worker under part 8's rules, which read every part of a request.
fn spawn_hostile(scratch: &Path, rest: &str, origin: &str) -> Result<Worker, String> {
    let dir = scratch.join(OURS_HOSTILE);
    copy_build(&repo().join("build"), &dir)?;
    Worker::spawn(
        OURS_HOSTILE,
        dir,
        Path::new("build/worker/shim.mjs"),
        &rest_vars(rest, origin),
        &hostile::rules(),
    )
}

/// The peer's worker with the same two rules.
fn spawn_peer(
    label: &'static str,
    scratch: &Path,
    rest: &str,
    origin: &str,
) -> Result<Worker, String> {
    let peer_rules = format!(
        "PEER_RULES = '[{{\"prefix\": \"/rt\", \"limit\": 1, \"window\": \"1 d\"}}, {{\"prefix\": \"/load\", \"limit\": {HOT_LIMIT}, \"window\": \"1 d\"}}, {}]'",
        hot::peer_rule()
    );
    Worker::spawn(
        label,
        scratch.join(label),
        &repo().join("bench/workers/peer.mjs"),
        &format!("{}\n{peer_rules}", rest_vars(rest, origin)),
        "",
    )
}

/// A command's trimmed stdout (stderr if stdout is empty), or "?".
fn shell(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            let out = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            if out.is_empty() {
                String::from_utf8_lossy(&o.stderr).trim().to_owned()
            } else {
                out
            }
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "?".to_owned())
}

fn machine() -> Vec<(String, String)> {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let field = |text: &str, key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| {
                v.trim_start_matches([' ', '\t', ':', '='])
                    .trim_matches('"')
                    .trim()
                    .to_owned()
            })
            .unwrap_or_else(|| "?".to_owned())
    };
    let cpuinfo = read("/proc/cpuinfo");
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_kb: f64 = field(&read("/proc/meminfo"), "MemTotal")
        .trim_end_matches(" kB")
        .parse()
        .unwrap_or(0.0);
    let npm = |package: &str| peer::version(package);
    vec![
        (
            "machine".into(),
            format!(
                "{}, {}, {cores} x {}, {:.0} GiB",
                field(&read("/etc/os-release"), "PRETTY_NAME"),
                shell("uname", &["-srm"]),
                field(&cpuinfo, "model name"),
                mem_kb / 1024.0 / 1024.0
            ),
        ),
        (
            "software".into(),
            format!(
                "redis-server {}, wrangler {} (workerd {}), node {}, {}, @upstash/redis {}",
                shell("redis-server", &["--version"])
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("v="))
                    .unwrap_or("?"),
                npm("wrangler"),
                npm("workerd"),
                shell("node", &["--version"]),
                shell("wrk", &["-v"])
                    .lines()
                    .next()
                    .unwrap_or("wrk ?")
                    .split(" [")
                    .next()
                    .unwrap_or("wrk ?"),
                npm("@upstash/redis"),
            ),
        ),
    ]
}

/// The load average and what used the CPU over one second (the bench's own
/// processes are not running when this is called): a run on a shared
/// machine should say what it shared it with.
fn busy() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let before = cpu::snapshot();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let others: Vec<String> = cpu::snapshot()
        .busiest(&before, 1.0, 0.05)
        .into_iter()
        .take(6)
        .map(|(name, share)| format!("{name} {:.0}%", share * 100.0))
        .collect();
    format!(
        "load average {}; CPU over 1 s (100 % = one core): {}",
        load.join(" "),
        if others.is_empty() {
            "nothing above 5 %".to_owned()
        } else {
            others.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_goes_above_the_earlier_ones_and_erases_none() {
        let old_head = "# Benchmark results\n\nAn older head.\n\n";
        let earlier = format!("{old_head}## Run 2\n\nb\n\n## Run 1\n\na\n");
        let text = with_earlier("## Run 3\n\nc\n", &earlier);
        assert_eq!(
            text,
            format!("{RESULTS_HEAD}## Run 3\n\nc\n\n## Run 2\n\nb\n\n## Run 1\n\na\n")
        );
        assert_eq!(
            with_earlier("## Run 1\n", ""),
            format!("{RESULTS_HEAD}## Run 1\n\n")
        );
    }

    fn parse(args: &[&str]) -> Result<Options, String> {
        Options::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn options() {
        let o = parse(&[]).unwrap();
        assert_eq!((o.redis_rounds, o.load_rounds, o.seconds), (21, 5, 15));
        assert!(o.out.unwrap().ends_with("bench/RESULTS.md"));
        let o = parse(&["--quick", "--no-save"]).unwrap();
        assert_eq!((o.redis_rounds, o.load_rounds), (1, 1));
        assert!(o.out.is_none());
        assert!(parse(&["--rounds", "0"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        let o = parse(&["--parts", "2,6"]).unwrap();
        assert_eq!(
            (1..=8).map(|p| o.runs(p)).collect::<Vec<_>>(),
            [false, true, false, false, true, true, false, false]
        );
        assert!(parse(&["--parts", "7"]).unwrap().runs(7));
        let alone = parse(&["--parts", "8"]).unwrap();
        assert!(alone.runs(8) && !alone.runs(2));
        let in_flight = parse(&["--parts", "9"]).unwrap();
        assert!(in_flight.runs(9) && !in_flight.runs(8));
        assert!(parse(&["--parts", "10"]).unwrap().runs(10));
        assert!(parse(&["--parts", "11"]).is_err());
        assert!(parse(&["--parts"]).is_err());
    }
}
