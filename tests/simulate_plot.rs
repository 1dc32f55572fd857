//! `simulate --plot`: the SVG is well-formed XML holding each rule's
//! admitted and denied lines, and the HTML page, rendered by headless
//! Chromium (Debian's package, installed by scripts/install), shows them.
#![cfg(not(target_arch = "wasm32"))]

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use edge_limiter_local::testenv::Scratch;

/// The plot's colours, as `edge_limiter::operator::simulate::plot` draws them.
const ADMITTED: [u8; 3] = [0x2c, 0xa0, 0x2c];
const DENIED: [u8; 3] = [0xd6, 0x27, 0x28];
const DENIED_BY_OTHERS: [u8; 3] = [0x7f, 0x7f, 0x7f];

const RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "steady"
key = ["ip"]
algorithm = "gcra"
rate = 2
period = "1s"
burst = 4

[[vars.LIMITER.rules]]
name = "peek"
path_prefix = "/search"
key = ["ip"]
algorithm = "windowed"
windows = [["10s", 5, "1s"]]
mode = "shadow"
"#;

/// Two minutes of one client asking 5 times a second: 2 a second go through.
fn write_inputs(dir: &Path) -> (PathBuf, PathBuf) {
    let config = dir.join("wrangler.toml");
    std::fs::write(&config, RULES).unwrap();
    let mut log = String::from("time,ip,method,path\n");
    let t0 = 1_795_168_800_000u64;
    for i in 0..600 {
        let path = if i % 3 == 0 { "/search" } else { "/" };
        log.push_str(&format!("{},198.51.100.1,GET,{path}\n", t0 + i * 200));
    }
    let log_path = dir.join("access.csv");
    std::fs::write(&log_path, log).unwrap();
    (config, log_path)
}

fn simulate_plot(config: &Path, log: &Path, plot: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_edge-limiter"))
        .arg("simulate")
        .arg(config)
        .arg("--log")
        .arg(log)
        .args(["--engine", "model", "--plot"])
        .arg(plot)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

fn hex(rgb: [u8; 3]) -> String {
    format!("#{:02X}{:02X}{:02X}", rgb[0], rgb[1], rgb[2])
}

#[test]
fn the_svg_is_well_formed_with_both_lines_per_rule() {
    let dir = Scratch::new("plot-test-svg");
    let (config, log) = write_inputs(&dir);
    let svg_path = dir.join("plot.svg");
    simulate_plot(&config, &log, &svg_path);
    let text = std::fs::read_to_string(&svg_path).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the SVG is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.attribute("width"), Some("1000"));
    let lines = |color: [u8; 3]| {
        doc.descendants()
            .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke") == Some(&hex(color)))
            .map(|n| {
                n.attribute("points")
                    .unwrap_or_default()
                    .split_whitespace()
                    .count()
            })
            .collect::<Vec<usize>>()
    };
    // One line per panel in each colour (and one legend swatch each): the
    // panel of every request, then one per rule; each line a point per
    // second of the two-minute log.
    let (admitted, denied) = (lines(ADMITTED), lines(DENIED));
    assert_eq!(admitted.len(), 6, "{admitted:?}");
    assert_eq!(denied.len(), 6, "{denied:?}");
    assert!(
        admitted.iter().filter(|n| **n >= 120).count() == 3,
        "{admitted:?}"
    );
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    // One client, never idle, so its TAT is 500 ms per admitted request
    // from 0, and a request at t is admitted while TAT + 500 - t <= 2000:
    // the last, at 119 800 ms, leaves room for floor(121 800 / 500) = 243.
    assert!(
        texts.contains(&"steady: 600 matched, 243 admitted, 357 denied"),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("peek (shadow): 200 matched")),
        "{texts:?}"
    );
    assert!(texts.contains(&"would deny"), "{texts:?}");
}

