//! Every call the limiter script answers, encoded as its `KEYS` and
//! `ARGV` as `lua/limiter.lua` lays them out.

use super::{algorithms, pool_call::PoolSpend, script::Entry};
use crate::{
    decision::transport::keys::{override_key, penalty_key, rule_key, window_offset},
    rules::{
        overrides::Override,
        policy::Policy,
        rule::{Mode, Rule},
    },
};

/// How the general decision treats one rule: `ARGV[3]` holds one letter
/// per rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallMode {
    /// `e`: denies, and is charged when the request is admitted.
    Enforce,
    /// `s`: reported, never denies, charged when the request is admitted.
    Shadow,
    /// `r`: as `e`, with a refund mark in the reply (`count_status`).
    EnforceRefundable,
    /// `q`: as `s`, with a refund mark in the reply.
    ShadowRefundable,
}

impl CallMode {
    /// The mode of a rule in `mode`, refundable or not.
    pub fn of(mode: Mode, refundable: bool) -> CallMode {
        match (mode, refundable) {
            (Mode::Enforce, false) => CallMode::Enforce,
            (Mode::Shadow, false) => CallMode::Shadow,
            (Mode::Enforce, true) => CallMode::EnforceRefundable,
            (Mode::Shadow, true) => CallMode::ShadowRefundable,
        }
    }

    /// Its letter in `ARGV[3]`.
    pub fn letter(self) -> char {
        match self {
            CallMode::Enforce => 'e',
            CallMode::Shadow => 's',
            CallMode::EnforceRefundable => 'r',
            CallMode::ShadowRefundable => 'q',
        }
    }

    /// Whether the reply carries a refund mark for the rule.
    pub fn refundable(self) -> bool {
        matches!(
            self,
            CallMode::EnforceRefundable | CallMode::ShadowRefundable
        )
    }

    /// The rule's own mode: whether its denial blocks.
    pub fn rule_mode(self) -> Mode {
        match self {
            CallMode::Enforce | CallMode::EnforceRefundable => Mode::Enforce,
            CallMode::Shadow | CallMode::ShadowRefundable => Mode::Shadow,
        }
    }
}

/// A rule applied to one request, with its cost.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// Units this request costs under it (0 peeks).
    pub cost: u64,
}

/// One rule of a call: its key, figures, cost and bucket offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleArgs {
    /// The client's state key for the rule.
    pub key: String,
    /// The rule's figures.
    pub policy: Policy,
    /// Units asked for (0 peeks).
    pub cost: u64,
    /// How far this key's window edges are shifted, ms (windows only).
    pub offset_ms: u64,
}

impl RuleArgs {
    fn new(rule: &Rule, cost: u64, id: &[&str]) -> RuleArgs {
        RuleArgs::keyed(rule, cost, rule_key(rule, id))
    }

    /// A rule's arguments at a `key` made before.
    fn keyed(rule: &Rule, cost: u64, key: String) -> RuleArgs {
        let offset_ms = window_offset(&key, rule.policy.longest_ms());
        RuleArgs {
            key,
            policy: rule.policy.clone(),
            cost,
            offset_ms,
        }
    }

    /// The general decision's arguments for this rule: `gcra`, cost,
    /// interval (us), burst; or `window`, cost, offset (ms), n, then n x
    /// (duration, limit, precision) in ms.
    fn push_general(&self, args: &mut Vec<String>) {
        algorithms::of(&self.policy).push_general(self.cost, self.offset_ms, args);
    }

    /// The one-rule path's arguments: the rule's own, its word naming
    /// the operation.
    fn one_rule_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        self.push_general(&mut args);
        args
    }
}

fn push_numbers(args: &mut Vec<String>, numbers: &[u64]) {
    args.extend(numbers.iter().map(u64::to_string));
}

/// A rule governing a request alone on Redis's clock, with no penalty and
/// charged now: the script's cheapest path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneRule {
    /// The entry that decides it: its algorithm's one-rule path.
    pub entry: Entry,
    /// The rule's key and figures.
    pub rule: RuleArgs,
    /// The rule's mode, for settling the reply.
    pub mode: Mode,
    /// The client's override key ([`override_key`]) when the rule takes
    /// overrides: sent as `KEYS[2]`, and when it holds one the script
    /// decides the call as the general decision would ([`OneRule::general`]).
    pub override_key: Option<String>,
}

