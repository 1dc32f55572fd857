//! The limiter script's replies, read back into a [`Decision`] against the
//! call they answer, and every way one can be outside the protocol.

use serde_json::Value;

use super::{
    algorithms,
    call::{General, Group, LeaseAsk, OneRule, ScriptCall},
    pool_call::{decode_spend, SPENT},
};
use crate::{
    decision::{
        outcomes::verdict::{
            Decision, Grant, OverrideRead, OverrideSource, Retry, RuleState, Verdict,
        },
        transport::redis_rest::RestError,
    },
    rules::rule::Mode,
};

/// What the script answered: a decision, the keys a reset removed, or what
/// a refund gave back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The verdict on every rule of a decision.
    Decision(Decision),
    /// A group's decisions, one per request, in the order they were made.
    Decisions(Vec<Decision>),
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
            Reply::Refunded(_) | Reply::Decisions(_) => Err(ScriptError::Reply(
                "another call's reply where a decision was due".into(),
            )),
        }
    }

    /// The decisions of a call that decides: a group's, in order, or the
    /// one of a call for one request.
    pub fn decisions(self) -> Result<Vec<Decision>, ScriptError> {
        match self {
            Reply::Decisions(d) => Ok(d),
            other => other.decision().map(|d| vec![d]),
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

/// Fields per rule in the general reply.
const PER_RULE: usize = 6;

/// A general reply's items: each request's, the leases', the overrides',
/// the pools'.
struct Parts<'r> {
    requests: &'r [Value],
    granted: &'r [Value],
    read: &'r [Value],
    pooled: &'r [Value],
}

impl ScriptCall {
    /// Reads the script's reply to this call.
    pub fn decode(&self, reply: &Value) -> Result<Reply, ScriptError> {
        match self {
            ScriptCall::OneRule(one) => one.decode(reply).map(Reply::Decision),
            ScriptCall::Decide(g) => g.decode(reply).map(Reply::Decision),
            ScriptCall::Group(group) => group.decode(reply).map(Reply::Decisions),
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
    /// The longest `ask` may be granted for: its length, and for a window
    /// no longer than a bucket.
    fn longest_lease_ms(&self, ask: &LeaseAsk) -> u64 {
        match self.rules.get(ask.rule) {
            Some((r, _)) => r.policy.algorithm().lease_cap_ms(ask.for_ms),
            None => ask.for_ms,
        }
    }

    fn modes(&self) -> Vec<Mode> {
        self.rules.iter().map(|(_, m)| m.rule_mode()).collect()
    }

    /// Six fields per rule, the penalties mask when the call has
    /// penalties, a refund mark per refundable rule, then units and ms per
    /// lease asked for, then what each override read held, then each
    /// pool's spend.
    fn decode(&self, reply: &Value) -> Result<Decision, ScriptError> {
        let parts = self.split(reply, 1)?;
        let mut decision = self.request(reply, parts.requests)?;
        self.grants(reply, parts.granted, &mut decision)?;
        decision.overrides = self.overrides_read(reply, parts.read)?;
        if !self.pools.is_empty() {
            let pooled = Value::Array(parts.pooled.to_vec());
            decision.pools = decode_spend(&pooled, self.pools.len())?;
        }
        Ok(decision)
    }

    /// `reply`'s items for `n` requests, its leases, its overrides read.
    fn split<'r>(&self, reply: &'r Value, n: usize) -> Result<Parts<'r>, ScriptError> {
        let Some(items) = reply.as_array() else {
            return Err(malformed(reply, "is not an array"));
        };
        let pooled_len = SPENT * self.pools.len();
        let (items, pooled) = items.split_at(items.len().saturating_sub(pooled_len));
        let (items, read) = items.split_at(items.len().saturating_sub(3 * self.overrides.len()));
        let (requests, granted) = items.split_at(items.len().saturating_sub(2 * self.leases.len()));
        if requests.len() != n * self.per_request() {
            let why = format!("holds {} items for {n} requests", requests.len());
            return Err(malformed(reply, &why));
        }
        Ok(Parts {
            requests,
            granted,
            read,
            pooled,
        })
    }

    /// Items one request's decision takes in a reply: its fields, the
    /// penalties mask, its refund marks.
    fn per_request(&self) -> usize {
        let refundable = self.rules.iter().filter(|(_, m)| m.refundable()).count();
        PER_RULE * self.rules.len() + usize::from(!self.penalties.is_empty()) + refundable
    }

    /// One request's decision from its `items` of `reply`: six fields per
    /// rule, the penalties mask when the call has penalties, a refund mark
    /// per refundable rule.
    fn request(&self, reply: &Value, items: &[Value]) -> Result<Decision, ScriptError> {
        let refundable: Vec<usize> = (0..self.rules.len())
            .filter(|&i| self.rules[i].1.refundable())
            .collect();
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
        Ok(decision)
    }

    /// The leases `granted` (units and ms per lease asked for) with
    /// `decision`, which they were asked with.
    fn grants(
        &self,
        reply: &Value,
        granted: &[Value],
        decision: &mut Decision,
    ) -> Result<(), ScriptError> {
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
        Ok(())
    }

    /// What each override read held: whose, whether the client's key held
    /// something that is no override, the text in force.
    fn overrides_read(
        &self,
        reply: &Value,
        read: &[Value],
    ) -> Result<Vec<OverrideRead>, ScriptError> {
        let mut overrides = Vec::with_capacity(self.overrides.len());
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
            overrides.push(OverrideRead {
                rule: ask.rule,
                source,
                text: text.to_owned(),
                ignored: ignored == 1,
            });
        }
        Ok(overrides)
    }
}

