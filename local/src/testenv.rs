//! Process guards for tests: a throwaway `redis-server` and the `upstash-local` binary,
//! each killed when its guard drops.
//!
//! Everything here is synchronous and panics on failure, so it works the same from a
//! plain `#[test]` and from a tokio test.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use crate::resp::{encode_command, Decoder, Value};

const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` on a free loopback port: without persistence, or
/// durable ([`RedisServer::start_durable`]).
///
/// The binary is `redis-server` from `PATH`, or `$REDIS_SERVER_BIN`.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    /// A durable server's data directory, removed on drop.
    dir: Option<PathBuf>,
    /// A cluster node's directory (its nodes.conf), removed on drop.
    cluster: Option<PathBuf>,
}

impl RedisServer {
    /// Starts a server and waits until it answers.
    pub fn start() -> RedisServer {
        RedisServer::start_with(false, false)
    }

    /// Starts a server with an append-only file synced on every write, in a
    /// fresh directory: whatever it acknowledged survives
    /// [`RedisServer::crash`] and is there again after
    /// [`RedisServer::restart`], so that a test can tell a count the
    /// limiter lost from one Redis forgot.
    pub fn start_durable() -> RedisServer {
        RedisServer::start_with(true, false)
    }

    /// Starts a one-node Redis Cluster that holds every slot, and waits
    /// until it serves commands: like any cluster it refuses a command, or
    /// a script, whose keys lie in more than one slot (`CROSSSLOT`).
    pub fn start_cluster() -> RedisServer {
        let server = RedisServer::start_with(false, true);
        let addr = server.addr();
        redis_call(&addr, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while !redis_call(&addr, &["CLUSTER", "INFO"])
            .to_string()
            .contains("cluster_state:ok")
        {
            assert!(Instant::now() < deadline, "the cluster did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn start_with(durable: bool, cluster: bool) -> RedisServer {
        let mut last_error = String::new();
        // Another process may take the port between our probe and Redis's bind.
        for _ in 0..5 {
            let port = free_port();
            let dir_of = |kind: &str| {
                let dir = std::env::temp_dir().join(format!(
                    "edge-limiter-redis-{kind}-{}-{port}",
                    std::process::id()
                ));
                std::fs::create_dir_all(&dir).expect("redis data directory");
                dir
            };
            let dir = durable.then(|| dir_of("data"));
            let cluster = cluster.then(|| dir_of("cluster"));
            match spawn_redis(port, dir.as_deref(), cluster.as_deref()) {
                Ok(child) => {
                    return RedisServer {
                        port,
                        child: Some(child),
                        dir,
                        cluster,
                    }
                }
                Err(e) => last_error = e,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port it listens on, the same across [`RedisServer::restart`].
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server abruptly, as a crash would. Does nothing if already stopped.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server as a crash would, with its clients paused first:
    /// commands still queued are lost unrun, so every command Redis ran had
    /// its reply written, and what a test saw acknowledged is exactly what a
    /// durable server persisted.
    pub fn crash(&mut self) {
        let paused = self.child.is_some()
            && matches!(
                try_redis_call(&self.addr(), &["CLIENT", "PAUSE", "10000", "ALL"]),
                Ok(Value::Simple(_))
            );
        if paused {
            // Replies of commands run before the pause leave in the same event
            // loop turn; this is ample for them to reach the sockets.
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop();
    }

    /// Stops the server if running and starts it again on the same port:
    /// empty, or a durable one from its append-only file.
    pub fn restart(&mut self) {
        self.stop();
        let mut last_error = String::new();
        for _ in 0..20 {
            match spawn_redis(self.port, self.dir.as_deref(), self.cluster.as_deref()) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) => last_error = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "could not restart redis-server on port {}: {last_error}",
            self.port
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        for dir in self.dir.iter().chain(&self.cluster) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Where [`free_port`] looks: below Linux's default ephemeral range
/// (32768-60999), where every `bind(127.0.0.1:0)` lands.
const PORTS: std::ops::Range<u32> = 20_000..32_768;

/// A loopback port that was free a moment ago, for a child process to bind.
///
/// Not one the kernel hands out for `bind(0)`: such a port, released again,
/// can go to any other process binding port 0 (workerd opens several) before
/// the child binds it, and then the child fails with "Address already in
/// use" while some other server answers on its port. These ports come from
/// a sequence no `bind(0)` draws from, starting at an offset of this
/// process's own so that concurrent test processes rarely meet, and each is
/// checked free by binding it.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = PORTS.end - PORTS.start;
    let offset = std::process::id().wrapping_mul(7919) % span;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < span, "no free loopback port in {PORTS:?}");
        let port = (PORTS.start + (offset + n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The first line a child prints on its piped stdout, within `timeout`. A
/// thread keeps draining the rest, so the child never blocks on a full pipe.
pub fn first_stdout_line(child: &mut Child, timeout: Duration) -> Option<String> {
    let stdout = child.stdout.take()?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    rx.recv_timeout(timeout).ok()
}

/// A child leading its own process group, killed with its whole group on
/// drop: `wrangler dev` spawns workerd, which would outlive wrangler alone.
pub struct ProcessGroup {
    /// The group's leader.
    pub child: Child,
}

impl ProcessGroup {
    /// Spawns `cmd` as the leader of a new process group.
    pub fn spawn(cmd: &mut Command) -> io::Result<ProcessGroup> {
        use std::os::unix::process::CommandExt;
        Ok(ProcessGroup {
            child: cmd.process_group(0).spawn()?,
        })
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

/// A scratch directory of one test under the system's temporary one,
/// removed when dropped; kept, and named on stderr, when the test fails, so
/// that the logs in it can be read.
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// A new empty directory named for `what` and unique to this process.
    pub fn new(what: &str) -> Scratch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "edge-limiter-{what}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("a scratch directory");
        Scratch { path }
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for the failing test: {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The repository the tests run in: its scripts, node_modules and worker.
///
/// Found at run time, from the working directory up (cargo runs tests in
/// their package's directory): a path baked in at compile time would name
/// whichever checkout last compiled this crate into a shared target
/// directory, and tests would then run that checkout's worker.
pub fn repo() -> PathBuf {
    let start = std::env::current_dir().expect("a working directory");
    start
        .ancestors()
        .find(|dir| dir.join("wrangler.toml").is_file() && dir.join("lua").is_dir())
        .unwrap_or_else(|| panic!("no edge-limiter repository at or above {}", start.display()))
        .to_path_buf()
}

/// `scripts/demo-origin.mjs` on a free port: it answers every request and
/// counts them per path (`GET /__origin/hits`).
pub struct DemoOrigin {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The node process.
    pub process: ProcessGroup,
}

impl DemoOrigin {
    /// Starts the origin and waits for it to listen.
    pub fn start() -> io::Result<DemoOrigin> {
        let mut process = ProcessGroup::spawn(
            Command::new("node")
                .arg(repo().join("scripts/demo-origin.mjs"))
                .arg("0")
                .stdin(Stdio::null())
                .stdout(Stdio::piped()),
        )?;
        let line = first_stdout_line(&mut process.child, STARTUP_TIMEOUT)
            .ok_or_else(|| io::Error::other("the demo origin printed no `listening on` line"))?;
        let url = line
            .strip_prefix("listening on ")
            .ok_or_else(|| {
                io::Error::other(format!("unexpected line from the demo origin: {line:?}"))
            })?
            .to_owned();
        Ok(DemoOrigin { url, process })
    }
}

/// `wrangler dev` (the repository's pinned one, in `node_modules`) serving the config in `dir` on `port`, with its own
/// inspector port so that several can run at once, and without telemetry.
/// Its debug log goes to `/dev/null`.
pub fn wrangler_dev(dir: &Path, port: u16, log_level: &str) -> Command {
    // Whatever the log level, wrangler appends every debug message to a file
    // under ~/.config, among them each inspector event of each subrequest
    // (about 5 KB per request served): gigabytes over the tests and the
    // bench, written beside the processes the bench measures.
    let debug_log = dir.join("wrangler-debug.log");
    if std::fs::symlink_metadata(&debug_log).is_err() {
        // Best effort: without the link, wrangler writes a real file there.
        let _ = std::os::unix::fs::symlink("/dev/null", &debug_log);
    }
    // Wrangler's own temporary files (a miniflare-* directory per start,
    // left behind when the group is killed) go with `dir`.
    let tmp = dir.join("tmp");
    let _ = std::fs::create_dir_all(&tmp);
    let mut cmd = Command::new(repo().join("node_modules/.bin/wrangler"));
    cmd.args(["dev", "--ip", "127.0.0.1", "--port", &port.to_string()])
        .args(["--inspector-port", &free_port().to_string()])
        .args([
            "--log-level",
            log_level,
            "--show-interactive-dev-session=false",
        ])
        .current_dir(dir)
        .env("WRANGLER_SEND_METRICS", "false")
        .env("WRANGLER_SEND_ERROR_REPORTS", "false")
        .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
        .env("WRANGLER_LOG_PATH", &debug_log)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null());
    cmd
}

/// Starts redis-server on `port`, keeping an append-only file (synced on
/// every write) in `dir` if given, as a cluster node keeping its
/// nodes.conf in `cluster` if given, and waits until it serves commands.
fn spawn_redis(port: u16, dir: Option<&Path>, cluster: Option<&Path>) -> Result<Child, String> {
    let bin = std::env::var_os("REDIS_SERVER_BIN").unwrap_or_else(|| "redis-server".into());
    let mut cmd = Command::new(&bin);
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--daemonize", "no"]);
    match dir {
        Some(dir) => cmd
            .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
            .arg(dir),
        None => cmd.args(["--appendonly", "no"]),
    };
    if let Some(cluster) = cluster {
        cmd.args(["--cluster-enabled", "yes", "--cluster-config-file"])
            .arg(cluster.join("nodes.conf"));
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {bin:?}: {e}"))?;
    let addr = format!("127.0.0.1:{port}");
    // Checking the pid, not just PING, tells our server from another one that already
    // had the port (ours then exits on its failed bind).
    let ours = format!("process_id:{}\r\n", child.id());
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("redis-server on port {port} exited: {status}"));
        }
        let is_ours = try_redis_call(&addr, &["INFO", "server"])
            .is_ok_and(|info| info.to_string().contains(&ours));
        // PONG, not LOADING: an append-only file has been read back.
        if is_ours
            && matches!(try_redis_call(&addr, &["PING"]), Ok(Value::Simple(p)) if p == "PONG")
        {
            return Ok(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("redis-server on port {port} did not come up"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `upstash-local` binary on a free loopback port.
pub struct Endpoint {
    child: Child,
    addr: SocketAddr,
}

impl Endpoint {
    /// Starts [`endpoint_binary`] in front of `redis_addr`, accepting `token`, and waits
    /// for it to listen.
    pub fn start(redis_addr: &str, token: &str) -> Endpoint {
        let bin = endpoint_binary();
        let mut child = Command::new(&bin)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--redis",
                redis_addr,
                "--token",
                token,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
        let Some(line) = first_stdout_line(&mut child, STARTUP_TIMEOUT) else {
            let _ = child.kill();
            let status = child.wait();
            panic!(
                "{} printed no `listening on` line ({status:?})",
                bin.display()
            );
        };
        let addr = line
            .strip_prefix("listening on http://")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line from upstash-local: {line:?}"));
        Endpoint { child, addr }
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `upstash-local` binary: `$UPSTASH_LOCAL_BIN` if set, else the one in the target
/// directory of the running test executable (`target/<profile>/upstash-local`), built
/// with cargo first if it is missing or older than the test executable.
pub fn endpoint_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("UPSTASH_LOCAL_BIN") {
        return bin.into();
    }
    // Parallel tests in one process should build once, not race each other.
    static BUILD: Mutex<()> = Mutex::new(());
    let _building = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe
        .parent()
        .expect("executable has a directory")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join(format!("upstash-local{}", std::env::consts::EXE_SUFFIX));
    let modified = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    // A test built against newer library code than the binary would test stale code.
    if modified(&bin).is_none() || modified(&bin) < modified(&exe) {
        build_endpoint(&dir);
    }
    bin
}

fn build_endpoint(profile_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--quiet",
        "--bin",
        "upstash-local",
        "--manifest-path",
    ])
    .arg(repo().join("local/Cargo.toml"));
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(profile) => {
            cmd.args(["--profile", profile]);
        }
    }
    // Builds into the directory holding the test executable, wherever that is.
    if let Some(target_dir) = profile_dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target_dir);
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build upstash-local: {e}"));
    assert!(status.success(), "building upstash-local failed: {status}");
}

/// Sends one command to Redis at `addr` on a fresh connection and returns the reply;
/// an error reply comes back as [`Value::Error`]. Panics if Redis cannot be reached.
pub fn redis_call<A: AsRef<[u8]>>(addr: &str, args: &[A]) -> Value {
    try_redis_call(addr, args).unwrap_or_else(|e| panic!("redis at {addr}: {e}"))
}

/// Like [`redis_call`], rendered as `redis-cli --raw` would print it: `TTL` gives
/// `"42"`, `GET` of a missing key `""`, arrays one element per line.
pub fn redis_cli<A: AsRef<[u8]>>(addr: &str, args: &[A]) -> String {
    redis_call(addr, args).to_string()
}

fn try_redis_call<A: AsRef<[u8]>>(addr: &str, args: &[A]) -> io::Result<Value> {
    let sock = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address"))?;
    let mut stream = TcpStream::connect_timeout(&sock, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut wire = Vec::new();
    encode_command(args, &mut wire);
    stream.write_all(&wire)?;
    let (mut buf, mut pos, mut decoder) = (Vec::new(), 0, Decoder::default());
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(value) = decoder.decode(&buf, &mut pos)? {
            return Ok(value);
        }
        match stream.read(&mut chunk)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
