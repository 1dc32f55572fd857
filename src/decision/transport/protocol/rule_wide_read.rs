//! The rule-wide overrides' read: plain commands in one pipeline, outside
//! the script, each key answered on its own.

use std::time::Duration;

use serde_json::Value;

use super::runner::ScriptRunner;
use crate::{decision::transport::redis_rest::RestError, rules::overrides::MAX_TEXT_BYTES};

/// What one rule-wide override key held when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WideRead {
    /// Its text (empty: no key) and ms to live (negative: no end). Only
    /// its first [`MAX_TEXT_BYTES`] + 1 bytes are read: longer is no
    /// override.
    Text(String, i64),
    /// A value of another type, a stray write: no override.
    NotText,
    /// Its commands failed: it is read again later.
    Failed(RestError),
}

/// Reads the rule-wide override keys `keys`, each with its own commands
/// (`GETRANGE` of its first [`MAX_TEXT_BYTES`] + 1 bytes, `PTTL`) in one
/// request: the keys lie in several hash slots, which one script call
/// cannot span on a cluster, and a key of another type fails only its own
/// read. Fails whole only when the request does.
pub async fn read_rule_wide(
    runner: &impl ScriptRunner,
    keys: &[String],
    budget: Duration,
) -> Result<Vec<WideRead>, RestError> {
    let last = MAX_TEXT_BYTES.to_string();
    let mut commands = Vec::with_capacity(2 * keys.len());
    for key in keys {
        let range = ["GETRANGE", key, "0", &last];
        commands.push(range.map(str::to_owned).to_vec());
        commands.push(vec!["PTTL".to_owned(), key.clone()]);
    }
    let replies = runner.commands(&commands, budget).await?;
    if replies.len() != commands.len() {
        return Err(RestError::Malformed(format!(
            "{} results for {} commands reading the rule-wide overrides",
            replies.len(),
            commands.len()
        )));
    }
    Ok(replies.chunks(2).map(wide_read).collect())
}

/// A key's `GETRANGE` and `PTTL` results, as what it held.
fn wide_read(pair: &[Result<Value, RestError>]) -> WideRead {
    match pair {
        [Err(RestError::Redis(e)), _] if e.starts_with("WRONGTYPE") => WideRead::NotText,
        [Ok(Value::String(text)), Ok(pttl)] => match pttl.as_i64() {
            // No key: none, even when it expired between the two commands.
            Some(-2) => WideRead::Text(String::new(), -1),
            Some(ms) => WideRead::Text(text.clone(), ms),
            None => WideRead::Failed(RestError::Malformed(format!("PTTL answered {pttl}"))),
        },
        [Err(e), _] | [_, Err(e)] => WideRead::Failed(e.clone()),
        _ => WideRead::Failed(RestError::Malformed(
            "GETRANGE answered other than text".to_owned(),
        )),
    }
}
