//! The isolate's quota leases: units the script charged ahead of the
//! requests that spend them, per state key, each grant with its own
//! deadline. A request is admitted from here only with units that were
//! charged and whose deadline has not passed, so Redis's counts always
//! cover what was admitted. Pure: the caller passes its clock.

use super::seeded::SeededMap;

use crate::decision::outcomes::verdict::{OverrideRead, RuleState, Verdict};
use crate::rules::overrides::BLOCK_TEXT;

/// Keys an isolate tracks at most: a key beyond it gets no lease (exactly
/// the behaviour without leases) until an idle one is forgotten.
pub const MAX_KEYS: usize = 4096;

/// Units granted together, spendable until `until_ms` (isolate clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LeasedUnits {
    units: u64,
    until_ms: u64,
}

/// What one key's leases and demand look like in this isolate.
#[derive(Debug, Clone, Default)]
struct KeyLeases {
    /// Grants, earliest deadline first (a few at most: a Vec is smaller in
    /// the wasm than a VecDeque).
    held: Vec<LeasedUnits>,
    /// The rule's state as the last grant left it, for the headers.
    state: Option<(RuleState, u64)>,
    /// The override that grant was made under (or the latest a call
    /// read since), for the headers too, and to tell when it changes.
    overridden: Option<OverrideRead>,
    /// When the key was last asked for, and the smoothed gap between asks.
    last_ms: Option<u64>,
    gap_ms: Option<u64>,
    /// When the key's current run of arrivals began: a run goes on while
    /// each arrival comes before a lease granted at the one before would
    /// have ended.
    run_start_ms: u64,
    /// Since when a call asking for a lease (a request's or a refresh) is
    /// in flight: one at a time, so that concurrent requests do not each
    /// lease what the key's demand wants. It lapses after
    /// [`ASK_LAPSE_MS`], answered or not.
    asking: Option<u64>,
    /// How many times the key's leases were ended: a grant from a call
    /// sent before the latest end is void ([`Leases::epoch`]).
    epoch: u64,
}

impl KeyLeases {
    fn usable(&mut self, now_ms: u64) -> u64 {
        self.held.retain(|h| h.until_ms > now_ms && h.units > 0);
        self.held.iter().map(|h| h.units).sum()
    }

    fn asking(&self, now_ms: u64) -> bool {
        self.asking
            .is_some_and(|since| now_ms.saturating_sub(since) < ASK_LAPSE_MS)
    }
}

/// `took_ms` folded into the round trip `known` so far, at weight 1/8.
fn smoothed(known: Option<u64>, took_ms: u64) -> u64 {
    known.map_or(took_ms, |rt| (7 * rt + took_ms).div_ceil(8))
}

/// How long an ask holds its key, at most. A call ends within its budget
/// (30 s at most), so an older ask is one whose request was cancelled
/// before it could end it: it must not stop the key leasing for good.
pub const ASK_LAPSE_MS: u64 = 31_000;

/// Every key's leases in one isolate.
#[derive(Debug, Default)]
pub struct Leases {
    keys: SeededMap<String, KeyLeases>,
    /// How long a call to Redis takes to be answered, smoothed (weight
    /// 1/8): the part of a lease's length gone before it can be spent, as
    /// its deadline counts from the sending.
    round_trip_ms: Option<u64>,
    /// The same of a call to the home region's Redis, from a region whose
    /// pools it tops up: how early a pool asks.
    home_trip_ms: Option<u64>,
}

impl Leases {
    /// No leases, no demand seen.
    pub fn new() -> Leases {
        Leases::default()
    }

