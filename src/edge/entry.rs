//! The wasm32-only edge: reads the runtime's request into [`RequestMeta`],
//! lets [`Limiter::handle`] decide, and sends the [`Response`] that
//! [`responses::render`] makes of its outcome.

use std::{
    cell::{Cell, RefCell},
    future::Future,
    rc::Rc,
    task::{Poll, Waker},
};

use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use worker::{console_error, console_log, event, worker_sys::web_sys, Context, Env, Result, Url};

use crate::{
    decision::{
        limiter::{Handled, LeaseRefresh, Limiter, PendingRefund, PoolWork},
        memory::in_flight::InFlight,
        memory::log_gate::LogGate,
        memory::{seeded, IsolateMemory},
        outcomes::events::{Action, Event},
        runtime::{Bell, Pause, Paused, Signal},
        stats::{
            calls::Counted,
            recorder::{Recorder, StatsWrite},
            timer::WriteTimer,
            write,
        },
        transport::batch::{Batched, Batches, Runtime},
        transport::redis_rest::RestClient,
    },
    edge::{
        microtasks,
        responses::{self, Response, PROBLEM_JSON},
    },
    rules::{
        body::MAX_BODY_BYTES,
        config::{parse_origin, Config, STATS_SECRET},
        regions::{self, Region},
        request::{CfField, RequestMeta},
    },
};

/// The `[vars]` entry holding the rules.
pub const CONFIG_VAR: &str = "LIMITER";

/// What an isolate reads from its environment once: the variables cannot
/// change under a running isolate (a new deploy starts new ones).
struct Isolate {
    config: Config,
    /// The request headers the rules can read: the only ones read.
    headers_read: Vec<String>,
    origin: Option<String>,
    client: RestClient,
    /// The script calls of its requests, those made at the same moment
    /// carried together.
    calls: Batches<RestClient>,
    /// The home's Redis, for a region other than the home whose rules
    /// include shared ones: their far calls and top-ups go there.
    home: Option<Batches<RestClient>>,
    /// What its requests' limiters decide with: denials, leases, the
    /// rule-wide overrides, the calls in flight.
    memory: IsolateMemory,
    /// What it counted and has not written yet, when stats are on.
    stats: Option<RefCell<Recorder>>,
    /// The timers it set to write them with no later request.
    stats_timer: RefCell<WriteTimer>,
    /// Its log lines, held back where a flood repeats them.
    log_gate: RefCell<LogGate>,
    /// When the last timer it set for held-back lines fires (0: none yet).
    log_flush_at: Cell<u64>,
}

thread_local! {
    /// The isolate's state per region, by its place in `regions` (the
    /// home's first), each made on its first request. An isolate in
    /// production serves one place, so one region besides the home's.
    static ISOLATES: RefCell<Vec<Option<Rc<Isolate>>>> = const { RefCell::new(Vec::new()) };
}

/// The isolate's state for the region `req` goes to.
fn isolate(
    env: &Env,
    req: &web_sys::Request,
    url: &Url,
) -> std::result::Result<Rc<Isolate>, String> {
    // The home's state first, whose configuration routes the request, then
    // the region's it routes to: one call making them, so that the wasm
    // holds the configuration's reader once.
    let mut at = 0;
    loop {
        let state = made(env, at)?;
        let to = match at {
            0 => region_of(&state.config.regions, req, url),
            _ => at,
        };
        if to == at {
            return Ok(state);
        }
        at = to;
    }
}

/// The region of `regions` that decides `req`: the one a local run names
/// in its header, else the one its place in `request.cf` goes to.
fn region_of(regions: &[Region], req: &web_sys::Request, url: &Url) -> usize {
    if regions.len() < 2 {
        return 0;
    }
    let pinned = url.host_str().is_some_and(regions::pinnable);
    let named = pinned
        .then(|| req.headers().get(regions::PIN_HEADER).ok().flatten())
        .flatten()
        .and_then(|name| regions::named(regions, &name));
    named.unwrap_or_else(|| {
        let cf = cf_facts(req, &[CfField::Colo, CfField::Continent]);
        let place = |field| {
            cf.iter()
                .find(|(f, _)| *f == field)
                .map(|(_, v)| v.as_str())
        };
        regions::route(regions, place(CfField::Colo), place(CfField::Continent))
    })
}

