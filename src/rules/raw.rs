//! `[vars.LIMITER]` as written, before any check (see [`super::config`]
//! for the checks), and how each field is read from its JSON form.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{
    rule::{FailMode, Mode},
    stats::StatsClients,
};

/// The algorithm a rule names in `algorithm`, before its figures are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AlgorithmName {
    /// `rate`, `period`, `burst`.
    Gcra,
    /// `windows`.
    Windowed,
}

/// `[vars.LIMITER]` as written, before any check.
pub(super) struct RawConfig {
    pub(super) rules: Vec<Value>,
    pub(super) x_ratelimit_headers: Option<bool>,
    pub(super) cache_hold: Option<Value>,
    pub(super) stats: Option<bool>,
    pub(super) stats_every: Option<RawDuration>,
    pub(super) stats_keep: Option<RawDuration>,
    pub(super) stats_clients: Option<StatsClients>,
}

impl RawConfig {
    /// Reads the table's own fields (each rule is read by [`RawRule::read`]);
    /// the error names the field.
    pub(super) fn read(table: &Map<String, Value>) -> Result<RawConfig, RawError> {
        const FIELDS: [&str; 7] = [
            "rules",
            "x_ratelimit_headers",
            "cache_hold",
            "stats",
            "stats_every",
            "stats_keep",
            "stats_clients",
        ];
        if let Some(unknown) = table.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            let known: Vec<String> = FIELDS.iter().map(|f| format!("`{f}`")).collect();
            return Err((
                "LIMITER".to_owned(),
                format!(
                    "unknown field `{unknown}`, expected one of {}",
                    known.join(", ")
                ),
            ));
        }
        let rules = match table.get("rules") {
            Some(Value::Array(rules)) => rules.clone(),
            Some(other) => return Err(("rules".to_owned(), expected("a list of rules", other))),
            None => return Err(("LIMITER".to_owned(), "missing field `rules`".to_owned())),
        };
        let x_ratelimit_headers = one(table, "x_ratelimit_headers")?;
        Ok(RawConfig {
            rules,
            x_ratelimit_headers,
            cache_hold: table.get("cache_hold").filter(|v| !v.is_null()).cloned(),
            stats: one(table, "stats")?,
            stats_every: one(table, "stats_every")?,
            stats_keep: one(table, "stats_keep")?,
            stats_clients: one(table, "stats_clients")?,
        })
    }
}

/// A duration as written: whole milliseconds, or text with a unit.
#[derive(Debug, Clone)]
pub(super) enum RawDuration {
    Ms(u64),
    Text(String),
}

/// A cost as written: units for every method, or per method with a default.
#[derive(Debug, Clone)]
pub(super) enum RawCost {
    Units(u64),
    PerMethod(BTreeMap<String, u64>),
}

/// One `[[vars.LIMITER.rules]]` entry as written, before any check.
#[derive(Debug, Clone)]
pub(super) struct RawRule {
    pub(super) name: String,
    pub(super) host: Option<String>,
    pub(super) path_prefix: Option<String>,
    pub(super) path: Option<String>,
    pub(super) methods: Vec<String>,
    pub(super) with_headers: Vec<String>,
    pub(super) without_headers: Vec<String>,
    pub(super) key: Vec<String>,
    pub(super) algorithm: AlgorithmName,
    pub(super) rate: Option<u64>,
    pub(super) period: Option<RawDuration>,
    pub(super) burst: Option<u64>,
    pub(super) windows: Option<Vec<(RawDuration, u64, RawDuration)>>,
    pub(super) cost: Option<RawCost>,
    pub(super) mode: Option<Mode>,
    pub(super) fail: Option<FailMode>,
    pub(super) budget: Option<RawDuration>,
    pub(super) deny_body: Option<String>,
    pub(super) deny_content_type: Option<String>,
    pub(super) count_status: Option<Vec<u16>>,
    pub(super) penalty: Option<RawDuration>,
    pub(super) lease: Option<u64>,
    pub(super) lease_for: Option<RawDuration>,
    pub(super) overrides: Option<bool>,
    pub(super) except_ips: Vec<String>,
    pub(super) fold: Vec<String>,
}

