//! The operator's commands, native only: `check` (validate), `inspect` and
//! `reset`, `limit` (limits), and `simulate`.

pub mod inspect;
pub mod limits;
pub mod simulate;
pub mod validate;