/// Region `at`'s state (0: the home, or the one Redis), made on first use
/// with its calls going to that region's Redis.
fn made(env: &Env, at: usize) -> std::result::Result<Rc<Isolate>, String> {
    if let Some(ready) = ISOLATES.with(|all| all.borrow().get(at).cloned().flatten()) {
        return Ok(ready);
    }
    microtasks::put_back();
    // Before any map: 104 bits that no client sees, drawn afresh per isolate.
    let draw = || (js_sys::Math::random() * 2f64.powi(52)) as u64;
    seeded::seed_with([draw(), draw()]);
    // Read per region rather than cloned: a clone of the rules costs the
    // wasm kilobytes, a second reading microseconds once per isolate.
    let config = load_config(env)?;
    let secrets = |at: usize| {
        let (url, token) = regions::secrets(&config.regions, at);
        match (env.secret(&url), env.secret(&token)) {
            (Ok(u), Ok(t)) => Ok((u.to_string(), t.to_string())),
            _ => Err(format!(
                "set {url} and {token} (wrangler secret put, or .dev.vars locally)"
            )),
        }
    };
    // Every region's at the first request: a missing one fails the
    // deployment, not only the requests of one place.
    for other in 1..config.regions.len() {
        secrets(other)?;
    }
    let connect = |at: usize| {
        let (url, token) = secrets(at)?;
        RestClient::new(&url, &token).map_err(|e| e.to_string())
    };
    let client = connect(at)?;
    let home = match at > 0 && config.shares_rules() {
        true => Some(Batches::new(connect(0)?)),
        false => None,
    };
    let ready = Rc::new(Isolate {
        stats: config
            .stats
            // 53 random bits: no two isolates' writes share a number.
            .map(|s| {
                RefCell::new(Recorder::new(
                    &config,
                    s,
                    (js_sys::Math::random() * 2f64.powi(53)) as u64,
                ))
            }),
        memory: IsolateMemory::new(config.cache_hold_ms, InFlight::new(JsPause)),
        headers_read: config.headers_read(),
        log_gate: RefCell::new(LogGate::new()),
        log_flush_at: Cell::new(0),
        stats_timer: RefCell::new(WriteTimer::default()),
        config,
        origin: origin(env)?,
        calls: Batches::new(client.clone()),
        home,
        client,
    });
    ISOLATES.with(|all| {
        let mut all = all.borrow_mut();
        if all.len() <= at {
            all.resize(at + 1, None);
        }
        all[at] = Some(ready.clone());
    });
    Ok(ready)
}

