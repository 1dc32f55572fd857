//! One limit across regions never goes over (issue 48): a shared rule's
//! state at the home, pools in two or three other regions' Redis, each a
//! real `redis-server` behind the REST endpoint, on a timeline with the
//! latencies production has.
//!
//! Each region's requests are spent from its pool by one nearby call;
//! one the pool cannot cover goes to the home, one far call, exact, which
//! also asks for the top-up that spend asked for. A spend that finds the
//! pool low asks for a top-up in the background: the home grants it after
//! a far trip, and the region writes it a far trip later. Far trips take
//! 10 to 120 ms each way, near ones 0 to 5, drawn per call, so top-ups
//! overlap each other, far decisions and spends. Each region's clock is
//! skewed from the home's by up to 30 s either way, so anything that
//! compared two clocks would go over. An adversary spends what a pool
//! holds at its last instant, as the spend's reply tells it, and clients
//! at the home fill the limit meanwhile.
//!
//! An admission counts where it was decided: a pool's at the instant its
//! spend ran, a far one's when the home ran it. The checker
//! (`simulate::conform`, sharing no code with the scripts) replays them on
//! the home's clock against the rule's figures: none may go over.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::{cmp::Reverse, collections::BinaryHeap};

use edge_limiter::{
    decision::transport::{
        keys::{pool_key, rule_key, window_offset},
        protocol::{credit, run, spend, Check, Credit, LeaseAsk, PoolSpend, Reply, ScriptCall},
    },
    operator::simulate::conform::over_limit,
    rules::config::Config,
};
use proptest::{prelude::*, test_runner::TestRunner};
use serde_json::json;
use support::{Backend, BUDGET};

/// The pinned clock's start: every region's clock is skewed from it.
const T0: u64 = 1_795_168_800_000;

/// A shared rule drawn: GCRA or windows.
#[derive(Debug, Clone)]
enum Figures {
    Gcra {
        rate: u64,
        period_s: u64,
        burst: u64,
    },
    Window {
        limit: u64,
        duration_s: u64,
        buckets: u64,
    },
}

/// One region's traffic: requests at these ms from the start, each of
/// this cost; how far its clock lies from the home's.
#[derive(Debug, Clone)]
struct Place {
    arrivals: Vec<(u64, u64)>,
    skew_ms: i64,
}

#[derive(Debug, Clone)]
struct Case {
    figures: Figures,
    /// The home's own clients, decided there directly, then the other
    /// regions'.
    home: Vec<(u64, u64)>,
    regions: Vec<Place>,
    /// Per call, the latency each way: near, far (ms), drawn in turn.
    near: Vec<u64>,
    far: Vec<u64>,
    /// Whether the adversary spends a pool at its last instant.
    adversary: bool,
    /// Each region's own share of a GCRA rule's burst (0: none).
    share: u64,
    /// Units each spend asks to move to its isolate (0: none), and for
    /// how long at most, ms: the isolate spends them at their last instant.
    lease: (u64, u64),
}

fn arrivals(span_ms: u64, most: usize) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (0..span_ms, prop_oneof![4 => Just(1u64), 1 => 1..4u64]),
        0..most,
    )
    .prop_map(|mut a| {
        a.sort();
        a
    })
}

fn case(regions: usize) -> impl Strategy<Value = Case> {
    let figures = prop_oneof![
        (5..40u64, 1..4u64, 10..60u64).prop_map(|(rate, period_s, burst)| Figures::Gcra {
            rate,
            period_s,
            burst
        }),
        (
            10..60u64,
            1..4u64,
            prop::sample::select(vec![1u64, 2, 4, 5])
        )
            .prop_map(|(limit, duration_s, buckets)| Figures::Window {
                limit,
                duration_s,
                buckets
            }),
    ];
    let place = (arrivals(6000, 60), -30_000i64..30_000)
        .prop_map(|(arrivals, skew_ms)| Place { arrivals, skew_ms });
    (
        figures,
        arrivals(6000, 30),
        prop::collection::vec(place, regions),
        prop::collection::vec(0..6u64, 64),
        prop::collection::vec(10..121u64, 64),
        any::<bool>(),
        prop_oneof![Just(0u64), 1..4u64],
        (prop_oneof![Just(0u64), 1..6u64], 1..5000u64),
    )
        .prop_map(
            |(figures, home, regions, near, far, adversary, share, lease)| Case {
                figures,
                home,
                regions,
                near,
                far,
                adversary,
                share,
                lease,
            },
        )
}

