//! The one table, as Markdown: printed, and saved with the date and machine.
//! Targets are reported as met or not; nothing here fails on a timing.

use std::fmt::Write as _;

use crate::{
    delayed::{self, Delayed},
    far::{self, Situation},
    gc::Scavenges,
    hostile::{Hostile, MOST_TIMES_ORDINARY},
    hot::{self, Shared, Steady},
    in_flight::{self, InFlight},
    load::{pooled_percentile, Run},
    redis_side::{
        Sample, FLOOR_CLOCK_RW, FLOOR_PTTL_SET, FLOOR_RW, GCRA_FRACTIONAL, GCRA_OVERRIDES,
    },
    size::Size,
    stats::{median, percentile, spread},
    trips::{Counts, STEPS},
};

/// Everything one run measured.
#[derive(Debug, Default)]
pub struct Results {
    /// `date -u` at the start.
    pub when: String,
    /// Label and value, e.g. ("CPU", "2 x AMD EPYC ...").
    pub machine: Vec<(String, String)>,
    /// What else was using the machine, as seen before and after.
    pub background: Vec<String>,
    /// Part 1: per case, one sample per round.
    pub redis: Vec<(&'static str, Vec<Sample>)>,
    pub redis_clients: u32,
    pub redis_calls: u32,
    /// Whether Redis and the benchmark's client ran on cores of their own.
    pub pinned: bool,
    /// Parts 2 and 5: per worker label, one run per round.
    pub load: Vec<(&'static str, Vec<Run>)>,
    /// Part 2's bare workerds: each one's scavenges over all its rounds.
    pub scavenges: Vec<(&'static str, Scavenges)>,
    pub load_connections: u32,
    pub load_seconds: u32,
    /// wrk runs per worker and round, taken in turns.
    pub load_slices: u32,
    pub hot_every: u32,
    /// The hot client's configured limit for the run.
    pub hot_limit: u64,
    /// Part 3: per worker label.
    pub trips: Vec<(&'static str, Counts)>,
    /// Part 6: per worker label, one entry per [`far::SITUATIONS`].
    pub far: Vec<(&'static str, Vec<Situation>)>,
    /// Fresh clients per worker in part 6.
    pub far_clients: u32,
    /// Part 6's hot key, per worker label, one run per round.
    pub far_hot: Vec<(&'static str, Vec<Steady>)>,
    /// Part 6's page loads, per [`far::PAGE_LOADS`] label, and how many
    /// pages each.
    pub far_page: Vec<(&'static str, Situation)>,
    pub far_pages: u32,
    /// Part 7: the hot key per worker label, one run per round; and the
    /// key two workers shared.
    pub hot: Vec<(&'static str, Vec<Steady>)>,
    pub shared: Option<Shared>,
    /// Part 8.
    pub hostile: Hostile,
    /// Part 9.
    pub in_flight: Option<InFlight>,
    /// Part 9, the wait instead of 429.
    pub delayed: Option<Delayed>,
    /// Part 10.
    pub regions: Option<crate::regions::Regions>,
    /// Part 4.
    pub wasm: Size,
    pub our_bundle: Option<Size>,
    pub peer_bundle: Option<Size>,
    pub instantiate_ms: f64,
    pub peer_version: String,
    /// Part 2's stats on against off (issue 33).
    pub stats_cost: Option<crate::stats_cost::StatsCost>,
}

fn samples<'a>(r: &'a Results, label: &str) -> &'a [Sample] {
    r.redis
        .iter()
        .find(|(l, _)| *l == label)
        .map(|(_, s)| s.as_slice())
        .unwrap_or(&[])
}

fn runs<'a>(r: &'a Results, label: &str) -> &'a [Run] {
    r.load
        .iter()
        .find(|(l, _)| *l == label)
        .map(|(_, s)| s.as_slice())
        .unwrap_or(&[])
}

/// `x.xx (lo..hi)` with `digits` decimals; a dash when nothing was measured.
fn with_spread(values: &[f64], digits: usize) -> String {
    let m = median(values);
    if m.is_nan() {
        return "-".to_owned();
    }
    let (lo, hi) = spread(values);
    if values.len() < 2 {
        return format!("{m:.digits$}");
    }
    format!("{m:.digits$} ({lo:.digits$}..{hi:.digits$})")
}

fn ratio(ours: f64, peer: f64) -> String {
    if ours.is_nan() || peer.is_nan() || peer <= 0.0 || ours < 0.0 {
        return "-".to_owned();
    }
    format!("{:.2}", ours / peer)
}

fn met(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "-",
    }
}

fn kb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1024.0)
}

fn usec(r: &Results, label: &str) -> Vec<f64> {
    samples(r, label).iter().map(|s| s.usec_per_call).collect()
}

fn ops(r: &Results, label: &str) -> Vec<f64> {
    samples(r, label).iter().map(|s| s.ops_per_s).collect()
}

/// Per-round overhead of `label` over the passthrough `base`: each round's
/// figure minus the passthrough's in the same round, so a busy round hits
/// both.
fn overhead(r: &Results, base: &str, label: &str, pick: fn(&Run) -> f64) -> Vec<f64> {
    runs(r, label)
        .iter()
        .zip(runs(r, base))
        .map(|(x, base)| pick(x) - pick(base))
        .collect()
}

pub const PASSTHROUGH: &str = "passthrough";
pub const OURS: &str = "ours";
pub const PEER: &str = "peer";
/// Our worker on a path no rule covers: wasm, configuration and forwarding,
/// without the Redis call.
pub const OURS_UNMATCHED: &str = "ours-unmatched";
/// Ours and the peer with Redis 40 ms away (part 6).
pub const OURS_FAR: &str = "ours-far";
/// The `--baseline` build of our worker, under the same load as ours.
pub const OURS_BASELINE: &str = "ours-baseline";
pub const PEER_FAR: &str = "peer-far";
/// The `--baseline` build with Redis 40 ms away (part 6).
pub const OURS_FAR_BASELINE: &str = "ours-far-baseline";
/// Ours and the peer under a hot key, their REST calls counted (part 7).
pub const OURS_HOT: &str = "ours-hot";
pub const PEER_HOT: &str = "peer-hot";
/// The second of our workers sharing a key with the first (part 7).
pub const OURS_SHARED: &str = "ours-shared";
/// Ours under rules that read every part of a request (part 8).
pub const OURS_HOSTILE: &str = "ours-hostile";
/// Ours under an in-flight rule, its REST requests counted (part 9).
pub const OURS_IN_FLIGHT: &str = "ours-in-flight";
/// The passthrough, ours and the peer again, each in a workerd of its own
/// without wrangler (part 2).
pub const BARE_PASSTHROUGH: &str = "bare-passthrough";
pub const BARE_OURS: &str = "bare-ours";
pub const BARE_PEER: &str = "bare-peer";

/// The runs one comparison of part 2 reads: ours and another worker, each
/// against the passthrough run beside them.
#[derive(Clone, Copy)]
struct Compared {
    passthrough: &'static str,
    ours: &'static str,
    other: &'static str,
    /// Whether they ran in `wrangler dev`, whose processes have rows of
    /// their own.
    wrangler: bool,
}

/// Ours against the peer in `wrangler dev`.
const NEAR: Compared = Compared {
    passthrough: PASSTHROUGH,
    ours: OURS,
    other: PEER,
    wrangler: true,
};

/// Ours against the peer, each in a bare workerd.
const BARE: Compared = Compared {
    passthrough: BARE_PASSTHROUGH,
    ours: BARE_OURS,
    other: BARE_PEER,
    wrangler: false,
};

/// One row of the table: part, measure, ours, the other, ratio, target, met.
type Row = [String; 7];

/// A row from borrowed cells.
fn row(cells: [&str; 7]) -> Row {
    cells.map(str::to_owned)
}

/// The table and the notes under it.
pub fn render(r: &Results) -> String {
    let mut out = String::new();
    let peer = format!("@upstash/ratelimit {}", r.peer_version);
    let _ = writeln!(out, "## edge-limiter vs {peer}, {}\n", r.when);
    for (k, v) in &r.machine {
        let _ = writeln!(out, "- {k}: {v}");
    }
    for line in &r.background {
        let _ = writeln!(out, "- {line}");
    }
    let _ = writeln!(
        out,
        "\nMedians of interleaved rounds, (min..max) over rounds. ours/peer below 1 means ours costs less, except for rates.\n"
    );
    let _ = writeln!(
        out,
        "| part | measure | ours | {peer} | ours/peer | target | met |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---|---|");
    let parts = [
        redis_rows(r),
        worker_rows(r),
        crate::stats_cost::rows(r.stats_cost.as_ref()),
        trip_rows(r),
        size_rows(r),
        exactness_rows(r),
        far_rows(r),
        hot_rows(&r.far_hot, "6 Redis 40 ms away, hot key", true),
        page_rows(r),
        hot_rows(&r.hot, "7 hot key", false),
        shared_rows(r),
        hostile_rows(&r.hostile),
        in_flight_rows(r.in_flight.as_ref()),
        delayed_rows(r.delayed.as_ref()),
        regions_rows(r.regions.as_ref()),
    ];
    for cells in parts.iter().flatten() {
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    let _ = writeln!(out, "\n{}", notes(r));
    out
}

/// Part 1, Redis's own time per decision. Every target is a ratio within
/// this run.
fn redis_rows(r: &Results) -> Vec<Row> {
    let mut rows = redis_ratio_rows(r);
    rows.extend(redis_rate_rows(r));
    rows.extend(redis_reference_rows(r));
    rows
}

/// Part 1's time per call of ours against another script's: `ours` and
/// `other_is`, each round's sample of it, named `other` in the target. The
/// ratio is the median of each round's: two runs of one round are seconds
/// apart, and share more of the machine's mood than two medians do.
fn redis_vs(
    r: &Results,
    ours: &str,
    other: &str,
    what: &str,
    target: Option<f64>,
    other_is: Vec<f64>,
) -> Row {
    let u = usec(r, ours);
    let per_round: Vec<f64> = u.iter().zip(&other_is).map(|(o, t)| o / t).collect();
    let ratio_now = median(&per_round);
    [
        "1 Redis".to_owned(),
        format!("{what}: us/call"),
        with_spread(&u, 2),
        with_spread(&other_is, 2),
        ratio(ratio_now, 1.0),
        target.map_or(String::new(), |t| format!("ours/{other} <= {t:.2}")),
        target
            .map_or("", |t| met((!u.is_empty()).then_some(ratio_now <= t)))
            .to_owned(),
    ]
}

/// Part 1's rows with a target: time per call against a floor or the peer.
fn redis_ratio_rows(r: &Results) -> Vec<Row> {
    vec![
        redis_vs(
            r,
            "ours GCRA",
            "floor",
            "GCRA vs its own floor, a logic-free PTTL + SET PX (floor in the peer column)",
            Some(1.30),
            usec(r, FLOOR_PTTL_SET),
        ),
        redis_vs(
            r,
            "ours GCRA",
            "peer",
            "GCRA vs token bucket",
            None,
            usec(r, "peer token bucket"),
        ),
        redis_vs(
            r,
            GCRA_OVERRIDES,
            "plain",
            "GCRA on a rule that takes overrides (none set) vs the same rule without (plain in the peer column)",
            Some(1.25),
            usec(r, "ours GCRA"),
        ),
        redis_vs(
            r,
            "ours windowed x1",
            "peer",
            "one window vs sliding window",
            Some(1.00),
            usec(r, "peer sliding window"),
        ),
        redis_vs(
            r,
            "ours windowed x3",
            "peer",
            "1 s + 1 min + 1 h windows, ours in 1 call vs the peer's 3 calls (us per decision)",
            Some(0.60),
            usec(r, "peer sliding window")
                .iter()
                .map(|u| 3.0 * u)
                .collect(),
        ),
    ]
}

/// Part 1's decisions per second, ours against the peer's.
fn redis_rate_rows(r: &Results) -> Vec<Row> {
    let pairs = [
        (
            "ours GCRA",
            "peer token bucket",
            "GCRA vs token bucket: calls/s",
            1.0,
        ),
        (
            "ours windowed x1",
            "peer sliding window",
            "one window vs sliding window: calls/s",
            1.0,
        ),
        (
            "ours windowed x3",
            "peer sliding window",
            "1 s + 1 min + 1 h windows: decisions/s",
            3.0,
        ),
    ];
    pairs
        .into_iter()
        .map(|(ours, theirs, what, per)| {
            let (o, q) = (ops(r, ours), ops(r, theirs));
            let q: Vec<f64> = q.iter().map(|x| x / per).collect();
            row([
                "1 Redis",
                what,
                &with_spread(&o, 0),
                &with_spread(&q, 0),
                &ratio(median(&o), median(&q)),
                "",
                "",
            ])
        })
        .collect()
}

/// Part 1's scripts with no peer to compare to: what a figure costs, and
/// what a script that does next to nothing costs.
fn redis_reference_rows(r: &Results) -> Vec<Row> {
    let references = [
        (
            GCRA_FRACTIONAL,
            "GCRA at 7 per second (no whole millisecond per unit: one GET more): us/call",
        ),
        (
            FLOOR_RW,
            "reference: a script that only reads and writes one key (GET + SET): us/call",
        ),
        (
            FLOOR_CLOCK_RW,
            "reference: the same, reading Redis's clock first (TIME + GET + SET): us/call",
        ),
    ];
    references
        .into_iter()
        .map(|(label, what)| {
            row([
                "1 Redis",
                what,
                &with_spread(&usec(r, label), 2),
                "-",
                "",
                "",
                "",
            ])
        })
        .collect()
}

/// Part 2, each worker under load in wrangler dev.
fn worker_rows(r: &Results) -> Vec<Row> {
    let base = runs(r, PASSTHROUGH);
    let base_rps = median(&base.iter().map(|x| x.rps).collect::<Vec<_>>());
    let base_p50 = median(&base.iter().map(|x| x.p50_ms).collect::<Vec<_>>());
    let base_p99 = median(&base.iter().map(|x| x.p99_ms).collect::<Vec<_>>());
    let metric = |label: &str, pick: fn(&Run) -> f64| -> Vec<f64> {
        runs(r, label).iter().map(pick).collect()
    };
    let rps = |x: &Run| x.rps;
    let p99 = |x: &Run| x.p99_ms;
    let mut rows = Vec::new();
    for (what, pick, digits, base) in [
        ("requests/s", rps as fn(&Run) -> f64, 0, base_rps),
        ("p50 latency, ms", p50, 1, base_p50),
        ("p99 latency, ms", p99, 1, base_p99),
    ] {
        let (o, p) = (metric(OURS, pick), metric(PEER, pick));
        rows.push(row([
            "2 worker",
            &format!("{what} (passthrough {base:.digits$})"),
            &with_spread(&o, digits),
            &with_spread(&p, digits),
            &ratio(median(&o), median(&p)),
            "",
            "",
        ]));
    }
    rows.extend(overhead_rows(r, NEAR, "2 worker", true));
    if !runs(r, OURS_BASELINE).is_empty() {
        let baseline = Compared {
            other: OURS_BASELINE,
            ..NEAR
        };
        let part = "2 this build vs --baseline (peer column)";
        rows.extend(overhead_rows(r, baseline, part, false));
    }
    rows.push(row([
        "2 worker",
        "REST requests by the commands each carried (all rounds): mean; share of requests carrying 1 / 2 / 3-4 / 5-8 / 9+",
        &carried(runs(r, OURS)),
        &carried(runs(r, PEER)),
        "",
        "",
        "",
    ]));
    let unmatched = overhead(r, PASSTHROUGH, OURS_UNMATCHED, p50);
    rows.push(row([
        "2 worker",
        "of which without Redis (ours where no rule applies), p50 ms",
        &with_spread(&unmatched, 1),
        "-",
        "",
        "",
        "",
    ]));
    if !runs(r, BARE_OURS).is_empty() {
        rows.extend(overhead_rows(r, BARE, "2 bare workerd", false));
        rows.extend(scavenge_rows(r));
    }
    rows
}

/// Ours against the peer in bare workerd: how long V8's scavenges stopped
/// each isolate, and how much of its young generation they kept.
fn scavenge_rows(r: &Results) -> Vec<Row> {
    let of = |label| {
        r.scavenges
            .iter()
            .find(|(l, _)| *l == label)
            .map(|(_, s)| s)
            .filter(|s| !s.pauses_ms.is_empty())
    };
    let (Some(ours), Some(peer)) = (of(BARE_OURS), of(BARE_PEER)) else {
        return vec![];
    };
    let p50 = |s: &Scavenges| percentile(&s.pauses_ms, 50.0);
    let pauses = |s: &Scavenges| {
        let p99 = percentile(&s.pauses_ms, 99.0);
        format!("{:.1} / {p99:.1} ({} scavenges)", p50(s), s.pauses_ms.len())
    };
    let survived = |s: &Scavenges| median(&s.survived_pct);
    vec![
        row([
            "2 bare workerd",
            "V8 young-generation collections (scavenges) over every round: pause p50 / p99, ms",
            &pauses(ours),
            &pauses(peer),
            &ratio(p50(ours), p50(peer)),
            "",
            "",
        ]),
        row([
            "2 bare workerd",
            "share of the young generation a scavenge kept, median %",
            &format!("{:.1}", survived(ours)),
            &format!("{:.1}", survived(peer)),
            &ratio(survived(ours), survived(peer)),
            "",
            "",
        ]),
    ]
}

/// How `runs`' REST requests grouped their commands, pooled: the mean
/// carried, and the share of requests by how many they carried.
fn carried(runs: &[Run]) -> String {
    let mut by_size = std::collections::BTreeMap::new();
    for run in runs {
        for (&n, &count) in &run.carrying {
            *by_size.entry(n).or_insert(0u64) += count;
        }
    }
    let requests: u64 = by_size.values().sum();
    if requests == 0 {
        return "-".to_owned();
    }
    let commands: u64 = by_size.iter().map(|(n, count)| n * count).sum();
    let share = |range: std::ops::RangeInclusive<u64>| {
        let within: u64 = by_size.range(range).map(|(_, count)| count).sum();
        format!("{:.0} %", 100.0 * within as f64 / requests as f64)
    };
    let shares = [1..=1, 2..=2, 3..=4, 5..=8, 9..=u64::MAX].map(share);
    format!(
        "{:.2}; {}",
        commands as f64 / requests as f64,
        shares.join(" / ")
    )
}

/// Part 3, REST calls per decision.
fn trip_rows(r: &Results) -> Vec<Row> {
    let targets = [1, 1, 0, 2, 1, 2];
    let trips = |label: &str| r.trips.iter().find(|(l, _)| *l == label).map(|(_, c)| c);
    let show = |c: Option<&Counts>, i: usize| {
        c.and_then(|c| c.get(i))
            .map(|(n, status)| format!("{n} ({status})"))
            .unwrap_or_else(|| "-".to_owned())
    };
    STEPS
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let ours = trips(OURS).and_then(|c| c.get(i)).map(|(n, _)| *n);
            row([
                "3 round trips",
                &format!("REST calls: {step} (HTTP status)"),
                &show(trips(OURS), i),
                &show(trips(PEER), i),
                "",
                &targets[i].to_string(),
                met(ours.map(|n| n == targets[i])),
            ])
        })
        .collect()
}

