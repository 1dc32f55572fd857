//! What an isolate has counted and not yet written: per minute, the
//! request-wide figures, each rule's, and each rule's most denied clients,
//! all derived from what [`Limiter::handle`](crate::decision::limiter::Limiter::handle)
//! returned and how many calls it made.

use std::rc::Rc;

use super::{
    counts::{RuleCount, RuleCounts, RuleFate, TotalCount, TotalCounts},
    top::{Denials, KEPT, UNPLACED},
};
use crate::{
    decision::{
        limiter::{Decided, Forward, Handled, LeaseRefresh, Outcome, PendingRefund, PoolWork},
        outcomes::events::Action,
        transport::keys::client_in,
    },
    rules::{
        config::Config,
        request::CfField,
        rule::{Mode, Rule, RuleId},
        stats::StatsSettings,
    },
};

/// Unwritten minutes an isolate keeps at most besides its pending write
/// (which holds no more): when writes keep failing, the oldest go first,
/// so the buffer stays bounded.
pub const MAX_MINUTES: usize = 60;

/// Milliseconds in a minute.
pub const MINUTE_MS: u64 = 60_000;

/// One minute's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minute {
    /// Minutes since the Unix epoch (UTC).
    pub minute: u64,
    /// Over every request.
    pub totals: TotalCounts,
    /// Per rule, in configuration order.
    pub rules: Vec<RuleCounts>,
    /// Per rule, in configuration order: whom it denied most, and from
    /// where.
    pub denied: Vec<Denials>,
}

impl Minute {
    /// Nothing counted yet in `minute`, for `rules` rules.
    pub fn new(minute: u64, rules: usize) -> Minute {
        Minute {
            minute,
            totals: TotalCounts::default(),
            rules: vec![RuleCounts::default(); rules],
            // Not `vec![..; rules]`: that clones, and a clone of a
            // summary costs the wasm for nothing else.
            denied: (0..rules).map(|_| Denials::default()).collect(),
        }
    }

    /// Rule `rule`'s figures, if the configuration has it.
    fn rule(&mut self, rule: Option<usize>) -> Option<&mut RuleCounts> {
        self.rules.get_mut(rule?)
    }
}

/// How long a write may be in flight before the isolate counts it lost
/// and writes again (its budget is 5 s: a write this late was dropped
/// with the invocation that made it).
pub const WRITE_LOST_MS: u64 = 60_000;

/// How long a write whose outcome is unknown is sent again, from its first
/// sending. Past this its minutes are dropped as lost: the stats script
/// forgets a writer's last write [`WRITER_KEEP_MS`](super::stored::WRITER_KEEP_MS)
/// after taking it, twice this, so that a replay it took is never added again.
pub const REPLAY_FOR_MS: u64 = 12 * 60 * MINUTE_MS;

/// One write of an isolate's minutes: the isolate (`writer`, a number of
/// its own), the write's place in its sequence, and the minutes. A write
/// whose outcome is unknown goes again unchanged, so that the stats script
/// can tell a replay from a write and add it once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsWrite {
    /// The isolate's number.
    pub writer: u64,
    /// 1 for the isolate's first write, one more for each after.
    pub seq: u64,
    /// Oldest first.
    pub minutes: Vec<Minute>,
}

/// An isolate's unwritten counts, and when they are due to be written.
#[derive(Debug)]
pub struct Recorder {
    rules: usize,
    /// How and how often they are written.
    settings: StatsSettings,
    /// This isolate's number in its writes.
    writer: u64,
    /// The write begun and not yet known added, with when it was first
    /// sent: sent again, unchanged, until it is (within [`REPLAY_FOR_MS`]);
    /// what was counted since waits behind it.
    // Shared with the call in flight: a write is sent again unchanged.
    pending: Option<(Rc<StatsWrite>, u64)>,
    /// Oldest first; not in `pending`.
    minutes: Vec<Minute>,
    /// Minutes dropped: unwritten, to keep within [`MAX_MINUTES`], or in a
    /// write given up after [`REPLAY_FOR_MS`] (which Redis may hold).
    lost: u64,
    /// Failed writes and dropped minutes not yet reported: they go with
    /// the next new write, in its newest minute's figures (a write sent
    /// again goes unchanged).
    unreported: (u64, u64),
    /// When the next write is due; `None` until a first request is counted.
    next_ms: Option<u64>,
    /// When the write in flight started.
    writing_since: Option<u64>,
    /// The number of the last write made.
    sent: u64,
}

