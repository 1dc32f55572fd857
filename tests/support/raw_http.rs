//! HTTP/1.1 requests written byte for byte, for what a well-behaved client
//! would never send: paths it would normalize, header bytes that are not
//! UTF-8.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

/// A response as read off the wire.
#[derive(Debug, Clone)]
pub struct RawReply {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body as sent (possibly chunked).
    pub body: Vec<u8>,
}

impl RawReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Everything received, lossily as text, for scans.
    pub fn dump(&self) -> String {
        let headers: String = self
            .headers
            .iter()
            .map(|(n, v)| format!("{n}: {v}\n"))
            .collect();
        format!(
            "{}\n{headers}\n{}",
            self.status,
            String::from_utf8_lossy(&self.body)
        )
    }
}

/// Sends `GET <target>` to `base` (`http://127.0.0.1:PORT`) with these
/// headers, raw, and reads the whole response.
pub fn get(base: &str, target: &[u8], headers: &[(&str, &[u8])]) -> RawReply {
    let addr = base.trim_start_matches("http://");
    let mut wire = b"GET ".to_vec();
    wire.extend_from_slice(target);
    wire.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    wire.extend_from_slice(addr.as_bytes());
    wire.extend_from_slice(b"\r\nconnection: close\r\n");
    for (name, value) in headers {
        wire.extend_from_slice(name.as_bytes());
        wire.extend_from_slice(b": ");
        wire.extend_from_slice(value);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"\r\n");
    let mut stream = TcpStream::connect(addr).expect("the worker listens");
    // Long enough for a starved 2-core machine (a 64 KB URL alone takes
    // workerd a second), short enough to call a hang a hang.
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(&wire).expect("request sent");
    let head = String::from_utf8_lossy(&wire[..wire.len().min(120)]).into_owned();
    read_reply(&mut stream, &head)
}

/// Reads one response, framed by its length or chunking: a server may keep
/// the connection open after it, whatever the request asked.
fn read_reply(stream: &mut TcpStream, request: &str) -> RawReply {
    let mut raw = Vec::new();
    let more = |stream: &mut TcpStream, raw: &mut Vec<u8>| {
        let mut chunk = [0u8; 16 * 1024];
        let n = stream.read(&mut chunk).unwrap_or_else(|e| {
            let got = String::from_utf8_lossy(raw);
            panic!("no complete response within 60 s ({e}) to {request:?}; got {got:?}")
        });
        raw.extend_from_slice(&chunk[..n]);
        n
    };
    let end = loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        assert!(
            more(stream, &mut raw) > 0,
            "no response head: {:?}",
            String::from_utf8_lossy(&raw)
        );
    };
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut reply = RawReply {
        status,
        headers,
        body: Vec::new(),
    };
    let body_start = end + 4;
    let length = reply
        .header("content-length")
        .and_then(|l| l.parse::<usize>().ok());
    let chunked = reply
        .header("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"));
    if let Some(length) = length {
        while raw.len() < body_start + length && more(stream, &mut raw) > 0 {}
    } else if chunked {
        // The body (kept raw) ends with the empty last chunk.
        while !raw[body_start..].ends_with(b"0\r\n\r\n") && more(stream, &mut raw) > 0 {}
    } else {
        while more(stream, &mut raw) > 0 {}
    }
    reply.body = raw[body_start..].to_vec();
    reply
}
