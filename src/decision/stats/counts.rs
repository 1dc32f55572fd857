//! What is counted, per rule and per minute, and how one decided request
//! counts under each of its rules: the worker's counts and `simulate`'s
//! report share this, so what happened and what would have happened read
//! alike.

use crate::decision::outcomes::verdict::{Decision, RuleState};

/// A figure counted per rule and minute. The order is the order counts are
/// stored in: new figures go at the end, so older records still read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleCount {
    /// Requests decided under the rule, refused by it, or forwarded or
    /// answered 503 when Redis could not decide them.
    Matched,
    /// Of those, requests every enforced rule admitted.
    Admitted,
    /// Requests the rule denied itself (several enforced rules may deny one).
    Denied,
    /// Requests the rule would have admitted that another rule denied.
    DeniedByOthers,
    /// A shadow rule: requests it would have denied.
    ShadowWouldDeny,
    /// Requests it refused with 400 (a key part given several values; a
    /// shadow rule's are those it would have refused).
    Refused,
    /// Requests forwarded without a decision, Redis being unavailable, under
    /// `fail = "open"`.
    FailOpen,
    /// Requests answered 503, Redis being unavailable, under `fail = "closed"`.
    FailClosed,
    /// Penalties the rule's denials started (a shadow rule's too).
    PenaltiesStarted,
    /// Requests decided in the isolate from leased units, with no call.
    Leased,
    /// Script calls made for the rule: its requests' decisions, refunds,
    /// lease refreshes and override reads (a call for several rules counts
    /// for each).
    Calls,
    /// Requests the rule had wait instead of denying them (a shadow
    /// rule's: would have had wait).
    Delayed,
    /// Milliseconds those requests waited, summed (the rule's own wait).
    DelayedMs,
}

/// How many [`RuleCount`]s there are.
pub const RULE_COUNTS: usize = 13;

impl RuleCount {
    /// Every figure, in stored order.
    pub const ALL: [RuleCount; RULE_COUNTS] = [
        RuleCount::Matched,
        RuleCount::Admitted,
        RuleCount::Denied,
        RuleCount::DeniedByOthers,
        RuleCount::ShadowWouldDeny,
        RuleCount::Refused,
        RuleCount::FailOpen,
        RuleCount::FailClosed,
        RuleCount::PenaltiesStarted,
        RuleCount::Leased,
        RuleCount::Calls,
        RuleCount::Delayed,
        RuleCount::DelayedMs,
    ];

    /// Its name in JSON, as `simulate --json` names the same figures.
    pub fn name(self) -> &'static str {
        match self {
            RuleCount::Matched => "matched",
            RuleCount::Admitted => "admitted",
            RuleCount::Denied => "denied",
            RuleCount::DeniedByOthers => "denied_by_other_rules",
            RuleCount::ShadowWouldDeny => "shadow_would_deny",
            RuleCount::Refused => "refused",
            RuleCount::FailOpen => "fail_open",
            RuleCount::FailClosed => "fail_closed",
            RuleCount::PenaltiesStarted => "penalties_started",
            RuleCount::Leased => "leased",
            RuleCount::Calls => "calls",
            RuleCount::Delayed => "delayed",
            RuleCount::DelayedMs => "delayed_ms",
        }
    }
}

/// A figure counted per minute over every request, whatever its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TotalCount {
    /// Requests seen.
    Requests,
    /// Forwarded after every enforced rule admitted them, or because no
    /// rule applied.
    Admitted,
    /// Answered 429.
    Denied,
    /// Answered 400.
    Refused,
    /// No rule applied.
    Unmatched,
    /// Forwarded without a decision: Redis unavailable, every rule open.
    Bypassed,
    /// Answered 503: Redis unavailable, a rule closed.
    Unavailable,
    /// Script calls the limiter made (a request's call, refunds, lease
    /// refreshes, override reads), each once however many rules it served.
    Calls,
    /// Stats writes that failed (each sent again), as the isolates reported
    /// them with a later write.
    WriteFailures,
    /// Minutes of figures the isolates dropped unwritten, as they reported
    /// them with a later write.
    DroppedMinutes,
}

/// How many [`TotalCount`]s there are.
pub const TOTAL_COUNTS: usize = 10;

impl TotalCount {
    /// Every figure, in stored order.
    pub const ALL: [TotalCount; TOTAL_COUNTS] = [
        TotalCount::Requests,
        TotalCount::Admitted,
        TotalCount::Denied,
        TotalCount::Refused,
        TotalCount::Unmatched,
        TotalCount::Bypassed,
        TotalCount::Unavailable,
        TotalCount::Calls,
        TotalCount::WriteFailures,
        TotalCount::DroppedMinutes,
    ];

    /// Its name in JSON.
    pub fn name(self) -> &'static str {
        match self {
            TotalCount::Requests => "requests",
            TotalCount::Admitted => "admitted",
            TotalCount::Denied => "denied",
            TotalCount::Refused => "refused",
            TotalCount::Unmatched => "unmatched",
            TotalCount::Bypassed => "bypassed",
            TotalCount::Unavailable => "unavailable",
            TotalCount::Calls => "calls",
            TotalCount::WriteFailures => "write_failures",
            TotalCount::DroppedMinutes => "dropped_minutes",
        }
    }
}

/// One rule's figures over some span, indexed by [`RuleCount`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleCounts(pub [u64; RULE_COUNTS]);

/// The request-wide figures over some span, indexed by [`TotalCount`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TotalCounts(pub [u64; TOTAL_COUNTS]);

impl std::ops::Index<RuleCount> for RuleCounts {
    type Output = u64;
    fn index(&self, c: RuleCount) -> &u64 {
        &self.0[c as usize]
    }
}

