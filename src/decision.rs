//! One decision for one request: the script call that asks for it, and the
//! reply read back into plain numbers.

use serde_json::Value;

use crate::{
    config::{Mode, Rule},
    keys::{redis_key, window_offset},
    policy::{Gcra, Policy, Window, Windows},
    redis_rest::RestError,
};

/// How one rule stands after the decision. Times are milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleState {
    /// Whether this rule alone would admit the request.
    pub allowed: bool,
    /// The binding window's limit (GCRA: the burst).
    pub limit: u64,
    /// Units left in the binding window after this decision.
    pub remaining: u64,
    /// Milliseconds until the binding window holds no admitted cost.
    pub reset_after_ms: u64,
    /// Milliseconds until this rule could admit the request; `None` when it
    /// never can (the cost exceeds the limit).
    pub retry_after_ms: Option<u64>,
    /// 1-based index of the binding window (GCRA: always 1).
    pub window: usize,
}

impl RuleState {
    /// A GCRA rule's state when its TAT lay `ahead_us` ahead of now before a
    /// request of `cost` units: after the request if that fits the burst,
    /// else as it stands. The same arithmetic as `gcra_check` in
    /// `lua/gcra.lua`, saturating so that no reply can overflow it; the
    /// reference model works it out again on its own.
    pub fn gcra(g: &Gcra, cost: u64, ahead_us: u64) -> RuleState {
        let interval = g.interval_us().max(1);
        let tolerance = interval.saturating_mul(g.burst());
        let after = ahead_us.saturating_add(cost.saturating_mul(interval));
        let allowed = after <= tolerance;
        let (stands, retry_after_ms) = if allowed {
            (after, Some(0))
        } else if cost > g.burst() {
            (ahead_us, None)
        } else {
            (ahead_us, Some((after - tolerance).div_ceil(1000)))
        };
        RuleState {
            allowed,
            limit: g.burst(),
            // A TAT further ahead than the burst (it was lowered) leaves none.
            remaining: tolerance.saturating_sub(stands) / interval,
            reset_after_ms: stands.div_ceil(1000),
            retry_after_ms,
            window: 1,
        }
    }
}

/// The verdict on a whole request: all rules admitted it, or none consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether every rule admitted the request.
    pub allowed: bool,
    /// When denied, milliseconds until it could be admitted; `None` if never.
    pub retry_after_ms: Option<u64>,
    /// 0-based index of the rule that denied it (or, if admitted, has the
    /// fewest units left).
    pub binding: usize,
    /// One state per rule, in call order.
    pub rules: Vec<RuleState>,
    /// Rules (0-based, call order) whose penalty this decision started.
    pub penalties_started: Vec<usize>,
}

/// A rule applied to one request, with its cost.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// Units this request costs under it (0 peeks).
    pub cost: u64,
}

/// `KEYS` and `ARGV` for the limiter script, and what its reply will mean.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptCall {
    /// One key per rule.
    pub keys: Vec<String>,
    /// Operation, clock, then each rule's arguments.
    pub args: Vec<String>,
    /// Each rule's mode, in call order.
    modes: Vec<Mode>,
    /// A rule that governs the request alone, whose reply may be one integer.
    lone: Option<Lone>,
    /// Whether a rule has a penalty: the reply then ends with one more integer.
    penalties: bool,
}

/// The key of a client's running penalty on a rule: its state key and
/// `:p` (rule names hold no `:`, so no rule's key can be another's penalty).
pub fn penalty_key(state_key: &str) -> String {
    format!("{state_key}:p")
}

/// A rule alone in a call, for which the script replies with one integer
/// where it can (see the reply in `lua/limiter.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lone {
    /// Always: how far the TAT lay ahead (us), or -1 minus that if denied.
    Gcra { gcra: Gcra, cost: u64 },
    /// When it admits at a cost: remaining x precision + (duration - reset_after).
    Window(Window),
}