/// Part 4, size and start.
fn size_rows(r: &Results) -> Vec<Row> {
    let upload = r.our_bundle.map(|b| Size {
        raw: b.raw + r.wasm.raw,
        gzip: b.gzip + r.wasm.gzip,
    });
    let show = |s: Option<Size>| {
        s.map(|s| format!("{} / {}", kb(s.raw), kb(s.gzip)))
            .unwrap_or_else(|| "-".to_owned())
    };
    vec![
        row([
            "4 size",
            "wasm raw / gzip -9, KB",
            &format!("{} / {}", kb(r.wasm.raw), kb(r.wasm.gzip)),
            "- (plain JS)",
            "",
            "gzip <= 250",
            met((r.wasm.raw > 0).then_some(r.wasm.gzip <= 250 * 1024)),
        ]),
        row([
            "4 size",
            "worker as wrangler bundles it (+ wasm), raw / gzip -9, KB",
            &show(upload),
            &show(r.peer_bundle),
            &match (upload, r.peer_bundle) {
                (Some(o), Some(p)) => ratio(o.gzip as f64, p.gzip as f64),
                _ => "-".to_owned(),
            },
            "",
            "",
        ]),
        row([
            "4 start",
            "instantiate the wasm in workerd, ms",
            &if r.instantiate_ms.is_nan() {
                "-".to_owned()
            } else {
                format!("{:.3}", r.instantiate_ms)
            },
            "- (no wasm)",
            "",
            "",
            "",
        ]),
    ]
}