// The handler works on the runtime's own request and response objects:
// workers-rs's wrappers would read the request's `cf` properties, its URL
// and method into Rust on every request, and rebuild each response, which
// a limiter that only needs a few fields pays for on every call.
#[event(fetch)]
async fn fetch(req: web_sys::Request, env: Env, ctx: Context) -> Result<web_sys::Response> {
    let url = Url::parse(&req.url())?;
    let isolate = match isolate(&env, &req, &url) {
        Ok(s) => s,
        Err(message) => {
            console_error!("edge-limiter: {message}");
            let body = responses::failure_body(
                500,
                "edge-limiter is misconfigured; see the worker's log.",
            );
            return respond(500, PROBLEM_JSON, &body, &[]);
        }
    };
    let mut meta = request_meta(&req, &url, &isolate.headers_read);
    if isolate.config.needs_body(&meta) {
        meta.body = body_prefix(&req).await;
        meta.body_cut = meta.body.is_none();
    }
    if isolate.config.needs_cf(&meta) {
        meta.cf = cf_facts(&req, &CfField::ALL);
    }
    let now_ms = js_sys::Date::now() as u64;
    let ctx = Rc::new(ctx);
    let batched = isolate.batched(&OnRequest(ctx.clone()));
    let calls = batched.counted();
    let limiter = isolate.limiter(&calls);
    let handled = limiter.handle(&meta, now_ms).await;
    // Where a denial came from, for the stats: read off `request.cf` only
    // then, unless a rule's key read it already.
    let denied = handled.events.iter().any(|e| e.action == Action::Deny);
    let from = match isolate.stats.is_some() && denied && meta.cf.is_empty() {
        true => cf_facts(&req, &[CfField::Country, CfField::Asn]),
        false => vec![],
    };
    let from = if from.is_empty() { &meta.cf } else { &from };
    isolate.count(|s| s.request(&isolate.config, &handled, from, calls.take(), now_ms));
    let Handled {
        outcome,
        events,
        refund,
        refresh,
        reread,
        pool,
        ..
    } = handled;
    isolate.log(&OnRequest(ctx.clone()), events);
    let releases = refund.as_ref().is_some_and(|r| r.releases(&isolate.config));
    let work = Background {
        releases,
        refund,
        refresh,
        reread,
        pool,
        stats: isolate
            .stats
            .as_ref()
            .and_then(|s| s.borrow_mut().due(now_ms)),
    };
    // Before the origin is asked, so that nothing it does, and no
    // cancelled request, can skip the work or leave its flags set.
    let mut origin_status = background(&isolate, &ctx, work);
    if let Some(wake_ms) = isolate.write_timer(now_ms) {
        let runtime = OnRequest(ctx.clone());
        ctx.wait_until(timed_write(isolate.clone(), runtime, wake_ms));
    }
    let (response, status) = match responses::render(&outcome, &isolate.config) {
        Response::Answer {
            status,
            content_type,
            body,
            headers,
        } => (respond(status, &content_type, &body, &headers)?, status),
        Response::Forward { headers, after_ms } => {
            if after_ms > 0 {
                // A timer, so the wait spends no CPU; the instant was
                // reserved in Redis, so nothing else can take it meanwhile.
                JsPause.until(JsPause.now_ms() + after_ms, None).await;
            }
            let response = forward(&req, &url, isolate.origin.as_deref()).await?;
            let status = response.status();
            let (response, body_end) = match releases {
                true => watched(response, &headers, &req.signal())?,
                false => (with_headers(response, &headers)?, None),
            };
            if let Some(sender) = origin_status.take() {
                // Read only for a request with work after it.
                let reported = reported_costs(&isolate.config, &response);
                sender.send((status, body_end, reported));
            }
            (response, status)
        }
    };
    if let Some(sender) = origin_status {
        sender.send((status, None, vec![]));
    }
    Ok(response)
}

/// The values of every `cost_header` the rules name, as the origin's
/// `response` holds them (`None`: absent).
fn reported_costs(config: &Config, response: &web_sys::Response) -> Vec<(String, Option<String>)> {
    let mut reported: Vec<(String, Option<String>)> = vec![];
    for name in config.rules.iter().filter_map(|r| r.cost_header.as_ref()) {
        if !reported.iter().any(|(n, _)| n == name) {
            let value = response.headers().get(name).ok().flatten();
            reported.push((name.clone(), value));
        }
    }
    reported
}

/// What a request leaves to do after its decision.
struct Background {
    /// Whether `refund` holds in-flight slots to give back at the body's end.
    releases: bool,
    refund: Option<PendingRefund>,
    refresh: Option<LeaseRefresh>,
    reread: Vec<String>,
    pool: PoolWork,
    /// The isolate's stats write, when one is due.
    stats: Option<Rc<StatsWrite>>,
}

