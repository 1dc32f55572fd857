//! Named timelines, run every time beside the random search: one for each
//! accounting rule of `docs/leases.md`, on both clocks, each built to
//! reach the state where breaking its rule goes over. A client streams
//! through one isolate long enough to be leased, then stops, and the
//! adversary spends the leases it was left with at their edges while
//! another isolate fills the client's limit. Each run must reach its state
//! and hold there: nothing over, no unit spent that the isolate did not
//! hold. On Redis's clock every instant is real time, which a busy machine
//! stretches: the timelines leave tens of milliseconds on each side of
//! the instants that matter, and a run that still missed its state (the
//! scheduler woke a request too late) is run again on fresh keys, three
//! runs at most.

use std::sync::atomic::{AtomicU64, Ordering};

use edge_limiter::rules::config::Config;
use serde_json::{json, Value};

use crate::{
    check::overs,
    draw::{Arrival, Case, Isolate, Limit, RuleDraw, Timeline},
    run::{run_case, Aim, Role, Seen},
    BACKEND,
};

/// Runs of named timelines so far: each on keys of its own.
static RUNS: AtomicU64 = AtomicU64::new(0);

/// A timeline, and the state it is for.
struct Named {
    case: Case,
    config: Config,
    /// What the state is, for a run that never reached it.
    state: &'static str,
    /// Whether a run reached it.
    reached: fn(&Seen) -> usize,
}

/// Runs `named` on `timeline` until a run reaches its state (once on the
/// pinned clock, where every run is the same; three times at most on
/// Redis's), each run held to the limit and to the ledger.
fn hold(timeline: Timeline, named: &Named) {
    let runs = match timeline {
        Timeline::Pinned => 1,
        Timeline::Redis => 3,
    };
    let mut spends = String::new();
    for run in 1..=runs {
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        let ip = format!("10.7.{}.{}", n / 200, n % 200);
        let t0 = 1_796_000_000_000 + n * 1_000_000;
        let seen = BACKEND.with(|(backend, redis)| {
            let case = (&named.case, &named.config, ip.as_str());
            run_case((backend, redis), timeline, case, t0, false)
        });
        assert_eq!(seen.errors, 0);
        assert!(seen.unbacked.is_empty(), "{}", seen.unbacked.join("\n"));
        let over = overs(&seen, &named.config, &ip, named.case.most_up_ms());
        assert!(over.is_empty(), "{}", over.join("\n"));
        let reached = (named.reached)(&seen);
        eprintln!(
            "{timeline:?}, run {run}: {} reached {reached} times",
            named.state
        );
        if reached > 0 {
            return;
        }
        spends = seen.spends();
    }
    panic!(
        "{timeline:?}: {} never arose in {runs} runs; the last run's spends:\n{spends}",
        named.state
    );
}

/// A stream of `count` GETs from the first isolate, `every_ms` apart,
/// under `rule`; then the adversary, with `surges` instants at which the
/// second isolate fills the limit.
fn streamed(
    rule: RuleDraw,
    ways: [(u64, u64); 2],
    (count, every_ms): (usize, u64),
    surges: u64,
) -> Case {
    let isolates = ways
        .map(|(up_ms, down_ms)| Isolate {
            up_ms,
            down_ms,
            origin_ms: 5,
        })
        .to_vec();
    let mut case = Case {
        rules: vec![rule],
        isolates,
        arrivals: vec![],
        changes: vec![],
        seed: 7,
        adversary: Some(surges),
        phase_ms: None,
    };
    // Waits are in 400ths of twice the spacing: exact for these figures.
    let wait = every_ms * 200 / case.spacing_ms();
    case.arrivals = (0..count)
        .map(|_| Arrival {
            wait,
            isolate: 0,
            post: false,
        })
        .collect();
    case
}

/// One rule named `r0`, keyed by IP, with `figures` and `lease`.
fn config(figures: Value, lease: Value) -> Config {
    let mut rule = json!({"name": "r0", "key": ["ip"]});
    for (k, v) in figures
        .as_object()
        .into_iter()
        .chain(lease.as_object())
        .flatten()
    {
        rule[k] = v.clone();
    }
    Config::from_json(&json!({ "rules": [rule] })).expect("the timeline's rule is valid")
}

