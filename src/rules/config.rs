//! The limiter's configuration, read from the `LIMITER` object in
//! `wrangler.toml`'s `[vars]`, and checked before any request is served.
//! The worker and the native `edge-limiter check` command use this same code.

use serde_json::Value;

use super::{
    canon,
    cidr::Cidr,
    client_form::{ClientForm, HmacKey},
    fields::{duration, invalid, FieldError, FromJson, RawDuration},
    lease::Lease,
    pattern::PathPattern,
    policy::{Policy, MAX_DURATION_MS},
    raw::{RawConfig, RawCost, RawRule},
    regions::{self, Region},
    request::{self, CfField, RequestMeta},
    rule::{Cost, DenyBody, FailMode, KeyPart, Mode, Rule, RuleId, DEFAULT_BUDGET_MS},
    shared::{Pool, Share, MAX_POOL_MS},
    stats::{self, StatsClients, StatsSettings},
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
    /// Whether and how isolates write stats of what they did; `None`
    /// unless `stats = true`.
    pub stats: Option<StatsSettings>,
    /// The Redis regions, the home first; none for one Redis, today's.
    pub regions: Vec<Region>,
}

/// `cache_hold` when none is given: a reset reaches every isolate within a
/// minute, and a blocked client costs one Redis call a minute per isolate.
pub const DEFAULT_CACHE_HOLD_MS: u64 = 60_000;

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
    /// A secret the configuration needs is missing or too weak.
    Secret {
        /// The secret's name, e.g. `STATS_SECRET`.
        name: &'static str,
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
            ConfigError::Secret { name, problem } => write!(f, "secret `{name}`: {problem}"),
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

impl From<FieldError> for ConfigError {
    fn from(e: FieldError) -> ConfigError {
        ConfigError::Field {
            field: e.field,
            problem: e.problem,
        }
    }
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

impl Config {
    /// Parses and checks the configuration from its JSON form (what
    /// `[vars.LIMITER]` in `wrangler.toml` becomes).
    pub fn from_json(value: &Value) -> Result<Config, ConfigError> {
        let Some(table) = value.as_object() else {
            return Err(ConfigError::Missing(
                "expected a table `[vars.LIMITER]` with `rules`".into(),
            ));
        };
        let raw = RawConfig::read(table)?;
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
            Some(hold) => RawDuration::from_json(hold)
                .map_err(|why| invalid("cache_hold", why))
                .and_then(|w| duration("cache_hold", &w))?,
        };
        let regions = regions::read(raw.regions.as_ref())?;
        if let Some(rule) = rules.iter().find(|r| r.shared.is_some()) {
            if regions.len() < 2 {
                return Err(rule_error(&rule.name, "regions", "`\"shared\"` keeps one limit across the configuration's `regions`, which name no region besides the home; add them, or remove `regions` from the rule"));
            }
        }
        let others = regions.len().saturating_sub(1) as u64;
        for rule in rules.iter_mut().filter(|r| r.shared.is_some()) {
            let named = |e: FieldError| rule_error(&rule.name, e.field, e.problem);
            // The home keeps the rule's figures less every region's share.
            let asked = rule.shared.and_then(|p| p.share);
            let share = match (asked, &rule.policy) {
                (Some(asked), Policy::Gcra(g)) => {
                    let (share, home) = Share::split(g, others, asked.units).map_err(named)?;
                    rule.policy = Policy::Gcra(home);
                    Some(share)
                }
                _ => None,
            };
            let pool = Pool::of(&rule.policy, cache_hold_ms).map_err(named)?;
            rule.shared = Some(Pool { share, ..pool });
        }
        let stats = stats(&raw)?;
        // Until `keyed_by` gives the secret, an HMAC form keys by none:
        // `needs_secret` tells the worker to refuse to run so.
        let form = match stats.map(|s| s.clients) {
            Some(StatsClients::Hash) => ClientForm::Hashed,
            Some(StatsClients::Hmac) => ClientForm::Keyed(HmacKey::new(b"")),
            _ => ClientForm::Readable,
        };
        for rule in &mut rules {
            rule.form = form.clone();
        }
        Ok(Config {
            rules,
            x_ratelimit_headers: raw.x_ratelimit_headers.unwrap_or(true),
            cache_hold_ms,
            stats,
            regions,
        })
    }
}

/// The stats settings, checked: `None` unless `stats = true`.
fn stats(raw: &RawConfig) -> Result<Option<StatsSettings>, FieldError> {
    let given = [
        ("stats_every", raw.stats_every.is_some()),
        ("stats_keep", raw.stats_keep.is_some()),
        ("stats_clients", raw.stats_clients.is_some()),
    ];
    match raw.stats {
        Some(true) => {}
        // Off on purpose: the other settings may stay for the next time.
        Some(false) => return Ok(None),
        None => {
            return match given.iter().find(|(_, set)| *set) {
                Some((field, _)) => Err(invalid(
                    *field,
                    "takes effect only with `stats = true`; add it, or `stats = false` to keep stats off",
                )),
                None => Ok(None),
            }
        }
    }
    let within =
        |field: &str, written: Option<&RawDuration>, default: u64, range: (u64, u64, &str)| {
            let ms = written.map_or(Ok(default), |w| duration(field, w))?;
            if !(range.0..=range.1).contains(&ms) {
                return Err(invalid(field, format!("must be between {}", range.2)));
            }
            Ok(ms)
        };
    Ok(Some(StatsSettings {
        every_ms: within(
            "stats_every",
            raw.stats_every.as_ref(),
            stats::DEFAULT_EVERY_MS,
            (
                stats::EVERY_RANGE_MS.0,
                stats::EVERY_RANGE_MS.1,
                "1s and 1h",
            ),
        )?,
        keep_ms: within(
            "stats_keep",
            raw.stats_keep.as_ref(),
            stats::DEFAULT_KEEP_MS,
            (
                stats::KEEP_RANGE_MS.0,
                stats::KEEP_RANGE_MS.1,
                "1h and 366d",
            ),
        )?,
        clients: raw.stats_clients.unwrap_or(StatsClients::Key),
    }))
}

/// The secret `stats_clients = "hmac"` keys clients by.
pub const STATS_SECRET: &str = "STATS_SECRET";

/// The shortest [`STATS_SECRET`], bytes: 128 bits of hex at least, so that
/// no one finds it by trying.
pub const MIN_SECRET_BYTES: usize = 32;

impl Config {
    /// Whether a rule keeps one limit across regions: a region other than
    /// the home then needs the home's Redis too.
    pub fn shares_rules(&self) -> bool {
        self.rules.iter().any(|r| r.shared.is_some())
    }

    /// Whether `stats_clients = "hmac"` asks for [`STATS_SECRET`].
    pub fn needs_secret(&self) -> bool {
        self.stats.is_some_and(|s| s.clients == StatsClients::Hmac)
    }

    /// The configuration with its clients keyed by `secret`, as
    /// `stats_clients = "hmac"` asks; any other setting ignores it.
    pub fn keyed_by(mut self, secret: Option<&str>) -> Result<Config, ConfigError> {
        if !self.needs_secret() {
            return Ok(self);
        }
        let problem = |problem: String| ConfigError::Secret {
            name: STATS_SECRET,
            problem,
        };
        let secret = secret.ok_or_else(|| {
            problem(format!(
                "`stats_clients = \"hmac\"` needs it: `wrangler secret put {STATS_SECRET}` \
                 (.dev.vars locally)"
            ))
        })?;
        if secret.len() < MIN_SECRET_BYTES {
            return Err(problem(format!(
                "is {} bytes, under {MIN_SECRET_BYTES}: `openssl rand -hex 32`",
                secret.len()
            )));
        }
        let form = ClientForm::Keyed(HmacKey::new(secret.as_bytes()));
        for rule in &mut self.rules {
            rule.form = form.clone();
        }
        Ok(self)
    }

    /// The configuration with clients named readably in every key: for a
    /// replay, whose keys live in a Redis of its own and need no secret.
    pub fn readable_keys(mut self) -> Config {
        for rule in &mut self.rules {
            rule.form = ClientForm::Readable;
        }
        self
    }

    /// The rule `id` names, if it is one of this configuration's.
    pub fn rule(&self, id: RuleId) -> Option<&Rule> {
        self.rules.get(id.0)
    }

    /// Every rule with its id, in configuration order.
    pub fn rules_with_ids(&self) -> impl Iterator<Item = (RuleId, &Rule)> {
        self.rules.iter().enumerate().map(|(i, r)| (RuleId(i), r))
    }

    /// Every request header these rules can read, lower-case, each once:
    /// the worker reads no other, however many a request carries.
    pub fn headers_read(&self) -> Vec<String> {
        // Kept in order as they come: a library sort here would cost the
        // wasm about a kilobyte for a list of a few names.
        let mut names: Vec<&str> = vec![];
        let always = request::headers_always_read().map(|n| -> &str { n });
        for name in always.chain(self.rules.iter().flat_map(Rule::headers_read)) {
            if let Err(at) = names.binary_search(&name) {
                names.insert(at, name);
            }
        }
        names.into_iter().map(str::to_owned).collect()
    }

    /// Whether `req` must carry its body before it is decided: a matching
    /// rule keys on it, or a POST's `_method` field may make a rule match.
    pub fn needs_body(&self, req: &RequestMeta) -> bool {
        self.rules.iter().any(|r| r.needs_body(req))
    }

    /// Whether `req` must carry `request.cf`: a matching rule keys on it.
    /// Asked once the body is in, as it can change which rules match.
    pub fn needs_cf(&self, req: &RequestMeta) -> bool {
        self.rules.iter().any(|r| r.reads_cf() && r.matches(req))
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

fn rule_error(rule: &str, field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Rule {
        rule: rule.to_owned(),
        field: field.into(),
        problem: problem.into(),
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
    let raw = RawRule::read(value).map_err(|e| rule_error(&label, e.field, e.problem))?;
    Rule::try_from(raw).map_err(|e| rule_error(&label, e.field, e.problem))
}

impl TryFrom<RawRule> for Rule {
    type Error = FieldError;

    fn try_from(raw: RawRule) -> Result<Rule, FieldError> {
        let policy = raw.policy;
        let name = rule_name(raw.name)?;
        let host = raw.host.map(host_pattern).transpose()?;
        let path_prefix =
            path_pattern("path_prefix", raw.path_prefix.unwrap_or_else(|| "/".into()))?;
        let path = raw.path.map(|p| path_pattern("path", p)).transpose()?;
        let path = path.as_deref().map(PathPattern::new);
        let methods = methods(&raw.methods)?;
        let with_headers = header_names("with_headers", &raw.with_headers)?;
        let without_headers = header_names("without_headers", &raw.without_headers)?;
        let key = key(&raw.key, &raw.fold)?;
        let cost = raw.cost.map_or(Ok(Cost::flat(1)), cost)?;
        cost.fits(&policy)?;
        let budget_ms = budget(raw.budget.as_ref())?;
        let deny_body = deny_body(raw.deny_body, raw.deny_content_type)?;
        let count_status = raw.count_status.map_or(Ok(vec![]), count_status)?;
        if policy.algorithm().released() && !count_status.is_empty() {
            return Err(invalid(
                "count_status",
                "does not apply to an in-flight limit: its slot is given back after every response",
            ));
        }
        let penalty_ms = raw.penalty.as_ref().map(penalty).transpose()?;
        let cost_header = raw
            .cost_header
            .map(|h| cost_header(h, &policy, &count_status));
        let cost_header = cost_header.transpose()?;
        let mode = raw.mode.unwrap_or(Mode::Enforce);
        let lease = lease(
            raw.lease,
            raw.lease_for.as_ref(),
            &policy,
            mode,
            &count_status,
        )?;
        if lease.is_some() && cost_header.is_some() {
            return Err(invalid("lease", "a `cost_header` rule settles each request's charge in Redis after its response, which a lease's units, spent in the isolate, cannot; remove `lease` or `cost_header`"));
        }
        if raw.region_share.is_some() && raw.regions.as_deref() != Some("shared") {
            return Err(invalid("region_share", "needs `regions = \"shared\"`"));
        }
        let shared = match raw.regions.as_deref() {
            None => None,
            Some("shared") => {
                let settled = !count_status.is_empty() || cost_header.is_some();
                Pool::fits(mode, settled, penalty_ms.is_some())?;
                // Its interval, and the home's figures less it, wait for the
                // count of regions: `Config::from_json` splits the rule.
                let share = raw.region_share.map(|units| Share {
                    units,
                    interval_us: 0,
                    whole: None,
                });
                let gcra = matches!(policy, Policy::Gcra(_));
                let why = match (&share, gcra, raw.overrides == Some(true)) {
                    (Some(_), false, _) => Some("a region's share is a GCRA of its own; use a GCRA rule, or remove `region_share`"),
                    (Some(_), _, true) => Some("an override holds at the home, which a region's share, decided there alone, would not follow; remove `overrides` or `region_share`"),
                    _ => None,
                };
                if let Some(why) = why {
                    return Err(invalid("region_share", why));
                }
                let pool = Pool::of(&policy, MAX_POOL_MS)?;
                Some(Pool { share, ..pool })
            }
            Some(other) => {
                return Err(invalid(
                    "regions",
                    format!("`{other}` is not a way to keep a rule across regions; the one there is is \"shared\""),
                ))
            }
        };
        let except_ips = raw
            .except_ips
            .iter()
            .map(|c| Cidr::parse(c).map_err(|why| invalid("except_ips", why)))
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
            mode,
            fail: raw.fail.unwrap_or(FailMode::Closed),
            budget_ms,
            deny_body,
            count_status,
            penalty_ms,
            cost_header,
            lease,
            overrides: raw.overrides.unwrap_or(false),
            except_ips,
            form: ClientForm::Readable,
            shared,
        })
    }
}

fn methods(written: &[String]) -> Result<Vec<String>, FieldError> {
    written
        .iter()
        .map(|m| {
            method(m).ok_or_else(|| invalid("methods", format!("`{m}` is not an HTTP method")))
        })
        .collect()
}

/// The key parts, those named in `fold` folded.
fn key(written: &[String], fold: &[String]) -> Result<Vec<KeyPart>, FieldError> {
    if written.is_empty() {
        return Err(invalid("key", "give at least one part, e.g. [\"ip\"]"));
    }
    let mut key = written
        .iter()
        .map(|k| key_part(k))
        .collect::<Result<Vec<_>, _>>()?;
    for name in fold {
        let i = written.iter().position(|k| k == name).ok_or_else(|| {
            invalid(
                "fold",
                format!("`{name}` is not one of this rule's key parts"),
            )
        })?;
        let part = std::mem::replace(&mut key[i], KeyPart::Ip);
        key[i] = KeyPart::Folded(Box::new(part));
    }
    Ok(key)
}

fn budget(written: Option<&RawDuration>) -> Result<u64, FieldError> {
    let budget_ms = match written {
        None => DEFAULT_BUDGET_MS,
        Some(b) => duration("budget", b)?,
    };
    if !(10..=30_000).contains(&budget_ms) {
        return Err(invalid("budget", "must be between 10ms and 30s"));
    }
    Ok(budget_ms)
}

/// The rule's lease, if it asks for one. A shadow rule reports every
/// denial it would make and a `count_status` rule gives charges back per
/// response, so both are decided in Redis on every request.
fn lease(
    units: Option<u64>,
    lease_for: Option<&RawDuration>,
    policy: &Policy,
    mode: Mode,
    count_status: &[u16],
) -> Result<Option<Lease>, FieldError> {
    let Some(units) = units else {
        return match lease_for {
            Some(_) => Err(invalid(
                "lease_for",
                "needs `lease` (the units a lease may hold)",
            )),
            None => Ok(None),
        };
    };
    if mode == Mode::Shadow {
        return Err(invalid("lease", "a shadow rule is decided in Redis on every request, so it reports every denial it would make; remove `lease` or `mode`"));
    }
    if !count_status.is_empty() {
        return Err(invalid("lease", "a `count_status` rule is charged and refunded per response, in Redis; remove `lease` or `count_status`"));
    }
    let for_ms = lease_for.map(|d| duration("lease_for", d)).transpose()?;
    Ok(Some(Lease::new(policy, units, for_ms)?))
}

/// The response header a rule's cost is settled from, where the charge
/// up front can be settled exactly.
fn cost_header(name: String, policy: &Policy, count_status: &[u16]) -> Result<String, FieldError> {
    let [name] = header_names("cost_header", &[name])?
        .try_into()
        .expect("one name, one name");
    let algorithm = policy.algorithm();
    let why = if algorithm.released() {
        Some("an in-flight limit counts requests, not their cost: its slot is given back whole")
    } else if algorithm.max_delay_ms() > 0 {
        Some("a delaying rule reserved an instant for the estimate, which a settlement afterwards cannot move; remove `on_limit` or `cost_header`")
    } else if !count_status.is_empty() {
        Some("a `count_status` rule already settles its charge by the response's status; remove one of them")
    } else {
        None
    };
    match why {
        Some(why) => Err(invalid("cost_header", why)),
        None => Ok(name),
    }
}

fn penalty(written: &RawDuration) -> Result<u64, FieldError> {
    Some(duration("penalty", written)?)
        .filter(|ms| *ms <= MAX_DURATION_MS)
        .ok_or_else(|| invalid("penalty", "must be between 1ms and 366d"))
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
        Err(invalid(
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
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !ok {
        // A port never matches: requests are compared by host name alone.
        return Err(invalid(
            "host",
            format!("`{h}` is not a host name without a port (use example.com or *.example.com)"),
        ));
    }
    Ok(canon::normalize_host(&h))
}

/// A path prefix or pattern, case folded and each segment as
/// [`canon::path_segment`] reads it: paths are compared after
/// [`canon::normalize_path`], which does the same to them.
fn path_pattern(field: &str, p: String) -> Result<String, FieldError> {
    if !p.starts_with('/') {
        return Err(invalid(field, format!("`{p}` must start with /")));
    }
    let segments: Vec<_> = p.split('/').map(canon::path_segment).collect();
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
                Err(invalid(field, format!("`{n}` is not a header name")))
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
        invalid(
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
        return Err(invalid(
            "count_status",
            "give at least one status, e.g. [401, 403]",
        ));
    }
    match list.iter().find(|s| !(100..=599).contains(*s)) {
        Some(bad) => Err(invalid(
            "count_status",
            format!("{bad} is not an HTTP status (100 to 599)"),
        )),
        None => Ok(list),
    }
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
                        invalid(
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
        (None, Some(_)) => Err(invalid("deny_content_type", "goes with deny_body")),
        (Some(body), content_type) => {
            let content_type = content_type.unwrap_or_else(|| "text/plain; charset=utf-8".into());
            if content_type.is_empty() || content_type.contains(['\r', '\n']) {
                return Err(invalid(
                    "deny_content_type",
                    format!("`{content_type}` is not a media type"),
                ));
            }
            Ok(Some(DenyBody { body, content_type }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::policy::{Concurrency, Gcra, Window, Windows};
    use serde_json::json;
    use std::borrow::Cow;

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
    fn stats_settings_are_checked_and_errors_name_the_field() {
        let with = |extra: Value| {
            let rule =
                json!({"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1s"});
            let mut c = json!({ "rules": [rule] });
            c.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            Config::from_json(&c)
        };
        assert_eq!(with(json!({})).unwrap().stats, None, "off unless asked for");
        assert_eq!(
            with(json!({"stats": true})).unwrap().stats,
            Some(StatsSettings::default())
        );
        assert_eq!(
            with(
                json!({"stats": true, "stats_every": "1s", "stats_keep": "2d",
                "stats_clients": "hash"})
            )
            .unwrap()
            .stats,
            Some(StatsSettings {
                every_ms: 1000,
                keep_ms: 2 * 86_400_000,
                clients: StatsClients::Hash
            })
        );
        assert_eq!(
            with(json!({"stats": false, "stats_every": "1s"}))
                .unwrap()
                .stats,
            None
        );
        for (extra, field, says) in [
            (json!({"stats": "yes"}), "stats", "true or false"),
            (
                json!({"stats_every": "1s"}),
                "stats_every",
                "`stats = true`",
            ),
            (
                json!({"stats": true, "stats_every": "500ms"}),
                "stats_every",
                "between 1s and 1h",
            ),
            (
                json!({"stats": true, "stats_every": "2h"}),
                "stats_every",
                "between 1s and 1h",
            ),
            (
                json!({"stats": true, "stats_every": "often"}),
                "stats_every",
                "not a duration",
            ),
            (
                json!({"stats": true, "stats_keep": "30m"}),
                "stats_keep",
                "between 1h and 366d",
            ),
            (
                json!({"stats": true, "stats_keep": "400d"}),
                "stats_keep",
                "between 1h and 366d",
            ),
            (
                json!({"stats": true, "stats_clients": "ip"}),
                "stats_clients",
                "\"key\", \"hash\"",
            ),
        ] {
            match with(extra.clone()) {
                Err(e @ ConfigError::Field { .. }) => {
                    let shown = e.to_string();
                    assert!(
                        shown.contains(&format!("field `{field}`")),
                        "{extra}: {shown}"
                    );
                    assert!(shown.contains(says), "{extra}: {shown}");
                }
                other => panic!("{extra}: {other:?}"),
            }
        }
        let unknown = with(json!({"stat": true})).unwrap_err().to_string();
        assert!(unknown.contains("`stats_every`"), "{unknown}");
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
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1s", "windows": []}),
                "rule `a`, field `windows`: belongs to algorithm \"windowed\"; GCRA takes rate, period, burst, on_limit and max_delay",
            ),
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "windowed", "burst": 2, "windows": [["1s", 5, "1s"]]}),
                "rule `a`, field `burst`: belongs to algorithm \"gcra\"; windowed takes windows",
            ),
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "leaky"}),
                "rule `a`, field `algorithm`: `\"leaky\"` is not one of \"gcra\", \"windowed\", \"concurrency\"",
            ),
            (
                json!({"name": "a", "key": ["ip"], "algorithm": "gcra", "rat": 1}),
                "rule `a`, field `(rule)`: unknown field `rat`, expected one of `name`, `key`, `fold`, `algorithm`, `rate`, `period`, `burst`, `on_limit`, `max_delay`, `windows`, `limit`, `hold_for`, `host`",
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
        assert_eq!(
            r.path.as_ref().map(PathPattern::as_str),
            Some("/api/*/items")
        );
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
            // Requests are compared by host name alone: a port never matches.
            ("host", json!("example.com:8443")),
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

    #[test]
    fn an_in_flight_rule_has_its_defaults_and_refuses_what_cannot_apply() {
        let rule = |extra: Value| {
            let mut r = json!({"name": "f", "key": ["ip"], "algorithm": "concurrency", "limit": 4});
            r.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            one_rule(r)
        };
        let c = rule(json!({})).unwrap();
        assert_eq!(
            c.rules[0].policy,
            Policy::Concurrency(Concurrency::new(4, 60_000).unwrap())
        );
        assert!(c.rules[0].policy.algorithm().released());
        for (extra, says) in [
            (
                json!({"lease": 2}),
                "field `lease`: an in-flight limit takes no lease",
            ),
            (
                json!({"count_status": [401]}),
                "field `count_status`: does not apply",
            ),
            (
                json!({"limit": 0}),
                "field `limit`: must be between 1 and 1000000",
            ),
            (
                json!({"hold_for": "500ms"}),
                "field `hold_for`: must be between 1s and 1h",
            ),
            (
                json!({"hold_for": "2h"}),
                "field `hold_for`: must be between 1s and 1h",
            ),
            (
                json!({"burst": 2}),
                "field `burst`: belongs to algorithm \"gcra\"",
            ),
        ] {
            let e = rule(extra.clone()).unwrap_err().to_string();
            assert!(e.contains(says), "{extra}: {e}");
        }
        let e = one_rule(json!({"name": "f", "key": ["ip"], "algorithm": "concurrency"}));
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("field `limit`: is required"));
    }

    #[test]
    fn a_delaying_rule_is_gcra_only_leases_nothing_and_waits_at_most_30s() {
        let rule = |extra: Value| {
            let mut r = json!({"name": "d", "key": ["ip"], "algorithm": "gcra", "rate": 5,
                "period": "1s", "on_limit": "delay"});
            r.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            one_rule(r)
        };
        let delayed = |c: Config| c.rules[0].policy.algorithm().max_delay_ms();
        assert_eq!(delayed(rule(json!({})).unwrap()), 1000, "the default");
        assert_eq!(delayed(rule(json!({"max_delay": "30s"})).unwrap()), 30_000);
        assert_eq!(delayed(rule(json!({"on_limit": "deny"})).unwrap()), 0);
        for (extra, says) in [
            (
                json!({"max_delay": "31s"}),
                "field `max_delay`: must be between 1ms and 30s",
            ),
            (
                json!({"max_delay": 0}),
                "field `max_delay`: must be longer than zero",
            ),
            (
                json!({"on_limit": "deny", "max_delay": "1s"}),
                "field `max_delay`: needs `on_limit = \"delay\"`",
            ),
            (
                json!({"on_limit": "queue"}),
                "field `on_limit`: `queue` is neither",
            ),
            (
                json!({"lease": 2}),
                "field `lease`: a delaying rule reserves",
            ),
        ] {
            let e = rule(extra.clone()).unwrap_err().to_string();
            assert!(e.contains(says), "{extra}: {e}");
        }
        let windowed = json!({"name": "w", "key": ["ip"], "algorithm": "windowed",
            "windows": [["1m", 10, "1s"]], "on_limit": "delay"});
        let e = one_rule(windowed).unwrap_err().to_string();
        assert!(
            e.contains("field `on_limit`: a windowed rule cannot delay exactly"),
            "{e}"
        );
    }

    #[test]
    fn a_cost_header_is_a_header_name_on_a_rule_that_can_settle_exactly() {
        let rule = |extra: Value| {
            let mut r = json!({"name": "c", "key": ["ip"], "algorithm": "gcra", "rate": 5,
                "period": "1s", "cost_header": "X-Cost"});
            r.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            one_rule(r)
        };
        let c = rule(json!({})).unwrap();
        assert_eq!(c.rules[0].cost_header.as_deref(), Some("x-cost"));
        let windowed = json!({"algorithm": "windowed", "windows": [["1m", 10, "1s"]], "rate": null, "period": null});
        assert!(rule(windowed).is_ok());
        for (extra, says) in [
            (
                json!({"cost_header": "X Cost"}),
                "field `cost_header`: `X Cost` is not a header name",
            ),
            (
                json!({"count_status": [401]}),
                "field `cost_header`: a `count_status` rule",
            ),
            (
                json!({"on_limit": "delay"}),
                "field `cost_header`: a delaying rule",
            ),
            (json!({"lease": 1}), "field `lease`: a `cost_header` rule"),
            (
                json!({"algorithm": "concurrency", "limit": 2, "rate": null, "period": null}),
                "field `cost_header`: an in-flight limit",
            ),
        ] {
            let e = rule(extra.clone()).unwrap_err().to_string();
            assert!(e.contains(says), "{extra}: {e}");
        }
    }

    #[test]
    fn a_lease_is_checked_against_the_rule() {
        let base = json!({"name": "a", "key": ["ip"], "algorithm": "gcra", "rate": 10,
            "period": "1s", "burst": 50, "lease": 8});
        let with = |extra: Value| {
            let mut r = base.clone();
            r.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            one_rule(r).map_err(|e| e.to_string())
        };
        let lease = with(json!({"lease_for": "2s"})).unwrap().rules[0].lease;
        assert_eq!(lease.map(|l| (l.units, l.for_ms)), Some((8, 2000)));
        for (extra, field) in [
            (json!({"lease_for": "4s"}), "lease_for"),
            (json!({"lease": 30}), "lease"),
            (json!({"mode": "shadow"}), "lease"),
            (json!({"count_status": [401]}), "lease"),
            (json!({"lease": null, "lease_for": "1s"}), "lease_for"),
        ] {
            let msg = with(extra.clone()).unwrap_err();
            assert!(
                msg.starts_with(&format!("rule `a`, field `{field}`")),
                "{extra}: {msg}"
            );
        }
    }

    fn parse_duration(v: Value) -> Result<u64, String> {
        let raw = RawDuration::from_json(&v)?;
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
    fn the_configuration_says_what_a_request_needs_before_it_is_decided() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "api", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1s", "path_prefix": "/api"},
            {"name": "geo", "key": ["cf:country"], "algorithm": "gcra", "rate": 1, "period": "1s",
             "methods": ["DELETE"]}
        ]}))
        .unwrap();
        let form = (
            "content-type".to_owned(),
            "application/x-www-form-urlencoded".to_owned(),
        );
        let mut post = RequestMeta::new("POST", "example.com", "/x", None, [form]);
        assert!(c.needs_body(&post), "its _method may name DELETE");
        assert!(!c.needs_cf(&post), "no rule matches it yet");
        post.body = Some(b"_method=DELETE".to_vec());
        assert!(c.needs_cf(&post), "the body made the DELETE rule match");
        let get = RequestMeta::new("GET", "example.com", "/api", None, []);
        assert!(!c.needs_body(&get) && !c.needs_cf(&get));
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

    #[test]
    fn headers_read_are_every_header_the_rules_read() {
        let rule = |name: &str, extra: Value| {
            let mut r = json!({"name": name, "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s"});
            r.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            r
        };
        let rules = [
            rule("with", json!({"with_headers": ["X-Tenant"]})),
            rule("without", json!({"without_headers": ["x-internal"]})),
            rule("deletes", json!({"methods": ["DELETE"]})),
            rule(
                "keys",
                json!({"key": ["ip", "header:X-Api-Key", "header:x-forwarded-for", "header:authorization", "header:x-user", "cookie:sid", "user-agent", "form:user", "query:q"], "fold": ["header:x-user"]}),
            ),
        ];
        let sent = [
            ("cf-connecting-ip", "203.0.113.9"),
            ("content-type", "application/x-www-form-urlencoded"),
            ("x-http-method-override", "DELETE"),
            ("x-http-method", "PATCH"),
            ("x-method-override", "OPTIONS"),
            ("x-tenant", "t"),
            ("x-internal", "1"),
            ("x-api-key", "k1"),
            ("x-forwarded-for", "198.51.100.1, 10.0.0.1"),
            ("authorization", "Bearer tok"),
            ("x-user", " Alice "),
            ("cookie", "sid=s1"),
            ("user-agent", "UA/1"),
            ("x-noise", "n"),
            ("accept", "*/*"),
        ];
        // Each rule alone, so that no header one reads hides another's
        // omission, then all together.
        let configs = rules
            .iter()
            .map(|r| json!({ "rules": [r] }))
            .chain([json!({ "rules": rules })]);
        for config in configs {
            let c = Config::from_json(&config).unwrap();
            // What the rules make of the request with the headers `keep` keeps.
            let decided = |keep: &dyn Fn(&str) -> bool| {
                let headers = sent
                    .iter()
                    .filter(|(n, _)| keep(n))
                    .map(|(n, v)| (n.to_string(), v.to_string()));
                let mut req = RequestMeta::new("POST", "example.com", "/api", Some("q=1"), headers);
                req.body = Some(b"user=u1&_method=PUT".to_vec());
                let rules: Vec<_> = c
                    .rules
                    .iter()
                    .map(|r| {
                        let id = r.identifier(&req);
                        let id = id.map(|parts| {
                            parts.into_iter().map(Cow::into_owned).collect::<Vec<_>>()
                        });
                        (r.matches(&req), r.needs_body(&req), id)
                    })
                    .collect();
                (req.methods().to_vec(), rules)
            };
            let names = c.headers_read();
            let read = |n: &str| names.iter().any(|m| m == n);
            assert_eq!(decided(&read), decided(&|_| true), "{config}");
            // Each matters to this request: none is listed for nothing.
            for name in &names {
                assert_ne!(
                    decided(&|n| n != name && read(n)),
                    decided(&|_| true),
                    "{name} in {config}"
                );
            }
            assert!(!read("x-noise") && !read("accept"));
        }
    }
}
