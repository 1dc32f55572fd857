//! Deciding one request: the Redis keys, the script protocol and its
//! verdicts, the REST client that carries it, the isolate's block cache
//! and calls in flight, and the [`limiter::Limiter`] that puts them
//! together; and [`stats`],
//! what an isolate counts of what it decided.

pub mod batch;
pub mod block_cache;
pub mod events;
pub mod in_flight;
pub mod keys;
pub mod leases;
pub mod limiter;
pub mod log_gate;
pub mod protocol;
pub mod redis_rest;
pub mod rule_wide;
pub mod stats;
pub mod verdict;
