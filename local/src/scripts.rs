//! Makes stock Redis 7 accept scripts written for hosted Upstash, and hold them to
//! Upstash's rule for them.
//!
//! Upstash accepts the shebang flag `allow-key-locking`; Redis 7 rejects the whole script
//! (`ERR Unexpected flag in script shebang`). We drop that one flag before Redis sees the
//! source, and put a guard in front of the body that refuses what Upstash refuses under
//! the flag (see [`crate::keyspecs`]). The SHA1 changes with it, so the SHA1 of the
//! original source, which clients compute themselves for EVALSHA, is mapped to the SHA1
//! Redis knows.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::{keyspecs, resp::Value};

const FLAG: &str = "allow-key-locking";

/// What to undo in a reply once Redis has answered a rewritten command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fixup {
    /// Nothing was rewritten.
    None,
    /// `SCRIPT LOAD` of a rewritten source: report the SHA1 the client expects.
    Loaded {
        /// SHA1 of the source as the client sent it.
        original: String,
    },
    /// A script ran under its rewritten SHA1, which Redis quotes in runtime errors.
    Ran {
        /// SHA1 of the source as the client sent it.
        original: String,
        /// SHA1 of the source Redis has.
        rewritten: String,
    },
}

impl Fixup {
    /// Puts the client's view of the script back into `reply`.
    pub fn apply(&self, reply: Value) -> Value {
        match (self, reply) {
            (Fixup::Loaded { original }, Value::Bulk(_)) => Value::Bulk(original.clone().into()),
            (
                Fixup::Ran {
                    original,
                    rewritten,
                },
                Value::Error(text),
            ) => Value::Error(text.replace(rewritten.as_str(), original)),
            (_, reply) => reply,
        }
    }
}

/// The process-wide memory of `sha1(original) -> sha1(rewritten)`.
///
/// It is never pruned: entries are 80 bytes and a process sees few distinct scripts.
#[derive(Debug, Default)]
pub struct Scripts {
    rewritten_sha: Mutex<HashMap<String, String>>,
}

impl Scripts {
    /// Rewrites `args` (one command, name first) in place where it carries or names a
    /// script with the flag, and says how to fix the reply. `specs` is
    /// [`keyspecs::encode`]'s text for the Redis behind us.
    pub fn prepare(&self, args: &mut [Vec<u8>], specs: &str) -> Fixup {
        let name = args.first().map(|a| a.to_ascii_uppercase());
        match name.as_deref() {
            Some(b"EVAL" | b"EVAL_RO") if args.len() > 1 => match self.rewrite(&args[1], specs) {
                Some((source, original, rewritten)) => {
                    args[1] = source;
                    Fixup::Ran {
                        original,
                        rewritten,
                    }
                }
                None => Fixup::None,
            },
            Some(b"EVALSHA" | b"EVALSHA_RO") if args.len() > 1 => match self.translate(&args[1]) {
                Some(rewritten) => {
                    let original = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
                    args[1] = rewritten.clone().into_bytes();
                    Fixup::Ran {
                        original,
                        rewritten,
                    }
                }
                None => Fixup::None,
            },
            Some(b"SCRIPT") if args.len() > 2 => {
                let sub = args[1].to_ascii_uppercase();
                if sub == b"LOAD" {
                    if let Some((source, original, _)) = self.rewrite(&args[2], specs) {
                        args[2] = source;
                        return Fixup::Loaded { original };
                    }
                } else if sub == b"EXISTS" {
                    for sha in &mut args[2..] {
                        if let Some(rewritten) = self.translate(sha) {
                            *sha = rewritten.into_bytes();
                        }
                    }
                }
                Fixup::None
            }
            _ => Fixup::None,
        }
    }

    /// Returns the rewritten source and both SHA1s, remembering the pair.
    fn rewrite(&self, source: &[u8], specs: &str) -> Option<(Vec<u8>, String, String)> {
        let stripped = guarded(strip_flag(source)?, specs);
        let original = sha1_hex(source);
        let rewritten = sha1_hex(&stripped);
        self.rewritten_sha
            .lock()
            .expect("script map poisoned")
            .insert(original.clone(), rewritten.clone());
        Some((stripped, original, rewritten))
    }

    fn translate(&self, sha: &[u8]) -> Option<String> {
        // Redis matches SHA1s case-insensitively.
        let key = String::from_utf8_lossy(sha).to_ascii_lowercase();
        self.rewritten_sha
            .lock()
            .expect("script map poisoned")
            .get(&key)
            .cloned()
    }
}

/// Lowercase hex SHA1, as Redis reports script ids.
pub fn sha1_hex(bytes: &[u8]) -> String {
    sha1_smol::Sha1::from(bytes).digest().to_string()
}

