//! The real script on a real redis-server, held to the reference model
//! (`src/operator/simulate/model.rs`): random rule sets and request sequences, every reply
//! field compared exactly. Once on a pinned clock, which covers any span of
//! time in no time; once as in production, on Redis's own clock with real
//! waits and the state stored as production stores it (a GCRA key's expiry
//! is its state), the model being given the clock the script read.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use edge_limiter::{
    decision::{
        limiter::RefundRule,
        outcomes::verdict::Decision,
        transport::keys::{override_key, redis_key},
        transport::protocol::{run, Check, RefundCharge, Reply, ScriptCall, LIMITER},
    },
    operator::simulate::model::Model,
    rules::{
        overrides::Override,
        policy::{Concurrency, Gcra, Policy, Window, Windows},
        rule::{Mode, Rule, RuleId},
    },
};
use proptest::{prelude::*, test_runner::TestCaseError};
use serde_json::{json, Value};
use support::{Backend, BUDGET, TOKEN};

/// GCRA rules, some of which delay a request instead of denying it.
fn gcra() -> impl Strategy<Value = Policy> {
    let delay = prop_oneof![Just(0u64), 1u64..3000];
    (1u64..6, 50u64..3000, 1u64..6, delay).prop_map(|(rate, period_ms, burst, delay_ms)| {
        Policy::Gcra(
            Gcra::new(rate, period_ms, burst)
                .unwrap()
                .delaying(delay_ms),
        )
    })
}

/// In-flight limits whose slots expire within the steps' waits.
fn in_flight() -> impl Strategy<Value = Policy> {
    (1u64..6, 1000u64..5000)
        .prop_map(|(limit, hold_ms)| Policy::Concurrency(Concurrency::new(limit, hold_ms).unwrap()))
}

fn window() -> impl Strategy<Value = Window> {
    (10u64..400, 1u64..8, 1u64..8).prop_map(|(precision_ms, buckets, limit)| {
        Window::new(precision_ms * buckets, limit, precision_ms).unwrap()
    })
}

fn windowed() -> impl Strategy<Value = Policy> {
    prop::collection::vec(window(), 1..4).prop_map(|mut ws| {
        // Two windows with the same duration and precision would share counters; config rejects that.
        ws.dedup_by(|a, b| {
            a.duration_ms() == b.duration_ms() && a.precision_ms() == b.precision_ms()
        });
        ws.sort_by_key(|w| (w.duration_ms(), w.precision_ms()));
        ws.dedup_by(|a, b| {
            a.duration_ms() == b.duration_ms() && a.precision_ms() == b.precision_ms()
        });
        Policy::Windowed(Windows::new(ws).unwrap())
    })
}

/// One request: how long after the previous one, which rules it falls under
/// (a bit mask), which client, what it costs (0 peeks; above the limit is
/// allowed here, to test "never"), and what kind of call it makes; for a
/// group, what each further request costs.
#[derive(Debug, Clone)]
struct Step {
    wait_ms: u64,
    rules: u8,
    client: u8,
    cost: u64,
    kind: Kind,
    further: Vec<u64>,
}

/// The calls a step makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A decision, with refund marks for the charges of rules that count
    /// only some statuses.
    Decide,
    /// Gives back the oldest such charge not given back yet (its own rules,
    /// client and cost); nothing when there is none.
    Refund,
    /// Charges the oldest such charge's cost again, past the limit if it
    /// must be (a debit: a response that cost more than its estimate).
    Debit,
    /// Writes the client's override key of the step's first rule: an
    /// override, garbage or nothing, picked by the step's cost.
    Override,
    /// Sets the step's first rule's override for every client, as an
    /// isolate passes it, picked the same way.
    Wide,
    /// Decides the step's request and its further ones, one after another
    /// at one instant, in one call (a group); each held to the model
    /// deciding them in that order at that instant.
    Group,
}

