//! A fault-injecting HTTP/1.1 proxy to put between a REST client and the endpoint, for
//! tests that must prove the client survives a misbehaving network or server.
//!
//! The proxy runs on its own thread and runtime, so it keeps serving while a test blocks
//! on something else. Its [`Fault`] can be switched at any time through the
//! [`FaultProxy`] handle and applies from the next request on; every request it sees is
//! logged as an [`Exchange`], with what upstream answered, so a test can tell exactly
//! which calls reached Redis even when the client never heard back.
//!
//! ```no_run
//! use edge_limiter_local::fault_proxy::{Fault, FaultProxy};
//! # let endpoint: std::net::SocketAddr = "127.0.0.1:8079".parse().unwrap();
//! let proxy = FaultProxy::start(endpoint).unwrap();
//! proxy.set(Fault::Status { status: 502, body: "<h1>Bad Gateway</h1>".into() });
//! // ... point the client at proxy.url() ...
//! proxy.set(Fault::Pass);
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// What the proxy does with each request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Forward the request and relay upstream's status, headers and body.
    Pass,
    /// Hold the request this long, then forward it as [`Fault::Pass`] would, even if the
    /// client gave up meanwhile: a slow server still does the work.
    Delay(Duration),
    /// Forward the request at once, then hold upstream's reply this long before relaying
    /// it: the call took effect upstream long before its caller hears of it.
    DelayReply(Duration),
    /// Answer with this status and body (`text/html`), never forwarding.
    Status {
        /// The HTTP status.
        status: u16,
        /// The body, sent as is.
        body: String,
    },
    /// Answer `200` with this body (`application/json`, whatever it holds), never
    /// forwarding: for replies that are not JSON, cut short, or of the wrong shape.
    Reply(String),
    /// Read the request, then reset the connection (TCP RST) without forwarding.
    Reset,
    /// Forward the request, then reset the connection instead of relaying the reply:
    /// the call took effect upstream but its answer is lost.
    LoseReply,
    /// Forward the request with `Authorization: Bearer <token>` instead of the client's.
    Token(String),
    /// Answer with this status and `{"error": "<the request head as received>"}`, as a
    /// careless server that reflects what it was sent (headers included) would.
    Echo(u16),
}

/// One request the proxy saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    /// The fault in force when the request arrived.
    pub fault: Fault,
    /// The request body.
    pub request: Vec<u8>,
    /// Upstream's status and body, when the request was forwarded and answered (whether
    /// or not the client then received it).
    pub upstream: Option<(u16, Vec<u8>)>,
}

struct Shared {
    fault: Mutex<Fault>,
    log: Mutex<Vec<Exchange>>,
    in_flight: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking connection task must not take the test's view of the log with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running proxy on a free loopback port; stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy in front of `upstream` (an HTTP/1.1 server), passing requests
    /// through until told otherwise.
    pub fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        FaultProxy::start_at(SocketAddr::from(([127, 0, 0, 1], 0)), upstream)
    }

    /// The same, listening on `listen` (port 0: a free one).
    pub fn start_at(listen: SocketAddr, upstream: SocketAddr) -> io::Result<FaultProxy> {
        // Bound here, outside any runtime, so that a test may start the proxy from
        // synchronous code and from async code alike.
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared {
            fault: Mutex::new(Fault::Pass),
            log: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let serving = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        () = accept_loop(listener, upstream, serving) => {}
                        _ = stopped => {}
                    }
                });
            })?;
        Ok(FaultProxy {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Applies `fault` to every request that arrives from now on.
    pub fn set(&self, fault: Fault) {
        *lock(&self.shared.fault) = fault;
    }

    /// Forgets the requests seen so far: a proxy that runs for long keeps
    /// no log growing.
    pub fn forget(&self) {
        lock(&self.shared.log).clear();
    }

    /// Every request seen so far, oldest first.
    pub fn exchanges(&self) -> Vec<Exchange> {
        lock(&self.shared.log).clone()
    }

    /// Waits until no request is being held, forwarded or answered; `false` if some
    /// still are after `timeout`.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.shared.in_flight.load(Ordering::SeqCst) > 0 {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors, most likely: let some close.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let _ = client.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            // A client that hangs up mid-request is part of the game, not an error.
            let _ = serve_client(client, upstream, shared).await;
        });
    }
}

