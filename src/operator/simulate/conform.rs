//! Whether what a rule charged conforms to its definition, checked from
//! the rule's plain figures alone: no code of the script, the protocol or
//! the reference model, so that a bug there cannot hide here.

use std::collections::BTreeMap;

use crate::rules::policy::Policy;

/// One admission's charge to one client of a rule, as a checker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge<'p> {
    /// The earliest and the latest instant (ms) it can have been counted
    /// at: equal when the clock told it exactly, apart when only a call's
    /// sending and its reply bound Redis's clock.
    pub from_ms: u64,
    /// See `from_ms`.
    pub to_ms: u64,
    /// Units charged.
    pub cost: u64,
    /// Every set of figures it may have been decided under, one of which
    /// it must conform to (while figures change, the loosest); none when
    /// the client was blocked throughout, so that nothing may be charged.
    pub under: Vec<&'p Policy>,
}

/// How many of `charged` (time ms, cost; in time order) went over `policy`
/// for one client whose window edges are shifted by `offset_ms`.
pub fn over_limit(policy: &Policy, offset_ms: u64, charged: &[(u64, u64)]) -> u64 {
    let charges: Vec<Charge<'_>> = charged
        .iter()
        .map(|&(ms, cost)| Charge {
            from_ms: ms,
            to_ms: ms,
            cost,
            under: vec![policy],
        })
        .collect();
    over(&charges, offset_ms)
}

/// How many of one client's stays at the origin under an in-flight limit
/// (each from and to, ms, and its slots; in any order) began with more
/// than `limit` slots held, counting their own; a slot is free from its
/// stay's end on.
pub fn over_in_flight(limit: u64, stays: &[(u64, u64, u64)]) -> u64 {
    let mut stays = stays.to_vec();
    stays.sort_unstable();
    // Ends of the stays under way, earliest first.
    let mut ending: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64)>> =
        Default::default();
    let (mut held, mut over) = (0u64, 0u64);
    for (from, to, slots) in stays {
        while let Some(&std::cmp::Reverse((end, n))) = ending.peek() {
            if end > from {
                break;
            }
            held -= n;
            ending.pop();
        }
        held += slots;
        over += u64::from(held > limit);
        ending.push(std::cmp::Reverse((to, slots)));
    }
    over
}

