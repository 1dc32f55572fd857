//! A time limit around any future, on wasm32 (a JS timer, since reqwest has
//! no timeout there) and natively (tokio) alike.

use std::{future::Future, pin::pin, time::Duration};

use futures_util::future::{select, Either};

#[cfg(target_arch = "wasm32")]
mod js {
    use wasm_bindgen::prelude::*;

    // Bound here rather than through web-sys: node returns an object from
    // setTimeout where workerd returns a number, and both must work.
    #[wasm_bindgen]
    extern "C" {
        #[wasm_bindgen(js_name = setTimeout)]
        pub fn set_timeout(callback: &js_sys::Function, ms: f64) -> JsValue;
        #[wasm_bindgen(js_name = clearTimeout)]
        pub fn clear_timeout(id: &JsValue);
    }

    /// Clears the timer when the sleep is abandoned, so a request that
    /// finished early leaves no timer behind.
    pub struct Timer(pub JsValue);

    impl Drop for Timer {
        fn drop(&mut self) {
            clear_timeout(&self.0);
        }
    }
}

#[cfg(target_arch = "wasm32")]
async fn sleep(d: Duration) {
    let mut timer = None;
    let promise = js_sys::Promise::new(&mut |resolve, _reject| {
        timer = Some(js::Timer(js::set_timeout(&resolve, d.as_millis() as f64)));
    });
    let _timer = timer;
    // The promise only ever resolves.
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
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
