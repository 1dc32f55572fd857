//! Which rules a request falls under, and what identifies its client.

use crate::config::{KeyPart, Rule};

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

/// The path as the origin will most likely resolve it, so that no other
/// spelling of a limited path escapes its rule or its key: percent-escapes
/// decoded (`%2F` included), `.` and `..` segments resolved, empty segments
/// and a trailing `/` dropped. Bytes that are not UTF-8 after decoding are
/// replaced with U+FFFD.
pub fn normalize_path(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                decoded.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b'\\', _, _) => {
                // Browsers and many servers read a backslash as a slash.
                decoded.push(b'/');
                i += 1;
            }
            (b, _, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    let text = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for seg in text.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    format!("/{}", segments.join("/"))
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
        let prefix = self.path_prefix.trim_end_matches('/');
        let below_prefix = prefix.is_empty()
            || req
                .path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        (self.methods.is_empty() || self.methods.contains(&req.method))
            && self
                .host
                .as_deref()
                .is_none_or(|h| host_matches(h, &req.host))
            && below_prefix
            && self
                .path
                .as_deref()
                .is_none_or(|p| path_matches(p, &req.path))
            && self.with_headers.iter().all(|h| req.header(h).is_some())
            && !self.without_headers.iter().any(|h| req.header(h).is_some())
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
            host: "example.com".into(),
            path: normalize_path(path),
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
        assert!(
            !r.matches(&req("POST", "/loginx", None, &[])),
            "prefixes end at a segment"
        );
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
            ("/API", "/API"),
        ] {
            assert_eq!(normalize_path(raw), normal, "{raw}");
        }
        let r = rule(json!({"path_prefix": "/api", "key": ["path"]}));
        let keys: Vec<Vec<String>> = ["/api/x", "/%61pi/x", "//api/x/", "/api/y/../x", "/api%2Fx"]
            .iter()
            .map(|p| {
                let q = req("GET", p, None, &[]);
                assert!(r.matches(&q), "{p} escaped the rule");
                r.identifier(&q).iter().map(|s| s.to_string()).collect()
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