impl ScriptCall {
    /// A decision over `checks`, each with its client's identifier parts;
    /// `now_ms` pins the clock (tests, simulation), `None` uses Redis's.
    /// Rules with `count_status` are checked at their cost but not charged:
    /// [`ScriptCall::charge`] charges them once the origin has answered.
    pub fn decide(checks: &[(Check<'_>, Vec<&str>)], now_ms: Option<u64>) -> ScriptCall {
        ScriptCall::build(checks, now_ms, false)
    }

    /// The after-response charge of rules with `count_status` whose status
    /// the origin answered: decided like [`ScriptCall::decide`], but every
    /// rule is charged when all admit.
    pub fn charge(checks: &[(Check<'_>, Vec<&str>)], now_ms: Option<u64>) -> ScriptCall {
        ScriptCall::build(checks, now_ms, true)
    }

    fn build(
        checks: &[(Check<'_>, Vec<&str>)],
        now_ms: Option<u64>,
        charge_all: bool,
    ) -> ScriptCall {
        if let (None, [(check, id)]) = (now_ms, checks) {
            let rule = check.rule;
            let later = !charge_all && !rule.count_status.is_empty();
            if !later && rule.penalty_ms.is_none() {
                return ScriptCall::lone(rule, check.cost, id);
            }
        }
        let mut keys = Vec::with_capacity(checks.len());
        let modes: String = checks
            .iter()
            .map(|(c, _)| {
                let later = !charge_all && !c.rule.count_status.is_empty();
                match (c.rule.mode, later) {
                    (Mode::Enforce, false) => 'e',
                    (Mode::Shadow, false) => 's',
                    (Mode::Enforce, true) => 'c',
                    (Mode::Shadow, true) => 'w',
                }
            })
            .collect();
        let mut args = vec![
            "decide".to_owned(),
            now_ms.map(|n| n.to_string()).unwrap_or_default(),
            modes,
        ];
        for (check, id) in checks {
            let key = redis_key(&check.rule.name, id);
            let offset = window_offset(&key, check.rule.policy.longest_ms());
            check.rule.policy.push_args(check.cost, offset, &mut args);
            keys.push(key);
        }
        let mut penalties = 0;
        for (i, (check, _)) in checks.iter().enumerate() {
            if let Some(ms) = check.rule.penalty_ms {
                if penalties == 0 {
                    args.push("penalty".to_owned());
                }
                penalties += 1;
                args.push((i + 1).to_string());
                args.push(ms.to_string());
                keys.push(penalty_key(&keys[i]));
            }
        }
        ScriptCall {
            keys,
            args,
            modes: checks.iter().map(|(c, _)| c.rule.mode).collect(),
            lone: None,
            penalties: penalties > 0,
        }
    }

    /// A rule governing a request alone on Redis's clock: the script's own
    /// path for it, which replies with one integer where it can.
    fn lone(rule: &Rule, cost: u64, id: &[&str]) -> ScriptCall {
        let key = redis_key(&rule.name, id);
        let offset = window_offset(&key, rule.policy.longest_ms());
        let lone = match &rule.policy {
            Policy::Gcra(gcra) => Some(Lone::Gcra { gcra: *gcra, cost }),
            // A peek (cost 0) always replies with six fields.
            Policy::Windowed(windows) => match windows[..] {
                [window] if cost > 0 => Some(Lone::Window(window)),
                _ => None,
            },
        };
        ScriptCall {
            args: rule.policy.lone_args(cost, offset),
            keys: vec![key],
            modes: vec![rule.mode],
            lone,
            penalties: false,
        }
    }

    /// What decides the same way wherever it is sent: the keys and every
    /// argument but the clock. The block cache keys its denials on it.
    pub fn signature(&self) -> String {
        let mut s = self.keys.join("\n");
        for (i, arg) in self.args.iter().enumerate() {
            // The general call's second argument is the clock.
            if !(i == 1 && self.args[0] == "decide") {
                s.push('\n');
                s.push_str(arg);
            }
        }
        s
    }

    /// Reads the script's reply to this call.
    pub fn decision(&self, reply: &Value) -> Result<Decision, RestError> {
        let state = match (self.lone, reply.as_i64()) {
            (Some(Lone::Gcra { gcra, cost }), Some(verdict)) => {
                // -1 - ahead when denied: its bitwise complement, which cannot overflow.
                let admitted = verdict >= 0;
                let ahead = if admitted { verdict } else { !verdict };
                let state = RuleState::gcra(&gcra, cost, ahead as u64);
                if state.allowed != admitted {
                    return Err(RestError::Malformed(format!(
                        "limiter script reply {verdict} contradicts its own verdict"
                    )));
                }
                state
            }
            (Some(Lone::Window(w)), Some(packed)) => {
                let (remaining, into_bucket) = u64::try_from(packed)
                    .ok()
                    .filter(|_| w.precision_ms() > 0)
                    .map(|p| (p / w.precision_ms(), p % w.precision_ms()))
                    .filter(|(remaining, _)| *remaining <= w.limit())
                    .ok_or_else(|| {
                        RestError::Malformed(format!(
                            "limiter script reply {packed} is no state of a {}-unit window",
                            w.limit()
                        ))
                    })?;
                RuleState {
                    allowed: true,
                    limit: w.limit(),
                    remaining,
                    reset_after_ms: w.duration_ms().saturating_sub(into_bucket),
                    retry_after_ms: Some(0),
                    window: 1,
                }
            }
            // Every other case replies with six fields per rule.
            _ => return Decision::from_reply(reply, &self.modes, self.penalties),
        };
        Ok(Decision::settle(vec![state], &self.modes))
    }

    /// A look at where one client stands on `rule`, consuming nothing:
    /// one state per window in the reply's decision (a decision reports
    /// only the binding window), or the one GCRA state. Each window is
    /// peeked as a rule of its own over the same key, with the rule's own
    /// bucket offset, so it reads exactly the counters the rule keeps.
    pub fn inspect(rule: &Rule, id: &[&str]) -> ScriptCall {
        let windows = match &rule.policy {
            Policy::Windowed(ws) if ws.len() > 1 => ws,
            _ => return ScriptCall::decide(&[(Check { rule, cost: 0 }, id.to_vec())], None),
        };
        let key = redis_key(&rule.name, id);
        let offset = window_offset(&key, rule.policy.longest_ms());
        let mut args = vec![
            "decide".to_owned(),
            String::new(),
            "e".repeat(windows.len()),
        ];
        for w in windows.iter() {
            if let Ok(one) = Windows::new(vec![*w]) {
                Policy::Windowed(one).push_args(0, offset, &mut args);
            }
        }
        ScriptCall {
            keys: vec![key; windows.len()],
            args,
            modes: vec![Mode::Enforce; windows.len()],
            lone: None,
            penalties: false,
        }
    }

    /// Forgets the state of the given rules for these clients.
    /// A rule's running penalty goes too.
    pub fn reset(rules: &[(&Rule, Vec<&str>)]) -> ScriptCall {
        let mut keys = Vec::with_capacity(rules.len());
        for (rule, id) in rules {
            let key = redis_key(&rule.name, id);
            if rule.penalty_ms.is_some() {
                keys.push(penalty_key(&key));
            }
            keys.push(key);
        }
        ScriptCall {
            keys,
            args: vec!["reset".to_owned()],
            modes: vec![],
            lone: None,
            penalties: false,
        }
    }
}

/// The start of a reply, for an error message: a reply of any size must not
/// become a log line of any size.
fn excerpt(reply: &Value) -> String {
    reply.to_string().chars().take(200).collect()
}

/// Fields per rule in the script's reply.
const PER_RULE: usize = 6;

/// Whether a retry-after of `a` frees up strictly later than `b` (`None`:
/// never, the latest of all).
fn later(a: Option<u64>, b: Option<u64>) -> bool {
    match (a, b) {
        (None, b) => b.is_some(),
        (Some(_), None) => false,
        (Some(a), Some(b)) => a > b,
    }
}

impl Decision {
    /// The verdict over every rule's state, `modes[i]` being rule i's mode:
    /// admitted when no enforced rule denies. The binding rule is, when
    /// denied, the first enforced denying rule that frees up last; when
    /// admitted, the first with the fewest units left.
    pub fn settle(rules: Vec<RuleState>, modes: &[Mode]) -> Decision {
        let mut allowed = true;
        let mut binding = 0;
        for (i, s) in rules.iter().enumerate() {
            let enforced = modes.get(i) != Some(&Mode::Shadow);
            if !s.allowed && enforced {
                if allowed || later(s.retry_after_ms, rules[binding].retry_after_ms) {
                    binding = i;
                }
                allowed = false;
            } else if allowed && s.remaining < rules[binding].remaining {
                binding = i;
            }
        }
        let retry_after_ms = match rules.get(binding) {
            Some(s) if !allowed => s.retry_after_ms,
            _ => Some(0),
        };
        Decision {
            allowed,
            retry_after_ms,
            binding,
            rules,
            penalties_started: vec![],
        }
    }

    /// Reads a reply of six fields per rule for a call over rules with these
    /// modes, and with the penalties mask at its end when `penalties`
    /// ([`ScriptCall::decision`] reads every kind of reply).
    pub fn from_reply(
        reply: &Value,
        modes: &[Mode],
        penalties: bool,
    ) -> Result<Decision, RestError> {
        let malformed = |why: &str| {
            RestError::Malformed(format!("limiter script reply {why}: {}", excerpt(reply)))
        };
        let items = reply
            .as_array()
            .ok_or_else(|| malformed("is not an array"))?;
        let expected = PER_RULE * modes.len() + usize::from(penalties);
        if items.len() != expected {
            return Err(malformed(&format!(
                "has {} items, expected {expected}",
                items.len()
            )));
        }
        let ints = items
            .iter()
            .map(Value::as_i64)
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| malformed("holds a non-integer"))?;
        let count = |v: i64| u64::try_from(v).map_err(|_| malformed("holds a negative count"));
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
                if !matches!(c[0], 0 | 1) {
                    return Err(malformed("holds a verdict other than 0 or 1"));
                }
                Ok(RuleState {
                    allowed: c[0] == 1,
                    limit: count(c[1])?,
                    // A windowed rule can hold more than its limit after the limit was lowered.
                    remaining: c[2].max(0) as u64,
                    reset_after_ms: count(c[3])?,
                    // -1: never, the cost exceeds the limit.
                    retry_after_ms: u64::try_from(c[4]).ok(),
                    window: usize::try_from(c[5])
                        .ok()
                        .filter(|w| *w >= 1)
                        .ok_or_else(|| malformed("names no window"))?,
                })
            })
            .collect::<Result<Vec<_>, RestError>>()?;
        Ok(Decision {
            penalties_started: started,
            ..Decision::settle(states, modes)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Mode};
    use serde_json::json;

    #[test]
    fn replies_parse_into_states() {
        let reply = json!([1, 3, 1, 200, 0, 1, 0, 2, 0, 1000, 1000, 1]);
        let d = Decision::from_reply(&reply, &[Mode::Enforce; 2], false).unwrap();
        assert!(!d.allowed);
        assert_eq!((d.retry_after_ms, d.binding), (Some(1000), 1));
        assert_eq!(
            d.rules[1],
            RuleState {
                allowed: false,
                limit: 2,
                remaining: 0,
                reset_after_ms: 1000,
                retry_after_ms: Some(1000),
                window: 1
            }
        );
        let never =
            Decision::from_reply(&json!([0, 3, 0, 5, -1, 1]), &[Mode::Enforce], false).unwrap();
        assert_eq!(never.retry_after_ms, None);
        // A shadow rule's denial blocks nothing, and binds nothing.
        let shadow = Decision::from_reply(&reply, &[Mode::Enforce, Mode::Shadow], false).unwrap();
        assert_eq!((shadow.allowed, shadow.retry_after_ms), (true, Some(0)));
        assert_eq!(shadow.binding, 1, "the fewest units left");
    }

    #[test]
    fn the_enforced_rule_that_frees_up_last_binds() {
        let state = |allowed, remaining, retry| RuleState {
            allowed,
            limit: 5,
            remaining,
            reset_after_ms: 0,
            retry_after_ms: retry,
            window: 1,
        };
        let modes = [Mode::Enforce, Mode::Shadow, Mode::Enforce, Mode::Enforce];
        let d = Decision::settle(
            vec![
                state(false, 0, Some(500)),
                state(false, 0, None),
                state(false, 0, Some(900)),
                state(true, 1, Some(0)),
            ],
            &modes,
        );
        assert_eq!(
            (d.allowed, d.binding, d.retry_after_ms),
            (false, 2, Some(900))
        );
        // Never (the cost exceeds the limit) is the latest of all, but only
        // from an enforced rule.
        let d = Decision::settle(
            vec![state(false, 0, Some(500)), state(false, 0, None)],
            &[Mode::Enforce; 2],
        );
        assert_eq!((d.binding, d.retry_after_ms), (1, None));
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
                    Decision::from_reply(&bad, &[Mode::Enforce], false),
                    Err(RestError::Malformed(_))
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
        let state = |reply: i64, cost| call(cost).decision(&json!(reply)).map(|d| d.rules[0]);

        // 150 ms ahead, admitted: 250 ms after, 2 units left.
        let admitted = state(150_000, 1).unwrap();
        assert!(admitted.allowed);
        assert_eq!(
            (
                admitted.remaining,
                admitted.reset_after_ms,
                admitted.retry_after_ms
            ),
            (2, 250, Some(0))
        );
        // 450 ms ahead, 2 units denied (-1 - ahead): they would end 150 ms too far.
        let denied = call(2).decision(&json!(-450_001)).unwrap();
        assert_eq!((denied.allowed, denied.retry_after_ms), (false, Some(150)));
        assert_eq!(
            (denied.rules[0].remaining, denied.rules[0].reset_after_ms),
            (0, 450)
        );
        // More than the burst never fits.
        assert_eq!(state(-1, 6).unwrap().retry_after_ms, None);
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
                matches!(call(2).decision(&bad), Err(RestError::Malformed(_))),
                "{bad}"
            );
        }
        // Denied, however far ahead: no overflow.
        assert!(!state(i64::MIN, 2).unwrap().allowed);
        // A peek admits at cost 0.
        assert!(state(500_000, 0).unwrap().allowed);
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
        let d = one.decision(&json!(97_250)).unwrap();
        assert!(d.allowed);
        assert_eq!(
            (
                d.rules[0].remaining,
                d.rules[0].reset_after_ms,
                d.rules[0].limit
            ),
            (97, 59_750, 100)
        );
        // Denials, peeks and large figures still come as six fields.
        let denied = one.decision(&json!([0, 100, 0, 900, 900, 1])).unwrap();
        assert_eq!(denied.retry_after_ms, Some(900));
        for bad in [json!(-1), json!(101_000), json!(i64::MIN)] {
            assert!(
                matches!(one.decision(&bad), Err(RestError::Malformed(_))),
                "{bad}"
            );
        }
        // Several windows always reply with six fields.
        assert!(matches!(
            call(&c.rules[1]).decision(&json!(5_000)),
            Err(RestError::Malformed(_))
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
        assert_eq!(call.keys, ["el:{1.2.3.4}:w", "el:{1.2.3.4}:w"]);
        assert_eq!(
            call.args,
            [
                "decide", "", "ee", "window", "0", &offset, "1", "1000", "10", "100", "window",
                "0", &offset, "1", "60000", "100", "1000"
            ]
        );
        let d = call
            .decision(&json!([1, 10, 7, 900, 0, 1, 1, 100, 40, 59_000, 0, 1]))
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
        assert_eq!(call.keys, ["el:{1.2.3.4}:a", "el:{1.2.3.4}:b"]);
        let offset = window_offset("el:{1.2.3.4}:b", 60_000).to_string();
        assert_eq!(
            call.args,
            [
                "decide", "5", "ee", "gcra", "1", "100000", "5", "window", "2", &offset, "1",
                "60000", "100", "60000"
            ]
        );
        assert_eq!(ScriptCall::decide(&checks, None).args[1], "");
    }
}