/// Part 5, the hot client's admissions over its limit.
fn exactness_rows(r: &Results) -> Vec<Row> {
    let exactness = |label: &str| -> (Vec<f64>, String) {
        let runs = runs(r, label);
        let ratios = runs
            .iter()
            .map(|x| x.hot_admitted as f64 / r.hot_limit as f64)
            .collect();
        let each: Vec<String> = runs
            .iter()
            .map(|x| format!("{}/{}", x.hot_admitted, r.hot_limit))
            .collect();
        (ratios, each.join(", "))
    };
    let (o, o_each) = exactness(OURS);
    let (p, p_each) = exactness(PEER);
    let exact = !o.is_empty() && o.iter().all(|x| (*x - 1.0).abs() < 1e-9);
    vec![row([
        "5 exactness",
        "hot client: admitted / configured, per round",
        &format!("{:.3} ({o_each})", median(&o)),
        &format!("{:.3} ({p_each})", median(&p)),
        "",
        "1.000",
        met((!o.is_empty()).then_some(exact)),
    ])]
}

/// A situation's added latency, `p50 / p99` ms.
fn added(s: &Situation) -> String {
    format!("{:.1} / {:.1}", s.added_ms(50.0), s.added_ms(99.0))
}

/// Two situations' added latencies as ratios, `p50 / p99`.
fn added_ratios(ours: &Situation, other: &Situation) -> String {
    format!(
        "{} / {}",
        ratio(ours.added_ms(50.0), other.added_ms(50.0)),
        ratio(ours.added_ms(99.0), other.added_ms(99.0))
    )
}

/// Part 6, latency and calls with Redis 40 ms away.
fn far_rows(r: &Results) -> Vec<Row> {
    let far_of = |label: &str| r.far.iter().find(|(l, _)| *l == label).map(|(_, s)| s);
    let targets = [1.0, 1.0, 0.0];
    let latency = |s: Option<&Situation>| s.map_or("-".to_owned(), added);
    let calls = |s: Option<&Situation>| {
        s.map_or("-".to_owned(), |s| {
            let statuses: Vec<String> = s
                .statuses
                .iter()
                .map(|(status, n)| format!("{n} x {status}"))
                .collect();
            format!("{:.2} ({})", s.calls_per_decision(), statuses.join(", "))
        })
    };
    let mut rows = Vec::new();
    for (i, situation) in far::SITUATIONS.iter().enumerate() {
        let (o, p) = (
            far_of(OURS_FAR).and_then(|s| s.get(i)),
            far_of(PEER_FAR).and_then(|s| s.get(i)),
        );
        let ratios = match (o, p) {
            (Some(o), Some(p)) => added_ratios(o, p),
            _ => "-".to_owned(),
        };
        rows.push(row([
            "6 Redis 40 ms away",
            &format!("{situation}: added latency p50 / p99, ms"),
            &latency(o),
            &latency(p),
            &ratios,
            "",
            "",
        ]));
        rows.push(row([
            "6 Redis 40 ms away",
            &format!("{situation}: REST calls per decision (answers)"),
            &calls(o),
            &calls(p),
            "",
            &format!("{}", targets[i]),
            met(o.map(|s| s.calls_per_decision() == targets[i])),
        ]));
    }
    rows.extend(far_baseline_rows(
        far_of(OURS_FAR),
        far_of(OURS_FAR_BASELINE),
    ));
    rows
}

