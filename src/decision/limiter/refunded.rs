//! Giving back a forwarded request's charges after its response: for
//! the `count_status` rules that do not count the origin's status, and
//! the in-flight rules' slots once the response has ended.

use super::{
    outcome::{refund_failed, PendingRefund},
    selection::budget_of,
    state::Limiter,
};
use crate::decision::{
    outcomes::events::Event,
    transport::protocol::{run, RefundCharge, Reply, ScriptCall, ScriptError, ScriptRunner},
};

impl<'c, S: ScriptRunner> Limiter<'c, '_, S> {
    /// Gives back the charges of a forwarded request's `count_status`
    /// rules that do not count the origin's `status`, in one script call;
    /// nothing when every one counts it. Runs after the response has gone:
    /// a fault is only logged, and the rule keeps the charge (tighter, never
    /// looser), with no retry that could give it back twice.
    pub async fn refund(&self, pending: &PendingRefund, status: u16, now_ms: u64) -> Vec<Event> {
        let charges = pending.uncounted(self.config, status);
        self.give_back(&charges, Some(status), now_ms).await
    }

    /// Gives back the slots a request holds under in-flight rules, once
    /// its response has ended (its body delivered, the client gone, or the
    /// origin failed), in one script call. A fault is only logged: the
    /// slot is then free after the rule's `hold_for`.
    pub async fn release(&self, pending: &PendingRefund, now_ms: u64) -> Vec<Event> {
        let charges = pending.releasing(self.config);
        self.give_back(&charges, None, now_ms).await
    }

    /// Gives `charges` back in one call at `now_ms`, after a response of
    /// `status` where one was known; the events of a failure.
    async fn give_back(
        &self,
        charges: &[RefundCharge<'_>],
        status: Option<u16>,
        now_ms: u64,
    ) -> Vec<Event> {
        if charges.is_empty() {
            return vec![];
        }
        let call = ScriptCall::refund(charges, self.clock(now_ms));
        let budget = budget_of(charges.iter().map(|c| c.check.rule));
        match run(self.store, &call, budget).await {
            Ok(Reply::Refunded(_)) => vec![],
            // A refund call's reply decodes as a refund's or fails; a
            // fixed text keeps every reply type's Debug out of the wasm.
            Ok(_) => refund_failed(
                charges,
                &call,
                status,
                &ScriptError::Reply("other than a refund's".into()),
            ),
            Err(error) => refund_failed(charges, &call, status, &error),
        }
    }
}