impl Group {
    /// Each request's decision as [`General::decode`] reads one, in the
    /// order they were made; the leases go with the last, and every one
    /// was decided under the same overrides.
    fn decode(&self, reply: &Value) -> Result<Vec<Decision>, ScriptError> {
        let g = &self.first;
        let n = 1 + self.further.len();
        let parts = g.split(reply, n)?;
        let mut decisions = parts
            .requests
            .chunks(g.per_request())
            .map(|items| g.request(reply, items))
            .collect::<Result<Vec<Decision>, ScriptError>>()?;
        if let Some(last) = decisions.last_mut() {
            g.grants(reply, parts.granted, last)?;
        }
        let overrides = g.overrides_read(reply, parts.read)?;
        for d in &mut decisions {
            d.overrides = overrides.clone();
        }
        Ok(decisions)
    }
}

impl OneRule {
    /// GCRA replies with one integer; one window admitted at a cost with
    /// one integer; a call whose override key held something with the
    /// general reply; everything else with six fields.
    fn decode(&self, reply: &Value) -> Result<Decision, ScriptError> {
        let modes = [self.mode];
        if self.override_key.is_some() && reply.as_array().is_some_and(|a| a.len() == PER_RULE + 3)
        {
            return self.general().decode(reply);
        }
        let state = match reply.as_i64() {
            Some(one) => algorithms::of(&self.rule.policy)
                .one_rule_state(self.rule.cost, one)
                .map_err(ScriptError::Reply)?,
            None => return self.none_read(decode_general(reply, &modes, false)?),
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
                (1, Ok(0)) => Verdict::Admitted,
                // An admitted rule's retry is its delay.
                (1, Ok(ms)) => Verdict::Delayed { ms },
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
    use crate::{
        decision::{
            outcomes::verdict::RequestVerdict,
            transport::keys::window_offset,
            transport::protocol::{
                call::{Check, RefundCharge},
                script::Entry,
            },
        },
        rules::{config::Config, rule::Rule},
    };
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

        let keys = call.rule_keys();
        let charge = |i: usize, mark: u64| RefundCharge {
            check: check(i).0,
            id: vec!["a"],
            key: keys[i],
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
                "100000", "10", "0", "9"
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

    /// A group's reply is each request's fields in turn, then the leases
    /// (the last request's) and the overrides read (every request's).
    #[test]
    fn a_group_replies_with_each_requests_fields_then_its_leases_and_overrides() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s",
             "burst": 3, "overrides": true, "count_status": [401]}
        ]}))
        .unwrap();
        let checks = [unit_for_a(&c.rules[0])];
        let lease = LeaseAsk {
            rule: 0,
            units: 2,
            for_ms: 100,
        };
        let group = ScriptCall::group(&checks, &[vec![1], vec![2], vec![1]], vec![lease], None);
        let request = |admitted: i64, left: i64, mark: u64| {
            vec![
                json!(admitted),
                json!(3),
                json!(left),
                json!(100),
                json!(if admitted == 1 { 0 } else { 100 }),
                json!(1),
                json!(mark),
            ]
        };
        let reply = |last_admitted: i64, units: u64| {
            let mut items = request(1, 2, 11);
            items.extend(request(0, 2, 0));
            items.extend(request(last_admitted, 1, 12 * last_admitted as u64));
            items.extend([json!(units), json!(100), json!(0), json!(0), json!("")]);
            Value::Array(items)
        };
        let decisions = group
            .decode(&reply(1, 1))
            .and_then(Reply::decisions)
            .unwrap();
        let admitted: Vec<bool> = decisions.iter().map(Decision::admitted).collect();
        assert_eq!(admitted, [true, false, true]);
        let marks: Vec<&[(usize, u64)]> = decisions.iter().map(|d| &d.refund_marks[..]).collect();
        assert_eq!(marks, [&[(0, 11)][..], &[], &[(0, 12)]]);
        assert!(decisions[..2].iter().all(|d| d.grants.is_empty()));
        assert_eq!(decisions[2].grants.len(), 1);
        assert!(decisions.iter().all(|d| d.overrides.len() == 1));
        // A lease with a denied last request, or a request short, is malformed.
        assert!(group.decode(&reply(0, 1)).is_err());
        let mut short = reply(1, 1);
        short.as_array_mut().unwrap().remove(0);
        assert!(group.decode(&short).is_err());
        assert!(group.decode(&reply(1, 0)).unwrap().decision().is_err());
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
            RequestVerdict::Admitted {
                tightest: 1,
                delay_ms: 0
            },
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
}
