//! How stats are kept in Redis, owned here alone: the keys, the stats
//! script with its SHA1, the call that adds an isolate's minutes, and the
//! reading of what is kept back into minutes. `lua/stats.lua` documents the
//! same from the script's side.

use super::{
    counts::{add, RuleCounts, TotalCounts, RULE_COUNTS, TOTAL_COUNTS},
    recorder::{StatsWrite, MINUTE_MS, REPLAY_FOR_MS, WRITE_LOST_MS},
    top::{Counted, Denials, TopDenied, KEPT},
};
use crate::{decision::transport::redis_rest::Script, rules::config::Config};

/// The stats script, behind the same `#!lua flags=allow-key-locking`
/// shebang as the limiter's.
pub const STATS: Script = Script {
    source: include_str!(concat!(env!("OUT_DIR"), "/stats.lua")),
    sha1: include_str!(concat!(env!("OUT_DIR"), "/stats.sha1")),
};

/// Milliseconds in a day.
pub const DAY_MS: u64 = 86_400_000;

/// Minutes in a day.
pub const DAY_MINUTES: u64 = DAY_MS / MINUTE_MS;

/// The key of a day's figures (days since the Unix epoch, UTC): over every
/// request, or for one rule. Every stats key is under the hash tag
/// `{#stats}`, which no client's identifier can be (a hashed one is `#` and
/// 40 hex digits), so one call reaches them all on Redis Cluster.
pub fn day_key(day: u64, rule: Option<&str>) -> String {
    match rule {
        Some(rule) => format!("el:{{#stats}}:{day}:{rule}"),
        None => format!("el:{{#stats}}:{day}"),
    }
}

/// The key holding the number of the last write of isolate `writer` that
/// the stats script added, so that it adds a replay of it no more.
pub fn writer_key(writer: u64) -> String {
    format!("el:{{#stats}}:w:{writer}")
}

/// The key of the counters: every figure the isolates ever wrote, per rule
/// (a field named after it) and over every request ([`ALL_REQUESTS`]), and
/// when the last write landed ([`WRITTEN`]); they live `stats_keep` after
/// the last write.
pub const COUNTERS_KEY: &str = "el:{#stats}:counters";

/// The counters' field of the figures over every request: no rule's name.
pub const ALL_REQUESTS: &str = "*";

/// The counters' field of when the last write landed, ms on Redis's clock:
/// no rule's name.
pub const WRITTEN: &str = ".written";

/// How long a writer's key lives after its last write: an isolate sends a
/// write whose reply was lost again at its next write, seconds to minutes
/// later, and gives it up [`REPLAY_FOR_MS`] after its first sending, half
/// this, so that a replay never finds the key gone and is added again.
pub const WRITER_KEEP_MS: u64 = 2 * REPLAY_FOR_MS;

// The last replay, sent just before REPLAY_FOR_MS and lost in flight for
// up to WRITE_LOST_MS, still reaches a key that remembers the write.
const _: () = assert!(WRITER_KEEP_MS >= REPLAY_FOR_MS + WRITE_LOST_MS);

/// A minute's field in its day's key: its figures for none, else the
/// summary of a rule's denials stored under `letter` ([`Denials::each`]).
pub fn field(minute: u64, letter: Option<char>) -> String {
    let of_day = minute % DAY_MINUTES;
    match letter {
        None => of_day.to_string(),
        Some(letter) => format!("{of_day}{letter}"),
    }
}

/// Every field a minute of a rule can have in its day's key.
pub fn rule_fields(minute: u64) -> impl Iterator<Item = String> {
    let summaries = Denials::default().each().map(|(letter, _)| Some(letter));
    std::iter::once(None)
        .chain(summaries)
        .map(move |letter| field(minute, letter))
}

/// Figures as stored: decimal integers separated by spaces, without the
/// zeros that end them (read back as zeros), so that figures few rules use
/// cost the others nothing.
pub fn figures_text(figures: &[u64]) -> String {
    let used = figures
        .iter()
        .rposition(|n| *n != 0)
        .map_or(1, |last| last + 1);
    let words: Vec<String> = figures[..used.min(figures.len())]
        .iter()
        .map(u64::to_string)
        .collect();
    words.join(" ")
}

/// Figures read back; missing ones (a record written before a figure was
/// added) are 0, unreadable text reads as none.
pub fn read_figures<const N: usize>(text: &str) -> [u64; N] {
    let mut out = [0; N];
    for (slot, word) in out.iter_mut().zip(text.split(' ')) {
        *slot = word.parse().unwrap_or(0);
    }
    out
}

/// A summary as stored: `+` and its floor, then `name count over` for
/// the [`KEPT`] most counted, most first, all separated by spaces. (Before
/// errors were kept, `name count` pairs: read as exact.)
pub fn top_text(top: &TopDenied) -> String {
    let (listed, floor) = top.kept(KEPT);
    let mut words = vec![format!("+{floor}")];
    for e in listed {
        words.push(format!("{} {} {}", e.name, e.count, e.over));
    }
    words.join(" ")
}

