//! Hostile input: the configuration parser, the REST reply parsers and the
//! identifier-to-key function fuzzed (proptest, a bounded number of cases;
//! set `PROPTEST_CASES` for more), then identifiers, paths and forwarded
//! headers a client controls, sent to the built worker in `wrangler dev`,
//! and a flood of denied requests measured in Redis's memory.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::time::Duration;

use edge_limiter::{
    decision::{
        transport::keys::redis_key,
        transport::protocol::{decode_general, Check, ScriptCall, ScriptError, LIMITER},
        transport::redis_rest::{parse_reply, RestError},
    },
    rules::{
        config::{Config, ConfigError},
        request::RequestMeta,
        rule::Mode,
    },
};
use proptest::prelude::*;
use serde_json::{json, Value};
use support::{
    raw_http::{self, RawReply},
    report::{assert_no_secret, settled, Table},
    rules,
    worker::Stack,
    Backend, TOKEN,
};

/// A bounded run in CI; `PROPTEST_CASES` overrides it.
fn cases(n: u32) -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = n;
    }
    config
}

// ---------------------------------------------------------------- fuzzing

const FIELDS: &[&str] = &[
    "name",
    "key",
    "algorithm",
    "rate",
    "period",
    "burst",
    "windows",
    "cost",
    "fail",
    "budget",
    "path_prefix",
    "methods",
    "rules",
];

fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(FIELDS).prop_map(str::to_owned),
        1 => "[a-z_]{1,10}",
    ]
}

/// Any JSON, leaning on the values the parser treats specially.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(vec![
            json!(0),
            json!(-1),
            json!(1),
            json!(u64::MAX),
            json!(1.5),
            json!(1e300),
            json!("0ms"),
            json!("1s"),
            json!("250ms"),
            json!("366d"),
            json!("367d"),
            json!("99999999999999999999d"),
            json!("1 s"),
            json!("gcra"),
            json!("windowed"),
            json!("ip"),
            json!("header:"),
            json!("header:x-api-key"),
            json!("open"),
            json!("closed"),
            json!("/"),
            json!("api"),
        ]),
        "[a-z0-9 :{}|#/._-]{0,12}".prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((field_name(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Valid rules with a few fields replaced or removed, so that most cases
/// get deep into the checks instead of failing at the first field.
fn near_valid_config() -> impl Strategy<Value = Value> {
    let base = prop::sample::select(vec![
        json!({"name": "g", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s", "burst": 5}),
        json!({"name": "w", "key": ["header:x-api-key", "ip"], "algorithm": "windowed",
               "windows": [["1s", 10, "100ms"], ["1h", 100, "1m"]], "cost": 2, "fail": "open", "budget": "300ms"}),
    ]);
    let edit = (field_name(), prop::option::weighted(0.8, json_value()));
    let rule = (base, prop::collection::vec(edit, 0..4)).prop_map(|(mut rule, edits)| {
        for (field, value) in edits {
            match value {
                Some(v) => rule[field.as_str()] = v,
                None => {
                    rule.as_object_mut().map(|o| o.remove(&field));
                }
            }
        }
        rule
    });
    prop::collection::vec(rule, 1..4).prop_map(|rules| json!({ "rules": rules }))
}

/// Text cut at an arbitrary character.
fn truncated(text: String, at: prop::sample::Index) -> String {
    let cut = at.index(text.chars().count() + 1);
    text.chars().take(cut).collect()
}

fn check_config(result: Result<Config, ConfigError>) -> Result<(), TestCaseError> {
    match result {
        Ok(config) => {
            prop_assert!(!config.rules.is_empty());
            for rule in &config.rules {
                prop_assert!((10..=30_000).contains(&rule.budget_ms));
                prop_assert!(rule.policy.capacity() >= 1, "{:?}", rule.policy);
                let name_ok = !rule.name.is_empty()
                    && rule.name.len() <= 64
                    && rule
                        .name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                prop_assert!(name_ok, "{:?}", rule.name);
                // A config that parses must also make a well-formed call.
                let call = ScriptCall::decide(&[(Check { rule, cost: 1 }, vec!["1.2.3.4"])], None);
                prop_assert_eq!(call.keys().len(), 1);
            }
        }
        Err(error) => {
            prop_assert!(!error.to_string().is_empty());
            // The rule's label may be empty: see `an_unnamed_rule_is_named_by_position`.
            if let ConfigError::Rule { field, .. } = &error {
                prop_assert!(!field.is_empty(), "{error}");
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(1500))]

    #[test]
    fn the_config_parser_returns_a_typed_error_for_any_json(value in json_value()) {
        check_config(Config::from_json(&value))?;
        check_config(Config::from_json(&json!({ "rules": [value] })))?;
    }

    #[test]
    fn the_config_parser_survives_near_valid_rules(value in near_valid_config()) {
        check_config(Config::from_json(&value))?;
    }

    #[test]
    fn the_config_parser_survives_any_text(
        value in near_valid_config(),
        at in any::<prop::sample::Index>(),
        noise in any::<String>(),
    ) {
        check_config(truncated(value.to_string(), at).parse::<Config>())?;
        check_config(noise.parse::<Config>())?;
    }
}

fn reply_body() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        json_value().prop_map(|v| v.to_string()),
        json_value().prop_map(|v| json!({ "result": v }).to_string()),
        json_value().prop_map(|v| json!({ "error": v }).to_string()),
        ".{0,40}".prop_map(|s| json!({ "error": format!("NOSCRIPT {s}") }).to_string()),
        (json_value(), any::<prop::sample::Index>())
            .prop_map(|(v, at)| truncated(json!({ "result": v }).to_string(), at)),
    ]
}

fn status() -> impl Strategy<Value = u16> {
    prop_oneof![
        prop::sample::select(vec![
            200u16, 201, 204, 400, 401, 404, 405, 413, 500, 502, 503
        ]),
        any::<u16>(),
    ]
}

/// An integer for a script reply; `i64::MIN` is left to its own test.
fn reply_int() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => -3i64..1100,
        1 => prop::sample::select(vec![i64::MAX, i64::MIN + 1, u32::MAX as i64, -1]),
        1 => (i64::MIN + 1)..=i64::MAX,
    ]
}

proptest! {
    #![proptest_config(cases(3000))]

    #[test]
    fn the_rest_reply_parser_returns_a_typed_error_for_any_reply(
        status in status(),
        body in reply_body(),
    ) {
        let result = parse_reply(status, &body);
        if status == 401 {
            prop_assert_eq!(&result, &Err(RestError::Auth));
        }
        match &result {
            Ok(value) => {
                prop_assert!((200..300).contains(&status));
                let whole: Value = serde_json::from_str(&body).expect("an accepted reply is JSON");
                prop_assert_eq!(&whole["result"], value);
            }
            Err(error) => prop_assert!(!error.to_string().is_empty()),
        }
        if let Err(RestError::Malformed(why)) = &result {
            // Excerpts keep a huge or hostile body out of the log line.
            prop_assert!(why.chars().count() < 300, "{} chars", why.chars().count());
        }
    }

    #[test]
    fn the_script_reply_parser_returns_a_typed_error_for_any_value(
        rules in 0usize..4,
        exact_length in prop::bool::weighted(0.7),
        ints in prop::collection::vec(reply_int(), 0..30),
        odd in prop::option::weighted(0.2, (any::<prop::sample::Index>(), json_value())),
    ) {
        let mut items: Vec<Value> = ints.into_iter().map(Value::from).collect();
        if exact_length {
            items.resize(6 * rules, Value::from(0));
        }
        if let Some((at, value)) = odd {
            if !items.is_empty() {
                let i = at.index(items.len());
                items[i] = value;
            }
        }
        if let Ok(decision) = decode_general(&Value::Array(items), &vec![Mode::Enforce; rules], false) {
            prop_assert_eq!(decision.rules.len(), rules);
            prop_assert!(decision.binding() < rules.max(1));
        }
    }
}

/// Reply from a broken or hostile endpoint naming window `i64::MIN` (an
/// earlier parser computed an index from such a field unchecked, which
/// overflowed).
#[test]
fn a_script_reply_naming_window_i64_min_is_a_typed_error() {
    let reply = json!([1, 5, 4, 200, 0, i64::MIN]);
    assert!(matches!(
        decode_general(&reply, &[Mode::Enforce], false),
        Err(ScriptError::Reply(_))
    ));
}

fn id_part() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z0-9._:@/-]{0,70}",
        4 => "[a-z{}|#:\n\u{0} ]{0,10}",
        2 => any::<String>(),
        1 => Just(String::new()),
        2 => (0usize..3).prop_map(|extra| "x".repeat(63 + extra)),
        // Rare: hashing 64 KB is slow in a debug build.
        1 => Just("x".repeat(64 * 1024)),
    ]
}

