//! Windows in a call (`lua/windowed.lua`): the key's offset and each
//! window's figures, and the one integer a lone window admitted at a cost
//! replies with.

use super::{push_numbers, ScriptFigures};
use crate::{
    decision::{
        outcomes::verdict::{RuleState, Verdict},
        transport::protocol::script::Entry,
    },
    rules::policy::Windows,
};

impl ScriptFigures for Windows {
    /// `window`, cost, offset (ms), n, then n x (duration, limit,
    /// precision) in ms.
    fn push_general(&self, cost: u64, offset_ms: u64, args: &mut Vec<String>) {
        args.push(Entry::WINDOW.to_owned());
        push_numbers(args, &[cost, offset_ms, self.len() as u64]);
        for w in self.iter() {
            push_numbers(args, &[w.duration_ms(), w.limit(), w.precision_ms()]);
        }
    }

    fn one_rule_entry(&self) -> Option<Entry> {
        Some(Entry::OneWindowed)
    }

    /// Remaining x precision + how far into its bucket now lies, for one
    /// window admitted at a cost; any other rule of windows replies in
    /// full.
    fn one_rule_state(&self, cost: u64, reply: i64) -> Result<RuleState, String> {
        let w = match self[..] {
            [w] if cost > 0 => w,
            _ => return Err(format!("is one integer for several windows: {reply}")),
        };
        let (remaining, into_bucket) = u64::try_from(reply)
            .ok()
            .filter(|_| w.precision_ms() > 0)
            .map(|p| (p / w.precision_ms(), p % w.precision_ms()))
            .filter(|(remaining, _)| *remaining <= w.limit())
            .ok_or_else(|| format!("{reply} is no state of a {}-unit window", w.limit()))?;
        Ok(RuleState {
            verdict: Verdict::Admitted,
            limit: w.limit(),
            remaining,
            reset_after_ms: w.duration_ms().saturating_sub(into_bucket),
            window: 1,
        })
    }
}
