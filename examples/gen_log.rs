//! Writes a synthetic access log in the Common (Combined) Log Format to
//! stdout, for timing `edge-limiter simulate` on a log of any size:
//!
//! ```sh
//! cargo run -q --release --example gen_log -- 1000000 > /tmp/big.log
//! time target/release/edge-limiter simulate examples/wrangler.toml --log /tmp/big.log --quiet
//! ```
//!
//! Arguments: lines (default 100 000), then requests per second (default 300).
//! The traffic is a steady crowd of clients plus a few that burst hard, so
//! every rule both admits and denies. The same arguments give the same log.

use std::io::{BufWriter, Write};

/// xorshift64*: a few lines, reproducible, good enough to spread traffic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// `20/Nov/2026:10:00:00 +0000` for seconds since the epoch.
fn clf_time(epoch_s: u64) -> String {
    let days = (epoch_s / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let s = epoch_s % 86_400;
    format!(
        "{day:02}/{}/{year}:{:02}:{:02}:{:02} +0000",
        MONTHS[(month - 1) as usize],
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

fn main() -> std::io::Result<()> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments are whole numbers"))
        .collect();
    let lines = args.first().copied().unwrap_or(100_000);
    let per_second = args.get(1).copied().unwrap_or(300).max(1);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let start = 1_795_168_800; // 2026-11-20T10:00:00Z
    let paths = [
        "/",
        "/api/items",
        "/api/items/42",
        "/api/search?q=shoes",
        "/static/app.js",
        "/login",
        "/api/cart",
    ];
    let agents = [
        "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 Safari/605.1.15",
        "curl/8.5.0",
    ];
    let mut out = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    for i in 0..lines {
        let second = start + i / per_second;
        // One request in 5 comes from one of 4 hot clients, the rest from 5000.
        let ip = if rng.below(5) == 0 {
            format!("198.51.100.{}", rng.below(4) + 1)
        } else {
            let n = rng.below(5000);
            format!("203.0.{}.{}", 113 + n / 250, n % 250 + 1)
        };
        let path = paths[rng.below(paths.len() as u64) as usize];
        let method = if path == "/login" || rng.below(10) == 0 {
            "POST"
        } else {
            "GET"
        };
        let status = [200, 200, 200, 304, 404][rng.below(5) as usize];
        writeln!(
            out,
            "{ip} - - [{}] \"{method} {path} HTTP/1.1\" {status} {} \"-\" \"{}\"",
            clf_time(second),
            rng.below(20_000),
            agents[rng.below(agents.len() as u64) as usize]
        )?;
    }
    out.flush()
}
