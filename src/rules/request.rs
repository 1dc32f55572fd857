//! The request as the rules read it: one form for the worker and for
//! `simulate`'s log reader, normalised where it is built, and what is
//! worked out from it (its methods, its parsed body, which rule paths it
//! lies on) worked out once, on first use.

use std::{
    borrow::Cow,
    cell::{OnceCell, RefCell},
};

use super::{body, canon, json, pattern::PathPattern};

/// The parts of a request the limiter looks at, independent of any runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMeta {
    /// Upper-case method.
    pub method: String,
    /// Lower-case host name, without the port.
    pub host: String,
    /// The path as [`canon::normalize_path`] gives it, without the query.
    pub path: String,
    /// Other paths an origin may route it to ([`canon::alternate_paths`]):
    /// a rule for any of them applies.
    pub routes: Vec<String>,
    /// Query string without the `?`, if any.
    pub query: Option<String>,
    /// Headers with lower-case names, in arrival order; from the worker,
    /// only those the rules read (`Config::headers_read`).
    pub headers: Vec<(String, String)>,
    /// Facts of `request.cf`, read only when a matching rule keys on one.
    pub cf: Vec<(CfField, String)>,
    /// The body, when a matching rule keys on it and it fit in
    /// [`body::MAX_BODY_BYTES`]; `None` otherwise. Set once: what is read
    /// from it is worked out on first use.
    pub body: Option<Vec<u8>>,
    /// Whether the body was wanted but not read: longer than
    /// [`body::MAX_BODY_BYTES`], or its stream failed.
    pub body_cut: bool,
    /// What is worked out from the rest, once.
    pub derived: Derived,
}

/// What is worked out from a request on first use and kept: a request
/// goes past `Config::needs_body`, `Config::needs_cf` and then the
/// limiter, which would each work it out again.
#[derive(Debug, Clone, Default)]
pub struct Derived {
    /// The body parsed as JSON.
    json: OnceCell<Option<json::Json>>,
    /// The methods before the body was read or cut, and after: the body
    /// goes from unread to read at most once.
    methods: [OnceCell<Vec<String>>; 2],
    /// Whether the path or a route of it passed a rule's path test, by the
    /// rule's `path_prefix` and `path` pattern.
    paths: RefCell<Vec<(String, String, bool)>>,
}

/// Requests are equal by what they carry; what was worked out of them
/// follows from that.
impl PartialEq for Derived {
    fn eq(&self, _: &Derived) -> bool {
        true
    }
}

impl Eq for Derived {}

impl RequestMeta {
    /// The request as rules read it, from what the runtime or a log gives:
    /// the method upper-cased, the host and path normalised
    /// ([`canon::normalize_host`], [`canon::normalize_path`]), header names
    /// lower-cased. Body and `request.cf` are added only when needed.
    pub fn new(
        method: &str,
        host: &str,
        path: &str,
        query: Option<&str>,
        headers: impl IntoIterator<Item = (String, String)>,
    ) -> RequestMeta {
        let (path, routes) = canon::path_and_routes(path);
        RequestMeta {
            method: method.to_ascii_uppercase(),
            host: canon::normalize_host(host),
            path,
            routes,
            query: query.map(str::to_owned),
            headers: headers
                .into_iter()
                .map(|(mut n, v)| {
                    n.make_ascii_lowercase();
                    (n, v)
                })
                .collect(),
            ..RequestMeta::default()
        }
    }

    /// Every method the origin may take this request for: its own, GET
    /// for a HEAD (frameworks run the GET handler for it), and for a POST
    /// what a method-override header names (Express's method-override,
    /// Symfony and Google's APIs read them) or a `_method` field of its
    /// query (Laravel, Symfony), form body (Rails too) or JSON body
    /// (Laravel), where the body was read ([`super::rule::Rule::needs_body`]), so that
    /// no spelling slips past a rule for one method.
    pub fn methods(&self) -> &[String] {
        let read = self.body.is_some() || self.body_cut;
        self.derived.methods[usize::from(read)].get_or_init(|| self.find_methods())
    }

