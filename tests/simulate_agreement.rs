//! The simulator's two engines agree: a generated 100 000-request trace
//! (GCRA and windowed rules, shadow rules, costs per method, many clients,
//! dense bursts, requests a little out of order, failed logins counted only
//! after their response, penalties) replayed through the real
//! script on a private redis-server and through the reference model gives
//! the same decision, field by field, for every request.
#![cfg(not(target_arch = "wasm32"))]

use edge_limiter::{
    decision::{outcomes::verdict::Decision, stats::counts::RuleCount},
    operator::simulate::{
        engine::{Engine, ModelEngine, RedisEngine},
        log::Record,
        simulate, Observer, Options, Replayed,
    },
    rules::config::Config,
};
use serde_json::json;

/// 2026-11-20T10:00:00Z, epoch milliseconds.
const T0: u64 = 1_795_168_800_000;

const REQUESTS: usize = 100_000;

fn config() -> Config {
    // Windows are sliding (precision below duration) or long, and GCRA
    // intervals at least 50 ms: with a pinned clock, keys still expire on
    // Redis's own clock, and a key must never expire within the replay
    // before its state stops mattering on the log's clock.
    Config::from_json(&json!({"rules": [
        {"name": "per-ip", "key": ["ip"], "algorithm": "gcra", "rate": 20, "period": "1s", "burst": 10},
        {"name": "api", "path_prefix": "/api", "key": ["ip"], "algorithm": "windowed",
         "windows": [["1s", 15, "100ms"], ["1m", 200, "5s"]], "cost": {"GET": 1, "POST": 4}},
        {"name": "keyed", "with_headers": ["x-api-key"], "key": ["header:x-api-key"],
         "algorithm": "gcra", "rate": 7, "period": "1s", "burst": 5, "penalty": "5s"},
        {"name": "login", "path_prefix": "/login", "methods": ["POST"], "key": ["ip", "cookie:sid"],
         "algorithm": "windowed", "windows": [["10s", 3, "1s"], ["1h", 20, "1h"]],
         "count_status": [401, 403], "penalty": "30s"},
        {"name": "search", "path": "/api/search", "key": ["ip"], "algorithm": "gcra",
         "rate": 1, "period": "1s", "burst": 2, "mode": "shadow", "penalty": "3s"},
        {"name": "agents", "key": ["user-agent"], "algorithm": "windowed",
         "windows": [["5s", 400, "500ms"]], "mode": "shadow", "cost": {"HEAD": 0, "default": 1}},
        {"name": "pages", "path_prefix": "/list", "key": ["query:page"], "algorithm": "gcra",
         "rate": 50, "period": "1s", "burst": 20}
    ]}))
    .unwrap()
}

/// xorshift64*: reproducible traffic.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// A CSV log: about 500 requests a second from 2 000 clients, with bursts
/// of up to 40 requests in the same few milliseconds from one client, and
/// one request in 50 logged up to 2 s late.
fn trace() -> String {
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut csv =
        String::from("time,ip,method,path,header:user-agent,header:x-api-key,cookie:sid,status\n");
    let paths = [
        "/",
        "/api/items",
        "/api/items/7",
        "/api/search?q=a",
        "/login",
        "/list?page=2",
        "/list?page=1&page=3",
        "/static/app.js",
    ];
    let agents = ["Mozilla/5.0", "curl/8.5.0", "python-requests/2.31"];
    let methods = ["GET", "GET", "GET", "POST", "HEAD"];
    let mut t = T0;
    let mut written = 0;
    while written < REQUESTS {
        t += rng.below(5);
        let client = rng.below(2000);
        let ip = format!(
            "10.{}.{}.{}",
            client / 65_536,
            client / 256 % 256,
            client % 256
        );
        let burst = if rng.below(100) == 0 {
            5 + rng.below(36)
        } else {
            1
        };
        for _ in 0..burst {
            let at = if rng.below(50) == 0 {
                t.saturating_sub(rng.below(2000))
            } else {
                t + rng.below(3)
            };
            let path = paths[rng.below(paths.len() as u64) as usize];
            let method = if path == "/login" {
                "POST"
            } else {
                methods[rng.below(methods.len() as u64) as usize]
            };
            let agent = agents[rng.below(agents.len() as u64) as usize];
            let key = if rng.below(3) == 0 {
                format!("key-{}", client % 300)
            } else {
                String::new()
            };
            let sid = format!("s{}", rng.below(3));
            // Half the logins fail.
            let status = if path == "/login" && rng.below(2) == 0 {
                401
            } else {
                200
            };
            csv.push_str(&format!(
                "{at},{ip},{method},{path},{agent},{key},{sid},{status}\n"
            ));
            written += 1;
        }
    }
    csv
}

