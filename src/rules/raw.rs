//! `[vars.LIMITER]` as written, before the checks that span fields (see
//! [`super::config`]): the table's and each rule's own fields, read from
//! their JSON forms ([`super::fields`]), and the figures as each algorithm
//! reads them ([`Policy::read`]).

use serde_json::{Map, Value};

use super::{
    fields::{expected, invalid, list, named, one, FieldError, FromJson, RawDuration},
    policy::Policy,
    rule::{FailMode, Mode},
    stats::StatsClients,
};

/// `[vars.LIMITER]` as written, before any check.
pub(super) struct RawConfig {
    pub(super) rules: Vec<Value>,
    pub(super) x_ratelimit_headers: Option<bool>,
    pub(super) cache_hold: Option<Value>,
    pub(super) stats: Option<bool>,
    pub(super) stats_every: Option<RawDuration>,
    pub(super) stats_keep: Option<RawDuration>,
    pub(super) stats_clients: Option<StatsClients>,
    pub(super) regions: Option<Value>,
}

impl RawConfig {
    /// Reads the table's own fields (each rule is read by [`RawRule::read`]);
    /// the error names the field.
    pub(super) fn read(table: &Map<String, Value>) -> Result<RawConfig, FieldError> {
        const FIELDS: [&str; 8] = [
            "rules",
            "regions",
            "x_ratelimit_headers",
            "cache_hold",
            "stats",
            "stats_every",
            "stats_keep",
            "stats_clients",
        ];
        if let Some(unknown) = table.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            let known: Vec<String> = FIELDS.iter().map(|f| format!("`{f}`")).collect();
            return Err(invalid(
                "LIMITER",
                format!(
                    "unknown field `{unknown}`, expected one of {}",
                    known.join(", ")
                ),
            ));
        }
        let rules = match table.get("rules") {
            Some(Value::Array(rules)) => rules.clone(),
            Some(other) => return Err(invalid("rules", expected("a list of rules", other))),
            None => return Err(invalid("LIMITER", "missing field `rules`")),
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
            regions: table.get("regions").cloned(),
        })
    }
}

/// A cost as written: units for every method, or per method with a default.
#[derive(Debug, Clone)]
pub(super) enum RawCost {
    Units(u64),
    /// In the order of their names, as the JSON object keeps them.
    PerMethod(Vec<(String, u64)>),
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
    /// Read and checked by its algorithm's module as the rule is read.
    pub(super) policy: Policy,
    pub(super) cost: Option<RawCost>,
    pub(super) mode: Option<Mode>,
    pub(super) fail: Option<FailMode>,
    pub(super) budget: Option<RawDuration>,
    pub(super) deny_body: Option<String>,
    pub(super) deny_content_type: Option<String>,
    pub(super) count_status: Option<Vec<u16>>,
    pub(super) penalty: Option<RawDuration>,
    pub(super) cost_header: Option<String>,
    pub(super) lease: Option<u64>,
    pub(super) lease_for: Option<RawDuration>,
    pub(super) overrides: Option<bool>,
    pub(super) except_ips: Vec<String>,
    pub(super) fold: Vec<String>,
    pub(super) regions: Option<String>,
    pub(super) region_share: Option<u64>,
}

/// The fields every rule may have, in the order docs/rules.md lists them:
/// these, each algorithm's (see [`Policy::read`]), then [`FIELDS_AFTER`].
const FIELDS_BEFORE: &[&str] = &["name", "key", "fold", "algorithm"];

/// The fields every rule may have after its figures.
const FIELDS_AFTER: &[&str] = &[
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
    "cost_header",
    "lease",
    "lease_for",
    "overrides",
    "except_ips",
    "regions",
    "region_share",
];

impl FromJson for Mode {
    fn from_json(v: &Value) -> Result<Mode, String> {
        named(v, &["enforce", "shadow"]).map(|i| [Mode::Enforce, Mode::Shadow][i])
    }
}

impl FromJson for FailMode {
    fn from_json(v: &Value) -> Result<FailMode, String> {
        named(v, &["open", "closed"]).map(|i| [FailMode::Open, FailMode::Closed][i])
    }
}

impl FromJson for StatsClients {
    fn from_json(v: &Value) -> Result<StatsClients, String> {
        let forms = [StatsClients::Key, StatsClients::Hash, StatsClients::Hmac];
        named(v, &["key", "hash", "hmac"]).map(|i| forms[i])
    }
}

impl FromJson for RawCost {
    fn from_json(v: &Value) -> Result<RawCost, String> {
        let per_method = || {
            v.as_object()?
                .iter()
                .map(|(method, units)| Some((method.clone(), units.as_u64()?)))
                .collect::<Option<Vec<(String, u64)>>>()
        };
        v.as_u64()
            .map(RawCost::Units)
            .or_else(|| per_method().map(RawCost::PerMethod))
            .ok_or_else(|| expected("a whole number of units (0 or more), or a table of them per method such as { GET = 1, POST = 5, default = 1 }", v))
    }
}

impl RawRule {
    /// Reads a rule from its JSON form, field by field (see [`FromJson`]).
    pub(super) fn read(value: &Value) -> Result<RawRule, FieldError> {
        let whole = |problem: String| invalid("(rule)", problem);
        let Value::Object(rule) = value else {
            return Err(whole(expected("a table", value)));
        };
        let fields: Vec<&str> = (FIELDS_BEFORE.iter().copied())
            .chain(Policy::fields())
            .chain(FIELDS_AFTER.iter().copied())
            .collect();
        if let Some(unknown) = rule.keys().find(|k| !fields.contains(&k.as_str())) {
            let known: Vec<String> = fields.iter().map(|f| format!("`{f}`")).collect();
            return Err(whole(format!(
                "unknown field `{unknown}`, expected one of {}",
                known.join(", ")
            )));
        }
        let required = |name: &str| whole(format!("missing field `{name}`"));
        Ok(RawRule {
            name: one(rule, "name")?.ok_or_else(|| required("name"))?,
            key: list(rule, "key")?.ok_or_else(|| required("key"))?,
            policy: Policy::read(
                rule.get("algorithm")
                    .filter(|v| !v.is_null())
                    .ok_or_else(|| required("algorithm"))?,
                rule,
            )?,
            host: one(rule, "host")?,
            path_prefix: one(rule, "path_prefix")?,
            path: one(rule, "path")?,
            methods: list(rule, "methods")?.unwrap_or_default(),
            with_headers: list(rule, "with_headers")?.unwrap_or_default(),
            without_headers: list(rule, "without_headers")?.unwrap_or_default(),
            cost: one(rule, "cost")?,
            mode: one(rule, "mode")?,
            fail: one(rule, "fail")?,
            budget: one(rule, "budget")?,
            deny_body: one(rule, "deny_body")?,
            deny_content_type: one(rule, "deny_content_type")?,
            count_status: list(rule, "count_status")?,
            penalty: one(rule, "penalty")?,
            cost_header: one(rule, "cost_header")?,
            lease: one(rule, "lease")?,
            lease_for: one(rule, "lease_for")?,
            overrides: one(rule, "overrides")?,
            except_ips: list(rule, "except_ips")?.unwrap_or_default(),
            fold: list(rule, "fold")?.unwrap_or_default(),
            regions: one(rule, "regions")?,
            region_share: one(rule, "region_share")?,
        })
    }
}
