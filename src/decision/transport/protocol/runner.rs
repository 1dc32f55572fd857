//! The seam between the protocol and its transport: what runs a script
//! (the REST client, or a fake), and [`run`], through which every caller
//! sends a call and reads its reply.

use std::time::Duration;

use serde_json::Value;

use super::{
    call::ScriptCall,
    reply::{Reply, ScriptError},
    script::LIMITER,
};
use crate::decision::transport::redis_rest::{RestClient, RestError, Script};

/// Something that can run a script, and plain commands: the REST client,
/// or a fake.
// The worker is single-threaded, so the futures need not be `Send`.
#[allow(async_fn_in_trait)]
pub trait ScriptRunner {
    /// Runs `script` with these keys and arguments, within `budget`.
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
        budget: Duration,
    ) -> Result<Value, RestError>;

    /// Sends plain `commands` in one request, within `budget`: one result
    /// per command, in order, each its own.
    async fn commands(
        &self,
        commands: &[Vec<String>],
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError>;
}

impl ScriptRunner for RestClient {
    async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
        budget: Duration,
    ) -> Result<Value, RestError> {
        self.run_script(script, keys, args, budget).await
    }

    async fn commands(
        &self,
        commands: &[Vec<String>],
        budget: Duration,
    ) -> Result<Vec<Result<Value, RestError>>, RestError> {
        self.pipeline(commands, budget).await
    }
}

/// Sends `call` to the limiter script and reads its reply.
pub async fn run(
    runner: &impl ScriptRunner,
    call: &ScriptCall,
    budget: Duration,
) -> Result<Reply, ScriptError> {
    let reply = runner
        .eval(&LIMITER, &call.keys(), &call.args(), budget)
        .await?;
    call.decode(&reply)
}
