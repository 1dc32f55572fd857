//! One run of a case: its isolates' requests on a timeline, each call
//! delayed each way, the after-response work, the operator's changes and
//! the adversary's requests, and what all of them did, for the checker.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    future::Future,
    pin::Pin,
    rc::Rc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use edge_limiter::{
    decision::{
        limiter::{Forward, Handled, Limiter, Outcome},
        memory::block_cache::BlockCache,
        memory::in_flight::{InFlight, SharedCall},
        memory::leases::Leases,
        memory::rule_wide::RuleWide,
        outcomes::events::{Action, Event},
        runtime::TokioPause,
        transport::keys::{redis_key, window_offset},
        transport::protocol::{Check, ScriptRunner},
        transport::redis_rest::{RestClient, RestError, Script},
    },
    operator::{limits, simulate::model::Model},
    rules::{
        config::Config, overrides::Override, policy::Policy, request::RequestMeta, rule::Rule,
    },
};
use serde_json::Value;

use crate::{
    draw::{Arrival, Case, Change, ChangeDraw, Timeline},
    ledger::{Granted, Ledger},
    support::Backend,
};

/// What an operator stored, as the checker reads it: an override or none.
pub type Stored = Option<Override>;

/// One admission's charge to one rule.
#[derive(Debug, Clone)]
pub struct Charged {
    /// Its place in the order things happened at Redis and in the isolates.
    pub seq: u64,
    pub rule: usize,
    /// When it was counted (see `conform::Charge`), ms.
    pub from_ms: u64,
    pub to_ms: u64,
    pub cost: u64,
    /// Decided from leased units, not by a call.
    pub leased: bool,
    pub isolate: usize,
    /// Its place in the order when its isolate sent the call.
    pub sent_seq: u64,
}

/// A write of an override key, and when it ran.
#[derive(Debug, Clone)]
pub struct Written {
    pub seq: u64,
    pub from_ms: u64,
    pub to_ms: u64,
    pub stored: Stored,
}

/// An isolate's copy of a rule-wide override, from a read that returned.
#[derive(Debug, Clone)]
pub struct View {
    pub seq: u64,
    pub ms: u64,
    pub stored: Stored,
}

/// A penalty started: its rule, and the span (ms) and place in the order
/// of the call that started it.
#[derive(Debug, Clone, Copy)]
pub struct Penalty {
    pub rule: usize,
    pub from_ms: u64,
    pub to_ms: u64,
    pub seq: u64,
}

/// What a run saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub charged: Vec<Charged>,
    /// Per rule: the client's override key's writes, in order.
    pub own: Vec<Vec<Written>>,
    /// Per rule: the rule-wide key's writes, in order.
    pub wide: Vec<Vec<Written>>,
    /// Per isolate, per rule: its copies of the rule-wide override.
    pub views: Vec<Vec<Vec<View>>>,
    pub penalties: Vec<Penalty>,
    pub requests: u64,
    /// Requests decided from leases.
    pub local: u64,
    /// Of them, the case's own (not the adversary's).
    pub drawn: u64,
    pub drawn_local: u64,
    /// Script calls that decided (requests' and refreshes').
    pub decides: u64,
    /// Requests decided by a call another request of their isolate sent,
    /// with them (a group).
    pub shared: u64,
    /// Requests undecided (a Redis error).
    pub errors: u64,
    /// Requests the model decided otherwise (leases off only).
    pub disagreements: Vec<String>,
    /// The leased units docs/leases.md allows each isolate to spend.
    ledger: Ledger,
    /// Requests decided from units the ledger does not hold.
    pub unbacked: Vec<String>,
    /// The adversary's requests and the surges beside them.
    pub probes: Vec<Probe>,
}

/// What a request of a run is to its case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// One of the case's own arrivals.
    Drawn,
    /// The adversary's, spending a lease at an instant of its choosing.
    Spend(Aim),
    /// Another isolate's, filling the client's limits at such an instant.
    Surge,
}

/// Where the adversary spends a lease against its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aim {
    /// Its last instant, the deadline counted from the sending.
    Last,
    /// Past that by half the call's round trip: before the deadline an
    /// isolate would keep if it counted from the reply.
    Past,
}

/// An adversary's or a surge's request, and how it was decided.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    pub role: Role,
    /// The instant it was aimed at, and when its isolate decided it, ms.
    pub aimed_ms: u64,
    pub decided_ms: u64,
    /// Admitted from leases, not by a call.
    pub leased: bool,
    pub admitted: bool,
    /// Its isolate held units for it, at its arrival, only by deadlines
    /// counted from the reply: an isolate counting them so would have
    /// admitted it from units docs/leases.md says it no longer holds.
    pub decisive: bool,
}