/// Counts a request as in flight for as long as it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn new(counter: &'a AtomicUsize) -> InFlight<'a> {
        counter.fetch_add(1, Ordering::SeqCst);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the client gets back.
enum Answer {
    /// Upstream's reply.
    Relay,
    /// This reply instead.
    Send(Message),
    /// Nothing: the connection is reset.
    Reset,
}

async fn serve_client(
    mut client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
) -> io::Result<()> {
    let mut buf = Vec::new();
    loop {
        let Some(request) = read_message(&mut client, &mut buf, false).await? else {
            return Ok(());
        };
        let _in_flight = InFlight::new(&shared.in_flight);
        let fault = lock(&shared.fault).clone();
        let mut exchange = Exchange {
            fault: fault.clone(),
            request: request.body.clone(),
            upstream: None,
        };
        let (forwarded, answer) = match &fault {
            Fault::Pass => (Some(forward(upstream, &request, None).await), Answer::Relay),
            Fault::Delay(hold) => {
                tokio::time::sleep(*hold).await;
                (Some(forward(upstream, &request, None).await), Answer::Relay)
            }
            Fault::DelayReply(hold) => {
                let forwarded = forward(upstream, &request, None).await;
                tokio::time::sleep(*hold).await;
                (Some(forwarded), Answer::Relay)
            }
            Fault::Token(token) => (
                Some(forward(upstream, &request, Some(token)).await),
                Answer::Relay,
            ),
            Fault::LoseReply => (Some(forward(upstream, &request, None).await), Answer::Reset),
            Fault::Reset => (None, Answer::Reset),
            Fault::Status { status, body } => (
                None,
                Answer::Send(Message::synthetic(*status, "text/html", body.as_bytes())),
            ),
            Fault::Reply(body) => (
                None,
                Answer::Send(Message::synthetic(200, "application/json", body.as_bytes())),
            ),
            Fault::Echo(status) => {
                let head = String::from_utf8_lossy(&request.head).into_owned();
                let body = serde_json::json!({ "error": head }).to_string();
                (
                    None,
                    Answer::Send(Message::synthetic(
                        *status,
                        "application/json",
                        body.as_bytes(),
                    )),
                )
            }
        };
        if let Some(Ok(reply)) = &forwarded {
            exchange.upstream = Some((reply.status(), reply.body.clone()));
        }
        let reply = match (answer, forwarded) {
            (Answer::Reset, _) => None,
            (Answer::Send(reply), _) | (Answer::Relay, Some(Ok(reply))) => Some(reply),
            (Answer::Relay, failed) => {
                let why = failed.and_then(Result::err).map(|e| e.to_string());
                Some(Message::synthetic(
                    502,
                    "text/plain",
                    format!("fault-proxy: upstream failed: {}", why.unwrap_or_default()).as_bytes(),
                ))
            }
        };
        lock(&shared.log).push(exchange);
        let Some(reply) = reply else {
            // A zero linger turns the close into a reset, as a crashed peer would send.
            let _ = client.set_zero_linger();
            return Ok(());
        };
        let keep_alive = request.keep_alive();
        client.write_all(&reply.encode_response(keep_alive)).await?;
        if !keep_alive {
            return Ok(());
        }
    }
}

/// Sends `request` upstream on a fresh connection and reads the whole reply.
async fn forward(
    upstream: SocketAddr,
    request: &Message,
    token: Option<&str>,
) -> io::Result<Message> {
    let mut conn = TcpStream::connect(upstream).await?;
    let _ = conn.set_nodelay(true);
    let mut wire = Vec::with_capacity(request.head.len() + request.body.len() + 64);
    wire.extend_from_slice(request.start.as_bytes());
    wire.extend_from_slice(b"\r\n");
    for (name, value) in &request.headers {
        if hop_by_hop(name) || (token.is_some() && name == "authorization") {
            continue;
        }
        push_header(&mut wire, name, value);
    }
    if let Some(token) = token {
        push_header(&mut wire, "authorization", &format!("Bearer {token}"));
    }
    push_header(&mut wire, "content-length", &request.body.len().to_string());
    // One request per upstream connection: the reply then ends where the stream does.
    push_header(&mut wire, "connection", "close");
    wire.extend_from_slice(b"\r\n");
    wire.extend_from_slice(&request.body);
    conn.write_all(&wire).await?;
    let mut buf = Vec::new();
    read_message(&mut conn, &mut buf, true)
        .await?
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "upstream sent nothing"))
}

