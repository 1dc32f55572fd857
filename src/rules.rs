//! Which rules a request falls under, and what identifies its client.

use std::borrow::Cow;

use crate::{
    body, canon,
    config::{CfField, KeyPart, Rule},
};

/// The parts of a request the limiter looks at, independent of any runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMeta {
    /// Upper-case method.
    pub method: String,
    /// Lower-case host name, without the port.
    pub host: String,
    /// The path as [`normalize_path`] gives it, without the query.
    pub path: String,
    /// Query string without the `?`, if any.
    pub query: Option<String>,
    /// Headers with lower-case names, in arrival order.
    pub headers: Vec<(String, String)>,
    /// Facts of `request.cf`, read only when a matching rule keys on one.
    pub cf: Vec<(CfField, String)>,
    /// The body, when a matching rule keys on it and it fit in
    /// [`body::MAX_BODY_BYTES`]; `None` otherwise.
    pub body: Option<Vec<u8>>,
    /// The body parsed as JSON, filled in on first use.
    pub json: std::cell::OnceCell<Option<body::Json>>,
}

impl RequestMeta {
    /// Every method the origin may take this request for: its own, GET
    /// for a HEAD (frameworks run the GET handler for it), and for a POST
    /// what a method-override header names (Express's method-override,
    /// Symfony and Google's APIs read them) or a `_method` field of its
    /// query (Laravel, Symfony), form body (Rails too) or JSON body
    /// (Laravel), where the body was read ([`Rule::needs_body`]), so that
    /// no spelling slips past a rule for one method.
    pub fn methods(&self) -> Vec<String> {
        let also: Vec<String> = match self.method.as_str() {
            "HEAD" => vec!["GET".to_owned()],
            "POST" => {
                let headers = METHOD_OVERRIDES
                    .iter()
                    .flat_map(|name| self.header_values(name));
                let query = self.query_values(METHOD_FIELD);
                let content_type = self.header("content-type").unwrap_or_default();
                let form = match &self.body {
                    Some(b) => body::form_values(b, content_type, METHOD_FIELD),
                    None => vec![],
                };
                let json = self
                    .body
                    .as_ref()
                    .filter(|_| body::is_json(content_type))
                    .and_then(|_| self.json())
                    .and_then(|doc| body::json_last_value(doc, JSON_METHOD_FIELD));
                headers
                    .chain(query)
                    .chain(form)
                    .chain(json)
                    .map(|m| m.trim().to_ascii_uppercase())
                    .collect()
            }
            _ => vec![],
        };
        let mut methods = vec![self.method.clone()];
        for m in also {
            if !m.is_empty() && !methods.contains(&m) {
                methods.push(m);
            }
        }
        methods
    }

    /// The first value of a header (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The distinct values of a header, read as comma-separated pieces: the
    /// runtime hands a header sent twice over as one value, joined with
    /// `, `, and origins disagree on which they read (Go's `Header.Get` and
    /// Java's `getHeader` the first, Node the first for `Authorization`).
    /// Whole, `a, <anything>` would be a fresh bucket for client `a`.
    fn header_values(&self, name: &str) -> Vec<Cow<'_, str>> {
        canon::distinct(
            self.headers
                .iter()
                .filter(|(n, _)| n == name)
                .flat_map(|(_, v)| v.split(','))
                .map(str::trim)
                .filter(|piece| !piece.is_empty())
                .map(Cow::Borrowed),
        )
    }

    /// The distinct canonical values of every cookie whose name reads as
    /// `name` (already canonical, see [`canon::name`]).
    fn cookie_values(&self, name: &str) -> Vec<Cow<'_, str>> {
        // `,` separated cookies in RFC 2965, and some servers still split on it.
        let pairs = self
            .headers
            .iter()
            .filter(|(n, _)| n == "cookie")
            .flat_map(|(_, v)| v.split([';', ',']))
            .filter_map(|pair| pair.split_once('='));
        canon::distinct(
            pairs
                .filter(|(n, _)| canon::name(n.trim()) == name)
                .map(|(_, v)| canon::cookie_value(v)),
        )
    }

    /// The distinct canonical values of every query parameter whose name
    /// reads as `name`.
    fn query_values(&self, name: &str) -> Vec<Cow<'_, str>> {
        self.query
            .as_deref()
            .map_or_else(Vec::new, |q| canon::form_field_values(q, name))
    }

    /// A fact of `request.cf`, if the runtime gave it.
    fn cf(&self, field: CfField) -> Option<&str> {
        self.cf
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, once per request.
    fn json(&self) -> Option<&body::Json> {
        self.json
            .get_or_init(|| self.body.as_deref().and_then(body::parse_json))
            .as_ref()
    }
}

