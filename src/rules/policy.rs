//! What a rule allows: the two algorithms' parameters, and how they travel
//! to the script as `ARGV`. Each figure is checked when it is built, so a
//! [`Gcra`], [`Window`] or [`Windows`] that exists is one the script and the
//! headers can represent exactly.

use std::num::NonZeroU64;

/// A rate-limiting policy: which algorithm, with which numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// Generic cell rate algorithm (see `lua/gcra.lua`).
    Gcra(Gcra),
    /// One or more sliding windows checked together (see `lua/windowed.lua`).
    Windowed(Windows),
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

/// The longest debt a GCRA key may carry, burst x interval, microseconds
/// (2^51, about 71 years). The script adds up to twice this to a pinned
/// clock in microseconds (about 2^51.7 until the year 2100), and every sum
/// must stay below 2^53, where Lua's numbers stop being exact integers.
pub const MAX_GCRA_SPAN_US: u64 = 1 << 51;

/// Windows per windowed rule, at most.
pub const MAX_WINDOWS: usize = 8;

/// Buckets per window, at most: each may be a hash field of its own.
pub const MAX_BUCKETS: u64 = 3600;

fn nonzero(n: u64, field: &str, problem: &str) -> Result<NonZeroU64, PolicyError> {
    NonZeroU64::new(n).ok_or_else(|| invalid(field, problem))
}

/// GCRA parameters: `rate` units per `period_ms`, of which `burst` may come at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    rate: NonZeroU64,
    period_ms: NonZeroU64,
    burst: NonZeroU64,
}

impl Gcra {
    /// Checked parameters; the error names `rate`, `period` or `burst`.
    pub fn new(rate: u64, period_ms: u64, burst: u64) -> Result<Gcra, PolicyError> {
        let rate = nonzero(rate, "rate", "must be at least 1")?;
        let period = nonzero(period_ms, "period", "must be between 1ms and 366d")?;
        if period_ms > MAX_DURATION_MS {
            return Err(invalid("period", "must be between 1ms and 366d"));
        }
        if rate.get() > period_ms * 1000 {
            return Err(invalid("rate", "must be at most one unit per microsecond"));
        }
        let burst_nz = nonzero(burst, "burst", "must be between 1 and 1000000000")?;
        if burst > MAX_UNITS {
            return Err(invalid("burst", "must be between 1 and 1000000000"));
        }
        let gcra = Gcra {
            rate,
            period_ms: period,
            burst: burst_nz,
        };
        if gcra
            .interval_us()
            .checked_mul(burst)
            .is_none_or(|span| span > MAX_GCRA_SPAN_US)
        {
            return Err(invalid(
                "burst",
                "times period / rate exceeds 2^51 microseconds (about 71 years), \
                 more than the script can count exactly; lower the burst or the period",
            ));
        }
        Ok(gcra)
    }

    /// Units replenished per period.
    pub fn rate(&self) -> u64 {
        self.rate.get()
    }

    /// Length of the period, milliseconds.
    pub fn period_ms(&self) -> u64 {
        self.period_ms.get()
    }

    /// Units a fresh client may spend back to back.
    pub fn burst(&self) -> u64 {
        self.burst.get()
    }

    /// Time one unit occupies, microseconds, rounded to the nearest one so
    /// that the script's arithmetic stays exact (a rate of 3/s is treated as
    /// one unit per 333 333 us). Never 0, since the rate is at most one unit
    /// per microsecond.
    pub fn interval_us(&self) -> u64 {
        (self.period_ms() * 1000 + self.rate() / 2) / self.rate()
    }

    /// Time a full burst takes to pay off, microseconds (at most
    /// [`MAX_GCRA_SPAN_US`]).
    pub fn span_us(&self) -> u64 {
        self.interval_us() * self.burst()
    }
}

/// One sliding window: at most `limit` units in any `duration_ms`, counted in
/// buckets of `precision_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    duration_ms: NonZeroU64,
    limit: NonZeroU64,
    precision_ms: NonZeroU64,
}

impl Window {
    /// Checked figures; the error names `duration`, `limit` or `precision`.
    pub fn new(duration_ms: u64, limit: u64, precision_ms: u64) -> Result<Window, PolicyError> {
        let duration = nonzero(duration_ms, "duration", "must be between 1ms and 366d")?;
        if duration_ms > MAX_DURATION_MS {
            return Err(invalid("duration", "must be between 1ms and 366d"));
        }
        let limit_nz = nonzero(limit, "limit", "must be between 1 and 1000000000")?;
        if limit > MAX_UNITS {
            return Err(invalid("limit", "must be between 1 and 1000000000"));
        }
        let uneven = || {
            invalid(
                "precision",
                "must divide the duration evenly (use the duration itself for a fixed window)",
            )
        };
        let precision = NonZeroU64::new(precision_ms).ok_or_else(uneven)?;
        if !duration_ms.is_multiple_of(precision_ms) {
            return Err(uneven());
        }
        if duration_ms / precision_ms > MAX_BUCKETS {
            return Err(invalid(
                "precision",
                "gives more than 3600 buckets per window; choose a coarser precision",
            ));
        }
        Ok(Window {
            duration_ms: duration,
            limit: limit_nz,
            precision_ms: precision,
        })
    }

    /// Window length, milliseconds.
    pub fn duration_ms(&self) -> u64 {
        self.duration_ms.get()
    }

    /// Units admitted per window.
    pub fn limit(&self) -> u64 {
        self.limit.get()
    }

    /// Bucket length, milliseconds; equal to the duration for a fixed window.
    pub fn precision_ms(&self) -> u64 {
        self.precision_ms.get()
    }

    /// Buckets the window spans.
    pub fn buckets(&self) -> u64 {
        self.duration_ms() / self.precision_ms()
    }
}

/// The windows of one windowed rule: 1 to [`MAX_WINDOWS`], no two with the
/// same duration and precision (they would share counters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windows(Vec<Window>);

impl Windows {
    /// Checked windows; the error names `windows` or `windows[i].duration`.
    pub fn new(windows: Vec<Window>) -> Result<Windows, PolicyError> {
        if windows.is_empty() || windows.len() > MAX_WINDOWS {
            return Err(invalid("windows", "give between 1 and 8 windows"));
        }
        for (i, w) in windows.iter().enumerate() {
            let twin = windows[..i]
                .iter()
                .any(|o| o.duration_ms == w.duration_ms && o.precision_ms == w.precision_ms);
            if twin {
                return Err(invalid(
                    format!("windows[{i}].duration"),
                    "repeats an earlier window's duration and precision; they would share counters",
                ));
            }
        }
        Ok(Windows(windows))
    }
}

impl std::ops::Deref for Windows {
    type Target = [Window];

    fn deref(&self) -> &[Window] {
        &self.0
    }
}

impl Policy {
    /// The largest cost one request can ever be admitted with.
    pub fn capacity(&self) -> u64 {
        match self {
            Policy::Gcra(g) => g.burst(),
            Policy::Windowed(ws) => ws.iter().map(Window::limit).min().unwrap_or(0),
        }
    }

    /// The longest window, milliseconds: the span over which edge offsets spread.
    pub fn longest_ms(&self) -> u64 {
        match self {
            Policy::Gcra(g) => g.period_ms(),
            Policy::Windowed(ws) => ws.iter().map(Window::duration_ms).max().unwrap_or(1),
        }
    }
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