/// Steps waiting `wait` milliseconds before each request of `cost` units.
fn steps(
    wait: impl Strategy<Value = u64>,
    cost: impl Strategy<Value = u64> + Clone,
) -> impl Strategy<Value = Step> {
    let kind = prop_oneof![
        8 => Just(Kind::Decide),
        2 => Just(Kind::Refund),
        1 => Just(Kind::Debit),
        1 => Just(Kind::Override),
        1 => Just(Kind::Wide),
        3 => Just(Kind::Group),
    ];
    let further = prop::collection::vec(cost.clone(), 1..8);
    (wait, 1u8..8, 0u8..2, cost, kind, further).prop_map(
        |(wait_ms, rules, client, cost, kind, further)| Step {
            wait_ms,
            rules,
            client,
            cost,
            kind,
            further,
        },
    )
}

impl Step {
    /// The requests a decision step makes, each a step of its own: itself,
    /// then a group's further ones.
    fn requests(&self) -> Vec<Step> {
        let further = match self.kind {
            Kind::Group => self.further.as_slice(),
            _ => &[],
        };
        std::iter::once(self.cost)
            .chain(further.iter().copied())
            .map(|cost| Step {
                cost,
                kind: Kind::Decide,
                further: vec![],
                ..self.clone()
            })
            .collect()
    }
}

/// The call deciding step `s`'s requests over `checks` (its first
/// request's) at `now_ms` (`None`: Redis's clock): a decision, or a group.
fn call_of(s: &Step, checks: &[(Check<'_>, Vec<&str>)], now_ms: Option<u64>) -> ScriptCall {
    let costs: Vec<Vec<u64>> = s
        .requests()
        .iter()
        .map(|r| vec![r.cost; checks.len()])
        .collect();
    ScriptCall::group(checks, &costs, vec![], now_ms)
}

/// A call's decisions: one, or a group's.
fn decisions_of(call: &ScriptCall, reply: &Value) -> Result<Vec<Decision>, TestCaseError> {
    let read = call
        .decode(reply)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    match read {
        Reply::Decision(d) => Ok(vec![d]),
        Reply::Decisions(ds) => Ok(ds),
        other => Err(TestCaseError::fail(format!("{other:?}"))),
    }
}

fn step() -> impl Strategy<Value = Step> {
    steps(
        prop_oneof![3 => 0u64..5, 3 => 5u64..400, 1 => 400u64..4000],
        prop_oneof![1 => Just(0u64), 8 => 1u64..3, 1 => 3u64..9],
    )
}

/// A rule of the generated set: its policy, and whether it is a shadow
/// rule, counts only some responses (`count_status`), has a penalty, or
/// takes overrides.
#[derive(Debug, Clone)]
struct Spec {
    policy: Policy,
    shadow: bool,
    counted: bool,
    penalty_ms: Option<u64>,
    overrides: bool,
}

fn spec(
    policy: impl Strategy<Value = Policy>,
    penalty: std::ops::Range<u64>,
) -> impl Strategy<Value = Spec> {
    (
        policy,
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
        prop_oneof![3 => Just(None), 1 => penalty.prop_map(Some)],
        prop::bool::weighted(0.4),
    )
        .prop_map(|(policy, shadow, counted, penalty_ms, overrides)| Spec {
            policy,
            shadow,
            counted,
            penalty_ms,
            overrides,
        })
}

/// Rules named apart for each case, so cases never see each other's keys.
fn rules_of(prefix: &str, specs: &[Spec]) -> Vec<Rule> {
    let case = CASE.fetch_add(1, Ordering::Relaxed);
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| Rule {
            mode: if spec.shadow {
                Mode::Shadow
            } else {
                Mode::Enforce
            },
            count_status: if spec.counted { vec![401] } else { vec![] },
            penalty_ms: spec.penalty_ms,
            overrides: spec.overrides,
            ..Rule::with_policy(&format!("{prefix}{case}r{i}"), spec.policy.clone())
        })
        .collect()
}

/// The step's checks over the rules it falls under.
fn checks_of<'a>(rules: &'a [Rule], s: &Step, client: &'a str) -> Vec<(Check<'a>, Vec<&'a str>)> {
    rules
        .iter()
        .enumerate()
        .filter(|(i, _)| s.rules & (1 << i) != 0)
        .map(|(_, r)| {
            (
                Check {
                    rule: r,
                    cost: s.cost,
                },
                vec![client],
            )
        })
        .collect()
}

