//! The in-flight limit's figures: how many requests of a key may be in
//! flight at once, and how long a slot whose release never came is held;
//! and what they mean for headers, overrides and leases (none).

use std::num::NonZeroU64;

use serde_json::{Map, Value};

use super::algorithm::{nonzero, text_number, Algorithm, Described, Written};
use crate::rules::fields::{duration, invalid, list, one, FieldError, RawDuration};

/// How an in-flight rule is written, and what `limit set` changes of it.
pub(super) const WRITTEN: Written = Written {
    name: "concurrency",
    label: "in-flight",
    fields: &["limit", "hold_for"],
    takes: "limit and hold_for",
    options: &["limits"],
    takes_options: "--limit",
};

/// The most requests of one key an in-flight rule may let in at once:
/// each is a member of the key's sorted set (`lua/concurrency.lua`).
pub const MAX_IN_FLIGHT: u64 = 1_000_000;

/// `hold_for` when the rule leaves it out: 60 s.
pub const DEFAULT_HOLD_MS: u64 = 60_000;

/// The longest `hold_for`: 1 h.
pub const MAX_HOLD_MS: u64 = 3_600_000;

/// An in-flight limit: at most `limit` requests of a key in flight at
/// once, each slot free again when its response has ended, or `hold_ms`
/// after it was taken if no release came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    limit: NonZeroU64,
    hold_ms: NonZeroU64,
}

impl Concurrency {
    /// Checked figures; the error names `limit` or `hold_for`.
    pub fn new(limit: u64, hold_ms: u64) -> Result<Concurrency, FieldError> {
        let between = format!("must be between 1 and {MAX_IN_FLIGHT}");
        let limit_nz = nonzero(limit, "limit", &between)?;
        if limit > MAX_IN_FLIGHT {
            return Err(invalid("limit", between));
        }
        let hold = nonzero(hold_ms, "hold_for", "must be between 1s and 1h")?;
        if !(1000..=MAX_HOLD_MS).contains(&hold_ms) {
            return Err(invalid("hold_for", "must be between 1s and 1h"));
        }
        Ok(Concurrency {
            limit: limit_nz,
            hold_ms: hold,
        })
    }

    /// Requests in flight at once, at most.
    pub fn limit(&self) -> u64 {
        self.limit.get()
    }

    /// How long a slot is held when no release comes, ms.
    pub fn hold_ms(&self) -> u64 {
        self.hold_ms.get()
    }

    /// The figures a rule writes: `limit`, and `hold_for` (60 s when left
    /// out).
    pub(super) fn read(rule: &Map<String, Value>) -> Result<Concurrency, FieldError> {
        let limit = one(rule, "limit")?.ok_or_else(|| {
            invalid(
                "limit",
                "is required for an in-flight limit: the requests in flight at once",
            )
        })?;
        let hold: Option<RawDuration> = one(rule, "hold_for")?;
        let hold_ms = hold.map(|h| duration("hold_for", &h)).transpose()?;
        Concurrency::new(limit, hold_ms.unwrap_or(DEFAULT_HOLD_MS))
    }

    /// These figures with the limit `given` (`limit set --limit N`, one).
    pub(super) fn changed(&self, given: &Map<String, Value>) -> Result<Concurrency, FieldError> {
        match list::<u64>(given, "limits")?.as_deref() {
            Some([limit]) => Concurrency::new(*limit, self.hold_ms()),
            _ => Err(invalid(
                "limit",
                "give one limit: the requests in flight at once",
            )),
        }
    }

    /// The figures an override's text of `kind` and `words` puts in place
    /// of these: a new limit, the hold kept.
    pub(super) fn overridden_by(&self, kind: &str, words: &[&str]) -> Option<Concurrency> {
        match (kind, words) {
            ("concurrency", [limit]) => Concurrency::new(text_number(limit)?, self.hold_ms()).ok(),
            _ => None,
        }
    }
}

impl Algorithm for Concurrency {
    fn written(&self) -> &'static Written {
        &WRITTEN
    }

    /// One request may take every slot.
    fn capacity(&self) -> u64 {
        self.limit()
    }

    fn longest_ms(&self) -> u64 {
        self.hold_ms()
    }

    /// None: `RateLimit-Policy` describes quotas over a window, which an
    /// in-flight limit has not.
    fn quotas(&self) -> Vec<(u64, u64)> {
        vec![]
    }

    fn items(&self) -> usize {
        1
    }

    fn no_lease(&self) -> Option<&'static str> {
        Some(
            "an in-flight limit takes no lease: a slot is held until its response ends, \
             so slots leased ahead would be held by nobody",
        )
    }

    fn released(&self) -> bool {
        true
    }

    fn lease_largest(&self, _for_ms: u64, _share: u64) -> u64 {
        0
    }

    fn lease_longest_ms(&self, _units: u64, _share: u64) -> Option<u64> {
        Some(0)
    }

    fn lease_cap_ms(&self, _for_ms: u64) -> u64 {
        0
    }

    fn lease_horizon_ms(&self, _for_ms: u64, _shifted_ms: &dyn Fn() -> u64) -> u64 {
        0
    }
}

impl Described for Concurrency {
    fn describe(&self) -> String {
        format!(
            "{}, a slot held at most {}ms",
            self.figures(),
            self.hold_ms()
        )
    }

    fn figures(&self) -> String {
        format!("concurrency {} in flight", self.limit())
    }

    fn labels(&self) -> Vec<String> {
        vec![self.figures()]
    }

    fn describe_lease(&self, _units: u64, _for_ms: u64, _largest: u64) -> String {
        String::new()
    }

    fn override_text(&self) -> String {
        format!("concurrency {}", self.limit())
    }
}
