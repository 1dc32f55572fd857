//! A reference model of both algorithms, and of how one request's rules are
//! decided together (enforced and shadow), in plain Rust, written from their
//! definitions rather than from the Lua: counts are summed over the buckets
//! inside each window, not kept as running totals. Property tests hold the
//! real script to it field by field; a policy simulator can run on it.

use std::collections::{BTreeMap, HashMap};

use crate::{
    config::Mode,
    decision::{later, Check, Decision, RuleState},
    keys::{redis_key, window_offset},
    policy::{Gcra, Policy, Window},
};

/// State of every key the model has seen; nothing ever expires, because an
/// expired key and a key whose state is all in the past decide alike.
#[derive(Debug, Default, Clone)]
pub struct Model {
    /// GCRA: theoretical arrival time per key, microseconds.
    tats: HashMap<String, u64>,
    /// Windowed: admitted cost per bucket id, per key and (duration, precision).
    buckets: HashMap<(String, u64, u64), BTreeMap<i64, u64>>,
}

/// What a rule would store if the request is admitted.
enum Write {
    Tat(u64),
    Buckets(Vec<((u64, u64), i64, u64)>),
}

impl Model {
    /// An empty model.
    pub fn new() -> Model {
        Model::default()
    }

    /// Decides one request at `now_ms`, exactly as the script would.
    pub fn decide(&mut self, checks: &[(Check<'_>, Vec<&str>)], now_ms: u64) -> Decision {
        let keys: Vec<String> = checks
            .iter()
            .map(|(c, id)| redis_key(&c.rule.name, id))
            .collect();
        let mut states = Vec::with_capacity(checks.len());
        let mut writes = Vec::with_capacity(checks.len());
        for ((check, _), key) in checks.iter().zip(&keys) {
            let (state, write) = self.check(&check.rule.policy, key, check.cost, now_ms);
            states.push(state);
            writes.push(write);
        }
        let modes: Vec<Mode> = checks.iter().map(|(c, _)| c.rule.mode).collect();
        let allowed = !states
            .iter()
            .zip(&modes)
            .any(|(s, m)| !s.allowed && *m == Mode::Enforce);
        if allowed {
            for (write, key) in writes.into_iter().zip(&keys) {
                match write {
                    Some(Write::Tat(tat)) => {
                        self.tats.insert(key.clone(), tat);
                    }
                    Some(Write::Buckets(adds)) => {
                        for ((duration, precision), id, cost) in adds {
                            *self
                                .buckets
                                .entry((key.clone(), duration, precision))
                                .or_default()
                                .entry(id)
                                .or_default() += cost;
                        }
                    }
                    None => {}
                }
            }
        } else {
            for (i, ((check, _), key)) in checks.iter().zip(&keys).enumerate() {
                if states[i].allowed {
                    states[i] = self.check(&check.rule.policy, key, 0, now_ms).0;
                }
            }
        }
        Decision::settle(states, &modes)
    }

    /// Forgets `key`'s state.
    pub fn reset(&mut self, key: &str) {
        self.tats.remove(key);
        self.buckets.retain(|(k, _, _), _| k != key);
    }

    fn check(
        &self,
        policy: &Policy,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> (RuleState, Option<Write>) {
        match policy {
            Policy::Gcra(g) => self.check_gcra(g, key, cost, now_ms),
            Policy::Windowed(ws) => {
                let offset = window_offset(key, policy.longest_ms());
                self.check_windowed(ws, key, cost, now_ms + offset)
            }
        }
    }

    fn check_gcra(
        &self,
        g: &Gcra,
        key: &str,
        cost: u64,
        now_ms: u64,
    ) -> (RuleState, Option<Write>) {
        let now = now_ms * 1000;
        let tat = self.tats.get(key).copied().unwrap_or(now).max(now);
        let state = RuleState::gcra(g, cost, tat - now);
        let wanted = tat + cost * g.interval_us();
        (
            state,
            (state.allowed && cost > 0).then_some(Write::Tat(wanted)),
        )
    }

    /// `shifted` is now plus the key's offset: bucket edges fall on its multiples.
    fn check_windowed(
        &self,
        windows: &[Window],
        key: &str,
        cost: u64,
        shifted: u64,
    ) -> (RuleState, Option<Write>) {
        let shifted = shifted as i64;
        let mut per_window = Vec::with_capacity(windows.len());
        for w in windows {
            let (p, n) = (
                w.precision_ms() as i64,
                (w.duration_ms() / w.precision_ms()) as i64,
            );
            let cur = shifted.div_euclid(p);
            let first = cur - n + 1;
            let empty = BTreeMap::new();
            let buckets = self
                .buckets
                .get(&(key.to_owned(), w.duration_ms(), w.precision_ms()))
                .unwrap_or(&empty);
            let counted: Vec<(i64, u64)> = buckets
                .range(first..=cur)
                .map(|(id, c)| (*id, *c))
                .collect();
            let total: u64 = counted.iter().map(|(_, c)| c).sum();
            let admit = total + cost <= w.limit();
            let after = if admit { total + cost } else { total };
            let retry = if admit {
                Some(0)
            } else if cost > w.limit() {
                None
            } else {
                // The oldest buckets leave first; find the one whose leaving frees enough.
                let need = total + cost - w.limit();
                let mut freed = 0;
                let leaving = counted.iter().find(|(_, c)| {
                    freed += c;
                    freed >= need
                });
                leaving.map(|(id, _)| ((id + n) * p - shifted) as u64)
            };
            let newest = if admit && cost > 0 {
                Some(cur)
            } else {
                counted.last().map(|(id, _)| *id)
            };
            let reset = match newest {
                Some(id) if after > 0 => ((id + n) * p - shifted) as u64,
                _ => 0,
            };
            per_window.push((
                admit,
                w.limit(),
                w.limit() as i64 - after as i64,
                reset,
                retry,
                cur,
            ));
        }

        let mut admit = true;
        let mut bound = 0;
        for (i, (ok, _, remaining, _, retry, _)) in per_window.iter().enumerate() {
            if !ok {
                if admit || later(*retry, per_window[bound].4) {
                    bound = i;
                }
                admit = false;
            } else if admit && *remaining < per_window[bound].2 {
                bound = i;
            }
        }
        let (_, limit, remaining, reset, retry, _) = per_window[bound];
        let state = RuleState {
            allowed: admit,
            limit,
            remaining: remaining.max(0) as u64,
            reset_after_ms: reset,
            retry_after_ms: if admit { Some(0) } else { retry },
            window: bound + 1,
        };
        let write = (admit && cost > 0).then(|| {
            Write::Buckets(
                windows
                    .iter()
                    .zip(&per_window)
                    .map(|(w, pw)| ((w.duration_ms(), w.precision_ms()), pw.5, cost))
                    .collect(),
            )
        });
        (state, write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use serde_json::json;

    fn rules(list: serde_json::Value) -> Vec<crate::config::Rule> {
        Config::from_json(&json!({ "rules": list })).unwrap().rules
    }

    #[test]
    fn gcra_admits_the_burst_then_one_per_interval() {
        let r = rules(
            json!([{"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 2, "period": "1s", "burst": 3}]),
        );
        let mut m = Model::new();
        let check = |m: &mut Model, t| {
            m.decide(
                &[(
                    Check {
                        rule: &r[0],
                        cost: 1,
                    },
                    vec!["a"],
                )],
                t,
            )
        };
        // (time ms, admitted, remaining, retry-after ms)
        let steps = [
            (0, true, 2, Some(0)),
            (0, true, 1, Some(0)),
            (0, true, 0, Some(0)),
            (0, false, 0, Some(500)),
            (499, false, 0, Some(1)),
            (500, true, 0, Some(0)),
            (2000, true, 2, Some(0)),
        ];
        for (t, allowed, remaining, retry) in steps {
            let d = check(&mut m, t);
            assert_eq!(
                (d.allowed, d.rules[0].remaining, d.retry_after_ms),
                (allowed, remaining, retry),
                "at {t}"
            );
        }
    }

    #[test]
    fn windowed_counts_only_buckets_inside_the_window() {
        // offset is derived from the key; read it to place steps on bucket edges.
        let r = rules(
            json!([{"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 3, "250ms"]]}]),
        );
        let offset = window_offset(&redis_key("w", &["a"]), 1000);
        let base = 10_000 - offset; // shifted time 10 000: a bucket edge
        let mut m = Model::new();
        let mut at = |t: u64, cost| m.decide(&[(Check { rule: &r[0], cost }, vec!["a"])], base + t);
        assert!(at(0, 2).allowed);
        assert!(at(300, 1).allowed);
        let denied = at(400, 1);
        assert!(!denied.allowed);
        // The first bucket [0, 250) leaves the window at 1000.
        assert_eq!(denied.retry_after_ms, Some(600));
        assert!(!at(999, 1).allowed);
        let later = at(1000, 1);
        assert!(later.allowed);
        assert_eq!(later.rules[0].remaining, 1);
        // Peek: nothing consumed.
        assert_eq!(at(1000, 0).rules[0].remaining, 1);
    }

    #[test]
    fn a_denial_consumes_nothing_anywhere() {
        let r = rules(json!([
            {"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s"},
            {"name": "b", "key": ["ip"], "algorithm": "windowed", "windows": [["1m", 1, "1m"]]}
        ]));
        let mut m = Model::new();
        let checks = [
            (
                Check {
                    rule: &r[0],
                    cost: 1,
                },
                vec!["x"],
            ),
            (
                Check {
                    rule: &r[1],
                    cost: 1,
                },
                vec!["x"],
            ),
        ];
        assert!(m.decide(&checks, 0).allowed);
        let d = m.decide(&checks, 1);
        assert!(!d.allowed);
        assert_eq!(d.binding, 1);
        assert!(d.rules[0].allowed);
        assert_eq!(
            d.rules[0].remaining, 9,
            "rule a reports its state without this request"
        );
    }
}
