//! Requests an attacker would send an edge limiter to make it spend CPU or
//! memory, each within what Cloudflare passes to a worker (a URL of 16 KB,
//! 128 KB of headers) and what the worker reads of a body (64 KB), and the
//! rules that make the limiter read every part of them. The cost test
//! (`tests/hostile_cost.rs`) and the bench's hostile part send the same.

/// The longest URL Cloudflare passes on.
pub const URL_BYTES: usize = 16 * 1024;
/// What the worker reads of a body at most (`MAX_BODY_BYTES`).
pub const BODY_BYTES: usize = 64 * 1024;
/// Room left for the other headers below Cloudflare's 128 KB of headers.
pub const HEADER_BYTES: usize = 120 * 1024;

/// The client every shape comes from.
pub const CLIENT_IP: &str = "203.0.113.7";

/// Rules under which a request's every part is read: a rule for other
/// methods than POST (so a form or JSON POST's body is read for its
/// `_method`), one costing more for some method, path patterns that stay
/// alive across a whole path, and keys on headers, cookies, the query,
/// `Authorization`, `request.cf`, JSON and form fields. Limits are far
/// above what a run sends, so every request is decided in Redis; rules
/// keyed on what a client picks are shadow rules, so that one of them
/// refusing an ambiguous request does not spare the rules after it.
/// `[[vars.LIMITER.rules]]` tables, for a `wrangler.toml`.
pub const RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
algorithm = "gcra"
rate = 1000000
period = "1s"

[[vars.LIMITER.rules]]
name = "api"
path_prefix = "/api"
key = ["ip"]
algorithm = "gcra"
rate = 1000000
period = "1s"
cost = { GET = 1, POST = 3, DELETE = 5, default = 1 }

[[vars.LIMITER.rules]]
name = "reads"
methods = ["GET"]
path = "/**.json"
key = ["ip", "query:id"]
algorithm = "gcra"
rate = 1000000
period = "1s"
mode = "shadow"

[[vars.LIMITER.rules]]
name = "deletes"
methods = ["DELETE", "PUT"]
path = "/**/items/*"
key = ["ip"]
algorithm = "gcra"
rate = 1000000
period = "1s"

[[vars.LIMITER.rules]]
name = "login"
path_prefix = "/login"
methods = ["POST"]
key = ["json:/user/name"]
fold = ["json:/user/name"]
algorithm = "gcra"
rate = 1000000
period = "1s"
mode = "shadow"

[[vars.LIMITER.rules]]
name = "fields"
path = "/**"
key = ["json:/a/b", "form:user"]
algorithm = "gcra"
rate = 1000000
period = "1s"
mode = "shadow"

[[vars.LIMITER.rules]]
name = "keyed"
with_headers = ["x-api-key"]
key = ["header:x-api-key", "query:id"]
algorithm = "gcra"
rate = 1000000
period = "1s"
mode = "shadow"

[[vars.LIMITER.rules]]
name = "session"
without_headers = ["x-no-session"]
key = ["cookie:sid", "header:authorization"]
algorithm = "gcra"
rate = 1000000
period = "1s"
mode = "shadow"

[[vars.LIMITER.rules]]
name = "country"
path = "/**/x*/**"
key = ["cf:country", "user-agent"]
algorithm = "gcra"
rate = 1000000
period = "1s"
mode = "shadow"
"#;

/// One request, as a client sends it.
#[derive(Debug, Clone)]
pub struct Shape {
    /// What it is, for reports.
    pub name: &'static str,
    /// The method.
    pub method: &'static str,
    /// The path, as sent (percent-escapes and all).
    pub path: String,
    /// The query, without `?`.
    pub query: Option<String>,
    /// Headers, `cf-connecting-ip` among them.
    pub headers: Vec<(String, String)>,
    /// The body (empty for none).
    pub body: Vec<u8>,
}

impl Shape {
    fn new(name: &'static str, method: &'static str, path: impl Into<String>) -> Shape {
        Shape {
            name,
            method,
            path: path.into(),
            query: None,
            headers: vec![("cf-connecting-ip".to_owned(), CLIENT_IP.to_owned())],
            body: Vec::new(),
        }
    }

    fn query(mut self, query: impl Into<String>) -> Shape {
        self.query = Some(query.into());
        self
    }

