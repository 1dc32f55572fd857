//! `simulate --isolates N`: the same log replayed a second time through N
//! simulated isolates, each a worker's own [`Limiter`] with its lease
//! table and block cache, on a private redis-server of its own. With a
//! latency, each isolate's calls run that far from its requests and are
//! answered as far again, on the replay's own clock (`timeline`), so
//! that requests overlap calls in flight and leases are granted and spent
//! at real distances. Compared request by request with the exact replay,
//! it shows what the rules' leases trade: REST calls saved, requests
//! decided differently, and (from [`conform::over_limit`]) that nothing
//! went over any rule.
//!
//! `--regions FILE` replays it through the configuration's regions
//! instead: each with its own private redis-server and isolates, a
//! request going to the region its place (`cf:colo`, `cf:continent`)
//! routes it to, and the FILE's latencies (`distances`) between each
//! region's isolates and its own Redis and the home's. Shared rules
//! (`regions = "shared"`) are spent from the regions' pools and checked
//! as one limit; any other rule counts apart in each region.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    io::{BufReader, Write},
    os::unix::net::UnixStream,
    rc::Rc,
    time::Duration,
};

use serde::Serialize;
use serde_json::Value;

use super::{
    conform,
    distances::Distances,
    engine::{encode_evalsha, loaded, write_client_override, EngineError, Planned, PrivateRedis},
    log::Record,
    resp,
    timeline::{Clock, Timeline},
    Observer, Replayed,
};
use crate::{
    decision::{
        limiter::{select, Forward, Handled, Limiter, Outcome},
        memory::in_flight::InFlight,
        memory::IsolateMemory,
        outcomes::verdict::RuleState,
        runtime::{Bell, Pause, Paused, Signal},
        transport::keys::{rule_key, window_offset},
        transport::protocol::ScriptRunner,
        transport::redis_rest::{RestError, Script},
    },
    rules::{
        config::Config,
        overrides::Override,
        policy::Policy,
        regions,
        request::CfField,
        rule::{Rule, RuleId},
    },
};

/// The script on a private redis-server, one call at a time, counted.
struct SocketRunner {
    conn: RefCell<BufReader<UnixStream>>,
    sha1: String,
    calls: Cell<u64>,
    // Last, so the connection closes before the server is killed.
    _redis: PrivateRedis,
}

impl SocketRunner {
    fn start() -> Result<SocketRunner, EngineError> {
        let (redis, conn, sha1) = loaded()?;
        Ok(SocketRunner {
            conn: RefCell::new(conn),
            sha1,
            calls: Cell::new(0),
            _redis: redis,
        })
    }
}

impl ScriptRunner for SocketRunner {
    async fn eval(
        &self,
        _: &Script,
        keys: &[String],
        args: &[String],
        _: Duration,
    ) -> Result<Value, RestError> {
        self.calls.set(self.calls.get() + 1);
        let mut out = Vec::new();
        encode_evalsha(&self.sha1, keys, args, &mut out);
        let mut conn = self.conn.borrow_mut();
        let reply = conn
            .get_mut()
            .write_all(&out)
            .and_then(|()| resp::read_reply(&mut *conn, &mut Vec::new()))
            .map_err(|e| RestError::Transport(e.to_string()))?;
        reply.map_err(RestError::Redis)
    }

