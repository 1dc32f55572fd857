//! What a rule can read from a request's body: a value in a JSON document
//! by RFC 6901 pointer, or a field of a form. At most [`MAX_BODY_BYTES`]
//! are ever read; a larger body, or one that does not parse, gives no value
//! (the key part is then missing, as any other). A field or member given
//! twice with different values gives several, which refuses the request.

use std::{borrow::Cow, cell::RefCell};

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::rules::canon;

/// Bytes of a body the limiter reads at most, and only for rules keyed on it.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The text a JSON value counts as: a string as itself up to any NUL
/// ([`canon::before_nul`]), a number as the integer it equals where it
/// equals one ([`canon::number_or_uuid`]: `1.0`, `1e0` and `1` are `1`,
/// as JavaScript and Python compare them), a boolean, object or array as
/// compact JSON.
/// `null` and a missing value count as missing (`None`).
fn json_text(value: &Value) -> Option<Cow<'_, str>> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(Cow::Borrowed(canon::before_nul(s))),
        Value::Number(n) => Some(canon::number_or_uuid(Cow::Owned(n.to_string()))),
        other => Some(Cow::Owned(other.to_string())),
    }
}

/// A parsed JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Json {
    doc: Value,
    /// Pointers of the members an object names twice with different
    /// values. `JSON.parse` keeps the last, but Go's gjson, simdjson and
    /// other streaming readers the first, so neither is the value.
    repeated: Vec<String>,
}

/// Parses a JSON body. Deeply nested or invalid documents (bad UTF-8
/// included) give `None`: serde_json refuses nesting beyond 128 levels
/// rather than recursing without bound.
pub fn parse_json(body: &[u8]) -> Option<Json> {
    let repeated = RefCell::new(Vec::new());
    let seed = Member {
        pointer: String::new(),
        repeated: &repeated,
    };
    // Read as text, as the REST replies are: the worker then carries one
    // copy of serde_json's reader (invalid UTF-8 fails either way).
    let mut reader = serde_json::Deserializer::from_str(std::str::from_utf8(body).ok()?);
    let doc = seed.deserialize(&mut reader).ok()?;
    reader.end().ok()?;
    Some(Json {
        doc,
        repeated: repeated.into_inner(),
    })
}

/// The value at `pointer` in a parsed JSON body, as text; `Err` when a
/// member named twice lies on the way there or inside it, or when it is an
/// object or an array of several distinct values. An array counts as its
/// plain values, since Laravel's and Rails' lookups by a field take an
/// array as any of its elements (`{"email": ["victim", "x"]}` finds
/// `victim`).
pub fn json_value<'a>(json: &'a Json, pointer: &str) -> Result<Option<Cow<'a, str>>, Repeated> {
    let within = |outer: &str, inner: &str| {
        inner
            .strip_prefix(outer)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if json
        .repeated
        .iter()
        .any(|r| within(r, pointer) || within(pointer, r))
    {
        return Err(Repeated);
    }
    match lookup(&json.doc, pointer)? {
        Some(found @ (Value::Array(_) | Value::Object(_))) => {
            let mut scalars = Vec::new();
            leaves(found, &mut scalars)?;
            let texts = canon::distinct(scalars.into_iter().filter_map(json_text));
            match texts.as_slice() {
                [_, _, ..] => Err(Repeated),
                _ => Ok(texts.into_iter().next()),
            }
        }
        found => Ok(found.and_then(json_text)),
    }
}

/// The plain values of an array, nested arrays flattened (Laravel's
/// `where` flattens them); an object has several meanings to origins
/// (Laravel takes its first value, MongoDB an operator), so it has none.
fn leaves<'a>(value: &'a Value, out: &mut Vec<&'a Value>) -> Result<(), Repeated> {
    match value {
        Value::Array(items) => items.iter().try_for_each(|i| leaves(i, out)),
        Value::Object(_) => Err(Repeated),
        scalar => {
            out.push(scalar);
            Ok(())
        }
    }
}

