//! `edge-limiter stats --serve`: the live page in headless Chromium
//! (Debian's package, installed by scripts/install), driven through the
//! DevTools protocol by `support/cdp.mjs`. It loads, shows the figures of
//! known traffic through the worker (its rules failing open and a block in
//! force too), and shows new traffic once it is written, without a reload;
//! it never carries the REST token, and it is read only.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::{
    io::{BufRead, BufReader, Write},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use edge_limiter_local::{
    fault_proxy::Fault,
    testenv::{free_port, ProcessGroup},
};
use serde_json::{json, Value};
use support::{worker::Stack, TOKEN};

const RULES: &str = r#"
[vars.LIMITER]
stats = true
stats_every = "1s"

[[vars.LIMITER.rules]]
name = "limited"
key = ["header:x-client"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 4
fail = "open"
overrides = true
"#;

/// Headless Chromium, and the DevTools client that drives its page.
struct Browser {
    chromium: Child,
    cdp: Child,
    commands: ChildStdin,
    answers: BufReader<ChildStdout>,
}

impl Browser {
    fn start(profile: &std::path::Path) -> Browser {
        let port = free_port();
        let chromium_bin = std::env::var_os("CHROMIUM_BIN").unwrap_or_else(|| "chromium".into());
        let chromium = Command::new(&chromium_bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1200,1600",
            ])
            .arg(format!("--remote-debugging-port={port}"))
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {chromium_bin:?} ({e}): scripts/install installs Debian's chromium"
                )
            });
        // A few seconds when idle; generous for a loaded machine.
        let deadline = Instant::now() + Duration::from_secs(120);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromium did not listen within 120 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/cdp.mjs");
        let mut cdp = Command::new("node")
            .arg(script)
            .arg(port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("node runs");
        let commands = cdp.stdin.take().unwrap();
        let answers = BufReader::new(cdp.stdout.take().unwrap());
        Browser {
            chromium,
            cdp,
            commands,
            answers,
        }
    }

    /// Sends one command and reads its answer.
    fn ask(&mut self, command: Value) -> Value {
        writeln!(self.commands, "{command}").unwrap();
        let mut line = String::new();
        self.answers.read_line(&mut line).unwrap();
        let answer: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("{line:?}"));
        assert!(answer.get("error").is_none(), "{command}: {answer}");
        answer["ok"].clone()
    }

    fn eval(&mut self, expression: &str) -> Value {
        self.ask(json!({ "eval": expression }))
    }

    /// The page's figures as text, once `ready` holds of them (within 60 s).
    fn figures_once(&mut self, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = self.eval("document.getElementById('live').innerText");
            let text = text.as_str().unwrap_or_default().to_owned();
            if ready(&text) {
                return text;
            }
            assert!(Instant::now() < deadline, "the page shows:\n{text}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.cdp.kill();
        let _ = self.chromium.kill();
        let _ = self.cdp.wait();
        let _ = self.chromium.wait();
    }
}

