//! A reference model of both algorithms, and of how one request's rules are
//! decided together, in plain Rust, written from their definitions (the
//! docs/ and the comments at the top of each `lua/` file) rather than from
//! the code that implements them. It shares nothing with that code but plain
//! data: the rules as configured, and the [`Decision`] it fills in. So the
//! Redis key, a window's edge offset, the emission interval and the choice
//! of the binding rule are all worked out here again, and a bug in any of
//! them in production shows up as a disagreement. Counts are summed over
//! the buckets inside each window, not kept as running totals.
//!
//! Property tests hold the real script to it field by field, on a pinned
//! clock and on Redis's own; `edge-limiter simulate --engine model` runs on it.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
};

use crate::{
    decision::{
        outcomes::verdict::{
            Decision, OverrideRead, OverrideSource, RequestVerdict, Retry, RuleState, Verdict,
        },
        transport::protocol::{Check, RefundCharge},
    },
    rules::{
        policy::{Concurrency, Gcra, Policy, Window, Windows},
        rule::{Mode, Rule},
    },
};

/// A client of one rule: the rule's name and the identifier's parts.
type Client = (String, Vec<String>);

/// A day, microseconds: how long a GCRA charge's figures are kept.
const DAY_US: u64 = 86_400_000_000;

/// One client's windows, by (duration, precision): admitted cost per
/// bucket id. Keyed by client first, so a reset drops them in one go.
type ClientBuckets = HashMap<(u64, u64), BTreeMap<i64, u64>>;

/// State of every client the model has seen; nothing ever expires, because
/// an expired key and a key whose state is all in the past decide alike.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Model {
    /// GCRA: theoretical arrival time, microseconds.
    tats: HashMap<Client, u64>,
    /// Windowed: admitted cost per bucket id, per client and (duration, precision).
    buckets: HashMap<Client, ClientBuckets>,
    /// When each running penalty ends, milliseconds.
    penalties: HashMap<Client, u64>,
    /// What each client's override key holds (any text, as stored).
    overrides: HashMap<Client, String>,
    /// Each rule's override for every client, as the caller passes it.
    rule_wide: HashMap<String, String>,
    /// Per client, each GCRA charge with a refund mark less than a day
    /// old: its mark, and the interval (us) and burst it was made at, which
    /// a refund gives back and a debit charges at whatever holds since.
    /// Older marks are dropped with the client's next charge.
    charged_at_us: HashMap<Client, Vec<(u64, u64, u64)>>,
    /// In-flight: the last slot number handed out, and each slot held
    /// with when it expires (ms).
    slots: HashMap<Client, (u64, Vec<(u64, u64)>)>,
}

/// What an override does, as the model reads its text: docs/operator.md's
/// format, parsed here again.
enum ModelOverride {
    Gcra {
        rate: u64,
        period_ms: u64,
        burst: u64,
    },
    Limits(Vec<u64>),
    InFlight(u64),
    Block,
}

/// The override `text` holds for `rule`, if it is one: `v1 block`, `v1
/// gcra <rate> <period ms> <burst> <interval us>` with the interval
/// period / rate rounded to the nearest microsecond, or `v1 windows` and
/// `<duration ms>:<limit>` for each of the rule's windows in its order;
/// numbers in plain decimal, none zero.
fn read_override(text: &str, rule: &Rule) -> Option<ModelOverride> {
    let words: Vec<&str> = text.split(' ').collect();
    if words.len() < 2 || words[0] != "v1" {
        return None;
    }
    let plain = |w: &str| {
        let digits = !w.is_empty() && !w.starts_with('0') && w.bytes().all(|b| b.is_ascii_digit());
        w.parse::<u64>().ok().filter(|_| digits)
    };
    if let ("windows", Policy::Windowed(ws)) = (words[1], &rule.policy) {
        let named = &words[2..];
        if named.len() != ws.len() {
            return None;
        }
        let mut limits = Vec::new();
        for (w, pair) in ws.iter().zip(named) {
            let (duration, limit) = pair.split_once(':')?;
            if plain(duration)? != w.duration_ms() {
                return None;
            }
            limits.push(plain(limit).filter(|l| *l <= 1_000_000_000)?);
        }
        return Some(ModelOverride::Limits(limits));
    }
    let mut numbers = Vec::new();
    for w in &words[2..] {
        numbers.push(plain(w)?);
    }
    match (words[1], &rule.policy, numbers.as_slice()) {
        ("block", _, []) => Some(ModelOverride::Block),
        ("concurrency", Policy::Concurrency(_), &[limit]) => {
            (limit <= 1_000_000).then_some(ModelOverride::InFlight(limit))
        }
        ("gcra", Policy::Gcra(_), &[rate, period_ms, burst, interval_us]) => {
            let rounded = emission_us(rate, period_ms);
            let fits = rate <= period_ms * 1000
                && period_ms <= 366 * 86_400_000
                && burst <= 1_000_000_000
                && interval_us.checked_mul(burst).is_some_and(|s| s <= 1 << 51);
            (rounded == interval_us && fits).then_some(ModelOverride::Gcra {
                rate,
                period_ms,
                burst,
            })
        }
        _ => None,
    }
}

/// The emission interval of `rate` per `period_ms`: period / rate, to the
/// nearest microsecond.
fn emission_us(rate: u64, period_ms: u64) -> u64 {
    (period_ms * 1000 + rate / 2) / rate
}

