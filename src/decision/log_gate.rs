//! Keeps a flood from writing a log line per request. Of the events
//! requests cause one by one (denials, would-denials, refusals, fail
//! events), an isolate writes one line a second per group (action, rule,
//! and for all but fail events the key); those it holds back in between
//! are counted, and the next line of the group says how many it stands
//! for besides itself (`repeated`). Every event is still counted by the
//! stats.

use std::collections::HashMap;

use super::events::{Action, Event};

/// How long after a line for an action, rule and key the next such event
/// is held back rather than written.
pub const QUIET_MS: u64 = 1000;

/// Groups remembered at most: a flood of distinct clients
/// cannot grow the isolate's memory beyond this.
pub const CAPACITY: usize = 10_000;

/// Whether `action` is one a client's request causes each time it comes,
/// so that a flood would repeat it: the rest happen once per change of
/// state (a penalty started, a lease granted) and are always written.
fn repeats(action: Action) -> bool {
    matches!(
        action,
        Action::Deny | Action::WouldDeny | Action::Refuse | Action::FailOpen | Action::FailClosed
    )
}

/// What is held back together: a client's denials and refusals per key;
/// Redis failing, which every client meets at once, per rule.
fn group_of(event: &Event) -> (Action, String, Option<String>) {
    let key = match event.action {
        Action::FailOpen | Action::FailClosed => None,
        _ => event.key.clone(),
    };
    (event.action, event.rule.clone(), key)
}

/// What is held back for one group.
#[derive(Debug)]
struct Held {
    /// When its last line was written.
    written_at_ms: u64,
    /// The latest event held back since, and how many were.
    latest: Option<(Event, u64)>,
}

/// The isolate's log lines, held back where they repeat.
#[derive(Debug, Default)]
pub struct LogGate {
    held: HashMap<(Action, String, Option<String>), Held>,
}

impl LogGate {
    /// A gate that has written nothing yet.
    pub fn new() -> LogGate {
        LogGate::default()
    }

    /// The lines to write at `now_ms` for `events`, the held-back lines
    /// due by then first.
    pub fn pass(&mut self, events: Vec<Event>, now_ms: u64) -> Vec<Event> {
        let mut lines = self.due(now_ms);
        for event in events {
            if !repeats(event.action) {
                lines.push(event);
                continue;
            }
            if self.held.len() >= CAPACITY {
                // Full of keys inside their second: write what they hold
                // rather than grow.
                lines.extend(self.held.drain().filter_map(|(_, h)| line_of(h.latest)));
            }
            let group = group_of(&event);
            match self.held.get_mut(&group) {
                Some(held) if now_ms.saturating_sub(held.written_at_ms) < QUIET_MS => {
                    let count = held.latest.take().map_or(0, |(_, n)| n);
                    held.latest = Some((event, count + 1));
                }
                _ => {
                    let held = Held {
                        written_at_ms: now_ms,
                        latest: None,
                    };
                    self.held.insert(group, held);
                    lines.push(event);
                }
            }
        }
        lines
    }

    /// The lines for events held back whose second is over by `now_ms`:
    /// each the latest of its group, standing for those held back before
    /// it too. Groups quiet for a second are forgotten.
    pub fn due(&mut self, now_ms: u64) -> Vec<Event> {
        let mut lines = Vec::new();
        self.held.retain(|_, held| {
            if now_ms.saturating_sub(held.written_at_ms) < QUIET_MS {
                return true;
            }
            match line_of(held.latest.take()) {
                Some(line) => {
                    lines.push(line);
                    held.written_at_ms = now_ms;
                    true
                }
                None => false,
            }
        });
        lines
    }

    /// When the first held-back line falls due, if any is held.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.held
            .values()
            .filter(|h| h.latest.is_some())
            .map(|h| h.written_at_ms + QUIET_MS)
            .min()
    }
}

