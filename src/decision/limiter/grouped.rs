//! The limiter's side of a client's simultaneous requests: one whose rules
//! and keys have a call in flight in this isolate waits in that call's line
//! ([`crate::decision::memory::in_flight`]) instead of sending its own, and those
//! that waited are decided together by one call when it returns, as if
//! they had arrived one after another at that instant. Only a request that
//! finds a call in flight waits: a lone one goes at once.

use std::{borrow::Cow, time::Duration};

use super::{
    leased::Leased,
    outcome::{decided, failed, Handled},
    selection::{budget_of, Selection},
    state::Limiter,
};
use crate::decision::{
    memory::in_flight::Woken,
    transport::protocol::{Check, ScriptCall, ScriptError, ScriptRunner},
    transport::redis_rest::RestError,
};

impl<'c, S: ScriptRunner> Limiter<'c, '_, S> {
    /// Decides `checks` (of a request that arrived at `now_ms`, `own` its
    /// call without lease asks and `signature` the block cache's key for
    /// it) behind the call in flight on `line`: once that call returns, by
    /// a call deciding every request that waited (sent by the newest of
    /// them), or from what the returning call brought (leased units, a
    /// denial to cache). All within the rules' budget from `now_ms`: a
    /// request whose budget runs out in line falls to its fail mode, as
    /// one whose call timed out.
    pub(super) async fn wait_in_line(
        &self,
        selection: &Selection<'c, Cow<'_, str>>,
        checks: &[(Check<'c>, Vec<&str>)],
        leased: Option<&Leased>,
        (own, signature): (&ScriptCall, String),
        line: &str,
        now_ms: u64,
    ) -> Handled<'c> {
        let budget_ms = budget_of(checks.iter().map(|(c, _)| c.rule)).as_millis() as u64;
        let costs = checks.iter().map(|(c, _)| c.cost).collect();
        let deadline_ms = now_ms + budget_ms;
        let waiter = self.in_flight.join(line, costs, deadline_ms);
        let woken = waiter.wait().await;
        let now_ms = self.in_flight.now_ms();
        match woken {
            Woken::Done(result, shared) => {
                let mut handled = match result {
                    Ok(decision) => {
                        self.remember(checks, signature, &decision, now_ms);
                        decided(checks, own, decision)
                    }
                    Err(error) => failed(checks, own, &error),
                };
                handled.shared = Some(shared);
                handled
            }
            Woken::Expired => {
                let timeout = ScriptError::Store(RestError::Timeout { budget_ms });
                failed(checks, own, &timeout)
            }
            Woken::Turn => {
                // Dropping the waiter passes the turn on.
                let from_leases =
                    leased.and_then(|l| self.served_from_leases(selection, checks, l, now_ms));
                if let Some(handled) = from_leases {
                    return handled;
                }
                if let Some(handled) = self.cached_denial(checks, (own, &signature), now_ms) {
                    return handled;
                }
                let left_ms = deadline_ms.saturating_sub(now_ms);
                let sending = waiter.take(now_ms, left_ms);
                let budget = Duration::from_millis(left_ms);
                let sent = self.send(
                    checks,
                    leased,
                    (Some(sending), &[]),
                    (own, signature),
                    budget,
                    now_ms,
                );
                sent.await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::future::join_all;
    use serde_json::{json, Value};

    use std::cell::RefCell;

    use super::*;
    use crate::decision::limiter::{Forward, Outcome};
    use crate::decision::outcomes::events::Action;
    use crate::decision::{
        memory::block_cache::BlockCache, memory::in_flight::InFlight,
        memory::in_flight::SharedCall, memory::leases::Leases, memory::rule_wide::RuleWide,
        runtime::TokioPause, transport::protocol::Entry, transport::redis_rest::Script,
    };
    use crate::rules::{config::Config, request::RequestMeta};

    /// A Redis this far away (ms, there and back), answering every call
    /// with `reply(args)`; it keeps what each call carried.
    struct FarRedis {
        ms: u64,
        reply: fn(&[String]) -> Value,
        sent: RefCell<Vec<Vec<String>>>,
    }

    impl ScriptRunner for FarRedis {
        async fn eval(
            &self,
            _: &Script,
            _: &[String],
            args: &[String],
            _: Duration,
        ) -> Result<serde_json::Value, RestError> {
            self.sent.borrow_mut().push(args.to_vec());
            tokio::time::sleep(Duration::from_millis(self.ms)).await;
            Ok((self.reply)(args))
        }

        async fn commands(
            &self,
            _: &[Vec<String>],
            _: Duration,
        ) -> Result<Vec<Result<Value, RestError>>, RestError> {
            Err(RestError::Auth)
        }
    }

    /// One GCRA rule of 5 a second, burst 5, failing open, with a budget
    /// of 300 ms.
    fn config() -> Config {
        Config::from_json(
            &json!({"rules": [{"name": "ip", "key": ["ip"], "algorithm": "gcra",
            "rate": 5, "period": "1s", "fail": "open", "budget": "300ms"}]}),
        )
        .unwrap()
    }

    /// Admits a lone request with nothing ahead; a group's k-th request
    /// with 4 - k units left.
    fn admit(args: &[String]) -> Value {
        if args[0] != Entry::GROUP {
            return json!(0);
        }
        let n = args[args.iter().position(|a| a == "costs").unwrap() + 1]
            .parse::<i64>()
            .unwrap();
        let fields: Vec<i64> = (0..=n)
            .flat_map(|k| [1, 5, 4 - k, 200 * (k + 1), 0, 1])
            .collect();
        json!(fields)
    }

    /// Requests for `/` from one client, the k-th `k x gap_ms` after the
    /// first, through one isolate whose Redis is `far`, on tokio's paused
    /// clock; what the limiter made of each.
    fn burst(far: &FarRedis, n: u64, gap_ms: u64) -> Vec<Handled<'static>> {
        let config: &'static Config = Box::leak(Box::new(config()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let start = tokio::time::Instant::now();
            let now = move || start.elapsed().as_millis() as u64;
            let limiter = Limiter {
                config,
                store: far,
                cache: &RefCell::new(BlockCache::new(10_000)),
                leases: &RefCell::new(Leases::new()),
                wide: &RefCell::new(RuleWide::new()),
                in_flight: &InFlight::new(TokioPause(now)),
                pinned: false,
                home: None,
            };
            let ip = ("cf-connecting-ip".to_owned(), "192.0.2.1".to_owned());
            let req = RequestMeta::new("GET", "example.com", "/", None, [ip]);
            let (limiter, req) = (&limiter, &req);
            join_all((0..n).map(|k| async move {
                tokio::time::sleep(Duration::from_millis(k * gap_ms)).await;
                limiter.handle(req, now()).await
            }))
            .await
        })
    }

    fn remaining(handled: &Handled<'_>) -> Option<u64> {
        match &handled.outcome {
            Outcome::Forward(Forward::Admitted(d)) => Some(d.decision.rules[0].remaining),
            _ => None,
        }
    }

    /// Requests that come while their client's call is in flight wait for
    /// it, and then one call decides them all, in the order they came,
    /// each with its own decision; the first went at once, alone.
    #[test]
    fn requests_that_come_while_a_call_is_in_flight_are_decided_together() {
        let far = FarRedis {
            ms: 50,
            reply: admit,
            sent: RefCell::new(vec![]),
        };
        let out = burst(&far, 4, 10);
        let sent = far.sent.borrow();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!(
            sent[0],
            ["gcra", "1", "200000", "5", "0"],
            "the first alone, at once"
        );
        assert_eq!(
            sent[1],
            ["group", "", "e", "gcra", "1", "200000", "5", "0", "costs", "2", "1", "1"]
        );
        let shared: Vec<Option<SharedCall>> = out.iter().map(|h| h.shared).collect();
        let of = |place, sent| {
            Some(SharedCall {
                call: 1,
                place,
                sent,
            })
        };
        assert_eq!(shared, [None, of(0, false), of(1, false), of(2, true)]);
        let left: Vec<Option<u64>> = out.iter().map(remaining).collect();
        assert_eq!(left, [Some(4), Some(4), Some(3), Some(2)]);
    }

    /// A request waiting in line whose budget runs out first falls to its
    /// fail mode, as one whose call timed out; it is in no call.
    #[test]
    fn a_request_whose_budget_runs_out_in_line_falls_to_its_fail_mode() {
        let far = FarRedis {
            ms: 400,
            reply: admit,
            sent: RefCell::new(vec![]),
        };
        let out = burst(&far, 3, 10);
        assert_eq!(far.sent.borrow().len(), 1);
        assert_eq!(remaining(&out[0]), Some(4));
        for waited in &out[1..] {
            assert_eq!(waited.outcome, Outcome::Forward(Forward::Bypassed));
            let events: Vec<_> = waited
                .events
                .iter()
                .map(|e| (e.action, e.error.clone()))
                .collect();
            let timeout = RestError::Timeout { budget_ms: 300 }.to_string();
            assert_eq!(events, [(Action::FailOpen, Some(timeout))]);
        }
    }

    /// A denial the call in flight brings back answers the requests that
    /// waited for it from the block cache, with no call of their own.
    #[test]
    fn a_denial_the_awaited_call_brings_answers_those_waiting() {
        let far = FarRedis {
            ms: 50,
            // 1 s ahead: 200 ms too far for one more unit.
            reply: |_| json!(-1_000_001),
            sent: RefCell::new(vec![]),
        };
        let out = burst(&far, 4, 10);
        assert_eq!(far.sent.borrow().len(), 1);
        for handled in &out {
            let Outcome::Deny(d) = &handled.outcome else {
                panic!("{:?}", handled.outcome)
            };
            assert!(d.decision.wait_ms().is_some_and(|ms| ms <= 200));
        }
    }

    /// A lone request, and requests one after another, never wait.
    #[test]
    fn requests_one_after_another_each_make_their_own_call() {
        let far = FarRedis {
            ms: 50,
            reply: admit,
            sent: RefCell::new(vec![]),
        };
        let out = burst(&far, 3, 60);
        assert_eq!(far.sent.borrow().len(), 3);
        assert!(out.iter().all(|h| h.shared.is_none()));
    }
}