/// Where `rule` stands in `config`.
fn index_of(config: &Config, rule: &Rule) -> Option<usize> {
    config.rules.iter().position(|r| std::ptr::eq(r, rule))
}

/// Where the rule named `name` stands in `config`.
fn named(config: &Config, name: &str) -> Option<usize> {
    config.rules.iter().position(|r| r.name == name)
}

impl Recorder {
    /// Nothing counted yet, for `config`'s rules, kept as `settings` say,
    /// written as `writer`: a number no other isolate's recorder has.
    pub fn new(config: &Config, settings: StatsSettings, writer: u64) -> Recorder {
        Recorder {
            rules: config.rules.len(),
            settings,
            writer,
            pending: None,
            minutes: Vec::new(),
            lost: 0,
            unreported: (0, 0),
            next_ms: None,
            writing_since: None,
            sent: 0,
        }
    }

    /// How and how often the counts are written.
    pub fn settings(&self) -> StatsSettings {
        self.settings
    }

    /// The write to send when one is due at `now_ms`: `stats_every` after
    /// the last one began (or after the first request counted), none in
    /// flight, and something to write. That is the write whose outcome is
    /// unknown (failed, or lost in flight), unchanged, if there is one and
    /// it was first sent less than [`REPLAY_FOR_MS`] ago; otherwise the
    /// unwritten minutes, taken out, as the next write.
    pub fn due(&mut self, now_ms: u64) -> Option<Rc<StatsWrite>> {
        if let Some(since) = self.writing_since {
            if now_ms.saturating_sub(since) < WRITE_LOST_MS {
                return None;
            }
            // Lost in flight: a failure too.
            self.writing_since = None;
            self.unreported.0 += 1;
        }
        if let Some((given_up, _)) = self
            .pending
            .take_if(|(_, since)| now_ms.saturating_sub(*since) >= REPLAY_FOR_MS)
        {
            self.drop_minutes(given_up.minutes.len() as u64);
        }
        if self.pending.is_none() && self.minutes.is_empty() {
            return None;
        }
        let every = self.settings.every_ms;
        let next = *self.next_ms.get_or_insert(now_ms.saturating_add(every));
        if now_ms < next {
            return None;
        }
        self.next_ms = Some(now_ms.saturating_add(every));
        self.writing_since = Some(now_ms);
        if self.pending.is_none() {
            let seq = self.sent + 1;
            self.sent = seq;
            let mut minutes = self.take();
            if let Some(newest) = minutes.last_mut() {
                let (failures, dropped) = std::mem::take(&mut self.unreported);
                newest.totals[TotalCount::WriteFailures] += failures;
                newest.totals[TotalCount::DroppedMinutes] += dropped;
            }
            let write = StatsWrite {
                writer: self.writer,
                seq,
                minutes,
            };
            self.pending = Some((Rc::new(write), now_ms));
        }
        self.pending.as_ref().map(|(write, _)| Rc::clone(write))
    }

    /// When the next write is due (ms), if something waits to be written
    /// and a request has asked: for the isolate's own timer.
    pub fn next_due_ms(&self) -> Option<u64> {
        let waiting = self.pending.is_some() || !self.minutes.is_empty();
        self.next_ms.filter(|_| waiting)
    }

    /// [`Recorder::due`] as if due now: the isolate's last timer, after
    /// which no timer may come, writes what is left rather than hold it.
    pub fn due_early(&mut self, now_ms: u64) -> Option<Rc<StatsWrite>> {
        self.next_ms = Some(self.next_ms.map_or(now_ms, |n| n.min(now_ms)));
        self.due(now_ms)
    }

    /// The write [`Recorder::due`] gave has ended: `added` when Redis
    /// answered that it holds it; otherwise it goes again as it was.
    pub fn written(&mut self, added: bool) {
        self.writing_since = None;
        if added {
            self.pending = None;
        } else {
            self.unreported.0 += 1;
        }
    }

    /// `n` minutes dropped unwritten.
    fn drop_minutes(&mut self, n: u64) {
        self.lost += n;
        self.unreported.1 += n;
    }

