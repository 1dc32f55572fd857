//! `edge-limiter inspect` and `reset`: where one client stands on one rule,
//! and forgetting it, against the deployment's own Redis REST endpoint. The
//! client is named by its key-part values and keyed by the worker's code.

use std::time::Duration;

use serde_json::{json, Value};

use crate::{
    decision::{
        outcomes::verdict::{OverrideRead, OverrideSource, Retry, RuleState, Verdict},
        transport::keys::{penalty_key, pool_key, rule_key, rule_wide_key, shown_form},
        transport::protocol::{
            read_rule_wide, run, Check, Reply, ScriptCall, ScriptError, WideRead,
        },
        transport::redis_rest::{RestClient, RestError},
    },
    rules::{
        canon,
        client_form::ClientForm,
        config::Config,
        overrides::{Override, BLOCK_TEXT},
        request::RequestMeta,
        rule::{KeyPart, Rule},
    },
};

pub use crate::rules::regions::{TOKEN_VAR, URL_VAR};

/// How long one inspect or reset call may take.
const BUDGET: Duration = Duration::from_secs(10);

/// Why inspect or reset could not answer. No message carries the token.
#[derive(Debug)]
#[non_exhaustive]
pub enum InspectError {
    /// A setting is missing: names it, and where it was looked for.
    Missing(String),
    /// No rule of that name in the configuration.
    UnknownRule {
        /// The name asked for.
        rule: String,
        /// The names there are.
        known: Vec<String>,
    },
    /// The values do not fit the rule's key parts.
    Values {
        /// The rule.
        rule: String,
        /// What is wrong.
        problem: String,
    },
    /// The script call failed (its message names the setting to check).
    Script(ScriptError),
}

impl std::fmt::Display for InspectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InspectError::Missing(var) => write!(
                f,
                "{var} is not set: set it in the environment or in .dev.vars in this directory"
            ),
            InspectError::UnknownRule { rule, known } => write!(
                f,
                "no rule `{rule}` in the configuration; its rules are: {}",
                known.join(", ")
            ),
            InspectError::Values { rule, problem } => write!(f, "rule `{rule}`: {problem}"),
            InspectError::Script(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for InspectError {}

impl From<ScriptError> for InspectError {
    fn from(e: ScriptError) -> InspectError {
        InspectError::Script(e)
    }
}

impl From<RestError> for InspectError {
    fn from(e: RestError) -> InspectError {
        InspectError::Script(ScriptError::Store(e))
    }
}

/// `KEY=VALUE` lines as wrangler reads `.dev.vars`: blank lines and `#`
/// comments skipped, an optional `export `, values optionally quoted.
pub fn parse_dev_vars(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let k = k.trim().trim_start_matches("export ").trim();
            let v = v.trim();
            let unquoted = ['"', '\'']
                .iter()
                .find_map(|q| v.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
                .unwrap_or(v);
            (k.to_owned(), unquoted.to_owned())
        })
        .collect()
}

/// The REST URL and token the settings `vars` name (the home's are
/// [`URL_VAR`] and [`TOKEN_VAR`]): from `env` (the environment), or else
/// from the text of `.dev.vars`, as wrangler does.
pub fn settings(
    env: impl Fn(&str) -> Option<String>,
    dev_vars: Option<&str>,
    vars: (&str, &str),
) -> Result<(String, String), InspectError> {
    let get = |var: &str| setting(&env, dev_vars, var).ok_or(InspectError::Missing(var.to_owned()));
    Ok((get(vars.0)?, get(vars.1)?))
}

/// The setting `var`: from `env` (the environment), or else from the text
/// of `.dev.vars`, as wrangler does; `None` where neither gives it.
pub fn setting(
    env: impl Fn(&str) -> Option<String>,
    dev_vars: Option<&str>,
    var: &str,
) -> Option<String> {
    let file = dev_vars.map(parse_dev_vars).unwrap_or_default();
    env(var).filter(|v| !v.is_empty()).or_else(|| {
        let found = file.into_iter().rev().find(|(k, _)| k == var);
        found.map(|(_, v)| v).filter(|v| !v.is_empty())
    })
}