    async fn commands(
        &self,
        commands: &[Vec<String>],
        _: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError> {
        let mut out = Vec::new();
        for command in commands {
            resp::encode(command.iter().map(String::as_bytes), &mut out);
        }
        let mut conn = self.conn.borrow_mut();
        let transport = |e: std::io::Error| RestError::Transport(e.to_string());
        conn.get_mut().write_all(&out).map_err(transport)?;
        let mut line = Vec::new();
        commands
            .iter()
            .map(|_| {
                let reply = resp::read_reply(&mut *conn, &mut line).map_err(transport)?;
                Ok(reply.map_err(RestError::Redis))
            })
            .collect()
    }
}

/// What the lease replay found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IsolatesReport {
    /// Simulated isolates.
    pub isolates: usize,
    /// How far the farthest isolate's calls travel each way, ms (isolate k
    /// of N: k/N of it).
    pub latency_ms: u64,
    /// Requests replayed.
    pub requests: u64,
    /// Script calls the lease replay made (requests', refreshes' and
    /// refunds').
    pub rest_calls: u64,
    /// Requests the exact replay decided with a call.
    pub rest_calls_without_leases: u64,
    /// Requests decided together with others of their client, each group
    /// by one call, because they came while a call for the same rules and
    /// keys was in flight in their isolate.
    pub grouped: u64,
    /// The calls that decided them: grouping saved `grouped` less these.
    pub group_calls: u64,
    /// Requests admitted from leased units, with no call.
    pub from_leases: u64,
    /// Requests the exact replay admitted and the lease replay denied.
    pub denied_only_with_leases: u64,
    /// Requests the exact replay denied and the lease replay admitted (a
    /// unit left unspent by an earlier denial can leave room later).
    pub admitted_only_with_leases: u64,
    /// Charges of the lease replay over any rule's limit, by the
    /// independent check: 0 is the guarantee.
    pub over_limit: u64,
    /// Requests the lease replay could not decide (a Redis error).
    pub errors: u64,
    /// With `--regions`: the calls that crossed to the home's Redis from
    /// another region (far decisions and top-ups).
    pub far_calls: u64,
    /// With `--regions`: each region's figures, the home first.
    pub regions: Vec<RegionFigures>,
}

/// One region's part of a `--regions` replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RegionFigures {
    /// Its name in the configuration.
    pub name: String,
    /// Its isolates' distance to its own Redis, and to the home's, ms each
    /// way.
    pub near_ms: u64,
    /// See `near_ms`.
    pub home_ms: u64,
    /// Requests it received.
    pub requests: u64,
    /// Script calls its isolates made to its own Redis.
    pub near_calls: u64,
    /// Script calls its isolates made to the home's Redis, from away.
    pub far_calls: u64,
}

/// One simulated isolate: its memory, and where it is.
struct Isolate {
    memory: IsolateMemory,
    /// Its region (0: the home, or the one Redis).
    region: usize,
    /// To its region's Redis, and to the home's, ms each way.
    near_ms: u64,
    home_ms: u64,
}

/// Where a rule's state is counted: the rule, the client's key, and the
/// region whose Redis holds it (0 for a shared rule: one limit).
type Counted = (RuleId, String, usize);

/// A charge: when it was decided (its place in the order, and ms), and
/// its cost.
type Charged = (u64, u64, u64);

/// A request's stay at the origin under an in-flight rule: from its
/// forwarding to when its slots came free (its response's end, or the
/// slots' expiry if sooner), ms, and how many it held.
type Stay = (u64, u64, u64);

/// When a group's call ran at Redis (order, ms), and how many of the
/// requests it decided are still to read it.
type GroupRun = ((u64, u64), usize);

/// What the replay's tasks share: the isolates, Redis, the clock, and
/// what they charged.
struct Replay<'c> {
    config: &'c Config,
    /// Each region's Redis, the home's first (one without `--regions`).
    runners: Vec<SocketRunner>,
    clock: Rc<Clock>,
    /// Each region's in turn, as many in each; every one holds the plan's
    /// rule-wide overrides for the whole replay.
    isolates: Vec<Isolate>,
    /// Whether requests go to the configuration's regions (`--regions`).
    regional: bool,
    /// Each group call's run at Redis, by isolate and call, for the
    /// requests it decided.
    groups: RefCell<HashMap<(usize, u64), GroupRun>>,
    /// The order in which requests were decided, at Redis or in an isolate.
    order: Cell<u64>,
    /// What each rule charged each client.
    charged: RefCell<HashMap<Counted, Vec<Charged>>>,
    /// What each in-flight rule's clients had at the origin: each
    /// admitted request's stay there, ms, and its slots.
    held: RefCell<HashMap<Counted, Vec<Stay>>>,
    report: RefCell<IsolatesReport>,
}

/// The lease replay, fed each record as the exact replay decides it.
pub struct IsolatesReplay<'c> {
    replay: Rc<Replay<'c>>,
    /// Requests in flight, and the work after their responses.
    timeline: Timeline<'c>,
    /// The plan's overrides, whose figures the charges are checked against.
    planned: Vec<Planned>,
}