    fn find_methods(&self) -> Vec<String> {
        let mut methods = Methods(vec![self.method.clone()]);
        match self.method.as_str() {
            "HEAD" => {
                methods.add("GET");
            }
            "POST" => {
                let content_type = self.header("content-type").unwrap_or_default();
                let json = || {
                    self.json()
                        .filter(|_| body::is_json(content_type))
                        .and_then(|doc| json::last_value(doc, METHOD_FIELD))
                };
                // A form or JSON body that could not be read whole may name
                // any method in a field: it counts as every method.
                let unread = (body::is_form(content_type) || body::is_json(content_type))
                    && (self.body_cut
                        || self
                            .body
                            .as_ref()
                            .is_some_and(|b| !body::fields_readable(b, content_type)));
                // In order, until the list is full.
                let _ = METHOD_OVERRIDES
                    .iter()
                    .flat_map(|name| self.header_pieces(name))
                    .all(|m| methods.add(m))
                    && self
                        .query_values(METHOD_FIELD)
                        .all(|m| methods.add(&canon::form_value_of(m)))
                    && self
                        .body
                        .iter()
                        .flat_map(|b| body::form_fields(b, content_type, METHOD_FIELD))
                        .all(|m| methods.add(&m))
                    && json().is_none_or(|m| methods.add(&m))
                    && (!unread || methods.add(ANY_METHOD));
            }
            _ => {}
        }
        methods.0
    }

    /// The first value of a header (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the request carries a header with a value: sent empty (or
    /// as commas alone), it is absent to Go's `Header.Get` and to Node code
    /// testing it, and so to the rules too.
    pub fn has_header(&self, name: &str) -> bool {
        self.header_pieces(name).next().is_some()
    }

    /// The values of a header, read as comma-separated pieces, trimmed,
    /// empty ones left out: the runtime hands a header sent twice over as
    /// one value, joined with `, `, and origins disagree on which they read
    /// (Go's `Header.Get` and Java's `getHeader` the first, Node the first
    /// for `Authorization`). Whole, `a, <anything>` would be a fresh bucket
    /// for client `a`.
    pub(crate) fn header_pieces<'a, 'n>(
        &'a self,
        name: &'n str,
    ) -> impl Iterator<Item = &'a str> + use<'a, 'n> {
        self.headers
            .iter()
            .filter(move |(n, _)| n == name)
            .flat_map(|(_, v)| pieces(v))
    }

    /// The raw value of every cookie whose name reads as `name` (already
    /// canonical, see [`canon::name`]), as often as given; see
    /// [`canon::cookie_value`].
    pub(crate) fn cookie_values<'a, 'n>(
        &'a self,
        name: &'n str,
    ) -> impl Iterator<Item = &'a str> + use<'a, 'n> {
        // `,` separated cookies in RFC 2965, and some servers still split on it.
        self.headers
            .iter()
            .filter(|(n, _)| n == "cookie")
            .flat_map(|(_, v)| canon::split_where(v, |b| b == b';' || b == b','))
            .filter_map(|pair| canon::split_once_at(pair, b'='))
            .filter(move |(n, _)| canon::is_name(n.trim(), name))
            .map(|(_, v)| v)
    }

    /// The raw value of every query parameter whose name reads as `name`,
    /// as often as given; see [`canon::form_value`].
    pub(crate) fn query_values<'a, 'n>(
        &'a self,
        name: &'n str,
    ) -> impl Iterator<Item = Cow<'a, str>> + use<'a, 'n> {
        self.query
            .as_deref()
            .into_iter()
            .flat_map(move |q| canon::form_fields(q.as_bytes(), name))
    }

    /// A fact of `request.cf`, if the runtime gave it.
    pub(crate) fn cf(&self, field: CfField) -> Option<&str> {
        self.cf
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, once per request; `None` until it is read.
    pub(crate) fn json(&self) -> Option<&json::Json> {
        let body = self.body.as_deref()?;
        self.derived.json.get_or_init(|| json::parse(body)).as_ref()
    }

    /// Whether the path or another route of it lies below `prefix` and
    /// fits `pattern` ([`PathPattern::within`]); with a pattern, worked out
    /// once per request for each, since a pattern reads every byte.
    pub(crate) fn on_path(&self, prefix: &str, pattern: Option<&PathPattern>) -> bool {
        let mut paths = std::iter::once(&self.path).chain(&self.routes);
        let Some(text) = pattern.map(PathPattern::as_str) else {
            return paths.any(|path| PathPattern::within(prefix, None, path));
        };
        let known = self
            .derived
            .paths
            .borrow()
            .iter()
            .find_map(|(p, t, on)| (p == prefix && t == text).then_some(*on));
        known.unwrap_or_else(|| {
            let on = paths.any(|path| PathPattern::within(prefix, pattern, path));
            let key = (prefix.to_owned(), text.to_owned(), on);
            self.derived.paths.borrow_mut().push(key);
            on
        })
    }
}