/// The rule named `name` in `config`.
pub fn find_rule<'c>(config: &'c Config, name: &str) -> Result<&'c Rule, InspectError> {
    config
        .rules
        .iter()
        .find(|r| r.name == name)
        .ok_or_else(|| InspectError::UnknownRule {
            rule: name.to_owned(),
            known: config.rules.iter().map(|r| r.name.clone()).collect(),
        })
}

/// The client's identifier under `rule`, from its key-part values, as the
/// worker derives it.
pub fn identifier(rule: &Rule, values: &[&str]) -> Result<Vec<String>, InspectError> {
    let problem = |problem: String| InspectError::Values {
        rule: rule.name.clone(),
        problem,
    };
    if rule.form == ClientForm::Shown {
        return match values {
            [shown] => Ok(vec![(*shown).to_owned()]),
            _ => Err(problem("name the client once, as `stats` shows it".into())),
        };
    }
    let request = request_with_key(rule, values).map_err(|e| problem(e.to_string()))?;
    let id = rule
        .identifier(&request)
        .map_err(|a| problem(format!("`{}` is given twice with different values", a.part)))?;
    Ok(id.into_iter().map(|p| p.into_owned()).collect())
}

/// `rule` with its clients named as its keys, and so `stats` and its page,
/// show them: `shown` is then the one value [`identifier`] takes. Refused
/// where no key of the rule's `stats_clients` form could show it.
pub fn as_shown(rule: &Rule, shown: &str) -> Result<Rule, InspectError> {
    let plain_parts = shown.split('|').count();
    let fits = match rule.form {
        ClientForm::Readable if !shown.starts_with('#') => plain_parts == rule.key.len(),
        _ => true,
    };
    if !fits || !shown_form(&rule.form, shown) {
        let form = match rule.form {
            ClientForm::Hashed => "`#` and 40 hex digits (stats_clients = \"hash\")",
            ClientForm::Keyed(_) => "`~` and 40 hex digits (stats_clients = \"hmac\")",
            _ => "the key's parts joined by `|`, or `#` and 40 hex digits",
        };
        return Err(InspectError::Values {
            rule: rule.name.clone(),
            problem: format!(
                "`{shown}` is not a client as this rule's stats show one: {form}; copy it from `stats` or its page"
            ),
        });
    }
    Ok(Rule {
        form: ClientForm::Shown,
        ..rule.clone()
    })
}

/// A request carrying `values` as this rule's key parts, in order, each
/// spelled as a client would send it (a query value or cookie as it
/// appears on the wire). [`Rule::identifier`] of it is the identifier the
/// worker derives for such a client, so that naming a client by its values
/// reaches the worker's key.
pub fn request_with_key(rule: &Rule, values: &[&str]) -> Result<RequestMeta, WrongValueCount> {
    if values.len() != rule.key.len() {
        return Err(WrongValueCount {
            parts: rule.key.clone(),
            given: values.len(),
        });
    }
    let mut req = RequestMeta {
        method: "GET".to_owned(),
        path: "/".to_owned(),
        ..RequestMeta::default()
    };
    let mut query = Vec::new();
    let mut form = Vec::new();
    let mut json = serde_json::Value::Null;
    for (part, value) in rule.key.iter().zip(values) {
        put(part, value, &mut req, &mut query, &mut form, &mut json);
    }
    if !query.is_empty() {
        req.query = Some(query.join("&"));
    }
    if !json.is_null() {
        req.body = serde_json::to_vec(&json).ok();
    } else if !form.is_empty() {
        req.body = Some(form.join("&").into_bytes());
        req.headers.push((
            "content-type".to_owned(),
            "application/x-www-form-urlencoded".to_owned(),
        ));
    }
    Ok(req)
}

