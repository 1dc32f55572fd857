//! Validates a `wrangler.toml` before deploy with the very code the worker
//! runs: every `[vars.LIMITER]` (top level and per `[env.*]`) and `ORIGIN_URL`.

use serde_json::Value;

use crate::rules::{
    config::{parse_origin, Config, ConfigError},
    lease::Lease,
    policy::Policy,
    regions::{self, Region},
    rule::{FailMode, Mode},
    stats::StatsClients,
};

/// One environment's verdict: its name (`(top level)` or `env.NAME`) and the
/// rules it would serve, or what to fix.
pub type EnvironmentCheck = (String, Result<Config, ConfigError>);

/// Checks every environment in a `wrangler.toml`. Wrangler does not inherit
/// `vars` into environments, so each `[env.NAME]` must carry its own rules.
pub fn check_wrangler_toml(text: &str) -> Result<Vec<EnvironmentCheck>, String> {
    let doc: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("not valid TOML: {e}"))?;
    let doc = serde_json::to_value(doc).map_err(|e| e.to_string())?;
    let mut verdicts = vec![("(top level)".to_owned(), check_vars(doc.get("vars")))];
    if let Some(envs) = doc.get("env").and_then(Value::as_object) {
        for (name, env) in envs {
            verdicts.push((format!("env.{name}"), check_vars(env.get("vars"))));
        }
    }
    Ok(verdicts)
}

fn check_vars(vars: Option<&Value>) -> Result<Config, ConfigError> {
    let missing = || ConfigError::Missing("no `[vars.LIMITER]` table with `rules`".into());
    let vars = vars.ok_or_else(missing)?;
    if let Some(origin) = vars.get("ORIGIN_URL") {
        parse_origin(origin.as_str().unwrap_or_default())?;
    }
    Config::from_json(vars.get("LIMITER").ok_or_else(missing)?)
}

/// A one-line summary of each rule, and of the stats settings when stats
/// are on, for the command's report.
pub fn describe(config: &Config) -> Vec<String> {
    let stats = config.stats.map(|s| {
        let clients = match s.clients {
            StatsClients::Key => "as their key shows them",
            StatsClients::Hash => "as their hash",
            StatsClients::Hmac => "as their HMAC under the secret STATS_SECRET",
        };
        format!(
            "stats: written every {}ms per isolate, kept {}ms after each day, clients {clients}",
            s.every_ms, s.keep_ms
        )
    });
    config
        .rules
        .iter()
        .map(|r| {
            let policy = r.policy.described().describe();
            let mode = match r.mode {
                Mode::Enforce => "enforce",
                Mode::Shadow => "shadow",
            };
            let fail = match r.fail {
                FailMode::Open => "open",
                FailMode::Closed => "closed",
            };
            let mut line = format!("{}: {policy}, {mode}, fail {fail}", r.name);
            if !r.count_status.is_empty() {
                let list: Vec<String> = r.count_status.iter().map(u16::to_string).collect();
                line.push_str(&format!(", counts only statuses {}", list.join("/")));
            }
            if let Some(ms) = r.penalty_ms {
                line.push_str(&format!(", penalty {ms}ms"));
            }
            if let Some(lease) = r.lease {
                line.push_str(&lease_text(&r.policy, lease));
            }
            if let Some(pool) = r.shared {
                line.push_str(&format!(
                    ", shared across regions (pools of up to {} units for {}ms",
                    pool.most, pool.hold_ms
                ));
                if let Some(share) = pool.share {
                    line.push_str(&format!(
                        "; each region decides {} at once alone, one more per {}ms, the home the figures above",
                        share.units,
                        share.interval_us.div_ceil(1000)
                    ));
                }
                line.push(')');
            }
            if !r.except_ips.is_empty() {
                let list: Vec<String> = r.except_ips.iter().map(ToString::to_string).collect();
                line.push_str(&format!(", except {}", list.join(" ")));
            }
            line
        })
        .chain(stats)
        .chain((0..config.regions.len()).map(|at| region_line(&config.regions, at)))
        .collect()
}

/// Region `at` as the report says it: where its requests come from, and
/// the secrets its Redis is reached by.
fn region_line(regions: &[Region], at: usize) -> String {
    let r = &regions[at];
    let (url, token) = regions::secrets(regions, at);
    let places: Vec<&str> = r
        .colos
        .iter()
        .chain(&r.continents)
        .map(String::as_str)
        .collect();
    let from = match (r.home, places.is_empty()) {
        (true, true) => "every place no other region lists".to_owned(),
        (true, false) => format!("{} and every place no other region lists", places.join(" ")),
        (false, _) => places.join(" "),
    };
    let home = if r.home { " (home)" } else { "" };
    format!(
        "region {}{home}: requests from {from}, Redis at secrets {url} and {token}",
        r.name
    )
}

