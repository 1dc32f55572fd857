//! The wasm32-only edge: turns a `worker::Request` into [`RequestMeta`], lets
//! [`Limiter::handle`] decide, and turns its [`Outcome`] into a response.

use std::{cell::RefCell, rc::Rc};

use worker::{
    console_error, console_log, event, Context, Env, Fetch, Headers, Request, RequestInit,
    Response, Result,
};

use crate::{
    cache::BlockCache,
    config::{parse_origin, Config},
    gateway::{Action, Limiter, Outcome},
    redis_rest::RestClient,
    rules::{normalize_path, RequestMeta},
};

/// The `[vars]` entry holding the rules.
pub const CONFIG_VAR: &str = "LIMITER";

/// What an isolate reads from its environment once: the variables cannot
/// change under a running isolate (a new deploy starts new ones).
struct Setup {
    config: Config,
    origin: Option<String>,
    client: RestClient,
    /// Shared by the isolate's requests: what it learned about denied clients.
    cache: RefCell<BlockCache>,
}

thread_local! {
    static SETUP: RefCell<Option<Rc<Setup>>> = const { RefCell::new(None) };
}

fn setup(env: &Env) -> std::result::Result<Rc<Setup>, String> {
    if let Some(ready) = SETUP.with(|s| s.borrow().clone()) {
        return Ok(ready);
    }
    let (Ok(url), Ok(token)) = (
        env.secret("UPSTASH_REDIS_REST_URL"),
        env.secret("UPSTASH_REDIS_REST_TOKEN"),
    ) else {
        return Err("set UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN (wrangler secret put, or .dev.vars locally)".into());
    };
    let ready = Rc::new(Setup {
        config: load_config(env)?,
        origin: origin(env)?,
        client: RestClient::new(&url.to_string(), &token.to_string()),
        cache: RefCell::new(BlockCache::new()),
    });
    SETUP.with(|s| *s.borrow_mut() = Some(ready.clone()));
    Ok(ready)
}

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
    let setup = match setup(&env) {
        Ok(s) => s,
        Err(message) => {
            console_error!("edge-limiter: {message}");
            return problem(500, "edge-limiter is misconfigured; see the worker's log.");
        }
    };
    let meta = request_meta(&req)?;
    let now_ms = js_sys::Date::now() as u64;
    let limiter = Limiter {
        config: &setup.config,
        store: &setup.client,
        cache: &setup.cache,
    };
    let outcome = limiter.handle(&meta, now_ms).await;
    for line in &outcome.log {
        console_log!("{line}");
    }
    match &outcome.action {
        Action::Respond {
            status,
            content_type,
            body,
        } => {
            let headers = Headers::new();
            headers.set("Content-Type", content_type)?;
            add_headers(&headers, &outcome)?;
            Ok(Response::ok(body.clone())?
                .with_status(*status)
                .with_headers(headers))
        }
        Action::Forward => {
            let response = forward(req, setup.origin.as_deref()).await?;
            with_outcome_headers(response, &outcome)
        }
    }
}

fn load_config(env: &Env) -> std::result::Result<Config, String> {
    let value: serde_json::Value = env
        .object_var(CONFIG_VAR)
        .map_err(|e| format!("no `[vars.{CONFIG_VAR}]` table in wrangler.toml ({e})"))?;
    Config::from_json(&value).map_err(|e| e.to_string())
}

fn origin(env: &Env) -> std::result::Result<Option<String>, String> {
    match env.var("ORIGIN_URL") {
        Ok(v) => parse_origin(&v.to_string())
            .map(Some)
            .map_err(|e| e.to_string()),
        Err(_) => Ok(None),
    }
}

fn problem(status: u16, detail: &str) -> Result<Response> {
    let body = serde_json::json!({ "type": "about:blank", "status": status, "detail": detail })
        .to_string();
    let headers = Headers::new();
    headers.set("Content-Type", "application/problem+json")?;
    Ok(Response::ok(body)?
        .with_status(status)
        .with_headers(headers))
}

/// Reads the parts of a request the rules look at.
pub fn request_meta(req: &Request) -> Result<RequestMeta> {
    let url = req.url()?;
    Ok(RequestMeta {
        method: req.method().to_string().to_ascii_uppercase(),
        host: url.host_str().unwrap_or_default().to_ascii_lowercase(),
        path: normalize_path(url.path()),
        query: url.query().map(str::to_owned),
        headers: req
            .headers()
            .entries()
            .map(|(n, v)| (n.to_ascii_lowercase(), v))
            .collect(),
    })
}

/// Sends the request to `origin` (scheme, host and port; path and query
/// kept) or, with none configured, to its own URL: the route's origin.
async fn forward(req: Request, origin: Option<&str>) -> Result<Response> {
    let Some(origin) = origin else {
        return Fetch::Request(req).send().await;
    };
    let url = req.url()?;
    let mut target = format!("{origin}{}", url.path());
    if let Some(q) = url.query() {
        target.push('?');
        target.push_str(q);
    }
    let mut init = RequestInit::new();
    init.with_method(req.method())
        .with_headers(req.headers().clone());
    if let Some(body) = req.inner().body() {
        init.with_body(Some(body.into()));
    }
    Fetch::Request(Request::new_with_init(&target, &init)?)
        .send()
        .await
}

fn add_headers(headers: &Headers, outcome: &Outcome) -> Result<()> {
    for (name, value) in &outcome.headers {
        headers.set(name, value)?;
    }
    Ok(())
}

/// Copies the origin's response with the limiter's headers added (a fetched
/// response's own headers are immutable).
pub fn with_outcome_headers(response: Response, outcome: &Outcome) -> Result<Response> {
    if outcome.headers.is_empty() {
        return Ok(response);
    }
    // One copy inside JS (`new Headers(old)`): cheaper than a round trip per
    // header through Rust, and every Set-Cookie survives as its own line.
    let headers = response.headers().clone();
    add_headers(&headers, outcome)?;
    Ok(response.with_headers(headers))
}
