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
pub mod seeded;

use std::cell::RefCell;

use block_cache::BlockCache;
use in_flight::InFlight;
use leases::Leases;
use rule_wide::RuleWide;

/// What one isolate's limiter decides with besides the rules and Redis,
/// made in one place for the worker and the simulator alike. The log
/// gate is the worker's own: a replay writes no log.
pub struct IsolateMemory {
    /// Denials still in force.
    pub cache: RefCell<BlockCache>,
    /// Units leased to this isolate, and its keys' demand.
    pub leases: RefCell<Leases>,
    /// The rule-wide overrides as last read.
    pub wide: RefCell<RuleWide>,
    /// Its decision calls in flight, and the requests waiting on them.
    pub in_flight: InFlight,
}

impl IsolateMemory {
    /// A fresh isolate's: denials held `cache_hold_ms`, requests waiting
    /// in line on `in_flight`'s pause.
    pub fn new(cache_hold_ms: u64, in_flight: InFlight) -> IsolateMemory {
        IsolateMemory {
            cache: RefCell::new(BlockCache::new(cache_hold_ms)),
            leases: RefCell::new(Leases::new()),
            wide: RefCell::new(RuleWide::new()),
            in_flight,
        }
    }
}
