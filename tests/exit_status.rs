//! The command's exit statuses, one rule for every subcommand: 2 when the
//! command line is wrong in itself (clap's usage errors, and option values
//! refused the same way), 1 for every other error, in a single line on
//! stderr; and `--help` says so. Every case fails before any Redis call, or
//! at the first one, so no Redis is needed.
#![cfg(not(target_arch = "wasm32"))]

use std::process::Command;

use edge_limiter_local::testenv::{free_port, Scratch};

const RULES: &str = r#"
[[vars.LIMITER.rules]]
name = "per-key"
key = ["header:x-api-key"]
algorithm = "gcra"
rate = 10
period = "1s"
burst = 20
overrides = true

[env.staging]
[[env.staging.vars.LIMITER.rules]]
name = "broken"
key = ["ip"]
algorithm = "gcra"
rate = 0
period = "1s"
"#;

/// `edge-limiter ARGS` in `dir`, with a REST endpoint where nothing
/// listens: its exit status and stderr.
fn run(dir: &Scratch, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_edge-limiter"))
        .args(args)
        .current_dir(dir)
        .env(
            "UPSTASH_REDIS_REST_URL",
            format!("http://127.0.0.1:{}", free_port()),
        )
        .env("UPSTASH_REDIS_REST_TOKEN", "t")
        .output()
        .expect("the command runs");
    (out.status.code(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn a_wrong_command_line_exits_2_and_every_other_error_1() {
    let dir = Scratch::new("exit-status");
    std::fs::write(dir.join("wrangler.toml"), RULES).unwrap();
    let cases: &[(&[&str], i32, &str)] = &[
        // What clap refuses.
        (
            &["inspect", "per-key"],
            2,
            "required arguments were not provided",
        ),
        (&["inspect"], 2, "required arguments were not provided"),
        (&["limit", "set"], 2, "required arguments were not provided"),
        (&["check", "--strict"], 2, "unexpected argument '--strict'"),
        (
            &["simulate", "--log", "x", "--isolates", "0"],
            2,
            "invalid value '0' for '--isolates",
        ),
        // Option values refused as clap would refuse them.
        (
            &["limit", "set", "per-key", "partner-7", "--rate", "0"],
            2,
            "rule `per-key`, field `rate`: must be at least 1",
        ),
        (
            &[
                "limit",
                "set",
                "per-key",
                "partner-7",
                "--block",
                "--for",
                "2x",
            ],
            2,
            "--for: `2x` is not a duration",
        ),
        (
            &["limit", "set", "per-key", "partner-7"],
            2,
            "give the figures",
        ),
        (
            &["stats", "--since", "soon"],
            2,
            "--since: `soon` is neither",
        ),
        (
            &["stats", "--since", "1h", "--until", "2h"],
            2,
            "--since must come before --until",
        ),
        // Everything else.
        (
            &["check", "nowhere.toml"],
            1,
            "nowhere.toml: No such file or directory",
        ),
        (
            &["inspect", "per-key", "k", "--config", "nowhere.toml"],
            1,
            "nowhere.toml: No such file or directory",
        ),
        (
            &["simulate", "nowhere.toml", "--log", "x"],
            1,
            "nowhere.toml: No such file or directory",
        ),
        (
            &["simulate", "--log", "nowhere.log"],
            1,
            "nowhere.log: No such file or directory",
        ),
        (&["check"], 1, "[env.staging]: rule `broken`"),
        (
            &["inspect", "per-key", "k", "--env", "prod"],
            1,
            "has no [env.prod]",
        ),
        (&["inspect", "nope", "k"], 1, "no rule `nope`"),
        (&["inspect", "per-key", "k", "k2"], 1, "give 1 value(s)"),
        (
            &["limit", "get", "per-key", "k"],
            1,
            "UPSTASH_REDIS_REST_URL",
        ),
        (&["reset", "per-key", "k"], 1, "UPSTASH_REDIS_REST_URL"),
        (&["stats", "nope"], 1, "no rule `nope`"),
        (&["stats", "per-key"], 1, "UPSTASH_REDIS_REST_URL"),
    ];
    for &(args, code, needle) in cases {
        let (status, err) = run(&dir, args);
        assert_eq!(status, Some(code), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        if code == 1 {
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        }
    }
}

#[test]
fn help_states_the_rule() {
    let dir = Scratch::new("exit-status-help");
    for args in [
        &["--help"][..],
        &["check", "--help"],
        &["inspect", "--help"],
        &["limit", "--help"],
        &["limit", "set", "--help"],
        &["stats", "--help"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_edge-limiter"))
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("Exit status: 0 on success; 2 when the command line is wrong in itself"),
            "{args:?}: {text}"
        );
    }
}