/// The query or form field through which a POST may ask the origin to
/// treat it as another method.
const METHOD_FIELD: &str = "_method";

/// [`METHOD_FIELD`] as a member of a JSON body's top-level object.
const JSON_METHOD_FIELD: &str = "/_method";

/// Headers through which a POST may ask the origin to treat it as another
/// method.
const METHOD_OVERRIDES: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The path as origins most likely resolve it, so that no other spelling
/// of a limited path escapes its rule or its key: percent-escapes decoded
/// (`%2F` included, and twice-encoded ones), `\` read as `/`, `.` and `..`
/// segments resolved, `;` parameters (`/login;jsessionid=x`) dropped from
/// each segment as Java servers do, dots and spaces that end a segment
/// dropped as Windows drops them from file names (IIS serves `/admin.` as
/// `/admin`), empty segments and a trailing `/` dropped, and case folded
/// ([`canon::fold`]), since many origins route without regard to case.
/// Bytes that are not UTF-8 after decoding become U+FFFD.
pub fn normalize_path(raw: &str) -> String {
    let decoded = canon::percent_decoded(raw);
    let text = String::from_utf8_lossy(&decoded).replace('\\', "/");
    let mut segments: Vec<&str> = Vec::new();
    for seg in text.split('/') {
        let seg = seg.split(';').next().unwrap_or_default();
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => match canon::windows_segment(s) {
                "" => {}
                s => segments.push(s),
            },
        }
    }
    canon::fold(&format!("/{}", segments.join("/")))
}

/// Whether `path` matches `pattern`: `*` is any run of characters within
/// one segment, `**` any run at all. Linear in the path for any pattern, so
/// a long path from a client costs no more than reading it.
pub fn path_matches(pattern: &str, path: &str) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum Tok {
        Byte(u8),
        Star,
        Stars,
    }
    let p = pattern.as_bytes();
    let mut toks = Vec::with_capacity(p.len());
    let mut i = 0;
    while i < p.len() {
        if p[i] == b'*' {
            let double = p.get(i + 1) == Some(&b'*');
            toks.push(if double { Tok::Stars } else { Tok::Star });
            i += if double { 2 } else { 1 };
        } else {
            toks.push(Tok::Byte(p[i]));
            i += 1;
        }
    }
    // Simulate the pattern as an automaton: `live[k]` says the first k tokens
    // can match what was read so far.
    let closure = |live: &mut Vec<bool>| {
        for k in 0..toks.len() {
            if live[k] && matches!(toks[k], Tok::Star | Tok::Stars) {
                live[k + 1] = true;
            }
        }
    };
    let mut live = vec![false; toks.len() + 1];
    live[0] = true;
    closure(&mut live);
    for &c in path.as_bytes() {
        let mut next = vec![false; toks.len() + 1];
        for k in 0..toks.len() {
            if !live[k] {
                continue;
            }
            match toks[k] {
                Tok::Byte(b) if b == c => next[k + 1] = true,
                Tok::Star if c != b'/' => next[k] = true,
                Tok::Stars => next[k] = true,
                _ => {}
            }
        }
        closure(&mut next);
        live = next;
    }
    live[toks.len()]
}

