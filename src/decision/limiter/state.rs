//! The limiter's state for one request: what it is decided with (the
//! rules, where the script runs, one isolate's memory, and whose clock
//! the script reads). Its steps extend it from the files above: `mod.rs`
//! decides, `grouped.rs`, `leased.rs` and `pooled.rs` add a feature each.

use std::cell::RefCell;

use crate::decision::memory::{
    block_cache::BlockCache, in_flight::InFlight, leases::Leases, rule_wide::RuleWide,
    IsolateMemory,
};
use crate::rules::config::Config;

/// What one request is decided with: the configuration, Redis, and this
/// isolate's memory of denials and clock.
pub struct Limiter<'c, 's, S> {
    /// The rules; an outcome borrows them.
    pub config: &'c Config,
    /// Where the script runs.
    pub store: &'s S,
    /// Denials still in force, shared by the isolate's requests. Borrowed
    /// only briefly, never across an await, since requests interleave.
    pub cache: &'s RefCell<BlockCache>,
    /// Units leased to this isolate, and its keys' demand; borrowed as
    /// briefly as the cache.
    pub leases: &'s RefCell<Leases>,
    /// The rule-wide overrides as this isolate last read them.
    pub wide: &'s RefCell<RuleWide>,
    /// The isolate's decision calls in flight, and the requests waiting
    /// on them.
    pub in_flight: &'s InFlight,
    /// Whether the script runs on `now_ms` rather than Redis's clock
    /// (tests and simulations, whose time is not real).
    pub pinned: bool,
    /// The home region's Redis, when `store` is another region's: its
    /// shared rules are spent from that region's pools, and decided at the
    /// home when a pool cannot cover a request (see `pooled.rs`).
    pub home: Option<&'s S>,
}

impl<'c, 's, S> Limiter<'c, 's, S> {
    /// A limiter over one isolate's `memory`, its calls made through
    /// `store`; `pinned` runs the script on the caller's clock.
    pub fn new(
        config: &'c Config,
        store: &'s S,
        memory: &'s IsolateMemory,
        pinned: bool,
    ) -> Limiter<'c, 's, S> {
        Limiter {
            config,
            store,
            cache: &memory.cache,
            leases: &memory.leases,
            wide: &memory.wide,
            in_flight: &memory.in_flight,
            pinned,
            home: None,
        }
    }

    /// The same limiter in a region other than the home, whose Redis is
    /// `home`'s.
    pub fn away_from(self, home: &'s S) -> Limiter<'c, 's, S> {
        Limiter {
            home: Some(home),
            ..self
        }
    }
}
