//! Giving back a forwarded request's charges after its response, for
//! the `count_status` rules that do not count the origin's status.

use super::{
    outcome::{refund_failed, PendingRefund},
    selection::budget_of,
    state::Limiter,
};
use crate::decision::{
    outcomes::events::Event,
    transport::protocol::{run, Reply, ScriptCall, ScriptError, ScriptRunner},
};

impl<'c, S: ScriptRunner> Limiter<'c, '_, S> {
    /// Gives back the charges of a forwarded request's `count_status`
    /// rules that do not count the origin's `status`, in one script call;
    /// nothing when every one counts it. Runs after the response has gone:
    /// a fault is only logged, and the rule keeps the charge (tighter, never
    /// looser), with no retry that could give it back twice.
    pub async fn refund(&self, pending: &PendingRefund, status: u16, now_ms: u64) -> Vec<Event> {
        let charges = pending.uncounted(self.config, status);
        if charges.is_empty() {
            return vec![];
        }
        let call = ScriptCall::refund(&charges, self.clock(now_ms));
        let budget = budget_of(charges.iter().map(|c| c.check.rule));
        match run(self.store, &call, budget).await {
            Ok(Reply::Refunded(_)) => vec![],
            // A refund call's reply decodes as a refund's or fails; a
            // fixed text keeps every reply type's Debug out of the wasm.
            Ok(_) => refund_failed(
                &charges,
                &call,
                status,
                &ScriptError::Reply("other than a refund's".into()),
            ),
            Err(error) => refund_failed(&charges, &call, status, &error),
        }
    }
}
