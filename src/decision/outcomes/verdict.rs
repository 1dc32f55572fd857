//! Verdicts: how each rule stands after a decision, and what that means
//! for the whole request. Types whose variants carry only what is true of
//! them: an admitted rule has no retry, a denied one always says when.

use crate::rules::{policy::Gcra, rule::Mode};

/// Whole seconds, rounded up: a client that waits this long is never
/// early. Every wait in seconds (headers, logs, the operator's commands)
/// is rounded here.
pub fn seconds_up(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// When a denied request could be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// After this many milliseconds.
    After {
        /// Milliseconds to wait.
        ms: u64,
    },
    /// Never: the request costs more than the limit allows.
    Never,
}

impl Retry {
    /// The wait in milliseconds, if there is one.
    pub fn ms(self) -> Option<u64> {
        match self {
            Retry::After { ms } => Some(ms),
            Retry::Never => None,
        }
    }

    /// Whole seconds a client is told to wait, at least 1; none for never.
    pub fn seconds(self) -> Option<u64> {
        self.ms().map(|ms| seconds_up(ms).max(1))
    }

    /// Whether this frees up strictly later than `other` (never being the
    /// latest of all).
    pub fn later_than(self, other: Retry) -> bool {
        match (self, other) {
            (Retry::Never, other) => other != Retry::Never,
            (Retry::After { .. }, Retry::Never) => false,
            (Retry::After { ms: a }, Retry::After { ms: b }) => a > b,
        }
    }

    /// This retry as seen `elapsed_ms` later.
    pub fn aged(self, elapsed_ms: u64) -> Retry {
        match self {
            Retry::After { ms } => Retry::After {
                ms: ms.saturating_sub(elapsed_ms),
            },
            Retry::Never => Retry::Never,
        }
    }
}

/// One rule's verdict on a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The rule alone would admit it.
    Admitted,
    /// The rule alone would admit it this many milliseconds from now, and
    /// has reserved that instant for it (`on_limit = "delay"`).
    Delayed {
        /// Milliseconds the request waits before it conforms.
        ms: u64,
    },
    /// The rule alone would deny it.
    Denied(Retry),
}

/// How one rule stands after the decision. Times are milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleState {
    /// Whether this rule alone admits the request, and if not, when it could.
    pub verdict: Verdict,
    /// The reported window's limit (GCRA: the burst).
    pub limit: u64,
    /// Units left in that window after this decision.
    pub remaining: u64,
    /// Milliseconds until that window holds no admitted cost.
    pub reset_after_ms: u64,
    /// 1-based index of the reported window: when denied, the one that
    /// denies; when admitted, the one with the fewest units left (GCRA: 1).
    pub window: usize,
}

impl RuleState {
    /// Whether this rule alone admits the request.
    pub fn admitted(&self) -> bool {
        !matches!(self.verdict, Verdict::Denied(_))
    }

    /// When this rule could admit the request, if it denies it.
    pub fn retry(&self) -> Option<Retry> {
        match self.verdict {
            Verdict::Admitted | Verdict::Delayed { .. } => None,
            Verdict::Denied(r) => Some(r),
        }
    }

    /// How long this rule has the request wait, ms (0: not at all).
    pub fn delay_ms(&self) -> u64 {
        match self.verdict {
            Verdict::Delayed { ms } => ms,
            _ => 0,
        }
    }

    /// A GCRA rule's state when its TAT lay `ahead_us` ahead of now before a
    /// request of `cost` units: after the request if that fits the burst
    /// (or, delayed, the burst and the rule's delay), else as it stands.
    /// The same arithmetic as the one-rule path in `lua/gcra.lua`,
    /// saturating so that no reply can overflow it; the reference model
    /// works it out again on its own.
    pub fn gcra(g: &Gcra, cost: u64, ahead_us: u64) -> RuleState {
        let interval = g.interval_us().max(1);
        let tolerance = interval.saturating_mul(g.burst());
        let after = ahead_us.saturating_add(cost.saturating_mul(interval));
        let late_us = after.saturating_sub(tolerance);
        let (stands, verdict) = if after <= tolerance {
            (after, Verdict::Admitted)
        } else if cost > 0 && cost <= g.burst() && late_us <= g.max_delay_ms() * 1000 {
            let ms = late_us.div_ceil(1000);
            (after, Verdict::Delayed { ms })
        } else if cost > g.burst() {
            (ahead_us, Verdict::Denied(Retry::Never))
        } else {
            let ms = (after - tolerance).div_ceil(1000);
            (ahead_us, Verdict::Denied(Retry::After { ms }))
        };
        RuleState {
            verdict,
            limit: g.burst(),
            // A TAT further ahead than the burst (it was lowered) leaves none.
            remaining: tolerance.saturating_sub(stands) / interval,
            reset_after_ms: stands.div_ceil(1000),
            window: 1,
        }
    }
}

/// The verdict on a whole request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestVerdict {
    /// Every enforced rule admitted it, and every admitting rule was charged.
    Admitted {
        /// 0-based index of the first rule with the fewest units left.
        tightest: usize,
        /// Milliseconds the request waits before it is forwarded: the
        /// longest an enforced rule delays it (0: none).
        delay_ms: u64,
    },
    /// An enforced rule denied it; nothing was charged.
    Denied {
        /// 0-based index of the first enforced denying rule that frees up last.
        binding: usize,
        /// When the request could be admitted.
        retry: Retry,
    },
}