    /// The minute holding `now_ms`, made if need be; `None` when it would
    /// be older than every minute kept while [`MAX_MINUTES`] are.
    fn minute(&mut self, now_ms: u64) -> Option<&mut Minute> {
        let minute = now_ms / MINUTE_MS;
        let at = self.minutes.partition_point(|m| m.minute < minute);
        if self.minutes.get(at).is_some_and(|m| m.minute == minute) {
            return self.minutes.get_mut(at);
        }
        let at = if self.minutes.len() < MAX_MINUTES {
            at
        } else {
            self.drop_minutes(1);
            if at == 0 {
                return None;
            }
            self.minutes.remove(0);
            at - 1
        };
        // Only the newest minute gains clients: the others need no more
        // than what is written.
        for m in &mut self.minutes {
            m.denied.iter_mut().for_each(|d| d.trim(KEPT));
        }
        self.minutes.insert(at, Minute::new(minute, self.rules));
        self.minutes.get_mut(at)
    }

    /// Counts one request at `now_ms`: what the limiter made of it, the
    /// script calls deciding it took (none: from a lease, the block cache,
    /// or no call at all), and where it came from (`request.cf`'s country
    /// and network, where the platform gave them).
    pub fn request(
        &mut self,
        config: &Config,
        handled: &Handled<'_>,
        from: &[(CfField, String)],
        calls: u64,
        now_ms: u64,
    ) {
        let place = |field| {
            let fact = from.iter().find(|(f, _)| *f == field);
            fact.map_or(UNPLACED, |(_, v)| v.as_str())
        };
        let Some(m) = self.minute(now_ms) else {
            return;
        };
        m.totals[TotalCount::Requests] += 1;
        m.totals[TotalCount::Calls] += calls;
        m.totals[match &handled.outcome {
            Outcome::Forward(Forward::Unlimited | Forward::Admitted(_)) => TotalCount::Admitted,
            Outcome::Forward(Forward::Bypassed) => TotalCount::Bypassed,
            Outcome::Deny(_) => TotalCount::Denied,
            Outcome::Refuse { .. } => TotalCount::Refused,
            Outcome::Unavailable => TotalCount::Unavailable,
        }] += 1;
        match &handled.outcome {
            Outcome::Forward(Forward::Unlimited) => m.totals[TotalCount::Unmatched] += 1,
            Outcome::Forward(Forward::Admitted(d)) => {
                // Only denials are held in the block cache: an admission
                // without a call, and not decided by another request's,
                // was decided from leased units.
                decided(m, config, d, calls, calls == 0 && handled.shared.is_none());
            }
            Outcome::Deny(d) => decided(m, config, d, calls, false),
            Outcome::Refuse { rule, .. } => {
                if let Some(r) = m.rule(index_of(config, rule)) {
                    r[RuleCount::Matched] += 1;
                    r[RuleCount::Refused] += 1;
                }
            }
            Outcome::Forward(Forward::Bypassed) | Outcome::Unavailable => {}
        }
        for e in &handled.events {
            let counted = match (e.action, e.status) {
                // A shadow rule that could not identify the client.
                (Action::Refuse, None) => RuleCount::Refused,
                (Action::FailOpen, _) => RuleCount::FailOpen,
                (Action::FailClosed, _) => RuleCount::FailClosed,
                (Action::Deny, _) => {
                    let rule = named(config, &e.rule);
                    let client = e.key.as_deref().and_then(client_in);
                    // The key names the client as the stats show it
                    // (`stats_clients`).
                    if let (Some(rule), Some(client)) = (rule, client) {
                        let denials = &mut m.denied[rule];
                        denials.clients.add(client, 1);
                        denials.countries.add(place(CfField::Country), 1);
                        denials.networks.add(place(CfField::Asn), 1);
                    }
                    continue;
                }
                _ => continue,
            };
            let failed = counted != RuleCount::Refused;
            if let Some(r) = m.rule(named(config, &e.rule)) {
                r[RuleCount::Matched] += 1;
                r[counted] += 1;
                // A fail event's rule was in the call that failed.
                r[RuleCount::Calls] += if failed { calls } else { 0 };
            }
        }
    }

