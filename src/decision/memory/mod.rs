//! What an isolate keeps between its requests, each borrowed briefly and
//! never across an await: denials still in force ([`block_cache`]),
//! leased units ([`leases`]), the rule-wide overrides as last read
//! ([`rule_wide`]), the calls in flight and the requests waiting on them
//! ([`in_flight`]), and the log lines held back ([`log_gate`]).

pub mod block_cache;
pub mod in_flight;
pub mod leases;
pub mod log_gate;
pub mod rule_wide;
