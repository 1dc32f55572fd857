//! An isolate's write: its unwritten minutes added to what Redis keeps, in
//! one call of the stats script after a response. A failure keeps the
//! write, to send again as it was: the script adds a write once, so one
//! that Redis took before its reply was lost does not count twice.

use std::{cell::RefCell, rc::Rc};

use serde_json::Value;

use super::{
    recorder::{Recorder, StatsWrite},
    stored::{write_call, STATS},
};
use crate::{
    decision::{
        outcomes::events::{Action, Event},
        transport::protocol::ScriptRunner,
        transport::redis_rest::COMMAND_BUDGET,
    },
    rules::config::Config,
};

/// Sends `write`, which [`Recorder::due`] gave, in one call through
/// `store`. A failure is logged, and the recorder sends it again.
pub async fn flush(
    store: &impl ScriptRunner,
    config: &Config,
    recorder: &RefCell<Recorder>,
    write: Rc<StatsWrite>,
) -> Vec<Event> {
    let keep_ms = recorder.borrow().settings().keep_ms;
    let (keys, args) = write_call(config, keep_ms, &write);
    let error = match store.eval(&STATS, &keys, &args, COMMAND_BUDGET).await {
        Ok(Value::Number(_)) => {
            recorder.borrow_mut().written(true);
            return vec![];
        }
        Ok(_) => "the stats script answered something other than a count".to_owned(),
        Err(e) => e.to_string(),
    };
    let mut recorder = recorder.borrow_mut();
    recorder.written(false);
    let error = match recorder.lost() {
        0 => error,
        n => format!("{error} ({n} minutes dropped unwritten so far, the oldest first)"),
    };
    vec![Event {
        key: keys.into_iter().next(),
        error: Some(error),
        ..Event::new(Action::StatsWriteFailed, "")
    }]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::{
        decision::{
            stats::{counts::TotalCount, recorder::Minute},
            transport::redis_rest::{RestError, Script},
        },
        rules::stats::StatsSettings,
    };

    /// A store that refuses every call, keeping the arguments it was sent.
    struct Refuses(RefCell<Vec<Vec<String>>>);

    impl ScriptRunner for Refuses {
        async fn eval(
            &self,
            script: &Script,
            _: &[String],
            args: &[String],
            _: Duration,
        ) -> Result<Value, RestError> {
            assert_eq!(script.sha1, STATS.sha1);
            self.0.borrow_mut().push(args.to_vec());
            Err(RestError::Transport("refused".into()))
        }

        async fn commands(
            &self,
            _: &[Vec<String>],
            _: Duration,
        ) -> Result<Vec<Result<Value, RestError>>, RestError> {
            unreachable!("a stats write is one script call")
        }
    }

    #[test]
    fn a_failed_write_is_logged_and_sent_again_as_it_was() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s"}
        ]}))
        .unwrap();
        let recorder = RefCell::new(Recorder::new(&c, StatsSettings::default(), 9));
        let store = Refuses(RefCell::new(vec![]));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut first = Minute::new(0, 1);
        first.totals[TotalCount::Requests] = 4;
        let write = StatsWrite {
            writer: 9,
            seq: 1,
            minutes: vec![first],
        };
        let events = rt.block_on(flush(&store, &c, &recorder, Rc::new(write)));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].action, Action::StatsWriteFailed);
        assert_eq!(events[0].key.as_deref(), Some("el:{#stats}:w:9"));
        assert!(events[0].error.as_deref().unwrap().contains("refused"));
        // Its number, how long the isolate's key and the counters live,
        // the counters, then the day's key: one field, minute 0's.
        let sent = store.0.borrow();
        assert_eq!(sent[0][1..4], ["1", "86400000", "604800000"]);
        assert_eq!(sent[0][4..7], ["1", "*", "4"]);
        assert_eq!(sent[0][8..11], ["1", "0", "4"]);
    }
}
