//! The block cache's steps: a request answered from a denial this isolate
//! remembers, with no call, and a decision kept when it is a denial.

use super::{
    outcome::{decided, Handled, PendingRefund},
    state::Limiter,
};
use crate::decision::{
    outcomes::verdict::Decision,
    transport::protocol::{Check, ScriptCall},
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

    /// Forgets the denial the isolate remembers for `pending`'s call, once
    /// its charges have been given back: a refund that frees the client is
    /// seen by its next request, not a `cache_hold` later. One lookup: a
    /// cache full of other clients costs a refund nothing more.
    pub(super) fn forget(&self, pending: &PendingRefund) {
        self.cache.borrow_mut().forget(&pending.signature);
    }
}
