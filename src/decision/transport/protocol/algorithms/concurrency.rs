//! The in-flight limit in a call (`lua/concurrency.lua`): its limit and
//! hold. It has no one-rule path: the general decision decides it, and
//! replies with the release mark its response's end gives back.

use super::{push_numbers, ScriptFigures};
use crate::{decision::outcomes::verdict::RuleState, rules::policy::Concurrency};

/// Its word in the script (`algorithms` in `lua/limiter.lua`).
const WORD: &str = "concurrency";

impl ScriptFigures for Concurrency {
    /// `concurrency`, cost, limit, hold (ms).
    fn push_general(&self, cost: u64, _offset_ms: u64, args: &mut Vec<String>) {
        args.push(WORD.to_owned());
        push_numbers(args, &[cost, self.limit(), self.hold_ms()]);
    }

    fn one_rule_entry(&self) -> Option<crate::decision::transport::protocol::script::Entry> {
        None
    }

    fn one_rule_state(&self, _cost: u64, reply: i64) -> Result<RuleState, String> {
        Err(format!("{reply}: an in-flight limit has no one-rule path"))
    }
}