/// What a spend says of one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolState {
    /// Whether the pools covered the request, which was then spent from
    /// every one; if not, nothing was spent and the home decides.
    pub covered: bool,
    /// Units left in the pool and the region's share.
    pub left: u64,
    /// Ms until the last of them lapses.
    pub lasts_ms: u64,
    /// Units to ask the home for now (0: no top-up).
    pub ask: u64,
    /// The instant the top-up was asked at, on the region's clock (us):
    /// its credit names it, and its deadline counts from it.
    pub asked_us: u64,
    /// Units moved from the pool to the isolate that asked, and how long
    /// it may spend them, ms from before it sent the call.
    pub leased: (u64, u64),
    /// For the headers: the units the home had left at its last grant
    /// (the pool's own aside) while it may not be full yet (`None`: full,
    /// or never asked), and ms until the home and the region's share are
    /// both full again, as that grant tells.
    pub home: (Option<u64>, u64),
}

/// The verdict on a whole request: all rules admitted it, or none consumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Admitted or denied, and which rule says so.
    pub verdict: RequestVerdict,
    /// One state per rule, in call order.
    pub rules: Vec<RuleState>,
    /// Rules (0-based, call order) whose penalty this decision started.
    pub penalties_started: Vec<usize>,
    /// For each refundable rule this decision charged (0-based, call
    /// order), the mark a refund call gives the charge back by.
    pub refund_marks: Vec<(usize, u64)>,
    /// The leases granted with the request, charged with it.
    pub grants: Vec<Grant>,
    /// What each rule that takes overrides read (none for the others).
    pub overrides: Vec<OverrideRead>,
    /// In a region away from the home, what the pools of the request's
    /// shared rules said, when its call carried them (none otherwise).
    pub pools: Vec<PoolState>,
}

/// Which override a rule was decided under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverrideSource {
    /// None: the configured figures.
    None,
    /// The client's own.
    Client,
    /// The rule's, for every client.
    Rule,
}

/// What a rule that takes overrides was decided under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideRead {
    /// 0-based index of the rule in the call.
    pub rule: usize,
    /// Whose override held.
    pub source: OverrideSource,
    /// The override's text (see `rules::overrides`), empty for none.
    pub text: String,
    /// Whether the client's override key held something that is no
    /// override (counted as none).
    pub ignored: bool,
}

/// Units charged to a rule ahead of the requests that will spend them, in
/// the isolate that asked, within `for_ms` of the call being sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// 0-based index of the rule in the call.
    pub rule: usize,
    /// Units granted (at least 1).
    pub units: u64,
    /// How long they may be spent, ms from the script's now.
    pub for_ms: u64,
}

impl Decision {
    /// The override rule `i` was decided under, if one held (its text is
    /// then the figures in force, or a block).
    pub fn override_of(&self, i: usize) -> Option<&OverrideRead> {
        self.overrides
            .iter()
            .find(|o| o.rule == i && o.source != OverrideSource::None)
    }

    /// The verdict over every rule's state, `modes[i]` being rule i's mode:
    /// admitted when no enforced rule denies. The binding rule is, when
    /// denied, the first enforced denying rule that frees up last; when
    /// admitted, the first with the fewest units left.
    pub fn settle(rules: Vec<RuleState>, modes: &[Mode]) -> Decision {
        let mut denied: Option<(usize, Retry)> = None;
        let (mut tightest, mut delay_ms) = (0, 0);
        for (i, s) in rules.iter().enumerate() {
            let enforced = modes.get(i) != Some(&Mode::Shadow);
            if enforced {
                delay_ms = delay_ms.max(s.delay_ms());
            }
            match (s.verdict, denied) {
                (Verdict::Denied(retry), None) if enforced => denied = Some((i, retry)),
                (Verdict::Denied(retry), Some((_, binding)))
                    if enforced && retry.later_than(binding) =>
                {
                    denied = Some((i, retry));
                }
                _ if s.remaining < rules[tightest].remaining => tightest = i,
                _ => {}
            }
        }
        let verdict = match denied {
            Some((binding, retry)) => RequestVerdict::Denied { binding, retry },
            None => RequestVerdict::Admitted { tightest, delay_ms },
        };
        Decision {
            verdict,
            rules,
            penalties_started: vec![],
            refund_marks: vec![],
            grants: vec![],
            overrides: vec![],
            pools: vec![],
        }
    }

    /// Whether every enforced rule admitted the request.
    pub fn admitted(&self) -> bool {
        matches!(self.verdict, RequestVerdict::Admitted { .. })
    }

    /// The rule the headers and the denial speak for: the binding rule when
    /// denied, the tightest when admitted.
    pub fn binding(&self) -> usize {
        match self.verdict {
            RequestVerdict::Admitted { tightest, .. } => tightest,
            RequestVerdict::Denied { binding, .. } => binding,
        }
    }

    /// When a denied request could be admitted; `None` when admitted.
    pub fn retry(&self) -> Option<Retry> {
        match self.verdict {
            RequestVerdict::Admitted { .. } => None,
            RequestVerdict::Denied { retry, .. } => Some(retry),
        }
    }

    /// Milliseconds an admitted request waits before it is forwarded (0:
    /// none, or denied).
    pub fn delay_ms(&self) -> u64 {
        match self.verdict {
            RequestVerdict::Admitted { delay_ms, .. } => delay_ms,
            RequestVerdict::Denied { .. } => 0,
        }
    }

    /// Milliseconds a denied request must wait; `None` when it was admitted
    /// or can never be.
    pub fn wait_ms(&self) -> Option<u64> {
        self.retry().and_then(Retry::ms)
    }
}
