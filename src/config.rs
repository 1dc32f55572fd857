//! The limiter's configuration, read from the `LIMITER` object in
//! `wrangler.toml`'s `[vars]`, and checked before any request is served.
//! The worker and the native `edge-limiter check` command use this same code.

use serde::Deserialize;
use serde_json::Value;

use crate::{
    canon,
    cidr::Cidr,
    policy::{Gcra, Policy, PolicyError, Window, Windows},
};

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The rules, in the order they were written.
    pub rules: Vec<Rule>,
    /// Whether to send `X-RateLimit-Limit/Remaining/Reset` besides the
    /// standard `RateLimit` headers.
    pub x_ratelimit_headers: bool,
    /// How long an isolate answers a denied client from memory before
    /// asking Redis again (`cache_hold`), ms.
    pub cache_hold_ms: u64,
}

/// `cache_hold` when none is given: a reset reaches every isolate within a
/// minute, and a blocked client costs one Redis call a minute per isolate.
pub const DEFAULT_CACHE_HOLD_MS: u64 = 60_000;

/// One rule: which requests, keyed how, limited by what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Unique name; part of every Redis key and header the rule produces.
    pub name: String,
    /// Host the request must be for: exact, or `*.example.com` for any
    /// subdomain. `None`: any host.
    pub host: Option<String>,
    /// Requests whose normalized path is this or lies below it; `/` matches all.
    pub path_prefix: String,
    /// A path pattern the normalized path must match as a whole: `*` stands
    /// for any run of characters within one segment, `**` for anything.
    pub path: Option<String>,
    /// Upper-case methods this rule applies to; empty means all.
    pub methods: Vec<String>,
    /// Headers (lower-case names) the request must carry, e.g. an API key:
    /// with [`Rule::without_headers`] this splits traffic into classes.
    pub with_headers: Vec<String>,
    /// Headers (lower-case names) the request must not carry.
    pub without_headers: Vec<String>,
    /// What identifies a client; several parts are joined.
    pub key: Vec<KeyPart>,
    /// The algorithm and its numbers.
    pub policy: Policy,
    /// Units each matching request costs.
    pub cost: Cost,
    /// Enforce the rule, or only report what it would do.
    pub mode: Mode,
    /// What to do when Redis cannot decide in time.
    pub fail: FailMode,
    /// Total time allowed for the Redis call, milliseconds.
    pub budget_ms: u64,
    /// A body to send with this rule's 429 instead of the problem document.
    pub deny_body: Option<DenyBody>,
    /// When not empty, the rule is charged only when the origin answers one
    /// of these statuses (after the response); it still refuses up front
    /// once exhausted.
    pub count_status: Vec<u16>,
    /// Once the rule denies a client, it keeps denying that client this
    /// long, milliseconds, whatever the rate would allow meanwhile.
    pub penalty_ms: Option<u64>,
    /// Clients (`CF-Connecting-IP`) in these blocks are not subject to the rule.
    pub except_ips: Vec<Cidr>,
}

/// A piece of the request that identifies the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// `CF-Connecting-IP`, set by Cloudflare and not forgeable by the client.
    Ip,
    /// A request header, e.g. an API key (name lower-cased). Naming
    /// `x-forwarded-for` here is how a deployment behind a trusted proxy opts
    /// in to that header; it is never used otherwise.
    Header(String),
    /// A cookie's value (name as [`canon::name`] reads it).
    Cookie(String),
    /// A query parameter's value (name as [`canon::name`] reads it).
    Query(String),
    /// The normalized request path.
    Path,
    /// The `User-Agent` header.
    UserAgent,
    /// A fact the edge knows of the request (`request.cf`).
    Cf(CfField),
    /// A value in a JSON body, by RFC 6901 pointer (`/user/name`).
    Json(String),
    /// A field of an `application/x-www-form-urlencoded` or
    /// `multipart/form-data` body (name as [`canon::name`] reads it).
    Form(String),
    /// Another part, its value trimmed and case-folded, for values the
    /// origin compares that way (account names, e-mail addresses).
    Folded(Box<KeyPart>),
}

/// The facts of `request.cf` a rule can key on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CfField {
    /// Two-letter country code.
    Country,
    /// Autonomous system number.
    Asn,
    /// The data center (IATA code).
    Colo,
    /// Two-letter continent code.
    Continent,
    /// The client's JA4 TLS fingerprint (`botManagement.ja4`).
    Ja4,
}

