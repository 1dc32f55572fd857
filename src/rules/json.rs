//! A JSON body as rules read it: parsed once, into one flat list of values
//! (a tape) whose objects note every member named twice with different
//! values, and read by RFC 6901 pointer. A body of any shape costs a few
//! allocations and a small multiple of its size. A body that does not
//! parse (invalid JSON or UTF-8, nesting beyond serde_json's 128 levels)
//! gives no value.

use std::borrow::Cow;

use serde::{
    de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor},
    ser::{SerializeMap, SerializeSeq},
    Serialize, Serializer,
};
use serde_json::Number;

use super::canon;

/// A parsed JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Json {
    /// Every value in document order; a container is followed by its
    /// items (an object's each as a name, then its value).
    tape: Vec<Token>,
    /// The text of every string and member name, one after another.
    text: String,
    /// Each object's members, as places on the tape of their names (the
    /// last of each name), in the order of the names.
    order: Vec<u32>,
}

/// One value or member name on the tape.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Token {
    Null,
    Bool(bool),
    /// A negative integer.
    Int(i64),
    UInt(u64),
    Float(f64),
    String(TextSpan),
    /// An array; its items run to `end`.
    Array {
        end: u32,
    },
    /// An object; its members run to `end`, and `order[at..at + len]`
    /// holds them by name.
    Object {
        end: u32,
        at: u32,
        len: u32,
    },
    /// A member's name, its value next. `repeated`: the member was named
    /// twice with different values (on the last of that name). Go's gjson,
    /// simdjson and other streaming readers take the first, `JSON.parse`
    /// and PHP's `json_decode` the last, so neither is the value.
    Name {
        text: TextSpan,
        repeated: bool,
    },
}

/// JSON has no NaN: every float equals itself.
impl Eq for Token {}

/// Where a text lies in [`Json::text`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TextSpan {
    start: u32,
    end: u32,
}

/// A JSON member named twice with different values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repeated;

/// Parses a JSON body. Deeply nested or invalid documents (bad UTF-8
/// included) give `None`: serde_json refuses nesting beyond 128 levels
/// rather than recursing without bound.
pub fn parse(body: &[u8]) -> Option<Json> {
    // Places on the tape are u32.
    u32::try_from(body.len()).ok()?;
    let mut json = Json {
        tape: Vec::new(),
        text: String::new(),
        order: Vec::new(),
    };
    let mut members = Vec::new();
    // Read as text, as the REST replies are: the worker then carries one
    // copy of serde_json's reader (invalid UTF-8 fails either way).
    let mut reader = serde_json::Deserializer::from_str(std::str::from_utf8(body).ok()?);
    Read {
        json: &mut json,
        members: &mut members,
    }
    .deserialize(&mut reader)
    .ok()?;
    reader.end().ok()?;
    Some(json)
}

/// The value at `pointer`, as text; `Err` when a member named twice (in
/// any case) lies on the way there, or when the value is an object or an
/// array of several distinct values. An array counts as its plain values,
/// since Laravel's and Rails' lookups by a field take an array as any of
/// its elements (`{"email": ["victim", "x"]}` finds `victim`).
pub fn value<'a>(json: &'a Json, pointer: &str) -> Result<Option<Cow<'a, str>>, Repeated> {
    let found = match json.lookup(pointer)? {
        Some(at) => at,
        None => return Ok(None),
    };
    if !matches!(json.tape[found], Token::Array { .. } | Token::Object { .. }) {
        return Ok(json.text_of(found));
    }
    // The first value with a text, and where it is: a value equal to it
    // is not read again.
    let mut first: Option<(usize, Cow<'a, str>)> = None;
    json.leaves(found, &mut |scalar| match &first {
        Some((at, _)) if json.same(*at, scalar) => Ok(()),
        Some((_, f)) => match json.text_of(scalar) {
            Some(t) if t != *f => Err(Repeated),
            _ => Ok(()),
        },
        None => {
            first = json.text_of(scalar).map(|t| (scalar, t));
            Ok(())
        }
    })?;
    Ok(first.map(|(_, t)| t))
}