/// Puts `value` where a client's request would carry `part`.
fn put(
    part: &KeyPart,
    value: &str,
    req: &mut RequestMeta,
    query: &mut Vec<String>,
    form: &mut Vec<String>,
    json: &mut serde_json::Value,
) {
    let header = |name: &str| (name.to_owned(), value.to_owned());
    match part {
        KeyPart::Ip => req.headers.push(header("cf-connecting-ip")),
        KeyPart::Header(name) => req.headers.push(header(name)),
        KeyPart::Cookie(name) => req
            .headers
            .push(("cookie".to_owned(), format!("{name}={value}"))),
        KeyPart::Query(name) => query.push(format!("{name}={value}")),
        KeyPart::Path => req.path = canon::normalize_path(value),
        KeyPart::UserAgent => req.headers.push(header("user-agent")),
        KeyPart::Cf(field) => req.cf.push((*field, value.to_owned())),
        KeyPart::Form(name) => form.push(format!("{name}={value}")),
        KeyPart::Json(pointer) => {
            // The document {"a": {"b": value}} for the pointer /a/b.
            let mut at = json;
            for token in pointer.split('/').skip(1) {
                let token = token.replace("~1", "/").replace("~0", "~");
                if !at.is_object() {
                    *at = serde_json::Value::Object(Default::default());
                }
                at = at
                    .as_object_mut()
                    .expect("made an object just above")
                    .entry(token)
                    .or_insert(serde_json::Value::Null);
            }
            *at = serde_json::Value::String(value.to_owned());
        }
        KeyPart::Folded(inner) => put(inner, value, req, query, form, json),
    }
}

/// Values given for a rule's key parts that do not match them one to one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrongValueCount {
    /// The rule's key parts, in order.
    pub parts: Vec<KeyPart>,
    /// How many values were given.
    pub given: usize,
}

impl std::fmt::Display for WrongValueCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.parts.iter().map(ToString::to_string).collect();
        write!(
            f,
            "the rule is keyed on [{}]: give {} value(s), one per part in that order, not {}",
            parts.join(", "),
            parts.len(),
            self.given
        )
    }
}

impl std::error::Error for WrongValueCount {}

/// One window's standing (GCRA: the one state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowStanding {
    /// What the window is: `gcra 5/1000ms burst 5`, `window 60000ms by 1000ms`.
    pub label: String,
    /// Units it allows (GCRA: the burst).
    pub limit: u64,
    /// Units left now.
    pub remaining: u64,
    /// Milliseconds until it holds nothing again (GCRA: until the burst is full).
    pub reset_after_ms: u64,
}

/// Where one client stands on one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientState {
    /// The rule.
    pub rule: String,
    /// The client's identifier, canonical, one part per key part.
    pub client: Vec<String>,
    /// The Redis key holding its state.
    pub key: String,
    /// Per window, or the one GCRA state.
    pub windows: Vec<WindowStanding>,
    /// Milliseconds left of a running penalty, if one runs.
    pub penalty_ms: Option<u64>,
    /// The client's own override, as its key holds it, when the rule takes
    /// overrides and the key holds one (or something that is none).
    pub overridden: Option<String>,
    /// For an in-flight rule, each slot held: milliseconds until it is
    /// free if its release never comes, soonest first.
    pub slots_ms: Option<Vec<u64>>,
    /// For a shared rule, the pool each region other than the home holds.
    pub pools: Vec<PoolStanding>,
}

/// What a region's Redis holds of a shared rule's pool for one client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStanding {
    /// The region.
    pub region: String,
    /// Units it may still spend.
    pub units: u64,
    /// Milliseconds until the last of them lapses (0: none held).
    pub lasts_ms: u64,
}