impl<'c> IsolatesReplay<'c> {
    /// `isolates` isolates (at least 1) under `config`, on a redis-server
    /// of their own, the farthest `latency_ms` from it each way.
    pub fn start(
        config: &'c Config,
        isolates: usize,
        latency_ms: u64,
    ) -> Result<IsolatesReplay<'c>, EngineError> {
        let n = isolates.max(1) as u64;
        let places = (0..n).map(|k| (0, latency_ms * (k + 1) / n, 0)).collect();
        let report = IsolatesReport {
            isolates: n as usize,
            latency_ms,
            ..IsolatesReport::default()
        };
        IsolatesReplay::over(config, places, 1, report)
    }

    /// `each` isolates (at least 1) in every region of `config`, each
    /// region on a redis-server of its own, at `distances`.
    pub fn across_regions(
        config: &'c Config,
        each: usize,
        distances: &Distances,
    ) -> Result<IsolatesReplay<'c>, EngineError> {
        let each = each.max(1);
        let mut places = vec![];
        let mut report = IsolatesReport {
            isolates: each,
            ..IsolatesReport::default()
        };
        for (at, region) in config.regions.iter().enumerate() {
            let (near_ms, home_ms) = (distances.near_ms[at], distances.home_ms[at]);
            places.extend((0..each).map(|_| (at, near_ms, home_ms)));
            report.regions.push(RegionFigures {
                name: region.name.clone(),
                near_ms,
                home_ms,
                ..RegionFigures::default()
            });
        }
        IsolatesReplay::over(config, places, config.regions.len(), report)
    }

    /// Isolates at `places` (region, ms to its Redis, ms to the home's),
    /// over `redis` servers.
    fn over(
        config: &'c Config,
        places: Vec<(usize, u64, u64)>,
        redis: usize,
        report: IsolatesReport,
    ) -> Result<IsolatesReplay<'c>, EngineError> {
        let clock = Rc::new(Clock::at(0));
        let runners = (0..redis)
            .map(|_| SocketRunner::start())
            .collect::<Result<_, _>>()?;
        let replay = Replay {
            config,
            runners,
            regional: redis > 1,
            isolates: (places.into_iter())
                .map(|(region, near_ms, home_ms)| {
                    // Calls here never time out, nor does a wait in line.
                    let in_flight = InFlight::new(OnTimeline(clock.clone())).ignoring_budgets();
                    Isolate {
                        memory: IsolateMemory::new(config.cache_hold_ms, in_flight),
                        region,
                        near_ms,
                        home_ms,
                    }
                })
                .collect(),
            groups: RefCell::new(HashMap::new()),
            clock,
            order: Cell::new(0),
            charged: RefCell::new(HashMap::new()),
            held: RefCell::new(HashMap::new()),
            report: RefCell::new(report),
        };
        Ok(IsolatesReplay {
            replay: Rc::new(replay),
            timeline: Timeline::new(),
            planned: vec![],
        })
    }

    /// Puts `overrides` in force: clients' in this replay's Redis, the
    /// rules' in every isolate's copy, as if just read.
    pub fn set_overrides(&mut self, overrides: &[Planned]) -> Result<(), EngineError> {
        self.planned.extend_from_slice(overrides);
        for o in overrides {
            match &o.client {
                // In every region's Redis: `limit set --region` writes each.
                Some(id) => {
                    for runner in &self.replay.runners {
                        let mut conn = runner.conn.borrow_mut();
                        write_client_override(&mut conn, &o.rule, id, &o.text)?;
                    }
                }
                None => {
                    for isolate in &self.replay.isolates {
                        isolate.memory.wide.borrow_mut().hold(&o.rule, &o.text);
                    }
                }
            }
        }
        Ok(())
    }

    /// The report, once every request in flight was answered: each
    /// client's charges checked against the figures in force for it.
    pub fn finish(mut self) -> IsolatesReport {
        self.timeline.run_until(&self.replay.clock, u64::MAX);
        let mut report = self.replay.report.borrow().clone();
        report.rest_calls = self.replay.runners.iter().map(|r| r.calls.get()).sum();
        for ((rule_id, key, _), charged) in self.replay.charged.borrow_mut().iter_mut() {
            let Some(rule) = self.replay.config.rule(*rule_id) else {
                continue;
            };
            // In the order they were decided, which calls in flight mix.
            charged.sort_unstable();
            let charged: Vec<(u64, u64)> =
                charged.iter().map(|&(_, ms, cost)| (ms, cost)).collect();
            let offset = window_offset(key, rule.policy.longest_ms());
            report.over_limit += match self.in_force(rule, key) {
                Some(Override::Figures(figures)) => conform::over_limit(&figures, offset, &charged),
                // A blocked client may be charged nothing.
                Some(Override::Block) => charged.len() as u64,
                None => conform::over_limit(&written(rule), offset, &charged),
            };
        }
        for ((rule_id, key, _), stays) in self.replay.held.borrow().iter() {
            let Some(rule) = self.replay.config.rule(*rule_id) else {
                continue;
            };
            let limit = match (self.in_force(rule, key), &rule.policy) {
                (Some(Override::Figures(Policy::Concurrency(c))), _) => c.limit(),
                (None, Policy::Concurrency(c)) => c.limit(),
                // Blocked: no slot may be held.
                _ => 0,
            };
            report.over_limit += conform::over_in_flight(limit, stays);
        }
        report
    }

    /// The plan's override for the client of state key `key` on `rule`:
    /// its own, else the rule's for every client.
    fn in_force(&self, rule: &Rule, key: &str) -> Option<Override> {
        let of = |o: &&Planned| match &o.client {
            Some(id) => {
                let parts: Vec<&str> = id.iter().map(String::as_str).collect();
                rule_key(rule, &parts) == key
            }
            None => false,
        };
        let mine = self.planned.iter().filter(|o| o.rule == rule.name);
        let own = mine.clone().find(of);
        let wide = mine.clone().find(|o| o.client.is_none());
        own.or(wide)
            .and_then(|o| Override::parse(&o.text, &rule.policy))
    }
}

