//! The limiter's side of quota leases: which requests are decided from
//! this isolate's leased units, what each call asks for, and the refresh
//! after a response. The units themselves live in [`crate::decision::memory::leases`].
//! A request takes these steps only when a matching rule leases: the
//! request's own take a [`Leased`], which only such a request has.

use std::{borrow::Cow, time::Duration};

use super::{
    outcome::{Decided, Forward, Handled, LeaseRefresh, Outcome},
    selection::{budget_of, Selection},
    state::Limiter,
};
use crate::{
    decision::{
        memory::leases::Leases,
        outcomes::events::{Action, Event},
        outcomes::verdict::{Decision, Grant, OverrideRead},
        transport::keys::window_offset,
        transport::protocol::{Check, Group, LeaseAsk, ScriptCall, ScriptError, ScriptRunner},
    },
    rules::rule::{Mode, Rule, RuleId},
};

/// The state key of each matching rule that leases, in check order
/// (`None` for the others), for a request under at least one such rule.
pub(super) struct Leased(Vec<Option<String>>);

impl<'c, S: ScriptRunner> Limiter<'c, '_, S> {
    /// The request's [`Leased`] keys (`keys`: each check's state key),
    /// each counted toward its key's demand; `None`, with no lease state
    /// touched, when no matching rule leases.
    pub(super) fn observe(
        &self,
        checks: &[(Check<'c>, Vec<&str>)],
        keys: &[&str],
        now_ms: u64,
    ) -> Option<Leased> {
        if checks.iter().all(|(c, _)| c.rule.lease.is_none()) {
            return None;
        }
        let mut leases = self.leases.borrow_mut();
        let keys = checks
            .iter()
            .zip(keys)
            .map(|((c, _), &key)| {
                c.rule.lease?;
                leases.observe(key, now_ms, lease_horizon_ms(c.rule, key, now_ms));
                Some(key.to_owned())
            })
            .collect();
        Some(Leased(keys))
    }

    /// The request admitted from leased units, when every matching rule
    /// leases and holds what it costs; nothing is spent otherwise.
    pub(super) fn admit_from_leases(
        &self,
        checks: &[(Check<'c>, Vec<&str>)],
        leased: &Leased,
        now_ms: u64,
    ) -> Option<Handled<'c>> {
        let mut leases = self.leases.borrow_mut();
        let keyed: Vec<(&Check<'c>, &str)> = checks
            .iter()
            .zip(&leased.0)
            .map(|((c, _), key)| Some((c, key.as_deref()?)))
            .collect::<Option<_>>()?;
        if !keyed
            .iter()
            .all(|(c, key)| leases.can_spend(key, c.cost, now_ms))
        {
            return None;
        }
        let states = keyed
            .iter()
            .map(|(c, key)| leases.spend(key, c.cost, now_ms))
            .collect::<Option<Vec<_>>>()?;
        let rules: Vec<&'c Rule> = keyed.iter().map(|(c, _)| c.rule).collect();
        let modes: Vec<Mode> = rules.iter().map(|r| r.mode).collect();
        // The headers show the figures the grants were made under.
        let overrides = keyed
            .iter()
            .enumerate()
            .filter_map(|(i, (_, key))| {
                let read = leases.overridden(key)?;
                Some(OverrideRead {
                    rule: i,
                    ..read.clone()
                })
            })
            .collect();
        let decision = Decision {
            overrides,
            ..Decision::settle(states, &modes)
        };
        let admitted = Forward::Admitted(Decided { rules, decision });
        Some(Handled::new(Outcome::Forward(admitted), vec![]))
    }

    /// The leases to ask for in the request's own call: each leasing rule
    /// what its key's demand here wants.
    pub(super) fn lease_asks(
        &self,
        checks: &[(Check<'c>, Vec<&str>)],
        leased: &Leased,
        now_ms: u64,
    ) -> Vec<LeaseAsk> {
        let mut leases = self.leases.borrow_mut();
        checks
            .iter()
            .zip(&leased.0)
            .enumerate()
            .filter_map(|(i, ((c, _), key))| {
                let lease = c.rule.lease?;
                let key = key.as_deref()?;
                let horizon_ms = lease_horizon_ms(c.rule, key, now_ms);
                let units = leases.begin_ask(key, lease.units, horizon_ms, now_ms);
                Some(LeaseAsk {
                    rule: i,
                    units,
                    for_ms: lease.for_ms,
                })
            })
            .collect()
    }

    /// The keys whose leases run low after this request, to refresh after
    /// the response; one refresh in flight per key.
    pub(super) fn refresh_due(
        &self,
        selection: &Selection<'c, Cow<'_, str>>,
        leased: &Leased,
        now_ms: u64,
    ) -> Option<LeaseRefresh> {
        let mut leases = self.leases.borrow_mut();
        let rules: Vec<(RuleId, String, u64)> = selection
            .rules
            .iter()
            .zip(&leased.0)
            .filter_map(|((rule_id, rule, _), key)| {
                let (lease, key) = (rule.lease?, key.as_deref()?);
                let horizon_ms = lease_horizon_ms(rule, key, now_ms);
                let units = leases.begin_refresh(key, lease.units, horizon_ms, now_ms);
                (units > 0).then(|| (*rule_id, key.to_owned(), units))
            })
            .collect();
        (!rules.is_empty()).then_some(LeaseRefresh { rules })
    }

    /// Asks for the leases of `pending` in one call charging no request,
    /// after the response has gone (sent at `now_ms`). A fault is only
    /// logged: the next request without units makes its own call.
    pub async fn refresh(&self, pending: &LeaseRefresh, now_ms: u64) -> Vec<Event> {
        // Away from the home, a shared rule's units come from the pool.
        let (pooled, own): (Vec<_>, Vec<_>) = (pending.rules.iter()).partition(|(id, _, _)| {
            self.home.is_some() && self.config.rule(*id).is_some_and(|r| r.shared.is_some())
        });
        let mut events = match pooled.is_empty() {
            true => vec![],
            false => self.refresh_pools(&pooled, now_ms).await,
        };
        if !own.is_empty() {
            events.extend(self.refresh_own(&own, now_ms).await);
        }
        events
    }

    /// [`Limiter::refresh`] of rules whose units come from their own state.
    async fn refresh_own(&self, rules: &[&(RuleId, String, u64)], now_ms: u64) -> Vec<Event> {
        let found: Vec<(Check<'c>, &str, u64)> = rules
            .iter()
            .filter_map(|(rule_id, key, units)| {
                let rule = self.config.rule(*rule_id)?;
                Some((Check { rule, cost: 0 }, key.as_str(), *units))
            })
            .collect();
        // The keys were made with the request's call: the identifier
        // parts are not needed again.
        let checks: Vec<(Check<'c>, Vec<&str>)> =
            found.iter().map(|(c, _, _)| (*c, vec![])).collect();
        let keys: Vec<&str> = found.iter().map(|(_, key, _)| *key).collect();
        let asks = found
            .iter()
            .enumerate()
            .filter_map(|(i, (c, _, units))| {
                Some(LeaseAsk {
                    rule: i,
                    units: *units,
                    for_ms: c.rule.lease?.for_ms,
                })
            })
            .collect();
        let call = ScriptCall::decide_at(&checks, &keys, self.clock(now_ms));
        let call = self.under_rule_wide(call, &checks, now_ms).asking(asks);
        let budget = budget_of(checks.iter().map(|(c, _)| c.rule));
        match self.call_leasing(&checks, &call, budget, now_ms).await {
            // A refresh is a call too: figures it reads end the leases.
            (Ok(_), granted) => granted,
            (Err(error), _) => checks
                .iter()
                .zip(call.rule_keys())
                .map(|((c, _), key)| Event {
                    key: Some(key.to_owned()),
                    error: Some(error.to_string()),
                    ..Event::new(Action::LeaseFailed, &c.rule.name)
                })
                .collect(),
        }
    }

    /// Runs `call`, sent at `now_ms` for `checks`' leasing rules, and
    /// settles what it brings back into the leases: each decision's grants
    /// (the events returned) and the units held, added to what it reports
    /// remaining. The limiter's one send and a lease refresh both call it.
    pub(super) async fn call_leasing(
        &self,
        checks: &[(Check<'c>, Vec<&str>)],
        call: &ScriptCall,
        budget: Duration,
        now_ms: u64,
    ) -> (Result<Vec<Decision>, ScriptError>, Vec<Event>) {
        let epochs = self.epochs(call);
        let result = self.call(call, budget, true).await;
        self.answered(call);
        let mut granted = vec![];
        let result = result.map(|mut decisions| {
            for d in &mut decisions {
                granted.extend(self.settle_leases(checks, call, &epochs, d, now_ms));
            }
            decisions
        });
        (result, granted)
    }

    /// Each rule key's lease epoch as `call` is sent (see
    /// [`Leases::epoch`]), in call order.
    pub(super) fn epochs(&self, call: &ScriptCall) -> Vec<u64> {
        let leases = self.leases.borrow();
        call.rule_keys().iter().map(|k| leases.epoch(k)).collect()
    }

    /// What `decision`, the answer to `call` (sent at `sent_ms`, its keys
    /// then at `epochs`), means for this isolate's leases: figures other
    /// than those a key's leases were granted under (a block, a lowered
    /// limit) end them; its grants are kept, unless something ended the
    /// key's leases while the call was out; and where a key holds units,
    /// the response's `remaining` counts them, as a leased response does.
    /// One `lease_grant` event per grant kept.
    pub(super) fn settle_leases(
        &self,
        checks: &[(Check<'c>, Vec<&str>)],
        call: &ScriptCall,
        epochs: &[u64],
        decision: &mut Decision,
        sent_ms: u64,
    ) -> Vec<Event> {
        let keys = call.rule_keys();
        let mut leases = self.leases.borrow_mut();
        let current = |leases: &Leases, i: usize| {
            keys.get(i)
                .is_some_and(|k| epochs.get(i) == Some(&leases.epoch(k)))
        };
        let grants: Vec<Grant> = decision
            .grants
            .iter()
            .filter(|g| current(&leases, g.rule))
            .copied()
            .collect();
        for o in &decision.overrides {
            if let Some(key) = keys.get(o.rule) {
                leases.figures_read(key, decision.override_of(o.rule));
            }
        }
        let events = grants
            .iter()
            .filter_map(|g| {
                let (key, state) = (keys.get(g.rule)?, decision.rules.get(g.rule)?);
                let overridden = decision.override_of(g.rule).cloned();
                leases.grant(key, g.units, g.for_ms, sent_ms, (*state, overridden));
                Some(Event {
                    key: Some((*key).to_owned()),
                    units: Some(g.units),
                    lease_ms: Some(g.for_ms),
                    ..Event::new(Action::LeaseGrant, &checks.get(g.rule)?.0.rule.name)
                })
            })
            .collect();
        for (state, key) in decision.rules.iter_mut().zip(&keys) {
            let held = leases.held(key, sent_ms);
            state.remaining = state.remaining.saturating_add(held).min(state.limit);
        }
        if decision.admitted() {
            let modes: Vec<Mode> = checks.iter().map(|(c, _)| c.rule.mode).collect();
            decision.verdict = Decision::settle(decision.rules.clone(), &modes).verdict;
        }
        events
    }

    /// Ends the lease asks `call` carried, answered or not.
    pub(super) fn answered(&self, call: &ScriptCall) {
        if let ScriptCall::Decide(g) | ScriptCall::Group(Group { first: g, .. }) = call {
            let mut leases = self.leases.borrow_mut();
            for ask in &g.leases {
                leases.answered(&g.rules[ask.rule].0.key);
            }
        }
    }
}

/// How long a lease of `rule` for `key` granted at `now_ms` would last,
/// for sizing it from demand: a GCRA lease's length; a window's, until the
/// current bucket ends if sooner (on this isolate's clock, near enough to
/// Redis's for sizing: the deadline itself always comes from the script).
fn lease_horizon_ms(rule: &Rule, key: &str, now_ms: u64) -> u64 {
    let Some(lease) = rule.lease else {
        return 0;
    };
    let shifted_ms = || now_ms + window_offset(key, rule.policy.longest_ms());
    (rule.policy.algorithm()).lease_horizon_ms(lease.for_ms, &shifted_ms)
}
