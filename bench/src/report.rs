//! The one table, as Markdown: printed, and saved with the date and machine.
//! Targets are reported as met or not; nothing here fails on a timing.

use std::fmt::Write as _;

use crate::{
    load::Run,
    redis_side::{Sample, FLOOR_CLOCK_RW, FLOOR_RW, GCRA_FRACTIONAL},
    size::Size,
    stats::{median, spread},
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
    pub load_connections: u32,
    pub load_seconds: u32,
    pub hot_every: u32,
    /// The hot client's configured limit for the run.
    pub hot_limit: u64,
    /// Part 3: per worker label.
    pub trips: Vec<(&'static str, Counts)>,
    /// Part 4.
    pub wasm: Size,
    pub our_bundle: Option<Size>,
    pub peer_bundle: Option<Size>,
    pub instantiate_ms: f64,
    pub peer_version: String,
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

/// Per-round overhead of `label` over the passthrough: each round's figure
/// minus the passthrough's in the same round, so a busy round hits both.
fn overhead(r: &Results, label: &str, pick: fn(&Run) -> f64) -> Vec<f64> {
    runs(r, label)
        .iter()
        .zip(runs(r, PASSTHROUGH))
        .map(|(x, base)| pick(x) - pick(base))
        .collect()
}

pub const PASSTHROUGH: &str = "passthrough";
pub const OURS: &str = "ours";
pub const PEER: &str = "peer";
/// Our worker on a path no rule covers: wasm, configuration and forwarding,
/// without the Redis call.
pub const OURS_UNMATCHED: &str = "ours-unmatched";

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
    let mut row = |cells: [&str; 7]| {
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    };

    // Part 1.
    let pairs = [
        (
            "ours GCRA",
            "peer token bucket",
            "GCRA vs token bucket",
            2.5,
        ),
        (
            "ours windowed x1",
            "peer sliding window",
            "windowed, 1 window vs sliding window",
            2.6,
        ),
    ];
    for (ours, theirs, what, target) in pairs {
        let (u, p) = (usec(r, ours), usec(r, theirs));
        row([
            "1 Redis",
            &format!("{what}: us/call"),
            &with_spread(&u, 2),
            &with_spread(&p, 2),
            &ratio(median(&u), median(&p)),
            &format!("ours <= {target}"),
            met((!u.is_empty()).then(|| median(&u) <= target)),
        ]);
        let (o, q) = (ops(r, ours), ops(r, theirs));
        row([
            "1 Redis",
            &format!("{what}: calls/s"),
            &with_spread(&o, 0),
            &with_spread(&q, 0),
            &ratio(median(&o), median(&q)),
            "",
            "",
        ]);
    }
    let three = usec(r, "ours windowed x3");
    let sliding = usec(r, "peer sliding window");
    let thrice: Vec<f64> = sliding.iter().map(|u| 3.0 * u).collect();
    row([
        "1 Redis",
        "1 s + 1 min + 1 h windows: us/decision (ours 1 call, peer 3 calls)",
        &with_spread(&three, 2),
        &with_spread(&thrice, 2),
        &ratio(median(&three), median(&thrice)),
        "ours <= 6",
        met((!three.is_empty()).then(|| median(&three) <= 6.0)),
    ]);
    let o3 = ops(r, "ours windowed x3");
    row([
        "1 Redis",
        "1 s + 1 min + 1 h windows: decisions/s",
        &with_spread(&o3, 0),
        &with_spread(
            &ops(r, "peer sliding window")
                .iter()
                .map(|x| x / 3.0)
                .collect::<Vec<_>>(),
            0,
        ),
        &ratio(median(&o3), median(&ops(r, "peer sliding window")) / 3.0),
        "",
        "",
    ]);

    for (label, what) in [
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
    ] {
        row([
            "1 Redis",
            what,
            &with_spread(&usec(r, label), 2),
            "-",
            "",
            "",
            "",
        ]);
    }

    // Part 2.
    let base = runs(r, PASSTHROUGH);
    let base_rps = median(&base.iter().map(|x| x.rps).collect::<Vec<_>>());
    let base_p50 = median(&base.iter().map(|x| x.p50_ms).collect::<Vec<_>>());
    let base_p99 = median(&base.iter().map(|x| x.p99_ms).collect::<Vec<_>>());
    let metric = |label: &str, pick: fn(&Run) -> f64| -> Vec<f64> {
        runs(r, label).iter().map(pick).collect()
    };
    let rps = |x: &Run| x.rps;
    let p50 = |x: &Run| x.p50_ms;
    let p99 = |x: &Run| x.p99_ms;
    for (what, pick, digits, base) in [
        ("requests/s", rps as fn(&Run) -> f64, 0, base_rps),
        ("p50 latency, ms", p50, 1, base_p50),
        ("p99 latency, ms", p99, 1, base_p99),
    ] {
        let (o, p) = (metric(OURS, pick), metric(PEER, pick));
        row([
            "2 worker",
            &format!("{what} (passthrough {base:.digits$})"),
            &with_spread(&o, digits),
            &with_spread(&p, digits),
            &ratio(median(&o), median(&p)),
            "",
            "",
        ]);
    }
    for (what, pick, target) in [
        (
            "overhead over passthrough, p50 ms",
            p50 as fn(&Run) -> f64,
            true,
        ),
        ("overhead over passthrough, p99 ms", p99, false),
    ] {
        let (o, p) = (overhead(r, OURS, pick), overhead(r, PEER, pick));
        let (mo, mp) = (median(&o), median(&p));
        row([
            "2 worker",
            what,
            &with_spread(&o, 1),
            &with_spread(&p, 1),
            &ratio(mo, mp),
            if target { "ours <= peer" } else { "" },
            if target {
                met((!o.is_empty() && !p.is_empty()).then_some(mo <= mp))
            } else {
                ""
            },
        ]);
        if target {
            // Rounds interleave the workers, so each round compares them
            // under the same load on the machine; how often ours wins shows
            // whether a gap between the medians is more than the spread
            // between rounds.
            let wins = o.iter().zip(&p).filter(|(ours, peer)| ours <= peer).count();
            row([
                "2 worker",
                "rounds in which our p50 overhead <= the peer's",
                &format!("{wins} of {}", o.len().min(p.len())),
                "",
                "",
                "",
                "",
            ]);
        }
    }

    let workerd_cpu = |x: &Run| x.per_request(x.cpu.workerd);
    let wrangler_cpu = |x: &Run| x.per_request(x.cpu.wrangler);
    let backend_cpu = |x: &Run| x.per_request(x.cpu.endpoint + x.cpu.redis);
    for (what, pick) in [
        (
            "CPU per request in workerd, ms",
            workerd_cpu as fn(&Run) -> f64,
        ),
        ("CPU per request in wrangler (node), ms", wrangler_cpu),
        ("CPU per request in REST endpoint + Redis, ms", backend_cpu),
    ] {
        let (o, p) = (metric(OURS, pick), metric(PEER, pick));
        let base = median(&metric(PASSTHROUGH, pick));
        row([
            "2 worker",
            &format!("{what} (passthrough {base:.2})"),
            &with_spread(&o, 2),
            &with_spread(&p, 2),
            &ratio(median(&o), median(&p)),
            "",
            "",
        ]);
    }
    let unmatched = overhead(r, OURS_UNMATCHED, p50);
    row([
        "2 worker",
        "of which without Redis (ours where no rule applies), p50 ms",
        &with_spread(&unmatched, 1),
        "-",
        "",
        "",
        "",
    ]);

    // Part 3.
    let targets = [1, 1, 0, 2];
    let trips = |label: &str| r.trips.iter().find(|(l, _)| *l == label).map(|(_, c)| c);
    for (i, step) in STEPS.iter().enumerate() {
        let show = |c: Option<&Counts>| {
            c.and_then(|c| c.get(i))
                .map(|(n, status)| format!("{n} ({status})"))
                .unwrap_or_else(|| "-".to_owned())
        };
        let ours = trips(OURS).and_then(|c| c.get(i)).map(|(n, _)| *n);
        row([
            "3 round trips",
            &format!("REST calls: {step} (HTTP status)"),
            &show(trips(OURS)),
            &show(trips(PEER)),
            "",
            &targets[i].to_string(),
            met(ours.map(|n| n == targets[i])),
        ]);
    }

    // Part 4.
    row([
        "4 size",
        "wasm raw / gzip -9, KB",
        &format!("{} / {}", kb(r.wasm.raw), kb(r.wasm.gzip)),
        "- (plain JS)",
        "",
        "gzip <= 250",
        met((r.wasm.raw > 0).then_some(r.wasm.gzip <= 250 * 1024)),
    ]);
    let upload = r.our_bundle.map(|b| Size {
        raw: b.raw + r.wasm.raw,
        gzip: b.gzip + r.wasm.gzip,
    });
    let show = |s: Option<Size>| {
        s.map(|s| format!("{} / {}", kb(s.raw), kb(s.gzip)))
            .unwrap_or_else(|| "-".to_owned())
    };
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
    ]);
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
    ]);

    // Part 5.
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
    row([
        "5 exactness",
        "hot client: admitted / configured, per round",
        &format!("{:.3} ({o_each})", median(&o)),
        &format!("{:.3} ({p_each})", median(&p)),
        "",
        "1.000",
        met((!o.is_empty()).then_some(exact)),
    ]);

    let _ = writeln!(out, "\n{}", notes(r));
    out
}

