//! The limiter script: the files in `lua/` joined and embedded with its
//! SHA1, and the entry points a call selects in it.

use crate::decision::transport::redis_rest::Script;

/// The limiter script: the files `build.rs` lists, joined behind a
/// `#!lua flags=allow-key-locking` shebang, without their comments.
pub const LIMITER: Script = Script {
    source: include_str!(concat!(env!("OUT_DIR"), "/limiter.lua")),
    sha1: include_str!(concat!(env!("OUT_DIR"), "/limiter.sha1")),
};

/// What `build.rs` read of `lua/`, as a checksum, and the files this
/// checkout holds: they differ when a build directory another checkout
/// shares kept that one's script, and the crate then does not build.
const LUA_READ: (u64, &[&str]) = include!(concat!(env!("OUT_DIR"), "/lua_read.rs"));
const _: () = assert!(
    LUA_READ.0 == fnv1a(LUA_READ.1),
    "the Lua script build.rs joined is not this checkout's lua/ (a build directory another \
     checkout shares?): `touch lua/*.lua` and build again"
);

/// FNV-1a (64 bits) of `texts` one after the other, as `build.rs` sums
/// the files it reads.
const fn fnv1a(texts: &[&str]) -> u64 {
    let mut sum: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < texts.len() {
        let bytes = texts[i].as_bytes();
        let mut j = 0;
        while j < bytes.len() {
            sum = (sum ^ bytes[j] as u64).wrapping_mul(0x100_0000_01b3);
            j += 1;
        }
        i += 1;
    }
    sum
}

/// The Lua files joined into [`LIMITER`], in order, each with its text:
/// the list `build.rs` keeps, for the tests that hold the script to them.
#[cfg(test)]
const LUA_FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/lua_files.rs"));

/// The script's entry points: `ARGV[1]` names one in every call (the
/// table at the top of `lua/limiter.lua` says the same, and `known` in
/// `lua/common.lua` lists the names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// A GCRA rule alone on Redis's clock: the rule's arguments alone,
    /// its word [`Entry::GCRA`] first (`lua/gcra.lua`).
    OneGcra,
    /// A windowed rule alone on Redis's clock: the rule's arguments alone,
    /// its word [`Entry::WINDOW`] first (`lua/windowed.lua`). Either
    /// one-rule entry with a second key reads it as the client's override,
    /// and the script decides it as [`Entry::Decide`] would when it holds
    /// one.
    OneWindowed,
    /// The general decision (`lua/limiter.lua`).
    Decide,
    /// Several requests of one client under the same rules, each decided
    /// as [`Entry::Decide`] would after the one before.
    Group,
    /// Deletes every key given.
    Reset,
    /// Gives refundable charges back.
    Refund,
    /// Charges more than decisions charged, laid out as a refund: what
    /// responses reported past their estimates.
    Debit,
    /// Spends from the pools a region holds of shared rules (`lua/pool.lua`).
    Pool,
    /// Writes a pool's top-up from the home into the region's Redis.
    Credit,
}

impl Entry {
    /// Every entry point.
    pub const ALL: [Entry; 9] = [
        Entry::OneGcra,
        Entry::OneWindowed,
        Entry::Decide,
        Entry::Group,
        Entry::Reset,
        Entry::Refund,
        Entry::Debit,
        Entry::Pool,
        Entry::Credit,
    ];

    /// A GCRA rule's word, first in its arguments: alone, its call's
    /// operation.
    pub const GCRA: &'static str = "gcra";
    /// A windowed rule's word, first in its arguments: alone, its call's
    /// operation.
    pub const WINDOW: &'static str = "window";
    /// `ARGV[1]` of a general decision.
    pub const DECIDE: &'static str = "decide";
    /// `ARGV[1]` of a group.
    pub const GROUP: &'static str = "group";
    /// `ARGV[1]` of a reset.
    pub const RESET: &'static str = "reset";
    /// `ARGV[1]` of a refund.
    pub const REFUND: &'static str = "refund";
    /// `ARGV[1]` of a debit.
    pub const DEBIT: &'static str = "debit";
    /// `ARGV[1]` of a pool's spend.
    pub const POOL: &'static str = "pool";
    /// `ARGV[1]` of a pool's credit.
    pub const CREDIT: &'static str = "credit";

