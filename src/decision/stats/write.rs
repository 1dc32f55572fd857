//! An isolate's write: its unwritten minutes added to what Redis keeps, in
//! one call of the stats script after a response; a failure keeps them for
//! the next write.

use std::cell::RefCell;

use serde_json::Value;

use super::{
    recorder::{Minute, Recorder},
    stored::{write_call, STATS},
};
use crate::{
    decision::{
        events::{Action, Event},
        protocol::ScriptRunner,
        redis_rest::COMMAND_BUDGET,
    },
    rules::config::Config,
};

/// Writes `minutes`, which [`Recorder::due`] took from `recorder`, in one
/// call through `store`. A failure puts them back and is logged.
pub async fn flush(
    store: &impl ScriptRunner,
    config: &Config,
    recorder: &RefCell<Recorder>,
    minutes: Vec<Minute>,
) -> Vec<Event> {
    let keep_ms = recorder.borrow().settings().keep_ms;
    let (keys, args) = write_call(config, keep_ms, &minutes);
    let error = match store.eval(&STATS, &keys, &args, COMMAND_BUDGET).await {
        Ok(Value::Number(_)) => {
            recorder.borrow_mut().written(None);
            return vec![];
        }
        Ok(_) => "the stats script answered something other than a count".to_owned(),
        Err(e) => e.to_string(),
    };
    let mut recorder = recorder.borrow_mut();
    recorder.written(Some(minutes));
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
    use std::{cell::Cell, time::Duration};

    use serde_json::json;

    use super::*;
    use crate::{
        decision::{
            redis_rest::{RestError, Script},
            stats::counts::TotalCount,
        },
        rules::stats::StatsSettings,
    };

    /// A store that fails its first call and answers the others.
    struct FailsOnce(Cell<u32>, RefCell<Vec<Vec<String>>>);

    impl ScriptRunner for FailsOnce {
        async fn eval(
            &self,
            script: &Script,
            _: &[String],
            args: &[String],
            _: Duration,
        ) -> Result<Value, RestError> {
            assert_eq!(script.sha1, STATS.sha1);
            self.1.borrow_mut().push(args.to_vec());
            self.0.set(self.0.get() + 1);
            match self.0.get() {
                1 => Err(RestError::Transport("refused".into())),
                _ => Ok(json!(3)),
            }
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
    fn a_failed_write_is_logged_and_its_minutes_go_with_the_next() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s"}
        ]}))
        .unwrap();
        let recorder = RefCell::new(Recorder::new(&c, StatsSettings::default()));
        let store = FailsOnce(Cell::new(0), RefCell::new(vec![]));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut first = Minute::new(0, 1);
        first.totals[TotalCount::Requests] = 4;
        let events = rt.block_on(flush(&store, &c, &recorder, vec![first]));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].action, Action::StatsWriteFailed);
        assert_eq!(events[0].key.as_deref(), Some("el:{#stats}:0"));
        assert!(events[0].error.as_deref().unwrap().contains("refused"));
        // Kept, and written with the next.
        let again = recorder.borrow_mut().due(u64::MAX).expect("kept");
        assert!(rt.block_on(flush(&store, &c, &recorder, again)).is_empty());
        let sent = store.1.borrow();
        assert_eq!(sent[1][2..5], ["1", "0", "4 0 0 0 0 0 0 0"]);
        assert!(recorder.borrow_mut().due(u64::MAX).is_none(), "written");
    }
}
