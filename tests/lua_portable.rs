//! The scripts in `lua/` use only what every Redis-compatible server with
//! Lua has. Hosted Upstash runs its own Lua, without the modules stock Redis
//! bundles (struct, cjson, cmsgpack, bit, bit32), so a script naming one
//! works in every local test and fails in production.
//!
//! The check reads the scripts as Lua tokens, with a lexer of its own (it
//! shares nothing with `build.rs`, whose comment stripper it would
//! otherwise trust): a module name is refused wherever it stands as a name
//! (`struct.pack`, `local s = struct`), and as a string that indexes
//! something (`_G['cjson']`). The ways of reaching a global by a computed
//! name (`_G`, `getfenv`, `rawget`, `loadstring`, `load`, `require`,
//! `setfenv`) are refused outright: with them no token check could see
//! which global a script takes.
#![cfg(not(target_arch = "wasm32"))]

/// The modules hosted Upstash may lack.
const MODULES: [&str; 5] = ["struct", "cjson", "cmsgpack", "bit", "bit32"];

/// Globals through which a script could reach a module by a computed name.
const INDIRECT: [&str; 7] = [
    "_G",
    "getfenv",
    "setfenv",
    "rawget",
    "loadstring",
    "load",
    "require",
];

/// One Lua token, as far as the check needs to tell them apart.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Name(String),
    Str(String),
    Punct(char),
    Other,
}

/// A token with the line it starts on.
type Located = (usize, Token);

/// The level of a long bracket opening at `s` (`[[` is 0, `[==[` is 2).
fn long_open(s: &[u8]) -> Option<usize> {
    let rest = s.strip_prefix(b"[")?;
    let level = rest.iter().take_while(|&&b| b == b'=').count();
    (rest.get(level) == Some(&b'[')).then_some(level)
}

/// Where the long bracket of `level` that closes after `from` ends.
fn long_close(s: &[u8], from: usize, level: usize) -> Result<usize, String> {
    let close: Vec<u8> = [b"]".as_slice(), &vec![b'='; level], b"]"].concat();
    s[from..]
        .windows(close.len())
        .position(|w| w == close.as_slice())
        .map(|at| from + at + close.len())
        .ok_or_else(|| "an unclosed long bracket".to_owned())
}

/// Lua 5.1's tokens: names, strings (quoted, with escapes, and long
/// brackets), comments (short and long, dropped), numbers and punctuation.
fn tokens(source: &str) -> Result<Vec<Located>, String> {
    let s = source.as_bytes();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    let lines = |from: usize, to: usize| s[from..to].iter().filter(|&&b| b == b'\n').count();
    while i < s.len() {
        let b = s[i];
        let start = i;
        match b {
            b'\n' => {
                line += 1;
                i += 1;
                continue;
            }
            b if b.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            b'-' if s.get(i + 1) == Some(&b'-') => {
                i = match long_open(&s[i + 2..]) {
                    Some(level) => long_close(s, i + 4 + level, level)?,
                    None => s[i..]
                        .iter()
                        .position(|&c| c == b'\n')
                        .map_or(s.len(), |p| i + p),
                };
            }
            b'[' if long_open(&s[i..]).is_some() => {
                let level = long_open(&s[i..]).unwrap_or_default();
                let end = long_close(s, i + 2 + level, level)?;
                let text = &s[i + 2 + level..end - 2 - level];
                out.push((line, Token::Str(String::from_utf8_lossy(text).into_owned())));
                i = end;
            }
            b'"' | b'\'' => {
                let mut text = Vec::new();
                i += 1;
                loop {
                    match s.get(i) {
                        None | Some(b'\n') => {
                            return Err(format!("line {line}: an unclosed string"))
                        }
                        Some(&c) if c == b => break,
                        Some(b'\\') => {
                            // An escaped quote or backslash is the character itself.
                            text.extend(s.get(i + 1));
                            i += 2;
                        }
                        Some(&c) => {
                            text.push(c);
                            i += 1;
                        }
                    }
                }
                i += 1;
                out.push((
                    line,
                    Token::Str(String::from_utf8_lossy(&text).into_owned()),
                ));
            }
            b if b.is_ascii_alphabetic() || b == b'_' => {
                while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'_') {
                    i += 1;
                }
                out.push((line, Token::Name(source[start..i].to_owned())));
            }
            b if b.is_ascii_digit() => {
                while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == b'.') {
                    i += 1;
                }
                out.push((line, Token::Other));
            }
            _ => {
                out.push((line, Token::Punct(b as char)));
                i += 1;
            }
        }
        line += lines(start, i.min(s.len()));
    }
    Ok(out)
}

