//! `edge-limiter inspect` and `reset` end to end: a client exhausted through
//! the built worker in `wrangler dev`, inspected and reset through the same
//! REST endpoint the worker uses, and admitted again; and every setting
//! that can be wrong, named in one line without the token.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use edge_limiter_local::testenv::Scratch;
use reqwest::StatusCode;
use serde_json::Value;
use support::{tls::TlsFront, worker::Stack, Backend, TOKEN};

/// The block cache holds a denial 2 s at a time, so that the test can see
/// a reset reach the worker.
const RULES: &str = r#"
[vars.LIMITER]
cache_hold = "2s"

[[vars.LIMITER.rules]]
name = "login"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 3

[[vars.LIMITER.rules]]
name = "api"
path_prefix = "/api"
key = ["ip", "header:x-api-key"]
algorithm = "windowed"
windows = [["1m", 4, "1s"], ["1h", 10, "1m"]]
"#;

/// A directory holding the same rules as a wrangler.toml, where the
/// command runs.
fn workdir() -> Scratch {
    let dir = Scratch::new("inspect-test");
    std::fs::write(dir.join("wrangler.toml"), RULES).unwrap();
    dir
}

/// Runs the command in `dir` with these REST settings in the environment
/// (none: only what `.dev.vars` there says).
fn command(dir: &Path, settings: Option<(&str, &str)>, args: &[&str]) -> (i32, String, String) {
    output(cli(dir, settings, args))
}

/// The command, to run in `dir` with these REST settings.
fn cli(dir: &Path, settings: Option<(&str, &str)>, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_edge-limiter"));
    cmd.args(args)
        .current_dir(dir)
        .env_remove("UPSTASH_REDIS_REST_URL")
        .env_remove("UPSTASH_REDIS_REST_TOKEN");
    if let Some((url, token)) = settings {
        cmd.env("UPSTASH_REDIS_REST_URL", url)
            .env("UPSTASH_REDIS_REST_TOKEN", token);
    }
    cmd
}

