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
}

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
    runner: SocketRunner,
    clock: Rc<Clock>,
    /// Each isolate's; every one holds the plan's rule-wide overrides for
    /// the whole replay.
    isolates: Vec<IsolateMemory>,
    /// Each group call's run at Redis, by isolate and call, for the
    /// requests it decided.
    groups: RefCell<HashMap<(usize, u64), GroupRun>>,
    /// The farthest isolate's distance to Redis, ms each way.
    latency_ms: u64,
    /// The order in which requests were decided, at Redis or in an isolate.
    order: Cell<u64>,
    /// What each rule charged each client.
    charged: RefCell<HashMap<(RuleId, String), Vec<Charged>>>,
    /// What each in-flight rule's clients had at the origin: each
    /// admitted request's stay there, ms, and its slots.
    held: RefCell<HashMap<(RuleId, String), Vec<Stay>>>,
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
        let isolates = isolates.max(1);
        let clock = Rc::new(Clock::at(0));
        let replay = Replay {
            config,
            runner: SocketRunner::start()?,
            isolates: (0..isolates)
                .map(|_| {
                    // Calls here never time out, nor does a wait in line.
                    let in_flight = InFlight::new(OnTimeline(clock.clone())).ignoring_budgets();
                    IsolateMemory::new(config.cache_hold_ms, in_flight)
                })
                .collect(),
            groups: RefCell::new(HashMap::new()),
            clock,
            latency_ms,
            order: Cell::new(0),
            charged: RefCell::new(HashMap::new()),
            held: RefCell::new(HashMap::new()),
            report: RefCell::new(IsolatesReport {
                isolates,
                latency_ms,
                ..IsolatesReport::default()
            }),
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
                Some(id) => {
                    let mut conn = self.replay.runner.conn.borrow_mut();
                    write_client_override(&mut conn, &o.rule, id, &o.text)?;
                }
                None => {
                    for isolate in &self.replay.isolates {
                        isolate.wide.borrow_mut().hold(&o.rule, &o.text);
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
        report.rest_calls = self.replay.runner.calls.get();
        for ((rule_id, key), charged) in self.replay.charged.borrow_mut().iter_mut() {
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
                None => conform::over_limit(&rule.policy, offset, &charged),
            };
        }
        for ((rule_id, key), stays) in self.replay.held.borrow().iter() {
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

impl<'c> Replay<'c> {
    /// The isolate a request reaches: a location spreads requests over its
    /// isolates whoever sends them, so each goes to one picked from its
    /// line, the same on every run.
    fn isolate_of(&self, record: &Record) -> usize {
        let mut h = record.line.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
        (h % self.isolates.len() as u64) as usize
    }

    /// Isolate `i`'s limiter, its calls made through `store`.
    fn limiter<'s, S>(&'s self, i: usize, store: &'s S) -> Limiter<'c, 's, S> {
        Limiter::new(self.config, store, &self.isolates[i], true)
    }

    /// When the script ran the call that decided a request of isolate `i`
    /// (`far`: its own way to Redis), at Redis (order, ms): its own call,
    /// or, for a request decided with others, the call the group's last
    /// request sent, whose run it noted; `None` for none (leased units,
    /// the block cache).
    fn ran(&self, i: usize, far: &FarScript<'_, '_>, handled: &Handled<'_>) -> Option<(u64, u64)> {
        let Some(shared) = handled.shared else {
            return far.ran.get();
        };
        let mut report = self.report.borrow_mut();
        report.grouped += 1;
        let mut groups = self.groups.borrow_mut();
        let key = (i, shared.call);
        if shared.sent {
            report.group_calls += 1;
            // Its group's others read it after: they resume once it returned.
            let ran = far.ran.get()?;
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
        let far = FarScript::new(self, i);
        let now = self.clock.now_ms();
        let handled = self.limiter(i, &far).handle(&record.request, now).await;
        let ran = self.ran(i, &far, &handled);
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
                self.charge(&record, &decided.decision.rules, at);
                self.stay(
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
        if let Some(refresh) = &handled.refresh {
            let far = FarScript::new(self, i);
            let now = self.clock.now_ms();
            self.limiter(i, &far).refresh(refresh, now).await;
        }
        if let (Some(refund), Some(status)) = (&handled.refund, record.status) {
            let far = FarScript::new(self, i);
            let now = self.clock.now_ms();
            self.limiter(i, &far)
                .refund(refund, (status, &[]), now)
                .await;
        }
        if let Some(refund) = (handled.refund.as_ref()).filter(|r| r.releases(self.config)) {
            self.clock
                .sleep(ended_ms.saturating_sub(self.clock.now_ms()))
                .await;
            let far = FarScript::new(self, i);
            let now = self.clock.now_ms();
            self.limiter(i, &far).release(refund, now).await;
        }
    }

    /// Notes the stay at the origin of an admitted request under each
    /// in-flight rule that took slots for it: decided at Redis at
    /// `decided_ms`, there from `forwarded_ms` until its response ended at
    /// `ended_ms`, or its slots expired if sooner.
    fn stay(
        &self,
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
            (held.entry((*rule_id, rule_key(rule, &parts))).or_default()).push((
                forwarded_ms,
                until,
                slots,
            ));
        }
    }

    /// Notes what an admitted request charged each rule that admitted it,
    /// decided `at` (order, ms); rules that give charges back by status are
    /// left out of the check.
    fn charge(&self, record: &Record, states: &[RuleState], (order, ms): (u64, u64)) {
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
            let key = rule_key(rule, &parts);
            charged
                .entry((*rule_id, key))
                .or_default()
                .push((order, ms, cost));
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

/// The script as isolate `i` reaches it: each call run its distance after
/// it was sent (at that instant of the pinned clock), and answered as far
/// again.
struct FarScript<'r, 'c> {
    replay: &'r Replay<'c>,
    /// Each way, ms.
    distance_ms: u64,
    /// When the last decision ran at Redis: (order, ms).
    ran: Cell<Option<(u64, u64)>>,
}

impl<'r, 'c> FarScript<'r, 'c> {
    /// Isolate `i` of N: i + 1 N-ths of the replay's latency away.
    fn new(replay: &'r Replay<'c>, i: usize) -> FarScript<'r, 'c> {
        let n = replay.isolates.len() as u64;
        FarScript {
            replay,
            distance_ms: replay.latency_ms * (i as u64 + 1) / n,
            ran: Cell::new(None),
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
        clock.sleep(self.distance_ms).await;
        let mut args = args.to_vec();
        let now = clock.now_ms();
        // A pinned clock runs the call when it reaches Redis.
        let clocked = ["decide", "group", "refund"].contains(&args[0].as_str());
        if clocked && !args[1].is_empty() {
            args[1] = now.to_string();
        }
        // The private redis-server answers at once: no time passes.
        let reply = self.replay.runner.eval(script, keys, &args, budget).await;
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
        clock.sleep(self.distance_ms).await;
        let replies = self.replay.runner.commands(commands, budget).await;
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
        format!(
            "\nWith leases, through {} isolates{}:\n  \
             REST calls per request   {:.3} ({} for {} requests; {:.3} without leases)\n{}  \
             denied only with leases  {}\n  \
             admitted only with leases {}\n  \
             over any rule's limit    {} (checked apart from the script)\n{}",
            self.isolates,
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
            }
        )
    }
}
