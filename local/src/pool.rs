//! A small pool of Redis connections, each lent to one HTTP request at a time.
//!
//! Exclusive use is what makes `/multi-exec` atomic: MULTI ... EXEC from two requests
//! can never interleave on one connection.

use std::io;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::resp::Conn;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Connections to one Redis, at most `max` open at once.
pub struct Pool {
    target: String,
    idle: Mutex<Vec<Conn>>,
    permits: Semaphore,
}

/// A connection lent to one request. It goes back to the pool on drop only after
/// [`Lease::done`]; a request that failed or was cancelled midway drops it instead,
/// since its replies may still be in flight.
pub struct Lease<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
    reusable: bool,
    _permit: SemaphorePermit<'a>,
}

impl Pool {
    /// A pool for `target` (`host:port`, `unix:/path` or `/path`).
    pub fn new(target: String, max: usize) -> Pool {
        Pool {
            target,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(max),
        }
    }

    /// Lends a live connection, reusing an idle one or dialling Redis.
    pub async fn get(&self) -> io::Result<Lease<'_>> {
        let permit = self.permits.acquire().await.expect("pool semaphore closed");
        loop {
            let idle = self.idle.lock().expect("pool poisoned").pop();
            let Some(mut conn) = idle else { break };
            if conn.is_reusable().await {
                return Ok(self.lease(conn, permit));
            }
        }
        let conn = Conn::connect(&self.target, CONNECT_TIMEOUT).await?;
        Ok(self.lease(conn, permit))
    }

    fn lease<'a>(&'a self, conn: Conn, permit: SemaphorePermit<'a>) -> Lease<'a> {
        Lease {
            pool: self,
            conn: Some(conn),
            reusable: false,
            _permit: permit,
        }
    }
}

impl Lease<'_> {
    /// The connection.
    pub fn conn(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("connection present until drop")
    }

    /// Marks the exchange complete: the connection holds no state from this request.
    pub fn done(mut self) {
        self.reusable = true;
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let (true, Some(conn)) = (self.reusable, self.conn.take()) {
            self.pool.idle.lock().expect("pool poisoned").push(conn);
        }
    }
}