impl CfField {
    /// The name in a key part (`cf:country`).
    pub fn name(self) -> &'static str {
        match self {
            CfField::Country => "country",
            CfField::Asn => "asn",
            CfField::Colo => "colo",
            CfField::Continent => "continent",
            CfField::Ja4 => "ja4",
        }
    }

    /// Every field, for parsing and for reading them off a request.
    pub const ALL: [CfField; 5] = [
        CfField::Country,
        CfField::Asn,
        CfField::Colo,
        CfField::Continent,
        CfField::Ja4,
    ];
}

impl KeyPart {
    /// Whether reading this part needs the request's body.
    pub fn reads_body(&self) -> bool {
        match self {
            KeyPart::Json(_) | KeyPart::Form(_) => true,
            KeyPart::Folded(inner) => inner.reads_body(),
            _ => false,
        }
    }

    /// Whether reading this part needs `request.cf`.
    pub fn reads_cf(&self) -> bool {
        match self {
            KeyPart::Cf(_) => true,
            KeyPart::Folded(inner) => inner.reads_cf(),
            _ => false,
        }
    }
}

impl std::fmt::Display for KeyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::Ip => write!(f, "ip"),
            KeyPart::Header(n) => write!(f, "header:{n}"),
            KeyPart::Cookie(n) => write!(f, "cookie:{n}"),
            KeyPart::Query(n) => write!(f, "query:{n}"),
            KeyPart::Path => write!(f, "path"),
            KeyPart::UserAgent => write!(f, "user-agent"),
            KeyPart::Cf(field) => write!(f, "cf:{}", field.name()),
            KeyPart::Json(pointer) => write!(f, "json:{pointer}"),
            KeyPart::Form(n) => write!(f, "form:{n}"),
            KeyPart::Folded(inner) => inner.fmt(f),
        }
    }
}

/// Units a request costs: one figure, or one per method with a default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cost {
    /// Cost of methods not listed.
    pub default: u64,
    /// Upper-case method and its cost.
    pub per_method: Vec<(String, u64)>,
}

impl Cost {
    /// The same cost for every method.
    pub fn flat(units: u64) -> Cost {
        Cost {
            default: units,
            per_method: vec![],
        }
    }

    /// Units a request with this (upper-case) method costs; 0 means it is
    /// reported on but never consumes or is denied.
    pub fn for_method(&self, method: &str) -> u64 {
        self.per_method
            .iter()
            .find(|(m, _)| m == method)
            .map_or(self.default, |(_, c)| *c)
    }

    /// What a request costs that the origin may take for any of these
    /// methods ([`crate::rules::RequestMeta::methods`]): the most of them.
    pub fn for_methods(&self, methods: &[String]) -> u64 {
        methods
            .iter()
            .map(|m| self.for_method(m))
            .max()
            .unwrap_or(self.default)
    }

    fn max(&self) -> u64 {
        self.per_method
            .iter()
            .map(|(_, c)| *c)
            .fold(self.default, u64::max)
    }
}

/// Whether a rule blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Requests beyond the limit get 429.
    Enforce,
    /// The decision is made, logged and put in the headers, but never
    /// blocks; a request this rule alone would deny is not counted by it.
    Shadow,
}

/// Behaviour when Redis is unreachable, slow, or answers nonsense.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Forward the request unlimited, and say so in a header and a log line.
    Open,
    /// Answer 503 with `Retry-After`.
    Closed,
}

/// A configured 429 body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenyBody {
    /// The body, sent as is.
    pub body: String,
    /// Its media type.
    pub content_type: String,
}

/// A configuration that cannot be served, with what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The `LIMITER` variable is missing or not an object.
    Missing(String),
    /// A top-level field is wrong.
    Field {
        /// The field, e.g. `rules`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A field of one rule is wrong.
    Rule {
        /// The rule's name, or `#N` (1-based) when it has none yet.
        rule: String,
        /// The field, e.g. `burst` or `windows[1].precision`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Missing(why) => write!(f, "LIMITER configuration: {why}"),
            ConfigError::Field { field, problem } => {
                write!(f, "LIMITER configuration, field `{field}`: {problem}")
            }
            ConfigError::Rule {
                rule,
                field,
                problem,
            } => {
                write!(f, "rule `{rule}`, field `{field}`: {problem}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// The two algorithms a rule can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// `rate`, `period`, `burst`.
    Gcra,
    /// `windows`.
    Windowed,
}

/// `[vars.LIMITER]` as written, before any check.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    rules: Vec<Value>,
    #[serde(default)]
    x_ratelimit_headers: Option<bool>,
    // A Value, read by hand below: serde's code for one more duration
    // field costs the worker's wasm a kilobyte.
    #[serde(default)]
    cache_hold: Option<Value>,
}

/// A duration as written: whole milliseconds, or text with a unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a duration: whole milliseconds, or text such as \"250ms\", \"1s\", \"5m\", \"1h\" or \"1d\""
)]
enum RawDuration {
    Ms(u64),
    Text(String),
}