/// The value at `pointer`, members matched without regard to case, as Go's
/// `encoding/json` and ASP.NET Core's defaults match them; `Err` when two
/// names that differ only in case have different values on the way.
fn lookup<'a>(doc: &'a Value, pointer: &str) -> Result<Option<&'a Value>, Repeated> {
    let mut at = doc;
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        let next = match at {
            Value::Object(members) => {
                let wanted = canon::fold(&token);
                let mut named = members
                    .iter()
                    .filter(|(name, _)| canon::fold(name) == wanted)
                    .map(|(_, value)| value);
                let first = named.next();
                if named.any(|other| Some(other) != first) {
                    return Err(Repeated);
                }
                first
            }
            Value::Array(items) => token.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        match next {
            Some(value) => at = value,
            None => return Ok(None),
        }
    }
    Ok(Some(at))
}

/// The value at `pointer` as text, a member named twice taken at its last
/// value, as `JSON.parse` and PHP's `json_decode` take it.
pub fn json_last_value<'a>(json: &'a Json, pointer: &str) -> Option<Cow<'a, str>> {
    json.doc.pointer(pointer).and_then(json_text)
}

/// A JSON member named twice with different values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repeated;

/// Reads one JSON value at `pointer`, noting the members named twice.
struct Member<'r> {
    pointer: String,
    repeated: &'r RefCell<Vec<String>>,
}

impl Member<'_> {
    fn child(&self, token: &str) -> Self {
        let token = token.replace('~', "~0").replace('/', "~1");
        Member {
            pointer: format!("{}/{token}", self.pointer),
            repeated: self.repeated,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Member<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, reader: D) -> Result<Value, D::Error> {
        reader.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Member<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = items.next_element_seed(self.child(&out.len().to_string()))? {
            out.push(item);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(name) = members.next_key::<String>()? {
            let member = self.child(&name);
            let pointer = member.pointer.clone();
            let value = members.next_value_seed(member)?;
            if out.get(&name).is_some_and(|earlier| *earlier != value) {
                self.repeated.borrow_mut().push(pointer);
            }
            out.insert(name, value);
        }
        Ok(Value::Object(out))
    }
}

/// The distinct canonical values of the fields named `name` (canonical, see
/// [`canon::name`]) in a form body of this content type: urlencoded, or
/// multipart. Any other type has no fields.
pub fn form_values<'a>(body: &'a [u8], content_type: &str, name: &str) -> Vec<Cow<'a, str>> {
    match media_type(content_type).as_str() {
        // PHP reads fields of a body that is not UTF-8 too: its bytes that
        // are not become U+FFFD here.
        "application/x-www-form-urlencoded" => match String::from_utf8_lossy(body) {
            Cow::Borrowed(text) => canon::form_field_values(text, name),
            Cow::Owned(text) => canon::form_field_values(&text, name)
                .into_iter()
                .map(|v| Cow::Owned(v.into_owned()))
                .collect(),
        },
        "multipart/form-data" => match boundary(content_type) {
            Some(b) => multipart_values(body, &b, name),
            None => vec![],
        },
        _ => vec![],
    }
}

/// Whether a body of this content type is a form [`form_values`] reads.
pub fn is_form(content_type: &str) -> bool {
    matches!(
        media_type(content_type).as_str(),
        "application/x-www-form-urlencoded" | "multipart/form-data"
    )
}

/// Whether a body of this content type is JSON to Laravel, which reads a
/// JSON body's members as form fields: a type naming `/json` or `+json`
/// anywhere, as its check does (here in any case, which can only add).
pub fn is_json(content_type: &str) -> bool {
    let lower = content_type.to_ascii_lowercase();
    lower.contains("/json") || lower.contains("+json")
}

/// The media type of a content type, cut where PHP cuts it (at `;`, `,`
/// or a space): `application/x-www-form-urlencoded,` is a form to PHP.
fn media_type(content_type: &str) -> String {
    content_type
        .trim_start()
        .split([';', ',', ' '])
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// The `boundary` parameter of a multipart content type, as PHP finds it:
/// after `boundary=` anywhere, to its closing quote when quoted, else to a
/// `,` or `;`. Longer than RFC 2046's 70 characters (with room to spare)
/// is no boundary: searching for one would cost its length per byte.
fn boundary(content_type: &str) -> Option<String> {
    let at = content_type.to_ascii_lowercase().find("boundary=")? + "boundary=".len();
    let value = &content_type[at..];
    let value = match value.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next().unwrap_or_default(),
        None => value.split([',', ';']).next().unwrap_or_default().trim(),
    };
    (!value.is_empty() && value.len() <= MAX_BOUNDARY).then(|| value.to_owned())
}