/// A request's host as rules match it: lower case, and without the
/// trailing dot of a fully qualified name (`example.com.` is the same
/// site, and would otherwise slip past a rule for `example.com`).
pub fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
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
    /// Whether this rule applies to the request.
    pub fn matches(&self, req: &RequestMeta) -> bool {
        (self.methods.is_empty() || req.methods().iter().any(|m| self.methods.contains(m)))
            && self.matches_all_but_method(req)
    }

    /// Whether deciding this rule needs the request's body: a matching rule
    /// keyed on it, or a rule for methods other than POST that a form or
    /// JSON POST may name in its `_method` field.
    pub fn needs_body(&self, req: &RequestMeta) -> bool {
        let overridable = req.method == "POST"
            && !self.methods.is_empty()
            && !self.methods.iter().any(|m| m == "POST")
            && req
                .header("content-type")
                .is_some_and(|t| body::is_form(t) || body::is_json(t))
            && self.matches_all_but_method(req);
        overridable || (self.reads_body() && self.matches(req))
    }

    fn matches_all_but_method(&self, req: &RequestMeta) -> bool {
        let prefix = self.path_prefix.trim_end_matches('/');
        let below_prefix = prefix.is_empty()
            || req
                .path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        below_prefix
            && self
                .host
                .as_deref()
                .is_none_or(|h| host_matches(h, &req.host))
            && self
                .path
                .as_deref()
                .is_none_or(|p| path_matches(p, &req.path))
            && self.with_headers.iter().all(|h| req.header(h).is_some())
            && !self.without_headers.iter().any(|h| req.header(h).is_some())
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
}

impl KeyPart {
    /// This part's canonical value in `req` (empty when missing).
    fn value<'a>(&self, req: &'a RequestMeta) -> Result<Cow<'a, str>, Ambiguous> {
        let single = |values: Vec<Cow<'a, str>>| match values.len() {
            0 => Ok(Cow::Borrowed("")),
            1 => Ok(values.into_iter().next().unwrap_or_default()),
            _ => Err(Ambiguous { part: self.clone() }),
        };
        let header = |name: &str| Cow::Borrowed(req.header(name).unwrap_or_default());
        match self {
            KeyPart::Ip => Ok(canon::ip(
                req.header("cf-connecting-ip").unwrap_or_default(),
            )),
            KeyPart::Header(name) if name == "x-forwarded-for" => Ok(Cow::Borrowed(
                canon::last_forwarded(req.header(name).unwrap_or_default()),
            )),
            // Commas are part of real User-Agent strings, which a client
            // picks freely anyway.
            KeyPart::Header(name) if name == "user-agent" => Ok(header(name)),
            KeyPart::Header(name) => single(req.header_values(name)),
            KeyPart::Cookie(name) => single(req.cookie_values(name)),
            KeyPart::Query(name) => single(req.query_values(name)),
            KeyPart::Path => Ok(Cow::Borrowed(req.path.as_str())),
            KeyPart::UserAgent => Ok(header("user-agent")),
            KeyPart::Cf(field) => Ok(Cow::Borrowed(req.cf(*field).unwrap_or_default())),
            KeyPart::Json(pointer) => match req.json().map(|doc| body::json_value(doc, pointer)) {
                Some(Err(body::Repeated)) => Err(Ambiguous { part: self.clone() }),
                Some(Ok(value)) => Ok(value.unwrap_or_default()),
                None => Ok(Cow::Borrowed("")),
            },
            KeyPart::Form(name) => single(match &req.body {
                Some(b) => {
                    body::form_values(b, req.header("content-type").unwrap_or_default(), name)
                }
                None => vec![],
            }),
            KeyPart::Folded(inner) => match inner.value(req) {
                Err(Ambiguous { .. }) => Err(Ambiguous { part: self.clone() }),
                Ok(v) => Ok(Cow::Owned(canon::folded(&v))),
            },
        }
    }
}

impl Rule {
    /// A request carrying `values` as this rule's key parts, in order, each
    /// spelled as a client would send it (a query value or cookie as it
    /// appears on the wire). [`Rule::identifier`] of it is the identifier
    /// the worker derives for such a client, so tools that name a client by
    /// its values (`edge-limiter inspect`, `reset`) reach the worker's key.
    pub fn request_with_key(&self, values: &[&str]) -> Result<RequestMeta, WrongValueCount> {
        if values.len() != self.key.len() {
            return Err(WrongValueCount {
                parts: self.key.clone(),
                given: values.len(),
            });
        }
        let mut req = RequestMeta {
            method: "GET".to_owned(),
            path: "/".to_owned(),
            ..RequestMeta::default()
        };
        let mut query = Vec::new();
        let mut form = Vec::new();
        let mut json = serde_json::Value::Null;
        for (part, value) in self.key.iter().zip(values) {
            part.put(value, &mut req, &mut query, &mut form, &mut json);
        }
        if !query.is_empty() {
            req.query = Some(query.join("&"));
        }
        if !json.is_null() {
            req.body = serde_json::to_vec(&json).ok();
        } else if !form.is_empty() {
            req.body = Some(form.join("&").into_bytes());
            req.headers.push((
                "content-type".to_owned(),
                "application/x-www-form-urlencoded".to_owned(),
            ));
        }
        Ok(req)
    }
}

