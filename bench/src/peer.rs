//! `@upstash/ratelimit`'s scripts, read at run time from the installed npm
//! package by `bench/node/peer-scripts.mjs`, with the exact KEYS and ARGV the
//! library sends for a given policy.

use std::process::Command;

use serde_json::Value;

use crate::stack::repo;

/// One script call as the peer library makes it.
#[derive(Debug, Clone)]
pub struct PeerCall {
    pub label: String,
    /// The source, shebang included, as the package holds it.
    pub source: String,
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

/// The installed package's version, for the report.
pub fn version(package: &str) -> String {
    let manifest = repo()
        .join("node_modules")
        .join(package)
        .join("package.json");
    std::fs::read_to_string(manifest)
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|v| v["version"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// Calls `{label: [factory, ...arguments]}`, e.g.
/// `{"sw": ["slidingWindow", 10, "10 s"]}`, once each and records them.
pub fn capture(wanted: &Value) -> Result<Vec<PeerCall>, String> {
    let output = Command::new("node")
        .arg(repo().join("bench/node/peer-scripts.mjs"))
        .arg(wanted.to_string())
        .current_dir(repo())
        .output()
        .map_err(|e| format!("cannot run node: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "reading @upstash/ratelimit's scripts failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    parse(&String::from_utf8_lossy(&output.stdout))
}

fn parse(text: &str) -> Result<Vec<PeerCall>, String> {
    let bad = |why: &str| format!("peer-scripts.mjs printed {why}: {text:.200}");
    let items: Vec<Value> = serde_json::from_str(text).map_err(|_| bad("no JSON array"))?;
    let strings = |v: &Value| -> Option<Vec<String>> {
        v.as_array()?
            .iter()
            .map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    items
        .iter()
        .map(|item| {
            Some(PeerCall {
                label: item["label"].as_str()?.to_owned(),
                source: item["source"].as_str()?.to_owned(),
                keys: strings(&item["keys"])?,
                args: strings(&item["args"])?,
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("an entry without label, source, keys or args"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_helpers_output() {
        let calls = parse(
            r#"[{"label":"sw","source":"return 1","sha1":"ab","keys":["k1","k2"],"args":["5","60000"]}]"#,
        )
        .unwrap();
        assert_eq!(calls[0].label, "sw");
        assert_eq!(calls[0].keys, ["k1", "k2"]);
        assert_eq!(calls[0].args, ["5", "60000"]);
        assert!(parse(r#"[{"label":"sw"}]"#).is_err());
        assert!(parse("oops").is_err());
    }
}
