//! A rule kept across regions (`regions = "shared"`): one limit, its state
//! at the home, each other region spending a pool the home granted it.
//! Here, how long a pool lasts and how many units it may hold, from the
//! rule's figures, and which rules may share at all.
//!
//! A pool is charged at the home as a lease is: its units count as
//! arriving when it ends, and it is granted only if that conforms
//! (`lua/pool.lua`, `docs/deploying.md`).

use super::{
    fields::{invalid, FieldError},
    lease::LEASE_SHARE,
    policy::Policy,
    rule::Mode,
};

/// The longest a pool lasts, and no longer than `cache_hold`: a `limit
/// set` at the home reaches every region within it.
pub const MAX_POOL_MS: u64 = 10_000;

/// What a region's pool of a shared rule may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// How long a pool lasts at most, ms; also the span its demand is
    /// measured over.
    pub hold_ms: u64,
    /// The most units one top-up asks for.
    pub most: u64,
}

impl Pool {
    /// The pool of a shared rule with `policy`: as long as `longest_ms`
    /// (at most [`MAX_POOL_MS`]) and the figures allow while leaving a
    /// fresh client's pool at least half the units a lease of no length
    /// could take. The error names `regions`.
    pub fn of(policy: &Policy, longest_ms: u64) -> Result<Pool, FieldError> {
        let algorithm = policy.algorithm();
        if algorithm.no_lease().is_some() || algorithm.released() {
            return Err(invalid("regions", "a shared rule's regions spend pools the home granted, as leases are spent, which this rule cannot take; remove `regions` or use a GCRA or windowed rule without `on_limit`"));
        }
        let full = algorithm.lease_largest(0, LEASE_SHARE);
        let mut hold_ms = algorithm.lease_cap_ms(longest_ms.min(MAX_POOL_MS));
        while hold_ms > 1 && 2 * algorithm.lease_largest(hold_ms, LEASE_SHARE) < full {
            hold_ms /= 2;
        }
        let most = algorithm.lease_largest(hold_ms, LEASE_SHARE);
        if most == 0 {
            return Err(invalid("regions", "the figures leave no room for a pool: a region would send every request to the home; raise `burst` (or the window's limit), or remove `regions`"));
        }
        Ok(Pool { hold_ms, most })
    }

    /// Checks what a shared rule may not combine with: each is decided in
    /// the home's Redis on every request, or per response.
    pub fn fits(mode: Mode, lease: bool, settled: bool, penalty: bool) -> Result<(), FieldError> {
        let why = match () {
            _ if mode == Mode::Shadow => "a shadow rule reports every denial it would make, so it is decided in one Redis on every request; remove `regions` or `mode`",
            _ if lease => "a shared rule's regions hold pools in place of an isolate's lease; remove `lease` or `regions`",
            _ if settled => "a rule that settles per response (`count_status`, `cost_header`) does so in one Redis; remove it or `regions`",
            _ if penalty => "a penalty starts in the Redis that denied, which a region spending its pool is not; remove `penalty` or `regions`",
            _ => return Ok(()),
        };
        Err(invalid("regions", why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::config::Config;
    use serde_json::json;

    fn pool(rule: serde_json::Value) -> Result<Option<Pool>, String> {
        let regions = json!([{"name": "us", "home": true}, {"name": "eu", "continents": ["EU"]}]);
        let mut rule = rule;
        rule["name"] = json!("r");
        rule["key"] = json!(["ip"]);
        rule["regions"] = json!("shared");
        Config::from_json(&json!({"rules": [rule], "regions": regions}))
            .map(|c| c.rules[0].shared)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_pool_lasts_as_long_as_the_figures_leave_room_for() {
        // 100 a minute, burst 100: 0.6 s an interval, a 10 s pool of 41.
        let gcra = pool(json!({"algorithm": "gcra", "rate": 100, "period": "1m"})).unwrap();
        assert_eq!(
            gcra,
            Some(Pool {
                hold_ms: 10_000,
                most: 41
            })
        );
        // Burst 10 at 10/s: 1 s of tolerance, halved until half the units fit.
        let tight = pool(json!({"algorithm": "gcra", "rate": 10, "period": "1s"})).unwrap();
        let tight = tight.unwrap();
        assert!(tight.hold_ms <= 1000 && tight.most >= 2, "{tight:?}");
        // A window's pool ends with its bucket.
        let windows = json!({"algorithm": "windowed", "windows": [["1m", 100, "10s"]]});
        assert_eq!(
            pool(windows).unwrap(),
            Some(Pool {
                hold_ms: 10_000,
                most: 49
            })
        );
    }

    #[test]
    fn a_pool_lasts_no_longer_than_cache_hold() {
        let regions = json!([{"name": "us", "home": true}, {"name": "eu", "colos": ["FRA"]}]);
        let rule = json!({"name": "r", "key": ["ip"], "algorithm": "gcra", "rate": 100,
                          "period": "1m", "regions": "shared"});
        let c =
            Config::from_json(&json!({"rules": [rule], "regions": regions, "cache_hold": "2s"}));
        assert_eq!(
            c.unwrap().rules[0].shared,
            Some(Pool {
                hold_ms: 2000,
                most: 47
            })
        );
    }

    #[test]
    fn a_rule_that_cannot_pool_is_refused_naming_regions() {
        for (rule, says) in [
            (
                json!({"algorithm": "gcra", "rate": 1, "period": "1s"}),
                "no room for a pool",
            ),
            (
                json!({"algorithm": "concurrency", "limit": 5}),
                "cannot take",
            ),
            (
                json!({"algorithm": "gcra", "rate": 10, "period": "1s", "burst": 20, "mode": "shadow"}),
                "shadow",
            ),
            (
                json!({"algorithm": "gcra", "rate": 10, "period": "1s", "burst": 20, "lease": 2}),
                "lease",
            ),
            (
                json!({"algorithm": "gcra", "rate": 10, "period": "1s", "burst": 20, "penalty": "1m"}),
                "penalty",
            ),
            (
                json!({"algorithm": "gcra", "rate": 10, "period": "1s", "burst": 20, "count_status": [200]}),
                "settles",
            ),
        ] {
            let error = pool(rule).unwrap_err();
            assert!(error.contains("regions") && error.contains(says), "{error}");
        }
        let mut other =
            json!({"name": "r", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s"});
        other["regions"] = json!("eu");
        let error = Config::from_json(&json!({"rules": [other]}))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("regions") && error.contains("\"shared\""),
            "{error}"
        );
        // Without a region besides the home there is nothing to share.
        other["regions"] = json!("shared");
        let error = Config::from_json(&json!({"rules": [other]}))
            .unwrap_err()
            .to_string();
        assert!(error.contains("no region besides the home"), "{error}");
    }
}
