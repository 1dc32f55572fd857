//! A worker in a `workerd serve` of its own, as production runs it: no
//! wrangler, no inspector, no proxy in front. Part 2 runs once more through
//! these, to show whether its ratios hold without `wrangler dev`'s costs.
//!
//! The worker is bundled as `wrangler deploy` would upload it (`--dry-run
//! --outdir`, offline), and its `[vars]` become workerd bindings: strings as
//! text, tables as JSON, as Cloudflare gives them.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use edge_limiter_local::testenv::{free_port, ProcessGroup};

use crate::stack::{repo, Worker};

/// Where a bare worker's workerd writes its errors and the worker's console
/// lines (ours logs each denial): to a file, where production sends them to
/// Workers Logs and `wrangler dev` through the inspector.
pub const LOG: &str = "workerd.log";

/// The worker `like` runs in `wrangler dev`, from the same `wrangler.toml`
/// (script, vars, compatibility date and flags), in a workerd of its own
/// under `label` in `dir`; returns at once, see [`Worker::ready`].
pub fn spawn(label: &'static str, like: &Worker, dir: PathBuf) -> Result<Worker, String> {
    let text =
        std::fs::read_to_string(like.dir.join("wrangler.toml")).map_err(|e| e.to_string())?;
    let toml: toml::Table = text
        .parse()
        .map_err(|e| format!("{}/wrangler.toml: {e}", like.dir.display()))?;
    let setting = |key: &str| {
        let missing = || format!("{}/wrangler.toml has no {key}", like.dir.display());
        toml.get(key).cloned().ok_or_else(missing)
    };
    std::fs::create_dir_all(dir.join("vars")).map_err(|e| e.to_string())?;
    let main = PathBuf::from(setting("main")?.as_str().unwrap_or_default());
    let modules = bundle(&like.dir, &dir, &main)?;
    let vars = setting("vars")?.as_table().cloned().unwrap_or_default();
    let bindings = bindings(&dir, vars)?;
    let date = setting("compatibility_date")?;
    let flags = setting("compatibility_flags").unwrap_or(toml::Value::Array(vec![]));
    let port = free_port();
    // capnp text takes TOML's strings and lists of strings as they are.
    let config = format!(
        "using Workerd = import \"/workerd/workerd.capnp\";\n\n\
         const config :Workerd.Config = (\n  services = [\n    (name = \"main\", worker = .worker),\n    \
         # Without private and local, fetches to 127.0.0.1 are refused.\n    \
         (name = \"net\", network = (allow = [\"public\", \"private\", \"local\"])),\n  ],\n  \
         sockets = [(name = \"http\", address = \"127.0.0.1:{port}\", http = (), service = \"main\")],\n);\n\n\
         const worker :Workerd.Worker = (\n  modules = [\n{modules}  ],\n  \
         compatibilityDate = {date},\n  compatibilityFlags = {flags},\n  \
         bindings = [\n{bindings}  ],\n  globalOutbound = \"net\",\n);\n"
    );
    std::fs::write(dir.join("workerd.capnp"), config).map_err(|e| e.to_string())?;
    let log = std::fs::File::create(dir.join(LOG)).map_err(|e| e.to_string())?;
    let group = ProcessGroup::spawn(
        Command::new(repo().join("node_modules/.bin/workerd"))
            .args(["serve", "workerd.capnp"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log),
    )
    .map_err(|e| format!("cannot start workerd: {e}"))?;
    Ok(Worker {
        label,
        url: format!("http://127.0.0.1:{port}"),
        dir,
        group,
        bare: true,
    })
}

/// Bundles the worker of `from`'s `wrangler.toml`, whose script is `main`,
/// into `dir/bundle` with `wrangler deploy --dry-run`; its modules as capnp
/// list items, the main one first.
fn bundle(from: &Path, dir: &Path, main: &Path) -> Result<String, String> {
    let out = Command::new(repo().join("node_modules/.bin/wrangler"))
        .args(["deploy", "--dry-run", "--outdir"])
        .arg(dir.join("bundle"))
        .current_dir(from)
        .env("WRANGLER_SEND_METRICS", "false")
        .env("WRANGLER_SEND_ERROR_REPORTS", "false")
        .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
        .env("WRANGLER_LOG_PATH", dir.join("wrangler-debug.log"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run wrangler deploy --dry-run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "wrangler deploy --dry-run in {} failed: {}",
            from.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let stem = main.file_stem().unwrap_or_default().to_string_lossy();
    let first = format!("{stem}.js");
    let mut names: Vec<String> = std::fs::read_dir(dir.join("bundle"))
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".js") || n.ends_with(".wasm"))
        .collect();
    names.sort_by_key(|n| (*n != first, n.clone()));
    if names.first() != Some(&first) {
        return Err(format!(
            "wrangler's bundle of {} has no {first}",
            from.display()
        ));
    }
    Ok(names
        .iter()
        .map(|n| {
            let kind = if n.ends_with(".wasm") {
                "wasm"
            } else {
                "esModule"
            };
            format!("    (name = \"{n}\", {kind} = embed \"bundle/{n}\"),\n")
        })
        .collect())
}

/// `[vars]` as capnp bindings, each value in a file of its own under
/// `dir/vars` (embedded, so nothing needs escaping).
fn bindings(dir: &Path, vars: toml::Table) -> Result<String, String> {
    let mut out = String::new();
    for (name, value) in vars {
        let (kind, body) = match value {
            toml::Value::String(s) => ("text", s),
            other => (
                "json",
                serde_json::to_string(&other).map_err(|e| format!("var {name}: {e}"))?,
            ),
        };
        std::fs::write(dir.join("vars").join(&name), body).map_err(|e| e.to_string())?;
        out.push_str(&format!(
            "    (name = \"{name}\", {kind} = embed \"vars/{name}\"),\n"
        ));
    }
    Ok(out)
}