/// A lease as the report says it, with the largest the figures allow.
fn lease_text(policy: &Policy, lease: Lease) -> String {
    let largest = Lease::largest(policy, lease.for_ms);
    (policy.described()).describe_lease(lease.units, lease.for_ms, largest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_projects_own_wrangler_toml_is_valid() {
        let text =
            std::fs::read_to_string("wrangler.toml").expect("tests run in the package directory");
        let verdicts = check_wrangler_toml(&text).unwrap();
        for (env, v) in &verdicts {
            assert!(v.is_ok(), "{env}: {v:?}");
        }
    }

    #[test]
    fn every_environment_is_checked_and_errors_name_the_field() {
        let text = r#"
name = "x"
[vars]
ORIGIN_URL = "http://127.0.0.1:8081"
[[vars.LIMITER.rules]]
name = "a"
key = ["ip"]
algorithm = "gcra"
rate = 5
period = "1s"

[env.staging.vars]
[[env.staging.vars.LIMITER.rules]]
name = "b"
key = ["ip"]
algorithm = "windowed"
windows = [["1s", 5, "300ms"]]

[env.bare]
name = "y"
"#;
        let verdicts = check_wrangler_toml(text).unwrap();
        assert_eq!(verdicts.len(), 3);
        assert!(verdicts[0].1.is_ok());
        assert_eq!(
            describe(verdicts[0].1.as_ref().unwrap()),
            ["a: gcra 5/1000ms burst 5, enforce, fail closed"]
        );
        let leased = Config::from_json(&serde_json::json!({"rules": [
            {"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 10, "period": "1s", "burst": 50, "lease": 8},
            {"name": "w", "key": ["ip"], "algorithm": "windowed", "windows": [["1s", 21, "100ms"]], "lease": 4}
        ]}))
        .unwrap();
        assert_eq!(
            describe(&leased),
            [
                "g: gcra 10/1000ms burst 50, enforce, fail closed, lease 8 units for 1000ms (the burst allows up to 19 for that long)",
                "w: windowed 21/1000ms by 100ms, enforce, fail closed, lease 4 units for 1000ms or to the bucket's end if sooner (the limits allow up to 10)"
            ]
        );
        let of = |env: &str| {
            verdicts
                .iter()
                .find(|(e, _)| e == env)
                .unwrap()
                .1
                .as_ref()
                .unwrap_err()
                .to_string()
        };
        let bad = of("env.staging");
        assert!(
            bad.starts_with("rule `b`, field `windows[0].precision`"),
            "{bad}"
        );
        assert!(of("env.bare").contains("no `[vars.LIMITER]`"));
        assert!(check_wrangler_toml("name = ").is_err());
    }

    #[test]
    fn stats_settings_are_described_and_their_errors_named() {
        let rule = "[[vars.LIMITER.rules]]\nname = \"a\"\nkey = [\"ip\"]\nalgorithm = \"gcra\"\nrate = 5\nperiod = \"1s\"\n";
        let on = format!("[vars.LIMITER]\nstats = true\nstats_clients = \"hash\"\n{rule}");
        let verdicts = check_wrangler_toml(&on).unwrap();
        assert_eq!(
            describe(verdicts[0].1.as_ref().unwrap())[1],
            "stats: written every 30000ms per isolate, kept 604800000ms after each day, clients as their hash"
        );
        let bad = format!("[vars.LIMITER]\nstats = true\nstats_every = \"0s\"\n{rule}");
        let e = check_wrangler_toml(&bad).unwrap()[0].1.clone().unwrap_err();
        assert_eq!(
            e.to_string(),
            "LIMITER configuration, field `stats_every`: must be longer than zero"
        );
    }

    #[test]
    fn regions_are_described_with_their_secrets_and_their_errors_named() {
        let rule = "[[vars.LIMITER.rules]]\nname = \"a\"\nkey = [\"ip\"]\nalgorithm = \"gcra\"\nrate = 5\nperiod = \"1s\"\n";
        let regions = |list: &str| format!("[vars.LIMITER]\nregions = [{list}]\n{rule}");
        let good = regions(
            "{ name = \"eu\", continents = [\"EU\", \"AF\"], colos = [\"DME\"] }, { name = \"us\", home = true }",
        );
        let verdicts = check_wrangler_toml(&good).unwrap();
        let lines = describe(verdicts[0].1.as_ref().unwrap());
        assert_eq!(
            lines[1..],
            [
                "region us (home): requests from every place no other region lists, Redis at secrets UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN",
                "region eu: requests from DME EU AF, Redis at secrets UPSTASH_REDIS_REST_URL_EU and UPSTASH_REDIS_REST_TOKEN_EU",
            ]
        );
        let bad =
            regions("{ name = \"us\", home = true }, { name = \"eu\", contnents = [\"EU\"] }");
        let e = check_wrangler_toml(&bad).unwrap()[0].1.clone().unwrap_err();
        assert_eq!(
            e.to_string(),
            "LIMITER configuration, field `regions[1].contnents`: is not a region's field; a region has `name`, `home`, `continents` and `colos`"
        );
    }

    #[test]
    fn a_bad_origin_is_reported() {
        let text = "[vars]\nORIGIN_URL = \"ftp://x\"\n[vars.LIMITER]\nrules = []\n";
        let err = check_wrangler_toml(text)
            .unwrap()
            .remove(0)
            .1
            .unwrap_err()
            .to_string();
        assert!(err.contains("ORIGIN_URL"), "{err}");
    }
}
