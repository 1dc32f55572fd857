//! `edge-limiter limit`: overrides of a rule's figures, for every client or
//! for one, written, read, cleared and listed in Redis through the REST
//! endpoint with its token. Nothing a request carries can reach these keys.

use serde_json::{json, Value};

use super::{
    inspect::{identifier, InspectError},
    simulate::engine::Planned,
};
use crate::{
    decision::{
        outcomes::verdict::seconds_up,
        transport::keys::{
            client_overrides_pattern, override_key, overrides_index_key, rule_key, rule_wide_key,
        },
        transport::redis_rest::{RestClient, RestError},
    },
    rules::{config::Config, overrides::Override, policy::Policy, rule::Rule},
};

/// The override key for `values` (the rule's key parts, as a client sends
/// them), or the rule-wide one for none.
pub fn key_for(rule: &Rule, values: &[&str]) -> Result<String, InspectError> {
    if values.is_empty() {
        return Ok(rule_wide_key(&rule.name));
    }
    let id = identifier(rule, values)?;
    let parts: Vec<&str> = id.iter().map(String::as_str).collect();
    Ok(override_key(&rule_key(rule, &parts)))
}

/// Refuses a rule that does not take overrides: it would never read one.
fn taking(rule: &Rule) -> Result<(), InspectError> {
    match rule.overrides {
        true => Ok(()),
        false => Err(InspectError::Values {
            rule: rule.name.clone(),
            problem: "does not take overrides; add `overrides = true` to it and deploy".into(),
        }),
    }
}

/// One override as stored: its key, what it holds, and how long it lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The override key.
    pub key: String,
    /// The override, or `None` when the key holds something else (the
    /// worker then keeps the configured figures).
    pub read: Option<Override>,
    /// The key's text as stored.
    pub text: String,
    /// Milliseconds until it expires; `None` for never.
    pub expires_in_ms: Option<u64>,
}

impl Stored {
    /// One line: the key, what it puts in place of `configured`, and when
    /// it ends.
    pub fn render(&self, configured: &Policy) -> String {
        let what = match &self.read {
            Some(Override::Block) => "blocked".to_owned(),
            Some(Override::Figures(p)) => {
                format!(
                    "{} in place of {}",
                    p.described().figures(),
                    configured.described().figures()
                )
            }
            None => format!("not an override (ignored): {:?}", self.text),
        };
        let until = match self.expires_in_ms {
            Some(ms) => format!("for {} s more", seconds_up(ms)),
            None => "until cleared".to_owned(),
        };
        format!("{}: {what}, {until}", self.key)
    }

    /// The same as JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "key": self.key,
            "override": self.text,
            "recognised": self.read.is_some(),
            "expires_in_ms": self.expires_in_ms,
        })
    }
}

/// Stores `what` as `rule`'s override for `values` (every client for
/// none), lasting `for_ms` (for ever without).
pub async fn set(
    client: &RestClient,
    rule: &Rule,
    values: &[&str],
    what: &Override,
    for_ms: Option<u64>,
) -> Result<Stored, InspectError> {
    taking(rule)?;
    let key = key_for(rule, values)?;
    let text = what.to_text();
    let ms = for_ms.map(|ms| ms.to_string());
    let mut command = vec!["SET", key.as_str(), text.as_str()];
    if let Some(ms) = &ms {
        command.extend(["PX", ms.as_str()]);
    }
    client.command(&command).await?;
    if !values.is_empty() {
        let expires = for_ms.map(|ms| now_ms().saturating_add(ms));
        index(client, rule, &[(key.as_str(), expires)]).await?;
    }
    Ok(Stored {
        key,
        read: Some(what.clone()),
        text,
        expires_in_ms: for_ms,
    })
}

