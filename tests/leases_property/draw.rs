//! The cases: rules, isolates, arrivals and an operator's changes, drawn
//! for a timeline, and the configuration and arrival times they make.

use std::ops::Range;

use edge_limiter::rules::{config::Config, lease::Lease, policy::Policy};
use proptest::prelude::*;
use serde_json::{json, Value};

/// Which clock the script runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeline {
    /// The call's time argument, on a virtual clock.
    Pinned,
    /// Redis's own, on real time.
    Redis,
}

/// A rule's figures as drawn.
#[derive(Debug, Clone)]
pub enum Limit {
    /// rate per period (ms), burst.
    Gcra {
        rate: u64,
        period_ms: u64,
        burst: u64,
    },
    /// (duration, limit, precision) per window, ms.
    Windows(Vec<(u64, u64, u64)>),
}

impl Limit {
    /// Mean milliseconds per unit the limit allows.
    fn spacing_ms(&self) -> u64 {
        match self {
            Limit::Gcra {
                rate, period_ms, ..
            } => (period_ms / rate).max(1),
            Limit::Windows(ws) => (ws[0].0 / ws[0].1).max(1),
        }
    }
}

/// One rule of a case.
#[derive(Debug, Clone)]
pub struct RuleDraw {
    pub limit: Limit,
    /// The lease's size and (GCRA) length, each in quarters of the most
    /// the figures allow; `None`: no lease.
    pub lease: Option<(u64, u64)>,
    /// What a GET and a POST cost.
    pub cost: (u64, u64),
    pub penalty_ms: Option<u64>,
    pub overrides: bool,
}

/// One isolate: its calls' most time to Redis and back (ms; each call
/// takes between half of it and all of it), and the origin's answer time.
#[derive(Debug, Clone, Copy)]
pub struct Isolate {
    pub up_ms: u64,
    pub down_ms: u64,
    pub origin_ms: u64,
}

/// One request: how long after the previous one (in 400ths of twice the
/// tightest rule's spacing), from which isolate, and whether a POST.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub wait: u64,
    pub isolate: usize,
    pub post: bool,
}

/// What an operator does to a rule's overrides.
#[derive(Debug, Clone, Copy)]
pub enum Change {
    /// The rule's figures times `quarters / 4`.
    Scale(u64),
    Block,
    Clear,
}

/// A change made when arrival `at` comes, to the client's override of
/// `rule` or (`wide`) the rule's for every client.
#[derive(Debug, Clone)]
pub struct ChangeDraw {
    pub at: usize,
    pub rule: usize,
    pub wide: bool,
    pub change: Change,
}

#[derive(Debug, Clone)]
pub struct Case {
    pub rules: Vec<RuleDraw>,
    pub isolates: Vec<Isolate>,
    pub arrivals: Vec<Arrival>,
    pub changes: Vec<ChangeDraw>,
    /// Seeds each call's latency within its isolate's.
    pub seed: u64,
    /// Whether each lease is spent at its last instant and tried past it,
    /// and at how many of those instants the other isolates surge.
    pub adversary: Option<u64>,
    /// Where given, the arrivals are moved so that the first comes this
    /// long (ms) after one of the first rule's buckets begins, for the
    /// run's client: a timeline about a window's bucket.
    pub phase_ms: Option<u64>,
}

/// What a timeline's cases are drawn from.
struct Shape {
    /// About the mean ms per unit a case's rules allow.
    units: Range<u64>,
    limits: Range<u64>,
    bursts: Range<u64>,
    buckets: Range<u64>,
    /// Windowed rules per GCRA rule.
    windowed: u32,
    leasing: f64,
    penalized: f64,
    rules: usize,
    isolates: usize,
    races: f64,
    /// The most a far isolate's call takes each way, ms: two round trips
    /// (a request waiting in line behind its client's call, then decided
    /// by the next) well within a call's budget of a second.
    farthest_ms: u64,
}

