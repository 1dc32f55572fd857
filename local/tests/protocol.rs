//! The protocol doc's test vectors and the script shebang handling, against a real
//! redis-server behind the real `upstash-local` binary.

mod common;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use common::{Env, TOKEN};
use edge_limiter_local::resp::Value;
use edge_limiter_local::testenv::{redis_call, redis_cli};
use serde_json::json;

fn sha1_hex(s: &[u8]) -> String {
    sha1_smol::Sha1::from(s).digest().to_string()
}

#[tokio::test]
async fn vector_1_set_and_get_missing() {
    let env = Env::start();
    let set = env.post("/", json!(["SET", "foo", "bar"])).await;
    assert_eq!((set.status, set.body), (200, json!({ "result": "OK" })));
    let missing = env.post("/", json!(["GET", "missing"])).await;
    assert_eq!(missing.status, 200);
    // The key must be there even though the value is null.
    assert!(missing.body.as_object().unwrap().contains_key("result"));
    assert_eq!(missing.body, json!({ "result": null }));
    assert_eq!(
        env.post("/", json!(["get", "foo"])).await.body,
        json!({ "result": "bar" })
    );
}

#[tokio::test]
async fn vector_2_base64_encodes_strings_but_not_ok_numbers_or_null() {
    let env = Env::start();
    assert_eq!(
        env.post_b64("/", json!(["SET", "foo", "bar"])).await.body,
        json!({ "result": "OK" })
    );
    assert_eq!(
        env.post_b64("/", json!(["GET", "foo"])).await.body,
        json!({ "result": "YmFy" })
    );
    assert_eq!(
        env.post_b64("/", json!(["GET", "nope"])).await.body,
        json!({ "result": null })
    );
    assert_eq!(
        env.post_b64("/", json!(["INCR", "n"])).await.body,
        json!({ "result": 1 })
    );
    assert_eq!(
        env.post_b64("/", json!(["PING"])).await.body,
        json!({ "result": "UE9ORw==" })
    );
    env.post("/", json!(["RPUSH", "l", "a", "b"])).await;
    assert_eq!(
        env.post_b64("/", json!(["LRANGE", "l", 0, -1])).await.body,
        json!({ "result": ["YQ==", "Yg=="] })
    );
    // Errors are never encoded.
    let err = env.post_b64("/", json!(["LPOP", "foo"])).await;
    assert_eq!(err.status, 400);
    assert_eq!(
        err.body,
        json!({ "error": "WRONGTYPE Operation against a key holding the wrong kind of value" })
    );
}

#[tokio::test]
async fn vector_3_pipeline_entry_errors_leave_the_others_alone() {
    let env = Env::start();
    let body = json!([
        ["SET", "k", "v"],
        ["EVALSHA", "0000000000000000000000000000000000000000", 0],
        ["GET", "k"],
        ["INCR", "k"],
        ["INCRBY", "n", 5],
    ]);
    let reply = env.post("/pipeline", body.clone()).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.body,
        json!([
            { "result": "OK" },
            { "error": "NOSCRIPT No matching script. Please use EVAL." },
            { "result": "v" },
            { "error": "ERR value is not an integer or out of range" },
            { "result": 5 },
        ])
    );
    let b64 = env.post_b64("/pipeline", body).await;
    assert_eq!(b64.body[0], json!({ "result": "OK" }));
    assert_eq!(b64.body[2], json!({ "result": "dg==" }));
    assert_eq!(b64.body[4], json!({ "result": 10 }));
    assert_eq!(env.post("/pipeline", json!([])).await.body, json!([]));
}

#[tokio::test]
async fn vector_4_evalsha_after_eval() {
    let env = Env::start();
    let src = "return {KEYS[1], ARGV[1], 3, 2.9, true, false, {1, 'x'}}";
    let eval = env.post("/", json!(["EVAL", src, 1, "key", "arg"])).await;
    // Redis's own Lua conversion: truncated numbers, true -> 1, false -> nil.
    let expected = json!({ "result": ["key", "arg", 3, 2, 1, null, [1, "x"]] });
    assert_eq!(eval.body, expected);
    let evalsha = env
        .post(
            "/",
            json!(["EVALSHA", sha1_hex(src.as_bytes()), 1, "key", "arg"]),
        )
        .await;
    assert_eq!(evalsha.body, expected);
    let lua_error = env
        .post(
            "/",
            json!(["EVAL", "return redis.error_reply('MY failure')", 0]),
        )
        .await;
    assert_eq!(
        (lua_error.status, lua_error.body),
        (400, json!({ "error": "MY failure" }))
    );
}

