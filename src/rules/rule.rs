//! A rule: which requests it governs, what identifies their client, and
//! the figures that limit them, as the configuration's checks build it.

use std::borrow::Cow;

use super::{
    body, canon,
    cidr::Cidr,
    client_form::ClientForm,
    fields::FieldError,
    json,
    lease::Lease,
    pattern::PathPattern,
    policy::Policy,
    request::{CfField, RequestMeta, ANY_METHOD},
    shared::Pool,
};

/// Time budget for the Redis call when a rule gives none, ms.
pub const DEFAULT_BUDGET_MS: u64 = 1000;

/// A rule's place in its configuration: how a rule is named across an
/// await or a response, where a borrow cannot go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(pub usize);

/// One rule: which requests, keyed how, limited by what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Unique name; part of every Redis key and header the rule produces.
    pub name: String,
    /// Host the request must be for: exact, or `*.example.com` for any
    /// subdomain. `None`: any host.
    pub host: Option<String>,
    /// Requests whose normalized path is this or lies below it; `/` matches all.
    pub path_prefix: String,
    /// A path pattern the normalized path must match as a whole: `*` stands
    /// for any run of characters within one segment, `**` for anything.
    pub path: Option<PathPattern>,
    /// Upper-case methods this rule applies to; empty means all.
    pub methods: Vec<String>,
    /// Headers (lower-case names) the request must carry, e.g. an API key:
    /// with [`Rule::without_headers`] this splits traffic into classes.
    pub with_headers: Vec<String>,
    /// Headers (lower-case names) the request must not carry.
    pub without_headers: Vec<String>,
    /// What identifies a client; several parts are joined.
    pub key: Vec<KeyPart>,
    /// The algorithm and its numbers.
    pub policy: Policy,
    /// Units each matching request costs.
    pub cost: Cost,
    /// Enforce the rule, or only report what it would do.
    pub mode: Mode,
    /// What to do when Redis cannot decide in time.
    pub fail: FailMode,
    /// Total time allowed for the Redis call, milliseconds.
    pub budget_ms: u64,
    /// A body to send with this rule's 429 instead of the problem document.
    pub deny_body: Option<DenyBody>,
    /// When not empty, a request's charge, made up front, is kept only when
    /// the origin answers one of these statuses, and given back otherwise
    /// (after the response).
    pub count_status: Vec<u16>,
    /// Once the rule denies a client, it keeps denying that client this
    /// long, milliseconds, whatever the rate would allow meanwhile.
    pub penalty_ms: Option<u64>,
    /// A response header (lower-case name) in which the origin reports
    /// what the request cost: the rule's `cost` is charged up front as the
    /// estimate, and the difference settled after the response.
    pub cost_header: Option<String>,
    /// Units the rule may lease to an isolate ahead of its requests, and
    /// for how long; `None`: every request is decided in Redis.
    pub lease: Option<Lease>,
    /// Whether limits stored in Redis may replace the rule's figures, for
    /// every client or one (`edge-limiter limit`): each decision then reads
    /// the client's override key in the same call.
    pub overrides: bool,
    /// Clients (`CF-Connecting-IP`) in these blocks are not subject to the rule.
    pub except_ips: Vec<Cidr>,
    /// How its keys show a client's identifier (`stats_clients`).
    pub form: ClientForm,
    /// With `regions = "shared"`: one limit across every region, each
    /// region spending a pool of this size that the home granted it.
    pub shared: Option<Pool>,
}

/// A piece of the request that identifies the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// `CF-Connecting-IP`, set by Cloudflare and not forgeable by the client.
    Ip,
    /// A request header, e.g. an API key (name lower-cased). Naming
    /// `x-forwarded-for` here is how a deployment behind a trusted proxy opts
    /// in to that header; it is never used otherwise.
    Header(String),
    /// A cookie's value (name as [`canon::name`] reads it).
    Cookie(String),
    /// A query parameter's value (name as [`canon::name`] reads it).
    Query(String),
    /// The normalized request path.
    Path,
    /// The `User-Agent` header.
    UserAgent,
    /// A fact the edge knows of the request (`request.cf`).
    Cf(CfField),
    /// A value in a JSON body, by RFC 6901 pointer (`/user/name`).
    Json(String),
    /// A field of an `application/x-www-form-urlencoded` or
    /// `multipart/form-data` body (name as [`canon::name`] reads it).
    Form(String),
    /// Another part, its value trimmed and case-folded, for values the
    /// origin compares that way (account names, e-mail addresses).
    Folded(Box<KeyPart>),
}

