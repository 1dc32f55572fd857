//! Where the futures executor queues its wake-ups. js-sys's executor runs
//! woken Rust futures from a microtask it queues with the global
//! `queueMicrotask` when there is one, otherwise with `then` on a resolved
//! promise, and it looks only once, when it is first used. workerd's
//! `queueMicrotask` wraps each callback in a function of its own that only
//! a garbage collection's weak-handle pass frees: under load they outlived
//! V8's young generation, so every scavenge copied and promoted them (a
//! survival rate of 10 to 25 % against 5 % without, scavenges of 12 to
//! 29 ms against 6 to 12). A `then` makes only plain promise objects.
//!
//! So the global is hidden while the module loads, before the executor's
//! first use (the first request's handler runs as a task of it), and put
//! back once that request runs, for any other code in the isolate. A wasm
//! instance made anew after a panic finds it back and uses it: slower to
//! collect, as before, not wrong.

use wasm_bindgen::prelude::wasm_bindgen;

#[wasm_bindgen(inline_js = "
const queueMicrotask = globalThis.queueMicrotask;
globalThis.queueMicrotask = undefined;
export function putBack() {
  globalThis.queueMicrotask = queueMicrotask;
}
")]
extern "C" {
    /// Puts the global `queueMicrotask` back, once the executor has chosen
    /// promises; for the first request's handler to call.
    #[wasm_bindgen(js_name = putBack)]
    pub fn put_back();
}
