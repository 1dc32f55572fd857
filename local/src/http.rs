//! HTTP routing, auth, body limits and status codes, the way hosted Upstash answers.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value as Json};

use crate::exec::{Executor, TxOutcome, Unavailable};
use crate::json::{self, Command};
use crate::resp::Value;

/// Not part of Upstash's API: `GET` it (with the token) for
/// `{"requests": N, "commands": M, "carrying": {"1": A, "2": B, ...}}`: the
/// requests answered so far (itself excluded), the commands they carried,
/// and how many requests carried each number of commands (`POST /` and a
/// path-style command one each, a pipeline or transaction as many as it
/// holds; a request refused before its commands were read carries none),
/// so that a benchmark can count a client's round trips and how it groups
/// its commands.
pub const STATS_PATH: &str = "/__stats";

/// Everything a request needs, shared by all connections.
pub struct App {
    token: String,
    max_body_bytes: usize,
    executor: Executor,
    sync_token: AtomicU64,
    requests: AtomicU64,
    /// Requests by the number of commands they carried.
    carrying: Mutex<BTreeMap<usize, u64>>,
}

impl App {
    /// State for a server in front of `redis`.
    pub fn new(redis: String, token: String, max_body_bytes: usize) -> App {
        App {
            token,
            max_body_bytes,
            executor: Executor::new(redis),
            sync_token: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            carrying: Mutex::new(BTreeMap::new()),
        }
    }

    /// Answers one request; failures become JSON error responses.
    pub async fn handle(
        &self,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        if req.uri().path() != STATS_PATH {
            self.requests.fetch_add(1, Ordering::Relaxed);
        }
        let mut response = self.route(req).await.unwrap_or_else(|e| e);
        // Any increasing value will do: clients only echo it back.
        let sync = self.sync_token.fetch_add(1, Ordering::Relaxed) + 1;
        response
            .headers_mut()
            .insert("upstash-sync-token", HeaderValue::from(sync));
        Ok(response)
    }