/// One rule's standing as the model works it out, before it is written
/// into the plain [`RuleState`] the script's reply is read into.
#[derive(Debug, Clone, Copy)]
struct ModelState {
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_after_ms: u64,
    /// `None`: never (when denied). When allowed, how long the request
    /// waits before it conforms (0: not at all).
    retry_after_ms: Option<u64>,
    window: usize,
    /// A GCRA denial that waiting this long (us) would turn into an
    /// admission.
    wait_us: Option<u64>,
}

impl ModelState {
    fn state(self) -> RuleState {
        let verdict = match (self.allowed, self.retry_after_ms) {
            (true, None | Some(0)) => Verdict::Admitted,
            (true, Some(ms)) => Verdict::Delayed { ms },
            (false, Some(ms)) => Verdict::Denied(Retry::After { ms }),
            (false, None) => Verdict::Denied(Retry::Never),
        };
        RuleState {
            verdict,
            limit: self.limit,
            remaining: self.remaining,
            reset_after_ms: self.reset_after_ms,
            window: self.window,
        }
    }
}

/// What a rule would store if the request is admitted.
enum StateWrite {
    Tat(u64),
    Buckets(Vec<((u64, u64), i64, u64)>),
    /// In-flight: `n` slots numbered from `first`, taken at `now` (ms),
    /// expiring at `expiry`; the slots expired by then go.
    Slots {
        first: u64,
        n: u64,
        now: u64,
        expiry: u64,
    },
}

/// One window's verdict, before the rule picks its binding window.
struct WindowVerdict {
    admit: bool,
    limit: u64,
    remaining: i64,
    reset_after_ms: u64,
    retry_after_ms: Option<u64>,
    current: i64,
}

/// One request's rules as the model decides them: each check with its
/// client, and what is in force for it ([`Model::in_force`]).
struct Request<'a, 'c, 's> {
    checks: &'a [(Check<'c>, Vec<&'s str>)],
    clients: Vec<Client>,
    /// Each rule's figures in force (an override's, if any).
    policies: Vec<Cow<'c, Policy>>,
    /// Whether an override blocks each rule.
    blocked: Vec<bool>,
    /// What each rule that takes overrides reports of those it read.
    overrides: Vec<Option<OverrideRead>>,
    now_ms: u64,
}

/// The request's verdict over the rules' standings. Denied: the enforced
/// denying rule that frees up last binds (the first of equals). Admitted:
/// the first with the fewest units left.
fn request_verdict(states: &[ModelState], enforced: &[bool], allowed: bool) -> RequestVerdict {
    let mut binding: Option<usize> = None;
    for (i, s) in states.iter().enumerate() {
        let better = match binding {
            _ if !allowed && (!enforced[i] || s.allowed) => false,
            None => true,
            Some(b) if allowed => s.remaining < states[b].remaining,
            Some(b) => waits_longer(s.retry_after_ms, states[b].retry_after_ms),
        };
        if better {
            binding = Some(i);
        }
    }
    let binding = binding.unwrap_or(0);
    let retry = states.get(binding).and_then(|s| s.retry_after_ms);
    let delay_ms = (states.iter().zip(enforced))
        .filter(|(s, e)| **e && s.allowed)
        .filter_map(|(s, _)| s.retry_after_ms)
        .max()
        .unwrap_or(0);
    match (allowed, retry) {
        (true, _) => RequestVerdict::Admitted {
            tightest: binding,
            delay_ms,
        },
        (false, Some(ms)) => RequestVerdict::Denied {
            binding,
            retry: Retry::After { ms },
        },
        (false, None) => RequestVerdict::Denied {
            binding,
            retry: Retry::Never,
        },
    }
}

/// The longest rule `i` of `req` lets a request wait, us (0: none).
fn max_delay_us(req: &Request<'_, '_, '_>, i: usize) -> u64 {
    match req.policies[i].as_ref() {
        Policy::Gcra(g) => g.max_delay_ms() * 1000,
        _ => 0,
    }
}

/// Whether rule `i`, standing at `s`, would admit the request after a wait
/// its own `max_delay` allows.
fn own_delay_covers(req: &Request<'_, '_, '_>, i: usize, s: &ModelState) -> bool {
    s.wait_us.is_some_and(|w| w <= max_delay_us(req, i))
}

/// How long a denied request waits before it reaches the origin, us, if
/// it does: the longest wait of the enforced denials that their own rule's
/// delay covers, provided every other enforced rule admits it by then and
/// no rule counts in windows, whose buckets count a request when it is
/// decided.
fn delay(req: &Request<'_, '_, '_>, states: &[ModelState], enforced: &[bool]) -> Option<u64> {
    let denials = || (0..states.len()).filter(|&i| enforced[i] && !states[i].allowed);
    let later = denials()
        .filter(|&i| own_delay_covers(req, i, &states[i]))
        .filter_map(|i| states[i].wait_us)
        .max()?;
    let windows = (req.policies.iter()).any(|p| matches!(p.as_ref(), Policy::Windowed(_)));
    let all_by_then = denials().all(|i| states[i].wait_us.is_some_and(|w| w <= later));
    (all_by_then && !windows).then_some(later)
}

