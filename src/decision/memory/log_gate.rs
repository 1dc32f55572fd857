//! Keeps a flood from writing a log line per request. Of the events
//! requests cause one by one (denials, would-denials, refusals, fail
//! events), an isolate writes one line a second per group (action, rule,
//! and for all but fail events the key); those it holds back in between
//! are counted, and the next line of the group says how many it stands
//! for besides itself (`repeated`). Every event is still counted by the
//! stats.

use std::collections::VecDeque;

use super::seeded::SeededMap;

use crate::decision::outcomes::events::{Action, Event};

/// How long after a group's line its next event is held back rather
/// than written.
pub const QUIET_MS: u64 = 1000;

/// How long after a minutely line ([`minutely`]) the next of its rule
/// and action is held back.
const MINUTE_MS: u64 = 60_000;

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

/// Whether `action` is written once per rule a minute: what holds for
/// every request at once (an origin's header that is wrong, a Redis out
/// of reach), so that a line a minute says it.
fn minutely(action: Action) -> bool {
    matches!(
        action,
        Action::CostIgnored | Action::RegionUnreachable | Action::HomeUnreachable
    )
}

/// Events held back together (see [`group_of`]).
type LogGroup = (Action, String, Option<String>);

/// What is held back together: a client's denials and refusals per key;
/// Redis failing, which every client meets at once, per rule.
fn group_of(event: &Event) -> LogGroup {
    let key = match event.action {
        Action::FailOpen | Action::FailClosed => None,
        _ => event.key.clone(),
    };
    (event.action, event.rule.clone(), key)
}

/// What is held back for one group.
#[derive(Debug)]
struct HeldBack {
    /// When its last line was written.
    written_at_ms: u64,
    /// The latest event held back since, and how many were.
    latest: Option<(Event, u64)>,
}

/// What [`LogGate::pass`] lets through of a request's events.
#[derive(Debug, Default, PartialEq)]
pub struct Passed {
    /// The lines to write now.
    pub lines: Vec<Event>,
    /// When the events it held back fall due, if it held any: a call to
    /// [`LogGate::due`] then writes the lines that stand for them.
    pub held_until_ms: Option<u64>,
}

/// The isolate's log lines, held back where they repeat.
#[derive(Debug, Default)]
pub struct LogGate {
    held: SeededMap<LogGroup, HeldBack>,
    /// Per action written once a minute ([`minutely`]) and rule, when its
    /// last line was written (ms), and how many such events it has held
    /// back since: a list, as there are no more of them than rules with a
    /// `cost_header` or `regions`.
    minutely: Vec<(Action, String, u64, u64)>,
    /// Each group's last line, oldest first: what falls due is found at
    /// the front, so a request never walks every group a flood left.
    lines_at: VecDeque<(u64, LogGroup)>,
}

impl LogGate {
    /// A gate that has written nothing yet.
    pub fn new() -> LogGate {
        LogGate::default()
    }

    /// What to write at `now_ms` of `events`, the held-back lines due by
    /// then first.
    pub fn pass(&mut self, events: Vec<Event>, now_ms: u64) -> Passed {
        let mut passed = Passed {
            lines: self.due(now_ms),
            held_until_ms: None,
        };
        for mut event in events {
            if minutely(event.action) {
                let group = |(a, r, _, _): &(Action, String, u64, u64)| {
                    *a == event.action && *r == event.rule
                };
                let i = match self.minutely.iter().position(group) {
                    Some(i) => i,
                    None => {
                        let line = (event.action, event.rule.clone(), u64::MAX, 0);
                        self.minutely.push(line);
                        self.minutely.len() - 1
                    }
                };
                // A minute since its last line, not a minute of the clock:
                // events either side of a minute's turn make one line.
                let (_, _, at, held) = &mut self.minutely[i];
                if *at != u64::MAX && now_ms.saturating_sub(*at) < MINUTE_MS {
                    *held += 1;
                } else {
                    event.repeated = (*held > 0).then_some(*held);
                    (*at, *held) = (now_ms, 0);
                    passed.lines.push(event);
                }
                continue;
            }
            if !repeats(event.action) {
                passed.lines.push(event);
                continue;
            }
            if self.held.len() >= CAPACITY {
                // Full of groups inside their second: write what they hold
                // rather than grow.
                let held = self.held.drain().filter_map(|(_, h)| line_of(h.latest));
                passed.lines.extend(held);
                self.lines_at.clear();
            }
            let group = group_of(&event);
            // Once `due` has run, a group still here is inside its second.
            match self.held.get_mut(&group) {
                Some(held) => {
                    let count = held.latest.take().map_or(0, |(_, n)| n);
                    held.latest = Some((event, count + 1));
                    let until_ms = held.written_at_ms + QUIET_MS;
                    passed.held_until_ms = passed.held_until_ms.max(Some(until_ms));
                }
                None => {
                    let held = HeldBack {
                        written_at_ms: now_ms,
                        latest: None,
                    };
                    self.held.insert(group.clone(), held);
                    self.lines_at.push_back((now_ms, group));
                    passed.lines.push(event);
                }
            }
        }
        passed
    }

