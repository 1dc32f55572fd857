//! `edge-limiter simulate`: replays a request log through a configuration's
//! rules and reports what the deployed worker would have decided, request by
//! request, on the log's own clock.
//!
//! Each request is matched and keyed by the worker's own code
//! ([`crate::decision::limiter::select`]) and decided by an [`engine::Engine`]: the
//! real Lua script on a private redis-server with the clock pinned to the
//! request's time, or the reference model.

pub mod clock;
pub mod conform;
pub mod distances;
pub mod engine;
pub mod isolates;
pub mod log;
pub mod model;
pub mod plot;
pub mod report;
mod resp;
mod timeline;

use std::{
    collections::{BTreeMap, VecDeque},
    io::BufRead,
};

use crate::{
    decision::{
        limiter::{select, PendingRefund, RefundRule, Selection},
        outcomes::verdict::Decision,
        transport::keys::rule_key,
    },
    rules::{config::Config, rule::RuleId},
};
use engine::{Engine, EngineError, Job};
use log::{Format, LineError, LogError, LogReader, Record, REORDER_MS};
use report::{Report, Tally};

/// Requests sent to the engine at once (pipelined to Redis).
const BATCH: usize = 2048;

/// How to read the log.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The log's format; `None` guesses it from the first non-blank line.
    pub format: Option<Format>,
    /// Host for requests whose log line names none (CLF never does).
    pub host: String,
    /// Stop at the first unreadable line instead of counting it.
    pub strict: bool,
}

/// Why a simulation stopped.
#[derive(Debug)]
#[non_exhaustive]
pub enum SimError {
    /// The log cannot be read at all.
    Log(LogError),
    /// `--strict`, and a line could not be read.
    Strict(LineError),
    /// The engine failed.
    Engine(EngineError),
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::Log(e) => e.fmt(f),
            SimError::Strict(e) => write!(
                f,
                "line {}: {} (--strict stops at the first unreadable line)",
                e.line, e.reason
            ),
            SimError::Engine(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SimError {}

impl From<EngineError> for SimError {
    fn from(e: EngineError) -> SimError {
        SimError::Engine(e)
    }
}

/// A record waiting in the reordering window.
struct Reordered<'c> {
    time_ms: u64,
    picked: Picked<'c>,
}

/// A record with its rules picked as the worker picks them, and what its
/// decision will need once back: made on the reading thread, so that this
/// one only decides and counts.
struct Picked<'c> {
    record: Record,
    /// Its rules, or (`Err`) the enforced rule that refuses it with a 400.
    selection: Result<Selection<'c, String>, usize>,
    pending: Pending,
}

impl<'c> Picked<'c> {
    fn of(config: &'c Config, record: Record) -> Picked<'c> {
        let refunds = refunds_after(config, &record);
        let selection = select(config, &record.request)
            .map(Selection::into_owned)
            .map_err(|(rule, _, _)| rule.0);
        let pending = Pending::of(&record, &selection, refunds);
        Picked {
            record,
            selection,
            pending,
        }
    }
}

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed<'a> {
    /// No rule matched: forwarded.
    Unmatched,
    /// Refused with 400 by this rule (its index): a key part given twice.
    Refused(usize),
    /// Decided by the engine.
    Decided(&'a Decision),
}

/// Hears about a simulation as it goes; every method does nothing by default.
pub trait Observer {
    /// Bytes of the log read so far, now and then.
    fn progress(&mut self, _bytes: u64) {}

