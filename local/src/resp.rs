//! RESP2, the wire format between this endpoint and Redis: commands out, replies in.
//!
//! Hand-written rather than redis-rs so that Redis's error text reaches the HTTP client
//! byte for byte and bulk strings stay raw bytes until the JSON layer decides how to
//! show them.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// One reply from Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A nil bulk string (`$-1`) or nil array (`*-1`).
    Nil,
    /// An integer reply (`:n`).
    Int(i64),
    /// A simple string (`+OK`); Redis only ever sends ASCII here.
    Simple(String),
    /// A bulk string (`$n`): arbitrary bytes.
    Bulk(Vec<u8>),
    /// An array (`*n`), nested as deep as Redis nests it.
    Array(Vec<Value>),
    /// An error reply (`-ERR ...`), the text after the `-` verbatim.
    Error(String),
}

/// Renders a reply the way `redis-cli --raw` would: strings as text (lossy UTF-8), nil as
/// nothing, arrays one element per line. Meant for tests that compare against text.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Nil => Ok(()),
            Value::Int(n) => write!(f, "{n}"),
            Value::Simple(s) | Value::Error(s) => f.write_str(s),
            Value::Bulk(b) => f.write_str(&String::from_utf8_lossy(b)),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{item}")?;
                }
                Ok(())
            }
        }
    }
}

/// Appends one command, as a RESP array of bulk strings, to `out`.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// An incremental reply decoder.
///
/// Arrays that are only partly in the buffer are kept here between calls, so every byte
/// is parsed once however the reply is split across reads.
#[derive(Debug, Default)]
pub struct Decoder {
    open_arrays: Vec<(Vec<Value>, usize)>,
}

enum Item {
    Done(Value),
    ArrayOf(usize),
}

impl Decoder {
    /// Decodes the next complete reply from `buf[*pos..]`, moving `pos` past every byte
    /// it consumed. `Ok(None)` means more bytes are needed; call again with the same
    /// buffer extended.
    pub fn decode(&mut self, buf: &[u8], pos: &mut usize) -> io::Result<Option<Value>> {
        loop {
            let Some((item, used)) = parse_item(&buf[*pos..])? else {
                return Ok(None);
            };
            *pos += used;
            let mut value = match item {
                Item::ArrayOf(len) => {
                    // The length comes off the wire: cap the up-front allocation.
                    self.open_arrays
                        .push((Vec::with_capacity(len.min(1024)), len));
                    continue;
                }
                Item::Done(value) => value,
            };
            loop {
                let Some((items, len)) = self.open_arrays.last_mut() else {
                    return Ok(Some(value));
                };
                items.push(value);
                if items.len() < *len {
                    break;
                }
                let (items, _) = self.open_arrays.pop().expect("checked above");
                value = Value::Array(items);
            }
        }
    }
}

fn protocol_error(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("RESP protocol error: {what}"),
    )
}

/// Parses one line-framed item, returning it and how many bytes it took.
fn parse_item(buf: &[u8]) -> io::Result<Option<(Item, usize)>> {
    let Some(line_len) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    if line_len == 0 {
        return Err(protocol_error("empty line"));
    }
    let line = &buf[1..line_len];
    let after_line = line_len + 2;
    let text = || String::from_utf8_lossy(line).into_owned();
    let number = || -> io::Result<i64> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol_error("bad length or integer"))
    };
    let item = match buf[0] {
        b'+' => Item::Done(Value::Simple(text())),
        b'-' => Item::Done(Value::Error(text())),
        b':' => Item::Done(Value::Int(number()?)),
        b'$' => {
            let len = number()?;
            if len < 0 {
                Item::Done(Value::Nil)
            } else {
                let len = len as usize;
                let end = after_line + len;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                if &buf[end..end + 2] != b"\r\n" {
                    return Err(protocol_error("bulk string not followed by CRLF"));
                }
                return Ok(Some((
                    Item::Done(Value::Bulk(buf[after_line..end].to_vec())),
                    end + 2,
                )));
            }
        }
        b'*' => match number()? {
            n if n < 0 => Item::Done(Value::Nil),
            0 => Item::Done(Value::Array(Vec::new())),
            n => Item::ArrayOf(n as usize),
        },
        other => {
            return Err(protocol_error(&format!(
                "unexpected type byte {:?}",
                other as char
            )))
        }
    };
    Ok(Some((item, after_line)))
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// One connection to Redis, TCP (`host:port`) or Unix socket (`unix:/path` or `/path`).
pub struct Conn {
    stream: Box<dyn Io>,
    buf: Vec<u8>,
    pos: usize,
    decoder: Decoder,
}