impl Seen {
    /// The adversary's spends, a line each: where each was aimed and when
    /// and how it was decided.
    pub fn spends(&self) -> String {
        let spends = self.probes.iter().filter(|p| p.role != Role::Surge);
        spends
            .map(|p| {
                format!(
                    "{:?} aimed at {}, decided at {}: {}{}{}",
                    p.role,
                    p.aimed_ms,
                    p.decided_ms,
                    if p.admitted { "admitted" } else { "denied" },
                    if p.leased { " from leases" } else { "" },
                    if p.decisive { ", decisive" } else { "" },
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Probes of `role` that were `decisive`.
    pub fn decisive(&self, role: Role) -> usize {
        let probes = self.probes.iter();
        probes.filter(|p| p.role == role && p.decisive).count()
    }
}

/// The index of rule `rN`.
pub fn index_of(name: &str) -> usize {
    name[1..].parse().expect("rules are named r0, r1...")
}

fn rule_index(rule: &Rule) -> usize {
    index_of(&rule.name)
}

/// One run of a case: its clock, Redis, and what it saw.
struct Run<'a> {
    timeline: Timeline,
    /// The virtual clock's start, and its time then (ms).
    start: tokio::time::Instant,
    t0: u64,
    client: &'a RestClient,
    /// The runtime the client's calls run on.
    rest_runtime: &'a tokio::runtime::Runtime,
    config: &'a Config,
    case: &'a Case,
    ip: String,
    seq: Cell<u64>,
    rng: Cell<u64>,
    /// Surges left (see [`Run::surge`]).
    surges: Cell<u64>,
    seen: RefCell<Seen>,
    /// With leases off: the reference model, deciding each call as it runs.
    model: Option<RefCell<Model>>,
    /// Each group call by isolate and number, as its sender saw it, for
    /// the others it decided.
    groups: RefCell<HashMap<(usize, u64), Group>>,
}

/// A group's call as its sender saw it, the model's verdict on each of its
/// requests, and how many of the others are still to read it.
type Group = (ByCall, Vec<bool>, usize);

/// The time on `timeline` (the pinned one starting at `t0` when `start`
/// was), ms.
fn clock_ms(timeline: Timeline, start: tokio::time::Instant, t0: u64) -> u64 {
    match timeline {
        Timeline::Pinned => t0 + start.elapsed().as_millis() as u64,
        Timeline::Redis => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as u64,
    }
}

/// The call that decided a request, as the checker places it.
#[derive(Debug, Clone, Copy)]
struct ByCall {
    /// Its span at Redis (ms) and its place in the order.
    ran: (u64, u64, u64),
    /// When it was sent (ms) and its place in the order then.
    sent: (u64, u64),
    /// What the model decided for the request (leases off).
    model: Option<bool>,
}

impl<'a> Run<'a> {
    fn now_ms(&self) -> u64 {
        clock_ms(self.timeline, self.start, self.t0)
    }

    async fn sleep_until(&self, at_ms: u64) {
        self.sleep(at_ms.saturating_sub(self.now_ms())).await;
    }

    async fn sleep(&self, ms: u64) {
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    fn next_seq(&self) -> u64 {
        self.seq.set(self.seq.get() + 1);
        self.seq.get()
    }

    /// A call's time one way: between half of `most_ms` and all of it.
    fn latency(&self, most_ms: u64) -> u64 {
        // xorshift64*: plenty for spreading latencies.
        let mut x = self.rng.get().max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        most_ms / 2 + r % (most_ms - most_ms / 2 + 1)
    }

    /// Runs `call` against Redis to its end on a thread of its own while
    /// this one waits: so no time passes on the virtual clock, and every
    /// isolate's calls reach Redis one at a time, in the timeline's order.
    fn redis<T: Send, F: Future<Output = T>>(
        &self,
        call: impl FnOnce(&'a RestClient) -> F + Send,
    ) -> T {
        let (client, runtime) = (self.client, self.rest_runtime);
        std::thread::scope(|s| {
            s.spawn(move || runtime.block_on(call(client)))
                .join()
                .expect("the Redis thread")
        })
    }

    /// Requests from the isolates other than `i` (from `i` if alone) that
    /// reach Redis about `at_ms` and fill the tightest rule, while the
    /// case's surges last.
    fn surge(&self, i: usize, at_ms: u64) -> Vec<(Arrival, u64)> {
        if self.surges.get() == 0 {
            return vec![];
        }
        self.surges.set(self.surges.get() - 1);
        let n = self.case.isolates.len();
        let rules = self.config.rules.iter();
        let fill = rules.map(|r| r.policy.capacity() / r.cost.for_method("GET"));
        (0..fill.min().unwrap_or(0) + 2)
            .map(|k| {
                let isolate = match n {
                    1 => i,
                    n => (i + 1 + k as usize % (n - 1)) % n,
                };
                let up = self.case.isolates[isolate].up_ms;
                let arrival = Arrival {
                    wait: 0,
                    isolate,
                    post: false,
                };
                (arrival, at_ms.saturating_sub(up / 2 + 1))
            })
            .collect()
    }

    /// The rule-wide override stored for `rule` just before `seq`.
    fn wide_at(&self, rule: usize, seq: u64) -> Stored {
        let seen = self.seen.borrow();
        let writes = seen.wide[rule].iter().take_while(|w| w.seq < seq);
        writes.last().and_then(|w| w.stored.clone())
    }

    /// Isolate `i`'s copy of `rule`'s rule-wide override just before `seq`.
    fn view_at(&self, i: usize, rule: usize, seq: u64) -> Stored {
        let seen = self.seen.borrow();
        let held = seen.views[i][rule].iter().take_while(|v| v.seq < seq);
        held.last().and_then(|v| v.stored.clone())
    }

    /// The call that decided a request of isolate `i` (its own `link`'s,
    /// or the group's it was decided in); `None` for none.
    fn by_call(&self, i: usize, link: &Link<'_, '_>, handled: &Handled<'_>) -> Option<ByCall> {
        let own = |place: usize| {
            Some(ByCall {
                ran: link.ran.get()?,
                sent: link.sent.get()?,
                model: link.model_admitted.borrow().get(place).copied(),
            })
        };
        let Some(SharedCall { call, place, sent }) = handled.shared else {
            return own(0);
        };
        let mut groups = self.groups.borrow_mut();
        if sent {
            // The others resume only once this request's call returned.
            let by = own(place)?;
            let model = link.model_admitted.borrow().clone();
            groups.insert((i, call), (by, model, place));
            return Some(by);
        }
        self.seen.borrow_mut().shared += 1;
        let (by, model, left) = groups.get_mut(&(i, call))?;
        let by = ByCall {
            model: model.get(place).copied(),
            ..*by
        };
        *left -= 1;
        if *left == 0 {
            groups.remove(&(i, call));
        }
        Some(by)
    }

    /// When the bucket holding `at_ms` ends, for a windowed `rule` (the
    /// earliest over its windows, at the client's offset); `None` for GCRA.
    fn bucket_end(&self, rule: &Rule, at_ms: u64) -> Option<u64> {
        let Policy::Windowed(ws) = &rule.policy else {
            return None;
        };
        let key = redis_key(&rule.name, &[self.ip.as_str()]);
        let offset = window_offset(&key, rule.policy.longest_ms());
        let ends = ws.iter().map(|w| {
            let precision = w.precision_ms();
            at_ms + precision - (at_ms + offset) % precision
        });
        ends.min()
    }

    /// Keeps in the ledger the leases `events` report, brought to isolate
    /// `i` by a call sent at `sent_ms`, run by `ran_ms` at the latest and
    /// answered at `reply_ms`.
    fn keep(&self, i: usize, events: &[Event], (sent_ms, ran_ms, reply_ms): (u64, u64, u64)) {
        for e in events.iter().filter(|e| e.action == Action::LeaseGrant) {
            let (Some(units), Some(ms)) = (e.units, e.lease_ms) else {
                continue;
            };
            let j = index_of(&e.rule);
            let bucket_end = self.bucket_end(&self.config.rules[j], ran_ms);
            let granted = Granted {
                units,
                until_ms: (sent_ms + ms).min(bucket_end.unwrap_or(u64::MAX)),
                late_until_ms: reply_ms + ms,
            };
            self.seen.borrow_mut().ledger.keep((i, j), granted);
        }
    }

    /// Whether isolate `i` held the units for a request of `methods` at
    /// `at_ms` only by deadlines counted from the reply: every rule by
    /// those, some rule not by docs/leases.md's.
    fn decisive(&self, i: usize, methods: &str, at_ms: u64) -> bool {
        let seen = self.seen.borrow();
        let held = self.config.rules.iter().enumerate().map(|(j, rule)| {
            let cost = rule.cost.for_method(methods).max(1);
            let (held, late) = seen.ledger.held((i, j), at_ms);
            (held >= cost, late >= cost)
        });
        let (mut every_late, mut short) = (true, false);
        for (by_readme, by_reply) in held {
            every_late &= by_reply;
            short |= !by_readme;
        }
        every_late && short
    }

    /// Notes what request `arrival` (sent at `now`, decided at
    /// `decided_ms`, its call's reply back at `reply_ms`) was decided, as
    /// a request of `role`: its charges and their figures' checks, the
    /// penalties it started, the model's verdict beside it, and for a
    /// probe how it went (aimed at `aimed_ms`). When the call that decided
    /// it, if any, was sent.
    fn record(
        &self,
        arrival: &Arrival,
        (now, decided_ms, reply_ms): (u64, u64, u64),
        link: &Link<'_, '_>,
        handled: &Handled<'_>,
        (role, aimed_ms): (Role, u64),
    ) -> u64 {
        let i = arrival.isolate;
        let by = self.by_call(i, link, handled);
        let (sent_ms, sent_seq) = by.map_or((now, 0), |b| b.sent);
        let methods = method(arrival.post);
        let leads = role == Role::Drawn && self.case.adversary.is_some();
        // Before this request's own grants are kept: the isolate looked at
        // its leases on arrival.
        let decisive = role != Role::Drawn && self.decisive(i, methods, now);
        let ran_ms = by.map_or(now, |b| b.ran.1);
        self.keep(i, &handled.events, (sent_ms, ran_ms, reply_ms));
        let mut seen = self.seen.borrow_mut();
        seen.requests += 1;
        seen.drawn += u64::from(leads);
        let admitted = match &handled.outcome {
            Outcome::Forward(Forward::Admitted(decided)) => {
                let (from_ms, to_ms, seq, leased) = match by {
                    Some(ByCall {
                        ran: (from, to, seq),
                        ..
                    }) => (from, to, seq, false),
                    // Leased units are spent when the isolate decides: after
                    // its wait, for a request that waited in line behind
                    // its client's call and then found a lease.
                    None => (decided_ms, decided_ms, self.next_seq(), true),
                };
                seen.local += u64::from(leased);
                seen.drawn_local += u64::from(leased && leads);
                for (rule, state) in decided.rules.iter().zip(&decided.decision.rules) {
                    let (j, cost) = (rule_index(rule), rule.cost.for_method(methods));
                    if leased && !seen.ledger.spend((i, j), cost, decided_ms) {
                        seen.unbacked.push(format!(
                            "isolate {i} decided a request at {decided_ms} from rule {}'s leases, \
                             which held no {cost} units granted and spendable then",
                            rule.name
                        ));
                    }
                    if state.admitted() && cost > 0 {
                        seen.charged.push(Charged {
                            seq,
                            rule: j,
                            from_ms,
                            to_ms,
                            cost,
                            leased,
                            isolate: i,
                            sent_seq,
                        });
                    }
                }
                true
            }
            Outcome::Deny(decided) => {
                if let Some(ByCall {
                    ran: (from_ms, to_ms, seq),
                    ..
                }) = by
                {
                    for &j in &decided.decision.penalties_started {
                        let rule = rule_index(decided.rules[j]);
                        seen.penalties.push(Penalty {
                            rule,
                            from_ms,
                            to_ms,
                            seq,
                        });
                    }
                }
                false
            }
            _ => {
                seen.errors += 1;
                return sent_ms;
            }
        };
        if role != Role::Drawn {
            seen.probes.push(Probe {
                role,
                aimed_ms,
                decided_ms,
                leased: admitted && by.is_none(),
                admitted,
                decisive,
            });
        }
        if let Some(model) = by.and_then(|b| b.model).filter(|&m| m != admitted) {
            let verdict = |admitted| if admitted { "admitted" } else { "denied" };
            seen.disagreements.push(format!(
                "request at {now} (isolate {i}, {methods}): the script {}, the model {}",
                verdict(admitted),
                verdict(model),
            ));
        }
        sent_ms
    }
}

fn method(post: bool) -> &'static str {
    if post {
        "POST"
    } else {
        "GET"
    }
}

/// The script's runner for one request's (or after-response task's) calls
/// from one isolate: each call sent now, run after the way there and
/// answered after the way back. On the pinned timeline the call runs at
/// the instant it reaches Redis, as a call on Redis's clock does.
struct Link<'r, 'a> {
    run: &'r Run<'a>,
    isolate: usize,
    /// Whether a request's own (whose calls the model decides), not an
    /// after-response task's.
    request: bool,
    /// When the last call was sent (ms) and its place in the order then.
    sent: Cell<Option<(u64, u64)>>,
    /// The last call's span (ms) and its place in the order.
    ran: Cell<Option<(u64, u64, u64)>>,
    /// What the model decided for each request the last call decided, in
    /// order (leases off).
    model_admitted: RefCell<Vec<bool>>,
}

impl<'r, 'a> Link<'r, 'a> {
    fn new(run: &'r Run<'a>, isolate: usize) -> Self {
        Link {
            run,
            isolate,
            request: false,
            sent: Cell::new(None),
            ran: Cell::new(None),
            model_admitted: RefCell::new(vec![]),
        }
    }

    /// The model's decisions for the requests a call with these `args`
    /// decides at `now_ms` (the script's clock), in order, under the
    /// rule-wide overrides its isolate sent (at `sent_seq`).
    fn model(&self, args: &[String], now_ms: u64, sent_seq: u64) {
        let (Some(model), true) = (&self.run.model, self.request) else {
            return;
        };
        let mut model = model.borrow_mut();
        let config = self.run.config;
        for (j, rule) in config.rules.iter().enumerate() {
            let wide = self.run.view_at(self.isolate, j, sent_seq);
            model.set_rule_wide(&rule.name, wide.map(|o| o.to_text()).as_deref());
        }
        let admitted = costs_of(args, config.rules.len())
            .iter()
            .map(|costs| {
                let checks: Vec<(Check<'_>, Vec<&str>)> = config
                    .rules
                    .iter()
                    .zip(costs)
                    .map(|(rule, &cost)| (Check { rule, cost }, vec![self.run.ip.as_str()]))
                    .collect();
                model.decide(&checks, now_ms).admitted()
            })
            .collect();
        *self.model_admitted.borrow_mut() = admitted;
    }
}

/// The costs per rule of each request a decision's or a group's `args`
/// decide, in order, for `rules` rules (every rule of a case matches every
/// request): the rules' own, then a group's further requests', as
/// `lua/limiter.lua` lays them out.
fn costs_of(args: &[String], rules: usize) -> Vec<Vec<u64>> {
    let number = |i: usize| args.get(i).and_then(|a| a.parse::<u64>().ok()).unwrap_or(0);
    let mut at = 3;
    let mut first = vec![];
    for _ in 0..rules {
        first.push(number(at + 1));
        at += match args.get(at).map(String::as_str) {
            Some("window") => 4 + 3 * number(at + 3) as usize,
            // Its word, cost, interval, burst and delay.
            Some("gcra") => 5,
            _ => 4,
        };
    }
    let mut costs = vec![first];
    if args.get(at).map(String::as_str) == Some("costs") {
        let further = number(at + 1) as usize;
        for r in 0..further {
            costs.push((0..rules).map(|i| number(at + 2 + r * rules + i)).collect());
        }
    }
    costs
}

impl ScriptRunner for Link<'_, '_> {
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
        budget: Duration,
    ) -> Result<Value, RestError> {
        let run = self.run;
        let way = run.case.isolates[self.isolate];
        // Sent in the poll that made the call, with the rule-wide copy
        // it carries.
        let sent_seq = run.next_seq();
        self.sent.set(Some((run.now_ms(), sent_seq)));
        run.sleep(run.latency(way.up_ms)).await;
        let mut args = args.to_vec();
        let from_ms = run.now_ms();
        if run.timeline == Timeline::Pinned && ["decide", "group"].contains(&args[0].as_str()) {
            args[1] = from_ms.to_string();
        }
        let sent = &args;
        let reply = run.redis(|client| async move {
            client
                .run_script(script, keys, sent, unhurried(budget))
                .await
        });
        let to_ms = run.now_ms();
        // Every script call decides: the rule-wide read is plain commands.
        run.seen.borrow_mut().decides += 1;
        self.model(&args, from_ms, sent_seq);
        self.ran.set(Some((from_ms, to_ms, run.next_seq())));
        run.sleep(run.latency(way.down_ms)).await;
        reply
    }

    /// The rule-wide read, as far away as the isolate's decisions.
    async fn commands(
        &self,
        commands: &[Vec<String>],
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError> {
        let run = self.run;
        let way = run.case.isolates[self.isolate];
        run.sleep(run.latency(way.up_ms)).await;
        let from_ms = run.now_ms();
        let replies =
            run.redis(|client| async move { client.pipeline(commands, unhurried(budget)).await });
        self.ran.set(Some((from_ms, run.now_ms(), run.next_seq())));
        run.sleep(run.latency(way.down_ms)).await;
        replies
    }
}

/// A loaded machine must not time a call out: the budget is not what this
/// test is about.
fn unhurried(budget: Duration) -> Duration {
    budget.max(Duration::from_secs(10))
}

/// The isolates' own state.
struct Isolates {
    caches: Vec<RefCell<BlockCache>>,
    leases: Vec<RefCell<Leases>>,
    wide: Vec<RefCell<RuleWide>>,
    in_flight: Vec<InFlight>,
    /// Per isolate, the last time its limiter read the clock.
    clock_reads: Vec<Rc<Cell<u64>>>,
}

impl Isolates {
    /// `n` isolates whose block caches hold denials for `hold_ms`, on
    /// `run`'s clock.
    fn new(n: usize, hold_ms: u64, run: &Run<'_>) -> Isolates {
        let (timeline, start, t0) = (run.timeline, run.start, run.t0);
        let clock_reads: Vec<Rc<Cell<u64>>> = (0..n).map(|_| Rc::default()).collect();
        Isolates {
            caches: (0..n)
                .map(|_| RefCell::new(BlockCache::new(hold_ms)))
                .collect(),
            leases: (0..n).map(|_| RefCell::new(Leases::new())).collect(),
            wide: (0..n).map(|_| RefCell::new(RuleWide::new())).collect(),
            in_flight: (0..n)
                .map(|i| {
                    let read = clock_reads[i].clone();
                    InFlight::new(TokioPause(move || {
                        let ms = clock_ms(timeline, start, t0);
                        read.set(ms);
                        ms
                    }))
                })
                .collect(),
            clock_reads,
        }
    }

    /// When isolate `i`'s limiter decided the request that just returned,
    /// having started at `now`: where it waited in line, the clock it
    /// read on waking (nothing runs between that read and its return);
    /// otherwise `now`, the instant it was given.
    fn decided_ms(&self, i: usize, now: u64) -> u64 {
        self.clock_reads[i].get().max(now)
    }

    /// Isolate `i`'s limiter, its calls made through `store`.
    fn limiter<'c, 's, S>(&'s self, run: &Run<'c>, i: usize, store: &'s S) -> Limiter<'c, 's, S> {
        Limiter {
            config: run.config,
            store,
            cache: &self.caches[i],
            leases: &self.leases[i],
            wide: &self.wide[i],
            in_flight: &self.in_flight[i],
            pinned: run.timeline == Timeline::Pinned,
            home: None,
        }
    }
}

/// A lease brought back to an isolate.
#[derive(Debug, Clone, Copy)]
struct Grant {
    units: u64,
    /// Its last instant, counted from the call's sending (on real time,
    /// a little before).
    last_ms: u64,
    /// Past its end by half the round trip, where the call took one: an
    /// isolate that counted its deadline from the reply would still
    /// spend it then.
    past_ms: Option<u64>,
}

impl Run<'_> {
    /// The leases `events` report granted by a call sent at `sent_ms` and
    /// answered at `reply_ms`.
    fn grants(&self, events: &[Event], sent_ms: u64, reply_ms: u64) -> Vec<Grant> {
        // Real time wakes a sleeper a millisecond or more late: there, the
        // last instant is aimed early enough to land inside the lease.
        let early_ms = match self.timeline {
            Timeline::Pinned => 1,
            Timeline::Redis => 10,
        };
        events
            .iter()
            .filter(|e| e.action == Action::LeaseGrant)
            .filter_map(|e| {
                let ms = e.lease_ms?;
                let took_ms = reply_ms.saturating_sub(sent_ms);
                Some(Grant {
                    units: e.units?,
                    last_ms: (sent_ms + ms).saturating_sub(early_ms),
                    past_ms: (took_ms > 0).then_some(sent_ms + ms + took_ms / 2),
                })
            })
            .collect()
    }
}

/// Requests sent at each instant a grant's units may run out, at most.
const FOLLOWERS: u64 = 8;

/// A request's or a change's part of a run.
type Task<'t> = Pin<Box<dyn Future<Output = ()> + 't>>;

/// A request of a run: its arrival, when it comes (ms), as what, and the
/// instant it aims at (its own, for the case's).
type Sent = (Arrival, u64, Role, u64);

/// One request, from its arrival at `at_ms` to the end of its
/// after-response work, as a request of `role` aimed at `aimed_ms`. One
/// the case draws, when it has an adversary, has each lease it brings
/// back spent at its last instant (half its units, at its length after the
/// call was sent) and the rest past it (by half the round trip), which a
/// correct isolate decides with calls; at a few of these instants, the
/// other isolates fill the client's limits.
async fn request(run: &Run<'_>, isolates: &Isolates, sent: &Sent) {
    let (arrival, at_ms, role, aimed_ms) = sent;
    run.sleep_until(*at_ms).await;
    let now = run.now_ms();
    let i = arrival.isolate;
    let mut link = Link::new(run, i);
    link.request = true;
    let limiter = isolates.limiter(run, i, &link);
    let req = RequestMeta::new(
        method(arrival.post),
        "example.com",
        "/",
        None,
        [("cf-connecting-ip".to_owned(), run.ip.clone())],
    );
    let handled = limiter.handle(&req, now).await;
    let (decided_ms, reply_ms) = (isolates.decided_ms(i, now), run.now_ms());
    let times = (now, decided_ms, reply_ms);
    let sent_ms = run.record(arrival, times, &link, &handled, (*role, *aimed_ms));
    let grants = run.grants(&handled.events, sent_ms, reply_ms);
    // The response goes once the origin answers; then `waitUntil`'s work.
    let after = async {
        run.sleep(run.case.isolates[i].origin_ms).await;
        after_response(run, isolates, i, &handled).await
    };
    if *role != Role::Drawn || run.case.adversary.is_none() {
        after.await;
        return;
    }
    let follow = |grants: Vec<Grant>| {
        let mut sent: Vec<Sent> = vec![];
        for g in &grants {
            let spends = match g.past_ms {
                Some(past) => vec![
                    (g.last_ms, g.units / 2, Aim::Last),
                    (past, g.units, Aim::Past),
                ],
                None => vec![(g.last_ms, g.units, Aim::Last)],
            };
            for (at, n, aim) in spends {
                let follower = Arrival {
                    post: false,
                    ..arrival.clone()
                };
                let spend = (follower, at, Role::Spend(aim), at);
                sent.extend(std::iter::repeat_n(spend, n.min(FOLLOWERS) as usize));
                let surge = run.surge(i, at).into_iter();
                sent.extend(surge.map(|(a, from)| (a, from, Role::Surge, at)));
            }
        }
        async move {
            let requests = sent
                .iter()
                .map(|s| Box::pin(request(run, isolates, s)) as Task<'_>);
            futures_util::future::join_all(requests).await;
        }
    };
    // A refresh's grants are known once it returned.
    let (refreshed, ()) = futures_util::future::join(after, follow(grants)).await;
    follow(refreshed).await;
}

/// The work `waitUntil` runs after a response at isolate `i`: the lease
/// refresh, then the rule-wide re-read. The leases the refresh brought.
async fn after_response(
    run: &Run<'_>,
    isolates: &Isolates,
    i: usize,
    handled: &Handled<'_>,
) -> Vec<Grant> {
    let mut refreshed = vec![];
    if let Some(refresh) = &handled.refresh {
        let link = Link::new(run, i);
        let sent = run.now_ms();
        let events = isolates.limiter(run, i, &link).refresh(refresh, sent).await;
        let (ran_ms, reply_ms) = (link.ran.get().map_or(sent, |r| r.1), run.now_ms());
        run.keep(i, &events, (sent, ran_ms, reply_ms));
        refreshed = run.grants(&events, sent, reply_ms);
    }
    if !handled.reread.is_empty() {
        let link = Link::new(run, i);
        let now = run.now_ms();
        isolates
            .limiter(run, i, &link)
            .reread(&handled.reread, now)
            .await;
        // Kept by the isolate as the read returned, in this same poll.
        if let Some((_, _, read_seq)) = link.ran.get() {
            let (seq, ms) = (run.next_seq(), run.now_ms());
            for name in &handled.reread {
                let j = index_of(name);
                let stored = run.wide_at(j, read_seq);
                run.seen.borrow_mut().views[i][j].push(View { seq, ms, stored });
            }
        }
    }
    refreshed
}

/// An operator's change, made as `limit set` and `limit clear` make it.
async fn change(run: &Run<'_>, c: &ChangeDraw, at_ms: u64) {
    run.sleep_until(at_ms).await;
    let rule = &run.config.rules[c.rule];
    let stored = match c.change {
        Change::Scale(quarters) => {
            let scaled = |n: u64| (n * quarters / 4).max(1);
            let figures = match &rule.policy {
                Policy::Gcra(g) => {
                    let (rate, burst) = (scaled(g.rate()), scaled(g.burst()));
                    Override::changed(
                        rule,
                        serde_json::json!({"rate": rate, "burst": burst})
                            .as_object()
                            .unwrap(),
                    )
                }
                Policy::Concurrency(c) => Override::changed(
                    rule,
                    serde_json::json!({"limits": [scaled(c.limit())]})
                        .as_object()
                        .unwrap(),
                ),
                Policy::Windowed(ws) => {
                    let limits: Vec<u64> = ws.iter().map(|w| scaled(w.limit())).collect();
                    Override::changed(
                        rule,
                        serde_json::json!({"limits": limits}).as_object().unwrap(),
                    )
                }
            };
            match figures {
                Ok(o) => Some(o),
                Err(_) => return,
            }
        }
        Change::Block => Some(Override::Block),
        Change::Clear => None,
    };
    let ip = run.ip.clone();
    let values: Vec<&str> = if c.wide { vec![] } else { vec![ip.as_str()] };
    let from_ms = run.now_ms();
    let what = stored.clone();
    let done = run.redis(|client| async move {
        match &what {
            Some(o) => limits::set(client, rule, &values, o, None).await.map(drop),
            None => limits::clear(client, rule, &values).await.map(drop),
        }
    });
    if done.is_err() {
        // A rule without overrides, or figures `limit set` refuses.
        return;
    }
    let written = Written {
        seq: run.next_seq(),
        from_ms,
        to_ms: run.now_ms(),
        stored: stored.clone(),
    };
    if let (Some(model), false) = (&run.model, c.wide) {
        let text = stored.map(|o| o.to_text());
        let mut model = model.borrow_mut();
        model.set_override(&rule.name, &[&run.ip], text.as_deref());
    }
    let mut seen = run.seen.borrow_mut();
    match c.wide {
        true => seen.wide[c.rule].push(written),
        false => seen.own[c.rule].push(written),
    }
}

/// Runs `case` under `config` for client `ip` on `timeline` (the pinned
/// one starting at `t0`), with the model deciding each call beside the
/// script when `model`.
pub fn run_case(
    (backend, rest_runtime): (&Backend, &tokio::runtime::Runtime),
    timeline: Timeline,
    (case, config, ip): (&Case, &Config, &str),
    t0: u64,
    model: bool,
) -> Seen {
    let mut runtime = tokio::runtime::Builder::new_current_thread();
    runtime.enable_time();
    if timeline == Timeline::Pinned {
        runtime.start_paused(true);
    }
    let runtime = runtime.build().expect("a runtime");
    // The rule-wide overrides are no client's: none from an earlier run.
    for rule in &config.rules {
        let key = limits::key_for(rule, &[]).expect("a rule-wide key");
        backend.redis(&["DEL", &key]);
    }
    let _entered = runtime.enter();
    let rules = config.rules.len();
    let run = Run {
        timeline,
        start: tokio::time::Instant::now(),
        t0,
        client: &backend.client,
        rest_runtime,
        config,
        case,
        ip: ip.to_owned(),
        seq: Cell::new(0),
        rng: Cell::new(case.seed),
        surges: Cell::new(case.adversary.unwrap_or(0)),
        seen: RefCell::new(Seen {
            own: vec![vec![]; rules],
            wide: vec![vec![]; rules],
            views: vec![vec![vec![]; rules]; case.isolates.len()],
            ..Seen::default()
        }),
        model: model.then(|| RefCell::new(Model::new())),
        groups: RefCell::new(HashMap::new()),
    };
    let mut times = case.times(run.now_ms());
    if let (Some(phase_ms), Some(&first)) = (case.phase_ms, times.first()) {
        let rule = &config.rules[0];
        let begins = run.bucket_end(rule, first).expect("a windowed rule");
        let shift = begins + phase_ms - first;
        times.iter_mut().for_each(|t| *t += shift);
    }
    // With the model beside it, every request makes its own call.
    let hold_ms = if model { 0 } else { config.cache_hold_ms };
    let isolates = Isolates::new(case.isolates.len(), hold_ms, &run);
    let drawn: Vec<Sent> = (case.arrivals.iter().zip(&times))
        .map(|(a, &at)| (a.clone(), at, Role::Drawn, at))
        .collect();
    let requests = drawn
        .iter()
        .map(|s| Box::pin(request(&run, &isolates, s)) as Task<'_>);
    let changes = case
        .changes
        .iter()
        .map(|c| Box::pin(change(&run, c, times[c.at])) as Task<'_>);
    runtime.block_on(futures_util::future::join_all(requests.chain(changes)));
    run.seen.into_inner()
}