/// Part 6's situations, this build's added latency against the
/// `--baseline` build's; a lone allowed request may add 1 ms at most.
fn far_baseline_rows(ours: Option<&Vec<Situation>>, base: Option<&Vec<Situation>>) -> Vec<Row> {
    let (Some(ours), Some(base)) = (ours, base) else {
        return vec![];
    };
    let mut rows = Vec::new();
    for (i, (o, b)) in ours.iter().zip(base).enumerate() {
        let (target, ok) = match i {
            0 => (
                "ours' p50 <= the other's + 1 ms",
                Some(o.added_ms(50.0) <= b.added_ms(50.0) + 1.0),
            ),
            _ => ("", None),
        };
        rows.push(row([
            "6 Redis 40 ms away, this build vs --baseline (peer column)",
            &format!("{}: added latency p50 / p99, ms", far::SITUATIONS[i]),
            &added(o),
            &added(b),
            &added_ratios(o, b),
            target,
            if target.is_empty() { "" } else { met(ok) },
        ]));
    }
    rows
}

/// Part 6's page loads: each of ours against the peer's, REST calls per
/// page (target: at most 2) and the added latency of its requests.
fn page_rows(r: &Results) -> Vec<Row> {
    let page_of = |label: &str| r.far_page.iter().find(|(l, _)| *l == label).map(|(_, s)| s);
    let Some(peer) = page_of("peer") else {
        return vec![];
    };
    let pages = f64::from(r.far_pages.max(1));
    let calls = |s: &Situation| {
        let statuses: Vec<String> = s
            .statuses
            .iter()
            .map(|(status, n)| format!("{n} x {status}"))
            .collect();
        format!("{:.1} ({})", s.calls as f64 / pages, statuses.join(", "))
    };
    let part = "6 Redis 40 ms away, page load";
    let mut rows = Vec::new();
    for (label, _) in far::PAGE_LOADS.iter().filter(|(l, _)| *l != "peer") {
        let Some(ours) = page_of(label) else { continue };
        let what = format!(
            "{} requests of a fresh client at once, ours ({label})",
            far::PAGE
        );
        rows.push(row([
            part,
            &format!("{what}: REST calls per page (answers)"),
            &calls(ours),
            &calls(peer),
            &ratio(ours.calls as f64, peer.calls as f64),
            "ours <= 2",
            met(Some(ours.calls as f64 / pages <= 2.0)),
        ]));
        rows.push(row([
            part,
            &format!("{what}: added latency p50 / p99, ms"),
            &added(ours),
            &added(peer),
            &added_ratios(ours, peer),
            "",
            "",
        ]));
    }
    rows
}

