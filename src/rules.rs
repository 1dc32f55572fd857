//! Which rules a request falls under, and what identifies its client.

use crate::config::{KeyPart, Rule};

/// The parts of a request the limiter looks at, independent of any runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMeta {
    /// Upper-case method.
    pub method: String,
    /// Path, starting with `/`, without the query.
    pub path: String,
    /// Query string without the `?`, if any.
    pub query: Option<String>,
    /// Headers with lower-case names, in arrival order.
    pub headers: Vec<(String, String)>,
}

impl RequestMeta {
    /// The first value of a header (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn cookie(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == "cookie")
            .flat_map(|(_, v)| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }

    fn query_param(&self, name: &str) -> Option<&str> {
        self.query
            .as_deref()?
            .split('&')
            .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }
}

impl Rule {
    /// Whether this rule applies to the request.
    pub fn matches(&self, req: &RequestMeta) -> bool {
        let method_ok = self.methods.is_empty() || self.methods.contains(&req.method);
        method_ok && req.path.starts_with(&self.path_prefix)
    }

    /// The values that identify the client, one per key part. A part the
    /// request lacks is empty: such clients share one bucket per rule.
    pub fn identifier<'a>(&self, req: &'a RequestMeta) -> Vec<&'a str> {
        self.key
            .iter()
            .map(|part| {
                match part {
                    KeyPart::Ip => req.header("cf-connecting-ip"),
                    KeyPart::Header(name) => req.header(name),
                    KeyPart::Cookie(name) => req.cookie(name),
                    KeyPart::Query(name) => req.query_param(name),
                    KeyPart::Path => Some(req.path.as_str()),
                    KeyPart::UserAgent => req.header("user-agent"),
                }
                .unwrap_or("")
            })
            .collect()
    }
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
            path: path.into(),
            query: query.map(Into::into),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
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
            r.identifier(&q),
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
        assert_eq!(r.identifier(&q), [""]);
    }
}
