//! The stats script against a real redis-server, through the REST endpoint
//! (whose `allow-key-locking` guard refuses a key missing from `KEYS`):
//! writes add up figure by figure and client by client, every key expires
//! `stats_keep` after its day, the call runs on a cluster, and a day's
//! figures of one rule take bounded memory.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::{cell::RefCell, collections::HashMap};

use edge_limiter::{
    decision::stats::{
        counts::{RuleCount, RuleCounts, TotalCount, RULE_COUNTS},
        recorder::{Minute, Recorder, StatsWrite},
        stored::{
            day_key, read_rule_day, read_totals_day, write_call, writer_key, COUNTERS_KEY,
            DAY_MINUTES, DAY_MS, STATS, WRITER_KEEP_MS,
        },
        top::{Counted, Denials, TopDenied},
        write::flush,
    },
    operator::metrics::read_counters,
    rules::{config::Config, stats::StatsSettings},
};
use proptest::prelude::*;
use serde_json::json;
use support::{Backend, BUDGET};

fn config() -> Config {
    Config::from_json(&json!({"rules": [
        {"name": "api", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s"},
        {"name": "login", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m"}
    ]}))
    .unwrap()
}

/// Milliseconds since the epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Today, in days since the epoch: keys of days long gone would expire at
/// once.
fn today() -> u64 {
    now_ms() / DAY_MS
}

/// A day's key as (field, value) pairs.
async fn fields(b: &Backend, key: &str) -> Vec<(String, String)> {
    let all = b.client.command(&["HGETALL", key]).await.unwrap();
    let words: Vec<String> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    words
        .chunks_exact(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect()
}

/// Writes `minutes` the way an isolate's first write does, as isolate
/// `writer`, asserting it worked.
async fn write(
    b: &Backend,
    c: &Config,
    settings: StatsSettings,
    writer: u64,
    minutes: Vec<Minute>,
) {
    let recorder = RefCell::new(Recorder::new(c, settings, writer));
    let first = StatsWrite {
        writer,
        seq: 1,
        minutes,
    };
    let events = flush(&b.client, c, &recorder, first.into()).await;
    assert!(events.is_empty(), "{events:?}");
}

/// A summary's names and counts, most first.
fn names(top: &TopDenied) -> Vec<(String, u64)> {
    let top = top.top(100).into_iter();
    top.map(|e| (e.name.clone(), e.count)).collect()
}

/// A minute with `n` requests denied by `login`, by these clients.
fn denials(minute: u64, clients: &[(&str, u64)]) -> Minute {
    let mut m = Minute::new(minute, 2);
    for (client, n) in clients {
        m.totals[TotalCount::Requests] += n;
        m.totals[TotalCount::Denied] += n;
        m.rules[1][RuleCount::Matched] += n;
        m.rules[1][RuleCount::Denied] += n;
        m.rules[1][RuleCount::Calls] += n;
        m.denied[1].clients.add(client, *n);
    }
    m
}

#[tokio::test]
async fn embedded_sha1_is_the_sources_and_what_redis_computes() {
    assert_eq!(
        STATS.sha1,
        sha1_smol::Sha1::from(STATS.source).digest().to_string()
    );
    assert!(STATS.source.starts_with("#!lua flags=allow-key-locking\n"));
    let b = Backend::start();
    let loaded = b
        .client
        .command(&["SCRIPT", "LOAD", STATS.source])
        .await
        .unwrap();
    assert_eq!(loaded, json!(STATS.sha1));
}

/// Two isolates' writes of the same minute: figures add up, clients add up
/// and only the ten most denied stay, in order.
#[tokio::test]
async fn writes_add_up_and_keep_the_most_denied() {
    let b = Backend::start();
    let c = config();
    let day = today();
    let minute = day * DAY_MINUTES + 600;
    let mut many: Vec<(String, u64)> = (0..9).map(|i| (format!("10.0.0.{i}"), 2)).collect();
    many.push(("10.0.0.99".into(), 1));
    let many: Vec<(&str, u64)> = many.iter().map(|(c, n)| (c.as_str(), *n)).collect();
    write(
        &b,
        &c,
        StatsSettings::default(),
        1,
        vec![denials(minute, &many)],
    )
    .await;
    let other = [("10.0.0.5", 3), ("192.0.2.7", 4)];
    write(
        &b,
        &c,
        StatsSettings::default(),
        2,
        vec![denials(minute, &other)],
    )
    .await;
    let read = read_rule_day(day, &fields(&b, &day_key(day, Some("login"))).await);
    assert_eq!(read.len(), 1);
    let (at, counts, clients) = &read[0];
    assert_eq!(*at, minute);
    let mut want = RuleCounts::default();
    want[RuleCount::Matched] = 26;
    want[RuleCount::Denied] = 26;
    want[RuleCount::Calls] = 26;
    assert_eq!(*counts, want);
    let top = names(&clients.clients);
    assert_eq!(top.len(), 10, "{top:?}");
    assert_eq!(top[..2], [("10.0.0.5".into(), 5), ("192.0.2.7".into(), 4)]);
    assert!(
        !top.iter().any(|(c, _)| *c == "10.0.0.99"),
        "the least denied made room: {top:?}"
    );
    assert_eq!(
        clients.clients.floor(),
        1,
        "and raised the floor to its count"
    );
    let totals = read_totals_day(day, &fields(&b, &day_key(day, None)).await);
    assert_eq!(totals[0].1[TotalCount::Requests], 26);
    assert!(
        b.client
            .command(&["EXISTS", &day_key(day, Some("api"))])
            .await
            .unwrap()
            == json!(0),
        "a rule with nothing counted writes no key"
    );
}

#[tokio::test]
async fn each_days_keys_expire_stats_keep_after_the_day_ends() {
    let b = Backend::start();
    let c = config();
    let now_ms = now_ms();
    let today = now_ms / DAY_MS;
    let keep = StatsSettings {
        keep_ms: 3_600_000,
        ..StatsSettings::default()
    };
    let minute = today * DAY_MINUTES + 5;
    write(&b, &c, keep, 1, vec![denials(minute, &[("k", 1)])]).await;
    for key in [day_key(today, None), day_key(today, Some("login"))] {
        let pttl = b.client.command(&["PTTL", &key]).await.unwrap();
        let left = pttl.as_i64().unwrap();
        let want = ((today + 1) * DAY_MS + keep.keep_ms - now_ms) as i64;
        // Within the second the test takes.
        assert!(
            (want - 2_000..=want).contains(&left),
            "{key}: {left} of {want}"
        );
    }
}

/// On a one-node cluster, which refuses keys of several slots: every key
/// of a write, over two days and every rule, is in one slot.
#[tokio::test]
async fn a_write_runs_on_a_cluster() {
    let b = Backend::start_cluster();
    let c = config();
    let day = today();
    let mut first = denials(day * DAY_MINUTES - 1, &[("k", 1)]);
    first.rules[0][RuleCount::Matched] = 1;
    let second = denials(day * DAY_MINUTES, &[("k", 2)]);
    write(&b, &c, StatsSettings::default(), 1, vec![first, second]).await;
    let read = read_rule_day(day, &fields(&b, &day_key(day, Some("login"))).await);
    assert_eq!(names(&read[0].2.clients), [("k".into(), 2)]);
}

/// A write sent again after its reply was lost (the isolate cannot tell
/// whether Redis took it) is added once; the isolate's next write, and
/// another isolate's write of the same number, are added as usual; the
/// isolate's key expires.
#[tokio::test]
async fn a_write_sent_again_is_added_once() {
    let b = Backend::start();
    let c = config();
    let day = today();
    let minute = day * DAY_MINUTES + 30;
    let client = &b.client;
    let send = |writer, seq, n| {
        let write = StatsWrite {
            writer,
            seq,
            minutes: vec![denials(minute, &[("k", n)])],
        };
        let (keys, args) = write_call(&c, 3_600_000, &write);
        async move { client.run_script(&STATS, &keys, &args, BUDGET).await }
    };
    let denied = || async {
        let read = read_rule_day(day, &fields(&b, &day_key(day, Some("login"))).await);
        read[0].1[RuleCount::Denied]
    };
    assert_eq!(send(7, 1, 2).await.unwrap(), json!(3));
    assert_eq!(
        send(7, 1, 2).await.unwrap(),
        json!(0),
        "a replay adds nothing"
    );
    assert_eq!(denied().await, 2);
    assert_eq!(send(7, 2, 3).await.unwrap(), json!(3));
    assert_eq!(send(8, 1, 4).await.unwrap(), json!(3), "another isolate");
    assert_eq!(send(7, 2, 3).await.unwrap(), json!(0));
    assert_eq!(denied().await, 9);
    let pttl = b.client.command(&["PTTL", &writer_key(7)]).await.unwrap();
    let left = pttl.as_i64().unwrap();
    assert!(
        (WRITER_KEEP_MS as i64 - 2_000..=WRITER_KEEP_MS as i64).contains(&left),
        "{left}"
    );
}

/// The counters `/metrics` reads: every write's figures added once (a
/// replay adds nothing), across isolates and days, with when the last
/// write landed on Redis's clock; they live `stats_keep` after it.
#[tokio::test]
async fn counters_grow_once_per_write_whoever_writes() {
    let b = Backend::start();
    let c = config();
    let day = today();
    let client = &b.client;
    let send = |writer, seq, minutes: Vec<Minute>| {
        let write = StatsWrite {
            writer,
            seq,
            minutes,
        };
        let (keys, args) = write_call(&c, 3_600_000, &write);
        async move { client.run_script(&STATS, &keys, &args, BUDGET).await }
    };
    let rules = ["api".to_owned(), "login".to_owned()];
    let before = now_ms();
    let nothing = read_counters(client, &rules, now_ms()).await.unwrap();
    assert_eq!(nothing.written_ms, None);
    assert_eq!(nothing.rules[1].1, RuleCounts::default());
    let yesterday = denials(day * DAY_MINUTES - 1, &[("k", 2)]);
    let today = denials(day * DAY_MINUTES + 1, &[("k", 3), ("j", 1)]);
    send(1, 1, vec![yesterday, today.clone()]).await.unwrap();
    send(1, 1, vec![today.clone()]).await.unwrap();
    send(2, 1, vec![today]).await.unwrap();
    let read = read_counters(client, &rules, now_ms()).await.unwrap();
    assert_eq!(read.totals[TotalCount::Requests], 10);
    assert_eq!(read.totals[TotalCount::Denied], 10);
    assert_eq!(read.rules[1].1[RuleCount::Denied], 10);
    assert_eq!(read.rules[0].1, RuleCounts::default());
    // On this machine's clock as it read before the call: up to a round
    // trip early.
    let written = read.written_ms.unwrap();
    assert!((before - 50..=now_ms()).contains(&written), "{written}");
    // Read by a machine whose clock is an hour ahead, the write is as old.
    const AHEAD_MS: u64 = 3_600_000;
    let ahead = read_counters(client, &rules, now_ms() + AHEAD_MS)
        .await
        .unwrap();
    let written = ahead.written_ms.unwrap() - AHEAD_MS;
    assert!((before - 50..=now_ms()).contains(&written), "{written}");
    let pttl = b.client.command(&["PTTL", COUNTERS_KEY]).await.unwrap();
    let left = pttl.as_i64().unwrap();
    assert!((3_598_000..=3_600_000).contains(&left), "{left}");
}

/// What a rule's day takes in Redis when every minute of it is written,
/// each figure seven digits long, and ten clients of 64 characters, ten
/// countries and ten networks denied, every count and error six digits:
/// the most it can hold. docs/stats.md states the bound this checks; every
/// field is counted (`SAMPLES 0`): the default five-field sample of a hash
/// this wide read from 1.2 to 1.9 MB for the same 1.37 MB.
#[tokio::test]
async fn a_rules_day_takes_bounded_memory() {
    let b = Backend::start();
    let c = config();
    let clients: Vec<String> = (0..10).map(|i| format!("{i:0>64}")).collect();
    let countries: Vec<String> = (0..10).map(|i| format!("C{i}")).collect();
    let networks: Vec<String> = (0..10)
        .map(|i| format!("{}", 4_294_967_285u64 + i))
        .collect();
    let day = today();
    for hour in 0..24 {
        let minutes: Vec<Minute> = (0..60)
            .map(|m| {
                let mut minute = Minute::new(day * DAY_MINUTES + hour * 60 + m, 2);
                // A busy rule that denies no one, for comparison.
                let mut busy = RuleCounts::default();
                for c in [RuleCount::Matched, RuleCount::Admitted, RuleCount::Calls] {
                    busy[c] = 1234;
                }
                minute.rules[0] = busy;
                minute.rules[1] = RuleCounts([9_999_999; RULE_COUNTS]);
                // Every summary at its widest: ten names, each count and
                // error six digits long.
                let widest = |names: &[String]| {
                    let entries = names.iter().map(|name| Counted {
                        name: name.clone(),
                        count: 999_999,
                        over: 999_999,
                    });
                    TopDenied::from_parts(entries.collect(), 999_999)
                };
                minute.denied[1] = Denials {
                    clients: widest(&clients),
                    countries: widest(&countries),
                    networks: widest(&networks),
                };
                minute
            })
            .collect();
        let hourly = StatsWrite {
            writer: 1,
            seq: hour + 1,
            minutes,
        };
        let (keys, args) = write_call(&c, 3_600_000, &hourly);
        let written = b.client.run_script(&STATS, &keys, &args, BUDGET).await;
        assert_eq!(written.unwrap(), json!(60 * 5));
    }
    let key = day_key(day, Some("login"));
    let fields = fields(&b, &key).await;
    assert_eq!(fields.len(), 4 * DAY_MINUTES as usize);
    let bytes: u64 = b
        .redis(&["MEMORY", "USAGE", &key, "SAMPLES", "0"])
        .trim()
        .parse()
        .unwrap();
    println!("a rule's day, every minute written at its largest: {bytes} bytes");
    assert!(bytes <= 2_500_000, "{bytes} bytes");
    let busy = day_key(day, Some("api"));
    let bytes: u64 = b
        .redis(&["MEMORY", "USAGE", &busy, "SAMPLES", "0"])
        .trim()
        .parse()
        .unwrap();
    println!("a rule's day, 1234 requests a minute and no denial: {bytes} bytes");
}

/// One isolate's denials in a minute: a client (a few heavy ones, many
/// light) and how many times, in arrival order.
fn isolate_denials() -> impl Strategy<Value = Vec<(u32, u64)>> {
    let client = prop_oneof![3 => 0u32..3, 2 => 0u32..200];
    proptest::collection::vec((client, 1u64..4), 0..300)
}

/// Every count `top` lists lies within its stated error of `truth`, and
/// every name it leaves out had no more than its floor.
fn bounded(top: &TopDenied, truth: &HashMap<String, u64>) -> Result<(), TestCaseError> {
    let listed = top.top(usize::MAX);
    for e in &listed {
        let n = truth.get(&e.name).copied().unwrap_or(0);
        prop_assert!(e.count - e.over <= n && n <= e.count, "{e:?}: {n}");
    }
    for (name, n) in truth {
        if !listed.iter().any(|e| e.name == *name) {
            prop_assert!(*n <= top.floor(), "{name}: {n} > {}", top.floor());
        }
    }
    Ok(())
}

/// Isolates that each followed more clients than they keep, written in any
/// order and added by the script: every count Redis keeps lies within its
/// stated error of the true number, and every client left out was denied
/// no more than the floor; the truth is a plain tally of what was sent.
#[test]
fn kept_counts_bound_every_true_count() {
    let b = Backend::start();
    let c = config();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let day = today();
    let minute = std::cell::Cell::new(day * DAY_MINUTES);
    let cases = ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(cases);
    let writes = proptest::collection::vec(isolate_denials(), 1..6);
    let writer = std::cell::Cell::new(0);
    runner
        .run(&writes, |writes| {
            minute.set(minute.get() + 1);
            let minute = minute.get();
            let mut truth: HashMap<String, u64> = HashMap::new();
            for events in &writes {
                let mut m = Minute::new(minute, 2);
                let mut own: HashMap<String, u64> = HashMap::new();
                for (client, n) in events {
                    let name = format!("10.0.{client}.1");
                    *truth.entry(name.clone()).or_default() += n;
                    *own.entry(name.clone()).or_default() += n;
                    m.denied[1].clients.add(&name, *n);
                }
                // The isolate's own summary, before Redis adds it, bounds
                // its own tally as well.
                bounded(&m.denied[1].clients, &own)?;
                writer.set(writer.get() + 1);
                let settings = StatsSettings::default();
                rt.block_on(write(&b, &c, settings, writer.get(), vec![m]));
            }
            let key = day_key(day, Some("login"));
            let read = read_rule_day(day, &rt.block_on(fields(&b, &key)));
            let kept = read.iter().find(|(m, _, _)| *m == minute);
            let kept = kept.map(|k| k.2.clients.clone()).unwrap_or_default();
            prop_assert!(kept.top(100).len() <= 10);
            bounded(&kept, &truth)
        })
        .unwrap();
}