fn hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "proxy-connection" | "content-length" | "transfer-encoding"
    )
}

fn push_header(wire: &mut Vec<u8>, name: &str, value: &str) {
    wire.extend_from_slice(name.as_bytes());
    wire.extend_from_slice(b": ");
    wire.extend_from_slice(value.as_bytes());
    wire.extend_from_slice(b"\r\n");
}

/// One HTTP/1.x request or response, read whole.
struct Message {
    /// The start and header lines as received, without the blank line.
    head: Vec<u8>,
    /// The request or status line.
    start: String,
    /// Header names lower-cased, in arrival order.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// Larger heads are refused: the clients under test send small ones.
const MAX_HEAD: usize = 64 * 1024;

impl Message {
    fn synthetic(status: u16, content_type: &str, body: &[u8]) -> Message {
        Message {
            head: Vec::new(),
            start: format!("HTTP/1.1 {status} {}", reason(status)),
            headers: vec![("content-type".into(), content_type.into())],
            body: body.to_vec(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn status(&self) -> u16 {
        self.start
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    fn keep_alive(&self) -> bool {
        let connection = self.header("connection").unwrap_or("").to_ascii_lowercase();
        if self.start.ends_with("HTTP/1.0") {
            connection.contains("keep-alive")
        } else {
            !connection.contains("close")
        }
    }

    fn encode_response(&self, keep_alive: bool) -> Vec<u8> {
        let mut wire = Vec::with_capacity(self.body.len() + 256);
        wire.extend_from_slice(self.start.as_bytes());
        wire.extend_from_slice(b"\r\n");
        for (name, value) in self.headers.iter().filter(|(n, _)| !hop_by_hop(n)) {
            push_header(&mut wire, name, value);
        }
        push_header(&mut wire, "content-length", &self.body.len().to_string());
        let connection = if keep_alive { "keep-alive" } else { "close" };
        push_header(&mut wire, "connection", connection);
        wire.extend_from_slice(b"\r\n");
        wire.extend_from_slice(&self.body);
        wire
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Fault",
    }
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_owned())
}

/// Appends what the stream has to `buf`; `Ok(0)` at its end.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut chunk = [0u8; 16 * 1024];
    let n = stream.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// Makes `buf` hold at least `len` bytes.
async fn fill_to(stream: &mut TcpStream, buf: &mut Vec<u8>, len: usize) -> io::Result<()> {
    while buf.len() < len {
        if fill(stream, buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// Reads one message, leaving anything after it in `buf`. `Ok(None)` when the stream
/// ends cleanly before a message starts. Without a length or chunking, a response's body
/// runs to the end of the stream (`body_to_eof`) and a request has none.
async fn read_message(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    body_to_eof: bool,
) -> io::Result<Option<Message>> {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(invalid("message head too large"));
        }
        if fill(stream, buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
    };
    let head: Vec<u8> = buf.drain(..head_end + 4).take(head_end).collect();
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let start = lines.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut message = Message {
        head,
        start,
        headers,
        body: Vec::new(),
    };
    let chunked = message
        .header("transfer-encoding")
        .is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
    if chunked {
        message.body = read_chunked(stream, buf).await?;
    } else if let Some(length) = message.header("content-length") {
        let length: usize = length.parse().map_err(|_| invalid("bad content-length"))?;
        fill_to(stream, buf, length).await?;
        message.body = buf.drain(..length).collect();
    } else if body_to_eof {
        while fill(stream, buf).await? > 0 {}
        message.body = std::mem::take(buf);
    }
    Ok(Some(message))
}

/// Decodes a chunked body, trailers dropped.
async fn read_chunked(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(stream, buf).await?;
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| invalid("bad chunk size"))?;
        if size == 0 {
            while !read_line(stream, buf).await?.is_empty() {}
            return Ok(body);
        }
        fill_to(stream, buf, size + 2).await?;
        body.extend(buf.drain(..size));
        buf.drain(..2);
    }
}

async fn read_line(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<String> {
    loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            let line: Vec<u8> = buf.drain(..i + 2).take(i).collect();
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        if buf.len() > MAX_HEAD {
            return Err(invalid("line too long"));
        }
        if fill(stream, buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}