/// The longest boundary read: RFC 2046 allows 70 characters.
const MAX_BOUNDARY: usize = 200;

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if needle.is_empty() || from > haystack.len() {
        return None;
    }
    haystack[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// One part of a multipart body: its head (the header lines) and content.
type Part<'a> = (&'a [u8], &'a [u8]);

/// A line of `body` from `at`: its text without the line break and the
/// spaces, tabs and carriage return before it, and where the next starts.
fn line_at(body: &[u8], at: usize) -> (&[u8], usize) {
    let end = find(body, b"\n", at).unwrap_or(body.len());
    let mut text = &body[at..end];
    while let [rest @ .., b' ' | b'\t' | b'\r'] = text {
        text = rest;
    }
    (text, (end + 1).min(body.len()))
}

/// The parts of a `multipart/form-data` body, and whether it has a closing
/// delimiter. Parsers differ on malformed bodies, so every part any of them
/// reads is read: a part starts at every line that is `--boundary` (after
/// a closing one too, as PHP goes on reading), its head ends at the first
/// empty line, and its content at the next `--boundary` that starts a line,
/// whatever follows it (PHP and busboy end a value there; a bare line feed
/// ends lines as in PHP). Values read differently then count as repeated.
fn multipart_parts<'a>(body: &'a [u8], boundary: &str) -> (Vec<Part<'a>>, bool) {
    let delimiter = format!("--{boundary}");
    let close = format!("{delimiter}--");
    let value_end = format!("\n{delimiter}");
    let (mut parts, mut closed, mut at) = (Vec::new(), false, 0);
    while at < body.len() {
        let (line, next) = line_at(body, at);
        at = next;
        if line == close.as_bytes() {
            closed = true;
            continue;
        }
        if line != delimiter.as_bytes() {
            continue;
        }
        let head = at;
        let content = loop {
            let (header, after) = line_at(body, at);
            if header.is_empty() || after == at {
                break after;
            }
            at = after;
        };
        // The value ends at the line break before the next delimiter.
        let Some(end) = find(body, value_end.as_bytes(), content.saturating_sub(1)) else {
            break;
        };
        let mut value = &body[content..end.max(content)];
        if let [rest @ .., b'\r'] = value {
            value = rest;
        }
        parts.push((&body[head..at.max(head)], value));
        at = end + 1;
    }
    (parts, closed)
}

/// Fields of a `multipart/form-data` body (RFC 7578): each part's
/// `Content-Disposition: form-data; name="..."` names it, and its content
/// runs to the line break before the next delimiter (or to a NUL in it, as
/// for every other value: [`canon::before_nul_bytes`]).
/// The part headers are read as leniently as any origin reads them: a line
/// starting with a blank or without a `:` continues the one before (PHP,
/// Go), a name may be in single quotes (PHP) or given as `name*` (RFC 2231,
/// which Go prefers).
fn multipart_values<'a>(body: &'a [u8], boundary: &str, name: &str) -> Vec<Cow<'a, str>> {
    let (parts, _) = multipart_parts(body, boundary);
    let mut values = Vec::new();
    for (head, content) in parts {
        let head = unfolded(&String::from_utf8_lossy(head)).to_ascii_lowercase();
        let field = |wanted: &str| {
            head.lines().find_map(|line| {
                let (field, value) = line.split_once(':')?;
                (field.trim() == wanted).then(|| value.trim())
            })
        };
        if !field("content-disposition").is_some_and(|d| names(d, name)) {
            continue;
        }
        values.push(String::from_utf8_lossy(canon::before_nul_bytes(content)));
        // Go decodes quoted-printable, Django base64: an encoded value is
        // read as two (a NUL no other value holds), which refuses it.
        let encoding = field("content-transfer-encoding");
        if encoding.is_some_and(|e| !matches!(e, "7bit" | "8bit" | "binary")) {
            values.push(Cow::Borrowed("\0"));
        }
    }
    canon::distinct(values.into_iter())
}

/// A part's header lines, each continuation line joined to the one it
/// continues.
fn unfolded(head: &str) -> String {
    let mut out = String::new();
    for line in head.lines() {
        let continues = line.starts_with([' ', '\t']) || !line.contains(':');
        if out.is_empty() || !continues {
            out.push('\n');
        }
        out.push_str(line);
    }
    out
}

