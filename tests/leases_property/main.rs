//! Quota leases never go over the limit (issues 24 and 31): random arrivals
//! from several simulated isolates, each a real
//! [`Limiter`](edge_limiter::decision::limiter::Limiter) with its own
//! lease table, block cache and copy of the rule-wide overrides, against
//! the real script on `redis-server` through the REST endpoint, with the
//! latency and overlap production has. Each call is sent at t, run at
//! t + d1 and answered at t + d1 + d2 (0 to 50 ms each way, per isolate),
//! an isolate's requests overlap in flight, and its lease refreshes and
//! rule-wide re-reads run after the response, as `waitUntil` runs them.
//! Several rules match a request, at costs above 1, and overrides, blocks
//! and penalties change during the run. An adversary spends every lease
//! at its last instant and tries it past it by half the round trip that
//! brought it, and at a few of those instants the other isolates fill the
//! client's limits: the worst timing (`docs/leases.md`); half the
//! cases on the pinned clock and three in four on Redis's are races, one
//! client under its limit through one isolate and the others only surging.
//! The draw leans toward where a deadline counted from the reply would go
//! over: in most races the client's isolate is far from Redis against the
//! lease's length (replies come late), and in some the client goes quiet
//! between streams, leaving leases unspent at their deadline. Named
//! timelines (`named.rs`) reach each accounting rule's worst state in
//! every run, on both clocks.
//!
//! An admission counts where it left for the origin: a request decided
//! from leased units at the instant its isolate served it, one decided by
//! a call at the instant the script ran the call. The independent checker
//! (`simulate::conform`, sharing no code with the script, the protocol or
//! the model) replays them against the figures an operator had in force:
//! none may go over. No request is decided from units that, by docs/leases.md,
//! its isolate does not hold (`ledger.rs`). With leases off, every request is decided by
//! one call, as the reference model decides it when the script ran: its
//! own, or, for requests that came while a call for their client was in
//! flight in their isolate, the one call that decided them together, in
//! the order the model then decides them.
//!
//! Two timelines: the script's clock pinned to a virtual one (tokio's
//! paused clock: each call runs at t + d1 exactly, so the checker's times
//! are exact), and Redis's own clock with real delays (the checker takes
//! a call's instant as the span from just before it was sent to just after
//! its reply, and every placement inside it must conform).
#![cfg(not(target_arch = "wasm32"))]

mod check;
mod draw;
mod ledger;
mod named;
mod run;
#[path = "../support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};

use edge_limiter::rules::config::Config;
use proptest::{
    prelude::*,
    test_runner::{TestCaseError, TestRunner},
};
use serde_json::json;
use support::Backend;

use check::overs;
use draw::{case, Arrival, Case, Isolate, Limit, RuleDraw, Timeline};
use run::{run_case, Aim, Role, Seen};

thread_local! {
    /// Redis behind the REST endpoint, and the runtime its calls run on
    /// (on a thread of their own: see `run::Run::redis`).
    static BACKEND: (Backend, tokio::runtime::Runtime) = (
        Backend::start(),
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap(),
    );
}

/// Totals over a test's cases, shown at its end.
struct Totals {
    cases: AtomicU64,
    requests: AtomicU64,
    local: AtomicU64,
    drawn: AtomicU64,
    drawn_local: AtomicU64,
    /// Requests decided by a call another request sent, with them.
    shared: AtomicU64,
    /// The adversary's requests past a lease's deadline, and of them those
    /// its isolate held units for only by deadlines counted from the reply.
    past: AtomicU64,
    decisive: AtomicU64,
}

impl Totals {
    const fn new() -> Totals {
        Totals {
            cases: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            local: AtomicU64::new(0),
            drawn: AtomicU64::new(0),
            drawn_local: AtomicU64::new(0),
            shared: AtomicU64::new(0),
            past: AtomicU64::new(0),
            decisive: AtomicU64::new(0),
        }
    }

    fn add(&self, seen: &Seen) {
        self.requests.fetch_add(seen.requests, Ordering::Relaxed);
        self.local.fetch_add(seen.local, Ordering::Relaxed);
        self.drawn.fetch_add(seen.drawn, Ordering::Relaxed);
        self.drawn_local
            .fetch_add(seen.drawn_local, Ordering::Relaxed);
        self.shared.fetch_add(seen.shared, Ordering::Relaxed);
        let past = seen
            .probes
            .iter()
            .filter(|p| p.role == Role::Spend(Aim::Past));
        self.past.fetch_add(past.count() as u64, Ordering::Relaxed);
        let decisive = seen.decisive(Role::Spend(Aim::Past));
        self.decisive.fetch_add(decisive as u64, Ordering::Relaxed);
    }
}

static PINNED: Totals = Totals::new();
static REDIS_CLOCK: Totals = Totals::new();