/// The value of the top-level member `name` as text, its last if named
/// twice, as `JSON.parse` and PHP's `json_decode` take it.
pub fn last_value<'a>(json: &'a Json, name: &str) -> Option<Cow<'a, str>> {
    let order = json.order_of(0);
    let found = order
        .binary_search_by(|&m| json.name(m as usize).cmp(name))
        .ok()?;
    json.text_of(order[found] as usize + 1)
}

impl Json {
    /// The text of a span.
    fn str(&self, span: TextSpan) -> &str {
        &self.text[span.start as usize..span.end as usize]
    }

    /// The name of the member at `at` (a [`Token::Name`]).
    fn name(&self, at: usize) -> &str {
        match self.tape[at] {
            Token::Name { text, .. } => self.str(text),
            _ => "",
        }
    }

    /// The place after the value at `at`.
    fn after(&self, at: usize) -> usize {
        match self.tape[at] {
            Token::Array { end } | Token::Object { end, .. } => end as usize,
            _ => at + 1,
        }
    }

    /// The places of an array's items.
    fn items(&self, at: usize) -> impl Iterator<Item = usize> + '_ {
        let end = self.after(at);
        let mut next = at + 1;
        std::iter::from_fn(move || {
            let item = (next < end).then_some(next)?;
            next = self.after(item);
            Some(item)
        })
    }

    /// The places of an object's members' names, in the order of the
    /// names; none if `at` is no object.
    fn members(&self, at: usize) -> impl Iterator<Item = usize> + '_ {
        self.order_of(at).iter().map(|&m| m as usize)
    }

    /// [`Json::members`] as they are kept.
    fn order_of(&self, at: usize) -> &[u32] {
        match self.tape.get(at) {
            Some(&Token::Object { at, len, .. }) => &self.order[at as usize..(at + len) as usize],
            _ => &[],
        }
    }

    /// The text a value counts as: a string as itself up to any NUL
    /// ([`canon::before_nul`]), a number as the integer it equals where
    /// it equals one ([`canon::number_or_uuid`]: `1.0`, `1e0` and `1` are
    /// `1`, as JavaScript and Python compare them), a boolean, object or
    /// array as compact JSON. `null` counts as missing (`None`). An
    /// integer beyond 2^53 counts as the double a JavaScript origin reads
    /// it as: the ids it cannot tell apart are one client, never many.
    fn text_of(&self, at: usize) -> Option<Cow<'_, str>> {
        const EXACT: u64 = 1 << 53;
        let number = match self.tape[at] {
            Token::Null => return None,
            Token::String(span) => return Some(Cow::Borrowed(canon::before_nul(self.str(span)))),
            Token::Int(n) if n.unsigned_abs() > EXACT => Number::from_f64(n as f64)?,
            Token::UInt(n) if n > EXACT => Number::from_f64(n as f64)?,
            Token::Int(n) => Number::from(n),
            Token::UInt(n) => Number::from(n),
            Token::Float(n) => Number::from_f64(n)?,
            _ => {
                let compact = serde_json::to_string(&View { json: self, at });
                return Some(Cow::Owned(compact.unwrap_or_default()));
            }
        };
        Some(canon::number_or_uuid(Cow::Owned(number.to_string())))
    }

    /// Each plain value of an array to `each`, nested arrays flattened
    /// (Laravel's `where` flattens them); an object has several meanings
    /// to origins (Laravel takes its first value, MongoDB an operator), so
    /// it has none.
    fn leaves(
        &self,
        at: usize,
        each: &mut impl FnMut(usize) -> Result<(), Repeated>,
    ) -> Result<(), Repeated> {
        match self.tape[at] {
            Token::Array { .. } => self.items(at).try_for_each(|i| self.leaves(i, each)),
            Token::Object { .. } => Err(Repeated),
            _ => each(at),
        }
    }

    /// The place of the value at `pointer`, members matched without regard
    /// to case, as Go's `encoding/json` and ASP.NET Core's defaults match
    /// them; `Err` when two names that differ only in case have different
    /// values on the way, or a member there was named twice with
    /// different values.
    fn lookup(&self, pointer: &str) -> Result<Option<usize>, Repeated> {
        let mut at = 0;
        for token in pointer.split('/').skip(1) {
            let token = token.replace("~1", "/").replace("~0", "~");
            let next = match self.tape[at] {
                Token::Object { .. } => {
                    let wanted = canon::fold(&token);
                    let mut named = self.members(at).filter(|&m| {
                        self.name(m)
                            .chars()
                            .map(canon::fold_char)
                            .eq(wanted.chars())
                    });
                    let first = named.next();
                    let differs = |m: usize| first.is_some_and(|f| !self.same(f + 1, m + 1));
                    if first.is_some_and(|f| self.repeated(f))
                        || named.any(|m| self.repeated(m) || differs(m))
                    {
                        return Err(Repeated);
                    }
                    first.map(|f| f + 1)
                }
                Token::Array { .. } => {
                    let index = token.parse::<usize>().ok();
                    let mut items = self.items(at).enumerate();
                    index
                        .and_then(|i| items.find(|&(n, _)| n == i))
                        .map(|(_, item)| item)
                }
                _ => None,
            };
            match next {
                Some(place) => at = place,
                None => return Ok(None),
            }
        }
        Ok(Some(at))
    }

    /// Whether the member whose name is at `at` was named twice with
    /// different values.
    fn repeated(&self, at: usize) -> bool {
        matches!(self.tape[at], Token::Name { repeated: true, .. })
    }

    /// Whether the values at `a` and `b` are equal: objects as maps of
    /// their members (those named twice alike only if both were).
    fn same(&self, a: usize, b: usize) -> bool {
        match (self.tape[a], self.tape[b]) {
            (Token::String(x), Token::String(y)) => self.str(x) == self.str(y),
            (Token::Array { .. }, Token::Array { .. }) => {
                let (mut x, mut y) = (self.items(a), self.items(b));
                loop {
                    match (x.next(), y.next()) {
                        (None, None) => return true,
                        (Some(i), Some(j)) if self.same(i, j) => {}
                        _ => return false,
                    }
                }
            }
            (Token::Object { len: n, .. }, Token::Object { len: m, .. }) => {
                n == m
                    && self.members(a).zip(self.members(b)).all(|(i, j)| {
                        self.name(i) == self.name(j)
                            && self.repeated(i) == self.repeated(j)
                            && self.same(i + 1, j + 1)
                    })
            }
            (x, y) => x == y,
        }
    }
}

