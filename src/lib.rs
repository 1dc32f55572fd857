//! edge-limiter: a rate limiter that runs as a Cloudflare Worker in front of
//! any origin. Each request is matched to rules, keyed by client, and decided
//! by one Lua script in a Redis reached over the Upstash REST protocol.
//!
//! A rule in `wrangler.toml`:
//!
//! ```toml
//! [[vars.LIMITER.rules]]
//! name = "per-ip"
//! key = ["ip"]
//! algorithm = "gcra"
//! rate = 5
//! period = "1s"
//! burst = 5
//! ```
//!
//! and the headers a request under it receives:
//!
//! ```text
//! RateLimit-Policy: "per-ip";q=5;w=1
//! RateLimit: "per-ip";r=4;t=1
//! ```
//!
//! The crate reads as its layers, each depending only on those below it:
//! [`edge`] (the wasm entry and the responses it makes) and `operator`
//! (the native commands) on [`decision`] (deciding a request with the
//! script in Redis), on [`rules`] (configuration, requests, canonical
//! forms). Everything except `edge::entry` builds and tests natively.

pub mod decision;
pub mod edge;
#[cfg(not(target_arch = "wasm32"))]
pub mod operator;
pub mod rules;