/// The pool `region`'s Redis (`client`) holds of the client's state `key`
/// on a shared rule, read with `TIME` and `GET`, so that nothing changes.
/// The eight numbers are `lua/pool.lua`'s, the lapsed tranches not counted.
pub async fn pool_in(
    client: &RestClient,
    region: &str,
    key: &str,
) -> Result<PoolStanding, InspectError> {
    let commands = [
        vec!["TIME".to_owned()],
        vec!["GET".to_owned(), pool_key(key)],
    ];
    let replies = client.pipeline(&commands, BUDGET).await?;
    let mut replies = replies.into_iter();
    let time = replies.next().transpose()?.unwrap_or_default();
    let stored = replies.next().transpose()?.unwrap_or_default();
    let seconds = |i: usize| time[i].as_str().and_then(|t| t.parse::<u64>().ok());
    let now_us = match (seconds(0), seconds(1)) {
        (Some(s), Some(us)) => s * 1_000_000 + us,
        _ => {
            let why = format!("{time} for TIME");
            return Err(InspectError::Script(ScriptError::Reply(why)));
        }
    };
    let numbers: Vec<u64> = (stored.as_str().unwrap_or(""))
        .split(' ')
        .filter_map(|n| n.parse().ok())
        .collect();
    let (mut units, mut last_us) = (0, now_us);
    if let [a, a_ends, b, b_ends, ..] = numbers[..] {
        for (n, ends) in [(a, a_ends), (b, b_ends)] {
            if n > 0 && ends > now_us {
                units += n;
                last_us = last_us.max(ends);
            }
        }
    }
    Ok(PoolStanding {
        region: region.to_owned(),
        units,
        lasts_ms: (last_us - now_us).div_ceil(1000),
    })
}

impl ClientState {
    /// The standing as text, a line per window.
    pub fn render(&self) -> String {
        let mut out = format!(
            "rule `{}`, client {} (key {}):\n",
            self.rule,
            self.client.join(" | "),
            self.key
        );
        for w in &self.windows {
            out.push_str(&format!(
                "  {}: {} of {} left, {}\n",
                w.label,
                w.remaining,
                w.limit,
                if w.reset_after_ms == 0 {
                    "nothing counted".to_owned()
                } else {
                    format!("all back in {} ms", w.reset_after_ms)
                }
            ));
        }
        out.push_str(&match self.penalty_ms {
            Some(ms) => format!("  penalty: {ms} ms left\n"),
            None => "  penalty: none\n".to_owned(),
        });
        if let Some(slots) = &self.slots_ms {
            let until: Vec<String> = slots.iter().map(|ms| format!("{ms} ms")).collect();
            out.push_str(&match slots.len() {
                0 => "  slots held: none\n".to_owned(),
                n => format!(
                    "  slots held: {n}, free when their responses end, at the latest in {}\n",
                    until.join(", ")
                ),
            });
        }
        if let Some(o) = &self.overridden {
            out.push_str(&format!("  override: {o}\n"));
        }
        for p in &self.pools {
            out.push_str(&match p.units {
                0 => format!("  pool in {}: none\n", p.region),
                n => format!(
                    "  pool in {}: {n} units, {} ms left\n",
                    p.region, p.lasts_ms
                ),
            });
        }
        out
    }

