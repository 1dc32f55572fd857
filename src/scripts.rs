//! The Lua script every decision runs, embedded at build time with its SHA1.

/// A script as Redis knows it: its source, and the SHA1 that `EVALSHA` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Script {
    /// The full source, shebang included.
    pub source: &'static str,
    /// Lower-case hex SHA1 of `source`, as `SCRIPT LOAD` would answer.
    pub sha1: &'static str,
}

/// `lua/common.lua`, `lua/gcra.lua`, `lua/windowed.lua` and `lua/limiter.lua` joined behind a
/// `#!lua flags=allow-key-locking` shebang (see `build.rs`).
pub const LIMITER: Script = Script {
    source: include_str!(concat!(env!("OUT_DIR"), "/limiter.lua")),
    sha1: include_str!(concat!(env!("OUT_DIR"), "/limiter.sha1")),
};

#[cfg(test)]
mod tests {
    use super::LIMITER;

    /// The files `build.rs` joins, in its order.
    const FILES: [&str; 5] = [
        include_str!("../lua/common.lua"),
        include_str!("../lua/gcra.lua"),
        include_str!("../lua/windowed.lua"),
        include_str!("../lua/penalty.lua"),
        include_str!("../lua/limiter.lua"),
    ];

    #[test]
    fn the_script_is_the_files_without_comments_line_for_line() {
        let (shebang, body) = LIMITER.source.split_once('\n').expect("a shebang line");
        assert_eq!(shebang, "#!lua flags=allow-key-locking");
        let files: Vec<&str> = FILES.iter().flat_map(|f| f.lines()).collect();
        let embedded: Vec<&str> = body.lines().collect();
        // Line for line, so a Redis error's line number is the file's.
        assert_eq!(embedded.len(), files.len());
        for (n, (line, file)) in embedded.iter().zip(&files).enumerate() {
            let dropped = file.trim().strip_prefix(line).map(str::trim_start);
            assert!(
                dropped.is_some_and(|d| d.is_empty() || d.starts_with("--")),
                "line {}: {line:?} is not {file:?} less its blanks and comment",
                n + 2
            );
        }
        let written: usize = FILES.iter().map(|f| f.len()).sum();
        assert!(LIMITER.source.len() < written / 2, "the comments are gone");
    }
}
