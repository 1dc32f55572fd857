//! `[vars.LIMITER]` as written: the serde forms, before any check (see
//! [`super::config`] for the checks).

use serde::Deserialize;
use serde_json::Value;

use super::rule::{FailMode, Mode};

/// The two algorithms a rule can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Algorithm {
    /// `rate`, `period`, `burst`.
    Gcra,
    /// `windows`.
    Windowed,
}

/// `[vars.LIMITER]` as written, before any check.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) rules: Vec<Value>,
    #[serde(default)]
    pub(super) x_ratelimit_headers: Option<bool>,
    // A Value, read by hand below: serde's code for one more duration
    // field costs the worker's wasm a kilobyte.
    #[serde(default)]
    pub(super) cache_hold: Option<Value>,
}

/// A duration as written: whole milliseconds, or text with a unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a duration: whole milliseconds, or text such as \"250ms\", \"1s\", \"5m\", \"1h\" or \"1d\""
)]
pub(super) enum RawDuration {
    Ms(u64),
    Text(String),
}

/// A cost as written: units for every method, or per method with a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a whole number of units (0 or more), or a table of them per method such as { GET = 1, POST = 5, default = 1 }"
)]
pub(super) enum RawCost {
    Units(u64),
    PerMethod(std::collections::BTreeMap<String, u64>),
}

/// One `[[vars.LIMITER.rules]]` entry as written, before any check.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) name: String,
    #[serde(default)]
    pub(super) host: Option<String>,
    #[serde(default)]
    pub(super) path_prefix: Option<String>,
    #[serde(default)]
    pub(super) path: Option<String>,
    #[serde(default)]
    pub(super) methods: Vec<String>,
    #[serde(default)]
    pub(super) with_headers: Vec<String>,
    #[serde(default)]
    pub(super) without_headers: Vec<String>,
    pub(super) key: Vec<String>,
    pub(super) algorithm: Algorithm,
    #[serde(default)]
    pub(super) rate: Option<u64>,
    #[serde(default)]
    pub(super) period: Option<RawDuration>,
    #[serde(default)]
    pub(super) burst: Option<u64>,
    #[serde(default)]
    pub(super) windows: Option<Vec<(RawDuration, u64, RawDuration)>>,
    #[serde(default)]
    pub(super) cost: Option<RawCost>,
    #[serde(default)]
    pub(super) mode: Option<Mode>,
    #[serde(default)]
    pub(super) fail: Option<FailMode>,
    #[serde(default)]
    pub(super) budget: Option<RawDuration>,
    #[serde(default)]
    pub(super) deny_body: Option<String>,
    #[serde(default)]
    pub(super) deny_content_type: Option<String>,
    #[serde(default)]
    pub(super) count_status: Option<Vec<u16>>,
    #[serde(default)]
    pub(super) penalty: Option<RawDuration>,
    #[serde(default)]
    pub(super) lease: Option<u64>,
    #[serde(default)]
    pub(super) lease_for: Option<RawDuration>,
    #[serde(default)]
    pub(super) except_ips: Vec<String>,
    #[serde(default)]
    pub(super) fold: Vec<String>,
}
