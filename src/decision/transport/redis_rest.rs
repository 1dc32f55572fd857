//! A client for the Upstash-style Redis REST protocol (see
//! `shared/upstash-rest-protocol.md`): one HTTP POST per command, JSON in and
//! out. The same code runs in the worker (fetch) and natively (tests).

use std::{future::Future, time::Duration};

use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use serde_json::{json, Value};

/// A script as Redis knows it: its source, and the SHA1 that `EVALSHA` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    /// The full source, shebang included.
    pub source: &'static str,
    /// Lower-case hex SHA1 of `source`, as `SCRIPT LOAD` would answer.
    pub sha1: &'static str,
}

/// Why a REST call gave no result. The token never appears in any message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RestError {
    /// The endpoint refused the token (HTTP 401).
    Auth,
    /// Redis does not know the script's SHA1 (`NOSCRIPT`): send it with `EVAL`.
    NoScript,
    /// Redis answered with an error; its text, verbatim.
    Redis(String),
    /// The endpoint answered with an unexpected HTTP status.
    Status {
        /// The HTTP status code.
        status: u16,
        /// The start of the body, for the log.
        body: String,
    },
    /// The request did not complete: connection refused, reset, DNS...
    Transport(String),
    /// The call took longer than its budget.
    Timeout {
        /// The budget that ran out, milliseconds.
        budget_ms: u64,
    },
    /// The endpoint answered something that is not the protocol's JSON.
    Malformed(String),
    /// The URL or token cannot make a request at all; names the setting.
    Settings(String),
}

impl std::fmt::Display for RestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestError::Auth => write!(
                f,
                "the Redis REST endpoint rejected the token (check UPSTASH_REDIS_REST_TOKEN)"
            ),
            RestError::NoScript => write!(f, "Redis does not have the script loaded (NOSCRIPT)"),
            RestError::Redis(text) => write!(f, "Redis error: {text}"),
            RestError::Status { status, body } => {
                write!(f, "the Redis REST endpoint answered HTTP {status}: {body}")
            }
            RestError::Transport(why) => write!(
                f,
                "could not reach the Redis REST endpoint (check UPSTASH_REDIS_REST_URL): {why}"
            ),
            RestError::Timeout { budget_ms } => write!(
                f,
                "the Redis REST endpoint did not answer within {budget_ms} ms"
            ),
            RestError::Malformed(why) => write!(
                f,
                "the Redis REST endpoint answered outside the protocol: {why}"
            ),
            RestError::Settings(why) => write!(f, "unusable Redis REST settings: {why}"),
        }
    }
}

impl std::error::Error for RestError {}

/// A REST endpoint and its token.
#[derive(Clone)]
pub struct RestClient {
    http: reqwest::Client,
    // Parsed and formatted once: every decision would otherwise parse the
    // URL and build the header again.
    url: reqwest::Url,
    /// `url` with `/pipeline` appended.
    pipeline_url: reqwest::Url,
    authorization: HeaderValue,
    token: String,
}

impl std::fmt::Debug for RestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: keep it out of every debug print.
        f.debug_struct("RestClient")
            .field("url", &self.url.as_str())
            .finish_non_exhaustive()
    }
}

/// How much of an unexpected body goes into an error message.
const BODY_EXCERPT: usize = 200;

/// The body's type. Set by hand with a body written by serde_json: reqwest's
/// `json()` costs the worker's wasm 0.8 KB gzip more for the same bytes.
const JSON: HeaderValue = HeaderValue::from_static("application/json");