/// What an override step writes for `rule`, picked by `pick`: nothing, a
/// block, figures above or below the rule's, or text that is no override
/// (an interval that does not match, another version, a wrong count, an
/// earlier release's limits by position, windows the rule does not have).
fn override_text(rule: &Rule, pick: u64) -> Option<String> {
    // Each window's limit raised, `named` by a duration `shift` ms off the
    // rule's, or by position alone.
    let windows = |named: bool, shift: u64| {
        let Policy::Windowed(ws) = &rule.policy else {
            return "v1 windows 1000:3".to_owned();
        };
        let each: Vec<String> = ws
            .iter()
            .map(|w| match named {
                true => format!("{}:{}", w.duration_ms() + shift, w.limit() + 2),
                false => (w.limit() + 2).to_string(),
            })
            .collect();
        format!("v1 windows {}", each.join(" "))
    };
    let figures = |more: bool| {
        let made = match &rule.policy {
            Policy::Gcra(g) => {
                let burst = if more { g.burst() + 2 } else { 1 };
                Override::changed(
                    rule,
                    serde_json::json!({"rate": g.rate() + 1, "burst": burst})
                        .as_object()
                        .unwrap(),
                )
            }
            Policy::Concurrency(c) => {
                let limit = if more { c.limit() + 2 } else { 1 };
                Override::changed(
                    rule,
                    serde_json::json!({"limits": [limit]}).as_object().unwrap(),
                )
            }
            Policy::Windowed(ws) => {
                let limits: Vec<u64> = ws
                    .iter()
                    .map(|w| if more { w.limit() + 2 } else { 1 })
                    .collect();
                Override::changed(
                    rule,
                    serde_json::json!({"limits": limits}).as_object().unwrap(),
                )
            }
        };
        made.expect("figures the rule can take").to_text()
    };
    match pick % 9 {
        0 => None,
        1 => Some("v1 block".into()),
        2 => Some(figures(true)),
        3 => Some(figures(false)),
        4 => Some("v1 gcra 1 60000 2000 1".into()),
        5 => Some("v2 block".into()),
        6 => Some(windows(false, 0)),
        7 => Some(windows(true, 1)),
        _ => Some("v1 windows 3 3 3 3 3 3 3 3 3".into()),
    }
}

/// A refundable charge not given back yet: its step, the script's
/// decision (its marks, and the overrides it charged under) and the
/// model's marks (by the charged rule's place among the step's checks).
type Refundable = (Step, Decision, Vec<(usize, u64)>);

