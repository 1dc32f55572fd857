//! Which rules a request falls under, with its client's identifier for
//! each, as the worker and `edge-limiter simulate` both pick them; and
//! what follows from them alone: each rule's cost, the charges to give
//! back, the budget a call has.

use std::{borrow::Cow, time::Duration};

use super::outcome::{PendingRefund, RefundRule, Refusal};
use crate::decision::{
    outcomes::verdict::Decision,
    transport::protocol::{Check, ScriptCall},
};
use crate::rules::{
    config::Config,
    request::RequestMeta,
    rule::{Ambiguous, Mode, Rule, RuleId, DEFAULT_BUDGET_MS},
};

/// The rules a request falls under, as the worker picks them; the
/// identifier's parts borrowed from the request (`Cow<str>`, as [`select`]
/// makes them) or, to outlive it, owned ([`Selection::into_owned`]).
#[derive(Debug)]
pub struct Selection<'c, P> {
    /// Every matching rule that identifies the client, in configuration
    /// order, with the identifier's parts.
    pub rules: Vec<(RuleId, &'c Rule, Vec<P>)>,
    /// Matching shadow rules that cannot identify the client (a key part
    /// given twice): they block nothing and are only logged.
    pub shadow_ambiguous: Vec<(RuleId, &'c Rule, Ambiguous)>,
}

impl<'c> Selection<'c, Cow<'_, str>> {
    /// The same rules, the identifier's parts owned: a selection that
    /// outlives the request it was made from.
    pub fn into_owned(self) -> Selection<'c, String> {
        Selection {
            rules: (self.rules.into_iter())
                .map(|(id, rule, parts)| {
                    (id, rule, parts.into_iter().map(Cow::into_owned).collect())
                })
                .collect(),
            shadow_ambiguous: self.shadow_ambiguous,
        }
    }
}

impl<'c, P: AsRef<str>> Selection<'c, P> {
    /// The script's checks for a request the origin may take for any of
    /// these (upper-case) methods.
    pub fn checks(&self, methods: &[String]) -> Vec<(Check<'c>, Vec<&str>)> {
        self.rules
            .iter()
            .map(|(_, rule, id)| {
                let cost = rule.cost.for_methods(methods);
                (
                    Check { rule, cost },
                    id.iter().map(|p| p.as_ref()).collect(),
                )
            })
            .collect()
    }

    /// What to give back after the response, if the status is not
    /// counted: the charges `decision` made of these rules, by its refund
    /// marks, at what a request for these (upper-case) methods costs, at
    /// the keys its `call` made (one per rule); `None` when it made none.
    pub fn pending_refund(
        &self,
        decision: &Decision,
        methods: &[String],
        call: &ScriptCall,
    ) -> Option<PendingRefund> {
        if decision.refund_marks.is_empty() {
            return None;
        }
        let keys = call.rule_keys();
        let rules: Vec<RefundRule> = decision
            .refund_marks
            .iter()
            .filter_map(|&(i, mark)| {
                let ((rule_id, rule, id), key) = (self.rules.get(i)?, keys.get(i)?);
                let id = id.iter().map(|p| p.as_ref().to_owned()).collect();
                let cost = rule.cost.for_methods(methods);
                let client = (id, (*key).to_owned());
                Some(RefundRule::of(decision, (i, mark), *rule_id, client, cost))
            })
            .collect();
        let signature = call.signature();
        (!rules.is_empty()).then_some(PendingRefund { rules, signature })
    }
}

/// Picks the rules for `req`. `Err` names the first matching enforced rule
/// that cannot identify the client: the request is then refused with a 400
/// and nothing is decided. The worker and `edge-limiter simulate` share it.
pub fn select<'c, 'r>(
    config: &'c Config,
    req: &'r RequestMeta,
) -> Result<Selection<'c, Cow<'r, str>>, Refusal<'c>> {
    let mut selection = Selection {
        rules: Vec::new(),
        shadow_ambiguous: Vec::new(),
    };
    for (id, rule) in config.rules_with_ids().filter(|(_, r)| r.matches(req)) {
        match rule.identifier(req) {
            Ok(parts) => selection.rules.push((id, rule, parts)),
            // A shadow rule never blocks, not even an ambiguous request.
            Err(a) if rule.mode == Mode::Shadow => selection.shadow_ambiguous.push((id, rule, a)),
            Err(a) => return Err((id, rule, a)),
        }
    }
    Ok(selection)
}

/// The tightest budget of these rules: none waits longer than it allows.
pub(super) fn budget_of<'a>(rules: impl Iterator<Item = &'a Rule>) -> Duration {
    Duration::from_millis(
        rules
            .map(|r| r.budget_ms)
            .min()
            .unwrap_or(DEFAULT_BUDGET_MS),
    )
}