impl Timeline {
    fn shape(self) -> Shape {
        match self {
            // Limits a surge fills at little cost.
            Timeline::Pinned => Shape {
                units: 5..200,
                limits: 8..40,
                bursts: 4..40,
                buckets: 1..6,
                windowed: 1,
                leasing: 0.9,
                penalized: 0.15,
                rules: 3,
                isolates: 4,
                races: 0.5,
                farthest_ms: 200,
            },
            // Fewer cases on real time, three seconds or so each: mostly
            // races, under leases that outlast a call's round trip.
            Timeline::Redis => Shape {
                units: 15..40,
                limits: 10..40,
                bursts: 15..40,
                buckets: 1..3,
                windowed: 2,
                leasing: 0.95,
                penalized: 0.05,
                rules: 2,
                isolates: 3,
                races: 0.75,
                farthest_ms: 150,
            },
        }
    }
}

/// GCRA figures allowing about one unit per `unit_ms` (from half to twice
/// that), so that a case's rules are within reach of each other.
fn gcra(bursts: Range<u64>, unit_ms: u64) -> impl Strategy<Value = Limit> {
    (1u64..50, 2u64..=8, bursts).prop_map(move |(rate, quarters, burst)| Limit::Gcra {
        rate,
        period_ms: (rate * unit_ms * quarters / 4).max(rate),
        burst,
    })
}

/// Windows allowing about one unit per `unit_ms`, as [`gcra`].
fn windows(shape: &Shape, unit_ms: u64) -> impl Strategy<Value = Limit> {
    (
        (shape.limits.clone(), shape.buckets.clone(), 2u64..=8),
        prop::option::of((2u64..6, 2u64..4)),
    )
        .prop_map(move |((limit, buckets, quarters), longer)| {
            let precision = (limit * unit_ms * quarters / 4 / buckets).max(1);
            let duration = precision * buckets;
            let mut ws = vec![(duration, limit, precision)];
            if let Some((times, more)) = longer {
                ws.push((duration * times, limit * more, duration));
            }
            Limit::Windows(ws)
        })
}

fn rule(shape: &Shape, unit_ms: u64) -> impl Strategy<Value = RuleDraw> {
    (
        prop_oneof![
            1 => gcra(shape.bursts.clone(), unit_ms),
            shape.windowed => windows(shape, unit_ms),
        ],
        prop::option::weighted(shape.leasing, (1u64..=4, 1u64..=4)),
        (1u64..=2, 1u64..=4),
        prop::option::weighted(shape.penalized, 50u64..2000),
        prop::bool::weighted(0.7),
    )
        .prop_map(|(limit, lease, cost, penalty_ms, overrides)| RuleDraw {
            limit,
            lease,
            cost,
            penalty_ms,
            overrides,
        })
}

/// A race's one rule: GCRA with room for a long lease of a few units,
/// where a lease charged at its grant goes over.
fn raced(shape: &Shape, unit_ms: u64) -> impl Strategy<Value = RuleDraw> {
    let bursts = shape.bursts.start.max(8)..shape.bursts.end;
    (gcra(bursts, unit_ms), 1u64..=2, 3u64..=4, prop::bool::ANY).prop_map(
        |(limit, share, length, overrides)| RuleDraw {
            limit,
            lease: Some((share, length)),
            cost: (1, 1),
            penalty_ms: None,
            overrides,
        },
    )
}

/// A case's rules, mostly one (a request is decided from leases only
/// when every rule holds units), and a race's rule.
fn rules(timeline: Timeline) -> impl Strategy<Value = (Vec<RuleDraw>, RuleDraw)> {
    timeline.shape().units.prop_flat_map(move |unit_ms| {
        let shape = timeline.shape();
        let count =
            (prop::bool::weighted(0.5), 2..=shape.rules)
                .prop_map(|(one, many)| if one { 1 } else { many });
        let rules = count
            .prop_flat_map(move |n| prop::collection::vec(rule(&timeline.shape(), unit_ms), n));
        (rules, raced(&shape, unit_ms))
    })
}

