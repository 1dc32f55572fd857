//! The request as the rules read it: one form for the worker and for
//! `simulate`'s log reader, normalised where it is built.

use std::borrow::Cow;

use super::{body, canon, json};

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
    /// Headers with lower-case names, in arrival order.
    pub headers: Vec<(String, String)>,
    /// Facts of `request.cf`, read only when a matching rule keys on one.
    pub cf: Vec<(CfField, String)>,
    /// The body, when a matching rule keys on it and it fit in
    /// [`body::MAX_BODY_BYTES`]; `None` otherwise.
    pub body: Option<Vec<u8>>,
    /// Whether the body was wanted but not read: longer than
    /// [`body::MAX_BODY_BYTES`], or its stream failed.
    pub body_cut: bool,
    /// The body parsed as JSON, filled in on first use.
    pub json: std::cell::OnceCell<Option<json::Json>>,
}

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
        let canonical = canon::normalize_path(path);
        RequestMeta {
            method: method.to_ascii_uppercase(),
            host: canon::normalize_host(host),
            routes: canon::alternate_paths(path, &canonical),
            path: canonical,
            query: query.map(str::to_owned),
            headers: headers
                .into_iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v))
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
                    .and_then(|doc| json::last_value(doc, METHOD_FIELD));
                // A form or JSON body that could not be read whole may name
                // any method in a field: it counts as every method.
                let unread = (body::is_form(content_type) || body::is_json(content_type))
                    && (self.body_cut
                        || self
                            .body
                            .as_ref()
                            .is_some_and(|b| !body::fields_readable(b, content_type)));
                headers
                    .chain(query)
                    .chain(form)
                    .chain(json)
                    .chain(unread.then_some(Cow::Borrowed(ANY_METHOD)))
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

    /// Whether the request carries a header with a value: sent empty (or
    /// as commas alone), it is absent to Go's `Header.Get` and to Node code
    /// testing it, and so to the rules too.
    pub fn has_header(&self, name: &str) -> bool {
        !self.header_values(name).is_empty()
    }

    /// The distinct values of a header, read as comma-separated pieces: the
    /// runtime hands a header sent twice over as one value, joined with
    /// `, `, and origins disagree on which they read (Go's `Header.Get` and
    /// Java's `getHeader` the first, Node the first for `Authorization`).
    /// Whole, `a, <anything>` would be a fresh bucket for client `a`.
    pub(crate) fn header_values(&self, name: &str) -> Vec<Cow<'_, str>> {
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
    pub(crate) fn cookie_values(&self, name: &str) -> Vec<Cow<'_, str>> {
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
    pub(crate) fn query_values(&self, name: &str) -> Vec<Cow<'_, str>> {
        self.query
            .as_deref()
            .map_or_else(Vec::new, |q| canon::form_field_values(q, name))
    }

    /// A fact of `request.cf`, if the runtime gave it.
    pub(crate) fn cf(&self, field: CfField) -> Option<&str> {
        self.cf
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, once per request.
    pub(crate) fn json(&self) -> Option<&json::Json> {
        self.json
            .get_or_init(|| self.body.as_deref().and_then(json::parse))
            .as_ref()
    }
}

/// The query or form field through which a POST may ask the origin to
/// treat it as another method.
const METHOD_FIELD: &str = "_method";

/// In [`RequestMeta::methods`], a method the limiter cannot know: every
/// rule's `methods` take it, and it costs the most any method does.
pub const ANY_METHOD: &str = "*";

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
