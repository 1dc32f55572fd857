//! The processes every measurement shares: the demo origin and the workers in
//! `wrangler dev`. (redis-server and the REST endpoint come from
//! `edge_limiter_local::testenv`.) Everything is killed when dropped.

use std::{
    io::{BufRead, BufReader},
    net::{TcpListener, TcpStream},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

/// The token the REST endpoint accepts.
pub const TOKEN: &str = "bench-token-5e1d";

/// The repository, whose scripts, node_modules and built worker the bench uses.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ lies inside the repository")
        .to_path_buf()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("cannot bind 127.0.0.1:0")
}

/// A child leading its own process group: wrangler spawns workerd, which
/// would outlive a kill of wrangler alone.
pub struct Group {
    child: Child,
}

impl Group {
    /// The process group's id (the leader's pid).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn spawn(cmd: &mut Command) -> Result<Group, String> {
        let child = cmd
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
        Ok(Group { child })
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

/// `scripts/demo-origin.mjs` on a free port; it counts what reaches it per path.
pub struct Origin {
    pub url: String,
    pub group: Group,
}

impl Origin {
    pub fn start() -> Result<Origin, String> {
        let mut group = Group::spawn(
            Command::new("node")
                .arg(repo().join("scripts/demo-origin.mjs"))
                .arg("0")
                .stdin(Stdio::null())
                .stdout(Stdio::piped()),
        )?;
        let stdout = group.child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        // Keeps draining stdout so the origin never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "the demo origin printed no `listening on` line".to_owned())?;
        let url = line
            .strip_prefix("listening on ")
            .ok_or_else(|| format!("unexpected line from the demo origin: {line:?}"))?
            .to_owned();
        Ok(Origin { url, group })
    }

    /// Requests that reached the origin on `path`.
    pub async fn hits(&self, http: &reqwest::Client, path: &str) -> Result<u64, String> {
        let url = format!("{}/__origin/hits", self.url);
        let hits: serde_json::Value = async { http.get(&url).send().await?.json().await }
            .await
            .map_err(|e| format!("reading the origin's counts: {e}"))?;
        Ok(hits["paths"][path].as_u64().unwrap_or(0))
    }
}

/// One worker in `wrangler dev`, from a generated `wrangler.toml` in its own
/// directory (so its `.wrangler` state is its own).
pub struct Worker {
    pub label: &'static str,
    pub url: String,
    pub dir: PathBuf,
    /// wrangler and the workerd it runs.
    pub group: Group,
}

impl Worker {
    /// Starts wrangler on `main` (relative to `dir`, or absolute) with the
    /// given `[vars]` body and extra TOML; returns at once, see [`Worker::ready`].
    pub fn spawn(
        label: &'static str,
        dir: PathBuf,
        main: &Path,
        vars: &str,
        extra_toml: &str,
    ) -> Result<Worker, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let config = format!(
            "name = \"bench-{label}\"\nmain = \"{}\"\ncompatibility_date = \"2026-04-01\"\n\n[vars]\n{vars}\n{extra_toml}\n",
            main.display()
        );
        std::fs::write(dir.join("wrangler.toml"), config).map_err(|e| e.to_string())?;
        let log = std::fs::File::create(dir.join("wrangler.log")).map_err(|e| e.to_string())?;
        let (port, inspector) = (free_port(), free_port());
        let group = Group::spawn(
            Command::new(repo().join("node_modules/.bin/wrangler"))
                .args(["dev", "--ip", "127.0.0.1", "--port", &port.to_string()])
                .args(["--inspector-port", &inspector.to_string()])
                // Request logging costs the same for every worker but adds
                // noise; errors still reach the log.
                .args([
                    "--log-level",
                    "error",
                    "--show-interactive-dev-session=false",
                ])
                .current_dir(&dir)
                .env("WRANGLER_SEND_METRICS", "false")
                .env("WRANGLER_SEND_ERROR_REPORTS", "false")
                .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
                .stdin(Stdio::null())
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log),
        )?;
        Ok(Worker {
            label,
            url: format!("http://127.0.0.1:{port}"),
            dir,
            group,
        })
    }

    /// Waits until the worker answers an HTTP request (not merely listens:
    /// wrangler binds before the script is loaded).
    pub async fn ready(&self, http: &reqwest::Client) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(90);
        let addr = self.url.trim_start_matches("http://");
        while Instant::now() < deadline {
            if TcpStream::connect(addr).is_ok()
                && http
                    .get(format!("{}/__bench/ready", self.url))
                    .send()
                    .await
                    .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!(
            "worker {} did not answer within 90 s; its log:\n{}",
            self.label,
            self.log()
        ))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("wrangler.log")).unwrap_or_default()
    }

    /// The script wrangler bundled and serves, as `(file name, bytes)`:
    /// `.wrangler/tmp/dev-*/` holds it beside its source map.
    pub fn bundle(&self) -> Option<(String, Vec<u8>)> {
        let tmp = self.dir.join(".wrangler/tmp");
        for dev in std::fs::read_dir(tmp).ok()?.flatten() {
            if !dev.file_name().to_string_lossy().starts_with("dev-") {
                continue;
            }
            for file in std::fs::read_dir(dev.path()).ok()?.flatten() {
                let name = file.file_name().to_string_lossy().into_owned();
                if name.ends_with(".js") {
                    return Some((name, std::fs::read(file.path()).ok()?));
                }
            }
        }
        None
    }
}