/// A hot key's rows, ours against the peer: REST calls per allowed
/// request, added latency, CPU, and what went over at the origin. `far`:
/// with Redis 40 ms away, where the target is on the added p50.
fn hot_rows(runs: &[(&'static str, Vec<Steady>)], part: &str, far: bool) -> Vec<Row> {
    let [Some(ours), Some(peer)] = [0, 1].map(|i| runs.get(i).map(|(_, s)| s.as_slice())) else {
        return vec![];
    };
    let each = |runs: &[Steady], f: fn(&Steady) -> f64| runs.iter().map(f).collect::<Vec<_>>();
    let figures = |f: fn(&Steady) -> f64, digits| {
        let (o, p) = (each(ours, f), each(peer, f));
        (
            with_spread(&o, digits),
            with_spread(&p, digits),
            median(&o),
            median(&p),
        )
    };
    let mut rows = vec![];
    let what = format!(
        "one key at {} a second, 70 % of its limit; ours leases {} units for {} ms",
        hot::SEND_RPS,
        hot::LEASE.0,
        hot::LEASE.1
    );
    let (o, p, om, pm) = figures(Steady::calls_per_allowed, 3);
    let target = (!far).then_some(0.10);
    rows.push(row([
        part,
        &format!("{what}: REST calls per allowed request"),
        &o,
        &p,
        &ratio(om, pm),
        &target.map_or(String::new(), |t| format!("ours <= {t:.2}")),
        met(target.map(|t| om <= t)),
    ]));
    let (o50, p50, om50, pm50) = figures(|s| s.added_ms(50.0), 2);
    let (o99, p99, _, _) = figures(|s| s.added_ms(99.0), 2);
    let (target, ok) = match far {
        true => ("ours' p50 <= 2 ms".to_owned(), om50 <= 2.0),
        false => ("p50 <= 0.5".to_owned(), om50 <= 0.5 * pm50),
    };
    rows.push(row([
        part,
        "added latency over the passthrough, p50 / p99, ms",
        &format!("{o50} / {o99}"),
        &format!("{p50} / {p99}"),
        &ratio(om50, pm50),
        &target,
        met(Some(ok)),
    ]));
    if !far {
        let (o, p, om, pm) = figures(Steady::cpu_ms, 3);
        rows.push(row([
            part,
            "workerd CPU per request over the passthrough, ms",
            &o,
            &p,
            &ratio(om, pm),
            "<= 0.8",
            met(Some(om <= 0.8 * pm)),
        ]));
    }
    let over = |runs: &[Steady]| runs.iter().map(|s| s.over).max().unwrap_or(0);
    rows.push(row([
        part,
        "over the limit at the origin, worst interval of any round",
        &over(ours).to_string(),
        &over(peer).to_string(),
        "",
        "ours 0",
        met(Some(over(ours) == 0)),
    ]));
    rows
}

/// Part 10: one limit across two regions, ours and the peer's.
fn regions_rows(g: Option<&crate::regions::Regions>) -> Vec<Row> {
    let Some(g) = g else {
        return vec![];
    };
    let part = "10 regions";
    let (o, p) = (&g.ours, &g.peer);
    let added = |s: &crate::regions::Steady| {
        format!(
            "{:.1} (a worker's near call {:.1}; bare round trip {:.1})",
            s.added_p50_ms, s.worker_rtt_ms, s.near_rtt_ms
        )
    };
    // What regions add: ours on the shared rule against ours deciding the
    // same request in eu's Redis alone, measured in the same run.
    let floor = o.plain.as_ref().map(|s| s.added_p50_ms);
    let near_target = |s: &crate::regions::Steady| floor.map(|f| s.added_p50_ms <= f + 2.0);
    let mut rows = vec![
        row([
            part,
            "a steady client in the far region: latency added at p50, ms",
            &added(&o.steady),
            &added(&p.steady),
            "",
            "<= ours without `regions` + 2",
            met(near_target(&o.steady)),
        ]),
        row([
            part,
            "its far REST calls per allowed request; near REST requests per request",
            &format!(
                "{:.3}; {:.2}",
                o.steady.far_per_allowed, o.steady.near_per_request
            ),
            &format!(
                "{:.3}; {:.2}",
                p.steady.far_per_allowed, p.steady.near_per_request
            ),
            "",
            "<= 0.1",
            met(Some(o.steady.far_per_allowed <= 0.1)),
        ]),
    ];
    if let Some(plain) = &o.plain {
        rows.push(row([
            part,
            "the same, ours on a rule without `regions` (one decision in eu's own Redis, no region in it): latency added at p50, ms",
            &added(plain),
            "-",
            "",
            "",
            "",
        ]));
    }
    if let Some(l) = &o.leased {
        let label = format!(
            "the same, ours with `lease = {}`, `lease_for = \"{}\"`: latency added at p50, ms; far calls per allowed request; near REST requests per request",
            crate::regions::LEASE,
            crate::regions::LEASE_FOR
        );
        let figures = format!(
            "{}; {:.3}; {:.2}",
            added(l),
            l.far_per_allowed,
            l.near_per_request
        );
        rows.push(row([
            part,
            &label,
            &figures,
            "-",
            "",
            "<= ours without `regions` + 2; <= 0.1",
            met(near_target(l).map(|near| near && l.far_per_allowed <= 0.1)),
        ]));
    }
    rows.extend([
        row([
            part,
            &format!(
                "a fresh client's page load ({} at once): near REST requests (the commands they carried) + far REST requests",
                crate::regions::PAGE
            ),
            &format!("{} ({}) + {}", o.page_near, o.page_commands, o.page_far),
            &format!("{} ({}) + {}", p.page_near, p.page_commands, p.page_far),
            "",
            "one near call a request, none far",
            met(Some(o.page_commands == crate::regions::PAGE as u64 && o.page_far == 0)),
        ]),
        row([
            part,
            "one client at both regions at once: over the limit at the origin (admitted; unanswered)",
            &format!("{} ({}; {})", o.both_over, o.both_admitted, o.both_lost),
            &format!("{} ({}; {})", p.both_over, p.both_admitted, p.both_lost),
            "",
            "0",
            met(Some(o.both_over == 0)),
        ]),
    ]);
    rows
}

/// Part 9: REST requests per request under an in-flight rule, and what
/// the origin held at once of a client sending more than its limit.
fn in_flight_rows(f: Option<&InFlight>) -> Vec<Row> {
    let Some(f) = f else {
        return vec![];
    };
    let part = "9 in flight";
    vec![
        row([
            part,
            &format!(
                "REST requests per request, decisions and releases, {} clients at once ({} requests)",
                in_flight::CLIENTS,
                f.requests
            ),
            &format!("{:.2}", f.per_request()),
            "- (no in-flight limit)",
            "",
            "<= 1.5",
            met(Some(f.per_request() <= 1.5)),
        ]),
        row([
            part,
            &format!(
                "a client's {} requests at once under a limit of {}: over the limit at the origin, most held at once",
                f.crowd,
                in_flight::LIMIT
            ),
            &format!(
                "{} (held {})",
                f.most_held.saturating_sub(in_flight::LIMIT),
                f.most_held
            ),
            "-",
            "",
            "0",
            met(Some(f.most_held <= in_flight::LIMIT)),
        ]),
    ]
}

/// Part 9, the wait: the CPU of a delayed request against an admitted
/// one's, and what the origin saw early of a client over the wait.
fn delayed_rows(d: Option<&Delayed>) -> Vec<Row> {
    let Some(d) = d else {
        return vec![];
    };
    let part = "9 delay";
    vec![
        row([
            part,
            &format!(
                "workerd CPU of a delayed request against an admitted one, ms ({} of {} pairs waited)",
                d.waited,
                delayed::BATCH
            ),
            &format!("{:.3} / {:.3}", d.delayed_cpu_ms, d.admitted_cpu_ms),
            "- (`blockUntilReady` waits in the client)",
            &format!("{:.2}", d.ratio()),
            "",
            "",
        ]),
        row([
            part,
            &format!(
                "a client's {} requests at once, one per {} ms: arrivals early at the origin by more than {} ms (admitted; ms apart on average, and their spread around that pace)",
                delayed::CROWD,
                delayed::INTERVAL_MS,
                delayed::SLACK_MS
            ),
            &format!(
                "{} ({}; {:.1}, {:.0})",
                d.early, d.crowd_admitted, d.pace_ms, d.spread_ms
            ),
            "-",
            "",
            "0",
            met(Some(d.early == 0)),
        ]),
    ]
}

/// Two of our workers on one Redis, one key above its limit.
fn shared_rows(r: &Results) -> Vec<Row> {
    let Some(s) = &r.shared else {
        return vec![];
    };
    let part = "7 two workers, one key";
    let share = s.admitted as f64 / s.allowed.max(1) as f64;
    vec![
        row([
            part,
            &format!(
                "sent {} above the limit ({} a second); over the exact bound at the origin, worst interval",
                s.sent,
                hot::SHARED.0
            ),
            &s.over.to_string(),
            "-",
            "",
            "0",
            met(Some(s.over == 0)),
        ]),
        row([
            part,
            "admitted, of what the limit allows over the run",
            &format!("{} of {} ({share:.2})", s.admitted, s.allowed),
            "-",
            "",
            ">= 0.90",
            met(Some(share >= 0.9)),
        ]),
    ]
}

/// Part 8: each hostile shape's CPU in the worker's own workerd against an
/// ordinary request's just before it, the worst of them, and whether the
/// isolate lived through them.
fn hostile_rows(h: &Hostile) -> Vec<Row> {
    let Some(settings) = h.settings else {
        return vec![];
    };
    let part = "8 hostile";
    let target = format!("<= {MOST_TIMES_ORDINARY:.2}");
    let mut worst: Option<(f64, &str)> = None;
    let mut rows = Vec::new();
    for f in &h.shapes {
        let times = median(&f.times_beyond_carrying());
        if worst.is_none_or(|(w, _)| times > w) {
            worst = Some((times, &f.name));
        }
        let statuses: Vec<String> = f.statuses.iter().map(u16::to_string).collect();
        rows.push(row([
            part,
            &format!(
                "{} ({} bytes, answered {}): workerd CPU per request, ms, vs an ordinary request's (peer column): {:.2} times it; the passthrough's {:.2} vs {:.2}",
                f.name,
                f.size,
                statuses.join("/"),
                median(&f.times()),
                median(&f.passthrough),
                median(&f.passthrough_ordinary),
            ),
            &with_spread(&f.ours, 2),
            &with_spread(&f.ordinary, 2),
            &format!("{times:.2}"),
            &target,
            met((!times.is_nan()).then_some(times <= MOST_TIMES_ORDINARY)),
        ]));
    }
    if let Some((times, name)) = worst {
        rows.push(row([
            part,
            &format!(
                "the worst of {} shapes ({name}), {} requests each a round: times an ordinary request's CPU, beyond carrying it",
                h.shapes.len(),
                settings.batch
            ),
            &format!("{times:.2}"),
            "-",
            "",
            &target,
            met(Some(times <= MOST_TIMES_ORDINARY)),
        ]));
    }
    let (calls, status) = h.sentinel;
    rows.push(row([
        part,
        "REST calls for a denial the isolate cached before the part, asked again after it (0: its memory lived through the part) (HTTP status)",
        &format!("{calls} ({status})"),
        "-",
        "",
        "0 (429)",
        met(Some(calls == 0 && status == 429)),
    ]));
    rows
}

/// Part 2's overhead rows of ours against another worker (the peer, or
/// another build of ours), with the targets or without.
fn overhead_rows(r: &Results, c: Compared, part: &str, targets: bool) -> Vec<Row> {
    let target = |text: &str, ok: Option<bool>| {
        if targets {
            [text.to_owned(), met(ok).to_owned()]
        } else {
            [String::new(), String::new()]
        }
    };
    let mut rows = latency_overhead_rows(r, c, part, &target);
    rows.extend(cpu_overhead_rows(r, c, part, &target));
    rows
}

/// A target's two cells, text and verdict, or two empty ones.
type Target<'a> = dyn Fn(&str, Option<bool>) -> [String; 2] + 'a;

/// p50 and pooled p99 overhead over the passthrough, ours against the other.
fn latency_overhead_rows(r: &Results, c: Compared, part: &str, target: &Target) -> Vec<Row> {
    // p50: each round compares the workers under the same load on the
    // machine, so how often ours wins says whether a gap between medians is
    // more than the spread between rounds.
    let (o, p) = (
        overhead(r, c.passthrough, c.ours, p50),
        overhead(r, c.passthrough, c.other, p50),
    );
    let rounds = o.len().min(p.len());
    let wins = o
        .iter()
        .zip(&p)
        .filter(|(ours, theirs)| ours <= theirs)
        .count();
    let mut rows = vec![[
        part.to_owned(),
        "overhead over passthrough, p50 ms".to_owned(),
        with_spread(&o, 1),
        with_spread(&p, 1),
        ratio(median(&o), median(&p)),
        String::new(),
        String::new(),
    ]];
    let [t, m] = target(
        "4 of 5 (80 %)",
        (rounds > 0).then_some(wins * 5 >= rounds * 4),
    );
    rows.push([
        part.to_owned(),
        "rounds in which our p50 overhead <= the other's".to_owned(),
        format!("{wins} of {rounds}"),
        String::new(),
        String::new(),
        t,
        m,
    ]);
    // p99: every request of every round pooled per worker, so one slow
    // moment weighs as the few requests it slowed.
    let pooled = |label: &str| pooled_percentile(runs(r, label), 99.0);
    let ((o99, on), (p99, pn), (b99, _)) = (pooled(c.ours), pooled(c.other), pooled(c.passthrough));
    let (o, p) = (o99 - b99, p99 - b99);
    let [t, m] = target(
        "ours/peer <= 1.00, >= 10 000 requests each",
        (!o.is_nan() && !p.is_nan()).then_some(o <= p && on.min(pn) >= 10_000),
    );
    rows.push([
        part.to_owned(),
        format!("overhead over passthrough, p99 ms, every round pooled (passthrough {b99:.1}; {on} / {pn} requests)"),
        format!("{o:.1}"),
        format!("{p:.1}"),
        ratio(o, p),
        t,
        m,
    ]);
    rows
}

/// CPU per request over the passthrough, by process, ours against the other.
fn cpu_overhead_rows(r: &Results, c: Compared, part: &str, target: &Target) -> Vec<Row> {
    let workerd = |x: &Run| x.per_request(x.cpu.workerd);
    let own = |x: &Run| x.per_request(x.cpu.worker_process);
    let wrangler = |x: &Run| x.per_request(x.cpu.wrangler);
    let backend = |x: &Run| x.per_request(x.cpu.endpoint + x.cpu.redis);
    let mut rows = Vec::new();
    // The last field: whether the row is of wrangler's processes.
    for (what, pick, has_target, of_wrangler) in [
        (
            "CPU per request in workerd over passthrough, ms",
            workerd as fn(&Run) -> f64,
            true,
            false,
        ),
        (
            "of which in the workerd that runs the worker (the other is wrangler's proxy), ms",
            own,
            false,
            true,
        ),
        (
            "CPU per request in wrangler (node) over passthrough, ms",
            wrangler,
            false,
            true,
        ),
        (
            "CPU per request in REST endpoint + Redis, ms",
            backend,
            false,
            false,
        ),
    ] {
        if of_wrangler && !c.wrangler {
            continue;
        }
        let (o, p) = (
            overhead(r, c.passthrough, c.ours, pick),
            overhead(r, c.passthrough, c.other, pick),
        );
        let base = median(&runs(r, c.passthrough).iter().map(pick).collect::<Vec<_>>());
        let (mo, mp) = (median(&o), median(&p));
        let [t, m] = if has_target {
            target(
                "ours <= peer",
                (!o.is_empty() && !p.is_empty()).then_some(mo <= mp),
            )
        } else {
            [String::new(), String::new()]
        };
        rows.push([
            part.to_owned(),
            format!("{what} (passthrough {base:.2})"),
            with_spread(&o, 2),
            with_spread(&p, 2),
            ratio(mo, mp),
            t,
            m,
        ]);
    }
    rows
}

fn p50(x: &Run) -> f64 {
    x.p50_ms
}

/// How each part was measured, then every round's figures.
fn notes(r: &Results) -> String {
    let mut out = near_parts_measured(r);
    out.push_str(&far_parts_measured(r));
    out.push_str(&every_round(r));
    out
}

/// How parts 1 to 5 were measured.
fn near_parts_measured(r: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "How each part was measured:\n");
    let _ = writeln!(
        out,
        "1. `redis-benchmark -c {} -n {}` of `EVALSHA` per script and round, straight at redis-server (every script loaded with `SCRIPT LOAD`, ours without its `allow-key-locking` flag, which stock Redis lacks){}; one hot key, every call admitted; us/call is `usec_per_call` of `cmdstat_evalsha` after `CONFIG RESETSTAT`. Ours keeps Redis's time: GCRA in its key's expiry (`PTTL`, no clock read; 1000 per second, a whole millisecond per unit, as most rates are; a fractional interval adds a `GET`), windowed in its hash's fields and `PTTL` (one window in the same bucket as the last admission: `PTTL`, `HGET`, `HINCRBY`); a rule alone is sent as its own arguments, its word naming the operation, and replies with one integer where it can. The peer gets `now` from its caller. Windows: 1 min at 1 s; three windows 1 s at 20 ms (1/60 s is no whole ms), 1 min at 1 s, 1 h at 1 min. The peer's three-window figure is three of its sliding-window calls (it needs one call per window), before the two extra round trips. The floors are scripts with no logic at all, in the same rounds: a read and a write of one key (`GET` + `SET`), the same after reading Redis's clock, and GCRA's own (`PTTL` + `SET PX`), which its target is a ratio to. Each round runs the scripts in a shuffled order of its own, each run after a full collection of the Lua heap the scripts share; a ratio is the median over rounds of each round's.",
        r.redis_clients,
        r.redis_calls,
        if r.pinned {
            ", redis-server on a core of its own and redis-benchmark on the others (`taskset`)"
        } else {
            ", redis-server and redis-benchmark wherever the scheduler put them (`taskset` unavailable, or one core)"
        }
    );
    let _ = writeln!(
        out,
        "2. `wrk -t1 -c{}` for {} s per worker and round, in {} runs each, the workers taking turns run by run so that a slow moment of the shared machine falls on every worker of the round alike (a round's figures are its runs' pooled), through `wrangler dev` (same workerd, REST endpoint, Redis and demo origin; wrangler's debug log file, which takes every inspector event whatever the log level, goes to `/dev/null`). Every worker has a `wrangler dev` of its own, ours where no rule applies too: workerd's memory grows with each request it serves there, and its tail with it, so no worker runs on another's history. Policy: {} requests per client per day, sliding (ours: windowed 1 d at 24 min; peer: `slidingWindow({}, \"1 d\")`, ephemeral cache on). Every request comes from a new client, but one in {} from one hot client. Overhead is each round's figure minus the passthrough's in the same round, except the p99 row: there the requests of every round are pooled per worker (from wrk's latencies at 127 percentiles per run, finest above p98), and the pooled p99 minus the passthrough's is the overhead, so that one slow moment counts as the few requests it slowed. CPU is each process group's user + system time over the run (`/proc`), per request; of `wrangler dev`'s two workerd processes, the one started with an inspector runs the worker, the other is wrangler's proxy in front of it. Then the passthrough, ours and the peer once more as production runs a worker, each in a `workerd serve` of its own (no wrangler, no inspector, no proxy in front), bundled by `wrangler deploy --dry-run` from the same `wrangler.toml` (its vars as text and JSON bindings, the same compatibility date): the same load and rounds, interleaved, the rows \"2 bare workerd\", CPU that one workerd's; each of these workerds' V8 writes a line per collection (`--trace-gc-nvp`), from which the scavenge rows are read.",
        r.load_connections, r.load_seconds, r.load_slices, r.hot_limit, r.hot_limit, r.hot_every
    );
    let _ = writeln!(
        out,
        "3. The REST endpoint's request counter (`GET /__stats`) around single requests to a `/rt` rule of 1 per client per day: fresh client, again (denied by Redis), again (a block cache may answer), then `SCRIPT FLUSH` and a fresh client; then, ours only, a login under a `count_status = [401]` rule answered 401 (its charge kept: the decision only) and one answered 200 (its charge given back: the decision and the refund, after the response). Each count waits 300 ms after the answer, so `waitUntil` calls count."
    );
    let _ = writeln!(
        out,
        "4. `build/index_bg.wasm` as `scripts/build-worker` built it; instantiation is `new WebAssembly.Instance` with stub imports inside workerd (`bench/workers/instantiate.mjs`), median of rounds of many. Bundles are what `wrangler dev` serves, unminified."
    );
    let _ = writeln!(
        out,
        "5. During part 2: requests of the hot client that reached the origin, over its configured limit."
    );
    out
}

/// How parts 6 to 8 were measured.
fn far_parts_measured(r: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "6. Each worker again, its REST endpoint behind a proxy that holds every call {} ms (`edge_limiter_local::fault_proxy`, `Fault::Delay`): {} fresh clients, one request at a time through a `/rt` rule of 1 per client per day, each client three times (allowed, denied by Redis, denied again); every worker request follows a passthrough request from the same client, and the added latency is the worker's percentile minus the passthrough's. REST calls are the requests the proxy saw during each situation (after answers, so `waitUntil` calls count), per request. With `--baseline`, that build is measured the same way after ours and the peer.",
        far::DELAY.as_millis(),
        r.far_clients
    );
    let _ = writeln!(
        out,
        "6 and 7, hot key: one client at {} requests a second (open loop, each request just after a passthrough request) through ours (GCRA {} a second, burst {}, `lease = {}`, `lease_for = \"{}ms\"`) and the peer (`slidingWindow({}, \"1 s\")`), in interleaved rounds after a warm-up, a fresh client each; REST calls counted at a proxy in front of each worker's endpoint (in part 6, the 40 ms one), refreshes after answers included; CPU is each workerd's over the round minus the passthrough's, per request. What reached the origin is checked from its own arrival times: at most burst + rate x (t_j - t_i + 5 ms) in any [t_i, t_j]. 7, two workers: two of ours on one Redis, each sending one key at {} a second for 10 s under GCRA {} a second (burst the same, `lease = {}`, `lease_for = \"{}ms\"`), checked the same way, and admitted against burst + rate x the run's length.",
        hot::SEND_RPS,
        hot::RATE,
        hot::RATE,
        hot::LEASE.0,
        hot::LEASE.1,
        hot::RATE,
        hot::SEND_RPS,
        hot::SHARED.0,
        hot::SHARED.1 .0,
        hot::SHARED.1 .1
    );
    if !r.far_page.is_empty() {
        let _ = writeln!(
            out,
            "6, page load: {} pages per worker, each {} requests of a fresh client (its own API key, and for the peer its own /64) sent at once, just after as many at once through the passthrough; ours under GCRA {} a second (burst the same) with the hot key's lease and without one, the peer under `slidingWindow({}, \"1 s\")`; REST calls counted at the 40 ms proxy per page, `waitUntil` calls included; the added latency is each request's percentile minus the passthrough's.",
            r.far_pages,
            far::PAGE,
            hot::RATE,
            hot::RATE
        );
    }
    if r.in_flight.is_some() {
        let _ = writeln!(
            out,
            "9. Ours alone (the peer has no in-flight limit) under `algorithm = \"concurrency\"`, limit {}, its REST endpoint behind a proxy that counts REST requests; every answer's body comes from the demo origin 20 ms after its headers (500 ms for the crowd below, so that its admitted requests overlap there). First {} clients at once, each sending its requests one after another, every one admitted: the REST requests they took, the releases after the responses included, per request (after a warm-up request per client). Then one client sending four times its limit at once: the most of its requests the demo origin, counting for itself, held at once. The same worker holds a GCRA rule of one request per {} ms, burst 1, `on_limit = \"delay\"` with `max_delay = 1s`: {} fresh clients each send one request (admitted at once), {} others each two at once (one of them waits about an interval); the delayed request's CPU is a pair's user + system time of the worker's own workerd less a single request's. Then one client sends {} at once: the demo origin's arrival times, by its own clock, held to the rule by GCRA's virtual scheduling, an arrival counting as early past {} ms of slack.",
            in_flight::LIMIT,
            in_flight::CLIENTS,
            delayed::INTERVAL_MS,
            delayed::BATCH,
            delayed::BATCH,
            delayed::CROWD,
            delayed::SLACK_MS
        );
    }
    if let Some(g) = &r.regions {
        let _ = writeln!(
            out,
            "10. Two regions, each a redis-server and REST endpoint of its own, each {} ms from the other region's workers through a delaying proxy; two instances of each worker, one per region. Ours: a GCRA rule of {} a minute, burst {}, `regions = \"shared\"`, `region_share = {}`. The peer: `MultiRegionRatelimit` (@upstash/ratelimit {}) over the same two servers, its near one first, a sliding window of {} per 60 s. After one request of another client at each region (each Redis then holds each side's scripts), a steady client in eu sends {} requests {} ms apart, each in a round with a passthrough request, a request through a worker that makes one REST call to eu's Redis (`bench/workers/near-call.mjs`: the near round trip as a worker pays it, the floor of any limiter that asks its near Redis) and a bare REST round trip to eu's endpoint (near REST requests leave those two out), the four in each of their 24 orders three times; ours again with a fresh client on a second rule, the same but for `lease` (its isolates take units from eu's pool in a spend's own call, and spend them without one), and on a third without `regions`, decided in eu's Redis alone (the steady target is what regions add: the shared rule's figure, leased or not, within 2 ms of this one's; a worker's near call is the floor beside them); a fresh client's page load is {} requests at once; then one client sends {} requests to each region at once, {} times 300 ms apart, and the demo origin's arrival times, by its own clock, are held to the rule by GCRA's virtual scheduling, a request counting as decided up to {} ms before it arrived.",
            crate::regions::FAR.as_millis(),
            crate::regions::RATE_PER_MINUTE,
            crate::regions::BURST,
            crate::regions::SHARE,
            g.peer_version,
            crate::regions::BURST,
            crate::regions::STEADY.0,
            crate::regions::STEADY.1,
            crate::regions::PAGE,
            crate::regions::BOTH.0,
            crate::regions::BOTH.1,
            crate::regions::SLACK_MS
        );
    }
    if let Some(settings) = r.hostile.settings {
        let _ = writeln!(
            out,
            "8. Every shape of `edge_limiter_local::hostile` (the requests `tests/hostile_cost.rs` holds to their allocations), each within what Cloudflare passes to a worker (a 16 KB URL, 128 KB of headers) and what ours reads of a body (64 KB), through ours in a `wrangler dev` of its own under rules that read every part of a request (`hostile::RULES`: methods, costs per method, path patterns, keys on headers, cookies, the query, `Authorization`, `request.cf`, JSON and form fields; limits no shape reaches, so every request is decided in Redis), then through the passthrough. {} rounds in a different order each; in each, {} requests of the shape, {} in flight, each just after as many ordinary requests through the same worker, and as many of it through the passthrough (and of an ordinary request at the start of the round); CPU is the user + system time of the workerd that runs the worker (the one started with an inspector), per request. Each round's ratio is the shape's CPU, less what carrying it cost the passthrough beyond an ordinary request (workerd's own work on a large request, which no worker can spare), over the ordinary batch's; the median over rounds is in the ratio column, and the plain ratio in the measure. Before the part, a client is denied by a rule of 1 a day and its denial cached (`cache_hold = \"1h\"`); after it, that client asks again and the endpoint's counter says whether Redis was asked: a restarted isolate would have lost the cached denial.",
            settings.rounds,
            settings.batch,
            crate::hostile::IN_FLIGHT,
        );
    }
    out
}