impl KeyPart {
    /// Whether reading this part needs the request's body.
    pub fn reads_body(&self) -> bool {
        match self {
            KeyPart::Json(_) | KeyPart::Form(_) => true,
            KeyPart::Folded(inner) => inner.reads_body(),
            _ => false,
        }
    }

    /// Whether reading this part needs `request.cf`.
    pub fn reads_cf(&self) -> bool {
        match self {
            KeyPart::Cf(_) => true,
            KeyPart::Folded(inner) => inner.reads_cf(),
            _ => false,
        }
    }

    /// The request header reading this part looks at, if any.
    pub fn header(&self) -> Option<&str> {
        match self {
            KeyPart::Ip => Some("cf-connecting-ip"),
            KeyPart::Header(name) => Some(name),
            KeyPart::Cookie(_) => Some("cookie"),
            KeyPart::UserAgent => Some("user-agent"),
            KeyPart::Form(_) => Some("content-type"),
            KeyPart::Folded(inner) => inner.header(),
            KeyPart::Query(_) | KeyPart::Path | KeyPart::Cf(_) | KeyPart::Json(_) => None,
        }
    }
}

impl std::fmt::Display for KeyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::Ip => write!(f, "ip"),
            KeyPart::Header(n) => write!(f, "header:{n}"),
            KeyPart::Cookie(n) => write!(f, "cookie:{n}"),
            KeyPart::Query(n) => write!(f, "query:{n}"),
            KeyPart::Path => write!(f, "path"),
            KeyPart::UserAgent => write!(f, "user-agent"),
            KeyPart::Cf(field) => write!(f, "cf:{}", field.name()),
            KeyPart::Json(pointer) => write!(f, "json:{pointer}"),
            KeyPart::Form(n) => write!(f, "form:{n}"),
            KeyPart::Folded(inner) => inner.fmt(f),
        }
    }
}

/// Units a request costs: one figure, or one per method with a default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cost {
    /// Cost of methods not listed.
    pub default: u64,
    /// Upper-case method and its cost.
    pub per_method: Vec<(String, u64)>,
}

impl Cost {
    /// The same cost for every method.
    pub fn flat(units: u64) -> Cost {
        Cost {
            default: units,
            per_method: vec![],
        }
    }

    /// Units a request with this (upper-case) method costs; 0 means it is
    /// reported on but never consumes or is denied.
    pub fn for_method(&self, method: &str) -> u64 {
        if method == ANY_METHOD {
            return self.max();
        }
        self.per_method
            .iter()
            .find(|(m, _)| m == method)
            .map_or(self.default, |(_, c)| *c)
    }

    /// What a request costs that the origin may take for any of these
    /// methods ([`crate::rules::rule::RequestMeta::methods`]): the most of them.
    pub fn for_methods(&self, methods: &[String]) -> u64 {
        methods
            .iter()
            .map(|m| self.for_method(m))
            .max()
            .unwrap_or(self.default)
    }

    pub(crate) fn max(&self) -> u64 {
        self.per_method
            .iter()
            .map(|(_, c)| *c)
            .fold(self.default, u64::max)
    }

    /// Whether every method's cost is one `policy` can ever admit: the
    /// error names `cost`.
    pub fn fits(&self, policy: &Policy) -> Result<(), FieldError> {
        if self.max() <= policy.capacity() {
            return Ok(());
        }
        Err(FieldError {
            field: "cost".into(),
            problem: format!(
                "{} exceeds what the policy can ever admit ({}); no such request would pass",
                self.max(),
                policy.capacity()
            ),
        })
    }
}

/// Whether a rule blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Requests beyond the limit get 429.
    Enforce,
    /// The decision is made, logged and put in the headers, but never
    /// blocks; a request this rule alone would deny is not counted by it.
    Shadow,
}

/// Behaviour when Redis is unreachable, slow, or answers nonsense.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
    /// Forward the request unlimited, and say so in a header and a log line.
    Open,
    /// Answer 503 with `Retry-After`.
    Closed,
}

/// A configured 429 body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenyBody {
    /// The body, sent as is.
    pub body: String,
    /// Its media type.
    pub content_type: String,
}

impl Rule {
    /// A rule matching every request, keyed on the client IP, with `policy`
    /// and every other field at its default; for tests and simulations.
    pub fn with_policy(name: &str, policy: Policy) -> Rule {
        Rule {
            name: name.to_owned(),
            host: None,
            path_prefix: "/".into(),
            path: None,
            methods: vec![],
            with_headers: vec![],
            without_headers: vec![],
            key: vec![KeyPart::Ip],
            policy,
            cost: Cost::flat(1),
            mode: Mode::Enforce,
            fail: FailMode::Closed,
            budget_ms: DEFAULT_BUDGET_MS,
            deny_body: None,
            count_status: vec![],
            penalty_ms: None,
            cost_header: None,
            lease: None,
            overrides: false,
            except_ips: vec![],
            form: ClientForm::Readable,
            shared: None,
        }
    }
}

fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(domain) => host
            .strip_suffix(domain)
            .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
        None => pattern == host,
    }
}

impl Rule {
    /// Whether the rule works under `policy` in place of its own figures,
    /// as the configuration checks a rule beyond its figures: its cost
    /// within what `policy` can admit, its lease one it can grant. The
    /// error names the rule's field.
    pub fn fits(&self, policy: &Policy) -> Result<(), FieldError> {
        self.cost.fits(policy)?;
        match &self.lease {
            Some(lease) => lease.fits(policy),
            None => Ok(()),
        }
    }

    /// Whether this rule applies to the request.
    pub fn matches(&self, req: &RequestMeta) -> bool {
        (self.methods.is_empty()
            || req
                .methods()
                .iter()
                .any(|m| m == ANY_METHOD || self.methods.contains(m)))
            && self.matches_all_but_method(req)
    }

    /// Whether deciding this rule needs the request's body: a matching rule
    /// keyed on it, or one that a form or JSON POST's `_method` field could
    /// make apply (a rule for other methods) or cost more.
    pub fn needs_body(&self, req: &RequestMeta) -> bool {
        let other_methods = !self.methods.is_empty() && !self.methods.iter().any(|m| m == "POST");
        let dearer = self.cost.max() > self.cost.for_method("POST");
        let overridable = req.method == "POST"
            && (other_methods || dearer)
            && req
                .header("content-type")
                .is_some_and(|t| body::is_form(t) || body::is_json(t))
            && self.matches_all_but_method(req);
        overridable || (self.reads_body() && self.matches(req))
    }

    fn matches_all_but_method(&self, req: &RequestMeta) -> bool {
        req.on_path(&self.path_prefix, self.path.as_ref())
            && self
                .host
                .as_deref()
                .is_none_or(|h| host_matches(h, &req.host))
            && self.with_headers.iter().all(|h| req.has_header(h))
            && !self.without_headers.iter().any(|h| req.has_header(h))
            && !self.exempts(req)
    }

    /// Whether the client's address lies in one of `except_ips`.
    fn exempts(&self, req: &RequestMeta) -> bool {
        !self.except_ips.is_empty()
            && req
                .header("cf-connecting-ip")
                .and_then(|ip| ip.trim().parse().ok())
                .is_some_and(|ip| self.except_ips.iter().any(|c| c.contains(ip)))
    }

    /// The values that identify the client, one per key part, each in its
    /// canonical form (see [`canon`]). A part the request lacks is empty:
    /// such clients share one bucket per rule. A part the request gives
    /// several different values for (`?k=a&k=b`, two `sid` cookies) is
    /// [`Ambiguous`], as is a header sent twice with different values:
    /// the origin may read either, so no bucket is right.
    pub fn identifier<'a>(&self, req: &'a RequestMeta) -> Result<Vec<Cow<'a, str>>, Ambiguous> {
        self.key.iter().map(|part| part.value(req)).collect()
    }

    /// Whether reading this rule's key needs the request's body.
    pub fn reads_body(&self) -> bool {
        self.key.iter().any(KeyPart::reads_body)
    }

    /// Whether reading this rule's key needs `request.cf`.
    pub fn reads_cf(&self) -> bool {
        self.key.iter().any(KeyPart::reads_cf)
    }

    /// The request headers this rule's tests and key read, besides
    /// [`super::request::headers_always_read`].
    pub fn headers_read(&self) -> impl Iterator<Item = &str> {
        self.with_headers
            .iter()
            .chain(&self.without_headers)
            .map(String::as_str)
            .chain(self.key.iter().filter_map(KeyPart::header))
    }
}