/// Starts the work a request leaves to do in `waitUntil`, never delaying
/// its response: leases running low asked for again and rule-wide
/// overrides read again (after a denial too, so that a cleared block
/// reaches the isolate) at once, beside the origin's fetch; charges the
/// origin's status does not count given back once it is known; then the
/// stats, when due; last, in-flight slots given back once the body has
/// ended. `None` when there is nothing to do; otherwise where
/// the status goes. A request whose origin fetch failed, or that was
/// cancelled, keeps its charges: the origin may have acted on it.
fn background(isolate: &Rc<Isolate>, ctx: &Rc<Context>, work: Background) -> Option<StatusSender> {
    let Background {
        releases,
        refund,
        refresh,
        reread,
        pool,
        stats,
    } = work;
    let idle = refund.is_none() && refresh.is_none() && reread.is_empty() && pool.is_empty();
    if idle && stats.is_none() {
        return None;
    }
    let (sender, status) = status_channel();
    let isolate = isolate.clone();
    let runtime = OnRequest(ctx.clone());
    ctx.wait_until(async move {
        let log = |events| isolate.log(&runtime, events);
        let batched = isolate.batched(&runtime);
        let calls = batched.counted();
        let limiter = isolate.limiter(&calls);
        let config = &isolate.config;
        let now_ms = js_sys::Date::now() as u64;
        if !pool.is_empty() {
            log(limiter.top_up(&pool, now_ms).await);
            isolate.count(|s| s.topped_up(&pool, calls.take(), now_ms));
        }
        if let Some(refresh) = &refresh {
            log(limiter.refresh(refresh, now_ms).await);
            isolate.count(|s| s.refreshed(refresh, calls.take(), now_ms));
        }
        if !reread.is_empty() {
            log(limiter.reread(&reread, now_ms).await);
            isolate.count(|s| s.reread(config, &reread, calls.take(), now_ms));
        }
        let answered = match &refund {
            Some(_) => status.await,
            None => None,
        };
        if let (Some(refund), Some((status, _, reported))) = (&refund, &answered) {
            let now_ms = js_sys::Date::now() as u64;
            log(limiter.refund(refund, (*status, reported), now_ms).await);
            isolate
                .count(|s| s.refunded(config, refund, (*status, reported), calls.take(), now_ms));
        }
        if let (Some(stats), Some(recorder)) = (stats, &isolate.stats) {
            log(write::flush(&isolate.client, config, recorder, stats).await);
        }
        // Last: a streamed body may take long to end, and nothing else
        // waits for it.
        if let Some(refund) = refund.as_ref().filter(|_| releases) {
            // The body's end, its client gone, or no response at all.
            if let Some((_, Some(body_end), _)) = answered {
                let _ = JsFuture::from(body_end).await;
            }
            let now_ms = js_sys::Date::now() as u64;
            log(limiter.release(refund, now_ms).await);
            isolate.count(|s| s.released(config, refund, calls.take(), now_ms));
        }
        // What this work counted came after the request's own timer was
        // planned, which may have woken and written already: without a
        // timer of its own it would wait for the isolate's next request.
        // The request's batches are let go first: the timer may be long.
        drop(batched);
        if let Some(wake_ms) = isolate.write_timer(js_sys::Date::now() as u64) {
            timed_write(isolate.clone(), runtime.clone(), wake_ms).await;
        }
    });
    Some(sender)
}

/// The isolate's own stats write, woken at `wake_ms` in a request's
/// `waitUntil`: what is due then, or, for the last timer set, whatever is
/// left, so that an isolate gone quiet does not hold its counts.
async fn timed_write(isolate: Rc<Isolate>, runtime: OnRequest, wake_ms: u64) {
    JsPause.until(wake_ms, None).await;
    let Some(recorder) = &isolate.stats else {
        return;
    };
    let last = isolate.stats_timer.borrow().woke(wake_ms);
    // The last timer writes all that is left: a write sent again after a
    // failure carries only what it did, and what was counted since goes next.
    for _ in 0..2 {
        let now_ms = js_sys::Date::now() as u64;
        let write = match last {
            true => recorder.borrow_mut().due_early(now_ms),
            false => recorder.borrow_mut().due(now_ms),
        };
        let Some(write) = write else {
            return;
        };
        let events = write::flush(&isolate.client, &isolate.config, recorder, write).await;
        let failed = !events.is_empty();
        isolate.log(&runtime, events);
        if failed || !last {
            return;
        }
    }
}