/// The figures a rule's charges are held to: as written, whose parts a
/// shared rule's home and regions' shares add up to.
fn written(rule: &Rule) -> Policy {
    match rule.shared.and_then(|p| p.share).and_then(|s| s.whole) {
        Some(whole) => Policy::Gcra(whole),
        None => rule.policy.clone(),
    }
}

impl<'c> Replay<'c> {
    /// The isolate a request reaches: its region's, by its place as the
    /// worker routes it; a location spreads requests over its isolates
    /// whoever sends them, so each goes to one picked from its line, the
    /// same on every run.
    fn isolate_of(&self, record: &Record) -> usize {
        let region = match self.regional {
            true => {
                let place = |f| record.request.cf(f);
                regions::route(
                    &self.config.regions,
                    place(CfField::Colo),
                    place(CfField::Continent),
                )
            }
            false => 0,
        };
        let each = self.isolates.len() / self.runners.len();
        let mut h = record.line.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
        region * each + (h % each as u64) as usize
    }

    /// Isolate `i`'s limiter, its calls made through `near`, and through
    /// `home` for shared rules away from the home.
    fn limiter<'s, S>(&'s self, i: usize, near: &'s S, home: &'s S) -> Limiter<'c, 's, S> {
        let limiter = Limiter::new(self.config, near, &self.isolates[i].memory, true);
        match self.isolates[i].region > 0 && self.config.shares_rules() {
            true => limiter.away_from(home),
            false => limiter,
        }
    }

    /// Where a rule's state for state key `key` is counted, for a request
    /// of isolate `i`.
    fn counted(&self, i: usize, rule_id: RuleId, rule: &Rule, key: String) -> Counted {
        let region = match rule.shared {
            Some(_) => 0,
            None => self.isolates[i].region,
        };
        (rule_id, key, region)
    }

    /// When the script ran the call that decided a request of isolate `i`
    /// (`last`: its own calls' last run), at Redis (order, ms): its own call,
    /// or, for a request decided with others, the call the group's last
    /// request sent, whose run it noted; `None` for none (leased units,
    /// the block cache).
    fn ran(&self, i: usize, last: Option<(u64, u64)>, handled: &Handled<'_>) -> Option<(u64, u64)> {
        let Some(shared) = handled.shared else {
            return last;
        };
        let mut report = self.report.borrow_mut();
        report.grouped += 1;
        let mut groups = self.groups.borrow_mut();
        let key = (i, shared.call);
        if shared.sent {
            report.group_calls += 1;
            // Its group's others read it after: they resume once it returned.
            let ran = last?;
            groups.insert(key, (ran, shared.place));
            return Some(ran);
        }
        let (ran, left) = groups.get_mut(&key)?;
        let ran = *ran;
        *left -= 1;
        if *left == 0 {
            groups.remove(&key);
        }
        Some(ran)
    }

    fn next(&self) -> u64 {
        self.order.set(self.order.get() + 1);
        self.order.get()
    }

    /// Decides `record` as the lease replay, from its arrival to the end
    /// of the work after its response, and notes how that differs from
    /// the exact replay's verdict (`exact`: admitted).
    async fn replay(&self, record: Record, exact: bool) {
        let i = self.isolate_of(&record);
        if let Some(region) = self
            .report
            .borrow_mut()
            .regions
            .get_mut(self.isolates[i].region)
        {
            region.requests += 1;
        }
        let (near, home) = (
            FarScript::new(self, i, false),
            FarScript::new(self, i, true),
        );
        let now = self.clock.now_ms();
        let handled = (self.limiter(i, &near, &home))
            .handle(&record.request, now)
            .await;
        // A far decision follows the nearby spend that could not cover it.
        let ran = self.ran(i, near.ran.get().max(home.ran.get()), &handled);
        let forwarded_ms = self.clock.now_ms();
        // Its response ends the log's duration after it reached the origin.
        let ended_ms = forwarded_ms + record.duration_ms.unwrap_or(0);
        let admitted = match &handled.outcome {
            Outcome::Forward(Forward::Admitted(decided)) => {
                // At Redis when a call decided it, else here and now:
                // the block cache holds only denials.
                let at = ran.unwrap_or_else(|| {
                    self.report.borrow_mut().from_leases += 1;
                    (self.next(), now)
                });
                self.charge(i, &record, &decided.decision.rules, at);
                self.stay(
                    i,
                    &record,
                    &decided.decision.rules,
                    (at.1, forwarded_ms, ended_ms),
                );
                true
            }
            Outcome::Forward(_) => true,
            Outcome::Unavailable => {
                self.report.borrow_mut().errors += 1;
                return;
            }
            Outcome::Deny(_) | Outcome::Refuse { .. } => false,
        };
        {
            let mut report = self.report.borrow_mut();
            match (exact, admitted) {
                (true, false) => report.denied_only_with_leases += 1,
                (false, true) => report.admitted_only_with_leases += 1,
                _ => {}
            }
        }
        // The work after the response, as `waitUntil` runs it.
        let (near, home) = (
            FarScript::new(self, i, false),
            FarScript::new(self, i, true),
        );
        let limiter = self.limiter(i, &near, &home);
        if !handled.pool.is_empty() {
            limiter.top_up(&handled.pool, self.clock.now_ms()).await;
        }
        if let Some(refresh) = &handled.refresh {
            limiter.refresh(refresh, self.clock.now_ms()).await;
        }
        // The origin's status is known once its response has come: the
        // log's duration after the request reached it.
        let ended = || {
            self.clock
                .sleep(ended_ms.saturating_sub(self.clock.now_ms()))
        };
        if let (Some(refund), Some(status)) = (&handled.refund, record.status) {
            ended().await;
            (limiter.refund(refund, (status, &[]), self.clock.now_ms())).await;
        }
        if let Some(refund) = (handled.refund.as_ref()).filter(|r| r.releases(self.config)) {
            ended().await;
            limiter.release(refund, self.clock.now_ms()).await;
        }
    }

    /// Notes the stay at the origin of an admitted request under each
    /// in-flight rule that took slots for it: decided at Redis at
    /// `decided_ms`, there from `forwarded_ms` until its response ended at
    /// `ended_ms`, or its slots expired if sooner.
    fn stay(
        &self,
        i: usize,
        record: &Record,
        states: &[RuleState],
        (decided_ms, forwarded_ms, ended_ms): (u64, u64, u64),
    ) {
        let Ok(selection) = select(self.config, &record.request) else {
            return;
        };
        let methods = record.request.methods();
        let mut held = self.held.borrow_mut();
        for ((rule_id, rule, id), state) in selection.rules.iter().zip(states) {
            let Policy::Concurrency(c) = &rule.policy else {
                continue;
            };
            let slots = rule.cost.for_methods(methods);
            if !state.admitted() || slots == 0 {
                continue;
            }
            let parts: Vec<&str> = id.iter().map(|p| p.as_ref()).collect();
            let until = ended_ms.min(decided_ms + c.hold_ms());
            let counted = self.counted(i, *rule_id, rule, rule_key(rule, &parts));
            (held.entry(counted).or_default()).push((forwarded_ms, until, slots));
        }
    }

    /// Notes what an admitted request charged each rule that admitted it,
    /// decided `at` (order, ms); rules that give charges back by status are
    /// left out of the check.
    fn charge(&self, i: usize, record: &Record, states: &[RuleState], (order, ms): (u64, u64)) {
        let Ok(selection) = select(self.config, &record.request) else {
            return;
        };
        let methods = record.request.methods();
        let mut charged = self.charged.borrow_mut();
        for ((rule_id, rule, id), state) in selection.rules.iter().zip(states) {
            let cost = rule.cost.for_methods(methods);
            // In-flight slots are checked by their stays instead.
            let rate = !rule.policy.algorithm().released();
            if !state.admitted() || cost == 0 || !rule.count_status.is_empty() || !rate {
                continue;
            }
            let parts: Vec<&str> = id.iter().map(|p| p.as_ref()).collect();
            let counted = self.counted(i, *rule_id, rule, rule_key(rule, &parts));
            charged.entry(counted).or_default().push((order, ms, cost));
        }
    }
}

