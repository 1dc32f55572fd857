//! The limiter script's protocol, owned here alone: the script embedded with
//! its SHA1, every call it answers encoded as its `KEYS` and `ARGV`, the
//! reply read back into a [`Decision`], and [`run`], through which every
//! caller sends a call. `lua/limiter.lua` documents the same contract from
//! the script's side.

use std::time::Duration;

use serde_json::Value;

use super::{
    keys::{override_key, penalty_key, redis_key, window_offset},
    redis_rest::{RestClient, RestError, Script},
    verdict::{Decision, Grant, OverrideRead, OverrideSource, Retry, RuleState, Verdict},
};
use crate::rules::{
    overrides::{Override, MAX_TEXT_BYTES},
    policy::{Gcra, Policy, Window, Windows},
    rule::{Mode, Rule},
};

/// The limiter script: the files `build.rs` lists, joined behind a
/// `#!lua flags=allow-key-locking` shebang, without their comments.
pub const LIMITER: Script = Script {
    source: include_str!(concat!(env!("OUT_DIR"), "/limiter.lua")),
    sha1: include_str!(concat!(env!("OUT_DIR"), "/limiter.sha1")),
};

/// The Lua files joined into [`LIMITER`], in order, each with its text:
/// the list `build.rs` keeps, for the tests that hold the script to them.
#[cfg(test)]
const LUA_FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/lua_files.rs"));

/// The script's entry points, and what selects each. The cheapest encoding
/// measured is kept: the two one-rule paths carry no operation name, and
/// are told apart by how many arguments they get (the table at the top of
/// `lua/limiter.lua` says the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// A GCRA rule alone on Redis's clock: 2 or 3 arguments, the first no
    /// operation name (`lua/gcra.lua`).
    OneGcra,
    /// A windowed rule alone on Redis's clock: 4 or more arguments, the
    /// first no operation name (`lua/windowed.lua`). Either one-rule entry
    /// with a second key reads it as the client's override, and becomes
    /// [`Entry::Decide`] inside the script when it holds one.
    OneWindowed,
    /// Everything else: `ARGV[1] == 'decide'` (`lua/limiter.lua`).
    Decide,
    /// `ARGV[1] == 'reset'`, alone: deletes every key given.
    Reset,
    /// `ARGV[1] == 'refund'`: gives refundable charges back.
    Refund,
}

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
        let key = redis_key(&rule.name, id);
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
        match &self.policy {
            Policy::Gcra(g) => {
                args.push("gcra".to_owned());
                push_numbers(args, &[self.cost, g.interval_us(), g.burst()]);
            }
            Policy::Windowed(ws) => {
                args.push("window".to_owned());
                push_numbers(args, &[self.cost, self.offset_ms, ws.len() as u64]);
                push_windows(args, ws);
            }
        }
    }

    /// The one-rule path's arguments: interval (us) and burst; or the
    /// offset, then each window; then the cost when it is not 1.
    fn one_rule_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        match &self.policy {
            Policy::Gcra(g) => push_numbers(&mut args, &[g.interval_us(), g.burst()]),
            Policy::Windowed(ws) => {
                push_numbers(&mut args, &[self.offset_ms]);
                push_windows(&mut args, ws);
            }
        }
        if self.cost != 1 {
            push_numbers(&mut args, &[self.cost]);
        }
        args
    }
}

fn push_numbers(args: &mut Vec<String>, numbers: &[u64]) {
    args.extend(numbers.iter().map(u64::to_string));
}

fn push_windows(args: &mut Vec<String>, windows: &Windows) {
    for w in windows.iter() {
        push_numbers(args, &[w.duration_ms(), w.limit(), w.precision_ms()]);
    }
}

/// A rule governing a request alone on Redis's clock, with no penalty and
/// charged now: the script's cheapest path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneRule {
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

/// What one rule-wide override key held when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WideRead {
    /// Its text (empty: no key) and ms to live (negative: no end). Only
    /// its first [`MAX_TEXT_BYTES`] + 1 bytes are read: longer is no
    /// override.
    Text(String, i64),
    /// A value of another type, a stray write: no override.
    NotText,
    /// Its commands failed: it is read again later.
    Failed(RestError),
}

/// Reads the rule-wide override keys `keys`, each with its own commands
/// (`GETRANGE` of its first [`MAX_TEXT_BYTES`] + 1 bytes, `PTTL`) in one
/// request: the keys lie in several hash slots, which one script call
/// cannot span on a cluster, and a key of another type fails only its own
/// read. Fails whole only when the request does.
pub async fn read_rule_wide(
    runner: &impl ScriptRunner,
    keys: &[String],
    budget: Duration,
) -> Result<Vec<WideRead>, RestError> {
    let last = MAX_TEXT_BYTES.to_string();
    let mut commands = Vec::with_capacity(2 * keys.len());
    for key in keys {
        let range = ["GETRANGE", key, "0", &last];
        commands.push(range.map(str::to_owned).to_vec());
        commands.push(vec!["PTTL".to_owned(), key.clone()]);
    }
    let replies = runner.commands(&commands, budget).await?;
    if replies.len() != commands.len() {
        return Err(RestError::Malformed(format!(
            "{} results for {} commands reading the rule-wide overrides",
            replies.len(),
            commands.len()
        )));
    }
    Ok(replies.chunks(2).map(wide_read).collect())
}

