//! Where a request is decided (`regions`): one Redis per region, the
//! home's under today's secrets and every other's under secrets named
//! after it, and which region a request goes to, by the place Cloudflare
//! received it (`request.cf`'s colo, else its continent).

use serde_json::Value;

use super::fields::{expected, invalid, list, one, FieldError};

/// The continents as `request.cf.continent` names them.
pub const CONTINENTS: [&str; 7] = ["AF", "AN", "AS", "EU", "NA", "OC", "SA"];

/// The longest region name: it ends its secrets' names.
pub const MAX_NAME: usize = 16;

/// The secret holding a region's REST URL, less the region's suffix.
pub const URL_VAR: &str = "UPSTASH_REDIS_REST_URL";
/// The secret holding a region's REST token, less the region's suffix.
pub const TOKEN_VAR: &str = "UPSTASH_REDIS_REST_TOKEN";

/// The request header that names a request's region in a local run: for
/// tests and `scripts/stack`, which have no `request.cf` place to route by.
pub const PIN_HEADER: &str = "x-edge-limiter-region";

/// Whether a request to `host` may name its region with [`PIN_HEADER`]: a
/// loopback host, which `wrangler dev` serves and no Cloudflare route can.
pub fn pinnable(host: &str) -> bool {
    matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

/// One region of `regions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// Lower-case letters and digits; its secrets end in it, upper-cased.
    pub name: String,
    /// The home: its Redis is today's ([`URL_VAR`], [`TOKEN_VAR`]), and a
    /// request from a place no region lists goes there.
    pub home: bool,
    /// The continents whose requests go here, as [`CONTINENTS`] names them.
    pub continents: Vec<String>,
    /// The data centres (IATA codes, `FRA`) whose requests go here, whatever
    /// continent holds them.
    pub colos: Vec<String>,
}

/// The secrets naming the REST URL and token of region `at` of `regions`:
/// today's for the home (and for the one Redis when none are configured),
/// suffixed with its name for any other (`UPSTASH_REDIS_REST_URL_EU`).
pub fn secrets(regions: &[Region], at: usize) -> (String, String) {
    match regions.get(at).filter(|r| !r.home) {
        Some(r) => {
            let suffix = r.name.to_ascii_uppercase();
            (
                format!("{URL_VAR}_{suffix}"),
                format!("{TOKEN_VAR}_{suffix}"),
            )
        }
        None => (URL_VAR.to_owned(), TOKEN_VAR.to_owned()),
    }
}

/// The region of `regions` (the home first, as [`read`] orders them) that
/// decides a request Cloudflare received at `colo` on `continent`: the one
/// listing its colo, else the one listing its continent, else the home.
/// With no regions configured, 0: the one Redis there is.
pub fn route(regions: &[Region], colo: Option<&str>, continent: Option<&str>) -> usize {
    let listing = |pick: fn(&Region) -> &[String], place: Option<&str>| {
        let place = place?;
        regions
            .iter()
            .position(|r| pick(r).iter().any(|p| p == place))
    };
    listing(|r| &r.colos, colo)
        .or_else(|| listing(|r| &r.continents, continent))
        .unwrap_or(0)
}

/// The index of the region named `name`, if there is one.
pub fn named(regions: &[Region], name: &str) -> Option<usize> {
    regions.iter().position(|r| r.name == name)
}

/// `regions` as written, checked, the home first and the others in their
/// order; none when the field is absent. Each error names its field
/// (`regions[1].colos[0]`).
pub fn read(written: Option<&Value>) -> Result<Vec<Region>, FieldError> {
    let items = match written {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(invalid("regions", expected("a list of regions", other))),
    };
    let mut regions: Vec<Region> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let region = region(item, &regions)
            .map_err(|e| invalid(format!("regions[{i}]{}", e.field), e.problem))?;
        // Moved rather than sorted: a library sort costs the wasm kilobytes.
        match region.home {
            true => regions.insert(0, region),
            false => regions.push(region),
        }
    }
    let homes = regions.iter().filter(|r| r.home).count();
    if homes != 1 {
        return Err(invalid(
            "regions",
            format!(
                "give exactly one region `home = true` (its Redis is {URL_VAR}'s), not {homes}"
            ),
        ));
    }
    Ok(regions)
}

