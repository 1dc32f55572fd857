//! Regions end to end: the built worker in `wrangler dev` with a second
//! region's Redis beside the home's decides each request in the region its
//! place goes to (`request.cf`, or the header only a local run honours),
//! and refuses to run when a region's secrets are missing.
#![cfg(not(target_arch = "wasm32"))]

mod support;

use edge_limiter_local::fault_proxy::Fault;
use support::{worker::Stack, Backend};

/// docs/deploying.md's regions, where wrangler dev places every request in
/// DFW, North America (miniflare's stand-in for `request.cf`): `eu` takes
/// that continent too here, so that a request naming no region goes to it
/// by its place.
fn regions() -> String {
    let documented = support::documented("docs/deploying.md", "## Regions", ("toml", 1));
    let (page, here) = (r#"["EU", "AF"]"#, r#"["EU", "AF", "NA"]"#);
    assert!(documented.contains(page), "{documented}");
    let with_stats = "[vars.LIMITER]\nstats = true\nstats_every = \"1s\"";
    (documented.replace(page, here)).replace("[vars.LIMITER]", with_stats) + PER_IP
}

const PER_IP: &str = r#"
[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1m"
burst = 2
"#;

/// Statuses of `n` requests from `ip`, one after the other, each naming
/// region `pin` when given.
async fn send(url: &str, ip: &str, pin: Option<&str>, n: usize) -> Vec<u16> {
    let client = support::http();
    let mut statuses = vec![];
    for _ in 0..n {
        let mut r = client.get(url).header("CF-Connecting-IP", ip);
        if let Some(region) = pin {
            r = r.header("X-Edge-Limiter-Region", region);
        }
        statuses.push(
            r.send()
                .await
                .expect("the worker answers")
                .status()
                .as_u16(),
        );
    }
    statuses
}

/// Whether `b`'s Redis holds `ip`'s state on the rule.
fn holds(b: &Backend, ip: &str) -> bool {
    b.redis(&["EXISTS", &format!("el:{{{ip}}}:per-ip")]) == "1"
}

#[tokio::test]
async fn each_request_is_decided_in_its_regions_redis() {
    let stack = Stack::builder(&regions()).region("eu").start();
    let (home, eu) = (&stack.backend, &stack.regions[0].1);
    let url = format!("{}/page", stack.worker.url);
    // By its place: North America goes to `eu` here.
    assert_eq!(send(&url, "203.0.113.1", None, 3).await, [200, 200, 429]);
    assert!(holds(eu, "203.0.113.1") && !holds(home, "203.0.113.1"));
    // Named to the home: its own budget there, as a rule without
    // `regions` keeps one per region.
    let pinned = send(&url, "203.0.113.1", Some("us"), 3).await;
    assert_eq!(pinned, [200, 200, 429]);
    assert!(holds(home, "203.0.113.1"));
    // Named to `eu` again, which the cached denial answers; a region no
    // configuration names is ignored, and the place decides.
    assert_eq!(send(&url, "203.0.113.1", Some("eu"), 1).await, [429]);
    assert_eq!(send(&url, "203.0.113.2", Some("ap"), 1).await, [200]);
    assert!(holds(eu, "203.0.113.2") && !holds(home, "203.0.113.2"));
    assert_eq!(stack.origin.hits().await["total"], 5);

    // The operator reaches a region's Redis by its secrets in .dev.vars.
    let inspect = |region: &[&str]| {
        let out = (stack.edge_limiter(&["inspect", "per-ip", "203.0.113.2"]))
            .args(region)
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap();
        (out.status.code(), text)
    };
    let (status, eu_state) = inspect(&["--region", "eu"]);
    assert_eq!(status, Some(0), "{eu_state}");
    assert!(eu_state.contains("1 of 2 left"), "{eu_state}");
    let (_, home_state) = inspect(&[]);
    assert!(home_state.contains("2 of 2 left"), "{home_state}");
    let (status, wrong) = inspect(&["--region", "ap"]);
    assert_eq!(status, Some(1));
    assert!(
        wrong.contains("--region ap: the configuration's regions are: us, eu"),
        "{wrong}"
    );

    // Each region's isolates write their stats in their own Redis; `stats`
    // adds them up: 3 requests at the home, 5 in `eu`.
    let report = stack.stats_once_written(8).await;
    assert_eq!(report["denied"], 3, "{report}");
    assert_eq!(report["rules"]["per-ip"]["admitted"], 5, "{report}");
    let out = (stack.edge_limiter(&["stats", "--json", "--region", "eu"]))
        .output()
        .unwrap();
    let eu_only: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(eu_only["requests"], 5, "{eu_only}");
    // The counters /metrics serves add up the same way.
    let out = (stack.edge_limiter(&["stats", "--format", "openmetrics"]))
        .output()
        .unwrap();
    let metrics = String::from_utf8(out.stdout).unwrap();
    for line in [
        "edge_limiter_requests_total 8",
        "edge_limiter_rule_denied_total{rule=\"per-ip\"} 3",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}:\n{metrics}");
    }
}

#[tokio::test]
async fn a_region_without_its_secrets_stops_the_worker_and_names_them() {
    let stack = Stack::start(&regions());
    let r = support::http().get(&stack.worker.url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 500);
    let want = "set UPSTASH_REDIS_REST_URL_EU and UPSTASH_REDIS_REST_TOKEN_EU";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !stack.worker.log().contains(want) {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            stack.worker.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(stack.origin.hits().await["total"], 0);
}

/// docs/deploying.md's regions as they are there, and its shared rule.
fn shared() -> String {
    let regions = support::documented("docs/deploying.md", "## Regions", ("toml", 1));
    let heading = "## One limit across regions";
    regions + &support::documented("docs/deploying.md", heading, ("toml", 1))
}

#[tokio::test]
async fn a_shared_rule_keeps_one_limit_across_regions() {
    let stack = Stack::builder(&shared()).region("eu").start();
    let (home, eu) = (&stack.backend, &stack.regions[0].1);
    let out = stack.edge_limiter(&["check"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let heading = "## One limit across regions";
    let line = support::documented("docs/deploying.md", heading, ("text", 1));
    assert!(said.contains(line.trim()), "{said}");

    // A burst from both regions at once, a fresh client: the home decides
    // the first of each region's, and grants pools; no more than the rule
    // allows reaches the origin, 20 and what refilled meanwhile.
    let url = format!("{}/page", stack.worker.url);
    let ip = "203.0.113.7";
    let started = std::time::Instant::now();
    let burst = futures_join(&url, ip, 15).await;
    let took_ms = started.elapsed().as_millis() as u64;
    let admitted = burst.iter().filter(|s| **s == 200).count() as u64;
    let refilled = took_ms / 600 + 1;
    assert!(
        admitted <= 20 + refilled,
        "{admitted} admitted in {took_ms} ms: {burst:?}"
    );
    assert!(admitted >= 10, "{burst:?}");
    assert_eq!(stack.origin.hits().await["total"], admitted);
    // The limit lives at the home; the region holds only its pool.
    assert_eq!(home.redis(&["EXISTS", &format!("el:{{{ip}}}:api")]), "1");
    assert_eq!(eu.redis(&["EXISTS", &format!("el:{{{ip}}}:api")]), "0");
    assert_eq!(eu.redis(&["EXISTS", &format!("el:{{{ip}}}:api:pool")]), "1");

    // A steady client in `eu`, below the rate: its region's Redis decides,
    // the home only tops the pool up.
    let ip = "203.0.113.8";
    let _ = send(&url, ip, Some("eu"), 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let (home_before, eu_before) = (home.script_calls(), eu.script_calls());
    let mut steady = vec![];
    for _ in 0..10 {
        let r = (support::http().get(&url))
            .header("CF-Connecting-IP", ip)
            .header("X-Edge-Limiter-Region", "eu")
            .send()
            .await
            .expect("the worker answers");
        let told = support::header(&r, "RateLimit").unwrap_or("").to_owned();
        steady.push((r.status().as_u16(), told));
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    }
    assert!(steady.iter().all(|(s, _)| *s == 200), "{steady:?}");
    // Its headers count the home's figures, not the share's few units
    // alone (3, 2, 1 as the share ran out): before its first grant, the
    // home's whole burst, 15 as `check` said above.
    let left = |told: &str| {
        told.split(";r=")
            .nth(1)?
            .split(';')
            .next()?
            .parse::<u64>()
            .ok()
    };
    assert_eq!(left(&steady[0].1), Some(15), "{steady:?}");
    let told: Vec<Option<u64>> = steady.iter().map(|(_, told)| left(told)).collect();
    assert!(told.iter().all(|r| r.is_some_and(|r| r > 5)), "{steady:?}");
    let home_calls = home.script_calls() - home_before;
    let eu_calls = eu.script_calls() - eu_before;
    eprintln!("burst: {admitted} of 30 admitted in {took_ms} ms; steady: {eu_calls} calls in eu, {home_calls} at the home");
    assert!(eu_calls >= 10, "{eu_calls} calls in eu");
    assert!(
        home_calls <= 6,
        "{home_calls} calls at the home for 10 requests"
    );

    // `inspect` shows the home's state and the region's pool, as the page
    // does, figures aside.
    let out = stack
        .edge_limiter(&["inspect", "api", ip])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout)
        .replace("pool in eu: none", "pool in eu: 0 units, 0 ms left");
    let page = support::documented("docs/deploying.md", heading, ("text", 2));
    let figures_aside = |text: &str| -> Vec<String> {
        let digits = |c: char| c.is_ascii_digit();
        let lines = text
            .lines()
            .map(|l| l.trim_start().to_owned())
            .filter(|l| !l.is_empty());
        lines
            .map(|l| l.split(digits).filter(|p| !p.is_empty()).collect())
            .collect()
    };
    assert_eq!(figures_aside(&shown), figures_aside(&page), "{shown}");
}

/// Statuses of `n` requests from `ip` in each region at once.
async fn futures_join(url: &str, ip: &str, n: usize) -> Vec<u16> {
    let (us, eu) = tokio::join!(send_all(url, ip, "us", n), send_all(url, ip, "eu", n));
    us.into_iter().chain(eu).collect()
}

/// Statuses of `n` requests from `ip` naming `region`, all sent at once.
async fn send_all(url: &str, ip: &str, region: &str, n: usize) -> Vec<u16> {
    let client = support::http();
    let sent = (0..n).map(|_| {
        let r = client
            .get(url)
            .header("CF-Connecting-IP", ip)
            .header("X-Edge-Limiter-Region", region);
        async move {
            r.send()
                .await
                .expect("the worker answers")
                .status()
                .as_u16()
        }
    });
    let mut statuses = vec![];
    for handle in sent.map(tokio::spawn).collect::<Vec<_>>() {
        statuses.push(handle.await.unwrap());
    }
    statuses
}

/// Units `b`'s pool of `ip` on the api rule holds: its two tranches'.
fn pooled(b: &Backend, ip: &str) -> u64 {
    let text = b.redis(&["GET", &format!("el:{{{ip}}}:api:pool")]);
    let n: Vec<u64> = text
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    n.first().copied().unwrap_or(0) + n.get(2).copied().unwrap_or(0)
}

#[tokio::test]
async fn a_region_spends_its_pool_while_the_home_is_out_of_reach_then_fails_as_told() {
    let stack = Stack::builder(&shared())
        .region("eu")
        .through_fault_proxy()
        .start();
    let (proxy, eu) = (stack.proxy.as_ref().unwrap(), &stack.regions[0].1);
    let url = format!("{}/page", stack.worker.url);
    let ip = "203.0.113.9";
    // A few requests fill the pool: the region's share (5) covers the
    // first, and the home grants a pool once that runs out.
    for _ in 0..6 {
        assert_eq!(send(&url, ip, Some("eu"), 1).await, [200]);
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let held = pooled(eu, ip) as usize;
    assert!(held >= 1, "{held} units pooled");
    proxy.set(Fault::Status {
        status: 503,
        body: "down".into(),
    });
    // The pool's units are spent, then what the region's share (5 at
    // once) has left; then the rule fails closed, as configured.
    let statuses = send(&url, ip, Some("eu"), held + 7).await;
    let served = statuses.iter().take_while(|s| **s == 200).count();
    assert!(
        (held..=held + 5).contains(&served),
        "{held} pooled: {statuses:?}"
    );
    assert!(statuses[served..].iter().all(|s| *s == 503), "{statuses:?}");
    // A fresh client is decided in the region alone, from its share.
    let fresh = send(&url, "203.0.113.12", Some("eu"), 6).await;
    assert_eq!(fresh, [200, 200, 200, 200, 200, 503]);
    // Each top-up asked for and each far call failed, and one line says so.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stack.worker.events_of("home_unreachable").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            stack.worker.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(stack.worker.events_of("home_unreachable").len(), 1);

    // A region out of reach sends its requests to the home.
    proxy.set(Fault::Pass);
    eu.redis(&["CLIENT", "PAUSE", "3000", "ALL"]);
    let other = "203.0.113.10";
    assert_eq!(send(&url, other, Some("eu"), 2).await, [200, 200]);
    assert_eq!(
        stack
            .backend
            .redis(&["EXISTS", &format!("el:{{{other}}}:api")]),
        "1"
    );
    assert_eq!(stack.worker.events_of("region_unreachable").len(), 1);
    eu.redis(&["CLIENT", "UNPAUSE"]);
}

#[tokio::test]
async fn a_block_set_at_the_home_reaches_a_region_within_cache_hold() {
    let toml = shared()
        .replace(
            "regions = \"shared\"",
            "regions = \"shared\"\noverrides = true",
        )
        .replace("[vars.LIMITER]", "[vars.LIMITER]\ncache_hold = \"2s\"")
        // A region's share would not follow an override: `check` refuses both.
        .replace("region_share = 5\n", "");
    let stack = Stack::builder(&toml).region("eu").start();
    let url = format!("{}/page", stack.worker.url);
    let ip = "203.0.113.11";
    for _ in 0..3 {
        assert_eq!(send(&url, ip, Some("eu"), 1).await, [200]);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let out = stack
        .edge_limiter(&["limit", "set", "api", ip, "--block"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Pools granted before it last no longer than cache_hold; the home
    // grants none under the block.
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    assert_eq!(send(&url, ip, Some("eu"), 3).await, [429, 429, 429]);
    assert_eq!(send(&url, ip, Some("us"), 1).await, [429]);
}