/// A summary read back; words it cannot read are skipped.
pub fn read_top(text: &str) -> TopDenied {
    let mut words = text.split(' ').peekable();
    let floor = words.next_if(|w| w.starts_with('+'));
    let width = if floor.is_some() { 3 } else { 2 };
    let floor = floor.and_then(|w| w[1..].parse().ok()).unwrap_or(0);
    let words: Vec<&str> = words.collect();
    let entries = words.chunks_exact(width).filter_map(|e| {
        Some(Counted {
            name: e[0].to_owned(),
            count: e[1].parse().ok()?,
            over: e.get(2).map_or(Some(0), |w| w.parse().ok())?,
        })
    });
    TopDenied::from_parts(entries.collect(), floor)
}

/// One key's share of a write: the key, when it expires, its fields and
/// values.
type KeyWrite = (String, u64, Vec<(String, String)>);

/// The stats script's `KEYS` and `ARGV` adding `write`'s minutes (of
/// `config`'s rules) to what is kept, unless it was added before, each
/// day's keys expiring `keep_ms` after the day ends.
pub fn write_call(config: &Config, keep_ms: u64, write: &StatsWrite) -> (Vec<String>, Vec<String>) {
    let mut writes: Vec<KeyWrite> = Vec::new();
    let mut put = |key: String, day: u64, field: String, value: String| {
        let at = match writes.iter().position(|(k, _, _)| *k == key) {
            Some(at) => at,
            None => {
                let expires = (day + 1) * DAY_MS + keep_ms;
                writes.push((key, expires, Vec::new()));
                writes.len() - 1
            }
        };
        writes[at].2.push((field, value));
    };
    // What the write adds to the counters: its minutes' figures summed.
    let mut totals = TotalCounts::default();
    let mut rules = vec![RuleCounts::default(); config.rules.len()];
    for m in &write.minutes {
        add(&mut totals.0, &m.totals.0);
        for (sum, counts) in rules.iter_mut().zip(&m.rules) {
            add(&mut sum.0, &counts.0);
        }
        let day = m.minute / DAY_MINUTES;
        let figures = field(m.minute, None);
        if m.totals != TotalCounts::default() {
            put(
                day_key(day, None),
                day,
                figures.clone(),
                figures_text(&m.totals.0),
            );
        }
        for ((rule, counts), denied) in config.rules.iter().zip(&m.rules).zip(&m.denied) {
            if *counts != RuleCounts::default() {
                let key = day_key(day, Some(&rule.name));
                put(key, day, figures.clone(), figures_text(&counts.0));
            }
            for (letter, top) in denied.each() {
                if !top.is_empty() {
                    let key = day_key(day, Some(&rule.name));
                    put(key, day, field(m.minute, Some(letter)), top_text(top));
                }
            }
        }
    }
    let mut counters = vec![];
    if totals != TotalCounts::default() {
        counters.push((ALL_REQUESTS, figures_text(&totals.0)));
    }
    for (rule, sum) in config.rules.iter().zip(&rules) {
        if *sum != RuleCounts::default() {
            counters.push((&rule.name, figures_text(&sum.0)));
        }
    }
    let mut keys = Vec::with_capacity(writes.len() + 2);
    keys.push(writer_key(write.writer));
    keys.push(COUNTERS_KEY.to_owned());
    let mut args = vec![
        KEPT.to_string(),
        write.seq.to_string(),
        WRITER_KEEP_MS.to_string(),
        keep_ms.to_string(),
        counters.len().to_string(),
    ];
    for (field, figures) in counters {
        args.push(field.to_owned());
        args.push(figures);
    }
    for (key, expires, fields) in writes {
        keys.push(key);
        args.push(expires.to_string());
        args.push(fields.len().to_string());
        for (field, value) in fields {
            args.push(field);
            args.push(value);
        }
    }
    (keys, args)
}

/// What a day's key of one rule holds, read back: per minute (since the
/// epoch) its figures and denials, in no particular order.
pub fn read_rule_day(day: u64, pairs: &[(String, String)]) -> Vec<(u64, RuleCounts, Denials)> {
    let mut out: Vec<(u64, RuleCounts, Denials)> = Vec::new();
    for (field, value) in pairs {
        let letter = field.chars().last().filter(char::is_ascii_alphabetic);
        let of_day = &field[..field.len() - letter.map_or(0, char::len_utf8)];
        let Some(minute) = of_day.parse::<u64>().ok().filter(|m| *m < DAY_MINUTES) else {
            continue;
        };
        let minute = day * DAY_MINUTES + minute;
        let at = match out.iter().position(|(m, _, _)| *m == minute) {
            Some(at) => at,
            None => {
                out.push((minute, RuleCounts::default(), Denials::default()));
                out.len() - 1
            }
        };
        match letter {
            None => out[at].1 = RuleCounts(read_figures::<RULE_COUNTS>(value)),
            Some(letter) => {
                if let Some(top) = out[at].2.of(letter) {
                    *top = read_top(value);
                }
            }
        }
    }
    out
}