/// Every round's figures, folded away.
fn every_round(r: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n<details><summary>Every round</summary>\n");
    for (label, samples) in &r.redis {
        let each: Vec<String> = samples
            .iter()
            .map(|s| format!("{:.2} us, {:.0}/s", s.usec_per_call, s.ops_per_s))
            .collect();
        let _ = writeln!(out, "- {label}: {}", each.join("; "));
    }
    for (label, runs) in &r.load {
        let each: Vec<String> = runs
            .iter()
            .map(|x| {
                format!(
                    "{} requests, {:.0}/s, p50 {:.1} p99 {:.1} ms, hot {} admitted of {} sent, CPU ms/request: workerd {:.2} (own {:.2}), wrangler {:.2}, endpoint {:.2}, Redis {:.2}, origin {:.2}{}",
                    x.requests,
                    x.rps,
                    x.p50_ms,
                    x.p99_ms,
                    x.hot_admitted,
                    x.hot_sent,
                    x.per_request(x.cpu.workerd),
                    x.per_request(x.cpu.worker_process),
                    x.per_request(x.cpu.wrangler),
                    x.per_request(x.cpu.endpoint),
                    x.per_request(x.cpu.redis),
                    x.per_request(x.cpu.origin),
                    if x.socket_errors > 0 {
                        format!(", {} socket errors", x.socket_errors)
                    } else {
                        String::new()
                    }
                )
            })
            .collect();
        let _ = writeln!(out, "- {label}: {}", each.join("; "));
    }
    let _ = writeln!(out, "\n</details>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p50_ms: f64, workerd_s: f64, hot_admitted: u64) -> Run {
        Run {
            requests: 1000,
            rps: 100.0,
            p50_ms,
            p99_ms: 2.0 * p50_ms,
            hot_sent: 120,
            hot_admitted,
            cpu: crate::load::Cpu {
                workerd: workerd_s,
                ..crate::load::Cpu::default()
            },
            // 99 % at the p50, 1 % at four times it.
            quantiles: vec![(99.0, p50_ms), (100.0, 4.0 * p50_ms)],
            ..Run::default()
        }
    }

    /// Results of every part but the far one, with a baseline build.
    fn fixture() -> Results {
        let sample = |usec_per_call| Sample {
            ops_per_s: 40_000.0,
            usec_per_call,
        };
        Results {
            when: "2026-11-22 18:00 UTC".into(),
            peer_version: "2.2.0".into(),
            redis: vec![
                ("ours GCRA", vec![sample(2.0), sample(2.2)]),
                (FLOOR_PTTL_SET, vec![sample(1.5), sample(1.7)]),
                ("peer token bucket", vec![sample(5.0), sample(6.0)]),
                ("ours windowed x1", vec![sample(2.8)]),
                ("peer sliding window", vec![sample(4.0)]),
                ("ours windowed x3", vec![sample(5.0)]),
            ],
            load: vec![
                (PASSTHROUGH, vec![run(8.0, 1.0, 120), run(8.0, 1.0, 120)]),
                (OURS, vec![run(10.0, 2.0, 50), run(12.0, 2.0, 50)]),
                (PEER, vec![run(11.0, 3.0, 50), run(11.0, 3.0, 50)]),
                (
                    BARE_PASSTHROUGH,
                    vec![run(4.0, 0.5, 120), run(4.0, 0.5, 120)],
                ),
                (BARE_OURS, vec![run(5.0, 1.0, 50), run(6.0, 1.0, 50)]),
                (BARE_PEER, vec![run(7.0, 1.5, 50), run(7.0, 1.5, 50)]),
            ],
            scavenges: vec![
                (
                    BARE_OURS,
                    Scavenges {
                        pauses_ms: vec![9.0, 12.0, 10.0],
                        survived_pct: vec![5.0, 6.0, 4.0],
                    },
                ),
                (
                    BARE_PEER,
                    Scavenges {
                        pauses_ms: vec![3.0, 6.0],
                        survived_pct: vec![2.0, 3.0],
                    },
                ),
            ],
            hot_limit: 50,
            trips: vec![(OURS, vec![(1, 200), (1, 429), (1, 429), (2, 200)])],
            wasm: Size {
                raw: 600 * 1024,
                gzip: 240 * 1024,
            },
            instantiate_ms: 0.2,
            hot: vec![
                (OURS_HOT, vec![steady(0.6, 0.05)]),
                (PEER_HOT, vec![steady(2.3, 1.0)]),
            ],
            shared: Some(Shared {
                sent: 1400,
                admitted: 539,
                over: 0,
                allowed: 548,
            }),
            ..Results::default()
        }
    }

    /// A hot-key run adding `added_ms` at every percentile, making
    /// `calls` REST calls per allowed request.
    fn steady(added_ms: f64, calls: f64) -> Steady {
        Steady {
            worker_ms: vec![1.0 + added_ms; 100],
            passthrough_ms: vec![1.0; 100],
            admitted: 100,
            calls: (calls * 100.0) as u64,
            cpu_s: 0.2 + added_ms / 10.0,
            passthrough_cpu_s: 0.2,
            over: 0,
        }
    }

    #[test]
    fn the_report_renders_as_recorded() {
        let mut r = fixture();
        r.load
            .push((OURS_BASELINE, vec![run(9.0, 2.5, 50), run(13.0, 2.5, 50)]));
        r.machine = vec![("machine".into(), "test".into())];
        r.background = vec!["before the run: quiet".into()];
        let recorded = include_str!("../testdata/report.md");
        let rendered = render(&r);
        if std::env::var_os("RECORD_REPORT").is_some() {
            std::fs::write(
                concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/report.md"),
                &rendered,
            )
            .unwrap();
        }
        assert_eq!(rendered, recorded);
    }

    #[test]
    fn the_table_holds_ratios_targets_and_verdicts() {
        let r = fixture();
        let table = render(&r);
        let has = |row: &str| assert!(table.contains(row), "{row} not in\n{table}");
        // Part 7: 0.05 calls per allowed request, 0.6 of 2.3 ms added at p50.
        has("REST calls per allowed request | 0.050 | 1.000 | 0.05 | ours <= 0.10 | yes |");
        has("| 0.60 / 0.60 | 2.30 / 2.30 | 0.26 | p50 <= 0.5 | yes |");
        has("| 539 of 548 (0.98) | - |  | >= 0.90 | yes |");
        // 2.10 / 1.60 = 1.31: just over its target.
        has("| 2.10 (2.00..2.20) | 1.60 (1.50..1.70) | 1.31 | ours/floor <= 1.30 | **no** |");
        has("| GCRA vs token bucket: us/call | 2.10 (2.00..2.20) | 5.50 (5.00..6.00) | 0.38 |  |  |");
        has("| 2.80 | 4.00 | 0.70 | ours/peer <= 1.00 | yes |");
        // Three peer calls against one of ours.
        has("| 5.00 | 12.00 | 0.42 | ours/peer <= 0.60 | yes |");
        has("| overhead over passthrough, p50 ms | 3.0 (2.0..4.0) | 3.0 (3.0..3.0) | 1.00 |");
        has("| rounds in which our p50 overhead <= the other's | 1 of 2 |  |  | 4 of 5 (80 %) | **no** |");
        // 1 % of the requests are slow, so the pooled p99 is the slower
        // round's p50: 12 and 11 against 8.
        has("(passthrough 8.0; 2000 / 2000 requests) | 4.0 | 3.0 | 1.33 |");
        has("| ours/peer <= 1.00, >= 10 000 requests each | **no** |");
        // workerd: 1 ms over passthrough per request against 2.
        has("| 1.00 (1.00..1.00) | 2.00 (2.00..2.00) | 0.50 | ours <= peer | yes |");
        // In bare workerd: no targets, and no rows of wrangler's processes.
        has("| 2 bare workerd | overhead over passthrough, p50 ms | 1.5 (1.0..2.0) | 3.0 (3.0..3.0) | 0.50 |  |  |");
        has("| 2 bare workerd | CPU per request in workerd over passthrough, ms (passthrough 0.50) | 0.50 (0.50..0.50) | 1.00 (1.00..1.00) | 0.50 |  |  |");
        has("| 2 bare workerd | V8 young-generation collections (scavenges) over every round: pause p50 / p99, ms | 10.0 / 12.0 (3 scavenges) | 3.0 / 6.0 (2 scavenges) | 3.33 |  |  |");
        has("| 2 bare workerd | share of the young generation a scavenge kept, median % | 5.0 | 2.5 | 2.00 |  |  |");
        assert!(!table.contains("| 2 bare workerd | CPU per request in wrangler"));
        has("denied again (cacheable) (HTTP status) | 1 (429) | - |  | 0 | **no** |");
        has("| 600.0 / 240.0 |");
        has("| 1.000 (50/50, 50/50) |");
    }

    #[test]
    fn a_lone_allowed_request_may_add_a_millisecond_over_the_baseline() {
        let situation = |worker_ms: f64| Situation {
            worker_ms: vec![worker_ms; 3],
            passthrough_ms: vec![5.0; 3],
            calls: 3,
            statuses: vec![(200, 3)],
        };
        let of = |ms: [f64; 3]| ms.map(situation).to_vec();
        let base = of([50.0, 48.0, 3.0]);
        let rows = far_baseline_rows(Some(&of([50.9, 60.0, 9.0])), Some(&base));
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[0][2..],
            [
                "45.9 / 45.9",
                "45.0 / 45.0",
                "1.02 / 1.02",
                "ours' p50 <= the other's + 1 ms",
                "yes"
            ]
        );
        assert_eq!(
            rows[1][5..],
            ["", ""],
            "only the allowed request has a target"
        );
        let slower = far_baseline_rows(Some(&of([51.2, 48.0, 3.0])), Some(&base));
        assert_eq!(slower[0][6], "**no**");
        assert!(far_baseline_rows(Some(&base), None).is_empty());
    }
}
