//! The rule-wide overrides an isolate holds. A rule's override for every
//! client lives in a key of its own, outside every client's hash slot, so
//! the decision's call cannot read it on a cluster: the isolate reads it
//! after a response once its copy is older than [`REREAD_MS`], never on a
//! request's path, and passes it to the script with each decision.

/// How old an isolate's copy may get before a response re-reads it.
pub const REREAD_MS: u64 = 10_000;

/// How long after a failed read the next may start: a REST endpoint in
/// trouble gets one read a second from an isolate, not one per response.
pub const RETRY_MS: u64 = 1_000;

/// How long a read holds its rule, at most: one still unanswered by then
/// (its request cancelled before the read could end) must not stop the
/// isolate reading the rule for good, with a block perhaps in force.
pub const READ_LAPSE_MS: u64 = REREAD_MS;

/// One rule's override as last read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WideCopy {
    rule: String,
    /// The override's text; empty for none.
    text: String,
    /// When it ends, on the isolate's clock; `None` for never.
    ends_ms: Option<u64>,
    /// When the next read may start; `None`: at once (never read yet).
    due_ms: Option<u64>,
    /// Since when a read is in flight.
    reading: Option<u64>,
}

/// Every rule's override as this isolate last read it.
#[derive(Debug, Default)]
pub struct RuleWide {
    // A few rules at most: a list costs the wasm less than a map.
    held: Vec<WideCopy>,
}

impl RuleWide {
    /// Nothing read yet.
    pub fn new() -> RuleWide {
        RuleWide::default()
    }

    /// `rule`'s override in force at `now_ms`: its text and the ms it has
    /// left (-1: no end); `None` when there is none, or none known yet.
    pub fn in_force(&self, rule: &str, now_ms: u64) -> Option<(String, i64)> {
        let held = self.held.iter().find(|h| h.rule == rule)?;
        if held.text.is_empty() {
            return None;
        }
        match held.ends_ms {
            None => Some((held.text.clone(), -1)),
            Some(end) if end > now_ms => Some((held.text.clone(), (end - now_ms) as i64)),
            Some(_) => None,
        }
    }

    /// Whether `rule`'s copy is due a read at `now_ms` (never read, older
    /// than [`REREAD_MS`], or [`RETRY_MS`] after a failed read) with none
    /// in flight: then one starts, which [`RuleWide::keep`] or
    /// [`RuleWide::failed`] ends.
    pub fn start_read(&mut self, rule: &str, now_ms: u64) -> bool {
        let at = match self.held.iter().position(|h| h.rule == rule) {
            Some(at) => at,
            None => {
                self.held.push(WideCopy {
                    rule: rule.to_owned(),
                    text: String::new(),
                    ends_ms: None,
                    due_ms: None,
                    reading: None,
                });
                self.held.len() - 1
            }
        };
        let held = &mut self.held[at];
        let reading = held
            .reading
            .is_some_and(|since| now_ms.saturating_sub(since) < READ_LAPSE_MS);
        if reading || held.due_ms.is_some_and(|due| now_ms < due) {
            return false;
        }
        held.reading = Some(now_ms);
        true
    }

    /// Keeps what a read sent at `read_ms` found for `rule`: `text` (empty
    /// for none) lasting `pttl_ms` (negative: no end).
    pub fn keep(&mut self, rule: &str, text: String, pttl_ms: i64, read_ms: u64) {
        if let Some(held) = self.held.iter_mut().find(|h| h.rule == rule) {
            held.ends_ms = u64::try_from(pttl_ms).ok().map(|ms| read_ms + ms);
            held.text = text;
            held.due_ms = Some(read_ms.saturating_add(REREAD_MS));
            held.reading = None;
        }
    }

    /// Holds `text` as `rule`'s override for good, never read again: for a
    /// replay, which has no operator to change it.
    pub fn hold(&mut self, rule: &str, text: &str) {
        self.held.retain(|h| h.rule != rule);
        self.held.push(WideCopy {
            rule: rule.to_owned(),
            text: text.to_owned(),
            ends_ms: None,
            due_ms: Some(u64::MAX),
            reading: None,
        });
    }

    /// A read of `rule` sent at `sent_ms` failed: the copy stays as it
    /// was, due again [`RETRY_MS`] later.
    pub fn failed(&mut self, rule: &str, sent_ms: u64) {
        if let Some(held) = self.held.iter_mut().find(|h| h.rule == rule) {
            held.reading = None;
            held.due_ms = Some(sent_ms.saturating_add(RETRY_MS));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_read_when_due_and_ends_with_its_override() {
        let mut w = RuleWide::new();
        assert_eq!(w.in_force("api", 0), None);
        assert!(w.start_read("api", 0));
        assert!(!w.start_read("api", 1), "one read in flight");
        w.keep("api", "v1 block".into(), 5000, 10);
        assert_eq!(w.in_force("api", 1010), Some(("v1 block".into(), 4000)));
        assert_eq!(w.in_force("api", 5010), None);
        assert!(!w.start_read("api", 10_009));
        assert!(w.start_read("api", 10_010));
        w.keep("api", "v1 windows 5".into(), -1, 10_020);
        assert_eq!(w.in_force("api", 99_999), Some(("v1 windows 5".into(), -1)));
        assert!(w.start_read("api", 20_020));
        w.failed("api", 20_020);
        assert!(!w.start_read("api", 20_021), "a failed read waits");
        assert!(w.start_read("api", 21_020));
        w.hold("api", "v1 block");
        assert_eq!(
            w.in_force("api", u64::MAX - 1),
            Some(("v1 block".into(), -1))
        );
        assert!(!w.start_read("api", u64::MAX - 1), "held for good");
    }

    /// A read whose request was cancelled never ends: it lapses, so that
    /// the isolate reads the rule again.
    #[test]
    fn a_read_left_unanswered_lapses() {
        let mut w = RuleWide::new();
        assert!(w.start_read("api", 0));
        assert!(!w.start_read("api", READ_LAPSE_MS - 1));
        assert!(w.start_read("api", READ_LAPSE_MS));
    }
}