pub fn case(timeline: Timeline) -> impl Strategy<Value = Case> {
    let shape = timeline.shape();
    let isolate =
        (0u64..=50, 0u64..=50, 0u64..=20).prop_map(|(up_ms, down_ms, origin_ms)| Isolate {
            up_ms,
            down_ms,
            origin_ms,
        });
    let change = (
        0usize..1000,
        0usize..3,
        prop::bool::weighted(0.3),
        prop_oneof![
            3 => (2u64..=8).prop_map(Change::Scale),
            1 => Just(Change::Block),
            2 => Just(Change::Clear),
        ],
    )
        .prop_map(|(at, rule, wide, change)| ChangeDraw {
            at,
            rule,
            wide,
            change,
        });
    (
        rules(timeline),
        prop::collection::vec(isolate, 1..=shape.isolates),
        prop::collection::vec((0u64..100, 0usize..4, prop::bool::weighted(0.3)), 40..160),
        // Quiet spells and surges, 16 arrivals each: a lease granted in
        // one, and spent in the next.
        prop::collection::vec(0u32..5, 16),
        prop::collection::vec(change, 0..=4),
        any::<u64>(),
        // A race: one client under its limit through one isolate, the
        // others only surging at its leases' last instants, as in
        // docs/leases.md's example; in four races of five, that
        // isolate far from Redis against the lease's length.
        (prop::bool::weighted(shape.races), 0u64..=4),
    )
        .prop_map(
            move |(
                (mut rules, raced),
                mut isolates,
                arrivals,
                phases,
                changes,
                seed,
                (race, far),
            )| {
                if race {
                    rules = vec![raced];
                    if isolates.len() == 1 {
                        isolates.push(isolates[0]);
                    }
                }
                let arrivals: Vec<Arrival> = arrivals
                    .into_iter()
                    .enumerate()
                    .map(|(k, (wait, isolate, post))| match race {
                        // 1.2 to 3 times the spacing.
                        true => Arrival {
                            wait: 240 + wait * 36 / 10,
                            isolate: 0,
                            post,
                        },
                        false => Arrival {
                            wait: wait << phases[k / 16 % phases.len()],
                            isolate: isolate % isolates.len(),
                            post,
                        },
                    })
                    .collect();
                let changes = changes
                    .into_iter()
                    .map(|c| ChangeDraw {
                        at: c.at % arrivals.len(),
                        rule: c.rule % rules.len(),
                        ..c
                    })
                    .collect();
                let mut case = Case {
                    rules,
                    isolates,
                    arrivals,
                    changes,
                    seed,
                    adversary: Some(if race { 6 } else { 2 }),
                    phase_ms: None,
                };
                if race && far > 0 {
                    case.far_lead(far, timeline.shape().farthest_ms);
                }
                // In two races of five, quiet spells between streams.
                if race && far >= 3 {
                    case.quiet_spells(6 * far as usize);
                }
                case
            },
        )
}

