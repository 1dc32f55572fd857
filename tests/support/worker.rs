//! The built worker in real workerd (`wrangler dev`), the demo origin, and
//! the backend, started for one test and torn down when it ends.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use edge_limiter_local::{
    fault_proxy::FaultProxy,
    testenv::{free_port, repo, wrangler_dev, DemoOrigin, ProcessGroup, Scratch},
};

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
        super::json_of(super::http().get(format!("{}/__origin/hits", self.url))).await
    }
}

/// `wrangler dev` serving the worker built by `scripts/build-worker`, with
/// the given rules (TOML, `[[vars.LIMITER.rules]]` tables) and its own
/// state directory.
pub struct Worker {
    pub url: String,
    // Killed before its directory goes: fields drop in this order.
    _process: ProcessGroup,
    pub dir: Scratch,
}

impl Worker {
    /// Starts a worker in front of `origin`, limited through `rest_url`.
    pub fn start(rules_toml: &str, rest_url: &str, origin: &Origin) -> Worker {
        Worker::start_with(rules_toml, rest_url, TOKEN, "", origin)
    }

    /// Like [`Worker::start`], with the REST token the worker sends and more
    /// `.dev.vars` lines (`NAME=value\n` each).
    pub fn start_with(
        rules_toml: &str,
        rest_url: &str,
        token: &str,
        dev_vars: &str,
        origin: &Origin,
    ) -> Worker {
        let dir = project(rules_toml, rest_url, token, origin);
        if !dev_vars.is_empty() {
            let path = dir.join(".dev.vars");
            let written = std::fs::read_to_string(&path).unwrap();
            std::fs::write(path, written + dev_vars).unwrap();
        }
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
            // Wrangler says so once the worker is loaded; a port that
            // accepts may be its proxy, before then.
            if self.log().contains("Ready on")
                && std::net::TcpStream::connect(self.url.trim_start_matches("http://")).is_ok()
            {
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

    /// Whether the worker has granted a lease yet, as far as its log has
    /// caught up: cheap enough to ask between requests.
    pub fn has_leased(&self) -> bool {
        self.log().contains(r#""action":"lease_grant""#)
    }

    /// Sends `send()` 10 ms apart until the worker has granted a lease (a
    /// stream is leased to once it has lasted half a lease: the time a cold
    /// isolate or a loaded machine takes varies), 20 s at most.
    pub async fn stream_until_leased<F: Future<Output = ()>>(&self, send: impl Fn() -> F) {
        let started = Instant::now();
        while !self.has_leased() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "no lease within 20 s: {}",
                self.log()
            );
            send().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The worker's decision events so far: its log's JSON lines, once the
    /// log has caught up with the responses already received.
    pub fn events(&self) -> Vec<serde_json::Value> {
        super::report::settled(|| self.log())
            .lines()
            .filter_map(|l| l.find(r#"{"source":"edge-limiter""#).map(|at| &l[at..]))
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Its decision events of `action` so far.
    pub fn events_of(&self, action: &str) -> Vec<serde_json::Value> {
        let mut events = self.events();
        events.retain(|e| e["action"] == action);
        events
    }

    /// How many events of `action` under `rule` its lines stand for, once
    /// they reach `n`, or after 10 s: the worker writes a repeated event
    /// a line a second per key, each line counting those held back before
    /// it (`repeated`), the last a second after the one before.
    pub async fn count_of(&self, action: &str, rule: &str, n: u64) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let count = self
                .events_of(action)
                .iter()
                .filter(|e| e["rule"] == rule)
                .map(|e| 1 + e["repeated"].as_u64().unwrap_or(0))
                .sum();
            if count >= n || std::time::Instant::now() > deadline {
                return count;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

/// A directory holding what `wrangler dev` runs the built worker from: a
/// `wrangler.toml` with these rules, and `.dev.vars` with the REST endpoint,
/// its token and the origin.
fn project(rules_toml: &str, rest_url: &str, token: &str, origin: &Origin) -> Scratch {
    let shim = repo().join("build/worker/shim.mjs");
    assert!(
        shim.exists(),
        "no built worker at {}: run scripts/build-worker (scripts/test does)",
        shim.display()
    );
    let dir = Scratch::new("e2e");
    let config = format!(
        "name = \"edge-limiter-e2e\"\nmain = \"{}\"\ncompatibility_date = \"2026-04-01\"\n\
         compatibility_flags = [\"enable_request_signal\"]\n\n{rules_toml}\n",
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
    dir
}

/// The built worker in a `workerd serve` of its own, as production runs it
/// (`edge_limiter_local::bare`), with the given rules.
pub struct BareWorker {
    pub url: String,
    // Killed before its directory goes: fields drop in this order.
    _process: ProcessGroup,
    pub dir: Scratch,
}

impl BareWorker {
    /// Starts a worker in front of `origin`, limited through `rest_url`,
    /// and waits until it answers.
    pub fn start(rules_toml: &str, rest_url: &str, origin: &Origin) -> BareWorker {
        let dir = project(rules_toml, rest_url, TOKEN, origin);
        let bare = edge_limiter_local::bare::start(&dir, &dir.join("bare"))
            .expect("the worker starts in workerd");
        let worker = BareWorker {
            url: bare.url,
            _process: bare.process,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(worker.url.trim_start_matches("http://")).is_err() {
            assert!(
                Instant::now() < deadline,
                "workerd did not listen: {}",
                worker.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        worker
    }

    /// Everything workerd and the worker printed so far.
    pub fn log(&self) -> String {
        let log = self.dir.join("bare").join(edge_limiter_local::bare::LOG);
        std::fs::read_to_string(log).unwrap_or_default()
    }
}

/// Backend, origin and worker: the whole stack for one test, as
/// [`Stack::builder`] puts it together.
pub struct Stack {
    pub worker: Worker,
    /// More workers with the same rules and backend ([`StackBuilder::instances`]).
    pub others: Vec<Worker>,
    pub origin: Origin,
    /// Between the workers and the REST endpoint, when asked for
    /// ([`StackBuilder::through_fault_proxy`]).
    pub proxy: Option<FaultProxy>,
    pub backend: Backend,
    /// Each region's own backend besides the home's, by name
    /// ([`StackBuilder::region`]).
    pub regions: Vec<(String, Backend)>,
}

impl Stack {
    /// `edge-limiter ARGS` beside the worker (its wrangler.toml), straight
    /// to the REST endpoint.
    pub fn edge_limiter(&self, args: &[&str]) -> std::process::Command {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_edge-limiter"));
        command
            .args(args)
            .current_dir(&self.worker.dir)
            .env("UPSTASH_REDIS_REST_URL", self.backend.endpoint.url())
            .env("UPSTASH_REDIS_REST_TOKEN", super::TOKEN);
        command
    }

    /// `stats --json` once it counts `sent` requests: the isolates write
    /// within `stats_every`, so it waits up to a minute.
    pub async fn stats_once_written(&self, sent: u64) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let out = self.edge_limiter(&["stats", "--json"]).output().unwrap();
            let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            if report["requests"] == sent {
                return report;
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(Instant::now() < deadline, "stats hold {report}\n{stderr}");
        }
    }

    /// A worker with these rules (`[[vars.LIMITER.rules]]` tables, and any
    /// other `[vars.LIMITER]` settings) in front of the demo origin, on a
    /// fresh Redis.
    pub fn start(rules_toml: &str) -> Stack {
        Stack::builder(rules_toml).start()
    }

    /// The script calls (`EVALSHA`, `EVAL`) the fault proxy has seen.
    pub fn script_calls(&self) -> usize {
        let proxy = self
            .proxy
            .as_ref()
            .expect("a stack through the fault proxy");
        let exchanges = proxy.exchanges();
        let calls = exchanges
            .iter()
            .filter(|e| e.request.starts_with(b"[\"EVAL"));
        calls.count()
    }

    /// The same, with more to say about the stack before it starts.
    pub fn builder(rules_toml: &str) -> StackBuilder {
        StackBuilder {
            rules: rules_toml.to_owned(),
            token: TOKEN.to_owned(),
            dev_vars: String::new(),
            regions: vec![],
            proxy: false,
            durable: false,
            instances: 1,
        }
    }
}

/// How a test's stack is put together: see [`Stack::builder`].
pub struct StackBuilder {
    rules: String,
    token: String,
    dev_vars: String,
    regions: Vec<String>,
    proxy: bool,
    durable: bool,
    instances: usize,
}

impl StackBuilder {
    /// The workers send this REST token rather than the endpoint's.
    pub fn token(mut self, token: &str) -> StackBuilder {
        self.token = token.to_owned();
        self
    }

    /// These lines (`NAME=value\n` each) in the workers' `.dev.vars` too: a
    /// secret such as `STATS_SECRET`.
    pub fn dev_vars(mut self, lines: &str) -> StackBuilder {
        self.dev_vars.push_str(lines);
        self
    }

    /// A region's own Redis and REST endpoint beside the home's
    /// ([`Stack::regions`]), named to the workers by the secrets suffixed
    /// with `name` (`UPSTASH_REDIS_REST_URL_EU`).
    pub fn region(mut self, name: &str) -> StackBuilder {
        self.regions.push(name.to_owned());
        self
    }

    /// The workers' REST calls go through a fault proxy ([`Stack::proxy`]).
    pub fn through_fault_proxy(mut self) -> StackBuilder {
        self.proxy = true;
        self
    }

    /// Redis keeps its data across a restart (`RedisServer::start_durable`).
    pub fn durable(mut self) -> StackBuilder {
        self.durable = true;
        self
    }

    /// This many workers, sharing the origin and the backend.
    pub fn instances(mut self, n: usize) -> StackBuilder {
        self.instances = n.max(1);
        self
    }

    /// Starts everything; the workers at once, as wrangler's start-up is
    /// the slow part.
    pub fn start(self) -> Stack {
        let backend = match self.durable {
            true => Backend::start_durable(),
            false => Backend::start(),
        };
        let proxy = self
            .proxy
            .then(|| FaultProxy::start(backend.endpoint.addr()).expect("the fault proxy starts"));
        let rest = proxy
            .as_ref()
            .map_or_else(|| backend.endpoint.url(), FaultProxy::url);
        let origin = Origin::start();
        let mut dev_vars = self.dev_vars.clone();
        let regions: Vec<(String, Backend)> = (self.regions.iter())
            .map(|name| {
                let b = Backend::start();
                let suffix = name.to_ascii_uppercase();
                dev_vars += &format!(
                    "UPSTASH_REDIS_REST_URL_{suffix}={}\nUPSTASH_REDIS_REST_TOKEN_{suffix}={TOKEN}\n",
                    b.endpoint.url()
                );
                (name.clone(), b)
            })
            .collect();
        let mut workers = std::thread::scope(|s| {
            let started: Vec<_> = (0..self.instances)
                .map(|_| {
                    s.spawn(|| {
                        Worker::start_with(&self.rules, &rest, &self.token, &dev_vars, &origin)
                    })
                })
                .collect();
            started
                .into_iter()
                .map(|w| w.join().expect("a worker starts"))
                .collect::<Vec<Worker>>()
        });
        let worker = workers.remove(0);
        Stack {
            worker,
            others: workers,
            origin,
            proxy,
            backend,
            regions,
        }
    }
}