/// Whether waiting `a` takes strictly longer than waiting `b`; `None` is
/// forever.
fn waits_longer(a: Option<u64>, b: Option<u64>) -> bool {
    match (a, b) {
        (None, b) => b.is_some(),
        (Some(_), None) => false,
        (Some(a), Some(b)) => a > b,
    }
}

impl Model {
    /// An empty model.
    pub fn new() -> Model {
        Model::default()
    }

    /// What `rule`'s override key for client `id` holds from now on
    /// (`None`: no key).
    pub fn set_override(&mut self, rule: &str, id: &[&str], text: Option<&str>) {
        let client = (rule.to_owned(), id.iter().map(|p| p.to_string()).collect());
        match text {
            Some(text) => self.overrides.insert(client, text.to_owned()),
            None => self.overrides.remove(&client),
        };
    }

    /// `rule`'s override for every client from now on (`None`: none).
    pub fn set_rule_wide(&mut self, rule: &str, text: Option<&str>) {
        match text {
            Some(text) => self.rule_wide.insert(rule.to_owned(), text.to_owned()),
            None => self.rule_wide.remove(rule),
        };
    }

    /// The rule in force for `client` (figures replaced by an override),
    /// whether an override blocks it, and what the decision reports of the
    /// overrides it read; `None` for a rule that takes none.
    fn in_force<'c>(
        &self,
        rule: &'c Rule,
        client: &Client,
        i: usize,
    ) -> (Cow<'c, Policy>, bool, Option<OverrideRead>) {
        if !rule.overrides {
            return (Cow::Borrowed(&rule.policy), false, None);
        }
        let own = self.overrides.get(client);
        let own_read = own.and_then(|t| read_override(t, rule));
        let ignored = own.is_some() && own_read.is_none();
        let wide = self.rule_wide.get(&rule.name);
        let (source, text, read) = match (own_read, wide.and_then(|t| read_override(t, rule))) {
            (Some(o), _) => (OverrideSource::Client, own.cloned(), Some(o)),
            (None, Some(o)) => (OverrideSource::Rule, wide.cloned(), Some(o)),
            (None, None) => (OverrideSource::None, None, None),
        };
        let report = OverrideRead {
            rule: i,
            source,
            text: text.unwrap_or_default(),
            ignored,
        };
        let mut in_force = Cow::Borrowed(&rule.policy);
        let blocked = match read {
            Some(ModelOverride::Block) => true,
            Some(ModelOverride::Gcra {
                rate,
                period_ms,
                burst,
            }) => {
                if let (Ok(g), Policy::Gcra(own)) =
                    (Gcra::new(rate, period_ms, burst), &rule.policy)
                {
                    in_force = Cow::Owned(Policy::Gcra(g.delaying(own.max_delay_ms())));
                }
                false
            }
            Some(ModelOverride::InFlight(limit)) => {
                if let Policy::Concurrency(c) = &rule.policy {
                    if let Ok(c) = Concurrency::new(limit, c.hold_ms()) {
                        in_force = Cow::Owned(Policy::Concurrency(c));
                    }
                }
                false
            }
            Some(ModelOverride::Limits(limits)) => {
                if let Policy::Windowed(ws) = &rule.policy {
                    let windows: Option<Vec<Window>> = ws
                        .iter()
                        .zip(&limits)
                        .map(|(w, l)| Window::new(w.duration_ms(), *l, w.precision_ms()).ok())
                        .collect();
                    if let Some(ws) = windows.and_then(|w| Windows::new(w).ok()) {
                        in_force = Cow::Owned(Policy::Windowed(ws));
                    }
                }
                false
            }
            None => false,
        };
        (in_force, blocked, Some(report))
    }

    /// Decides one request at `now_ms`: every rule is checked; when no
    /// enforced rule denies, every rule that admits is charged, otherwise
    /// none is and the admitting rules are reported as they stand; either
    /// way, a rule with a penalty that denied on its own (a shadow rule
    /// too) starts it, unless the call costs it nothing. A running penalty
    /// denies its rule, which is then reported at cost 0 with the
    /// penalty's time left. Each charge of a
    /// rule with `count_status` is marked for [`Model::refund`]: a GCRA
    /// rule's by the TAT the charge left (us), a windowed rule's by the
    /// charge's time on the key's shifted clock (ms).
    pub fn decide(&mut self, checks: &[(Check<'_>, Vec<&str>)], now_ms: u64) -> Decision {
        let req = self.request(checks, now_ms);
        let (mut states, writes): (Vec<ModelState>, Vec<Option<StateWrite>>) = checks
            .iter()
            .enumerate()
            .map(|(i, (c, _))| self.check_rule(&req, i, c.cost))
            .unzip();
        let enforced: Vec<bool> = checks
            .iter()
            .map(|(c, _)| c.rule.mode == Mode::Enforce)
            .collect();
        let mut allowed = !(0..checks.len()).any(|i| enforced[i] && !states[i].allowed);
        let mut writes = writes;
        let later = if allowed {
            Some(0)
        } else {
            delay(&req, &states, &enforced)
        };
        if let Some(later) = later {
            allowed = true;
            for (i, (state, write)) in states.iter_mut().zip(&mut writes).enumerate() {
                let cured =
                    state.wait_us.is_some_and(|w| w <= later) || own_delay_covers(&req, i, state);
                if cured || (later > 0 && state.allowed) {
                    if let Some((s, w)) = self.arriving(&req, i, later, state.wait_us) {
                        (*state, *write) = (s, w);
                    }
                }
            }
        }
        let mut refund_marks = vec![];
        if allowed {
            refund_marks = self.charge(&req, writes);
        } else {
            self.as_they_stand(&req, &mut states);
        }
        let penalties_started = self.start_penalties(&req, &mut states);
        Decision {
            verdict: request_verdict(&states, &enforced, allowed),
            rules: states.into_iter().map(ModelState::state).collect(),
            penalties_started,
            refund_marks,
            grants: vec![],
            overrides: req.overrides.into_iter().flatten().collect(),
            pools: vec![],
        }
    }

    /// Gives back charges by their marks, at `now_ms`: what a GCRA charge
    /// still holds (its cost, less what time has paid off since the TAT it
    /// left), and a windowed charge's cost out of the bucket it was counted
    /// in, in each window that still counts that bucket. Whether anything
    /// was given back, per charge.
    pub fn refund(&mut self, charges: &[RefundCharge<'_>], now_ms: u64) -> Vec<bool> {
        charges
            .iter()
            .map(|charge| {
                let (c, id, mark) = (&charge.check, &charge.id, &charge.mark);
                let client: Client = (
                    c.rule.name.clone(),
                    id.iter().map(|p| p.to_string()).collect(),
                );
                match &c.rule.policy {
                    Policy::Concurrency(_) => {
                        let Some((_, held)) = self.slots.get_mut(&client) else {
                            return false;
                        };
                        let before = held.len();
                        held.retain(|(id, _)| !(*mark..*mark + c.cost).contains(id));
                        held.len() < before
                    }
                    Policy::Gcra(g) => {
                        let (interval, _) = self.charged_under(&client, *mark, g);
                        let now = now_ms * 1000;
                        let Some(tat) = self.tats.get(&client).copied().filter(|t| *t > now) else {
                            return false;
                        };
                        let back = (c.cost * interval).min(mark.saturating_sub(now));
                        if back == 0 {
                            return false;
                        }
                        self.tats.insert(client, tat - back.min(tat - now));
                        true
                    }
                    Policy::Windowed(ws) => {
                        let longest = ws.iter().map(|w| w.duration_ms()).max().unwrap_or(1);
                        let shifted =
                            now_ms + edge_offset(&documented_key(&client.0, &client.1), longest);
                        let charged_at = *mark as i64;
                        let mut given = false;
                        for w in ws.iter() {
                            let (p, n) = (
                                w.precision_ms() as i64,
                                (w.duration_ms() / w.precision_ms()) as i64,
                            );
                            let id = charged_at.div_euclid(p);
                            if id <= (shifted as i64).div_euclid(p) - n {
                                continue;
                            }
                            let bucket = self
                                .buckets
                                .get_mut(&client)
                                .and_then(|c| c.get_mut(&(w.duration_ms(), w.precision_ms())))
                                .and_then(|b| b.get_mut(&id));
                            if let Some(held) = bucket.filter(|h| **h > 0) {
                                *held -= c.cost.min(*held);
                                given = true;
                            }
                        }
                        given
                    }
                }
            })
            .collect()
    }

    /// Charges more than decisions charged, at `now_ms`: each charge's
    /// cost again, past the limit if it must be (a response reporting more
    /// than its estimate). A GCRA charge's TAT moves on by its units at the
    /// interval it was made at, from now if the TAT lies behind, to at most
    /// two bursts ahead; a windowed charge's units count in every window's
    /// bucket of now. Whether each moved anything.
    pub fn debit(&mut self, charges: &[RefundCharge<'_>], now_ms: u64) -> Vec<bool> {
        charges
            .iter()
            .map(|charge| {
                let c = &charge.check;
                let client: Client = (
                    c.rule.name.clone(),
                    charge.id.iter().map(|p| p.to_string()).collect(),
                );
                match &c.rule.policy {
                    Policy::Gcra(g) => {
                        let (interval, burst) = self.charged_under(&client, charge.mark, g);
                        let now = now_ms * 1000;
                        let tat = self.tats.get(&client).copied().unwrap_or(0).max(now);
                        let owed = (tat + c.cost * interval).min(now + 2 * interval * burst);
                        if owed <= tat {
                            return false;
                        }
                        self.tats.insert(client, owed);
                        true
                    }
                    Policy::Windowed(ws) => {
                        let longest = ws.iter().map(|w| w.duration_ms()).max().unwrap_or(1);
                        let key = documented_key(&client.0, &client.1);
                        let shifted = (now_ms + edge_offset(&key, longest)) as i64;
                        let adds = (ws.iter())
                            .map(|w| {
                                let id = shifted.div_euclid(w.precision_ms() as i64);
                                ((w.duration_ms(), w.precision_ms()), id, c.cost)
                            })
                            .collect();
                        self.apply(Some(StateWrite::Buckets(adds)), client);
                        c.cost > 0
                    }
                    Policy::Concurrency(_) => false,
                }
            })
            .collect()
    }

    /// The interval (us) and burst a client's GCRA charge marked `mark`
    /// was made at; `g`'s own where the mark is not known.
    fn charged_under(&self, client: &Client, mark: u64, g: &Gcra) -> (u64, u64) {
        let marks = self.charged_at_us.get(client).into_iter().flatten();
        (marks.filter(|(m, _, _)| *m == mark))
            .map(|(_, interval, burst)| (*interval, *burst))
            .next()
            .unwrap_or((emission_us(g.rate(), g.period_ms()), g.burst()))
    }

    /// `checks` at `now_ms`, each with its client and what is in force
    /// for it.
    fn request<'a, 'c, 's>(
        &self,
        checks: &'a [(Check<'c>, Vec<&'s str>)],
        now_ms: u64,
    ) -> Request<'a, 'c, 's> {
        let clients: Vec<Client> = checks
            .iter()
            .map(|(c, id)| {
                (
                    c.rule.name.clone(),
                    id.iter().map(|p| p.to_string()).collect(),
                )
            })
            .collect();
        let (policies, blocked, overrides) = checks
            .iter()
            .zip(&clients)
            .enumerate()
            .map(|(i, ((c, _), client))| self.in_force(c.rule, client, i))
            .collect();
        Request {
            checks,
            clients,
            policies,
            blocked,
            overrides,
            now_ms,
        }
    }

    /// What is left of the penalty running for rule `i`'s client, ms (0:
    /// none).
    fn penalty_left(&self, req: &Request<'_, '_, '_>, i: usize) -> u64 {
        let end = req.checks[i]
            .0
            .rule
            .penalty_ms
            .and(self.penalties.get(&req.clients[i]).copied());
        end.map_or(0, |end| end.saturating_sub(req.now_ms))
    }

    /// Rule `i` at `cost`, under what is in force for its client: a block
    /// denies like a running penalty without end, and neither charges.
    fn check_rule(
        &self,
        req: &Request<'_, '_, '_>,
        i: usize,
        cost: u64,
    ) -> (ModelState, Option<StateWrite>) {
        let blocked = req.blocked[i];
        let running = self.penalty_left(req, i);
        let cost = if running > 0 || blocked { 0 } else { cost };
        let (mut state, mut write) =
            self.check(&req.policies[i], &req.clients[i], cost, req.now_ms);
        if blocked || running > 0 {
            state.wait_us = None;
        }
        if blocked {
            state.allowed = false;
            state.remaining = 0;
            state.retry_after_ms = None;
            write = None;
        } else if running > 0 {
            state.allowed = false;
            state.retry_after_ms = Some(running);
            state.reset_after_ms = state.reset_after_ms.max(running);
            write = None;
        }
        (state, write)
    }

    /// Stores an admitted request's `writes`, one per rule; returns the
    /// refund mark of each charge of a rule with `count_status`.
    fn charge(
        &mut self,
        req: &Request<'_, '_, '_>,
        writes: Vec<Option<StateWrite>>,
    ) -> Vec<(usize, u64)> {
        let marks = writes
            .iter()
            .enumerate()
            .filter_map(|(i, write)| Some((i, self.refund_mark(req, i, write.as_ref()?)?)))
            .collect();
        for (write, client) in writes.into_iter().zip(req.clients.iter().cloned()) {
            self.apply(write, client);
        }
        marks
    }

    /// The refund mark of rule `i`'s charge `write`, if the rule has
    /// `count_status`: a GCRA charge's TAT (us), noted with the interval it
    /// was made at; a windowed charge's time on the key's shifted clock (ms).
    fn refund_mark(
        &mut self,
        req: &Request<'_, '_, '_>,
        i: usize,
        write: &StateWrite,
    ) -> Option<u64> {
        let rule = req.checks[i].0.rule;
        match (write, &rule.policy) {
            (StateWrite::Slots { first, .. }, _) => Some(*first),
            _ if rule.count_status.is_empty() => None,
            (StateWrite::Tat(tat), _) => {
                if let Policy::Gcra(g) = req.policies[i].as_ref() {
                    let marks = self
                        .charged_at_us
                        .entry(req.clients[i].clone())
                        .or_default();
                    marks.retain(|(m, _, _)| *m + DAY_US > req.now_ms * 1000);
                    marks.push((*tat, emission_us(g.rate(), g.period_ms()), g.burst()));
                }
                Some(*tat)
            }
            (StateWrite::Buckets(_), Policy::Windowed(ws)) => {
                let longest = ws.iter().map(|w| w.duration_ms()).max().unwrap_or(1);
                let key = documented_key(&req.clients[i].0, &req.clients[i].1);
                Some(req.now_ms + edge_offset(&key, longest))
            }
            _ => None,
        }
    }

    /// A denied request charges nothing: the rules that would have
    /// admitted it are reported as they stand, at cost 0.
    fn as_they_stand(&self, req: &Request<'_, '_, '_>, states: &mut [ModelState]) {
        for (i, state) in states.iter_mut().enumerate() {
            if state.allowed {
                *state = self.check_rule(req, i, 0).0;
            }
        }
    }

    /// Starts the penalty of each rule that has one and denied on its own,
    /// unless one runs already or a block denied; returns their indices.
    fn start_penalties(
        &mut self,
        req: &Request<'_, '_, '_>,
        states: &mut [ModelState],
    ) -> Vec<usize> {
        let mut started = vec![];
        for (i, (c, _)) in req.checks.iter().enumerate() {
            let Some(ms) = c.rule.penalty_ms else {
                continue;
            };
            // A call at cost 0 (a refresh, a look) denies no request.
            if !states[i].allowed && self.penalty_left(req, i) == 0 && !req.blocked[i] && c.cost > 0
            {
                self.penalties
                    .insert(req.clients[i].clone(), req.now_ms + ms);
                let s = &mut states[i];
                s.retry_after_ms = Some(s.retry_after_ms.map_or(ms, |r| r.max(ms)));
                s.reset_after_ms = s.reset_after_ms.max(ms);
                started.push(i);
            }
        }
        started
    }

    /// Forgets one client's state on one rule.
    pub fn reset(&mut self, rule: &str, id: &[&str]) {
        let client: Client = (rule.to_owned(), id.iter().map(|p| p.to_string()).collect());
        self.tats.remove(&client);
        self.penalties.remove(&client);
        self.buckets.remove(&client);
    }

    fn apply(&mut self, write: Option<StateWrite>, client: Client) {
        match write {
            Some(StateWrite::Tat(tat)) => {
                self.tats.insert(client, tat);
            }
            Some(StateWrite::Slots {
                first,
                n,
                now,
                expiry,
            }) => {
                let (last, held) = self.slots.entry(client).or_default();
                held.retain(|(_, e)| *e > now);
                held.extend((first..first + n).map(|id| (id, expiry)));
                *last = first + n - 1;
            }
            Some(StateWrite::Buckets(adds)) => {
                let windows = self.buckets.entry(client).or_default();
                for ((duration, precision), id, cost) in adds {
                    let buckets = windows.entry((duration, precision)).or_default();
                    *buckets.entry(id).or_default() += cost;
                }
            }
            None => {}
        }
    }

    fn check(
        &self,
        policy: &Policy,
        client: &Client,
        cost: u64,
        now_ms: u64,
    ) -> (ModelState, Option<StateWrite>) {
        match policy {
            Policy::Gcra(g) => {
                self.gcra(client, (g.rate(), g.period_ms(), g.burst()), cost, now_ms)
            }
            Policy::Windowed(ws) => {
                let windows: Vec<(u64, u64, u64)> = ws
                    .iter()
                    .map(|w| (w.duration_ms(), w.limit(), w.precision_ms()))
                    .collect();
                let longest = windows.iter().map(|w| w.0).max().unwrap_or(1);
                let offset = edge_offset(&documented_key(&client.0, &client.1), longest);
                self.windowed(client, &windows, cost, now_ms + offset)
            }
            Policy::Concurrency(c) => {
                self.in_flight(client, (c.limit(), c.hold_ms()), cost, now_ms)
            }
        }
    }

    /// The in-flight limit from its definition: a request takes `cost`
    /// slots when no more than `limit` would then be held; a slot is held
    /// until released or `hold_ms` after it was taken. Slots are numbered
    /// on from the last, and never below now x 1024, so numbers never
    /// repeat. A full client is told to retry when its first slot expires,
    /// at most a second on.
    fn in_flight(
        &self,
        client: &Client,
        (limit, hold_ms): (u64, u64),
        cost: u64,
        now_ms: u64,
    ) -> (ModelState, Option<StateWrite>) {
        let (last, held) = self.slots.get(client).cloned().unwrap_or_default();
        let live: Vec<u64> = held
            .iter()
            .filter(|(_, e)| *e > now_ms)
            .map(|(_, e)| *e)
            .collect();
        let free = limit as i64 - live.len() as i64;
        if cost as i64 <= free {
            let remaining = (free - cost as i64) as u64;
            let state = ModelState {
                allowed: true,
                limit,
                remaining,
                reset_after_ms: if remaining == 0 { 1000 } else { 0 },
                retry_after_ms: Some(0),
                window: 1,
                wait_us: None,
            };
            let write = (cost > 0).then(|| StateWrite::Slots {
                first: (last + 1).max(now_ms * 1024),
                n: cost,
                now: now_ms,
                expiry: now_ms + hold_ms,
            });
            return (state, write);
        }
        let retry = (cost <= limit).then(|| {
            let first = live.iter().min().map_or(1000, |e| e - now_ms);
            first.clamp(1, 1000)
        });
        let state = ModelState {
            allowed: false,
            limit,
            remaining: free.max(0) as u64,
            reset_after_ms: retry.unwrap_or(0),
            retry_after_ms: retry,
            window: 1,
            wait_us: None,
        };
        (state, None)
    }

    /// GCRA from its definition: each unit occupies the limiter for one
    /// emission interval (period / rate, to the nearest microsecond); a
    /// request is admitted when the theoretical arrival time (TAT), moved on
    /// by its units, lies no more than burst intervals ahead of now. A
    /// denial that waiting would cure notes how long.
    fn gcra(
        &self,
        client: &Client,
        (rate, period_ms, burst): (u64, u64, u64),
        cost: u64,
        now_ms: u64,
    ) -> (ModelState, Option<StateWrite>) {
        let interval = emission_us(rate, period_ms);
        let tolerance = interval * burst;
        let now = now_ms * 1000;
        let tat = self.tats.get(client).copied().unwrap_or(0).max(now);
        let wanted = tat + cost * interval;
        let ms_up = |us: u64| us.div_ceil(1000);
        if wanted - now <= tolerance {
            let state = ModelState {
                allowed: true,
                limit: burst,
                remaining: (tolerance - (wanted - now)) / interval,
                reset_after_ms: ms_up(wanted - now),
                retry_after_ms: Some(0),
                window: 1,
                wait_us: None,
            };
            return (state, (cost > 0).then_some(StateWrite::Tat(wanted)));
        }
        let state = ModelState {
            allowed: false,
            limit: burst,
            remaining: tolerance.saturating_sub(tat - now) / interval,
            reset_after_ms: ms_up(tat - now),
            // More than the burst never fits, however long one waits.
            retry_after_ms: (cost <= burst).then(|| ms_up(wanted - now - tolerance)),
            window: 1,
            wait_us: Some(wanted - now - tolerance).filter(|_| cost > 0 && cost <= burst),
        };
        (state, None)
    }

    /// Rule `i`'s standing and write when the request reaches the origin
    /// `later_us` from now: a GCRA rule counts it arriving then, or when it
    /// would itself conform (`wait_us`) if that is later (a shadow rule's
    /// own delay), and reports the wait only if it delays requests itself;
    /// an in-flight slot is taken now either way (`None`).
    fn arriving(
        &self,
        req: &Request<'_, '_, '_>,
        i: usize,
        later_us: u64,
        wait_us: Option<u64>,
    ) -> Option<(ModelState, Option<StateWrite>)> {
        let Policy::Gcra(g) = req.policies[i].as_ref() else {
            return None;
        };
        let interval = emission_us(g.rate(), g.period_ms());
        let cost = req.checks[i].0.cost;
        let now = req.now_ms * 1000;
        let arrival = now + later_us.max(wait_us.unwrap_or(0));
        let tat = self.tats.get(&req.clients[i]).copied().unwrap_or(0);
        let wanted = tat.max(now + later_us) + cost * interval;
        let state = ModelState {
            allowed: true,
            limit: g.burst(),
            remaining: (interval * g.burst() + arrival - wanted) / interval,
            reset_after_ms: (wanted - now).div_ceil(1000),
            retry_after_ms: Some(match g.max_delay_ms() {
                0 => 0,
                _ => wait_us.unwrap_or(0).div_ceil(1000),
            }),
            window: 1,
            wait_us: None,
        };
        Some((state, Some(StateWrite::Tat(wanted))))
    }

    /// Sliding windows from their definition: a window of `duration` counts
    /// the cost admitted in the buckets of `precision` that overlap it;
    /// `shifted` is now plus the client's edge offset, so bucket edges fall
    /// on its multiples.
    fn windowed(
        &self,
        client: &Client,
        windows: &[(u64, u64, u64)],
        cost: u64,
        shifted: u64,
    ) -> (ModelState, Option<StateWrite>) {
        let shifted = shifted as i64;
        let per_window: Vec<WindowVerdict> = windows
            .iter()
            .map(|&window| self.window(client, window, cost, shifted))
            .collect();

        // Denied: the first denying window that frees up last binds.
        // Admitted: the first with the fewest units left.
        let admit = per_window.iter().all(|w| w.admit);
        let mut bound = 0;
        for (i, w) in per_window.iter().enumerate() {
            let b = &per_window[bound];
            let better = if admit {
                w.remaining < b.remaining
            } else {
                !w.admit && (b.admit || waits_longer(w.retry_after_ms, b.retry_after_ms))
            };
            if better {
                bound = i;
            }
        }
        let b = &per_window[bound];
        let state = ModelState {
            allowed: admit,
            limit: b.limit,
            remaining: b.remaining.max(0) as u64,
            reset_after_ms: b.reset_after_ms,
            retry_after_ms: b.retry_after_ms,
            window: bound + 1,
            wait_us: None,
        };
        let write = (admit && cost > 0).then(|| {
            StateWrite::Buckets(
                windows
                    .iter()
                    .zip(&per_window)
                    .map(|(&(d, _, p), w)| ((d, p), w.current, cost))
                    .collect(),
            )
        });
        (state, write)
    }
}

impl Model {
    /// One window of `(duration, limit, precision)` (ms): the cost it counts
    /// in the buckets overlapping it at `shifted`, and its verdict on `cost`.
    fn window(
        &self,
        client: &Client,
        (duration, limit, precision): (u64, u64, u64),
        cost: u64,
        shifted: i64,
    ) -> WindowVerdict {
        let (p, n) = (precision as i64, (duration / precision) as i64);
        let current = shifted.div_euclid(p);
        let empty = BTreeMap::new();
        let counted: Vec<(i64, u64)> = self
            .buckets
            .get(client)
            .and_then(|c| c.get(&(duration, precision)))
            .unwrap_or(&empty)
            .range(current - n + 1..=current)
            .map(|(id, c)| (*id, *c))
            .collect();
        let total: u64 = counted.iter().map(|(_, c)| c).sum();
        let admit = total + cost <= limit;
        let after = if admit { total + cost } else { total };
        // A bucket leaves the window n buckets after it began.
        let leaves = |id: i64| ((id + n) * p - shifted) as u64;
        let retry_after_ms = if admit {
            Some(0)
        } else if cost > limit {
            None
        } else {
            let mut freed = 0;
            counted
                .iter()
                .find(|(_, c)| {
                    freed += c;
                    freed >= total + cost - limit
                })
                .map(|(id, _)| leaves(*id))
        };
        let newest = if admit && cost > 0 {
            Some(current)
        } else {
            counted.last().map(|(id, _)| *id)
        };
        WindowVerdict {
            admit,
            limit,
            remaining: limit as i64 - after as i64,
            reset_after_ms: match newest {
                Some(id) if after > 0 => leaves(id),
                _ => 0,
            },
            retry_after_ms,
            current,
        }
    }
}

/// The Redis key as docs/how-it-works.md defines it: `el:{<id>}:<rule>`, the parts
/// joined by `|` when all are made of `A-Za-z0-9._:@/-`, not all empty and
/// at most 64 bytes together; otherwise `#` and the SHA1 of the parts, each
/// preceded by its length as 8 big-endian bytes.
pub fn documented_key(rule: &str, parts: &[String]) -> String {
    let plain_chars = |p: &String| {
        p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".:_@/-".contains(&b))
    };
    let length: usize = parts.iter().map(String::len).sum();
    let id = if length > 0 && length <= 64 && parts.iter().all(plain_chars) {
        parts.join("|")
    } else {
        let mut sha = sha1_smol::Sha1::new();
        for p in parts {
            sha.update(&(p.len() as u64).to_be_bytes());
            sha.update(p.as_bytes());
        }
        format!("#{}", sha.digest())
    };
    format!("el:{{{id}}}:{rule}")
}