/// A cost as written: units for every method, or per method with a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a whole number of units (0 or more), or a table of them per method such as { GET = 1, POST = 5, default = 1 }"
)]
enum RawCost {
    Units(u64),
    PerMethod(std::collections::BTreeMap<String, u64>),
}

/// One `[[vars.LIMITER.rules]]` entry as written, before any check.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: String,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    path_prefix: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    methods: Vec<String>,
    #[serde(default)]
    with_headers: Vec<String>,
    #[serde(default)]
    without_headers: Vec<String>,
    key: Vec<String>,
    algorithm: Algorithm,
    #[serde(default)]
    rate: Option<u64>,
    #[serde(default)]
    period: Option<RawDuration>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    windows: Option<Vec<(RawDuration, u64, RawDuration)>>,
    #[serde(default)]
    cost: Option<RawCost>,
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    fail: Option<FailMode>,
    #[serde(default)]
    budget: Option<RawDuration>,
    #[serde(default)]
    deny_body: Option<String>,
    #[serde(default)]
    deny_content_type: Option<String>,
    #[serde(default)]
    count_status: Option<Vec<u16>>,
    #[serde(default)]
    penalty: Option<RawDuration>,
    #[serde(default)]
    except_ips: Vec<String>,
    #[serde(default)]
    fold: Vec<String>,
}

/// Checks `ORIGIN_URL`, where allowed requests go instead of the request's
/// own URL (scheme, host and port; the path and query are kept). It is unset
/// in production, where the route's origin is the request's own URL.
pub fn parse_origin(url: &str) -> Result<String, ConfigError> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(host)
            if !host.trim_end_matches('/').is_empty()
                && !host.trim_end_matches('/').contains('/') =>
        {
            Ok(url.trim_end_matches('/').to_owned())
        }
        _ => Err(ConfigError::Field {
            field: "ORIGIN_URL".into(),
            problem: format!("`{url}` must be http:// or https:// and a host, with no path"),
        }),
    }
}

/// Default time budget for the Redis call.
pub const DEFAULT_BUDGET_MS: u64 = 1000;

impl Config {
    /// Parses and checks the configuration from its JSON form (what
    /// `[vars.LIMITER]` in `wrangler.toml` becomes).
    pub fn from_json(value: &Value) -> Result<Config, ConfigError> {
        if !value.is_object() {
            return Err(ConfigError::Missing(
                "expected a table `[vars.LIMITER]` with `rules`".into(),
            ));
        }
        let raw = RawConfig::deserialize(value).map_err(|e| ConfigError::Field {
            field: "LIMITER".into(),
            problem: e.to_string(),
        })?;
        if raw.rules.is_empty() {
            return Err(ConfigError::Field {
                field: "rules".into(),
                problem: "give at least one rule".into(),
            });
        }
        let mut rules: Vec<Rule> = Vec::with_capacity(raw.rules.len());
        for (i, v) in raw.rules.iter().enumerate() {
            let rule = parse_rule(v, i)?;
            if rules.iter().any(|r| r.name == rule.name) {
                return Err(rule_error(&rule.name, "name", "is used by an earlier rule"));
            }
            rules.push(rule);
        }
        let cache_hold_ms = match &raw.cache_hold {
            None => DEFAULT_CACHE_HOLD_MS,
            Some(hold) => {
                let written = match hold {
                    Value::String(text) => Ok(RawDuration::Text(text.clone())),
                    other => other.as_u64().map(RawDuration::Ms).ok_or_else(|| {
                        field_error("cache_hold", format!("`{other}` is not a duration"))
                    }),
                };
                written
                    .and_then(|w| duration("cache_hold", &w))
                    .map_err(|e| ConfigError::Field {
                        field: e.field,
                        problem: e.problem,
                    })?
            }
        };
        Ok(Config {
            rules,
            x_ratelimit_headers: raw.x_ratelimit_headers.unwrap_or(true),
            cache_hold_ms,
        })
    }
}

impl Config {
    /// The position of `rule`, one of this configuration's own, in `rules`.
    pub fn index_of(&self, rule: &Rule) -> usize {
        self.rules
            .iter()
            .position(|r| std::ptr::eq(r, rule))
            .unwrap_or_default()
    }
}

impl std::str::FromStr for Config {
    type Err = ConfigError;

    /// Parses the configuration from JSON text.
    fn from_str(text: &str) -> Result<Config, ConfigError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| ConfigError::Missing(e.to_string()))?;
        Config::from_json(&value)
    }
}

