//! The windowed limiter's figures: up to eight sliding windows, each a
//! limit per duration counted in buckets, checked together; and what they
//! mean for headers, overrides and leases.

use std::num::NonZeroU64;

use serde_json::{Map, Value};

use super::algorithm::{
    nonzero, text_number, Algorithm, Described, Written, MAX_DURATION_MS, MAX_UNITS,
};
use crate::rules::fields::{duration, expected, invalid, list, FieldError, FromJson, RawDuration};

/// Windows per windowed rule, at most.
pub const MAX_WINDOWS: usize = 8;

/// Buckets per window, at most: each may be a hash field of its own.
pub const MAX_BUCKETS: u64 = 3600;

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
    pub fn new(duration_ms: u64, limit: u64, precision_ms: u64) -> Result<Window, FieldError> {
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

/// How a windowed rule is written, and what `limit set` changes of it.
pub(super) const WRITTEN: Written = Written {
    name: "windowed",
    label: "windowed",
    fields: &["windows", "on_limit"],
    takes: "windows and on_limit = \"deny\"",
    options: &["limits"],
    takes_options: "--limit per window",
};

/// A window as written: `[duration, limit, precision]`.
struct RawWindow(RawDuration, u64, RawDuration);

impl FromJson for RawWindow {
    fn from_json(v: &Value) -> Result<Self, String> {
        match v.as_array().map(Vec::as_slice) {
            Some([d, l, p]) => Ok(RawWindow(
                RawDuration::from_json(d)?,
                u64::from_json(l)?,
                RawDuration::from_json(p)?,
            )),
            _ => Err(expected("a window: [duration, limit, precision]", v)),
        }
    }
}

impl Windows {
    /// The windows a rule writes; an error inside one names it
    /// (`windows[1].precision`).
    pub(super) fn read(rule: &Map<String, Value>) -> Result<Windows, FieldError> {
        if super::gcra::delays(rule)? {
            return Err(invalid(
                "on_limit",
                "a windowed rule cannot delay exactly: its buckets count a request when it is \
                 decided, so a delayed one could reach the origin in a later window than it \
                 was counted in; use a GCRA rule to delay, or on_limit = \"deny\"",
            ));
        }
        let written: Vec<RawWindow> = list(rule, "windows")?.ok_or_else(|| {
            invalid(
                "windows",
                "is required: [[duration, limit, precision], ...]",
            )
        })?;
        let windows = written
            .iter()
            .enumerate()
            .map(|(i, RawWindow(d, limit, p))| {
                let at = |name: &str| format!("windows[{i}].{name}");
                let duration_ms = duration(&at("duration"), d)?;
                let precision_ms = duration(&at("precision"), p)?;
                Window::new(duration_ms, *limit, precision_ms)
                    .map_err(|e| invalid(at(&e.field), e.problem))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Windows::new(windows)
    }

    /// These windows with the `limits` given, one per window in their
    /// order (`limit set --limit`).
    pub(super) fn changed(&self, given: &Map<String, Value>) -> Result<Windows, FieldError> {
        let limits: Vec<u64> = list(given, "limits")?.unwrap_or_default();
        if limits.len() != self.len() {
            return Err(invalid(
                "limit",
                format!(
                    "give one limit per window: the rule has {} (in its order)",
                    self.len()
                ),
            ));
        }
        self.with_limits(&limits)
    }

    /// Checked windows; the error names `windows` or `windows[i].duration`.
    pub fn new(windows: Vec<Window>) -> Result<Windows, FieldError> {
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

impl Windows {
    /// These windows with `limits` in their order, checked as the
    /// configuration checks them: the error names `windows[i].limit`.
    pub fn with_limits(&self, limits: &[u64]) -> Result<Windows, FieldError> {
        let windows = self
            .iter()
            .zip(limits)
            .enumerate()
            .map(|(i, (w, &limit))| {
                Window::new(w.duration_ms(), limit, w.precision_ms())
                    .map_err(|e| invalid(format!("windows[{i}].{}", e.field), e.problem))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Windows::new(windows)
    }
}

impl Windows {
    /// Each window as windows of their own, over the same state.
    pub(super) fn parts(&self) -> Vec<Windows> {
        (self.iter())
            .filter_map(|w| Windows::new(vec![*w]).ok())
            .collect()
    }

    /// The figures an override's text of `kind` and `words` puts in place
    /// of these: new limits for these very windows, in their order.
    pub(super) fn overridden_by(&self, kind: &str, words: &[&str]) -> Option<Windows> {
        if kind != "windows" || words.len() != self.len() {
            return None;
        }
        let limits = (self.iter())
            .zip(words)
            .map(|(w, named)| {
                let (duration_ms, limit) = named.split_once(':')?;
                text_number(duration_ms).filter(|d| *d == w.duration_ms())?;
                text_number(limit)
            })
            .collect::<Option<Vec<u64>>>()?;
        self.with_limits(&limits).ok()
    }
}

impl Algorithm for Windows {
    fn written(&self) -> &'static Written {
        &WRITTEN
    }

    fn capacity(&self) -> u64 {
        self.iter().map(Window::limit).min().unwrap_or(0)
    }

    fn longest_ms(&self) -> u64 {
        self.iter().map(Window::duration_ms).max().unwrap_or(1)
    }

    fn quotas(&self) -> Vec<(u64, u64)> {
        (self.iter())
            .map(|w| (w.limit(), w.duration_ms().div_ceil(1000).max(1)))
            .collect()
    }

    fn items(&self) -> usize {
        self.len()
    }

    /// A lease's units count in the request's buckets, so any window
    /// takes them: one `share`th of the smallest limit after a request.
    fn lease_largest(&self, _for_ms: u64, share: u64) -> u64 {
        self.capacity().saturating_sub(1) / share
    }

    fn lease_longest_ms(&self, _units: u64, _share: u64) -> Option<u64> {
        None
    }

    fn lease_cap_ms(&self, for_ms: u64) -> u64 {
        self.iter().map(Window::precision_ms).fold(for_ms, u64::min)
    }

    fn lease_horizon_ms(&self, for_ms: u64, shifted_ms: &dyn Fn() -> u64) -> u64 {
        let shifted = shifted_ms();
        (self.iter())
            .map(|w| w.precision_ms() - shifted % w.precision_ms())
            .fold(for_ms, u64::min)
    }
}

impl Described for Windows {
    fn describe(&self) -> String {
        let list: Vec<String> = (self.iter())
            .map(|w| {
                format!(
                    "{}/{}ms by {}ms",
                    w.limit(),
                    w.duration_ms(),
                    w.precision_ms()
                )
            })
            .collect();
        format!("windowed {}", list.join(" + "))
    }

    fn figures(&self) -> String {
        let list: Vec<String> = (self.iter())
            .map(|w| format!("{}/{}ms", w.limit(), w.duration_ms()))
            .collect();
        format!("windowed {}", list.join(" + "))
    }

    fn labels(&self) -> Vec<String> {
        (self.iter())
            .map(|w| format!("window {}ms by {}ms", w.duration_ms(), w.precision_ms()))
            .collect()
    }

    fn describe_lease(&self, units: u64, for_ms: u64, largest: u64) -> String {
        format!(
            ", lease {units} units for {for_ms}ms or to the bucket's end if sooner (the limits allow up to {largest})"
        )
    }

    /// Each limit names its window's duration, so that a rule redeployed
    /// with other durations finds its override none, not set on other
    /// windows.
    fn override_text(&self) -> String {
        let limits: Vec<String> = (self.iter())
            .map(|w| format!("{}:{}", w.duration_ms(), w.limit()))
            .collect();
        format!("windows {}", limits.join(" "))
    }
}
