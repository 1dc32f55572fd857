//! What a rule allows: one module per algorithm, each owning its figures,
//! their checks, and every question the rest of the crate asks of them
//! ([`Algorithm`]). Each figure is checked when it is built, so a [`Gcra`],
//! [`Window`] or [`Windows`] that exists is one the script and the headers
//! can represent exactly.

use std::num::NonZeroU64;

mod gcra;
mod windowed;

pub use gcra::{Gcra, MAX_GCRA_SPAN_US};
pub use windowed::{Window, Windows, MAX_BUCKETS, MAX_WINDOWS};

/// A rate-limiting policy: which algorithm, with which numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// Generic cell rate algorithm (see `lua/gcra.lua`).
    Gcra(Gcra),
    /// One or more sliding windows checked together (see `lua/windowed.lua`).
    Windowed(Windows),
}

/// What every algorithm answers of its figures, so that nothing outside
/// its module asks which algorithm a rule uses: `gcra.rs` and
/// `windowed.rs` implement it, and [`Policy::algorithm`] lists them.
pub trait Algorithm {
    /// The largest cost one request can ever be admitted with.
    fn capacity(&self) -> u64;

    /// The longest span it counts over, ms: the span a key's window edge
    /// offset is spread over.
    fn longest_ms(&self) -> u64;

    /// The figures as `edge-limiter check` reports them
    /// (`gcra 5/1000ms burst 5`).
    fn describe(&self) -> String;

    /// The figures as `limit` and `inspect` name them, shorter
    /// (`windowed 10/1000ms + 100/60000ms`).
    fn figures(&self) -> String;

    /// The `RateLimit-Policy` items: (quota, window in seconds), one per
    /// limit it holds.
    fn quotas(&self) -> Vec<(u64, u64)>;

    /// How many limits it reports in headers; with more than one, each is
    /// named `rule.i`.
    fn items(&self) -> usize;

    /// What `inspect` calls each of those limits.
    fn labels(&self) -> Vec<String>;

    /// Each of those limits as figures of its own, over the same state:
    /// `inspect` peeks them one by one, where a decision reports only the
    /// one that binds.
    fn parts(&self) -> Vec<Policy>;

    /// Its figures as an override's text after the version
    /// (`gcra <rate> <period_ms> <burst> <interval_us>`), which
    /// `lua/limiter.lua` reads.
    fn override_text(&self) -> String;

    /// The figures an override's text of `kind` and `words` puts in place
    /// of these; `None` when it is no override this release wrote for a
    /// rule of these figures.
    fn override_figures(&self, kind: &str, words: &[&str]) -> Option<Policy>;

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

    /// A lease as `edge-limiter check` reports it, with the `largest` the
    /// figures allow.
    fn describe_lease(&self, units: u64, for_ms: u64, largest: u64) -> String;
}

impl Policy {
    /// The algorithm and its figures: the one place that lists them.
    pub fn algorithm(&self) -> &dyn Algorithm {
        match self {
            Policy::Gcra(g) => g,
            Policy::Windowed(ws) => ws,
        }
    }

    /// The largest cost one request can ever be admitted with.
    pub fn capacity(&self) -> u64 {
        self.algorithm().capacity()
    }

    /// The longest window, milliseconds: the span over which edge offsets spread.
    pub fn longest_ms(&self) -> u64 {
        self.algorithm().longest_ms()
    }
}

/// A policy's parameters that cannot work, with the field to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    /// The offending field, as written in the configuration.
    pub field: String,
    /// What is wrong and what would be right.
    pub problem: String,
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> PolicyError {
    PolicyError {
        field: field.into(),
        problem: problem.into(),
    }
}

/// Upper bound for every duration: 366 days of milliseconds.
pub const MAX_DURATION_MS: u64 = 366 * 24 * 3600 * 1000;

/// Upper bound for a limit or burst.
pub const MAX_UNITS: u64 = 1_000_000_000;

