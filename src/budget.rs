//! A time limit around any future, on wasm32 (a JS timer, since reqwest has
//! no timeout there) and natively (tokio) alike.

use std::{future::Future, pin::pin, time::Duration};

use futures_util::future::{select, Either};

#[cfg(target_arch = "wasm32")]
async fn sleep(d: Duration) {
    worker::Delay::from(d).await;
}

#[cfg(not(target_arch = "wasm32"))]
async fn sleep(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Runs `fut` for at most `budget`; `None` when the time ran out first (the
/// future is then dropped, which abandons any request it had in flight).
pub async fn within<F: Future>(budget: Duration, fut: F) -> Option<F::Output> {
    match select(pin!(fut), pin!(sleep(budget))).await {
        Either::Left((out, _)) => Some(out),
        Either::Right(((), _)) => None,
    }
}