/// How many of `charges` (in the order they happened) went over, for one
/// client whose window edges are shifted by `offset_ms`.
///
/// GCRA: each unit occupies one interval (the period over the rate,
/// rounded to the nearest microsecond), and what is charged may lie at
/// most `burst` intervals ahead. Windows: the buckets of `precision` that
/// overlap a window, the current one included, hold at most its limit.
/// A charge counted at an uncertain instant is over only if it is over
/// wherever in its span it fell; one under several figures, only if it is
/// over under the loosest (the shortest interval and the largest burst
/// span, or each window's largest limit). A charge under none is over.
pub fn over(charges: &[Charge<'_>], offset_ms: u64) -> u64 {
    let blocked = charges.iter().filter(|c| c.under.is_empty()).count() as u64;
    let allowed: Vec<&Charge<'_>> = charges.iter().filter(|c| !c.under.is_empty()).collect();
    let Some(first) = allowed.first() else {
        return blocked;
    };
    blocked
        + match first.under[0] {
            Policy::Gcra(_) => over_gcra(&allowed),
            Policy::Windowed(ws) => (0..ws.len())
                .map(|w| over_window(&allowed, w, offset_ms))
                .sum(),
            // Not a rate: [`over_in_flight`] checks its stays instead.
            Policy::Concurrency(_) => 0,
        }
}

/// GCRA's emission interval and tolerance (us) from a rule's figures.
fn gcra_figures(policy: &Policy) -> Option<(u64, u64)> {
    match policy {
        Policy::Gcra(g) => {
            let interval = (g.period_ms() * 1000 + g.rate() / 2) / g.rate();
            Some((interval, interval * g.burst()))
        }
        Policy::Windowed(_) | Policy::Concurrency(_) => None,
    }
}

fn over_gcra(charges: &[&Charge<'_>]) -> u64 {
    // The TAT is never above the one the earliest instants and the
    // shortest intervals give, and a charge is checked from its latest
    // instant against the longest span: what no placement can make pass
    // did go over.
    let mut tat = 0u64;
    let mut over = 0;
    for c in charges {
        let figures = c.under.iter().filter_map(|p| gcra_figures(p));
        let interval = figures.clone().map(|(i, _)| i).min().unwrap_or(0);
        let tolerance = figures.map(|(_, t)| t).max().unwrap_or(0);
        tat = tat.max(c.from_ms * 1000) + c.cost * interval;
        if tat.saturating_sub(c.to_ms * 1000) > tolerance {
            over += 1;
        }
    }
    over
}

fn over_window(charges: &[&Charge<'_>], w: usize, offset_ms: u64) -> u64 {
    let Some(Policy::Windowed(ws)) = charges.first().map(|c| c.under[0]) else {
        return 0;
    };
    let (precision, buckets) = (
        ws[w].precision_ms(),
        ws[w].duration_ms() / ws[w].precision_ms(),
    );
    // Earlier charges by their first bucket, each with its last.
    let mut counted: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    let mut over = 0;
    for c in charges {
        let limit = c
            .under
            .iter()
            .filter_map(|p| match p {
                Policy::Windowed(ws) => ws.get(w).map(|w| w.limit()),
                Policy::Gcra(_) | Policy::Concurrency(_) => None,
            })
            .max()
            .unwrap_or(0);
        let (first, last) = (
            (c.from_ms + offset_ms) / precision,
            (c.to_ms + offset_ms) / precision,
        );
        // Over if, in whichever bucket it fell, the window ending there
        // holds more than the limit with only the earlier charges that
        // lie inside it wherever they fell.
        let fits = (first..=last).any(|bucket| {
            let from = (bucket + 1).saturating_sub(buckets);
            let inside: u64 = counted
                .range(from..=bucket)
                .flat_map(|(_, spans)| spans)
                .filter(|&&(end, _)| end <= bucket)
                .map(|(_, cost)| cost)
                .sum();
            inside + c.cost <= limit
        });
        if !fits {
            over += 1;
        }
        counted.entry(first).or_default().push((last, c.cost));
    }
    over
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::policy::{Gcra, Window, Windows};

    #[test]
    fn the_checker_sees_what_goes_over() {
        // docs/leases.md's naive lease: the last unit at 2.9 s is over.
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

    fn charge(from_ms: u64, to_ms: u64, under: Vec<&Policy>) -> Charge<'_> {
        Charge {
            from_ms,
            to_ms,
            cost: 1,
            under,
        }
    }

    /// A charge known only within a span is over only where no instant of
    /// the span lets it pass; figures that changed count at their loosest;
    /// a blocked client may be charged nothing.
    #[test]
    fn uncertain_instants_and_changed_figures_count_in_the_charges_favour() {
        let gcra = Policy::Gcra(Gcra::new(1, 1000, 1).unwrap());
        let looser = Policy::Gcra(Gcra::new(1, 1000, 2).unwrap());
        // 1 s apart at the latest: fits; 999 ms apart for sure: over.
        assert_eq!(
            over(
                &[charge(0, 0, vec![&gcra]), charge(999, 1000, vec![&gcra])],
                0
            ),
            0
        );
        assert_eq!(
            over(
                &[charge(0, 0, vec![&gcra]), charge(999, 999, vec![&gcra])],
                0
            ),
            1
        );
        // The earlier charge may have come at 1 ms: the later is still
        // 999 ms after it at most.
        assert_eq!(
            over(
                &[charge(0, 1, vec![&gcra]), charge(999, 999, vec![&gcra])],
                0
            ),
            1
        );
        assert_eq!(
            over(
                &[
                    charge(0, 0, vec![&gcra]),
                    charge(0, 0, vec![&gcra, &looser])
                ],
                0
            ),
            0
        );
        assert_eq!(over(&[charge(0, 0, vec![])], 0), 1);
        // A window of 2 in 100 ms buckets: a third charge in the first
        // bucket is over unless it may have fallen in the next, or came
        // under a limit of 3.
        let w = |limit| {
            Policy::Windowed(Windows::new(vec![Window::new(100, limit, 100).unwrap()]).unwrap())
        };
        let (two, three) = (w(2), w(3));
        let third = |c: Charge<'_>| {
            over(
                &[charge(10, 10, vec![&two]), charge(20, 20, vec![&two]), c],
                0,
            )
        };
        assert_eq!(third(charge(99, 99, vec![&two])), 1);
        assert_eq!(third(charge(99, 100, vec![&two])), 0);
        assert_eq!(third(charge(99, 99, vec![&two, &three])), 0);
        // With a window of 2 in 1 s besides, the next bucket is no way out.
        let windows = Policy::Windowed(
            Windows::new(vec![
                Window::new(100, 2, 100).unwrap(),
                Window::new(1000, 2, 100).unwrap(),
            ])
            .unwrap(),
        );
        assert_eq!(
            over(
                &[
                    charge(10, 10, vec![&windows]),
                    charge(20, 20, vec![&windows]),
                    charge(99, 100, vec![&windows])
                ],
                0
            ),
            1
        );
    }
}
