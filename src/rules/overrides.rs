//! Limits changed at runtime: what an override puts in place of a rule's
//! figures, and its text as Redis stores it. The script reads the same
//! text (`lua/limiter.lua`); anything else in an override key counts as
//! no override.

use serde_json::{Map, Value};

use super::{fields::FieldError, policy::Policy, rule::Rule};

/// What an override does to its rule, for every client or for one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Override {
    /// These figures in place of the rule's (a GCRA rule or a windowed one).
    Figures(Policy),
    /// The client is denied outright.
    Block,
}

/// The text's version: a later format is read as no override.
const VERSION: &str = "v1";

/// The text of [`Override::Block`].
pub const BLOCK_TEXT: &str = "v1 block";

/// The longest text an override may have: every one this release writes
/// is shorter (eight windows take under 200 bytes), so a reader need never
/// take in more than this to know a value is none.
pub const MAX_TEXT_BYTES: usize = 256;

impl Override {
    /// The text stored in Redis: `v1 block`; `v1 gcra <rate> <period_ms>
    /// <burst> <interval_us>` (the script reads the last two); or `v1
    /// windows` and `<duration_ms>:<limit>` per window, in the rule's
    /// order: each limit names its window, so that a rule redeployed with
    /// other durations finds its override none, not set on other windows.
    pub fn to_text(&self) -> String {
        match self {
            Override::Block => BLOCK_TEXT.to_owned(),
            Override::Figures(p) => format!("{VERSION} {}", p.described().override_text()),
        }
    }

    /// The override `text` holds for a rule of `policy`; `None` when it is
    /// not one this release wrote for such a rule (a stray write, another
    /// format, figures of the other algorithm, windows the rule does not
    /// have in that order, or an earlier release's limits by position).
    pub fn parse(text: &str, policy: &Policy) -> Option<Override> {
        if text.len() > MAX_TEXT_BYTES {
            return None;
        }
        let mut words = text.split(' ');
        if words.next() != Some(VERSION) {
            return None;
        }
        let kind = words.next()?;
        let words: Vec<&str> = words.collect();
        match (kind, words.as_slice()) {
            ("block", []) => Some(Override::Block),
            _ => policy.override_figures(kind, &words).map(Override::Figures),
        }
    }

