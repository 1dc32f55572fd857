//! Giving back a forwarded request's charges after its response: for
//! the `count_status` rules that do not count the origin's status, the
//! in-flight rules' slots once the response has ended, and the difference
//! between what `cost_header` rules charged and what the response reported.

use super::{
    outcome::{refund_failed, PendingRefund, Settlement},
    selection::budget_of,
    state::Limiter,
};
use crate::decision::{
    outcomes::events::{Action, Event},
    transport::protocol::{run, RefundCharge, Reply, ScriptCall, ScriptError, ScriptRunner},
};

impl<'c, S: ScriptRunner> Limiter<'c, '_, S> {
    /// Settles a forwarded request's charges by its response: gives back
    /// those of `count_status` rules that do not count its `status`, and
    /// settles those of `cost_header` rules by the costs its headers
    /// `reported` (each header's value, by name): what the estimate charged
    /// over the cost is given back with the rest, in one call, and what it
    /// fell short is charged again, past the limit if it must be, in
    /// another. A value that is no cost leaves the estimate standing and
    /// is logged. Runs after the response has gone: a fault is only logged,
    /// and the rule keeps the charge as it stands, with no retry that could
    /// settle it twice.
    pub async fn refund(
        &self,
        pending: &PendingRefund,
        (status, reported): (u16, &[(String, Option<String>)]),
        now_ms: u64,
    ) -> Vec<Event> {
        let Settlement {
            back,
            more,
            ignored,
        } = pending.settled(self.config, (status, reported));
        let mut events = self.give_back(pending, &back, Some(status), now_ms).await;
        if !more.is_empty() {
            let call = ScriptCall::debit(&more, self.clock(now_ms));
            events.extend(self.settled(&more, &call, Some(status)).await);
        }
        events.extend(ignored.into_iter().map(|(rule, value, capacity)| {
            let header = rule.cost_header.as_deref().unwrap_or_default();
            let error = match value {
                // Cut short: the line is for a person to see what came.
                Some(v) => format!(
                    "`{header}: {}` is no whole number from 0 to {capacity}",
                    v.chars().take(40).collect::<String>(),
                ),
                None => format!("the response had no `{header}`"),
            };
            Event {
                status: Some(status),
                error: Some(error),
                ..Event::new(Action::CostIgnored, &rule.name)
            }
        }));
        events
    }

    /// Gives back the slots a request holds under in-flight rules, once
    /// its response has ended (its body delivered, the client gone, or the
    /// origin failed), in one script call. A fault is only logged: the
    /// slot is then free after the rule's `hold_for`.
    pub async fn release(&self, pending: &PendingRefund, now_ms: u64) -> Vec<Event> {
        let charges = pending.releasing(self.config);
        self.give_back(pending, &charges, None, now_ms).await
    }

    /// Gives `charges`, some of `pending`'s, back in one call at `now_ms`,
    /// after a response of `status` where one was known; the events of a
    /// failure. Once they are back, the isolate forgets the denial it
    /// remembers for `pending`'s call.
    async fn give_back(
        &self,
        pending: &PendingRefund,
        charges: &[RefundCharge<'_>],
        status: Option<u16>,
        now_ms: u64,
    ) -> Vec<Event> {
        if charges.is_empty() {
            return vec![];
        }
        let call = ScriptCall::refund(charges, self.clock(now_ms));
        let events = self.settled(charges, &call, status).await;
        if events.is_empty() {
            self.forget(pending);
        }
        events
    }

    /// Runs `call`, a refund or a debit of `charges`; the events of a
    /// failure.
    async fn settled(
        &self,
        charges: &[RefundCharge<'_>],
        call: &ScriptCall,
        status: Option<u16>,
    ) -> Vec<Event> {
        let budget = budget_of(charges.iter().map(|c| c.check.rule));
        match run(self.store, call, budget).await {
            Ok(Reply::Refunded(_)) => vec![],
            // A refund call's reply decodes as a refund's or fails; a
            // fixed text keeps every reply type's Debug out of the wasm.
            Ok(_) => refund_failed(
                charges,
                call,
                status,
                &ScriptError::Reply("other than a refund's".into()),
            ),
            Err(error) => refund_failed(charges, call, status, &error),
        }
    }
}