/// A value of a [`Json`], to write it as JSON.
struct View<'a> {
    json: &'a Json,
    at: usize,
}

impl Serialize for View<'_> {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        let json = self.json;
        let view = |at| View { json, at };
        match json.tape[self.at] {
            Token::Null | Token::Name { .. } => out.serialize_unit(),
            Token::Bool(b) => out.serialize_bool(b),
            Token::Int(n) => out.serialize_i64(n),
            Token::UInt(n) => out.serialize_u64(n),
            Token::Float(n) => out.serialize_f64(n),
            Token::String(span) => out.serialize_str(json.str(span)),
            Token::Array { .. } => {
                let mut seq = out.serialize_seq(None)?;
                for item in json.items(self.at) {
                    seq.serialize_element(&view(item))?;
                }
                seq.end()
            }
            Token::Object { .. } => {
                let mut map = out.serialize_map(None)?;
                for m in json.members(self.at) {
                    map.serialize_entry(json.name(m), &view(m + 1))?;
                }
                map.end()
            }
        }
    }
}

/// Reads one value onto the tape. `members` holds the names of the
/// members of the objects being read, innermost last, with their places.
struct Read<'b> {
    json: &'b mut Json,
    members: &'b mut Vec<(TextSpan, u32)>,
}

impl Read<'_> {
    fn again(&mut self) -> Read<'_> {
        Read {
            json: self.json,
            members: self.members,
        }
    }

    fn push(self, token: Token) {
        self.json.tape.push(token);
    }

    /// The place the next token goes to.
    fn place(&self) -> u32 {
        self.json.tape.len() as u32
    }

    /// `text` added to the text, where it lies.
    fn text(&mut self, text: &str) -> TextSpan {
        let start = self.json.text.len() as u32;
        self.json.text.push_str(text);
        TextSpan {
            start,
            end: self.json.text.len() as u32,
        }
    }

    /// The members of the object being read, from `first` in `members`,
    /// noted by name: the last of each name kept, marked repeated when
    /// two of that name in a row have different values.
    fn close_object(&mut self, first: usize) -> (u32, u32) {
        let json = &mut *self.json;
        let mine = &mut self.members[first..];
        let text = |span: TextSpan| &json.text[span.start as usize..span.end as usize];
        // In the order of their names, each name's in document order.
        mine.sort_unstable_by(|a, b| text(a.0).cmp(text(b.0)).then(a.1.cmp(&b.1)));
        let at = json.order.len() as u32;
        // Repeated: two of a name in a row with different values.
        let mut repeated = false;
        for (i, &(name, place)) in mine.iter().enumerate() {
            match mine.get(i + 1) {
                Some(&(next, later)) if text(next) == text(name) => {
                    repeated |= !json.same(place as usize + 1, later as usize + 1);
                }
                _ => {
                    if let Token::Name { repeated: r, .. } = &mut json.tape[place as usize] {
                        *r = repeated;
                    }
                    json.order.push(place);
                    repeated = false;
                }
            }
        }
        let len = json.order.len() as u32 - at;
        self.members.truncate(first);
        (at, len)
    }
}

