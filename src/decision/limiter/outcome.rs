//! What the limiter says of one request: what should happen to it, the
//! log events that go with it, and the work it leaves for after the
//! response (charges to give back, leases to refresh). Built here from a
//! decision, a failed call or a refusal, for every path of the limiter.

use crate::decision::{
    memory::in_flight::SharedCall,
    outcomes::events::{Action, Event},
    outcomes::verdict::{seconds_up, Decision, OverrideSource},
    transport::keys::{override_key, penalty_key},
    transport::protocol::{Check, Credit, RefundCharge, ScriptCall, ScriptError},
};
use crate::rules::{
    config::Config,
    overrides::Override,
    rule::{Ambiguous, FailMode, Mode, Rule, RuleId},
};

/// What should happen to the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<'c> {
    /// Send it on to the origin.
    Forward(Forward<'c>),
    /// Answer 429: an enforced rule denied it.
    Deny(Decided<'c>),
    /// Answer 400: an enforced rule cannot identify the client.
    Refuse {
        /// The rule.
        rule: &'c Rule,
        /// The key part given several values.
        ambiguous: Ambiguous,
    },
    /// Answer 503: Redis could not decide, and a rule fails closed.
    Unavailable,
}

/// Why a request goes on to the origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forward<'c> {
    /// No rule limits it.
    Unlimited,
    /// Every enforced rule admitted it.
    Admitted(Decided<'c>),
    /// Redis could not decide, and every rule fails open.
    Bypassed,
}

/// The rules a request was decided under, and their decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided<'c> {
    /// The rules, in call order.
    pub rules: Vec<&'c Rule>,
    /// Their states and the verdict.
    pub decision: Decision,
}

/// The limiter's answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled<'c> {
    /// What should happen to the request.
    pub outcome: Outcome<'c>,
    /// Events for the log, one JSON line each.
    pub events: Vec<Event>,
    /// Charges to give back once the origin has answered, if its status is
    /// not one their rule counts: see [`Limiter::refund`].
    pub refund: Option<PendingRefund>,
    /// Leases running low, to refresh once the response has gone: see
    /// [`Limiter::refresh`].
    pub refresh: Option<LeaseRefresh>,
    /// Rules whose rule-wide override this isolate should read again once
    /// the response has gone: see [`Limiter::reread`].
    pub reread: Vec<String>,
    /// The call that decided this request with others of its client, when
    /// one did (see [`crate::decision::memory::in_flight`]).
    pub shared: Option<SharedCall>,
    /// Pools of shared rules to top up, and grants to write into them,
    /// once the response has gone: see [`Limiter::top_up`].
    pub pool: PoolWork,
}

impl<'c> Handled<'c> {
    /// An answer of `outcome` with `events`, and nothing left to do after.
    pub(super) fn new(outcome: Outcome<'c>, events: Vec<Event>) -> Handled<'c> {
        Handled {
            outcome,
            events,
            refund: None,
            refresh: None,
            reread: vec![],
            shared: None,
            pool: PoolWork::default(),
        }
    }
}

/// The charges of a forwarded request's `count_status` rules, made up
/// front, to give back if the origin's status is not one the rule counts.
/// Owned, so it can outlive the request's borrows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRefund {
    /// The rules, each with its client, cost and refund mark.
    pub rules: Vec<RefundRule>,
    /// The signature of the call that charged them, under which the
    /// isolate remembers that client's denials (see `block_cache`).
    pub signature: String,
}

/// One rule of a [`PendingRefund`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundRule {
    /// The rule.
    pub rule: RuleId,
    /// The client's identifier parts.
    pub id: Vec<String>,
    /// The client's state key under the rule, as its decision's call made it.
    pub key: String,
    /// Units charged.
    pub cost: u64,
    /// What the decision replied for the charge (see `lua/limiter.lua`).
    pub mark: u64,
    /// The override the charge was made under (its text; empty for none).
    pub under: String,
}

impl RefundRule {
    /// The charge `decision` replied `mark` for on its rule `i`: `rule`,
    /// for client `id` at its state `key`, of `cost` units, under the
    /// override it read.
    pub fn of(
        decision: &Decision,
        (i, mark): (usize, u64),
        rule: RuleId,
        (id, key): (Vec<String>, String),
        cost: u64,
    ) -> RefundRule {
        let under = decision
            .override_of(i)
            .map(|o| o.text.clone())
            .unwrap_or_default();
        RefundRule {
            rule,
            id,
            key,
            cost,
            mark,
            under,
        }
    }
}