/// A penalty the general decision may start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Penalty {
    /// 0-based index of its rule in the call.
    pub rule: usize,
    /// Its length, ms.
    pub ms: u64,
    /// Where it runs: [`penalty_key`] of the rule's key.
    pub key: String,
}

/// A lease asked for with a decision: see `lua/limiter.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAsk {
    /// 0-based index of its rule in the call.
    pub rule: usize,
    /// The most units wanted (at least 1).
    pub units: u64,
    /// How long the lease lasts at most, ms; a window's ends with the
    /// bucket its units are counted in, if that comes first.
    pub for_ms: u64,
}

/// An override the general decision reads for a rule: the client's, from
/// its key, and the rule's own, as the caller holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideAsk {
    /// 0-based index of its rule in the call.
    pub rule: usize,
    /// The client's override key ([`override_key`]).
    pub key: String,
    /// The rule-wide override's text, empty for none.
    pub wide: String,
    /// How long the rule-wide override lasts, ms (-1: without end).
    pub wide_ms: i64,
}

/// The general decision: every rule all or nothing, on a pinned clock or
/// Redis's, with penalties, leases and overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct General {
    /// The pinned clock, ms (tests, simulation); `None` for Redis's.
    pub now_ms: Option<u64>,
    /// The rules, in call order, each with how it is treated.
    pub rules: Vec<(RuleArgs, CallMode)>,
    /// The penalties of rules that have one.
    pub penalties: Vec<Penalty>,
    /// The leases asked for, granted only if the request is admitted.
    pub leases: Vec<LeaseAsk>,
    /// The overrides read, one per rule that takes them.
    pub overrides: Vec<OverrideAsk>,
    /// In a region away from the home, the pools of the request's shared
    /// rules, spent in the same call, all or nothing (`lua/pool.lua`).
    pub pools: Vec<PoolSpend>,
}

/// Requests of one client under the same rules and keys, decided one
/// after another at one instant: the first as its [`General`] decision
/// would be, each further one after it at its own costs, each admitted
/// while it fits; the leases are asked for with the last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The first request's decision, with the group's leases, overrides
    /// and penalties.
    pub first: General,
    /// Each further request's cost per rule, in the order they are decided.
    pub further: Vec<Vec<u64>>,
}

/// Every call the limiter script answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptCall {
    /// One rule alone on Redis's clock ([`Entry::OneGcra`],
    /// [`Entry::OneWindowed`]).
    OneRule(OneRule),
    /// The decision on a request ([`Entry::Decide`]).
    Decide(General),
    /// The decisions on several requests of one client ([`Entry::Group`]).
    Group(Group),
    /// Forget these keys ([`Entry::Reset`]); replies with how many existed.
    Reset(Vec<String>),
    /// Give refundable charges back ([`Entry::Refund`]).
    Refund(Refund),
}

/// A charge to give back after a response: the rule and client it was
/// made for and its units, the refund mark its decision replied with, and
/// the override it was made under. A GCRA charge is given back at the
/// interval it was made at, or a raised rate's refund would erase other
/// requests' charges.
#[derive(Debug, Clone)]
pub struct RefundCharge<'a> {
    /// The rule and the units charged.
    pub check: Check<'a>,
    /// The client's identifier parts.
    pub id: Vec<&'a str>,
    /// The client's state key under the rule, as the decision's call made
    /// it: the refund gives the charge back there.
    pub key: &'a str,
    /// The decision's refund mark for the rule.
    pub mark: u64,
    /// The text of the override the decision applied to the rule (see
    /// `rules::overrides`); empty for none.
    pub under: &'a str,
}

/// Refundable charges to give back, each rule with the mark its decision
/// replied with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// The pinned clock, ms; `None` for Redis's.
    pub now_ms: Option<u64>,
    /// Each rule's key, figures and charged cost, with its refund mark.
    pub rules: Vec<(RuleArgs, u64)>,
    /// Whether each rule is charged its cost more instead ([`Entry::Debit`]).
    pub debit: bool,
}