/// Milliseconds since the epoch, by this machine's clock.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Notes `keys` (each with when it expires, ms since the epoch; `None` for
/// never) in `rule`'s overrides index, which then lives as long as its
/// longest-lived entry.
async fn index(
    client: &RestClient,
    rule: &Rule,
    keys: &[(&str, Option<u64>)],
) -> Result<(), InspectError> {
    let at = overrides_index_key(&rule.name);
    let scores: Vec<String> = (keys.iter())
        .map(|(_, e)| e.map_or("+inf".to_owned(), |ms| ms.to_string()))
        .collect();
    let mut command = vec!["ZADD", at.as_str()];
    for ((key, _), score) in keys.iter().zip(&scores) {
        command.extend([score.as_str(), key]);
    }
    client.command(&command).await?;
    let last = client
        .command(&["ZRANGE", &at, "-1", "-1", "WITHSCORES"])
        .await?;
    match last.get(1).and_then(Value::as_str).map(str::parse::<u64>) {
        Some(Ok(ms)) => client.command(&["PEXPIREAT", &at, &ms.to_string()]).await?,
        // An entry that never expires: so does the index, until it is cleared.
        _ => client.command(&["PERSIST", &at]).await?,
    };
    Ok(())
}

/// `rule`'s override for `values` (every client for none), if any.
pub async fn get(
    client: &RestClient,
    rule: &Rule,
    values: &[&str],
) -> Result<Option<Stored>, InspectError> {
    taking(rule)?;
    let key = key_for(rule, values)?;
    read(client, rule, key).await
}

async fn read(
    client: &RestClient,
    rule: &Rule,
    key: String,
) -> Result<Option<Stored>, InspectError> {
    let text = match client.command(&["GET", &key]).await? {
        Value::String(text) => text,
        Value::Null => return Ok(None),
        other => other.to_string(),
    };
    let pttl = client
        .command(&["PTTL", &key])
        .await?
        .as_i64()
        .unwrap_or(-1);
    Ok(Some(Stored {
        read: Override::parse(&text, &rule.policy),
        text,
        expires_in_ms: u64::try_from(pttl).ok(),
        key,
    }))
}

/// Removes `rule`'s override for `values` (every client for none); whether
/// there was one.
pub async fn clear(
    client: &RestClient,
    rule: &Rule,
    values: &[&str],
) -> Result<bool, InspectError> {
    taking(rule)?;
    let key = key_for(rule, values)?;
    let removed = client.command(&["DEL", &key]).await?.as_u64() == Some(1);
    if !values.is_empty() {
        let at = overrides_index_key(&rule.name);
        client.command(&["ZREM", &at, &key]).await?;
    }
    Ok(removed)
}

/// Every override of `rule` in force: the rule-wide one first, then each
/// client's, from the index `limit set` keeps (its expired entries dropped
/// first), or, with `scan`, found with `SCAN` (a large database takes a
/// while) and put in the index: overrides written by a release before the
/// index are found that way once.
pub async fn list(
    client: &RestClient,
    rule: &Rule,
    scan: bool,
) -> Result<Vec<Stored>, InspectError> {
    taking(rule)?;
    let mut found = Vec::new();
    if let Some(wide) = read(client, rule, rule_wide_key(&rule.name)).await? {
        found.push(wide);
    }
    if scan {
        let scanned = scan_clients(client, rule).await?;
        let now = now_ms();
        let entries: Vec<(&str, Option<u64>)> = (scanned.iter())
            .map(|s| (s.key.as_str(), s.expires_in_ms.map(|ms| now + ms)))
            .collect();
        if !entries.is_empty() {
            index(client, rule, &entries).await?;
        }
        found.extend(scanned);
        return Ok(found);
    }
    let at = overrides_index_key(&rule.name);
    client
        .command(&["ZREMRANGEBYSCORE", &at, "-inf", &format!("({}", now_ms())])
        .await?;
    let keys = client.command(&["ZRANGE", &at, "0", "-1"]).await?;
    for key in keys
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        match read(client, rule, key.to_owned()).await? {
            Some(stored) => found.push(stored),
            // Gone sooner than noted (deleted by hand, or evicted).
            None => {
                client.command(&["ZREM", &at, key]).await?;
            }
        }
    }
    Ok(found)
}

/// Every client's override of `rule`, found with `SCAN`.
async fn scan_clients(client: &RestClient, rule: &Rule) -> Result<Vec<Stored>, InspectError> {
    let mut found = Vec::new();
    let pattern = client_overrides_pattern(&rule.name);
    let mut cursor = "0".to_owned();
    loop {
        let page = client
            .command(&["SCAN", &cursor, "MATCH", &pattern, "COUNT", "1000"])
            .await?;
        let (next, keys) = match page.as_array().map(Vec::as_slice) {
            Some([next, Value::Array(keys)]) => {
                (next.as_str().unwrap_or("0").to_owned(), keys.clone())
            }
            _ => return Err(RestError::Malformed(format!("SCAN answered {page}")).into()),
        };
        for key in keys.iter().filter_map(Value::as_str) {
            if let Some(stored) = read(client, rule, key.to_owned()).await? {
                found.push(stored);
            }
        }
        if next == "0" {
            return Ok(found);
        }
        cursor = next;
    }
}

