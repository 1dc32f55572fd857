//! The operator's commands, native only: `check` (validate), `inspect` and
//! `reset`, `limit` (limits), `simulate`, and `stats` (with `live`, its
//! page, and `metrics`, what Prometheus scrapes).

pub mod inspect;
pub mod limits;
pub mod live;
pub mod metrics;
pub mod simulate;
pub mod stats;
pub mod validate;
