//! The rule domain: the configuration, the request as rules read it, the
//! canonical forms that make every spelling of a client one bucket, and
//! which rules a request falls under. Pure: no I/O, no clock.

pub mod body;
pub mod canon;
pub mod cidr;
pub mod client_form;
pub mod config;
pub mod fields;
pub mod json;
pub mod lease;
pub mod overrides;
pub mod pattern;
pub mod policy;
mod raw;
pub mod regions;
pub mod request;
pub mod rule;
pub mod shared;
pub mod stats;