    /// One request's fate, in the order decided.
    fn verdict(&mut self, _record: &Record, _verdict: Replayed<'_>) {}
}

/// An observer that hears nothing.
impl Observer for () {}

/// Records read ahead by the reading thread, per message.
const READ_AHEAD: usize = 4096;

/// Replays `input` through `config`'s rules, deciding with `engine`.
///
/// A thread of its own reads and parses the log while this one decides and
/// counts: on two cores that nearly halves a model run.
pub fn simulate<R: BufRead + Send>(
    config: &Config,
    input: R,
    options: &Options,
    engine: &mut dyn Engine,
    observer: &mut dyn Observer,
) -> Result<Report, SimError> {
    let reader = LogReader::new(input, options.format, &options.host).map_err(SimError::Log)?;
    let format = reader.format().name();
    let mut tally = Tally::new(config, engine.name(), format, reader.guessed_from());
    let (send, receive) = std::sync::mpsc::sync_channel::<(Vec<_>, u64)>(4);
    std::thread::scope(|scope| {
        scope.spawn(move || read_ahead(reader, config, send));
        let mut order = Reorder::default();
        let mut pipeline = Pipeline {
            config,
            engine,
            batch: Vec::with_capacity(BATCH),
            in_flight: None,
            releases: Releases::default(),
            unsettled_release: None,
        };
        for (chunk, bytes) in receive {
            for item in chunk {
                let picked = match item {
                    Ok(picked) => picked,
                    Err(e) if options.strict => return Err(SimError::Strict(e)),
                    Err(e) => {
                        tally.unreadable(e);
                        continue;
                    }
                };
                order.push(picked, &mut tally);
                while let Some(picked) = order.pop_due() {
                    pipeline.push(picked, &mut tally, observer)?;
                }
            }
            observer.progress(bytes);
        }
        while let Some(w) = order.waiting.pop_front() {
            pipeline.push(w.picked, &mut tally, observer)?;
        }
        pipeline.finish(&mut tally, observer)
    })?;
    Ok(tally.finish())
}

/// What the reading thread sends: records with their rules picked, or
/// the lines it could not read, and the bytes read so far.
type ReadAhead<'c> = (Vec<Result<Picked<'c>, LineError>>, u64);

/// The reading thread: parses the log, picks each record's rules under
/// `config`, and sends them on in chunks.
fn read_ahead<'c, R: BufRead>(
    mut reader: LogReader<R>,
    config: &'c Config,
    send: std::sync::mpsc::SyncSender<ReadAhead<'c>>,
) {
    let mut chunk = Vec::with_capacity(READ_AHEAD);
    while let Some(item) = reader.next_record() {
        chunk.push(item.map(|record| Picked::of(config, record)));
        if chunk.len() == READ_AHEAD {
            let full = std::mem::replace(&mut chunk, Vec::with_capacity(READ_AHEAD));
            // The receiver is gone when the simulation stopped early.
            if send.send((full, reader.bytes_read())).is_err() {
                return;
            }
        }
    }
    let _ = send.send((chunk, reader.bytes_read()));
}

/// Records in time order on their way through the engine, in batches: one
/// batch in flight while the next is read and prepared, so Redis decides
/// one while this thread counts the one before.
struct Pipeline<'a> {
    config: &'a Config,
    engine: &'a mut dyn Engine,
    batch: Vec<Picked<'a>>,
    in_flight: Option<SentBatch<'a>>,
    /// In-flight slots taken, to give back when their responses end.
    releases: Releases,
    /// The earliest a request sent or batched, its decision not yet
    /// counted, may give its slots back (epoch ms).
    unsettled_release: Option<u64>,
}

impl<'a> Pipeline<'a> {
    /// Adds the next record; a full batch goes to the engine.
    fn push(
        &mut self,
        picked: Picked<'a>,
        tally: &mut Tally,
        observer: &mut dyn Observer,
    ) -> Result<(), SimError> {
        // Slots and charges whose responses ended by now are back for this
        // request: the batches before it are counted first, so that every
        // one due is known.
        let now = picked.record.time_ms;
        let due = self
            .unsettled_release
            .into_iter()
            .chain(self.releases.first_ms());
        if due.min().is_some_and(|at| at <= now) {
            self.settle(tally, observer)?;
            self.releases.give_back(self.config, self.engine, now)?;
        }
        if let Some(at) = picked.pending.back_at {
            self.unsettled_release = Some(self.unsettled_release.map_or(at, |u| u.min(at)));
        }
        self.batch.push(picked);
        if self.batch.len() == BATCH {
            let full = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
            self.flush(full, tally, observer)?;
        }
        Ok(())
    }

    /// Sends `records` as a batch, and counts the batch sent before it.
    fn flush(
        &mut self,
        records: Vec<Picked<'a>>,
        tally: &mut Tally,
        observer: &mut dyn Observer,
    ) -> Result<(), SimError> {
        let sent = send_batch(records, self.engine)?;
        let before = self.in_flight.replace(sent);
        self.finish_batch(before, tally, observer)
    }

    /// Counts `batch`, once its decisions are back.
    fn finish_batch(
        &mut self,
        batch: Option<SentBatch<'a>>,
        tally: &mut Tally,
        observer: &mut dyn Observer,
    ) -> Result<(), SimError> {
        let Some(batch) = batch else {
            return Ok(());
        };
        let Pipeline {
            config,
            engine,
            releases,
            ..
        } = self;
        finish_batch(config, batch, *engine, (tally, observer), releases)
    }

    /// Counts the batch in flight, if any.
    fn finish_in_flight(
        &mut self,
        tally: &mut Tally,
        observer: &mut dyn Observer,
    ) -> Result<(), SimError> {
        let batch = self.in_flight.take();
        self.finish_batch(batch, tally, observer)
    }