impl<'de> DeserializeSeed<'de> for Read<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, reader: D) -> Result<(), D::Error> {
        reader.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Read<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.push(Token::Bool(v));
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        // serde_json gives a non-negative integer as a u64.
        self.push(Token::Int(v));
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.push(Token::UInt(v));
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.push(Token::Float(v));
        Ok(())
    }

    fn visit_str<E>(mut self, v: &str) -> Result<(), E> {
        let span = self.text(v);
        self.push(Token::String(span));
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.push(Token::Null);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut items: A) -> Result<(), A::Error> {
        let at = self.place() as usize;
        self.json.tape.push(Token::Array { end: 0 });
        while items.next_element_seed(self.again())?.is_some() {}
        let end = self.place();
        self.json.tape[at] = Token::Array { end };
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut members: A) -> Result<(), A::Error> {
        let at = self.place() as usize;
        self.json.tape.push(Token::Object {
            end: 0,
            at: 0,
            len: 0,
        });
        let first = self.members.len();
        loop {
            let name = self.place();
            if members.next_key_seed(Name(self.again()))?.is_none() {
                break;
            }
            members.next_value_seed(self.again())?;
            if let Token::Name { text, .. } = self.json.tape[name as usize] {
                self.members.push((text, name));
            }
        }
        let end = self.place();
        let (order, len) = self.close_object(first);
        self.json.tape[at] = Token::Object {
            end,
            at: order,
            len,
        };
        Ok(())
    }
}

/// Reads a member's name onto the tape.
struct Name<'b>(Read<'b>);

