//! The edge: the worker's wasm32 entry point and every response it makes
//! itself (429, 400, 503, their bodies, the rate-limit headers).

#[cfg(target_arch = "wasm32")]
pub mod entry;
#[cfg(target_arch = "wasm32")]
pub mod microtasks;
pub mod responses;
