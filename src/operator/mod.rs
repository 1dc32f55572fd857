//! The operator's commands, native only: `check` (validate), `inspect` and
//! `reset`, and `simulate`.

pub mod inspect;
pub mod simulate;
pub mod validate;
