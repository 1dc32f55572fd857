//! `edge-limiter simulate` on small traces whose every figure was worked out
//! by hand, through the real script on a private redis-server and through
//! the model; and the command itself: formats, `--strict`, `--json`, errors.
#![cfg(not(target_arch = "wasm32"))]

use std::process::Command;

use edge_limiter::{
    decision::stats::counts::{RuleCount, RuleCounts},
    operator::simulate::{
        engine::{Engine, ModelEngine, RedisEngine},
        log::Format,
        report::{BucketReport, ClientReport, Report, RuleReport},
        simulate, Options, SimError,
    },
    rules::config::Config,
};
use edge_limiter_local::testenv::Scratch;
use serde_json::json;

/// 2026-11-20T10:00:00Z, epoch milliseconds.
const T0: u64 = 1_795_168_800_000;

/// Rules in front of distinct paths, so each part of the trace is checked
/// on its own; `all` sees every GET and never denies.
fn config() -> Config {
    Config::from_json(&json!({"rules": [
        {"name": "all", "methods": ["GET"], "key": ["ip"], "algorithm": "gcra", "rate": 100, "period": "1s", "burst": 100},
        {"name": "g", "path_prefix": "/g", "key": ["ip"], "algorithm": "gcra", "rate": 2, "period": "1s", "burst": 3},
        {"name": "w", "path_prefix": "/w", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 2, "1s"]]},
        {"name": "m", "path_prefix": "/m", "key": ["ip"], "algorithm": "windowed",
         "windows": [["1s", 2, "100ms"], ["10s", 3, "1s"]]},
        {"name": "s", "path_prefix": "/s", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "10s", "burst": 1, "mode": "shadow"},
        {"name": "q", "path_prefix": "/q", "key": ["query:k"], "algorithm": "gcra", "rate": 10, "period": "1s"}
    ]}))
    .unwrap()
}

/// `(ms after T0, ip, method, path)`, with the verdict each gets, as the
/// comments work it out. The /w lines come first in the file although
/// they are a second later: the simulator decides in time order.
const TRACE: [(u64, &str, &str, &str); 23] = [
    // w, a fixed 1 s window of 2: two fit, the third not; 2 s later (a
    // window further, wherever its edges fall) one fits again.
    (1000, "198.51.100.3", "GET", "/w"),
    (1000, "198.51.100.3", "GET", "/w"),
    (1000, "198.51.100.3", "GET", "/w"), // denied by w
    (3000, "198.51.100.3", "GET", "/w"),
    // g, GCRA 2/s (500 ms a unit), burst 3: three at once, the fourth
    // waits; at 400 ms the next would end 1600 ms ahead (> 1500): denied;
    // at 500 ms it ends exactly 1500 ms ahead: admitted.
    (0, "198.51.100.1", "GET", "/g"),
    (0, "198.51.100.1", "GET", "/g"),
    (0, "198.51.100.1", "GET", "/g"),
    (0, "198.51.100.1", "GET", "/g"), // denied by g
    (100, "198.51.100.2", "GET", "/g"),
    (200, "198.51.100.2", "GET", "/g"),
    (400, "198.51.100.1", "GET", "/g"), // denied by g
    (500, "198.51.100.1", "GET", "/g"),
    // m: 2 per second (100 ms buckets) and 3 per 10 s (1 s buckets). At
    // 1500 ms the first buckets left the 1 s window, not the 10 s one.
    (0, "198.51.100.4", "GET", "/m"),
    (0, "198.51.100.4", "GET", "/m"),
    (0, "198.51.100.4", "GET", "/m"), // denied by m's first window
    (1500, "198.51.100.4", "GET", "/m"),
    (1600, "198.51.100.4", "GET", "/m"), // denied by m's second window
    // s, shadow, 1 per 10 s: would deny the second and third, blocks none.
    (0, "198.51.100.5", "GET", "/s"),
    (100, "198.51.100.5", "GET", "/s"),
    (200, "198.51.100.5", "GET", "/s"),
    // q: the key part given twice with different values is refused (400).
    (300, "198.51.100.6", "GET", "/q?k=1&k=2"),
    (300, "198.51.100.6", "GET", "/q?k=1"),
    // No rule matches a DELETE outside the prefixes.
    (700, "198.51.100.6", "DELETE", "/other"),
];

fn csv_trace() -> String {
    let mut csv = String::from("time,ip,method,path\n");
    for (t, ip, method, path) in TRACE {
        csv.push_str(&format!("{},{ip},{method},{path}\n", T0 + t));
    }
    csv
}

fn run(engine: &mut dyn Engine, log: &str, options: &Options) -> Result<Report, SimError> {
    simulate(&config(), log.as_bytes(), options, engine, &mut ())
}

fn rule(name: &str, shadow: bool, figures: [u64; 6]) -> RuleReport {
    let mut counts = RuleCounts::default();
    let named = [
        RuleCount::Matched,
        RuleCount::Admitted,
        RuleCount::Denied,
        RuleCount::DeniedByOthers,
        RuleCount::ShadowWouldDeny,
        RuleCount::Refused,
    ];
    for (c, n) in named.into_iter().zip(figures) {
        counts[c] = n;
    }
    RuleReport {
        name: name.into(),
        shadow,
        counts,
        ..RuleReport::default()
    }
}

