//! Whether and how the worker keeps stats of what it did (`stats`,
//! `stats_every`, `stats_keep`, `stats_clients` in `[vars.LIMITER]`), as
//! the configuration's checks build it.

/// `stats_every` when none is given, ms.
pub const DEFAULT_EVERY_MS: u64 = 30_000;

/// `stats_keep` when none is given, ms: a week.
pub const DEFAULT_KEEP_MS: u64 = 7 * 86_400_000;

/// The shortest and longest `stats_every`, ms: a write a second at most
/// per isolate, and at least one an hour.
pub const EVERY_RANGE_MS: (u64, u64) = (1_000, 3_600_000);

/// The shortest and longest `stats_keep`, ms: an hour to 366 days.
pub const KEEP_RANGE_MS: (u64, u64) = (3_600_000, 366 * 86_400_000);

/// How the clients most denied are kept, and so how every key of the
/// limiter names them: the form the stats show is the keys' own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsClients {
    /// As the rule's key shows their identifier (`203.0.113.9`, or `#` and
    /// a SHA1 for one it cannot keep plain).
    Key,
    /// As the SHA1 of their identifier, so that no address is stored
    /// readable (though an IPv4 address is found by hashing them all).
    Hash,
    /// As the HMAC-SHA1 of their identifier under `STATS_SECRET`: found
    /// again only with the secret.
    Hmac,
}

/// Stats, when `stats = true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsSettings {
    /// How often an isolate writes what it counted, at most, ms.
    pub every_ms: u64,
    /// How long a day's figures are kept after the day ends, ms.
    pub keep_ms: u64,
    /// How clients are kept.
    pub clients: StatsClients,
}

impl Default for StatsSettings {
    fn default() -> StatsSettings {
        StatsSettings {
            every_ms: DEFAULT_EVERY_MS,
            keep_ms: DEFAULT_KEEP_MS,
            clients: StatsClients::Key,
        }
    }
}