static CASE: AtomicU64 = AtomicU64::new(0);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn run_case(
    backend: &Backend,
    rt: &tokio::runtime::Runtime,
    specs: &[Spec],
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let rules = rules_of("c", specs);
    let mut model = Model::new();
    let mut pending: std::collections::VecDeque<Refundable> = Default::default();
    // Each rule's override for every client, as an isolate would pass it.
    let mut wide: Vec<Option<String>> = vec![None; rules.len()];
    // Simulated time never runs slower than the real clock, so a key can
    // only expire in Redis once the model, too, holds it worthless.
    let mut skew = 0;
    for (n, s) in steps.iter().enumerate() {
        skew += s.wait_ms;
        let now = now_ms() + skew;
        if matches!(s.kind, Kind::Refund | Kind::Debit) {
            let debit = s.kind == Kind::Debit;
            if let Some((charged, decided, model_marks)) = pending.pop_front() {
                let client = format!("client{}", charged.client);
                let checks = checks_of(&rules, &charged, &client);
                // The real charges go back under the override each was
                // made under, as the worker's do; the model keeps its own.
                let unders: Vec<String> = (0..checks.len())
                    .map(|i| {
                        RefundRule::of(&decided, (i, 0), RuleId(i), Default::default(), 0).under
                    })
                    .collect();
                let keys: Vec<String> = (checks.iter())
                    .map(|(c, id)| redis_key(&c.rule.name, id))
                    .collect();
                // A response reports its cost to rate rules only: an
                // in-flight slot is never debited.
                let rated = |i: usize| {
                    !(debit && matches!(checks[i].0.rule.policy, Policy::Concurrency(_)))
                };
                let given = |marks: &[(usize, u64)], real: bool| -> Vec<RefundCharge<'_>> {
                    marks
                        .iter()
                        .filter(|(i, _)| rated(*i))
                        .map(|(i, mark)| RefundCharge {
                            check: checks[*i].0,
                            id: checks[*i].1.clone(),
                            key: &keys[*i],
                            mark: *mark,
                            under: if real { &unders[*i] } else { "" },
                        })
                        .collect()
                };
                let charges = given(&decided.refund_marks, true);
                let call = match debit {
                    true => ScriptCall::debit(&charges, Some(now)),
                    false => ScriptCall::refund(&charges, Some(now)),
                };
                let real = rt
                    .block_on(run(&backend.client, &call, BUDGET))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let expected = match debit {
                    true => model.debit(&given(&model_marks, false), now),
                    false => model.refund(&given(&model_marks, false), now),
                };
                prop_assert_eq!(
                    real,
                    Reply::Refunded(expected),
                    "step {} refunds (debit: {}) {:?} at {}",
                    n,
                    debit,
                    charged,
                    now
                );
            }
            continue;
        }
        let client = format!("client{}", s.client);
        if write_override(backend, &mut model, &rules, &mut wide, s, &client) {
            continue;
        }
        let checks = checks_of(&rules, s, &client);
        if checks.is_empty() {
            continue;
        }
        let call = call_of(s, &checks, Some(now)).with_rule_wide(wide_of(&checks, &rules, &wide));
        let reply = rt
            .block_on(
                backend
                    .client
                    .run_script(&LIMITER, &call.keys(), &call.args(), BUDGET),
            )
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let real = decisions_of(&call, &reply)?;
        let requests = s.requests();
        prop_assert_eq!(real.len(), requests.len());
        // A group: the model decides its requests in order at one instant.
        for (k, (real, request)) in real.into_iter().zip(requests).enumerate() {
            let expected = model.decide(&checks_of(&rules, &request, &client), now);
            prop_assert_eq!(
                &real,
                &expected,
                "step {} ({:?}), request {} at {}",
                n,
                s,
                k,
                now
            );
            if !real.refund_marks.is_empty() {
                pending.push_back((request, real, expected.refund_marks));
            }
        }
    }
    Ok(())
}

/// For an override step, writes the client's override key (in Redis and
/// the model) or the rule-wide override (in `wide` and the model), and
/// says so; for any other step, does nothing.
fn write_override(
    backend: &Backend,
    model: &mut Model,
    rules: &[Rule],
    wide: &mut [Option<String>],
    s: &Step,
    client: &str,
) -> bool {
    if !matches!(s.kind, Kind::Override | Kind::Wide) {
        return false;
    }
    let Some(i) = (0..rules.len()).find(|i| s.rules & (1 << i) != 0) else {
        return true;
    };
    let (rule, text) = (&rules[i], override_text(&rules[i], s.cost));
    if s.kind == Kind::Wide {
        model.set_rule_wide(&rule.name, text.as_deref());
        wide[i] = text;
        return true;
    }
    let key = override_key(&redis_key(&rule.name, &[client]));
    match &text {
        Some(text) => backend.redis(&["SET", &key, text]),
        None => backend.redis(&["DEL", &key]),
    };
    model.set_override(&rule.name, &[client], text.as_deref());
    true
}

