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
//! Everything except [`entry`] is plain Rust that builds and tests natively.

#[cfg(not(target_arch = "wasm32"))]
pub mod admin;
pub mod body;
pub mod cache;
pub mod canon;
#[cfg(not(target_arch = "wasm32"))]
pub mod check;
pub mod cidr;
pub mod config;
pub mod decision;
#[cfg(target_arch = "wasm32")]
pub mod entry;
pub mod events;
pub mod gateway;
pub mod headers;
pub mod keys;
pub mod model;
pub mod policy;
pub mod redis_rest;
pub mod rules;
pub mod scripts;
#[cfg(not(target_arch = "wasm32"))]
pub mod simulate;
