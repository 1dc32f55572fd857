//! Script calls of several requests carried to Redis by one REST request.
//!
//! An isolate is single-threaded: its requests interleave at await points.
//! A call made while none of the isolate's REST requests is in flight goes
//! at once and alone, one `POST /` as without batching, so a lone request
//! pays nothing for it. A call made while others are in flight waits one
//! turn of the event loop (the events already waiting for the isolate:
//! requests that have arrived, replies that have landed), and every call
//! made meanwhile goes with it in one `POST /pipeline`. Upstash answers
//! each entry on its own (a pipeline is not atomic, and each entry is
//! billed as one command, as before), so a `NOSCRIPT` or an error in one
//! entry is that call's alone, and each call keeps its own deadline: it
//! ends at it, with a timeout, whatever its batch is doing. The request
//! that opens a batch sends it from its `waitUntil` and rings a signal of
//! its own when the answers are in; the others follow that signal, so each
//! resumes in its own context ([`Pause::signal`] says why it matters).
//!
//! Why a turn and not a microtask: workerd delivers each incoming request
//! as an event of its own, microtasks run before the next, and so calls
//! gathered by a microtask are only ever one request's (measured under 8
//! and 64 connections: every gathering held one call).

use std::{
    cell::{Cell, RefCell},
    future::Future,
    rc::Rc,
    time::Duration,
};

use serde_json::Value;

use crate::decision::{
    runtime::{Bell, Pause, Signal},
    transport::protocol::ScriptRunner,
    transport::redis_rest::{
        command_values, evalsha_or_eval, timed_out, RestError, Script, Transport,
    },
};

/// What batching needs from the runtime of the request making a call,
/// beyond the clock, the pause a call waits for its batch in, and the
/// signal that ends it (made by the request that opens the batch, and
/// rung by it when the batch's answers are in).
pub trait Runtime: Pause + Clone + 'static {
    /// Ends once the events already waiting for the isolate are handled.
    fn turn(&self) -> impl Future<Output = ()> + 'static;

    /// Runs `task` to its end beside this request, past its response if
    /// need be (the request that opens a batch sends it for every call in it).
    fn spawn(&self, task: impl Future<Output = ()> + 'static);
}

/// The isolate's calls: the transport, and what is in flight or gathering.
pub struct Batches<T> {
    shared: Rc<BatchState<T>>,
}

struct BatchState<T> {
    transport: T,
    /// REST requests sent and not yet answered.
    in_flight: Cell<u32>,
    /// The batch open, if one is: its calls so far, and the signal its
    /// opener rings once their answers are in.
    gathering: RefCell<Option<(Vec<BatchedCall>, Signal)>>,
}

/// A call in a batch: its command, when its budget ends, and where its
/// answer goes.
struct BatchedCall {
    command: Value,
    deadline_ms: u64,
    answer: Rc<BatchAnswer>,
}

type BatchAnswer = RefCell<Option<Result<Value, RestError>>>;

/// A REST request sent and not yet answered, counted for as long as it
/// lives (not `in_flight::InFlight`, which tracks decision calls by key).
struct Outstanding<'a>(&'a Cell<u32>);

impl<'a> Outstanding<'a> {
    fn start(count: &'a Cell<u32>) -> Outstanding<'a> {
        count.set(count.get() + 1);
        Outstanding(count)
    }
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

impl<T: Transport + 'static> Batches<T> {
    /// Calls through `transport`, none in flight yet.
    pub fn new(transport: T) -> Batches<T> {
        Batches {
            shared: Rc::new(BatchState {
                transport,
                in_flight: Cell::new(0),
                gathering: RefCell::new(None),
            }),
        }
    }

    /// Calls made by one request, on its `runtime`.
    pub fn for_request<R: Runtime>(&self, runtime: R) -> Batched<'_, T, R> {
        Batched {
            batches: self,
            runtime,
        }
    }
}

/// One request's calls, carried with the isolate's others.
pub struct Batched<'b, T, R: Runtime> {
    batches: &'b Batches<T>,
    runtime: R,
}

