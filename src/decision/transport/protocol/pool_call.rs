//! The calls on a region's pools of shared rules (`lua/pool.lua`): spend
//! from them, and write a top-up the home granted.

use std::time::Duration;

use serde_json::Value;

use super::{reply::ScriptError, runner::ScriptRunner, script::Entry, script::LIMITER};
pub use crate::decision::outcomes::verdict::PoolState;

/// One shared rule's pool in a spend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpend {
    /// The pool's key ([`pool_key`](crate::decision::transport::keys::pool_key)).
    pub key: String,
    /// Units the request costs under the rule.
    pub cost: u64,
    /// How long a pool lasts at most, ms.
    pub hold_ms: u64,
    /// The most units one top-up asks for.
    pub most: u64,
    /// The region's own share of the client's limit, units at once (0:
    /// none), and the time one takes to come back, us.
    pub share: (u64, u64),
    /// How long a call to the home takes the isolate, there and back, ms
    /// (0: not known yet): a top-up is asked that long and more before the
    /// pool runs out.
    pub far_ms: u64,
    /// The units this isolate asks to hold itself, spent without a call
    /// (0: none), and for how long at most, ms.
    pub lease: (u64, u64),
}

/// A top-up the home granted, for the region's pool at `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credit {
    /// The pool's key.
    pub key: String,
    /// The spend's [`PoolState::asked_us`] that asked for it.
    pub asked_us: u64,
    /// Units granted.
    pub units: u64,
    /// How long they may be spent, ms, from `asked_us`.
    pub ms: u64,
    /// How long the pool lasts at most, ms.
    pub hold_ms: u64,
    /// The units the home had left once it granted these, and ms until
    /// it is full again: what the region's headers tell until the next.
    pub home: (u64, u64),
}

impl PoolSpend {
    /// Its numbers in a call, as `lua/pool.lua` reads them.
    pub(super) fn numbers(&self) -> [u64; 8] {
        let (units, interval_us) = self.share;
        [
            self.cost,
            self.hold_ms,
            self.most,
            units,
            interval_us,
            self.far_ms,
            self.lease.0,
            self.lease.1,
        ]
    }
}

/// The clock argument: pinned ms, or empty for Redis's.
fn clock(now_ms: Option<u64>) -> String {
    now_ms.map_or_else(String::new, |ms| ms.to_string())
}

/// Spends the request from every pool of `pools`, all or nothing, on the
/// pinned clock `now_ms` or the region Redis's.
pub async fn spend(
    runner: &impl ScriptRunner,
    pools: &[PoolSpend],
    now_ms: Option<u64>,
    budget: Duration,
) -> Result<Vec<PoolState>, ScriptError> {
    let each = pools.iter().map(|p| (&p.key, p.numbers()));
    let reply = on_pools(runner, Entry::POOL, each, now_ms, budget).await?;
    decode_spend(&reply, pools.len())
}

/// Runs operation `entry` of `lua/pool.lua` on pools, each a key and its
/// numbers.
async fn on_pools<'a, const N: usize>(
    runner: &impl ScriptRunner,
    entry: &str,
    each: impl Iterator<Item = (&'a String, [u64; N])>,
    now_ms: Option<u64>,
    budget: Duration,
) -> Result<Value, ScriptError> {
    let (mut keys, mut args) = (vec![], vec![entry.to_owned(), clock(now_ms)]);
    for (key, numbers) in each {
        keys.push(key.clone());
        args.extend(numbers.map(|n| n.to_string()));
    }
    Ok(runner.eval(&LIMITER, &keys, &args, budget).await?)
}

/// Integers a spend's reply holds per pool.
pub(super) const SPENT: usize = 10;

/// Reads a spend's reply: [`SPENT`] integers per pool.
pub(super) fn decode_spend(reply: &Value, pools: usize) -> Result<Vec<PoolState>, ScriptError> {
    let numbers = integers(reply, SPENT * pools)?;
    let states: Vec<PoolState> = numbers
        .chunks(SPENT)
        .map(|n| PoolState {
            covered: n[0] == 1,
            left: n[1],
            lasts_ms: n[2],
            ask: n[3],
            asked_us: n[4],
            leased: (n[5], n[6]),
            home: ((n[8] == 1).then_some(n[9]), n[7]),
        })
        .collect();
    let agreed = states.windows(2).all(|w| w[0].covered == w[1].covered);
    if !agreed || numbers.chunks(SPENT).any(|n| n[0] > 1 || n[8] > 1) {
        return Err(ScriptError::Reply(format!("{reply} is no pool's spend")));
    }
    Ok(states)
}

/// Writes `credits` into the region's pools; per credit, whether it went
/// in (not when its top-up was asked again since, or has lapsed).
pub async fn credit(
    runner: &impl ScriptRunner,
    credits: &[Credit],
    now_ms: Option<u64>,
    budget: Duration,
) -> Result<Vec<bool>, ScriptError> {
    let each = (credits.iter()).map(|c| {
        let (left, full_ms) = c.home;
        (
            &c.key,
            [c.asked_us, c.units, c.ms, c.hold_ms, left, full_ms],
        )
    });
    let reply = on_pools(runner, Entry::CREDIT, each, now_ms, budget).await?;
    let numbers = integers(&reply, credits.len())?;
    if numbers.iter().any(|n| *n > 1) {
        return Err(ScriptError::Reply(format!("{reply} is no credit's reply")));
    }
    Ok(numbers.into_iter().map(|n| n == 1).collect())
}

/// `reply` as `n` integers of 0 or more.
fn integers(reply: &Value, n: usize) -> Result<Vec<u64>, ScriptError> {
    reply
        .as_array()
        .filter(|items| items.len() == n)
        .and_then(|items| {
            items
                .iter()
                .map(Value::as_u64)
                .collect::<Option<Vec<u64>>>()
        })
        .ok_or_else(|| ScriptError::Reply(format!("{reply} is not {n} counts")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_spend_replies_ten_counts_a_pool_and_one_verdict_for_all() {
        let reply = json!([1, 4, 900, 0, 0, 0, 0, 0, 0, 0, 1, 2, 300, 6, 17, 3, 250, 9000, 1, 70]);
        let states = decode_spend(&reply, 2).unwrap();
        assert!(states.iter().all(|s| s.covered));
        assert_eq!((states[1].ask, states[1].asked_us), (6, 17));
        assert_eq!((states[0].leased, states[1].leased), ((0, 0), (3, 250)));
        assert_eq!(
            (states[0].home, states[1].home),
            ((None, 0), (Some(70), 9000))
        );
        for bad in [
            json!([1, 4, 900, 0, 0, 0, 0, 0, 0, 0, 0, 2, 300, 6, 17, 0, 0, 0, 0, 0]),
            json!([2, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            json!([1, 0, 0, 0, 0, 0, 0, 0, 2, 0]),
            json!([1, 2]),
        ] {
            assert!(
                decode_spend(&bad, bad.as_array().unwrap().len() / SPENT).is_err(),
                "{bad}"
            );
        }
        assert!(decode_spend(&json!([1, -1, 0, 0, 0, 0, 0, 0, 0, 0]), 1).is_err());
    }
}