/// Where the status of a request's response goes, once known. Dropped
/// unsent (the origin fetch failed, the request was cancelled) it says
/// there is none.
struct StatusSender(Rc<RefCell<StatusSlot>>);

/// A status sent with what settles when its body has ended, or their
/// absence, and who waits for them.
#[derive(Default)]
struct StatusSlot {
    sent: Option<Option<Answered>>,
    waiting: Option<Waker>,
}

/// The origin's status, the promise that settles when the response's
/// body has ended (delivered, or its client gone) where it is watched, and
/// the costs its headers reported.
type Answered = (u16, Option<js_sys::Promise>, Vec<(String, Option<String>)>);

impl StatusSender {
    fn send(self, answered: Answered) {
        self.0.borrow_mut().sent = Some(Some(answered));
    }
}

impl Drop for StatusSender {
    fn drop(&mut self) {
        let mut slot = self.0.borrow_mut();
        slot.sent.get_or_insert(None);
        if let Some(waker) = slot.waiting.take() {
            waker.wake();
        }
    }
}

/// A [`StatusSender`] and what it sends, `None` for none.
fn status_channel() -> (StatusSender, impl Future<Output = Option<Answered>>) {
    let slot = Rc::new(RefCell::new(StatusSlot::default()));
    let waiting = slot.clone();
    let status = std::future::poll_fn(move |cx| {
        let mut slot = waiting.borrow_mut();
        match slot.sent.take() {
            Some(sent) => Poll::Ready(sent),
            None => {
                slot.waiting = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    });
    (StatusSender(slot), status)
}

/// One request's script calls, carried with the isolate's others, counted.
type Calls<'a> = Counted<'a, Batched<'a, RestClient, OnRequest>>;

/// One request's ways to Redis: its region's, and the home's where a
/// region other than the home has shared rules.
struct RequestBatches<'a> {
    near: Batched<'a, RestClient, OnRequest>,
    home: Option<Batched<'a, RestClient, OnRequest>>,
}

/// [`RequestBatches`] counted, each on its own.
struct RequestCalls<'a> {
    near: Calls<'a>,
    home: Option<Calls<'a>>,
}

impl RequestBatches<'_> {
    /// Each way counted: what the stats bill the request's rules for.
    fn counted(&self) -> RequestCalls<'_> {
        RequestCalls {
            near: Counted::new(&self.near),
            home: self.home.as_ref().map(Counted::new),
        }
    }
}

impl RequestCalls<'_> {
    /// The calls made since last asked, near and far alike: a top-up's
    /// are the region's and the home's, and each is billed.
    fn take(&self) -> u64 {
        self.near.take() + self.home.as_ref().map_or(0, Counted::take)
    }
}

