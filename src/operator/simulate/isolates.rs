//! `simulate --isolates N`: the same log replayed a second time through N
//! simulated isolates, each a worker's own [`Limiter`] with its lease
//! table and block cache, on a private redis-server of its own. Compared
//! request by request with the exact replay, it shows what the rules'
//! leases trade: REST calls saved, requests decided differently, and (from
//! [`conform::over_limit`]) that nothing went over any rule.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    io::{BufReader, Write},
    os::unix::net::UnixStream,
    time::Duration,
};

use serde::Serialize;
use serde_json::Value;

use super::{
    conform,
    engine::{encode_evalsha, loaded, write_client_override, EngineError, Planned, PrivateRedis},
    log::Record,
    resp, Observer, Replayed,
};
use crate::{
    decision::{
        block_cache::BlockCache,
        keys::{redis_key, window_offset},
        leases::Leases,
        limiter::{select, Forward, Limiter, Outcome},
        protocol::ScriptRunner,
        redis_rest::{RestError, Script},
        rule_wide::RuleWide,
    },
    rules::{
        config::Config,
        overrides::Override,
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
}

/// What the lease replay found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IsolatesReport {
    /// Simulated isolates.
    pub isolates: usize,
    /// Requests replayed.
    pub requests: u64,
    /// Script calls the lease replay made (requests', refreshes' and
    /// refunds').
    pub rest_calls: u64,
    /// Requests the exact replay decided with a call.
    pub rest_calls_without_leases: u64,
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

/// The lease replay, fed each record as the exact replay decides it.
pub struct IsolatesReplay<'c> {
    config: &'c Config,
    runner: SocketRunner,
    caches: Vec<RefCell<BlockCache>>,
    leases: Vec<RefCell<Leases>>,
    /// The plan's rule-wide overrides, held for the whole replay.
    wide: RefCell<RuleWide>,
    /// The plan's overrides, whose figures the charges are checked against.
    planned: Vec<Planned>,
    runtime: tokio::runtime::Runtime,
    /// What each rule charged each client: (time, cost), in time order.
    charged: HashMap<(RuleId, String), Vec<(u64, u64)>>,
    report: IsolatesReport,
}