/// The comma-separated pieces of a header value, trimmed, empty ones left
/// out; a run of commas and blanks is skipped at once.
fn pieces(value: &str) -> impl Iterator<Item = &str> {
    let bytes = value.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || loop {
        at += bytes[at..]
            .iter()
            .position(|&b| b != b',' && !b.is_ascii_whitespace())?;
        let end = bytes[at..]
            .iter()
            .position(|&b| b == b',')
            .map_or(bytes.len(), |n| at + n);
        let piece = value[at..end].trim();
        at = end;
        if !piece.is_empty() {
            return Some(piece);
        }
    })
}

/// The methods a request may stand for, as [`RequestMeta::methods`] finds
/// them.
struct Methods(Vec<String>);

impl Methods {
    /// Adds `method` (upper-cased) if it is new; [`ANY_METHOD`] instead
    /// once [`MOST_METHODS`] are named. Whether there is room for more.
    fn add(&mut self, method: &str) -> bool {
        let method = method.trim();
        if method.is_empty() || self.0.iter().any(|m| m.eq_ignore_ascii_case(method)) {
            return true;
        }
        if self.0.len() > MOST_METHODS {
            self.0.push(ANY_METHOD.to_owned());
            return false;
        }
        self.0.push(method.to_ascii_uppercase());
        true
    }
}

/// Methods a POST may name besides its own, beyond which it counts as
/// every method ([`ANY_METHOD`]): no origin reads more than one, and each
/// one more would cost every rule's check of them.
const MOST_METHODS: usize = 16;

/// The query or form field through which a POST may ask the origin to
/// treat it as another method.
const METHOD_FIELD: &str = "_method";

/// In [`RequestMeta::methods`], a method the limiter cannot know: every
/// rule's `methods` take it, and it costs the most any method does.
pub const ANY_METHOD: &str = "*";

/// The headers read of every request, whatever its rules key on: those
/// its methods are read from ([`RequestMeta::methods`]) and the client's
/// address (`except_ips`).
pub fn headers_always_read() -> impl Iterator<Item = &'static str> {
    ["content-type", "cf-connecting-ip"]
        .into_iter()
        .chain(METHOD_OVERRIDES)
}

/// Headers through which a POST may ask the origin to treat it as another
/// method.
const METHOD_OVERRIDES: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// The facts of `request.cf` a rule can key on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CfField {
    /// Two-letter country code.
    Country,
    /// Autonomous system number.
    Asn,
    /// The data center (IATA code).
    Colo,
    /// Two-letter continent code.
    Continent,
    /// The client's JA4 TLS fingerprint (`botManagement.ja4`).
    Ja4,
}

impl CfField {
    /// The name in a key part (`cf:country`).
    pub fn name(self) -> &'static str {
        match self {
            CfField::Country => "country",
            CfField::Asn => "asn",
            CfField::Colo => "colo",
            CfField::Continent => "continent",
            CfField::Ja4 => "ja4",
        }
    }

    /// Every field, for parsing and for reading them off a request.
    pub const ALL: [CfField; 5] = [
        CfField::Country,
        CfField::Asn,
        CfField::Colo,
        CfField::Continent,
        CfField::Ja4,
    ];
}
