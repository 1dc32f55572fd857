//! What every algorithm's figures answer, how each is written, and what
//! their checks share: the bounds every figure keeps to.

use std::num::NonZeroU64;

use crate::rules::fields::FieldError;

/// How an algorithm is written: its word in a rule's `algorithm`, the
/// fields of its figures, and the `limit set` options that change them.
/// Each algorithm's module holds its own; `policy/mod.rs` lists them.
pub struct Written {
    /// Its word in `algorithm = "..."`.
    pub name: &'static str,
    /// What messages call it (`GCRA`).
    pub label: &'static str,
    /// The rule's fields its figures are read from.
    pub fields: &'static [&'static str],
    /// Those fields as a message lists them.
    pub takes: &'static str,
    /// The names of what an override may change (`limit set`'s options,
    /// and `limit apply`'s keys).
    pub options: &'static [&'static str],
    /// Those options as a message lists them.
    pub takes_options: &'static str,
}

/// What every algorithm answers of its figures, so that nothing outside
/// its module asks which algorithm a rule uses: `gcra.rs` and
/// `windowed.rs` implement it, and `policy/mod.rs` lists them.
pub trait Algorithm {
    /// How it is written.
    fn written(&self) -> &'static Written;

    /// The largest cost one request can ever be admitted with.
    fn capacity(&self) -> u64;

    /// The longest span it counts over, ms: the span a key's window edge
    /// offset is spread over.
    fn longest_ms(&self) -> u64;

    /// The `RateLimit-Policy` items: (quota, window in seconds), one per
    /// limit it holds.
    fn quotas(&self) -> Vec<(u64, u64)>;

    /// How many limits it reports in headers; with more than one, each is
    /// named `rule.i`.
    fn items(&self) -> usize;

    /// Why a rule of it takes no lease, where it takes none.
    fn no_lease(&self) -> Option<&'static str> {
        None
    }

    /// The longest a request waits to conform instead of being denied,
    /// ms (0: it is denied; only GCRA delays).
    fn max_delay_ms(&self) -> u64 {
        0
    }

    /// Whether an admitted request's charge is given back once its
    /// response has ended, whatever the response (an in-flight slot).
    fn released(&self) -> bool {
        false
    }

    /// The most units a fresh client's lease lasting `for_ms` can hold,
    /// taking one `share`th of what is left after a request.
    fn lease_largest(&self, for_ms: u64, share: u64) -> u64;

    /// The longest a lease of `units` may last at a fresh client, ms,
    /// where the figures bound it (0: not at all); `None` where only its
    /// length and the buckets it is counted in do.
    fn lease_longest_ms(&self, units: u64, share: u64) -> Option<u64>;

    /// How long a lease asked for `for_ms` lasts at most, wherever the
    /// clock is: the script ends a window's with its shortest bucket.
    fn lease_cap_ms(&self, for_ms: u64) -> u64;

    /// How long a lease granted now would last, at most `for_ms`;
    /// `shifted_ms` tells now on the key's shifted clock, for algorithms
    /// whose leases end with a bucket.
    fn lease_horizon_ms(&self, for_ms: u64, shifted_ms: &dyn Fn() -> u64) -> u64;
}

/// What the operator's commands say of an algorithm's figures. A trait of
/// its own, apart from [`Algorithm`], so that the worker, which never says
/// them, carries none of it.
pub trait Described {
    /// The figures as `edge-limiter check` reports them
    /// (`gcra 5/1000ms burst 5`).
    fn describe(&self) -> String;

    /// The figures as `limit` and `inspect` name them, shorter
    /// (`windowed 10/1000ms + 100/60000ms`).
    fn figures(&self) -> String;

    /// What `inspect` calls each of the limits it reports in headers.
    fn labels(&self) -> Vec<String>;

    /// A lease as `edge-limiter check` reports it, with the `largest` the
    /// figures allow.
    fn describe_lease(&self, units: u64, for_ms: u64, largest: u64) -> String;
    /// Its figures as an override's text after the version
    /// (`gcra <rate> <period_ms> <burst> <interval_us>`), which
    /// `lua/limiter.lua` reads.
    fn override_text(&self) -> String;
}

/// Upper bound for every duration: 366 days of milliseconds.
pub const MAX_DURATION_MS: u64 = 366 * 24 * 3600 * 1000;

/// Upper bound for a limit or burst.
pub const MAX_UNITS: u64 = 1_000_000_000;

pub(super) fn nonzero(n: u64, field: &str, problem: &str) -> Result<NonZeroU64, FieldError> {
    NonZeroU64::new(n).ok_or_else(|| crate::rules::fields::invalid(field, problem))
}

/// A number as the script reads one in an override's text: digits, no
/// sign, no leading zero.
pub(super) fn text_number(word: &str) -> Option<u64> {
    word.parse().ok().filter(|n: &u64| n.to_string() == word)
}