impl Isolate {
    /// `runtime`'s request's ways to Redis.
    fn batched(&self, runtime: &OnRequest) -> RequestBatches<'_> {
        RequestBatches {
            near: self.calls.for_request(runtime.clone()),
            home: (self.home.as_ref()).map(|h| h.for_request(runtime.clone())),
        }
    }

    /// A limiter on a request's `calls`.
    fn limiter<'a>(&'a self, calls: &'a RequestCalls<'a>) -> Limiter<'a, 'a, Calls<'a>> {
        let limiter = Limiter::new(&self.config, &calls.near, &self.memory, false);
        match &calls.home {
            Some(home) => limiter.away_from(home),
            None => limiter,
        }
    }

    /// Writes the lines the log gate lets through of `events`, and sets a
    /// timer in `runtime` for those it holds back, so that a flood's last
    /// second is written too.
    fn log(self: &Rc<Self>, runtime: &OnRequest, events: Vec<Event>) {
        let now_ms = js_sys::Date::now() as u64;
        let passed = self.log_gate.borrow_mut().pass(events, now_ms);
        write_lines(passed.lines);
        // A timer set for then or later writes these lines too: one timer
        // a second for a client's flood, none ever waiting on another.
        let Some(due_ms) = passed.held_until_ms else {
            return;
        };
        if self.log_flush_at.get() >= due_ms {
            return;
        }
        self.log_flush_at.set(due_ms);
        let isolate = self.clone();
        runtime.spawn(async move {
            JsPause.until(due_ms, None).await;
            // Workerd's clock moves with events: it may still read earlier.
            let now_ms = (js_sys::Date::now() as u64).max(due_ms);
            write_lines(isolate.log_gate.borrow_mut().due(now_ms));
        });
    }

    /// Counts into the isolate's stats, when they are on.
    fn count(&self, f: impl FnOnce(&mut Recorder)) {
        if let Some(stats) = &self.stats {
            f(&mut stats.borrow_mut());
        }
    }

    /// When a timer should wake to write the stats counted so far, unless
    /// one set before wakes for them: `None` too when the stats are off or
    /// hold nothing to write.
    fn write_timer(&self, now_ms: u64) -> Option<u64> {
        let due = self.stats.as_ref()?.borrow().next_due_ms();
        self.stats_timer.borrow_mut().plan(now_ms, due)
    }
}

/// The runtime of one request, for its script calls: its context, whose
/// `waitUntil` carries a batch it opens to the end, and its pauses.
#[derive(Clone)]
struct OnRequest(Rc<Context>);

impl Pause for OnRequest {
    fn now_ms(&self) -> u64 {
        JsPause.now_ms()
    }

    fn signal(&self) -> (Bell, Signal) {
        JsPause.signal()
    }

    fn until(&self, until_ms: u64, signal: Option<&Signal>) -> Paused {
        JsPause.until(until_ms, signal)
    }
}

impl Runtime for OnRequest {
    /// A timer of 0 ms: workerd runs it once the events already waiting
    /// for the isolate are handled.
    fn turn(&self) -> impl Future<Output = ()> + 'static {
        JsPause.until(0, None)
    }

    fn spawn(&self, task: impl Future<Output = ()> + 'static) {
        self.0.wait_until(task);
    }
}

/// A request's pause in workerd: a timer of its own for the deadline, raced
/// against the promise of another request's signal. That promise is made
/// and settled by the request that rings it; this one only follows it,
/// which workerd resumes in this request's own context.
struct JsPause;

#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_name = setTimeout)]
    fn set_timeout(handler: &js_sys::Function, ms: f64) -> JsValue;
}

impl Pause for JsPause {
    fn now_ms(&self) -> u64 {
        js_sys::Date::now() as u64
    }

    fn signal(&self) -> (Bell, Signal) {
        // The executor runs at once, within `Promise::new`.
        let mut settle = None;
        let promise = js_sys::Promise::new(&mut |resolve, _| settle = Some(resolve));
        Signal::new(promise, move || {
            if let Some(settle) = settle {
                drop(settle.call0(&JsValue::UNDEFINED));
            }
        })
    }

    fn until(&self, until_ms: u64, signal: Option<&Signal>) -> Paused {
        let ms = until_ms.saturating_sub(self.now_ms()) as f64;
        let timer = js_sys::Promise::new(&mut |resolve, _| drop(set_timeout(&resolve, ms)));
        let followed = signal.and_then(|s| s.runtime::<js_sys::Promise>());
        let either = match followed {
            Some(rung) => js_sys::Promise::race(&js_sys::Array::of2(rung, &timer)),
            None => timer,
        };
        Box::pin(async move { drop(JsFuture::from(either).await) })
    }
}

fn write_lines(events: Vec<Event>) {
    for event in events {
        console_log!("{}", event.to_line());
    }
}