fn notes(r: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "How each part was measured:\n");
    let _ = writeln!(
        out,
        "1. `redis-benchmark -c {} -n {}` of `EVALSHA` per script and round, straight at redis-server (scripts loaded through the REST endpoint, which strips the `allow-key-locking` flag){}; one hot key, every call admitted; us/call is `usec_per_call` of `cmdstat_evalsha` after `CONFIG RESETSTAT`. Ours keeps Redis's time: GCRA as its key's expiry (`PTTL`, no clock read; 1000 per second, a whole millisecond per unit, as most rates are; a fractional interval adds a `GET`), windowed by reading `TIME`; a rule alone replies with one integer where it can (a table costs Redis about 1 us more); the peer gets `now` from its caller. Windows: 1 min at 1 s; three windows 1 s at 20 ms (1/60 s is no whole ms), 1 min at 1 s, 1 h at 1 min. The peer's three-window figure is three of its sliding-window calls (it needs one call per window), before the two extra round trips. The two reference scripts (one key, no arguments, no logic) run in the same rounds: the least a limiter that reads and writes its state costs here, without and with a read of Redis's clock.",
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
        "2. `wrk -t1 -c{} -d{}s` per worker and round, workers interleaved, through `wrangler dev` (same workerd, REST endpoint, Redis and demo origin). Policy: {} requests per client per day, sliding (ours: windowed 1 d at 24 min; peer: `slidingWindow({}, \"1 d\")`, ephemeral cache on). Every request comes from a new client, but one in {} from one hot client. Overhead is each round's figure minus the passthrough's in the same round.",
        r.load_connections, r.load_seconds, r.hot_limit, r.hot_limit, r.hot_every
    );
    let _ = writeln!(
        out,
        "3. The REST endpoint's request counter (`GET /__stats`) around single requests to a `/rt` rule of 1 per client per day: fresh client, again (denied by Redis), again (a block cache may answer), then `SCRIPT FLUSH` and a fresh client."
    );
    let _ = writeln!(
        out,
        "4. `build/index_bg.wasm` as `scripts/build-worker` built it; instantiation is `new WebAssembly.Instance` with stub imports inside workerd (`bench/workers/instantiate.mjs`), median of rounds of many. Bundles are what `wrangler dev` serves, unminified."
    );
    let _ = writeln!(
        out,
        "5. During part 2: requests of the hot client that reached the origin, over its configured limit."
    );
    let _ = writeln!(
        out,
        "\nReference (issue 5, same machine kind, Redis 7.0.15, admit path, hot key): peer sliding window 3.2-4.6 us/call, peer token bucket 5.1-6.7, go-redis/redis_rate GCRA 3.0-3.2 (not measured here)."
    );

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
                    "{} requests, {:.0}/s, p50 {:.1} p99 {:.1} ms, hot {} admitted of {} sent, CPU ms/request: workerd {:.2}, wrangler {:.2}, endpoint {:.2}, Redis {:.2}, origin {:.2}{}",
                    x.requests,
                    x.rps,
                    x.p50_ms,
                    x.p99_ms,
                    x.hot_admitted,
                    x.hot_sent,
                    x.per_request(x.cpu.workerd),
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

    fn run(rps: f64, p50_ms: f64, hot_admitted: u64) -> Run {
        Run {
            requests: 1000,
            rps,
            p50_ms,
            p99_ms: 2.0 * p50_ms,
            hot_sent: 120,
            hot_admitted,
            socket_errors: 0,
            cpu: crate::load::Cpu::default(),
        }
    }

    #[test]
    fn the_table_holds_ratios_targets_and_verdicts() {
        let sample = |usec_per_call| Sample {
            ops_per_s: 40_000.0,
            usec_per_call,
        };
        let r = Results {
            when: "2026-11-22 18:00 UTC".into(),
            peer_version: "2.2.0".into(),
            redis: vec![
                ("ours GCRA", vec![sample(2.0), sample(2.2)]),
                ("peer token bucket", vec![sample(5.0), sample(6.0)]),
                ("ours windowed x1", vec![sample(2.8)]),
                ("peer sliding window", vec![sample(4.0)]),
                ("ours windowed x3", vec![sample(5.0)]),
            ],
            load: vec![
                (PASSTHROUGH, vec![run(1000.0, 8.0, 120)]),
                (OURS, vec![run(800.0, 10.0, 50)]),
                (PEER, vec![run(700.0, 11.0, 50)]),
            ],
            hot_limit: 50,
            trips: vec![(OURS, vec![(1, 200), (1, 429), (1, 429), (2, 200)])],
            wasm: Size {
                raw: 600 * 1024,
                gzip: 240 * 1024,
            },
            instantiate_ms: 0.2,
            ..Results::default()
        };
        let table = render(&r);
        assert!(
            table.contains("| 1 Redis | GCRA vs token bucket: us/call | 2.10 (2.00..2.20) | 5.50 (5.00..6.00) | 0.38 | ours <= 2.5 | yes |"),
            "{table}"
        );
        assert!(table.contains("| ours <= 2.6 | **no** |"), "{table}");
        // Three peer calls against one of ours.
        assert!(
            table.contains("| 5.00 | 12.00 | 0.42 | ours <= 6 | yes |"),
            "{table}"
        );
        assert!(
            table.contains(
                "| overhead over passthrough, p50 ms | 2.0 | 3.0 | 0.67 | ours <= peer | yes |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| rounds in which our p50 overhead <= the peer's | 1 of 1 |"),
            "{table}"
        );
        assert!(
            table
                .contains("denied again (cacheable) (HTTP status) | 1 (429) | - |  | 0 | **no** |"),
            "{table}"
        );
        assert!(table.contains("| 600.0 / 240.0 |"), "{table}");
        assert!(table.contains("| 1.000 (50/50) |"), "{table}");
    }
}
