//! A redis-server that keeps its data across a crash, so that a test can
//! tell a count the limiter lost from one Redis forgot.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use edge_limiter_local::resp::encode_command;

/// `redis-server` with an append-only file synced on every write: whatever
/// it acknowledged survives [`DurableRedis::crash`] and is there again after
/// [`DurableRedis::start_again`], on the same port.
pub struct DurableRedis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl DurableRedis {
    pub fn start() -> DurableRedis {
        let mut last_error = String::new();
        // Another process may take the probed port before Redis binds it.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let dir = std::env::temp_dir().join(format!(
                "edge-limiter-durable-{}-{port}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).expect("redis data directory");
            let mut redis = DurableRedis {
                port,
                dir,
                child: None,
            };
            match redis.spawn() {
                Ok(()) => return redis,
                Err(e) => last_error = e,
            }
        }
        panic!("could not start a durable redis-server: {last_error}");
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the server as a crash would. Commands still queued are paused
    /// first and then lost unrun, so every command Redis ran had its reply
    /// written: what a test saw acknowledged is exactly what was persisted.
    pub fn crash(&mut self) {
        if self.child.is_some() && send(&self.addr(), &["CLIENT", "PAUSE", "10000", "ALL"]) {
            // Replies of commands run before the pause leave in the same event
            // loop turn; this is ample for them to reach the sockets.
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop();
    }

    /// Kills the server at once. Does nothing if it is not running.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on its port, from its append-only file.
    pub fn start_again(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => {
                    panic!("could not restart redis-server on {}: {e}", self.addr())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        let bin = std::env::var_os("REDIS_SERVER_BIN").unwrap_or_else(|| "redis-server".into());
        let mut child = Command::new(&bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run {bin:?}: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("redis-server exited: {status}"));
            }
            // PONG, not LOADING: the append-only file has been read back.
            if ping(&self.addr()) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("redis-server did not answer PING".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for DurableRedis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether Redis at `addr` answered PONG (not LOADING, not refused).
fn ping(addr: &str) -> bool {
    reply_line(addr, &["PING"]).as_deref() == Some("+PONG")
}

/// Whether Redis at `addr` ran the command without an error.
fn send(addr: &str, args: &[&str]) -> bool {
    reply_line(addr, args).is_some_and(|line| !line.starts_with('-'))
}

/// Sends one command on a fresh connection; the first line of the reply.
fn reply_line(addr: &str, args: &[&str]) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut wire = Vec::new();
    encode_command(args, &mut wire);
    stream.write_all(&wire).ok()?;
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        stream.read_exact(&mut byte).ok()?;
        reply.push(byte[0]);
    }
    reply.truncate(reply.len() - 2);
    String::from_utf8(reply).ok()
}