    /// Records a request for `key` at `now_ms`, a lease granted at which
    /// would last `horizon_ms`: the demand a lease is sized from.
    pub fn observe(&mut self, key: &str, now_ms: u64, horizon_ms: u64) {
        if !self.keys.contains_key(key) && !self.make_room(now_ms) {
            return;
        }
        let entry = self.keys.entry(key.to_owned()).or_default();
        let gap = entry.last_ms.map(|last| now_ms.saturating_sub(last));
        if gap.is_none_or(|gap| gap >= horizon_ms) {
            entry.run_start_ms = now_ms;
        }
        if let Some(gap) = gap {
            // A quarter of each new gap: steady within a few requests,
            // and one pause cannot shrink a busy key's lease to nothing.
            entry.gap_ms = Some(entry.gap_ms.map_or(gap, |g| (3 * g + gap) / 4));
        }
        entry.last_ms = Some(now_ms);
    }

    /// Units `key`'s demand here would spend within `horizon_ms`, less the
    /// round trip that brings them, at most `most`; none for a key whose
    /// current run of arrivals has lasted less than half of `horizon_ms`
    /// (a burst, or a key seen once), or when the round trip takes it all.
    pub fn demand(&self, key: &str, most: u64, horizon_ms: u64) -> u64 {
        let Some(e) = self.keys.get(key) else {
            return 0;
        };
        // A burst ends before it spends a lease, and the units it leaves
        // unspent hold the room its client's next burst needs; a run that
        // has lasted half a lease is a stream, which goes on to spend it.
        let run_ms = e.last_ms.unwrap_or(0).saturating_sub(e.run_start_ms);
        if run_ms * 2 < horizon_ms {
            return 0;
        }
        // Units that come back after their deadline were charged for
        // nothing: the client's budget shrinks by them.
        let spendable_ms = horizon_ms.saturating_sub(self.round_trip_ms.unwrap_or(0));
        match e.gap_ms {
            Some(_) if spendable_ms == 0 => 0,
            Some(gap) => spendable_ms.checked_div(gap).unwrap_or(most).min(most),
            None => 0,
        }
    }

    /// Units to ask for `key` now: its [`Leases::demand`] less what it
    /// still holds.
    pub fn want(&mut self, key: &str, most: u64, horizon_ms: u64, now_ms: u64) -> u64 {
        let demand = self.demand(key, most, horizon_ms);
        demand.saturating_sub(self.held(key, now_ms))
    }

    /// Whether `key` holds `cost` units it may still spend at `now_ms`
    /// (a request costing nothing needs a live lease all the same, for
    /// its headers).
    pub fn can_spend(&mut self, key: &str, cost: u64, now_ms: u64) -> bool {
        self.keys
            .get_mut(key)
            .is_some_and(|e| e.usable(now_ms) >= cost.max(1))
    }

    /// Spends `cost` units of `key` (which [`Leases::can_spend`] allowed),
    /// earliest deadline first; returns the rule's state as this isolate
    /// sees it: the grant's remaining plus what the isolate still holds.
    pub fn spend(&mut self, key: &str, cost: u64, now_ms: u64) -> Option<RuleState> {
        let entry = self.keys.get_mut(key)?;
        if entry.usable(now_ms) < cost {
            return None;
        }
        let mut due = cost;
        for h in entry.held.iter_mut() {
            let take = due.min(h.units);
            h.units -= take;
            due -= take;
        }
        let left = entry.usable(now_ms);
        let (state, at_ms) = entry.state?;
        Some(RuleState {
            verdict: Verdict::Admitted,
            remaining: state.remaining.saturating_add(left).min(state.limit),
            reset_after_ms: state
                .reset_after_ms
                .saturating_sub(now_ms.saturating_sub(at_ms)),
            ..state
        })
    }

    /// Keeps `units` granted to `key` by a call sent at `sent_ms`, for
    /// `for_ms` from the script's now: the deadline counts from the
    /// sending, never later, so it cannot outlast the script's. `state`
    /// and `overridden` are the rule's as that call decided it.
    pub fn grant(
        &mut self,
        key: &str,
        units: u64,
        for_ms: u64,
        sent_ms: u64,
        (state, overridden): (RuleState, Option<OverrideRead>),
    ) {
        if units == 0 || (!self.keys.contains_key(key) && !self.make_room(sent_ms)) {
            return;
        }
        let entry = self.keys.entry(key.to_owned()).or_default();
        let until_ms = sent_ms.saturating_add(for_ms);
        let at = entry.held.partition_point(|h| h.until_ms <= until_ms);
        entry.held.insert(at, LeasedUnits { units, until_ms });
        entry.state = Some((state, sent_ms));
        entry.overridden = overridden;
    }

