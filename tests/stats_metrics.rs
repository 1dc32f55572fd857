//! `/metrics` on `stats --serve`, scraped by a real Prometheus (Debian's
//! package, installed by scripts/install) with the scrape configuration
//! and alert rules docs/stats.md gives: after known traffic through the
//! worker, every counter Prometheus holds equals the figure `stats --json`
//! reports, and `increase()` over the span gives it too; `stats --format
//! openmetrics` prints the same counters.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use edge_limiter_local::testenv::{free_port, ProcessGroup};
use serde_json::Value;
use support::worker::Stack;

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

[[vars.LIMITER.rules]]
name = "watched"
path_prefix = "/w"
key = ["header:x-client"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 1
mode = "shadow"
"#;

/// Sends `n` requests of `client` to `path`; their statuses.
async fn send(stack: &Stack, path: &str, client: &str, n: usize) -> Vec<u16> {
    let http = support::http();
    let mut statuses = Vec::new();
    for _ in 0..n {
        let r = (http.get(format!("{}{path}", stack.worker.url)))
            .header("x-client", client)
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    statuses
}

/// The YAML block after `heading` in docs/stats.md.
fn documented_yaml(heading: &str) -> String {
    support::documented("docs/stats.md", heading, ("yaml", 1))
}

/// Whether `promtool check WHAT` takes `text` as its file.
fn promtool_takes(dir: &std::path::Path, what: &str, text: &str) {
    let file = dir.join(format!("check-{what}.yml"));
    std::fs::write(&file, text).unwrap();
    let checked = Command::new("promtool")
        .args(["check", what])
        .arg(&file)
        .output()
        .expect("promtool runs: scripts/install installs Debian's prometheus");
    assert!(checked.status.success(), "{text}\n{checked:?}");
}

/// A Prometheus of its own, scraping every second; stopped when dropped.
struct Prometheus {
    _process: ProcessGroup,
    url: String,
}

impl Prometheus {
    fn start(dir: &std::path::Path, scraped: &str) -> Prometheus {
        let scrape = documented_yaml("### Scraping")
            .replace("127.0.0.1:8790", scraped)
            .replace("scrape_interval: 15s", "scrape_interval: 1s");
        let rules = dir.join("edge-limiter-rules.yml");
        std::fs::write(&rules, documented_yaml("### Alerting")).unwrap();
        let config = dir.join("prometheus.yml");
        let global = format!(
            "global:\n  evaluation_interval: 1s\nrule_files:\n  - {}\n",
            rules.display()
        );
        std::fs::write(&config, format!("{global}{scrape}")).unwrap();
        promtool_takes(dir, "config", &format!("{global}{scrape}"));
        let port = free_port();
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let process = ProcessGroup::spawn(&mut command)
            .expect("prometheus runs: scripts/install installs Debian's prometheus");
        Prometheus {
            _process: process,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// The value of an instant query's only sample, if it has one.
    async fn value(&self, query: &str) -> Option<f64> {
        let mut url = reqwest::Url::parse(&format!("{}/api/v1/query", self.url)).unwrap();
        url.query_pairs_mut().append_pair("query", query);
        let answer: Value = (support::http().get(url))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let result = answer["data"]["result"].as_array()?;
        assert!(result.len() <= 1, "{query}: {answer}");
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Waits until `query` gives `want`.
    async fn until(&self, query: &str, want: f64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = self.value(query).await;
            if got == Some(want) {
                return;
            }
            assert!(Instant::now() < deadline, "{query}: {got:?}, not {want}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_counts_what_stats_reports() {
    let stack = Stack::builder(RULES).start();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // Stopped however the test ends, so that it holds no pipe of cargo's.
    let mut serve = stack.edge_limiter(&["stats", "--serve", &addr]);
    let mut server = ProcessGroup::spawn(serve.stdout(Stdio::piped())).unwrap();
    let mut said = String::new();
    BufReader::new(server.child.stdout.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    let dir = stack.worker.dir.join("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    let prometheus = Prometheus::start(&dir, &addr);
    // Scraped before any traffic: every counter starts at 0.
    prometheus.until("edge_limiter_requests_total", 0.0).await;
    let started = Instant::now();

    assert_eq!(
        send(&stack, "/", "c1", 6).await,
        [200, 200, 200, 200, 429, 429]
    );
    assert_eq!(send(&stack, "/w", "c2", 3).await, [200, 200, 200]);
    let sent = 9;
    let report = stack.stats_once_written(sent).await;
    prometheus
        .until("edge_limiter_requests_total", sent as f64)
        .await;
    // Enough samples that increase()'s extrapolation to the range's end
    // moves no figure by half a request.
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(started.elapsed())).await;

    let totals = ["requests", "admitted", "denied", "refused", "unmatched"];
    for name in totals {
        let want = report[name].as_f64().unwrap();
        let counter = format!("edge_limiter_{name}_total");
        assert_eq!(prometheus.value(&counter).await, Some(want), "{counter}");
        let over = format!("round(increase({counter}[10m]))");
        assert_eq!(prometheus.value(&over).await, Some(want), "{over}");
    }
    for rule in ["limited", "watched"] {
        let figures = report["rules"][rule].as_object().unwrap();
        for (name, want) in figures.iter().filter(|(_, v)| v.is_u64()) {
            let counter = format!("edge_limiter_rule_{name}_total{{rule=\"{rule}\"}}");
            let want = want.as_f64();
            assert_eq!(prometheus.value(&counter).await, want, "{counter}");
            let over = format!("round(increase({counter}[10m]))");
            assert_eq!(prometheus.value(&over).await, want, "{over}");
        }
    }
    assert_eq!(report["rules"]["limited"]["denied"], 2);
    assert_eq!(report["rules"]["watched"]["shadow_would_deny"], 2);
    let age = prometheus.value("edge_limiter_stats_age_seconds").await;
    assert!(age.is_some_and(|a| (0.0..60.0).contains(&a)), "{age:?}");
    // Where the denials came from, as `stats --json` has it: wrangler
    // dev's stand-in for `request.cf` places every request alike.
    let from = &report["rules"]["limited"]["denied_from"];
    assert_eq!(from["countries"]["top"][0]["country"], "US", "{from}");
    assert_eq!(from["networks"]["top"][0]["asn"], "395747", "{from}");
    for (what, key, place) in [("country", "country", "US"), ("network", "asn", "395747")] {
        let gauge =
            format!("edge_limiter_rule_denied_by_{what}{{rule=\"limited\",{key}=\"{place}\"}}");
        assert_eq!(prometheus.value(&gauge).await, Some(2.0), "{gauge}");
    }

    // The documented alerts load and evaluate without error.
    let rules: Value = (support::http().get(format!("{}/api/v1/rules", prometheus.url)))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let loaded = rules["data"]["groups"][0]["rules"].as_array().unwrap();
    assert!(loaded.len() >= 2, "{rules}");
    for rule in loaded {
        assert_eq!(rule["health"], "ok", "{rule}");
    }

    // The README's configuration and rule, pasted as they are.
    let readme =
        |nth| support::documented("README.md", "### Stats from every isolate", ("yaml", nth));
    promtool_takes(&dir, "config", &readme(1));
    promtool_takes(&dir, "rules", &readme(2));

    // One print of the same counters, in OpenMetrics text.
    let out = stack
        .edge_limiter(&["stats", "--format", "openmetrics"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let denied = "edge_limiter_rule_denied_total{rule=\"limited\"} 2\n";
    assert!(text.contains(denied), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
}