impl ScriptCall {
    /// A decision over `checks`, each with its client's identifier parts;
    /// `now_ms` pins the clock (tests, simulation), `None` uses Redis's.
    /// Every rule is charged when all admit; for a rule with
    /// `count_status` the reply carries a refund mark, by which
    /// [`ScriptCall::refund`] gives the charge back once the origin's
    /// status shows it is not counted.
    pub fn decide(checks: &[(Check<'_>, Vec<&str>)], now_ms: Option<u64>) -> ScriptCall {
        let rules: Vec<RuleArgs> = (checks.iter())
            .map(|(c, id)| RuleArgs::new(c.rule, c.cost, id))
            .collect();
        ScriptCall::decide_args(checks, rules, now_ms)
    }

    /// The same decision at the state keys made for `checks` before
    /// (`keys`, one per check, as [`ScriptCall::rule_keys`] gives them), so
    /// that a request's key is made once however many calls it makes.
    pub fn decide_at(
        checks: &[(Check<'_>, Vec<&str>)],
        keys: &[&str],
        now_ms: Option<u64>,
    ) -> ScriptCall {
        let rules: Vec<RuleArgs> = (checks.iter().zip(keys))
            .map(|((c, _), key)| RuleArgs::keyed(c.rule, c.cost, (*key).to_owned()))
            .collect();
        ScriptCall::decide_args(checks, rules, now_ms)
    }

    /// The decision over `checks`, whose arguments are `rules`.
    fn decide_args(
        checks: &[(Check<'_>, Vec<&str>)],
        rules: Vec<RuleArgs>,
        now_ms: Option<u64>,
    ) -> ScriptCall {
        match ScriptCall::one_rule(checks, &rules, now_ms) {
            Some(one) => ScriptCall::OneRule(one),
            None => ScriptCall::Decide(General::new(checks, rules, vec![], now_ms)),
        }
    }

    /// A decision that also asks for `leases`, granted only if the request
    /// is admitted (asks for no units are left out).
    pub fn decide_leasing(
        checks: &[(Check<'_>, Vec<&str>)],
        leases: Vec<LeaseAsk>,
        now_ms: Option<u64>,
    ) -> ScriptCall {
        ScriptCall::decide(checks, now_ms).asking(leases)
    }

    /// The decisions on several requests of one client under `checks`'
    /// rules and keys, one after another at one instant: `costs[r]` holds
    /// request r's cost on each rule (the checks' own are not read). The
    /// last asks for `leases`; a group of one is that request's decision.
    pub fn group(
        checks: &[(Check<'_>, Vec<&str>)],
        costs: &[Vec<u64>],
        leases: Vec<LeaseAsk>,
        now_ms: Option<u64>,
    ) -> ScriptCall {
        (ScriptCall::decide(checks, now_ms).grouped(costs)).asking(leases)
    }

    /// This decision asking for `leases` too (asks for no units, or for no
    /// rule of the call, are left out): a lone rule's call becomes the
    /// general decision, which carries them; a group asks with its last
    /// request.
    pub fn asking(self, mut leases: Vec<LeaseAsk>) -> ScriptCall {
        let rules = self.rule_keys().len();
        leases.retain(|l| l.units > 0 && l.rule < rules);
        if leases.is_empty() {
            return self;
        }
        self.general_with(|g| General { leases, ..g }, true)
    }

    /// This decision spending `pools` too, all or nothing: a lone rule's
    /// call becomes the general decision, which carries them. A group
    /// carries none: its requests' pools are spent on their own.
    pub fn pooling(self, pools: Vec<PoolSpend>) -> ScriptCall {
        if pools.is_empty() {
            return self;
        }
        self.general_with(|g| General { pools, ..g }, false)
    }

    /// This decision's general call made over by `change`, a lone rule's
    /// first turned into one; a group's first request's too when `groups`.
    fn general_with(self, change: impl FnOnce(General) -> General, groups: bool) -> ScriptCall {
        match self {
            ScriptCall::OneRule(one) => ScriptCall::Decide(change(one.general())),
            ScriptCall::Decide(g) => ScriptCall::Decide(change(g)),
            ScriptCall::Group(Group { first, further }) if groups => ScriptCall::Group(Group {
                first: change(first),
                further,
            }),
            other => other,
        }
    }

    /// This decision's rules and keys deciding a group of requests:
    /// `costs[r]` holds request r's cost on each rule, the first's
    /// replacing the call's own; a group of one is that request's decision.
    pub fn grouped(self, costs: &[Vec<u64>]) -> ScriptCall {
        let [first, further @ ..] = costs else {
            return self;
        };
        let mut general = match self {
            ScriptCall::OneRule(mut one) if further.is_empty() => {
                one.rule.cost = first.first().copied().unwrap_or(one.rule.cost);
                return ScriptCall::OneRule(one);
            }
            ScriptCall::OneRule(one) => one.general(),
            ScriptCall::Decide(g) => g,
            other => return other,
        };
        for ((rule, _), &cost) in general.rules.iter_mut().zip(first) {
            rule.cost = cost;
        }
        if further.is_empty() {
            return ScriptCall::Decide(general);
        }
        ScriptCall::Group(Group {
            first: general,
            further: further.to_vec(),
        })
    }

    /// Gives back `charges`, each at the figures it was charged under.
    pub fn refund(charges: &[RefundCharge<'_>], now_ms: Option<u64>) -> ScriptCall {
        ScriptCall::settling(charges, now_ms, false)
    }

    /// Charges each of `charges`'s units more, past the limit if it must
    /// be, at the figures its decision charged under: what a response
    /// reported past the estimate charged up front.
    pub fn debit(charges: &[RefundCharge<'_>], now_ms: Option<u64>) -> ScriptCall {
        ScriptCall::settling(charges, now_ms, true)
    }

    fn settling(charges: &[RefundCharge<'_>], now_ms: Option<u64>, debit: bool) -> ScriptCall {
        let rules = charges
            .iter()
            .map(|c| {
                let mut args = RuleArgs::keyed(c.check.rule, c.check.cost, c.key.to_owned());
                if let Some(Override::Figures(figures)) = Override::parse(c.under, &args.policy) {
                    args.policy = figures;
                }
                (args, c.mark)
            })
            .collect();
        ScriptCall::Refund(Refund {
            now_ms,
            rules,
            debit,
        })
    }

    /// The one-rule path, where it decides the same as the general one: a
    /// lone rule on Redis's clock, with no penalty and nothing to refund.
    fn one_rule(
        checks: &[(Check<'_>, Vec<&str>)],
        rules: &[RuleArgs],
        now_ms: Option<u64>,
    ) -> Option<OneRule> {
        let (None, [(check, _)], [rule_args]) = (now_ms, checks, rules) else {
            return None;
        };
        let rule = check.rule;
        let plain =
            rule.count_status.is_empty() && rule.cost_header.is_none() && rule.penalty_ms.is_none();
        let entry = algorithms::of(&rule.policy).one_rule_entry()?;
        plain.then(|| {
            let rule_args = rule_args.clone();
            OneRule {
                entry,
                override_key: rule.overrides.then(|| override_key(&rule_args.key)),
                rule: rule_args,
                mode: rule.mode,
            }
        })
    }

    /// This call carrying the rule-wide overrides the caller holds:
    /// `wide(i)` is the one in force for the call's rule `i` (its text and
    /// ms left, -1 for no end), and a rule it gives none for carries none.
    /// A lone rule under one goes the general way, where the script
    /// applies it.
    pub fn with_rule_wide(mut self, wide: impl Fn(usize) -> Option<(String, i64)>) -> ScriptCall {
        if let ScriptCall::OneRule(one) = &self {
            if one.override_key.is_some() && wide(0).is_some() {
                self = ScriptCall::Decide(one.general());
            }
        }
        let general = match &mut self {
            ScriptCall::Decide(g) => Some(g),
            ScriptCall::Group(group) => Some(&mut group.first),
            _ => None,
        };
        if let Some(g) = general {
            for o in &mut g.overrides {
                (o.wide, o.wide_ms) = wide(o.rule).unwrap_or((String::new(), -1));
            }
        }
        self
    }

    /// A look at where one client stands on `rule`, consuming nothing:
    /// one state per window (a decision reports only the binding window),
    /// or the one GCRA state. Each window is peeked as a rule of its own
    /// over the same key and offset, so it reads the rule's own counters.
    pub fn inspect(rule: &Rule, id: &[&str]) -> ScriptCall {
        if rule.policy.algorithm().items() <= 1 {
            return ScriptCall::decide(&[(Check { rule, cost: 0 }, id.to_vec())], None);
        }
        let whole = RuleArgs::new(rule, 0, id);
        let rules = (rule.policy.parts().into_iter())
            .map(|policy| {
                let args = RuleArgs {
                    policy,
                    ..whole.clone()
                };
                (args, CallMode::Enforce)
            })
            .collect();
        ScriptCall::Decide(General {
            now_ms: None,
            rules,
            penalties: vec![],
            leases: vec![],
            overrides: vec![],
            pools: vec![],
        })
    }

    /// Forgets the state of the given rules for these clients; a rule's
    /// running penalty goes too.
    pub fn reset(rules: &[(&Rule, Vec<&str>)]) -> ScriptCall {
        let mut keys = Vec::with_capacity(rules.len());
        for (rule, id) in rules {
            let key = rule_key(rule, id);
            if rule.penalty_ms.is_some() {
                keys.push(penalty_key(&key));
            }
            keys.push(key);
        }
        ScriptCall::Reset(keys)
    }

    /// The entry point this call takes in the script.
    pub fn entry(&self) -> Entry {
        match self {
            ScriptCall::OneRule(one) => one.entry,
            ScriptCall::Decide(_) => Entry::Decide,
            ScriptCall::Group(_) => Entry::Group,
            ScriptCall::Reset(_) => Entry::Reset,
            ScriptCall::Refund(r) if r.debit => Entry::Debit,
            ScriptCall::Refund(_) => Entry::Refund,
        }
    }

    /// The call's `KEYS`: each rule's state key, then the client override
    /// keys read, then the penalty keys.
    pub fn keys(&self) -> Vec<String> {
        match self {
            ScriptCall::OneRule(one) => {
                let mut keys = vec![one.rule.key.clone()];
                keys.extend(one.override_key.clone());
                keys
            }
            ScriptCall::Decide(g) => g.keys(),
            ScriptCall::Group(group) => group.first.keys(),
            ScriptCall::Reset(keys) => keys.clone(),
            ScriptCall::Refund(r) => r.rules.iter().map(|(a, _)| a.key.clone()).collect(),
        }
    }

    /// The call's `ARGV`, as `lua/limiter.lua` lays it out.
    pub fn args(&self) -> Vec<String> {
        match self {
            ScriptCall::OneRule(one) => one.rule.one_rule_args(),
            ScriptCall::Decide(g) => g.args(g.now_ms, true),
            ScriptCall::Group(group) => group.args(true),
            ScriptCall::Reset(_) => vec![Entry::RESET.to_owned()],
            ScriptCall::Refund(r) => r.args(),
        }
    }

    /// The state key of each rule in call order.
    pub fn rule_keys(&self) -> Vec<&str> {
        match self {
            ScriptCall::OneRule(one) => vec![one.rule.key.as_str()],
            ScriptCall::Decide(g) | ScriptCall::Group(Group { first: g, .. }) => {
                g.rules.iter().map(|(r, _)| r.key.as_str()).collect()
            }
            ScriptCall::Refund(r) => r.rules.iter().map(|(a, _)| a.key.as_str()).collect(),
            ScriptCall::Reset(_) => vec![],
        }
    }

    /// What decides the same way wherever it is sent: the keys and every
    /// argument but the clock, the leases asked for and a rule-wide
    /// override's time left. The block cache keys its denials on it.
    pub fn signature(&self) -> String {
        let args = match self {
            ScriptCall::Decide(g) => g.args(None, false),
            ScriptCall::Group(group) => group.args(false),
            other => other.args(),
        };
        let mut s = self.keys().join("\n");
        for arg in args {
            s.push('\n');
            s.push_str(&arg);
        }
        s
    }
}

impl General {
    fn new(
        checks: &[(Check<'_>, Vec<&str>)],
        args: Vec<RuleArgs>,
        leases: Vec<LeaseAsk>,
        now_ms: Option<u64>,
    ) -> General {
        let rules: Vec<(RuleArgs, CallMode)> = (checks.iter().zip(args))
            .map(|((c, _), args)| {
                let refundable = !c.rule.count_status.is_empty()
                    || c.rule.cost_header.is_some()
                    || c.rule.policy.algorithm().released();
                (args, CallMode::of(c.rule.mode, refundable))
            })
            .collect();
        let penalties = checks
            .iter()
            .enumerate()
            .filter_map(|(i, (c, _))| {
                Some(Penalty {
                    rule: i,
                    ms: c.rule.penalty_ms?,
                    key: penalty_key(&rules[i].0.key),
                })
            })
            .collect();
        let overrides = checks
            .iter()
            .enumerate()
            .filter(|(_, (c, _))| c.rule.overrides)
            .map(|(i, _)| OverrideAsk {
                rule: i,
                key: override_key(&rules[i].0.key),
                wide: String::new(),
                wide_ms: -1,
            })
            .collect();
        General {
            now_ms,
            rules,
            penalties,
            leases,
            overrides,
            pools: vec![],
        }
    }

    /// One key per rule, then one per override read, one per penalty, and
    /// one per pool.
    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.rules.iter().map(|(r, _)| r.key.clone()).collect();
        keys.extend(self.overrides.iter().map(|o| o.key.clone()));
        keys.extend(self.penalties.iter().map(|p| p.key.clone()));
        keys.extend(self.pools.iter().map(|p| p.key.clone()));
        keys
    }

    /// `decide`, the clock (empty for Redis's), the mode letters, each
    /// rule's arguments, then (when `whole`: a signature leaves them out)
    /// `lease`, their count and (1-based rule, units, ms) triples, then
    /// `override`, their count and (1-based rule, rule-wide text, its ms
    /// left) triples (a signature leaves the ms left empty: it changes
    /// every millisecond, the decision does not), then `penalty`, their
    /// count and (1-based rule, ms) pairs, then (when `whole`) `pools`,
    /// their count and each one's spend numbers.
    fn args(&self, now_ms: Option<u64>, whole: bool) -> Vec<String> {
        self.encode(Entry::DECIDE, &[], now_ms, whole)
    }

    /// [`General::args`] under operation `op`, with a group's `further`
    /// requests' costs (`costs`, their count, then each one's per rule)
    /// after the rules' arguments.
    fn encode(
        &self,
        op: &str,
        further: &[Vec<u64>],
        now_ms: Option<u64>,
        whole: bool,
    ) -> Vec<String> {
        let modes: String = self.rules.iter().map(|(_, m)| m.letter()).collect();
        let clock = now_ms.map(|n| n.to_string()).unwrap_or_default();
        let mut args = vec![op.to_owned(), clock, modes];
        for (rule, _) in &self.rules {
            rule.push_general(&mut args);
        }
        if !further.is_empty() {
            args.push("costs".to_owned());
            push_numbers(&mut args, &[further.len() as u64]);
            for costs in further {
                push_numbers(&mut args, costs);
            }
        }
        if whole && !self.leases.is_empty() {
            args.push("lease".to_owned());
            push_numbers(&mut args, &[self.leases.len() as u64]);
            for l in &self.leases {
                push_numbers(&mut args, &[l.rule as u64 + 1, l.units, l.for_ms]);
            }
        }
        if !self.overrides.is_empty() {
            args.push("override".to_owned());
            push_numbers(&mut args, &[self.overrides.len() as u64]);
            for o in &self.overrides {
                push_numbers(&mut args, &[o.rule as u64 + 1]);
                args.push(o.wide.clone());
                args.push(match whole {
                    true => o.wide_ms.to_string(),
                    false => String::new(),
                });
            }
        }
        if !self.penalties.is_empty() {
            args.push("penalty".to_owned());
            push_numbers(&mut args, &[self.penalties.len() as u64]);
            for p in &self.penalties {
                push_numbers(&mut args, &[p.rule as u64 + 1, p.ms]);
            }
        }
        if whole && !self.pools.is_empty() {
            args.push("pools".to_owned());
            push_numbers(&mut args, &[self.pools.len() as u64]);
            for p in &self.pools {
                push_numbers(&mut args, &p.numbers());
            }
        }
        args
    }
}

impl Group {
    /// `group`, then the first request's decision's arguments with the
    /// further requests' costs after its rules (see [`General::args`]).
    fn args(&self, whole: bool) -> Vec<String> {
        let now_ms = self.first.now_ms.filter(|_| whole);
        self.first
            .encode(Entry::GROUP, &self.further, now_ms, whole)
    }
}

impl Refund {
    /// `refund` (or `debit`), the clock (empty for Redis's), then each
    /// rule's arguments as a decision has them, then its mark.
    fn args(&self) -> Vec<String> {
        let clock = self.now_ms.map(|n| n.to_string()).unwrap_or_default();
        let entry = if self.debit {
            Entry::DEBIT
        } else {
            Entry::REFUND
        };
        let mut args = vec![entry.to_owned(), clock];
        for (rule, mark) in &self.rules {
            rule.push_general(&mut args);
            push_numbers(&mut args, &[*mark]);
        }
        args
    }
}

impl OneRule {
    /// The same decision as a general call, reading the client's override
    /// with no rule-wide one: what the script turns this call into when
    /// the override key holds something.
    pub fn general(&self) -> General {
        General {
            now_ms: None,
            rules: vec![(self.rule.clone(), CallMode::of(self.mode, false))],
            penalties: vec![],
            leases: vec![],
            pools: vec![],
            overrides: self
                .override_key
                .iter()
                .map(|key| OverrideAsk {
                    rule: 0,
                    key: key.clone(),
                    wide: String::new(),
                    wide_ms: -1,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::config::Config;
    use serde_json::json;
    /// A check of one unit for client `a`.
    fn unit_for_a(rule: &Rule) -> (Check<'_>, Vec<&'static str>) {
        (Check { rule, cost: 1 }, vec!["a"])
    }

    fn args(call: &ScriptCall) -> Vec<String> {
        call.args()
    }

    fn one(rule: &Rule, cost: u64, offset_ms: u64) -> Vec<String> {
        RuleArgs {
            key: String::new(),
            policy: rule.policy.clone(),
            cost,
            offset_ms,
        }
        .one_rule_args()
    }

    fn general(rule: &Rule, cost: u64, offset_ms: u64) -> Vec<String> {
        let mut out = vec![];
        RuleArgs {
            key: String::new(),
            policy: rule.policy.clone(),
            cost,
            offset_ms,
        }
        .push_general(&mut out);
        out
    }

    #[test]
    fn rule_arguments_follow_the_script_layout() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s", "burst": 5},
            {"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 10, "100ms"]]},
            {"name": "ww", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 10, "100ms"], ["1m", 100, "1m"]]}
        ]}))
        .unwrap();
        let (g, w, ww) = (&c.rules[0], &c.rules[1], &c.rules[2]);
        assert_eq!(general(g, 2, 0), ["gcra", "2", "100000", "5", "0"]);
        assert_eq!(
            general(ww, 1, 42),
            ["window", "1", "42", "2", "1000", "10", "100", "60000", "100", "60000"]
        );
        // A rule alone is its arguments alone, its word naming the operation.
        assert_eq!(one(g, 1, 0), ["gcra", "1", "100000", "5", "0"]);
        assert_eq!(one(w, 2, 7), ["window", "2", "7", "1", "1000", "10", "100"]);
        for rule in [g, w, ww] {
            let entry = algorithms::of(&rule.policy).one_rule_entry().unwrap();
            assert_eq!(one(rule, 3, 1), general(rule, 3, 1));
            assert_eq!(one(rule, 3, 1)[0], entry.operation());
        }
    }

    /// The hash tag a key carries: what Redis Cluster hashes to its slot.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').expect("a hash tag");
        let close = open + key[open..].find('}').expect("a closed hash tag");
        &key[open + 1..close]
    }

    #[test]
    fn every_key_of_a_decision_lies_in_its_clients_slot() {
        // Two rules on one identifier, with a penalty, overrides and a lease:
        // one slot, as docs/how-it-works.md's cluster section says, so one call.
        let c = Config::from_json(&json!({"rules": [
            {"name": "g", "key": ["header:x-api-key"], "algorithm": "gcra", "rate": 10, "period": "1s",
             "burst": 20, "overrides": true, "penalty": "1m", "lease": 4},
            {"name": "w", "key": ["header:x-api-key"], "algorithm": "windowed",
             "windows": [["1s", 10, "100ms"]], "overrides": true}
        ]}))
        .unwrap();
        for id in ["k-1", "a key with spaces and {braces}"] {
            let checks: Vec<_> = c
                .rules
                .iter()
                .map(|r| (Check { rule: r, cost: 1 }, vec![id]))
                .collect();
            let lease = LeaseAsk {
                rule: 0,
                units: 2,
                for_ms: 100,
            };
            let call = ScriptCall::decide_leasing(&checks, vec![lease], None);
            // A lone rule's call reads its override key too.
            let lone = ScriptCall::decide(&checks[1..], None);
            assert_eq!(lone.entry(), Entry::OneWindowed);
            for (call, n) in [(call, 5), (lone, 2)] {
                let keys = call.keys();
                assert_eq!(keys.len(), n, "{keys:?}");
                assert!(
                    keys.iter().all(|k| hash_tag(k) == hash_tag(&keys[0])),
                    "{keys:?}"
                );
            }
        }
    }

    #[test]
    fn each_call_names_its_entry_and_the_signature_leaves_out_the_clock() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s"},
            {"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 10, "100ms"]]},
            {"name": "p", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m", "penalty": "1h"}
        ]}))
        .unwrap();
        let check = |i: usize| unit_for_a(&c.rules[i]);
        assert_eq!(
            ScriptCall::decide(&[check(0)], None).entry(),
            Entry::OneGcra
        );
        assert_eq!(
            ScriptCall::decide(&[check(1)], None).entry(),
            Entry::OneWindowed
        );
        assert_eq!(ScriptCall::decide(&[check(2)], None).entry(), Entry::Decide);
        assert_eq!(
            ScriptCall::decide(&[check(0)], Some(5)).entry(),
            Entry::Decide
        );
        assert_eq!(
            ScriptCall::reset(&[(&c.rules[0], vec!["a"])]).entry(),
            Entry::Reset
        );
        let pinned = |now| ScriptCall::decide(&[check(0), check(1)], Some(now));
        assert_ne!(pinned(1).args(), pinned(2).args());
        assert_eq!(pinned(1).signature(), pinned(2).signature());
        let penalty = ScriptCall::decide(&[check(2)], None);
        assert_eq!(penalty.keys(), ["el:{a}:p", "el:{a}:p:p"]);
        assert_eq!(penalty.rule_keys(), ["el:{a}:p"]);
        assert_eq!(
            &penalty.args()[3..],
            ["gcra", "1", "60000000", "1", "0", "penalty", "1", "1", "3600000"]
        );
    }

    /// A rule-wide override with an end is sent with its time left, which
    /// changes every millisecond; a signature leaves that out, or no
    /// denial under such an override could be answered from the cache.
    #[test]
    fn the_signature_leaves_out_a_rule_wide_overrides_time_left() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s",
             "overrides": true}
        ]}))
        .unwrap();
        let text = "v1 gcra 1 60000 2 60000000";
        let under = |left_ms: i64, text: &str| {
            ScriptCall::decide(&[unit_for_a(&c.rules[0])], None)
                .with_rule_wide(|_| Some((text.to_owned(), left_ms)))
        };
        assert_ne!(under(5000, text).args(), under(4999, text).args());
        assert_eq!(under(5000, text).signature(), under(4999, text).signature());
        assert_ne!(
            under(5000, text).signature(),
            under(5000, crate::rules::overrides::BLOCK_TEXT).signature()
        );
    }

    /// A group's call is its first request's decision with the further
    /// requests' costs after the rules, and asks for its leases once; a
    /// group of one is that request's own call.
    #[test]
    fn a_group_carries_each_further_requests_costs_after_its_rules() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s", "burst": 5},
            {"name": "b", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m"}
        ]}))
        .unwrap();
        let checks: Vec<_> = c.rules.iter().map(unit_for_a).collect();
        let lease = LeaseAsk {
            rule: 0,
            units: 2,
            for_ms: 100,
        };
        let costs = [vec![1, 1], vec![2, 1], vec![3, 0]];
        let group = ScriptCall::group(&checks, &costs, vec![lease], Some(7));
        assert_eq!(group.entry(), Entry::Group);
        assert_eq!(group.keys(), ["el:{a}:a", "el:{a}:b"]);
        assert_eq!(group.rule_keys(), ["el:{a}:a", "el:{a}:b"]);
        assert_eq!(
            args(&group),
            [
                "group", "7", "ee", "gcra", "1", "100000", "5", "0", "gcra", "1", "60000000", "1",
                "0", "costs", "2", "2", "1", "3", "0", "lease", "1", "1", "2", "100"
            ]
        );
        let lone = ScriptCall::group(&checks[1..], &[vec![4]], vec![], None);
        let four = Check {
            cost: 4,
            ..checks[1].0
        };
        assert_eq!(lone, ScriptCall::decide(&[(four, vec!["a"])], None));
    }

    #[test]
    fn calls_carry_one_key_per_rule() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s", "burst": 5},
            {"name": "b", "key": ["ip"], "algorithm": "windowed", "windows": [["1m", 100, "1m"]]}
        ]}))
        .unwrap();
        let checks = vec![
            (
                Check {
                    rule: &c.rules[0],
                    cost: 1,
                },
                vec!["1.2.3.4"],
            ),
            (
                Check {
                    rule: &c.rules[1],
                    cost: 2,
                },
                vec!["1.2.3.4"],
            ),
        ];
        let call = ScriptCall::decide(&checks, Some(5));
        assert_eq!(call.keys(), ["el:{1.2.3.4}:a", "el:{1.2.3.4}:b"]);
        let offset = window_offset("el:{1.2.3.4}:b", 60_000).to_string();
        assert_eq!(
            args(&call),
            [
                "decide", "5", "ee", "gcra", "1", "100000", "5", "0", "window", "2", &offset, "1",
                "60000", "100", "60000"
            ]
        );
        assert_eq!(args(&ScriptCall::decide(&checks, None))[1], "");
    }
}
