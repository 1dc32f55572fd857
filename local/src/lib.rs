//! A local stand-in for Upstash's Redis REST API in front of a stock `redis-server`.
//!
//! It speaks the protocol described in `shared/upstash-rest-protocol.md`: `POST /`,
//! `/pipeline`, `/multi-exec` and path-style commands, bearer or `_token` auth, and
//! `Upstash-Encoding: base64`. It also accepts the `allow-key-locking` script shebang
//! flag that hosted Upstash allows and Redis 7 rejects, and holds such scripts to the
//! rule Upstash enforces for them (only keys in `KEYS`, nothing database-wide).
//!
//! Without base64 mode, bulk strings that are not UTF-8 reach the client lossily
//! converted (U+FFFD), because JSON strings cannot hold raw bytes; base64 mode is exact.
//!
//! [`testenv`] starts `redis-server` and the `upstash-local` binary for tests,
//! [`fault_proxy`] stands between a client and the endpoint to make it misbehave,
//! and [`hostile`] holds the requests the cost test and the bench send an attacker's way.

#![warn(missing_docs)]

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

pub mod bare;
mod exec;
pub mod fault_proxy;
pub mod hostile;
mod http;
mod json;
pub mod keyspecs;
mod pool;
pub mod resp;
mod scripts;
pub mod testenv;

/// The request body limit when none is given: 1 MiB, as on Upstash's free tier.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;

/// How to run the endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Where to accept HTTP; port 0 picks a free one (see [`bind`]).
    pub listen: SocketAddr,
    /// Redis as `host:port`, or a Unix socket as `unix:/path` or `/path`.
    pub redis: String,
    /// The bearer token clients must present.
    pub token: String,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
}

impl ServerConfig {
    /// A config on `127.0.0.1:0` with the default body limit.
    pub fn new(redis: impl Into<String>, token: impl Into<String>) -> ServerConfig {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            redis: redis.into(),
            token: token.into(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// Binds the listener and returns its address with the future that serves it.
///
/// Redis is not contacted until the first request, so the endpoint can start before
/// Redis does. The future runs until dropped.
pub async fn bind(
    cfg: ServerConfig,
) -> io::Result<(SocketAddr, impl Future<Output = ()> + Send + 'static)> {
    let listener = TcpListener::bind(cfg.listen).await?;
    let addr = listener.local_addr()?;
    let app = Arc::new(http::App::new(cfg.redis, cfg.token, cfg.max_body_bytes));
    Ok((addr, accept_loop(listener, app)))
}

/// Binds and serves; returns only if binding fails.
pub async fn serve(cfg: ServerConfig) -> io::Result<()> {
    let (_, serving) = bind(cfg).await?;
    serving.await;
    Ok(())
}

async fn accept_loop(listener: TcpListener, app: Arc<http::App>) {
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Usually out of file descriptors: wait for some to close, keep serving.
                eprintln!("upstash-local: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let app = app.clone();
                async move { app.handle(req).await }
            });
            // A client hanging up midway is its business, not worth a log line.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}
