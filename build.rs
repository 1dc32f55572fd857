//! Joins the Lua files into the scripts the worker sends (the limiter's,
//! and the stats script), and embeds each with its SHA1 so `EVALSHA` needs
//! no hashing at run time. Comments, indentation and the blanks between
//! tokens are left out of what is embedded (the files in `lua/` are the
//! readable form); every line stays where it was, so a Redis error names the
//! same line number as the file.

use std::{env, fs, path::Path};

/// The order matters: each part uses locals the earlier ones define.
const PARTS: [&str; 7] = [
    "lua/common.lua",
    "lua/pool.lua",
    "lua/gcra.lua",
    "lua/windowed.lua",
    "lua/concurrency.lua",
    "lua/penalty.lua",
    "lua/limiter.lua",
];

/// Hosted Upstash then locks only the keys in `KEYS`, not the whole database;
/// our scripts touch no other key, which is what that flag promises.
const SHEBANG: &str = "#!lua flags=allow-key-locking\n";

/// The stats script, a script of its own: the worker sends it after
/// responses, once per isolate every `stats_every`.
const STATS: &str = "lua/stats.lua";

fn main() {
    let out_dir = env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let out = Path::new(&out_dir);
    embed(out, "limiter", &PARTS);
    embed(out, "stats", &[STATS]);
    // The same list, with each file's text, for the tests that check the join.
    // Named from the crate's own directory when it compiles, not this run's:
    // a build directory shared by two checkouts may keep this run's output
    // after this checkout is gone.
    let entries: Vec<String> = PARTS
        .iter()
        .map(|part| {
            format!("({part:?}, include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/{part}\")))")
        })
        .collect();
    fs::write(
        out.join("lua_files.rs"),
        format!("&[{}]", entries.join(", ")),
    )
    .expect("writing the list of Lua files");
    // Cargo runs this again when a Lua file's time is newer than its last
    // run, whichever checkout that run was for: a checksum of what it read
    // lets the crate refuse to build on another checkout's script.
    let (mut read, mut files) = (vec![], vec![]);
    for part in PARTS.iter().chain([&STATS]) {
        read.push(fs::read_to_string(part).unwrap_or_else(|e| panic!("reading {part}: {e}")));
        files.push(format!(
            "include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/{part}\"))"
        ));
    }
    let sum = fnv1a(read.iter().map(String::as_str));
    fs::write(
        out.join("lua_read.rs"),
        format!("({sum:#x}, &[{}])", files.join(", ")),
    )
    .expect("writing the checksum of the Lua files read");
}

/// FNV-1a (64 bits) of `texts` one after the other; `script.rs` sums the
/// checkout's files the same way.
fn fnv1a<'a>(texts: impl Iterator<Item = &'a str>) -> u64 {
    texts
        .flat_map(str::bytes)
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
}

/// Joins `parts` behind the shebang, without their comments, into
/// `<name>.lua` in `out`, and its SHA1 into `<name>.sha1`.
fn embed(out: &Path, name: &str, parts: &[&str]) {
    let mut source = String::from(SHEBANG);
    for part in parts {
        println!("cargo:rerun-if-changed={part}");
        let text = fs::read_to_string(part).unwrap_or_else(|e| panic!("reading {part}: {e}"));
        source.push_str(&without_comments(&text));
        if !source.ends_with('\n') {
            source.push('\n');
        }
    }
    let sha1 = sha1_smol::Sha1::from(source.as_bytes())
        .digest()
        .to_string();
    fs::write(out.join(format!("{name}.lua")), &source).expect("writing the joined script");
    fs::write(out.join(format!("{name}.sha1")), sha1).expect("writing the script's SHA1");
}

/// `lua` without its comments and without the blanks that start or end a
/// line, line breaks kept. Follows Lua's lexer: `--` starts a comment only
/// outside strings, and a long bracket after it (`--[[`, `--[==[`) runs to
/// the matching close; quoted and long strings are copied untouched, so their
/// contents are never taken for comments nor trimmed.
fn without_comments(lua: &str) -> String {
    let mut out = String::with_capacity(lua.len());
    let mut rest = lua;
    while let Some(c) = rest.chars().next() {
        let len = if let Some(comment) = rest.strip_prefix("--") {
            match long_bracket(comment) {
                Some(len) => {
                    // Its line breaks stay, so later lines keep their numbers.
                    for _ in comment[..len].matches('\n') {
                        new_line(&mut out);
                    }
                    2 + len
                }
                None => rest.find('\n').unwrap_or(rest.len()),
            }
        } else if let Some(len) = long_bracket(rest).or_else(|| quoted(rest)) {
            out.push_str(&rest[..len]);
            len
        } else {
            let line_start = out.is_empty() || out.ends_with('\n');
            match c {
                ' ' | '\t' if !line_start => {
                    // A run of blanks inside a line: one space, only where
                    // the tokens on each side would otherwise run together.
                    let run = rest.len() - rest.trim_start_matches([' ', '\t']).len();
                    let next = rest[run..].chars().next().unwrap_or('\n');
                    if joins(out.chars().last().unwrap_or('\n'), next) {
                        out.push(' ');
                    }
                    run
                }
                '\n' => {
                    new_line(&mut out);
                    1
                }
                ' ' | '\t' | '\r' => 1,
                _ => {
                    out.push(c);
                    c.len_utf8()
                }
            }
        };
        rest = &rest[len..];
    }
    out
}

/// Whether `before` and `after`, with nothing between them, would read as
/// one token where a blank kept them two: two word characters (`local x`,
/// `1 and`), `- -` (a comment), and a dot beside a dot or a digit (`1 ..`).
fn joins(before: char, after: char) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let dotted = |a: char, b: char| a == '.' && (b == '.' || b.is_ascii_digit());
    (word(before) && word(after))
        || (before == '-' && after == '-')
        || dotted(before, after)
        || dotted(after, before)
}

/// Ends the line `out` is on, dropping the blanks it ends with.
fn new_line(out: &mut String) {
    out.truncate(out.trim_end_matches([' ', '\t', '\r']).len());
    out.push('\n');
}

/// The length of the long bracket `text` starts with (`[[ ... ]]`,
/// `[==[ ... ]==]`), closing bracket included.
fn long_bracket(text: &str) -> Option<usize> {
    let level = text
        .strip_prefix('[')?
        .bytes()
        .take_while(|&b| b == b'=')
        .count();
    let body = text.get(level + 1..)?.strip_prefix('[')?;
    let close = format!("]{}]", "=".repeat(level));
    let end = body.find(&close).expect("a long bracket is closed");
    Some(level + 2 + end + close.len())
}

/// The length of the quoted string `text` starts with, quotes included.
fn quoted(text: &str) -> Option<usize> {
    let quote = text.chars().next().filter(|&c| c == '\'' || c == '"')?;
    let mut escaped = false;
    let end = text[1..].char_indices().find(|&(_, c)| {
        let closes = !escaped && c == quote;
        escaped = !escaped && c == '\\';
        closes
    });
    Some(end.expect("a string is closed").0 + 2)
}
