//! A worker in a `workerd serve` of its own, as production runs it: no
//! wrangler, no inspector, no proxy in front. `wrangler dev` hides failures
//! production has (a request doing I/O in another request's context went
//! unnoticed there), so tests and the bench run the worker this way too.
//!
//! The worker is bundled as `wrangler deploy` would upload it (`--dry-run
//! --outdir`, offline), and its `[vars]` and `.dev.vars` become workerd
//! bindings: strings as text, tables as JSON, as Cloudflare gives them.

use std::{
    io,
    path::Path,
    process::{Command, Stdio},
};

use crate::testenv::{free_port, repo, ProcessGroup};

/// Where the workerd writes its errors and the worker's console lines: to a
/// file, where production sends them to Workers Logs and `wrangler dev`
/// through the inspector.
pub const LOG: &str = "workerd.log";

/// A workerd serving one worker; killed when dropped.
pub struct Bare {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The workerd process.
    pub process: ProcessGroup,
}

/// Starts the worker that `wrangler dev` would run from `project` (its
/// `wrangler.toml`: script, vars, compatibility date and flags; and its
/// `.dev.vars`, if any) in a workerd of its own, with its files in `dir`;
/// returns once workerd is started, before it listens.
pub fn start(project: &Path, dir: &Path) -> Result<Bare, String> {
    start_with_v8(project, dir, &[])
}

/// [`start`], with these flags for workerd's V8 (`--trace-gc-nvp` writes
/// a line per collection to [`LOG`]).
pub fn start_with_v8(project: &Path, dir: &Path, v8_flags: &[&str]) -> Result<Bare, String> {
    let fail =
        |what: &str, e: &dyn std::fmt::Display| format!("{}: {what}: {e}", project.display());
    let text = std::fs::read_to_string(project.join("wrangler.toml"))
        .map_err(|e| fail("wrangler.toml", &e))?;
    let toml: toml::Table = text.parse().map_err(|e| fail("wrangler.toml", &e))?;
    let setting = |key: &str| {
        toml.get(key)
            .ok_or_else(|| fail("wrangler.toml", &format!("no {key}")))
    };
    std::fs::create_dir_all(dir.join("vars")).map_err(|e| fail("vars", &e))?;
    let main = Path::new(setting("main")?.as_str().unwrap_or_default());
    let modules = bundle(project, dir, main)?;
    let mut vars = toml
        .get("vars")
        .and_then(|v| v.as_table())
        .cloned()
        .unwrap_or_default();
    if let Ok(secrets) = std::fs::read_to_string(project.join(".dev.vars")) {
        for (name, value) in secrets.lines().filter_map(|l| l.split_once('=')) {
            vars.insert(
                name.trim().to_owned(),
                toml::Value::String(value.trim().to_owned()),
            );
        }
    }
    let bindings = bindings(dir, vars).map_err(|e| fail("vars", &e))?;
    let date = setting("compatibility_date")?;
    let empty = toml::Value::Array(vec![]);
    let flags = toml.get("compatibility_flags").unwrap_or(&empty);
    let port = free_port();
    let v8_flags = toml::Value::Array(v8_flags.iter().map(|&f| f.into()).collect());
    let config = format!(
        "using Workerd = import \"/workerd/workerd.capnp\";\n\n\
         const config :Workerd.Config = (\n  services = [\n    (name = \"main\", worker = .worker),\n    \
         # Without private and local, fetches to 127.0.0.1 are refused.\n    \
         (name = \"net\", network = (allow = [\"public\", \"private\", \"local\"])),\n  ],\n  \
         sockets = [(name = \"http\", address = \"127.0.0.1:{port}\", http = (), service = \"main\")],\n  \
         v8Flags = {v8_flags},\n);\n\n\
         const worker :Workerd.Worker = (\n  modules = [\n{modules}  ],\n  \
         compatibilityDate = {date},\n  compatibilityFlags = {flags},\n  \
         bindings = [\n{bindings}  ],\n  globalOutbound = \"net\",\n);\n"
    );
    std::fs::write(dir.join("workerd.capnp"), config).map_err(|e| fail("workerd.capnp", &e))?;
    let log = std::fs::File::create(dir.join(LOG)).map_err(|e| fail(LOG, &e))?;
    let process = ProcessGroup::spawn(
        Command::new(repo().join("node_modules/.bin/workerd"))
            .args(["serve", "workerd.capnp"])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| fail(LOG, &e))?)
            .stderr(log),
    )
    .map_err(|e| fail("workerd", &e))?;
    Ok(Bare {
        url: format!("http://127.0.0.1:{port}"),
        process,
    })
}

/// `wrangler deploy --dry-run` of `project` into `dir/bundle`: the modules
/// it would upload, as capnp entries, the one `main` names first.
fn bundle(project: &Path, dir: &Path, main: &Path) -> Result<String, String> {
    let out = Command::new(repo().join("node_modules/.bin/wrangler"))
        .args(["deploy", "--dry-run", "--outdir"])
        .arg(dir.join("bundle"))
        .current_dir(project)
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
            project.display(),
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
            project.display()
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

/// `vars` as capnp bindings, each value in a file of its own under
/// `dir/vars` (embedded, so nothing needs escaping).
fn bindings(dir: &Path, vars: toml::Table) -> io::Result<String> {
    let mut out = String::new();
    for (name, value) in vars {
        let (kind, body) = match value {
            toml::Value::String(s) => ("text", s),
            other => (
                "json",
                serde_json::to_string(&other).map_err(io::Error::other)?,
            ),
        };
        std::fs::write(dir.join("vars").join(&name), body)?;
        out.push_str(&format!(
            "    (name = \"{name}\", {kind} = embed \"vars/{name}\"),\n"
        ));
    }
    Ok(out)
}
