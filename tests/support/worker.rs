//! The built worker in real workerd (`wrangler dev`), the demo origin, and
//! the backend, started for one test and torn down when it ends.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use edge_limiter_local::testenv::{free_port, repo, wrangler_dev, DemoOrigin, ProcessGroup};

use super::{Backend, TOKEN};

/// The demo origin (`scripts/demo-origin.mjs`) on a free port.
pub struct Origin {
    pub url: String,
    _process: DemoOrigin,
}

impl Origin {
    pub fn start() -> Origin {
        let process = DemoOrigin::start().expect("the demo origin starts");
        Origin {
            url: process.url.clone(),
            _process: process,
        }
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

/// `wrangler dev` serving the worker built by `scripts/build-worker`, with
/// the given rules (TOML, `[[vars.LIMITER.rules]]` tables) and its own
/// state directory.
pub struct Worker {
    pub url: String,
    pub dir: PathBuf,
    _process: ProcessGroup,
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
        let port = free_port();
        let log = std::fs::File::create(dir.join("wrangler.log")).unwrap();
        // "log" and not "info": the worker's console.log lines are what the
        // tests read.
        let process = ProcessGroup::spawn(
            wrangler_dev(&dir, port, "log")
                .stdout(log.try_clone().unwrap())
                .stderr(log),
        )
        .expect("wrangler dev starts");
        let worker = Worker {
            url: format!("http://127.0.0.1:{port}"),
            dir,
            _process: process,
        };
        worker.wait_ready();
        worker
    }

    fn wait_ready(&self) {
        // A few seconds when the machine is idle; generous for a loaded one.
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(self.url.trim_start_matches("http://")).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "wrangler dev did not listen within 120 s; log:\n{}",
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