impl RestClient {
    /// A client for the endpoint at `url` (e.g. `https://xyz.upstash.io`).
    pub fn new(url: &str, token: &str) -> Result<RestClient, RestError> {
        let url = reqwest::Url::parse(url.trim_end_matches('/'))
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            // The value stays out of the message: a redis:// URL set here by
            // mistake carries the database password.
            .ok_or_else(|| {
                RestError::Settings(
                    "UPSTASH_REDIS_REST_URL is not an http(s) URL; it takes the REST URL \
                     (https://<name>.upstash.io), not the redis:// one"
                        .into(),
                )
            })?;
        let mut authorization =
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                RestError::Settings(
                    "UPSTASH_REDIS_REST_TOKEN holds characters no HTTP header can carry".into(),
                )
            })?;
        authorization.set_sensitive(true);
        let pipeline_url =
            reqwest::Url::parse(&format!("{}/pipeline", url.as_str().trim_end_matches('/')))
                .map_err(|_| {
                    RestError::Settings("UPSTASH_REDIS_REST_URL: no /pipeline beside it".into())
                })?;
        Ok(RestClient {
            http: reqwest::Client::new(),
            pipeline_url,
            url,
            authorization,
            token: token.to_owned(),
        })
    }

    /// The endpoint's URL (never the token), for what a command prints.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// Sends one command (`["GET", "k"]`) and returns its `result`, within
    /// [`COMMAND_BUDGET`] (tools and tests; decisions go through
    /// [`RestClient::run_script`] with the rule's own budget).
    pub async fn command(&self, args: &[&str]) -> Result<Value, RestError> {
        self.post(json!(args), COMMAND_BUDGET).await
    }

    /// Runs `script` by SHA1 and, if Redis does not have it (after a restart
    /// or `SCRIPT FLUSH`), once more by source, which also caches it. The
    /// whole exchange, fallback included, must finish within `budget`.
    pub async fn run_script(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
        budget: Duration,
    ) -> Result<Value, RestError> {
        evalsha_or_eval(script, keys, args, budget, clock_ms, |body, left| {
            self.post(body, left)
        })
        .await
    }

    /// Sends `commands` in one `POST /pipeline`, within `budget`: one
    /// result per command, in order, each its own (a command that fails, a
    /// `WRONGTYPE`, leaves the others' results), and each command free to
    /// name a key of its own slot on a cluster. Not atomic.
    pub async fn pipeline(
        &self,
        commands: &[Vec<String>],
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError> {
        self.post_all(command_values(commands), budget).await
    }

    /// One `POST /`, abandoned after `budget`.
    async fn post(&self, body: Value, budget: Duration) -> Result<Value, RestError> {
        let (status, text) = self.exchange(&self.url, body, budget).await?;
        parse_reply(status, &text).map_err(|e| e.redacted(&self.token))
    }

    /// One `POST /pipeline` of `commands`, abandoned after `budget`.
    async fn post_all(
        &self,
        commands: Vec<Value>,
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError> {
        let count = commands.len();
        let (status, text) = self
            .exchange(&self.pipeline_url, Value::Array(commands), budget)
            .await?;
        parse_pipeline(status, &text, count).map_err(|e| e.redacted(&self.token))
    }

    /// One `POST` to `url`, abandoned after `budget`: the status and body.
    /// The time limit is reqwest's own (on wasm32 a timer on the fetch's
    /// abort signal, which reqwest creates anyway): a separate timer raced
    /// against the request cost every decision a promise and two callbacks
    /// more.
    async fn exchange(
        &self,
        url: &reqwest::Url,
        body: Value,
        budget: Duration,
    ) -> Result<(u16, String), RestError> {
        let started = clock_ms();
        // In workerd the timeout aborts the fetch, which reqwest reports as
        // a failed send: a failure at the budget's end is its timeout.
        let failed = |e: reqwest::Error| {
            let spent_ms = clock_ms() - started;
            if e.is_timeout() || spent_ms + 1.0 >= budget.as_millis() as f64 {
                timed_out(budget)
            } else {
                RestError::Transport(with_causes(&e.without_url()))
            }
        };
        let response = self
            .http
            .post(url.clone())
            .header(AUTHORIZATION, self.authorization.clone())
            .timeout(budget)
            .header(CONTENT_TYPE, JSON)
            .body(body.to_string())
            .send()
            .await
            .map_err(failed)?;
        let status = response.status().as_u16();
        let text = without_stacks(response.text()).await.map_err(failed)?;
        Ok((status, text))
    }
}

/// `body`, each poll run with JavaScript's `Error.stackTraceLimit` at 0.
/// Reading the body ends by dropping the response, and reqwest then aborts
/// the fetch's `AbortController` even though it is done: workerd makes an
/// `AbortError` that nobody sees and captures its stack, 3 % of the
/// worker's CPU under load (`perf` of a bare workerd). An error met while
/// reading keeps its message.
#[cfg(target_arch = "wasm32")]
pub async fn without_stacks<F: Future>(body: F) -> F::Output {
    let mut body = std::pin::pin!(body);
    std::future::poll_fn(|cx| {
        let limit = js_sys::Error::stack_trace_limit();
        js_sys::Error::set_stack_trace_limit(&0.into());
        let polled = body.as_mut().poll(cx);
        js_sys::Error::set_stack_trace_limit(&limit);
        polled
    })
    .await
}

/// `body` as it is: natively nothing captures a stack on drop.
#[cfg(not(target_arch = "wasm32"))]
pub async fn without_stacks<F: Future>(body: F) -> F::Output {
    body.await
}

/// What carries commands to Redis: the REST client, or a fake in tests.
// The worker is single-threaded, so the futures need not be `Send`.
#[allow(async_fn_in_trait)]
pub trait Transport {
    /// Sends one command (`["EVALSHA", ...]`) in one request, within
    /// `budget`: its result.
    async fn send(&self, command: Value, budget: Duration) -> Result<Value, RestError>;

    /// Sends `commands` in one request (`/pipeline`), within `budget`: one
    /// result per command, in order, each its own; or what failed the
    /// whole request.
    async fn send_all(
        &self,
        commands: Vec<Value>,
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError>;
}

impl Transport for RestClient {
    async fn send(&self, command: Value, budget: Duration) -> Result<Value, RestError> {
        self.post(command, budget).await
    }

    async fn send_all(
        &self,
        commands: Vec<Value>,
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError> {
        self.post_all(commands, budget).await
    }
}

/// Runs `script` by SHA1 through `send` (a command and the time left for
/// it) and, if Redis does not have it (after a restart or `SCRIPT FLUSH`),
/// once more by source, which also caches it; `now_ms` tells the time
/// spent. The whole exchange, fallback included, must finish within
/// `budget`, and a timeout names `budget`, not what was left of it.
pub async fn evalsha_or_eval<F: Future<Output = Result<Value, RestError>>>(
    script: &Script,
    keys: &[String],
    args: &[String],
    budget: Duration,
    now_ms: impl Fn() -> f64,
    send: impl Fn(Value, Duration) -> F,
) -> Result<Value, RestError> {
    let started = now_ms();
    let first = send(eval_body("EVALSHA", script.sha1, keys, args), budget).await;
    let reply = match first {
        Err(RestError::NoScript) => {
            let spent = Duration::from_millis((now_ms() - started).max(0.0) as u64);
            let left = budget.saturating_sub(spent);
            if left.is_zero() {
                return Err(timed_out(budget));
            }
            send(eval_body("EVAL", script.source, keys, args), left).await
        }
        other => other,
    };
    match reply {
        Err(RestError::Timeout { .. }) => Err(timed_out(budget)),
        other => other,
    }
}

/// Plain commands as the values a pipeline carries.
pub fn command_values(commands: &[Vec<String>]) -> Vec<Value> {
    // Built by hand as eval_body is: serde's generic path into a Value
    // would cost the wasm more than these lines.
    commands
        .iter()
        .map(|c| Value::Array(c.iter().map(|a| Value::from(a.as_str())).collect()))
        .collect()
}

impl RestError {
    /// The error with `secret` blanked out of every text it carries, each
    /// text then cut to 200 characters (`BODY_EXCERPT`): an endpoint or proxy
    /// that echoes the request (Authorization header included) in its error
    /// must not get the token, or unbounded text, into the log.
    pub fn redacted(self, secret: &str) -> RestError {
        let clean = |text: String| {
            let text = if secret.is_empty() {
                text
            } else {
                text.replace(secret, "<redacted>")
            };
            text.chars().take(BODY_EXCERPT).collect::<String>()
        };
        match self {
            RestError::Redis(t) => RestError::Redis(clean(t)),
            RestError::Status { status, body } => RestError::Status {
                status,
                body: clean(body),
            },
            RestError::Transport(t) => RestError::Transport(clean(t)),
            RestError::Malformed(t) => RestError::Malformed(clean(t)),
            other => other,
        }
    }
}

/// `error` and what caused it, outermost first: reqwest's own text ("error
/// sending request") does not say whether DNS, the connection or the
/// certificate failed, which is what the user has to fix.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let more = c.to_string();
        // Layers often repeat the text of the one they wrap.
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// Time allowed for a plain [`RestClient::command`].
pub const COMMAND_BUDGET: Duration = Duration::from_secs(5);

/// The error of a call whose `budget` ran out.
pub fn timed_out(budget: Duration) -> RestError {
    RestError::Timeout {
        budget_ms: budget.as_millis() as u64,
    }
}

/// Milliseconds on a clock that moves forward while a call is waited for
/// (in a worker, `Date.now()` advances across I/O).
#[cfg(target_arch = "wasm32")]
fn clock_ms() -> f64 {
    js_sys::Date::now()
}

#[cfg(not(target_arch = "wasm32"))]
fn clock_ms() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
        * 1000.0
}

/// The command running `script` (a SHA1 for `EVALSHA`, the source for
/// `EVAL`) on these keys and arguments.
fn eval_body(verb: &str, script: &str, keys: &[String], args: &[String]) -> Value {
    let mut body = Vec::with_capacity(3 + keys.len() + args.len());
    body.push(Value::from(verb));
    body.push(Value::from(script));
    body.push(Value::from(keys.len()));
    body.extend(keys.iter().chain(args).map(|s| Value::from(s.as_str())));
    Value::Array(body)
}

/// Reads one reply of `POST /`: `{"result": X}` or `{"error": "..."}`.
pub fn parse_reply(status: u16, body: &str) -> Result<Value, RestError> {
    if status == 401 {
        return Err(RestError::Auth);
    }
    let excerpt = || body.chars().take(BODY_EXCERPT).collect::<String>();
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let object = parsed.as_ref().and_then(Value::as_object);
    match object {
        Some(o) if o.contains_key("error") => Err(redis_error(status, &o["error"])),
        Some(o) if (200..300).contains(&status) && o.contains_key("result") => {
            Ok(o["result"].clone())
        }
        _ if !(200..300).contains(&status) => Err(RestError::Status {
            status,
            body: excerpt(),
        }),
        _ => Err(RestError::Malformed(format!(
            "expected {{\"result\": ...}}, got `{}`",
            excerpt()
        ))),
    }
}

/// The error an `{"error": ...}` answer with `status` stands for.
fn redis_error(status: u16, error: &Value) -> RestError {
    let text = match error {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.starts_with("NOSCRIPT") {
        RestError::NoScript
    } else if status >= 500 {
        RestError::Status { status, body: text }
    } else {
        RestError::Redis(text)
    }
}

/// Reads the reply of `POST /pipeline` to `count` commands: 200 and one
/// `{"result": X}` or `{"error": "..."}` per command, in order; anything
/// else fails the whole, as [`parse_reply`] reads it.
pub fn parse_pipeline(
    status: u16,
    body: &str,
    count: usize,
) -> Result<Vec<Result<Value, RestError>>, RestError> {
    let entries = match serde_json::from_str::<Value>(body) {
        Ok(Value::Array(entries)) if (200..300).contains(&status) => entries,
        _ => return parse_reply(status, body).and_then(|v| Err(malformed_pipeline(&v))),
    };
    if entries.len() != count {
        return Err(RestError::Malformed(format!(
            "a pipeline of {count} commands answered with {} results",
            entries.len()
        )));
    }
    entries
        .into_iter()
        .map(|entry| match entry.as_object() {
            Some(o) if o.contains_key("error") => Ok(Err(redis_error(status, &o["error"]))),
            Some(o) if o.contains_key("result") => Ok(Ok(o["result"].clone())),
            _ => Err(malformed_pipeline(&entry)),
        })
        .collect()
}

fn malformed_pipeline(answer: &Value) -> RestError {
    let excerpt: String = answer.to_string().chars().take(BODY_EXCERPT).collect();
    RestError::Malformed(format!(
        "expected a pipeline's [{{\"result\": ...}}, ...], got `{excerpt}`"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipeline_answers_each_command_on_its_own() {
        let wrong = "WRONGTYPE Operation against a key holding the wrong kind of value";
        let body = format!(r#"[{{"result":"v1 block"}},{{"error":"{wrong}"}},{{"result":-1}}]"#);
        assert_eq!(
            parse_pipeline(200, &body, 3),
            Ok(vec![
                Ok(json!("v1 block")),
                Err(RestError::Redis(wrong.into())),
                Ok(json!(-1))
            ])
        );
        assert!(matches!(
            parse_pipeline(200, &body, 2),
            Err(RestError::Malformed(_))
        ));
        assert_eq!(
            parse_pipeline(401, r#"{"error":"WRONGPASS"}"#, 1),
            Err(RestError::Auth)
        );
        assert!(matches!(
            parse_pipeline(502, "<html>bad gateway</html>", 1),
            Err(RestError::Status { status: 502, .. })
        ));
        for odd in [r#"{"result":"OK"}"#, r#"[1]"#, "not json"] {
            assert!(
                matches!(parse_pipeline(200, odd, 1), Err(RestError::Malformed(_))),
                "{odd}"
            );
        }
    }

    #[test]
    fn the_pipeline_is_beside_the_endpoints_root() {
        for (url, pipeline) in [
            ("https://xyz.upstash.io", "https://xyz.upstash.io/pipeline"),
            ("http://127.0.0.1:8079/", "http://127.0.0.1:8079/pipeline"),
            (
                "https://proxy.example/redis/",
                "https://proxy.example/redis/pipeline",
            ),
        ] {
            let c = RestClient::new(url, "t").unwrap();
            assert_eq!(c.pipeline_url.as_str(), pipeline);
        }
    }

    #[test]
    fn replies_map_to_results_and_typed_errors() {
        assert_eq!(parse_reply(200, r#"{"result":"OK"}"#), Ok(json!("OK")));
        assert_eq!(parse_reply(200, r#"{"result":null}"#), Ok(Value::Null));
        assert_eq!(
            parse_reply(
                401,
                r#"{"error":"WRONGPASS invalid or missing auth token"}"#
            ),
            Err(RestError::Auth)
        );
        assert_eq!(
            parse_reply(
                400,
                r#"{"error":"NOSCRIPT No matching script. Please use EVAL."}"#
            ),
            Err(RestError::NoScript)
        );
        assert_eq!(
            parse_reply(
                400,
                r#"{"error":"WRONGTYPE Operation against a key holding the wrong kind of value"}"#
            ),
            Err(RestError::Redis(
                "WRONGTYPE Operation against a key holding the wrong kind of value".into()
            ))
        );
        assert!(matches!(
            parse_reply(503, r#"{"error":"ERR redis unreachable"}"#),
            Err(RestError::Status { status: 503, .. })
        ));
        assert!(matches!(
            parse_reply(502, "<html>bad gateway</html>"),
            Err(RestError::Status { status: 502, .. })
        ));
        assert!(matches!(
            parse_reply(200, "not json"),
            Err(RestError::Malformed(_))
        ));
        assert!(matches!(
            parse_reply(200, r#"{"result":[1,2"#),
            Err(RestError::Malformed(_))
        ));
        assert!(matches!(
            parse_reply(200, r#"[1,2]"#),
            Err(RestError::Malformed(_))
        ));
    }

    #[test]
    fn eval_bodies_put_keys_before_arguments() {
        let body = eval_body("EVALSHA", "abc", &["k1".into(), "k2".into()], &["a".into()]);
        assert_eq!(body, json!(["EVALSHA", "abc", 2, "k1", "k2", "a"]));
    }

    #[test]
    fn echoed_tokens_are_blanked_and_texts_cut() {
        let echoed = format!(
            r#"{{"error":"bad request: Authorization: Bearer tok-123 {}"}}"#,
            "x".repeat(500)
        );
        let e = parse_reply(400, &echoed).unwrap_err().redacted("tok-123");
        let shown = e.to_string();
        assert!(
            !shown.contains("tok-123") && shown.contains("Bearer <redacted>"),
            "{shown}"
        );
        assert!(shown.len() < 300, "{}", shown.len());
        let e = parse_reply(502, "<p>tok-123</p>")
            .unwrap_err()
            .redacted("tok-123");
        assert!(!e.to_string().contains("tok-123"));
    }

    #[test]
    fn unusable_settings_name_the_variable() {
        for url in [
            "",
            "xyz.upstash.io",
            "rediss://default:pw-123@xyz.upstash.io:6379",
        ] {
            let e = RestClient::new(url, "t").unwrap_err().to_string();
            assert!(e.contains("UPSTASH_REDIS_REST_URL"), "{url}: {e}");
            assert!(!e.contains("pw-123"), "{e}");
        }
        let e = RestClient::new("https://xyz.upstash.io", "bad\ntoken").unwrap_err();
        assert!(!e.to_string().contains("bad"), "{e}");
        assert!(e.to_string().contains("UPSTASH_REDIS_REST_TOKEN"), "{e}");
    }

    #[test]
    fn debug_output_hides_the_token() {
        let c = RestClient::new("http://127.0.0.1:1/", "s3cret-token").unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("http://127.0.0.1:1"), "{shown}");
    }

    /// An error wrapping another, for the chain of causes.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn a_transport_error_names_its_causes_once_each() {
        let tls = Layer("certificate verify failed (self-signed certificate)", None);
        let repeated = Layer("certificate verify failed", Some(Box::new(tls)));
        let connect = Layer("client error (Connect)", Some(Box::new(repeated)));
        let top = Layer("error sending request", Some(Box::new(connect)));
        assert_eq!(
            with_causes(&top),
            "error sending request: client error (Connect): certificate verify failed: \
             certificate verify failed (self-signed certificate)"
        );
        assert_eq!(with_causes(&Layer("alone", None)), "alone");
    }
}