    /// The lines for events held back whose second is over by `now_ms`:
    /// each the latest of its group, standing for those held back before
    /// it too. Groups quiet for a second are forgotten.
    pub fn due(&mut self, now_ms: u64) -> Vec<Event> {
        let mut lines = Vec::new();
        while let Some((at_ms, _)) = self.lines_at.front() {
            if now_ms.saturating_sub(*at_ms) < QUIET_MS {
                break;
            }
            let Some((at_ms, group)) = self.lines_at.pop_front() else {
                break;
            };
            let Some(held) = self.held.get_mut(&group) else {
                continue;
            };
            if held.written_at_ms != at_ms {
                continue;
            }
            match line_of(held.latest.take()) {
                Some(line) => {
                    lines.push(line);
                    held.written_at_ms = now_ms;
                    self.lines_at.push_back((now_ms, group));
                }
                None => {
                    self.held.remove(&group);
                }
            }
        }
        lines
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
    fn a_cost_header_that_holds_no_cost_is_written_once_per_rule_a_minute() {
        let mut g = LogGate::new();
        let ignored = |rule: &str| Event::new(Action::CostIgnored, rule);
        let at = 60_000 * 7;
        let first = g.pass(vec![ignored("a"), ignored("a"), ignored("b")], at);
        assert_eq!(first.lines.len(), 2, "one for a, one for b");
        assert!(g.pass(vec![ignored("a")], at + 59_000).lines.is_empty());
        let next = g.pass(vec![ignored("a")], at + 60_000).lines;
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].repeated, Some(2), "it stands for the two held back");
    }

    /// A Redis out of reach meets every request at once: a line a minute
    /// per rule and action, the home's and a region's apart.
    #[test]
    fn a_redis_out_of_reach_is_written_once_per_rule_and_side_a_minute() {
        let mut g = LogGate::new();
        let home = |rule: &str| Event::new(Action::HomeUnreachable, rule);
        let region = |rule: &str| Event::new(Action::RegionUnreachable, rule);
        // Half a second before a minute of the clock turns.
        let at = 60_000 * 3 - 500;
        let first = g.pass(vec![home("api"), region("api"), home("api")], at);
        assert_eq!(first.lines.len(), 2, "one each");
        assert!(g
            .pass(vec![home("api"), region("api")], at + 1_000)
            .lines
            .is_empty());
        let next = g.pass(vec![home("api")], at + 60_000).lines;
        assert_eq!((next.len(), next[0].repeated), (1, Some(2)));
    }

    #[test]
    fn a_flood_writes_a_line_a_second_and_every_denial_is_counted() {
        let mut g = LogGate::new();
        let mut lines = Vec::new();
        // 100 denials 10 ms apart, from 1000 ms: a second of them.
        for i in 0..100 {
            let passed = g.pass(vec![deny("a", 100 - i)], 1000 + 10 * i);
            let held_until = (i > 0).then_some(2000);
            assert_eq!(passed.held_until_ms, held_until, "denial {i}");
            lines.extend(passed.lines);
        }
        assert_eq!(lines.len(), 1, "the first at once: {lines:?}");
        assert_eq!(lines[0].repeated, None);
        assert!(g.due(1999).is_empty());
        let tail = g.due(2000);
        assert_eq!(tail.len(), 1);
        assert_eq!(tail[0].repeated, Some(98), "{tail:?}");
        assert_eq!(tail[0].retry_after, Some(1), "the latest's fields");
        lines.extend(tail);
        assert_eq!(stood_for(&lines), 100);
        // The next denial waits out the second of the tail's line, and a
        // key quiet for a second is forgotten.
        let held = g.pass(vec![deny("a", 5)], 2500);
        assert_eq!(
            held,
            Passed {
                lines: vec![],
                held_until_ms: Some(3000)
            }
        );
        assert_eq!(g.pass(vec![], 3000).lines.len(), 1);
        assert!(g.due(4000).is_empty());
        assert!(g.held.is_empty() && g.lines_at.is_empty());
    }

    #[test]
    fn a_busy_isolate_writes_the_held_lines_with_the_next_events() {
        let mut g = LogGate::new();
        assert_eq!(g.pass(vec![deny("a", 9)], 0).lines.len(), 1);
        assert!(g
            .pass(vec![deny("a", 9), deny("a", 9)], 10)
            .lines
            .is_empty());
        let lines = g.pass(vec![deny("b", 9)], 1000).lines;
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
        assert_eq!(g.pass(first, 0).lines.len(), 4);
        let again = vec![
            deny("a", 1),
            grant.clone(),
            grant.clone(),
            other_rule,
            refuse,
        ];
        assert_eq!(g.pass(again, 1).lines, [grant.clone(), grant]);
        // Redis failing: one line a second for the rule, whoever the client.
        let fail = |key: &str| Event {
            key: Some(key.into()),
            ..Event::new(Action::FailOpen, "api")
        };
        assert_eq!(
            g.pass(vec![fail("a"), fail("b"), fail("c")], 2).lines.len(),
            1
        );
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
            lines.extend(g.pass(vec![deny(&key, 1), deny(&key, 1)], 0).lines);
        }
        assert!(g.held.len() <= CAPACITY && g.lines_at.len() <= CAPACITY);
        lines.extend(g.due(QUIET_MS));
        assert_eq!(stood_for(&lines), 2 * (CAPACITY as u64 + 10));
    }
}