/// A key's `GETRANGE` and `PTTL` results, as what it held.
fn wide_read(pair: &[Result<Value, RestError>]) -> WideRead {
    match pair {
        [Err(RestError::Redis(e)), _] if e.starts_with("WRONGTYPE") => WideRead::NotText,
        [Ok(Value::String(text)), Ok(pttl)] => match pttl.as_i64() {
            // No key: none, even when it expired between the two commands.
            Some(-2) => WideRead::Text(String::new(), -1),
            Some(ms) => WideRead::Text(text.clone(), ms),
            None => WideRead::Failed(RestError::Malformed(format!("PTTL answered {pttl}"))),
        },
        [Err(e), _] | [_, Err(e)] => WideRead::Failed(e.clone()),
        _ => WideRead::Failed(RestError::Malformed(
            "GETRANGE answered other than text".to_owned(),
        )),
    }
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
}

/// Every call the limiter script answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptCall {
    /// One rule alone on Redis's clock ([`Entry::OneGcra`],
    /// [`Entry::OneWindowed`]).
    OneRule(OneRule),
    /// The decision on a request ([`Entry::Decide`]).
    Decide(General),
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
pub struct Charge<'a> {
    /// The rule and the units charged.
    pub check: Check<'a>,
    /// The client's identifier parts.
    pub id: Vec<&'a str>,
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
}

/// What the script answered: a decision, the keys a reset removed, or what
/// a refund gave back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The verdict on every rule of a decision.
    Decision(Decision),
    /// How many keys a reset deleted.
    Removed(u64),
    /// Per rule of a refund, whether anything was given back.
    Refunded(Vec<bool>),
}

impl Reply {
    /// The decision, for calls that decide.
    pub fn decision(self) -> Result<Decision, ScriptError> {
        match self {
            Reply::Decision(d) => Ok(d),
            Reply::Removed(n) => Err(ScriptError::Reply(format!(
                "a count ({n}) where a decision was due"
            ))),
            Reply::Refunded(_) => Err(ScriptError::Reply(
                "another call's reply where a decision was due".into(),
            )),
        }
    }
}

/// A call's failure: the store's, or a reply outside the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScriptError {
    /// The REST call failed; see the transport's error.
    Store(RestError),
    /// The script answered something this protocol does not read.
    Reply(String),
}

impl std::fmt::Display for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScriptError::Store(e) => e.fmt(f),
            ScriptError::Reply(why) => write!(
                f,
                "the Redis REST endpoint answered outside the protocol: limiter script reply {why}"
            ),
        }
    }
}

impl std::error::Error for ScriptError {}

impl From<RestError> for ScriptError {
    fn from(e: RestError) -> ScriptError {
        ScriptError::Store(e)
    }
}

/// Something that can run a script, and plain commands: the REST client,
/// or a fake.
// The worker is single-threaded, so the futures need not be `Send`.
#[allow(async_fn_in_trait)]
pub trait ScriptRunner {
    /// Runs `script` with these keys and arguments, within `budget`.
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
        budget: Duration,
    ) -> Result<Value, RestError>;

    /// Sends plain `commands` in one request, within `budget`: one result
    /// per command, in order, each its own.
    async fn commands(
        &self,
        commands: &[Vec<String>],
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError>;
}

impl ScriptRunner for RestClient {
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
        budget: Duration,
    ) -> Result<Value, RestError> {
        self.run_script(script, keys, args, budget).await
    }

    async fn commands(
        &self,
        commands: &[Vec<String>],
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError> {
        self.pipeline(commands, budget).await
    }
}

/// Sends `call` to the limiter script and reads its reply.
pub async fn run(
    runner: &impl ScriptRunner,
    call: &ScriptCall,
    budget: Duration,
) -> Result<Reply, ScriptError> {
    let reply = runner
        .eval(&LIMITER, &call.keys(), &call.args(), budget)
        .await?;
    call.decode(&reply)
}

/// Fields per rule in the general reply.
const PER_RULE: usize = 6;

