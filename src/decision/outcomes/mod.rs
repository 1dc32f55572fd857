//! What comes out of a decision, the words the rest speak: the verdict
//! and the figures the headers need ([`verdict`]), and the decision log's
//! events ([`events`]).

pub mod events;
pub mod verdict;