/// The `fields` of `request.cf`, where the runtime gives them.
fn cf_facts(req: &web_sys::Request, fields: &[CfField]) -> Vec<(CfField, String)> {
    let get = |object: &JsValue, name: &str| {
        js_sys::Reflect::get(object, &JsValue::from_str(name))
            .ok()
            .filter(|v| !v.is_undefined() && !v.is_null())
    };
    let Some(cf) = get(req, "cf") else {
        return vec![];
    };
    fields
        .iter()
        .filter_map(|&field| {
            let value = match field {
                CfField::Ja4 => get(&cf, "botManagement").and_then(|b| get(&b, "ja4")),
                _ => get(&cf, field.name()),
            }?;
            // A number (asn) as JavaScript writes it: Rust's float
            // formatting would cost the wasm 14 KB.
            let text = value.as_string().or_else(|| {
                let n: &js_sys::Number = value.dyn_ref()?;
                n.to_string_with_radix(10).ok().map(String::from)
            })?;
            Some((field, text))
        })
        .collect()
}

/// At most [`MAX_BODY_BYTES`] of the body, read from a copy so the origin
/// still gets it whole (empty when there is none); `None` when it is
/// larger, or reading fails. Reading stops at the limit, so a large body
/// is never buffered.
async fn body_prefix(req: &web_sys::Request) -> Option<Vec<u8>> {
    // A copy costs workerd a copy of every header: none without a body.
    if req.body().is_none() {
        return Some(Vec::new());
    }
    let copy = req.clone().ok()?;
    let stream = copy.body()?;
    let reader: web_sys::ReadableStreamDefaultReader = stream.get_reader().unchecked_into();
    let mut bytes = Vec::new();
    loop {
        let chunk = JsFuture::from(reader.read()).await.ok()?;
        let done = js_sys::Reflect::get(&chunk, &JsValue::from_str("done"))
            .ok()?
            .as_bool()
            .unwrap_or(true);
        if done {
            return Some(bytes);
        }
        let value: js_sys::Uint8Array = js_sys::Reflect::get(&chunk, &JsValue::from_str("value"))
            .ok()?
            .dyn_into()
            .ok()?;
        if bytes.len() + value.length() as usize > MAX_BODY_BYTES {
            let _ = reader.cancel();
            return None;
        }
        bytes.extend(value.to_vec());
    }
}

fn load_config(env: &Env) -> std::result::Result<Config, String> {
    // Through JSON text rather than `object_var`: serde_json's reader is in
    // the wasm anyway, and serde-wasm-bindgen's would cost 5 KB more.
    let missing = || format!("no `[vars.{CONFIG_VAR}]` table in wrangler.toml");
    let var = js_sys::Reflect::get(env.as_ref(), &JsValue::from_str(CONFIG_VAR))
        .ok()
        .filter(|v| v.is_object())
        .ok_or_else(missing)?;
    let text: String = js_sys::JSON::stringify(&var)
        .ok()
        .and_then(|t| t.as_string())
        .ok_or_else(missing)?;
    // JSON.stringify's own text always reads: naming serde_json's error
    // would put its messages in the wasm for nothing.
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|_| missing())?;
    let config = Config::from_json(&value).map_err(|e| e.to_string())?;
    // Read only when asked for: a secret is a binding like any other.
    let secret = match config.needs_secret() {
        true => env.secret(STATS_SECRET).ok().map(|s| s.to_string()),
        false => None,
    };
    config
        .keyed_by(secret.as_deref())
        .map_err(|e| e.to_string())
}

fn origin(env: &Env) -> std::result::Result<Option<String>, String> {
    match env.var("ORIGIN_URL") {
        Ok(v) => parse_origin(&v.to_string())
            .map(Some)
            .map_err(|e| e.to_string()),
        Err(_) => Ok(None),
    }
}

fn respond(
    status: u16,
    content_type: &str,
    body: &str,
    headers: &[(String, String)],
) -> Result<web_sys::Response> {
    let all = web_sys::Headers::new()?;
    all.set("Content-Type", content_type)?;
    add_headers(&all, headers)?;
    let init = web_sys::ResponseInit::new();
    init.set_status(status);
    init.set_headers(&all);
    Ok(web_sys::Response::new_with_opt_str_and_init(
        Some(body),
        &init,
    )?)
}

