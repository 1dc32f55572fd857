//! Part 4, size and start: the built wasm raw and gzipped, and the time
//! workerd takes to instantiate it (`bench/workers/instantiate.mjs`).

use std::{
    io::Write,
    path::Path,
    process::{Command, Stdio},
};

use serde_json::Value;

use crate::{stack::Worker, stats::median};

/// Raw and `gzip -9` size of some bytes, in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Size {
    pub raw: u64,
    pub gzip: u64,
}

/// `gzip -9`, as the size tables in shared/toolchain.md are measured.
pub fn size_of(bytes: &[u8]) -> Result<Size, String> {
    let mut gzip = Command::new("gzip")
        .args(["-9", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run gzip: {e}"))?;
    let mut stdin = gzip.stdin.take().expect("piped stdin");
    let input = bytes.to_vec();
    // Written from another thread: gzip's output pipe could fill first.
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let output = gzip.wait_with_output().map_err(|e| e.to_string())?;
    writer
        .join()
        .expect("writer thread")
        .map_err(|e| e.to_string())?;
    Ok(Size {
        raw: bytes.len() as u64,
        gzip: output.stdout.len() as u64,
    })
}

pub fn size_of_file(path: &Path) -> Result<Size, String> {
    size_of(&std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?)
}

/// Milliseconds per instantiation: the median over `rounds` requests that
/// each instantiate `per_request` times (workerd's clock ticks in whole ms).
pub async fn instantiate_ms(
    http: &reqwest::Client,
    worker: &Worker,
    rounds: usize,
    per_request: u32,
) -> Result<f64, String> {
    let mut each = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let reply: Value = async {
            http.get(format!("{}/?n={per_request}", worker.url))
                .send()
                .await?
                .json()
                .await
        }
        .await
        .map_err(|e| format!("instantiate worker: {e}; log:\n{}", worker.log()))?;
        let ms = reply["ms"]
            .as_f64()
            .ok_or_else(|| format!("instantiate worker answered {reply}"))?;
        each.push(ms / f64::from(per_request));
    }
    Ok(median(&each))
}