impl<T: Transport + 'static, R: Runtime> Batched<'_, T, R> {
    /// Sends `command` within `left`: at once and alone when nothing else is
    /// in flight, otherwise in the batch gathering now.
    async fn one(&self, command: Value, left: Duration) -> Result<Value, RestError> {
        let shared = &self.batches.shared;
        if shared.in_flight.get() == 0 && shared.gathering.borrow().is_none() {
            let _flight = Outstanding::start(&shared.in_flight);
            return shared.transport.send(command, left).await;
        }
        let answer = Rc::new(RefCell::new(None));
        let deadline_ms = self.runtime.now_ms() + left.as_millis() as u64;
        let waiting = BatchedCall {
            command,
            deadline_ms,
            answer: answer.clone(),
        };
        let (opened, signal) = {
            let mut gathering = shared.gathering.borrow_mut();
            match gathering.as_mut() {
                Some((calls, signal)) => {
                    calls.push(waiting);
                    (None, signal.clone())
                }
                None => {
                    let (bell, signal) = self.runtime.signal();
                    *gathering = Some((vec![waiting], signal.clone()));
                    (Some(bell), signal)
                }
            }
        };
        if let Some(bell) = opened {
            let turn = self.runtime.turn();
            let runtime = self.runtime.clone();
            self.runtime
                .spawn(carry(shared.clone(), turn, runtime, bell));
        }
        self.runtime.until(deadline_ms, Some(&signal)).await;
        let answered = answer.borrow_mut().take();
        answered.unwrap_or(Err(timed_out(left)))
    }
}

/// The most a pipeline carries, in bytes of its commands' text, below the
/// smallest body limit an endpoint has (1 MiB at the local endpoint, 10 MB
/// at Upstash): a fresh Redis answers every call of a busy moment
/// `NOSCRIPT`, and their fallbacks each carry the ~20 KB script source.
pub const PIPELINE_BYTES: usize = 256 * 1024;

/// After `turn`, sends the calls gathered meanwhile, in as few requests of
/// at most [`PIPELINE_BYTES`] as they fit in, all at once, hands each call
/// its own answer, and rings `bell` once every request is answered.
async fn carry<T: Transport + 'static, R: Runtime>(
    shared: Rc<BatchState<T>>,
    turn: impl Future<Output = ()>,
    runtime: R,
    bell: Bell,
) {
    turn.await;
    let gathered = shared.gathering.borrow_mut().take();
    // A call no longer waited for (its deadline came first, its request
    // went) is left out: it has not reached Redis, and nobody would read it.
    let waiting = gathered
        .map(|(calls, _)| calls)
        .unwrap_or_default()
        .into_iter()
        .filter(|w| Rc::strong_count(&w.answer) > 1);
    let mut sends: Vec<_> = by_size(waiting, PIPELINE_BYTES)
        .into_iter()
        .map(|run| Box::pin(send_batch(&shared, run, &runtime)))
        .collect();
    std::future::poll_fn(|cx| {
        sends.retain_mut(|send| send.as_mut().poll(cx).is_pending());
        match sends.is_empty() {
            true => std::task::Poll::Ready(()),
            false => std::task::Poll::Pending,
        }
    })
    .await;
    bell.ring();
}

/// `calls` in order, cut into runs whose commands' text stays within
/// `bound` bytes (a call larger than `bound` alone in its run).
fn by_size(calls: impl Iterator<Item = BatchedCall>, bound: usize) -> Vec<Vec<BatchedCall>> {
    let mut runs: Vec<Vec<BatchedCall>> = Vec::new();
    let mut filled = 0;
    for call in calls {
        let size = text_bytes(&call.command);
        match runs.last_mut() {
            Some(run) if filled + size <= bound => run.push(call),
            _ => {
                runs.push(vec![call]);
                filled = 0;
            }
        }
        filled += size;
    }
    runs
}

/// About the bytes `command` takes as JSON: its strings' lengths (escapes
/// aside, which the bound's margin below 1 MiB covers) and a few per part.
fn text_bytes(command: &Value) -> usize {
    match command {
        Value::Array(parts) => parts.iter().map(|p| 4 + text_bytes(p)).sum(),
        Value::String(s) => s.len(),
        _ => 8,
    }
}