/// Sends `n` requests of `client`; their statuses.
async fn send(stack: &Stack, client: &str, n: usize) -> Vec<u16> {
    let http = support::http();
    let mut statuses = Vec::new();
    for _ in 0..n {
        let url = format!("{}/x", stack.worker.url);
        let r = http
            .get(url)
            .header("x-client", client)
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    statuses
}

/// A raw request to the page's server: its status line and whole answer.
fn raw(addr: &str, request: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut stream, &mut answer).unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_page_shows_known_traffic_then_new_traffic_without_a_reload() {
    let stack = Stack::builder(RULES).through_fault_proxy().start();
    let proxy = stack.proxy.as_ref().expect("asked for");
    assert_eq!(send(&stack, "c1", 6).await, [200, 200, 200, 200, 429, 429]);
    proxy.set(Fault::Status {
        status: 503,
        body: "down".into(),
    });
    assert_eq!(send(&stack, "c3", 2).await, [200, 200]);
    proxy.set(Fault::Pass);
    let mut sent = 8;
    stack.stats_once_written(sent).await;
    let blocked = stack
        .edge_limiter(&["limit", "set", "limited", "leaked-7", "--block"])
        .output()
        .unwrap();
    assert!(blocked.status.success(), "{blocked:?}");

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // Stopped however the test ends, so that it holds no pipe of cargo's;
    // its calls go through the proxy too, which notes them.
    let mut serve = stack.edge_limiter(&["stats", "--serve", &addr]);
    serve.env("UPSTASH_REDIS_REST_URL", proxy.url());
    let mut server = ProcessGroup::spawn(serve.stdout(Stdio::piped())).unwrap();
    let mut said = String::new();
    BufReader::new(server.child.stdout.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert_eq!(
        said.trim(),
        format!("edge-limiter stats: serving http://{addr}/ (read only; Ctrl-C stops)")
    );

    let profile = stack.worker.dir.join("chromium-profile");
    let mut browser = Browser::start(&profile);
    browser.ask(json!({ "navigate": format!("http://{addr}/") }));
    let first = browser.figures_once(|t| t.contains("Clients most denied"));
    for shown in [
        // The summary, the failing rule, the most denied client and where
        // from, the block.
        &format!("{sent} requests, admitted"),
        "limited: Redis could not decide; 2 requests forwarded undecided (fail open)",
        "c1\tlimited\t2",
        "limited\tcountry US\t2",
        "limited\tnetwork AS395747\t2",
        "el:{leaked-7}:limited:o: blocked, until cleared",
    ] {
        assert!(
            first.contains(shown),
            "{shown:?} is not on the page:\n{first}"
        );
    }
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("stats-live.png");
    browser.ask(json!({ "screenshot": shot.to_str().unwrap() }));
    // At a laptop's width and a phone's, the plot is drawn at the page's
    // own (examples/stats-live-*.png are these screenshots).
    for (name, width, height) in [("laptop", 1366, 900), ("phone", 390, 844)] {
        browser.ask(json!({ "viewport": [width, height] }));
        let drawn = |b: &mut Browser| {
            let w = b.eval("Number(document.querySelector('#live svg').getAttribute('width'))");
            let page = b.eval("document.getElementById('live').clientWidth");
            (w.as_u64(), page.as_u64())
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (svg, page) = drawn(&mut browser);
            if svg.is_some() && svg == page.map(|p| p.max(360)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: svg {svg:?}, page {page:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("stats-live-{name}.png"));
        browser.ask(json!({ "screenshot": shot.to_str().unwrap() }));
    }
    browser.ask(json!({ "viewport": [1200, 1600] }));
    browser.eval("window.sameLoad = 'yes'");

    // New traffic, written by the worker: the page shows it by itself.
    assert_eq!(send(&stack, "c9", 6).await, [200, 200, 200, 200, 429, 429]);
    sent += 6;
    stack.stats_once_written(sent).await;
    let then = browser.figures_once(|t| t.contains("c9\tlimited\t2"));
    assert!(
        then.contains(&format!("{sent} requests, admitted")),
        "{then}"
    );
    assert_eq!(
        browser.eval("window.sameLoad"),
        json!("yes"),
        "the page was reloaded"
    );

    // The token never reaches the browser, nor the REST URL.
    let html = browser.eval("document.documentElement.outerHTML");
    let html = html.as_str().unwrap();
    assert!(!html.contains(TOKEN), "the page holds the token");
    for path in ["/", "/redraw.js", "/live", "/metrics"] {
        let answer = raw(
            &addr,
            &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n"),
        );
        assert!(
            answer.starts_with("HTTP/1.1 200 OK"),
            "{path}: {answer:.200}"
        );
        assert!(!answer.contains(TOKEN), "{path} carries the token");
        assert!(
            !answer.contains(&stack.backend.endpoint.url()),
            "{path} names the REST URL"
        );
    }
    // Read only, and only at its own address.
    let post = raw(
        &addr,
        &format!("POST /live HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n"),
    );
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    let rebound = raw(
        &addr,
        &format!("GET /live HTTP/1.1\r\nHost: evil.example:{port}\r\n\r\n"),
    );
    assert!(rebound.starts_with("HTTP/1.1 421"), "{rebound}");

    // Reads sized to what is shown: the page's minutes by HMGET, one for
    // the request-wide figures and one per rule, and one of the counters
    // for when the isolates last wrote; no HGETALL of a day and no SCAN;
    // and one read serves every page for 5 s.
    drop(browser);
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    let before = proxy.exchanges().len();
    let live = format!("GET /live HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    assert!(raw(&addr, &live).starts_with("HTTP/1.1 200 OK"));
    let read = proxy.exchanges().len();
    assert!(raw(&addr, &live).starts_with("HTTP/1.1 200 OK"));
    assert_eq!(proxy.exchanges().len(), read, "the second page read anew");
    // The names of the commands the proxy carried from exchange `from` on.
    let commands = |from: usize| -> Vec<String> {
        support::carried(&proxy.exchanges()[from..])
            .iter()
            .filter_map(|s| s.command.get(0)?.as_str().map(str::to_ascii_uppercase))
            .collect()
    };
    let names = commands(before);
    let hmget = names.iter().filter(|n| *n == "HMGET").count();
    // Twice as many when the hour shown began the day before.
    let since_midnight = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 86_400;
    let days = if since_midnight < 3_600 {
        [1, 2]
    } else {
        [1, 1]
    };
    assert!(days.iter().any(|d| hmget == 2 * d + 1), "{names:?}");
    assert!(
        !names.iter().any(|n| n == "HGETALL" || n == "SCAN"),
        "{names:?}"
    );
    // A scrape: the counters with Redis's clock, which the age and the
    // places' minutes are read by, and the rule's places over 5 minutes
    // (which may touch the day before).
    let before = proxy.exchanges().len();
    let metrics = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    assert!(raw(&addr, &metrics).starts_with("HTTP/1.1 200 OK"));
    let names = commands(before);
    let places_days = if since_midnight < 300 { 2 } else { 1 };
    let mut scrape = vec!["HMGET", "TIME"];
    scrape.extend(vec!["HMGET"; places_days]);
    assert_eq!(names, scrape, "a scrape");
}