/// Reads the parts of a request the rules look at; of its headers, those
/// `headers` names alone, one `get` each: walking them all costs workerd
/// about a microsecond a header, whatever number a client sends.
pub fn request_meta(req: &web_sys::Request, url: &Url, headers: &[String]) -> RequestMeta {
    let sent = req.headers();
    RequestMeta::new(
        &req.method(),
        url.host_str().unwrap_or_default(),
        url.path(),
        url.query(),
        headers
            .iter()
            .filter_map(|name| Some((name.clone(), sent.get(name).ok().flatten()?))),
    )
}

/// Sends the request to `origin` (scheme, host and port; path and query
/// kept) or, with none configured, to its own URL: the route's origin.
/// Method, headers, body and redirect mode go along unchanged, so the
/// origin's redirects reach the client as they would without the limiter.
async fn forward(
    req: &web_sys::Request,
    url: &Url,
    origin: Option<&str>,
) -> Result<web_sys::Response> {
    let global: web_sys::WorkerGlobalScope = js_sys::global().unchecked_into();
    let sent = match origin {
        None => global.fetch_with_request(req),
        Some(origin) => {
            let mut target = format!("{origin}{}", url.path());
            if let Some(q) = url.query() {
                target.push('?');
                target.push_str(q);
            }
            let init = web_sys::RequestInit::new();
            init.set_method(&req.method());
            init.set_headers(&req.headers());
            init.set_redirect(req.redirect());
            if let Some(body) = req.body() {
                init.set_body(&body);
            }
            global.fetch_with_str_and_init(&target, &init)
        }
    };
    Ok(JsFuture::from(sent).await?.dyn_into()?)
}

fn add_headers(target: &web_sys::Headers, headers: &[(String, String)]) -> Result<()> {
    for (name, value) in headers {
        target.set(name, value)?;
    }
    Ok(())
}

/// The origin's response with the limiter's headers added, its body
/// passed through a stream whose end is watched: the promise returned
/// settles when the body has been delivered, the origin's body failed, or
/// the client went away (`gone`, the request's signal, which workerd
/// fires with the `enable_request_signal` flag), which also cuts the
/// origin's body short; that is when an in-flight slot is free. A
/// response without a body has nothing to watch.
fn watched(
    response: web_sys::Response,
    headers: &[(String, String)],
    gone: &web_sys::AbortSignal,
) -> Result<(web_sys::Response, Option<js_sys::Promise>)> {
    let Some(body) = response.body().filter(|_| response.status() != 101) else {
        return Ok((with_headers(response, headers)?, None));
    };
    let pass = web_sys::TransformStream::new()?;
    let options = web_sys::StreamPipeOptions::new();
    options.set_signal(gone);
    let body_end = body.pipe_to_with_options(&pass.writable(), &options);
    Ok((
        copied(&response, Some(&pass.readable()), headers)?,
        Some(body_end),
    ))
}

/// The origin's response with the limiter's headers added. A fetched
/// response's headers are immutable, so it is copied first: in one JS call
/// (`new Response(body, response)`), which keeps status, status text and
/// every header, each Set-Cookie line included.
pub fn with_headers(
    response: web_sys::Response,
    headers: &[(String, String)],
) -> Result<web_sys::Response> {
    // A WebSocket upgrade must go back as it is: a copy would lose the socket.
    if headers.is_empty() || response.status() == 101 {
        return Ok(response);
    }
    copied(&response, response.body().as_ref(), headers)
}

/// `response` with `body` and the limiter's `headers` added, in one JS
/// call (`new Response(body, response)`).
fn copied(
    response: &web_sys::Response,
    body: Option<&web_sys::ReadableStream>,
    headers: &[(String, String)],
) -> Result<web_sys::Response> {
    let copy = web_sys::Response::new_with_opt_readable_stream_and_init(
        body,
        response.unchecked_ref::<web_sys::ResponseInit>(),
    )?;
    add_headers(&copy.headers(), headers)?;
    Ok(copy)
}
