//! How a decision reaches Redis and comes back: where a client's state
//! lives ([`keys`]), the script's protocol ([`protocol`]), the REST client
//! that carries it ([`redis_rest`]), and the batching of an isolate's
//! calls into one request ([`batch`]).

pub mod batch;
pub mod keys;
pub mod protocol;
pub mod redis_rest;
