//! What decides the simulated requests: the real Lua script in a private
//! `redis-server` with the clock pinned to each request's time, or the
//! plain-Rust reference model.

use std::{
    collections::VecDeque,
    io::{BufReader, Write},
    os::unix::net::UnixStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{model::Model, resp};
use crate::decision::{
    memory::rule_wide::RuleWide,
    outcomes::verdict::Decision,
    transport::keys::{override_key, redis_key},
    transport::protocol::{Check, RefundCharge, Reply, ScriptCall, LIMITER},
};

/// One request's decision to make: its rules' checks, at its log time.
pub struct Job<'a> {
    /// Every rule the request falls under, with the client's identifier.
    pub checks: Vec<(Check<'a>, Vec<&'a str>)>,
    /// The pinned clock, epoch milliseconds.
    pub now_ms: u64,
}

/// An override to replay a log under (`simulate --overrides`): a rule's,
/// for one client (by its identifier's parts) or for every client, as
/// the text Redis would hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// The rule's name.
    pub rule: String,
    /// The client's identifier parts; `None` for every client.
    pub client: Option<Vec<String>>,
    /// The override's text (`rules::overrides::Override::to_text`).
    pub text: String,
}

/// Charges to give back, each with the refund mark its decision replied.
pub type Refunds<'a> = [RefundCharge<'a>];

