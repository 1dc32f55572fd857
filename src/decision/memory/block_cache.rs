//! The in-isolate block cache: once Redis has said a request is denied until
//! T, the same request is answered locally until T, with no round trip, for
//! at most the configured hold at a time.

use super::seeded::SeededMap;

use crate::decision::outcomes::verdict::{Decision, RequestVerdict, Retry, Verdict};

/// Denied requests, keyed by everything that decided them (keys, costs,
/// policies), with the instant they were decided and the instant they stop
/// being answered from memory.
#[derive(Debug)]
pub struct BlockCache {
    entries: SeededMap<String, (u64, u64, Decision)>,
    /// How long a denial is answered from memory before Redis is asked
    /// again, however long it lasts: an `edge-limiter reset` (or a limit
    /// raised by a deploy) then reaches every isolate within this.
    hold_ms: u64,
}

/// Entries kept at most; a flood of distinct denied clients cannot grow the
/// isolate's memory beyond this.
pub const CAPACITY: usize = 10_000;

/// How long after it was made `decision` is answered from memory, under a
/// hold of `hold_ms`: a denial without end (a block, a cost beyond the
/// limit) for the whole hold.
fn held_for(hold_ms: u64, decision: &Decision) -> u64 {
    match decision.retry() {
        Some(Retry::Never) => hold_ms,
        Some(Retry::After { ms }) => ms.min(hold_ms),
        None => 0,
    }
}

impl BlockCache {
    /// An empty cache that answers each denial from memory for at most
    /// `hold_ms` at a time.
    pub fn new(hold_ms: u64) -> BlockCache {
        BlockCache {
            entries: SeededMap::default(),
            hold_ms,
        }
    }

    /// The denial for `signature` if it still holds at `now_ms`, with every
    /// time in it moved on by the time since it was made.
    pub fn lookup(&mut self, signature: &str, now_ms: u64) -> Option<Decision> {
        let (decided_at, until, decision) = self.entries.get(signature)?;
        let elapsed = now_ms.saturating_sub(*decided_at);
        if now_ms >= *until {
            self.entries.remove(signature);
            return None;
        }
        let mut d = decision.clone();
        // Answered from memory, it starts no penalty: Redis's call did.
        d.penalties_started.clear();
        if let RequestVerdict::Denied { retry, .. } = &mut d.verdict {
            *retry = retry.aged(elapsed);
        }
        for r in &mut d.rules {
            r.reset_after_ms = r.reset_after_ms.saturating_sub(elapsed);
            if let Verdict::Denied(retry) = &mut r.verdict {
                *retry = retry.aged(elapsed);
            }
        }
        Some(d)
    }

    /// Remembers a denial made at `now_ms` that lasts, until `early_ms`
    /// before it ends: a delaying rule admits the request that much early.
    pub fn remember(&mut self, signature: String, decision: &Decision, now_ms: u64, early_ms: u64) {
        let held = held_for(self.hold_ms, decision);
        if held <= early_ms {
            return;
        }
        if self.entries.len() >= CAPACITY {
            self.entries.retain(|_, (_, until, _)| now_ms < *until);
            if self.entries.len() >= CAPACITY {
                // Still full of live denials: forget them all rather than
                // grow; each costs one more round trip at worst.
                self.entries.clear();
            }
        }
        let until = now_ms + (held - early_ms);
        self.entries
            .insert(signature, (now_ms, until, decision.clone()));
    }

    /// Forgets the denial of the call of `signature`: units given back may
    /// admit that client's next request, which Redis then decides.
    pub fn forget(&mut self, signature: &str) {
        self.entries.remove(signature);
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::outcomes::verdict::RuleState;

    const HOLD: u64 = 60_000;

    fn denied(retry: u64) -> Decision {
        let retry = Retry::After { ms: retry };
        Decision {
            verdict: RequestVerdict::Denied { binding: 0, retry },
            penalties_started: vec![],
            refund_marks: vec![],
            grants: vec![],
            overrides: vec![],
            pools: vec![],
            rules: vec![RuleState {
                verdict: Verdict::Denied(retry),
                limit: 5,
                remaining: 0,
                reset_after_ms: 3000,
                window: 1,
            }],
        }
    }

    /// A call given back frees its own denial, and no other.
    #[test]
    fn a_call_given_back_forgets_its_denial() {
        let mut c = BlockCache::new(HOLD);
        c.remember("el:{a}:login\n1".into(), &denied(5000), 0, 0);
        c.remember("el:{b}:login\n1".into(), &denied(5000), 0, 0);
        c.forget("el:{a}:login\n1");
        assert_eq!(c.len(), 1);
        assert!(c.lookup("el:{b}:login\n1", 100).is_some());
    }

    #[test]
    fn a_denial_is_served_until_it_ends_with_times_moving_on() {
        let mut c = BlockCache::new(HOLD);
        c.remember("k".into(), &denied(1000), 10_000, 0);
        let d = c.lookup("k", 10_400).unwrap();
        assert_eq!(d.wait_ms(), Some(600));
        assert_eq!(d.rules[0].reset_after_ms, 2600);
        assert_eq!(c.lookup("k", 10_999).unwrap().wait_ms(), Some(1));
        assert_eq!(
            c.lookup("k", 11_000),
            None,
            "at retry-after the request goes to Redis again"
        );
        assert!(c.is_empty());
        assert_eq!(c.lookup("other", 10_000), None);
    }

    #[test]
    fn a_long_denial_is_asked_of_redis_again_after_the_hold() {
        let mut c = BlockCache::new(HOLD);
        c.remember("k".into(), &denied(86_400_000), 0, 0);
        let d = c.lookup("k", HOLD - 1).unwrap();
        assert_eq!(d.wait_ms(), Some(86_400_000 - HOLD + 1));
        assert_eq!(c.lookup("k", HOLD), None, "a reset shows by now");
        assert!(c.is_empty());
    }

    #[test]
    fn admissions_are_not_cached_and_endless_denials_are_for_the_hold() {
        let mut c = BlockCache::new(HOLD);
        c.remember(
            "a".into(),
            &Decision {
                verdict: RequestVerdict::Admitted {
                    tightest: 0,
                    delay_ms: 0,
                },
                ..denied(0)
            },
            0,
            0,
        );
        assert!(c.is_empty());
        let never = Decision {
            verdict: RequestVerdict::Denied {
                binding: 0,
                retry: Retry::Never,
            },
            ..denied(0)
        };
        c.remember("n".into(), &never, 0, 0);
        let d = c
            .lookup("n", HOLD - 1)
            .expect("a block without end is held");
        assert_eq!(d.retry(), Some(Retry::Never));
        assert_eq!(c.lookup("n", HOLD), None, "a cleared block shows by now");
    }

    #[test]
    fn the_cache_is_bounded() {
        let mut c = BlockCache::new(HOLD);
        for i in 0..CAPACITY + 10 {
            c.remember(format!("client-{i}"), &denied(60_000), 0, 0);
        }
        assert!(c.len() <= CAPACITY);
        // Expired entries make room first.
        let mut c = BlockCache::new(HOLD);
        for i in 0..CAPACITY {
            c.remember(format!("old-{i}"), &denied(10), 0, 0);
        }
        c.remember("new".into(), &denied(10), 1000, 0);
        assert_eq!(c.len(), 1);
    }
}
