//! The limiter script's protocol, owned here alone, one job a file:
//! `script` embeds the script with its SHA1 and names its entry points,
//! `algorithms` holds each algorithm's side of the contract (a module per
//! algorithm), `call` encodes every call it answers as its `KEYS` and
//! `ARGV`, `reply` reads the reply back into a
//! [`Decision`](crate::decision::outcomes::verdict::Decision), and
//! `runner` holds [`run`], through which every caller sends a call;
//! `pool_call` makes the calls on a region's pools of shared rules;
//! `rule_wide_read` reads the rule-wide overrides with plain commands.
//! Each imports only those before it in that order. `lua/limiter.lua`
//! documents the same contract from the script's side.

mod algorithms;
mod call;
mod pool_call;
mod reply;
mod rule_wide_read;
mod runner;
mod script;

pub use call::{
    CallMode, Check, General, Group, LeaseAsk, OneRule, OverrideAsk, Penalty, Refund, RefundCharge,
    RuleArgs, ScriptCall,
};
pub use pool_call::{credit, spend, Credit, PoolSpend, PoolState};
pub use reply::{decode_general, Reply, ScriptError};
pub use rule_wide_read::{read_rule_wide, WideRead};
pub use runner::{run, ScriptRunner};
pub use script::{Entry, LIMITER};