impl Case {
    /// The case's rules, named `r0`, `r1`..., `leasing` or not; each lease
    /// as large and as long as drawn, when the figures allow one.
    pub fn config(&self, leasing: bool) -> Config {
        let rules: Vec<Value> = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut rule = match &r.limit {
                    Limit::Gcra {
                        rate,
                        period_ms,
                        burst,
                    } => {
                        json!({"algorithm": "gcra", "rate": rate, "period": period_ms, "burst": burst})
                    }
                    Limit::Windows(ws) => json!({"algorithm": "windowed", "windows": ws}),
                };
                rule["name"] = json!(format!("r{i}"));
                rule["key"] = json!(["ip"]);
                rule["cost"] = json!({"GET": r.cost.0, "POST": r.cost.1});
                rule["overrides"] = json!(r.overrides);
                if let Some(ms) = r.penalty_ms {
                    rule["penalty"] = json!(ms);
                }
                match (leasing, r.lease) {
                    (true, Some(lease)) => leased(rule, lease),
                    _ => rule,
                }
            })
            .collect();
        Config::from_json(&json!({ "rules": rules })).expect("drawn rules are valid")
    }

    /// The arrivals' times from `t0`, ms: gaps up to twice the tightest
    /// rule's spacing (a GET's cost of units) times a quarter to 4, so
    /// that requests come from well under the limit to well over it.
    pub fn times(&self, t0: u64) -> Vec<u64> {
        let spacing = self.spacing_ms();
        let mut now = t0;
        self.arrivals
            .iter()
            .map(|a| {
                now += a.wait * 2 * spacing / 400;
                now
            })
            .collect()
    }

    /// The case cut to the arrivals that come within `ms` (8 at least).
    pub fn within(mut self, ms: u64) -> Case {
        let times = self.times(0);
        let most = times.iter().take_while(|&&t| t <= ms).count().max(8);
        self.arrivals.truncate(most);
        let n = self.arrivals.len();
        self.changes.retain(|c| c.at < n);
        self
    }

    /// The tightest rule's mean spacing at a GET's cost, ms.
    pub fn spacing_ms(&self) -> u64 {
        let spacing = self.rules.iter().map(|r| r.limit.spacing_ms() * r.cost.0);
        spacing.max().unwrap_or(1)
    }

    /// The first isolate (a race's client's) as far from Redis each way
    /// as `sixteenths` of the first rule's lease length, at most
    /// `most_ms`: its replies come late against the lease, and a deadline
    /// counted from them lies up to half the lease past the sending's.
    fn far_lead(&mut self, sixteenths: u64, most_ms: u64) {
        let Some(lease) = self.config(true).rules[0].lease else {
            return;
        };
        let way_ms = (lease.for_ms * sixteenths / 16).min(most_ms);
        self.isolates[0].up_ms = way_ms;
        self.isolates[0].down_ms = way_ms;
    }

    /// The client goes quiet after every `every` arrivals, for the first
    /// rule's lease length and two round trips of the first isolate: the
    /// leases its last arrivals brought end with units unspent, and the
    /// adversary's spends past their deadlines find no newer lease.
    fn quiet_spells(&mut self, every: usize) {
        let Some(lease) = self.config(true).rules[0].lease else {
            return;
        };
        let way = self.isolates[0];
        let quiet_ms = lease.for_ms + 2 * (way.up_ms + way.down_ms);
        // In 400ths of twice the spacing, as every wait.
        let quiet = quiet_ms * 200 / self.spacing_ms();
        for a in self.arrivals.iter_mut().skip(every).step_by(every) {
            a.wait += quiet;
        }
    }

    /// The longest one-way time to Redis of any isolate, ms.
    pub fn most_up_ms(&self) -> u64 {
        self.isolates.iter().map(|i| i.up_ms).max().unwrap_or(0)
    }
}

/// `rule` with a lease of `share` quarters of the most units its figures
/// allow, lasting (GCRA) `length` quarters of the longest for those; as
/// it was when the figures allow none.
fn leased(rule: Value, (share, length): (u64, u64)) -> Value {
    let plain =
        Config::from_json(&json!({ "rules": [rule.clone()] })).expect("drawn figures are valid");
    let policy = &plain.rules[0].policy;
    let units = (Lease::largest(policy, 0) * share / 4).max(1);
    let mut leased = rule.clone();
    leased["lease"] = json!(units);
    if let Policy::Gcra(_) = policy {
        let ms = Lease::longest_for_ms(policy, units) * length / 4;
        leased["lease_for"] = json!(ms.max(1));
    }
    match Config::from_json(&json!({ "rules": [leased.clone()] })) {
        Ok(_) => leased,
        Err(_) => rule,
    }
}