impl PendingRefund {
    /// The charges to give back after an answer of `status`: those of
    /// `count_status` rules that do not count it, ready for
    /// [`ScriptCall::refund`]; rules `config` lacks are left out.
    pub fn uncounted<'a>(&'a self, config: &'a Config, status: u16) -> Vec<RefundCharge<'a>> {
        self.rules
            .iter()
            .filter_map(|r| {
                let rule = config.rule(r.rule)?;
                let uncounted =
                    !rule.count_status.is_empty() && !rule.count_status.contains(&status);
                uncounted.then(|| r.charge(rule))
            })
            .collect()
    }

    /// What a response of `status` whose headers `reported` costs (each
    /// `cost_header` rule's value, by header name) settles: the charges to
    /// give back, whole for `count_status` rules that do not count the
    /// status and by the units the estimate exceeded the cost reported by;
    /// those to charge again, by the units the cost exceeded it by; and the
    /// rules whose value was no cost (with what it was), whose estimates
    /// stand.
    pub fn settled<'a>(
        &'a self,
        config: &'a Config,
        (status, reported): (u16, &[(String, Option<String>)]),
    ) -> Settlement<'a> {
        let mut settlement = Settlement {
            back: self.uncounted(config, status),
            ..Settlement::default()
        };
        for r in &self.rules {
            let Some(rule) = config.rule(r.rule) else {
                continue;
            };
            let Some(header) = &rule.cost_header else {
                continue;
            };
            let value = (reported.iter().find(|(name, _)| name == header))
                .and_then(|(_, value)| value.as_deref());
            let capacity = r.capacity(rule);
            let Some(cost) = value.and_then(|v| reported_cost(v, capacity)) else {
                settlement
                    .ignored
                    .push((rule, value.map(str::to_owned), capacity));
                continue;
            };
            let mut charge = r.charge(rule);
            let estimate = charge.check.cost;
            charge.check.cost = cost.abs_diff(estimate);
            match cost.cmp(&estimate) {
                std::cmp::Ordering::Less => settlement.back.push(charge),
                std::cmp::Ordering::Greater => settlement.more.push(charge),
                std::cmp::Ordering::Equal => {}
            }
        }
        settlement
    }

    /// The slots to give back once the response has ended: those of
    /// in-flight rules, whatever the response; rules `config` lacks are
    /// left out.
    pub fn releasing<'a>(&'a self, config: &'a Config) -> Vec<RefundCharge<'a>> {
        self.rules
            .iter()
            .filter_map(|r| {
                let rule = config.rule(r.rule)?;
                rule.policy.algorithm().released().then(|| r.charge(rule))
            })
            .collect()
    }

    /// Whether some of its charges are slots to give back at the
    /// response's end.
    pub fn releases(&self, config: &Config) -> bool {
        !self.releasing(config).is_empty()
    }
}

/// What a response's reported costs settle: see [`PendingRefund::settled`].
#[derive(Debug, Default)]
pub struct Settlement<'a> {
    /// Charges to give back: whole where the status is not counted, else
    /// of the units the estimate exceeded the cost by.
    pub back: Vec<RefundCharge<'a>>,
    /// Charges to charge again, each of the units the cost exceeded the estimate by.
    pub more: Vec<RefundCharge<'a>>,
    /// Rules whose header held no cost, with what it held (`None`: absent)
    /// and the most it could have said.
    pub ignored: Vec<(&'a Rule, Option<String>, u64)>,
}

/// A cost as a response reports it: a whole number in plain digits, from
/// 0 to the most one request of the rule may cost; anything else is none.
pub fn reported_cost(value: &str, capacity: u64) -> Option<u64> {
    let digits = value.trim();
    let plain =
        !digits.is_empty() && digits.len() <= 19 && digits.bytes().all(|b| b.is_ascii_digit());
    digits.parse().ok().filter(|n| plain && *n <= capacity)
}

impl RefundRule {
    /// The most one request may cost under `rule` as its charge was made:
    /// an override's figures when one was read, so that a client whose
    /// limit was raised is charged what it reports, not the estimate.
    fn capacity(&self, rule: &Rule) -> u64 {
        match Override::parse(&self.under, &rule.policy) {
            Some(Override::Figures(figures)) => figures.capacity(),
            _ => rule.policy.capacity(),
        }
    }

    /// Its charge under `rule`, ready for [`ScriptCall::refund`].
    fn charge<'a>(&'a self, rule: &'a Rule) -> RefundCharge<'a> {
        RefundCharge {
            check: Check {
                rule,
                cost: self.cost,
            },
            id: self.id.iter().map(String::as_str).collect(),
            key: &self.key,
            mark: self.mark,
            under: &self.under,
        }
    }
}

