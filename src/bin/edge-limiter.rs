//! `edge-limiter check [wrangler.toml]`: validates the limiter configuration
//! of every environment in a wrangler.toml before `wrangler deploy`.

#[cfg(not(target_arch = "wasm32"))]
fn main() -> std::process::ExitCode {
    use std::process::ExitCode;

    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = match args.as_slice() {
        [cmd] if cmd == "check" => "wrangler.toml".to_owned(),
        [cmd, path] if cmd == "check" => path.clone(),
        _ => {
            eprintln!("usage: edge-limiter check [path/to/wrangler.toml]");
            return ExitCode::from(2);
        }
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(2);
        }
    };
    let verdicts = match edge_limiter::check::check_wrangler_toml(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut ok = true;
    for (env, verdict) in verdicts {
        match verdict {
            Ok(config) => {
                println!("{path} [{env}]: ok");
                for line in edge_limiter::check::describe(&config) {
                    println!("  {line}");
                }
            }
            Err(e) => {
                ok = false;
                eprintln!("{path} [{env}]: {e}");
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

// The worker's build compiles every target for wasm32; this command is native only.
#[cfg(target_arch = "wasm32")]
fn main() {}