/// The rule-wide override in `wide` (by rule index) of each rule of
/// `checks`, as an isolate holds them: without end.
fn wide_of<'a>(
    checks: &'a [(Check<'_>, Vec<&str>)],
    rules: &'a [Rule],
    wide: &'a [Option<String>],
) -> impl Fn(usize) -> Option<(String, i64)> + 'a {
    move |i| {
        let name = &checks.get(i)?.0.rule.name;
        let text = wide[rules.iter().position(|r| &r.name == name)?].clone()?;
        Some((text, -1))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_script_decides_exactly_as_the_model(
        specs in prop::collection::vec(spec(prop_oneof![gcra(), windowed(), in_flight()], 20..3000), 1..4),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        BACKEND.with(|b| run_case(&b.0, &b.1, &specs, &steps))?;
    }
}

/// A rule alone replies with one integer where it can; where remaining x
/// precision would pass 2^53 (no longer exact in Lua), with six fields. Both
/// agree with the model.
#[test]
fn figures_too_large_for_one_integer_come_as_six_fields() {
    let day = 86_400_000;
    let fixed_day = |limit| {
        Policy::Windowed(Windows::new(vec![Window::new(day, limit, day).unwrap()]).unwrap())
    };
    let steps = |cost| {
        [0, 1, 3].map(|wait_ms| Step {
            wait_ms,
            rules: 1,
            client: 0,
            cost,
            kind: Kind::Decide,
            further: vec![],
        })
    };
    BACKEND.with(|(backend, rt)| {
        // The raw reply of a first request under a lone rule of this limit.
        let reply = |name: &str, limit| {
            let rule = Rule::with_policy(name, fixed_day(limit));
            let call = ScriptCall::decide(
                &[(
                    Check {
                        rule: &rule,
                        cost: 1,
                    },
                    vec!["c"],
                )],
                None,
            );
            rt.block_on(
                backend
                    .client
                    .run_script(&LIMITER, &call.keys(), &call.args(), BUDGET),
            )
            .unwrap()
        };
        let large = reply("large", 1_000_000_000);
        assert!(large.is_array(), "{large}");
        let small = reply("small", 1000);
        assert!(small.is_i64(), "{small}");

        let plain = |policy| Spec {
            policy,
            shadow: false,
            counted: false,
            penalty_ms: None,
            overrides: false,
        };
        run_case(backend, rt, &[plain(fixed_day(1_000_000_000))], &steps(7)).unwrap();
        run_case(backend, rt, &[plain(fixed_day(1000))], &steps(7)).unwrap();
    });
}

thread_local! {
    // One Redis and endpoint for all cases of this test (they use fresh keys).
    static BACKEND: (Backend, tokio::runtime::Runtime) = (Backend::start(), tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap());
}

// ------------------------------------------------------- on Redis's clock

/// Policies whose figures are tens of milliseconds, so that real waits
/// move them; GCRA intervals include ones that are no whole millisecond
/// (the remainder stored beside the expiry).
fn fast_gcra() -> impl Strategy<Value = Policy> {
    let delay = prop_oneof![Just(0u64), 1u64..300];
    (1u64..4, 30u64..300, 1u64..5, delay).prop_map(|(rate, period_ms, burst, delay_ms)| {
        Policy::Gcra(
            Gcra::new(rate, period_ms, burst)
                .unwrap()
                .delaying(delay_ms),
        )
    })
}

fn fast_windowed() -> impl Strategy<Value = Policy> {
    prop::collection::vec(
        (10u64..80, 1u64..6, 1u64..6).prop_map(|(precision_ms, buckets, limit)| {
            Window::new(precision_ms * buckets, limit, precision_ms).unwrap()
        }),
        1..3,
    )
    .prop_map(|mut ws| {
        ws.sort_by_key(|w| (w.duration_ms(), w.precision_ms()));
        ws.dedup_by(|a, b| {
            a.duration_ms() == b.duration_ms() && a.precision_ms() == b.precision_ms()
        });
        Policy::Windowed(Windows::new(ws).unwrap())
    })
}

/// A step on Redis's clock: how long to really wait before it.
fn real_step() -> impl Strategy<Value = Step> {
    steps(
        prop_oneof![4 => 0u64..3, 3 => 3u64..40, 1 => 40u64..150],
        prop_oneof![1 => Just(0u64), 8 => 1u64..3, 1 => 3u64..6],
    )
}