/// Sends `waiting` in one request, within the latest of their deadlines,
/// and leaves each its answer.
async fn send_batch<T: Transport>(
    shared: &BatchState<T>,
    mut waiting: Vec<BatchedCall>,
    clock: &impl Pause,
) {
    let Some(latest) = waiting.iter().map(|w| w.deadline_ms).max() else {
        return;
    };
    let budget = Duration::from_millis(latest.saturating_sub(clock.now_ms()).max(1));
    let answers = {
        let _flight = Outstanding::start(&shared.in_flight);
        if waiting.len() == 1 {
            let command = std::mem::take(&mut waiting[0].command);
            vec![shared.transport.send(command, budget).await]
        } else {
            let commands = waiting
                .iter_mut()
                .map(|w| std::mem::take(&mut w.command))
                .collect();
            match shared.transport.send_all(commands, budget).await {
                Ok(answers) => answers,
                Err(failed) => vec![Err(failed); waiting.len()],
            }
        }
    };
    for (w, answer) in waiting.into_iter().zip(answers) {
        *w.answer.borrow_mut() = Some(answer);
    }
}

impl<T: Transport + 'static, R: Runtime> ScriptRunner for Batched<'_, T, R> {
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
        budget: Duration,
    ) -> Result<Value, RestError> {
        // The fallback to EVAL is this call's own, batched as any call is.
        let now_ms = || self.runtime.now_ms() as f64;
        evalsha_or_eval(script, keys, args, budget, now_ms, |command, left| {
            self.one(command, left)
        })
        .await
    }

    /// Plain commands (the rule-wide read, after a response) go at once, in
    /// a pipeline of their own.
    async fn commands(
        &self,
        commands: &[Vec<String>],
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError> {
        let shared = &self.batches.shared;
        let _flight = Outstanding::start(&shared.in_flight);
        shared
            .transport
            .send_all(command_values(commands), budget)
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use serde_json::json;
    use tokio::{task::LocalSet, time::Instant};

    use super::*;
    use crate::decision::runtime::{Paused, TokioPause};

    /// What the fake endpoint received: one command, or a pipeline.
    #[derive(Debug, Clone, PartialEq)]
    enum Received {
        One(Value),
        All(Vec<Value>),
    }

    /// An endpoint some milliseconds away that answers each command on
    /// its own: a script call with the first key it names, `WRONGTYPE` for
    /// the key `wrong`, `NOSCRIPT` for an `EVALSHA` of any script but
    /// [`KNOWN`]. It keeps to each request's budget as the REST client
    /// does, and can fail whole requests.
    #[derive(Default)]
    struct Endpoint {
        sent: RefCell<Vec<(u64, Received)>>,
        latency_ms: Cell<u64>,
        down: Cell<bool>,
    }

    /// The local endpoint's body limit (`DEFAULT_MAX_BODY_BYTES`).
    const MAX_BODY_BYTES: usize = 1 << 20;

    impl Endpoint {
        fn new(latency_ms: u64) -> Endpoint {
            let e = Endpoint::default();
            e.latency_ms.set(latency_ms);
            e
        }

        fn answer(&self, command: &Value) -> Result<Value, RestError> {
            match (command[0].as_str(), command[3].as_str()) {
                (Some("EVALSHA"), _) if command[1] != KNOWN.sha1 => Err(RestError::NoScript),
                (_, Some("wrong")) => Err(RestError::Redis("WRONGTYPE".into())),
                (_, key) => Ok(json!(key)),
            }
        }

        /// Waits out the latency, or the budget if it ends first.
        async fn exchange(&self, sent: Received, budget: Duration) -> Result<(), RestError> {
            let body = match &sent {
                Received::One(command) => command.to_string(),
                Received::All(commands) => Value::from(commands.clone()).to_string(),
            };
            self.sent.borrow_mut().push((elapsed_ms(), sent));
            if body.len() > MAX_BODY_BYTES {
                return Err(RestError::Status {
                    status: 413,
                    body: "request body too large".into(),
                });
            }
            let latency = Duration::from_millis(self.latency_ms.get());
            tokio::time::sleep(latency.min(budget)).await;
            if latency > budget {
                return Err(timed_out(budget));
            }
            match self.down.get() {
                true => Err(RestError::Status {
                    status: 502,
                    body: "bad gateway".into(),
                }),
                false => Ok(()),
            }
        }

        fn sent(&self) -> Vec<(u64, Received)> {
            self.sent.borrow().clone()
        }
    }

    impl Transport for Rc<Endpoint> {
        async fn send(&self, command: Value, budget: Duration) -> Result<Value, RestError> {
            self.exchange(Received::One(command.clone()), budget)
                .await?;
            self.answer(&command)
        }

        async fn send_all(
            &self,
            commands: Vec<Value>,
            budget: Duration,
        ) -> Result<Vec<Result<Value, RestError>>, RestError> {
            self.exchange(Received::All(commands.clone()), budget)
                .await?;
            Ok(commands.iter().map(|c| self.answer(c)).collect())
        }
    }

    /// Tokio's current-thread loop on a paused clock, counting what the
    /// batching asked of it.
    #[derive(Clone, Default)]
    struct Loop {
        asked: Rc<Cell<u32>>,
    }

    thread_local! {
        static START: Instant = Instant::now();
    }

    fn elapsed_ms() -> u64 {
        START.with(|s| s.elapsed().as_millis() as u64)
    }

    impl Pause for Loop {
        fn now_ms(&self) -> u64 {
            elapsed_ms()
        }

        fn signal(&self) -> (Bell, Signal) {
            Signal::native()
        }

        fn until(&self, until_ms: u64, signal: Option<&Signal>) -> Paused {
            self.asked.set(self.asked.get() + 1);
            TokioPause(elapsed_ms).until(until_ms, signal)
        }
    }

    impl Runtime for Loop {
        fn turn(&self) -> impl Future<Output = ()> + 'static {
            self.asked.set(self.asked.get() + 1);
            tokio::task::yield_now()
        }

        fn spawn(&self, task: impl Future<Output = ()> + 'static) {
            self.asked.set(self.asked.get() + 1);
            tokio::task::spawn_local(task);
        }
    }

    const KNOWN: Script = Script {
        source: "return KEYS[1]",
        sha1: "known-sha1",
    };
    const BUDGET: Duration = Duration::from_millis(1000);

    type Calls = Batches<Rc<Endpoint>>;

    /// A script call for `key` through `calls`, as a request on `lp` makes it.
    async fn call(
        calls: &Calls,
        lp: &Loop,
        script: &Script,
        key: &str,
        budget: Duration,
    ) -> Result<Value, RestError> {
        let args = ["a".to_owned()];
        calls
            .for_request(lp.clone())
            .eval(script, &[key.to_owned()], &args, budget)
            .await
    }

    fn evalsha(script: &Script, key: &str) -> Value {
        json!(["EVALSHA", script.sha1, 1, key, "a"])
    }

    /// Runs `test` on a current-thread loop whose clock is paused.
    fn on_loop<F: Future<Output = ()>>(test: impl FnOnce(Rc<Calls>, Rc<Endpoint>, Loop) -> F) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let endpoint = Rc::new(Endpoint::new(10));
        let calls = Rc::new(Batches::new(endpoint.clone()));
        LocalSet::new().block_on(&runtime, async {
            START.with(|_| ());
            test(calls, endpoint, Loop::default()).await
        });
    }

    /// Starts a call on its own task, as a request of its own would.
    fn start(
        calls: &Rc<Calls>,
        lp: &Loop,
        script: &'static Script,
        key: &'static str,
        budget: Duration,
    ) -> tokio::task::JoinHandle<(Result<Value, RestError>, u64)> {
        let (calls, lp) = (calls.clone(), lp.clone());
        tokio::task::spawn_local(async move {
            let answer = call(&calls, &lp, script, key, budget).await;
            (answer, elapsed_ms())
        })
    }

    #[test]
    fn a_lone_call_goes_at_once_and_alone() {
        on_loop(|calls, endpoint, lp| async move {
            let answer = call(&calls, &lp, &KNOWN, "k1", BUDGET).await;
            assert_eq!(answer, Ok(json!("k1")));
            assert_eq!(endpoint.sent(), [(0, Received::One(evalsha(&KNOWN, "k1")))]);
            assert_eq!(lp.asked.get(), 0, "no bell, turn or task for a lone call");
        });
    }

    #[test]
    fn calls_made_while_one_is_in_flight_share_a_request_and_each_gets_its_own_answer() {
        on_loop(|calls, endpoint, lp| async move {
            let first = start(&calls, &lp, &KNOWN, "k1", BUDGET);
            tokio::time::sleep(Duration::from_millis(2)).await;
            let together = [
                start(&calls, &lp, &KNOWN, "k2", BUDGET),
                start(&calls, &lp, &KNOWN, "wrong", BUDGET),
                start(&calls, &lp, &KNOWN, "k3", BUDGET),
            ];
            assert_eq!(first.await.unwrap(), (Ok(json!("k1")), 10));
            let mut answers = vec![];
            for t in together {
                answers.push(t.await.unwrap());
            }
            assert_eq!(
                answers,
                [
                    (Ok(json!("k2")), 12),
                    (Err(RestError::Redis("WRONGTYPE".into())), 12),
                    (Ok(json!("k3")), 12),
                ]
            );
            let batch = ["k2", "wrong", "k3"].map(|k| evalsha(&KNOWN, k));
            assert_eq!(
                endpoint.sent(),
                [
                    (0, Received::One(evalsha(&KNOWN, "k1"))),
                    (2, Received::All(batch.to_vec()))
                ]
            );
            // Nothing is left in flight: the next call goes alone again.
            call(&calls, &lp, &KNOWN, "k4", BUDGET).await.unwrap();
            assert_eq!(
                endpoint.sent()[2],
                (12, Received::One(evalsha(&KNOWN, "k4")))
            );
        });
    }

    #[test]
    fn noscript_in_one_entry_sends_that_call_alone_by_source() {
        const UNKNOWN: Script = Script {
            source: "return KEYS[1] -- not loaded",
            sha1: "unknown-sha1",
        };
        on_loop(|calls, endpoint, lp| async move {
            let first = start(&calls, &lp, &KNOWN, "k1", BUDGET);
            tokio::time::sleep(Duration::from_millis(2)).await;
            let known = start(&calls, &lp, &KNOWN, "k2", BUDGET);
            let unknown = start(&calls, &lp, &UNKNOWN, "k3", BUDGET);
            assert_eq!(first.await.unwrap().0, Ok(json!("k1")));
            assert_eq!(known.await.unwrap(), (Ok(json!("k2")), 12));
            assert_eq!(unknown.await.unwrap(), (Ok(json!("k3")), 22));
            let sent: Vec<Received> = endpoint.sent().into_iter().map(|(_, s)| s).collect();
            assert_eq!(
                sent[1..],
                [
                    Received::All(vec![evalsha(&KNOWN, "k2"), evalsha(&UNKNOWN, "k3")]),
                    Received::One(json!(["EVAL", UNKNOWN.source, 1, "k3", "a"])),
                ]
            );
        });
    }

    #[test]
    fn fallbacks_of_a_busy_moment_on_a_fresh_redis_go_in_requests_the_endpoint_takes() {
        // The joined script's size: 64 fallbacks carry 1.3 MB of source.
        let source: &'static str =
            Box::leak(format!("return KEYS[1] -- {}", "x".repeat(20_000)).into());
        let unloaded: &'static Script = Box::leak(Box::new(Script {
            source,
            sha1: "unloaded-sha1",
        }));
        on_loop(|calls, endpoint, lp| async move {
            let first = start(&calls, &lp, unloaded, "k0", BUDGET);
            tokio::time::sleep(Duration::from_millis(2)).await;
            let keys: Vec<&'static str> = (1..64).map(|i| &*format!("k{i}").leak()).collect();
            let busy: Vec<_> = keys
                .iter()
                .map(|k| start(&calls, &lp, unloaded, k, BUDGET))
                .collect();
            assert_eq!(first.await.unwrap().0, Ok(json!("k0")));
            for (key, call) in keys.iter().zip(busy) {
                assert_eq!(call.await.unwrap().0, Ok(json!(key)));
            }
            let sent = endpoint.sent();
            let pipelines = sent
                .iter()
                .filter(|(_, s)| matches!(s, Received::All(_)))
                .count();
            // One pipeline of 63 EVALSHAs, then their fallbacks in runs of
            // at most PIPELINE_BYTES: 12 a request.
            assert_eq!(pipelines, 1 + 63usize.div_ceil(PIPELINE_BYTES / 20_050));
        });
    }

    #[test]
    fn a_budget_that_ends_mid_batch_ends_that_call_alone_at_its_deadline() {
        on_loop(|calls, endpoint, lp| async move {
            endpoint.latency_ms.set(200);
            let first = start(&calls, &lp, &KNOWN, "k1", BUDGET);
            tokio::time::sleep(Duration::from_millis(5)).await;
            let short = start(&calls, &lp, &KNOWN, "k2", Duration::from_millis(50));
            let long = start(&calls, &lp, &KNOWN, "k3", BUDGET);
            assert_eq!(
                short.await.unwrap(),
                (Err(RestError::Timeout { budget_ms: 50 }), 55)
            );
            assert_eq!(long.await.unwrap(), (Ok(json!("k3")), 205));
            assert_eq!(first.await.unwrap(), (Ok(json!("k1")), 200));
            let batch = vec![evalsha(&KNOWN, "k2"), evalsha(&KNOWN, "k3")];
            assert_eq!(endpoint.sent()[1], (5, Received::All(batch)));
        });
    }

    #[test]
    fn a_batch_waits_no_longer_than_its_latest_deadline() {
        on_loop(|calls, endpoint, lp| async move {
            endpoint.latency_ms.set(2000);
            let first = start(&calls, &lp, &KNOWN, "k1", Duration::from_millis(100));
            tokio::time::sleep(Duration::from_millis(5)).await;
            let a = start(&calls, &lp, &KNOWN, "k2", Duration::from_millis(30));
            let b = start(&calls, &lp, &KNOWN, "k3", Duration::from_millis(60));
            let timeout = |ms| Err(RestError::Timeout { budget_ms: ms });
            assert_eq!(a.await.unwrap(), (timeout(30), 35));
            assert_eq!(b.await.unwrap(), (timeout(60), 65));
            assert_eq!(first.await.unwrap(), (timeout(100), 100));
            // The next call finds nothing in flight, the batch abandoned.
            endpoint.latency_ms.set(10);
            call(&calls, &lp, &KNOWN, "k4", BUDGET).await.unwrap();
            assert!(matches!(
                endpoint.sent().last(),
                Some((100, Received::One(_)))
            ));
        });
    }

    #[test]
    fn a_failed_request_fails_every_call_it_carried() {
        on_loop(|calls, endpoint, lp| async move {
            let first = start(&calls, &lp, &KNOWN, "k1", BUDGET);
            tokio::time::sleep(Duration::from_millis(2)).await;
            endpoint.down.set(true);
            let together = [
                start(&calls, &lp, &KNOWN, "k2", BUDGET),
                start(&calls, &lp, &KNOWN, "k3", BUDGET),
            ];
            // The endpoint went down under the first request too.
            let (first, _) = first.await.unwrap();
            assert!(matches!(first, Err(RestError::Status { status: 502, .. })));
            for t in together {
                let (answer, _) = t.await.unwrap();
                assert!(matches!(answer, Err(RestError::Status { status: 502, .. })));
            }
        });
    }

    #[test]
    fn a_call_no_longer_waited_for_is_left_out_of_its_batch() {
        on_loop(|calls, endpoint, lp| async move {
            let first = start(&calls, &lp, &KNOWN, "k1", BUDGET);
            tokio::time::sleep(Duration::from_millis(2)).await;
            // A call joins the batch, and is dropped before its turn comes.
            let mut gone = Box::pin(call(&calls, &lp, &KNOWN, "k2", BUDGET));
            std::future::poll_fn(|cx| {
                assert!(gone.as_mut().poll(cx).is_pending());
                Poll::Ready(())
            })
            .await;
            let kept = start(&calls, &lp, &KNOWN, "k3", BUDGET);
            drop(gone);
            assert_eq!(first.await.unwrap().0, Ok(json!("k1")));
            assert_eq!(kept.await.unwrap().0, Ok(json!("k3")));
            assert_eq!(
                endpoint.sent()[1],
                (2, Received::One(evalsha(&KNOWN, "k3")))
            );
        });
    }
}