fn check_hand_computed(report: &Report) {
    assert_eq!(
        (
            report.requests,
            report.admitted,
            report.denied,
            report.refused,
            report.unmatched
        ),
        (23, 17, 5, 1, 1)
    );
    // matched, admitted, denied, denied by others, shadow would deny, refused
    assert_eq!(
        report.rules,
        [
            // Every decided GET (the refused one never got a decision): 21.
            rule("all", false, [21, 16, 0, 5, 0, 0]),
            rule("g", false, [8, 6, 2, 0, 0, 0]),
            rule("w", false, [4, 3, 1, 0, 0, 0]),
            rule("m", false, [5, 3, 2, 0, 0, 0]),
            rule("s", true, [3, 3, 0, 0, 2, 0]),
            rule("q", false, [2, 1, 0, 0, 0, 1]),
        ]
    );
    let client = |rule: &str, client: &str, denied, requests| ClientReport {
        rule: rule.into(),
        client: client.into(),
        denied,
        over: 0,
        requests: Some(requests),
    };
    assert_eq!(
        report.top_denied,
        [
            client("g", "198.51.100.1", 2, 6),
            client("m", "198.51.100.4", 2, 5),
            client("w", "198.51.100.3", 1, 4),
        ]
    );
    // The first second holds 17 requests: 3 denied (g twice, m once), 1 refused.
    assert_eq!(
        report.busiest,
        Some(BucketReport {
            start_ms: T0,
            requests: 17,
            admitted: 13,
            denied: 3
        })
    );
    assert_eq!(report.span_ms, Some((T0, T0 + 3000)));
    assert_eq!((report.late, report.unreadable), (0, 0));
    // Per second and rule, for the plot: w's second 1 has 2 admitted, 1 denied.
    let w = &report.series[2];
    assert_eq!(
        w.iter()
            .map(|p| (p.start_s - T0 / 1000, p.admitted, p.denied))
            .collect::<Vec<_>>(),
        [(1, 2, 1), (3, 1, 0)]
    );
    // The shadow rule's would-deny requests are its plotted denials.
    assert_eq!(report.series[4][0].denied, 2);
}

#[test]
fn hand_computed_trace_through_the_real_script() {
    let mut engine = RedisEngine::start().expect("redis-server starts");
    let report = run(&mut engine, &csv_trace(), &Options::default()).unwrap();
    assert_eq!(report.engine, "redis");
    check_hand_computed(&report);
}

#[test]
fn hand_computed_trace_through_the_model() {
    let report = run(&mut ModelEngine::new(), &csv_trace(), &Options::default()).unwrap();
    assert_eq!(report.engine, "model");
    check_hand_computed(&report);
}

/// The same requests in the Common Log Format: to the second, so the g
/// burst's 400 and 500 ms requests fall at 0 ms and are both denied.
#[test]
fn clf_logs_decide_on_whole_seconds() {
    let clf: String = TRACE
        .iter()
        .filter(|(_, _, _, path)| path.starts_with("/g"))
        .map(|(t, ip, method, path)| {
            format!(
                "{ip} - - [20/Nov/2026:10:00:{:02} +0000] \"{method} {path} HTTP/1.1\" 200 5 \"-\" \"curl/8\"\n",
                t / 1000
            )
        })
        .collect::<String>()
        + "not a log line\n";
    let report = run(&mut ModelEngine::new(), &clf, &Options::default()).unwrap();
    assert_eq!(report.format, "clf");
    assert_eq!((report.requests, report.admitted, report.denied), (8, 5, 3));
    assert_eq!(report.unreadable, 1);
    assert_eq!(report.unreadable_first[0].line, 9);
    let strict = Options {
        strict: true,
        ..Options::default()
    };
    match run(&mut ModelEngine::new(), &clf, &strict) {
        Err(SimError::Strict(e)) => assert_eq!(e.line, 9),
        other => panic!("{other:?}"),
    }
}

/// Logpush lines, out of order by up to a few seconds (batches overlap),
/// give the same figures as the CSV.
#[test]
fn logpush_lines_out_of_order_are_decided_in_time_order() {
    let mut lines: Vec<String> = TRACE
        .iter()
        .map(|(t, ip, method, path)| {
            json!({
                "EdgeStartTimestamp": (T0 + t) * 1_000_000,
                "ClientIP": ip,
                "ClientRequestMethod": method,
                "ClientRequestURI": path,
                "ClientRequestHost": "example.com",
                "EdgeResponseStatus": 200,
            })
            .to_string()
        })
        .collect();
    lines.reverse();
    lines.insert(3, "{\"EdgeStartTimestamp\": \"yesterday\"}".into());
    let report = run(
        &mut ModelEngine::new(),
        &lines.join("\n"),
        &Options::default(),
    )
    .unwrap();
    // Reversed, requests of equal time run in reverse log order; in this
    // trace that changes no figure.
    assert_eq!(report.unreadable, 1);
    assert_eq!(report.unreadable_first[0].line, 4);
    assert_eq!(report.format, "logpush");
    let mut expected = run(&mut ModelEngine::new(), &csv_trace(), &Options::default()).unwrap();
    expected.format = "logpush".into();
    expected.unreadable = 1;
    expected.unreadable_first = report.unreadable_first.clone();
    assert_eq!(format!("{report:?}"), format!("{expected:?}"));
}