impl KeyPart {
    /// Puts `value` where a client's request would carry this part.
    fn put(
        &self,
        value: &str,
        req: &mut RequestMeta,
        query: &mut Vec<String>,
        form: &mut Vec<String>,
        json: &mut serde_json::Value,
    ) {
        let header = |name: &str| (name.to_owned(), value.to_owned());
        match self {
            KeyPart::Ip => req.headers.push(header("cf-connecting-ip")),
            KeyPart::Header(name) => req.headers.push(header(name)),
            KeyPart::Cookie(name) => req
                .headers
                .push(("cookie".to_owned(), format!("{name}={value}"))),
            KeyPart::Query(name) => query.push(format!("{name}={value}")),
            KeyPart::Path => req.path = normalize_path(value),
            KeyPart::UserAgent => req.headers.push(header("user-agent")),
            KeyPart::Cf(field) => req.cf.push((*field, value.to_owned())),
            KeyPart::Form(name) => form.push(format!("{name}={value}")),
            KeyPart::Json(pointer) => {
                // The document {"a": {"b": value}} for the pointer /a/b.
                let mut at = json;
                for token in pointer.split('/').skip(1) {
                    let token = token.replace("~1", "/").replace("~0", "~");
                    if !at.is_object() {
                        *at = serde_json::Value::Object(Default::default());
                    }
                    at = at
                        .as_object_mut()
                        .expect("made an object just above")
                        .entry(token)
                        .or_insert(serde_json::Value::Null);
                }
                *at = serde_json::Value::String(value.to_owned());
            }
            KeyPart::Folded(inner) => inner.put(value, req, query, form, json),
        }
    }
}

/// Values given for a rule's key parts that do not match them one to one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrongValueCount {
    /// The rule's key parts, in order.
    pub parts: Vec<KeyPart>,
    /// How many values were given.
    pub given: usize,
}

impl std::fmt::Display for WrongValueCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.parts.iter().map(ToString::to_string).collect();
        write!(
            f,
            "the rule is keyed on [{}]: give {} value(s), one per part in that order, not {}",
            parts.join(", "),
            parts.len(),
            self.given
        )
    }
}

impl std::error::Error for WrongValueCount {}

/// A request that names one key part more than once with different values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ambiguous {
    /// The key part, as configured (`query:k`, `cookie:sid`).
    pub part: KeyPart,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
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
        assert_eq!(costly.cost.for_methods(&post.methods()), 5);
        let head = req("HEAD", "/", None, &[]);
        assert_eq!(costly.cost.for_methods(&head.methods()), 3);
        assert_eq!(head.methods(), ["HEAD", "GET"]);
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
            ("/caf\u{c9}", "/caf\u{c9}"),
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
    fn patterns_stay_linear_on_long_paths() {
        let long = format!("/{}", "a/".repeat(20_000));
        assert!(!path_matches("/**b**b**b**b", &long));
        assert!(path_matches("/**", &long));
        assert!(!path_matches("/*", &long));
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
    fn key_values_give_the_identifier_the_worker_derives() {
        let r =
            rule(json!({"key": ["ip", "query:k", "cookie:sid", "path", "header:x-forwarded-for"]}));
        let sent = r
            .request_with_key(&[
                "2001:db8::7",
                "a+b",
                "%73%33",
                "/API/x/",
                "spoofed, 10.0.0.1",
            ])
            .unwrap();
        let worker = req(
            "POST",
            "/api/x",
            Some("k=a%20b"),
            &[
                ("cf-connecting-ip", "2001:db8:0:0:1::9"),
                ("cookie", "sid=s3"),
                ("x-forwarded-for", "10.0.0.1"),
            ],
        );
        assert_eq!(ids(&r, &sent), ids(&r, &worker));
        let wrong = r.request_with_key(&["1.2.3.4"]).unwrap_err();
        assert_eq!(wrong.given, 1);
        assert!(wrong.to_string().contains("give 5 value(s)"), "{wrong}");
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
}
