//! Sends parsed commands to Redis: a pipeline (also used for single commands) or a
//! MULTI/EXEC transaction, each on one pooled connection of its own.

use std::io;

use crate::json::Command;
use crate::pool::Pool;
use crate::resp::{encode_command, Value};
use crate::scripts::{Fixup, Scripts};

/// More connections than this and requests wait: a dev Redis has little to gain from more.
const MAX_CONNECTIONS: usize = 64;

/// Redis could not be reached, or the connection broke before every reply came back.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl From<io::Error> for Unavailable {
    fn from(e: io::Error) -> Self {
        Unavailable(format!("ERR redis unreachable: {e}"))
    }
}

/// How a `/multi-exec` ended.
#[derive(Debug)]
pub enum TxOutcome {
    /// EXEC ran; one reply per command, runtime errors included.
    Committed(Vec<Value>),
    /// Redis refused a command while queueing (or we did), so nothing ran.
    Discarded(String),
}

/// Commands whose replies do not fit one request, one reply.
const UNSUPPORTED: &[&[u8]] = &[
    b"SUBSCRIBE",
    b"PSUBSCRIBE",
    b"SSUBSCRIBE",
    b"UNSUBSCRIBE",
    b"PUNSUBSCRIBE",
    b"SUNSUBSCRIBE",
    b"MONITOR",
    b"SYNC",
    b"PSYNC",
    b"HELLO",
    b"RESET",
    b"QUIT",
];

/// Commands that leave state on the connection; it is closed after the request rather
/// than lent to the next one.
const STATEFUL: &[&[u8]] = &[b"MULTI", b"WATCH", b"SELECT", b"AUTH", b"CLIENT"];

/// Would break the MULTI ... EXEC framing that `/multi-exec` adds itself.
const NOT_IN_TRANSACTION: &[&[u8]] = &[b"MULTI", b"EXEC", b"DISCARD", b"WATCH", b"UNWATCH"];

/// Runs commands against one Redis.
pub struct Executor {
    pool: Pool,
    scripts: Scripts,
    /// Redis's key specifications ([`crate::keyspecs::encode`]), read once.
    specs: tokio::sync::OnceCell<String>,
}

impl Executor {
    /// An executor for `redis` (`host:port`, `unix:/path` or `/path`).
    pub fn new(redis: String) -> Executor {
        Executor {
            pool: Pool::new(redis, MAX_CONNECTIONS),
            scripts: Scripts::default(),
            specs: tokio::sync::OnceCell::new(),
        }
    }

    /// Which arguments of each command are keys, as Redis itself says: asked
    /// once, when the first command arrives (Redis may start after us).
    async fn specs(&self) -> Result<&str, Unavailable> {
        self.specs
            .get_or_try_init(|| async {
                let mut lease = self.pool.get().await?;
                let mut wire = Vec::new();
                encode_command(&[b"COMMAND"], &mut wire);
                lease.conn().send(&wire).await?;
                let reply = lease.conn().read_reply().await?;
                lease.done();
                Ok::<_, Unavailable>(crate::keyspecs::encode(&reply))
            })
            .await
            .map(String::as_str)
    }

    /// Runs `commands` in order, one reply each. Not atomic; an entry's failure leaves
    /// the others alone.
    pub async fn pipeline(&self, commands: Vec<Command>) -> Result<Vec<Value>, Unavailable> {
        let specs = self.specs().await?;
        let mut replies: Vec<Option<Value>> = Vec::with_capacity(commands.len());
        let mut fixups = Vec::with_capacity(commands.len());
        let mut wire = Vec::new();
        let mut stateful = false;
        for mut command in commands {
            let name = command[0].to_ascii_uppercase();
            if let Some(why) = unsupported(&name, &command) {
                replies.push(Some(Value::Error(why)));
                fixups.push(Fixup::None);
                continue;
            }
            stateful |= STATEFUL.contains(&name.as_slice());
            fixups.push(self.scripts.prepare(&mut command, specs));
            encode_command(&command, &mut wire);
            replies.push(None);
        }
        if !wire.is_empty() {
            let mut lease = self.pool.get().await?;
            lease.conn().send(&wire).await?;
            for (slot, fixup) in replies.iter_mut().zip(&fixups) {
                if slot.is_none() {
                    *slot = Some(fixup.apply(lease.conn().read_reply().await?));
                }
            }
            if !stateful {
                lease.done();
            }
        }
        Ok(replies.into_iter().map(|r| r.expect("filled")).collect())
    }

    /// Runs `commands` atomically with MULTI ... EXEC.
    pub async fn transaction(&self, mut commands: Vec<Command>) -> Result<TxOutcome, Unavailable> {
        let specs = self.specs().await?;
        let mut fixups = Vec::with_capacity(commands.len());
        let mut wire = Vec::new();
        encode_command(&[b"MULTI"], &mut wire);
        for command in &mut commands {
            let name = command[0].to_ascii_uppercase();
            if let Some(why) = unsupported(&name, command) {
                return Ok(TxOutcome::Discarded(why));
            }
            if NOT_IN_TRANSACTION.contains(&name.as_slice()) {
                return Ok(TxOutcome::Discarded(format!(
                    "ERR {} is not allowed inside /multi-exec, which adds MULTI and EXEC itself",
                    String::from_utf8_lossy(&name)
                )));
            }
            fixups.push(self.scripts.prepare(command, specs));
            encode_command(command, &mut wire);
        }
        encode_command(&[b"EXEC"], &mut wire);

        let mut lease = self.pool.get().await?;
        lease.conn().send(&wire).await?;
        let mut queue_error = None;
        // MULTI's own reply, then QUEUED or an error per command.
        for _ in 0..=commands.len() {
            if let Value::Error(e) = lease.conn().read_reply().await? {
                queue_error.get_or_insert(e);
            }
        }
        let exec = lease.conn().read_reply().await?;
        // After EXEC, committed or aborted, the connection is out of MULTI.
        lease.done();
        Ok(match (exec, queue_error) {
            (Value::Array(items), None) => TxOutcome::Committed(
                items
                    .into_iter()
                    .zip(&fixups)
                    .map(|(item, fixup)| fixup.apply(item))
                    .collect(),
            ),
            (_, Some(first)) => TxOutcome::Discarded(first),
            (Value::Error(e), None) => TxOutcome::Discarded(e),
            (other, None) => {
                TxOutcome::Discarded(format!("ERR unexpected reply to EXEC: {other:?}"))
            }
        })
    }
}

fn unsupported(name: &[u8], command: &Command) -> Option<String> {
    // CLIENT REPLY OFF|SKIP would leave us waiting for replies that never come.
    let client_reply = name == b"CLIENT"
        && command
            .get(1)
            .is_some_and(|sub| sub.eq_ignore_ascii_case(b"REPLY"));
    (UNSUPPORTED.contains(&name) || client_reply).then(|| {
        format!(
            "ERR {} is not supported over REST",
            String::from_utf8_lossy(name)
        )
    })
}