/// A client's window edge offset as docs/how-it-works.md defines it: the key's 64-bit
/// FNV-1a hash, modulo the rule's longest window.
pub fn edge_offset(key: &str, longest_ms: u64) -> u64 {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash % longest_ms.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::config::Config;
    use serde_json::json;

    fn rules(list: serde_json::Value) -> Vec<Rule> {
        Config::from_json(&json!({ "rules": list })).unwrap().rules
    }

    #[test]
    fn gcra_admits_the_burst_then_one_per_interval() {
        let r = rules(
            json!([{"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 2, "period": "1s", "burst": 3}]),
        );
        let mut m = Model::new();
        let check = |m: &mut Model, t| {
            m.decide(
                &[(
                    Check {
                        rule: &r[0],
                        cost: 1,
                    },
                    vec!["a"],
                )],
                t,
            )
        };
        // (time ms, admitted, remaining, retry-after ms)
        let steps = [
            (0, true, 2, None),
            (0, true, 1, None),
            (0, true, 0, None),
            (0, false, 0, Some(500)),
            (499, false, 0, Some(1)),
            (500, true, 0, None),
            (2000, true, 2, None),
        ];
        for (t, allowed, remaining, retry) in steps {
            let d = check(&mut m, t);
            assert_eq!(
                (d.admitted(), d.rules[0].remaining, d.wait_ms()),
                (allowed, remaining, retry),
                "at {t}"
            );
        }
    }

    #[test]
    fn windowed_counts_only_buckets_inside_the_window() {
        let r = rules(
            json!([{"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 3, "250ms"]]}]),
        );
        let offset = edge_offset("el:{a}:w", 1000);
        let base = 10_000 - offset; // shifted time 10 000: a bucket edge
        let mut m = Model::new();
        let mut at = |t: u64, cost| m.decide(&[(Check { rule: &r[0], cost }, vec!["a"])], base + t);
        assert!(at(0, 2).admitted());
        assert!(at(300, 1).admitted());
        let denied = at(400, 1);
        assert!(!denied.admitted());
        // The first bucket [0, 250) leaves the window at 1000.
        assert_eq!(denied.wait_ms(), Some(600));
        assert!(!at(999, 1).admitted());
        let later = at(1000, 1);
        assert!(later.admitted());
        assert_eq!(later.rules[0].remaining, 1);
        // Peek: nothing consumed.
        assert_eq!(at(1000, 0).rules[0].remaining, 1);
    }

    #[test]
    fn a_denial_consumes_nothing_anywhere() {
        let r = rules(json!([
            {"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s"},
            {"name": "b", "key": ["ip"], "algorithm": "windowed", "windows": [["1m", 1, "1m"]]}
        ]));
        let mut m = Model::new();
        let checks = [
            (
                Check {
                    rule: &r[0],
                    cost: 1,
                },
                vec!["x"],
            ),
            (
                Check {
                    rule: &r[1],
                    cost: 1,
                },
                vec!["x"],
            ),
        ];
        assert!(m.decide(&checks, 0).admitted());
        let d = m.decide(&checks, 1);
        assert!(!d.admitted());
        assert_eq!(d.binding(), 1);
        assert!(d.rules[0].admitted());
        assert_eq!(
            d.rules[0].remaining, 9,
            "rule a reports its state without this request"
        );
    }

    #[test]
    fn keys_and_offsets_follow_the_documented_definitions() {
        let parts = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(documented_key("r", &parts(&["1.2.3.4"])), "el:{1.2.3.4}:r");
        assert_eq!(documented_key("r", &parts(&["a", "b"])), "el:{a|b}:r");
        for hashed in [&[""][..], &["a b"], &["a|b"]] {
            assert!(
                documented_key("r", &parts(hashed)).starts_with("el:{#"),
                "{hashed:?}"
            );
        }
        // FNV-1a of the empty string is its offset basis.
        assert_eq!(edge_offset("", u64::MAX), 0xcbf2_9ce4_8422_2325);
        assert!(edge_offset("el:{a}:w", 1000) < 1000);
    }
}