impl ScriptCall {
    /// A decision over `checks`, each with its client's identifier parts;
    /// `now_ms` pins the clock (tests, simulation), `None` uses Redis's.
    /// Every rule is charged when all admit; for a rule with
    /// `count_status` the reply carries a refund mark, by which
    /// [`ScriptCall::refund`] gives the charge back once the origin's
    /// status shows it is not counted.
    pub fn decide(checks: &[(Check<'_>, Vec<&str>)], now_ms: Option<u64>) -> ScriptCall {
        ScriptCall::decide_leasing(checks, vec![], now_ms)
    }

    /// A decision that also asks for `leases`, granted only if the request
    /// is admitted (asks for no units are left out).
    pub fn decide_leasing(
        checks: &[(Check<'_>, Vec<&str>)],
        mut leases: Vec<LeaseAsk>,
        now_ms: Option<u64>,
    ) -> ScriptCall {
        leases.retain(|l| l.units > 0 && l.rule < checks.len());
        if leases.is_empty() {
            if let Some(one) = ScriptCall::one_rule(checks, now_ms) {
                return ScriptCall::OneRule(one);
            }
        }
        ScriptCall::Decide(General::new(checks, leases, now_ms))
    }

    /// Gives back `charges`, each at the figures it was charged under.
    pub fn refund(charges: &[Charge<'_>], now_ms: Option<u64>) -> ScriptCall {
        let rules = charges
            .iter()
            .map(|c| {
                let mut args = RuleArgs::new(c.check.rule, c.check.cost, &c.id);
                if let Some(Override::Figures(figures)) = Override::parse(c.under, &args.policy) {
                    args.policy = figures;
                }
                (args, c.mark)
            })
            .collect();
        ScriptCall::Refund(Refund { now_ms, rules })
    }

    /// The one-rule path, where it decides the same as the general one: a
    /// lone rule on Redis's clock, with no penalty and nothing to refund.
    fn one_rule(checks: &[(Check<'_>, Vec<&str>)], now_ms: Option<u64>) -> Option<OneRule> {
        let (None, [(check, id)]) = (now_ms, checks) else {
            return None;
        };
        let rule = check.rule;
        let plain = rule.count_status.is_empty() && rule.penalty_ms.is_none();
        plain.then(|| {
            let rule_args = RuleArgs::new(rule, check.cost, id);
            OneRule {
                override_key: rule.overrides.then(|| override_key(&rule_args.key)),
                rule: rule_args,
                mode: rule.mode,
            }
        })
    }

    /// This call carrying the rule-wide overrides the caller holds:
    /// `wide(i)` is the one in force for the call's rule `i` (its text and
    /// ms left, -1 for no end). A lone rule under one goes the general
    /// way, where the script applies it.
    pub fn with_rule_wide(mut self, wide: impl Fn(usize) -> Option<(String, i64)>) -> ScriptCall {
        if let ScriptCall::OneRule(one) = &self {
            if one.override_key.is_some() && wide(0).is_some() {
                self = ScriptCall::Decide(one.general());
            }
        }
        if let ScriptCall::Decide(g) = &mut self {
            for o in &mut g.overrides {
                if let Some((text, ms)) = wide(o.rule) {
                    (o.wide, o.wide_ms) = (text, ms);
                }
            }
        }
        self
    }

    /// A look at where one client stands on `rule`, consuming nothing:
    /// one state per window (a decision reports only the binding window),
    /// or the one GCRA state. Each window is peeked as a rule of its own
    /// over the same key and offset, so it reads the rule's own counters.
    pub fn inspect(rule: &Rule, id: &[&str]) -> ScriptCall {
        let windows = match &rule.policy {
            Policy::Windowed(ws) if ws.len() > 1 => ws,
            _ => return ScriptCall::decide(&[(Check { rule, cost: 0 }, id.to_vec())], None),
        };
        let whole = RuleArgs::new(rule, 0, id);
        let rules = windows
            .iter()
            .filter_map(|w| Windows::new(vec![*w]).ok())
            .map(|one| {
                let args = RuleArgs {
                    policy: Policy::Windowed(one),
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
        })
    }

    /// Forgets the state of the given rules for these clients; a rule's
    /// running penalty goes too.
    pub fn reset(rules: &[(&Rule, Vec<&str>)]) -> ScriptCall {
        let mut keys = Vec::with_capacity(rules.len());
        for (rule, id) in rules {
            let key = redis_key(&rule.name, id);
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
            ScriptCall::OneRule(one) => match one.rule.policy {
                Policy::Gcra(_) => Entry::OneGcra,
                Policy::Windowed(_) => Entry::OneWindowed,
            },
            ScriptCall::Decide(_) => Entry::Decide,
            ScriptCall::Reset(_) => Entry::Reset,
            ScriptCall::Refund(_) => Entry::Refund,
        }
    }

    /// The call's `KEYS`: each rule's state key, then the client override
    /// keys read, then the penalty keys.
    pub fn keys(&self) -> Vec<String> {
        match self {
            ScriptCall::OneRule(one) => {
                let state = Some(one.rule.key.clone());
                state.into_iter().chain(one.override_key.clone()).collect()
            }
            ScriptCall::Decide(g) => g.keys(),
            ScriptCall::Reset(keys) => keys.clone(),
            ScriptCall::Refund(r) => r.rules.iter().map(|(a, _)| a.key.clone()).collect(),
        }
    }

    /// The call's `ARGV`, as `lua/limiter.lua` lays it out.
    pub fn args(&self) -> Vec<String> {
        match self {
            ScriptCall::OneRule(one) => one.rule.one_rule_args(),
            ScriptCall::Decide(g) => g.args(g.now_ms, true),
            ScriptCall::Reset(_) => vec!["reset".to_owned()],
            ScriptCall::Refund(r) => r.args(),
        }
    }

    /// The state key of each rule in call order.
    pub fn rule_keys(&self) -> Vec<&str> {
        match self {
            ScriptCall::OneRule(one) => vec![one.rule.key.as_str()],
            ScriptCall::Decide(g) => g.rules.iter().map(|(r, _)| r.key.as_str()).collect(),
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
            other => other.args(),
        };
        let mut s = self.keys().join("\n");
        for arg in args {
            s.push('\n');
            s.push_str(&arg);
        }
        s
    }

    /// Reads the script's reply to this call.
    pub fn decode(&self, reply: &Value) -> Result<Reply, ScriptError> {
        match self {
            ScriptCall::OneRule(one) => one.decode(reply).map(Reply::Decision),
            ScriptCall::Decide(g) => g.decode(reply).map(Reply::Decision),
            ScriptCall::Reset(_) => reply
                .as_u64()
                .map(Reply::Removed)
                .ok_or_else(|| ScriptError::Reply(format!("{reply} is not a count"))),
            ScriptCall::Refund(r) => {
                let given = reply
                    .as_array()
                    .filter(|items| items.len() == r.rules.len())
                    .and_then(|items| {
                        items
                            .iter()
                            .map(|v| v.as_u64().filter(|n| *n <= 1).map(|n| n == 1))
                            .collect::<Option<Vec<bool>>>()
                    });
                given
                    .map(Reply::Refunded)
                    .ok_or_else(|| malformed(reply, "is no refund's reply"))
            }
        }
    }
}

impl General {
    fn new(
        checks: &[(Check<'_>, Vec<&str>)],
        leases: Vec<LeaseAsk>,
        now_ms: Option<u64>,
    ) -> General {
        let rules: Vec<(RuleArgs, CallMode)> = checks
            .iter()
            .map(|(c, id)| {
                let refundable = !c.rule.count_status.is_empty();
                (
                    RuleArgs::new(c.rule, c.cost, id),
                    CallMode::of(c.rule.mode, refundable),
                )
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
        }
    }

    /// One key per rule, then one per override read, then one per penalty.
    fn keys(&self) -> Vec<String> {
        let rules = self.rules.iter().map(|(r, _)| r.key.clone());
        rules
            .chain(self.overrides.iter().map(|o| o.key.clone()))
            .chain(self.penalties.iter().map(|p| p.key.clone()))
            .collect()
    }

    /// `decide`, the clock (empty for Redis's), the mode letters, each
    /// rule's arguments, then (when `whole`: a signature leaves them out)
    /// `lease`, their count and (1-based rule, units, ms) triples, then
    /// `override`, their count and (1-based rule, rule-wide text, its ms
    /// left) triples (a signature leaves the ms left empty: it changes
    /// every millisecond, the decision does not), then `penalty` and
    /// (1-based rule, ms) pairs.
    fn args(&self, now_ms: Option<u64>, whole: bool) -> Vec<String> {
        let modes: String = self.rules.iter().map(|(_, m)| m.letter()).collect();
        let clock = now_ms.map(|n| n.to_string()).unwrap_or_default();
        let mut args = vec!["decide".to_owned(), clock, modes];
        for (rule, _) in &self.rules {
            rule.push_general(&mut args);
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
            for p in &self.penalties {
                push_numbers(&mut args, &[p.rule as u64 + 1, p.ms]);
            }
        }
        args
    }

    /// The longest `ask` may be granted for: its length, and for a window
    /// no longer than a bucket.
    fn longest_lease_ms(&self, ask: &LeaseAsk) -> u64 {
        match self.rules.get(ask.rule).map(|(r, _)| &r.policy) {
            Some(Policy::Windowed(ws)) => ws
                .iter()
                .map(Window::precision_ms)
                .fold(ask.for_ms, u64::min),
            _ => ask.for_ms,
        }
    }

    fn modes(&self) -> Vec<Mode> {
        self.rules.iter().map(|(_, m)| m.rule_mode()).collect()
    }

    /// Six fields per rule, the penalties mask when the call has
    /// penalties, a refund mark per refundable rule, then units and ms per
    /// lease asked for.
    fn decode(&self, reply: &Value) -> Result<Decision, ScriptError> {
        let refundable: Vec<usize> = (0..self.rules.len())
            .filter(|&i| self.rules[i].1.refundable())
            .collect();
        let Some(items) = reply.as_array() else {
            return Err(malformed(reply, "is not an array"));
        };
        let (items, read) = items.split_at(items.len().saturating_sub(3 * self.overrides.len()));
        let (items, granted) = items.split_at(items.len().saturating_sub(2 * self.leases.len()));
        let (fields, marks) = items.split_at(items.len().saturating_sub(refundable.len()));
        let head = Value::Array(fields.to_vec());
        let mut decision = decode_general(&head, &self.modes(), !self.penalties.is_empty())?;
        for (i, mark) in refundable.into_iter().zip(marks) {
            let mark = mark
                .as_u64()
                .ok_or_else(|| malformed(reply, "holds a refund mark that is no count"))?;
            if mark > 0 {
                decision.refund_marks.push((i, mark));
            }
        }
        for (ask, pair) in self.leases.iter().zip(granted.chunks(2)) {
            let (Some(units), Some(for_ms)) = (pair[0].as_u64(), pair[1].as_u64()) else {
                return Err(malformed(reply, "holds a lease that is no count"));
            };
            if units > ask.units || (units > 0 && !decision.admitted()) {
                return Err(malformed(reply, "grants a lease it was not asked for"));
            }
            if units > 0 && for_ms > self.longest_lease_ms(ask) {
                return Err(malformed(reply, "grants a lease longer than it may last"));
            }
            if units > 0 {
                decision.grants.push(Grant {
                    rule: ask.rule,
                    units,
                    for_ms,
                });
            }
        }
        for (ask, triple) in self.overrides.iter().zip(read.chunks(3)) {
            let source = match triple[0].as_u64() {
                Some(0) => OverrideSource::None,
                Some(1) => OverrideSource::Client,
                Some(2) => OverrideSource::Rule,
                _ => return Err(malformed(reply, "names no override source")),
            };
            let (Some(ignored), Some(text)) = (triple[1].as_u64(), triple[2].as_str()) else {
                return Err(malformed(reply, "holds an override that is no text"));
            };
            decision.overrides.push(OverrideRead {
                rule: ask.rule,
                source,
                text: text.to_owned(),
                ignored: ignored == 1,
            });
        }
        Ok(decision)
    }
}

impl Refund {
    /// `refund`, the clock (empty for Redis's), then each rule's arguments
    /// as a decision has them, then its mark.
    fn args(&self) -> Vec<String> {
        let clock = self.now_ms.map(|n| n.to_string()).unwrap_or_default();
        let mut args = vec!["refund".to_owned(), clock];
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

    /// GCRA replies with one integer; one window admitted at a cost with
    /// one integer; a call whose override key held something with the
    /// general reply; everything else with six fields.
    fn decode(&self, reply: &Value) -> Result<Decision, ScriptError> {
        let modes = [self.mode];
        if self.override_key.is_some() && reply.as_array().is_some_and(|a| a.len() == PER_RULE + 3)
        {
            return self.general().decode(reply);
        }
        let state = match (&self.rule.policy, reply.as_i64()) {
            (Policy::Gcra(gcra), Some(verdict)) => gcra_state(gcra, self.rule.cost, verdict)?,
            (Policy::Windowed(ws), Some(packed)) => match ws[..] {
                [w] if self.rule.cost > 0 => window_state(&w, packed)?,
                _ => return Err(malformed(reply, "is one integer for several windows")),
            },
            _ => return self.none_read(decode_general(reply, &modes, false)?),
        };
        self.none_read(Decision::settle(vec![state], &modes))
    }

    /// `decision` as its one-rule path made it: where the rule takes
    /// overrides, its key held none.
    fn none_read(&self, mut decision: Decision) -> Result<Decision, ScriptError> {
        if self.override_key.is_some() {
            decision.overrides.push(OverrideRead {
                rule: 0,
                source: OverrideSource::None,
                text: String::new(),
                ignored: false,
            });
        }
        Ok(decision)
    }
}

/// A lone GCRA rule's reply: how far the TAT lay ahead (us), or -1 minus
/// that when denied.
fn gcra_state(gcra: &Gcra, cost: u64, verdict: i64) -> Result<RuleState, ScriptError> {
    let admitted = verdict >= 0;
    // The bitwise complement of -1 - ahead, which cannot overflow.
    let ahead = if admitted { verdict } else { !verdict };
    let state = RuleState::gcra(gcra, cost, ahead as u64);
    if state.admitted() != admitted {
        return Err(ScriptError::Reply(format!(
            "{verdict} contradicts its own verdict"
        )));
    }
    Ok(state)
}

/// A lone window admitted at a cost: remaining x precision + how far into
/// its bucket now lies.
fn window_state(w: &Window, packed: i64) -> Result<RuleState, ScriptError> {
    let (remaining, into_bucket) = u64::try_from(packed)
        .ok()
        .filter(|_| w.precision_ms() > 0)
        .map(|p| (p / w.precision_ms(), p % w.precision_ms()))
        .filter(|(remaining, _)| *remaining <= w.limit())
        .ok_or_else(|| {
            ScriptError::Reply(format!(
                "{packed} is no state of a {}-unit window",
                w.limit()
            ))
        })?;
    Ok(RuleState {
        verdict: Verdict::Admitted,
        limit: w.limit(),
        remaining,
        reset_after_ms: w.duration_ms().saturating_sub(into_bucket),
        window: 1,
    })
}

fn malformed(reply: &Value, why: &str) -> ScriptError {
    // A reply of any size must not become a log line of any size.
    let excerpt: String = reply.to_string().chars().take(200).collect();
    ScriptError::Reply(format!("{why}: {excerpt}"))
}

/// Reads a general reply: six fields per rule for rules with these modes,
/// with the penalties mask at its end when `penalties`.
pub fn decode_general(
    reply: &Value,
    modes: &[Mode],
    penalties: bool,
) -> Result<Decision, ScriptError> {
    let items = reply
        .as_array()
        .ok_or_else(|| malformed(reply, "is not an array"))?;
    let expected = PER_RULE * modes.len() + usize::from(penalties);
    if items.len() != expected {
        let why = format!("has {} items, expected {expected}", items.len());
        return Err(malformed(reply, &why));
    }
    let ints = items
        .iter()
        .map(Value::as_i64)
        .collect::<Option<Vec<i64>>>()
        .ok_or_else(|| malformed(reply, "holds a non-integer"))?;
    let count = |v: i64| u64::try_from(v).map_err(|_| malformed(reply, "holds a negative count"));
    let (fields, mask) = ints.split_at(PER_RULE * modes.len());
    let started = match mask {
        [m] => {
            let m = count(*m)?;
            (0..modes.len().min(64))
                .filter(|i| m >> i & 1 == 1)
                .collect()
        }
        _ => vec![],
    };
    let states = fields
        .chunks(PER_RULE)
        .map(|c| {
            let verdict = match (c[0], u64::try_from(c[4])) {
                (1, _) => Verdict::Admitted,
                (0, Ok(ms)) => Verdict::Denied(Retry::After { ms }),
                // -1: never, the cost exceeds the limit.
                (0, Err(_)) => Verdict::Denied(Retry::Never),
                _ => return Err(malformed(reply, "holds a verdict other than 0 or 1")),
            };
            Ok(RuleState {
                verdict,
                limit: count(c[1])?,
                // A windowed rule can hold more than its limit after the limit was lowered.
                remaining: c[2].max(0) as u64,
                reset_after_ms: count(c[3])?,
                window: usize::try_from(c[5])
                    .ok()
                    .filter(|w| *w >= 1)
                    .ok_or_else(|| malformed(reply, "names no window"))?,
            })
        })
        .collect::<Result<Vec<_>, ScriptError>>()?;
    Ok(Decision {
        penalties_started: started,
        ..Decision::settle(states, modes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decision::verdict::RequestVerdict, rules::config::Config};
    use serde_json::json;

    fn states(reply: Value, modes: &[Mode], penalties: bool) -> Result<Decision, ScriptError> {
        decode_general(&reply, modes, penalties)
    }

    /// A check of one unit for client `a`.
    fn unit_for_a(rule: &Rule) -> (Check<'_>, Vec<&'static str>) {
        (Check { rule, cost: 1 }, vec!["a"])
    }

    fn decision(call: &ScriptCall, reply: Value) -> Result<Decision, ScriptError> {
        call.decode(&reply).and_then(Reply::decision)
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
        assert_eq!(general(g, 2, 0), ["gcra", "2", "100000", "5"]);
        assert_eq!(
            general(ww, 1, 42),
            ["window", "1", "42", "2", "1000", "10", "100", "60000", "100", "60000"]
        );
        // A rule alone has arguments of its own: no tag, the cost only when not 1.
        assert_eq!(one(g, 1, 0), ["100000", "5"]);
        assert_eq!(one(g, 0, 0), ["100000", "5", "0"]);
        assert_eq!(one(w, 1, 7), ["7", "1000", "10", "100"]);
        assert_eq!(one(w, 2, 7), ["7", "1000", "10", "100", "2"]);
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
        // one slot, as the README's cluster section says, so one call.
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
            ["gcra", "1", "60000000", "1", "penalty", "1", "3600000"]
        );
    }

    /// A lease reply is checked like the rest: one longer than asked for,
    /// or than a window's bucket, is malformed (the rule's fail mode),
    /// never units spendable for as long as it says.
    #[test]
    fn a_lease_longer_than_it_may_last_is_a_malformed_reply() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s",
             "burst": 20},
            {"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 10, "100ms"]]}
        ]}))
        .unwrap();
        let leasing = |i: usize| {
            let lease = LeaseAsk {
                rule: 0,
                units: 4,
                for_ms: 500,
            };
            ScriptCall::decide_leasing(&[unit_for_a(&c.rules[i])], vec![lease], None)
        };
        let reply = |units: u64, ms: u64| json!([1, 20, 10, 1100, 0, 1, units, ms]);
        let granted = |i: usize, ms: u64| decision(&leasing(i), reply(4, ms));
        assert_eq!(granted(0, 500).unwrap().grants[0].for_ms, 500);
        assert!(granted(0, 501).is_err());
        assert_eq!(granted(1, 100).unwrap().grants[0].for_ms, 100);
        assert!(granted(1, 101).is_err(), "longer than the 100 ms bucket");
        // No units granted: the length says nothing.
        assert!(decision(&leasing(0), reply(0, 0)).is_ok());
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

    #[test]
    fn refundable_decisions_and_refunds_follow_the_script_layout() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "ip", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s"},
            {"name": "login", "key": ["ip"], "algorithm": "windowed", "windows": [["1m", 3, "1m"]],
             "count_status": [401], "mode": "shadow"}
        ]}))
        .unwrap();
        let check = |i: usize| unit_for_a(&c.rules[i]);
        // A count_status rule alone never takes the one-rule path: its
        // reply must carry the mark.
        assert_eq!(
            ScriptCall::decide(&[check(0)], None).entry(),
            Entry::OneGcra
        );
        assert_eq!(ScriptCall::decide(&[check(1)], None).entry(), Entry::Decide);
        let call = ScriptCall::decide(&[check(0), check(1)], None);
        assert_eq!(call.entry(), Entry::Decide);
        assert_eq!(args(&call)[2], "eq");
        // Six fields per rule, then the shadow rule's mark.
        let d = decision(
            &call,
            json!([
                1,
                10,
                9,
                100,
                0,
                1,
                1,
                3,
                2,
                60000,
                0,
                1,
                3_590_337_600_001_u64
            ]),
        )
        .unwrap();
        assert_eq!(d.refund_marks, [(1, 3_590_337_600_001)]);
        let none = decision(&call, json!([1, 10, 9, 100, 0, 1, 1, 3, 2, 60000, 0, 1, 0])).unwrap();
        assert!(none.refund_marks.is_empty(), "0: not charged");
        assert!(decision(&call, json!([1, 10, 9, 100, 0, 1, 1, 3, 2, 60000, 0, 1])).is_err());
        assert!(decision(
            &call,
            json!([1, 10, 9, 100, 0, 1, 1, 3, 2, 60000, 0, 1, -1])
        )
        .is_err());

        let charge = |i: usize, mark: u64| Charge {
            check: check(i).0,
            id: vec!["a"],
            mark,
            under: "",
        };
        let refund = ScriptCall::refund(&[charge(1, 7), charge(0, 9)], None);
        assert_eq!(refund.entry(), Entry::Refund);
        assert_eq!(refund.keys(), ["el:{a}:login", "el:{a}:ip"]);
        let offset = window_offset("el:{a}:login", 60_000).to_string();
        assert_eq!(
            args(&refund),
            [
                "refund", "", "window", "1", &offset, "1", "60000", "3", "60000", "7", "gcra", "1",
                "100000", "10", "9"
            ]
        );
        assert_eq!(
            refund.decode(&json!([1, 0])),
            Ok(Reply::Refunded(vec![true, false]))
        );
        for bad in [json!([1]), json!([2, 0]), json!("x")] {
            assert!(
                matches!(refund.decode(&bad), Err(ScriptError::Reply(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_reset_replies_with_a_count() {
        let call = ScriptCall::Reset(vec!["k".into()]);
        assert_eq!(call.decode(&json!(1)), Ok(Reply::Removed(1)));
        assert!(matches!(
            call.decode(&json!("x")),
            Err(ScriptError::Reply(_))
        ));
        assert!(Reply::Removed(1).decision().is_err());
    }

    #[test]
    fn replies_parse_into_states() {
        let reply = json!([1, 3, 1, 200, 0, 1, 0, 2, 0, 1000, 1000, 1]);
        let d = states(reply.clone(), &[Mode::Enforce; 2], false).unwrap();
        assert!(!d.admitted());
        assert_eq!((d.wait_ms(), d.binding()), (Some(1000), 1));
        assert_eq!(
            d.rules[1],
            RuleState {
                verdict: Verdict::Denied(Retry::After { ms: 1000 }),
                limit: 2,
                remaining: 0,
                reset_after_ms: 1000,
                window: 1
            }
        );
        let never = states(json!([0, 3, 0, 5, -1, 1]), &[Mode::Enforce], false).unwrap();
        assert_eq!(never.retry(), Some(Retry::Never));
        // A shadow rule's denial blocks nothing, and binds nothing.
        let shadow = states(reply, &[Mode::Enforce, Mode::Shadow], false).unwrap();
        assert_eq!(
            shadow.verdict,
            RequestVerdict::Admitted { tightest: 1 },
            "the fewest units left"
        );
    }

    #[test]
    fn the_enforced_rule_that_frees_up_last_binds() {
        let state = |verdict, remaining| RuleState {
            verdict,
            limit: 5,
            remaining,
            reset_after_ms: 0,
            window: 1,
        };
        let after = |ms| Verdict::Denied(Retry::After { ms });
        let never = Verdict::Denied(Retry::Never);
        let modes = [Mode::Enforce, Mode::Shadow, Mode::Enforce, Mode::Enforce];
        let d = Decision::settle(
            vec![
                state(after(500), 0),
                state(never, 0),
                state(after(900), 0),
                state(Verdict::Admitted, 1),
            ],
            &modes,
        );
        assert_eq!(
            d.verdict,
            RequestVerdict::Denied {
                binding: 2,
                retry: Retry::After { ms: 900 }
            }
        );
        // Never (the cost exceeds the limit) is the latest of all, but only
        // from an enforced rule.
        let d = Decision::settle(
            vec![state(after(500), 0), state(never, 0)],
            &[Mode::Enforce; 2],
        );
        assert_eq!((d.binding(), d.retry()), (1, Some(Retry::Never)));
    }

    #[test]
    fn malformed_replies_are_typed_errors() {
        for bad in [
            json!("OK"),
            json!([1, 0]),
            json!([1, 3, 2, 0, 0, "x"]),
            json!([1, 3, 2, 0, 0, 0]),
            json!([2, 3, 2, 0, 0, 1]),
            json!([1, -3, 2, 0, 0, 1]),
        ] {
            assert!(
                matches!(
                    states(bad.clone(), &[Mode::Enforce], false),
                    Err(ScriptError::Reply(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_lone_gcra_rule_replies_with_how_far_its_tat_lay_ahead() {
        // 10 per second: 100 ms a unit; a burst of 5 tolerates 500 ms ahead.
        let c = Config::from_json(&json!({"rules": [
            {"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s", "burst": 5}
        ]}))
        .unwrap();
        let call = |cost| {
            ScriptCall::decide(
                &[(
                    Check {
                        rule: &c.rules[0],
                        cost,
                    },
                    vec!["c"],
                )],
                None,
            )
        };
        let state = |reply: i64, cost| decision(&call(cost), json!(reply)).map(|d| d.rules[0]);

        // 150 ms ahead, admitted: 250 ms after, 2 units left.
        let admitted = state(150_000, 1).unwrap();
        assert!(admitted.admitted());
        assert_eq!((admitted.remaining, admitted.reset_after_ms), (2, 250));
        // 450 ms ahead, 2 units denied (-1 - ahead): they would end 150 ms too far.
        let denied = decision(&call(2), json!(-450_001)).unwrap();
        assert_eq!((denied.admitted(), denied.wait_ms()), (false, Some(150)));
        assert_eq!(
            (denied.rules[0].remaining, denied.rules[0].reset_after_ms),
            (0, 450)
        );
        // More than the burst never fits.
        assert_eq!(state(-1, 6).unwrap().retry(), Some(Retry::Never));
        // A TAT further ahead than the burst (it was lowered) leaves none.
        assert_eq!(state(-900_001, 1).unwrap().remaining, 0);

        // A reply that contradicts its own verdict, or is no integer, is an
        // error; none panics, however large.
        for bad in [
            json!(499_000),
            json!(-1),
            json!("1"),
            json!(i64::MAX),
            json!(u64::MAX),
        ] {
            assert!(
                matches!(decision(&call(2), bad.clone()), Err(ScriptError::Reply(_))),
                "{bad}"
            );
        }
        // Denied, however far ahead: no overflow.
        assert!(!state(i64::MIN, 2).unwrap().admitted());
        // A peek admits at cost 0.
        assert!(state(500_000, 0).unwrap().admitted());
    }

    #[test]
    fn a_lone_window_that_admits_replies_with_one_integer() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "a", "key": ["ip"], "algorithm": "windowed", "windows": [["1m", 100, "1s"]]},
            {"name": "b", "key": ["ip"], "algorithm": "windowed",
             "windows": [["1s", 10, "1s"], ["1m", 100, "1s"]]}
        ]}))
        .unwrap();
        let call = |rule| ScriptCall::decide(&[(Check { rule, cost: 1 }, vec!["c"])], None);
        let one = call(&c.rules[0]);
        // 97 left; now lies 250 ms into its bucket, so the window empties in 59.75 s.
        let d = decision(&one, json!(97_250)).unwrap();
        assert!(d.admitted());
        assert_eq!(
            (
                d.rules[0].remaining,
                d.rules[0].reset_after_ms,
                d.rules[0].limit
            ),
            (97, 59_750, 100)
        );
        // Denials, peeks and large figures still come as six fields.
        let denied = decision(&one, json!([0, 100, 0, 900, 900, 1])).unwrap();
        assert_eq!(denied.wait_ms(), Some(900));
        for bad in [json!(-1), json!(101_000), json!(i64::MIN)] {
            assert!(
                matches!(decision(&one, bad.clone()), Err(ScriptError::Reply(_))),
                "{bad}"
            );
        }
        // Several windows always reply with six fields.
        assert!(matches!(
            decision(&call(&c.rules[1]), json!(5_000)),
            Err(ScriptError::Reply(_))
        ));
    }

    #[test]
    fn an_inspection_peeks_at_every_window_with_the_rules_offset() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "w", "key": ["ip"], "algorithm": "windowed",
             "windows": [["1s", 10, "100ms"], ["1m", 100, "1s"]]},
            {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s"}
        ]}))
        .unwrap();
        let call = ScriptCall::inspect(&c.rules[0], &["1.2.3.4"]);
        let offset = window_offset("el:{1.2.3.4}:w", 60_000).to_string();
        assert_eq!(call.keys(), ["el:{1.2.3.4}:w", "el:{1.2.3.4}:w"]);
        assert_eq!(
            args(&call),
            [
                "decide", "", "ee", "window", "0", &offset, "1", "1000", "10", "100", "window",
                "0", &offset, "1", "60000", "100", "1000"
            ]
        );
        let d = decision(
            &call,
            json!([1, 10, 7, 900, 0, 1, 1, 100, 40, 59_000, 0, 1]),
        )
        .unwrap();
        assert_eq!((d.rules[0].remaining, d.rules[1].remaining), (7, 40));
        // GCRA, or a single window: the rule's own peek.
        let peek = ScriptCall::decide(
            &[(
                Check {
                    rule: &c.rules[1],
                    cost: 0,
                },
                vec!["1.2.3.4"],
            )],
            None,
        );
        assert_eq!(ScriptCall::inspect(&c.rules[1], &["1.2.3.4"]), peek);
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
                "decide", "5", "ee", "gcra", "1", "100000", "5", "window", "2", &offset, "1",
                "60000", "100", "60000"
            ]
        );
        assert_eq!(args(&ScriptCall::decide(&checks, None))[1], "");
    }

    #[test]
    fn the_script_is_the_files_without_comments_line_for_line() {
        let (shebang, body) = LIMITER.source.split_once('\n').expect("a shebang line");
        assert_eq!(shebang, "#!lua flags=allow-key-locking");
        let files: Vec<&str> = LUA_FILES.iter().flat_map(|(_, f)| f.lines()).collect();
        let embedded: Vec<&str> = body.lines().collect();
        // Line for line, so a Redis error's line number is the file's.
        assert_eq!(embedded.len(), files.len());
        for (n, (line, file)) in embedded.iter().zip(&files).enumerate() {
            let dropped = file.trim().strip_prefix(line).map(str::trim_start);
            assert!(
                dropped.is_some_and(|d| d.is_empty() || d.starts_with("--")),
                "line {}: {line:?} is not {file:?} less its blanks and comment",
                n + 2
            );
        }
        let written: usize = LUA_FILES.iter().map(|(_, f)| f.len()).sum();
        assert!(LIMITER.source.len() < written / 2, "the comments are gone");
    }

    #[test]
    fn every_lua_file_is_in_the_script() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| format!("lua/{}", e.unwrap().file_name().to_string_lossy()))
            .filter(|name| name.ends_with(".lua"))
            .collect();
        on_disk.sort();
        let mut joined: Vec<String> = LUA_FILES.iter().map(|(n, _)| n.to_string()).collect();
        joined.sort();
        assert_eq!(joined, on_disk);
    }
}