/// 20 a second, a burst of 20; leases of 3 units for 600 ms (at most 650
/// fit). The client streams at 12.5 a second for 640 ms: leased from
/// about half the lease's length on.
fn gcra_stream(ways: [(u64, u64); 2]) -> (Case, Config) {
    let limit = Limit::Gcra {
        rate: 20,
        period_ms: 1000,
        burst: 20,
    };
    let rule = RuleDraw {
        limit,
        lease: None,
        cost: (1, 1),
        penalty_ms: None,
        overrides: false,
    };
    let figures = json!({"algorithm": "gcra", "rate": 20, "period": 1000, "burst": 20});
    let lease = json!({"lease": 3, "lease_for": 600});
    (streamed(rule, ways, (5, 80), 2), config(figures, lease))
}

/// A lease's deadline counts from the sending of the call that brought it:
/// the client's isolate is 30 to 60 ms from Redis each way, and the
/// adversary spends its last leases half a round trip past their end,
/// when an isolate counting from the reply would still hold them.
fn from_the_sending() -> Named {
    let (case, config) = gcra_stream([(60, 60), (5, 5)]);
    Named {
        case,
        config,
        state: "a request past a lease's deadline, its isolate holding units only by a deadline counted from the reply,",
        reached: |seen| seen.decisive(Role::Spend(Aim::Past)),
    }
}

/// How many times a lease was spent at its last instant while the other
/// isolate's requests, just then, found the limit full.
fn spent_into_a_full_limit(seen: &Seen) -> usize {
    let denied_surge = |at: u64| {
        let mut probes = seen.probes.iter();
        probes.any(|p| p.role == Role::Surge && p.aimed_ms == at && !p.admitted)
    };
    let last = seen
        .probes
        .iter()
        .filter(|p| p.role == Role::Spend(Aim::Last));
    last.filter(|p| p.leased && p.admitted && denied_surge(p.aimed_ms))
        .count()
}

/// A lease's units are charged at its deadline: the adversary spends them
/// at their last instant, just after the other isolate's requests took
/// all the limit had. Charged at the grant, the refill between the grant
/// and the spend is counted twice, as in the table of
/// `docs/leases.md`.
fn at_the_deadline() -> Named {
    let (case, config) = gcra_stream([(10, 10), (5, 5)]);
    Named {
        case,
        config,
        state: "a lease spent at its last instant into a limit the other isolate had just filled",
        reached: spent_into_a_full_limit,
    }
}

/// A window's lease is spent within the bucket that counted it: a fixed
/// window of 200 ms, 20 to a window, and leases asked for all of it,
/// which the window's end cuts short (spent in the next, no window would
/// count them). The client streams at half the limit from just after a
/// window begins until it is leased; the adversary spends the lease at
/// the window's last instant, into a window the other isolate has just
/// filled.
fn within_their_bucket() -> Named {
    let rule = RuleDraw {
        limit: Limit::Windows(vec![(200, 20, 200)]),
        lease: None,
        cost: (1, 1),
        penalty_ms: None,
        overrides: false,
    };
    let mut case = streamed(rule, [(10, 10), (5, 5)], (5, 20), 3);
    case.phase_ms = Some(10);
    let figures = json!({"algorithm": "windowed", "windows": [[200, 20, 200]]});
    let config = config(figures, json!({"lease": 4, "lease_for": 200}));
    Named {
        case,
        config,
        state: "a window's lease spent at its bucket's last instant into a full window",
        reached: spent_into_a_full_limit,
    }
}

#[test]
fn named_deadline_from_the_sending_on_a_pinned_clock() {
    hold(Timeline::Pinned, &from_the_sending());
}

#[test]
fn named_deadline_from_the_sending_on_redis_clock() {
    hold(Timeline::Redis, &from_the_sending());
}

#[test]
fn named_charged_at_the_deadline_on_a_pinned_clock() {
    hold(Timeline::Pinned, &at_the_deadline());
}

#[test]
fn named_charged_at_the_deadline_on_redis_clock() {
    hold(Timeline::Redis, &at_the_deadline());
}

#[test]
fn named_windows_within_their_bucket_on_a_pinned_clock() {
    hold(Timeline::Pinned, &within_their_bucket());
}

#[test]
fn named_windows_within_their_bucket_on_redis_clock() {
    hold(Timeline::Redis, &within_their_bucket());
}