/// The overrides of a plan for `simulate --overrides`: one JSON object a
/// line (`#` lines and blank ones skipped), naming the rule, the client
/// (its key parts as it sends them; none for every client) and the
/// figures as `limit set` takes them: `{"rule": "api", "client":
/// ["k-1"], "rate": 100, "burst": 200}`, `{"rule": "api", "limits": [50,
/// 500]}`, `{"rule": "api", "client": ["k-2"], "block": true}`. An error
/// names the line.
pub fn plan(config: &Config, text: &str) -> Result<Vec<Planned>, String> {
    let mut planned = vec![];
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |why: String| format!("line {}: {why}", n + 1);
        let v: Value = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
        let name = v["rule"].as_str().ok_or_else(|| at("no \"rule\"".into()))?;
        let rule = config
            .rules
            .iter()
            .find(|r| r.name == name)
            .ok_or_else(|| at(format!("no rule `{name}` in the configuration")))?;
        taking(rule).map_err(|e| at(e.to_string()))?;
        let values: Vec<&str> = match &v["client"] {
            Value::Null => vec![],
            Value::Array(parts) => parts.iter().filter_map(Value::as_str).collect(),
            _ => return Err(at("\"client\" takes a list of key parts".into())),
        };
        let client = match values.is_empty() {
            true => None,
            false => Some(identifier(rule, &values).map_err(|e| at(e.to_string()))?),
        };
        let what = match v.as_object() {
            _ if v["block"] == Value::Bool(true) => Override::Block,
            Some(given) => Override::changed(rule, given)
                .map_err(|e| at(format!("{}: {}", e.field, e.problem)))?,
            None => return Err(at("not a table".into())),
        };
        planned.push(Planned {
            rule: rule.name.clone(),
            client,
            text: what.to_text(),
        });
    }
    Ok(planned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_workers_and_never_a_clients_for_the_rule() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "api", "key": ["header:x-api-key"], "algorithm": "gcra", "rate": 10, "period": "1s", "overrides": true}
        ]}))
        .unwrap();
        let rule = &c.rules[0];
        assert_eq!(key_for(rule, &[]).unwrap(), "el:rule:api:o");
        assert_eq!(key_for(rule, &["k-1"]).unwrap(), "el:{k-1}:api:o");
        assert!(key_for(rule, &["a", "b"]).is_err());
    }

    #[test]
    fn a_plan_reads_one_override_a_line_and_names_a_bad_one() {
        let c = Config::from_json(&json!({"rules": [
            {"name": "api", "key": ["header:x-api-key"], "algorithm": "gcra", "rate": 10, "period": "1s", "overrides": true},
            {"name": "plain", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s"}
        ]}))
        .unwrap();
        let planned = plan(
            &c,
            "# a sale\n{\"rule\": \"api\", \"rate\": 20}\n\n{\"rule\": \"api\", \"client\": [\"k-1\"], \"block\": true}\n",
        )
        .unwrap();
        assert_eq!(planned[0].client, None);
        assert_eq!(planned[0].text, "v1 gcra 20 1000 10 50000");
        assert_eq!(planned[1].client, Some(vec!["k-1".to_owned()]));
        assert_eq!(planned[1].text, "v1 block");
        for (bad, says) in [
            (
                "{\"rule\": \"nope\", \"rate\": 1}",
                "line 1: no rule `nope`",
            ),
            (
                "{\"rule\": \"plain\", \"rate\": 1}",
                "line 1: rule `plain`: does not take overrides",
            ),
            (
                "{\"rule\": \"api\", \"rate\": 0}",
                "line 1: rate: must be at least 1",
            ),
            (
                "\n{\"rule\": \"api\", \"limits\": [1]}",
                "line 2: limits: is for windowed rules",
            ),
        ] {
            let err = plan(&c, bad).unwrap_err();
            assert!(err.starts_with(says), "{bad}: {err}");
        }
    }
}