    /// Sends what is left and counts every batch still in flight.
    fn settle(&mut self, tally: &mut Tally, observer: &mut dyn Observer) -> Result<(), SimError> {
        let last = std::mem::take(&mut self.batch);
        if !last.is_empty() {
            self.flush(last, tally, observer)?;
        }
        self.finish_in_flight(tally, observer)?;
        self.unsettled_release = None;
        Ok(())
    }

    /// Counts what is left; slots still held at the log's end stay so.
    fn finish(mut self, tally: &mut Tally, observer: &mut dyn Observer) -> Result<(), SimError> {
        self.settle(tally, observer)
    }
}

/// In-flight slots taken, and charges of `count_status` rules that do not
/// count the origin's answer, each request's to give back when its
/// response ended: as the worker, once the origin has answered.
#[derive(Default)]
struct Releases {
    /// By when (epoch ms) and the order they were taken in, each with the
    /// status that uncounts its charges, if one does.
    due: BTreeMap<(u64, u64), (PendingRefund, Option<u16>)>,
    taken: u64,
}

impl Releases {
    fn push(&mut self, at_ms: u64, pending: PendingRefund, uncounted: Option<u16>) {
        self.taken += 1;
        self.due.insert((at_ms, self.taken), (pending, uncounted));
    }

    /// When the first is due.
    fn first_ms(&self) -> Option<u64> {
        self.due.first_key_value().map(|((at, _), _)| *at)
    }

    /// Gives back, in order and each at its time, the slots and charges
    /// due by `now_ms`.
    fn give_back(
        &mut self,
        config: &Config,
        engine: &mut dyn Engine,
        now_ms: u64,
    ) -> Result<(), SimError> {
        while let Some(entry) = self.due.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            let ((at_ms, _), (pending, uncounted)) = entry.remove_entry();
            let mut back = uncounted.map_or_else(Vec::new, |s| pending.uncounted(config, s));
            back.extend(pending.releasing(config));
            if !back.is_empty() {
                engine.refund(&back, at_ms)?;
            }
        }
        Ok(())
    }
}

/// Puts records in time order within [`REORDER_MS`]; equal times keep
/// log order.
#[derive(Default)]
struct Reorder<'c> {
    /// In time order. Most logs are nearly sorted, so a record mostly goes
    /// at the back, or close to it: cheaper than a heap of whole records.
    waiting: VecDeque<Reordered<'c>>,
    /// The latest time read.
    newest: u64,
    /// The time up to which records were released.
    released: u64,
}

impl<'c> Reorder<'c> {
    fn push(&mut self, mut picked: Picked<'c>, tally: &mut Tally) {
        let record = &mut picked.record;
        if record.time_ms < self.released {
            tally.late();
            record.time_ms = self.released;
        }
        let time_ms = record.time_ms;
        self.newest = self.newest.max(time_ms);
        let waiting = Reordered { time_ms, picked };
        if self.waiting.back().is_none_or(|w| w.time_ms <= time_ms) {
            self.waiting.push_back(waiting);
        } else {
            let at = self.waiting.partition_point(|w| w.time_ms <= time_ms);
            self.waiting.insert(at, waiting);
        }
    }

    /// The earliest record, once nothing earlier can still come.
    fn pop_due(&mut self) -> Option<Picked<'c>> {
        let first = self.waiting.front()?;
        if first.time_ms + REORDER_MS > self.newest {
            return None;
        }
        let w = self.waiting.pop_front()?;
        self.released = w.time_ms;
        Some(w.picked)
    }
}

/// Whether `record` may have a charge given back after its response: a
/// rule counting only some statuses, not the one the origin answered,
/// matches it. A record without a status keeps every charge.
fn refunds_after(config: &Config, record: &Record) -> bool {
    record.status.is_some_and(|status| {
        config.rules.iter().any(|r| {
            !r.count_status.is_empty()
                && !r.count_status.contains(&status)
                && r.matches(&record.request)
        })
    })
}

/// The rules of a call, in call order, each with the client's identifier
/// parts and its state key, and the cost.
type CallRules = Vec<(RuleId, (Vec<String>, String), u64)>;

/// What a request of a batch in flight needs once its decision is back.
struct Pending {
    /// The enforced rule (its index) that refused it with a 400.
    refused: Option<usize>,
    /// Shadow rules (indices) that could not identify its client.
    shadow_refused: Vec<usize>,
    /// The rules in its call (indices), with the client's identifier under each.
    rules: Vec<(usize, String)>,
    /// For a request with charges that may come back after its response:
    /// every rule of its call (call order) with the client's identifier
    /// parts and the cost, to give them back by the decision's refund marks.
    call: Option<CallRules>,
    /// The status its origin answered, when one of its `count_status`
    /// rules does not count it.
    uncounted: Option<u16>,
    /// For a request under an in-flight limit, or with charges its status
    /// gives back: when its response ended (epoch ms), its arrival plus the
    /// log's duration, or its arrival where the log gives none.
    back_at: Option<u64>,
}