impl<'c> IsolatesReplay<'c> {
    /// `isolates` isolates (at least 1) under `config`, on a redis-server
    /// of their own.
    pub fn start(config: &'c Config, isolates: usize) -> Result<IsolatesReplay<'c>, EngineError> {
        let isolates = isolates.max(1);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(EngineError::Io)?;
        Ok(IsolatesReplay {
            config,
            runner: SocketRunner::start()?,
            caches: (0..isolates)
                .map(|_| RefCell::new(BlockCache::new(config.cache_hold_ms)))
                .collect(),
            leases: (0..isolates).map(|_| RefCell::new(Leases::new())).collect(),
            wide: RefCell::new(RuleWide::new()),
            planned: vec![],
            runtime,
            charged: HashMap::new(),
            report: IsolatesReport {
                isolates,
                ..IsolatesReport::default()
            },
        })
    }

    /// Puts `overrides` in force: clients' in this replay's Redis, the
    /// rules' in every isolate's copy, as if just read.
    pub fn set_overrides(&mut self, overrides: &[Planned]) -> Result<(), EngineError> {
        self.planned.extend_from_slice(overrides);
        for o in overrides {
            match &o.client {
                Some(id) => {
                    let mut conn = self.runner.conn.borrow_mut();
                    write_client_override(&mut conn, &o.rule, id, &o.text)?;
                }
                None => self.wide.borrow_mut().hold(&o.rule, &o.text),
            }
        }
        Ok(())
    }

    /// The isolate a request reaches: a location spreads requests over its
    /// isolates whoever sends them, so each goes to one picked from its
    /// line, the same on every run.
    fn isolate_of(&self, record: &Record) -> usize {
        let mut h = record.line.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
        (h % self.leases.len() as u64) as usize
    }

    /// Decides `record` as the lease replay, and records its charges.
    fn replay(&mut self, record: &Record) -> Option<bool> {
        let i = self.isolate_of(record);
        let limiter = Limiter {
            config: self.config,
            store: &self.runner,
            cache: &self.caches[i],
            leases: &self.leases[i],
            wide: &self.wide,
            pinned: true,
        };
        let now = record.time_ms;
        let before = self.runner.calls.get();
        let handled = self.runtime.block_on(limiter.handle(&record.request, now));
        if let Some(refresh) = &handled.refresh {
            self.runtime.block_on(limiter.refresh(refresh, now));
        }
        if let (Some(refund), Some(status)) = (&handled.refund, record.status) {
            self.runtime.block_on(limiter.refund(refund, status));
        }
        self.report.rest_calls += self.runner.calls.get() - before;
        let admitted = match &handled.outcome {
            Outcome::Forward(Forward::Admitted(decided)) => {
                self.charge(record, &decided.decision.rules);
                true
            }
            Outcome::Forward(_) => true,
            Outcome::Unavailable => {
                self.report.errors += 1;
                return None;
            }
            Outcome::Deny(_) | Outcome::Refuse { .. } => false,
        };
        Some(admitted)
    }

    /// Notes what an admitted request charged each rule that admitted it;
    /// rules that give charges back by status are left out of the check.
    fn charge(&mut self, record: &Record, states: &[crate::decision::verdict::RuleState]) {
        let Ok(selection) = select(self.config, &record.request) else {
            return;
        };
        let methods = record.request.methods();
        for ((rule_id, rule, id), state) in selection.rules.iter().zip(states) {
            let cost = rule.cost.for_methods(methods);
            if !state.admitted() || cost == 0 || !rule.count_status.is_empty() {
                continue;
            }
            let parts: Vec<&str> = id.iter().map(|p| p.as_ref()).collect();
            let key = redis_key(&rule.name, &parts);
            self.charged
                .entry((*rule_id, key))
                .or_default()
                .push((record.time_ms, cost));
        }
    }

    /// The report, once every record was replayed: each client's charges
    /// checked against the figures in force for it.
    pub fn finish(mut self) -> IsolatesReport {
        for ((rule_id, key), charged) in &self.charged {
            let Some(rule) = self.config.rule(*rule_id) else {
                continue;
            };
            let offset = window_offset(key, rule.policy.longest_ms());
            self.report.over_limit += match self.in_force(rule, key) {
                Some(Override::Figures(figures)) => conform::over_limit(&figures, offset, charged),
                // A blocked client may be charged nothing.
                Some(Override::Block) => charged.len() as u64,
                None => conform::over_limit(&rule.policy, offset, charged),
            };
        }
        self.report
    }

    /// The plan's override for the client of state key `key` on `rule`:
    /// its own, else the rule's for every client.
    fn in_force(&self, rule: &Rule, key: &str) -> Option<Override> {
        let of = |o: &&Planned| match &o.client {
            Some(id) => {
                let parts: Vec<&str> = id.iter().map(String::as_str).collect();
                redis_key(&rule.name, &parts) == key
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

impl Observer for IsolatesReplay<'_> {
    fn verdict(&mut self, record: &Record, verdict: Replayed<'_>) {
        self.report.requests += 1;
        let exact = match verdict {
            Replayed::Unmatched => true,
            Replayed::Refused(_) => false,
            Replayed::Decided(d) => {
                self.report.rest_calls_without_leases += 1;
                d.admitted()
            }
        };
        match (exact, self.replay(record)) {
            (true, Some(false)) => self.report.denied_only_with_leases += 1,
            (false, Some(true)) => self.report.admitted_only_with_leases += 1,
            _ => {}
        }
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
            "\nWith leases, through {} isolates:\n  \
             REST calls per request   {:.3} ({} for {} requests; {:.3} without leases)\n  \
             denied only with leases  {}\n  \
             admitted only with leases {}\n  \
             over any rule's limit    {} (checked apart from the script)\n{}",
            self.isolates,
            per(self.rest_calls),
            self.rest_calls,
            self.requests,
            per(self.rest_calls_without_leases),
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