impl Rule {
    /// A rule matching every request, keyed on the client IP, with `policy`
    /// and every other field at its default; for tests and simulations.
    pub fn with_policy(name: &str, policy: Policy) -> Rule {
        Rule {
            name: name.to_owned(),
            host: None,
            path_prefix: "/".into(),
            path: None,
            methods: vec![],
            with_headers: vec![],
            without_headers: vec![],
            key: vec![KeyPart::Ip],
            policy,
            cost: Cost::flat(1),
            mode: Mode::Enforce,
            fail: FailMode::Closed,
            budget_ms: DEFAULT_BUDGET_MS,
            deny_body: None,
            count_status: vec![],
            penalty_ms: None,
            except_ips: vec![],
        }
    }
}

fn rule_error(rule: &str, field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Rule {
        rule: rule.to_owned(),
        field: field.into(),
        problem: problem.into(),
    }
}

/// A problem with one field of a rule, before the rule's name is attached.
struct FieldError {
    field: String,
    problem: String,
}

fn field_error(field: impl Into<String>, problem: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        problem: problem.into(),
    }
}

impl From<PolicyError> for FieldError {
    fn from(e: PolicyError) -> FieldError {
        field_error(e.field, e.problem)
    }
}

fn parse_rule(value: &Value, index: usize) -> Result<Rule, ConfigError> {
    let fallback = format!("#{}", index + 1);
    let label = value
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or(&fallback)
        .to_owned();
    let raw: RawRule = serde_path_to_error::deserialize(value).map_err(|e| {
        // The path names the field whose value did not fit its type; an
        // unknown or missing field is reported on the rule as a whole.
        let path = e.path().to_string();
        let problem = e.into_inner().to_string();
        let whole = path == "."
            || problem.starts_with("unknown field")
            || problem.starts_with("missing field");
        let field = if whole { "(rule)".to_owned() } else { path };
        rule_error(&label, field, problem)
    })?;
    Rule::try_from(raw).map_err(|e| rule_error(&label, e.field, e.problem))
}

impl TryFrom<RawRule> for Rule {
    type Error = FieldError;

