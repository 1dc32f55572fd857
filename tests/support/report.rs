//! Figures a reader should see whether the tests pass or not: tables
//! printed past the test harness's output capture, and the secret scan.

use std::io::Write;

/// A table printed at the end of a test, with one row per case.
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: &str, header: &[&str]) -> Table {
        Table {
            title: title.to_owned(),
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as Markdown, columns padded to line up in a terminal.
    pub fn render(&self) -> String {
        let columns = self.header.len();
        let width = |i: usize| {
            std::iter::once(&self.header)
                .chain(&self.rows)
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..columns).map(width).collect();
        let line = |cells: &[String]| {
            let padded: Vec<String> = (0..columns)
                .map(|i| {
                    let cell = cells.get(i).map(String::as_str).unwrap_or("");
                    format!("{cell:<w$}", w = widths[i])
                })
                .collect();
            format!("| {} |\n", padded.join(" | "))
        };
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        let mut out = format!("\n### {}\n\n", self.title);
        out.push_str(&line(&self.header));
        out.push_str(&line(&rule));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }

    /// Writes the table to stderr and to `target/tmp/<file>.md`.
    ///
    /// libtest captures `print!` and `eprint!` of passing tests, but not
    /// writes to the stream itself, so the table shows in every run's output.
    pub fn print(&self, file: &str) {
        let text = self.render();
        let mut stderr = std::io::stderr().lock();
        let _ = stderr.write_all(text.as_bytes());
        let _ = stderr.flush();
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{file}.md"));
        let _ = std::fs::write(path, text);
    }
}

/// `read()` once it has stopped changing for 300 ms (at most 5 s): a log
/// written by another process lags the responses it describes.
pub fn settled(read: impl Fn() -> String) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut last = read();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let now = read();
        if now == last || std::time::Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// Panics naming the first text that holds `secret`, without printing it.
pub fn assert_no_secret<'a>(secret: &str, what: &str, texts: impl IntoIterator<Item = &'a str>) {
    let mut scanned = 0usize;
    for (i, text) in texts.into_iter().enumerate() {
        scanned += text.len();
        if let Some(at) = text.find(secret) {
            let start = text[..at]
                .char_indices()
                .rev()
                .nth(60)
                .map_or(0, |(i, _)| i);
            panic!(
                "the token appears in {what} #{i}, after: {:?}",
                &text[start..at]
            );
        }
    }
    assert!(scanned > 0, "nothing to scan in {what}");
}
