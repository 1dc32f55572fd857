//! `simulate --regions FILE`: how far each region's isolates are from its
//! own Redis and from the home's. The file holds one pair a line, `eu us
//! 80`: the two regions' names and the latency between them, ms each way,
//! either way round; `#` starts a comment. A region's distance to its own
//! Redis (`eu eu 2`) is 0 unless given.

use crate::rules::regions::Region;

/// Each region's distances, in the configuration's order (the home first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distances {
    /// From a region's isolates to its own Redis, ms each way.
    pub near_ms: Vec<u64>,
    /// From a region's isolates to the home's Redis, ms each way (the
    /// home's: its near distance).
    pub home_ms: Vec<u64>,
}

/// The most a latency may be: a minute each way.
const MOST_MS: u64 = 60_000;

impl Distances {
    /// `text` read against `regions`; the error names the line, or the
    /// pair that is missing.
    pub fn read(text: &str, regions: &[Region]) -> Result<Distances, String> {
        if regions.len() < 2 {
            return Err("--regions replays the configuration's `regions`, which name no region besides the home".into());
        }
        let n = regions.len();
        let mut given: Vec<Option<u64>> = vec![None; n * n];
        let index = |name: &str, line: usize| {
            regions.iter().position(|r| r.name == name).ok_or_else(|| {
                let known: Vec<&str> = regions.iter().map(|r| r.name.as_str()).collect();
                format!(
                    "line {line}: `{name}` is not a region of the configuration's: {}",
                    known.join(", ")
                )
            })
        };
        for (at, text) in text.lines().enumerate() {
            let line = at + 1;
            let words: Vec<&str> = text
                .split('#')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            let [a, b, ms] = words[..] else {
                if words.is_empty() {
                    continue;
                }
                return Err(format!(
                    "line {line}: write two regions and the ms between them, as `eu us 80`"
                ));
            };
            let (a, b) = (index(a, line)?, index(b, line)?);
            let ms = (ms.parse::<u64>().ok())
                .filter(|ms| *ms <= MOST_MS)
                .ok_or_else(|| {
                    format!("line {line}: `{ms}` is no latency: whole ms, at most {MOST_MS}")
                })?;
            given[a * n + b] = Some(ms);
            given[b * n + a] = Some(ms);
        }
        let mut home_ms = Vec::with_capacity(n);
        for (at, region) in regions.iter().enumerate() {
            let far = given[at * n].or((at == 0).then_some(given[0].unwrap_or(0)));
            home_ms.push(far.ok_or_else(|| {
                format!(
                    "no latency between `{}` and the home `{}`: add a line `{} {} MS`",
                    region.name, regions[0].name, region.name, regions[0].name
                )
            })?);
        }
        let near_ms = (0..n).map(|at| given[at * n + at].unwrap_or(0)).collect();
        Ok(Distances { near_ms, home_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn regions() -> Vec<Region> {
        crate::rules::regions::read(Some(&json!([
            {"name": "us", "home": true},
            {"name": "eu", "continents": ["EU"]},
            {"name": "ap", "colos": ["SIN"]}
        ])))
        .unwrap()
    }

    #[test]
    fn pairs_read_either_way_round_and_a_regions_own_redis_is_near() {
        let d = Distances::read(
            "# one way\nus eu 80\nap us 150  # far\neu eu 2\n\n",
            &regions(),
        );
        assert_eq!(
            d,
            Ok(Distances {
                near_ms: vec![0, 2, 0],
                home_ms: vec![0, 80, 150]
            })
        );
    }

    #[test]
    fn a_missing_pair_or_a_bad_line_is_named() {
        let r = regions();
        let err = |text| Distances::read(text, &r).unwrap_err();
        assert!(err("us eu 80\n").contains("between `ap` and the home `us`"));
        assert!(err("us eu 80\nap us\n").starts_with("line 2: write two regions"));
        assert!(err("us xx 80\n").starts_with("line 1: `xx` is not a region"));
        assert!(err("us eu -1\n").starts_with("line 1: `-1` is no latency"));
        assert!(err("us eu 60001\n").contains("at most 60000"));
        let one = crate::rules::regions::read(Some(&json!([{"name": "us", "home": true}])));
        assert!(Distances::read("", &one.unwrap()).is_err());
    }
}