impl std::ops::IndexMut<RuleCount> for RuleCounts {
    fn index_mut(&mut self, c: RuleCount) -> &mut u64 {
        &mut self.0[c as usize]
    }
}

impl std::ops::Index<TotalCount> for TotalCounts {
    type Output = u64;
    fn index(&self, c: TotalCount) -> &u64 {
        &self.0[c as usize]
    }
}

impl std::ops::IndexMut<TotalCount> for TotalCounts {
    fn index_mut(&mut self, c: TotalCount) -> &mut u64 {
        &mut self.0[c as usize]
    }
}

/// Adds `other` into `into`, figure by figure.
pub fn add<const N: usize>(into: &mut [u64; N], other: &[u64; N]) {
    for (a, b) in into.iter_mut().zip(other) {
        *a = a.saturating_add(*b);
    }
}

/// What became of a decided request under one of its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Every enforced rule admitted it.
    Admitted,
    /// This rule, enforced, denied it.
    Denied,
    /// Another rule denied it; this one would have let it through (or, a
    /// shadow rule, only reported).
    DeniedByOthers,
}

/// How one decided request counts under one of its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleFate {
    /// What became of it.
    pub fate: Fate,
    /// A shadow rule that would have denied it.
    pub would_deny: bool,
    /// How long the rule had it wait (a shadow rule's: would have), ms.
    pub delayed_ms: u64,
}

impl RuleFate {
    /// The request `decision` decided, under a rule (shadow or not) that
    /// stands at `state` in it.
    pub fn of(decision: &Decision, state: &RuleState, shadow: bool) -> RuleFate {
        let denied_here = !state.admitted() && !shadow;
        let fate = if decision.admitted() {
            Fate::Admitted
        } else if denied_here {
            Fate::Denied
        } else {
            Fate::DeniedByOthers
        };
        RuleFate {
            fate,
            would_deny: shadow && !state.admitted(),
            delayed_ms: state.delay_ms(),
        }
    }

    /// Counts it into `counts`.
    pub fn count(self, counts: &mut RuleCounts) {
        counts[RuleCount::Matched] += 1;
        counts[match self.fate {
            Fate::Admitted => RuleCount::Admitted,
            Fate::Denied => RuleCount::Denied,
            Fate::DeniedByOthers => RuleCount::DeniedByOthers,
        }] += 1;
        counts[RuleCount::ShadowWouldDeny] += u64::from(self.would_deny);
        counts[RuleCount::Delayed] += u64::from(self.delayed_ms > 0);
        counts[RuleCount::DelayedMs] += self.delayed_ms;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::outcomes::verdict::{Retry, Verdict};
    use crate::rules::rule::Mode;

    fn state(admitted: bool) -> RuleState {
        RuleState {
            verdict: match admitted {
                true => Verdict::Admitted,
                false => Verdict::Denied(Retry::After { ms: 10 }),
            },
            limit: 5,
            remaining: 0,
            reset_after_ms: 10,
            window: 1,
        }
    }

    /// A request's rules as (shadow, admitted alone), and the fate under
    /// each as (fate, would deny).
    type Row = (&'static [(bool, bool)], &'static [(Fate, bool)]);

    /// One row per combination.
    #[test]
    fn fates_follow_the_verdicts() {
        let rows: [Row; 5] = [
            (&[(false, true)], &[(Fate::Admitted, false)]),
            (&[(false, false)], &[(Fate::Denied, false)]),
            (
                &[(false, false), (false, true)],
                &[(Fate::Denied, false), (Fate::DeniedByOthers, false)],
            ),
            (
                &[(false, true), (true, false)],
                &[(Fate::Admitted, false), (Fate::Admitted, true)],
            ),
            (
                &[(false, false), (true, false)],
                &[(Fate::Denied, false), (Fate::DeniedByOthers, true)],
            ),
        ];
        for (rules, want) in rows {
            let modes: Vec<Mode> = rules
                .iter()
                .map(|(s, _)| if *s { Mode::Shadow } else { Mode::Enforce })
                .collect();
            let states = rules.iter().map(|(_, a)| state(*a)).collect();
            let decision = Decision::settle(states, &modes);
            let got: Vec<(Fate, bool)> = rules
                .iter()
                .zip(&decision.rules)
                .map(|((shadow, _), s)| {
                    let f = RuleFate::of(&decision, s, *shadow);
                    (f.fate, f.would_deny)
                })
                .collect();
            assert_eq!(got, want, "{rules:?}");
        }
    }

    #[test]
    fn a_fate_counts_once_as_matched_and_once_where_it_fell() {
        let mut c = RuleCounts::default();
        RuleFate {
            fate: Fate::DeniedByOthers,
            would_deny: true,
            delayed_ms: 0,
        }
        .count(&mut c);
        assert_eq!(c[RuleCount::Matched], 1);
        assert_eq!(c[RuleCount::DeniedByOthers], 1);
        assert_eq!(c[RuleCount::ShadowWouldDeny], 1);
        assert_eq!(c.0.iter().sum::<u64>(), 3);
        let mut d = RuleCounts::default();
        let delayed = RuleFate {
            fate: Fate::Admitted,
            would_deny: false,
            delayed_ms: 250,
        };
        delayed.count(&mut d);
        delayed.count(&mut d);
        assert_eq!((d[RuleCount::Delayed], d[RuleCount::DelayedMs]), (2, 500));
        assert_eq!(RuleCount::ALL.len(), RULE_COUNTS);
        assert!(RuleCount::ALL
            .iter()
            .enumerate()
            .all(|(i, c)| *c as usize == i));
        assert!(TotalCount::ALL
            .iter()
            .enumerate()
            .all(|(i, c)| *c as usize == i));
    }
}