/// Why the engine could not decide.
#[derive(Debug)]
#[non_exhaustive]
pub enum EngineError {
    /// `redis-server` could not be started or reached.
    Start(String),
    /// The connection to it failed midway.
    Io(std::io::Error),
    /// Redis answered a call with an error, or something the reply reader refused.
    Reply(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Start(why) => write!(
                f,
                "cannot start a private redis-server: {why} (install redis-server, set \
                 REDIS_SERVER_BIN, or use --engine model)"
            ),
            EngineError::Io(e) => write!(f, "the private redis-server connection failed: {e}"),
            EngineError::Reply(why) => write!(f, "the limiter script's reply: {why}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<std::io::Error> for EngineError {
    fn from(e: std::io::Error) -> EngineError {
        EngineError::Io(e)
    }
}

/// Something that decides requests in order, each on its own pinned clock.
/// Batches are sent and received separately, so that the engine can work
/// on one while the caller prepares the next.
pub trait Engine {
    /// Sends `jobs` to be decided in the order given (equal times too),
    /// after every batch sent before.
    fn send(&mut self, jobs: &[Job<'_>]) -> Result<(), EngineError>;

    /// The decisions of the oldest batch sent and not yet received, one per job.
    fn receive(&mut self) -> Result<Vec<Decision>, EngineError>;

    /// Puts `overrides` in force before the first request is sent.
    fn set_overrides(&mut self, overrides: &[Planned]) -> Result<(), EngineError>;

    /// Decides `jobs` and waits for the decisions.
    fn decide(&mut self, jobs: &[Job<'_>]) -> Result<Vec<Decision>, EngineError> {
        self.send(jobs)?;
        self.receive()
    }

    /// Gives back `refunds` at `now_ms`, with no batch in flight; whether
    /// anything was given back, per charge.
    fn refund(&mut self, refunds: &Refunds<'_>, now_ms: u64) -> Result<Vec<bool>, EngineError>;

    /// The engine's name for the report.
    fn name(&self) -> &'static str;
}

/// The reference model ([`Model`]): no Redis at all.
#[derive(Default)]
pub struct ModelEngine {
    model: Model,
    decided: VecDeque<Vec<Decision>>,
}

impl ModelEngine {
    /// An empty model.
    pub fn new() -> ModelEngine {
        ModelEngine::default()
    }
}

impl Engine for ModelEngine {
    fn send(&mut self, jobs: &[Job<'_>]) -> Result<(), EngineError> {
        let decisions = jobs
            .iter()
            .map(|job| self.model.decide(&job.checks, job.now_ms))
            .collect();
        self.decided.push_back(decisions);
        Ok(())
    }

    fn refund(&mut self, refunds: &Refunds<'_>, now_ms: u64) -> Result<Vec<bool>, EngineError> {
        Ok(self.model.refund(refunds, now_ms))
    }

    fn set_overrides(&mut self, overrides: &[Planned]) -> Result<(), EngineError> {
        for o in overrides {
            match &o.client {
                Some(id) => {
                    let id: Vec<&str> = id.iter().map(String::as_str).collect();
                    self.model.set_override(&o.rule, &id, Some(&o.text));
                }
                None => self.model.set_rule_wide(&o.rule, Some(&o.text)),
            }
        }
        Ok(())
    }

    fn receive(&mut self) -> Result<Vec<Decision>, EngineError> {
        self.decided.pop_front().ok_or_else(nothing_sent)
    }

    fn name(&self) -> &'static str {
        "model"
    }
}

/// A `redis-server` of our own on a unix socket in a fresh directory,
/// without persistence; killed, and its directory removed, when dropped
/// (on an error or a panic too).
pub struct PrivateRedis {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

/// How long redis-server may take to answer its first PING.
const STARTUP: Duration = Duration::from_secs(10);

impl PrivateRedis {
    /// Starts `$REDIS_SERVER_BIN` or `redis-server` from `PATH`.
    pub fn start() -> Result<PrivateRedis, EngineError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "edge-limiter-simulate-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| EngineError::Start(format!("{}: {e}", dir.display())))?;
        let socket = dir.join("redis.sock");
        let bin = std::env::var_os("REDIS_SERVER_BIN").unwrap_or_else(|| "redis-server".into());
        // A unix socket: no TCP port to find free or to collide on.
        let spawned = Command::new(&bin)
            .args(["--port", "0", "--unixsocket"])
            .arg(&socket)
            .args([
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--daemonize", "no", "--loglevel", "warning", "--dir"])
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(EngineError::Start(format!(
                    "{}: {e}",
                    bin.to_string_lossy()
                )));
            }
        };
        let mut redis = PrivateRedis { child, dir, socket };
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Ok(Some(status)) = redis.child.try_wait() {
                return Err(EngineError::Start(format!("it exited at once ({status})")));
            }
            if let Ok(mut conn) = redis.connect() {
                if matches!(resp::call(&mut conn, &[b"PING"]), Ok(Ok(Value::String(p))) if p == "PONG")
                {
                    return Ok(redis);
                }
            }
            if Instant::now() > deadline {
                return Err(EngineError::Start(format!(
                    "no answer on {} within {} s",
                    redis.socket.display(),
                    STARTUP.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A new connection to it.
    pub fn connect(&self) -> std::io::Result<BufReader<UnixStream>> {
        let stream = UnixStream::connect(&self.socket)?;
        Ok(BufReader::with_capacity(256 * 1024, stream))
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The limiter script as stock Redis 7 accepts it: hosted Upstash takes the
/// `allow-key-locking` flag, a stock redis-server refuses it, and the script
/// touches only its `KEYS` either way.
pub fn stock_redis_source() -> String {
    let body = LIMITER
        .source
        .split_once('\n')
        .map_or(LIMITER.source, |(_, rest)| rest);
    format!("#!lua\n{body}")
}

fn nothing_sent() -> EngineError {
    EngineError::Reply("decisions received for a batch never sent".into())
}

/// The real script on a private redis-server, calls pipelined in order.
pub struct RedisEngine {
    conn: BufReader<UnixStream>,
    sha1: String,
    out: Vec<u8>,
    line: Vec<u8>,
    /// The calls of each batch sent, whose replies are still to be read.
    sent: VecDeque<Vec<ScriptCall>>,
    /// Each rule's override for every client, passed with its decisions.
    rule_wide: RuleWide,
    // Last, so the connection closes before the server is killed.
    _redis: PrivateRedis,
}

/// A private redis-server with the limiter script loaded: the server, a
/// connection to it, and the script's SHA1.
pub fn loaded() -> Result<(PrivateRedis, BufReader<UnixStream>, String), EngineError> {
    let redis = PrivateRedis::start()?;
    let mut conn = redis.connect()?;
    let source = stock_redis_source();
    match resp::call(&mut conn, &[b"SCRIPT", b"LOAD", source.as_bytes()])? {
        Ok(Value::String(sha1)) => Ok((redis, conn, sha1)),
        other => Err(EngineError::Reply(format!(
            "SCRIPT LOAD answered {other:?}"
        ))),
    }
}

impl RedisEngine {
    /// Starts the server and loads the script.
    pub fn start() -> Result<RedisEngine, EngineError> {
        let (redis, conn, sha1) = loaded()?;
        Ok(RedisEngine {
            conn,
            sha1,
            out: Vec::with_capacity(1 << 20),
            line: Vec::new(),
            sent: VecDeque::new(),
            rule_wide: RuleWide::new(),
            _redis: redis,
        })
    }
}

impl RedisEngine {
    /// Appends `call` as an `EVALSHA` command to the output buffer.
    fn encode(&mut self, call: &ScriptCall) {
        encode_evalsha(&self.sha1, &call.keys(), &call.args(), &mut self.out);
    }
}

/// Appends `EVALSHA sha1` of `keys` and `args` to `out`.
pub fn encode_evalsha(sha1: &str, keys: &[String], args: &[String], out: &mut Vec<u8>) {
    let numkeys = keys.len().to_string();
    let head = [b"EVALSHA".as_slice(), sha1.as_bytes(), numkeys.as_bytes()];
    let all: Vec<&[u8]> = head
        .into_iter()
        .chain(keys.iter().chain(args).map(String::as_bytes))
        .collect();
    resp::encode(all.into_iter(), out);
}

/// Writes `rule`'s override `text` for the client `id` into the private
/// Redis behind `conn`.
pub fn write_client_override(
    conn: &mut BufReader<UnixStream>,
    rule: &str,
    id: &[String],
    text: &str,
) -> Result<(), EngineError> {
    let id: Vec<&str> = id.iter().map(String::as_str).collect();
    let key = override_key(&redis_key(rule, &id));
    resp::call(conn, &[b"SET".as_slice(), key.as_bytes(), text.as_bytes()])?
        .map_err(|e| EngineError::Reply(format!("SET {key}: {e}")))
        .map(drop)
}

impl Engine for RedisEngine {
    fn send(&mut self, jobs: &[Job<'_>]) -> Result<(), EngineError> {
        // EVALSHA calls on one connection run in the order sent, so a whole
        // batch goes out at once and its replies come back in that order.
        self.out.clear();
        let calls: Vec<ScriptCall> = jobs
            .iter()
            .map(|job| {
                ScriptCall::decide(&job.checks, Some(job.now_ms)).with_rule_wide(|i| {
                    let rule = &job.checks.get(i)?.0.rule.name;
                    self.rule_wide.in_force(rule, job.now_ms)
                })
            })
            .collect();
        for call in &calls {
            self.encode(call);
        }
        self.conn.get_mut().write_all(&self.out)?;
        self.sent.push_back(calls);
        Ok(())
    }

    fn refund(&mut self, refunds: &Refunds<'_>, now_ms: u64) -> Result<Vec<bool>, EngineError> {
        if !self.sent.is_empty() {
            return Err(EngineError::Reply(
                "a refund while a batch is in flight".into(),
            ));
        }
        let call = ScriptCall::refund(refunds, Some(now_ms));
        self.out.clear();
        self.encode(&call);
        self.conn.get_mut().write_all(&self.out)?;
        let reply = resp::read_reply(&mut self.conn, &mut self.line)?
            .map_err(|e| EngineError::Reply(format!("Redis error: {e}")))?;
        match call.decode(&reply) {
            Ok(Reply::Refunded(given)) => Ok(given),
            Ok(other) => Err(EngineError::Reply(format!("{other:?} to a refund"))),
            Err(e) => Err(EngineError::Reply(e.to_string())),
        }
    }

    fn set_overrides(&mut self, overrides: &[Planned]) -> Result<(), EngineError> {
        for o in overrides {
            match &o.client {
                Some(id) => write_client_override(&mut self.conn, &o.rule, id, &o.text)?,
                None => self.rule_wide.hold(&o.rule, &o.text),
            }
        }
        Ok(())
    }

    fn receive(&mut self) -> Result<Vec<Decision>, EngineError> {
        let calls = self.sent.pop_front().ok_or_else(nothing_sent)?;
        let mut decisions = Vec::with_capacity(calls.len());
        let mut failure = None;
        for call in &calls {
            // Every reply is read, even after a failure, to keep the stream in step.
            let reply = resp::read_reply(&mut self.conn, &mut self.line)?;
            let decision = reply
                .map_err(|e| format!("Redis error: {e}"))
                .and_then(|value| {
                    call.decode(&value)
                        .and_then(Reply::decision)
                        .map_err(|e| e.to_string())
                });
            match decision {
                Ok(d) => decisions.push(d),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        match failure {
            Some(why) => Err(EngineError::Reply(why)),
            None => Ok(decisions),
        }
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}