impl Case {
    /// The configuration: the shared rule, with as many regions as drawn;
    /// or, not `shared`, the rule's own figures alone, which the checker
    /// holds every admission to.
    fn config(&self, shared: bool) -> Config {
        let mut rule = match self.figures {
            Figures::Gcra {
                rate,
                period_s,
                burst,
            } => json!({
                "algorithm": "gcra", "rate": rate, "period": format!("{period_s}s"), "burst": burst
            }),
            Figures::Window {
                limit,
                duration_s,
                buckets,
            } => {
                let precision = duration_s * 1000 / buckets;
                json!({"algorithm": "windowed",
                       "windows": [[format!("{duration_s}s"), limit, format!("{precision}ms")]]})
            }
        };
        rule["name"] = json!("shared");
        rule["key"] = json!(["ip"]);
        if !shared {
            return Config::from_json(&json!({ "rules": [rule] })).expect("a valid rule");
        }
        rule["regions"] = json!("shared");
        if let Figures::Gcra { burst, .. } = self.figures {
            if self.share > 0 && burst >= 20 {
                rule["region_share"] = json!(self.share);
            }
        }
        let mut regions = vec![json!({"name": "home", "home": true})];
        for (i, _) in self.regions.iter().enumerate() {
            regions.push(json!({"name": format!("r{i}"), "colos": [format!("RG{}", (b'A' + i as u8) as char)]}));
        }
        Config::from_json(&json!({"rules": [rule], "regions": regions})).expect("a valid case")
    }
}

/// What happens next on the timeline, at its instant (ms, home clock).
#[derive(Debug, Clone)]
enum Step {
    /// A client's request at the home, decided there.
    AtHome { cost: u64 },
    /// A request in region `at`, sent by its isolate at `sent`: its spend
    /// runs now.
    Spend {
        at: usize,
        cost: u64,
        adversary: bool,
        sent: u64,
    },
    /// The home decides a request the pool could not cover (cost > 0), or
    /// grants a top-up alone (cost 0), for the spend asked at `asked_us`.
    Home {
        at: usize,
        cost: u64,
        ask: u64,
        asked_us: u64,
    },
    /// The region writes the home's grant.
    Credit {
        at: usize,
        asked_us: u64,
        units: u64,
        ms: u64,
    },
}

/// What a case saw.
#[derive(Default, Debug)]
struct Seen {
    /// Every admission, ms on the home's clock, and its cost.
    admitted: Vec<(u64, u64)>,
    from_pools: u64,
    far: u64,
    /// Top-ups the home granted alone, after a spend's response.
    top_ups: u64,
    /// Units moved to isolates and spent there.
    isolate_held: u64,
    credited: u64,
    /// Credits that came too late for their pending top-up.
    stale: u64,
    last_instant: u64,
}

struct Run<'a> {
    pool_key: String,
    steps: BinaryHeap<Reverse<(u64, usize)>>,
    stash: Vec<Step>,
    near: std::iter::Cycle<std::slice::Iter<'a, u64>>,
    far: std::iter::Cycle<std::slice::Iter<'a, u64>>,
    seen: Seen,
    /// The last call to the home's time there and back (0: none yet).
    home_trip_ms: u64,
}

impl Run<'_> {
    fn at(&mut self, ms: u64, step: Step) {
        let n = self.stash.len();
        self.stash.push(step);
        self.steps.push(Reverse((ms, n)));
    }

    fn near(&mut self) -> u64 {
        *self.near.next().unwrap()
    }

    fn far(&mut self) -> u64 {
        *self.far.next().unwrap()
    }
}

/// A region's clock at home-clock instant `ms`.
fn skewed(ms: u64, skew_ms: i64) -> u64 {
    (ms as i64 + skew_ms) as u64
}