    /// The override `key`'s last grant was made under, if any.
    pub fn overridden(&self, key: &str) -> Option<&OverrideRead> {
        self.keys.get(key)?.overridden.as_ref()
    }

    /// Units to ask for `key` in a call about to be sent, if no other ask
    /// is in flight: its [`Leases::want`]. A non-zero answer starts an ask
    /// that [`Leases::answered`] ends.
    pub fn begin_ask(&mut self, key: &str, most: u64, horizon_ms: u64, now_ms: u64) -> u64 {
        let units = self.want(key, most, horizon_ms, now_ms);
        self.asking(key, units, now_ms)
    }

    /// Starts an ask of `units` for `key` at `now_ms` unless one is in
    /// flight; the units to ask for.
    fn asking(&mut self, key: &str, units: u64, now_ms: u64) -> u64 {
        match self.keys.get_mut(key) {
            Some(entry) if units > 0 && !entry.asking(now_ms) => {
                entry.asking = Some(now_ms);
                units
            }
            _ => 0,
        }
    }

    /// Units a refresh should ask for `key`, starting the ask: its whole
    /// demand once it holds half of that or less, with no ask in flight
    /// (0: none). The whole demand, so that a steady key makes one call
    /// per demand's worth of requests; it then holds 1.5 times its demand
    /// at most.
    pub fn begin_refresh(&mut self, key: &str, most: u64, horizon_ms: u64, now_ms: u64) -> u64 {
        let demand = self.demand(key, most, horizon_ms);
        if self.held(key, now_ms) * 2 > demand {
            return 0;
        }
        self.asking(key, demand, now_ms)
    }

    /// The ask for `key` is over, granted or not.
    pub fn answered(&mut self, key: &str) {
        if let Some(entry) = self.keys.get_mut(key) {
            entry.asking = None;
        }
    }

    /// A call to Redis was answered `took_ms` after it was sent.
    pub fn round_trip(&mut self, took_ms: u64) {
        self.round_trip_ms = Some(smoothed(self.round_trip_ms, took_ms));
    }

    /// A call to the home's Redis was answered `took_ms` after it was sent.
    pub fn home_trip(&mut self, took_ms: u64) {
        // At least 1 ms: 0 tells the script the trip is not known yet.
        self.home_trip_ms = Some(smoothed(self.home_trip_ms, took_ms).max(1));
    }

    /// How long a call to the home takes, smoothed, ms (0: none answered).
    pub fn home_trip_ms(&self) -> u64 {
        self.home_trip_ms.unwrap_or(0)
    }

    /// How many times `key`'s leases were ended so far. A call notes it
    /// when sent: a grant it brings back after a later end (a block or
    /// other figures read by a call answered first) may have been decided
    /// before what ended them, and is void.
    pub fn epoch(&self, key: &str) -> u64 {
        self.keys.get(key).map_or(0, |e| e.epoch)
    }

    /// A call read that `key`'s rule is now under `read` (the override in
    /// force, `None` for the configured figures): a block, or figures
    /// other than those its leases were granted under, ends them, lest
    /// units charged under the old figures be spent under the new.
    pub fn figures_read(&mut self, key: &str, read: Option<&OverrideRead>) {
        let Some(entry) = self.keys.get_mut(key) else {
            return;
        };
        let now = read.map_or("", |o| o.text.as_str());
        let was = entry.overridden.as_ref().map_or("", |o| o.text.as_str());
        if now == BLOCK_TEXT || now != was {
            entry.held.clear();
            entry.epoch += 1;
            entry.overridden = read.cloned();
        }
    }

