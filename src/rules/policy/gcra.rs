//! GCRA's figures: a rate per period and a burst, checked so that the
//! script's microsecond arithmetic stays exact, and what they mean for
//! headers, overrides and leases.

use std::num::NonZeroU64;

use serde_json::{Map, Value};

use super::algorithm::{
    nonzero, text_number, Algorithm, Described, Written, MAX_DURATION_MS, MAX_UNITS,
};
use crate::rules::fields::{duration, invalid, one, FieldError, RawDuration};

/// The longest `max_delay`, ms: a waiting request holds its isolate's
/// memory and its client's connection.
pub const MAX_DELAY_MS: u64 = 30_000;

/// The delay a rule with `on_limit = "delay"` and no `max_delay` allows, ms.
const DEFAULT_DELAY_MS: u64 = 1000;

/// The longest debt a GCRA key may carry, burst x interval, microseconds
/// (2^51, about 71 years). The script adds up to twice this to a pinned
/// clock in microseconds (about 2^51.7 until the year 2100), and every sum
/// must stay below 2^53, where Lua's numbers stop being exact integers.
pub const MAX_GCRA_SPAN_US: u64 = 1 << 51;

/// GCRA parameters: `rate` units per `period_ms`, of which `burst` may
/// come at once; and how long a request may wait to conform instead of
/// being denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    rate: NonZeroU64,
    period_ms: NonZeroU64,
    burst: NonZeroU64,
    max_delay_ms: u64,
}

/// How a GCRA rule is written, and what `limit set` changes of it.
pub(super) const WRITTEN: Written = Written {
    name: "gcra",
    label: "GCRA",
    fields: &["rate", "period", "burst", "on_limit", "max_delay"],
    takes: "rate, period, burst, on_limit and max_delay",
    options: &["rate", "period", "burst"],
    takes_options: "--rate, --period and --burst",
};

impl Gcra {
    /// The figures a rule writes: `rate` and `period`, and `burst`, which
    /// is the rate when left out.
    pub(super) fn read(rule: &Map<String, Value>) -> Result<Gcra, FieldError> {
        let rate = one(rule, "rate")?.ok_or_else(|| invalid("rate", "is required for GCRA"))?;
        let period: RawDuration =
            one(rule, "period")?.ok_or_else(|| invalid("period", "is required for GCRA"))?;
        let period_ms = duration("period", &period)?;
        let burst = one(rule, "burst")?;
        let delay_ms = match (delays(rule)?, one::<RawDuration>(rule, "max_delay")?) {
            (false, None) => 0,
            (false, Some(_)) => {
                return Err(invalid("max_delay", "needs `on_limit = \"delay\"`"));
            }
            (true, None) => DEFAULT_DELAY_MS,
            (true, Some(d)) => Some(duration("max_delay", &d)?)
                .filter(|ms| *ms <= MAX_DELAY_MS)
                .ok_or_else(|| invalid("max_delay", "must be between 1ms and 30s"))?,
        };
        Ok(Gcra::new(rate, period_ms, burst.unwrap_or(rate))?.delaying(delay_ms))
    }

    /// These figures with the ones `given` in their place (`limit set`),
    /// each left out keeping its own.
    pub(super) fn changed(&self, given: &Map<String, Value>) -> Result<Gcra, FieldError> {
        let period: Option<RawDuration> = one(given, "period")?;
        let period_ms = period.map(|p| duration("period", &p)).transpose()?;
        Gcra::new(
            one(given, "rate")?.unwrap_or(self.rate()),
            period_ms.unwrap_or(self.period_ms()),
            one(given, "burst")?.unwrap_or(self.burst()),
        )
        .map(|g| g.delaying(self.max_delay_ms))
    }

    /// These figures, a request that would conform within `ms` waiting
    /// for it instead of being denied (0: none waits).
    pub fn delaying(self, ms: u64) -> Gcra {
        Gcra {
            max_delay_ms: ms,
            ..self
        }
    }