/// A brute-force minute: every request matches the generous per-IP rule
/// and the login rule, which denies all but two. The per-IP panel draws
/// those as denied by other rules, and its lines add up to its title.
#[test]
fn requests_another_rule_denied_are_a_line_of_their_own() {
    let dir = Scratch::new("plot-test-others");
    let config = dir.join("wrangler.toml");
    std::fs::write(
        &config,
        r#"
[[vars.LIMITER.rules]]
name = "per-ip"
key = ["ip"]
algorithm = "gcra"
rate = 100
period = "1s"
burst = 100

[[vars.LIMITER.rules]]
name = "login"
path_prefix = "/login"
key = ["ip"]
algorithm = "gcra"
rate = 1
period = "1h"
burst = 2
"#,
    )
    .unwrap();
    let mut log = String::from("time,ip,method,path\n");
    for i in 0..60u64 {
        log.push_str(&format!(
            "{},198.51.100.7,POST,/login\n",
            1_795_168_800_000 + i * 1000
        ));
    }
    let log_path = dir.join("access.csv");
    std::fs::write(&log_path, log).unwrap();
    let svg_path = dir.join("plot.svg");
    simulate_plot(&config, &log_path, &svg_path);
    let text = std::fs::read_to_string(&svg_path).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    let heights = |color: [u8; 3]| -> Vec<Vec<f64>> {
        doc.descendants()
            .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke") == Some(&hex(color)))
            .map(|n| {
                let points = n.attribute("points").unwrap_or_default();
                points
                    .split_whitespace()
                    .filter_map(|p| p.split_once(',').and_then(|(_, y)| y.parse().ok()))
                    .collect()
            })
            .collect()
    };
    let texts: Vec<&str> = doc
        .descendants()
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    assert!(
        texts.contains(&"per-ip: 60 matched, 2 admitted, 0 denied, 58 denied by other rules"),
        "{texts:?}"
    );
    assert!(
        texts.contains(&"login: 60 matched, 2 admitted, 58 denied"),
        "{texts:?}"
    );
    // The grey line (and its legend swatch) only on the per-IP panel, a
    // point per second of the minute.
    let others = heights(DENIED_BY_OTHERS);
    assert_eq!(others.len(), 2, "{others:?}");
    assert!(others.iter().any(|line| line.len() == 60), "{others:?}");
}

#[test]
fn the_html_page_renders_the_plot_in_headless_chromium() {
    let dir = Scratch::new("plot-test-html");
    let (config, log) = write_inputs(&dir);
    let page = dir.join("plot.html");
    simulate_plot(&config, &log, &page);
    let png = dir.join("screenshot.png");
    let profile = dir.join("chromium-profile");
    let chromium = std::env::var_os("CHROMIUM_BIN").unwrap_or_else(|| "chromium".into());
    let mut child = Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1200,800",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {chromium:?} ({e}): scripts/install installs Debian's chromium")
        });
    // A few seconds when idle; generous for a loaded machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium took over 120 s to take the screenshot");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "chromium exited with {status}");

    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((info.width, info.height), (1200, 800));
    let channels = info.color_type.samples();
    assert!(channels >= 3, "{:?}", info.color_type);
    let near = |p: &[u8], c: [u8; 3]| (0..3).all(|i| p[i].abs_diff(c[i]) <= 24);
    let (mut admitted, mut denied, mut ink) = (0, 0, 0);
    for p in pixels[..info.buffer_size()].chunks(channels) {
        admitted += usize::from(near(p, ADMITTED));
        denied += usize::from(near(p, DENIED));
        ink += usize::from(p[..3].iter().any(|v| *v < 200));
    }
    // Two-pixel lines across about 900 pixels, twice for the first rule.
    assert!(admitted > 1000, "admitted line: {admitted} pixels");
    assert!(denied > 1000, "denied line: {denied} pixels");
    assert!(ink > 20_000, "the page looks blank: {ink} dark pixels");
    eprintln!("chromium screenshot: {admitted} green, {denied} red, {ink} dark pixels");
}