/// A request logged over a minute late is decided at the latest time
/// reached, and counted.
#[test]
fn requests_beyond_the_reordering_window_are_counted_late() {
    let log = format!(
        "time,ip,method,path\n{},198.51.100.1,GET,/g\n{},198.51.100.1,GET,/g\n{},198.51.100.1,GET,/g\n",
        T0 + 120_000,
        T0 + 200_000,
        T0
    );
    let report = run(&mut ModelEngine::new(), &log, &Options::default()).unwrap();
    assert_eq!((report.requests, report.late), (3, 1));
    assert_eq!(report.span_ms, Some((T0 + 120_000, T0 + 200_000)));
}

/// `csv` replayed through `config` by the real script and by the model.
fn through_both_engines(config: &Config, csv: &str) -> Vec<Report> {
    let engines: [Box<dyn Engine>; 2] = [
        Box::new(RedisEngine::start().expect("redis-server starts")),
        Box::new(ModelEngine::new()),
    ];
    (engines.into_iter())
        .map(|mut engine| {
            simulate(
                config,
                csv.as_bytes(),
                &Options::default(),
                engine.as_mut(),
                &mut (),
            )
            .unwrap()
        })
        .collect()
}

/// `simulate CONFIG --log LOG ARGS --json`, which must succeed: its report.
fn simulated_json(
    config: impl AsRef<std::path::Path>,
    log: impl AsRef<std::path::Path>,
    args: &[&str],
) -> serde_json::Value {
    let out = (bin().arg("simulate").arg(config.as_ref()))
        .arg("--log")
        .arg(log.as_ref())
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_edge-limiter"))
}

fn temp_dir(name: &str) -> Scratch {
    Scratch::new(&format!("simulate-test-{name}"))
}

const TOML_RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "g"
key = ["ip"]
algorithm = "gcra"
rate = 2
period = "1s"
burst = 3

[env.staging.vars]
[[env.staging.vars.LIMITER.rules]]
name = "tight"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 1
"#;