fn id_parts() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(id_part(), 1..4)
}

/// Checks one key: `el:{<tag>}:<rule>`, the tag non-empty, free of braces
/// (so it is the whole Redis Cluster hash tag), and short.
fn check_key(key: &str, rule: &str, parts: usize) -> Result<(), TestCaseError> {
    let tag = key
        .strip_prefix("el:{")
        .and_then(|k| k.strip_suffix(&format!("}}:{rule}")));
    prop_assert!(tag.is_some(), "{key:?}");
    let tag = tag.unwrap_or_default();
    prop_assert!(!tag.is_empty() && !tag.contains(['{', '}']), "{key:?}");
    // Plain: at most 64 bytes of identifier plus the separators; else `#` and a SHA1.
    prop_assert!(tag.len() <= (64 + parts - 1).max(41), "{} bytes", tag.len());
    Ok(())
}

fn as_strs(parts: &[String]) -> Vec<&str> {
    parts.iter().map(String::as_str).collect()
}

proptest! {
    #![proptest_config(cases(1000))]

    #[test]
    fn identifier_keys_stay_in_their_tag_and_never_collide(
        a in id_parts(),
        b in id_parts(),
        split in any::<prop::sample::Index>(),
    ) {
        let key_a = redis_key("r", &as_strs(&a));
        check_key(&key_a, "r", a.len())?;
        check_key(&redis_key("r", &as_strs(&b)), "r", b.len())?;
        prop_assert_eq!(&key_a, &redis_key("r", &as_strs(&a)), "not deterministic");
        prop_assert_ne!(&key_a, &redis_key("r-2", &as_strs(&a)));
        // The same text split differently is a different client.
        let joined = a.join("|");
        let at = split.index(joined.len() + 1);
        let resplit = match (joined.get(..at), joined.get(at..)) {
            (Some(head), Some(tail)) => vec![head.to_owned(), tail.to_owned()],
            _ => vec![joined.clone()],
        };
        for other in [b, vec![joined], resplit] {
            if other != a {
                prop_assert_ne!(&key_a, &redis_key("r", &as_strs(&other)), "{:?} vs {:?}", a, other);
            }
        }
    }

    #[test]
    fn identifiers_from_any_request_make_well_formed_keys(
        headers in prop::collection::vec(
            (prop::sample::select(vec!["x-id", "cookie", "cf-connecting-ip", "user-agent", "x-forwarded-for"]), id_part()),
            0..6,
        ),
        path in "/[a-z%/.{}:|]{0,30}",
        query in prop::option::of("[a-z=&%{}|]{0,30}"),
    ) {
        let rule = rules(json!([{
            "name": "all", "key": ["ip", "header:x-id", "cookie:sid", "query:k", "path", "user-agent"],
            "algorithm": "gcra", "rate": 1, "period": "1s"
        }])).remove(0);
        let req = RequestMeta {
            path,
            query,
            headers: headers.into_iter().map(|(n, v)| (n.to_owned(), v)).collect(),
            ..RequestMeta::default()
        };
        // A part given twice with different values refuses the request; any
        // other request makes a well-formed key.
        if let Ok(id) = rule.identifier(&req) {
            let id: Vec<&str> = id.iter().map(|p| p.as_ref()).collect();
            prop_assert_eq!(id.len(), 6);
            check_key(&redis_key("all", &id), "all", 6)?;
        }
    }
}

/// A rule whose `name` is empty is reported as `#N`, like one with no name,
/// so that the error still says which rule to fix.
#[test]
fn an_unnamed_rule_is_named_by_position() {
    let error =
        Config::from_json(&json!({"rules": [{"name": "", "algorithm": "gcra"}]})).unwrap_err();
    assert!(error.to_string().starts_with("rule `#1`"), "{error}");
}

#[test]
fn cost_configs_that_cannot_work_are_rejected_naming_the_field() {
    let with_cost = |cost: Value| {
        Config::from_json(&json!({"rules": [
            {"name": "c", "key": ["ip"], "algorithm": "gcra", "rate": 5, "period": "1s", "burst": 5, "cost": cost}
        ]}))
    };
    for bad in [
        json!(-1),
        json!(-9_223_372_036_854_775_808i64),
        json!(1.5),
        json!("1"),
        json!(6),
        json!(u64::MAX),
    ] {
        match with_cost(bad.clone()) {
            Err(ConfigError::Rule { rule, field, .. }) => {
                assert_eq!((rule.as_str(), field.as_str()), ("c", "cost"), "cost {bad}")
            }
            other => panic!("cost {bad}: {other:?}"),
        }
    }
    // Null is no cost given (the default, 1); zero is allowed on purpose:
    // such a rule reports but never consumes.
    assert!(with_cost(json!(null)).is_ok());
    assert!(with_cost(json!(0)).is_ok());
    assert!(
        with_cost(json!(5)).is_ok(),
        "the whole burst at once is allowed"
    );
}

