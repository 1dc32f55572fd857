//! How each algorithm's figures travel to the script and come back: one
//! module per algorithm (`gcra`, `windowed`, `concurrency`), each answering
//! [`ScriptFigures`] beside its Lua file, and [`of`] the one place in the
//! protocol that lists them. `call` and `reply` ask through it and never
//! which algorithm a rule uses.

mod concurrency;
mod gcra;
mod windowed;

use super::script::Entry;
use crate::{decision::outcomes::verdict::RuleState, rules::policy::Policy};

/// One algorithm's side of the script's contract.
pub trait ScriptFigures {
    /// A rule's arguments in every call that carries rules
    /// (`lua/limiter.lua`): its word, the `cost`, then its figures;
    /// `offset_ms` shifts the key's bucket edges, for algorithms that
    /// count in buckets.
    fn push_general(&self, cost: u64, offset_ms: u64, args: &mut Vec<String>);

    /// The entry that decides a rule of it alone on Redis's clock, where
    /// it has one: its operation is the rule's word, and its arguments the
    /// rule's.
    fn one_rule_entry(&self) -> Option<Entry>;

    /// What that entry's one-integer reply says of a request of `cost`;
    /// `Err` says why it is no reply of this algorithm's.
    fn one_rule_state(&self, cost: u64, reply: i64) -> Result<RuleState, String>;
}

/// The script's side of `policy`'s algorithm.
pub fn of(policy: &Policy) -> &dyn ScriptFigures {
    match policy {
        Policy::Gcra(g) => g,
        Policy::Windowed(ws) => ws,
        Policy::Concurrency(c) => c,
    }
}

/// Numbers as the script reads them: decimal text.
fn push_numbers(args: &mut Vec<String>, numbers: &[u64]) {
    args.extend(numbers.iter().map(u64::to_string));
}