async fn run_case(case: &Case, backends: &[Backend], id: &str) -> Seen {
    let config = case.config(true);
    let rule = &config.rules[0];
    let pool = rule.shared.expect("a shared rule");
    let mut run = Run {
        pool_key: pool_key(&rule_key(rule, &[id])),
        steps: BinaryHeap::new(),
        stash: vec![],
        near: case.near.iter().cycle(),
        far: case.far.iter().cycle(),
        seen: Seen::default(),
        home_trip_ms: 0,
    };
    for &(t, cost) in &case.home {
        run.at(t, Step::AtHome { cost });
    }
    for (at, place) in case.regions.iter().enumerate() {
        for &(t, cost) in &place.arrivals {
            let d = run.near();
            run.at(
                t + d,
                Step::Spend {
                    at,
                    cost,
                    adversary: false,
                    sent: t,
                },
            );
        }
    }
    let (home, regions) = backends.split_first().unwrap();
    while let Some(Reverse((now, n))) = run.steps.pop() {
        let step = run.stash[n].clone();
        match step {
            Step::AtHome { cost } => {
                let call = ScriptCall::decide(&[(Check { rule, cost }, vec![id])], Some(T0 + now));
                let decision = run_call(home, &call).await;
                if decision.admitted() {
                    run.seen.admitted.push((now, cost));
                }
            }
            Step::Spend {
                at,
                cost,
                adversary,
                sent,
            } => {
                let skew = case.regions[at].skew_ms;
                let spent = PoolSpend {
                    key: run.pool_key.clone(),
                    cost,
                    hold_ms: pool.hold_ms,
                    most: pool.most,
                    share: pool.share.map_or((0, 0), |s| (s.units, s.interval_us)),
                    far_ms: run.home_trip_ms,
                    lease: if adversary { (0, 0) } else { case.lease },
                };
                let states = spend(
                    &regions[at].client,
                    &[spent],
                    Some(skewed(T0 + now, skew)),
                    BUDGET,
                )
                .await
                .expect("a spend");
                let state = states[0];
                let back = now + run.near();
                // Units moved to the isolate, spent at the last instant its
                // clock allows, counted from when it sent the spend.
                let (units, ms) = state.leased;
                if units > 0 && sent + ms > back {
                    run.seen.admitted.push((sent + ms - 1, units));
                    run.seen.isolate_held += units;
                }
                if state.covered {
                    run.seen.admitted.push((now, cost));
                    run.seen.from_pools += 1;
                    if adversary {
                        run.seen.last_instant += 1;
                    }
                    // What the pool holds, spent at its last instant as
                    // the reply tells it: the latest a spend can come.
                    if case.adversary && !adversary && state.left > 0 && state.lasts_ms > 0 {
                        let last = back + state.lasts_ms.saturating_sub(1);
                        let go = last.saturating_sub(run.near());
                        for _ in 0..state.left.min(3) {
                            run.at(
                                go.max(now + 1),
                                Step::Spend {
                                    at,
                                    cost: 1,
                                    adversary: true,
                                    sent: go.max(now + 1),
                                },
                            );
                        }
                    }
                }
                let far = run.far();
                match (state.covered, state.ask) {
                    (true, 0) => {}
                    (true, ask) => run.at(
                        back + far,
                        Step::Home {
                            at,
                            cost: 0,
                            ask,
                            asked_us: state.asked_us,
                        },
                    ),
                    (false, ask) => run.at(
                        back + far,
                        Step::Home {
                            at,
                            cost,
                            ask,
                            asked_us: state.asked_us,
                        },
                    ),
                }
            }
            Step::Home {
                at,
                cost,
                ask,
                asked_us,
            } => {
                let lease = LeaseAsk {
                    rule: 0,
                    units: ask,
                    for_ms: pool.hold_ms,
                };
                let call = ScriptCall::decide(&[(Check { rule, cost }, vec![id])], Some(T0 + now))
                    .asking(vec![lease]);
                let decision = run_call(home, &call).await;
                run.seen.top_ups += u64::from(cost == 0);
                if cost > 0 {
                    run.seen.far += 1;
                    if decision.admitted() {
                        run.seen.admitted.push((now, cost));
                    }
                }
                // As the worker does, an ask granted nothing is credited
                // nothing, which ends its pending top-up.
                if ask > 0 {
                    let grant = decision.grants.first();
                    let far = run.far();
                    // As the isolate times its calls to the home: there
                    // and back, this trip's way back taken for both.
                    run.home_trip_ms = 2 * far;
                    let back = now + far;
                    let d = run.near();
                    run.at(
                        back + d,
                        Step::Credit {
                            at,
                            asked_us,
                            units: grant.map_or(0, |g| g.units),
                            ms: grant.map_or(0, |g| g.for_ms),
                        },
                    );
                }
            }
            Step::Credit {
                at,
                asked_us,
                units,
                ms,
            } => {
                let skew = case.regions[at].skew_ms;
                let given = Credit {
                    key: run.pool_key.clone(),
                    asked_us,
                    units,
                    ms,
                    hold_ms: pool.hold_ms,
                    home: (0, 0),
                };
                let went = credit(
                    &regions[at].client,
                    &[given],
                    Some(skewed(T0 + now, skew)),
                    BUDGET,
                )
                .await
                .expect("a credit");
                match went[0] {
                    true => run.seen.credited += 1,
                    false => run.seen.stale += 1,
                }
            }
        }
    }
    run.seen.admitted.sort();
    run.seen
}

