//! The built worker in real workerd (`wrangler dev`), the demo origin, and
//! the backend, started for one test and torn down when it ends.

use std::{
    io::{BufRead, BufReader},
    net::TcpListener,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use super::{Backend, TOKEN};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A child leading its own process group, so that stopping it also stops
/// what it spawned (wrangler spawns workerd). Killed on drop.
pub struct Group {
    child: Child,
}

impl Group {
    fn spawn(cmd: &mut Command) -> Group {
        let child = cmd
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Group { child }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// The demo origin (`scripts/demo-origin.mjs`) on a free port.
pub struct Origin {
    pub url: String,
    _group: Group,
}

impl Origin {
    pub fn start() -> Origin {
        let mut group = Group::spawn(
            Command::new("node")
                .arg(repo().join("scripts/demo-origin.mjs"))
                .arg("0")
                .stdout(Stdio::piped())
                .stdin(Stdio::null()),
        );
        let stdout = group.child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the demo origin did not start");
        let url = line
            .strip_prefix("listening on ")
            .expect("listening line")
            .to_owned();
        Origin { url, _group: group }
    }

    /// How many requests reached the origin, in total and per path.
    pub async fn hits(&self) -> serde_json::Value {
        reqwest::get(format!("{}/__origin/hits", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `wrangler dev` serving the worker built by `scripts/build-worker`, with
/// the given rules (TOML, `[[vars.LIMITER.rules]]` tables) and its own
/// state directory.
pub struct Worker {
    pub url: String,
    pub dir: PathBuf,
    _group: Group,
}

impl Worker {
    /// Starts a worker in front of `origin`, limited through `rest_url`.
    pub fn start(rules_toml: &str, rest_url: &str, origin: &Origin) -> Worker {
        Worker::start_with_token(rules_toml, rest_url, TOKEN, origin)
    }

    /// Like [`Worker::start`], with the REST token the worker sends.
    pub fn start_with_token(
        rules_toml: &str,
        rest_url: &str,
        token: &str,
        origin: &Origin,
    ) -> Worker {
        let shim = repo().join("build/worker/shim.mjs");
        assert!(
            shim.exists(),
            "no built worker at {}: run scripts/build-worker (scripts/test does)",
            shim.display()
        );
        let dir = std::env::temp_dir().join(format!(
            "edge-limiter-e2e-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let config = format!(
            "name = \"edge-limiter-e2e\"\nmain = \"{}\"\ncompatibility_date = \"2026-04-01\"\n\n{rules_toml}\n",
            shim.display(),
        );
        std::fs::write(dir.join("wrangler.toml"), config).unwrap();
        // Local secrets go in .dev.vars, as a user's would: wrangler then
        // prints them hidden, and the token-leak tests can read its whole log.
        let secrets = format!(
            "UPSTASH_REDIS_REST_URL={rest_url}\nUPSTASH_REDIS_REST_TOKEN={token}\nORIGIN_URL={}\n",
            origin.url
        );
        std::fs::write(dir.join(".dev.vars"), secrets).unwrap();
        let (port, inspector) = (free_port(), free_port());
        let log = std::fs::File::create(dir.join("wrangler.log")).unwrap();
        let group = Group::spawn(
            Command::new(repo().join("node_modules/.bin/wrangler"))
                .args([
                    "dev",
                    "--ip",
                    "127.0.0.1",
                    "--port",
                    &port.to_string(),
                    "--inspector-port",
                    &inspector.to_string(),
                ])
                .args([
                    // "log" and not "info": the worker's console.log lines are
                    // what the tests read.
                    "--log-level",
                    "log",
                    "--show-interactive-dev-session=false",
                ])
                .current_dir(&dir)
                .env("WRANGLER_SEND_METRICS", "false")
                .env("WRANGLER_SEND_ERROR_REPORTS", "false")
                .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log),
        );
        let worker = Worker {
            url: format!("http://127.0.0.1:{port}"),
            dir,
            _group: group,
        };
        worker.wait_ready();
        worker
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(self.url.trim_start_matches("http://")).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "wrangler dev did not listen within 60 s; log:\n{}",
            self.log()
        );
    }

    /// Everything wrangler and the worker printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("wrangler.log")).unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(Path::new(&self.dir).join(".wrangler"));
    }
}

/// Backend, origin and worker: the whole stack for one test.
pub struct Stack {
    pub worker: Worker,
    pub origin: Origin,
    pub backend: Backend,
}

impl Stack {
    pub fn start(rules_toml: &str) -> Stack {
        let backend = Backend::start();
        let origin = Origin::start();
        let worker = Worker::start(rules_toml, &backend.endpoint.url(), &origin);
        Stack {
            worker,
            origin,
            backend,
        }
    }
}