    /// `rule`'s figures with the ones `given` changed, by the names its
    /// algorithm's [`Written::options`](crate::rules::policy::Written) lists (`limit set --rate`,
    /// `--limit` per window), checked as the configuration checks the rule:
    /// the error names the figure, or the rule's field the figures do not
    /// fit (`cost`, `lease`, `lease_for`).
    pub fn changed(rule: &Rule, given: &Map<String, Value>) -> Result<Override, FieldError> {
        let figures = rule.policy.changed(given)?;
        rule.fits(&figures)?;
        Ok(Override::Figures(figures))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{
        lease::Lease,
        policy::{Concurrency, Gcra, Window, Windows, MAX_DURATION_MS, MAX_UNITS, MAX_WINDOWS},
        rule::Cost,
    };
    use serde_json::json;

    /// The figures an override changes, as `limit set` passes them.
    fn given(figures: Value) -> Map<String, Value> {
        figures.as_object().cloned().unwrap_or_default()
    }

    fn gcra(rate: u64, period_ms: u64, burst: u64) -> Policy {
        Policy::Gcra(Gcra::new(rate, period_ms, burst).unwrap())
    }

    /// A rule of `policy`, every other field at its default.
    fn rule(policy: &Policy) -> Rule {
        Rule::with_policy("r", policy.clone())
    }

    #[test]
    fn overrides_round_trip_through_their_text() {
        let g = gcra(10, 1000, 20);
        let windows = Policy::Windowed(
            Windows::new(vec![
                Window::new(1000, 10, 100).unwrap(),
                Window::new(60_000, 100, 1000).unwrap(),
            ])
            .unwrap(),
        );
        let more =
            Override::changed(&rule(&g), &given(json!({"rate": 100, "burst": 200}))).unwrap();
        assert_eq!(more.to_text(), "v1 gcra 100 1000 200 10000");
        assert_eq!(Override::parse(&more.to_text(), &g), Some(more));
        let w = Override::changed(&rule(&windows), &given(json!({"limits": [20, 200]}))).unwrap();
        assert_eq!(w.to_text(), "v1 windows 1000:20 60000:200");
        assert_eq!(Override::parse(&w.to_text(), &windows), Some(w));
        assert_eq!(Override::parse("v1 block", &g), Some(Override::Block));
    }

    /// A windowed override names its windows: after a redeploy that keeps
    /// their number but changes a duration, or their order, it is none, as
    /// an earlier release's limits by position are.
    #[test]
    fn a_windowed_override_holds_only_for_the_windows_it_names() {
        let windows = |durations: [u64; 2]| {
            let ws = durations.map(|d| Window::new(d, 10, d).unwrap()).to_vec();
            Policy::Windowed(Windows::new(ws).unwrap())
        };
        let before = windows([1000, 60_000]);
        let text = Override::changed(&rule(&before), &given(json!({"limits": [20, 200]})))
            .unwrap()
            .to_text();
        assert!(Override::parse(&text, &before).is_some());
        for after in [windows([1000, 3_600_000]), windows([60_000, 1000])] {
            assert_eq!(Override::parse(&text, &after), None, "{after:?}");
        }
        for text in [
            "v1 windows 20 200",
            "v1 windows 1000:20",
            "v1 windows 1000:20 60000:200 60000:200",
            "v1 windows 1000:20 060000:200",
            "v1 windows 1000:20 60000:0",
            "v1 windows 1000:20 60000",
        ] {
            assert_eq!(Override::parse(text, &before), None, "{text:?}");
        }
    }

    #[test]
    fn anything_else_is_no_override() {
        let g = gcra(10, 1000, 20);
        for text in [
            "",
            "block",
            "v2 block",
            "v1 block 1",
            "v1 gcra 100 1000 200",
            "v1 gcra 100 1000 200 9999",
            "v1 gcra 100 1000 +200 10000",
            "v1 gcra 0 1000 200 0",
            "v1 windows 20",
            "v1  gcra 100 1000 200 10000",
            "{\"rate\": 100}",
            format!("v1 block{}", " 1".repeat(8000)).as_str(),
        ] {
            assert_eq!(Override::parse(text, &g), None, "{text:?}");
        }
    }

    /// The longest overrides this release writes stay within the bound
    /// past which any text is none.
    #[test]
    fn every_override_fits_the_longest_text() {
        let g = gcra(31_622_400_000_000, MAX_DURATION_MS, 1);
        let most = Override::changed(&rule(&g), &given(json!({}))).unwrap();
        let windows: Vec<Window> = (0..MAX_WINDOWS as u64)
            .map(|i| MAX_DURATION_MS - i * 1000)
            .map(|d| Window::new(d, MAX_UNITS, d).unwrap())
            .collect();
        let ws = Policy::Windowed(Windows::new(windows).unwrap());
        let limits = Override::changed(
            &rule(&ws),
            &given(json!({"limits": vec![MAX_UNITS; MAX_WINDOWS]})),
        )
        .unwrap();
        for (o, policy) in [(most, g), (limits, ws)] {
            let text = o.to_text();
            assert!(text.len() <= MAX_TEXT_BYTES, "{} bytes: {text}", text.len());
            assert_eq!(Override::parse(&text, &policy), Some(o));
        }
    }

    #[test]
    fn an_in_flight_override_changes_the_limit_and_keeps_the_hold() {
        let policy = Policy::Concurrency(Concurrency::new(4, 30_000).unwrap());
        let r = rule(&policy);
        let more = Override::changed(&r, &given(json!({"limits": [9]}))).unwrap();
        assert_eq!(more.to_text(), "v1 concurrency 9");
        let read = Override::parse("v1 concurrency 9", &policy);
        assert_eq!(read, Some(more));
        let Some(Override::Figures(Policy::Concurrency(c))) = read else {
            panic!("{read:?}");
        };
        assert_eq!((c.limit(), c.hold_ms()), (9, 30_000));
        for text in [
            "v1 concurrency 0",
            "v1 concurrency 09",
            "v1 concurrency 1000001",
            "v1 gcra 1 1000 1 1000000",
        ] {
            assert_eq!(Override::parse(text, &policy), None, "{text}");
        }
        let e = Override::changed(&r, &given(json!({"limits": [1, 2]}))).unwrap_err();
        assert_eq!(e.field, "limit");
        let e = Override::changed(&r, &given(json!({"rate": 2}))).unwrap_err();
        assert_eq!(e.field, "rate");
    }

    #[test]
    fn figures_are_checked_as_the_configuration_checks_them() {
        let g = rule(&gcra(10, 1000, 20));
        assert_eq!(
            Override::changed(&g, &given(json!({"rate": 0})))
                .unwrap_err()
                .field,
            "rate"
        );
        assert_eq!(
            Override::changed(&g, &given(json!({"period": 367_u64 * 86_400_000})))
                .unwrap_err()
                .field,
            "period"
        );
        let w = rule(&Policy::Windowed(
            Windows::new(vec![Window::new(1000, 10, 100).unwrap()]).unwrap(),
        ));
        assert_eq!(
            Override::changed(&w, &given(json!({"limits": [0]})))
                .unwrap_err()
                .field,
            "windows[0].limit"
        );
        assert_eq!(
            Override::changed(&w, &given(json!({"limits": [1, 2]})))
                .unwrap_err()
                .field,
            "limit"
        );
        assert_eq!(
            Override::changed(&g, &given(json!({"limits": [1]})))
                .unwrap_err()
                .field,
            "limits"
        );
        assert_eq!(
            Override::changed(&w, &given(json!({"rate": 5})))
                .unwrap_err()
                .field,
            "rate"
        );
    }

    /// Figures are checked against the whole rule, as the configuration
    /// checks it: a cost the new figures can never admit, a lease they
    /// cannot grant.
    #[test]
    fn figures_are_checked_against_the_whole_rule() {
        let costly = Rule {
            cost: Cost {
                default: 1,
                per_method: vec![("POST".into(), 5)],
            },
            ..rule(&gcra(10, 1000, 20))
        };
        assert_eq!(
            Override::changed(&costly, &given(json!({"burst": 1})))
                .unwrap_err()
                .field,
            "cost"
        );
        assert!(Override::changed(&costly, &given(json!({"burst": 5}))).is_ok());
        let g = gcra(100, 1000, 300);
        let leasing = Rule {
            lease: Some(Lease::new(&g, 20, Some(2000)).unwrap()),
            ..rule(&g)
        };
        for burst in [30, 100] {
            let e = Override::changed(&leasing, &given(json!({"burst": burst}))).unwrap_err();
            assert!(e.field.starts_with("lease"), "{burst}: {e:?}");
        }
        assert!(Override::changed(&leasing, &given(json!({"burst": 250}))).is_ok());
        let w = Policy::Windowed(Windows::new(vec![Window::new(1000, 21, 100).unwrap()]).unwrap());
        let leasing = Rule {
            lease: Some(Lease::new(&w, 10, None).unwrap()),
            ..rule(&w)
        };
        assert_eq!(
            Override::changed(&leasing, &given(json!({"limits": [20]})))
                .unwrap_err()
                .field,
            "lease"
        );
        assert_eq!(
            Override::changed(&leasing, &given(json!({"limits": [5]})))
                .unwrap_err()
                .field,
            "lease"
        );
        assert!(Override::changed(&leasing, &given(json!({"limits": [21]}))).is_ok());
    }
}