fn nonzero(n: u64, field: &str, problem: &str) -> Result<NonZeroU64, PolicyError> {
    NonZeroU64::new(n).ok_or_else(|| invalid(field, problem))
}

/// A number as the script reads one in an override's text: digits, no
/// sign, no leading zero.
fn text_number(word: &str) -> Option<u64> {
    word.parse().ok().filter(|n: &u64| n.to_string() == word)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcra(rate: u64, period_ms: u64, burst: u64) -> Policy {
        Policy::Gcra(Gcra::new(rate, period_ms, burst).unwrap())
    }

    fn window(duration_ms: u64, limit: u64, precision_ms: u64) -> Window {
        Window::new(duration_ms, limit, precision_ms).unwrap()
    }

    #[test]
    fn interval_rounds_to_the_nearest_microsecond() {
        assert_eq!(Gcra::new(3, 1000, 1).unwrap().interval_us(), 333_333);
        assert_eq!(Gcra::new(3, 2, 1).unwrap().interval_us(), 667);
    }

    #[test]
    fn capacity_and_longest_window() {
        let p = Policy::Windowed(
            Windows::new(vec![window(1000, 10, 100), window(60_000, 100, 60_000)]).unwrap(),
        );
        assert_eq!(p.capacity(), 10);
        assert_eq!(p.longest_ms(), 60_000);
        assert_eq!(gcra(10, 1000, 5).capacity(), 5);
    }

    #[test]
    fn invalid_figures_cannot_be_built_and_name_their_field() {
        for ((rate, period, burst), field) in [
            ((0, 1000, 1), "rate"),
            ((1, 0, 1), "period"),
            ((1, MAX_DURATION_MS + 1, 1), "period"),
            ((1, 1000, 0), "burst"),
            ((1, 1000, MAX_UNITS + 1), "burst"),
            ((2000, 1, 1), "rate"),
            // The example: a year per unit, a billion at once.
            ((1, MAX_DURATION_MS, MAX_UNITS), "burst"),
        ] {
            assert_eq!(
                Gcra::new(rate, period, burst).unwrap_err().field,
                field,
                "{rate}/{period} burst {burst}"
            );
        }
        for ((d, l, p), field) in [
            ((0, 1, 1), "duration"),
            ((MAX_DURATION_MS + 1000, 1, 1000), "duration"),
            ((1000, 0, 100), "limit"),
            ((1000, MAX_UNITS + 1, 100), "limit"),
            ((1000, 1, 300), "precision"),
            ((1000, 1, 0), "precision"),
            ((3601, 1, 1), "precision"),
        ] {
            assert_eq!(
                Window::new(d, l, p).unwrap_err().field,
                field,
                "{d} {l} {p}"
            );
        }
        assert_eq!(Windows::new(vec![]).unwrap_err().field, "windows");
        assert_eq!(
            Windows::new(vec![window(1000, 1, 100), window(1000, 2, 100)])
                .unwrap_err()
                .field,
            "windows[1].duration"
        );
        assert_eq!(
            Windows::new(vec![window(1000, 1, 1000); 9])
                .unwrap_err()
                .field,
            "windows"
        );
    }

    #[test]
    fn the_largest_accepted_figures_stay_within_exact_arithmetic() {
        // The longest span that passes: exactly 2^51 us.
        let g = Gcra::new(1, 1, 1).unwrap();
        assert_eq!(g.interval_us(), 1000);
        let widest = Gcra::new(1, MAX_GCRA_SPAN_US / 1000 / MAX_UNITS, MAX_UNITS);
        let widest = widest.unwrap();
        assert!(widest.span_us() <= MAX_GCRA_SPAN_US);
        assert!(Gcra::new(1, MAX_GCRA_SPAN_US / 1000 / MAX_UNITS + 1, MAX_UNITS).is_err());
        let longest = Gcra::new(
            1,
            MAX_DURATION_MS,
            MAX_GCRA_SPAN_US / (MAX_DURATION_MS * 1000),
        );
        assert!(longest.unwrap().span_us() <= MAX_GCRA_SPAN_US);
    }
}
