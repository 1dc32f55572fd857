//! The operator's commands, native only: `check` (validate), `inspect` and
//! `reset`, `limit` (limits), `simulate`, and `stats`.

pub mod inspect;
pub mod limits;
pub mod simulate;
pub mod stats;
pub mod validate;