impl<'de> DeserializeSeed<'de> for Name<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, reader: D) -> Result<(), D::Error> {
        reader.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E>(mut self, v: &str) -> Result<(), E> {
        let text = self.0.text(v);
        self.0.push(Token::Name {
            text,
            repeated: false,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value where no member is named twice.
    fn plain<'a>(json: &'a Json, pointer: &str) -> Option<Cow<'a, str>> {
        value(json, pointer).expect("no repeated member on the way")
    }

    #[test]
    fn json_values_by_pointer() {
        let doc = parse(br#"{"user": {"name": "Alice", "id": 7, "n": 1.0, "tags": ["a"], "none": null}, "a/b": "slash"}"#).unwrap();
        assert_eq!(plain(&doc, "/user/name").as_deref(), Some("Alice"));
        assert_eq!(plain(&doc, "/user/id").as_deref(), Some("7"));
        assert_eq!(plain(&doc, "/user/n").as_deref(), Some("1"));
        assert_eq!(plain(&doc, "/user/tags").as_deref(), Some("a"));
        assert_eq!(plain(&doc, "/user/none"), None);
        assert_eq!(plain(&doc, "/user/missing"), None);
        assert_eq!(plain(&doc, "/a~1b").as_deref(), Some("slash"));
        let nul = parse(br#"{"u": "alice\u0000x"}"#).unwrap();
        assert_eq!(plain(&nul, "/u").as_deref(), Some("alice"));
    }

    #[test]
    fn numbers_equal_to_an_integer_count_as_its_digits() {
        let doc = parse(
            br#"{"int": 1000000000000000000, "exp": 1e18, "float": 1000000000000000000.0,
                "text": "1000000000000000000", "neg": -12e0, "zero": -0.0, "half": 1.5,
                "huge": 18446744073709551616, "huge_exp": 1.8446744073709552e19}"#,
        )
        .unwrap();
        for pointer in ["/int", "/exp", "/float", "/text"] {
            let text = plain(&doc, pointer);
            assert_eq!(text.as_deref(), Some("1000000000000000000"), "{pointer}");
        }
        assert_eq!(plain(&doc, "/neg").as_deref(), Some("-12"));
        assert_eq!(plain(&doc, "/zero").as_deref(), Some("0"));
        assert_eq!(plain(&doc, "/half").as_deref(), Some("1.5"));
        assert_eq!(plain(&doc, "/huge"), plain(&doc, "/huge_exp"));
    }

    #[test]
    fn integers_beyond_2_53_count_as_the_double_javascript_reads() {
        let doc = parse(
            br#"{"a": 9007199254740993, "b": 9007199254740992, "c": 9007199254740991,
                "d": 1000000000000000001, "e": 1000000000000000000, "f": -9007199254740993,
                "g": 18446744073709551615, "s": "9007199254740993"}"#,
        )
        .unwrap();
        // 2^53 + 1 is the double 2^53 in JavaScript: one client, not two.
        assert_eq!(plain(&doc, "/a").as_deref(), Some("9007199254740992"));
        assert_eq!(plain(&doc, "/a"), plain(&doc, "/b"));
        assert_eq!(plain(&doc, "/c").as_deref(), Some("9007199254740991"));
        assert_eq!(plain(&doc, "/d"), plain(&doc, "/e"));
        assert_eq!(plain(&doc, "/f").as_deref(), Some("-9007199254740992"));
        // Written as JavaScript's String() writes that double.
        assert_eq!(plain(&doc, "/g").as_deref(), Some("18446744073709552000"));
        // An id sent as a string stays exact.
        assert_eq!(plain(&doc, "/s").as_deref(), Some("9007199254740993"));
    }

    #[test]
    fn member_names_are_matched_without_regard_to_case() {
        let doc = r#"{"USER": {"Name": "v"}, "uſername": "w", "id": 1}"#;
        let doc = parse(doc.as_bytes()).unwrap();
        assert_eq!(plain(&doc, "/user/name").as_deref(), Some("v"));
        assert_eq!(plain(&doc, "/username").as_deref(), Some("w"));
        assert_eq!(plain(&doc, "/ID").as_deref(), Some("1"));
        // Two spellings of one name with different values: no value.
        let doc = parse(br#"{"Username": "victim", "username": "r1", "ok": 1, "OK": 1}"#);
        let doc = doc.unwrap();
        assert_eq!(value(&doc, "/username"), Err(Repeated));
        assert_eq!(value(&doc, "/USERNAME"), Err(Repeated));
        assert_eq!(plain(&doc, "/ok").as_deref(), Some("1"));
    }

    #[test]
    fn an_array_of_scalars_counts_as_its_elements() {
        let doc = parse(
            br#"{"one": ["v", "v"], "two": ["v", "x"], "none": [], "nulls": [null],
                "nested": [["v"]], "numbers": [1, 1.0]}"#,
        )
        .unwrap();
        assert_eq!(plain(&doc, "/one").as_deref(), Some("v"));
        assert_eq!(value(&doc, "/two"), Err(Repeated));
        assert_eq!(plain(&doc, "/none"), None);
        assert_eq!(plain(&doc, "/nulls"), None);
        assert_eq!(plain(&doc, "/nested").as_deref(), Some("v"));
        assert_eq!(plain(&doc, "/numbers").as_deref(), Some("1"));
        assert_eq!(plain(&doc, "/two/1").as_deref(), Some("x"));
        let doc = parse(br#"{"o": {"$eq": "v"}, "in": [["v"], "x"], "deep": [{"a": 1}]}"#);
        let doc = doc.unwrap();
        for pointer in ["/o", "/in", "/deep", ""] {
            assert_eq!(value(&doc, pointer), Err(Repeated), "{pointer}");
        }
        assert_eq!(plain(&doc, "/o/$eq").as_deref(), Some("v"));
    }

    #[test]
    fn a_member_named_twice_with_different_values_has_no_value() {
        let doc = parse(
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
            assert_eq!(value(&doc, pointer), Err(Repeated), "{pointer}");
        }
        for (pointer, expected) in [("/same", Some("1")), ("/ok", Some("yes")), ("/o2", None)] {
            assert_eq!(plain(&doc, pointer).as_deref(), expected, "{pointer}");
        }
        assert_eq!(value(&doc, ""), Err(Repeated), "the whole document");
    }

    #[test]
    fn hostile_json_gives_no_value() {
        let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(parse(deep.as_bytes()), None);
        assert_eq!(parse(b"{\"u\": \"\xff\xfe\"}"), None);
        assert_eq!(parse(b"{\"u\": "), None);
    }

    #[test]
    fn a_member_named_twice_in_another_case_than_the_pointer_has_no_value() {
        let doc = parse(br#"{"User": {"Name": "victim", "Name": "r1"}, "ok": 1}"#).unwrap();
        for pointer in ["/user/name", "/User/Name", "/USER"] {
            assert_eq!(value(&doc, pointer), Err(Repeated), "{pointer}");
        }
        assert_eq!(plain(&doc, "/OK").as_deref(), Some("1"));
    }

    #[test]
    fn objects_compare_as_maps() {
        let doc = parse(
            br#"{"a": {"x": 1, "y": [2]}, "a": {"y": [2], "x": 1, "x": 1}, "b": 1, "b": 1.0}"#,
        );
        let doc = doc.unwrap();
        assert_eq!(plain(&doc, "/a/x").as_deref(), Some("1"));
        assert_eq!(
            value(&doc, "/b"),
            Err(Repeated),
            "1 and 1.0 differ, as to serde_json"
        );
    }

    #[test]
    fn a_top_level_member_reads_as_its_last_value() {
        let doc = parse(br#"{"_method": "get", "_method": " delete ", "n": 0042}"#);
        assert_eq!(doc, None, "a leading zero is no JSON");
        let doc =
            parse(br#"{"_method": "get", "_method": " delete ", "o": {"b": 1, "a": [true]}}"#)
                .unwrap();
        assert_eq!(last_value(&doc, "_method").as_deref(), Some(" delete "));
        assert_eq!(
            last_value(&doc, "o").as_deref(),
            Some(r#"{"a":[true],"b":1}"#)
        );
        assert_eq!(last_value(&doc, "_METHOD"), None);
        assert_eq!(last_value(&parse(b"[1]").unwrap(), "_method"), None);
    }

    #[test]
    fn a_value_takes_16_bytes() {
        assert_eq!(std::mem::size_of::<Token>(), 16);
    }
}
