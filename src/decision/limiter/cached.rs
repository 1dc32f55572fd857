//! The block cache's steps: a request answered from a denial this isolate
//! remembers, with no call, and a decision kept when it is a denial.

use super::{
    outcome::{decided, Handled},
    state::Limiter,
};
use crate::decision::{
    outcomes::verdict::Decision,
    transport::protocol::{Check, RefundCharge, ScriptCall},
};

impl<'c, S> Limiter<'c, '_, S> {
    /// `checks` decided at `now_ms` from the denial the isolate remembers
    /// for their call `own`, of `signature`; `None` when it holds none.
    pub(super) fn cached_denial(
        &self,
        checks: &[(Check<'c>, Vec<&str>)],
        (own, signature): (&ScriptCall, &str),
        now_ms: u64,
    ) -> Option<Handled<'c>> {
        let decision = self.cache.borrow_mut().lookup(signature, now_ms)?;
        Some(decided(checks, own, decision))
    }

    /// Keeps `decision` on `checks`, made at `now_ms` for the call of
    /// `signature`, while it denies (the cache keeps nothing else) and no
    /// delaying rule could admit the request by waiting.
    pub(super) fn remember(
        &self,
        checks: &[(Check<'c>, Vec<&str>)],
        signature: String,
        decision: &Decision,
        now_ms: u64,
    ) {
        let early_ms = checks
            .iter()
            .map(|(c, _)| c.rule.policy.algorithm().max_delay_ms())
            .max()
            .unwrap_or(0);
        self.cache
            .borrow_mut()
            .remember(signature, decision, now_ms, early_ms);
    }

    /// Forgets the denials the isolate remembers on the keys of `charges`,
    /// once they have been given back: a refund that frees the client is
    /// seen by its next request, not a `cache_hold` later.
    pub(super) fn forget(&self, charges: &[RefundCharge<'_>]) {
        let mut cache = self.cache.borrow_mut();
        for charge in charges {
            cache.forget(charge.key);
        }
    }
}
