//! What a run's charges are held to: for each, the figures an operator
//! had in force when it may have been decided, and the independent
//! checker's count of those that went over.

use edge_limiter::{
    decision::transport::keys::{redis_key, window_offset},
    operator::simulate::conform::{self, Charge},
    rules::{config::Config, overrides::Override, policy::Policy, rule::Rule},
};

use crate::run::{Charged, Seen, Stored};

/// The longest a lease of `rule` may be spent after the call that granted
/// it ran: a GCRA lease's length; a window's ends with the bucket its units
/// were counted in, the shortest precision at most.
fn lease_reach_ms(rule: &Rule) -> u64 {
    match (&rule.policy, rule.lease) {
        (_, None) => 0,
        (Policy::Gcra(_), Some(lease)) => lease.for_ms,
        (Policy::Windowed(ws), Some(_)) => ws.iter().map(|w| w.precision_ms()).min().unwrap_or(0),
        // The configuration refuses a lease on an in-flight limit.
        (Policy::Concurrency(_), Some(_)) => 0,
    }
}

/// The figures `stored` puts in force for a client: `Some(None)` for a
/// block; `None` for no override.
fn overridden(stored: &Stored) -> Option<Option<&Policy>> {
    stored.as_ref().map(|o| match o {
        Override::Block => None,
        Override::Figures(p) => Some(p),
    })
}

/// Every set of figures charge `c` may have been decided under: the
/// client's override (or, where it may have had none, the rule-wide one as
/// an isolate held it, or the configured figures) in force when it was
/// decided; none while a block or a penalty surely held. A call reads the
/// client's key as it runs and sends its isolate's copy of the rule-wide
/// one; a leased unit was granted by a call that ran up to the lease's
/// reach before it was spent, sent up to `up_ms` before that.
fn figures<'s>(seen: &'s Seen, rule: &'s Rule, c: &Charged, up_ms: u64) -> Vec<&'s Policy> {
    let j = c.rule;
    let reach = if c.leased { lease_reach_ms(rule) } else { 0 };
    let from = c.from_ms.saturating_sub(reach);
    let mut under: Vec<&Policy> = Vec::new();
    let mut unset = false;
    // Each value the client's key held, none before the first write.
    let own = &seen.own[j];
    for k in 0..=own.len() {
        let (before, after) = (k.checked_sub(1).map(|k| &own[k]), own.get(k));
        let held = match c.leased {
            true => {
                before.is_none_or(|w| w.from_ms <= c.to_ms) && after.is_none_or(|w| w.to_ms >= from)
            }
            // A call is placed exactly among the writes.
            false => before.is_none_or(|w| w.seq < c.seq) && after.is_none_or(|w| c.seq < w.seq),
        };
        if held {
            match overridden(before.map_or(&None, |w| &w.stored)) {
                None => unset = true,
                Some(figures) => under.extend(figures),
            }
        }
    }
    for (i, views) in seen.views.iter().enumerate().filter(|_| unset) {
        let views = &views[j];
        for k in 0..=views.len() {
            let (before, after) = (k.checked_sub(1).map(|k| &views[k]), views.get(k));
            let held = match c.leased {
                true => {
                    let from = from.saturating_sub(up_ms);
                    before.is_none_or(|v| v.ms <= c.to_ms) && after.is_none_or(|v| v.ms >= from)
                }
                false => {
                    i == c.isolate
                        && before.is_none_or(|v| v.seq < c.sent_seq)
                        && after.is_none_or(|v| c.sent_seq < v.seq)
                }
            };
            if held {
                let stored = before.map_or(&None, |v| &v.stored);
                under.extend(overridden(stored).unwrap_or(Some(&rule.policy)));
            }
        }
    }
    // A call after the one that started a penalty, or a unit granted
    // surely after it, comes while it runs.
    let penalized = seen.penalties.iter().any(|p| {
        let after = match c.leased {
            true => p.to_ms < from,
            false => p.seq < c.seq,
        };
        p.rule == j && after && c.to_ms < p.from_ms + rule.penalty_ms.unwrap_or(0)
    });
    if penalized {
        under.clear();
    }
    under
}

/// The charges over any rule's limit in what `seen` recorded for client
/// `ip`, described rule by rule.
pub fn overs(seen: &Seen, config: &Config, ip: &str, up_ms: u64) -> Vec<String> {
    let mut found = vec![];
    for (j, rule) in config.rules.iter().enumerate() {
        let mut mine: Vec<&Charged> = seen.charged.iter().filter(|c| c.rule == j).collect();
        mine.sort_by_key(|c| c.seq);
        let charges: Vec<Charge<'_>> = mine
            .iter()
            .map(|c| Charge {
                from_ms: c.from_ms,
                to_ms: c.to_ms,
                cost: c.cost,
                under: figures(seen, rule, c, up_ms),
            })
            .collect();
        let offset = window_offset(&redis_key(&rule.name, &[ip]), rule.policy.longest_ms());
        let over = conform::over(&charges, offset);
        if over > 0 {
            found.push(format!(
                "rule {} (window offset {offset} ms): {over} over the limit in {} charges: {mine:?}; penalties: {:?}; the client's override writes: {:?}; the rule-wide writes: {:?}; each isolate's copies of it: {:?}",
                rule.name,
                charges.len(),
                seen.penalties,
                seen.own[j],
                seen.wide[j],
                seen.views.iter().map(|v| &v[j]).collect::<Vec<_>>()
            ));
        }
    }
    found
}
