//! Quota leases: how many units a rule may hand an isolate ahead of its
//! requests, and for how long, checked against the rule's figures so that
//! a lease the script would never grant is refused in the configuration.
//!
//! The script grants a lease only from what a rule has left after the
//! request, and never more than half of it ([`LEASE_SHARE`]), so isolates
//! competing for a nearly spent key fall back to one call per request.

use super::{
    fields::{invalid, FieldError},
    policy::{Policy, MAX_DURATION_MS},
};

/// The share of what a rule has left that one lease may take: 1/2.
pub const LEASE_SHARE: u64 = 2;

/// The most units one lease may hold.
pub const MAX_LEASE_UNITS: u64 = 10_000;

/// How long a lease lasts when `lease_for` is not given, at most.
pub const DEFAULT_LEASE_FOR_MS: u64 = 1000;

/// A rule's lease: up to `units` charged ahead, spent in the isolate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The most units one lease may hold.
    pub units: u64,
    /// How long a lease may be spent, ms. GCRA accounts its units as
    /// arriving at its end; a window's lease also ends with the bucket its
    /// units were counted in, if that comes first. Either way every lease
    /// ends within it, so that figures changed meanwhile reach every
    /// isolate within it too.
    pub for_ms: u64,
}

impl Lease {
    /// A lease of `units` under `policy`, lasting at most `for_ms` (`None`
    /// takes [`DEFAULT_LEASE_FOR_MS`], and for GCRA at most the longest
    /// the burst allows). The error names `lease` or `lease_for`.
    pub fn new(policy: &Policy, units: u64, for_ms: Option<u64>) -> Result<Lease, FieldError> {
        if let Some(why) = policy.algorithm().no_lease() {
            return Err(invalid("lease", why));
        }
        if !(1..=MAX_LEASE_UNITS).contains(&units) {
            return Err(invalid(
                "lease",
                format!("must be between 1 and {MAX_LEASE_UNITS} units"),
            ));
        }
        if for_ms.is_some_and(|ms| ms == 0 || ms > MAX_DURATION_MS) {
            return Err(invalid("lease_for", "must be between 1ms and 366d"));
        }
        // Where the figures bound a lease's length (GCRA's burst), it must
        // fit them; elsewhere only its length and its bucket end it.
        let lease = match policy.algorithm().lease_longest_ms(units, LEASE_SHARE) {
            None => Lease {
                units,
                for_ms: for_ms.unwrap_or(DEFAULT_LEASE_FOR_MS),
            },
            Some(longest_ms) => {
                if longest_ms == 0 {
                    return Err(invalid("lease", format!(
                        "{units} units leave no burst headroom for a lease to last: a lease may take at most {} of what the burst has left after a request; lower the lease or raise the burst",
                        share_text()
                    )));
                }
                let for_ms = for_ms.unwrap_or(longest_ms.min(DEFAULT_LEASE_FOR_MS));
                if for_ms > longest_ms {
                    return Err(invalid("lease_for", format!(
                        "is longer than the burst allows for a lease of {units} units (at most {longest_ms}ms): a lease's units count as spent at its end"
                    )));
                }
                Lease { units, for_ms }
            }
        };
        if lease.units > Lease::largest(policy, lease.for_ms) {
            return Err(invalid("lease", format!(
                "{units} units is more than a fresh client's lease can ever hold ({}): a lease may take at most {} of what the rule has left after a request",
                Lease::largest(policy, lease.for_ms),
                share_text()
            )));
        }
        Ok(lease)
    }

    /// Whether `policy` can grant this lease, as the configuration would
    /// for a rule of these figures: the error names `lease` or
    /// `lease_for`.
    pub fn fits(&self, policy: &Policy) -> Result<(), FieldError> {
        Lease::new(policy, self.units, Some(self.for_ms)).map(|_| ())
    }

    /// The most units a fresh client's lease can hold under `policy`,
    /// lasting `for_ms` (GCRA; windows ignore it): what `edge-limiter
    /// check` reports, the same arithmetic as the script's grant.
    pub fn largest(policy: &Policy, for_ms: u64) -> u64 {
        policy.algorithm().lease_largest(for_ms, LEASE_SHARE)
    }

    /// The longest a GCRA lease of `units` may last at a fresh client, ms
    /// (0: none); windows have no such figure.
    pub fn longest_for_ms(policy: &Policy, units: u64) -> u64 {
        (policy.algorithm())
            .lease_longest_ms(units, LEASE_SHARE)
            .unwrap_or(0)
    }
}

fn share_text() -> String {
    format!("1/{LEASE_SHARE}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::policy::{Gcra, Window, Windows};

    fn gcra(rate: u64, period_ms: u64, burst: u64) -> Policy {
        Policy::Gcra(Gcra::new(rate, period_ms, burst).unwrap())
    }

    #[test]
    fn a_gcra_lease_needs_burst_headroom() {
        // 1/s, burst 10: a lease of 2 leaves 10 - 1 - 2x2 = 5 s of headroom.
        let g = gcra(1, 1000, 10);
        assert_eq!(Lease::longest_for_ms(&g, 2), 5000);
        assert_eq!(
            Lease::new(&g, 2, None),
            Ok(Lease {
                units: 2,
                for_ms: 1000
            })
        );
        assert_eq!(Lease::new(&g, 2, Some(5000)).unwrap().for_ms, 5000);
        assert_eq!(
            Lease::new(&g, 2, Some(5001)).unwrap_err().field,
            "lease_for"
        );
        assert_eq!(Lease::largest(&g, 1000), 4);
        assert_eq!(Lease::largest(&g, 5000), 2);
        // The example of docs/leases.md: burst 3 leaves no room.
        assert_eq!(
            Lease::new(&gcra(1, 1000, 3), 2, None).unwrap_err().field,
            "lease"
        );
        assert_eq!(Lease::new(&g, 0, None).unwrap_err().field, "lease");
        assert_eq!(Lease::new(&g, 2, Some(0)).unwrap_err().field, "lease_for");
    }

    #[test]
    fn a_window_lease_takes_half_the_smallest_limit_at_most() {
        let ws = Policy::Windowed(
            Windows::new(vec![
                Window::new(1000, 21, 100).unwrap(),
                Window::new(60_000, 100, 1000).unwrap(),
            ])
            .unwrap(),
        );
        assert_eq!(Lease::largest(&ws, 0), 10);
        assert_eq!(Lease::new(&ws, 11, None).unwrap_err().field, "lease");
    }

    /// A window's lease ends with its bucket, which for a coarse precision
    /// is up to an hour away: `lease_for` bounds it as it does GCRA's.
    #[test]
    fn a_window_lease_lasts_lease_for_at_most() {
        let hourly = Policy::Windowed(
            Windows::new(vec![Window::new(3_600_000, 1000, 3_600_000).unwrap()]).unwrap(),
        );
        assert_eq!(
            Lease::new(&hourly, 10, None).unwrap().for_ms,
            DEFAULT_LEASE_FOR_MS
        );
        assert_eq!(Lease::new(&hourly, 10, Some(250)).unwrap().for_ms, 250);
        assert_eq!(
            Lease::new(&hourly, 10, Some(0)).unwrap_err().field,
            "lease_for"
        );
    }
}