/// One region's table, checked against the `earlier` ones; its errors
/// name the field within it (`.colos[0]`).
fn region(item: &Value, earlier: &[Region]) -> Result<Region, FieldError> {
    const FIELDS: [&str; 4] = ["name", "home", "continents", "colos"];
    let wrong = |field: String, problem: String| Err(invalid(field, problem));
    let Some(table) = item.as_object() else {
        return wrong(
            String::new(),
            expected(
                "a table such as { name = \"eu\", continents = [\"EU\"] }",
                item,
            ),
        );
    };
    if let Some(unknown) = table.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return wrong(
            format!(".{unknown}"),
            "is not a region's field; a region has `name`, `home`, `continents` and `colos`".into(),
        );
    }
    let name: String = one(table, "name").map_err(dotted)?.unwrap_or_default();
    let lower = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if name.is_empty() || name.len() > MAX_NAME || !name.bytes().all(lower) {
        return wrong(
            ".name".into(),
            format!("`{name}`: give 1 to {MAX_NAME} lower-case letters and digits (it names the region's secrets)"),
        );
    }
    if earlier.iter().any(|r| r.name == name) {
        return wrong(".name".into(), "is used by an earlier region".into());
    }
    let home = one(table, "home").map_err(dotted)?.unwrap_or(false);
    let mut places = [vec![], vec![]];
    for (kind, field) in ["colos", "continents"].into_iter().enumerate() {
        let given: Vec<String> = list(table, field).map_err(dotted)?.unwrap_or_default();
        for (j, place) in given.iter().enumerate() {
            // A colo is three capitals (FRA), a continent two of CONTINENTS.
            let valid = match kind {
                0 => place.len() == 3 && place.bytes().all(|b| b.is_ascii_uppercase()),
                _ => CONTINENTS.contains(&place.as_str()),
            };
            let taken = earlier
                .iter()
                .find(|r| r.colos.contains(place) || r.continents.contains(place));
            let problem = match (valid, taken) {
                (false, _) if kind == 0 => {
                    "is not a data centre's IATA code, three capitals such as FRA".to_owned()
                }
                (false, _) => "is not a continent: AF, AN, AS, EU, NA, OC or SA".to_owned(),
                (true, Some(r)) => format!(
                    "goes to region `{}` already; a place goes to one region",
                    r.name
                ),
                (true, None) => continue,
            };
            return wrong(format!(".{field}[{j}]"), format!("`{place}` {problem}"));
        }
        places[kind] = given;
    }
    let [colos, continents] = places;
    if !home && colos.is_empty() && continents.is_empty() {
        return wrong(
            ".name".into(),
            format!("region `{name}` serves no place: list its `continents` or `colos`"),
        );
    }
    Ok(Region {
        name,
        home,
        continents,
        colos,
    })
}

/// A field's error with its name after a dot, as within a region.
fn dotted(e: FieldError) -> FieldError {
    invalid(format!(".{}", e.field), e.problem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn regions(v: Value) -> Result<Vec<Region>, FieldError> {
        read(Some(&v))
    }

    #[test]
    fn a_request_goes_to_its_colos_region_then_its_continents_then_home() {
        let r = regions(json!([
            {"name": "eu", "continents": ["EU", "AF"]},
            {"name": "us", "home": true},
            {"name": "ap", "continents": ["AS", "OC"], "colos": ["FRA"]}
        ]))
        .unwrap();
        let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["us", "eu", "ap"], "the home first");
        let at = |colo, continent| r[route(&r, colo, continent)].name.as_str();
        assert_eq!(at(Some("AMS"), Some("EU")), "eu");
        assert_eq!(
            at(Some("FRA"), Some("EU")),
            "ap",
            "a colo before its continent"
        );
        assert_eq!(at(Some("SYD"), Some("OC")), "ap");
        assert_eq!(at(Some("IAD"), Some("NA")), "us");
        assert_eq!(at(None, None), "us", "no place: the home");
        assert_eq!(route(&[], Some("FRA"), Some("EU")), 0);
        let today = (URL_VAR.to_owned(), TOKEN_VAR.to_owned());
        assert_eq!((secrets(&r, 0), secrets(&[], 0)), (today.clone(), today));
        let eu = secrets(&r, 1);
        assert_eq!(
            (eu.0.as_str(), eu.1.as_str()),
            ("UPSTASH_REDIS_REST_URL_EU", "UPSTASH_REDIS_REST_TOKEN_EU")
        );
    }

    #[test]
    fn only_a_loopback_host_may_pin_a_region() {
        for host in ["127.0.0.1", "localhost", "[::1]"] {
            assert!(pinnable(host), "{host}");
        }
        for host in [
            "example.com",
            "127.0.0.1.example.com",
            "localhost.example",
            "10.0.0.1",
        ] {
            assert!(!pinnable(host), "{host}");
        }
    }

    #[test]
    fn each_wrong_region_names_its_field() {
        let home = json!({"name": "us", "home": true});
        let cases = [
            (json!({"name": "us"}), "regions"),
            (json!([{"name": "us"}]), "regions[0].name"),
            (
                json!([home, {"name": "eu", "home": true, "continents": ["EU"]}]),
                "regions",
            ),
            (
                json!([home, {"name": "EU", "continents": ["EU"]}]),
                "regions[1].name",
            ),
            (
                json!([home, {"name": "eu-1", "continents": ["EU"]}]),
                "regions[1].name",
            ),
            (
                json!([home, {"name": "us", "continents": ["EU"]}]),
                "regions[1].name",
            ),
            (
                json!([home, {"name": "eu", "continents": ["Europe"]}]),
                "regions[1].continents[0]",
            ),
            (
                json!([home, {"name": "eu", "colos": ["fra"]}]),
                "regions[1].colos[0]",
            ),
            (
                json!([home, {"name": "eu", "continents": "EU"}]),
                "regions[1].continents",
            ),
            (
                json!([home, {"name": "eu", "region": "eu"}]),
                "regions[1].region",
            ),
            (json!([home, "eu"]), "regions[1]"),
            (
                json!([{"name": "us", "home": true, "continents": ["NA"]}, {"name": "eu", "continents": ["EU", "NA"]}]),
                "regions[1].continents[1]",
            ),
            (json!([]), "regions"),
        ];
        for (written, field) in cases {
            let e = regions(written.clone()).unwrap_err();
            assert_eq!(e.field, field, "{written}: {}", e.problem);
        }
        assert_eq!(read(None).unwrap(), vec![]);
    }
}