/// Every field a rule may have, in the order docs/rules.md lists them.
const FIELDS: &[&str] = &[
    "name",
    "key",
    "fold",
    "algorithm",
    "rate",
    "period",
    "burst",
    "windows",
    "host",
    "path_prefix",
    "path",
    "methods",
    "with_headers",
    "without_headers",
    "cost",
    "mode",
    "fail",
    "budget",
    "deny_body",
    "deny_content_type",
    "count_status",
    "penalty",
    "lease",
    "lease_for",
    "overrides",
    "except_ips",
];

/// A field that does not read: its name as the configuration spells it
/// (`count_status[0]` for an element), and what is wrong.
pub(super) type RawError = (String, String);

/// A field's value read from its JSON form; the error says what was
/// expected. Written by hand rather than derived: derived readers that name
/// the failing field cost the worker's wasm about 30 KB.
pub(super) trait FromJson: Sized {
    /// The value, or what was expected instead.
    fn from_json(v: &Value) -> Result<Self, String>;
}

fn expected(what: &str, got: &Value) -> String {
    let shown: String = got.to_string().chars().take(60).collect();
    format!("`{shown}` is not {what}")
}

impl FromJson for String {
    fn from_json(v: &Value) -> Result<String, String> {
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| expected("text", v))
    }
}

impl FromJson for bool {
    fn from_json(v: &Value) -> Result<bool, String> {
        v.as_bool().ok_or_else(|| expected("true or false", v))
    }
}

impl FromJson for u64 {
    fn from_json(v: &Value) -> Result<u64, String> {
        v.as_u64()
            .ok_or_else(|| expected("a whole number (0 or more)", v))
    }
}

impl FromJson for u16 {
    fn from_json(v: &Value) -> Result<u16, String> {
        v.as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| expected("a whole number from 0 to 65535", v))
    }
}

/// One of `names`' values, by its lower-case name.
fn named<T: Copy>(v: &Value, names: &[(&str, T)]) -> Result<T, String> {
    let found = v
        .as_str()
        .and_then(|text| names.iter().find(|(n, _)| *n == text));
    found.map(|(_, t)| *t).ok_or_else(|| {
        let all: Vec<String> = names.iter().map(|(n, _)| format!("\"{n}\"")).collect();
        expected(&format!("one of {}", all.join(", ")), v)
    })
}

impl FromJson for AlgorithmName {
    fn from_json(v: &Value) -> Result<AlgorithmName, String> {
        named(
            v,
            &[
                ("gcra", AlgorithmName::Gcra),
                ("windowed", AlgorithmName::Windowed),
            ],
        )
    }
}

impl FromJson for Mode {
    fn from_json(v: &Value) -> Result<Mode, String> {
        named(v, &[("enforce", Mode::Enforce), ("shadow", Mode::Shadow)])
    }
}

impl FromJson for FailMode {
    fn from_json(v: &Value) -> Result<FailMode, String> {
        named(v, &[("open", FailMode::Open), ("closed", FailMode::Closed)])
    }
}

impl FromJson for StatsClients {
    fn from_json(v: &Value) -> Result<StatsClients, String> {
        named(
            v,
            &[("key", StatsClients::Key), ("hash", StatsClients::Hash)],
        )
    }
}

impl FromJson for RawDuration {
    fn from_json(v: &Value) -> Result<RawDuration, String> {
        match v {
            Value::String(text) => Ok(RawDuration::Text(text.clone())),
            other => other.as_u64().map(RawDuration::Ms).ok_or_else(|| {
                expected("a duration: whole milliseconds, or text such as \"250ms\", \"1s\", \"5m\", \"1h\" or \"1d\"", v)
            }),
        }
    }
}

