//! Part 1, Redis-side cost: `EVALSHA` decisions per second on one
//! redis-server at a fixed concurrency (`redis-benchmark`), and Redis's own
//! time per call (`usec_per_call` of `cmdstat_evalsha`), ours and the peer's
//! interleaved round by round.
//!
//! Scripts are loaded straight into redis-server, without the
//! `allow-key-locking` flag stock Redis rejects (ours and the peer's carry
//! it), and so without the guard the REST endpoint puts in front of flagged
//! scripts (hosted Upstash enforces that rule itself, at no cost to the
//! script); `redis-benchmark` then calls them there, so HTTP neither adds to
//! the figures nor competes with Redis for the two cores.

use std::process::Command;

use edge_limiter::{
    decision::transport::protocol::{Check, Reply, ScriptCall, LIMITER},
    rules::config::Config,
};
use edge_limiter_local::{resp::Value, testenv::redis_call};
use serde_json::{json, Value as Json};

use crate::peer::PeerCall;

/// One script call to repeat: a hot key on the admit path.
#[derive(Debug, Clone)]
pub struct Case {
    pub label: &'static str,
    pub source: String,
    pub keys: Vec<String>,
    pub args: Vec<String>,
    /// Ours: the call, which reads its reply (to check the first one).
    pub call: Option<ScriptCall>,
}

/// Our GCRA case on a rule that takes overrides, none set.
pub const GCRA_OVERRIDES: &str = "ours GCRA, overrides allowed";

/// Limits no run comes near, so every call is admitted and writes.
const HUGE: u64 = 1_000_000_000;
/// The client every case decides for.
const HOT: &str = "bench-hot";

/// Our script on one rule (JSON as in `[vars.LIMITER]`), cost 1, Redis's clock.
pub fn ours(label: &'static str, rule: Json) -> Result<Case, String> {
    let config = Config::from_json(&json!({ "rules": [rule] })).map_err(|e| e.to_string())?;
    let check = Check {
        rule: &config.rules[0],
        cost: 1,
    };
    let call = ScriptCall::decide(&[(check, vec![HOT])], None);
    Ok(Case {
        label,
        source: LIMITER.source.to_owned(),
        keys: call.keys(),
        args: call.args(),
        call: Some(call),
    })
}

/// Our policies: GCRA at a whole and a fractional interval, one and three windows.
pub fn our_cases() -> Result<[Case; 5], String> {
    Ok([
        ours(
            "ours GCRA",
            // One unit per whole millisecond, as most rates are; one whose
            // interval is not (7 per second) adds a GET for the remainder.
            json!({"name": "gcra", "key": ["ip"], "algorithm": "gcra",
                   "rate": 1_000, "period": "1s", "burst": HUGE}),
        )?,
        // The same rule taking overrides, none set: what allowing them costs.
        ours(
            GCRA_OVERRIDES,
            json!({"name": "gcrao", "key": ["ip"], "algorithm": "gcra",
                   "rate": 1_000, "period": "1s", "burst": HUGE, "overrides": true}),
        )?,
        ours(
            GCRA_FRACTIONAL,
            json!({"name": "gcra7", "key": ["ip"], "algorithm": "gcra",
                   "rate": 7, "period": "1s", "burst": HUGE}),
        )?,
        // 1/60 of the window, as for the peer's comparison policy.
        ours(
            "ours windowed x1",
            json!({"name": "win1", "key": ["ip"], "algorithm": "windowed",
                   "windows": [["1m", HUGE, "1s"]]}),
        )?,
        // 1/60 of a second is no whole number of milliseconds, which buckets
        // must be: the 1 s window uses 20 ms, the nearest that divides it.
        ours(
            "ours windowed x3",
            json!({"name": "win3", "key": ["ip"], "algorithm": "windowed",
                   "windows": [["1s", HUGE, "20ms"], ["1m", HUGE, "1s"], ["1h", HUGE, "1m"]]}),
        )?,
    ])
}

/// Reference scripts with no logic at all: what any limiter that reads its
/// state and writes it back costs at least on this machine, without and with
/// a read of Redis's clock; the third is GCRA's own floor, which its target
/// is a ratio to.
pub fn floor_cases() -> [Case; 3] {
    let case = |label, source: &str| Case {
        label,
        source: source.to_owned(),
        keys: vec![format!("floor:{{{HOT}}}")],
        args: Vec::new(),
        call: None,
    };
    let read_write = "local v = redis.call('GET', KEYS[1])\n\
                      redis.call('SET', KEYS[1], '1', 'PX', '60000')\n\
                      return 1\n";
    [
        case(FLOOR_RW, read_write),
        case(
            FLOOR_CLOCK_RW,
            &format!("local t = redis.call('TIME')\n{read_write}"),
        ),
        // What GCRA cannot do without: read its key's expiry, write it anew.
        case(
            FLOOR_PTTL_SET,
            "local v = redis.call('PTTL', KEYS[1])\n\
             redis.call('SET', KEYS[1], '', 'PX', '60000')\n\
             return 1\n",
        ),
    ]
}

/// Label of our GCRA at a rate whose interval is no whole millisecond.
pub const GCRA_FRACTIONAL: &str = "ours GCRA 7/s";

