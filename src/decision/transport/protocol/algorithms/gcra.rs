//! GCRA in a call (`lua/gcra.lua`): its interval and burst, and the one
//! integer its one-rule path replies with.

use super::{push_numbers, ScriptFigures};
use crate::{
    decision::{outcomes::verdict::RuleState, transport::protocol::script::Entry},
    rules::policy::Gcra,
};

impl ScriptFigures for Gcra {
    /// `gcra`, cost, interval (us), burst, max delay (ms).
    fn push_general(&self, cost: u64, _offset_ms: u64, args: &mut Vec<String>) {
        args.push(Entry::GCRA.to_owned());
        push_numbers(
            args,
            &[cost, self.interval_us(), self.burst(), self.max_delay_ms()],
        );
    }

    fn one_rule_entry(&self) -> Option<Entry> {
        Some(Entry::OneGcra)
    }

    /// How far the TAT lay ahead (us), or -1 minus that when denied.
    fn one_rule_state(&self, cost: u64, reply: i64) -> Result<RuleState, String> {
        let admitted = reply >= 0;
        // The bitwise complement of -1 - ahead, which cannot overflow.
        let ahead = if admitted { reply } else { !reply };
        let state = RuleState::gcra(self, cost, ahead as u64);
        if state.admitted() != admitted {
            return Err(format!("{reply} contradicts its own verdict"));
        }
        Ok(state)
    }
}