impl FromJson for RawCost {
    fn from_json(v: &Value) -> Result<RawCost, String> {
        let per_method = || {
            v.as_object()?
                .iter()
                .map(|(method, units)| Some((method.clone(), units.as_u64()?)))
                .collect::<Option<BTreeMap<String, u64>>>()
        };
        v.as_u64()
            .map(RawCost::Units)
            .or_else(|| per_method().map(RawCost::PerMethod))
            .ok_or_else(|| expected("a whole number of units (0 or more), or a table of them per method such as { GET = 1, POST = 5, default = 1 }", v))
    }
}

/// A window as written: `[duration, limit, precision]`.
impl FromJson for (RawDuration, u64, RawDuration) {
    fn from_json(v: &Value) -> Result<Self, String> {
        match v.as_array().map(Vec::as_slice) {
            Some([d, l, p]) => Ok((
                RawDuration::from_json(d)?,
                u64::from_json(l)?,
                RawDuration::from_json(p)?,
            )),
            _ => Err(expected("a window: [duration, limit, precision]", v)),
        }
    }
}

/// One field; `null` counts as absent.
fn one<T: FromJson>(rule: &Map<String, Value>, name: &str) -> Result<Option<T>, RawError> {
    match rule.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::from_json(v).map(Some).map_err(|e| (name.to_owned(), e)),
    }
}

/// A list field read element by element, so that an error names the
/// element (`methods[2]`).
fn list<T: FromJson>(rule: &Map<String, Value>, name: &str) -> Result<Option<Vec<T>>, RawError> {
    let items = match rule.get(name) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(other) => return Err((name.to_owned(), expected("a list", other))),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| T::from_json(v).map_err(|e| (format!("{name}[{i}]"), e)))
        .collect::<Result<Vec<T>, _>>()
        .map(Some)
}

impl RawRule {
    /// Reads a rule from its JSON form, field by field (see [`FromJson`]).
    pub(super) fn read(value: &Value) -> Result<RawRule, RawError> {
        let whole = |problem: String| ("(rule)".to_owned(), problem);
        let Value::Object(rule) = value else {
            return Err(whole(expected("a table", value)));
        };
        if let Some(unknown) = rule.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            let known: Vec<String> = FIELDS.iter().map(|f| format!("`{f}`")).collect();
            return Err(whole(format!(
                "unknown field `{unknown}`, expected one of {}",
                known.join(", ")
            )));
        }
        let required = |name: &str| whole(format!("missing field `{name}`"));
        Ok(RawRule {
            name: one(rule, "name")?.ok_or_else(|| required("name"))?,
            key: list(rule, "key")?.ok_or_else(|| required("key"))?,
            algorithm: one(rule, "algorithm")?.ok_or_else(|| required("algorithm"))?,
            host: one(rule, "host")?,
            path_prefix: one(rule, "path_prefix")?,
            path: one(rule, "path")?,
            methods: list(rule, "methods")?.unwrap_or_default(),
            with_headers: list(rule, "with_headers")?.unwrap_or_default(),
            without_headers: list(rule, "without_headers")?.unwrap_or_default(),
            rate: one(rule, "rate")?,
            period: one(rule, "period")?,
            burst: one(rule, "burst")?,
            windows: list(rule, "windows")?,
            cost: one(rule, "cost")?,
            mode: one(rule, "mode")?,
            fail: one(rule, "fail")?,
            budget: one(rule, "budget")?,
            deny_body: one(rule, "deny_body")?,
            deny_content_type: one(rule, "deny_content_type")?,
            count_status: list(rule, "count_status")?,
            penalty: one(rule, "penalty")?,
            lease: one(rule, "lease")?,
            lease_for: one(rule, "lease_for")?,
            overrides: one(rule, "overrides")?,
            except_ips: list(rule, "except_ips")?.unwrap_or_default(),
            fold: list(rule, "fold")?.unwrap_or_default(),
        })
    }
}