    /// Units `key` holds and may still spend at `now_ms`.
    pub fn held(&mut self, key: &str, now_ms: u64) -> u64 {
        self.keys.get_mut(key).map_or(0, |e| e.usable(now_ms))
    }

    /// Room for one more key: forgets the keys that hold nothing usable
    /// and have not been asked for in the last minute, when full.
    fn make_room(&mut self, now_ms: u64) -> bool {
        if self.keys.len() < MAX_KEYS {
            return true;
        }
        self.keys.retain(|_, e| {
            e.asking(now_ms)
                || e.usable(now_ms) > 0
                || e.last_ms.is_some_and(|l| now_ms.saturating_sub(l) < 60_000)
        });
        self.keys.len() < MAX_KEYS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(remaining: u64) -> RuleState {
        RuleState {
            verdict: Verdict::Admitted,
            limit: 10,
            remaining,
            reset_after_ms: 1000,
            window: 1,
        }
    }

    /// `key` asked for every 100 ms from 0 to `until_ms`, under leases
    /// lasting 1 s.
    fn stream(l: &mut Leases, key: &str, until_ms: u64) {
        for at in (0..=until_ms).step_by(100) {
            l.observe(key, at, 1000);
        }
    }

    #[test]
    fn a_cold_key_asks_for_nothing_and_a_busy_one_for_its_demand() {
        let mut l = Leases::new();
        l.observe("cold", 0, 1000);
        assert_eq!(l.want("cold", 8, 1000, 0), 0);
        stream(&mut l, "k", 500);
        // One ask per 100 ms: 10 within a second, capped at 8.
        assert_eq!(l.want("k", 8, 1000, 500), 8);
        assert_eq!(l.want("k", 8, 250, 500), 2);
        l.grant("k", 2, 250, 500, (state(5), None));
        assert_eq!(l.want("k", 8, 250, 500), 0);
    }

    /// A burst ends before it would spend a lease: a key is leased to only
    /// once its run of arrivals has lasted half a lease, and a pause of a
    /// whole lease starts a new run.
    #[test]
    fn a_burst_asks_for_nothing_and_a_stream_once_it_lasted_half_a_lease() {
        let mut l = Leases::new();
        // 30 requests within 290 ms: a page load.
        for at in (0..300).step_by(10) {
            l.observe("k", at, 1000);
        }
        assert_eq!(l.want("k", 8, 1000, 290), 0);
        stream(&mut l, "s", 400);
        assert_eq!(l.want("s", 8, 1000, 400), 0, "400 ms is a burst yet");
        l.observe("s", 500, 1000);
        assert_eq!(l.want("s", 8, 1000, 500), 8);
        // Back after a pause of a whole lease: a burst again.
        l.observe("s", 1500, 1000);
        assert_eq!(l.want("s", 8, 1000, 1500), 0);
    }

    #[test]
    fn units_are_spent_only_before_their_deadline_earliest_first() {
        let mut l = Leases::new();
        l.observe("k", 0, 1000);
        l.grant("k", 2, 100, 0, (state(5), None));
        l.grant("k", 3, 50, 10, (state(4), None));
        assert!(l.can_spend("k", 5, 20));
        let s = l.spend("k", 3, 20).unwrap();
        // 2 left (of the grant lasting to 100), on the last grant's view.
        assert_eq!((s.remaining, s.reset_after_ms), (6, 990));
        assert_eq!(l.held("k", 59), 2);
        assert!(!l.can_spend("k", 1, 100));
        assert_eq!(l.held("k", 100), 0);
        assert!(l.spend("k", 1, 100).is_none());
        assert!(!l.can_spend("other", 1, 0));
    }

    #[test]
    fn one_ask_at_a_time_and_a_refresh_when_a_key_runs_low() {
        let mut l = Leases::new();
        stream(&mut l, "k", 500);
        // Demand: 8 within 800 ms.
        assert_eq!(l.begin_ask("k", 8, 800, 500), 8);
        assert_eq!(l.begin_ask("k", 8, 800, 500), 0, "one in flight");
        l.grant("k", 5, 1000, 500, (state(5), None));
        l.answered("k");
        assert_eq!(l.begin_refresh("k", 8, 800, 500), 0, "5 of 8 is not low");
        l.spend("k", 1, 501);
        assert_eq!(l.begin_refresh("k", 8, 800, 501), 8);
        assert_eq!(l.begin_refresh("k", 8, 800, 501), 0);
        l.answered("k");
        assert_eq!(l.begin_ask("k", 8, 800, 501), 4);
    }

    /// A lease's deadline counts from its sending: what the round trip
    /// takes of its length is not asked for, and a lease the round trip
    /// would take whole is not asked for at all, until calls come back
    /// sooner again.
    #[test]
    fn a_lease_is_sized_for_what_is_left_of_it_once_back() {
        let mut l = Leases::new();
        stream(&mut l, "k", 500);
        assert_eq!(l.want("k", 20, 1000, 500), 10);
        l.round_trip(300);
        assert_eq!(l.want("k", 20, 1000, 500), 7, "700 ms left");
        // Round trips of 2 s from then on: the smoothed one climbs
        // (513, 699, 862, 1005 ms) until a lease would hold nothing.
        let left: Vec<u64> = (0..4)
            .map(|_| {
                l.round_trip(2000);
                l.want("k", 20, 1000, 500)
            })
            .collect();
        assert_eq!(left, [4, 3, 1, 0]);
        // Calls of 10 ms: within a few, a lease holds something again.
        let back = (1..).find(|_| {
            l.round_trip(10);
            l.want("k", 20, 1000, 500) > 0
        });
        assert_eq!(back, Some(1));
    }

    /// An ask whose request was cancelled never ends: it lapses, so that
    /// the key leases again.
    #[test]
    fn an_ask_left_unanswered_lapses() {
        let mut l = Leases::new();
        stream(&mut l, "k", 500);
        assert_eq!(l.begin_ask("k", 8, 800, 500), 8);
        assert_eq!(l.begin_refresh("k", 8, 800, 500 + ASK_LAPSE_MS - 1), 0);
        assert_eq!(l.begin_refresh("k", 8, 800, 500 + ASK_LAPSE_MS), 8);
    }

    /// Figures other than a key's leases were granted under end them, and
    /// void what a call sent before brings back; the same figures do not.
    #[test]
    fn other_figures_end_the_leases_and_void_earlier_asks() {
        let read = |text: &str| OverrideRead {
            rule: 0,
            source: crate::decision::outcomes::verdict::OverrideSource::Rule,
            text: text.to_owned(),
            ignored: false,
        };
        let mut l = Leases::new();
        l.observe("k", 0, 1000);
        l.grant("k", 5, 1000, 0, (state(5), None));
        let sent = l.epoch("k");
        l.figures_read("k", None);
        assert_eq!((l.held("k", 1), l.epoch("k")), (5, sent));
        l.figures_read("k", Some(&read("v1 gcra 1 1000 2 1000000")));
        assert_eq!(l.held("k", 1), 0);
        assert_ne!(l.epoch("k"), sent, "a grant asked for before is void");
        l.grant(
            "k",
            5,
            1000,
            0,
            (state(5), Some(read("v1 gcra 1 1000 2 1000000"))),
        );
        l.figures_read("k", Some(&read("v1 gcra 1 1000 2 1000000")));
        assert_eq!(l.held("k", 1), 5);
        l.figures_read("k", Some(&read(BLOCK_TEXT)));
        assert_eq!(l.held("k", 1), 0);
    }

    #[test]
    fn the_table_stays_bounded() {
        let mut l = Leases::new();
        for i in 0..MAX_KEYS + 10 {
            l.observe(&i.to_string(), 0, 1000);
        }
        assert_eq!(l.keys.len(), MAX_KEYS);
        // A minute later the idle keys make room.
        l.observe("late", 60_000, 1000);
        assert_eq!(l.keys.len(), 1);
    }
}