    /// Counts `calls` made after a response at `now_ms` for `rules`.
    fn after(&mut self, rules: impl Iterator<Item = Option<usize>>, calls: u64, now_ms: u64) {
        if calls == 0 {
            return;
        }
        let Some(m) = self.minute(now_ms) else {
            return;
        };
        m.totals[TotalCount::Calls] += calls;
        for rule in rules {
            if let Some(r) = m.rule(rule) {
                r[RuleCount::Calls] += calls;
            }
        }
    }

    /// Counts the `calls` settling `pending`'s charges after an answer of
    /// `status` whose headers `reported` costs took, at `now_ms`.
    pub fn refunded(
        &mut self,
        config: &Config,
        pending: &PendingRefund,
        (status, reported): (u16, &[(String, Option<String>)]),
        calls: u64,
        now_ms: u64,
    ) {
        let settled = pending.settled(config, (status, reported));
        let rules =
            (settled.back.iter().chain(&settled.more)).map(|c| index_of(config, c.check.rule));
        self.after(rules, calls, now_ms);
    }

    /// Counts the `calls` giving back `pending`'s in-flight slots took, at
    /// `now_ms`.
    pub fn released(&mut self, config: &Config, pending: &PendingRefund, calls: u64, now_ms: u64) {
        let charges = pending.releasing(config);
        let rules = charges.iter().map(|c| index_of(config, c.check.rule));
        self.after(rules, calls, now_ms);
    }

    /// Counts the `calls` refreshing `pending`'s leases took, at `now_ms`.
    pub fn refreshed(&mut self, pending: &LeaseRefresh, calls: u64, now_ms: u64) {
        let rules = pending.rules.iter().map(|(RuleId(i), _, _)| Some(*i));
        self.after(rules, calls, now_ms);
    }

    /// Counts the `calls` topping up and crediting `work`'s pools took,
    /// at the home and in the region, at `now_ms`.
    pub fn topped_up(&mut self, work: &PoolWork, calls: u64, now_ms: u64) {
        let asked = work.asks.iter().map(|a| a.rule);
        let mut rules = vec![];
        for RuleId(i) in asked.chain(work.credits.iter().map(|(rule, _)| *rule)) {
            if !rules.contains(&Some(i)) {
                rules.push(Some(i));
            }
        }
        self.after(rules.into_iter(), calls, now_ms);
    }

    /// Counts the `calls` reading the rule-wide overrides of `rules` took,
    /// at `now_ms`.
    pub fn reread(&mut self, config: &Config, rules: &[String], calls: u64, now_ms: u64) {
        let rules = rules.iter().map(|name| named(config, name));
        self.after(rules, calls, now_ms);
    }

    /// Every unwritten minute, oldest first, taken out.
    fn take(&mut self) -> Vec<Minute> {
        std::mem::take(&mut self.minutes)
    }

    /// Minutes dropped unwritten since the isolate started.
    pub fn lost(&self) -> u64 {
        self.lost
    }
}