impl Conn {
    /// Connects to `target`, giving up after `timeout`.
    pub async fn connect(target: &str, timeout: Duration) -> io::Result<Conn> {
        let connecting = async {
            let stream: Box<dyn Io> = match unix_path(target) {
                Some(path) => Box::new(UnixStream::connect(path).await?),
                None => {
                    let tcp = TcpStream::connect(target).await?;
                    tcp.set_nodelay(true)?;
                    Box::new(tcp)
                }
            };
            Ok::<_, io::Error>(stream)
        };
        let stream = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        Ok(Conn {
            stream,
            buf: Vec::new(),
            pos: 0,
            decoder: Decoder::default(),
        })
    }

    /// Sends bytes produced by [`encode_command`], possibly several commands at once.
    pub async fn send(&mut self, encoded: &[u8]) -> io::Result<()> {
        self.stream.write_all(encoded).await?;
        self.stream.flush().await
    }

    /// Reads the next reply. An error means the connection is unusable.
    pub async fn read_reply(&mut self) -> io::Result<Value> {
        loop {
            if let Some(value) = self.decoder.decode(&self.buf, &mut self.pos)? {
                return Ok(value);
            }
            if self.pos > 0 {
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            // Without reserving, Vec's BufMut grows 64 bytes at a time.
            self.buf.reserve(16 * 1024);
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "redis closed the connection",
                ));
            }
        }
    }

    /// Whether the connection can carry another request: nothing left unread and the
    /// peer has not hung up. Idle connections see EOF once Redis stops or restarts, and
    /// catching that here keeps the first request after a restart from failing.
    pub async fn is_reusable(&mut self) -> bool {
        if self.pos != self.buf.len() {
            return false;
        }
        let mut probe = [0u8; 1];
        let stream = &mut self.stream;
        std::future::poll_fn(|cx| {
            let mut read_buf = ReadBuf::new(&mut probe);
            Poll::Ready(matches!(
                Pin::new(&mut *stream).poll_read(cx, &mut read_buf),
                Poll::Pending
            ))
        })
        .await
    }
}

fn unix_path(target: &str) -> Option<&str> {
    target
        .strip_prefix("unix:")
        .or_else(|| target.starts_with('/').then_some(target))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8]) -> Vec<Value> {
        let mut decoder = Decoder::default();
        let mut pos = 0;
        let mut out = Vec::new();
        while let Some(v) = decoder.decode(bytes, &mut pos).unwrap() {
            out.push(v);
        }
        assert_eq!(pos, bytes.len(), "trailing bytes left");
        out
    }

    #[test]
    fn encodes_binary_args() {
        let mut out = Vec::new();
        encode_command(&[&b"SET"[..], b"k", b"a\r\nb\x00"], &mut out);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\na\r\nb\x00\r\n");
    }

    #[test]
    fn decodes_every_type() {
        let wire = b"+OK\r\n-ERR bad thing\r\n:-42\r\n$-1\r\n*-1\r\n$3\r\na\r\n\r\n*0\r\n\
                     *2\r\n*1\r\n:1\r\n$0\r\n\r\n";
        assert_eq!(
            decode_all(wire),
            vec![
                Value::Simple("OK".into()),
                Value::Error("ERR bad thing".into()),
                Value::Int(-42),
                Value::Nil,
                Value::Nil,
                Value::Bulk(b"a\r\n".to_vec()),
                Value::Array(vec![]),
                Value::Array(vec![Value::Array(vec![Value::Int(1)]), Value::Bulk(vec![])]),
            ]
        );
    }

    #[test]
    fn resumes_at_every_split_point() {
        let wire = b"*3\r\n$5\r\nhello\r\n*2\r\n:7\r\n-E x\r\n+PONG\r\n:9\r\n";
        let whole = decode_all(wire);
        for split in 0..wire.len() {
            let mut decoder = Decoder::default();
            let mut pos = 0;
            let mut got = Vec::new();
            while let Some(v) = decoder.decode(&wire[..split], &mut pos).unwrap() {
                got.push(v);
            }
            while let Some(v) = decoder.decode(wire, &mut pos).unwrap() {
                got.push(v);
            }
            assert_eq!(got, whole, "split at {split}");
        }
    }

    #[test]
    fn rejects_garbage() {
        let mut pos = 0;
        assert!(Decoder::default().decode(b"?x\r\n", &mut pos).is_err());
        assert!(Decoder::default().decode(b"$1\r\nab\r\n", &mut 0).is_err());
    }
}