/// Every use of a module, or of a way to reach one by name, as
/// `line N: why`.
fn uses_of_modules(source: &str) -> Result<Vec<String>, String> {
    let toks = tokens(source)?;
    let mut found = Vec::new();
    for (k, (line, tok)) in toks.iter().enumerate() {
        let prev = k.checked_sub(1).map(|p| &toks[p].1);
        let next = toks.get(k + 1).map(|(_, t)| t);
        let after_next = toks.get(k + 2).map(|(_, t)| t);
        // A field (`x.bit`, `x:bit()`), a table key (`{ bit = 1 }`) or an
        // assignment's target reads no module.
        let field = matches!(prev, Some(Token::Punct('.' | ':')));
        let assigned = next == Some(&Token::Punct('=')) && after_next != Some(&Token::Punct('='));
        match tok {
            Token::Name(_) if field || assigned => {}
            Token::Name(n) if MODULES.contains(&n.as_str()) => {
                found.push(format!("line {line}: the module `{n}`"));
            }
            Token::Name(n) if INDIRECT.contains(&n.as_str()) => {
                found.push(format!("line {line}: `{n}` reaches globals by name"));
            }
            Token::Str(text)
                if MODULES.contains(&text.as_str())
                    && matches!(prev, Some(Token::Punct('[')))
                    && matches!(next, Some(Token::Punct(']'))) =>
            {
                found.push(format!("line {line}: the module `{text}`, by name"));
            }
            _ => {}
        }
    }
    Ok(found)
}

#[test]
fn the_scripts_use_no_bundled_module() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "lua") {
            let source = std::fs::read_to_string(&path).unwrap();
            let found = uses_of_modules(&source).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            assert!(found.is_empty(), "{}: {found:#?}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 5, "every script is read ({checked})");
}

#[test]
fn every_spelling_of_a_module_is_caught() {
    for script in [
        "local s = struct",
        "return struct.pack('>I', 1)",
        "local j = cjson.encode({})",
        "x = bit32",
        "local b = bit.band(1, 2)",
        "return cmsgpack.pack(1)",
        "return _G['cjson']",
        "return _G[\"bit\"]",
        "local g = getfenv()['struct']",
        "return rawget(_G, 'cjson')",
        "local f = loadstring('return struct')",
        "local m = require('cjson')",
        "local t = {}; return t[ [[bit32]] ]",
        "return ({})['cmsgpack']",
        "local s --[[ a comment ]] = struct",
        "local s = \"--\" .. tostring(struct)",
    ] {
        let found = uses_of_modules(script).unwrap();
        assert!(!found.is_empty(), "not caught: {script}");
    }
}

#[test]
fn names_in_comments_strings_and_fields_are_not_uses() {
    for script in [
        "-- struct, cjson and bit are not used here",
        "--[[ local s = struct ]]",
        "--[==[ bit32 ]] still a comment ]==]",
        "local s = 'struct'",
        "local s = \"cjson is a module\"",
        "local s = [[bit32]]",
        "local t = { bit = 1 }; return t.bit",
        "local bits, structure, cjsonish = 1, 2, 3",
        "local s = 'it\\'s struct'",
        "redis.call('HGET', KEYS[1], 'bit')",
    ] {
        let found = uses_of_modules(script).unwrap();
        assert!(found.is_empty(), "{script}: {found:?}");
    }
}

#[test]
fn lines_are_counted_across_long_comments_and_strings() {
    let found = uses_of_modules("--[[\none\ntwo\n]]\nlocal s = [[\n\n]]\nreturn struct").unwrap();
    assert_eq!(found, ["line 8: the module `struct`"]);
    assert!(uses_of_modules("local s = 'open").is_err());
    assert!(uses_of_modules("--[[ open").is_err());
}