#[test]
fn the_command_prints_tables_json_and_clear_errors() {
    let dir = temp_dir("cli");
    let config = dir.join("wrangler.toml");
    std::fs::write(&config, TOML_RULES).unwrap();
    let log = dir.join("access.csv");
    std::fs::write(
        &log,
        format!(
            "time,ip,method,path\n{T0},198.51.100.1,GET,/\n{T0},198.51.100.1,GET,/\n{T0},198.51.100.1,GET,/\n{T0},198.51.100.1,GET,/\n{T0},oops\n"
        ),
    )
    .unwrap();

    let out = bin()
        .arg("simulate")
        .arg(&config)
        .arg("--log")
        .arg(&log)
        .args(["--engine", "model", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&report["requests"], &report["admitted"], &report["denied"]),
        (&json!(4), &json!(3), &json!(1))
    );
    assert_eq!(
        report["rules"]["g"],
        json!({"mode": "enforce", "matched": 4, "admitted": 3, "denied": 1, "denied_by_other_rules": 0,
               "shadow_would_deny": 0, "refused": 0, "penalties_started": 0,
               "delayed": 0, "delayed_ms": 0})
    );
    assert_eq!(report["unreadable"]["count"], json!(1));
    assert_eq!(report["unreadable"]["first"][0]["line"], json!(6));
    assert!(out.stderr.is_empty(), "no progress bar off a terminal");

    // --env picks [env.staging]'s rules; the default engine is the real script.
    let out = bin()
        .arg("simulate")
        .arg(&config)
        .arg("--log")
        .arg(&log)
        .args(["--env", "staging"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("decided by redis") && text.contains("admitted 1, denied (429) 3"),
        "{text}"
    );
    assert!(text.contains("| tight | enforce |"), "{text}");
    assert!(text.contains("line 6: "), "{text}");

    // --strict stops at the bad line with its number.
    let out = bin()
        .arg("simulate")
        .arg(&config)
        .arg("--log")
        .arg(&log)
        .args(["--strict", "--engine", "model"])
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(err.starts_with("edge-limiter: line 6: "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    // Arguments clap refuses, and settings the command refuses, each in one line.
    let cases: [(&[&str], i32, &str); 4] = [
        (
            &["simulate", "--engine", "lua"],
            2,
            "invalid value 'lua' for '--engine",
        ),
        (
            &["simulate", "--log"],
            2,
            "a value is required for '--log <FILE>'",
        ),
        (
            &["simulate", "--format", "json", "--log", "x"],
            2,
            "invalid value 'json' for '--format",
        ),
        (
            &["simulate", "nowhere.toml", "--log", "x"],
            1,
            "nowhere.toml: ",
        ),
    ];
    for (args, code, needle) in cases {
        let out = bin().args(args).output().unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let out = bin()
        .arg("simulate")
        .arg(&config)
        .arg("--log")
        .arg(&log)
        .args(["--env", "prod"])
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("has no [env.prod]; it has (top level), env.staging"),
        "{err}"
    );
    for sub in ["simulate", "inspect", "reset", "check"] {
        let out = bin().args([sub, "--help"]).output().unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8(out.stdout)
            .unwrap()
            .contains("Usage: edge-limiter"));
    }
}

#[test]
fn the_format_can_be_named_when_the_first_line_hides_it() {
    // A CSV whose first line lacks `time` is no CSV log: the error says so.
    let err = run(
        &mut ModelEngine::new(),
        "when,ip\n1,2\n",
        &Options {
            format: Some(Format::Csv),
            ..Options::default()
        },
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("missing column(s) time, method, path"),
        "{err}"
    );
}

/// Failed logins: `count_status` charges only listed statuses, after the
/// request, and a denial starts the rule's penalty; beside the same rule
/// counting every request. GCRA 1 per hour, burst 2.
#[test]
fn count_status_and_penalties_by_hand() {
    let config = Config::from_json(&json!({"rules": [
        {"name": "failed", "path_prefix": "/login", "key": ["ip"], "algorithm": "gcra",
         "rate": 1, "period": "1h", "burst": 2, "count_status": [401], "penalty": "10s"},
        {"name": "every", "path_prefix": "/every", "key": ["ip"], "algorithm": "gcra",
         "rate": 1, "period": "1h", "burst": 2}
    ]}))
    .unwrap();
    let lines = [
        // 401: admitted, then charged (one hour of the two spent).
        (0, "/login", 401),
        // 200: admitted, never charged.
        (100, "/login", 200),
        // 401: admitted, then charged: both hours spent.
        (200, "/login", 401),
        // Denied up front, whatever the origin would say; the penalty starts.
        (300, "/login", 401),
        (400, "/login", 200),
        // The same requests against a rule counting every one: the third is denied.
        (0, "/every", 200),
        (100, "/every", 200),
        (200, "/every", 200),
    ];
    let mut csv = String::from("time,ip,method,path,status\n");
    for (t, path, status) in lines {
        csv.push_str(&format!("{},203.0.113.1,POST,{path},{status}\n", T0 + t));
    }
    for report in through_both_engines(&config, &csv) {
        let figures: Vec<_> = report
            .rules
            .iter()
            .map(|r| {
                (
                    r.name.as_str(),
                    r.counts[RuleCount::Matched],
                    r.counts[RuleCount::Admitted],
                    r.counts[RuleCount::Denied],
                    r.counts[RuleCount::PenaltiesStarted],
                )
            })
            .collect();
        assert_eq!(
            figures,
            [("failed", 5, 3, 2, 1), ("every", 3, 2, 1, 0)],
            "{}",
            report.engine
        );
    }
}

/// A `count_status` charge comes back when the origin has answered, as
/// the worker gives it back: the log's duration after the request. Burst
/// 1 an hour: a success that takes 1 s still holds the unit 500 ms in,
/// so the second request is denied; once its answer is in, the third is
/// admitted. Given back at arrival, the second would be admitted.
#[test]
fn a_charge_comes_back_when_the_answer_has_come() {
    let config = Config::from_json(&json!({"rules": [
        {"name": "failed", "path_prefix": "/login", "key": ["ip"], "algorithm": "gcra",
         "rate": 1, "period": "1h", "burst": 1, "count_status": [401]}
    ]}))
    .unwrap();
    let mut csv = String::from("time,ip,method,path,status,duration_ms\n");
    for (t, status, took) in [(0, 200, 1000), (500, 200, 10), (1500, 200, 10)] {
        let line = format!("{},203.0.113.1,POST,/login,{status},{took}\n", T0 + t);
        csv.push_str(&line);
    }
    for report in through_both_engines(&config, &csv) {
        let c = &report.rules[0].counts;
        let figures = (c[RuleCount::Admitted], c[RuleCount::Denied]);
        assert_eq!(figures, (2, 1), "{}", report.engine);
    }
    // Through an isolate, the charge comes back as late: no verdict differs.
    let dir = temp_dir("answered");
    let (toml, log) = (dir.join("wrangler.toml"), dir.join("access.csv"));
    let rule =
        "[[vars.LIMITER.rules]]\nname = \"failed\"\npath_prefix = \"/login\"\nkey = [\"ip\"]\n\
                algorithm = \"gcra\"\nrate = 1\nperiod = \"1h\"\nburst = 1\ncount_status = [401]\n";
    std::fs::write(&toml, rule).unwrap();
    std::fs::write(&log, &csv).unwrap();
    let report = simulated_json(&toml, &log, &["--isolates", "1"]);
    let isolates = &report["isolates"];
    assert_eq!(
        isolates["admitted_only_with_leases"],
        json!(0),
        "{isolates}"
    );
    assert_eq!(isolates["denied_only_with_leases"], json!(0), "{isolates}");
}

/// A delaying rule, worked out by hand: GCRA 2/s (500 ms a unit), burst
/// 2, waits up to 1 s. Five at once: two go, the third waits 500 ms, the
/// fourth 1000 ms, the fifth would wait 1500 ms and is denied. At 1200 ms
/// the TAT (2000 ms) lies 800 ms ahead: a request then waits 300 ms. A
/// rule without a delay beside it (4/s, burst 2) would deny the third and
/// fourth at once; it admits them where they arrive, after the wait, and
/// denies the fifth itself.
#[test]
fn waits_by_hand() {
    let config = Config::from_json(&json!({"rules": [
        {"name": "paced", "key": ["ip"], "algorithm": "gcra", "rate": 2, "period": "1s",
         "burst": 2, "on_limit": "delay", "max_delay": "1s"},
        {"name": "beside", "key": ["ip"], "algorithm": "gcra", "rate": 4, "period": "1s", "burst": 2}
    ]}))
    .unwrap();
    let mut csv = String::from("time,ip,method,path\n");
    for t in [0, 0, 0, 0, 0, 1200] {
        csv.push_str(&format!("{},203.0.113.2,GET,/\n", T0 + t));
    }
    for report in through_both_engines(&config, &csv) {
        let figures: Vec<_> = (report.rules.iter())
            .map(|r| {
                let c = |n| r.counts[n];
                let delays = (c(RuleCount::Delayed), c(RuleCount::DelayedMs));
                (
                    r.name.as_str(),
                    c(RuleCount::Admitted),
                    c(RuleCount::Denied),
                    delays,
                )
            })
            .collect();
        assert_eq!(
            figures,
            [("paced", 5, 1, (3, 1800)), ("beside", 5, 1, (0, 0))],
            "{}",
            report.engine
        );
    }
}

/// An in-flight limit of 2, its slots back when each log line's duration
/// has passed (at once where it gives none), worked out by hand.
#[test]
fn slots_by_hand() {
    let config = Config::from_json(&json!({"rules": [
        {"name": "slots", "key": ["ip"], "algorithm": "concurrency", "limit": 2}
    ]}))
    .unwrap();
    let a = "203.0.113.4";
    let lines = [
        (0, a, "100"),              // admitted: 1 held, until 100
        (10, a, "100"),             // admitted: 2 held, until 110
        (20, a, "50"),              // denied: 2 held
        (20, "198.51.100.7", "10"), // another client: admitted
        (100, a, "30"),             // the first is back: admitted, until 130
        (105, a, ""),               // denied: 2 held (no duration)
        (110, a, ""),               // the second is back: admitted, and back at once
        (110, a, "5"),              // admitted: 2 held, until 115
        (112, a, "0.2"),            // denied: 2 held (130, 115)
        (115, a, "1"),              // admitted: the one until 115 is back
    ];
    let mut csv = String::from("time,ip,method,path,duration_ms\n");
    for (t, ip, duration) in lines {
        csv.push_str(&format!("{},{ip},GET,/,{duration}\n", T0 + t));
    }
    for report in through_both_engines(&config, &csv) {
        let r = &report.rules[0];
        let figures = (r.counts[RuleCount::Admitted], r.counts[RuleCount::Denied]);
        assert_eq!(figures, (7, 3), "{}", report.engine);
        assert_eq!(r.without_duration, 2, "{}", report.engine);
        let text = report.render_text("access.csv");
        assert!(
            text.contains("rule `slots`: 2 requests had no duration in the log"),
            "{text}"
        );
    }
}

/// A `cost_header` rule is replayed at its estimate, and the report says
/// how many admitted requests were charged so: 3 of cost 10 fit a burst of
/// 30, the fourth is denied and charged nothing; the other rule has no
/// note.
#[test]
fn a_reported_cost_is_replayed_at_its_estimate_and_said_so() {
    let config = Config::from_json(&json!({"rules": [
        {"name": "tokens", "path_prefix": "/v1", "key": ["ip"], "algorithm": "gcra",
         "rate": 30, "period": "1m", "burst": 30, "cost": 10, "cost_header": "X-Cost"},
        {"name": "all", "key": ["ip"], "algorithm": "gcra", "rate": 100, "period": "1s", "burst": 100}
    ]}))
    .unwrap();
    let mut csv = String::from("time,ip,method,path,status\n");
    for t in 0..4 {
        csv.push_str(&format!("{},203.0.113.4,POST,/v1/chat,200\n", T0 + t));
    }
    for report in through_both_engines(&config, &csv) {
        let estimated: Vec<_> = (report.rules.iter()).map(|r| r.at_estimate).collect();
        assert_eq!(estimated, [3, 0], "{}", report.engine);
        let text = report.render_text("access.csv");
        assert!(
            text.contains("rule `tokens`: 3 admitted requests were charged their estimate"),
            "{text}"
        );
        assert!(!text.contains("rule `all`: "), "{text}");
        assert_eq!(report.to_json()["rules"]["tokens"]["at_estimate"], json!(3));
    }
}

/// `--isolates --latency`: in-flight slots given back a round trip after
/// each response ends, through three isolates, never let the origin hold
/// more than the limit, by the independent check of each client's stays.
#[test]
fn isolates_never_hold_more_slots_than_the_limit() {
    let dir = temp_dir("slots");
    let config = dir.join("wrangler.toml");
    std::fs::write(
        &config,
        r#"
[[vars.LIMITER.rules]]
name = "slots"
key = ["ip"]
algorithm = "concurrency"
limit = 3
hold_for = "2s"
"#,
    )
    .unwrap();
    // Two clients, 40 requests a second each for 10 s, each response
    // taking 20 to 480 ms: some 4 in flight on average, more at times.
    let mut log = String::from("time,ip,method,path,duration_ms\n");
    for i in 0..800u64 {
        let ip = ["198.51.100.1", "198.51.100.2"][(i % 2) as usize];
        let duration = 20 + (i * 7919) % 461;
        log.push_str(&format!("{},{ip},GET,/,{duration}\n", T0 + i * 25 / 2));
    }
    let path = dir.join("access.csv");
    std::fs::write(&path, log).unwrap();
    for latency in ["0", "30"] {
        let report = simulated_json(&config, &path, &["--isolates", "3", "--latency", latency]);
        let isolates = &report["isolates"];
        assert_eq!(isolates["requests"], json!(800), "{isolates}");
        assert_eq!(isolates["over_limit"], json!(0), "{isolates}");
        assert_eq!(isolates["errors"], json!(0), "{isolates}");
        let denied = report["rules"]["slots"]["denied"].as_u64().unwrap();
        assert!(denied > 50 && denied < 700, "{report}");
        assert!(report["rules"]["slots"].get("without_duration").is_none());
    }
}

/// `--isolates`: a hot key under its limit, spread over three isolates,
/// is mostly decided from leases, never over the limit, and admitted as
/// the exact replay admits it; far over its limit, it is never over
/// either.
#[test]
fn isolates_show_what_leases_trade() {
    let dir = temp_dir("isolates");
    let config = dir.join("wrangler.toml");
    std::fs::write(
        &config,
        r#"
[[vars.LIMITER.rules]]
name = "hot"
key = ["ip"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 200
lease = 20
lease_for = "500ms"
"#,
    )
    .unwrap();
    let replay = |log: &str, json: bool| {
        let path = dir.join("access.csv");
        std::fs::write(&path, log).unwrap();
        let out = bin()
            .arg("simulate")
            .arg(&config)
            .arg("--log")
            .arg(&path)
            .args(["--isolates", "3"])
            .args(json.then_some("--json"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    // 70 a second from one client for 30 s.
    let mut log = String::from("time,ip,method,path\n");
    for i in 0..2100u64 {
        log.push_str(&format!("{},198.51.100.1,GET,/\n", T0 + i * 1000 / 70));
    }
    let report: serde_json::Value = serde_json::from_str(&replay(&log, true)).unwrap();
    let isolates = &report["isolates"];
    assert_eq!(isolates["requests"], json!(2100), "{isolates}");
    assert_eq!(isolates["over_limit"], json!(0), "{isolates}");
    assert_eq!(isolates["denied_only_with_leases"], json!(0), "{isolates}");
    assert_eq!(isolates["errors"], json!(0), "{isolates}");
    assert!(
        isolates["rest_calls"].as_u64().unwrap() * 5 < 2100,
        "{isolates}"
    );
    // Then 300 a second for 2 s: denials come from Redis, exact as ever.
    for i in 0..600u64 {
        log.push_str(&format!(
            "{},198.51.100.1,GET,/\n",
            T0 + 30_000 + i * 10 / 3
        ));
    }
    let text = replay(&log, false);
    assert!(text.contains("With leases, through 3 isolates:"), "{text}");
    assert!(text.contains("over any rule's limit    0"), "{text}");
}

/// `--isolates --latency`: a page load, 30 requests of a fresh client at
/// once through one isolate 40 ms from Redis, costs two calls: the first
/// request's, then one deciding the 29 that came while it was out, which
/// admits exactly what the exact replay admits.
#[test]
fn a_page_load_through_an_isolate_at_a_distance_is_decided_by_two_calls() {
    let dir = temp_dir("page");
    let config = dir.join("wrangler.toml");
    std::fs::write(
        &config,
        r#"
[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 20
"#,
    )
    .unwrap();
    let log = dir.join("access.csv");
    let mut lines = String::from("time,ip,method,path\n");
    for _ in 0..30 {
        lines.push_str(&format!("{T0},198.51.100.9,GET,/\n"));
    }
    std::fs::write(&log, lines).unwrap();
    let report = simulated_json(&config, &log, &["--isolates", "1", "--latency", "40"]);
    let isolates = &report["isolates"];
    assert_eq!(isolates["rest_calls"], json!(2), "{isolates}");
    assert_eq!(isolates["grouped"], json!(29), "{isolates}");
    assert_eq!(isolates["group_calls"], json!(1), "{isolates}");
    for field in ["denied_only_with_leases", "admitted_only_with_leases"] {
        assert_eq!(isolates[field], json!(0), "{isolates}");
    }
    assert_eq!(isolates["over_limit"], json!(0), "{isolates}");
    assert_eq!(report["admitted"], json!(20), "{report}");
}

/// `--isolates --latency`: calls run and answered at a distance, so that
/// a lease can be spent only for what is left of its length once it is
/// back; one shorter than the round trip is never spent, and once the
/// isolate has seen a round trip, not asked for. docs/leases.md's
/// example log, 40 ms away, stays within every rule.
#[test]
fn isolates_at_a_distance_spend_leases_only_within_their_length() {
    let dir = temp_dir("latency");
    let config = dir.join("wrangler.toml");
    std::fs::write(
        &config,
        r#"
[[vars.LIMITER.rules]]
name = "hot"
key = ["ip"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 200
lease = 20
lease_for = "500ms"
"#,
    )
    .unwrap();
    // 70 a second from one client for 30 s.
    let log = dir.join("access.csv");
    let mut lines = String::from("time,ip,method,path\n");
    for i in 0..2100u64 {
        lines.push_str(&format!("{},198.51.100.1,GET,/\n", T0 + i * 1000 / 70));
    }
    std::fs::write(&log, lines).unwrap();
    let replay = |config: &std::path::Path, log: &std::path::Path, latency: &str| {
        let report = simulated_json(config, log, &["--isolates", "3", "--latency", latency]);
        report["isolates"].clone()
    };
    let near = replay(&config, &log, "0");
    assert!(near["rest_calls"].as_u64().unwrap() * 5 < 2100, "{near}");
    // 250, 500 and 750 ms each way: every lease comes back spent.
    let far = replay(&config, &log, "750");
    assert_eq!(far["latency_ms"], json!(750), "{far}");
    assert_eq!(far["from_leases"], json!(0), "{far}");
    // Nor asked for: units charged and never spent were denials (126).
    assert_eq!(far["denied_only_with_leases"], json!(0), "{far}");
    assert!(near["from_leases"].as_u64().unwrap() > 0, "{near}");
    for report in [&near, &far] {
        assert_eq!(report["over_limit"], json!(0), "{report}");
        assert_eq!(report["errors"], json!(0), "{report}");
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = replay(
        &root.join("examples/wrangler.toml"),
        &root.join("examples/access.log"),
        "40",
    );
    assert_eq!(example["requests"], json!(1003), "{example}");
    assert_eq!(example["over_limit"], json!(0), "{example}");
    assert_eq!(example["errors"], json!(0), "{example}");
    assert!(
        example["rest_calls"].as_u64().unwrap() < 1003,
        "the example's leases are spent: {example}"
    );
}

/// `--isolates`: docs/leases.md's example log is a site's, its clients' page
/// loads bursts that end before a lease would be spent. None is leased to,
/// so through 1 to 4 isolates next to Redis every request is decided as
/// the exact replay decides it (leasing to bursts denied 31 to 50 of them).
#[test]
fn a_sites_bursts_lose_no_request_to_leases() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for isolates in ["1", "2", "3", "4"] {
        let report = simulated_json(
            root.join("examples/wrangler.toml"),
            root.join("examples/access.log"),
            &["--isolates", isolates],
        );
        let report = &report["isolates"];
        for field in [
            "denied_only_with_leases",
            "admitted_only_with_leases",
            "over_limit",
        ] {
            assert_eq!(report[field], json!(0), "{isolates} isolates: {report}");
        }
    }
}

/// `--overrides`: a plan tried on a log, through the script and the model
/// alike, and through isolates; a client's override goes before the rule's.
#[test]
fn a_plan_of_overrides_is_tried_on_a_log() {
    let dir = temp_dir("overrides");
    let config = dir.join("wrangler.toml");
    std::fs::write(
        &config,
        "[[vars.LIMITER.rules]]\nname = \"g\"\nkey = [\"ip\"]\nalgorithm = \"gcra\"\nrate = 1\nperiod = \"1m\"\nburst = 3\noverrides = true\n",
    )
    .unwrap();
    let log = dir.join("access.csv");
    let mut lines = String::from("time,ip,method,path\n");
    for ip in ["198.51.100.1", "198.51.100.2"] {
        for _ in 0..10 {
            lines.push_str(&format!("{T0},{ip},GET,/\n"));
        }
    }
    std::fs::write(&log, lines).unwrap();
    let plan = dir.join("plan.jsonl");
    std::fs::write(
        &plan,
        "{\"rule\": \"g\", \"burst\": 5}\n{\"rule\": \"g\", \"client\": [\"198.51.100.1\"], \"burst\": 8}\n",
    )
    .unwrap();
    // `simulate` of the log under the plan, with `more` arguments.
    let under_plan = |more: &[&str]| {
        bin()
            .arg("simulate")
            .arg(&config)
            .arg("--log")
            .arg(&log)
            .arg("--overrides")
            .arg(&plan)
            .args(more)
            .output()
            .unwrap()
    };
    for engine in ["redis", "model"] {
        let out = under_plan(&["--engine", engine, "--json"]);
        assert!(out.status.success(), "{out:?}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // 8 for the first client, 5 for the other, instead of 3 and 3.
        assert_eq!(report["admitted"], json!(13), "{engine}: {report}");
    }
    let out = under_plan(&["--isolates", "2", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["isolates"]["denied_only_with_leases"],
        json!(0),
        "{report}"
    );
    assert_eq!(
        report["isolates"]["admitted_only_with_leases"],
        json!(0),
        "{report}"
    );
    // Checked against the figures in force: the plan's, not the rule's.
    assert_eq!(report["isolates"]["over_limit"], json!(0), "{report}");
    std::fs::write(&plan, "{\"rule\": \"g\", \"rate\": 0}\n").unwrap();
    let out = under_plan(&[]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("line 1: rate: must be at least 1"), "{err}");
}

/// Two regions, the home `us` and `eu` (continent EU), and one rule of 600
/// a minute, burst 100, shared across them, with `region_share` units
/// decided in eu alone.
fn shared_across_two_regions(region_share: u32) -> String {
    format!(
        r#"
[vars.LIMITER]
regions = [{{ name = "us", home = true }}, {{ name = "eu", continents = ["EU"] }}]
[[vars.LIMITER.rules]]
name = "api"
key = ["ip"]
algorithm = "gcra"
rate = 600
period = "1m"
burst = 100
regions = "shared"
region_share = {region_share}
"#
    )
}

/// `simulate --json` of `log` through `config`'s regions at `latencies`:
/// its report, once it has replayed all of the log's `requests` and let
/// none of them over a limit.
fn replayed_in_regions(
    config: &std::path::Path,
    log: &std::path::Path,
    latencies: &std::path::Path,
    requests: u64,
) -> serde_json::Value {
    let report = simulated_json(config, log, &["--regions", latencies.to_str().unwrap()]);
    let r = &report["isolates"];
    assert_eq!(
        (r["requests"].clone(), r["over_limit"].clone()),
        (json!(requests), json!(0)),
        "{r}"
    );
    report
}

/// `--regions`: a shared rule replayed through two regions, the home 80 ms
/// away from eu: each line goes to its continent's region, eu's client
/// under the limit is served mostly from its pool, and nothing goes over
/// the one limit across both.
#[test]
fn regions_replay_a_shared_rule_as_one_limit() {
    let dir = temp_dir("regions");
    let config = dir.join("wrangler.toml");
    std::fs::write(&config, shared_across_two_regions(5)).unwrap();
    let latencies = dir.join("latencies.txt");
    std::fs::write(&latencies, "us eu 80  # ms each way\neu eu 1\n").unwrap();
    // One client at both regions, 5 a second in eu (under the limit) and
    // then 20 a second in both (over it).
    let mut log = String::from("time,ip,method,path,cf:continent\n");
    for i in 0..300u64 {
        log.push_str(&format!("{},198.51.100.1,GET,/,EU\n", T0 + i * 200));
    }
    for i in 0..600u64 {
        let place = ["EU", "NA"][(i % 2) as usize];
        log.push_str(&format!(
            "{},198.51.100.1,GET,/,{place}\n",
            T0 + 60_000 + i * 25
        ));
    }
    let path = dir.join("access.csv");
    std::fs::write(&path, log).unwrap();
    let report = replayed_in_regions(&config, &path, &latencies, 900);
    let r = &report["isolates"];
    assert_eq!(r["errors"], json!(0), "{r}");
    let (us, eu) = (&r["regions"][0], &r["regions"][1]);
    assert_eq!(
        (us["requests"].clone(), eu["requests"].clone()),
        (json!(300), json!(600)),
        "{r}"
    );
    assert_eq!(
        (us["far_calls"].clone(), eu["home_ms"].clone()),
        (json!(0), json!(80)),
        "{r}"
    );
    let far = eu["far_calls"].as_u64().unwrap();
    assert!(far > 0 && far < 300, "pools spare most far calls: {r}");
    // A missing pair is named.
    std::fs::write(&latencies, "eu eu 1\n").unwrap();
    let out = bin()
        .arg("simulate")
        .arg(&config)
        .args([
            "--log".as_ref(),
            path.as_os_str(),
            "--regions".as_ref(),
            latencies.as_os_str(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no latency between `eu` and the home `us`"),
        "{err}"
    );
}

/// docs/deploying.md's page loads: 20 fresh clients in eu, each sending
/// 30 requests within 80 ms, the home 80 ms away. A share smaller than the
/// page sends what it cannot cover to the home, one far call each; a share
/// the size of the page decides it near, with one far call a page (its
/// pool's top-up). Both within the one limit.
#[test]
fn a_region_share_the_size_of_a_page_keeps_its_load_near() {
    let dir = temp_dir("page-loads");
    let latencies = dir.join("latencies.txt");
    std::fs::write(&latencies, "us eu 80\neu eu 1\n").unwrap();
    let mut log = String::from("time,ip,method,path,cf:continent\n");
    for client in 0..20u64 {
        let opened = T0 + client * 2_000;
        log.push_str(&format!("{opened},198.51.100.{client},GET,/,EU\n"));
        for k in 0..29u64 {
            let at = opened + 40 + k / 10 * 20;
            log.push_str(&format!("{at},198.51.100.{client},GET,/a{k},EU\n"));
        }
    }
    let path = dir.join("access.csv");
    std::fs::write(&path, log).unwrap();
    let far_per_page = |share: u32| {
        let config = dir.join(format!("share-{share}.toml"));
        std::fs::write(&config, shared_across_two_regions(share)).unwrap();
        let report = replayed_in_regions(&config, &path, &latencies, 600);
        assert_eq!(report["denied"], json!(0), "{report}");
        report["isolates"]["regions"][1]["far_calls"]
            .as_u64()
            .unwrap() as f64
            / 20.0
    };
    let small = far_per_page(5);
    assert!(
        small >= 20.0,
        "a share of 5 leaves most of a page far: {small}"
    );
    assert_eq!(far_per_page(30), 1.0, "a share of 30 covers the page");
}
