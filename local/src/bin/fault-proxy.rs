//! `fault-proxy`: the tests' fault proxy as a command, holding every
//! request to a local REST endpoint a set time: `scripts/stack REGIONS=2`
//! puts the home's Redis this far away.

use std::{net::SocketAddr, process::ExitCode, time::Duration};

use edge_limiter_local::fault_proxy::{Fault, FaultProxy};

const USAGE: &str = "\
usage: fault-proxy --listen ADDR --upstream ADDR [--delay MS]

  --listen ADDR     the address to listen on (127.0.0.1:PORT)
  --upstream ADDR   the REST endpoint to forward to (127.0.0.1:PORT)
  --delay MS        how long each request is held before it is forwarded
                    (default 0)

Once listening, prints `listening on http://ADDR` on stdout.";

fn main() -> ExitCode {
    let (mut listen, mut upstream, mut delay_ms): (Option<SocketAddr>, Option<SocketAddr>, u64) =
        (None, None, 0);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next();
        let parsed = match (flag.as_str(), value.as_deref()) {
            ("--listen", Some(v)) => v.parse().map(|a| listen = Some(a)).is_ok(),
            ("--upstream", Some(v)) => v.parse().map(|a| upstream = Some(a)).is_ok(),
            ("--delay", Some(v)) => v.parse().map(|ms| delay_ms = ms).is_ok(),
            _ => false,
        };
        if !parsed {
            eprintln!(
                "fault-proxy: {flag} {}: not understood\n\n{USAGE}",
                value.unwrap_or_default()
            );
            return ExitCode::from(2);
        }
    }
    let (Some(listen), Some(upstream)) = (listen, upstream) else {
        eprintln!("fault-proxy: --listen and --upstream are needed\n\n{USAGE}");
        return ExitCode::from(2);
    };
    let proxy = match FaultProxy::start_at(listen, upstream) {
        Ok(proxy) => proxy,
        Err(e) => {
            eprintln!("fault-proxy: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    proxy.set(Fault::Delay(Duration::from_millis(delay_ms)));
    println!("listening on {}", proxy.url());
    loop {
        std::thread::sleep(Duration::from_secs(1));
        proxy.forget();
    }
}
