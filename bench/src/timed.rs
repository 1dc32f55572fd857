//! One GET, timed: the measure parts 6 and 7 take of each request.

use std::time::Instant;

/// One GET of `url` with these headers, timed: ms, and the status.
pub async fn timed(
    http: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<(f64, u16), String> {
    let start = Instant::now();
    // A worker that never answers ends the request, not the run.
    let mut request = http.get(url).timeout(std::time::Duration::from_secs(30));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.map_err(|e| format!("{url}: {e}"))?;
    let status = response.status().as_u16();
    response.bytes().await.map_err(|e| format!("{url}: {e}"))?;
    Ok((start.elapsed().as_secs_f64() * 1000.0, status))
}

/// One request of the client `key` (ours keys on its API key, the peer on
/// its address, a /64 of its own made from the key), timed.
pub async fn timed_as_client(
    http: &reqwest::Client,
    url: &str,
    key: &str,
) -> Result<(f64, u16), String> {
    let net = key.bytes().fold(0xcbf2_9ce4_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let ip = format!("2001:db8:{:x}:{:x}::1", net >> 16, net & 0xffff);
    timed(http, url, &[("x-api-key", key), ("CF-Connecting-IP", &ip)]).await
}