/// Exit code, stdout and stderr.
fn output(mut cmd: Command) -> (i32, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// REST settings, the command's arguments, and what its error must say.
type Case<'a> = (Option<(&'a str, &'a str)>, &'a [&'a str], &'a str);

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

async fn get(url: &str, ip: &str) -> StatusCode {
    support::http()
        .get(url)
        .header("CF-Connecting-IP", ip)
        .header("X-Api-Key", "k1")
        .send()
        .await
        .expect("the worker answers")
        .status()
}

#[tokio::test]
async fn a_client_exhausted_through_the_worker_is_inspected_reset_and_admitted_again() {
    let stack = Stack::start(RULES);
    let rest = stack.backend.endpoint.url();
    let dir = workdir();
    let api = format!("{}/api/items", stack.worker.url);
    let settings = Some((rest.as_str(), TOKEN));

    // Two clients spend login's burst of 3 (and 3 of api's 4 a minute).
    for ip in ["203.0.113.9", "203.0.113.10"] {
        for _ in 0..3 {
            assert_eq!(
                get(&api, ip).await,
                StatusCode::OK,
                "{}",
                stack.worker.log()
            );
        }
    }

    // Nothing left on login, three minutes of debt; api per window.
    let (code, out, err) = command(
        &dir,
        settings,
        &["inspect", "login", "203.0.113.9", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let login = json(&out);
    assert_eq!(login["key"], "el:{203.0.113.9}:login");
    assert_eq!(login["windows"][0]["limit"], 3);
    assert_eq!(login["windows"][0]["remaining"], 0);
    let reset_after = login["windows"][0]["reset_after_ms"].as_u64().unwrap();
    assert!((170_000..=180_000).contains(&reset_after), "{login}");
    assert_eq!(login["penalty_ms"], Value::Null);
    let (code, out, err) = command(
        &dir,
        settings,
        &["inspect", "api", "203.0.113.9", "k1", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let api_state = json(&out);
    let remaining: Vec<u64> = api_state["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["remaining"].as_u64().unwrap())
        .collect();
    assert_eq!(remaining, [1, 7], "{api_state}");
    // An inspection consumes nothing: the same again.
    let (_, again, _) = command(
        &dir,
        settings,
        &["inspect", "api", "203.0.113.9", "k1", "--json"],
    );
    assert_eq!(json(&again)["windows"][1]["remaining"], 7);

    // The settings can come from .dev.vars in the working directory, as
    // wrangler reads them; the text form shows every window.
    std::fs::write(
        dir.join(".dev.vars"),
        format!("UPSTASH_REDIS_REST_URL={rest}\nUPSTASH_REDIS_REST_TOKEN=\"{TOKEN}\"\n"),
    )
    .unwrap();
    let (code, out, err) = command(&dir, None, &["inspect", "api", "203.0.113.9", "k1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("rule `api`, client 203.0.113.9 | k1 (key el:{203.0.113.9|k1}:api):\n"),
        "{out}"
    );
    assert!(
        out.contains("  window 60000ms by 1000ms: 1 of 4 left, all back in "),
        "{out}"
    );
    assert!(
        out.contains("  window 3600000ms by 60000ms: 7 of 10 left, "),
        "{out}"
    );

    // Reset one client; the other stays as it was.
    let (code, out, err) = command(&dir, settings, &["reset", "login", "203.0.113.9"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("rule `login`, client 203.0.113.9: removed el:{203.0.113.9}:login (1 key), which held:\n"),
        "{out}"
    );
    assert!(out.contains("0 of 3 left"), "{out}");
    assert_eq!(
        get(&api, "203.0.113.10").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let denied_at = Instant::now();
    assert_eq!(
        get(&api, "203.0.113.9").await,
        StatusCode::OK,
        "{}",
        stack.worker.log()
    );

    // A client the worker has just denied is answered from its block cache
    // for a while after a reset, but no longer than `cache_hold`.
    let (code, _, err) = command(&dir, settings, &["reset", "login", "203.0.113.10"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        get(&api, "203.0.113.10").await,
        StatusCode::TOO_MANY_REQUESTS,
        "served from the cache"
    );
    let hold = Duration::from_secs(2);
    tokio::time::sleep((denied_at + hold).saturating_duration_since(Instant::now())).await;
    assert_eq!(
        get(&api, "203.0.113.10").await,
        StatusCode::OK,
        "{}",
        stack.worker.log()
    );
    let (_, out, _) = command(
        &dir,
        settings,
        &["inspect", "login", "203.0.113.9", "--json"],
    );
    assert_eq!(json(&out)["windows"][0]["remaining"], 2);
    // A second reset finds what the one request left; a client never seen, nothing.
    let (_, out, _) = command(
        &dir,
        settings,
        &["reset", "login", "203.0.113.99", "--json"],
    );
    assert_eq!(json(&out)["deleted"], 0);

    // What can be wrong, each in one line that names the setting, exit 1,
    // and never the token.
    let wrong_token = "wrong-token-5b1e";
    let port = edge_limiter_local::testenv::free_port();
    let unreachable = format!("http://127.0.0.1:{port}");
    let cases: [Case<'_>; 4] = [
        (
            Some((rest.as_str(), wrong_token)),
            &["inspect", "login", "203.0.113.9"],
            "UPSTASH_REDIS_REST_TOKEN",
        ),
        (
            Some((unreachable.as_str(), TOKEN)),
            &["reset", "login", "203.0.113.9"],
            "UPSTASH_REDIS_REST_URL",
        ),
        (
            settings,
            &["inspect", "logn", "203.0.113.9"],
            "no rule `logn` in the configuration; its rules are: login, api",
        ),
        (
            settings,
            &["inspect", "api", "203.0.113.9"],
            "rule `api`: the rule is keyed on [ip, header:x-api-key]: give 2 value(s)",
        ),
    ];
    for (settings, args, needle) in cases {
        let (code, out, err) = command(&dir, settings, args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        support::report::assert_no_secret(wrong_token, "the command's output", [err.as_str()]);
        support::report::assert_no_secret(TOKEN, "the command's output", [err.as_str()]);
    }
    std::fs::remove_file(dir.join(".dev.vars")).unwrap();
    let (code, _, err) = command(&dir, None, &["inspect", "login", "203.0.113.9"]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "edge-limiter: UPSTASH_REDIS_REST_URL is not set: set it in the environment or in .dev.vars in this directory\n"
    );
}

/// A rule with a penalty, and a short block-cache hold.
const PENALTY_RULES: &str = r#"
[vars.LIMITER]
cache_hold = "1s"

[[vars.LIMITER.rules]]
name = "strict"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
penalty = "10m"
"#;

/// A client held by a running penalty: `inspect` shows what is left of it,
/// and `reset` removes it with the rule's state, so the client is admitted
/// again once the worker's cache hold has passed.
#[tokio::test]
async fn a_running_penalty_is_inspected_and_reset_with_the_rule() {
    let stack = Stack::start(PENALTY_RULES);
    let rest = stack.backend.endpoint.url();
    let settings = Some((rest.as_str(), TOKEN));
    let dir = workdir();
    std::fs::write(dir.join("wrangler.toml"), PENALTY_RULES).unwrap();
    let url = format!("{}/", stack.worker.url);
    let ip = "203.0.113.40";
    assert_eq!(get(&url, ip).await, StatusCode::OK);
    assert_eq!(get(&url, ip).await, StatusCode::TOO_MANY_REQUESTS);
    // The worker cached the denial before this instant.
    let denied_at = Instant::now();

    let (code, out, err) = command(&dir, settings, &["inspect", "strict", ip, "--json"]);
    assert_eq!(code, 0, "{err}");
    let state = json(&out);
    let left = state["penalty_ms"].as_u64().unwrap_or(0);
    assert!((590_000..=600_000).contains(&left), "ten minutes: {state}");
    let (code, out, _) = command(&dir, settings, &["inspect", "strict", ip]);
    assert_eq!(code, 0);
    assert!(out.contains("penalty"), "the text form names it: {out}");

    let (code, out, err) = command(&dir, settings, &["reset", "strict", ip, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["deleted"], 2, "state and penalty: {out}");
    let (_, out, _) = command(&dir, settings, &["inspect", "strict", ip, "--json"]);
    assert_eq!(json(&out)["penalty_ms"], Value::Null, "{out}");
    let keys = stack.backend.redis(&["KEYS", "el:*:strict*"]);
    assert!(keys.trim().is_empty(), "nothing left: {keys}");

    // Past the worker's cache hold (and a little: its clock moves only
    // when a request comes in), the client is admitted again.
    let hold = Duration::from_millis(1200);
    tokio::time::sleep((denied_at + hold).saturating_duration_since(Instant::now())).await;
    assert_eq!(
        get(&url, ip).await,
        StatusCode::OK,
        "{}",
        stack.worker.log()
    );
}

/// The commands reach the REST endpoint over https, as hosted Upstash
/// serves it, and check its certificate: one they cannot trust fails the
/// command with the reason, not a bare "error sending request".
#[test]
fn the_commands_speak_https_and_name_a_certificate_they_cannot_trust() {
    let backend = Backend::start();
    let plain = backend.endpoint.url();
    let front = TlsFront::start(plain.trim_start_matches("http://"));
    let dir = workdir();
    let args = ["inspect", "login", "203.0.113.9", "--json"];

    let (code, over_http, err) = command(&dir, Some((&plain, TOKEN)), &args);
    assert_eq!(code, 0, "{err}");
    let mut trusting = cli(&dir, Some((&front.url, TOKEN)), &args);
    trusting.env("SSL_CERT_FILE", &front.cert);
    let (code, over_https, err) = output(trusting);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&over_https), json(&over_http));
    let mut reset = cli(
        &dir,
        Some((&front.url, TOKEN)),
        &["reset", "login", "203.0.113.9"],
    );
    reset.env("SSL_CERT_FILE", &front.cert);
    let (code, _, err) = output(reset);
    assert_eq!(code, 0, "{err}");

    let mut doubting = cli(&dir, Some((&front.url, TOKEN)), &args);
    doubting.env_remove("SSL_CERT_FILE");
    let (code, out, err) = output(doubting);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains("could not reach the Redis REST endpoint")
            && err.contains("certificate verify failed"),
        "{err}"
    );
}