/// Label of the reference script that reads and writes one key.
pub const FLOOR_RW: &str = "floor GET + SET";
/// Label of the reference script that also reads Redis's clock.
pub const FLOOR_CLOCK_RW: &str = "floor TIME + GET + SET";
/// Label of GCRA's own floor: a logic-free `PTTL` and `SET .. PX`.
pub const FLOOR_PTTL_SET: &str = "floor PTTL + SET PX";

/// What the peer library is asked for (see `peer::capture`).
pub fn peer_policies() -> Json {
    json!({
        "peer sliding window": ["slidingWindow", HUGE, "60 s"],
        "peer token bucket": ["tokenBucket", 1_000_000, "1 s", HUGE],
    })
}

pub fn peer_case(call: &PeerCall) -> Case {
    let label = if call.label.contains("sliding") {
        "peer sliding window"
    } else {
        "peer token bucket"
    };
    Case {
        label,
        source: call.source.clone(),
        keys: call.keys.clone(),
        args: call.args.clone(),
        call: None,
    }
}

/// `source` as stock Redis takes it: without the `allow-key-locking` flag.
fn stripped(source: &str) -> String {
    match source.strip_prefix("#!lua flags=allow-key-locking\n") {
        Some(body) => format!("#!lua\n{body}"),
        None => source.to_owned(),
    }
}

/// Loads `case` into the Redis at `redis`, checks that one call succeeds
/// (and, for ours, admits), and returns the SHA1 to call.
pub fn load(redis: &str, case: &Case) -> Result<String, String> {
    let sha = match redis_call(redis, &["SCRIPT", "LOAD", &stripped(&case.source)]) {
        Value::Bulk(sha) => String::from_utf8_lossy(&sha).into_owned(),
        other => return Err(format!("{}: SCRIPT LOAD answered {other:?}", case.label)),
    };
    let n = case.keys.len().to_string();
    let mut call: Vec<&str> = vec!["EVALSHA", &sha, &n];
    call.extend(case.keys.iter().chain(&case.args).map(String::as_str));
    let reply = match redis_call(redis, &call) {
        Value::Error(e) => return Err(format!("{}: {e}", case.label)),
        reply => reply,
    };
    if let Some(call) = &case.call {
        let decision = call
            .decode(&json_of(&reply))
            .and_then(Reply::decision)
            .map_err(|e| e.to_string())?;
        if !decision.admitted() {
            return Err(format!("{}: the first call was denied", case.label));
        }
    }
    Ok(sha)
}

/// A reply as the REST protocol carries it (integers and arrays of them).
fn json_of(reply: &Value) -> Json {
    match reply {
        Value::Int(n) => json!(n),
        Value::Array(items) => Json::Array(items.iter().map(json_of).collect()),
        other => json!(other.to_string()),
    }
}

/// Redis on the last core and redis-benchmark on the others while part 1
/// runs. Left to the scheduler, the benchmark's client now and then shares
/// Redis's core on a 2-core machine, a large source of spread between
/// rounds (what remains comes from the machine itself). Dropping it lets
/// Redis run anywhere again, for the load runs.
pub struct Pinning {
    redis_pid: String,
    cpus: usize,
}

impl Pinning {
    /// Pins the redis-server at `redis_addr`; `None` (nothing pinned) on one
    /// core or where `taskset` cannot.
    pub fn start(redis_addr: &str) -> Option<Pinning> {
        let cpus = std::thread::available_parallelism().ok()?.get();
        if cpus < 2 {
            return None;
        }
        let info = redis_call(redis_addr, &["INFO", "server"]).to_string();
        let redis_pid = info
            .lines()
            .find_map(|l| l.trim().strip_prefix("process_id:"))?
            .to_owned();
        taskset(&["-pc", &(cpus - 1).to_string(), &redis_pid])
            .then_some(Pinning { redis_pid, cpus })
    }

    /// The cores left to the benchmark's client, as `taskset -c` takes them.
    fn client_cpus(&self) -> String {
        format!("0-{}", self.cpus - 2)
    }
}

impl Drop for Pinning {
    fn drop(&mut self) {
        taskset(&["-pc", &format!("0-{}", self.cpus - 1), &self.redis_pid]);
    }
}

