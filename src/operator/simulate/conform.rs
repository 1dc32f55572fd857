//! Whether what a rule charged conforms to its definition, checked from
//! the rule's plain figures alone: no code of the script, the protocol or
//! the reference model, so that a bug there cannot hide here.

use crate::rules::policy::Policy;

/// How many of `charged` (time ms, cost; in time order) went over `policy`
/// for one client whose window edges are shifted by `offset_ms`.
///
/// GCRA: each unit occupies one interval (the period over the rate,
/// rounded to the nearest microsecond), and what is charged may lie at
/// most `burst` intervals ahead. Windows: the buckets of `precision` that
/// overlap a window, the current one included, hold at most its limit.
pub fn over_limit(policy: &Policy, offset_ms: u64, charged: &[(u64, u64)]) -> u64 {
    match policy {
        Policy::Gcra(g) => {
            let interval = (g.period_ms() * 1000 + g.rate() / 2) / g.rate();
            let tolerance = interval * g.burst();
            let mut tat = 0u64;
            let mut over = 0;
            for &(ms, cost) in charged {
                let t = ms * 1000;
                tat = tat.max(t) + cost * interval;
                if tat - t > tolerance {
                    over += 1;
                }
            }
            over
        }
        Policy::Windowed(ws) => ws
            .iter()
            .map(|w| {
                let buckets = w.duration_ms() / w.precision_ms();
                let mut counted: std::collections::BTreeMap<u64, u64> = Default::default();
                let mut over = 0;
                for &(ms, cost) in charged {
                    let bucket = (ms + offset_ms) / w.precision_ms();
                    *counted.entry(bucket).or_default() += cost;
                    let first = (bucket + 1).saturating_sub(buckets);
                    if counted.range(first..=bucket).map(|(_, c)| c).sum::<u64>() > w.limit() {
                        over += 1;
                    }
                }
                over
            })
            .sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::policy::{Gcra, Window, Windows};

    #[test]
    fn the_checker_sees_what_goes_over() {
        // ../shared/leases.md's naive lease: the last unit at 2.9 s is over.
        let gcra = Policy::Gcra(Gcra::new(1, 1000, 3).unwrap());
        let at = |times: &[u64]| times.iter().map(|&t| (t, 1)).collect::<Vec<_>>();
        assert_eq!(over_limit(&gcra, 0, &at(&[0, 2000, 2000, 2900])), 0);
        assert_eq!(over_limit(&gcra, 0, &at(&[0, 2000, 2000, 2900, 2900])), 1);
        assert_eq!(over_limit(&gcra, 0, &[(0, 3)]), 0);
        assert_eq!(over_limit(&gcra, 0, &[(0, 3), (999, 1)]), 1);
        let w = Policy::Windowed(Windows::new(vec![Window::new(1000, 2, 100).unwrap()]).unwrap());
        assert_eq!(over_limit(&w, 0, &at(&[0, 950, 1000])), 0);
        assert_eq!(over_limit(&w, 0, &at(&[0, 950, 999])), 1);
        // Shifted by 50 ms, 949 and 950 lie in different buckets.
        assert_eq!(over_limit(&w, 50, &at(&[0, 949, 950])), 0);
        assert_eq!(over_limit(&w, 0, &[(0, 2), (500, 1)]), 1);
    }
}