/// Leases to ask for after a response, one per key running low. Owned, so
/// it can outlive the request's borrows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRefresh {
    /// Each rule, with its client's state key (as the request's call made
    /// it) and the units wanted.
    pub rules: Vec<(RuleId, String, u64)>,
}

/// What a request decided for a region other than the home leaves for
/// after its response (see `pooled.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolWork {
    /// Top-ups its spend asked for, to ask the home for.
    pub asks: Vec<TopUpAsk>,
    /// What the home granted with its far decision, each with its rule, to
    /// write into the region's pools.
    pub credits: Vec<(RuleId, Credit)>,
}

impl PoolWork {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.asks.is_empty() && self.credits.is_empty()
    }
}

/// One top-up a spend asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopUpAsk {
    /// The shared rule.
    pub rule: RuleId,
    /// The client's state key under it, at the home.
    pub key: String,
    /// Units wanted.
    pub units: u64,
    /// When the spend asked, on the region's clock (us).
    pub asked_us: u64,
}

/// An enforced rule that cannot identify a request's client, and why: the
/// request is refused with a 400.
pub type Refusal<'c> = (RuleId, &'c Rule, Ambiguous);

/// The outcome of a decision, with its log events.
pub(super) fn decided<'c>(
    checks: &[(Check<'c>, Vec<&str>)],
    call: &ScriptCall,
    decision: Decision,
) -> Handled<'c> {
    let rules: Vec<&Rule> = checks.iter().map(|(c, _)| c.rule).collect();
    let keys = call.rule_keys();
    let mut events: Vec<Event> = rules
        .iter()
        .zip(&decision.rules)
        .zip(&keys)
        .filter(|((r, _), _)| r.mode == Mode::Shadow)
        .filter_map(|((r, s), key)| {
            let retry = s.retry()?;
            Some(Event {
                retry_after: retry.seconds(),
                key: Some((*key).to_owned()),
                ..Event::new(Action::WouldDeny, &r.name)
            })
        })
        .collect();
    events.extend(penalty_events(checks, call, &decision));
    events.extend(ignored_overrides(checks, call, &decision));
    if let Some(retry) = decision.retry() {
        let binding = decision.binding();
        events.push(Event {
            status: Some(429),
            retry_after: retry.seconds(),
            key: keys.get(binding).map(|k| (*k).to_owned()),
            overridden: override_named(&decision, binding),
            ..Event::new(Action::Deny, &rules[binding].name)
        });
        return Handled::new(Outcome::Deny(Decided { rules, decision }), events);
    }
    let admitted = Forward::Admitted(Decided { rules, decision });
    Handled::new(Outcome::Forward(admitted), events)
}

/// Whose override rule `i` of `decision` was decided under, and what it
/// held, for the log: `client: v1 block`.
fn override_named(decision: &Decision, i: usize) -> Option<String> {
    let read = decision.override_of(i)?;
    let whose = match read.source {
        OverrideSource::None => return None,
        OverrideSource::Client => "client",
        OverrideSource::Rule => "rule",
    };
    Some(format!("{whose}: {}", read.text))
}

