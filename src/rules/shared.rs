//! A rule kept across regions (`regions = "shared"`): one limit, its state
//! at the home, each other region spending a pool the home granted it.
//! Here, how long a pool lasts and how many units it may hold, from the
//! rule's figures, and which rules may share at all.
//!
//! A pool is charged at the home as a lease is: its units count as
//! arriving when it ends, and it is granted only if that conforms
//! (`lua/pool.lua`, `docs/deploying.md`).
//!
//! A GCRA rule may also give each region a share of every client's limit
//! (`region_share`), which its Redis decides alone, so that a fresh
//! client's first requests need no far call. The home's figures are the
//! rule's less every region's share, burst and rate alike: the sum of
//! streams that conform to each part conforms to the whole.

use super::{
    fields::{invalid, FieldError},
    lease::LEASE_SHARE,
    policy::{Gcra, Policy},
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
    /// The share of every client's limit each region decides alone.
    pub share: Option<Share>,
}

/// A region's own share of every client's limit: a GCRA of `units` at
/// once, one more every `interval_us`, on the region's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Units a fresh client may spend at once in the region.
    pub units: u64,
    /// Time a unit occupies, microseconds (rounded up).
    pub interval_us: u64,
    /// The rule's figures as written, which the home's and every region's
    /// share add up to at most; `None` until the rule is split.
    pub whole: Option<Gcra>,
}

impl Share {
    /// `units` a region of `gcra`'s burst, for each of `regions` regions
    /// besides the home: the share, and the home's figures, less every
    /// share. The home's interval is rounded up, as the share's is, so the
    /// parts' rates add up to at most the rule's. The error names
    /// `region_share`.
    pub fn split(gcra: &Gcra, regions: u64, units: u64) -> Result<(Share, Gcra), FieldError> {
        let (burst, interval) = (gcra.burst(), gcra.interval_us());
        let taken = units.saturating_mul(regions);
        if units == 0 || taken >= burst {
            return Err(invalid(
                "region_share",
                format!("must be at least 1, and the {regions} region(s) besides the home must leave it some of the burst of {burst}: at most {}", (burst - 1) / regions.max(1)),
            ));
        }
        let left = burst - taken;
        let span = interval * burst;
        // The home's `left` units take the span the whole burst did.
        let mut period_ms = span.div_ceil(1000);
        let home = loop {
            let home = Gcra::new(left, period_ms, left)?;
            if home.interval_us() * left >= span {
                break home;
            }
            period_ms += 1;
        };
        let share = Share {
            units,
            interval_us: span.div_ceil(units),
            whole: Some(*gcra),
        };
        Ok((share, home))
    }
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
        Ok(Pool {
            hold_ms,
            most,
            share: None,
        })
    }

    /// Checks what a shared rule may not combine with: each is decided in
    /// the home's Redis on every request, or per response. A `lease` is
    /// taken from the region's pool away from the home.
    pub fn fits(mode: Mode, settled: bool, penalty: bool) -> Result<(), FieldError> {
        let why = match () {
            _ if mode == Mode::Shadow => "a shadow rule reports every denial it would make, so it is decided in one Redis on every request; remove `regions` or `mode`",
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
                most: 41,
                share: None
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
                most: 49,
                share: None
            })
        );
    }

    /// The home keeps the rule less every region's share, burst and rate:
    /// the parts add up to the rule.
    #[test]
    fn a_regions_share_comes_out_of_the_homes_figures() {
        let regions = json!([{"name": "us", "home": true}, {"name": "eu", "colos": ["FRA"]},
                             {"name": "ap", "colos": ["SIN"]}]);
        let rule = json!({"name": "r", "key": ["ip"], "algorithm": "gcra", "rate": 100,
                          "period": "1m", "burst": 20, "regions": "shared", "region_share": 3});
        let c = Config::from_json(&json!({"rules": [rule], "regions": regions})).unwrap();
        let Policy::Gcra(home) = c.rules[0].policy else {
            panic!("a GCRA rule");
        };
        assert_eq!((home.burst(), home.interval_us()), (14, 857_143));
        let share = c.rules[0].shared.unwrap().share.unwrap();
        assert_eq!((share.units, share.interval_us), (3, 4_000_000));
        assert_eq!(
            share.whole.map(|w| w.burst()),
            Some(20),
            "the rule as written"
        );
        // The parts add up to the rule's burst, and to no more than its rate.
        assert_eq!(home.burst() + 2 * share.units, 20);
        let rate = 1.0 / home.interval_us() as f64 + 2.0 / share.interval_us as f64;
        assert!(rate <= 1.0 / 600_000.0, "{rate}");
        for (rule, says) in [
            (
                json!({"algorithm": "windowed", "windows": [["1m", 100, "10s"]], "region_share": 2}),
                "GCRA",
            ),
            (
                json!({"algorithm": "gcra", "rate": 100, "period": "1m", "region_share": 2, "overrides": true}),
                "overrides",
            ),
            (
                json!({"algorithm": "gcra", "rate": 100, "period": "1m", "region_share": 100}),
                "at most 99",
            ),
            (
                json!({"algorithm": "gcra", "rate": 100, "period": "1m", "region_share": 0}),
                "at least 1",
            ),
        ] {
            let error = pool(rule).unwrap_err();
            assert!(
                error.contains("region_share") && error.contains(says),
                "{error}"
            );
        }
        let alone = json!({"name": "r", "key": ["ip"], "algorithm": "gcra", "rate": 10,
                           "period": "1s", "region_share": 2});
        let error = Config::from_json(&json!({"rules": [alone]}))
            .unwrap_err()
            .to_string();
        assert!(error.contains("needs `regions = \"shared\"`"), "{error}");
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
                most: 47,
                share: None
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