/// A pause on the replay's clock, rung by another of the replay's tasks.
struct OnTimeline(Rc<Clock>);

impl Pause for OnTimeline {
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }

    fn signal(&self) -> (Bell, Signal) {
        Signal::native()
    }

    fn until(&self, until_ms: u64, signal: Option<&Signal>) -> Paused {
        let clock = self.0.clone();
        let deadline = async move {
            match until_ms {
                u64::MAX => std::future::pending().await,
                _ => clock.sleep(until_ms.saturating_sub(clock.now_ms())).await,
            }
        };
        Signal::native_pause(signal, deadline)
    }
}

/// The script as isolate `i` reaches a region's Redis: each call run its
/// distance after it was sent (at that instant of the pinned clock), and
/// answered as far again.
struct FarScript<'r, 'c> {
    replay: &'r Replay<'c>,
    /// The Redis it reaches.
    runner: &'r SocketRunner,
    /// Each way, ms.
    distance_ms: u64,
    /// Whose calls: the isolate's region, and whether they cross to the
    /// home's Redis from another region.
    region: usize,
    far: bool,
    /// When the last decision ran at Redis: (order, ms).
    ran: Cell<Option<(u64, u64)>>,
}

impl<'r, 'c> FarScript<'r, 'c> {
    /// Isolate `i`'s way to its region's Redis, or to the home's.
    fn new(replay: &'r Replay<'c>, i: usize, to_home: bool) -> FarScript<'r, 'c> {
        let isolate = &replay.isolates[i];
        let region = isolate.region;
        let (at, distance_ms) = match to_home {
            true => (0, isolate.home_ms),
            false => (region, isolate.near_ms),
        };
        FarScript {
            replay,
            runner: &replay.runners[at],
            distance_ms,
            region,
            far: at != region,
            ran: Cell::new(None),
        }
    }