    fn try_from(raw: RawRule) -> Result<Rule, FieldError> {
        let policy = match raw.algorithm {
            Algorithm::Gcra => gcra(
                raw.rate,
                raw.period.as_ref(),
                raw.burst,
                raw.windows.is_some(),
            )?,
            Algorithm::Windowed => windowed(&raw)?,
        };
        let name = rule_name(raw.name)?;
        let host = raw.host.map(host_pattern).transpose()?;
        let path_prefix =
            path_pattern("path_prefix", raw.path_prefix.unwrap_or_else(|| "/".into()))?;
        let path = raw.path.map(|p| path_pattern("path", p)).transpose()?;
        let methods = raw
            .methods
            .iter()
            .map(|m| {
                method(m)
                    .ok_or_else(|| field_error("methods", format!("`{m}` is not an HTTP method")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let with_headers = header_names("with_headers", &raw.with_headers)?;
        let without_headers = header_names("without_headers", &raw.without_headers)?;
        if raw.key.is_empty() {
            return Err(field_error("key", "give at least one part, e.g. [\"ip\"]"));
        }
        let mut key = raw
            .key
            .iter()
            .map(|k| key_part(k))
            .collect::<Result<Vec<_>, _>>()?;
        for name in &raw.fold {
            let i = raw.key.iter().position(|k| k == name).ok_or_else(|| {
                field_error(
                    "fold",
                    format!("`{name}` is not one of this rule's key parts"),
                )
            })?;
            let part = std::mem::replace(&mut key[i], KeyPart::Ip);
            key[i] = KeyPart::Folded(Box::new(part));
        }
        let cost = raw.cost.map_or(Ok(Cost::flat(1)), cost)?;
        if cost.max() > policy.capacity() {
            return Err(field_error(
                "cost",
                format!(
                    "{} exceeds what the policy can ever admit ({}); no such request would pass",
                    cost.max(),
                    policy.capacity()
                ),
            ));
        }
        let budget_ms = match &raw.budget {
            None => DEFAULT_BUDGET_MS,
            Some(b) => duration("budget", b)?,
        };
        if !(10..=30_000).contains(&budget_ms) {
            return Err(field_error("budget", "must be between 10ms and 30s"));
        }
        let deny_body = deny_body(raw.deny_body, raw.deny_content_type)?;
        let count_status = raw.count_status.map_or(Ok(vec![]), count_status)?;
        let penalty_ms = match &raw.penalty {
            None => None,
            Some(p) => Some(duration("penalty", p)?)
                .filter(|ms| *ms <= crate::policy::MAX_DURATION_MS)
                .map(Some)
                .ok_or_else(|| field_error("penalty", "must be between 1ms and 366d"))?,
        };
        let except_ips = raw
            .except_ips
            .iter()
            .map(|c| Cidr::parse(c).map_err(|why| field_error("except_ips", why)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Rule {
            name,
            host,
            path_prefix,
            path,
            methods,
            with_headers,
            without_headers,
            key,
            policy,
            cost,
            mode: raw.mode.unwrap_or(Mode::Enforce),
            fail: raw.fail.unwrap_or(FailMode::Closed),
            budget_ms,
            deny_body,
            count_status,
            penalty_ms,
            except_ips,
        })
    }
}

fn rule_name(name: String) -> Result<String, FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(name)
    } else {
        Err(field_error(
            "name",
            "use 1 to 64 characters from a-z, A-Z, 0-9, - and _",
        ))
    }
}

/// A host, or `*.domain` for its subdomains, lower-cased and without a
/// trailing dot (as requests are compared).
fn host_pattern(h: String) -> Result<String, FieldError> {
    let bare = h.strip_prefix("*.").unwrap_or(&h).trim_end_matches('.');
    let ok = !bare.is_empty()
        && bare
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b':');
    if !ok {
        return Err(field_error(
            "host",
            format!("`{h}` is not a host name (use example.com or *.example.com)"),
        ));
    }
    Ok(crate::rules::normalize_host(&h))
}

/// A path prefix or pattern, case folded and each segment without the dots
/// and spaces that end it: paths are compared after
/// [`crate::rules::normalize_path`], which does the same to them.
fn path_pattern(field: &str, p: String) -> Result<String, FieldError> {
    if !p.starts_with('/') {
        return Err(field_error(field, format!("`{p}` must start with /")));
    }
    let segments: Vec<&str> = p.split('/').map(canon::windows_segment).collect();
    Ok(canon::fold(&segments.join("/")))
}

fn method(m: &str) -> Option<String> {
    (!m.is_empty() && m.bytes().all(|b| b.is_ascii_alphabetic())).then(|| m.to_ascii_uppercase())
}

fn header_names(field: &str, names: &[String]) -> Result<Vec<String>, FieldError> {
    names
        .iter()
        .map(|n| {
            let ok = !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if ok {
                Ok(n.to_ascii_lowercase())
            } else {
                Err(field_error(field, format!("`{n}` is not a header name")))
            }
        })
        .collect()
}

fn key_part(text: &str) -> Result<KeyPart, FieldError> {
    let part = match text {
        "ip" => Some(KeyPart::Ip),
        "path" => Some(KeyPart::Path),
        "user-agent" => Some(KeyPart::UserAgent),
        _ => match text.split_once(':') {
            Some(("header", name)) if !name.is_empty() => {
                Some(KeyPart::Header(name.to_ascii_lowercase()))
            }
            Some(("cookie", name)) if !name.is_empty() => Some(KeyPart::Cookie(canon::name(name))),
            Some(("query", name)) if !name.is_empty() => Some(KeyPart::Query(canon::name(name))),
            Some(("form", name)) if !name.is_empty() => Some(KeyPart::Form(canon::name(name))),
            Some(("json", pointer)) if pointer.starts_with('/') => {
                Some(KeyPart::Json(pointer.to_owned()))
            }
            Some(("cf", field)) => CfField::ALL
                .into_iter()
                .find(|f| f.name() == field)
                .map(KeyPart::Cf),
            _ => None,
        },
    };
    part.ok_or_else(|| {
        field_error(
            "key",
            format!(
                "`{text}` is not a key part; use ip, path, user-agent, header:NAME, cookie:NAME, \
                 query:NAME, cf:country, cf:asn, cf:colo, cf:continent, cf:ja4, json:/POINTER or form:NAME"
            ),
        )
    })
}

fn count_status(list: Vec<u16>) -> Result<Vec<u16>, FieldError> {
    if list.is_empty() {
        return Err(field_error(
            "count_status",
            "give at least one status, e.g. [401, 403]",
        ));
    }
    match list.iter().find(|s| !(100..=599).contains(*s)) {
        Some(bad) => Err(field_error(
            "count_status",
            format!("{bad} is not an HTTP status (100 to 599)"),
        )),
        None => Ok(list),
    }
}

fn gcra(
    rate: Option<u64>,
    period: Option<&RawDuration>,
    burst: Option<u64>,
    has_windows: bool,
) -> Result<Policy, FieldError> {
    if has_windows {
        return Err(field_error(
            "windows",
            "belongs to algorithm \"windowed\"; GCRA takes rate, period and burst",
        ));
    }
    let rate = rate.ok_or_else(|| field_error("rate", "is required for GCRA"))?;
    let period = period.ok_or_else(|| field_error("period", "is required for GCRA"))?;
    let period_ms = duration("period", period)?;
    Ok(Policy::Gcra(Gcra::new(
        rate,
        period_ms,
        burst.unwrap_or(rate),
    )?))
}

fn windowed(raw: &RawRule) -> Result<Policy, FieldError> {
    for (field, set) in [
        ("rate", raw.rate.is_some()),
        ("period", raw.period.is_some()),
        ("burst", raw.burst.is_some()),
    ] {
        if set {
            return Err(field_error(
                field,
                "belongs to algorithm \"gcra\"; windowed takes windows",
            ));
        }
    }
    let list = raw.windows.as_ref().ok_or_else(|| {
        field_error(
            "windows",
            "is required: [[duration, limit, precision], ...]",
        )
    })?;
    let windows = list
        .iter()
        .enumerate()
        .map(|(i, (d, limit, p))| {
            let at = |name: &str| format!("windows[{i}].{name}");
            let duration_ms = duration(&at("duration"), d)?;
            let precision_ms = duration(&at("precision"), p)?;
            Window::new(duration_ms, *limit, precision_ms)
                .map_err(|e| field_error(at(&e.field), e.problem))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Policy::Windowed(Windows::new(windows)?))
}

fn cost(raw: RawCost) -> Result<Cost, FieldError> {
    match raw {
        RawCost::Units(units) => Ok(Cost::flat(units)),
        RawCost::PerMethod(map) => {
            let mut cost = Cost::flat(1);
            for (name, units) in map {
                if name == "default" {
                    cost.default = units;
                } else {
                    let m = method(&name).ok_or_else(|| {
                        field_error(
                            "cost",
                            format!("`{name}` is not an HTTP method (or `default`)"),
                        )
                    })?;
                    cost.per_method.push((m, units));
                }
            }
            Ok(cost)
        }
    }
}

fn deny_body(
    body: Option<String>,
    content_type: Option<String>,
) -> Result<Option<DenyBody>, FieldError> {
    match (body, content_type) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(field_error("deny_content_type", "goes with deny_body")),
        (Some(body), content_type) => {
            let content_type = content_type.unwrap_or_else(|| "text/plain; charset=utf-8".into());
            if content_type.is_empty() || content_type.contains(['\r', '\n']) {
                return Err(field_error(
                    "deny_content_type",
                    format!("`{content_type}` is not a media type"),
                ));
            }
            Ok(Some(DenyBody { body, content_type }))
        }
    }
}

fn duration(field: &str, raw: &RawDuration) -> Result<u64, FieldError> {
    let ms = match raw {
        RawDuration::Ms(ms) => Some(*ms),
        RawDuration::Text(text) => duration_text(text),
    }
    .ok_or_else(|| {
        let shown = match raw {
            RawDuration::Ms(ms) => ms.to_string(),
            RawDuration::Text(t) => format!("\"{t}\""),
        };
        field_error(
            field,
            format!("`{shown}` is not a duration; write e.g. 500 (ms), \"250ms\", \"1s\", \"5m\", \"1h\" or \"1d\""),
        )
    })?;
    if ms == 0 {
        return Err(field_error(field, "must be longer than zero"));
    }
    Ok(ms)
}

/// Milliseconds in a duration written with a unit (`250ms`, `1s`, `5m`,
/// `1h`, `1d`), or `None`.
pub fn duration_text(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one_rule(rule: Value) -> Result<Config, ConfigError> {
        Config::from_json(&json!({ "rules": [rule] }))
    }

    #[test]
    fn parses_a_gcra_rule_with_defaults() {
        let c = one_rule(json!({"name": "per-ip", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s"})).unwrap();
        let r = &c.rules[0];
        assert_eq!(r.policy, Policy::Gcra(Gcra::new(10, 1000, 10).unwrap()));
        assert_eq!(
            (&r.cost, r.fail, r.budget_ms, r.mode),
            (
                &Cost::flat(1),
                FailMode::Closed,
                DEFAULT_BUDGET_MS,
                Mode::Enforce
            )
        );
        assert!(c.x_ratelimit_headers);
        assert_eq!(c.cache_hold_ms, DEFAULT_CACHE_HOLD_MS);
        assert_eq!(r.path_prefix, "/");
    }

    #[test]
    fn the_cache_hold_is_a_duration() {
        let with_hold = |hold: Value| {
            let rule =
                json!({"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1s"});
            Config::from_json(&json!({"cache_hold": hold, "rules": [rule]}))
        };
        assert_eq!(with_hold(json!("5s")).unwrap().cache_hold_ms, 5000);
        assert_eq!(with_hold(json!(250)).unwrap().cache_hold_ms, 250);
        for bad in [json!(0), json!("soon"), json!(true), json!(-5)] {
            match with_hold(bad.clone()) {
                Err(ConfigError::Field { field, .. }) => assert_eq!(field, "cache_hold", "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn parses_a_windowed_rule() {
        let c = one_rule(json!({"name": "w", "key": ["header:X-Api-Key", "ip"], "algorithm": "windowed",
            "windows": [["1s", 10, "100ms"], ["1h", 1000, "1m"]], "fail": "open", "budget": 250, "methods": ["post"]}))
        .unwrap();
        let r = &c.rules[0];
        assert_eq!(
            r.key,
            vec![KeyPart::Header("x-api-key".into()), KeyPart::Ip]
        );
        assert_eq!(r.methods, vec!["POST"]);
        assert_eq!((r.fail, r.budget_ms), (FailMode::Open, 250));
        assert_eq!(
            r.policy,
            Policy::Windowed(
                Windows::new(vec![
                    Window::new(1000, 10, 100).unwrap(),
                    Window::new(3_600_000, 1000, 60_000).unwrap(),
                ])
                .unwrap()
            )
        );
    }

    #[test]
    fn errors_name_the_rule_and_field() {
        let cases = [
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "gcra", "period": "1s"}),
                "rule `a`, field `rate`",
            ),
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1 sec"}),
                "rule `a`, field `period`",
            ),
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1s", "burst": 0}),
                "rule `a`, field `burst`",
            ),
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s", "cost": 6}),
                "rule `a`, field `cost`",
            ),
            (
                json!({"name": "a", "key": ["mac"], "algorithm": "gcra", "rate": 1, "period": "1s"}),
                "rule `a`, field `key`",
            ),
            (
                json!({"name": "a b", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1s"}),
                "rule `a b`, field `name`",
            ),
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "leaky", "rate": 1, "period": "1s"}),
                "rule `a`, field `algorithm`",
            ),
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1s", "fail": "maybe"}),
                "rule `a`, field `fail`",
            ),
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1s", "rat": 1}),
                "rule `a`, field `(rule)`: unknown field `rat`",
            ),
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 5, "300ms"]]}),
                "rule `a`, field `windows[0].precision`",
            ),
            (json!({"key": ["ip"]}), "rule `#1`"),
        ];
        for (rule, expected) in cases {
            let msg = one_rule(rule.clone()).unwrap_err().to_string();
            assert!(msg.starts_with(expected), "{rule}: {msg}");
        }
    }

    #[test]
    fn duplicate_names_and_bad_origins_are_rejected() {
        let r = json!({"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1s"});
        let msg = Config::from_json(&json!({"rules": [r.clone(), r.clone()]}))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("field `name`"), "{msg}");
        assert!(Config::from_json(&json!("nope")).is_err());
        assert_eq!(
            parse_origin("http://127.0.0.1:8081/"),
            Ok("http://127.0.0.1:8081".into())
        );
        for bad in ["ftp://x", "http://", "https://h/path", "127.0.0.1"] {
            assert!(
                parse_origin(bad)
                    .unwrap_err()
                    .to_string()
                    .contains("ORIGIN_URL"),
                "{bad}"
            );
        }
    }

    #[test]
    fn parses_classes_costs_modes_and_bodies() {
        let c = Config::from_json(&json!({"x_ratelimit_headers": false, "rules": [{
            "name": "keyed", "key": ["header:x-api-key"], "algorithm": "gcra", "rate": 100, "period": "1m",
            "host": "*.Example.com", "path": "/api/*/items", "with_headers": ["X-Api-Key"], "without_headers": ["x-internal"],
            "cost": {"GET": 1, "post": 5, "default": 2, "OPTIONS": 0}, "mode": "shadow",
            "deny_body": "{\"error\":\"slow down\"}", "deny_content_type": "application/json"
        }]}))
        .unwrap();
        assert!(!c.x_ratelimit_headers);
        let r = &c.rules[0];
        assert_eq!(r.host.as_deref(), Some("*.example.com"));
        assert_eq!(r.path.as_deref(), Some("/api/*/items"));
        assert_eq!(
            (r.with_headers.as_slice(), r.without_headers.as_slice()),
            (
                &["x-api-key".to_owned()][..],
                &["x-internal".to_owned()][..]
            )
        );
        assert_eq!(
            (
                r.cost.for_method("GET"),
                r.cost.for_method("POST"),
                r.cost.for_method("PUT"),
                r.cost.for_method("OPTIONS")
            ),
            (1, 5, 2, 0)
        );
        assert_eq!(r.mode, Mode::Shadow);
        assert_eq!(
            r.deny_body.as_ref().unwrap().content_type,
            "application/json"
        );
    }

    #[test]
    fn bad_classes_costs_and_modes_name_their_field() {
        let base =
            json!({"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s"});
        let with = |k: &str, v: Value| {
            let mut r = base.clone();
            r[k] = v;
            one_rule(r).unwrap_err().to_string()
        };
        for (field, value) in [
            ("cost", json!(-1)),
            ("cost", json!(1.5)),
            ("cost", json!("3")),
            ("cost", json!({"GET": 9})),
            ("cost", json!({"G E T": 1})),
            ("mode", json!("dry-run")),
            ("host", json!("exa mple.com")),
            ("path", json!("api/*")),
            ("with_headers", json!(["bad header"])),
            ("deny_content_type", json!("text/plain")),
        ] {
            let msg = with(field, value.clone());
            assert!(
                msg.starts_with(&format!("rule `a`, field `{field}`")),
                "{field}={value}: {msg}"
            );
        }
        assert!(
            one_rule({
                let mut r = base.clone();
                r["cost"] = json!(0);
                r
            })
            .is_ok(),
            "cost 0 only reports"
        );
    }

    fn parse_duration(v: Value) -> Result<u64, String> {
        let raw = RawDuration::deserialize(&v).map_err(|e| e.to_string())?;
        duration("d", &raw).map_err(|e| e.problem)
    }

    #[test]
    fn edge_rule_fields_parse_and_name_their_errors() {
        let base = json!({"name": "a", "key": ["ip", "json:/user", "cf:country", "form:User.Name"],
            "algorithm": "gcra", "rate": 5, "period": "1m"});
        let with = |k: &str, v: Value| {
            let mut r = base.clone();
            r[k] = v;
            one_rule(r)
        };
        let c = with("fold", json!(["json:/user"])).unwrap();
        assert_eq!(
            c.rules[0].key,
            [
                KeyPart::Ip,
                KeyPart::Folded(Box::new(KeyPart::Json("/user".into()))),
                KeyPart::Cf(CfField::Country),
                KeyPart::Form("user_name".into()),
            ]
        );
        let mut r = base.clone();
        r["count_status"] = json!([401, 403]);
        r["penalty"] = json!("10m");
        r["except_ips"] = json!(["10.0.0.0/8", "2001:db8::/32"]);
        let rule = one_rule(r).unwrap().rules.remove(0);
        assert_eq!(rule.count_status, [401, 403]);
        assert_eq!(rule.penalty_ms, Some(600_000));
        assert_eq!(rule.except_ips.len(), 2);
        for (field, value) in [
            ("count_status", json!([])),
            ("count_status", json!([99])),
            ("count_status", json!(["401"])),
            ("penalty", json!("0s")),
            ("penalty", json!("367d")),
            ("except_ips", json!(["10.0.0.1/8"])),
            ("except_ips", json!(["example.com"])),
            ("fold", json!(["json:/other"])),
        ] {
            // A wrong element is named by its index (`count_status[0]`).
            let msg = with(field, value.clone()).unwrap_err().to_string();
            assert!(
                msg.starts_with(&format!("rule `a`, field `{field}")),
                "{field}={value}: {msg}"
            );
        }
        for bad in ["cf:city", "json:user", "form:", "json:"] {
            let mut r = base.clone();
            r["key"] = json!([bad]);
            let msg = one_rule(r).unwrap_err().to_string();
            assert!(msg.starts_with("rule `a`, field `key`"), "{bad}: {msg}");
        }
    }

    #[test]
    fn durations_take_units() {
        for (text, ms) in [
            (json!("250ms"), 250),
            (json!("2s"), 2000),
            (json!("5m"), 300_000),
            (json!("1h"), 3_600_000),
            (json!("1d"), 86_400_000),
            (json!(40), 40),
        ] {
            assert_eq!(parse_duration(text.clone()), Ok(ms), "{text}");
        }
        for bad in [
            json!("0s"),
            json!("s"),
            json!("10x"),
            json!(-1),
            json!(1.5),
            json!("99999999999999999999d"),
        ] {
            assert!(parse_duration(bad.clone()).is_err(), "{bad}");
        }
    }
}
