//! The operator's commands, native only: `check` (validate), `inspect` and
//! `reset`, `limit` (limits), `simulate`, and `stats` (with `live`, its page).

pub mod inspect;
pub mod limits;
pub mod live;
pub mod simulate;
pub mod stats;
pub mod validate;