    /// Counts a call into its region's figures.
    fn count(&self) {
        let mut report = self.replay.report.borrow_mut();
        report.far_calls += u64::from(self.far);
        if let Some(region) = report.regions.get_mut(self.region) {
            match self.far {
                true => region.far_calls += 1,
                false => region.near_calls += 1,
            }
        }
    }
}

impl ScriptRunner for FarScript<'_, '_> {
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
        budget: Duration,
    ) -> Result<Value, RestError> {
        let clock = &self.replay.clock;
        self.count();
        clock.sleep(self.distance_ms).await;
        let mut args = args.to_vec();
        let now = clock.now_ms();
        // A pinned clock runs the call when it reaches Redis.
        let clocked = ["decide", "group", "refund", "pool", "credit"].contains(&args[0].as_str());
        if clocked && !args[1].is_empty() {
            args[1] = now.to_string();
        }
        // The private redis-server answers at once: no time passes.
        let reply = self.runner.eval(script, keys, &args, budget).await;
        self.ran.set(Some((self.replay.next(), now)));
        clock.sleep(self.distance_ms).await;
        reply
    }

    async fn commands(
        &self,
        commands: &[Vec<String>],
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError> {
        let clock = &self.replay.clock;
        self.count();
        clock.sleep(self.distance_ms).await;
        let replies = self.runner.commands(commands, budget).await;
        clock.sleep(self.distance_ms).await;
        replies
    }
}