/// The stripped source with [`keyspecs::guard`] at the start of its second line, so
/// that every line keeps its number.
fn guarded(mut stripped: Vec<u8>, specs: &str) -> Vec<u8> {
    let guard = keyspecs::guard(specs);
    match stripped.iter().position(|&b| b == b'\n') {
        Some(end) => {
            stripped.splice(end + 1..end + 1, guard.into_bytes());
        }
        None => {
            stripped.push(b'\n');
            stripped.extend_from_slice(guard.as_bytes());
        }
    }
    stripped
}

/// Returns `source` without the flag, or `None` when its first line is not a `#!lua`
/// shebang carrying it. Only the first line changes, so Lua's line numbers in error
/// messages still match the client's source.
fn strip_flag(source: &[u8]) -> Option<Vec<u8>> {
    let line_end = source
        .iter()
        .position(|&b| b == b'\n')
        .unwrap_or(source.len());
    let line = std::str::from_utf8(&source[..line_end]).ok()?;
    let (line, cr) = match line.strip_suffix('\r') {
        Some(line) => (line, "\r"),
        None => (line, ""),
    };
    let mut words = line.split_whitespace();
    if words.next() != Some("#!lua") {
        return None;
    }
    let mut kept_words = vec!["#!lua".to_string()];
    let mut found = false;
    for word in words {
        let Some(list) = word.strip_prefix("flags=") else {
            kept_words.push(word.to_string());
            continue;
        };
        let kept: Vec<&str> = list.split(',').filter(|f| *f != FLAG).collect();
        found |= kept.len() != list.split(',').count();
        // `#!lua` alone means the same to Redis as an empty flag list.
        if !kept.iter().all(|f| f.is_empty()) {
            kept_words.push(format!("flags={}", kept.join(",")));
        }
    }
    if !found {
        return None;
    }
    let mut out = format!("{}{cr}", kept_words.join(" ")).into_bytes();
    out.extend_from_slice(&source[line_end..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(s: &str) -> Option<String> {
        strip_flag(s.as_bytes()).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn strips_only_the_flag_on_the_first_line() {
        assert_eq!(
            strip("#!lua flags=allow-key-locking\nreturn 1").as_deref(),
            Some("#!lua\nreturn 1")
        );
        assert_eq!(
            strip("#!lua flags=no-writes,allow-key-locking,no-cluster\r\nreturn 1\n").as_deref(),
            Some("#!lua flags=no-writes,no-cluster\r\nreturn 1\n")
        );
        assert_eq!(
            strip("#!lua   flags=allow-key-locking").as_deref(),
            Some("#!lua")
        );
    }

    #[test]
    fn leaves_other_sources_alone() {
        assert_eq!(strip("return 1"), None);
        assert_eq!(strip("#!lua flags=no-writes\nreturn 1"), None);
        assert_eq!(strip("#!luajit flags=allow-key-locking\n"), None);
        assert_eq!(strip("return 1\n#!lua flags=allow-key-locking"), None);
    }

    #[test]
    fn maps_sha_for_evalsha_and_script_commands() {
        let scripts = Scripts::default();
        let src = b"#!lua flags=allow-key-locking\nreturn 1".to_vec();
        let original = sha1_hex(&src);
        let specs = ";GET=i:1:r:0:1:0;";
        let expected = format!("#!lua\n{}return 1", keyspecs::guard(specs));
        let rewritten = sha1_hex(expected.as_bytes());

        let mut eval = vec![b"eval".to_vec(), src.clone(), b"0".to_vec()];
        let fixup = scripts.prepare(&mut eval, specs);
        assert_eq!(eval[1], expected.as_bytes());
        assert_eq!(
            fixup.apply(Value::Error(format!("ERR x script: {rewritten}, on"))),
            Value::Error(format!("ERR x script: {original}, on"))
        );

        let mut evalsha = vec![b"EvalSha".to_vec(), original.to_uppercase().into_bytes()];
        scripts.prepare(&mut evalsha, specs);
        assert_eq!(evalsha[1], rewritten.as_bytes());

        let mut exists = vec![
            b"SCRIPT".to_vec(),
            b"exists".to_vec(),
            original.clone().into(),
        ];
        scripts.prepare(&mut exists, specs);
        assert_eq!(exists[2], rewritten.as_bytes());

        let mut load = vec![b"script".to_vec(), b"LOAD".to_vec(), src];
        let fixup = scripts.prepare(&mut load, specs);
        assert_eq!(
            fixup.apply(Value::Bulk(rewritten.into())),
            Value::Bulk(original.into())
        );
    }
}