impl KeyPart {
    /// This part's canonical value in `req` (empty when missing).
    fn value<'a>(&self, req: &'a RequestMeta) -> Result<Cow<'a, str>, Ambiguous> {
        let header = |name: &str| Cow::Borrowed(req.header(name).unwrap_or_default());
        match self {
            KeyPart::Ip => Ok(canon::ip(
                req.header("cf-connecting-ip").unwrap_or_default(),
            )),
            KeyPart::Header(name) if name == "x-forwarded-for" => Ok(canon::forwarded_client(
                req.header(name).unwrap_or_default(),
            )),
            // Commas are part of real User-Agent strings, which a client
            // picks freely anyway.
            KeyPart::Header(name) if name == "user-agent" => Ok(header(name)),
            KeyPart::Header(name) if name == "authorization" || name == "proxy-authorization" => {
                self.one(&mut req.header_pieces(name), &canon::credentials)
            }
            // Each value as an origin that parses it as a number or UUID reads it.
            KeyPart::Header(name) => self.one(&mut req.header_pieces(name), &|v| {
                canon::number_or_uuid(Cow::Borrowed(v))
            }),
            KeyPart::Cookie(name) => self.one(&mut req.cookie_values(name), &|v| {
                canon::number_or_uuid(canon::cookie_value(v))
            }),
            KeyPart::Query(name) => self.one(&mut req.query_values(name), &|v| {
                canon::number_or_uuid(canon::form_value_of(v))
            }),
            KeyPart::Path => Ok(Cow::Borrowed(req.path.as_str())),
            KeyPart::UserAgent => Ok(header("user-agent")),
            KeyPart::Cf(field) => Ok(Cow::Borrowed(req.cf(*field).unwrap_or_default())),
            KeyPart::Json(pointer) => match req.json().map(|doc| json::value(doc, pointer)) {
                Some(Err(json::Repeated)) => Err(Ambiguous { part: self.clone() }),
                Some(Ok(value)) => Ok(canon::number_or_uuid(value.unwrap_or_default())),
                None => Ok(Cow::Borrowed("")),
            },
            KeyPart::Form(name) => {
                let content_type = req.header("content-type").unwrap_or_default();
                let mut values = req
                    .body
                    .iter()
                    .flat_map(|b| body::form_fields(b, content_type, name));
                self.one(&mut values, &canon::number_or_uuid)
            }
            KeyPart::Folded(inner) => match inner.value(req) {
                Err(Ambiguous { .. }) => Err(Ambiguous { part: self.clone() }),
                Ok(v) => Ok(Cow::Owned(canon::folded(&v))),
            },
        }
    }

    /// The one value the `raw` values give for this part as `read` reads
    /// them, however often (empty for none); [`Ambiguous`] at the first
    /// that differs. A value spelled as the first is not read again.
    fn one<'a, R: Clone + PartialEq>(
        &self,
        raw: &mut dyn Iterator<Item = R>,
        read: &dyn Fn(R) -> Cow<'a, str>,
    ) -> Result<Cow<'a, str>, Ambiguous> {
        let Some(first_raw) = raw.next() else {
            return Ok(Cow::Borrowed(""));
        };
        let first = read(first_raw.clone());
        for r in raw {
            if r != first_raw && read(r) != first {
                return Err(Ambiguous { part: self.clone() });
            }
        }
        Ok(first)
    }
}