/// The line for the latest of `count` events held back.
fn line_of(latest: Option<(Event, u64)>) -> Option<Event> {
    let (event, count) = latest?;
    Some(Event {
        repeated: Some(count - 1).filter(|&n| n > 0),
        ..event
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deny(key: &str, retry_after: u64) -> Event {
        Event {
            status: Some(429),
            retry_after: Some(retry_after),
            key: Some(key.into()),
            ..Event::new(Action::Deny, "api")
        }
    }

    /// The events the lines stand for: each itself and those it repeats.
    fn stood_for(lines: &[Event]) -> u64 {
        lines.iter().map(|l| 1 + l.repeated.unwrap_or(0)).sum()
    }

    #[test]
    fn a_flood_writes_a_line_a_second_and_every_denial_is_counted() {
        let mut g = LogGate::new();
        let mut lines = Vec::new();
        // 100 denials 10 ms apart, from 1000 ms: a second of them.
        for i in 0..100 {
            lines.extend(g.pass(vec![deny("a", 100 - i)], 1000 + 10 * i));
        }
        assert_eq!(lines.len(), 1, "the first at once: {lines:?}");
        assert_eq!(lines[0].repeated, None);
        assert_eq!(g.next_due_ms(), Some(2000));
        assert!(g.due(1999).is_empty());
        let tail = g.due(2000);
        assert_eq!(tail.len(), 1);
        assert_eq!(tail[0].repeated, Some(98), "{tail:?}");
        assert_eq!(tail[0].retry_after, Some(1), "the latest's fields");
        lines.extend(tail);
        assert_eq!(stood_for(&lines), 100);
        // The next denial waits out the second of the tail's line, and a
        // key quiet for a second is forgotten.
        assert!(g.pass(vec![deny("a", 5)], 2500).is_empty());
        assert_eq!(g.pass(vec![], 3000).len(), 1);
        assert_eq!(g.next_due_ms(), None);
        assert!(g.due(4000).is_empty());
        assert!(g.held.is_empty());
    }

    #[test]
    fn a_busy_isolate_writes_the_held_lines_with_the_next_events() {
        let mut g = LogGate::new();
        assert_eq!(g.pass(vec![deny("a", 9)], 0).len(), 1);
        assert!(g.pass(vec![deny("a", 9), deny("a", 9)], 10).is_empty());
        let lines = g.pass(vec![deny("b", 9)], 1000);
        assert_eq!(lines.len(), 2);
        assert_eq!(
            (lines[0].key.as_deref(), lines[0].repeated),
            (Some("a"), Some(1))
        );
        assert_eq!(
            (lines[1].key.as_deref(), lines[1].repeated),
            (Some("b"), None)
        );
    }

    #[test]
    fn groups_are_held_apart_and_the_rest_always_written() {
        let mut g = LogGate::new();
        let grant = Event {
            units: Some(5),
            ..Event::new(Action::LeaseGrant, "api")
        };
        let refuse = Event::new(Action::Refuse, "api");
        let other_rule = Event {
            key: Some("a".into()),
            ..Event::new(Action::Deny, "login")
        };
        let first = vec![
            deny("a", 1),
            deny("b", 1),
            other_rule.clone(),
            refuse.clone(),
        ];
        assert_eq!(g.pass(first, 0).len(), 4);
        let again = vec![
            deny("a", 1),
            grant.clone(),
            grant.clone(),
            other_rule,
            refuse,
        ];
        assert_eq!(g.pass(again, 1), [grant.clone(), grant]);
        // Redis failing: one line a second for the rule, whoever the client.
        let fail = |key: &str| Event {
            key: Some(key.into()),
            ..Event::new(Action::FailOpen, "api")
        };
        assert_eq!(g.pass(vec![fail("a"), fail("b"), fail("c")], 2).len(), 1);
        let tail: Vec<Event> = g
            .due(1002)
            .into_iter()
            .filter(|e| e.action == Action::FailOpen)
            .collect();
        assert_eq!(tail.len(), 1);
        assert_eq!(
            (tail[0].key.as_deref(), tail[0].repeated),
            (Some("c"), Some(1))
        );
    }

    #[test]
    fn the_gate_is_bounded_and_writes_what_it_drops() {
        let mut g = LogGate::new();
        let mut lines = Vec::new();
        for i in 0..CAPACITY + 10 {
            let key = format!("client-{i}");
            lines.extend(g.pass(vec![deny(&key, 1), deny(&key, 1)], 0));
        }
        assert!(g.held.len() <= CAPACITY);
        lines.extend(g.due(QUIET_MS));
        assert_eq!(stood_for(&lines), 2 * (CAPACITY as u64 + 10));
    }
}
