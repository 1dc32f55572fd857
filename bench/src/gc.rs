//! V8's young-generation collections (scavenges) in part 2's bare
//! workerds, read from the line `--trace-gc-nvp` writes for each: how long
//! each stopped the isolate, and how much of what was allocated since the
//! one before was still alive. Objects that outlive a scavenge are copied,
//! and promoted by the next: the more survive, the longer every request in
//! flight waits.

use serde_json::Value;

/// The V8 flag that writes the lines read here.
pub const TRACE: &str = "--trace-gc-nvp";

/// One workerd's scavenges, in the order they ran.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scavenges {
    /// How long each stopped the isolate, ms.
    pub pauses_ms: Vec<f64>,
    /// What share of the young generation each kept, %.
    pub survived_pct: Vec<f64>,
}

/// The scavenges among `log`'s lines; every other line (the worker's
/// console, other collections, errors) is passed over.
pub fn scavenges(log: &str) -> Scavenges {
    let mut found = Scavenges::default();
    for line in log.lines() {
        let Some((_, json)) = line.split_once("GC: ") else {
            continue;
        };
        let Ok(gc) = serde_json::from_str::<Value>(json) else {
            continue;
        };
        let number = |field: &str| gc.get(field).and_then(Value::as_f64);
        if gc.get("gc").and_then(Value::as_str) != Some("s") {
            continue;
        }
        if let (Some(pause), Some(survived)) = (number("pause"), number("new_space_survive_rate")) {
            found.pauses_ms.push(pause);
            found.survived_pct.push(survived);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_scavenge_and_passes_over_the_rest() {
        let log = "\
[1:0x1:0]     1119 ms: GC: {\"pause\":1.5,\"gc\":\"s\",\"new_space_survive_rate\":47.8,\"promoted\":0}
{\"source\":\"edge-limiter\",\"action\":\"deny\"}
[1:0x1:0]     2848 ms: GC: {\"pause\":5.9,\"gc\":\"mc\",\"new_space_survive_rate\":0}
[1:0x1:0]     2900 ms: GC: {\"pause\":12.25,\"gc\":\"s\",\"new_space_survive_rate\":10}
[1:0x1:0]     2950 ms: GC: {\"pause\":
";
        let found = scavenges(log);
        assert_eq!(found.pauses_ms, [1.5, 12.25]);
        assert_eq!(found.survived_pct, [47.8, 10.0]);
    }
}