    async fn route(
        &self,
        req: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, Response<Full<Bytes>>> {
        let query = query_pairs(req.uri().query().unwrap_or(""));
        if !self.authorized(&req, &query) {
            return Err(error(
                StatusCode::UNAUTHORIZED,
                "WRONGPASS invalid or missing auth token",
            ));
        }
        let base64 = req
            .headers()
            .get("upstash-encoding")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"base64"));
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        match (path.as_str(), &method) {
            ("/", &Method::POST) => {
                let command =
                    json::parse_command_body(&self.body(req).await?).map_err(bad_request)?;
                self.carried(1);
                self.single(command, base64).await
            }
            ("/pipeline", &Method::POST) => {
                let commands =
                    json::parse_batch_body(&self.body(req).await?).map_err(bad_request)?;
                self.carried(commands.len());
                let replies = self
                    .executor
                    .pipeline(commands)
                    .await
                    .map_err(unavailable)?;
                Ok(entries(replies, base64))
            }
            ("/multi-exec", &Method::POST) => {
                let commands =
                    json::parse_batch_body(&self.body(req).await?).map_err(bad_request)?;
                self.carried(commands.len());
                match self
                    .executor
                    .transaction(commands)
                    .await
                    .map_err(unavailable)?
                {
                    TxOutcome::Committed(replies) => Ok(entries(replies, base64)),
                    TxOutcome::Discarded(why) => Err(bad_request(why)),
                }
            }
            ("/" | "/pipeline" | "/multi-exec", _) => Err(method_not_allowed()),
            (STATS_PATH, &Method::GET) => Ok(ok(self.stats())),
            (_, &Method::GET | &Method::POST) => {
                let mut command: Command = path
                    .strip_prefix('/')
                    .unwrap_or(&path)
                    .split('/')
                    .map(percent_decode)
                    .collect();
                if method == Method::POST {
                    let body = self.body(req).await?;
                    if !body.is_empty() {
                        command.push(body.to_vec());
                    }
                }
                for (key, value) in query.into_iter().filter(|(k, _)| k != b"_token") {
                    command.push(key);
                    command.push(value);
                }
                self.carried(1);
                self.single(command, base64).await
            }
            _ => Err(method_not_allowed()),
        }
    }

    /// Counts a request that carried `commands` commands.
    fn carried(&self, commands: usize) {
        let mut carrying = self.carrying.lock().unwrap_or_else(|e| e.into_inner());
        *carrying.entry(commands).or_default() += 1;
    }

    /// What [`STATS_PATH`] answers.
    fn stats(&self) -> Json {
        let carrying = self.carrying.lock().unwrap_or_else(|e| e.into_inner());
        let commands: u64 = carrying.iter().map(|(n, count)| *n as u64 * count).sum();
        let by_size: serde_json::Map<String, Json> = carrying
            .iter()
            .map(|(n, count)| (n.to_string(), json!(count)))
            .collect();
        json!({
            "requests": self.requests.load(Ordering::Relaxed),
            "commands": commands,
            "carrying": by_size,
        })
    }

    async fn single(
        &self,
        command: Command,
        base64: bool,
    ) -> Result<Response<Full<Bytes>>, Response<Full<Bytes>>> {
        let mut replies = self
            .executor
            .pipeline(vec![command])
            .await
            .map_err(unavailable)?;
        match replies.pop().expect("one reply per command") {
            Value::Error(text) => Err(error(StatusCode::BAD_REQUEST, &text)),
            reply => Ok(ok(json!({ "result": json::result(reply, base64) }))),
        }
    }

    fn authorized(&self, req: &Request<Incoming>, query: &[(Vec<u8>, Vec<u8>)]) -> bool {
        let token = self.token.as_bytes();
        let bearer = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .is_some_and(|t| t == token);
        bearer || query.iter().any(|(k, v)| k == b"_token" && v == token)
    }

    async fn body(&self, req: Request<Incoming>) -> Result<Bytes, Response<Full<Bytes>>> {
        let too_large = || {
            error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("ERR request body exceeds {} bytes", self.max_body_bytes),
            )
        };
        // An oversized body is still read, up to a bound, before the 413
        // goes out: answering while the client is still writing closes the
        // connection under it, and most clients then report a broken pipe
        // instead of the reply. Beyond the bound, answering at once is cheaper.
        let drain = self.max_body_bytes.saturating_mul(DRAIN_FACTOR);
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > drain as u64) {
            return Err(too_large());
        }
        let mut body = req.into_body();
        let mut kept = Vec::new();
        let mut seen = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| bad_request(format!("ERR could not read the request body: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            seen = seen.saturating_add(data.len());
            if seen > drain {
                return Err(too_large());
            }
            if seen <= self.max_body_bytes {
                kept.extend_from_slice(&data);
            }
        }
        if seen > self.max_body_bytes {
            return Err(too_large());
        }
        Ok(Bytes::from(kept))
    }
}

/// How many times the body limit an oversized body may be read (and
/// dropped) before the 413 goes out.
const DRAIN_FACTOR: usize = 8;

fn ok(body: Json) -> Response<Full<Bytes>> {
    respond(StatusCode::OK, &body)
}

/// The reply to `/pipeline` and `/multi-exec`: one entry per command, always 200.
fn entries(replies: Vec<Value>, base64: bool) -> Response<Full<Bytes>> {
    let entries = replies.into_iter().map(|r| json::entry(r, base64));
    ok(Json::Array(entries.collect()))
}

fn error(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    respond(status, &json!({ "error": text }))
}

fn bad_request(text: String) -> Response<Full<Bytes>> {
    error(StatusCode::BAD_REQUEST, &text)
}

fn method_not_allowed() -> Response<Full<Bytes>> {
    error(StatusCode::METHOD_NOT_ALLOWED, "ERR method not allowed")
}

fn unavailable(e: Unavailable) -> Response<Full<Bytes>> {
    error(StatusCode::SERVICE_UNAVAILABLE, &e.0)
}

fn respond(status: StatusCode, body: &Json) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `application/x-www-form-urlencoded` pairs, decoded to bytes.
fn query_pairs(query: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let form = |s: &str| percent_decode(&s.replace('+', " "));
            (form(k), form(v))
        })
        .collect()
}

/// Decodes `%XX` escapes; a malformed escape stays as it is.
fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_paths_and_queries() {
        assert_eq!(
            percent_decode("a%20b%zz%+1%F0%9F%98%80"),
            "a b%zz%+1😀".as_bytes()
        );
        assert_eq!(
            query_pairs("EX=10&_token=t%2B+x&flag"),
            vec![
                (b"EX".to_vec(), b"10".to_vec()),
                (b"_token".to_vec(), b"t+ x".to_vec()),
                (b"flag".to_vec(), b"".to_vec()),
            ]
        );
    }
}
