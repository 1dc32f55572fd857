//! Just enough RESP2 to pipeline script calls to a private redis-server:
//! commands out as arrays of bulk strings, replies in as JSON values (the
//! form [`crate::decision::transport::protocol::ScriptCall::decode`] reads).

use std::io::{self, BufRead, Write};

use serde_json::Value;

/// Appends one command to `out`.
pub fn encode<'a>(args: impl ExactSizeIterator<Item = &'a [u8]>, out: &mut Vec<u8>) {
    write_len(b'*', args.len(), out);
    for arg in args {
        write_len(b'$', arg.len(), out);
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn write_len(tag: u8, n: usize, out: &mut Vec<u8>) {
    out.push(tag);
    // itoa by hand: format! per argument is measurable at a million calls.
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
}

/// A reply: a value, or Redis's error text.
pub type RespReply = Result<Value, String>;

/// How deep arrays may nest: the script's replies are flat; this only keeps
/// a corrupt stream from recursing without end.
const MAX_DEPTH: usize = 4;

/// Reads one reply from `input`; `line` is a scratch buffer.
pub fn read_reply(input: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<RespReply> {
    read_at(input, line, 0)
}

fn read_at(input: &mut impl BufRead, line: &mut Vec<u8>, depth: usize) -> io::Result<RespReply> {
    line.clear();
    if input.read_until(b'\n', line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed RESP reply");
    let body = line
        .strip_suffix(b"\r\n")
        .filter(|b| !b.is_empty())
        .ok_or_else(bad)?;
    let text = std::str::from_utf8(&body[1..]).map_err(|_| bad())?;
    let int = || text.parse::<i64>().map_err(|_| bad());
    Ok(match body[0] {
        b':' => Ok(Value::from(int()?)),
        b'+' => Ok(Value::from(text)),
        b'-' => Err(text.to_owned()),
        b'$' => match int()? {
            -1 => Ok(Value::Null),
            n => {
                let n = usize::try_from(n).map_err(|_| bad())?;
                let mut data = vec![0u8; n + 2];
                input.read_exact(&mut data)?;
                data.truncate(n);
                Ok(Value::from(String::from_utf8_lossy(&data).into_owned()))
            }
        },
        b'*' => match int()? {
            -1 => Ok(Value::Null),
            n if depth < MAX_DEPTH => {
                let n = usize::try_from(n).map_err(|_| bad())?;
                let mut items = Vec::with_capacity(n.min(1024));
                let mut error = None;
                for _ in 0..n {
                    match read_at(input, line, depth + 1)? {
                        Ok(v) => items.push(v),
                        Err(e) => error = error.or(Some(e)),
                    }
                }
                error.map_or(Ok(Value::Array(items)), Err)
            }
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    })
}

/// Sends one command and reads its reply.
pub fn call<S: io::Read + Write>(
    stream: &mut io::BufReader<S>,
    args: &[&[u8]],
) -> io::Result<RespReply> {
    let mut out = Vec::new();
    encode(args.iter().copied(), &mut out);
    stream.get_mut().write_all(&out)?;
    read_reply(stream, &mut Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode([&b"GET"[..], b"k"].into_iter(), &mut out);
        encode([&b""[..]; 10].into_iter(), &mut out);
        let mut expected = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*10\r\n".to_vec();
        expected.extend(b"$0\r\n\r\n".repeat(10));
        assert_eq!(out, expected);
    }

    #[test]
    fn replies_become_json() {
        let wire = b":-7\r\n*3\r\n:1\r\n$2\r\nab\r\n$-1\r\n+OK\r\n-NOSCRIPT No matching script\r\n*2\r\n:1\r\n-ERR x\r\n:5\r\n";
        let mut input = io::Cursor::new(&wire[..]);
        let mut line = Vec::new();
        let mut next = || read_reply(&mut input, &mut line).unwrap();
        assert_eq!(next(), Ok(json!(-7)));
        assert_eq!(next(), Ok(json!([1, "ab", null])));
        assert_eq!(next(), Ok(json!("OK")));
        assert_eq!(next(), Err("NOSCRIPT No matching script".to_owned()));
        assert_eq!(next(), Err("ERR x".to_owned()), "an error inside an array");
        assert_eq!(next(), Ok(json!(5)), "and the stream stays in step");
        for bad in [
            &b"?\r\n"[..],
            b":x\r\n",
            b"*9\r\n",
            b":1\n",
            b"$5\r\nab\r\n",
        ] {
            assert!(
                read_reply(&mut io::Cursor::new(bad), &mut Vec::new()).is_err(),
                "{bad:?}"
            );
        }
    }
}