/// Every request's fate, in the order decided.
#[derive(Default)]
struct Fates(Vec<(u64, Option<Decision>, Option<usize>)>);

impl Observer for Fates {
    fn verdict(&mut self, record: &Record, verdict: Replayed<'_>) {
        let fate = match verdict {
            Replayed::Unmatched => (record.line, None, None),
            Replayed::Refused(rule) => (record.line, None, Some(rule)),
            Replayed::Decided(d) => (record.line, Some(d.clone()), None),
        };
        self.0.push(fate);
    }
}

fn replay(
    engine: &mut dyn Engine,
    log: &str,
) -> (Fates, edge_limiter::operator::simulate::report::Report) {
    let mut fates = Fates::default();
    let report = simulate(
        &config(),
        log.as_bytes(),
        &Options::default(),
        engine,
        &mut fates,
    )
    .expect("the trace replays");
    (fates, report)
}

#[test]
fn the_real_script_and_the_model_decide_every_request_alike() {
    let log = trace();
    let started = std::time::Instant::now();
    let (redis, redis_report) = replay(
        &mut RedisEngine::start().expect("redis-server starts"),
        &log,
    );
    let redis_time = started.elapsed();
    let (model, model_report) = replay(&mut ModelEngine::new(), &log);
    assert_eq!(redis.0.len(), REQUESTS);
    assert_eq!(model.0.len(), REQUESTS);
    for (r, m) in redis.0.iter().zip(&model.0) {
        assert_eq!(r, m, "line {}: redis and the model disagree", r.0);
    }
    assert_eq!(
        redis_report.render_text("trace").replace("redis", "model"),
        model_report.render_text("trace")
    );

    // The trace exercises what it claims to: every outcome occurs.
    let r = &redis_report;
    let rule = |name: &str| r.rules.iter().find(|x| x.name == name).unwrap();
    assert!(
        r.denied > 1000 && r.refused > 100 && r.unmatched == 0,
        "{}",
        r.render_text("trace")
    );
    for name in ["per-ip", "api", "keyed", "login", "pages"] {
        assert!(
            rule(name).counts[RuleCount::Denied] > 0,
            "{name} never denied:\n{}",
            r.render_text("trace")
        );
    }
    for name in ["search", "agents"] {
        assert!(
            rule(name).counts[RuleCount::ShadowWouldDeny] > 0,
            "{name} never would-deny:\n{}",
            r.render_text("trace")
        );
    }
    assert!(rule("per-ip").counts[RuleCount::DeniedByOthers] > 0);
    for name in ["keyed", "login", "search"] {
        assert!(
            rule(name).counts[RuleCount::PenaltiesStarted] > 0,
            "{name} never started a penalty:\n{}",
            r.render_text("trace")
        );
    }
    assert!(
        r.late == 0,
        "the 2 s lateness is inside the reordering window"
    );
    eprintln!(
        "agreement: {REQUESTS} requests, {} denied, {} refused, redis engine {:.1} s (debug build)",
        r.denied,
        r.refused,
        redis_time.as_secs_f64()
    );
}