/// One case on `timeline`, leased: no request from units its isolate
/// does not hold, none over the figures in force. On the pinned timeline,
/// then with leases off: one call a request, each as the model decides it.
fn check(timeline: Timeline, totals: &Totals, case: Case) -> Result<(), TestCaseError> {
    let case = match timeline {
        Timeline::Pinned => case,
        Timeline::Redis => case.within(3000),
    };
    let n = totals.cases.fetch_add(1, Ordering::Relaxed);
    let t0 = 1_795_168_800_000 + n * 1_000_000;
    let up_ms = case.most_up_ms();
    BACKEND.with(|(backend, redis)| {
        let leasing = case.config(true);
        let ip = format!("10.{}.{}.{}", timeline as u8, n / 200, n % 200);
        let seen = run_case(
            (backend, redis),
            timeline,
            (&case, &leasing, &ip),
            t0,
            false,
        );
        prop_assert_eq!(seen.errors, 0);
        prop_assert!(seen.unbacked.is_empty(), "{}", seen.unbacked.join("\n"));
        let over = overs(&seen, &leasing, &ip, up_ms);
        prop_assert!(over.is_empty(), "leased: {}", over.join("\n"));
        totals.add(&seen);
        if timeline == Timeline::Redis {
            return Ok(());
        }
        let plain = case.config(false);
        let ip = format!("10.9.{}.{}", n / 200, n % 200);
        let seen = run_case((backend, redis), timeline, (&case, &plain, &ip), t0, true);
        totals.shared.fetch_add(seen.shared, Ordering::Relaxed);
        prop_assert_eq!(seen.errors, 0);
        prop_assert_eq!((seen.decides + seen.shared, seen.local), (seen.requests, 0));
        prop_assert!(
            seen.disagreements.is_empty(),
            "leases off: {}",
            seen.disagreements.join("\n")
        );
        let over = overs(&seen, &plain, &ip, up_ms);
        prop_assert!(over.is_empty(), "leases off: {}", over.join("\n"));
        Ok(())
    })
}

/// Runs `cases` cases (PROPTEST_CASES more) on `timeline`, then shows
/// how many requests leases decided.
fn property(timeline: Timeline, totals: &Totals, cases: u32) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(cases);
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        // A case takes a second or two on real time: a few steps of
        // shrinking, then the case as it failed.
        max_shrink_iters: match timeline {
            Timeline::Pinned => 64,
            Timeline::Redis => 4,
        },
        ..ProptestConfig::default()
    });
    if let Err(e) = runner.run(&case(timeline), |c| check(timeline, totals, c)) {
        panic!("{e}");
    }
    // The cases must exercise leases, not only the calls around them, and
    // requests decided together.
    let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
    let (local, total) = (load(&totals.local), load(&totals.requests));
    let (drawn_local, drawn) = (load(&totals.drawn_local), load(&totals.drawn));
    let shared = load(&totals.shared);
    let (past, decisive) = (load(&totals.past), load(&totals.decisive));
    eprintln!(
        "{timeline:?}: {local} of {total} requests decided from leases in {} cases \
         ({drawn_local} of the {drawn} drawn, the rest the adversary's); \
         {shared} decided by a call another request sent; {decisive} of the \
         adversary's {past} requests past a lease's deadline came while its \
         isolate held units only by deadlines counted from the reply",
        load(&totals.cases)
    );
    // On real time a loaded machine stretches every round trip, which
    // leases are sized by, and most races are drawn far from Redis: fewer
    // leases there (46 of 400 seen under a parallel build), still some.
    // Pinned, the draws alone decide: 1022 of 5134 (19.9 %) in one run.
    let share = match timeline {
        Timeline::Pinned => 6,
        Timeline::Redis => 20,
    };
    assert!(
        drawn_local * share >= drawn,
        "only {drawn_local} of {drawn} drawn requests decided from leases"
    );
    assert!(shared > 0, "no request was decided with others");
    // Where a deadline counted from the reply would go over: the pinned
    // clock's many cases reach it in every run. Redis's few reach it in
    // most; its named timelines, in every one.
    if timeline == Timeline::Pinned {
        assert!(
            decisive > 0,
            "no request came past a lease's deadline with units held only by a later one"
        );
    }
}

#[test]
fn leased_admissions_never_go_over_the_limit_on_a_pinned_clock() {
    // PROPTEST_CASES runs more, e.g. 1000 before a release.
    property(Timeline::Pinned, &PINNED, 48);
}

#[test]
fn leased_admissions_never_go_over_the_limit_on_redis_clock() {
    property(Timeline::Redis, &REDIS_CLOCK, 8);
}

/// Leases are used: a hot key through two isolates 20 ms from Redis makes
/// far fewer calls than requests, and is still never over.
#[test]
fn a_hot_key_is_mostly_decided_from_leases() {
    let way = Isolate {
        up_ms: 20,
        down_ms: 20,
        origin_ms: 5,
    };
    // 70 per second, alternating between two isolates.
    let case = Case {
        rules: vec![RuleDraw {
            limit: Limit::Gcra {
                rate: 100,
                period_ms: 1000,
                burst: 100,
            },
            lease: None,
            cost: (1, 1),
            penalty_ms: None,
            overrides: false,
        }],
        isolates: vec![way, way],
        arrivals: (0..700)
            // 400ths of twice 10 ms: 16 or 14 ms apart.
            .map(|i| Arrival {
                wait: if i % 7 == 0 { 320 } else { 280 },
                isolate: i % 2,
                post: false,
            })
            .collect(),
        changes: vec![],
        seed: 1,
        adversary: None,
        phase_ms: None,
    };
    let config = Config::from_json(&json!({"rules": [{"name": "r0", "key": ["ip"],
        "algorithm": "gcra", "rate": 100, "period": 1000, "burst": 100,
        "lease": 20, "lease_for": 500}]}))
    .unwrap();
    BACKEND.with(|(backend, redis)| {
        let ip = "10.8.8.8";
        let at = 1_795_000_000_000;
        let seen = run_case(
            (backend, redis),
            Timeline::Pinned,
            (&case, &config, ip),
            at,
            false,
        );
        assert_eq!(overs(&seen, &config, ip, 20), Vec::<String>::new());
        assert!(seen.unbacked.is_empty(), "{:?}", seen.unbacked);
        let admitted = seen.charged.len();
        eprintln!(
            "{} calls, {admitted} admitted of {} requests",
            seen.decides, seen.requests
        );
        assert!(admitted >= 690, "{admitted} admitted");
        assert!(
            seen.decides * 5 <= seen.requests,
            "{} calls for {} requests",
            seen.decides,
            seen.requests
        );
    });
}