    /// The operation name `ARGV[1]` holds for this entry.
    pub fn operation(self) -> &'static str {
        match self {
            Entry::OneGcra => Entry::GCRA,
            Entry::OneWindowed => Entry::WINDOW,
            Entry::Decide => Entry::DECIDE,
            Entry::Group => Entry::GROUP,
            Entry::Reset => Entry::RESET,
            Entry::Refund => Entry::REFUND,
            Entry::Debit => Entry::DEBIT,
            Entry::Pool => Entry::POOL,
            Entry::Credit => Entry::CREDIT,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn the_script_is_the_files_without_comments_line_for_line() {
        let (shebang, body) = LIMITER.source.split_once('\n').expect("a shebang line");
        assert_eq!(shebang, "#!lua flags=allow-key-locking");
        let files: Vec<&str> = LUA_FILES.iter().flat_map(|(_, f)| f.lines()).collect();
        let embedded: Vec<&str> = body.lines().collect();
        // Line for line, so a Redis error's line number is the file's.
        assert_eq!(embedded.len(), files.len());
        // Blanks between tokens go too, so lines are compared without any.
        let squeezed = |text: &str| text.replace([' ', '\t'], "");
        for (n, (line, file)) in embedded.iter().zip(&files).enumerate() {
            let file = squeezed(file);
            let dropped = file.strip_prefix(&squeezed(line));
            assert!(
                dropped.is_some_and(|d| d.is_empty() || d.starts_with("--")),
                "line {}: {line:?} is not {file:?} less its blanks and comment",
                n + 2
            );
        }
        let written: usize = LUA_FILES.iter().map(|(_, f)| f.len()).sum();
        assert!(LIMITER.source.len() < written / 2, "the comments are gone");
    }

    #[test]
    fn every_lua_file_is_in_the_script() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| format!("lua/{}", e.unwrap().file_name().to_string_lossy()))
            .filter(|name| name.ends_with(".lua"))
            // A script of its own: decision::stats::stored::STATS.
            .filter(|name| name != "lua/stats.lua")
            .collect();
        on_disk.sort();
        let mut joined: Vec<String> = LUA_FILES.iter().map(|(n, _)| n.to_string()).collect();
        joined.sort();
        assert_eq!(joined, on_disk);
    }

    /// Each Lua file's code, comments gone, as the script embeds it.
    fn code(name: &str) -> Vec<&'static str> {
        let mut embedded = LIMITER.source.lines().skip(1);
        for (file, text) in LUA_FILES {
            let lines: Vec<&str> = embedded.by_ref().take(text.lines().count()).collect();
            if file.ends_with(name) {
                return lines;
            }
        }
        panic!("no {name} in the script")
    }

    /// The names quoted (`'...'`) in `line`.
    fn quoted(line: &str) -> BTreeSet<&str> {
        line.split('\'').skip(1).step_by(2).collect()
    }

    /// The operations are listed once in the script (`lone` and `known`,
    /// in common.lua), the same as `Entry` and as limiter.lua's table of
    /// entries; every name the script compares `op` with is one of them,
    /// nothing else reads `ARGV[1]`, and nothing writes `ARGV`.
    #[test]
    fn the_script_names_each_operation_once() {
        let operations: BTreeSet<&str> = Entry::ALL.iter().map(|e| e.operation()).collect();
        let (_, limiter) = LUA_FILES
            .iter()
            .find(|(n, _)| n.ends_with("limiter.lua"))
            .unwrap();
        let table: BTreeSet<&str> = limiter
            .lines()
            .filter_map(|l| l.strip_prefix("--   ARGV[1] == "))
            .flat_map(quoted)
            .collect();
        assert_eq!(table, operations, "limiter.lua's table of entries");
        // Without any blanks: the script keeps only those between words.
        let script: Vec<String> = LIMITER.source.lines().map(|l| l.replace(' ', "")).collect();
        let listed: BTreeSet<&str> = script
            .iter()
            .filter(|l| l.starts_with("locallone=") || l.starts_with("localknown="))
            .flat_map(|l| quoted(l))
            .collect();
        assert_eq!(listed, operations, "common.lua's list");
        for line in &script {
            if line.contains("op=='") {
                assert!(quoted(line).is_subset(&operations), "{line}");
            }
            assert!(!line.contains("op~='"), "a guard of its own: {line}");
            let names_op = line.starts_with("localargv,call,op=");
            assert!(names_op || !line.contains("ARGV[1]"), "not `op`: {line}");
            assert!(!line.contains("#ARGV"), "dispatch by counting: {line}");
            assert!(!line.contains("#KEYS=="), "dispatch by counting: {line}");
            let writes = line.split_once('=').is_some_and(|(left, right)| {
                !right.starts_with('=') && (left.contains("ARGV[") || left.contains("argv["))
            });
            assert!(!writes, "ARGV rewritten: {line}");
        }
        for (file, word) in [("gcra.lua", Entry::GCRA), ("windowed.lua", Entry::WINDOW)] {
            let guard = format!("op=='{word}'andnotoverridden");
            let squeezed = code(file).into_iter().map(|l| l.replace(" ", ""));
            let guards = squeezed.filter(|l| l.contains(&guard)).count();
            assert_eq!(guards, 1, "{file}'s one-rule path is its operation's");
        }
    }
}