#[tokio::test]
async fn vector_5_emoji_and_bytes_round_trip() {
    let env = Env::start();
    let text = "emoji 😀👍🏽, accents é ü, nul \u{0} ctrl \u{1}\u{7f}, cjk 漢字, quote \" \\ end";
    env.post("/", json!(["SET", "t", text])).await;
    assert_eq!(
        env.post("/", json!(["GET", "t"])).await.body,
        json!({ "result": text })
    );
    assert_eq!(
        env.post_b64("/", json!(["GET", "t"])).await.body,
        json!({ "result": BASE64.encode(text) })
    );
    assert_eq!(
        redis_call(&env.redis.addr(), &["GET", "t"]),
        Value::Bulk(text.into())
    );

    // Bytes that are not UTF-8 cannot travel in a JSON request, so write them directly.
    let bytes: Vec<u8> = (0..=255u8).rev().collect();
    redis_call(&env.redis.addr(), &[&b"SET"[..], b"b", &bytes]);
    assert_eq!(
        env.post_b64("/", json!(["GET", "b"])).await.body,
        json!({ "result": BASE64.encode(&bytes) })
    );
    // Without base64 they arrive lossily converted, as documented.
    let lossy = String::from_utf8_lossy(&bytes).into_owned();
    assert_eq!(
        env.post("/", json!(["GET", "b"])).await.body,
        json!({ "result": lossy })
    );

    // Path style carries a raw body as the last argument, any bytes.
    let req = env
        .http
        .post(env.url("/set/raw"))
        .bearer_auth(TOKEN)
        .body(bytes.clone());
    assert_eq!(env.send(req).await.body, json!({ "result": "OK" }));
    assert_eq!(
        redis_call(&env.redis.addr(), &["GET", "raw"]),
        Value::Bulk(bytes)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vector_6_concurrent_transactions_never_interleave() {
    let env = Env::start();
    // Redis reads a client's input 16 KiB at a time and serves other clients between
    // reads, so without MULTI/EXEC other requests' INCRs would land inside the padding.
    let padding = "p".repeat(64 * 1024);
    let mut tasks = Vec::new();
    for i in 0..32 {
        let http = env.http.clone();
        let url = env.url("/multi-exec");
        let body = json!([
            ["INCR", "k"],
            ["SET", format!("pad{i}"), padding],
            ["INCR", "other"],
            ["INCR", "k"],
            ["GET", "k"],
        ]);
        tasks.push(tokio::spawn(async move {
            let res = http
                .post(url)
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            res.json::<serde_json::Value>().await.unwrap()
        }));
    }
    let mut firsts = Vec::new();
    for task in tasks {
        let body = task.await.unwrap();
        let first = body[0]["result"].as_i64().unwrap();
        assert_eq!(body[3]["result"], json!(first + 1), "{body}");
        assert_eq!(body[4]["result"], json!((first + 1).to_string()), "{body}");
        firsts.push(first);
    }
    firsts.sort();
    assert_eq!(firsts, (0..32).map(|i| 2 * i + 1).collect::<Vec<_>>());
    assert_eq!(redis_cli(&env.redis.addr(), &["GET", "other"]), "32");
}

#[tokio::test]
async fn multi_exec_reports_runtime_errors_per_entry() {
    let env = Env::start();
    let reply = env
        .post_b64(
            "/multi-exec",
            json!([["SET", "s", "x"], ["INCR", "s"], ["GET", "s"]]),
        )
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.body,
        json!([
            { "result": "OK" },
            { "error": "ERR value is not an integer or out of range" },
            { "result": "eA==" },
        ])
    );
}

#[tokio::test]
async fn multi_exec_with_a_queueing_error_runs_nothing() {
    let env = Env::start();
    let reply = env
        .post(
            "/multi-exec",
            json!([["SET", "a", "1"], ["NOSUCHCMD", "x"], ["SET", "b", "2"]]),
        )
        .await;
    assert_eq!(reply.status, 400);
    let error = reply.body["error"].as_str().unwrap();
    assert!(
        error.starts_with("ERR unknown command 'NOSUCHCMD'"),
        "{error}"
    );
    assert_eq!(
        redis_call(&env.redis.addr(), &["EXISTS", "a", "b"]),
        Value::Int(0)
    );

    let arity = env
        .post("/multi-exec", json!([["SET", "a", "1"], ["GET"]]))
        .await;
    assert_eq!(arity.status, 400);
    assert_eq!(
        arity.body,
        json!({ "error": "ERR wrong number of arguments for 'get' command" })
    );

    let nested = env
        .post("/multi-exec", json!([["SET", "a", "1"], ["exec"]]))
        .await;
    assert_eq!(nested.status, 400);
    assert!(nested.body["error"]
        .as_str()
        .unwrap()
        .starts_with("ERR EXEC is not allowed"));
    assert_eq!(
        redis_call(&env.redis.addr(), &["EXISTS", "a"]),
        Value::Int(0)
    );

    // The connection that saw the aborted transaction still works.
    let after = env
        .post("/multi-exec", json!([["SET", "a", "1"], ["GET", "a"]]))
        .await;
    assert_eq!(after.body, json!([{ "result": "OK" }, { "result": "1" }]));
}

const FLAGGED: &str = "#!lua flags=allow-key-locking\nredis.call('SET', KEYS[1], ARGV[1])\nreturn redis.call('GET', KEYS[1])";

#[tokio::test]
async fn shebang_flag_is_accepted_and_evalsha_uses_the_original_sha() {
    let env = Env::start();
    let redis = env.redis.addr();
    // Stock Redis refuses the script as the client wrote it.
    let refused = redis_call(&redis, &["EVAL", FLAGGED, "0"]);
    assert_eq!(
        refused,
        Value::Error("ERR Unexpected flag in script shebang: allow-key-locking".into())
    );
    let sha = sha1_hex(FLAGGED.as_bytes());
    let evalsha = json!(["evalsha", sha, 1, "k", "v2"]);
    let before = env.post("/", evalsha.clone()).await;
    assert_eq!(
        (before.status, before.body),
        (
            400,
            json!({ "error": "NOSCRIPT No matching script. Please use EVAL." })
        )
    );
    let eval = env.post("/", json!(["eval", FLAGGED, 1, "k", "v1"])).await;
    assert_eq!((eval.status, eval.body), (200, json!({ "result": "v1" })));
    assert_eq!(
        env.post("/", evalsha.clone()).await.body,
        json!({ "result": "v2" })
    );
    // Found under an upper-case SHA1 too; refused only because the script writes.
    let read_only = env
        .post("/", json!(["EVALSHA_RO", sha.to_uppercase(), 1, "k", "x"]))
        .await;
    let error = read_only.body["error"].as_str().unwrap();
    assert!(error.contains("write flag using *_ro"), "{error}");

    assert_eq!(
        env.post(
            "/",
            json!([
                "SCRIPT",
                "EXISTS",
                sha,
                "ffffffffffffffffffffffffffffffffffffffff"
            ])
        )
        .await
        .body,
        json!({ "result": [1, 0] })
    );

    redis_call(&redis, &["SCRIPT", "FLUSH"]);
    let flushed = env
        .post("/pipeline", json!([evalsha.clone(), ["PING"]]))
        .await;
    assert_eq!(
        flushed.body,
        json!([
            { "error": "NOSCRIPT No matching script. Please use EVAL." },
            { "result": "PONG" },
        ])
    );
    // What clients then do: EVAL again, and EVALSHA works again.
    env.post("/", json!(["EVAL", FLAGGED, 1, "k", "v3"])).await;
    assert_eq!(env.post("/", evalsha).await.body, json!({ "result": "v2" }));
}

#[tokio::test]
async fn script_load_of_a_flagged_script_returns_the_original_sha() {
    let env = Env::start();
    let sha = sha1_hex(FLAGGED.as_bytes());
    let loaded = env.post("/", json!(["SCRIPT", "LOAD", FLAGGED])).await;
    assert_eq!(loaded.body, json!({ "result": sha }));
    let loaded_b64 = env.post_b64("/", json!(["script", "load", FLAGGED])).await;
    assert_eq!(loaded_b64.body, json!({ "result": BASE64.encode(&sha) }));
    let run = env
        .post(
            "/multi-exec",
            json!([["EVALSHA", sha, 1, "k", "tx"], ["GET", "k"]]),
        )
        .await;
    assert_eq!(run.body, json!([{ "result": "tx" }, { "result": "tx" }]));
    // A script without the flag goes through untouched.
    let plain = "return 7";
    let loaded = env.post("/", json!(["SCRIPT", "LOAD", plain])).await;
    assert_eq!(loaded.body, json!({ "result": sha1_hex(plain.as_bytes()) }));
}

#[tokio::test]
async fn flagged_script_errors_keep_line_numbers_and_the_original_sha() {
    let env = Env::start();
    // A Lua error keeps its line. (One raised by a Redis command is placed
    // on line 2, where the guard in front of the body calls Redis.)
    let src = "#!lua flags=no-writes,allow-key-locking\nlocal x = nil\nreturn x.y";
    let sha = sha1_hex(src.as_bytes());
    let reply = env.post("/", json!(["EVAL_RO", src, 0])).await;
    assert_eq!(reply.status, 400);
    let error = reply.body["error"].as_str().unwrap();
    assert!(error.starts_with("ERR "), "{error}");
    assert!(
        error.contains("@user_script:3"),
        "line number moved: {error}"
    );
    assert!(error.contains(&sha), "rewritten sha leaked: {error}");
    let unknown = "#!lua flags=allow-key-locking\nreturn redis.call('NOPE')";
    let reply = env.post("/", json!(["EVAL", unknown, 0])).await;
    let error = reply.body["error"].as_str().unwrap();
    assert!(error.starts_with("ERR Unknown Redis command"), "{error}");
    assert!(error.contains(&sha1_hex(unknown.as_bytes())), "{error}");
    let syntax = env
        .post(
            "/",
            json!(["EVAL", "#!lua flags=allow-key-locking\n\nreturn (", 0]),
        )
        .await;
    let error = syntax.body["error"].as_str().unwrap();
    assert!(error.contains("user_script:3:"), "{error}");
}

#[tokio::test]
async fn path_style_commands() {
    let env = Env::start();
    let set = env
        .http
        .get(env.url("/set/p%20k/v1?EX=100"))
        .bearer_auth(TOKEN);
    assert_eq!(env.send(set).await.body, json!({ "result": "OK" }));
    let ttl: i64 = redis_cli(&env.redis.addr(), &["TTL", "p k"])
        .parse()
        .unwrap();
    assert!((1..=100).contains(&ttl), "{ttl}");
    let get = env.http.get(env.url(&format!("/get/p%20k?_token={TOKEN}")));
    assert_eq!(env.send(get).await.body, json!({ "result": "v1" }));
    let post = env
        .http
        .post(env.url("/set/p2"))
        .bearer_auth(TOKEN)
        .body("from body");
    assert_eq!(env.send(post).await.body, json!({ "result": "OK" }));
    assert_eq!(redis_cli(&env.redis.addr(), &["GET", "p2"]), "from body");
    let err = env
        .send(env.http.get(env.url("/nosuchcmd")).bearer_auth(TOKEN))
        .await;
    assert_eq!(err.status, 400);
    assert!(err.body["error"]
        .as_str()
        .unwrap()
        .starts_with("ERR unknown command"));
}

#[tokio::test]
async fn number_and_boolean_arguments_become_their_text() {
    let env = Env::start();
    let body = json!([
        ["SET", "n", 42],
        ["INCRBYFLOAT", "n", 1.5],
        ["SET", "b", true],
        ["GET", "b"]
    ]);
    assert_eq!(
        env.post("/pipeline", body).await.body,
        json!([{ "result": "OK" }, { "result": "43.5" }, { "result": "OK" }, { "result": "true" }])
    );
}

#[tokio::test]
async fn sync_token_increases() {
    let env = Env::start();
    let first = env
        .post("/", json!(["PING"]))
        .await
        .sync_token
        .expect("header");
    let second = env
        .post("/", json!(["PING"]))
        .await
        .sync_token
        .expect("header");
    assert!(second > first);
}

#[tokio::test]
async fn stateful_commands_do_not_leak_to_other_requests() {
    let env = Env::start();
    env.post("/", json!(["SET", "k", "db0"])).await;
    // A pipeline may SELECT or open MULTI; the next request must not inherit that.
    let body = json!([["SELECT", 1], ["SET", "k", "db1"], ["MULTI"], ["GET", "k"]]);
    assert_eq!(env.post("/pipeline", body).await.status, 200);
    for _ in 0..4 {
        assert_eq!(
            env.post("/", json!(["GET", "k"])).await.body,
            json!({ "result": "db0" })
        );
    }
    let sub = env.post("/", json!(["SUBSCRIBE", "ch"])).await;
    assert_eq!(
        (sub.status, sub.body),
        (
            400,
            json!({ "error": "ERR SUBSCRIBE is not supported over REST" })
        )
    );
}

#[tokio::test]
async fn library_bind_serves_in_process() {
    let redis = edge_limiter_local::testenv::RedisServer::start();
    let cfg = edge_limiter_local::ServerConfig::new(redis.addr(), "lib-token");
    let (addr, serving) = edge_limiter_local::bind(cfg).await.unwrap();
    let server = tokio::spawn(serving);
    let res = reqwest::Client::new()
        .post(format!("http://{addr}/"))
        .bearer_auth("lib-token")
        .json(&json!(["ECHO", "hi"]))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.json::<serde_json::Value>().await.unwrap(),
        json!({ "result": "hi" })
    );
    server.abort();
}