async fn run_call(
    home: &Backend,
    call: &ScriptCall,
) -> edge_limiter::decision::outcomes::verdict::Decision {
    run(&home.client, call, BUDGET)
        .await
        .and_then(Reply::decision)
        .expect("a decision")
}

/// Runs `cases` cases over `regions` regions besides the home, checking
/// each, then how much the pools decided.
fn property(regions: usize, cases: u32) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(cases);
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        max_shrink_iters: 32,
        ..ProptestConfig::default()
    });
    // The home's Redis first, then each region's.
    let backends: Vec<Backend> = (0..=regions).map(|_| Backend::start()).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let counter = std::cell::Cell::new(0u64);
    let totals = std::cell::RefCell::new(Seen::default());
    let result = runner.run(&case(regions), |case| {
        let n = counter.get();
        counter.set(n + 1);
        let id = format!("10.{regions}.{}.{}", n / 200, n % 200);
        let seen = rt.block_on(run_case(&case, &backends, &id));
        let config = case.config(false);
        let rule = &config.rules[0];
        let key = rule_key(rule, &[id.as_str()]);
        let offset = window_offset(&key, rule.policy.longest_ms());
        // The checker's instants on the home's pinned clock.
        let charged: Vec<(u64, u64)> = seen.admitted.iter().map(|&(t, c)| (T0 + t, c)).collect();
        let over = over_limit(&rule.policy, offset, &charged);
        prop_assert_eq!(over, 0, "over the limit: {:?}", seen);
        let mut t = totals.borrow_mut();
        t.admitted.extend(seen.admitted.iter().copied());
        t.from_pools += seen.from_pools;
        t.far += seen.far;
        t.credited += seen.credited;
        t.stale += seen.stale;
        t.last_instant += seen.last_instant;
        t.isolate_held += seen.isolate_held;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let t = totals.into_inner();
    eprintln!(
        "{regions} regions: {} admitted, {} from pools ({} at a pool's last instant), \
         {} units held by isolates, {} far decisions; {} top-ups credited, {} too late",
        t.admitted.len(),
        t.from_pools,
        t.last_instant,
        t.isolate_held,
        t.far,
        t.credited,
        t.stale
    );
    // The cases must exercise pools, late spends and far decisions alike.
    assert!(
        t.from_pools * 4 > t.admitted.len() as u64,
        "pools decided too little"
    );
    assert!(t.last_instant > 0 && t.far > 0 && t.credited > 0 && t.isolate_held > 0);
}

/// The home and one other region.
#[test]
fn two_regions_never_go_over_one_limit() {
    property(1, 64);
}

/// The home and two others, whose pools compete for one limit.
#[test]
fn three_regions_never_go_over_one_limit() {
    property(2, 48);
}

/// A home's Redis and one region's, and a runtime to call them from.
fn home_and_one_region() -> (Vec<Backend>, tokio::runtime::Runtime) {
    let backends = (0..2).map(|_| Backend::start()).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    (backends, rt)
}

/// The worst moment for a region's share: a fresh client spends its share
/// in the region while the home admits all it can, at one instant. The
/// home must have kept the share out of its own figures.
#[test]
fn a_regions_share_is_kept_out_of_the_homes_figures() {
    let (backends, rt) = home_and_one_region();
    let rule = json!({"name": "shared", "key": ["ip"], "algorithm": "gcra", "rate": 10,
                      "period": "1s", "burst": 30, "regions": "shared", "region_share": 4});
    let regions = json!([{"name": "home", "home": true}, {"name": "r0", "colos": ["RGA"]}]);
    let config = Config::from_json(&json!({"rules": [rule], "regions": regions})).unwrap();
    let rule = &config.rules[0];
    let pool = rule.shared.unwrap();
    let id = "10.9.9.9";
    let spent = PoolSpend {
        key: pool_key(&rule_key(rule, &[id])),
        cost: 1,
        hold_ms: pool.hold_ms,
        most: pool.most,
        share: pool.share.map_or((0, 0), |s| (s.units, s.interval_us)),
        far_ms: 0,
        lease: (0, 0),
    };
    let admitted = rt.block_on(async {
        let mut admitted = 0;
        for _ in 0..6 {
            let states = spend(
                &backends[1].client,
                std::slice::from_ref(&spent),
                Some(T0),
                BUDGET,
            );
            admitted += u64::from(states.await.unwrap()[0].covered);
        }
        assert_eq!(admitted, 4, "the share, and no more, with no pool granted");
        for _ in 0..40 {
            let call = ScriptCall::decide(&[(Check { rule, cost: 1 }, vec![id])], Some(T0));
            admitted += u64::from(run_call(&backends[0], &call).await.admitted());
        }
        admitted
    });
    assert_eq!(admitted, 30, "the whole burst, the share's part included");
}

/// The far calls a region makes for the bench's clients (part 10), on a
/// timeline 80 ms from the home: a page load the share covers asks the home
/// nothing, and a steady client below the rate is topped up about once a
/// pool's length, never waiting on the home.
#[test]
fn a_page_load_asks_the_home_nothing_and_a_steady_client_once_a_pool() {
    let (backends, rt) = home_and_one_region();
    let of = |arrivals: Vec<(u64, u64)>| Case {
        figures: Figures::Gcra {
            rate: 100,
            period_s: 60,
            burst: 100,
        },
        home: vec![],
        regions: vec![Place {
            arrivals,
            skew_ms: 0,
        }],
        near: vec![1],
        far: vec![80],
        adversary: false,
        share: 5,
        lease: (0, 0),
    };
    let page = rt.block_on(run_case(&of(vec![(0, 1); 4]), &backends, "10.8.0.1"));
    assert_eq!(
        (page.from_pools, page.far, page.top_ups),
        (4, 0, 0),
        "{page:?}"
    );
    // One request, then 40 a gap apart, as the bench's steady client.
    for (gap, id) in [(700, "10.8.0.2"), (720, "10.8.0.3"), (750, "10.8.0.4")] {
        let mut steady: Vec<(u64, u64)> = (0..40).map(|k| (500 + k * gap, 1)).collect();
        steady.insert(0, (0, 1));
        let seen = rt.block_on(run_case(&of(steady), &backends, id));
        assert_eq!((seen.from_pools, seen.far), (41, 0), "{seen:?}");
        // The first top-up when the share runs out (the fourth request of
        // the 40), then one a pool's length (10 s) less a gap and the far
        // trip twice over.
        let (first, last) = (500 + 3 * gap, 500 + 39 * gap);
        let most = 1 + (last - first) / (10_000 - gap - 2 * 160);
        assert!(seen.top_ups <= most, "{gap} ms apart: {seen:?}");
    }
}

/// Units a region moves to an isolate come from one tranche and last no
/// longer than it, though a later one is there: the first tranche while
/// it holds the ask, else the next. A pool written by hand, its nine
/// numbers as `lua/pool.lua` lays them out.
#[test]
fn units_an_isolate_holds_end_with_their_tranche() {
    let (backends, rt) = home_and_one_region();
    let rule = json!({"name": "shared", "key": ["ip"], "algorithm": "gcra", "rate": 10,
                      "period": "1s", "burst": 30, "regions": "shared"});
    let regions = json!([{"name": "home", "home": true}, {"name": "r0", "colos": ["RGA"]}]);
    let config = Config::from_json(&json!({"rules": [rule], "regions": regions})).unwrap();
    let rule = &config.rules[0];
    let pool = rule.shared.unwrap();
    let now_us = T0 * 1000;
    // The first tranche ends in 2 s, the next in 8 s.
    for (n, (first, next, ends_ms)) in [(10, 10, 2000), (2, 10, 8000)].into_iter().enumerate() {
        let key = pool_key(&rule_key(rule, &[&format!("10.6.0.{n}")]));
        let text = format!(
            "{first} {} {next} {} 0 0 0 {now_us} 0",
            now_us + 2_000_000,
            now_us + 8_000_000
        );
        backends[1].redis(&["SET", &key, &text]);
        let asked = PoolSpend {
            key,
            cost: 1,
            hold_ms: pool.hold_ms,
            most: pool.most,
            share: (0, 0),
            far_ms: 0,
            lease: (5, 30_000),
        };
        let states = rt.block_on(spend(&backends[1].client, &[asked], Some(T0), BUDGET));
        let (units, ms) = states.unwrap()[0].leased;
        assert_eq!((units, ms), (5, ends_ms), "{first} and {next} units");
    }
}