    fn header(mut self, name: &str, value: impl Into<String>) -> Shape {
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    fn body(mut self, content_type: &str, body: impl Into<Vec<u8>>) -> Shape {
        self.body = body.into();
        self.header("content-type", content_type)
    }

    /// Bytes the request carries: path, query, header names and values,
    /// body.
    pub fn size(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        self.path.len() + self.query.as_ref().map_or(0, String::len) + headers + self.body.len()
    }
}

/// `piece(i)` for i = 0, 1, ... joined by `separator`, as long as the
/// whole stays within `bytes`.
fn repeated(bytes: usize, separator: &str, piece: impl Fn(usize) -> String) -> String {
    let mut out = String::new();
    for i in 0.. {
        let next = piece(i);
        let sep = if i == 0 { "" } else { separator };
        if out.len() + sep.len() + next.len() > bytes {
            break;
        }
        out.push_str(sep);
        out.push_str(&next);
    }
    out
}

/// A JSON array of `item`s, as many as fit in `bytes`.
fn json_array(bytes: usize, item: &str) -> String {
    format!("[{}]", repeated(bytes - 2, ",", |_| item.to_owned()))
}

/// `n` of `c`.
fn run(c: &str, n: usize) -> String {
    c.repeat(n)
}

const JSON: &str = "application/json";
const FORM: &str = "application/x-www-form-urlencoded";

/// An ordinary request: what every shape's cost is compared with.
pub fn ordinary() -> Shape {
    Shape::new("ordinary GET", "GET", "/api/items/42")
        .query("id=7&page=2")
        .header(
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0",
        )
        .header("accept", "text/html,application/xhtml+xml")
        .header("cookie", "sid=s3cr3t; theme=dark")
        .header("x-api-key", "k-1234")
}

/// Every hostile shape.
pub fn shapes() -> Vec<Shape> {
    let mut all = json_shapes();
    all.extend(method_shapes());
    all.extend(path_shapes());
    all.extend(header_shapes());
    all.extend(form_shapes());
    all
}

fn json_shapes() -> Vec<Shape> {
    let post = |name, body: String| Shape::new(name, "POST", "/login").body(JSON, body);
    // 6 400 members named "" under a 32 000-byte name, each with another
    // value than the one before.
    let members = repeated(BODY_BYTES - 32_011, ",", |i| format!("\"\":{}", i % 2));
    let zeros_under_long_name = format!(
        "{{\"{}\":{}}}",
        run("/", 32_000),
        json_array(BODY_BYTES - 32_010, "0")
    );
    let deep = format!(
        "{}{}{}",
        run("{\"a\":", 120),
        json_array(BODY_BYTES - 1_000, "0"),
        run("}", 120)
    );
    vec![
        post(
            "JSON: 6 400 repeated members under a 32 KB name",
            format!("{{\"{}\":{{{members}}}}}", run("/", 32_000)),
        ),
        post(
            "JSON: 16 000 items under a 32 KB name",
            zeros_under_long_name,
        ),
        post(
            "JSON: an array of 32 000 zeros",
            json_array(BODY_BYTES, "0"),
        ),
        post("JSON: 120 levels deep, then 32 000 items", deep),
        post(
            "JSON: 127 levels of arrays, the deepest legal",
            format!("{}{}", run("[", 127), run("]", 127)),
        ),
        post(
            "JSON: 32 000 levels, refused",
            format!("{}{}", run("[", 32_000), run("]", 32_000)),
        ),
        post(
            "JSON: 6 000 distinct members",
            format!(
                "{{{}}}",
                repeated(BODY_BYTES - 2, ",", |i| format!("\"m{i}\":{i}"))
            ),
        ),
        post(
            "JSON: one member named 10 000 times, values alternating",
            format!(
                "{{{}}}",
                repeated(BODY_BYTES - 2, ",", |i| format!("\"u\":{}", i % 2))
            ),
        ),
        post(
            "JSON: a 64 KB member name",
            format!("{{\"{}\":1}}", run("a", BODY_BYTES - 8)),
        ),
        post(
            "JSON: 1 500 40-digit numbers at the keyed pointer",
            format!(
                "{{\"a\":{{\"b\":{}}}}}",
                json_array(BODY_BYTES - 20, &format!("{}e-1", run("9", 40)))
            ),
        ),
        post(
            "JSON: 10 000 strings at the keyed pointer",
            format!(
                "{{\"user\":{{\"name\":{}}}}}",
                json_array(BODY_BYTES - 30, "\"Ab\"")
            ),
        ),
    ]
}

fn method_shapes() -> Vec<Shape> {
    let values = repeated(110_000, ",", |i| i.to_string());
    // With the query, within 128 KB of request line and headers.
    let fewer = repeated(90_000, ",", |i| i.to_string());
    let form = repeated(BODY_BYTES, "&", |i| format!("_method={i}"));
    let query = repeated(URL_BYTES - 200, "&", |i| format!("_method={i}"));
    vec![
        Shape::new("X-HTTP-Method-Override: 20 000 values", "POST", "/api/x")
            .header("x-http-method-override", values),
        Shape::new("a form of 6 500 _method fields", "POST", "/api/x").body(FORM, form.clone()),
        Shape::new("_method 1 400 times in the query", "POST", "/api/x").query(query.clone()),
        Shape::new(
            "_method in header, query and form at once",
            "POST",
            "/api/x",
        )
        .header("x-http-method-override", fewer)
        .query(query)
        .body(FORM, form),
        Shape::new("a JSON _method named 10 000 times", "POST", "/api/items/1").body(
            JSON,
            format!(
                "{{{}}}",
                repeated(BODY_BYTES - 2, ",", |i| format!(
                    "\"_method\":\"{}\"",
                    i % 3
                ))
            ),
        ),
    ]
}

fn path_shapes() -> Vec<Shape> {
    let routed = format!(
        "/index.php/x/{}y.json",
        run("a%2561/", (URL_BYTES - 100) / 7)
    );
    vec![
        Shape::new(
            "a path of 2 300 encoded segments behind index.php",
            "POST",
            routed,
        )
        .body(JSON, "{\"a\":{\"b\":1}}"),
        Shape::new(
            "8 000 numeric segments",
            "GET",
            run("/0", URL_BYTES / 2 - 10),
        ),
        Shape::new("8 000 segments", "GET", run("/x", URL_BYTES / 2 - 10)),
        Shape::new(
            "5 000 %25 escapes in the path",
            "GET",
            format!("/{}61", run("%25", URL_BYTES / 3 - 10)),
        ),
        Shape::new(
            "2 700 %u escapes in the path",
            "GET",
            format!("/{}", run("%u0130", URL_BYTES / 6 - 10)),
        ),
        Shape::new(
            "segments ending in dots and ;parameters",
            "GET",
            run("/a.;b=1", URL_BYTES / 7 - 10),
        ),
        Shape::new("a query of 3 000 parameters", "GET", "/api/items.json").query(repeated(
            URL_BYTES - 100,
            "&",
            |i| format!("p{i}=1"),
        )),
        Shape::new("the keyed parameter 2 700 times", "GET", "/api/items.json")
            .query(repeated(URL_BYTES - 100, "&", |i| {
                format!("id={}", i % 2 + 7)
            }))
            .header("x-api-key", "k"),
        Shape::new(
            "a keyed value of 5 000 %25 escapes",
            "GET",
            "/api/items.json",
        )
        .query(format!("id={}61", run("%25", URL_BYTES / 3 - 10))),
    ]
}

fn header_shapes() -> Vec<Shape> {
    let get = |name| Shape::new(name, "GET", "/api/items/1");
    let mut many = get("8 000 headers");
    for i in 0..8_000 {
        many = many.header(&format!("x-{i}"), "1");
    }
    let mut keys = get("x-api-key sent 8 000 times");
    for _ in 0..8_000 {
        keys = keys.header("x-api-key", "k");
    }
    let basic = repeated(HEADER_BYTES, "", |_| "YWxhZGRpbjpvcGVuc2VzYW1l".to_owned());
    vec![
        many,
        keys,
        get("30 000 cookies").header("cookie", repeated(HEADER_BYTES, ";", |_| "a=1".into())),
        get("20 000 sid cookies, one value")
            .header("cookie", repeated(HEADER_BYTES, "; ", |_| "sid=1".into())),
        get("a 120 KB Basic credential").header("authorization", format!("Basic {basic}")),
        get("a 120 KB Bearer token").header("authorization", format!("Bearer {basic}")),
        get("x-api-key of 20 000 comma pieces")
            .header("x-api-key", repeated(HEADER_BYTES, ",", |i| i.to_string())),
        get("x-api-key of 120 000 commas").header("x-api-key", run(",", HEADER_BYTES)),
        get("a 120 KB User-Agent").header("user-agent", run("M", HEADER_BYTES)),
    ]
}

fn form_shapes() -> Vec<Shape> {
    let post = |name| Shape::new(name, "POST", "/api/account");
    let part = "--B\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\nu\r\n";
    let parts = format!("{}--B--\r\n", run(part, (BODY_BYTES - 10) / part.len()));
    let long = run("b", 200);
    let near = format!("\r\n--{}x", run("b", 199));
    let near_misses = format!(
        "--{long}\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\nu{}\r\n--{long}--\r\n",
        run(&near, (BODY_BYTES - 700) / near.len())
    );
    let folded = format!(
        "--B\r\nContent-Disposition: form-data;{}\r\n name=\"user\"\r\n\r\nu\r\n--B--\r\n",
        run("\r\n x=1;", (BODY_BYTES - 100) / 7)
    );
    let multipart = |boundary: &str| format!("multipart/form-data; boundary={boundary}");
    vec![
        post("1 100 multipart parts").body(&multipart("B"), parts),
        post("a 200-byte boundary, near misses on every line").body(&multipart(&long), near_misses),
        post("a multipart part head of 9 000 folded lines").body(&multipart("B"), folded),
        post("an unclosed multipart body")
            .body(&multipart("B"), run("--B\r\n\r\nu\r\n", BODY_BYTES / 11)),
        post("the keyed form field 9 000 times")
            .body(FORM, repeated(BODY_BYTES, "&", |_| "user=a".into())),
        post("a form of 64 KB not UTF-8").body(FORM, vec![0xff; BODY_BYTES]),
        post("a body beyond the 64 KB read").body(FORM, run("user=a&", 2 * BODY_BYTES / 7)),
    ]
}