/// Redis's `TIME` reply, in milliseconds.
fn time_ms(reply: &Value) -> Result<u64, TestCaseError> {
    let part = |i: usize| {
        reply[i]
            .as_str()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| TestCaseError::fail(format!("TIME replied {reply}")))
    };
    Ok(part(0)? * 1000 + part(1)? / 1000)
}

/// Runs `call` between two reads of Redis's clock, in one pipeline so that
/// nothing but the script runs between them: the script read its clock (a
/// GCRA key's PTTL, a window's TIME) within [before, after].
async fn bracketed(
    http: &reqwest::Client,
    url: &str,
    call: &ScriptCall,
) -> Result<(u64, Value, u64), TestCaseError> {
    let mut evalsha = vec![
        json!("EVALSHA"),
        json!(LIMITER.sha1),
        json!(call.keys().len()),
    ];
    evalsha.extend(call.keys().iter().chain(&call.args()).map(|a| json!(a)));
    let replies: Vec<Value> = http
        .post(format!("{url}/pipeline"))
        .bearer_auth(TOKEN)
        .json(&json!([["TIME"], evalsha, ["TIME"]]))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| TestCaseError::fail(e.to_string()))?
        .json()
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let result = |i: usize| {
        replies
            .get(i)
            .and_then(|r| r.get("result"))
            .cloned()
            .ok_or_else(|| TestCaseError::fail(format!("pipeline entry {i}: {replies:?}")))
    };
    Ok((time_ms(&result(0)?)?, result(1)?, time_ms(&result(2)?)?))
}

/// How a run on Redis's clock went: steps compared field by field, and
/// steps that straddled a millisecond (checked for their verdict only).
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    exact: u64,
    straddled: u64,
}

async fn run_on_redis_clock(
    backend: &Backend,
    specs: &[Spec],
    steps: &[Step],
) -> Result<Tally, TestCaseError> {
    let rules = rules_of("live", specs);
    let http = support::http();
    let url = backend.endpoint.url();
    let mut model = Model::new();
    let mut wide: Vec<Option<String>> = vec![None; rules.len()];
    let mut tally = Tally::default();
    for (n, s) in steps.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(s.wait_ms)).await;
        let client = format!("client{}", s.client);
        if write_override(backend, &mut model, &rules, &mut wide, s, &client) {
            continue;
        }
        let checks = checks_of(&rules, s, &client);
        if checks.is_empty() {
            continue;
        }
        // A lone rule that takes overrides runs its one-rule path, which
        // hands a call whose override key holds one to the general path.
        let call = call_of(s, &checks, None).with_rule_wide(wide_of(&checks, &rules, &wide));
        let (before, reply, after) = bracketed(&http, &url, &call).await?;
        let mut real = decisions_of(&call, &reply)?;
        // A GCRA mark here is on Redis's microsecond clock, which the model
        // does not read: marks are compared on the pinned clock only.
        real.iter_mut().for_each(|d| d.refund_marks.clear());
        let requests = s.requests();
        // The model deciding the step's requests in order, each at its
        // instant of `at`.
        let decide_at = |model: &mut Model, at: &[u64]| -> Vec<Decision> {
            (requests.iter().zip(at))
                .map(|(r, t)| model.decide(&checks_of(&rules, r, &client), *t))
                .collect()
        };
        if before == after {
            let mut expected = decide_at(&mut model, &vec![before; requests.len()]);
            expected.iter_mut().for_each(|d| d.refund_marks.clear());
            prop_assert_eq!(
                &real,
                &expected,
                "step {} ({:?}) at {} ms, Redis's clock",
                n,
                s,
                before
            );
            tally.exact += 1;
            continue;
        }
        // The millisecond turned while the script ran: its reads may lie on
        // either side, a later request's no earlier than an earlier one's
        // (Redis 7.0's PTTL reads the running clock, a group's requests one
        // after another). The verdicts must be ones the model gives at such
        // instants; then both sides forget these clients, so that the next
        // steps are compared exactly again.
        let admitted = |ds: &[Decision]| ds.iter().map(Decision::admitted).collect::<Vec<_>>();
        let verdicts: Vec<Vec<bool>> = rising(before, after, requests.len())
            .into_iter()
            .map(|at| admitted(&decide_at(&mut model.clone(), &at)))
            .collect();
        prop_assert!(
            verdicts.contains(&admitted(&real)),
            "step {} ({:?}) between {} and {} ms: {:?}, the model says {:?}",
            n,
            s,
            before,
            after,
            real,
            verdicts
        );
        for (check, id) in &checks {
            model.reset(&check.rule.name, id);
        }
        // State and penalties only: the client's override stays, as in the model.
        for key in call.keys().iter().filter(|k| !k.ends_with(":o")) {
            backend.redis(&["DEL", key]);
        }
        tally.straddled += 1;
    }
    Ok(tally)
}