impl Pending {
    /// What `record`'s decision will need, its rules picked as `selection`
    /// says; the rules and parts of its call to give charges back by, when
    /// `refunds`.
    fn of(
        record: &Record,
        selection: &Result<Selection<'_, String>, usize>,
        refunds: bool,
    ) -> Pending {
        let s = match selection {
            Err(rule) => {
                return Pending {
                    refused: Some(*rule),
                    shadow_refused: vec![],
                    rules: vec![],
                    call: None,
                    uncounted: None,
                    back_at: None,
                }
            }
            Ok(s) => s,
        };
        let uncounted = record.status.filter(|_| refunds);
        let releases = (s.rules.iter()).any(|(_, rule, _)| rule.policy.algorithm().released());
        let call = (uncounted.is_some() || releases).then(|| {
            let methods = record.request.methods();
            let rules = s.rules.iter().map(|(rule_id, rule, id)| {
                let parts: Vec<&str> = id.iter().map(String::as_str).collect();
                let client = (id.clone(), rule_key(rule, &parts));
                (*rule_id, client, rule.cost.for_methods(methods))
            });
            rules.collect()
        });
        let ended = record
            .time_ms
            .saturating_add(record.duration_ms.unwrap_or(0));
        Pending {
            refused: None,
            shadow_refused: s.shadow_ambiguous.iter().map(|(id, _, _)| id.0).collect(),
            rules: (s.rules.iter())
                .map(|(rule, _, id)| (rule.0, id.join(" | ")))
                .collect(),
            call,
            back_at: (uncounted.is_some() || releases).then_some(ended),
            uncounted,
        }
    }
}

/// A batch sent to the engine, its decisions still to come.
struct SentBatch<'c> {
    picked: Vec<Picked<'c>>,
}

/// Sends the decisions `picked` asks for to the engine, without waiting
/// for them.
fn send_batch<'c>(
    picked: Vec<Picked<'c>>,
    engine: &mut dyn Engine,
) -> Result<SentBatch<'c>, SimError> {
    let jobs: Vec<Job<'_>> = (picked.iter())
        .filter_map(|p| match &p.selection {
            Ok(s) if !s.rules.is_empty() => Some(Job {
                checks: s.checks(p.record.request.methods()),
                now_ms: p.record.time_ms,
            }),
            _ => None,
        })
        .collect();
    engine.send(&jobs)?;
    drop(jobs);
    Ok(SentBatch { picked })
}

/// Receives a batch's decisions from the engine and counts its requests.
fn finish_batch(
    config: &Config,
    batch: SentBatch<'_>,
    engine: &mut dyn Engine,
    (tally, observer): (&mut Tally, &mut dyn Observer),
    releases: &mut Releases,
) -> Result<(), SimError> {
    let mut decisions = engine.receive()?.into_iter();
    for Picked {
        record,
        pending: fate,
        ..
    } in &batch.picked
    {
        if let Some(rule) = fate.refused {
            tally.refused(record.time_ms, rule);
            observer.verdict(record, Replayed::Refused(rule));
            continue;
        }
        for rule in &fate.shadow_refused {
            tally.shadow_refused(*rule);
        }
        if fate.rules.is_empty() {
            tally.unmatched(record.time_ms);
            observer.verdict(record, Replayed::Unmatched);
            continue;
        }
        let Some(decision) = decisions.next() else {
            return Err(SimError::Engine(EngineError::Reply(
                "the engine returned fewer decisions than requests".into(),
            )));
        };
        tally.decided(record.time_ms, &fate.rules, &decision);
        observer.verdict(record, Replayed::Decided(&decision));
        for (rule, _) in &fate.rules {
            let rule_of = &config.rules[*rule];
            if record.duration_ms.is_none() && rule_of.policy.algorithm().released() {
                tally.without_duration(*rule);
            }
            if decision.admitted() && rule_of.cost_header.is_some() {
                tally.at_estimate(*rule);
            }
        }
        let Some(rules) = fate.call.as_ref().filter(|_| decision.admitted()) else {
            continue;
        };
        let pending = PendingRefund {
            signature: String::new(),
            rules: decision
                .refund_marks
                .iter()
                .filter_map(|&(i, mark)| {
                    let (rule, client, cost) = rules.get(i)?.clone();
                    Some(RefundRule::of(&decision, (i, mark), rule, client, cost))
                })
                .collect(),
        };
        if let Some(at_ms) = fate.back_at {
            releases.push(at_ms, pending, fate.uncounted);
        }
    }
    Ok(())
}