/// Counts a decided request under each of its rules: `calls` made
/// deciding it, and whether it was decided from leased units.
fn decided(m: &mut Minute, config: &Config, d: &Decided<'_>, calls: u64, leased: bool) {
    for (i, (rule, state)) in d.rules.iter().zip(&d.decision.rules).enumerate() {
        let Some(r) = m.rule(index_of(config, rule)) else {
            continue;
        };
        RuleFate::of(&d.decision, state, rule.mode == Mode::Shadow).count(r);
        r[RuleCount::Calls] += calls;
        r[RuleCount::Leased] += u64::from(leased);
        r[RuleCount::PenaltiesStarted] += u64::from(d.decision.penalties_started.contains(&i));
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, collections::VecDeque, time::Duration};

    use serde_json::{json, Value};

    use super::*;
    use crate::{
        decision::{
            limiter::{Limiter, TopUpAsk},
            memory::block_cache::BlockCache,
            memory::in_flight::{InFlight, SharedCall},
            memory::leases::Leases,
            memory::rule_wide::RuleWide,
            outcomes::verdict::{Decision, RuleState, Verdict},
            runtime::TokioPause,
            stats::{calls::Counted, counts::RULE_COUNTS, top::TopDenied},
            transport::keys::rule_key,
            transport::protocol::{Credit, ScriptRunner},
            transport::redis_rest::{RestError, Script},
        },
        rules::request::RequestMeta,
    };

    /// A store answering each call with the next reply given.
    struct Replies(RefCell<VecDeque<Result<Value, RestError>>>);

    impl ScriptRunner for Replies {
        async fn eval(
            &self,
            _: &Script,
            _: &[String],
            _: &[String],
            _: Duration,
        ) -> Result<Value, RestError> {
            self.0
                .borrow_mut()
                .pop_front()
                .expect("a reply for each call")
        }

        async fn commands(
            &self,
            _: &[Vec<String>],
            _: Duration,
        ) -> Result<Vec<Result<Value, RestError>>, RestError> {
            unreachable!("no rule here takes overrides, so nothing reads them")
        }
    }

    fn config() -> Config {
        Config::from_json(&config_json()).unwrap()
    }

    fn config_json() -> Value {
        json!({"rules": [
            {"name": "ip", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s",
             "fail": "open"},
            {"name": "login", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1m",
             "path_prefix": "/login", "penalty": "10m"},
            {"name": "look", "key": ["query:q"], "algorithm": "gcra", "rate": 1, "period": "1m",
             "path_prefix": "/search", "mode": "shadow"},
            {"name": "k", "key": ["query:k"], "algorithm": "gcra", "rate": 1, "period": "1m",
             "path_prefix": "/k"}
        ]})
    }

    const ADMIT: &str = "[1, 5, 4, 200, 0, 1]";

    /// Sends `path` from 192.0.2.1 (in the Netherlands, on network 64496)
    /// at `now_ms` through a limiter on `replies`, recording what came of it.
    fn send(
        recorder: &mut Recorder,
        config: &Config,
        cache: &RefCell<BlockCache>,
        path: &str,
        replies: &[Result<Value, RestError>],
        now_ms: u64,
    ) {
        let (path, query) = path
            .split_once('?')
            .map_or((path, None), |(p, q)| (p, Some(q)));
        let ip = ("cf-connecting-ip".to_owned(), "192.0.2.1".to_owned());
        let req = RequestMeta::new("GET", "example.com", path, query, [ip]);
        let store = Replies(RefCell::new(replies.iter().cloned().collect()));
        let counted = Counted::new(&store);
        let limiter = Limiter {
            config,
            store: &counted,
            cache,
            leases: &RefCell::new(Leases::new()),
            wide: &RefCell::new(RuleWide::new()),
            in_flight: &InFlight::new(TokioPause(|| 0)),
            pinned: true,
            home: None,
        };
        let handled = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(limiter.handle(&req, now_ms));
        let from = [
            (CfField::Country, "NL".to_owned()),
            (CfField::Asn, "64496".to_owned()),
        ];
        recorder.request(config, &handled, &from, counted.take(), now_ms);
    }

    fn reply(text: &str) -> Result<Value, RestError> {
        Ok(serde_json::from_str(text).unwrap())
    }

    fn figures(m: &Minute, rule: usize) -> [(RuleCount, u64); RULE_COUNTS] {
        RuleCount::ALL.map(|c| (c, m.rules[rule][c]))
    }

    fn only(pairs: &[(RuleCount, u64)]) -> [(RuleCount, u64); RULE_COUNTS] {
        RuleCount::ALL.map(|c| {
            let n = pairs.iter().find(|(k, _)| *k == c).map_or(0, |(_, n)| *n);
            (c, n)
        })
    }

    /// Every kind of request, through the real limiter: each counts where
    /// the issue says, and once.
    #[test]
    fn each_outcome_counts_under_its_rules() {
        use RuleCount::*;
        let c = config();
        let mut rec = Recorder::new(&c, StatsSettings::default(), 1);
        let cache = RefCell::new(BlockCache::new(60_000));
        // Admitted by `ip` alone.
        send(&mut rec, &c, &cache, "/", &[reply(ADMIT)], 1_000);
        // Denied by `login`, which starts its penalty; `ip` admitted it.
        let penalty = "[1, 5, 4, 200, 0, 1, 0, 1, 0, 600000, 600000, 1, 2]";
        send(&mut rec, &c, &cache, "/login", &[reply(penalty)], 2_000);
        // The same again, from the block cache: no call.
        send(&mut rec, &c, &cache, "/login", &[], 3_000);
        // A shadow rule that would deny, and one it cannot key (q twice).
        let would = "[1, 5, 4, 200, 0, 1, 0, 1, 0, 60000, 60000, 1]";
        send(&mut rec, &c, &cache, "/search?q=a", &[reply(would)], 4_000);
        send(
            &mut rec,
            &c,
            &cache,
            "/search?q=a&q=b",
            &[reply(ADMIT)],
            4_500,
        );
        // Refused: `k` twice with different values.
        send(&mut rec, &c, &cache, "/k?k=1&k=2", &[], 5_000);
        // Redis unreachable: `ip` alone is open, `login` closed.
        let down = || Err(RestError::Transport("refused".into()));
        send(&mut rec, &c, &cache, "/", &[down()], 6_000);
        let fresh = RefCell::new(BlockCache::new(60_000));
        send(&mut rec, &c, &fresh, "/login", &[down()], 7_000);
        let minutes = rec.take();
        assert_eq!(minutes.len(), 1);
        let m = &minutes[0];
        assert_eq!(m.minute, 0);
        assert_eq!(
            TotalCount::ALL.map(|t| m.totals[t]),
            // requests, admitted, denied, refused, unmatched, bypassed, unavailable, calls,
            // write failures, dropped minutes
            [8, 3, 2, 1, 0, 1, 1, 6, 0, 0]
        );
        assert_eq!(
            figures(m, 0),
            only(&[
                (Matched, 7),
                (Admitted, 3),
                (DeniedByOthers, 2),
                (FailOpen, 1),
                (FailClosed, 1),
                (Calls, 6)
            ])
        );
        assert_eq!(
            figures(m, 1),
            only(&[
                (Matched, 3),
                (Denied, 2),
                (FailClosed, 1),
                (PenaltiesStarted, 1),
                (Calls, 2)
            ])
        );
        assert_eq!(
            figures(m, 2),
            only(&[
                (Matched, 2),
                (Admitted, 1),
                (ShadowWouldDeny, 1),
                (Refused, 1),
                (Calls, 1)
            ])
        );
        assert_eq!(figures(m, 3), only(&[(Matched, 1), (Refused, 1)]));
        let names = |t: &TopDenied| -> Vec<(String, u64)> {
            t.top(10)
                .iter()
                .map(|e| (e.name.clone(), e.count))
                .collect()
        };
        let login = &m.denied[1];
        assert_eq!(names(&login.clients), [("192.0.2.1".into(), 2)]);
        assert_eq!(names(&login.countries), [("NL".into(), 2)]);
        assert_eq!(names(&login.networks), [("64496".into(), 2)]);
        assert!(m.denied[0] == Denials::default() && m.denied[2] == Denials::default());
        assert!(rec.take().is_empty(), "taken");
    }

    /// An admission that made no call came from leased units, unless a
    /// call another request sent decided it.
    #[test]
    fn an_admission_without_a_call_counts_as_leased() {
        let c = config();
        let mut rec = Recorder::new(&c, StatsSettings::default(), 1);
        let state = RuleState {
            verdict: Verdict::Admitted,
            limit: 5,
            remaining: 3,
            reset_after_ms: 400,
            window: 1,
        };
        let decision = Decision::settle(vec![state], &[Mode::Enforce]);
        let handled = Handled {
            outcome: Outcome::Forward(Forward::Admitted(Decided {
                rules: vec![&c.rules[0]],
                decision,
            })),
            events: vec![],
            refund: None,
            refresh: None,
            reread: vec![],
            shared: None,
            pool: Default::default(),
        };
        rec.request(&c, &handled, &[], 0, 10);
        rec.request(&c, &handled, &[], 1, 20);
        let shared = Some(SharedCall {
            call: 1,
            place: 0,
            sent: false,
        });
        rec.request(&c, &Handled { shared, ..handled }, &[], 0, 30);
        let m = &rec.take()[0];
        assert_eq!(m.rules[0][RuleCount::Leased], 1);
        assert_eq!(m.rules[0][RuleCount::Admitted], 3);
        assert_eq!(m.rules[0][RuleCount::Calls], 1);
    }

    /// A pool's top-up after a response, the home's call and the region's
    /// credit, counts under each rule it served once, and in the totals.
    #[test]
    fn a_top_ups_calls_count_under_its_rules() {
        let c = config();
        let mut rec = Recorder::new(&c, StatsSettings::default(), 1);
        let ask = |rule| TopUpAsk {
            rule: RuleId(rule),
            key: "el:{192.0.2.1}:ip".to_owned(),
            units: 4,
            asked_us: 0,
        };
        let credit = Credit {
            key: "el:{192.0.2.1}:k:pool".to_owned(),
            asked_us: 0,
            units: 4,
            ms: 1000,
            hold_ms: 1000,
            home: (0, 0),
        };
        let work = PoolWork {
            asks: vec![ask(0), ask(0)],
            credits: vec![(RuleId(3), credit)],
        };
        rec.topped_up(&work, 3, 10);
        rec.topped_up(&PoolWork::default(), 0, 20);
        let m = &rec.take()[0];
        assert_eq!(m.totals[TotalCount::Calls], 3);
        let calls: Vec<u64> = m.rules.iter().map(|r| r[RuleCount::Calls]).collect();
        assert_eq!(calls, [3, 0, 0, 3]);
    }

    /// Under `stats_clients = "hash"` or `"hmac"`, a client is kept as
    /// its keys name it, and no address is kept readable.
    #[test]
    fn clients_are_kept_as_their_keys_name_them() {
        for (clients, prefix) in [("hash", '#'), ("hmac", '~')] {
            let mut json = config_json();
            json["stats"] = json!(true);
            json["stats_clients"] = json!(clients);
            let secret = "0123456789abcdef0123456789abcdef";
            let c = Config::from_json(&json)
                .unwrap()
                .keyed_by(Some(secret))
                .unwrap();
            let mut rec = Recorder::new(&c, c.stats.unwrap(), 1);
            let cache = RefCell::new(BlockCache::new(60_000));
            let deny = "[1, 5, 4, 200, 0, 1, 0, 1, 0, 60000, 60000, 1, 0]";
            send(&mut rec, &c, &cache, "/login", &[reply(deny)], 0);
            let m = &rec.take()[0];
            let shown = m.denied[1].clients.top(1)[0].name.clone();
            let key = rule_key(&c.rules[1], &["192.0.2.1"]);
            assert_eq!(Some(shown.as_str()), client_in(&key), "{clients}");
            assert!(
                shown.starts_with(prefix) && !shown.contains("192.0.2"),
                "{shown}"
            );
        }
    }

    /// A write is due `stats_every` after the first request, then after
    /// each write began; one at a time, unless one is lost in flight.
    #[test]
    fn writes_come_at_most_every_stats_every() {
        let c = config();
        let every = StatsSettings::default().every_ms;
        let mut rec = Recorder::new(&c, StatsSettings::default(), 7);
        let cache = RefCell::new(BlockCache::new(60_000));
        assert!(rec.due(0).is_none(), "nothing counted");
        send(&mut rec, &c, &cache, "/", &[reply(ADMIT)], 1_000);
        assert!(rec.due(1_000).is_none());
        assert!(rec.due(1_000 + every - 1).is_none());
        let first = rec.due(1_000 + every).expect("due");
        assert_eq!((first.writer, first.seq), (7, 1));
        assert_eq!(first.minutes[0].totals[TotalCount::Requests], 1);
        send(&mut rec, &c, &cache, "/", &[reply(ADMIT)], 2_000 + every);
        assert!(rec.due(3_000 + 2 * every).is_none(), "one write at a time");
        rec.written(false);
        assert!(rec.due(999 + 2 * every).is_none());
        // Its outcome unknown, the write goes again as it was; what came
        // since waits for the next.
        let again = rec.due(1_000 + 2 * every).expect("due again");
        assert_eq!(again, first);
        rec.written(true);
        let second = rec.due(1_000 + 3 * every).expect("then the next");
        assert_eq!(second.seq, 2);
        assert_eq!(second.minutes[0].totals[TotalCount::Requests], 1);
        // The failure goes with the next new write, its replay unchanged.
        assert_eq!(second.minutes[0].totals[TotalCount::WriteFailures], 1);
        // A write that never ends is given up after a minute, and sent
        // again as it was.
        send(
            &mut rec,
            &c,
            &cache,
            "/",
            &[reply(ADMIT)],
            2_000 + 3 * every,
        );
        assert!(rec.due(999 + 3 * every + WRITE_LOST_MS).is_none());
        assert_eq!(rec.due(1_000 + 3 * every + WRITE_LOST_MS), Some(second));
        rec.written(true);
        let third = rec.due(1_000 + 4 * every + WRITE_LOST_MS).expect("due");
        assert_eq!(third.seq, 3);
        assert_eq!(
            third.minutes[0].totals[TotalCount::WriteFailures],
            1,
            "a write lost in flight failed too"
        );
    }

    /// What the isolate's own timer needs: when the next write is due while
    /// something waits, and the last timer's write, due or not.
    #[test]
    fn a_timer_learns_when_to_write_and_the_last_one_writes_early() {
        let c = config();
        let every = StatsSettings::default().every_ms;
        let mut rec = Recorder::new(&c, StatsSettings::default(), 7);
        let cache = RefCell::new(BlockCache::new(60_000));
        assert_eq!(rec.next_due_ms(), None);
        send(&mut rec, &c, &cache, "/", &[reply(ADMIT)], 1_000);
        assert!(rec.due(1_000).is_none());
        assert_eq!(rec.next_due_ms(), Some(1_000 + every));
        let early = rec.due_early(2_000).expect("written early");
        assert_eq!(early.minutes[0].totals[TotalCount::Requests], 1);
        rec.written(true);
        assert_eq!(rec.next_due_ms(), None, "nothing waits");
        send(&mut rec, &c, &cache, "/", &[reply(ADMIT)], 3_000);
        assert_eq!(
            rec.next_due_ms(),
            Some(2_000 + every),
            "counted from the write"
        );
        assert!(rec.due_early(3_000).is_some());
        assert!(rec.due_early(3_001).is_none(), "one write at a time");
    }

    /// A write whose outcome stays unknown is given up before the stats
    /// script could forget it took it, its minutes counted lost.
    #[test]
    fn a_write_unknown_for_too_long_is_dropped_not_replayed() {
        let c = config();
        let mut rec = Recorder::new(&c, StatsSettings::default(), 7);
        let cache = RefCell::new(BlockCache::new(60_000));
        let every = rec.settings().every_ms;
        send(&mut rec, &c, &cache, "/", &[reply(ADMIT)], 1_000);
        assert!(
            rec.due(1_000).is_none(),
            "due stats_every after the first request"
        );
        let first = rec.due(1_000 + every).expect("due");
        let last_replay = 1_000 + every + REPLAY_FOR_MS - 1;
        send(&mut rec, &c, &cache, "/", &[reply(ADMIT)], last_replay);
        rec.written(false);
        assert_eq!(rec.due(last_replay), Some(first.clone()));
        rec.written(false);
        let next = rec.due(last_replay + 1 + every).expect("the next");
        assert_eq!(next.seq, 2);
        assert_eq!(next.minutes.len(), 1);
        assert_eq!(next.minutes[0].minute, last_replay / MINUTE_MS);
        assert_eq!(rec.lost(), first.minutes.len() as u64);
        let reported = &next.minutes[0].totals;
        assert_eq!(reported[TotalCount::WriteFailures], 2);
        assert_eq!(reported[TotalCount::DroppedMinutes], rec.lost());
    }

    /// Minutes fall where their requests did, in order; past the bound
    /// the oldest go.
    #[test]
    fn minutes_are_kept_in_order_and_bounded() {
        let c = config();
        let mut rec = Recorder::new(&c, StatsSettings::default(), 1);
        let cache = RefCell::new(BlockCache::new(60_000));
        send(&mut rec, &c, &cache, "/", &[reply(ADMIT)], 60_000);
        send(&mut rec, &c, &cache, "/", &[reply(ADMIT)], 59_999);
        send(&mut rec, &c, &cache, "/", &[reply(ADMIT)], 61_000);
        let taken = rec.take();
        let requests: Vec<(u64, u64)> = taken
            .iter()
            .map(|m| (m.minute, m.totals[TotalCount::Requests]))
            .collect();
        assert_eq!(requests, [(0, 1), (1, 2)]);
        for minute in 0..MAX_MINUTES as u64 + 5 {
            send(
                &mut rec,
                &c,
                &cache,
                "/",
                &[reply(ADMIT)],
                minute * MINUTE_MS,
            );
        }
        assert_eq!(rec.lost(), 5);
        let kept = rec.take();
        assert_eq!(kept.len(), MAX_MINUTES);
        assert_eq!(kept[0].minute, 5);
    }
}
