//! Deciding one request, in layers that each import only those below:
//!
//! - [`outcomes`]: what a decision comes to (verdicts, log events);
//! - [`transport`]: how a decision reaches Redis and comes back (the Redis
//!   keys, the script protocol, the REST client, the batching of calls);
//! - [`memory`]: what an isolate keeps between its requests (denials,
//!   leases, rule-wide overrides, the calls in flight, held-back log lines);
//! - [`runtime`]: the clock, pause and signal the runtime lends;
//! - [`limiter::Limiter`]: one request's decision from those;
//! - [`stats`]: what an isolate counts of what the limiter decided.

pub mod limiter;
pub mod memory;
pub mod outcomes;
pub mod runtime;
pub mod stats;
pub mod transport;
