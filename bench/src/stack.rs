//! The processes every measurement shares: the demo origin and the workers in
//! `wrangler dev` (or in workerd alone, `bare.rs`). (redis-server and the REST
//! endpoint come from `edge_limiter_local::testenv`.) Everything is killed
//! when dropped.

use std::{
    net::TcpStream,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

pub use edge_limiter_local::testenv::repo;
use edge_limiter_local::{
    bare,
    testenv::{free_port, wrangler_dev, DemoOrigin, ProcessGroup},
};

use crate::cpu;

/// The token the REST endpoint accepts.
pub const TOKEN: &str = "bench-token-5e1d";

/// The demo origin; it counts what reaches it per path.
pub struct Origin {
    pub url: String,
    /// The node process, for CPU accounting by process group.
    pub group: ProcessGroup,
}

impl Origin {
    pub fn start() -> Result<Origin, String> {
        let DemoOrigin { url, process } = DemoOrigin::start().map_err(|e| e.to_string())?;
        Ok(Origin {
            url,
            group: process,
        })
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
/// directory (so its `.wrangler` state is its own); or in a `workerd serve`
/// of its own (`bare.rs`).
pub struct Worker {
    pub label: &'static str,
    pub url: String,
    pub dir: PathBuf,
    /// wrangler and the workerd it runs, or the bare workerd alone.
    pub group: ProcessGroup,
    /// Whether `group` is a bare workerd, without wrangler.
    pub bare: bool,
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
        let port = free_port();
        // Request logging costs the same for every worker but adds noise;
        // errors still reach the log.
        let group = ProcessGroup::spawn(
            wrangler_dev(&dir, port, "error")
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log),
        )
        .map_err(|e| format!("cannot start wrangler dev: {e}"))?;
        Ok(Worker {
            label,
            url: format!("http://127.0.0.1:{port}"),
            dir,
            group,
            bare: false,
        })
    }

    /// The workerd processes that run the worker's script: under `wrangler
    /// dev` the one started with an inspector (the other is wrangler's proxy
    /// in front of it), else the bare workerd itself.
    pub fn own_workerd(&self, snapshot: &cpu::Snapshot) -> Vec<u32> {
        let group = self.group.child.id();
        if self.bare {
            return vec![group];
        }
        snapshot.with_arg(group, "workerd", "--inspector-addr")
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
        let file = if self.bare { bare::LOG } else { "wrangler.log" };
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
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

/// The files of a worker build (`scripts/build-worker` leaves them in `build/`).
pub const BUILD: [&str; 3] = ["index.js", "index_bg.wasm", "worker/shim.mjs"];

/// Copies the file `from` to `to`, making `to`'s folder.
pub fn copy(from: PathBuf, to: PathBuf) -> Result<(), String> {
    std::fs::create_dir_all(to.parent().expect("a file path"))
        .and_then(|_| std::fs::copy(&from, &to).map(drop))
        .map_err(|e| format!("copying {}: {e}", from.display()))
}

/// A copy of the worker build in `build` under `dir/build`, so that a
/// rebuild during the run changes nothing.
pub fn copy_build(build: &Path, dir: &Path) -> Result<(), String> {
    for file in BUILD {
        copy(build.join(file), dir.join("build").join(file))?;
    }
    Ok(())
}

/// A worker's variables for the REST endpoint `rest` and the origin.
pub fn rest_vars(rest: &str, origin: &str) -> String {
    format!(
        "UPSTASH_REDIS_REST_URL = \"{rest}\"\nUPSTASH_REDIS_REST_TOKEN = \"{TOKEN}\"\nORIGIN_URL = \"{origin}\""
    )
}
