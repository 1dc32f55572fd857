//! Rules kept across regions (`regions = "shared"`), in a region other
//! than the home: a request is spent from the region's pools in one nearby
//! call, which decides its other rules too, all or nothing; when they
//! cannot cover it, the home decides it, exactly, in one far call that
//! also asks for the top-up the spend asked for. A spend that
//! finds a pool low asks for its top-up after the response (`top_up`), so
//! that a steady region never waits on the home.
//!
//! Why the pools never go over, and why the spend asks before the home is
//! asked: `lua/pool.lua`.

use std::borrow::Cow;

use super::{
    outcome::{decided, failed, Forward, Handled, Outcome, PoolWork, TopUpAsk},
    selection::{budget_of, Selection},
    state::Limiter,
};
use crate::decision::{
    outcomes::events::{Action, Event},
    outcomes::verdict::{Decision, RuleState, Verdict},
    transport::keys::{pool_key, rule_key},
    transport::protocol::{
        credit, run, spend, Check, Credit, LeaseAsk, PoolSpend, PoolState, Reply, ScriptCall,
        ScriptError, ScriptRunner,
    },
};
use crate::rules::rule::{Mode, Rule, RuleId};

impl<'c, S: ScriptRunner> Limiter<'c, '_, S> {
    /// `pooling` (every one a shared rule) decided at `now_ms` in this
    /// region, `home` being the home's Redis, beside
    /// `rest`, the request's other rules (`methods` as for them): the
    /// pools are spent in the one call that decides the rest, all or
    /// nothing. When they cannot cover the request, the home decides the
    /// shared rules, then the rest are decided as they would be alone.
    /// A region that cannot be reached sends its requests to the home; a
    /// home that cannot be reached leaves the pools to spend, then the
    /// rules' fail mode.
    pub(super) async fn pooled(
        &self,
        home: &S,
        pooling: &Selection<'c, Cow<'_, str>>,
        rest: &Selection<'c, Cow<'_, str>>,
        methods: &[String],
        now_ms: u64,
    ) -> Handled<'c> {
        let checks = &pooling.checks(methods);
        let keys: Vec<String> = checks.iter().map(|(c, id)| rule_key(c.rule, id)).collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        // Under the rule-wide overrides this isolate holds, read from the
        // home: the home decides and grants under them.
        let own = ScriptCall::decide_at(checks, &key_refs, self.clock(now_ms));
        let own = self.under_rule_wide(own, checks, now_ms);
        let signature = own.signature();
        let reread = self.reread_due(checks, now_ms);
        if let Some(mut handled) = self.cached_denial(checks, (&own, &signature), now_ms) {
            handled.reread = reread;
            return handled;
        }
        // An isolate holds units of its own (`lease`) only for requests no
        // other rule matches: theirs are decided in the call anyway.
        let leased = match rest.rules.is_empty() {
            true => self.observe(checks, &key_refs, now_ms),
            false => None,
        };
        if let Some(leased) = &leased {
            if let Some(mut handled) = self.admit_from_leases(checks, leased, now_ms) {
                handled.refresh = self.refresh_due(pooling, leased, now_ms);
                handled.reread = reread;
                return handled;
            }
        }
        let ids: Vec<RuleId> = pooling.rules.iter().map(|(id, _, _)| *id).collect();
        let asks = (leased.as_ref()).map_or_else(Vec::new, |l| self.lease_asks(checks, l, now_ms));
        let far_ms = self.leases.borrow().home_trip_ms();
        let pools: Vec<PoolSpend> = (checks.iter().zip(&keys).enumerate())
            .map(|(i, ((c, _), key))| {
                let lease = asks.iter().find(|a| a.rule == i);
                let lease = lease.map_or((0, 0), |a| (a.units, a.for_ms));
                pool_spend(c.rule, key, c.cost, far_ms, lease)
            })
            .collect();
        let shared = Shared {
            home,
            checks,
            ids: &ids,
            keys: &keys,
            own: (own, signature),
        };
        let mut handled = match rest.rules.is_empty() {
            true => {
                let handled = self.spent_alone(&shared, &pools, now_ms).await;
                let mut leases = self.leases.borrow_mut();
                for ask in &asks {
                    leases.answered(&keys[ask.rule]);
                }
                handled
            }
            false => {
                let beside = self.handle_selected(rest, methods, &pools, now_ms).await;
                let states = match &beside.outcome {
                    Outcome::Forward(Forward::Admitted(d)) => Some(d.decision.pools.clone()),
                    Outcome::Forward(_) => Some(vec![]),
                    _ => None,
                };
                match states {
                    // Denied, or refused: nothing was spent from the pools.
                    None => beside,
                    // Let through without a call that carried the pools
                    // (leased units, a fail mode): spent on their own.
                    Some(states) if states.is_empty() => {
                        let pooled = self.spent_alone(&shared, &pools, now_ms).await;
                        joined(pooled, beside)
                    }
                    Some(states) => {
                        let pooled = self.as_pools_leave(&shared, &states, now_ms).await;
                        let forwarded = matches!(pooled.outcome, Outcome::Forward(_));
                        match (forwarded, states[0].covered) {
                            (false, _) => pooled,
                            (true, true) => joined(pooled, beside),
                            // The call committed nothing: the rest again,
                            // now that the home has admitted the request.
                            (true, false) => {
                                let again = self.handle_selected(rest, methods, &[], now_ms);
                                joined(pooled, again.await)
                            }
                        }
                    }
                }
            }
        };
        handled.reread.extend(reread);
        handled
    }

    /// The shared rules' pools spent in a call of their own.
    async fn spent_alone(
        &self,
        shared: &Shared<'c, '_, S>,
        pools: &[PoolSpend],
        now_ms: u64,
    ) -> Handled<'c> {
        let budget = budget_of(shared.checks.iter().map(|(c, _)| c.rule));
        match spend(self.store, pools, self.clock(now_ms), budget).await {
            Ok(states) => self.as_pools_leave(shared, &states, now_ms).await,
            Err(error) => {
                let (checks, keys) = (shared.checks, shared.keys);
                let mut events = unreachable(Action::RegionUnreachable, checks, keys, &error);
                let mut handled = self.at_home(shared, &[], now_ms).await;
                events.append(&mut handled.events);
                handled.events = events;
                handled
            }
        }
    }

    /// The shared rules as the pools' `states` leave them: admitted from
    /// the pools, with the top-ups they ask for, or decided at the home.
    async fn as_pools_leave(
        &self,
        shared: &Shared<'c, '_, S>,
        states: &[PoolState],
        now_ms: u64,
    ) -> Handled<'c> {
        let asks: Vec<(usize, TopUpAsk)> = (states.iter().enumerate())
            .filter_map(|(i, s)| Some((i, top_up_ask(shared.ids[i], &shared.keys[i], s)?)))
            .collect();
        if !states.first().is_some_and(|s| s.covered) {
            return self.at_home(shared, &asks, now_ms).await;
        }
        let checks = shared.checks;
        for (((c, _), key), s) in checks.iter().zip(shared.keys).zip(states) {
            self.keep_moved(c.rule, key, s, now_ms);
        }
        let mut handled = decided(checks, &shared.own.0, spent(checks, states));
        handled.pool = PoolWork {
            asks: asks.into_iter().map(|(_, a)| a).collect(),
            credits: vec![],
        };
        handled
    }

    /// After a response: moves units from the region's pools to this
    /// isolate for `rules` (each a shared rule that leases, its key and the
    /// units to ask for), in one spend charging no request; a top-up it
    /// asks for goes to the home at once. A fault is only logged: the next
    /// request without units spends in a call of its own.
    pub(super) async fn refresh_pools(
        &self,
        rules: &[&(RuleId, String, u64)],
        now_ms: u64,
    ) -> Vec<Event> {
        let found: Vec<(&'c Rule, RuleId, &str, u64)> = (rules.iter())
            .filter_map(|(id, key, units)| {
                Some((self.config.rule(*id)?, *id, key.as_str(), *units))
            })
            .collect();
        let far_ms = self.leases.borrow().home_trip_ms();
        let pools: Vec<PoolSpend> = (found.iter())
            .map(|(rule, _, key, units)| {
                let lease = (*units, rule.lease.map_or(0, |l| l.for_ms));
                pool_spend(rule, key, 0, far_ms, lease)
            })
            .collect();
        let budget = budget_of(found.iter().map(|(rule, ..)| *rule));
        let spent = spend(self.store, &pools, self.clock(now_ms), budget).await;
        for (_, _, key, _) in &found {
            self.leases.borrow_mut().answered(key);
        }
        let states = match spent {
            Ok(states) => states,
            Err(error) => {
                return (found.iter())
                    .map(|(rule, _, key, _)| Event {
                        key: Some((*key).to_owned()),
                        error: Some(error.to_string()),
                        ..Event::new(Action::LeaseFailed, &rule.name)
                    })
                    .collect();
            }
        };
        let mut work = PoolWork::default();
        for ((rule, id, key, _), s) in found.iter().zip(&states) {
            self.keep_moved(rule, key, s, now_ms);
            work.asks.extend(top_up_ask(*id, key, s));
        }
        match work.is_empty() {
            true => vec![],
            false => self.top_up(&work, now_ms).await,
        }
    }

    /// Keeps the units `s` says the pool of `rule`'s `key` moved to this
    /// isolate, counted from `now_ms`, before it sent the call.
    fn keep_moved(&self, rule: &Rule, key: &str, s: &PoolState, now_ms: u64) {
        let (units, ms) = s.leased;
        let state = (pool_state(rule, s), None);
        self.leases
            .borrow_mut()
            .grant(key, units, ms, now_ms, state);
    }

    /// The shared rules decided by the home, asking for `asks`' top-ups
    /// with them; what it grants goes into the region's pools after the
    /// response.
    async fn at_home(
        &self,
        shared: &Shared<'c, '_, S>,
        asks: &[(usize, TopUpAsk)],
        now_ms: u64,
    ) -> Handled<'c> {
        let (checks, (own, signature)) = (shared.checks, &shared.own);
        let budget = budget_of(checks.iter().map(|(c, _)| c.rule));
        let asked = self.ask_home(shared.home, checks, own.clone(), asks, budget);
        let (call, asked) = asked.await;
        match asked {
            Ok((decision, credits)) => {
                self.remember(checks, signature.clone(), &decision, now_ms);
                let mut handled = decided(checks, &call, decision);
                handled.pool.credits = credits;
                handled
            }
            Err(error) => {
                let mut events = home_unreachable(checks, &call, &error);
                let mut handled = failed(checks, &call, &error);
                events.append(&mut handled.events);
                handled.events = events;
                handled
            }
        }
    }

    /// After a response: asks the home for `work`'s top-ups in one call
    /// charging no request, then writes what it granted, and `work`'s own
    /// credits, into the region's pools in one call. A fault is logged;
    /// the pool's pending top-up then lapses, and a later spend asks again.
    pub async fn top_up(&self, work: &PoolWork, now_ms: u64) -> Vec<Event> {
        let Some(home) = self.home else {
            return vec![];
        };
        let mut events = vec![];
        let mut credited = work.credits.clone();
        let found: Vec<(Check<'c>, &TopUpAsk)> = (work.asks.iter())
            .filter_map(|a| {
                let rule = self.config.rule(a.rule)?;
                Some((Check { rule, cost: 0 }, a))
            })
            .collect();
        if !found.is_empty() {
            let checks: Vec<(Check<'c>, Vec<&str>)> =
                found.iter().map(|(c, _)| (*c, vec![])).collect();
            let keys: Vec<&str> = found.iter().map(|(_, a)| a.key.as_str()).collect();
            let asks: Vec<(usize, TopUpAsk)> = (found.iter().enumerate())
                .map(|(i, (_, a))| (i, (*a).clone()))
                .collect();
            let call = ScriptCall::decide_at(&checks, &keys, self.clock(now_ms));
            let call = self.under_rule_wide(call, &checks, now_ms);
            let budget = budget_of(checks.iter().map(|(c, _)| c.rule));
            match self.ask_home(home, &checks, call, &asks, budget).await {
                (_, Ok((_, credits))) => credited.extend(credits),
                (call, Err(error)) => events = home_unreachable(&checks, &call, &error),
            }
        }
        if credited.is_empty() {
            return events;
        }
        let rules: Vec<&Rule> = (credited.iter())
            .filter_map(|(id, _)| self.config.rule(*id))
            .collect();
        let budget = budget_of(rules.iter().copied());
        let given: Vec<Credit> = credited.iter().map(|(_, c)| c.clone()).collect();
        if let Err(error) = credit(self.store, &given, self.clock(now_ms), budget).await {
            events.extend(rules.iter().zip(&given).map(|(rule, c)| Event {
                key: Some(c.key.clone()),
                error: Some(error.to_string()),
                ..Event::new(Action::RegionUnreachable, &rule.name)
            }));
        }
        events
    }

    /// `call`, deciding `checks`, sent to the home with `asks`' top-ups:
    /// the call as sent, and its decision with the credits of what it
    /// granted. An answered call's time is the home's round trip, which
    /// the region's next spends ask that much ahead of.
    async fn ask_home(
        &self,
        home: &S,
        checks: &[(Check<'c>, Vec<&str>)],
        call: ScriptCall,
        asks: &[(usize, TopUpAsk)],
        budget: std::time::Duration,
    ) -> (
        ScriptCall,
        Result<(Decision, Vec<(RuleId, Credit)>), ScriptError>,
    ) {
        let call = call.asking(lease_asks(checks, asks));
        let sent_ms = self.in_flight.now_ms();
        let asked = run(home, &call, budget).await.and_then(Reply::decision);
        if asked.is_ok() {
            let took_ms = self.in_flight.now_ms().saturating_sub(sent_ms);
            self.leases.borrow_mut().home_trip(took_ms);
        }
        let asked = asked.map(|d| {
            let credits = credits(checks, asks, &d);
            (d, credits)
        });
        (call, asked)
    }
}

/// A request's shared rules, as a region decides them: the home's Redis,
/// the rules' checks, their ids and state keys, and their own call (under
/// the rule-wide overrides held) with its signature.
struct Shared<'c, 'a, S> {
    home: &'a S,
    checks: &'a [(Check<'c>, Vec<&'a str>)],
    ids: &'a [RuleId],
    keys: &'a [String],
    own: (ScriptCall, String),
}

/// One `home_unreachable` event per rule of `call`, which failed with
/// `error` (the log writes one line per rule a minute).
fn home_unreachable(
    checks: &[(Check<'_>, Vec<&str>)],
    call: &ScriptCall,
    error: &ScriptError,
) -> Vec<Event> {
    let keys: Vec<String> = call.rule_keys().iter().map(|k| (*k).to_owned()).collect();
    unreachable(Action::HomeUnreachable, checks, &keys, error)
}

/// The request spent from every pool: each rule admits it, with what its
/// pool has left and how long that lasts.
fn spent(checks: &[(Check<'_>, Vec<&str>)], states: &[PoolState]) -> Decision {
    let rules = (checks.iter().zip(states))
        .map(|((c, _), s)| pool_state(c.rule, s))
        .collect();
    let modes: Vec<Mode> = checks.iter().map(|(c, _)| c.rule.mode).collect();
    Decision::settle(rules, &modes)
}

/// The spend of `cost` from the pool of `rule`'s state `key`, the home
/// `far_ms` away, asking for `lease` (units, ms) for this isolate.
fn pool_spend(rule: &Rule, key: &str, cost: u64, far_ms: u64, lease: (u64, u64)) -> PoolSpend {
    let pool = rule.shared;
    let share = pool.and_then(|p| p.share);
    PoolSpend {
        key: pool_key(key),
        cost,
        hold_ms: pool.map_or(0, |p| p.hold_ms),
        most: pool.map_or(0, |p| p.most),
        share: share.map_or((0, 0), |s| (s.units, s.interval_us)),
        far_ms,
        lease,
    }
}

/// The top-up `s` asks for the pool of rule `rule`'s state `key`, if any.
fn top_up_ask(rule: RuleId, key: &str, s: &PoolState) -> Option<TopUpAsk> {
    (s.ask > 0).then(|| TopUpAsk {
        rule,
        key: key.to_owned(),
        units: s.ask,
        asked_us: s.asked_us,
    })
}

/// `rule` admitting a request from its pool, as the client's headers
/// tell it: what the pool and the share have left on top of what the home
/// had at its last grant (all of it once it is full again, or before any),
/// so that a client's figures run on from a far decision to the pool's.
fn pool_state(rule: &Rule, s: &PoolState) -> RuleState {
    let limit = rule.policy.capacity();
    let (home_left, full_ms) = s.home;
    RuleState {
        verdict: Verdict::Admitted,
        limit,
        remaining: s.left.saturating_add(home_left.unwrap_or(limit)).min(limit),
        reset_after_ms: full_ms,
        window: 1,
    }
}

/// The home's lease asks for `asks`' top-ups: a pool is charged there as
/// a lease is, for as long as the rule's pool lasts.
fn lease_asks(checks: &[(Check<'_>, Vec<&str>)], asks: &[(usize, TopUpAsk)]) -> Vec<LeaseAsk> {
    (asks.iter())
        .filter_map(|(i, a)| {
            let pool = checks.get(*i)?.0.rule.shared?;
            Some(LeaseAsk {
                rule: *i,
                units: a.units,
                for_ms: pool.hold_ms,
            })
        })
        .collect()
}

/// The credits of what the home granted for `asks`, each with its rule:
/// an ask it granted nothing for too, whose credit of no units ends the
/// pending top-up, so that the next spend may ask again.
fn credits(
    checks: &[(Check<'_>, Vec<&str>)],
    asks: &[(usize, TopUpAsk)],
    decided: &Decision,
) -> Vec<(RuleId, Credit)> {
    (asks.iter())
        .filter_map(|(i, ask)| {
            let pool = checks.get(*i)?.0.rule.shared?;
            let grant = decided.grants.iter().find(|g| g.rule == *i);
            // A block's reset of never, capped where the script's clock
            // arithmetic (a Lua double, in us) stays exact.
            let home = (decided.rules.get(*i))
                .map_or((0, 0), |s| (s.remaining, s.reset_after_ms.min(1 << 40)));
            let credit = Credit {
                key: pool_key(&ask.key),
                asked_us: ask.asked_us,
                units: grant.map_or(0, |g| g.units),
                ms: grant.map_or(0, |g| g.for_ms),
                hold_ms: pool.hold_ms,
                home,
            };
            Some((ask.rule, credit))
        })
        .collect()
}

/// A request's decision under its shared rules (`pooled`) and under its
/// other rules (`rest`), decided after: forwarded only if both forward
/// it, with every rule's state in the headers, the rest's first so that
/// their indices, which marks and grants name, stand.
fn joined<'c>(pooled: Handled<'c>, rest: Handled<'c>) -> Handled<'c> {
    let mut events = pooled.events;
    let mut handled = rest;
    events.append(&mut handled.events);
    handled.events = events;
    handled.pool = pooled.pool;
    handled.reread.extend(pooled.reread);
    let Outcome::Forward(Forward::Admitted(shared)) = pooled.outcome else {
        return handled;
    };
    if let Outcome::Forward(Forward::Admitted(rest)) = &mut handled.outcome {
        let mut states = std::mem::take(&mut rest.decision.rules);
        states.extend(shared.decision.rules);
        rest.rules.extend(shared.rules);
        let modes: Vec<Mode> = rest.rules.iter().map(|r| r.mode).collect();
        let settled = Decision::settle(states, &modes);
        (rest.decision.verdict, rest.decision.rules) = (settled.verdict, settled.rules);
    }
    handled
}

/// One event per rule: the region's Redis, or the home's, could not be
/// reached (the log writes one line per rule a minute).
fn unreachable(
    action: Action,
    checks: &[(Check<'_>, Vec<&str>)],
    keys: &[String],
    error: &ScriptError,
) -> Vec<Event> {
    (checks.iter().zip(keys))
        .map(|((c, _), key)| Event {
            key: Some(key.clone()),
            error: Some(error.to_string()),
            ..Event::new(action, &c.rule.name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::rules::config::Config;

    /// A block's reset of never reaches the region's pool as one the
    /// script's clock arithmetic holds exactly; the units left as the home
    /// said.
    #[test]
    fn a_credit_carries_the_homes_figures_its_reset_capped() {
        let regions = json!([{"name": "us", "home": true}, {"name": "eu", "colos": ["FRA"]}]);
        let rule = json!({"name": "api", "key": ["ip"], "algorithm": "gcra", "rate": 100,
                          "period": "1m", "burst": 100, "regions": "shared"});
        let config = Config::from_json(&json!({"rules": [rule], "regions": regions})).unwrap();
        let rule = &config.rules[0];
        let checks = [(Check { rule, cost: 0 }, vec![])];
        let ask = TopUpAsk {
            rule: RuleId(0),
            key: "el:{192.0.2.1}:api".to_owned(),
            units: 5,
            asked_us: 7,
        };
        for (remaining, reset_after_ms, sent) in
            [(40, 9_000, (40, 9_000)), (0, u64::MAX, (0, 1 << 40))]
        {
            let state = RuleState {
                verdict: Verdict::Admitted,
                limit: 100,
                remaining,
                reset_after_ms,
                window: 1,
            };
            let decided = Decision::settle(vec![state], &[Mode::Enforce]);
            let given = credits(&checks, &[(0, ask.clone())], &decided);
            assert_eq!(given[0].1.home, sent);
            assert_eq!((given[0].1.asked_us, given[0].1.units), (7, 0));
        }
    }
}