impl Observer for IsolatesReplay<'_> {
    fn verdict(&mut self, record: &Record, verdict: Replayed<'_>) {
        let exact = match verdict {
            Replayed::Unmatched => true,
            Replayed::Refused(_) => false,
            Replayed::Decided(d) => {
                self.replay.report.borrow_mut().rest_calls_without_leases += 1;
                d.admitted()
            }
        };
        self.replay.report.borrow_mut().requests += 1;
        // Whatever was due before this request arrives happens first.
        self.timeline.run_until(&self.replay.clock, record.time_ms);
        let (replay, record) = (self.replay.clone(), record.clone());
        self.timeline
            .spawn(async move { replay.replay(record, exact).await });
    }
}

impl IsolatesReport {
    /// The report as text, after the exact replay's.
    pub fn render_text(&self) -> String {
        let per = |n: u64| match self.requests {
            0 => 0.0,
            r => n as f64 / r as f64,
        };
        let through = match self.regions.len() {
            0 => format!("{} isolates", self.isolates),
            n => format!("{n} regions, {} isolate(s) in each", self.isolates),
        };
        format!(
            "\nWith leases, through {}{}:\n  \
             REST calls per request   {:.3} ({} for {} requests; {:.3} without leases)\n{}  \
             denied only with leases  {}\n  \
             admitted only with leases {}\n  \
             over any rule's limit    {} (checked apart from the script)\n{}{}",
            through,
            match self.latency_ms {
                0 => String::new(),
                ms => format!(" up to {ms} ms from Redis each way"),
            },
            per(self.rest_calls),
            self.rest_calls,
            self.requests,
            per(self.rest_calls_without_leases),
            match self.grouped {
                0 => String::new(),
                n => format!(
                    "  decided together        {n} requests in {} calls ({} calls saved)\n",
                    self.group_calls,
                    n - self.group_calls
                ),
            },
            self.denied_only_with_leases,
            self.admitted_only_with_leases,
            self.over_limit,
            match self.errors {
                0 => String::new(),
                n => format!("  undecided (Redis error)  {n}\n"),
            },
            self.render_regions(),
        )
    }

    /// Each region's line, and the far calls per request, with `--regions`.
    fn render_regions(&self) -> String {
        if self.regions.is_empty() {
            return String::new();
        }
        let per = |n: u64, of: u64| if of == 0 { 0.0 } else { n as f64 / of as f64 };
        let mut text = format!(
            "  far calls per request    {:.3} ({} to the home from other regions)\n  \
             region    ms near/home  requests  near calls  far calls  far per request\n",
            per(self.far_calls, self.requests),
            self.far_calls
        );
        for r in &self.regions {
            text.push_str(&format!(
                "  {:<9} {:>4} /{:>4}  {:>9} {:>11} {:>10}  {:>15.3}\n",
                r.name,
                r.near_ms,
                r.home_ms,
                r.requests,
                r.near_calls,
                r.far_calls,
                per(r.far_calls, r.requests)
            ));
        }
        text
    }
}
