//! `upstash-local`: serve Upstash's Redis REST API on top of a local Redis.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use edge_limiter_local::{bind, ServerConfig, DEFAULT_MAX_BODY_BYTES};

const USAGE: &str = "\
usage: upstash-local --token TOKEN [--listen ADDR] [--redis ADDR] [--max-body-bytes N]

  --listen ADDR        HTTP address (default 127.0.0.1:8079, env UPSTASH_LOCAL_LISTEN);
                       port 0 picks a free port
  --redis ADDR         Redis as host:port or unix:/path (default 127.0.0.1:6379,
                       env UPSTASH_LOCAL_REDIS)
  --token TOKEN        bearer token clients must send (env UPSTASH_LOCAL_TOKEN)
  --max-body-bytes N   larger request bodies get 413 (default 1048576)

Once listening, prints `listening on http://ADDR` on stdout.";

fn main() -> ExitCode {
    let cfg = match parse_args(std::env::args().skip(1), |name| std::env::var(name).ok()) {
        Ok(Some(cfg)) => cfg,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("upstash-local: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let listen = cfg.listen;
        let (addr, serving) = match bind(cfg).await {
            Ok(bound) => bound,
            Err(e) => {
                eprintln!("upstash-local: cannot listen on {listen}: {e}");
                return ExitCode::FAILURE;
            }
        };
        // A parent process reads this line to learn the port, so flush it now.
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "listening on http://{addr}");
        let _ = stdout.flush();
        serving.await;
        ExitCode::SUCCESS
    })
}

/// Reads flags over environment defaults. `Ok(None)` means help was asked for.
fn parse_args(
    mut args: impl Iterator<Item = String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<ServerConfig>, String> {
    let mut listen = env("UPSTASH_LOCAL_LISTEN").map(|v| ("UPSTASH_LOCAL_LISTEN", v));
    let mut redis = env("UPSTASH_LOCAL_REDIS");
    let mut token = env("UPSTASH_LOCAL_TOKEN");
    let mut max_body = None;
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_string(), Some(value.to_string()))
            }
            _ => (arg, None),
        };
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--listen" => listen = Some(("--listen", value()?)),
            "--redis" => redis = Some(value()?),
            "--token" => token = Some(value()?),
            "--max-body-bytes" => max_body = Some(value()?),
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    let listen = match listen {
        Some((source, text)) => text
            .parse::<SocketAddr>()
            .map_err(|e| format!("{source}: {text:?} is not an IP:PORT address ({e})"))?,
        None => SocketAddr::from(([127, 0, 0, 1], 8079)),
    };
    let redis = redis.unwrap_or_else(|| "127.0.0.1:6379".to_string());
    if redis.is_empty() {
        return Err("--redis must not be empty".into());
    }
    let token = token
        .filter(|t| !t.is_empty())
        .ok_or("--token (or UPSTASH_LOCAL_TOKEN) is required and must not be empty")?;
    let max_body_bytes = match max_body {
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("--max-body-bytes: {text:?} is not a positive integer"))?,
        None => DEFAULT_MAX_BODY_BYTES,
    };
    Ok(Some(ServerConfig {
        listen,
        redis,
        token,
        max_body_bytes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<Option<ServerConfig>, String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse_args(args.iter().map(|a| a.to_string()), move |name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn flags_override_env() {
        let cfg = parse(
            &[
                "--listen",
                "127.0.0.1:0",
                "--redis=127.0.0.1:7000",
                "--max-body-bytes",
                "10",
            ],
            &[("UPSTASH_LOCAL_TOKEN", "t"), ("UPSTASH_LOCAL_REDIS", "x:1")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(cfg.listen.port(), 0);
        assert_eq!(cfg.redis, "127.0.0.1:7000");
        assert_eq!(cfg.token, "t");
        assert_eq!(cfg.max_body_bytes, 10);
    }

    #[test]
    fn defaults() {
        let cfg = parse(&["--token", "t"], &[]).unwrap().unwrap();
        assert_eq!(cfg.listen.to_string(), "127.0.0.1:8079");
        assert_eq!(cfg.redis, "127.0.0.1:6379");
        assert_eq!(cfg.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    }

    #[test]
    fn errors_name_the_flag() {
        assert!(parse(&[], &[]).unwrap_err().contains("--token"));
        assert!(parse(&["--token"], &[])
            .unwrap_err()
            .contains("--token needs a value"));
        assert!(parse(&["--token", "t", "--listen", "nope"], &[])
            .unwrap_err()
            .contains("--listen"));
        assert!(parse(&["--token", "t"], &[("UPSTASH_LOCAL_LISTEN", "x")])
            .unwrap_err()
            .contains("UPSTASH_LOCAL_LISTEN"));
        assert!(parse(&["--token", "t", "--max-body-bytes", "-1"], &[])
            .unwrap_err()
            .contains("--max-body-bytes"));
        assert!(parse(&["--token", "t", "--bogus"], &[])
            .unwrap_err()
            .contains("--bogus"));
        assert_eq!(parse(&["--help"], &[]), Ok(None));
    }
}
