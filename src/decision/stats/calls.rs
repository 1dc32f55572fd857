//! REST calls counted as they are made: a store wrapped for one request
//! (or one after-response step) says how many calls it took, which tells a
//! request decided from a lease or the block cache from one Redis decided,
//! without a counter in the decision code.

use std::{cell::Cell, time::Duration};

use serde_json::Value;

use crate::decision::{
    transport::protocol::ScriptRunner,
    transport::redis_rest::{RestError, Script},
};

/// A store that counts the script calls made through it.
pub struct Counted<'s, S> {
    store: &'s S,
    calls: Cell<u64>,
}

impl<'s, S> Counted<'s, S> {
    /// `store`, no call counted yet.
    pub fn new(store: &'s S) -> Counted<'s, S> {
        Counted {
            store,
            calls: Cell::new(0),
        }
    }

    /// The calls made since the last take.
    pub fn take(&self) -> u64 {
        self.calls.replace(0)
    }
}

impl<S: ScriptRunner> ScriptRunner for Counted<'_, S> {
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
        budget: Duration,
    ) -> Result<Value, RestError> {
        // Counted when sent: a call that fails was made all the same.
        self.calls.set(self.calls.get() + 1);
        self.store.eval(script, keys, args, budget).await
    }

    /// One REST request, however many commands it carries.
    async fn commands(
        &self,
        commands: &[Vec<String>],
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError> {
        self.calls.set(self.calls.get() + 1);
        self.store.commands(commands, budget).await
    }
}
