//! What the limiter did, for the operator to see: each isolate counts, per
//! rule and minute, what its requests came to (from what the limiter
//! returned for them, never from inside the decision), and the clients
//! most denied.

pub mod calls;
pub mod counts;
pub mod recorder;
pub mod stored;
pub mod timer;
pub mod top;
pub mod write;
