//! `scripts/stack` as a user runs it: started on free ports, left until it
//! says it is running, then stopped with Ctrl-C, which a terminal sends as
//! SIGINT to the script's process group. It must say what it stopped, stop
//! it all, and exit 0.
//!
//! The stack runs in a tree of links to the working tree's files, so that
//! the repository's own `.dev.vars`, `.stack/` and `build/` (which other
//! tests' workers serve) are left alone, while cargo sees the same sources
//! with the same times: the builds the stack makes there are the working
//! tree's, fresh when those are. (A copy would not do: cargo keys a
//! workspace's artifacts by their path within it, so a copy's build would
//! pass for the working tree's, made from the copy's files.)
#![cfg(not(target_arch = "wasm32"))]

use std::{
    fs,
    net::TcpStream,
    os::unix::{fs::symlink, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use edge_limiter_local::testenv::{free_port, repo};

/// The whole working tree as git sees it (tracked and new files, nothing
/// ignored), each file a link at its place under `to`, and the
/// repository's `node_modules` linked in. Kept from run to run, so that
/// the build records that name these links stay true.
fn link_tree(to: &Path) {
    let from = repo();
    let _ = fs::remove_dir_all(to);
    let listed = Command::new("git")
        .args(["ls-files", "-co", "--exclude-standard", "-z"])
        .current_dir(&from)
        .output()
        .expect("git lists the working tree");
    assert!(listed.status.success(), "{listed:?}");
    for name in listed.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = std::str::from_utf8(name).expect("a UTF-8 file name");
        let (src, dst) = (from.join(name), to.join(name));
        // Deleted from the working tree but not yet from the index.
        if !src.exists() {
            continue;
        }
        fs::create_dir_all(dst.parent().unwrap()).unwrap();
        symlink(&src, &dst).unwrap();
    }
    symlink(from.join("node_modules"), to.join("node_modules")).unwrap();
}

/// The stack's script, leading its own process group as a shell's
/// foreground job does, with its output in `log`.
struct Stack {
    child: Child,
    log: PathBuf,
}

impl Stack {
    fn output(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends signal `name` to the script's process group; whether it went.
    fn signal(&self, name: &str) -> bool {
        Command::new("kill")
            .args([&format!("-{name}"), "--", &format!("-{}", self.child.id())])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The script's exit status, once it has ended (within `limit`).
    fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for Stack {
    /// A test that failed half way still stops what the stack started:
    /// its children lead process groups of their own, which only the
    /// script's own stop reaches.
    fn drop(&mut self) {
        let running = matches!(self.child.try_wait(), Ok(None));
        if running && (!self.signal("TERM") || self.wait(Duration::from_secs(30)).is_none()) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `scripts/stack` in a tree of links, on free ports for `names`
/// (and `env`), and waits until it says it runs: the stack, the ports, and
/// what it said.
fn started(
    tree: &str,
    names: &[&'static str],
    env: &[(&str, &str)],
) -> (Stack, Vec<(&'static str, u16)>, String) {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let tree = tmp.join(tree);
    link_tree(&tree);
    let ports: Vec<(&'static str, u16)> = names.iter().map(|n| (*n, free_port())).collect();
    let log = tree.with_extension("log");
    let out = fs::File::create(&log).unwrap();
    // With SIGINT at its default, as a terminal's shell leaves it: a
    // non-interactive bash started in the background ignores it, and a
    // signal ignored when a script starts cannot be trapped there, so a
    // test run from such a shell would never see the stack stop.
    let mut cmd = Command::new("env");
    cmd.args(["--default-signal=INT", "bash", "scripts/stack"])
        .current_dir(&tree)
        // The tests' own build directory, where the working tree builds.
        .env("CARGO_TARGET_DIR", tmp.parent().unwrap())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .process_group(0);
    for (name, port) in &ports {
        cmd.env(name, port.to_string());
    }
    for (name, value) in env {
        cmd.env(name, value);
    }
    // Not shown, so not among the ports checked: wrangler's inspector.
    cmd.env("INSPECTOR_PORT", free_port().to_string());
    let stack = Stack {
        child: cmd.spawn().expect("scripts/stack starts"),
        log,
    };
    let mut stack = stack;
    // It builds the worker, and on a first run the REST endpoint.
    let deadline = Instant::now() + Duration::from_secs(900);
    while !stack.output().contains("Ctrl-C stops everything.") {
        if let Some(status) = stack.child.try_wait().unwrap() {
            panic!(
                "the stack ended ({status}) before it ran:\n{}",
                stack.output()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the stack did not come up:\n{}",
            stack.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let running = stack.output();
    for (name, port) in &ports {
        assert!(
            running.contains(&format!("127.0.0.1:{port}")),
            "{name} {port} not shown:\n{running}"
        );
    }
    (stack, ports, running)
}

/// Ctrl-C to `stack`, which must stop what it started, newest first, as
/// `stopped` names them, and free every port.
fn stopped_by_ctrl_c(mut stack: Stack, ports: &[(&str, u16)], running: &str, stopped: &[&str]) {
    assert!(stack.signal("INT"), "the stack's group is gone");
    let status = stack
        .wait(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("the stack did not stop:\n{}", stack.output()));
    let said = stack.output();
    let stopping = &said[running.len()..];
    assert_eq!(status.code(), Some(0), "{stopping}");
    let mut lines = vec!["[stack] stopping".to_owned()];
    lines.extend(stopped.iter().map(|name| format!("[stack] stopped {name}")));
    lines.push("[stack] every log is in .stack/".to_owned());
    assert_eq!(stopping.lines().collect::<Vec<_>>(), lines, "{said}");
    for (name, port) in ports {
        assert!(
            TcpStream::connect(("127.0.0.1", *port)).is_err(),
            "{name} {port} still answers after the stop"
        );
    }
}

const PORTS: [&str; 4] = ["REDIS_PORT", "REST_PORT", "ORIGIN_PORT", "WORKER_PORT"];

#[test]
fn ctrl_c_stops_the_stack_and_says_what_it_stopped() {
    let (stack, ports, running) = started("stack-tree", &PORTS, &[]);
    stopped_by_ctrl_c(
        stack,
        &ports,
        &running,
        &["worker", "origin", "rest", "redis"],
    );
}

/// The status line of a GET of `/` at `port` from `ip`, naming region
/// `eu`. Read alone: wrangler dev holds the connection open about 5 s
/// after its answer, `Connection: close` or not, so reading to the end
/// spaced the requests 5 s apart and let eu's pool expire before it was
/// looked at.
fn get_in_eu(port: u16, ip: &str) -> String {
    use std::io::{BufRead, BufReader, Write};
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = format!(
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nCF-Connecting-IP: {ip}\r\n\
         X-Edge-Limiter-Region: eu\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).unwrap();
    let mut status = String::new();
    BufReader::new(conn).read_line(&mut status).unwrap();
    status.trim_end().to_owned()
}

/// `REGIONS=2`: a second region, its Redis near and the home's 80 ms away;
/// docs/deploying.md's shared rule spends eu's pool there.
#[test]
fn regions_2_runs_a_home_far_away_and_a_region_near() {
    let mut names = PORTS.to_vec();
    names.extend(["EU_REDIS_PORT", "EU_REST_PORT", "HOME_PROXY_PORT"]);
    let (stack, ports, running) = started("stack-regions-tree", &names, &[("REGIONS", "2")]);
    assert!(running.contains("80 ms away"), "{running}");
    let port = |name: &str| ports.iter().find(|(n, _)| *n == name).unwrap().1;
    let ip = "203.0.113.77";
    for _ in 0..3 {
        assert_eq!(get_in_eu(port("WORKER_PORT"), ip), "HTTP/1.1 200 OK");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The shared rule's spends leave the client's pool in eu's Redis,
    // and nothing at the home, which none of them had to ask.
    let keys = |port_name: &str| {
        let out = Command::new("redis-cli")
            .args(["-p", &port(port_name).to_string(), "--scan"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let pool = format!("el:{{{ip}}}:api:pool");
    assert!(
        keys("EU_REDIS_PORT").lines().any(|k| k == pool),
        "{}",
        keys("EU_REDIS_PORT")
    );
    assert!(
        !keys("REDIS_PORT").contains(&pool),
        "{}",
        keys("REDIS_PORT")
    );
    let stops = [
        "worker",
        "origin",
        "home-proxy",
        "eu-rest",
        "eu-redis",
        "rest",
        "redis",
    ];
    stopped_by_ctrl_c(stack, &ports, &running, &stops);
}