/// Whether a `Content-Disposition` value (lower case) names the field
/// `name` (canonical), by `name=` or by `name*=`.
fn names(disposition: &str, name: &str) -> bool {
    disposition.split(';').skip(1).any(|p| {
        let Some((key, value)) = p.split_once('=') else {
            return false;
        };
        let value = match key.trim() {
            "name" => value.trim().trim_matches(['"', '\'']),
            // `charset'language'name`, percent-encoded.
            "name*" => value.rsplit_once('\'').map_or("", |(_, n)| n),
            _ => return false,
        };
        canon::name(value) == name
    })
}

/// Whether every field of a form body of this content type can be read:
/// not a multipart body without its closing delimiter (or boundary), which
/// an origin's more lenient parser may still read fields from.
pub fn fields_readable(body: &[u8], content_type: &str) -> bool {
    match media_type(content_type).as_str() {
        "multipart/form-data" => {
            boundary(content_type).is_some_and(|b| multipart_parts(body, &b).1)
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value where no member is named twice.
    fn value<'a>(json: &'a Json, pointer: &str) -> Option<Cow<'a, str>> {
        json_value(json, pointer).expect("no repeated member on the way")
    }

    #[test]
    fn json_values_by_pointer() {
        let doc = parse_json(br#"{"user": {"name": "Alice", "id": 7, "n": 1.0, "tags": ["a"], "none": null}, "a/b": "slash"}"#).unwrap();
        assert_eq!(value(&doc, "/user/name").as_deref(), Some("Alice"));
        assert_eq!(value(&doc, "/user/id").as_deref(), Some("7"));
        assert_eq!(value(&doc, "/user/n").as_deref(), Some("1"));
        assert_eq!(value(&doc, "/user/tags").as_deref(), Some("a"));
        assert_eq!(value(&doc, "/user/none"), None);
        assert_eq!(value(&doc, "/user/missing"), None);
        assert_eq!(value(&doc, "/a~1b").as_deref(), Some("slash"));
        let nul = parse_json(br#"{"u": "alice\u0000x"}"#).unwrap();
        assert_eq!(value(&nul, "/u").as_deref(), Some("alice"));
    }

    #[test]
    fn numbers_equal_to_an_integer_count_as_its_digits() {
        let doc = parse_json(
            br#"{"int": 1000000000000000000, "exp": 1e18, "float": 1000000000000000000.0,
                "text": "1000000000000000000", "neg": -12e0, "zero": -0.0, "half": 1.5,
                "huge": 18446744073709551616, "huge_exp": 1.8446744073709552e19}"#,
        )
        .unwrap();
        for pointer in ["/int", "/exp", "/float", "/text"] {
            let text = value(&doc, pointer);
            assert_eq!(text.as_deref(), Some("1000000000000000000"), "{pointer}");
        }
        assert_eq!(value(&doc, "/neg").as_deref(), Some("-12"));
        assert_eq!(value(&doc, "/zero").as_deref(), Some("0"));
        assert_eq!(value(&doc, "/half").as_deref(), Some("1.5"));
        assert_eq!(value(&doc, "/huge"), value(&doc, "/huge_exp"));
    }

    #[test]
    fn member_names_are_matched_without_regard_to_case() {
        let doc = r#"{"USER": {"Name": "v"}, "uſername": "w", "id": 1}"#;
        let doc = parse_json(doc.as_bytes()).unwrap();
        assert_eq!(value(&doc, "/user/name").as_deref(), Some("v"));
        assert_eq!(value(&doc, "/username").as_deref(), Some("w"));
        assert_eq!(value(&doc, "/ID").as_deref(), Some("1"));
        // Two spellings of one name with different values: no value.
        let doc = parse_json(br#"{"Username": "victim", "username": "r1", "ok": 1, "OK": 1}"#);
        let doc = doc.unwrap();
        assert_eq!(json_value(&doc, "/username"), Err(Repeated));
        assert_eq!(json_value(&doc, "/USERNAME"), Err(Repeated));
        assert_eq!(value(&doc, "/ok").as_deref(), Some("1"));
    }

    #[test]
    fn an_array_of_scalars_counts_as_its_elements() {
        let doc = parse_json(
            br#"{"one": ["v", "v"], "two": ["v", "x"], "none": [], "nulls": [null],
                "nested": [["v"]], "numbers": [1, 1.0]}"#,
        )
        .unwrap();
        assert_eq!(value(&doc, "/one").as_deref(), Some("v"));
        assert_eq!(json_value(&doc, "/two"), Err(Repeated));
        assert_eq!(value(&doc, "/none"), None);
        assert_eq!(value(&doc, "/nulls"), None);
        assert_eq!(value(&doc, "/nested").as_deref(), Some("v"));
        assert_eq!(value(&doc, "/numbers").as_deref(), Some("1"));
        assert_eq!(value(&doc, "/two/1").as_deref(), Some("x"));
        let doc = parse_json(br#"{"o": {"$eq": "v"}, "in": [["v"], "x"], "deep": [{"a": 1}]}"#);
        let doc = doc.unwrap();
        for pointer in ["/o", "/in", "/deep", ""] {
            assert_eq!(json_value(&doc, pointer), Err(Repeated), "{pointer}");
        }
        assert_eq!(value(&doc, "/o/$eq").as_deref(), Some("v"));
    }

    #[test]
    fn a_member_named_twice_with_different_values_has_no_value() {
        let doc = parse_json(
            br#"{"u": "first", "u": "last", "same": 1, "same": 1,
                "o": {"a/b": [{"x": 1, "x": 2}]}, "ok": "yes"}"#,
        )
        .unwrap();
        for pointer in [
            "/u",
            "/o",
            "/o/a~1b",
            "/o/a~1b/0",
            "/o/a~1b/0/x",
            "/o/a~1b/0/x/y",
        ] {
            assert_eq!(json_value(&doc, pointer), Err(Repeated), "{pointer}");
        }
        for (pointer, expected) in [("/same", Some("1")), ("/ok", Some("yes")), ("/o2", None)] {
            assert_eq!(value(&doc, pointer).as_deref(), expected, "{pointer}");
        }
        assert_eq!(json_value(&doc, ""), Err(Repeated), "the whole document");
    }

    #[test]
    fn hostile_json_gives_no_value() {
        let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(parse_json(deep.as_bytes()), None);
        assert_eq!(parse_json(b"{\"u\": \"\xff\xfe\"}"), None);
        assert_eq!(parse_json(b"{\"u\": "), None);
    }

    #[test]
    fn form_fields_urlencoded_and_multipart() {
        let url = "application/x-www-form-urlencoded; charset=utf-8";
        assert_eq!(form_values(b"user=alice&x=1", url, "user"), ["alice"]);
        assert_eq!(form_values(b"User=%61lice", url, "user"), ["alice"]);
        assert_eq!(form_values(b"user=a&user=b", url, "user"), ["a", "b"]);
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\nalice\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\nContent-Type: text/plain\r\n\r\nhello\r\n--XyZ--\r\n";
        let multipart = "multipart/form-data; boundary=XyZ";
        assert_eq!(form_values(body, multipart, "user"), ["alice"]);
        assert_eq!(form_values(body, multipart, "file"), ["hello"]);
        let nul = b"--XyZ\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\nalice\0x\r\n--XyZ\r\nContent-Disposition: form-data; name=\"user\"\r\n\r\nalice\r\n--XyZ--\r\n";
        assert_eq!(
            form_values(nul, multipart, "user"),
            ["alice"],
            "cut at NUL, then one value"
        );
        assert!(form_values(body, multipart, "none").is_empty());
        assert!(form_values(body, "multipart/form-data", "user").is_empty());
        assert!(form_values(b"user=alice", "text/plain", "user").is_empty());
        assert!(form_values(b"--XyZ\r\ngarbage", multipart, "user").is_empty());
    }

    #[test]
    fn multipart_part_headers_are_read_as_leniently_as_origins_read_them() {
        let multipart = "multipart/form-data; boundary=B";
        let values = |head: &str| {
            let body = format!("--B\r\n{head}\r\n\r\nvictim\r\n--B--\r\n");
            form_values(body.as_bytes(), multipart, "username")
                .into_iter()
                .map(|v| v.into_owned())
                .collect::<Vec<_>>()
        };
        for head in [
            "Content-Disposition: form-data;\r\n name=\"username\"",
            "Content-Disposition: form-data;\r\nname=\"username\"",
            "Content-Disposition: form-data; name='username'",
            "Content-Disposition: form-data; name=\"x\"; name*=UTF-8''user%6Eame",
            "content-disposition: FORM-DATA; NAME=\"Username\"",
            "Content-Disposition: form-data; name=\"username\"\r\nContent-Transfer-Encoding: 8bit",
        ] {
            assert_eq!(values(head), ["victim"], "{head}");
        }
        // An encoded value is refused: it reads as two.
        let encoded = "Content-Disposition: form-data; name=\"username\"\r\n\
                       Content-Transfer-Encoding: quoted-printable";
        assert_eq!(values(encoded).len(), 2);
        assert!(values("Content-Disposition: form-data; name=\"usernames\"").is_empty());
    }

    #[test]
    fn a_form_is_read_where_php_reads_one() {
        let body = b"username=rnd&+username=alice";
        for content_type in [
            "application/x-www-form-urlencoded",
            "application/x-www-form-urlencoded,",
            "Application/X-WWW-Form-Urlencoded charset=utf-8",
            " application/x-www-form-urlencoded;charset=utf-8",
        ] {
            assert_eq!(
                form_values(body, content_type, "username"),
                ["rnd", "alice"],
                "{content_type}"
            );
            assert!(is_form(content_type), "{content_type}");
        }
    }

    #[test]
    fn a_multipart_delimiter_starts_a_line_and_ends_it() {
        let multipart = "multipart/form-data; boundary=B";
        let part = |name: &str, value: &str| {
            format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
        };
        let values = |body: &str, content_type: &str, name: &str| {
            form_values(body.as_bytes(), content_type, name)
                .into_iter()
                .map(|v| v.into_owned())
                .collect::<Vec<_>>()
        };
        // A preamble holding what looks like a delimiter, then the parts
        // every origin reads.
        let body = format!(
            "x--B\r\n{}--B--\r\n--B\r\n{}--B \r\n{}--B--\r\n",
            part("username", "r4nd0m"),
            part("username", "victim"),
            part("password", "guess")
        );
        assert_eq!(values(&body, multipart, "username"), ["victim"]);
        assert_eq!(values(&body, multipart, "password"), ["guess"]);
        assert!(fields_readable(body.as_bytes(), multipart));
        // A value ends at the next delimiter whatever follows it, as PHP
        // and busboy end it.
        let tail = format!("--B\r\n{}--Bx4711\r\n--B--\r\n", part("username", "victim"));
        assert_eq!(values(&tail, multipart, "username"), ["victim"]);
        // PHP reads on after a closing delimiter: both values, so no bucket.
        let after = format!(
            "--B\r\n{}--B--\r\n--B\r\n{}--B--\r\n",
            part("username", "r4nd"),
            part("username", "victim")
        );
        assert_eq!(values(&after, multipart, "username"), ["r4nd", "victim"]);
        // A quoted boundary keeps its commas; a bare one ends at `,` or `;`.
        let quoted = format!(
            "--x\r\n{}--x--\r\n--x,y\r\n{}--x,y--\r\n",
            part("username", "r4nd"),
            part("username", "victim")
        );
        let comma = "multipart/form-data; boundary=\"x,y\"";
        assert_eq!(values(&quoted, comma, "username"), ["victim"]);
        assert_eq!(
            values(&body, "multipart/form-data, boundary=B", "username"),
            ["victim"]
        );
        // Line feeds alone end lines, as in PHP.
        let lf = "--B\nContent-Disposition: form-data; name=\"username\"\n\nalice\n--B--\n";
        assert_eq!(values(lf, multipart, "username"), ["alice"]);
        // A body without its closing delimiter cannot be read whole.
        let open = format!("--B\r\n{}", part("username", "victim"));
        assert!(!fields_readable(open.as_bytes(), multipart));
        assert!(!fields_readable(body.as_bytes(), "multipart/form-data"));
        let long = format!("multipart/form-data; boundary={}", "b".repeat(201));
        assert!(!fields_readable(body.as_bytes(), &long));
        assert!(fields_readable(b"a=1", "application/x-www-form-urlencoded"));
        assert!(fields_readable(b"--B--\r\n", multipart));
    }

    #[test]
    fn a_urlencoded_body_that_is_not_utf8_is_still_read() {
        let url = "application/x-www-form-urlencoded";
        assert_eq!(
            form_values(b"a=\xff&_method=DELETE", url, "_method"),
            ["DELETE"]
        );
        assert_eq!(form_values(b"a=\xff&b=\xfe", url, "a"), ["\u{fffd}"]);
    }
}