    /// The standing as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "rule": self.rule,
            "client": self.client,
            "key": self.key,
            "windows": self.windows.iter().map(|w| json!({
                "window": w.label,
                "limit": w.limit,
                "remaining": w.remaining,
                "reset_after_ms": w.reset_after_ms,
            })).collect::<Vec<_>>(),
            "penalty_ms": self.penalty_ms,
            "slots_ms": self.slots_ms,
            "override": self.overridden,
            "pools": self.pools.iter().map(|p| json!({
                "region": p.region,
                "units": p.units,
                "lasts_ms": p.lasts_ms,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Where the client with these key-part values stands on `rule`, read
/// with a peek (cost 0) that consumes nothing, under the override the
/// worker would apply (the client's own, else the rule's for every client).
pub async fn inspect(
    client: &RestClient,
    rule: &Rule,
    values: &[&str],
) -> Result<ClientState, InspectError> {
    let id = identifier(rule, values)?;
    let parts: Vec<&str> = id.iter().map(String::as_str).collect();
    let split = rule.policy.algorithm().items() > 1;
    let mut policy = rule.policy.clone();
    let (mut decision, mut overridden) = (None, None);
    if rule.overrides || !split {
        let wide = rule_wide(client, rule).await?;
        // The whole rule in one peek: the override is read where it applies.
        let whole = [(Check { rule, cost: 0 }, parts.clone())];
        let peek = ScriptCall::decide(&whole, None).with_rule_wide(|_| wide.clone());
        let standing = run(client, &peek, BUDGET).await?.decision()?;
        if let Some(read) = standing.overrides.first() {
            if let Some(Override::Figures(figures)) = Override::parse(&read.text, &rule.policy) {
                policy = figures;
            }
            overridden = override_line(read, standing.rules.first());
        }
        decision = Some(standing);
    }
    // Several windows are peeked one by one, at the figures in force.
    let decision = match decision {
        Some(d) if !split => d,
        _ => {
            let in_force = Rule {
                policy: policy.clone(),
                ..rule.clone()
            };
            let peek = ScriptCall::inspect(&in_force, &parts);
            run(client, &peek, BUDGET).await?.decision()?
        }
    };
    let labels = policy.described().labels();
    let windows = labels
        .into_iter()
        .zip(&decision.rules)
        .map(|(label, s)| WindowStanding {
            label,
            limit: s.limit,
            remaining: s.remaining,
            reset_after_ms: s.reset_after_ms,
        })
        .collect();
    let key = rule_key(rule, &parts);
    // A running penalty is its key's expiry, on Redis's clock as the worker reads it.
    let penalty_ms = match rule.penalty_ms {
        Some(_) => client
            .command(&["PTTL", &penalty_key(&key)])
            .await?
            .as_i64()
            .filter(|ms| *ms > 0)
            .map(|ms| ms as u64),
        None => None,
    };
    let slots_ms = match rule.policy.algorithm().released() {
        true => Some(slots_held(client, &key).await?),
        false => None,
    };
    Ok(ClientState {
        rule: rule.name.clone(),
        client: id,
        key,
        windows,
        penalty_ms,
        overridden,
        slots_ms,
        pools: vec![],
    })
}

/// The in-flight slots `key` holds: milliseconds until each expires, on
/// Redis's clock, soonest first (`lua/concurrency.lua` scores each slot by
/// its expiry).
async fn slots_held(client: &RestClient, key: &str) -> Result<Vec<u64>, InspectError> {
    let time = client.command(&["TIME"]).await?;
    let part = |i: usize| time[i].as_str().and_then(|t| t.parse::<u64>().ok());
    let now_ms = match (part(0), part(1)) {
        (Some(s), Some(us)) => s * 1000 + us / 1000,
        _ => return Err(ScriptError::Reply(format!("TIME replied {time}")).into()),
    };
    let after = format!("({now_ms}");
    let held = (client.command(&["ZRANGEBYSCORE", key, &after, "+inf", "WITHSCORES"])).await?;
    let scores = held.as_array().map(Vec::as_slice).unwrap_or_default();
    Ok(scores
        .chunks(2)
        .filter_map(|pair| pair.get(1)?.as_str()?.parse::<u64>().ok())
        .map(|expiry| expiry.saturating_sub(now_ms))
        .collect())
}

/// The rule-wide override in force for `rule`, when it takes overrides:
/// its text and ms left (-1: no end). Read and checked as the worker's
/// isolates read it: a key holding no override of the rule is none.
async fn rule_wide(
    client: &RestClient,
    rule: &Rule,
) -> Result<Option<(String, i64)>, InspectError> {
    if !rule.overrides {
        return Ok(None);
    }
    let read = read_rule_wide(client, &[rule_wide_key(&rule.name)], BUDGET).await?;
    match read.into_iter().next() {
        Some(WideRead::Text(text, ms)) => Ok(Override::parse(&text, &rule.policy)
            .is_some()
            .then(|| (text, ms.max(-1)))),
        Some(WideRead::Failed(e)) => Err(e.into()),
        Some(WideRead::NotText) | None => Ok(None),
    }
}

/// What the override a decision read puts in force, for the standing's
/// last line; a block with its time left (`state` is the rule's).
fn override_line(read: &OverrideRead, state: Option<&RuleState>) -> Option<String> {
    let whose = match read.source {
        OverrideSource::Client => "the client's own",
        OverrideSource::Rule => "the rule's, for every client",
        OverrideSource::None if read.ignored => {
            return Some("its key holds something that is no override (ignored)".into())
        }
        OverrideSource::None => return None,
    };
    let mut line = format!("{} ({whose}", read.text);
    if read.ignored {
        line.push_str("; the client's key holds something that is no override, ignored");
    }
    line.push(')');
    if read.text == BLOCK_TEXT {
        match state.map(|s| s.verdict) {
            Some(Verdict::Denied(Retry::After { ms })) => line.push_str(&format!(", {ms} ms left")),
            _ => line.push_str(", without end"),
        }
    }
    Some(line)
}

/// What a reset removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    /// The standing just before.
    pub before: ClientState,
    /// Keys deleted (0: there was nothing to forget).
    pub deleted: u64,
}

impl Removed {
    /// What was removed, as text.
    pub fn render(&self) -> String {
        let client = self.before.client.join(" | ");
        if self.deleted == 0 {
            return format!(
                "rule `{}`, client {client}: nothing to remove (no state at {})\n",
                self.before.rule, self.before.key
            );
        }
        let mut out = format!(
            "rule `{}`, client {client}: removed {} ({} key), which held:\n",
            self.before.rule, self.before.key, self.deleted
        );
        for line in self.before.render().lines().skip(1) {
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    /// What was removed, as JSON.
    pub fn to_json(&self) -> Value {
        json!({ "deleted": self.deleted, "before": self.before.to_json() })
    }
}

/// Forgets the client's state on `rule`, a running penalty included (the
/// reset call deletes every key the rule keeps for it).
pub async fn reset(
    client: &RestClient,
    rule: &Rule,
    values: &[&str],
) -> Result<Removed, InspectError> {
    let before = inspect(client, rule, values).await?;
    let parts: Vec<&str> = before.client.iter().map(String::as_str).collect();
    let call = ScriptCall::reset(&[(rule, parts)]);
    let deleted = match run(client, &call, BUDGET).await? {
        Reply::Removed(n) => n,
        other => return Err(ScriptError::Reply(format!("{other:?} to a reset")).into()),
    };
    Ok(Removed { before, deleted })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOME: (&str, &str) = (URL_VAR, TOKEN_VAR);

    #[test]
    fn a_client_named_as_shown_reaches_its_key_and_nothing_else() {
        let config = |clients: &str| {
            let config = Config::from_json(&serde_json::json!({
                "stats": true, "stats_clients": clients,
                "rules": [{"name": "r", "algorithm": "gcra", "rate": 1, "period": "1s",
                           "key": ["ip", "header:x-api-key"]}]
            }));
            config.unwrap().keyed_by(Some(&"s".repeat(32))).unwrap()
        };
        let keyed = config("hmac");
        let rule = &keyed.rules[0];
        let id = identifier(rule, &["192.0.2.1", "k-1"]).unwrap();
        let key = rule_key(rule, &id.iter().map(String::as_str).collect::<Vec<_>>());
        let shown = crate::decision::transport::keys::client_in(&key).unwrap();
        let named = as_shown(rule, shown).unwrap();
        let again = identifier(&named, &[shown]).unwrap();
        assert_eq!(rule_key(&named, &[&again[0]]), key);
        assert!(identifier(&named, &[shown, shown]).is_err());
        for wrong in ["192.0.2.1|k-1", "#0123456789abcdef0123456789abcdef01234567"] {
            assert!(as_shown(rule, wrong).is_err(), "{wrong}");
        }
        let readable = config("key");
        let rule = &readable.rules[0];
        assert!(as_shown(rule, "192.0.2.1|k-1").is_ok());
        assert!(as_shown(rule, "192.0.2.1").is_err(), "one part of two");
        assert!(as_shown(rule, "a}b|c").is_err());
    }

    #[test]
    fn key_values_give_the_identifier_the_worker_derives() {
        let config = Config::from_json(&serde_json::json!({"rules": [{
            "name": "r", "algorithm": "gcra", "rate": 1, "period": "1s",
            "key": ["ip", "query:k", "cookie:sid", "path", "header:x-forwarded-for"]
        }]}))
        .unwrap();
        let r = &config.rules[0];
        let sent = request_with_key(
            r,
            &[
                "2001:db8::7",
                "a+b",
                "%73%33",
                "/API/x/",
                "spoofed, 10.0.0.1",
            ],
        )
        .unwrap();
        let headers = [
            ("cf-connecting-ip", "2001:db8:0:0:1::9"),
            ("cookie", "sid=s3"),
            ("x-forwarded-for", "10.0.0.1"),
        ];
        let headers = headers.map(|(n, v)| (n.to_owned(), v.to_owned()));
        let worker = RequestMeta::new("POST", "example.com", "/api/x", Some("k=a%20b"), headers);
        assert_eq!(r.identifier(&sent), r.identifier(&worker));
        let wrong = request_with_key(r, &["1.2.3.4"]).unwrap_err();
        assert_eq!(wrong.given, 1);
        assert!(wrong.to_string().contains("give 5 value(s)"), "{wrong}");
    }

    #[test]
    fn dev_vars_read_as_wrangler_reads_them() {
        let text = "# local\nUPSTASH_REDIS_REST_URL=\"http://127.0.0.1:8079\"\n\n\
                    export UPSTASH_REDIS_REST_TOKEN='t=1'\nORIGIN_URL=x\n";
        let none = |_: &str| None;
        assert_eq!(
            settings(none, Some(text), HOME).unwrap(),
            ("http://127.0.0.1:8079".to_owned(), "t=1".to_owned())
        );
        // The environment wins over the file.
        let env = |k: &str| (k == URL_VAR).then(|| "https://x.upstash.io".to_owned());
        assert_eq!(
            settings(env, Some(text), HOME).unwrap().0,
            "https://x.upstash.io"
        );
        let missing = settings(none, Some("UPSTASH_REDIS_REST_URL=u\n"), HOME).unwrap_err();
        assert_eq!(
            missing.to_string(),
            "UPSTASH_REDIS_REST_TOKEN is not set: set it in the environment or in .dev.vars in this directory"
        );
        assert!(matches!(
            settings(none, None, HOME),
            Err(InspectError::Missing(var)) if var == URL_VAR
        ));
    }

    #[test]
    fn rules_and_values_are_checked_before_any_call() {
        let config = Config::from_json(&json!({"rules": [
            {"name": "login", "key": ["ip", "cookie:sid"], "algorithm": "gcra", "rate": 5, "period": "1m"}
        ]}))
        .unwrap();
        let unknown = find_rule(&config, "logn").unwrap_err().to_string();
        assert_eq!(
            unknown,
            "no rule `logn` in the configuration; its rules are: login"
        );
        let rule = find_rule(&config, "login").unwrap();
        assert_eq!(
            identifier(rule, &["2001:db8::1", "\"s%33\""]).unwrap(),
            ["2001:db8::/64", "s3"]
        );
        let wrong = identifier(rule, &["1.2.3.4"]).unwrap_err().to_string();
        assert!(
            wrong.starts_with("rule `login`: the rule is keyed on [ip, cookie:sid]"),
            "{wrong}"
        );
    }
}