    /// Checked parameters; the error names `rate`, `period` or `burst`.
    pub fn new(rate: u64, period_ms: u64, burst: u64) -> Result<Gcra, FieldError> {
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
            max_delay_ms: 0,
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

    /// The longest a request waits to conform instead of being denied,
    /// ms (0: it is denied).
    pub fn max_delay_ms(&self) -> u64 {
        self.max_delay_ms
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

impl Gcra {
    /// The figures an override's text of `kind` and `words` puts in place
    /// of these: a GCRA override whose interval is the one its rate and
    /// period give.
    pub(super) fn overridden_by(&self, kind: &str, words: &[&str]) -> Option<Gcra> {
        let (&"gcra", &[rate, period_ms, burst, interval_us]) = (&kind, words) else {
            return None;
        };
        let g = Gcra::new(
            text_number(rate)?,
            text_number(period_ms)?,
            text_number(burst)?,
        )
        .ok()?
        .delaying(self.max_delay_ms);
        (g.interval_us() == text_number(interval_us)?).then_some(g)
    }
}

impl Algorithm for Gcra {
    fn written(&self) -> &'static Written {
        &WRITTEN
    }

    fn capacity(&self) -> u64 {
        self.burst()
    }

    fn longest_ms(&self) -> u64 {
        self.period_ms()
    }

    /// One item: the burst, refilled whole in burst x interval.
    fn quotas(&self) -> Vec<(u64, u64)> {
        vec![(self.burst(), self.span_us().div_ceil(1_000_000).max(1))]
    }

    fn items(&self) -> usize {
        1
    }

    /// A lease's units count as arriving at its end, so its length takes
    /// from the burst what refills meanwhile; and the request before it
    /// takes one interval.
    fn lease_largest(&self, for_ms: u64, share: u64) -> u64 {
        let interval = self.interval_us();
        let base = for_ms.saturating_mul(1000);
        let left = self.span_us().saturating_sub(base).saturating_sub(interval) / interval;
        left / share
    }

    fn lease_longest_ms(&self, units: u64, share: u64) -> Option<u64> {
        let interval = self.interval_us();
        let needed = (units * share + 1).saturating_mul(interval);
        Some(self.span_us().saturating_sub(needed) / 1000)
    }

    fn max_delay_ms(&self) -> u64 {
        self.max_delay_ms
    }

    fn no_lease(&self) -> Option<&'static str> {
        (self.max_delay_ms > 0).then_some(
            "a delaying rule reserves each request's instant in Redis, which a lease's units, spent in the isolate, cannot; remove `lease` or `on_limit`",
        )
    }

    fn lease_cap_ms(&self, for_ms: u64) -> u64 {
        for_ms
    }

    fn lease_horizon_ms(&self, for_ms: u64, _shifted_ms: &dyn Fn() -> u64) -> u64 {
        for_ms
    }
}

impl Described for Gcra {
    fn describe(&self) -> String {
        match self.max_delay_ms {
            0 => self.figures(),
            ms => format!("{}, delays up to {ms}ms", self.figures()),
        }
    }

    fn figures(&self) -> String {
        format!(
            "gcra {}/{}ms burst {}",
            self.rate(),
            self.period_ms(),
            self.burst()
        )
    }

    fn labels(&self) -> Vec<String> {
        vec![self.figures()]
    }

    fn describe_lease(&self, units: u64, for_ms: u64, largest: u64) -> String {
        format!(
            ", lease {units} units for {for_ms}ms (the burst allows up to {largest} for that long)"
        )
    }

    /// The script applies the interval and burst; the rate and period are
    /// for people, and must give that same interval.
    fn override_text(&self) -> String {
        format!(
            "gcra {} {} {} {}",
            self.rate(),
            self.period_ms(),
            self.burst(),
            self.interval_us()
        )
    }
}

/// Whether a rule's `on_limit` asks for a delay (`"delay"`) rather than a
/// denial (`"deny"`, the default).
pub(super) fn delays(rule: &Map<String, Value>) -> Result<bool, FieldError> {
    match one::<String>(rule, "on_limit")?.as_deref() {
        None | Some("deny") => Ok(false),
        Some("delay") => Ok(true),
        Some(other) => Err(invalid(
            "on_limit",
            format!("`{other}` is neither \"deny\" nor \"delay\""),
        )),
    }
}
