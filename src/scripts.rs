//! The Lua script every decision runs, embedded at build time with its SHA1.

/// A script as Redis knows it: its source, and the SHA1 that `EVALSHA` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    /// The full source, shebang included.
    pub source: &'static str,
    /// Lower-case hex SHA1 of `source`, as `SCRIPT LOAD` would answer.
    pub sha1: &'static str,
}

/// `lua/common.lua`, `lua/gcra.lua`, `lua/windowed.lua` and `lua/limiter.lua` joined behind a
/// `#!lua flags=allow-key-locking` shebang (see `build.rs`).
pub const LIMITER: Script = Script {
    source: include_str!(concat!(env!("OUT_DIR"), "/limiter.lua")),
    sha1: include_str!(concat!(env!("OUT_DIR"), "/limiter.sha1")),
};