fn taskset(args: &[&str]) -> bool {
    Command::new("taskset")
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The order of `n` cases in `round`: a shuffle of its own each round (a
/// fixed multiplier LCG, so runs repeat), where a rotation would keep every
/// case behind the same neighbour, and with it whatever that one leaves.
pub fn round_order(n: usize, round: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ round as u64;
    for i in (1..n).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        order.swap(i, (state >> 33) as usize % (i + 1));
    }
    order
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub ops_per_s: f64,
    pub usec_per_call: f64,
}

/// `calls` EVALSHA from `clients` connections, after resetting Redis's stats;
/// the client on the cores `pinning` leaves it, if any.
pub fn run(
    redis_port: u16,
    sha: &str,
    case: &Case,
    (clients, calls): (u32, u32),
    pinning: Option<&Pinning>,
) -> Result<Sample, String> {
    let addr = format!("127.0.0.1:{redis_port}");
    // Scripts share one Lua heap: without a full collection first, a run
    // pays for the garbage the one before it left.
    redis_call(&addr, &["EVAL", "collectgarbage('collect') return 0", "0"]);
    redis_call(&addr, &["CONFIG", "RESETSTAT"]);
    let mut command = match pinning {
        Some(p) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &p.client_cpus(), "redis-benchmark"]);
            c
        }
        None => Command::new("redis-benchmark"),
    };
    let output = command
        .args(["-h", "127.0.0.1", "-p", &redis_port.to_string()])
        .args([
            "-c",
            &clients.to_string(),
            "-n",
            &calls.to_string(),
            "--csv",
        ])
        .args(["EVALSHA", sha, &case.keys.len().to_string()])
        .args(&case.keys)
        .args(&case.args)
        .output()
        .map_err(|e| format!("cannot run redis-benchmark: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let ops_per_s = csv_rps(&stdout).ok_or_else(|| {
        format!(
            "{}: redis-benchmark printed no result ({}): {stdout} {}",
            case.label,
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    })?;
    let stats = redis_call(&addr, &["INFO", "commandstats"]).to_string();
    let evalsha = command_stats(&stats, "evalsha")
        .ok_or_else(|| format!("{}: no cmdstat_evalsha in INFO", case.label))?;
    if evalsha.failed != 0 || evalsha.calls != u64::from(calls) {
        return Err(format!(
            "{}: {} of {} calls counted, {} failed: the script or its arguments are wrong",
            case.label, evalsha.calls, calls, evalsha.failed
        ));
    }
    Ok(Sample {
        ops_per_s,
        usec_per_call: evalsha.usec_per_call,
    })
}

/// Requests per second from `redis-benchmark --csv`: the second column of
/// the last line, counted from the right because the first (the command)
/// may hold commas.
fn csv_rps(text: &str) -> Option<f64> {
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let fields: Vec<&str> = line.split(',').collect();
    let rps = fields.get(fields.len().checked_sub(7)?)?;
    rps.trim().trim_matches('"').parse().ok()
}

/// One `cmdstat_<name>` line of `INFO commandstats`.
#[derive(Debug, PartialEq)]
struct CommandStats {
    calls: u64,
    usec_per_call: f64,
    failed: u64,
}

fn command_stats(info: &str, name: &str) -> Option<CommandStats> {
    let prefix = format!("cmdstat_{name}:");
    let line = info.lines().find_map(|l| l.trim().strip_prefix(&prefix))?;
    let field = |key: &str| {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
    };
    Some(CommandStats {
        calls: field("calls")?.parse().ok()?,
        usec_per_call: field("usec_per_call")?.parse().ok()?,
        failed: field("failed_calls").unwrap_or("0").parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_runs_every_case_with_other_neighbours() {
        let rounds: Vec<Vec<usize>> = (0..7).map(|r| round_order(10, r)).collect();
        for order in &rounds {
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        }
        // No case runs right after the same one in every round.
        for a in 0..10 {
            for b in 0..10 {
                let behind = |o: &Vec<usize>| o.windows(2).any(|w| w == [a, b]);
                assert!(!rounds.iter().all(behind), "{b} always follows {a}");
            }
        }
        assert_ne!(rounds[0], rounds[1]);
    }

    #[test]
    fn reads_redis_benchmark_csv() {
        let out = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"EVALSHA abc 1 k,x a\",\"48123.45\",\"0.300\",\"0.080\",\"0.279\",\"0.495\",\"0.711\",\"3.407\"\n";
        assert_eq!(csv_rps(out), Some(48123.45));
        assert_eq!(csv_rps("Error: NOSCRIPT\n"), None);
    }

    #[test]
    fn reads_command_stats() {
        let info = "# Commandstats\r\ncmdstat_get:calls=3,usec=1,usec_per_call=0.33,rejected_calls=0,failed_calls=0\r\ncmdstat_evalsha:calls=50000,usec=112500,usec_per_call=2.25,rejected_calls=0,failed_calls=2\r\n";
        assert_eq!(
            command_stats(info, "evalsha"),
            Some(CommandStats {
                calls: 50000,
                usec_per_call: 2.25,
                failed: 2
            })
        );
        assert_eq!(command_stats(info, "eval"), None);
    }

    #[test]
    fn stock_redis_gets_the_source_without_the_flag() {
        let flagged = "#!lua flags=allow-key-locking\nreturn 1\n";
        assert_eq!(stripped(flagged), "#!lua\nreturn 1\n");
        assert_eq!(stripped("return 1"), "return 1");
    }

    #[test]
    fn our_cases_are_lone_rules_on_their_own_path() {
        for case in our_cases().unwrap() {
            // The rule taking overrides sends its client's override key too.
            let keys = if case.label == GCRA_OVERRIDES { 2 } else { 1 };
            assert_eq!(case.keys.len(), keys, "{}", case.label);
            // A rule alone: its own path, named by the rule's word.
            assert!(
                ["gcra", "window"].contains(&case.args[0].as_str()),
                "{}",
                case.label
            );
        }
    }
}
