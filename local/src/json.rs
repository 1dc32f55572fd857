//! The JSON side of the protocol: request bodies to Redis arguments, replies to JSON.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{json, Value as Json};

use crate::resp::Value;

/// One command: its name and arguments as raw bytes.
pub type Command = Vec<Vec<u8>>;

/// Parses the body of `POST /`: one command.
pub fn parse_command_body(body: &[u8]) -> Result<Command, String> {
    command(&parse(body)?, None)
}

/// Parses the body of `POST /pipeline` or `POST /multi-exec`: an array of commands.
pub fn parse_batch_body(body: &[u8]) -> Result<Vec<Command>, String> {
    let Json::Array(commands) = parse(body)? else {
        return Err("ERR the body must be a JSON array of commands, \
                    like [[\"SET\",\"k\",\"v\"],[\"GET\",\"k\"]]"
            .into());
    };
    commands
        .iter()
        .enumerate()
        .map(|(i, c)| command(c, Some(i)))
        .collect()
}

fn parse(body: &[u8]) -> Result<Json, String> {
    serde_json::from_slice(body).map_err(|e| format!("ERR the body is not valid JSON: {e}"))
}

fn command(json: &Json, index: Option<usize>) -> Result<Command, String> {
    let which = match index {
        Some(i) => format!("command {i} (0-based)"),
        None => "the command".to_string(),
    };
    let Json::Array(args) = json else {
        return Err(format!(
            "ERR {which} must be a JSON array of strings and numbers, like [\"GET\",\"k\"]"
        ));
    };
    if args.is_empty() {
        return Err(format!("ERR {which} is empty"));
    }
    args.iter()
        .enumerate()
        .map(|(j, arg)| {
            argument(arg).ok_or_else(|| {
                format!(
                    "ERR argument {j} of {which} is {}; only strings, numbers and booleans \
                     are allowed",
                    kind(arg)
                )
            })
        })
        .collect()
}

/// Turns a scalar into the text Redis receives: numbers as their literal text (integers
/// without a fraction, other floats in Rust's shortest round-trip form, never with an
/// exponent), booleans as `true`/`false`.
fn argument(arg: &Json) -> Option<Vec<u8>> {
    let text = match arg {
        Json::String(s) => return Some(s.clone().into_bytes()),
        Json::Bool(b) => b.to_string(),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => f.to_string(),
            _ => return None,
        },
        Json::Null | Json::Array(_) | Json::Object(_) => return None,
    };
    Some(text.into_bytes())
}

fn kind(arg: &Json) -> &'static str {
    match arg {
        Json::Null => "null",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
        _ => "a scalar",
    }
}

/// One reply as `{"result": ..}` or `{"error": ..}`.
pub fn entry(reply: Value, base64: bool) -> Json {
    match reply {
        Value::Error(text) => json!({ "error": text }),
        reply => json!({ "result": result(reply, base64) }),
    }
}

/// The `result` of a reply. In base64 mode every string is encoded except a top-level
/// simple `OK`, which hosted Upstash leaves bare and the official client expects bare.
pub fn result(reply: Value, base64: bool) -> Json {
    match reply {
        Value::Simple(s) if base64 && s == "OK" => Json::String(s),
        reply => nested(reply, base64),
    }
}

fn nested(reply: Value, base64: bool) -> Json {
    let string = |bytes: &[u8]| {
        Json::String(if base64 {
            BASE64.encode(bytes)
        } else {
            // JSON strings are Unicode; raw bytes need base64 mode to survive.
            String::from_utf8_lossy(bytes).into_owned()
        })
    };
    match reply {
        Value::Nil => Json::Null,
        Value::Int(n) => Json::from(n),
        Value::Bulk(bytes) => string(&bytes),
        // Only EXEC inside a plain pipeline nests errors in a result; JSON results hold
        // no objects, so such an error shows as its text.
        Value::Simple(s) | Value::Error(s) => string(s.as_bytes()),
        Value::Array(items) => Json::Array(items.into_iter().map(|v| nested(v, base64)).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_scalars_to_redis_text() {
        let cmd =
            parse_command_body(br#"["SET","k",7,-3,1.5,2.0,1e3,true,false,18446744073709551615]"#)
                .unwrap();
        let texts: Vec<String> = cmd
            .into_iter()
            .map(|a| String::from_utf8(a).unwrap())
            .collect();
        assert_eq!(
            texts,
            [
                "SET",
                "k",
                "7",
                "-3",
                "1.5",
                "2",
                "1000",
                "true",
                "false",
                "18446744073709551615"
            ]
        );
    }

    #[test]
    fn explains_bad_bodies() {
        assert!(parse_command_body(b"{")
            .unwrap_err()
            .starts_with("ERR the body is not valid JSON"));
        assert!(parse_command_body(b"[]").unwrap_err().contains("is empty"));
        assert!(parse_command_body(br#"["GET",null]"#)
            .unwrap_err()
            .contains("argument 1"));
        assert!(parse_batch_body(br#"[["GET","k"],"GET"]"#)
            .unwrap_err()
            .contains("command 1"));
        assert!(parse_batch_body(br#"["GET","k"]"#)
            .unwrap_err()
            .contains("command 0"));
        assert!(parse_batch_body(br#"{"a":1}"#)
            .unwrap_err()
            .contains("array of commands"));
    }

    #[test]
    fn maps_replies() {
        let reply = Value::Array(vec![
            Value::Nil,
            Value::Int(3),
            Value::Bulk(b"bar".to_vec()),
            Value::Simple("OK".into()),
            Value::Array(vec![Value::Bulk(vec![0xff])]),
        ]);
        assert_eq!(
            result(reply.clone(), false),
            json!([null, 3, "bar", "OK", ["\u{fffd}"]])
        );
        assert_eq!(
            result(reply, true),
            json!([null, 3, "YmFy", "T0s=", ["/w=="]])
        );
        assert_eq!(result(Value::Simple("OK".into()), true), json!("OK"));
        assert_eq!(
            result(Value::Simple("PONG".into()), true),
            json!("UE9ORw==")
        );
        assert_eq!(entry(Value::Nil, true), json!({ "result": null }));
        assert_eq!(
            entry(Value::Error("NOSCRIPT x".into()), true),
            json!({ "error": "NOSCRIPT x" })
        );
    }
}