/// What a day's key over every request holds, read back: per minute (since
/// the epoch) its figures.
pub fn read_totals_day(day: u64, pairs: &[(String, String)]) -> Vec<(u64, TotalCounts)> {
    pairs
        .iter()
        .filter_map(|(field, value)| {
            let minute = field.parse::<u64>().ok().filter(|m| *m < DAY_MINUTES)?;
            let figures = TotalCounts(read_figures::<TOTAL_COUNTS>(value));
            Some((day * DAY_MINUTES + minute, figures))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::stats::{
        counts::{RuleCount, TotalCount},
        recorder::Minute,
    };
    use serde_json::json;

    fn config() -> Config {
        Config::from_json(&json!({"rules": [
            {"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s"},
            {"name": "b", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s"}
        ]}))
        .unwrap()
    }

    #[test]
    fn a_write_names_each_days_keys_once_and_skips_what_is_empty() {
        let c = config();
        // The last minute of day 3 and the first of day 4.
        let mut late = Minute::new(4 * DAY_MINUTES - 1, 2);
        late.totals[TotalCount::Requests] = 2;
        late.rules[0][RuleCount::Matched] = 2;
        late.rules[0][RuleCount::Denied] = 1;
        late.denied[0].clients.add("192.0.2.1", 1);
        late.denied[0].countries.add("NL", 1);
        let mut early = Minute::new(4 * DAY_MINUTES, 2);
        early.totals[TotalCount::Requests] = 1;
        early.rules[1][RuleCount::Matched] = 1;
        let keep = 3_600_000;
        let write = StatsWrite {
            writer: 12,
            seq: 5,
            minutes: vec![late, early],
        };
        let (keys, args) = write_call(&c, keep, &write);
        assert_eq!(
            keys,
            [
                "el:{#stats}:w:12",
                COUNTERS_KEY,
                "el:{#stats}:3",
                "el:{#stats}:3:a",
                "el:{#stats}:4",
                "el:{#stats}:4:b"
            ]
        );
        let day_end = |d: u64| ((d + 1) * DAY_MS + keep).to_string();
        let want: Vec<String> = [
            "10",
            "5",
            "86400000",
            "3600000",
            // The counters: the two minutes summed, over every request
            // and per rule.
            "3",
            "*",
            "3",
            "a",
            "2 0 1",
            "b",
            "1",
            &day_end(3),
            "1",
            "1439",
            "2",
            &day_end(3),
            "3",
            "1439",
            "2 0 1",
            "1439c",
            "+0 192.0.2.1 1 0",
            "1439g",
            "+0 NL 1 0",
            &day_end(4),
            "1",
            "0",
            "1",
            &day_end(4),
            "1",
            "0",
            "1",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(args, want);
        // Every key shares the one hash tag.
        assert!(keys.iter().all(|k| k.starts_with("el:{#stats}:")));
    }

    #[test]
    fn what_is_written_reads_back() {
        let pairs: Vec<(String, String)> = [
            ("5", "3 1 2"),
            // As an older release wrote them: exact.
            ("5c", "k1 2 k2 1"),
            ("5a", "+3 64496 9 2"),
            ("7", "1 1 0 0 0 0 0 0 0 0 0 9"),
            ("x", "1"),
            ("1440", "1"),
        ]
        .iter()
        .map(|(f, v)| (f.to_string(), v.to_string()))
        .collect();
        let mut read = read_rule_day(2, &pairs);
        read.sort_by_key(|(m, _, _)| *m);
        assert_eq!(read.len(), 2, "unreadable fields are skipped");
        assert_eq!(read[0].0, 2 * DAY_MINUTES + 5);
        assert_eq!(read[0].1 .0[..4], [3, 1, 2, 0], "missing figures are 0");
        let shown = |t: &TopDenied| -> Vec<(String, u64, u64)> {
            let top = t.top(KEPT).into_iter();
            top.map(|e| (e.name.clone(), e.count, e.over)).collect()
        };
        let clients = shown(&read[0].2.clients);
        assert_eq!(clients, [("k1".into(), 2, 0), ("k2".into(), 1, 0)]);
        assert_eq!(shown(&read[0].2.networks), [("64496".into(), 9, 2)]);
        assert_eq!(read[0].2.networks.floor(), 3);
        assert_eq!(read[1].1[RuleCount::Calls], 0, "extra figures are ignored");
        let totals = read_totals_day(0, &[("0".into(), "4 4".into())]);
        assert_eq!(totals[0].1[TotalCount::Admitted], 4);
    }
}