/// One `override_ignored` event per client override key that held
/// something that is no override.
fn ignored_overrides(
    checks: &[(Check<'_>, Vec<&str>)],
    call: &ScriptCall,
    decision: &Decision,
) -> Vec<Event> {
    let keys = call.rule_keys();
    decision
        .overrides
        .iter()
        .filter(|o| o.ignored)
        .filter_map(|o| {
            Some(Event {
                key: keys.get(o.rule).map(|k| override_key(k)),
                ..Event::new(Action::OverrideIgnored, &checks.get(o.rule)?.0.rule.name)
            })
        })
        .collect()
}

/// One `refund_failed` event per charge a failed refund call kept.
pub(super) fn refund_failed(
    charges: &[RefundCharge<'_>],
    call: &ScriptCall,
    status: Option<u16>,
    error: &ScriptError,
) -> Vec<Event> {
    charges
        .iter()
        .zip(call.rule_keys())
        .map(|(charge, key)| Event {
            status,
            key: Some(key.to_owned()),
            error: Some(error.to_string()),
            ..Event::new(Action::RefundFailed, &charge.check.rule.name)
        })
        .collect()
}

/// One event per penalty the decision started, naming its penalty key.
fn penalty_events(
    checks: &[(Check<'_>, Vec<&str>)],
    call: &ScriptCall,
    decision: &Decision,
) -> Vec<Event> {
    let keys = call.rule_keys();
    decision
        .penalties_started
        .iter()
        .filter_map(|&i| {
            let rule = checks.get(i)?.0.rule;
            let action = match rule.mode {
                Mode::Shadow => Action::WouldPenaltyStart,
                Mode::Enforce => Action::PenaltyStart,
            };
            Some(Event {
                status: (!decision.admitted()).then_some(429),
                retry_after: rule.penalty_ms.map(seconds_up),
                key: keys.get(i).map(|k| penalty_key(k)),
                ..Event::new(action, &rule.name)
            })
        })
        .collect()
}

/// What the log says of a key part given several values.
pub fn ambiguity(a: &Ambiguous) -> String {
    format!("`{}` came with several different values", a.part)
}

/// A request an enforced rule cannot identify: refused, with its event.
pub(super) fn refused((_, rule, ambiguous): Refusal<'_>) -> Handled<'_> {
    let event = Event {
        status: Some(400),
        error: Some(ambiguity(&ambiguous)),
        ..Event::new(Action::Refuse, &rule.name)
    };
    Handled::new(Outcome::Refuse { rule, ambiguous }, vec![event])
}

/// Seconds a client is told to wait when the limiter cannot decide.
pub const UNAVAILABLE_RETRY_S: u64 = 1;

/// Redis could not decide: the fail mode of the rules says what happens.
pub(super) fn failed<'c>(
    checks: &[(Check<'c>, Vec<&str>)],
    call: &ScriptCall,
    error: &ScriptError,
) -> Handled<'c> {
    // One enforced closed rule is enough to refuse: it asked never to be
    // bypassed. Shadow rules never block, not even here.
    let closed = checks
        .iter()
        .any(|(c, _)| c.rule.fail == FailMode::Closed && c.rule.mode == Mode::Enforce);
    let action = if closed {
        Action::FailClosed
    } else {
        Action::FailOpen
    };
    let events = checks
        .iter()
        .zip(call.rule_keys())
        .map(|((check, _), key)| Event {
            status: closed.then_some(503),
            retry_after: closed.then_some(UNAVAILABLE_RETRY_S),
            key: Some(key.to_owned()),
            error: Some(error.to_string()),
            ..Event::new(action, &check.rule.name)
        })
        .collect();
    let outcome = match closed {
        true => Outcome::Unavailable,
        false => Outcome::Forward(Forward::Bypassed),
    };
    Handled::new(outcome, events)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{reported_cost, PendingRefund, RefundRule};
    use crate::rules::{config::Config, overrides::Override, rule::RuleId};

    /// A report above the rule's burst but within an override's that
    /// raised it is charged; without the override it is no cost.
    #[test]
    fn a_reported_cost_is_held_to_the_override_the_charge_was_made_under() {
        let rule = |burst: u64| {
            json!({"name": "tokens", "key": ["ip"], "algorithm": "gcra", "rate": burst,
                   "period": "1d", "burst": burst, "cost": 5, "cost_header": "X-Tokens"})
        };
        let config = Config::from_json(&json!({"rules": [rule(100)]})).unwrap();
        let raised = Config::from_json(&json!({"rules": [rule(1000)]})).unwrap();
        let raised = Override::Figures(raised.rules[0].policy.clone()).to_text();
        let pending = |under: String| PendingRefund {
            rules: vec![RefundRule {
                rule: RuleId(0),
                id: vec!["198.51.100.7".into()],
                key: "k".into(),
                cost: 5,
                mark: 1,
                under,
            }],
            signature: String::new(),
        };
        let reported = [("x-tokens".to_owned(), Some("500".to_owned()))];
        let plain = pending(String::new());
        let settled = plain.settled(&config, (200, &reported));
        assert!(settled.more.is_empty() && settled.back.is_empty());
        assert_eq!(settled.ignored[0].1.as_deref(), Some("500"));
        assert_eq!(settled.ignored[0].2, 100);
        let under = pending(raised);
        let settled = under.settled(&config, (200, &reported));
        assert!(settled.ignored.is_empty(), "{:?}", settled.ignored);
        let more: Vec<u64> = settled.more.iter().map(|c| c.check.cost).collect();
        assert_eq!(more, [495]);
    }

    #[test]
    fn a_reported_cost_is_a_whole_number_within_the_rule() {
        for (value, read) in [
            ("10", Some(10)),
            (" 7 ", Some(7)),
            ("0", Some(0)),
            ("100", Some(100)),
        ] {
            assert_eq!(reported_cost(value, 100), read, "{value}");
        }
        for value in [
            "",
            "-1",
            "+3",
            "2.5",
            "1e3",
            "101",
            "99999999999999999999",
            "ten",
            "0x10",
        ] {
            assert_eq!(reported_cost(value, 100), None, "{value}");
        }
    }
}