// ------------------------------------------------------ through the worker

/// One rule per way a client can shape its identifier, each allowing one
/// request per hour: a second request is denied only if it shares a bucket.
const ID_RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "id"
key = ["header:x-id"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
path_prefix = "/id"

[[vars.LIMITER.rules]]
name = "pair"
key = ["header:x-a", "header:x-b"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
path_prefix = "/pair"

[[vars.LIMITER.rules]]
name = "query"
key = ["query:k"]
algorithm = "windowed"
windows = [["1h", 1, "1h"]]
path_prefix = "/query"

[[vars.LIMITER.rules]]
name = "cookie"
key = ["cookie:sid"]
algorithm = "windowed"
windows = [["1h", 1, "1h"]]
path_prefix = "/cookie"

[[vars.LIMITER.rules]]
name = "header"
key = ["header:x-key"]
algorithm = "windowed"
windows = [["1h", 1, "1h"]]
path_prefix = "/header"

[[vars.LIMITER.rules]]
name = "auth"
key = ["header:authorization"]
algorithm = "windowed"
windows = [["1h", 1, "1h"]]
path_prefix = "/auth"
"#;

/// Sends the same request twice: a distinct identifier is admitted once
/// and then denied (its own bucket, limited); anything else is wrong,
/// except a clear 4xx from the runtime for what HTTP itself forbids.
struct Pair {
    /// The rule the request falls under.
    rule: &'static str,
    label: String,
    first: RawReply,
    second: RawReply,
}

/// Rule, label, request target, and the one header sent.
type EdgeCase<'a> = (&'a str, &'a str, &'a [u8], (&'a str, &'a [u8]));

fn twice(
    rule: &'static str,
    base: &str,
    target: &[u8],
    headers: &[(&str, &[u8])],
    label: String,
) -> Pair {
    Pair {
        rule,
        label,
        first: raw_http::get(base, target, headers),
        second: raw_http::get(base, target, headers),
    }
}

/// Whether the limiter decided this request: it then says so in headers.
fn decided(reply: &RawReply) -> bool {
    reply.header("ratelimit").is_some()
}

fn keys(backend: &Backend, pattern: &str) -> Vec<String> {
    backend
        .redis(&["KEYS", pattern])
        .lines()
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn hostile_identifiers_get_their_own_bucket_and_no_key_escapes_its_tag() {
    let stack = Stack::start(ID_RULES);
    let base = stack.worker.url.as_str();
    let big = "x".repeat(64 * 1024);
    let header_ids: Vec<Vec<u8>> = [
        &b"a"[..],
        b"A",
        b"b",
        b"a{b",
        b"a}b",
        b"{a}",
        b"}{",
        b"a:b",
        b"a|b",
        b"#abc",
        b"el:{x}:id",
        b"x}:pair",
        b"a b",
        b"\xff\xfe",
        b"\xc3\x28",
        b"\xc3\xa9",
        b"\xe9",
        b"%00",
        b"%0A",
    ]
    .iter()
    .map(|id| id.to_vec())
    .chain([
        "x".repeat(64).into_bytes(),
        "x".repeat(65).into_bytes(),
        "y".repeat(8 * 1024).into_bytes(),
    ])
    .collect();
    let mut pairs = Vec::new();
    for id in &header_ids {
        let shown: String = String::from_utf8_lossy(id)
            .escape_debug()
            .take(40)
            .collect();
        let label = format!("x-id: {shown} ({} bytes)", id.len());
        pairs.push(twice("id", base, b"/id", &[("x-id", id)], label));
    }
    for (a, b) in [
        ("a|b", "c"),
        ("a", "b|c"),
        ("a", "b"),
        ("a|", "b"),
        ("a", "|b"),
    ] {
        let label = format!("x-a: {a}, x-b: {b}");
        pairs.push(twice(
            "pair",
            base,
            b"/pair",
            &[("x-a", a.as_bytes()), ("x-b", b.as_bytes())],
            label,
        ));
    }
    // Distinct once decoded (`a}b` and `a%7Db` are one value; see
    // `spellings_share_one_bucket` below for such groups).
    for k in ["a%00b", "a%0Ab", "a%0D%0Ab", "%7B%7D", "a}b", "A"] {
        let target = format!("/query?k={k}");
        pairs.push(twice("query", base, target.as_bytes(), &[], target.clone()));
    }
    for c in ["a", "a}b", "{a", "a:b", "A"] {
        let cookie = format!("sid={c}; other=1");
        pairs.push(twice(
            "cookie",
            base,
            b"/cookie",
            &[("cookie", cookie.as_bytes())],
            format!("cookie: {cookie}"),
        ));
    }
    // What HTTP forbids or a runtime may refuse: any clear answer but a 5xx.
    let cookie = format!("sid={big}");
    // A 64 KB URL never reaches a worker: the runtime's own front door
    // refuses it (and in wrangler dev sometimes without any answer), and
    // Cloudflare's edge caps URLs at 16 KB; 8 KB still reaches the limiter.
    let query = format!("/query?k={}", "q".repeat(8 * 1024));
    let edge_cases: [EdgeCase; 6] = [
        ("id", "x-id: <64 KB>", b"/id", ("x-id", big.as_bytes())),
        (
            "cookie",
            "cookie: sid=<64 KB>",
            b"/cookie",
            ("cookie", cookie.as_bytes()),
        ),
        (
            "query",
            "?k=<8 KB>",
            query.as_bytes(),
            ("x-unrelated", b"1"),
        ),
        ("id", "x-id: a<NUL>b", b"/id", ("x-id", b"a\0b")),
        (
            "id",
            "x-id: a<LF>x-id: b (header injection)",
            b"/id",
            ("x-id", b"a\nx-id: b"),
        ),
        ("id", "x-id: a<CR>b", b"/id", ("x-id", b"a\rb")),
    ];
    let edge: Vec<(&str, String, RawReply)> = edge_cases
        .iter()
        .map(|(rule, label, target, header)| {
            (
                *rule,
                label.to_string(),
                raw_http::get(base, target, &[*header]),
            )
        })
        .collect();

    let mut table = Table::new(
        "Hostile identifiers through the worker (one request per hour per bucket)",
        &["identifier", "1st", "2nd", "verdict"],
    );
    let mut failures = Vec::new();
    for p in &pairs {
        let ok = p.first.status == 200 && p.second.status == 429;
        table.row(vec![
            p.label.clone(),
            p.first.status.to_string(),
            p.second.status.to_string(),
            if ok { "own bucket, limited" } else { "WRONG" }.to_owned(),
        ]);
        if !ok {
            failures.push(format!(
                "{}: {} then {}",
                p.label, p.first.status, p.second.status
            ));
        }
    }
    for (_, label, reply) in &edge {
        let ok = reply.status < 500;
        let verdict = match (ok, decided(reply)) {
            (false, _) => "WRONG",
            (true, true) => "decided by the limiter",
            (true, false) => "refused before the limiter",
        };
        table.row(vec![
            label.clone(),
            reply.status.to_string(),
            "-".into(),
            verdict.to_owned(),
        ]);
        if !ok {
            failures.push(format!("{label}: {}", reply.dump()));
        }
    }
    table.print("hostile-identifiers");
    let (spelling_failures, spellings_admitted) = spellings_share_one_bucket(base);
    failures.extend(spelling_failures);

    // Every key the worker wrote is `el:{<tag>}:<rule>`, the tag free of
    // braces and short however long the identifier was.
    let all = keys(&stack.backend, "*");
    for key in &all {
        let braces = key.matches(['{', '}']).count();
        if !key.starts_with("el:{") || braces != 2 || key.len() > 90 {
            failures.push(format!("malformed key {key:?}"));
        }
    }
    let id_keys = keys(&stack.backend, "el:*:id").len();
    // An identifier too large for the origin (431) was still decided first.
    let admitted_ids = pairs.iter().filter(|p| p.rule == "id").count()
        + edge
            .iter()
            .filter(|(rule, _, reply)| *rule == "id" && decided(reply))
            .count();
    if id_keys != admitted_ids {
        failures.push(format!(
            "{id_keys} keys for rule `id`, {admitted_ids} distinct identifiers admitted"
        ));
    }
    let hits = stack.origin.hits().await;
    let forwarded = pairs.iter().filter(|p| p.first.status == 200).count() as u64
        + pairs.iter().filter(|p| p.second.status == 200).count() as u64
        + edge.iter().filter(|(_, _, r)| r.status == 200).count() as u64
        + spellings_admitted;
    if hits["total"].as_u64() != Some(forwarded) {
        failures.push(format!(
            "the origin saw {hits}, the worker forwarded {forwarded}"
        ));
    }
    assert!(
        failures.is_empty(),
        "{failures:#?}\nlog:\n{}",
        stack.worker.log()
    );
    let dumps: Vec<String> = pairs
        .iter()
        .flat_map(|p| [p.first.dump(), p.second.dump()])
        .chain(edge.iter().map(|(_, _, r)| r.dump()))
        .collect();
    assert_no_secret(TOKEN, "a worker response", dumps.iter().map(String::as_str));
    let log = settled(|| stack.worker.log());
    assert_no_secret(TOKEN, "the worker log", [log.as_str()]);
}

/// Spellings an origin reads as one value, sent in turn: the first is
/// admitted, every other one must find the same bucket spent (429); a
/// parameter, cookie or header given twice with different values must be
/// refused (400) whichever value comes first. Returns what went wrong, and
/// how many requests were admitted (and so reached the origin).
fn spellings_share_one_bucket(base: &str) -> (Vec<String>, u64) {
    /// A request target, and the headers sent with it.
    type Spelling = (String, Vec<(&'static str, String)>);
    let query = |q: &str| (format!("/query?{q}"), vec![]);
    let cookie = |c: &str| ("/cookie".to_owned(), vec![("cookie", c.to_owned())]);
    // Each value one `x-key` line: the runtime joins repeats with ", ".
    let header = |values: &[&str]| {
        let lines = values.iter().map(|v| ("x-key", v.to_string()));
        ("/header".to_owned(), lines.collect())
    };
    let groups: Vec<(&str, Vec<Spelling>)> = vec![
        (
            "query value, escaped and re-encoded",
            [
                "k=v1",
                "k=%761",
                "k=%2576%2531",
                "%6B=v1",
                "K=v1",
                "k=v1&k=%76%31",
                "x=1;k=v1",
                "%E2%84%AA=v1",
            ]
            .map(query)
            .to_vec(),
        ),
        (
            "query value, + and %20 and %2B",
            ["k=v+2", "k=v%202", "k=v%2B2", "k=v%2b2"]
                .map(query)
                .to_vec(),
        ),
        (
            "query value, encoded braces",
            ["k=v}3", "k=v%7D3"].map(query).to_vec(),
        ),
        (
            "query value, cut at a NUL as C code reads it",
            ["k=v4", "k=v4%00x", "k=v4%00y", "k=v4%2500z"]
                .map(query)
                .to_vec(),
        ),
        (
            "query value, a number however written",
            [
                "k=42",
                "k=0042",
                "k=%2B42",
                "k=42.0",
                "k=4_2",
                "k=%D9%A4%D9%A2",
                "k=4.2e1",
                "k=0x2a",
            ]
            .map(query)
            .to_vec(),
        ),
        (
            "query value, a UUID however written",
            [
                "k=550e8400-e29b-41d4-a716-446655440000",
                "k=550E8400E29B41D4A716446655440000",
                "k=%7B550e8400-e29b-41d4-a716-446655440000%7D",
                "k=urn:uuid:550e8400-e29b-41d4-a716-446655440000",
            ]
            .map(query)
            .to_vec(),
        ),
        (
            "cookie, quoted and escaped",
            [
                "sid=c1",
                "sid=\"c1\"",
                "sid=\"\\143\\061\"",
                "sid=\"c\\1\"",
                "sid=%63%31",
                "sid=\"%63%31\"",
                "sid=%22c1%22",
                "SID=c1",
                "x=1, sid=c1",
                "sid=c1%00x",
            ]
            .map(cookie)
            .to_vec(),
        ),
        (
            "Authorization, scheme case and base64 as decoders read it",
            [
                "Basic a2V5MTo=",
                "basic a2V5MTo",
                "BASIC  a2V5MTp=",
                "Basic a2V5!MTo=",
            ]
            .map(|a| ("/auth".to_owned(), vec![("authorization", a.to_owned())]))
            .to_vec(),
        ),
        (
            "header, sent again with the same value",
            vec![
                header(&["h1"]),
                header(&["h1", "h1"]),
                header(&["h1, h1"]),
                header(&["h1,"]),
            ],
        ),
    ];
    let refused: Vec<Spelling> = vec![
        query("k=fresh1&k=v1"),
        query("k=v1&k=fresh2"),
        query("k=v1&K=fresh3"),
        query("k=fresh4;k=v1"),
        query("k=v1&%6B=fresh5"),
        cookie("sid=fresh6; sid=c1"),
        cookie("sid=c1; sid=fresh7"),
        cookie("sid=c1; sid=\"fresh8\""),
        header(&["h1", "fresh9"]),
        header(&["fresh10", "h1"]),
        header(&["h1, fresh11"]),
    ];
    let send = |(target, headers): &Spelling| {
        let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
        raw_http::get(base, target.as_bytes(), &headers)
    };
    let label = |(target, headers): &Spelling| match headers.as_slice() {
        [] => target.clone(),
        lines => lines
            .iter()
            .map(|(n, v)| format!("{n}: {v}"))
            .collect::<Vec<_>>()
            .join(" + "),
    };
    let mut table = Table::new(
        "Spellings of one identifier (one request per hour per bucket)",
        &["group", "request", "status", "verdict"],
    );
    let mut failures = Vec::new();
    for (group, requests) in &groups {
        for (i, request) in requests.iter().enumerate() {
            let reply = send(request);
            let expected = if i == 0 { 200 } else { 429 };
            let ok = reply.status == expected;
            let verdict = match (ok, i) {
                (false, _) => "WRONG",
                (true, 0) => "admitted, bucket spent",
                (true, _) => "shared bucket, limited",
            };
            table.row(vec![
                group.to_string(),
                label(request),
                reply.status.to_string(),
                verdict.into(),
            ]);
            if !ok {
                failures.push(format!("{group}: {} got {}", label(request), reply.status));
            }
        }
    }
    for request in &refused {
        let reply = send(request);
        let problem: Value = serde_json::from_slice(&reply.body).unwrap_or_default();
        let ok =
            reply.status == 400 && problem["status"] == 400 && problem["parameter"].is_string();
        table.row(vec![
            "repeated, different values".into(),
            label(request),
            reply.status.to_string(),
            if ok { "refused (400)" } else { "WRONG" }.into(),
        ]);
        if !ok {
            failures.push(format!("repeated: {} got {}", label(request), reply.dump()));
        }
    }
    table.print("identifier-spellings");
    (failures, groups.len() as u64)
}

const FORWARDED_RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "ip"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 2
path_prefix = "/ip"

[[vars.LIMITER.rules]]
name = "trusted-proxy"
key = ["header:x-forwarded-for"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
path_prefix = "/behind-proxy"
"#;

#[tokio::test]
async fn forwarded_headers_change_the_client_key_only_when_configured() {
    let stack = Stack::start(FORWARDED_RULES);
    let http = support::http();
    let spoofs: [(&str, &str); 8] = [
        ("x-forwarded-for", "10.0.0.1"),
        ("x-forwarded-for", "10.0.0.2, 203.0.113.1"),
        ("x-real-ip", "10.0.0.3"),
        ("true-client-ip", "10.0.0.4"),
        ("forwarded", "for=10.0.0.5"),
        ("x-client-ip", "10.0.0.6"),
        ("x-forwarded-for", "203.0.113.99"),
        ("x-cluster-client-ip", "10.0.0.7"),
    ];
    let url = |path: &str| format!("{}{path}", stack.worker.url);
    let mut dumps = Vec::new();
    let mut with_ip = Vec::new();
    for spoof in spoofs {
        with_ip.push(spoofed(&http, url("/ip"), Some("203.0.113.77"), spoof, &mut dumps).await);
    }
    let mut without_ip = Vec::new();
    for spoof in spoofs {
        without_ip.push(spoofed(&http, url("/ip"), None, spoof, &mut dumps).await);
    }
    let mut configured = Vec::new();
    for spoof in spoofs.iter().filter(|(h, _)| *h == "x-forwarded-for") {
        let ip = Some("203.0.113.78");
        configured.push(spoofed(&http, url("/behind-proxy"), ip, *spoof, &mut dumps).await);
    }

    let admitted = |s: &[u16]| s.iter().filter(|&&c| c == 200).count();
    let mut table = Table::new(
        "X-Forwarded-For and friends (8 different spoofed values per row)",
        &["client", "requests", "admitted", "expected"],
    );
    let rows = [
        ("one CF-Connecting-IP, key [\"ip\"], burst 2", &with_ip, 2),
        ("no CF-Connecting-IP, key [\"ip\"], burst 2", &without_ip, 2),
        (
            "key [\"header:x-forwarded-for\"] (configured)",
            &configured,
            3,
        ),
    ];
    for (label, got, expected) in rows {
        table.row(vec![
            label.to_owned(),
            got.len().to_string(),
            admitted(got).to_string(),
            expected.to_string(),
        ]);
    }
    table.print("hostile-forwarded");
    for (label, got, expected) in rows {
        assert_eq!(admitted(got), expected, "{label}: {got:?}");
        assert!(
            got.iter().all(|s| [200, 429].contains(s)),
            "{label}: {got:?}"
        );
    }
    assert_no_secret(TOKEN, "a worker response", dumps.iter().map(String::as_str));
    let log = settled(|| stack.worker.log());
    assert_no_secret(TOKEN, "the worker log", [log.as_str()]);
}

/// Sends one request with a spoofed forwarding header; returns the status.
async fn spoofed(
    http: &reqwest::Client,
    url: String,
    ip: Option<&str>,
    (name, value): (&str, &str),
    dumps: &mut Vec<String>,
) -> u16 {
    let mut req = http.get(url).header(name, value);
    if let Some(ip) = ip {
        req = req.header("cf-connecting-ip", ip);
    }
    let response = req.send().await.expect("the worker answers");
    let status = response.status().as_u16();
    let head = format!("{status}\n{:?}\n", response.headers());
    dumps.push(head + &response.text().await.unwrap_or_default());
    status
}

const PATH_RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "api"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 2
path_prefix = "/api"

[[vars.LIMITER.rules]]
name = "admin"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
path_prefix = "/admin"

[[vars.LIMITER.rules]]
name = "by-path"
key = ["path"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
path_prefix = "/p"

[[vars.LIMITER.rules]]
name = "script"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
path = "/wp-login.php"

[[vars.LIMITER.rules]]
name = "site"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
host = "site.test"
path_prefix = "/h"

[[vars.LIMITER.rules]]
name = "delete"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
methods = ["DELETE"]
path_prefix = "/m"

[[vars.LIMITER.rules]]
name = "read"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
methods = ["GET"]
path_prefix = "/r"
"#;

/// What a path did: limited by a rule (with the rule's name) or passed
/// through with no rule matching.
fn verdict(r: &RawReply) -> String {
    let rule = r
        .header("ratelimit")
        .and_then(|v| v.split(';').next())
        .unwrap_or("no rule")
        .trim_matches('"')
        .to_owned();
    format!("{} {rule}", r.status)
}

fn check_paths(base: &str, ip: &str, cases: &[(&str, &str)]) -> Vec<(String, String, String)> {
    cases
        .iter()
        .map(|(target, expected)| {
            let reply = raw_http::get(
                base,
                target.as_bytes(),
                &[("cf-connecting-ip", ip.as_bytes())],
            );
            (target.to_string(), expected.to_string(), verdict(&reply))
        })
        .collect()
}

fn path_table(title: &str, file: &str, rows: &[(String, String, String)]) -> Vec<String> {
    let mut table = Table::new(title, &["request target", "expected", "got"]);
    let mut failures = Vec::new();
    for (target, expected, got) in rows {
        table.row(vec![target.clone(), expected.clone(), got.clone()]);
        if got != expected {
            failures.push(format!("{target}: expected {expected}, got {got}"));
        }
    }
    table.print(file);
    failures
}

#[tokio::test]
async fn dot_segments_and_case_in_paths_are_handled() {
    let stack = Stack::start(PATH_RULES);
    let base = stack.worker.url.as_str();
    let rows = check_paths(
        base,
        "203.0.113.90",
        &[
            ("/api/x", "200 api"),
            ("/api/x", "200 api"),
            ("/api/x", "429 api"),
            ("/api/./x", "429 api"),
            ("/x/../api/x", "429 api"),
            ("/api/%2e%2e/api/x", "429 api"),
            // Many origins route without regard to case (Express, ASP.NET,
            // IIS): `/API` is the same path and cannot escape the rule.
            ("/API/x", "429 api"),
            ("/Api/X", "429 api"),
            ("/api/../admin", "200 admin"),
            ("/admin", "429 admin"),
            // `ı` and `İ` are `i` to ASP.NET Core's routing and to Java.
            ("/adm%C4%B1n", "429 admin"),
            ("/ADM%C4%B0N", "429 admin"),
            ("/p/a", "200 by-path"),
            ("/p/./a", "429 by-path"),
            ("/p/b/../a", "429 by-path"),
            ("/p/A", "429 by-path"),
            ("/api/%00", "429 api"),
            ("/api/%ff%fe", "429 api"),
            ("/api/%", "429 api"),
        ],
    );
    let failures = path_table("Paths: dot segments and case", "hostile-paths", &rows);
    assert!(failures.is_empty(), "{failures:#?}");
    let hits = stack.origin.hits().await["total"].as_u64().unwrap_or(0);
    let forwarded = rows
        .iter()
        .filter(|(_, _, got)| got.starts_with("200"))
        .count() as u64;
    assert_eq!(hits, forwarded, "denied requests never reach the origin");
    let log = settled(|| stack.worker.log());
    assert_no_secret(TOKEN, "the worker log", [log.as_str()]);
}

/// A rule for one host holds however the client spells that host: the
/// runtime lower-cases it, and the limiter drops the trailing dot of a
/// fully qualified name.
#[tokio::test]
async fn host_spellings_stay_under_their_rule() {
    let stack = Stack::start(PATH_RULES);
    let port = stack
        .worker
        .url
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let http = support::http();
    let mut table = Table::new(
        "Hosts: case and a trailing dot",
        &["Host", "expected", "got"],
    );
    let mut failures = Vec::new();
    for (host, expected) in [
        ("site.test".to_owned(), "200 site"),
        ("SITE.Test".to_owned(), "429 site"),
        ("site.test.".to_owned(), "429 site"),
        (format!("site.test.:{port}"), "429 site"),
        ("other.test".to_owned(), "200 no rule"),
    ] {
        let reply = http
            .get(format!("{}/h", stack.worker.url))
            .header("host", &host)
            .header("cf-connecting-ip", "203.0.113.92")
            .send()
            .await
            .expect("the worker answers");
        let got = rule_verdict(&reply);
        if got != expected {
            failures.push(format!("{host}: expected {expected}, got {got}"));
        }
        table.row(vec![host, expected.into(), got]);
    }
    table.print("hostile-hosts");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// [`verdict`] of a reqwest response.
fn rule_verdict(reply: &reqwest::Response) -> String {
    let rule = reply
        .headers()
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or("no rule")
        .trim_matches('"')
        .to_owned();
    format!("{} {rule}", reply.status().as_u16())
}

/// A rule for one method holds for the requests an origin takes for that
/// method: a HEAD for a GET, and a POST that names another method in an
/// override header or a `_method` field (query, form or JSON body).
#[tokio::test]
async fn method_spellings_stay_under_their_rule() {
    let stack = Stack::start(PATH_RULES);
    let http = support::http();
    let mut table = Table::new(
        "Methods: HEAD and overrides",
        &["request", "expected", "got"],
    );
    let mut failures = Vec::new();
    let form = "application/x-www-form-urlencoded";
    for (method, path, overrides, body, expected) in [
        ("DELETE", "/m", None, None, "200 delete"),
        ("POST", "/m", Some("DELETE"), None, "429 delete"),
        ("POST", "/m?_method=delete", None, None, "429 delete"),
        ("POST", "/m", None, Some("a=1&_method=DELETE"), "429 delete"),
        (
            "POST",
            "/m",
            None,
            Some(r#"{"a": 1, "_method": "delete"}"#),
            "429 delete",
        ),
        ("POST", "/m", None, Some("a=1"), "200 no rule"),
        ("POST", "/m", None, Some(r#"{"a": 1}"#), "200 no rule"),
        ("GET", "/r", None, None, "200 read"),
        ("HEAD", "/r", None, None, "429 read"),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut request = http
            .request(method.clone(), format!("{}{path}", stack.worker.url))
            .header("cf-connecting-ip", "203.0.113.93");
        let mut label = format!("{method} {path}");
        if let Some(named) = overrides {
            request = request.header("x-http-method-override", named);
            label += &format!(" (X-HTTP-Method-Override: {named})");
        }
        if let Some(fields) = body {
            // Laravel reads a JSON body's members as it reads form fields.
            let (kind, content_type) = if fields.starts_with('{') {
                ("json", "application/json")
            } else {
                ("form", form)
            };
            request = request.header("content-type", content_type).body(fields);
            label += &format!(" ({kind} {fields})");
        }
        let reply = request.send().await.expect("the worker answers");
        let got = rule_verdict(&reply);
        if got != expected {
            failures.push(format!("{label}: expected {expected}, got {got}"));
        }
        table.row(vec![label, expected.into(), got]);
    }
    table.print("hostile-methods");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Paths a framework routes to a limited one (a PHP front controller, a
/// Rails format suffix, a number with leading zeros, escapes an origin
/// decodes fewer times than the limiter), and a method named in a field
/// whose name PHP or Rack mangle or past what the limiter reads of a body,
/// stay under their rule.
#[tokio::test]
async fn routes_and_mangled_names_an_origin_takes_stay_under_their_rule() {
    let stack = Stack::start(PATH_RULES);
    let rows = check_paths(
        &stack.worker.url,
        "203.0.113.94",
        &[
            ("/admin", "200 admin"),
            ("/index.php/admin", "429 admin"),
            ("/public/index.php/admin/", "429 admin"),
            ("/admin.json", "429 admin"),
            ("/p/7", "200 by-path"),
            ("/p/007", "429 by-path"),
            ("/p/+7", "429 by-path"),
            // PATH_INFO: Apache and nginx run the script for what follows.
            ("/wp-login.php", "200 script"),
            ("/wp-login.php/x", "429 script"),
            ("/wp-login.php/x.json", "429 script"),
            // Decoded three times the `..` leaves /p; once, it stays below.
            ("/p/a%252F..%252F..", "200 by-path"),
            ("/p/b%252F..%252F..", "429 by-path"),
        ],
    );
    let mut failures = path_table(
        "Paths: front controllers, formats, numbers, fewer decodings",
        "hostile-routes",
        &rows,
    );
    let http = support::http();
    // Past the 64 KB the limiter reads, a `_method` may hide: such a POST
    // counts as every method.
    let long = format!("pad={}&_method=DELETE", "a".repeat(70_000));
    for (method, body, expected) in [
        ("DELETE", "", "200 delete"),
        ("POST", "+_method=DELETE", "429 delete"),
        ("POST", "_method]=DELETE", "429 delete"),
        ("POST", long.as_str(), "429 delete"),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let reply = http
            .request(method.clone(), format!("{}/m", stack.worker.url))
            .header("cf-connecting-ip", "203.0.113.94")
            .header("content-type", "application/x-www-form-urlencoded,")
            .body(body.to_owned())
            .send()
            .await
            .expect("the worker answers");
        let got = rule_verdict(&reply);
        if got != expected {
            let shown: String = body.chars().take(40).collect();
            failures.push(format!(
                "{method} /m ({shown}): expected {expected}, got {got}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Another spelling of a limited path must land under the same rule and,
/// for a `path` key, in the same bucket, as the origin would read it once
/// decoded: percent-escapes (`%2F` and IIS's `%u0061` included), empty
/// segments, and the dots and spaces Windows drops from a segment's end.
#[tokio::test]
async fn re_encoded_paths_stay_under_their_rule_and_key() {
    let stack = Stack::start(PATH_RULES);
    let rows = check_paths(
        &stack.worker.url,
        "203.0.113.91",
        &[
            ("/api/x", "200 api"),
            ("/api/x", "200 api"),
            ("/%61pi/x", "429 api"),
            ("/%61%70%69/x", "429 api"),
            ("//api/x", "429 api"),
            ("/api%2Fx", "429 api"),
            ("/api%2fx", "429 api"),
            ("/%2Fapi/x", "429 api"),
            ("/api//x", "429 api"),
            ("/%41PI/x", "429 api"),
            ("/%2561pi/x", "429 api"),
            ("/api;jsessionid=1/x", "429 api"),
            ("/api/x%00.png", "429 api"),
            // IIS: %u escapes, and dots and spaces ending a segment.
            ("/%u0061pi/x", "429 api"),
            ("/api./x", "429 api"),
            ("/api%20/x", "429 api"),
            ("/%61dmin", "200 admin"),
            ("//admin", "429 admin"),
            ("/admin.", "429 admin"),
            ("/adm%u0069n%20", "429 admin"),
            ("/p/a", "200 by-path"),
            ("/p/%61", "429 by-path"),
            ("/p//a", "429 by-path"),
            ("/p%2Fa", "429 by-path"),
            ("/p/a;x=1", "429 by-path"),
            ("/p/a%00/b", "429 by-path"),
            ("/p/a.", "429 by-path"),
            ("/p/%u0061", "429 by-path"),
        ],
    );
    let failures = path_table(
        "Paths: percent-encoding (%u too), empty segments, Windows' trailing dots",
        "hostile-paths-encoded",
        &rows,
    );
    assert!(failures.is_empty(), "{failures:#?}");
    let log = settled(|| stack.worker.log());
    assert_no_secret(TOKEN, "the worker log", [log.as_str()]);
}

// ------------------------------------------------------------------ flood

/// What Redis holds: key count, the bytes `MEMORY USAGE` gives for all
/// keys, and `INFO memory`'s totals.
#[derive(Debug, Clone, Copy)]
struct Memory {
    keys: u64,
    key_bytes: u64,
    used: u64,
    dataset: u64,
}

fn memory(backend: &Backend) -> Memory {
    let info = backend.redis(&["INFO", "memory"]);
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in INFO memory"))
    };
    let key_bytes = keys(backend, "*")
        .iter()
        .map(|k| {
            backend
                .redis(&["MEMORY", "USAGE", k])
                .trim()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    Memory {
        keys: backend.redis(&["DBSIZE"]).trim().parse().unwrap(),
        key_bytes,
        used: field("used_memory"),
        dataset: field("used_memory_dataset"),
    }
}

/// Every key with its serialized value: equal snapshots mean nothing was
/// written, not even a refreshed expiry.
fn snapshot(backend: &Backend) -> Vec<(String, String, i64)> {
    let mut all: Vec<_> = keys(backend, "*")
        .into_iter()
        .map(|k| {
            let dump = backend.redis(&["DUMP", &k]);
            let pexpireat = backend.redis(&["PEXPIRETIME", &k]).trim().parse().unwrap();
            (k, dump, pexpireat)
        })
        .collect();
    all.sort();
    all
}

const FLOOD: usize = 100_000;
const BATCH: usize = 1000;
/// Clients of the part of the flood sent through the worker itself.
const WORKER_FLOOD: usize = 1000;

const FLOOD_RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "site"
key = ["header:x-site"]
algorithm = "windowed"
windows = [["1h", 10, "1m"]]

[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 5
"#;

/// Runs every call in `calls` on Redis at `addr` with the script loaded as
/// `sha`, pipelined `BATCH` at a time; returns how many were denied.
fn flood_redis(addr: &str, sha: &str, calls: impl Iterator<Item = ScriptCall>) -> usize {
    use edge_limiter_local::resp::{encode_command, Decoder, Value as Resp};
    use std::io::{Read, Write};

    let mut conn = std::net::TcpStream::connect(addr).expect("redis");
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let (mut denied, mut calls) = (0, calls.peekable());
    while calls.peek().is_some() {
        let mut wire = Vec::new();
        let mut sent = 0;
        for call in calls.by_ref().take(BATCH) {
            let (keys, call_args) = (call.keys(), call.args());
            let n = keys.len().to_string();
            let mut args: Vec<&str> = vec!["EVALSHA", sha, &n];
            args.extend(keys.iter().chain(&call_args).map(String::as_str));
            encode_command(&args, &mut wire);
            sent += 1;
        }
        conn.write_all(&wire).expect("pipeline written");
        let (mut buf, mut pos, mut decoder) = (Vec::new(), 0, Decoder::default());
        let mut chunk = [0u8; 64 * 1024];
        let mut replies = 0;
        while replies < sent {
            match decoder.decode(&buf, &mut pos).expect("RESP") {
                Some(Resp::Array(items)) => {
                    replies += 1;
                    denied += usize::from(items.first() == Some(&Resp::Int(0)));
                }
                Some(other) => panic!("unexpected reply {other:?}"),
                None => {
                    let n = conn.read(&mut chunk).expect("replies");
                    assert!(n > 0, "redis closed the connection");
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
        }
    }
    denied
}

/// A site-wide rule (everyone lacking `x-site` shares one bucket) and a
/// per-IP rule on every request. Once the site-wide limit is spent, clients
/// never seen before are all denied, and since a denied request consumes
/// nothing anywhere, not one per-IP key may appear: first 1000 of them
/// through the worker, then 100 000 script calls, the very calls the worker
/// makes, pipelined straight into Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_denied_requests_from_100k_identifiers_writes_nothing() {
    use futures_util::{stream, StreamExt};

    let stack = Stack::start(FLOOD_RULES);
    let backend = &stack.backend;
    let http = support::http();
    let send = |ip: String| {
        let request = http
            .get(format!("{}/", stack.worker.url))
            .header("cf-connecting-ip", ip);
        async move {
            let response = request.send().await.expect("the worker answers");
            let status = response.status().as_u16();
            let head = format!("{status}\n{:?}\n", response.headers());
            (status, head + &response.text().await.unwrap_or_default())
        }
    };
    let empty = memory(backend);
    let mut dumps = Vec::new();
    for i in 0..10 {
        let (status, dump) = send(format!("198.18.0.{i}")).await;
        assert_eq!(status, 200, "{dump}");
        dumps.push(dump);
    }
    // Loaded before measuring, as the script cache is no one's state.
    // Straight to Redis, the script goes without the shebang flag stock Redis
    // rejects (the endpoint drops it the same way); the calls then name it by
    // the SHA1 Redis gives it.
    let (_shebang, body) = LIMITER.source.split_once('\n').expect("a shebang line");
    let sha = backend.redis(&["SCRIPT", "LOAD", &format!("#!lua\n{body}")]);
    assert_eq!(sha.len(), 40, "SCRIPT LOAD answered {sha}");
    let before = memory(backend);
    let state = snapshot(backend);

    let started = std::time::Instant::now();
    let answers: Vec<(u16, String)> =
        stream::iter((0..WORKER_FLOOD).map(|n| send(format!("198.19.{}.{}", n >> 8, n & 255))))
            .buffer_unordered(32)
            .collect()
            .await;
    let worker_elapsed = started.elapsed();
    let worker_denied = answers.iter().filter(|(s, _)| *s == 429).count();
    dumps.extend(answers.into_iter().map(|(_, d)| d));
    let after_worker = memory(backend);
    let same_after_worker = state == snapshot(backend);

    let rs = rules(json!([
        {"name": "site", "key": ["header:x-site"], "algorithm": "windowed", "windows": [["1h", 10, "1m"]]},
        {"name": "per-ip", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1h", "burst": 5}
    ]));
    let call = |ip: &str| {
        ScriptCall::decide(
            &[
                (
                    Check {
                        rule: &rs[0],
                        cost: 1,
                    },
                    vec![""],
                ),
                (
                    Check {
                        rule: &rs[1],
                        cost: 1,
                    },
                    vec![ip],
                ),
            ],
            None,
        )
    };
    let started = std::time::Instant::now();
    let calls = (0..FLOOD).map(|n| call(&format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255)));
    let denied = flood_redis(&backend.redis.addr(), &sha, calls);
    let elapsed = started.elapsed();
    let after = memory(backend);

    let mut table = Table::new(
        "Flood of denied requests from distinct IPs (site-wide limit spent)",
        &[
            "",
            "keys",
            "MEMORY USAGE of all keys",
            "used_memory",
            "used_memory_dataset",
        ],
    );
    let row = |label: &str, m: Memory| {
        vec![
            label.to_owned(),
            m.keys.to_string(),
            m.key_bytes.to_string(),
            m.used.to_string(),
            m.dataset.to_string(),
        ]
    };
    let delta = |label: &str, a: Memory, b: Memory| {
        let d = |x: u64, y: u64| format!("{:+}", y as i64 - x as i64);
        vec![
            label.to_owned(),
            d(a.keys, b.keys),
            d(a.key_bytes, b.key_bytes),
            d(a.used, b.used),
            d(a.dataset, b.dataset),
        ]
    };
    table.row(row("empty Redis", empty));
    table.row(row("after 10 admitted requests (worker)", before));
    table.row(row(
        &format!(
            "after {worker_denied} denied through the worker ({} ms)",
            worker_elapsed.as_millis()
        ),
        after_worker,
    ));
    table.row(row(
        &format!(
            "after {denied} denied script calls ({} ms)",
            elapsed.as_millis()
        ),
        after,
    ));
    table.row(delta(
        "written by the 10 admitted (and the script cache)",
        empty,
        before,
    ));
    table.row(delta(
        &format!("written by the {} denied", worker_denied + denied),
        before,
        after,
    ));
    table.print("hostile-flood");

    assert_eq!(
        worker_denied, WORKER_FLOOD,
        "every request of the flood is denied"
    );
    assert_eq!(denied, FLOOD, "every call of the flood is denied");
    assert!(
        same_after_worker,
        "the worker's flood changed a key or its expiry"
    );
    assert_eq!(after.keys, before.keys, "the flood created keys");
    assert!(
        state == snapshot(backend),
        "the flood changed a key or its expiry"
    );
    // The key count, MEMORY USAGE and snapshots above are the exact checks.
    // INFO memory cannot resolve one key (about 100 bytes): its dataset
    // figure moves by up to ~90 KB between runs with no write at all, as
    // Redis's client bookkeeping comes and goes. It bounds gross growth: had
    // every denied client written its per-IP key, it would have grown ~9 MB.
    assert!(
        after.dataset <= before.dataset + NOISE,
        "the flood grew the dataset from {} to {} bytes",
        before.dataset,
        after.dataset
    );
    assert_no_secret(TOKEN, "a worker response", dumps.iter().map(String::as_str));
    let log = settled(|| stack.worker.log());
    assert_no_secret(TOKEN, "the worker log", [log.as_str()]);
}

/// What `used_memory_dataset` may move by without a single write: several
/// times what was seen, a fraction of what the flood would write if it did.
const NOISE: u64 = 512 * 1024;

/// A request target no URL parser takes (`//..` and stray `%` escapes) is
/// forwarded as it came; the demo origin answers it and keeps serving, so
/// one hostile request cannot take the local stack down.
#[tokio::test]
async fn an_unparsable_target_leaves_the_stack_serving() {
    let stack = Stack::start(PATH_RULES);
    let base = stack.worker.url.as_str();
    let ip: &[u8] = b"203.0.113.97";
    let odd = raw_http::get(base, b"//..%zz/x?y=%", &[("cf-connecting-ip", ip)]);
    assert!(odd.status < 500, "{}", odd.dump());
    let after = raw_http::get(base, b"/plain", &[("cf-connecting-ip", ip)]);
    assert_eq!(after.status, 200, "{}", after.dump());
    assert_eq!(after.header("x-demo-origin"), Some("1"));
}
