//! Decision log events: one JSON object per line, so that Workers Logs and
//! Logpush can filter and count them (`source = "edge-limiter"`, then by
//! `action` and `rule`). No event ever holds the REST token: errors are
//! [`crate::decision::transport::redis_rest::RestError`] texts, which are redacted at the source.

use serde::Serialize;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// An enforced rule denied the request (429).
    Deny,
    /// A shadow rule would have denied it; it was forwarded.
    WouldDeny,
    /// A rule's penalty started: the client is denied for its whole length.
    PenaltyStart,
    /// A shadow rule's penalty started: for its whole length the rule
    /// reports would-deny, as enforcing it would have denied.
    WouldPenaltyStart,
    /// A key part came with several values; the request was refused (400),
    /// or, for a shadow rule, left out of its count.
    Refuse,
    /// Redis could not decide; the request was forwarded unlimited.
    FailOpen,
    /// Redis could not decide; the request was answered 503.
    FailClosed,
    /// The after-response refund of a `count_status` rule failed; the
    /// response had already gone, and the rule keeps the charge.
    RefundFailed,
    /// Units were leased to this isolate (`units`, spendable for
    /// `lease_ms`): its next requests for the key are decided here.
    LeaseGrant,
    /// A lease refresh after a response failed; requests for the key make
    /// their own calls until a lease is granted again.
    LeaseFailed,
    /// An override key held something that is no override: the rule's
    /// other figures held (`key` names it, a client's or the rule-wide one).
    OverrideIgnored,
    /// Reading the rule-wide overrides after a response failed: the
    /// isolate keeps its copy and reads again a second later at the soonest.
    OverrideReadFailed,
    /// A response's `cost_header` held no cost (absent, negative,
    /// fractional, past the rule's largest cost, or no number): the
    /// estimate charged up front stands (`error` holds what it held).
    /// Written once per rule a minute.
    CostIgnored,
    /// Writing the isolate's stats failed: it sends the write again when
    /// the next is due (`rule` is empty, `key` names the isolate's stats
    /// key).
    StatsWriteFailed,
    /// A region's Redis could not be reached for a shared rule's pool: its
    /// requests went to the home. Written once per rule a minute.
    RegionUnreachable,
    /// The home's Redis could not be reached for a shared rule: the region
    /// spends what its pool holds, then the rule's fail mode decides.
    /// Written once per rule a minute.
    HomeUnreachable,
}

/// One log event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Always `edge-limiter`, so log queries find these lines.
    pub source: &'static str,
    /// What happened.
    pub action: Action,
    /// The rule it happened under (empty for a stats write).
    pub rule: String,
    /// The status the client got from the limiter (429, 400, 503), or for
    /// an after-response refund the origin's; `None` when forwarded.
    pub status: Option<u16>,
    /// The `Retry-After` the client got, seconds, where there is one.
    pub retry_after: Option<u64>,
    /// The Redis key the rule's state (or penalty) lives under.
    pub key: Option<String>,
    /// What went wrong, for fail events and refusals.
    pub error: Option<String>,
    /// Units leased, for a lease grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub units: Option<u64>,
    /// How long a lease's units may be spent, ms, for a lease grant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// Whose override the rule was decided under (`client` or `rule`),
    /// and what it held.
    #[serde(rename = "override", skip_serializing_if = "Option::is_none")]
    pub overridden: Option<String>,
    /// How many more events like it the line stands for: those the
    /// isolate held back since its last line of the same group (see
    /// [`crate::decision::memory::log_gate`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeated: Option<u64>,
}

impl Event {
    /// An event of `action` under `rule`, its other fields empty.
    pub fn new(action: Action, rule: &str) -> Event {
        Event {
            source: "edge-limiter",
            action,
            rule: rule.to_owned(),
            status: None,
            retry_after: None,
            key: None,
            error: None,
            units: None,
            lease_ms: None,
            overridden: None,
            repeated: None,
        }
    }

    /// The event as one line of JSON.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_one_json_object_per_line() {
        let e = Event {
            status: Some(429),
            retry_after: Some(3),
            key: Some("el:{1.2.3.4}:login".into()),
            ..Event::new(Action::Deny, "login")
        };
        let line = e.to_line();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["source"], "edge-limiter");
        assert_eq!(v["action"], "deny");
        assert_eq!(v["rule"], "login");
        assert_eq!(v["status"], 429);
        assert_eq!(v["retry_after"], 3);
        assert_eq!(v["key"], "el:{1.2.3.4}:login");
        assert_eq!(v["error"], serde_json::Value::Null);
        assert_eq!(
            serde_json::to_value(Action::PenaltyStart).unwrap(),
            "penalty_start"
        );
    }
}
