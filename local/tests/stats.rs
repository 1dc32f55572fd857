//! `GET /__stats`, the request counter benchmarks use to count round trips.

mod common;

use common::{Env, TOKEN};
use serde_json::json;

async fn stats(env: &Env) -> serde_json::Value {
    let reply = env
        .send(env.http.get(env.url("/__stats")).bearer_auth(TOKEN))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.body
}

async fn requests(env: &Env) -> u64 {
    stats(env).await["requests"].as_u64().expect("a count")
}

#[tokio::test]
async fn counts_every_request_but_its_own() {
    let env = Env::start();
    assert_eq!(requests(&env).await, 0);
    assert_eq!(requests(&env).await, 0, "reading the count is not counted");

    env.post("/", json!(["PING"])).await;
    // A pipeline is one round trip, however many commands it carries.
    env.post("/pipeline", json!([["PING"], ["PING"]])).await;
    // Refused and failed requests were round trips too.
    let refused = env.send(env.http.post(env.url("/"))).await;
    assert_eq!(refused.status, 401);
    let failed = env.post("/", json!(["NOSUCHCOMMAND"])).await;
    assert_eq!(failed.status, 400);
    assert_eq!(requests(&env).await, 4);
}

#[tokio::test]
async fn counts_the_commands_each_request_carried() {
    let env = Env::start();
    env.post("/", json!(["PING"])).await;
    env.post("/pipeline", json!([["PING"], ["PING"], ["PING"]]))
        .await;
    env.post("/multi-exec", json!([["PING"], ["PING"]])).await;
    env.post("/pipeline", json!([["PING"], ["PING"], ["PING"]]))
        .await;
    env.send(env.http.get(env.url("/echo/x")).bearer_auth(TOKEN))
        .await;
    // Refused before its commands were read: a round trip carrying none.
    env.send(env.http.post(env.url("/pipeline"))).await;
    assert_eq!(
        stats(&env).await,
        json!({
            "requests": 6,
            "commands": 10,
            "carrying": {"1": 2, "2": 1, "3": 2},
        })
    );
}

#[tokio::test]
async fn needs_the_token() {
    let env = Env::start();
    let anonymous = env.send(env.http.get(env.url("/__stats"))).await;
    assert_eq!(anonymous.status, 401);
}
