//! A Redis, an endpoint in front of it, and an HTTP client, per test.

#![allow(dead_code)] // Each test binary uses a different part.

use edge_limiter_local::testenv::{Endpoint, RedisServer};
use serde_json::Value as Json;

pub const TOKEN: &str = "test-token";

pub struct Env {
    pub redis: RedisServer,
    pub endpoint: Endpoint,
    pub http: reqwest::Client,
}

/// A reply: status, body as JSON, and the sync token header.
pub struct Reply {
    pub status: u16,
    pub body: Json,
    pub sync_token: Option<u64>,
}

impl Env {
    pub fn start() -> Env {
        let redis = RedisServer::start();
        let endpoint = Endpoint::start(&redis.addr(), TOKEN);
        Env {
            redis,
            endpoint,
            http: reqwest::Client::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint.url())
    }

    /// POSTs `body` with the right token, plain encoding.
    pub async fn post(&self, path: &str, body: Json) -> Reply {
        self.send(
            self.http
                .post(self.url(path))
                .bearer_auth(TOKEN)
                .json(&body),
        )
        .await
    }

    /// POSTs `body` with the right token and `Upstash-Encoding: base64`.
    pub async fn post_b64(&self, path: &str, body: Json) -> Reply {
        let req = self
            .http
            .post(self.url(path))
            .bearer_auth(TOKEN)
            .header("Upstash-Encoding", "base64")
            .json(&body);
        self.send(req).await
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> Reply {
        let res = req.send().await.expect("endpoint reachable");
        let status = res.status().as_u16();
        let sync_token = res
            .headers()
            .get("upstash-sync-token")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let text = res.text().await.expect("body");
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("reply is not JSON ({e}): {text:?}"));
        Reply {
            status,
            body,
            sync_token,
        }
    }
}
