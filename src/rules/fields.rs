//! How a configuration field is read from its JSON form, and the error
//! that names it. Below every reader (the rule's own fields in `raw.rs`,
//! each algorithm's figures in `policy/`), so none of them imports another.

use serde_json::{Map, Value};

/// A field that does not read or cannot work: its name as the
/// configuration spells it (`count_status[0]` for an element,
/// `windows[1].duration` inside one), and what is wrong and what would be
/// right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The offending field, as written in the configuration.
    pub field: String,
    /// What is wrong and what would be right.
    pub problem: String,
}

/// The error for `field`.
pub(super) fn invalid(field: impl Into<String>, problem: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        problem: problem.into(),
    }
}

/// A field's value read from its JSON form; the error says what was
/// expected. Written by hand rather than derived: derived readers that name
/// the failing field cost the worker's wasm about 30 KB.
pub(super) trait FromJson: Sized {
    /// The value, or what was expected instead.
    fn from_json(v: &Value) -> Result<Self, String>;
}

/// What `got` is not, shown short enough for one line.
pub(super) fn expected(what: &str, got: &Value) -> String {
    let shown: String = got.to_string().chars().take(60).collect();
    format!("`{shown}` is not {what}")
}

impl FromJson for String {
    fn from_json(v: &Value) -> Result<String, String> {
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| expected("text", v))
    }
}

impl FromJson for bool {
    fn from_json(v: &Value) -> Result<bool, String> {
        v.as_bool().ok_or_else(|| expected("true or false", v))
    }
}

impl FromJson for u64 {
    fn from_json(v: &Value) -> Result<u64, String> {
        v.as_u64()
            .ok_or_else(|| expected("a whole number (0 or more)", v))
    }
}

impl FromJson for u16 {
    fn from_json(v: &Value) -> Result<u16, String> {
        v.as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| expected("a whole number from 0 to 65535", v))
    }
}

/// Which of `names` `v` is (its place in them), by its lower-case name.
/// Not generic over the values named: each reader's copy costs the wasm.
pub(super) fn named(v: &Value, names: &[&str]) -> Result<usize, String> {
    let found = v
        .as_str()
        .and_then(|text| names.iter().position(|n| *n == text));
    found.ok_or_else(|| {
        let all: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
        expected(&format!("one of {}", all.join(", ")), v)
    })
}

/// A duration as written: whole milliseconds, or text with a unit.
#[derive(Debug, Clone)]
pub(super) enum RawDuration {
    Ms(u64),
    Text(String),
}

impl FromJson for RawDuration {
    fn from_json(v: &Value) -> Result<RawDuration, String> {
        match v {
            Value::String(text) => Ok(RawDuration::Text(text.clone())),
            other => other.as_u64().map(RawDuration::Ms).ok_or_else(|| {
                expected("a duration: whole milliseconds, or text such as \"250ms\", \"1s\", \"5m\", \"1h\" or \"1d\"", v)
            }),
        }
    }
}

/// One field of `table`; `null` counts as absent.
pub(super) fn one<T: FromJson>(
    table: &Map<String, Value>,
    name: &str,
) -> Result<Option<T>, FieldError> {
    match table.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::from_json(v).map(Some).map_err(|e| invalid(name, e)),
    }
}

/// A list field read element by element, so that an error names the
/// element (`methods[2]`).
pub(super) fn list<T: FromJson>(
    table: &Map<String, Value>,
    name: &str,
) -> Result<Option<Vec<T>>, FieldError> {
    let items = match table.get(name) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(invalid(name, expected("a list", other))),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| T::from_json(v).map_err(|e| invalid(format!("{name}[{i}]"), e)))
        .collect::<Result<Vec<T>, _>>()
        .map(Some)
}

/// Milliseconds in a duration as written, longer than zero; the error
/// names `field`.
pub(super) fn duration(field: &str, raw: &RawDuration) -> Result<u64, FieldError> {
    let ms = match raw {
        RawDuration::Ms(ms) => Some(*ms),
        RawDuration::Text(text) => duration_text(text),
    }
    .ok_or_else(|| {
        let shown = match raw {
            RawDuration::Ms(ms) => ms.to_string(),
            RawDuration::Text(t) => format!("\"{t}\""),
        };
        invalid(
            field,
            format!("`{shown}` is not a duration; write e.g. 500 (ms), \"250ms\", \"1s\", \"5m\", \"1h\" or \"1d\""),
        )
    })?;
    if ms == 0 {
        return Err(invalid(field, "must be longer than zero"));
    }
    Ok(ms)
}

/// Milliseconds in a duration written with a unit (`250ms`, `1s`, `5m`,
/// `1h`, `1d`), or `None`.
pub fn duration_text(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(scale)
}