/// Every way `n` requests decided one after another can fall on the
/// milliseconds `from..=to`, each no earlier than the one before; past a
/// few milliseconds (a stalled script), all of them on one millisecond.
fn rising(from: u64, to: u64, n: usize) -> Vec<Vec<u64>> {
    if to - from > 2 {
        return (from..=to).map(|t| vec![t; n]).collect();
    }
    let mut ways = vec![vec![]];
    for _ in 0..n {
        ways = (ways.into_iter())
            .flat_map(|way: Vec<u64>| {
                let start = way.last().copied().unwrap_or(from);
                (start..=to).map(move |t| [way.as_slice(), &[t]].concat())
            })
            .collect();
    }
    ways
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn on_redis_clock_the_script_decides_as_the_model(
        specs in prop::collection::vec(spec(prop_oneof![fast_gcra(), fast_windowed()], 20..200), 1..4),
        steps in prop::collection::vec(real_step(), 1..30),
    ) {
        LIVE.with(|(backend, rt)| rt.block_on(run_on_redis_clock(backend, &specs, &steps)))
            .map(|_| ())?;
    }
}

/// The comparison above must not pass by straddling: at least half of the
/// steps are compared field by field, in one of up to three runs.
#[test]
fn steps_on_redis_clock_are_mostly_compared_exactly() {
    // A penalty and a rule that counts only some responses take part too.
    let steps: Vec<Step> = (0..40)
        .map(|i| Step {
            wait_ms: i % 7 * 3,
            rules: 0b11,
            client: (i % 2) as u8,
            cost: 1,
            kind: Kind::Decide,
            further: vec![],
        })
        .collect();
    let specs = [
        Spec {
            policy: Policy::Gcra(Gcra::new(3, 100, 2).unwrap()),
            shadow: false,
            counted: false,
            penalty_ms: Some(50),
            overrides: true,
        },
        Spec {
            policy: Policy::Windowed(Windows::new(vec![Window::new(100, 3, 20).unwrap()]).unwrap()),
            shadow: false,
            counted: true,
            penalty_ms: None,
            overrides: false,
        },
    ];
    // A busy machine stretches the pipeline between its two TIME reads, and
    // more steps straddle a millisecond: up to three runs, each on keys of
    // its own, every step of every run held to the model all the same.
    let mut tallies = vec![];
    for _ in 0..3 {
        let tally = LIVE
            .with(|(backend, rt)| rt.block_on(run_on_redis_clock(backend, &specs, &steps)))
            .unwrap();
        println!("on Redis's clock: {tally:?} of 40 steps");
        tallies.push(tally.exact);
        if tally.exact >= 20 {
            return;
        }
    }
    panic!("steps of 40 compared exactly, in each of three runs: {tallies:?}");
}

thread_local! {
    // The script loaded once, so that EVALSHA in a pipeline finds it.
    static LIVE: (Backend, tokio::runtime::Runtime) = {
        let backend = Backend::start();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(backend.client.command(&["SCRIPT", "LOAD", LIMITER.source])).expect("the script loads");
        (backend, rt)
    };
}
