//! Auth, HTTP-level errors, Redis going away and coming back, and the CLI.

mod common;

use std::process::Command;

use common::{Env, TOKEN};
use edge_limiter_local::testenv::endpoint_binary;
use serde_json::json;

#[tokio::test]
async fn missing_or_wrong_token_is_401() {
    let env = Env::start();
    let wrongpass = json!({ "error": "WRONGPASS invalid or missing auth token" });
    let url = env.url("/");
    let attempts = [
        env.http.post(&url).json(&json!(["PING"])),
        env.http
            .post(&url)
            .bearer_auth("wrong")
            .json(&json!(["PING"])),
        env.http
            .post(&url)
            .header("Authorization", TOKEN)
            .json(&json!(["PING"])),
        env.http
            .post(env.url("/pipeline?_token=wrong"))
            .json(&json!([["PING"]])),
        env.http.get(env.url("/ping")),
    ];
    for req in attempts {
        let reply = env.send(req).await;
        assert_eq!((reply.status, reply.body), (401, wrongpass.clone()));
    }
    let by_query = env
        .http
        .post(env.url(&format!("/?_token={TOKEN}")))
        .json(&json!(["PING"]));
    assert_eq!(env.send(by_query).await.body, json!({ "result": "PONG" }));
}

#[tokio::test]
async fn wrong_method_is_405() {
    let env = Env::start();
    for req in [
        env.http.get(env.url("/")),
        env.http.get(env.url("/pipeline")),
        env.http.put(env.url("/multi-exec")),
        env.http.delete(env.url("/get/k")),
    ] {
        let reply = env.send(req.bearer_auth(TOKEN)).await;
        assert_eq!(reply.status, 405);
        assert!(reply.body["error"].is_string());
    }
}

#[tokio::test]
async fn oversized_body_is_413() {
    let env = Env::start();
    let big = "x".repeat(edge_limiter_local::DEFAULT_MAX_BODY_BYTES);
    let reply = env.post("/", json!(["SET", "k", big])).await;
    assert_eq!(reply.status, 413);
    assert!(reply.body["error"].as_str().unwrap().contains("exceeds"));
    // Just under the limit still works.
    let fits = "x".repeat(edge_limiter_local::DEFAULT_MAX_BODY_BYTES - 100);
    assert_eq!(env.post("/", json!(["SET", "k", fits])).await.status, 200);
}

#[tokio::test]
async fn malformed_bodies_are_400_with_a_reason() {
    let env = Env::start();
    let cases: [(&str, &str, &str); 7] = [
        ("/", "{", "not valid JSON"),
        ("/", "", "not valid JSON"),
        ("/", r#"{"cmd":"GET"}"#, "must be a JSON array"),
        ("/", "[]", "is empty"),
        (
            "/",
            r#"["SET","k",{"a":1}]"#,
            "argument 2 of the command is an object",
        ),
        (
            "/pipeline",
            r#"[["GET","k"],[null]]"#,
            "argument 0 of command 1",
        ),
        ("/multi-exec", r#"["GET","k"]"#, "command 0"),
    ];
    for (path, body, reason) in cases {
        let req = env.http.post(env.url(path)).bearer_auth(TOKEN).body(body);
        let reply = env.send(req).await;
        assert_eq!(reply.status, 400, "{body}");
        let error = reply.body["error"].as_str().unwrap();
        assert!(
            error.starts_with("ERR ") && error.contains(reason),
            "{body}: {error}"
        );
    }
    // No Content-Type at all is fine, as on hosted Upstash.
    let bare = env
        .http
        .post(env.url("/"))
        .bearer_auth(TOKEN)
        .body(r#"["PING"]"#);
    assert_eq!(env.send(bare).await.body, json!({ "result": "PONG" }));
}

#[tokio::test]
async fn redis_down_is_503_and_recovery_is_automatic() {
    let mut env = Env::start();
    // Leaves an idle pooled connection that the restart will break.
    assert_eq!(env.post("/", json!(["SET", "k", "v"])).await.status, 200);
    env.redis.stop();
    for path in ["/", "/pipeline", "/multi-exec"] {
        let body = if path == "/" {
            json!(["GET", "k"])
        } else {
            json!([["GET", "k"]])
        };
        let reply = env.post(path, body).await;
        assert_eq!(reply.status, 503, "{path}");
        let error = reply.body["error"].as_str().unwrap();
        assert!(error.starts_with("ERR redis unreachable: "), "{error}");
    }
    env.redis.restart();
    // The very first request after the restart already succeeds: the data is gone
    // (no persistence), the endpoint reconnected by itself.
    assert_eq!(
        env.post("/", json!(["GET", "k"])).await.body,
        json!({ "result": null })
    );
    assert_eq!(
        env.post("/multi-exec", json!([["SET", "k", "w"], ["GET", "k"]]))
            .await
            .body,
        json!([{ "result": "OK" }, { "result": "w" }])
    );

    // And a restart that happens while connections sit idle in the pool.
    env.redis.restart();
    for _ in 0..3 {
        assert_eq!(env.post("/", json!(["PING"])).await.status, 200);
    }
}

#[test]
fn cli_rejects_bad_arguments_with_exit_2() {
    let bin = endpoint_binary();
    let cases: [(&[&str], &str); 4] = [
        (&["--listen", "127.0.0.1:0"], "--token"),
        (&["--token", "t", "--listen", "not-an-addr"], "--listen"),
        (
            &["--token", "t", "--max-body-bytes", "lots"],
            "--max-body-bytes",
        ),
        (&["--token", "t", "--frobnicate"], "--frobnicate"),
    ];
    for (args, flag) in cases {
        let out = Command::new(&bin)
            .args(args)
            .env_remove("UPSTASH_LOCAL_TOKEN")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn cli_reads_env_defaults() {
    let redis = edge_limiter_local::testenv::RedisServer::start();
    let mut child = Command::new(endpoint_binary())
        .env("UPSTASH_LOCAL_LISTEN", "127.0.0.1:0")
        .env("UPSTASH_LOCAL_REDIS", redis.addr())
        .env("UPSTASH_LOCAL_TOKEN", "env-token")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .expect(&line)
        .to_string();
    let res = reqwest::Client::new()
        .post(url)
        .bearer_auth("env-token")
        .json(&json!(["PING"]))
        .send()
        .await;
    child.kill().unwrap();
    child.wait().unwrap();
    let body: serde_json::Value = res.unwrap().json().await.unwrap();
    assert_eq!(body, json!({ "result": "PONG" }));
}
