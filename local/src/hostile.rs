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
    json_shapes()
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