/// A request that names one key part more than once with different values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ambiguous {
    /// The key part, as configured (`query:k`, `cookie:sid`).
    pub part: KeyPart,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{
        canon::{normalize_host, normalize_path},
        config::Config,
    };
    use serde_json::json;

    fn rule(extra: serde_json::Value) -> Rule {
        let mut r =
            json!({"name": "r", "key": ["ip"], "algorithm": "gcra", "rate": 1, "period": "1s"});
        r.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        Config::from_json(&json!({ "rules": [r] }))
            .unwrap()
            .rules
            .remove(0)
    }

    fn req(method: &str, path: &str, query: Option<&str>, headers: &[(&str, &str)]) -> RequestMeta {
        RequestMeta {
            method: method.into(),
            host: "example.com".into(),
            path: normalize_path(path),
            query: query.map(Into::into),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            ..RequestMeta::default()
        }
    }

    fn ids(r: &Rule, q: &RequestMeta) -> Result<Vec<String>, Ambiguous> {
        r.identifier(q)
            .map(|id| id.iter().map(|p| p.to_string()).collect())
    }

    /// The identifier of rule `r` for each request, keyed by its label.
    fn one_id(
        r: &Rule,
        query: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Vec<String>, Ambiguous> {
        ids(r, &req("GET", "/", query, headers))
    }

    #[test]
    fn query_values_share_a_bucket_however_spelled() {
        let r = rule(json!({"key": ["query:k"]}));
        for spelling in [
            "k=a",
            "k=%61",
            "k=%2561",
            "%6B=a",
            "K=a",
            "k=a&other=1",
            "x=1;k=a",
            "k=a&k=%61",
        ] {
            assert_eq!(
                one_id(&r, Some(spelling), &[]),
                Ok(vec!["a".into()]),
                "{spelling}"
            );
        }
        for spelling in ["k=a+b", "k=a%20b", "k=a%2Bb", "k=a%2bb", "k=a+b&k=a%20b"] {
            assert_eq!(
                one_id(&r, Some(spelling), &[]),
                Ok(vec!["a b".into()]),
                "{spelling}"
            );
        }
        assert_eq!(one_id(&r, Some("k=%zz"), &[]), Ok(vec!["%zz".into()]));
        assert_eq!(one_id(&r, Some("other=1"), &[]), Ok(vec!["".into()]));
        assert_eq!(one_id(&r, None, &[]), Ok(vec!["".into()]));
        assert_eq!(one_id(&r, Some("k"), &[]), Ok(vec!["".into()]));
        // A configured name is read the way request names are.
        let dotted = rule(json!({"key": ["query:User.Id"]}));
        assert_eq!(
            one_id(&dotted, Some("user_id=7"), &[]),
            Ok(vec!["7".into()])
        );
    }

    #[test]
    fn repeated_parameters_with_different_values_are_ambiguous() {
        let r = rule(json!({"key": ["ip", "query:k"]}));
        let ambiguous = Err(Ambiguous {
            part: KeyPart::Query("k".into()),
        });
        for spelling in [
            "k=x&k=y",
            "k=y&k=x",
            "k=x&K=y",
            "k=&k=y",
            "k=x;k=y",
            "k=x&%6b=y",
        ] {
            assert_eq!(one_id(&r, Some(spelling), &[]), ambiguous, "{spelling}");
        }
    }

    #[test]
    fn cookies_share_a_bucket_however_spelled() {
        let r = rule(json!({"key": ["cookie:sid"]}));
        for cookie in [
            "sid=s3",
            "sid=\"s3\"",
            "sid=%73%33",
            "sid=\"%73%33\"",
            "sid=%22s3%22",
            "a=1; sid=s3",
            "SID=s3",
            "sid=s3; sid=\"s3\"",
            " sid = s3 ",
            "a=1,sid=s3",
        ] {
            assert_eq!(
                one_id(&r, None, &[("cookie", cookie)]),
                Ok(vec!["s3".into()]),
                "{cookie}"
            );
        }
        let two_headers = one_id(&r, None, &[("cookie", "a=1"), ("cookie", "sid=s3")]);
        assert_eq!(two_headers, Ok(vec!["s3".into()]));
        let ambiguous = Err(Ambiguous {
            part: KeyPart::Cookie("sid".into()),
        });
        for cookie in ["sid=a; sid=b", "sid=b; sid=a", "sid=a; SID=b"] {
            assert_eq!(
                one_id(&r, None, &[("cookie", cookie)]),
                ambiguous,
                "{cookie}"
            );
        }
    }

    #[test]
    fn a_header_sent_twice_with_different_values_is_ambiguous() {
        let r = rule(json!({"key": ["header:x-api-key"]}));
        // How the runtime hands over `x-api-key: k1` sent once, or twice.
        for value in ["k1", "k1, k1", "k1,k1", "k1, "] {
            let id = one_id(&r, None, &[("x-api-key", value)]);
            assert_eq!(id, Ok(vec!["k1".into()]), "{value}");
        }
        let twice = one_id(&r, None, &[("x-api-key", "k1"), ("x-api-key", "k1")]);
        assert_eq!(twice, Ok(vec!["k1".into()]));
        let ambiguous = Err(Ambiguous {
            part: KeyPart::Header("x-api-key".into()),
        });
        for value in ["k1, fresh", "fresh, k1", "k1,fresh"] {
            assert_eq!(
                one_id(&r, None, &[("x-api-key", value)]),
                ambiguous,
                "{value}"
            );
        }
        let two = one_id(&r, None, &[("x-api-key", "k1"), ("x-api-key", "fresh")]);
        assert_eq!(two, ambiguous);
        // A User-Agent holds commas of its own: it is taken whole.
        let browser = "Mozilla/5.0 (KHTML, like Gecko)";
        for part in ["user-agent", "header:user-agent"] {
            let r = rule(json!({ "key": [part] }));
            let id = one_id(&r, None, &[("user-agent", browser)]);
            assert_eq!(id, Ok(vec![browser.into()]), "{part}");
        }
    }

    #[test]
    fn a_trusted_proxy_list_counts_its_last_address() {
        let r = rule(json!({"key": ["header:x-forwarded-for"]}));
        for list in ["203.0.113.1", "spoofed, 203.0.113.1", "a, b, 203.0.113.1"] {
            assert_eq!(
                one_id(&r, None, &[("x-forwarded-for", list)]),
                Ok(vec!["203.0.113.1".into()]),
                "{list}"
            );
        }
    }

    #[test]
    fn matching_by_method_and_prefix() {
        let r = rule(json!({"path_prefix": "/login", "methods": ["POST"]}));
        assert!(r.matches(&req("POST", "/login", None, &[])));
        assert!(r.matches(&req("POST", "/login/x", None, &[])));
        assert!(!r.matches(&req("GET", "/login", None, &[])));
        assert!(!r.matches(&req("POST", "/", None, &[])));
        assert!(rule(json!({})).matches(&req("GET", "/anything", None, &[])));
        assert!(
            !r.matches(&req("POST", "/loginx", None, &[])),
            "prefixes end at a segment"
        );
    }

    #[test]
    fn head_and_method_overrides_cannot_slip_past_a_rule_for_one_method() {
        let get = rule(json!({"methods": ["GET"]}));
        let delete = rule(json!({"methods": ["DELETE"]}));
        assert!(get.matches(&req("HEAD", "/", None, &[])));
        assert!(!delete.matches(&req("HEAD", "/", None, &[])));
        for (name, value) in [
            ("x-http-method-override", "delete"),
            ("x-http-method", "DELETE"),
            ("x-method-override", "PATCH, DELETE"),
        ] {
            let post = req("POST", "/", None, &[(name, value)]);
            assert!(delete.matches(&post), "{name}: {value}");
            assert!(!get.matches(&post), "{name}: {value}");
            // Only a POST is overridden: a GET asks for nothing else.
            assert!(!delete.matches(&req("GET", "/", None, &[(name, value)])));
        }
        // A `_method` field: in the query, or in a form body once read.
        let query = req("POST", "/", Some("_method=delete"), &[]);
        assert!(delete.matches(&query));
        let form = [("content-type", "application/x-www-form-urlencoded")];
        let mut posted = req("POST", "/", None, &form);
        assert!(delete.needs_body(&posted), "the body may name a method");
        assert!(!get.matches(&posted));
        posted.body = Some(b"x=1&_method=DELETE".to_vec());
        assert!(delete.matches(&posted));
        // A JSON body's `_method` (Laravel), the last if named twice, as
        // PHP's json_decode keeps it.
        let mut json = req("POST", "/", None, &[("content-type", "application/json")]);
        assert!(delete.needs_body(&json), "a JSON body may name a method");
        json.body = Some(br#"{"_method": "get", "_method": " delete "}"#.to_vec());
        assert!(delete.matches(&json));
        assert!(!get.matches(&json));
        let nested = req("POST", "/", None, &[("content-type", "text/x; v=1+json")]);
        assert!(delete.needs_body(&nested), "Laravel's check is a substring");
        let plain = req("POST", "/", None, &[("content-type", "text/plain")]);
        assert!(
            !delete.needs_body(&plain),
            "only forms and JSON carry _method"
        );
        let post_rule = rule(json!({"methods": ["POST", "DELETE"]}));
        assert!(!post_rule.needs_body(&req("POST", "/", None, &form)));
        // Charged what the costliest method it may be taken for costs.
        let costly = rule(json!({"burst": 5, "cost": {"DELETE": 5, "GET": 3, "default": 1}}));
        let post = req("POST", "/", None, &[("x-http-method-override", "DELETE")]);
        assert_eq!(costly.cost.for_methods(post.methods()), 5);
        let head = req("HEAD", "/", None, &[]);
        assert_eq!(costly.cost.for_methods(head.methods()), 3);
        assert_eq!(head.methods(), ["HEAD", "GET"]);
    }

    #[test]
    fn a_post_naming_more_than_16_methods_counts_as_every_method() {
        let deletes = rule(json!({"methods": ["DELETE"]}));
        let costly = rule(json!({"burst": 9, "cost": {"DELETE": 9, "default": 1}}));
        let naming = |n: u8| {
            let list: Vec<String> = (0..n)
                .map(|i| format!("M{}", char::from(b'A' + i)))
                .collect();
            let list = list.join(", ");
            req("POST", "/", None, &[("x-http-method-override", &list)])
        };
        let sixteen = naming(16);
        assert!(!deletes.matches(&sixteen));
        assert_eq!(costly.cost.for_methods(sixteen.methods()), 1);
        let seventeen = naming(17);
        assert!(deletes.matches(&seventeen));
        assert_eq!(costly.cost.for_methods(seventeen.methods()), 9);
        // One method however often, in any case, is one.
        let again = "put, PUT, ".repeat(100);
        let again = req("POST", "/", None, &[("x-http-method-override", &again)]);
        assert_eq!(again.methods(), ["POST", "PUT"]);
    }

    #[test]
    fn hosts_patterns_and_header_classes() {
        let mut q = req("GET", "/api/v1/items", None, &[("x-api-key", "k")]);
        assert!(rule(json!({"host": "example.com"})).matches(&q));
        assert!(!rule(json!({"host": "*.example.com"})).matches(&q));
        q.host = "eu.example.com".into();
        assert!(rule(json!({"host": "*.example.com"})).matches(&q));
        q.host = "badexample.com".into();
        assert!(!rule(json!({"host": "*.example.com"})).matches(&q));
        // A fully qualified name, as a client may spell the Host.
        for (host, pattern) in [
            ("Example.COM.", "example.com"),
            ("eu.example.com..", "*.example.com"),
        ] {
            q.host = normalize_host(host);
            assert!(rule(json!({ "host": pattern })).matches(&q), "{host}");
        }
        assert!(rule(json!({"path": "/api/*/items"})).matches(&q));
        assert!(!rule(json!({"path": "/api/*"})).matches(&q));
        assert!(rule(json!({"path": "/api/**"})).matches(&q));
        assert!(rule(json!({"with_headers": ["X-Api-Key"]})).matches(&q));
        assert!(!rule(json!({"without_headers": ["x-api-key"]})).matches(&q));
        let anonymous = req("GET", "/", None, &[]);
        assert!(rule(json!({"without_headers": ["x-api-key"]})).matches(&anonymous));
        assert!(!rule(json!({"with_headers": ["x-api-key"]})).matches(&anonymous));
        // Sent empty, a header is absent, as Go and Node code reads it.
        for empty in ["", " ", " , "] {
            let empty = req("GET", "/", None, &[("x-api-key", empty)]);
            assert!(rule(json!({"without_headers": ["x-api-key"]})).matches(&empty));
            assert!(!rule(json!({"with_headers": ["x-api-key"]})).matches(&empty));
        }
    }

    #[test]
    fn paths_are_normalized_before_matching_and_keying() {
        for (raw, normal) in [
            ("/", "/"),
            ("/api/x", "/api/x"),
            ("/api/../admin", "/admin"),
            ("/%61pi/x", "/api/x"),
            ("//api///x/", "/api/x"),
            ("/api%2Fx", "/api/x"),
            ("/./api/./x", "/api/x"),
            ("/../../api", "/api"),
            ("/api\\x", "/api/x"),
            ("/%2e%2e/api", "/api"),
            ("/a%zz", "/a%zz"),
            ("/%ff", "/\u{fffd}"),
            ("/API", "/api"),
            ("/adm\u{131}n", "/admin"),
            ("/adm%C4%B0n", "/admin"),
            ("/\u{17F}ite/\u{212A}ey", "/site/key"),
            ("/caf\u{c9}", "/caf\u{e9}"),
            (
                "/\u{412}\u{425}\u{41e}\u{414}",
                "/\u{432}\u{445}\u{43e}\u{434}",
            ),
            ("/%2561pi/x", "/api/x"),
            ("/login;jsessionid=1", "/login"),
            ("/api;x/y;z", "/api/y"),
            ("/login%00.png", "/login"),
            ("/login%2500/x", "/login"),
            ("/admin.", "/admin"),
            ("/admin%20", "/admin"),
            ("/admin.%20./x", "/admin/x"),
            ("/a/.../b", "/a/b"),
            ("/a/%20/b", "/a/b"),
            ("/file.tar.gz", "/file.tar.gz"),
            ("/.well-known/x", "/.well-known/x"),
            ("/%u0061pi/x", "/api/x"),
            ("/adm%u0130n", "/admin"),
        ] {
            assert_eq!(normalize_path(raw), normal, "{raw}");
        }
        let r = rule(json!({"path_prefix": "/api", "key": ["path"]}));
        let keys: Vec<Vec<String>> = ["/api/x", "/%61pi/x", "//api/x/", "/api/y/../x", "/api%2Fx"]
            .iter()
            .map(|p| {
                let q = req("GET", p, None, &[]);
                assert!(r.matches(&q), "{p} escaped the rule");
                ids(&r, &q).unwrap()
            })
            .collect();
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
    }

    #[test]
    fn identifiers_come_from_the_named_parts() {
        let r = rule(
            json!({"key": ["ip", "header:X-Api-Key", "cookie:sid", "query:k", "path", "user-agent"]}),
        );
        let q = req(
            "GET",
            "/p",
            Some("a=1&k=v2&flag"),
            &[
                ("cf-connecting-ip", "198.51.100.4"),
                ("x-api-key", "key1"),
                ("cookie", "a=b; sid=s3"),
                ("user-agent", "curl/8"),
                ("x-forwarded-for", "10.0.0.1"),
            ],
        );
        assert_eq!(
            ids(&r, &q).unwrap(),
            ["198.51.100.4", "key1", "s3", "v2", "/p", "curl/8"]
        );
    }

    #[test]
    fn forwarded_headers_do_not_replace_the_client_ip() {
        let r = rule(json!({}));
        let q = req(
            "GET",
            "/",
            None,
            &[("x-forwarded-for", "10.0.0.1"), ("x-real-ip", "10.0.0.2")],
        );
        assert_eq!(ids(&r, &q).unwrap(), [""]);
    }

    /// The request as the worker builds it, other routes included.
    fn built(
        method: &str,
        path: &str,
        query: Option<&str>,
        headers: &[(&str, &str)],
    ) -> RequestMeta {
        let headers = headers.iter().map(|(n, v)| (n.to_string(), v.to_string()));
        RequestMeta::new(method, "example.com", path, query, headers)
    }

    #[test]
    fn a_rule_takes_every_path_an_origin_may_route_to_it() {
        let login = rule(json!({"path_prefix": "/login"}));
        for path in [
            "/login",
            "/index.php/login",
            "/public/index.php/login/",
            "/login.json",
            "/LOGIN.xml",
            "/index.php/login.json",
        ] {
            assert!(login.matches(&built("POST", path, None, &[])), "{path}");
        }
        for path in ["/loginx", "/loginx.json", "/index.phpx/login", "/a/login"] {
            assert!(!login.matches(&built("POST", path, None, &[])), "{path}");
        }
        // An origin that decodes once routes this below /api/search.
        let search = rule(json!({"path_prefix": "/api/search"}));
        let climbing = built("GET", "/api/search/x%252F..%252F..", None, &[]);
        assert_eq!(climbing.path, "/api");
        assert!(search.matches(&climbing));
        let exact = rule(json!({"path": "/items/7"}));
        assert!(exact.matches(&built("GET", "/items/007", None, &[])));
        // A pattern about how a number is written still sees it so.
        let padded = rule(json!({"path": "/v/0*"}));
        assert!(padded.matches(&built("GET", "/v/012", None, &[])));
    }

    #[test]
    fn spellings_an_origin_reads_as_one_client_share_a_bucket() {
        let key = |k: &str| rule(json!({"key": [k]}));
        let one = |r: &Rule, query: Option<&str>, headers: &[(&str, &str)]| {
            ids(r, &built("GET", "/", query, headers))
        };
        let xff = key("header:x-forwarded-for");
        for list in ["203.0.113.1", "x, 203.0.113.1:50000", "203.0.113.1:1"] {
            assert_eq!(
                one(&xff, None, &[("x-forwarded-for", list)]).unwrap(),
                ["203.0.113.1"]
            );
        }
        let auth = key("header:authorization");
        for value in [
            "Bearer t0k",
            "bearer t0k",
            "BEARER   t0k",
            "Bearer t0k, bearer  t0k",
        ] {
            assert_eq!(
                one(&auth, None, &[("authorization", value)]).unwrap(),
                ["bearer t0k"]
            );
        }
        let id = key("query:id");
        for query in ["id=42", "id=0042", "id=42&id=042", "+id=42", "id]=042"] {
            assert_eq!(one(&id, Some(query), &[]).unwrap(), ["42"], "{query}");
        }
        // PHP reads the last of `id` and ` id`: two values, so no bucket.
        assert!(one(&id, Some("id=1&+id=2"), &[]).is_err());
    }

    #[test]
    fn a_method_named_with_a_mangled_field_name_still_counts() {
        let deletes = rule(json!({"methods": ["DELETE"]}));
        for query in ["+_method=DELETE", "_method]=DELETE", "%20_method=delete"] {
            assert!(
                deletes.matches(&built("POST", "/x", Some(query), &[])),
                "{query}"
            );
        }
    }

    #[test]
    fn a_body_that_cannot_be_read_whole_counts_as_every_method() {
        let deletes = rule(json!({"methods": ["DELETE"]}));
        let form = [("content-type", "application/x-www-form-urlencoded")];
        let mut cut = built("POST", "/x", None, &form);
        assert!(!deletes.matches(&cut));
        // Longer than the limiter reads: a `_method` may lie beyond.
        cut.body_cut = true;
        assert!(deletes.matches(&cut));
        let multipart = [("content-type", "multipart/form-data; boundary=B")];
        let mut open = built("POST", "/x", None, &multipart);
        open.body = Some(b"--B\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1".to_vec());
        assert!(deletes.matches(&open));
        let costs = rule(json!({"cost": {"default": 1, "DELETE": 10}, "burst": 10}));
        assert_eq!(costs.cost.for_methods(cut.methods()), 10);
        // Such a rule reads the body, so that `_method=DELETE` costs 10.
        assert!(costs.needs_body(&built("POST", "/x", None, &form)));
        assert!(!rule(json!({})).needs_body(&built("POST", "/x", None, &form)));
    }
}
